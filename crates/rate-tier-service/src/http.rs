//! The HTTP side: `POST /json`, `GET /healthcheck`, `GET /metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::decide::{DecideError, Decider};
use crate::json;

/// Whether the service answers as healthy: true from the start, false from
/// the moment it begins to shut down (so that load balancers stop sending
/// while requests in flight finish).
#[derive(Debug, Clone)]
pub struct Health {
    serving: Arc<AtomicBool>,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            serving: Arc::new(AtomicBool::new(true)),
        }
    }
}

impl Health {
    /// Whether it is serving.
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    /// Marks it as not serving.
    pub fn stop_serving(&self) {
        self.serving.store(false, Ordering::Release);
    }
}

#[derive(Clone)]
pub(crate) struct HttpState {
    pub(crate) decider: Arc<Decider>,
    pub(crate) health: Health,
}

/// The HTTP routes over `decider`.
pub fn router(decider: Arc<Decider>, health: Health) -> Router {
    // Read up to the hard cap: a body beyond the request bound is answered
    // (refused), not dropped with a 413 a gateway may let through.
    let cap = crate::grpc::DECODE_CAP_BYTES
        .max(decider.options().limits.max_request_bytes);
    Router::new()
        .route("/json", post(json_endpoint))
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(cap))
        .with_state(HttpState { decider, health })
}

/// `/metrics` alone at `path`, for a listener of its own.
pub(crate) fn metrics_router(decider: Arc<Decider>, path: &str) -> Router {
    Router::new()
        .route(path, get(metrics))
        .with_state(HttpState {
            decider,
            health: Health::default(),
        })
}

pub(crate) fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

async fn json_endpoint(
    State(state): State<HttpState>,
    body: Bytes,
) -> Response {
    let limits = state.decider.options().limits;
    let incoming = match json::read_request(&body, limits) {
        Ok(incoming) => incoming,
        Err(reason) => {
            state.decider.metrics().call("json", "invalid_argument");
            return text(
                StatusCode::BAD_REQUEST,
                format!("Bad Request: {reason}\n"),
            );
        }
    };
    // Not held while the store decides.
    drop(body);
    let decided = state.decider.answer(&incoming, "json").await;
    match decided {
        Ok(response) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (
                status,
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                json::write_response(&response),
            )
                .into_response()
        }
        Err(DecideError::InvalidArgument(reason)) => {
            text(StatusCode::BAD_REQUEST, format!("Bad Request: {reason}\n"))
        }
        Err(error @ DecideError::Store(_)) => {
            tracing::warn!(%error, "no decision from the store");
            text(StatusCode::SERVICE_UNAVAILABLE, format!("{error}\n"))
        }
    }
}

/// 200 `OK` while serving; 503 from the moment a shutdown begins (the
/// drain), so that load balancers stop sending.
pub(crate) async fn healthcheck(State(state): State<HttpState>) -> Response {
    if state.health.is_serving() {
        text(StatusCode::OK, "OK".into())
    } else {
        text(StatusCode::SERVICE_UNAVAILABLE, "draining\n".into())
    }
}

pub(crate) async fn metrics(State(state): State<HttpState>) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ),
        )],
        state.decider.metrics().encode(),
    )
        .into_response()
}
