use core::fmt;
use core::time::Duration;

use crate::{MAX_TIME_US, MAX_WINDOW_US};

const MICROS_PER_SECOND: u64 = 1_000_000;

/// A validated rate: `limit` requests per `period`, with a `burst`.
///
/// A `Quota` that exists is always usable: the emission interval
/// `T = period / limit` is at least 1 µs and the burst window
/// `tau = T * burst` is at most [`MAX_WINDOW_US`], so that a bucket (and the
/// debt a settlement may leave, see [`Quota::settle`]) always fits beside a
/// real clock.
///
/// `T` is rounded **up** to the microsecond: a quota never allows more than
/// its rate. For a period that `limit` divides (every `per_*` quota up to
/// 1 000 000 per second, 60 per minute, ...) that changes nothing; otherwise
/// the quota allows slightly less than it says. At the extreme,
/// 600 000 per second is `T` = 2 µs, 500 000 per second:
///
/// ```
/// use gcra_core::Quota;
/// assert_eq!(Quota::per_minute(7).emission_interval_us(), 8_571_429); // not ..428
/// assert_eq!(Quota::per_second(600_000).emission_interval_us(), 2);
/// ```
///
/// The `per_*` constructors are `const` and panic on a value that cannot make
/// a quota (in a `const` item that is a compile error); [`Quota::new`] and
/// [`Quota::try_allow_burst`] return a [`QuotaError`] instead.
///
/// ```
/// use gcra_core::Quota;
/// use std::time::Duration;
///
/// const FREE: Quota = Quota::per_minute(10);
/// assert_eq!(FREE.limit(), 10);
/// assert_eq!(FREE.burst(), 10);
/// assert_eq!(FREE.period(), Duration::from_secs(60));
///
/// // 100 per hour, but at most 5 at once.
/// let steady = Quota::per_hour(100).allow_burst(5);
/// assert_eq!(steady.emission_interval_us(), 36_000_000);
/// assert_eq!(steady.burst_offset_us(), 5 * 36_000_000);
///
/// // Values that cannot be a quota are typed errors.
/// assert!(Quota::new(0, Duration::from_secs(1)).is_err());
/// assert!(Quota::new(2_000_000, Duration::from_secs(1)).is_err()); // T < 1 µs
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u32,
    burst: u32,
    period_us: u64,
    emission_interval_us: u64,
    burst_offset_us: u64,
    /// `tau` + the most debt a settlement or a reservation may leave, in
    /// µs ([`Quota::ceiling_us`]), ready for rule 1 of every check; its
    /// [`DEFAULT_DEBT`] bit set while the debt is the default one, which
    /// follows the burst.
    ceiling_us: u64,
}

/// The bit of [`Quota`]'s `ceiling_us` that says no debt was set: the
/// default, [`DEFAULT_MAX_DEBT`] or `tau` if longer, whatever the burst
/// becomes. A ceiling is at most 2^51: the bit is free.
const DEFAULT_DEBT: u64 = 1 << 63;

/// The ceiling of a quota whose burst window is `tau` and whose debt is
/// the default one, its [`DEFAULT_DEBT`] bit set.
const fn default_ceiling(tau: u64) -> u64 {
    // An hour is far below MAX_WINDOW_US: lossless.
    let hour = DEFAULT_MAX_DEBT.as_micros() as u64;
    let debt = if tau > hour { tau } else { hour };
    // Both are at most 2^50: no overflow, and the bit stays free.
    tau.saturating_add(debt) | DEFAULT_DEBT
}

/// The most debt a quota carries unless it says otherwise
/// ([`Quota::allow_debt`]): an hour, or one burst window (`tau`) if that is
/// longer.
///
/// It is the same on every instance that applies the quota, whatever else
/// each does: the clock-back cap of rule 1 reads a TAT beyond
/// `tau + max_debt` as a clock that went back, so an instance whose bound
/// were shorter than another's would erase the debts and reservations the
/// other made (a wait of a few seconds, a settled cost). A clock that jumps
/// back by less than this delays the bucket's requests by the jump.
///
/// ```
/// use gcra_core::{DEFAULT_MAX_DEBT, Quota};
/// assert_eq!(DEFAULT_MAX_DEBT.as_secs(), 3600);
/// assert_eq!(Quota::per_minute(10).max_debt_us(), 3_600_000_000);
/// assert_eq!(Quota::per_day(10).max_debt_us(), 86_400_000_000);
/// ```
pub const DEFAULT_MAX_DEBT: Duration = Duration::from_secs(3600);

/// Why a [`Quota`] could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaError {
    /// The limit was 0: no request could ever pass.
    ZeroLimit,
    /// The burst was 0: no request could ever pass.
    ZeroBurst,
    /// The period was shorter than 1 µs.
    ZeroPeriod,
    /// `period / limit` is below 1 µs: more than one request per
    /// microsecond cannot be expressed.
    IntervalTooSmall,
    /// The period is beyond [`MAX_TIME_US`], or the burst window
    /// (`T * burst`) beyond [`MAX_WINDOW_US`] (about 35.7 years): such a
    /// bucket could not be kept beside a real clock.
    OutOfRange,
}

impl QuotaError {
    const fn message(self) -> &'static str {
        match self {
            QuotaError::ZeroLimit => "quota limit must be at least 1",
            QuotaError::ZeroBurst => "quota burst must be at least 1",
            QuotaError::ZeroPeriod => {
                "quota period must be at least 1 microsecond"
            }
            QuotaError::IntervalTooSmall => {
                "quota emission interval (period / limit) is below 1 microsecond"
            }
            QuotaError::OutOfRange => {
                "quota period exceeds 2^53 microseconds, or its burst window exceeds 2^50"
            }
        }
    }
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl core::error::Error for QuotaError {}

/// Unwraps in a `const fn`, where `Result::unwrap` is not available. The
/// documented panic of the `per_*` constructors; a compile error in a `const`.
#[allow(clippy::panic)]
const fn or_panic(result: Result<Quota, QuotaError>) -> Quota {
    match result {
        Ok(quota) => quota,
        // A literal per variant: const panics cannot format.
        Err(QuotaError::ZeroLimit) => panic!("quota limit must be at least 1"),
        Err(QuotaError::ZeroBurst) => panic!("quota burst must be at least 1"),
        Err(QuotaError::ZeroPeriod) => {
            panic!("quota period must be at least 1 microsecond")
        }
        Err(QuotaError::IntervalTooSmall) => {
            panic!(
                "quota emission interval (period / limit) is below 1 microsecond"
            )
        }
        Err(QuotaError::OutOfRange) => {
            panic!(
                "quota period exceeds 2^53 microseconds, or its burst window exceeds 2^50"
            )
        }
    }
}

impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quota")
            .field("limit", &self.limit)
            .field("burst", &self.burst)
            .field("period_us", &self.period_us)
            .field("emission_interval_us", &self.emission_interval_us)
            .field("burst_offset_us", &self.burst_offset_us)
            .field("max_debt_us", &self.max_debt_us())
            .finish()
    }
}

/// A quota as a person says it: `10 per minute`, `100 per second, burst
/// 20`, `3 per 90 s`, `3 per 1.5s` (a period of no whole unit reads as its
/// `Debug`).
///
/// ```
/// use gcra_core::Quota;
/// assert_eq!(Quota::per_minute(10).to_string(), "10 per minute");
/// assert_eq!(Quota::per_second(100).allow_burst(20).to_string(), "100 per second, burst 20");
/// let ninety = Quota::new(3, std::time::Duration::from_secs(90))?;
/// assert_eq!(ninety.to_string(), "3 per 90 s");
/// # Ok::<(), gcra_core::QuotaError>(())
/// ```
impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} per ", self.limit())?;
        write_span(f, self.period())?;
        if self.burst() != self.limit() {
            write!(f, ", burst {}", self.burst())?;
        }
        Ok(())
    }
}

/// A span as a person says it: `second`, `minute`, `hour`, `day`, else
/// `90 s`, `2 h`, or its `Debug` (`1.5s`).
pub(crate) fn write_span(
    f: &mut fmt::Formatter<'_>,
    span: Duration,
) -> fmt::Result {
    const NAMED: [(u64, &str, &str); 4] = [
        (86_400, "day", "d"),
        (3600, "hour", "h"),
        (60, "minute", "min"),
        (1, "second", "s"),
    ];
    if span.subsec_nanos() == 0 {
        let secs = span.as_secs();
        for (unit, name, short) in NAMED {
            if secs == unit {
                return f.write_str(name);
            }
            let whole = secs > 0 && secs.is_multiple_of(unit);
            if let Some(count) = secs.checked_div(unit).filter(|_| whole) {
                return write!(f, "{count} {short}");
            }
        }
    }
    write!(f, "{span:?}")
}

impl Quota {
    /// `limit` requests per `period`, with a burst of `limit`.
    ///
    /// ```
    /// use gcra_core::{Quota, QuotaError};
    /// use std::time::Duration;
    ///
    /// let quota = Quota::new(3, Duration::from_millis(1500))?;
    /// assert_eq!(quota.emission_interval_us(), 500_000);
    /// assert_eq!(Quota::new(1, Duration::ZERO), Err(QuotaError::ZeroPeriod));
    /// # Ok::<(), QuotaError>(())
    /// ```
    pub const fn new(
        limit: u32,
        period: Duration,
    ) -> Result<Quota, QuotaError> {
        let micros = period.as_micros();
        if micros > MAX_TIME_US as u128 {
            return Err(QuotaError::OutOfRange);
        }
        // Lossless: checked against MAX_TIME_US just above.
        Self::from_micros(limit, micros as u64)
    }

    const fn from_micros(
        limit: u32,
        period_us: u64,
    ) -> Result<Quota, QuotaError> {
        if limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if period_us == 0 {
            return Err(QuotaError::ZeroPeriod);
        }
        // Beyond MAX_TIME_US, a period is refused by `new`; the `per_*`
        // constructors pass a day at most.
        // Rounded up: a quota never allows more than its rate.
        if (limit as u64) > period_us {
            return Err(QuotaError::IntervalTooSmall);
        }
        let emission_interval_us = period_us.div_ceil(limit as u64);
        Self::with_burst(limit, period_us, emission_interval_us, limit)
    }

    const fn with_burst(
        limit: u32,
        period_us: u64,
        emission_interval_us: u64,
        burst: u32,
    ) -> Result<Quota, QuotaError> {
        if burst == 0 {
            return Err(QuotaError::ZeroBurst);
        }
        let burst_offset_us =
            match emission_interval_us.checked_mul(burst as u64) {
                Some(tau) if tau <= MAX_WINDOW_US => tau,
                _ => return Err(QuotaError::OutOfRange),
            };
        Ok(Quota {
            limit,
            burst,
            period_us,
            emission_interval_us,
            burst_offset_us,
            ceiling_us: default_ceiling(burst_offset_us),
        })
    }

    /// `limit` requests per second.
    ///
    /// # Panics
    ///
    /// If `limit` is 0 or above 1 000 000 (an interval under 1 µs); a compile
    /// error in a `const`. Use [`Quota::new`] for a `Result`.
    ///
    /// ```
    /// assert_eq!(gcra_core::Quota::per_second(4).emission_interval_us(), 250_000);
    /// ```
    pub const fn per_second(limit: u32) -> Quota {
        or_panic(Self::from_micros(limit, MICROS_PER_SECOND))
    }

    /// `limit` requests per minute.
    ///
    /// # Panics
    ///
    /// If `limit` is 0 or above 60 000 000; a compile error in a `const`.
    /// Use [`Quota::new`] for a `Result`.
    ///
    /// ```
    /// assert_eq!(gcra_core::Quota::per_minute(10).emission_interval_us(), 6_000_000);
    /// ```
    pub const fn per_minute(limit: u32) -> Quota {
        or_panic(Self::from_micros(limit, 60 * MICROS_PER_SECOND))
    }

    /// `limit` requests per hour.
    ///
    /// # Panics
    ///
    /// If `limit` is 0; a compile error in a `const`. Use [`Quota::new`] for a
    /// `Result`.
    ///
    /// ```
    /// assert_eq!(gcra_core::Quota::per_hour(3600).emission_interval_us(), 1_000_000);
    /// ```
    pub const fn per_hour(limit: u32) -> Quota {
        or_panic(Self::from_micros(limit, 3600 * MICROS_PER_SECOND))
    }

    /// `limit` requests per day.
    ///
    /// # Panics
    ///
    /// If `limit` is 0; a compile error in a `const`. Use [`Quota::new`] for a
    /// `Result`.
    ///
    /// ```
    /// assert_eq!(gcra_core::Quota::per_day(24).emission_interval_us(), 3_600_000_000);
    /// ```
    pub const fn per_day(limit: u32) -> Quota {
        or_panic(Self::from_micros(limit, 86_400 * MICROS_PER_SECOND))
    }

    /// The same rate, but at most `burst` requests at once (or, above the
    /// limit, more than one period's worth after an idle time).
    ///
    /// # Panics
    ///
    /// If `burst` is 0 or `T * burst` exceeds [`MAX_WINDOW_US`]; a compile
    /// error in a `const`. Use [`Quota::try_allow_burst`] for a `Result`.
    ///
    /// ```
    /// let quota = gcra_core::Quota::per_minute(10).allow_burst(2);
    /// assert_eq!(quota.burst(), 2);
    /// assert_eq!(quota.limit(), 10);
    /// assert_eq!(quota.burst_offset_us(), 12_000_000);
    /// ```
    pub const fn allow_burst(self, burst: u32) -> Quota {
        or_panic(self.try_allow_burst(burst))
    }

    /// Like [`Quota::allow_burst`], with a typed error instead of a panic.
    ///
    /// ```
    /// use gcra_core::{Quota, QuotaError};
    /// assert_eq!(Quota::per_second(1).try_allow_burst(0), Err(QuotaError::ZeroBurst));
    /// assert_eq!(Quota::per_day(1).try_allow_burst(u32::MAX), Err(QuotaError::OutOfRange));
    /// // One a day with a burst of 100 000: a window of 274 years.
    /// assert_eq!(Quota::per_day(1).try_allow_burst(100_000), Err(QuotaError::OutOfRange));
    /// ```
    pub const fn try_allow_burst(
        self,
        burst: u32,
    ) -> Result<Quota, QuotaError> {
        match Self::with_burst(
            self.limit,
            self.period_us,
            self.emission_interval_us,
            burst,
        ) {
            Ok(quota) if self.ceiling_us & DEFAULT_DEBT != 0 => Ok(quota),
            // The debt set is kept: tau <= 2^50 and so is the debt.
            Ok(quota) => Ok(Quota {
                ceiling_us: quota
                    .burst_offset_us
                    .saturating_add(self.max_debt_us()),
                ..quota
            }),
            Err(error) => Err(error),
        }
    }

    /// The same rate, with at most `debt` of debt after a
    /// [settlement](Quota::settle) or a [reservation](Quota::reserve) (by
    /// default [`DEFAULT_MAX_DEBT`], or `tau` if longer).
    ///
    /// A settled debt moves the TAT beyond `now + tau`; the next requests
    /// wait for it. A stored TAT beyond `now + tau + max debt` cannot be a
    /// debt: the clock went back, and the TAT is capped there (rule 1 of the
    /// [crate docs](crate#the-rules-exactly)). So the bound is a trade: a
    /// larger one carries larger debts whole, and lets a clock that jumped
    /// back by up to that much delay the bucket's requests by the jump.
    /// [`Quota::unbounded_debt`] carries every debt. Every instance that
    /// shares a bucket must apply the same bound: the shortest one caps
    /// away the others' longer debts.
    ///
    /// # Panics
    ///
    /// If `debt` exceeds [`MAX_WINDOW_US`]; a compile error in a `const`.
    /// Use [`Quota::try_allow_debt`] for a `Result`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let tokens = gcra_core::Quota::per_minute(1000).allow_debt(Duration::from_secs(3600));
    /// assert_eq!(tokens.max_debt_us(), 3_600_000_000);
    /// assert_eq!(tokens.ceiling_us(), 60_000_000 + 3_600_000_000);
    /// // A burst set afterwards keeps the bound.
    /// assert_eq!(tokens.allow_burst(10).max_debt_us(), 3_600_000_000);
    /// ```
    pub const fn allow_debt(self, debt: Duration) -> Quota {
        or_panic(self.try_allow_debt(debt))
    }

    /// Like [`Quota::allow_debt`], with a typed error instead of a panic.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gcra_core::{Quota, QuotaError};
    /// let years = Duration::from_secs(40 * 365 * 86_400);
    /// assert_eq!(Quota::per_minute(1).try_allow_debt(years), Err(QuotaError::OutOfRange));
    /// ```
    pub const fn try_allow_debt(
        self,
        debt: Duration,
    ) -> Result<Quota, QuotaError> {
        let micros = debt.as_micros();
        if micros > MAX_WINDOW_US as u128 {
            return Err(QuotaError::OutOfRange);
        }
        Ok(Quota {
            // Lossless: checked against MAX_WINDOW_US just above, and so
            // is tau: no overflow.
            ceiling_us: self.burst_offset_us.saturating_add(micros as u64),
            ..self
        })
    }

    /// The same rate, carrying any debt a settlement leaves, whole (up to
    /// [`MAX_WINDOW_US`], about 35.7 years): what a limit whose actual cost
    /// is known only after the response needs (the tokens of a generated
    /// answer). See [`Quota::allow_debt`] for what it trades.
    ///
    /// ```
    /// let tokens = gcra_core::Quota::per_minute(1000).unbounded_debt();
    /// assert_eq!(tokens.max_debt_us(), gcra_core::MAX_WINDOW_US);
    /// ```
    pub const fn unbounded_debt(self) -> Quota {
        Quota {
            ceiling_us: self.burst_offset_us.saturating_add(MAX_WINDOW_US),
            ..self
        }
    }

    /// Requests per period.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// Requests (of cost 1) that may pass at once: the `x-ratelimit-limit`.
    pub const fn burst(&self) -> u32 {
        self.burst
    }

    /// The period the limit applies to.
    pub const fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    /// `T = period / limit`, in µs: what one unit of cost moves the TAT by.
    pub const fn emission_interval_us(&self) -> u64 {
        self.emission_interval_us
    }

    /// `tau = T * burst`, in µs: how far ahead of now the TAT may run.
    pub const fn burst_offset_us(&self) -> u64 {
        self.burst_offset_us
    }

    /// The most debt, in µs, a [settlement](Quota::settle) or a
    /// [reservation](Quota::reserve) may leave: [`DEFAULT_MAX_DEBT`] (or
    /// `tau` if longer) unless set by [`Quota::allow_debt`].
    ///
    /// ```
    /// assert_eq!(gcra_core::Quota::per_minute(10).max_debt_us(), 3_600_000_000);
    /// ```
    pub const fn max_debt_us(&self) -> u64 {
        // The ceiling is tau + the debt: no underflow.
        self.ceiling_us().saturating_sub(self.burst_offset_us)
    }

    /// `tau + max debt`, in µs: the furthest ahead of now a stored TAT is
    /// kept (`tau` plus an hour by default). A TAT between `tau` and the ceiling
    /// ahead is a debt left by [`Quota::settle`]; beyond, the clock went
    /// back and the TAT is capped here (rule 1 of the
    /// [crate docs](crate#the-rules-exactly)).
    ///
    /// ```
    /// assert_eq!(gcra_core::Quota::per_minute(10).ceiling_us(), 3_660_000_000);
    /// ```
    #[inline]
    pub const fn ceiling_us(&self) -> u64 {
        self.ceiling_us & !DEFAULT_DEBT
    }

    /// This quota as one of `share` instances applies it alone (a
    /// fallback's local share while a shared store is down): the rate
    /// divided exactly (a period `share` times longer), the burst divided
    /// down to at least 1, the debt bound as it was (a debt is time to
    /// wait, whatever the share). `share` 0 or 1: the quota itself.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gcra_core::Quota;
    ///
    /// let local = Quota::per_minute(10).divided(2);
    /// assert_eq!((local.limit(), local.burst()), (10, 5));
    /// assert_eq!(local.period(), Duration::from_secs(120));
    ///
    /// // A burst below the share: one request at once, at a third of the rate.
    /// let local = Quota::per_minute(2).divided(3);
    /// assert_eq!(local.burst(), 1);
    /// assert_eq!(local.emission_interval_us(), 90_000_000);
    ///
    /// let tokens = Quota::per_minute(1000).unbounded_debt();
    /// assert_eq!(tokens.divided(4).max_debt_us(), tokens.max_debt_us());
    /// ```
    pub fn divided(self, share: u32) -> Quota {
        if share <= 1 {
            return self;
        }
        // share >= 2 here: no division by zero.
        let burst = self.burst.checked_div(share).unwrap_or(1).max(1);
        let debt = Duration::from_micros(self.max_debt_us());
        self.period()
            .checked_mul(share)
            .and_then(|period| Quota::new(self.limit, period).ok())
            .and_then(|divided| divided.try_allow_burst(burst).ok())
            .and_then(|divided| divided.try_allow_debt(debt).ok())
            // A window too long to divide: at least no burst beyond 1.
            .or_else(|| self.try_allow_burst(1).ok())
            .unwrap_or(self)
    }

    /// Whether a request of this cost can pass at all, after any wait:
    /// `cost >= 1` and `T * cost <= tau`.
    ///
    /// ```
    /// let free = gcra_core::Quota::per_minute(10);
    /// assert!(free.can_ever_pass(10));
    /// assert!(!free.can_ever_pass(11));
    /// assert!(!free.can_ever_pass(0));
    /// ```
    pub const fn can_ever_pass(&self, cost: u32) -> bool {
        // With T >= 1 and tau = T * burst, `T * cost <= tau` is `cost <= burst`.
        cost >= 1 && cost <= self.burst
    }
}
