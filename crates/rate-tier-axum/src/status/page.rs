//! `/status` as HTML, drawn by the server from the same [`Status`] as
//! `/status.json`: the page reads the same with or without its script,
//! which only updates what the server drew (`status.js`).

use std::fmt::Write;

use super::model::{LimitStatus, NearStatus, ReloadStatus, Status, TierStatus};

/// `/status.js`: refreshes the page from `status.json`.
pub(super) const SCRIPT: &str = include_str!("status.js");
/// `/status.css`.
pub(super) const STYLE: &str = include_str!("status.css");

/// The chart's size, in SVG units; the script draws the same.
const CHART_WIDTH: u64 = 120;
const CHART_HEIGHT: u64 = 24;

/// Text for an HTML text node or a quoted attribute.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A polyline's points for `values` (oldest first) scaled to `max`.
fn points(values: &[u64], max: u64) -> String {
    let step = CHART_WIDTH / values.len().max(1) as u64;
    let mut out = String::new();
    for (i, value) in values.iter().enumerate() {
        let y = CHART_HEIGHT
            - 1
            - value.saturating_mul(CHART_HEIGHT - 2) / max.max(1);
        let _ = write!(out, "{},{y} ", i as u64 * step);
    }
    out.trim_end().to_owned()
}

/// The last hour of `series` (each drawn with its class's colour) on one
/// scale.
fn chart(series: &[(&[u64], &str)], title: &str) -> String {
    let max = series
        .iter()
        .flat_map(|(values, _)| values.iter())
        .copied()
        .max()
        .unwrap_or(0);
    let mut out = format!(
        "<svg class=\"chart\" viewBox=\"0 0 {CHART_WIDTH} {CHART_HEIGHT}\" \
         width=\"{CHART_WIDTH}\" height=\"{CHART_HEIGHT}\" role=\"img\" \
         xmlns=\"http://www.w3.org/2000/svg\">\
         <title>{title} per minute, last hour; most in a minute: {max}</title>"
    );
    for (values, class) in series {
        let _ = write!(
            out,
            "<polyline class=\"{class}\" points=\"{}\"/>",
            points(values, max)
        );
    }
    out.push_str("</svg>");
    out
}

/// A tier row's `data-tier`: its name, or empty for checks without one.
fn tier_id(tier: &TierStatus) -> String {
    escape(tier.name.unwrap_or(""))
}

fn tier_row(out: &mut String, tier: &TierStatus) {
    let name = match tier.name {
        Some(name) => escape(name),
        None => "<span class=\"note\">(no tier)</span>".to_owned(),
    };
    let mark = if tier.default {
        " <span class=\"note\">(default)</span>"
    } else if tier.name.is_some() && !tier.configured {
        " <span class=\"note\">(no longer in force)</span>"
    } else {
        ""
    };
    let minute = tier.last_minute;
    let _ = write!(
        out,
        "<tr data-tier=\"{}\"><td class=\"name\">{name}{mark}</td><td>{}</td>\
         <td>{}</td>\
         <td class=\"n\" data-field=\"allowed\">{}</td>\
         <td class=\"n\" data-field=\"refused\">{}</td>\
         <td class=\"n\" data-field=\"shadow_limited\">{}</td>\
         <td class=\"n\" data-field=\"waited\">{}</td>\
         <td class=\"n\" data-field=\"other\">{}</td><td>{}</td></tr>",
        tier_id(tier),
        tier.kind.unwrap_or(""),
        escape(&tier.rule),
        minute.allowed,
        minute.refused,
        minute.shadow_limited,
        minute.waited,
        minute.other,
        chart(
            &[
                (&tier.last_hour.allowed, "allowed"),
                (&tier.last_hour.refused, "refused"),
            ],
            "allowed (blue) and refused (red)",
        ),
    );
}

fn limit_row(out: &mut String, limit: &LimitStatus) {
    let _ = write!(
        out,
        "<tr data-limit=\"{name}\"><td class=\"name\">{name}</td>\
         <td class=\"n\" data-field=\"refused\">{}</td>\
         <td class=\"n\" data-field=\"shadow_limited\">{}</td><td>{}</td></tr>",
        limit.last_minute.refused,
        limit.last_minute.shadow_limited,
        chart(
            &[
                (&limit.last_hour.refused, "refused"),
                (&limit.last_hour.shadow_limited, "shadow"),
            ],
            "refused (red) and shadow-limited (amber)",
        ),
        name = escape(limit.name),
    );
}

/// What is left of a user's limit: `1 of 10`, or `0` when the size is
/// not known.
pub(super) fn left(near: &NearStatus) -> String {
    match near.of {
        Some(of) => format!("{} of {of}", near.remaining),
        None => near.remaining.to_string(),
    }
}

fn near_row(out: &mut String, near: &NearStatus) {
    let _ = write!(
        out,
        "<tr><td>{}</td><td>{}</td><td class=\"key\">{}</td>\
         <td class=\"n\">{}</td><td class=\"{answer}\">{answer}</td>\
         <td class=\"n\">{} s ago</td></tr>",
        escape(near.tier),
        escape(near.limit.unwrap_or("(ban)")),
        escape(&near.user),
        left(near),
        near.seen_secs_ago,
        answer = near.answer,
    );
}

fn reload_row(out: &mut String, reload: &ReloadStatus) {
    let detail = match &reload.error {
        Some(error) => {
            format!("<span class=\"error\">{}</span>", escape(error))
        }
        None => escape(&reloaded(reload)),
    };
    let _ = write!(
        out,
        "<tr class=\"{result}\"><td class=\"n\">{} s ago</td><td>{result}</td>\
         <td>{detail}</td></tr>",
        reload.secs_ago,
        result = reload.result,
    );
}

/// A reload put in force: `free, pro` and the tiers that started fresh.
fn reloaded(reload: &ReloadStatus) -> String {
    let mut text = reload.tiers.join(", ");
    if !reload.fresh.is_empty() {
        let _ = write!(text, "; started fresh: {}", reload.fresh.join(", "));
    }
    text
}

/// The whole page.
pub(super) fn html(status: &Status) -> String {
    let mut out = String::with_capacity(8192);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>Rate limits</title>\
         <link rel=\"stylesheet\" href=\"status.css\">\
         <script src=\"status.js\" defer></script></head>\
         <body data-refresh=\"{}\"><header><h1>Rate limits</h1>\
         <p>up <span id=\"uptime\">{}</span> s · \
         <span id=\"updated\">as served</span></p></header>",
        status.refresh_secs, status.uptime_secs,
    );
    out.push_str(
        "<section id=\"tiers\"><h2>Tiers, last minute</h2><table><thead><tr>\
         <th>tier</th><th>kind</th><th>limit</th><th>allowed</th>\
         <th>refused</th><th>shadow</th><th>waited</th><th>other</th>\
         <th>last hour</th></tr></thead><tbody>",
    );
    for tier in &status.tiers {
        tier_row(&mut out, tier);
    }
    out.push_str(
        "</tbody></table><p class=\"note\">Refused: limited, banned, or a \
         cost above a burst. Shadow: passed where a limit in shadow mode \
         would have refused. Other: answered by a policy or an error.</p>\
         </section><section id=\"limits\"><h2>Refusals per limit, last minute</h2>",
    );
    if status.limits.is_empty() {
        out.push_str("<p>No refusal in the last hour.</p>");
    } else {
        out.push_str(
            "<table><thead><tr><th>limit</th><th>refused</th><th>shadow</th>\
             <th>last hour</th></tr></thead><tbody>",
        );
        for limit in &status.limits {
            limit_row(&mut out, limit);
        }
        out.push_str("</tbody></table>");
    }
    let _ = write!(
        out,
        "</section><section id=\"near\"><h2>Nearest their limit, last minute</h2>\
         <p class=\"note\">{}</p><table><thead><tr><th>tier</th><th>limit</th>\
         <th>user</th><th>left</th><th>answer</th><th>seen</th></tr></thead>\
         <tbody id=\"near-rows\">",
        if status.keys_in_clear {
            "Users by their id (keys_in_clear)."
        } else {
            "Users as tags: a keyed hash, the same for one user until the \
             process restarts."
        }
    );
    for near in &status.near_limit {
        near_row(&mut out, near);
    }
    let store = &status.store;
    let last_error = match &store.last_error {
        Some(failure) => format!(
            "<span class=\"error\">{}: {}</span>, {} s ago",
            escape(failure.storage),
            escape(&failure.error),
            failure.secs_ago
        ),
        None => "none".to_owned(),
    };
    let _ = write!(
        out,
        "</tbody></table></section><section id=\"store\"><h2>Store</h2><dl>\
         <dt>kind</dt><dd id=\"store-kind\">{}</dd>\
         <dt>breaker</dt><dd id=\"store-breaker\">{}</dd>\
         <dt>errors, last minute</dt><dd id=\"store-errors\">{}</dd>\
         <dt>last error</dt><dd id=\"store-last-error\">{last_error}</dd>\
         </dl></section>",
        escape(store.kind),
        store.breaker.unwrap_or("none (no fallback)"),
        store.errors_last_minute,
    );
    let policies = &status.policies;
    let _ = write!(
        out,
        "<section id=\"policies\"><h2>Policies</h2><dl>\
         <dt>default tier</dt><dd>{}</dd>\
         <dt>no identity</dt><dd>{}</dd>\
         <dt>unknown tier</dt><dd>{}</dd>\
         <dt>store error</dt><dd>{}</dd>\
         <dt>identity lookup error</dt><dd>{}</dd></dl></section>",
        escape(policies.default_tier.unwrap_or("none")),
        escape(&policies.on_missing),
        escape(&policies.on_unknown_tier),
        escape(&policies.on_storage_error),
        escape(&policies.on_identity_error),
    );
    out.push_str(
        "<section id=\"reloads\"><h2>Tier reloads</h2><table><thead><tr>\
         <th>when</th><th>result</th><th>detail</th></tr></thead>\
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
    fn text_is_escaped() {
        assert_eq!(
            escape(r#"<script>"a" & 'b'</script>"#),
            "&lt;script&gt;&quot;a&quot; &amp; &#39;b&#39;&lt;/script&gt;"
        );
    }

    #[test]
    fn a_chart_spans_its_box_and_scales_to_the_busiest_minute() {
        let values: Vec<u64> = (0..60).collect();
        let drawn = points(&values, 59);
        assert_eq!(drawn.split(' ').next(), Some("0,23"));
        assert_eq!(drawn.split(' ').next_back(), Some("118,1"));
        // Nothing yet: a flat line at the bottom, no division by zero.
        assert!(points(&[0; 60], 0).split(' ').all(|p| p.ends_with(",23")));
    }
}
