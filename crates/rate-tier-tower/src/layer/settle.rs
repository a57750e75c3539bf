//! Settling a limit's estimated cost after the response: the difference is
//! charged (a debt) or refunded, one more atomic call on the store.

use std::borrow::Cow;
use std::sync::Arc;

use gcra_core::Adjust;
use rate_tier_storage::{BucketCheck, BucketSettle, Charged, StorageError};
use smallvec::SmallVec;

use super::future::BoxFuture;
use super::layer::Config;
use crate::event::LimitEvent;
use crate::outcome::RateLimitInfo;

/// A limit charged an estimate by this request.
#[derive(Debug)]
pub(crate) struct SettleItem {
    /// Its position in the layer's limits.
    pub(crate) index: usize,
    pub(crate) name: &'static str,
    /// Its partition, when not the user's.
    pub(crate) partition: Option<String>,
    pub(crate) estimate: u32,
    /// Where the estimate was charged (known once decided).
    pub(crate) charged: Charged,
}

/// The settlements a request may need once its response is known.
pub(crate) struct SettlePlan {
    items: SmallVec<[SettleItem; 1]>,
    user: String,
    tier: &'static str,
    config: Option<Arc<Config>>,
}

impl SettlePlan {
    pub(super) fn new(items: SmallVec<[SettleItem; 1]>, user: &str) -> Self {
        SettlePlan {
            items,
            user: user.to_owned(),
            tier: "",
            config: None,
        }
    }

    /// For a request that was charged: the tier whose quotas applied, and
    /// only the limits that were charged (a shadow limit that would have
    /// refused was not).
    pub(super) fn bind(mut self, info: &RateLimitInfo) -> Self {
        self.tier = match &info.tier {
            Cow::Borrowed(tier) => tier,
            Cow::Owned(_) => "",
        };
        self.items.retain_mut(|item| {
            let Some(state) =
                info.limits().find(|state| state.name == item.name)
            else {
                return true;
            };
            item.charged = state.charged;
            !state.shadow_limited
        });
        self
    }

    pub(super) fn with_config(mut self, config: Arc<Config>) -> Self {
        self.config = Some(config);
        self
    }

    /// Settles from the response: at once on an in-process store, or the
    /// future that does it on a remote one.
    pub(super) fn run(
        self,
        response: &http::response::Parts,
    ) -> Option<BoxFuture<()>> {
        let config = self.config.clone()?;
        let adjusted: SmallVec<[(usize, Adjust); 1]> = self
            .items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| {
                let settle = config.limits.get(item.index)?.settle.as_ref()?;
                let actual = settle.actual(response)?;
                let adjust = Adjust::between(item.estimate, actual);
                (adjust != Adjust::Charge(0)).then_some((i, adjust))
            })
            .collect();
        if adjusted.is_empty() {
            return None;
        }
        let storage = config.tiers.storage().clone();
        {
            let settles = self.settles(&config, &adjusted);
            if let Some(result) = storage.settle_local(&settles) {
                report(&config, result);
                return None;
            }
        }
        Some(Box::pin(async move {
            let settles = self.settles(&config, &adjusted);
            let result = storage.settle(&settles).await;
            report(&config, result);
        }))
    }

    fn settles<'a>(
        &'a self,
        config: &'a Config,
        adjusted: &[(usize, Adjust)],
    ) -> SmallVec<[BucketSettle<'a>; 1]> {
        let secret = config.tiers.inner.key_secret.as_ref();
        adjusted
            .iter()
            .filter_map(|&(i, adjust)| {
                let item = self.items.get(i)?;
                let limit = config.limits.get(item.index)?;
                let partition = item.partition.as_deref().unwrap_or(&self.user);
                let bucket = BucketCheck::peek(
                    limit.key,
                    partition,
                    limit.quota_for(self.tier),
                )
                .key_secret(secret);
                Some(bucket.settle(adjust).charged(item.charged))
            })
            .collect()
    }
}

/// A settlement that failed is reported; the response goes out regardless.
fn report(config: &Config, result: Result<(), StorageError>) {
    if let Err(error) = result {
        let policy = config.tiers.plans().on_storage_error();
        let storage = config.tiers.storage().kind();
        config.emit(LimitEvent::StorageError {
            storage,
            error: format!("settling: {error}"),
            policy,
        });
    }
}
