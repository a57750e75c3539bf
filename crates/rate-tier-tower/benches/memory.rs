//! Resident size of the in-memory store: at the start, after `--keys`
//! (1M) distinct buckets, and after their period has passed with the store
//! idle (nothing calls it; only its own background sweeper runs). `cargo
//! xtask bench` runs it once per store, each in a process of its own so that
//! the sizes do not mix:
//!
//! - `--store ours`: `MemoryStorage` built inside a Tokio runtime (so its
//!   idle sweeper runs) with `--sweep-secs` between sweeps, on a
//!   `FakeClock`. The clock stands still while the keys go in (so all of
//!   them are live at the peak), then moves past the period; the sweeper
//!   runs on real time. Then a second wave of as many new keys, the same
//!   way: whether the memory freed by the first is reused.
//! - `--store governor`: governor's keyed limiter, the same keys and quota,
//!   waiting as long. It forgets nothing unless `retain_recent` is called,
//!   and this measures what happens without any manual call.
//!
//! Sizes are VmRSS from /proc/self/status (KiB).
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{BucketCheck, Decision, LimitName, MemoryStorage};
use support::{Args, Results, rss_kib};
use tower_rate_tier::Quota;

fn main() {
    let args = Args::parse();
    let store = args.get("store").unwrap_or("ours").to_owned();
    let keys: usize = args.num("keys", 1_000_000);
    let sweep = args.secs("sweep-secs", 1.0);
    // How long to wait for the store to empty, at most, once the period is over.
    let idle_max = args.secs("idle-secs", sweep.as_secs_f64() * 2.0 + 2.0);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut results = Results::default();
    results.text("store", &store).num("keys", keys as f64);
    runtime.block_on(async {
        match store.as_str() {
            "ours" => ours(keys, sweep, idle_max, &mut results).await,
            "governor" => governor(keys, idle_max, &mut results).await,
            other => panic!("--store {other:?}: expected ours or governor"),
        }
    });
    results.write(&args);
}

/// Fills `user` with the id of key `i`, without allocating a new string.
fn user_id(user: &mut String, i: usize) {
    user.clear();
    write!(user, "user-{i:08}").unwrap();
}

async fn ours(
    keys: usize,
    sweep: Duration,
    idle_max: Duration,
    results: &mut Results,
) {
    let quota = Quota::per_minute(10);
    let clock = FakeClock::new();
    let store = MemoryStorage::builder()
        .clock(clock.clone())
        .sweep_interval(sweep)
        .build();
    let baseline = rss_kib();
    results.num("baseline_kib", baseline as f64);
    let free = LimitName::new("free").unwrap();

    // Two waves of distinct keys: the second shows whether memory freed by
    // the first is reused (a bounded process) or lost (a growing one).
    for wave in 0..2 {
        let start = Instant::now();
        let mut user = String::new();
        for i in wave * keys..(wave + 1) * keys {
            user_id(&mut user, i);
            let check = [BucketCheck::new(&free, &user, quota, 1).unwrap()];
            let mut out = [Decision::default()];
            assert!(
                store.check_sync(&check, &mut out).unwrap().verdict.allowed
            );
        }
        let insert_secs = start.elapsed().as_secs_f64();
        let held = store.len();
        let after_insert = rss_kib();
        println!(
            "memory (ours), wave {}: {keys} keys in {insert_secs:.2} s; {held} buckets; \
             RSS {baseline} KiB -> {after_insert} KiB",
            wave + 1
        );

        // The period passes; the store sits idle while its sweeper runs.
        clock.advance(quota.period());
        let idle_start = Instant::now();
        let mut emptied_after = None;
        while idle_start.elapsed() < idle_max {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if store.is_empty() {
                emptied_after = Some(idle_start.elapsed());
                break;
            }
        }
        // A moment more, for the allocator to hand memory back if it does.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after_idle = rss_kib();
        let left = store.len();
        println!(
            "memory (ours), wave {}: idle, period over: {left} buckets left{}; RSS {after_idle} KiB",
            wave + 1,
            match emptied_after {
                Some(t) => format!(" (empty after {:.1} s)", t.as_secs_f64()),
                None => format!(" after {:.1} s", idle_max.as_secs_f64()),
            }
        );
        let prefix = if wave == 0 { "" } else { "wave2_" };
        results
            .num(&format!("{prefix}after_insert_kib"), after_insert as f64)
            .num(&format!("{prefix}after_idle_kib"), after_idle as f64)
            .num(&format!("{prefix}held_after_insert"), held as f64)
            .num(&format!("{prefix}held_after_idle"), left as f64)
            .num(&format!("{prefix}insert_secs"), insert_secs)
            .num(
                &format!("{prefix}emptied_after_secs"),
                emptied_after.map_or(f64::NAN, |t| t.as_secs_f64()),
            );
    }
    results.num("sweep_secs", sweep.as_secs_f64());
    drop(store);
}

async fn governor(keys: usize, idle: Duration, results: &mut Results) {
    let limiter: governor::DefaultKeyedRateLimiter<String> =
        governor::RateLimiter::keyed(governor::Quota::per_minute(
            NonZeroU32::new(10).unwrap(),
        ));
    let baseline = rss_kib();
    let start = Instant::now();
    let mut user = String::new();
    for i in 0..keys {
        user_id(&mut user, i);
        assert!(limiter.check_key(&user).is_ok());
    }
    let insert_secs = start.elapsed().as_secs_f64();
    let held = limiter.len();
    let after_insert = rss_kib();
    println!(
        "memory (governor): {keys} keys in {insert_secs:.2} s; {held} buckets; \
         RSS {baseline} KiB -> {after_insert} KiB"
    );
    tokio::time::sleep(idle).await;
    let after_idle = rss_kib();
    let left = limiter.len();
    println!(
        "memory (governor): idle {:.1} s, no retain_recent(): {left} buckets; RSS {after_idle} KiB",
        idle.as_secs_f64()
    );
    results
        .num("baseline_kib", baseline as f64)
        .num("after_insert_kib", after_insert as f64)
        .num("after_idle_kib", after_idle as f64)
        .num("held_after_insert", held as f64)
        .num("held_after_idle", left as f64)
        .num("insert_secs", insert_secs);
}
