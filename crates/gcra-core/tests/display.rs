//! How each rule reads to a person (`Display`): the words a status page,
//! an error and a log line show, so each case is pinned here.

use std::time::Duration;

use gcra_core::{Concurrency, Period, PeriodUnit, Quota, Window};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn a_quota_names_its_period_in_the_largest_whole_unit() {
    let cases = [
        (Quota::new(10, secs(1)).unwrap(), "10 per second"),
        (Quota::per_minute(10), "10 per minute"),
        (Quota::per_hour(10), "10 per hour"),
        (Quota::new(10, secs(86_400)).unwrap(), "10 per day"),
        (Quota::new(10, secs(2 * 86_400)).unwrap(), "10 per 2 d"),
        (Quota::new(10, secs(7_200)).unwrap(), "10 per 2 h"),
        (Quota::new(10, secs(120)).unwrap(), "10 per 2 min"),
        (Quota::new(3, secs(90)).unwrap(), "3 per 90 s"),
        // Not a whole second: the span's `Debug`.
        (
            Quota::new(3, Duration::from_millis(1500)).unwrap(),
            "3 per 1.5s",
        ),
        (
            Quota::new(1, Duration::from_millis(500)).unwrap(),
            "1 per 500ms",
        ),
    ];
    for (quota, words) in cases {
        assert_eq!(quota.to_string(), words);
    }
}

#[test]
fn a_quota_names_its_burst_only_when_it_is_not_the_limit() {
    assert_eq!(
        Quota::per_second(100).allow_burst(20).to_string(),
        "100 per second, burst 20"
    );
    assert_eq!(
        Quota::per_minute(5).allow_burst(50).to_string(),
        "5 per minute, burst 50"
    );
    assert_eq!(
        Quota::per_minute(5).allow_burst(5).to_string(),
        "5 per minute"
    );
}

#[test]
fn a_window_a_period_and_a_concurrency_limit_read_alike() {
    assert_eq!(
        Window::new(5, secs(30)).unwrap().to_string(),
        "5 in any 30 s"
    );
    assert_eq!(
        Window::new(100, secs(3_600)).unwrap().to_string(),
        "100 in any hour"
    );
    assert_eq!(
        Period::new(1000, PeriodUnit::Month, 0).unwrap().to_string(),
        "1000 per month"
    );
    assert_eq!(
        Period::new(1000, PeriodUnit::Month, 19_800)
            .unwrap()
            .to_string(),
        "1000 per month (UTC+05:30)"
    );
    assert_eq!(
        Period::new(7, PeriodUnit::Week, -8 * 3600)
            .unwrap()
            .to_string(),
        "7 per week (UTC-08:00)"
    );
    assert_eq!(
        Period::new(50, PeriodUnit::Day, -(9 * 3600 + 30 * 60))
            .unwrap()
            .to_string(),
        "50 per day (UTC-09:30)"
    );
    assert_eq!(Concurrency::new(4).unwrap().to_string(), "4 at once");
}
