//! Waiting instead of refusing: a reservation of the next slot a request
//! may go at, for a caller that prefers to wait (shaping, a leaky bucket:
//! requests leave at the quota's rate however they arrive).

use crate::decision::store_for;
use crate::{CheckError, Quota, StoreTat, Write};

/// A slot reserved by [`Quota::reserve`]: the caller waits `wait_us`, then
/// goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reservation {
    /// How long the caller waits before it goes (0: it may go now).
    pub wait_us: u64,
    /// The units of cost reserved.
    pub cost: u32,
    /// The TAT the store must now hold: what [`Quota::cancel`] compares
    /// with the stored one.
    pub store: StoreTat,
}

/// The outcome of [`Quota::reserve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reserve {
    /// A slot was reserved: write its TAT, wait, go.
    Reserved(Reservation),
    /// The wait would be longer than allowed: nothing reserved.
    TooLong {
        /// The wait the request would need, from now.
        wait_us: u64,
        /// The TAT to write back: only a stored one capped because the
        /// clock went back, as for a refusal by [`Quota::check`].
        store: Option<StoreTat>,
    },
}

impl Quota {
    /// The most a reservation may wait: the quota's [max
    /// debt](Quota::max_debt_us) (an hour, or tau if longer, by default).
    /// A reservation moves the TAT past `now + tau` by its wait, and a TAT
    /// further ahead than `tau + max_debt` reads as a clock that went back
    /// and is capped: a longer wait would be forgiven by the next decision.
    ///
    /// ```
    /// use std::time::Duration;
    /// let quota = gcra_core::Quota::per_second(10); // a burst of 10: tau = 1 s
    /// assert_eq!(quota.max_wait_us(), 3_600_000_000);
    /// assert_eq!(quota.allow_debt(Duration::from_secs(60)).max_wait_us(), 60_000_000);
    /// ```
    pub const fn max_wait_us(&self) -> u64 {
        self.max_debt_us()
    }

    /// Reserves the next slot for a request of `cost` at `now_us`, if the
    /// wait for it is at most `max_wait_us` (itself at most
    /// [`Quota::max_wait_us`]). The rules, with `tat = max(stored, now)`
    /// as [`Quota::check`] stands it (rule 1 of the crate docs):
    ///
    /// 1. A cost of 0 is [`CheckError::ZeroCost`]; a cost above the burst
    ///    can never pass: [`CheckError::CostExceedsBurst`], as for a check.
    /// 2. The request goes at `at = tat + T * cost - tau`, and waits
    ///    `wait = at - now` (0 if `at <= now`: the check would allow it).
    /// 3. If `wait <= min(max_wait, max_wait_us())`: reserved, and the
    ///    store writes `tat + T * cost`, as a check that passed at `at`
    ///    would have. A TAT beyond [`MAX_TIME_US`](crate::MAX_TIME_US) is
    ///    [`CheckError::TimeOutOfRange`].
    /// 4. Else [`Reserve::TooLong`] with the `wait`, and the stored TAT
    ///    unchanged (but for the cap of rule 1).
    ///
    /// So reservations are exactly the passes of the quota, each at its
    /// slot: however many callers reserve at once, they go no faster than
    /// the quota, and with a burst of 1 never two closer than `T * cost`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gcra_core::{Quota, Reserve};
    /// // T = tau = 100 ms; callers may wait up to a second.
    /// let quota = Quota::per_second(10).allow_burst(1).allow_debt(Duration::from_secs(1));
    /// let Reserve::Reserved(first) = quota.reserve(None, 0, 1, 500_000)? else { unreachable!() };
    /// assert_eq!(first.wait_us, 0);
    /// let tat = Some(first.store.tat_us);
    /// let Reserve::Reserved(second) = quota.reserve(tat, 0, 1, 500_000)? else { unreachable!() };
    /// assert_eq!(second.wait_us, 100_000); // one interval later
    ///
    /// // Six intervals ahead is more than the 500 ms this caller waits:
    /// // nothing kept.
    /// assert_eq!(
    ///     quota.reserve(Some(600_000), 0, 1, 500_000)?,
    ///     Reserve::TooLong { wait_us: 600_000, store: None },
    /// );
    /// // With a debt of 100 ms, a reservation waits at most that.
    /// let even = Quota::per_second(10).allow_burst(1).allow_debt(Duration::from_millis(100));
    /// assert!(matches!(even.reserve(Some(200_000), 0, 1, 500_000)?, Reserve::TooLong { .. }));
    /// # Ok::<(), gcra_core::CheckError>(())
    /// ```
    pub const fn reserve(
        &self,
        stored_tat_us: Option<u64>,
        now_us: u64,
        cost: u32,
        max_wait_us: u64,
    ) -> Result<Reserve, CheckError> {
        let (tat, capped, new_tat) =
            match self.charged(stored_tat_us, now_us, cost) {
                Ok(charged) => charged,
                Err(error) => return Err(error),
            };
        let at = new_tat.saturating_sub(self.burst_offset_us());
        let wait_us = at.saturating_sub(now_us);
        let most = if max_wait_us < self.max_wait_us() {
            max_wait_us
        } else {
            self.max_wait_us()
        };
        if wait_us > most {
            let store = if capped {
                Some(store_for(tat, tat.saturating_sub(now_us)))
            } else {
                None
            };
            return Ok(Reserve::TooLong { wait_us, store });
        }
        Ok(Reserve::Reserved(Reservation {
            wait_us,
            cost,
            store: store_for(new_tat, new_tat.saturating_sub(now_us)),
        }))
    }

    /// Gives back `reservation` (its caller went away before it went), at
    /// `now_us`, given the bucket's stored TAT: the write to make.
    ///
    /// Exact when no later reservation or pass was made after it (the
    /// stored TAT is still the one it wrote): the TAT goes back by its
    /// cost, as if it never was (never below `now`: [`Write::Clear`] when
    /// the bucket is full again). After a later one, [`Write::Keep`]:
    /// the later callers keep their slots, and moving the TAT back would
    /// give the next caller a slot among theirs, closer than the quota
    /// allows. The slot is lost, never handed out twice.
    ///
    /// ```
    /// use std::time::Duration;
    /// use gcra_core::{Quota, Reserve, Write};
    /// let quota = Quota::per_second(10).allow_burst(1).allow_debt(Duration::from_secs(1));
    /// let Reserve::Reserved(a) = quota.reserve(Some(100_000), 0, 1, 1_000_000)? else { unreachable!() };
    /// assert_eq!(a.store.tat_us, 200_000);
    /// // Given back while last: the TAT is as before it.
    /// let Write::Set(back) = quota.cancel(Some(200_000), 0, &a) else { unreachable!() };
    /// assert_eq!(back.tat_us, 100_000);
    /// // After a later reservation: kept.
    /// assert_eq!(quota.cancel(Some(300_000), 0, &a), Write::Keep);
    /// # Ok::<(), gcra_core::CheckError>(())
    /// ```
    pub const fn cancel(
        &self,
        stored_tat_us: Option<u64>,
        now_us: u64,
        reservation: &Reservation,
    ) -> Write {
        let tat = reservation.store.tat_us;
        match stored_tat_us {
            Some(stored) if stored == tat && tat > now_us => {
                let back = self
                    .emission_interval_us()
                    .saturating_mul(reservation.cost as u64);
                let floor = tat.saturating_sub(back);
                if floor > now_us {
                    Write::Set(store_for(floor, floor.saturating_sub(now_us)))
                } else {
                    Write::Clear
                }
            }
            _ => Write::Keep,
        }
    }
}

/// The outcome of [`reserve_all`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JointReservation {
    /// Whether every bucket reserved the common slot.
    pub reserved: bool,
    /// How long the request waits for the slot every enforced limit
    /// allows (when not reserved: the wait it would have needed).
    pub wait_us: u64,
    /// The limit that sets the wait: the first enforced one whose own wait
    /// is `wait_us` (`None` when no limit makes the request wait).
    pub by: Option<usize>,
    /// The longest wait allowed: the caller's, or less where a quota's
    /// [`Quota::max_wait_us`] is less.
    pub most_us: u64,
}

impl JointReservation {
    /// As a [`Verdict`](crate::Verdict): allowed when reserved; else
    /// refused by the limit that sets the wait, retrying after the wait's
    /// excess over the most allowed (when a reservation with the same
    /// maximum would be made).
    ///
    /// ```
    /// use gcra_core::JointReservation;
    /// let r = JointReservation { reserved: false, wait_us: 900, by: Some(1), most_us: 500 };
    /// let v = r.verdict();
    /// assert_eq!((v.allowed, v.retry_after_us, v.refused_by), (false, 400, Some(1)));
    /// ```
    pub const fn verdict(&self) -> crate::Verdict {
        if self.reserved {
            crate::Verdict {
                allowed: true,
                retry_after_us: 0,
                refused_by: None,
            }
        } else {
            crate::Verdict {
                allowed: false,
                retry_after_us: self.wait_us.saturating_sub(self.most_us),
                refused_by: self.by,
            }
        }
    }
}

/// Reserves one slot in several limits at once, all or nothing: the
/// earliest instant `go` at which every enforced limit would pass, if its
/// wait is at most `max_wait_us` (and at most every quota's
/// [`Quota::max_wait_us`]).
///
/// `go = now + max(wait_i)` over the enforced limits, `wait_i` as
/// [`Quota::reserve`] computes it for each alone (a shadow limit never
/// makes a request wait). Reserved, each bucket is charged as
/// [`check_all`](crate::check_all) would charge it at `go`: `out[i]` is
/// that check's decision (a shadow limit that would refuse at `go` is not
/// charged), its write's expiry counted from `now`. So a request that goes
/// at its slot is a pass of every limit at that instant, and no limit sees
/// requests faster than its quota, even those that did not make it wait.
/// Not reserved (the wait too long), nothing is charged: `out[i]` is the
/// bucket as it stands, with only a TAT capped after the clock went back
/// to write. A cost of 0 is a peek at `now`, as in `check_all`; an
/// enforced one in debt (a state that refuses, such as a ban's end) sets
/// the slot no earlier than the end of its debt.
///
/// ```
/// use std::time::Duration;
/// use gcra_core::{Charge, Decision, Quota, reserve_all};
/// let wait = Duration::from_secs(10);
/// // A provider's 2 per second (burst 1) and 100 per minute.
/// let charges = [
///     Charge::new(Quota::per_second(2).allow_burst(1).allow_debt(wait), 1),
///     Charge::new(Quota::per_minute(100).allow_debt(wait), 1),
/// ];
/// let mut out = [Decision::default(); 2];
/// // A call went out at 0: the next waits 500 ms for the first limit.
/// let stored = [Some(500_000), Some(600_000)];
/// let r = reserve_all(&charges, &stored, 0, 1_000_000, &mut out)?;
/// assert!(r.reserved);
/// assert_eq!(r.wait_us, 500_000);
/// assert_eq!(r.by, Some(0));
/// assert_eq!(out[0].store.map(|s| s.tat_us), Some(1_000_000));
/// assert_eq!(out[1].store.map(|s| s.tat_us), Some(1_200_000));
/// # Ok::<(), gcra_core::JointError>(())
/// ```
pub fn reserve_all(
    charges: &[crate::Charge],
    stored: &[Option<u64>],
    now_us: u64,
    max_wait_us: u64,
    out: &mut [crate::Decision],
) -> Result<JointReservation, crate::JointError> {
    use crate::JointError;
    if charges.len() != stored.len() || charges.len() != out.len() {
        return Err(JointError::LengthMismatch);
    }
    if let Some(at_once) =
        reserve_now(charges, stored, now_us, max_wait_us, out)
    {
        return Ok(at_once);
    }
    let mut wait_us = 0u64;
    let mut by = None;
    let mut most = max_wait_us;
    for (index, (charge, tat)) in charges.iter().zip(stored).enumerate() {
        if charge.shadow {
            continue;
        }
        let wait = if charge.cost == 0 {
            charge
                .quota
                .peek(*tat, now_us)
                .map(|peek| peek.retry_after_us)
        } else {
            charge
                .quota
                .reserve(*tat, now_us, charge.cost, u64::MAX)
                .map(|alone| match alone {
                    Reserve::Reserved(r) => r.wait_us,
                    Reserve::TooLong { wait_us, .. } => wait_us,
                })
        }
        .map_err(|error| JointError::Charge { index, error })?;
        if wait > wait_us {
            wait_us = wait;
            by = Some(index);
        }
        most = most.min(charge.quota.max_wait_us());
    }
    // now + wait <= MAX_TIME_US: each wait came from a TAT within it.
    let go_us = now_us.saturating_add(wait_us);
    let reserved = wait_us <= most;
    for (index, ((charge, tat), slot)) in
        charges.iter().zip(stored).zip(out.iter_mut()).enumerate()
    {
        let decided = if charge.cost == 0 {
            charge.quota.peek(*tat, now_us)
        } else if !reserved {
            charge.quota.uncharged(*tat, now_us)
        } else {
            charge.quota.check(*tat, go_us, charge.cost)
        };
        let mut decision =
            decided.map_err(|error| JointError::Charge { index, error })?;
        if reserved && charge.cost > 0 {
            // Seen from now: the wait is part of the bucket's time ahead.
            decision.reset_after_us =
                decision.reset_after_us.saturating_add(wait_us);
            decision.store = decision
                .store
                .map(|s| store_for(s.tat_us, s.tat_us.saturating_sub(now_us)));
        }
        *slot = decision;
    }
    Ok(JointReservation {
        reserved,
        wait_us,
        by,
        most_us: most,
    })
}

/// [`reserve_all`] when nothing waits, in one pass: every enforced charge
/// passes at `now` (a peek has no debt to wait for), so the slot is `now`
/// and each decision is its check (or peek) at `now`. `None` when one
/// would wait or fails: `reserve_all` then decides it in full and rewrites
/// every slot of `out`.
fn reserve_now(
    charges: &[crate::Charge],
    stored: &[Option<u64>],
    now_us: u64,
    max_wait_us: u64,
    out: &mut [crate::Decision],
) -> Option<JointReservation> {
    let mut most = max_wait_us;
    for ((charge, tat), slot) in charges.iter().zip(stored).zip(out.iter_mut())
    {
        let decision = if charge.cost == 0 {
            charge.quota.peek(*tat, now_us).ok()?
        } else {
            charge.quota.check(*tat, now_us, charge.cost).ok()?
        };
        if !charge.shadow {
            let waits = if charge.cost == 0 {
                decision.retry_after_us > 0
            } else {
                !decision.allowed
            };
            if waits {
                return None;
            }
            most = most.min(charge.quota.max_wait_us());
        }
        *slot = decision;
    }
    Some(JointReservation {
        reserved: true,
        wait_us: 0,
        by: None,
        most_us: most,
    })
}
