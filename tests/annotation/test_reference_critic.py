"""The reference-summary critic (registry name ``reference``): supported n-grams good, unsupported content poor."""

from __future__ import annotations

import pytest
from tests.annotation.annotation_test_utils import read_jsonl, write_jsonl

from annotation.cli import main
from annotation.critics import ReferenceSummaryCritic
from text2grad.core.spans import locate_spans

REFERENCE = "Taylor moved to Denver and wants a new job, but the partner worries about money."


def test_reference_critic_marks_supported_ngrams_good_and_unsupported_content_poor():
    critic = ReferenceSummaryCritic({"post": REFERENCE})
    response = "Taylor moved to Kyoto and wants a new job."
    (fb,) = critic.feedback(["post"], [response])
    assert fb.ok
    assert fb.good_spans == ("Taylor moved to", "and wants a new job")
    assert fb.poor_spans == ("Kyoto",)
    assert "partner" in fb.critique and "money" in fb.critique  # omissions are named in the critique
    alignment = locate_spans(response, fb.good_spans, fb.poor_spans)
    assert alignment.n_unmatched == 0  # every quote is an exact substring


def test_reference_critic_groups_adjacent_unsupported_words_and_ignores_stopwords():
    critic = ReferenceSummaryCritic({"p": REFERENCE})
    (fb,) = critic.feedback(["p"], ["The purple elephant said that Taylor's partners worry about money."])
    assert fb.poor_spans == ("purple elephant said", "worry")  # 'worry' != 'worries'; stopwords never flagged
    assert "partners worry" not in fb.good_spans
    assert "about money" in fb.good_spans
    # possessive/plural folding: "Taylor's" and "partners" are supported words (neither good n-grams nor poor)
    assert not any("Taylor" in p or "partners" in p for p in fb.poor_spans)


def test_reference_critic_unknown_prompt_and_bound_records():
    critic = ReferenceSummaryCritic(reference_field="ref")
    (fb,) = critic.feedback(["never seen"], ["text"])
    assert not fb.ok and "no reference" in fb.error
    critic.bind_records([{"prompt": "a  post", "ref": "A cat sat on the mat."}])
    (fb,) = critic.feedback(["a post"], ["A cat sat here."])  # whitespace-normalized prompt lookup
    assert fb.good_spans == ("A cat sat",)
    with pytest.raises(ValueError, match="no 'ref' field"):
        critic.bind_records([{"prompt": "x", "other": 1}])


def test_annotation_run_drives_a_registry_critic_by_name(tmp_path):
    """`--critic reference`: the annotation run builds the critic through the same registry as PPO, bound to
    the input records (each record's own reference), and writes validated spans."""
    rows = [
        {"id": "a", "prompt": "post a", "response": "Taylor moved to Kyoto and wants a new job.", "reference": REFERENCE},
        {"id": "b", "prompt": "post b", "response": "A cat sat on the mat.", "ref_text": "A cat sat on a sofa."},
    ]
    write_jsonl(tmp_path / "in.jsonl", rows[:1])
    rc = main(["--critic", "reference", "--dataset_path", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o.jsonl")])
    assert rc == 0
    (rec,) = read_jsonl(tmp_path / "o.jsonl")
    assert (rec["good_spans"], rec["poor_spans"], rec["source"]) == (["Taylor moved to", "and wants a new job"], ["Kyoto"], "ReferenceSummaryCritic")
    # a record without the field the critic needs is a configuration error before anything runs
    write_jsonl(tmp_path / "in2.jsonl", rows[1:])
    rc = main(["--critic", "reference", "--dataset_path", str(tmp_path / "in2.jsonl"), "--output", str(tmp_path / "o2.jsonl")])
    assert rc == 2 and not (tmp_path / "o2.jsonl").exists()
