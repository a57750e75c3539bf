//! The cost of reading the time, one reading per iteration: the default
//! clock (the CPU's counter from an anchor each thread takes again every
//! second on the wall clock), the counter alone from one anchor taken
//! once (what the default was before it followed the wall clock), the wall
//! clock itself (`SystemTime::now`, a vDSO call on Linux), and a fake
//! clock (an atomic load), so that the price of following the wall clock
//! is read beside the alternatives.
//!
//! `cargo bench -p rate-tier-storage --bench clocks`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use rate_tier_storage::clock::{Clock, FakeClock, MonotonicClock, SystemClock};

fn clocks(c: &mut Criterion) {
    let mut group = c.benchmark_group("clocks");
    group.bench_function("monotonic_following_the_wall", |b| {
        b.iter(|| black_box(MonotonicClock.now_us()))
    });
    let counter = quanta::Clock::new();
    let anchor = (counter.raw(), SystemClock.now_us());
    group.bench_function("counter_from_one_anchor", |b| {
        b.iter(|| {
            let elapsed = counter.delta_as_nanos(anchor.0, counter.raw());
            black_box(anchor.1 + elapsed / 1000)
        })
    });
    group.bench_function("system", |b| {
        b.iter(|| black_box(SystemClock.now_us()))
    });
    let fake = FakeClock::at_us(1);
    group.bench_function("fake", |b| b.iter(|| black_box(fake.now_us())));
    group.finish();
}

criterion_group!(benches, clocks);
criterion_main!(benches);
