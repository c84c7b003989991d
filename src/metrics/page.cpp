// The page a task serves at `/`: one HTML document with its style and script inline, so that it
// works wherever the metrics port is reachable, with nothing to install or fetch. It draws the
// JSON document of /api/cluster (the only data it reads) and fetches it again every 1.5 s; text from
// the document goes in through textContent only (log messages may hold bytes a peer sent).
#include "metrics/cluster_view.hpp"

namespace pscoro::metrics {

namespace {

constexpr std::string_view page = R"page(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>pscoro</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2430; background: #f4f6f9; }
header { background: #1d2430; color: #fff; padding: 10px 18px; display: flex; gap: 16px; align-items: baseline; }
header h1 { font-size: 18px; margin: 0; }
main { padding: 12px 18px; display: grid; gap: 14px; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); }
section { background: #fff; border: 1px solid #d8dde6; border-radius: 6px; padding: 10px 14px; }
section.wide { grid-column: 1 / -1; }
h2 { font-size: 15px; margin: 0 0 8px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #eef0f4; font-variant-numeric: tabular-nums; }
th { color: #5b6575; font-weight: 600; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 3px 14px; margin: 0; }
dt { color: #5b6575; }
dd { margin: 0; font-variant-numeric: tabular-nums; }
#status { padding: 8px 18px; font-weight: 600; }
#status[data-state="live"] { background: #e3f4e6; color: #1e6b2e; }
#status[data-state="connecting"] { background: #eef0f4; color: #5b6575; }
#status[data-state="unreachable"] { background: #fbe3e1; color: #9b1c12; }
.up { color: #1e6b2e; } .down { color: #9b1c12; } .unknown { color: #5b6575; }
.curves { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; }
figcaption { font-size: 12px; color: #5b6575; }
svg { background: #fafbfc; border: 1px solid #eef0f4; }
polyline { fill: none; stroke: #2a66c9; stroke-width: 1.5; }
.problem-WARNING td:first-child { color: #8a5a00; } .problem-ERROR td:first-child { color: #9b1c12; }
.muted { color: #5b6575; }
a { color: #8fb8ff; }
section a { color: #2a66c9; }
</style>
</head>
<body>
<header><h1 id="title">pscoro</h1><span id="subtitle" class="muted"></span></header>
<div id="status" data-state="connecting">Connecting…</div>
<main id="main"></main>
<script>
"use strict";
const API = "api/cluster";
const REFRESH_MS = 1500;
let who = "the task";
let failedSince = null;

function el(tag, attrs, ...children) {
  const node = tag === "svg" || tag === "polyline" || tag === "line" || tag === "text"
    ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return node;
}
function num(v, digits) {
  if (v == null) return "–";
  if (digits != null) return Number(v).toFixed(digits);
  return Number.isInteger(v) ? String(v) : Number(v).toPrecision(4);
}
function bytes(v) {
  if (v == null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; ++i; }
  return (i ? v.toFixed(1) : String(v)) + " " + units[i];
}
function duration(s) {
  if (s == null) return "–";
  s = Math.round(s);
  const h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60, r = s % 60;
  return h ? `${h}:${String(m).padStart(2, "0")}:${String(r).padStart(2, "0")}` : m ? `${m}:${String(r).padStart(2, "0")}` : `${r}s`;
}
function clock(t) { return t == null ? "–" : new Date(t * 1000).toLocaleTimeString(); }
function section(title, wide, ...content) {
  return el("section", wide ? {class: "wide"} : {}, el("h2", {}, title), ...content);
}
function table(head, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, ...head.map(h => el("th", {}, h)))), el("tbody", {}, ...rows));
}
function pairs(list) {
  const dl = el("dl");
  for (const [k, v] of list) dl.append(el("dt", {}, k), el("dd", {"data-field": k}, v));
  return dl;
}

function curve(tag, c) {
  const W = 360, H = 130, P = 6;
  const pts = c.points.filter(p => p[1] != null);
  const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const sx = x => P + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (W - 2 * P);
  const sy = y => H - P - (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5) * (H - 2 * P);
  const line = el("polyline", {"data-points": pts.length, points: pts.map(p => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ")});
  return el("figure", {"data-curve": tag},
    el("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": tag}, line),
    el("figcaption", {}, `${tag}: ${num(c.last_value)} at step ${c.last_step}` + (pts.length ? ` (range ${num(y0)} – ${num(y1)})` : "")));
}

function problems(d) {
  const rows = d.problems.recent.slice().reverse().map(p =>
    el("tr", {"data-problem": p.level, class: "problem-" + p.level}, el("td", {}, p.level), el("td", {}, clock(p.time)),
       el("td", {}, p.task), el("td", {}, p.message)));
  return section(`Recent warnings and errors (${d.problems.logged} logged)`, true,
    rows.length ? table(["level", "time", "task", "message"], rows) : el("p", {class: "muted"}, "None."));
}

function curves(d) {
  const tags = Object.keys(d.scalars);
  return section("Scalars", true, tags.length ? el("div", {class: "curves"}, ...tags.map(t => curve(t, d.scalars[t])))
    : el("p", {class: "muted"}, "No scalar written through the summary writer yet."));
}

function chiefView(d) {
  const j = d.job;
  const job = section("Job", false, pairs([
    ["state", j.state], ["step", j.total_steps != null ? `${num(j.step)} / ${num(j.total_steps)}` : num(j.step)],
    ["steps/s", num(j.steps_per_second, 1)], ["ETA", duration(j.eta_seconds)], ["elapsed", duration(j.elapsed_seconds)],
    ["started", clock(j.started)]]));
  job.setAttribute("data-job-state", j.state);
  const q = d.queue;
  const queue = section("Queue", false, pairs([
    ["queued", num(q.queued)], ["in flight", num(q.in_flight)], ["scheduled", num(q.scheduled_total)],
    ["done", num(q.done_total)], ["scheduled/s", num(q.scheduled_per_second, 1)], ["done/s", num(q.done_per_second, 1)]]));
  const workers = section(`Workers (${d.workers.length})`, true, table(
    ["task", "address", "state", "succeeded", "failed", "in flight", "last heard", "restarts"],
    d.workers.map(w => el("tr", {"data-worker": w.task, "data-state": w.state},
      el("td", {}, w.task), el("td", {}, w.address), el("td", {class: w.state}, w.state), el("td", {}, num(w.closures_succeeded)),
      el("td", {}, num(w.closures_failed)), el("td", {}, num(w.in_flight)),
      el("td", {}, w.heartbeat_age_seconds == null ? "–" : `${w.heartbeat_age_seconds.toFixed(1)} s ago`), el("td", {}, num(w.restarts))))));
  // The chief's placement (shards placed) beside what each ps reports of itself (variables with
  // their slots, bytes, memory, and the requests of every task).
  const psColumns = [
    ["task", p => p.task], ["address", p => p.address], ["shards placed", p => num(p.variables)],
    ["variables held", p => num(p.held_variables)], ["bytes held", p => bytes(p.held_bytes)],
    ["memory", p => bytes(p.resident_memory_bytes)], ["requests/s", p => num(p.requests_per_second, 1)],
    ["chief's requests/s", p => num(p.chief_requests_per_second, 1)],
    ["last heard", p => p.heartbeat_age_seconds == null ? "–" : `${p.heartbeat_age_seconds.toFixed(1)} s ago`]];
  const ps = section(`Parameter servers (${d.ps.length})`, true, table(psColumns.map(c => c[0]),
    d.ps.map(p => el("tr", {"data-ps": p.task}, ...psColumns.map(([name, cell]) => el("td", {"data-field": name}, cell(p)))))));
  const c = d.checkpoint;
  const checkpoint = section("Checkpoint", false, c ? pairs([["newest", c.path], ["step", num(c.step)], ["saved", clock(c.time)],
    ["took", `${num(c.seconds, 3)} s`]]) : el("p", {class: "muted"}, "None saved by this chief."));
  const process = section("Chief process", false, pairs([["memory", bytes(d.process.resident_memory_bytes)],
    ["CPU", `${num(d.process.cpu_seconds, 1)} s`]]));
  return [job, queue, checkpoint, process, workers, ps, curves(d), problems(d)];
}

function taskView(d) {
  const out = [];
  if (d.chief_page) out.push(section("Cluster", false, el("p", {}, "The cluster's page: ", el("a", {id: "chief-link", href: d.chief_page}, d.chief_page))));
  if (d.ps) out.push(section("Parameter server", false, pairs([["variables", num(d.ps.variables)], ["bytes held", bytes(d.ps.bytes)],
    ["requests/s", num(d.ps.requests_per_second, 1)]])));
  out.push(section("Process", false, pairs([["memory", bytes(d.process.resident_memory_bytes)], ["CPU", `${num(d.process.cpu_seconds, 1)} s`]])));
  if (Object.keys(d.scalars).length) out.push(curves(d));
  out.push(problems(d));
  out.push(section("Metrics", true, table(["name", "labels", "value"], d.series.map(s => el("tr", {"data-series": s.name},
    el("td", {}, s.name), el("td", {}, Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(", ")), el("td", {}, num(s.value)))))));
  return out;
}

function render(d) {
  who = d.view === "chief" ? "The chief" : d.task;
  document.title = `pscoro ${d.task}`;
  document.getElementById("title").textContent = `pscoro — ${d.task}`;
  document.getElementById("subtitle").textContent = d.view === "chief" ? "the cluster, as the chief sees it" : `${d.role}: this task's own view`;
  document.body.setAttribute("data-view", d.view);
  document.getElementById("main").replaceChildren(...(d.view === "chief" ? chiefView(d) : taskView(d)));
}

function setStatus(state, text) {
  const s = document.getElementById("status");
  s.setAttribute("data-state", state);
  s.textContent = text;
}

async function refresh() {
  try {
    const response = await fetch(API, {cache: "no-store"});
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const d = await response.json();
    failedSince = null;
    render(d);
    setStatus("live", `Live: updated ${new Date().toLocaleTimeString()}, every ${REFRESH_MS / 1000} s.`);
  } catch (e) {
    if (!failedSince) failedSince = new Date();
    setStatus("unreachable", `${who} is unreachable since ${failedSince.toLocaleTimeString()} (${e.message}): the job has ended, or the task stopped. The page shows the last data it had.`);
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}
refresh();
</script>
</body>
</html>
)page";

}  // namespace

std::string_view page_html() { return page; }

}  // namespace pscoro::metrics
