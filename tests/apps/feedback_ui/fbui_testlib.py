"""Plain helpers shared by the feedback-ui tests: a few items to annotate and the real command run as a server."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# An emoji before the marked text makes the browser's offsets (UTF-16) differ from Python's (code points); "Oslo"
# occurs twice, so only the offsets can say which one was marked.
ITEMS = [
    {"id": "a", "prompt": "Summarize: Alex (\U0001F600 happy) moved to Berlin for a job.",
     "response": "Alex \U0001F600 moved to Oslo for a job. Oslo is cold."},
    {"id": "b", "prompt": "Echo this <b>bold</b> markup & more.",
     "response": '<script>window.__pwned = 1;</script><img src="x" onerror="window.__pwned = 2"> plain text'},
    {"id": "c", "prompt": "Write add(a, b) that returns the sum.", "response": "def add(a, b):\n    return a - b"},
    {"id": "d", "prompt": "How do I find a bike in Lisbon?", "response": "Check local listings and compare prices."},
]


def write_items(path: Path, items=ITEMS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items), encoding="utf-8")
    return path


def read_records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class Server:
    """``python -m text2grad.apps.feedback_ui ...`` on 127.0.0.1 and a free port, until `stop`."""

    def __init__(self, *args: str, timeout: float = 60.0) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("TEXT2GRAD_FEEDBACK_UI_TOKEN", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "text2grad.apps.feedback_ui", "--host", "127.0.0.1", "--port", "0", *args],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            match = re.search(r"open (http://\S+) in a browser", self.output)
            if match:
                self.url = match.group(1)
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                time.sleep(0.2)
                raise AssertionError(f"feedback-ui did not start:\n{self.output}")
            time.sleep(0.05)
        self.base = self.url.split("?")[0].rstrip("/")

    @property
    def output(self) -> str:
        """What the server printed so far (stdout and stderr)."""
        return "".join(self.lines)

    def kill(self) -> None:
        """SIGKILL: no clean-up at all, as when a machine loses the process."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode
