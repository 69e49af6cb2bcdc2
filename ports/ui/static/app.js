// The dashboard's only script of its own: the charts (uPlot) fed by the "chart" events of the
// page's SSE stream (/ui/events), and the live-connection dot. No inline script anywhere: the
// pages run under script-src 'self'.
(function () {
  "use strict";
  var charts = {};
  var palette = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04"];

  function width(el) { return Math.max(240, el.clientWidth || 600); }

  function draw(id, series, data) {
    var el = document.getElementById(id);
    if (!el || typeof uPlot === "undefined") { return; }
    var key = series.map(function (s) { return s.label; }).join("|");
    var c = charts[id];
    if (c && c.key !== key) { c.plot.destroy(); c = null; }
    if (!c) {
      var opts = { width: width(el), height: 220, series: [{}].concat(series),
        axes: [{}, { size: 60 }], legend: { live: false } };
      c = charts[id] = { key: key, plot: new uPlot(opts, data, el) };
      el.dataset.points = String(data[0].length);
      return;
    }
    c.plot.setData(data);
    el.dataset.points = String(data[0].length);
  }

  function onChart(raw) {
    var d;
    try { d = JSON.parse(raw); } catch (e) { return; }
    draw("chart-rate", [{ label: "check-ins/s", stroke: palette[0], width: 2 }], [d.t, d.rate]);
    var series = [], data = [d.t];
    (d.groups || []).forEach(function (g, i) {
      series.push({ label: g, stroke: palette[i % palette.length], width: 2 });
      data.push(d.lag[g]);
    });
    if (series.length) { draw("chart-lag", series, data); }
    var last = d.rate.length ? d.rate[d.rate.length - 1] : 0;
    var el = document.getElementById("chart-rate");
    if (el) { el.dataset.last = last === null ? "" : String(last); }
  }

  document.addEventListener("htmx:sseMessage", function (e) {
    if (e.detail && e.detail.type === "chart") { onChart(e.detail.data); }
    // The stream ended because the token expired (or lost its key): load the page again, which
    // goes to the login unless another tab has logged in meanwhile.
    if (e.detail && e.detail.type === "bye" && String(e.detail.data).indexOf("session ended") === 0) {
      window.location.reload();
    }
  });
  document.addEventListener("htmx:sseOpen", function () {
    var c = document.getElementById("conn");
    if (c) { c.className = "conn live"; c.title = "live"; }
  });
  document.addEventListener("htmx:sseError", function () {
    var c = document.getElementById("conn");
    if (c) { c.className = "conn down"; c.title = "reconnecting"; }
  });
  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (id) {
      var el = document.getElementById(id);
      if (el) { charts[id].plot.setSize({ width: width(el), height: 220 }); }
    });
  });
})();
