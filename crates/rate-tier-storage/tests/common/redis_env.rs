//! Where the throwaway Redis servers of `cargo xtask` are, and names no
//! other test uses. Shared by the Redis tests of rate-tier-storage and
//! tower-rate-tier (which include this file by path).
//!
//! Without the variables the tests fail, never pass silently; a URL on
//! port 6379 (the machine's shared Redis) is refused.
#![allow(dead_code)]

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
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

/// The commands one Redis server runs, as `MONITOR` shows them, that
/// mention `marker` (a test's unique name): what a store sent, counted
/// exactly even while other tests use the same server. Stops when dropped.
pub(crate) struct Monitor {
    address: String,
    marker: String,
    seen: Arc<(Mutex<Vec<String>>, Condvar)>,
    stop: Arc<AtomicBool>,
}

impl Monitor {
    /// Starts monitoring the server at `url` (a `redis://host:port` URL);
    /// returns once the server has confirmed.
    pub(crate) fn start(url: &str, marker: &str) -> Monitor {
        let address = match redis::Client::open(url)
            .expect("a Redis URL")
            .get_connection_info()
            .addr()
        {
            redis::ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
            other => panic!("MONITOR needs a TCP URL, not {other:?}"),
        };
        let mut stream = TcpStream::connect(&address).expect("connect");
        stream.write_all(b"MONITOR\r\n").expect("MONITOR");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("read timeout");
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).expect("MONITOR's answer");
        assert_eq!(line.trim_end(), "+OK", "MONITOR answered {line:?}");
        // From now on, short reads: the thread looks at its stop flag.
        reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(100)))
            .expect("read timeout");
        let seen = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (found, done, wanted) =
            (seen.clone(), stop.clone(), marker.to_owned());
        thread::spawn(move || {
            // A line may arrive in parts across read timeouts: it is kept
            // until its end.
            let mut line = String::new();
            while !done.load(Ordering::SeqCst) {
                match reader.read_line(&mut line) {
                    Ok(0) => return,
                    Ok(_) if line.ends_with('\n') => {
                        if line.contains(&wanted) {
                            let (lines, changed) = &*found;
                            lines
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .push(line.trim_end().to_owned());
                            changed.notify_all();
                        }
                        line.clear();
                    }
                    // Part of a line, or the read timed out (to look at the
                    // stop flag).
                    Ok(_) | Err(_) => {}
                }
            }
        });
        Monitor {
            address,
            marker: marker.to_owned(),
            seen,
            stop,
        }
    }

    /// The commands sent by clients that mention the marker so far, each
    /// as its words with the name lower-cased: e.g. `["evalsha", "<sha>",
    /// "2", "trt:...", ...]`. A script's `EVALSHA` may show twice: once
    /// refused with `NOSCRIPT` (another test flushed the scripts), and again
    /// after the reload.
    pub(crate) fn client_commands(&self) -> Vec<Vec<String>> {
        self.lines(false)
    }

    /// The commands run inside scripts that mention the marker so far: one
    /// `GET` of each key per run of a script that reads it.
    pub(crate) fn script_commands(&self) -> Vec<Vec<String>> {
        self.lines(true)
    }

    /// Waits until every command sent before this call has been seen.
    fn lines(&self, in_scripts: bool) -> Vec<Vec<String>> {
        // A command of our own, after everything else: once MONITOR shows
        // it, it has shown everything before it.
        let fence = format!("{}-fence-{}", self.marker, unique("m"));
        let mut conn = TcpStream::connect(&self.address).expect("connect");
        let echo =
            format!("*2\r\n$4\r\nECHO\r\n${}\r\n{fence}\r\n", fence.len());
        conn.write_all(echo.as_bytes()).expect("ECHO");
        let (lines, changed) = &*self.seen;
        let lines = lines.lock().unwrap_or_else(PoisonError::into_inner);
        let (lines, timeout) = changed
            .wait_timeout_while(lines, Duration::from_secs(10), |lines| {
                !lines.iter().any(|l| l.contains(&fence))
            })
            .unwrap_or_else(PoisonError::into_inner);
        assert!(!timeout.timed_out(), "MONITOR did not show {fence}");
        lines
            .iter()
            .filter(|line| !line.contains("-fence-"))
            .filter(|line| line.contains(" lua] ") == in_scripts)
            .map(|line| monitor_words(line))
            .collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The quoted words of a MONITOR line, the command's name lower-cased:
/// `1.2 [0 127.0.0.1:5] "EVALSHA" "ab" "1" "k"` gives
/// `["evalsha", "ab", "1", "k"]`. A backslash escapes the next character
/// (MONITOR escapes quotes inside a script's source); escapes are kept
/// as written.
fn monitor_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = line.chars();
    while chars.by_ref().any(|c| c == '"') {
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => {
                    word.push(c);
                    word.extend(chars.next());
                }
                _ => word.push(c),
            }
        }
        words.push(word);
    }
    if let Some(name) = words.first_mut() {
        *name = name.to_lowercase();
    }
    words
}
