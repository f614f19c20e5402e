"""The web side of feedback-ui: a Starlette app over a `FeedbackStore`, served by uvicorn.

Routes: ``/`` (the page), ``/static/*`` (its script and style sheet), and a small JSON API under ``/api/``
(``session``, ``next``, ``previous``, ``submit``, ``skip``, ``renew``). Safety, on every response:

- The page is a fixed file; prompts and responses reach it only as JSON and are put into the document as text
  (``textContent``), never parsed as HTML. The Content-Security-Policy allows scripts from this server's own
  ``/static/`` only, so even markup that got into the document could not run an inline script or handler.
- With an access token, every API request must carry it (``X-Access-Token``); the page reads it once from
  the address it was opened with. Without a token (loopback only), the Host header must name a loopback
  address, so a web page elsewhere cannot reach the server through DNS rebinding; POSTs must be JSON, which a
  cross-site form cannot send.
- No access log: the printed address may carry the token.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path
from typing import Any, Awaitable, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from text2grad.apps.feedback_ui.feedback_ui_config import ANNOTATOR_PATTERN
from text2grad.apps.feedback_ui.store import FeedbackStore, FeedbackUIError

__all__ = ["STATIC_DIR", "create_app", "bind_socket", "serve"]

STATIC_DIR = Path(__file__).resolve().parent / "static"
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}

Endpoint = Callable[[Request], Awaitable[Response]]


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(
    store: FeedbackStore,
    access_token: str | None = None,
    default_annotator: str = "",
    loopback_only: bool = True,
) -> Starlette:
    """The app. ``access_token``: required on every API request when set. ``loopback_only``: refuse requests whose
    Host header is not a loopback name (set it when listening on a loopback address)."""

    def annotator_of(value: Any) -> str:
        if not isinstance(value, str) or not ANNOTATOR_PATTERN.match(value):
            raise FeedbackUIError(400, "choose an annotator id first: 1-64 letters, digits, '.', '_', '@' or '-'")
        return value

    def api(handler: Callable[[dict[str, Any]], Any], method: str = "GET") -> Endpoint:
        """Wrap a handler of the request's parameters (query for GET, JSON body for POST) as an endpoint."""

        async def endpoint(request: Request) -> Response:
            if access_token is not None:
                given = request.headers.get("x-access-token", "")
                if not secrets.compare_digest(given.encode(), access_token.encode()):
                    return _error(401, "missing or wrong access token: open the address the server printed")
            if method == "POST":
                if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
                    return _error(415, "send JSON (Content-Type: application/json)")
                try:
                    params = await request.json()
                except ValueError:
                    return _error(400, "the request body is not valid JSON")
                if not isinstance(params, dict):
                    return _error(400, "the request body must be a JSON object")
            else:
                params = dict(request.query_params)
            try:
                # The store takes a lock and fsyncs: off the event loop, so one slow disk write never stalls the page.
                result = await run_in_threadpool(handler, params)
            except FeedbackUIError as exc:
                return _error(exc.status, str(exc))
            return JSONResponse(result, headers={"cache-control": "no-store"})

        return endpoint

    def session(p: dict[str, Any]) -> dict[str, Any]:
        return {
            "default_annotator": default_annotator,
            "require_critique": store.require_critique,
            "annotations_per_item": store.per_item,
            "lease_s": store.lease_s,
            "progress": store.progress(annotator_of(p["annotator"])) if p.get("annotator") else None,
        }

    def next_item(p: dict[str, Any]) -> dict[str, Any]:
        who = annotator_of(p.get("annotator"))
        return {"item": store.next_item(who), "progress": store.progress(who)}

    def previous(p: dict[str, Any]) -> dict[str, Any]:
        return {"item": store.previous(annotator_of(p.get("annotator")), p.get("before") or None)}

    def submit(p: dict[str, Any]) -> dict[str, Any]:
        who = annotator_of(p.get("annotator"))
        record = store.submit(who, str(p.get("id", "")), p.get("critique", ""), p.get("spans", []))
        return {"saved": True, "record": record, "progress": store.progress(who)}

    def skip(p: dict[str, Any]) -> dict[str, Any]:
        who = annotator_of(p.get("annotator"))
        store.skip(who, str(p.get("id", "")))
        return {"skipped": True, "progress": store.progress(who)}

    def renew(p: dict[str, Any]) -> dict[str, Any]:
        return {"held": store.renew(annotator_of(p.get("annotator")), str(p.get("id", "")))}

    async def page(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers={"cache-control": "no-store"})

    routes = [
        Route("/", page),
        Route("/api/session", api(session)),
        Route("/api/next", api(next_item)),
        Route("/api/previous", api(previous)),
        Route("/api/submit", api(submit, "POST"), methods=["POST"]),
        Route("/api/skip", api(skip, "POST"), methods=["POST"]),
        Route("/api/renew", api(renew, "POST"), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    middleware = [Middleware(SecurityHeaders)]
    if loopback_only:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_HOSTS))
    return Starlette(routes=routes, middleware=middleware)


class SecurityHeaders:
    """ASGI middleware that adds `SECURITY_HEADERS` to every HTTP response (errors from other middleware included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).update(SECURITY_HEADERS)
            await send(message)

        await self.app(scope, receive, send_with_headers)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one, read back with getsockname)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise FeedbackUIError(400, f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port or --host") from None
    # Listening now, before the address is printed: a browser that connects at once waits in the backlog until
    # uvicorn accepts, instead of being refused.
    sock.listen(128)
    return sock


def serve(app: Starlette, sock: socket.socket) -> None:
    """Serve ``app`` on ``sock`` until Ctrl-C / SIGTERM (uvicorn shuts down gracefully, finishing requests)."""
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", server_header=False)
    uvicorn.Server(config).run(sockets=[sock])
