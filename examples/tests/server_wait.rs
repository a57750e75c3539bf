//! `--wait-up-to SECONDS`: a request the plan would refuse waits for its
//! slot and is served; one that would wait longer is refused at once, as
//! without the flag. In memory, and on two servers sharing one Redis.
//!
//! Pro is 100 a minute: one slot every 600 ms once the burst is spent.
#![allow(clippy::unwrap_used)]

mod support;

use std::thread;
use std::time::{Duration, Instant};

use rate_tier_test_support::redis_url;
use support::{Server, get};

/// Spends bea's burst of 100 on `servers` (in turn), then sends two
/// requests at once: the first waits about 600 ms and passes, the second
/// would wait 1.2 s, more than the 1 s allowed: 429 at once.
fn the_burst_spent_one_waits_and_one_is_refused(servers: &[&Server]) {
    for i in 0..100 {
        let response = servers[i % servers.len()].get("/data", Some("key_bea"));
        assert_eq!(response.status, 200, "request {i}: {response:?}");
    }
    let ports: Vec<u16> = servers.iter().map(|s| s.port).collect();
    let started = Instant::now();
    let calls: Vec<_> = ports
        .iter()
        .cycle()
        .take(2)
        .map(|&port| {
            thread::spawn(move || {
                let response = get(port, "/data", Some("key_bea"));
                (response.status, started.elapsed())
            })
        })
        .collect();
    let mut answers: Vec<_> =
        calls.into_iter().map(|call| call.join().unwrap()).collect();
    answers.sort();
    let [(ok, waited), (refused, answered)] = answers[..] else {
        unreachable!()
    };
    assert_eq!((ok, refused), (200, 429), "{answers:?}");
    // 600 ms less the time the burst took; never more than the 1 s allowed.
    assert!(waited <= Duration::from_millis(1_000), "{waited:?}");
    assert!(answered < waited, "the refusal does not wait: {answers:?}");
}

#[test]
fn in_memory_a_short_wait_is_served_and_a_long_one_refused() {
    let server = Server::start(&["--wait-up-to", "1"], &[]);
    the_burst_spent_one_waits_and_one_is_refused(&[&server]);
}

#[test]
fn two_servers_on_one_redis_wait_in_one_queue() {
    let url = redis_url();
    // Bea's plan bucket, fresh (the test binaries run one at a time).
    let key = tower_rate_tier::key::bucket_key("pro", "key_bea", None);
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    let args = ["--wait-up-to", "1", "--redis", &url];
    let (a, b) = (Server::start(&args, &[]), Server::start(&args, &[]));
    the_burst_spent_one_waits_and_one_is_refused(&[&a, &b]);
}
