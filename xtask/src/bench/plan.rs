//! What one run of `cargo xtask bench` measures and with which programs:
//! the [`Plan`] (which parts run, and how long each runs) and the
//! [`Tools`] found.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::cmd::{find_on_path, is_executable};
use crate::redis;

/// A part of the run: a bench target (of the same name), the Redis CPU
/// part xtask measures itself, or the shaper example. `--only` takes their
/// names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Check,
    Limits,
    Instructions,
    Kinds,
    Reserve,
    Shaper,
    Http,
    RedisStore,
    RedisCpu,
    Breaker,
    Memory,
    Rls,
    Limitador,
    Postgres,
}

/// Every part with its name, in the table's order.
pub(crate) const PARTS: [(Part, &str); 14] = [
    (Part::Check, "check"),
    (Part::Limits, "limits"),
    (Part::Instructions, "instructions"),
    (Part::Kinds, "kinds"),
    (Part::Reserve, "reserve"),
    (Part::Shaper, "shaper"),
    (Part::Http, "http"),
    (Part::RedisStore, "redis_store"),
    (Part::RedisCpu, "redis_cpu"),
    (Part::Breaker, "breaker"),
    (Part::Memory, "memory"),
    (Part::Rls, "rls"),
    (Part::Limitador, "limitador"),
    (Part::Postgres, "postgres"),
];

impl Part {
    /// The part named `name` (a bench target's name is its part's).
    pub(crate) fn from_name(name: &str) -> Option<Part> {
        PARTS
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(part, _)| *part)
    }

    pub(crate) fn name(self) -> &'static str {
        PARTS
            .iter()
            .find(|(part, _)| *part == self)
            .map_or("?", |(_, name)| name)
    }

    /// `--only`'s value: part names separated by commas, each known, at
    /// least one. An error names what is wrong and every part.
    pub(crate) fn parse_list(list: &str) -> Result<Vec<Part>, String> {
        let names = || PARTS.map(|(_, name)| name).join(", ");
        let mut parts = Vec::new();
        for name in list.split(',').map(str::trim) {
            let part = Part::from_name(name).ok_or_else(|| {
                format!("--only: no part `{name}` (the parts: {})", names())
            })?;
            if !parts.contains(&part) {
                parts.push(part);
            }
        }
        Ok(parts)
    }
}

/// Which parts run, and how long each runs.
pub(crate) struct Plan {
    pub(crate) full: bool,
    /// `--only`: the parts that run; `None`, every part (and BENCHMARKS.md
    /// is written).
    pub(crate) only: Option<Vec<Part>>,
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
    /// Seconds per server per round, and rounds (the service against
    /// limitador-server).
    pub(crate) limitador: (u32, u32),
    /// Seconds per side per round, and rounds (PostgreSQL).
    pub(crate) postgres: (u32, u32),
    /// Calls per worker, the quota per second, and worker processes (the
    /// shaper example).
    pub(crate) shaper: (u32, u32, u32),
}

impl Plan {
    pub(crate) fn new(full: bool, only: Option<Vec<Part>>) -> Self {
        if full {
            Plan {
                full,
                only,
                criterion_passes: 3,
                http: (3, 20),
                redis: (5, 6),
                redis_cpu: (50_000, 21),
                sweep_secs: 10,
                rls: (5, 6),
                limitador: (5, 10),
                postgres: (10, 5),
                shaper: (300, 20, 2),
            }
        } else {
            Plan {
                full,
                only,
                criterion_passes: 3,
                http: (1, 20),
                redis: (2, 5),
                redis_cpu: (10_000, 9),
                sweep_secs: 1,
                rls: (3, 3),
                limitador: (3, 6),
                postgres: (3, 3),
                shaper: (100, 20, 2),
            }
        }
    }

    /// Whether `part` runs.
    pub(crate) fn runs(&self, part: Part) -> bool {
        self.only.as_ref().is_none_or(|only| only.contains(&part))
    }

    /// Whether the bench target or example `target` runs (a name that is
    /// no part's runs only in a whole run). The `rls` target serves the
    /// `limitador` part as well: it holds the client both parts drive.
    pub(crate) fn runs_target(&self, target: &str) -> bool {
        match Part::from_name(target) {
            Some(Part::Rls) => {
                self.runs(Part::Rls) || self.runs(Part::Limitador)
            }
            Some(part) => self.runs(part),
            None => self.only.is_none(),
        }
    }

    pub(crate) fn command(&self, criterion_args: &[OsString]) -> String {
        let mut command = String::from("cargo xtask bench");
        if self.full {
            command.push_str(" --full");
        }
        if let Some(only) = &self.only {
            command.push_str(" --only ");
            let names: Vec<&str> =
                only.iter().map(|part| part.name()).collect();
            command.push_str(&names.join(","));
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
    /// Kuadrant's `limitador-server`, or why there is none (and how to
    /// build it).
    pub(crate) limitador: std::result::Result<PathBuf, String>,
    /// valgrind, which counts the instructions part's instructions, or
    /// why there is none.
    pub(crate) valgrind: std::result::Result<PathBuf, String>,
}

impl Tools {
    /// The tools installed; a word on each missing one that a part of
    /// `plan` needs.
    pub(crate) fn find(plan: &Plan) -> Self {
        let wrk = find_on_path("wrk");
        if wrk.is_none() && plan.runs(Part::Http) {
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
        if let (Err(why), true) = (&postgres, plan.runs(Part::Postgres)) {
            println!("xtask: the PostgreSQL benchmark is skipped: {why}");
        }
        let limitador = limitador_bin();
        if let (Err(why), true) = (&limitador, plan.runs(Part::Limitador)) {
            println!(
                "xtask: ****** the service is NOT compared with limitador-server: {why} ******"
            );
        }
        let valgrind = find_on_path("valgrind").ok_or_else(|| {
            "`valgrind` is not on PATH (`apt-get install valgrind` on \
             Debian/Ubuntu)"
                .to_owned()
        });
        if let (Err(why), true) = (&valgrind, plan.runs(Part::Instructions)) {
            println!("xtask: the instruction counts are skipped: {why}");
        }
        Tools {
            wrk,
            redis,
            postgres,
            limitador,
            valgrind,
        }
    }
}

/// The environment variable naming the `limitador-server` binary.
const LIMITADOR_VAR: &str = "TRT_LIMITADOR_BIN";

/// Where a checkout of Kuadrant/limitador beside the project builds its
/// server, relative to the project's root.
const LIMITADOR_BESIDE: &str = "../limitador/target/release/limitador-server";

/// How to get `limitador-server`, for the rows that have no figure
/// without it.
const LIMITADOR_HOWTO: &str = "build it with `git clone \
     https://github.com/Kuadrant/limitador ../limitador && cd ../limitador && cargo \
     build --release -p limitador-server` (it needs protoc and libclang: `apt-get \
     install protobuf-compiler libclang-dev`), or set TRT_LIMITADOR_BIN to one";

/// Kuadrant's `limitador-server`: `TRT_LIMITADOR_BIN` (which must then
/// be there), else `limitador-server` on PATH, else a release build in a
/// checkout beside the project ([`LIMITADOR_BESIDE`]).
fn limitador_bin() -> std::result::Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os(LIMITADOR_VAR).map(PathBuf::from) {
        return if is_executable(&bin) {
            Ok(bin)
        } else {
            Err(format!(
                "not measured: {LIMITADOR_VAR}={} is not an executable; {LIMITADOR_HOWTO}",
                bin.display()
            ))
        };
    }
    let beside = crate::cmd::project_root().join(LIMITADOR_BESIDE);
    find_on_path("limitador-server")
        .or_else(|| is_executable(&beside).then_some(beside))
        .ok_or_else(|| {
            format!(
                "not measured: no limitador-server (not on PATH, not at \
                 {LIMITADOR_BESIDE}, no {LIMITADOR_VAR}); {LIMITADOR_HOWTO}"
            )
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_takes_known_parts_once_each() {
        assert_eq!(
            Part::parse_list("reserve,shaper"),
            Ok(vec![Part::Reserve, Part::Shaper])
        );
        assert_eq!(Part::parse_list(" kinds , kinds"), Ok(vec![Part::Kinds]));
        let error = Part::parse_list("reserve,shaping").unwrap_err();
        assert!(error.contains("no part `shaping`"), "{error}");
        assert!(error.contains("redis_cpu"), "{error}");
        assert!(Part::parse_list("").is_err());
        assert!(Part::parse_list("reserve,").is_err());
        for (part, name) in PARTS {
            assert_eq!(Part::from_name(name), Some(part));
            assert_eq!(part.name(), name);
        }
    }

    #[test]
    fn a_plan_runs_its_parts_and_names_them_in_its_command() {
        let whole = Plan::new(false, None);
        assert!(PARTS.iter().all(|(part, _)| whole.runs(*part)));
        assert!(whole.runs_target("anything"));
        assert_eq!(whole.command(&[]), "cargo xtask bench");

        let only = Plan::new(true, Some(vec![Part::Reserve, Part::Shaper]));
        assert!(only.runs(Part::Reserve) && only.runs(Part::Shaper));
        assert!(!only.runs(Part::Kinds));
        assert!(only.runs_target("reserve") && !only.runs_target("check"));
        assert!(!only.runs_target("anything"));

        // The `rls` target holds the client the `limitador` part drives.
        let limitador = Plan::new(false, Some(vec![Part::Limitador]));
        assert!(limitador.runs_target("rls") && !limitador.runs(Part::Rls));
        assert_eq!(
            only.command(&["reserve/".into()]),
            "cargo xtask bench --full --only reserve,shaper -- reserve/"
        );
    }
}
