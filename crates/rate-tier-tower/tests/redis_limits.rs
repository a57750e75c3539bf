//! Several limits in one decision on one Redis: all or nothing
//! across two instances under concurrency, a refusal in any position, peek
//! (the stored TAT and its PTTL untouched), settle (a debt, a refund, a
//! refund on a server error) and shadow mode, through the layer and the API.
//!
//! Run with `cargo xtask test-redis`, which starts a throwaway redis-server
//! and sets `TRT_REDIS_URL` (without it these tests fail; they never use
//! port 6379). Every test uses names of its own. Time is Redis's: no fake
//! clock reaches it, and nothing here waits.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::Query;
use axum::response::IntoResponse;
use axum::{Extension, Router, routing::get};
use http::StatusCode;
use rate_tier_test_support::{
    TEST_TIMEOUT, concurrent_passes, redis_url, unique,
};
use redis::aio::ConnectionManager;
use support::http::{Events, get_as};
use tower_rate_tier::storage::key::bucket_key;
use tower_rate_tier::{
    Concurrency, Limit, LimitEvent, LimitRequest, Quota, RateLimitInfo,
    RateTier, RedisStorage, Settle, TierIdentity, TierLimitLayer, Tiers,
    Window, rules::Adjust,
};

async fn connect() -> ConnectionManager {
    redis::Client::open(redis_url())
        .unwrap()
        .get_connection_manager()
        .await
        .expect("TRT_REDIS_URL does not answer: is the test server running?")
}

/// One instance: tier `tier` (10/min) on its own Redis connection.
async fn instance(tier: &str) -> RateTier {
    RateTier::builder()
        .tier(tier, Quota::per_minute(10))
        .tier(format!("{tier}-pro"), Quota::per_minute(100))
        .storage(Arc::new(
            RedisStorage::new(connect().await).timeout(TEST_TIMEOUT),
        ))
        .build()
}

/// The names one test uses: a tier, a search limit, a tokens limit.
struct Names {
    tier: String,
    search: String,
    tokens: String,
}

fn names() -> Names {
    Names {
        tier: unique("free"),
        search: unique("search"),
        tokens: unique("tokens"),
    }
}

fn path_is(path: &'static str) -> impl Fn(&http::request::Parts) -> bool {
    move |req| req.uri.path() == path
}

/// The example server's limits under `names`: search 3/min on `/search`,
/// tokens 1000/min on `/generate` settled from `x-tokens-used`.
fn layer(tiers: RateTier, names: &Names, events: &Events) -> TierLimitLayer {
    let plan = names.tier.clone();
    TierLimitLayer::new(tiers)
        .identifier_fn(move |headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, plan.clone()))
        })
        .limit(
            Limit::new(names.search.clone(), Quota::per_minute(3))
                .when(path_is("/search")),
        )
        .limit(
            Limit::new(names.tokens.clone(), Quota::per_minute(1000))
                .when(path_is("/generate"))
                .settle(
                    Settle::from_header("x-tokens-used")
                        .refund_on_server_error(),
                ),
        )
        .peek_when(path_is("/quota"))
        .on_event(events.sink())
}

async fn quota(Extension(info): Extension<RateLimitInfo>) -> String {
    info.limits()
        .map(|l| format!("{}={}", l.name, l.remaining))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn generate(
    Query(query): Query<HashMap<String, String>>,
) -> axum::response::Response {
    let tokens = query.get("tokens").cloned().unwrap_or_default();
    let status = if query.contains_key("fail") {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    (status, [("x-tokens-used", tokens)], "generated").into_response()
}

fn app(layer: TierLimitLayer) -> Router {
    Router::new()
        .route("/search", get(|| async { "search" }))
        .route("/data", get(|| async { "data" }))
        .route("/quota", get(quota))
        .route("/generate", get(generate))
        .layer(layer)
}

/// `/quota`'s `name=remaining` pairs, in the layer's order.
async fn quota_of(app: &Router, key: &str) -> String {
    let r = get_as(app, Some(key), "/quota").await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    r.body
}

fn expect(pairs: &[(&str, u64)]) -> String {
    pairs
        .iter()
        .map(|(n, r)| format!("{n}={r}"))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn pttl(conn: &mut ConnectionManager, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

async fn value(conn: &mut ConnectionManager, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

// ---------------------------------------------------------------------------
// All or nothing, two instances, concurrently.

/// `checks` concurrent `/search`es of one user, alternately through two
/// instances (each its own limiter and connection): how many pass.
async fn race(names: &Names, search: u32, checks: usize) -> (usize, RateTier) {
    let make = |tiers: RateTier| {
        app(TierLimitLayer::new(tiers)
            .identifier_fn({
                let tier = names.tier.clone();
                move |_| Some(TierIdentity::new("key_ana", tier.clone()))
            })
            .limit(
                Limit::new(names.search.clone(), Quota::per_minute(search))
                    .when(path_is("/search")),
            ))
    };
    let first = instance(&names.tier).await;
    let (a, b) = (make(first.clone()), make(instance(&names.tier).await));
    let passed = concurrent_passes(a, b, checks, |app| async move {
        let r = get_as(&app, Some("key_ana"), "/search").await;
        match r.status {
            StatusCode::OK => true,
            StatusCode::TOO_MANY_REQUESTS => false,
            other => panic!("unexpected {other}: {r:?}"),
        }
    })
    .await;
    (passed, first)
}

/// The remaining of the tier and of a per-user limit, read without
/// charging.
async fn peek_two(tiers: &RateTier, tier: &str, limit: &Limit) -> (u64, u64) {
    let request = LimitRequest::new("key_ana", tier, 0).limit(limit, 0);
    let info = tiers.decide(&request).await.unwrap().unwrap();
    let left: Vec<u64> = info.limits().map(|l| l.remaining).collect();
    (left[0], left[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_pass_exactly_the_tighter_quota_and_refusals_charge_nothing()
 {
    // The route limit is the tighter: 3 of 300 pass; the tier paid 3.
    let names = names();
    let (passed, tiers) = race(&names, 3, 300).await;
    assert_eq!(passed, 3);
    let search = Limit::new(names.search.clone(), Quota::per_minute(3));
    assert_eq!(peek_two(&tiers, &names.tier, &search).await, (7, 0));

    // The tier is the tighter: 10 of 300 pass; the route limit paid 10.
    let names = self::names();
    let (passed, tiers) = race(&names, 50, 300).await;
    assert_eq!(passed, 10);
    let search = Limit::new(names.search.clone(), Quota::per_minute(50));
    assert_eq!(peek_two(&tiers, &names.tier, &search).await, (0, 40));
}

#[tokio::test]
async fn a_refusal_in_any_position_charges_nothing_on_redis() {
    support::scenarios::a_refusal_in_any_position_charges_nothing(
        async |tier| instance(tier).await,
        "key_ana",
    )
    .await;
}

// ---------------------------------------------------------------------------
// Peek.

#[tokio::test]
async fn a_peek_leaves_the_stored_tat_and_its_pttl_untouched() {
    let names = names();
    let events = Events::default();
    let tiers = instance(&names.tier).await;
    let app = app(layer(tiers.clone(), &names, &events));
    let mut conn = connect().await;
    let plan_key = bucket_key(&names.tier, "key_ana", None);
    // Limits of their own are keyed in the limits' namespace.
    let search_key = bucket_key(&limit_key(&names.search), "key_ana", None);
    let tokens_key = bucket_key(&limit_key(&names.tokens), "key_ana", None);

    assert_eq!(get_as(&app, Some("key_ana"), "/search").await.status, 200);
    let plan_tat = value(&mut conn, &plan_key).await.expect("plan key");
    let search_tat = value(&mut conn, &search_key).await.expect("search key");
    let (plan_ttl, search_ttl) = (
        pttl(&mut conn, &plan_key).await,
        pttl(&mut conn, &search_key).await,
    );
    assert!((5_000..=6_000).contains(&plan_ttl), "PTTL {plan_ttl}");
    assert!((19_000..=20_000).contains(&search_ttl), "PTTL {search_ttl}");

    for _ in 0..10 {
        let body = quota_of(&app, "key_ana").await;
        assert_eq!(
            body,
            expect(&[
                (&names.tier, 9),
                (&names.search, 2),
                (&names.tokens, 1000)
            ])
        );
        let info = tiers.peek("key_ana", &names.tier).await.unwrap();
        assert_eq!(info.remaining, 9);
    }
    // The values are what the charge wrote; the expiries only ran down.
    assert_eq!(value(&mut conn, &plan_key).await, Some(plan_tat));
    assert_eq!(value(&mut conn, &search_key).await, Some(search_tat));
    let now_plan = pttl(&mut conn, &plan_key).await;
    let now_search = pttl(&mut conn, &search_key).await;
    assert!(
        now_plan <= plan_ttl && now_plan > plan_ttl - 2_000,
        "{now_plan}"
    );
    assert!(
        now_search <= search_ttl && now_search > search_ttl - 2_000,
        "{now_search}"
    );
    // A bucket never charged is not created by a peek.
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&tokens_key)
        .arg(bucket_key(&names.tier, "key_nobody", None))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0);
    tiers.peek("key_nobody", &names.tier).await.unwrap();
    let exists: i64 = redis::cmd("EXISTS")
        .arg(bucket_key(&names.tier, "key_nobody", None))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(exists, 0);
}

// ---------------------------------------------------------------------------
// Settle.

#[tokio::test]
async fn a_settled_debt_on_redis_makes_the_next_generate_wait_about_12_s() {
    let names = names();
    let events = Events::default();
    let tiers = instance(&names.tier).await;
    let app = app(layer(tiers, &names, &events));
    let r = get_as(&app, Some("key_ana"), "/generate?tokens=1200").await;
    assert_eq!(r.status, StatusCode::OK);
    let mut conn = connect().await;
    // 1200 tokens at 60 ms each: the TAT 72 s ahead (beyond the 60 s
    // bucket: a debt), and the key lives that long.
    let ttl = pttl(
        &mut conn,
        &bucket_key(&limit_key(&names.tokens), "key_ana", None),
    )
    .await;
    assert!((70_000..=72_000).contains(&ttl), "PTTL {ttl}");
    let refused = get_as(&app, Some("key_ana"), "/generate?tokens=1").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        (12..=13).contains(&refused.retry_after()),
        "retry after {}",
        refused.retry_after()
    );
    assert!(
        refused
            .body
            .contains(&format!(r#""limit":"{}""#, names.tokens))
    );
    // The refusal charged nothing: the tier paid for the first only.
    assert_eq!(
        quota_of(&app, "key_ana").await,
        expect(&[(&names.tier, 9), (&names.search, 3), (&names.tokens, 0)])
    );
}

#[tokio::test]
async fn a_smaller_actual_cost_and_a_server_error_are_refunded_on_redis() {
    let names = names();
    let events = Events::default();
    let tiers = instance(&names.tier).await;
    let words = unique("words");
    // 1000 words an hour: one back every 3.6 s, none while this test reads.
    let app = app(layer(tiers.clone(), &names, &events).limit(
        Limit::new(words.clone(), Quota::per_hour(1000))
            .cost(100)
            .when(path_is("/generate"))
            .settle(Settle::from_header("x-tokens-used")),
    ));
    // Tokens (1000 a minute) come back every 60 ms: a slow read may see
    // one or two more than charged.
    let read = |body: String| -> Vec<(String, u64)> {
        body.split(' ')
            .map(|pair| {
                let (name, left) = pair.split_once('=').unwrap();
                (name.to_owned(), left.parse().unwrap())
            })
            .collect()
    };
    let check = |got: Vec<(String, u64)>, plan: u64, tokens: u64, left: u64| {
        let names_got: Vec<&str> =
            got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names_got,
            [&*names.tier, &*names.search, &*names.tokens, &*words]
        );
        assert_eq!((got[0].1, got[1].1, got[3].1), (plan, 3, left), "{got:?}");
        assert!((tokens..=tokens + 3).contains(&got[2].1), "{got:?}");
    };
    let r = get_as(&app, Some("key_ana"), "/generate?tokens=30").await;
    assert_eq!(r.status, StatusCode::OK);
    check(read(quota_of(&app, "key_ana").await), 9, 970, 970);
    // A server error refunds the tokens (refund_on_server_error), the
    // words limit keeps what it reads from the header.
    let r = get_as(&app, Some("key_ana"), "/generate?tokens=500&fail=1").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    check(read(quota_of(&app, "key_ana").await), 8, 970, 470);
    // Refunds never go beyond a full bucket.
    let tokens = Limit::new(names.tokens.clone(), Quota::per_minute(1000))
        .settle(Settle::from_header("x-tokens-used"));
    let read = LimitRequest::new("key_ana", &names.tier, 0).limit(&tokens, 0);
    let info = tiers.decide(&read).await.unwrap().unwrap();
    tiers
        .settle("key_ana", &info, &tokens, Adjust::Refund(100_000))
        .await
        .unwrap();
    let info = tiers.decide(&read).await.unwrap().unwrap();
    assert_eq!(info.limits().nth(1).unwrap().remaining, 1000);
}

// ---------------------------------------------------------------------------
// Shadow.

#[tokio::test]
async fn a_shadow_limit_on_redis_refuses_nothing_and_counts_exactly() {
    let names = names();
    let events = Events::default();
    let trial = unique("trial");
    let app = app(layer(instance(&names.tier).await, &names, &events).limit(
        Limit::new(trial.clone(), Quota::per_minute(2))
            .shadow()
            .when(path_is("/data")),
    ));
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(get_as(&app, Some("key_ana"), "/data").await.status);
    }
    assert_eq!(statuses, [StatusCode::OK; 10]);
    let shadowed = events.count(|e| {
        matches!(e, LimitEvent::ShadowLimited { limit, .. } if *limit == trial)
    });
    assert_eq!(shadowed, 8);
    assert_eq!(
        get_as(&app, Some("key_ana"), "/data").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// The key part of a limit of its own named `name`.
fn limit_key(name: &str) -> String {
    format!("limit/{name}")
}

/// Real time, as Redis's clock runs: a 400 ms lease, held for 1.2 s by one
/// instance while another is refused; given back when dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_held_past_its_lease_is_renewed_and_given_back_when_dropped() {
    let lease = std::time::Duration::from_millis(400);
    let tier = unique("free");
    let instance = |conn: ConnectionManager| {
        RateTier::builder()
            .tier(&tier, Quota::per_minute(100))
            .storage(Arc::new(
                RedisStorage::new(conn).timeout(TEST_TIMEOUT).lease(lease),
            ))
            .build()
    };
    let (a, b) = (instance(connect().await), instance(connect().await));
    let uploads = Limit::new(
        unique("uploads"),
        tower_rate_tier::Concurrency::new(1).unwrap(),
    );
    let request = LimitRequest::new("ana", &tier, 1).limit(&uploads, 1);
    let held = a.decide(&request).await.unwrap().unwrap();
    // Three leases later, still held: the limiter renewed it.
    tokio::time::sleep(3 * lease).await;
    assert!(b.decide(&request).await.unwrap().is_err());
    // Dropped: given back (by a task of its own), long before a lease.
    drop(held);
    let deadline = tokio::time::Instant::now() + lease / 2;
    loop {
        if let Ok(info) = b.decide(&request).await.unwrap() {
            drop(info);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not given back");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// On one Redis a decision is one script, whatever its partitions: a
/// per-user concurrency limit beside a global window (refused on a Redis
/// Cluster, `redis_cluster_limit.rs`) is accepted when the layer is built,
/// and decided as one: the window counts every user's logins. A reload of
/// the tier to a window is accepted too.
#[tokio::test]
async fn limits_of_other_kinds_in_two_partitions_are_accepted_on_one_redis() {
    let tier = unique("free");
    let tiers = instance(&tier).await;
    let minute = std::time::Duration::from_secs(60);
    let uploads = Limit::new(unique("uploads"), Concurrency::new(2).unwrap());
    let logins =
        Limit::new(unique("logins"), Window::new(3, minute).unwrap()).global();
    let layer = TierLimitLayer::new(tiers.clone())
        .identifier_fn({
            let tier = tier.clone();
            move |headers| {
                let key = headers.get("x-api-key")?.to_str().ok()?;
                Some(TierIdentity::new(key, tier.clone()))
            }
        })
        .try_limit(uploads)
        .unwrap()
        .try_limit(logins.clone())
        .unwrap();
    let app = Router::new()
        .route("/login", get(|| async { "ok" }))
        .layer(layer);
    for key in ["key_ana", "key_bea", "key_ana"] {
        let r = get_as(&app, Some(key), "/login").await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
    }
    let r = get_as(&app, Some("key_bea"), "/login").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert!(r.body.contains(logins.name()), "{r:?}");
    let windowed = Window::new(10, minute).unwrap();
    tiers
        .try_reload(Tiers::builder().tier(&tier, windowed).build().unwrap())
        .unwrap();
}
