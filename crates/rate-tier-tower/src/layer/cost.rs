//! Per-route cost as a layer that can only wrap a limiter.

use std::task::{Context, Poll};

use http::Request;
use tower_service::Service;

/// The cost a [`tier_cost`] layer put on a request, for the limiter it
/// wraps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteCost(pub u32);

/// A layer that makes the limiter it wraps charge `cost` for the tier.
///
/// It only wraps a [`TierLimit`](super::TierLimit): placed anywhere else it does not compile.
/// That is on purpose. In axum, a layer on a route (`get(h).layer(...)`)
/// runs *after* a limiter added with `Router::layer`, so a cost set there
/// would arrive too late and every request would silently cost 1 (the bug of
/// tower-rate-tier 0.2). Put a limiter on the route and `tier_cost` over it
/// (nesting under a tier-wide layer works: each limiter charges its own
/// buckets), or give the cost in
/// [`TierLimitLayer::cost_fn`](super::TierLimitLayer::cost_fn) or a
/// [`Limit`](crate::Limit) of the tier-wide layer.
///
/// ```
/// use axum::{Router, routing::get};
/// use tower::ServiceBuilder;
/// use tower_rate_tier::{Quota, RateTier, TierLimitLayer, tier_cost};
///
/// let reports = RateTier::builder()
///     .tier("free", Quota::per_minute(10))
///     .default_tier("free")
///     .build();
/// let app: Router = Router::new().route(
///     "/report",
///     get(|| async { "report" })
///         .layer(ServiceBuilder::new().layer(tier_cost(5)).layer(TierLimitLayer::new(reports))),
/// );
/// ```
///
/// Over anything but a limiter, it does not compile:
///
/// ```compile_fail
/// use axum::{Router, routing::get};
/// use tower_rate_tier::tier_cost;
/// let app: Router = Router::new().route("/report", get(|| async { "report" }).layer(tier_cost(5)));
/// ```
pub fn tier_cost(cost: u32) -> TierCostLayer {
    TierCostLayer { cost }
}

/// The layer of [`tier_cost`].
#[derive(Debug, Clone, Copy)]
pub struct TierCostLayer {
    cost: u32,
}

impl TierCostLayer {
    /// `inner`, charging this layer's cost.
    pub(super) fn wrap<S>(&self, inner: S) -> TierCost<S> {
        TierCost {
            inner,
            cost: self.cost,
        }
    }
}

/// The service of [`tier_cost`]: its limiter, charging its cost.
#[derive(Debug, Clone)]
pub struct TierCost<S> {
    inner: S,
    cost: u32,
}

impl<S, ReqBody> Service<Request<ReqBody>> for TierCost<S>
where
    S: Service<Request<ReqBody>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        request.extensions_mut().insert(RouteCost(self.cost));
        self.inner.call(request)
    }
}
