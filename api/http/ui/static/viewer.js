// Sandpit viewer: the only script of the pages (CSP: script-src 'self', no inline code).
// 1. A state diff in the timeline loads when it is first expanded (<details data-src>).
// 2. An evaluation page polls its progress JSON every 2 s while it runs, updates the
//    numbers in place, and reloads once the evaluation has finished (summary, tables).
"use strict";

function loadDiff(details) {
  if (details.dataset.loaded) return;
  details.dataset.loaded = "1";
  const body = details.querySelector(".diff-body");
  fetch(details.dataset.src, {credentials: "same-origin"})
    .then((r) => r.ok ? r.text() : Promise.reject(new Error(r.status + " " + r.statusText)))
    .then((html) => {
      // server-rendered, escaped HTML of our own origin (the same markup the diff page shows)
      const doc = new DOMParser().parseFromString(html, "text/html");
      body.replaceChildren(...doc.body.childNodes);
      details.classList.add("loaded");
    })
    .catch((err) => { body.textContent = "could not load the diff: " + err.message; });
}

function pollProgress(section) {
  const update = () => {
    fetch(section.dataset.poll, {credentials: "same-origin"})
      .then((r) => r.ok ? r.json() : Promise.reject(new Error(String(r.status))))
      .then((data) => {
        const p = data.progress;
        for (const name of ["done", "errors", "running", "pending", "cancelled", "total"]) {
          const el = section.querySelector(`[data-field="${name}"]`);
          if (el) el.textContent = String(p[name]);
        }
        section.querySelector('[data-field="status"]').textContent = data.status;
        const bar = section.querySelector('[data-field="bar"]');
        if (bar) { bar.max = Math.max(p.total, 1); bar.value = p.done + p.errors + p.cancelled; }
        section.dataset.polls = String(Number(section.dataset.polls || 0) + 1);
        if (data.finished) { window.location.reload(); } else { setTimeout(update, 2000); }
      })
      .catch(() => setTimeout(update, 5000));
  };
  setTimeout(update, 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  for (const details of document.querySelectorAll("details.lazy-diff")) {
    details.addEventListener("toggle", () => { if (details.open) loadDiff(details); });
  }
  const progress = document.querySelector("section.progress[data-poll]");
  if (progress && progress.dataset.finished !== "true") pollProgress(progress);
});
