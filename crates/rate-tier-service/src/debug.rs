//! The debug listener, envoyproxy/ratelimit's (`DEBUG_HOST`, `DEBUG_PORT`,
//! 6070): `GET /rlconfig`, the rules in use as text, one line each, in
//! envoyproxy/ratelimit's format; `GET /healthcheck`, as on the HTTP
//! listener; `GET /`, the list of both.
//!
//! ```text
//! $ curl -s localhost:6070/rlconfig
//! edge.remote_address: unit=MINUTE requests_per_unit=60, shadow_mode: false, quota_mode: false
//! ```

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;

use crate::decide::Decider;
use crate::http::{Health, HttpState, healthcheck, text};

/// The endpoints, as `GET /` lists them.
const ENDPOINTS: &str = "\
/healthcheck: OK while serving; 503 while draining
/rlconfig: print out the currently loaded configuration for debugging
";

/// The debug routes over `decider`.
pub(crate) fn router(decider: Arc<Decider>, health: Health) -> Router {
    Router::new()
        .route("/", get(async || text(StatusCode::OK, ENDPOINTS.into())))
        .route("/rlconfig", get(rlconfig))
        .route("/healthcheck", get(healthcheck))
        .with_state(HttpState { decider, health })
}

async fn rlconfig(State(state): State<HttpState>) -> Response {
    text(StatusCode::OK, state.decider.config().dump())
}
