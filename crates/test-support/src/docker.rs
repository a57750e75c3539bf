//! The Docker backend: a test server in a container of an image, through
//! testcontainers' synchronous API, on the host's network (the container's
//! ports are loopback ports, as for a process). Redis's servers and
//! PostgreSQL's run in these alike ([`DockerNode`]).
//!
//! testcontainers' synchronous calls block on a runtime of their own and
//! panic when made from inside a Tokio runtime (a `#[tokio::test]`), and so
//! does dropping a container there. Every call is therefore made on a
//! short-lived thread of its own ([`off_runtime`]).

use std::future::Future;
use std::path::Path;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use testcontainers::core::{CmdWaitFor, ExecCommand};
use testcontainers::runners::SyncRunner;
use testcontainers::{Container, CopyTargetOptions, GenericImage, ImageExt};

use crate::backend::{Image, engine_request};
use crate::error::{Error, Result};

/// How long a killed container has to be reported stopped.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);

/// One container, removed (`docker rm -f -v`) when dropped.
pub(crate) struct DockerNode {
    image: Image,
    container: Option<Container<GenericImage>>,
}

/// What [`DockerNode::launch`] starts.
pub(crate) struct Launch<'a> {
    pub(crate) image: &'a Image,
    /// The start of the container's name (`trt-redis-<port>`): the pid and
    /// a clock reading follow.
    pub(crate) name: String,
    /// The command, program first (`redis-server --port ...`), given to the
    /// image's entrypoint.
    pub(crate) cmd: Vec<String>,
    /// The container's environment.
    pub(crate) env: &'a [(&'a str, &'a str)],
    /// Files copied into the container before it starts: its path, and the
    /// file on this machine (mode 0755).
    pub(crate) files: &'a [(&'a str, &'a Path)],
    /// How to get the image where it cannot be pulled (`cargo xtask
    /// redis-image`), for the error.
    pub(crate) local_build: &'a str,
}

impl DockerNode {
    /// Creates and starts a container. The image is pulled if the engine
    /// lacks it. No wait condition: the caller waits until its server
    /// answers, as for a process.
    pub(crate) fn launch(launch: Launch<'_>) -> Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let image = launch.image;
        let mut request = GenericImage::new(image.name(), image.tag())
            .with_network("host")
            .with_container_name(format!(
                "{}-{}-{nanos:x}",
                launch.name,
                std::process::id()
            ))
            .with_cmd(launch.cmd);
        for &(key, value) in launch.env {
            request = request.with_env_var(key, value);
        }
        for &(target, source) in launch.files {
            request = request.with_copy_to(
                CopyTargetOptions::new(target).with_mode(0o755),
                source,
            );
        }
        let container = off_runtime(move || request.start()).map_err(|e| {
            Error::new(format!(
                "could not start a container of {image}: {e}\n\
                 (Is the image there? `docker image inspect {image}`. On a machine that \
                 cannot pull images, {}.)",
                launch.local_build
            ))
        })?;
        Ok(Self {
            image: image.clone(),
            container: Some(container),
        })
    }

    fn container(&self) -> &Container<GenericImage> {
        self.container
            .as_ref()
            .expect("the container lives as long as its node")
    }

    /// The first 12 digits of its id, as `docker ps` shows it.
    pub(crate) fn short_id(&self) -> &str {
        let id = self.container().id();
        &id[..id.len().min(12)]
    }

    /// Kills it at once, paused or not: SIGKILL from the engine (`docker
    /// kill`), so no signal handler runs; where this crate cannot speak to
    /// the engine itself (DOCKER_HOST over TLS or SSH), `docker stop -t 0`
    /// (the image's stop signal, then SIGKILL right after). Returns once the
    /// container is stopped. It is kept, with its files (Redis's
    /// `nodes.conf`, PostgreSQL's data directory), for a relaunch.
    pub(crate) fn kill(&mut self) -> Result<()> {
        let container = self.container();
        let killed = engine_request(&format!(
            "POST /containers/{}/kill?signal=KILL",
            container.id()
        ));
        if let Err(why) = killed {
            off_runtime(|| container.stop_with_timeout(Some(0))).map_err(|e| {
                Error::new(format!(
                    "could not kill container {} ({why}; then `docker stop -t 0`: {e})",
                    self.short_id()
                ))
            })?;
        }
        let deadline = Instant::now() + KILL_TIMEOUT;
        while off_runtime(|| container.is_running()).unwrap_or(false) {
            if Instant::now() >= deadline {
                return Err(Error::new(format!(
                    "container {} still runs {} s after SIGKILL",
                    self.short_id(),
                    KILL_TIMEOUT.as_secs()
                )));
            }
            thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Stops it cleanly: `docker stop` (the image's stop signal; SIGKILL
    /// after `timeout`), and returns once it is stopped. Kept, as by
    /// [`kill`](Self::kill).
    pub(crate) fn stop(&mut self, timeout: Duration) -> Result<()> {
        let container = self.container();
        let seconds = i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX);
        off_runtime(|| container.stop_with_timeout(Some(seconds))).map_err(
            |e| {
                Error::new(format!(
                    "could not stop container {}: {e}",
                    self.short_id()
                ))
            },
        )
    }

    pub(crate) fn relaunch(&mut self) -> Result<()> {
        let container = self.container();
        off_runtime(|| container.start()).map_err(|e| {
            Error::new(format!(
                "could not start container {} again: {e}",
                self.short_id()
            ))
        })
    }

    /// `docker pause`: its processes are frozen; the kernel still accepts
    /// connections and data for it, and it answers nothing.
    pub(crate) fn pause(&self) -> Result<()> {
        let container = self.container();
        off_runtime(|| poll_to_end(container.pause())).map_err(|e| {
            Error::new(format!(
                "could not pause container {}: {e}",
                self.short_id()
            ))
        })
    }

    /// `docker unpause`.
    pub(crate) fn resume(&self) -> Result<()> {
        let container = self.container();
        off_runtime(|| poll_to_end(container.unpause())).map_err(|e| {
            Error::new(format!(
                "could not unpause container {}: {e}",
                self.short_id()
            ))
        })
    }

    /// How it ended, if it is no longer running.
    pub(crate) fn exited(&mut self) -> Option<String> {
        let container = self.container();
        match off_runtime(|| {
            container.is_running().map(|running| (running, container))
        }) {
            Ok((true, _)) => None,
            Ok((false, container)) => {
                Some(match off_runtime(|| container.exit_code()) {
                    Ok(Some(code)) => {
                        format!("container exited with code {code}")
                    }
                    _ => "container not running".to_owned(),
                })
            }
            Err(e) => Some(format!("container state unknown: {e}")),
        }
    }

    /// What the container printed (every run: Docker keeps the log of a
    /// restarted container).
    pub(crate) fn logs(&self) -> String {
        let container = self.container();
        let (stdout, stderr) = off_runtime(|| {
            (container.stdout_to_vec(), container.stderr_to_vec())
        });
        let mut logs =
            String::from_utf8_lossy(&stdout.unwrap_or_default()).into_owned();
        logs.push_str(&String::from_utf8_lossy(&stderr.unwrap_or_default()));
        logs
    }

    /// Runs `cmd` (program first) inside the container, with `env` added to
    /// its environment (`docker exec`); its standard output.
    pub(crate) fn exec(
        &self,
        cmd: Vec<String>,
        env: &[(&str, &str)],
    ) -> Result<String> {
        let container = self.container();
        let shown = cmd.join(" ");
        let exec = ExecCommand::new(cmd)
            .with_env_vars(env.iter().copied())
            .with_cmd_ready_condition(CmdWaitFor::exit());
        let result = off_runtime(|| {
            let mut result = container.exec(exec)?;
            let stdout = result.stdout_to_vec()?;
            let stderr = result.stderr_to_vec()?;
            Ok::<_, testcontainers::TestcontainersError>((
                result.exit_code()?,
                stdout,
                stderr,
            ))
        });
        let (code, stdout, stderr) = result.map_err(|e| {
            Error::new(format!(
                "could not run `{shown}` in container {}: {e}",
                self.short_id()
            ))
        })?;
        let stdout = String::from_utf8_lossy(&stdout).into_owned();
        if code == Some(0) {
            Ok(stdout)
        } else {
            Err(Error::new(format!(
                "`{shown}` in container {} ({}) failed (exit code {code:?}):\n{stdout}{}",
                self.short_id(),
                self.image,
                String::from_utf8_lossy(&stderr)
            )))
        }
    }
}

impl Drop for DockerNode {
    fn drop(&mut self) {
        if let Some(container) = self.container.take() {
            // A paused container is unpaused first: removing it is then a
            // plain forced removal.
            let _ = off_runtime(|| poll_to_end(container.unpause()));
            // testcontainers removes it (`docker rm -f -v`) when dropped.
            off_runtime(move || drop(container));
        }
    }
}

/// Runs `f` on a new thread, outside any Tokio runtime, and returns its
/// result (a panic in `f` is resumed here).
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    thread::scope(|scope| match scope.spawn(f).join() {
        Ok(value) => value,
        Err(panic) => std::panic::resume_unwind(panic),
    })
}

/// Drives a future to its end on this thread, without a runtime.
/// testcontainers' synchronous `pause`/`unpause` are `async fn`s that block
/// inside (on testcontainers' own runtime) and are ready at their first poll.
fn poll_to_end<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut context = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        thread::sleep(Duration::from_millis(1));
    }
}
