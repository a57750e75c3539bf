//! The example server reloads its tiers from a real file: on change and on
//! SIGHUP, keeping buckets (starting fresh those of a tier whose kind
//! changed, and saying so), and keeping the running tiers when the new
//! file is invalid. (Real waits: a file watcher and a signal, bounded.)
#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use support::Server;

struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> TempFile {
        let path = std::env::temp_dir()
            .join(format!("trt-{}-{name}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        TempFile(path)
    }

    /// Replaces the file at once (written beside it, renamed over it, as
    /// editors do): the server, polling every 20 ms, never reads a file
    /// half written (an empty file is a tier without tiers, refused).
    fn write(&self, text: &str) {
        let next = self.0.with_extension("toml.next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &self.0).unwrap();
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn plans(free_limit: u32) -> String {
    format!(
        "default_tier = \"free\"\n[tiers.free]\nlimit = {free_limit}\n\
         per = \"minute\"\n[tiers.pro]\nlimit = 100\nper = \"minute\"\n"
    )
}

/// `tiers(10)` with free an exact window of `limit` in any 60 s.
fn window_plans(limit: u32) -> String {
    format!(
        "default_tier = \"free\"\n[tiers.free]\nkind = \"window\"\n\
         limit = {limit}\nwindow_secs = 60\n[tiers.pro]\nlimit = 100\n\
         per = \"minute\"\n"
    )
}

/// Waits (bounded: a file watcher) until `n` lines of the server's stderr
/// contain `needle`; returns them.
fn wait_for_lines(server: &Server, needle: &str, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines: Vec<String> = server
            .stderr()
            .into_iter()
            .filter(|line| line.contains(needle))
            .collect();
        if lines.len() >= n {
            assert_eq!(lines.len(), n, "{needle:?}: {lines:?}");
            return lines;
        }
        assert!(Instant::now() < deadline, "{needle:?}: {lines:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn limit_and_remaining(server: &Server) -> (String, String) {
    let response = server.get("/data", Some("key_ana"));
    assert_eq!(response.status, 200);
    (
        response.header("x-ratelimit-limit").unwrap().to_owned(),
        response.header("x-ratelimit-remaining").unwrap().to_owned(),
    )
}

#[test]
fn a_changed_file_is_reloaded_and_an_invalid_one_is_refused() {
    let file = TempFile::new("change", &plans(10));
    let server =
        Server::start(&["--plans", file.arg(), "--plans-poll-ms", "20"], &[]);
    assert_eq!(limit_and_remaining(&server), ("10".into(), "9".into()));

    file.write(&plans(20));
    server.wait_for_stderr("plans reloaded: free, pro");
    // Ana spent a tenth of her bucket; she keeps having spent a tenth:
    // 20 - 2 - 1 (this request) = 17.
    assert_eq!(limit_and_remaining(&server), ("20".into(), "17".into()));

    file.write(
        "[tiers.free]\nlimit = 10\nper = \"minute\"\ncolour = \"red\"\n",
    );
    let refused = server.wait_for_stderr("plans not reloaded");
    assert!(refused.contains("line 4"), "{refused}");
    assert!(refused.contains("colour"), "{refused}");
    // The running tiers stay.
    assert_eq!(limit_and_remaining(&server).0, "20");

    file.write(&plans(0));
    let zero = server.wait_for_stderr("limit must be at least 1");
    assert!(zero.contains("line 3"), "{zero}");
    assert_eq!(limit_and_remaining(&server).0, "20");
}

/// Through `server`, reading its tiers from `file` (now `tiers(10)`): ana
/// spends 4 on free's rate; free becomes a window (fresh, and the server
/// says so), then a larger window (the same bucket, no change of kind),
/// then the rate again (said so). Ana's (limit, remaining) after that.
fn free_changes_kind_and_back(
    server: &Server,
    file: &TempFile,
) -> (String, String) {
    const CHANGED: &str = "plans changed kind, their buckets start fresh";
    const RELOADED: &str = "plans reloaded: free, pro";
    // After `reloads` reloads, `changes` of them said free, and free
    // alone, changed kind, the last one too.
    let said_free_changed_kind = |reloads: usize, changes: usize| {
        wait_for_lines(server, RELOADED, reloads);
        let changed = wait_for_lines(server, CHANGED, changes);
        let last = changed.last().unwrap();
        assert!(last.ends_with(&format!("{CHANGED}: free")), "{changed:?}");
    };
    for left in (6..10).rev() {
        assert_eq!(
            limit_and_remaining(server),
            ("10".into(), left.to_string())
        );
    }

    // None of the 4 counted in the window; pro kept its kind, so only
    // free is named.
    file.write(&window_plans(7));
    said_free_changed_kind(1, 1);
    assert_eq!(limit_and_remaining(server), ("7".into(), "6".into()));

    // This request is the window's second.
    file.write(&window_plans(8));
    wait_for_lines(server, RELOADED, 2);
    assert_eq!(limit_and_remaining(server), ("8".into(), "6".into()));
    wait_for_lines(server, CHANGED, 1); // and no second

    file.write(&plans(10));
    said_free_changed_kind(3, 2);
    let back = limit_and_remaining(server);
    let log = server.stderr();
    assert!(log.iter().all(|line| !line.contains("breaker")), "{log:?}");
    back
}

#[test]
fn a_reload_that_changes_a_tiers_kind_starts_its_buckets_fresh_and_says_so() {
    let file = TempFile::new("kind", &plans(10));
    let server =
        Server::start(&["--plans", file.arg(), "--plans-poll-ms", "20"], &[]);
    let back = free_changes_kind_and_back(&server, &file);
    assert_eq!(back, ("10".into(), "9".into()));
}

/// A server on the shared store of `store` (its flag and URL), reading
/// its tiers from `file`: the store decides every request (a generous
/// timeout, never the local fallback).
fn on_store(store: &[&str], file: &TempFile) -> Server {
    let plans = ["--plans", file.arg(), "--plans-poll-ms", "20"];
    let timeout = ["--store-timeout-ms", "10000"];
    Server::start(&[store, &timeout, &plans].concat(), &[])
}

#[test]
fn on_redis_a_reload_that_changes_a_tiers_kind_starts_its_buckets_fresh() {
    let url = rate_tier_test_support::redis_url();
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let key =
        tower_rate_tier::storage::key::bucket_key("free", "key_ana", None);
    let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    let file = TempFile::new("kind-redis", &plans(10));
    let server = on_store(&["--redis", &url], &file);
    // Fresh again: not the 4 spent on the rate before the window.
    let back = free_changes_kind_and_back(&server, &file);
    assert_eq!(back, ("10".into(), "9".into()));
    let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
}

#[test]
fn on_postgres_a_reload_that_changes_a_tiers_kind_starts_its_buckets_fresh() {
    let postgres = rate_tier_test_support::PostgresServer::start();
    let file = TempFile::new("kind-postgres", &plans(10));
    let server = on_store(&["--postgres", &postgres.url()], &file);
    server.wait_for_stderr("postgres, with local fallback");
    let back = free_changes_kind_and_back(&server, &file);
    assert_eq!(back, ("10".into(), "9".into()));
}

#[test]
fn sighup_reloads_at_once() {
    let file = TempFile::new("hup", &plans(10));
    // Polling every hour: only the signal can make this reload happen.
    let server = Server::start(
        &["--plans", file.arg(), "--plans-poll-ms", "3600000"],
        &[],
    );
    assert_eq!(limit_and_remaining(&server).0, "10");
    file.write(&plans(30));
    let status = Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    server.wait_for_stderr("plans reloaded");
    assert_eq!(limit_and_remaining(&server).0, "30");
}

#[test]
fn an_invalid_file_at_start_is_a_clear_error() {
    let file =
        TempFile::new("bad", "[tiers.free]\nlimit = 0\nper = \"minute\"\n");
    let output = Command::new(support::example_bin("server"))
        .args(["0", "--plans", file.arg()])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("line 2"), "{stderr}");
}
