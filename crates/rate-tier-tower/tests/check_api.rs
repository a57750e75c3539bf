//! The direct API: `RateTier::{check, decide, peek, settle}` and
//! `CheckFuture`: a future polled after completion panics (rather than
//! hang), `check` reports what its policies
//! promise to report, and a fallback's local decisions are labelled
//! "fallback".
#![allow(clippy::unwrap_used, missing_docs)]

mod support;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::StatusCode;
use rate_tier_storage::StorageExt;
use support::http::Events;
use support::stores::{Remote, TimingOut};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    Error, FallbackStorage, Limit, LimitEvent, LimitReason, LimitRequest,
    MemoryStorage, Observer, Quota, RateTier, Settle, StorageError,
    observe::Checked, observe::Outcome, policy::OnStorageError,
    policy::OnUnknownTier, rules::Adjust,
};

fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
}

fn free10() -> RateTier {
    RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(10))
        .build()
}

// ---------------------------------------------------------------------------
// CheckFuture.

#[test]
fn an_in_memory_check_is_decided_at_the_first_poll() {
    let limiter = free10();
    let mut check = limiter.check("ana", "free", 1);
    let Poll::Ready(info) = poll_once(&mut check) else {
        panic!("an in-memory check waited");
    };
    assert_eq!(info.unwrap().unwrap().remaining, 9);
}

/// Polled again after it completed, it returned `Pending` with no
/// waker registered: whoever polled it waited for ever.
#[test]
#[should_panic(expected = "polled after completion")]
fn a_check_future_polled_after_completion_panics() {
    let limiter = free10();
    let mut check = limiter.check("ana", "free", 1);
    assert!(poll_once(&mut check).is_ready());
    let _ = poll_once(&mut check);
}

#[test]
#[should_panic(expected = "polled after completion")]
fn a_failed_check_future_polled_again_panics() {
    let limiter = free10();
    let mut check = limiter.check("ana", "free", 0);
    assert!(matches!(
        poll_once(&mut check),
        Poll::Ready(Err(Error::ZeroCost))
    ));
    let _ = poll_once(&mut check);
}

#[tokio::test]
#[should_panic(expected = "polled after completion")]
async fn a_remote_check_future_polled_after_completion_panics() {
    let clock = FakeClock::new();
    let limiter = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .storage(Arc::new(Remote::new(MemoryStorage::with_clock(clock))))
        .build();
    let mut check = limiter.check("ana", "free", 1);
    // The remote store yields once: pending, then ready.
    let mut polls = 0;
    let info = loop {
        polls += 1;
        if let Poll::Ready(info) = poll_once(&mut check) {
            break info;
        }
        assert!(polls < 100, "never ready");
    };
    assert_eq!(info.unwrap().unwrap().remaining, 9);
    let _ = poll_once(&mut check);
}

/// A store that always answers later is asked once per decision: never
/// first for a ready answer that it would build only to be dropped.
#[tokio::test]
async fn a_store_that_always_answers_later_is_asked_once_per_decision() {
    let clock = FakeClock::new();
    let remote = Remote::new(MemoryStorage::with_clock(clock.clone()));
    let limiter = RateTier::builder()
        .clock(clock)
        .tier("free", Quota::per_minute(10))
        .storage(Arc::new(remote.clone()))
        .build();
    let info = limiter.check("ana", "free", 1).await.unwrap().unwrap();
    assert_eq!((info.remaining, remote.asked()), (9, 1));
    let search = tower_rate_tier::Limit::new("search", Quota::per_minute(3));
    let request =
        tower_rate_tier::LimitRequest::new("ana", "free", 1).limit(&search, 1);
    let info = limiter.decide(&request).await.unwrap().unwrap();
    assert_eq!((info.remaining, remote.asked()), (2, 2));
}

// ---------------------------------------------------------------------------
// What `check` reports.

/// The docs of `OnUnknownTier::Allow` promise that every such
/// request is reported; `RateTier::check` did not report it.
#[tokio::test]
async fn check_reports_an_unknown_tier_allowed() {
    let events = Events::default();
    let limiter = RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(10))
        .on_unknown_tier(OnUnknownTier::Allow)
        .on_event(events.sink())
        .build();
    for _ in 0..20 {
        let info = limiter.check("eva", "gold", 1).await.unwrap().unwrap();
        assert_eq!(info.remaining, u64::MAX);
        assert_eq!(&*info.tier, "gold");
    }
    let events = events.all();
    assert_eq!(events.len(), 20, "{events:?}");
    assert!(events.iter().all(|e| matches!(
        e,
        LimitEvent::UnknownTier { user_id, tier, policy: OnUnknownTier::Allow }
            if user_id.as_str() == "eva" && tier == "gold"
    )));
}

#[tokio::test]
async fn check_reports_an_unknown_tier_given_the_default() {
    let events = Events::default();
    let limiter = RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(10))
        .default_tier("free")
        .on_event(events.sink())
        .build();
    let info = limiter.check("eva", "gold", 1).await.unwrap().unwrap();
    assert_eq!((&*info.tier, info.remaining), ("free", 9));
    assert_eq!(
        events.count(|e| matches!(
            e,
            LimitEvent::UnknownTier {
                policy: OnUnknownTier::UseDefault,
                ..
            }
        )),
        1
    );
}

/// `OnStorageError::Allow` promises the same: every request
/// passed without a check is reported.
#[tokio::test]
async fn check_reports_a_storage_error_allowed_or_denied() {
    for policy in [
        OnStorageError::Allow,
        OnStorageError::Deny(StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let events = Events::default();
        let store = Arc::new(TimingOut::new("failing"));
        let limiter = RateTier::builder()
            .clock(FakeClock::new())
            .tier("free", Quota::per_minute(10))
            .storage(store.clone())
            .on_storage_error(policy)
            .on_event(events.sink())
            .build();
        for _ in 0..3 {
            let result = limiter.check("ana", "free", 1).await;
            match policy {
                OnStorageError::Allow => {
                    assert_eq!(result.unwrap().unwrap().remaining, u64::MAX);
                }
                _ => assert!(
                    matches!(
                        result,
                        Err(Error::Storage(StorageError::Timeout(_)))
                    ),
                    "{result:?}"
                ),
            }
        }
        assert_eq!(store.calls(), 3);
        let reported = events.count(|e| {
            matches!(e, LimitEvent::StorageError { storage: "failing", policy: p, error }
                if *p == policy && error.contains("did not answer"))
        });
        assert_eq!(reported, 3, "{policy:?}: {:?}", events.all());
    }
}

#[tokio::test]
async fn check_reports_refusals_and_costs_above_the_burst() {
    let events = Events::default();
    let limiter = RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(10))
        .on_event(events.sink())
        .build();
    limiter.check("ana", "free", 10).await.unwrap().unwrap();
    limiter.check("ana", "free", 1).await.unwrap().unwrap_err();
    limiter.check("ana", "free", 11).await.unwrap().unwrap_err();
    let events = events.all();
    assert!(
        matches!(
            &events[..],
            [
                LimitEvent::Limited {
                    tier: "free",
                    limit: "free",
                    cost: 1,
                    ..
                },
                LimitEvent::CostExceedsBurst {
                    cost: 11,
                    burst: 10,
                    ..
                },
            ]
        ),
        "{events:?}"
    );
}

/// A fallback whose primary always times out: open after its first
/// failure, it then decides locally, at once.
fn primary_down(clock: &FakeClock) -> FallbackStorage {
    FallbackStorage::builder(Arc::new(TimingOut::new("redis")))
        .clock(clock.clone())
        .failure_threshold(1)
        .cool_down(Duration::from_secs(60), Duration::from_secs(60))
        .build()
}

/// A store that answers at once without being memory (a fallback whose
/// primary is down) is decided on the tier's own path too: its passes tell
/// the listeners nothing, its refusal once.
#[tokio::test]
async fn a_ready_stores_refusal_is_reported_once_and_its_passes_never() {
    let clock = FakeClock::new();
    let fallback = primary_down(&clock);
    let events = Events::default();
    let limiter = RateTier::builder()
        .clock(clock)
        .tier("free", Quota::per_minute(10))
        .storage(Arc::new(fallback))
        .on_event(events.sink())
        .build();
    let mut passed = 0;
    while limiter.check("ana", "free", 1).await.unwrap().is_ok() {
        passed += 1;
        assert!(passed <= 10, "more passes than the quota");
    }
    assert!(passed > 1, "{passed}");
    let limited: Vec<LimitEvent> = events
        .all()
        .into_iter()
        .filter(|event| matches!(event, LimitEvent::Limited { .. }))
        .collect();
    assert!(
        matches!(
            &limited[..],
            [LimitEvent::Limited {
                tier: "free",
                cost: 1,
                ..
            }]
        ),
        "{:?}",
        events.all()
    );
}

// ---------------------------------------------------------------------------
// Who decided.

#[derive(Clone, Default)]
struct Storages(Arc<Mutex<Vec<(&'static str, Outcome)>>>);

impl Observer for Storages {
    fn checked(&self, check: &Checked) {
        self.0.lock().unwrap().push((check.storage, check.outcome));
    }
}

/// A fallback's local decisions are labelled `fallback` for the
/// observers, not with the primary's name (`storage="redis"` at memory
/// speed would mislead).
#[tokio::test]
async fn a_fallbacks_local_decisions_are_labelled_fallback() {
    let clock = FakeClock::new();
    let fallback = primary_down(&clock);
    let seen = Storages::default();
    let limiter = RateTier::builder()
        .clock(clock)
        .tier("free", Quota::per_minute(2))
        .storage(Arc::new(fallback.clone()))
        .observe(seen.clone())
        .build();
    for _ in 0..3 {
        let _ = limiter.check("ana", "free", 1).await.unwrap();
    }
    assert_eq!(
        *seen.0.lock().unwrap(),
        [
            ("fallback", Outcome::Allowed),
            ("fallback", Outcome::Allowed),
            ("fallback", Outcome::Limited),
        ]
    );
    // The store says so itself.
    let name = tower_rate_tier::storage::LimitName::new("free").unwrap();
    let checks = [tower_rate_tier::storage::BucketCheck::new(
        &name,
        "bea",
        Quota::per_minute(2),
        1,
    )
    .unwrap()];
    let mut out = [tower_rate_tier::storage::Decision::default()];
    let decided = fallback.check(&checks, &mut out).await.unwrap();
    assert_eq!(decided.by, "fallback");
    // An in-memory limiter's decisions are "memory"'s; no store, "none".
    let seen = Storages::default();
    let memory = RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(2))
        .observe(seen.clone())
        .build();
    memory.check("ana", "free", 1).await.unwrap().unwrap();
    memory.check("ana", "free", 3).await.unwrap().unwrap_err();
    assert_eq!(
        *seen.0.lock().unwrap(),
        [
            ("memory", Outcome::Allowed),
            ("none", Outcome::CostExceedsBurst)
        ]
    );
}

// ---------------------------------------------------------------------------
// decide, peek, settle.

#[tokio::test]
async fn decide_is_all_or_nothing_over_the_plan_and_its_limits() {
    let limiter = free10();
    let search = Limit::new("search", Quota::per_minute(3));
    let per_ip = Limit::new("ip", Quota::per_minute(4));
    let request = LimitRequest::new("ana", "free", 1)
        .limit(&search, 1)
        .limit_keyed(&per_ip, "203.0.113.7", 1);
    for k in (0..3).rev() {
        let info = limiter.decide(&request).await.unwrap().unwrap();
        assert_eq!((info.limit_name(), info.remaining), ("search", k));
        let names: Vec<&str> = info.limits().map(|l| l.name).collect();
        assert_eq!(names, ["free", "search", "ip"]);
    }
    let refused = limiter.decide(&request).await.unwrap().unwrap_err();
    assert_eq!(refused.limit_name(), "search");
    assert!(!refused.is_tier_limit());
    assert_eq!(refused.reason(), LimitReason::RateLimited);
    assert_eq!(refused.retry_after_secs(), 20);
    assert_eq!(refused.limit(), 3);
    // Nothing was charged for the refusal: the tier has 7, the address 1.
    assert_eq!(limiter.peek("ana", "free").await.unwrap().remaining, 7);
    let bea = LimitRequest::new("bea", "free", 1).limit_keyed(
        &per_ip,
        "203.0.113.7",
        1,
    );
    let info = limiter.decide(&bea).await.unwrap().unwrap();
    assert_eq!((info.limit_name(), info.remaining), ("ip", 0));
    let refused = limiter.decide(&bea).await.unwrap().unwrap_err();
    assert_eq!(refused.limit_name(), "ip");
    assert_eq!(limiter.peek("bea", "free").await.unwrap().remaining, 9);
}

#[tokio::test]
async fn a_shadow_request_is_decided_and_passes() {
    let events = Events::default();
    let limiter = RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(2))
        .on_event(events.sink())
        .build();
    let request = LimitRequest::new("ana", "free", 1).shadow();
    for _ in 0..5 {
        limiter.decide(&request).await.unwrap().unwrap();
    }
    assert_eq!(
        events.count(|e| matches!(
            e,
            LimitEvent::ShadowLimited { limit: "free", .. }
        )),
        3
    );
    // Enforced again: the two that passed alone were charged.
    let refused = limiter.check("ana", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(refused.retry_after_secs(), 30);
}

#[tokio::test]
async fn settle_charges_a_debt_or_refunds_never_below_a_full_bucket() {
    let clock = FakeClock::new();
    let limiter = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .build();
    let tokens = Limit::new("tokens", Quota::per_minute(1000))
        .settle(Settle::from_header("x-tokens-used"));
    let request = LimitRequest::new("ana", "free", 1).limit(&tokens, 1);
    let info = limiter.decide(&request).await.unwrap().unwrap();
    limiter
        .settle("ana", &info, &tokens, Adjust::between(1, 1200))
        .await
        .unwrap();
    let refused = limiter.decide(&request).await.unwrap().unwrap_err();
    assert_eq!(refused.limit_name(), "tokens");
    assert_eq!(refused.retry_after(), Duration::from_millis(12_060));
    // A refund gives back at most what was spent.
    limiter
        .settle("ana", &info, &tokens, Adjust::Refund(5000))
        .await
        .unwrap();
    let peek = LimitRequest::new("ana", "free", 0).limit(&tokens, 0);
    let info = limiter.decide(&peek).await.unwrap().unwrap();
    assert_eq!(info.limits().nth(1).unwrap().remaining, 1000);
    let all = LimitRequest::new("ana", "free", 1).limit(&tokens, 1000);
    limiter.decide(&all).await.unwrap().unwrap();
    let more = LimitRequest::new("ana", "free", 1).limit(&tokens, 1);
    assert_eq!(
        limiter
            .decide(&more)
            .await
            .unwrap()
            .unwrap_err()
            .limit_name(),
        "tokens"
    );
}

/// The same scenario as the Redis and Cluster stores' tests, in memory.
#[tokio::test]
async fn a_refusal_in_any_position_charges_nothing_in_memory() {
    support::scenarios::a_refusal_in_any_position_charges_nothing(
        async |tier| {
            RateTier::builder()
                .tier(tier, Quota::per_minute(10))
                .build()
        },
        "key_ana",
    )
    .await;
}

#[tokio::test]
async fn a_huge_settled_debt_is_waited_for_whole() {
    // Regression: 1,000,000 tokens on 1000 per minute must wait about 1000
    // minutes, not 61 s (a debt capped at about two bursts). A settled
    // limit carries its debt whole.
    let clock = FakeClock::new();
    let limiter = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10_000))
        .build();
    let tokens = Limit::new("tokens", Quota::per_minute(1000))
        .settle(Settle::from_header("x-tokens-used"));
    let request = LimitRequest::new("ana", "free", 1).limit(&tokens, 1);
    let info = limiter.decide(&request).await.unwrap().unwrap();
    limiter
        .settle("ana", &info, &tokens, Adjust::between(1, 1_000_000))
        .await
        .unwrap();
    let refused = limiter.decide(&request).await.unwrap().unwrap_err();
    assert_eq!(refused.limit_name(), "tokens");
    let minutes = refused.retry_after_secs() / 60;
    assert!((998..=1000).contains(&minutes), "{minutes} min");
    // Every check on the way keeps the debt (none caps it away).
    clock.advance(Duration::from_secs(500 * 60));
    let later = limiter.decide(&request).await.unwrap().unwrap_err();
    assert!((498..=500).contains(&(later.retry_after_secs() / 60)));
    // A bound of its own forgives beyond it.
    let bounded = Limit::new("bounded", Quota::per_minute(1000)).settle(
        Settle::from_header("x-tokens-used")
            .max_debt(Duration::from_secs(3600)),
    );
    let request = LimitRequest::new("bea", "free", 1).limit(&bounded, 1);
    let info = limiter.decide(&request).await.unwrap().unwrap();
    limiter
        .settle("bea", &info, &bounded, Adjust::between(1, 1_000_000))
        .await
        .unwrap();
    let refused = limiter.decide(&request).await.unwrap().unwrap_err();
    // At the ceiling (a window and an hour), one token more to wait for.
    assert_eq!(refused.retry_after_secs(), 3601);
}
