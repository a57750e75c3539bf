//! Several limits in one decision, in memory: a user's tier and two more
//! per-user limits through `RateTier::decide` (one decision, all or
//! nothing), against the same user's tier alone through `RateTier::check`.
//! Both on the default memory store, in the same process and loop shape:
//! one hot user, and 100,000 users round-robin.
//!
//! `cargo xtask bench` runs this (criterion, quick mode) for the row
//! "3 limits / 1 limit" (goal: < 3).
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use rate_tier_storage::{BucketCheck, Decision, LimitName, MemoryStorage};
use support::hot::ready;
use tower_rate_tier::{Limit, LimitRequest, Quota, RateTier};

const USERS: usize = 100_000;

/// 1 per µs with a burst of about 71 minutes: a hot user at a few million
/// checks/s never runs out, so every call reads, decides and writes (a
/// refusal writes nothing and would flatter the slower case).
fn quota() -> Quota {
    Quota::per_second(1_000_000).allow_burst(u32::MAX)
}

fn limiter() -> RateTier {
    RateTier::builder().tier("free", quota()).build()
}

fn limits(c: &mut Criterion) {
    let users: Vec<String> =
        (0..USERS).map(|i| format!("user-{i:08}")).collect();
    let route = Limit::new("route", quota());
    let tokens = Limit::new("tokens", quota());
    for (name, spread) in [("one_user", 1), ("100k_users", USERS)] {
        let mut group = c.benchmark_group(format!("limits/{name}"));
        let one = limiter();
        group.bench_function("one_limit", |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % spread;
                let info = ready(one.check(black_box(&users[i]), "free", 1));
                assert!(info.unwrap().is_ok());
            })
        });
        let three = limiter();
        group.bench_function("three_limits", |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % spread;
                // Built per call, as a layer builds it per request.
                let request =
                    LimitRequest::new(black_box(&users[i]), "free", 1)
                        .limit(&route, 1)
                        .limit(&tokens, 1);
                assert!(ready(three.decide(&request)).unwrap().is_ok());
            })
        });
        group.finish();
    }
}

/// The store alone (`MemoryStorage::check_sync`, one hot user): where the
/// time of the rows above goes, the limiter's part or the store's.
fn store_alone(c: &mut Criterion) {
    let names = ["free", "route", "tokens"].map(|n| LimitName::new(n).unwrap());
    let mut group = c.benchmark_group("limits/store_one_user");
    let store = MemoryStorage::new();
    let mut out = [Decision::default(); 3];
    group.bench_function("one_bucket", |b| {
        b.iter(|| {
            let check =
                [BucketCheck::new(&names[0], black_box("user-1"), quota(), 1)
                    .unwrap()];
            store
                .check_sync(&check, &mut out[..1])
                .unwrap()
                .verdict
                .allowed
        })
    });
    let store = MemoryStorage::new();
    group.bench_function("three_buckets", |b| {
        b.iter(|| {
            let check = names.each_ref().map(|name| {
                BucketCheck::new(name, black_box("user-1"), quota(), 1).unwrap()
            });
            store.check_sync(&check, &mut out).unwrap().verdict.allowed
        })
    });
    group.finish();
}

criterion_group!(benches, limits, store_alone);
criterion_main!(benches);
