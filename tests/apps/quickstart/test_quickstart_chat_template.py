"""The quickstart's ``use_chat_template``: every place the policy is prompted (annotation samples, evaluation, the
report's token view, SFT, PPO) and the reward model's prompt format follow the one field.

The generation tests use a tiny Llama with the real Llama-3 tokenizer: its chat template writes
``<|begin_of_text|>`` and the tokenizer adds one too, so tokenizing templated text with special tokens again gives
two BOS (the special tokens rule of `text2grad.core.generation` forbids it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import reward_model.inference as inference_module
from reward_model.inference import GenerativeRewardModel
from reward_model.serialization import build_rm_input
from reward_model.train_config import CONFIG_FILENAME, RewardModelConfig
from text2grad.apps.quickstart import pipeline, results
from text2grad.apps.quickstart.presets import PRESETS, resolve
from text2grad.apps.quickstart.quickstart_config import QuickstartConfig
from text2grad.apps.quickstart.task import TaskConfig, generate_task
from text2grad.core.assets import real_tokenizer
from text2grad.core.config import save_config
from text2grad.core.data import write_jsonl
from text2grad.core.generation import Generation, apply_chat_template
from text2grad.core.modeling import build_tiny_llama
from tests.generation_recorder import record_prompt_ids

POSTS = ["The café opened at 9 and closed at 5.\nTL;DR:", "Anna moved to Berlin for a job 🙂\nTL;DR:"]


@pytest.fixture(scope="module")
def llama3_policy(tmp_path_factory) -> tuple[Path, object]:
    """A saved tiny Llama (random weights) with the real Llama-3 tokenizer and its chat template."""
    tokenizer = real_tokenizer("llama3")
    assert tokenizer.chat_template and tokenizer("x")["input_ids"][0] == tokenizer.bos_token_id  # adds BOS itself
    path = tmp_path_factory.mktemp("llama3_policy")
    build_tiny_llama(tokenizer, hidden_size=16, num_layers=1, num_heads=2).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, tokenizer


@pytest.fixture
def sampled_prompt_ids(monkeypatch) -> list[list[int]]:
    """The prompt ids of every generation the quickstart's results module runs (what the policy was conditioned on)."""
    return record_prompt_ids(monkeypatch, results)


def test_templated_samples_feed_the_template_once_with_one_bos(llama3_policy, sampled_prompt_ids):
    path, tokenizer = llama3_policy
    bos, header = tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids("<|start_header_id|>")
    expected = [tokenizer(apply_chat_template(tokenizer, p), add_special_tokens=False)["input_ids"] for p in POSTS]
    assert all(ids.count(bos) == 1 for ids in expected)

    sampled = results.generate_responses(path, POSTS, 3, True, 0, use_chat_template=True)
    assert [g.prompt_ids for g in sampled] == sampled_prompt_ids == expected
    for ids in sampled_prompt_ids:  # one BOS, then the template's first header (the old tokenization gave BOS BOS)
        assert ids[0] == bos and ids[1] == header and ids.count(bos) == 1


def test_evaluation_scores_templated_summaries_of_real_task_posts(llama3_policy, sampled_prompt_ids):
    path, tokenizer = llama3_policy
    records = generate_task(TaskConfig(seed=1, n_train=2, n_rl=1, n_eval=2))["eval"]
    scores, preds = results.evaluate_policy(path, records, 4, use_chat_template=True)
    assert len(preds) == 2 and {"fact_score", "rouge1", "bleu"} <= set(scores)
    assert sampled_prompt_ids == [
        tokenizer(apply_chat_template(tokenizer, r["prompt"]), add_special_tokens=False)["input_ids"] for r in records]


def test_plain_generation_keeps_the_raw_prompt_and_its_single_bos(llama3_policy, sampled_prompt_ids):
    path, tokenizer = llama3_policy
    generations = results.generate_responses(path, POSTS, 3, False, 0)
    assert [g.prompt_ids for g in generations] == [tokenizer(p)["input_ids"] for p in POSTS]
    assert all(g.prompt_ids.count(tokenizer.bos_token_id) == 1 for g in generations)
    assert tokenizer.convert_tokens_to_ids("<|start_header_id|>") not in generations[0].prompt_ids


def test_policy_prompts_follow_the_special_tokens_rule(llama3_policy, bpe_tokenizer):
    _, tokenizer = llama3_policy
    texts, special = results.policy_prompts(tokenizer, POSTS, True)
    assert special is False and texts == [apply_chat_template(tokenizer, p) for p in POSTS] and texts[0] != POSTS[0]
    assert results.policy_prompts(tokenizer, POSTS, False) == (POSTS, None)
    assert not bpe_tokenizer.chat_template  # no template: plain prompts, as policy_optimization.train does
    assert results.policy_prompts(bpe_tokenizer, POSTS, True) == (POSTS, None)


def test_a_reward_model_trained_on_the_chat_format_is_queried_in_it_with_one_bos(llama3_policy, tmp_path, monkeypatch):
    """reward_model.train saves --prompt_format with the model; the loader (PPO's reward-model critic, the report,
    reward_model.evaluate without an override) renders inputs the same way and tokenizes them without a second BOS."""
    path, tokenizer = llama3_policy
    rm_dir = tmp_path / "rm"
    shutil.copytree(path, rm_dir)
    save_config(RewardModelConfig(model_name_or_path=str(path), prompt_format="chat", instruction=pipeline.RM_INSTRUCTION),
                rm_dir / CONFIG_FILENAME)
    rm = GenerativeRewardModel.from_pretrained(str(rm_dir), max_new_tokens=3, batch_size=2, grounded_spans=False)
    assert rm.prompt_format == "chat" and rm.instruction == pipeline.RM_INSTRUCTION
    fed = record_prompt_ids(monkeypatch, inference_module)
    rm.feedback(POSTS, ["A summary.", "Another one."])
    expected = [tokenizer(build_rm_input(tokenizer, p, r, instruction=pipeline.RM_INSTRUCTION, prompt_format="chat").text,
                          add_special_tokens=False)["input_ids"] for p, r in zip(POSTS, ["A summary.", "Another one."])]
    assert sorted(fed) == sorted(expected)
    assert all(ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id for ids in fed)


def test_presets_turn_the_template_on_for_smollm2_only_and_the_tiny_llama_refuses_it():
    assert {name: p["use_chat_template"] for name, p in PRESETS.items()} == {
        "ci": False, "default": False, "large": False, "smollm2": True}
    with pytest.raises(ValueError, match="use_chat_template"):
        resolve(QuickstartConfig(preset="ci", use_chat_template=True))
    assert resolve(QuickstartConfig(preset="ci", sft_model="my/policy", use_chat_template=True)).use_chat_template


class _RecordedPhases:
    """Stands in for `pipeline._call`: records each phase's argv and writes the files the pipeline reads next."""

    def __init__(self):
        self.argv: dict[str, list[list[str]]] = {}

    def __call__(self, module: str, argv: list[str]) -> None:
        self.argv.setdefault(module, []).append(list(argv))
        flag = dict(zip(argv, argv[1:]))
        if module == "policy_optimization.train":  # the iteration the chunk reached
            out = Path(flag["--output_dir"])
            out.mkdir(parents=True, exist_ok=True)
            write_jsonl(out / "metrics.jsonl", [{"iteration": int(flag["--num_iterations"])}])
        elif module == "annotation.cli":  # every response annotated with no spans
            rows = [json.loads(line) for line in Path(flag["--dataset_path"]).read_text().splitlines()]
            write_jsonl(Path(flag["--output"]), [{**r, "good_spans": [], "poor_spans": []} for r in rows])


@pytest.mark.parametrize("on", [True, False], ids=["template", "plain"])
def test_phase_commands_carry_the_template_flags_only_when_on(tmp_path, monkeypatch, on):
    calls, sampled_with = _RecordedPhases(), []
    monkeypatch.setattr(pipeline, "_call", calls)

    def fake_generate_responses(path, prompts, max_new_tokens, do_sample, seed, **kwargs):
        sampled_with.append(kwargs.get("use_chat_template"))
        return [Generation([1], [2], "a summary", True) for _ in prompts]

    monkeypatch.setattr(pipeline, "generate_responses", fake_generate_responses)
    cfg = resolve(QuickstartConfig(preset="ci", output_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"),
                                   policy_model="my/instruct-model", n_train=24, n_annotations=16, sft_steps=4,
                                   policy_sft_steps=4, ppo_iterations=1, eval_every=1, use_chat_template=on))
    data = pipeline.stage_data(cfg, tmp_path / "out")
    sft, rm_base = pipeline.stage_policy(cfg, data)
    pipeline.stage_reward_model(cfg, data, sft, rm_base, tmp_path / "out", pipeline.StageClock(pipeline.STAGES))
    evaluated = []
    pipeline.stage_ppo(cfg, data, sft, tmp_path / "rm" / "model", tmp_path / "out", "nl_gradient",
                       lambda path, records: (evaluated.append(path) or {"fact_score": 0.0}, []))

    (sft_argv,), (rm_argv,), (ppo_argv,) = (calls.argv[m] for m in
                                            ("policy_optimization.sft", "reward_model.train", "policy_optimization.train"))
    # on: the flag with "true"; off: no template flag at all (the phases' own default, plain prompts)
    assert _flag(sft_argv, "--use_chat_template") == _flag(ppo_argv, "--use_chat_template") == ("true" if on else None)
    # the reward model's format is saved with it: reward_model.evaluate, PPO's critic and the report read it back
    assert _flag(rm_argv, "--prompt_format") == ("chat" if on else "plain")
    assert sampled_with == [on]  # the annotation samples
    assert len(evaluated) == 2  # the start policy and the end of the chunk


def _flag(argv: list[str], name: str) -> str | None:
    """The value of the last ``name`` flag in ``argv`` (later flags win), None if absent."""
    values = [argv[i + 1] for i in range(len(argv) - 1) if argv[i] == name]
    return values[-1] if values else None


def test_each_mode_runs_with_its_own_flags_and_the_users_flags_win(tmp_path, monkeypatch):
    calls = _RecordedPhases()
    monkeypatch.setattr(pipeline, "_call", calls)
    cfg = resolve(QuickstartConfig(preset="ci", output_dir=str(tmp_path / "out"), ppo_iterations=1, eval_every=1,
                                   mode_ppo_args={"scalar": ["--lam", "0.95", "--learning_rate", "3e-4"]},
                                   ppo_args=["--learning_rate", "1e-5"]))
    data = pipeline.stage_data(cfg, tmp_path / "out")
    for mode in ("nl_gradient", "scalar"):
        pipeline.stage_ppo(cfg, data, tmp_path / "sft", tmp_path / "rm" / "model", tmp_path / "out", mode,
                           lambda path, records: ({"fact_score": 0.0}, []))
    t2g, scalar = calls.argv["policy_optimization.train"]
    assert _flag(t2g, "--lam") == str(cfg.gae_lambda) and _flag(scalar, "--lam") == "0.95"
    assert _flag(t2g, "--learning_rate") == _flag(scalar, "--learning_rate") == "1e-5"  # ppo_args come last
    with pytest.raises(ValueError, match="unknown modes"):
        resolve(QuickstartConfig(preset="ci", mode_ppo_args={"ppo": ["--lam", "1"]}))
