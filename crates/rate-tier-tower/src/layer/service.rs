use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use tower_service::Service;

use super::HeaderStyle;
use super::layer::Config;
use super::response;
use crate::tier::Verdict;

/// The service made by [`TierLimitLayer`](super::TierLimitLayer).
///
/// Clones share the limiter: the limit holds across every clone.
pub struct TierLimit<S> {
    pub(super) inner: S,
    pub(super) config: Arc<Config>,
}

impl<S: Clone> Clone for TierLimit<S> {
    fn clone(&self) -> Self {
        TierLimit {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for TierLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierLimit")
            .field("inner", &self.inner)
            .field("tiers", &self.config.tiers)
            .finish_non_exhaustive()
    }
}

pub(super) type BoxFuture<T> =
    Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for TierLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone is not ready; the one that was polled ready is taken.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        Box::pin(limit_then_call(config, inner, request, http_refusal))
    }
}

/// The body of every protocol's service: judge the request; if it passes,
/// call `inner` and add the rate-limit headers to its response; if not,
/// answer with `refuse` and never call `inner`.
pub(super) async fn limit_then_call<S, ReqBody, ResBody>(
    config: Arc<Config>,
    mut inner: S,
    request: Request<ReqBody>,
    refuse: fn(Verdict, HeaderStyle) -> Response<ResBody>,
) -> Result<Response<ResBody>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    let (mut parts, body) = request.into_parts();
    match config.judge(&parts).await {
        Verdict::Allowed(info) => {
            parts.extensions.insert(info.clone());
            let mut response =
                inner.call(Request::from_parts(parts, body)).await?;
            // Also on an error response of the inner service (a gRPC
            // trailers-only status), which is left as it is.
            response::insert_info_headers_with(
                response.headers_mut(),
                &info,
                config.headers,
            );
            Ok(response)
        }
        Verdict::Unlimited => {
            inner.call(Request::from_parts(parts, body)).await
        }
        refused => Ok(refuse(refused, config.headers)),
    }
}

/// The HTTP answer to a refused request.
fn http_refusal<B: From<String>>(
    verdict: Verdict,
    headers: HeaderStyle,
) -> Response<B> {
    match verdict {
        Verdict::Limited(limited) => {
            response::limited_response_with(&limited, headers)
        }
        Verdict::Denied(status) => response::error(status, "identity required"),
        Verdict::Unavailable(status) => response::unavailable(status),
        Verdict::InvalidCost => response::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "invalid request cost",
        ),
        // Allowed and Unlimited never reach here.
        Verdict::Invalid | Verdict::Allowed(_) | Verdict::Unlimited => {
            response::error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "rate limiter clock out of range",
            )
        }
    }
}
