//! Several limits, one decision: every bucket is charged, or none is.

use core::fmt;

use crate::{CheckError, Decision, Quota};

/// One limit of a joint decision: its quota, the cost charged to it, and
/// whether it only watches ([`Charge::shadow`]).
///
/// A cost of 0 is a peek: the bucket is read, never written, and refuses
/// only while the bucket is in debt ([`Quota::peek`]): a state the
/// decision reads.
///
/// ```
/// use gcra_core::{Charge, Quota};
/// let tier = Charge::new(Quota::per_minute(100), 1);
/// let search = Charge::new(Quota::per_minute(3), 1).shadow();
/// assert!(!tier.shadow && search.shadow);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Charge {
    /// The bucket's quota.
    pub quota: Quota,
    /// The cost charged to it; 0 reads it only.
    pub cost: u32,
    /// A shadow limit is decided and reported but never refuses: the
    /// decision passes whatever it says. It is charged only when it would
    /// have passed on its own, as it would be if it were enforced.
    pub shadow: bool,
}

impl Charge {
    /// `cost` against `quota`, enforced.
    pub const fn new(quota: Quota, cost: u32) -> Charge {
        Charge {
            quota,
            cost,
            shadow: false,
        }
    }

    /// The same charge in shadow mode.
    pub const fn shadow(self) -> Charge {
        Charge {
            shadow: true,
            ..self
        }
    }

    /// What this charge would have met, from a read of its bucket (`peek`,
    /// what [`Quota::peek`] answered): for a store that read a bucket
    /// instead of charging it (another bucket of the decision had refused)
    /// and must say whether it would have refused too, and after what wait.
    /// GCRA is the same at any origin of time, so the bucket read
    /// `reset_after` ahead is checked at 0. A peek (cost 0) is itself.
    ///
    /// ```
    /// use gcra_core::{Charge, Quota};
    /// let quota = Quota::per_minute(10);
    /// // Read with 54 s to full: one left, and a charge of 2 waits 6 s.
    /// let peek = quota.peek(Some(54_000_000), 0)?;
    /// let would = Charge::new(quota, 2).would_meet(&peek);
    /// assert!(!would.allowed);
    /// assert_eq!(would.retry_after_us, 6_000_000);
    /// assert_eq!(Charge::new(quota, 1).would_meet(&peek), peek);
    /// # Ok::<(), gcra_core::CheckError>(())
    /// ```
    pub fn would_meet(&self, peek: &Decision) -> Decision {
        if self.cost == 0 {
            return *peek;
        }
        // A bucket read ahead of 0 by its reset is never beyond the
        // ceiling: a refusal there writes nothing.
        match self.quota.check(Some(peek.reset_after_us), 0, self.cost) {
            Ok(would) if !would.allowed => would,
            _ => *peek,
        }
    }
}

/// The summary of [`check_all`]; each bucket's part is in its [`Decision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Verdict {
    /// Every enforced limit passed, so every bucket that passes on its own
    /// was charged.
    pub allowed: bool,
    /// When refused: the longest wait among the refusing enforced limits,
    /// after which the same request may pass. 0 when allowed.
    pub retry_after_us: u64,
    /// When refused: the refusing enforced limit with that longest wait (the
    /// first one, on a tie).
    pub refused_by: Option<usize>,
}

impl Verdict {
    /// The verdict of buckets each decided on its own: refused if an
    /// enforced one (not shadow) refused, with the longest wait among them
    /// and the first bucket that waits that long. For a store that decides
    /// the buckets elsewhere (a script) and reads their decisions back.
    ///
    /// ```
    /// use gcra_core::{Decision, Verdict};
    /// let refused = Decision { retry_after_us: 6, ..Decision::default() };
    /// let allowed = Decision { allowed: true, ..Decision::default() };
    /// let v = Verdict::of([false, true], &[allowed, refused]);
    /// assert!(v.allowed, "a shadow refusal refuses nothing");
    /// let v = Verdict::of([false, false], &[allowed, refused]);
    /// assert_eq!((v.allowed, v.retry_after_us, v.refused_by), (false, 6, Some(1)));
    /// ```
    pub fn of(
        shadow: impl IntoIterator<Item = bool>,
        decisions: &[Decision],
    ) -> Verdict {
        let mut refused_by: Option<usize> = None;
        let mut retry_after_us = 0;
        for (index, (shadow, decision)) in
            shadow.into_iter().zip(decisions).enumerate()
        {
            let longest = refused_by.is_none()
                || decision.retry_after_us > retry_after_us;
            if !decision.allowed && !shadow && longest {
                retry_after_us = decision.retry_after_us;
                refused_by = Some(index);
            }
        }
        Verdict {
            allowed: refused_by.is_none(),
            retry_after_us,
            refused_by,
        }
    }
}

/// Why [`check_all`] gave no decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum JointError {
    /// The limit at `index` cannot be decided (a cost above its burst, or a
    /// time out of range): nothing was decided.
    Charge {
        /// Its position in the slices.
        index: usize,
        /// Why.
        error: CheckError,
    },
    /// The slices are not all the same length.
    LengthMismatch,
}

impl fmt::Display for JointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JointError::Charge { index, error } => {
                write!(f, "limit {index}: {error}")
            }
            JointError::LengthMismatch => f.write_str(
                "charges, stored TATs and decisions differ in length",
            ),
        }
    }
}

impl core::error::Error for JointError {}

/// Decides several limits at once, all or nothing.
///
/// `charges[i]` applies to the bucket whose stored TAT is `stored[i]`; its
/// part of the answer goes to `out[i]`. No allocation: the caller owns
/// every slice, and they must have one length.
///
/// Each bucket is first decided on its own, by [`Quota::check`] (or
/// [`Quota::peek`] for a cost of 0). Then:
///
/// - **every enforced limit passes**: the decision is allowed, and each
///   `out[i]` is that bucket's own decision: its [`Decision::store`] is the
///   charge to write. A shadow limit that would refuse is not charged
///   (`out[i].allowed` is false: that is the would-be refusal to report).
/// - **an enforced limit refuses**: the decision is refused, and no bucket
///   is charged. `out[i]` of a refusing limit is its refusal; that of a
///   limit that would have passed says so (`allowed`) with the bucket as it
///   stands, uncharged. [`Verdict::retry_after_us`] is the longest wait
///   among the refusing enforced limits.
///
/// In both cases `out[i].store` is exactly the write the store must make:
/// only a TAT capped after the clock went back is written for a bucket that
/// is not charged, and a peek writes nothing.
///
/// A tier of 10 per minute and a `search` limit of 3 per minute, the fourth
/// search of the minute:
///
/// ```
/// use gcra_core::{Charge, Decision, Quota, check_all};
///
/// let charges = [
///     Charge::new(Quota::per_minute(10), 1),
///     Charge::new(Quota::per_minute(3), 1),
/// ];
/// // Three searches so far: the tier's TAT is 18 s ahead, the search's 60 s.
/// let stored = [Some(18_000_000), Some(60_000_000)];
/// let mut out = [Decision::default(); 2];
/// let verdict = check_all(&charges, &stored, 0, &mut out)?;
///
/// assert!(!verdict.allowed);
/// assert_eq!(verdict.refused_by, Some(1));
/// assert_eq!(verdict.retry_after_us, 20_000_000);
/// // The tier would have passed, but it is not charged: 7 left, as before.
/// assert!(out[0].allowed);
/// assert_eq!((out[0].remaining, out[0].store), (7, None));
/// # Ok::<(), gcra_core::JointError>(())
/// ```
pub fn check_all(
    charges: &[Charge],
    stored: &[Option<u64>],
    now_us: u64,
    out: &mut [Decision],
) -> Result<Verdict, JointError> {
    if charges.len() != stored.len() || charges.len() != out.len() {
        return Err(JointError::LengthMismatch);
    }
    for (index, ((charge, tat), slot)) in
        charges.iter().zip(stored).zip(out.iter_mut()).enumerate()
    {
        let decided = if charge.cost == 0 {
            charge.quota.peek(*tat, now_us)
        } else {
            charge.quota.check(*tat, now_us, charge.cost)
        };
        *slot = decided.map_err(|error| JointError::Charge { index, error })?;
    }
    let verdict = Verdict::of(charges.iter().map(|c| c.shadow), out);
    if verdict.allowed {
        return Ok(verdict);
    }
    // Refused: undo, in the answer, the charge of every bucket that would
    // have passed. Peeks already charge nothing.
    for (index, ((charge, tat), slot)) in
        charges.iter().zip(stored).zip(out.iter_mut()).enumerate()
    {
        if slot.allowed && charge.cost > 0 {
            *slot = charge
                .quota
                .uncharged(*tat, now_us)
                .map_err(|error| JointError::Charge { index, error })?;
        }
    }
    Ok(verdict)
}
