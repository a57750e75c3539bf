//! Who is asking, and on which tier; and how their id stays out of logs.

use std::borrow::Cow;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::{Arc, LazyLock};

use http::request::Parts;
use rate_tier_storage::Rule;

/// A user id and the tier (the customer's plan) it is on, as found in a request.
///
/// It borrows what it can (a header's value, a `&'static` tier name), so a
/// header rule allocates nothing. An empty user id counts as no identity.
/// Its `Debug` output never shows the user id: see [`UserId`].
///
/// ```
/// use tower_rate_tier::TierIdentity;
/// let who = TierIdentity::new("key_ana", "free");
/// assert_eq!((who.user(), who.tier()), ("key_ana", "free"));
/// assert!(!format!("{who:?}").contains("key_ana"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct TierIdentity<'a> {
    user: Cow<'a, str>,
    tier: Cow<'a, str>,
    /// The customer's own quotas, by tier or limit name.
    quotas: Option<Arc<[OwnQuota]>>,
}

/// A customer's own quota for a tier or a named [`Limit`](crate::Limit):
/// what [`TierIdentity::with_quota`] keeps.
pub type OwnQuota = (Cow<'static, str>, Rule);

impl std::hash::Hash for TierIdentity<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // Equal identities have equal ids and tiers: enough for a hash.
        self.user.hash(state);
        self.tier.hash(state);
    }
}

impl<'a> TierIdentity<'a> {
    /// `user` on `tier`.
    pub fn new(
        user: impl Into<Cow<'a, str>>,
        tier: impl Into<Cow<'a, str>>,
    ) -> Self {
        TierIdentity {
            user: user.into(),
            tier: tier.into(),
            quotas: None,
        }
    }

    /// The same identity, with the customer's own quota for the tier or
    /// the [`Limit`](crate::Limit) named `name` (the one they negotiated:
    /// 500 a minute on "pro"): it replaces the tier's or the limit's rule
    /// for this customer only, in their own bucket, so a changed quota
    /// keeps what they spent, as a reload does. A quota of another kind
    /// than the rule it replaces (a window for a rate) is refused at
    /// request time (500, [`Error::OwnQuota`](crate::Error::OwnQuota)),
    /// never unlimited. Metrics still label the request by its tier.
    ///
    /// It comes from where the tier comes from (the header function, the
    /// async lookup, cached by
    #[cfg_attr(
        feature = "identity-cache",
        doc = "[`CachedIdentifier`](crate::CachedIdentifier)"
    )]
    #[cfg_attr(
        not(feature = "identity-cache"),
        doc = "`CachedIdentifier` (feature `identity-cache`)"
    )]
    /// with it): no second store.
    ///
    /// ```
    /// use tower_rate_tier::{Quota, TierIdentity};
    /// let ada = TierIdentity::new("key_ada", "pro").with_quota("pro", Quota::per_minute(500));
    /// assert_eq!(ada.quota("pro"), Some(Quota::per_minute(500).into()));
    /// assert_eq!(ada.quota("search"), None);
    /// ```
    pub fn with_quota(
        mut self,
        name: impl Into<Cow<'static, str>>,
        rule: impl Into<Rule>,
    ) -> Self {
        let name = name.into();
        let rule = rule.into();
        let mut quotas: Vec<OwnQuota> = self
            .quotas
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|(n, _)| *n != name)
            .cloned()
            .collect();
        quotas.push((name, rule));
        self.quotas = Some(quotas.into());
        self
    }

    /// The customer's own quota for the tier or limit `name`, if any.
    pub fn quota(&self, name: &str) -> Option<Rule> {
        self.quotas()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, rule)| *rule)
    }

    /// Every own quota of the customer.
    pub fn quotas(&self) -> &[OwnQuota] {
        self.quotas.as_deref().unwrap_or_default()
    }

    /// The user id: an API key, an account id, a token subject.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The tier name, as the request's owner is on it.
    pub fn tier(&self) -> &str {
        &self.tier
    }

    /// The same identity, owning its strings (to keep or send elsewhere).
    pub fn into_owned(self) -> TierIdentity<'static> {
        TierIdentity {
            user: Cow::Owned(self.user.into_owned()),
            tier: Cow::Owned(self.tier.into_owned()),
            quotas: self.quotas,
        }
    }
}

impl fmt::Debug for TierIdentity<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierIdentity")
            .field("user", &Redacted(&self.user))
            .field("tier", &self.tier)
            .field("quotas", &self.quotas())
            .finish()
    }
}

/// A user id in an event: `Debug` shows a short keyed hash, never the id.
///
/// A typical `on_event(|e| tracing::info!(?e))` logs `UserId(#3fa2c1d0)`:
/// the same user gets the same tag within a process (so log lines can be
/// followed), and the tag cannot be turned back into the id (the key is
/// random per process). The id itself is only where code asks for it:
/// [`UserId::as_str`], or `Display` (`{user_id}`), which prints it in
/// clear, as the 0.3 example's `eprintln!("... for {user_id}")` does.
///
/// ```
/// use tower_rate_tier::UserId;
/// let id = UserId::from("key_ana");
/// let logged = format!("{id:?}");
/// assert!(logged.starts_with("UserId(#") && !logged.contains("key_ana"));
/// assert_eq!(id.as_str(), "key_ana");
/// assert_eq!(format!("{id}"), "key_ana"); // explicit: the id in clear
/// assert_eq!(id.redacted(), UserId::from("key_ana").redacted());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UserId(Arc<str>);

impl UserId {
    /// The id in clear.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The tag `Debug` shows, e.g. `#3fa2c1d0`.
    pub fn redacted(&self) -> String {
        Redacted(&self.0).to_string()
    }
}

impl From<&str> for UserId {
    fn from(id: &str) -> Self {
        UserId(id.into())
    }
}

impl fmt::Debug for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserId({})", Redacted(&self.0))
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `#` and 32 bits of a keyed hash of the id (the key random per process).
struct Redacted<'a>(&'a str);

impl fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        static KEY: LazyLock<std::collections::hash_map::RandomState> =
            LazyLock::new(Default::default);
        let tag = KEY.hash_one(self.0) as u32;
        write!(f, "#{tag:08x}")
    }
}

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why an identity lookup failed: its source is down or answered nonsense.
/// Not "no identity" (that is `Ok(None)`): the
/// [`OnIdentityError`](crate::policy::OnIdentityError) policy applies.
///
/// ```
/// use tower_rate_tier::IdentityError;
/// let error = IdentityError::new(std::io::Error::other("database down"));
/// assert_eq!(error.to_string(), "identity lookup failed: database down");
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[error("identity lookup failed: {0}")]
pub struct IdentityError(Arc<dyn std::error::Error + Send + Sync>);

impl IdentityError {
    /// An identity lookup failed because of `source`.
    pub fn new(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        IdentityError(Arc::new(source))
    }
}

/// Finds the identity of a request, possibly asynchronously (a database
/// lookup, a token introspection).
///
/// `Ok(None)` means "no identity": the limiter's
/// [`OnMissing`](crate::OnMissing) policy applies. `Err` means the lookup
/// failed (the database is down): the
/// [`OnIdentityError`](crate::policy::OnIdentityError) policy applies, failing
/// closed by default. For a synchronous rule over the headers,
/// [`TierLimitLayer::identifier_fn`](crate::TierLimitLayer::identifier_fn)
/// is shorter.
///
/// ```
/// use tower_rate_tier::{IdentityError, TierIdentifier, TierIdentity};
/// use http::request::Parts;
///
/// struct FromDatabase;
///
/// impl FromDatabase {
///     async fn plan_of(&self, key: &str) -> Result<Option<&'static str>, std::io::Error> {
///         Ok((key == "key_ana").then_some("free")) // a query, in a real service
///     }
/// }
///
/// #[async_trait::async_trait]
/// impl TierIdentifier for FromDatabase {
///     async fn identify(
///         &self,
///         parts: &Parts,
///     ) -> Result<Option<TierIdentity<'static>>, IdentityError> {
///         let Some(key) = parts.headers.get("x-api-key").and_then(|v| v.to_str().ok()) else {
///             return Ok(None);
///         };
///         let tier = self.plan_of(key).await.map_err(IdentityError::new)?;
///         Ok(tier.map(|tier| TierIdentity::new(key.to_owned(), tier)))
///     }
/// }
/// ```
#[async_trait::async_trait]
pub trait TierIdentifier: Send + Sync + 'static {
    /// The identity of the request, `Ok(None)` if it has none, or the
    /// failure of the lookup.
    async fn identify(
        &self,
        parts: &Parts,
    ) -> Result<Option<TierIdentity<'static>>, IdentityError>;
}

#[async_trait::async_trait]
impl<T: TierIdentifier + ?Sized> TierIdentifier for Arc<T> {
    async fn identify(
        &self,
        parts: &Parts,
    ) -> Result<Option<TierIdentity<'static>>, IdentityError> {
        (**self).identify(parts).await
    }
}
