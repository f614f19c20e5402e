"""The reward model's input/target format: round trip, exact label masks, truncation rules."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reward_model.rm_testlib import INSTRUCTION, RECORDS
from reward_model.serialization import (
    IGNORE_INDEX,
    PLAIN_TEMPLATE,
    TRUNCATION_MARK,
    build_rm_input,
    collate,
    encode_example,
    encode_input,
    fit_rm_input,
    parse_target,
    record_feedback,
    record_spans,
    target_text,
)
from text2grad.core.feedback import Feedback, parse_feedback
from text2grad.core.modeling import build_tiny_llama
from text2grad.core.spans import feedback_token_labels

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def chat_tokenizer(rm_tokenizer):
    tok = copy.deepcopy(rm_tokenizer)
    tok.chat_template = CHAT_TEMPLATE
    return tok


# --------------------------------------------------------------------------------------------------
# Round trip
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("record", RECORDS, ids=[r["id"] for r in RECORDS])
def test_target_round_trip_through_tokenizer(rm_tokenizer, record):
    fb = record_feedback(record)
    enc = encode_example(rm_tokenizer, record["prompt"], record["response"], fb, max_length=512, instruction=INSTRUCTION)
    target_ids = enc.input_ids[enc.n_input :]
    assert target_ids[-1] == rm_tokenizer.eos_token_id
    decoded = rm_tokenizer.decode(target_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    assert decoded == target_text(fb)
    parsed = parse_target(decoded)
    assert parsed.ok and not parsed.repaired
    assert (parsed.feedback.critique, parsed.feedback.good_spans, parsed.feedback.poor_spans) == (
        fb.critique,
        fb.good_spans,
        fb.poor_spans,
    )


quote = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=20
).filter(lambda s: s.strip() == s and s)
critique = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=60).map(lambda s: " ".join(s.split()))


@settings(max_examples=150, deadline=None)
@given(critique, st.lists(quote, max_size=3), st.lists(quote, max_size=3))
def test_round_trip_property(crit, good, poor):
    fb = Feedback(crit, tuple(good), tuple(poor))
    parsed = parse_target(target_text(fb))
    assert parsed.ok and not parsed.repaired, parsed.error
    assert (parsed.feedback.critique, parsed.feedback.good_spans, parsed.feedback.poor_spans) == (
        fb.critique,
        fb.good_spans,
        fb.poor_spans,
    )


def test_code_critique_with_unbalanced_brace_still_parses():
    fb = Feedback("The dict literal { is never closed.", ("def f():",), ("x = {",))
    assert parse_feedback(target_text(fb)).ok  # the core parser retries from later braces
    parsed = parse_target(target_text(fb))  # ... the reward model's own format is not
    assert parsed.ok and parsed.feedback.critique == fb.critique and parsed.feedback.poor_spans == ("x = {",)
    loose = parse_target('Some chatter first.\n```json\n{"good_spans": ["a"], "poor_spans": []}\n```')
    assert loose.ok and loose.feedback.good_spans == ("a",)  # non-canonical output falls back to parse_feedback


# --------------------------------------------------------------------------------------------------
# Label masks
# --------------------------------------------------------------------------------------------------


def test_labels_mask_exactly_the_input(rm_tokenizer):
    for record in RECORDS:
        fb = record_feedback(record)
        enc = encode_example(rm_tokenizer, record["prompt"], record["response"], fb, max_length=512, instruction=INSTRUCTION)
        input_ids = encode_input(rm_tokenizer, record["prompt"], record["response"], instruction=INSTRUCTION)
        target_ids = rm_tokenizer(target_text(fb), add_special_tokens=False)["input_ids"] + [rm_tokenizer.eos_token_id]
        assert enc.n_input == len(input_ids)
        assert enc.input_ids == input_ids + target_ids
        assert enc.labels == [IGNORE_INDEX] * len(input_ids) + target_ids
        # The input ids are exactly what inference feeds the model (batched generation tokenizes the text).
        rm_input = fit_rm_input(rm_tokenizer, record["prompt"], record["response"], instruction=INSTRUCTION)
        assert rm_tokenizer(rm_input.text, add_special_tokens=rm_input.add_special_tokens)["input_ids"] == input_ids


def test_collate_masks_each_sample_by_its_own_tokens(rm_tokenizer):
    # The paper's code built every sample's mask from sample 0; here each row must carry its own.
    encoded = [
        encode_example(rm_tokenizer, r["prompt"], r["response"], record_feedback(r), max_length=512, instruction=INSTRUCTION)
        for r in RECORDS
    ]
    batch = collate([e.as_dict() for e in encoded], pad_token_id=rm_tokenizer.pad_token_id)
    width = max(len(e.input_ids) for e in encoded)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (len(encoded), width)
    for row, e in enumerate(encoded):
        n = len(e.input_ids)
        assert batch["input_ids"][row, :n].tolist() == e.input_ids
        assert batch["labels"][row, :n].tolist() == e.labels
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (width - n)
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all()
        assert (batch["input_ids"][row, n:] == rm_tokenizer.pad_token_id).all()
        supervised = (batch["labels"][row] != IGNORE_INDEX).nonzero().flatten().tolist()
        assert supervised == list(range(e.n_input, n))
    assert len({e.n_input for e in encoded}) > 1  # the rows really differ


def test_loss_only_counts_target_tokens(rm_tokenizer):
    """Changing the logits at input positions must not change the loss (the mask is what the model sees)."""
    model = build_tiny_llama(rm_tokenizer, hidden_size=32, num_layers=1, num_heads=2)
    r = RECORDS[0]
    enc = encode_example(rm_tokenizer, r["prompt"], r["response"], record_feedback(r), max_length=512, instruction=INSTRUCTION)
    batch = collate([enc.as_dict()], rm_tokenizer.pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"]).logits
        loss = model(**batch).loss
        shifted = logits[0, :-1]
        targets = batch["labels"][0, 1:]
        keep = targets != IGNORE_INDEX
        manual = torch.nn.functional.cross_entropy(shifted[keep], targets[keep])
    torch.testing.assert_close(loss, manual)
    assert int(keep.sum()) == len(enc.input_ids) - enc.n_input


# --------------------------------------------------------------------------------------------------
# Formats
# --------------------------------------------------------------------------------------------------


def test_plain_template_is_documented_form(rm_tokenizer):
    rm_input = build_rm_input(rm_tokenizer, "P?", "R.", instruction="Do it.")
    assert rm_input.add_special_tokens is True
    assert rm_input.text == PLAIN_TEMPLATE.format(instruction="Do it.", prompt="P?", response="R.")
    assert rm_input.text == "Do it.\n\n### Prompt\nP?\n\n### Response\nR.\n\n### Critique\n"


def test_chat_template_used_when_present_without_double_bos(chat_tokenizer):
    rm_input = build_rm_input(chat_tokenizer, "P?", "R.", instruction="Do it.")
    assert rm_input.add_special_tokens is False
    assert rm_input.text.startswith("<s><|user|>Do it.") and rm_input.text.endswith("<|assistant|>")
    ids = encode_input(chat_tokenizer, "P?", "R.", instruction="Do it.")
    assert ids.count(chat_tokenizer.bos_token_id) == 1
    plain = build_rm_input(chat_tokenizer, "P?", "R.", instruction="Do it.", prompt_format="plain")
    assert plain.text.startswith("Do it.\n\n### Prompt")


def test_bad_formats_and_inputs_are_clear_errors(rm_tokenizer):
    with pytest.raises(ValueError, match="no chat_template"):
        build_rm_input(rm_tokenizer, "p", "r", prompt_format="chat")
    with pytest.raises(ValueError, match="prompt_format must be"):
        build_rm_input(rm_tokenizer, "p", "r", prompt_format="xml")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be strings"):
        build_rm_input(rm_tokenizer, "p", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be a list"):
        record_feedback({"id": "x", "critique": "c", "good_spans": "oops", "poor_spans": []})


# --------------------------------------------------------------------------------------------------
# Length
# --------------------------------------------------------------------------------------------------


def test_long_prompt_is_shortened_in_the_middle_and_response_kept(rm_tokenizer):
    r = RECORDS[0]
    long_prompt = "Summarize: " + " ".join(["Alex moved to Berlin for a job."] * 40) + " THE END"
    fb = record_feedback(r)
    full = encode_example(rm_tokenizer, long_prompt, r["response"], fb, max_length=10_000, instruction=INSTRUCTION)
    enc = encode_example(rm_tokenizer, long_prompt, r["response"], fb, max_length=160, instruction=INSTRUCTION)
    assert len(full.input_ids) > 160 and enc is not None and len(enc.input_ids) <= 160
    text = rm_tokenizer.decode(enc.input_ids[: enc.n_input], skip_special_tokens=True)
    assert TRUNCATION_MARK.strip() in text
    assert "Summarize:" in text and "THE END" in text  # head and tail of the prompt survive
    assert "### Response\n" + r["response"] + "\n\n### Critique\n" in text  # the response is whole
    assert enc.labels[enc.n_input :] == full.labels[full.n_input :]  # and the target is untouched


def test_example_that_cannot_fit_is_dropped_not_clipped(rm_tokenizer):
    r = RECORDS[0]
    assert encode_example(rm_tokenizer, r["prompt"], r["response"] * 30, record_feedback(r), max_length=64) is None


def test_a_persons_exact_marks_decide_which_occurrence_the_training_quote_labels():
    response = "Alex moved to Oslo for a job. Oslo is cold."
    second = response.rindex("Oslo")
    record = {"id": "a", "prompt": "p", "response": response, "critique": "The second Oslo is wrong.",
              "good_spans": [], "poor_spans": ["Oslo"],
              "span_offsets": [{"start": second, "end": second + 4, "label": "poor", "text": "Oslo"}]}
    feedback = record_feedback(record)
    assert feedback.poor_spans == ("Oslo is",)  # widened by one word until it occurs once
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", response)]
    labels = feedback_token_labels(feedback, response, words).labels
    assert labels == [0, 0, 0, 0, 0, 0, 0, -1, -1, 0]  # the first Oslo (word 3) is not labelled
    # without offsets, or when every occurrence was marked alike, the quotes stay as written
    assert record_feedback({**record, "span_offsets": None}).poor_spans == ("Oslo",)
    both = [{"start": response.index("Oslo"), "end": response.index("Oslo") + 4, "label": "poor"},
            {"start": second, "end": second + 4, "label": "poor"}]
    assert record_feedback({**record, "span_offsets": both}).poor_spans == ("Oslo",)
    assert [(s.start, s.end, s.label) for s in record_spans(record)] == [(second, second + 4, -1)]
    with pytest.raises(ValueError, match="says 'Osl0'"):
        record_spans({**record, "span_offsets": [{"start": second, "end": second + 4, "label": "poor", "text": "Osl0"}]})


def test_a_widened_quote_avoids_running_into_another_mark():
    response = "Alex moved to Oslo for a job. Oslo is cold."
    first = response.index("Oslo")
    job = response.index("for a job")
    record = {"id": "a", "prompt": "p", "response": response, "critique": "c", "good_spans": [], "poor_spans": [],
              "span_offsets": [{"start": first, "end": first + 4, "label": "poor"},
                               {"start": job, "end": job + 9, "label": "good"}]}
    feedback = record_feedback(record)
    # "Oslo for" would be unique too, but "for" is marked good: the word before is taken instead
    assert feedback.poor_spans == ("to Oslo",) and feedback.good_spans == ("for a job",)
