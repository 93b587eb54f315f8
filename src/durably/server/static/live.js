// durably dashboard: live updates without reloading, and forms sent in place.
// Polls /api/poll; when its version changes, fetches this page's HTML again
// (X-Partial: 1 returns only the main part) and swaps it in.
(function () {
  "use strict";
  let version = null;
  let busy = false;

  function pollUrl() {
    const wid = document.body.dataset.poll;
    return "/api/poll" + (wid ? "?workflow_id=" + encodeURIComponent(wid) : "");
  }

  async function refresh() {
    const response = await fetch(location.href, { headers: { "X-Partial": "1" }, credentials: "same-origin" });
    if (response.redirected || !response.ok) { return; }
    const main = document.getElementById("live");
    main.innerHTML = await response.text();
    document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
  }

  async function tick() {
    if (busy) { return; }
    busy = true;
    try {
      const response = await fetch(pollUrl(), { credentials: "same-origin" });
      if (response.status === 401) { location.href = "/login?next=" + encodeURIComponent(location.pathname); return; }
      if (response.ok) {
        const data = await response.json();
        if (version !== null && data.version !== version) { await refresh(); }
        version = data.version;
      }
    } catch (e) { /* the server is restarting: try again at the next tick */ }
    finally { busy = false; }
  }

  function flash(text) {
    const box = document.getElementById("flash");
    if (!box) { return; }
    box.textContent = text;
    box.hidden = !text;
  }

  document.addEventListener("submit", async function (event) {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-live")) { return; }
    event.preventDefault();
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) { return; }
    for (const b of form.querySelectorAll("button")) { b.disabled = true; }
    try {
      const response = await fetch(form.action, { method: "POST", body: new FormData(form), credentials: "same-origin" });
      if (!response.ok) { flash(await response.text()); } else { flash(""); }
    } finally {
      await refresh();
    }
  });

  tick();
  setInterval(tick, 1000);
})();
