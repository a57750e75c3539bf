//! The process backend: `redis-server` as a child of this process, with a
//! temporary directory of its own (its log, and `nodes.conf` for a cluster
//! node), removed when it is dropped.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::env::new_temp_dir;
use crate::error::{Error, Result};

const LOG: &str = "redis.log";

pub(crate) struct ProcessNode {
    server: PathBuf,
    cli: Option<PathBuf>,
    /// The server's arguments after `redis-server`.
    args: Vec<String>,
    /// Added to its environment (at every start).
    env: Vec<(String, String)>,
    dir: PathBuf,
    child: Option<Child>,
}

impl ProcessNode {
    /// Starts `server` with `args` (which name the port) and `env` added to
    /// its environment, in a new directory.
    pub(crate) fn launch(
        server: &Path,
        cli: Option<&Path>,
        port: u16,
        args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Result<Self> {
        let dir = new_temp_dir(&format!("trt-redis-{port}"))?;
        let mut node = Self {
            server: server.to_path_buf(),
            cli: cli.map(Path::to_path_buf),
            args,
            env,
            dir,
            child: None,
        };
        node.spawn()?;
        Ok(node)
    }

    fn spawn(&mut self) -> Result<()> {
        // Appended: a restarted server's log follows the earlier run's.
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join(LOG))
            .and_then(|log| Ok((log.try_clone()?, log)))
            .map_err(|e| {
                Error::new(format!(
                    "could not open a log file in {}: {e}",
                    self.dir.display()
                ))
            })?;
        let child = Command::new(&self.server)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg("--dir")
            .arg(&self.dir)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.0)
            .stderr(log.1)
            .spawn()
            .map_err(|e| {
                Error::new(format!(
                    "could not start {}: {e}",
                    self.server.display()
                ))
            })?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL, then reaps it.
    pub(crate) fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().and_then(|()| child.wait().map(drop)).map_err(
                |e| Error::new(format!("could not kill redis-server: {e}")),
            )?;
        }
        Ok(())
    }

    pub(crate) fn relaunch(&mut self) -> Result<()> {
        self.spawn()
    }

    #[cfg(unix)]
    fn signal(
        &self,
        signal: rustix::process::Signal,
        what: &str,
    ) -> Result<()> {
        let child = self.child.as_ref().ok_or_else(|| {
            Error::new(format!("cannot {what} redis-server: it is not running"))
        })?;
        rustix::process::kill_process(
            rustix::process::Pid::from_child(child),
            signal,
        )
        .map_err(|e| Error::new(format!("could not {what} redis-server: {e}")))
    }

    /// SIGSTOP: the kernel still accepts connections and data for it, and it
    /// answers nothing.
    pub(crate) fn pause(&self) -> Result<()> {
        #[cfg(unix)]
        return self.signal(rustix::process::Signal::STOP, "pause (SIGSTOP)");
        #[cfg(not(unix))]
        Err(Error::new(
            "pausing a redis-server process needs SIGSTOP (unix)",
        ))
    }

    /// SIGCONT.
    pub(crate) fn resume(&self) -> Result<()> {
        #[cfg(unix)]
        return self.signal(rustix::process::Signal::CONT, "resume (SIGCONT)");
        #[cfg(not(unix))]
        Err(Error::new(
            "resuming a redis-server process needs SIGCONT (unix)",
        ))
    }

    /// How it ended, if it is no longer running.
    pub(crate) fn exited(&mut self) -> Option<String> {
        match self.child.as_mut().map(Child::try_wait) {
            None => Some("not started".to_owned()),
            Some(Ok(Some(status))) => Some(status.to_string()),
            Some(Ok(None)) => None,
            Some(Err(e)) => Some(format!("unknown ({e})")),
        }
    }

    /// Everything it printed, every run.
    pub(crate) fn logs(&self) -> String {
        fs::read_to_string(self.dir.join(LOG)).unwrap_or_default()
    }

    /// Runs `redis-cli` with `args` on this machine; its standard output.
    pub(crate) fn cli(&self, args: &[String]) -> Result<String> {
        let cli = self.cli.as_ref().ok_or_else(|| {
            Error::new(
                "`redis-cli` is not on PATH (nor beside redis-server): it creates the test \
                 clusters. Install it (`apt-get install redis-tools` on Debian/Ubuntu)",
            )
        })?;
        let output = Command::new(cli)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| {
                Error::new(format!("could not run {}: {e}", cli.display()))
            })?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() {
            Ok(stdout)
        } else {
            Err(Error::new(format!(
                "`redis-cli {}` failed ({}):\n{stdout}{}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )))
        }
    }
}

impl Drop for ProcessNode {
    fn drop(&mut self) {
        // SIGKILL works on a stopped (paused) process too.
        let _ = self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}
