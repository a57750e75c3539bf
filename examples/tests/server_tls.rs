//! The example server on stores reached over TLS, whose certificates a CA
//! made by the test signed: a Redis (`rediss://` and `--redis-ca`) and a
//! PostgreSQL (`sslmode=verify-full` and `sslrootcert` in its URL).

mod support;

use rate_tier_test_support::{PostgresServer, RedisServer, TestCa};
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

#[test]
fn the_example_server_shares_its_limits_through_a_tls_postgres() {
    let ca = TestCa::generate().unwrap();
    let mut postgres = PostgresServer::start();
    postgres.enable_tls(&ca).unwrap();
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        postgres.url(),
        ca.ca_file().display()
    );
    // It creates its table at start, through TLS too.
    let server = Server::start(&["--postgres", &url], &[]);
    server.wait_for_stderr("postgres, with local fallback");
    let first = server.get("/data", Some("key_ana"));
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-ratelimit-remaining"), Some("9"));
    let tls: u64 = postgres
        .psql("SELECT count(*) FROM pg_stat_ssl WHERE ssl")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(tls >= 1, "its connections are TLS");
    assert!(
        !server
            .stderr()
            .iter()
            .any(|line| line.contains("cannot create")),
        "{:?}",
        server.stderr()
    );
}
