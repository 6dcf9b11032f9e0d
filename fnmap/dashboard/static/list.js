// fnmap dashboard: the front page, every job in storage, newest first, refreshed every 2 s.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  let jobs = [];
  let lastText = null;

  function matches(job) {
    const status = $("status-filter").value;
    const fn = $("function-filter").value.trim().toLowerCase();
    return (!status || job.status === status) && (!fn || (job.function || "").toLowerCase().includes(fn));
  }

  function row(job) {
    const link = fnmap.el("a", {href: "/jobs/" + encodeURIComponent(job.job_id), class: "mono",
                                title: job.job_id, text: job.job_id.slice(0, 12)});
    const calls = fnmap.el("td", {}, fnmap.el("div", {text: `${fnmap.statesText(job.states)} of ${job.calls}`}),
                           fnmap.stateBar(job.states, job.calls));
    const items = (job.failed_items ? `${job.items} (${job.failed_items} failed)` : String(job.items))
      + (job.cache_hits ? ` (${job.cache_hits} cached)` : "");
    const who = [job.host, job.pid ? "pid " + job.pid : null].filter(Boolean).join(" ");
    return fnmap.el("tr", {"data-job": job.job_id},
      fnmap.el("td", {}, link),
      fnmap.el("td", {}, fnmap.statusBadge(job.status)),
      fnmap.el("td", {class: "fn", text: job.function || "-"}),
      calls,
      fnmap.el("td", {class: "num", text: items}),
      fnmap.el("td", {class: "num", text: fnmap.time(job.created)}),
      fnmap.el("td", {class: "num", text: fnmap.wall(job.status, job.wall_seconds, job.created)}),
      fnmap.el("td", {class: "num", text: job.usd_text}),
      fnmap.el("td", {class: "who"}, fnmap.el("div", {text: who || "-"}),
               fnmap.el("div", {class: "muted", text: job.origin || ""})));
  }

  function render() {
    const shown = jobs.filter(matches);
    const body = document.createDocumentFragment();
    for (const job of shown) body.append(row(job));
    $("jobs").tBodies[0].replaceChildren(body);
    $("empty").hidden = jobs.length > 0;
    $("count").textContent = shown.length === jobs.length ? `${jobs.length} jobs` : `${shown.length} of ${jobs.length} jobs`;
  }

  function statusOptions() {
    const select = $("status-filter");
    const have = new Set([...select.options].map((o) => o.value));
    for (const status of new Set([...fnmap.STATUSES, ...jobs.map((j) => j.status)])) {
      if (!have.has(status)) select.append(fnmap.el("option", {value: status, text: status}));
    }
  }

  async function refresh() {
    try {
      const text = await fnmap.get("/api/jobs");
      fnmap.showError($("error"), null);
      if (text !== lastText) {
        lastText = text;
        const data = JSON.parse(text);
        jobs = data.jobs;
        $("storage").textContent = data.storage;
        statusOptions();
        render();
      }
      $("updated").textContent = "updated " + fnmap.time(Date.now() / 1000);
    } catch (e) {
      fnmap.showError($("error"), e);
    }
  }

  $("status-filter").addEventListener("change", render);
  $("function-filter").addEventListener("input", render);
  fnmap.poll(refresh);
})();
