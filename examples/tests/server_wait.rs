//! `--wait-up-to SECONDS`: a request the tier would refuse waits for its
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

/// Spends bea's burst of 100 on `servers` (in turn), then sends six
/// requests at once. Slot k (k = 1, 2, ...) opens 600k ms after the burst
/// began, so a request waits for it when that is at most 1 s away and is
/// refused at once otherwise. The burst itself takes real time, so which
/// slots are within reach depends on how long it took: the assertions hold
/// for any burst under 2.6 s (slot 1 always within reach, slot 6 never).
fn the_burst_spent_short_waits_are_served_and_long_ones_refused(
    servers: &[&Server],
) {
    const SLOT: Duration = Duration::from_millis(600);
    const WAIT_UP_TO: Duration = Duration::from_secs(1);
    const CALLS: u32 = 6;
    let burst_started = Instant::now();
    for i in 0..100 {
        let response = servers[i % servers.len()].get("/data", Some("key_bea"));
        assert_eq!(response.status, 200, "request {i}: {response:?}");
    }
    let burst = burst_started.elapsed();
    assert!(
        burst + WAIT_UP_TO < SLOT * CALLS,
        "the burst took {burst:?}: slot {CALLS} is within reach, the test cannot tell"
    );
    let ports: Vec<u16> = servers.iter().map(|s| s.port).collect();
    let calls: Vec<_> = ports
        .iter()
        .cycle()
        .take(CALLS as usize)
        .map(|&port| {
            thread::spawn(move || {
                let sent = burst_started.elapsed();
                let response = get(port, "/data", Some("key_bea"));
                (response.status, sent, burst_started.elapsed())
            })
        })
        .collect();
    let answers: Vec<_> =
        calls.into_iter().map(|call| call.join().unwrap()).collect();
    let mut served: Vec<_> = answers.iter().filter(|a| a.0 == 200).collect();
    let refused: Vec<_> = answers.iter().filter(|a| a.0 == 429).collect();
    assert_eq!(served.len() + refused.len(), answers.len(), "{answers:?}");
    assert!(!served.is_empty() && !refused.is_empty(), "{answers:?}");
    served.sort_by_key(|a| a.2);
    for (k, &&(_, sent, answered)) in (1..).zip(&served) {
        // Never before its slot opens (the bucket's clock starts after
        // `burst_started`), and never a wait longer than allowed.
        assert!(answered >= SLOT * k, "slot {k} served early: {answers:?}");
        // (The server reckons from the request's arrival, a little after
        // `sent`: 100 ms of slack for it.)
        assert!(
            (SLOT * k).saturating_sub(sent)
                <= WAIT_UP_TO + Duration::from_millis(100),
            "slot {k} was more than 1 s away: {answers:?}"
        );
    }
    // A refusal does not wait: it comes before the last served request,
    // whose slot opened at least 400 ms after the six were sent (the next
    // slot, refused, was more than 1 s away).
    let last_served = served.last().map_or(Duration::ZERO, |a| a.2);
    for &&(_, _, answered) in &refused {
        assert!(answered < last_served, "a refusal waited: {answers:?}");
    }
}

#[test]
fn in_memory_a_short_wait_is_served_and_a_long_one_refused() {
    let server = Server::start(&["--wait-up-to", "1"], &[]);
    the_burst_spent_short_waits_are_served_and_long_ones_refused(&[&server]);
}

#[test]
fn two_servers_on_one_redis_wait_in_one_queue() {
    let url = redis_url();
    // Bea's tier bucket, fresh (the test binaries run one at a time).
    let key = tower_rate_tier::storage::key::bucket_key("pro", "key_bea", None);
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
    let args = ["--wait-up-to", "1", "--redis", &url];
    let (a, b) = (Server::start(&args, &[]), Server::start(&args, &[]));
    the_burst_spent_short_waits_are_served_and_long_ones_refused(&[&a, &b]);
}
