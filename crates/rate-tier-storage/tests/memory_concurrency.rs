//! `MemoryStorage`'s concurrency limits: never more in flight than the
//! limit, under threads; a slot given back is taken again; a decision
//! refused by another limit takes no slot; and the stores that do not
//! decide them say so.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Barrier};
use std::thread;

use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{
    BucketCheck, Concurrency, Decision, LimitName, MemoryStorage, Quota,
    RuleKind, Storage, StorageError,
};

const START_US: u64 = 1_790_947_094_000_000;

fn store() -> MemoryStorage {
    MemoryStorage::with_clock(FakeClock::at_us(START_US))
}

#[test]
fn never_more_in_flight_than_the_limit_under_threads() {
    let store = store();
    let uploads = LimitName::of_limit("uploads").unwrap();
    let barrier = Arc::new(Barrier::new(64));
    let taken: usize = thread::scope(|scope| {
        let handles: Vec<_> = (0..64)
            .map(|_| {
                let (store, uploads, barrier) = (&store, &uploads, &barrier);
                scope.spawn(move || {
                    let slot = [BucketCheck::of_rule(
                        uploads,
                        "ana",
                        Concurrency::new(5).unwrap().into(),
                        1,
                    )
                    .unwrap()];
                    let mut out = [Decision::default()];
                    barrier.wait();
                    (0..10)
                        .filter(|_| {
                            store
                                .check_sync(&slot, &mut out)
                                .unwrap()
                                .verdict
                                .allowed
                        })
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(taken, 5);
    // Three given back: exactly three more pass, with what is left said.
    let slot = |cost| {
        BucketCheck::of_rule(
            &uploads,
            "ana",
            Concurrency::new(5).unwrap().into(),
            cost,
        )
        .unwrap()
    };
    store.release_local(&[slot(3)]).unwrap().unwrap();
    let mut out = [Decision::default()];
    let decided = store.check_sync(&[slot(2)], &mut out).unwrap();
    assert!(decided.verdict.allowed);
    assert_eq!(out[0].remaining, 1);
    assert!(
        store
            .check_sync(&[slot(1)], &mut out)
            .unwrap()
            .verdict
            .allowed
    );
    let refused = store.check_sync(&[slot(1)], &mut out).unwrap();
    assert!(!refused.verdict.allowed);
    assert_eq!(refused.verdict.retry_after_us, gcra_core::RETRY_HINT_US);
    // Everything given back: the bucket is forgotten.
    store.release_local(&[slot(5)]).unwrap().unwrap();
    assert_eq!(store.len(), 0);
    // A release of more than is held stops at 0.
    store.release_local(&[slot(2)]).unwrap().unwrap();
    assert!(
        store
            .check_sync(&[slot(5)], &mut out)
            .unwrap()
            .verdict
            .allowed
    );
}

#[test]
fn a_decision_refused_by_a_rate_takes_no_slot() {
    let store = store();
    let (plan, uploads) = (
        LimitName::new("free").unwrap(),
        LimitName::of_limit("uploads").unwrap(),
    );
    let checks = [
        BucketCheck::new(&plan, "ana", Quota::per_minute(1), 1).unwrap(),
        BucketCheck::of_rule(
            &uploads,
            "ana",
            Concurrency::new(1).unwrap().into(),
            1,
        )
        .unwrap(),
    ];
    let mut out = [Decision::default(); 2];
    assert!(store.check_sync(&checks, &mut out).unwrap().verdict.allowed);
    // Given back; the plan's one is spent.
    store.release_local(&checks[1..]).unwrap().unwrap();
    let refused = store.check_sync(&checks, &mut out).unwrap();
    assert_eq!(refused.verdict.refused_by, Some(0));
    // The slot is free: the refusal took none.
    assert!(out[1].allowed && out[1].remaining == 1, "{out:?}");
    assert!(
        store
            .check_sync(&checks[1..], &mut [Decision::default()])
            .unwrap()
            .verdict
            .allowed
    );
}

#[test]
fn only_slots_are_released_and_the_fallback_claims_its_primarys_kinds() {
    let store = store();
    let free = LimitName::new("free").unwrap();
    let rate = BucketCheck::new(&free, "ana", Quota::per_minute(1), 1).unwrap();
    assert!(matches!(
        store.release_local(&[rate]),
        Some(Err(StorageError::Unsupported(_)))
    ));
    assert!(store.supports(RuleKind::Concurrency));
    let fallback =
        rate_tier_storage::FallbackStorage::builder(Arc::new(store)).build();
    assert!(fallback.supports(RuleKind::Concurrency));
    assert!(fallback.supports(RuleKind::Window));
}

#[test]
fn a_full_store_never_forgets_a_count_in_flight() {
    let store = MemoryStorage::builder()
        .clock(FakeClock::at_us(START_US))
        .capacity(2)
        .build();
    let uploads = LimitName::of_limit("uploads").unwrap();
    let login = LimitName::of_limit("login").unwrap();
    let users: Vec<String> = (0..2).map(|i| format!("user-{i}")).collect();
    fn slot<'a>(uploads: &'a LimitName, user: &'a str) -> [BucketCheck<'a>; 1] {
        [BucketCheck::of_rule(
            uploads,
            user,
            Concurrency::new(1).unwrap().into(),
            1,
        )
        .unwrap()]
    }
    let mut out = [Decision::default()];
    for user in &users {
        assert!(
            store
                .check_sync(&slot(&uploads, user), &mut out)
                .unwrap()
                .verdict
                .allowed
        );
    }
    // New windows into the full store: none of the counts is evicted.
    let window =
        rate_tier_storage::Window::new(5, std::time::Duration::from_secs(60))
            .unwrap();
    for k in 0..5 {
        let user = format!("new-{k}");
        let check =
            [BucketCheck::of_rule(&login, &user, window.into(), 1).unwrap()];
        assert!(store.check_sync(&check, &mut out).unwrap().verdict.allowed);
    }
    for user in &users {
        let refused =
            store.check_sync(&slot(&uploads, user), &mut out).unwrap();
        assert!(!refused.verdict.allowed, "{user}'s slot was forgotten");
    }
    // The two counts beside the capacity's worth of windows.
    assert!(store.len() <= 2 + 2, "{}", store.len());
}
