//! Resident size of the in-memory store through waves of keys, and after
//! each wave once its period has passed with the store idle (nothing calls
//! it; only its own background sweeper runs). `cargo xtask bench` runs it
//! once per store, each in a process of its own so that the sizes do not
//! mix:
//!
//! - `--store ours`: `MemoryStorage` built inside a Tokio runtime (so its
//!   idle sweeper runs) with `--sweep-secs` between sweeps, on a
//!   `FakeClock`. Waves of distinct keys (`--waves`, default 1M, 500k, 1M,
//!   250k, 1M: sizes that differ, so that a table that shrinks and grows
//!   again is covered), each going in with the clock standing still (every
//!   bucket live at the peak), then the clock moves past the period and the
//!   RSS is read once the sweeper has emptied the store and finished the
//!   sweep after it (memory given back included). Reported
//!   (`MemoryResults`): each wave's peak and idle RSS (`waves`, `settled`
//!   false if `--idle-secs` ran out first), and the worst idle growth over
//!   the baseline, its wave, and its share of the peak growth.
//! - `--store governor`: governor's keyed limiter, the first wave's keys and
//!   quota, waiting as long. It forgets nothing unless `retain_recent` is
//!   called, and this measures what happens without any manual call
//!   (`GovernorMemoryResults`).
//!
//! Sizes are VmRSS from /proc/self/status (KiB).
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::fmt::Write as _;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use rate_tier_bench_results::{
    GovernorMemoryResults, MemoryResults, MemoryWave,
};
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{BucketCheck, Decision, LimitName, MemoryStorage};
use support::{Args, rss_kib, write_results};
use tower_rate_tier::Quota;

fn main() {
    let args = Args::parse();
    let store = args.get("store").unwrap_or(MemoryResults::STORE).to_owned();
    let keys: usize = args.num("keys", 1_000_000);
    // Wave sizes, as multiples of --keys in thousandths.
    let waves: Vec<usize> = args
        .get("waves")
        .unwrap_or("1000,500,1000,250,1000")
        .split(',')
        .map(|w| w.trim().parse::<usize>().unwrap() * keys / 1000)
        .collect();
    let sweep = args.secs("sweep-secs", 1.0);
    // How long to wait for the store to empty, at most, once the period is over.
    let idle_max = args.secs("idle-secs", sweep.as_secs_f64() * 2.0 + 2.0);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        match store.as_str() {
            MemoryResults::STORE => {
                let mut results = ours(&waves, sweep, idle_max).await;
                results.keys = Some(keys as u64);
                write_results(&results, &args);
            }
            GovernorMemoryResults::STORE => {
                let results = governor(keys, idle_max).await;
                write_results(&results, &args);
            }
            other => panic!(
                "--store {other:?}: expected {} or {}",
                MemoryResults::STORE,
                GovernorMemoryResults::STORE
            ),
        }
    });
}

/// Fills `user` with the id of key `i`, without allocating a new string.
fn user_id(user: &mut String, i: usize) {
    user.clear();
    write!(user, "user-{i:08}").unwrap();
}

async fn ours(
    waves: &[usize],
    sweep: Duration,
    idle_max: Duration,
) -> MemoryResults {
    let quota = Quota::per_minute(10);
    let clock = FakeClock::new();
    let store = MemoryStorage::builder()
        .clock(clock.clone())
        .sweep_interval(sweep)
        .build();
    let baseline = rss_kib();
    let mut results = MemoryResults {
        baseline_kib: Some(baseline),
        sweep_secs: Some(sweep.as_secs_f64()),
        ..MemoryResults::default()
    };
    let free = LimitName::new("free").unwrap();
    let (mut peak, mut worst_idle, mut worst_wave) = (baseline, 0u64, 0);
    let mut unsettled = 0usize;
    let mut next = 0usize;
    let mut out = [Decision::default()];
    for (wave, &keys) in waves.iter().enumerate() {
        let start = Instant::now();
        let mut user = String::new();
        for i in next..next + keys {
            user_id(&mut user, i);
            let check = [BucketCheck::new(&free, &user, quota, 1).unwrap()];
            assert!(
                store.check_sync(&check, &mut out).unwrap().verdict.allowed
            );
        }
        next += keys;
        let insert_secs = start.elapsed().as_secs_f64();
        let held = store.len();
        let after_insert = rss_kib();
        peak = peak.max(after_insert);
        println!(
            "memory (ours), wave {}: {keys} keys in {insert_secs:.2} s; {held} buckets; \
             RSS {baseline} KiB -> {after_insert} KiB",
            wave + 1
        );

        // The period passes; the store sits idle while its sweeper runs.
        // Read once a whole sweep has run after the store emptied: the
        // memory it gives back is given back by then.
        clock.advance(quota.period());
        let idle_start = Instant::now();
        let mut emptied_after = None;
        while idle_start.elapsed() < idle_max {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if store.is_empty() {
                emptied_after = Some(idle_start.elapsed());
                break;
            }
        }
        let sweeps = store.sweeps();
        while store.sweeps() < sweeps + 1 && idle_start.elapsed() < idle_max {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Read before the sweep after emptying finished: not what it claims.
        let settled = emptied_after.is_some() && store.sweeps() > sweeps;
        unsettled += usize::from(!settled);
        let after_idle = rss_kib();
        let idle_growth = after_idle.saturating_sub(baseline);
        if idle_growth >= worst_idle {
            (worst_idle, worst_wave) = (idle_growth, wave + 1);
        }
        let left = store.len();
        println!(
            "memory (ours), wave {}: idle, period over: {left} buckets left{}; RSS {after_idle} KiB",
            wave + 1,
            match emptied_after {
                Some(t) => format!(" (empty after {:.1} s)", t.as_secs_f64()),
                None => format!(" after {:.1} s", idle_max.as_secs_f64()),
            }
        );
        results.waves.push(MemoryWave {
            keys: Some(keys as u64),
            settled: Some(settled),
            after_insert_kib: Some(after_insert),
            after_idle_kib: Some(after_idle),
            held_after_insert: Some(held as u64),
            held_after_idle: Some(left as u64),
            insert_secs: Some(insert_secs),
            emptied_after_secs: emptied_after.map(|t| t.as_secs_f64()),
        });
    }
    let peak_growth = peak.saturating_sub(baseline);
    println!(
        "memory (ours): {} waves; peak growth {peak_growth} KiB; worst idle growth \
         {worst_idle} KiB, wave {worst_wave} ({:.4} of the peak growth); {unsettled} \
         waves read before the sweeper was done",
        waves.len(),
        worst_idle as f64 / peak_growth.max(1) as f64
    );
    results.unsettled_waves = Some(unsettled as u64);
    results.peak_growth_kib = Some(peak_growth);
    results.worst_idle_growth_kib = Some(worst_idle);
    results.worst_idle_wave = Some(worst_wave as u64);
    results.worst_idle_ratio =
        Some(worst_idle as f64 / peak_growth.max(1) as f64);
    drop(store);
    results
}

async fn governor(keys: usize, idle: Duration) -> GovernorMemoryResults {
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
    GovernorMemoryResults {
        keys: Some(keys as u64),
        baseline_kib: Some(baseline),
        after_insert_kib: Some(after_insert),
        after_idle_kib: Some(after_idle),
        held_after_insert: Some(held as u64),
        held_after_idle: Some(left as u64),
        insert_secs: Some(insert_secs),
    }
}
