//! The time units of a rule, as envoyproxy/ratelimit reads and sends them.

use std::fmt;
use std::time::Duration;

/// A rule's `unit`: the period of `requests_per_unit`.
///
/// The lengths are upstream's (`UnitToDivider`): a month is 30 days and a
/// year 365 days. The numbers are those of the proto enum
/// `envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit`.
///
/// ```
/// use rate_tier_service::config::Unit;
/// assert_eq!(Unit::parse("Minute"), Some(Unit::Minute));
/// assert_eq!(Unit::parse("seconds"), None);
/// assert_eq!(Unit::Month.seconds(), 30 * 86_400);
/// assert_eq!(Unit::Week.proto(), 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// Reads a unit as upstream does: the name of an enum value other than
    /// `UNKNOWN`, in any case.
    pub fn parse(text: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|unit| unit.name().eq_ignore_ascii_case(text))
    }

    /// The enum's name: `SECOND` ... `YEAR`.
    pub const fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// The length in seconds.
    pub const fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The length.
    pub const fn duration(self) -> Duration {
        Duration::from_secs(self.seconds())
    }

    /// The proto enum's number (`RateLimitResponse.RateLimit.Unit`).
    pub const fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit of a proto number; `None` for `UNKNOWN` (0) and numbers
    /// the enum does not have. A descriptor's `limit` override uses another
    /// enum (`envoy.type.v3.RateLimitUnit`, without WEEK) with the same
    /// numbers: upstream reads it by number, and so does this.
    pub const fn from_proto(number: i32) -> Option<Unit> {
        match number {
            1 => Some(Unit::Second),
            2 => Some(Unit::Minute),
            3 => Some(Unit::Hour),
            4 => Some(Unit::Day),
            5 => Some(Unit::Month),
            6 => Some(Unit::Year),
            7 => Some(Unit::Week),
            _ => None,
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
