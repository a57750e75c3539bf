//! Per-route cost as a layer, and the ordering trap it must not fall into.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use super::response;
use crate::RateLimitInfo;

/// The cost a [`tier_cost`] layer put on a request. A [`TierLimit`](super::TierLimit)
/// that finds it uses it instead of its cost function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteCost(pub u32);

/// A layer that charges `cost` for the requests it wraps.
///
/// It must run **before** the limiter, i.e. wrap it. In axum, a layer on a
/// route (`get(h).layer(...)`) runs *after* a limiter added with
/// `Router::layer`, so the cost would arrive too late and every request
/// would silently cost 1 (the bug of tower-rate-tier 0.2). This layer makes
/// that mistake loud: when it finds the limiter has already charged the
/// request, it answers 500 with a message saying so, instead of serving a
/// request charged the wrong cost. Put the limiter on the route, inside it
/// (`tier_cost` first in a `ServiceBuilder`), or use
/// [`TierLimitLayer::cost_fn`](super::TierLimitLayer::cost_fn).
///
/// ```
/// use axum::{Router, routing::get};
/// use tower::ServiceBuilder;
/// use tower_rate_tier::{Quota, RateTier, TierLimitLayer, tier_cost};
///
/// let tiers = RateTier::builder()
///     .tier("free", Quota::per_minute(10))
///     .default_tier("free")
///     .build();
/// let limiter = TierLimitLayer::new(tiers);
/// let app: Router = Router::new().route(
///     "/report",
///     get(|| async { "report" })
///         .layer(ServiceBuilder::new().layer(tier_cost(5)).layer(limiter)),
/// );
/// ```
pub fn tier_cost(cost: u32) -> TierCostLayer {
    TierCostLayer { cost }
}

/// The layer of [`tier_cost`].
#[derive(Debug, Clone, Copy)]
pub struct TierCostLayer {
    cost: u32,
}

impl<S> Layer<S> for TierCostLayer {
    type Service = TierCost<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TierCost {
            inner,
            cost: self.cost,
        }
    }
}

/// The service of [`tier_cost`].
#[derive(Debug, Clone)]
pub struct TierCost<S> {
    inner: S,
    cost: u32,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for TierCost<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: From<String> + Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<
        Box<dyn Future<Output = Result<Response<ResBody>, S::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let charged = request.extensions().get::<RateLimitInfo>();
        if charged.is_some_and(|info| info.cost != self.cost) {
            let message = "tier_cost() runs after the rate limiter, so its \
                           cost was ignored: wrap the limiter with it, or \
                           use TierLimitLayer::cost_fn";
            return Box::pin(std::future::ready(Ok(response::error(
                StatusCode::INTERNAL_SERVER_ERROR,
                message,
            ))));
        }
        request.extensions_mut().insert(RouteCost(self.cost));
        Box::pin(self.inner.call(request))
    }
}
