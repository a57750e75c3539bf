// The service's status page: redraws what the server drew from
// status.json (see the kit's statusKit), and asks the server to draw again
// when the rules change (another config).
statusKit.start(function (status) {
  const kit = statusKit;
  const ids = [];
  status.domains.forEach(function (domain) {
    domain.rules.forEach(function (rule) {
      ids.push(domain.name + "/" + rule.path);
    });
  });
  if (!kit.same("tr[data-rule]", "data-rule", ids)) {
    window.location.reload();
    return false;
  }
  kit.text("uptime", status.uptime_secs);
  const store = status.store;
  kit.text("store-kind", store.kind);
  kit.text("store-breaker", store.breaker || "none (no fallback)");
  kit.text("store-decisions", store.decisions_last_minute);
  kit.text(
    "store-latency",
    store.mean_latency_ms_last_minute === null ? "none" : store.mean_latency_ms_last_minute.toFixed(3) + " ms"
  );
  const rows = document.querySelectorAll("tr[data-rule]");
  let i = 0;
  status.domains.forEach(function (domain) {
    domain.rules.forEach(function (rule) {
      const row = rows[i++];
      kit.fields(row, rule.last_minute, ["hits", "over_limit", "near_limit"]);
      kit.chart(row, [[rule.last_hour.hits, "hits"], [rule.last_hour.over_limit, "over"]]);
    });
  });
  const near = document.getElementById("near-rows");
  near.replaceChildren();
  status.near_limit.forEach(function (key) {
    const tr = document.createElement("tr");
    kit.cell(tr, key.domain);
    kit.cell(tr, key.rule);
    kit.cell(tr, key.key, "key");
    kit.cell(tr, key.remaining + " of " + key.limit, "n");
    kit.cell(tr, key.refused ? "refused" : "near");
    kit.cell(tr, key.seen_secs_ago + " s ago", "n");
    near.appendChild(tr);
  });
  const reloads = document.getElementById("reload-rows");
  reloads.replaceChildren();
  status.reloads.forEach(function (reload) {
    const tr = document.createElement("tr");
    tr.className = reload.result;
    kit.cell(tr, new Date(reload.at_unix_secs * 1000).toUTCString());
    kit.cell(tr, reload.result);
    if (reload.error === null) {
      kit.cell(tr, reload.domains + " domains, " + reload.rules + " rules");
    } else {
      kit.errorCell(tr, reload.error);
    }
    reloads.appendChild(tr);
  });
});
