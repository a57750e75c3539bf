//! What the limiter resolves by itself, reported for logs and metrics.

use std::time::Duration;

use rate_tier_storage::StorageEvent;

use crate::identity::UserId;
use crate::policy::{OnIdentityError, OnStorageError, OnUnknownTier};

/// Something worth knowing that happened while limiting.
///
/// Heard by the listeners of the limiter
/// ([`RateTierBuilder::on_event`](crate::RateTierBuilder::on_event): every
/// event, the store's included) and of a layer
/// ([`TierLimitLayer::on_event`](crate::TierLimitLayer::on_event): its own
/// requests' events). New variants may be added: match with a wildcard arm.
///
/// User ids are [`UserId`]s: `Debug` shows a keyed tag, never the id, so
/// `on_event(|e| tracing::info!(?e))` logs no API key.
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
        /// The user of the request.
        user_id: UserId,
        /// The tier it claimed (client input: escape it when logging).
        tier: String,
        /// The policy applied.
        policy: OnUnknownTier,
    },
    /// A request came without an identity.
    MissingIdentity,
    /// The identity lookup failed; the policy said what the request got.
    IdentityFailed {
        /// What went wrong.
        error: String,
        /// The policy applied.
        policy: OnIdentityError,
    },
    /// A request was refused with 429.
    Limited {
        /// The user of the request.
        user_id: UserId,
        /// The tier that applied.
        tier: &'static str,
        /// The limit that refused (the tier's name for the tier's).
        limit: &'static str,
        /// The limit's size (its burst, N of a window or period, a
        /// concurrency limit's slots; for a ban, the tier's).
        of: u32,
        /// The cost asked of the tier.
        cost: u32,
        /// When the same request would pass.
        retry_after: Duration,
    },
    /// A limit in shadow mode would have refused a request; it passed.
    ShadowLimited {
        /// The user of the request.
        user_id: UserId,
        /// The tier that applied.
        tier: &'static str,
        /// The shadow limit that would have refused.
        limit: &'static str,
        /// When the same request would have passed.
        retry_after: Duration,
    },
    /// A request cost more than a limit's burst and was refused with 403.
    CostExceedsBurst {
        /// The user of the request.
        user_id: UserId,
        /// The tier that applied.
        tier: &'static str,
        /// The limit whose burst is below the cost.
        limit: &'static str,
        /// The cost asked for.
        cost: u32,
        /// The most a request may cost under that limit.
        burst: u32,
    },
    /// The store failed (or could not decide for now); the policy said
    /// what the request got.
    StorageError {
        /// The store's kind, e.g. `"redis"`.
        storage: &'static str,
        /// What went wrong.
        error: String,
        /// The policy applied.
        policy: OnStorageError,
    },
    /// The store did something by itself: a circuit breaker changed state,
    /// a check was decided by the local fallback, a bucket was evicted.
    Storage(StorageEvent),
    /// The tiers were replaced ([`RateTier::reload`](crate::RateTier::reload)).
    TiersReloaded {
        /// The tier names now in force.
        tiers: Vec<String>,
        /// The tiers whose kind changed (a rate became a period, say):
        /// their buckets start fresh, since no store reads one kind's state
        /// as another's.
        fresh: Vec<String>,
    },
    /// Slots of a concurrency limit could not be given back (the store
    /// failed): they stay taken until the store forgets them.
    SlotsLost {
        /// Why.
        error: String,
    },
    /// New tiers were refused and the running ones stay
    /// ([`RateTier::reload`](crate::RateTier::reload)): a tier of a kind the
    /// store does not decide.
    TiersRefused {
        /// Why.
        error: crate::ConfigError,
    },
    /// The cost function returned 0 (every request costs at least 1); the
    /// request was answered 500.
    InvalidCost,
    /// A limit per client address reads the connection's address
    /// ([`ClientIp::reads_connection`](crate::client_ip::ClientIp::reads_connection))
    /// and the request had none: the server was not set up to give it
    /// (axum: serve the app with
    /// `into_make_service_with_connect_info::<SocketAddr>()`). The request
    /// was answered 500, never put in one bucket with every other client.
    NoClientAddress {
        /// The limit.
        limit: &'static str,
        /// The address's source, by name.
        source: &'static str,
    },
    /// A request waited for its slot, then was served
    /// ([`RateTierBuilder::wait_up_to`](crate::RateTierBuilder::wait_up_to)).
    Waited {
        /// The user of the request.
        user_id: UserId,
        /// The tier whose quota applied.
        tier: &'static str,
        /// How long it waited.
        wait: Duration,
    },
    /// A customer was banned: refused everything for `ban`, on every
    /// instance ([`RateTierBuilder::ban`](crate::RateTierBuilder::ban)).
    Banned {
        /// The user banned.
        user_id: UserId,
        /// Their tier.
        tier: &'static str,
        /// How long the ban lasts.
        ban: Duration,
    },
    /// An allowed request brought its customer near the end of a limit:
    /// what is left fell to at most `1 - ratio` of it
    /// ([`RateTierBuilder::near_limit`](crate::RateTierBuilder::near_limit)),
    /// once per crossing: a time to warn the customer before the 429s.
    NearLimit {
        /// The user of the request.
        user_id: UserId,
        /// The tier whose quota applied.
        tier: &'static str,
        /// The limit (the tier's name, or a `Limit`'s).
        limit: &'static str,
        /// What is left.
        remaining: u64,
        /// The limit's size (its burst, or N of a window or period).
        of: u32,
    },
    /// A request would have had to wait longer than allowed, or found the
    /// waiting room full: checked, and refused, as without waiting.
    WaitRefused {
        /// The user of the request.
        user_id: UserId,
        /// The tier whose quota applied.
        tier: &'static str,
    },
}
