"""The web app's safety rules, in process (Starlette's test client): token, Host check, JSON-only POSTs, CSP,
and a page script that never parses item text as HTML."""

from __future__ import annotations

import re
import socket

import pytest
from starlette.testclient import TestClient

from tests.apps.feedback_ui.fbui_testlib import ITEMS

from text2grad.apps.feedback_ui.cli import resolve_token
from text2grad.apps.feedback_ui.feedback_ui_config import FeedbackUIConfig, is_loopback
from text2grad.apps.feedback_ui.server import MAX_BODY_BYTES, STATIC_DIR, bind_socket, create_app
from text2grad.apps.feedback_ui.store import FeedbackStore

TOKEN = "s3cret-token-for-tests-only"


@pytest.fixture
def store(tmp_path):
    store = FeedbackStore(ITEMS, tmp_path / "out.jsonl", tmp_path / "out.jsonl.skipped.jsonl")
    yield store
    store.close()


def test_with_a_token_every_api_call_needs_it(store):
    client = TestClient(create_app(store, access_token=TOKEN), base_url="http://127.0.0.1:8765")
    assert client.post("/api/next", json={"annotator": "alice"}).status_code == 401
    assert client.post("/api/next", json={"annotator": "alice"}, headers={"x-access-token": "wrong"}).status_code == 401
    answer = client.post("/api/next", json={"annotator": "alice"}, headers={"x-access-token": TOKEN})
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


def test_state_changing_requests_are_posts_and_cross_site_ones_are_refused(store):
    """An <img src=http://127.0.0.1:PORT/api/next?annotator=alice> on another site must not lease anything."""
    client = TestClient(create_app(store), base_url="http://127.0.0.1:8765")
    assert client.get("/api/next", params={"annotator": "alice"}).status_code == 405
    for headers in ({"sec-fetch-site": "cross-site"}, {"sec-fetch-site": "same-site"},
                    {"origin": "http://evil.example"}, {"origin": "null"}, {"origin": "http://127.0.0.1:9999"}):
        answer = client.post("/api/next", json={"annotator": "alice"}, headers=headers)
        assert answer.status_code == 403 and "refused" in answer.json()["error"], headers
    assert store.leases == {}  # nothing was leased by the refused requests
    own = client.post("/api/next", json={"annotator": "alice"},
                      headers={"sec-fetch-site": "same-origin", "origin": "http://127.0.0.1:8765"})
    assert own.status_code == 200 and own.json()["item"]["id"] == "a"
    # behind an HTTPS proxy the page's origin is https://; the browser still says same-origin
    proxied = client.post("/api/next", json={"annotator": "bob"},
                          headers={"sec-fetch-site": "same-origin", "origin": "https://127.0.0.1:8765"})
    assert proxied.status_code == 200


def test_oversized_and_deeply_nested_bodies_are_refused_without_writing(store):
    client = TestClient(create_app(store), base_url="http://127.0.0.1:8765")
    client.post("/api/next", json={"annotator": "alice"})
    huge = client.post("/api/submit", json={"annotator": "alice", "id": "a", "critique": "x" * (MAX_BODY_BYTES + 1),
                                            "spans": []})
    assert huge.status_code == 413 and "bytes" in huge.json()["error"]
    long = client.post("/api/submit", json={"annotator": "alice", "id": "a", "critique": "x" * 20001, "spans": []})
    assert long.status_code == 413 and "at most 20000" in long.json()["error"]
    nested = client.post("/api/submit", content=b'{"annotator": "alice", "spans": ' + b"[" * 100000 + b"]" * 100000 + b"}",
                         headers={"content-type": "application/json"})
    assert nested.status_code == 400 and "nests deeper" in nested.json()["error"]
    shallow_but_deep = client.post("/api/submit", json={"annotator": "alice", "id": "a", "critique": "ok",
                                                       "spans": [[[[[[[[[[]]]]]]]]]]})
    assert shallow_but_deep.status_code == 400
    assert not store.output.read_text()


def test_a_critique_with_half_an_emoji_is_refused_with_a_reason(store):
    client = TestClient(create_app(store), base_url="http://127.0.0.1:8765")
    client.post("/api/next", json={"annotator": "alice"})
    answer = client.post("/api/submit", content=b'{"annotator": "alice", "id": "a", "critique": "bad \\ud83d", "spans": []}',
                         headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "unpaired" in answer.json()["error"]
    assert client.post("/api/submit", json={"annotator": "alice", "id": "a", "critique": "fine \U0001F600",
                                            "spans": []}).status_code == 200


def test_per_annotator_tokens_act_for_their_own_id_only(store):
    tokens = {"alice": "alice-token-0123456789abc", "bob": "bob-token-0123456789abcdef"}
    client = TestClient(create_app(store, annotator_tokens=tokens), base_url="http://127.0.0.1:8765")
    assert client.post("/api/next", json={"annotator": "alice"}).status_code == 401  # loopback, but a token is needed
    alice = {"x-access-token": tokens["alice"]}
    assert client.get("/api/session", headers=alice).json()["annotator"] == "alice"
    impersonating = client.post("/api/next", json={"annotator": "bob"}, headers=alice)
    assert impersonating.status_code == 403 and "belongs to 'alice'" in impersonating.json()["error"]
    assert client.post("/api/next", json={}, headers=alice).json()["item"]["id"] == "a"
    saved = client.post("/api/submit", json={"id": "a", "critique": "ok", "spans": []}, headers=alice).json()
    assert saved["record"]["annotator"] == "alice"
    # bob cannot overwrite alice's record by submitting under her id
    overwrite = client.post("/api/submit", json={"annotator": "alice", "id": "a", "critique": "mine now", "spans": []},
                            headers={"x-access-token": tokens["bob"]})
    assert overwrite.status_code == 403
    assert [r["critique"] for r in store.records.values()] == ["ok"]


@pytest.mark.parametrize("host", ["127.0.0.2:8765", "localhost:8765", "[::1]:8765", "127.1.2.3"])
def test_every_loopback_address_is_a_loopback_host(store, host):
    client = TestClient(create_app(store, loopback_only=True), base_url=f"http://{host}")
    assert client.get("/api/session").status_code == 200


def test_waiting_for_held_items_is_not_all_done(store):
    client = TestClient(create_app(store), base_url="http://127.0.0.1:8765")
    for who in ("alice", "bob", "carol", "dave"):
        client.post("/api/next", json={"annotator": who})
    answer = client.post("/api/next", json={"annotator": "erin"}).json()
    assert answer["item"] is None and answer["held_by_others"] == 4
