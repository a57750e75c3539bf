//! `MemoryStorage` on its own: atomicity under threads (one bucket, and the
//! buckets of one decision), peek, settle, shadow limits, bucket identity,
//! sweeping, the capacity bound and eviction, refused inputs; and random
//! decisions against a model of gcra-core over a map.
//!
//! Plain threads and a fake clock: no runtime while a store is built (so no
//! background sweeper), no sleep. Tests that could hang (a deadlock, a
//! livelock) run under a watchdog that fails them instead.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use rate_tier_storage::StorageExt;
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{
    Adjust, BucketCheck, BucketSettle, CheckError, Decided, Decision,
    LimitName, MemoryStorage, Quota, RateCharge, Storage, StorageError,
    StorageEvent,
};

const START_US: u64 = 1_790_947_094_000_000;
const SECOND: u64 = 1_000_000;

// ---------------------------------------------------------------------------
// Helpers

/// 10 per minute: T = 6 s, tau = 60 s.
fn free() -> Quota {
    Quota::per_minute(10)
}

fn limit(name: &'static str) -> LimitName {
    LimitName::new(name).unwrap()
}

fn store_at_start() -> (FakeClock, MemoryStorage) {
    let clock = FakeClock::at_us(START_US);
    (clock.clone(), MemoryStorage::with_clock(clock))
}

/// One decision over `checks`: the store's answer and each bucket's part.
fn decide(
    store: &MemoryStorage,
    checks: &[BucketCheck<'_>],
) -> (Decided, Vec<Decision>) {
    let mut out = vec![Decision::default(); checks.len()];
    let decided = store.check_sync(checks, &mut out).unwrap();
    (decided, out)
}

/// One enforced check of `cost` on one bucket.
fn check(
    store: &MemoryStorage,
    name: &LimitName,
    user: &str,
    quota: Quota,
    cost: u32,
) -> Decision {
    let (decided, out) =
        decide(store, &[BucketCheck::new(name, user, quota, cost).unwrap()]);
    assert_eq!(decided.verdict.allowed, out[0].allowed);
    out[0]
}

fn allowed(
    store: &MemoryStorage,
    name: &LimitName,
    user: &str,
    quota: Quota,
    cost: u32,
) -> bool {
    check(store, name, user, quota, cost).allowed
}

/// A read of one bucket: never a write, refused exactly while the bucket
/// is in debt (more than tau ahead).
fn peek(
    store: &MemoryStorage,
    name: &LimitName,
    user: &str,
    quota: Quota,
) -> Decision {
    let (decided, out) = decide(store, &[BucketCheck::peek(name, user, quota)]);
    let in_debt = out[0].reset_after_us > quota.burst_offset_us();
    assert_eq!(decided.verdict.allowed, !in_debt, "{:?}", out[0]);
    assert_eq!(out[0].allowed, !in_debt);
    assert_eq!(out[0].store, None);
    out[0]
}

/// Requests of cost 1 the bucket has left, as a peek reads it.
fn remaining(
    store: &MemoryStorage,
    name: &LimitName,
    user: &str,
    quota: Quota,
) -> u64 {
    peek(store, name, user, quota).remaining
}

fn settle(
    store: &MemoryStorage,
    name: &LimitName,
    user: &str,
    quota: Quota,
    adjust: Adjust,
) {
    let bucket = BucketCheck::peek(name, user, quota);
    store.settle_sync(&[bucket.settle(adjust)]).unwrap();
}

/// Runs `f` on a thread of its own and fails the test if it has not
/// finished within `limit`: a deadlock or a livelock fails, never hangs.
fn finishes_within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done, finished) = mpsc::channel();
    let handle = thread::spawn(move || {
        let value = f();
        let _ = done.send(());
        value
    });
    match finished.recv_timeout(limit) {
        Ok(()) | Err(RecvTimeoutError::Disconnected) => handle.join().unwrap(),
        Err(RecvTimeoutError::Timeout) => {
            panic!(
                "{what}: still running after {limit:?} (deadlock or livelock)"
            )
        }
    }
}

/// Polls `future` to completion on a runtime made for it: the stores here
/// are built outside any runtime, so no background sweeper runs.
fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}

/// `threads` threads, released together, each making `per_thread` checks of
/// `cost` on one bucket: how many were allowed.
fn hammer(
    quota: Quota,
    cost: u32,
    threads: usize,
    per_thread: usize,
) -> (usize, MemoryStorage) {
    let (_, store) = store_at_start();
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let store = store.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                let plan = limit("free");
                barrier.wait();
                (0..per_thread)
                    .filter(|_| allowed(&store, &plan, "ana", quota, cost))
                    .count()
            })
        })
        .collect();
    let total = handles.into_iter().map(|h| h.join().unwrap()).sum();
    (total, store)
}

// ---------------------------------------------------------------------------
// One bucket under threads

#[test]
fn threads_on_one_bucket_get_exactly_the_burst() {
    let (n, store) = hammer(free(), 1, 8, 250);
    assert_eq!(n, 10);
    assert_eq!(store.len(), 1);
}

#[test]
fn threads_on_one_bucket_get_exactly_a_large_burst() {
    let (n, _) = hammer(Quota::per_minute(1000), 1, 8, 500);
    assert_eq!(n, 1000);
}

#[test]
fn threads_with_cost_3_on_a_burst_of_10_get_exactly_3() {
    let (n, _) = hammer(free(), 3, 8, 100);
    assert_eq!(n, 3);
}

#[test]
fn threads_on_many_new_buckets_lose_no_update() {
    // Every thread races on the same 50 fresh buckets: the insert path
    // (write lock, look again) must not lose a check either.
    let (_, store) = store_at_start();
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let store = store.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                let plan = limit("free");
                barrier.wait();
                let mut per_user = vec![0usize; 50];
                for _ in 0..3 {
                    for (k, count) in per_user.iter_mut().enumerate() {
                        let user = format!("user{k}");
                        if allowed(&store, &plan, &user, free(), 1) {
                            *count += 1;
                        }
                    }
                }
                per_user
            })
        })
        .collect();
    let mut per_user = vec![0usize; 50];
    for handle in handles {
        for (total, n) in per_user.iter_mut().zip(handle.join().unwrap()) {
            *total += n;
        }
    }
    assert_eq!(per_user, vec![10; 50]);
    assert_eq!(store.len(), 50);
}

// ---------------------------------------------------------------------------
// Several buckets, one decision

/// A tier and an endpoint limit of one user, checked together by `joint`
/// threads (and the tier alone by `plan_only` threads), `per_thread` times
/// each: how many joint and tier-only requests passed.
fn plan_and_endpoint_race(
    store: &MemoryStorage,
    plan_quota: Quota,
    search_quota: Quota,
    joint: usize,
    plan_only: usize,
    per_thread: usize,
) -> (usize, usize) {
    let barrier = Arc::new(Barrier::new(joint + plan_only));
    let spawn = |both: bool| {
        let store = store.clone();
        let barrier = barrier.clone();
        thread::spawn(move || {
            let (plan, search) = (limit("plan"), limit("search"));
            barrier.wait();
            (0..per_thread)
                .filter(|_| {
                    let mut checks = vec![
                        BucketCheck::new(&plan, "ana", plan_quota, 1).unwrap(),
                    ];
                    if both {
                        checks.push(
                            BucketCheck::new(&search, "ana", search_quota, 1)
                                .unwrap(),
                        );
                    }
                    let (decided, out) = decide(&store, &checks);
                    if !decided.verdict.allowed {
                        // The refusal names a refusing bucket, and the
                        // others are reported uncharged.
                        let by = decided.verdict.refused_by.unwrap();
                        assert!(!out[by].allowed);
                    }
                    decided.verdict.allowed
                })
                .count()
        })
    };
    let joint_threads: Vec<_> = (0..joint).map(|_| spawn(true)).collect();
    let plan_threads: Vec<_> = (0..plan_only).map(|_| spawn(false)).collect();
    let sum = |handles: Vec<thread::JoinHandle<usize>>| -> usize {
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    };
    (sum(joint_threads), sum(plan_threads))
}

#[test]
fn threads_on_a_plan_and_an_endpoint_limit_pass_exactly_the_smaller_quota() {
    let (plan, search) = (limit("plan"), limit("search"));
    // The endpoint limit is the smaller one, then the tier.
    for (plan_limit, search_limit) in [(100, 3), (5, 20)] {
        let (plan_quota, search_quota) = (
            Quota::per_minute(plan_limit),
            Quota::per_minute(search_limit),
        );
        let (_, store) = store_at_start();
        let (passed, _) =
            finishes_within(Duration::from_secs(60), "joint checks", {
                let store = store.clone();
                move || {
                    plan_and_endpoint_race(
                        &store,
                        plan_quota,
                        search_quota,
                        8,
                        0,
                        40,
                    )
                }
            });
        let smaller = plan_limit.min(search_limit);
        assert_eq!(passed, smaller as usize, "{plan_limit}/{search_limit}");
        // Only the passed decisions were charged, to both buckets: the
        // refused ones (300 and more) charged nothing.
        assert_eq!(
            remaining(&store, &plan, "ana", plan_quota),
            u64::from(plan_limit - smaller)
        );
        assert_eq!(
            remaining(&store, &search, "ana", search_quota),
            u64::from(search_limit - smaller)
        );
    }
}

#[test]
fn joint_and_single_checks_of_one_plan_under_threads_stay_exact() {
    // The single-bucket path (a compare-and-swap) and the joint one (a lock
    // bit) meet on the tier's bucket.
    let (plan, search) = (limit("plan"), limit("search"));
    let (plan_quota, search_quota) = (Quota::per_minute(60), free());
    let (_, store) = store_at_start();
    let (joint, plan_only) =
        finishes_within(Duration::from_secs(60), "mixed checks", {
            let store = store.clone();
            move || {
                plan_and_endpoint_race(
                    &store,
                    plan_quota,
                    search_quota,
                    4,
                    4,
                    50,
                )
            }
        });
    assert!(
        joint <= 10,
        "{joint} joint requests passed a search limit of 10"
    );
    assert_eq!(joint + plan_only, 60, "the plan is spent exactly");
    assert_eq!(remaining(&store, &plan, "ana", plan_quota), 0);
    assert_eq!(
        remaining(&store, &search, "ana", search_quota),
        10 - joint as u64,
        "the search bucket was charged by the passed joint requests only"
    );
}

#[test]
fn overlapping_sets_in_any_order_never_deadlock_and_stay_exact() {
    // Six buckets of one user; each thread checks a set of them, in its
    // own order: pairs both ways, and sets of five and six, which the store
    // decides on another path than sets of up to four (both must lock in
    // one order, or a pair and a six deadlock).
    const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
    let quotas = [30, 40, 50, 60, 70, 80].map(Quota::per_minute);
    let sets: Vec<Vec<usize>> = vec![
        vec![0, 1],
        vec![1, 0],
        vec![1, 2],
        vec![2, 1],
        vec![2, 0],
        vec![0, 2],
        vec![0, 1, 2],
        vec![2, 1, 0],
        vec![5, 4],
        vec![0, 1, 2, 3, 4],
        vec![5, 4, 3, 2, 1, 0],
        vec![3, 0, 5, 1, 4, 2],
    ];
    let (_, store) = store_at_start();
    let passes =
        finishes_within(Duration::from_secs(60), "overlapping sets", {
            let (store, sets) = (store.clone(), sets.clone());
            move || {
                let barrier = Arc::new(Barrier::new(sets.len()));
                let handles: Vec<_> = sets
                    .into_iter()
                    .enumerate()
                    .map(|(t, set)| {
                        let (store, barrier) = (store.clone(), barrier.clone());
                        thread::spawn(move || {
                            let names = NAMES.map(limit);
                            let cost = 1 + (t % 2) as u32;
                            barrier.wait();
                            (0..200)
                                .filter(|_| {
                                    let checks: Vec<_> = set
                                        .iter()
                                        .map(|&b| {
                                            BucketCheck::new(
                                                &names[b], "ana", quotas[b],
                                                cost,
                                            )
                                            .unwrap()
                                        })
                                        .collect();
                                    decide(&store, &checks).0.verdict.allowed
                                })
                                .count()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap())
                    .collect::<Vec<usize>>()
            }
        });
    // Each bucket was charged exactly the passed requests that held it.
    let names = NAMES.map(limit);
    for (b, name) in names.iter().enumerate() {
        let charged: u64 = sets
            .iter()
            .zip(&passes)
            .enumerate()
            .filter(|(_, (set, _))| set.contains(&b))
            .map(|(t, (_, &n))| (1 + (t % 2) as u64) * n as u64)
            .sum();
        let quota = quotas[b];
        assert!(charged <= u64::from(quota.burst()), "{name:?}: {charged}");
        assert_eq!(
            remaining(&store, name, "ana", quota),
            u64::from(quota.burst()) - charged,
            "bucket {name:?}, passes per set {passes:?}"
        );
    }
    // Every thread tried far more than its buckets hold: each set is spent.
    for set in &sets {
        let checks: Vec<_> = set
            .iter()
            .map(|&b| BucketCheck::new(&names[b], "ana", quotas[b], 2).unwrap())
            .collect();
        assert!(!decide(&store, &checks).0.verdict.allowed, "{set:?}");
    }
}

#[test]
fn a_refusal_in_any_position_charges_nothing() {
    let names = [limit("plan"), limit("search"), limit("ip")];
    let quotas = [free(), Quota::per_minute(3), Quota::per_minute(5)];
    for refusing in 0..3 {
        let (_, store) = store_at_start();
        // Spend the refusing bucket alone.
        let burst = quotas[refusing].burst();
        assert!(allowed(
            &store,
            &names[refusing],
            "ana",
            quotas[refusing],
            burst
        ));
        let checks: Vec<_> = (0..3)
            .map(|i| BucketCheck::new(&names[i], "ana", quotas[i], 1).unwrap())
            .collect();
        let (decided, out) = decide(&store, &checks);
        assert!(!decided.verdict.allowed);
        assert_eq!(decided.verdict.refused_by, Some(refusing));
        // Its own wait: one interval of its quota.
        let wait = quotas[refusing].emission_interval_us();
        assert_eq!(decided.verdict.retry_after_us, wait);
        assert_eq!(decided.now_us, Some(START_US));
        for (i, d) in out.iter().enumerate() {
            if i == refusing {
                assert_eq!(
                    (d.allowed, d.remaining, d.retry_after_us),
                    (false, 0, wait)
                );
                assert_eq!(d.store, None);
            } else {
                // Would have passed: reported as it stands, uncharged.
                let full = u64::from(quotas[i].burst());
                assert_eq!(
                    (d.allowed, d.remaining, d.reset_after_us, d.store),
                    (true, full, 0, None),
                    "bucket {i} with bucket {refusing} refusing"
                );
                assert_eq!(
                    remaining(&store, &names[i], "ana", quotas[i]),
                    full
                );
            }
        }
        // What the refused decision left holds no TAT: only the spent
        // bucket survives a sweep.
        store.sweep();
        assert_eq!(store.len(), 1, "refusing bucket {refusing}");
    }
}

#[test]
fn the_longest_wait_refuses_and_a_tie_names_the_first() {
    let (a, b, c) = (limit("a"), limit("b"), limit("c"));
    let (_, store) = store_at_start();
    // a waits 6 s (10/min), b 20 s (3/min), c 6 s (10/min).
    assert!(allowed(&store, &a, "ana", free(), 10));
    assert!(allowed(&store, &b, "ana", Quota::per_minute(3), 3));
    assert!(allowed(&store, &c, "ana", free(), 10));
    let (decided, out) = decide(
        &store,
        &[
            BucketCheck::new(&a, "ana", free(), 1).unwrap(),
            BucketCheck::new(&b, "ana", Quota::per_minute(3), 1).unwrap(),
            BucketCheck::new(&c, "ana", free(), 1).unwrap(),
        ],
    );
    assert_eq!(decided.verdict.refused_by, Some(1));
    assert_eq!(decided.verdict.retry_after_us, 20 * SECOND);
    assert_eq!(out[0].retry_after_us, 6 * SECOND);
    let (decided, _) = decide(
        &store,
        &[
            BucketCheck::new(&c, "ana", free(), 1).unwrap(),
            BucketCheck::new(&a, "ana", free(), 1).unwrap(),
        ],
    );
    assert_eq!(decided.verdict.refused_by, Some(0), "a tie: the first");
    assert_eq!(decided.verdict.retry_after_us, 6 * SECOND);
}

#[test]
fn shadow_limits_refuse_nothing_and_are_charged_only_when_they_pass_alone() {
    let (plan, search) = (limit("plan"), limit("search"));
    let one_a_minute = Quota::per_minute(1);
    let (clock, store) = store_at_start();
    let checks = |cost: u32| {
        [
            BucketCheck::new(&plan, "ana", free(), cost).unwrap(),
            BucketCheck::new(&search, "ana", one_a_minute, 1)
                .unwrap()
                .shadow(true),
        ]
    };

    // Both pass: both charged.
    let (decided, out) = decide(&store, &checks(1));
    assert!(decided.verdict.allowed);
    assert!(out[1].allowed);
    assert_eq!(
        peek(&store, &search, "ana", one_a_minute).reset_after_us,
        60 * SECOND
    );

    // The shadow limit would refuse: the request passes all the same, the
    // would-be refusal is reported, and the shadow bucket is not charged.
    let (decided, out) = decide(&store, &checks(1));
    assert!(decided.verdict.allowed);
    assert_eq!(decided.verdict.refused_by, None);
    assert_eq!(decided.verdict.retry_after_us, 0);
    assert!(!out[1].allowed);
    assert_eq!(out[1].retry_after_us, 60 * SECOND);
    assert_eq!(out[0].remaining, 8);
    assert_eq!(
        peek(&store, &search, "ana", one_a_minute).reset_after_us,
        60 * SECOND
    );

    // Alone too: a shadow bucket that refuses leaves the decision allowed
    // and stores nothing.
    let alone = [BucketCheck::new(&search, "ana", one_a_minute, 1)
        .unwrap()
        .shadow(true)];
    let (decided, out) = decide(&store, &alone);
    assert!(decided.verdict.allowed && !out[0].allowed);
    assert_eq!(
        peek(&store, &search, "ana", one_a_minute).reset_after_us,
        60 * SECOND
    );

    // An enforced refusal: nothing is charged, the shadow bucket included,
    // even though it would pass on its own.
    clock.advance(Duration::from_secs(60));
    assert!(allowed(&store, &plan, "ana", free(), 10));
    let (decided, out) = decide(&store, &checks(1));
    assert!(!decided.verdict.allowed);
    assert_eq!(decided.verdict.refused_by, Some(0));
    assert!(out[1].allowed);
    assert_eq!(remaining(&store, &search, "ana", one_a_minute), 1);

    // Passing alone again a minute later: charged.
    clock.advance(Duration::from_secs(60));
    let (decided, out) = decide(&store, &checks(1));
    assert!(decided.verdict.allowed && out[1].allowed);
    assert_eq!(remaining(&store, &search, "ana", one_a_minute), 0);
}

// ---------------------------------------------------------------------------
// Peek

#[test]
fn a_peek_never_creates_an_entry_and_changes_nothing() {
    let (plan, search) = (limit("plan"), limit("search"));
    let (clock, store) = store_at_start();

    // Unknown buckets: full, and still unknown afterwards.
    let d = peek(&store, &plan, "ana", free());
    assert_eq!(
        (d.remaining, d.reset_after_us, d.retry_after_us),
        (10, 0, 0)
    );
    let (decided, out) = decide(
        &store,
        &[
            BucketCheck::new(&plan, "bea", free(), 0).unwrap(),
            BucketCheck::peek(&search, "bea", Quota::per_minute(3)),
        ],
    );
    assert!(decided.verdict.allowed);
    assert_eq!((out[0].remaining, out[1].remaining), (10, 3));
    assert_eq!(store.len(), 0, "a peek created an entry");

    // A peek next to a charge: only the charged bucket gets an entry.
    let (decided, _) = decide(
        &store,
        &[
            BucketCheck::new(&plan, "eva", free(), 1).unwrap(),
            BucketCheck::peek(&search, "eva", Quota::per_minute(3)),
        ],
    );
    assert!(decided.verdict.allowed);
    assert_eq!(store.len(), 1);

    // A known bucket: read as it stands, as often as asked, and the next
    // charge sees it untouched.
    assert!(allowed(&store, &plan, "ana", free(), 4));
    for _ in 0..3 {
        let d = peek(&store, &plan, "ana", free());
        assert_eq!((d.remaining, d.reset_after_us), (6, 24 * SECOND));
    }
    assert_eq!(check(&store, &plan, "ana", free(), 1).remaining, 5);
    assert_eq!(store.len(), 2);

    // A spent bucket: the peek is allowed, with nothing left.
    assert!(allowed(&store, &plan, "ana", free(), 5));
    let d = peek(&store, &plan, "ana", free());
    assert_eq!(
        (d.allowed, d.remaining, d.reset_after_us),
        (true, 0, 60 * SECOND)
    );

    // Even the cap of a clock that went back is not written by a peek: two
    // hours back the bucket reads capped (tau and an hour ahead, nothing
    // left), and back at the right time it is as it was.
    clock.set_us(START_US - 7_200 * SECOND);
    let d = peek(&store, &plan, "ana", free());
    assert_eq!((d.remaining, d.reset_after_us), (0, 3_660 * SECOND));
    clock.set_us(START_US);
    let d = peek(&store, &plan, "ana", free());
    assert_eq!((d.remaining, d.reset_after_us), (0, 60 * SECOND));
    assert_eq!(store.len(), 2);
}

// ---------------------------------------------------------------------------
// Settle

#[test]
fn a_settled_debt_is_waited_for_exactly() {
    // 1000 per minute (T = 60 ms), 1 charged up front, settled to 1200.
    let tokens = limit("tokens");
    let quota = Quota::per_minute(1000);
    let (clock, store) = store_at_start();
    assert!(allowed(&store, &tokens, "ana", quota, 1));
    settle(&store, &tokens, "ana", quota, Adjust::between(1, 1200));
    let d = peek(&store, &tokens, "ana", quota);
    assert_eq!((d.remaining, d.reset_after_us), (0, 72 * SECOND));

    let d = check(&store, &tokens, "ana", quota, 1);
    assert!(!d.allowed);
    assert_eq!(d.retry_after_us, 12_060_000);

    // The debt is beyond tau: a sweep keeps it, and no cap erases it.
    clock.advance(Duration::from_micros(12_059_999));
    store.sweep();
    let d = check(&store, &tokens, "ana", quota, 1);
    assert_eq!((d.allowed, d.retry_after_us), (false, 1));
    clock.advance(Duration::from_micros(1));
    let d = check(&store, &tokens, "ana", quota, 1);
    assert_eq!((d.allowed, d.remaining), (true, 0));
}

#[test]
fn a_debt_stops_at_the_ceiling_tau_and_an_hour() {
    let plan = limit("plan");
    let (_, store) = store_at_start();
    assert!(allowed(&store, &plan, "ana", free(), 1));
    settle(&store, &plan, "ana", free(), Adjust::Charge(u32::MAX));
    assert_eq!(
        peek(&store, &plan, "ana", free()).reset_after_us,
        3_660 * SECOND
    );
    // The next request waits the debt beyond tau, and its own interval.
    let d = check(&store, &plan, "ana", free(), 1);
    assert_eq!((d.allowed, d.retry_after_us), (false, 3_606 * SECOND));
    // A charge settled on a bucket never seen: a debt like any other.
    settle(&store, &plan, "bea", free(), Adjust::Charge(3));
    assert_eq!(remaining(&store, &plan, "bea", free()), 7);
}

#[test]
fn a_refund_never_goes_below_now() {
    let plan = limit("plan");
    let (clock, store) = store_at_start();
    // A partial refund gives back exactly what it says.
    assert!(allowed(&store, &plan, "ana", free(), 5));
    settle(&store, &plan, "ana", free(), Adjust::Refund(2));
    let d = peek(&store, &plan, "ana", free());
    assert_eq!((d.remaining, d.reset_after_us), (7, 18 * SECOND));

    // 3 charged, 10 s pass (time gave back 1 and some), all 3 refunded:
    // full, not 10 s "in credit".
    assert!(allowed(&store, &plan, "bea", free(), 3));
    clock.advance(Duration::from_secs(10));
    settle(&store, &plan, "bea", free(), Adjust::Refund(3));
    let d = peek(&store, &plan, "bea", free());
    assert_eq!((d.remaining, d.reset_after_us), (10, 0));
    // And the next burst is the burst, no more.
    assert!(allowed(&store, &plan, "bea", free(), 10));
    assert!(!allowed(&store, &plan, "bea", free(), 1));
}

#[test]
fn a_refund_of_a_full_bucket_keeps_it_empty() {
    let plan = limit("plan");
    let (clock, store) = store_at_start();
    // Never seen: nothing to give back, and no entry is made.
    settle(&store, &plan, "ana", free(), Adjust::Refund(5));
    assert_eq!(store.len(), 0);
    assert_eq!(remaining(&store, &plan, "ana", free()), 10);
    // Through the trait as well.
    let bucket = BucketCheck::peek(&plan, "ana", free());
    block_on(store.settle(&[bucket.settle(Adjust::Refund(1))])).unwrap();
    assert_eq!(store.len(), 0);

    // Spent long ago (its TAT has passed): a refund banks nothing.
    assert!(allowed(&store, &plan, "bea", free(), 10));
    clock.advance(Duration::from_secs(120));
    settle(&store, &plan, "bea", free(), Adjust::Refund(10));
    assert_eq!(remaining(&store, &plan, "bea", free()), 10);
    assert!(allowed(&store, &plan, "bea", free(), 10));
    assert!(!allowed(&store, &plan, "bea", free(), 1));
}

#[test]
fn settles_of_several_buckets_apply_to_each() {
    let (plan, tokens) = (limit("plan"), limit("tokens"));
    let (_, store) = store_at_start();
    assert!(allowed(&store, &plan, "ana", free(), 4));
    let settles: [BucketSettle<'_>; 2] = [
        BucketCheck::peek(&plan, "ana", free()).settle(Adjust::Refund(1)),
        BucketCheck::peek(&tokens, "ana", free()).settle(Adjust::Charge(2)),
    ];
    block_on(store.settle(&settles)).unwrap();
    assert_eq!(remaining(&store, &plan, "ana", free()), 7);
    assert_eq!(remaining(&store, &tokens, "ana", free()), 8);
}

// ---------------------------------------------------------------------------
// Refused inputs

#[test]
fn duplicate_buckets_are_refused_and_store_nothing() {
    let (plan, search) = (limit("plan"), limit("search"));
    let (_, store) = store_at_start();
    let twice = [
        BucketCheck::new(&plan, "ana", free(), 1).unwrap(),
        BucketCheck::new(&search, "ana", free(), 1).unwrap(),
        // The same bucket as the first, even as a peek under another quota.
        BucketCheck::peek(&plan, "ana", Quota::per_minute(3)),
    ];
    let mut out = [Decision::default(); 3];
    assert!(matches!(
        store.check_sync(&twice, &mut out),
        Err(StorageError::DuplicateBucket)
    ));
    assert!(matches!(
        store.check(&twice, &mut out).ready(),
        Some(Err(StorageError::DuplicateBucket))
    ));
    assert!(matches!(
        block_on(store.check(&twice, &mut out)),
        Err(StorageError::DuplicateBucket)
    ));
    assert_eq!(store.len(), 0);

    // The same user under two limits, or two users under one: distinct.
    let distinct = [
        BucketCheck::new(&plan, "ana", free(), 1).unwrap(),
        BucketCheck::new(&search, "ana", free(), 1).unwrap(),
        BucketCheck::new(&plan, "bea", free(), 1).unwrap(),
    ];
    assert!(
        store
            .check_sync(&distinct, &mut out)
            .unwrap()
            .verdict
            .allowed
    );
    assert_eq!(store.len(), 3);
}

#[test]
fn a_decision_past_the_end_of_time_is_the_checks_typed_error() {
    // One bucket and several (the joint path): gcra-core's own error.
    let clock = FakeClock::at_us(gcra_core::MAX_TIME_US + 1);
    let store = MemoryStorage::with_clock(clock);
    let (plan, search) = (limit("free"), limit("search"));
    for n in [1, 2, 5] {
        let names = [&plan, &search];
        let users = ["ana", "bo", "carmen", "dora", "eli"];
        let checks: Vec<_> = (0..n)
            .map(|i| {
                BucketCheck::new(names[i % 2], users[i], free(), 1).unwrap()
            })
            .collect();
        let mut out = vec![Decision::default(); n];
        let answer = store.check_sync(&checks, &mut out);
        assert!(
            matches!(
                answer,
                Err(StorageError::Check(CheckError::TimeOutOfRange))
            ),
            "{n}: {answer:?}"
        );
    }
}

#[test]
fn a_length_mismatch_is_refused_and_stores_nothing() {
    let (plan, search) = (limit("plan"), limit("search"));
    let (_, store) = store_at_start();
    let two = [
        BucketCheck::new(&plan, "ana", free(), 1).unwrap(),
        BucketCheck::new(&search, "ana", free(), 1).unwrap(),
    ];
    let mut one = [Decision::default()];
    assert!(matches!(
        store.check_sync(&two, &mut one),
        Err(StorageError::LengthMismatch { checks: 2, out: 1 })
    ));
    let mut three = [Decision::default(); 3];
    assert!(matches!(
        store.check_sync(&two[..1], &mut three),
        Err(StorageError::LengthMismatch { checks: 1, out: 3 })
    ));
    assert!(matches!(
        block_on(store.check(&two, &mut three)),
        Err(StorageError::LengthMismatch { checks: 2, out: 3 })
    ));
    assert_eq!(store.len(), 0);
}

#[test]
fn a_cost_above_the_burst_is_refused_at_the_edge_and_a_429_moves_nothing() {
    let plan = limit("plan");
    let (_, store) = store_at_start();
    assert_eq!(
        BucketCheck::new(&plan, "ana", free(), 11).unwrap_err(),
        CheckError::CostExceedsBurst {
            cost: 11,
            burst: 10
        }
    );
    // The burst itself is a request like any other.
    assert!(allowed(&store, &plan, "ana", free(), 4));
    // A refused (429) decision does not move the TAT.
    assert!(!allowed(&store, &plan, "ana", free(), 7));
    assert_eq!(store.len(), 1);
    let d = check(&store, &plan, "ana", free(), 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 5, "only the 4 and this 1 were charged");
    assert_eq!(d.reset_after_us, 30 * SECOND);
}

#[test]
fn the_store_is_memory_and_decides_without_io() {
    let plan = limit("free");
    let (_, store) = store_at_start();
    assert_eq!(store.kind(), "memory");
    let checks = [BucketCheck::new(&plan, "ana", free(), 1).unwrap()];
    let mut out = [Decision::default()];
    let local = store.check(&checks, &mut out).ready().unwrap().unwrap();
    assert_eq!(local.now_us, Some(START_US), "the store's clock");
    assert_eq!((local.by, local.share), ("memory", 1));
    assert!(local.verdict.allowed);
    let d = out[0];
    assert_eq!(
        (d.allowed, d.remaining, d.reset_after_us),
        (true, 9, 6 * SECOND)
    );
    assert_eq!(d.store.map(|s| s.tat_us), Some(START_US + 6 * SECOND));
    // Through the trait, and clones share the buckets.
    let clone = store.clone();
    let decided = block_on(clone.check(&checks, &mut out)).unwrap();
    assert_eq!((decided.by, out[0].remaining), ("memory", 8));
    assert_eq!(store.len(), 1);
}

// ---------------------------------------------------------------------------
// Bucket identity

#[test]
fn distinct_partitions_are_independent() {
    let plan = limit("free");
    let (_, store) = store_at_start();
    for user in ["ana", "bea", "eva"] {
        let passed = (0..15)
            .filter(|_| allowed(&store, &plan, user, free(), 1))
            .count();
        assert_eq!(passed, 10, "{user}");
    }
    assert_eq!(store.len(), 3);
}

#[test]
fn the_same_partition_under_two_limits_is_two_buckets() {
    let (free_tier, pro) = (limit("free"), limit("pro"));
    let (_, store) = store_at_start();
    assert!(allowed(&store, &free_tier, "ana", free(), 10));
    assert!(!allowed(&store, &free_tier, "ana", free(), 1));
    let d = check(&store, &pro, "ana", free(), 1);
    assert!(d.allowed);
    assert_eq!(d.remaining, 9);
    assert_eq!(store.len(), 2);
}

#[test]
fn limit_and_partition_boundaries_are_part_of_the_name() {
    // ("ab", "c") and ("a", "bc") concatenate to the same bytes.
    let (ab, a, abc) = (limit("ab"), limit("a"), limit("abc"));
    let (_, store) = store_at_start();
    assert!(allowed(&store, &ab, "c", free(), 10));
    assert!(!allowed(&store, &ab, "c", free(), 1));
    let d = check(&store, &a, "bc", free(), 1);
    assert!(
        d.allowed,
        "(\"a\", \"bc\") must not share (\"ab\", \"c\")'s bucket"
    );
    assert_eq!(d.remaining, 9);
    // And the empty partition (a global limit).
    assert!(allowed(&store, &abc, "", free(), 1));
    assert_eq!(remaining(&store, &abc, "", free()), 9);
    assert_eq!(store.len(), 3);
}

#[test]
fn ids_around_the_inline_hashing_buffer_are_distinct_buckets() {
    // Names of up to 128 bytes are hashed from a stack copy, longer ones as
    // a stream: ids on both sides of that length, each a bucket of its own,
    // and the same one every time.
    let plan = limit("free");
    let (_, store) = store_at_start();
    let ids: Vec<String> = (110..=140).map(|n| "k".repeat(n)).collect();
    for id in &ids {
        assert!(allowed(&store, &plan, id, free(), 9), "{}", id.len());
    }
    for id in &ids {
        let d = check(&store, &plan, id, free(), 1);
        assert_eq!((d.allowed, d.remaining), (true, 0), "{}", id.len());
        assert!(!allowed(&store, &plan, id, free(), 1), "{}", id.len());
    }
    assert_eq!(store.len(), ids.len());
}

#[test]
fn huge_ids_are_distinct_buckets_of_fixed_size() {
    let plan = limit("free");
    let (_, store) = store_at_start();
    let mut a = "k".repeat(64 * 1024);
    let b = format!("{a}x");
    // Ten from the first id exhaust its bucket, not the second's.
    for _ in 0..10 {
        assert!(allowed(&store, &plan, &a, free(), 1));
    }
    assert!(!allowed(&store, &plan, &a, free(), 1));
    assert!(allowed(&store, &plan, &b, free(), 1));
    // Same id again, built anew: the same bucket.
    a = "k".repeat(64 * 1024);
    assert!(!allowed(&store, &plan, &a, free(), 1));
    assert_eq!(store.len(), 2);
}

// ---------------------------------------------------------------------------
// Sweeping

#[test]
fn dead_entries_are_swept_and_live_ones_kept() {
    let plan = limit("free");
    let (clock, store) = store_at_start();
    for k in 0..100 {
        assert!(allowed(&store, &plan, &format!("u{k}"), free(), 1));
    }
    // One bucket with a full minute of TAT.
    assert!(allowed(&store, &plan, "heavy", free(), 10));
    assert_eq!(store.len(), 101);

    // Each cost-1 TAT is 6 s ahead: live one µs before, dead at 6 s.
    clock.advance(Duration::from_micros(5_999_999));
    store.sweep();
    assert_eq!(store.len(), 101);
    clock.advance(Duration::from_micros(1));
    store.sweep();
    assert_eq!(store.len(), 1, "only the 60 s bucket is still live");

    // The sweep did not change the live bucket: its TAT is still 60 s, so
    // at 6 s exactly one interval is free again.
    let d = check(&store, &plan, "heavy", free(), 1);
    assert!(d.allowed);
    assert_eq!((d.remaining, d.reset_after_us), (0, 60 * SECOND));
    assert!(!allowed(&store, &plan, "heavy", free(), 1));
    // Its TAT is now 66 s: live at 65.999999 s, dead at 66 s.
    clock.advance(Duration::from_micros(59_999_999));
    store.sweep();
    assert_eq!(store.len(), 1);
    clock.advance(Duration::from_micros(1));
    store.sweep();
    assert_eq!(store.len(), 0);
    assert!(store.is_empty());
}

#[test]
fn the_insert_path_sweeps_dead_entries_by_itself() {
    // No runtime, so no background task: only inserts may sweep. The sweep
    // on insert is per shard (64 shards, at most once per interval each),
    // so one new bucket sweeps one shard; enough new buckets to reach every
    // shard sweep them all. With 2 000 old buckets, the chance that the
    // first new one's shard held none of them is (63/64)^2000 (~1e-14);
    // with 2 560 new ones, that some shard got none is ~1e-16.
    let plan = limit("free");
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::builder()
        .clock(clock.clone())
        .sweep_interval(Duration::from_secs(1))
        .build();
    let old = 2_000;
    for k in 0..old {
        assert!(allowed(&store, &plan, &format!("old{k}"), free(), 1));
    }
    assert_eq!(store.len(), old);

    // Past the interval, but the entries are live (6 s TAT): kept.
    clock.advance(Duration::from_secs(2));
    assert!(allowed(&store, &plan, "live-check", free(), 1));
    assert_eq!(store.len(), old + 1);

    // Past the period and the interval: the next insert sweeps its shard.
    clock.advance(Duration::from_secs(60));
    assert!(allowed(&store, &plan, "new0", free(), 1));
    assert!(
        store.len() < old + 2,
        "len {} after one insert",
        store.len()
    );

    let new = 2_560;
    for k in 1..new {
        assert!(allowed(&store, &plan, &format!("new{k}"), free(), 1));
    }
    assert_eq!(
        store.len(),
        new,
        "every dead entry swept, every new one kept"
    );
}

#[test]
fn a_flood_at_capacity_does_not_sweep_on_every_insert() {
    // A full store of dead buckets, within the sweep interval: were each
    // insert to sweep its shard, the dead would be swept and no bucket
    // evicted. At most one sweep per interval per shard: each new bucket
    // evicts one (a dead one, the nearest to full).
    let plan = limit("free");
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::builder()
        .clock(clock.clone())
        .capacity(1_000)
        .sweep_interval(Duration::from_secs(10))
        .build();
    for k in 0..1_000 {
        assert!(allowed(&store, &plan, &format!("old{k}"), free(), 1));
    }
    assert_eq!((store.len(), store.evictions()), (1_000, 0));

    // 7 s later every old bucket is dead (6 s TATs); the shards were swept
    // at the start, so none is due before 10 s.
    clock.advance(Duration::from_secs(7));
    let debts = Arc::new(Mutex::new(Vec::new()));
    let subscription = store.subscribe({
        let debts = debts.clone();
        Arc::new(move |event: &StorageEvent| {
            if let StorageEvent::Evicted { debt_us } = event {
                debts.lock().unwrap().push(*debt_us);
            }
        })
    });
    for k in 0..1_000 {
        let d = check(&store, &plan, &format!("new{k}"), free(), 1);
        assert_eq!((d.allowed, d.remaining), (true, 9));
    }
    assert_eq!(
        store.evictions(),
        1_000,
        "an insert swept instead of evicting"
    );
    assert_eq!(store.len(), 1_000);
    // Each eviction was reported with what it gave away: nothing for a dead
    // bucket, 6 s for a new one (in a shard whose dead were all gone).
    let debts = debts.lock().unwrap().clone();
    assert_eq!(debts.len(), 1_000);
    assert!(
        debts.iter().all(|&d| d == 0 || d == 6 * SECOND),
        "{debts:?}"
    );
    assert!(debts.contains(&0), "no dead bucket evicted first");
    drop(subscription);

    // Past the interval (and every TAT): the next insert sweeps its shard.
    clock.advance(Duration::from_secs(13));
    assert!(allowed(&store, &plan, "after", free(), 1));
    assert_eq!(store.evictions(), 1_000, "room came from the sweep");
    assert!(store.len() < 1_000, "len {}", store.len());
}

// ---------------------------------------------------------------------------
// Capacity and eviction

#[test]
fn the_capacity_is_an_exact_bound_and_a_full_store_never_errors() {
    // A regression test for a per-shard bound that let `capacity(100)` hold
    // 128 and made small capacities refuse far too early.
    let plan = limit("free");
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::builder()
        .clock(clock.clone())
        .capacity(100)
        .build();
    assert_eq!(store.capacity(), 100);
    // 5 000 new users: every one answered as a new user is, none refused
    // for room, and the store holds exactly its capacity.
    for k in 0..5_000 {
        let d = check(&store, &plan, &format!("u{k}"), free(), 1);
        assert_eq!((d.allowed, d.remaining), (true, 9), "user {k}");
        assert!(store.len() <= 100);
    }
    assert_eq!(store.len(), 100, "exactly the capacity, not less");
    assert_eq!(store.evictions(), 4_900);
}

#[test]
fn a_new_user_in_a_full_store_gets_its_normal_answer_never_unlimited() {
    let plan = limit("free");
    let store = MemoryStorage::builder()
        .clock(FakeClock::at_us(START_US))
        .capacity(64)
        .build();
    for k in 0..64 {
        assert!(allowed(&store, &plan, &format!("u{k}"), free(), 1));
    }
    assert_eq!((store.len(), store.evictions()), (64, 0));
    // The new user's burst, and not one more.
    let passed: Vec<u64> = (0..12)
        .map(|_| check(&store, &plan, "newcomer", free(), 1))
        .filter(|d| d.allowed)
        .map(|d| d.remaining)
        .collect();
    assert_eq!(passed, (0..10).rev().collect::<Vec<u64>>());
    assert_eq!((store.len(), store.evictions()), (64, 1));
}

#[test]
fn buckets_carrying_debt_survive_a_flood_of_one_shot_ids() {
    // 50 users have spent 8 of their 10 (48 s of debt each), then 20 times
    // the capacity of one-shot ids arrives (6 s each). Each eviction takes
    // the bucket nearest to full in a sample: a one-shot, never a user in
    // debt (a sample of a shard made only of the 50 would need a shard
    // without any of the 950 one-shots that filled the store: ~1e-5).
    let plan = limit("free");
    let capacity = 1_000;
    let store = MemoryStorage::builder()
        .clock(FakeClock::at_us(START_US))
        .capacity(capacity)
        .build();
    for k in 0..50 {
        assert!(allowed(&store, &plan, &format!("spender{k}"), free(), 8));
    }
    let flood = 20 * capacity;
    for k in 0..flood {
        let d = check(&store, &plan, &format!("once{k}"), free(), 1);
        assert_eq!((d.allowed, d.remaining), (true, 9), "one-shot {k}");
    }
    assert_eq!(store.len(), capacity);
    assert_eq!(store.evictions(), (50 + flood - capacity) as u64);
    for k in 0..50 {
        let d = peek(&store, &plan, &format!("spender{k}"), free());
        assert_eq!(
            (d.remaining, d.reset_after_us),
            (2, 48 * SECOND),
            "spender {k} lost its debt"
        );
    }
}

#[test]
fn evictions_are_counted_and_reported_until_the_subscription_is_dropped() {
    let plan = limit("free");
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::builder()
        .clock(clock.clone())
        .capacity(10)
        .build();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let subscription = Storage::subscribe(&store, {
        let heard = heard.clone();
        Arc::new(move |event: &StorageEvent| {
            heard.lock().unwrap().push(event.clone())
        })
    });
    // 30 one-shot users at one instant: 20 evictions, each of a bucket 6 s
    // from full.
    for k in 0..30 {
        assert!(allowed(&store, &plan, &format!("u{k}"), free(), 1));
    }
    assert_eq!(store.evictions(), 20);
    assert_eq!(
        *heard.lock().unwrap(),
        vec![
            StorageEvent::Evicted {
                debt_us: 6 * SECOND
            };
            20
        ]
    );

    // Unsubscribed: still counted, no longer reported.
    drop(subscription);
    for k in 30..35 {
        assert!(allowed(&store, &plan, &format!("u{k}"), free(), 1));
    }
    assert_eq!(store.evictions(), 25);
    assert_eq!(heard.lock().unwrap().len(), 20);
}

#[test]
fn joint_decisions_of_new_buckets_in_a_full_store_finish() {
    // A decision over buckets that are new makes an entry for each before
    // deciding. In a full store each entry evicts one, from its own shard;
    // the decision's own entries (placeholders, the nearest to full of all)
    // must not evict each other forever when they share a shard. Which
    // buckets share a shard depends on how buckets are named: 1 000
    // newcomers, each with an endpoint limit of its own beside the tier,
    // make sure some do (whatever the naming, about 1 in 64 pairs).
    let plan = limit("plan");
    let store = MemoryStorage::builder()
        .clock(FakeClock::at_us(START_US))
        .capacity(1_000)
        .build();
    for k in 0..1_000 {
        assert!(allowed(&store, &plan, &format!("once{k}"), free(), 1));
    }
    finishes_within(Duration::from_secs(20), "joint checks of new users", {
        let store = store.clone();
        move || {
            for k in 0..1_000 {
                let user = format!("newcomer{k}");
                let endpoint = LimitName::new(format!("endpoint{k}")).unwrap();
                let (decided, out) = decide(
                    &store,
                    &[
                        BucketCheck::new(&plan, &user, free(), 1).unwrap(),
                        BucketCheck::new(
                            &endpoint,
                            &user,
                            Quota::per_minute(3),
                            1,
                        )
                        .unwrap(),
                    ],
                );
                assert!(decided.verdict.allowed, "newcomer {k}");
                assert_eq!((out[0].remaining, out[1].remaining), (9, 2));
            }
        }
    });
    assert_eq!(store.len(), 1_000);
}

#[test]
fn a_joint_decision_wider_than_the_store_finishes() {
    // Capacity 1 and a decision over two new buckets: it cannot hold both.
    // Whatever it answers (a decision or an error), it must answer.
    let (plan, search) = (limit("plan"), limit("search"));
    let store = MemoryStorage::builder()
        .clock(FakeClock::at_us(START_US))
        .capacity(1)
        .build();
    let result = finishes_within(Duration::from_secs(10), "a joint check", {
        let store = store.clone();
        move || {
            let checks = [
                BucketCheck::new(&plan, "ana", free(), 1).unwrap(),
                BucketCheck::new(&search, "ana", free(), 1).unwrap(),
            ];
            let mut out = [Decision::default(); 2];
            store
                .check_sync(&checks, &mut out)
                .map(|d| d.verdict.allowed)
        }
    });
    assert!(store.len() <= 1, "{result:?}");
}

#[test]
fn refused_decisions_of_new_partitions_evict_no_one() {
    // Regression: a client whose tier is exhausted sends requests that each
    // name a new partition of a keyed limit (a header it controls). Each is
    // refused by the tier; if each still made an entry for its new
    // partition first, in a full store every entry would evict an honest
    // user's exhausted bucket (485 evictions for 500 requests, 36 of 48
    // users reset). A refused decision must leave the store as it found
    // it.
    let (plan, per_key) = (limit("free"), limit("per-key"));
    let capacity = 64;
    let store = MemoryStorage::builder()
        .clock(FakeClock::at_us(START_US))
        .capacity(capacity)
        .build();
    for k in 0..capacity - 1 {
        assert!(allowed(&store, &plan, &format!("honest{k}"), free(), 10));
    }
    assert!(allowed(&store, &plan, "attacker", free(), 10));
    assert_eq!(store.len(), capacity);
    for k in 0..500 {
        let partition = format!("chosen-by-the-client-{k}");
        let (decided, out) = decide(
            &store,
            &[
                BucketCheck::new(&plan, "attacker", free(), 1).unwrap(),
                BucketCheck::new(&per_key, &partition, free(), 1).unwrap(),
            ],
        );
        assert_eq!(decided.verdict.refused_by, Some(0), "request {k}");
        assert!(out[1].allowed, "the new partition would pass on its own");
    }
    assert_eq!(store.evictions(), 0, "a refused decision evicted a bucket");
    assert_eq!(store.len(), capacity);
    for k in 0..capacity - 1 {
        let user = format!("honest{k}");
        assert!(!allowed(&store, &plan, &user, free(), 1), "{user} reset");
    }
}

#[test]
fn new_buckets_in_a_full_store_find_room_under_contention() {
    // Regression: a bounded number of attempts to find room would end in an
    // error (a 503, and UNAVAILABLE to Envoy, which lets the request pass)
    // when other threads kept taking every freed place. An evicted bucket's
    // place goes to the bucket that evicted it: every new bucket is
    // answered, whatever the contention.
    let plan = limit("free");
    let search = limit("search");
    // Room for every bucket in flight at once (8 threads, 2 each), and a
    // store full from the first insert on.
    let store = MemoryStorage::builder()
        .clock(FakeClock::at_us(START_US))
        .capacity(64)
        .build();
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (store, barrier) = (store.clone(), barrier.clone());
            let (plan, search) = (plan.clone(), search.clone());
            thread::spawn(move || {
                barrier.wait();
                for k in 0..2_000 {
                    let user = format!("t{t}-u{k}");
                    let one =
                        [BucketCheck::new(&plan, &user, free(), 1).unwrap()];
                    let mut out = [Decision::default()];
                    let decided = store.check_sync(&one, &mut out);
                    assert!(decided.unwrap().verdict.allowed, "{user}");
                    let both = [
                        BucketCheck::new(&plan, &user, free(), 1).unwrap(),
                        BucketCheck::new(&search, &user, free(), 1).unwrap(),
                    ];
                    let mut out = [Decision::default(); 2];
                    let decided = store.check_sync(&both, &mut out);
                    assert!(decided.unwrap().verdict.allowed, "{user}, joint");
                }
            })
        })
        .collect();
    finishes_within(Duration::from_secs(60), "contended inserts", move || {
        for handle in handles {
            handle.join().unwrap();
        }
    });
    assert!(store.len() <= 64);
}

// ---------------------------------------------------------------------------
// Against a model

/// `MemoryStorage` against a model: a map of TATs decided by gcra-core's
/// `check_all`. Random decisions of one to seven buckets (over the store's
/// few-bucket path and its general one), of several users and limits in any
/// order, with shadow limits, peeks and repeated buckets, at random times:
/// every answer, and every bucket afterwards, is the model's. Some are
/// first tried on the lean path (`try_charge_rates`), as the limiter
/// does: it must charge exactly what the model charges when every bucket
/// is held and passes, and leave the rest to `check_sync` untouched.
mod model {
    use std::collections::{HashMap, HashSet};

    use gcra_core::{Charge, check_all};
    use proptest::prelude::*;

    use super::*;

    /// The limits a check may name, each with its own quota.
    fn limits() -> Vec<(LimitName, Quota)> {
        vec![
            (LimitName::new("free").unwrap(), Quota::per_minute(10)),
            (
                LimitName::of_limit("search").unwrap(),
                Quota::per_minute(3).try_allow_burst(2).unwrap(),
            ),
            (LimitName::new("pro").unwrap(), Quota::per_second(5)),
            (LimitName::of_limit("upload").unwrap(), Quota::per_hour(4)),
        ]
    }

    /// Users: short ones, and one past any inline hashing buffer.
    const USERS: [&str; 4] = [
        "ana",
        "bo",
        "carmen",
        "a-user-id-long-enough-to-be-hashed-in-blocks-not-inline",
    ];

    #[derive(Debug, Clone)]
    struct Check {
        limit: usize,
        user: usize,
        cost: u32,
        shadow: bool,
    }

    fn check() -> impl Strategy<Value = Check> {
        (
            0..4usize,
            0..USERS.len(),
            0..=2u32,
            proptest::bool::weighted(0.2),
        )
            .prop_map(|(limit, user, cost, shadow)| Check {
                limit,
                user,
                cost,
                shadow,
            })
    }

    /// A decision, the time that passed before it, and whether it is
    /// tried on the lean path first.
    fn step() -> impl Strategy<Value = (u64, Vec<Check>, bool)> {
        (
            prop_oneof![Just(0u64), 0..2_000_000u64, 0..90_000_000u64],
            proptest::collection::vec(check(), 1..=7),
            proptest::bool::ANY,
        )
    }

    /// Bounded like the threaded tests: a mutant that makes the store loop
    /// fails here instead of hanging.
    #[test]
    fn every_decision_is_the_models() {
        finishes_within(Duration::from_secs(60), "the model", || {
            let mut runner = proptest::test_runner::TestRunner::new(
                ProptestConfig::with_cases(256),
            );
            let steps = proptest::collection::vec(step(), 1..40);
            runner.run(&steps, decide_as_the_model).unwrap();
        });
    }

    fn decide_as_the_model(
        steps: Vec<(u64, Vec<Check>, bool)>,
    ) -> Result<(), TestCaseError> {
        {
            let limits = limits();
            let clock = FakeClock::at_us(START_US);
            let store = MemoryStorage::with_clock(clock.clone());
            let mut model: HashMap<(usize, usize), u64> = HashMap::new();
            let mut now = START_US;
            for (elapsed, checks, lean) in steps {
                now += elapsed;
                clock.set_us(now);
                // One String per check: a check's partition is compared by
                // string, not by where it lives.
                let users: Vec<String> =
                    checks.iter().map(|c| USERS[c.user].to_owned()).collect();
                if lean
                    && charged_on_the_lean_path(
                        &store, &limits, &mut model, &checks, &users, now,
                    )?
                {
                    continue;
                }
                let built: Vec<BucketCheck<'_>> = checks
                    .iter()
                    .zip(&users)
                    .map(|(c, user)| {
                        let (name, quota) = &limits[c.limit];
                        BucketCheck::new(name, user, *quota, c.cost)
                            .unwrap()
                            .shadow(c.shadow)
                    })
                    .collect();
                let mut out = vec![Decision::default(); built.len()];
                let answer = store.check_sync(&built, &mut out);

                let mut seen = HashSet::new();
                let repeated =
                    !checks.iter().all(|c| seen.insert((c.limit, c.user)));
                if repeated {
                    prop_assert!(
                        matches!(answer, Err(StorageError::DuplicateBucket)),
                        "{answer:?}"
                    );
                    continue;
                }
                let charges: Vec<Charge> = checks
                    .iter()
                    .map(|c| {
                        let charge = Charge::new(limits[c.limit].1, c.cost);
                        if c.shadow { charge.shadow() } else { charge }
                    })
                    .collect();
                let stored: Vec<Option<u64>> = checks
                    .iter()
                    .map(|c| model.get(&(c.limit, c.user)).copied())
                    .collect();
                let mut expected = vec![Decision::default(); checks.len()];
                let verdict = check_all(&charges, &stored, now, &mut expected);
                match verdict {
                    Ok(verdict) => {
                        let decided = answer.unwrap();
                        prop_assert_eq!(decided.verdict, verdict);
                        prop_assert_eq!(&out, &expected);
                        for (c, decision) in checks.iter().zip(&expected) {
                            if let Some(write) = decision.store {
                                model.insert((c.limit, c.user), write.tat_us);
                            }
                        }
                    }
                    Err(_) => prop_assert!(answer.is_err(), "{answer:?}"),
                }
            }
            // Every bucket as the model holds it, read alone.
            for (limit, (name, quota)) in limits.iter().enumerate() {
                for (user, id) in USERS.iter().enumerate() {
                    let peek = [BucketCheck::new(name, id, *quota, 0).unwrap()];
                    let mut out = [Decision::default()];
                    store.check_sync(&peek, &mut out).unwrap();
                    let expected = quota
                        .peek(model.get(&(limit, user)).copied(), now)
                        .unwrap();
                    prop_assert_eq!(
                        out[0],
                        expected,
                        "limit {} user {}",
                        limit,
                        user
                    );
                }
            }
        }
        Ok(())
    }

    /// `checks` tried on `try_charge_rates` where it applies (2 to 4
    /// distinct rates, each charged, none in shadow): whether it charged
    /// them. It must when the model holds every bucket alive and passes
    /// them all, with the model's decisions, and must not otherwise.
    fn charged_on_the_lean_path(
        store: &MemoryStorage,
        limits: &[(LimitName, Quota)],
        model: &mut HashMap<(usize, usize), u64>,
        checks: &[Check],
        users: &[String],
        now: u64,
    ) -> Result<bool, TestCaseError> {
        let mut seen = HashSet::new();
        let applies = (2..=4).contains(&checks.len())
            && checks.iter().all(|c| c.cost > 0 && !c.shadow)
            && checks.iter().all(|c| seen.insert((c.limit, c.user)));
        if !applies {
            return Ok(false);
        }
        let charges: Vec<RateCharge<'_>> = checks
            .iter()
            .zip(users)
            .map(|(c, user)| RateCharge {
                limit: &limits[c.limit].0,
                partition: user,
                quota: limits[c.limit].1,
                cost: c.cost,
            })
            .collect();
        let stored: Vec<Option<u64>> = checks
            .iter()
            .map(|c| model.get(&(c.limit, c.user)).copied())
            .collect();
        let model_charges: Vec<Charge> = checks
            .iter()
            .map(|c| Charge::new(limits[c.limit].1, c.cost))
            .collect();
        let mut expected = vec![Decision::default(); checks.len()];
        let verdict = check_all(&model_charges, &stored, now, &mut expected)
            .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
        let mut out = vec![Decision::default(); checks.len()];
        let charged = store.try_charge_rates(&charges, &mut out);
        let alive = stored.iter().all(|tat| tat.is_some_and(|tat| tat > now));
        if !verdict.allowed || stored.contains(&None) {
            // A refusal, or a bucket never made: the full path's.
            prop_assert_eq!(charged, None);
        } else if alive {
            prop_assert_eq!(charged, Some(now));
        } else {
            // A full bucket may have been swept (then it is not held) or
            // not (then it is charged as the model charges it).
            prop_assert!(charged.is_none() || charged == Some(now));
        }
        if charged.is_none() {
            return Ok(false);
        }
        prop_assert_eq!(&out, &expected);
        for (c, decision) in checks.iter().zip(&expected) {
            if let Some(write) = decision.store {
                model.insert((c.limit, c.user), write.tat_us);
            }
        }
        Ok(true)
    }
}
