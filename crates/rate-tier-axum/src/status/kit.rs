//! What the crate family's status pages are made of (this crate's and
//! rate-tier-service's): escaping, the last hour's chart, the headers that
//! keep a page to its own bytes, the style sheet, and the script that
//! refreshes a page from its JSON twin (`statusKit.start(render)`). Shared
//! so that both pages look and behave alike; not part of this crate's API.

use std::fmt::Write;

use axum::extract::Request;
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The style sheet, `status.css`.
pub const STYLE: &str = include_str!("kit.css");

/// The script every page's own starts with: defines `statusKit`.
const SCRIPT: &str = include_str!("kit.js");

/// A page's `status.js`: the kit's script, then the page's `render`
/// (which calls `statusKit.start`).
pub fn script(page: &str) -> String {
    [SCRIPT, page].concat()
}

/// What a page may load: its own script, style sheet and JSON, nothing
/// from elsewhere, and no framing by another page.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self'; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

/// The chart's size, in SVG units; the script draws the same.
const CHART_WIDTH: u64 = 120;
const CHART_HEIGHT: u64 = 24;

/// Text for an HTML text node or a quoted attribute.
pub fn escape(text: &str) -> String {
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

/// A page's start, up to its header: `title` (`<title>` and `<h1>`), its
/// style sheet and script, the refresh period the script reads, and the
/// uptime and "as served" marker the script updates (`#uptime`,
/// `#updated`).
pub fn head(title: &str, refresh_secs: u64, uptime_secs: u64) -> String {
    let title = escape(title);
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title}</title>\
         <link rel=\"stylesheet\" href=\"status.css\">\
         <script src=\"status.js\" defer></script></head>\
         <body data-refresh=\"{refresh_secs}\"><header><h1>{title}</h1>\
         <p>up <span id=\"uptime\">{uptime_secs}</span> s · \
         <span id=\"updated\">as served</span></p></header>"
    )
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
/// scale, as inline SVG; `title` says what is counted.
pub fn chart(series: &[(&[u64], &str)], title: &str) -> String {
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
         <title>{} per minute, last hour; most in a minute: {max}</title>",
        escape(title)
    );
    for (values, class) in series {
        let _ = write!(
            out,
            "<polyline class=\"{}\" points=\"{}\"/>",
            escape(class),
            points(values, max)
        );
    }
    out.push_str("</svg>");
    out
}

/// `body` as `content_type`.
pub fn typed(content_type: &'static str, body: impl IntoResponse) -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        body,
    )
        .into_response()
}

/// Middleware (`axum::middleware::from_fn`): every answer says
/// `content-security-policy` (the page's own script, style sheet and JSON
/// only), `cache-control: no-store`, `x-content-type-options: nosniff`,
/// `referrer-policy: no-referrer` and `x-frame-options: DENY`.
pub async fn page_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, POLICY),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
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
        let svg = chart(&[(&values, "hits"), (&[0; 60], "over")], "<hits>");
        assert!(svg.contains("<title>&lt;hits&gt; per minute"), "{svg}");
        assert!(svg.contains("most in a minute: 59"), "{svg}");
    }

    #[test]
    fn a_page_script_starts_with_the_kit() {
        let script = script("statusKit.start(render);");
        assert!(script.starts_with("// What every status page's script"));
        assert!(script.ends_with("statusKit.start(render);"));
    }
}
