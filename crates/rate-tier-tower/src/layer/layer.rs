use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use http::HeaderMap;
use http::request::Parts;
use rate_tier_storage::RuleKind;
use tower_layer::Layer;

use super::config::{Config, Identifier};
use super::refusal::HttpRefusal;
use super::service::TierLimit;
use crate::error::ConfigError;
use crate::event::LimitEvent;
use crate::headers::HeaderStyle;
use crate::identity::{TierIdentifier, TierIdentity};
use crate::limit::Limit;
use crate::limiter::RateTier;
use crate::observe::Observer;

/// Applies a [`RateTier`] to every request of the wrapped service: its tier,
/// and any [`Limit`]s of its own, as one decision per request.
///
/// Cheap to clone; every service it makes shares the limiter's state, so a
/// limit holds across clones, connections and threads. `R` is how a refusal
/// is answered: an HTTP response (the default), or a gRPC status
/// (`TierLimitLayer::grpc`, feature `grpc`).
///
/// ```
/// use axum::{Router, routing::get};
/// use tower_rate_tier::{Limit, Quota, RateTier, TierIdentity, TierLimitLayer};
///
/// // In a real service this is a database lookup (see TierIdentifier).
/// fn plan_of(key: &str) -> Option<&'static str> {
///     match key {
///         "key_ana" => Some("free"),
///         "key_bea" => Some("pro"),
///         _ => None,
///     }
/// }
///
/// let tiers = RateTier::builder()
///     .tier("free", Quota::per_minute(10))
///     .tier("pro", Quota::per_minute(100))
///     .default_tier("free")
///     .build();
/// let layer = TierLimitLayer::new(tiers)
///     .identifier_fn(|headers| {
///         let key = headers.get("x-api-key")?.to_str().ok()?;
///         Some(TierIdentity::new(key, plan_of(key)?))
///     })
///     .cost_fn(|req| if req.uri.path() == "/report" { 5 } else { 1 })
///     .limit(Limit::new("search", Quota::per_minute(3)).when(|req| req.uri.path() == "/search"));
/// let app: Router = Router::new().route("/data", get(|| async { "data" })).layer(layer);
/// ```
#[must_use]
pub struct TierLimitLayer<R = HttpRefusal> {
    pub(crate) config: Arc<Config>,
    refusal: PhantomData<fn() -> R>,
}

impl<R> Clone for TierLimitLayer<R> {
    fn clone(&self) -> Self {
        TierLimitLayer {
            config: self.config.clone(),
            refusal: PhantomData,
        }
    }
}

impl<R> fmt::Debug for TierLimitLayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = &*self.config;
        let identifier = match config.identifier {
            Identifier::None => "none",
            Identifier::Headers(_) => "headers fn",
            Identifier::Async(_) => "TierIdentifier",
        };
        f.debug_struct("TierLimitLayer")
            .field("tiers", &config.tiers)
            .field("identifier", &identifier)
            .field("cost_fn", &config.cost.is_some())
            .field("limits", &config.limits)
            .field("shadow", &config.shadow)
            .field("on_event", &config.on_event.is_some())
            .field("headers", &config.headers)
            .finish()
    }
}

impl TierLimitLayer {
    /// A layer over `tiers`. Until an identifier is set every request is
    /// anonymous, and every request costs 1.
    pub fn new(tiers: RateTier) -> Self {
        TierLimitLayer {
            config: Arc::new(Config {
                tiers,
                identifier: Identifier::None,
                cost: None,
                limits: Vec::new(),
                kept_limits: None,
                peek: None,
                shadow: false,
                on_event: None,
                observer: None,
                headers: HeaderStyle::default(),
            }),
            refusal: PhantomData,
        }
    }
}

impl<R> TierLimitLayer<R> {
    /// The same layer, answering refusals as `A` does.
    #[cfg_attr(not(feature = "grpc"), allow(dead_code))]
    pub(super) fn answering<A>(self) -> TierLimitLayer<A> {
        TierLimitLayer {
            config: self.config,
            refusal: PhantomData,
        }
    }

    fn map(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// Identifies requests from their headers: `None` means no identity.
    /// The identity may borrow the headers: a rule that reads a key and
    /// maps it to a `&'static` tier name allocates nothing.
    pub fn identifier_fn<F>(self, identify: F) -> Self
    where
        F: for<'h> Fn(&'h HeaderMap) -> Option<TierIdentity<'h>>
            + Send
            + Sync
            + 'static,
    {
        self.map(|c| c.identifier = Identifier::Headers(Arc::new(identify)))
    }

    /// Identifies requests with an async [`TierIdentifier`] (a database
    /// lookup); see
    #[cfg_attr(
        feature = "identity-cache",
        doc = "[`CachedIdentifier`](crate::CachedIdentifier)"
    )]
    #[cfg_attr(
        not(feature = "identity-cache"),
        doc = "`CachedIdentifier` (feature `identity-cache`)"
    )]
    /// to cache it. A failed lookup follows the
    /// [`OnIdentityError`](crate::policy::OnIdentityError) policy.
    pub fn identifier(self, identifier: impl TierIdentifier) -> Self {
        self.map(|c| c.identifier = Identifier::Async(Arc::new(identifier)))
    }

    /// The tier's cost of each request (default 1). It runs inside this
    /// middleware, before the check. A cost of 0 is a bug in the function:
    /// the request is answered 500 and [`LimitEvent::InvalidCost`] is
    /// reported.
    pub fn cost_fn<F>(self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.map(|c| c.cost = Some(Arc::new(cost)))
    }

    /// Adds a limit of its own (per endpoint, per address, global...): a
    /// request is decided against its tier and every limit that applies to
    /// it, all or nothing. See [`Limit`].
    ///
    /// # Panics
    ///
    /// On any error of [`TierLimitLayer::try_limit`] (the limit has the
    /// name of another limit of this layer, is of a kind the store does not
    /// decide, ...): use it for a `Result`.
    #[track_caller]
    pub fn limit(self, limit: Limit) -> Self {
        match self.try_limit(limit) {
            Ok(layer) => layer,
            Err(error) => panic!("invalid limit: {error}"),
        }
    }

    /// Like [`TierLimitLayer::limit`], with a typed error: two limits of
    /// one layer with one name would share buckets. (A limit and a tier may
    /// share a name: their buckets never meet.) A limit of a kind the store
    /// does not decide is [`ConfigError::UnsupportedKind`]; on a Redis
    /// Cluster, windows, periods or concurrency limits that could meet in
    /// one request in two partitions (a global or keyed one beside another
    /// of the tier's or the layer's) are
    /// [`ConfigError::KindsInTwoPartitions`].
    ///
    /// ```
    /// use tower_rate_tier::{ConfigError, Limit, Quota, RateTier, TierLimitLayer};
    /// let tiers = RateTier::builder().tier("free", Quota::per_minute(10)).build();
    /// let err = TierLimitLayer::new(tiers)
    ///     .limit(Limit::new("search", Quota::per_minute(3)))
    ///     .try_limit(Limit::new("search", Quota::per_minute(5)))
    ///     .unwrap_err();
    /// assert_eq!(err, ConfigError::DuplicateLimit("search".into()));
    /// ```
    pub fn try_limit(self, limit: Limit) -> Result<Self, ConfigError> {
        let config = &self.config;
        let taken = config.limits.iter().any(|l| l.name == limit.name);
        if taken {
            return Err(ConfigError::DuplicateLimit(limit.name.to_owned()));
        }
        let store = config.tiers.storage();
        for kind in limit.kinds() {
            if limit.settle.is_some() && kind != RuleKind::Rate {
                return Err(ConfigError::SettleNeedsRate {
                    limit: limit.name.to_owned(),
                    kind,
                });
            }
            crate::limiter::decided_by(store, limit.name, kind)?;
        }
        let mut limits = config.limits.clone();
        limits.push(limit);
        let kept = config.tiers.admit_limits(&limits)?;
        Ok(self.map(|c| {
            c.limits = limits;
            c.kept_limits = kept;
        }))
    }

    /// Requests for which `peek` holds read every limit (the tier's and
    /// each [`Limit`]'s, whatever their [`Limit::when`]) without charging
    /// any: their [`RateLimitInfo`](crate::RateLimitInfo), in the
    /// request's extensions, lists them all (e.g. for a `/quota` route).
    pub fn peek_when<F>(self, peek: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.map(|c| c.peek = Some(Arc::new(peek)))
    }

    /// Shadow mode for everything: every decision is made, counted
    /// (`outcome="shadow_limited"`) and reported
    /// ([`LimitEvent::ShadowLimited`]), and nothing is refused for its
    /// quota, not even a cost above the burst (reported as shadow limited).
    /// A missing identity or a failed store are still answered by their
    /// policies: they are not rates.
    pub fn shadow(self, shadow: bool) -> Self {
        self.map(|c| c.shadow = shadow)
    }

    /// Called with the [`LimitEvent`]s of this layer's requests,
    /// synchronously on the request path: keep it short (log, count, send
    /// to a channel). Events that come from no request (the store's, a
    /// reload) are heard on the limiter:
    /// [`RateTierBuilder::on_event`](crate::RateTierBuilder::on_event).
    pub fn on_event<F>(self, on_event: F) -> Self
    where
        F: Fn(&LimitEvent) + Send + Sync + 'static,
    {
        self.map(|c| c.on_event = Some(Arc::new(on_event)))
    }

    /// Reports every check of this layer, its outcome and latency, and its
    /// requests' events, to `observer`. To see every layer's checks and
    /// the store's events once, observe the limiter instead
    /// ([`RateTierBuilder::observe`](crate::RateTierBuilder::observe)).
    pub fn observe(self, observer: impl Observer) -> Self {
        let observer: Arc<dyn Observer> = Arc::new(observer);
        self.map(|c| c.observer = Some(observer))
    }

    /// Which rate-limit headers responses carry (default: 0.3's
    /// `x-ratelimit-*`). See [`HeaderStyle`] for the IETF fields.
    pub fn headers(self, style: HeaderStyle) -> Self {
        self.map(|c| c.headers = style)
    }

    /// The limiter this layer applies.
    pub fn tiers(&self) -> &RateTier {
        &self.config.tiers
    }
}

impl<S, R> Layer<S> for TierLimitLayer<R> {
    type Service = TierLimit<S, R>;

    fn layer(&self, inner: S) -> Self::Service {
        TierLimit::new(inner, self.config.clone())
    }
}
