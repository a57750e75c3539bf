//! Property tests of `Period` (the calendar period) against oracles written
//! here, not from the crate's code:
//!
//! - a calendar that counts from 1970-01-01 year by year, then month by
//!   month, with the month lengths and the Gregorian leap rule spelled out
//!   (slow, obviously right), and finds a week's Monday by stepping back day
//!   by day with Sakamoto's weekday of a date (not a count of days);
//! - `spec_check`: the rules transcribed literally, over that calendar;
//! - a history of every request that passed, by period, for the promise:
//!   exactly `N` per period.

mod common;

use common::MAX;
use gcra_core::{
    CheckError, MAX_OFFSET_S, MAX_TIME_US, Period, PeriodDecision, PeriodError,
    PeriodUnit, PeriodWrite,
};
use proptest::prelude::*;

const SECOND: i128 = 1_000_000;
const HOUR: i128 = 3600 * SECOND;
const DAY: i128 = 24 * HOUR;

// ---------------------------------------------------------------------------
// The oracle's calendar.
// ---------------------------------------------------------------------------

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn year_len(year: i64) -> i64 {
    if is_leap(year) { 366 } else { 365 }
}

fn month_len(year: i64, month: i64) -> i64 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => unreachable!("month {month}"),
    }
}

/// The date `days` after 1970-01-01 (before it if negative).
fn civil(days: i64) -> (i64, i64, i64) {
    let (mut year, mut rest) = (1970, days);
    while rest < 0 {
        year -= 1;
        rest += year_len(year);
    }
    while rest >= year_len(year) {
        rest -= year_len(year);
        year += 1;
    }
    let mut month = 1;
    while rest >= month_len(year, month) {
        rest -= month_len(year, month);
        month += 1;
    }
    (year, month, rest + 1)
}

/// Days from 1970-01-01 to the date (a year from 1970 on).
fn days_of(year: i64, month: i64, day: i64) -> i64 {
    let mut days = 0;
    for y in 1970..year {
        days += year_len(y);
    }
    for m in 1..month {
        days += month_len(year, m);
    }
    days + day - 1
}

/// 0 for Sunday, 1 for Monday...: Tomohiko Sakamoto's formula, from the
/// date alone.
fn weekday(year: i64, month: i64, day: i64) -> i64 {
    const T: [i64; 12] = [0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4];
    let y = if month < 3 { year - 1 } else { year };
    (y + y / 4 - y / 100 + y / 400 + T[(month - 1) as usize] + day) % 7
}

/// `(start, next)` of the period of `now`, as instants: the start clamped
/// at 0, the next start as it is (beyond 2^53 the crate must answer
/// `TimeOutOfRange`).
fn oracle_bounds(unit: PeriodUnit, offset_s: i32, now: u64) -> (u64, i128) {
    let offset = i128::from(offset_s) * SECOND;
    let local = i128::from(now) + offset;
    let today = i64::try_from(local.div_euclid(DAY)).unwrap();
    let (start_day, next_day) = match unit {
        PeriodUnit::Day => (today, today + 1),
        PeriodUnit::Week => {
            let mut monday = today;
            loop {
                let (y, m, d) = civil(monday);
                if weekday(y, m, d) == 1 {
                    break;
                }
                monday -= 1;
            }
            assert!(today - monday < 7);
            (monday, monday + 7)
        }
        PeriodUnit::Month => {
            let (y, m, d) = civil(today);
            let first = today - (d - 1);
            (first, first + month_len(y, m))
        }
    };
    let start = i128::from(start_day) * DAY - offset;
    let next = i128::from(next_day) * DAY - offset;
    (u64::try_from(start.max(0)).unwrap(), next)
}

fn spec_check(
    p: &Period,
    stored: Option<(u64, u32)>,
    now: u64,
    cost: u32,
) -> Result<PeriodDecision, CheckError> {
    if i128::from(now) > MAX {
        return Err(CheckError::TimeOutOfRange);
    }
    if cost > p.limit() {
        return Err(CheckError::CostExceedsBurst {
            cost,
            burst: p.limit(),
        });
    }
    let (start, next) = oracle_bounds(p.unit(), p.offset_s(), now);
    if next > MAX {
        return Err(CheckError::TimeOutOfRange);
    }
    let count = match stored {
        Some((s, c)) if s >= start && i128::from(s) <= MAX => i128::from(c),
        _ => 0,
    };
    let (limit, cost_i) = (i128::from(p.limit()), i128::from(cost));
    let reset = u64::try_from(next - i128::from(now)).unwrap();
    let decision = |allowed, remaining: i128, retry, write| PeriodDecision {
        allowed,
        remaining: u64::try_from(remaining).unwrap(),
        retry_after_us: retry,
        reset_after_us: reset,
        write,
    };
    Ok(if cost == 0 {
        decision(true, (limit - count).max(0), 0, None)
    } else if count + cost_i > limit {
        decision(false, 0, reset, None)
    } else {
        let write = PeriodWrite {
            start_us: start,
            count: u32::try_from(count + cost_i).unwrap(),
            ttl_ms: reset.div_ceil(1000),
        };
        decision(true, limit - count - cost_i, 0, Some(write))
    })
}

// ---------------------------------------------------------------------------
// Strategies.
// ---------------------------------------------------------------------------

fn unit() -> impl Strategy<Value = PeriodUnit> {
    prop_oneof![
        Just(PeriodUnit::Day),
        Just(PeriodUnit::Week),
        Just(PeriodUnit::Month)
    ]
}

fn offset() -> impl Strategy<Value = i32> {
    prop_oneof![
        2 => Just(0),
        1 => Just(5 * 3600 + 1800), // +05:30
        1 => Just(5 * 3600 + 2700), // +05:45
        1 => Just(-12 * 3600),
        1 => Just(14 * 3600),
        1 => Just(-9 * 3600 - 1800), // -09:30
        1 => Just(MAX_OFFSET_S),
        1 => Just(-MAX_OFFSET_S),
        3 => -MAX_OFFSET_S..=MAX_OFFSET_S,
    ]
}

/// Dates where calendars go wrong.
const EDGES: &[(i64, i64, i64)] = &[
    (1970, 1, 1),
    (1972, 2, 29),
    (1999, 12, 31),
    (2000, 2, 28),
    (2000, 2, 29),
    (2000, 3, 1),
    (2023, 2, 28),
    (2023, 3, 1),
    (2024, 1, 1),
    (2024, 2, 28),
    (2024, 2, 29),
    (2024, 3, 1),
    (2024, 12, 31),
    (2028, 2, 29),
    (2038, 1, 19),
    (2099, 12, 31),
    (2100, 2, 28),
    (2100, 3, 1),
    (2200, 2, 28),
    (2254, 12, 31),
];

/// An instant: anywhere, or within two days of local midnight of a
/// month's edge or of a date from `EDGES`, in the local time of `offset_s`.
fn instant(offset_s: i32) -> impl Strategy<Value = u64> {
    let date = prop_oneof![
        2 => (1970i64..=2254, 1i64..=12, prop_oneof![Just(1i64), 27i64..=31]),
        1 => prop::sample::select(EDGES),
    ];
    let delta = prop_oneof![Just(0i128), Just(-1), Just(1), -2 * DAY..2 * DAY,];
    prop_oneof![
        1 => (0..=MAX_TIME_US).boxed(),
        3 => (date, delta)
            .prop_map(move |((y, m, d), delta)| {
                let d = d.min(month_len(y, m));
                let local = i128::from(days_of(y, m, d)) * DAY + delta;
                let utc = local - i128::from(offset_s) * SECOND;
                u64::try_from(utc.clamp(0, MAX)).unwrap()
            })
            .boxed(),
        1 => (MAX_TIME_US - 40 * 86_400_000_000..=MAX_TIME_US + 10).boxed(),
    ]
}

fn period() -> impl Strategy<Value = (Period, u64)> {
    (
        prop_oneof![3 => 1u32..=6, 1 => any::<u32>().prop_map(|l| l.max(1))],
        unit(),
        offset(),
    )
        .prop_flat_map(|(limit, unit, offset)| {
            let p = Period::new(limit, unit, offset).unwrap();
            (Just(p), instant(offset))
        })
}

proptest! {
    #![proptest_config(common::config(
        1024,
        concat!(env!("CARGO_MANIFEST_DIR"), "/proptest-regressions/period.txt"),
    ))]

    /// `start_of` and `next_start` are the calendar's, and the periods
    /// tile time: the instant before a start belongs to the period before.
    #[test]
    fn bounds_match_the_calendar((p, now) in period()) {
        if i128::from(now) > MAX {
            prop_assert_eq!(p.start_of(now), Err(CheckError::TimeOutOfRange));
            prop_assert_eq!(p.next_start(now), Err(CheckError::TimeOutOfRange));
            return Ok(());
        }
        let (start, next) = oracle_bounds(p.unit(), p.offset_s(), now);
        prop_assert_eq!(p.start_of(now), Ok(start), "{:?} at {}", p, now);
        if next > MAX {
            prop_assert_eq!(p.next_start(now), Err(CheckError::TimeOutOfRange));
            return Ok(());
        }
        let next = u64::try_from(next).unwrap();
        prop_assert_eq!(p.next_start(now), Ok(next), "{:?} at {}", p, now);
        prop_assert!(start <= now && now < next);
        if start > 0 {
            prop_assert_eq!(p.next_start(start - 1), Ok(start));
        }
        prop_assert_eq!(p.start_of(next - 1), Ok(start));
        prop_assert_eq!(p.start_of(next), Ok(next));
    }

    /// Any stored record, any cost: the crate does what the rules say.
    #[test]
    fn check_matches_the_rules(
        (p, now) in period(),
        stored in prop::option::of((0u8..6, any::<u64>(), any::<u32>())),
        cost in prop_oneof![3 => 0u32..=8, 1 => any::<u32>()],
    ) {
        let limit = p.limit();
        let stored = stored.map(|(kind, raw, count)| {
            let start = p.start_of(now.min(MAX_TIME_US)).unwrap_or(0);
            let start = match kind {
                0 => start,                               // this period's
                1 => start.saturating_sub(1 + raw % (40 * 86_400_000_000)), // earlier
                2 => start + 1 + raw % (40 * 86_400_000_000), // later: clock went back
                3 => MAX_TIME_US + 1 + raw % 1000,        // garbage
                _ => raw,                                 // anything
            };
            let count = if count % 2 == 0 { count % (limit.saturating_add(3)) } else { count };
            (start, count)
        });
        let got = p.check(stored, now, cost);
        prop_assert_eq!(got, spec_check(&p, stored, now, cost), "{:?} at {} stored {:?}", p, now, stored);
    }

    /// Requests over several periods, with the store's record applied and
    /// expired: a request passes exactly when its period's passes leave
    /// room for it, so exactly `N` pass per period when enough ask; a
    /// refusal's wait is exact.
    #[test]
    fn exactly_n_per_period(
        limit in 1u32..=5,
        unit in unit(),
        offset in offset(),
        start in 0u64..=MAX_TIME_US - 800 * 86_400_000_000,
        steps in prop::collection::vec((0u64..1000, 1u32..=3, any::<bool>()), 1..80),
    ) {
        let p = Period::new(limit, unit, offset).unwrap();
        // Steps of up to a third of a day, a week, a month.
        let scale = match unit {
            PeriodUnit::Day => 8 * 3_600_000_000,
            PeriodUnit::Week => 2 * 86_400_000_000,
            PeriodUnit::Month => 9 * 86_400_000_000,
        };
        let mut now = start;
        let mut record: Option<((u64, u32), u64)> = None; // and its expiry
        // Passed cost per period, by the oracle's start.
        let mut passed: std::collections::BTreeMap<u64, u32> = Default::default();
        for (advance, cost, expire) in steps {
            now += advance * scale / 1000 + advance % 3; // edges too
            if expire && record.is_some_and(|(_, at)| at <= now) {
                record = None;
            }
            let cost = cost.min(limit);
            let (period_start, _) = oracle_bounds(unit, offset, now);
            let so_far = passed.get(&period_start).copied().unwrap_or(0);
            let d = p.check(record.map(|(r, _)| r), now, cost).unwrap();
            prop_assert_eq!(d.allowed, so_far + cost <= limit, "at {}: {} so far", now, so_far);
            if let Some(w) = d.write {
                prop_assert_eq!(w.start_us, period_start);
                *passed.entry(period_start).or_default() += cost;
                record = Some(((w.start_us, w.count), now + w.ttl_ms * 1000));
                prop_assert_eq!(w.count, so_far + cost);
            } else {
                let retry = d.retry_after_us;
                let stored = record.map(|(r, _)| r);
                prop_assert!(p.check(stored, now + retry, cost).unwrap().allowed);
                prop_assert!(!p.check(stored, now + retry - 1, cost).unwrap().allowed);
                prop_assert_eq!(Ok(now + retry), p.next_start(now));
            }
        }
        for (start, count) in passed {
            prop_assert!(count <= limit, "{} passed in the period of {}", count, start);
        }
    }

    /// The bounds a store kept from a decision (its write's start, and
    /// now + reset_after) give `check_within` the answers of `check`, at
    /// any later or earlier instant and cost.
    #[test]
    fn check_within_kept_bounds_is_check(
        (p, now) in period(),
        first_cost in 1u32..=3,
        later in prop::collection::vec((any::<i64>(), prop_oneof![3 => 0u32..=8, 1 => any::<u32>()]), 1..20),
    ) {
        let Ok(first) = p.check(None, now, first_cost.min(p.limit())) else {
            return Ok(());
        };
        let Some(write) = first.write else { return Ok(()) };
        let next = now + first.reset_after_us;
        prop_assert_eq!(p.next_start(now), Ok(next));
        for (step, cost) in later {
            // Within this period, across its ends, and far away.
            let at = match step % 3 {
                0 => write.start_us.saturating_add(step.unsigned_abs() % (next - write.start_us + 2)),
                1 => next.saturating_sub(1).saturating_add(step.unsigned_abs() % 3),
                _ => step.unsigned_abs(),
            };
            prop_assert_eq!(
                p.check_within(write.start_us, next, write.count, at, cost),
                p.check(Some((write.start_us, write.count)), at, cost),
                "{:?} kept [{}, {}) at {}", p, write.start_us, next, at
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Named dates.
// ---------------------------------------------------------------------------

fn at(year: i64, month: i64, day: i64) -> u64 {
    u64::try_from(i128::from(days_of(year, month, day)) * DAY).unwrap()
}

fn monthly(offset_s: i32) -> Period {
    Period::new(10, PeriodUnit::Month, offset_s).unwrap()
}

#[test]
fn february_has_29_days_in_leap_years_only() {
    let feb = |y| {
        let p = monthly(0);
        let start = p.start_of(at(y, 2, 15)).unwrap();
        assert_eq!(start, at(y, 2, 1));
        (p.next_start(start).unwrap() - start) / 86_400_000_000
    };
    assert_eq!(feb(2024), 29);
    assert_eq!(feb(2028), 29);
    assert_eq!(feb(2000), 29, "divisible by 400");
    assert_eq!(feb(2100), 28, "divisible by 100, not 400");
    assert_eq!(feb(2023), 28);
    // The leap day itself is in February, and March starts after it.
    assert_eq!(
        monthly(0).start_of(at(2024, 2, 29)).unwrap(),
        at(2024, 2, 1)
    );
    assert_eq!(
        monthly(0).next_start(at(2024, 2, 29)).unwrap(),
        at(2024, 3, 1)
    );
    // Every month's length in a leap year and in a common one.
    for (year, lengths) in [
        (2024, [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]),
        (2025, [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]),
    ] {
        for (month, length) in (1..=12).zip(lengths) {
            let start = at(year, month, 1);
            let next = monthly(0).next_start(start).unwrap();
            assert_eq!(
                (next - start) / 86_400_000_000,
                length,
                "{year}-{month}"
            );
        }
    }
}

#[test]
fn weeks_start_on_monday() {
    let weekly = Period::new(1, PeriodUnit::Week, 0).unwrap();
    // 2024-01-01 was a Monday; 2000-01-01 a Saturday.
    assert_eq!(weekly.start_of(at(2024, 1, 1)).unwrap(), at(2024, 1, 1));
    assert_eq!(weekly.start_of(at(2024, 1, 7) + 1).unwrap(), at(2024, 1, 1));
    assert_eq!(weekly.start_of(at(2000, 1, 1)).unwrap(), at(1999, 12, 27));
    assert_eq!(weekly.next_start(at(2000, 1, 1)).unwrap(), at(2000, 1, 3));
    // A week across a year's end.
    assert_eq!(weekly.start_of(at(2025, 1, 1)).unwrap(), at(2024, 12, 30));
}

#[test]
fn offsets_move_local_midnight() {
    let h = 3_600_000_000u64;
    // +05:30: local midnight of March 1st is 18:30 UTC on Feb 29 (2024).
    let india = monthly(5 * 3600 + 1800);
    let local_march = at(2024, 3, 1) - 5 * h - h / 2;
    assert_eq!(india.next_start(at(2024, 2, 29)).unwrap(), local_march);
    assert_eq!(india.start_of(local_march).unwrap(), local_march);
    assert_eq!(
        india.start_of(local_march - 1).unwrap(),
        at(2024, 2, 1) - 5 * h - h / 2
    );
    // -12:00: a day is 12:00 UTC to 12:00 UTC.
    let daily = Period::new(1, PeriodUnit::Day, -12 * 3600).unwrap();
    assert_eq!(
        daily.start_of(at(2024, 6, 1)).unwrap(),
        at(2024, 5, 31) + 12 * h
    );
    assert_eq!(
        daily.next_start(at(2024, 6, 1)).unwrap(),
        at(2024, 6, 1) + 12 * h
    );
    // +14:00 on New Year's Eve at 10:00 UTC is already the next year.
    let yearly_ish = monthly(14 * 3600);
    assert_eq!(
        yearly_ish.start_of(at(2024, 12, 31) + 10 * h).unwrap(),
        at(2025, 1, 1) - 14 * h
    );
}

#[test]
fn the_period_holding_the_epoch_starts_at_zero() {
    let h = 3_600_000_000u64;
    let weekly = Period::new(1, PeriodUnit::Week, 0).unwrap();
    assert_eq!(weekly.start_of(0).unwrap(), 0); // began Monday 1969-12-29
    assert_eq!(weekly.next_start(0).unwrap(), at(1970, 1, 5));
    // UTC-01:00: at the epoch it is 23:00 on 1969-12-31.
    let daily = Period::new(1, PeriodUnit::Day, -3600).unwrap();
    assert_eq!(daily.start_of(0).unwrap(), 0);
    assert_eq!(daily.next_start(0).unwrap(), h);
    assert_eq!(daily.start_of(h).unwrap(), h);
    // A count stored for that period is this period's.
    let d = daily.check(Some((0, 1)), h - 1, 1).unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after_us, 1);
}

#[test]
fn the_end_of_time() {
    let daily = Period::new(1, PeriodUnit::Day, 0).unwrap();
    // 2^53 µs is 2255-06-05T23:47:34.740992Z.
    assert_eq!(daily.start_of(MAX_TIME_US).unwrap(), at(2255, 6, 5));
    assert_eq!(
        daily.next_start(MAX_TIME_US),
        Err(CheckError::TimeOutOfRange)
    );
    assert_eq!(
        daily.check(None, MAX_TIME_US, 1),
        Err(CheckError::TimeOutOfRange)
    );
    assert_eq!(daily.next_start(at(2255, 6, 5) - 1), Ok(at(2255, 6, 5)));
    assert_eq!(
        daily.start_of(MAX_TIME_US + 1),
        Err(CheckError::TimeOutOfRange)
    );
}

#[test]
fn construction_bounds() {
    assert_eq!(
        Period::new(0, PeriodUnit::Day, 0),
        Err(PeriodError::ZeroLimit)
    );
    for offset in [-MAX_OFFSET_S, MAX_OFFSET_S, 0] {
        assert_eq!(
            Period::new(1, PeriodUnit::Day, offset).unwrap().offset_s(),
            offset
        );
    }
    for offset in [-MAX_OFFSET_S - 1, MAX_OFFSET_S + 1, i32::MIN, i32::MAX] {
        assert_eq!(
            Period::new(1, PeriodUnit::Day, offset),
            Err(PeriodError::OffsetOutOfRange)
        );
    }
}

#[test]
fn a_lowered_limit_refuses_until_the_next_period() {
    let daily = Period::new(2, PeriodUnit::Day, 0).unwrap();
    let day = at(2024, 5, 5);
    let d = daily.check(Some((day, 7)), day + 10, 1).unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after_us, 86_400_000_000 - 10);
    assert_eq!(
        daily.check(Some((day, 7)), day + 10, 0).unwrap().remaining,
        0
    );
}

#[test]
fn error_messages() {
    assert_eq!(
        PeriodError::ZeroLimit.to_string(),
        "period limit must be at least 1"
    );
    assert_eq!(
        PeriodError::OffsetOutOfRange.to_string(),
        "period offset from UTC exceeds 18 hours"
    );
}
