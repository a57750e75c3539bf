//! Two example servers on one PostgreSQL (`--postgres`, and `DATABASE_URL`)
//! share one limit: 300 requests of one user at once, spread over both,
//! pass exactly the plan's 10. The test starts its own throwaway
//! PostgreSQL (Debian's `postgresql` package; without it, it fails saying
//! how to install it).
#![allow(clippy::unwrap_used)]

mod support;

use std::thread;

use rate_tier_test_support::PostgresServer;
use support::Server;

#[test]
fn two_servers_on_one_postgres_pass_exactly_the_limit_under_concurrency() {
    let postgres = PostgresServer::start();
    let url = postgres.url();
    let a = Server::start(&["--postgres", &url], &[]);
    // The second finds the table the first created, and its URL in the
    // environment.
    let b = Server::start(&[], &[("DATABASE_URL", &url)]);
    a.wait_for_stderr("postgres, with local fallback");
    b.wait_for_stderr("postgres, with local fallback");
    let ports = [a.port, b.port];
    let statuses: Vec<u16> = thread::scope(|scope| {
        let handles: Vec<_> = (0..300)
            .map(|i| {
                let port = ports[i % 2];
                scope.spawn(move || {
                    support::get(port, "/data", Some("key_ana")).status
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let passed = statuses.iter().filter(|&&s| s == 200).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((passed, refused), (10, 290), "{statuses:?}");
    // The user id is never stored in clear: the row's key is its hash.
    let keys = postgres.psql("SELECT key FROM rate_tier_buckets").unwrap();
    assert!(
        keys.contains("trt:free:33d2315cbeb866b8b237240a98d605f2e6e41b8a"),
        "{keys}"
    );
    assert!(!keys.contains("key_ana"), "{keys}");
}
