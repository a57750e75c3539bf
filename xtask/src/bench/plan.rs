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
        Tools { wrk, redis }
    }
}
