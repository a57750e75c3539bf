//! The debug listener's status page, `/status` and `/status.json`: what it
//! counts (hits, refusals, near-limit answers per rule; the keys nearest
//! their limit, as tags unless asked in clear; the config loads, a broken
//! one with its line), the token it asks for, the headers that keep it to
//! its own bytes, and what a person sees in a real browser (headless
//! Chromium) as traffic moves the counts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::Value;
use support::{Backend, Svc, TempDir, config, desc, http_with};

const RULES: &str = concat!(
    "  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    "  - key: health\n    rate_limit: {unlimited: true}\n",
    "  - key: search\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
);

const TOKEN: &str = "s3cret-status-token";

/// A service with its debug listener, guarded by [`TOKEN`] when `token`.
async fn start(token: bool, keys_in_clear: bool) -> (Svc, TempDir) {
    let secrets = TempDir::new();
    let file = secrets.write("token", &format!("{TOKEN}\n"));
    let svc = Svc::start(&Backend::Memory, RULES, |options| {
        options.debug_addr = Some("127.0.0.1:0".parse().unwrap());
        options.status_token_file = token.then_some(file);
        options.decide.status_keys_in_clear = keys_in_clear;
    })
    .await;
    (svc, secrets)
}

fn debug(svc: &Svc) -> SocketAddr {
    svc.running.debug_addr().expect("the debug listener")
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

async fn get(
    svc: &Svc,
    path: &str,
    auth: Option<&str>,
) -> support::HttpResponse {
    let headers: Vec<(&str, &str)> =
        auth.map(|a| vec![("Authorization", a)]).unwrap_or_default();
    http_with(debug(svc), "GET", path, &headers, b"").await
}

async fn status(svc: &Svc) -> Value {
    let response = get(svc, "/status.json", Some(&bearer())).await;
    assert_eq!(response.status, 200, "{}", response.body);
    serde_json::from_str(&response.body).expect("JSON")
}

/// `n` requests of `user`: how many were allowed.
async fn traffic(svc: &Svc, user: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        let response = svc.ask(vec![desc(&[("user", user)])]).await;
        ok += usize::from(response.overall_code == support::OK);
    }
    ok
}

fn rule<'a>(status: &'a Value, path: &str) -> &'a Value {
    status["domains"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["path"] == path)
        .unwrap_or_else(|| panic!("rule {path} in {status}"))
}

/// Makes the config invalid at a known line and reloads it: the line (of
/// the descriptor whose unit is unknown).
async fn break_the_config(svc: &Svc) -> usize {
    let broken = format!(
        "{}  - key: oops\n    rate_limit: {{unit: fortnight, requests_per_unit: 1}}\n",
        config(&svc.domain, RULES)
    );
    let line = broken.lines().position(|l| l.contains("oops")).unwrap() + 1;
    svc.dir.write("config.yaml", &broken);
    assert!(!svc.running.reload().await, "an invalid config stays out");
    line
}

#[tokio::test]
async fn the_json_counts_each_rule_the_nearest_keys_and_the_config_loads() {
    let (svc, _secrets) = start(true, false).await;
    assert_eq!(traffic(&svc, "ana", 7).await, 5);
    let status = status(&svc).await;

    let user = rule(&status, "user");
    assert_eq!(user["kind"], "rate");
    assert_eq!(user["requests_per_unit"], 5);
    assert_eq!(user["unit"], "MINUTE");
    assert_eq!(user["last_minute"]["hits"], 7);
    assert_eq!(user["last_minute"]["over_limit"], 2);
    // The 5th of 5 used the part above 80% of the limit.
    assert_eq!(user["last_minute"]["near_limit"], 1);
    let hour = user["last_hour"]["hits"].as_array().unwrap();
    assert_eq!(hour.len(), 60);
    assert_eq!(hour[59], 7);
    assert_eq!(user["last_hour"]["over_limit"][59], 2);
    assert_eq!(rule(&status, "health")["unlimited"], true);
    assert_eq!(rule(&status, "search")["shadow"], true);

    // Ana is the nearest key, refused, and only as a tag.
    let near = &status["near_limit"][0];
    assert_eq!(near["rule"], "user");
    assert_eq!(near["remaining"], 0);
    assert_eq!(near["refused"], true);
    let key = near["key"].as_str().unwrap();
    assert!(key.starts_with("tag:"), "{key}");
    assert!(!status.to_string().contains("ana"), "{status}");
    assert_eq!(status["keys_in_clear"], false);

    assert_eq!(status["store"]["kind"], "memory");
    assert_eq!(status["store"]["decisions_last_minute"], 7);
    assert!(
        status["store"]["mean_latency_ms_last_minute"]
            .as_f64()
            .is_some()
    );

    let reloads = status["reloads"].as_array().unwrap();
    assert_eq!(reloads.len(), 1);
    assert_eq!(reloads[0]["result"], "success");
    assert_eq!(reloads[0]["rules"], 3);

    let line = break_the_config(&svc).await;
    let status = self::status(&svc).await;
    let newest = &status["reloads"][0];
    assert_eq!(newest["result"], "error");
    let error = newest["error"].as_str().unwrap();
    assert!(error.contains(&format!("config.yaml:{line}:")), "{error}");
    // The rules in use stay, and so do their counts.
    assert_eq!(rule(&status, "user")["last_minute"]["hits"], 7);
}

#[tokio::test]
async fn keys_are_shown_as_sent_only_when_asked() {
    let (svc, _secrets) = start(false, true).await;
    traffic(&svc, "ana", 6).await;
    let response = get(&svc, "/status.json", None).await;
    let status: Value = serde_json::from_str(&response.body).unwrap();
    assert_eq!(status["keys_in_clear"], true);
    let key = status["near_limit"][0]["key"].as_str().unwrap();
    assert!(key.contains("ana"), "{key}");
}

#[tokio::test]
async fn with_a_token_file_every_status_route_asks_for_it() {
    use base64::Engine;
    let (svc, _secrets) = start(true, false).await;
    let basic = |credentials: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(credentials)
        )
    };
    for path in ["/status", "/status.json", "/status.js", "/status.css"] {
        for refused in [
            None,
            Some("Bearer wrong".to_owned()),
            Some(basic(&format!("{TOKEN}:"))),
            Some(basic("operator:wrong")),
            Some(format!("Token {TOKEN}")),
        ] {
            let response = get(&svc, path, refused.as_deref()).await;
            assert_eq!(response.status, 401, "{path} {refused:?}");
            assert!(!response.body.contains("user"), "{}", response.body);
            let headers = response.headers.to_ascii_lowercase();
            assert!(headers.contains("www-authenticate: basic"), "{headers}");
        }
        for admitted in [bearer(), basic(&format!("operator:{TOKEN}"))] {
            let response = get(&svc, path, Some(&admitted)).await;
            assert_eq!(response.status, 200, "{path} {admitted}");
        }
    }
    // The rest of the debug listener is as envoyproxy/ratelimit's: open.
    assert_eq!(get(&svc, "/rlconfig", None).await.status, 200);
}

#[tokio::test]
async fn the_page_loads_nothing_from_elsewhere_and_escapes_what_it_shows() {
    let (svc, _secrets) = start(false, false).await;
    let response = get(&svc, "/status", None).await;
    assert_eq!(response.status, 200);
    let headers = response.headers.to_ascii_lowercase();
    assert!(
        headers.contains(
            "content-security-policy: default-src 'none'; script-src 'self';"
        ),
        "{headers}"
    );
    assert!(headers.contains("x-frame-options: deny"), "{headers}");
    assert!(headers.contains("cache-control: no-store"), "{headers}");
    let page = &response.body;
    // Every reference is relative to the binary: no scheme, no host.
    for reference in page.split(['"', '\'']).filter(|s| s.contains("://")) {
        assert!(reference.starts_with("http://www.w3.org/"), "{reference}");
    }
    assert!(page.contains("src=\"status.js\""), "{page}");
    assert!(page.contains("<td class=\"path\">user</td>"), "{page}");
    let script = get(&svc, "/status.js", None).await;
    assert!(
        script
            .headers
            .to_ascii_lowercase()
            .contains("text/javascript")
    );
    assert!(script.body.contains("status.json"));
    // A config value is text, never markup.
    let hostile = "  - key: \"<b>x</b>\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    svc.dir.write("config.yaml", &config(&svc.domain, hostile));
    assert!(svc.running.reload().await);
    let page = get(&svc, "/status", None).await.body;
    assert!(
        page.contains("&lt;b&gt;x&lt;/b&gt;") && !page.contains("<b>x"),
        "{page}"
    );
}

// --- in a real browser -----------------------------------------------------

use rate_tier_test_support::browser::{chromium, dom, screenshot, text_after};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_the_counts_move_a_refusal_shows_and_a_broken_reload_names_its_line()
 {
    let Some(chromium) = chromium() else { return };
    let (svc, _secrets) = start(true, false).await;
    let profile = TempDir::new();
    // The token as Basic credentials in the address: the browser then
    // sends them with the page's own refreshes of /status.json.
    let url = format!("http://operator:{TOKEN}@{}/status", debug(&svc));
    let blocking = |url: String, profile: PathBuf| {
        let chromium = chromium.clone();
        tokio::task::spawn_blocking(move || dom(&chromium, &profile, &url))
    };

    assert_eq!(traffic(&svc, "ana", 3).await, 3);
    let first = blocking(url.clone(), profile.path().to_owned())
        .await
        .unwrap();
    assert!(first.contains(">user<"), "{first}");
    assert!(
        first.contains(">search<") && first.contains(">health<"),
        "{first}"
    );
    // The script ran, fetched /status.json under the page's policy, and
    // redrew the page from it.
    let updated = text_after(&first, "id=\"updated\"");
    assert!(updated.starts_with("refreshed "), "{updated}");
    let row = &first[first.find("data-rule=").unwrap()..];
    assert_eq!(text_after(row, "data-field=\"hits\""), "3");
    assert_eq!(text_after(row, "data-field=\"over_limit\""), "0");

    assert_eq!(traffic(&svc, "ana", 4).await, 2);
    let second = blocking(url.clone(), profile.path().to_owned())
        .await
        .unwrap();
    let row = &second[second.find("data-rule=").unwrap()..];
    assert_eq!(text_after(row, "data-field=\"hits\""), "7");
    assert_eq!(text_after(row, "data-field=\"over_limit\""), "2");
    assert!(second.contains(">refused<"), "{second}");
    assert!(!second.contains(">ana<"), "{second}");

    let line = break_the_config(&svc).await;
    let third = blocking(url.clone(), profile.path().to_owned())
        .await
        .unwrap();
    assert!(third.contains(&format!("config.yaml:{line}:")), "{third}");

    // A picture of it, for people (and the README).
    let shot = std::env::var_os("TRT_STATUS_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page.png")
        });
    screenshot(&chromium, profile.path(), &url, &shot);
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{}",
        png.len()
    );
    eprintln!("status page screenshot: {}", shot.display());
}
