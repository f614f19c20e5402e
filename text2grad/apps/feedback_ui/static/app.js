// The feedback page. Prompts and responses are only ever put into the document as text (textContent and text
// nodes), never as HTML. Marks are kept as [start, end) offsets into the response in JavaScript's own unit
// (UTF-16 code units); the server converts them to code points and checks them against its copy.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { annotator: "", token: "", item: null, marks: [], renewTimer: null, busy: false };

function setStatus(message, isError = false) {
  const status = $("status");
  status.textContent = message;
  status.classList.toggle("error", isError);
}

async function api(path, params = {}, method = "GET") {
  const headers = {};
  if (state.token) headers["X-Access-Token"] = state.token;
  let url = "/api/" + path;
  const options = { method, headers };
  if (method === "GET") {
    url += "?" + new URLSearchParams({ annotator: state.annotator, ...params }).toString();
  } else {
    headers["Content-Type"] = "application/json";
    options.body = JSON.stringify({ annotator: state.annotator, ...params });
  }
  const response = await fetch(url, options);
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) throw new Error((body && body.error) || `the server answered ${response.status}`);
  return body;
}

// ---- offsets ------------------------------------------------------------------------------------------------

// UTF-16 offsets of a record's code point offsets (records store code points, the page works in UTF-16).
function utf16Offset(text, codepoints) {
  let units = 0, seen = 0;
  for (const ch of text) {
    if (seen === codepoints) break;
    units += ch.length;
    seen += 1;
  }
  return units;
}

// [start, end) of the current selection inside the response, clipped to it; null when nothing is selected there.
function selectionOffsets() {
  const selection = window.getSelection();
  if (!selection || selection.rangeCount === 0 || selection.isCollapsed) return null;
  const box = $("response");
  const range = selection.getRangeAt(0);
  const whole = document.createRange();
  whole.selectNodeContents(box);
  if (range.compareBoundaryPoints(Range.END_TO_START, whole) >= 0 ||
      range.compareBoundaryPoints(Range.START_TO_END, whole) <= 0) return null;  // entirely outside the response
  const offsetOf = (node, offset) => {
    const before = document.createRange();
    before.selectNodeContents(box);
    before.setEnd(node, offset);
    return before.toString().length;
  };
  const text = state.item.response;
  const start = box.contains(range.startContainer) ? offsetOf(range.startContainer, range.startOffset) : 0;
  const end = box.contains(range.endContainer) ? offsetOf(range.endContainer, range.endOffset) : text.length;
  return trimmed(text, start, end);
}

function trimmed(text, start, end) {
  while (start < end && /\s/.test(text[start])) start += 1;
  while (end > start && /\s/.test(text[end - 1])) end -= 1;
  return start < end ? { start, end } : null;
}

// ---- marks --------------------------------------------------------------------------------------------------

function renderResponse() {
  const box = $("response");
  const text = state.item.response;
  box.replaceChildren();
  state.marks.sort((a, b) => a.start - b.start);
  let at = 0;
  state.marks.forEach((mark, index) => {
    if (mark.start > at) box.appendChild(document.createTextNode(text.slice(at, mark.start)));
    const element = document.createElement("mark");
    element.className = mark.label;
    element.dataset.index = String(index);
    element.title = `${mark.label}: click to remove`;
    element.textContent = text.slice(mark.start, mark.end);
    box.appendChild(element);
    at = mark.end;
  });
  if (at < text.length) box.appendChild(document.createTextNode(text.slice(at)));
  renderMarkList();
}

function renderMarkList() {
  const list = $("marks");
  list.replaceChildren();
  state.marks.forEach((mark, index) => {
    const entry = document.createElement("li");
    entry.className = mark.label;
    const quote = state.item.response.slice(mark.start, mark.end);
    entry.textContent = `${mark.label}: "${quote.length > 60 ? quote.slice(0, 57) + "..." : quote}" `;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.textContent = "\u00d7";
    remove.title = "remove this mark";
    remove.addEventListener("click", () => removeMark(index));
    entry.appendChild(remove);
    list.appendChild(entry);
  });
}

function addMark(label) {
  if (!state.item) return;
  const range = selectionOffsets();
  if (!range) {
    setStatus("Select some text in the response first, then press g (good) or p (poor).", true);
    return;
  }
  const before = state.marks.length;
  state.marks = state.marks.filter((m) => m.end <= range.start || m.start >= range.end);
  const replaced = before - state.marks.length;
  state.marks.push({ start: range.start, end: range.end, label });
  window.getSelection().removeAllRanges();
  renderResponse();
  setStatus(`Marked ${label}: "${state.item.response.slice(range.start, range.end)}"` +
            (replaced ? ` (replaced ${replaced} overlapping mark${replaced > 1 ? "s" : ""})` : ""));
}

function removeMark(index) {
  state.marks.splice(index, 1);
  renderResponse();
  setStatus("Mark removed.");
}

function removeMarksInSelection() {
  const range = selectionOffsets();
  if (!range) {
    setStatus("Select text that overlaps a mark to remove it (or click the mark).", true);
    return;
  }
  const before = state.marks.length;
  state.marks = state.marks.filter((m) => m.end <= range.start || m.start >= range.end);
  window.getSelection().removeAllRanges();
  renderResponse();
  setStatus(`Removed ${before - state.marks.length} mark(s).`);
}

// ---- items --------------------------------------------------------------------------------------------------

function showProgress(progress) {
  if (!progress) return;
  const parts = [`${progress.yours} of ${progress.total} done by you`];
  if (progress.skipped) parts.push(`${progress.skipped} skipped`);
  if (progress.per_item > 1) parts.push(`${progress.complete} of ${progress.total} complete (${progress.per_item} people each)`);
  $("progress").textContent = parts.join(" \u00b7 ");
}

function show(item) {
  state.item = item;
  $("work").hidden = !item;
  $("finished").hidden = Boolean(item);
  if (!item) {
    clearInterval(state.renewTimer);
    return;
  }
  $("item-id").textContent = item.id;
  $("item-position").textContent = `(#${item.position} of ${item.progress.total} in the file)`;
  $("item-state").textContent = item.status === "submitted" ? "(you submitted this; submitting again replaces your record)"
    : item.status === "skipped" ? "(you skipped this)" : "";
  $("prompt").textContent = item.prompt;
  const record = item.record;
  state.marks = record && record.span_offsets ? record.span_offsets.map((s) => ({
    start: utf16Offset(item.response, s.start), end: utf16Offset(item.response, s.end), label: s.label,
  })) : [];
  $("critique").value = record ? record.critique : "";
  renderResponse();
  showProgress(item.progress);
  clearInterval(state.renewTimer);
  state.renewTimer = setInterval(renew, 60000);
}

async function renew() {
  if (!state.item) return;
  try {
    const answer = await api("renew", { id: state.item.id }, "POST");
    if (!answer.held) setStatus("This item was handed to someone else while the page was idle; skip to the next one.", true);
  } catch (error) { setStatus(error.message, true); }
}

async function run(action) {
  if (state.busy) return;
  state.busy = true;
  try { await action(); } catch (error) { setStatus(error.message, true); } finally { state.busy = false; }
}

async function loadNext() {
  const answer = await api("next");
  show(answer.item);
  showProgress(answer.progress);
  if (!answer.item) setStatus("All items are done. Thank you!");
}

async function submit() {
  if (!state.item) return;
  const critique = $("critique").value;
  const text = state.item.response;
  const spans = state.marks.map((m) => ({ start: m.start, end: m.end, label: m.label, text: text.slice(m.start, m.end) }));
  const answer = await api("submit", { id: state.item.id, critique, spans }, "POST");
  setStatus(`Saved item ${answer.record.id}.`);
  await loadNext();
  if (state.item) setStatus(`Saved item ${answer.record.id}. Next: item ${state.item.id}.`);
}

async function skip() {
  if (!state.item) return;
  if (state.item.status === "submitted") {  // revisited with "back": moving on keeps the record as it is
    await loadNext();
    return;
  }
  const skipped = state.item.id;
  await api("skip", { id: skipped }, "POST");
  await loadNext();
  setStatus(`Skipped item ${skipped}.`);
}

async function back() {
  const answer = await api("previous", state.item ? { before: state.item.id } : {});
  if (!answer.item) {
    setStatus("Nothing before this item.");
    return;
  }
  show(answer.item);
  setStatus(`Back to item ${answer.item.id}.`);
}

// ---- start-up and keys --------------------------------------------------------------------------------------

async function start(annotator) {
  state.annotator = annotator;
  localStorage.setItem("text2grad-annotator", annotator);
  const url = new URL(window.location.href);
  url.searchParams.set("annotator", annotator);
  history.replaceState(null, "", url.pathname + url.search);
  await loadNext();
}

function onKey(event) {
  const typing = event.target instanceof HTMLTextAreaElement || event.target instanceof HTMLInputElement;
  if ((event.ctrlKey || event.metaKey) && event.key === "Enter") {
    event.preventDefault();
    run(submit);
    return;
  }
  if (event.key === "Escape" && typing) {
    event.target.blur();
    return;
  }
  if (typing || event.ctrlKey || event.metaKey || event.altKey || !state.item && event.key !== "[") return;
  const actions = {
    g: () => addMark("good"), p: () => addMark("poor"), x: removeMarksInSelection,
    c: () => $("critique").focus(), "]": () => run(skip), "[": () => run(back),
  };
  const action = actions[event.key];
  if (action) {
    event.preventDefault();
    action();
  }
}

async function init() {
  const url = new URL(window.location.href);
  const token = url.searchParams.get("token");
  if (token) {
    sessionStorage.setItem("text2grad-token", token);
    url.searchParams.delete("token");  // keep the token out of the address bar and the history
    history.replaceState(null, "", url.pathname + url.search);
  }
  state.token = sessionStorage.getItem("text2grad-token") || "";
  document.addEventListener("keydown", onKey);
  $("mark-good").addEventListener("click", () => addMark("good"));
  $("mark-poor").addEventListener("click", () => addMark("poor"));
  $("unmark").addEventListener("click", removeMarksInSelection);
  $("submit").addEventListener("click", () => run(submit));
  $("skip").addEventListener("click", () => run(skip));
  $("back").addEventListener("click", () => run(back));
  $("back-finished").addEventListener("click", () => run(back));
  $("response").addEventListener("click", (event) => {
    const mark = event.target.closest("mark");
    if (mark && window.getSelection().isCollapsed) removeMark(Number(mark.dataset.index));
  });
  $("who").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("annotator").value.trim();
    if (!$("annotator").checkValidity() || !value) {
      setStatus("An annotator id is 1-64 letters, digits, '.', '_', '@' or '-'.", true);
      return;
    }
    run(() => start(value));
  });
  let session;
  try {
    session = await api("session");
  } catch (error) {
    setStatus(error.message, true);
    return;
  }
  const annotator = url.searchParams.get("annotator") || localStorage.getItem("text2grad-annotator") || session.default_annotator;
  if (annotator) {
    $("annotator").value = annotator;
    run(() => start(annotator));
  } else {
    setStatus("Enter your annotator id to start.");
    $("annotator").focus();
  }
}

document.addEventListener("DOMContentLoaded", init);
