//! `cargo run --example shaper`: two worker processes, 100 calls each fired
//! at once, through one 20-a-second quota (burst 1) in the throwaway Redis
//! of `cargo xtask test-redis`: none refused, the upstream never sees two
//! calls closer than the interval (less the timers' error), and the run
//! takes the 10 s the quota says.
//!
//! Real processes, real time: the only way to see what an upstream sees.
#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;

use rate_tier_test_support::redis_url;
use support::example_bin;

/// What the example printed, as numbers.
struct Seen {
    calls: u64,
    seconds: f64,
    rate: f64,
    busiest: u64,
    closest_ms: f64,
    refused: u64,
}

fn parse(output: &str) -> Seen {
    let words: Vec<&str> = output.split_whitespace().collect();
    let after = |word: &str| -> f64 {
        let at = words.iter().position(|w| *w == word).unwrap();
        words[at + 1].trim_end_matches([':', ';']).parse().unwrap()
    };
    Seen {
        calls: after("upstream:") as u64,
        seconds: after("in"),
        rate: after("s:"),
        busiest: after("second:") as u64,
        closest_ms: after("calls:"),
        refused: after("refused:") as u64,
    }
}

#[test]
fn two_processes_share_one_quota_and_the_upstream_sees_it() {
    let output = Command::new(example_bin("shaper"))
        .args(["--redis", &redis_url(), "--calls", "100", "--rate", "20"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{output:?}");
    let seen = parse(&stdout);
    assert_eq!((seen.calls, seen.refused), (200, 0), "{stdout}");
    // 199 intervals of 50 ms: 9.95 s. Calls leave at their slot or a
    // little after, never before, so the run is never shorter (but for a
    // few ms of the first call's own delay), and a loaded machine
    // stretches it only a little: the shaped rate is the quota.
    assert!(seen.seconds >= 9.95 - 0.025, "{stdout}");
    assert!(seen.seconds <= 9.95 + 0.25, "{stdout}");
    assert!(
        seen.rate <= 20.0 * 1.005 && seen.rate >= 20.0 * 0.98,
        "{stdout}"
    );
    // What the provider counts: never more than its 20 in any second
    // (one more only if a call's delay lands it beside the next).
    assert!(seen.busiest <= 21, "{stdout}");
    // Slots are 50 ms apart on Redis's clock; a call's own delays (its
    // reply, the scheduler) bring two closer by a few ms, never by half.
    assert!(seen.closest_ms >= 25.0, "{stdout}");
}
