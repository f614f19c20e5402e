"""Suggested critiques, the review screen and a hostile page, in a real headless Chromium against the real command.

One session (a module fixture): alice opens her own address, finds the LLM critic's critique as a draft, removes one of its marks and submits;
bob submits through the API; carol opens the review screen with her token, sees both annotations with their
disagreement outlined, adds a mark, rewrites the critique and saves the adjudication. Then --agreement reports
how the critic's suggestions fared.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.apps.feedback_ui.cdp import Browser
from tests.apps.feedback_ui.fbui_testlib import ITEMS, Server, read_records, write_items

from text2grad.apps.feedback_ui import main

RESPONSE_A = ITEMS[0]["response"]  # "Alex 😀 moved to Oslo for a job. Oslo is cold."
SUGGESTED = {**ITEMS[0], "critique": "The city is wrong.", "good_spans": ["for a job"], "poor_spans": ["Oslo"],
             "source": "llm:critic-7b"}
SHOWN_ID = "document.getElementById('item-id').textContent"
MARKS = "[...document.querySelectorAll('#response mark')].map(m => [m.className, m.textContent])"
def _post(base: str, path: str, body: dict, token: str) -> dict:
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "X-Access-Token": token})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def _select_last(browser: Browser, quote: str) -> str:
    return browser.evaluate(f"""(() => {{
      const nodes = [...document.getElementById('response').childNodes].filter(n => n.nodeType === 3 && n.data.includes({json.dumps(quote)}));
      const node = nodes[nodes.length - 1];
      const at = node.data.lastIndexOf({json.dumps(quote)});
      const range = document.createRange(); range.setStart(node, at); range.setEnd(node, at + {len(quote)});
      const selection = window.getSelection(); selection.removeAllRanges(); selection.addRange(range);
      return selection.toString();
    }})()""")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("feedback_ui_review")
    data = write_items(root / "items.jsonl", [SUGGESTED, ITEMS[3]])
    output = root / "out.jsonl"
    server = Server("--dataset_path", str(data), "--output", str(output), "--annotators", "alice,bob",
                    "--reviewers", "carol", "--annotations_per_item", "2")
    tokens = json.loads((root / "out.jsonl.tokens.json").read_text())
    seen: dict = {}
    try:
        with Browser() as browser:
            alice = tokens["annotators"]["alice"]
            browser.goto(alice["address"])
            browser.wait_for(f"{SHOWN_ID} === 'a'")
            seen["suggested"] = {"state": browser.evaluate("document.getElementById('item-state').textContent"),
                                 "marks": browser.evaluate(MARKS),
                                 "critique": browser.evaluate("document.getElementById('critique').value"),
                                 "who": browser.evaluate("document.getElementById('annotator').disabled")}
            browser.evaluate("[...document.querySelectorAll('#response mark.poor')].pop().click()")  # the second Oslo
            browser.press("Enter", ctrl=True)
            browser.wait_for(f"{SHOWN_ID} === 'd'")
            first = RESPONSE_A.index("Oslo") + 1  # UTF-16: the emoji before it counts 2
            _post(server.base, "/api/next", {}, tokens["annotators"]["bob"]["token"])
            _post(server.base, "/api/submit", {"id": "a", "critique": "City wrong.",
                                               "spans": [{"start": first, "end": first + 4, "label": "poor"}]},
                  tokens["annotators"]["bob"]["token"])
            browser.goto(tokens["reviewers"]["carol"]["address"])
            browser.wait_for(f"{SHOWN_ID} === 'a'")
            seen["review"] = browser.evaluate("""({
                annotators: [...document.querySelectorAll('.annotation h3')].map(h => h.textContent),
                critiques: [...document.querySelectorAll('.annotation .critique')].map(p => p.textContent),
                outlined: [...document.querySelectorAll('.annotation .disagree')].map(e => e.textContent),
                draft: [...document.querySelectorAll('#response mark')].map(m => [m.className, m.textContent]),
                address: window.location.href,
            })""")
            _select_last(browser, "cold")
            browser.press("p")
            browser.evaluate("document.getElementById('critique').focus(); document.getElementById('critique').select()")
            browser.type_text("The city is wrong (Berlin), and Oslo is not cold in the post.")
            browser.press("Enter", ctrl=True)
            browser.wait_for("!document.getElementById('finished').hidden")
    finally:
        seen["exit_code"] = server.stop()
    seen["records"] = read_records(output)
    seen["adjudicated"] = read_records(root / "out.jsonl.adjudicated.jsonl")
    seen["output"] = output
    return seen


def test_a_suggested_critique_opens_as_a_draft_and_the_record_keeps_what_changed(session):
    shown = session["suggested"]
    assert "suggested by llm:critic-7b" in shown["state"] and shown["who"] is True  # the token fixed the id
    assert shown["marks"] == [["poor", "Oslo"], ["good", "for a job"], ["poor", "Oslo"]]
    assert shown["critique"] == "The city is wrong."
    alice = session["records"][0]
    assert alice["suggestion"]["critic"] == "llm:critic-7b" and len(alice["suggestion"]["spans"]) == 3
    assert alice["changes"] == {"kept": 2, "removed": 1, "added": 0, "critique_edited": False}
    first = RESPONSE_A.index("Oslo")
    assert [(s["start"], s["label"]) for s in alice["span_offsets"]] == [(first, "poor"), (RESPONSE_A.index("for a job"), "good")]


def test_the_reviewer_adjudicates_a_disagreement_in_the_browser(session):
    review = session["review"]
    assert review["annotators"] == ["alice", "bob"] and review["critiques"] == ["The city is wrong.", "City wrong."]
    assert "for a job" in review["outlined"]  # alice marked it good, bob did not
    assert review["draft"] == [["poor", "Oslo"]]  # the draft starts from what both marked
    assert "token" not in review["address"]
    (record,) = session["adjudicated"]
    assert record["annotator"] == "carol" and record["source"] == "human"
    assert record["meta"]["adjudicated_from"] == ["alice", "bob"]
    assert record["critique"] == "The city is wrong (Berlin), and Oslo is not cold in the post."
    assert record["poor_spans"] == ["Oslo", "cold"] and record["good_spans"] == []


def test_agreement_reports_how_the_critics_suggestions_fared(session, capsys):
    assert main(["--output", str(session["output"]), "--agreement", "true"]) == 0
    out = capsys.readouterr().out
    # alice kept 2 of 3 and edited nothing; bob kept 1 (the first Oslo), removed 2 and rewrote the critique
    assert "llm:critic-7b: 2 records, 6 spans suggested: 3 kept, 3 removed, 0 added; kept rate 0.500, recall 1.000; " \
           "critique edited in 1 of 2" in out
