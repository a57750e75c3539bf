//! The Docker backend: `redis-server` in a container of the image, through
//! testcontainers' synchronous API, on the host's network (the container's
//! ports are loopback ports, as for a process).
//!
//! testcontainers' synchronous calls block on a runtime of their own and
//! panic when made from inside a Tokio runtime (a `#[tokio::test]`), and so
//! does dropping a container there. Every call is therefore made on a
//! short-lived thread of its own ([`off_runtime`]).

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use testcontainers::core::{CmdWaitFor, ExecCommand};
use testcontainers::runners::SyncRunner;
use testcontainers::{Container, GenericImage, ImageExt};

use crate::backend::Image;
use crate::error::{Error, Result};

pub(crate) struct DockerNode {
    image: Image,
    container: Option<Container<GenericImage>>,
}

impl DockerNode {
    /// Creates and starts a container running `redis-server` with `args`
    /// (which name the port). The image is pulled if the engine lacks it.
    pub(crate) fn launch(
        image: &Image,
        port: u16,
        args: Vec<String>,
    ) -> Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("trt-redis-{port}-{}-{nanos:x}", std::process::id());
        let mut cmd = vec!["redis-server".to_owned()];
        cmd.extend(args);
        // No wait condition: the caller waits for PING, as for a process
        // (the ready line changed between Redis versions).
        let request = GenericImage::new(image.name(), image.tag())
            .with_network("host")
            .with_container_name(name)
            .with_cmd(cmd);
        let container = off_runtime(move || request.start()).map_err(|e| {
            Error::new(format!(
                "could not start a container of {image}: {e}\n\
                 (Is the image there? `docker image inspect {image}`. On a machine that \
                 cannot pull images, build it from the local redis-server with \
                 `cargo xtask redis-image`.)"
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

    fn short_id(&self) -> &str {
        let id = self.container().id();
        &id[..id.len().min(12)]
    }

    /// Stops the container at once (`docker stop -t 0`: SIGKILL right after
    /// the stop signal, no time to shut down). It is kept, with its data
    /// (`nodes.conf`), for a restart.
    pub(crate) fn kill(&mut self) -> Result<()> {
        let container = self.container();
        off_runtime(|| container.stop_with_timeout(Some(0))).map_err(|e| {
            Error::new(format!(
                "could not kill container {}: {e}",
                self.short_id()
            ))
        })
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

    /// Runs `redis-cli` with `args` inside the container; its standard output.
    pub(crate) fn cli(&self, args: &[String]) -> Result<String> {
        let container = self.container();
        let mut cmd = vec!["redis-cli".to_owned()];
        cmd.extend_from_slice(args);
        let shown = cmd.join(" ");
        let exec =
            ExecCommand::new(cmd).with_cmd_ready_condition(CmdWaitFor::exit());
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
