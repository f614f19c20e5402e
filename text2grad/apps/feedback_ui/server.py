"""The web side of feedback-ui: a Starlette app over a `FeedbackStore`, served by uvicorn.

Routes: ``/`` (the page), ``/static/*`` (its script and style sheet), and a small JSON API under ``/api/``
(``session`` is a GET; ``next``, ``previous``, ``submit``, ``skip``, ``renew`` are POSTs: anything that leases,
records or changes state). Safety, on every response:

- The page is a fixed file; prompts and responses reach it only as JSON and are put into the document as text
  (``textContent``), never parsed as HTML. The Content-Security-Policy allows scripts from this server's own
  ``/static/`` only, so even markup that got into the document could not run an inline script or handler.
- With an access token, every API request must carry it (``X-Access-Token``); the page reads it once from
  the address it was opened with. With per-annotator tokens, the token names the person: a request for any
  other annotator id is refused. Without a token (loopback only), the Host header must name a loopback
  address, so a web page elsewhere cannot reach the server through DNS rebinding.
- Cross-site requests are refused: a browser marks every request with ``Sec-Fetch-Site`` (older ones only
  with ``Origin`` on POSTs); anything but same-origin is answered 403, so another page open in the annotator's browser cannot
  lease items or submit. POSTs must be JSON (which a cross-site form cannot send), at most `MAX_BODY_BYTES`,
  nested at most `MAX_JSON_DEPTH` deep.
- No access log: the printed address may carry the token.
"""

from __future__ import annotations

import json
import secrets
import socket
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from text2grad.apps.feedback_ui.feedback_ui_config import ANNOTATOR_PATTERN, is_loopback
from text2grad.apps.feedback_ui.review import ReviewQueue
from text2grad.apps.feedback_ui.store import FeedbackStore, FeedbackUIError

__all__ = ["STATIC_DIR", "MAX_BODY_BYTES", "MAX_JSON_DEPTH", "create_app", "bind_socket", "serve", "json_depth",
           "is_loopback_host"]

STATIC_DIR = Path(__file__).resolve().parent / "static"
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}

# A submission is a critique (capped by the store) and a few hundred spans: 1 MiB is far above any real one.
MAX_BODY_BYTES = 1 << 20
# The deepest body the API takes is {"spans": [{...}]}: depth 3. Anything much deeper is an attack or a bug.
MAX_JSON_DEPTH = 8

Endpoint = Callable[[Request], Awaitable[Response]]


class RequestRefused(Exception):
    """A request refused before it reaches the store (status and message for the page)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def json_depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def is_loopback_host(host_header: str) -> bool:
    """True when a Host header names this machine: localhost or a loopback address (127.0.0.0/8, ::1), any port."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1:host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":")[0]
    return is_loopback(host)


def check_same_origin(request: Request) -> None:
    """Refuse what another site's page makes the browser send (`RequestRefused` 403).

    ``Sec-Fetch-Site`` (sent by every current browser) decides; only where it is absent is ``Origin`` compared
    with the Host the request was sent to (host and port: behind an HTTPS proxy the scheme differs).
    """
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        if site not in ("same-origin", "none"):
            raise RequestRefused(403, f"cross-site request refused (Sec-Fetch-Site: {site}); use the page this "
                                      "server serves")
        return
    origin = request.headers.get("origin")
    if origin is not None and origin.split("://", 1)[-1].lower() != request.headers.get("host", "").lower():
        raise RequestRefused(403, f"request from another origin ({origin}) refused; use the page this server serves")


async def read_json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object, refused when it is not JSON, too large, too deep or not an object."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise RequestRefused(415, "send JSON (Content-Type: application/json)")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestRefused(413, f"the request is {int(declared)} bytes; at most {MAX_BODY_BYTES} are accepted "
                                  "(shorten the critique)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise RequestRefused(413, f"the request is over {MAX_BODY_BYTES} bytes; shorten the critique")
    try:
        params = json.loads(body)
    except RecursionError:
        raise RequestRefused(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError:
        raise RequestRefused(400, "the request body is not valid JSON") from None
    if not isinstance(params, dict):
        raise RequestRefused(400, "the request body must be a JSON object")
    if json_depth(params) > MAX_JSON_DEPTH:
        raise RequestRefused(400, f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
    return params


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(
    store: FeedbackStore,
    access_token: str | None = None,
    default_annotator: str = "",
    loopback_only: bool = True,
    annotator_tokens: Mapping[str, str] | None = None,
    review: ReviewQueue | None = None,
    reviewer_tokens: Mapping[str, str] | None = None,
) -> Starlette:
    """The app. ``access_token``: one token every API request must carry. ``annotator_tokens``: instead, one token
    per annotator id; a request acts for the id its token names and no other. ``loopback_only``: refuse requests
    whose Host header is not a loopback name (set it when listening on a loopback address). ``review`` and
    ``reviewer_tokens``: the review screen (``/review``) and the tokens that open it, one per reviewer."""
    by_token = {token.encode(): who for who, token in (annotator_tokens or {}).items()}
    reviewers = {token.encode(): who for who, token in (reviewer_tokens or {}).items()}

    def identify(request: Request) -> str | None:
        """The annotator the request's token names (per-annotator tokens), else None; refuses a wrong token."""
        given = request.headers.get("x-access-token", "").encode()
        if by_token:
            # compare against every token so the time taken does not say which one came close
            matches = [who for token, who in by_token.items() if secrets.compare_digest(given, token)]
            if not matches:
                raise RequestRefused(401, "missing or wrong access token: open the address you were given "
                                          "(each annotator has their own)")
            return matches[0]
        if access_token is not None and not secrets.compare_digest(given, access_token.encode()):
            raise RequestRefused(401, "missing or wrong access token: open the address the server printed")
        return None

    def annotator_of(params: dict[str, Any], identity: str | None) -> str:
        value = params.get("annotator")
        if identity is not None:
            if value not in (None, "", identity):
                raise FeedbackUIError(403, f"your access token belongs to {identity!r}, not {value!r}; open your own "
                                           "address to annotate under your id")
            return identity
        if not isinstance(value, str) or not ANNOTATOR_PATTERN.match(value):
            raise FeedbackUIError(400, "choose an annotator id first: 1-64 letters, digits, '.', '_', '@' or '-'")
        return value

    def api(handler: Callable[[str, dict[str, Any]], Any], method: str = "POST", needs_annotator: bool = True) -> Endpoint:
        """Wrap a handler of (annotator, the request's parameters) as an endpoint: query for GET, JSON body for POST."""

        async def endpoint(request: Request) -> Response:
            try:
                check_same_origin(request)
                identity = identify(request)
                params = await read_json_body(request) if method == "POST" else dict(request.query_params)
                who = annotator_of(params, identity) if needs_annotator or params.get("annotator") or identity else ""
                # The store takes a lock and fsyncs: off the event loop, so one slow disk write never stalls the page.
                result = await run_in_threadpool(handler, who, params)
            except (RequestRefused, FeedbackUIError) as exc:
                return _error(exc.status, str(exc))
            return JSONResponse(result, headers={"cache-control": "no-store"})

        return endpoint

    def session(who: str, p: dict[str, Any]) -> dict[str, Any]:
        return {
            "default_annotator": default_annotator,
            "annotator": who if by_token else None,  # fixed by the token: the page does not ask
            "require_critique": store.require_critique,
            "max_critique_chars": store.max_critique_chars,
            "annotations_per_item": store.per_item,
            "lease_s": store.lease_s,
            "progress": store.progress(who) if who else None,
        }

    def next_item(who: str, p: dict[str, Any]) -> dict[str, Any]:
        item = store.next_item(who)
        return {"item": item, "progress": store.progress(who), "held_by_others": 0 if item else store.held_by_others(who)}

    def previous(who: str, p: dict[str, Any]) -> dict[str, Any]:
        return {"item": store.previous(who, p.get("before") or None)}

    def submit(who: str, p: dict[str, Any]) -> dict[str, Any]:
        record = store.submit(who, str(p.get("id", "")), p.get("critique", ""), p.get("spans", []))
        return {"saved": True, "record": record, "progress": store.progress(who)}

    def skip(who: str, p: dict[str, Any]) -> dict[str, Any]:
        store.skip(who, str(p.get("id", "")))
        return {"skipped": True, "progress": store.progress(who)}

    def renew(who: str, p: dict[str, Any]) -> dict[str, Any]:
        return {"held": store.renew(who, str(p.get("id", "")))}

    async def page(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "index.html", headers={"cache-control": "no-store"})

    async def review_page(request: Request) -> Response:
        return FileResponse(STATIC_DIR / "review.html", headers={"cache-control": "no-store"})

    def review_api(handler: Callable[[str, dict[str, Any]], Any]) -> Endpoint:
        """An endpoint of the review screen: a reviewer's own token names the reviewer."""

        async def endpoint(request: Request) -> Response:
            try:
                check_same_origin(request)
                if review is None or not reviewers:
                    raise RequestRefused(403, "no reviewers are set up: start the server with --reviewers <ids>")
                given = request.headers.get("x-access-token", "").encode()
                matches = [who for token, who in reviewers.items() if secrets.compare_digest(given, token)]
                if not matches:
                    raise RequestRefused(401, "missing or wrong reviewer token: open the review address you were given")
                params = await read_json_body(request)
                result = await run_in_threadpool(handler, matches[0], params)
            except (RequestRefused, FeedbackUIError) as exc:
                return _error(exc.status, str(exc))
            return JSONResponse(result, headers={"cache-control": "no-store"})

        return endpoint

    def review_next(who: str, p: dict[str, Any]) -> dict[str, Any]:
        assert review is not None
        return {"reviewer": who, "item": review.next_item(who, p.get("after") or None), "progress": review.progress()}

    def review_submit(who: str, p: dict[str, Any]) -> dict[str, Any]:
        assert review is not None
        record = review.submit(who, str(p.get("id", "")), p.get("critique", ""), p.get("spans", []))
        return {"saved": True, "record": record, "progress": review.progress()}

    routes = [
        Route("/", page),
        Route("/review", review_page),
        Route("/api/review/next", review_api(review_next), methods=["POST"]),
        Route("/api/review/submit", review_api(review_submit), methods=["POST"]),
        Route("/api/session", api(session, "GET", needs_annotator=False)),
        Route("/api/next", api(next_item), methods=["POST"]),
        Route("/api/previous", api(previous), methods=["POST"]),
        Route("/api/submit", api(submit), methods=["POST"]),
        Route("/api/skip", api(skip), methods=["POST"]),
        Route("/api/renew", api(renew), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
    middleware = [Middleware(SecurityHeaders)]
    if loopback_only:
        middleware.append(Middleware(LoopbackHostOnly))
    return Starlette(routes=routes, middleware=middleware)


class LoopbackHostOnly:
    """ASGI middleware refusing (400) HTTP requests whose Host header is not a loopback name: a page on another site
    cannot reach a loopback-only server by pointing its own domain name at 127.0.0.1 (DNS rebinding)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if not is_loopback_host(host):
                response = JSONResponse({"error": f"this server answers only to a loopback address, not {host!r}"},
                                        status_code=400)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


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
