//! Settling a limit's estimated cost after the response: the difference is
//! charged (a debt) or refunded, one more atomic call on the store, when
//! the response body ends (or is dropped): see `body.rs`.

use std::borrow::Cow;
use std::sync::Arc;

use gcra_core::Adjust;
use rate_tier_storage::StorageExt;
use rate_tier_storage::{BucketCheck, BucketSettle, Charged, StorageError};
use smallvec::SmallVec;

use super::config::Config;
use crate::event::LimitEvent;
use crate::limit::Usage;
use crate::limiter::leftover::Leftover;
use crate::outcome::RateLimitInfo;

/// A boxed future of the layer's (a decision awaiting the store, a
/// settlement).
pub(super) type BoxFuture<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

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
    /// The customer's own rule for the limit, if any: settled under it.
    pub(crate) own: Option<rate_tier_storage::Rule>,
}

/// The settlements a request may need once its response is known.
pub(crate) struct SettlePlan {
    items: SmallVec<[SettleItem; 1]>,
    user: String,
    tier: &'static str,
    config: Option<Arc<Config>>,
    /// The meter the handler fills, for limits that read one.
    usage: Option<Usage>,
}

impl SettlePlan {
    pub(super) fn new(items: SmallVec<[SettleItem; 1]>, user: &str) -> Self {
        SettlePlan {
            items,
            user: user.to_owned(),
            tier: "",
            config: None,
            usage: None,
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

    /// The meter the request's handler fills, if a limit reads one: put in
    /// the request's extensions.
    pub(super) fn meter(&mut self) -> Option<Usage> {
        let config = self.config.as_ref()?;
        let metered = self.items.iter().any(|item| {
            config
                .limits
                .get(item.index)
                .and_then(|limit| limit.settle.as_ref())
                .is_some_and(|settle| settle.uses_meter())
        });
        metered.then(|| self.usage.get_or_insert_with(Usage::default).clone())
    }

    /// What the response head tells: the settlement to make when the body
    /// ends.
    pub(super) fn at_head(
        self,
        response: &http::response::Parts,
    ) -> Option<Finish> {
        let config = self.config.clone()?;
        let actuals = self
            .items
            .iter()
            .map(|item| {
                config
                    .limits
                    .get(item.index)
                    .and_then(|limit| limit.settle.as_ref())
                    .and_then(|settle| settle.at_head(response))
            })
            .collect();
        Some(Finish {
            plan: self,
            config,
            actuals,
        })
    }
}

/// A settlement waiting for the end of the response body: each item's
/// actual cost as known so far (`None`: not yet, which keeps the estimate
/// if it stays so).
pub(crate) struct Finish {
    plan: SettlePlan,
    config: Arc<Config>,
    actuals: SmallVec<[Option<u32>; 1]>,
}

impl Finish {
    /// Reads the actual costs a body's trailers carry.
    pub(super) fn trailers(&mut self, trailers: &http::HeaderMap) {
        for (item, actual) in
            self.plan.items.iter().zip(self.actuals.iter_mut())
        {
            let read = self
                .config
                .limits
                .get(item.index)
                .and_then(|limit| limit.settle.as_ref())
                .and_then(|settle| settle.in_trailers(trailers));
            if actual.is_none() {
                *actual = read;
            }
        }
    }

    /// Settles: at once on an in-process store (`None`), or the future that
    /// does it on a remote one.
    pub(super) fn settle(mut self) -> Option<BoxFuture<()>> {
        if let Some(recorded) = self.plan.usage.as_ref().and_then(Usage::get) {
            for (item, actual) in
                self.plan.items.iter().zip(self.actuals.iter_mut())
            {
                let metered = self
                    .config
                    .limits
                    .get(item.index)
                    .and_then(|limit| limit.settle.as_ref())
                    .is_some_and(|settle| settle.uses_meter());
                if metered && actual.is_none() {
                    *actual = Some(recorded);
                }
            }
        }
        let adjusted: SmallVec<[(usize, Adjust); 1]> = self
            .plan
            .items
            .iter()
            .zip(&self.actuals)
            .enumerate()
            .filter_map(|(i, (item, actual))| {
                let adjust = Adjust::between(item.estimate, (*actual)?);
                (adjust != Adjust::Charge(0)).then_some((i, adjust))
            })
            .collect();
        if adjusted.is_empty() {
            return None;
        }
        let config = self.config.clone();
        let settles = self.plan.settles(&config, &adjusted);
        let leftover = Leftover::settle(config.tiers.storage(), &settles);
        drop(settles);
        leftover.made(move |result| report(&config, result))
    }

    /// The body was dropped before its end (the client went away): settle
    /// with what is known, in the background if the store needs I/O.
    pub(super) fn abandon(self) {
        if let Some(settling) = self.settle() {
            spawn(settling);
        }
    }
}

/// Runs a settlement nobody waits for, on the current Tokio runtime; none
/// (a body dropped outside any): it is lost, and reported so.
pub(super) fn spawn(settling: BoxFuture<()>) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(settling);
    }
}

impl SettlePlan {
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
                let applied =
                    match item.own.map(|own| limit.with_settle_debt(own)) {
                        Some(rate_tier_storage::Rule::Rate(quota)) => quota,
                        _ => limit.quota_for(self.tier),
                    };
                let bucket = BucketCheck::peek(limit.key, partition, applied)
                    .key_secret(secret);
                Some(bucket.settle(adjust).charged(item.charged))
            })
            .collect()
    }
}

/// A settlement that failed is reported; the response goes out regardless.
fn report(config: &Config, result: Result<(), StorageError>) {
    if let Err(error) = result {
        let policy = config.tiers.tiers().on_storage_error();
        let storage = config.tiers.storage().kind();
        config.emit(LimitEvent::StorageError {
            storage,
            error: format!("settling: {error}"),
            policy,
        });
    }
}
