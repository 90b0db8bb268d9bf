// hpc-cluster dashboard: fetches the page's JSON every few seconds and redraws it, no reloads.
// Hand-written, no libraries. Text from the cluster (keys, evidence, log lines) only ever goes
// into textContent, never into HTML.
"use strict";

const REFRESH_MS = 2500;
const SVG = "http://www.w3.org/2000/svg";
const PAGES = {workers: drawWorkers, tasks: drawTasks, jobs: drawJobs, deaths: drawDeaths};
const memoryCache = new Map();       // death id -> its timeline, once the death's verdict is final

// The token came in the link (?token=...): the server set a cookie, so the address bar need not show it.
if (location.search.includes("token=")) {
  history.replaceState(null, "", location.pathname + location.hash);
}

function el(tag, attrs, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") node.setAttribute("class", v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(n < 10 ? 2 : 1) : n.toFixed(0)) + " " + units[i];
}

function duration(s) {
  if (s === null || s === undefined) return "-";
  if (s < 0) return "over";
  if (s < 90) return s.toFixed(0) + " s";
  if (s < 5400) return (s / 60).toFixed(0) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function clock(t) {
  return t ? new Date(t * 1000).toLocaleTimeString() : "-";
}

function table(headers, rows) {
  const head = el("tr", null, ...headers.map(([label, cls]) => el("th", {class: cls}, label)));
  return el("table", null, el("thead", null, head), el("tbody", null, ...rows));
}

function cell(value, cls) {
  return el("td", {class: cls}, value instanceof Node ? value : String(value ?? "-"));
}

async function getJSON(path) {
  const r = await fetch(path, {credentials: "same-origin", cache: "no-store"});
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}

// -- workers ------------------------------------------------------------------------------
function memoryBar(w) {
  const limit = w.memory_limit || Math.max(w.rss || 0, 1);
  const pct = (x) => Math.min(100, 100 * (x || 0) / limit) + "%";
  const bar = el("div", {class: "bar", title: "managed (results held) / process RSS / limit"});
  const managed = Math.min(w.managed || 0, w.rss || w.managed || 0);
  const unmanaged = el("span", {class: (w.terminate_at && w.rss > w.terminate_at) ? "over" : "unmanaged"});
  unmanaged.style.left = "0"; unmanaged.style.width = pct(w.rss);
  const held = el("span", {class: "managed"});
  held.style.left = "0"; held.style.width = pct(managed);
  bar.append(unmanaged, held);
  for (const [at, cls] of [[w.pause_at, "pause"], [w.terminate_at, "mark"]]) {
    if (!at || !w.memory_limit) continue;
    const m = el("span", {class: cls}); m.style.left = pct(at); bar.append(m);
  }
  const label = el("div", {class: "barlabel"},
    `${bytes(w.rss)} of ${w.memory_limit ? bytes(w.memory_limit) : "no limit"}; results ${bytes(w.managed)}` +
    (w.spilled ? `, spilled ${bytes(w.spilled)}` : ""));
  return el("div", null, bar, label);
}

function drawWorkers(data, root) {
  const ws = data.workers;
  const threads = ws.reduce((a, w) => a + w.nthreads, 0);
  const running = ws.reduce((a, w) => a + w.executing, 0);
  root.append(el("p", {class: "summary"},
    `${data.total} worker(s), ${threads} thread(s), ${running} task(s) running` +
    (data.total > ws.length ? ` (first ${ws.length} shown)` : "")));
  if (!ws.length) { root.append(el("div", {class: "empty"}, "No worker is connected.")); return; }
  const rows = ws.map((w) => el("tr", null,
    cell(w.name), cell(w.node), cell(w.job_id), cell(w.pool),
    cell(w.nthreads, "num"), cell(`${w.executing} / ${w.processing}`, "num"), cell(w.stored, "num"),
    cell(memoryBar(w)), cell(duration(w.time_left), "num"),
    cell(el("span", {class: "state-" + w.status}, w.status))));
  root.append(table([["worker"], ["node"], ["job"], ["pool"], ["threads", "num"], ["running / assigned", "num"],
                     ["results", "num"], ["memory"], ["time left", "num"], ["state"]], rows));
}

// -- tasks --------------------------------------------------------------------------------
// A prefix's colour in the task stream: a fixed palette (red and black mean erred and lost).
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#8cd17d",
                 "#499894"];

function colour(name) {
  let h = 0;
  for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return PALETTE[h % PALETTE.length];
}

function drawTasks(data, root) {
  root.append(el("h2", null, "Progress by task prefix"));
  const age = data.now - data.counted_at;        // with many tasks the counts are made less often
  root.append(el("p", {class: "summary"}, `${data.tasks_total} task(s) known to the scheduler` +
    (data.prefixes_total > data.prefixes.length ? `; ${data.prefixes.length} of ${data.prefixes_total} prefixes` : "") +
    (age > 3 ? ` (counted ${age.toFixed(0)} s ago)` : "")));
  const legend = el("div", {class: "legend muted"});
  for (const k of ["memory", "processing", "waiting", "erred"]) legend.append(el("span", {class: "p-" + k}), k);
  root.append(legend);
  const rows = data.prefixes.map((p) => {
    const bar = el("div", {class: "progress", title: `${p.prefix}: ${p.memory} in memory, ${p.processing} ` +
      `processing, ${p.waiting} waiting, ${p.erred} erred, ${p.released} released`});
    for (const k of ["memory", "processing", "waiting", "erred"]) {
      if (!p[k]) continue;
      const s = el("span", {class: "p-" + k}); s.style.width = (100 * p[k] / p.total) + "%"; bar.append(s);
    }
    return el("tr", {class: "prefix"}, cell(p.prefix), cell(bar), cell(p.waiting, "num"), cell(p.processing, "num"),
      cell(p.memory, "num"), cell(p.erred, "num"), cell(p.released, "num"), cell(p.total, "num"));
  });
  if (rows.length) {
    root.append(table([["prefix"], ["progress"], ["waiting", "num"], ["processing", "num"], ["memory", "num"],
                       ["erred", "num"], ["released", "num"], ["total", "num"]], rows));
  } else {
    root.append(el("div", {class: "empty"}, "No task is known to the scheduler."));
  }
  root.append(el("h2", null, `Task stream (up to the last ${data.stream.window.toFixed(0)} s, a row per worker thread)`));
  root.append(taskStream(data));
}

function taskStream(data) {
  const s = data.stream;
  const lanes = [];
  for (const w of Object.keys(s.lanes).sort()) for (let i = 0; i < s.lanes[w]; i++) lanes.push(w + "#" + i);
  const row = new Map(lanes.map((l, i) => [l, i]));
  const left = 150, width = 900, rowH = 14;
  const height = Math.max(1, lanes.length) * rowH + 24;
  const svg = el("svg:svg", {class: "chart", width: left + width + 10, height, id: "task-stream"});
  // From the oldest bar shown (at most the window back) to now, so that a short run fills the width.
  const starts = [...s.done, ...s.running].map((t) => t.start);
  const from = Math.max(s.since, Math.min(data.now - 2, ...starts));
  const span = data.now - from;
  const x = (t) => left + width * Math.max(0, t - from) / span;
  lanes.forEach((l, i) => svg.append(el("svg:text", {x: 4, y: i * rowH + 11, text: l.replace("#", " thread ")})));
  const bars = (list, open) => {
    for (const t of list) {
      const i = row.get(t.worker + "#" + t.lane);
      if (i === undefined) continue;
      const stop = open ? data.now : t.stop;
      const fill = t.outcome === "erred" ? "#d8463b" : t.outcome === "lost" ? "#222" : colour(t.prefix);
      const r = el("svg:rect", {x: x(t.start).toFixed(1), y: i * rowH + 1, height: rowH - 2, fill,
        width: Math.max(1, x(stop) - x(t.start)).toFixed(1), class: open ? "task running" : "task"});
      r.append(el("svg:title", {text: `${t.key} on ${t.worker}: ${(stop - t.start).toFixed(3)} s` +
        (open ? " (running)" : ", " + t.outcome)}));
      svg.append(r);
    }
  };
  bars(s.done, false);
  bars(s.running, true);
  svg.append(el("svg:text", {x: left, y: height - 6, text: `-${span.toFixed(span < 10 ? 1 : 0)} s`}));
  svg.append(el("svg:text", {x: left + width - 24, y: height - 6, text: "now"}));
  return svg;
}

// -- jobs ---------------------------------------------------------------------------------
function drawJobs(data, root) {
  if (!data.batch) {
    root.append(el("div", {class: "empty"}, "This cluster runs no batch jobs (a LocalCluster): its workers " +
      "are processes on this machine. The workers page shows them."));
    return;
  }
  const pools = Object.entries(data.pools).map(([n, p]) => `${n}: target ${p.target} job(s)` +
    (p.max_jobs ? ` (max ${p.max_jobs})` : "") + `, ${p.cores} cores, ${bytes(p.memory)}, walltime ${duration(p.walltime)}`);
  root.append(el("p", {class: "summary"}, `${data.jobs_total} job(s); ` + pools.join("; ")));
  if (data.halted) root.append(el("p", {class: "death"}, "HALTED: " + data.halted));
  for (const e of data.errors) root.append(el("p", {class: "muted"}, `submit error at ${clock(e.time)}: ${e.message}`));
  const rows = data.jobs.map((j) => el("tr", null,
    cell(j.job_id), cell(j.pool), cell(el("span", {class: "state-" + j.state},
      j.raw_state && j.raw_state !== j.state ? `${j.state} (${j.raw_state})` : j.state)),
    cell(j.reason || ""), cell(j.node), cell((j.worker_names || []).join(", ")),
    cell(clock(j.submitted)), cell(clock(j.started)), cell(duration(j.time_left), "num"),
    cell(j.memory_used === null ? "-" : bytes(j.memory_used), "num"), cell(j.retiring ? "leaving" : "")));
  root.append(rows.length ? table([["job"], ["pool"], ["batch state"], ["pending reason"], ["node"], ["workers"],
    ["submitted"], ["started"], ["time left", "num"], ["memory used", "num"], [""]], rows)
    : el("div", {class: "empty"}, "No job yet: scale the cluster up (cluster.scale, hpc-cluster scale)."));
}

// -- deaths -------------------------------------------------------------------------------
function memoryChart(m) {
  const w = 640, h = 180, left = 62, right = 12, top = 10, bottom = 24;
  const samples = m.samples;
  const t0 = samples.length ? samples[0][0] : m.died_at;
  const t1 = Math.max(m.died_at || 0, samples.length ? samples[samples.length - 1][0] : 0, t0 + 1);
  const limits = [[m.memory_limit, "memory limit", "#7a8398"], [m.terminate_at, "nanny terminates", "#e08a20"],
                  [m.batch_limit, "batch limit", "#d8463b"]].filter(([v]) => v);
  const top_value = Math.max(1, ...samples.map((s) => s[1]), ...limits.map(([v]) => v)) * 1.08;
  const x = (t) => left + (w - left - right) * (t - t0) / (t1 - t0);
  const y = (v) => top + (h - top - bottom) * (1 - v / top_value);
  const svg = el("svg:svg", {class: "chart memory-chart", width: w, height: h, "data-points": samples.length});
  svg.append(el("svg:line", {x1: left, y1: y(0), x2: w - right, y2: y(0), stroke: "#cfd5df"}));
  svg.append(el("svg:text", {x: 4, y: y(top_value / 1.08) + 4, text: bytes(top_value / 1.08)}));
  svg.append(el("svg:text", {x: 4, y: y(0), text: "0"}));
  svg.append(el("svg:text", {x: left, y: h - 6, text: `${(t1 - t0).toFixed(1)} s before the death`}));
  limits.forEach(([v, label, c], i) => {
    svg.append(el("svg:line", {x1: left, x2: w - right, y1: y(v), y2: y(v), stroke: c, "stroke-dasharray": "5 3",
      class: "limit"}));
    // Side by side, above and below their lines in turn: limits are often a few percent apart.
    svg.append(el("svg:text", {x: left + 4 + i * 185, y: i % 2 ? y(v) + 12 : y(v) - 3, text: `${label} ${bytes(v)}`}));
  });
  for (const [t, key] of m.task_starts) {
    if (t < t0 || t > t1) continue;
    const tick = el("svg:line", {x1: x(t), x2: x(t), y1: h - bottom, y2: h - bottom - 8, stroke: "#3b7dd8",
      "stroke-width": 2, class: "task-start"});
    tick.append(el("svg:title", {text: `task ${key} started`}));
    svg.append(tick);
  }
  if (samples.length) {
    const pts = samples.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    svg.append(el("svg:polyline", {points: pts, fill: "none", stroke: "#3b7dd8", "stroke-width": 1.5,
      class: "samples"}));
  }
  if (m.died_at) {
    svg.append(el("svg:line", {x1: x(m.died_at), x2: x(m.died_at), y1: top, y2: h - bottom, stroke: "#d8463b",
      "stroke-width": 2, class: "died"}));
    svg.append(el("svg:text", {x: x(m.died_at) - 30, y: h - bottom - 12, text: "died"}));
  }
  return svg;
}

function deathBox(d, m) {
  const box = el("div", {class: "death" + (d.blame ? "" : " innocent"), id: "death-" + d.id, "data-cause": d.cause});
  box.append(el("h3", null, el("span", {class: "cause"}, d.cause), ` ${d.name || d.worker}`,
    el("span", {class: "muted"}, ` at ${clock(d.time)}` + (d.job_id ? `, job ${d.job_id}` : "") +
      (d.pool && d.pool !== "default" ? `, pool ${d.pool}` : "") +
      `, ${d.blame ? "charged to the task" : "not charged to any task"}` + (d.final ? "" : " (verdict not final yet)"))));
  box.append(el("div", {class: "text"}, d.text));
  if (d.executing.length) box.append(el("div", {class: "muted"}, "running: " + d.executing.join(", ")));
  if (d.escalation) box.append(el("div", null, "escalation: " + d.escalation));
  if (d.evidence.length) box.append(el("ul", {class: "evidence"}, ...d.evidence.map((e) => el("li", null, e))));
  if (d.advice) box.append(el("div", {class: "fix"}, "fix: " + d.advice));
  if (d.log_tail.length) box.append(el("pre", null, d.log_tail.join("\n")));
  const chart = el("div", {class: "timeline"});
  if (m && m.memory && m.memory.samples.length) chart.append(memoryChart(m.memory));
  else chart.append(el("div", {class: "muted no-samples"}, d.memory_samples ? "memory timeline: not shown (older death)"
    : "memory timeline: no samples"));
  box.append(chart);
  return box;
}

async function drawDeaths(data, root) {
  root.append(el("p", {class: "summary"}, `${data.total} worker death(s)` +
    (data.total > data.deaths.length ? `, newest ${data.deaths.length} shown` : "")));
  if (!data.deaths.length) { root.append(el("div", {class: "empty"}, "No worker has died.")); return; }
  // Timelines of the newest deaths, fetched once each when final (they do not change after).
  const timelines = new Map();
  await Promise.all(data.deaths.slice(0, 20).filter((d) => d.memory_samples).map(async (d) => {
    try {
      const m = memoryCache.get(d.id) || await getJSON(`api/deaths/${d.id}/memory`);
      timelines.set(d.id, m);
      if (d.final) memoryCache.set(d.id, m);
    } catch (e) {
      timelines.set(d.id, {memory: null});           // drawn as "no samples"; the rest of the page still is
    }
  }));
  for (const d of data.deaths) root.append(deathBox(d, timelines.get(d.id)));
}

// -- the loop -----------------------------------------------------------------------------
let timer = null;

async function refresh() {
  clearTimeout(timer);
  const page = (location.hash || "#workers").slice(1);
  const draw = PAGES[page] || drawWorkers;
  const name = PAGES[page] ? page : "workers";
  for (const p of Object.keys(PAGES)) document.getElementById("nav-" + p).classList.toggle("active", p === name);
  const status = document.getElementById("status");
  try {
    const data = await getJSON("api/" + name);
    const fresh = el("main", {id: "page", "data-page": name});
    await draw(data, fresh);
    document.getElementById("page").replaceWith(fresh);
    status.textContent = "updated " + new Date().toLocaleTimeString();
    status.classList.remove("stale");
  } catch (e) {
    status.textContent = "not updated: " + e.message;
    status.classList.add("stale");
  }
  timer = setTimeout(refresh, REFRESH_MS);
}

window.addEventListener("hashchange", refresh);
refresh();
