"""Feedback sources for the policy phase, behind one protocol, chosen by name in the PPO config.

Every source implements `text2grad.core.feedback.FeedbackSource`: ``feedback(prompts, responses) ->
list[Feedback]``, one per pair, failures as ``Feedback.failed`` (never raising). `build_feedback_source`
maps a config name to one (imports are lazy, so an unused source's dependencies are never loaded):

=====================  =====================================================================================
``reward_model``       ``reward_model.inference.GenerativeRewardModel.from_pretrained(path, **kwargs)``; pass
                       ``{"path": <trained reward model dir>}`` (or ``model_name_or_path``).
``llm``                ``annotation.llm.LLMCritic(**kwargs)`` (OpenAI-compatible; key from the environment).
``code_tests``         ``annotation.critics.CodeTestCritic``: unit tests in the sandbox. The tests come from each
                       record's ``tests_field`` (default ``"test"``), keyed by the prompt the critic sees.
``reference``          `ReferenceSummaryCritic`: span feedback from agreement with a reference summary, taken
                       from each record's ``reference_field`` (default ``"reference"``).
``pkg.module:Name``    any class (instantiated with the kwargs) with a ``feedback`` method, or a function
                       ``fn(prompt, response) -> Feedback | dict`` (wrapped in `CallableFeedbackSource`).
=====================  =====================================================================================

Sources that need per-prompt data (tests, references) get the training records through
``bind_records(records)`` when they have that method; each record's ``"prompt"`` is the exact string the
source will be asked about.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import Any, Callable, Mapping, Sequence

from text2grad.core.feedback import Feedback, FeedbackSource

__all__ = [
    "CallableFeedbackSource",
    "ReferenceSummaryCritic",
    "build_feedback_source",
    "build_score_fn",
    "import_object",
    "SOURCES",
]

SOURCES = ("reward_model", "llm", "code_tests", "reference")


def import_object(spec: str) -> Any:
    """``"package.module:attr"`` -> the attribute; a clear error if the module or attribute is missing."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'package.module:Name', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} for {spec!r}: {exc}") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {module_name!r} has no attribute {attr!r} (from {spec!r})")
        obj = getattr(obj, part)
    return obj


class CallableFeedbackSource:
    """Wrap ``fn(prompt, response) -> Feedback | dict`` as a `FeedbackSource`.

    A dict is read with `Feedback.from_dict` (``critique``, ``good_spans``, ``poor_spans``). An exception
    becomes ``Feedback.failed`` for that one sample, so the batch goes on.
    """

    def __init__(self, fn: Callable[[str, str], Feedback | Mapping[str, Any]]) -> None:
        if not callable(fn):
            raise TypeError(f"CallableFeedbackSource needs a callable, got {type(fn).__name__}")
        self.fn = fn

    def feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Feedback]:
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
        out = []
        for prompt, response in zip(prompts, responses):
            try:
                result = self.fn(prompt, response)
                out.append(result if isinstance(result, Feedback) else Feedback.from_dict(dict(result)))
            except Exception as exc:  # one bad sample must not cost the batch
                out.append(Feedback.failed(f"{type(exc).__name__}: {exc}"))
        return out


# --------------------------------------------------------------------------------------------------
# A programmatic summarization critic
# --------------------------------------------------------------------------------------------------

_WORD = re.compile(r"\w+(?:['\u2019]\w+)*")
_STOPWORDS = frozenset(
    """a an the and or but nor so yet of to in on at by for with from into onto about as than then that this these
    those there here it its it's is are was were be been being am do does did done have has had having i me my mine
    we us our ours you your yours he him his she her hers they them their theirs who whom whose which what when
    where why how not no yes if else also just very too can could will would shall should may might must up down
    out over under again further once all any both each few more most other some such only own same s t don now
    tl dr tldr""".split()
)


def _norm_word(word: str) -> str:
    """Case-folded word with a possessive or plural ending removed, so 'Dogs' supports 'dog'."""
    w = word.casefold().replace("\u2019", "'")
    if w.endswith("'s"):
        w = w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    return w


def _words(text: str) -> list[tuple[str, int, int]]:
    """(normalized word, start, end) for every word of ``text``."""
    return [(_norm_word(m.group()), m.start(), m.end()) for m in _WORD.finditer(text)]


def _is_content(norm: str) -> bool:
    return norm not in _STOPWORDS and (len(norm) > 1 or norm.isdigit())


class ReferenceSummaryCritic:
    """Span feedback for a summary from its agreement with a reference summary (no model, no network).

    - good spans: maximal runs of at least ``min_ngram`` consecutive response words that occur, in order,
      in the reference and contain a content word (words compared case-folded, possessive/plural 's' removed);
    - poor spans: runs of adjacent content words that the reference never uses (unsupported content, e.g. a
      wrong city or an invented detail);
    - the critique names the supported phrases, the unsupported ones, and up to ``max_missing`` reference
      content words the summary leaves out (omissions cannot be quoted, so they live only in the critique).

    References are given directly (``references={prompt: reference}``) or bound from the training records
    (``bind_records``; field ``reference_field``). A prompt without a reference gets ``Feedback.failed``.
    """

    def __init__(
        self,
        references: Mapping[str, str] | None = None,
        *,
        reference_field: str = "reference",
        min_ngram: int = 2,
        max_missing: int = 5,
    ) -> None:
        if min_ngram < 1:
            raise ValueError(f"min_ngram must be >= 1, got {min_ngram}")
        self.reference_field = reference_field
        self.min_ngram = min_ngram
        self.max_missing = max_missing
        self._references: dict[str, str] = {}
        for prompt, ref in (references or {}).items():
            self._add(prompt, ref)

    def _add(self, prompt: str, reference: str) -> None:
        self._references[prompt] = reference
        self._references.setdefault(" ".join(prompt.split()), reference)

    def bind_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Take each record's ``reference_field`` as the reference for its ``prompt``."""
        for i, rec in enumerate(records):
            if self.reference_field not in rec or rec[self.reference_field] is None:
                raise ValueError(
                    f"record {i} has no {self.reference_field!r} field for the reference critic; it has {sorted(rec)}. "
                    "Set feedback_source_kwargs.reference_field (or map a field with field_map)."
                )
            self._add(str(rec["prompt"]), str(rec[self.reference_field]))

    def reference_for(self, prompt: str) -> str | None:
        return self._references.get(prompt, self._references.get(" ".join(prompt.split())))

    def feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Feedback]:
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
        out = []
        for prompt, response in zip(prompts, responses):
            reference = self.reference_for(prompt)
            if reference is None:
                out.append(Feedback.failed("no reference summary is known for this prompt"))
                continue
            try:
                out.append(self.critique(response, reference))
            except Exception as exc:  # a FeedbackSource reports failures per sample
                out.append(Feedback.failed(f"reference critic error: {type(exc).__name__}: {exc}"))
        return out

    def critique(self, response: str, reference: str) -> Feedback:
        """Feedback on ``response`` against ``reference``."""
        resp = _words(response)
        ref = [w for w, _, _ in _words(reference)]
        ref_vocab = set(ref)
        starts: dict[str, list[int]] = {}
        for k, w in enumerate(ref):
            starts.setdefault(w, []).append(k)

        def longest_match(i: int) -> int:
            best = 0
            for k in starts.get(resp[i][0], ()):
                n = 0
                while i + n < len(resp) and k + n < len(ref) and resp[i + n][0] == ref[k + n]:
                    n += 1
                best = max(best, n)
            return best

        good: list[str] = []
        covered = [False] * len(resp)
        i = 0
        while i < len(resp):
            n = longest_match(i)
            if n >= self.min_ngram and any(_is_content(w) for w, _, _ in resp[i : i + n]):
                good.append(response[resp[i][1] : resp[i + n - 1][2]])
                covered[i : i + n] = [True] * n
                i += n
            else:
                i += 1
        poor: list[str] = []
        run: list[int] = []
        for j, (w, _, _) in enumerate(resp + [("", 0, 0)]):
            unsupported = j < len(resp) and not covered[j] and _is_content(w) and w not in ref_vocab
            if unsupported:
                run.append(j)
            elif run:
                poor.append(response[resp[run[0]][1] : resp[run[-1]][2]])
                run = []
        said = {w for w, _, _ in resp}
        missing = list(dict.fromkeys(w for w in ref if _is_content(w) and w not in said))[: self.max_missing]
        good, poor = list(dict.fromkeys(good)), list(dict.fromkeys(poor))
        parts = []
        if good:
            parts.append("The summary agrees with the reference on " + ", ".join(f"'{g}'" for g in good) + ".")
        if poor:
            parts.append("The reference does not support " + ", ".join(f"'{p}'" for p in poor) + ".")
        if missing:
            parts.append("It leaves out " + ", ".join(missing) + ".")
        if not parts:
            parts.append("The summary shares no content with the reference.")
        return Feedback(critique=" ".join(parts), good_spans=tuple(good), poor_spans=tuple(poor))


# --------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------


def _records_field(records: Sequence[Mapping[str, Any]], name: str, what: str) -> dict[str, str]:
    table: dict[str, str] = {}
    for i, rec in enumerate(records):
        if name not in rec or rec[name] is None:
            raise ValueError(
                f"record {i} has no {name!r} field for {what}; it has {sorted(rec)}. "
                f"Pass the right field name in feedback_source_kwargs or map it with field_map."
            )
        table[str(rec["prompt"])] = str(rec[name])
    return table


def _bind(obj: Any, records: Sequence[Mapping[str, Any]] | None) -> Any:
    if records is not None and hasattr(obj, "bind_records"):
        obj.bind_records(records)
    return obj


def build_feedback_source(
    name: str, kwargs: Mapping[str, Any] | None = None, records: Sequence[Mapping[str, Any]] | None = None
) -> FeedbackSource:
    """Build a feedback source from its config name and keyword arguments (table in the module docstring).

    ``records`` are the training records as the source will see them (``"prompt"`` = the string passed to
    ``feedback``); sources that need per-prompt data take it from them.
    """
    kwargs = dict(kwargs or {})
    if name == "reward_model":
        from reward_model.inference import GenerativeRewardModel

        path = kwargs.pop("path", None) or kwargs.pop("model_name_or_path", None)
        if not path:
            raise ValueError("feedback_source 'reward_model' needs feedback_source_kwargs.path (the trained reward model)")
        if "device" not in kwargs and "LOCAL_RANK" in os.environ:
            import torch

            if torch.cuda.is_available():  # one reward model per process, on that process's GPU
                kwargs["device"] = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        source: Any = GenerativeRewardModel.from_pretrained(path, **kwargs)
    elif name == "llm":
        from annotation.llm import LLMCritic

        source = LLMCritic(**kwargs)
    elif name == "code_tests":
        from annotation.critics import CodeTestCritic

        tests_field = kwargs.pop("tests_field", "test")
        if "tests" not in kwargs:
            if records is None:
                raise ValueError("feedback_source 'code_tests' needs unit tests: pass records or feedback_source_kwargs.tests")
            kwargs["tests"] = _records_field(records, tests_field, "the unit-test critic (tests_field)")
        source = CodeTestCritic(**kwargs)
    elif name == "reference":
        source = _bind(ReferenceSummaryCritic(**kwargs), records)
    elif ":" in name:
        obj = import_object(name)
        if isinstance(obj, type):
            source = _bind(obj(**kwargs), records)
        elif callable(obj):
            if kwargs:
                raise ValueError(f"{name!r} is a function; feedback_source_kwargs only apply to classes")
            source = CallableFeedbackSource(obj)
        else:
            raise ValueError(f"{name!r} is neither a class nor a function")
    else:
        raise ValueError(f"unknown feedback_source {name!r}; use one of {list(SOURCES)} or 'package.module:ClassName'")
    if not callable(getattr(source, "feedback", None)):
        raise TypeError(f"feedback source {name!r} has no feedback(prompts, responses) method")
    return source


def build_score_fn(
    spec: str, kwargs: Mapping[str, Any] | None = None, records: Sequence[Mapping[str, Any]] | None = None
) -> Callable[[Sequence[str], Sequence[str]], list[float]]:
    """A task score function ``fn(prompts, responses) -> list[float]`` from ``"package.module:name"``.

    A class is instantiated with ``kwargs`` (and bound to ``records`` if it has ``bind_records``); the
    result (or a plain function) must be callable with (prompts, responses).
    """
    obj = import_object(spec)
    if isinstance(obj, type):
        obj = _bind(obj(**dict(kwargs or {})), records)
    elif kwargs:
        raise ValueError(f"{spec!r} is a function; scalar_source_kwargs only apply to classes")
    if not callable(obj):
        raise TypeError(f"score function {spec!r} is not callable")
    return obj
