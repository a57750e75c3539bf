//! Who is asking, and on which plan.

use std::sync::Arc;

use http::request::Parts;

/// A user id and the tier (plan) it is on, as found in a request.
///
/// An empty user id counts as no identity.
///
/// ```
/// use tower_rate_tier::TierIdentity;
/// let who = TierIdentity::new("key_ana", "free");
/// assert_eq!((who.user(), who.tier()), ("key_ana", "free"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TierIdentity {
    user: String,
    tier: String,
}

impl TierIdentity {
    /// `user` on `tier`.
    pub fn new(user: impl Into<String>, tier: impl Into<String>) -> Self {
        TierIdentity {
            user: user.into(),
            tier: tier.into(),
        }
    }

    /// The user id: an API key, an account id, a token subject.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The tier name, as the request's owner is on it.
    pub fn tier(&self) -> &str {
        &self.tier
    }
}

/// Finds the identity of a request, possibly asynchronously (a database
/// lookup, a token introspection).
///
/// `None` means "no identity": the limiter's [`OnMissing`](crate::OnMissing)
/// policy applies. For a synchronous rule over the headers,
/// [`TierLimitLayer::identifier_fn`](crate::TierLimitLayer::identifier_fn)
/// is shorter.
///
/// ```
/// use tower_rate_tier::{TierIdentifier, TierIdentity};
/// use http::request::Parts;
///
/// struct FromDatabase;
///
/// #[async_trait::async_trait]
/// impl TierIdentifier for FromDatabase {
///     async fn identify(&self, parts: &Parts) -> Option<TierIdentity> {
///         let key = parts.headers.get("x-api-key")?.to_str().ok()?;
///         // let plan = db.plan_of(key).await?;
///         let plan = if key.starts_with("pro_") { "pro" } else { "free" };
///         Some(TierIdentity::new(key, plan))
///     }
/// }
/// ```
#[async_trait::async_trait]
pub trait TierIdentifier: Send + Sync + 'static {
    /// The identity of the request, or `None` if it has none.
    async fn identify(&self, parts: &Parts) -> Option<TierIdentity>;
}

#[async_trait::async_trait]
impl<T: TierIdentifier + ?Sized> TierIdentifier for Arc<T> {
    async fn identify(&self, parts: &Parts) -> Option<TierIdentity> {
        (**self).identify(parts).await
    }
}
