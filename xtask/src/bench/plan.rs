//! What one run of `cargo xtask bench` measures and with which programs:
//! the [`Plan`] (how long each part runs) and the [`Tools`] found.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::cmd::{find_on_path, is_executable};
use crate::redis;

/// How long each part runs.
pub(crate) struct Plan {
    pub(crate) full: bool,
    /// Passes of the criterion benchmarks (ratios: the median over passes).
    pub(crate) criterion_passes: u32,
    /// Seconds per configuration per round, and rounds (HTTP).
    pub(crate) http: (u32, u32),
    /// Seconds per side per round, and rounds (Redis checks/s).
    pub(crate) redis: (u32, u32),
    /// Requests per command per round, and rounds (Redis CPU).
    pub(crate) redis_cpu: (u32, u32),
    /// The memory store's sweep interval, seconds.
    pub(crate) sweep_secs: u32,
    /// Seconds per server per round, and rounds (the service's RLS).
    pub(crate) rls: (u32, u32),
    /// Seconds per side per round, and rounds (PostgreSQL).
    pub(crate) postgres: (u32, u32),
}

impl Plan {
    pub(crate) fn new(full: bool) -> Self {
        if full {
            Plan {
                full,
                criterion_passes: 3,
                http: (3, 20),
                redis: (5, 6),
                redis_cpu: (50_000, 21),
                sweep_secs: 10,
                rls: (5, 6),
                postgres: (10, 5),
            }
        } else {
            Plan {
                full,
                criterion_passes: 3,
                http: (1, 20),
                redis: (2, 5),
                redis_cpu: (10_000, 9),
                sweep_secs: 1,
                rls: (3, 3),
                postgres: (3, 3),
            }
        }
    }

    pub(crate) fn command(&self, criterion_args: &[OsString]) -> String {
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

/// The Redis programs the Redis parts need.
pub(crate) struct RedisBins {
    pub(crate) server: PathBuf,
    pub(crate) cli: PathBuf,
    pub(crate) benchmark: PathBuf,
}

/// The external programs, when installed.
pub(crate) struct Tools {
    pub(crate) wrk: Option<PathBuf>,
    /// The Redis programs, or why they are missing.
    pub(crate) redis: std::result::Result<RedisBins, String>,
    /// The directory of PostgreSQL's server programs and pgbench, or why
    /// there is none.
    pub(crate) postgres: std::result::Result<PathBuf, String>,
}

impl Tools {
    pub(crate) fn find() -> Self {
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
            Ok(RedisBins {
                server,
                cli,
                benchmark,
            })
        });
        if let Err(why) = &redis {
            println!("xtask: the Redis benchmarks are skipped: {why}");
        }
        let postgres = postgres_bin_dir();
        if let Err(why) = &postgres {
            println!("xtask: the PostgreSQL benchmark is skipped: {why}");
        }
        Tools {
            wrk,
            redis,
            postgres,
        }
    }
}

/// Where PostgreSQL's programs are: `TRT_POSTGRES_BIN_DIR`, else the
/// directory `initdb` on PATH leads to (Debian links them from
/// `/usr/lib/postgresql/<version>/bin`), else the newest of those; it must
/// hold pgbench as well.
fn postgres_bin_dir() -> std::result::Result<PathBuf, String> {
    let from_env = std::env::var_os("TRT_POSTGRES_BIN_DIR").map(PathBuf::from);
    let from_path = || {
        find_on_path("initdb")
            .and_then(|initdb| std::fs::canonicalize(initdb).ok())
            .and_then(|initdb| initdb.parent().map(PathBuf::from))
    };
    let newest = || {
        let mut dirs: Vec<(u32, PathBuf)> =
            std::fs::read_dir("/usr/lib/postgresql")
                .ok()?
                .filter_map(|entry| {
                    let entry = entry.ok()?;
                    let version = entry.file_name().to_str()?.parse().ok()?;
                    Some((version, entry.path().join("bin")))
                })
                .collect();
        dirs.sort();
        dirs.pop().map(|(_, dir)| dir)
    };
    let dir = from_env.or_else(from_path).or_else(newest).ok_or_else(|| {
        "PostgreSQL's server programs are not installed (`apt-get install postgresql` \
         on Debian/Ubuntu, or set TRT_POSTGRES_BIN_DIR)"
            .to_owned()
    })?;
    for program in ["initdb", "pg_ctl", "postgres", "pgbench"] {
        if !is_executable(&dir.join(program)) {
            return Err(format!("`{program}` is not in {}", dir.display()));
        }
    }
    Ok(dir)
}
