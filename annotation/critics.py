"""The critics of the annotation run, behind one record-level interface (`RecordCritic`).

A *critic* writes `Feedback` (critique + exact good/poor quotes); every critic in the repository is
selected by the same names in annotation and PPO (``--critic`` in both) through the one
registry in `text2grad.core.critics`. This module holds:

- `LLMAnnotator`: an LLM writes the critique and the spans from the dataset's prompt template
  (``--critic llm``; its synchronous twin for PPO is `annotation.llm.LLMCritic`, registry name ``llm``).
- `HumanFeedbackGrounder`: a human's feedback sentence is the critique; the LLM only finds the exact spans
  it refers to (``--critic human``, e.g. SLF5K).
- `ReferenceSummaryCritic`: span feedback from agreement with a reference summary (registry name
  ``reference``).
- `FeedbackSourceAdapter`: drives any `FeedbackSource` (a registry name or ``package.module:ClassName``)
  record by record.

The unit-test critic (``code_tests``) lives in `annotation.code_critic`.

A record critic gets the whole mapped record (prompt, response, and feedback or tests) and returns a
`CriticResult`; failures come back as ``Feedback.failed`` (or, for API trouble, as the exceptions of
`annotation.llm`, which the runner turns into failure records or a clean stop).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from annotation.llm import ChatClient, critique_with_llm
from annotation.templates import PromptTemplate
from text2grad.core.critics import feedback_per_pair
from text2grad.core.feedback import Feedback

__all__ = [
    "CriticResult",
    "RecordCritic",
    "LLMAnnotator",
    "HumanFeedbackGrounder",
    "ReferenceSummaryCritic",
    "FeedbackSourceAdapter",
]


@dataclass
class CriticResult:
    """A critic's feedback on one record, plus what the record's ``meta._annotation`` should say about it."""

    feedback: Feedback
    parse_retries: int = 0
    info: dict[str, Any] = field(default_factory=dict)


class RecordCritic(Protocol):
    """What the annotation runner drives: one record in, one `CriticResult` out."""

    source: str  # written to each record's "source" field

    async def annotate(self, record: Mapping[str, Any]) -> CriticResult: ...


# --------------------------------------------------------------------------------------------------
# LLM-based critics
# --------------------------------------------------------------------------------------------------


class LLMAnnotator:
    """The LLM writes critique and spans from the dataset's prompt template."""

    def __init__(self, chat: ChatClient, template: PromptTemplate, max_retries: int) -> None:
        self.chat = chat
        self.template = template
        self.max_retries = max_retries
        self.source = f"llm:{chat.cfg.model}"

    async def annotate(self, record: Mapping[str, Any]) -> CriticResult:
        messages = self.template.messages(record)
        feedback, retries = await critique_with_llm(self.chat, messages, self.max_retries)
        info = {"model": self.chat.cfg.model, "template": self.template.name, "raw": feedback.raw}
        return CriticResult(feedback, retries, info)


class HumanFeedbackGrounder:
    """The record's human feedback becomes the critique; the LLM grounds it in exact spans of the response."""

    def __init__(self, chat: ChatClient, template: PromptTemplate, max_retries: int, feedback_field: str = "feedback") -> None:
        self.chat = chat
        self.template = template
        self.max_retries = max_retries
        self.feedback_field = feedback_field
        self.source = f"human+llm:{chat.cfg.model}"

    async def annotate(self, record: Mapping[str, Any]) -> CriticResult:
        human = str(record.get(self.feedback_field) or "").strip()
        if not human:
            return CriticResult(Feedback.failed(f"record has an empty '{self.feedback_field}' field (no human feedback)"))
        messages = self.template.messages(record)
        grounded, retries = await critique_with_llm(self.chat, messages, self.max_retries)
        info = {"model": self.chat.cfg.model, "template": self.template.name, "raw": grounded.raw}
        if not grounded.ok:
            return CriticResult(grounded, retries, info)
        feedback = Feedback(
            critique=" ".join(human.split()),
            good_spans=grounded.good_spans,
            poor_spans=grounded.poor_spans,
            raw=grounded.raw,
        )
        return CriticResult(feedback, retries, info)


# --------------------------------------------------------------------------------------------------
# A reference summary (no model, no network)
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
                    "Set the critic kwarg reference_field (critic_kwargs, in annotation and PPO alike) "
                    "or map a field with field_map."
                )
            self._add(str(rec["prompt"]), str(rec[self.reference_field]))

    def reference_for(self, prompt: str) -> str | None:
        return self._references.get(prompt, self._references.get(" ".join(prompt.split())))

    def feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Feedback]:
        return feedback_per_pair(prompts, responses, self._one, error_prefix="reference critic error: ")

    def _one(self, prompt: str, response: str) -> Feedback:
        reference = self.reference_for(prompt)
        if reference is None:
            return Feedback.failed("no reference summary is known for this prompt")
        return self.critique(response, reference)

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
# Any FeedbackSource, driven record by record
# --------------------------------------------------------------------------------------------------


class FeedbackSourceAdapter:
    """Drives any `FeedbackSource` record by record (in a worker thread, so the event loop stays free).

    A source that also defines ``annotate_record(record) -> Feedback`` gets the whole mapped record instead
    (for critics that need more than prompt and response).
    """

    def __init__(self, source: Any) -> None:
        self.inner = source
        self.source = type(source).__name__

    async def annotate(self, record: Mapping[str, Any]) -> CriticResult:
        if hasattr(self.inner, "annotate_record"):
            feedback = await asyncio.to_thread(self.inner.annotate_record, dict(record))
        else:
            out = await asyncio.to_thread(self.inner.feedback, [str(record["prompt"])], [str(record["response"])])
            if len(out) != 1:
                return CriticResult(Feedback.failed(f"{self.source}.feedback returned {len(out)} results for 1 input"))
            feedback = out[0]
        if not isinstance(feedback, Feedback):
            return CriticResult(Feedback.failed(f"{self.source} returned {type(feedback).__name__}, not a Feedback"))
        return CriticResult(feedback)
