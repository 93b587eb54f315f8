// durably dashboard: live updates without reloading, and forms sent in place.
// Listens to /api/events (server-sent events); when the version it pushes
// changes, fetches this page's HTML again (X-Partial: 1 returns only the main
// part) and swaps it in. Without EventSource, or when the stream is refused,
// polls /api/poll every second instead. body[data-live] says which is in use.
// What a person typed in a form survives the swap.
(function () {
  "use strict";
  let version = null;
  let busy = false;
  let polling = false;

  function query() {
    const wid = document.body.dataset.poll;
    return wid ? "?workflow_id=" + encodeURIComponent(wid) : "";
  }

  function pollUrl() { return "/api/poll" + query(); }

  // What a person has typed in the part swapped, keyed by where it is: a field by its
  // form's action and its name.
  function fieldKey(field) {
    return field.form ? field.form.getAttribute("action") + "|" + field.name : null;
  }

  function keep(main) {
    const typed = new Map();
    for (const field of main.querySelectorAll("form input[name], form textarea[name]")) {
      const key = fieldKey(field);
      if (key && field.type !== "hidden" && field.value !== field.defaultValue) {
        typed.set(key, field.value);
      }
    }
    const active = document.activeElement && main.contains(document.activeElement)
      ? fieldKey(document.activeElement) : null;
    return { typed, active };
  }

  function restore(main, kept) {
    for (const field of main.querySelectorAll("form input[name], form textarea[name]")) {
      const key = fieldKey(field);
      if (key && kept.typed.has(key)) { field.value = kept.typed.get(key); }
      if (key && key === kept.active) { field.focus(); }
    }
  }

  async function refresh() {
    const response = await fetch(location.href, { headers: { "X-Partial": "1" }, credentials: "same-origin" });
    if (response.redirected || !response.ok) { return; }
    const main = document.getElementById("live");
    const kept = keep(main);
    main.innerHTML = await response.text();
    restore(main, kept);
    document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
  }

  async function tick() {
    if (busy) { return; }
    busy = true;
    try {
      const response = await fetch(pollUrl(), { credentials: "same-origin" });
      if (response.status === 401) { location.href = "/login?next=" + encodeURIComponent(location.pathname); return; }
      if (response.ok) { await changed((await response.json()).version); }
    } catch (e) { /* the server is restarting: try again at the next tick */ }
    finally { busy = false; }
  }

  async function changed(next) {
    if (version !== null && next !== version) { await refresh(); }
    version = next;
  }

  function poll() {
    if (polling) { return; }
    polling = true;
    document.body.dataset.live = "poll";
    tick();
    setInterval(tick, 1000);
  }

  function listen() {
    if (!window.EventSource) { poll(); return; }
    const source = new EventSource("/api/events" + query());
    document.body.dataset.live = "events";
    source.addEventListener("version", function (event) {
      changed(JSON.parse(event.data).version);
    });
    source.onerror = function () {
      // CONNECTING: the stream ended or the server restarts; EventSource retries.
      // CLOSED: refused (logged out, say): polling notices and goes to the login page.
      if (source.readyState === EventSource.CLOSED) { poll(); }
    };
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
      // refused: what was typed stays to be mended; done: the form starts afresh
      if (!response.ok) { flash(await response.text()); } else { flash(""); form.reset(); }
    } finally {
      await refresh();
    }
  });

  listen();
})();
