//! Property tests of `Window` (the sliding window log) against oracles
//! written here from the rules in its docs, not from the crate's code:
//!
//! - `spec_check`: the rules transcribed literally, in `i128` over a `Vec`
//!   (sorting, filtering), stateless over any log, corrupt ones included;
//!   it says what the log must be after the write, not how to write it;
//! - a brute-force history: every request that passed, never trimmed,
//!   counted over all instants, for the promise itself (never `N + 1` in
//!   any `W` consecutive microseconds, exact `retry_after`).

mod common;

use core::time::Duration;

use common::{MAX, u};
use gcra_core::{
    CheckError, LogWrite, MAX_TIME_US, MAX_WINDOW_LIMIT, MAX_WINDOW_US, Window,
    WindowDecision, WindowError,
};
use proptest::prelude::*;

fn window(limit: u32, w: u64) -> Window {
    Window::new(limit, Duration::from_micros(w)).unwrap()
}

/// The log after `write`, applied the way a `Vec` store does.
fn applied(log: &[u64], write: &LogWrite) -> Vec<u64> {
    assert!(
        write.drop_oldest + write.drop_newest <= log.len(),
        "the drops overlap: {write:?} on {} entries",
        log.len()
    );
    let kept = write.kept(log.len());
    let mut next = log[kept].to_vec();
    next.extend(std::iter::repeat_n(write.entry_us, write.append));
    next
}

/// What the rules say: the answer, and the log the store must end with
/// (`None`: the log is left as it is).
#[derive(Debug, PartialEq, Eq)]
struct Expected {
    allowed: bool,
    remaining: u64,
    retry_after_us: u64,
    reset_after_us: u64,
    new_log: Option<Vec<u64>>,
    ttl_ms: Option<u64>,
}

fn spec_check(
    limit: u32,
    w: u64,
    log: &[u64],
    now: u64,
    cost: u32,
) -> Result<Expected, CheckError> {
    // Rule 1.
    if i128::from(now) > MAX {
        return Err(CheckError::TimeOutOfRange);
    }
    if cost > limit {
        return Err(CheckError::CostExceedsBurst { cost, burst: limit });
    }
    let (w, n, c) = (i128::from(w), i128::from(now), i128::from(cost));
    // Rule 2: an unsorted log is read as empty.
    let sorted = log.windows(2).all(|pair| pair[0] <= pair[1]);
    let log: Vec<i128> = if sorted {
        log.iter().copied().map(i128::from).collect()
    } else {
        Vec::new()
    };
    // Rule 3: counted entries at their effective time.
    let mut counted: Vec<i128> = log
        .iter()
        .filter(|&&t| t <= MAX && t + w > n)
        .map(|&t| t.min(n))
        .collect();
    counted.sort_unstable();
    let ahead = log.iter().filter(|&&t| t > n && t <= MAX).count();
    let count = counted.len() as i128;
    let reset = counted.last().map_or(0, |&e| e + w - n);
    let limit = i128::from(limit);
    // The log after a write: the counted entries, re-stamped, then `extra`
    // entries `now`.
    let rewritten = |extra: i128| {
        let mut next: Vec<u64> = counted.iter().map(|&e| u(e)).collect();
        next.extend(std::iter::repeat_n(now, usize::try_from(extra).unwrap()));
        next
    };
    let ttl = u((w + 999) / 1000);
    if c == 0 {
        // Rule 6.
        return Ok(Expected {
            allowed: true,
            remaining: u((limit - count).max(0)),
            retry_after_us: 0,
            reset_after_us: u(reset),
            new_log: None,
            ttl_ms: None,
        });
    }
    if count + c > limit {
        // Rule 4: wait for the k-th oldest counted entry to expire.
        let k = count + c - limit;
        let e = counted[usize::try_from(k - 1).unwrap()];
        return Ok(Expected {
            allowed: false,
            remaining: 0,
            retry_after_us: u(e + w - n),
            reset_after_us: u(reset),
            new_log: (ahead > 0).then(|| rewritten(0)),
            ttl_ms: (ahead > 0).then_some(ttl),
        });
    }
    // Rule 5.
    Ok(Expected {
        allowed: true,
        remaining: u(limit - count - c),
        retry_after_us: 0,
        reset_after_us: u(w),
        new_log: Some(rewritten(c)),
        ttl_ms: Some(ttl),
    })
}

/// The crate's decision in the oracle's terms.
fn observed(log: &[u64], d: &WindowDecision) -> Expected {
    Expected {
        allowed: d.allowed,
        remaining: d.remaining,
        retry_after_us: d.retry_after_us,
        reset_after_us: d.reset_after_us,
        new_log: d.write.map(|write| applied(log, &write)),
        ttl_ms: d.write.map(|write| write.ttl_ms),
    }
}

fn is_sorted(log: &[u64]) -> bool {
    log.windows(2).all(|pair| pair[0] <= pair[1])
}

// ---------------------------------------------------------------------------
// Strategies.
// ---------------------------------------------------------------------------

/// A small window (limit 1..=6, W 1..=40 µs): every edge is hit.
fn small() -> impl Strategy<Value = (u32, u64)> {
    (1u32..=6, 1u64..=40)
}

/// Any window the crate accepts, the extremes included.
fn any_window() -> impl Strategy<Value = (u32, u64)> {
    prop_oneof![
        3 => small(),
        1 => (1u32..=MAX_WINDOW_LIMIT, 1u64..=MAX_WINDOW_US),
        1 => Just((MAX_WINDOW_LIMIT, MAX_WINDOW_US)),
        1 => Just((1, 1)),
    ]
}

/// An entry near `now` (expired, counted, on the edges, ahead) or garbage.
fn entry(now: u64, w: u64, raw: u64, kind: u8) -> u64 {
    match kind % 8 {
        0 => raw,                                        // anything
        1 => MAX_TIME_US + 1 + raw % 1000,               // garbage
        2 => now.saturating_sub(w),                      // just expired
        3 => now.saturating_sub(w) + 1,                  // oldest counted
        4 => now,                                        // newest counted
        5 => (now + 1 + raw % (2 * w)).min(MAX_TIME_US), // ahead
        _ => now.saturating_sub(raw % (2 * w + 1)),      // around the window
    }
}

fn log_of(
    now: u64,
    w: u64,
    raw: &[(u64, u8)],
    sort: bool,
    len: usize,
) -> Vec<u64> {
    let mut log: Vec<u64> = raw
        .iter()
        .take(len)
        .map(|&(r, k)| entry(now, w, r, k))
        .collect();
    if sort {
        log.sort_unstable();
    }
    log
}

proptest! {
    #![proptest_config(common::config(
        1024,
        concat!(env!("CARGO_MANIFEST_DIR"), "/proptest-regressions/window.txt"),
    ))]

    /// Any log, any `now`, any cost: the crate does what the rules say.
    #[test]
    fn check_matches_the_rules(
        (limit, w) in any_window(),
        now in prop_oneof![
            4 => 0u64..=1000,
            4 => 0u64..=MAX_TIME_US,
            1 => MAX_TIME_US - 100..=MAX_TIME_US,
            1 => any::<u64>(),
        ],
        raw in prop::collection::vec((any::<u64>(), any::<u8>()), 0..24),
        len in 0usize..24,
        sort in prop::bool::weighted(0.85),
        cost in prop_oneof![3 => 0u32..=7, 1 => any::<u32>()],
    ) {
        let log = log_of(now.min(MAX_TIME_US), w, &raw, sort, len);
        let win = window(limit, w);
        let got = win.check(&log, now, cost);
        if is_sorted(&log) {
            // A store that keeps its logs sorted gets the same answer,
            // in one slice or in two (a ring's halves) split anywhere.
            prop_assert_eq!(win.check_sorted(&log, now, cost), got);
            for at in 0..=log.len() {
                let (first, second) = log.split_at(at);
                prop_assert_eq!(
                    win.check_sorted_parts([first, second], now, cost),
                    got,
                    "split at {}", at
                );
            }
        }
        let spec = spec_check(limit, w, &log, now, cost);
        prop_assert_eq!(
            got.as_ref().map(|d| observed(&log, d)).map_err(|e| *e),
            spec,
            "log {:?} now {} cost {}", log, now, cost
        );
        if let Ok(d) = got {
            // Every refusal's wait and every reset is within one window.
            prop_assert!(d.retry_after_us <= w && d.reset_after_us <= w);
            if !d.allowed {
                prop_assert!(d.retry_after_us >= 1);
            }
            if let Some(write) = d.write {
                prop_assert!(is_sorted(&applied(&log, &write)));
                prop_assert_eq!(write.entry_us, now);
                // The fixed-buffer store ends with the same log.
                let mut buffer = log.clone();
                buffer.resize(log.len() + write.append, u64::MAX);
                let n = write.apply_in(&mut buffer, log.len());
                prop_assert_eq!(n.map(|n| buffer[..n].to_vec()), Some(applied(&log, &write)));
            }
        }
    }

    /// The promise, against every request that ever passed: never `N + 1`
    /// in any `W` consecutive microseconds; a request passes exactly when
    /// its cost fits beside those counted; `retry_after` is exact; the log
    /// stays sorted, at most `N` long, and after a pass holds exactly the
    /// history's counted requests.
    #[test]
    fn history_never_exceeds_the_limit(
        (limit, w) in small(),
        start in 0u64..1000,
        steps in prop::collection::vec((0u64..100, 0u32..=8), 1..60),
    ) {
        let win = window(limit, w);
        let (n_limit, w_i) = (u64::from(limit), i128::from(w));
        let mut now = start;
        let mut log: Vec<u64> = Vec::new();
        let mut history: Vec<u64> = Vec::new();
        // Counted by brute force: passed requests in (at - W, at].
        let counted = |history: &[u64], at: u64| {
            history
                .iter()
                .filter(|&&h| i128::from(h) > i128::from(at) - w_i && h <= at)
                .count() as u64
        };
        for (advance, cost) in steps {
            // Mostly small steps, sometimes a jump beyond the window.
            now += if advance < 90 { advance % (w / 2 + 2) } else { advance };
            let cost = cost % (limit + 2);
            let result = win.check(&log, now, cost);
            if cost > limit {
                prop_assert_eq!(
                    result,
                    Err(CheckError::CostExceedsBurst { cost, burst: limit })
                );
                continue;
            }
            let d = result.unwrap();
            let count = counted(&history, now);
            let newest = history.iter().copied().filter(|&h| h + w > now).max();
            // Until the newest counted entry expires: after a pass, the
            // request itself.
            let reset = if d.allowed && cost > 0 {
                w
            } else {
                newest.map_or(0, |h| h + w - now)
            };
            prop_assert_eq!(d.reset_after_us, reset, "reset at {}", now);
            if cost == 0 {
                prop_assert!(d.allowed && d.write.is_none());
                prop_assert_eq!(d.remaining, n_limit.saturating_sub(count));
                continue;
            }
            let fits = count + u64::from(cost) <= n_limit;
            prop_assert_eq!(d.allowed, fits, "count {} cost {} at {}", count, cost, now);
            if fits {
                prop_assert_eq!(d.remaining, n_limit - count - u64::from(cost));
            } else {
                // The first instant at which the cost fits, by brute force.
                let wait = (1..=w)
                    .find(|&dt| counted(&history, now + dt) + u64::from(cost) <= n_limit)
                    .expect("every entry expires within W");
                prop_assert_eq!(d.retry_after_us, wait);
                let later = win.check(&log, now + wait, cost).unwrap();
                prop_assert!(later.allowed, "passes at now + retry_after");
                let earlier = win.check(&log, now + wait - 1, cost).unwrap();
                prop_assert!(!earlier.allowed, "not one µs earlier");
                // A monotone clock leaves nothing ahead: nothing to write.
                prop_assert_eq!(d.write, None);
            }
            if let Some(write) = d.write {
                log = applied(&log, &write);
                history.extend(std::iter::repeat_n(now, cost as usize));
                let live: Vec<u64> =
                    history.iter().copied().filter(|&h| h + w > now).collect();
                prop_assert_eq!(&log, &live, "the log is the counted history");
            }
            prop_assert!(is_sorted(&log));
            prop_assert!(log.len() <= limit as usize);
        }
        // Every W consecutive microseconds, from before the first request
        // to after the last.
        let last = history.last().copied().unwrap_or(start);
        for a in start.saturating_sub(w)..=last {
            let in_window = history.iter().filter(|&&h| h >= a && h < a + w).count();
            prop_assert!(
                in_window as u64 <= n_limit,
                "{} requests in [{}, {})", in_window, a, a + w
            );
        }
    }

    /// Clocks that go back (or writers whose clocks disagree): decisions
    /// still follow the rules, the log stays sorted and at most `N` long,
    /// and no entry is held for more than one window after a jump.
    #[test]
    fn clock_jumps_keep_the_log_sound(
        (limit, w) in small(),
        start in 100u64..1000,
        steps in prop::collection::vec((any::<i16>(), 0u32..=6), 1..80),
    ) {
        let win = window(limit, w);
        let mut now = start;
        let mut log: Vec<u64> = Vec::new();
        for (shift, cost) in steps {
            now = now.saturating_add_signed(i64::from(shift % 60));
            let cost = cost % (limit + 1);
            let d = win.check(&log, now, cost).unwrap();
            let spec = spec_check(limit, w, &log, now, cost).unwrap();
            prop_assert_eq!(observed(&log, &d), spec, "log {:?} now {}", log, now);
            if let Some(write) = d.write {
                log = applied(&log, &write);
                // After any write, nothing is ahead of the writer's clock.
                prop_assert!(log.iter().all(|&t| t <= now));
            }
            prop_assert!(is_sorted(&log));
            prop_assert!(log.len() <= limit as usize);
        }
    }

    /// `apply_in` keeps what `kept` keeps, appends what it says, and leaves
    /// a buffer that is too short untouched.
    #[test]
    fn apply_in_matches_a_vec(
        log in prop::collection::vec(0u64..100, 0..12),
        drop_oldest in 0usize..14,
        drop_newest in 0usize..14,
        append in 0usize..14,
        spare in 0usize..14,
    ) {
        let write = LogWrite { drop_oldest, drop_newest, append, entry_us: 500, ttl_ms: 1 };
        let kept = write.kept(log.len());
        prop_assert!(kept.start <= kept.end && kept.end <= log.len());
        let mut expected = log[kept].to_vec();
        expected.extend(std::iter::repeat_n(500, append));
        let mut buffer = log.clone();
        buffer.extend(std::iter::repeat_n(u64::MAX, spare));
        let before = buffer.clone();
        match write.apply_in(&mut buffer, log.len()) {
            Some(n) => prop_assert_eq!(&buffer[..n], &expected[..]),
            None => {
                prop_assert!(expected.len() > buffer.len());
                prop_assert_eq!(buffer, before);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Construction and named edges.
// ---------------------------------------------------------------------------

#[test]
fn construction_bounds() {
    let second = Duration::from_secs(1);
    assert_eq!(Window::new(0, second), Err(WindowError::ZeroLimit));
    assert_eq!(
        Window::new(MAX_WINDOW_LIMIT + 1, second),
        Err(WindowError::LimitTooLarge)
    );
    assert_eq!(Window::new(MAX_WINDOW_LIMIT, second).unwrap().limit(), 1024);
    assert_eq!(Window::new(1, Duration::ZERO), Err(WindowError::ZeroWindow));
    assert_eq!(
        Window::new(1, Duration::from_nanos(1999))
            .unwrap()
            .window_us(),
        1,
        "truncated to the microsecond"
    );
    let longest = Duration::from_micros(MAX_WINDOW_US);
    assert_eq!(Window::new(1, longest).unwrap().window_us(), MAX_WINDOW_US);
    assert_eq!(
        Window::new(1, longest + Duration::from_micros(1)),
        Err(WindowError::OutOfRange)
    );
    assert_eq!(Window::new(1, Duration::MAX), Err(WindowError::OutOfRange));
}

#[test]
fn an_entry_counts_for_exactly_w_microseconds() {
    let win = window(1, 10);
    let log = [100];
    for now in 100..110 {
        assert!(!win.check(&log, now, 1).unwrap().allowed, "at {now}");
    }
    let d = win.check(&log, 110, 1).unwrap();
    assert!(d.allowed);
    assert_eq!(d.write.unwrap().drop_oldest, 1);
    // W = 1 µs: N per microsecond.
    let per_us = window(2, 1);
    assert!(!per_us.check(&[7, 7], 7, 1).unwrap().allowed);
    assert!(per_us.check(&[7, 7], 8, 2).unwrap().allowed);
}

#[test]
fn a_lowered_limit_waits_for_the_excess_to_expire() {
    // Five counted, written under a limit of 5; the limit is now 2.
    let win = window(2, 100);
    let log = [10, 20, 30, 40, 50];
    let d = win.check(&log, 60, 1).unwrap();
    assert!(!d.allowed);
    // 5 + 1 - 2 = 4 must expire: the one at 40, at 140.
    assert_eq!(d.retry_after_us, 80);
    assert_eq!(d.reset_after_us, 90);
    assert_eq!(win.check(&log, 60, 0).unwrap().remaining, 0);
    assert!(win.check(&log, 140, 1).unwrap().allowed);
}

#[test]
fn time_out_of_range() {
    let win = window(3, 10);
    assert_eq!(
        win.check(&[], MAX_TIME_US + 1, 1),
        Err(CheckError::TimeOutOfRange)
    );
    assert_eq!(
        win.check(&[], MAX_TIME_US + 1, 0),
        Err(CheckError::TimeOutOfRange)
    );
    assert!(win.check(&[MAX_TIME_US], MAX_TIME_US, 1).unwrap().allowed);
}

#[test]
fn garbage_is_dropped_by_a_pass_but_not_by_a_refusal() {
    let win = window(1, 10);
    let garbage = MAX_TIME_US + 5;
    let d = win.check(&[5, garbage], 6, 1).unwrap();
    assert!(!d.allowed);
    assert_eq!(d.write, None, "nothing ahead: a refusal writes nothing");
    let d = win.check(&[5, garbage], 15, 1).unwrap();
    assert_eq!(applied(&[5, garbage], &d.write.unwrap()), [15]);
}

#[test]
fn error_messages() {
    assert_eq!(
        WindowError::ZeroLimit.to_string(),
        "window limit must be at least 1"
    );
    assert_eq!(
        WindowError::LimitTooLarge.to_string(),
        "window limit exceeds 1024 (MAX_WINDOW_LIMIT)"
    );
    assert_eq!(
        WindowError::ZeroWindow.to_string(),
        "window must be at least 1 microsecond"
    );
    assert_eq!(
        WindowError::OutOfRange.to_string(),
        "window exceeds 2^50 microseconds"
    );
}

/// A log in two parts whose older part ends after the newer one begins:
/// a caller's bug, caught in debug builds.
#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "check_sorted of an unsorted log")]
fn check_sorted_parts_catches_parts_out_of_order() {
    let window = Window::new(3, Duration::from_micros(100)).unwrap();
    let _ = window.check_sorted_parts([&[50], &[40]], 60, 1);
}

/// An older part out of order in itself, beside an empty newer one.
#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "check_sorted of an unsorted log")]
fn check_sorted_parts_catches_a_part_out_of_order() {
    let window = Window::new(3, Duration::from_micros(100)).unwrap();
    let _ = window.check_sorted_parts([&[50, 40], &[]], 60, 1);
}
