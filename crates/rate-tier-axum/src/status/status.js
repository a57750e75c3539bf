// Refreshes /status from status.json every few seconds. No framework: the
// page is whole without this script; it only updates what the server drew,
// and asks the server to draw again when the tiers or limits change.
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

  // The last hour of `series` ([values, class] pairs) in `row`'s chart.
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

  function fields(row, counts, names) {
    names.forEach(function (name) {
      row.querySelector('[data-field="' + name + '"]').textContent = counts[name];
    });
  }

  function same(selector, attribute, ids) {
    const shown = Array.from(document.querySelectorAll(selector)).map(function (tr) {
      return tr.getAttribute(attribute);
    });
    return shown.join("\n") === ids.join("\n");
  }

  function render(status) {
    const tiers = status.tiers.map(function (t) { return t.name === null ? "" : t.name; });
    const limits = status.limits.map(function (l) { return l.name; });
    if (!same("tr[data-tier]", "data-tier", tiers) || !same("tr[data-limit]", "data-limit", limits)) {
      // Other rows: the server draws them.
      window.location.reload();
      return;
    }
    document.getElementById("uptime").textContent = status.uptime_secs;
    const tierRows = document.querySelectorAll("tr[data-tier]");
    status.tiers.forEach(function (tier, i) {
      const row = tierRows[i];
      fields(row, tier.last_minute, ["allowed", "refused", "shadow_limited", "waited", "other"]);
      chart(row, [[tier.last_hour.allowed, "allowed"], [tier.last_hour.refused, "refused"]]);
    });
    const limitRows = document.querySelectorAll("tr[data-limit]");
    status.limits.forEach(function (limit, i) {
      const row = limitRows[i];
      fields(row, limit.last_minute, ["refused", "shadow_limited"]);
      chart(row, [[limit.last_hour.refused, "refused"], [limit.last_hour.shadow_limited, "shadow"]]);
    });
    const near = document.getElementById("near-rows");
    near.replaceChildren();
    status.near_limit.forEach(function (user) {
      const tr = document.createElement("tr");
      cell(tr, user.tier);
      cell(tr, user.limit === null ? "(ban)" : user.limit);
      cell(tr, user.user, "key");
      cell(tr, user.of === null ? String(user.remaining) : user.remaining + " of " + user.of, "n");
      cell(tr, user.answer, user.answer);
      cell(tr, user.seen_secs_ago + " s ago", "n");
      near.appendChild(tr);
    });
    const store = status.store;
    document.getElementById("store-kind").textContent = store.kind;
    document.getElementById("store-breaker").textContent = store.breaker || "none (no fallback)";
    document.getElementById("store-errors").textContent = store.errors_last_minute;
    const lastError = document.getElementById("store-last-error");
    lastError.replaceChildren();
    if (store.last_error === null) {
      lastError.textContent = "none";
    } else {
      const span = document.createElement("span");
      span.className = "error";
      span.textContent = store.last_error.storage + ": " + store.last_error.error;
      lastError.appendChild(span);
      lastError.appendChild(document.createTextNode(", " + store.last_error.secs_ago + " s ago"));
    }
    const reloads = document.getElementById("reload-rows");
    reloads.replaceChildren();
    status.reloads.forEach(function (reload) {
      const tr = document.createElement("tr");
      tr.className = reload.result;
      cell(tr, reload.secs_ago + " s ago", "n");
      cell(tr, reload.result);
      if (reload.error === null) {
        let detail = reload.tiers.join(", ");
        if (reload.fresh.length > 0) {
          detail += "; started fresh: " + reload.fresh.join(", ");
        }
        cell(tr, detail);
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
    // Relative to the page (the app may nest it under any path), without
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
      .then(render)
      .catch(function (error) {
        document.getElementById("updated").textContent = "refresh failed: " + error.message;
      });
  }

  refresh();
  window.setInterval(refresh, every);
})();
