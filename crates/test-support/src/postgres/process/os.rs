//! The server's processes as the system sees them: who runs the server
//! programs (as root, the `postgres` user), signals, and `/proc`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::super::POSTGRES_SYSTEM_USER;
use crate::backend::{find_on_path, is_executable};
use crate::error::{Error, Result};

/// Who runs `initdb` and `pg_ctl`: this process's user, or (as root) the
/// `postgres` system user.
#[derive(Clone, Debug)]
pub(super) enum RunAs {
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
pub(super) enum Switch {
    Runuser(PathBuf),
    Su(PathBuf),
}

impl RunAs {
    /// Found once per process.
    pub(super) fn for_this_process() -> Result<Self> {
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
    pub(super) fn command(&self, program: &Path) -> Command {
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
    pub(super) fn give(&self, dir: &Path) -> Result<()> {
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
pub(super) enum Signal {
    Stop,
    Cont,
    Kill,
}

#[cfg(unix)]
pub(super) mod sys {
    use std::path::Path;

    use super::Signal;
    use crate::error::{Error, Result};

    pub(crate) fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    pub(crate) fn chown(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))
    }

    /// Makes this process the reaper of its orphaned descendants (Linux's
    /// `PR_SET_CHILD_SUBREAPER`), once: the postmaster (orphaned by
    /// `pg_ctl`) and its backends (orphaned by a kill) become its children,
    /// which [`reap`] collects, instead of init's, which in some containers
    /// leaves them zombies for ever. Elsewhere nothing.
    pub(crate) fn adopt_orphans() {
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
    pub(crate) fn reap(pid: u32) {
        use rustix::process::{Pid, WaitOptions, waitpid};
        if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
            let _ = waitpid(Some(pid), WaitOptions::NOHANG);
        }
    }

    pub(crate) fn signal(pid: u32, signal: Signal) -> Result<()> {
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
pub(super) mod sys {
    use std::path::Path;

    use super::Signal;
    use crate::error::{Error, Result};

    pub(crate) fn is_root() -> bool {
        false
    }

    pub(crate) fn chown(
        _dir: &Path,
        _uid: u32,
        _gid: u32,
    ) -> std::io::Result<()> {
        Ok(())
    }

    pub(crate) fn adopt_orphans() {}

    pub(crate) fn reap(_pid: u32) {}

    pub(crate) fn signal(_pid: u32, _signal: Signal) -> Result<()> {
        Err(Error::new("a PostgresServer needs Unix signals"))
    }
}

/// The postmaster's pid: the first line of `postmaster.pid`.
pub(super) fn read_postmaster_pid(data_dir: &Path) -> Option<u32> {
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
pub(super) fn is_postgres(pid: u32) -> bool {
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
pub(super) fn is_alive(pid: u32) -> bool {
    sys::reap(pid);
    proc_stat(pid).is_some_and(|(state, _)| !matches!(state, 'Z' | 'X' | 'x'))
}

/// Stopped by a signal (or gone: nothing left to stop).
pub(super) fn is_stopped(pid: u32) -> bool {
    proc_stat(pid)
        .is_none_or(|(state, _)| matches!(state, 'T' | 't' | 'Z' | 'X' | 'x'))
}

/// Every live descendant of `root` (children, their children, ...).
pub(super) fn descendants(root: u32) -> Vec<u32> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_stat_line_is_read_whatever_the_name() {
        let (state, ppid) = proc_stat(std::process::id()).unwrap();
        assert!(state.is_ascii_alphabetic());
        assert!(ppid > 0);
        assert!(is_alive(std::process::id()));
        assert!(!is_stopped(std::process::id()));
    }
}
