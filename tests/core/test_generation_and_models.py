"""Batched generation returns exact ids; models and tokenizers load from local paths."""

import os
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
import torch.distributed as dist

from text2grad.core.generation import generate
from text2grad.core.modeling import (
    build_tiny_llama, deepspeed_shm_buffer, end_distributed, is_adapter_only, load_causal_lm, load_tokenizer, merge_adapter_folder, merged_weights,
    resolve_dtype,
)


def test_batched_generation_matches_one_at_a_time(bpe_tokenizer, tiny_llama):
    prompts = ["The author wrote", "My roommate keeps eating my food and", "def add(a, b):"]
    batched = generate(tiny_llama, bpe_tokenizer, prompts, max_new_tokens=6, batch_size=3)
    single = [generate(tiny_llama, bpe_tokenizer, [p], max_new_tokens=6)[0] for p in prompts]
    for b, s, p in zip(batched, single, prompts):
        assert b.response_ids == s.response_ids  # left padding does not change greedy continuations
        assert b.prompt_ids == bpe_tokenizer(p)["input_ids"]
        assert b.text == bpe_tokenizer.decode(b.response_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_generation_stops_at_eos(bpe_tokenizer):
    model = build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=1, num_heads=2)
    with torch.no_grad():  # make EOS the only likely token
        model.lm_head.weight.zero_()
        model.lm_head.bias = None
        model.model.norm.weight.fill_(0.0)
    model.config.tie_word_embeddings = False
    eos = bpe_tokenizer.eos_token_id
    out = generate(model, bpe_tokenizer, ["hello"], max_new_tokens=5)
    assert len(out[0].response_ids) <= 5
    if eos in out[0].response_ids:
        assert out[0].response_ids[-1] == eos and out[0].finished


def test_save_and_load_local_paths(tmp_path, bpe_tokenizer, tiny_llama):
    tiny_llama.save_pretrained(tmp_path / "m")
    bpe_tokenizer.save_pretrained(tmp_path / "m")
    tok = load_tokenizer(str(tmp_path / "m"))
    model = load_causal_lm(str(tmp_path / "m"), dtype="fp32")
    assert tok.padding_side == "left" and tok.pad_token is not None
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in tiny_llama.parameters())


def test_lora_adapter_round_trip(tmp_path, bpe_tokenizer, tiny_llama):
    tiny_llama.save_pretrained(tmp_path / "base")
    base = load_causal_lm(str(tmp_path / "base"))  # records its path, as a hub model records its id
    peft_model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    peft_model.save_pretrained(tmp_path / "adapter")
    with torch.no_grad():  # make the adapter non-trivial so the comparison means something
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    peft_model.save_pretrained(tmp_path / "adapter")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        expected = peft_model(ids).logits
        loaded = load_causal_lm(str(tmp_path / "base"), adapter=str(tmp_path / "adapter"))
        merged = load_causal_lm(str(tmp_path / "base"), adapter=str(tmp_path / "adapter"), merge_adapter=True)
        adapter_only_dir = load_causal_lm(str(tmp_path / "adapter"))  # base found through adapter_config.json
        assert isinstance(loaded, PeftModel) and not isinstance(merged, PeftModel)
        for m in (loaded, merged, adapter_only_dir):
            torch.testing.assert_close(m(ids).logits, expected, atol=1e-4, rtol=1e-4)


def test_an_adapter_folder_merged_once_is_the_adapted_model_and_is_reused(tmp_path, bpe_tokenizer, tiny_llama):
    tiny_llama.save_pretrained(tmp_path / "base")
    bpe_tokenizer.save_pretrained(tmp_path / "base")
    peft_model = get_peft_model(load_causal_lm(str(tmp_path / "base")),
                                LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "sft")
    bpe_tokenizer.save_pretrained(tmp_path / "sft")
    assert is_adapter_only(tmp_path / "sft") and not is_adapter_only(tmp_path / "base")
    merged = merge_adapter_folder(tmp_path / "sft", tmp_path / "sft-merged")
    assert merged == tmp_path / "sft-merged" and not is_adapter_only(merged)
    assert not (tmp_path / "sft-merged.partial").exists()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        expected, bare = peft_model(ids).logits, tiny_llama(ids).logits
        got = load_causal_lm(str(merged)).eval()(ids).logits
    assert not torch.allclose(expected, bare, atol=1e-4)  # the adapter matters, so the comparison can fail
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert load_tokenizer(str(merged)).get_vocab() == bpe_tokenizer.get_vocab()
    written = (merged / "config.json").stat().st_mtime_ns
    assert merge_adapter_folder(tmp_path / "sft", merged) == merged  # found, not rebuilt
    assert (merged / "config.json").stat().st_mtime_ns == written


def test_missing_local_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_causal_lm(str(tmp_path / "no" / "model"))
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int3")


# ---- grounded span decoding


class _OnlyToken:
    """A logits processor that allows one token id and records the batches it was built for."""

    def __init__(self, token_id: int, rows: range, width: int, log: list) -> None:
        self.token_id = token_id
        log.append((list(rows), width))

    def __call__(self, input_ids, scores):
        mask = torch.ones_like(scores, dtype=torch.bool)
        mask[:, self.token_id] = False
        return scores.masked_fill(mask, float("-inf"))


def test_logits_processors_hook_is_built_per_batch(bpe_tokenizer, tiny_llama):
    prompts = ["The author wrote", "My roommate keeps eating my food and", "def add(a, b):"]
    token = bpe_tokenizer("a", add_special_tokens=False)["input_ids"][-1]
    log: list = []
    gens = generate(
        tiny_llama, bpe_tokenizer, prompts, max_new_tokens=4, batch_size=2,
        logits_processors=lambda rows, width: [_OnlyToken(token, rows, width, log)],
    )
    assert [g.response_ids for g in gens] == [[token] * 4] * 3
    widths = [max(len(bpe_tokenizer(p)["input_ids"]) for p in prompts[:2]), len(bpe_tokenizer(prompts[2])["input_ids"])]
    assert log == [([0, 1], widths[0]), ([2], widths[1])]  # rows and the padded prompt width, per batch


def test_end_distributed_leaves_the_process_group(tmp_path):
    end_distributed()  # no group: nothing to do
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert dist.is_initialized()
    end_distributed()
    assert not dist.is_initialized()


def test_the_deepspeed_shared_memory_workspace_is_named_as_deepspeed_names_it():
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    assert deepspeed_shm_buffer(1, env, Path("/x")) == Path(f"/x/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_29511_1")
    assert deepspeed_shm_buffer(0, {}, Path("/x")).name == f"deepspeed_allreduce_buffer_{os.getuid()}___0"


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this system")
def test_end_distributed_removes_its_ranks_deepspeed_workspace_and_no_other(tmp_path, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(40000 + os.getpid() % 20000))
    mine = deepspeed_shm_buffer(0)
    another_launch = mine.with_name(mine.name.replace(f"_{os.environ['MASTER_PORT']}_", "_1_"))
    other_rank = deepspeed_shm_buffer(1)
    try:
        for f in (mine, another_launch, other_rank):
            f.write_bytes(b"workspace")
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        end_distributed()
        assert not mine.exists() and another_launch.exists() and other_rank.exists()
    finally:
        for f in (mine, another_launch, other_rank):
            f.unlink(missing_ok=True)


def _trained_lora(model, **config):
    """``model`` with a LoRA adapter whose B is non-zero (as after some training), so merging changes weights."""
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, **config))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn_like(param) * 0.1)
    return peft_model


def test_merged_weights_equal_peft_merge_and_leave_the_model_as_it_was(bpe_tokenizer):
    base = build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=2, num_heads=2, seed=0)
    original = {k: v.clone() for k, v in base.state_dict().items()}
    expected_names = set(original) - {"lm_head.weight"}  # tied to the input embeddings: stored once
    lora = _trained_lora(base, target_modules=["q_proj", "v_proj", "down_proj"])
    before = {k: v.clone() for k, v in lora.state_dict().items()}
    merged = merged_weights(lora)
    assert set(merged) == expected_names
    assert all(t.device.type == "cpu" for t in merged.values())
    assert all(torch.equal(before[k], v) for k, v in lora.state_dict().items())  # nothing merged into the model
    reference = lora.merge_and_unload().state_dict()  # peft's own merge (changes the model: last)
    for name, tensor in merged.items():
        assert torch.allclose(tensor, reference[name], atol=1e-6), name
    changed = {n for n in merged if not torch.equal(merged[n], original[n])}
    assert changed == {n for n in merged if any(m in n for m in ("q_proj", "v_proj", "down_proj"))}


def test_merged_weights_take_modules_to_save_and_refuse_dora(bpe_tokenizer):
    base = build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0)
    base.config.tie_word_embeddings = False
    base.lm_head.weight = torch.nn.Parameter(base.lm_head.weight.detach().clone())
    lora = _trained_lora(base, target_modules=["q_proj"], modules_to_save=["lm_head"])
    with torch.no_grad():
        lora.base_model.model.lm_head.modules_to_save["default"].weight.add_(1.0)  # the trained copy differs
    merged = merged_weights(lora)
    assert torch.equal(merged["lm_head.weight"], lora.base_model.model.lm_head.modules_to_save["default"].weight)
    assert not any("original_module" in n or "modules_to_save" in n for n in merged)

    dora = _trained_lora(build_tiny_llama(bpe_tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0),
                         target_modules=["q_proj"], use_dora=True)
    with pytest.raises(ValueError, match="LoRA variant.*lora_mode 'adapter'"):
        merged_weights(dora)


def test_merged_weights_of_a_plain_model_are_its_state_dict_once_per_tensor(bpe_tokenizer, tiny_llama):
    weights = merged_weights(tiny_llama)
    state = tiny_llama.state_dict()
    assert set(weights) == set(state) - {"lm_head.weight"}
    assert all(torch.equal(weights[k], state[k]) and weights[k].data_ptr() != state[k].data_ptr() for k in weights)
