//! [`Decided`]: a store's answer to a decision, beside each bucket's
//! [`Decision`](gcra_core::Decision).

use gcra_core::{JointReservation, Quota, Verdict};

use crate::bucket::Charged;
use crate::rule::Rule;

/// A store's answer to [`StorageExt::check`](crate::StorageExt::check), beside each bucket's
/// [`Decision`](crate::Decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decided {
    /// Allowed or not, the longest wait, and which limit refused.
    pub verdict: Verdict,
    /// The store's clock, in µs, when it decided; `None` when the time was
    /// another machine's (Redis's `TIME`).
    pub now_us: Option<u64>,
    /// Which store decided: its [`Capabilities::label`](crate::Capabilities::label), or `"fallback"` when a
    /// [`FallbackStorage`](crate::FallbackStorage) decided some of the
    /// buckets locally.
    pub by: &'static str,
    /// The quotas of the buckets decided locally were divided by this many
    /// instances (a fallback's
    /// [`local_share`](crate::fallback::FallbackStorageBuilder::local_share)
    /// during an outage, [`Quota::divided`]); 1: the quotas as given. See
    /// [`Decided::applied`].
    pub share: u32,
    /// Which buckets were decided by a fallback's local store, one bit per
    /// position (bit `i` for `checks[i]`; every bit when the whole decision
    /// was local, whatever its length): see [`Decided::charged`].
    pub local: u64,
    /// Whether the store's backend answered. `false` for an answer from
    /// what the store remembers in process (a
    /// `REMEMBERED` refusal of a Redis store): it says nothing of the
    /// backend's health, so a breaker neither closes nor counts it.
    pub reached_backend: bool,
    /// For a reservation ([`StorageExt::reserve`](crate::StorageExt::reserve)): how long the caller waits
    /// before it goes, or, not reserved, the wait it would have needed. 0
    /// for a check.
    pub wait_us: u64,
    /// For a reservation: the store's own clock when it decided (µs), for
    /// a caller that compares it with its own to see how late the answer
    /// came (a shaper leaves at the slot, not at the slot plus the
    /// answer's delay). `None` when the store does not say.
    pub store_clock_us: Option<u64>,
}

impl Decided {
    /// A decision made with the quotas as given, by the store's backend.
    pub fn new(
        verdict: Verdict,
        now_us: Option<u64>,
        by: &'static str,
    ) -> Self {
        Decided {
            verdict,
            now_us,
            by,
            share: 1,
            local: 0,
            reached_backend: true,
            wait_us: 0,
            store_clock_us: None,
        }
    }

    /// The same decision, made at `us` on the store's own clock (see
    /// [`Decided::store_clock_us`]).
    #[must_use]
    pub fn with_store_clock(mut self, us: u64) -> Self {
        self.store_clock_us = Some(us);
        self
    }

    /// A reservation's answer ([`StorageExt::reserve`](crate::StorageExt::reserve))
    /// from [`gcra_core::reserve_all`]'s summary: its verdict and wait.
    ///
    /// ```
    /// use gcra_core::JointReservation;
    /// use rate_tier_storage::Decided;
    /// let joint = JointReservation { reserved: true, wait_us: 250, by: Some(0), most_us: 1_000 };
    /// let decided = Decided::of_reservation(&joint, Some(7), "custom");
    /// assert!(decided.verdict.allowed);
    /// assert_eq!(decided.wait_us, 250);
    /// ```
    pub fn of_reservation(
        joint: &JointReservation,
        now_us: Option<u64>,
        by: &'static str,
    ) -> Decided {
        Decided::new(joint.verdict(), now_us, by).with_wait(joint.wait_us)
    }

    /// A reservation of no bucket (`reserve_all` of no charge): reserved,
    /// nothing to wait for, answered by `by` without a call.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn reserved_at_once(
        max_wait_us: u64,
        by: &'static str,
    ) -> Decided {
        let joint = JointReservation {
            reserved: true,
            wait_us: 0,
            by: None,
            most_us: max_wait_us,
        };
        Decided::of_reservation(&joint, None, by)
    }

    /// The same decision, with the wait of a reservation
    /// ([`StorageExt::reserve`](crate::StorageExt::reserve)).
    #[must_use]
    pub fn with_wait(mut self, wait_us: u64) -> Self {
        self.wait_us = wait_us;
        self
    }

    /// The same decision, answered without the backend.
    ///
    /// ```
    /// use rate_tier_storage::Decided;
    /// use gcra_core::Verdict;
    /// let verdict = Verdict { allowed: false, retry_after_us: 5, refused_by: Some(0) };
    /// let decided = Decided::new(verdict, None, "remembered").without_backend();
    /// assert!(!decided.reached_backend);
    /// ```
    #[must_use]
    pub fn without_backend(mut self) -> Self {
        self.reached_backend = false;
        self
    }

    /// Where `checks[index]` was charged: what a settlement of it must be
    /// sent to ([`BucketSettle::charged`](crate::BucketSettle::charged)).
    ///
    /// ```
    /// use rate_tier_storage::{Charged, Decided};
    /// use gcra_core::Verdict;
    /// let verdict = Verdict { allowed: true, retry_after_us: 0, refused_by: None };
    /// assert_eq!(Decided::new(verdict, None, "redis").charged(0), Charged::Primary);
    /// ```
    #[inline]
    pub fn charged(&self, index: usize) -> Charged {
        if self.local == 0 {
            return Charged::Primary;
        }
        let bit = u32::try_from(index)
            .map_or(0, |i| 1u64.checked_shl(i).unwrap_or(0));
        if self.local == u64::MAX || self.local & bit != 0 {
            Charged::Local { share: self.share }
        } else {
            Charged::Primary
        }
    }

    /// The quota applied to `checks[index]`, checked under `quota`: divided
    /// by [`Decided::share`] if it was decided locally.
    ///
    /// ```
    /// use rate_tier_storage::Decided;
    /// use gcra_core::{Quota, Verdict};
    /// let decided = Decided::new(
    ///     Verdict { allowed: true, retry_after_us: 0, refused_by: None },
    ///     None,
    ///     "redis",
    /// );
    /// assert_eq!(decided.applied(0, Quota::per_minute(10)), Quota::per_minute(10));
    /// ```
    #[inline]
    pub fn applied(&self, index: usize, quota: Quota) -> Quota {
        match self.charged(index) {
            Charged::Local { share } => quota.divided(share),
            Charged::Primary => quota,
        }
    }

    /// [`Decided::applied`] for a rule of any kind: the rule the store
    /// applied to the bucket at `index` ([`Rule::divided`] by a fallback's
    /// local share).
    ///
    /// ```
    /// use rate_tier_storage::{Decided, Rule};
    /// use gcra_core::{Quota, Verdict};
    /// let decided = Decided::new(Verdict::of([], &[]), None, "memory");
    /// let rule = Rule::from(Quota::per_minute(10));
    /// assert_eq!(decided.applied_rule(0, rule), rule);
    /// ```
    #[inline]
    pub fn applied_rule(&self, index: usize, rule: Rule) -> Rule {
        match self.charged(index) {
            Charged::Local { share } => rule.divided(share),
            Charged::Primary => rule,
        }
    }
}
