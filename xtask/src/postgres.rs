//! The tasks' throwaway PostgreSQL comes from `trt-postgres`, the other
//! binary of the workspace's test-support crate (`crates/test-support`),
//! which runs the installed server binaries (`initdb` into a temporary
//! directory, `pg_ctl` on a free loopback port, never 5432). This module
//! builds it, starts it, reads the tests' environment it prints, and stops it
//! (by closing its standard input) when the task ends, on success, on
//! failure and on Ctrl-C alike, as `redis.rs` does for `trt-redis`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::cmd::Cmd;
use crate::cmd::Result;

/// The line `trt-postgres up` prints last, once the server is up.
const READY: &str = "TRT_POSTGRES_READY=1";
/// How long `trt-postgres` has to stop the server once told to.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Builds `trt-postgres` and returns its path, built as the workspace's
/// tests build it (`cargo test --workspace --all-features`, one test target
/// of its crate), so that it shares their dependencies' build.
pub(crate) fn build_trt_postgres() -> Result<PathBuf> {
    let messages = Cmd::cargo()
        .args(["test", "--workspace", "--all-features", "--no-run"])
        .args([
            "--test",
            "trt_postgres",
            "--message-format=json-render-diagnostics",
        ])
        .read_stdout()?;
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|message| {
            message["reason"] == "compiler-artifact"
                && message["target"]["name"] == "trt-postgres"
        })
        .and_then(|artifact| artifact["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| {
            "cargo built no `trt-postgres` executable (crates/test-support)"
                .to_owned()
        })
}

/// A running `trt-postgres up`: its server lives as long as this guard.
pub(crate) struct Postgres {
    child: Child,
    stdin: Option<ChildStdin>,
    env: Vec<(String, String)>,
}

impl Postgres {
    /// Starts `trt-postgres up` and waits until it prints that the server is
    /// up. Without PostgreSQL's server binaries it fails, having printed
    /// what to install (`apt-get install -y postgresql`).
    pub(crate) fn up(trt_postgres: &Path) -> Result<Self> {
        let cmd = Cmd::new(trt_postgres).arg("up");
        println!("$ {} &", cmd.display());
        let mut command = cmd.command();
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Its own process group: Ctrl-C stops this task, and `trt-postgres`
        // then sees its standard input close and stops the server and
        // removes its directory, instead of dying half-way.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .spawn()
            .map_err(|e| format!("could not start `{}`: {e}", cmd.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stdin = child.stdin.take();
        // From here on, dropping `postgres` stops it.
        let mut postgres = Self {
            child,
            stdin,
            env: Vec::new(),
        };
        for line in BufReader::new(stdout).lines() {
            let line = line
                .map_err(|e| format!("reading trt-postgres's output: {e}"))?;
            if line == READY {
                for (key, value) in &postgres.env {
                    println!("xtask: {key}={value}");
                }
                return Ok(postgres);
            }
            if let Some((key, value)) = line.split_once('=') {
                postgres.env.push((key.to_owned(), value.to_owned()));
            }
        }
        let status = postgres
            .child
            .wait()
            .map_or_else(|e| e.to_string(), |s| s.to_string());
        Err(format!(
            "trt-postgres stopped before PostgreSQL was up ({status}); its message is above. \
             The PostgreSQL tests need PostgreSQL's server binaries (initdb, pg_ctl, \
             postgres): `apt-get install -y postgresql` on Debian/Ubuntu, or set \
             TRT_POSTGRES_BIN_DIR to their directory"
        ))
    }

    /// The tests' environment: `TRT_POSTGRES_URL`, and
    /// `TRT_POSTGRES_BIN_DIR` (the binaries the tests' own servers run).
    pub(crate) fn env(&self) -> &[(String, String)] {
        &self.env
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // End of its standard input: it stops the server and exits.
        drop(self.stdin.take());
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= deadline => {
                    eprintln!(
                        "xtask: trt-postgres did not stop within {} s: killing it (its \
                         PostgreSQL may be left running)",
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
