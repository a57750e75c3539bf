//! Reloading the config when its files change.
//!
//! The watch is on **directories**, never on the files: an editor's save or
//! a Kubernetes ConfigMap update replaces a file by renaming another over
//! it, and a watch on the old file would see nothing after that. For a
//! file, its directory is watched; for a directory, the directory
//! recursively (and its parent too when it is a symbolic link, so that a
//! swap of the link is seen). Any event schedules a reload after a quiet
//! period (`debounce`), and at the latest [`MOST_WAITS`] debounces after the
//! first event, so that a steady stream of events (a log written beside
//! the config) neither starves the reload nor hides a shutdown; events
//! coalesce, so no queue grows with them. A slow periodic rescan catches
//! what events miss
//! (network file systems, overflowed queues). A reload reads every file
//! again and installs the new config only if it is valid and differs from
//! the one in use; an invalid one is logged and counted (`error`), and the
//! old config stays. So does the old config when the path holds no config
//! file (a deploy between removing the files and writing the new ones),
//! counted as `kept_empty`: only a file that says so (a `domain` with no
//! `descriptors`) empties the rules.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A reload waits for a quiet period of one debounce, but never more than
/// this many debounces after the event that started the wait.
pub(crate) const MOST_WAITS: u32 = 10;

use crate::config::Config;
use crate::decide::Decider;
use crate::status::Reload;

/// Loads `path` again and installs it if valid and changed. Returns whether
/// the config in use changed.
pub(crate) async fn reload(path: &Path, decider: &Decider) -> bool {
    let owned = path.to_owned();
    let loaded =
        match tokio::task::spawn_blocking(move || Config::load(owned)).await {
            Ok(loaded) => loaded,
            Err(error) => {
                tracing::error!(%error, "config reload task failed");
                return false;
            }
        };
    match loaded {
        Ok(config) => {
            if config.fingerprint() == decider.config().fingerprint() {
                return false;
            }
            for warning in config.warnings() {
                tracing::warn!(%warning, "config");
            }
            let (domains, rules) =
                (config.domains().count(), config.rule_count());
            decider.install(config);
            tracing::info!(domains, rules, "config reloaded");
            true
        }
        Err(error) if error.is_no_file() => {
            decider.metrics().config_kept_empty();
            decider
                .status()
                .reloaded(Reload::refused("kept_empty", error.to_string()));
            tracing::warn!(%error, "no rule found: the config in use stays");
            false
        }
        Err(error) => {
            decider.metrics().config_loaded(false, 0);
            decider
                .status()
                .reloaded(Reload::refused("error", error.to_string()));
            tracing::error!(%error, "invalid config: the previous one stays in use");
            false
        }
    }
}

/// Starts watching `path`: the returned task reloads on change until
/// `shutdown` turns true. The watcher lives in the task.
pub(crate) fn spawn(
    path: PathBuf,
    decider: Arc<Decider>,
    debounce: Duration,
    rescan: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, notify::Error> {
    // One pending wake-up, however many events: nothing queues.
    let changed = Arc::new(Notify::new());
    let notify = changed.clone();
    let mut watcher = notify::recommended_watcher(
        move |event: notify::Result<notify::Event>| {
            // Errors (a queue overflow) also call for a rescan.
            let _ = event;
            notify.notify_one();
        },
    )?;
    let is_dir = std::fs::metadata(&path)
        .map(|m| m.is_dir())
        .unwrap_or(false);
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    if is_dir {
        watcher.watch(&path, RecursiveMode::Recursive)?;
        let is_link = std::fs::symlink_metadata(&path)
            .map(|m| m.is_symlink())
            .unwrap_or(false);
        if is_link {
            watcher.watch(&parent, RecursiveMode::NonRecursive)?;
        }
    } else {
        watcher.watch(&parent, RecursiveMode::NonRecursive)?;
    }
    Ok(tokio::spawn(async move {
        let _watcher = watcher;
        let mut every = tokio::time::interval(rescan);
        every.tick().await;
        let stopped = |shutdown: &mut watch::Receiver<bool>| {
            let mut shutdown = shutdown.clone();
            async move {
                let _ = shutdown.wait_for(|stop| *stop).await;
            }
        };
        loop {
            tokio::select! {
                biased;
                () = stopped(&mut shutdown) => break,
                () = changed.notified() => {
                    // Quiet period: an update is often several events; a
                    // stream of them waits MOST_WAITS debounces at most.
                    let latest = Instant::now() + debounce * MOST_WAITS;
                    loop {
                        tokio::select! {
                            biased;
                            () = stopped(&mut shutdown) => return,
                            () = tokio::time::sleep(debounce) => break,
                            () = tokio::time::sleep_until(latest) => break,
                            () = changed.notified() => {}
                        }
                    }
                    reload(&path, &decider).await;
                }
                _ = every.tick() => {
                    reload(&path, &decider).await;
                }
            }
        }
    }))
}
