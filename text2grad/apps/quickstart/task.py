"""The quickstart's toy task: fact-faithful summaries of generated "Reddit posts".

Each post is written by an author with five **key facts** (name, age, city, job, problem), and mentions a
relative or friend whose name, age, city and job are **distractors** of the same kinds. The wording of
every sentence varies (several templates per sentence, shuffled middle sentences, a second number in some
posts), so a summarizer has to find *which* name/city/age belongs to the author. A good summary states the
five key facts and nothing false::

    Maya (27), a nurse in Oslo, wants to quit their job.

Why token-level credit matters here: a typical bad summary is right everywhere except one token
(``a nurse in Lisbon``). A sequence-level score says only "this was 80 % good"; a span critique says
"``Lisbon`` is wrong", which is exactly the token to move.

This module holds everything task-specific and nothing else:

- `generate_task` / `write_task`: the seeded generator with disjoint train / rl / eval splits, each record
  ``{id, prompt, completion, reference, facts}``. ``completion`` is an *imperfect* summary (omissions,
  distractor facts, invented facts at configurable rates) used for SFT, so the SFT policy leaves room for RL.
- `check_summary`: the fact check of one summary against its facts (pure; the critic and the metric share it).
- `FactCritic`: a `FeedbackSource` that writes a critique plus exact-quote good/poor spans, the record
  format of the LLM annotator.
- `fact_scores` / `fact_accuracy`: the task metric (defined in `fact_scores`).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from text2grad.core.config import config_field
from text2grad.core.critics import feedback_per_pair
from text2grad.core.data import load_records, write_jsonl
from text2grad.core.feedback import Feedback

__all__ = [
    "SLOTS",
    "TaskConfig",
    "generate_task",
    "noisy_summary",
    "render_summary",
    "write_task",
    "corpus_texts",
    "SummaryCheck",
    "check_summary",
    "critique_summary",
    "FactCritic",
    "fact_scores",
    "fact_accuracy",
]

SLOTS: tuple[str, ...] = ("name", "age", "city", "job", "problem")

# Closed vocabularies. No value is a substring of another value or of a template word, so a value found
# in a summary is an unambiguous claim.
NAMES = ["Maya", "Liam", "Nora", "Omar", "Ines", "Theo", "Priya", "Jonas", "Lena", "Diego", "Aisha", "Felix",
         "Hana", "Marco", "Zoe", "Ravi"]
CITIES = ["Oslo", "Lisbon", "Denver", "Kyoto", "Austin", "Berlin", "Dublin", "Madrid", "Toronto", "Seoul",
          "Prague", "Boston", "Vienna", "Lagos"]
JOBS = ["nurse", "teacher", "chef", "plumber", "lawyer", "pilot", "baker", "dentist", "designer", "farmer",
        "librarian", "mechanic"]
AGES = list(range(19, 59))
RELATIONS = ["brother", "sister", "cousin", "best friend", "coworker"]

# problem id -> (canonical summary phrase, ways a post says it)
PROBLEMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "quit": ("wants to quit their job", (
        "I have been thinking about quitting my job.",
        "I am seriously considering handing in my notice.",
        "Lately I just want to leave my job for good.")),
    "roommate": ("is fighting with a roommate", (
        "My roommate and I keep arguing about chores.",
        "I have been having constant fights with my roommate.",
        "Things with my roommate have turned into daily arguments.")),
    "promotion": ("was offered a promotion", (
        "My boss just offered me a promotion.",
        "I got offered a senior position at work.",
        "Yesterday I was offered a promotion but it means longer hours.")),
    "dog": ("wants to adopt a dog", (
        "I really want to adopt a dog from the shelter.",
        "I have been looking at shelter dogs to adopt.",
        "Adopting a dog has been on my mind for months.")),
    "abroad": ("is thinking of moving abroad", (
        "I am thinking about moving abroad.",
        "I got an offer to relocate to another country.",
        "Part of me wants to pack up and move overseas.")),
    "wedding": ("was not invited to a wedding", (
        "My oldest friend did not invite me to her wedding.",
        "I just found out I was left off a wedding guest list.",
        "Everyone got a wedding invitation except me.")),
    "car": ("crashed their car", (
        "I crashed my car last weekend.",
        "I had a car accident on Saturday.",
        "My car got totaled in a crash a few days ago.")),
    "school": ("wants to go back to school", (
        "I want to go back to school and finish my degree.",
        "I have been thinking about returning to university.",
        "Going back to school for a degree keeps coming up in my head.")),
}
PROBLEM_PHRASES = {pid: phrase for pid, (phrase, _) in PROBLEMS.items()}

_INTROS = (
    "Hi all, I'm {name} ({age}).",
    "My name is {name} and I am {age} years old.",
    "{name} here, {age}, long time lurker.",
    "Throwaway account, I'm {name}, {age}.",
)
_WORK = (
    "I work as a {job} in {city}.",
    "I have been a {job} in {city} for {years} years.",
    "I live in {city} and work as a {job}.",
    "I'm a {job} living in {city}.",
)
_OTHER = (
    "My {rel} {d_name} ({d_age}) is a {d_job} in {d_city}.",
    "My {rel} {d_name}, who is {d_age}, works as a {d_job} over in {d_city}.",
    "{d_name}, my {d_age} year old {rel}, moved to {d_city} to be a {d_job}.",
)
_QUESTIONS = ("What should I do?", "Any advice?", "Am I overthinking this?", "How should I handle this?")
PROMPT_SUFFIX = "\nTL;DR:"


@dataclass
class TaskConfig:
    """Sizes and noise rates of the generated task."""

    seed: int = config_field(0, "Seed of the generator (splits, wording, noise).")
    n_train: int = config_field(1200, "Posts in the SFT/annotation split.")
    n_rl: int = config_field(256, "Posts in the RL split (prompts for policy optimization).")
    n_eval: int = config_field(128, "Posts in the eval split.")
    p_omit: float = config_field(0.1, "Per-slot chance the SFT summary omits the fact.")
    p_wrong: float = config_field(0.15, "Per-slot chance the SFT summary states it wrongly.")
    p_distractor: float = config_field(
        0.6,
        "Share of wrong facts that copy the post's distractor (the rest are invented).",
    )


# --------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------


def _other(rng: random.Random, values: Sequence, value) -> Any:
    return rng.choice([v for v in values if v != value])


def _facts(rng: random.Random) -> dict[str, dict[str, Any]]:
    key = {
        "name": rng.choice(NAMES),
        "age": rng.choice(AGES),
        "city": rng.choice(CITIES),
        "job": rng.choice(JOBS),
        "problem": rng.choice(list(PROBLEMS)),
    }
    distractors = {
        "name": _other(rng, NAMES, key["name"]),
        "age": _other(rng, AGES, key["age"]),
        "city": _other(rng, CITIES, key["city"]),
        "job": _other(rng, JOBS, key["job"]),
        "relation": rng.choice(RELATIONS),
    }
    return {"key": key, "distractors": distractors}


def _post(rng: random.Random, facts: Mapping[str, Mapping[str, Any]]) -> str:
    key, d = facts["key"], facts["distractors"]
    values = dict(key, d_name=d["name"], d_age=d["age"], d_city=d["city"], d_job=d["job"], rel=d["relation"],
                  years=rng.randint(2, 9))
    middle = [rng.choice(PROBLEMS[key["problem"]][1]), rng.choice(_OTHER).format(**values)]
    rng.shuffle(middle)
    sentences = [rng.choice(_INTROS).format(**values), rng.choice(_WORK).format(**values), *middle,
                 rng.choice(_QUESTIONS)]
    return " ".join(sentences)


def render_summary(values: Mapping[str, Any], style: int = 0) -> str:
    """A summary from slot values; a value of None omits that fact.

    ``values``: name, age, city, job (str/int or None) and problem (a canonical phrase, or None).
    """
    name, age, city, job, problem = (values.get(s) for s in SLOTS)
    subject = name if name is not None else "The author"
    if age is not None:
        subject += f" ({age})" if style == 0 else f", {age},"
    if job is not None and city is not None:
        detail = f"a {job} in {city}"
    elif job is not None:
        detail = f"a {job}"
    elif city is not None:
        detail = f"from {city}"
    else:
        detail = ""
    if detail:
        subject = f"{subject.rstrip(',')}, {detail},"
    return f"{subject} {problem if problem is not None else 'has a problem'}."


def _noisy_values(rng: random.Random, facts: Mapping[str, Mapping[str, Any]], cfg: TaskConfig) -> dict[str, Any]:
    key, d = facts["key"], facts["distractors"]
    pools = {"name": NAMES, "age": AGES, "city": CITIES, "job": JOBS}
    out: dict[str, Any] = {}
    for slot in SLOTS:
        value = key[slot] if slot != "problem" else PROBLEM_PHRASES[key[slot]]
        u = rng.random()
        if u < cfg.p_omit:
            value = None
        elif u < cfg.p_omit + cfg.p_wrong:
            if slot == "problem":
                value = PROBLEM_PHRASES[_other(rng, list(PROBLEMS), key[slot])]
            elif rng.random() < cfg.p_distractor:
                value = d[slot]
            else:
                value = _other(rng, [v for v in pools[slot] if v != d[slot]], key[slot])
        out[slot] = value
    return out


def noisy_summary(rng: random.Random, facts: Mapping[str, Mapping[str, Any]], cfg: TaskConfig,
                  p_repeat: float = 0.0) -> str:
    """An imperfect summary of a post (leading space included): each slot omitted with ``cfg.p_omit``, stated
    wrongly with ``cfg.p_wrong``; with ``p_repeat`` one of its clauses is repeated (a degenerate policy's loop),
    so a critic-imitating reward model sees repetitions during training."""
    text = render_summary(_noisy_values(rng, facts, cfg), rng.randrange(2))
    if rng.random() < p_repeat:
        clauses = [c for c in text.rstrip(".").split(", ") if c]
        text = text.rstrip(".") + ", " + rng.choice(clauses) + "."
    return " " + text


def generate_task(cfg: TaskConfig) -> dict[str, list[dict[str, Any]]]:
    """Seeded train / rl / eval splits with no post in two splits.

    Record: ``{"id", "prompt", "completion", "reference", "facts": {"key": {...}, "distractors": {...}}}``.
    ``prompt`` is the post followed by ``"\\nTL;DR:"``; ``completion`` (imperfect, for SFT) and ``reference``
    (correct) start with a space so ``prompt + completion`` reads naturally.
    """
    for name in ("p_omit", "p_wrong", "p_distractor"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ValueError(f"TaskConfig.{name} must be in [0, 1], got {getattr(cfg, name)}")
    if cfg.p_omit + cfg.p_wrong > 1.0:
        raise ValueError(f"p_omit + p_wrong must be <= 1, got {cfg.p_omit} + {cfg.p_wrong}")
    rng = random.Random(cfg.seed)
    sizes = {"train": cfg.n_train, "rl": cfg.n_rl, "eval": cfg.n_eval}
    seen: set[str] = set()
    splits: dict[str, list[dict[str, Any]]] = {}
    for split, n in sizes.items():
        records = []
        attempts = 0
        while len(records) < n:
            attempts += 1
            if attempts > 50 * n + 1000:
                raise RuntimeError(f"could not generate {n} distinct posts for split {split!r}")
            facts = _facts(rng)
            post = _post(rng, facts)
            if post in seen:
                continue
            seen.add(post)
            style = rng.randrange(2)
            reference_values = dict(facts["key"], problem=PROBLEM_PHRASES[facts["key"]["problem"]])
            records.append({
                "id": f"{split}-{len(records)}",
                "prompt": post + PROMPT_SUFFIX,
                "completion": " " + render_summary(_noisy_values(rng, facts, cfg), style),
                "reference": " " + render_summary(reference_values, style),
                "facts": facts,
            })
        splits[split] = records
    return splits


def config_fingerprint(obj: Any) -> str:
    """A short stable hash of a config (dataclass or JSON-able), used to key caches."""
    data = asdict(obj) if hasattr(obj, "__dataclass_fields__") else obj
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]


def write_task(cfg: TaskConfig, out_dir: str | Path) -> dict[str, Path]:
    """Write ``train.jsonl``, ``rl.jsonl`` and ``eval.jsonl`` under ``out_dir``; returns their paths."""
    out = Path(out_dir)
    paths = {}
    for split, records in generate_task(cfg).items():
        paths[split] = out / f"{split}.jsonl"
        write_jsonl(paths[split], records)
    return paths


def corpus_texts(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """Texts to train the quickstart tokenizer on: posts, summaries and the critic's wording and JSON."""
    texts = []
    for rec in records:
        texts.append(rec["prompt"] + rec["completion"])
        texts.append(rec["reference"])
        fb = critique_summary(rec["facts"], rec["completion"])
        texts.append(fb.critique + "\n" + json.dumps({"good_spans": list(fb.good_spans), "poor_spans": list(fb.poor_spans)}))
    return texts


# --------------------------------------------------------------------------------------------------
# Fact checking: shared by the critic and the metric
# --------------------------------------------------------------------------------------------------

_WORD_VALUES = {"name": NAMES, "city": CITIES, "job": JOBS}
_NUMBER = re.compile(r"(?<![\w.])\d+(?![\w])")


@dataclass(frozen=True)
class Mention:
    """A fact claim found in a summary: characters ``text[start:end]`` state ``value`` for ``slot``."""

    slot: str
    value: str
    start: int
    end: int
    correct: bool


@dataclass
class SummaryCheck:
    """What a summary says about each slot.

    ``mentions``: every claim found, in text order. ``correct`` / ``wrong``: slots stated correctly, and the
    distinct wrong values claimed, per slot. ``missing``: slots never stated correctly. ``ramble``:
    the character offset where text after the first sentence starts (None if the summary is one sentence).
    """

    mentions: list[Mention]
    correct: list[str]
    wrong: dict[str, list[str]]
    missing: list[str]
    ramble: int | None

    @property
    def n_wrong(self) -> int:
        return sum(len(v) for v in self.wrong.values())


def _word_matches(text: str, value: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(rf"(?<![A-Za-z]){re.escape(value)}(?![A-Za-z])", text)]


def check_summary(facts: Mapping[str, Mapping[str, Any]], text: str) -> SummaryCheck:
    """Find every claim ``text`` makes about the five slots and compare it with ``facts["key"]``.

    A claim is a vocabulary value in the text (a name, city, job, a canonical problem phrase) or any
    whole number (an age). A number other than the author's age counts as a wrong age: no good summary
    contains another number.
    """
    key = facts["key"]
    mentions: list[Mention] = []
    for slot, vocab in _WORD_VALUES.items():
        for value in vocab:
            for s, e in _word_matches(text, value):
                mentions.append(Mention(slot, value, s, e, value == key[slot]))
    for m in _NUMBER.finditer(text):
        mentions.append(Mention("age", m.group(), m.start(), m.end(), m.group() == str(key["age"])))
    for pid, phrase in PROBLEM_PHRASES.items():
        for s, e in _word_matches(text, phrase):
            mentions.append(Mention("problem", phrase, s, e, pid == key["problem"]))
    mentions.sort(key=lambda m: (m.start, m.end))
    correct = [s for s in SLOTS if any(m.slot == s and m.correct for m in mentions)]
    wrong: dict[str, list[str]] = {}
    for m in mentions:
        if not m.correct and m.value not in wrong.setdefault(m.slot, []):
            wrong[m.slot].append(m.value)
    wrong = {k: v for k, v in wrong.items() if v}
    end = text.find(".")
    ramble = None
    if end >= 0 and re.search(r"[A-Za-z0-9]", text[end + 1 :]):
        ramble = end + 1
    return SummaryCheck(mentions, correct, wrong, [s for s in SLOTS if s not in correct], ramble)


_SLOT_WORDS = {"name": "name", "age": "age", "city": "city", "job": "job", "problem": "problem"}


def _fmt_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def critique_summary(facts: Mapping[str, Mapping[str, Any]], response: str) -> Feedback:
    """The critic's feedback for one summary: a short critique and exact-quote spans.

    good spans: each correct claim's text (e.g. ``Oslo``). poor spans: each wrong claim's text, a repeated
    claim together with the word before it (so repetition never pays), and any text after the first
    sentence (a summary is one sentence). Omissions have no text to quote and appear
    only in the critique.
    """
    key, distractors = facts["key"], facts["distractors"]
    check = check_summary(facts, response)
    good: list[str] = []
    poor: list[str] = []
    seen: dict[tuple[str, str], Mention] = {}
    repeated: list[str] = []
    for m in check.mentions:
        quote = response[m.start : m.end]
        first = seen.get((m.slot, m.value))
        if first is not None:
            if check.ramble is not None and m.start >= check.ramble:
                continue  # the whole ramble is quoted below
            prev_word = re.search(r"\S+\s*$", response[: m.start])
            repeat = response[prev_word.start() if prev_word else m.start : m.end].strip()
            if repeat and repeat not in poor:
                poor.append(repeat)
                repeated.append(m.value)
            continue
        seen[(m.slot, m.value)] = m
        target = good if m.correct else poor
        if quote not in target:
            target.append(quote)
    if check.ramble is not None:
        extra = response[check.ramble :].strip()
        if extra and extra not in poor:
            poor.append(extra)
    parts = []
    if check.correct:
        parts.append(f"Correct {_fmt_list([_SLOT_WORDS[s] for s in check.correct])}.")
    for slot, values in check.wrong.items():
        truth = PROBLEM_PHRASES[key["problem"]] if slot == "problem" else str(key[slot])
        for value in values:
            whose = ""
            if slot in distractors and slot != "relation" and str(distractors[slot]) == value:
                whose = f" ({value} is the {distractors['relation']}'s)"
            parts.append(f"Wrong {slot}: the post says {truth}, not {value}{whose}.")
    missing = [s for s in check.missing if s not in check.wrong]
    if missing:
        parts.append(f"Missing {_fmt_list(missing)}.")
    if repeated:
        parts.append(f"Repeats {_fmt_list(repeated)}.")
    if check.ramble is not None:
        parts.append("Text after the summary.")
    return Feedback(critique=" ".join(parts) or "No facts stated.", good_spans=tuple(good), poor_spans=tuple(poor))


# --------------------------------------------------------------------------------------------------
# The critic (a FeedbackSource)
# --------------------------------------------------------------------------------------------------


def _norm_prompt(text: str) -> str:
    return " ".join(text.split())


class FactCritic:
    """A programmatic critic for the toy task (a `text2grad.core.critics.FeedbackSource`).

    It looks up each prompt's facts in the task files it was built from and checks the response with
    `critique_summary`. Prompts are matched after collapsing whitespace; a prompt that merely *contains*
    a known post (e.g. wrapped in a chat template) is matched too. An unknown prompt is a per-sample
    failure (`Feedback.failed`), never an exception.

    Args:
        data_path: one task JSONL file or a list of them (records with ``prompt`` and ``facts``).
        records: records given directly instead of (or as well as) files.
    """

    def __init__(self, data_path: str | Sequence[str] | None = None, records: Sequence[Mapping[str, Any]] | None = None):
        paths = [data_path] if isinstance(data_path, (str, Path)) else list(data_path or [])
        all_records = list(records or [])
        for path in paths:
            all_records.extend(load_records(path, required=("prompt", "facts")))
        if not all_records:
            raise ValueError("FactCritic needs task records: pass data_path='.../eval.jsonl' (or a list) or records=[...]")
        self._facts: dict[str, Mapping[str, Any]] = {}
        self.bind_records(all_records)

    def bind_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Learn the facts of more posts (the policy trainer passes its prompt records here)."""
        for rec in records:
            if "facts" not in rec or "prompt" not in rec:
                continue  # records of another task carry no facts; their prompts stay unknown
            facts = rec["facts"]
            if not isinstance(facts, Mapping) or "key" not in facts or "distractors" not in facts:
                raise ValueError(f"record {rec.get('id')!r}: 'facts' must have 'key' and 'distractors' (a quickstart task file)")
            self._facts[_norm_prompt(rec["prompt"])] = facts
            post = rec["prompt"][: -len(PROMPT_SUFFIX)] if rec["prompt"].endswith(PROMPT_SUFFIX) else rec["prompt"]
            self._facts.setdefault(_norm_prompt(post), facts)

    def facts_for(self, prompt: str) -> Mapping[str, Any] | None:
        norm = _norm_prompt(prompt)
        facts = self._facts.get(norm)
        if facts is None:
            # Longest known post contained in the prompt (a prompt template may wrap the post).
            best = max((k for k in self._facts if k and k in norm), key=len, default=None)
            facts = self._facts.get(best) if best else None
        return facts

    def feedback(self, prompts: Sequence[str], responses: Sequence[str]) -> list[Feedback]:
        return feedback_per_pair(prompts, responses, self._one, error_prefix="fact check failed: ")

    def _one(self, prompt: str, response: str) -> Feedback:
        facts = self.facts_for(prompt)
        if facts is None:
            return Feedback.failed("prompt is not a post of the quickstart task files given to FactCritic")
        return critique_summary(facts, response)


class FactScore(FactCritic):
    """The task's own metric as a sequence score: ``fn(prompts, responses) -> fact_score`` per pair (`fact_scores`).

    A PPO ``scalar_source`` (``text2grad.apps.quickstart.task:FactScore`` with ``scalar_source_kwargs
    {"data_path": ...}``): the oracle scalar baseline, rewarded with exactly what the evaluation measures. A prompt
    of no known post scores ``None`` (counted by the trainer as a failed score), never an invented value.
    """

    def __call__(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float | None]:
        if len(prompts) != len(responses):
            raise ValueError(f"got {len(prompts)} prompts but {len(responses)} responses")
        out: list[float | None] = []
        for prompt, response in zip(prompts, responses):
            facts = self.facts_for(prompt)
            out.append(None if facts is None else fact_scores(facts, response)["fact_score"])
        return out


# --------------------------------------------------------------------------------------------------
# The metric
# --------------------------------------------------------------------------------------------------


def fact_scores(facts: Mapping[str, Mapping[str, Any]], response: str) -> dict[str, float]:
    """The task metric for one summary.

    With K = 5 key facts, C = key facts stated correctly anywhere in the response, W = distinct wrong
    values claimed (a wrong name, city, job, problem phrase, or any number other than the author's age)::

        fact_score  = (C - W) / K          in [-inf, 1]; 1 only for all five facts and nothing false
        fact_recall = C / K
        n_false     = W
        perfect     = 1 if C == K and W == 0 else 0
    """
    check = check_summary(facts, response)
    k = len(SLOTS)
    c, w = len(check.correct), check.n_wrong
    return {"fact_score": (c - w) / k, "fact_recall": c / k, "n_false": float(w), "perfect": float(c == k and w == 0)}


def fact_accuracy(records: Sequence[Mapping[str, Any]], responses: Sequence[str]) -> dict[str, float]:
    """Mean of `fact_scores` over (record, response) pairs (records carry ``facts``)."""
    if len(records) != len(responses):
        raise ValueError(f"got {len(records)} records but {len(responses)} responses")
    if not records:
        raise ValueError("fact_accuracy needs at least one record")
    rows = [fact_scores(r["facts"], resp) for r, resp in zip(records, responses)]
    return {k: sum(row[k] for row in rows) / len(rows) for k in rows[0]}
