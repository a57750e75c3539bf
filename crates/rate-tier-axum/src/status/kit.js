// What every status page's script is made of (the library's and the
// service's): `statusKit.start(render)` fetches the page's JSON twin every
// few seconds and hands it to `render`, which updates what the server drew
// (and returns false when it asked the server to draw again). No framework:
// a page is whole without its script.
"use strict";

window.statusKit = (function () {
  const WIDTH = 120;
  const HEIGHT = 24;

  // A polyline's points for `values` (oldest first) scaled to `max`, as the
  // server draws them.
  function points(values, max) {
    const step = Math.floor(WIDTH / Math.max(1, values.length));
    return values
      .map(function (v, i) {
        const y = HEIGHT - 1 - Math.floor((v * (HEIGHT - 2)) / Math.max(1, max));
        return i * step + "," + y;
      })
      .join(" ");
  }

  // The last hour of `series` ([values, class] pairs) in `row`'s chart, on
  // one scale.
  function chart(row, series) {
    const max = Math.max.apply(
      null,
      series.reduce(function (all, s) { return all.concat(s[0]); }, [0])
    );
    series.forEach(function (s) {
      row.querySelector("polyline." + s[1]).setAttribute("points", points(s[0], max));
    });
  }

  function cell(row, text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) {
      td.className = className;
    }
    row.appendChild(td);
    return td;
  }

  // A cell holding `text` as an error.
  function errorCell(row, text) {
    const td = cell(row, "");
    const span = document.createElement("span");
    span.className = "error";
    span.textContent = text;
    td.appendChild(span);
    return td;
  }

  // The `data-field` cells of `row`, from `counts`.
  function fields(row, counts, names) {
    names.forEach(function (name) {
      row.querySelector('[data-field="' + name + '"]').textContent = counts[name];
    });
  }

  // Whether the rows matching `selector` are, in order, those of `ids`.
  function same(selector, attribute, ids) {
    const shown = Array.from(document.querySelectorAll(selector)).map(function (tr) {
      return tr.getAttribute(attribute);
    });
    return shown.join("\n") === ids.join("\n");
  }

  function text(id, value) {
    document.getElementById(id).textContent = value;
  }

  function start(render) {
    const every = Math.max(1, Number(document.body.dataset.refresh) || 5) * 1000;
    function refresh() {
      // Relative to the page (it may be nested under any path), without
      // the user and password a page's address may carry (fetch refuses
      // those; the browser sends the credentials it was given for the page).
      const url = new URL("status.json", window.location.href);
      url.username = "";
      url.password = "";
      fetch(url, { cache: "no-store", credentials: "same-origin" })
        .then(function (response) {
          if (!response.ok) {
            throw new Error("HTTP " + response.status);
          }
          return response.json();
        })
        .then(function (status) {
          if (render(status) !== false) {
            text("updated", "refreshed " + new Date().toISOString());
          }
        })
        .catch(function (error) {
          text("updated", "refresh failed: " + error.message);
        });
    }
    refresh();
    window.setInterval(refresh, every);
  }

  return { cell: cell, chart: chart, errorCell: errorCell, fields: fields, same: same, start: start, text: text };
})();
