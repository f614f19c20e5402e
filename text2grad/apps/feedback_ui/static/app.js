// The feedback page. Prompts and responses are only ever put into the document as text (textContent and text
// nodes), never as HTML. Marks are kept as [start, end) offsets into the response in JavaScript's own unit
// (UTF-16 code units); the server converts them to code points and checks them against its copy.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  annotator: "", token: "", item: null, marks: [], undo: [], saved: null, renewTimer: null, waitTimer: null, busy: false,
};
// Characters that change how text reads without showing themselves (bidi controls, zero-width spaces, soft hyphen):
// shown as a visible tag, each isolated so that an override cannot reorder the text after it. Same set as the server.
const HIDDEN_CHARS = /[\u00ad\u061c\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]/;

function setStatus(message, isError = false) {
  const status = $("status");
  status.textContent = message;
  status.classList.toggle("error", isError);
}

async function api(path, params = {}, method = "POST") {
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
  let response;
  try {
    response = await fetch(url, options);
  } catch (error) {
    throw new Error("Cannot reach the feedback server (it was stopped, or the network is down). Your draft is kept " +
                    "in this browser; try again once the server is back.");
  }
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

// Widen [start, end) to whole user-perceived characters (a letter and its accents, a joined emoji), then trim
// whitespace (JavaScript's \\s, the set the server trims by).
function trimmed(text, start, end) {
  if (typeof Intl !== "undefined" && Intl.Segmenter) {
    let at = 0;
    for (const { segment } of new Intl.Segmenter(undefined, { granularity: "grapheme" }).segment(text)) {
      const next = at + segment.length;
      if (at < start && start < next) start = at;
      if (at < end && end < next) end = next;
      at = next;
    }
  }
  while (start < end && /\s/.test(text[start])) start += 1;
  while (end > start && /\s/.test(text[end - 1])) end -= 1;
  return start < end ? { start, end } : null;
}

// How many times text[start, end) occurs in the text, and which of them this one is (1-based).
function occurrence(text, start, end) {
  const quote = text.slice(start, end);
  let count = 0, index = 0;
  for (let at = text.indexOf(quote); at >= 0; at = text.indexOf(quote, at + 1)) {
    count += 1;
    if (at === start) index = count;
  }
  return { count, index };
}

// ---- marks --------------------------------------------------------------------------------------------------

// Put text into an element as text nodes, each hidden character wrapped in a tagged, isolated span.
function appendText(parent, text) {
  let rest = text;
  for (let match = HIDDEN_CHARS.exec(rest); match; match = HIDDEN_CHARS.exec(rest)) {
    if (match.index > 0) parent.appendChild(document.createTextNode(rest.slice(0, match.index)));
    const tag = document.createElement("span");
    tag.className = "hidden-char";
    tag.dataset.code = "U+" + match[0].codePointAt(0).toString(16).toUpperCase().padStart(4, "0");
    tag.title = `invisible character ${tag.dataset.code}`;
    tag.textContent = match[0];
    parent.appendChild(tag);
    rest = rest.slice(match.index + 1);
  }
  if (rest) parent.appendChild(document.createTextNode(rest));
}

function hiddenCount(text) {
  return [...text].filter((ch) => HIDDEN_CHARS.test(ch)).length;
}

function renderResponse() {
  const box = $("response");
  const text = state.item.response;
  box.replaceChildren();
  box.classList.toggle("empty", text.length === 0);
  state.marks.sort((a, b) => a.start - b.start);
  let at = 0;
  state.marks.forEach((mark, index) => {
    if (mark.start > at) appendText(box, text.slice(at, mark.start));
    const element = document.createElement("mark");
    element.className = mark.label;
    element.dataset.index = String(index);
    element.title = `${mark.label}: click to remove (u undoes)`;
    appendText(element, text.slice(mark.start, mark.end));
    box.appendChild(element);
    at = mark.end;
  });
  if (at < text.length) appendText(box, text.slice(at));
  renderMarkList();
  saveDraft();
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
  pushUndo();
  const before = state.marks.length;
  state.marks = state.marks.filter((m) => m.end <= range.start || m.start >= range.end);
  const replaced = before - state.marks.length;
  state.marks.push({ start: range.start, end: range.end, label });
  window.getSelection().removeAllRanges();
  renderResponse();
  const text = state.item.response;
  const seen = occurrence(text, range.start, range.end);
  const repeated = seen.count > 1 ? ` Note: this text occurs ${seen.count} times in the response; you marked ` +
    `occurrence ${seen.index} only (the record keeps its exact place).` : "";
  setStatus(`Marked ${label}: "${text.slice(range.start, range.end)}"` +
            (replaced ? ` (replaced ${replaced} overlapping mark${replaced > 1 ? "s" : ""})` : "") + repeated,
            Boolean(repeated));
}

function pushUndo() {
  state.undo.push(state.marks.map((m) => ({ ...m })));
  if (state.undo.length > 200) state.undo.shift();
}

function undo() {
  if (!state.item || !state.undo.length) {
    setStatus("Nothing to undo.");
    return;
  }
  state.marks = state.undo.pop();
  renderResponse();
  setStatus("Undone.");
}

function removeMark(index) {
  pushUndo();
  state.marks.splice(index, 1);
  renderResponse();
  setStatus("Mark removed (u undoes).");
}

function removeMarksInSelection() {
  const range = selectionOffsets();
  if (!range) {
    setStatus("Select text that overlaps a mark to remove it (or click the mark).", true);
    return;
  }
  pushUndo();
  const before = state.marks.length;
  state.marks = state.marks.filter((m) => m.end <= range.start || m.start >= range.end);
  window.getSelection().removeAllRanges();
  renderResponse();
  setStatus(`Removed ${before - state.marks.length} mark(s) (u undoes).`);
}

// ---- items --------------------------------------------------------------------------------------------------

function showProgress(progress) {
  if (!progress) return;
  const parts = [`${progress.yours} of ${progress.total} done by you`];
  if (progress.skipped) parts.push(`${progress.skipped} skipped`);
  if (progress.per_item > 1) parts.push(`${progress.complete} of ${progress.total} complete (${progress.per_item} people each)`);
  $("progress").textContent = parts.join(" \u00b7 ");
}

// ---- drafts: what is typed and marked is kept in this browser per item until it is submitted --------------------

function draftKey(id) {
  return `text2grad-draft:${state.annotator}:${id}`;
}

function current() {
  return JSON.stringify({ critique: $("critique").value, marks: [...state.marks].sort((a, b) => a.start - b.start) });
}

function dirty() {
  return Boolean(state.item) && state.saved !== null && current() !== state.saved;
}

function saveDraft() {
  if (!state.item || state.saved === null) return;
  try {
    if (dirty()) {
      localStorage.setItem(draftKey(state.item.id), JSON.stringify({
        critique: $("critique").value, marks: state.marks, length: state.item.response.length, time: Date.now(),
      }));
    } else {
      localStorage.removeItem(draftKey(state.item.id));
    }
  } catch (error) {
    setStatus("This browser refused to keep a draft (storage full or disabled): submit before leaving.", true);
  }
}

function loadDraft(item) {
  try {
    const draft = JSON.parse(localStorage.getItem(draftKey(item.id)) || "null");
    return draft && draft.length === item.response.length && Array.isArray(draft.marks) ? draft : null;
  } catch (error) {
    return null;
  }
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
  saveDraft();
  state.item = item;
  state.saved = null;
  state.undo = [];
  $("work").hidden = !item;
  $("finished").hidden = Boolean(item);
  if (!item) {
    clearInterval(state.renewTimer);
    return false;
  }
  $("item-id").textContent = item.id;
  $("item-position").textContent = `(#${item.position} of ${item.progress.total} in the file)`;
  $("item-state").textContent = item.status === "submitted" ? "(you submitted this; submitting again replaces your record)"
    : item.status === "skipped" ? "(you skipped this)" : "";
  $("prompt").replaceChildren();
  appendText($("prompt"), item.prompt);
  const hidden = hiddenCount(item.prompt) + hiddenCount(item.response);
  $("item-warning").textContent = (item.response.length === 0 ? "The response is empty: there is nothing to mark; " +
    "say so in the critique, or skip. " : "") + (hidden ? `This item holds ${hidden} invisible or text-direction ` +
    "character(s), shown as tags such as U+202E; they may make text read differently from what it is." : "");
  const record = item.record;
  const suggestion = !record && item.suggestion ? item.suggestion : null;
  const spans = record ? record.span_offsets || [] : suggestion ? suggestion.spans : [];
  state.marks = spans.map((s) => ({
    start: utf16Offset(item.response, s.start), end: utf16Offset(item.response, s.end), label: s.label,
  }));
  $("critique").value = record ? record.critique : suggestion ? suggestion.critique : "";
  if (suggestion) {
    $("item-state").textContent = `(suggested by ${suggestion.critic}: keep, remove or add marks and edit the ` +
      "critique, then submit; the record keeps what was suggested and what you changed)";
  }
  state.saved = current();
  const draft = loadDraft(item);
  if (draft) {
    state.marks = draft.marks;
    $("critique").value = draft.critique;
  }
  renderResponse();
  showProgress(item.progress);
  clearInterval(state.renewTimer);
  state.renewTimer = setInterval(renew, 60000);
  return Boolean(draft);
}

async function renew() {
  if (!state.item) return;
  try {
    const answer = await api("renew", { id: state.item.id });
    if (!answer.held) setStatus("This item was handed to someone else while the page was idle; skip to the next one.", true);
  } catch (error) { setStatus(error.message, true); }
}

async function run(action) {
  if (state.busy) return;
  state.busy = true;
  try { await action(); } catch (error) { setStatus(error.message, true); } finally { state.busy = false; }
}

async function loadNext() {
  clearTimeout(state.waitTimer);
  const answer = await api("next");
  const restored = show(answer.item);
  showProgress(answer.progress);
  if (restored) setStatus(`Restored your unsaved draft of item ${answer.item.id}.`);
  if (answer.item) return;
  if (answer.held_by_others) {
    $("finished-text").textContent = `No item is free for you right now: ${answer.held_by_others} item(s) are being ` +
      "annotated by others and come back if they skip them or leave. This page checks again every 30 seconds.";
    setStatus("Waiting for items held by other annotators.");
    state.waitTimer = setTimeout(() => run(loadNext), 30000);
  } else {
    $("finished-text").textContent = "No item is left for you.";
    setStatus("All items are done. Thank you!");
  }
}

async function submit() {
  if (!state.item) return;
  const critique = $("critique").value;
  const text = state.item.response;
  const spans = state.marks.map((m) => ({ start: m.start, end: m.end, label: m.label, text: text.slice(m.start, m.end) }));
  const answer = await api("submit", { id: state.item.id, critique, spans });
  localStorage.removeItem(draftKey(answer.record.id));
  state.saved = current();
  if (document.activeElement) document.activeElement.blur();  // so that g, p, [ and ] work at once
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
  await api("skip", { id: skipped });
  await loadNext();
  setStatus(`Skipped item ${skipped}.`);
}

async function back() {
  const answer = await api("previous", state.item ? { before: state.item.id } : {});
  if (!answer.item) {
    setStatus("Nothing before this item.");
    return;
  }
  const restored = show(answer.item);
  setStatus(`Back to item ${answer.item.id}.` + (restored ? " Restored your unsaved draft of it." : ""));
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
  if ((event.ctrlKey || event.metaKey) && event.key === "z" && !typing) {
    event.preventDefault();
    undo();
    return;
  }
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
    c: () => $("critique").focus(), "]": () => run(skip), "[": () => run(back), u: undo,
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
  $("undo").addEventListener("click", undo);
  $("critique").addEventListener("input", saveDraft);
  window.addEventListener("beforeunload", (event) => {
    saveDraft();
    if (dirty()) {  // the draft is kept in this browser, but a person closing the tab should know it is unsubmitted
      event.preventDefault();
      event.returnValue = "";
    }
  });
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
    session = await api("session", {}, "GET");
  } catch (error) {
    setStatus(error.message, true);
    return;
  }
  if (session.annotator) {  // the access token names the person: no other id can be used from this address
    $("annotator").value = session.annotator;
    $("annotator").disabled = true;
    $("start").disabled = true;
    run(() => start(session.annotator));
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
