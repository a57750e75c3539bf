//! The tests' environment: where the servers that `cargo xtask` started are,
//! and names no other test uses.
//!
//! Without the variables the tests fail, never pass silently; a URL on port
//! 6379 (the machine's shared Redis) or 5432 (the machine's PostgreSQL) is
//! refused.

use std::fs;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::ports::SHARED_REDIS_PORT;
use crate::postgres::SHARED_POSTGRES_PORT;

/// The URL of the throwaway Redis of `cargo xtask test-redis` (and `test`).
pub const REDIS_URL_VAR: &str = "TRT_REDIS_URL";
/// The comma-separated node URLs of the throwaway Redis Cluster of
/// `cargo xtask test-cluster` (and `test`).
pub const CLUSTER_URLS_VAR: &str = "TRT_REDIS_CLUSTER_URLS";
/// The URL of the throwaway PostgreSQL of `cargo xtask test` (and
/// `test-redis`): `postgres://postgres@127.0.0.1:<port>/postgres`.
pub const POSTGRES_URL_VAR: &str = "TRT_POSTGRES_URL";

/// Generous: the shared-server tests are about sharing and atomicity, not
/// latency, and a loaded 2-core machine with 300 checks in flight can be
/// slow. Timeouts themselves are tested with small values.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The throwaway server's URL, from `TRT_REDIS_URL`.
///
/// # Panics
///
/// If it is unset (run `cargo xtask test-redis`), not a Redis URL, or on port
/// 6379.
pub fn redis_url() -> String {
    let url = match std::env::var(REDIS_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => url.trim().to_owned(),
        _ => panic!("{REDIS_URL_VAR} is not set: run `cargo xtask test-redis`"),
    };
    refuse_the_shared_redis(REDIS_URL_VAR, &url, "test-redis");
    url
}

/// The throwaway cluster's node URLs (at least `nodes` of them), from
/// `TRT_REDIS_CLUSTER_URLS`.
///
/// # Panics
///
/// If it is unset (run `cargo xtask test-cluster`), holds fewer than `nodes`
/// URLs, or one of them is not a Redis URL or is on port 6379.
pub fn cluster_urls(nodes: usize) -> Vec<String> {
    let urls = match std::env::var(CLUSTER_URLS_VAR) {
        Ok(urls) if !urls.trim().is_empty() => urls,
        _ => panic!(
            "{CLUSTER_URLS_VAR} is not set: run `cargo xtask test-cluster`"
        ),
    };
    let urls: Vec<String> = urls
        .split(',')
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(
        urls.len() >= nodes,
        "{CLUSTER_URLS_VAR}={urls:?}: these tests need {nodes} masters, as `cargo xtask \
         test-cluster` starts"
    );
    for url in &urls {
        refuse_the_shared_redis(CLUSTER_URLS_VAR, url, "test-cluster");
    }
    urls
}

/// The throwaway PostgreSQL's URL, from `TRT_POSTGRES_URL`.
///
/// # Panics
///
/// If it is unset (run `cargo xtask test`), not a PostgreSQL URL
/// (`postgres://` or `postgresql://`), or on port 5432 (or no port: 5432).
pub fn postgres_url() -> String {
    let url = match std::env::var(POSTGRES_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => url.trim().to_owned(),
        _ => panic!(
            "{POSTGRES_URL_VAR} is not set: run `cargo xtask test`, which starts a \
             throwaway PostgreSQL"
        ),
    };
    refuse_the_shared_postgres(&url);
    url
}

fn refuse_the_shared_postgres(url: &str) {
    let var = POSTGRES_URL_VAR;
    let ports = postgres_url_ports(url).unwrap_or_else(|| {
        panic!(
            "{var} holds {url:?}, not a PostgreSQL URL \
             (postgres://user@host:port/database)"
        )
    });
    if ports.contains(&SHARED_POSTGRES_PORT) {
        panic!(
            "{var} holds {url:?}, port 5432, the machine's PostgreSQL: these tests create \
             and drop tables; run `cargo xtask test` for a throwaway server"
        );
    }
}

/// The port of each host of a `postgres://` URL (5432 where none is
/// given); `None` if it is not one.
fn postgres_url_ports(url: &str) -> Option<Vec<u16>> {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))?;
    let authority = rest.split(['/', '?']).next()?;
    let hosts = authority.rsplit('@').next()?;
    hosts
        .split(',')
        .map(|host| {
            // `[::1]:5433`, `127.0.0.1:5433`, `localhost`.
            let port = match host.rsplit_once(']') {
                Some((_, after)) => after.strip_prefix(':'),
                None => host.rsplit_once(':').map(|(_, port)| port),
            };
            match port {
                None | Some("") => Some(SHARED_POSTGRES_PORT),
                Some(port) => port.parse().ok(),
            }
        })
        .collect()
}

fn refuse_the_shared_redis(var: &str, url: &str, task: &str) {
    let client = redis::Client::open(url).unwrap_or_else(|e| {
        panic!("{var} holds {url:?}, not a Redis URL: {e}")
    });
    if let redis::ConnectionAddr::Tcp(_, SHARED_REDIS_PORT)
    | redis::ConnectionAddr::TcpTls {
        port: SHARED_REDIS_PORT,
        ..
    } = client.get_connection_info().addr()
    {
        panic!(
            "{var} holds {url:?}, port 6379, the shared Redis: these tests write keys and \
             flush scripts; run `cargo xtask {task}` for a throwaway server"
        );
    }
}

/// A name no other test (or earlier run) uses: `<prefix>-<pid>-<nanos>-<n>`,
/// in `[A-Za-z0-9_.-]` if `prefix` is.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}-{}-{nanos:x}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A new empty directory for a server's files in the temporary directory,
/// named by [`unique`] (`<prefix>-<pid>-...`).
pub(crate) fn new_temp_dir(prefix: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(unique(prefix));
    // A leftover of an earlier process with the same pid is stale.
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(|e| {
        Error::new(format!("could not create {}: {e}", dir.display()))
    })?;
    Ok(dir)
}

/// `checks` concurrent tasks (`tokio::spawn`, so inside a runtime),
/// alternately through `a` and `b` (two "instances"), each running `check`
/// once: how many returned true.
///
/// # Panics
///
/// If a task panics.
pub async fn concurrent_passes<T, F, Fut>(
    a: T,
    b: T,
    checks: usize,
    check: F,
) -> usize
where
    T: Clone,
    F: Fn(T) -> Fut,
    Fut: Future<Output = bool> + Send + 'static,
{
    let tasks: Vec<_> = (0..checks)
        .map(|i| {
            let instance = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(check(instance))
        })
        .collect();
    let mut passed = 0;
    for task in tasks {
        if task.await.expect("a check task panicked") {
            passed += 1;
        }
    }
    passed
}

/// What [`hold_and_release`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// Takes that passed (each then held and released).
    pub passes: usize,
    /// Takes that were refused.
    pub refusals: usize,
    /// The most passes in flight at once: counted in right after a take
    /// passed, out right before its release, so never more than the slots
    /// the store really held at that moment.
    pub most_in_flight: usize,
}

impl Holding {
    /// Asserts that never more than `limit` were in flight, and that they
    /// raced: more passes than `limit` (slots came back and were taken
    /// again) and some refusals (the limit was reached).
    ///
    /// # Panics
    ///
    /// If not.
    #[track_caller]
    pub fn assert_never_above(&self, limit: usize) {
        assert!(self.most_in_flight <= limit, "above {limit}: {self:?}");
        assert!(
            self.passes > limit && self.refusals > 0,
            "no race: {self:?}"
        );
    }
}

/// `tasks` tasks (`tokio::spawn`, so inside a runtime), alternately
/// through `a` and `b` (two "instances"), each `rounds` times: `take(x,
/// id)` a slot under an id of its own (1, 2, ...), and if it passed, hold
/// it for `hold` (real time) and `release(x, id)` it. A refused task tries
/// again at once, in its next round.
///
/// # Panics
///
/// If a task panics.
pub async fn hold_and_release<T, Take, TakeFut, Release, ReleaseFut>(
    (a, b): (T, T),
    (tasks, rounds): (u64, u64),
    hold: Duration,
    take: Take,
    release: Release,
) -> Holding
where
    T: Clone + Send + 'static,
    Take: Fn(T, u64) -> TakeFut + Send + Sync + 'static,
    TakeFut: Future<Output = bool> + Send,
    Release: Fn(T, u64) -> ReleaseFut + Send + Sync + 'static,
    ReleaseFut: Future<Output = ()> + Send,
{
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    let calls = Arc::new((take, release));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let instance = if task % 2 == 0 { a.clone() } else { b.clone() };
            let (calls, in_flight, most) =
                (calls.clone(), in_flight.clone(), most.clone());
            tokio::spawn(async move {
                let (take, release) = &*calls;
                let mut passes = 0;
                for round in 0..rounds {
                    let id = task * rounds + round + 1;
                    if !take(instance.clone(), id).await {
                        continue;
                    }
                    passes += 1;
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(hold).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    release(instance.clone(), id).await;
                }
                passes
            })
        })
        .collect();
    let mut passes = 0;
    for handle in handles {
        passes += handle.await.expect("a slot task panicked");
    }
    let attempts = usize::try_from(tasks * rounds).unwrap_or(usize::MAX);
    Holding {
        passes,
        refusals: attempts - passes,
        most_in_flight: most.load(Ordering::SeqCst),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_differ_and_stay_in_the_key_alphabet() {
        let (a, b) = (unique("t"), unique("t"));
        assert_ne!(a, b);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
        );
    }

    #[test]
    fn postgres_url_ports_are_read() {
        assert_eq!(
            postgres_url_ports("postgres://postgres@127.0.0.1:15432/postgres"),
            Some(vec![15432])
        );
        assert_eq!(
            postgres_url_ports("postgresql://u:p@[::1]:20000,h:5432/db?x=1"),
            Some(vec![20000, 5432])
        );
        assert_eq!(
            postgres_url_ports("postgres://localhost/db"),
            Some(vec![SHARED_POSTGRES_PORT])
        );
        assert_eq!(postgres_url_ports("redis://127.0.0.1:1/"), None);
        assert_eq!(postgres_url_ports("postgres://h:port/db"), None);
    }

    #[test]
    #[should_panic(expected = "port 5432, the machine's PostgreSQL")]
    fn the_shared_postgres_is_refused() {
        refuse_the_shared_postgres("postgres://postgres@127.0.0.1/postgres");
    }

    #[test]
    fn a_throwaway_postgres_url_is_accepted() {
        refuse_the_shared_postgres(
            "postgres://postgres@127.0.0.1:15432/postgres",
        );
    }

    #[test]
    #[should_panic(expected = "port 6379, the shared Redis")]
    fn the_shared_redis_is_refused() {
        refuse_the_shared_redis(
            REDIS_URL_VAR,
            "redis://127.0.0.1:6379/",
            "test-redis",
        );
    }
}
