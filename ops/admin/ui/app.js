// watermill-once admin page. Plain JavaScript, no build step. Everything from the API is
// inserted as text (never as HTML): payloads, keys and errors come from producers. Charts are
// SVG elements built here, styled by classes from style.css (the CSP allows no inline style).
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  writes: false, consumer: "", status: "FAILED", key: "", since: "", after: 0, pending: null,
  window: "hour", chartConsumer: "", relay: "", rejectedSince: "", rejectedAfter: 0,
};

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

const SVGNS = "http://www.w3.org/2000/svg";
function sv(tag, attrs, ...children) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) e.setAttribute(k, String(v));
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

const pad = (n) => String(n).padStart(2, "0");
// fmtTime shows an API time; an unset one is null (oldest_pending with no backlog, ...).
function fmtTime(t) {
  if (t === null || t === undefined) return "—";
  const d = new Date(t);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}
const fmtClock = (d) => `${pad(d.getHours())}:${pad(d.getMinutes())}`;
function fmtAge(seconds) {
  if (!seconds || seconds <= 0) return "—";
  if (seconds < 1) return Math.round(seconds * 1000) + " ms";
  const s = Math.round(seconds);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " m " + (s % 60) + " s";
  if (s < 86400) return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " m";
  return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
}
// A short age for axis labels.
function fmtAgeShort(seconds) {
  if (seconds <= 0) return "0";
  if (seconds < 1) return Math.round(seconds * 1000) + "ms";
  if (seconds < 90) return +seconds.toPrecision(2) + "s";
  if (seconds < 5400) return +(seconds / 60).toPrecision(2) + "m";
  if (seconds < 129600) return +(seconds / 3600).toPrecision(2) + "h";
  return +(seconds / 86400).toPrecision(2) + "d";
}
const num = (n) => (n === undefined || n === null ? "—" : Number(n).toLocaleString("en-US"));
function fmtCount(n) {
  if (n >= 1e6) return +(n / 1e6).toPrecision(3) + "M";
  if (n >= 1e4) return +(n / 1e3).toPrecision(3) + "k";
  return num(n);
}
function fmtBytes(n) {
  if (n < 1024) return n + " B";
  if (n < 1048576) return (n / 1024).toFixed(1) + " KiB";
  return (n / 1048576).toFixed(1) + " MiB";
}
const td = (v, cls) => el("td", { class: cls }, v);
function emptyRow(tbody, cols, text) {
  tbody.replaceChildren(el("tr", {}, el("td", { class: "empty", colspan: cols }, text)));
}
const sinceParam = (seconds) => new Date(Date.now() - Number(seconds) * 1000).toISOString();

// ---- Charts ---------------------------------------------------------------------------------

// niceMax rounds up to 1, 2 or 5 times a power of ten.
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

// chart draws one series as an SVG: bars (counts per bucket) or a line (sampled values). Null
// values are buckets no sample covers: those before the first sample are shaded as "no data";
// between samples a line is drawn straight on (a bucket can be shorter than the sampling
// interval). opts: kind, cls, width, fmt (axis and tooltip values), integer (counts: the axis
// never shows fractions), empty (text when there is nothing to draw).
function chart(h, values, opts) {
  const W = opts.width || 560, H = 132, L = 46, R = 10, T = 10, B = 22;
  const pw = W - L - R, ph = H - T - B, n = values.length, bw = pw / n;
  const fmt = opts.fmt || fmtCount;
  const present = values.filter((v) => v !== null && v !== undefined);
  let max = niceMax(Math.max(0, ...present));
  if (opts.integer && max < 4) max = 4;
  const y = (v) => T + ph - (v / max) * ph;
  const x = (i) => L + i * bw;
  const g = sv("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart " + (opts.cls || ""), role: "img", "aria-label": opts.label });
  g.append(sv("title", {}, opts.label));

  // No data before the first sample.
  const isNull = (v) => v === null || v === undefined;
  const first = values.findIndex((v) => !isNull(v));
  const lead = first < 0 ? n : first;
  if (lead > 0) {
    g.append(sv("rect", { class: "nodata", x: L, y: T, width: lead * bw, height: ph }));
    if (lead * bw > 90 && first >= 0) g.append(sv("text", { class: "nodata-note", x: L + (lead * bw) / 2, y: T + 14 }, "not sampled"));
  }
  // Grid and y labels: 0, half, max.
  for (const f of [0, 0.5, 1]) {
    const v = max * f;
    g.append(sv("line", { class: f === 0 ? "axis" : "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    if (opts.integer && f === 0.5 && max % 2) continue;
    g.append(sv("text", { class: "ylabel", x: L - 6, y: y(v) + 4 }, fmt(v)));
  }
  // X labels: clock times at round ticks.
  const start = new Date(h.start).getTime(), bucketMs = h.bucket_seconds * 1000, endMs = start + n * bucketMs;
  const tickMs = h.window === "day" ? 4 * 3600e3 : 10 * 60e3;
  const tz = new Date(start).getTimezoneOffset() * 60e3;
  for (let t = Math.ceil((start - tz) / tickMs) * tickMs + tz; t <= endMs; t += tickMs) {
    const px = L + ((t - start) / (endMs - start)) * pw;
    g.append(sv("line", { class: "tick", x1: px, x2: px, y1: T + ph, y2: T + ph + 4 }));
    g.append(sv("text", { class: "xlabel", x: px, y: H - 6 }, fmtClock(new Date(t))));
  }
  const when = (k) => {
    const a = new Date(start + k * bucketMs), b = new Date(start + (k + 1) * bucketMs);
    return `${fmtClock(a)}–${fmtClock(b)}`;
  };
  if (opts.kind === "bars") {
    const gap = bw > 4 ? 1 : 0;
    values.forEach((v, k) => {
      if (!v) return;
      const top = y(v);
      g.append(sv("rect", { class: "bar", x: x(k) + gap / 2, y: top, width: Math.max(bw - gap, 1), height: T + ph - top },
        sv("title", {}, `${when(k)}: ${num(v)} ${opts.unit || ""}`)));
    });
  } else {
    // A line through the sampled buckets' centres, with an area below and a dot on every
    // point (a single sample is a dot).
    const pts = [];
    values.forEach((v, k) => { if (!isNull(v)) pts.push([x(k) + bw / 2, y(v)]); });
    if (pts.length) {
      const line = pts.map(([px, py]) => `${px.toFixed(1)},${py.toFixed(1)}`).join("L");
      g.append(sv("path", { class: "area", d: `M${pts[0][0].toFixed(1)},${y(0)}L${line}L${pts[pts.length - 1][0].toFixed(1)},${y(0)}Z` }),
        sv("path", { class: "line", d: "M" + line }));
    }
    values.forEach((v, k) => {
      if (v === null || v === undefined) return;
      g.append(sv("circle", { class: "dot", cx: x(k) + bw / 2, cy: y(v), r: 2.2 }, sv("title", {}, `${when(k)}: ${fmt(v)}`)));
    });
  }
  if (first < 0 || (opts.kind === "bars" && !present.some((v) => v > 0))) {
    g.append(sv("text", { class: "empty-note", x: L + pw / 2, y: T + ph / 2 + 4 }, opts.empty || "nothing in this window"));
  }
  return g;
}

const sumOf = (vs) => vs.reduce((a, v) => a + (v || 0), 0);
const lastOf = (vs) => { for (let i = vs.length - 1; i >= 0; i--) if (vs[i] !== null && vs[i] !== undefined) return vs[i]; return null; };
const maxOf = (vs) => vs.reduce((a, v) => (v !== null && v !== undefined && v > a ? v : a), 0);

// card is one consumer's or relay's charts, side by side: panels are [legend class, legend
// text, values, chart options].
function card(h, title, subtitle, panels) {
  const width = panels.length >= 3 ? 360 : 545;
  return el("figure", { class: "card" },
    el("figcaption", {}, el("strong", {}, title), " ", el("span", { class: "muted" }, subtitle)),
    el("div", { class: "panels cols-" + panels.length }, ...panels.map(([cls, text, values, opts]) =>
      el("div", { class: "panel-chart" },
        el("div", { class: "legend" }, el("span", { class: "swatch " + cls }), text),
        chart(h, values, { ...opts, cls, width })))));
}

async function loadHistory() {
  const q = new URLSearchParams({ window: state.window });
  if (state.chartConsumer) q.set("consumer", state.chartConsumer);
  const h = await api("history?" + q);
  const span = h.window === "day" ? "last day" : "last hour";
  const per = h.bucket_seconds >= 900 ? "per 15 minutes" : "per minute";
  const s = h.sampling;
  $("sampling").textContent = s.samples
    ? `sampled ${s.interval_seconds ? "every " + fmtAge(s.interval_seconds) : "on demand"} since ${fmtTime(s.since)} (${num(s.samples)} sample${s.samples === 1 ? "" : "s"})`
    : "no samples yet: the backlog and lag charts start with the first";

  const cc = $("consumer-charts");
  cc.replaceChildren(...h.consumers.map((c) => {
    return card(h, c.consumer, `${num(sumOf(c.claims))} claims · ${num(sumOf(c.duplicates))} duplicates in the ${span}`, [
      ["claims", `Claims ${per}: claim rows by processed_at, every process`, c.claims,
        { kind: "bars", integer: true, unit: "claims", label: `claims of ${c.consumer}`, empty: `no claims in the ${span}` }],
      ["dups", `Duplicates ${per}: skipped copies recorded by every process`, c.duplicates,
        { kind: "bars", integer: true, unit: "duplicates", label: `duplicates of ${c.consumer}`, empty: `no duplicates in the ${span}` }],
    ]);
  }));
  if (!h.consumers.length) cc.append(el("p", { class: "muted empty-charts" }, `No claims or duplicates in the ${span}.`));

  const ic = $("inbox-charts");
  ic.replaceChildren(...h.inbox.map((x) => card(h, "inbox " + x.consumer,
    `last sample: ${num(lastOf(x.pending) ?? 0)} pending, ${num(lastOf(x.failed) ?? 0)} failed, oldest pending ${fmtAge(lastOf(x.oldest_pending_age_seconds))}`, [
      ["pending", "Backlog: PENDING rows", x.pending, { kind: "line", integer: true, label: `pending rows of ${x.consumer}` }],
      ["age", "Age of the oldest PENDING row", x.oldest_pending_age_seconds, { kind: "line", fmt: fmtAgeShort, label: `oldest pending age of ${x.consumer}` }],
      ["failed", "FAILED rows (parked)", x.failed, { kind: "line", integer: true, label: `failed rows of ${x.consumer}` }],
    ])));
  const of = state.chartConsumer ? ` of ${state.chartConsumer}` : "";
  if (!h.inbox.length) ic.append(el("p", { class: "muted empty-charts" }, `No unfinished inbox rows${of} sampled in the ${span}.`));

  const rc = $("relay-charts");
  rc.replaceChildren(...h.relays.map((x) => card(h, "relay " + x.name,
    `last sample: ${num(lastOf(x.backlog) ?? 0)} rows waiting, lag ${fmtAge(lastOf(x.lag_seconds))}; peak lag ${fmtAge(maxOf(x.lag_seconds))}`, [
      ["lag", "Lag: age of the oldest row not yet forwarded", x.lag_seconds, { kind: "line", fmt: fmtAgeShort, label: `lag of relay ${x.name}` }],
      ["backlog", "Backlog: rows not yet forwarded", x.backlog, { kind: "line", integer: true, label: `backlog of relay ${x.name}` }],
    ])));
  if (!h.relays.length) rc.append(el("p", { class: "muted empty-charts" }, `No relay sampled in the ${span}.`));
  for (const c of [cc, ic, rc]) c.dataset.window = h.window;
}

function setWindow(w) {
  state.window = w;
  for (const b of document.querySelectorAll("#toolbar [data-window]")) b.setAttribute("aria-pressed", String(b.dataset.window === w));
  return loadHistory().catch((e) => flash(e.message, true));
}

// ---- Tables ---------------------------------------------------------------------------------

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

function fillSelect(sel, names, keep) {
  const first = sel.options[0] && sel.options[0].value === "" ? [sel.options[0]] : [];
  sel.replaceChildren(...first, ...names.map((n) => el("option", { value: n }, n)));
  if (keep && names.includes(keep)) sel.value = keep;
}

async function loadConsumers() {
  const r = await api("consumers");
  $("consumers-note").textContent = r.in_process_counters
    ? "Claims come from the database; fresh, duplicates and failures are counted by the middlewares in this process since it started."
    : "Claims and the duplicates chart come from the database (every process). The table's fresh, duplicate and failure counts need the middlewares of this process (admin.Config.Middlewares).";
  const body = $("consumers").tBodies[0];
  fillSelect($("c-filter"), r.consumers.map((c) => c.consumer), state.chartConsumer);
  if (!r.consumers.length) return emptyRow(body, 10, "No consumer has claimed a message yet.");
  body.replaceChildren(...r.consumers.map((c) => {
    const k = c.counters || {};
    const rate = c.duplicate_rate === undefined ? "—" : (c.duplicate_rate * 100).toFixed(1) + " %";
    return el("tr", {},
      td(c.consumer), td(num(c.claims), "num"), td(fmtTime(c.newest_claim)),
      td(num(k.fresh), "num"), td(num(k.duplicates), "num"), td(rate, "num"),
      td(num(k.failed), "num"), td(num(k.delayed_retries), "num"), td(num(k.refused), "num"), td(num(k.too_old), "num"));
  }));
}

function countLink(consumer, status, n) {
  if (!n) return td("0", "num");
  return el("td", { class: "num" }, el("button", {
    class: "link", type: "button", "data-consumer": consumer, "data-status": status,
    onclick: () => showRows(consumer, status, "", "").catch((e) => flash(e.message, true)),
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
    return emptyRow(body, 9, "The inbox is empty.");
  }
  body.replaceChildren(...r.consumers.map((c) => el("tr", { "data-consumer": c.consumer },
    td(c.consumer),
    countLink(c.consumer, "PENDING", c.pending), td(num(c.retrying), "num"),
    countLink(c.consumer, "IN_PROGRESS", c.in_progress),
    countLink(c.consumer, "FAILED", c.failed),
    countLink(c.consumer, "DONE", c.done), countLink(c.consumer, "SKIPPED", c.skipped),
    td(fmtAge(c.oldest_pending_age_seconds)), pauseCell({ consumer: c.consumer }, c.paused_at))));
  if (!state.consumer) {
    // Open the first consumer with parked rows: that is what an operator comes for.
    const parked = r.consumers.find((c) => c.failed > 0) || r.consumers[0];
    selectRows(parked.consumer, parked.failed > 0 ? "FAILED" : "", "", "");
  }
}

function selectRows(consumer, status, key, since) {
  Object.assign(state, { consumer, status, key, since, after: 0 });
  $("f-consumer").value = consumer;
  $("f-status").value = status;
  $("f-key").value = key;
  $("f-since").value = since;
  $("rows-panel").hidden = false;
  cancelConfirm();
}

async function showRows(consumer, status, key, since) {
  selectRows(consumer, status, key, since);
  await loadRows(false);
}

async function loadRows(append) {
  const q = new URLSearchParams({ consumer: state.consumer, limit: "50" });
  if (state.status) q.set("status", state.status);
  if (state.key) q.set("key", state.key);
  if (state.since) q.set("received_after", sinceParam(state.since));
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

function rowActions(r, cell) {
  if (r.status === "FAILED" || r.status === "SKIPPED") {
    cell.append(el("button", { type: "button", class: "replay", onclick: () => replayRow(r) }, "Replay"));
  }
  if (r.status === "FAILED" || r.status === "PENDING") {
    cell.append(el("button", { type: "button", class: "skip", onclick: () => askSkip(r, cell) }, "Skip"));
  }
  return cell;
}

function rowElement(r) {
  return el("tr", { "data-id": String(r.id), "data-status": r.status },
    el("td", { class: "num" }, el("button", { class: "link", type: "button", onclick: () => inspect(r.id) }, String(r.id))),
    td(r.message_id), td(r.ordering_key || ""),
    el("td", {}, el("span", { class: "status status-" + r.status }, r.status)),
    td(String(r.attempts), "num"), td(r.last_error || "", "err"),
    td(fmtTime(r.received_at)), rowActions(r, el("td", { class: "writes" })));
}

// ---- Detail view ----------------------------------------------------------------------------

// Characters that would hide or reorder text (controls, bidi overrides) are shown as escapes.
const invisible = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]/g;
const visible = (s) => s.replace(invisible, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));

// indentJSON re-indents valid JSON text without parsing its values, so numbers beyond
// JavaScript's precision and escapes stay exactly as the producer wrote them.
function indentJSON(text) {
  let out = "", depth = 0, inString = false, escaped = false;
  const nl = () => "\n" + "  ".repeat(depth);
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      out += c;
      if (escaped) escaped = false;
      else if (c === "\\") escaped = true;
      else if (c === '"') inString = false;
      continue;
    }
    switch (c) {
      case '"': inString = true; out += c; break;
      case "{": case "[": {
        let j = i + 1;
        while (j < text.length && " \t\r\n".includes(text[j])) j++;
        if (text[j] === (c === "{" ? "}" : "]")) { out += c + text[j]; i = j; break; }
        depth++; out += c + nl(); break;
      }
      case "}": case "]": depth--; out += nl() + c; break;
      case ",": out += "," + nl(); break;
      case ":": out += ": "; break;
      case " ": case "\t": case "\r": case "\n": break;
      default: out += c;
    }
  }
  return out;
}

const maxShown = 256 * 1024;
function hexDump(bytes) {
  const lines = [];
  const n = Math.min(bytes.length, 64 * 1024);
  for (let off = 0; off < n; off += 16) {
    const row = bytes.subarray(off, Math.min(off + 16, n));
    const hex = [...row].map((b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = [...row].map((b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${off.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  |${ascii}|`);
  }
  if (bytes.length > n) lines.push(`… ${num(bytes.length - n)} more bytes not shown`);
  return lines.join("\n");
}

// formatPayload returns [kind, text] for a payload given as text, or as base64 when it is not
// valid UTF-8.
function formatPayload(text, base64) {
  if (base64 !== undefined && base64 !== null) {
    const bin = atob(base64);
    const bytes = Uint8Array.from(bin, (c) => c.charCodeAt(0));
    return [`binary, ${fmtBytes(bytes.length)}, hex`, hexDump(bytes)];
  }
  if (text === undefined || text === null) return ["none", ""];
  if (text === "") return ["empty", ""];
  const size = fmtBytes(new TextEncoder().encode(text).length);
  let shown = text, note = "";
  if (text.length > maxShown) { shown = text.slice(0, maxShown); note = `\n… ${num(text.length - maxShown)} more characters not shown`; }
  try {
    JSON.parse(text);
    return [`JSON, ${size}, indented`, visible(indentJSON(shown)) + note];
  } catch (_) { /* not JSON */ }
  return [`text, ${size}`, visible(shown) + note];
}

function field(name, value, cls) {
  return [el("dt", {}, name), el("dd", { class: cls }, value === undefined || value === null || value === "" ? "—" : value)];
}

function showMetadata(md) {
  const box = $("detail-metadata");
  if (md === undefined || md === null || (typeof md === "object" && !Array.isArray(md) && !Object.keys(md).length)) {
    box.replaceChildren(el("p", { class: "muted" }, "none"));
    return;
  }
  const flat = typeof md === "object" && !Array.isArray(md) && Object.values(md).every((v) => v === null || typeof v !== "object");
  if (!flat) {
    box.replaceChildren(el("pre", { class: "payload" }, visible(JSON.stringify(md, null, 2))));
    return;
  }
  box.replaceChildren(el("table", { class: "kv" }, el("tbody", {},
    ...Object.keys(md).sort().map((k) => el("tr", {}, el("th", {}, visible(k)), el("td", {}, visible(String(md[k]))))))));
}

// openDetail shows a row; actions, when given, fills the dialog's action cell.
function openDetail(kind, title, status, fields, lastError, metadata, payload, actions) {
  const d = $("detail");
  d.dataset.kind = kind;
  $("detail-title").textContent = title;
  $("detail-status").replaceChildren(...(status ? [el("span", { class: "status status-" + status }, status)] : []));
  $("detail-fields").replaceChildren(...fields.flat());
  $("detail-error-box").hidden = !lastError;
  $("detail-error").textContent = lastError ? visible(lastError) : "";
  showMetadata(metadata);
  const [pkind, ptext] = payload;
  $("detail-payload-kind").textContent = "· " + pkind;
  $("detail-payload").textContent = ptext;
  $("detail-actions").replaceChildren();
  if (actions) actions($("detail-actions"));
  d.hidden = false;
  $("detail-close").focus();
}

function closeDetail() { $("detail").hidden = true; }

async function inspect(id) {
  try {
    const r = await api("inbox/" + id);
    openDetail("inbox", `Inbox row ${r.id} · ${r.consumer}`, r.status, [
      field("Message ID", r.message_id), field("Message UUID", r.message_uuid),
      field("Ordering key", r.ordering_key), field("Topic", r.topic),
      field("Attempts", String(r.attempts), "num-left"), field("Next attempt", fmtTime(r.next_attempt_at)),
      field("Lease until", r.lease_until ? fmtTime(r.lease_until) : ""), field("Received", fmtTime(r.received_at)),
      field("Finished", r.finished_at ? fmtTime(r.finished_at) : ""), field("Payload size", fmtBytes(r.payload_size)),
    ], r.last_error, r.metadata, formatPayload(r.payload, r.payload_base64), (cell) => rowActions(r, cell));
  } catch (e) { flash(e.message, true); }
}

async function inspectRejected(offset, relay) {
  try {
    const r = await api(`outbox/rejected/${offset}?` + new URLSearchParams({ relay }));
    openDetail("rejected", `Rejected outbox row ${r.offset} · relay ${r.relay}`, "REJECTED", [
      field("UUID", r.uuid), field("Relay", r.relay), field("Offset", String(r.offset)),
      field("Topic", r.topic || "— (could not be decoded)"), field("Source", r.source),
      field("Transaction", r.transaction_id), field("Rejected", fmtTime(r.rejected_at)),
      field("Attempts", "— (set aside at the first failure)"), field("Payload size", fmtBytes(r.payload_size)),
    ], r.last_error, r.metadata, formatPayload(r.payload), r.topic ? (cell) => republishActions(r, cell) : undefined);
  } catch (e) { flash(e.message, true); }
}

// republishActions offers to store a row the broker refused in the outbox again, optionally
// without one metadata key (one the broker reserves).
function republishActions(r, cell) {
  const key = el("input", { type: "text", placeholder: "metadata key to remove (optional)", size: "24", class: "republish-remove" });
  const go = el("button", { type: "button", class: "republish" }, "Republish");
  go.addEventListener("click", async () => {
    const body = { relay: r.relay, offsets: [r.offset] };
    if (key.value.trim()) body.remove_metadata = [key.value.trim()];
    try {
      const res = await api("outbox/republish", body);
      flash(`Republished row ${r.offset} (${res.republished} stored again): it is at the end of the outbox.`);
      closeDetail();
      await refresh();
    } catch (e) { flash(e.message, true); }
  });
  cell.replaceChildren(key, go);
}

// ---- Writes ---------------------------------------------------------------------------------

// pauseCell shows whether an inbox consumer or a relay (who: { consumer } or { relay }) is
// paused, with the button that pauses or resumes it (writes only).
function pauseCell(who, pausedAt) {
  const paused = !!pausedAt;
  const name = who.consumer || who.relay;
  return el("td", { class: "state" + (paused ? " warn" : "") },
    paused ? "paused since " + fmtTime(pausedAt) + " " : "running ",
    el("button", {
      type: "button", class: "writes " + (paused ? "resume" : "pause"),
      onclick: async () => {
        try {
          const r = await api("pause", { ...who, pause: !paused });
          flash(r.changed ? `${paused ? "Resumed" : "Paused"} ${name}.` : `${name} was ${paused ? "not paused" : "paused already"}.`);
          await refresh();
        } catch (e) { flash(e.message, true); }
      },
    }, paused ? "Resume" : "Pause"));
}

async function change(action, body, done) {
  try {
    const r = await api("inbox/" + action, body);
    flash(done(r));
    closeDetail(); // it shows the row as it was
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

// ---- Outbox ---------------------------------------------------------------------------------

async function loadOutbox() {
  const r = await api("outbox");
  const body = $("relays").tBodies[0];
  fillSelect($("r-relay"), r.relays.map((x) => x.name), state.relay);
  if (!r.relays.length) emptyRow(body, 6, "No relay has run on this schema yet.");
  else body.replaceChildren(...r.relays.map((x) => el("tr", { "data-relay": x.name },
    td(x.name), td(num(x.backlog), "num"), td(fmtTime(x.oldest_pending)), td(fmtAge(x.lag_seconds), "num"),
    el("td", { class: "num", title: x.next_due ? "next due " + fmtTime(x.next_due) : "" }, num(x.delayed)),
    pauseCell({ relay: x.name }, x.paused_at))));
  const held = r.relays.flatMap((x) => (x.held || []).map((h) => el("li", { "data-relay": x.name, "data-topic": h.topic },
    `Relay ${x.name} holds topic ${h.topic}: ${num(h.rows)} row(s) wait since ${fmtTime(h.since)} because publishing to it fails (the relay's log says why); the other topics go on.`)));
  $("held").replaceChildren(...held);
  $("held").hidden = !held.length;
  // A position recorded on another cluster (a restore): the relay forwards nothing until rebased.
  const moved = r.relays.filter((x) => x.moved).map((x) => el("li", { "data-relay": x.name }, x.finding));
  $("moved").replaceChildren(...moved);
  $("moved").hidden = !moved.length;
  fillSelect($("forget-relay"), r.relays.map((x) => x.name), $("forget-relay").value);
  $("forget-ask").disabled = !r.relays.length;
  const rej = $("rejected");
  rej.textContent = r.rejected
    ? `${r.rejected} outbox row(s) were set aside in outbox_rejected: they could not be decoded, or the broker refused them for good. Open one to see its payload and error, and republish it once the cause is fixed.`
    : "No rejected outbox rows.";
  rej.className = r.rejected ? "warn" : "muted";
}

async function loadRejected(append) {
  const q = new URLSearchParams({ limit: "50" });
  if (state.relay) q.set("relay", state.relay);
  if (state.rejectedSince) q.set("rejected_after", sinceParam(state.rejectedSince));
  if (append && state.rejectedAfter) q.set("after", String(state.rejectedAfter));
  const r = await api("outbox/rejected?" + q);
  const body = $("rejected-rows").tBodies[0];
  const rows = r.rows.map((x) => el("tr", { "data-offset": String(x.offset), "data-relay": x.relay },
    el("td", { class: "num" }, el("button", { class: "link", type: "button", onclick: () => inspectRejected(x.offset, x.relay) }, String(x.offset))),
    td(x.relay), td(x.uuid), td(x.topic || "—"), td(fmtBytes(x.payload_size), "num"), td(x.last_error, "err"), td(fmtTime(x.rejected_at))));
  if (append) body.append(...rows); else body.replaceChildren(...rows);
  if (!body.rows.length) emptyRow(body, 7, "No rejected rows match.");
  state.rejectedAfter = r.next_after || 0;
  $("r-more").hidden = !state.rejectedAfter;
}

// askForget shows what forgetting the chosen relay would drop (a dry run) and asks to confirm.
async function askForget() {
  const relay = $("forget-relay").value;
  if (!relay) return;
  try {
    const r = await api("outbox/forget", { relay, dry_run: true });
    const held = r.held.length ? `, ${r.held.length} held topic(s)` : "";
    $("forget-text").textContent = `Relay ${relay} has ${num(r.backlog)} row(s) it has not forwarded${held}; no relay of that name forwards them once it is forgotten.`;
    $("forget-yes").dataset.relay = relay;
    $("forget-confirm").hidden = false;
    $("forget-ask").hidden = true;
  } catch (e) { flash(e.message, true); }
}

function cancelForget() {
  $("forget-confirm").hidden = true;
  $("forget-ask").hidden = false;
}

async function confirmForget() {
  const relay = $("forget-yes").dataset.relay;
  cancelForget();
  try {
    await api("outbox/forget", { relay, dry_run: false });
    flash(`Relay ${relay} is forgotten: it no longer holds back outbox cleanup.`);
    await refresh();
  } catch (e) { flash(e.message, true); }
}

// ---- Failure groups -------------------------------------------------------------------------

const actionLabels = { replay: "Replay", skip: "Skip", discard: "Discard" };
const groupWhere = (g) => ({ inbox: g.consumer, parked: g.handler || "—", rejected: g.relay })[g.kind];
const groupKinds = { inbox: "inbox (FAILED)", parked: "parked (poison queue)", rejected: "outbox (rejected)" };

async function loadFailures() {
  const r = await api("failures");
  const body = $("failure-groups").tBodies[0];
  $("failures-left").hidden = !r.left_out;
  $("failures-left").textContent = r.left_out
    ? `${num(r.left_out)} older row(s) are not grouped: the groups cover the newest ${num(r.max_rows)} of each kind (\`wmonce failures -max-rows 0\` groups every row). Actions reach every row of a group.`
    : "";
  if (!r.groups.length) { emptyRow(body, 8, "No failed inbox rows, parked messages or rejected outbox rows."); return; }
  body.replaceChildren(...r.groups.map((g) => {
    const actions = el("td", { class: "writes" }, ...g.actions.map((a) => el("button", {
      type: "button", class: "g-" + a + (a === "replay" ? "" : " danger"), onclick: () => askGroup(g, a),
    }, actionLabels[a] + "…")));
    return el("tr", { "data-fingerprint": g.fingerprint, "data-kind": g.kind },
      td(groupKinds[g.kind]), td(groupWhere(g)), td(g.topic || "—"),
      el("td", { class: "pattern err", title: "example: " + g.example }, g.pattern), td(num(g.rows), "num"),
      td(fmtTime(g.first_seen)), td(fmtTime(g.last_seen)), actions);
  }));
}

// askGroup runs the action as a dry run and shows exactly which rows it would touch; the
// confirmation sends those ids, so rows that joined the group since are left alone.
async function askGroup(g, action) {
  try {
    const r = await api("failures/act", { kind: g.kind, fingerprint: g.fingerprint, action, dry_run: true });
    if (!r.rows) { flash("The group has no rows left: nothing to do."); await refresh(); return; }
    const what = {
      inbox: `inbox row(s) of consumer ${g.consumer}`,
      parked: `parked message(s)${g.handler ? " of handler " + g.handler : ""}`,
      rejected: `rejected outbox row(s) of relay ${r.relay}`,
    }[g.kind];
    const effect = {
      replay: {
        inbox: "will run again (PENDING, attempts reset)",
        parked: "will be stored in the outbox again for the topic they were consumed from",
        rejected: "will be stored in the outbox again and forwarded",
      }[g.kind],
      skip: "will be marked SKIPPED: they will not run, and stay as dedupe records",
      discard: g.kind === "parked"
        ? "will be set aside: never replayed (their copies stay in the poison topic)"
        : "will be deleted from outbox_rejected: they are the only copy of those messages",
    }[action];
    $("g-confirm-text").textContent = `${actionLabels[action]}: ${r.rows} ${what}${g.topic ? " on topic " + g.topic : ""} ${effect}.`;
    $("g-confirm-ids").textContent = (g.kind === "inbox" ? "Row ids: " : "Outbox offsets: ") + r.ids.join(", ");
    if (r.undecodable && r.undecodable.length) $("g-confirm-ids").textContent += ` (${r.undecodable.length} cannot be replayed and stay: ${r.undecodable.join(", ")})`;
    $("g-reason").hidden = action !== "skip";
    $("g-reason").value = "";
    $("g-yes").textContent = `${actionLabels[action]} ${r.rows} row(s)`;
    state.group = { kind: g.kind, fingerprint: g.fingerprint, action, ids: r.ids };
    $("g-confirm").hidden = false;
    if (action === "skip") $("g-reason").focus();
  } catch (e) { flash(e.message, true); await refresh(); } // 404: the group is gone; show what is left
}

function cancelGroup() {
  $("g-confirm").hidden = true;
  state.group = null;
}

async function confirmGroup() {
  const g = state.group;
  if (!g) return;
  const body = { ...g, dry_run: false };
  if (g.action === "skip") {
    body.reason = $("g-reason").value.trim();
    if (!body.reason) { flash("Give a reason: it is kept with the skipped rows.", true); $("g-reason").focus(); return; }
  }
  cancelGroup();
  try {
    const r = await api("failures/act", body);
    const left = r.undecodable && r.undecodable.length ? `; ${r.undecodable.length} cannot be replayed and stay in the group` : "";
    flash(`${actionLabels[g.action]}: ${r.rows} row(s) of group ${g.fingerprint} changed${left}.`);
    await refresh();
  } catch (e) { flash(e.message, true); await refresh(); }
}

// ---- Page -----------------------------------------------------------------------------------

async function refresh() {
  const parts = [loadConsumers(), loadInbox(), loadOutbox(), loadHistory(), loadRejected(false), loadFailures()];
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
    showRows($("f-consumer").value, $("f-status").value, $("f-key").value.trim(), $("f-since").value).catch((e) => flash(e.message, true));
  });
  $("r-filter").addEventListener("submit", (ev) => {
    ev.preventDefault();
    Object.assign(state, { relay: $("r-relay").value, rejectedSince: $("r-since").value, rejectedAfter: 0 });
    loadRejected(false).catch((e) => flash(e.message, true));
  });
  $("more").addEventListener("click", () => loadRows(true).catch((e) => flash(e.message, true)));
  $("r-more").addEventListener("click", () => loadRejected(true).catch((e) => flash(e.message, true)));
  $("replay-all").addEventListener("click", askReplayAll);
  $("confirm-yes").addEventListener("click", confirmReplayAll);
  $("confirm-no").addEventListener("click", cancelConfirm);
  $("forget-ask").addEventListener("click", askForget);
  $("forget-yes").addEventListener("click", confirmForget);
  $("forget-no").addEventListener("click", cancelForget);
  $("g-yes").addEventListener("click", confirmGroup);
  $("g-no").addEventListener("click", cancelGroup);
  $("detail-close").addEventListener("click", closeDetail);
  $("detail").addEventListener("click", (ev) => { if (ev.target === $("detail")) closeDetail(); });
  document.addEventListener("keydown", (ev) => { if (ev.key === "Escape") closeDetail(); });
  for (const b of document.querySelectorAll("#toolbar [data-window]")) b.addEventListener("click", () => setWindow(b.dataset.window));
  $("c-filter").addEventListener("change", () => {
    state.chartConsumer = $("c-filter").value;
    loadHistory().catch((e) => flash(e.message, true));
  });
  try { await loadStatus(); } catch (e) { flash(e.message, true); }
  await refresh();
});
