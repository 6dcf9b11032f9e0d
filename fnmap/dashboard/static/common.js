// fnmap dashboard: helpers shared by both pages.
// Every string from storage goes into the page as text (textContent, createTextNode), never as
// HTML: a function named "<script>" or a traceback full of markup stays what it is.
"use strict";

const fnmap = {
  STATUSES: ["running", "succeeded", "failed", "cancelled", "capped", "incomplete", "abandoned"],
  STATES: ["succeeded", "done", "failed", "retried", "cancelled", "abandoned", "running"],
  POLL_MS: 2000,

  // An element with attributes (never innerHTML) and children (strings become text nodes).
  el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined) continue;
      if (name === "text") node.textContent = String(value);
      else node.setAttribute(name, String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  },

  // A class name for a known word only (a stored status is data, not markup).
  known(word, words) { return words.includes(word) ? word : "other"; },

  seconds(s) {
    if (s === null || s === undefined) return "-";
    if (s < 1) return (s * 1000).toFixed(0) + " ms";
    if (s < 120) return s.toFixed(1) + " s";
    if (s < 7200) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  },

  time(t) {
    if (!t) return "-";
    const d = new Date(t * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  },

  // Wall time: the job's, or for a running job the time since it started.
  wall(status, wallSeconds, created) {
    if (status === "running" && created) return fnmap.seconds(Date.now() / 1000 - created) + " so far";
    return fnmap.seconds(wallSeconds);
  },

  // GET JSON from this server; the cookie carries the token.
  async get(url) {
    const response = await fetch(url, {cache: "no-store", credentials: "same-origin"});
    const text = await response.text();
    if (!response.ok) {
      let message = text;
      try { message = JSON.parse(text).error || text; } catch (e) { /* plain text */ }
      throw new Error(`${response.status}: ${message}`);
    }
    return text;
  },

  // Call `tick` now and every POLL_MS while the tab is shown, until it returns false.
  poll(tick) {
    let timer = null;
    const run = async () => {
      timer = null;
      if (document.hidden) return;
      const again = await tick();
      if (again !== false) timer = setTimeout(run, fnmap.POLL_MS);
    };
    document.addEventListener("visibilitychange", () => { if (!document.hidden && timer === null) run(); });
    run();
  },

  showError(node, error) {
    node.hidden = !error;
    node.textContent = error ? String(error.message || error) : "";
  },

  // A small stacked bar of calls per state.
  stateBar(states, total) {
    const bar = fnmap.el("div", {class: "bar"});
    for (const state of fnmap.STATES) {
      const n = states[state] || 0;
      if (!n || !total) continue;
      const part = fnmap.el("span", {class: "k-" + state, title: `${n} ${state}`});
      part.style.width = (100 * n / total) + "%";
      bar.append(part);
    }
    return bar;
  },

  statesText(states) {
    const parts = fnmap.STATES.filter((s) => states[s]).map((s) => `${states[s]} ${s}`);
    return parts.length ? parts.join(", ") : "no calls";
  },

  statusBadge(status) {
    return fnmap.el("span", {class: "status status-" + fnmap.known(status, fnmap.STATUSES), text: status || "?"});
  },
};
