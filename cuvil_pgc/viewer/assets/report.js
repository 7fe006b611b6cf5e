/* cuvil-pgc report: draws the figures and makes tables sortable and filterable.
   Data comes only from the JSON block #cuvil-figures (JSON.parse, never eval); cell text is set
   by the server, escaped. window.cuvilReport exposes progress for tests. */
(function () {
  "use strict";
  var state = { expected: 0, rendered: 0, errors: [] };
  window.cuvilReport = state;

  function readFigures() {
    var el = document.getElementById("cuvil-figures");
    return el ? JSON.parse(el.textContent) : {};
  }

  function showProblem(div, message) {
    var p = document.createElement("p");
    p.className = "note warn";
    p.textContent = message;
    div.appendChild(p);
  }

  function renderFigures() {
    var figures = readFigures();
    var divs = document.querySelectorAll("div.plot[data-figure]");
    var pending = [];
    state.expected = divs.length;
    divs.forEach(function (div) {
      var key = div.getAttribute("data-figure");
      var fig = figures[key];
      if (!fig) { state.errors.push("no figure data for " + key); return; }
      if (typeof window.Plotly === "undefined") {
        showProblem(div, "plotly.js could not be loaded (offline with --plotly-js cdn?): "
          + "regenerate the report with --plotly-js inline.");
        state.errors.push("plotly.js missing");
        return;
      }
      var config = { responsive: true, displaylogo: false, scrollZoom: false };
      if (figures._template && fig.layout && !fig.layout.template) { fig.layout.template = figures._template; }
      if (fig.layout && fig.layout.height) { div.style.height = fig.layout.height + "px"; }
      pending.push(window.Plotly.newPlot(div, fig.data, fig.layout, config).then(function () {
        state.rendered += 1;
      }));
    });
    Promise.all(pending).then(function () {
      document.body.setAttribute("data-ready", state.errors.length ? "error" : "1");
    }, function (err) {
      state.errors.push(String(err));
      document.body.setAttribute("data-ready", "error");
    });
  }

  function sortValue(cell) {
    var v = cell.getAttribute("data-v");
    if (v === null) { return { num: false, v: cell.textContent.trim().toLowerCase() }; }
    var n = parseFloat(v);
    return isNaN(n) ? { num: false, v: v.toLowerCase() } : { num: true, v: n };
  }

  function sortBy(table, th, col) {
    var asc = th.getAttribute("aria-sort") !== "ascending";
    if (th.getAttribute("aria-sort") === null && th.classList.contains("num")) { asc = false; }
    table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (ra, rb) {
      var a = sortValue(ra.cells[col]), b = sortValue(rb.cells[col]);
      var c = (a.num && b.num) ? a.v - b.v : String(a.v).localeCompare(String(b.v));
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }

  function setupSorting() {
    document.querySelectorAll("table.sortable").forEach(function (table) {
      table.querySelectorAll("thead th").forEach(function (th, col) {
        th.setAttribute("tabindex", "0");
        th.addEventListener("click", function () { sortBy(table, th, col); });
        th.addEventListener("keydown", function (e) {
          if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(table, th, col); }
        });
      });
    });
  }

  function setupFilters() {
    document.querySelectorAll("input.table-filter").forEach(function (input) {
      var table = document.getElementById(input.getAttribute("data-table"));
      var count = document.getElementById(input.getAttribute("data-count"));
      if (!table) { return; }
      input.addEventListener("input", function () {
        var q = input.value.trim().toLowerCase(), shown = 0;
        Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
          var hit = !q || row.textContent.toLowerCase().indexOf(q) >= 0;
          row.hidden = !hit;
          if (hit) { shown += 1; }
        });
        if (count) { count.textContent = shown + " of " + table.tBodies[0].rows.length + " shown"; }
      });
    });
  }

  setupSorting();
  setupFilters();
  try { renderFigures(); } catch (err) {
    state.errors.push(String(err));
    document.body.setAttribute("data-ready", "error");
  }
}());
