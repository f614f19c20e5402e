"""The web app's safety rules, in process (Starlette's test client): token, Host check, JSON-only POSTs, CSP,
and a page script that never parses item text as HTML."""

from __future__ import annotations

import re
import socket

import pytest
from starlette.testclient import TestClient

from tests.apps.feedback_ui.fbui_testlib import ITEMS

from text2grad.apps.feedback_ui import resolve_token
from text2grad.apps.feedback_ui.feedback_ui_config import FeedbackUIConfig, is_loopback
from text2grad.apps.feedback_ui.server import STATIC_DIR, bind_socket, create_app
from text2grad.apps.feedback_ui.store import FeedbackStore

TOKEN = "s3cret-token-for-tests-only"


@pytest.fixture
def store(tmp_path):
    store = FeedbackStore(ITEMS, tmp_path / "out.jsonl", tmp_path / "out.jsonl.skipped.jsonl")
    yield store
    store.close()


def test_with_a_token_every_api_call_needs_it(store):
    client = TestClient(create_app(store, access_token=TOKEN), base_url="http://127.0.0.1:8765")
    assert client.get("/api/next", params={"annotator": "alice"}).status_code == 401
    assert client.get("/api/next", params={"annotator": "alice"}, headers={"x-access-token": "wrong"}).status_code == 401
    answer = client.get("/api/next", params={"annotator": "alice"}, headers={"x-access-token": TOKEN})
    assert answer.status_code == 200 and answer.json()["item"]["id"] == "a"
    assert client.get("/").status_code == 200  # the page itself holds no data; it reads the token from its address


def test_on_loopback_a_foreign_host_header_is_refused(store):
    client = TestClient(create_app(store, loopback_only=True), base_url="http://127.0.0.1:8765")
    assert client.get("/api/session").status_code == 200
    rebinding = TestClient(create_app(store, loopback_only=True), base_url="http://attacker.example:8765")
    assert rebinding.get("/api/session").status_code == 400


def test_posts_must_be_json_and_errors_say_what_was_wrong(store):
    client = TestClient(create_app(store), base_url="http://127.0.0.1:8765")
    form = client.post("/api/submit", content="annotator=alice&id=a", headers={"content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415  # what a cross-site form could send
    nobody = client.post("/api/submit", json={"id": "a", "critique": "x", "spans": []})
    assert nobody.status_code == 400 and "annotator id" in nobody.json()["error"]
    bad = client.post("/api/submit", json={"annotator": "alice", "id": "a", "critique": "x",
                                           "spans": [{"start": 0, "end": 4, "label": "meh"}]})
    assert bad.status_code == 400 and "label must be 'good' or 'poor'" in bad.json()["error"]
    assert not store.output.read_text()


def test_every_response_carries_a_policy_that_allows_only_our_own_scripts(store):
    client = TestClient(create_app(store), base_url="http://127.0.0.1:8765")
    for path in ("/", "/static/app.js", "/api/session"):
        headers = client.get(path).headers
        policy = headers["content-security-policy"]
        assert "script-src 'self'" in policy and "default-src 'none'" in policy and "unsafe-inline" not in policy
        assert headers["x-content-type-options"] == "nosniff"


def test_the_page_script_never_parses_text_as_html():
    script = (STATIC_DIR / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, sink
    page = (STATIC_DIR / "index.html").read_text()
    assert not re.search(r"<script>|\son[a-z]+=", page)  # no inline script or handler for the CSP to allow


def test_a_token_is_made_when_listening_beyond_this_machine(monkeypatch):
    monkeypatch.delenv("TEXT2GRAD_FEEDBACK_UI_TOKEN", raising=False)
    assert resolve_token(FeedbackUIConfig(host="127.0.0.1")) is None
    made = resolve_token(FeedbackUIConfig(host="0.0.0.0"))
    assert made and len(made) >= 24 and made != resolve_token(FeedbackUIConfig(host="0.0.0.0"))
    monkeypatch.setenv("TEXT2GRAD_FEEDBACK_UI_TOKEN", TOKEN)
    assert resolve_token(FeedbackUIConfig(host="192.168.1.20")) == TOKEN
    assert [is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost", "0.0.0.0", "10.0.0.1")] == \
        [True, True, True, True, False, False]


def test_the_socket_accepts_connections_as_soon_as_the_address_is_printed():
    """The address is printed before uvicorn runs: a browser that connects at once must wait, not be refused."""
    sock = bind_socket("127.0.0.1", 0)
    try:
        socket.create_connection(sock.getsockname(), timeout=2).close()
    finally:
        sock.close()
