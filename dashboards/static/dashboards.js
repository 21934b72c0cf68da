// Draws every chart of a page from the JSON embedded next to it (the same rows its JSON and CSV
// endpoints return), with the plotly.js served from /static/plotly.min.js. No inline script.
(function () {
  "use strict";
  // Nothing on the toolbar may send the chart's data off the machine: no "Share chart..." (an upload to
  // Plotly Cloud, on by default in plotly.js), no Chart Studio link, no logo linking to plotly.com, and
  // no server to send to. Downloading the chart as a PNG stays (it is saved locally).
  var CONFIG = {
    displaylogo: false,
    responsive: true,
    showSendToCloud: false,
    showEditInChartStudio: false,
    showLink: false,
    plotlyServerURL: "",
    modeBarButtonsToRemove: ["sendChartToCloud", "sendDataToCloud", "editInChartStudio"]
  };
  function num(v) {
    if (v === null || v === undefined || v === "") return null;
    var n = Number(v);
    return isFinite(n) ? n : null;
  }
  var DAY_MS = 24 * 3600 * 1000;
  function draw(el) {
    var spec = JSON.parse(document.getElementById("data-" + el.dataset.chart).textContent);
    if (!spec.rows.length) {
      // nothing to draw: the card says "No data in this window." (no empty axes from -1 to 6)
      el.dataset.empty = "true";
      return Promise.resolve();
    }
    var x = spec.rows.map(function (r) { return r[spec.x]; });
    var traces = spec.series.map(function (s) {
      var y = spec.rows.map(function (r) { return num(r[s.key]); });
      if (spec.kind === "line") {
        return { type: "scatter", mode: "lines+markers", name: s.label, x: x, y: y };
      }
      return { type: "bar", name: s.label, x: x, y: y };
    });
    var layout = {
      barmode: spec.kind === "stacked" ? "relative" : "group",
      height: 340,
      margin: { t: 20, r: 20, b: 60, l: 70 },
      legend: { orientation: "h", y: -0.25 },
      xaxis: { title: { text: spec.x_title || "" }, automargin: true },
      yaxis: { title: { text: spec.y_title || "" }, rangemode: "tozero", automargin: true },
      template: undefined,
      paper_bgcolor: "#fff",
      plot_bgcolor: "#fff"
    };
    if (spec.x_type) layout.xaxis.type = spec.x_type;
    if (spec.y_percent) layout.yaxis.tickformat = ".0%";  // shares read as percent, like the page's cards
    if (spec.x === "day") {  // daily bars: dated ticks, one a day (not plotly's 12-hour ticks) up to a fortnight
      var days = x.map(function (t) { return Date.parse(t); });
      layout.xaxis.tickformat = "%b %d";
      if (Math.max.apply(null, days) - Math.min.apply(null, days) <= 14 * DAY_MS) layout.xaxis.dtick = DAY_MS;
    }
    return Plotly.newPlot(el, traces, layout, CONFIG);
  }
  function start() {
    var charts = Array.prototype.slice.call(document.querySelectorAll("[data-chart]"));
    Promise.all(charts.map(draw)).then(function () {
      document.body.dataset.chartsDrawn = String(charts.length);
    });
    var file = document.querySelector("[data-yaml-file]");
    var text = document.querySelector("[data-yaml-text]");
    if (file && text) {
      file.addEventListener("change", function () {
        var f = file.files && file.files[0];
        if (!f) return;
        var form = file.form;
        if (form && form.elements.filename) form.elements.filename.value = f.name;
        f.text().then(function (t) { text.value = t; });
      });
    }
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
