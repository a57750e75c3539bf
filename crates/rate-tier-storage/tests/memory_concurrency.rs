//! `MemoryStorage`'s concurrency limits: never more in flight than the
//! limit, under threads; a slot given back is taken again; a decision
//! refused by another limit takes no slot; and the stores that do not
//! decide them say so.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};
use std::thread;

use rate_tier_storage::StorageExt;
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{
    BucketCheck, Concurrency, Decision, LimitName, MemoryStorage, Quota,
    RuleKind, StorageError,
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
    store.release(&[slot(3)]).ready().unwrap().unwrap();
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
    // Everything given back: the count at 0 is dead (kept for the next
    // take, no insert per request), and a sweep forgets it.
    store.release(&[slot(5)]).ready().unwrap().unwrap();
    assert_eq!(store.len(), 1);
    store.sweep();
    assert_eq!(store.len(), 0);
    // A release of more than is held stops at 0.
    store.release(&[slot(2)]).ready().unwrap().unwrap();
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
    // Given back; the tier's one is spent.
    store.release(&checks[1..]).ready().unwrap().unwrap();
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
        store.release(&[rate]).ready(),
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

fn slot_of<'a>(
    uploads: &'a LimitName,
    user: &'a str,
    limit: u32,
) -> BucketCheck<'a> {
    BucketCheck::of_rule(
        uploads,
        user,
        Concurrency::new(limit).unwrap().into(),
        1,
    )
    .unwrap()
}

/// How many of `tries` takes pass now, each kept.
fn takes(
    store: &MemoryStorage,
    check: &BucketCheck<'_>,
    tries: usize,
) -> usize {
    let mut out = [Decision::default()];
    (0..tries)
        .filter(|_| {
            store
                .check_sync(std::slice::from_ref(check), &mut out)
                .unwrap()
                .verdict
                .allowed
        })
        .count()
}

#[test]
fn takes_and_releases_racing_on_threads_never_exceed_the_limit_nor_go_below_zero()
 {
    const LIMIT: u32 = 3;
    let store = store();
    let uploads = LimitName::of_limit("uploads").unwrap();
    // Requests running, as the threads see them: a pass over the limit
    // would show here as more than LIMIT at once.
    let running = std::sync::atomic::AtomicU32::new(0);
    let most = std::sync::atomic::AtomicU32::new(0);
    let barrier = Barrier::new(8);
    thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                let check = slot_of(&uploads, "ana", LIMIT);
                let mut out = [Decision::default()];
                barrier.wait();
                for _ in 0..2_000 {
                    let taken = store
                        .check_sync(std::slice::from_ref(&check), &mut out)
                        .unwrap()
                        .verdict
                        .allowed;
                    if taken {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        running.fetch_sub(1, Ordering::SeqCst);
                        store.release(&[check]).ready().unwrap().unwrap();
                    }
                }
            });
        }
    });
    assert!(most.load(Ordering::SeqCst) <= LIMIT, "{most:?}");
    assert!(most.load(Ordering::SeqCst) >= 1);
    // Every slot given back once: exactly the limit passes, no more (a
    // count gone below 0 would wrap or let more in), no less (a lost
    // release would keep one taken).
    assert_eq!(takes(&store, &slot_of(&uploads, "ana", LIMIT), 10), 3);
}

#[test]
fn a_release_of_a_slot_never_taken_changes_nothing() {
    let store = store();
    let uploads = LimitName::of_limit("uploads").unwrap();
    // No bucket yet: nothing is made.
    store
        .release(&[slot_of(&uploads, "ana", 2)])
        .ready()
        .unwrap()
        .unwrap();
    assert_eq!(store.len(), 0);
    assert_eq!(takes(&store, &slot_of(&uploads, "ana", 2), 5), 2);
    // Both given back, then one more release: the count stays at 0, so
    // the limit is still 2, not 3.
    for _ in 0..3 {
        store
            .release(&[slot_of(&uploads, "ana", 2)])
            .ready()
            .unwrap()
            .unwrap();
    }
    assert_eq!(takes(&store, &slot_of(&uploads, "ana", 2), 5), 2);
    // A refused take took nothing: one release frees exactly one.
    store
        .release(&[slot_of(&uploads, "ana", 2)])
        .ready()
        .unwrap()
        .unwrap();
    assert_eq!(takes(&store, &slot_of(&uploads, "ana", 2), 5), 1);
}

#[test]
fn a_limit_reloaded_to_another_kind_and_back_reads_each_kind_fresh() {
    let store = store();
    let uploads = LimitName::of_limit("uploads").unwrap();
    assert_eq!(takes(&store, &slot_of(&uploads, "ana", 2), 2), 2);
    // The same limit reloaded as a rate, then a window: neither reads the
    // count as its own (each passes as fresh).
    let mut out = [Decision::default()];
    let rate =
        BucketCheck::of_rule(&uploads, "ana", Quota::per_minute(3).into(), 1)
            .unwrap();
    assert!(store.check_sync(&[rate], &mut out).unwrap().verdict.allowed);
    assert_eq!(out[0].remaining, 2, "the count read as a rate's TAT");
    let window =
        rate_tier_storage::Window::new(4, std::time::Duration::from_secs(60))
            .unwrap();
    let window =
        BucketCheck::of_rule(&uploads, "ana", window.into(), 1).unwrap();
    assert!(
        store
            .check_sync(&[window], &mut out)
            .unwrap()
            .verdict
            .allowed
    );
    assert_eq!(out[0].remaining, 3, "the count read as a window's log");
    // Back to a concurrency limit: the two requests still running hold
    // their slots (never more in flight than the limit), and give them
    // back.
    assert_eq!(takes(&store, &slot_of(&uploads, "ana", 2), 1), 0);
    store
        .release(&[slot_of(&uploads, "ana", 2)])
        .ready()
        .unwrap()
        .unwrap();
    assert_eq!(takes(&store, &slot_of(&uploads, "ana", 2), 2), 1);
}

#[test]
fn a_slot_in_a_joint_decision_is_taken_only_if_the_whole_decision_passes() {
    // A window refuses: the slot of the same decision is not taken.
    let store = store();
    let (uploads, login) = (
        LimitName::of_limit("uploads").unwrap(),
        LimitName::of_limit("login").unwrap(),
    );
    let window =
        rate_tier_storage::Window::new(1, std::time::Duration::from_secs(60))
            .unwrap();
    let checks = [
        BucketCheck::of_rule(&login, "ana", window.into(), 1).unwrap(),
        slot_of(&uploads, "ana", 1),
    ];
    let mut out = [Decision::default(); 2];
    assert!(store.check_sync(&checks, &mut out).unwrap().verdict.allowed);
    assert_eq!(out[1].remaining, 0);
    store.release(&checks[1..]).ready().unwrap().unwrap();
    let refused = store.check_sync(&checks, &mut out).unwrap();
    assert_eq!(refused.verdict.refused_by, Some(0));
    assert_eq!((out[1].allowed, out[1].remaining), (true, 1), "{out:?}");
    assert_eq!(takes(&store, &slot_of(&uploads, "ana", 1), 2), 1);
}

#[test]
fn joint_decisions_and_takes_alone_racing_on_one_slot_never_exceed_it() {
    // Half the threads take the slot with a rate (under the windows' map
    // and the count's shard lock), half alone (by compare-and-swap).
    let store = store();
    let (plan, uploads) = (
        LimitName::new("free").unwrap(),
        LimitName::of_limit("uploads").unwrap(),
    );
    let running = std::sync::atomic::AtomicU32::new(0);
    let most = std::sync::atomic::AtomicU32::new(0);
    let barrier = Barrier::new(6);
    thread::scope(|scope| {
        for t in 0..6 {
            let (store, plan, uploads) = (&store, &plan, &uploads);
            let (running, most, barrier) = (&running, &most, &barrier);
            scope.spawn(move || {
                let rate = Quota::per_second(1_000_000).allow_burst(1_000_000);
                let checks = [
                    BucketCheck::new(plan, "ana", rate, 1).unwrap(),
                    slot_of(uploads, "ana", 2),
                ];
                let mine = if t % 2 == 0 {
                    &checks[..]
                } else {
                    &checks[1..]
                };
                let mut out = [Decision::default(); 2];
                barrier.wait();
                for _ in 0..1_000 {
                    let out = &mut out[..mine.len()];
                    if store.check_sync(mine, out).unwrap().verdict.allowed {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        running.fetch_sub(1, Ordering::SeqCst);
                        store.release(&checks[1..]).ready().unwrap().unwrap();
                    }
                }
            });
        }
    });
    assert!(most.load(Ordering::SeqCst) <= 2, "{most:?}");
    assert_eq!(takes(&store, &slot_of(&uploads, "ana", 2), 5), 2);
}

#[test]
fn a_slot_taken_in_a_joint_decision_is_held_for_every_later_one() {
    let store = store();
    let (plan, uploads) = (
        LimitName::new("free").unwrap(),
        LimitName::of_limit("uploads").unwrap(),
    );
    let joint = [
        BucketCheck::new(&plan, "ana", Quota::per_minute(100), 1).unwrap(),
        slot_of(&uploads, "ana", 2),
    ];
    let mut out = [Decision::default(); 2];
    // The first slot, from no count at all, then the second, each held.
    assert!(store.check_sync(&joint, &mut out).unwrap().verdict.allowed);
    assert_eq!(out[1].remaining, 1);
    assert!(store.check_sync(&joint, &mut out).unwrap().verdict.allowed);
    assert_eq!(out[1].remaining, 0);
    // Held for a take alone, and for the next joint decision.
    assert_eq!(takes(&store, &slot_of(&uploads, "ana", 2), 1), 0);
    store.release(&joint[1..]).ready().unwrap().unwrap();
    assert_eq!(takes(&store, &slot_of(&uploads, "ana", 2), 1), 1);
    let refused = store.check_sync(&joint, &mut out).unwrap();
    assert_eq!(refused.verdict.refused_by, Some(1));
    assert_eq!((out[1].allowed, out[1].remaining), (false, 0));
}
