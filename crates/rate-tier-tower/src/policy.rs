//! What a request gets when something does not fit: no identity, an
//! unknown tier, a failed identity lookup, a failed store. Each is an
//! explicit choice with a safe default.

use http::StatusCode;

/// What a request without an identity gets.
///
/// ```
/// use http::StatusCode;
/// use tower_rate_tier::{OnMissing, Quota, RateTier};
/// let tiers = RateTier::builder()
///     .tier("free", Quota::per_minute(10))
///     .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
///     .build();
/// assert_eq!(tiers.tiers().on_missing(), OnMissing::Deny(StatusCode::UNAUTHORIZED));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnMissing {
    /// The default tier's quota, in one bucket shared by every anonymous
    /// request. Requires a default tier.
    UseDefault,
    /// Refused with this status (e.g. 401 Unauthorized), storage untouched.
    Deny(StatusCode),
}

/// What a request whose tier is not configured gets. Never unlimited, unless
/// chosen explicitly with [`OnUnknownTier::Allow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnUnknownTier {
    /// The default tier's quota, in the user's own bucket. Requires a
    /// default tier. The default when one is set.
    UseDefault,
    /// Refused with 403 Forbidden. The default without a default tier.
    Deny,
    /// Passed without any limit. Every such request is still reported as
    /// [`LimitEvent::UnknownTier`](crate::LimitEvent::UnknownTier).
    Allow,
}

impl OnUnknownTier {
    /// A stable lower-case label, e.g. for a metric.
    ///
    /// ```
    /// assert_eq!(tower_rate_tier::policy::OnUnknownTier::UseDefault.as_str(), "use_default");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            OnUnknownTier::UseDefault => "use_default",
            OnUnknownTier::Deny => "deny",
            OnUnknownTier::Allow => "allow",
        }
    }
}

/// What a request gets when the store fails (or times out), or cannot
/// decide for now (a fallback's local share below the cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnStorageError {
    /// Refused with this status and `retry-after: 1` (the default: 503
    /// Service Unavailable). Fails closed: no one exceeds a quota.
    Deny(StatusCode),
    /// Passed without a check (fails open). Every such request is reported
    /// as [`LimitEvent::StorageError`](crate::LimitEvent::StorageError).
    Allow,
}

impl Default for OnStorageError {
    fn default() -> Self {
        OnStorageError::Deny(StatusCode::SERVICE_UNAVAILABLE)
    }
}

/// What a request gets when its identity could not be looked up (the
/// database behind an async [`TierIdentifier`](crate::TierIdentifier) is
/// down). A failed lookup is not "no identity": it must not pool every
/// caller into the anonymous bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnIdentityError {
    /// Refused with this status and `retry-after: 1` (the default: 503
    /// Service Unavailable, a transient failure). Fails closed.
    Deny(StatusCode),
    /// Passed without a check (fails open). Every such request is reported
    /// as [`LimitEvent::IdentityFailed`](crate::LimitEvent::IdentityFailed).
    Allow,
}

impl Default for OnIdentityError {
    fn default() -> Self {
        OnIdentityError::Deny(StatusCode::SERVICE_UNAVAILABLE)
    }
}
