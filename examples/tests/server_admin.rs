//! The example server's operator pieces: key_ada's own 500 a minute on pro,
//! and `POST /admin/reset?key=KEY` behind a bearer token from
//! `--admin-token-file` (404 without the flag, 401 and nothing done without
//! the right token); the ban of a key that keeps going, lifted by a reset.
//! In memory, and on two servers sharing one Redis.
#![allow(clippy::unwrap_used)]

mod support;

use rate_tier_test_support::redis_url;
use support::Server;

/// A POST with an optional bearer token: the status.
fn post(port: u16, path: &str, token: Option<&str>) -> u16 {
    post_as(port, path, token, None)
}

fn post_as(
    port: u16,
    path: &str,
    token: Option<&str>,
    key: Option<&str>,
) -> u16 {
    let auth = token
        .map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let key = key.map_or(String::new(), |k| format!("x-api-key: {k}\r\n"));
    let answer = support::exchange(
        port,
        &format!(
            "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-length: 0\r\n{auth}{key}connection: close\r\n\r\n"
        ),
    );
    let answer = String::from_utf8(answer).unwrap();
    answer.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn token_file() -> (tempfile_path::TempPath, &'static str) {
    let token = "s3cret-admin-token";
    (tempfile_path::TempPath::with(token), token)
}

/// A file deleted on drop (no dependency for one temporary file).
mod tempfile_path {
    pub struct TempPath(pub std::path::PathBuf);
    impl TempPath {
        pub fn with(content: &str) -> TempPath {
            let path = std::env::temp_dir().join(format!(
                "trt-admin-token-{}-{}",
                std::process::id(),
                rate_tier_test_support::unique("t")
            ));
            std::fs::write(&path, format!("{content}\n")).unwrap();
            TempPath(path)
        }
        pub fn as_str(&self) -> &str {
            self.0.to_str().unwrap()
        }
    }
    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// Spends ana's 10, resets her with a wrong token (401, still spent), then
/// with the right one: she passes again on the server that reset her (the
/// other may answer a refusal it remembers until its retry time, as the
/// README says).
fn a_reset_needs_the_token_and_refills(servers: &[&Server], token: &str) {
    for i in 0..10 {
        let response = servers[i % servers.len()].get("/data", Some("key_ana"));
        assert_eq!(response.status, 200);
    }
    assert_eq!(servers[0].get("/data", Some("key_ana")).status, 429);
    let port = servers[servers.len() - 1].port;
    for wrong in [None, Some("s3cret-admin-tokem"), Some("")] {
        assert_eq!(
            post(port, "/admin/reset?key=key_ana", wrong),
            401,
            "{wrong:?}"
        );
        assert_eq!(servers[0].get("/data", Some("key_ana")).status, 429);
    }
    assert_eq!(post(port, "/admin/reset?key=key_ana", Some(token)), 200);
    let response = servers[servers.len() - 1].get("/data", Some("key_ana"));
    assert_eq!(
        (response.status, response.header("x-ratelimit-remaining")),
        (200, Some("9"))
    );
}

#[test]
fn ada_has_her_own_500_a_minute_on_pro() {
    let server = Server::start(&[], &[]);
    for _ in 0..120 {
        let response = server.get("/data", Some("key_ada"));
        assert_eq!(response.status, 200);
        assert_eq!(response.header("x-ratelimit-limit"), Some("500"));
    }
    // Bea, on the same tier, has its 100.
    let response = server.get("/data", Some("key_bea"));
    assert_eq!(response.header("x-ratelimit-limit"), Some("100"));
}

#[test]
fn without_a_token_file_there_is_no_admin_route() {
    let server = Server::start(&[], &[]);
    // Like any unknown route: the limiter's 401 without a key, 404 with one.
    assert_eq!(
        post(server.port, "/admin/reset?key=key_ana", Some("anything")),
        401
    );
    let status = post_as(
        server.port,
        "/admin/reset?key=key_ana",
        Some("anything"),
        Some("key_bea"),
    );
    assert_eq!(status, 404);
}

#[test]
fn in_memory_a_reset_needs_the_token() {
    let (file, token) = token_file();
    let server = Server::start(&["--admin-token-file", file.as_str()], &[]);
    a_reset_needs_the_token_and_refills(&[&server], token);
}

/// Held by the tests that use key_ana's buckets on the shared Redis, so
/// that they never run at once.
static ANA_ON_REDIS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn on_redis_a_reset_on_one_server_refills_for_both() {
    let _ana = ANA_ON_REDIS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let url = redis_url();
    let key =
        tower_rate_tier::storage::key::bucket_key("free", "key_ana", None);
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    let (file, token) = token_file();
    let args = ["--redis", &url, "--admin-token-file", file.as_str()];
    let (a, b) = (Server::start(&args, &[]), Server::start(&args, &[]));
    a_reset_needs_the_token_and_refills(&[&a, &b], token);
}

#[test]
fn a_key_that_keeps_going_is_banned_and_a_reset_lifts_it() {
    let (file, token) = token_file();
    let server = Server::start(&["--admin-token-file", file.as_str()], &[]);
    for _ in 0..10 {
        assert_eq!(server.get("/data", Some("key_ana")).status, 200);
    }
    // 20 refusals of the tier, then banned.
    for _ in 0..20 {
        let response = server.get("/data", Some("key_ana"));
        assert_eq!(response.status, 429);
        assert!(!response.body.contains("banned"), "{}", response.body);
    }
    let response = server.get("/data", Some("key_ana"));
    assert_eq!(response.status, 429);
    assert!(
        response.body.contains(r#""banned":true"#),
        "{}",
        response.body
    );
    assert_eq!(response.header("retry-after"), Some("60"));
    assert_eq!(
        post(server.port, "/admin/reset?key=key_ana", Some(token)),
        200
    );
    assert_eq!(server.get("/data", Some("key_ana")).status, 200);
}

/// Ana's tier bucket and her ban's, on Redis.
fn clear_anas_buckets(url: &str) {
    let keys: Vec<String> = ["free", "ban/until", "ban/refusals", "ban/level"]
        .iter()
        .map(|name| {
            tower_rate_tier::storage::key::bucket_key(name, "key_ana", None)
        })
        .collect();
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let _: () = redis::cmd("DEL").arg(&keys).query(&mut conn).unwrap();
}

/// A banned answer's `retry-after`, asserting it is one.
fn banned_for(response: &support::Response) -> u64 {
    assert_eq!(response.status, 429, "{response:?}");
    assert!(
        response.body.contains(r#""banned":true"#),
        "{}",
        response.body
    );
    response.header("retry-after").unwrap().parse().unwrap()
}

/// Two servers on one Redis (ana, free: 10 a minute, one back each 6 s, so
/// nothing comes back while the test runs). Banned through `a`, she is
/// banned on `b` too, until the same end. A reset through `a` lifts it on
/// `a` at once; `b` forgets nothing it remembers (the refusal its store
/// remembers for her, as the README's reset caveat says): it answers that
/// refusal until its own retry time, never longer, and a reset through `b`
/// lifts it there too.
#[test]
fn on_redis_a_ban_through_one_server_is_answered_by_both_and_a_reset_lifts_it()
{
    let _ana = ANA_ON_REDIS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let url = redis_url();
    clear_anas_buckets(&url);
    let (file, token) = token_file();
    let args = ["--redis", &url, "--admin-token-file", file.as_str()];
    let (a, b) = (Server::start(&args, &[]), Server::start(&args, &[]));
    for _ in 0..10 {
        assert_eq!(a.get("/data", Some("key_ana")).status, 200);
    }
    // 20 refusals of the tier through a, then banned.
    for _ in 0..20 {
        let response = a.get("/data", Some("key_ana"));
        assert_eq!(response.status, 429);
        assert!(!response.body.contains("banned"), "{}", response.body);
    }
    assert_eq!(banned_for(&a.get("/data", Some("key_ana"))), 60);
    // b learns it from the store (the ban's bucket), with the same end:
    // rounded up, 60 s less the moments since.
    let on_b = banned_for(&b.get("/data", Some("key_ana")));
    assert!((59..=60).contains(&on_b), "{on_b}");

    assert_eq!(post(a.port, "/admin/reset?key=key_ana", Some(token)), 200);
    let response = a.get("/data", Some("key_ana"));
    assert_eq!(
        (response.status, response.header("x-ratelimit-remaining")),
        (200, Some("9"))
    );
    // b still answers the refusal its store remembers for her (the
    // README's reset caveat): banned, until no later than it said.
    let left = banned_for(&b.get("/data", Some("key_ana")));
    assert!(left <= on_b, "{left} > {on_b}");
    assert_eq!(post(b.port, "/admin/reset?key=key_ana", Some(token)), 200);
    let response = b.get("/data", Some("key_ana"));
    assert_eq!(
        (response.status, response.header("x-ratelimit-remaining")),
        (200, Some("9"))
    );
    let response = a.get("/data", Some("key_ana"));
    assert_eq!(
        (response.status, response.header("x-ratelimit-remaining")),
        (200, Some("8"))
    );
}
