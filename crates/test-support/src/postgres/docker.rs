//! The Docker backend of [`PostgresServer`](super::PostgresServer): a
//! container of the image (the official `postgres:15`, or the local one
//! `trt-postgres build-image` makes) on the host's network, through the
//! crate's [`DockerNode`].
//!
//! The command is `postgres -p <port> -c listen_addresses=127.0.0.1 ...`
//! (the process backend's settings). Both images' entrypoints create the
//! cluster when the data directory is empty (superuser `postgres`, trust
//! authentication, UTF-8 with the C locale), then run the command; a
//! restarted container finds its cluster and only runs it.

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use super::{
    Cluster, PSQL_TIMEOUT, SETTINGS, START_TIMEOUT, addr, answers, psql_args,
};
use crate::backend::Image;
use crate::docker::{DockerNode, Launch};
use crate::env::new_temp_dir;
use crate::error::{Error, Result};

/// What a container's entrypoint reads: the official image's creates the
/// cluster with these (ours with the same, its own).
const ENV: &[(&str, &str)] = &[
    ("POSTGRES_HOST_AUTH_METHOD", "trust"),
    (
        "POSTGRES_INITDB_ARGS",
        "--locale=C --encoding=UTF8 --no-sync",
    ),
];
/// The server's binaries' directory, asked once it answers: the question
/// that tells it accepts queries (not only connections, which it does while
/// it starts up, to refuse them).
const BIN_DIR_QUERY: &str =
    "select setting from pg_config where name = 'BINDIR'";

/// A container running PostgreSQL, and a temporary directory of this
/// machine for the caller's files; both removed when dropped.
pub(super) struct DockerCluster {
    node: DockerNode,
    dir: PathBuf,
    /// Where its binaries are inside the image, once it has answered.
    bin_dir: PathBuf,
    /// Started by [`launch`](Self::launch) and not yet waited for.
    launched: bool,
}

impl DockerCluster {
    /// Creates and starts a container of `image` whose server listens on
    /// `port`: [`start`](Self::start) waits for it.
    pub(super) fn launch(image: &Image, port: u16) -> Result<Self> {
        let dir = new_temp_dir("trt-postgres")?;
        let mut cmd: Vec<String> = ["postgres", "-p", &port.to_string()]
            .map(str::to_owned)
            .into();
        for setting in SETTINGS {
            cmd.extend(["-c".to_owned(), (*setting).to_owned()]);
        }
        let node = DockerNode::launch(Launch {
            image,
            name: format!("trt-postgres-{port}"),
            cmd,
            env: ENV,
            files: &[],
            local_build: "build it from the installed PostgreSQL with `cargo xtask \
                          postgres-image`",
        });
        let node = match node {
            Ok(node) => node,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        Ok(Self {
            node,
            dir,
            bin_dir: PathBuf::new(),
            launched: true,
        })
    }
}

impl Cluster for DockerCluster {
    fn backend(&self) -> &'static str {
        "docker"
    }

    fn log_place(&self) -> String {
        format!("`docker logs {}`", self.node.short_id())
    }

    /// `None`: its processes are the engine's, not this machine's to
    /// signal.
    fn postmaster(&self) -> Option<u32> {
        None
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// Starts the container (again, unless [`launch`](Self::launch) just
    /// did) and returns once its server on `port` accepts queries: it
    /// answers on the port, and `psql` gets an answer (not "the database
    /// system is starting up"). A container that exits meanwhile (its port
    /// taken, for one) is an error at once.
    fn start(&mut self, port: u16) -> Result<()> {
        if !std::mem::take(&mut self.launched) {
            self.node.relaunch()?;
        }
        let deadline = Instant::now() + START_TIMEOUT;
        let mut refused = None;
        loop {
            if answers(addr(port), Duration::from_millis(500)) {
                match self.psql(port, BIN_DIR_QUERY) {
                    Ok(dir) => {
                        self.bin_dir = PathBuf::from(dir.trim());
                        return Ok(());
                    }
                    Err(e) => refused = Some(e),
                }
            }
            if let Some(status) = self.node.exited() {
                return Err(Error::new(status));
            }
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "it did not accept queries on 127.0.0.1:{port} within {} s{}",
                    START_TIMEOUT.as_secs(),
                    refused
                        .map(|e| format!(" (the last try: {e})"))
                        .unwrap_or_default()
                )));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// `docker stop`: the image's stop signal (SIGINT, a fast shutdown, in
    /// the official image and ours), SIGKILL if it has not stopped within
    /// [`START_TIMEOUT`].
    fn stop(&mut self) -> Result<()> {
        self.node.stop(START_TIMEOUT)
    }

    /// `docker kill`: SIGKILL to the container, paused or not.
    fn kill(&mut self) -> Result<()> {
        self.node.kill()
    }

    /// `docker pause`.
    fn pause(&self) -> Result<()> {
        self.node.pause()
    }

    /// `docker unpause`.
    fn resume(&self) -> Result<()> {
        self.node.resume()
    }

    /// What the container printed, every run.
    fn logs(&self) -> String {
        self.node.logs()
    }

    /// The image's `psql` with [`psql_args`], in the container (`docker
    /// exec`), each statement bounded by [`PSQL_TIMEOUT`]: what it printed.
    fn psql(&self, port: u16, sql: &str) -> Result<String> {
        let timeout =
            format!("-c statement_timeout={}", PSQL_TIMEOUT.as_millis());
        let mut cmd = vec!["psql".to_owned()];
        cmd.extend(psql_args(port, sql));
        self.node.exec(cmd, &[("PGOPTIONS", &timeout)])
    }
}

impl Drop for DockerCluster {
    fn drop(&mut self) {
        // The container goes with `node` (`docker rm -f -v`).
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
