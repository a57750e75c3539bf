//! Reservations behind the breaker: on the primary while every breaker of
//! the reservation is closed (or due for a probe), else locally under the
//! local share of each quota, all of it.
//!
//! A reservation is never split between the stores: its slot is one
//! instant for every limit, and two stores reserve on two clocks. A
//! reservation that finds any of its breakers open is made locally, whole;
//! a primary that fails while reserving sends it here too. Each
//! reservation is given back where it was made ([`BucketCancel::charged`]).

use std::time::Duration;

use gcra_core::Decision;
use smallvec::SmallVec;

use super::Inner;
use super::breaker::Route;
use super::decide::{Primary, Routing, locally};
use crate::bucket::{BucketCancel, BucketCheck, Charged};
use crate::event::StorageEvent;
use crate::storage::{Decided, StorageError, StorageExt};

impl Inner {
    pub(super) async fn reserve(
        &self,
        checks: &[BucketCheck<'_>],
        max_wait: Duration,
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        let Routing { breakers, .. } = self.routing(checks);
        let routes = self.routes(&breakers);
        if routes.iter().any(|route| matches!(route, Route::Local)) {
            // The probes this call was given go unused.
            let now = self.clock.now_us();
            for ((domain, breaker), route) in breakers.iter().zip(&routes) {
                if let Route::Probe(doublings) = route {
                    self.report(
                        domain,
                        breaker.unprobed(now, *doublings),
                        None,
                    );
                }
            }
            return self.reserve_locally(checks, max_wait, out);
        }
        let call = self.primary.reserve(checks, max_wait, out);
        match self.on_primary(call, &breakers, &routes).await? {
            Primary::Decided(decided) => Ok(decided),
            Primary::Failed => self.reserve_locally(checks, max_wait, out),
        }
    }

    /// Every breaker of `checks` open and not due for a probe: the
    /// reservation is local, without I/O.
    pub(super) fn reserves_here(&self, checks: &[BucketCheck<'_>]) -> bool {
        let now = self.clock.now_us();
        self.routing(checks)
            .breakers
            .iter()
            .all(|(_, breaker)| breaker.is_local(now))
    }

    pub(super) fn reserve_locally(
        &self,
        checks: &[BucketCheck<'_>],
        max_wait: Duration,
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        let local = self.local_checks(checks.iter().copied())?;
        let decided = self.local.reserve_sync(&local, max_wait, out)?;
        self.listeners.emit_with(|| StorageEvent::Fallback {
            limit: checks.first().map_or("", |c| c.name()).to_owned(),
            allowed: decided.verdict.allowed,
        });
        Ok(locally(decided, self.local_share))
    }

    /// Gives back locally the reservations made here; returns the
    /// primary's.
    pub(super) fn cancel_here<'c>(
        &self,
        reserved: &[BucketCancel<'c>],
    ) -> Result<SmallVec<[BucketCancel<'c>; 4]>, StorageError> {
        let mut primary = SmallVec::new();
        for cancel in reserved {
            match cancel.charged {
                Charged::Primary => primary.push(*cancel),
                Charged::Local { share } => {
                    let rule = cancel.bucket.rule().divided(share);
                    let mut here = *cancel;
                    here.bucket = cancel.bucket.with_rule(rule);
                    self.local.cancel_sync(std::slice::from_ref(&here))?;
                }
            }
        }
        Ok(primary)
    }
}
