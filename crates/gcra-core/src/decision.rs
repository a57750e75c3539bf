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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
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
    /// missing one. If `now` went backwards, the TAT is capped at the
    /// [ceiling](Quota::ceiling_us), `now + tau + max_debt` (`tau` plus an
    /// hour by default), and that capped value is returned for storing,
    /// even on a refusal:
    ///
    /// ```
    /// use gcra_core::{CheckError, Quota};
    /// let quota = Quota::per_second(1); // T = tau = 1 s
    ///
    /// // The stored TAT is two hours ahead: the clock jumped back.
    /// let d = quota.check(Some(7_201_000_000), 1_000_000, 1)?;
    /// assert!(!d.allowed);
    /// assert_eq!(d.retry_after_us, 3_601_000_000); // an hour and a second, not two hours
    /// assert_eq!(d.store.map(|s| s.tat_us), Some(3_602_000_000));
    ///
    /// assert_eq!(quota.check(None, 0, 0), Err(CheckError::ZeroCost));
    /// assert_eq!(
    ///     quota.check(None, 0, 2),
    ///     Err(CheckError::CostExceedsBurst { cost: 2, burst: 1 })
    /// );
    /// # Ok::<(), CheckError>(())
    /// ```
    #[inline]
    pub const fn check(
        &self,
        stored_tat_us: Option<u64>,
        now_us: u64,
        cost: u32,
    ) -> Result<Decision, CheckError> {
        let (tat, capped, new_tat) =
            match self.charged(stored_tat_us, now_us, cost) {
                Ok(charged) => charged,
                Err(error) => return Err(error),
            };
        // new_tat >= tat + increment and tat >= now: no underflow below.
        let allow_at = new_tat.saturating_sub(self.burst_offset_us());

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
        Ok(Decision {
            allowed: true,
            remaining: self.remaining_at(reset_after_us),
            retry_after_us: 0,
            reset_after_us,
            store: Some(store_for(new_tat, reset_after_us)),
        })
    }

    /// Reads a bucket without charging it: what a request of cost 0 sees.
    ///
    /// Never a write (not even the cap of a TAT from a clock that went
    /// back: it is applied to the answer only). `remaining` and
    /// `reset_after_us` are the bucket's now. Allowed unless the bucket is
    /// in debt (its TAT more than `tau` ahead: a settled cost, a reserved
    /// slot, a ban's end): then not even a request of cost 0 passes, and
    /// `retry_after_us` is the time until the debt is paid. So a peek is
    /// how a decision reads a state it must not charge: a customer's ban
    /// refuses the decision it is read in.
    ///
    /// ```
    /// use gcra_core::Quota;
    /// let quota = Quota::per_minute(10);
    /// let fresh = quota.peek(None, 0)?;
    /// assert_eq!((fresh.remaining, fresh.reset_after_us), (10, 0));
    ///
    /// // Four requests spent 24 s ago... minus the 24 s that came back.
    /// let d = quota.peek(Some(24_000_000), 0)?;
    /// assert_eq!((d.remaining, d.reset_after_us, d.store), (6, 24_000_000, None));
    ///
    /// // Spent to the last request: still allowed, nothing left.
    /// assert!(quota.peek(Some(60_000_000), 0)?.allowed);
    /// // 6 s in debt: refused for 6 s.
    /// let d = quota.peek(Some(66_000_000), 0)?;
    /// assert_eq!((d.allowed, d.retry_after_us, d.reset_after_us), (false, 6_000_000, 66_000_000));
    /// # Ok::<(), gcra_core::CheckError>(())
    /// ```
    #[inline]
    pub const fn peek(
        &self,
        stored_tat_us: Option<u64>,
        now_us: u64,
    ) -> Result<Decision, CheckError> {
        let (tat, _capped) = match self.stand(stored_tat_us, now_us) {
            Ok(stand) => stand,
            Err(error) => return Err(error),
        };
        let ahead = tat.saturating_sub(now_us);
        let debt = ahead.saturating_sub(self.burst_offset_us());
        Ok(Decision {
            allowed: debt == 0,
            remaining: self.remaining_at(ahead),
            retry_after_us: debt,
            reset_after_us: ahead,
            store: None,
        })
    }

    /// Adjusts a bucket after the fact, when a request's real cost is known
    /// only once it is served (the tokens of a generated answer): it was
    /// charged an estimate, and now the difference is charged or refunded.
    ///
    /// - [`Adjust::Charge`] moves the TAT `T * n` further, **without** a
    ///   refusal: the request already ran. The TAT may go beyond `now + tau`:
    ///   a debt that the next requests wait for. It stops at the
    ///   [ceiling](Quota::ceiling_us), `now + tau + max_debt`: by default a
    ///   settlement leaves at most an hour of debt
    ///   ([`DEFAULT_MAX_DEBT`](crate::DEFAULT_MAX_DEBT)); a quota that
    ///   settles large actual costs carries them whole with
    ///   [`Quota::unbounded_debt`] (or a bound of its own,
    ///   [`Quota::allow_debt`]).
    /// - [`Adjust::Refund`] moves it back by `T * n`, never below `now` (a
    ///   refund cannot create quota that time has not given back). A bucket
    ///   that becomes full is [`Write::Clear`]ed.
    ///
    /// 1000 per minute (T = 60 ms), charged 1 up front, settled to 1200:
    /// the next request waits about 12 s.
    ///
    /// ```
    /// use gcra_core::{Adjust, Quota, Write};
    /// let quota = Quota::per_minute(1000);
    /// let estimate = quota.check(None, 0, 1)?;
    /// let tat = estimate.store.map(|s| s.tat_us);
    /// let settled = quota.settle(tat, 0, Adjust::Charge(1199))?;
    /// let Write::Set(debt) = settled.write else { unreachable!() };
    /// assert_eq!(debt.tat_us, 72_000_000);
    ///
    /// let next = quota.check(Some(debt.tat_us), 0, 1)?;
    /// assert!(!next.allowed);
    /// assert_eq!(next.retry_after_us, 12_060_000);
    ///
    /// // A refund of everything: the bucket is full again.
    /// let refunded = quota.settle(tat, 0, Adjust::Refund(1))?;
    /// assert_eq!(refunded.write, Write::Clear);
    ///
    /// // Settled to 1 000 000 tokens: with the default bound the debt stops
    /// // at an hour; a quota that carries debts whole waits 1000 minutes.
    /// let capped = quota.settle(tat, 0, Adjust::Charge(999_999))?;
    /// assert_eq!(capped.reset_after_us, 60_000_000 + 3_600_000_000);
    /// let whole = quota.unbounded_debt().settle(tat, 0, Adjust::Charge(999_999))?;
    /// assert_eq!(whole.reset_after_us, 60_000_000_000);
    /// let next = quota.unbounded_debt().check(Some(whole.reset_after_us), 0, 1)?;
    /// assert_eq!(next.retry_after_us, 60_000_000_000 - 60_000_000 + 60_000);
    /// # Ok::<(), gcra_core::CheckError>(())
    /// ```
    pub const fn settle(
        &self,
        stored_tat_us: Option<u64>,
        now_us: u64,
        adjust: Adjust,
    ) -> Result<Settled, CheckError> {
        let (tat, capped) = match self.stand(stored_tat_us, now_us) {
            Ok(stand) => stand,
            Err(error) => return Err(error),
        };
        let t = self.emission_interval_us();
        let new_tat = match adjust {
            Adjust::Charge(units) => {
                // The ceiling is <= now + 2^51: no overflow, whatever units.
                let ceiling = now_us.saturating_add(self.ceiling_us());
                match t.checked_mul(units as u64) {
                    Some(debt) if debt <= ceiling.saturating_sub(tat) => {
                        tat.saturating_add(debt)
                    }
                    _ => ceiling,
                }
            }
            Adjust::Refund(units) => {
                let back = t.saturating_mul(units as u64);
                let floor = tat.saturating_sub(back);
                if floor > now_us { floor } else { now_us }
            }
        };
        if new_tat > MAX_TIME_US {
            return Err(CheckError::TimeOutOfRange);
        }
        let ahead = new_tat.saturating_sub(now_us);
        let write = if new_tat == tat && !capped {
            Write::Keep
        } else if ahead == 0 {
            Write::Clear
        } else {
            Write::Set(store_for(new_tat, ahead))
        };
        Ok(Settled {
            write,
            remaining: self.remaining_at(ahead),
            reset_after_us: ahead,
        })
    }

    /// A bucket that would have passed, left uncharged because another limit
    /// of a joint decision refused: the bucket as it stands (like a peek),
    /// with only a capped TAT to write.
    pub(crate) const fn uncharged(
        &self,
        stored_tat_us: Option<u64>,
        now_us: u64,
    ) -> Result<Decision, CheckError> {
        let (tat, capped) = match self.stand(stored_tat_us, now_us) {
            Ok(stand) => stand,
            Err(error) => return Err(error),
        };
        let ahead = tat.saturating_sub(now_us);
        Ok(Decision {
            allowed: true,
            remaining: self.remaining_at(ahead),
            retry_after_us: 0,
            reset_after_us: ahead,
            store: if capped {
                Some(store_for(tat, ahead))
            } else {
                None
            },
        })
    }

    /// Rules 1 and 2 for a request of `cost`: where the bucket stands, whether
    /// its TAT was capped, and the TAT the request would move it to. The
    /// errors of a cost of 0, of a cost above the burst and of a time out
    /// of range.
    #[inline]
    pub(crate) const fn charged(
        &self,
        stored_tat_us: Option<u64>,
        now_us: u64,
        cost: u32,
    ) -> Result<(u64, bool, u64), CheckError> {
        if cost == 0 {
            return Err(CheckError::ZeroCost);
        }
        if !self.can_ever_pass(cost) {
            return Err(CheckError::CostExceedsBurst {
                cost,
                burst: self.burst(),
            });
        }
        let (tat, capped) = match self.stand(stored_tat_us, now_us) {
            Ok(stand) => stand,
            Err(error) => return Err(error),
        };
        // cost <= burst, so T * cost <= tau <= 2^50: no overflow.
        let increment = self.emission_interval_us().saturating_mul(cost as u64);
        let new_tat = tat.saturating_add(increment);
        if new_tat > MAX_TIME_US {
            return Err(CheckError::TimeOutOfRange);
        }
        Ok((tat, capped, new_tat))
    }

    /// Rule 1: where the bucket stands at `now`, and whether the stored TAT
    /// had to be capped (the clock went back).
    #[inline]
    pub(crate) const fn stand(
        &self,
        stored_tat_us: Option<u64>,
        now_us: u64,
    ) -> Result<(u64, bool), CheckError> {
        if now_us > MAX_TIME_US {
            return Err(CheckError::TimeOutOfRange);
        }
        // now <= 2^53, ceiling <= 2^51: the sum stays far below u64::MAX.
        let ceiling = now_us.saturating_add(self.ceiling_us());
        Ok(match stored_tat_us {
            Some(stored) if stored <= MAX_TIME_US && stored >= now_us => {
                if stored > ceiling {
                    (ceiling, true)
                } else {
                    (stored, false)
                }
            }
            _ => (now_us, false),
        })
    }

    /// Requests of cost 1 that fit when the TAT is `ahead` µs past now.
    #[inline]
    const fn remaining_at(&self, ahead: u64) -> u64 {
        let free = self.burst_offset_us().saturating_sub(ahead);
        match free.checked_div(self.emission_interval_us()) {
            Some(remaining) => remaining,
            None => 0, // unreachable: a Quota's T is at least 1 µs
        }
    }
}

/// A change to a bucket after the request was served: see [`Quota::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Adjust {
    /// Charge this many more units (a debt if the bucket is already spent).
    Charge(u32),
    /// Give back this many units (never below a full bucket).
    Refund(u32),
}

impl Adjust {
    /// The adjustment that takes a request charged `estimate` to `actual`.
    ///
    /// ```
    /// use gcra_core::Adjust;
    /// assert_eq!(Adjust::between(1, 1200), Adjust::Charge(1199));
    /// assert_eq!(Adjust::between(5, 0), Adjust::Refund(5));
    /// assert_eq!(Adjust::between(3, 3), Adjust::Charge(0));
    /// ```
    pub const fn between(estimate: u32, actual: u32) -> Adjust {
        if actual >= estimate {
            Adjust::Charge(actual.saturating_sub(estimate))
        } else {
            Adjust::Refund(estimate.saturating_sub(actual))
        }
    }
}

/// What a store must do to a bucket after a [`Quota::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Write {
    /// Nothing: the bucket is as it was.
    Keep,
    /// Store this TAT.
    Set(StoreTat),
    /// Forget the bucket: it is full.
    Clear,
}

/// The outcome of [`Quota::settle`]: the write, and the bucket after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Settled {
    /// What the store must write.
    pub write: Write,
    /// Requests of cost 1 that fit now; 0 while in debt.
    pub remaining: u64,
    /// How long until the bucket is full again.
    pub reset_after_us: u64,
}

#[inline]
pub(crate) const fn store_for(tat_us: u64, ahead_us: u64) -> StoreTat {
    StoreTat {
        tat_us,
        ttl_ms: ahead_us.div_ceil(1000),
    }
}
