//! Unit tests for every rule and edge of `Quota::check` and of `Quota`
//! construction (gcra-core's crate docs, "The rules, exactly"), with the
//! numbers of the crate docs' example.

use core::time::Duration;

use gcra_core::{
    CheckError, Decision, MAX_TIME_US, MAX_WINDOW_US, Quota, QuotaError,
    StoreTat,
};

const MS: u64 = 1_000;
const SECOND: u64 = 1_000_000;

/// A store holding one bucket: the TAT the last decision asked to keep.
#[derive(Debug, Default)]
struct Bucket {
    tat: Option<u64>,
}

impl Bucket {
    fn check(&mut self, quota: &Quota, now_us: u64, cost: u32) -> Decision {
        let decision = quota.check(self.tat, now_us, cost).unwrap();
        if let Some(store) = decision.store {
            self.tat = Some(store.tat_us);
        }
        decision
    }
}

fn allowed(
    remaining: u64,
    reset_after_us: u64,
    tat_us: u64,
    ttl_ms: u64,
) -> Decision {
    Decision {
        allowed: true,
        remaining,
        retry_after_us: 0,
        reset_after_us,
        store: Some(StoreTat { tat_us, ttl_ms }),
    }
}

fn refused(
    retry_after_us: u64,
    reset_after_us: u64,
    store: Option<StoreTat>,
) -> Decision {
    Decision {
        allowed: false,
        remaining: 0,
        retry_after_us,
        reset_after_us,
        store,
    }
}

// ---------------------------------------------------------------------------
// The 0.3 example's numbers: 10 per minute, T = 6 s, tau = 60 s.
// ---------------------------------------------------------------------------

#[test]
fn post_ten_per_minute_full_sequence() {
    let quota = Quota::per_minute(10);
    assert_eq!(quota.emission_interval_us(), 6 * SECOND);
    assert_eq!(quota.burst_offset_us(), 60 * SECOND);
    let mut bucket = Bucket::default();

    // t = 0: ten pass, remaining 9..0, each moving the TAT by 6 s.
    for i in 1..=10u64 {
        let d = bucket.check(&quota, 0, 1);
        assert_eq!(
            d,
            allowed(10 - i, i * 6 * SECOND, i * 6 * SECOND, i * 6_000),
            "request {i}"
        );
    }
    assert_eq!(bucket.tat, Some(60 * SECOND));

    // The 11th: refused, retry 6 s, the bucket is full again in 60 s.
    let d = bucket.check(&quota, 0, 1);
    assert_eq!(d, refused(6 * SECOND, 60 * SECOND, None));
    assert_eq!(bucket.tat, Some(60 * SECOND));

    // t = 6 s: exactly one fits.
    let d = bucket.check(&quota, 6 * SECOND, 1);
    assert_eq!(d, allowed(0, 60 * SECOND, 66 * SECOND, 60_000));
    let d = bucket.check(&quota, 6 * SECOND, 1);
    assert_eq!(d, refused(6 * SECOND, 60 * SECOND, None));

    // t = 36 s: TAT is 30 s ahead, 30 s free = 5 requests.
    for (k, expected_remaining) in [4u64, 3, 2, 1, 0].into_iter().enumerate() {
        let k = k as u64 + 1;
        let new_tat = 66 * SECOND + k * 6 * SECOND;
        let d = bucket.check(&quota, 36 * SECOND, 1);
        assert_eq!(
            d,
            allowed(
                expected_remaining,
                new_tat - 36 * SECOND,
                new_tat,
                (new_tat - 36 * SECOND) / MS
            ),
        );
    }
    let d = bucket.check(&quota, 36 * SECOND, 1);
    assert_eq!(d, refused(6 * SECOND, 60 * SECOND, None));
    assert_eq!(bucket.tat, Some(96 * SECOND));
}

#[test]
fn fixed_window_boundary_is_not_a_double_burst() {
    // A fixed window would let 10 pass at 59 s and 10 more at 60 s.
    let quota = Quota::per_minute(10);
    let mut bucket = Bucket::default();
    for i in 0..10u64 {
        let d = bucket.check(&quota, 59 * SECOND, 1);
        assert!(d.allowed, "request {i} at 59 s");
        assert_eq!(d.remaining, 9 - i);
    }
    assert_eq!(bucket.tat, Some(119 * SECOND));
    let mut allowed_at_60 = 0;
    for _ in 0..10 {
        let d = bucket.check(&quota, 60 * SECOND, 1);
        if d.allowed {
            allowed_at_60 += 1;
        }
        // One second has drained of the six one request needs.
        assert_eq!(d, refused(5 * SECOND, 59 * SECOND, None));
    }
    assert_eq!(allowed_at_60, 0);
    // It passes exactly when retry_after says, and not a microsecond earlier.
    assert!(!bucket.check(&quota, 65 * SECOND - 1, 1).allowed);
    assert!(bucket.check(&quota, 65 * SECOND, 1).allowed);
}

#[test]
fn fixed_window_example_numbers() {
    // `cargo run --example fixed_window`: 20 requests spread over 2 seconds
    // (one every 100 ms from 59.0 s): GCRA lets 10 of them pass.
    let quota = Quota::per_minute(10);
    let mut bucket = Bucket::default();
    let allowed = (0..20u64)
        .filter(|i| bucket.check(&quota, 59 * SECOND + i * 100 * MS, 1).allowed)
        .count();
    assert_eq!(allowed, 10);
}

// ---------------------------------------------------------------------------
// Rule 1: where the bucket stands.
// ---------------------------------------------------------------------------

#[test]
fn missing_tat_starts_at_now() {
    let quota = Quota::per_second(10); // T = 100 ms, tau = 1 s
    let now = 1_234_567;
    let d = quota.check(None, now, 1).unwrap();
    assert_eq!(d, allowed(9, 100 * MS, now + 100 * MS, 100));
}

#[test]
fn tat_in_the_past_is_like_missing() {
    let quota = Quota::per_second(10);
    let now = 10 * SECOND;
    let fresh = quota.check(None, now, 3).unwrap();
    for stale in [0, 1, now - 5 * 100 * MS, now - 1] {
        assert_eq!(
            quota.check(Some(stale), now, 3).unwrap(),
            fresh,
            "stale TAT {stale}"
        );
    }
}

#[test]
fn tat_exactly_now_is_like_missing() {
    let quota = Quota::per_second(10);
    let now = 10 * SECOND;
    assert_eq!(
        quota.check(Some(now), now, 1).unwrap(),
        quota.check(None, now, 1).unwrap()
    );
    // One microsecond later it counts.
    let d = quota.check(Some(now + 1), now, 1).unwrap();
    assert_eq!(d.reset_after_us, 100 * MS + 1);
    assert_eq!(d.store.unwrap().tat_us, now + 100 * MS + 1);
    assert_eq!(d.remaining, 8); // floor((1 s - 100 ms - 1 µs) / 100 ms)
}

#[test]
fn tat_exactly_at_horizon_is_not_capped() {
    let quota = Quota::per_second(10);
    let now = 10 * SECOND;
    let tau = quota.burst_offset_us();
    let d = quota.check(Some(now + tau), now, 1).unwrap();
    assert_eq!(d, refused(100 * MS, tau, None));
}

#[test]
fn clock_backwards_caps_the_tat_and_stores_it() {
    // T = 1500 µs, tau = 4500 µs, a debt of one burst: the cap is 2 tau =
    // 9000 µs ahead, its ttl 9 ms.
    let quota = Quota::new(3, Duration::from_micros(4500))
        .unwrap()
        .allow_debt(Duration::from_micros(4500));
    assert_eq!(quota.emission_interval_us(), 1500);
    assert_eq!(quota.burst_offset_us(), 4500);
    assert_eq!(quota.ceiling_us(), 9000);
    let now = 1_000_000;
    for stored in [now + 9001, now + 10 * SECOND, MAX_TIME_US] {
        let d = quota.check(Some(stored), now, 1).unwrap();
        assert_eq!(
            d,
            refused(
                4500 + 1500,
                9000,
                Some(StoreTat {
                    tat_us: now + 9000,
                    ttl_ms: 9
                })
            ),
            "stored {stored}"
        );
        // A cost of c waits the debt and c intervals after the cap.
        let d = quota.check(Some(stored), now, 3).unwrap();
        assert_eq!(
            d,
            refused(
                4500 + 3 * 1500,
                9000,
                Some(StoreTat {
                    tat_us: now + 9000,
                    ttl_ms: 9
                })
            )
        );
    }
}

#[test]
fn a_debt_up_to_two_bursts_is_kept_and_waited_for() {
    // 10 per minute: a TAT 100 s ahead is 40 s of debt beyond a full burst.
    let quota = Quota::per_minute(10);
    let d = quota.check(Some(100 * SECOND), 0, 1).unwrap();
    assert_eq!(d, refused(46 * SECOND, 100 * SECOND, None));
    // Exactly at the ceiling: kept, not capped.
    let d = quota.check(Some(120 * SECOND), 0, 1).unwrap();
    assert_eq!(d, refused(66 * SECOND, 120 * SECOND, None));
}

#[test]
fn clock_backwards_does_not_lock_the_user_out() {
    // A debt of one burst window at most.
    let quota = Quota::per_minute(10).allow_debt(Duration::from_secs(60));
    let mut bucket = Bucket {
        tat: Some(1_000 * SECOND),
    }; // written by a clock 940 s ahead
    let d = bucket.check(&quota, 0, 1);
    assert_eq!(
        d,
        refused(
            66 * SECOND,
            120 * SECOND,
            Some(StoreTat {
                tat_us: 120 * SECOND,
                ttl_ms: 120_000
            })
        )
    );
    // Locked out for one burst window more than usual, not for 940 s.
    assert_eq!(bucket.tat, Some(120 * SECOND));
    // Now it is an ordinary bucket in debt: nothing more to store.
    assert_eq!(
        bucket.check(&quota, 0, 1),
        refused(66 * SECOND, 120 * SECOND, None)
    );
    assert!(!bucket.check(&quota, 66 * SECOND - 1, 1).allowed);
    assert_eq!(
        bucket.check(&quota, 66 * SECOND, 1),
        allowed(0, 60 * SECOND, 126 * SECOND, 60_000)
    );
}

#[test]
fn by_default_a_tat_up_to_an_hour_beyond_the_burst_is_a_debt_kept_whole() {
    // 10 per minute: a TAT 940 s ahead is a reservation or a settled debt
    // on another instance, whatever this one waits for: kept, not capped.
    let quota = Quota::per_minute(10);
    assert_eq!(quota.ceiling_us(), 3_660 * SECOND);
    let d = quota.check(Some(1_000 * SECOND), 60 * SECOND, 1).unwrap();
    assert_eq!(d, refused(886 * SECOND, 940 * SECOND, None));
    // Beyond the hour, the clock went back: capped at tau plus an hour.
    let d = quota.check(Some(4_000 * SECOND), 0, 1).unwrap();
    assert_eq!(
        d,
        refused(
            3_606 * SECOND,
            3_660 * SECOND,
            Some(StoreTat {
                tat_us: 3_660 * SECOND,
                ttl_ms: 3_660_000
            })
        )
    );
    // A day's burst window keeps a day of debt.
    assert_eq!(Quota::per_day(10).max_debt_us(), 86_400 * SECOND);
}

#[test]
fn stored_tat_above_max_time_is_treated_as_absent() {
    let quota = Quota::per_minute(10);
    for now in [0, 5 * SECOND, MAX_TIME_US - 12 * SECOND] {
        let fresh = quota.check(None, now, 2).unwrap();
        for corrupt in [MAX_TIME_US + 1, MAX_TIME_US + 6 * SECOND, u64::MAX] {
            assert_eq!(
                quota.check(Some(corrupt), now, 2).unwrap(),
                fresh,
                "{corrupt} at {now}"
            );
        }
    }
    // MAX_TIME_US itself is a valid TAT: far ahead of 0, so it is capped,
    // at tau and the default debt of an hour.
    let d = quota.check(Some(MAX_TIME_US), 0, 1).unwrap();
    assert_eq!(d.store.map(|s| s.tat_us), Some(3_660 * SECOND));
    assert!(!d.allowed);
}

// ---------------------------------------------------------------------------
// Cost.
// ---------------------------------------------------------------------------

#[test]
fn weighted_cost_pro_plan() {
    let pro = Quota::per_minute(100); // T = 600 ms
    let mut bucket = Bucket::default();
    let d = bucket.check(&pro, 0, 1);
    assert_eq!(d, allowed(99, 600 * MS, 600 * MS, 600));
    let d = bucket.check(&pro, 0, 5);
    assert_eq!(d, allowed(94, 3_600 * MS, 3_600 * MS, 3_600));
    // A cost of 50 twice leaves 44 after the first, and refuses the second
    // until 50 - 44 = 6 intervals have drained.
    assert_eq!(bucket.check(&pro, 0, 50).remaining, 44);
    assert_eq!(
        bucket.check(&pro, 0, 50),
        refused(6 * 600 * MS, 56 * 600 * MS, None)
    );
}

#[test]
fn zero_cost_is_an_error() {
    let quota = Quota::per_minute(10);
    assert_eq!(quota.check(None, 0, 0), Err(CheckError::ZeroCost));
    assert_eq!(
        quota.check(Some(30 * SECOND), 10 * SECOND, 0),
        Err(CheckError::ZeroCost)
    );
    assert!(!quota.can_ever_pass(0));
}

#[test]
fn cost_above_burst_can_never_pass() {
    let quota = Quota::per_minute(10);
    let err = Err(CheckError::CostExceedsBurst {
        cost: 11,
        burst: 10,
    });
    // Whatever the state: decided before the TAT is read.
    for stored in [None, Some(0), Some(1_000 * SECOND), Some(u64::MAX)] {
        assert_eq!(quota.check(stored, 500 * SECOND, 11), err);
    }
    assert_eq!(
        quota.check(None, 0, u32::MAX),
        Err(CheckError::CostExceedsBurst {
            cost: u32::MAX,
            burst: 10
        })
    );
    assert!(!quota.can_ever_pass(11));
    assert!(quota.can_ever_pass(10));
    assert!(quota.can_ever_pass(1));
}

#[test]
fn cost_equal_to_burst_passes_on_an_empty_bucket_only() {
    let quota = Quota::per_minute(10);
    let d = quota.check(None, 0, 10).unwrap();
    assert_eq!(d, allowed(0, 60 * SECOND, 60 * SECOND, 60_000));
    // After one request of cost 1 it must wait for that one interval.
    let d = quota.check(Some(6 * SECOND), 0, 10).unwrap();
    assert_eq!(d, refused(6 * SECOND, 6 * SECOND, None));
    assert!(
        quota
            .check(Some(6 * SECOND), 6 * SECOND, 10)
            .unwrap()
            .allowed
    );
}

// ---------------------------------------------------------------------------
// Burst.
// ---------------------------------------------------------------------------

#[test]
fn burst_smaller_than_limit() {
    let quota = Quota::per_minute(10).allow_burst(2);
    assert_eq!((quota.limit(), quota.burst()), (10, 2));
    assert_eq!(quota.emission_interval_us(), 6 * SECOND);
    assert_eq!(quota.burst_offset_us(), 12 * SECOND);
    let mut bucket = Bucket::default();
    assert_eq!(
        bucket.check(&quota, 0, 1),
        allowed(1, 6 * SECOND, 6 * SECOND, 6_000)
    );
    assert_eq!(
        bucket.check(&quota, 0, 1),
        allowed(0, 12 * SECOND, 12 * SECOND, 12_000)
    );
    assert_eq!(
        bucket.check(&quota, 0, 1),
        refused(6 * SECOND, 12 * SECOND, None)
    );
    assert_eq!(
        quota.check(None, 0, 3),
        Err(CheckError::CostExceedsBurst { cost: 3, burst: 2 })
    );
    // Over [0, 60 s] a greedy client gets B + 60/6 = 12, not 20.
    let mut count = 2;
    for k in 1..=10 {
        assert!(bucket.check(&quota, k * 6 * SECOND, 1).allowed);
        assert!(!bucket.check(&quota, k * 6 * SECOND, 1).allowed);
        count += 1;
    }
    assert_eq!(count, 12);
}

#[test]
fn burst_larger_than_limit() {
    let quota = Quota::per_minute(10).allow_burst(20);
    assert_eq!((quota.limit(), quota.burst()), (10, 20));
    assert_eq!(quota.emission_interval_us(), 6 * SECOND);
    assert_eq!(quota.burst_offset_us(), 120 * SECOND);
    let mut bucket = Bucket::default();
    for remaining in (0..20).rev() {
        assert_eq!(bucket.check(&quota, 0, 1).remaining, remaining);
    }
    assert_eq!(
        bucket.check(&quota, 0, 1),
        refused(6 * SECOND, 120 * SECOND, None)
    );
    assert!(quota.check(None, 0, 20).unwrap().allowed);
    assert_eq!(
        quota.check(None, 0, 21),
        Err(CheckError::CostExceedsBurst {
            cost: 21,
            burst: 20
        })
    );
}

#[test]
fn burst_errors() {
    assert_eq!(
        Quota::per_second(1).try_allow_burst(0),
        Err(QuotaError::ZeroBurst)
    );
    assert_eq!(
        Quota::per_day(1).try_allow_burst(u32::MAX),
        Err(QuotaError::OutOfRange)
    );
    // A window that could not fit beside a real clock (274 years).
    assert_eq!(
        Quota::per_day(1).try_allow_burst(100_000),
        Err(QuotaError::OutOfRange)
    );
    // The exact largest burst for 1 per minute.
    let quota = Quota::per_minute(1);
    let max_burst =
        u32::try_from(MAX_WINDOW_US / quota.emission_interval_us()).unwrap();
    let q = quota.try_allow_burst(max_burst).unwrap();
    assert!(q.burst_offset_us() <= MAX_WINDOW_US);
    assert!(q.burst_offset_us() + quota.emission_interval_us() > MAX_WINDOW_US);
    assert_eq!(
        quota.try_allow_burst(max_burst + 1),
        Err(QuotaError::OutOfRange)
    );
    // A period of exactly 2^50 µs, burst 1, is the widest window.
    let widest = Quota::new(1, Duration::from_micros(MAX_WINDOW_US)).unwrap();
    assert_eq!(widest.burst_offset_us(), MAX_WINDOW_US);
    assert_eq!(widest.try_allow_burst(2), Err(QuotaError::OutOfRange));
    assert_eq!(
        Quota::new(1, Duration::from_micros(MAX_WINDOW_US + 1)),
        Err(QuotaError::OutOfRange)
    );
}

#[test]
#[should_panic(expected = "quota burst must be at least 1")]
fn allow_burst_zero_panics() {
    let _ = Quota::per_minute(10).allow_burst(0);
}

#[test]
#[should_panic(
    expected = "quota period exceeds 2^53 microseconds, or its burst window exceeds 2^50"
)]
fn allow_burst_out_of_range_panics() {
    let _ = Quota::per_day(1).allow_burst(u32::MAX);
}

// ---------------------------------------------------------------------------
// Time range.
// ---------------------------------------------------------------------------

#[test]
fn now_beyond_max_time_is_an_error() {
    let quota = Quota::per_minute(10);
    for now in [MAX_TIME_US + 1, u64::MAX] {
        assert_eq!(quota.check(None, now, 1), Err(CheckError::TimeOutOfRange));
        assert_eq!(
            quota.check(Some(now), now, 1),
            Err(CheckError::TimeOutOfRange)
        );
    }
}

#[test]
fn new_tat_beyond_max_time_is_an_error() {
    let quota = Quota::per_second(1); // T = tau = 1 s
    // The new TAT lands exactly on 2^53: fine.
    let d = quota.check(None, MAX_TIME_US - SECOND, 1).unwrap();
    assert_eq!(d, allowed(0, SECOND, MAX_TIME_US, 1_000));
    // One microsecond later it would exceed it.
    assert_eq!(
        quota.check(None, MAX_TIME_US - SECOND + 1, 1),
        Err(CheckError::TimeOutOfRange)
    );
    assert_eq!(
        quota.check(None, MAX_TIME_US, 1),
        Err(CheckError::TimeOutOfRange)
    );
    // Documented: "`now`, or the TAT it would lead to" -- also when the
    // request would be refused anyway (TAT = 2^53, so new TAT = 2^53 + 1 s).
    assert_eq!(
        quota.check(Some(MAX_TIME_US), MAX_TIME_US - SECOND, 1),
        Err(CheckError::TimeOutOfRange)
    );
}

// ---------------------------------------------------------------------------
// Rounding.
// ---------------------------------------------------------------------------

#[test]
fn expiry_is_rounded_up_to_whole_milliseconds() {
    for (t_us, ttl_ms) in [
        (1, 1),
        (999, 1),
        (1_000, 1),
        (1_001, 2),
        (1_500, 2),
        (1_999, 2),
        (2_000, 2),
    ] {
        let quota = Quota::new(1, Duration::from_micros(t_us)).unwrap();
        let d = quota.check(None, 7, 1).unwrap();
        assert_eq!(
            d.store,
            Some(StoreTat {
                tat_us: 7 + t_us,
                ttl_ms
            }),
            "T = {t_us} µs"
        );
        assert_eq!(d.reset_after_us, t_us);
    }
}

#[test]
fn remaining_rounds_down() {
    let quota = Quota::per_second(10); // T = 100 ms, tau = 1 s
    let now = 5 * SECOND;
    // Half an interval already used: 1 s - 250 ms = 7.5 intervals -> 7.
    let d = quota.check(Some(now + 150 * MS), now, 1).unwrap();
    assert_eq!(d, allowed(7, 250 * MS, now + 250 * MS, 250));
    // 1 s - (200 ms - 1 µs) = 8 intervals + 1 µs -> 8.
    let d = quota.check(Some(now + 100 * MS - 1), now, 1).unwrap();
    assert_eq!(d.remaining, 8);
    // 1 s - (200 ms + 1 µs) = 1 µs short of 8 intervals -> 7.
    let d = quota.check(Some(now + 100 * MS + 1), now, 1).unwrap();
    assert_eq!(d.remaining, 7);
}

#[test]
fn uneven_period_rounds_the_interval_up() {
    // 3 per 1000 µs: T = 334 (not 333: 3 per 999 µs would be more than the
    // quota says), tau = 1002.
    let quota = Quota::new(3, Duration::from_micros(1000)).unwrap();
    assert_eq!(quota.emission_interval_us(), 334);
    assert_eq!(quota.burst_offset_us(), 1002);
    assert_eq!(quota.period(), Duration::from_micros(1000));
    let d = quota.check(None, 0, 3).unwrap();
    assert_eq!(d, allowed(0, 1002, 1002, 2));
}

#[test]
fn a_quota_never_allows_more_than_its_rate() {
    // 600 000 per second cannot be one per 1.67 µs: T = 2 µs, 500 000 per
    // second. A greedy client over 1 s after its burst gets at most the rate.
    let quota = Quota::per_second(600_000);
    assert_eq!(quota.emission_interval_us(), 2);
    for (limit, period) in [(600_000, SECOND), (7, 60 * SECOND), (3, 1000)] {
        let quota = Quota::new(limit, Duration::from_micros(period)).unwrap();
        let t = quota.emission_interval_us();
        assert!(t * u64::from(limit) >= period, "{limit} per {period} µs");
        assert!(t * u64::from(limit) < period + u64::from(limit));
    }
}

// ---------------------------------------------------------------------------
// Quota construction.
// ---------------------------------------------------------------------------

#[test]
fn quota_constructors_and_accessors() {
    const FREE: Quota = Quota::per_minute(10);
    assert_eq!(FREE.limit(), 10);
    assert_eq!(FREE.burst(), 10);
    assert_eq!(FREE.period(), Duration::from_secs(60));
    assert_eq!(Quota::per_second(4).emission_interval_us(), 250_000);
    assert_eq!(Quota::per_hour(3600).emission_interval_us(), SECOND);
    assert_eq!(Quota::per_day(24).emission_interval_us(), 3_600 * SECOND);
    assert_eq!(Quota::new(10, Duration::from_secs(60)), Ok(FREE));
    let q = Quota::new(3, Duration::from_millis(1500)).unwrap();
    assert_eq!(
        (q.emission_interval_us(), q.burst_offset_us()),
        (500_000, 1_500_000)
    );
    // Sub-microsecond remainders of the Duration are dropped.
    let q = Quota::new(1, Duration::from_nanos(2_999)).unwrap();
    assert_eq!(q.emission_interval_us(), 2);
    assert_eq!(q.period(), Duration::from_micros(2));
}

#[test]
fn quota_errors() {
    let sec = Duration::from_secs(1);
    assert_eq!(Quota::new(0, sec), Err(QuotaError::ZeroLimit));
    assert_eq!(Quota::new(1, Duration::ZERO), Err(QuotaError::ZeroPeriod));
    assert_eq!(
        Quota::new(1, Duration::from_nanos(1)),
        Err(QuotaError::ZeroPeriod)
    );
    assert_eq!(
        Quota::new(1, Duration::from_nanos(999)),
        Err(QuotaError::ZeroPeriod)
    );
    assert!(Quota::new(1, Duration::from_nanos(1_000)).is_ok());
    assert_eq!(
        Quota::new(1_000_001, sec),
        Err(QuotaError::IntervalTooSmall)
    );
    assert_eq!(Quota::new(u32::MAX, sec), Err(QuotaError::IntervalTooSmall));
    assert_eq!(
        Quota::new(2, Duration::from_micros(1)),
        Err(QuotaError::IntervalTooSmall)
    );
    assert_eq!(
        Quota::new(1_000_000, sec).unwrap().emission_interval_us(),
        1
    );
    assert_eq!(
        Quota::new(1, Duration::from_micros(MAX_TIME_US + 1)),
        Err(QuotaError::OutOfRange)
    );
    assert_eq!(
        Quota::new(1, Duration::from_secs(u64::MAX)),
        Err(QuotaError::OutOfRange)
    );
    assert_eq!(
        Quota::new(u32::MAX, Duration::MAX),
        Err(QuotaError::OutOfRange)
    );
    assert_eq!(
        Quota::new(u32::MAX, Duration::from_micros(MAX_TIME_US)),
        Err(QuotaError::OutOfRange)
    );
    assert!(
        Quota::new(u32::MAX, Duration::from_micros(MAX_WINDOW_US / 2)).is_ok()
    );
}

#[test]
fn error_messages() {
    assert_eq!(
        CheckError::ZeroCost.to_string(),
        "request cost must be at least 1"
    );
    assert_eq!(
        CheckError::CostExceedsBurst {
            cost: 11,
            burst: 10
        }
        .to_string(),
        "cost 11 exceeds the burst of 10: it can never pass"
    );
    assert_eq!(
        CheckError::TimeOutOfRange.to_string(),
        "time value exceeds 2^53 microseconds"
    );
    assert_eq!(
        QuotaError::ZeroLimit.to_string(),
        "quota limit must be at least 1"
    );
    assert_eq!(
        QuotaError::ZeroBurst.to_string(),
        "quota burst must be at least 1"
    );
    assert_eq!(
        QuotaError::ZeroPeriod.to_string(),
        "quota period must be at least 1 microsecond"
    );
    assert_eq!(
        QuotaError::IntervalTooSmall.to_string(),
        "quota emission interval (period / limit) is below 1 microsecond"
    );
    assert_eq!(
        QuotaError::OutOfRange.to_string(),
        "quota period exceeds 2^53 microseconds, or its burst window exceeds 2^50"
    );
}

#[test]
#[should_panic(expected = "quota limit must be at least 1")]
fn per_minute_zero_panics() {
    let _ = Quota::per_minute(0);
}

#[test]
#[should_panic(expected = "quota limit must be at least 1")]
fn per_second_zero_panics() {
    let _ = Quota::per_second(0);
}

#[test]
#[should_panic(
    expected = "quota emission interval (period / limit) is below 1 microsecond"
)]
fn per_second_too_many_panics() {
    let _ = Quota::per_second(1_000_001);
}

#[test]
#[should_panic(
    expected = "quota emission interval (period / limit) is below 1 microsecond"
)]
fn per_minute_too_many_panics() {
    let _ = Quota::per_minute(60_000_001);
}

// ---------------------------------------------------------------------------
// Extreme inputs never panic, and every answer is one of the allowed shapes.
// ---------------------------------------------------------------------------

#[test]
fn per_day_u32_max() {
    let quota = Quota::per_day(u32::MAX);
    assert_eq!(
        quota.emission_interval_us(),
        (86_400 * SECOND).div_ceil(u64::from(u32::MAX))
    );
    assert_eq!(quota.emission_interval_us(), 21);
    let tau = 21 * u64::from(u32::MAX);
    assert_eq!(quota.burst_offset_us(), tau);
    // The whole burst in one request.
    let d = quota.check(None, 0, u32::MAX).unwrap();
    assert_eq!(d, allowed(0, tau, tau, tau.div_ceil(1000)));
    assert_eq!(
        quota.check(Some(tau), 0, u32::MAX).unwrap(),
        refused(tau, tau, None)
    );
    assert_eq!(
        quota.check(Some(u64::MAX), u64::MAX, u32::MAX),
        Err(CheckError::TimeOutOfRange)
    );
}

/// Rule 1 and 2 in u128: the TAT a check would lead to.
fn new_tat(quota: &Quota, stored: Option<u64>, now: u64, cost: u32) -> u128 {
    let now = u128::from(now);
    let horizon = now + u128::from(quota.ceiling_us());
    let tat = match stored.map(u128::from) {
        Some(s) if s <= u128::from(MAX_TIME_US) && s >= now => s.min(horizon),
        _ => now,
    };
    tat + u128::from(quota.emission_interval_us()) * u128::from(cost)
}

#[test]
fn extreme_inputs_never_panic() {
    let quotas = [
        Quota::per_second(1),
        Quota::per_second(1_000_000),
        Quota::per_day(1),
        Quota::per_day(u32::MAX),
        Quota::per_second(1).allow_burst(1_000_000_000),
        Quota::new(1, Duration::from_micros(MAX_WINDOW_US)).unwrap(),
        Quota::new(u32::MAX, Duration::from_micros(MAX_WINDOW_US / 2)).unwrap(),
    ];
    let times = [
        0,
        1,
        999,
        MAX_TIME_US / 2,
        MAX_TIME_US - 1,
        MAX_TIME_US,
        MAX_TIME_US + 1,
        u64::MAX - 1,
        u64::MAX,
    ];
    let mut decided = 0;
    for quota in quotas {
        let tau = quota.burst_offset_us();
        let burst = quota.burst();
        let stored =
            core::iter::once(None).chain(times.iter().map(|&t| Some(t)));
        for tat in stored {
            for now in times {
                for cost in [
                    0,
                    1,
                    2,
                    burst / 2,
                    burst.saturating_sub(1),
                    burst,
                    burst.saturating_add(1),
                    u32::MAX,
                ] {
                    let result = quota.check(tat, now, cost);
                    match result {
                        Err(CheckError::ZeroCost) => assert_eq!(cost, 0),
                        Err(CheckError::CostExceedsBurst {
                            cost: c,
                            burst: b,
                        }) => {
                            assert_eq!((c, b), (cost, burst));
                            assert!(cost > burst);
                        }
                        Err(CheckError::TimeOutOfRange) => {
                            assert!(cost >= 1 && cost <= burst);
                            assert!(
                                now > MAX_TIME_US
                                    || new_tat(&quota, tat, now, cost)
                                        > u128::from(MAX_TIME_US)
                            );
                        }
                        Err(e) => panic!("unexpected error {e:?}"),
                        Ok(d) => {
                            decided += 1;
                            assert!(cost >= 1 && cost <= burst);
                            assert!(now <= MAX_TIME_US);
                            assert!(
                                new_tat(&quota, tat, now, cost)
                                    <= u128::from(MAX_TIME_US)
                            );
                            assert!(d.reset_after_us <= quota.ceiling_us());
                            if d.allowed {
                                assert!(d.reset_after_us <= tau);
                            }
                            if let Some(s) = d.store {
                                assert!(s.tat_us <= MAX_TIME_US);
                                assert_eq!(s.tat_us - now, d.reset_after_us);
                                assert!(s.ttl_ms >= 1);
                            }
                            if d.allowed {
                                assert_eq!(d.retry_after_us, 0);
                                assert!(d.store.is_some());
                            } else {
                                assert!(d.retry_after_us >= 1);
                                assert_eq!(d.remaining, 0);
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(decided > 100, "only {decided} decisions");
}

#[test]
fn the_last_instant_is_decided_and_the_next_is_a_typed_error() {
    // 2^53 µs itself is a time; one µs past it is not (for every call).
    use gcra_core::{Adjust, MAX_TIME_US};
    let quota = Quota::per_second(1);
    assert!(quota.peek(None, MAX_TIME_US).is_ok());
    assert_eq!(
        quota.peek(None, MAX_TIME_US + 1),
        Err(CheckError::TimeOutOfRange)
    );
    assert_eq!(
        quota.check(None, MAX_TIME_US + 1, 1),
        Err(CheckError::TimeOutOfRange)
    );
    assert_eq!(
        quota.settle(None, MAX_TIME_US + 1, Adjust::Refund(1)),
        Err(CheckError::TimeOutOfRange)
    );
}

#[test]
fn the_burst_and_the_debt_are_kept_whichever_is_set_first() {
    let debt = Duration::from_secs(5);
    let debt_first = Quota::per_second(10).allow_debt(debt).allow_burst(2);
    let burst_first = Quota::per_second(10).allow_burst(2).allow_debt(debt);
    assert_eq!(debt_first, burst_first);
    assert_eq!(
        (debt_first.burst(), debt_first.max_debt_us()),
        (2, 5 * SECOND)
    );
    // A share of it, as a fallback applies it during an outage, keeps the
    // debt too.
    assert_eq!(debt_first.divided(2).max_debt_us(), 5 * SECOND);
    assert_eq!(debt_first.divided(2).burst(), 1);
}

#[test]
fn a_default_debt_follows_the_burst_and_a_set_one_stays() {
    // 10 per minute, a burst of 1000: tau is 6000 s, longer than an hour.
    let wide = Quota::per_minute(10).allow_burst(1000);
    assert_eq!(wide.max_debt_us(), 6_000 * SECOND);
    assert_eq!(wide.ceiling_us(), 12_000 * SECOND);
    // Back to a narrow burst, the default is the hour again.
    let narrow = wide.allow_burst(10);
    assert_eq!(narrow, Quota::per_minute(10));
    assert_eq!(narrow.ceiling_us(), 3_660 * SECOND);
    // An hour set by hand is the hour whatever the burst.
    let set = Quota::per_minute(10).allow_debt(Duration::from_secs(3_600));
    assert_ne!(set, Quota::per_minute(10));
    assert_eq!(set.allow_burst(1000).max_debt_us(), 3_600 * SECOND);
    assert_eq!(set.allow_burst(1000).ceiling_us(), 9_600 * SECOND);
    // Unbounded: the longest window past tau.
    let unbounded = Quota::per_minute(10).unbounded_debt();
    assert_eq!(unbounded.max_debt_us(), gcra_core::MAX_WINDOW_US);
    assert_eq!(
        unbounded.allow_burst(1000).max_debt_us(),
        gcra_core::MAX_WINDOW_US
    );
    // Debug tells the debt in force.
    assert!(
        format!("{narrow:?}").contains("max_debt_us: 3600000000"),
        "{narrow:?}"
    );
}
