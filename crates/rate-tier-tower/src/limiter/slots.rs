//! The slots of concurrency limits a passed request holds, given back when
//! the last holder lets go: the layer's response body when it ends, or a
//! [`RateLimitInfo`](crate::RateLimitInfo) dropped by a caller of
//! [`RateTier::check`](crate::RateTier::check) and friends.

use std::fmt;
use std::sync::Arc;

use rate_tier_storage::key::KeySecret;
use rate_tier_storage::{BucketCheck, LimitName, Rule};
use smallvec::SmallVec;

use super::Inner;
use crate::event::LimitEvent;

/// One slot held: its limit, partition, rule and cost.
struct Slot {
    key: &'static LimitName,
    partition: Box<str>,
    rule: Rule,
    cost: u32,
}

/// Slots held by one request; released on drop.
pub(crate) struct Slots {
    inner: Arc<Inner>,
    slots: SmallVec<[Slot; 1]>,
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
            })
            .collect();
        (!slots.is_empty()).then(|| {
            Arc::new(Slots {
                inner: Arc::clone(inner),
                slots,
            })
        })
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        let local = {
            let secret = self.inner.key_secret.as_ref();
            let checks: SmallVec<[BucketCheck<'_>; 1]> = self
                .slots
                .iter()
                .filter_map(|slot| slot.check(secret))
                .collect();
            self.inner.store.release_local(&checks)
        };
        let lost = |inner: &Inner, error: String| {
            inner
                .listeners
                .emit_with(|| LimitEvent::SlotsLost { error });
        };
        match local {
            Some(Ok(())) => {}
            Some(Err(error)) => lost(&self.inner, error.to_string()),
            // A store that needs I/O: released in a task of its own.
            None => {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    lost(
                        &self.inner,
                        "no Tokio runtime to release them in".into(),
                    );
                    return;
                };
                let slots = std::mem::take(&mut self.slots);
                let inner = Arc::clone(&self.inner);
                runtime.spawn(async move {
                    let secret = inner.key_secret.as_ref();
                    let checks: Vec<BucketCheck<'_>> = slots
                        .iter()
                        .filter_map(|slot| slot.check(secret))
                        .collect();
                    if let Err(error) = inner.store.release(&checks).await {
                        lost(&inner, error.to_string());
                    }
                });
            }
        }
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
            .map(|check| check.key_secret(secret))
    }
}

/// The slots a [`RateLimitInfo`](crate::RateLimitInfo) holds: not part of
/// its value (two infos that differ only by their slots are equal).
#[derive(Clone, Default)]
pub(crate) struct Held(pub(crate) Option<Arc<Slots>>);

impl PartialEq for Held {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Held {}

impl fmt::Debug for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            None => f.write_str("none"),
            Some(slots) => write!(f, "{} slots", slots.slots.len()),
        }
    }
}
