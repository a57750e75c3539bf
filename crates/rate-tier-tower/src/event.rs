//! What the limiter resolves by itself, reported for logs and metrics.

use std::time::Duration;

use rate_tier_storage::StorageEvent;

use crate::{OnStorageError, OnUnknownTier};

/// Something worth knowing that happened while limiting a request.
///
/// Passed to the callback of
/// [`TierLimitLayer::on_event`](crate::TierLimitLayer::on_event). New
/// variants may be added: match with a wildcard arm.
///
/// ```
/// use tower_rate_tier::LimitEvent;
/// fn log(event: &LimitEvent) {
///     if let LimitEvent::UnknownTier { user_id, tier, .. } = event {
///         eprintln!("unknown tier {tier:?} for {user_id}");
///     }
/// }
/// # log(&LimitEvent::MissingIdentity);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitEvent {
    /// A request came with a tier that is not configured; the policy said
    /// what it got. Reported on every such request.
    UnknownTier {
        /// The user id of the request.
        user_id: String,
        /// The tier it claimed.
        tier: String,
        /// The policy applied.
        policy: OnUnknownTier,
    },
    /// A request came without an identity.
    MissingIdentity,
    /// A request was refused with 429.
    Limited {
        /// The user id of the request.
        user_id: String,
        /// The tier whose quota applied.
        tier: String,
        /// The cost asked for.
        cost: u32,
        /// When the same request would pass.
        retry_after: Duration,
    },
    /// A request cost more than its tier's burst and was refused with 403.
    CostExceedsBurst {
        /// The user id of the request.
        user_id: String,
        /// The tier whose quota applied.
        tier: String,
        /// The cost asked for.
        cost: u32,
        /// The most a request may cost in that tier.
        burst: u32,
    },
    /// The store failed; the policy said what the request got.
    StorageError {
        /// The store's kind, e.g. `"redis"`.
        storage: &'static str,
        /// What went wrong.
        error: String,
        /// The policy applied.
        policy: OnStorageError,
    },
    /// The store did something by itself: a circuit breaker changed state,
    /// or a check was decided by the local fallback.
    Storage(StorageEvent),
    /// The plans were replaced ([`RateTier::reload`](crate::RateTier::reload)).
    PlansReloaded {
        /// The tier names now in force.
        tiers: Vec<String>,
    },
    /// The cost function returned 0 (every request costs at least 1); the
    /// request was answered 500.
    InvalidCost,
}
