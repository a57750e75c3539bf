//! The example server reloads its plans from a real file: on change and on
//! SIGHUP, keeping buckets, and keeping the running plans when the new file
//! is invalid. (Real waits: a file watcher and a signal, bounded.)
#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;
use std::process::Command;

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
    /// half written (an empty file is a plan without tiers, refused).
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
    // The running plans stay.
    assert_eq!(limit_and_remaining(&server).0, "20");

    file.write(&plans(0));
    let zero = server.wait_for_stderr("limit must be at least 1");
    assert!(zero.contains("line 3"), "{zero}");
    assert_eq!(limit_and_remaining(&server).0, "20");
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
