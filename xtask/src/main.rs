//! `cargo xtask`: the task runner of the tower-rate-tier workspace, following
//! the cargo-xtask convention (`.cargo/config.toml` aliases `cargo xtask` to
//! `cargo run --package xtask --quiet --`).
//!
//! Run `cargo xtask help` for the tasks. Every command is printed before it
//! runs; the first one that fails ends the task with a non-zero exit code. An
//! unknown task or flag prints the usage to stderr and exits with code 2.

use std::env;
use std::ffi::OsString;
use std::process::ExitCode;

mod bench;
mod cmd;
mod launcher;
mod lines;
mod postgres;
mod redis;
mod service_image;
mod tasks;

const USAGE: &str = "\
cargo xtask: the tasks of the tower-rate-tier workspace

Usage: cargo xtask <TASK> [--docker] [--full] [-- <ARGS>...]
       cargo xtask bench [--full] [--only PART,...] [-- <ARGS>...]
       cargo xtask fuzz [TARGET] [--seconds N]
       cargo xtask service-image [--check]
       cargo xtask lines [--at REV]

Tasks:
  ci            cargo fmt --all -- --check; cargo clippy --workspace --all-targets
                --all-features -- -D warnings; cargo doc (warnings denied); then
                `features`; then everything `test` runs
  features      every feature of every workspace crate builds alone: per package,
                cargo check -p <pkg> --tests --no-default-features (warnings
                denied), then with each feature (--features <f>), then
                --all-features (names from cargo metadata)
  test          every test: starts a throwaway Redis, a throwaway 3-master Redis
                Cluster and a throwaway PostgreSQL (Debian's postgresql package:
                initdb and pg_ctl, as the postgres user when root; else Docker;
                never port 5432), runs `no-std`, then cargo test --workspace
                --all-features once with all of them
  test-redis    starts a throwaway Redis and PostgreSQL on free loopback ports and
                runs cargo test --workspace --all-features against them, skipping
                the cluster tests (test-cluster's)
  test-cluster  starts a throwaway 3-master Redis Cluster on free loopback ports and
                runs cargo test --workspace --all-features cluster (the tests whose
                names contain `cluster`)
  redis-image   builds the Docker image the tests run with --docker (redis:7.0, or
                TRT_REDIS_IMAGE) from the installed redis-server and redis-cli
                (FROM scratch, with the libraries ldd lists): for a machine with a
                Docker engine but no registry. Elsewhere the official image is pulled
  postgres-image
                the same for PostgreSQL: builds postgres:15 (or TRT_POSTGRES_IMAGE)
                from the installed server (its binaries, modules and data files,
                the libraries ldd lists, /bin/sh and an entrypoint that creates
                the cluster, as the official image's does)
  service-image the standalone service's image, rate-tier-service:local, for a
                Docker engine with no registry: FROM scratch, from the shipped
                binary (cargo build --profile dist -p rate-tier-service), the libraries
                ldd lists, the Dockerfile's non-root user and what its HEALTHCHECK
                runs (bash, head, grep); EXPOSE, USER, ENTRYPOINT, CMD and
                HEALTHCHECK read from the repository's Dockerfile. --check then
                runs a container on published free loopback ports and asks it
                (/healthcheck, a /json request that passes and one that is
                limited, HTTP/2 on the gRPC port, Docker's health check healthy,
                a non-root uid) and removes it. Fails without a Docker engine
  no-std        proves gcra-core is no_std: #![no_std], no dependencies, builds with
                --no-default-features, and for thumbv7em-none-eabihf when that target
                is installed (otherwise that build is left to GitHub Actions)
  bench         the benchmarks of tower-rate-tier against their peers, side by side
                in one run (criterion: RateTier::check vs governor, a flooded store,
                3 limits vs 1, the open breaker, a reservation vs a check; HTTP with
                wrk: the layer vs no layer vs tower_governor; a throwaway Redis:
                RedisStorage vs redis-benchmark, commands per 3-limit decision,
                server CPU per Lua script call; RSS after 1M keys and idle after
                five waves; the standalone service's ShouldRateLimit/s and latency;
                calls/s of 2 processes shaped through one quota on Redis vs the
                quota); prints a table of ratios and rewrites BENCHMARKS.md. Quick by default (a few minutes after the build);
                --full runs longer. Needs
                redis-server, redis-cli, redis-benchmark (else the Redis part is
                skipped) and wrk (else a built-in Rust HTTP client is used)
  fuzz          runs the fuzz targets of fuzz/ (cargo fuzz, libFuzzer, on the
                nightly toolchain) one after the other, each for --seconds N
                (default 600) on its committed corpus, which it grows; a crash
                stops the task (the input is in fuzz/artifacts/TARGET/: add it to
                fuzz/regressions/TARGET/, which cargo test replays). TARGET: one
                of them only. Needs `rustup toolchain install nightly` and
                `cargo install cargo-fuzz`
  loom          the model checker (loom) over the memory store's lock bits and the
                breaker's state word: rate-tier-storage's loom_model tests, built
                with --cfg trt_loom in target/loom (TRT_LOOM_PREEMPTIONS bounds the
                three-thread model; default 1)
  lines         the library's size without its tests (gcra-core, rate-tier-storage,
                tower-rate-tier, rate-tier-axum: the Rust, Lua and SQL under
                src/, items behind a test cfg left out): files, lines, code and
                comment lines per crate and language. --at REV counts a git
                revision instead of the working tree
  help          prints this message (also -h, --help)

Flags:
  --docker      (test, test-redis, test-cluster) the Redis servers and the
                PostgreSQL are Docker containers (testcontainers), for the task
                and for the tests' own servers, even where redis-server and
                PostgreSQL are installed
  --full        (bench) the long run
  --only PARTS  (bench) only these parts, by name, comma-separated: check, limits,
                kinds, reserve, shaper, http, redis_store, redis_cpu, breaker,
                memory, rls, postgres. Prints their rows; BENCHMARKS.md is left as
                it is (only a whole run writes it)
  --check       (service-image) run the image and ask it
  --seconds N   (fuzz) how long each target runs
  --at REV      (lines) count this git revision

Arguments after `--` are added to the cargo test command (test, test-redis,
test-cluster) or given to the criterion benchmarks (bench), for example
  cargo xtask test-redis -- redis_
  cargo xtask test-redis --docker -- -p rate-tier-storage
  cargo xtask test-cluster -- -- --nocapture

Where the Redis servers come from (crates/test-support, binary trt-redis):
  redis-server on PATH (or TRT_REDIS_SERVER_BIN)   redis-server processes
  otherwise a Docker engine that answers           containers of redis:7.0
                                                   (TRT_REDIS_IMAGE), pulled if
                                                   missing, on the host network
  neither                                          an error saying how to get one
TRT_REDIS_BACKEND=docker (what --docker sets) or =process forces one.

Where the PostgreSQL servers come from (crates/test-support, binary trt-postgres):
  the server binaries (TRT_POSTGRES_BIN_DIR,       initdb and pg_ctl processes
  else initdb on PATH, else the newest
  /usr/lib/postgresql/<version>/bin)
  otherwise a Docker engine that answers           containers of postgres:15
                                                   (TRT_POSTGRES_IMAGE), pulled if
                                                   missing, on the host network
  neither                                          an error saying how to get one
TRT_POSTGRES_BACKEND=docker (what --docker sets) or =process forces one.

The tests get, for the servers this task started:
  TRT_REDIS_URL           redis://127.0.0.1:<port>/ (test, test-redis)
  TRT_REDIS_CLUSTER_URLS  redis://127.0.0.1:<p1>/,...,redis://127.0.0.1:<p3>/
                          (test, test-cluster)
  TRT_REDIS_BACKEND       process or docker: the tests' own servers (those they
                          kill, pause, restart) use the same
  TRT_REDIS_SERVER_BIN    the redis-server binary (processes), or
  TRT_REDIS_IMAGE         the image (Docker)
  TRT_POSTGRES_URL        postgres://postgres@127.0.0.1:<port>/postgres (test,
                          test-redis)
  TRT_POSTGRES_BACKEND    process or docker, and TRT_POSTGRES_BIN_DIR or
                          TRT_POSTGRES_IMAGE: the same for the PostgreSQL servers
Every server is stopped when the task ends, even when it fails or is
interrupted. The shared Redis on port 6379 and a PostgreSQL on 5432 are never
used.
";

/// A task named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Task {
    Help,
    Ci,
    Features,
    Test,
    TestRedis,
    TestCluster,
    RedisImage,
    PostgresImage,
    ServiceImage,
    NoStd,
    Bench,
    Fuzz,
    Loom,
    Lines,
}

impl Task {
    fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "help" => Self::Help,
            "ci" => Self::Ci,
            "features" => Self::Features,
            "test" => Self::Test,
            "test-redis" => Self::TestRedis,
            "test-cluster" => Self::TestCluster,
            "redis-image" => Self::RedisImage,
            "postgres-image" => Self::PostgresImage,
            "service-image" => Self::ServiceImage,
            "no-std" => Self::NoStd,
            "bench" => Self::Bench,
            "fuzz" => Self::Fuzz,
            "loom" => Self::Loom,
            "lines" => Self::Lines,
            _ => return None,
        })
    }

    /// Whether the task starts Redis servers, and PostgreSQL for some (and so
    /// takes `--docker`).
    fn starts_redis(self) -> bool {
        matches!(self, Self::Test | Self::TestRedis | Self::TestCluster)
    }

    /// Whether the task passes arguments after `--` on to a command.
    fn takes_extra_args(self) -> bool {
        matches!(
            self,
            Self::Test | Self::TestRedis | Self::TestCluster | Self::Bench
        )
    }
}

/// The parsed command line.
#[derive(Debug)]
struct Args {
    task: Task,
    /// `--full` (bench only): the long run.
    full: bool,
    /// `--only PARTS` (bench only): the parts that run.
    only: Option<Vec<bench::Part>>,
    /// `--check` (service-image only): run the image and ask it.
    check: bool,
    /// `--docker` (test, test-redis, test-cluster): Redis and PostgreSQL in
    /// Docker.
    docker: bool,
    /// `fuzz TARGET`: one target only.
    target: Option<String>,
    /// `--seconds N` (fuzz): each target's run.
    seconds: Option<u64>,
    /// `--at REV` (lines): the revision counted.
    at: Option<String>,
    /// Everything after the first `--`.
    extra: Vec<OsString>,
}

/// Parses the arguments (without the program name). An error is a usage error.
fn parse_args(args: Vec<OsString>) -> std::result::Result<Args, String> {
    use lexopt::prelude::*;

    let (ours, extra) = match args.iter().position(|arg| arg == "--") {
        Some(i) => (args[..i].to_vec(), args[i + 1..].to_vec()),
        None => (args, Vec::new()),
    };
    let mut parser = lexopt::Parser::from_args(ours);
    let mut task = None;
    let mut help = false;
    let mut full = false;
    let mut only = None;
    let mut check = false;
    let mut docker = false;
    let mut target = None;
    let mut seconds = None;
    let mut at = None;
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Short('h') | Long("help") => help = true,
            Long("full") => full = true,
            Long("only") => {
                let value = parser.value().map_err(|e| e.to_string())?;
                let value = value.string().map_err(|e| e.to_string())?;
                only = Some(bench::Part::parse_list(&value)?);
            }
            Long("check") => check = true,
            Long("docker") => docker = true,
            Long("seconds") => {
                let value = parser.value().map_err(|e| e.to_string())?;
                let value = value.string().map_err(|e| e.to_string())?;
                seconds = Some(value.parse::<u64>().map_err(|_| {
                    format!("--seconds takes a whole number, not `{value}`")
                })?);
            }
            Long("at") => {
                let value = parser.value().map_err(|e| e.to_string())?;
                at = Some(value.string().map_err(|e| e.to_string())?);
            }
            Value(name) if task == Some(Task::Fuzz) && target.is_none() => {
                target = Some(name.string().map_err(|e| e.to_string())?);
            }
            Value(name) if task.is_none() => {
                let name = name.string().map_err(|e| e.to_string())?;
                task = Some(
                    Task::from_name(&name)
                        .ok_or_else(|| format!("unknown task `{name}`"))?,
                );
            }
            Value(value) => {
                return Err(format!(
                    "unexpected argument {value:?} (arguments for cargo go after `--`)"
                ));
            }
            _ => return Err(arg.unexpected().to_string()),
        }
    }
    let task = match (help, task) {
        (true, _) => Task::Help,
        (false, Some(task)) => task,
        (false, None) => return Err("no task given".to_owned()),
    };
    if !extra.is_empty() && !task.takes_extra_args() && task != Task::Help {
        return Err(format!(
            "this task takes no arguments after `--`: {extra:?}"
        ));
    }
    if full && !matches!(task, Task::Bench | Task::Help) {
        return Err("--full is a flag of `bench` only".to_owned());
    }
    if only.is_some() && !matches!(task, Task::Bench | Task::Help) {
        return Err("--only is a flag of `bench` only".to_owned());
    }
    if check && !matches!(task, Task::ServiceImage | Task::Help) {
        return Err("--check is a flag of `service-image` only".to_owned());
    }
    if seconds.is_some() && !matches!(task, Task::Fuzz | Task::Help) {
        return Err("--seconds is a flag of `fuzz` only".to_owned());
    }
    if at.is_some() && !matches!(task, Task::Lines | Task::Help) {
        return Err("--at is a flag of `lines` only".to_owned());
    }
    if docker && !task.starts_redis() && task != Task::Help {
        return Err(
            "--docker is a flag of `test`, `test-redis` and `test-cluster`"
                .to_owned(),
        );
    }
    Ok(Args {
        task,
        full,
        only,
        check,
        docker,
        target,
        seconds,
        at,
        extra,
    })
}

fn main() -> ExitCode {
    let args = match parse_args(env::args_os().skip(1).collect()) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("error: {message}\n");
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let extra = &args.extra;
    let result = match args.task {
        Task::Help => {
            print!("{USAGE}");
            Ok(())
        }
        Task::Ci => tasks::ci(),
        Task::Features => tasks::features(),
        Task::Test => tasks::test(args.docker, extra),
        Task::TestRedis => tasks::test_redis(args.docker, extra),
        Task::TestCluster => tasks::test_cluster(args.docker, extra),
        Task::RedisImage => tasks::redis_image(),
        Task::PostgresImage => tasks::postgres_image(),
        Task::ServiceImage => service_image::service_image(args.check),
        Task::NoStd => tasks::no_std(),
        Task::Bench => tasks::bench(args.full, args.only, extra),
        Task::Fuzz => tasks::fuzz(args.target.as_deref(), args.seconds),
        Task::Loom => tasks::loom(),
        Task::Lines => lines::lines(args.at.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: error: {message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> std::result::Result<Args, String> {
        parse_args(args.iter().map(OsString::from).collect())
    }

    #[test]
    fn tasks_and_help_parse() {
        assert_eq!(parse(&["test-redis"]).unwrap().task, Task::TestRedis);
        assert_eq!(parse(&["--help"]).unwrap().task, Task::Help);
        assert_eq!(parse(&["test", "-h"]).unwrap().task, Task::Help);
        assert_eq!(parse(&["help"]).unwrap().task, Task::Help);
    }

    #[test]
    fn arguments_after_double_dash_are_passed_on() {
        let args = parse(&["test-redis", "--", "redis_", "--", "--nocapture"])
            .unwrap();
        assert_eq!(args.task, Task::TestRedis);
        assert_eq!(args.extra, ["redis_", "--", "--nocapture"]);
    }

    #[test]
    fn bench_takes_full_and_criterion_arguments() {
        let quick = parse(&["bench"]).unwrap();
        assert!(!quick.full);
        let full = parse(&["bench", "--full", "--", "memory/"]).unwrap();
        assert_eq!(full.task, Task::Bench);
        assert!(full.full);
        assert_eq!(full.extra, ["memory/"]);
        assert!(parse(&["--full", "bench"]).unwrap().full);
        assert!(quick.only.is_none());
    }

    #[test]
    fn bench_takes_only_named_parts() {
        let only = parse(&["bench", "--only", "reserve,shaper"]).unwrap();
        assert_eq!(
            only.only,
            Some(vec![bench::Part::Reserve, bench::Part::Shaper])
        );
        let error = parse(&["bench", "--only", "reserve,bogus"]).unwrap_err();
        assert!(error.contains("no part `bogus`"), "{error}");
        assert!(parse(&["bench", "--only"]).is_err());
        assert!(parse(&["test", "--only", "reserve"]).is_err());
    }

    #[test]
    fn docker_is_a_flag_of_the_tasks_that_start_redis() {
        for task in ["test", "test-redis", "test-cluster"] {
            let args =
                parse(&[task, "--docker", "--", "-p", "gcra-core"]).unwrap();
            assert!(args.docker);
            assert_eq!(args.extra, ["-p", "gcra-core"]);
            assert!(!parse(&[task]).unwrap().docker);
        }
        assert!(parse(&["--docker", "test-cluster"]).unwrap().docker);
        for task in [
            "ci",
            "features",
            "redis-image",
            "postgres-image",
            "bench",
            "no-std",
        ] {
            assert!(parse(&[task, "--docker"]).is_err(), "{task}");
        }
    }

    #[test]
    fn new_tasks_parse_and_take_no_arguments() {
        assert_eq!(parse(&["features"]).unwrap().task, Task::Features);
        assert_eq!(parse(&["redis-image"]).unwrap().task, Task::RedisImage);
        assert_eq!(
            parse(&["postgres-image"]).unwrap().task,
            Task::PostgresImage
        );
        assert!(parse(&["features", "--", "x"]).is_err());
        assert!(parse(&["redis-image", "--", "x"]).is_err());
        assert!(parse(&["postgres-image", "--", "x"]).is_err());
    }

    #[test]
    fn service_image_takes_check() {
        let build = parse(&["service-image"]).unwrap();
        assert_eq!((build.task, build.check), (Task::ServiceImage, false));
        let check = parse(&["service-image", "--check"]).unwrap();
        assert_eq!((check.task, check.check), (Task::ServiceImage, true));
        assert!(parse(&["--check", "service-image"]).unwrap().check);
        assert!(parse(&["service-image", "--docker"]).is_err());
        assert!(parse(&["service-image", "--", "x"]).is_err());
        assert!(parse(&["service-image", "extra"]).is_err());
        for task in ["test", "redis-image", "bench", "ci"] {
            assert!(parse(&[task, "--check"]).is_err(), "{task}");
        }
        assert!(USAGE.contains("service-image [--check]"));
    }

    #[test]
    fn fuzz_takes_a_target_and_seconds() {
        let all = parse(&["fuzz"]).unwrap();
        assert_eq!(
            (all.task, all.target, all.seconds),
            (Task::Fuzz, None, None)
        );
        let one = parse(&["fuzz", "json_body", "--seconds", "30"]).unwrap();
        assert_eq!(one.target.as_deref(), Some("json_body"));
        assert_eq!(one.seconds, Some(30));
        assert!(parse(&["fuzz", "--seconds", "soon"]).is_err());
        assert!(parse(&["fuzz", "a", "b"]).is_err());
        assert!(parse(&["test", "--seconds", "3"]).is_err());
    }

    #[test]
    fn lines_takes_a_revision() {
        assert_eq!(parse(&["lines"]).unwrap().at, None);
        let at = parse(&["lines", "--at", "e4ce4ed2"]).unwrap();
        assert_eq!(
            (at.task, at.at.as_deref()),
            (Task::Lines, Some("e4ce4ed2"))
        );
        assert!(parse(&["lines", "--at"]).is_err());
        assert!(parse(&["test", "--at", "HEAD"]).is_err());
        assert!(parse(&["lines", "--", "x"]).is_err());
    }

    #[test]
    fn usage_errors() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["bogus"]).is_err());
        assert!(parse(&["test", "--bogus"]).is_err());
        assert!(parse(&["test", "redis_"]).is_err());
        assert!(parse(&["no-std", "--", "x"]).is_err());
        assert!(parse(&["ci", "--", "x"]).is_err());
        assert!(parse(&["test", "--full"]).is_err());
    }
}
