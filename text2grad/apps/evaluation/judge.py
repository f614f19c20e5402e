"""LLM-as-judge through any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, SGLang, ...).

Two protocols:

- **Pairwise** (`judge_pairwise`): the judge sees an instruction and two outputs labelled A and B and ends
  with ``Verdict: A`` / ``Verdict: B`` / ``Verdict: tie``. Which system is shown as A is drawn per item
  from a RNG seeded by ``(seed, item id)`` and recorded, so position bias averages out and a run is
  reproducible. The candidate's win rate is ``(wins + 0.5 * ties) / n_valid`` over the items whose verdict
  parsed; unparseable verdicts and failed requests are counted and reported, never scored.
- **Single-answer grading** (`judge_single`, MT-Bench style): the judge rates the last assistant answer of a
  conversation from 1 to 10 and ends with ``Rating: [[N]]``; the score is the mean over parsed ratings.

Requests run concurrently (``asyncio`` with a semaphore of ``concurrency``) and are retried with
exponential backoff (honouring ``Retry-After``) on 429, 408/409, 5xx, timeouts and dropped connections;
other errors (400, 401, 404) fail that item at once. The API key is read from the environment variable
named by ``api_key_env`` and is never logged or written anywhere.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Sequence

import openai
from tqdm.auto import tqdm

from text2grad.core.data import render_template

__all__ = [
    "JudgeConfig",
    "ChatResult",
    "PairwiseItem",
    "PairwiseJudgment",
    "SingleItem",
    "SingleGrade",
    "load_prompt",
    "chat_completions",
    "parse_pairwise_verdict",
    "parse_rating",
    "candidate_position",
    "judge_pairwise",
    "win_rate_summary",
    "judge_single",
    "grade_summary",
    "length_controlled_win_rate",
]

logger = logging.getLogger(__name__)

JUDGE_SYSTEM_PROMPT = "You are a careful, impartial expert evaluator. Follow the output format you are given exactly."


@dataclass
class JudgeConfig:
    """How to reach the judge and how hard to push it.

    Attributes:
        model: the judge model name, e.g. "gpt-4o" or the name a vLLM server serves.
        base_url: OpenAI-compatible endpoint (``http://host:8000/v1``); None = the OpenAI API.
        api_key_env: environment variable holding the API key. A local server without auth needs none
            (a placeholder key is sent when ``base_url`` is set and the variable is unset).
        temperature / max_tokens: sampling of the judge (temperature 0 for reproducibility).
        concurrency: requests in flight at once.
        max_retries: retries per request on retryable errors (429, 408, 409, 5xx, timeouts, dropped connections).
        timeout_s: per-request timeout.
        backoff_base_s / backoff_max_s: retry ``k`` waits ``min(max, base * 2**k)`` times a jitter in [0.5, 1],
            or the server's ``Retry-After`` when it sends one (capped at ``backoff_max_s``).
    """

    model: str
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.0
    max_tokens: int = 1024
    concurrency: int = 8
    max_retries: int = 5
    timeout_s: float = 120.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0


@dataclass
class ChatResult:
    """One chat completion: the text, or the error that made it fail after all retries."""

    text: str | None
    error: str | None = None
    attempts: int = 1


def load_prompt(name_or_path: str) -> str:
    """A judge prompt template: a file path, or the name of a packaged template
    (``summarization_pairwise``, ``alpaca_eval_pairwise``, ``mt_bench_single``)."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    packaged = resources.files("text2grad.apps.evaluation.prompts")
    candidate = packaged / (name_or_path if name_or_path.endswith(".txt") else f"{name_or_path}.txt")
    if candidate.is_file():
        return candidate.read_text(encoding="utf-8")
    names = sorted(p.name[:-4] for p in packaged.iterdir() if p.name.endswith(".txt"))
    raise FileNotFoundError(f"judge prompt {name_or_path!r} is neither a file nor a packaged template; packaged: {names}")


# ------------------------------------------------------------------------------------------------
# Transport: concurrent chat completions with retries


def _api_key(cfg: JudgeConfig) -> str:
    key = os.environ.get(cfg.api_key_env)
    if key:
        return key
    if cfg.base_url:  # local OpenAI-compatible servers (vLLM, SGLang) usually accept any key
        return "EMPTY"
    raise ValueError(
        f"no API key for the judge: set the environment variable {cfg.api_key_env} (or point --judge_base_url "
        "at an OpenAI-compatible server that needs no key)"
    )


def _retry_delay(cfg: JudgeConfig, attempt: int, exc: Exception, rng: random.Random) -> float:
    response = getattr(exc, "response", None)
    retry_after = response.headers.get("retry-after") if response is not None else None
    if retry_after is not None:
        try:
            return min(cfg.backoff_max_s, max(0.0, float(retry_after)))
        except ValueError:
            pass  # an HTTP date; fall back to exponential backoff
    return min(cfg.backoff_max_s, cfg.backoff_base_s * 2**attempt) * (0.5 + 0.5 * rng.random())


def _is_retryable(exc: Exception) -> bool:
    if isinstance(exc, (openai.APIConnectionError, openai.APITimeoutError, asyncio.TimeoutError)):
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return False


def _describe(exc: Exception) -> str:
    status = getattr(exc, "status_code", None)
    return f"{type(exc).__name__}" + (f" (HTTP {status})" if status else "") + f": {str(exc)[:300]}"


async def _complete_all(cfg: JudgeConfig, conversations: Sequence[list[dict]], progress_bar: bool) -> list[ChatResult]:
    client = openai.AsyncOpenAI(base_url=cfg.base_url, api_key=_api_key(cfg), max_retries=0, timeout=cfg.timeout_s)
    semaphore = asyncio.Semaphore(max(1, cfg.concurrency))
    jitter = random.Random(0)
    bar = None
    if progress_bar:
        bar = tqdm(total=len(conversations), desc=f"judge {cfg.model}", unit="req")

    async def one(messages: list[dict]) -> ChatResult:
        attempt = 0
        while True:
            try:
                async with semaphore:
                    response = await client.chat.completions.create(
                        model=cfg.model, messages=messages, temperature=cfg.temperature, max_tokens=cfg.max_tokens
                    )
                text = response.choices[0].message.content if response.choices else None
                if text is None:
                    return ChatResult(None, "the judge returned no message content", attempt + 1)
                return ChatResult(text, None, attempt + 1)
            except Exception as exc:  # noqa: BLE001 - every failure becomes a recorded, counted error
                if _is_retryable(exc) and attempt < cfg.max_retries:
                    delay = _retry_delay(cfg, attempt, exc, jitter)
                    logger.warning("judge request failed (%s); retry %d/%d in %.1fs", _describe(exc), attempt + 1, cfg.max_retries, delay)
                    attempt += 1
                    await asyncio.sleep(delay)
                    continue
                return ChatResult(None, _describe(exc), attempt + 1)

    async def tracked(messages: list[dict]) -> ChatResult:
        result = await one(messages)
        if bar is not None:
            bar.update(1)
        return result

    try:
        return list(await asyncio.gather(*(tracked(m) for m in conversations)))
    finally:
        if bar is not None:
            bar.close()
        await client.close()


def chat_completions(cfg: JudgeConfig, conversations: Sequence[list[dict]], progress_bar: bool = False) -> list[ChatResult]:
    """Send each message list to the judge, ``cfg.concurrency`` at a time; results in input order, never raising
    for a failed request (its `ChatResult.error` says why). Works inside a running event loop too (Jupyter)."""
    _api_key(cfg)  # fail before starting anything if no key can be found
    coro = _complete_all(cfg, conversations, progress_bar)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


# ------------------------------------------------------------------------------------------------
# Parsing verdicts and ratings

# Decoration judges put around a verdict: markdown emphasis, quotes, brackets.
_DECO = r"[\s*_`\"'\[(]*"
# A verdict letter only counts when it stands alone (end, punctuation or a closing bracket after it): otherwise
# "The verdict is a tie." would read the article "a" as Assistant A.
_LETTER = r"(a|b|c)(?=[\s*_`\"')\]]*(?:$|[.,;:!?)\]]))"
# Tie words are tried before the letter, after an optional article, for the same reason.
_TIE = r"(?:(?:a|an|the)\s+)?(tie|draw|equal)\b"
_VERDICT_LINE = re.compile(
    r"verdict\s*(?:is)?\s*[:：=\-]?" + _DECO
    + r"(?:(?:output|answer|summary|response|assistant|system)\s*)?[\[(]?\s*(?:" + _TIE + "|" + _LETTER + ")",
    re.IGNORECASE | re.MULTILINE,
)
_BRACKETED = re.compile(r"\[\[\s*(a|b|c|tie)\s*\]\]", re.IGNORECASE)
# The whole answer is a verdict: "B.", "Tie", "Assistant A is better".
_BARE = re.compile(
    r"^" + _DECO + r"(?:(?:(?:output|answer|summary|response|assistant)\s+)?(a|b)(?:\s+is\s+better)?|(tie|draw))"
    r"[\s*_`\"'\].)!]*$",
    re.IGNORECASE,
)
# An answer that ends by naming a tie: "Both are equally good: tie".
_TRAILING_TIE = re.compile(r"[:：\-–]" + _DECO + r"(tie|draw)[\s*_`\"'\].)!]*$", re.IGNORECASE)
_RATING = re.compile(r"rating\s*[:：=]?\s*\[\[\s*(\d+(?:\.\d+)?)\s*\]\]", re.IGNORECASE)
_RATING_LOOSE = re.compile(r"(?:\[\[\s*(\d+(?:\.\d+)?)\s*\]\]|rating\s*[:：=]\s*\**\s*(\d+(?:\.\d+)?)\s*(?:/\s*10)?)", re.IGNORECASE)


def _normalize_verdict(token: str) -> Literal["A", "B", "tie"]:
    token = token.lower()
    return "A" if token == "a" else "B" if token == "b" else "tie"  # "c" (MT-Bench's tie), "draw", "equal"


def parse_pairwise_verdict(text: str | None) -> Literal["A", "B", "tie"] | None:
    """The judge's positional verdict, or None when none can be found.

    Accepted, the LAST occurrence winning (judges often restate a verdict they then revise): a line
    ``Verdict: A`` (also ``**Verdict:** Response B``, ``verdict = tie``), MT-Bench's ``[[A]]`` / ``[[B]]`` /
    ``[[C]]`` (C = tie), an answer that is nothing but ``A``, ``B``, ``tie`` or ``Assistant A is better``, or one
    ending in ``: tie``. A letter counts only standing alone, so ``The verdict is a tie.`` is a tie, not A.
    """
    if not text:
        return None
    matches = list(_VERDICT_LINE.finditer(text)) or list(_BRACKETED.finditer(text))
    if not matches:
        matches = [m for m in (_BARE.match(text.strip()), _TRAILING_TIE.search(text.strip())) if m]
    if not matches:
        return None
    return _normalize_verdict(next(g for g in matches[-1].groups() if g))


def parse_rating(text: str | None, low: float = 1.0, high: float = 10.0) -> float | None:
    """The judge's 1-10 rating (``Rating: [[7]]``; also ``[[7]]`` or ``Rating: 7/10``), or None if absent or out of range."""
    if not text:
        return None
    matches = list(_RATING.finditer(text)) or list(_RATING_LOOSE.finditer(text))
    if not matches:
        return None
    value = float(next(g for g in matches[-1].groups() if g is not None))
    return value if low <= value <= high else None


# ------------------------------------------------------------------------------------------------
# Pairwise judging


@dataclass(frozen=True)
class PairwiseItem:
    """One comparison: the candidate system's output against the baseline's, for the same instruction."""

    id: str
    instruction: str
    candidate: str
    baseline: str


@dataclass
class PairwiseJudgment:
    """The judge's decision on one item.

    Attributes:
        candidate_position: where the candidate was shown ("A" or "B").
        verdict: the parsed positional verdict ("A", "B", "tie") or None if unparseable/failed.
        outcome: the candidate's result ("win", "loss", "tie") or None.
        judge_output: the judge's full answer (None if the request failed).
        error: why the request failed (after retries), else None.
    """

    id: str
    candidate_position: Literal["A", "B"]
    verdict: Literal["A", "B", "tie"] | None
    outcome: Literal["win", "loss", "tie"] | None
    judge_output: str | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def candidate_position(item_id: str, seed: int) -> Literal["A", "B"]:
    """Where the candidate is shown for this item: a fair coin seeded by ``(seed, item_id)``, so the order
    does not depend on the order or number of items and a rerun shows the judge the same prompts."""
    return "A" if random.Random(f"{seed}:{item_id}").random() < 0.5 else "B"


def judge_pairwise(
    items: Sequence[PairwiseItem],
    cfg: JudgeConfig,
    template: str,
    seed: int = 0,
    progress_bar: bool = True,
    swap: bool = False,
) -> list[PairwiseJudgment]:
    """Ask the judge to compare candidate and baseline on every item (template placeholders:
    ``{instruction}``, ``{output_a}``, ``{output_b}``); one judgment per item, in order.

    ``swap``: judge every item in both orders instead of one drawn order: two judgments per item (the candidate
    shown as A, then as B, both with the item's id), so each item's position bias cancels in the win rate and
    `win_rate_summary`'s first/second-position rates compare the same items."""
    pairs = [(item, pos) for item in items for pos in (("A", "B") if swap else (candidate_position(item.id, seed),))]
    items = [item for item, _ in pairs]
    positions = [pos for _, pos in pairs]
    conversations = []
    for item, pos in zip(items, positions):
        a, b = (item.candidate, item.baseline) if pos == "A" else (item.baseline, item.candidate)
        user = render_template(template, {"instruction": item.instruction, "output_a": a, "output_b": b}, where=item.id)
        conversations.append([{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}])
    results = chat_completions(cfg, conversations, progress_bar=progress_bar)
    judgments = []
    for item, pos, result in zip(items, positions, results):
        verdict = parse_pairwise_verdict(result.text)
        outcome = None if verdict is None else "tie" if verdict == "tie" else "win" if verdict == pos else "loss"
        judgments.append(PairwiseJudgment(item.id, pos, verdict, outcome, result.text, result.error))
    return judgments


def win_rate_summary(judgments: Sequence[PairwiseJudgment]) -> dict[str, Any]:
    """Aggregate pairwise judgments into the candidate's win rate.

    ``win_rate = (wins + 0.5 * ties) / n_valid`` in [0, 1], over judgments whose verdict parsed;
    ``standard_error`` is the standard error of the mean of the per-item scores (1, 0.5, 0).
    ``failed`` counts requests that errored after retries, ``unparseable`` answers with no verdict.
    ``candidate_first_win_rate`` / ``candidate_second_win_rate`` split the win rate by where the
    candidate was shown; a large gap means the judge has a position bias. ``a_preferred_rate`` is the
    fraction of decisive verdicts that chose position A (0.5 = no position preference).
    """
    scores = {"win": 1.0, "tie": 0.5, "loss": 0.0}
    valid = [j for j in judgments if j.outcome is not None]
    values = [scores[j.outcome] for j in valid]
    n = len(values)
    mean = sum(values) / n if n else float("nan")
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else float("nan")

    def rate(position: str) -> float:
        vals = [scores[j.outcome] for j in valid if j.candidate_position == position]
        return sum(vals) / len(vals) if vals else float("nan")

    decisive = [j for j in valid if j.verdict in ("A", "B")]
    return {
        "n_items": len(judgments),
        "n_valid": n,
        "wins": sum(j.outcome == "win" for j in valid),
        "losses": sum(j.outcome == "loss" for j in valid),
        "ties": sum(j.outcome == "tie" for j in valid),
        "unparseable": sum(j.outcome is None and j.error is None for j in judgments),
        "failed": sum(j.error is not None for j in judgments),
        "win_rate": mean,
        "standard_error": se,
        "candidate_first_win_rate": rate("A"),
        "candidate_second_win_rate": rate("B"),
        "a_preferred_rate": sum(j.verdict == "A" for j in decisive) / len(decisive) if decisive else float("nan"),
    }


def length_controlled_win_rate(
    judgments: Sequence[PairwiseJudgment],
    items: Sequence[PairwiseItem],
    indices: Sequence[int] | None = None,
    candidate_name: str = "candidate",
    baseline_name: str = "baseline",
    annotator: str = "text2grad_judge",
) -> tuple[float | None, str]:
    """AlpacaEval 2.0's length-controlled win rate in [0, 1] via the ``alpaca-eval`` package, or ``(None, why)``.

    The package fits its GLM (``length_controlled_v1``) on our judgments; it needs the AlpacaEval 2.0
    instruction index of each item (``indices``, default the item positions, right only when the data is the
    805-instruction AlpacaEval set in its original order) and downloads its regularisation data from the
    Hugging Face hub, so it fails offline with a cold cache. Anything that goes wrong is reported, not hidden:
    the caller then reports the raw win rate and says so.
    """
    try:
        from alpaca_eval.metrics.glm_winrate import get_length_controlled_winrate
    except ImportError:
        return None, "alpaca-eval is not installed (pip install alpaca-eval); the win rate is raw, not length-controlled"
    # alpaca-eval's encoding: preference 1 = output_1 (baseline) wins, 2 = output_2 (candidate) wins, 1.5 = tie
    pref = {"win": 2.0, "loss": 1.0, "tie": 1.5}
    annotations = []
    for k, (item, j) in enumerate(zip(items, judgments)):
        annotations.append(
            {
                "index": int(indices[k]) if indices is not None else k,
                "instruction": item.instruction,
                "output_1": item.baseline,
                "output_2": item.candidate,
                "generator_1": baseline_name,
                "generator_2": candidate_name,
                "annotator": annotator,
                "preference": pref[j.outcome] if j.outcome is not None else None,
            }
        )
    try:
        metrics = get_length_controlled_winrate(annotations, save_weights_dir=None, is_warn_extreme_changes=True)
    except Exception as exc:  # noqa: BLE001 - hub download, GLM fit: any failure means "no LC number"
        return None, f"alpaca-eval could not compute the length-controlled win rate ({type(exc).__name__}: {str(exc)[:200]}); the win rate is raw"
    return float(metrics["length_controlled_winrate"]) / 100.0, "length-controlled win rate computed by alpaca-eval (GLM length_controlled_v1)"


# ------------------------------------------------------------------------------------------------
# Single-answer grading (MT-Bench style)


@dataclass(frozen=True)
class SingleItem:
    """One answer to grade: the conversation (alternating user/assistant messages, ending with the assistant
    answer to grade) and an optional reference answer for the last question."""

    id: str
    messages: tuple[dict, ...]
    reference: str | None = None
    category: str | None = None
    turn: int = 1


@dataclass
class SingleGrade:
    id: str
    turn: int
    category: str | None
    score: float | None
    judge_output: str | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def render_conversation(messages: Sequence[dict]) -> str:
    """A plain transcript for the judge: ``### User:`` / ``### Assistant:`` blocks."""
    names = {"user": "User", "assistant": "Assistant", "system": "System"}
    return "\n\n".join(f"### {names.get(m['role'], m['role'])}:\n{m['content']}" for m in messages)


def judge_single(
    items: Sequence[SingleItem], cfg: JudgeConfig, template: str, progress_bar: bool = True
) -> list[SingleGrade]:
    """Grade each item's last assistant answer 1-10 (template placeholders: ``{conversation}``, ``{reference_block}``)."""
    conversations = []
    for item in items:
        reference_block = f"\n[Reference answer to the last question]\n{item.reference}\n" if item.reference else ""
        user = render_template(
            template, {"conversation": render_conversation(item.messages), "reference_block": reference_block}, where=item.id
        )
        conversations.append([{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}])
    results = chat_completions(cfg, conversations, progress_bar=progress_bar)
    return [
        SingleGrade(item.id, item.turn, item.category, parse_rating(r.text), r.text, r.error)
        for item, r in zip(items, results)
    ]


def grade_summary(grades: Sequence[SingleGrade]) -> dict[str, Any]:
    """MT-Bench aggregation: the score is the mean rating over all graded turns with a parsed rating (1-10);
    per-turn and per-category means are the same mean restricted to that turn / category."""

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else float("nan")

    valid = [g for g in grades if g.score is not None]
    out: dict[str, Any] = {
        "n_items": len(grades),
        "n_valid": len(valid),
        "unparseable": sum(g.score is None and g.error is None for g in grades),
        "failed": sum(g.error is not None for g in grades),
        "score": mean([g.score for g in valid]),
    }
    out["per_turn"] = {str(t): mean([g.score for g in valid if g.turn == t]) for t in sorted({g.turn for g in grades})}
    categories = sorted({g.category for g in grades if g.category})
    out["per_category"] = {c: mean([g.score for g in valid if g.category == c]) for c in categories}
    return out
