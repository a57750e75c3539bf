//! The hot path, side by side with governor's keyed limiter.
//!
//! `cargo xtask bench` runs this (quick mode) and writes BENCHMARKS.md.
//! Every comparison runs both limiters in the same process, on the same
//! keys, in the same loop shape: ratios are what to read, not absolute times.
#![allow(clippy::unwrap_used, clippy::result_large_err, missing_docs)]

mod support;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use rate_tier_storage::{BucketCheck, Decision, LimitName, MemoryStorage};
use support::hot::{self, governor, ours, ready};
use tower_rate_tier::Quota;

const KEYS: usize = 100_000;

fn user_ids() -> Vec<String> {
    hot::user_ids(KEYS)
}

fn decision(c: &mut Criterion) {
    let quota = Quota::per_minute(10);
    let mut group = c.benchmark_group("gcra_core");
    group.bench_function("decision", |b| {
        let mut now = 1_790_947_155_000_000u64;
        b.iter(|| {
            now += 7_000_000;
            black_box(quota.check(black_box(Some(now)), now, 1))
        })
    });
    group.finish();
}

fn one_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory/one_key");
    // One key for both, the same `String`, passed the same way.
    let key = "user-1".to_owned();
    let limiter = ours();
    group.bench_function("tower_rate_tier", |b| {
        b.iter(|| ready(limiter.check(black_box(&key), "free", 1)).unwrap())
    });
    let free = limiter.sync_tier("free").unwrap();
    group.bench_function("sync_tier", |b| {
        b.iter(|| free.check(black_box(&key), 1).unwrap())
    });
    let gov = governor();
    group.bench_function("governor", |b| {
        b.iter(|| gov.check_key(black_box(&key)))
    });
    // The store alone, without the limiter around it: where the time goes.
    let store = MemoryStorage::new();
    let quota = Quota::per_second(1_000_000);
    let free = LimitName::new("free").unwrap();
    group.bench_function("memory_store_alone", |b| {
        b.iter(|| {
            let check =
                [BucketCheck::new(&free, black_box(&key), quota, 1).unwrap()];
            let mut out = [Decision::default()];
            store.check_sync(&check, &mut out).unwrap();
            out[0]
        })
    });
    group.finish();
}

fn many_keys(c: &mut Criterion) {
    let users = user_ids();
    let mut group = c.benchmark_group("memory/100k_keys");
    let limiter = ours();
    group.bench_function("tower_rate_tier", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % KEYS;
            ready(limiter.check(&users[i], "free", 1)).unwrap()
        })
    });
    let free = limiter.sync_tier("free").unwrap();
    group.bench_function("sync_tier", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % KEYS;
            free.check(&users[i], 1).unwrap()
        })
    });
    let gov = governor();
    group.bench_function("governor", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % KEYS;
            gov.check_key(&users[i])
        })
    });
    group.finish();
}

/// `iters` checks split over two threads; the time until both are done.
fn two_threads<F>(iters: u64, work: Arc<F>) -> Duration
where
    F: Fn(usize, u64) + Send + Sync + 'static,
{
    let start = Instant::now();
    let handles: Vec<_> = (0..2)
        .map(|thread| {
            let work = work.clone();
            std::thread::spawn(move || work(thread, iters / 2))
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    start.elapsed()
}

/// `check` of `users`' ids, the first `spread` of them in turn, on two
/// threads: a timing for criterion's `iter_custom`.
fn on_two_threads<F>(
    users: &Arc<Vec<String>>,
    spread: usize,
    check: F,
) -> impl FnMut(u64) -> Duration
where
    F: Fn(&String) + Send + Sync + 'static,
{
    let (users, check) = (users.clone(), Arc::new(check));
    move |iters| {
        let (users, check) = (users.clone(), check.clone());
        two_threads(
            iters,
            Arc::new(move |thread: usize, n: u64| {
                let mut i = thread * 7919;
                for _ in 0..n {
                    i = (i + 1) % spread;
                    check(&users[i]);
                }
            }),
        )
    }
}

fn threads(c: &mut Criterion) {
    let users = Arc::new(user_ids());
    for (name, spread) in [("one_key", 1), ("100k_keys", KEYS)] {
        let mut group = c.benchmark_group(format!("memory/2_threads_{name}"));
        let limiter = ours();
        let check = {
            let limiter = limiter.clone();
            move |id: &String| {
                ready(limiter.check(id, "free", 1)).unwrap().ok();
            }
        };
        group.bench_function("tower_rate_tier", |b| {
            b.iter_custom(on_two_threads(&users, spread, check.clone()))
        });
        let free = limiter.sync_tier("free").unwrap();
        let check = move |id: &String| {
            let _ = black_box(free.check(id, 1));
        };
        group.bench_function("sync_tier", |b| {
            b.iter_custom(on_two_threads(&users, spread, check.clone()))
        });
        let gov = Arc::new(governor());
        let check = move |id: &String| {
            gov.check_key(id).ok();
        };
        group.bench_function("governor", |b| {
            b.iter_custom(on_two_threads(&users, spread, check.clone()))
        });
        group.finish();
    }
}

/// A flood of one-shot ids into a full store: every check of a new id
/// evicts the bucket nearest to full among a sample, against checks of
/// existing buckets in a store with room, both at `FLOOD_CAPACITY`. The
/// goal: the flood costs at most a small factor of the unflooded check.
const FLOOD_CAPACITY: u64 = 100_000;

/// The id of user `i`, written into `id` (both cases pay the same for it).
fn flood_id(id: &mut String, i: u64) {
    id.clear();
    std::fmt::Write::write_fmt(id, format_args!("user-{i:016}")).unwrap();
}

fn flood(c: &mut Criterion) {
    // A charged bucket stays live 86.4 s: the flooded store is full of
    // live buckets (a dead one would be evicted first, for free), and no
    // user of the unflooded loop reaches the burst.
    let quota = Quota::per_day(1_000);
    let free = LimitName::new("free").unwrap();
    let mut group = c.benchmark_group("memory/flood");
    let mut out = [Decision::default()];
    let mut id = String::new();
    let fill =
        |store: &MemoryStorage, id: &mut String, out: &mut [Decision; 1]| {
            for i in 0..FLOOD_CAPACITY {
                flood_id(id, i);
                let check = [BucketCheck::new(&free, id, quota, 1).unwrap()];
                store.check_sync(&check, out).unwrap();
            }
        };

    // Unflooded: existing buckets, room to spare.
    let store = MemoryStorage::builder()
        .capacity(2 * FLOOD_CAPACITY as usize)
        .build();
    fill(&store, &mut id, &mut out);
    group.bench_function("unflooded", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) % FLOOD_CAPACITY;
            flood_id(&mut id, i);
            let check = [BucketCheck::new(&free, &id, quota, 1).unwrap()];
            store.check_sync(&check, &mut out).unwrap()
        })
    });

    // Flooded: the store is full of live buckets and has already taken 20
    // times its capacity of one-shot ids (each evicting a live one); every
    // check is one more.
    let store = MemoryStorage::builder()
        .capacity(FLOOD_CAPACITY as usize)
        .build();
    fill(&store, &mut id, &mut out);
    for i in FLOOD_CAPACITY..21 * FLOOD_CAPACITY {
        flood_id(&mut id, i);
        let check = [BucketCheck::new(&free, &id, quota, 1).unwrap()];
        store.check_sync(&check, &mut out).unwrap();
    }
    group.bench_function("flooded", |b| {
        let mut next = 21 * FLOOD_CAPACITY;
        b.iter(|| {
            next += 1;
            flood_id(&mut id, next);
            let check = [BucketCheck::new(&free, &id, quota, 1).unwrap()];
            store.check_sync(&check, &mut out).unwrap()
        })
    });
    assert!(store.evictions() > 0, "the flood evicted nothing");
    group.finish();
}

criterion_group!(benches, decision, one_key, many_keys, threads, flood);
criterion_main!(benches);
