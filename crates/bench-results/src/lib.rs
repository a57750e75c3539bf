//! The contract between the benchmark binaries and `cargo xtask bench`: one
//! struct per results file, which the bench that measures it writes (to the
//! path given by its `--out` flag) and xtask reads back, typed on both
//! sides.
//!
//! | struct | file | written by |
//! |---|---|---|
//! | [`HttpResults`] | `http.json` | `crates/rate-tier-tower/benches/http.rs` |
//! | [`RedisResults`] | `redis.json` | `crates/rate-tier-tower/benches/redis_store.rs` |
//! | [`MemoryResults`] | `memory-ours.json` | `crates/rate-tier-tower/benches/memory.rs --store ours` |
//! | [`GovernorMemoryResults`] | `memory-governor.json` | `crates/rate-tier-tower/benches/memory.rs --store governor` |
//! | [`InstructionsResults`] | `instructions.json` | `crates/rate-tier-tower/benches/instructions.rs` |
//! | [`RlsResults`] | `rls.json` | `crates/rate-tier-service/benches/rls.rs` |
//! | [`LimitadorResults`] | `limitador.json` | `crates/rate-tier-service/benches/rls.rs --limitador BIN` |
//! | [`PostgresResults`] | `postgres.json` | `crates/rate-tier-storage/benches/postgres.rs` |
//! | [`ShaperResults`] | `shaper.json` | `examples/shaper.rs --results` |
//!
//! Every figure is an `Option`: a field missing from a file (a bench that
//! stopped early, an older file) reads as `None`, and so does a figure that
//! is not finite (a ratio over nothing), which is written as `null`. A
//! report shows `None` as a missing figure, never as zero.
//!
//! ```
//! use rate_tier_bench_results::{HttpResults, ResultsFile};
//!
//! let path = std::env::temp_dir().join(format!("doc-{}-{}", std::process::id(), HttpResults::FILE));
//! let mut results = HttpResults::default();
//! results.tower_rate_tier.rps = Some(61_000.0);
//! results.ratio_layer_vs_no_layer = Some(f64::NAN);
//! results.write(&path).unwrap();
//!
//! let read = HttpResults::read(&path).unwrap();
//! assert_eq!(read.tower_rate_tier.rps, Some(61_000.0));
//! assert_eq!(read.ratio_layer_vs_no_layer, None, "NaN is written as null");
//! assert_eq!(read.no_layer.rps, None, "never measured: missing");
//! # std::fs::remove_file(&path).unwrap();
//! ```

use std::fs;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A results file: its name, and how it is written and read (pretty JSON).
pub trait ResultsFile: Serialize + DeserializeOwned {
    /// The file's name: in `target/xtask-bench/` when `cargo xtask bench`
    /// runs the bench, and the name to give `--out` otherwise.
    const FILE: &'static str;

    /// Writes the results to `path` as JSON (a non-finite figure as `null`).
    fn write(&self, path: impl AsRef<Path>) -> Result<(), String> {
        let path = path.as_ref();
        let mut json = serde_json::to_string_pretty(self)
            .map_err(|e| format!("could not encode {}: {e}", Self::FILE))?;
        json.push('\n');
        fs::write(path, json)
            .map_err(|e| format!("could not write {}: {e}", path.display()))
    }

    /// Reads results written by [`ResultsFile::write`]; a field the file
    /// lacks reads as `None` (or empty).
    fn read(path: impl AsRef<Path>) -> Result<Self, String> {
        let path = path.as_ref();
        let text = fs::read_to_string(path)
            .map_err(|e| format!("could not read {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| {
            format!("{} is not {} results: {e}", path.display(), Self::FILE)
        })
    }
}

// Every file's name, in one place.

impl ResultsFile for HttpResults {
    const FILE: &'static str = "http.json";
}

impl ResultsFile for RedisResults {
    const FILE: &'static str = "redis.json";
}

impl ResultsFile for MemoryResults {
    const FILE: &'static str = "memory-ours.json";
}

impl ResultsFile for GovernorMemoryResults {
    const FILE: &'static str = "memory-governor.json";
}

impl ResultsFile for InstructionsResults {
    const FILE: &'static str = "instructions.json";
}

impl ResultsFile for RlsResults {
    const FILE: &'static str = "rls.json";
}

impl ResultsFile for LimitadorResults {
    const FILE: &'static str = "limitador.json";
}

impl ResultsFile for PostgresResults {
    const FILE: &'static str = "postgres.json";
}

impl ResultsFile for ShaperResults {
    const FILE: &'static str = "shaper.json";
}

// ---------------------------------------------------------------------------
// http.rs

/// Requests/s of a hello-world axum route over loopback HTTP/1.1 with no
/// layer, with `TierLimitLayer` (memory store) and with tower_governor's
/// layer (`benches/http.rs` of tower-rate-tier).
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(default)]
pub struct HttpResults {
    /// The load generator: `wrk`, or `rust` (the built-in client).
    pub client: Option<String>,
    /// Seconds each configuration ran per round.
    pub seconds: Option<f64>,
    /// Rounds (each runs the three configurations back to back).
    pub rounds: Option<u64>,
    /// Keep-alive connections of the load generator.
    pub connections: Option<u64>,
    /// Distinct `x-api-key` ids the requests rotate over.
    pub keys: Option<u64>,
    /// Worker threads of the servers' Tokio runtime.
    pub server_threads: Option<u64>,
    /// The route with no layer.
    pub no_layer: HttpServer,
    /// The route behind `TierLimitLayer`.
    pub tower_rate_tier: HttpServer,
    /// The route behind tower_governor's `GovernorLayer`.
    pub tower_governor: HttpServer,
    /// Req/s of the layer / of no layer: the median of the rounds' ratios.
    pub ratio_layer_vs_no_layer: Option<f64>,
    /// Req/s of the layer / of tower_governor: the median of the rounds'
    /// ratios.
    pub ratio_layer_vs_tower_governor: Option<f64>,
    /// Server CPU per request of the layer / of no layer: the median of the
    /// rounds' ratios.
    pub cpu_ratio_layer_vs_no_layer: Option<f64>,
    /// Server CPU per request of the layer / of tower_governor: the median
    /// of the rounds' ratios.
    pub cpu_ratio_layer_vs_tower_governor: Option<f64>,
}

/// What one of the HTTP benchmark's servers measured, over every round.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(default)]
pub struct HttpServer {
    /// Requests per second, the mean of the rounds.
    pub rps: Option<f64>,
    /// The server threads' CPU time per request, µs, the mean of the rounds.
    pub cpu_us: Option<f64>,
    /// Responses that were not 200, and socket errors, over every round
    /// (any voids the comparison).
    pub errors: Option<u64>,
}

// ---------------------------------------------------------------------------
// redis_store.rs

/// Checks/s of `RedisStorage` against redis-benchmark running the same
/// script, and the commands and time of 3 limits of one user
/// (`benches/redis_store.rs` of tower-rate-tier).
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(default)]
pub struct RedisResults {
    /// `StorageExt::check` calls per second of `RedisStorage`, the mean of the
    /// rounds.
    pub ours_per_sec: Option<f64>,
    /// EVALSHA calls per second of `redis-benchmark -c <tasks>`, the mean
    /// of the rounds.
    pub redis_benchmark_per_sec: Option<f64>,
    /// Ours / redis-benchmark `-c <tasks>`: the median of the rounds' ratios.
    pub ratio: Option<f64>,
    /// EVALSHA calls per second of `redis-benchmark -c 1 -P <tasks>` (one
    /// connection, pipelined: the shape of ours), the mean of the rounds.
    pub redis_benchmark_pipelined_per_sec: Option<f64>,
    /// Ours / the pipelined redis-benchmark: the median of the rounds'
    /// ratios.
    pub ratio_pipelined: Option<f64>,
    /// Checks of ours that failed, over every round (any voids the ratio).
    pub errors: Option<u64>,
    /// Tokio tasks checking concurrently on the one connection.
    pub tasks: Option<u64>,
    /// Distinct users the checks rotate over.
    pub keys: Option<u64>,
    /// Rounds of each side.
    pub rounds: Option<u64>,
    /// Seconds of each side per round.
    pub seconds: Option<f64>,
    /// Worker threads of the client's Tokio runtime.
    pub client_threads: Option<u64>,
    /// 3 limits of one user in one `RateTier::decide`.
    pub limits: RedisLimits,
}

/// 3 limits of one user (the tier and two per-user `Limit`s) in one
/// `RateTier::decide` on Redis: what the server saw, and the time.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(default)]
pub struct RedisLimits {
    /// Decisions counted (of new users, one at a time).
    pub decisions: Option<u64>,
    /// Commands clients sent per decision (`MONITOR`): 1 is one round trip.
    pub commands_per_decision: Option<f64>,
    /// Script calls per decision (`INFO commandstats`).
    pub script_calls_per_decision: Option<f64>,
    /// Keys written per decision (`SCAN`): 3 when every limit was decided.
    pub keys_per_decision: Option<f64>,
    /// Decisions refused (none expected: the quota allows each new user).
    pub refused: Option<u64>,
    /// µs per decision of the tier alone (`RateTier::check`), one at a
    /// time: the median of the rounds.
    pub one_us: Option<f64>,
    /// µs per decision of the 3 limits, one at a time: the median of the
    /// rounds.
    pub three_us: Option<f64>,
    /// 3 limits / the tier alone: the median of the rounds' ratios.
    pub time_ratio: Option<f64>,
}

// ---------------------------------------------------------------------------
// memory.rs

/// Resident size of `MemoryStorage` through waves of distinct keys, and
/// once idle after each (`benches/memory.rs --store ours` of
/// tower-rate-tier). Sizes are VmRSS, KiB.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(default)]
pub struct MemoryResults {
    /// The base number of keys (`--keys`) the wave sizes are multiples of.
    pub keys: Option<u64>,
    /// The store's sweep interval, seconds.
    pub sweep_secs: Option<f64>,
    /// RSS with the store built and empty, KiB.
    pub baseline_kib: Option<u64>,
    /// Each wave, in order (wave 1 first).
    pub waves: Vec<MemoryWave>,
    /// Waves read before the store was empty and a whole sweep had run
    /// after it (any voids the idle figures).
    pub unsettled_waves: Option<u64>,
    /// The highest RSS over the baseline after a wave went in, KiB.
    pub peak_growth_kib: Option<u64>,
    /// The highest RSS over the baseline once idle after a wave, KiB.
    pub worst_idle_growth_kib: Option<u64>,
    /// The wave of `worst_idle_growth_kib`, counted from 1.
    pub worst_idle_wave: Option<u64>,
    /// `worst_idle_growth_kib` / `peak_growth_kib`.
    pub worst_idle_ratio: Option<f64>,
}

impl MemoryResults {
    /// The memory bench's `--store` value that writes these results.
    pub const STORE: &'static str = "ours";
}

/// One wave of [`MemoryResults`]: distinct keys going in with the clock
/// standing still, then the period passing with the store idle.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(default)]
pub struct MemoryWave {
    /// Distinct keys checked in this wave.
    pub keys: Option<u64>,
    /// Whether the store was empty and a whole sweep had run after it when
    /// the idle RSS was read (false: read when `--idle-secs` ran out).
    pub settled: Option<bool>,
    /// RSS after the wave went in, KiB.
    pub after_insert_kib: Option<u64>,
    /// RSS once idle after the wave, KiB.
    pub after_idle_kib: Option<u64>,
    /// Buckets held after the wave went in.
    pub held_after_insert: Option<u64>,
    /// Buckets held once idle.
    pub held_after_idle: Option<u64>,
    /// Seconds the wave took to go in.
    pub insert_secs: Option<f64>,
    /// Seconds after the period passed until the store was empty (`None`:
    /// it never was, within `--idle-secs`).
    pub emptied_after_secs: Option<f64>,
}

/// Resident size of governor's keyed limiter after the first wave's keys,
/// and after as long idle with no `retain_recent` call (`benches/memory.rs
/// --store governor` of tower-rate-tier). Sizes are VmRSS, KiB.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(default)]
pub struct GovernorMemoryResults {
    /// Distinct keys checked.
    pub keys: Option<u64>,
    /// RSS with the limiter built and empty, KiB.
    pub baseline_kib: Option<u64>,
    /// RSS after the keys went in, KiB.
    pub after_insert_kib: Option<u64>,
    /// RSS after the idle wait, KiB.
    pub after_idle_kib: Option<u64>,
    /// Keys held after they went in.
    pub held_after_insert: Option<u64>,
    /// Keys held after the idle wait.
    pub held_after_idle: Option<u64>,
    /// Seconds the keys took to go in.
    pub insert_secs: Option<f64>,
}

impl GovernorMemoryResults {
    /// The memory bench's `--store` value that writes these results.
    pub const STORE: &'static str = "governor";
}

// ---------------------------------------------------------------------------
// instructions.rs

/// Instructions per check counted by callgrind, of each case of
/// `benches/instructions.rs` of tower-rate-tier (`None`: no count, e.g.
/// without valgrind).
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(default)]
pub struct InstructionsResults {
    /// Checks per counted run (`n`; the figures are the difference of `2n`
    /// and `n` checks, divided by `n`).
    pub checks: Option<u64>,
    /// `RateTier::check`, 1 hot key.
    pub ours_one_key: Option<f64>,
    /// governor's `check_key`, 1 hot key.
    pub governor_one_key: Option<f64>,
    /// `RateTier::check`, 100k keys round-robin.
    pub ours_100k_keys: Option<f64>,
    /// governor's `check_key`, 100k keys round-robin.
    pub governor_100k_keys: Option<f64>,
    /// `SyncTier::check`, 1 hot key.
    pub sync_one_key: Option<f64>,
    /// `SyncTier::check`, 100k keys round-robin.
    pub sync_100k_keys: Option<f64>,
    /// `MemoryStorage::check_sync` alone, 1 hot key.
    pub store_one_key: Option<f64>,
    /// `RateTier::decide` over the tier and 2 limits, 1 user.
    pub ours_three_limits: Option<f64>,
    /// An axum hello world called in process, per request.
    pub http_no_layer: Option<f64>,
    /// The same behind a layer that does nothing.
    pub http_noop_layer: Option<f64>,
    /// The same behind `TierLimitLayer` (memory).
    pub http_ours: Option<f64>,
    /// The same behind tower_governor's layer.
    pub http_governor: Option<f64>,
}

// ---------------------------------------------------------------------------
// rls.rs (rate-tier-service)

/// Envoy RLS `ShouldRateLimit` round trips/s of the standalone service
/// against the ceilings that bound them, and latency at a fixed offered
/// load (`benches/rls.rs` of rate-tier-service).
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(default)]
pub struct RlsResults {
    /// Requests in flight.
    pub concurrency: Option<u64>,
    /// HTTP/2 connections the requests share.
    pub connections: Option<u64>,
    /// Rounds of each side.
    pub rounds: Option<u64>,
    /// Seconds of each side per round (and of each latency run).
    pub seconds: Option<f64>,
    /// The latency runs' offered load, requests per second.
    pub offered_rate: Option<f64>,
    /// Calls per second of the service on the memory store, the median of
    /// the rounds.
    pub memory_rps: Option<f64>,
    /// Calls per second of the same tonic server answering a constant
    /// response, the median of the rounds.
    pub constant_rps: Option<f64>,
    /// `memory_rps` / `constant_rps`.
    pub memory_ratio: Option<f64>,
    /// Latency of the service on the memory store at `offered_rate`.
    pub memory_latency: Latency,
    /// Latency of the constant server at `offered_rate`.
    pub constant_latency: Latency,
    /// Calls per second of the service on Redis, the median of the rounds
    /// (`None` when the Redis half did not run).
    pub redis_rps: Option<f64>,
    /// EVALSHA calls per second of redis-benchmark running the same
    /// script, the median of the rounds.
    pub redis_benchmark_rps: Option<f64>,
    /// `redis_rps` / `redis_benchmark_rps`.
    pub redis_ratio: Option<f64>,
    /// `redis_rps` / `constant_rps`: how much of the gRPC stack's ceiling
    /// the service keeps when every decision goes to Redis.
    pub redis_vs_constant_ratio: Option<f64>,
    /// Latency of the service on Redis at `offered_rate`.
    pub redis_latency: Latency,
}

/// `ShouldRateLimit` round trips/s of the standalone service against
/// Kuadrant's `limitador-server`, the same client, descriptors and
/// concurrency for both, in alternating rounds (`benches/rls.rs
/// --limitador BIN` of rate-tier-service). Each comparison keeps every
/// round, so that a report can show the spread as well as the medians.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(default)]
pub struct LimitadorResults {
    /// `limitador-server --version`, as it printed it.
    pub limitador_version: Option<String>,
    /// Requests in flight.
    pub concurrency: Option<u64>,
    /// HTTP/2 connections to each server.
    pub connections: Option<u64>,
    /// Distinct descriptor values the requests rotate over.
    pub users: Option<u64>,
    /// Seconds of each side per round.
    pub seconds: Option<f64>,
    /// Our service on the memory store against limitador's `memory` mode.
    pub memory: Vec<VersusRound>,
    /// Our service on Redis against limitador's `redis` mode, on the same
    /// Redis (empty when the Redis half did not run).
    pub redis: Vec<VersusRound>,
    /// Our service on Redis against limitador's `redis_cached` mode
    /// (batched, approximate), on the same Redis.
    pub redis_cached: Vec<VersusRound>,
}

/// One round of a comparison: calls/s of each side, measured one after
/// the other.
#[derive(Serialize, Deserialize, Debug, Default, Clone, Copy, PartialEq)]
#[serde(default)]
pub struct VersusRound {
    /// Our service's calls per second.
    pub ours: f64,
    /// limitador-server's calls per second.
    pub theirs: f64,
}

// ---------------------------------------------------------------------------
// postgres.rs (rate-tier-storage)

/// Checks/s of `PostgresStorage` against pgbench running the same
/// statement, and the server's CPU per check against a plain `UPDATE` of
/// one row by primary key (`benches/postgres.rs` of rate-tier-storage).
/// Rates are the means of the rounds, ratios the medians of the rounds'
/// ratios.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(default)]
pub struct PostgresResults {
    /// `StorageExt::check` calls per second of `PostgresStorage`.
    pub ours_per_sec: Option<f64>,
    /// Calls per second of pgbench running the statement the store sends.
    pub pgbench_per_sec: Option<f64>,
    /// Ours / pgbench, the same statement.
    pub ratio: Option<f64>,
    /// The server's CPU per check of ours, µs.
    pub ours_cpu_us: Option<f64>,
    /// The server's CPU per plain `UPDATE` (pgbench), µs.
    pub update_cpu_us: Option<f64>,
    /// Plain `UPDATE`s per second (pgbench).
    pub update_per_sec: Option<f64>,
    /// Ours / the plain `UPDATE`, CPU per call.
    pub cpu_ratio: Option<f64>,
    /// The server's CPU per call of the check function with one bucket
    /// (pgbench), µs: the path of several limits and of refusals.
    pub function_cpu_us: Option<f64>,
    /// The check function / the plain `UPDATE`, CPU per call.
    pub function_cpu_ratio: Option<f64>,
    /// Checks of ours that failed, over every round (any voids the ratio).
    pub errors: Option<u64>,
    /// Tokio tasks of ours, and pgbench's clients.
    pub tasks: Option<u64>,
    /// Distinct users the checks rotate over.
    pub keys: Option<u64>,
    /// Rounds of each side.
    pub rounds: Option<u64>,
    /// Seconds of each side per round.
    pub seconds: Option<f64>,
    /// `postgres --version`.
    pub server_version: Option<String>,
}

// ---------------------------------------------------------------------------
// shaper.rs (examples)

/// What the upstream of `examples/shaper.rs` saw: worker processes calling
/// it through one `ShapeLayer` quota in Redis, every call fired at once.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(default)]
pub struct ShaperResults {
    /// Worker processes sharing the quota.
    pub workers: Option<u64>,
    /// Calls the upstream saw, from every worker.
    pub calls: Option<u64>,
    /// The quota, calls per second.
    pub quota_per_sec: Option<f64>,
    /// Seconds from the first call the upstream saw to the last.
    pub seconds: Option<f64>,
    /// Calls per second the upstream saw: the intervals between its first
    /// and last call (`calls - 1`) over `seconds`.
    pub observed_per_sec: Option<f64>,
    /// The most calls the upstream saw in any second, `[t, t + 1 s)` from
    /// each call's arrival: what a provider counts.
    pub busiest_second: Option<u64>,
    /// The closest two calls the upstream saw, ms apart.
    pub closest_ms: Option<f64>,
    /// The quota's interval, ms.
    pub interval_ms: Option<f64>,
    /// Calls the workers' shapers refused (`ShapeError::WaitTooLong`).
    pub refused: Option<u64>,
}

/// Open-loop latency quantiles, each request timed from when it was due.
#[derive(Serialize, Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(default)]
pub struct Latency {
    /// The median, µs.
    pub p50_us: Option<f64>,
    /// The 99th percentile, µs.
    pub p99_us: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of this test's own in the temporary directory.
    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!(
            "rate-tier-bench-results-{}-{name}",
            std::process::id()
        ))
    }

    #[test]
    fn results_written_read_back_equal() {
        let path = temp(RlsResults::FILE);
        let results = RlsResults {
            concurrency: Some(64),
            seconds: Some(1.5),
            memory_rps: Some(18_000.25),
            memory_latency: Latency {
                p50_us: Some(150.0),
                p99_us: Some(400.0),
            },
            redis_ratio: Some(0.25),
            ..RlsResults::default()
        };
        results.write(&path).unwrap();
        assert_eq!(RlsResults::read(&path).unwrap(), results);

        let path = temp(MemoryResults::FILE);
        let results = MemoryResults {
            baseline_kib: Some(2048),
            waves: vec![
                MemoryWave {
                    keys: Some(1_000_000),
                    settled: Some(true),
                    after_idle_kib: Some(2304),
                    ..MemoryWave::default()
                },
                MemoryWave {
                    settled: Some(false),
                    ..MemoryWave::default()
                },
            ],
            worst_idle_ratio: Some(0.025),
            ..MemoryResults::default()
        };
        results.write(&path).unwrap();
        assert_eq!(MemoryResults::read(&path).unwrap(), results);
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(temp(RlsResults::FILE)).unwrap();
    }

    #[test]
    fn a_missing_field_reads_as_none_and_a_non_finite_figure_as_null() {
        let path = temp(RedisResults::FILE);
        std::fs::write(
            &path,
            r#"{ "ours_per_sec": 90000.5, "limits": { "refused": 0 }, "unknown": 1 }"#,
        )
        .unwrap();
        let read = RedisResults::read(&path).unwrap();
        assert_eq!(read.ours_per_sec, Some(90_000.5));
        assert_eq!(read.ratio, None, "a field the file lacks is missing");
        assert_eq!(read.limits.refused, Some(0));
        assert_eq!(read.limits.commands_per_decision, None);

        let results = RedisResults {
            ratio: Some(f64::INFINITY),
            ..RedisResults::default()
        };
        results.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"ratio\": null"), "{text}");
        assert_eq!(RedisResults::read(&path).unwrap().ratio, None);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn limitador_rounds_written_read_back_equal() {
        let path = temp(LimitadorResults::FILE);
        let round = |ours, theirs| VersusRound { ours, theirs };
        let results = LimitadorResults {
            limitador_version: Some("Limitador Server v2.1.0".to_owned()),
            concurrency: Some(64),
            memory: vec![round(20_000.0, 18_000.5), round(21_000.0, 17_500.0)],
            redis_cached: vec![round(9_000.0, 9_100.0)],
            ..LimitadorResults::default()
        };
        results.write(&path).unwrap();
        assert_eq!(LimitadorResults::read(&path).unwrap(), results);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn shaper_results_written_read_back_equal() {
        let path = temp(ShaperResults::FILE);
        let results = ShaperResults {
            workers: Some(2),
            calls: Some(200),
            quota_per_sec: Some(20.0),
            seconds: Some(9.95),
            observed_per_sec: Some(20.0),
            busiest_second: Some(21),
            closest_ms: Some(39.5),
            interval_ms: Some(50.0),
            refused: Some(0),
        };
        results.write(&path).unwrap();
        assert_eq!(ShaperResults::read(&path).unwrap(), results);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn an_unreadable_file_is_an_error_that_names_it() {
        let missing = temp("missing.json");
        let error = HttpResults::read(&missing).unwrap_err();
        assert!(error.contains("missing.json"), "{error}");

        let path = temp("not-json.json");
        std::fs::write(&path, "not json").unwrap();
        let error = HttpResults::read(&path).unwrap_err();
        assert!(error.contains("is not http.json results"), "{error}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn every_file_has_its_own_name() {
        let mut names = [
            HttpResults::FILE,
            RedisResults::FILE,
            MemoryResults::FILE,
            GovernorMemoryResults::FILE,
            InstructionsResults::FILE,
            RlsResults::FILE,
            LimitadorResults::FILE,
            PostgresResults::FILE,
            ShaperResults::FILE,
        ];
        names.sort_unstable();
        let before = names.len();
        let mut names = names.to_vec();
        names.dedup();
        assert_eq!(names.len(), before);
    }
}
