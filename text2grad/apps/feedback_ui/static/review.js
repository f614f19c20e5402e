// The review screen: the annotations of one item side by side, their disagreements outlined, and an editable
// adjudicated record. Text is only ever put into the document as text nodes (textContent), never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { token: "", item: null, marks: [], busy: false };

function setStatus(message, isError = false) {
  $("status").textContent = message;
  $("status").classList.toggle("error", isError);
}

async function api(path, params = {}) {
  let response;
  try {
    response = await fetch("/api/review/" + path, {
      method: "POST", headers: { "Content-Type": "application/json", "X-Access-Token": state.token },
      body: JSON.stringify(params),
    });
  } catch (error) {
    throw new Error("Cannot reach the feedback server (it was stopped, or the network is down); try again later.");
  }
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) throw new Error((body && body.error) || `the server answered ${response.status}`);
  return body;
}

// UTF-16 offset of a code point offset (records store code points, the page works in UTF-16).
function utf16Offset(text, codepoints) {
  let units = 0, seen = 0;
  for (const ch of text) {
    if (seen === codepoints) break;
    units += ch.length;
    seen += 1;
  }
  return units;
}

// Render text with marks ({start, end, label}) and outlined stretches ({start, end}), all in UTF-16 offsets.
function renderMarked(box, text, marks, outlined) {
  box.replaceChildren();
  const cuts = new Set([0, text.length]);
  for (const m of [...marks, ...outlined]) { cuts.add(m.start); cuts.add(m.end); }
  const points = [...cuts].filter((c) => c >= 0 && c <= text.length).sort((a, b) => a - b);
  for (let k = 0; k + 1 < points.length; k += 1) {
    const [start, end] = [points[k], points[k + 1]];
    const mark = marks.findIndex((m) => m.start <= start && end <= m.end);
    const disputed = outlined.some((d) => d.start <= start && end <= d.end);
    let node = document.createTextNode(text.slice(start, end));
    if (mark >= 0 || disputed) {
      const element = document.createElement(mark >= 0 ? "mark" : "span");
      if (mark >= 0) { element.className = marks[mark].label; element.dataset.index = String(mark); }
      if (disputed) element.classList.add("disagree");
      element.appendChild(node);
      node = element;
    }
    box.appendChild(node);
  }
}

function toUtf16(text, spans) {
  return spans.map((s) => ({ start: utf16Offset(text, s.start), end: utf16Offset(text, s.end), label: s.label }));
}

function renderDraft() {
  const item = state.item;
  renderMarked($("response"), item.response, state.marks, toUtf16(item.response, item.disagreements.map(
    ([start, end]) => ({ start, end }))));
}

function show(item) {
  state.item = item;
  $("work").hidden = !item;
  $("finished").hidden = Boolean(item);
  if (!item) return;
  $("item-id").textContent = item.id;
  $("item-state").textContent = item.adjudicated ? "(adjudicated before; saving again replaces it)" : "";
  $("prompt").textContent = item.prompt;
  const list = $("annotations");
  list.replaceChildren();
  const disputed = toUtf16(item.response, item.disagreements.map(([start, end]) => ({ start, end })));
  for (const annotation of item.annotations) {
    const block = document.createElement("div");
    block.className = "annotation";
    const who = document.createElement("h3");
    who.textContent = annotation.annotator;
    const critique = document.createElement("p");
    critique.className = "critique";
    critique.textContent = annotation.critique;
    const text = document.createElement("div");
    text.className = "text";
    renderMarked(text, item.response, toUtf16(item.response, annotation.span_offsets), disputed);
    block.append(who, critique, text);
    list.appendChild(block);
  }
  state.marks = toUtf16(item.response, item.agreed_spans);
  $("critique").value = item.annotations.length ? item.annotations[0].critique : "";
  renderDraft();
  $("progress").textContent = `${item.progress.adjudicated} of ${item.progress.shared} shared items adjudicated`;
  setStatus(`${item.disagreements.length} stretch(es) where the annotators disagree.`);
}

function selectionOffsets() {
  const selection = window.getSelection();
  if (!selection || selection.rangeCount === 0 || selection.isCollapsed) return null;
  const box = $("response");
  const range = selection.getRangeAt(0);
  if (!box.contains(range.startContainer) || !box.contains(range.endContainer)) return null;
  const offsetOf = (node, offset) => {
    const before = document.createRange();
    before.selectNodeContents(box);
    before.setEnd(node, offset);
    return before.toString().length;
  };
  let start = offsetOf(range.startContainer, range.startOffset), end = offsetOf(range.endContainer, range.endOffset);
  const text = state.item.response;
  while (start < end && /\s/.test(text[start])) start += 1;
  while (end > start && /\s/.test(text[end - 1])) end -= 1;
  return start < end ? { start, end } : null;
}

function addMark(label) {
  const range = selectionOffsets();
  if (!range) { setStatus("Select text in the adjudicated response first.", true); return; }
  state.marks = state.marks.filter((m) => m.end <= range.start || m.start >= range.end);
  state.marks.push({ ...range, label });
  state.marks.sort((a, b) => a.start - b.start);
  window.getSelection().removeAllRanges();
  renderDraft();
  setStatus(`Marked ${label}: "${state.item.response.slice(range.start, range.end)}"`);
}

async function next() {
  const answer = await api("next", state.item ? { after: state.item.id } : {});
  $("reviewer").textContent = `Reviewer: ${answer.reviewer}`;
  show(answer.item);
  if (!answer.item) setStatus(`All ${answer.progress.shared} shared items are adjudicated.`);
}

async function submit() {
  if (!state.item) return;
  const text = state.item.response;
  const spans = state.marks.map((m) => ({ start: m.start, end: m.end, label: m.label, text: text.slice(m.start, m.end) }));
  const answer = await api("submit", { id: state.item.id, critique: $("critique").value, spans });
  if (document.activeElement) document.activeElement.blur();
  setStatus(`Saved the adjudication of item ${answer.record.id}.`);
  await next();
  if (state.item) setStatus(`Saved the adjudication of item ${answer.record.id}. Next: item ${state.item.id}.`);
}

async function run(action) {
  if (state.busy) return;
  state.busy = true;
  try { await action(); } catch (error) { setStatus(error.message, true); } finally { state.busy = false; }
}

function onKey(event) {
  const typing = event.target instanceof HTMLTextAreaElement;
  if ((event.ctrlKey || event.metaKey) && event.key === "Enter") { event.preventDefault(); run(submit); return; }
  if (event.key === "Escape" && typing) { event.target.blur(); return; }
  if (typing || event.ctrlKey || event.metaKey || event.altKey) return;
  const actions = { g: () => addMark("good"), p: () => addMark("poor"), "]": () => run(next) };
  if (actions[event.key]) { event.preventDefault(); actions[event.key](); }
}

async function init() {
  const url = new URL(window.location.href);
  const token = url.searchParams.get("token");
  if (token) {
    sessionStorage.setItem("text2grad-review-token", token);
    history.replaceState(null, "", url.pathname);
  }
  state.token = sessionStorage.getItem("text2grad-review-token") || "";
  document.addEventListener("keydown", onKey);
  $("submit").addEventListener("click", () => run(submit));
  $("next").addEventListener("click", () => run(next));
  $("response").addEventListener("click", (event) => {
    const mark = event.target.closest("mark");
    if (mark && window.getSelection().isCollapsed) {
      state.marks.splice(Number(mark.dataset.index), 1);
      renderDraft();
      setStatus("Mark removed.");
    }
  });
  await run(next);
}

document.addEventListener("DOMContentLoaded", init);
