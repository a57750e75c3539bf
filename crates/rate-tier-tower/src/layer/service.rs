use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::body::LimitBody;
use super::cost::RouteCost;
use super::future::{After, ResponseFuture};
use super::judge::{Now, Quick};
use super::layer::Config;
use super::refusal::{HttpRefusal, Refusal, Refused};

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
        // The common case: decided from the headers, the request passed on
        // whole (not taken apart and put back together).
        let style = self.config.headers;
        if let Some(quick) =
            self.config.judge_quick(request.headers(), route_cost)
        {
            let judgement = match quick {
                Quick::Passed(info) => {
                    request.extensions_mut().insert(info.clone());
                    let future = self.inner.call(request);
                    let after = After {
                        info: Some(info),
                        settle: None,
                    };
                    return ResponseFuture::calling(style, future, after);
                }
                Quick::Refused(limited) => {
                    let response = R::refuse(Refused::Limited(&limited), style);
                    return ResponseFuture::answered(style, response);
                }
                Quick::Ruled(judgement) => judgement,
            };
            let (parts, body) = request.into_parts();
            return match judgement.respond::<R, ResBody>(&self.config, parts) {
                Ok((parts, after)) => {
                    let future =
                        self.inner.call(Request::from_parts(parts, body));
                    ResponseFuture::calling(style, future, after)
                }
                Err(refusal) => ResponseFuture::answered(style, refusal),
            };
        }
        let (parts, body) = request.into_parts();
        let config = self.config.clone();
        let (decision, parts) = match config.judge_now(&parts, route_cost) {
            Now::Judged(judgement) => {
                return match judgement.respond::<R, ResBody>(&config, parts) {
                    Ok((parts, after)) => {
                        let future =
                            self.inner.call(Request::from_parts(parts, body));
                        ResponseFuture::calling(style, future, after)
                    }
                    Err(refusal) => ResponseFuture::answered(style, refusal),
                };
            }
            Now::Remote(prepared, pending) => {
                (config.clone().remote(prepared, pending), Some(parts))
            }
            Now::Identify => (config.clone().identify(parts, route_cost), None),
        };
        // The clone is not ready; the one that was polled ready is taken.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::deciding(config, decision, inner, parts, body)
    }
}
