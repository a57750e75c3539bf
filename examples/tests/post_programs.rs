//! The programs of 0.3 print exactly what `examples/expected/` holds, and
//! the example server answers 0.3's requests as it did then (in memory).
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;

use support::{Server, example_bin};

fn run(example: &str) -> String {
    let output = Command::new(example_bin(example)).output().unwrap();
    assert!(output.status.success(), "{example} failed: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn gcra_steps_prints_the_posts_output() {
    assert_eq!(
        run("gcra_steps"),
        include_str!("../expected/gcra_steps.txt")
    );
}

/// The same steps through `SyncTier::check`: the same decisions.
#[test]
fn sync_steps_prints_what_gcra_steps_prints() {
    assert_eq!(
        run("sync_steps"),
        include_str!("../expected/gcra_steps.txt")
    );
}

#[test]
fn fixed_window_prints_the_posts_output() {
    assert_eq!(
        run("fixed_window"),
        include_str!("../expected/fixed_window.txt")
    );
}

#[test]
fn server_in_memory_answers_as_the_post_shows() {
    let server = Server::start(&[], &[]);

    // Ana (free, 10 per minute): ten pass, the eleventh is refused.
    for expected_remaining in (0..10).rev() {
        let response = server.get("/data", Some("key_ana"));
        assert_eq!(response.status, 200);
        assert_eq!(response.body, "data\n");
        assert_eq!(response.header("x-ratelimit-limit"), Some("10"));
        assert_eq!(
            response.header("x-ratelimit-remaining"),
            Some(expected_remaining.to_string().as_str())
        );
    }
    let refused = server.get("/data", Some("key_ana"));
    assert_eq!(refused.status, 429);
    // The 0.3 example's header order (hyper adds content-length and date, and
    // `connection` because this client asks to close).
    let names: Vec<&str> = refused
        .headers
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| *n != "connection")
        .collect();
    assert_eq!(
        names,
        [
            "content-type",
            "retry-after",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "content-length",
            "date"
        ]
    );
    assert_eq!(refused.header("content-type"), Some("application/json"));
    assert_eq!(refused.header("retry-after"), Some("6"));
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(refused.header("content-length"), Some("61"));
    assert_eq!(
        refused.body,
        r#"{"error":"rate limit exceeded","tier":"free","retry_after":6}"#
    );
    let reset: u64 = refused
        .header("x-ratelimit-reset")
        .unwrap()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // The bucket is full again about a minute from now.
    assert!((now + 55..=now + 61).contains(&reset), "{reset} vs {now}");

    // Bea (pro, 100 per minute): /data costs 1, /report 5.
    let data = server.get("/data", Some("key_bea"));
    assert_eq!(
        (data.status, data.header("x-ratelimit-remaining")),
        (200, Some("99"))
    );
    let report = server.get("/report", Some("key_bea"));
    assert_eq!(
        (report.status, report.header("x-ratelimit-remaining")),
        (200, Some("94"))
    );

    // Eva's tier is unknown: the default tier's quota, in her own bucket.
    let eva = server.get("/data", Some("key_eva"));
    assert_eq!(
        (eva.status, eva.header("x-ratelimit-limit")),
        (200, Some("10"))
    );
    assert_eq!(eva.header("x-ratelimit-remaining"), Some("9"));
    let backup = server.get("/backup", Some("key_eva"));
    assert_eq!(backup.status, 403);
    assert_eq!(backup.header("retry-after"), None);
    let anonymous = server.get("/data", None);
    assert_eq!(anonymous.status, 401);

    // One line per unknown-tier request, from on_event.
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_secs(5);
    let unknown = loop {
        let lines: Vec<String> = server
            .stderr()
            .into_iter()
            .filter(|l| l.starts_with("unknown tier"))
            .collect();
        if lines.len() >= 2 || std::time::Instant::now() > deadline {
            break lines;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(
        unknown,
        [
            r#"unknown tier "gold" for key_eva"#,
            r#"unknown tier "gold" for key_eva"#
        ]
    );
}

#[test]
fn server_rejects_bad_arguments() {
    let output = Command::new(example_bin("server"))
        .arg("--bogus")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("usage"));
    for ms in ["0", "soon"] {
        let output = Command::new(example_bin("server"))
            .args(["--store-timeout-ms", ms])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{ms}");
        assert!(
            String::from_utf8_lossy(&output.stderr)
                .contains("--store-timeout-ms needs milliseconds, above 0"),
            "{ms}"
        );
    }
}

#[test]
fn server_sends_the_ietf_fields_when_asked() {
    let server = Server::start(&["--headers", "both"], &[]);
    let response = server.get("/data", Some("key_ana"));
    assert_eq!(response.header("x-ratelimit-remaining"), Some("9"));
    assert_eq!(
        response.header("ratelimit-policy"),
        Some(r#""free";q=10;w=60"#)
    );
    assert_eq!(response.header("ratelimit"), Some(r#""free";r=9;t=6"#));

    let ietf = Server::start(&["--headers", "ietf"], &[]);
    let response = ietf.get("/data", Some("key_ana"));
    assert_eq!(response.header("x-ratelimit-remaining"), None);
    assert_eq!(response.header("ratelimit"), Some(r#""free";r=9;t=6"#));
}

#[test]
fn server_starts_and_limits_locally_while_redis_is_down() {
    // Port 1 on loopback: nothing listens there.
    let server = Server::start(&["--redis", "redis://127.0.0.1:1/"], &[]);
    let statuses: Vec<u16> = (0..11)
        .map(|_| server.get("/data", Some("key_ana")).status)
        .collect();
    assert_eq!(statuses[..10], [200; 10]);
    assert_eq!(statuses[10], 429);
    server.wait_for_stderr("breaker redis Closed -> Open");
}

/// Docs and examples picked the tier from client input
/// (`key.starts_with("pro_")`): anyone sending `pro_<anything>` got pro,
/// and a fresh bucket each time. No example, README or doc comment may
/// show that again: a tier comes from a lookup (`plan_of`, `api_key`).
#[test]
fn no_example_or_doc_picks_a_plan_from_client_input() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    // Built here, so that this file does not match itself.
    let prefix_test = format!("starts_with(\"{}", "pro");
    let mut offenders = Vec::new();
    let mut dirs = vec![root.clone()];
    let mut scanned = 0;
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | "tests") {
                    dirs.push(path);
                }
                continue;
            }
            let ext = path.extension().and_then(|e| e.to_str());
            if !matches!(ext, Some("rs" | "md" | "toml")) {
                continue;
            }
            scanned += 1;
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                if line.contains(&prefix_test) {
                    offenders.push(format!(
                        "{}:{}: {line}",
                        path.display(),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        scanned > 20,
        "only {scanned} files under {}",
        root.display()
    );
    assert!(offenders.is_empty(), "{offenders:#?}");
    // And the example server itself: a key shaped like a tier is no key.
    let server = Server::start(&[], &[]);
    assert_eq!(server.get("/data", Some("pro_x")).status, 401);
    assert_eq!(server.get("/data", Some("pro")).status, 401);
}
