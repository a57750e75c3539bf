//! The limiter on PostgreSQL: "two lines of code" to share limits (exactly,
//! under 300 concurrent checks over two instances), several
//! limits as one decision (a refusal in any position charges nothing), and
//! a settled debt carried whole, through the public API.
//!
//! Run with `cargo xtask test`, which starts a throwaway PostgreSQL and sets
//! `TRT_POSTGRES_URL` (without it these tests fail). Every test uses names
//! of its own in one table.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::sync::Arc;

use rate_tier_test_support::{TEST_TIMEOUT, env, unique};
use tower_rate_tier::{
    Limit, LimitRequest, PostgresStorage, Quota, RateTier, Settle,
    rules::Adjust,
};

/// The store, its table migrated (once is enough; again changes nothing).
async fn store() -> PostgresStorage {
    let store = PostgresStorage::builder(&env::postgres_url())
        .unwrap()
        .timeout(TEST_TIMEOUT)
        .build()
        .unwrap();
    store.migrate().await.unwrap();
    store
}

/// One instance: tier `tier` (10/min) on its own pool.
async fn instance(tier: &str) -> RateTier {
    RateTier::builder()
        .tier(tier, Quota::per_minute(10))
        .storage(Arc::new(store().await))
        .build()
}

#[tokio::test]
async fn two_instances_share_one_limit() {
    let tier = unique("free");
    let (a, b) = (instance(&tier).await, instance(&tier).await);
    let mut passed = 0;
    for i in 0..15 {
        let limiter = if i % 2 == 0 { &a } else { &b };
        passed +=
            usize::from(limiter.check("ana", &tier, 1).await.unwrap().is_ok());
    }
    assert_eq!(passed, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_under_300_concurrent_checks_pass_exactly_the_limit() {
    let tier = unique("free");
    let instances = [
        Arc::new(instance(&tier).await),
        Arc::new(instance(&tier).await),
    ];
    let tasks: Vec<_> = (0..300)
        .map(|i| {
            let (limiter, tier) = (instances[i % 2].clone(), tier.clone());
            tokio::spawn(async move {
                limiter.check("ana", &tier, 1).await.unwrap().is_ok()
            })
        })
        .collect();
    let mut passed = 0;
    for task in tasks {
        passed += usize::from(task.await.unwrap());
    }
    assert_eq!(passed, 10);
}

#[tokio::test]
async fn a_refusal_in_any_position_charges_nothing_on_postgres() {
    support::scenarios::a_refusal_in_any_position_charges_nothing(
        async |tier| instance(tier).await,
        "key_ana",
    )
    .await;
}

#[tokio::test]
async fn a_settled_debt_is_waited_for_whole() {
    let tier = unique("free");
    let tiers = instance(&tier).await;
    let tokens = Limit::new(unique("tokens"), Quota::per_minute(1000))
        .settle(Settle::from_header("x-tokens-used"));
    let request = LimitRequest::new("ana", &tier, 1).limit(&tokens, 1);
    let info = tiers.decide(&request).await.unwrap().unwrap();
    // Settled to 1200 tokens: 1199 more, 72 s of debt.
    tiers
        .settle("ana", &info, &tokens, Adjust::Charge(1199))
        .await
        .unwrap();
    let next = tiers.decide(&request).await.unwrap().unwrap_err();
    assert_eq!(next.limit_name(), tokens.name());
    assert!(
        (11..=13).contains(&next.retry_after_secs()),
        "{}",
        next.retry_after_secs()
    );
}

/// Real time, as PostgreSQL's clock runs: a 400 ms lease, held for 1.2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_held_past_its_lease_is_renewed_and_given_back_when_dropped() {
    let lease = std::time::Duration::from_millis(400);
    let store = PostgresStorage::builder(&env::postgres_url())
        .unwrap()
        .timeout(TEST_TIMEOUT)
        .lease(lease)
        .unwrap()
        .build()
        .unwrap();
    store.migrate().await.unwrap();
    let tier = unique("free");
    let limiter = RateTier::builder()
        .tier(&tier, Quota::per_minute(100))
        .storage(Arc::new(store))
        .build();
    let uploads = Limit::new(
        unique("uploads"),
        tower_rate_tier::Concurrency::new(1).unwrap(),
    );
    let request = LimitRequest::new("ana", &tier, 1).limit(&uploads, 1);
    let held = limiter.decide(&request).await.unwrap().unwrap();
    // Three leases later, still held: the limiter renewed it.
    tokio::time::sleep(3 * lease).await;
    assert!(limiter.decide(&request).await.unwrap().is_err());
    // Dropped: given back (by a task of its own), long before a lease.
    drop(held);
    let deadline = tokio::time::Instant::now() + lease / 2;
    loop {
        if let Ok(info) = limiter.decide(&request).await.unwrap() {
            drop(info);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not given back");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
