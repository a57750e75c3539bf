//! Two `RateTier`s ("two instances") on one Redis Cluster, each configured
//! with a different node, share one limit.
//!
//! Run with `cargo xtask test-cluster` (or `cargo xtask test`), which starts
//! a throwaway 3-master cluster and sets `TRT_REDIS_CLUSTER_URLS`. Without
//! it these tests fail: they never pass silently, and they never use the
//! shared Redis on port 6379. Every test name holds `cluster`, which is how
//! `cargo xtask test-cluster` selects them; each uses its own tier names.
//!
//! With several limits in one decision: a user's limits share
//! the user's hash tag (one slot: one atomic script), and limits that
//! cannot (per address, global) are checked slot by slot with an exact
//! refund when a later one refuses.

use std::sync::Arc;
use std::time::Duration;

use axum::{Router, routing::get};
use http::StatusCode;
use rate_tier_storage::StorageExt;
use support::http::get_as;
use tower_rate_tier::storage::key::cluster_bucket_key;
use tower_rate_tier::{
    Concurrency, ConfigError, Error, Limit, LimitReason, LimitRequest, Quota,
    RateTier, RedisStorage, Settle, StorageError, TierIdentity, TierLimitLayer,
    Tiers, Window, rules::Adjust,
};

mod support;

use rate_tier_test_support::{TEST_TIMEOUT, concurrent_passes, unique};

/// Two nodes of `cargo xtask test-cluster`'s cluster.
fn cluster_urls() -> Vec<String> {
    rate_tier_test_support::cluster_urls(2)
}

/// One instance of the 0.3 example's service, configured with cluster node `node`
/// only: tiers `<tier>` (10/min) and `<tier>-pro` (100/min), default `<tier>`.
fn instance(tier: &str, node: usize) -> RateTier {
    let url = cluster_urls().swap_remove(node);
    let store = RedisStorage::from_cluster_urls([url])
        .expect("store")
        .timeout(TEST_TIMEOUT);
    RateTier::builder()
        .tier(tier, Quota::per_minute(10))
        .tier(format!("{tier}-pro"), Quota::per_minute(100))
        .default_tier(tier)
        .storage(Arc::new(store))
        .build()
}

#[tokio::test]
async fn cluster_two_instances_on_different_nodes_share_one_limit() {
    let tier = unique("free");
    let instances = [instance(&tier, 0), instance(&tier, 1)];
    assert_eq!(instances[0].storage().kind(), "redis");

    // As in the 0.3 example: Ana alternates between two instances.
    for i in 1..=10_u64 {
        let info = instances[(i % 2) as usize]
            .check("key_ana", &tier, 1)
            .await
            .expect("storage")
            .unwrap_or_else(|l| panic!("request {i} refused: {l:?}"));
        assert_eq!(info.limit, 10);
        assert_eq!(info.remaining, 10 - i);
    }
    let limited = instances[1]
        .check("key_ana", &tier, 1)
        .await
        .expect("storage")
        .expect_err("the 11th request passed");
    assert_eq!(limited.reason(), LimitReason::RateLimited);
    assert_eq!(limited.retry_after_secs(), 6);
    assert!(limited.reset_after() <= Duration::from_secs(60));
    assert!(limited.reset_after() > Duration::from_secs(59));

    // The bucket is the cluster key, on exactly one node (the others
    // redirect with MOVED).
    let key = cluster_bucket_key(&tier, "key_ana", None);
    assert_eq!(
        key,
        format!("trt:{tier}:{{33d2315cbeb866b8b237240a98d605f2e6e41b8a}}")
    );
    let mut found = 0;
    for url in cluster_urls() {
        let mut conn = redis::Client::open(url.as_str())
            .expect("URL")
            .get_multiplexed_async_connection()
            .await
            .expect("node answers");
        let reply: redis::RedisResult<i64> =
            redis::cmd("EXISTS").arg(&key).query_async(&mut conn).await;
        match reply {
            Ok(n) => found += n,
            Err(e) => assert!(e.redirect_node().is_some(), "{url}: {e}"),
        }
    }
    assert_eq!(found, 1, "{key} is not on exactly one node");
}

/// `checks` concurrent checks of one user in `tier`, half through an
/// instance on node 0 and half through one on node 2: how many pass.
async fn passes(tier: &str, base: &str, checks: usize) -> usize {
    let (a, b) = (instance(base, 0), instance(base, 2));
    concurrent_passes(a, b, checks, |limiter| {
        let tier = tier.to_owned();
        async move {
            limiter
                .check("key_bea", &tier, 1)
                .await
                .expect("storage")
                .is_ok()
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_concurrent_checks_on_two_instances_pass_exactly_the_quota() {
    let base = unique("conc");
    assert_eq!(passes(&base, &base, 300).await, 10);
    let pro = format!("{base}-pro");
    assert_eq!(passes(&pro, &base, 300).await, 100);
}

/// The nodes that hold `key` (each node either has it or redirects).
async fn nodes_holding(key: &str) -> Vec<String> {
    let mut holding = Vec::new();
    for url in cluster_urls() {
        let mut conn = redis::Client::open(url.as_str())
            .expect("URL")
            .get_multiplexed_async_connection()
            .await
            .expect("node answers");
        let reply: redis::RedisResult<i64> =
            redis::cmd("EXISTS").arg(key).query_async(&mut conn).await;
        match reply {
            Ok(1) => holding.push(url),
            Ok(_) => {}
            Err(e) => assert!(e.redirect_node().is_some(), "{url}: {e}"),
        }
    }
    holding
}

/// `checks` concurrent `/search`es of one user, half through an instance
/// on node 0 and half through one on node 2, with the tier (10/min) and a
/// search limit of `search` a minute: how many pass, and one instance.
async fn race_two_limits(
    tier: &str,
    search: &Limit,
    checks: usize,
) -> (usize, RateTier) {
    let make = |tiers: RateTier| {
        let tier = tier.to_owned();
        Router::new()
            .route("/search", get(|| async { "search" }))
            .layer(
                TierLimitLayer::new(tiers)
                    .identifier_fn(move |_| {
                        Some(TierIdentity::new("key_bea", tier.clone()))
                    })
                    .limit(search.clone()),
            )
    };
    let first = instance(tier, 0);
    let (a, b) = (make(first.clone()), make(instance(tier, 2)));
    let passed = concurrent_passes(a, b, checks, |app| async move {
        let r = get_as(&app, Some("key_bea"), "/search").await;
        match r.status {
            StatusCode::OK => true,
            StatusCode::TOO_MANY_REQUESTS => false,
            other => panic!("unexpected {other}: {r:?}"),
        }
    })
    .await;
    (passed, first)
}

async fn read(tiers: &RateTier, tier: &str, limits: &[&Limit]) -> Vec<u64> {
    let mut request = LimitRequest::new("key_bea", tier, 0);
    for limit in limits {
        request = request.limit(limit, 0);
    }
    let info = tiers.decide(&request).await.expect("storage").unwrap();
    info.limits().map(|l| l.remaining).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_plan_and_route_limit_pass_exactly_the_tighter_quota() {
    let tier = unique("free");
    let search = Limit::new(unique("search"), Quota::per_minute(3));
    let (passed, tiers) = race_two_limits(&tier, &search, 300).await;
    assert_eq!(passed, 3);
    assert_eq!(read(&tiers, &tier, &[&search]).await, [7, 0]);

    let tier = unique("free");
    let search = Limit::new(unique("search"), Quota::per_minute(50));
    let (passed, tiers) = race_two_limits(&tier, &search, 300).await;
    assert_eq!(passed, 10);
    assert_eq!(read(&tiers, &tier, &[&search]).await, [0, 40]);
}

#[tokio::test]
async fn cluster_a_users_limits_share_one_slot() {
    let tier = unique("free");
    let tiers = instance(&tier, 1);
    let search = Limit::new(unique("search"), Quota::per_minute(3));
    let request = LimitRequest::new("key_bea", &tier, 1).limit(&search, 1);
    tiers.decide(&request).await.expect("storage").unwrap();
    let plan_key = cluster_bucket_key(&tier, "key_bea", None);
    // A limit of its own is keyed in the limits' namespace.
    let search_key = cluster_bucket_key(
        &format!("limit/{}", search.name()),
        "key_bea",
        None,
    );
    let tag = |key: &str| key.split_once('{').unwrap().1.to_owned();
    assert_eq!(tag(&plan_key), tag(&search_key));
    let (plan, limit) = (
        nodes_holding(&plan_key).await,
        nodes_holding(&search_key).await,
    );
    assert_eq!(plan.len(), 1, "{plan_key}: {plan:?}");
    assert_eq!(plan, limit, "one user's buckets on one node");
}

/// Per-address and global limits live in slots of their own: checked in
/// order, the ones already charged refunded exactly when a later refuses,
/// whichever refuses.
#[tokio::test]
async fn cluster_limits_in_other_slots_are_refunded_exactly_on_a_refusal() {
    support::scenarios::a_refusal_in_any_position_charges_nothing(
        async |tier| instance(tier, 0),
        "key_bea",
    )
    .await;
}

#[tokio::test]
async fn cluster_settle_charges_a_debt_and_a_peek_charges_nothing() {
    let tier = unique("free");
    let tiers = instance(&tier, 1);
    let tokens = Limit::new(unique("tokens"), Quota::per_minute(1000))
        .settle(Settle::from_header("x-tokens-used"));
    let request = LimitRequest::new("key_bea", &tier, 1).limit(&tokens, 1);
    let info = tiers.decide(&request).await.expect("storage").unwrap();
    tiers
        .settle("key_bea", &info, &tokens, Adjust::between(1, 1200))
        .await
        .expect("settled");
    for _ in 0..5 {
        assert_eq!(read(&tiers, &tier, &[&tokens]).await, [9, 0]);
    }
    let refused = tiers.decide(&request).await.expect("storage").unwrap_err();
    assert_eq!(refused.limit_name(), tokens.name());
    assert!(
        (12..=13).contains(&refused.retry_after_secs()),
        "{refused:?}"
    );
    // A refund gives the debt back, to a full bucket and no further.
    tiers
        .settle("key_bea", &info, &tokens, Adjust::Refund(100_000))
        .await
        .expect("settled");
    assert_eq!(read(&tiers, &tier, &[&tokens]).await, [9, 1000]);
}

fn window(limit: u32) -> Window {
    Window::new(limit, Duration::from_secs(60)).unwrap()
}

/// A user's windows, periods and slots share the user's slot; a global or
/// keyed one is in a slot of its own. Limits that may meet in two slots are
/// refused when the layer takes them, and tiers that would make a live
/// layer's meet are refused by the reload, never at request time; the
/// same limits per user are decided as one.
#[tokio::test]
async fn cluster_windows_and_slots_in_two_partitions_are_refused_at_build_and_reload()
 {
    let tier = unique("free");
    let tiers = instance(&tier, 0);
    let uploads = Limit::new(unique("uploads"), Concurrency::new(2).unwrap());
    let logins = Limit::new(unique("logins"), window(100)).global();
    let error = TierLimitLayer::new(tiers.clone())
        .limit(uploads.clone())
        .try_limit(logins.clone())
        .unwrap_err();
    assert_eq!(
        error,
        ConfigError::KindsInTwoPartitions {
            limits: [uploads.name().into(), logins.name().into()],
            partitions: ["per user", "global"],
            tier: tier.clone(),
            store: "redis",
        }
    );
    // What each such request would be answered.
    let both = LimitRequest::new("key_ana", &tier, 1)
        .limit(&uploads, 1)
        .limit(&logins, 1);
    assert!(
        matches!(
            tiers.decide(&both).await,
            Err(Error::Storage(StorageError::Unsupported(_)))
        ),
        "two slots decided"
    );

    // Per user, in the user's slot: accepted, and decided as one.
    let login = Limit::new(unique("login"), window(2));
    let app = Router::new().route("/login", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers.clone())
            .identifier_fn({
                let tier = tier.clone();
                move |_| Some(TierIdentity::new("key_ana", tier.clone()))
            })
            .limit(uploads.clone())
            .limit(login.clone()),
    );
    for _ in 0..2 {
        let r = get_as(&app, Some("key_ana"), "/login").await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
    }
    let r = get_as(&app, Some("key_ana"), "/login").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert!(r.body.contains(login.name()), "{r:?}");

    // A global window beside rates alone is fine; while such a layer
    // lives, the tier may not become a window.
    let global = TierLimitLayer::new(tiers.clone()).limit(logins.clone());
    let windowed = || Tiers::builder().tier(&tier, window(10)).build().unwrap();
    assert_eq!(
        tiers.try_reload(windowed()).unwrap_err(),
        ConfigError::KindsInTwoPartitions {
            limits: [tier.clone(), logins.name().into()],
            partitions: ["the tier, per user", "global"],
            tier: tier.clone(),
            store: "redis",
        }
    );
    assert_eq!(tiers.quota(&tier), Some(Quota::per_minute(10)));
    drop(global);
    tiers.try_reload(windowed()).unwrap();
    assert_eq!(tiers.quota(&tier), None, "a window now");
}

/// Through the layer on one instance, a slot of a user's concurrency
/// limit is held against another instance (seeded with another node), and
/// given back when the client goes away while the handler runs, and when
/// the response body is dropped unread: at once, not after the lease (30
/// s). Real time: the release is a call of its own; waited for 2 s at
/// most, about a millisecond here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_slot_is_given_back_when_its_request_is_dropped() {
    use tokio::sync::{Semaphore, mpsc};
    use tower::ServiceExt;

    let tier = unique("free");
    let (a, b) = (instance(&tier, 0), instance(&tier, 2));
    let uploads = Limit::new(unique("uploads"), Concurrency::new(1).unwrap());
    let gate = Arc::new(Semaphore::new(0));
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/upload",
            get({
                let gate = gate.clone();
                move || async move {
                    let _ = entered_tx.send(());
                    gate.acquire().await.unwrap().forget();
                    "uploaded"
                }
            }),
        )
        .layer(
            TierLimitLayer::new(a)
                .identifier_fn({
                    let tier = tier.clone();
                    move |_| Some(TierIdentity::new("key_ana", tier.clone()))
                })
                .limit(uploads.clone()),
        );
    let upload = || {
        let app = app.clone();
        tokio::spawn(async move {
            let request = http::Request::get("/upload")
                .body(axum::body::Body::empty())
                .unwrap();
            match app.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        })
    };
    let other = LimitRequest::new("key_ana", &tier, 1).limit(&uploads, 1);
    let peek = LimitRequest::new("key_ana", &tier, 0).limit(&uploads, 0);
    let given_back = async || {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            let info = b.decide(&peek).await.unwrap().unwrap();
            let free = info.limits().find(|l| l.name == uploads.name());
            if free.unwrap().remaining == 1 {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "not given back");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };

    // The client goes away while the handler runs.
    let running = upload();
    entered.recv().await.unwrap();
    assert!(b.decide(&other).await.unwrap().is_err(), "one in flight");
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
    given_back().await;

    // The answer comes, and its body is dropped unread.
    let answered = upload();
    entered.recv().await.unwrap();
    gate.add_permits(1);
    let response = answered.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        b.decide(&other).await.unwrap().is_err(),
        "held until the body ends"
    );
    drop(response);
    given_back().await;
}
