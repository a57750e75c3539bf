//! The calendar period: at most `limit` requests per calendar day, week or
//! month, in UTC or at a fixed offset from it.

use core::fmt;

use crate::{CheckError, Decision, MAX_TIME_US};

/// The largest offset from UTC a [`Period`] may have, in seconds: 18 hours,
/// either way (the bound of ISO 8601 and of `chrono::FixedOffset`; every
/// real time zone is within ±14 h).
///
/// ```
/// assert_eq!(gcra_core::MAX_OFFSET_S, 64_800);
/// ```
pub const MAX_OFFSET_S: i32 = 18 * 3600;

const DAY_US: u64 = 86_400_000_000;
/// Days from 0000-03-01 to 1970-01-01: the calendar below counts days from
/// 0000-03-01 (Howard Hinnant's epoch), where every leap day ends a year.
const EPOCH_DAYS: u64 = 719_468;
const EPOCH_US: u64 = EPOCH_DAYS * DAY_US;

/// The calendar unit of a [`Period`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeriodUnit {
    /// A calendar day, from midnight.
    Day,
    /// An ISO week: seven days from Monday's midnight.
    Week,
    /// A calendar month, from midnight of its first day: 28 to 31 days,
    /// with February's 29th in the leap years of the Gregorian calendar
    /// (every fourth year, but not 2100, 2200, ...; 2000 was one).
    Month,
}

/// A calendar period: at most `limit` requests per day, week or month,
/// starting at the period's first instant, in local time at a fixed offset
/// from UTC.
///
/// The state of a key is the start of the period it counts (µs since the
/// Unix epoch) and the count: one small record, forgotten when the next
/// period starts (the decision gives the time to live).
///
/// The offset is fixed: a period follows `UTC+05:30` or `UTC-08:00`, not a
/// time zone with summer time (a day of a zone that moves its clocks is 23
/// or 25 hours long; that needs a time-zone database, which this crate
/// does not carry).
///
/// # The rules
///
/// [`Period::check`] decides a request of `cost` at `now` against the
/// stored `(start, count)`, with `N` the limit:
///
/// 1. A `now` beyond [`MAX_TIME_US`] is [`CheckError::TimeOutOfRange`].
///    A cost above `N` can never pass: [`CheckError::CostExceedsBurst`],
///    with the limit as the burst, decided before the state is read. A cost
///    of 0 is a peek (rule 6).
/// 2. `start` and `next` are the instants (UTC, µs) at which the period of
///    `now` and the one after it begin: the local time is
///    `now + offset`, and its period begins at local midnight of the same
///    day, of that ISO week's Monday, or of that month's first day
///    ([`Period::start_of`], [`Period::next_start`]). The one period that
///    began before the epoch (it holds 1970-01-01T00:00Z) starts, here, at
///    0. A `next` beyond [`MAX_TIME_US`] (the last month before the year
///    2255) is [`CheckError::TimeOutOfRange`].
/// 3. `count` is the stored count if the stored start is from `start` to
///    [`MAX_TIME_US`]: this period's count, or a later period's after the
///    clock went back (carried into this period: requests that were made
///    are never forgotten early). Otherwise (nothing stored, an earlier
///    period, a value beyond [`MAX_TIME_US`]) `count` is 0.
/// 4. If `count + cost > N`: refused, `remaining` 0,
///    `retry_after = reset_after = next - now` (the count is 0 from
///    `next` on), and nothing to write.
/// 5. Else allowed: `remaining = N - count - cost`,
///    `reset_after = next - now`, and the store writes
///    `(start, count + cost)`, to keep for `ceil((next - now) / 1000)` ms.
/// 6. A cost of 0 is a peek: allowed, `remaining = N - count` (0 if the
///    count is above `N`, after the limit was lowered), `retry_after` 0,
///    `reset_after = next - now`, and never a write.
///
/// Exactly `N` units of cost pass per period: no more, since every pass is
/// counted against its period's start, and no fewer, since a refusal
/// happens only when the period's count leaves no room.
///
/// # Example
///
/// 1000 requests per calendar month in UTC. On 2024-02-28 at 23:00 the
/// month has 29 days, so the quota comes back on March 1st, 25 h later:
///
/// ```
/// use gcra_core::{Period, PeriodUnit};
///
/// const HOUR: u64 = 3_600_000_000; // µs
/// let monthly = Period::new(1000, PeriodUnit::Month, 0)?;
/// let feb_28_23h = 1_709_161_200_000_000; // 2024-02-28T23:00:00Z
/// let march_1 = 1_709_251_200_000_000; // 2024-03-01T00:00:00Z
/// assert_eq!(monthly.start_of(feb_28_23h)?, 1_706_745_600_000_000); // 2024-02-01
/// assert_eq!(monthly.next_start(feb_28_23h)?, march_1);
///
/// // 998 spent this month: two left.
/// let stored = Some((1_706_745_600_000_000, 998));
/// let d = monthly.check(stored, feb_28_23h, 2)?;
/// assert!(d.allowed);
/// assert_eq!(d.remaining, 0);
/// assert_eq!(d.reset_after_us, 25 * HOUR);
/// let write = d.write.expect("a pass writes");
/// assert_eq!((write.start_us, write.count, write.ttl_ms), (1_706_745_600_000_000, 1000, 90_000_000));
///
/// let stored = Some((write.start_us, write.count));
/// let refused = monthly.check(stored, feb_28_23h, 1)?;
/// assert!(!refused.allowed);
/// assert_eq!(refused.retry_after_us, 25 * HOUR);
/// assert_eq!(refused.write, None);
///
/// // On March 1st the February count is 0.
/// assert!(monthly.check(stored, march_1, 1)?.allowed);
///
/// // In India (UTC+05:30) the same instant is already February 29th,
/// // 04:30: the next month starts 19 h 30 min later.
/// let india = Period::new(1000, PeriodUnit::Month, 5 * 3600 + 1800)?;
/// assert_eq!(india.next_start(feb_28_23h)?, march_1 - 5 * HOUR - HOUR / 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Period {
    limit: u32,
    unit: PeriodUnit,
    offset_s: i32,
}

/// Why a [`Period`] could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PeriodError {
    /// The limit was 0: no request could ever pass.
    ZeroLimit,
    /// The offset from UTC was beyond [`MAX_OFFSET_S`] (18 h) either way.
    OffsetOutOfRange,
}

impl fmt::Display for PeriodError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PeriodError::ZeroLimit => "period limit must be at least 1",
            PeriodError::OffsetOutOfRange => {
                "period offset from UTC exceeds 18 hours"
            }
        })
    }
}

impl core::error::Error for PeriodError {}

/// A period as a person says it: `1000 per month`, with its offset from
/// UTC when it has one: `1000 per month (UTC+05:30)`.
///
/// ```
/// use gcra_core::{Period, PeriodUnit};
/// assert_eq!(Period::new(50, PeriodUnit::Day, 0)?.to_string(), "50 per day");
/// let ist = Period::new(1000, PeriodUnit::Month, 19_800)?;
/// assert_eq!(ist.to_string(), "1000 per month (UTC+05:30)");
/// let pst = Period::new(7, PeriodUnit::Week, -8 * 3600)?;
/// assert_eq!(pst.to_string(), "7 per week (UTC-08:00)");
/// # Ok::<(), gcra_core::PeriodError>(())
/// ```
impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.unit() {
            PeriodUnit::Day => "day",
            PeriodUnit::Week => "week",
            PeriodUnit::Month => "month",
        };
        write!(f, "{} per {unit}", self.limit())?;
        let offset_s = self.offset_s();
        if offset_s != 0 {
            let sign = if offset_s < 0 { '-' } else { '+' };
            let abs = offset_s.unsigned_abs();
            write!(f, " (UTC{sign}{:02}:{:02})", abs / 3600, abs % 3600 / 60)?;
        }
        Ok(())
    }
}

impl Period {
    /// At most `limit` requests per `unit`, in local time `offset_s`
    /// seconds ahead of UTC (negative: behind; 0: UTC), within
    /// ±[`MAX_OFFSET_S`].
    ///
    /// ```
    /// use gcra_core::{Period, PeriodError, PeriodUnit};
    ///
    /// let daily = Period::new(100, PeriodUnit::Day, -8 * 3600)?; // UTC-08:00
    /// assert_eq!((daily.limit(), daily.unit(), daily.offset_s()), (100, PeriodUnit::Day, -28_800));
    ///
    /// assert_eq!(Period::new(0, PeriodUnit::Day, 0), Err(PeriodError::ZeroLimit));
    /// assert_eq!(Period::new(1, PeriodUnit::Week, 64_801), Err(PeriodError::OffsetOutOfRange));
    /// # Ok::<(), PeriodError>(())
    /// ```
    pub const fn new(
        limit: u32,
        unit: PeriodUnit,
        offset_s: i32,
    ) -> Result<Period, PeriodError> {
        if limit == 0 {
            return Err(PeriodError::ZeroLimit);
        }
        if offset_s < -MAX_OFFSET_S || offset_s > MAX_OFFSET_S {
            return Err(PeriodError::OffsetOutOfRange);
        }
        Ok(Period {
            limit,
            unit,
            offset_s,
        })
    }

    /// Requests per period.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// The calendar unit.
    pub const fn unit(&self) -> PeriodUnit {
        self.unit
    }

    /// The offset of the local time from UTC, in seconds.
    pub const fn offset_s(&self) -> i32 {
        self.offset_s
    }

    /// The instant (µs since the Unix epoch) at which the period holding
    /// `now_us` began (rule 2 of the [rules](Period#the-rules)), 0 for the
    /// period that holds the epoch itself. [`CheckError::TimeOutOfRange`]
    /// if `now_us` is beyond [`MAX_TIME_US`].
    ///
    /// ```
    /// use gcra_core::{Period, PeriodUnit};
    /// const DAY: u64 = 86_400_000_000;
    /// let weekly = Period::new(10, PeriodUnit::Week, 0)?;
    /// // 2024-01-03 (a Wednesday) 12:00: the week began on Monday the 1st.
    /// let jan_1 = 19_723 * DAY;
    /// assert_eq!(weekly.start_of(jan_1 + 2 * DAY + DAY / 2)?, jan_1);
    /// assert_eq!(weekly.start_of(jan_1)?, jan_1);
    /// assert_eq!(weekly.start_of(jan_1 - 1)?, jan_1 - 7 * DAY);
    /// // 1970-01-01 was a Thursday: its week began before the epoch.
    /// assert_eq!(weekly.start_of(DAY)?, 0);
    /// assert_eq!(weekly.next_start(DAY)?, 4 * DAY);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn start_of(&self, now_us: u64) -> Result<u64, CheckError> {
        match self.bounds(now_us) {
            Ok((start, _)) => Ok(start),
            Err(error) => Err(error),
        }
    }

    /// The instant (µs since the Unix epoch) at which the period after the
    /// one holding `now_us` begins (rule 2 of the
    /// [rules](Period#the-rules)): always after `now_us`.
    /// [`CheckError::TimeOutOfRange`] if `now_us`, or that start (in the
    /// last period before the year 2255), is beyond [`MAX_TIME_US`].
    ///
    /// ```
    /// use gcra_core::{Period, PeriodUnit};
    /// const HOUR: u64 = 3_600_000_000;
    /// // UTC-12:00: local midnight is noon UTC.
    /// let daily = Period::new(10, PeriodUnit::Day, -12 * 3600)?;
    /// assert_eq!(daily.next_start(0)?, 12 * HOUR);
    /// assert_eq!(daily.next_start(12 * HOUR)?, 36 * HOUR);
    /// assert_eq!(daily.start_of(12 * HOUR)?, 12 * HOUR);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn next_start(&self, now_us: u64) -> Result<u64, CheckError> {
        match self.bounds(now_us) {
            Ok((_, next)) if next <= MAX_TIME_US => Ok(next),
            Ok(_) => Err(CheckError::TimeOutOfRange),
            Err(error) => Err(error),
        }
    }

    /// Decides a request of `cost` at `now_us`, given the stored
    /// `(period start, count)` of the key, by the
    /// [rules](Period#the-rules).
    ///
    /// Pure: the store reads the record, calls this, and writes
    /// [`PeriodDecision::write`] back, all atomically for the key. A cost
    /// of 0 is a peek.
    ///
    /// ```
    /// use gcra_core::{CheckError, Period, PeriodUnit};
    /// const DAY: u64 = 86_400_000_000;
    /// let daily = Period::new(3, PeriodUnit::Day, 0)?;
    ///
    /// // Yesterday's count is 0 today.
    /// let d = daily.check(Some((0, 3)), DAY + 5, 1)?;
    /// assert_eq!((d.allowed, d.remaining), (true, 2));
    /// assert_eq!(d.write.map(|w| (w.start_us, w.count)), Some((DAY, 1)));
    ///
    /// // A count from tomorrow (the clock went back) is carried into today.
    /// let d = daily.check(Some((2 * DAY, 3)), DAY + 5, 0)?;
    /// assert_eq!((d.allowed, d.remaining, d.write), (true, 0, None)); // a peek
    ///
    /// assert_eq!(
    ///     daily.check(None, 0, 4),
    ///     Err(CheckError::CostExceedsBurst { cost: 4, burst: 3 })
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn check(
        &self,
        stored: Option<(u64, u32)>,
        now_us: u64,
        cost: u32,
    ) -> Result<PeriodDecision, CheckError> {
        // Rule 1.
        if now_us > MAX_TIME_US {
            return Err(CheckError::TimeOutOfRange);
        }
        if cost > self.limit {
            return Err(CheckError::CostExceedsBurst {
                cost,
                burst: self.limit,
            });
        }
        // Rule 2.
        let (start, next) = match self.bounds(now_us) {
            Ok((_, next)) if next > MAX_TIME_US => {
                return Err(CheckError::TimeOutOfRange);
            }
            Ok(bounds) => bounds,
            Err(error) => return Err(error),
        };
        // Rule 3.
        let count = match stored {
            Some((stored_start, count))
                if stored_start >= start && stored_start <= MAX_TIME_US =>
            {
                count
            }
            _ => 0,
        };
        Ok(self.decide_in(start, next, count, now_us, cost))
    }

    /// [`Period::check`] of a record whose period's bounds the caller
    /// kept: `start_us` is its write's [`PeriodWrite::start_us`] and
    /// `next_us` the instant its decision reset at (`now +
    /// reset_after_us`). While that period holds `now_us`, the calendar is
    /// not computed again; otherwise this is `check(Some((start_us,
    /// count)), now_us, cost)`. The same answer either way, for bounds
    /// kept from a decision; other bounds mean nothing.
    ///
    /// ```
    /// use gcra_core::{Period, PeriodUnit};
    /// let daily = Period::new(3, PeriodUnit::Day, 0)?;
    /// const DAY: u64 = 86_400_000_000;
    /// let first = daily.check(None, DAY + 5, 1)?;
    /// let write = first.write.expect("a pass writes");
    /// let next = DAY + 5 + first.reset_after_us;
    /// assert_eq!(next, 2 * DAY);
    /// for now in [DAY + 9, 2 * DAY + 1, 5] {
    ///     assert_eq!(
    ///         daily.check_within(write.start_us, next, write.count, now, 1),
    ///         daily.check(Some((write.start_us, write.count)), now, 1),
    ///     );
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn check_within(
        &self,
        start_us: u64,
        next_us: u64,
        count: u32,
        now_us: u64,
        cost: u32,
    ) -> Result<PeriodDecision, CheckError> {
        // Rule 1 holds: now < next <= MAX_TIME_US.
        if start_us <= now_us
            && now_us < next_us
            && next_us <= MAX_TIME_US
            && cost <= self.limit
        {
            return Ok(self.decide_in(start_us, next_us, count, now_us, cost));
        }
        self.check(Some((start_us, count)), now_us, cost)
    }

    /// Rules 4 to 6, in the period `[start, next)` that holds `now_us`,
    /// with `count` already counted in it and `cost <= limit`.
    const fn decide_in(
        &self,
        start: u64,
        next: u64,
        count: u32,
        now_us: u64,
        cost: u32,
    ) -> PeriodDecision {
        let count = count as u64;
        let limit = self.limit as u64;
        // next > now.
        let reset_after_us = next.saturating_sub(now_us);
        if cost == 0 {
            // Rule 6.
            return PeriodDecision {
                allowed: true,
                remaining: limit.saturating_sub(count),
                retry_after_us: 0,
                reset_after_us,
                write: None,
            };
        }
        let need = count.saturating_add(cost as u64);
        if need > limit {
            // Rule 4.
            return PeriodDecision {
                allowed: false,
                remaining: 0,
                retry_after_us: reset_after_us,
                reset_after_us,
                write: None,
            };
        }
        // Rule 5. need <= limit <= u32::MAX: lossless.
        PeriodDecision {
            allowed: true,
            remaining: limit.saturating_sub(need),
            retry_after_us: 0,
            reset_after_us,
            write: Some(PeriodWrite {
                start_us: start,
                count: need as u32,
                ttl_ms: reset_after_us.div_ceil(1000),
            }),
        }
    }

    /// Rule 2: `(start, next)` of the period holding `now_us`; `next` may
    /// be beyond [`MAX_TIME_US`] (by at most 32 days).
    const fn bounds(&self, now_us: u64) -> Result<(u64, u64), CheckError> {
        if now_us > MAX_TIME_US {
            return Err(CheckError::TimeOutOfRange);
        }
        // |offset| <= 18 h: within i64, and below EPOCH_US, so the local
        // time counted from 0000-03-01 is positive.
        let offset_us = (self.offset_s as i64).saturating_mul(1_000_000);
        let local_us = match now_us
            .saturating_add(EPOCH_US)
            .checked_add_signed(offset_us)
        {
            Some(local) => local,
            None => return Err(CheckError::TimeOutOfRange),
        };
        // At most (2^53 + EPOCH_US + 18 h) / 1 day: 823 718, a u32.
        let day = (local_us / DAY_US) as u32;
        let (start_day, length) = match self.unit {
            PeriodUnit::Day => (day, 1),
            PeriodUnit::Week => {
                // 0000-03-01 was a Wednesday: day + 2 is 0 mod 7 on Mondays.
                let monday = day.saturating_sub(day.saturating_add(2) % 7);
                (monday, 7)
            }
            PeriodUnit::Month => {
                let (year, month, day_of_month) = civil_from_days(day);
                (
                    day.saturating_sub(day_of_month.saturating_sub(1)),
                    days_in_month(year, month),
                )
            }
        };
        let start = utc_of(start_day, offset_us);
        let next = utc_of(start_day.saturating_add(length), offset_us);
        Ok((start, next))
    }
}

/// The UTC instant (µs since the Unix epoch, 0 if before it) of local
/// midnight starting `day` (days since 0000-03-01), `offset_us` ahead of
/// UTC.
const fn utc_of(day: u32, offset_us: i64) -> u64 {
    // day <= 823 800 (see `bounds`), so day * DAY_US < 2^57: the local
    // time and the instant fit an i64.
    let local_us = (day as u64).saturating_mul(DAY_US);
    let from_epoch = (local_us as i64)
        .saturating_sub(EPOCH_US as i64)
        .saturating_sub(offset_us);
    if from_epoch < 0 { 0 } else { from_epoch as u64 }
}

/// Year, month (1 to 12) and day of month (1 to 31) of the day `days`
/// after 0000-03-01 (proleptic Gregorian): Howard Hinnant's
/// `civil_from_days` (public domain, "chrono-Compatible Low-Level Date
/// Algorithms"), on days counted from his epoch so that every value is
/// unsigned.
///
/// The calendar repeats every 400 years (an era, 146 097 days); within an
/// era, years start on March 1st, so that a leap day is the last day of
/// its year.
#[allow(clippy::arithmetic_side_effects)] // every bound is noted below
const fn civil_from_days(days: u32) -> (u32, u32, u32) {
    // Divisions and remainders by non-zero constants; for any u32 input:
    let era = days / 146_097; // <= 29 398
    let day_of_era = days % 146_097; // 0 ..= 146 096
    // Subtracts the leap days before the day: 0 ..= 399.
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524
        - day_of_era / 146_096)
        / 365;
    let year = year_of_era + era * 400; // <= 11 759 599
    // 0 ..= 365: the day of the year that starts on March 1st.
    let day_of_year =
        day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    // 0 ..= 11, from March: the month lengths 31 30 31 30 31 repeat every
    // 153 days.
    let march_month = (5 * day_of_year + 2) / 153;
    let day_of_month = day_of_year - (153 * march_month + 2) / 5 + 1; // 1..=31
    if march_month < 10 {
        (year, march_month + 3, day_of_month)
    } else {
        // January and February belong to the next civil year.
        (year + 1, march_month - 9, day_of_month)
    }
}

/// Days in `month` (1 to 12) of `year`, in the Gregorian calendar.
const fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if year.is_multiple_of(4)
            && (!year.is_multiple_of(100) || year.is_multiple_of(400)) =>
        {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// The outcome of [`Period::check`]: the answer, and the record, if any,
/// the store must write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PeriodDecision {
    /// Whether the request passes.
    pub allowed: bool,
    /// Requests of cost 1 that would still pass in this period; 0 when
    /// refused.
    pub remaining: u64,
    /// When refused, how long until the same request passes: the next
    /// period's start minus now; 0 when allowed.
    pub retry_after_us: u64,
    /// How long until the next period starts, and the count is 0.
    pub reset_after_us: u64,
    /// The record the store must now hold, or `None` to leave it as it is.
    /// Only a pass writes; its write is its charge.
    pub write: Option<PeriodWrite>,
}

impl PeriodDecision {
    /// This answer in the shape of a GCRA [`Decision`], with nothing to
    /// store in a TAT: for [`Verdict::of`](crate::Verdict::of) over limits
    /// of several kinds, and for the same response headers.
    ///
    /// ```
    /// let d = gcra_core::PeriodDecision { retry_after_us: 9, ..Default::default() };
    /// assert_eq!(d.as_decision().retry_after_us, 9);
    /// ```
    pub const fn as_decision(&self) -> Decision {
        Decision {
            allowed: self.allowed,
            remaining: self.remaining,
            retry_after_us: self.retry_after_us,
            reset_after_us: self.reset_after_us,
            store: None,
        }
    }
}

/// A period's record to store: its start, its count, and the time after
/// which it may be forgotten.
///
/// The expiry is rounded up: a record that disappeared a millisecond before
/// the next period would hand out requests the period does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeriodWrite {
    /// The start of the period counted, µs since the Unix epoch.
    pub start_us: u64,
    /// Its count, with this request.
    pub count: u32,
    /// `ceil((next start - now) / 1000)`: when the next period starts, in
    /// ms. At least 1.
    pub ttl_ms: u64,
}
