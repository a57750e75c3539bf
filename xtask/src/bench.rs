//! `cargo xtask bench`: every benchmark of the issue in one run, each figure
//! a ratio against a peer measured side by side in the same run, a table of
//! them, and BENCHMARKS.md rewritten with it.
//!
//! The benchmarks are bench targets of `tower-rate-tier`
//! (`crates/rate-tier-tower/benches/`), run with `--features redis`:
//!
//! | target | what | peer |
//! |---|---|---|
//! | `check` (criterion) | gcra-core decision; `RateTier::check` in memory | governor's keyed limiter |
//! | `breaker` (criterion) | a check with Redis down, breaker open | a plain memory check |
//! | `http` | req/s of an axum route with `TierLimitLayer` | no layer; tower_governor |
//! | `redis_store` | checks/s of `RedisStorage`, 64 tasks, one connection | redis-benchmark, same script |
//! | `memory` | RSS after 1M keys, then idle | governor's keyed limiter |
//!
//! The criterion figures are read from
//! `target/criterion/<group>/<bench>/new/estimates.json`; the others write
//! a JSON file of results that this reads.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::Result;
use crate::cmd::{Cmd, find_on_path, is_executable, project_root};
use crate::redis::{self, RedisServer};

/// The package the benchmarks belong to, and the features they need.
const PACKAGE: &str = "tower-rate-tier";
const FEATURES: &str = "redis";
/// The criterion bench targets, and the others (harness = false).
const CRITERION_BENCHES: [&str; 2] = ["check", "breaker"];
const OTHER_BENCHES: [&str; 3] = ["http", "redis_store", "memory"];
/// The Lua script redis-benchmark runs by SHA, as RedisStorage does.
const GCRA_LUA: &str = "crates/rate-tier-storage/src/redis/gcra.lua";
/// The criterion groups read (as directories: `/` becomes `_`).
const CRITERION_GROUPS: [&str; 7] = [
    "gcra_core",
    "memory_one_key",
    "memory_100k_keys",
    "memory_2_threads_one_key",
    "memory_2_threads_100k_keys",
    "breaker_open_storage",
    "breaker_open_rate_tier",
];

/// How long each part runs.
struct Plan {
    full: bool,
    /// Passes of the criterion benchmarks (ratios: the median over passes).
    criterion_passes: u32,
    /// Seconds per configuration per round, and rounds (HTTP).
    http: (u32, u32),
    /// Seconds per side per round, and rounds (Redis).
    redis: (u32, u32),
    /// The memory store's sweep interval, seconds.
    sweep_secs: u32,
}

impl Plan {
    fn new(full: bool) -> Self {
        if full {
            Plan {
                full,
                criterion_passes: 3,
                http: (3, 20),
                redis: (5, 6),
                sweep_secs: 10,
            }
        } else {
            Plan {
                full,
                criterion_passes: 3,
                http: (1, 20),
                redis: (2, 5),
                sweep_secs: 1,
            }
        }
    }

    fn command(&self, criterion_args: &[OsString]) -> String {
        let mut command = String::from("cargo xtask bench");
        if self.full {
            command.push_str(" --full");
        }
        if !criterion_args.is_empty() {
            command.push_str(" --");
            for arg in criterion_args {
                command.push(' ');
                command.push_str(&arg.to_string_lossy());
            }
        }
        command
    }
}

/// The external programs, when installed.
struct Tools {
    wrk: Option<PathBuf>,
    /// redis-server, redis-cli, redis-benchmark; or why they are missing.
    redis: std::result::Result<(PathBuf, PathBuf, PathBuf), String>,
}

impl Tools {
    fn find() -> Self {
        let wrk = find_on_path("wrk");
        if wrk.is_none() {
            println!(
                "xtask: `wrk` is not installed: the HTTP benchmark uses its small built-in \
                 Rust client instead. For a real HTTP load generator install it \
                 (`apt-get install wrk` on Debian/Ubuntu, `brew install wrk` on macOS)."
            );
        }
        let redis = redis::find_server().and_then(|server| {
            let cli = redis::find_cli(&server)?;
            let benchmark = server
                .parent()
                .map(|dir| dir.join("redis-benchmark"))
                .filter(|b| is_executable(b))
                .or_else(|| find_on_path("redis-benchmark"))
                .ok_or_else(|| {
                    "`redis-benchmark` is not on PATH (`apt-get install redis-tools` on \
                     Debian/Ubuntu)"
                        .to_owned()
                })?;
            Ok((server, cli, benchmark))
        });
        if let Err(why) = &redis {
            println!("xtask: the Redis benchmark is skipped: {why}");
        }
        Tools { wrk, redis }
    }
}

/// One benchmark run, quick by default.
pub(crate) fn bench(full: bool, criterion_args: &[OsString]) -> Result<()> {
    let started = Instant::now();
    let plan = Plan::new(full);
    let tools = Tools::find();
    let target_dir = target_directory()?;
    let results_dir = target_dir.join("xtask-bench");
    let _ = fs::remove_dir_all(&results_dir);
    fs::create_dir_all(&results_dir).map_err(|e| {
        format!("could not create {}: {e}", results_dir.display())
    })?;
    let criterion_home = target_dir.join("criterion");
    forget_criterion_results(&criterion_home);

    // One build of every benchmark, then the executables run directly: every
    // part measures the same build even if the sources change meanwhile.
    let build_started = Instant::now();
    let exe = build()?;
    let build_time = build_started.elapsed();
    let runs_started = Instant::now();

    // 1. criterion: the hot path and the open breaker, in passes, each
    // pass's estimates read before the next overwrites them.
    let mut passes = Passes::default();
    for pass in 1..=plan.criterion_passes {
        println!("xtask: criterion pass {pass} of {}", plan.criterion_passes);
        for name in CRITERION_BENCHES {
            let mut criterion = Cmd::new(&exe[name])
                .env("CRITERION_HOME", &criterion_home)
                .arg("--bench");
            if !plan.full {
                criterion = criterion.arg("--quick");
            }
            criterion.args(criterion_args).run()?;
        }
        passes.read(&criterion_home);
        forget_criterion_results(&criterion_home);
    }

    // 2. HTTP.
    let http_out = results_dir.join("http.json");
    let (secs, rounds) = plan.http;
    let mut http = Cmd::new(&exe["http"])
        .args(["--seconds", &secs.to_string()])
        .args(["--rounds", &rounds.to_string()])
        .arg("--out")
        .arg(&http_out);
    if let Some(wrk) = &tools.wrk {
        http = http.arg("--wrk").arg(wrk);
    }
    http.run()?;

    // 3. Redis, on a throwaway server.
    let redis_out = results_dir.join("redis.json");
    let mut redis_version = None;
    if let Ok((server_bin, cli_bin, benchmark_bin)) = &tools.redis {
        redis_version = Cmd::new(server_bin)
            .arg("--version")
            .read()
            .ok()
            .map(|v| v.trim().to_owned());
        let server = RedisServer::start(server_bin)?;
        let port = server.port().to_string();
        let sha = script_load(cli_bin, &port)?;
        let (secs, rounds) = plan.redis;
        Cmd::new(&exe["redis_store"])
            .args(["--url", &server.url(), "--port", &port, "--sha", &sha])
            .arg("--redis-benchmark")
            .arg(benchmark_bin)
            .args(["--seconds", &secs.to_string()])
            .args(["--rounds", &rounds.to_string()])
            .arg("--out")
            .arg(&redis_out)
            .run()?;
        // `server` is stopped here.
    }

    // 4. Memory: one process per store, so that their sizes do not mix.
    let sweep = plan.sweep_secs;
    let idle = sweep * 2 + 2;
    for store in ["ours", "governor"] {
        Cmd::new(&exe["memory"])
            .args(["--store", store, "--sweep-secs", &sweep.to_string()])
            .args(["--idle-secs", &idle.to_string()])
            .arg("--out")
            .arg(results_dir.join(format!("memory-{store}.json")))
            .run()?;
    }
    let run_time = runs_started.elapsed();

    // The table.
    let rows = rows(
        &passes,
        &read_json(&http_out),
        tools.redis.as_ref().err(),
        &read_json(&redis_out),
        &read_json(&results_dir.join("memory-ours.json")),
        &read_json(&results_dir.join("memory-governor.json")),
    );
    let table = render_table(&rows);
    println!("\n{table}");
    let machine = Machine::read(tools.wrk.as_deref(), redis_version);
    let report =
        report(&plan, criterion_args, &machine, &table, &rows, run_time);
    let path = project_root().join("BENCHMARKS.md");
    fs::write(&path, report)
        .map_err(|e| format!("could not write {}: {e}", path.display()))?;
    println!(
        "xtask: wrote {} (build {:.0} s, benchmarks {:.0} s, total {:.0} s)",
        path.display(),
        build_time.as_secs_f64(),
        run_time.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let unmet: Vec<&str> = rows
        .iter()
        .filter(|r| r.met == Some(false))
        .map(|r| r.metric.as_str())
        .collect();
    if !unmet.is_empty() {
        println!("xtask: goals not met: {}", unmet.join("; "));
    }
    Ok(())
}

/// Builds every benchmark (`cargo bench --no-run`): their executables by name.
fn build() -> Result<BTreeMap<String, PathBuf>> {
    let mut benches = CRITERION_BENCHES.iter().chain(&OTHER_BENCHES);
    let messages = Cmd::cargo()
        .args(["bench", "-p", PACKAGE, "--features", FEATURES, "--no-run"])
        .args(benches.clone().map(|b| format!("--bench={b}")))
        .arg("--message-format=json-render-diagnostics")
        .read_stdout()?;
    let mut exe = BTreeMap::new();
    for message in messages.lines() {
        let Ok(message) = serde_json::from_str::<Value>(message) else {
            continue;
        };
        let is_bench = message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k == "bench"));
        if let (true, Some(name), Some(path)) = (
            is_bench,
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) {
            exe.insert(name.to_owned(), PathBuf::from(path));
        }
    }
    match benches.find(|b| !exe.contains_key(**b)) {
        Some(missing) => Err(format!(
            "cargo built no executable for the bench target `{missing}`"
        )),
        None => Ok(exe),
    }
}

/// Loads gcra.lua into the server with `redis-cli SCRIPT LOAD`: its SHA.
fn script_load(cli: &Path, port: &str) -> Result<String> {
    let source = fs::read_to_string(project_root().join(GCRA_LUA))
        .map_err(|e| format!("could not read {GCRA_LUA}: {e}"))?;
    // Shown as a shell would run it, rather than with the whole script.
    println!(
        "$ {} -h 127.0.0.1 -p {port} SCRIPT LOAD \"$(cat {GCRA_LUA})\"",
        cli.display()
    );
    let output = Cmd::new(cli)
        .args(["-h", "127.0.0.1", "-p", port, "SCRIPT", "LOAD"])
        .arg(source)
        .command()
        .output()
        .map_err(|e| format!("could not run {}: {e}", cli.display()))?;
    let sha = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if output.status.success()
        && sha.len() == 40
        && sha.chars().all(|c| c.is_ascii_hexdigit())
    {
        Ok(sha)
    } else {
        Err(format!(
            "SCRIPT LOAD of {GCRA_LUA} failed: {sha}{}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Cargo's target directory (`cargo metadata`).
fn target_directory() -> Result<PathBuf> {
    let metadata = Cmd::cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .read()?;
    let metadata: Value = serde_json::from_str(&metadata).map_err(|e| {
        format!("could not read `cargo metadata`'s output: {e}")
    })?;
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| {
            "`cargo metadata` printed no target_directory".to_owned()
        })
}

/// Removes the last run's `new` estimates of the groups read here, so that
/// a benchmark that did not run (a filter after `--`) shows as missing
/// rather than as an old figure.
fn forget_criterion_results(criterion_home: &Path) {
    for group in CRITERION_GROUPS {
        let Ok(benches) = fs::read_dir(criterion_home.join(group)) else {
            continue;
        };
        for bench in benches.flatten() {
            let _ = fs::remove_dir_all(bench.path().join("new"));
        }
    }
}

/// A JSON file of results, or `Null` when missing or unreadable.
fn read_json(path: &Path) -> Value {
    fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null)
}

/// criterion's headline estimate of one benchmark, in ns: the slope when
/// it fitted one, else the mean.
fn criterion_ns(home: &Path, group: &str, bench: &str) -> Option<f64> {
    let path = home.join(group).join(bench).join("new/estimates.json");
    let estimates = read_json(&path);
    ["slope", "mean"]
        .iter()
        .find_map(|kind| estimates[kind]["point_estimate"].as_f64())
}

/// The criterion estimates of every pass: (group, bench) -> ns.
#[derive(Default)]
struct Passes(Vec<BTreeMap<(String, String), f64>>);

impl Passes {
    /// Reads this pass's estimates of every benchmark of the groups read.
    fn read(&mut self, home: &Path) {
        let mut pass = BTreeMap::new();
        for group in CRITERION_GROUPS {
            let Ok(benches) = fs::read_dir(home.join(group)) else {
                continue;
            };
            for bench in benches.flatten() {
                let bench = bench.file_name().to_string_lossy().into_owned();
                if let Some(ns) = criterion_ns(home, group, &bench) {
                    pass.insert((group.to_owned(), bench), ns);
                }
            }
        }
        self.0.push(pass);
    }

    /// `f` of each pass that measured `group`'s `a` and `b`: the median.
    fn median(
        &self,
        group: &str,
        (a, b): (&str, &str),
        f: fn(f64, f64) -> f64,
    ) -> Option<f64> {
        let key = |bench: &str| (group.to_owned(), bench.to_owned());
        let values: Vec<f64> = self
            .0
            .iter()
            .filter_map(|pass| {
                Some(f(*pass.get(&key(a))?, *pass.get(&key(b))?))
            })
            .collect();
        median(values)
    }

    /// The median time of one benchmark over the passes, in ns.
    fn ns(&self, group: &str, bench: &str) -> Option<f64> {
        self.median(group, (bench, bench), |a, _| a)
    }

    /// The median over the passes of `a / b`.
    fn ratio(&self, group: &str, a: &str, b: &str) -> Option<f64> {
        self.median(group, (a, b), |a, b| a / b)
    }

    /// The median over the passes of `a - b`, in ns.
    fn difference(&self, group: &str, a: &str, b: &str) -> Option<f64> {
        self.median(group, (a, b), |a, b| a - b)
    }
}

/// The median of a list, `None` for an empty one.
fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        f64::midpoint(values[mid - 1], values[mid])
    } else {
        values[mid]
    })
}

/// One line of the table.
struct Row {
    metric: String,
    ours: String,
    peer: String,
    ratio: Option<f64>,
    goal: String,
    met: Option<bool>,
}

impl Row {
    fn new(metric: &str) -> Self {
        Row {
            metric: metric.to_owned(),
            ours: "not run".to_owned(),
            peer: "—".to_owned(),
            ratio: None,
            goal: "—".to_owned(),
            met: None,
        }
    }

    fn goal(mut self, goal: &str) -> Self {
        goal.clone_into(&mut self.goal);
        self
    }
}

fn ns(value: f64) -> String {
    if value >= 1000.0 {
        format!("{:.2} µs", value / 1000.0)
    } else {
        format!("{value:.1} ns")
    }
}

fn per_sec(value: f64, unit: &str) -> String {
    format!("{} {unit}", thousands(value.round() as u64))
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mib(kib: f64) -> String {
    format!("{:.1} MiB", kib / 1024.0)
}

#[allow(clippy::too_many_lines)]
fn rows(
    criterion: &Passes,
    http: &Value,
    redis_skipped: Option<&String>,
    redis: &Value,
    memory: &Value,
    memory_peer: &Value,
) -> Vec<Row> {
    let mut rows = Vec::new();

    // The hot path.
    let mut decision = Row::new("gcra-core: one decision (`Quota::check`)");
    if let Some(t) = criterion.ns("gcra_core", "decision") {
        decision.ours = ns(t);
        "(no peer: for scale)".clone_into(&mut decision.goal);
    }
    rows.push(decision);
    for (group, label) in [
        ("memory_one_key", "memory, 1 hot key"),
        ("memory_100k_keys", "memory, 100k keys round-robin"),
        ("memory_2_threads_one_key", "memory, 2 threads, 1 hot key"),
        ("memory_2_threads_100k_keys", "memory, 2 threads, 100k keys"),
    ] {
        let mut row = Row::new(&format!(
            "{label}: `RateTier::check` vs governor `check_key` (time per check)"
        ))
        .goal("≤ 1.0");
        let ours = criterion.ns(group, "tower_rate_tier");
        let peer = criterion.ns(group, "governor");
        let ratio = criterion.ratio(group, "tower_rate_tier", "governor");
        if let (Some(ours), Some(peer), Some(ratio)) = (ours, peer, ratio) {
            row.ours = ns(ours);
            row.peer = ns(peer);
            row.ratio = Some(ratio);
            row.met = Some(ratio <= 1.0);
        }
        rows.push(row);
    }

    // HTTP.
    let num = |v: &Value, key: &str| v[key].as_f64();
    let mut vs_none =
        Row::new("HTTP req/s: `TierLimitLayer` (memory) vs no layer")
            .goal("≥ 0.95");
    let mut vs_governor =
        Row::new("HTTP req/s: `TierLimitLayer` vs tower_governor")
            .goal("> 1.0");
    let mut cpu = Row::new(
        "HTTP server CPU per request: layer vs no layer / vs tower_governor",
    );
    if let (Some(ours), Some(none), Some(governor)) = (
        num(http, "tower_rate_tier_rps"),
        num(http, "no_layer_rps"),
        num(http, "tower_governor_rps"),
    ) {
        vs_none.ours = per_sec(ours, "req/s");
        vs_none.peer = per_sec(none, "req/s");
        vs_none.ratio = num(http, "ratio_layer_vs_no_layer");
        vs_none.met = vs_none.ratio.map(|r| r >= 0.95);
        vs_governor.ours = vs_none.ours.clone();
        vs_governor.peer = per_sec(governor, "req/s");
        vs_governor.ratio = num(http, "ratio_layer_vs_tower_governor");
        vs_governor.met = vs_governor.ratio.map(|r| r > 1.0);
        let errors: f64 = ["no_layer", "tower_rate_tier", "tower_governor"]
            .iter()
            .filter_map(|name| num(http, &format!("{name}_errors")))
            .sum();
        if errors > 0.0 {
            // Not 200s or socket errors: the figures are not comparable.
            vs_none.met = Some(false);
            vs_governor.met = Some(false);
            vs_none.goal = format!("≥ 0.95 ({errors} errors!)");
        }
    }
    if let (Some(ours), Some(none), Some(governor)) = (
        num(http, "tower_rate_tier_cpu_us"),
        num(http, "no_layer_cpu_us"),
        num(http, "tower_governor_cpu_us"),
    ) {
        cpu.ours = format!("{ours:.2} µs");
        cpu.peer = format!("{none:.2} µs / {governor:.2} µs");
        cpu.ratio = num(http, "cpu_ratio_layer_vs_no_layer");
        cpu.goal = format!(
            "(info; vs tower_governor {:.3})",
            num(http, "cpu_ratio_layer_vs_tower_governor").unwrap_or(f64::NAN)
        );
    }
    rows.extend([vs_none, vs_governor, cpu]);

    // Redis.
    let mut ceiling = Row::new(
        "Redis checks/s: `RedisStorage`, 64 tasks on 1 multiplexed connection, vs \
         redis-benchmark `-c 64` EVALSHA",
    )
    .goal("≥ 0.8");
    let mut pipelined = Row::new(
        "Redis checks/s: the same vs redis-benchmark `-c 1 -P 64` (pipelined, our shape)",
    );
    if let Some(why) = redis_skipped {
        ceiling.ours = format!("skipped: {why}");
        "skipped".clone_into(&mut pipelined.ours);
    } else if let (Some(ours), Some(peer)) = (
        num(redis, "ours_per_sec"),
        num(redis, "redis_benchmark_per_sec"),
    ) {
        ceiling.ours = per_sec(ours, "/s");
        ceiling.peer = per_sec(peer, "/s");
        ceiling.ratio = num(redis, "ratio");
        ceiling.met = ceiling.ratio.map(|r| r >= 0.8);
        if num(redis, "errors").is_some_and(|e| e > 0.0) {
            ceiling.met = Some(false);
            ceiling.goal = format!(
                "≥ 0.8 ({} errors!)",
                num(redis, "errors").unwrap_or(0.0)
            );
        }
        if let Some(peer) = num(redis, "redis_benchmark_pipelined_per_sec") {
            pipelined.ours.clone_from(&ceiling.ours);
            pipelined.peer = per_sec(peer, "/s");
            pipelined.ratio = num(redis, "ratio_pipelined");
            "(info)".clone_into(&mut pipelined.goal);
        }
    }
    rows.extend([ceiling, pipelined]);

    // Breaker open.
    for (group, label) in [
        ("breaker_open_storage", "`Storage::check`"),
        ("breaker_open_rate_tier", "`RateTier::check`"),
    ] {
        let mut row = Row::new(&format!(
            "Breaker open (Redis down): added time per check, {label} vs memory"
        ))
        .goal("added < 5 µs");
        let open = criterion.ns(group, "fallback_open");
        let memory = criterion.ns(group, "memory");
        let added = criterion.difference(group, "fallback_open", "memory");
        let ratio = criterion.ratio(group, "fallback_open", "memory");
        if let (Some(open), Some(memory), Some(added)) = (open, memory, added) {
            let sign = if added < 0.0 { "−" } else { "+" };
            row.ours = format!("{} ({sign}{})", ns(open), ns(added.abs()));
            row.peer = format!("{} (memory)", ns(memory));
            row.ratio = ratio;
            row.met = Some(added < 5000.0);
        }
        rows.push(row);
    }

    // Memory.
    let mut peak =
        Row::new("Memory: RSS growth after 1M distinct keys, vs governor");
    let mut idle = Row::new(
        "Memory: RSS growth once their period passed, store idle (ratio: of the peak growth)",
    )
    .goal("≤ 0.10 (near baseline)");
    let growth =
        |v: &Value, key: &str| Some(num(v, key)? - num(v, "baseline_kib")?);
    if let (Some(ours_peak), Some(ours_idle)) = (
        growth(memory, "after_insert_kib"),
        growth(memory, "after_idle_kib"),
    ) {
        peak.ours = format!(
            "+{} (from {})",
            mib(ours_peak),
            mib(num(memory, "baseline_kib").unwrap_or(0.0))
        );
        let held = num(memory, "held_after_idle").unwrap_or(f64::NAN);
        idle.ours = format!("+{} ({held} buckets held)", mib(ours_idle));
        idle.ratio = Some(ours_idle / ours_peak);
        idle.met = Some(ours_idle / ours_peak <= 0.10);
        if let (Some(peer_peak), Some(peer_idle)) = (
            growth(memory_peer, "after_insert_kib"),
            growth(memory_peer, "after_idle_kib"),
        ) {
            peak.peer = format!("+{}", mib(peer_peak));
            peak.ratio = Some(ours_peak / peer_peak);
            "(info)".clone_into(&mut peak.goal);
            let peer_held =
                num(memory_peer, "held_after_idle").unwrap_or(f64::NAN);
            idle.peer = format!(
                "+{} ({peer_held} held, no manual call)",
                mib(peer_idle)
            );
        }
    }
    // A second wave of as many new keys, then idle again: reused or lost?
    let mut wave2 = Row::new(
        "Memory: RSS growth after a second wave of 1M new keys, idle again \
         (ratio: of the first wave's)",
    )
    .goal("(info: 1.0 = reused)");
    if let (Some(first), Some(second)) = (
        growth(memory, "after_idle_kib"),
        growth(memory, "wave2_after_idle_kib"),
    ) {
        let held = num(memory, "wave2_held_after_idle").unwrap_or(f64::NAN);
        wave2.ours = format!("+{} ({held} buckets held)", mib(second));
        wave2.ratio = Some(second / first);
    }
    rows.extend([peak, idle, wave2]);
    rows
}

fn render_table(rows: &[Row]) -> String {
    let mut table =
        String::from("| metric | ours | peer | ratio | goal | met? |\n");
    table.push_str("|---|---|---|---|---|---|\n");
    for row in rows {
        let ratio = row.ratio.map_or("—".to_owned(), |r| format!("{r:.3}"));
        let met = match row.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "—",
        };
        writeln!(
            table,
            "| {} | {} | {} | {ratio} | {} | {met} |",
            row.metric, row.ours, row.peer, row.goal
        )
        .expect("writing to a String");
    }
    table
}

/// What the figures were measured on.
struct Machine {
    cpus: usize,
    cpu_model: String,
    kernel: String,
    rustc: String,
    commit: String,
    wrk: String,
    redis: String,
}

impl Machine {
    fn read(wrk: Option<&Path>, redis: Option<String>) -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
            .map_or("unknown".to_owned(), |(_, model)| model.trim().to_owned());
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or("unknown".to_owned(), |k| format!("Linux {}", k.trim()));
        let quiet = |cmd: Cmd| {
            cmd.command()
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        };
        let rustc = quiet(Cmd::new("rustc").arg("-V"))
            .unwrap_or_else(|| "unknown".to_owned());
        let commit =
            quiet(Cmd::new("git").args(["rev-parse", "--short", "HEAD"]))
                .map_or("unknown".to_owned(), |sha| {
                    let dirty =
                        quiet(Cmd::new("git").args(["status", "--porcelain"]))
                            .is_some_and(|s| !s.is_empty());
                    if dirty {
                        format!("{sha} with uncommitted changes")
                    } else {
                        sha
                    }
                });
        let wrk = match wrk {
            // `wrk -v` prints its version and exits with 1.
            Some(bin) => Cmd::new(bin)
                .arg("-v")
                .command()
                .output()
                .ok()
                .and_then(|o| {
                    let text = String::from_utf8_lossy(&o.stdout).into_owned();
                    let first = text.lines().next()?;
                    let version = first.split(" Copyright").next()?;
                    Some(version.trim().to_owned())
                })
                .unwrap_or_else(|| "wrk".to_owned()),
            None => "built-in Rust client (wrk not installed)".to_owned(),
        };
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            kernel,
            rustc,
            commit,
            wrk,
            redis: redis.unwrap_or_else(|| "not installed".to_owned()),
        }
    }
}

/// Today (UTC) as `YYYY-MM-DD HH:MM UTC`, from the system clock.
fn now_utc() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days.cast_signed() + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60
    )
}

fn report(
    plan: &Plan,
    criterion_args: &[OsString],
    machine: &Machine,
    table: &str,
    rows: &[Row],
    run_time: Duration,
) -> String {
    let mode = if plan.full { "full" } else { "quick" };
    let (http_secs, http_rounds) = plan.http;
    let (redis_secs, redis_rounds) = plan.redis;
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(w, "# Benchmarks\n");
    let _ = writeln!(
        w,
        "Written by `cargo xtask bench`: do not edit by hand, run it again. Every \
         figure is a **ratio** of two things measured side by side in the same run, \
         on the same machine, at the same time: absolute numbers depend on the machine \
         and on whatever else it was doing, ratios much less.\n"
    );
    let _ = writeln!(
        w,
        "- Command: `{}` ({mode} mode)",
        plan.command(criterion_args)
    );
    let _ = writeln!(w, "- Date: {}", now_utc());
    let _ = writeln!(
        w,
        "- Machine: {} CPUs (nproc), {}; {}",
        machine.cpus, machine.cpu_model, machine.kernel
    );
    let _ = writeln!(w, "- Toolchain: {}", machine.rustc);
    let _ = writeln!(w, "- Commit: {}", machine.commit);
    let _ = writeln!(w, "- HTTP load generator: {}", machine.wrk);
    let _ = writeln!(w, "- Redis: {}", machine.redis);
    let _ = writeln!(
        w,
        "- Benchmarks ran for {:.0} s (after the build)\n",
        run_time.as_secs_f64()
    );
    let _ = writeln!(w, "## Results\n");
    let _ = writeln!(w, "{table}");
    let unmet: Vec<&Row> =
        rows.iter().filter(|r| r.met == Some(false)).collect();
    if unmet.is_empty() {
        let _ = writeln!(w, "Every goal with a figure was met in this run.\n");
    } else {
        let _ = writeln!(w, "Goals not met in this run:\n");
        for row in unmet {
            let _ = writeln!(
                w,
                "- {}: ratio {}, goal {}",
                row.metric,
                row.ratio.map_or("—".to_owned(), |r| format!("{r:.3}")),
                row.goal
            );
        }
        let _ = writeln!(w);
    }
    let _ = writeln!(w, "## How each figure is measured\n");
    let _ = writeln!(
        w,
        "All of it is in `crates/rate-tier-tower/benches/` (run with \
         `cargo bench -p tower-rate-tier --features redis --bench <name>`); \
         `xtask/src/bench.rs` runs them and writes this file.\n"
    );
    let criterion_mode = format!(
        "{}, {} passes; shown: the median over the passes of each time and \
         of each pass's ratio",
        if plan.full {
            "criterion's default settings"
        } else {
            "criterion `--quick`"
        },
        plan.criterion_passes
    );
    let _ = writeln!(
        w,
        "- **Memory hot path** (`check.rs`, {criterion_mode}): `RateTier::check` on the \
         default memory store against governor's `DefaultKeyedRateLimiter<String>::check_key`, \
         both with a quota that allows (1,000,000/s), the same `String` keys, the same loop: \
         one hot key; 100,000 keys round-robin; and the same two with the checks split \
         over 2 threads (time per check, wall clock). Ratio: ours / governor (lower is \
         better). The gcra-core row is the bare decision, for scale."
    );
    let _ = writeln!(
        w,
        "- **HTTP** (`http.rs`): three axum servers in one process on a 1-worker Tokio \
         runtime, `GET /` answering `Hello, World!`: no layer; `TierLimitLayer` on the \
         memory store, identity from the `x-api-key` header, quota 1,000,000/s (never \
         refuses); tower_governor's `GovernorLayer` keyed by the same header, the same \
         quota and burst, with `use_headers()` so that it answers `x-ratelimit-*` headers \
         like ours. The load generator (one thread, 32 keep-alive connections, 1,000 \
         rotating keys) runs each for {http_secs} s in turn, A B C A B C, {http_rounds} rounds, \
         after a warm-up; every response must be a 200. Ratios are the median of the \
         rounds' ratios (each round's runs are back to back); req/s shown are means. \
         Server CPU per request is the server threads' CPU time (schedstat) divided by \
         the requests: less disturbed by other load than req/s. With 2 cores, the \
         server gets one and the load generator the other."
    );
    let _ = writeln!(
        w,
        "- **Redis** (`redis_store.rs`): a throwaway `redis-server` on a free loopback \
         port (never 6379), gcra.lua loaded with `SCRIPT LOAD`. Ours: 64 Tokio tasks on a \
         1-worker runtime sharing one `RedisStorage::from_url` (one multiplexed \
         connection), each looping `Storage::check` over 1,000 users. Peer: \
         `redis-benchmark -c 64 -r 1000 EVALSHA <sha> 1 trt:bench:__rand_int__ 1 1000000 1`, \
         the same script and arguments (the quota never refuses: GET, decide, SET PX every \
         time), sized to last as long. {redis_rounds} rounds of {redis_secs} s, alternating; \
         ratio = median of the rounds' ours / redis-benchmark. The second row's peer, \
         `-c 1 -P 64`, is one connection with 64 requests in flight: the shape of ours."
    );
    let _ = writeln!(
        w,
        "- **Breaker open** (`breaker.rs`, {criterion_mode}): `FallbackStorage` around a \
         `RedisStorage` on a closed loopback port, threshold 1, one-hour cool-down; one \
         failed check opens it. Then checks over 1,000 keys, against a plain \
         `MemoryStorage` in the same run: at the store (`Storage::check`) and through \
         `RateTier::check`. Added time = open − memory."
    );
    let _ = writeln!(
        w,
        "- **Memory** (`memory.rs`): VmRSS of a process holding only the store: at \
         the start, after 1,000,000 distinct keys (`free` tier, 10/min, a `FakeClock` \
         standing still so that every bucket is live), and after the clock moves past the \
         period while the process sleeps (the store's own sweeper runs every {} s; nothing \
         calls the store). The peer is governor's keyed limiter with the same keys in a \
         process of its own, waiting as long without calling `retain_recent`.\n",
        plan.sweep_secs
    );
    let _ = writeln!(w, "## Reading the memory rows\n");
    let _ = writeln!(
        w,
        "A bucket is one 32-byte entry inline in its shard's table (a keyed 128-bit \
         hash of tier and user, and the TAT): there is no allocation per bucket. When \
         the sweeper empties a table, the table's memory, a large block, goes back to \
         the OS, so the idle row returns near the baseline with no call from anyone. \
         An earlier design boxed each bucket's key; glibc kept those small freed \
         chunks (about 31 MiB per million buckets) until `malloc_trim`. The second \
         wave row shows that a new wave of keys reuses the memory: 1.0 means no \
         growth."
    );
    out
}
