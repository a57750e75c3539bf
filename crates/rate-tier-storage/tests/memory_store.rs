//! `MemoryStorage` on its own: atomicity under threads, bucket identity,
//! sweeping of dead entries, the capacity bound, refused inputs. Plain
//! threads and a fake clock: no runtime (so no background sweeper), no sleep.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{
    BucketCheck, CheckError, MemoryStorage, Quota, Storage, StorageError,
};

const START_US: u64 = 1_790_947_094_000_000;

fn free() -> Quota {
    Quota::per_minute(10)
}

fn allowed(
    store: &MemoryStorage,
    tier: &str,
    user: &str,
    quota: Quota,
    cost: u32,
) -> bool {
    store
        .check_sync(&BucketCheck::new(tier, user, quota, cost))
        .unwrap()
        .allowed
}

/// `threads` threads, released together, each making `per_thread` checks of
/// `cost` on one bucket: how many were allowed.
fn hammer(
    quota: Quota,
    cost: u32,
    threads: usize,
    per_thread: usize,
) -> (usize, MemoryStorage) {
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::with_clock(clock);
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let store = store.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                (0..per_thread)
                    .filter(|_| allowed(&store, "free", "ana", quota, cost))
                    .count()
            })
        })
        .collect();
    let total = handles.into_iter().map(|h| h.join().unwrap()).sum();
    (total, store)
}

#[test]
fn threads_on_one_key_get_exactly_the_burst() {
    let (n, store) = hammer(free(), 1, 8, 250);
    assert_eq!(n, 10);
    assert_eq!(store.len(), 1);
}

#[test]
fn threads_on_one_key_get_exactly_a_large_burst() {
    let (n, _) = hammer(Quota::per_minute(1000), 1, 8, 500);
    assert_eq!(n, 1000);
}

#[test]
fn threads_with_cost_3_on_a_burst_of_10_get_exactly_3() {
    let (n, _) = hammer(free(), 3, 8, 100);
    assert_eq!(n, 3);
}

#[test]
fn threads_on_many_new_keys_lose_no_update() {
    // Every thread races on the same 50 fresh keys: the insert path
    // (write lock, re-check) must not lose a check either.
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::with_clock(clock);
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let store = store.clone();
            let barrier = barrier.clone();
            thread::spawn(move || {
                barrier.wait();
                let mut per_key = vec![0usize; 50];
                for _ in 0..3 {
                    for (k, count) in per_key.iter_mut().enumerate() {
                        if allowed(
                            &store,
                            "free",
                            &format!("user{k}"),
                            free(),
                            1,
                        ) {
                            *count += 1;
                        }
                    }
                }
                per_key
            })
        })
        .collect();
    let mut per_key = vec![0usize; 50];
    for handle in handles {
        for (total, n) in per_key.iter_mut().zip(handle.join().unwrap()) {
            *total += n;
        }
    }
    assert_eq!(per_key, vec![10; 50]);
    assert_eq!(store.len(), 50);
}

#[test]
fn distinct_keys_are_independent() {
    let store = MemoryStorage::with_clock(FakeClock::at_us(START_US));
    for user in ["ana", "bea", "eva"] {
        let passed = (0..15)
            .filter(|_| allowed(&store, "free", user, free(), 1))
            .count();
        assert_eq!(passed, 10, "{user}");
    }
    assert_eq!(store.len(), 3);
}

#[test]
fn the_same_user_in_two_tiers_has_two_buckets() {
    let store = MemoryStorage::with_clock(FakeClock::at_us(START_US));
    assert!(allowed(&store, "free", "ana", free(), 10));
    assert!(!allowed(&store, "free", "ana", free(), 1));
    let d = store
        .check_sync(&BucketCheck::new("pro", "ana", free(), 1))
        .unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 9);
    assert_eq!(store.len(), 2);
}

#[test]
fn tier_and_user_boundaries_are_part_of_the_key() {
    // ("ab", "c") and ("a", "bc") concatenate to the same bytes.
    let store = MemoryStorage::with_clock(FakeClock::at_us(START_US));
    assert!(allowed(&store, "ab", "c", free(), 10));
    assert!(!allowed(&store, "ab", "c", free(), 1));
    let d = store
        .check_sync(&BucketCheck::new("a", "bc", free(), 1))
        .unwrap();
    assert!(
        d.allowed,
        "(\"a\", \"bc\") must not share (\"ab\", \"c\")'s bucket"
    );
    assert_eq!(d.remaining, 9);
    // And the empty splits.
    assert!(allowed(&store, "abc", "", free(), 1));
    assert_eq!(store.len(), 3);
}

#[test]
fn dead_entries_are_swept_and_live_ones_kept() {
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::with_clock(clock.clone());
    for k in 0..100 {
        assert!(allowed(&store, "free", &format!("u{k}"), free(), 1));
    }
    // One key with a full minute of TAT.
    assert!(allowed(&store, "free", "heavy", free(), 10));
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
    let d = store
        .check_sync(&BucketCheck::new("free", "heavy", free(), 1))
        .unwrap();
    assert!(d.allowed);
    assert_eq!((d.remaining, d.reset_after_us), (0, 60_000_000));
    assert!(!allowed(&store, "free", "heavy", free(), 1));
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
    // on insert is per shard (64 shards, at most once per interval each,
    // see memory.rs), so one new key sweeps one shard; enough new keys to
    // reach every shard sweep them all. With 2 000 old keys, the chance
    // that the first new key's shard held none of them is (63/64)^2000
    // (~1e-14); with 2 560 new keys, that some shard got none is ~1e-16.
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::builder()
        .clock(clock.clone())
        .sweep_interval(Duration::from_secs(1))
        .build();
    let old = 2_000;
    for k in 0..old {
        assert!(allowed(&store, "free", &format!("old{k}"), free(), 1));
    }
    assert_eq!(store.len(), old);

    // Past the interval, but the entries are live (6 s TAT): kept.
    clock.advance(Duration::from_secs(2));
    assert!(allowed(&store, "free", "live-check", free(), 1));
    assert_eq!(store.len(), old + 1);

    // Past the period and the interval: the next insert sweeps its shard.
    clock.advance(Duration::from_secs(60));
    assert!(allowed(&store, "free", "new0", free(), 1));
    assert!(
        store.len() < old + 2,
        "len {} after one insert",
        store.len()
    );

    let new = 2_560;
    for k in 1..new {
        assert!(allowed(&store, "free", &format!("new{k}"), free(), 1));
    }
    assert_eq!(
        store.len(),
        new,
        "every dead entry swept, every new one kept"
    );
}

#[test]
fn a_full_store_refuses_new_buckets_until_they_expire() {
    // Capacity 64 is one bucket per shard: among 65 new keys at least one
    // must find its shard full of a live bucket.
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::builder()
        .clock(clock.clone())
        .capacity(64)
        .build();
    assert_eq!(store.capacity(), 64);
    let mut refused = Vec::new();
    for k in 0..65 {
        let user = format!("u{k}");
        match store.check_sync(&BucketCheck::new("free", &user, free(), 1)) {
            Ok(d) => assert!(d.allowed),
            Err(StorageError::CapacityExceeded { capacity }) => {
                assert_eq!(capacity, 64);
                refused.push(user);
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert!(!refused.is_empty());
    assert_eq!(store.len(), 65 - refused.len());
    assert!(store.len() <= 64);

    // A live bucket already held is still checked normally.
    let d = store
        .check_sync(&BucketCheck::new("free", "u0", free(), 1))
        .unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 8);

    // Not yet expired: still refused.
    clock.advance(Duration::from_secs(5));
    assert!(matches!(
        store.check_sync(&BucketCheck::new("free", &refused[0], free(), 1)),
        Err(StorageError::CapacityExceeded { .. })
    ));
    // Once the live buckets expired, a refused key gets in (each in turn:
    // two refused keys may share a shard of one bucket).
    for user in &refused {
        clock.advance(Duration::from_secs(60));
        let d = store
            .check_sync(&BucketCheck::new("free", user, free(), 1))
            .unwrap();
        assert!(d.allowed);
        assert_eq!(d.remaining, 9);
    }
}

/// The capacity is an exact bound on the buckets held, whatever the shards:
/// a regression test for a per-shard bound that let `capacity(100)` hold
/// 128 and made small capacities refuse far too early.
#[test]
fn the_capacity_is_an_upper_bound_on_live_buckets() {
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::builder()
        .clock(clock.clone())
        .capacity(100)
        .build();
    // 5 000 distinct keys: every shard fills up (the chance that one of the
    // 64 shards got fewer than 3 of them is below 1e-30).
    for k in 0..5_000 {
        let user = format!("u{k}");
        match store.check_sync(&BucketCheck::new("free", &user, free(), 1)) {
            Ok(_) | Err(StorageError::CapacityExceeded { .. }) => {}
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(store.len(), 100, "exactly the capacity, not less");
}

#[test]
fn refused_inputs_store_nothing() {
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::with_clock(clock);
    let zero = BucketCheck::new("free", "ana", free(), 0);
    assert!(matches!(
        store.check_sync(&zero),
        Err(StorageError::Check(CheckError::ZeroCost))
    ));
    assert_eq!(store.len(), 0);
    let too_much = BucketCheck::new("free", "ana", free(), 11);
    assert!(matches!(
        store.check_sync(&too_much),
        Err(StorageError::Check(CheckError::CostExceedsBurst {
            cost: 11,
            burst: 10
        }))
    ));
    assert_eq!(store.len(), 0);
    // Through the trait as well.
    assert!(store.check_local(&too_much).unwrap().is_err());
    assert_eq!(store.len(), 0);

    // On an existing bucket: nothing changes either.
    assert!(allowed(&store, "free", "ana", free(), 4));
    assert!(store.check_sync(&zero).is_err());
    assert!(store.check_sync(&too_much).is_err());
    // A refused (429) decision does not move the TAT either.
    assert!(!allowed(&store, "free", "ana", free(), 7));
    assert_eq!(store.len(), 1);
    let d = store
        .check_sync(&BucketCheck::new("free", "ana", free(), 1))
        .unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 5, "only the 4 and this 1 were charged");
    assert_eq!(d.reset_after_us, 30_000_000);
}

#[test]
fn the_store_is_memory_and_decides_without_io() {
    let store = MemoryStorage::with_clock(FakeClock::at_us(START_US));
    assert_eq!(store.kind(), "memory");
    let check = BucketCheck::new("free", "ana", free(), 1);
    let local = store.check_local(&check).unwrap().unwrap();
    assert_eq!(local.now_us, START_US, "the store's clock, when it decided");
    let d = local.decision;
    assert_eq!(
        (d.allowed, d.remaining, d.reset_after_us),
        (true, 9, 6_000_000)
    );
    // Clones share the buckets.
    let clone = store.clone();
    assert_eq!(clone.check_sync(&check).unwrap().remaining, 8);
    assert_eq!(store.len(), 1);
}

#[test]
fn huge_ids_are_distinct_buckets_of_fixed_size() {
    let store = MemoryStorage::with_clock(FakeClock::at_us(START_US));
    let mut a = "k".repeat(64 * 1024);
    let b = format!("{a}x");
    // Ten from the first id exhaust its bucket, not the second's.
    for _ in 0..10 {
        assert!(allowed(&store, "free", &a, free(), 1));
    }
    assert!(!allowed(&store, "free", &a, free(), 1));
    assert!(allowed(&store, "free", &b, free(), 1));
    // Same id again, built anew: the same bucket.
    a = "k".repeat(64 * 1024);
    assert!(!allowed(&store, "free", &a, free(), 1));
    assert_eq!(store.len(), 2);
}
