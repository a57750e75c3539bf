//! The slots of concurrency limits a passed request holds, given back when
//! the last holder lets go: the layer's response body when it ends, or an
//! [`Admitted`](crate::Admitted) dropped by a caller of
//! [`RateTier::check`](crate::RateTier::check) and friends.
//!
//! On a store that leases slots ([`Capabilities::lease`](rate_tier_storage::Capabilities::lease)),
//! a task renews them every third of the lease while they are held, so a
//! long request keeps its slots and an instance that dies loses them when
//! the lease runs out.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rate_tier_storage::StorageExt;
use rate_tier_storage::key::KeySecret;
use rate_tier_storage::{BucketCheck, LimitName, Rule};
use smallvec::SmallVec;
use tokio::sync::oneshot;

use super::Inner;
use super::leftover::Leftover;
use crate::event::LimitEvent;

/// One slot held: its limit, partition, rule, cost and lease.
#[derive(Clone)]
struct Slot {
    key: &'static LimitName,
    partition: Box<str>,
    rule: Rule,
    cost: u32,
    lease: u64,
}

/// Slots held by one request; released on drop.
pub(crate) struct Slots {
    inner: Arc<Inner>,
    slots: SmallVec<[Slot; 1]>,
    /// Dropped with the slots: stops their renewal.
    _renewing: Option<oneshot::Sender<()>>,
}

impl Slots {
    /// Holds the slots `checks` took (those of concurrency limits whose
    /// decision passed); `None` when there are none.
    pub(crate) fn held<'a>(
        inner: &Arc<Inner>,
        taken: impl Iterator<Item = (&'static LimitName, &'a BucketCheck<'a>)>,
    ) -> Option<Arc<Slots>> {
        let slots: SmallVec<[Slot; 1]> = taken
            .filter(|(_, check)| {
                matches!(check.rule(), Rule::Concurrency(_)) && check.cost() > 0
            })
            .map(|(key, check)| Slot {
                key,
                partition: check.partition().into(),
                rule: check.rule(),
                cost: check.cost(),
                lease: check.lease(),
            })
            .collect();
        if slots.is_empty() {
            return None;
        }
        let renewing = inner
            .store
            .capabilities()
            .lease
            .and_then(|lease| renew(inner, &slots, lease));
        Some(Arc::new(Slots {
            inner: Arc::clone(inner),
            slots,
            _renewing: renewing,
        }))
    }
}

/// Renews `slots` every third of `lease` until the returned sender is
/// dropped; `None` outside a Tokio runtime (the slots then live one lease).
fn renew(
    inner: &Arc<Inner>,
    slots: &[Slot],
    lease: Duration,
) -> Option<oneshot::Sender<()>> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let (stop, mut stopped) = oneshot::channel::<()>();
    let (inner, slots) = (Arc::clone(inner), slots.to_vec());
    let every = (lease / 3).max(Duration::from_millis(1));
    runtime.spawn(async move {
        let mut ticks = tokio::time::interval_at(
            tokio::time::Instant::now() + every,
            every,
        );
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                _ = ticks.tick() => {}
            }
            let secret = inner.key_secret.as_ref();
            let checks: Vec<BucketCheck<'_>> =
                slots.iter().filter_map(|slot| slot.check(secret)).collect();
            // A failed renewal is tried again at the next tick; the lease
            // is three ticks long.
            let _ = inner.store.renew(&checks).await;
        }
    });
    Some(stop)
}

impl Drop for Slots {
    fn drop(&mut self) {
        let secret = self.inner.key_secret.as_ref();
        let checks: SmallVec<[BucketCheck<'_>; 1]> = self
            .slots
            .iter()
            .filter_map(|slot| slot.check(secret))
            .collect();
        let inner = Arc::clone(&self.inner);
        Leftover::release(&self.inner.store, &checks).in_background(
            move |released| {
                if let Err(error) = released {
                    let error = error.to_string();
                    inner
                        .listeners
                        .emit_with(|| LimitEvent::SlotsLost { error });
                }
            },
        );
    }
}

impl Slot {
    /// The check that gives this slot back.
    fn check<'a>(
        &'a self,
        secret: Option<&'a KeySecret>,
    ) -> Option<BucketCheck<'a>> {
        BucketCheck::of_rule(self.key, &self.partition, self.rule, self.cost)
            .ok()
            .map(|check| check.key_secret(secret).lease_id(self.lease))
    }
}

impl fmt::Debug for Slots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} slots", self.slots.len())
    }
}
