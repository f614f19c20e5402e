"""Drive a real headless Chromium through the DevTools protocol over a pipe (no driver library).

The same browser the quickstart report test runs (`tests.apps.quickstart.browser.find_browser`, same flags),
started with ``--remote-debugging-pipe``: the browser reads protocol messages (JSON, each ended by a NUL byte)
from file descriptor 3 and writes its answers and events to descriptor 4. That is all `Browser` needs: real
mouse and keyboard input (``Input.dispatchMouseEvent`` / ``dispatchKeyEvent`` / ``insertText``), page
navigation and script evaluation.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import tempfile
import time
from typing import Any

from tests.apps.quickstart.browser import find_browser

_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
          "--hide-scrollbars", "--disable-extensions", "--window-size=1200,900"]
# Keys the page listens to: DOM key value -> (code, Windows virtual key code) for Input.dispatchKeyEvent.
_KEYS = {"Enter": ("Enter", 13), "Escape": ("Escape", 27), "[": ("BracketLeft", 219), "]": ("BracketRight", 221)}


class BrowserError(AssertionError):
    pass


class Browser:
    """One headless Chromium with one page. Use as a context manager; `close` ends the process."""

    def __init__(self, timeout: float = 20.0) -> None:
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="t2g-chromium-")
        ours_read, browser_write = os.pipe()
        browser_read, ours_write = os.pipe()

        def wire_pipes() -> None:  # in the child, before exec: the protocol's fixed descriptors 3 and 4
            # through descriptors >= 10 first, so that neither end can overwrite the other on its way to 3 or 4
            read_end, write_end = fcntl.fcntl(browser_read, fcntl.F_DUPFD, 10), fcntl.fcntl(browser_write, fcntl.F_DUPFD, 10)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self.process = subprocess.Popen(
            [find_browser(), *_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self._profile.name}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=wire_pipes,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(browser_read)
        os.close(browser_write)
        self._read, self._write = ours_read, ours_write
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime"):
                self.send(f"{domain}.enable", session=True)
        except BaseException:
            self.close()
            raise

    # ---- protocol --------------------------------------------------------------------------------------------

    def send(self, method: str, params: dict[str, Any] | None = None, session: bool = False) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._receive(self.timeout)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def _receive(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._read], [], [], left)[0]:
                raise BrowserError("the browser did not answer in time")
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                raise BrowserError("the browser closed the connection")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def wait_event(self, method: str, timeout: float | None = None) -> dict[str, Any]:
        for n, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(n)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            event = self._receive(max(deadline - time.monotonic(), 0.001))
            if event.get("method") == method:
                return event
            self.events.append(event)

    # ---- page ------------------------------------------------------------------------------------------------

    def goto(self, url: str) -> None:
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session=True)
        self.wait_event("Page.loadEventFired")

    def reload(self) -> None:
        self.events.clear()
        self.send("Page.reload", {"ignoreCache": True}, session=True)
        self.wait_event("Page.loadEventFired")

    def reload_answering_dialogs(self) -> list[str]:
        """Reload, accepting any dialog the page raises on the way (a ``beforeunload`` guard); returns their types."""
        self.events.clear()
        self._next_id += 1
        message = {"id": self._next_id, "method": "Page.reload", "params": {"ignoreCache": True}, "sessionId": self.session}
        os.write(self._write, json.dumps(message).encode() + b"\0")  # not awaited: a dialog may hold the reply back
        seen: list[str] = []
        deadline = time.monotonic() + self.timeout
        while True:
            event = self.events.pop(0) if self.events else self._receive(max(deadline - time.monotonic(), 0.001))
            if event.get("method") == "Page.javascriptDialogOpening":
                seen.append(event["params"]["type"])
                self._next_id += 1
                answer = {"id": self._next_id, "method": "Page.handleJavaScriptDialog", "params": {"accept": True},
                          "sessionId": self.session}
                os.write(self._write, json.dumps(answer).encode() + b"\0")
            elif event.get("method") == "Page.loadEventFired":
                return seen

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                           session=True)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]!r} raised: {result['exceptionDetails'].get('exception', {}).get('description')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None) -> Any:
        """Poll a JavaScript expression until it is truthy; return its value."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {expression!r} (last value {value!r})")
            time.sleep(0.05)

    # ---- input -----------------------------------------------------------------------------------------------

    def drag(self, start: tuple[float, float], end: tuple[float, float]) -> None:
        """Press the left mouse button at ``start``, move to ``end`` in a few steps, release: a text selection."""
        self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": start[0], "y": start[1]}, session=True)
        self.send("Input.dispatchMouseEvent", {"type": "mousePressed", "x": start[0], "y": start[1], "button": "left",
                                               "buttons": 1, "clickCount": 1}, session=True)
        for step in (0.33, 0.66, 1.0):
            x, y = start[0] + (end[0] - start[0]) * step, start[1] + (end[1] - start[1]) * step
            self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y, "button": "left", "buttons": 1},
                      session=True)
        self.send("Input.dispatchMouseEvent", {"type": "mouseReleased", "x": end[0], "y": end[1], "button": "left",
                                               "buttons": 0, "clickCount": 1}, session=True)

    def press(self, key: str, ctrl: bool = False) -> None:
        """A key press as a person makes it (keyDown with its text, then keyUp)."""
        code, key_code = _KEYS[key] if key in _KEYS else (f"Key{key.upper()}", ord(key.upper()))
        down: dict[str, Any] = {"type": "keyDown", "key": key, "code": code, "windowsVirtualKeyCode": key_code,
                                "modifiers": 2 if ctrl else 0}
        if len(key) == 1 and not ctrl:
            down["text"] = key
        self.send("Input.dispatchKeyEvent", down, session=True)
        self.send("Input.dispatchKeyEvent", {"type": "keyUp", "key": key, "code": code, "windowsVirtualKeyCode": key_code,
                                             "modifiers": 2 if ctrl else 0}, session=True)

    def type_text(self, text: str) -> None:
        self.send("Input.insertText", {"text": text}, session=True)

    # ---- lifetime --------------------------------------------------------------------------------------------

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass
        self._profile.cleanup()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
