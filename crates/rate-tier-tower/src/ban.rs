//! Bans with backoff: a customer who keeps going after their limit is
//! refused everything for a while ([`RateTierBuilder::ban`](crate::RateTierBuilder::ban)).
//!
//! Three buckets per customer, on the limiter's store, so every instance
//! bans:
//!
//! - `ban/until`, the ban's end: a state of the customer that every
//!   decision of theirs reads (a peek, cost 0), never charges and never
//!   reserves, so a request waiting for its slot never makes another one
//!   wait or look banned. It holds a TAT one millisecond past the ban's end
//!   (a rate of one a millisecond, a burst of 1), so the read refuses the
//!   decision, all or nothing, until exactly the end, and its
//!   `retry-after` is the time left.
//! - `ban/refusals`, a window of the refusals: after the K-th within W the
//!   customer is banned, and the window starts again.
//! - `ban/level`, a rate of the bans themselves that leaks one ban per
//!   "recent" span (the longest ban plus W): a ban `n` deep in it lasts
//!   `first * 2^(n-1)`, at most `max`. A chain of bans, each soon after the
//!   last, climbs; a quiet span takes one step back.
//!
//! The first costs one more key read in a decision; the refusals and the
//! bans are counted only when a request is refused. Every instance learns a
//! ban from `ban/until` in its next decision of the customer, and a reset
//! lifts it for all at once (a Redis store that remembers refusals forgets
//! them on every instance: see `RedisStorage::remember_refusals`).

use std::sync::LazyLock;
use std::time::Duration;

use gcra_core::{Adjust, Decision, Quota, saturating_micros};
use rate_tier_storage::StorageExt;
use rate_tier_storage::key::KeySecret;
use rate_tier_storage::{BucketCheck, LimitName, Rule, Window};

use crate::error::ConfigError;

/// When and for how long a customer is banned: after `refusals` refusals
/// within `within`, every request is refused for `first`; each new ban
/// while the last one is recent (within the longest ban plus `within`)
/// doubles it, up to `max`.
///
/// ```
/// use std::time::Duration;
/// use tower_rate_tier::Ban;
/// // The example server's: 20 refusals in a minute, a minute's ban,
/// // doubling up to an hour.
/// let ban = Ban::after(20, Duration::from_secs(60))
///     .lasting(Duration::from_secs(60))
///     .up_to(Duration::from_secs(3600));
/// assert_eq!(ban.length(1), Duration::from_secs(60));
/// assert_eq!(ban.length(3), Duration::from_secs(240));
/// assert_eq!(ban.length(10), Duration::from_secs(3600));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ban {
    refusals: u32,
    within: Duration,
    first: Duration,
    max: Duration,
}

/// The longest ban: the ban bucket holds it as debt.
const MAX_BAN: Duration = Duration::from_secs(24 * 3600);

impl Ban {
    /// Banned after `refusals` refusals within `within`; for a minute, up
    /// to an hour, unless told otherwise.
    pub fn after(refusals: u32, within: Duration) -> Ban {
        Ban {
            refusals,
            within,
            first: Duration::from_secs(60),
            max: Duration::from_secs(3600),
        }
    }

    /// How long the first ban lasts.
    pub fn lasting(mut self, first: Duration) -> Ban {
        self.first = first;
        self
    }

    /// The longest a ban lasts, however often it doubled (at most a day).
    pub fn up_to(mut self, max: Duration) -> Ban {
        self.max = max;
        self
    }

    /// How long the `n`-th recent ban lasts (n from 1).
    pub fn length(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(32);
        self.first
            .checked_mul(1u32 << doublings.min(31))
            .map_or(self.max, |length| length.min(self.max))
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let fine = self.refusals >= 1
            && self.refusals <= gcra_core::MAX_WINDOW_LIMIT
            && !self.within.is_zero()
            && !self.first.is_zero()
            && self.first <= self.max
            && self.max <= MAX_BAN
            && Window::new(self.refusals, self.within).is_ok()
            && self.level_quota().is_some();
        if fine {
            Ok(())
        } else {
            Err(ConfigError::InvalidBan(format!("{self:?}")))
        }
    }

    /// How many bans count towards the next one's length: enough to reach
    /// `max` by doubling.
    fn levels(&self) -> u32 {
        let mut levels = 1;
        while self.length(levels) < self.max && levels < 32 {
            levels += 1;
        }
        levels
    }

    /// How long a ban stays recent: the longest ban, plus the time to earn
    /// the next one.
    fn recent(&self) -> Duration {
        self.max.saturating_add(self.within)
    }

    /// `ban/level`: one ban leaks away per recent span, `levels` at most.
    fn level_quota(&self) -> Option<Quota> {
        let span = self.recent().checked_mul(self.levels())?;
        Quota::new(self.levels(), span).ok()
    }
}

pub(crate) static UNTIL: LazyLock<LimitName> =
    LazyLock::new(|| ban_name("until"));
static REFUSALS: LazyLock<LimitName> = LazyLock::new(|| ban_name("refusals"));
static LEVEL: LazyLock<LimitName> = LazyLock::new(|| ban_name("level"));

fn ban_name(part: &'static str) -> LimitName {
    match LimitName::of_ban(part) {
        Ok(name) => name,
        Err(_) => unreachable!("a fixed, valid name"),
    }
}

/// The emission interval, and burst offset, of `ban/until`: 1 ms. The
/// longest ban plus one is 86,400,001 of them, well within a settlement's
/// `u32` units.
const UNTIL_T_US: u64 = 1_000;

/// Every bucket of `user`'s bans, for a reset: whether or not the limiter
/// that resets bans, a ban another instance gave is lifted (a bucket is
/// named by its limit, kind and partition; its quota does not matter to a
/// reset).
pub(crate) fn buckets<'a>(
    user: &'a str,
    secret: Option<&'a KeySecret>,
) -> Vec<BucketCheck<'a>> {
    let any_rate = Rule::Rate(Quota::per_second(1));
    [
        (&*UNTIL, any_rate),
        (&*REFUSALS, window(1, Duration::from_secs(1))),
        (&*LEVEL, any_rate),
    ]
    .into_iter()
    .filter_map(|(name, rule)| BucketCheck::of_rule(name, user, rule, 0).ok())
    .map(|check| check.key_secret(secret))
    .collect()
}

/// The bans of a limiter: the rule, and the quotas of its buckets.
#[derive(Debug)]
pub(crate) struct Bans {
    pub(crate) ban: Ban,
    until: Quota,
    level: Quota,
}

impl Bans {
    pub(crate) fn new(ban: Ban) -> Result<Bans, ConfigError> {
        ban.validate()?;
        let until = Quota::per_second(1_000)
            .try_allow_burst(1)
            .and_then(|q| q.try_allow_debt(MAX_BAN + Duration::from_secs(1)))
            .map_err(|_| ConfigError::InvalidBan(format!("{ban:?}")))?;
        let level = ban
            .level_quota()
            .ok_or_else(|| ConfigError::InvalidBan(format!("{ban:?}")))?;
        Ok(Bans { ban, until, level })
    }

    /// The read of `ban/until` every decision of `user` carries: a peek,
    /// which refuses while the ban lasts and never writes.
    pub(crate) fn until_check<'a>(
        &self,
        user: &'a str,
        secret: Option<&'a KeySecret>,
    ) -> BucketCheck<'a> {
        BucketCheck::peek(&UNTIL, user, self.until).key_secret(secret)
    }

    fn refusals_rule(&self) -> Rule {
        window(self.ban.refusals, self.ban.within)
    }

    /// A refusal of `user` (by a limit, not a ban): counted, and, the K-th
    /// within W, a ban. Returns how long the ban lasts, if one began.
    pub(crate) async fn refused(
        &self,
        store: &std::sync::Arc<dyn rate_tier_storage::Storage>,
        user: &str,
        secret: Option<&KeySecret>,
    ) -> Result<Option<Duration>, rate_tier_storage::StorageError> {
        let counted =
            BucketCheck::of_rule(&REFUSALS, user, self.refusals_rule(), 1)?
                .key_secret(secret);
        let mut out = [Decision::default()];
        let decided = store.check(&[counted], &mut out).await?;
        // The K-th: the window just filled. Later ones (a window already
        // full) were the ban's to stop; they ban no one again.
        if !decided.verdict.allowed || out[0].remaining > 0 {
            return Ok(None);
        }
        let level =
            BucketCheck::new(&LEVEL, user, self.level, 1)?.key_secret(secret);
        let decided = store.check(&[level], &mut out).await?;
        // How deep this ban is in the chain: what the bucket holds now.
        let n = if decided.verdict.allowed {
            let left = u32::try_from(out[0].remaining).unwrap_or(u32::MAX);
            self.ban.levels().saturating_sub(left)
        } else {
            self.ban.levels()
        };
        let length = self.ban.length(n.max(1));
        // From a fresh bucket, past its burst by the ban's length: a read
        // refuses until exactly then. Whole milliseconds, rounded up.
        let until = self.until_check(user, secret);
        store.reset(&[counted, until]).await?;
        let units = saturating_micros(length)
            .div_ceil(UNTIL_T_US)
            .saturating_add(self.until.burst_offset_us() / UNTIL_T_US);
        let units = u32::try_from(units).map_err(|_| {
            rate_tier_storage::StorageError::Check(
                gcra_core::CheckError::TimeOutOfRange,
            )
        })?;
        store.settle(&[until.settle(Adjust::Charge(units))]).await?;
        Ok(Some(length))
    }
}

fn window(limit: u32, length: Duration) -> Rule {
    match Window::new(limit, length) {
        Ok(window) => window.into(),
        Err(_) => unreachable!("checked by Ban::validate"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Ban;

    const MINUTE: Duration = Duration::from_secs(60);

    /// `ban.levels()`, failing rather than hanging if its count never ends.
    fn levels(ban: Ban) -> u32 {
        let (sent, got) = std::sync::mpsc::channel();
        std::thread::spawn(move || sent.send(ban.levels()));
        got.recv_timeout(Duration::from_secs(5))
            .expect("the count of levels ends")
    }

    #[test]
    fn the_bans_counted_are_as_many_as_doubling_takes_to_reach_the_longest() {
        // 1, 2, 4, 8, 16, 32, then 60 minutes: the 7th ban is the longest.
        let ban = Ban::after(20, MINUTE).lasting(MINUTE).up_to(60 * MINUTE);
        assert_eq!(levels(ban), 7);
        assert_eq!(ban.length(7), 60 * MINUTE);
        assert!(ban.length(6) < 60 * MINUTE);
        // A first ban as long as the longest: one.
        assert_eq!(levels(ban.lasting(60 * MINUTE)), 1);
        // A longest ban that 31 doublings do not reach: the 32nd ban, the
        // last to double, is as deep as the count goes.
        let tiny = ban
            .lasting(Duration::from_micros(1))
            .up_to(24 * 60 * MINUTE);
        assert!(tiny.length(32) < 24 * 60 * MINUTE);
        assert_eq!(tiny.length(33), tiny.length(32));
        assert_eq!(levels(tiny), 32);
    }
}
