// fnmap dashboard: one job's page, refreshed every 2 s while the job runs.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const jobId = decodeURIComponent(location.pathname.split("/").pop());
  const api = "/api/jobs/" + encodeURIComponent(jobId);
  const COLOURS = {ok: "#4f9a5f", failed: "#c44e52", retried: "#dd8452", copy: "#8172b2",
                   stopped: "#9a9a9a", running: "#4c72b0"};
  let page = null;
  let lastText = null;

  function facts(node, pairs) {
    node.replaceChildren(...pairs.flatMap(([name, value]) =>
      [fnmap.el("dt", {text: name}), fnmap.el("dd", {text: value === null || value === undefined ? "-" : value})]));
  }

  function renderHead(s) {
    document.title = `fnmap job ${s.job_id.slice(0, 12)} ${s.function || ""}`;
    $("title").textContent = `${s.function || "?"}  ·  ${s.job_id}`;
    $("status").replaceWith(Object.assign(fnmap.statusBadge(s.status), {id: "status"}));
    const client = s.started_by || s.client || {};
    const d = s.duration_seconds || {};
    facts($("facts"), [
      ["kind / backend", `${s.kind || "?"} on ${s.backend || "?"}`],
      ["calls", `${fnmap.statesText(s.states || {})} of ${s.calls}`],
      ["items", `${s.items}` + (s.failed_items ? ` (${s.failed_items} failed)` : "")
        + (s.cache_hits ? ` (${s.cache_hits} from the result cache)` : "")],
      ["retries", `${s.retries} (${s.calls_retried} calls retried)`],
      ["started", fnmap.time(s.created)],
      ["wall", fnmap.wall(s.status, s.wall_seconds, s.created)],
      ["call run time", `p50 ${fnmap.seconds(d.p50)}, p95 ${fnmap.seconds(d.p95)}, max ${fnmap.seconds(d.max)}`],
      ["workers", `${s.workers} (${s.cold_starts} cold starts)`],
      ["started by", [client.host, client.pid ? "pid " + client.pid : null].filter(Boolean).join(" ") || "-"],
      ["from", s.origin],
      ["storage", s.storage],
    ]);
    $("notes").replaceChildren(...(page ? page.notes : []).map((note) => fnmap.el("li", {text: note})));
  }

  // The summary from the job's index entry, shown while a big job's record is read.
  async function early() {
    try {
      const summary = JSON.parse(await fnmap.get(api + "/summary")).summary;
      if (!page) {
        renderHead(summary);
        $("timeline-note").textContent = `reading the record of ${summary.calls} calls`;
      }
    } catch (e) { /* the page's own answer says what is wrong */ }
  }

  function renderCommands() {
    $("commands").replaceChildren(...page.commands.map((c) => {
      const button = fnmap.el("button", {type: "button", text: "copy"});
      button.addEventListener("click", () => navigator.clipboard && navigator.clipboard.writeText(c.command));
      return fnmap.el("div", {class: "command"}, fnmap.el("code", {text: c.command}), button,
                      fnmap.el("span", {class: "muted", text: c.does}));
    }));
  }

  function canvas2d(canvas) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth, height = canvas.clientHeight;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = "11px system-ui, sans-serif";
    return {ctx, width, height};
  }

  function timeAxis(ctx, left, width, y, end) {
    ctx.fillStyle = "#5f6b77";
    ctx.strokeStyle = "#d8dde3";
    for (let i = 0; i <= 5; i++) {
      const x = left + width * i / 5;
      ctx.beginPath(); ctx.moveTo(x, 0); ctx.lineTo(x, y); ctx.stroke();
      ctx.fillText(fnmap.seconds(end * i / 5), Math.min(x, left + width - 40), y + 13);
    }
  }

  function drawProgress() {
    const {ctx, width, height} = canvas2d($("progress"));
    const {points, items} = page.progress;
    const left = 50, plotW = width - left - 10, plotH = height - 20;
    const end = Math.max(points[points.length - 1][0], 1e-3);
    timeAxis(ctx, left, plotW, plotH, end);
    ctx.fillText(String(items), 4, 10);
    ctx.fillText("0", 4, plotH);
    ctx.strokeStyle = COLOURS.ok;
    ctx.lineWidth = 2;
    ctx.beginPath();
    let lastY = plotH;
    points.forEach(([t, done], i) => {  // a step: the count holds until the next call ends
      const x = left + plotW * t / end, y = plotH - plotH * done / Math.max(items, 1);
      if (i === 0) ctx.moveTo(x, y); else { ctx.lineTo(x, lastY); ctx.lineTo(x, y); }
      lastY = y;
    });
    ctx.stroke();
    ctx.lineWidth = 1;
  }

  const timeline = {rows: new Map(), scale: null};

  function drawTimeline() {
    const tl = page.timeline;
    const calls = tl.last_call + 1;  // calls are numbered from 0
    const canvas = $("timeline");
    canvas.style.height = Math.min(480, Math.max(120, calls * 8)) + "px";
    const {ctx, width, height} = canvas2d(canvas);
    const left = 50, plotW = width - left - 10, plotH = height - 20;
    const end = Math.max(tl.end, 1e-3);
    const rowH = plotH / calls;
    timeAxis(ctx, left, plotW, plotH, end);
    ctx.fillText("0", 4, 10);
    ctx.fillText(String(tl.last_call), 4, plotH);
    timeline.rows = new Map();
    timeline.scale = {left, plotW, plotH, end, rowH};
    tl.kinds.forEach((kind, k) => {
      ctx.fillStyle = COLOURS[kind];
      for (const bar of tl.bars) {
        if (bar[3] !== k) continue;
        const x = left + plotW * bar[1] / end;
        const w = Math.max(1, plotW * (bar[2] - bar[1]) / end);
        const y = bar[0] * rowH;
        ctx.fillRect(x, y, w, Math.max(1, rowH * 0.8));
      }
    });
    const step = Math.max(rowH, 3);  // pixels a hover looks at: a row, or a band of rows
    timeline.scale.step = step;
    for (const bar of tl.bars) {
      const row = Math.floor(bar[0] * rowH / step);
      if (!timeline.rows.has(row)) timeline.rows.set(row, []);
      timeline.rows.get(row).push(bar);
    }
    $("legend").replaceChildren(...tl.kinds.map((kind) => {
      const swatch = fnmap.el("i");
      swatch.style.background = COLOURS[kind];
      return fnmap.el("span", {}, swatch, kind);
    }));
    $("timeline-note").textContent = tl.bars.length < tl.total
      ? `${tl.bars.length} of ${tl.total} attempts drawn: every one not plainly ok, and a sample of the rest`
      : `${tl.total} attempts`;
  }

  function timelineTip(event) {
    const tip = $("tip");
    const s = timeline.scale;
    if (!s) return;
    const rect = $("timeline").getBoundingClientRect();
    const y = event.clientY - rect.top;
    const row = Math.floor(y / s.step);
    const bars = y < s.plotH ? timeline.rows.get(row) : null;
    if (!bars) { tip.hidden = true; return; }
    const kinds = page.timeline.kinds;
    tip.textContent = bars.slice(0, 6).map((b) =>
      `call ${b[0]}: ${kinds[b[3]]} ${fnmap.seconds(b[1])} to ${fnmap.seconds(b[2])}`).join("\n");
    tip.hidden = false;
    tip.style.left = Math.min(event.clientX - rect.left + 12, rect.width - 260) + "px";
    tip.style.top = (y + 12) + "px";
  }

  function renderFailures() {
    const f = page.failures;
    $("failures-note").textContent = f.total ? `${f.total} calls failed` + (f.total > f.calls.length ? `, the first ${f.calls.length} shown` : "") : "none";
    $("failures").replaceChildren(...f.calls.map((c) => {
      const button = fnmap.el("button", {type: "button", text: "output"});
      button.addEventListener("click", () => { $("call-number").value = c.call; showOutput(c.call); });
      return fnmap.el("details", {"data-call": c.call},
        fnmap.el("summary", {text: `call ${c.call} (items ${c.items}): ${c.status}: ${c.error || "?"}`}),
        c.traceback ? fnmap.el("pre", {class: "traceback", text: c.traceback}) : fnmap.el("p", {class: "muted", text: "no traceback (a platform fault)"}),
        button);
    }));
    const first = $("failures").querySelector("details");
    if (first && !$("failures").dataset.opened) { first.open = true; $("failures").dataset.opened = "1"; }
  }

  async function showOutput(call) {
    const out = $("output");
    try {
      const data = JSON.parse(await fnmap.get(`${api}/calls/${encodeURIComponent(call)}`));
      const parts = data.attempts.flatMap((a) => [fnmap.el("div", {class: "muted", text: `call ${call}, attempt ${a.attempt}`}),
                                                  fnmap.el("pre", {text: a.text})]);
      const failed = page && page.failures.calls.find((c) => String(c.call) === String(call));
      if (failed && failed.traceback) parts.push(fnmap.el("div", {class: "muted", text: `call ${call}, traceback`}), fnmap.el("pre", {text: failed.traceback}));
      if (!parts.length) parts.push(fnmap.el("p", {class: "muted", text: data.reported.length ? `call ${call} printed nothing` : `call ${call} printed nothing and has no status record (it never ran, or never reported)`}));
      out.replaceChildren(...parts);
    } catch (e) {
      out.replaceChildren(fnmap.el("p", {class: "error", text: String(e.message || e)}));
    }
  }

  function render() {
    const s = page.summary;
    renderHead(s);
    renderCommands();
    drawProgress();
    drawTimeline();
    renderFailures();
    facts($("options"), Object.entries(page.options).map(([k, v]) => [k, typeof v === "object" && v !== null ? JSON.stringify(v) : v]));
    $("cost").textContent = "cost: " + page.cost_text;
  }

  async function refresh() {
    try {
      const text = await fnmap.get(api);
      fnmap.showError($("error"), null);
      if (text !== lastText) {
        lastText = text;
        page = JSON.parse(text);
        render();
      }
      $("updated").textContent = "updated " + fnmap.time(Date.now() / 1000);
      return page.summary.status === "running";
    } catch (e) {
      fnmap.showError($("error"), e);
      return true;
    }
  }

  $("timeline").addEventListener("mousemove", timelineTip);
  $("timeline").addEventListener("mouseleave", () => { $("tip").hidden = true; });
  $("call-show").addEventListener("click", () => showOutput($("call-number").value));
  window.addEventListener("resize", () => { if (page) { drawProgress(); drawTimeline(); } });
  early();
  fnmap.poll(refresh);
})();
