//! The tasks. Each one fails fast: the first command that fails ends it.

use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;

use crate::Result;
use crate::cmd::{Cmd, project_root};
use crate::redis::{self, RedisCluster, RedisServer};

/// The bare-metal target that proves gcra-core builds without `std`.
const BARE_METAL_TARGET: &str = "thumbv7em-none-eabihf";
/// URL of the throwaway single Redis, for the tests.
const REDIS_URL_VAR: &str = "TRT_REDIS_URL";
/// Comma-separated node URLs of the throwaway Redis Cluster, for the tests.
const CLUSTER_URLS_VAR: &str = "TRT_REDIS_CLUSTER_URLS";

/// `cargo test --workspace --all-features`, the one test command.
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

/// fmt, clippy, then everything `test` runs.
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
    test(&[])
}

/// Every test: `no-std`, then one `cargo test` pass with a throwaway Redis and
/// a throwaway Redis Cluster.
pub(crate) fn test(cargo_test_args: &[OsString]) -> Result<()> {
    // Find the binaries first: a missing Redis should fail before a long build.
    let server_bin = redis::find_server()?;
    let cli_bin = redis::find_cli(&server_bin)?;
    no_std()?;
    let server = RedisServer::start(&server_bin)?;
    let cluster = RedisCluster::start(&server_bin, &cli_bin)?;
    cargo_test(cargo_test_args)
        .args(cargo_test_args)
        .env(REDIS_URL_VAR, server.url())
        .env(CLUSTER_URLS_VAR, cluster.urls())
        .env(redis::SERVER_BIN_VAR, &server_bin)
        .run()
    // `cluster` and `server` are stopped here, whatever the tests did.
}

/// `cargo test` against a throwaway Redis.
pub(crate) fn test_redis(cargo_test_args: &[OsString]) -> Result<()> {
    let server_bin = redis::find_server()?;
    let server = RedisServer::start(&server_bin)?;
    // No cluster here: its tests (they need TRT_REDIS_CLUSTER_URLS) are
    // `test-cluster`'s, and `test` runs both.
    let mut args = cargo_test_args.to_vec();
    if !args.iter().any(|arg| arg == "--") {
        args.push("--".into());
    }
    args.extend(["--skip".into(), "cluster".into()]);
    cargo_test(&args)
        .args(&args)
        .env(REDIS_URL_VAR, server.url())
        .env(redis::SERVER_BIN_VAR, &server_bin)
        .run()
}

/// The tests whose names contain `cluster`, against a throwaway Redis Cluster.
pub(crate) fn test_cluster(cargo_test_args: &[OsString]) -> Result<()> {
    let server_bin = redis::find_server()?;
    let cli_bin = redis::find_cli(&server_bin)?;
    let cluster = RedisCluster::start(&server_bin, &cli_bin)?;
    cargo_test(cargo_test_args)
        .arg("cluster")
        .args(cargo_test_args)
        .env(CLUSTER_URLS_VAR, cluster.urls())
        .env(redis::SERVER_BIN_VAR, &server_bin)
        .run()
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
pub(crate) fn bench(full: bool, criterion_args: &[OsString]) -> Result<()> {
    crate::bench::bench(full, criterion_args)
}
