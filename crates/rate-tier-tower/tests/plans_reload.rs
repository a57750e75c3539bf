//! Hot reload of tiers, and tiers from TOML.
#![cfg(feature = "tiers-toml")]
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::{Router, routing::get};
use http::Request;
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    LimitEvent, Quota, RateTier, TierIdentity, TierLimitLayer, Tiers,
};

fn limiter(clock: &FakeClock) -> RateTier {
    RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .default_tier("free")
        .build()
}

fn plans(toml: &str) -> Tiers {
    Tiers::builder().from_toml(toml).unwrap().build().unwrap()
}

#[tokio::test]
async fn a_reload_keeps_every_bucket() {
    let clock = FakeClock::new();
    let tiers = limiter(&clock);
    for _ in 0..5 {
        tiers.check("ana", "free", 1).await.unwrap().unwrap();
    }
    tiers.reload(plans(
        "default_tier = \"free\"\n[tiers.free]\nlimit = 20\nper = \"minute\"\n",
    ));
    // Half of the bucket was spent; half of the new one is: 10 left, then 9.
    let info = tiers.check("ana", "free", 1).await.unwrap().unwrap();
    assert_eq!((info.limit, info.remaining), (20, 9));
    // Someone else starts with the new full bucket.
    let bea = tiers.check("bea", "free", 1).await.unwrap().unwrap();
    assert_eq!(bea.remaining, 19);
}

#[tokio::test]
async fn a_smaller_burst_leaves_a_debt_that_drains_at_the_rate() {
    let clock = FakeClock::new();
    let tiers = limiter(&clock);
    for _ in 0..10 {
        tiers.check("ana", "free", 1).await.unwrap().unwrap();
    }
    // Same rate, burst 2: the TAT (60 s ahead) is 48 s beyond the new burst
    // window of 12 s, a debt well within the ceiling, so Ana waits it and
    // one interval: 54 s, the time her ten requests took of the rate.
    tiers.reload(
        Tiers::builder()
            .tier("free", Quota::per_minute(10).allow_burst(2))
            .build()
            .unwrap(),
    );
    let limited = tiers.check("ana", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(limited.retry_after(), Duration::from_secs(54));
    clock.advance(Duration::from_secs(54));
    assert!(tiers.check("ana", "free", 1).await.unwrap().is_ok());
}

#[tokio::test]
async fn removed_tiers_follow_the_unknown_tier_policy_and_clones_see_reloads() {
    let clock = FakeClock::new();
    let tiers = limiter(&clock);
    let clone = tiers.clone();
    tiers.reload(
        Tiers::builder()
            .tier("basic", Quota::per_minute(3))
            .build()
            .unwrap(),
    );
    assert_eq!(clone.quota("free"), None);
    assert_eq!(clone.quota("basic"), Some(Quota::per_minute(3)));
    // No default tier any more: an unknown tier is refused, never unlimited.
    assert!(clone.check("ana", "free", 1).await.unwrap().is_err());
}

/// A reload comes from no request: the limiter's listeners hear it (once),
/// a layer's listeners, which hear their own requests, do not.
#[tokio::test]
async fn every_reload_is_an_event_for_the_limiters_listeners() {
    let clock = FakeClock::new();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let sink = heard.clone();
    let tiers = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .default_tier("free")
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .build();
    let layer_heard = Arc::new(Mutex::new(Vec::new()));
    let sink = layer_heard.clone();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers.clone())
            .identifier_fn(|_| Some(TierIdentity::new("ana", "free")))
            .on_event(move |e| sink.lock().unwrap().push(e.clone())),
    );
    tiers.reload(plans("[tiers.free]\nlimit = 20\nper = \"minute\"\n"));
    assert_eq!(
        *heard.lock().unwrap(),
        [LimitEvent::TiersReloaded {
            tiers: vec!["free".to_owned()],
            fresh: vec![],
        }]
    );
    assert!(layer_heard.lock().unwrap().is_empty());
    let response = app
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.headers()["x-ratelimit-limit"], "20");
}

#[tokio::test]
async fn reloads_while_checks_run_never_lose_or_double_a_charge() {
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(100))
        .build();
    let same = || {
        Tiers::builder()
            .tier("free", Quota::per_minute(100))
            .build()
            .unwrap()
    };
    let mut tasks = Vec::new();
    for i in 0..200 {
        let tiers = tiers.clone();
        tasks.push(tokio::spawn(async move {
            if i % 10 == 0 {
                tiers.reload(same());
            }
            tiers.check("ana", "free", 1).await.unwrap().is_ok()
        }));
    }
    let mut allowed = 0;
    for task in tasks {
        allowed += usize::from(task.await.unwrap());
    }
    assert_eq!(allowed, 100);
}

fn error_line(toml: &str) -> (usize, String) {
    let err = Tiers::builder().from_toml(toml).unwrap_err();
    (err.line(), err.message().to_owned())
}

#[test]
fn bad_files_name_the_line() {
    let (line, message) =
        error_line("[tiers.free]\nlimit = 10\nper = \"minute\"\nbrust = 2\n");
    assert_eq!(line, 4);
    assert!(message.contains("brust"), "{message}");

    assert_eq!(
        error_line("\n[tiers.free]\nlimit = 0\nper = \"minute\"\n").0,
        3
    );
    let (line, message) = error_line(
        "default_tier = \"gold\"\n[tiers.free]\nlimit = 1\nper = \"day\"\n",
    );
    assert_eq!(line, 1);
    assert!(message.contains("gold"), "{message}");
    assert_eq!(
        error_line("[tiers.free]\nlimit = 1\nper = \"fortnight\"\n").0,
        3
    );
    assert_eq!(
        error_line("[tiers.\"a:b\"]\nlimit = 1\nper = \"day\"\n").0,
        1
    );
    assert_eq!(
        error_line("[tiers.free]\nlimit = 5\nper = \"day\"\nburst = 0\n").0,
        4
    );
    // TOML itself refuses a tier defined twice, with its line.
    assert_eq!(
        error_line(
            "[tiers.free]\nlimit = 1\nper = \"day\"\n[tiers.free]\nlimit = 2\nper = \"day\"\n"
        )
        .0,
        4
    );
    assert_eq!(error_line("[tiers.free]\nlimit = -1\nper = \"day\"\n").0, 2);
    assert_eq!(error_line("mystery = 1\n").0, 1);
}

#[test]
fn the_issue_format_loads() {
    let plans = plans(
        r#"
default_tier = "free"        # optional
[tiers.free]
limit = 10
per = "minute"               # second | minute | hour | day
# burst = 10                 # optional, defaults to limit
[tiers.pro]
limit = 100
per = "minute"
"#,
    );
    assert_eq!(plans.default_tier(), Some("free"));
    assert_eq!(plans.quota("free"), Some(Quota::per_minute(10)));
    assert_eq!(plans.quota("pro"), Some(Quota::per_minute(100)));
}

#[tokio::test]
async fn a_reload_keeps_the_policies_it_does_not_set() {
    use http::StatusCode;
    use tower_rate_tier::{
        OnMissing, policy::OnIdentityError, policy::OnStorageError,
    };

    let tiers = RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(10))
        .default_tier("free")
        .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
        .on_storage_error(OnStorageError::Allow)
        .on_identity_error(OnIdentityError::Allow)
        .build();
    // A file says nothing of policies: the running ones stay.
    tiers.reload(plans(
        "default_tier = \"free\"\n[tiers.free]\nlimit = 20\nper = \"minute\"\n",
    ));
    let running = tiers.tiers();
    assert_eq!(running.quota("free"), Some(Quota::per_minute(20)));
    assert_eq!(running.on_storage_error(), OnStorageError::Allow);
    assert_eq!(running.on_identity_error(), OnIdentityError::Allow);
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers.clone()).identifier_fn(|_| None));
    let response = app
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), 401, "still refused without a key");

    // Tiers that set a policy replace it.
    tiers.reload(
        Tiers::builder()
            .tier("free", Quota::per_minute(20))
            .on_storage_error(OnStorageError::Deny(
                StatusCode::SERVICE_UNAVAILABLE,
            ))
            .build()
            .unwrap(),
    );
    assert_eq!(
        tiers.tiers().on_storage_error(),
        OnStorageError::Deny(StatusCode::SERVICE_UNAVAILABLE)
    );
}

#[tokio::test]
async fn a_reload_may_add_a_tier_named_like_a_limit() {
    // Regression: a reload that adds tier `search` must not make its users'
    // tier bucket the `search` limit's bucket (every /search of theirs would
    // be a 503: the same bucket twice in one decision). Tiers and limits
    // live in separate namespaces.
    let clock = FakeClock::new();
    let tiers = limiter(&clock);
    let layer = TierLimitLayer::new(tiers.clone())
        .identifier_fn(|headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(
                key,
                if key == "key_sam" { "search" } else { "free" },
            ))
        })
        .limit(
            tower_rate_tier::Limit::new("search", Quota::per_minute(3))
                .when(|req| req.uri.path() == "/search"),
        );
    let app = Router::new()
        .route("/search", get(|| async { "found\n" }))
        .layer(layer);
    let status = |key: &'static str| {
        let app = app.clone();
        async move {
            let request = Request::get("/search")
                .header("x-api-key", key)
                .body(Body::empty())
                .unwrap();
            app.oneshot(request).await.unwrap().status().as_u16()
        }
    };
    tiers.reload(
        Tiers::builder()
            .tier("free", Quota::per_minute(10))
            .tier("search", Quota::per_minute(100))
            .default_tier("free")
            .build()
            .unwrap(),
    );
    // Sam's tier is the tier `search` (100/min); the endpoint limit
    // `search` (3/min) is a bucket of its own: three pass, the fourth is
    // refused by the limit, never a 503.
    let answers = [
        status("key_sam").await,
        status("key_sam").await,
        status("key_sam").await,
        status("key_sam").await,
    ];
    assert_eq!(answers, [200, 200, 200, 429]);
    let plan = tiers.peek("key_sam", "search").await.unwrap();
    assert_eq!(plan.remaining, 97, "the plan was charged apart");
}

/// A rate, then a window, then the rate again, and back: each reload that
/// changes free's kind starts its buckets fresh in memory too, even where
/// the buckets of the earlier kind still live; a reload that keeps the
/// kind keeps them.
#[tokio::test]
async fn a_kind_changed_and_changed_back_starts_fresh_each_time() {
    let clock = FakeClock::new();
    let tiers = limiter(&clock);
    let rate = "[tiers.free]\nlimit = 10\nper = \"minute\"\n";
    let window = |limit: u32| {
        format!(
            "[tiers.free]\nkind = \"window\"\nlimit = {limit}\nwindow_secs = 60\n"
        )
    };
    let remaining = |tiers: &RateTier| {
        let tiers = tiers.clone();
        async move {
            let info = tiers.check("ana", "free", 1).await.unwrap().unwrap();
            info.remaining
        }
    };
    for _ in 0..4 {
        remaining(&tiers).await;
    }
    tiers.reload(plans(&window(5)));
    assert_eq!(remaining(&tiers).await, 4, "the window starts empty");
    assert_eq!(remaining(&tiers).await, 3);
    // The same kind, a larger limit: the log is kept.
    tiers.reload(plans(&window(8)));
    assert_eq!(remaining(&tiers).await, 5);
    // Back to the rate within its minute: its 4 spent are not read again.
    tiers.reload(plans(rate));
    assert_eq!(remaining(&tiers).await, 9, "the rate starts full");
    // And the window again, within its 60 s: its 3 logins are not either.
    tiers.reload(plans(&window(8)));
    assert_eq!(remaining(&tiers).await, 7, "the window starts empty");
}
