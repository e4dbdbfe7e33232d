// Live pages: the element with data-live is refreshed from that URL every data-every ms (short
// polling). The forms are outside it, so typing and focus are never disturbed.
(() => {
  const live = document.querySelector("[data-live]");
  if (!live) return;
  const every = Math.max(500, Number(live.dataset.every) || 3000);
  async function refresh() {
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
    window.setTimeout(refresh, document.hidden ? every * 5 : every);
  }
  window.setTimeout(refresh, every);
})();
