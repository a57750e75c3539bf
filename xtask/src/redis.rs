//! The tasks' throwaway Redis servers come from `trt-redis`, the binary of
//! the workspace's test-support crate (`crates/test-support`): the one
//! launcher in the repository, for `redis-server` processes and Docker
//! containers alike. This module builds it, starts it, reads the tests'
//! environment it prints, and stops it (by closing its standard input) when
//! the task ends, on success and on failure alike.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::cmd::Result;
use crate::cmd::{Cmd, find_on_path, is_executable};

/// The line `trt-redis up` prints last, once everything is up.
const READY: &str = "TRT_REDIS_READY=1";
/// How long `trt-redis` has to stop everything once told to.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Builds `trt-redis` and returns its path. It is built as the
/// workspace's tests build it (`cargo test --workspace --all-features`, one
/// test target of its crate), so the dependencies it shares with the tests
/// (tokio, redis, testcontainers) are compiled once.
pub(crate) fn build_trt_redis() -> Result<PathBuf> {
    let messages = Cmd::cargo()
        .args(["test", "--workspace", "--all-features", "--no-run"])
        .args([
            "--test",
            "trt_redis",
            "--message-format=json-render-diagnostics",
        ])
        .read_stdout()?;
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|message| {
            message["reason"] == "compiler-artifact"
                && message["target"]["name"] == "trt-redis"
        })
        .and_then(|artifact| artifact["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| {
            "cargo built no `trt-redis` executable (crates/test-support)"
                .to_owned()
        })
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
pub(crate) struct Servers {
    child: Child,
    stdin: Option<ChildStdin>,
    env: Vec<(String, String)>,
}

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
        println!("$ {} &", cmd.display());
        let mut command = cmd.command();
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Its own process group: Ctrl-C stops this task, and `trt-redis`
        // then sees its standard input close and removes what it started
        // (containers included), instead of dying half-way.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .spawn()
            .map_err(|e| format!("could not start `{}`: {e}", cmd.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stdin = child.stdin.take();
        // From here on, dropping `servers` stops it.
        let mut servers = Self {
            child,
            stdin,
            env: Vec::new(),
        };
        for line in BufReader::new(stdout).lines() {
            let line =
                line.map_err(|e| format!("reading trt-redis's output: {e}"))?;
            if line == READY {
                for (key, value) in &servers.env {
                    println!("xtask: {key}={value}");
                }
                return Ok(servers);
            }
            if let Some((key, value)) = line.split_once('=') {
                servers.env.push((key.to_owned(), value.to_owned()));
            }
        }
        let status = servers
            .child
            .wait()
            .map_or_else(|e| e.to_string(), |s| s.to_string());
        Err(format!(
            "trt-redis stopped before its servers were up ({status}); its message is above"
        ))
    }

    /// The tests' environment: `TRT_REDIS_BACKEND`, `TRT_REDIS_URL`,
    /// `TRT_REDIS_CLUSTER_URLS`, and `TRT_REDIS_SERVER_BIN` or
    /// `TRT_REDIS_IMAGE`.
    pub(crate) fn env(&self) -> &[(String, String)] {
        &self.env
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        // End of its standard input: it stops everything and exits.
        drop(self.stdin.take());
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= deadline => {
                    eprintln!(
                        "xtask: trt-redis did not stop within {} s: killing it (its servers \
                         may be left running)",
                        STOP_TIMEOUT.as_secs()
                    );
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return;
                }
                Ok(None) => thread::sleep(Duration::from_millis(20)),
            }
        }
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
