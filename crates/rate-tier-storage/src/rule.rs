//! What a bucket enforces: [`Rule`], a GCRA rate or one of the kinds beside
//! it, and [`RuleKind`], what a store says it can decide.

use std::fmt;

use gcra_core::{CheckError, Concurrency, Period, PeriodUnit, Quota, Window};

/// What one bucket enforces: a GCRA rate ([`Quota`]), an exact sliding
/// window ([`Window`]), a calendar period ([`Period`]) or a number of
/// requests in flight ([`Concurrency`]).
///
/// A rate spreads requests evenly and keeps one number per bucket; use it
/// for "how fast". A window counts exactly, at the cost of one timestamp
/// per counted request (at most [`gcra_core::MAX_WINDOW_LIMIT`]): "at most
/// 5 logins in any 60 s". A period counts per calendar day, ISO week or
/// month: "1,000 exports a month", reset on the 1st. A concurrency limit
/// counts requests in flight: a slot is taken when the decision passes and
/// given back by [`StorageExt::release`](crate::StorageExt::release) when the
/// request ends.
///
/// ```
/// use std::time::Duration;
/// use rate_tier_storage::{Rule, RuleKind};
/// use gcra_core::{Period, PeriodUnit, Quota, Window};
///
/// let rate: Rule = Quota::per_minute(10).into();
/// let login: Rule = Window::new(5, Duration::from_secs(60))?.into();
/// let exports: Rule = Period::new(3, PeriodUnit::Month, 0)?.into();
/// assert_eq!(
///     [rate.kind(), login.kind(), exports.kind()],
///     [RuleKind::Rate, RuleKind::Window, RuleKind::Period]
/// );
/// assert_eq!([rate.limit(), login.limit(), exports.limit()], [10, 5, 3]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// A GCRA rate: how fast.
    Rate(Quota),
    /// At most `limit` in any window, exactly.
    Window(Window),
    /// At most `limit` per calendar day, week or month.
    Period(Period),
    /// At most `limit` in flight at once.
    Concurrency(Concurrency),
}

/// A rule as a person says it, its kind's own words: `10 per minute`, `5
/// in any 30 s`, `1000 per month`, `4 at once`.
///
/// ```
/// use rate_tier_storage::Rule;
/// use gcra_core::{Concurrency, Quota};
/// assert_eq!(Rule::from(Quota::per_minute(10)).to_string(), "10 per minute");
/// assert_eq!(Rule::from(Concurrency::new(4)?).to_string(), "4 at once");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Rate(quota) => fmt::Display::fmt(quota, f),
            Rule::Window(window) => fmt::Display::fmt(window, f),
            Rule::Period(period) => fmt::Display::fmt(period, f),
            Rule::Concurrency(concurrency) => fmt::Display::fmt(concurrency, f),
        }
    }
}

/// The kind of a [`Rule`], as a store says what it can decide
/// ([`Capabilities::supports`](crate::Capabilities::supports)).
///
/// ```
/// use rate_tier_storage::RuleKind;
/// assert_eq!(RuleKind::Window.to_string(), "window");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleKind {
    /// [`Rule::Rate`].
    Rate,
    /// [`Rule::Window`].
    Window,
    /// [`Rule::Period`].
    Period,
    /// [`Rule::Concurrency`].
    Concurrency,
}

impl RuleKind {
    /// Every kind, in the order of their bits in
    /// [`Capabilities`](crate::Capabilities).
    ///
    /// ```
    /// use rate_tier_storage::{Capabilities, RuleKind};
    /// let every = Capabilities::new("mine").with_every_kind();
    /// assert!(RuleKind::ALL.iter().all(|&kind| every.supports(kind)));
    /// ```
    pub const ALL: [RuleKind; 4] = [
        RuleKind::Rate,
        RuleKind::Window,
        RuleKind::Period,
        RuleKind::Concurrency,
    ];

    /// Its name in configuration and messages: `rate`, `window`, `period`.
    pub fn as_str(self) -> &'static str {
        match self {
            RuleKind::Rate => "rate",
            RuleKind::Window => "window",
            RuleKind::Period => "period",
            RuleKind::Concurrency => "concurrency",
        }
    }
}

impl RuleKind {
    /// Its name with an article, for messages: `a rate`, `a window`, `a
    /// period`, `a concurrency limit`.
    ///
    /// ```
    /// assert_eq!(rate_tier_storage::RuleKind::Concurrency.described(), "a concurrency limit");
    /// ```
    pub fn described(self) -> &'static str {
        match self {
            RuleKind::Rate => "a rate",
            RuleKind::Window => "a window",
            RuleKind::Period => "a period",
            RuleKind::Concurrency => "a concurrency limit",
        }
    }
}

impl fmt::Display for RuleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<Quota> for Rule {
    fn from(quota: Quota) -> Rule {
        Rule::Rate(quota)
    }
}

impl From<Window> for Rule {
    fn from(window: Window) -> Rule {
        Rule::Window(window)
    }
}

impl From<Period> for Rule {
    fn from(period: Period) -> Rule {
        Rule::Period(period)
    }
}

impl From<Concurrency> for Rule {
    fn from(concurrency: Concurrency) -> Rule {
        Rule::Concurrency(concurrency)
    }
}

impl Rule {
    /// Its kind.
    pub fn kind(&self) -> RuleKind {
        match self {
            Rule::Rate(_) => RuleKind::Rate,
            Rule::Window(_) => RuleKind::Window,
            Rule::Period(_) => RuleKind::Period,
            Rule::Concurrency(_) => RuleKind::Concurrency,
        }
    }

    /// The quota of a rate; `None` for the other kinds.
    pub fn as_rate(&self) -> Option<Quota> {
        match self {
            Rule::Rate(quota) => Some(*quota),
            _ => None,
        }
    }

    /// A rate's quota; for another kind, a nominal rate of its limit per
    /// its length (a period's nominal length, a second for a concurrency
    /// limit), for reports only: no store decides another kind by it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rate_tier_storage::Rule;
    /// use gcra_core::{Quota, Window};
    /// assert_eq!(Rule::from(Quota::per_minute(10)).as_quota(), Quota::per_minute(10));
    /// let login = Rule::from(Window::new(5, Duration::from_secs(60))?);
    /// assert_eq!(login.as_quota(), Quota::per_minute(5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn as_quota(&self) -> Quota {
        match self {
            Rule::Rate(quota) => *quota,
            other => nominal_quota(other),
        }
    }

    /// Requests of cost 1 a fresh bucket allows: a rate's burst, a window's
    /// or a period's limit. No cost above it can ever pass.
    pub fn limit(&self) -> u32 {
        match self {
            Rule::Rate(quota) => quota.burst(),
            Rule::Window(window) => window.limit(),
            Rule::Period(period) => period.limit(),
            Rule::Concurrency(concurrency) => concurrency.limit(),
        }
    }

    /// The window of the IETF `RateLimit-Policy` (`w`), in µs, for a
    /// decision at `now_us`: a rate's burst offset (`tau`), a window's
    /// length, the length of the period `now_us` is in (a month: 28 to 31
    /// days); 0 for a concurrency limit, which has no window.
    ///
    /// ```
    /// use rate_tier_storage::Rule;
    /// use gcra_core::{Period, PeriodUnit};
    /// const DAY: u64 = 86_400_000_000;
    /// let monthly = Rule::from(Period::new(1000, PeriodUnit::Month, 0)?);
    /// let feb_2024 = 19_754 * DAY; // 2024-02-01
    /// assert_eq!(monthly.policy_window_us(feb_2024 + 5), 29 * DAY);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy_window_us(&self, now_us: u64) -> u64 {
        match self {
            Rule::Rate(quota) => quota.burst_offset_us(),
            Rule::Window(window) => window.window_us(),
            Rule::Period(period) => {
                match (period.start_of(now_us), period.next_start(now_us)) {
                    (Ok(start), Ok(next)) => next.saturating_sub(start),
                    _ => nominal_us(period.unit()),
                }
            }
            Rule::Concurrency(_) => 0,
        }
    }

    /// Whether a refusal by this rule is told to reset at the instant its
    /// request may retry rather than when its bucket is full again: a
    /// window is full again only when its newest request leaves it, and
    /// when a slot frees no store can foresee. A rate's and a period's two
    /// instants coincide on a refusal.
    ///
    /// ```
    /// use rate_tier_storage::Rule;
    /// use gcra_core::{Concurrency, Quota};
    /// assert!(!Rule::from(Quota::per_minute(10)).resets_at_retry());
    /// assert!(Rule::from(Concurrency::new(4)?).resets_at_retry());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn resets_at_retry(&self) -> bool {
        match self {
            Rule::Rate(_) | Rule::Period(_) => false,
            Rule::Window(_) | Rule::Concurrency(_) => true,
        }
    }

    /// The rule an instance applies alone when `share` instances split it
    /// (a fallback's local share): a rate as [`Quota::divided`], a window's
    /// or a period's limit divided, at least 1.
    pub fn divided(self, share: u32) -> Rule {
        if share <= 1 {
            return self;
        }
        let part = |limit: u32| (limit / share).max(1);
        match self {
            Rule::Rate(quota) => Rule::Rate(quota.divided(share)),
            Rule::Window(window) => {
                Window::new(part(window.limit()), window.window())
                    .map_or(self, Rule::Window)
            }
            Rule::Period(period) => Period::new(
                part(period.limit()),
                period.unit(),
                period.offset_s(),
            )
            .map_or(self, Rule::Period),
            Rule::Concurrency(concurrency) => {
                Concurrency::new(part(concurrency.limit()))
                    .map_or(self, Rule::Concurrency)
            }
        }
    }

    /// A cost above [`Rule::limit`] can never pass.
    pub(crate) fn admits(&self, cost: u32) -> Result<(), CheckError> {
        let limit = self.limit();
        if cost > limit {
            return Err(CheckError::CostExceedsBurst { cost, burst: limit });
        }
        Ok(())
    }
}

/// A period's nominal length, for a time the calendar cannot place.
pub(crate) fn nominal_us(unit: PeriodUnit) -> u64 {
    const DAY_US: u64 = 86_400_000_000;
    match unit {
        PeriodUnit::Day => DAY_US,
        PeriodUnit::Week => 7 * DAY_US,
        PeriodUnit::Month => 30 * DAY_US,
    }
}

/// [`Rule::as_quota`] of a kind that is not a rate.
#[cold]
fn nominal_quota(rule: &Rule) -> Quota {
    // Too many for the length (a concurrency limit above 10^6 a nominal
    // second): at most 10^6 a second, the fastest `per_second` holds.
    let per = |limit: u32, length_us: u64| {
        Quota::new(limit, std::time::Duration::from_micros(length_us))
            .unwrap_or_else(|_| Quota::per_second(limit.clamp(1, 1_000_000)))
    };
    match rule {
        Rule::Rate(quota) => *quota,
        Rule::Window(window) => per(window.limit(), window.window_us()),
        Rule::Period(period) => per(period.limit(), nominal_us(period.unit())),
        // A slot is held as long as its request: a nominal second.
        Rule::Concurrency(concurrency) => per(concurrency.limit(), 1_000_000),
    }
}

/// One number of a rule as the stores' scripts read it.
#[cfg(any(feature = "redis", feature = "postgres"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScriptArg {
    /// A number as it is.
    Number(i128),
    /// A request's slot id, all 64 bits of it (PostgreSQL's `int8` takes
    /// them as they are).
    SlotId(u64),
}

/// A rule as `decide_mixed.lua` and `_decide_mixed` (migration.sql) read
/// it: a tag (0 rate, 1 window, 2 period, 3 concurrency) and three numbers.
/// A rate's are those of `rate` (the charge's quota) and a concurrency
/// limit's end with the store's lease and the request's slot id.
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) fn script_rule(
    rule: &Rule,
    rate: Quota,
    lease: gcra_core::Lease,
    slot_id: u64,
) -> [ScriptArg; 4] {
    use ScriptArg::Number;
    match rule {
        Rule::Rate(_) => [
            Number(0),
            Number(rate.emission_interval_us().into()),
            Number(rate.burst_offset_us().into()),
            Number(rate.max_debt_us().into()),
        ],
        Rule::Window(window) => [
            Number(1),
            Number(window.limit().into()),
            Number(window.window_us().into()),
            Number(0),
        ],
        Rule::Period(period) => [
            Number(2),
            Number(period.limit().into()),
            Number(match period.unit() {
                PeriodUnit::Day => 0,
                PeriodUnit::Week => 1,
                PeriodUnit::Month => 2,
            }),
            Number(period.offset_s().into()),
        ],
        Rule::Concurrency(concurrency) => [
            Number(3),
            Number(concurrency.limit().into()),
            Number(lease.lease_us().into()),
            ScriptArg::SlotId(slot_id),
        ],
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use gcra_core::{Concurrency, Period, PeriodUnit, Quota, Window};

    use super::*;

    #[test]
    fn every_kind_reads_as_a_person_says_it() {
        let cases: [(Rule, &str); 7] = [
            (Quota::per_minute(10).into(), "10 per minute"),
            (
                Quota::per_second(100).allow_burst(20).into(),
                "100 per second, burst 20",
            ),
            (
                Quota::new(3, Duration::from_secs(90)).unwrap().into(),
                "3 per 90 s",
            ),
            (
                Quota::new(3, Duration::from_millis(1500)).unwrap().into(),
                "3 per 1.5s",
            ),
            (
                Window::new(5, Duration::from_secs(7200)).unwrap().into(),
                "5 in any 2 h",
            ),
            (
                Period::new(1000, PeriodUnit::Month, 19_800).unwrap().into(),
                "1000 per month (UTC+05:30)",
            ),
            (Concurrency::new(4).unwrap().into(), "4 at once"),
        ];
        for (rule, text) in cases {
            assert_eq!(rule.to_string(), text);
        }
    }
}
