//! The process backend of [`PostgresServer`](super::PostgresServer): the
//! installed server binaries (Debian's `postgresql` package) in a temporary
//! directory of its own.
//!
//! `initdb` creates a fresh cluster in that directory, `pg_ctl` starts it on
//! the server's port, and dropping it stops the server and removes the
//! directory. PostgreSQL refuses to run as root: when this process is root,
//! `initdb` and `pg_ctl` run as the `postgres` system user (which Debian's
//! package creates), through `runuser` (or `su`), and the directory belongs
//! to that user.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

mod bin_dir;
mod os;

use super::{
    Cluster, POSTGRES_SUPERUSER, PSQL_TIMEOUT, SETTINGS, START_TIMEOUT, addr,
    answers, psql_args,
};
use crate::backend::{find_on_path, is_executable};
use crate::env::new_temp_dir;
use crate::error::{Error, Result};
use bin_dir::SERVER_PROGRAMS;
pub use bin_dir::{POSTGRES_BIN_DIR_VAR, find_postgres_bin_dir};
use os::{
    RunAs, Signal, descendants, is_alive, is_postgres, is_stopped,
    read_postmaster_pid, sys,
};

/// The log every run of the server appends to (`pg_ctl -l`).
const LOG: &str = "postgres.log";
/// What `initdb` printed.
const INITDB_LOG: &str = "initdb.log";
/// How long killed processes have to disappear, and paused ones to stop.
const SIGNAL_TIMEOUT: Duration = Duration::from_secs(10);

/// A cluster of the installed binaries in a temporary directory (the
/// cluster in `data/`, its Unix socket in `sock/`, its log in
/// `postgres.log`), and its server while it runs. Stopped, and the
/// directory removed, when dropped.
pub(super) struct ProcessCluster {
    bin_dir: PathBuf,
    run_as: RunAs,
    /// The temporary directory: `data/`, `sock/`, the logs.
    dir: PathBuf,
    /// The port of its last start.
    port: u16,
    /// The postmaster's process id while it runs.
    postmaster: Option<u32>,
}

impl ProcessCluster {
    /// Creates a cluster (`initdb`) with the binaries of `bin_dir`, in a new
    /// temporary directory.
    pub(super) fn create(bin_dir: &Path) -> Result<Self> {
        let missing: Vec<&str> = SERVER_PROGRAMS
            .into_iter()
            .filter(|p| !is_executable(&bin_dir.join(p)))
            .collect();
        if !missing.is_empty() {
            return Err(Error::new(format!(
                "{} does not hold the PostgreSQL server binaries ({} missing): install them \
                 (`apt-get install -y postgresql` on Debian/Ubuntu)",
                bin_dir.display(),
                missing.join(", ")
            )));
        }
        let run_as = RunAs::for_this_process()?;
        sys::adopt_orphans();
        let dir = new_temp_dir("trt-postgres")?;
        // From here on, dropping `cluster` removes the directory.
        let cluster = Self {
            bin_dir: bin_dir.to_path_buf(),
            run_as,
            dir,
            port: 0,
            postmaster: None,
        };
        let sock = cluster.dir.join("sock");
        fs::create_dir_all(&sock).map_err(|e| {
            Error::new(format!("could not create {}: {e}", sock.display()))
        })?;
        cluster.run_as.give(&cluster.dir)?;
        cluster.run_as.give(&sock)?;
        cluster.initdb()?;
        Ok(cluster)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(LOG)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn program(&self, name: &str) -> PathBuf {
        self.bin_dir.join(name)
    }

    /// `initdb`: superuser `postgres`, trust authentication, UTF-8 with the
    /// C locale (no locale needs to be installed), no fsync of its files.
    fn initdb(&self) -> Result<()> {
        let mut command = self.run_as.command(&self.program("initdb"));
        command
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", POSTGRES_SUPERUSER, "-A", "trust"])
            .args(["-E", "UTF8", "--locale=C", "--no-sync"]);
        let output = self.run(command, "initdb")?;
        let printed = printed(&output);
        let _ = fs::write(self.dir.join(INITDB_LOG), &printed);
        if output.status.success() {
            return Ok(());
        }
        let hint = match &self.run_as {
            RunAs::Me => String::new(),
            RunAs::User { name, .. } => format!(
                "\n(this process is root, so initdb ran as the `{name}` user: every directory \
                 above {} must be searchable by it; set TMPDIR to a directory such as /tmp if \
                 it is not)",
                self.dir.display()
            ),
        };
        Err(Error::new(format!(
            "`initdb` of {} failed ({}){hint}\n--- what it printed ---\n{printed}",
            self.bin_dir.display(),
            output.status
        )))
    }

    /// Runs `command` (in the cluster's directory, stdin closed) and returns
    /// what it printed.
    fn run(&self, mut command: Command, what: &str) -> Result<Output> {
        command
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .env("LC_ALL", "C")
            .output()
            .map_err(|e| {
                Error::new(format!(
                    "could not run {what} ({}): {e}",
                    self.bin_dir.display()
                ))
            })
    }

    /// `pg_ctl stop -m <mode> -w`.
    fn pg_ctl_stop(&mut self, mode: &str) -> Result<()> {
        let mut command = self.run_as.command(&self.program("pg_ctl"));
        command
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", mode, "-w"])
            .args(["-t", &START_TIMEOUT.as_secs().to_string(), "stop"]);
        let output = self.run(command, "pg_ctl stop")?;
        if output.status.success() {
            // It removed its pid file as it exited: reaped in a moment.
            if let Some(postmaster) = self.postmaster {
                let _ = wait_until(|| !is_alive(postmaster));
            }
            self.postmaster = None;
            Ok(())
        } else {
            Err(Error::new(format!(
                "`pg_ctl stop -m {mode}` {}:\n{}",
                output.status,
                printed(&output).trim_end()
            )))
        }
    }

    /// After a kill: the System V interlock segment (its id is in
    /// `postmaster.pid`), which outlives its processes, and the stale lock
    /// files, `postmaster.pid` and the socket's (where no init process reaps
    /// orphans, the dead postmaster stays a zombie, and a new one would take
    /// it for a running server).
    fn remove_crash_leftovers(&self) {
        let pid_file = self.data_dir().join("postmaster.pid");
        if let Ok(text) = fs::read_to_string(&pid_file) {
            // Line 7: "<key> <shmid>".
            if let Some(shmid) = text
                .lines()
                .nth(6)
                .and_then(|line| line.split_whitespace().nth(1))
                .filter(|id| id.parse::<u64>().is_ok())
            {
                let _ = Command::new("ipcrm")
                    .args(["-m", shmid])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        let _ = fs::remove_file(pid_file);
        // The socket's lock file names the dead postmaster too.
        let socket = self
            .dir
            .join("sock")
            .join(format!(".s.PGSQL.{}", self.port));
        let _ = fs::remove_file(
            socket.with_extension(format!("{}.lock", self.port)),
        );
        let _ = fs::remove_file(socket);
    }

    /// Best effort, for failures and drop: whatever runs is killed (SIGKILL
    /// stops a paused process too).
    fn kill_everything(&mut self) {
        if self.postmaster.is_some() {
            let _ = self.kill();
        }
    }
}

impl Cluster for ProcessCluster {
    fn backend(&self) -> &'static str {
        "process"
    }

    fn log_place(&self) -> String {
        self.log_path().display().to_string()
    }

    fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    fn postmaster(&self) -> Option<u32> {
        self.postmaster
    }

    /// `pg_ctl start -w` on `port`; records the postmaster's pid, and
    /// returns once it answers. Whatever a failed start left running is
    /// killed.
    fn start(&mut self, port: u16) -> Result<()> {
        self.port = port;
        let sock = self.dir.join("sock");
        let sock = sock.to_str().filter(|s| !s.contains('\'')).ok_or_else(|| {
            Error::new(format!(
                "{} cannot be given to pg_ctl (not UTF-8, or a quote in it): set TMPDIR to a \
                 plain directory such as /tmp",
                sock.display()
            ))
        })?;
        // pg_ctl hands these to a shell: the socket directory is quoted.
        let mut options = format!("-p {port} -k '{sock}'");
        for setting in SETTINGS {
            options.push_str(" -c ");
            options.push_str(setting);
        }
        let mut command = self.run_as.command(&self.program("pg_ctl"));
        command
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.log_path())
            .args(["-w", "-t", &START_TIMEOUT.as_secs().to_string()])
            .arg("-o")
            .arg(options)
            .arg("start");
        let output = self.run(command, "pg_ctl start")?;
        if !output.status.success() {
            // A start that timed out may have left a server running.
            self.postmaster = read_postmaster_pid(&self.data_dir())
                .filter(|&pid| is_postgres(pid));
            self.kill_everything();
            return Err(Error::new(format!(
                "`pg_ctl start` {}:\n{}",
                output.status,
                printed(&output).trim_end()
            )));
        }
        self.postmaster = read_postmaster_pid(&self.data_dir());
        if self.postmaster.is_none() {
            return Err(Error::new(format!(
                "pg_ctl reported it started, but {} names no postmaster",
                self.data_dir().join("postmaster.pid").display()
            )));
        }
        if !answers(addr(port), Duration::from_secs(5)) {
            return Err(Error::new(format!(
                "pg_ctl reported it started, but it does not answer on 127.0.0.1:{port}"
            )));
        }
        Ok(())
    }

    /// `pg_ctl stop -m fast`: clients are disconnected, everything is
    /// written.
    fn stop(&mut self) -> Result<()> {
        self.pg_ctl_stop("fast")
    }

    /// Everything it logged, every run.
    fn logs(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// `psql` (from the server's binaries, else `PATH`) with
    /// [`psql_args`], killed after [`PSQL_TIMEOUT`]: what it printed.
    fn psql(&self, port: u16, sql: &str) -> Result<String> {
        let psql = Some(self.program("psql"))
            .filter(|p| is_executable(p))
            .or_else(|| find_on_path("psql"))
            .ok_or_else(|| {
                Error::new(format!(
                    "`psql` is not in {} nor on PATH: install it (`apt-get install -y \
                     postgresql-client`)",
                    self.bin_dir.display()
                ))
            })?;
        let mut command = Command::new(&psql);
        command
            .args(psql_args(port, sql))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let output = output_within(command, PSQL_TIMEOUT)?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(Error::new(format!(
                "failed ({}):\n{}",
                output.status,
                printed(&output).trim_end()
            )))
        }
    }

    /// SIGKILL to every one of its processes (backends included; paused or
    /// not), then to the postmaster (stopped meanwhile, so that none sees
    /// another die and says so to its client); waits until they are gone.
    /// The data directory is left as a crash leaves it, minus the stale lock
    /// files and the server's System V interlock segment, which nothing
    /// would remove.
    fn kill(&mut self) -> Result<()> {
        let postmaster = self.postmaster.ok_or_else(|| {
            Error::new("its postmaster's process id is unknown")
        })?;
        // Stopped first, it forks no new backend while they are listed, and
        // sees none of them die. Its processes go first: killed last, it
        // leaves none the time to notice its death and tell its client
        // ("terminating connection due to unexpected postmaster exit").
        let _ = sys::signal(postmaster, Signal::Stop);
        let _ = wait_until(|| !is_alive(postmaster) || is_stopped(postmaster));
        let mut pids = descendants(postmaster);
        pids.push(postmaster);
        for &pid in &pids {
            // One that is already gone is no failure.
            let _ = sys::signal(pid, Signal::Kill);
        }
        let gone = wait_until(|| pids.iter().all(|&pid| !is_alive(pid)));
        let left: Vec<u32> =
            pids.iter().copied().filter(|&pid| is_alive(pid)).collect();
        if !gone {
            return Err(Error::new(format!(
                "processes {left:?} were still alive {} s after SIGKILL",
                SIGNAL_TIMEOUT.as_secs()
            )));
        }
        self.postmaster = None;
        self.remove_crash_leftovers();
        Ok(())
    }

    /// SIGSTOP to the postmaster, then to each of its processes (every
    /// backend); returns once all of them are stopped.
    fn pause(&self) -> Result<()> {
        let postmaster = self.postmaster.ok_or_else(|| {
            Error::new("its postmaster's process id is unknown")
        })?;
        sys::signal(postmaster, Signal::Stop)?;
        if !wait_until(|| is_stopped(postmaster)) {
            return Err(Error::new(format!(
                "the postmaster (pid {postmaster}) did not stop within {} s of SIGSTOP",
                SIGNAL_TIMEOUT.as_secs()
            )));
        }
        // It forks nothing now: these are all of them.
        let children = descendants(postmaster);
        for &pid in &children {
            let _ = sys::signal(pid, Signal::Stop);
        }
        let running =
            || children.iter().copied().filter(|&pid| !is_stopped(pid));
        if !wait_until(|| running().next().is_none()) {
            return Err(Error::new(format!(
                "processes {:?} did not stop within {} s of SIGSTOP",
                running().collect::<Vec<_>>(),
                SIGNAL_TIMEOUT.as_secs()
            )));
        }
        Ok(())
    }

    /// SIGCONT to each of its processes, the postmaster last.
    fn resume(&self) -> Result<()> {
        let postmaster = self.postmaster.ok_or_else(|| {
            Error::new("its postmaster's process id is unknown")
        })?;
        for pid in descendants(postmaster) {
            let _ = sys::signal(pid, Signal::Cont);
        }
        sys::signal(postmaster, Signal::Cont)
    }
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        if self.postmaster.is_some() {
            // Paused or not: SIGCONT to a running process does nothing.
            let _ = self.resume();
            // Immediate: nothing is kept, and the server removes its shared
            // memory as it exits.
            if self.pg_ctl_stop("immediate").is_err() {
                self.kill_everything();
            }
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Polls `done` until it holds or [`SIGNAL_TIMEOUT`] passes: whether it held.
fn wait_until(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + SIGNAL_TIMEOUT;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `command` (its stdout and stderr piped), killing it after `timeout`.
fn output_within(mut command: Command, timeout: Duration) -> Result<Output> {
    let child = command
        .spawn()
        .map_err(|e| Error::new(format!("could not start it: {e}")))?;
    let pid = child.id();
    let (send, receive) = mpsc::channel();
    thread::spawn(move || {
        let _ = send.send(child.wait_with_output());
    });
    match receive.recv_timeout(timeout) {
        Ok(output) => output.map_err(|e| Error::new(e.to_string())),
        Err(_) => {
            let _ = sys::signal(pid, Signal::Kill);
            Err(Error::new(format!(
                "no answer within {} s (killed)",
                timeout.as_secs()
            )))
        }
    }
}

/// Standard output, then standard error.
fn printed(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
