//! The tasks. Each one fails fast: the first command that fails ends it.

use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;

use crate::cmd::Result;
use crate::cmd::{Cmd, project_root};
use crate::postgres::{self, Postgres};
use crate::redis::{self, Servers, Wanted};

/// The bare-metal target that proves gcra-core builds without `std`.
const BARE_METAL_TARGET: &str = "thumbv7em-none-eabihf";

/// `cargo test --all-features`, over the whole workspace unless `args`
/// choose packages (`-p NAME`) before any `--`.
fn cargo_test(args: &[OsString]) -> Cmd {
    let chosen = args.iter().take_while(|arg| *arg != "--").any(|arg| {
        arg == "-p"
            || arg == "--package"
            || arg.to_str().is_some_and(|a| a.starts_with("--package="))
    });
    let cmd = Cmd::cargo().args(["test", "--all-features"]);
    if chosen { cmd } else { cmd.arg("--workspace") }
}

/// `cmd` with the tests' environment from the servers (`trt-redis`'s and
/// `trt-postgres`'s `KEY=VALUE` lines).
fn with_env(mut cmd: Cmd, env: &[(String, String)]) -> Cmd {
    for (key, value) in env {
        cmd = cmd.env(key, value);
    }
    cmd
}

/// A throwaway PostgreSQL (`trt-postgres up`; a container with `docker`),
/// for the tests that need one (`TRT_POSTGRES_URL`). Neither the server
/// binaries nor Docker: an error that says what to install, before the long
/// build of the tests.
fn postgres(docker: bool) -> Result<Postgres> {
    Postgres::up(&postgres::build_trt_postgres()?, docker)
}

/// fmt, clippy, docs, every feature alone, then everything `test` runs.
pub(crate) fn ci() -> Result<()> {
    for (component, probe) in [("rustfmt", "fmt"), ("clippy", "clippy")] {
        if !Cmd::cargo().args([probe, "--version"]).succeeds_quietly() {
            return Err(format!(
                "`cargo {probe}` is not available ({component} is missing): \
                 run `rustup component add rustfmt clippy`"
            ));
        }
    }
    Cmd::cargo().args(["fmt", "--all", "--", "--check"]).run()?;
    Cmd::cargo()
        .args(["clippy", "--workspace", "--all-targets", "--all-features"])
        .args(["--", "-D", "warnings"])
        .run()?;
    // docs.rs builds with every feature; a broken intra-doc link fails here.
    Cmd::cargo()
        .args(["doc", "--workspace", "--all-features", "--no-deps"])
        .env("RUSTDOCFLAGS", "-D warnings")
        .run()?;
    features()?;
    test(false, &[])
}

/// Every feature of every workspace crate builds alone, with its tests
/// (a test of a shared store names its feature in `required-features`):
/// for each package, `cargo check -p <pkg> --tests --no-default-features`,
/// then once more with each feature (`--features <f>`), then with all of
/// them; warnings denied. The feature names come
/// from `cargo metadata`, so the list cannot go stale; `-p` from the
/// workspace root resolves features for that package alone.
pub(crate) fn features() -> Result<()> {
    let metadata = Cmd::cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .read()?;
    let metadata: serde_json::Value = serde_json::from_str(&metadata)
        .map_err(|e| format!("`cargo metadata` printed no JSON: {e}"))?;
    let packages = metadata["packages"]
        .as_array()
        .ok_or("`cargo metadata` listed no packages")?;
    let mut checks = 0;
    for package in packages {
        let name = package["name"]
            .as_str()
            .ok_or("`cargo metadata`: a package without a name")?;
        let mut features: Vec<&str> = package["features"]
            .as_object()
            .map(|features| {
                features
                    .keys()
                    .map(String::as_str)
                    .filter(|f| *f != "default")
                    .collect()
            })
            .unwrap_or_default();
        features.sort_unstable();
        let check = || {
            Cmd::cargo()
                .args(["check", "-p", name, "--tests", "--no-default-features"])
                .env("RUSTFLAGS", "-D warnings")
        };
        check().run()?;
        checks += 1;
        for feature in &features {
            check().args(["--features", feature]).run()?;
            checks += 1;
        }
        if features.len() > 1 {
            Cmd::cargo()
                .args(["check", "-p", name, "--tests", "--all-features"])
                .env("RUSTFLAGS", "-D warnings")
                .run()?;
            checks += 1;
        }
    }
    println!(
        "xtask: every feature of the {} workspace packages builds alone ({checks} checks)",
        packages.len()
    );
    Ok(())
}

/// Every test: `no-std`, then one `cargo test` pass with a throwaway Redis, a
/// throwaway Redis Cluster and a throwaway PostgreSQL (Docker containers
/// with `docker`), then (with no `cargo_test_args`) the example server's
/// unit tests.
pub(crate) fn test(docker: bool, cargo_test_args: &[OsString]) -> Result<()> {
    // The servers first: no Redis (neither redis-server nor Docker) or no
    // PostgreSQL fails before the long build of the tests.
    let trt_redis = redis::build_trt_redis()?;
    let servers = Servers::up(
        &trt_redis,
        Wanted {
            server: true,
            cluster: true,
            docker,
        },
    )?;
    let postgres = postgres(docker)?;
    no_std()?;
    let cmd = cargo_test(cargo_test_args).args(cargo_test_args);
    with_env(with_env(cmd, servers.env()), postgres.env()).run()?;
    // Dropped, `postgres` and `servers` stop their servers (on an error
    // above too, whatever the tests did); the unit tests below need none.
    drop((postgres, servers));
    if cargo_test_args.is_empty() {
        // The example server's own unit tests. Not in the pass above: an
        // example built as a test is not built as a program, and the
        // process tests run the program.
        Cmd::cargo()
            .args(["test", "-p", "examples", "--all-features"])
            .args(["--example", "server"])
            .run()?;
    }
    Ok(())
}

/// `cargo test` against a throwaway Redis (and a throwaway PostgreSQL: this
/// pass runs every test but the cluster's), skipping the cluster tests.
pub(crate) fn test_redis(
    docker: bool,
    cargo_test_args: &[OsString],
) -> Result<()> {
    let trt_redis = redis::build_trt_redis()?;
    let servers = Servers::up(
        &trt_redis,
        Wanted {
            server: true,
            cluster: false,
            docker,
        },
    )?;
    let postgres = postgres(docker)?;
    // No cluster here: its tests (they need TRT_REDIS_CLUSTER_URLS) are
    // `test-cluster`'s, and `test` runs both.
    let mut args = cargo_test_args.to_vec();
    if !args.iter().any(|arg| arg == "--") {
        args.push("--".into());
    }
    args.extend(["--skip".into(), "cluster".into()]);
    let cmd = cargo_test(&args).args(&args);
    with_env(with_env(cmd, servers.env()), postgres.env()).run()
}

/// The tests whose names contain `cluster`, against a throwaway Redis Cluster.
pub(crate) fn test_cluster(
    docker: bool,
    cargo_test_args: &[OsString],
) -> Result<()> {
    let trt_redis = redis::build_trt_redis()?;
    let servers = Servers::up(
        &trt_redis,
        Wanted {
            server: false,
            cluster: true,
            docker,
        },
    )?;
    with_env(
        cargo_test(cargo_test_args)
            .arg("cluster")
            .args(cargo_test_args),
        servers.env(),
    )
    .run()
}

/// Builds the local Redis image the Docker path runs (`redis:7.0`, or
/// `TRT_REDIS_IMAGE`) from the installed redis-server: `trt-redis
/// build-image`, for a machine with Docker but no registry.
pub(crate) fn redis_image() -> Result<()> {
    let trt_redis = redis::build_trt_redis()?;
    Cmd::new(&trt_redis).arg("build-image").run()
}

/// Builds the local PostgreSQL image the Docker path runs (`postgres:15`, or
/// `TRT_POSTGRES_IMAGE`) from the installed server: `trt-postgres
/// build-image`, for a machine with Docker but no registry.
pub(crate) fn postgres_image() -> Result<()> {
    let trt_postgres = postgres::build_trt_postgres()?;
    Cmd::new(&trt_postgres).arg("build-image").run()
}

/// Proves gcra-core is `no_std`: declared so, no dependencies, builds without
/// default features, and builds for a bare-metal target when it is installed.
pub(crate) fn no_std() -> Result<()> {
    let lib_rs: PathBuf = project_root().join("crates/gcra-core/src/lib.rs");
    let source = fs::read_to_string(&lib_rs)
        .map_err(|e| format!("could not read {}: {e}", lib_rs.display()))?;
    if !source.lines().any(|line| line.trim() == "#![no_std]") {
        return Err(format!(
            "{} must declare an unconditional `#![no_std]`",
            lib_rs.display()
        ));
    }

    let tree = Cmd::cargo()
        .args([
            "tree",
            "-p",
            "gcra-core",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["--all-features", "--target", "all"])
        .read()?;
    let lines: Vec<&str> =
        tree.lines().filter(|l| !l.trim().is_empty()).collect();
    match lines.as_slice() {
        [only] if only.starts_with("gcra-core v") => {
            println!("xtask: gcra-core has no dependencies");
        }
        _ => {
            return Err(format!(
                "gcra-core must have no (normal) dependencies, but `cargo tree` shows:\n{}",
                tree.trim_end()
            ));
        }
    }

    Cmd::cargo()
        .args(["build", "-p", "gcra-core", "--no-default-features"])
        .run()?;

    if bare_metal_target_installed() {
        Cmd::cargo()
            .args(["build", "-p", "gcra-core", "--target", BARE_METAL_TARGET])
            .run()
    } else {
        println!(
            "xtask: target {BARE_METAL_TARGET} is not installed: the bare-metal build of \
             gcra-core is skipped locally and runs in GitHub Actions \
             (`rustup target add {BARE_METAL_TARGET}` to run it here)"
        );
        Ok(())
    }
}

/// Whether rustup lists the bare-metal target as installed (never installs it).
fn bare_metal_target_installed() -> bool {
    Cmd::new("rustup")
        .args(["target", "list", "--installed"])
        .read()
        .is_ok_and(|targets| {
            targets.lines().any(|t| t.trim() == BARE_METAL_TARGET)
        })
}

/// The benchmarks and BENCHMARKS.md: see `bench.rs`.
pub(crate) fn bench(
    full: bool,
    only: Option<Vec<crate::bench::Part>>,
    criterion_args: &[OsString],
) -> Result<()> {
    crate::bench::bench(full, only, criterion_args)
}

/// How long each fuzz target runs unless `--seconds` says.
const FUZZ_SECONDS: u64 = 600;

/// `cargo fuzz run` of each target (or `target`) for `seconds` each, on the
/// nightly toolchain, growing its committed corpus.
pub(crate) fn fuzz(target: Option<&str>, seconds: Option<u64>) -> Result<()> {
    let nightly = || Cmd::new("rustup").args(["run", "nightly", "cargo"]);
    if !nightly().args(["fuzz", "--version"]).succeeds_quietly() {
        return Err("cargo fuzz on the nightly toolchain is needed: \
                    `rustup toolchain install nightly` and `cargo install cargo-fuzz`"
            .to_owned());
    }
    let root = project_root();
    let mut targets: Vec<String> = fs::read_dir(root.join("fuzz/fuzz_targets"))
        .map_err(|e| format!("fuzz/fuzz_targets: {e}"))?
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".rs").map(str::to_owned)
        })
        .collect();
    targets.sort();
    if let Some(one) = target {
        if !targets.iter().any(|t| t == one) {
            return Err(format!("no fuzz target `{one}`: one of {targets:?}"));
        }
        targets.retain(|t| t == one);
    }
    let seconds = seconds.unwrap_or(FUZZ_SECONDS);
    for target in &targets {
        let corpus = root.join("fuzz/corpus").join(target);
        fs::create_dir_all(&corpus)
            .map_err(|e| format!("{}: {e}", corpus.display()))?;
        nightly()
            .args(["fuzz", "run", target])
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .args(["-print_final_stats=1", "-rss_limit_mb=4096"])
            .run()?;
    }
    println!(
        "xtask: {} fuzz target(s) ran {seconds} s each with no crash",
        targets.len()
    );
    Ok(())
}

/// The loom models of rate-tier-storage, in a build of their own.
pub(crate) fn loom() -> Result<()> {
    let target = project_root().join("target/loom");
    Cmd::cargo()
        .args(["test", "-p", "rate-tier-storage", "--lib", "--release"])
        .args(["loom_model", "--", "--test-threads=1"])
        .env("RUSTFLAGS", "--cfg trt_loom")
        .env("CARGO_TARGET_DIR", target)
        .run()
}
