//! `/status` as HTML, drawn by the server from the same [`Status`] as
//! `/status.json`: the page reads the same with or without its script,
//! which only updates what the server drew (`status.js`).

use std::fmt::Write;

use super::kit::{self, chart, escape};
use super::model::{LimitStatus, NearStatus, ReloadStatus, Status, TierStatus};

/// `/status.js`: the kit's script and this page's `render`.
pub(super) fn script() -> String {
    kit::script(include_str!("status.js"))
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
        " <span class=\"note\">(taken out by a reload)</span>"
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
    let mut out =
        kit::head("Rate limits", status.refresh_secs, status.uptime_secs);
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
