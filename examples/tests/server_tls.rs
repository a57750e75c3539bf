//! The example server on a Redis reached over TLS: `rediss://` and
//! `--redis-ca`, against a throwaway Redis whose certificate a CA made by
//! the test signed.

mod support;

use rate_tier_test_support::{RedisServer, TestCa};
use support::Server;

#[test]
fn the_example_server_shares_its_limits_through_a_tls_redis() {
    let ca = TestCa::generate().unwrap();
    let (redis, tls_port) =
        RedisServer::try_start_tls(&ca).unwrap_or_else(|e| panic!("{e}"));
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    let ca_file = ca.ca_file();
    let server = Server::start(
        &["--redis", &url, "--redis-ca", ca_file.to_str().unwrap()],
        &[],
    );
    let first = server.get("/data", Some("key_ana"));
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-ratelimit-remaining"), Some("9"));
    assert_eq!(
        server
            .get("/data", Some("key_ana"))
            .header("x-ratelimit-remaining"),
        Some("8")
    );
    // Decided in that Redis, not by the local fallback.
    let keys: u64 = redis.command(&["DBSIZE"]).unwrap().trim().parse().unwrap();
    assert!(keys >= 1, "{keys}");
    assert!(
        !server.stderr().iter().any(|line| line.contains("breaker")),
        "{:?}",
        server.stderr()
    );
}
