"""The ``text2grad feedback-ui`` command (``python -m text2grad.apps.feedback_ui``); the package docstring describes it."""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from annotation.annotation_config import AnnotationConfig
from annotation.runner import _Appender, load_inputs, repair_torn_tail
from text2grad.apps.feedback_ui.agreement import (
    agreement_summary,
    attention_summary,
    format_attention,
    format_agreement,
    format_suggestions,
    suggestion_summary,
)
from text2grad.apps.feedback_ui.feedback_ui_config import ANNOTATOR_PATTERN, TOKEN_ENV, FeedbackUIConfig, is_loopback
from text2grad.apps.feedback_ui.records import lone_surrogates, repair_text
from text2grad.apps.feedback_ui.label_studio import ImportReport, records_from_export, write_label_studio_files
from text2grad.apps.feedback_ui.review import ReviewQueue
from text2grad.apps.feedback_ui.server import bind_socket, create_app, serve
from text2grad.apps.feedback_ui.store import (
    FeedbackStore,
    FeedbackUIError,
    acquire_output_lock,
    check_output_paths,
    record_annotator,
)
from text2grad.core.cli import EXIT_OK, run_cli
from text2grad.core.config import ConfigError
from text2grad.core.data import DataError, iter_jsonl

__all__ = ["FeedbackUIConfig", "load_items", "build_server", "run", "main"]


def load_items(cfg: FeedbackUIConfig) -> list[dict[str, Any]]:
    """The input records as the annotate command reads them (field mapping, chat messages to text, unique ids)."""
    if not cfg.dataset_path:
        raise ConfigError("--dataset_path is required: the (prompt, response) records to annotate")
    items = load_inputs(AnnotationConfig(
        dataset_path=cfg.dataset_path, dataset_split=cfg.dataset_split, dataset=cfg.dataset,
        field_map=cfg.field_map, limit=cfg.limit, critic="llm",
    ))
    if not items:
        raise DataError(f"{cfg.dataset_path} holds no records: nothing to annotate")
    return repair_items(items, cfg.dataset_path)


def repair_items(items: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
    """The items with unpaired surrogates (text that cannot be written as UTF-8, e.g. an emoji cut in half) replaced
    by U+FFFD, each repaired record named on stderr; an empty response is named too (the page says it is empty)."""
    out = []
    for n, item in enumerate(items):
        fixed, count = repair_text(item)
        if count:
            counts = {k: lone_surrogates(str(item.get(k, ""))) for k in ("prompt", "response")}
            where = ", ".join(f"{c} in {k}" for k, c in counts.items() if c) or f"{count} in its other fields"
            print(f"feedback-ui: {source}: record {n} (id {fixed['id']!r}): unpaired surrogate(s) ({where}) replaced "
                  "by U+FFFD; the text was cut inside a character", file=sys.stderr)
        if not str(fixed.get("response", "")).strip():
            print(f"feedback-ui: {source}: record {n} (id {fixed['id']!r}) has an empty response", file=sys.stderr)
        out.append(fixed)
    return out


def resolve_token(cfg: FeedbackUIConfig) -> str | None:
    """The access token: --access_token, else $TEXT2GRAD_FEEDBACK_UI_TOKEN, else a random one off loopback."""
    token = cfg.access_token or os.environ.get(TOKEN_ENV) or None
    if token is None and not is_loopback(cfg.host):
        token = secrets.token_urlsafe(24)
    if token is not None and len(token) < 16:
        raise ConfigError(f"${TOKEN_ENV} must be at least 16 characters")
    return token


def annotator_ids(spec: str) -> list[str]:
    """The ids of ``--annotators``: a comma-separated list, or a file with one id per line (``#`` comments)."""
    path = Path(spec)
    if "," not in spec and path.is_file():
        lines = [line.split("#")[0].strip() for line in path.read_text(encoding="utf-8").splitlines()]
        ids = [line for line in lines if line]
        where = f"{spec}"
    else:
        ids = [part.strip() for part in spec.split(",") if part.strip()]
        where = "--annotators"
    bad = [i for i in ids if not ANNOTATOR_PATTERN.match(i)]
    if bad or not ids:
        raise ConfigError(f"{where}: {bad or 'no ids'}: each annotator id is 1-64 letters, digits, '.', '_', '@' or '-'")
    if len(set(ids)) != len(ids):
        raise ConfigError(f"{where}: an id is listed twice ({sorted(i for i in ids if ids.count(i) > 1)[0]!r})")
    return ids


def _role_tokens(cfg: FeedbackUIConfig, spec: str, role: str) -> dict[str, str]:
    """One token per id of ``spec`` (--annotators or --reviewers), reusing those ``<output>.tokens.json`` holds for
    that role, so a restart does not invalidate the addresses people have; new ids get new tokens."""
    if not spec:
        return {}
    ids = annotator_ids(spec)
    kept: dict[str, Any] = {}
    if cfg.tokens_path.is_file():
        try:
            kept = json.loads(cfg.tokens_path.read_text(encoding="utf-8")).get(role, {})
        except (ValueError, AttributeError):
            raise ConfigError(f"{cfg.tokens_path} is not a tokens file; move it away to make new tokens") from None
    return {who: str(kept.get(who, {}).get("token") or secrets.token_urlsafe(24)) for who in ids}


def annotator_tokens(cfg: FeedbackUIConfig) -> tuple[dict[str, str], dict[str, str]]:
    """The per-person tokens of --annotators and of --reviewers (``{id: token}`` each)."""
    annotators = _role_tokens(cfg, cfg.annotators, "annotators")
    reviewers = _role_tokens(cfg, cfg.reviewers, "reviewers")
    both = set(annotators) & set(reviewers)
    if both:
        raise ConfigError(f"{sorted(both)[0]!r} is both an annotator and a reviewer; a reviewer adjudicates others' "
                          "work, so give them another id for annotating")
    return annotators, reviewers


def write_tokens(cfg: FeedbackUIConfig, tokens: dict[str, str], reviewers: dict[str, str], address: str) -> None:
    """Write each person's token and address to ``<output>.tokens.json``, readable by this user only."""
    content = {
        "annotators": {who: {"token": t, "address": f"{address}?token={t}"} for who, t in tokens.items()},
        "reviewers": {who: {"token": t, "address": f"{address}review?token={t}"} for who, t in reviewers.items()},
    }
    fd = os.open(cfg.tokens_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(content, handle, indent=1)
        handle.write("\n")


def build_server(cfg: FeedbackUIConfig) -> tuple[Any, FeedbackStore, socket.socket, str | None, ReviewQueue | None]:
    """Everything `run` serves: the app, its store, a bound socket, the token and the review queue (checked before
    listening)."""
    try:
        check_output_paths(cfg.dataset_path, cfg.output, cfg.skipped_path)
    except FeedbackUIError as exc:
        raise ConfigError(str(exc)) from None
    items = load_items(cfg)
    tokens, reviewer_tokens = annotator_tokens(cfg)
    token = None if tokens else resolve_token(cfg)
    try:
        sock = bind_socket(cfg.host, cfg.port)
        try:
            store = FeedbackStore(items, Path(cfg.output), cfg.skipped_path, cfg.annotations_per_item,
                                  cfg.lease_minutes * 60, cfg.require_critique,
                                  max_critique_chars=cfg.max_critique_chars)
        except BaseException:
            sock.close()
            raise
    except FeedbackUIError as exc:
        raise ConfigError(str(exc)) from None
    review = ReviewQueue(store, cfg.adjudicated_path) if reviewer_tokens else None
    app = create_app(store, token, cfg.annotator, loopback_only=is_loopback(cfg.host), annotator_tokens=tokens,
                     review=review, reviewer_tokens=reviewer_tokens)
    if tokens or reviewer_tokens:
        write_tokens(cfg, tokens, reviewer_tokens, _address(cfg, sock, None))
    return app, store, sock, token, review


def _address(cfg: FeedbackUIConfig, sock: socket.socket, token: str | None) -> str:
    port = sock.getsockname()[1]
    host = cfg.host if cfg.host not in ("0.0.0.0", "::", "[::]") else socket.gethostname()
    host = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    query = f"?token={token}" if token else ""
    return f"http://{host}:{port}/{query}"


def _serve(cfg: FeedbackUIConfig) -> int:
    app, store, sock, token, review = build_server(cfg)
    try:
        progress = store.progress(cfg.annotator) if cfg.annotator else None
        done = f"; {progress['yours']} done by {cfg.annotator}" if progress else ""
        print(f"feedback-ui: {len(store.items)} items from {cfg.dataset_path}{done}; records go to {cfg.output}",
              file=sys.stderr)
        if cfg.annotators or cfg.reviewers:
            print(f"feedback-ui: each person's own address is in {cfg.tokens_path} (readable by you only): send "
                  "each person theirs", file=sys.stderr)
        print(f"feedback-ui: open {_address(cfg, sock, token)} in a browser (Ctrl-C stops; nothing submitted is lost)",
              file=sys.stderr, flush=True)
        serve(app, sock)
    finally:
        if review is not None:
            review.close()
        store.close()
        sock.close()
    return EXIT_OK


def _label_studio_files(cfg: FeedbackUIConfig) -> int:
    items = load_items(cfg)
    config, tasks = write_label_studio_files(items, Path(cfg.label_studio_dir or "."))
    print(f"wrote {config} (the labelling config: paste it into the project's Settings > Labeling Interface > Code)")
    print(f"wrote {tasks} ({len(items)} tasks to import into that project)")
    print(f"after annotating, export the project as JSON and run: text2grad feedback-ui --import_label_studio "
          f"<export.json> --output <records.jsonl>")
    return EXIT_OK


def _import_label_studio(cfg: FeedbackUIConfig) -> int:
    if not cfg.output:
        raise ConfigError("--output is required: the records file the export's annotations are appended to")
    output, export = Path(cfg.output), Path(cfg.import_label_studio or "")
    if output.is_dir():
        raise ConfigError(f"--output {output} is a directory; name a file, e.g. {output / 'human_feedback.jsonl'}")
    if output.resolve() == export.resolve():
        raise ConfigError(f"--output {output} is the export itself; choose another file")
    try:
        lock = acquire_output_lock(output)
    except FeedbackUIError as exc:
        raise ConfigError(str(exc)) from None
    report = ImportReport()
    try:
        repair_torn_tail(output)
        done = {(str(r["id"]), record_annotator(r)) for r in iter_jsonl(output) if "id" in r} if output.is_file() else set()
        writer = _Appender(output)  # one complete line per record; fsync'd once at the end (close)
        try:
            for record in tqdm(records_from_export(export, done, report), desc="import", unit="rec",
                               disable=not cfg.progress_bar):
                writer.append(record)
        finally:
            writer.close()
    finally:
        lock.close()
    print(json.dumps({"output": str(output), **report.to_dict()}, indent=1, ensure_ascii=False))
    if report.problems:
        print(f"warning: {len(report.problems)} annotation(s) not imported (listed under 'problems' above)",
              file=sys.stderr)
    if report.spans_unmatched:
        print(f"warning: {report.spans_unmatched} span(s) quote text that is not in their response; they are listed "
              "under unmatched_spans and give no reward", file=sys.stderr)
    return EXIT_OK


def _agreement(cfg: FeedbackUIConfig) -> int:
    output = Path(cfg.output)
    if not cfg.output or not output.is_file():
        raise ConfigError(f"--output {cfg.output or '(unset)'} is not a records file; point it at the feedback-ui output")
    records = list(iter_jsonl(output))
    summary = agreement_summary(records)
    summary["suggestions"] = suggestion_summary(records)
    summary["attention_checks"] = attention_summary(records)
    cfg.agreement_path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(format_agreement(summary))
    for extra in (format_suggestions(summary["suggestions"]), format_attention(summary["attention_checks"])):
        if extra:
            print(extra)
    print(f"(written to {cfg.agreement_path})")
    return EXIT_OK


def run(cfg: FeedbackUIConfig) -> int:
    jobs = {"serve": _serve, "agreement": _agreement, "label_studio_config": _label_studio_files,
            "import_label_studio": _import_label_studio}
    return jobs[cfg.mode](cfg)


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(FeedbackUIConfig, run, argv)
