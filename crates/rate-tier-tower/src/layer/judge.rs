//! From a request's parts to a verdict: identity, cost, the limiter, and
//! the reporting around them. Shared by every protocol's service.

use std::time::Instant;

use http::request::Parts;

use super::cost::RouteCost;
use super::layer::{Config, Identifier};
use crate::observe::{Checked, Outcome};
use crate::tier::Verdict;
use crate::{LimitEvent, LimitReason, TierIdentity};

impl Config {
    pub(crate) fn emit(&self, event: LimitEvent) {
        if let Some(on_event) = &self.on_event {
            on_event(&event);
        }
        if let Some(observer) = &self.observer {
            observer.event(&event);
        }
    }

    /// Decides one request. Never calls the inner service.
    pub(crate) async fn judge(&self, parts: &Parts) -> Verdict {
        let started = self.observer.as_ref().map(|_| Instant::now());
        let identity: Option<TierIdentity> = match &self.identifier {
            Identifier::None => None,
            Identifier::Headers(identify) => identify(&parts.headers),
            Identifier::Async(identifier) => identifier.identify(parts).await,
        };
        let cost = match parts.extensions.get::<RouteCost>() {
            Some(RouteCost(cost)) => *cost,
            None => self.cost.as_ref().map_or(1, |cost_fn| cost_fn(parts)),
        };
        let verdict = if cost == 0 {
            self.emit(LimitEvent::InvalidCost);
            Verdict::InvalidCost
        } else {
            let mut emit = |event: LimitEvent| self.emit(event);
            self.tiers.decide(identity.as_ref(), cost, &mut emit).await
        };
        if let (Some(observer), Some(started)) = (&self.observer, started) {
            observer.checked(&Checked {
                tier: verdict.tier(),
                outcome: verdict.outcome(),
                storage: self.tiers.storage().kind(),
                elapsed: started.elapsed(),
            });
        }
        verdict
    }
}

impl Verdict {
    fn tier(&self) -> Option<&'static str> {
        match self {
            Verdict::Allowed(info) => static_name(&info.tier),
            Verdict::Limited(limited) => static_name(&limited.tier),
            _ => None,
        }
    }

    fn outcome(&self) -> Outcome {
        match self {
            Verdict::Allowed(_) => Outcome::Allowed,
            Verdict::Unlimited => Outcome::Unlimited,
            Verdict::Limited(limited) => match limited.reason() {
                LimitReason::RateLimited => Outcome::Limited,
                LimitReason::CostExceedsBurst { .. } => {
                    Outcome::CostExceedsBurst
                }
                LimitReason::UnknownTier => Outcome::UnknownTierDenied,
            },
            Verdict::Denied(_) => Outcome::MissingIdentity,
            Verdict::Unavailable(_) => Outcome::StorageError,
            Verdict::Invalid | Verdict::InvalidCost => Outcome::Invalid,
        }
    }
}

/// Configured tier names are `Cow::Borrowed` interned names; a claimed
/// (client-sent) name is owned and must not become a label.
fn static_name(name: &std::borrow::Cow<'static, str>) -> Option<&'static str> {
    match name {
        std::borrow::Cow::Borrowed(name) => Some(name),
        std::borrow::Cow::Owned(_) => None,
    }
}
