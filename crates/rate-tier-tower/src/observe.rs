//! A hook for metrics: the outcome and latency of every check.

use std::time::Duration;

use crate::LimitEvent;

/// What the middleware did with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
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
    /// Passed without a check by an explicit policy (unknown tier allowed,
    /// or a storage error with `OnStorageError::Allow`).
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
    /// assert_eq!(tower_rate_tier::Outcome::CostExceedsBurst.as_str(), "cost_exceeds_burst");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::CostExceedsBurst => "cost_exceeds_burst",
            Outcome::UnknownTierDenied => "unknown_tier_denied",
            Outcome::MissingIdentity => "missing_identity",
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
    /// The kind of store asked (`"memory"`, `"redis"`, ...).
    pub storage: &'static str,
    /// Identity, cost and decision, measured around the limiter (not the
    /// inner service).
    pub elapsed: Duration,
}

/// Watches every check and every event, for metrics.
///
/// Set with [`TierLimitLayer::observe`](crate::TierLimitLayer::observe).
/// Both methods run on the request path: keep them to counter updates.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use tower_rate_tier::{Checked, Observer, Outcome};
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
    /// Called once per request that reached the limiter.
    fn checked(&self, check: &Checked) {
        let _ = check;
    }

    /// Called with every [`LimitEvent`], including the store's.
    fn event(&self, event: &LimitEvent) {
        let _ = event;
    }

    /// Who this observer is, if clones of it share one state (e.g. the
    /// address of an `Arc` inside): the events that come from no request
    /// (breaker, fallback, reloads) then reach it once even when several
    /// layers observe it. `None` (the default): once per layer.
    fn key(&self) -> Option<usize> {
        None
    }
}
