// The library's status page: redraws what the server drew from
// status.json (see the kit's statusKit), and asks the server to draw
// again when the tiers or limits change.
statusKit.start(function (status) {
  const kit = statusKit;
  const tiers = status.tiers.map(function (t) { return t.name === null ? "" : t.name; });
  const limits = status.limits.map(function (l) { return l.name; });
  if (!kit.same("tr[data-tier]", "data-tier", tiers) || !kit.same("tr[data-limit]", "data-limit", limits)) {
    window.location.reload();
    return false;
  }
  kit.text("uptime", status.uptime_secs);
  const tierRows = document.querySelectorAll("tr[data-tier]");
  status.tiers.forEach(function (tier, i) {
    const row = tierRows[i];
    kit.fields(row, tier.last_minute, ["allowed", "refused", "shadow_limited", "waited", "other"]);
    kit.chart(row, [[tier.last_hour.allowed, "allowed"], [tier.last_hour.refused, "refused"]]);
  });
  const limitRows = document.querySelectorAll("tr[data-limit]");
  status.limits.forEach(function (limit, i) {
    const row = limitRows[i];
    kit.fields(row, limit.last_minute, ["refused", "shadow_limited"]);
    kit.chart(row, [[limit.last_hour.refused, "refused"], [limit.last_hour.shadow_limited, "shadow"]]);
  });
  const near = document.getElementById("near-rows");
  near.replaceChildren();
  status.near_limit.forEach(function (user) {
    const tr = document.createElement("tr");
    kit.cell(tr, user.tier);
    kit.cell(tr, user.limit === null ? "(ban)" : user.limit);
    kit.cell(tr, user.user, "key");
    kit.cell(tr, user.of === null ? String(user.remaining) : user.remaining + " of " + user.of, "n");
    kit.cell(tr, user.answer, user.answer);
    kit.cell(tr, user.seen_secs_ago + " s ago", "n");
    near.appendChild(tr);
  });
  const store = status.store;
  kit.text("store-kind", store.kind);
  kit.text("store-breaker", store.breaker || "none (no fallback)");
  kit.text("store-errors", store.errors_last_minute);
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
    kit.cell(tr, reload.secs_ago + " s ago", "n");
    kit.cell(tr, reload.result);
    if (reload.error === null) {
      let detail = reload.tiers.join(", ");
      if (reload.fresh.length > 0) {
        detail += "; started fresh: " + reload.fresh.join(", ");
      }
      kit.cell(tr, detail);
    } else {
      kit.errorCell(tr, reload.error);
    }
    reloads.appendChild(tr);
  });
});
