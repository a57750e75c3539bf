//! The test-support launchers (`trt-redis`, `trt-postgres`) as xtask runs
//! them: built as the workspace's tests build them, started in a process
//! group of their own, read until they print that their servers are up
//! (`KEY=VALUE` lines, the tests' environment, then a ready line), and
//! stopped by closing their standard input when the task ends, on success,
//! on failure and on Ctrl-C alike.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::cmd::{Cmd, Result};

/// How long a launcher has to stop its servers once told to.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Builds the test-support binary `bin` (with its crate's test target
/// `test`) and returns its path. It is built as the workspace's tests build
/// it (`cargo test --workspace --all-features`), so that the dependencies
/// it shares with the tests are compiled once.
pub(crate) fn build(test: &str, bin: &str) -> Result<PathBuf> {
    let messages = Cmd::cargo()
        .args(["test", "--workspace", "--all-features", "--no-run"])
        .args(["--test", test, "--message-format=json-render-diagnostics"])
        .read_stdout()?;
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|message| {
            message["reason"] == "compiler-artifact"
                && message["target"]["name"] == bin
        })
        .and_then(|artifact| artifact["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| {
            format!("cargo built no `{bin}` executable (crates/test-support)")
        })
}

/// A running launcher: its servers live as long as this guard.
pub(crate) struct Launched {
    name: &'static str,
    child: Child,
    stdin: Option<ChildStdin>,
    env: Vec<(String, String)>,
}

impl Launched {
    /// Runs `cmd` (launcher `name`) until it prints `ready`; `missing` is
    /// said when it stops before.
    pub(crate) fn start(
        name: &'static str,
        cmd: Cmd,
        ready: &str,
        missing: &str,
    ) -> Result<Self> {
        println!("$ {} &", cmd.display());
        let mut command = cmd.command();
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // Its own process group: Ctrl-C stops this task, and the launcher
        // then sees its standard input close and removes what it started,
        // instead of dying half-way.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .spawn()
            .map_err(|e| format!("could not start `{}`: {e}", cmd.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stdin = child.stdin.take();
        // From here on, dropping `launched` stops it.
        let mut launched = Self {
            name,
            child,
            stdin,
            env: Vec::new(),
        };
        for line in BufReader::new(stdout).lines() {
            let line =
                line.map_err(|e| format!("reading {name}'s output: {e}"))?;
            if line == ready {
                for (key, value) in &launched.env {
                    println!("xtask: {key}={value}");
                }
                return Ok(launched);
            }
            if let Some((key, value)) = line.split_once('=') {
                launched.env.push((key.to_owned(), value.to_owned()));
            }
        }
        let status = launched
            .child
            .wait()
            .map_or_else(|e| e.to_string(), |s| s.to_string());
        Err(format!(
            "{name} stopped before its servers were up ({status}); its message is above{missing}"
        ))
    }

    /// The tests' environment it printed.
    pub(crate) fn env(&self) -> &[(String, String)] {
        &self.env
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        // End of its standard input: it stops everything and exits.
        drop(self.stdin.take());
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if Instant::now() >= deadline => {
                    eprintln!(
                        "xtask: {} did not stop within {} s: killing it (its servers \
                         may be left running)",
                        self.name,
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
