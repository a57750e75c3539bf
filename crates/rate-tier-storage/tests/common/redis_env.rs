//! Where the throwaway Redis servers of `cargo xtask` are, and names no
//! other test uses. Shared by the Redis tests of rate-tier-storage and
//! tower-rate-tier (which include this file by path).
//!
//! Without the variables the tests fail, never pass silently; a URL on
//! port 6379 (the machine's shared Redis) is refused.
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Generous: these tests are about sharing and atomicity, not latency, and
/// a loaded 2-core machine with 300 checks in flight can be slow. Timeouts
/// themselves are tested with small values.
pub(crate) const TEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The throwaway server's URL, from `cargo xtask test-redis`.
pub(crate) fn redis_url() -> String {
    let url = match std::env::var("TRT_REDIS_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => panic!("TRT_REDIS_URL is not set: run `cargo xtask test-redis`"),
    };
    refuse_the_shared_redis("TRT_REDIS_URL", &url, "test-redis");
    url
}

/// The throwaway cluster's node URLs (at least `nodes` of them), from
/// `cargo xtask test-cluster`.
pub(crate) fn cluster_urls(nodes: usize) -> Vec<String> {
    let urls = match std::env::var("TRT_REDIS_CLUSTER_URLS") {
        Ok(urls) if !urls.trim().is_empty() => urls,
        _ => panic!(
            "TRT_REDIS_CLUSTER_URLS is not set: run `cargo xtask test-cluster`"
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
        "TRT_REDIS_CLUSTER_URLS={urls:?}: these tests need {nodes} masters, \
         as `cargo xtask test-cluster` starts"
    );
    for url in &urls {
        refuse_the_shared_redis("TRT_REDIS_CLUSTER_URLS", url, "test-cluster");
    }
    urls
}

fn refuse_the_shared_redis(var: &str, url: &str, task: &str) {
    let client = redis::Client::open(url).unwrap_or_else(|e| {
        panic!("{var} holds {url:?}, not a Redis URL: {e}")
    });
    if let redis::ConnectionAddr::Tcp(_, 6379)
    | redis::ConnectionAddr::TcpTls { port: 6379, .. } =
        client.get_connection_info().addr()
    {
        panic!(
            "{var} holds {url:?}, port 6379, the shared Redis: these tests \
             write keys and flush scripts; run `cargo xtask {task}` for a \
             throwaway server"
        );
    }
}

/// A name no other test (or earlier run) uses: `[A-Za-z0-9_.-]`, short.
pub(crate) fn unique(prefix: &str) -> String {
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

/// `checks` concurrent tasks, alternately through `a` and `b` (two
/// "instances"), each running `check` once: how many returned true.
pub(crate) async fn concurrent_passes<T, F, Fut>(
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
        if task.await.expect("task") {
            passed += 1;
        }
    }
    passed
}
