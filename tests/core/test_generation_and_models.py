"""Batched generation returns exact ids; models and tokenizers load from local paths."""

import pytest
import torch

from text2grad.core.generation import QuoteConstraint, generate, open_quote, span_list_state
from text2grad.core.modeling import build_tiny_llama, load_causal_lm, load_tokenizer, resolve_dtype


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
    from peft import LoraConfig, PeftModel, get_peft_model

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


def test_missing_local_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_causal_lm(str(tmp_path / "no" / "model"))
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("int3")


# ---- grounded span decoding


@pytest.mark.parametrize(
    "text, expected",
    [
        ('Wrong city.\n{"good_spans": ["Alex"], "poor_spans": ["Os', "Os"),
        ('Wrong city.\n{"good_spans": ["Alex"], "poor_spans": ["', ""),
        ('Wrong city.\n{"good_spans": ["Alex", ', None),  # between items
        ('Wrong city.\n{"good_spans": ["Alex"], "poor_spans": []', None),  # list closed
        ('Wrong city.\n{"good_spans": ["Alex"], "poor', None),  # in a key, not a quote
        ('The "critique" quotes "words" freely', None),  # no span list yet
        ('{"Poor Spans": ["say \\"hi', 'say \\"hi'),  # escaped quote stays inside; other key spellings
        ('{"goodSpans": ["a]b', "a]b"),  # camelCase too; a bracket inside a quote does not close the list
        ('{"good_spans": ["a"], "note": ["b', None),  # a list under another key is not a span list
    ],
)
def test_open_quote(text, expected):
    assert open_quote(text) == expected


def _token_texts(tokenizer) -> list[str]:
    anchor = tokenizer("a", add_special_tokens=False)["input_ids"][-1:]
    head = tokenizer.decode(anchor)
    special = set(tokenizer.all_special_ids)
    texts = []
    for i in range(len(tokenizer)):
        t = tokenizer.decode(anchor + [i], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        texts.append("" if i in special or "\ufffd" in t or not t.startswith(head) else t[len(head) :])
    return texts


@pytest.mark.parametrize("quote", ["", "The", "a 200 p", "novel", "looking for a good editor.", "zzz"])
def test_quote_constraint_allows_exactly_the_grounded_tokens(any_tokenizer, quote):
    source = "The author wrote a 200 page unpublished novel and is looking for a good editor."
    texts = _token_texts(any_tokenizer)
    expected = set()
    for i, t in enumerate(texts):
        if not t:
            continue
        body, closes, rest = t.partition('"')
        ws = " \t\n\r"
        if closes and not (rest.strip(ws) in ("", ",") or rest.lstrip(ws).startswith("]")
                           or (rest.lstrip(ws).startswith(",") and rest.lstrip(ws)[1:].strip(ws) == '"')):
            continue
        if (quote + body) in source and (not closes or (quote + body).strip()):
            expected.add(i)
    allowed = set(QuoteConstraint(any_tokenizer, 0, [source]).allowed_ids(0, quote))
    assert allowed == expected  # brute force over the whole vocabulary
    if quote == "zzz":
        assert not allowed  # not in the source: the caller then leaves the row unconstrained
    elif not source.endswith(quote):  # (at the very end only a '"' token could close it)
        assert allowed, "a quote that occurs in the source always has a continuation"


def test_quote_constraint_masks_only_rows_inside_a_quote(bpe_tokenizer):
    prefix = bpe_tokenizer("Summary: a", add_special_tokens=False)["input_ids"]
    inside = bpe_tokenizer('x\n{"good_spans": ["The', add_special_tokens=False)["input_ids"]
    outside = bpe_tokenizer("x\nThe critique", add_special_tokens=False)["input_ids"]
    width = len(prefix)
    pad = bpe_tokenizer.pad_token_id
    n = max(len(inside), len(outside))
    rows = [prefix + inside + [pad] * 0, prefix + outside]
    rows = [r + [pad] * (width + n - len(r)) for r in rows]
    constraint = QuoteConstraint(bpe_tokenizer, width, ["The author wrote", "The author wrote"])
    scores = torch.zeros(2, len(bpe_tokenizer))
    out = constraint(torch.tensor(rows)[:, : width + len(inside)], scores.clone())
    # row 0 ends inside a quote: only continuations of "The" found in the source stay finite
    assert set(torch.isfinite(out[0]).nonzero().flatten().tolist()) == set(constraint.allowed_ids(0, "The"))
    assert 0 < torch.isfinite(out[0]).sum() < len(bpe_tokenizer)


def test_generate_rejects_misaligned_quote_sources(bpe_tokenizer, tiny_llama):
    with pytest.raises(ValueError, match="one text per prompt"):
        generate(tiny_llama, bpe_tokenizer, ["a", "b"], quote_sources=["only one"])


def test_span_list_state_and_the_tokens_allowed_between_items(any_tokenizer):
    assert span_list_state('ok\n{"good_spans": ["a", ') == ("next", "")
    assert span_list_state('ok\n{"good_spans": [') == ("next", "")
    assert span_list_state('ok\n{"good_spans": ["a" ') == ("item", "")
    assert span_list_state('ok\n{"good_spans": ["a') == ("quote", "a")
    assert span_list_state('ok\n{"good_spans": ["a"]') is None
    constraint = QuoteConstraint(any_tokenizer, 0, ["whatever"])
    texts = _token_texts(any_tokenizer)

    def lead(t: str) -> str:  # JSON whitespace only: control characters are not allowed between items
        return t.lstrip(" \t\n\r")

    after = {i for i, t in enumerate(texts) if t and (lead(t) == "" or lead(t).startswith("]")
                                                      or (lead(t)[0] == "," and lead(lead(t)[1:]) in ("", '"')))}
    after_next = {i for i, t in enumerate(texts) if t and (lead(t) in ("", '"') or lead(t).startswith("]"))}
    assert set(constraint.trie.after_item_ids) == after and after
    assert set(constraint.trie.next_item_ids) == after_next and after_next


def test_end_distributed_leaves_the_process_group(tmp_path):
    import torch.distributed as dist

    from text2grad.core.modeling import end_distributed

    end_distributed()  # no group: nothing to do
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert dist.is_initialized()
    end_distributed()
    assert not dist.is_initialized()
