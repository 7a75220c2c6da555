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

// Live refresh: fetch the same page and swap its <main>, unless the operator is busy
// with it (a checkbox ticked, an input focused) or the tab is hidden.
function busy(main) {
  if (main.querySelector("input[type=checkbox]:checked")) return true;
  const active = document.activeElement;
  return active && main.contains(active) && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName);
}

async function refresh(main) {
  if (document.hidden || busy(main)) return;
  try {
    const response = await fetch(window.location.href, {
      credentials: "same-origin",
      headers: { "X-Requested-With": "pgwork-dashboard" },
    });
    if (!response.ok) return;
    const page = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = page.getElementById("content");
    if (fresh) {
      main.replaceChildren(...fresh.childNodes);
      main.dispatchEvent(new CustomEvent("pgwork:refreshed", { bubbles: true }));
    }
  } catch (error) {
    // Offline for a moment: try again on the next tick.
  }
}

const main = document.getElementById("content");
const every = main && Number(main.getAttribute("data-refresh"));
if (every) {
  window.setInterval(() => refresh(main), every);
}
