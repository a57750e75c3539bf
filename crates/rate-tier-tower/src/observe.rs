//! A hook for metrics: the outcome and latency of every check.

use std::time::Duration;

use crate::event::LimitEvent;
#[cfg(feature = "metrics-facade")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics-facade")))]
pub use crate::facade::FacadeMetrics;
#[cfg(feature = "opentelemetry")]
#[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
pub use crate::otel::OtelMetrics;
pub use crate::outcome::LimitState;
use crate::shape::ShapeEvent;

/// What the middleware did with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Refused: the customer is banned
    /// ([`RateTierBuilder::ban`](crate::RateTierBuilder::ban)).
    Banned,
    /// Passed, charged to a bucket.
    Allowed,
    /// Refused with 429: the bucket is empty for now.
    Limited,
    /// Refused with 403: the cost is above the tier's burst.
    CostExceedsBurst,
    /// Refused with 403: unknown tier, `OnUnknownTier::Deny`.
    UnknownTierDenied,
    /// Refused: no identity, `OnMissing::Deny`.
    MissingIdentity,
    /// Refused: the identity lookup failed, `OnIdentityError::Deny`.
    IdentityError,
    /// Passed, but a limit in shadow mode would have refused it.
    ShadowLimited,
    /// Passed without a check by an explicit policy (unknown tier allowed,
    /// a storage error with `OnStorageError::Allow`, an identity error with
    /// `OnIdentityError::Allow`).
    Unlimited,
    /// Refused: the store failed, `OnStorageError::Deny`.
    StorageError,
    /// Refused with 500: the cost function returned 0, or the clock is out
    /// of range.
    Invalid,
}

impl Outcome {
    /// A stable lower-case label, e.g. for a metric.
    ///
    /// ```
    /// assert_eq!(tower_rate_tier::observe::Outcome::CostExceedsBurst.as_str(), "cost_exceeds_burst");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::Banned => "banned",
            Outcome::CostExceedsBurst => "cost_exceeds_burst",
            Outcome::UnknownTierDenied => "unknown_tier_denied",
            Outcome::MissingIdentity => "missing_identity",
            Outcome::IdentityError => "identity_error",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::Unlimited => "unlimited",
            Outcome::StorageError => "storage_error",
            Outcome::Invalid => "invalid",
        }
    }
}

/// One check, as an [`Observer`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Checked {
    /// The configured tier whose quota applied, if any. Never a tier name a
    /// client sent: label cardinality stays bounded by the configuration.
    pub tier: Option<&'static str>,
    /// What happened.
    pub outcome: Outcome,
    /// The tier's cost of the request (0 for a peek, or when the request
    /// was answered before its cost was known).
    pub cost: u32,
    /// The store that decided (`"memory"`, `"redis"`, `"fallback"` for a
    /// fallback's local decision, ...), or `"none"` when no store was asked.
    pub storage: &'static str,
    /// Identity, cost and decision, measured around the limiter (not the
    /// inner service).
    pub elapsed: Duration,
}

/// Watches every check and every event, for metrics: the one observer.
///
/// Set on the limiter with
/// [`RateTierBuilder::observe`](crate::RateTierBuilder::observe) to see
/// everything once (every layer's checks, the store's events, reloads), on
/// a layer with [`TierLimitLayer::observe`](crate::TierLimitLayer::observe)
/// to see that layer's requests only, or on a shaper with
/// [`ShapeLayerBuilder::observe`](crate::shape::ShapeLayerBuilder::observe)
/// to see its calls. Each `on_event` (the limiter's, a layer's, a
/// shaper's) is its thin form: a closure of the events alone. Every method
/// runs on the request path: keep them to counter updates.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use tower_rate_tier::{observe::Checked, Observer, observe::Outcome};
///
/// #[derive(Default)]
/// struct Refusals(AtomicU64);
///
/// impl Observer for Refusals {
///     fn checked(&self, check: &Checked) {
///         if check.outcome == Outcome::Limited {
///             self.0.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
/// ```
pub trait Observer: Send + Sync + 'static {
    /// Called once per request checked.
    fn checked(&self, check: &Checked) {
        let _ = check;
    }

    /// Called with every [`LimitEvent`] its registration hears.
    fn event(&self, event: &LimitEvent) {
        let _ = event;
    }

    /// Called once per event of a shaper it observes
    /// ([`ShapeLayerBuilder::observe`](crate::shape::ShapeLayerBuilder::observe)),
    /// on the call's task.
    fn shaped(&self, event: &ShapeEvent) {
        let _ = event;
    }
}

impl<T: Observer + ?Sized> Observer for std::sync::Arc<T> {
    fn checked(&self, check: &Checked) {
        (**self).checked(check);
    }

    fn event(&self, event: &LimitEvent) {
        (**self).event(event);
    }

    fn shaped(&self, event: &ShapeEvent) {
        (**self).shaped(event);
    }
}
