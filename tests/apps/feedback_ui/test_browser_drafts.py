"""The page keeps what a person typed and marked, in a real headless Chromium against the real command.

One session (a module fixture): a page on another origin tries to lease items; then mark the SECOND "Oslo" (the page warns that the text occurs twice), mark and
remove another span and undo the removal, type a critique, reload (the unload guard asks; the draft comes back),
skip and come back (the draft comes back again), submit from the critique box, then meet a response with a
right-to-left override and an empty response, and finally a server that was killed.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
import urllib.request

import pytest

from tests.apps.feedback_ui.cdp import Browser
from tests.apps.feedback_ui.fbui_testlib import ITEMS, Server, read_records, write_items

RESPONSE_A = ITEMS[0]["response"]
SECOND_OSLO = RESPONSE_A.rindex("Oslo")
HOSTILE = [
    ITEMS[0],
    {"id": "rlo", "prompt": "Name the file.", "response": "The file is invoice\u202egnp.exe for you."},
    {"id": "empty", "prompt": "Say nothing.", "response": ""},
]
SHOWN_ID = "document.getElementById('item-id').textContent"
STATUS = "document.getElementById('status').textContent"
MARKS = "[...document.querySelectorAll('#response mark')].map(m => [m.className, m.textContent])"

# A page on another origin (another port of 127.0.0.1) that tries to lease every item for three annotators.
ATTACK = """<!DOCTYPE html><html><body>
<img src="{base}/api/next?annotator=alice"><img src="{base}/api/next?annotator=bob">
<script>
window.results = [];
for (const who of ["alice", "bob", "dave"]) {{
  for (const type of ["text/plain", "application/json"]) {{
    fetch("{base}/api/next", {{method: "POST", mode: type === "text/plain" ? "no-cors" : "cors",
                              headers: {{"Content-Type": type}}, body: JSON.stringify({{annotator: who}})}})
      .then(() => results.push("answered"), () => results.push("blocked"));
  }}
}}
</script></body></html>"""

# Select the LAST occurrence of a quote in the response's text nodes (the Selection API, as Shift+arrows would).
SELECT_LAST = """(() => {{
  const nodes = [...document.getElementById('response').childNodes].filter(n => n.nodeType === 3 && n.data.includes({quote}));
  const node = nodes[nodes.length - 1];
  const at = node.data.lastIndexOf({quote});
  const range = document.createRange(); range.setStart(node, at); range.setEnd(node, at + {length});
  const selection = window.getSelection(); selection.removeAllRanges(); selection.addRange(range);
  return selection.toString();
}})()"""


def _select_last(browser: Browser, quote: str) -> str:
    return browser.evaluate(SELECT_LAST.format(quote=json.dumps(quote), length=len(quote.encode("utf-16-le")) // 2))


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("feedback_ui_drafts")
    data = write_items(root / "items.jsonl", HOSTILE)
    output = root / "out.jsonl"
    server = Server("--dataset_path", str(data), "--output", str(output), "--annotator", "alice",
                    "--annotations_per_item", "2")
    (root / "attack").mkdir()
    (root / "attack" / "index.html").write_text(ATTACK.format(base=server.base))
    attacker = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root / "attack")))
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    seen: dict = {}
    try:
        with Browser() as browser:
            browser.goto(f"http://127.0.0.1:{attacker.server_address[1]}/index.html")
            browser.wait_for("window.results.length === 6 && [...document.images].every(i => i.complete)")
            request = urllib.request.Request(server.base + "/api/next", data=json.dumps({"annotator": "erin"}).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as answer:  # had the attack leased, a would be taken twice
                seen["erin_after_attack"] = json.loads(answer.read())["item"]["id"]
            browser.goto(server.url)
            browser.wait_for(f"{SHOWN_ID} === 'a'")
            _select_last(browser, "Oslo")
            browser.press("p")
            seen["repeat_warning"] = browser.evaluate(STATUS)
            _select_last(browser, "for a job")
            browser.press("g")
            browser.evaluate("document.querySelector('#response mark.good').click()")  # one click removes a mark
            seen["after_click"] = browser.evaluate(MARKS)
            browser.press("u")
            seen["after_undo"] = browser.evaluate(MARKS)
            browser.press("c")
            browser.type_text("Draft: the second Oslo is wrong.")
            browser.press("Escape")
            seen["dialogs"] = browser.reload_answering_dialogs()
            browser.wait_for(f"{SHOWN_ID} === 'a'")
            seen["after_reload"] = {"marks": browser.evaluate(MARKS), "status": browser.evaluate(STATUS),
                                    "critique": browser.evaluate("document.getElementById('critique').value")}
            browser.press("]")
            browser.wait_for(f"{SHOWN_ID} === 'rlo'")
            browser.press("[")
            browser.wait_for(f"{SHOWN_ID} === 'a'")
            seen["after_back"] = {"marks": browser.evaluate(MARKS), "status": browser.evaluate(STATUS),
                                  "critique": browser.evaluate("document.getElementById('critique').value")}
            browser.press("c")
            browser.type_text(" Final.")
            browser.press("Enter", ctrl=True)
            browser.wait_for(f"{SHOWN_ID} === 'rlo'")
            seen["focus_after_submit"] = browser.evaluate("document.activeElement.tagName")
            seen["draft_left"] = browser.evaluate("Object.keys(localStorage).filter(k => k.startsWith('text2grad-draft'))")
            seen["rlo"] = browser.evaluate("""({
                text: document.getElementById('response').textContent,
                tags: [...document.querySelectorAll('#response .hidden-char')].map(t => t.dataset.code),
                shown: getComputedStyle(document.querySelector('#response .hidden-char'), '::before').content,
                warning: document.getElementById('item-warning').textContent,
            })""")
            browser.press("g")  # focus left the critique box: shortcuts work at once (nothing selected: a hint)
            seen["shortcut_after_submit"] = browser.evaluate(STATUS)
            browser.press("]")
            browser.wait_for(f"{SHOWN_ID} === 'empty'")
            seen["empty"] = browser.evaluate("""({
                warning: document.getElementById('item-warning').textContent,
                placeholder: getComputedStyle(document.getElementById('response'), '::before').content,
            })""")
            server.kill()
            browser.press("]")
            seen["server_down"] = browser.wait_for("document.querySelector('#status.error') && " + STATUS)
    finally:
        attacker.shutdown()
        if server.process.poll() is None:
            server.stop()
    seen["records"] = read_records(output)
    return seen


def test_a_page_on_another_origin_leases_nothing(session):
    """Its <img> GETs and no-cors POSTs reach the server and are refused; its JSON POSTs are stopped by the browser."""
    assert session["erin_after_attack"] == "a"  # both places on the first item were still free


def test_a_repeated_quote_is_flagged_and_the_marked_occurrence_is_recorded(session):
    assert "occurs 2 times" in session["repeat_warning"] and "occurrence 2" in session["repeat_warning"]
    (record,) = session["records"]
    assert record["span_offsets"][1] == {"start": SECOND_OSLO, "end": SECOND_OSLO + 4, "label": "poor", "text": "Oslo"}


def test_undo_brings_back_a_mark_removed_by_one_click(session):
    assert session["after_click"] == [["poor", "Oslo"]]
    assert session["after_undo"] == [["good", "for a job"], ["poor", "Oslo"]]


def test_a_draft_survives_reload_and_skip_and_is_cleared_by_submitting(session):
    assert session["dialogs"] == ["beforeunload"]  # the unload guard asked before the reload
    for moment in ("after_reload", "after_back"):
        shown = session[moment]
        assert shown["marks"] == [["good", "for a job"], ["poor", "Oslo"]], moment
        assert shown["critique"] == "Draft: the second Oslo is wrong.", moment
        assert "Restored your unsaved draft" in shown["status"], moment
    (record,) = session["records"]
    assert record["critique"] == "Draft: the second Oslo is wrong. Final."
    assert record["good_spans"] == ["for a job"] and record["poor_spans"] == ["Oslo"]
    assert session["draft_left"] == []


def test_focus_leaves_the_critique_box_after_submitting(session):
    assert session["focus_after_submit"] != "TEXTAREA"
    assert "Select some text in the response first" in session["shortcut_after_submit"]


def test_invisible_and_direction_characters_are_revealed_and_an_empty_response_is_named(session):
    rlo = session["rlo"]
    assert rlo["text"] == HOSTILE[1]["response"]  # every character still there (offsets unchanged)
    assert rlo["tags"] == ["U+202E"] and "U+202E" in rlo["shown"] and "invisible" in rlo["warning"]
    assert "response is empty" in session["empty"]["warning"] and "empty response" in session["empty"]["placeholder"]


def test_a_stopped_server_is_named_not_failed_to_fetch(session):
    assert "Cannot reach the feedback server" in session["server_down"] and "draft is kept" in session["server_down"]
