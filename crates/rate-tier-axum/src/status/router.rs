//! The status routes and the headers that keep the page to its own bytes.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::middleware;
use axum::response::Response;
use axum::routing::get;
use tower_rate_tier::RateTier;

use super::board::StatusBoard;
use super::kit::{STYLE, page_headers, typed};
use super::model::Status;
use super::page::{html, script};

/// What the routes read.
#[derive(Clone)]
struct Page {
    limiter: RateTier,
    board: Arc<StatusBoard>,
}

/// The status page of `limiter`, from what `board` gathered (register the
/// board on the limiter with
/// [`RateTierBuilder::observe`](tower_rate_tier::RateTierBuilder::observe)):
///
/// | route | what |
/// |---|---|
/// | `GET /status` | the page, HTML that reads without JavaScript |
/// | `GET /status.json` | the same, as JSON |
/// | `GET /status.js` | the page's script: refreshes it from `status.json` every 5 s |
/// | `GET /status.css` | the page's style sheet |
///
/// The page's links are relative: nest the router anywhere
/// (`Router::new().nest("/ops", status_router(..))` serves `/ops/status`).
/// Every answer says `content-security-policy` (the page's own script,
/// style sheet and JSON only), `cache-control: no-store`,
/// `x-content-type-options: nosniff`, `referrer-policy: no-referrer` and
/// `x-frame-options: DENY`.
///
/// It asks for no credentials of its own: mount it behind the app's own
/// authentication (see the [module](super)'s example).
///
/// ```
/// use std::sync::Arc;
/// use axum::{Router, body::Body, http::Request};
/// use rate_tier_axum::status::{StatusBoard, status_router};
/// use tower::ServiceExt;
/// use tower_rate_tier::{Quota, RateTier};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let board = Arc::new(StatusBoard::new());
/// let limiter = RateTier::builder()
///     .tier("free", Quota::per_minute(10))
///     .observe(board.clone())
///     .build();
/// let app: Router = Router::new().nest("/ops", status_router(limiter, board));
///
/// let request = Request::get("/ops/status.json").body(Body::empty()).unwrap();
/// let response = app.oneshot(request).await.unwrap();
/// assert_eq!(response.status(), 200);
/// assert_eq!(response.headers()["content-type"], "application/json");
/// assert_eq!(response.headers()["x-frame-options"], "DENY");
/// # }
/// ```
pub fn status_router<S>(limiter: RateTier, board: Arc<StatusBoard>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/status", get(status_html))
        .route("/status.json", get(status_json))
        .route(
            "/status.js",
            get(async || typed("text/javascript; charset=utf-8", script())),
        )
        .route(
            "/status.css",
            get(async || typed("text/css; charset=utf-8", STYLE)),
        )
        .layer(middleware::from_fn(page_headers))
        .with_state(Page { limiter, board })
}

async fn status_html(State(page): State<Page>) -> Response {
    let status = Status::of(&page.board, &page.limiter);
    typed("text/html; charset=utf-8", html(&status))
}

async fn status_json(State(page): State<Page>) -> Response {
    typed("application/json", page.board.json(&page.limiter))
}
