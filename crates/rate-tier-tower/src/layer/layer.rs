use std::fmt;
use std::sync::Arc;

use http::HeaderMap;
use http::request::Parts;
use tower_layer::Layer;

use super::{HeaderStyle, TierLimit};
use crate::{LimitEvent, Observer, RateTier, TierIdentifier, TierIdentity};

type IdentifyFn = dyn Fn(&HeaderMap) -> Option<TierIdentity> + Send + Sync;
type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;
type EventFn = dyn Fn(&LimitEvent) + Send + Sync;

#[derive(Clone)]
pub(crate) enum Identifier {
    /// No identifier configured: every request is anonymous.
    None,
    Headers(Arc<IdentifyFn>),
    Async(Arc<dyn TierIdentifier>),
}

/// Applies a [`RateTier`] to every request of the wrapped service.
///
/// Cheap to clone; every service it makes shares the limiter's state, so a
/// limit holds across clones, connections and threads.
///
/// ```
/// use axum::{Router, routing::get};
/// use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
///
/// let tiers = RateTier::builder()
///     .tier("free", Quota::per_minute(10))
///     .tier("pro", Quota::per_minute(100))
///     .default_tier("free")
///     .build();
/// let layer = TierLimitLayer::new(tiers)
///     .identifier_fn(|headers| {
///         let key = headers.get("x-api-key")?.to_str().ok()?;
///         let plan = if key.starts_with("pro_") { "pro" } else { "free" };
///         Some(TierIdentity::new(key, plan))
///     })
///     .cost_fn(|req| if req.uri.path() == "/report" { 5 } else { 1 });
/// let app: Router = Router::new().route("/data", get(|| async { "data" })).layer(layer);
/// ```
#[derive(Clone)]
#[must_use]
pub struct TierLimitLayer {
    pub(crate) config: Arc<Config>,
}

pub(crate) struct Config {
    pub(crate) tiers: RateTier,
    pub(crate) identifier: Identifier,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) on_event: Option<Arc<EventFn>>,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    pub(crate) headers: HeaderStyle,
}

impl Clone for Config {
    fn clone(&self) -> Self {
        Config {
            tiers: self.tiers.clone(),
            identifier: self.identifier.clone(),
            cost: self.cost.clone(),
            on_event: self.on_event.clone(),
            observer: self.observer.clone(),
            headers: self.headers,
        }
    }
}

impl fmt::Debug for TierLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let identifier = match self.config.identifier {
            Identifier::None => "none",
            Identifier::Headers(_) => "headers fn",
            Identifier::Async(_) => "TierIdentifier",
        };
        f.debug_struct("TierLimitLayer")
            .field("tiers", &self.config.tiers)
            .field("identifier", &identifier)
            .field("cost_fn", &self.config.cost.is_some())
            .field("on_event", &self.config.on_event.is_some())
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
                on_event: None,
                observer: None,
                headers: HeaderStyle::default(),
            }),
        }
    }

    fn map(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// Identifies requests from their headers: `None` means no identity.
    pub fn identifier_fn<F>(self, identify: F) -> Self
    where
        F: Fn(&HeaderMap) -> Option<TierIdentity> + Send + Sync + 'static,
    {
        self.map(|c| c.identifier = Identifier::Headers(Arc::new(identify)))
    }

    /// Identifies requests with an async [`TierIdentifier`] (a database
    /// lookup); see [`CachedIdentifier`](crate::CachedIdentifier) to cache it.
    pub fn identifier(self, identifier: impl TierIdentifier) -> Self {
        self.map(|c| c.identifier = Identifier::Async(Arc::new(identifier)))
    }

    /// The cost of each request (default 1). It runs inside this middleware,
    /// before the check. A cost of 0 is a bug in the function: the request is
    /// answered 500 and [`LimitEvent::InvalidCost`] is reported.
    pub fn cost_fn<F>(self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.map(|c| c.cost = Some(Arc::new(cost)))
    }

    /// Called with every [`LimitEvent`], synchronously on the request path:
    /// keep it short (log, count, send to a channel). Events of the store
    /// (a circuit breaker, fallback decisions) arrive as
    /// [`LimitEvent::Storage`], and reloads as
    /// [`LimitEvent::PlansReloaded`]. Those come from the store and the
    /// limiter, not from a request: each layer that calls `on_event`
    /// registers with them, so build the layer once and clone it (clones
    /// share one registration) rather than building several over one
    /// [`RateTier`], or each will receive them.
    pub fn on_event<F>(self, on_event: F) -> Self
    where
        F: Fn(&LimitEvent) + Send + Sync + 'static,
    {
        let on_event: Arc<EventFn> = Arc::new(on_event);
        self.config.tiers.subscribe(None, on_event.clone());
        self.map(|c| c.on_event = Some(on_event))
    }

    /// Reports every check's outcome and latency, and every event, to
    /// `observer` (metrics). The store's and the limiter's own events reach
    /// an observer once, however many layers it observes, if its
    /// [`Observer::key`] says who it is (as `RateLimitMetrics` does).
    pub fn observe(self, observer: impl Observer) -> Self {
        let key = observer.key();
        let observer: Arc<dyn Observer> = Arc::new(observer);
        let forward = observer.clone();
        self.config
            .tiers
            .subscribe(key, Arc::new(move |event| forward.event(event)));
        self.map(|c| c.observer = Some(observer))
    }

    /// Which rate-limit headers responses carry (default: the post's
    /// `x-ratelimit-*`). See [`HeaderStyle`] for the IETF fields.
    pub fn headers(self, style: HeaderStyle) -> Self {
        self.map(|c| c.headers = style)
    }

    /// The limiter this layer applies.
    pub fn tiers(&self) -> &RateTier {
        &self.config.tiers
    }
}

impl<S> Layer<S> for TierLimitLayer {
    type Service = TierLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TierLimit {
            inner,
            config: self.config.clone(),
        }
    }
}
