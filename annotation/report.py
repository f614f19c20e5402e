"""The annotation run's report: what one run did, plus totals over every run into the same output.

Written as JSON next to the output (``<output>.report.json``) at the end of a run and, while it goes, at every
fsync batch, so the tokens and cost of a run killed with ``kill -9`` are not lost; the next run starts its
``cumulative`` totals from the report it finds.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from text2grad.core.data import write_whole

__all__ = ["RunReport", "earlier_totals", "write_report"]


@dataclass
class RunReport:
    """What one run did. Counts are for this run; ``output_records`` is the total now in the output."""

    input: str
    output: str
    failures: str
    records_in_input: int = 0
    skipped_done: int = 0
    skipped_failed: int = 0
    to_annotate: int = 0
    done: int = 0
    failed: int = 0
    not_finished: int = 0
    retried: int = 0
    parse_retries: int = 0
    api_retries: int = 0
    requests: int = 0
    spans_total: int = 0
    spans_unmatched: int = 0
    spans_normalized: int = 0
    unmatched_span_rate: float = 0.0
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_estimated_requests: int = 0  # requests the server sent no usage for: tokens estimated from text length
    estimated_cost_usd: float = 0.0
    elapsed_s: float = 0.0
    records_per_s: float = 0.0
    failure_reasons: dict[str, int] = field(default_factory=dict)
    stopped: str | None = None
    interrupted: bool = False
    fatal_error: str | None = None
    output_records: int = 0
    failure_records: int = 0
    retry_failures: bool = False
    # How answers were asked for: "json_schema" (structured outputs), "off" (free text, parsed and repaired), or
    # "refused: <the server's reason>" (the server refused the schema; free text from then on).
    structured_output: str = "off"
    # Totals over every run into this output (this one included), so a killed or resumed run's tokens and cost
    # are never lost: runs, requests, tokens_in, tokens_out, tokens_estimated_requests, estimated_cost_usd,
    # done, failed, elapsed_s.
    cumulative: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.not_finished == 0 and not self.interrupted and self.fatal_error is None

    def accumulate(self, earlier: Mapping[str, float]) -> None:
        """Set ``cumulative`` to ``earlier`` (the totals of the runs before this one) plus this run."""
        mine = {
            "runs": 1, "requests": self.requests, "tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
            "tokens_estimated_requests": self.tokens_estimated_requests, "estimated_cost_usd": self.estimated_cost_usd,
            "done": self.done, "failed": self.failed, "elapsed_s": self.elapsed_s,
        }
        self.cumulative = {k: round(float(earlier.get(k, 0)) + v, 6) for k, v in mine.items()}
        for k in ("runs", "requests", "tokens_in", "tokens_out", "tokens_estimated_requests", "done", "failed"):
            self.cumulative[k] = int(self.cumulative[k])

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "complete": self.complete}

    def summary(self) -> str:
        lines = [
            f"annotated {self.done} record(s), failed {self.failed}, retried {self.retried} "
            f"({self.parse_retries} parse retries, {self.api_retries} API retries, {self.requests} requests)",
            f"skipped {self.skipped_done} already done and {self.skipped_failed} already failed; "
            f"{self.not_finished} left for a later run" if self.not_finished else
            f"skipped {self.skipped_done} already done and {self.skipped_failed} already failed",
            f"spans: {self.spans_total} quoted, {self.spans_unmatched} not found in the response "
            f"(unmatched rate {self.unmatched_span_rate:.2%}), {self.spans_normalized} found after normalization",
            f"tokens in/out: {self.tokens_in}/{self.tokens_out}, estimated cost ${self.estimated_cost_usd:.4f}",
            *(
                [f"tokens were estimated (~4 characters per token) for {self.tokens_estimated_requests} request(s): "
                 "the server sent no usage, so tokens and cost are rough"]
                if self.tokens_estimated_requests else []
            ),
            f"{self.elapsed_s:.1f} s, {self.records_per_s:.2f} records/s; output has {self.output_records} record(s), "
            f"failures file {self.failure_records}",
        ]
        if self.cumulative.get("runs", 1) > 1:
            c = self.cumulative
            lines.append(
                f"all {c['runs']} runs into this output: {c['requests']} requests, tokens in/out "
                f"{c['tokens_in']}/{c['tokens_out']}, estimated cost ${c['estimated_cost_usd']:.4f}"
            )
        if self.failure_reasons:
            lines.append("failure reasons: " + ", ".join(f"{k}={v}" for k, v in sorted(self.failure_reasons.items())))
        if self.skipped_failed and not self.retry_failures:
            lines.append(
                f"{self.skipped_failed} record(s) failed in an earlier run and were skipped (reasons in "
                f"{self.failures}); rerun with --retry_failures true to try them again"
            )
        if self.structured_output.startswith("refused"):
            lines.append(f"the server {self.structured_output.replace('refused', 'refused the span JSON schema', 1)}; "
                         "answers were parsed as free text")
        if self.stopped:
            lines.append(f"stopped early: {self.stopped}. Rerun the same command to continue.")
        if self.interrupted:
            lines.append("interrupted. Rerun the same command to continue.")
        if self.fatal_error:
            lines.append(f"stopped by an API error: {self.fatal_error}")
        return "\n".join(lines)


def earlier_totals(report_path: Path, output: str) -> dict[str, float]:
    """The ``cumulative`` totals of the report an earlier run into the same output left (empty if none)."""
    try:
        earlier = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(earlier, dict) or earlier.get("output") != output:
        return {}
    totals = earlier.get("cumulative")
    if isinstance(totals, dict) and totals:
        return totals
    # a report written before cumulative totals existed: its own run's numbers
    return {
        "runs": 1, **{k: earlier.get(k, 0) for k in ("requests", "tokens_in", "tokens_out", "tokens_estimated_requests",
                                                    "estimated_cost_usd", "done", "failed", "elapsed_s")},
    }


def write_report(path: Path, report: RunReport) -> None:
    write_whole(path, json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n")
