//! `PostgresStorage` against PostgreSQL's own client, on one throwaway
//! server of this machine: checks per second with 64 tasks against
//! `pgbench` running the same statement with 64 clients (the store's
//! overhead over the database's), and the server's CPU per check against a
//! plain `UPDATE` of one row by primary key (what one decision costs the
//! database beside the cheapest write there is).
//!
//! `cargo bench -p rate-tier-storage --features postgres --bench postgres`
//! (`-- --seconds N --rounds R --out FILE`; 5 s, 3 rounds by default).
//! Each round runs, in turn: the store; pgbench running the statement the
//! store sends (one bucket that passes: the one-bucket upsert); pgbench
//! running a plain `UPDATE`; pgbench calling the check function with one
//! bucket (the path of several limits and of refusals), for scale. Needs
//! Debian's `postgresql` package (pgbench included). It prints the figures
//! and writes them to `--out` (`PostgresResults` of
//! `crates/bench-results`, read by `cargo xtask bench`); the server's CPU
//! is read from `/proc` (the postmaster's children's user and system
//! time).
#![allow(clippy::unwrap_used, missing_docs)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gcra_core::{Decision, Quota};
use rate_tier_bench_results::{PostgresResults, ResultsFile};
use rate_tier_storage::StorageExt;
use rate_tier_storage::{BucketCheck, KeyLayout, LimitName, PostgresStorage};
use rate_tier_test_support::PostgresServer;
use rate_tier_test_support::bench::{
    Args, median, own_cpu_secs, pgbench,
    process_tree_cpu_secs as server_cpu_secs,
};

const CLIENTS: usize = 64;
const USERS: usize = 10_000;

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// One run of the store: 64 tasks, each checking random users of 10 000,
/// for `seconds`: (checks per second, server CPU µs per check, client CPU
/// µs per check, errors).
async fn run_store(
    server: &PostgresServer,
    quota: Quota,
    seconds: u64,
) -> (f64, f64, f64, u64) {
    let store = PostgresStorage::builder(&server.url())
        .unwrap()
        .pool_size(CLIENTS)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    store.ensure_migrated().await.unwrap();
    let store = Arc::new(store);
    let free = Arc::new(LimitName::new("free").unwrap());
    // Every connection open before the clock starts.
    let warm: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (store, free) = (store.clone(), free.clone());
            tokio::spawn(async move {
                let id = format!("warm-{t}");
                let check = [BucketCheck::new(&free, &id, quota, 1).unwrap()];
                let mut out = [Decision::default()];
                store.check(&check, &mut out).await.unwrap();
            })
        })
        .collect();
    for task in warm {
        task.await.unwrap();
    }
    let checks = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let pid = server.postmaster_pid().unwrap();
    let cpu_before = server_cpu_secs(pid);
    let client_before = own_cpu_secs();
    let started = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (store, free, checks, errors, stop) = (
                store.clone(),
                free.clone(),
                checks.clone(),
                errors.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                let mut user = t * 7919;
                while !stop.load(Ordering::Relaxed) {
                    user = (user * 31 + 17) % USERS;
                    let id = format!("user-{user}");
                    let check =
                        [BucketCheck::new(&free, &id, quota, 1).unwrap()];
                    let mut out = [Decision::default()];
                    match store.check(&check, &mut out).await {
                        Ok(decided) if decided.verdict.allowed => {
                            checks.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = server_cpu_secs(pid) - cpu_before;
    let client = own_cpu_secs() - client_before;
    let checks = checks.load(Ordering::Relaxed) as f64;
    // Its 64 connections closed before pgbench opens 64 of its own.
    drop(store);
    tokio::time::sleep(Duration::from_millis(500)).await;
    (
        checks / elapsed,
        cpu / checks * 1e6,
        client / checks * 1e6,
        errors.load(Ordering::Relaxed),
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let seconds: u64 = args.num("seconds", 5);
    let rounds: usize = args.num("rounds", 3);
    let server = PostgresServer::start();
    let version = Command::new(server.bin_dir().join("postgres"))
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    PostgresStorage::builder(&server.url())
        .unwrap()
        .build()
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let table = "rate_tier_buckets";
    // A quota that never refuses: every check reads, decides and writes.
    let quota = Quota::per_minute(1_000_000);
    let free = LimitName::new("free").unwrap();

    // pgbench: the statements with the store's arguments, random users.
    let [t, tau, cost, shadow, debt] = BucketCheck::new(&free, "x", quota, 1)
        .unwrap()
        .script_args();
    // A key as long as the store's (pgbench would read the colons of
    // `trt:free:` as its variables).
    let key = BucketCheck::new(&free, "user-", quota, 1)
        .unwrap()
        .key(KeyLayout::Single)
        .replace(':', "_");
    let pick = format!("\\set k random(0, {})\n", USERS - 1);
    let same = PostgresStorage::one_bucket_sql(table, false)
        .unwrap()
        .replace("$1::text", &format!("('{key}' || :k)"))
        .replace("$2::int8", &format!("{t}::int8"))
        .replace("$3::int8", &format!("{tau}::int8"))
        .replace("$4::int8", &format!("{cost}::int8"));
    assert!(!same.contains('$'), "a parameter left in {same}");
    let same = format!("{pick}{same};\n");
    let function = format!(
        "{pick}SELECT {table}_check(ARRAY['{key}' || :k], ARRAY[{t}, {tau}, {cost}, {shadow}, {debt}]::int8[]);\n"
    );
    // The cheapest write: one UPDATE of one row by primary key.
    server.psql("CREATE TABLE plain (key int PRIMARY KEY, n int8 NOT NULL) WITH (fillfactor = 70); \
                 INSERT INTO plain SELECT g, 0 FROM generate_series(0, 9999) g;").unwrap();
    let plain = format!("{pick}UPDATE plain SET n = n + 1 WHERE key = :k;\n");

    let mut ours = Vec::new();
    let mut ours_cpu = Vec::new();
    let mut same_rate = Vec::new();
    let mut update_rate = Vec::new();
    let mut update_cpu = Vec::new();
    let mut function_cpu = Vec::new();
    let (mut ratios, mut cpu_ratios, mut function_ratios) =
        (Vec::new(), Vec::new(), Vec::new());
    let mut errors = 0;
    for round in 1..=rounds {
        let (rate, cpu, client, failed) =
            run_store(&server, quota, seconds).await;
        let (same_tps, same_cpu) =
            pgbench(&server, &same, CLIENTS, seconds as f64);
        let (plain_tps, plain_cpu) =
            pgbench(&server, &plain, CLIENTS, seconds as f64);
        let (_, call_cpu) =
            pgbench(&server, &function, CLIENTS, seconds as f64);
        println!(
            "round {round}: store {rate:.0} checks/s (server {cpu:.1} us, client {client:.1} us CPU/check), \
             pgbench same {same_tps:.0}/s ({same_cpu:.1} us), UPDATE {plain_tps:.0}/s ({plain_cpu:.1} us), \
             function {call_cpu:.1} us"
        );
        errors += failed;
        ratios.push(rate / same_tps);
        cpu_ratios.push(cpu / plain_cpu);
        function_ratios.push(call_cpu / plain_cpu);
        ours.push(rate);
        ours_cpu.push(cpu);
        same_rate.push(same_tps);
        update_rate.push(plain_tps);
        update_cpu.push(plain_cpu);
        function_cpu.push(call_cpu);
    }
    let results = PostgresResults {
        ours_per_sec: Some(mean(&ours)),
        pgbench_per_sec: Some(mean(&same_rate)),
        ratio: Some(median(ratios)),
        ours_cpu_us: Some(median(ours_cpu)),
        update_cpu_us: Some(median(update_cpu)),
        update_per_sec: Some(mean(&update_rate)),
        cpu_ratio: Some(median(cpu_ratios)),
        function_cpu_us: Some(median(function_cpu)),
        function_cpu_ratio: Some(median(function_ratios)),
        errors: Some(errors),
        tasks: Some(CLIENTS as u64),
        keys: Some(USERS as u64),
        rounds: Some(rounds as u64),
        seconds: Some(seconds as f64),
        server_version: version,
    };
    println!("{results:#?}");
    println!(
        "store / pgbench (same statement): {:.2}x (goal >= 0.8); server CPU per check / per plain UPDATE: {:.2}x (goal <= 2.0)",
        results.ratio.unwrap_or(f64::NAN),
        results.cpu_ratio.unwrap_or(f64::NAN)
    );
    if let Some(out) = args.get("out") {
        results.write(out).unwrap();
    }
}
