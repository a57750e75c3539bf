//! `CellStorage<MemoryCells>` against `MemoryStorage`, one hot key: what
//! running gcra-core over read and compare-and-swap costs, beside the
//! store that keeps an atomic TAT per bucket.
//!
//! Run it with `cargo bench -p rate-tier-storage --bench cells`.
//!
//! Both stores on a `FakeClock` stepped 1 ms before every call, under a
//! rate of 2,000 a second: every call passes, so every call reads, decides
//! and writes its bucket. The check is built per call, as a limiter builds
//! it per request. `MemoryCells` never waits, so the cell store's future is
//! polled once; its cost is the adapter's (a key with a SHA-1 of the
//! partition, a read, a decode, gcra-core, an encode, a conditional write)
//! plus the mutex and map of the reference cells.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use rate_tier_storage::cells::{CellStorage, MemoryCells};
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{
    BucketCheck, Decision, LimitName, MemoryStorage, Quota,
};

const START_US: u64 = 1_700_000_000_000_000;

fn ready<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("an in-process store waited"),
    }
}

fn one_hot_key(c: &mut Criterion) {
    let name = LimitName::new("free").unwrap();
    let quota = Quota::per_second(2_000);
    let step = Duration::from_millis(1);
    let mut group = c.benchmark_group("cells/one_hot_key");

    let clock = FakeClock::at_us(START_US);
    let memory = MemoryStorage::with_clock(clock.clone());
    group.bench_function("memory", |b| {
        b.iter(|| {
            clock.advance(step);
            let check = [BucketCheck::new(&name, "ana", quota, 1).unwrap()];
            let mut out = [Decision::default()];
            let decided = memory.check_sync(black_box(&check), &mut out);
            assert!(decided.unwrap().verdict.allowed);
        });
    });

    let clock = FakeClock::at_us(START_US);
    let cells = CellStorage::with_clock(MemoryCells::new(), clock.clone());
    group.bench_function("cells_over_memory", |b| {
        b.iter(|| {
            clock.advance(step);
            let check = [BucketCheck::new(&name, "ana", quota, 1).unwrap()];
            let mut out = [Decision::default()];
            let decided = ready(cells.check(black_box(&check), &mut out));
            assert!(decided.unwrap().verdict.allowed);
        });
    });
    group.finish();
}

criterion_group!(benches, one_hot_key);
criterion_main!(benches);
