"""``text2grad prepare-data`` / ``python -m text2grad.apps.prepare_data``: the paper's datasets, as they are on the
hub, turned into the files each phase reads.

    text2grad prepare-data --dataset slf5k --dataset_path JeremyAlain/SLF5K --output_dir data/slf5k
    text2grad prepare-data --dataset ultrafeedback --dataset_path HuggingFaceH4/ultrafeedback_binarized --output_dir data/ultrafeedback
    text2grad prepare-data --dataset kodcode --dataset_path KodCode/KodCode-Light-RL-10K --output_dir data/kodcode \\
        --completions_model Qwen/Qwen2.5-0.5B-Instruct

``--dataset_path`` is a hub id or a local copy in the native layout (see `sources`). Every dataset's ``--output_dir``
gets ``annotation_input.jsonl`` (records to annotate: id, prompt, response and the dataset's own fields),
``sft.jsonl`` (prompt, completion), ``rl_prompts.jsonl`` (prompt and what the critics need), ``eval.jsonl``,
``preference_pairs.jsonl`` (prompt, chosen, rejected) and ``prepare_report.json`` (counts), written last.
What each dataset puts in them is in the docstrings of `slf5k`, `ultrafeedback` and `kodcode`.

A missing split or column stops the run before anything is written: ``error: <dataset> split '<split>' lacks
column(s) [...]; it has columns [...]`` on stderr and exit status 2.

The command is in cli.py, its configuration in prepare_data_config.py. Names are loaded on first use
(`text2grad.core.critics.lazy_exports`), so the configuration alone, as ``text2grad prepare-data --help`` reads it, loads no
ML library.
"""

from __future__ import annotations

from text2grad.core.critics import lazy_exports

_EXPORTS = dict.fromkeys(["PrepareDataConfig", "SchemaError", "OUTPUT_FILES", "prepare", "main"],
                         "text2grad.apps.prepare_data.cli")

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
