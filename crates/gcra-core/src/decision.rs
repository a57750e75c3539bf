use core::fmt;

use crate::{MAX_TIME_US, Quota};

/// The outcome of [`Quota::check`]: the answer for the request and the one
/// write, if any, the store must make.
///
/// ```
/// let d = gcra_core::Quota::per_minute(10).check(None, 0, 1)?;
/// assert!(d.allowed);
/// assert_eq!(d.remaining, 9);
/// assert_eq!(d.retry_after_us, 0);
/// assert_eq!(d.reset_after_us, 6_000_000);
/// let store = d.store.expect("an allowed request moves the TAT");
/// assert_eq!((store.tat_us, store.ttl_ms), (6_000_000, 6_000));
/// # Ok::<(), gcra_core::CheckError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Whether the request passes.
    pub allowed: bool,
    /// Requests of cost 1 that would still pass right now; 0 when refused.
    pub remaining: u64,
    /// When refused, how long until the same request would pass; 0 when allowed.
    pub retry_after_us: u64,
    /// How long until the bucket is full again (the TAT minus now).
    pub reset_after_us: u64,
    /// The TAT the store must now hold, or `None` to leave it as it is.
    pub store: Option<StoreTat>,
}

/// A TAT to store, with the time after which it may be forgotten.
///
/// The expiry is rounded up: a key that disappeared a millisecond early would
/// hand out requests that the quota does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StoreTat {
    /// The new theoretical arrival time, µs on the store's clock.
    pub tat_us: u64,
    /// `ceil((tat - now) / 1000)`: when the bucket is full again, in ms. At
    /// least 1.
    pub ttl_ms: u64,
}

/// Why [`Quota::check`] gave no decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckError {
    /// A cost of 0 is not a request.
    ZeroCost,
    /// `T * cost > tau`: the request can never pass, whatever the wait. Its
    /// answer is a refusal without a retry time (HTTP 403, not 429).
    CostExceedsBurst {
        /// The cost that was asked for.
        cost: u32,
        /// The most a request may cost under this quota.
        burst: u32,
    },
    /// `now`, or the TAT it would lead to, is beyond [`MAX_TIME_US`].
    TimeOutOfRange,
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::ZeroCost => {
                f.write_str("request cost must be at least 1")
            }
            CheckError::CostExceedsBurst { cost, burst } => {
                write!(
                    f,
                    "cost {cost} exceeds the burst of {burst}: it can never pass"
                )
            }
            CheckError::TimeOutOfRange => {
                f.write_str("time value exceeds 2^53 microseconds")
            }
        }
    }
}

impl core::error::Error for CheckError {}

impl Quota {
    /// Decides a request of `cost` at `now_us`, given the bucket's stored TAT.
    ///
    /// Pure: the caller (a store) reads the TAT, calls this, and writes
    /// [`Decision::store`] back, all atomically for the bucket. The rules are
    /// in the [crate docs](crate#the-rules-exactly).
    ///
    /// A stored TAT beyond [`MAX_TIME_US`] is treated as corrupted, like a
    /// missing one. If `now` went backwards, the TAT is capped at
    /// `now + tau` and that capped value is returned for storing, even on a
    /// refusal:
    ///
    /// ```
    /// use gcra_core::{CheckError, Quota};
    /// let quota = Quota::per_second(1); // T = tau = 1 s
    ///
    /// // The stored TAT is 100 s ahead: the clock jumped back.
    /// let d = quota.check(Some(101_000_000), 1_000_000, 1)?;
    /// assert!(!d.allowed);
    /// assert_eq!(d.retry_after_us, 1_000_000); // one interval, not 100 s
    /// assert_eq!(d.store.map(|s| s.tat_us), Some(2_000_000));
    ///
    /// assert_eq!(quota.check(None, 0, 0), Err(CheckError::ZeroCost));
    /// assert_eq!(
    ///     quota.check(None, 0, 2),
    ///     Err(CheckError::CostExceedsBurst { cost: 2, burst: 1 })
    /// );
    /// # Ok::<(), CheckError>(())
    /// ```
    pub const fn check(
        &self,
        stored_tat_us: Option<u64>,
        now_us: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        if cost == 0 {
            return Err(CheckError::ZeroCost);
        }
        if !self.can_ever_pass(cost) {
            return Err(CheckError::CostExceedsBurst {
                cost,
                burst: self.burst(),
            });
        }
        if now_us > MAX_TIME_US {
            return Err(CheckError::TimeOutOfRange);
        }
        let t = self.emission_interval_us();
        let tau = self.burst_offset_us();
        // cost <= burst, so T * cost <= tau <= 2^53: no overflow.
        let increment = t.saturating_mul(cost as u64);
        // now, tau <= 2^53: the sum stays far below u64::MAX.
        let horizon = now_us.saturating_add(tau);

        // Rule 1: where the bucket stands now.
        let (tat, capped) = match stored_tat_us {
            Some(stored) if stored <= MAX_TIME_US && stored >= now_us => {
                if stored > horizon {
                    (horizon, true)
                } else {
                    (stored, false)
                }
            }
            _ => (now_us, false),
        };

        // Rule 2.
        let new_tat = tat.saturating_add(increment);
        if new_tat > MAX_TIME_US {
            return Err(CheckError::TimeOutOfRange);
        }
        // new_tat >= tat + increment and tat >= now: no underflow below.
        let allow_at = new_tat.saturating_sub(tau);

        if allow_at > now_us {
            // Rule 3: refused. Only a capped TAT is written back.
            let reset_after_us = tat.saturating_sub(now_us);
            return Ok(Decision {
                allowed: false,
                remaining: 0,
                retry_after_us: allow_at.saturating_sub(now_us),
                reset_after_us,
                store: if capped {
                    Some(store_for(tat, reset_after_us))
                } else {
                    None
                },
            });
        }

        // Rule 4: allowed. new_tat - now <= tau here.
        let reset_after_us = new_tat.saturating_sub(now_us);
        let remaining = match tau.saturating_sub(reset_after_us).checked_div(t)
        {
            Some(remaining) => remaining,
            None => 0, // unreachable: a Quota's T is at least 1 µs
        };
        Ok(Decision {
            allowed: true,
            remaining,
            retry_after_us: 0,
            reset_after_us,
            store: Some(store_for(new_tat, reset_after_us)),
        })
    }
}

const fn store_for(tat_us: u64, ahead_us: u64) -> StoreTat {
    StoreTat {
        tat_us,
        ttl_ms: ahead_us.div_ceil(1000),
    }
}
