//! Windows, periods and concurrency limits of one decision in different
//! partitions, on a store that cannot decide them together
//! ([`Capabilities::spans_partitions`] false: a Redis Cluster, one hash slot per
//! partition). Such a decision would be refused at run time, for every
//! request that makes it; here it is refused at build time instead
//! ([`ConfigError::KindsInTwoPartitions`]): when a layer takes a limit,
//! and when tiers are reloaded under live layers.
//!
//! [`Capabilities::spans_partitions`]: rate_tier_storage::Capabilities::spans_partitions

use std::sync::{Arc, Mutex, PoisonError, Weak};

use rate_tier_storage::{RuleKind, Storage, StorageExt};

use super::RateTier;
use crate::error::ConfigError;
use crate::limit::{Limit, Scope};
use crate::tiers::Tiers;

/// The limits of the live layers over one limiter that hold a window, a
/// period or a concurrency limit, on a store that does not span
/// partitions: what a reload is checked against. Each layer holds its own
/// list; a layer gone (its services too) is forgotten.
#[derive(Debug, Default)]
pub(crate) struct Layers(Mutex<Vec<Weak<[Limit]>>>);

impl RateTier {
    /// Checks the limits of a layer against the tiers in force, and keeps
    /// them for the checks of later reloads as long as the returned list
    /// lives (the layer holds it). `None`: nothing to keep (the store spans
    /// partitions, or the limits are all rates).
    pub(crate) fn admit_limits(
        &self,
        limits: &[Limit],
    ) -> Result<Option<Arc<[Limit]>>, ConfigError> {
        let store = &self.inner.store;
        let rates_only = limits
            .iter()
            .all(|limit| limit.kinds().all(|kind| kind == RuleKind::Rate));
        if store.capabilities().spans_partitions || rates_only {
            return Ok(None);
        }
        let mut layers = self.inner.layers.lock();
        check(store, &self.inner.tiers.load(), limits)?;
        let kept: Arc<[Limit]> = limits.into();
        layers.retain(|layer| layer.strong_count() > 0);
        layers.push(Arc::downgrade(&kept));
        Ok(Some(kept))
    }

    /// Checks `tiers` against the limits of every live layer, and then
    /// runs `replace` (which puts them in force) before any layer can take
    /// another limit.
    pub(crate) fn swap_tiers<R>(
        &self,
        tiers: &Tiers,
        replace: impl FnOnce() -> R,
    ) -> Result<R, ConfigError> {
        let layers = self.inner.layers.lock();
        for limits in layers.iter().filter_map(Weak::upgrade) {
            check(&self.inner.store, tiers, &limits)?;
        }
        Ok(replace())
    }
}

impl Layers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<[Limit]>>> {
        // A list of weak pointers: a panic elsewhere cannot leave it half
        // written.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// On a store that does not span partitions: that in no tier of `tiers`
/// do two windows, periods or concurrency limits of different partitions
/// (the tier's, per user, and `limits`') meet. Every limit is taken to
/// apply to every request (a `when` is not known before one).
pub(crate) fn check(
    store: &Arc<dyn Storage>,
    tiers: &Tiers,
    limits: &[Limit],
) -> Result<(), ConfigError> {
    if store.capabilities().spans_partitions {
        return Ok(());
    }
    for tier in &tiers.tiers {
        let plan = (tier.rule.kind() != RuleKind::Rate).then_some((
            tier.name,
            "the tier, per user",
            &Scope::User,
        ));
        let mut others = plan.into_iter().chain(
            limits
                .iter()
                .filter(|limit| {
                    limit.rule_for(tier.name).kind() != RuleKind::Rate
                })
                .map(|limit| {
                    (limit.name, limit.scope.described(), &limit.scope)
                }),
        );
        let Some(first) = others.next() else {
            continue;
        };
        // Partitions that are the same are so for every request: each is
        // compared with the first.
        if let Some(second) =
            others.find(|other| !first.2.same_partition(other.2))
        {
            return Err(ConfigError::KindsInTwoPartitions {
                limits: [first.0.to_owned(), second.0.to_owned()],
                partitions: [first.1, second.1],
                tier: tier.name.to_owned(),
                store: store.kind(),
            });
        }
    }
    Ok(())
}
