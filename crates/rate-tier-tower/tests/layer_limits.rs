//! Several limits in one decision through the HTTP layer: the
//! tier's and limits of its own (per user for a route, per address, global,
//! per tier), all or nothing; the refusal names the limit; the headers
//! describe the most constraining limit; peek, settle and shadow mode. The
//! example server's configuration (free 10/min, pro 100/min, `search` 3 a
//! minute, `tokens` 1000 or 10000 a minute settled from `x-tokens-used`)
//! on a fake clock: exact numbers, no sleep.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::Query;
use axum::response::IntoResponse;
use axum::{Extension, Router};
use http::StatusCode;
use support::fixtures::{START_US, plan_of, post_plans};
use support::http::{Events, get, get_as};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::layer::HeaderStyle;
use tower_rate_tier::{
    Limit, LimitEvent, Quota, RateLimitInfo, RateTier, Settle, TierIdentity,
    TierLimitLayer, client_ip::ClientIp,
};

fn path_is(path: &'static str) -> impl Fn(&http::request::Parts) -> bool {
    move |req| req.uri.path() == path
}

/// The example server's layer (without its headers choice).
fn server_layer(tiers: RateTier, events: &Events) -> TierLimitLayer {
    TierLimitLayer::new(tiers)
        .identifier_fn(|headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, plan_of(key)?))
        })
        .cost_fn(|req| match req.uri.path() {
            "/report" => 5,
            "/backup" => 50,
            _ => 1,
        })
        .limit(
            Limit::new("search", Quota::per_minute(3)).when(path_is("/search")),
        )
        .limit(
            Limit::new("tokens", Quota::per_minute(1000))
                .tier("pro", Quota::per_minute(10_000))
                .when(path_is("/generate"))
                .settle(
                    Settle::from_header("x-tokens-used")
                        .refund_on_server_error(),
                ),
        )
        .peek_when(path_is("/quota"))
        .on_event(events.sink())
}

/// `/quota`: one line per limit, `name limit remaining reset`.
async fn quota(Extension(info): Extension<RateLimitInfo>) -> String {
    let mut text = format!("{} cost={}\n", info.tier, info.cost);
    for limit in info.limits() {
        text.push_str(&format!(
            "{} {} {} {}\n",
            limit.name,
            limit.limit,
            limit.remaining,
            limit.reset_unix_secs(info.now_us)
        ));
    }
    text
}

/// `/generate?tokens=N[&fail=1]`: says how many tokens it used; fails (500)
/// when asked to.
async fn generate(
    Query(query): Query<HashMap<String, String>>,
) -> axum::response::Response {
    let tokens = query.get("tokens").cloned().unwrap_or_default();
    let status = if query.contains_key("fail") {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    (status, [("x-tokens-used", tokens)], "generated\n").into_response()
}

struct Server {
    app: Router,
    tiers: RateTier,
    clock: FakeClock,
    events: Events,
    calls: Arc<AtomicUsize>,
}

fn routes(calls: &Arc<AtomicUsize>) -> Router {
    let counted = |body: &'static str| {
        let calls = calls.clone();
        axum::routing::get(move || async move {
            calls.fetch_add(1, Ordering::SeqCst);
            body
        })
    };
    Router::new()
        .route("/data", counted("data\n"))
        .route("/report", counted("report\n"))
        .route("/backup", counted("backup\n"))
        .route("/search", counted("search\n"))
        .route("/all", counted("all\n"))
        .route("/quota", axum::routing::get(quota))
        .route("/generate", axum::routing::get(generate))
}

fn server_with(
    change: impl FnOnce(TierLimitLayer) -> TierLimitLayer,
) -> Server {
    let clock = FakeClock::at_us(START_US);
    let tiers = post_plans(&clock).build();
    let events = Events::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let app =
        routes(&calls).layer(change(server_layer(tiers.clone(), &events)));
    Server {
        app,
        tiers,
        clock,
        events,
        calls,
    }
}

fn server() -> Server {
    server_with(|layer| layer)
}

/// The reset second of a bucket full again `secs` (and `micros`) from the
/// start: rounded up.
fn reset_at(full_in: Duration) -> u64 {
    (START_US + u64::try_from(full_in.as_micros()).unwrap()).div_ceil(1_000_000)
}

/// `/quota`'s lines for a user, after the first (tier and cost).
async fn quota_of(s: &Server, key: &str) -> Vec<String> {
    let r = get_as(&s.app, Some(key), "/quota").await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    r.body.lines().skip(1).map(str::to_owned).collect()
}

/// `name remaining` of each limit `/quota` shows.
async fn remaining_of(s: &Server, key: &str) -> Vec<(String, u64)> {
    quota_of(s, key)
        .await
        .iter()
        .map(|line| {
            let words: Vec<&str> = line.split(' ').collect();
            (words[0].to_owned(), words[2].parse().unwrap())
        })
        .collect()
}

fn named(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    pairs.iter().map(|(n, r)| ((*n).to_owned(), *r)).collect()
}

// ---------------------------------------------------------------------------
// All or nothing.

#[tokio::test]
async fn plan_and_route_limit_pass_exactly_the_tighter_quota_and_a_refusal_charges_nothing()
 {
    let s = server();
    for k in 1..=3u64 {
        let r = get_as(&s.app, Some("key_ana"), "/search").await;
        assert_eq!(r.status, StatusCode::OK, "search {k}");
        assert_eq!(r.body, "search\n");
    }
    for _ in 0..5 {
        let r = get_as(&s.app, Some("key_ana"), "/search").await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            r.body,
            r#"{"error":"rate limit exceeded","tier":"free","limit":"search","retry_after":20}"#
        );
        assert_eq!(r.header("retry-after"), Some("20"));
        assert_eq!(r.header("content-type"), Some("application/json"));
    }
    assert_eq!(s.calls.load(Ordering::SeqCst), 3);
    // Three searches charged the tier 3, the five refusals nothing.
    assert_eq!(s.tiers.peek("key_ana", "free").await.unwrap().remaining, 7);
    assert_eq!(
        remaining_of(&s, "key_ana").await,
        named(&[("free", 7), ("search", 0), ("tokens", 1000)])
    );
    // The tier's 7 are there to spend, elsewhere.
    for k in (0..7).rev() {
        let r = get_as(&s.app, Some("key_ana"), "/data").await;
        assert_eq!((r.status, r.remaining()), (StatusCode::OK, k));
    }
    let events = s.events.all();
    let refusals: Vec<&LimitEvent> = events
        .iter()
        .filter(|e| matches!(e, LimitEvent::Limited { .. }))
        .collect();
    assert_eq!(refusals.len(), 5);
    assert!(matches!(
        refusals[0],
        LimitEvent::Limited { tier: "free", limit: "search", cost: 1, retry_after, .. }
            if *retry_after == Duration::from_secs(20)
    ));
}

#[tokio::test]
async fn the_plans_own_refusal_keeps_the_posts_body_byte_for_byte() {
    let s = server();
    for _ in 0..10 {
        get_as(&s.app, Some("key_ana"), "/data").await;
    }
    // The search limit would pass: the tier refuses, and is not named.
    let r = get_as(&s.app, Some("key_ana"), "/search").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.body,
        r#"{"error":"rate limit exceeded","tier":"free","retry_after":6}"#
    );
    assert_eq!(r.header("content-length"), Some("61"));
    assert_eq!(r.header("retry-after"), Some("6"));
    assert_eq!(r.limit(), 10);
    assert_eq!(r.remaining(), 0);
    assert_eq!(r.header("x-ratelimit-reset"), Some("1790947155"));
    // The search bucket was not charged for it.
    assert_eq!(
        remaining_of(&s, "key_ana").await,
        named(&[("free", 0), ("search", 3), ("tokens", 1000)])
    );
}

#[tokio::test]
async fn when_both_refuse_the_longest_wait_is_given_and_named() {
    let s = server();
    for _ in 0..3 {
        get_as(&s.app, Some("key_ana"), "/search").await;
    }
    for _ in 0..7 {
        get_as(&s.app, Some("key_ana"), "/data").await;
    }
    // The tier would pass in 6 s, the search limit in 20 s.
    let r = get_as(&s.app, Some("key_ana"), "/search").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.retry_after(), 20);
    assert!(r.body.contains(r#""limit":"search""#), "{}", r.body);
    // Waiting what it is told is enough for both.
    s.clock.advance(Duration::from_secs(20));
    assert_eq!(
        get_as(&s.app, Some("key_ana"), "/search").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn x_ratelimit_headers_describe_the_most_constraining_limit() {
    let s = server();
    // Search (2 left) is tighter than the tier (9 left).
    let r = get_as(&s.app, Some("key_ana"), "/search").await;
    assert_eq!((r.limit(), r.remaining()), (3, 2));
    let reset = reset_at(Duration::from_secs(20)).to_string();
    assert_eq!(r.header("x-ratelimit-reset"), Some(&*reset));
    // A route without the limit: the tier alone.
    let r = get_as(&s.app, Some("key_ana"), "/data").await;
    assert_eq!((r.limit(), r.remaining()), (10, 8));
    // The tier nearly spent: the tier is the tighter one.
    for _ in 0..7 {
        get_as(&s.app, Some("key_ana"), "/data").await;
    }
    let r = get_as(&s.app, Some("key_ana"), "/search").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!((r.limit(), r.remaining()), (10, 0));
    let reset = reset_at(Duration::from_secs(60)).to_string();
    assert_eq!(r.header("x-ratelimit-reset"), Some(&*reset));
    // Pro: a tier of 100, the same search limit of 3.
    let r = get_as(&s.app, Some("key_bea"), "/search").await;
    assert_eq!((r.limit(), r.remaining()), (3, 2));
}

#[tokio::test]
async fn the_ietf_fields_list_every_policy() {
    let s = server_with(|layer| layer.headers(HeaderStyle::Both));
    let r = get_as(&s.app, Some("key_ana"), "/search").await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""free";q=10;w=60, "search";q=3;w=60"#)
    );
    assert_eq!(
        r.header("ratelimit"),
        Some(r#""free";r=9;t=6, "search";r=2;t=20"#)
    );
    assert_eq!(r.limit(), 3);
    for _ in 0..2 {
        get_as(&s.app, Some("key_ana"), "/search").await;
    }
    let refused = get_as(&s.app, Some("key_ana"), "/search").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some(r#""free";q=10;w=60, "search";q=3;w=60"#)
    );
    // The tier as it stands (uncharged), the refusing limit's wait.
    assert_eq!(
        refused.header("ratelimit"),
        Some(r#""free";r=7;t=18, "search";r=0;t=20"#)
    );
    assert_eq!(refused.retry_after(), 20);
    assert_eq!((refused.limit(), refused.remaining()), (3, 0));
    // A route with the tier only: one policy.
    let r = get_as(&s.app, Some("key_ana"), "/data").await;
    assert_eq!(r.header("ratelimit-policy"), Some(r#""free";q=10;w=60"#));
    // Pro's tokens: the per-tier quota is the policy.
    let r = get_as(&s.app, Some("key_bea"), "/generate?tokens=1").await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""pro";q=100;w=60, "tokens";q=10000;w=60"#)
    );
}

/// Three limits on one route, each in turn the one that refuses: the
/// refusal names it, and nothing else is charged.
#[tokio::test]
async fn a_refusal_in_any_position_charges_nothing_and_names_its_limit() {
    for tight in 0..3 {
        let quota = |i: usize| {
            if i == tight {
                Quota::per_minute(1)
            } else {
                Quota::per_minute(5)
            }
        };
        let s = server_with(|layer| {
            layer
                .limit(
                    Limit::new("ip", quota(0))
                        .keyed_by(|req| {
                            let ip = req.headers.get("x-forwarded-for")?;
                            Some(ip.to_str().ok()?.to_owned())
                        })
                        .when(path_is("/all")),
                )
                .limit(Limit::new("route", quota(1)).when(path_is("/all")))
                .limit(
                    Limit::new("global", quota(2))
                        .global()
                        .when(path_is("/all")),
                )
        });
        let app = s.app.clone();
        let send = || {
            get(
                &app,
                "/all",
                &[("x-api-key", "key_bea"), ("x-forwarded-for", "203.0.113.7")],
            )
        };
        assert_eq!(send().await.status, StatusCode::OK, "tight {tight}");
        let names = ["ip", "route", "global"];
        for _ in 0..3 {
            let refused = send().await;
            assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(
                refused.body,
                format!(
                    r#"{{"error":"rate limit exceeded","tier":"pro","limit":"{}","retry_after":60}}"#,
                    names[tight]
                )
            );
        }
        // Read every bucket: charged once each, by the request that passed.
        let r = get(
            &app,
            "/quota",
            &[("x-api-key", "key_bea"), ("x-forwarded-for", "203.0.113.7")],
        )
        .await;
        let mut expected = vec![
            "pro 100 99".to_owned(),
            "search 3 3".to_owned(),
            "tokens 10000 10000".to_owned(),
        ];
        for (i, name) in names.iter().enumerate() {
            let (limit, left) = if i == tight { (1, 0) } else { (5, 4) };
            expected.push(format!("{name} {limit} {left}"));
        }
        let got: Vec<String> = r
            .body
            .lines()
            .skip(1)
            .map(|l| l.rsplit_once(' ').unwrap().0.to_owned())
            .collect();
        assert_eq!(got, expected, "tight {tight}");
    }
}

#[tokio::test]
async fn a_per_address_limit_is_shared_by_the_users_of_one_address() {
    let s = server_with(|layer| {
        layer.limit(Limit::new("ip", Quota::per_minute(3)).keyed_by(|req| {
            Some(
                req.headers
                    .get("x-forwarded-for")?
                    .to_str()
                    .ok()?
                    .to_owned(),
            )
        }))
    });
    let app = &s.app;
    let from = |key: &'static str, ip: &'static str| async move {
        get(app, "/data", &[("x-api-key", key), ("x-forwarded-for", ip)]).await
    };
    assert_eq!(from("key_ana", "203.0.113.7").await.status, StatusCode::OK);
    assert_eq!(from("key_bea", "203.0.113.7").await.status, StatusCode::OK);
    let r = from("key_eva", "203.0.113.7").await;
    assert_eq!((r.status, r.limit(), r.remaining()), (StatusCode::OK, 3, 0));
    let refused = from("key_bea", "203.0.113.7").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        refused.body.contains(r#""tier":"pro","limit":"ip""#),
        "{}",
        refused.body
    );
    // Another address has its own bucket; no address, no such limit.
    assert_eq!(from("key_bea", "198.51.100.1").await.status, StatusCode::OK);
    let r = get_as(&s.app, Some("key_bea"), "/data").await;
    assert_eq!((r.status, r.limit()), (StatusCode::OK, 100));
    // Bea's tier paid for her three passing requests only.
    assert_eq!(s.tiers.peek("key_bea", "pro").await.unwrap().remaining, 97);
    // The address is never written in clear to a response.
    assert!(!format!("{refused:?}").contains("203.0.113.7"));
}

#[tokio::test]
async fn a_global_limit_is_one_bucket_for_everyone() {
    let s = server_with(|layer| {
        layer.limit(
            Limit::new("export", Quota::per_minute(2))
                .global()
                .when(path_is("/report")),
        )
    });
    assert_eq!(
        get_as(&s.app, Some("key_ana"), "/report").await.status,
        StatusCode::OK
    );
    assert_eq!(
        get_as(&s.app, Some("key_bea"), "/report").await.status,
        StatusCode::OK
    );
    let refused = get_as(&s.app, Some("key_eva"), "/report").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.retry_after(), 30);
    assert!(
        refused.body.contains(r#""limit":"export""#),
        "{}",
        refused.body
    );
    // Eva's tier (the default's quota, her own bucket) was not charged.
    let eva = get_as(&s.app, Some("key_eva"), "/data").await;
    assert_eq!(eva.remaining(), 9);
}

#[tokio::test]
async fn when_predicates_choose_the_requests_a_limit_charges() {
    let s = server();
    for _ in 0..5 {
        get_as(&s.app, Some("key_ana"), "/data").await;
    }
    get_as(&s.app, Some("key_ana"), "/report").await;
    assert_eq!(
        remaining_of(&s, "key_ana").await,
        named(&[("free", 0), ("search", 3), ("tokens", 1000)])
    );
    // A limit's cost can follow the tier's: an export counts what it costs.
    let s = server_with(|layer| {
        layer.limit(
            Limit::new("heavy", Quota::per_minute(12))
                .tier_cost()
                .when(|req| req.uri.path() != "/data"),
        )
    });
    let r = get_as(&s.app, Some("key_bea"), "/report").await;
    assert_eq!((r.limit(), r.remaining()), (12, 7));
    let r = get_as(&s.app, Some("key_bea"), "/data").await;
    assert_eq!((r.limit(), r.remaining()), (100, 94));
    let r = get_as(&s.app, Some("key_bea"), "/search").await;
    assert_eq!((r.limit(), r.remaining()), (3, 2));
    assert_eq!(
        remaining_of(&s, "key_bea").await,
        named(&[("pro", 93), ("search", 2), ("tokens", 10_000), ("heavy", 6)])
    );
}

#[tokio::test]
async fn a_per_tier_quota_applies_to_its_tier_and_the_first_to_the_others() {
    let s = server();
    let quota_line = |lines: &[String], name: &str| {
        lines.iter().find(|l| l.starts_with(name)).unwrap().clone()
    };
    let ana = quota_of(&s, "key_ana").await;
    let bea = quota_of(&s, "key_bea").await;
    let eva = quota_of(&s, "key_eva").await;
    assert!(quota_line(&ana, "tokens ").starts_with("tokens 1000 1000 "));
    assert!(quota_line(&bea, "tokens ").starts_with("tokens 10000 10000 "));
    // Eva's unknown tier is the default's: free's tokens.
    assert!(quota_line(&eva, "tokens ").starts_with("tokens 1000 1000 "));
    let r = get_as(&s.app, Some("key_bea"), "/generate?tokens=2500").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        remaining_of(&s, "key_bea").await,
        named(&[("pro", 99), ("search", 3), ("tokens", 7500)])
    );
}

/// A cost above a limit's burst can never pass: 403, naming the limit,
/// and nothing is charged.
#[tokio::test]
async fn a_cost_above_a_limits_burst_is_403_naming_it() {
    let s = server_with(|layer| {
        layer.limit(
            Limit::new("bulk", Quota::per_minute(3))
                .cost(4)
                .when(path_is("/report")),
        )
    });
    let r = get_as(&s.app, Some("key_bea"), "/report").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(
        r.body,
        r#"{"error":"request cost exceeds the limit's burst","tier":"pro","limit":"bulk","cost":4,"burst":3}"#
    );
    assert_eq!(r.limit(), 3);
    assert!(s.events.all().iter().any(|e| matches!(
        e,
        LimitEvent::CostExceedsBurst {
            limit: "bulk",
            cost: 4,
            burst: 3,
            ..
        }
    )));
    assert_eq!(s.tiers.peek("key_bea", "pro").await.unwrap().remaining, 100);
    assert_eq!(s.calls.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------
// Peek.

#[tokio::test]
async fn a_peek_through_the_layer_changes_nothing() {
    let s = server();
    get_as(&s.app, Some("key_ana"), "/search").await;
    get_as(&s.app, Some("key_ana"), "/report").await;
    let first = get_as(&s.app, Some("key_ana"), "/quota").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        first.body,
        format!(
            "free cost=0\nfree 10 4 {}\nsearch 3 2 {}\ntokens 1000 1000 {}\n",
            reset_at(Duration::from_secs(36)),
            reset_at(Duration::from_secs(20)),
            reset_at(Duration::ZERO),
        )
    );
    // The most constraining limit, in the headers too.
    assert_eq!((first.limit(), first.remaining()), (3, 2));
    for _ in 0..20 {
        let again = get_as(&s.app, Some("key_ana"), "/quota").await;
        assert_eq!(again.body, first.body);
    }
    // Peeking an empty bucket is not refused, and charges nothing.
    for _ in 0..4 {
        get_as(&s.app, Some("key_ana"), "/data").await;
    }
    let spent = get_as(&s.app, Some("key_ana"), "/quota").await;
    assert_eq!(spent.status, StatusCode::OK);
    assert_eq!(spent.remaining(), 0);
    assert_eq!(
        get_as(&s.app, Some("key_ana"), "/data").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    s.clock.advance(Duration::from_secs(6));
    assert_eq!(
        get_as(&s.app, Some("key_ana"), "/data").await.remaining(),
        0
    );
    // Policies still apply to a peek: no key, 401.
    assert_eq!(
        get_as(&s.app, None, "/quota").await.status,
        StatusCode::UNAUTHORIZED
    );
    assert!(
        !s.events.all().iter().any(|e| matches!(
            e,
            LimitEvent::Limited {
                limit: "search",
                ..
            }
        )),
        "a peek was refused"
    );
}

#[tokio::test]
async fn rate_tier_peek_reads_without_charging() {
    let s = server();
    let fresh = s.tiers.peek("key_ana", "free").await.unwrap();
    assert_eq!((fresh.limit, fresh.remaining), (10, 10));
    assert_eq!(fresh.reset_after, Duration::ZERO);
    assert_eq!(fresh.cost, 0);
    s.tiers.check("key_ana", "free", 4).await.unwrap().unwrap();
    for _ in 0..10 {
        let info = s.tiers.peek("key_ana", "free").await.unwrap();
        assert_eq!(info.remaining, 6);
        assert_eq!(info.reset_after, Duration::from_secs(24));
    }
    let info = s.tiers.check("key_ana", "free", 6).await.unwrap().unwrap();
    assert_eq!(info.remaining, 0);
    let spent = s.tiers.peek("key_ana", "free").await.unwrap();
    assert_eq!(spent.remaining, 0);
    // An unknown tier reads the default's quota in the user's bucket.
    let eva = s.tiers.peek("key_eva", "gold").await.unwrap();
    assert_eq!((eva.limit, eva.remaining, &*eva.tier), (10, 10, "free"));
}

// ---------------------------------------------------------------------------
// Settle.

#[tokio::test]
async fn a_settled_debt_makes_the_next_generate_wait_about_12_s() {
    let s = server();
    let r = get_as(&s.app, Some("key_ana"), "/generate?tokens=1200").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "generated\n");
    // Charged 1 up front (the headers say so); settled to 1200 after.
    assert_eq!(
        remaining_of(&s, "key_ana").await,
        named(&[("free", 9), ("search", 3), ("tokens", 0)])
    );
    let refused = get_as(&s.app, Some("key_ana"), "/generate?tokens=1").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    // 1200 tokens at 1000 a minute: 72 s of tokens, 60 of them the
    // bucket; the next token 60 ms later: 12.06 s, rounded up.
    assert_eq!(refused.retry_after(), 13);
    assert!(
        refused.body.contains(r#""limit":"tokens""#),
        "{}",
        refused.body
    );
    // The tier was not charged for the refusal.
    assert_eq!(s.tiers.peek("key_ana", "free").await.unwrap().remaining, 9);
    s.clock.advance(Duration::from_secs(12));
    let r = get_as(&s.app, Some("key_ana"), "/generate?tokens=1").await;
    assert_eq!(
        (r.status, r.retry_after()),
        (StatusCode::TOO_MANY_REQUESTS, 1)
    );
    s.clock.advance(Duration::from_millis(60));
    let r = get_as(&s.app, Some("key_ana"), "/generate?tokens=1").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.remaining(), 0);
    // Other routes are not held by the debt.
    assert_eq!(
        get_as(&s.app, Some("key_ana"), "/data").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_smaller_actual_cost_is_refunded_never_below_a_full_bucket() {
    // An estimate of 100 tokens up front.
    let s = server_with(|layer| {
        layer.limit(
            Limit::new("words", Quota::per_minute(1000))
                .cost(100)
                .when(path_is("/generate"))
                .settle(Settle::from_header("x-tokens-used")),
        )
    });
    let r = get_as(&s.app, Some("key_bea"), "/generate?tokens=30").await;
    assert_eq!(r.status, StatusCode::OK);
    let words = |rows: Vec<(String, u64)>| {
        rows.into_iter().find(|(n, _)| n == "words").unwrap().1
    };
    assert_eq!(words(remaining_of(&s, "key_bea").await), 970);
    // Used nothing: refunded to a full bucket, and no further.
    s.clock.advance(Duration::from_secs(60));
    for _ in 0..3 {
        let r = get_as(&s.app, Some("key_bea"), "/generate?tokens=0").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(words(remaining_of(&s, "key_bea").await), 1000);
    }
    // A full bucket is 1000 words: ten estimates of 100 pass, not eleven.
    for k in 0..10 {
        let r = get_as(&s.app, Some("key_bea"), "/generate").await;
        assert_eq!(r.status, StatusCode::OK, "estimate {k}");
    }
    let refused = get_as(&s.app, Some("key_bea"), "/generate").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        refused.body.contains(r#""limit":"words""#),
        "{}",
        refused.body
    );
}

#[tokio::test]
async fn a_server_error_is_refunded_with_refund_on_server_error() {
    let s = server();
    let r =
        get_as(&s.app, Some("key_ana"), "/generate?tokens=900&fail=1").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    // The estimate given back: a failed generation costs no tokens.
    assert_eq!(
        remaining_of(&s, "key_ana").await,
        named(&[("free", 9), ("search", 3), ("tokens", 1000)])
    );
    // A response without the header keeps the estimate.
    let s = server_with(|layer| {
        layer.limit(
            Limit::new("words", Quota::per_minute(10))
                .cost(4)
                .when(path_is("/data"))
                .settle(Settle::from_header("x-tokens-used")),
        )
    });
    get_as(&s.app, Some("key_ana"), "/data").await;
    let words = remaining_of(&s, "key_ana").await;
    assert_eq!(words.last().unwrap(), &("words".to_owned(), 6));
}

// ---------------------------------------------------------------------------
// Shadow mode.

#[tokio::test]
async fn a_shadow_limit_refuses_nothing_and_reports_each_would_be_refusal() {
    let s = server_with(|layer| {
        layer.limit(
            Limit::new("trial", Quota::per_minute(2))
                .shadow()
                .when(path_is("/data")),
        )
    });
    for k in 1..=10 {
        let r = get_as(&s.app, Some("key_ana"), "/data").await;
        assert_eq!(r.status, StatusCode::OK, "request {k}");
        // The headers describe what is enforced: the tier.
        assert_eq!(r.limit(), 10);
    }
    let shadowed: Vec<LimitEvent> = s
        .events
        .all()
        .into_iter()
        .filter(|e| matches!(e, LimitEvent::ShadowLimited { .. }))
        .collect();
    assert_eq!(shadowed.len(), 8, "{shadowed:?}");
    assert!(matches!(
        &shadowed[0],
        LimitEvent::ShadowLimited { tier: "free", limit: "trial", retry_after, .. }
            if *retry_after == Duration::from_secs(30)
    ));
    // The tier still refuses: shadow is per limit.
    assert_eq!(
        get_as(&s.app, Some("key_ana"), "/data").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Charged as if enforced: 2 passed alone, and are spent.
    let trial = remaining_of(&s, "key_ana").await;
    assert_eq!(trial.last().unwrap(), &("trial".to_owned(), 0));
}

#[tokio::test]
async fn shadow_mode_for_everything_refuses_nothing_for_rate() {
    let s = server_with(|layer| layer.shadow(true));
    for k in 1..=15 {
        let r = get_as(&s.app, Some("key_ana"), "/data").await;
        assert_eq!(r.status, StatusCode::OK, "request {k}");
    }
    for _ in 0..5 {
        let r = get_as(&s.app, Some("key_ana"), "/search").await;
        assert_eq!(r.status, StatusCode::OK);
    }
    assert_eq!(s.calls.load(Ordering::SeqCst), 20);
    let count = |limit: &str| {
        s.events.count(|e| {
            matches!(e, LimitEvent::ShadowLimited { limit: l, .. } if *l == limit)
        })
    };
    // The tier's 10 were spent by /data: 5 more, and every search; the
    // search limit's 3 by the first searches: 2 more.
    assert_eq!(count("free"), 10);
    assert_eq!(count("search"), 2);
    assert_eq!(
        s.events.count(|e| matches!(e, LimitEvent::Limited { .. })),
        0
    );
    // What is not a rate still gets its answer.
    assert_eq!(
        get_as(&s.app, None, "/data").await.status,
        StatusCode::UNAUTHORIZED
    );
}

/// Shadow mode for everything refuses nothing for its quota, not even a
/// cost above the burst: it is reported as a would-be refusal, so a new
/// limit can be rolled out in shadow without turning any request away.
#[tokio::test]
async fn shadow_mode_for_everything_passes_a_cost_that_can_never_pass_and_reports_it()
 {
    let s = server_with(|layer| layer.shadow(true));
    let r = get_as(&s.app, Some("key_ana"), "/backup").await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(s.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        s.events
            .count(|e| matches!(e, LimitEvent::ShadowLimited { .. })),
        1
    );
    assert_eq!(
        s.events
            .count(|e| matches!(e, LimitEvent::CostExceedsBurst { .. })),
        0
    );
}

/// Debug output of everything the layer reports, and of an identity, has
/// no user id in it.
#[tokio::test]
async fn no_event_and_no_identity_prints_the_user_in_debug() {
    let s = server_with(|layer| {
        layer.limit(
            Limit::new("trial", Quota::per_minute(1))
                .shadow()
                .when(path_is("/data")),
        )
    });
    for _ in 0..3 {
        get_as(&s.app, Some("key_ana"), "/search").await;
        get_as(&s.app, Some("key_ana"), "/data").await;
    }
    get_as(&s.app, Some("key_ana"), "/search").await;
    get_as(&s.app, Some("key_ana"), "/backup").await;
    get_as(&s.app, Some("key_eva"), "/data").await;
    let events = s.events.all();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| match e {
            LimitEvent::Limited { .. } => "limited",
            LimitEvent::ShadowLimited { .. } => "shadow",
            LimitEvent::CostExceedsBurst { .. } => "cost",
            LimitEvent::UnknownTier { .. } => "unknown",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["shadow", "shadow", "limited", "cost", "unknown"]);
    for event in &events {
        let logged = format!("{event:?}");
        assert!(!logged.contains("key_"), "{logged}");
    }
    let who = TierIdentity::new("key_ana", "free");
    let logged = format!("{who:?}");
    assert!(
        !logged.contains("key_ana") && logged.contains("free"),
        "{logged}"
    );
    assert!(!format!("{:?}", who.clone().into_owned()).contains("key_ana"));
}

#[tokio::test]
async fn a_limit_per_client_ip_cannot_be_escaped_or_aimed_by_the_client() {
    // Regression: a per-address limit keyed on the raw X-Forwarded-For is
    // escaped by rotating it, and spends a victim's quota by naming their
    // address. The proxy appends the real address on the right; only that
    // one is read.
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(1000))
        .build();
    let layer = TierLimitLayer::new(tiers)
        .identifier_fn(|_| Some(TierIdentity::new("anyone", "free")))
        .limit(
            Limit::new("ip", Quota::per_minute(3))
                .per_client_ip(ClientIp::RIGHTMOST_X_FORWARDED_FOR),
        );
    let app = Router::new()
        .route("/data", axum::routing::get(|| async { "data\n" }))
        .layer(layer);
    // The attacker, at 198.51.100.9 behind the proxy, writes a new address
    // (and then the victim's) before the one the proxy appends.
    let mut statuses = Vec::new();
    for i in 0..5 {
        let forged = format!("10.0.0.{i}, 198.51.100.9");
        statuses.push(
            get(&app, "/data", &[("x-forwarded-for", &forged)])
                .await
                .status,
        );
    }
    for _ in 0..3 {
        let aimed = "203.0.113.7, 198.51.100.9";
        statuses.push(
            get(&app, "/data", &[("x-forwarded-for", aimed)])
                .await
                .status,
        );
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429, 429, 429, 429],
        "rotating the header escaped the limit"
    );
    // The victim, whose proxy-appended address is 203.0.113.7, lost nothing.
    for _ in 0..3 {
        let victim =
            get(&app, "/data", &[("x-forwarded-for", "203.0.113.7")]).await;
        assert_eq!(victim.status, StatusCode::OK);
    }
    // No readable address: one shared bucket, never a pass.
    let mut unknown = Vec::new();
    for _ in 0..4 {
        unknown.push(
            get(&app, "/data", &[("x-forwarded-for", "garbage")])
                .await
                .status,
        );
    }
    assert_eq!(unknown, [200, 200, 200, 429]);
}
