//! Checks/s of `RedisStorage` against the ceiling of the same server:
//! `redis-benchmark` running the same script (EVALSHA of gcra.lua, same
//! arguments, same concurrency, same key spread). `cargo xtask bench` starts
//! a throwaway Redis, loads the script and runs this.
//!
//! Ours: `--tasks` (64) Tokio tasks on a runtime with `--client-threads` (1)
//! worker, all on one multiplexed connection (`RedisStorage::from_url`, a
//! connection manager), each running `StorageExt::check` in a loop over
//! `--keys` (1000) users for `--seconds`. The peer: `redis-benchmark -c 64
//! -r 1000` (single-threaded, like our client) with
//! `EVALSHA <sha> 1 trt:bench:__rand_int__ <T> <tau> 1` for about as many
//! requests as ours did in the same time; and, as a second ceiling of the
//! same shape as ours, `redis-benchmark -c 1 -P 64` (one connection, 64
//! requests in flight). They alternate, `--rounds` times each.
//!
//! The quota (1 per µs, burst of a second) never refuses: both sides run
//! the script's full path (GET, decide, SET PX) on every call.
//!
//! Then several limits of one user: `RateTier::decide` over the
//! tier and two per-user `Limit`s on the same `RedisStorage`, one decision
//! at a time. Counted by the server over `--limits-decisions` decisions of
//! new users: the commands clients sent (`MONITOR`, which tells them from
//! those a script runs), script calls (`INFO commandstats` after `CONFIG
//! RESETSTAT`), and keys written (`SCAN`: 3 if every limit was decided).
//! Timed: one decision at a time, 3 limits against the tier alone
//! (`RateTier::check`), in alternating blocks, `--rounds` rounds.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rate_tier_bench_results::{RedisLimits, RedisResults};
use rate_tier_storage::StorageExt;
use rate_tier_storage::{BucketCheck, Decision, LimitName, RedisStorage};
use support::{Args, mean, median, write_results};
use tower_rate_tier::{Limit, LimitRequest, Quota, RateTier};

const RATE: u32 = 1_000_000;

/// Runs `tasks` concurrent check loops for `duration`: (checks/s, errors).
async fn ours(
    store: &RedisStorage,
    users: &Arc<Vec<String>>,
    tasks: usize,
    duration: Duration,
) -> (f64, u64) {
    let quota = Quota::per_second(RATE);
    let start = Instant::now();
    let deadline = start + duration;
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let (store, users) = (store.clone(), users.clone());
            tokio::spawn(async move {
                let (mut ok, mut errors) = (0u64, 0u64);
                let mut i = task * 7919;
                let name = LimitName::new("bench").unwrap();
                let mut out = [Decision::default()];
                while Instant::now() < deadline {
                    i = (i + 1) % users.len();
                    let check =
                        [BucketCheck::new(&name, &users[i], quota, 1).unwrap()];
                    match store.check(&check, &mut out).await {
                        Ok(decided) if decided.verdict.allowed => ok += 1,
                        _ => errors += 1,
                    }
                }
                (ok, errors)
            })
        })
        .collect();
    let (mut ok, mut errors) = (0, 0);
    for handle in handles {
        let (o, e) = handle.await.unwrap();
        ok += o;
        errors += e;
    }
    (ok as f64 / start.elapsed().as_secs_f64(), errors)
}

/// `redis-benchmark` with the same script and spread: EVALSHA/s, with
/// `clients` connections of `pipeline` requests in flight each. A run the
/// tool itself aborts ("All clients disconnected") measured nothing: it is
/// run once more, and said so on stderr; a second abort fails the row.
fn redis_benchmark(
    bin: &str,
    port: u16,
    sha: &str,
    (clients, pipeline): (usize, usize),
    keys: usize,
    requests: u64,
) -> f64 {
    let quota = Quota::per_second(RATE);
    let run = || {
        Command::new(bin)
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-c", &clients.to_string(), "-n", &requests.to_string()])
            .args(["-P", &pipeline.to_string()])
            .args(["-r", &keys.to_string(), "--csv"])
            .args(["EVALSHA", sha, "1", "trt:bench:__rand_int__"])
            .arg(quota.emission_interval_us().to_string())
            .arg(quota.burst_offset_us().to_string())
            .arg("1")
            .output()
            .unwrap_or_else(|e| panic!("could not run {bin}: {e}"))
    };
    let mut output = run();
    if !output.status.success() {
        eprintln!(
            "redis-benchmark aborted, run again: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output = run();
    }
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "redis-benchmark failed:\n{text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // --csv: a header line, then "EVALSHA ...","<rps>",...
    text.lines()
        .filter(|line| line.starts_with("\"EVALSHA"))
        .find_map(|line| line.split("\",\"").nth(1)?.parse().ok())
        .unwrap_or_else(|| {
            panic!("no EVALSHA line in redis-benchmark's output:\n{text}")
        })
}

/// The tier and two more per-user limits, on `store`.
struct ThreeLimits {
    limiter: RateTier,
    route: Limit,
    tokens: Limit,
}

impl ThreeLimits {
    fn new(store: &RedisStorage, quota: Quota) -> Self {
        ThreeLimits {
            limiter: RateTier::builder()
                .storage(Arc::new(store.clone()))
                .tier("free", quota)
                .build(),
            route: Limit::new("route", quota),
            tokens: Limit::new("tokens", quota),
        }
    }

    /// One decision over the three limits of `user`: allowed?
    async fn decide(&self, user: &str) -> bool {
        let request = LimitRequest::new(user, "free", 1)
            .limit(&self.route, 1)
            .limit(&self.tokens, 1);
        matches!(self.limiter.decide(&request).await, Ok(Ok(_)))
    }

    /// The tier alone, as a one-limit service calls it: allowed?
    async fn check(&self, user: &str) -> bool {
        matches!(self.limiter.check(user, "free", 1).await, Ok(Ok(_)))
    }
}

/// Script calls (`EVAL*`, `FCALL*`) in an `INFO commandstats` reply.
fn script_calls(info: &str) -> u64 {
    info.lines()
        .filter_map(|line| {
            let (name, fields) =
                line.trim().strip_prefix("cmdstat_")?.split_once(':')?;
            if !(name.starts_with("eval") || name.starts_with("fcall")) {
                return None;
            }
            fields
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls=")?.parse::<u64>().ok())
        })
        .sum()
}

const MONITOR_END: &str = "trt-bench-monitor-end";

/// The key every Redis store reads in the background to learn of resets
/// through other instances, and how its reads are counted.
const RESETS_KEY: &str = "trt:resets";
const RESETS_POLL: &str = "GET trt:resets";

/// Counts the commands clients send until `ECHO MONITOR_END`, with MONITOR:
/// unlike `INFO commandstats`, it tells a client's command (`[0 addr]`)
/// from one a script runs (`[0 lua]`). Returns once MONITOR is on.
fn monitor_client_commands(
    port: u16,
) -> std::thread::JoinHandle<BTreeMap<String, u64>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(b"MONITOR\r\n").unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), "+OK", "MONITOR refused");
    std::thread::spawn(move || {
        let mut counts = BTreeMap::new();
        loop {
            line.clear();
            assert!(reader.read_line(&mut line).unwrap() > 0, "MONITOR ended");
            // +<time> [<db> <client>] "<COMMAND>" "<arg>"...
            let Some((client, command)) = line
                .split_once(" [")
                .and_then(|(_, rest)| rest.split_once("] "))
            else {
                continue;
            };
            if client.ends_with(" lua") {
                continue;
            }
            if line.contains(MONITOR_END) {
                return counts;
            }
            let mut words = command.split('"').skip(1).step_by(2);
            let name = words.next().unwrap_or("?").to_ascii_uppercase();
            // The store's own read of the resets key, every 250 ms: a
            // background cost, not a decision's.
            let name = match words.next() {
                Some(RESETS_KEY) if name == "GET" => RESETS_POLL.to_owned(),
                _ => name,
            };
            *counts.entry(name).or_insert(0) += 1;
        }
    })
}

/// Live keys of the three limits' buckets (SCAN skips expired keys,
/// DBSIZE does not). A `Limit`'s keys are in the limits' namespace,
/// `limit/<name>` (`LimitName::of_limit`), apart from the tiers'.
async fn bucket_keys(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let mut count = 0;
    for pattern in ["trt:free:*", "trt:limit/route:*", "trt:limit/tokens:*"] {
        let keys = rate_tier_test_support::scan_keys(conn, pattern).await;
        count += keys.unwrap().len() as u64;
    }
    count
}

/// What the server saw of `decisions` 3-limit decisions of new users: the
/// commands clients sent, the script calls, the keys written.
async fn count_three_limits(
    url: &str,
    port: u16,
    store: &RedisStorage,
    decisions: usize,
    results: &mut RedisLimits,
) {
    // 1 a minute: each bucket's key lives a minute, long enough to count.
    let three = ThreeLimits::new(store, Quota::per_minute(1));
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // Warm: both scripts loaded (a NOSCRIPT reload is not a decision's cost).
    assert!(
        three.check("limits-warm-1").await
            && three.decide("limits-warm-3").await
    );
    let keys_before = bucket_keys(&mut conn).await;
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let monitor = monitor_client_commands(port);
    let mut refused = 0u64;
    for i in 0..decisions {
        if !three.decide(&format!("limits-user-{i:06}")).await {
            refused += 1;
        }
    }
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    let keys_after = bucket_keys(&mut conn).await;
    let _: String = redis::cmd("ECHO")
        .arg(MONITOR_END)
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut sent = monitor.join().unwrap();
    // The counting connection's own.
    for own in ["INFO", "SCAN"] {
        sent.remove(own);
    }
    let polls = sent.remove(RESETS_POLL).unwrap_or(0);
    let commands: u64 = sent.values().sum();
    let n = decisions as f64;
    let per = |count: u64| count as f64 / n;
    let keys = keys_after.saturating_sub(keys_before);
    println!(
        "  3 limits of one user, {decisions} decisions: {:.3} commands sent and {:.3} \
         script calls per decision ({sent:?}), {:.3} keys written per decision; \
         {refused} refused; and {polls} background reads of {RESETS_KEY}",
        per(commands),
        per(script_calls(&info)),
        per(keys)
    );
    results.decisions = Some(decisions as u64);
    results.commands_per_decision = Some(per(commands));
    results.script_calls_per_decision = Some(per(script_calls(&info)));
    results.keys_per_decision = Some(per(keys));
    results.refused = Some(refused);
}

/// `decisions` of each kind one at a time, in alternating blocks of 100
/// (so that a change of the machine's load hits both alike): µs per
/// decision of 1 limit, and of 3.
async fn time_one_by_one(
    three: &ThreeLimits,
    users: &[String],
    decisions: usize,
) -> (f64, f64) {
    let mut spent = [Duration::ZERO; 2];
    let mut i = 0;
    for _ in 0..decisions.div_ceil(100) {
        for (all_three, spent) in [false, true].into_iter().zip(&mut spent) {
            let start = Instant::now();
            for _ in 0..100 {
                i += 1;
                let user = &users[i % users.len()];
                let allowed = if all_three {
                    three.decide(user).await
                } else {
                    three.check(user).await
                };
                assert!(allowed, "the quota never refuses");
            }
            *spent += start.elapsed();
        }
    }
    let n = (decisions.div_ceil(100) * 100) as f64;
    let us = |d: Duration| d.as_secs_f64() * 1e6 / n;
    (us(spent[0]), us(spent[1]))
}

fn main() {
    let args = Args::parse();
    let url = args.get("url").expect("--url redis://127.0.0.1:PORT/");
    let port: u16 = args.num("port", 0);
    let sha = args.get("sha").expect("--sha: SCRIPT LOAD of gcra.lua");
    let bench_bin = args.get("redis-benchmark").unwrap_or("redis-benchmark");
    assert_ne!(port, 6379, "the shared Redis on 6379 is never used");
    let seconds = args.secs("seconds", 3.0);
    let rounds: usize = args.num("rounds", 3);
    let tasks: usize = args.num("tasks", 64);
    let keys: usize = args.num("keys", 1000);
    let client_threads: usize = args.num("client-threads", 1);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(client_threads)
        .enable_all()
        .build()
        .unwrap();
    let users = Arc::new(
        (0..keys)
            .map(|i| format!("user-{i:04}"))
            .collect::<Vec<_>>(),
    );
    let store = runtime.block_on(async {
        let store = RedisStorage::from_url(url).unwrap();
        // The script our store runs is the one redis-benchmark calls by SHA.
        let client = redis::Client::open(url).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let loaded: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(sha)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(loaded, [true], "load gcra.lua (SHA {sha}) first");
        store
    });

    println!(
        "redis: {tasks} tasks on one multiplexed connection ({client_threads} client thread), \
         {keys} keys, vs redis-benchmark -c {tasks} -r {keys}; {rounds} rounds of {:.0} s, \
         alternating",
        seconds.as_secs_f64()
    );
    // Warm-up: connection, script cache, and a first rate to size -n.
    let (warm, _) =
        runtime.block_on(ours(&store, &users, tasks, Duration::from_secs(1)));
    let requests = ((warm * seconds.as_secs_f64()) as u64).max(10_000);
    // The ceiling: `tasks` connections, one request in flight on
    // each. And the same shape as ours: one connection, `tasks` in flight.
    let shapes = [(tasks, 1), (1, tasks)];
    let mut sizes = [requests / 4; 2];
    for (shape, n) in shapes.iter().zip(sizes) {
        redis_benchmark(bench_bin, port, sha, *shape, keys, n);
    }
    sizes = [requests; 2];

    let mut our_rates = Vec::new();
    let mut peer_rates = [Vec::new(), Vec::new()];
    let mut errors = 0;
    for round in 1..=rounds {
        let (rate, e) = runtime.block_on(ours(&store, &users, tasks, seconds));
        errors += e;
        println!(
            "  round {round} RedisStorage                 {rate:>10.0} checks/s ({e} errors)"
        );
        our_rates.push(rate);
        for (i, &(clients, pipeline)) in shapes.iter().enumerate() {
            let peer = redis_benchmark(
                bench_bin,
                port,
                sha,
                (clients, pipeline),
                keys,
                sizes[i],
            );
            println!(
                "  round {round} redis-benchmark -c {clients:<2} -P {pipeline:<2} {peer:>10.0} EVALSHA/s"
            );
            // Size the next run to last about `seconds`.
            sizes[i] = ((peer * seconds.as_secs_f64()) as u64).max(10_000);
            peer_rates[i].push(peer);
        }
    }
    // Each round's runs are back to back: the median of their ratios.
    let ratio = |peer: &[f64]| {
        median(our_rates.iter().zip(peer).map(|(o, p)| o / p).collect())
    };
    let (ratio_c, ratio_p) = (ratio(&peer_rates[0]), ratio(&peer_rates[1]));
    println!(
        "  mean    RedisStorage {:.0} checks/s; redis-benchmark -c {tasks} {:.0} EVALSHA/s \
         (median ratio {ratio_c:.3}), -c 1 -P {tasks} {:.0} EVALSHA/s (median ratio {ratio_p:.3})",
        mean(&our_rates),
        mean(&peer_rates[0]),
        mean(&peer_rates[1]),
    );

    // Several limits of one user: round trips, then time.
    let mut results = RedisResults::default();
    let decisions: usize = args.num("limits-decisions", 2000);
    runtime.block_on(count_three_limits(
        url,
        port,
        &store,
        decisions,
        &mut results.limits,
    ));
    let three = ThreeLimits::new(&store, Quota::per_second(RATE));
    let (mut one_us, mut three_us, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let (one, all) =
            runtime.block_on(time_one_by_one(&three, &users, decisions));
        println!(
            "  round {round} one decision at a time: 1 limit {one:.1} µs, 3 limits {all:.1} µs"
        );
        one_us.push(one);
        three_us.push(all);
        ratios.push(all / one);
    }
    results.limits.one_us = Some(median(one_us));
    results.limits.three_us = Some(median(three_us));
    results.limits.time_ratio = Some(median(ratios));

    let results = RedisResults {
        ours_per_sec: Some(mean(&our_rates)),
        redis_benchmark_per_sec: Some(mean(&peer_rates[0])),
        ratio: Some(ratio_c),
        redis_benchmark_pipelined_per_sec: Some(mean(&peer_rates[1])),
        ratio_pipelined: Some(ratio_p),
        errors: Some(errors),
        tasks: Some(tasks as u64),
        keys: Some(keys as u64),
        rounds: Some(rounds as u64),
        seconds: Some(seconds.as_secs_f64()),
        client_threads: Some(client_threads as u64),
        ..results
    };
    write_results(&results, &args);
}
