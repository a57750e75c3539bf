//! The status page of the library (`rate_tier_axum::status`): what it
//! counts from a real limiter (checks per tier, refusals per limit, the
//! users nearest their limit as tags, the reloads), on a fake clock; the
//! headers and escaping that keep it to its own bytes; its bounded memory;
//! and what a person sees in a real browser (headless Chromium) as traffic
//! moves the counts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::{Router, routing::get};
use http_body_util::BodyExt;
use rate_tier_axum::api_key;
use rate_tier_axum::status::{StatusBoard, status_router};
use serde_json::Value;
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::storage::{
    Answer, BucketCheck, Capabilities, Decided, Decision, Mode, Storage,
};
use tower_rate_tier::{
    Ban, ConfigError, FallbackStorage, Limit, LimitEvent, LimitRequest,
    MemoryStorage, Observer, OnMissing, Quota, RateTier, TierLimitLayer, Tiers,
    UserId, Window,
};

/// A Unix time on a 10 s boundary: the board's slots start with it.
const START_US: u64 = 1_790_000_000_000_000;

fn plan_of(key: &str) -> Option<&'static str> {
    match key {
        "key_ana" | "key_carl" => Some("free"),
        "key_bea" => Some("pro"),
        _ => None,
    }
}

/// free (5 a minute, the default) and pro (100 a minute), near their limit
/// at 80%, banned after 3 refusals in a minute; the board observes it.
fn limiter(clock: &FakeClock, board: &Arc<StatusBoard>) -> RateTier {
    RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(5))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
        .near_limit(0.8)
        .ban(
            Ban::after(3, Duration::from_secs(60))
                .lasting(Duration::from_secs(600)),
        )
        .observe(board.clone())
        .build()
}

/// The app: `/data` behind the limiter, the status page under `/ops`.
fn app(limiter: &RateTier, board: &Arc<StatusBoard>) -> Router {
    let data = Router::new()
        .route("/data", get(async || "data\n"))
        .route_layer(
            TierLimitLayer::new(limiter.clone())
                .identifier_fn(api_key("x-api-key", plan_of)),
        );
    data.nest("/ops", status_router(limiter.clone(), board.clone()))
}

async fn get_from(app: &Router, path: &str) -> (StatusCode, HeaderMap, String) {
    let request = Request::get(path).body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8(bytes.to_vec()).unwrap(),
    )
}

async fn data_as(app: &Router, key: Option<&str>) -> StatusCode {
    let mut request = Request::get("/data");
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    let request = request.body(Body::empty()).unwrap();
    app.clone().oneshot(request).await.unwrap().status()
}

async fn status(app: &Router) -> Value {
    let (code, headers, body) = get_from(app, "/ops/status.json").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(headers["content-type"], "application/json");
    serde_json::from_str(&body).expect("JSON")
}

fn tier<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("tier {name} in {status}"))
}

fn limit<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == name)
        .unwrap_or_else(|| panic!("limit {name} in {status}"))
}

fn minute(tier: &Value) -> [u64; 5] {
    let m = &tier["last_minute"];
    ["allowed", "refused", "shadow_limited", "waited", "other"]
        .map(|field| m[field].as_u64().unwrap())
}

#[tokio::test]
async fn the_json_counts_each_tier_and_limit_the_nearest_users_and_the_reloads()
{
    let clock = FakeClock::at_us(START_US);
    let board = Arc::new(StatusBoard::with_clock(clock.clone()));
    let limiter = limiter(&clock, &board);
    let app = app(&limiter, &board);

    // Ana, directly: 5 of 5 pass (the 4th leaves 1 of 5: near), 2 refused.
    for _ in 0..5 {
        limiter.check("key_ana", "free", 1).await.unwrap().unwrap();
    }
    for _ in 0..2 {
        limiter
            .check("key_ana", "free", 1)
            .await
            .unwrap()
            .unwrap_err();
    }
    // Bea, on pro with a search limit of 2 a minute: the 3rd is refused by
    // the search limit.
    let search = Limit::new("search", Quota::per_minute(2));
    let bea = LimitRequest::new("key_bea", "pro", 1).limit(&search, 1);
    for _ in 0..2 {
        limiter.decide(&bea).await.unwrap().unwrap();
    }
    let refused = limiter.decide(&bea).await.unwrap().unwrap_err();
    assert_eq!(refused.limit_name(), "search");
    // Through the layer: Carl's 6th is refused; Ana's 3rd refusal bans
    // her, and her next is refused as banned; no key is no tier.
    for _ in 0..5 {
        assert_eq!(data_as(&app, Some("key_carl")).await, StatusCode::OK);
    }
    assert_eq!(
        data_as(&app, Some("key_carl")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..2 {
        assert_eq!(
            data_as(&app, Some("key_ana")).await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(data_as(&app, None).await, StatusCode::UNAUTHORIZED);

    let status = status(&app).await;
    let free = tier(&status, "free");
    // [allowed, refused, shadow, waited, other]
    assert_eq!(minute(free), [10, 5, 0, 0, 0], "{status}");
    assert_eq!(free["kind"], "rate");
    assert_eq!(free["limit"], 5);
    assert_eq!(free["rule"], "5 per minute");
    assert_eq!(free["default"], true);
    assert_eq!(minute(tier(&status, "pro")), [2, 1, 0, 0, 0]);
    let untiered = status["tiers"].as_array().unwrap().last().unwrap();
    assert_eq!(untiered["name"], Value::Null);
    assert_eq!(minute(untiered), [0, 0, 0, 0, 1]);
    let hour = free["last_hour"]["allowed"].as_array().unwrap();
    assert_eq!(hour.len(), 60);
    assert_eq!(hour[59], 10);

    // The refusals under the limit that refused: the tier's own (the ban
    // refuses by no limit), and the search limit.
    assert_eq!(limit(&status, "free")["last_minute"]["refused"], 4);
    assert_eq!(limit(&status, "search")["last_minute"]["refused"], 1);

    // The nearest: Ana banned first, then the refused; each a tag.
    let near = status["near_limit"].as_array().unwrap();
    assert_eq!(near[0]["answer"], "banned", "{status}");
    assert_eq!(near[0]["user"], UserId::from("key_ana").redacted());
    let carl = near
        .iter()
        .find(|n| n["user"] == UserId::from("key_carl").redacted())
        .unwrap();
    assert_eq!(
        (&carl["answer"], &carl["remaining"], &carl["of"]),
        (&Value::from("refused"), &Value::from(0), &Value::from(5))
    );
    let bea_searched = near
        .iter()
        .find(|n| n["limit"] == "search" && n["answer"] == "refused")
        .unwrap();
    assert_eq!(bea_searched["user"], UserId::from("key_bea").redacted());
    assert_eq!(bea_searched["of"], 2, "the refusing limit's size: {status}");
    for user in near {
        let tag = user["user"].as_str().unwrap();
        assert!(tag.starts_with('#') && tag.len() == 9, "{tag}");
    }
    let text = status.to_string();
    assert!(!text.contains("key_"), "an id in clear: {text}");
    assert_eq!(status["keys_in_clear"], false);

    assert_eq!(status["store"]["kind"], "memory");
    assert_eq!(status["store"]["breaker"], Value::Null);
    assert_eq!(status["policies"]["default_tier"], "free");
    assert_eq!(status["policies"]["on_missing"], "refused, 401");

    // A reload in force, then one refused, newest first.
    limiter.reload(
        Tiers::builder()
            .tier("free", Quota::per_minute(6))
            .tier("pro", Quota::per_minute(100))
            .default_tier("free")
            .build()
            .unwrap(),
    );
    let error = ConfigError::UnknownDefaultTier("gold".into());
    board.event(&LimitEvent::TiersRefused { error });
    let status = self::status(&app).await;
    let reloads = status["reloads"].as_array().unwrap();
    assert_eq!(reloads.len(), 2);
    assert_eq!(reloads[0]["result"], "refused");
    assert_eq!(
        reloads[0]["error"],
        "default tier \"gold\" is not a configured tier"
    );
    assert_eq!(reloads[1]["result"], "reloaded");
    assert_eq!(reloads[1]["tiers"], serde_json::json!(["free", "pro"]));
    assert_eq!(tier(&status, "free")["rule"], "6 per minute");

    // A minute later: the last minute is empty, the hour keeps it, and no
    // one is near their limit now.
    clock.advance(Duration::from_secs(61));
    let status = self::status(&app).await;
    let free = tier(&status, "free");
    assert_eq!(minute(free), [0; 5], "{status}");
    let hour = free["last_hour"]["allowed"].as_array().unwrap();
    assert_eq!((&hour[58], &hour[59]), (&Value::from(10), &Value::from(0)));
    assert_eq!(free["last_hour"]["refused"][58], 5);
    assert_eq!(limit(&status, "free")["last_minute"]["refused"], 0);
    assert_eq!(limit(&status, "free")["last_hour"]["refused"][58], 4);
    assert_eq!(status["near_limit"], serde_json::json!([]));
    assert_eq!(status["reloads"][0]["secs_ago"], 61);

    // After the hour, nothing is left of it.
    clock.advance(Duration::from_secs(3600));
    let status = self::status(&app).await;
    let free = tier(&status, "free");
    let hour = free["last_hour"]["allowed"].as_array().unwrap();
    assert!(hour.iter().all(|n| n == 0), "{status}");
    assert_eq!(status["limits"], serde_json::json!([]));
    let names: Vec<&Value> = status["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["name"])
        .collect();
    assert_eq!(names, ["free", "pro"], "the untiered row is gone");
}

/// A store that decides rates alone: tiers of another kind are refused.
#[derive(Debug)]
struct RatesOnly(MemoryStorage);

impl Storage for RatesOnly {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        self.0.decide(checks, mode, out)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("rates-only")
    }
}

#[tokio::test]
async fn a_refused_reload_shows_its_error_and_the_tiers_in_force_stay() {
    let board = Arc::new(StatusBoard::with_clock(FakeClock::at_us(START_US)));
    let limiter = RateTier::builder()
        .storage(Arc::new(RatesOnly(MemoryStorage::new())))
        .tier("free", Quota::per_minute(10))
        .observe(board.clone())
        .build();
    let login = Window::new(5, Duration::from_secs(60)).unwrap();
    limiter.reload(Tiers::builder().tier("free", login).build().unwrap());
    let app = Router::new().nest("/ops", status_router(limiter, board));
    let status = status(&app).await;
    let reload = &status["reloads"][0];
    assert_eq!(reload["result"], "refused");
    assert_eq!(
        reload["error"],
        "limit \"free\" is a window, which the rates-only store does not decide"
    );
    assert_eq!(tier(&status, "free")["rule"], "10 per minute");
    assert_eq!(status["store"]["kind"], "rates-only");
}

#[tokio::test]
async fn a_fallback_store_shows_its_breaker() {
    let board = Arc::new(StatusBoard::new());
    let fallback =
        FallbackStorage::builder(Arc::new(MemoryStorage::new())).build();
    let limiter = RateTier::builder()
        .storage(Arc::new(fallback))
        .tier("free", Quota::per_minute(10))
        .observe(board.clone())
        .build();
    let app = Router::new().nest("/ops", status_router(limiter, board));
    let status = status(&app).await;
    assert_eq!(status["store"]["breaker"], "closed", "{status}");
    let (_, _, page) = get_from(&app, "/ops/status").await;
    assert!(
        page.contains("<dd id=\"store-breaker\">closed</dd>"),
        "{page}"
    );
}

#[tokio::test]
async fn the_page_loads_nothing_from_elsewhere_and_escapes_what_it_shows() {
    let clock = FakeClock::at_us(START_US);
    let board =
        Arc::new(StatusBoard::with_clock(clock.clone()).keys_in_clear(true));
    let limiter = limiter(&clock, &board);
    let app = app(&limiter, &board);
    let hostile = "<b>ana</b>";
    for _ in 0..6 {
        let _ = limiter.check(hostile, "free", 1).await.unwrap();
    }
    let error =
        ConfigError::UnknownDefaultTier("<script>alert(1)</script>".into());
    board.event(&LimitEvent::TiersRefused { error });
    board.event(&LimitEvent::StorageError {
        storage: "redis",
        error: "<i>connection refused</i>".into(),
        policy: Default::default(),
    });

    let (code, headers, page) = get_from(&app, "/ops/status").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let policy = headers["content-security-policy"].to_str().unwrap();
    assert!(
        policy.starts_with("default-src 'none'; script-src 'self';"),
        "{policy}"
    );
    assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
    assert_eq!(headers["x-frame-options"], "DENY");
    assert_eq!(headers["cache-control"], "no-store");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["referrer-policy"], "no-referrer");

    // Every reference is relative to the page: no scheme, no host, but the
    // SVG namespace.
    for reference in page.split(['"', '\'']).filter(|s| s.contains("://")) {
        assert_eq!(reference, "http://www.w3.org/2000/svg", "{page}");
    }
    assert!(page.contains("src=\"status.js\""), "{page}");
    assert!(page.contains("href=\"status.css\""), "{page}");
    assert!(!page.contains("src=\"/") && !page.contains("href=\"/"));

    // What the page shows is text, never markup.
    assert!(page.contains("&lt;b&gt;ana&lt;/b&gt;"), "{page}");
    assert!(
        page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{page}"
    );
    assert!(
        page.contains("&lt;i&gt;connection refused&lt;/i&gt;"),
        "{page}"
    );
    assert!(!page.contains("<b>") && !page.contains("<i>"), "{page}");
    assert!(!page.contains("<script>alert"), "{page}");
    assert!(page.contains("Users by their id"), "{page}");

    for (path, content_type) in [
        ("/ops/status.js", "text/javascript; charset=utf-8"),
        ("/ops/status.css", "text/css; charset=utf-8"),
    ] {
        let (code, headers, body) = get_from(&app, path).await;
        assert_eq!(code, StatusCode::OK, "{path}");
        assert_eq!(headers["content-type"], content_type);
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert!(!body.contains("://"), "nothing from elsewhere: {body}");
    }
    let (_, _, script) = get_from(&app, "/ops/status.js").await;
    assert!(
        script.contains("new URL(\"status.json\""),
        "relative: {script}"
    );
}

#[tokio::test]
async fn a_hundred_thousand_users_near_their_limit_keep_the_list_bounded() {
    let clock = FakeClock::at_us(START_US);
    let board = Arc::new(StatusBoard::with_clock(clock.clone()));
    let limiter = limiter(&clock, &board);
    for i in 0..100_000u64 {
        let user_id = UserId::from(format!("user-{i}").as_str());
        board.event(&LimitEvent::NearLimit {
            user_id,
            tier: "free",
            limit: "free",
            // 1 to 4 left of 5; a few refused.
            remaining: 1 + i % 4,
            of: 5,
        });
        if i % 25_000 == 7 {
            board.event(&LimitEvent::Limited {
                user_id: UserId::from(format!("refused-{i}").as_str()),
                tier: "free",
                limit: "free",
                of: 5,
                cost: 1,
                retry_after: Duration::from_secs(12),
            });
        }
    }
    let app = Router::new().nest("/ops", status_router(limiter, board));
    let status = status(&app).await;
    let near = status["near_limit"].as_array().unwrap();
    assert_eq!(near.len(), 10, "the page shows the 10 nearest");
    let refused: Vec<_> = near
        .iter()
        .take_while(|n| n["answer"] == "refused")
        .collect();
    assert_eq!(refused.len(), 4, "{status}");
    assert!(
        refused.iter().all(|n| n["remaining"] == 0 && n["of"] == 5),
        "a refusal is 0 of the limit's size: {status}"
    );
    assert!(near[4..].iter().all(|n| n["remaining"] == 1), "{status}");
}

// --- in a real browser -----------------------------------------------------

// The workspace's browser helpers alone, without the rest of test-support.
#[path = "../../test-support/src/browser.rs"]
#[allow(dead_code, unreachable_pub)]
mod browser;
use browser::{chromium, dom, text_after};

/// The free tier's row: its allowed and refused counts.
fn free_counts(dom: &str) -> (&str, &str) {
    let row = &dom[dom.find("data-tier=\"free\"").unwrap()..];
    (
        text_after(row, "data-field=\"allowed\""),
        text_after(row, "data-field=\"refused\""),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_the_counts_move_and_a_refusal_shows() {
    let Some(chromium) = chromium() else { return };
    let clock = FakeClock::at_us(START_US);
    let board = Arc::new(StatusBoard::with_clock(clock.clone()));
    let limiter = limiter(&clock, &board);
    let app = app(&limiter, &board);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/ops/status", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    let profile = std::env::temp_dir().join(format!(
        "rate-tier-axum-status-chromium-{}",
        std::process::id()
    ));
    let load = |url: String| {
        let (chromium, profile) = (chromium.clone(), profile.clone());
        tokio::task::spawn_blocking(move || dom(&chromium, &profile, &url))
    };

    for _ in 0..3 {
        limiter.check("key_ana", "free", 1).await.unwrap().unwrap();
    }
    let first = load(url.clone()).await.unwrap();
    assert!(
        first.contains(">free<") && first.contains(">pro<"),
        "{first}"
    );
    // The script ran, fetched status.json under the page's policy, and
    // redrew the page from it.
    let updated = text_after(&first, "id=\"updated\"");
    assert!(updated.starts_with("refreshed "), "{updated}");
    assert_eq!(free_counts(&first), ("3", "0"));

    for _ in 0..4 {
        let _ = limiter.check("key_ana", "free", 1).await.unwrap();
    }
    let second = load(url.clone()).await.unwrap();
    let updated = text_after(&second, "id=\"updated\"");
    assert!(updated.starts_with("refreshed "), "{updated}");
    assert_eq!(free_counts(&second), ("5", "2"));
    assert!(second.contains("data-limit=\"free\""), "{second}");
    assert!(second.contains(">refused<"), "{second}");
    assert!(!second.contains("key_ana"), "{second}");
    assert!(
        second.contains(&UserId::from("key_ana").redacted()),
        "{second}"
    );

    server.abort();
    let _ = std::fs::remove_dir_all(&profile);
}
