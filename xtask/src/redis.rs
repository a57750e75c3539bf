//! The tasks' throwaway Redis servers come from `trt-redis`, the binary of
//! the workspace's test-support crate (`crates/test-support`): the one
//! launcher in the repository, for `redis-server` processes and Docker
//! containers alike. This module builds it, starts it, reads the tests'
//! environment it prints, and stops it (by closing its standard input) when
//! the task ends, on success and on failure alike.

use std::path::{Path, PathBuf};

use crate::cmd::Result;
use crate::cmd::{Cmd, find_on_path, is_executable};
use crate::launcher::{self, Launched};

/// The line `trt-redis up` prints last, once everything is up.
const READY: &str = "TRT_REDIS_READY=1";

/// Builds `trt-redis` and returns its path.
pub(crate) fn build_trt_redis() -> Result<PathBuf> {
    launcher::build("trt_redis", "trt-redis")
}

/// What to start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wanted {
    /// A single server (`TRT_REDIS_URL`).
    pub(crate) server: bool,
    /// A 3-master cluster (`TRT_REDIS_CLUSTER_URLS`).
    pub(crate) cluster: bool,
    /// Docker containers, whatever else is installed (`--docker`).
    pub(crate) docker: bool,
}

/// A running `trt-redis up`: its servers live as long as this guard.
pub(crate) struct Servers(Launched);

impl Servers {
    /// Starts `trt-redis up` and waits until it prints that everything is up.
    pub(crate) fn up(trt_redis: &Path, wanted: Wanted) -> Result<Self> {
        let mut cmd = Cmd::new(trt_redis).arg("up");
        for (flag, on) in [
            ("--server", wanted.server),
            ("--cluster", wanted.cluster),
            ("--docker", wanted.docker),
        ] {
            if on {
                cmd = cmd.arg(flag);
            }
        }
        Self::start(cmd)
    }

    /// Runs `cmd` (a `trt-redis up ...`) until it prints that everything is up.
    fn start(cmd: Cmd) -> Result<Self> {
        Launched::start("trt-redis", cmd, READY, "").map(Servers)
    }

    /// The tests' environment: `TRT_REDIS_BACKEND`, `TRT_REDIS_URL`,
    /// `TRT_REDIS_CLUSTER_URLS`, and `TRT_REDIS_SERVER_BIN` or
    /// `TRT_REDIS_IMAGE`.
    pub(crate) fn env(&self) -> &[(String, String)] {
        self.0.env()
    }
}

/// `redis-server` for the benchmark (which also needs `redis-cli` and
/// `redis-benchmark` beside it): `TRT_REDIS_SERVER_BIN`, else from `PATH`.
/// Only a lookup: the server itself comes from `trt-redis`
/// ([`RedisServer::start`]).
pub(crate) fn find_server() -> Result<PathBuf> {
    if let Some(bin) =
        std::env::var_os(SERVER_BIN_VAR).filter(|v| !v.is_empty())
    {
        let bin = PathBuf::from(bin);
        return if is_executable(&bin) {
            Ok(bin)
        } else {
            Err(format!(
                "{SERVER_BIN_VAR}={} is not an executable file",
                bin.display()
            ))
        };
    }
    find_on_path("redis-server").ok_or_else(|| {
        "`redis-server` is not on PATH: install it with `apt-get install redis-server` \
         (Debian/Ubuntu; `brew install redis` on macOS), or set TRT_REDIS_SERVER_BIN to its path"
            .to_owned()
    })
}

/// `redis-cli`: beside the server, else from `PATH`.
pub(crate) fn find_cli(server: &Path) -> Result<PathBuf> {
    server
        .parent()
        .map(|dir| dir.join("redis-cli"))
        .filter(|cli| is_executable(cli))
        .or_else(|| find_on_path("redis-cli"))
        .ok_or_else(|| {
            "`redis-cli` is not on PATH: install it with `apt-get install redis-tools` \
             (Debian/Ubuntu)"
                .to_owned()
        })
}

/// The environment variable naming the `redis-server` binary.
const SERVER_BIN_VAR: &str = "TRT_REDIS_SERVER_BIN";

/// One throwaway `redis-server` process of `server_bin` (for the benchmark,
/// which measures against a local process): `trt-redis up --server
/// --process`, stopped when dropped.
pub(crate) struct RedisServer {
    url: String,
    port: u16,
    _servers: Servers,
}

impl RedisServer {
    pub(crate) fn start(server_bin: &Path) -> Result<Self> {
        let trt_redis = build_trt_redis()?;
        let servers = Servers::start(
            Cmd::new(&trt_redis)
                .args(["up", "--server", "--process"])
                .env(SERVER_BIN_VAR, server_bin),
        )?;
        let url = servers
            .env()
            .iter()
            .find(|(key, _)| key == "TRT_REDIS_URL")
            .map(|(_, url)| url.clone())
            .ok_or("trt-redis printed no TRT_REDIS_URL")?;
        let port = url
            .trim_end_matches('/')
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .ok_or_else(|| {
                format!("trt-redis printed a URL without a port: {url}")
            })?;
        Ok(Self {
            url,
            port,
            _servers: servers,
        })
    }

    pub(crate) fn url(&self) -> String {
        self.url.clone()
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}
