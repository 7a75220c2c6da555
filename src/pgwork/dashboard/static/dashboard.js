// pgwork dashboard: the little that is better with a script. Every page works without it.
"use strict";

// Ask before destructive actions (forms marked data-confirm).
document.addEventListener("submit", (event) => {
  const form = event.target;
  const question = form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

// "Select all" checkboxes of the bulk forms.
document.addEventListener("change", (event) => {
  const box = event.target;
  const name = box.getAttribute && box.getAttribute("data-select-all");
  if (!name) return;
  for (const other of box.form.querySelectorAll(`input[type=checkbox][name="${name}"]`)) {
    other.checked = box.checked;
  }
});

// Live refresh: fetch the same page every few seconds and swap its <main> and the
// footer's time, unless the operator is busy with it (a checkbox ticked, an input
// focused) or the tab is hidden. One request at a time, each given up after a bound;
// while refreshes fail the page keeps its last good data, says so and since when, and
// tries again less and less often.
function busy(main) {
  if (main.querySelector("input[type=checkbox]:checked")) return true;
  const active = document.activeElement;
  return active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
}

const MAX_DELAY = 60000;

function clock(date) {
  return date.toISOString().slice(11, 19) + " UTC";
}

// One refresh: null when the page was swapped, else why it was not.
async function refresh(main, timeout) {
  const controller = new AbortController();
  const timer = window.setTimeout(() => controller.abort(), timeout);
  try {
    const response = await fetch(window.location.href, {
      credentials: "same-origin",
      headers: { "X-Requested-With": "pgwork-dashboard" },
      signal: controller.signal,
    });
    const page = new DOMParser().parseFromString(await response.text(), "text/html");
    if (!response.ok) {
      const said = page.querySelector("[data-testid=error-message]");
      const text = said ? said.textContent.trim().replace(/\.$/, "") : "";
      return `HTTP ${response.status}` + (text ? `: ${text}` : "");
    }
    const fresh = page.getElementById("content");
    if (!fresh) return "the answer was not a dashboard page";
    main.replaceChildren(...fresh.childNodes);
    const stamp = page.querySelector("footer [data-rendered]");
    const shown = document.querySelector("footer [data-rendered]");
    if (stamp && shown) shown.replaceWith(stamp);
    main.dispatchEvent(new CustomEvent("pgwork:refreshed", { bubbles: true }));
    return null;
  } catch (error) {
    return controller.signal.aborted
      ? `no answer within ${timeout / 1000} s`
      : "the dashboard could not be reached";
  } finally {
    window.clearTimeout(timer);
  }
}

function showState(every, failure, delay) {
  const banner = document.getElementById("stale");
  const state = document.querySelector("footer [data-refresh-state]");
  document.body.dataset.refresh = failure ? "stale" : "live";
  if (!failure) {
    if (banner) banner.hidden = true;
    if (state) state.textContent = `refreshes every ${every / 1000} s`;
    return;
  }
  const shown = document.querySelector("footer [data-rendered]");
  const since = shown ? shown.textContent : "an earlier time";
  const next = `next try in ${Math.round(delay / 1000)} s`;
  if (banner) {
    banner.textContent =
      `Not up to date: the refresh at ${clock(new Date())} failed (${failure}). ` +
      `Showing data from ${since}; ${next}.`;
    banner.hidden = false;
  }
  if (state) state.textContent = `stale, ${next}`;
}

function live(main, every) {
  const timeout = Math.max(2 * every, 10000);
  let failures = 0;
  async function tick() {
    let delay = every;
    if (!document.hidden && !busy(main)) {
      const failure = await refresh(main, timeout);
      failures = failure ? failures + 1 : 0;
      delay = Math.min(every * 2 ** failures, MAX_DELAY);
      showState(every, failure, delay);
    }
    window.setTimeout(tick, delay);
  }
  window.setTimeout(tick, every);
}

const main = document.getElementById("content");
const every = main && Number(main.getAttribute("data-refresh"));
if (every) {
  live(main, every);
}
