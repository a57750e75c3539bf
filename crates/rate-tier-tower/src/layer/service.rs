use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::LimitBody;
use super::config::Config;
use super::cost::{RouteCost, TierCost, TierCostLayer};
use super::future::{Decision, ResponseFuture};
use super::judge::Now;
use super::refusal::{HttpRefusal, Refusal};
use crate::limiter::ask::Ask;

/// The service made by [`TierLimitLayer`](super::TierLimitLayer): one
/// service for every protocol, `R` saying how a refusal is answered.
///
/// Clones share the limiter: the limit holds across every clone. A refused
/// request never reaches the inner service, and the inner service's error
/// passes through untouched: a refusal is a response, never an error.
///
/// When the identity comes from the headers and the store decides in
/// process (the memory store, or a fallback whose breaker is open), the
/// request is decided in `call`, with no allocation; an async identifier or
/// a remote store decide in a boxed future, which is also the only case
/// where the inner service is cloned.
pub struct TierLimit<S, R = HttpRefusal> {
    inner: S,
    config: Arc<Config>,
    refusal: PhantomData<fn() -> R>,
}

impl<S, R> TierLimit<S, R> {
    pub(super) fn new(inner: S, config: Arc<Config>) -> Self {
        TierLimit {
            inner,
            config,
            refusal: PhantomData,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, R> Clone for TierLimit<S, R> {
    fn clone(&self) -> Self {
        TierLimit::new(self.inner.clone(), self.config.clone())
    }
}

impl<S: fmt::Debug, R> fmt::Debug for TierLimit<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierLimit")
            .field("inner", &self.inner)
            .field("tiers", &self.config.tiers)
            .finish_non_exhaustive()
    }
}

impl<S, R, ReqBody, ResBody> Service<Request<ReqBody>> for TierLimit<S, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: http_body::Body,
    R: Refusal<ResBody>,
{
    type Response = Response<LimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, ResBody, R>;

    fn poll_ready(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        // A route's cost is this limiter's alone: a limiter nested inside
        // must not charge it again.
        let route_cost = request.extensions_mut().remove::<RouteCost>();
        let config = &self.config;
        // The common case: decided from the headers, the request passed on
        // whole (not taken apart and put back together).
        let quick = config.quick(request.headers(), route_cost).map(
            |(identity, cost)| {
                let ask = Ask::plan(identity.user(), identity.tier(), cost)
                    .with_quotas(identity.quotas());
                config.judge(&ask, config.events(), None, None)
            },
        );
        if let Some(now) = quick {
            return self.go_on(now, request, route_cost);
        }
        let (parts, body) = request.into_parts();
        let now = config.judge_parts(&parts, route_cost);
        self.go_on(now, Request::from_parts(parts, body), route_cost)
    }
}

impl<S, R> TierLimit<S, R> {
    /// What follows what `call` could decide: the inner service called, a
    /// refusal answered, or the decision awaited.
    #[inline(always)]
    fn go_on<ReqBody, ResBody>(
        &mut self,
        now: Now,
        mut request: Request<ReqBody>,
        route_cost: Option<RouteCost>,
    ) -> ResponseFuture<S, ReqBody, ResBody, R>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
        ResBody: http_body::Body,
        R: Refusal<ResBody>,
    {
        let style = self.config.headers;
        let decision = match now {
            Now::Judged(judgement) => {
                return match judgement.respond::<R, ResBody>(
                    &self.config,
                    request.extensions_mut(),
                ) {
                    Ok(after) => ResponseFuture::calling(
                        style,
                        self.inner.call(request),
                        after,
                    ),
                    Err(refusal) => ResponseFuture::answered(style, refusal),
                };
            }
            Now::Deciding(decision) => Decision::Store(decision),
            Now::Identify => {
                let (parts, body) = request.into_parts();
                let config = self.config.clone();
                let decision = config.identify(parts, route_cost);
                return self.deciding(Decision::Identify(decision), None, body);
            }
        };
        let (parts, body) = request.into_parts();
        self.deciding(decision, Some(parts), body)
    }

    fn deciding<ReqBody, ResBody>(
        &mut self,
        decision: Decision,
        parts: Option<http::request::Parts>,
        body: ReqBody,
    ) -> ResponseFuture<S, ReqBody, ResBody, R>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
        ResBody: http_body::Body,
        R: Refusal<ResBody>,
    {
        // The clone is not ready; the one that was polled ready is taken.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::deciding(
            self.config.clone(),
            decision,
            inner,
            parts,
            body,
        )
    }
}

// Here, beside the service it wraps: a cost layer wraps a limiter only.
impl<S, R> tower_layer::Layer<TierLimit<S, R>> for TierCostLayer {
    type Service = TierCost<TierLimit<S, R>>;

    fn layer(&self, inner: TierLimit<S, R>) -> Self::Service {
        self.wrap(inner)
    }
}
