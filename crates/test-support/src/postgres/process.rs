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
use std::sync::OnceLock;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::{
    Cluster, POSTGRES_SUPERUSER, POSTGRES_SYSTEM_USER, PSQL_TIMEOUT, SETTINGS,
    START_TIMEOUT, addr, answers, psql_args,
};
use crate::backend::{find_on_path, is_executable};
use crate::env::new_temp_dir;
use crate::error::{Error, Result};

/// The directory that holds `initdb`, `pg_ctl` and `postgres` (default: found
/// on `PATH`, else the newest `/usr/lib/postgresql/<version>/bin`).
pub const POSTGRES_BIN_DIR_VAR: &str = "TRT_POSTGRES_BIN_DIR";

/// Where Debian and Ubuntu install each major version's server binaries.
const DEBIAN_LIB_DIR: &str = "/usr/lib/postgresql";
/// The server binaries that must all be in one directory.
const SERVER_PROGRAMS: [&str; 3] = ["initdb", "pg_ctl", "postgres"];
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

/// The directory of the PostgreSQL server binaries (`initdb`, `pg_ctl` and
/// `postgres`, together), found once per process:
///
/// 1. `TRT_POSTGRES_BIN_DIR`, if set (an error if they are not all there);
/// 2. the directory of `initdb` on `PATH` (where a symbolic link leads, or
///    the `PATH` directory itself);
/// 3. the newest `/usr/lib/postgresql/<version>/bin` (Debian, Ubuntu);
/// 4. otherwise an error that says what to install.
pub fn find_postgres_bin_dir() -> Result<PathBuf> {
    static FOUND: OnceLock<Result<PathBuf>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            find_bin_dir(
                std::env::var_os(POSTGRES_BIN_DIR_VAR)
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from),
                std::env::var_os("PATH"),
                Path::new(DEBIAN_LIB_DIR),
            )
        })
        .clone()
}

fn find_bin_dir(
    explicit: Option<PathBuf>,
    path: Option<std::ffi::OsString>,
    lib_dir: &Path,
) -> Result<PathBuf> {
    let complete = |dir: &Path| {
        SERVER_PROGRAMS.iter().all(|p| is_executable(&dir.join(p)))
    };
    if let Some(dir) = explicit {
        return if complete(&dir) {
            Ok(dir)
        } else {
            Err(Error::new(format!(
                "{POSTGRES_BIN_DIR_VAR}={} does not hold the PostgreSQL server binaries \
                 ({}, each an executable file)",
                dir.display(),
                SERVER_PROGRAMS.join(", ")
            )))
        };
    }
    let on_path = path
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("initdb"))
        .find(|initdb| is_executable(initdb));
    if let Some(initdb) = on_path {
        let candidates = [
            fs::canonicalize(&initdb)
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf)),
            initdb.parent().map(Path::to_path_buf),
        ];
        if let Some(dir) =
            candidates.into_iter().flatten().find(|d| complete(d))
        {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(Vec<u32>, PathBuf)> = fs::read_dir(lib_dir)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry
                .file_name()
                .to_str()?
                .split('.')
                .map(str::parse)
                .collect::<std::result::Result<Vec<u32>, _>>()
                .ok()?;
            let bin = entry.path().join("bin");
            complete(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, newest)) = versions.pop() {
        return Ok(newest);
    }
    Err(Error::new(format!(
        "no PostgreSQL server binaries for the tests: `initdb`, `pg_ctl` and `postgres` are \
         not on PATH nor in {}/<version>/bin, and {POSTGRES_BIN_DIR_VAR} is not set.\n\
         Install them: `apt-get install -y postgresql` (Debian/Ubuntu; any major version), \
         `brew install postgresql` (macOS); or set {POSTGRES_BIN_DIR_VAR} to the directory \
         that holds them.",
        lib_dir.display()
    )))
}

/// Who runs `initdb` and `pg_ctl`: this process's user, or (as root) the
/// `postgres` system user.
#[derive(Clone, Debug)]
enum RunAs {
    Me,
    User {
        name: &'static str,
        uid: u32,
        gid: u32,
        /// `runuser` (util-linux), else `su`.
        switch: Switch,
    },
}

#[derive(Clone, Debug)]
enum Switch {
    Runuser(PathBuf),
    Su(PathBuf),
}

impl RunAs {
    /// Found once per process.
    fn for_this_process() -> Result<Self> {
        static CHOSEN: OnceLock<Result<RunAs>> = OnceLock::new();
        CHOSEN.get_or_init(Self::choose).clone()
    }

    fn choose() -> Result<Self> {
        if !sys::is_root() {
            return Ok(Self::Me);
        }
        let name = POSTGRES_SYSTEM_USER;
        let id = |flag: &str| -> Option<u32> {
            let output = Command::new("id")
                .args([flag, name])
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .ok()?;
            if !output.status.success() {
                return None;
            }
            String::from_utf8_lossy(&output.stdout).trim().parse().ok()
        };
        let (Some(uid), Some(gid)) = (id("-u"), id("-g")) else {
            return Err(Error::new(format!(
                "this process runs as root, and PostgreSQL refuses to run as root: the tests \
                 run it as the `{name}` system user, but there is no such user here. Debian's \
                 `postgresql` package creates it (`apt-get install -y postgresql`); or run \
                 the tests as a user other than root."
            )));
        };
        let sbin = |program: &str| {
            find_on_path(program).or_else(|| {
                ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
                    .iter()
                    .map(|dir| Path::new(dir).join(program))
                    .find(|p| is_executable(p))
            })
        };
        let switch = match (sbin("runuser"), sbin("su")) {
            (Some(runuser), _) => Switch::Runuser(runuser),
            (None, Some(su)) => Switch::Su(su),
            (None, None) => {
                return Err(Error::new(format!(
                    "this process runs as root, and PostgreSQL refuses to run as root: the \
                     tests run it as the `{name}` user through `runuser` or `su`, and neither \
                     is installed (`apt-get install -y util-linux`)"
                )));
            }
        };
        Ok(Self::User {
            name,
            uid,
            gid,
            switch,
        })
    }

    /// `program`, to run as this user.
    fn command(&self, program: &Path) -> Command {
        match self {
            Self::Me => Command::new(program),
            Self::User {
                name,
                switch: Switch::Runuser(runuser),
                ..
            } => {
                let mut command = Command::new(runuser);
                command.args(["-u", name, "--"]).arg(program);
                command
            }
            Self::User {
                name,
                switch: Switch::Su(su),
                ..
            } => {
                // The arguments after the user go to the shell: "$0" "$@".
                let mut command = Command::new(su);
                command
                    .args(["-s", "/bin/sh", "-c", r#"exec "$0" "$@""#, name])
                    .arg(program);
                command
            }
        }
    }

    /// Makes `dir` this user's.
    fn give(&self, dir: &Path) -> Result<()> {
        match self {
            Self::Me => Ok(()),
            Self::User { name, uid, gid, .. } => sys::chown(dir, *uid, *gid)
                .map_err(|e| {
                    Error::new(format!(
                        "could not give {} to the `{name}` user (chown): {e}",
                        dir.display()
                    ))
                }),
        }
    }
}

#[derive(Clone, Copy)]
enum Signal {
    Stop,
    Cont,
    Kill,
}

#[cfg(unix)]
mod sys {
    use std::path::Path;

    use super::Signal;
    use crate::error::{Error, Result};

    pub(super) fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    pub(super) fn chown(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))
    }

    /// Makes this process the reaper of its orphaned descendants (Linux's
    /// `PR_SET_CHILD_SUBREAPER`), once: the postmaster (orphaned by
    /// `pg_ctl`) and its backends (orphaned by a kill) become its children,
    /// which [`reap`] collects, instead of init's, which in some containers
    /// leaves them zombies for ever. Elsewhere nothing.
    pub(super) fn adopt_orphans() {
        #[cfg(target_os = "linux")]
        {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                let me = rustix::process::getpid();
                let _ = rustix::process::set_child_subreaper(Some(me));
            });
        }
    }

    /// Collects `pid` if it is a child of this process that has exited.
    pub(super) fn reap(pid: u32) {
        use rustix::process::{Pid, WaitOptions, waitpid};
        if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
            let _ = waitpid(Some(pid), WaitOptions::NOHANG);
        }
    }

    pub(super) fn signal(pid: u32, signal: Signal) -> Result<()> {
        use rustix::process::{Pid, Signal as S, kill_process};
        let (sig, name) = match signal {
            Signal::Stop => (S::STOP, "SIGSTOP"),
            Signal::Cont => (S::CONT, "SIGCONT"),
            Signal::Kill => (S::KILL, "SIGKILL"),
        };
        let target = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| Error::new(format!("{pid} is not a process id")))?;
        kill_process(target, sig).map_err(|e| {
            Error::new(format!("could not send {name} to process {pid}: {e}"))
        })
    }
}

#[cfg(not(unix))]
mod sys {
    use std::path::Path;

    use super::Signal;
    use crate::error::{Error, Result};

    pub(super) fn is_root() -> bool {
        false
    }

    pub(super) fn chown(
        _dir: &Path,
        _uid: u32,
        _gid: u32,
    ) -> std::io::Result<()> {
        Ok(())
    }

    pub(super) fn adopt_orphans() {}

    pub(super) fn reap(_pid: u32) {}

    pub(super) fn signal(_pid: u32, _signal: Signal) -> Result<()> {
        Err(Error::new("a PostgresServer needs Unix signals"))
    }
}

/// The postmaster's pid: the first line of `postmaster.pid`.
fn read_postmaster_pid(data_dir: &Path) -> Option<u32> {
    fs::read_to_string(data_dir.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Whether process `pid` runs `postgres` (not a process that took the pid
/// of a dead server).
fn is_postgres(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|comm| comm.trim_end().starts_with("postgres"))
}

/// A process's state letter and parent, from `/proc/<pid>/stat`.
fn proc_stat(pid: u32) -> Option<(char, u32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "<pid> (<comm>) <state> <ppid> ...": the name may hold anything.
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Alive: present, and not a zombie (a dead process no one has reaped).
/// Reaps it first if it is a dead child of this process.
fn is_alive(pid: u32) -> bool {
    sys::reap(pid);
    proc_stat(pid).is_some_and(|(state, _)| !matches!(state, 'Z' | 'X' | 'x'))
}

/// Stopped by a signal (or gone: nothing left to stop).
fn is_stopped(pid: u32) -> bool {
    proc_stat(pid)
        .is_none_or(|(state, _)| matches!(state, 'T' | 't' | 'Z' | 'X' | 'x'))
}

/// Every live descendant of `root` (children, their children, ...).
fn descendants(root: u32) -> Vec<u32> {
    let processes: Vec<(u32, u32)> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let (state, ppid) = proc_stat(pid)?;
            (!matches!(state, 'Z' | 'X' | 'x')).then_some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        next += 1;
        found.extend(
            processes
                .iter()
                .filter(|&&(_, ppid)| ppid == parent)
                .map(|&(pid, _)| pid),
        );
    }
    found.remove(0);
    found
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_binaries_is_an_error_that_says_what_to_install() {
        let e = find_bin_dir(
            None,
            Some("".into()),
            Path::new("/nonexistent/postgresql"),
        )
        .unwrap_err();
        assert!(e.message().contains("apt-get install -y postgresql"), "{e}");
        assert!(e.message().contains(POSTGRES_BIN_DIR_VAR), "{e}");
    }

    #[test]
    fn an_explicit_directory_without_the_binaries_is_an_error() {
        let e = find_bin_dir(
            Some("/nonexistent/bin".into()),
            std::env::var_os("PATH"),
            Path::new(DEBIAN_LIB_DIR),
        )
        .unwrap_err();
        assert!(e.message().contains("/nonexistent/bin"), "{e}");
        assert!(e.message().contains("initdb, pg_ctl, postgres"), "{e}");
    }

    #[test]
    fn the_newest_debian_version_is_chosen() {
        let root = std::env::temp_dir().join(crate::unique("trt-pg-lib"));
        for version in ["9.6", "15", "13", "not-a-version"] {
            let bin = root.join(version).join("bin");
            fs::create_dir_all(&bin).unwrap();
            for program in SERVER_PROGRAMS {
                let path = bin.join(program);
                fs::write(&path, "#!/bin/sh\n").unwrap();
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    fs::set_permissions(
                        &path,
                        fs::Permissions::from_mode(0o755),
                    )
                    .unwrap();
                }
            }
        }
        let found = find_bin_dir(None, Some("".into()), &root);
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(found.unwrap(), root.join("15").join("bin"));
    }

    #[test]
    fn a_process_stat_line_is_read_whatever_the_name() {
        let (state, ppid) = proc_stat(std::process::id()).unwrap();
        assert!(state.is_ascii_alphabetic());
        assert!(ppid > 0);
        assert!(is_alive(std::process::id()));
        assert!(!is_stopped(std::process::id()));
    }
}
