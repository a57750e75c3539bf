//! The tasks' throwaway PostgreSQL comes from `trt-postgres`, the other
//! binary of the workspace's test-support crate (`crates/test-support`),
//! which runs the installed server binaries (`initdb` into a temporary
//! directory, `pg_ctl` on a free loopback port, never 5432), or a Docker
//! container. This module
//! builds it, starts it, reads the tests' environment it prints, and stops it
//! (by closing its standard input) when the task ends, on success, on
//! failure and on Ctrl-C alike, as `redis.rs` does for `trt-redis`.

use std::path::{Path, PathBuf};

use crate::cmd::{Cmd, Result};
use crate::launcher::{self, Launched};

/// The line `trt-postgres up` prints last, once the server is up.
const READY: &str = "TRT_POSTGRES_READY=1";

/// Builds `trt-postgres` and returns its path.
pub(crate) fn build_trt_postgres() -> Result<PathBuf> {
    launcher::build("trt_postgres", "trt-postgres")
}

/// A running `trt-postgres up`: its server lives as long as this guard.
pub(crate) struct Postgres(Launched);

impl Postgres {
    /// Starts `trt-postgres up` (`--docker` with `docker`: a container,
    /// even where the binaries are installed) and waits until it prints that
    /// the server is up. Without PostgreSQL's server binaries or Docker it
    /// fails, having printed how to get either (`apt-get install -y
    /// postgresql`).
    pub(crate) fn up(trt_postgres: &Path, docker: bool) -> Result<Self> {
        let mut cmd = Cmd::new(trt_postgres).arg("up");
        if docker {
            cmd = cmd.arg("--docker");
        }
        Launched::start(
            "trt-postgres",
            cmd,
            READY,
            ". The PostgreSQL tests need PostgreSQL's server binaries (initdb, pg_ctl, \
             postgres: `apt-get install -y postgresql` on Debian/Ubuntu, or set \
             TRT_POSTGRES_BIN_DIR to their directory) or a Docker engine",
        )
        .map(Postgres)
    }

    /// The tests' environment: `TRT_POSTGRES_BACKEND`, `TRT_POSTGRES_URL`,
    /// and `TRT_POSTGRES_BIN_DIR` or `TRT_POSTGRES_IMAGE` (what the tests'
    /// own servers run).
    pub(crate) fn env(&self) -> &[(String, String)] {
        self.0.env()
    }
}
