"""The feedback page in a real headless Chromium, driven like a person drives it, against the real command.

One session (a module fixture, ~10 s): select "Oslo" with the mouse and press p, select "for a job" and press g,
click a mark to remove it and mark it again, press c and type the critique, Ctrl+Enter; reload; check that the
<script> response is text; skip with ] and come back with [; annotate two more items. The tests then read what
the page showed and what the server wrote, and train the reward model on that file.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.apps.feedback_ui.cdp import Browser
from tests.apps.feedback_ui.fbui_testlib import ITEMS, Server, read_records, write_items
from tests.reward_model.rm_testlib import train_args

from reward_model.serialization import PLAIN_TEMPLATE, target_text
from reward_model.train import main as train_rm
from text2grad.core.feedback import Feedback
from text2grad.core.modeling import build_tiny_llama, train_tokenizer
from text2grad.core.spans import locate_spans

RESPONSE_A = ITEMS[0]["response"]
SHOWN_ID = "document.getElementById('item-id').textContent"

# Page coordinates of the characters [start, end) (UTF-16 offsets) of the response's first text node.
CHAR_BOX = """(() => {{
  const node = [...document.getElementById('response').childNodes].find(n => n.nodeType === 3 && n.data.includes({quote}));
  const at = node.data.indexOf({quote});
  const first = document.createRange(); first.setStart(node, at); first.setEnd(node, at + 1);
  const last = document.createRange(); last.setStart(node, at + {length} - 1); last.setEnd(node, at + {length});
  const a = first.getBoundingClientRect(), b = last.getBoundingClientRect();
  return [a.left + 1, (a.top + a.bottom) / 2, b.right - 1, (b.top + b.bottom) / 2];
}})()"""

# Select a quote with the Selection API (the keyboard path: a person may also select with Shift+arrows).
SELECT = """(() => {{
  const node = [...document.getElementById('response').childNodes].find(n => n.nodeType === 3 && n.data.includes({quote}));
  const at = node.data.indexOf({quote});
  const range = document.createRange(); range.setStart(node, at); range.setEnd(node, at + {length});
  const selection = window.getSelection(); selection.removeAllRanges(); selection.addRange(range);
  return selection.toString();
}})()"""


def _drag_select(browser: Browser, quote: str) -> str:
    x0, y0, x1, y1 = browser.evaluate(CHAR_BOX.format(quote=json.dumps(quote), length=len(quote.encode("utf-16-le")) // 2))
    browser.drag((x0, y0), (x1, y1))
    return browser.evaluate("window.getSelection().toString()")


def _select(browser: Browser, quote: str) -> str:
    return browser.evaluate(SELECT.format(quote=json.dumps(quote), length=len(quote.encode("utf-16-le")) // 2))


def _marks(browser: Browser) -> list[list[str]]:
    return browser.evaluate("[...document.querySelectorAll('#response mark')].map(m => [m.className, m.textContent])")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("feedback_ui_browser")
    data = write_items(root / "items.jsonl")
    data_before = data.read_bytes()
    output = root / "human_feedback.jsonl"
    server = Server("--dataset_path", str(data), "--output", str(output), "--annotator", "alice")
    seen: dict = {}
    try:
        with Browser() as browser:
            browser.goto(server.url)
            browser.wait_for(f"{SHOWN_ID} === 'a'")
            seen["progress_start"] = browser.evaluate("document.getElementById('progress').textContent")
            # 1. mouse: select the first "Oslo" and mark it poor with the keyboard shortcut
            seen["dragged"] = _drag_select(browser, "Oslo")
            browser.press("p")
            seen["marks_after_p"] = _marks(browser)
            # 2. keyboard path: select "for a job", press g; clicking the mark removes it; mark it again
            _select(browser, "for a job")
            browser.press("g")
            seen["marks_after_g"] = _marks(browser)
            browser.evaluate("document.querySelector('#response mark.good').click()")
            seen["marks_after_click"] = _marks(browser)
            _select(browser, "for a job")
            browser.press("g")
            seen["colours"] = browser.evaluate(
                "[...document.querySelectorAll('#response mark')].map(m => getComputedStyle(m).backgroundColor)")
            # 3. critique: c focuses it, then type; Ctrl+Enter submits from the text box
            browser.press("c")
            browser.type_text("The city is wrong: Alex moved to Berlin. The job is right.")
            browser.press("Enter", ctrl=True)
            browser.wait_for(f"{SHOWN_ID} === 'b'")
            seen["records_after_submit"] = read_records(output)
            # 4. reload: the page resumes at the next item, not the one just done
            browser.reload()
            browser.wait_for(f"{SHOWN_ID} === 'b'")
            seen["after_reload"] = browser.evaluate(SHOWN_ID)
            seen["script_item"] = browser.evaluate("""({
                response: document.getElementById('response').textContent,
                prompt: document.getElementById('prompt').textContent,
                elements: document.querySelectorAll('#response *, #prompt *').length,
                pwned: typeof window.__pwned,
            })""")
            # 5. skip with ], come back with [, skip again; then annotate c and d
            browser.press("]")
            browser.wait_for(f"{SHOWN_ID} === 'c'")
            browser.press("[")
            browser.wait_for(f"{SHOWN_ID} === 'b'")
            seen["back_state"] = browser.evaluate("document.getElementById('item-state').textContent")
            browser.press("]")
            browser.wait_for(f"{SHOWN_ID} === 'c'")
            _select(browser, "return a - b")
            browser.press("p")
            browser.press("c")
            browser.type_text("It subtracts instead of adding.")
            browser.press("Enter", ctrl=True)
            browser.wait_for(f"{SHOWN_ID} === 'd'")
            _drag_select(browser, "compare prices")
            browser.press("g")
            browser.evaluate("document.getElementById('submit').click()")  # without a critique: refused
            seen["refusal"] = browser.wait_for("document.querySelector('#status.error') && "
                                               "document.getElementById('status').textContent")
            browser.press("c")
            browser.type_text("Useful and concrete advice.")
            browser.press("Enter", ctrl=True)
            browser.wait_for("!document.getElementById('finished').hidden")
            seen["progress_end"] = browser.evaluate("document.getElementById('progress').textContent")
    finally:
        seen["exit_code"] = server.stop()
    seen["records"] = read_records(output)
    seen["input_unchanged"] = data.read_bytes() == data_before
    seen["skipped"] = read_records(root / "human_feedback.jsonl.skipped.jsonl")
    seen["output"], seen["root"] = output, root
    return seen


def test_the_span_selected_with_the_mouse_is_recorded_with_its_exact_offsets(session):
    assert session["dragged"] == "Oslo"
    assert session["marks_after_p"] == [["poor", "Oslo"]]
    assert session["marks_after_g"] == [["poor", "Oslo"], ["good", "for a job"]]
    assert session["marks_after_click"] == [["poor", "Oslo"]]  # clicking a mark removes it
    good, poor = sorted(set(session["colours"]))
    assert good != poor  # the two labels are shown in different colours
    (record,) = session["records_after_submit"]  # on disk as soon as the page moved on
    start = RESPONSE_A.index("Oslo")  # the FIRST Oslo, in code points (the browser counted the emoji as 2 units)
    assert record["span_offsets"] == [
        {"start": start, "end": start + 4, "label": "poor", "text": "Oslo"},
        {"start": RESPONSE_A.index("for a job"), "end": RESPONSE_A.index("for a job") + 9, "label": "good", "text": "for a job"},
    ]
    for span in record["span_offsets"]:
        assert RESPONSE_A[span["start"]:span["end"]] == span["text"]
    assert (record["id"], record["response"], record["prompt"]) == ("a", RESPONSE_A, ITEMS[0]["prompt"])
    assert record["critique"] == "The city is wrong: Alex moved to Berlin. The job is right."
    assert (record["good_spans"], record["poor_spans"]) == (["for a job"], ["Oslo"])
    assert record["source"] == "human" and record["annotator"] == "alice"
    assert record["started_at"] <= record["submitted_at"] and record["submitted_at"].endswith("Z")
    assert record["unmatched_spans"] == {"good": [], "poor": []}
    # the quotes ground in the response exactly as every critic's do
    alignment = locate_spans(RESPONSE_A, record["good_spans"], record["poor_spans"], occurrence="first")
    assert alignment.n_unmatched == 0 and not any(s.normalized for s in alignment.spans)


def test_reload_resumes_at_the_next_item_and_skip_and_back_work(session):
    assert session["progress_start"].startswith("0 of 4 done by you")
    assert session["after_reload"] == "b"
    assert session["back_state"] == "(you skipped this)"
    assert [s["id"] for s in session["skipped"]] == ["b", "b"]
    assert "write a critique" in session["refusal"]
    assert [r["id"] for r in session["records"]] == ["a", "c", "d"]
    assert session["progress_end"] == "3 of 4 done by you \u00b7 1 skipped"
    assert session["input_unchanged"]
    c = session["records"][1]
    assert c["poor_spans"] == ["return a - b"] and c["response"] == ITEMS[2]["response"]
    assert session["records"][2]["good_spans"] == ["compare prices"]


def test_a_response_with_script_and_markup_is_shown_as_inert_text(session):
    shown = session["script_item"]
    assert shown["response"] == ITEMS[1]["response"]  # every character, as text
    assert shown["prompt"] == ITEMS[1]["prompt"]
    assert shown["elements"] == 0  # no <script>, <img> or <b> element was created
    assert shown["pwned"] == "undefined"  # and nothing ran


def test_the_server_stops_cleanly_on_ctrl_c(session):
    assert session["exit_code"] in (0, 130)


def test_the_reward_model_trains_on_the_records_the_page_wrote(session):
    """The records go straight into train-rm (tiny Llama, a few LoRA steps) with no conversion."""
    records = session["records"]
    texts = [PLAIN_TEMPLATE.format(instruction="Critique.", prompt=r["prompt"], response=r["response"]) + target_text(
        Feedback.from_dict(r)) for r in records]
    tokenizer = train_tokenizer(texts * 10, vocab_size=300, kind="bpe")
    world = session["root"] / "rm_world"
    torch.manual_seed(0)
    build_tiny_llama(tokenizer, hidden_size=32, num_layers=1, num_heads=2, seed=0).save_pretrained(world / "base")
    tokenizer.save_pretrained(world / "base")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rc = train_rm(train_args(world, world / "rm", dataset_path=session["output"], instruction="Critique.",
                                 max_steps=3, max_length=160))
    finally:
        torch.set_num_threads(before)
    assert rc == 0
    results = json.loads((world / "rm" / "train_results.json").read_text())
    assert results["train_examples"] == len(records) == 3 and results["dropped_too_long"] == 0
    assert results["train_loss"] > 0 and results["train_loss"] == results["train_loss"]  # finite, not NaN


def test_with_an_access_token_the_printed_address_opens_the_page_and_the_token_leaves_the_address_bar(tmp_path):
    data = write_items(tmp_path / "items.jsonl")
    token = "browser-test-token-0123456789"
    server = Server("--dataset_path", str(data), "--output", str(tmp_path / "out.jsonl"), "--annotator", "alice",
                    "--access_token", token)
    try:
        assert server.url.endswith(f"/?token={token}")
        with Browser() as browser:
            browser.goto(server.base + "/")  # without the token: the page says what to do
            refused = browser.wait_for("document.querySelector('#status.error') && document.getElementById('status').textContent")
            browser.goto(server.url)
            browser.wait_for(f"{SHOWN_ID} === 'a'")
            address = browser.evaluate("window.location.href")
    finally:
        server.stop()
    assert "access token" in refused
    assert token not in address and "annotator=alice" in address
