//! `/status` as HTML, rendered by the server from the same [`Status`] as
//! `/status.json`, so the page reads the same with or without its script.

use std::fmt::Write;

use rate_tier_axum::status::kit::{self, escape};

use super::{NearStatus, Reload, RuleStatus, Status};

/// `/status.js`: the kit's script and this page's `render`.
pub(crate) fn script() -> String {
    kit::script(include_str!("status.js"))
}

/// The rule's last hour: hits (blue) and refusals (red).
fn chart(rule: &RuleStatus) -> String {
    let hour = &rule.last_hour;
    kit::chart(
        &[(&hour.hits, "hits"), (&hour.over_limit, "over")],
        "hits (blue) and refusals (red)",
    )
}

fn limit(rule: &RuleStatus) -> String {
    match rule.kind {
        "unlimited" => "unlimited".to_owned(),
        _ => {
            format!("{} / {}", rule.requests_per_unit, rule.unit.to_lowercase())
        }
    }
}

fn rule_row(out: &mut String, domain: &str, rule: &RuleStatus) {
    let id = escape(&format!("{domain}/{}", rule.path));
    let name = if rule.name.is_empty() {
        String::new()
    } else {
        format!(" <span class=\"name\">({})</span>", escape(&rule.name))
    };
    let minute = rule.last_minute;
    let _ = write!(
        out,
        "<tr data-rule=\"{id}\"><td class=\"path\">{}{name}</td><td>{}</td>\
         <td>{}</td><td>{}</td>\
         <td class=\"n\" data-field=\"hits\">{}</td>\
         <td class=\"n\" data-field=\"over_limit\">{}</td>\
         <td class=\"n\" data-field=\"near_limit\">{}</td><td>{}</td></tr>",
        escape(&rule.path),
        rule.kind,
        escape(&limit(rule)),
        if rule.shadow { "shadow" } else { "enforced" },
        minute.hits,
        minute.over_limit,
        minute.near_limit,
        chart(rule),
    );
}

fn near_row(out: &mut String, key: &NearStatus) {
    let _ = write!(
        out,
        "<tr><td>{}</td><td>{}</td><td class=\"key\">{}</td>\
         <td class=\"n\">{} of {}</td><td>{}</td><td class=\"n\">{} s ago</td></tr>",
        escape(&key.domain),
        escape(&key.rule),
        escape(&key.key),
        key.remaining,
        key.limit,
        if key.refused { "refused" } else { "near" },
        key.seen_secs_ago,
    );
}

fn reload_row(out: &mut String, reload: &Reload) {
    let what = match &reload.error {
        Some(error) => {
            format!("<span class=\"error\">{}</span>", escape(error))
        }
        None => format!("{} domains, {} rules", reload.domains, reload.rules),
    };
    let _ = write!(
        out,
        "<tr class=\"{}\"><td data-unix=\"{}\">{}</td><td>{}</td><td>{what}</td></tr>",
        reload.result,
        reload.at_unix_secs,
        utc(reload.at_unix_secs),
        reload.result,
    );
}

/// `secs` since the epoch as an HTTP date (`Sun, 06 Dec 2026 12:00:00
/// GMT`), as the script writes it (`Date.toUTCString`).
fn utc(secs: u64) -> String {
    httpdate::fmt_http_date(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs),
    )
}

/// The whole page.
pub(crate) fn html(status: &Status) -> String {
    let mut out =
        kit::head("rate-tier-service", status.refresh_secs, status.uptime_secs);
    let store = &status.store;
    let latency = store
        .mean_latency_ms_last_minute
        .map_or_else(|| "none".to_owned(), |ms| format!("{ms:.3} ms"));
    let _ = write!(
        out,
        "<section id=\"store\"><h2>Store</h2><dl>\
         <dt>kind</dt><dd id=\"store-kind\">{}</dd>\
         <dt>breaker</dt><dd id=\"store-breaker\">{}</dd>\
         <dt>decisions, last minute</dt><dd id=\"store-decisions\">{}</dd>\
         <dt>mean latency, last minute</dt><dd id=\"store-latency\">{latency}</dd>\
         </dl></section>",
        store.kind,
        store.breaker.unwrap_or("none (no fallback)"),
        store.decisions_last_minute,
    );
    out.push_str("<section id=\"rules\"><h2>Rules, last minute</h2>");
    if status.domains.is_empty() {
        out.push_str("<p>No rule is loaded.</p>");
    }
    for domain in &status.domains {
        let _ = write!(
            out,
            "<h3>{}</h3><table><thead><tr><th>rule</th><th>kind</th>\
             <th>limit</th><th>mode</th><th>hits</th><th>refused</th>\
             <th>near limit</th><th>last hour</th></tr></thead><tbody>",
            escape(&domain.name)
        );
        for rule in &domain.rules {
            rule_row(&mut out, &domain.name, rule);
        }
        out.push_str("</tbody></table>");
    }
    out.push_str("</section>");
    let _ = write!(
        out,
        "<section id=\"near\"><h2>Nearest their limit, last minute</h2>\
         <p class=\"note\">{}</p><table><thead><tr><th>domain</th><th>rule</th>\
         <th>key</th><th>left</th><th>answer</th><th>seen</th></tr></thead>\
         <tbody id=\"near-rows\">",
        if status.keys_in_clear {
            "Keys as sent (--status-keys-in-clear)."
        } else {
            "Keys as tags: a keyed hash, the same for one key until the service restarts."
        }
    );
    for key in &status.near_limit {
        near_row(&mut out, key);
    }
    out.push_str(
        "</tbody></table></section><section id=\"reloads\"><h2>Config loads</h2>\
         <table><thead><tr><th>when</th><th>result</th><th>detail</th></tr></thead>\
         <tbody id=\"reload-rows\">",
    );
    for reload in &status.reloads {
        reload_row(&mut out, reload);
    }
    out.push_str("</tbody></table></section></body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc() {
        assert_eq!(utc(0), "Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(utc(1_796_558_400), "Sun, 06 Dec 2026 12:00:00 GMT");
    }
}
