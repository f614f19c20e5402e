"""The ``text2grad prepare-data`` command (``python -m text2grad.apps.prepare_data``); the package docstring describes it."""

from __future__ import annotations

import json
from typing import Any, Sequence

from text2grad.apps.prepare_data import kodcode, slf5k, ultrafeedback
from text2grad.apps.prepare_data.common import OUTPUT_FILES, write_outputs
from text2grad.apps.prepare_data.prepare_data_config import PrepareDataConfig
from text2grad.apps.prepare_data.sources import SchemaError
from text2grad.core.cli import EXIT_OK, run_cli
from text2grad.core.config import ConfigError, config_to_dict

__all__ = ["PrepareDataConfig", "SchemaError", "OUTPUT_FILES", "prepare", "main"]

_PREPARERS = {"slf5k": slf5k.prepare, "ultrafeedback": ultrafeedback.prepare, "kodcode": kodcode.prepare}


def prepare(cfg: PrepareDataConfig) -> dict[str, Any]:
    """Read, check and write; returns the report (also written to ``output_dir/prepare_report.json``)."""
    if not cfg.dataset_path or not cfg.output_dir:
        raise ConfigError("set --dataset_path (hub id or local copy) and --output_dir (e.g. data/" + cfg.dataset + ")")
    files, report = _PREPARERS[cfg.dataset](cfg)
    report = {"dataset": cfg.dataset, "input": cfg.dataset_path, **report, "config": config_to_dict(cfg)}
    write_outputs(cfg.output_dir, files, report)
    report["files"] = {name: len(files.get(name, [])) for name in OUTPUT_FILES}
    return report


def run_prepare(cfg: PrepareDataConfig) -> int:
    try:
        report = prepare(cfg)
    except SchemaError as exc:
        raise ConfigError(str(exc)) from None
    counts = ", ".join(f"{name} {n}" for name, n in report["files"].items())
    print(f"prepared {cfg.dataset} in {cfg.output_dir}: {counts}")
    if cfg.dataset == "kodcode":
        print(f"kodcode programs: {report['passing']} passing, {report['failing']} failing "
              f"({json.dumps(report['programs'])})")
    print(f"report: {cfg.output_dir}/prepare_report.json")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(PrepareDataConfig, run_prepare, argv)
