//! `MemoryStorage`'s windows and periods (src/memory/kinds.rs): a window's
//! exact count and waits, against a naive list of pass times; a period's
//! calendar (months, a leap February, a fixed offset, ISO weeks, days);
//! one decision all or nothing across rates, windows and periods, with
//! shadow limits; exact counts under threads; random decisions against a
//! model of gcra-core's rules over a map; and the capacity bound.
//!
//! Plain threads and a fake clock: no runtime while a store is built (so no
//! background sweeper), no sleep. Tests that could hang (a deadlock, a
//! livelock) run under a watchdog that fails them instead.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{
    BucketCheck, CheckError, Decided, Decision, LimitName, MemoryStorage,
    Period, PeriodUnit, Quota, Rule, Storage, StorageError, StorageEvent,
    Verdict, Window,
};

const START_US: u64 = 1_790_947_094_000_000;
const SECOND: u64 = 1_000_000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

// ---------------------------------------------------------------------------
// Helpers

fn limit(name: &'static str) -> LimitName {
    LimitName::of_limit(name).unwrap()
}

fn window(limit: u32, secs: u64) -> Rule {
    Window::new(limit, Duration::from_secs(secs))
        .unwrap()
        .into()
}

fn period(limit: u32, unit: PeriodUnit, offset_s: i32) -> Rule {
    Period::new(limit, unit, offset_s).unwrap().into()
}

fn store_at(now_us: u64) -> (FakeClock, MemoryStorage) {
    let clock = FakeClock::at_us(now_us);
    (clock.clone(), MemoryStorage::with_clock(clock))
}

/// One decision over `checks`: the store's answer and each bucket's part.
fn decide(
    store: &MemoryStorage,
    checks: &[BucketCheck<'_>],
) -> (Decided, Vec<Decision>) {
    let mut out = vec![Decision::default(); checks.len()];
    let decided = store.check_sync(checks, &mut out).unwrap();
    (decided, out)
}

/// One enforced check of `cost` on one bucket of any kind.
fn one(
    store: &MemoryStorage,
    name: &LimitName,
    user: &str,
    rule: Rule,
    cost: u32,
) -> Decision {
    let check = BucketCheck::of_rule(name, user, rule, cost).unwrap();
    let (decided, out) = decide(store, &[check]);
    assert_eq!(decided.verdict.allowed, out[0].allowed);
    assert_eq!(out[0].store, None, "a window or a period has no TAT");
    out[0]
}

/// A read of one bucket: always allowed, never a write.
fn peek(
    store: &MemoryStorage,
    name: &LimitName,
    user: &str,
    rule: Rule,
) -> Decision {
    let check = BucketCheck::of_rule(name, user, rule, 0).unwrap();
    let (decided, out) = decide(store, &[check]);
    assert!(decided.verdict.allowed && out[0].allowed, "a peek refused");
    assert_eq!(out[0].store, None);
    out[0]
}

/// `(allowed, remaining, retry_after, reset_after)` of a decision.
fn parts(d: Decision) -> (bool, u64, u64, u64) {
    (d.allowed, d.remaining, d.retry_after_us, d.reset_after_us)
}

/// Runs `f` on a thread of its own and fails the test if it has not
/// finished within `limit`: a deadlock or a livelock fails, never hangs.
fn finishes_within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done, finished) = mpsc::channel();
    let handle = thread::spawn(move || {
        let value = f();
        let _ = done.send(());
        value
    });
    match finished.recv_timeout(limit) {
        Ok(()) | Err(RecvTimeoutError::Disconnected) => handle.join().unwrap(),
        Err(RecvTimeoutError::Timeout) => {
            panic!(
                "{what}: still running after {limit:?} (deadlock or livelock)"
            )
        }
    }
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar
/// (Howard Hinnant's `days_from_civil`): the test's own calendar, the other
/// way round from gcra-core's `civil_from_days`.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let march_month = (month + 9) % 12;
    let day_of_year = (153 * march_month + 2) / 5 + day - 1;
    let day_of_era =
        year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The instant (µs since the epoch) of a UTC date and time.
fn utc(year: i64, month: i64, day: i64, hour: u64, minute: u64) -> u64 {
    let days = u64::try_from(days_from_civil(year, month, day)).unwrap();
    days * DAY + hour * HOUR + minute * MINUTE
}

/// 0 for Monday ... 6 for Sunday (1970-01-01 was a Thursday).
fn weekday(instant_us: u64) -> u64 {
    (instant_us / DAY + 3) % 7
}

#[test]
fn the_tests_calendar_is_the_real_one() {
    assert_eq!(utc(1970, 1, 1, 0, 0), 0);
    assert_eq!(utc(2024, 2, 1, 0, 0), 19_754 * DAY); // gcra-core's docs
    assert_eq!(utc(2024, 3, 1, 0, 0), 1_709_251_200_000_000);
    assert_eq!(utc(2028, 3, 1, 0, 0) - utc(2028, 2, 1, 0, 0), 29 * DAY);
    assert_eq!(utc(2027, 3, 1, 0, 0) - utc(2027, 2, 1, 0, 0), 28 * DAY);
    assert_eq!(utc(2100, 3, 1, 0, 0) - utc(2100, 2, 1, 0, 0), 28 * DAY);
    assert_eq!(utc(2000, 3, 1, 0, 0) - utc(2000, 2, 1, 0, 0), 29 * DAY);
    assert_eq!(weekday(utc(2024, 1, 1, 0, 0)), 0); // a Monday
    assert_eq!(weekday(utc(2027, 1, 11, 0, 0)), 0);
}

// ---------------------------------------------------------------------------
// 1. An exact sliding window

#[test]
fn a_window_of_5_per_minute_waits_exactly_for_its_oldest_request() {
    let (clock, store) = store_at(START_US);
    let login = limit("login");
    let rule = window(5, 60);
    // Five at 0 s, 1 s, ..., 4 s: each counted for exactly 60 s.
    for k in 0..5 {
        clock.set_us(START_US + k * SECOND);
        let d = one(&store, &login, "ana", rule, 1);
        assert_eq!(parts(d), (true, 4 - k, 0, MINUTE), "request {k}");
    }
    // The sixth, at 10 s: until the one at 0 s leaves (60 s), and every
    // counted one has left when the one at 4 s does (64 s).
    clock.set_us(START_US + 10 * SECOND);
    let sixth = one(&store, &login, "ana", rule, 1);
    assert_eq!(parts(sixth), (false, 0, 50 * SECOND, 54 * SECOND));
    // Two at once wait for the two oldest: the one at 1 s leaves at 61 s.
    let two = one(&store, &login, "ana", rule, 2);
    assert_eq!(parts(two), (false, 0, 51 * SECOND, 54 * SECOND));
    // A refusal counts nothing: a peek reads the same five.
    assert_eq!(
        parts(peek(&store, &login, "ana", rule)),
        (true, 0, 0, 54 * SECOND)
    );
    // A microsecond before the oldest leaves: still refused, 1 µs to wait.
    clock.set_us(START_US + MINUTE - 1);
    let early = one(&store, &login, "ana", rule, 1);
    assert_eq!(parts(early), (false, 0, 1, 4 * SECOND + 1));
    // At that instant exactly one passes, and the next waits for the one
    // at 1 s.
    clock.set_us(START_US + MINUTE);
    let passes = one(&store, &login, "ana", rule, 1);
    assert_eq!(parts(passes), (true, 0, 0, MINUTE));
    let next = one(&store, &login, "ana", rule, 1);
    assert_eq!(parts(next), (false, 0, SECOND, MINUTE));
    // Another user's window is its own.
    assert_eq!(one(&store, &login, "bo", rule, 5).remaining, 0);
    // A minute after the newest, the window is empty again.
    clock.set_us(START_US + 2 * MINUTE);
    assert_eq!(
        parts(peek(&store, &login, "ana", rule)),
        (true, 5, 0, 0),
        "every counted request has left"
    );
    assert_eq!(one(&store, &login, "ana", rule, 5).remaining, 0);
}

mod oracle {
    use proptest::prelude::*;

    use super::*;

    const LIMIT: u32 = 5;
    const W: u64 = 60 * SECOND;

    /// A request: the time since the previous one, and its cost.
    fn request() -> impl Strategy<Value = (u64, u32)> {
        (
            prop_oneof![
                2 => Just(0u64),
                4 => 0..5 * SECOND,
                3 => 0..W,
                1 => Just(W),
                1 => W - 1..W + 2,
            ],
            prop_oneof![4 => Just(1u32), 1 => 0..=LIMIT],
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The store's every answer is a naive list of pass times': a pass
        /// exactly when the requests of the last 60 s leave room, a wait
        /// exactly until enough of them leave; and no 60 s ever hold more
        /// than 5.
        #[test]
        fn a_window_is_a_list_of_pass_times(
            schedule in proptest::collection::vec(request(), 1..200),
        ) {
            let (clock, store) = store_at(START_US);
            let login = limit("login");
            let rule = Rule::from(
                Window::new(LIMIT, Duration::from_micros(W)).unwrap(),
            );
            // Each unit of cost of each pass, oldest first.
            let mut passes: Vec<u64> = Vec::new();
            let mut now = START_US;
            for (elapsed, cost) in schedule {
                now += elapsed;
                clock.set_us(now);
                let d = one(&store, &login, "ana", rule, cost);
                // Counted: made in the last W µs (t + W > now).
                let counted: Vec<u64> =
                    passes.iter().copied().filter(|&t| t + W > now).collect();
                let count = counted.len() as u64;
                let reset = counted.last().map_or(0, |&t| t + W - now);
                let need = count + u64::from(cost);
                let expected = if cost == 0 {
                    (true, u64::from(LIMIT) - count, 0, reset)
                } else if need <= u64::from(LIMIT) {
                    (true, u64::from(LIMIT) - need, 0, W)
                } else {
                    // The (need - limit)-th oldest counted must leave.
                    let k = (need - u64::from(LIMIT)) as usize;
                    (false, 0, counted[k - 1] + W - now, reset)
                };
                prop_assert_eq!(parts(d), expected, "at {}", now - START_US);
                if d.allowed {
                    passes.extend(std::iter::repeat_n(now, cost as usize));
                }
            }
            // No W consecutive microseconds hold more than the limit: the
            // worst window starts at a pass.
            for &start in &passes {
                let within =
                    passes.iter().filter(|&&t| t >= start && t < start + W);
                prop_assert!(within.count() <= LIMIT as usize);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// 2. Calendar periods

/// `limit` passes at `at`, then a refusal that waits exactly until `next`.
fn fill_then_wait(
    clock: &FakeClock,
    store: &MemoryStorage,
    name: &LimitName,
    rule: Rule,
    at: u64,
    next: u64,
) {
    clock.set_us(at);
    let limit = u64::from(rule.limit());
    for k in 0..limit {
        let d = one(store, name, "ana", rule, 1);
        assert_eq!(parts(d), (true, limit - 1 - k, 0, next - at), "pass {k}");
    }
    let refused = one(store, name, "ana", rule, 1);
    assert_eq!(parts(refused), (false, 0, next - at, next - at));
    // A microsecond before the next period: still refused.
    clock.set_us(next - 1);
    assert_eq!(parts(one(store, name, "ana", rule, 1)), (false, 0, 1, 1));
}

#[test]
fn three_a_calendar_month_in_utc() {
    let jan_1 = utc(2027, 1, 1, 0, 0);
    let feb_1 = utc(2027, 2, 1, 0, 0);
    let mar_1 = utc(2027, 3, 1, 0, 0);
    let (clock, store) = store_at(jan_1);
    let exports = limit("exports");
    let monthly = period(3, PeriodUnit::Month, 0);

    // Exactly three in January, wherever in the month.
    for (k, at) in [jan_1, utc(2027, 1, 15, 12, 0), feb_1 - MINUTE]
        .into_iter()
        .enumerate()
    {
        clock.set_us(at);
        let d = one(&store, &exports, "ana", monthly, 1);
        assert_eq!(parts(d), (true, 2 - k as u64, 0, feb_1 - at), "pass {k}");
    }
    let fourth = one(&store, &exports, "ana", monthly, 1);
    assert_eq!(parts(fourth), (false, 0, MINUTE, MINUTE));
    clock.set_us(feb_1 - 1);
    assert_eq!(
        parts(one(&store, &exports, "ana", monthly, 1)),
        (false, 0, 1, 1)
    );
    // On February 1st at midnight UTC: three again, then until March 1st
    // (2027 is no leap year: 28 days).
    fill_then_wait(&clock, &store, &exports, monthly, feb_1, mar_1);
    assert_eq!(mar_1 - feb_1, 28 * DAY);
    clock.set_us(mar_1);
    assert_eq!(one(&store, &exports, "ana", monthly, 3).remaining, 0);
}

#[test]
fn a_leap_february_ends_on_the_29th() {
    let feb_1 = utc(2028, 2, 1, 0, 0);
    let feb_29 = utc(2028, 2, 29, 0, 0);
    let mar_1 = utc(2028, 3, 1, 0, 0);
    let (clock, store) = store_at(feb_1);
    let exports = limit("exports");
    let monthly = period(3, PeriodUnit::Month, 0);
    // A pass on the 1st resets in 29 days.
    fill_then_wait(&clock, &store, &exports, monthly, feb_1, mar_1);
    assert_eq!(mar_1 - feb_1, 29 * DAY);
    // The 29th is still February: refused, a day to wait.
    clock.set_us(feb_29);
    let d = one(&store, &exports, "ana", monthly, 1);
    assert_eq!(parts(d), (false, 0, DAY, DAY));
    // March 1st starts a new period.
    clock.set_us(mar_1);
    let d = one(&store, &exports, "ana", monthly, 1);
    assert_eq!(parts(d), (true, 2, 0, 31 * DAY));

    // And a user who first comes on the 29th counts in February.
    clock.set_us(feb_29 + 12 * HOUR);
    fill_then_wait(
        &clock,
        &store,
        &limit("reports"),
        monthly,
        feb_29 + 12 * HOUR,
        mar_1,
    );
}

#[test]
fn a_fixed_offset_moves_the_boundary() {
    // UTC+05:30: February starts on January 31st at 18:30 UTC.
    let india = period(3, PeriodUnit::Month, 5 * 3600 + 1800);
    let in_utc = period(3, PeriodUnit::Month, 0);
    let local_feb_1 = utc(2027, 1, 31, 18, 30);
    let (clock, store) = store_at(utc(2027, 1, 31, 18, 0));
    let (exports, reports) = (limit("exports"), limit("reports"));
    fill_then_wait(
        &clock,
        &store,
        &exports,
        india,
        utc(2027, 1, 31, 18, 0),
        local_feb_1,
    );
    fill_then_wait(
        &clock,
        &store,
        &reports,
        in_utc,
        utc(2027, 1, 31, 18, 0),
        utc(2027, 2, 1, 0, 0),
    );
    clock.set_us(local_feb_1);
    // In India it is February: three again, until March 1st 00:00 IST.
    let d = one(&store, &exports, "ana", india, 1);
    assert_eq!(
        parts(d),
        (true, 2, 0, utc(2027, 2, 28, 18, 30) - local_feb_1)
    );
    // In UTC it is still January: five and a half hours to wait.
    let d = one(&store, &reports, "ana", in_utc, 1);
    assert_eq!(
        parts(d),
        (false, 0, 5 * HOUR + 30 * MINUTE, 5 * HOUR + 30 * MINUTE)
    );
}

#[test]
fn a_week_starts_on_monday_and_a_day_at_local_midnight() {
    // 2027-01-06 is a Wednesday; its ISO week ends on Sunday the 10th.
    let wednesday = utc(2027, 1, 6, 10, 0);
    let monday = utc(2027, 1, 11, 0, 0);
    assert_eq!((weekday(wednesday), weekday(monday)), (2, 0));
    let (clock, store) = store_at(wednesday);
    let weekly = period(2, PeriodUnit::Week, 0);
    let uploads = limit("uploads");
    fill_then_wait(&clock, &store, &uploads, weekly, wednesday, monday);
    clock.set_us(monday);
    let d = one(&store, &uploads, "ana", weekly, 1);
    assert_eq!(parts(d), (true, 1, 0, 7 * DAY));

    // A day at UTC-08:00: local midnight is 08:00 UTC.
    let daily = period(2, PeriodUnit::Day, -8 * 3600);
    let searches = limit("searches");
    let late = utc(2027, 3, 10, 7, 0); // 23:00 on the 9th, local
    fill_then_wait(
        &clock,
        &store,
        &searches,
        daily,
        late,
        utc(2027, 3, 10, 8, 0),
    );
    clock.set_us(utc(2027, 3, 10, 8, 0));
    let d = one(&store, &searches, "ana", daily, 2);
    assert_eq!(parts(d), (true, 0, 0, DAY));

    // A day in UTC.
    let utc_daily = period(1, PeriodUnit::Day, 0);
    fill_then_wait(
        &clock,
        &store,
        &limit("exports"),
        utc_daily,
        utc(2027, 3, 10, 8, 0),
        utc(2027, 3, 11, 0, 0),
    );
}

// ---------------------------------------------------------------------------
// 3. One decision, all or nothing

#[test]
fn a_window_refusal_charges_no_rate_and_no_period() {
    let (clock, store) = store_at(START_US);
    let (plan, login, exports) = (
        LimitName::new("plan").unwrap(),
        limit("login"),
        limit("exports"),
    );
    let rate = Quota::per_minute(10);
    let (win, per) = (window(2, 60), period(3, PeriodUnit::Month, 0));
    assert!(one(&store, &login, "ana", win, 2).allowed);
    clock.advance(Duration::from_secs(10));

    for position in 0..3 {
        // The window in every position of the decision.
        let mut checks = vec![
            BucketCheck::new(&plan, "ana", rate, 3).unwrap(),
            BucketCheck::of_rule(&exports, "ana", per, 1).unwrap(),
        ];
        checks.insert(
            position,
            BucketCheck::of_rule(&login, "ana", win, 1).unwrap(),
        );
        let (decided, out) = decide(&store, &checks);
        assert_eq!(
            decided.verdict,
            Verdict {
                allowed: false,
                retry_after_us: 50 * SECOND,
                refused_by: Some(position),
            }
        );
        for (i, d) in out.iter().enumerate() {
            if i == position {
                assert_eq!(parts(*d), (false, 0, 50 * SECOND, 50 * SECOND));
            } else {
                // Would have passed, uncharged: the bucket as it stands.
                assert!(d.allowed && d.store.is_none(), "{i}: {d:?}");
            }
        }
        let rate_out = out[if position == 0 { 1 } else { 0 }];
        assert_eq!((rate_out.remaining, rate_out.reset_after_us), (10, 0));
        let period_out = out[if position == 2 { 1 } else { 2 }];
        assert_eq!(period_out.remaining, 3);
    }
    // Nothing was charged: the rate is full, the period untouched.
    let rate_peek = decide(&store, &[BucketCheck::peek(&plan, "ana", rate)]).1;
    assert_eq!(
        (rate_peek[0].remaining, rate_peek[0].reset_after_us),
        (10, 0)
    );
    assert_eq!(peek(&store, &exports, "ana", per).remaining, 3);
    assert_eq!(store.len(), 1, "only the window is held");
}

#[test]
fn a_rate_refusal_appends_nothing_to_a_window_and_counts_nothing_in_a_period() {
    let (clock, store) = store_at(START_US);
    let (plan, login, exports) = (
        LimitName::new("plan").unwrap(),
        limit("login"),
        limit("exports"),
    );
    let rate = Quota::per_minute(1); // a burst of 1
    let (win, per) = (window(5, 60), period(3, PeriodUnit::Month, 0));
    assert!(
        decide(&store, &[BucketCheck::new(&plan, "ana", rate, 1).unwrap()])
            .0
            .verdict
            .allowed
    );
    for k in 0..10 {
        let checks = [
            BucketCheck::of_rule(&login, "ana", win, 1).unwrap(),
            BucketCheck::new(&plan, "ana", rate, 1).unwrap(),
            BucketCheck::of_rule(&exports, "ana", per, 1).unwrap(),
        ];
        let (decided, out) = decide(&store, &checks);
        assert!(!decided.verdict.allowed);
        assert_eq!(decided.verdict.refused_by, Some(1));
        assert_eq!(decided.verdict.retry_after_us, MINUTE - k * SECOND);
        // The window and the period would have passed: reported as they
        // stand, uncharged.
        assert_eq!(parts(out[0]), (true, 5, 0, 0));
        assert!(out[2].allowed);
        assert_eq!(out[2].remaining, 3);
        clock.advance(Duration::from_secs(1));
    }
    // Every refusal left the window empty and the period at 0: the next
    // decisions see all of them.
    assert_eq!(one(&store, &login, "ana", win, 1).remaining, 4);
    assert_eq!(one(&store, &login, "ana", win, 4).remaining, 0);
    assert_eq!(one(&store, &exports, "ana", per, 1).remaining, 2);
    assert_eq!(one(&store, &exports, "ana", per, 2).remaining, 0);
}

#[test]
fn a_shadow_window_that_would_refuse_refuses_nothing() {
    let (clock, store) = store_at(START_US);
    let (plan, login, exports) = (
        LimitName::new("plan").unwrap(),
        limit("login"),
        limit("exports"),
    );
    let rate = Quota::per_minute(10);
    let (win, per) = (window(2, 60), period(3, PeriodUnit::Month, 0));
    // Two counted, at 0 s and 5 s.
    assert!(one(&store, &login, "ana", win, 1).allowed);
    clock.advance(Duration::from_secs(5));
    assert!(one(&store, &login, "ana", win, 1).allowed);
    clock.advance(Duration::from_secs(5));
    let checks = [
        BucketCheck::new(&plan, "ana", rate, 1).unwrap(),
        BucketCheck::of_rule(&login, "ana", win, 1)
            .unwrap()
            .shadow(true),
        BucketCheck::of_rule(&exports, "ana", per, 1).unwrap(),
    ];
    let (decided, out) = decide(&store, &checks);
    assert_eq!(
        decided.verdict,
        Verdict {
            allowed: true,
            retry_after_us: 0,
            refused_by: None
        }
    );
    // The shadow window says it would have refused...
    assert_eq!(parts(out[1]), (false, 0, 50 * SECOND, 55 * SECOND));
    // ...and the others were charged.
    assert_eq!((out[0].allowed, out[0].remaining), (true, 9));
    assert!(out[2].allowed);
    assert_eq!(out[2].remaining, 2);
    // The refusing shadow window appended nothing: when its oldest leaves,
    // one passes (an entry appended at 10 s would still count), and the
    // next waits for the one at 5 s.
    clock.set_us(START_US + MINUTE);
    assert_eq!(
        parts(one(&store, &login, "ana", win, 1)),
        (true, 0, 0, MINUTE)
    );
    assert_eq!(
        parts(one(&store, &login, "ana", win, 1)),
        (false, 0, 5 * SECOND, MINUTE)
    );

    // A shadow period that would refuse is not charged either.
    let full = period(1, PeriodUnit::Month, 0);
    let reports = limit("reports");
    assert!(one(&store, &reports, "ana", full, 1).allowed);
    let checks = [
        BucketCheck::new(&plan, "ana", rate, 1).unwrap(),
        BucketCheck::of_rule(&reports, "ana", full, 1)
            .unwrap()
            .shadow(true),
    ];
    let (decided, out) = decide(&store, &checks);
    assert!(decided.verdict.allowed && !out[1].allowed);
    assert_eq!(peek(&store, &reports, "ana", full).remaining, 0);
    assert!(!one(&store, &reports, "ana", full, 1).allowed);
}

// ---------------------------------------------------------------------------
// 4. Under threads

/// `threads` threads, released together at one fixed instant, each making
/// `attempts` decisions of `checks(thread)`: how many passed, per thread.
fn race(
    store: &MemoryStorage,
    threads: usize,
    attempts: usize,
    checks: fn(usize, &[LimitName]) -> Vec<BucketCheck<'_>>,
) -> Vec<usize> {
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|thread_index| {
            let (store, barrier) = (store.clone(), barrier.clone());
            thread::spawn(move || {
                let names = [
                    limit("login"),
                    LimitName::new("plan").unwrap(),
                    limit("exports"),
                ];
                let checks = checks(thread_index, &names);
                let mut out = vec![Decision::default(); checks.len()];
                barrier.wait();
                (0..attempts)
                    .filter(|_| {
                        store
                            .check_sync(&checks, &mut out)
                            .unwrap()
                            .verdict
                            .allowed
                    })
                    .count()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn threads_on_one_window_get_exactly_its_limit() {
    let (_, store) = store_at(START_US);
    let passed = finishes_within(Duration::from_secs(60), "a window", {
        let store = store.clone();
        move || {
            race(&store, 64, 10, |_, names| {
                vec![
                    BucketCheck::of_rule(&names[0], "ana", window(5, 60), 1)
                        .unwrap(),
                ]
            })
        }
    });
    assert_eq!(passed.iter().sum::<usize>(), 5);
    assert_eq!(
        peek(&store, &limit("login"), "ana", window(5, 60)).remaining,
        0
    );
}

#[test]
fn threads_on_one_period_get_exactly_its_limit() {
    let (_, store) = store_at(START_US);
    let passed = finishes_within(Duration::from_secs(60), "a period", {
        let store = store.clone();
        move || {
            race(&store, 64, 10, |_, names| {
                vec![
                    BucketCheck::of_rule(
                        &names[2],
                        "ana",
                        period(7, PeriodUnit::Month, 0),
                        1,
                    )
                    .unwrap(),
                ]
            })
        }
    });
    assert_eq!(passed.iter().sum::<usize>(), 7);
}

/// A window of 5 and a rate of burst 3 of one user.
fn joint<'a>(names: &'a [LimitName]) -> Vec<BucketCheck<'a>> {
    vec![
        BucketCheck::of_rule(&names[0], "ana", window(5, 60), 1).unwrap(),
        BucketCheck::new(&names[1], "ana", Quota::per_minute(3), 1).unwrap(),
    ]
}

#[test]
fn threads_on_a_window_and_a_rate_pass_exactly_the_smaller() {
    let (_, store) = store_at(START_US);
    let passed = finishes_within(Duration::from_secs(60), "joint", {
        let store = store.clone();
        move || race(&store, 64, 10, |_, names| joint(names))
    });
    assert_eq!(passed.iter().sum::<usize>(), 3);
    // Only the passes were charged, to both.
    let (plan, login) = (LimitName::new("plan").unwrap(), limit("login"));
    assert_eq!(peek(&store, &login, "ana", window(5, 60)).remaining, 2);
    let rate = decide(
        &store,
        &[BucketCheck::peek(&plan, "ana", Quota::per_minute(3))],
    )
    .1;
    assert_eq!(rate[0].remaining, 0);
}

#[test]
fn joint_and_single_decisions_of_a_window_and_a_rate_never_exceed_either() {
    // A third of the threads decide the window and the rate together, a
    // third the window alone, a third the rate alone (the rates' lock-free
    // path, outside the kinds' lock).
    let (_, store) = store_at(START_US);
    let passed = finishes_within(Duration::from_secs(60), "mixed", {
        let store = store.clone();
        move || {
            race(&store, 63, 10, |thread_index, names| {
                let mut checks = joint(names);
                match thread_index % 3 {
                    0 => checks,
                    1 => vec![checks.remove(0)],
                    _ => vec![checks.remove(1)],
                }
            })
        }
    });
    let by = |kind: usize| -> usize {
        passed
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 == kind)
            .map(|(_, n)| n)
            .sum()
    };
    let (joint, window_alone, rate_alone) = (by(0), by(1), by(2));
    // Every attempt was at one instant: each limit was used up exactly.
    assert_eq!(joint + window_alone, 5, "{passed:?}");
    assert_eq!(joint + rate_alone, 3, "{passed:?}");
}

// ---------------------------------------------------------------------------
// 5. Against a model

/// `MemoryStorage` against a model: per bucket, gcra-core's state (a TAT,
/// a log, a period's start and count), decided by gcra-core and combined by
/// the rules of its crate docs ("Several kinds in one decision"). Random
/// decisions of one to three buckets of rates, windows and periods, with
/// peeks, costs above a limit, shadow limits and repeated buckets, at random
/// times: every answer, and every bucket after each decision, is the
/// model's.
mod model {
    use gcra_core::LogWrite;
    use proptest::prelude::*;

    use super::*;

    /// The limits a check may name, each with its rule.
    fn limits() -> Vec<(LimitName, Rule)> {
        vec![
            (
                LimitName::new("plan").unwrap(),
                Quota::per_minute(10).into(),
            ),
            (
                limit("search"),
                Quota::per_second(3).try_allow_burst(2).unwrap().into(),
            ),
            (limit("login"), window(3, 10)),
            // Not a whole number of milliseconds: its time to live rounds up.
            (
                limit("burst"),
                Window::new(4, Duration::from_micros(1_500_500))
                    .unwrap()
                    .into(),
            ),
            (limit("daily"), period(4, PeriodUnit::Day, 0)),
            (limit("weekly"), period(5, PeriodUnit::Week, -8 * 3600)),
            (
                limit("monthly"),
                period(6, PeriodUnit::Month, 5 * 3600 + 1800),
            ),
        ]
    }

    const USERS: [&str; 2] = ["ana", "bo"];

    #[derive(Debug, Clone)]
    struct Check {
        limit: usize,
        user: usize,
        cost: u32,
        shadow: bool,
    }

    fn check() -> impl Strategy<Value = Check> {
        (
            0..7usize,
            0..USERS.len(),
            prop_oneof![2 => Just(0u32), 6 => 1..=2u32, 1 => 0..=11u32],
            proptest::bool::weighted(0.2),
        )
            .prop_map(|(limit, user, cost, shadow)| Check {
                limit,
                user,
                cost,
                shadow,
            })
    }

    /// A decision and the time that passed before it.
    fn step() -> impl Strategy<Value = (u64, Vec<Check>)> {
        (
            prop_oneof![
                3 => Just(0u64),
                3 => 0..2 * SECOND,
                2 => 0..20 * SECOND,
                1 => 0..3 * DAY,
                1 => 0..40 * DAY,
            ],
            proptest::collection::vec(check(), 1..=3),
        )
    }

    /// What the model keeps per bucket.
    #[derive(Debug, Clone)]
    enum State {
        Tat(u64),
        Log(Vec<u64>),
        Count(u64, u32),
    }

    /// A decision's write, if it stands.
    enum Pending {
        Tat(u64),
        Log(LogWrite),
        Count(u64, u32),
    }

    /// `rule`'s own decision on `state` at `now`, and its write.
    fn own(
        rule: Rule,
        state: Option<&State>,
        now: u64,
        cost: u32,
    ) -> (Decision, Option<Pending>) {
        match rule {
            Rule::Rate(quota) => {
                let tat = match state {
                    Some(State::Tat(tat)) => Some(*tat),
                    _ => None,
                };
                let d = match cost {
                    0 => quota.peek(tat, now),
                    cost => quota.check(tat, now, cost),
                }
                .unwrap();
                (d, d.store.map(|s| Pending::Tat(s.tat_us)))
            }
            Rule::Window(window) => {
                let log = match state {
                    Some(State::Log(log)) => log.as_slice(),
                    _ => &[],
                };
                let d = window.check(log, now, cost).unwrap();
                (d.as_decision(), d.write.map(Pending::Log))
            }
            Rule::Period(period) => {
                let stored = match state {
                    Some(State::Count(start, count)) => Some((*start, *count)),
                    _ => None,
                };
                let d = period.check(stored, now, cost).unwrap();
                (
                    d.as_decision(),
                    d.write.map(|w| Pending::Count(w.start_us, w.count)),
                )
            }
            Rule::Concurrency(_) => unreachable!("not in the model"),
        }
    }

    fn apply(state: &mut Option<State>, write: Pending) {
        *state = Some(match write {
            Pending::Tat(tat) => State::Tat(tat),
            Pending::Count(start, count) => State::Count(start, count),
            Pending::Log(write) => {
                // As the docs of `LogWrite::kept` apply it.
                let mut log = match state.take() {
                    Some(State::Log(log)) => log,
                    _ => Vec::new(),
                };
                let kept = write.kept(log.len());
                log.truncate(kept.end);
                log.drain(..kept.start);
                log.extend(std::iter::repeat_n(write.entry_us, write.append));
                State::Log(log)
            }
        });
    }

    /// Bounded: a mutant that makes the store loop fails here instead of
    /// hanging.
    #[test]
    fn every_decision_is_the_models() {
        finishes_within(Duration::from_secs(120), "the model", || {
            let mut runner = proptest::test_runner::TestRunner::new(
                ProptestConfig::with_cases(256),
            );
            let steps = proptest::collection::vec(step(), 1..40);
            runner.run(&steps, decide_as_the_model).unwrap();
        });
    }

    fn decide_as_the_model(
        steps: Vec<(u64, Vec<Check>)>,
    ) -> Result<(), TestCaseError> {
        let limits = limits();
        let clock = FakeClock::at_us(START_US);
        let store = MemoryStorage::with_clock(clock.clone());
        let mut model: HashMap<(usize, usize), State> = HashMap::new();
        let mut now = START_US;
        for (elapsed, checks) in steps {
            now += elapsed;
            clock.set_us(now);
            // A cost above a limit is refused at the edge: no store sees it.
            let built: Result<Vec<BucketCheck<'_>>, CheckError> = checks
                .iter()
                .map(|c| {
                    let (name, rule) = &limits[c.limit];
                    BucketCheck::of_rule(name, USERS[c.user], *rule, c.cost)
                        .map(|check| check.shadow(c.shadow))
                })
                .collect();
            let above =
                checks.iter().find(|c| c.cost > limits[c.limit].1.limit());
            let built = match (built, above) {
                (Ok(built), None) => built,
                (Err(error), Some(c)) => {
                    prop_assert_eq!(
                        error,
                        CheckError::CostExceedsBurst {
                            cost: c.cost,
                            burst: limits[c.limit].1.limit(),
                        }
                    );
                    continue;
                }
                (built, above) => {
                    return Err(TestCaseError::fail(format!(
                        "{:?} for {above:?}",
                        built.map(|b| b.len())
                    )));
                }
            };
            let mut out = vec![Decision::default(); built.len()];
            let answer = store.check_sync(&built, &mut out);

            let mut seen = HashSet::new();
            if !checks.iter().all(|c| seen.insert((c.limit, c.user))) {
                prop_assert!(
                    matches!(answer, Err(StorageError::DuplicateBucket)),
                    "{answer:?}"
                );
                continue;
            }
            let decided = answer.unwrap();

            // 1. Each limit decided on its own.
            let mut expected = Vec::new();
            let mut writes = Vec::new();
            for c in &checks {
                let state = model.get(&(c.limit, c.user));
                let (d, write) = own(limits[c.limit].1, state, now, c.cost);
                expected.push(d);
                writes.push(write);
            }
            // 2. The verdict over them.
            let verdict =
                Verdict::of(checks.iter().map(|c| c.shadow), &expected);
            // 3. Allowed: every write. 4. Refused: a refusal's write (a
            // repair) only, and a limit that passed reads as it stands.
            for ((c, d), write) in checks.iter().zip(&mut expected).zip(writes)
            {
                let key = (c.limit, c.user);
                if verdict.allowed || !d.allowed {
                    if let Some(write) = write {
                        let mut state = model.remove(&key);
                        apply(&mut state, write);
                        model.extend(state.map(|s| (key, s)));
                    }
                } else {
                    *d = own(limits[c.limit].1, model.get(&key), now, 0).0;
                }
            }
            prop_assert_eq!(decided.verdict, verdict);
            prop_assert_eq!(decided.now_us, Some(now));
            prop_assert_eq!(&out, &expected, "{:?}", checks);

            // Every bucket as the model holds it, read alone.
            for (index, (name, rule)) in limits.iter().enumerate() {
                for (user, id) in USERS.iter().enumerate() {
                    let read =
                        BucketCheck::of_rule(name, id, *rule, 0).unwrap();
                    let mut got = [Decision::default()];
                    store.check_sync(&[read], &mut got).unwrap();
                    let state = model.get(&(index, user));
                    let want = own(*rule, state, now, 0).0;
                    prop_assert_eq!(
                        got[0],
                        want,
                        "limit {} user {}",
                        index,
                        user
                    );
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// 6. The capacity bound

#[test]
fn a_full_store_of_windows_and_periods_evicts_and_never_fails() {
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::builder()
        .clock(clock.clone())
        .capacity(8)
        .build();
    let (login, exports) = (limit("login"), limit("exports"));
    let (win, per) = (window(5, 60), period(3, PeriodUnit::Month, 0));
    // 40 one-shot users at one instant, a window and a period each: every
    // one gets a fresh bucket's answer, and the store holds at most 8.
    for k in 0..40 {
        let user = format!("u{k}");
        let d = one(&store, &login, &user, win, 1);
        assert_eq!(parts(d), (true, 4, 0, MINUTE), "{user}");
        assert!(store.len() <= 8, "{} held", store.len());
        let d = one(&store, &exports, &user, per, 1);
        assert_eq!((d.allowed, d.remaining), (true, 2), "{user}");
        assert!(store.len() <= 8, "{} held", store.len());
    }
    assert_eq!(store.len(), 8);
    assert_eq!(store.evictions(), 80 - 8);
    // Refusals and peeks store nothing and evict no one: u39's period
    // (the last bucket made) is spent, and decisions over it and a new
    // user's window are refused.
    assert_eq!(one(&store, &exports, "u39", per, 2).remaining, 0);
    for k in 0..20 {
        let user = format!("v{k}");
        let _ = peek(&store, &login, &user, win);
        let checks = [
            BucketCheck::of_rule(&login, &user, win, 1).unwrap(),
            BucketCheck::of_rule(&exports, "u39", per, 1).unwrap(),
        ];
        let (decided, out) = decide(&store, &checks);
        assert_eq!(decided.verdict.refused_by, Some(1));
        assert_eq!(parts(out[0]), (true, 5, 0, 0));
    }
    assert_eq!(store.evictions(), 72);
    assert_eq!(store.len(), 8);

    // Once the windows have expired, new ones take their place without an
    // eviction: the expired entries go first.
    clock.advance(Duration::from_secs(3600 * 24 * 40));
    let before = store.evictions();
    for k in 0..8 {
        assert!(one(&store, &login, &format!("w{k}"), win, 1).allowed);
    }
    assert_eq!(store.evictions(), before);
    store.sweep();
    assert!(store.len() <= 8);
}

#[test]
fn a_decision_in_a_full_store_never_evicts_its_own_buckets() {
    // The store holds ana's login window (4 of 5 spent, the entry nearest
    // to its expiry) and bo's. ana's decision over a new period and her
    // window needs a place: it must not be taken from her window, which
    // the same decision then charges.
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::builder()
        .clock(clock.clone())
        .capacity(2)
        .build();
    let (login, exports) = (limit("login"), limit("exports"));
    let (win, per) = (window(5, 60), period(3, PeriodUnit::Month, 0));
    assert!(one(&store, &login, "ana", win, 4).allowed);
    clock.advance(Duration::from_secs(1));
    assert!(one(&store, &login, "bo", win, 1).allowed);
    clock.advance(Duration::from_secs(1));
    let checks = [
        BucketCheck::of_rule(&exports, "ana", per, 1).unwrap(),
        BucketCheck::of_rule(&login, "ana", win, 1).unwrap(),
    ];
    let (decided, out) = decide(&store, &checks);
    assert!(decided.verdict.allowed);
    assert_eq!(out[1].remaining, 0);
    assert!(store.len() <= 2);
    // Her window holds the five it said it holds: the sixth is refused.
    assert_eq!(peek(&store, &login, "ana", win).remaining, 0);
    assert!(!one(&store, &login, "ana", win, 1).allowed);
    assert_eq!(peek(&store, &exports, "ana", per).remaining, 2);
}

#[test]
fn an_eviction_is_reported_outside_the_stores_lock() {
    // A listener may read the store it listens to (its size, for a
    // gauge): the report of an eviction must not hold the windows' lock.
    let store = MemoryStorage::builder()
        .clock(FakeClock::at_us(START_US))
        .capacity(2)
        .build();
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let subscription = Storage::subscribe(&store, {
        let (sizes, store) = (sizes.clone(), store.clone());
        Arc::new(move |event: &StorageEvent| {
            if let StorageEvent::Evicted { .. } = event {
                sizes.lock().unwrap().push(store.len());
            }
        })
    });
    let (done, finished) = mpsc::channel();
    thread::spawn({
        let store = store.clone();
        move || {
            let login = limit("login");
            for k in 0..5 {
                let d = one(&store, &login, &format!("u{k}"), window(5, 60), 1);
                assert!(d.allowed);
            }
            let _ = done.send(());
        }
    });
    if finished.recv_timeout(Duration::from_secs(10)).is_err() {
        // A deadlocked listener holds the registry: dropping the
        // subscription would wait for it too.
        std::mem::forget(subscription);
        panic!("a listener that reads the store deadlocked it");
    }
    assert_eq!(store.evictions(), 3);
    assert_eq!(*sizes.lock().unwrap(), [2, 2, 2]);
    drop(subscription);
}

// ---------------------------------------------------------------------------
// 7. Periods in the rates' table (src/memory/period.rs)

#[test]
fn a_bucket_whose_kind_changed_is_fresh() {
    // One limit name reloaded from a period to a rate and back: each kind
    // reads the other's word as absent, never as its own.
    let (clock, store) = store_at(utc(2027, 1, 10, 12, 0));
    let exports = limit("exports");
    let monthly = period(3, PeriodUnit::Month, 0);
    let rate: Rule = Quota::per_minute(2).into();
    assert_eq!(one(&store, &exports, "ana", monthly, 3).remaining, 0);
    // The spent period's word read by a rate: a full bucket.
    let d = decide(
        &store,
        &[BucketCheck::of_rule(&exports, "ana", rate, 1).unwrap()],
    )
    .1[0];
    assert_eq!((d.allowed, d.remaining), (true, 1));
    clock.advance(Duration::from_secs(1));
    // The rate's TAT read by the period: a fresh period.
    let d = one(&store, &exports, "ana", monthly, 1);
    assert_eq!((d.allowed, d.remaining), (true, 2));
    assert_eq!(
        d.reset_after_us,
        utc(2027, 2, 1, 0, 0) - utc(2027, 1, 10, 12, 0) - SECOND
    );
    assert_eq!(store.len(), 1, "one bucket, rewritten");
    // And under a joint decision too.
    let plan = LimitName::new("plan").unwrap();
    let checks = [
        BucketCheck::of_rule(&exports, "ana", rate, 1).unwrap(),
        BucketCheck::new(&plan, "ana", Quota::per_minute(5), 1).unwrap(),
    ];
    let (decided, out) = decide(&store, &checks);
    assert!(decided.verdict.allowed);
    assert_eq!(out[0].remaining, 1, "the period's word read as a full rate");
}

#[test]
fn a_joint_rate_and_period_refused_by_either_charges_neither() {
    let (clock, store) = store_at(utc(2027, 1, 31, 23, 59));
    let (plan, exports) = (LimitName::new("plan").unwrap(), limit("exports"));
    let rate = Quota::per_minute(2); // a burst of 2
    let monthly = period(2, PeriodUnit::Month, 0);
    let both = |cost_rate: u32, cost_period: u32| {
        [
            BucketCheck::new(&plan, "ana", rate, cost_rate).unwrap(),
            BucketCheck::of_rule(&exports, "ana", monthly, cost_period)
                .unwrap(),
        ]
    };
    // Both new: one pass charges both.
    let (decided, out) = decide(&store, &both(1, 1));
    assert!(decided.verdict.allowed);
    assert_eq!((out[0].remaining, out[1].remaining), (1, 1));
    assert_eq!(store.len(), 2);

    // The period refuses (2 asked, 1 left): the rate is not charged.
    let (decided, out) = decide(&store, &both(1, 2));
    assert_eq!(decided.verdict.refused_by, Some(1));
    assert!(out[0].allowed && out[0].store.is_none());
    assert_eq!(out[0].remaining, 1, "the rate as it stands");
    assert_eq!(parts(out[1]), (false, 0, MINUTE, MINUTE));

    // The rate refuses (2 asked, 1 left): the period is not charged.
    let (decided, out) = decide(&store, &both(2, 1));
    assert_eq!(decided.verdict.refused_by, Some(0));
    assert!(out[1].allowed && out[1].store.is_none());
    assert_eq!(out[1].remaining, 1, "the period as it stands");

    // Neither was charged: one of each is left.
    let rate_left =
        decide(&store, &[BucketCheck::peek(&plan, "ana", rate)]).1[0];
    assert_eq!(rate_left.remaining, 1);
    assert_eq!(peek(&store, &exports, "ana", monthly).remaining, 1);

    // Across the month boundary the period's word is a new period's, and
    // the joint decision charges both again.
    clock.set_us(utc(2027, 2, 1, 0, 0));
    let (decided, out) = decide(&store, &both(1, 2));
    assert!(decided.verdict.allowed);
    assert_eq!(out[1].remaining, 0);
    assert_eq!(out[1].reset_after_us, 28 * DAY);
}

#[test]
fn a_reset_makes_a_period_fresh_and_a_sweep_drops_it_after_its_period() {
    let (clock, store) = store_at(utc(2028, 2, 28, 12, 0));
    let exports = limit("exports");
    let monthly = period(2, PeriodUnit::Month, 5 * 3600 + 1800);
    assert_eq!(one(&store, &exports, "ana", monthly, 2).remaining, 0);
    let check = BucketCheck::of_rule(&exports, "ana", monthly, 1).unwrap();
    store.reset_sync(&[check]).unwrap();
    assert_eq!(one(&store, &exports, "ana", monthly, 1).remaining, 1);
    // A leap February in India ends on the 29th, 18:30 UTC: the word is
    // live until then, and swept after.
    let end = utc(2028, 2, 29, 18, 30);
    clock.set_us(end - 1);
    store.sweep();
    assert_eq!(store.len(), 1);
    assert_eq!(peek(&store, &exports, "ana", monthly).reset_after_us, 1);
    clock.set_us(end);
    store.sweep();
    assert_eq!(store.len(), 0);
}

#[test]
fn a_new_period_in_a_store_full_of_windows_takes_a_windows_place() {
    // The table holds nothing to evict: the period's place is a window's.
    let clock = FakeClock::at_us(START_US);
    let store = MemoryStorage::builder()
        .clock(clock.clone())
        .capacity(2)
        .build();
    let (login, exports) = (limit("login"), limit("exports"));
    let (win, per) = (window(5, 60), period(3, PeriodUnit::Month, 0));
    assert!(one(&store, &login, "ana", win, 1).allowed);
    assert!(one(&store, &login, "bo", win, 1).allowed);
    for k in 0..4 {
        let user = format!("u{k}");
        let d = one(&store, &exports, &user, per, 1);
        assert_eq!((d.allowed, d.remaining), (true, 2), "{user}");
        assert!(store.len() <= 2, "{} held", store.len());
    }
    assert_eq!(store.evictions(), 4);
}
