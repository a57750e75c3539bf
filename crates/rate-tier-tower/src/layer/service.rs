use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use tower_service::Service;

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

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

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
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            match config.judge(&parts).await {
                Verdict::Allowed(info) => {
                    parts.extensions.insert(info.clone());
                    let mut response =
                        inner.call(Request::from_parts(parts, body)).await?;
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
                Verdict::Limited(limited) => Ok(
                    response::limited_response_with(&limited, config.headers),
                ),
                Verdict::Denied(status) => {
                    Ok(response::error(status, "identity required"))
                }
                Verdict::Unavailable(status) => {
                    Ok(response::unavailable(status))
                }
                Verdict::InvalidCost => Ok(response::error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "invalid request cost",
                )),
                Verdict::Invalid => Ok(response::error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "rate limiter clock out of range",
                )),
            }
        })
    }
}
