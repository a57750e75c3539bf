//! A customer's own quota (`TierIdentity::with_quota`,
//! `LimitRequest::quota`): in place of the tier's or a limit's, in the
//! customer's own bucket, labelled by the tier; a changed quota keeps what
//! was spent; a quota of the wrong kind fails closed. Fake clock.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use http::StatusCode;
use support::http::get_as;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    Error, Limit, LimitEvent, LimitRequest, Quota, RateTier, Settle,
    TierIdentity, TierLimitLayer, Window, rules::Adjust,
};

/// Pro is 100 a minute; `search` 3 a minute. Ada negotiated 500 a minute
/// on pro and 10 searches; eva's own quota for pro is a window, a mistake.
fn app(clock: &FakeClock, ada: Arc<Mutex<Option<Quota>>>) -> (Router, Events) {
    let events = Events::default();
    let sink = events.clone();
    let tiers = RateTier::builder()
        .tier("pro", Quota::per_minute(100))
        .clock(clock.clone())
        .on_event(move |event| sink.0.lock().unwrap().push(event.clone()))
        .build();
    let layer = TierLimitLayer::new(tiers)
        .identifier_fn(move |headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?.to_owned();
            let identity = TierIdentity::new(key.clone(), "pro");
            Some(match key.as_str() {
                "key_ada" => match *ada.lock().unwrap() {
                    Some(quota) => identity
                        .with_quota("pro", quota)
                        .with_quota("search", Quota::per_minute(10)),
                    None => identity,
                },
                "key_eva" => identity.with_quota(
                    "pro",
                    Window::new(5, Duration::from_secs(60)).unwrap(),
                ),
                _ => identity,
            })
        })
        .limit(
            Limit::new("search", Quota::per_minute(3))
                .when(|req| req.uri.path() == "/search"),
        );
    let ok = || axum::routing::get(|| async { "ok\n" });
    let app = Router::new()
        .route("/data", ok())
        .route("/search", ok())
        .layer(layer);
    (app, events)
}

#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<LimitEvent>>>);

fn own(quota: Quota) -> Arc<Mutex<Option<Quota>>> {
    Arc::new(Mutex::new(Some(quota)))
}

#[tokio::test]
async fn a_customer_gets_their_own_quota_and_others_the_plans() {
    let clock = FakeClock::at_us(1_000_000_000);
    let (app, events) = app(&clock, own(Quota::per_minute(500)));
    for left in (0..500).rev() {
        let r = get_as(&app, Some("key_ada"), "/data").await;
        assert_eq!(
            (r.status, r.limit(), r.remaining()),
            (StatusCode::OK, 500, left)
        );
    }
    let r = get_as(&app, Some("key_ada"), "/data").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // Bea, on the same tier, has the tier's 100.
    let r = get_as(&app, Some("key_bea"), "/data").await;
    assert_eq!((r.limit(), r.remaining()), (100, 99));
    // Labelled by the tier, never by the customer.
    let limited = events.0.lock().unwrap().iter().find_map(|e| match e {
        LimitEvent::Limited { tier, limit, .. } => Some((*tier, *limit)),
        _ => None,
    });
    assert_eq!(limited, Some(("pro", "pro")));
}

#[tokio::test]
async fn a_limits_own_quota_applies_in_the_same_decision() {
    let clock = FakeClock::at_us(1_000_000_000);
    let (app, _) = app(&clock, own(Quota::per_minute(500)));
    let passed = futures_count(&app, "key_ada", "/search", 12).await;
    assert_eq!(passed, 10, "ada's own 10 searches a minute");
    let passed = futures_count(&app, "key_bea", "/search", 12).await;
    assert_eq!(passed, 3, "the limit's 3 for everyone else");
}

async fn futures_count(app: &Router, key: &str, path: &str, n: usize) -> usize {
    let mut passed = 0;
    for _ in 0..n {
        if get_as(app, Some(key), path).await.status == StatusCode::OK {
            passed += 1;
        }
    }
    passed
}

#[tokio::test]
async fn a_new_quota_keeps_what_was_spent() {
    let clock = FakeClock::at_us(1_000_000_000);
    let ada = Arc::new(Mutex::new(None));
    let (app, _) = app(&clock, ada.clone());
    // 60 of the tier's 100: 36 s of the minute spent (0.6 s each).
    for _ in 0..60 {
        assert_eq!(
            get_as(&app, Some("key_ada"), "/data").await.status,
            StatusCode::OK
        );
    }
    // Upgraded to her own 500 a minute (0.12 s each): the 36 s stay spent,
    // 24 s are left, 200 requests of 0.12 s; this one takes one of them.
    *ada.lock().unwrap() = Some(Quota::per_minute(500));
    let r = get_as(&app, Some("key_ada"), "/data").await;
    assert_eq!(
        (r.status, r.limit(), r.remaining()),
        (StatusCode::OK, 500, 199)
    );
    // And back to the tier: the same bucket, read with the tier's quota.
    *ada.lock().unwrap() = None;
    let r = get_as(&app, Some("key_ada"), "/data").await;
    assert_eq!((r.limit(), r.remaining()), (100, 38));
}

#[tokio::test]
async fn a_quota_of_the_wrong_kind_fails_closed() {
    let clock = FakeClock::at_us(1_000_000_000);
    let (app, _) = app(&clock, own(Quota::per_minute(500)));
    for _ in 0..3 {
        let r = get_as(&app, Some("key_eva"), "/data").await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{r:?}");
    }
    // Through the direct API: the typed error.
    let tiers = RateTier::builder()
        .tier("pro", Quota::per_minute(100))
        .clock(clock.clone())
        .build();
    let window = Window::new(5, Duration::from_secs(60)).unwrap();
    let request = LimitRequest::new("eva", "pro", 1).quota("pro", window);
    let error = tiers.decide(&request).await.unwrap_err();
    assert!(
        matches!(error, Error::OwnQuota(ref name) if name == "pro"),
        "{error}"
    );
}

#[tokio::test]
async fn the_direct_api_takes_an_own_quota_too() {
    let clock = FakeClock::at_us(1_000_000_000);
    let tiers = RateTier::builder()
        .tier("pro", Quota::per_minute(100))
        .clock(clock.clone())
        .build();
    let search = Limit::new("search", Quota::per_minute(3));
    let request = LimitRequest::new("ada", "pro", 1)
        .limit(&search, 1)
        .quota("pro", Quota::per_minute(500))
        .quota("search", Quota::per_minute(10));
    let info = tiers.decide(&request).await.unwrap().unwrap();
    let limits: Vec<(&str, u32, u64)> = info
        .limits()
        .map(|l| (l.name, l.limit, l.remaining))
        .collect();
    assert!(limits.contains(&("pro", 500, 499)), "{limits:?}");
    assert!(limits.contains(&("search", 10, 9)), "{limits:?}");
    assert_eq!(info.tier, "pro");
}

/// Regression: `RateTier::settle` settled under the limit's configured
/// quota (1000 tokens a minute), not the customer's own (100) that charged
/// the request, so ada's debt of 100 tokens cost her 6 s instead of 60 s.
#[tokio::test]
async fn settle_uses_the_own_quota_that_charged() {
    let clock = FakeClock::at_us(1_000_000_000);
    let tiers = RateTier::builder()
        .tier("pro", Quota::per_minute(100))
        .clock(clock.clone())
        .build();
    let tokens = Limit::new("tokens", Quota::per_minute(1000))
        .settle(Settle::from_header("x-tokens-used"));
    let request = LimitRequest::new("ada", "pro", 1)
        .limit(&tokens, 1)
        .quota("tokens", Quota::per_minute(100));
    let info = tiers.decide(&request).await.unwrap().unwrap();
    // 101 tokens used: a debt of 100 of her own 0.6 s each, 60 s. Her
    // bucket is 60.6 s ahead, of 60 s: 1.2 s to wait for the next token.
    tiers
        .settle("ada", &info, &tokens, Adjust::between(1, 101))
        .await
        .unwrap();
    let refused = tiers.decide(&request).await.unwrap().unwrap_err();
    assert_eq!(refused.limit_name(), "tokens");
    assert_eq!(refused.retry_after(), Duration::from_millis(1200));
    // Without her own quota the same settlement is the limit's: 6 s.
    let bea = LimitRequest::new("bea", "pro", 1).limit(&tokens, 1);
    let info = tiers.decide(&bea).await.unwrap().unwrap();
    tiers
        .settle("bea", &info, &tokens, Adjust::between(1, 101))
        .await
        .unwrap();
    let info = tiers.decide(&bea).await.unwrap().unwrap();
    let left = info.limits().find(|l| l.name == "tokens").unwrap();
    assert_eq!(left.remaining, 1000 - 1 - 100 - 1);
}
