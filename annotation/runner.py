"""The annotation run: records in, validated annotation records out, resumable and within budget.

Flow of `run_annotation`:

1. Load the input (JSON, JSONL or a ``datasets`` dataset), map field names, check the fields the critic
   needs, coerce chat-message lists to text, and key each record by its id (or its position if it has none).
2. Resume: a torn last line left by a crash is cut off, then ids already in the output or in the failures
   file are skipped (``retry_failures`` removes them from the failures file and tries again).
3. Annotate the rest with ``concurrency`` workers on one asyncio loop. Each finished record is appended
   to the output (or the failures file) as one complete line the moment it is done (fsync'd in batches, see
   `_Appender`), so a run killed at any point (Ctrl-C, SIGTERM or ``kill -9``) loses at most the records in
   flight, and a rerun redoes exactly those. Nothing is ever written twice for one id.
4. Validate: each quoted span is located in the response (`text2grad.core.spans.locate_spans`: exact, else after
   Unicode/whitespace/case normalization). Located spans are stored as the exact response text; spans that
   cannot be found are dropped from good/poor spans, listed under ``unmatched_spans`` and counted.
5. Report (`annotation.report`): counts, retries, unmatched-span rate, tokens and estimated cost, this run's and
   cumulative over every run into the output, written to ``<output>.report.json`` and printed.

Stopping: a budget (``max_requests``/``max_cost_usd``) stops new requests and lets those in flight finish;
SIGINT/SIGTERM cancel the records in flight. Either way the report is written and unfinished records are
simply not in the output, so rerunning the same command continues where this one stopped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from tqdm.auto import tqdm

from annotation.annotation_config import AnnotationConfig
from annotation.critics import (
    CriticResult,
    FeedbackSourceAdapter,
    HumanFeedbackGrounder,
    LLMAnnotator,
    RecordCritic,
)
from annotation.llm import (
    AnnotationAPIError,
    BudgetExhausted,
    ChatClient,
    FatalAPIError,
    UsageMeter,
    make_openai_client,
    mask_secrets,
    select_template,
)
from annotation.report import RunReport, earlier_totals, write_report
from text2grad.core.config import config_to_dict
from text2grad.core.critics import build_critic
from text2grad.core.data import DataError, iter_jsonl, load_records, record_id
from text2grad.core.feedback import Feedback
from text2grad.core.spans import locate_spans

__all__ = ["RunReport", "run_annotation", "load_inputs", "build_record", "read_done_ids", "repair_torn_tail"]

logger = logging.getLogger(__name__)

ANNOTATION_KEY = "_annotation"  # meta key holding how the record was annotated (original fields sit beside it)


# --------------------------------------------------------------------------------------------------
# Inputs and resume state
# --------------------------------------------------------------------------------------------------


def _as_text(value: Any, name: str, rid: str, last_assistant: bool) -> str:
    """A field as text. Chat-message lists (UltraFeedback's ``chosen``) become the last assistant message
    (``last_assistant``) or the conversation as ``role: content`` lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(m, Mapping) and "content" in m for m in value):
        if last_assistant:
            answers = [m for m in value if m.get("role") == "assistant"]
            return str((answers or value)[-1]["content"])
        return "\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise DataError(
        f"record {rid!r}: field '{name}' is a {type(value).__name__}, expected text (or a list of chat messages)"
    )


def load_inputs(cfg: AnnotationConfig) -> list[dict[str, Any]]:
    """The input records, mapped to our field names, each with ``id`` and ``meta`` (its original fields)."""
    field_map = cfg.resolved_field_map()
    required = cfg.required_fields()
    raw = load_records(cfg.dataset_path, split=cfg.dataset_split, field_map=field_map, required=required, limit=cfg.limit)
    added = {ours for ours, theirs in field_map.items() if ours != theirs}
    out: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, rec in enumerate(raw):
        rid = record_id(rec, i)
        if rid in seen:
            raise DataError(
                f"{cfg.dataset_path}: records {seen[rid]} and {i} share the id {rid!r}; ids key the resumable output, so "
                "they must be unique. Deduplicate the input or map a unique field to 'id' with --field_map."
            )
        seen[rid] = i
        meta = {k: v for k, v in rec.items() if k not in added}
        mapped = dict(rec)
        for name in required:
            mapped[name] = _as_text(rec[name], name, rid, last_assistant=(name == "response"))
        mapped["id"] = rid
        mapped["meta"] = json.loads(json.dumps(meta, ensure_ascii=False, default=str))
        out.append(mapped)
    return out


def repair_torn_tail(path: Path) -> bool:
    """Cut a last line that has no newline (a write interrupted by a crash), so appends start on a fresh line.

    Returns True if something was cut. The record on that line was not finished and will be redone.
    """
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with path.open("rb+") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return False
        # Find the last newline, reading backwards in blocks.
        pos, keep = size, 0
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            fh.seek(pos)
            block = fh.read(step)
            idx = block.rfind(b"\n")
            if idx >= 0:
                keep = pos + idx + 1
                break
        fh.seek(keep)
        if _is_json_object(fh.read()):
            # A complete record whose newline is missing (written by another tool): keep it, end the line.
            fh.seek(0, os.SEEK_END)
            fh.write(b"\n")
            fh.flush()
            os.fsync(fh.fileno())
            return False
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
    logger.warning("%s ended with an incomplete line (interrupted write); it was removed and will be redone", path)
    return True


def _is_json_object(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data.decode("utf-8")), dict)
    except (UnicodeDecodeError, ValueError):
        return False


def read_done_ids(path: Path) -> list[str]:
    """Ids of the records in a JSONL file (output or failures), in file order."""
    if not path.is_file():
        return []
    return [str(rec["id"]) for rec in iter_jsonl(path) if "id" in rec]


def _drop_ids(path: Path, ids: set[str]) -> None:
    """Rewrite ``path`` without the records whose id is in ``ids`` (atomically: temp file, fsync, rename)."""
    kept = [rec for rec in iter_jsonl(path) if str(rec.get("id")) not in ids]
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for rec in kept:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


# --------------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------------


@dataclass
class _SpanStats:
    total: int = 0
    unmatched: int = 0
    normalized: int = 0


def build_record(record: Mapping[str, Any], result: CriticResult, source: str, stats: _SpanStats | None = None) -> dict[str, Any]:
    """The annotation record for a critic's feedback, keeping only spans found in the response.

    Located spans are stored as the response's own text at their first location (so downstream exact
    matching always succeeds); unmatched quotes go to ``unmatched_spans``.
    """
    response = str(record["response"])
    feedback = result.feedback
    alignment = locate_spans(response, feedback.good_spans, feedback.poor_spans, occurrence="first")
    first: dict[tuple[str, int], Any] = {}
    for span in alignment.spans:
        first.setdefault((span.quote, span.label), span)
    good: list[str] = []
    poor: list[str] = []
    normalized = 0
    for quotes, label, bucket in ((feedback.good_spans, 1, good), (feedback.poor_spans, -1, poor)):
        for quote in quotes:
            span = first.get((quote, label))
            if span is None:
                continue
            text = response[span.start : span.end]
            if text not in bucket:
                bucket.append(text)
                normalized += int(span.normalized)
    unmatched_good = list(dict.fromkeys(q for q, label in alignment.unmatched if label == 1))
    unmatched_poor = list(dict.fromkeys(q for q, label in alignment.unmatched if label == -1))
    if stats is not None:
        stats.total += len(good) + len(poor) + len(unmatched_good) + len(unmatched_poor)
        stats.unmatched += len(unmatched_good) + len(unmatched_poor)
        stats.normalized += normalized
    meta = dict(record.get("meta") or {})
    meta[ANNOTATION_KEY] = {**result.info, "parse_retries": result.parse_retries}
    return {
        "id": str(record["id"]),
        "prompt": str(record["prompt"]),
        "response": response,
        "critique": feedback.critique,
        "good_spans": good,
        "poor_spans": poor,
        "unmatched_spans": {"good": unmatched_good, "poor": unmatched_poor},
        "source": source,
        "meta": meta,
    }


def _failure_record(record: Mapping[str, Any], reason: str, error: str, source: str, raw: str = "") -> dict[str, Any]:
    return {
        "id": str(record["id"]),
        "reason": reason,
        "error": error,
        "source": source,
        "raw": raw[:4000],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _masked_info(info: Mapping[str, Any], secret: str | None) -> dict[str, Any]:
    """``info`` with its text values (the model's raw answer among them) passed through `mask_secrets`."""
    return {k: mask_secrets(v, [secret]) if isinstance(v, str) else v for k, v in info.items()}


class _Appender:
    """Crash-safe JSONL appends with group commit.

    Each record is one ``os.write`` of one complete line to a file opened with O_APPEND, so once `append`
    returns the line is in the kernel and survives the process being killed (``kill -9``). Reaching the disk
    (surviving a power cut) needs fsync, which costs milliseconds; doing it per record on the event loop
    would cap throughput, so `sync` (run in a thread) flushes everything appended since the last sync in one
    call. With ``sync_each=True`` every append is fsync'd at once instead.
    """

    def __init__(self, path: Path, sync_each: bool = False) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.sync_each = sync_each
        self.dirty = False

    def append(self, record: Mapping[str, Any]) -> None:
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:  # regular files take it in one write; the loop only guards against a partial write
            written = os.write(self.fd, view)
            view = view[written:]
        if self.sync_each:
            os.fsync(self.fd)
        else:
            self.dirty = True

    async def sync(self) -> None:
        if self.dirty:
            self.dirty = False
            await asyncio.to_thread(os.fsync, self.fd)

    def close(self) -> None:
        if self.dirty:
            os.fsync(self.fd)
            self.dirty = False
        os.close(self.fd)


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def build_record_critic(
    cfg: AnnotationConfig, meter: UsageMeter, records: list[dict[str, Any]] | None = None
) -> tuple[RecordCritic, Any, str | None]:
    """The record critic for ``cfg.critic``, the API client to close afterwards (or None), and the secret to mask.

    ``llm`` and ``human`` drive the run's own API client (budget, usage meter, prompt template); every other
    name or ``module:Class`` spec is built by the critic registry (`text2grad.core.critics`) exactly as PPO
    builds it, bound to ``records``.
    """
    if cfg.critic in ("llm", "human"):
        client, secret = make_openai_client(cfg)
        chat = ChatClient(client, cfg, meter, secret)
        if cfg.critic == "llm":
            return LLMAnnotator(chat, select_template(cfg), cfg.max_retries), client, secret
        return HumanFeedbackGrounder(chat, select_template(cfg, human=True), cfg.max_retries), client, secret
    kwargs = dict(cfg.critic_kwargs)
    if cfg.critic == "code_tests":
        kwargs = {"timeout_s": cfg.test_timeout_s, "memory_mb": cfg.test_memory_mb, "tests_field": "tests", **kwargs}
    critic = build_critic(cfg.critic, kwargs, records)
    if callable(getattr(critic, "annotate", None)):  # already a record critic (code_tests)
        return critic, None, None  # type: ignore[return-value]
    return FeedbackSourceAdapter(critic), None, None


def run_annotation(cfg: AnnotationConfig, critic: RecordCritic | None = None) -> RunReport:
    """Annotate ``cfg.dataset_path`` into ``cfg.output`` (see the module doc). Raises DataError/ValueError on bad input
    or configuration, before any request is made."""
    check_paths(cfg)
    output, failures = Path(cfg.output), cfg.failures_path
    report = RunReport(
        input=cfg.dataset_path, output=str(output), failures=str(failures), retry_failures=cfg.retry_failures,
        config=config_to_dict(cfg),
    )
    records = load_inputs(cfg)
    if not records:
        raise DataError(f"{cfg.dataset_path} holds no records{' (after --limit)' if cfg.limit else ''}: nothing to annotate")
    report.records_in_input = len(records)
    earlier = earlier_totals(cfg.report_path, str(output))

    output.parent.mkdir(parents=True, exist_ok=True)
    failures.parent.mkdir(parents=True, exist_ok=True)
    repair_torn_tail(output)
    repair_torn_tail(failures)
    done_ids = set(read_done_ids(output))
    failed_ids = set(read_done_ids(failures)) - done_ids
    if cfg.retry_failures and failed_ids and failures.is_file():
        _drop_ids(failures, failed_ids)
        failed_ids = set()
    todo = [r for r in records if r["id"] not in done_ids and r["id"] not in failed_ids]
    input_ids = {r["id"] for r in records}
    report.skipped_done = len(done_ids & input_ids)
    report.skipped_failed = len(failed_ids & input_ids)
    report.to_annotate = len(todo)
    if report.skipped_failed:
        logger.warning(
            "skipping %d record(s) that failed in an earlier run (see %s); pass --retry_failures true to retry them",
            report.skipped_failed, failures,
        )

    meter = UsageMeter(cfg.max_requests, cfg.max_cost_usd, cfg.price_per_1k_input, cfg.price_per_1k_output)
    client, secret = None, None
    if critic is None and todo:
        critic, client, secret = build_record_critic(cfg, meter, todo)
    template = getattr(critic, "template", None)
    if todo and template is not None:
        template.messages(todo[0])  # a placeholder the records lack is a configuration error: fail before any request
    start = time.perf_counter()

    def snapshot() -> None:
        """Write the report as it stands (also while running, so a run killed with -9 keeps its costs)."""
        report.elapsed_s = time.perf_counter() - start
        report.requests = meter.requests
        report.api_retries = meter.api_retries
        report.tokens_in = meter.prompt_tokens
        report.tokens_out = meter.completion_tokens
        report.tokens_estimated_requests = meter.estimated
        report.estimated_cost_usd = round(meter.cost_usd, 6)
        report.records_per_s = (report.done + report.failed) / report.elapsed_s if report.elapsed_s > 0 else 0.0
        report.not_finished = report.to_annotate - report.done - report.failed
        report.unmatched_span_rate = report.spans_unmatched / report.spans_total if report.spans_total else 0.0
        chat = getattr(critic, "chat", None)
        if isinstance(chat, ChatClient):
            refused = chat.structured_refused
            report.structured_output = f"refused: {refused}" if refused else "json_schema" if chat.structured else "off"
        report.accumulate(earlier)
        write_report(cfg.report_path, report)

    try:
        if todo:
            asyncio.run(_annotate_all(cfg, todo, critic, client, meter, report, secret, snapshot))  # type: ignore[arg-type]
    finally:
        report.output_records = len(read_done_ids(output))
        report.failure_records = len(read_done_ids(failures))
        snapshot()
    return report


def check_paths(cfg: AnnotationConfig) -> None:
    """Refuse paths that would lose data, before anything is read or written: the input must never be written
    (it is not one of the outputs), the outputs must be distinct files, and none may be a directory."""
    if not cfg.dataset_path or not cfg.output:
        raise ValueError("both --dataset_path and --output are required")
    outputs = {"--output": Path(cfg.output), "--failures": cfg.failures_path, "--report": cfg.report_path}
    source = Path(cfg.dataset_path)
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if path.is_dir():
            raise ValueError(f"{flag} {path} is a directory; name a file, e.g. {path / 'annotations.jsonl'}")
        if path.resolve() == source.resolve():
            raise ValueError(f"{flag} {path} is the input file: annotation never writes its input; choose another {flag}")
        key = path.resolve()
        if key in seen:
            raise ValueError(f"{seen[key]} and {flag} are the same file {path}; give each its own path")
        seen[key] = flag


async def _annotate_all(
    cfg: AnnotationConfig,
    todo: list[dict[str, Any]],
    critic: RecordCritic,
    client: Any,
    meter: UsageMeter,
    report: RunReport,
    secret: str | None,
    snapshot: Callable[[], None] | None = None,
) -> None:
    stats = _SpanStats()
    reasons: Counter[str] = Counter()
    pending = iter(todo)
    stop = asyncio.Event()
    source = getattr(critic, "source", type(critic).__name__)
    bar = tqdm(total=len(todo), desc="annotate", unit="rec", disable=not cfg.progress_bar, dynamic_ncols=True)

    sync_each = cfg.fsync_interval_s <= 0
    out_file = _Appender(Path(cfg.output), sync_each)
    fail_file = _Appender(cfg.failures_path, sync_each)

    finished = asyncio.Event()

    async def syncer() -> None:
        while not finished.is_set():
            try:
                await asyncio.wait_for(finished.wait(), cfg.fsync_interval_s)
            except asyncio.TimeoutError:
                pass
            await out_file.sync()
            await fail_file.sync()
            if snapshot is not None and not finished.is_set():
                snapshot()

    try:

        def fail(record: Mapping[str, Any], reason: str, error: str, raw: str = "") -> None:
            # The raw answer is masked here too, not only in ChatClient: a plugin critic's text passes no client.
            fail_file.append(
                _failure_record(record, reason, mask_secrets(error, [secret]), source, mask_secrets(raw or "", [secret]))
            )
            report.failed += 1
            reasons[reason] += 1

        async def worker() -> None:
            while not stop.is_set():
                record = next(pending, None)
                if record is None:
                    return
                try:
                    result = await critic.annotate(record)
                except BudgetExhausted as exc:
                    report.stopped = str(exc)
                    stop.set()
                    return
                except FatalAPIError as exc:
                    report.fatal_error = mask_secrets(str(exc), [secret])
                    stop.set()
                    return
                except AnnotationAPIError as exc:
                    fail(record, "api_error", str(exc))
                except DataError as exc:
                    fail(record, "data_error", str(exc))
                except Exception as exc:  # a broken critic fails its record, not the run
                    logger.exception("critic raised on record %s", record["id"])
                    fail(record, "critic_error", f"{type(exc).__name__}: {exc}")
                else:
                    fb: Feedback = result.feedback
                    if fb.ok:
                        result.info = _masked_info(result.info, secret)
                        out_file.append(build_record(record, result, source, stats))
                        report.done += 1
                    else:
                        reason = "unparseable" if "unparseable" in (fb.error or "") else "critic_failed"
                        fail(record, reason, fb.error or "critic failed", fb.raw)
                    if result.parse_retries:
                        report.retried += 1
                        report.parse_retries += result.parse_retries
                bar.update(1)
                bar.set_postfix(failed=report.failed, cost=f"${meter.cost_usd:.3f}", refresh=False)

        workers = [asyncio.create_task(worker()) for _ in range(min(cfg.concurrency, len(todo)))]
        sync_task = None if sync_each else asyncio.create_task(syncer())

        def interrupt() -> None:
            report.interrupted = True
            stop.set()
            for task in workers:
                task.cancel()

        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, interrupt)
                installed.append(sig)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or no signals here
                pass
        try:
            results = await asyncio.gather(*workers, return_exceptions=True)
            errors = [r for r in results if isinstance(r, Exception)]
            if errors:  # e.g. the disk is full: the run cannot go on, and must say so
                raise errors[0]
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            finished.set()
            if sync_task is not None:
                await asyncio.gather(sync_task, return_exceptions=True)  # let a running fsync finish
            bar.close()
            report.spans_total += stats.total
            report.spans_unmatched += stats.unmatched
            report.spans_normalized += stats.normalized
            report.failure_reasons = dict(reasons)
            if client is not None:
                try:
                    await client.close()
                except Exception:  # closing must not hide the run's outcome
                    pass
    finally:
        out_file.close()
        fail_file.close()
