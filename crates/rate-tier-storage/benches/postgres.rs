//! `PostgresStorage` against PostgreSQL's own client, on one throwaway
//! server of this machine: checks per second with 64 tasks against
//! `pgbench` running the same statement with 64 clients (the store's
//! overhead over the database's), and the server's CPU per check against a
//! plain `UPDATE` of one row by primary key (what one decision costs the
//! database beside the cheapest write there is).
//!
//! `cargo bench -p rate-tier-storage --features postgres --bench postgres`
//! (`-- --seconds N`, 10 by default). Needs Debian's `postgresql` package
//! (pgbench included). It prints the figures; the server's CPU is read from
//! `/proc` (the postmaster's children's user and system time).
#![allow(clippy::unwrap_used, missing_docs)]

use std::io::Write as _;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gcra_core::{Decision, Quota};
use rate_tier_storage::{
    BucketCheck, KeyLayout, LimitName, PostgresStorage, Storage,
};
use rate_tier_test_support::PostgresServer;

const CLIENTS: usize = 64;
const USERS: usize = 10_000;

/// CPU seconds (user + system) of the postmaster `pid` and its children,
/// the ones that exited included (their time is the postmaster's
/// `cutime`/`cstime` once it reaped them).
fn server_cpu_secs(pid: u32) -> f64 {
    let ticks = 100.0; // USER_HZ on Linux
    let mut total = 0u64;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat"))
        else {
            continue;
        };
        // After the command's closing parenthesis: state, ppid, ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let own = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok());
        let parent = fields.get(1).and_then(|p| p.parse::<u32>().ok());
        let field = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        if parent == Some(pid) {
            total += field(11) + field(12);
        }
        if own == Some(pid) {
            total += field(11) + field(12) + field(13) + field(14);
        }
    }
    total as f64 / ticks
}

/// pgbench with `script` (one statement, `:k` a random user), 64 clients,
/// prepared statements: (transactions per second, server CPU seconds).
fn pgbench(server: &PostgresServer, script: &str, seconds: u64) -> (f64, f64) {
    let path = server.dir().join("bench.sql");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let pid = server.postmaster_pid().unwrap();
    let before = server_cpu_secs(pid);
    let output = Command::new(server.bin_dir().join("pgbench"))
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &CLIENTS.to_string(),
            "-j",
            "2",
        ])
        .args(["-T", &seconds.to_string(), "-f"])
        .arg(&path)
        .arg(server.url())
        .output()
        .unwrap();
    let cpu = server_cpu_secs(pid) - before;
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pgbench: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tps = text
        .lines()
        .find_map(|line| line.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    (tps, cpu)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds: u64 = std::env::args()
        .skip_while(|a| a != "--seconds")
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let server = PostgresServer::start();
    let store = PostgresStorage::builder(&server.url())
        .unwrap()
        .pool_size(CLIENTS)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    store.migrate().await.unwrap();
    let store = Arc::new(store);
    let free = Arc::new(LimitName::new("free").unwrap());
    let quota = Quota::per_minute(1_000_000);

    // The store: 64 tasks, each checking random users of 10 000.
    let checks = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let pid = server.postmaster_pid().unwrap();
    let cpu_before = server_cpu_secs(pid);
    let started = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (store, free, checks, stop) =
                (store.clone(), free.clone(), checks.clone(), stop.clone());
            tokio::spawn(async move {
                let mut user = t * 7919;
                while !stop.load(Ordering::Relaxed) {
                    user = (user * 31 + 17) % USERS;
                    let id = format!("user-{user}");
                    let check =
                        [BucketCheck::new(&free, &id, quota, 1).unwrap()];
                    let mut out = [Decision::default()];
                    store.check(&check, &mut out).await.unwrap();
                    checks.fetch_add(1, Ordering::Relaxed);
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
    let ours_cpu = server_cpu_secs(pid) - cpu_before;
    let ours = checks.load(Ordering::Relaxed) as f64;
    let ours_rate = ours / elapsed;
    let table = store.table().to_owned();
    // Its 64 connections closed before pgbench opens 64 of its own.
    drop(store);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // pgbench: the same function call, the same arguments, random users.
    let [t, tau, cost, shadow, debt] = BucketCheck::new(&free, "x", quota, 1)
        .unwrap()
        .script_args();
    // A key as long as the store's (pgbench would read the colons of
    // `trt:free:` as its variables).
    let key = BucketCheck::new(&free, "user-", quota, 1)
        .unwrap()
        .key(KeyLayout::Single)
        .replace(':', "_");
    let same = format!(
        "\\set k random(0, {})\nSELECT {}_check(ARRAY['{key}' || :k], ARRAY[{t}, {tau}, {cost}, {shadow}, {debt}]::int8[]);\n",
        USERS - 1,
        table
    );
    let (same_tps, same_cpu) = pgbench(&server, &same, seconds);

    // The cheapest write: one UPDATE of one row by primary key.
    server.psql("CREATE TABLE plain (key int PRIMARY KEY, n int8 NOT NULL) WITH (fillfactor = 70); \
                 INSERT INTO plain SELECT g, 0 FROM generate_series(0, 9999) g;").unwrap();
    let plain = format!(
        "\\set k random(0, {})\nUPDATE plain SET n = n + 1 WHERE key = :k;\n",
        USERS - 1
    );
    let (plain_tps, plain_cpu) = pgbench(&server, &plain, seconds);

    let per = |cpu: f64, n: f64| cpu / n * 1e6;
    let ours_per = per(ours_cpu, ours);
    let same_per = per(same_cpu, same_tps * seconds as f64);
    let plain_per = per(plain_cpu, plain_tps * seconds as f64);
    println!(
        "PostgresStorage, {CLIENTS} tasks:      {ours_rate:>9.0} checks/s, server CPU {ours_per:>6.1} us/check"
    );
    println!(
        "pgbench, same statement, {CLIENTS} clients: {same_tps:>9.0} calls/s,  server CPU {same_per:>6.1} us/call"
    );
    println!(
        "pgbench, plain UPDATE, {CLIENTS} clients:   {plain_tps:>9.0} updates/s, server CPU {plain_per:>6.1} us/update"
    );
    println!(
        "store / pgbench (same statement): {:.2}x (goal >= 0.8)",
        ours_rate / same_tps
    );
    println!(
        "server CPU per check / per plain UPDATE: {:.2}x (goal <= 2.0)",
        ours_per / plain_per
    );
}
