//! Settlements go to the store that charged the estimate, whatever the
//! breaker says when the response ends.
//!
//! - Charged locally ([`Charged::Local`]): settled in the local store, under
//!   the share it was charged with. A refund sent to the primary would hand
//!   out quota it never charged.
//! - Charged by the primary, its breaker closed: settled there. A call that
//!   fails is not sent again (it may have been applied, and a second one
//!   would apply it twice): it is reported
//!   [`StorageEvent::SettlementLost`].
//! - Charged by the primary, its breaker open: nothing is sent. The
//!   settlement waits in a bounded queue ([`PENDING_MAX`]) and is sent once
//!   the primary answers again (a debt is also charged locally meanwhile, so
//!   that this instance makes the user wait during the outage). A full queue
//!   drops the oldest, reported [`StorageEvent::SettlementLost`].

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use gcra_core::{Adjust, Quota};
use smallvec::SmallVec;

use super::Inner;
use crate::bucket::Charged;
use crate::bucket::{BucketCheck, BucketSettle, LimitName};
use crate::event::StorageEvent;
use crate::key::KeySecret;
use crate::storage::{StorageError, StorageExt};

/// The most settlements kept for a primary that is down.
pub const PENDING_MAX: usize = 10_000;

/// A settlement waiting for the primary, owned.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    name: LimitName,
    partition: String,
    quota: Quota,
    secret: Option<KeySecret>,
    adjust: Adjust,
}

impl Pending {
    fn of(settle: &BucketSettle<'_>) -> Pending {
        let bucket = &settle.bucket;
        Pending {
            name: bucket.limit_name().clone(),
            partition: bucket.partition().to_owned(),
            quota: bucket.quota(),
            secret: bucket.secret().cloned(),
            adjust: settle.adjust,
        }
    }

    fn settle(&self) -> BucketSettle<'_> {
        BucketCheck::peek(&self.name, &self.partition, self.quota)
            .key_secret(self.secret.as_ref())
            .settle(self.adjust)
    }
}

/// Where each settlement of a call goes.
struct Split<'s, 'a> {
    /// Charged locally, under their local quotas.
    local: SmallVec<[BucketSettle<'a>; 4]>,
    /// Charged by the primary, whose breaker is closed.
    primary: SmallVec<[&'s BucketSettle<'a>; 4]>,
    /// Charged by the primary, whose breaker is open.
    waiting: SmallVec<[&'s BucketSettle<'a>; 4]>,
}

impl Inner {
    fn split<'s, 'a>(&self, settles: &'s [BucketSettle<'a>]) -> Split<'s, 'a> {
        let now = self.clock.now_us();
        let mut split = Split {
            local: SmallVec::new(),
            primary: SmallVec::new(),
            waiting: SmallVec::new(),
        };
        for settle in settles {
            match settle.charged {
                Charged::Local { share } => {
                    let quota = settle.bucket.quota().divided(share);
                    split.local.push(BucketSettle {
                        bucket: settle.bucket.with_quota(quota),
                        ..*settle
                    });
                }
                Charged::Primary => {
                    let routing =
                        self.routing(std::slice::from_ref(&settle.bucket));
                    if routing.breakers.iter().any(|(_, b)| b.is_local(now)) {
                        split.waiting.push(settle);
                    } else {
                        split.primary.push(settle);
                    }
                }
            }
        }
        split
    }

    /// Settles what needs no I/O: the local ones, and the primary's while
    /// its breaker is open (queued). `None` when something goes to the
    /// primary.
    pub(super) fn settle_now(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Option<Result<(), StorageError>> {
        let split = self.split(settles);
        split.primary.is_empty().then(|| self.settle_here(&split))
    }

    fn settle_here(&self, split: &Split<'_, '_>) -> Result<(), StorageError> {
        for settle in &split.waiting {
            self.wait_for_primary(settle);
        }
        self.local.settle_sync(&split.local)
    }

    pub(super) async fn settle(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        let split = self.split(settles);
        self.settle_here(&split)?;
        if split.primary.is_empty() {
            return Ok(());
        }
        let primary: SmallVec<[BucketSettle<'_>; 4]> =
            split.primary.iter().map(|s| **s).collect();
        let result = self.primary.settle(&primary).await;
        if let Err(error) = &result
            && error.is_failure()
        {
            let now = self.clock.now_us();
            let buckets: SmallVec<[BucketCheck<'_>; 4]> =
                primary.iter().map(|s| s.bucket).collect();
            for (domain, breaker) in self.routing(&buckets).breakers {
                if let Some(transition) = breaker.failed(&self.timing, now) {
                    self.report(&domain, transition, Some(error));
                }
            }
            for settle in &primary {
                self.lost(settle.bucket.name());
            }
        }
        result
    }

    /// Queues a settlement of the primary's for when it answers again; a
    /// debt is charged locally too, for the outage.
    fn wait_for_primary(&self, settle: &BucketSettle<'_>) {
        if let Adjust::Charge(units) = settle.adjust
            && units > 0
        {
            let quota = settle.bucket.quota().divided(self.local_share);
            let local = BucketSettle {
                bucket: settle.bucket.with_quota(quota),
                ..*settle
            };
            let _ = self.local.settle_sync(&[local]);
        }
        let dropped = {
            let mut pending =
                self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            pending.push_back(Pending::of(settle));
            self.pending_len.store(pending.len(), Ordering::Release);
            (pending.len() > PENDING_MAX)
                .then(|| pending.pop_front())
                .flatten()
        };
        if let Some(dropped) = dropped {
            self.pending_len.fetch_sub(1, Ordering::AcqRel);
            self.lost(dropped.name.as_str());
        }
    }

    fn lost(&self, limit: &str) {
        self.listeners.emit_with(|| StorageEvent::SettlementLost {
            limit: limit.to_owned(),
        });
    }

    /// The primary answered: send it what waited for it, in the background
    /// (one replay at a time), when a Tokio runtime runs.
    pub(super) fn replay_pending(&self) {
        if self.pending_len.load(Ordering::Acquire) == 0
            || self.replaying.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let (Ok(runtime), Some(inner)) =
            (tokio::runtime::Handle::try_current(), self.this.upgrade())
        else {
            self.replaying.store(false, Ordering::Release);
            return;
        };
        runtime.spawn(replay(inner));
    }

    /// How many settlements wait for the primary.
    pub(super) fn pending(&self) -> usize {
        self.pending_len.load(Ordering::Acquire)
    }
}

/// Sends the queued settlements whose breaker is closed, one call each; a
/// settlement whose breaker is open again stays queued.
async fn replay(inner: Arc<Inner>) {
    let queued: VecDeque<Pending> = {
        let mut pending =
            inner.pending.lock().unwrap_or_else(PoisonError::into_inner);
        inner.pending_len.store(0, Ordering::Release);
        std::mem::take(&mut *pending)
    };
    for pending in queued {
        let settle = pending.settle();
        let now = inner.clock.now_us();
        let open = inner
            .routing(std::slice::from_ref(&settle.bucket))
            .breakers
            .iter()
            .any(|(_, b)| b.is_local(now));
        if open {
            let mut queue =
                inner.pending.lock().unwrap_or_else(PoisonError::into_inner);
            queue.push_back(pending.clone());
            inner.pending_len.store(queue.len(), Ordering::Release);
            continue;
        }
        if inner.primary.settle(&[settle]).await.is_err() {
            inner.lost(pending.name.as_str());
        }
    }
    inner.replaying.store(false, Ordering::Release);
}
