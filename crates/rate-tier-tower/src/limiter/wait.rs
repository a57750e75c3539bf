//! Waiting instead of refusing, for incoming requests
//! ([`RateTierBuilder::wait_up_to`](crate::RateTierBuilder::wait_up_to)):
//! a request of rate limits alone reserves its slot ([`StorageExt::reserve`]),
//! waits for it, and is served; one that would wait longer is checked, and
//! refused, as without waiting.
//!
//! The waiting room is bounded: a request that finds it full is checked
//! at once, so it is refused if it would have had to wait. Waiting never
//! queues more than the bound, however many slow clients come. A request
//! dropped while it waits (the client went away) gives its slot back.
//!
//! A read in the decision (a peek, such as a ban's end) is a state, not a
//! rate to wait for: a reservation never waits for it, so a decision with
//! one is checked first, and reserves only when a charged rate refused it.
//! A customer's ban never makes their request wait, and is never hidden
//! by a reservation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gcra_core::Decision;
use rate_tier_storage::{
    BucketCancel, BucketCheck, Decided, Storage, StorageError, StorageExt,
};
use smallvec::SmallVec;

use super::leftover::Leftover;
use super::prepare::INLINE;

/// How many requests of one limiter may wait at once by default.
pub(crate) const DEFAULT_MAX_WAITING: usize = 1024;

/// The waiting room: the longest wait, and how many wait now.
#[derive(Debug)]
pub(crate) struct WaitRoom {
    pub(crate) max_wait: Duration,
    pub(crate) max_waiting: usize,
    waiting: AtomicUsize,
}

/// A place in the waiting room, held while the request waits.
struct Seat<'a>(&'a AtomicUsize);

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How a decision went through the waiting room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waited {
    /// Not through it (passed at once, or refused).
    No,
    /// Waited this long for its slot.
    For(Duration),
    /// Would have waited, but the room was full or the wait too long:
    /// checked instead.
    Refused,
}

impl WaitRoom {
    pub(crate) fn new(max_wait: Duration, max_waiting: usize) -> WaitRoom {
        WaitRoom {
            max_wait,
            max_waiting,
            waiting: AtomicUsize::new(0),
        }
    }

    fn seat(&self) -> Option<Seat<'_>> {
        let mut now = self.waiting.load(Ordering::Acquire);
        loop {
            if now >= self.max_waiting {
                return None;
            }
            match self.waiting.compare_exchange_weak(
                now,
                now + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(Seat(&self.waiting)),
                Err(actual) => now = actual,
            }
        }
    }

    /// Decides `checks` (rates alone): reserved and waited for up to
    /// `max_wait` (at most the room's), or, when the wait is too long or
    /// the room full, checked as without waiting. A decision that may not
    /// wait at all is checked, and takes no seat.
    pub(crate) async fn decide(
        &self,
        store: &Arc<dyn Storage>,
        checks: &[BucketCheck<'_>],
        max_wait: Duration,
        out: &mut [Decision],
    ) -> (Result<Decided, StorageError>, Waited) {
        let max_wait = max_wait.min(self.max_wait);
        if max_wait.is_zero() {
            return (store.check(checks, out).await, Waited::No);
        }
        let Some(seat) = self.seat() else {
            let decided = store.check(checks, out).await;
            let waited = match &decided {
                Ok(decided) if !decided.verdict.allowed => Waited::Refused,
                _ => Waited::No,
            };
            return (decided, waited);
        };
        if reads_state(checks) {
            let decided = store.check(checks, out).await;
            match &decided {
                Ok(d) if !d.verdict.allowed && !read_refused(checks, out) => {}
                // Passed, failed, or refused by what it read: answered so.
                _ => return (decided, Waited::No),
            }
        }
        let decided = match store.reserve(checks, max_wait, out).await {
            Ok(decided) => decided,
            Err(error) => return (Err(error), Waited::No),
        };
        if !decided.verdict.allowed {
            drop(seat);
            // Refused as a check refuses it: the same answer, headers and
            // events as without waiting.
            let decided = store.check(checks, out).await;
            let waited = match &decided {
                Ok(decided) if decided.verdict.allowed => Waited::No,
                _ => Waited::Refused,
            };
            return (decided, waited);
        }
        if decided.wait_us == 0 {
            return (Ok(decided), Waited::No);
        }
        let wait = Duration::from_micros(decided.wait_us);
        let give_back = GiveBack::armed(store, checks, out, &decided);
        tokio::time::sleep(wait).await;
        give_back.disarm();
        drop(seat);
        (Ok(decided), Waited::For(wait))
    }
}

/// Whether the decision reads a bucket it does not charge, with a say in
/// the verdict (an enforced peek).
fn reads_state(checks: &[BucketCheck<'_>]) -> bool {
    checks.iter().any(|c| c.cost() == 0 && !c.is_shadow())
}

/// Whether a bucket the decision only reads refused it.
fn read_refused(checks: &[BucketCheck<'_>], out: &[Decision]) -> bool {
    checks
        .iter()
        .zip(out)
        .any(|(c, d)| c.cost() == 0 && !c.is_shadow() && !d.allowed)
}

/// A reservation to give back if the request goes away while it waits.
struct GiveBack<'a> {
    store: &'a Arc<dyn Storage>,
    cancels: SmallVec<[BucketCancel<'a>; INLINE]>,
}

impl<'a> GiveBack<'a> {
    fn armed(
        store: &'a Arc<dyn Storage>,
        checks: &[BucketCheck<'a>],
        out: &[Decision],
        decided: &Decided,
    ) -> GiveBack<'a> {
        let cancels = checks
            .iter()
            .zip(out)
            .enumerate()
            // A reservation's own charges: a shadow limit that refused at
            // the slot wrote at most a capped TAT, not a slot to give back.
            .filter(|(_, (check, decision))| {
                check.cost() > 0 && decision.allowed
            })
            .filter_map(|(i, (check, decision))| {
                let store = decision.store?;
                Some(check.cancel(store.tat_us).charged(decided.charged(i)))
            })
            .collect();
        GiveBack { store, cancels }
    }

    fn disarm(mut self) {
        self.cancels.clear();
    }
}

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        if self.cancels.is_empty() {
            return;
        }
        // A failed give-back loses the slot: never handed out twice.
        Leftover::cancel(self.store, &self.cancels).in_background(drop);
    }
}
