//! The cost of a check while Redis is down and the breaker is open, side by
//! side with a plain in-memory check in the same run.
//!
//! `FallbackStorage` wraps a `RedisStorage` pointed at a closed loopback
//! port; one failed check opens the breaker (threshold 1, a one-hour
//! cool-down, so no probe happens during the run). After that every check is
//! decided by the local store, with no call to Redis: what it adds over a
//! `MemoryStorage` of its own is the breaker's bookkeeping. Measured at the
//! store (`StorageExt::check`) and through the whole `RateTier::check`.
#![allow(clippy::unwrap_used, clippy::result_large_err, missing_docs)]

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use rate_tier_storage::StorageExt;
use rate_tier_storage::{
    BucketCheck, Decision, FallbackStorage, LimitName, MemoryStorage,
    RedisStorage, Storage,
};
use tower_rate_tier::{Quota, RateTier, storage::BreakerState};

const KEYS: usize = 1000;

/// Polls a future that completes without waiting (memory, breaker open).
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("an open breaker never waits"),
    }
}

/// A port nothing listens on: bound, then released.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A fallback store around an unreachable Redis, breaker open.
fn open_fallback(runtime: &tokio::runtime::Runtime) -> FallbackStorage {
    let _guard = runtime.enter();
    let url = format!("redis://127.0.0.1:{}/", closed_port());
    let redis = RedisStorage::from_url(&url).unwrap();
    let store = FallbackStorage::builder(Arc::new(redis))
        .failure_threshold(1)
        .cool_down(Duration::from_secs(3600), Duration::from_secs(3600))
        .build();
    let free = LimitName::new("free").unwrap();
    let check =
        [
            BucketCheck::new(&free, "opener", Quota::per_second(1_000_000), 1)
                .unwrap(),
        ];
    let mut out = [Decision::default()];
    let decided = runtime.block_on(store.check(&check, &mut out)).unwrap();
    assert!(
        decided.verdict.allowed,
        "the local store decides while Redis is down"
    );
    assert_eq!(store.state(), BreakerState::Open);
    store
}

fn users() -> Vec<String> {
    (0..KEYS).map(|i| format!("user-{i:04}")).collect()
}

fn storage(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fallback = open_fallback(&runtime);
    let memory = MemoryStorage::new();
    let quota = Quota::per_second(1_000_000);
    let users = users();
    let mut group = c.benchmark_group("breaker_open/storage");
    let stores: [(&str, &dyn Storage); 2] =
        [("memory", &memory), ("fallback_open", &fallback)];
    let free = LimitName::new("free").unwrap();
    for (name, store) in stores {
        group.bench_function(name, |b| {
            let mut i = 0;
            let mut out = [Decision::default()];
            b.iter(|| {
                i = (i + 1) % KEYS;
                let check =
                    [BucketCheck::new(&free, &users[i], quota, 1).unwrap()];
                ready(store.check(black_box(&check), &mut out)).unwrap()
            })
        });
    }
    group.finish();
    assert_eq!(fallback.state(), BreakerState::Open);
}

fn rate_tier(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fallback = open_fallback(&runtime);
    let limiter = |storage: Option<Arc<dyn Storage>>| {
        let builder =
            RateTier::builder().tier("free", Quota::per_second(1_000_000));
        match storage {
            Some(storage) => builder.storage(storage),
            None => builder,
        }
        .build()
    };
    let users = users();
    let mut group = c.benchmark_group("breaker_open/rate_tier");
    let limiters = [
        ("memory", limiter(None)),
        ("fallback_open", limiter(Some(Arc::new(fallback.clone())))),
    ];
    for (name, limiter) in limiters {
        group.bench_function(name, |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % KEYS;
                ready(limiter.check(black_box(&users[i]), "free", 1)).unwrap()
            })
        });
    }
    group.finish();
    assert_eq!(fallback.state(), BreakerState::Open);
}

criterion_group!(benches, storage, rate_tier);
criterion_main!(benches);
