// watermill-once admin page. Plain JavaScript, no build step. Everything from the API is
// inserted as text (never as HTML): payloads, keys and errors come from producers.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { writes: false, consumer: "", status: "FAILED", key: "", after: 0, pending: null };

function el(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "class") e.className = v;
    else if (k === "onclick") e.addEventListener("click", v);
    else if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return e;
}

async function api(path, body) {
  const opts = body === undefined ? {} : {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Wmonce-Admin": "1" },
    body: JSON.stringify(body),
  };
  const res = await fetch("api/" + path, opts);
  let data = null;
  try { data = await res.json(); } catch (_) { /* not JSON */ }
  if (!res.ok) throw new Error((data && data.error) || res.status + " " + res.statusText);
  return data;
}

function flash(msg, isError) {
  const f = $("flash");
  f.textContent = msg;
  f.className = isError ? "error" : "";
  f.hidden = false;
}

const zeroTime = (t) => !t || t.startsWith("0001-");
function fmtTime(t) {
  if (zeroTime(t)) return "—";
  const d = new Date(t);
  const p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}
function fmtAge(seconds) {
  if (!seconds || seconds <= 0) return "—";
  if (seconds < 1) return Math.round(seconds * 1000) + " ms";
  const s = Math.round(seconds);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " m " + (s % 60) + " s";
  if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " m";
  return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
}
const num = (n) => (n === undefined || n === null ? "—" : Number(n).toLocaleString("en-US"));
const td = (v, cls) => el("td", { class: cls }, v);
function emptyRow(tbody, cols, text) {
  tbody.replaceChildren(el("tr", {}, el("td", { class: "empty", colspan: cols }, text)));
}

async function loadStatus() {
  const s = await api("status");
  state.writes = s.writes_allowed;
  document.body.classList.toggle("read-only", !s.writes_allowed);
  $("schema").textContent = `schema ${s.schema} · version ${s.version} of ${s.latest}`;
  const mode = $("mode");
  mode.textContent = s.writes_allowed ? "writes enabled" : "read-only";
  mode.className = "badge " + (s.writes_allowed ? "writes-on" : "read-only");
  if (s.hint) flash(s.hint, true);
}

async function loadConsumers() {
  const r = await api("consumers");
  $("consumers-note").textContent = r.in_process_counts
    ? "Claims come from the database; fresh, duplicates and failures are counted by the middlewares in this process since it started."
    : "Claims come from the database. Duplicate rates need the middlewares of this process (admin.Config.Middlewares).";
  const body = $("consumers").tBodies[0];
  if (!r.consumers.length) return emptyRow(body, 9, "No consumer has claimed a message yet.");
  body.replaceChildren(...r.consumers.map((c) => {
    const k = c.counts || {};
    const rate = c.duplicate_rate === undefined ? "—" : (c.duplicate_rate * 100).toFixed(1) + " %";
    return el("tr", {},
      td(c.consumer), td(num(c.claims), "num"), td(fmtTime(c.newest_claim)),
      td(num(k.fresh), "num"), td(num(k.duplicates), "num"), td(rate, "num"),
      td(num(k.failed), "num"), td(num(k.refused), "num"), td(num(k.too_old), "num"));
  }));
}

function countLink(consumer, status, n) {
  if (!n) return td("0", "num");
  return el("td", { class: "num" }, el("button", {
    class: "link", type: "button", "data-consumer": consumer, "data-status": status,
    onclick: () => showRows(consumer, status, "").catch((e) => flash(e.message, true)),
  }, num(n)));
}

async function loadInbox() {
  const r = await api("inbox/stats");
  const body = $("inbox-stats").tBodies[0];
  const sel = $("f-consumer");
  const names = r.consumers.map((c) => c.consumer);
  sel.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  if (state.consumer) sel.value = state.consumer;
  if (!r.consumers.length) {
    $("rows-panel").hidden = true;
    return emptyRow(body, 8, "The inbox is empty.");
  }
  body.replaceChildren(...r.consumers.map((c) => el("tr", { "data-consumer": c.consumer },
    td(c.consumer),
    countLink(c.consumer, "PENDING", c.pending), td(num(c.retrying), "num"),
    countLink(c.consumer, "IN_PROGRESS", c.in_progress),
    countLink(c.consumer, "FAILED", c.failed),
    countLink(c.consumer, "DONE", c.done), countLink(c.consumer, "SKIPPED", c.skipped),
    td(fmtAge(c.oldest_pending_age_seconds)))));
  if (!state.consumer) {
    // Open the first consumer with parked rows: that is what an operator comes for.
    const parked = r.consumers.find((c) => c.failed > 0) || r.consumers[0];
    selectRows(parked.consumer, parked.failed > 0 ? "FAILED" : "", "");
  }
}

function selectRows(consumer, status, key) {
  Object.assign(state, { consumer, status, key, after: 0 });
  $("f-consumer").value = consumer;
  $("f-status").value = status;
  $("f-key").value = key;
  $("rows-panel").hidden = false;
  $("detail").hidden = true;
  cancelConfirm();
}

async function showRows(consumer, status, key) {
  selectRows(consumer, status, key);
  await loadRows(false);
}

async function loadRows(append) {
  const q = new URLSearchParams({ consumer: state.consumer, limit: "50" });
  if (state.status) q.set("status", state.status);
  if (state.key) q.set("key", state.key);
  if (append && state.after) q.set("after", String(state.after));
  const r = await api("inbox?" + q);
  const body = $("rows").tBodies[0];
  const rows = r.rows.map(rowElement);
  if (append) body.append(...rows); else body.replaceChildren(...rows);
  state.after = r.next_after || 0;
  $("more").hidden = !state.after;
  $("rows-empty").hidden = body.rows.length > 0;
  const replayable = state.status === "FAILED" || state.status === "SKIPPED";
  $("replay-all").disabled = !replayable || body.rows.length === 0;
  $("replay-all").title = replayable ? "" : "Select FAILED or SKIPPED rows to replay them in bulk";
}

function rowElement(r) {
  const actions = el("td", { class: "writes" });
  if (r.status === "FAILED" || r.status === "SKIPPED") {
    actions.append(el("button", { type: "button", class: "replay", onclick: () => replayRow(r) }, "Replay"));
  }
  if (r.status === "FAILED" || r.status === "PENDING") {
    actions.append(el("button", { type: "button", class: "skip", onclick: () => askSkip(r, actions) }, "Skip"));
  }
  return el("tr", { "data-id": String(r.id), "data-status": r.status },
    el("td", { class: "num" }, el("button", { class: "link", type: "button", onclick: () => inspect(r.id) }, String(r.id))),
    td(r.message_id), td(r.ordering_key || ""),
    el("td", {}, el("span", { class: "status status-" + r.status }, r.status)),
    td(String(r.attempts), "num"), td(r.last_error || "", "err"),
    td(fmtTime(r.received_at)), actions);
}

async function inspect(id) {
  try {
    const r = await api("inbox/" + id);
    $("detail-title").textContent = `Row ${r.id} · ${r.consumer} · ${r.message_id}`;
    $("detail-body").textContent = JSON.stringify(r, null, 2);
    $("detail").hidden = false;
  } catch (e) { flash(e.message, true); }
}

async function change(action, body, done) {
  try {
    const r = await api("inbox/" + action, body);
    flash(done(r));
    $("detail").hidden = true; // it shows the row as it was
    await refresh();
  } catch (e) { flash(e.message, true); }
}

function replayRow(r) {
  return change("replay", { consumer: r.consumer, statuses: [r.status], ids: [r.id] },
    (res) => `Replayed row ${r.id} (${res.rows} changed): it is PENDING again.`);
}

function askSkip(r, cell) {
  const reason = el("input", { type: "text", placeholder: "reason", size: "14", class: "skip-reason" });
  const go = el("button", { type: "button", class: "danger skip-confirm" }, "Skip row");
  go.addEventListener("click", () => {
    if (!reason.value.trim()) { flash("Give a reason: it is kept with the skipped row.", true); reason.focus(); return; }
    change("skip", { consumer: r.consumer, statuses: [r.status], ids: [r.id], reason: reason.value },
      (res) => `Skipped row ${r.id} (${res.rows} changed).`);
  });
  cell.replaceChildren(reason, go);
  reason.focus();
}

function filterBody(dryRun) {
  const b = { consumer: state.consumer, statuses: [state.status], dry_run: dryRun };
  if (state.key) b.ordering_key = state.key;
  return b;
}

async function askReplayAll() {
  try {
    const r = await api("inbox/replay", filterBody(true));
    if (!r.rows) { flash("No rows match: nothing to replay."); return; }
    state.pending = r.rows;
    $("confirm-text").textContent = `${r.rows} ${state.status} row(s) of ${state.consumer}${state.key ? " with key " + state.key : ""} will run again.`;
    $("confirm-yes").textContent = `Replay ${r.rows} row(s)`;
    $("confirm").hidden = false;
    $("replay-all").hidden = true;
  } catch (e) { flash(e.message, true); }
}

function cancelConfirm() {
  $("confirm").hidden = true;
  $("replay-all").hidden = false;
  state.pending = null;
}

async function confirmReplayAll() {
  const body = filterBody(false);
  cancelConfirm();
  await change("replay", body, (res) => `Replayed ${res.rows} row(s): they are PENDING again.`);
}

async function loadOutbox() {
  const r = await api("outbox");
  const body = $("relays").tBodies[0];
  if (!r.relays.length) emptyRow(body, 4, "No relay has run on this schema yet.");
  else body.replaceChildren(...r.relays.map((x) => el("tr", {},
    td(x.name), td(num(x.backlog), "num"), td(fmtTime(x.oldest_pending)), td(fmtAge(x.lag_seconds), "num"))));
  const rej = $("rejected");
  rej.textContent = r.rejected
    ? `${r.rejected} outbox row(s) could not be decoded and were set aside in outbox_rejected.`
    : "No rejected outbox rows.";
  rej.className = r.rejected ? "warn" : "muted";
}

async function refresh() {
  const parts = [loadConsumers(), loadInbox(), loadOutbox()];
  const results = await Promise.allSettled(parts);
  const failed = results.find((x) => x.status === "rejected");
  if (failed) flash(failed.reason.message, true);
  if (state.consumer && !$("rows-panel").hidden) {
    try { await loadRows(false); } catch (e) { flash(e.message, true); }
  }
  $("updated").textContent = "updated " + fmtTime(new Date().toISOString());
  document.body.dataset.ready = "1";
}

document.addEventListener("DOMContentLoaded", async () => {
  $("refresh").addEventListener("click", refresh);
  $("filter").addEventListener("submit", (ev) => {
    ev.preventDefault();
    showRows($("f-consumer").value, $("f-status").value, $("f-key").value.trim()).catch((e) => flash(e.message, true));
  });
  $("more").addEventListener("click", () => loadRows(true).catch((e) => flash(e.message, true)));
  $("replay-all").addEventListener("click", askReplayAll);
  $("confirm-yes").addEventListener("click", confirmReplayAll);
  $("confirm-no").addEventListener("click", cancelConfirm);
  $("detail-close").addEventListener("click", () => { $("detail").hidden = true; });
  try { await loadStatus(); } catch (e) { flash(e.message, true); }
  await refresh();
});
