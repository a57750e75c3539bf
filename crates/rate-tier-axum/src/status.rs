//! A status page for the limiter, as an axum [`Router`](axum::Router):
//! what each tier allowed and refused in the last minute and, per minute,
//! over the last hour; the refusals per limit; the users nearest their
//! limit (as tags unless asked in clear); the tiers, policies and store in
//! force, and the last reloads of the tiers.
//!
//! - [`StatusBoard`] gathers it: an
//!   [`Observer`](tower_rate_tier::Observer) of the limiter, registered
//!   with [`RateTierBuilder::observe`](tower_rate_tier::RateTierBuilder::observe).
//! - [`status_router`] serves it: `GET /status` (HTML that reads without
//!   JavaScript; a small script of its own refreshes it every 5 s),
//!   `/status.json`, `/status.js`, `/status.css`. Nothing is loaded from
//!   elsewhere, and the headers say so.
//!
//! Like any observer, the board is told of every check: the limiter then
//! times each one, off its in-process fast path, a cost to weigh on the
//! hottest services.
//!
//! The page has no authentication of its own: it shows the app's limits
//! and traffic, so mount it behind the app's own, as here with a bearer
//! token checked by a `route_layer` (a real app compares the token in
//! constant time, e.g. with the `subtle` crate):
//!
//! ```
//! use std::sync::Arc;
//! use axum::{Router, body::Body, extract::Request, http::StatusCode};
//! use axum::middleware::{self, Next};
//! use axum::response::Response;
//! use rate_tier_axum::status::{StatusBoard, status_router};
//! use tower::ServiceExt;
//! use tower_rate_tier::{Quota, RateTier};
//!
//! /// Only the operators' token passes.
//! async fn operators_only(request: Request, next: Next) -> Result<Response, StatusCode> {
//!     let token = request.headers().get("authorization").and_then(|v| v.to_str().ok());
//!     match token {
//!         Some("Bearer ops-secret") => Ok(next.run(request).await),
//!         _ => Err(StatusCode::UNAUTHORIZED),
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let board = Arc::new(StatusBoard::new());
//! let limiter = RateTier::builder()
//!     .tier("free", Quota::per_minute(10))
//!     .tier("pro", Quota::per_minute(100))
//!     .observe(board.clone())
//!     .build();
//! let ops = status_router(limiter.clone(), board)
//!     .route_layer(middleware::from_fn(operators_only));
//! let app: Router = Router::new().nest("/ops", ops);
//!
//! let page = |token: Option<&str>| {
//!     let mut request = Request::get("/ops/status");
//!     if let Some(token) = token {
//!         request = request.header("authorization", token);
//!     }
//!     request.body(Body::empty()).unwrap()
//! };
//! let refused = app.clone().oneshot(page(None)).await.unwrap();
//! assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
//! let shown = app.oneshot(page(Some("Bearer ops-secret"))).await.unwrap();
//! assert_eq!(shown.status(), StatusCode::OK);
//! # }
//! ```

mod board;
#[doc(hidden)]
pub mod kit;
mod model;
mod near;
mod page;
mod ring;
mod router;

pub use board::StatusBoard;
pub use router::status_router;
