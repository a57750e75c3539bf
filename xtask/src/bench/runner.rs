//! Running the benchmarks: building the bench targets, running each part,
//! and handing back what it measured or why it could not. No part stops
//! another: a bench target that does not build, or a tool that is
//! missing, leaves its rows saying so.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rate_tier_bench_results::{
    GovernorMemoryResults, HttpResults, InstructionsResults, LimitadorResults,
    MemoryResults, PostgresResults, RedisResults, ResultsFile, RlsResults,
    ShaperResults,
};
use serde_json::Value;

use super::parse::{self, CommandStat, Passes};
use super::plan::{Part, Plan, RedisBins, Tools};
use crate::cmd::Result;
use crate::cmd::{Cmd, project_root};
use crate::redis::RedisServer;

/// The package the bench targets belong to, and the features they need.
const PACKAGE: &str = "tower-rate-tier";
const FEATURES: &str = "redis";
/// The criterion bench targets: the package's, and the store's `kinds`
/// (windows, periods and concurrency slots against a rate) and `reserve`
/// (a reservation against a check), each in memory and, with its `redis`
/// feature and a throwaway Redis, on Redis.
pub(crate) const CRITERION_BENCHES: [Target; 5] = [
    (PACKAGE, FEATURES, "check"),
    (PACKAGE, FEATURES, "breaker"),
    (PACKAGE, FEATURES, "limits"),
    (STORAGE_PACKAGE, "redis", KINDS_BENCH),
    (STORAGE_PACKAGE, "redis", RESERVE_BENCH),
];
/// The package's other bench targets (harness = false).
pub(crate) const OTHER_BENCHES: [&str; 4] =
    ["http", "redis_store", "memory", INSTRUCTIONS_BENCH];
/// The target that counts instructions per check under callgrind.
const INSTRUCTIONS_BENCH: &str = "instructions";
/// The standalone service's package, and its bench target (no features).
const SERVICE_PACKAGE: &str = "rate-tier-service";
pub(crate) const RLS_BENCH: &str = "rls";
/// The store's package, its PostgreSQL bench target and its feature, and
/// its criterion target of the kinds beside the rate.
const STORAGE_PACKAGE: &str = "rate-tier-storage";
pub(crate) const POSTGRES_BENCH: &str = "postgres";
const KINDS_BENCH: &str = "kinds";
/// The store's criterion target of a reservation against a check.
const RESERVE_BENCH: &str = "reserve";
/// The criterion targets with Redis groups, and where they find the Redis
/// (one throwaway Redis for them all: each names its keys after its
/// process).
const REDIS_CRITERION_BENCHES: [&str; 2] = [KINDS_BENCH, RESERVE_BENCH];
const KINDS_REDIS_VAR: &str = "TRT_REDIS_URL";
/// The examples' package, and the example of the `shaper` part: worker
/// processes shaped through one quota on Redis.
const EXAMPLES_PACKAGE: &str = "examples";
pub(crate) const SHAPER_EXAMPLE: &str = "shaper";
/// Where the Lua scripts are.
const SCRIPTS_DIR: &str = "crates/rate-tier-storage/src/redis";

/// What a part measured, or why it has no figure.
pub(crate) type Outcome<T> = std::result::Result<T, String>;

/// The bench executables by target name, or why each did not build.
pub(crate) struct Built(BTreeMap<&'static str, Outcome<PathBuf>>);

impl Built {
    /// The executable of `target`, or why there is none.
    pub(crate) fn exe(&self, target: &str) -> Outcome<&Path> {
        match self.0.get(target) {
            Some(Ok(path)) => Ok(path),
            Some(Err(why)) => Err(why.clone()),
            None => Err(format!("bench target `{target}` was not built")),
        }
    }

    /// Builds the example `name` of the examples' package (`cargo build`,
    /// the dev profile its tests use: it waits on a quota, the build's
    /// speed is not what it measures).
    pub(crate) fn add_example(&mut self, name: &'static str) {
        let exe = Cmd::cargo()
            .args(["build", "-p", EXAMPLES_PACKAGE, "--example", name])
            .arg("--message-format=json-render-diagnostics")
            .read_stdout()
            .map_err(|_| {
                format!("example `{name}` did not build (its errors are above)")
            })
            .and_then(|messages| {
                executable(&messages, "example", name).ok_or_else(|| {
                    format!("cargo built no executable for example `{name}`")
                })
            });
        if let Err(why) = &exe {
            println!("xtask: {why}");
        }
        self.0.insert(name, exe);
    }
}

/// A bench target to build: (package, features, target). Target names are
/// unique across the packages: [`Built`] is keyed by them.
pub(crate) type Target = (&'static str, &'static str, &'static str);

/// Every bench target of the run.
pub(crate) fn targets() -> Vec<Target> {
    CRITERION_BENCHES
        .into_iter()
        .chain(OTHER_BENCHES.map(|target| (PACKAGE, FEATURES, target)))
        .chain([
            (SERVICE_PACKAGE, "", RLS_BENCH),
            (STORAGE_PACKAGE, "postgres", POSTGRES_BENCH),
        ])
        .collect()
}

/// Builds each bench target on its own (`cargo bench --no-run`), so that
/// one that does not compile fails its own rows only. Their executables
/// then run directly: every part measures the same build.
pub(crate) fn build(targets: &[Target]) -> Built {
    let mut built = BTreeMap::new();
    for &(package, features, target) in targets {
        let mut cargo = Cmd::cargo().args(["bench", "-p", package, "--no-run"]);
        if target == RLS_BENCH {
            // The service as it ships, and as limitador-server ships.
            cargo = cargo.args(["--profile", "dist"]);
        }
        if !features.is_empty() {
            cargo = cargo.args(["--features", features]);
        }
        let exe = cargo
            .arg(format!("--bench={target}"))
            .arg("--message-format=json-render-diagnostics")
            .read_stdout()
            .map_err(|_| {
                format!("bench target `{target}` did not build (its errors are above)")
            })
            .and_then(|messages| {
                executable(&messages, "bench", target).ok_or_else(|| {
                    format!("cargo built no executable for `{target}`")
                })
            });
        if let Err(why) = &exe {
            println!("xtask: {why}");
        }
        built.insert(target, exe);
    }
    Built(built)
}

/// The executable cargo reported for target `target` of kind `kind`
/// (`bench`, `example`).
fn executable(messages: &str, kind: &str, target: &str) -> Option<PathBuf> {
    messages.lines().find_map(|message| {
        let message: Value = serde_json::from_str(message).ok()?;
        let is_kind = message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k == kind));
        (is_kind && message["target"]["name"] == target)
            .then(|| message["executable"].as_str().map(PathBuf::from))
            .flatten()
    })
}

/// What the criterion targets measured.
pub(crate) struct Criterion {
    /// Every pass's estimates.
    pub(crate) passes: Passes,
    /// Why the Redis groups (of `kinds` and `reserve`) did not run, when
    /// they did not (a missing tool: `skipped: ...`, or a throwaway Redis
    /// that did not start).
    pub(crate) no_redis: Option<String>,
}

/// The criterion targets, in passes, each pass's estimates read before the
/// next overwrites them. The targets with Redis groups (`kinds`,
/// `reserve`) run on one throwaway Redis for every pass (their limit names
/// are their process's own), when the Redis programs are there.
pub(crate) fn criterion(
    plan: &Plan,
    tools: &Tools,
    built: &Built,
    criterion_home: &Path,
    criterion_args: &[OsString],
) -> Criterion {
    let wants_redis = REDIS_CRITERION_BENCHES
        .iter()
        .any(|target| built.exe(target).is_ok());
    let redis =
        wants_redis.then(|| start_redis(tools).map(|(_, server)| server));
    let no_redis = match &redis {
        Some(Err(why)) => {
            println!(
                "xtask: the kinds and reserve rows on Redis have no figure: {why}"
            );
            Some(why.clone())
        }
        _ => None,
    };
    let mut passes = Passes::default();
    parse::forget_criterion_results(criterion_home);
    for pass in 1..=plan.criterion_passes {
        println!("xtask: criterion pass {pass} of {}", plan.criterion_passes);
        for (_, _, target) in CRITERION_BENCHES {
            let Ok(exe) = built.exe(target) else { continue };
            let mut criterion = Cmd::new(exe)
                .env("CRITERION_HOME", criterion_home)
                .arg("--bench");
            if let Some(Ok(server)) = &redis
                && REDIS_CRITERION_BENCHES.contains(&target)
            {
                criterion = criterion.env(KINDS_REDIS_VAR, server.url());
            }
            if !plan.full {
                criterion = criterion.arg("--quick");
            }
            if let Err(e) = criterion.args(criterion_args).run() {
                println!("xtask: {e}");
            }
        }
        passes.read(criterion_home);
        parse::forget_criterion_results(criterion_home);
    }
    Criterion { passes, no_redis }
    // The Redis of the Redis groups is stopped here.
}

/// A throwaway Redis of the installed Redis programs, stopped when
/// dropped; or why there is none (`skipped: ...` for missing programs).
fn start_redis(tools: &Tools) -> Outcome<(&RedisBins, RedisServer)> {
    let bins = tools
        .redis
        .as_ref()
        .map_err(|why| format!("skipped: {why}"))?;
    Ok((bins, RedisServer::start(&bins.server)?))
}

/// Runs a bench target that writes its results `R` to `--out`, its file in
/// `results_dir`, and reads them back.
fn results_target<R: ResultsFile>(cmd: Cmd, results_dir: &Path) -> Outcome<R> {
    let out = results_dir.join(R::FILE);
    cmd.arg("--out").arg(&out).run()?;
    R::read(&out)
}

/// The shaper example on a throwaway Redis: its worker processes call its
/// upstream through one quota, and it writes what the upstream saw
/// (`--results`, [`ShaperResults`]).
pub(crate) fn shaper(
    plan: &Plan,
    tools: &Tools,
    built: &Built,
    results_dir: &Path,
) -> Outcome<ShaperResults> {
    let exe = built.exe(SHAPER_EXAMPLE)?;
    let (_, server) = start_redis(tools)?;
    let (calls, rate, workers) = plan.shaper;
    let out = results_dir.join(ShaperResults::FILE);
    Cmd::new(exe)
        .args(["--redis", &server.url()])
        .args(["--calls", &calls.to_string()])
        .args(["--rate", &rate.to_string()])
        .args(["--workers", &workers.to_string()])
        .arg("--results")
        .arg(&out)
        .run()?;
    ShaperResults::read(&out)
    // `server` is stopped here.
}

/// HTTP: three servers in one process, with wrk or the built-in client.
pub(crate) fn http(
    plan: &Plan,
    tools: &Tools,
    built: &Built,
    results_dir: &Path,
) -> Outcome<HttpResults> {
    let (secs, rounds) = plan.http;
    let mut http = Cmd::new(built.exe("http")?)
        .args(["--seconds", &secs.to_string()])
        .args(["--rounds", &rounds.to_string()]);
    if let Some(wrk) = &tools.wrk {
        http = http.arg("--wrk").arg(wrk);
    }
    results_target(http, results_dir)
}

/// Instructions per check and per request, counted by callgrind (the
/// bench runs itself under valgrind, one case at a time, on the same keys
/// as check.rs, limits.rs and http.rs).
pub(crate) fn instructions(
    tools: &Tools,
    built: &Built,
    results_dir: &Path,
) -> Outcome<InstructionsResults> {
    let exe = built.exe(INSTRUCTIONS_BENCH)?;
    // The bench runs the `valgrind` on PATH, the one found.
    tools
        .valgrind
        .as_ref()
        .map_err(|why| format!("skipped: {why}"))?;
    let results: InstructionsResults =
        results_target(Cmd::new(exe), results_dir)?;
    if results.ours_one_key.is_none() {
        return Err("callgrind counted nothing (see the bench's output \
                    above)"
            .to_owned());
    }
    Ok(results)
}

/// `RedisStorage` checks/s against redis-benchmark, on a throwaway Redis.
pub(crate) fn redis_store(
    plan: &Plan,
    tools: &Tools,
    built: &Built,
    results_dir: &Path,
) -> Outcome<RedisResults> {
    let exe = built.exe("redis_store")?;
    let (bins, server) = start_redis(tools)?;
    let port = server.port().to_string();
    let redis = RedisCli::new(&bins.cli, server.port());
    let sha = redis
        .script_load(&project_root().join(SCRIPTS_DIR).join("gcra.lua"))?;
    let (secs, rounds) = plan.redis;
    let cmd = Cmd::new(exe)
        .args(["--url", &server.url(), "--port", &port, "--sha", &sha])
        .arg("--redis-benchmark")
        .arg(&bins.benchmark)
        .args(["--seconds", &secs.to_string()])
        .args(["--rounds", &rounds.to_string()]);
    results_target(cmd, results_dir)
    // `server` is stopped here.
}

/// `PostgresStorage` checks/s against pgbench, and the server's CPU per
/// check against a plain `UPDATE`, on a throwaway PostgreSQL the bench
/// starts itself (`PostgresServer` of test-support).
pub(crate) fn postgres(
    plan: &Plan,
    tools: &Tools,
    built: &Built,
    results_dir: &Path,
) -> Outcome<PostgresResults> {
    let exe = built.exe(POSTGRES_BENCH)?;
    let bin_dir = tools
        .postgres
        .as_ref()
        .map_err(|why| format!("skipped: {why}"))?;
    let (secs, rounds) = plan.postgres;
    let cmd = Cmd::new(exe)
        .env("TRT_POSTGRES_BIN_DIR", bin_dir)
        .env("TRT_POSTGRES_BACKEND", "process")
        .args(["--seconds", &secs.to_string()])
        .args(["--rounds", &rounds.to_string()]);
    results_target(cmd, results_dir)
}

/// RSS of our store after waves of 1M keys, then idle.
pub(crate) fn memory(
    plan: &Plan,
    built: &Built,
    results_dir: &Path,
) -> Outcome<MemoryResults> {
    memory_of(plan, built, results_dir, MemoryResults::STORE)
}

/// RSS of governor's keyed limiter after 1M keys, then idle.
pub(crate) fn memory_peer(
    plan: &Plan,
    built: &Built,
    results_dir: &Path,
) -> Outcome<GovernorMemoryResults> {
    memory_of(plan, built, results_dir, GovernorMemoryResults::STORE)
}

/// The memory bench with `--store store`: one process per store, so that
/// their sizes do not mix.
fn memory_of<R: ResultsFile>(
    plan: &Plan,
    built: &Built,
    results_dir: &Path,
    store: &str,
) -> Outcome<R> {
    let sweep = plan.sweep_secs;
    let idle = sweep * 2 + 2;
    let cmd = Cmd::new(built.exe("memory")?)
        .args(["--store", store, "--sweep-secs", &sweep.to_string()])
        .args(["--idle-secs", &idle.to_string()]);
    results_target(cmd, results_dir)
}

/// What a part with a Redis half measured (the service's `rls` and
/// `limitador` parts).
pub(crate) struct WithRedis<R> {
    /// The bench's results.
    pub(crate) results: R,
    /// Why the Redis half did not run, when it did not: a missing tool
    /// (`skipped: ...`), or a throwaway Redis that did not start.
    pub(crate) no_redis: Option<String>,
}

/// What the standalone service's part measured.
pub(crate) type Rls = WithRedis<RlsResults>;

/// What the comparison with limitador-server measured.
pub(crate) type Limitador = WithRedis<LimitadorResults>;

/// Runs the bench `cmd` with `redis`'s arguments, its Redis running until
/// the bench ends; or, when there is no Redis, without them, saying that
/// `rows` on Redis have no figure and why.
fn maybe_on_redis<R: ResultsFile>(
    cmd: Cmd,
    redis: Outcome<(RedisServer, Vec<String>)>,
    rows: &str,
    results_dir: &Path,
) -> Outcome<WithRedis<R>> {
    match redis {
        Ok((_server, args)) => Ok(WithRedis {
            results: results_target(cmd.args(args), results_dir)?,
            no_redis: None,
        }),
        Err(why) => {
            println!("xtask: {rows} on Redis have no figure: {why}");
            Ok(WithRedis {
                results: results_target(cmd, results_dir)?,
                no_redis: Some(why),
            })
        }
    }
}

/// The standalone service (`rls` of `rate-tier-service`): `ShouldRateLimit`
/// round trips/s on the memory store against the same tonic server
/// answering a constant response, then on a throwaway Redis against
/// redis-benchmark running the same script, and p50/p99 at a fixed offered
/// load. Without the Redis programs, the memory and latency parts alone.
pub(crate) fn rls(
    plan: &Plan,
    tools: &Tools,
    built: &Built,
    results_dir: &Path,
) -> Outcome<Rls> {
    // Its target is built for the `limitador` part too.
    if !plan.runs(Part::Rls) {
        return Err("not run (not in --only)".to_owned());
    }
    let exe = built.exe(RLS_BENCH)?;
    let (secs, rounds) = plan.rls;
    let cmd = Cmd::new(exe)
        .args(["--seconds", &secs.to_string()])
        .args(["--rounds", &rounds.to_string()]);
    let redis = start_redis(tools).and_then(|(bins, server)| {
        let sha = RedisCli::new(&bins.cli, server.port())
            .script_load(&project_root().join(SCRIPTS_DIR).join("gcra.lua"))?;
        let args = vec![
            "--url".to_owned(),
            server.url(),
            "--port".to_owned(),
            server.port().to_string(),
            "--sha".to_owned(),
            sha,
            "--redis-benchmark".to_owned(),
            bins.benchmark.display().to_string(),
        ];
        Ok((server, args))
    });
    maybe_on_redis(cmd, redis, "the service's rows", results_dir)
}

/// Our service against Kuadrant's `limitador-server` (the `rls` target
/// with `--limitador`: the same client for both): `ShouldRateLimit`/s in
/// memory, then on one throwaway Redis against its `redis` and
/// `redis_cached` modes, in alternating rounds. Without the binary, no
/// figure and how to build it; without the Redis programs, memory alone.
pub(crate) fn limitador(
    plan: &Plan,
    tools: &Tools,
    built: &Built,
    results_dir: &Path,
) -> Outcome<Limitador> {
    if !plan.runs(Part::Limitador) {
        return Err("not run (not in --only)".to_owned());
    }
    let bin = tools.limitador.as_ref().map_err(Clone::clone)?;
    let exe = built.exe(RLS_BENCH)?;
    let (secs, rounds) = plan.limitador;
    let cmd = Cmd::new(exe)
        .arg("--limitador")
        .arg(bin)
        .args(["--seconds", &secs.to_string()])
        .args(["--rounds", &rounds.to_string()]);
    let redis = start_redis(tools).map(|(_, server)| {
        let args = vec!["--url".to_owned(), server.url()];
        (server, args)
    });
    maybe_on_redis(
        cmd,
        redis,
        "the service's rows against limitador",
        results_dir,
    )
}

// ---------------------------------------------------------------------------
// Redis CPU per script call.

/// How a script is called in the Redis CPU part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// `EVALSHA`, as `RedisStorage` calls it.
    Evalsha,
    /// `FCALL` of the same body loaded as a Redis 7 function.
    Fcall,
}

/// One script call measured for Redis CPU: which script, how, and its
/// `KEYS` and `ARGV` (redis-benchmark replaces each `__rand_int__` with a
/// key number of its own, so the keys are distinct).
pub(crate) struct CpuCase {
    pub(crate) name: &'static str,
    pub(crate) script: &'static str,
    pub(crate) via: Via,
    pub(crate) keys: &'static [&'static str],
    pub(crate) args: &'static [&'static str],
}

/// T = 1 µs, tau = 1 s (1,000,000 per second, as the checks/s row): never
/// refuses, so every call reads TIME, GETs, decides and SETs PX. The most
/// debt a settlement may leave: tau, a quota's default (the scripts that
/// take it per key require it: `gcra_all.lua` 5 arguments a key, T, tau,
/// cost, shadow and max debt; `gcra_settle.lua` 4, T, tau, units and max
/// debt).
const T: &str = "1";
const TAU: &str = "1000000";
const MAX_DEBT: &str = TAU;

/// Every script call the Redis CPU part measures, by name.
pub(crate) const CPU_CASES: &[CpuCase] = &[
    CpuCase {
        name: "gcra",
        script: "gcra.lua",
        via: Via::Evalsha,
        keys: &["trt:bench:__rand_int__"],
        args: &[T, TAU, "1"],
    },
    CpuCase {
        name: "gcra_all_1",
        script: "gcra_all.lua",
        via: Via::Evalsha,
        keys: &["trt:bench:{__rand_int__}"],
        args: &[T, TAU, "1", "0", MAX_DEBT],
    },
    CpuCase {
        name: "gcra_all_3",
        script: "gcra_all.lua",
        via: Via::Evalsha,
        keys: &[
            "trt:plan:{__rand_int__}",
            "trt:route:{__rand_int__}",
            "trt:tokens:{__rand_int__}",
        ],
        args: &[
            T, TAU, "1", "0", MAX_DEBT, T, TAU, "1", "0", MAX_DEBT, T, TAU,
            "1", "0", MAX_DEBT,
        ],
    },
    CpuCase {
        name: "gcra_settle",
        script: "gcra_settle.lua",
        via: Via::Evalsha,
        keys: &["trt:settle:__rand_int__"],
        args: &[T, TAU, "1", MAX_DEBT],
    },
    CpuCase {
        name: "gcra_fcall",
        script: "gcra.lua",
        via: Via::Fcall,
        keys: &["trt:fcall:__rand_int__"],
        args: &[T, TAU, "1"],
    },
];

/// The commands a check cannot avoid, per round: server µs per call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Floor {
    pub(crate) get: f64,
    pub(crate) set: f64,
    pub(crate) time: f64,
}

impl Floor {
    /// `TIME` and a GET and a SET PX per key.
    pub(crate) fn for_keys(self, keys: usize) -> f64 {
        self.time + keys as f64 * (self.get + self.set)
    }
}

/// One round of the Redis CPU part.
pub(crate) struct CpuRound {
    pub(crate) floor: Floor,
    /// Server µs per call of each case, by name; a case that failed is
    /// missing here and named in [`RedisCpu::failed`].
    pub(crate) calls: BTreeMap<&'static str, f64>,
}

/// What the Redis CPU part measured.
pub(crate) struct RedisCpu {
    pub(crate) rounds: Vec<CpuRound>,
    /// Why a case has no figure (a script error, FCALL on Redis 6, ...).
    pub(crate) failed: BTreeMap<&'static str, String>,
    /// The exact commands, for the report.
    pub(crate) commands: Vec<String>,
}

/// Server µs per call of each script (`INFO commandstats` after `CONFIG
/// RESETSTAT`) and of `GET`, `SET PX` and `TIME`, on one throwaway Redis,
/// in rounds that alternate all of them.
pub(crate) fn redis_cpu(plan: &Plan, tools: &Tools) -> Outcome<RedisCpu> {
    // The one part with no bench target to have built: `--only` asks here.
    if !plan.runs(Part::RedisCpu) {
        return Err("not run (not in --only)".to_owned());
    }
    let (bins, server) = start_redis(tools)?;
    let redis = RedisCli::new(&bins.cli, server.port());
    let (requests, rounds) = plan.redis_cpu;
    let bench = |words: &[&str]| {
        let mut cmd = Cmd::new(&bins.benchmark)
            .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
            .args([
                "-c",
                "50",
                "-r",
                "1000",
                "-n",
                &requests.to_string(),
                "-q",
            ]);
        cmd = cmd.args(words);
        cmd
    };

    let dir = project_root().join(SCRIPTS_DIR);
    let mut calls: Vec<(&CpuCase, Vec<String>)> = Vec::new();
    let mut failed = BTreeMap::new();
    for case in CPU_CASES {
        let path = dir.join(case.script);
        let head = match case.via {
            Via::Evalsha => redis
                .script_load(&path)
                .map(|sha| vec!["EVALSHA".to_owned(), sha]),
            Via::Fcall => redis
                .function_load(&path, case.name)
                .map(|name| vec!["FCALL".to_owned(), name]),
        };
        match head {
            Ok(mut words) => {
                words.push(case.keys.len().to_string());
                words.extend(case.keys.iter().map(|k| (*k).to_owned()));
                words.extend(case.args.iter().map(|a| (*a).to_owned()));
                calls.push((case, words));
            }
            Err(why) => {
                println!("xtask: Redis CPU of {}: {why}", case.name);
                failed.insert(case.name, why);
            }
        }
    }

    let floor_commands: [&[&str]; 3] = [
        &[
            "SET",
            "trt:floor:__rand_int__",
            "1790947155000000",
            "PX",
            "60000",
        ],
        &["GET", "trt:floor:__rand_int__"],
        &["TIME"],
    ];
    let mut commands: Vec<String> = floor_commands
        .iter()
        .map(|words| bench(words).display())
        .collect();
    commands.extend(
        calls
            .iter()
            .map(|(_, words)| bench(&words_ref(words)).display()),
    );
    for command in &commands {
        println!("$ {command}");
    }

    let mut cpu_rounds = Vec::new();
    for round in 1..=rounds {
        println!("xtask: Redis CPU round {round} of {rounds}");
        let mut floor = [0.0; 3];
        for (slot, words) in floor.iter_mut().zip(floor_commands) {
            let stat = redis.measure(&bench(words), words[0])?;
            *slot = stat.usec_per_call().ok_or("no call was counted")?;
        }
        let mut measured = BTreeMap::new();
        for (case, words) in &calls {
            if failed.contains_key(case.name) {
                continue;
            }
            let verb = if case.via == Via::Fcall {
                "fcall"
            } else {
                "evalsha"
            };
            match redis.measure(&bench(&words_ref(words)), verb) {
                Ok(stat) if stat.failed > 0 => {
                    failed.insert(
                        case.name,
                        format!(
                            "{} of {} calls were errors",
                            stat.failed, stat.stat.calls
                        ),
                    );
                }
                Ok(stat) => {
                    if let Some(us) = stat.usec_per_call() {
                        measured.insert(case.name, us);
                    }
                }
                Err(why) => {
                    failed.insert(case.name, why);
                }
            }
        }
        cpu_rounds.push(CpuRound {
            floor: Floor {
                set: floor[0],
                get: floor[1],
                time: floor[2],
            },
            calls: measured,
        });
    }
    Ok(RedisCpu {
        rounds: cpu_rounds,
        failed,
        commands,
    })
    // `server` is stopped here.
}

fn words_ref(words: &[String]) -> Vec<&str> {
    words.iter().map(String::as_str).collect()
}

/// A command's statistics with the errors among its calls.
struct Measured {
    stat: CommandStat,
    failed: u64,
}

impl Measured {
    fn usec_per_call(&self) -> Option<f64> {
        self.stat.usec_per_call()
    }
}

/// `redis-cli` against the throwaway server, run quietly (dozens of calls:
/// the report lists the benchmark commands instead).
struct RedisCli<'a> {
    bin: &'a Path,
    port: u16,
}

impl<'a> RedisCli<'a> {
    fn new(bin: &'a Path, port: u16) -> Self {
        RedisCli { bin, port }
    }

    fn run(&self, args: &[&str]) -> Result<String> {
        let output = Command::new(self.bin)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| {
                format!("could not run {}: {e}", self.bin.display())
            })?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        // redis-cli exits with 0 on an error reply when not on a terminal.
        if output.status.success() && !text.starts_with("ERR") {
            Ok(text)
        } else {
            Err(format!(
                "redis-cli {} failed: {}{}",
                args.first().copied().unwrap_or(""),
                text.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// `SCRIPT LOAD` of a file: its SHA.
    fn script_load(&self, path: &Path) -> Result<String> {
        let source = fs::read_to_string(path)
            .map_err(|e| format!("could not read {}: {e}", path.display()))?;
        let sha = self.run(&["SCRIPT", "LOAD", &source])?.trim().to_owned();
        if sha.len() == 40 && sha.chars().all(|c| c.is_ascii_hexdigit()) {
            Ok(sha)
        } else {
            Err(format!(
                "SCRIPT LOAD of {} answered {sha:?}",
                path.display()
            ))
        }
    }

    /// `FUNCTION LOAD` of a script's body as the function `name` (Redis 7):
    /// `KEYS` and `ARGV` become its parameters.
    fn function_load(&self, path: &Path, name: &str) -> Result<String> {
        let source = fs::read_to_string(path)
            .map_err(|e| format!("could not read {}: {e}", path.display()))?;
        let library = format!(
            "#!lua name=trt_bench_{name}\n\
             redis.register_function('{name}', function(KEYS, ARGV)\n{source}\nend)\n"
        );
        self.run(&["FUNCTION", "LOAD", "REPLACE", &library])
            .map_err(|e| {
                format!("not measured: this server has no functions ({e})")
            })?;
        Ok(name.to_owned())
    }

    /// Runs `bench` (a redis-benchmark) after `CONFIG RESETSTAT`: the
    /// statistics of `command` it left.
    fn measure(&self, bench: &Cmd, command: &str) -> Result<Measured> {
        self.run(&["CONFIG", "RESETSTAT"])?;
        let output =
            bench.command().stdin(Stdio::null()).output().map_err(|e| {
                format!("could not run `{}`: {e}", bench.display())
            })?;
        if !output.status.success() {
            return Err(format!(
                "`{}` failed: {}",
                bench.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        let info = self.run(&["INFO", "commandstats"])?;
        let stat = parse::command_stat(&info, command)
            .ok_or_else(|| format!("INFO commandstats has no {command}"))?;
        Ok(Measured {
            stat,
            failed: parse::command_field(&info, command, "failed_calls")
                .unwrap_or(0),
        })
    }
}
