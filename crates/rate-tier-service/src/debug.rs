//! The debug listener, envoyproxy/ratelimit's (`DEBUG_HOST`, `DEBUG_PORT`,
//! 6070): `GET /rlconfig`, the rules in use as text, one line each, in
//! envoyproxy/ratelimit's format; `GET /healthcheck`, as on the HTTP
//! listener; `GET /status` and `GET /status.json`, the status page and its
//! JSON (see [`status`](crate::status)); `GET /`, the list of them.
//!
//! ```text
//! $ curl -s localhost:6070/rlconfig
//! edge.remote_address: unit=MINUTE requests_per_unit=60, shadow_mode: false, quota_mode: false
//! ```

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use rate_tier_axum::status::kit::{self, typed};

use crate::admin::Token;
use crate::decide::Decider;
use crate::http::{Health, HttpState, healthcheck, text};

/// The endpoints, as `GET /` lists them.
const ENDPOINTS: &str = "\
/healthcheck: OK while serving; 503 while draining
/rlconfig: print out the currently loaded configuration for debugging
/status: the rules' hits and refusals, the keys nearest their limit, the store, the config loads
/status.json: the same, as JSON
";

/// The debug routes over `decider`; the status routes ask for `token` when
/// there is one.
pub(crate) fn router(
    decider: Arc<Decider>,
    health: Health,
    token: Option<&str>,
) -> Router {
    let state = HttpState { decider, health };
    let status = Router::new()
        .route("/status", get(status_html))
        .route("/status.json", get(status_json))
        .route(
            "/status.js",
            get(async || {
                typed("text/javascript; charset=utf-8", crate::status::script())
            }),
        )
        .route(
            "/status.css",
            get(async || typed("text/css; charset=utf-8", kit::STYLE)),
        )
        .layer(middleware::from_fn_with_state(
            token.map(|t| Arc::new(Token::new(t))),
            guard,
        ))
        .layer(middleware::from_fn(kit::page_headers));
    Router::new()
        .route("/", get(async || text(StatusCode::OK, ENDPOINTS.into())))
        .route("/rlconfig", get(rlconfig))
        .route("/healthcheck", get(healthcheck))
        .merge(status)
        .with_state(state)
}

async fn rlconfig(State(state): State<HttpState>) -> Response {
    text(StatusCode::OK, state.decider.config().dump())
}

async fn status_html(State(state): State<HttpState>) -> Response {
    let status = state.decider.status().status(&state.decider);
    typed("text/html; charset=utf-8", crate::status::html(&status))
}

async fn status_json(State(state): State<HttpState>) -> Response {
    let status = state.decider.status().status(&state.decider);
    match serde_json::to_string(&status) {
        Ok(json) => typed("application/json", json),
        Err(error) => {
            text(StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n"))
        }
    }
}

/// With a token, a request without it is answered 401, asking a browser
/// for it (HTTP Basic, the token as the password).
async fn guard(
    State(token): State<Option<Arc<Token>>>,
    request: Request,
    next: Next,
) -> Response {
    match token {
        Some(token) if !token.admits_page(request.headers()) => (
            StatusCode::UNAUTHORIZED,
            [(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(
                    "Basic realm=\"rate-tier-service status\", charset=\"UTF-8\"",
                ),
            )],
            "the status page needs the admin token: as a bearer token, or \
             as the password of HTTP Basic\n",
        )
            .into_response(),
        _ => next.run(request).await,
    }
}
