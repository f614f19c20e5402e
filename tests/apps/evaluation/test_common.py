"""Shared evaluation helpers: policy loading, continuation log-probs (checked by hand), reports."""

from __future__ import annotations

import json
import pytest
import torch
from peft import LoraConfig, get_peft_model

from text2grad.apps.evaluation.common import ContinuationScore, continuation_logprobs, load_policy, markdown_table, write_report
from text2grad.core.modeling import load_causal_lm


def _manual_logprob(model, tokenizer, context: str, continuation: str) -> tuple[float, int]:
    """Unbatched, unpadded reference: one forward of context+continuation, sum over continuation tokens."""
    ctx = tokenizer(context)["input_ids"] or [tokenizer.bos_token_id]
    cont = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    return sum(logp[len(ctx) - 1 + j, tok].item() for j, tok in enumerate(cont)), len(cont)


def test_unigram_model_log_probs_by_hand(bpe_tokenizer, unigram_lm):
    model = unigram_lm(len(bpe_tokenizer))
    log_p = torch.log_softmax(model.weights.detach(), dim=-1)
    contexts = ["The author wrote", "My roommate keeps eating my food; I asked her to stop", "x"]
    continuations = [" a novel", " but she didn't listen.", " résumé 東京"]
    scores = continuation_logprobs(model, bpe_tokenizer, contexts, continuations, batch_size=2)
    for cont, score in zip(continuations, scores):
        ids = bpe_tokenizer(cont, add_special_tokens=False)["input_ids"]
        assert score.num_tokens == len(ids) > 0
        assert score.logprob == pytest.approx(sum(log_p[i].item() for i in ids), abs=1e-4)
        assert score.mean_logprob == pytest.approx(score.logprob / len(ids))
    # only the last (longest continuation in the batch + 1) positions' logits are requested
    longest = max(len(bpe_tokenizer(c, add_special_tokens=False)["input_ids"]) for c in continuations)
    assert len(model.calls) == 2 and max(c["logits_to_keep"] for c in model.calls) == longest + 1


def test_batched_padded_scores_match_unbatched_forward(bpe_tokenizer, tiny_llama):
    tiny_llama.eval()
    contexts = ["The author wrote", "My roommate keeps eating my food; I asked", "Summary:", "def add(a, b):"]
    continuations = [" a 200 page novel", " her to stop", " a student wants advice about moving to Berlin", "\n    return a + b"]
    batched = continuation_logprobs(tiny_llama, bpe_tokenizer, contexts, continuations, batch_size=3)
    for ctx, cont, score in zip(contexts, continuations, batched):
        expected, n = _manual_logprob(tiny_llama, bpe_tokenizer, ctx, cont)
        assert score.num_tokens == n
        assert score.logprob == pytest.approx(expected, abs=1e-4)
        assert not score.truncated


def test_truncation_keeps_the_end_of_the_context(bpe_tokenizer, tiny_llama):
    tiny_llama.eval()
    context = "My roommate keeps eating my food; I asked her to stop but she didn't listen."
    cont = " Summary: roommate eats food"
    ctx_ids = bpe_tokenizer(context)["input_ids"]
    cont_ids = bpe_tokenizer(cont, add_special_tokens=False)["input_ids"]
    max_length = len(cont_ids) + 3
    (score,) = continuation_logprobs(tiny_llama, bpe_tokenizer, [context], [cont], max_length=max_length)
    ids = torch.tensor([ctx_ids[-3:] + cont_ids])
    with torch.no_grad():
        logp = torch.log_softmax(tiny_llama(ids).logits[0], -1)
    expected = sum(logp[2 + j, t].item() for j, t in enumerate(cont_ids))
    assert score.truncated and score.num_tokens == len(cont_ids)
    assert score.logprob == pytest.approx(expected, abs=1e-4)


def test_empty_continuation_and_length_mismatch(bpe_tokenizer, tiny_llama):
    (score,) = continuation_logprobs(tiny_llama, bpe_tokenizer, ["The author"], [""])
    assert score == ContinuationScore(0.0, 0, False) and score.mean_logprob == float("-inf")
    with pytest.raises(ValueError, match="2 contexts but 1 continuations"):
        continuation_logprobs(tiny_llama, bpe_tokenizer, ["a", "b"], ["c"])


def test_load_policy_from_dir_adapter_and_adapter_only_dir(tmp_path, bpe_tokenizer, tiny_llama):
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    tiny_llama.save_pretrained(base_dir)
    bpe_tokenizer.save_pretrained(base_dir)
    model, tok = load_policy(str(base_dir), dtype="fp32", device="cpu")
    assert not model.training and tok.padding_side == "left"
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, tiny_llama.eval()(ids).logits)


    peft_model = get_peft_model(load_causal_lm(str(base_dir)), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
        expected = peft_model(ids).logits
    peft_model.save_pretrained(adapter_dir)  # no tokenizer saved here: it must come from the base model
    for policy, tokenizer in (load_policy(str(base_dir), str(adapter_dir)), load_policy(str(adapter_dir))):
        with torch.no_grad():
            torch.testing.assert_close(policy(ids).logits, expected, atol=1e-4, rtol=1e-4)
        assert tokenizer.get_vocab() == bpe_tokenizer.get_vocab()


def test_write_report_json_and_markdown(tmp_path):
    results = {"rouge": {"rouge1": 0.5}, "ppl": float("inf"), "notes": ["BERTScore model: X", "raw win rate"]}
    rows = [{"metric": "ROUGE-1 F1", "value": 0.123456}, {"metric": "a|b", "value": None, "n": 3}]
    json_path, md_path = write_report(tmp_path / "out", "report", results, rows, title="My eval")
    data = json.loads(json_path.read_text())
    assert data["name"] == "report" and data["results"]["rouge"] == {"rouge1": 0.5}
    assert data["results"]["ppl"] is None  # inf is not JSON
    assert data["rows"][0]["value"] == 0.123456
    md = md_path.read_text()
    assert md.startswith("# My eval\n")
    assert "| metric | value | n |" in md and "| ROUGE-1 F1 | 0.1235 | - |" in md
    assert "| a\\|b | - | 3 |" in md  # pipes escaped so the table stays a table
    assert "- BERTScore model: X" in md and "- raw win rate" in md
    assert markdown_table([]) == "_(no rows)_\n"
