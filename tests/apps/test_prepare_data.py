"""`text2grad prepare-data` on hand-written rows in each dataset's real layout (tests/fixtures/<dataset>/), through
the real entry point, in the layouts users have: hub-style JSONL / parquet files and save_to_disk copies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pytest
from datasets import Dataset, DatasetDict
from tests.fake_openai import FakeOpenAIServer, quoting_handler

from annotation.cli import main as annotate
from annotation.code_critic import CodeTestCritic
from text2grad.apps.evaluation.code import main as eval_code
from text2grad.apps.cli import main as cli_main
from text2grad.core.data import iter_jsonl
from text2grad.core.modeling import build_tiny_llama, train_tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
OUTPUTS = ("annotation_input.jsonl", "sft.jsonl", "rl_prompts.jsonl", "eval.jsonl", "preference_pairs.jsonl")


def prepare(tmp_path: Path, *args: str, out: str = "out") -> tuple[int, Path]:
    rc = cli_main(["prepare-data", *args, "--output_dir", str(tmp_path / out)])
    return rc, tmp_path / out


def read(out: Path, name: str) -> list[dict]:
    return list(iter_jsonl(out / name))


def fixture_rows(dataset: str, split: str) -> list[dict]:
    return list(iter_jsonl(FIXTURES / dataset / f"{split}.jsonl"))


def as_parquet(dataset: str, dest: Path, splits: tuple[str, ...]) -> Path:
    """The fixture rows in the hub's parquet layout: dest/data/<split>-00000-of-00001.parquet."""
    (dest / "data").mkdir(parents=True)
    for split in splits:
        Dataset.from_list(fixture_rows(dataset, split)).to_parquet(str(dest / "data" / f"{split}-00000-of-00001.parquet"))
    return dest


# ---------------------------------------------------------------------------------------------------------------
# SLF5K
# ---------------------------------------------------------------------------------------------------------------


def test_slf5k_from_its_jsonl_files(tmp_path):
    rc, out = prepare(tmp_path, "--dataset", "slf5k", "--dataset_path", str(FIXTURES / "slf5k"))
    assert rc == 0
    train = {r["id"]: r for r in fixture_rows("slf5k", "train")}
    annotation = read(out, "annotation_input.jsonl")
    assert [r["id"] for r in annotation] == list(train)
    for rec in annotation:  # the post, the summary the human critiqued, and the human's feedback
        native = train[rec["id"]]
        assert rec["prompt"] == native["post"] and rec["response"] == native["generated_summary_for_feedback"]
        assert rec["feedback"] == native["feedback"] and rec["feedback_class"] == native["feedback_class"]
    sft = read(out, "sft.jsonl")
    assert sft[0]["prompt"] == f"Title: {train['t3_1a2b3c']['title']}\n\n{train['t3_1a2b3c']['post']}\n\nTL;DR:"
    assert sft[0]["completion"] == " " + train["t3_1a2b3c"]["ideal_human_summary"]
    rl = read(out, "rl_prompts.jsonl")
    assert [r["reference"] for r in rl] == [r["ideal_human_summary"] for r in train.values()]
    pairs = {p["id"]: p for p in read(out, "preference_pairs.jsonl")}
    # "Summary A" -> A is chosen; "Summary B" -> B is chosen (continuations of the prompt: a leading space)
    assert pairs["t3_1a2b3c"]["chosen"] == " " + train["t3_1a2b3c"]["generated_summary_for_comparison_A"].strip()
    assert pairs["t3_1a2b3c"]["rejected"] == " " + train["t3_1a2b3c"]["generated_summary_for_comparison_B"].strip()
    assert pairs["t3_4d5e6f"]["chosen"] == " " + train["t3_4d5e6f"]["generated_summary_for_comparison_B"].strip()
    assert pairs["t3_4d5e6f"]["rejected"] == " " + train["t3_4d5e6f"]["generated_summary_for_comparison_A"].strip()
    evaluation = read(out, "eval.jsonl")  # the validation split, native columns kept for the eval config
    assert [r["id"] for r in evaluation] == [r["id"] for r in fixture_rows("slf5k", "validation")]
    assert all(r["reference"] == r["ideal_human_summary"] and "title" in r and "post" in r for r in evaluation)
    report = json.loads((out / "prepare_report.json").read_text())
    assert report["files"] == {"annotation_input.jsonl": 3, "sft.jsonl": 3, "rl_prompts.jsonl": 3, "eval.jsonl": 2,
                               "preference_pairs.jsonl": 3}
    assert report["preference"] == {"Summary A": 2, "Summary B": 1} and report["eval_split"] == "validation"


def test_slf5k_from_save_to_disk_and_parquet_gives_the_same_files(tmp_path):
    rc, reference = prepare(tmp_path, "--dataset", "slf5k", "--dataset_path", str(FIXTURES / "slf5k"), out="jsonl")
    assert rc == 0
    saved = tmp_path / "saved"
    DatasetDict({s: Dataset.from_list(fixture_rows("slf5k", s)) for s in ("train", "validation")}).save_to_disk(str(saved))
    rc, from_disk = prepare(tmp_path, "--dataset", "slf5k", "--dataset_path", str(saved), out="disk")
    assert rc == 0
    rc, from_parquet = prepare(tmp_path, "--dataset", "slf5k", "--dataset_path", str(as_parquet("slf5k", tmp_path / "pq",
                                                                                          ("train", "validation"))), out="pq")
    assert rc == 0
    for name in OUTPUTS:
        assert read(from_disk, name) == read(reference, name) == read(from_parquet, name), name


def test_slf5k_hub_id_reads_the_jsonl_data_files_not_the_loading_script(tmp_path, monkeypatch):
    calls = []

    def fake_load_dataset(path, *args, **kwargs):  # no network here: record the call, serve the fixture file
        calls.append((path, kwargs.get("data_files")))
        split = str(kwargs["data_files"]).rsplit("/", 1)[-1].removesuffix(".jsonl")
        return datasets.Dataset.from_list(fixture_rows("slf5k", split))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    rc, out = prepare(tmp_path, "--dataset", "slf5k", "--dataset_path", "JeremyAlain/SLF5K")
    assert rc == 0
    assert calls == [("json", "hf://datasets/JeremyAlain/SLF5K/train.jsonl"),
                     ("json", "hf://datasets/JeremyAlain/SLF5K/validation.jsonl")]
    assert len(read(out, "preference_pairs.jsonl")) == 3


# ---------------------------------------------------------------------------------------------------------------
# UltraFeedback
# ---------------------------------------------------------------------------------------------------------------


def test_ultrafeedback_split_by_prompt_and_both_answers_annotated(tmp_path):
    source = as_parquet("ultrafeedback", tmp_path / "uf", ("train_prefs", "test_prefs"))  # the hub's layout
    rc, out = prepare(tmp_path, "--dataset", "ultrafeedback", "--dataset_path", str(source), "--seed", "3")
    assert rc == 0
    rows = fixture_rows("ultrafeedback", "train_prefs")
    sft, rl = read(out, "sft.jsonl"), read(out, "rl_prompts.jsonl")
    pairs, annotation = read(out, "preference_pairs.jsonl"), read(out, "annotation_input.jsonl")
    parts = {"sft": {r["prompt_id"] for r in sft}, "rm": {r["prompt_id"] for r in pairs}, "rl": {r["prompt_id"] for r in rl}}
    assert not (parts["sft"] & parts["rm"] or parts["sft"] & parts["rl"] or parts["rm"] & parts["rl"])  # disjoint
    assert parts["sft"] | parts["rm"] | parts["rl"] == {r["prompt_id"] for r in rows}
    assert len(sft) + len(pairs) + len(rl) == len(rows)  # the repeated prompt_id stays with its part, nothing lost
    # 6 distinct prompts at 30/50/20: 2 / 3 / 1 prompts
    assert [len(parts[p]) for p in ("sft", "rm", "rl")] == [2, 3, 1]
    # both answers of every reward-model pair, each with its own id; the text is the last assistant message
    by_id = {r["id"]: r for r in annotation}
    assert len(by_id) == len(annotation) == 2 * len(pairs)
    native = {(r["prompt_id"], r["chosen"][-1]["content"]): r for r in rows}
    for pair in pairs:
        chosen, rejected = by_id[f"{pair['id']}:chosen"], by_id[f"{pair['id']}:rejected"]
        assert (chosen["response"], rejected["response"]) == (pair["chosen"], pair["rejected"])
        row = native[(pair["prompt_id"], pair["chosen"])]
        assert pair["rejected"] == row["rejected"][-1]["content"] and chosen["score"] == row["score_chosen"]
    evaluation = read(out, "eval.jsonl")
    assert [r["prompt"] for r in evaluation] == [r["prompt"] for r in fixture_rows("ultrafeedback", "test_prefs")]
    assert all(isinstance(r["chosen"], str) and isinstance(r["rejected"], str) for r in evaluation)
    report = json.loads((out / "prepare_report.json").read_text())
    assert report["parts"]["rm"] == {"pairs": len(pairs), "prompts": 3} and report["repeated_prompt_ids"] == 1


def test_ultrafeedback_split_is_seeded(tmp_path):
    def parts(seed: str, name: str) -> dict[str, set[str]]:
        rc, out = prepare(tmp_path, "--dataset", "ultrafeedback", "--dataset_path", str(FIXTURES / "ultrafeedback"),
                          "--seed", seed, out=name)
        assert rc == 0
        return {f: {r["prompt_id"] for r in read(out, f)} for f in ("sft.jsonl", "preference_pairs.jsonl", "rl_prompts.jsonl")}

    assert parts("0", "a") == parts("0", "b")
    assert any(parts("0", "a") != parts(str(seed), f"s{seed}") for seed in range(1, 6))


def test_repeated_prompt_id_gets_distinct_ids(tmp_path):
    rc, out = prepare(tmp_path, "--dataset", "ultrafeedback", "--dataset_path", str(FIXTURES / "ultrafeedback"),
                      "--fractions", '{"sft": 0, "rm": 1, "rl": 0}')
    assert rc == 0
    ids = [r["id"] for r in read(out, "annotation_input.jsonl")]
    assert len(ids) == len(set(ids)) == 14
    assert sum(i.endswith("#2:chosen") for i in ids) == 1


# ---------------------------------------------------------------------------------------------------------------
# KodCode
# ---------------------------------------------------------------------------------------------------------------


def test_kodcode_completions_scored_by_the_unit_tests(tmp_path):
    source = as_parquet("kodcode", tmp_path / "kc", ("train",))
    rc, out = prepare(tmp_path, "--dataset", "kodcode", "--dataset_path", str(source), "--completions",
                      str(FIXTURES / "kodcode" / "completions.jsonl"), "--fractions", '{"rm": 1.0}')
    assert rc == 0
    records = {r["id"]: r for r in read(out, "annotation_input.jsonl")}
    # 4 references + 5 completions, each run against its question's tests in the sandbox
    assert len(records) == 9
    assert all(records[f"{q}:reference"]["execution"]["passed"] for q in
               ("Leetcode_1001_I", "Leetcode_1002_I", "Leetcode_1003_I", "Leetcode_1004_I"))
    wrong_sum = records["Leetcode_1001_I:completion-0"]
    assert wrong_sum["execution"]["verdict"] == "failed" and wrong_sum["execution"]["tests_failed"] == ["test_mixed"]
    assert wrong_sum["execution"]["failure"]["error_type"] == "AssertionError"
    assert "sum_of_evens([1, 2, 3, 4]) == 6" in wrong_sum["execution_result"]  # the failing assertion, for the critic
    assert wrong_sum["tests"] == fixture_rows("kodcode", "train")[0]["test"]
    assert records["Leetcode_1002_I:completion-0"]["execution"]["passed"]  # a different but correct program
    misnamed = records["Leetcode_1002_I:completion-1"]  # right code, wrong function name: the tests cannot import it
    assert not misnamed["execution"]["passed"]
    assert records["Leetcode_1003_I:completion-0"]["execution"]["tests_failed"] == ["test_negative"]
    assert records["Leetcode_1004_I:completion-0"]["execution"]["passed"]
    # the policy prompt carries the required signature from test_info
    assert "def sum_of_evens(nums):" in wrong_sum["prompt"] and wrong_sum["prompt"].startswith("Write a function")
    report = json.loads((out / "prepare_report.json").read_text())
    assert report["programs"] == {"reference": {"passing": 4, "failing": 0}, "completion": {"passing": 2, "failing": 3}}
    assert (report["passing"], report["failing"]) == (6, 3)
    pairs = read(out, "preference_pairs.jsonl")  # a passing and a failing program where a question has both
    assert sorted(p["question_id"] for p in pairs) == ["Leetcode_1001_I", "Leetcode_1002_I", "Leetcode_1003_I"]
    assert all(records[p["chosen_id"]]["execution"]["passed"] and not records[p["rejected_id"]]["execution"]["passed"]
               for p in pairs)


def test_kodcode_parts_are_disjoint_and_carry_what_the_phases_need(tmp_path):
    rc, out = prepare(tmp_path, "--dataset", "kodcode", "--dataset_path", str(FIXTURES / "kodcode" / "train.jsonl"),
                      "--completions", str(FIXTURES / "kodcode" / "completions.jsonl"),
                      "--fractions", '{"rm": 0.5, "rl": 0.25, "eval": 0.25}')
    assert rc == 0
    rm = {r["question_id"] for r in read(out, "annotation_input.jsonl")}
    rl, evaluation = read(out, "rl_prompts.jsonl"), read(out, "eval.jsonl")
    assert (len(rm), len(rl), len(evaluation)) == (2, 1, 1)
    assert not (rm & {r["question_id"] for r in rl}) and not (rm & {r["question_id"] for r in evaluation})
    assert {r["question_id"] for r in rl} != {r["question_id"] for r in evaluation}
    assert rl[0]["test"].startswith("from solution import") and isinstance(rl[0]["test_info"], list)
    assert rl[0]["test_info"][0]["function_declaration"] in rl[0]["prompt"]
    assert evaluation[0]["question"] == evaluation[0]["prompt"] != evaluation[0]["question_text"]
    sft = read(out, "sft.jsonl")
    assert {r["question_id"] for r in sft} == rm and all(r["completion"].startswith("```python\n") for r in sft)
    report = json.loads((out / "prepare_report.json").read_text())
    assert report["completions_outside_rm_part"] == 3  # completions of RL/eval questions are not used


@pytest.mark.slow
def test_kodcode_completions_from_a_model(tmp_path):
    corpus = [json.dumps(r) for r in fixture_rows("kodcode", "train")] * 3
    tokenizer = train_tokenizer(corpus, vocab_size=300)
    build_tiny_llama(tokenizer, hidden_size=16, num_layers=1, num_heads=2).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    rc, out = prepare(tmp_path, "--dataset", "kodcode", "--dataset_path", str(FIXTURES / "kodcode"), "--fractions",
                      '{"rm": 1.0}', "--completions_model", str(tmp_path / "model"), "--completions_per_question", "2",
                      "--max_new_tokens", "8", "--test_timeout_s", "5")
    assert rc == 0
    records = read(out, "annotation_input.jsonl")
    completions = [r for r in records if r["kind"] == "completion"]
    assert len(completions) == 8 and {r["id"].rsplit("-", 1)[1] for r in completions} == {"0", "1"}
    assert all(r["execution"]["verdict"] in ("passed", "failed", "crashed", "timeout") for r in completions)
    report = json.loads((out / "prepare_report.json").read_text())
    assert report["programs"]["completion"]["passing"] + report["programs"]["completion"]["failing"] == 8
    assert report["completions_from"] == f"model {tmp_path / 'model'}"


def test_kodcode_needs_completions(tmp_path, capsys):
    rc, out = prepare(tmp_path, "--dataset", "kodcode", "--dataset_path", str(FIXTURES / "kodcode"))
    assert rc == 2 and not out.exists()
    assert "completions_model" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# Schema errors: dataset, split, missing column and the columns that exist; exit 2; nothing written
# ---------------------------------------------------------------------------------------------------------------


def _copy_without(dataset: str, split: str, column: str, dest: Path) -> Path:
    shutil.copytree(FIXTURES / dataset, dest)
    rows = [{k: v for k, v in r.items() if k != column} for r in fixture_rows(dataset, split)]
    (dest / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dest


@pytest.mark.parametrize("dataset, split, column, extra", [
    ("slf5k", "train", "feedback", []),
    ("slf5k", "validation", "ideal_human_summary", []),
    ("ultrafeedback", "train_prefs", "rejected", []),
    ("kodcode", "train", "test_info", ["--completions", str(FIXTURES / "kodcode" / "completions.jsonl")]),
])
def test_missing_column(tmp_path, capsys, dataset, split, column, extra):
    source = _copy_without(dataset, split, column, tmp_path / "src")
    rc, out = prepare(tmp_path, "--dataset", dataset, "--dataset_path", str(source), *extra)
    err = capsys.readouterr().err
    assert rc == 2 and not (out / "prepare_report.json").exists()
    assert err.startswith("error: ") and f"{dataset} split '{split}'" in err and f"lacks column(s) ['{column}']" in err
    existing = sorted(set(fixture_rows(dataset, split)[0]) - {column})
    assert f"it has columns {existing}" in err


def test_wrong_split_name(tmp_path, capsys):
    source = tmp_path / "uf"
    source.mkdir()
    shutil.copy(FIXTURES / "ultrafeedback" / "train_prefs.jsonl", source / "train.jsonl")  # not a split of the dataset
    shutil.copy(FIXTURES / "ultrafeedback" / "test_prefs.jsonl", source / "test_prefs.jsonl")
    rc, out = prepare(tmp_path, "--dataset", "ultrafeedback", "--dataset_path", str(source))
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert "ultrafeedback" in err and "no split 'train_prefs'" in err and "it has splits ['test_prefs', 'train']" in err


def test_wrong_eval_split_and_flattened_conversations(tmp_path, capsys):
    rc, _ = prepare(tmp_path, "--dataset", "slf5k", "--dataset_path", str(FIXTURES / "slf5k"), "--eval_split", "test")
    err = capsys.readouterr().err
    assert rc == 2 and "slf5k" in err and "no split 'test'" in err and "['train', 'validation']" in err
    source = tmp_path / "flat"
    source.mkdir()
    for split in ("train_prefs", "test_prefs"):
        rows = [{**r, "chosen": r["chosen"][-1]["content"]} for r in fixture_rows("ultrafeedback", split)]
        (source / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, _ = prepare(tmp_path, "--dataset", "ultrafeedback", "--dataset_path", str(source))
    err = capsys.readouterr().err
    assert rc == 2 and "column 'chosen' holds str, expected a list of {role, content} messages" in err


def test_missing_input_is_named(tmp_path, capsys):
    rc, _ = prepare(tmp_path, "--dataset", "slf5k", "--dataset_path", str(tmp_path / "nowhere"))
    assert rc == 2 and "does not exist" in capsys.readouterr().err


def test_kodcode_llm_critic_sees_the_tests_and_the_execution_result(tmp_path):
    """prepare-data's KodCode records through the real annotate CLI and the built-in CoT prompt: every request
    shows the unit tests and that program's own execution result (the failing assertion for a wrong program)."""
    rc, out = prepare(tmp_path, "--dataset", "kodcode", "--dataset_path", str(FIXTURES / "kodcode"), "--completions",
                      str(FIXTURES / "kodcode" / "completions.jsonl"), "--fractions", '{"rm": 1.0}')
    assert rc == 0
    records = read(out, "annotation_input.jsonl")
    with FakeOpenAIServer(quoting_handler) as server:
        rc = annotate(["--config", str(FIXTURES.parent.parent / "configs" / "kodcode" / "annotation.yaml"), "--dataset_path", str(out / "annotation_input.jsonl"),
                       "--output", str(tmp_path / "ann.jsonl"), "--base_url", server.base_url,
                       "--api_key_env", "TEXT2GRAD_TEST_NO_KEY", "--progress_bar", "false", "--concurrency", "2"])
        bodies = list(server.requests)
    assert rc == 0 and len(bodies) == len(records) == 9
    seen_failures = 0
    for body in bodies:
        user = body["messages"][-1]["content"]
        # (two records may hold the same program: a completion equal to the reference, with the same result)
        rec = next(r for r in records if f"<response>\n{r['response']}\n</response>" in user)
        assert f"<unit_tests>\n{rec['tests']}\n</unit_tests>" in user
        assert f"<execution_result>\n{rec['execution_result']}\n</execution_result>" in user
        seen_failures += "First failure: test_mixed: AssertionError" in user
    assert seen_failures == 1
    annotated = list(iter_jsonl(tmp_path / "ann.jsonl"))
    assert {a["id"] for a in annotated} == {r["id"] for r in records}


# ---------------------------------------------------------------------------------------------------------------
# Real-row edges: tests without the solution import, the test_code column, hashed shard names, ties
# ---------------------------------------------------------------------------------------------------------------

# A hub shard's content hash, as `huggingface_hub` names parquet shards: <split>-00000-of-00001-<hash>.parquet
_SHARD_HASH = "17309c769bfe5733"


def _without_solution_import(test: str) -> str:
    """The test as some real KodCode rows have it: no `from solution import ...` line (KodCode's harness adds
    `from solution import *` above it)."""
    return "".join(line for line in test.splitlines(keepends=True) if not line.startswith("from solution import"))


def _kodcode_v1_revision(dest: Path) -> tuple[Path, list[dict]]:
    """The fixture rows as a KodCode-V1 revision ships them: the tests in `test_code`, two of them without the
    import, in one hub-named shard data/train-00000-of-00001-<hash>.parquet."""
    rows = fixture_rows("kodcode", "train")
    for i, row in enumerate(rows):
        test = row.pop("test")
        row["test_code"] = _without_solution_import(test) if i < 2 else test
    (dest / "data").mkdir(parents=True)
    Dataset.from_list(rows).to_parquet(str(dest / "data" / f"train-00000-of-00001-{_SHARD_HASH}.parquet"))
    return dest, rows


def test_kodcode_tests_without_the_import_run_as_kodcodes_harness_runs_them(tmp_path):
    source, rows = _kodcode_v1_revision(tmp_path / "kc")
    assert "from solution import" not in rows[0]["test_code"] and "sum_of_evens(" in rows[0]["test_code"]
    rc, out = prepare(tmp_path, "--dataset", "kodcode", "--dataset_path", str(source), "--completions",
                      str(FIXTURES / "kodcode" / "completions.jsonl"), "--fractions", '{"rm": 1.0}')
    assert rc == 0
    records = {r["id"]: r for r in read(out, "annotation_input.jsonl")}
    references = [r for r in records.values() if r["kind"] == "reference"]
    assert len(references) == 4 and all(r["execution"]["passed"] for r in references)  # no NameError
    wrong_sum = records["Leetcode_1001_I:completion-0"]  # a real failure is still one
    assert wrong_sum["execution"]["tests_failed"] == ["test_mixed"]
    assert wrong_sum["tests"] == rows[0]["test_code"]  # the row's tests as released
    report = json.loads((out / "prepare_report.json").read_text())
    assert report["columns_renamed"] == {"test_code": "test"}
    assert report["programs"]["reference"] == {"passing": 4, "failing": 0}
    assert sorted(p["question_id"] for p in read(out, "preference_pairs.jsonl")) == [
        "Leetcode_1001_I", "Leetcode_1002_I", "Leetcode_1003_I"]


def test_kodcode_rows_without_the_import_pass_in_eval_code_and_the_unit_test_critic(tmp_path):
    _, rows = _kodcode_v1_revision(tmp_path / "kc")
    local_copy = tmp_path / "kodcode_v1.jsonl"  # the V1 rows as a local JSONL copy: `test_code`, two without the import
    local_copy.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval"
    assert eval_code(["--benchmark", "kodcode", "--dataset_path", str(local_copy), "--score_references", "true",
                      "--workers", "2", "--output_dir", str(out), "--progress_bar", "false"]) == 0
    results = json.loads((out / "kodcode.json").read_text())["results"]
    assert results["problems"] == 4 and results["pass@1"] == 1.0
    critic = CodeTestCritic(timeout_s=10)
    feedback, info = critic.critique(f"```python\n{rows[0]['solution']}```", rows[0]["test_code"])
    assert info["verdict"] == "passed" and feedback.ok, (info, feedback)


def _ultrafeedback_with_a_tie(dest: Path) -> Path:
    """The fixture in the hub's hashed shard names, with a tie like row 0 of the real train_prefs (8.5 vs 8.5)."""
    (dest / "data").mkdir(parents=True)
    for split in ("train_prefs", "test_prefs"):
        rows = fixture_rows("ultrafeedback", split)
        rows[0] = {**rows[0], "score_chosen": 8.5, "score_rejected": 8.5}
        Dataset.from_list(rows).to_parquet(str(dest / "data" / f"{split}-00000-of-00001-{_SHARD_HASH}.parquet"))
    return dest


def test_ultrafeedback_hub_shards_with_hashes_and_ties_flagged_counted_or_dropped(tmp_path):
    source = _ultrafeedback_with_a_tie(tmp_path / "uf")
    rc, out = prepare(tmp_path, "--dataset", "ultrafeedback", "--dataset_path", str(source),
                      "--fractions", '{"sft": 0, "rm": 1, "rl": 0}')
    assert rc == 0  # train_prefs and test_prefs found under their hashed shard names
    tie_id = str(fixture_rows("ultrafeedback", "train_prefs")[0]["prompt_id"])
    pairs = read(out, "preference_pairs.jsonl")
    assert len(pairs) == 7 and [p["tie"] for p in pairs if p["prompt_id"] == tie_id][0] is True
    assert sum(p["tie"] for p in pairs) == 1
    assert sum(r["tie"] for r in read(out, "annotation_input.jsonl")) == 2  # both answers of the tied pair
    report = json.loads((out / "prepare_report.json").read_text())
    assert report["ties"] == {"train_prefs": 1, "test_prefs": 1, "dropped": False}
    assert report["splits"]["train_prefs"]["rows"] == 7 and report["eval_prompts_in_training"] == 0

    rc, dropped = prepare(tmp_path, "--dataset", "ultrafeedback", "--dataset_path", str(source), "--drop_ties", "true",
                          "--fractions", '{"sft": 0, "rm": 1, "rl": 0}', out="dropped")
    assert rc == 0
    assert len(read(dropped, "preference_pairs.jsonl")) == 6 and not any(p["tie"] for p in read(dropped, "preference_pairs.jsonl"))
    assert len(read(dropped, "eval.jsonl")) == 1
    assert json.loads((dropped / "prepare_report.json").read_text())["ties"] == {
        "train_prefs": 1, "test_prefs": 1, "dropped": True}


def test_ultrafeedback_eval_on_the_training_split_is_refused(tmp_path, capsys):
    rc, out = prepare(tmp_path, "--dataset", "ultrafeedback", "--dataset_path", str(FIXTURES / "ultrafeedback"),
                      "--eval_split", "train_prefs")
    err = capsys.readouterr().err
    assert rc == 2 and "eval_split 'train_prefs' is the training split itself" in err and "use test_prefs" in err
    assert not out.exists()
