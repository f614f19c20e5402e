"""Feedback sources: the registry, the callable wrapper, and the reference-summary critic."""

from __future__ import annotations

import pytest

from policy_optimization.feedback_sources import (
    CallableFeedbackSource,
    ReferenceSummaryCritic,
    build_feedback_source,
    build_score_fn,
    import_object,
)
from text2grad.core.feedback import Feedback, FeedbackSource
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


def test_callable_source_turns_exceptions_into_failed_feedback():
    def fn(prompt, response):
        if response == "boom":
            raise RuntimeError("critic crashed")
        if response == "dict":
            return {"critique": "ok", "good_spans": ["dict"]}
        return Feedback(poor_spans=(response,))

    source = CallableFeedbackSource(fn)
    assert isinstance(source, FeedbackSource)
    out = source.feedback(["p"] * 3, ["boom", "dict", "x"])
    assert not out[0].ok and "critic crashed" in out[0].error
    assert out[1].good_spans == ("dict",) and out[2].poor_spans == ("x",)
    with pytest.raises(TypeError):
        CallableFeedbackSource("not callable")


class Marker:
    """A toy source for the 'module:Class' registry path."""

    def __init__(self, word: str = "cat"):
        self.word = word
        self.bound: list = []

    def bind_records(self, records):
        self.bound = list(records)

    def feedback(self, prompts, responses):
        return [Feedback(good_spans=(self.word,)) for _ in responses]


def scorer(prompts, responses):
    return [float(len(r)) for r in responses]


def test_registry_builds_sources_by_name():
    records = [{"prompt": "p1", "reference": "A cat.", "test": "def test_x(): pass"}]
    source = build_feedback_source("reference", {"min_ngram": 1}, records=records)
    assert isinstance(source, ReferenceSummaryCritic) and source.reference_for("p1") == "A cat."
    custom = build_feedback_source(f"{__name__}:Marker", {"word": "dog"}, records=records)
    assert custom.word == "dog" and custom.bound == records
    wrapped = build_feedback_source(f"{__name__}:scorer_feedback")
    assert isinstance(wrapped, CallableFeedbackSource)
    with pytest.raises(ValueError, match="unknown feedback_source"):
        build_feedback_source("gpt5")
    with pytest.raises(ValueError, match="has no attribute"):
        build_feedback_source(f"{__name__}:Missing")
    with pytest.raises(ValueError, match="cannot import module"):
        build_feedback_source("no_such_package.mod:Thing")
    with pytest.raises(ValueError, match="needs feedback_source_kwargs.path"):
        build_feedback_source("reward_model", {})
    fn = build_score_fn(f"{__name__}:scorer")
    assert fn(["p"], ["abc"]) == [3.0]
    with pytest.raises(ValueError, match="expected 'package.module:Name'"):
        import_object("nocolon")


def scorer_feedback(prompt, response):
    return Feedback(good_spans=(response[:3],))


def test_code_tests_source_reads_tests_from_records():
    records = [
        {"prompt": "Write add(a, b).", "test": "from solution import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
    ]
    source = build_feedback_source("code_tests", {"timeout_s": 20}, records=records)
    good, bad = source.feedback(
        ["Write add(a, b).", "Write add(a, b)."],
        ["def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n"],
    )
    assert good.ok and bad.ok, (good.error, bad.error)
    assert good.good_spans and not good.poor_spans
    assert bad.poor_spans and any("a - b" in s for s in bad.poor_spans)
    with pytest.raises(ValueError, match="no 'tests' field"):
        build_feedback_source("code_tests", {"tests_field": "tests"}, records=records)
