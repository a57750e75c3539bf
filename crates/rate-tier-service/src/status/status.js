// Refreshes /status from /status.json every few seconds. No framework: the
// page is whole without this script; it only updates what the server drew.
"use strict";

(function () {
  const body = document.body;
  const every = Math.max(1, Number(body.dataset.refresh) || 5) * 1000;
  const WIDTH = 120;
  const HEIGHT = 24;

  function points(values, max) {
    const step = Math.floor(WIDTH / Math.max(1, values.length));
    return values
      .map(function (v, i) {
        const y = HEIGHT - 1 - Math.floor((v * (HEIGHT - 2)) / Math.max(1, max));
        return i * step + "," + y;
      })
      .join(" ");
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

  function render(status) {
    const ids = [];
    status.domains.forEach(function (domain) {
      domain.rules.forEach(function (rule) {
        ids.push(domain.name + "/" + rule.path);
      });
    });
    const shown = Array.from(document.querySelectorAll("tr[data-rule]")).map(function (tr) {
      return tr.dataset.rule;
    });
    if (ids.join("\n") !== shown.join("\n")) {
      // Another config: the server draws its rules.
      window.location.reload();
      return;
    }
    document.getElementById("uptime").textContent = status.uptime_secs;
    const store = status.store;
    document.getElementById("store-kind").textContent = store.kind;
    document.getElementById("store-breaker").textContent = store.breaker || "none (no fallback)";
    document.getElementById("store-decisions").textContent = store.decisions_last_minute;
    document.getElementById("store-latency").textContent =
      store.mean_latency_ms_last_minute === null ? "none" : store.mean_latency_ms_last_minute.toFixed(3) + " ms";
    const rows = document.querySelectorAll("tr[data-rule]");
    let i = 0;
    status.domains.forEach(function (domain) {
      domain.rules.forEach(function (rule) {
        const row = rows[i++];
        ["hits", "over_limit", "near_limit"].forEach(function (field) {
          row.querySelector('[data-field="' + field + '"]').textContent = rule.last_minute[field];
        });
        const max = Math.max.apply(null, rule.last_hour.hits.concat([0]));
        row.querySelector("polyline.hits").setAttribute("points", points(rule.last_hour.hits, max));
        row.querySelector("polyline.over").setAttribute("points", points(rule.last_hour.over_limit, max));
      });
    });
    const near = document.getElementById("near-rows");
    near.replaceChildren();
    status.near_limit.forEach(function (key) {
      const tr = document.createElement("tr");
      cell(tr, key.domain);
      cell(tr, key.rule);
      cell(tr, key.key, "key");
      cell(tr, key.remaining + " of " + key.limit, "n");
      cell(tr, key.refused ? "refused" : "near");
      cell(tr, key.seen_secs_ago + " s ago", "n");
      near.appendChild(tr);
    });
    const reloads = document.getElementById("reload-rows");
    reloads.replaceChildren();
    status.reloads.forEach(function (reload) {
      const tr = document.createElement("tr");
      tr.className = reload.result;
      cell(tr, new Date(reload.at_unix_secs * 1000).toUTCString());
      cell(tr, reload.result);
      if (reload.error === null) {
        cell(tr, reload.domains + " domains, " + reload.rules + " rules");
      } else {
        const td = cell(tr, "");
        const span = document.createElement("span");
        span.className = "error";
        span.textContent = reload.error;
        td.appendChild(span);
      }
      reloads.appendChild(tr);
    });
    document.getElementById("updated").textContent = "refreshed " + new Date().toISOString();
  }

  function refresh() {
    // Relative to the page, without the user and password a page's own
    // address may carry (fetch refuses those; the browser sends the
    // credentials it was given for the page).
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
      .then(render)
      .catch(function (error) {
        document.getElementById("updated").textContent = "refresh failed: " + error.message;
      });
  }

  refresh();
  window.setInterval(refresh, every);
})();
