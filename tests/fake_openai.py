"""A real HTTP server on loopback that speaks OpenAI chat-completions (and completions), scripted per request.

Tests point the real ``openai`` client (or a CLI's ``--base_url``) at it and script what each request gets::

    from tests.fake_openai import FakeOpenAIServer, Reply

    def handler(body: dict, n: int) -> Reply:
        if n == 0:
            return Reply(status=429, headers={"Retry-After": "0.1"})
        return Reply(content='Good.\\n{"good_spans": ["x"], "poor_spans": []}')

    with FakeOpenAIServer(handler) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test-key")
        ...
        assert len(server.requests) == 2

``handler(body, n)`` gets the request's JSON body and its arrival index (0, 1, ...; counted across all
threads) and returns a `Reply` (a plain ``str`` is shorthand for ``Reply(content=str)``). Replies can carry
any status with headers (``Retry-After``), a delay before answering, or ``drop=True`` to close the
connection without answering. A handler that raises gets a 500 answer and the exception is kept in
``server.errors`` so a test can assert its script had no bug.

The server is threaded (one thread per connection, keep-alive supported), so concurrent clients really run
concurrently and a per-request delay models API latency. Closing the server cuts pending delays short.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

__all__ = ["FakeOpenAIServer", "Reply", "chat_completion", "quoting_handler", "response_of"]


@dataclass
class Reply:
    """What the fake server answers to one request.

    Attributes:
        content: the assistant message text (for status 200), or the error message (other statuses).
        status: HTTP status code.
        headers: extra response headers, e.g. ``{"Retry-After": "1"}``.
        delay_s: seconds to wait before answering (or before dropping).
        drop: close the connection without sending any response.
        prompt_tokens / completion_tokens: reported in ``usage``.
        usage: send the ``usage`` object at all (``False`` models servers that report none).
        body: send this JSON-able object (or raw ``str``) instead of the standard response body.
    """

    content: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    drop: bool = False
    prompt_tokens: int = 10
    completion_tokens: int = 10
    body: Any = None
    usage: bool = True


Handler = Callable[[dict, int], "Reply | str"]


def chat_completion(content: str, model: str, prompt_tokens: int, completion_tokens: int, usage: bool = True) -> dict:
    """The OpenAI chat-completions response object for one assistant message (without ``usage`` if not ``usage``)."""
    payload = {
        "id": f"chatcmpl-fake-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    if not usage:
        del payload["usage"]
    return payload


def _error_body(status: int, message: str) -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error"}.get(status, "server_error")
    return {"error": {"message": message or f"fake error {status}", "type": kind, "param": None, "code": str(status)}}


class FakeOpenAIServer:
    """Context manager running the scripted server on ``127.0.0.1`` at a free port.

    Attributes:
        base_url: ``"http://127.0.0.1:<port>/v1"`` for ``openai.OpenAI(base_url=...)``.
        requests: the JSON bodies received, in arrival order.
        request_headers: the headers of each request (lower-cased names), same order.
        paths: the request path (with query string) of each request, same order.
        errors: tracebacks of handler exceptions (each answered with a 500).
    """

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 0) -> None:
        self.handler = handler
        self.requests: list[dict] = []
        self.request_headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._count = 0
        self._httpd = ThreadingHTTPServer((host, port), self._request_handler_class())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "FakeOpenAIServer":
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------------

    def _next(self, body: dict, headers: dict[str, str], path: str = "") -> Reply:
        with self._lock:
            n = self._count
            self._count += 1
            self.requests.append(body)
            self.request_headers.append(headers)
            self.paths.append(path)
        try:
            reply = self.handler(body, n)
        except Exception:  # a bug in the test's script: answer 500 and keep the traceback
            self.errors.append(traceback.format_exc())
            return Reply(status=500, content="fake server handler raised")
        return Reply(content=reply) if isinstance(reply, str) else reply

    def _request_handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like the real API

            def log_message(self, format: str, *args: Any) -> None:  # quiet test output
                pass

            def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                data = payload if isinstance(payload, (bytes, str)) else json.dumps(payload)
                raw = data.encode("utf-8") if isinstance(data, str) else data
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for k, v in (headers or {}).items():
                    self.send_header(k, str(v))
                self.end_headers()
                self.wfile.write(raw)
                self.wfile.flush()

            def _route(self) -> str:
                return self.path.split("?", 1)[0].rstrip("/")

            def do_GET(self) -> None:
                if self._route().endswith("/models"):
                    self._send_json(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
                else:
                    self._send_json(404, _error_body(404, f"no route {self.path}"))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if not self._route().endswith("/completions"):  # chat completions, or (legacy) completions
                    self._send_json(404, _error_body(404, f"no route {self.path}"))
                    return
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    self._send_json(400, _error_body(400, "request body is not JSON"))
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = server._next(body, headers, self.path)
                if reply.delay_s > 0 and server._closing.wait(reply.delay_s):
                    self.close_connection = True
                    return
                if reply.drop:
                    # Close without a byte of response: the client sees a dropped connection.
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                if reply.body is not None:
                    self._send_json(reply.status, reply.body, reply.headers)
                elif reply.status == 200:
                    model = str(body.get("model", "fake-model"))
                    payload = chat_completion(reply.content, model, reply.prompt_tokens, reply.completion_tokens, reply.usage)
                    if not self._route().endswith("/chat/completions"):  # a completions request: the text form
                        message = payload["choices"][0].pop("message")
                        payload["choices"][0]["text"] = message["content"]
                        payload["object"] = "text_completion"
                    self._send_json(200, payload, reply.headers)
                else:
                    self._send_json(reply.status, _error_body(reply.status, reply.content), reply.headers)

        return _Handler


# --------------------------------------------------------------------------------------------------
# A scripted annotator for smoke runs and benchmarks
# --------------------------------------------------------------------------------------------------

_RESPONSE_BLOCK = re.compile(r"<response>\n(.*?)\n</response>", re.DOTALL)


def response_of(body: dict) -> str:
    """The text of the first <response>...</response> block (tags on their own lines) in the request's user
    messages (annotation prompts put the response there; a retry's follow-up message has none), or ""."""
    for message in body.get("messages", []):
        if message.get("role") == "user":
            found = _RESPONSE_BLOCK.search(str(message.get("content", "")))
            if found:
                return found.group(1)
    return ""


def quoting_handler(body: dict, n: int) -> Reply:
    """A deterministic annotator: praises the response's first line and faults its last line (exact quotes),
    after a line of 'reasoning', in the chain-of-thought answer format."""
    lines = [ln.strip() for ln in response_of(body).splitlines() if ln.strip()]
    good = [lines[0][:60].strip()] if lines else []
    poor = [lines[-1][-40:].strip()] if len(lines) > 1 else []
    answer = {"critique": "The opening is on point; the ending is weak.", "good_spans": good, "poor_spans": poor}
    prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
    content = "Reasoning: scripted offline annotator.\n" + json.dumps(answer)
    return Reply(content=content, prompt_tokens=max(1, prompt_chars // 4), completion_tokens=max(1, len(content) // 4))


def main(argv: list[str] | None = None) -> int:
    """Serve `quoting_handler` until killed: ``python tests/fake_openai.py --port_file F [--delay_s 0.2]``.

    Writes the base URL to --port_file once listening (scripts read it to set --base_url).
    """
    parser = argparse.ArgumentParser(description="Serve a scripted OpenAI-compatible annotator on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port_file", required=True, help="file to write the base URL to once listening")
    parser.add_argument("--delay_s", type=float, default=0.0, help="latency added to every answer")
    args = parser.parse_args(argv)

    def handler(body: dict, n: int) -> Reply:
        reply = quoting_handler(body, n)
        reply.delay_s = args.delay_s
        return reply

    server = FakeOpenAIServer(handler, port=args.port).start()
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(server.base_url + "\n")
    os.replace(tmp, args.port_file)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
