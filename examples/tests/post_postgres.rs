//! Two example servers on one PostgreSQL (`--postgres`, and `DATABASE_URL`)
//! share one limit: 300 requests of one user at once, spread over both,
//! pass the tier's 10 (and no more than the bucket refills while they run),
//! while PostgreSQL answers within the store's timeout (past it, the
//! documented fallback limits each server by itself). The test starts its
//! own throwaway PostgreSQL (Debian's `postgresql` package; without it, it
//! fails saying how to install it).
#![allow(clippy::unwrap_used)]

mod support;

use std::thread;
use std::time::{Duration, Instant};

use rate_tier_test_support::PostgresServer;
use support::Server;

#[test]
fn two_servers_on_one_postgres_pass_exactly_the_limit_under_concurrency() {
    let postgres = PostgresServer::start();
    let url = postgres.url();
    // Exactness is the shared store's, so the timeout leaves room for a
    // loaded machine (2 cores, 300 requests, PostgreSQL in Docker): a check
    // that timed out would be decided by the server's local fallback.
    let timeout = ["--store-timeout-ms", "10000"];
    let a = Server::start(&[&["--postgres", &url][..], &timeout].concat(), &[]);
    // The second finds the table the first created, and its URL in the
    // environment.
    let b = Server::start(&timeout, &[("DATABASE_URL", &url)]);
    a.wait_for_stderr("postgres, with local fallback");
    b.wait_for_stderr("postgres, with local fallback");
    let load: Vec<(u16, &str)> = (0..300)
        .map(|i| ([a.port, b.port][i % 2], "key_ana"))
        .collect();
    let (statuses, took) = at_once_timed(&load);
    let passed = statuses.iter().filter(|&&s| s == 200).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    let logs = [a.stderr(), b.stderr()];
    // One shared bucket of 10 a minute: one more per 6 s the load took.
    let most = 10 + refills(took, Duration::from_secs(6));
    assert!(
        passed + refused == 300 && (10..=most).contains(&passed),
        "{passed} passed in {took:?}: {statuses:?}\n{logs:?}"
    );
    // The store decided every one: no breaker opened.
    assert!(
        logs.iter().flatten().all(|line| !line.contains("breaker")),
        "{logs:?}"
    );
    // The user id is never stored in clear: the row's key is its hash.
    let keys = postgres.psql("SELECT key FROM rate_tier_buckets").unwrap();
    assert!(
        keys.contains("trt:free:33d2315cbeb866b8b237240a98d605f2e6e41b8a"),
        "{keys}"
    );
    assert!(!keys.contains("key_ana"), "{keys}");
}

/// How many times a bucket that gains a request every `every` refilled
/// during `took`, the time a burst of requests took (seconds, on a loaded
/// machine): how many more than its limit may pass.
fn refills(took: Duration, every: Duration) -> usize {
    usize::try_from(took.as_micros() / every.as_micros()).unwrap_or(usize::MAX)
}

/// `statuses` of requests `(server port, key)` sent all at once, and the
/// time they took.
fn at_once_timed(requests: &[(u16, &str)]) -> (Vec<u16>, Duration) {
    let started = Instant::now();
    let statuses = at_once(requests);
    (statuses, started.elapsed())
}

/// `statuses` of requests `(server port, key)` sent all at once.
fn at_once(requests: &[(u16, &str)]) -> Vec<u16> {
    thread::scope(|scope| {
        let handles: Vec<_> = requests
            .iter()
            .map(|&(port, key)| {
                scope.spawn(move || {
                    support::get(port, "/data", Some(key)).status
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn a_stopped_postgres_is_limited_locally_under_load_then_shared_again() {
    let mut postgres = PostgresServer::start();
    let url = postgres.url();
    // A stopped PostgreSQL refuses connections at once, so the breakers
    // open without the timeout; the timeout only keeps a loaded machine's
    // slow answers, once PostgreSQL is back, from being decided locally.
    let args = ["--postgres", &url, "--store-timeout-ms", "10000"];
    let a = Server::start(&args, &[]);
    let b = Server::start(&args, &[]);
    a.wait_for_stderr("postgres, with local fallback");
    b.wait_for_stderr("postgres, with local fallback");

    // Stopped: every answer a 200 or a 429, never an error, and each
    // instance limits by itself (the tier's 10 each, as the fallback's
    // documented cost: limits are per instance while the store is down).
    postgres.kill();
    let load: Vec<(u16, &str)> = (0..300)
        .map(|i| ([a.port, b.port][i % 2], "key_ana"))
        .collect();
    let (statuses, took) = at_once_timed(&load);
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 429),
        "{statuses:?}"
    );
    let passed = statuses.iter().filter(|&&s| s == 200).count();
    // Two buckets of 10 a minute, each one more per 6 s the load took.
    let most = 20 + 2 * refills(took, Duration::from_secs(6));
    assert!(
        (20..=most).contains(&passed),
        "{passed} passed in {took:?}: {statuses:?}"
    );
    a.wait_for_stderr("breaker postgres Closed -> Open");
    b.wait_for_stderr("breaker postgres Closed -> Open");

    // Back: once each breaker has tried PostgreSQL again and closed, the
    // limit is shared again. The probes use key_ada: key_ana's 280
    // refusals may have banned her on either server, which then refuses
    // her without a store call, so her requests would never probe.
    // key_bea (pro, 100/min) has never been charged anywhere.
    postgres.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    let closed = |server: &Server| {
        server
            .stderr()
            .iter()
            .any(|line| line.contains("-> Closed"))
    };
    while !(closed(&a) && closed(&b)) {
        assert!(
            Instant::now() < deadline,
            "the breakers did not close: {:?} {:?}",
            a.stderr(),
            b.stderr()
        );
        at_once(&[(a.port, "key_ada"), (b.port, "key_ada")]);
        thread::sleep(Duration::from_millis(100));
    }
    let load: Vec<(u16, &str)> = (0..130)
        .map(|i| ([a.port, b.port][i % 2], "key_bea"))
        .collect();
    let (statuses, took) = at_once_timed(&load);
    let passed = statuses.iter().filter(|&&s| s == 200).count();
    let refused = statuses.iter().filter(|&&s| s == 429).count();
    let logs = [a.stderr(), b.stderr()];
    // One shared bucket of 100 a minute: one more per 600 ms the load took.
    let most = 100 + refills(took, Duration::from_millis(600));
    assert!(
        passed + refused == 130 && (100..=most).contains(&passed),
        "{passed} passed in {took:?}: {statuses:?}\n{logs:?}"
    );
}
