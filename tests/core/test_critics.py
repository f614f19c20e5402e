"""The one home of critics: the protocol, the spec loader, the registry, the callable wrapper, extract_code."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from annotation.code_critic import CodeTestCritic
from annotation.critics import ReferenceSummaryCritic
from annotation.llm import LLMCritic
from reward_model.ensemble import RewardModelEnsemble
from reward_model.inference import GenerativeRewardModel
from text2grad.core.critics import (
    CRITICS,
    lazy_exports,
    CallableFeedbackSource,
    FeedbackSource,
    build_critic,
    extract_code,
    feedback_per_pair,
    load_object,
)
from text2grad.core.ensemble import EnsembleCritic
from text2grad.core.feedback import Feedback

REPO = Path(__file__).resolve().parents[2]


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
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        source.feedback(["a", "b"], ["x"])


def test_feedback_per_pair_names_the_failure_and_keeps_the_order():
    def one(prompt, response):
        if response == "bad":
            raise KeyError("missing fact")
        return Feedback(good_spans=(response,))

    out = feedback_per_pair(["p1", "p2", "p3"], ["a", "bad", "c"], one, error_prefix="fact check failed: ")
    assert [fb.good_spans for fb in out] == [("a",), (), ("c",)]
    assert out[1].error == "fact check failed: KeyError: 'missing fact'"


def test_a_missing_dependency_of_a_critic_module_stays_an_import_error(monkeypatch):
    """So the CLI can say which package to install (the LLM critic needs openai)."""
    monkeypatch.setitem(sys.modules, "openai", None)
    monkeypatch.delitem(sys.modules, "annotation.llm", raising=False)
    with pytest.raises(ImportError) as caught:
        build_critic("llm")
    assert caught.value.name == "openai"


class Marker:
    """A toy critic for the 'module:Class' path."""

    def __init__(self, word: str = "cat"):
        self.word = word
        self.bound: list = []

    def bind_records(self, records):
        self.bound = list(records)

    def feedback(self, prompts, responses):
        return [Feedback(good_spans=(self.word,)) for _ in responses]


class NotACritic:
    def __init__(self) -> None:
        self.value = 1


def scorer_feedback(prompt, response):
    return Feedback(good_spans=(response[:3],))


def test_load_object_reads_dotted_attributes_and_explains_failures():
    assert load_object("text2grad.core.critics:CallableFeedbackSource.feedback") is CallableFeedbackSource.feedback
    with pytest.raises(ValueError, match="expected 'package.module:Name'"):
        load_object("nocolon")
    with pytest.raises(ValueError, match="cannot import module"):
        load_object("no_such_package.mod:Thing")
    with pytest.raises(ValueError, match="has no attribute 'Missing'"):
        load_object(f"{__name__}:Missing")


def test_lazy_exports_load_a_name_from_its_module_and_refuse_unknown_names():
    getattr_ = lazy_exports("mypackage", {"dumps": "json", "scorer_feedback": __name__})
    assert getattr_("dumps") is json.dumps and getattr_("scorer_feedback") is scorer_feedback
    with pytest.raises(AttributeError, match="module 'mypackage' has no attribute 'loads'"):
        getattr_("loads")  # json has it, but the package does not export it


def test_every_registered_name_resolves_to_the_critic_that_implements_it():
    resolved = {name: load_object(spec) for name, spec in CRITICS.items()}
    assert resolved == {
        "reward_model": GenerativeRewardModel.from_critic_kwargs,
        "llm": LLMCritic,
        "code_tests": CodeTestCritic,
        "reference": ReferenceSummaryCritic,
        "ensemble": EnsembleCritic,
        "reward_model_ensemble": RewardModelEnsemble.from_critic_kwargs,
    }


def test_registry_builds_critics_by_name_and_by_spec():
    records = [{"prompt": "p1", "reference": "A cat.", "test": "def test_x(): pass"}]
    source = build_critic("reference", {"min_ngram": 1}, records=records)
    assert isinstance(source, ReferenceSummaryCritic) and source.reference_for("p1") == "A cat."
    custom = build_critic(f"{__name__}:Marker", {"word": "dog"}, records=records)
    assert custom.word == "dog" and custom.bound == records
    wrapped = build_critic(f"{__name__}:scorer_feedback")
    assert isinstance(wrapped, CallableFeedbackSource)
    assert wrapped.feedback(["p"], ["abcdef"])[0].good_spans == ("abc",)
    with pytest.raises(ValueError, match="unknown critic 'gpt5'"):
        build_critic("gpt5")
    with pytest.raises(ValueError, match="has no attribute"):
        build_critic(f"{__name__}:Missing")
    with pytest.raises(ValueError, match="cannot import module"):
        build_critic("no_such_package.mod:Thing")
    with pytest.raises(ValueError, match="needs the kwarg path"):
        build_critic("reward_model", {})
    with pytest.raises(ValueError, match="cannot build critic 'reference'"):
        build_critic("reference", {"no_such_option": 1})
    with pytest.raises(ValueError, match="only apply to classes"):
        build_critic(f"{__name__}:scorer_feedback", {"x": 1})
    with pytest.raises(TypeError, match="not a FeedbackSource"):
        build_critic(f"{__name__}:NotACritic")


def test_code_tests_critic_reads_tests_from_records():
    records = [
        {"prompt": "Write add(a, b).", "test": "from solution import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"},
    ]
    source = build_critic("code_tests", {"timeout_s": 20}, records=records)
    good, bad = source.feedback(
        ["Write add(a, b).", "Write add(a, b)."],
        ["def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n"],
    )
    assert good.ok and bad.ok, (good.error, bad.error)
    assert good.good_spans and not good.poor_spans
    assert bad.poor_spans and any("a - b" in s for s in bad.poor_spans)
    with pytest.raises(ValueError, match="no 'tests' field"):
        build_critic("code_tests", {"tests_field": "tests"}, records=records)


# The behaviours both callers rely on: the unit-test critic (an exact substring of the response, so quoted
# lines are exact quotes) and the code evaluation (prose around fences, cut-off generations, other languages).
EXTRACT_CASES = [
    ("Here:\n```python\ndef f():\n    return 1\n```\nDone", "def f():\n    return 1\n"),
    ("```\nx = 1\n```", "x = 1\n"),
    ("```js\nlet a\n```\n```py\nb = 2\n```", "b = 2\n"),  # the first Python block wins over an earlier one
    ("```js\nlet a\n```\nno python here", "let a\n"),  # else the first block of any language
    ("```python\ndef g():\n    pass", "def g():\n    pass"),  # a fence cut off by the token limit
    ("Sure:\n```py\ndef f():\n    return 1\n", "def f():\n    return 1\n"),
    ("def h():\n    return 2\n", "def h():\n    return 2\n"),  # no fence: the whole text
    ("Answer: ```python\nx = 1```", "x = 1"),  # fence opened after prose, closed at the end of a code line
    ("```python\ns = '```'\nt = 2\n```\n", "s = '```'\nt = 2\n"),  # ``` inside a string closes nothing
    ("  ```python\n  x = 1\n  ```\n", "  x = 1\n"),  # an indented fence (inside a list item)
    ("", ""),
]


@pytest.mark.parametrize("response, code", EXTRACT_CASES)
def test_extract_code(response, code):
    got = extract_code(response)
    assert got == code
    assert got in response  # always an exact substring


def test_one_extract_code_and_one_loader_in_the_repository():
    """No second definition of the shared helpers anywhere outside the core (copies of them once drifted apart)."""
    shared = {"extract_code", "load_object", "import_object", "load_critic_class", "build_critic"}
    twins = []
    for pkg in ("text2grad", "annotation", "reward_model", "policy_optimization"):
        for path in (REPO / pkg).rglob("*.py"):
            if path == REPO / "text2grad" / "core" / "critics.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in shared:
                    twins.append(f"{path.relative_to(REPO)}:{node.name}")
    assert twins == []
