// Live pages: the element with data-live is refreshed from that URL every data-every ms (short
// polling). The forms are outside it, so typing and focus are never disturbed.
(() => {
  const live = document.querySelector("[data-live]");
  if (!live) return;
  const every = Math.max(500, Number(live.dataset.every) || 3000);
  async function refresh() {
    const started = performance.now();
    try {
      const response = await fetch(live.dataset.live, { credentials: "same-origin", cache: "no-store" });
      if (response.status === 401) { window.location.assign("/login"); return; }
      if (response.ok) {
        live.innerHTML = await response.text();
        live.dataset.refreshed = String(Date.now());
      }
    } catch (error) {
      // The console is unreachable for a moment: keep the last picture and try again.
    }
    // A page the services are slow to make (a backlog of millions to count) is asked for less
    // often, so that an open tab keeps them busy a twentieth of the time at most.
    const wait = Math.max(every, 20 * (performance.now() - started));
    window.setTimeout(refresh, document.hidden ? wait * 5 : wait);
  }
  window.setTimeout(refresh, every);
})();
