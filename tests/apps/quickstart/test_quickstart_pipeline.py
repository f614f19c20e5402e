"""Stage helpers of the quickstart pipeline (text2grad/apps/quickstart/pipeline.py)."""

from __future__ import annotations

from pathlib import Path

from text2grad.apps.quickstart import pipeline
from text2grad.apps.quickstart.quickstart_config import QuickstartConfig, resolve
from text2grad.core.data import iter_jsonl, write_jsonl


def test_annotations_come_back_in_input_order_whatever_order_the_workers_finished_in(monkeypatch, tmp_path):
    """The annotation CLI appends records as its workers finish; on a busy machine two can swap, and the reward
    model's held-out split (the first tenth) and its training order must not change with that."""
    inputs = [{"id": f"policy-{i}", "prompt": f"post {i}\nTL;DR:", "response": f" summary {i}"} for i in range(6)]
    write_jsonl(tmp_path / "to_annotate.jsonl", inputs)
    finished = [inputs[k] for k in (1, 0, 2, 5, 3, 4)]  # two workers overtook each other

    def annotation_cli(module: str, argv: list[str]) -> None:
        assert module == "annotation.cli"
        output = Path(argv[argv.index("--output") + 1])
        write_jsonl(output, [{**r, "critique": "ok", "good_spans": [], "poor_spans": []} for r in finished])

    monkeypatch.setattr(pipeline, "_call", annotation_cli)
    cfg = resolve(QuickstartConfig(preset="ci", output_dir=str(tmp_path / "out")))
    annotations = pipeline._annotate(cfg, tmp_path, tmp_path / "posts.jsonl")
    assert [r["id"] for r in annotations] == [r["id"] for r in inputs]
    assert [r["id"] for r in iter_jsonl(tmp_path / "annotations.jsonl")] == [r["id"] for r in finished]  # file as written
