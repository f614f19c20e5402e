"""The quickstart's memory record: the peak RSS it prints after every phase, and the smollm2 preset's reward-model
micro-batches (the phase that set the pipeline's peak; benchmarks/README.md)."""

from __future__ import annotations

import os
from pathlib import Path

from text2grad.apps.quickstart.presets import PRESET_ARGS
from text2grad.apps.quickstart.results import peak_rss_mb


def _current_rss_mb() -> float:
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def test_peak_rss_is_in_megabytes_and_covers_what_is_resident_now():
    block = bytearray(200 * 1024 * 1024)  # 210 MB, every page written so it is resident
    block[:: 4096] = b"x" * len(block[:: 4096])
    now = _current_rss_mb()
    peak = peak_rss_mb()
    assert now > 200 and peak >= now - 1  # ru_maxrss is KiB on Linux: a wrong unit would be 1024x off either way
    assert peak < 64 * 1024  # a test process far below 64 GB
    del block


def _flag(argv: list[str], name: str) -> int:
    return int(argv[len(argv) - 1 - argv[::-1].index(name) + 1])


def test_smollm2_reward_model_trains_batches_of_8_in_micro_batches_of_2():
    rm_args = PRESET_ARGS["smollm2"]["rm_args"]
    micro, accumulation = _flag(rm_args, "--per_device_train_batch_size"), _flag(rm_args, "--gradient_accumulation_steps")
    assert micro == 2 and micro * accumulation == 8  # same optimizer batch as before, a quarter of the activations
