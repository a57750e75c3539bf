//! The admin API: a listener of its own, off unless asked for
//! (`--admin ADDR --admin-token-file FILE`, or [`AdminOptions`]), for an
//! operator to reset a descriptor's buckets, read what remains of them
//! without charging, and list the rules in use.
//!
//! # Access
//!
//! Every request needs `authorization: Bearer <token>`, where the token is
//! the content of the token file with the white space around it trimmed
//! (read once, at start; an empty or unreadable file is a start-up error).
//! The token is compared in constant time (SHA-1 digests of both, compared
//! with [`subtle::ConstantTimeEq`], so neither the bytes nor the length of
//! the token leak through the time of a refusal). A missing header, another
//! scheme (`Basic`) or a wrong token is answered `401 Unauthorized` with
//! `www-authenticate: Bearer`, on any path, and nothing is done.
//!
//! The listener defaults to loopback: `--admin 6071` is `127.0.0.1:6071`.
//! Another address (`--admin 0.0.0.0:6071`) is allowed, with a warning: the
//! token is then all that guards the API.
//!
//! # Endpoints
//!
//! Requests and answers are JSON (`content-type: application/json`). The
//! descriptors of a request have the shape `POST /json` reads (see
//! [`json`](mod@crate::json)): `{"domain": "...", "descriptors": [{"entries":
//! [{"key": "...", "value": "..."}]}]}`, with a descriptor's `limit`
//! override if it has one; `hits_addend` is accepted and ignored.
//!
//! ## `POST /admin/reset`
//!
//! Puts the buckets those descriptors map to under the rules in use back
//! to full ([`Decider::reset`]: the same buckets as a decision, through
//! [`Storage::reset`](rate_tier_storage::Storage::reset) of the store:
//! memory, Redis, Redis Cluster, PostgreSQL, and the local fallback too).
//! Each descriptor is matched on its own (`replaces` does not apply).
//!
//! With Redis or a Redis Cluster, the shared bucket is full again at once
//! for every instance, and the refusals each instance remembers in process
//! ([`RedisStorage::remember_refusals`](rate_tier_storage::RedisStorage::remember_refusals))
//! are forgotten on the instance asked at once and on every other one
//! within a second: a reset through any instance's admin API holds
//! everywhere.
//!
//! ```text
//! {"descriptors_reset": 1,
//!  "descriptors": [{"limit": {"name": "per_user", "requests_per_unit": 2, "unit": "MINUTE"},
//!                   "unlimited": false, "reset": true}]}
//! ```
//!
//! `limit` is `null` when no rule applies; `reset` is false then, for an
//! `unlimited` rule and for `requests_per_unit: 0` (no bucket).
//!
//! ## `POST /admin/peek`
//!
//! What those descriptors would be told now, charging nothing
//! ([`Decider::peek`]: the request decided with every descriptor's
//! `hits_addend` at 0, as `/json` does for a peek; `replaces` applies as in
//! a decision).
//!
//! ```text
//! {"descriptors": [{"code": "OK",
//!                   "limit": {"name": "per_user", "requests_per_unit": 2, "unit": "MINUTE"},
//!                   "unlimited": false, "remaining": 0, "reset_after_seconds": 60}]}
//! ```
//!
//! `remaining` is what a request could take now, `reset_after_seconds` the
//! time until the bucket is full again (whole seconds, rounded up); both
//! `null` without a limit (and `remaining` 4294967295 for `unlimited`).
//!
//! ## `GET /admin/rules`
//!
//! Every rule in use, domains in name order, each domain's rules in config
//! order:
//!
//! ```text
//! {"rules": [{"domain": "edge",
//!             "descriptors": [{"key": "user", "value": null}],
//!             "path": "user", "name": "per_user",
//!             "unlimited": false, "requests_per_unit": 2, "unit": "MINUTE",
//!             "shadow": false, "replaces": []}]}
//! ```
//!
//! `descriptors` is the rule's path from the domain down (`value` `null`:
//! any value); `path` is the label of the rule's metrics; `name` is `null`
//! when the rule has none; `requests_per_unit` and `unit` are `null` for an
//! `unlimited` rule.
//!
//! ## Errors
//!
//! `{"error": "..."}` with `400` (not JSON, an unknown field, no domain or
//! no descriptors, more descriptors than
//! [`RequestLimits::max_descriptors`](crate::RequestLimits)), `404` (an
//! unknown domain, or path), `405` (another method), `501` (a store without
//! resets) or `503` (the store gave no answer).
//!
//! # Logs
//!
//! Every call is logged (target `rate_tier_service::admin`, in the format
//! of `--log-format`) with its `endpoint`, its `outcome` (`ok`,
//! `unauthorized`, `bad_request`, `not_found`, `method_not_allowed`,
//! `unsupported`, `unavailable`), its `status` and the caller's address:
//! never a domain, a descriptor's value or a token.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, RateLimit as CurrentLimit,
};
use rate_tier_storage::StorageError;
use serde_json::{Value, json};
use sha1::{Digest, Sha1};
use subtle::ConstantTimeEq;

use crate::config::{RuleLimit, Unit};
use crate::decide::{DecideError, Decider, Incoming, ResetDescriptor};
use crate::json;

/// The port of `--admin` when only a port is given is on this address.
pub const DEFAULT_ADMIN_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::LOCALHOST;

/// Where the admin API listens, and the file of its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminOptions {
    /// The admin listener (its own, never the public HTTP one).
    pub addr: SocketAddr,
    /// The file whose content, trimmed, is the bearer token.
    pub token_file: PathBuf,
}

/// Reads `--admin`'s value: a port alone is on loopback.
///
/// ```
/// use rate_tier_service::admin::parse_addr;
/// assert_eq!(parse_addr("6071")?.to_string(), "127.0.0.1:6071");
/// assert_eq!(parse_addr("0.0.0.0:6071")?.to_string(), "0.0.0.0:6071");
/// assert!(parse_addr("6071x").is_err());
/// # Ok::<(), String>(())
/// ```
///
/// # Errors
///
/// Neither a port nor an address.
pub fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from((DEFAULT_ADMIN_IP, port)));
    }
    text.parse().map_err(|e| {
        format!("--admin {text:?}: not a port (6071) or an address like 127.0.0.1:6071 ({e})")
    })
}

/// The token of `path`: its content, trimmed.
///
/// # Errors
///
/// The file cannot be read, is not UTF-8, or holds only white space.
pub fn read_token(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!("cannot read the admin token file {}: {e}", path.display())
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!(
            "the admin token file {} is empty",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

/// The token, kept as its digest only.
#[derive(Clone)]
pub(crate) struct Token([u8; 20]);

impl Token {
    pub(crate) fn new(token: &str) -> Token {
        Token(Sha1::digest(token.as_bytes()).into())
    }

    fn is(&self, given: &[u8]) -> bool {
        let given: [u8; 20] = Sha1::digest(given.trim_ascii()).into();
        bool::from(given.ct_eq(&self.0))
    }

    /// Whether `headers` carry this token as a bearer token, or as the
    /// password of HTTP Basic (any user name): what a browser sends once
    /// asked.
    pub(crate) fn admits_page(&self, headers: &HeaderMap) -> bool {
        use base64::Engine;
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return false;
        };
        let value = value.as_bytes();
        let scheme = |name: &[u8]| {
            value.len() > name.len()
                && value[..name.len()].eq_ignore_ascii_case(name)
        };
        if scheme(b"bearer ") {
            return self.is(&value[7..]);
        }
        if !scheme(b"basic ") {
            return false;
        }
        let Ok(decoded) = base64::engine::general_purpose::STANDARD
            .decode(value[6..].trim_ascii())
        else {
            return false;
        };
        decoded
            .iter()
            .position(|&b| b == b':')
            .is_some_and(|colon| self.is(&decoded[colon + 1..]))
    }

    /// Whether `headers` carry `authorization: Bearer <this token>`.
    fn admits(&self, headers: &HeaderMap) -> Result<(), &'static str> {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err("no authorization header");
        };
        let value = value.as_bytes();
        let scheme = b"bearer ";
        if value.len() < scheme.len()
            || !value[..scheme.len()].eq_ignore_ascii_case(scheme)
        {
            return Err("not a bearer token");
        }
        if self.is(&value[scheme.len()..]) {
            Ok(())
        } else {
            Err("wrong token")
        }
    }
}

#[derive(Clone)]
struct AdminState {
    decider: Arc<Decider>,
    token: Token,
}

/// The admin routes over `decider`, guarded by `token`. Serve them with
/// `into_make_service_with_connect_info::<SocketAddr>()` (the logs name
/// the caller's address).
pub fn router(decider: Arc<Decider>, token: &str) -> Router {
    let state = AdminState {
        decider,
        token: Token::new(token),
    };
    Router::new()
        .route("/admin/reset", post(reset))
        .route("/admin/peek", post(peek))
        .route("/admin/rules", get(rules))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// The endpoints, by name: a path that is none of them is logged as
/// `other` (a path is the caller's text).
fn endpoint(path: &str) -> &'static str {
    match path {
        "/admin/reset" => "reset",
        "/admin/peek" => "peek",
        "/admin/rules" => "rules",
        _ => "other",
    }
}

fn outcome(status: StatusCode) -> &'static str {
    match status {
        StatusCode::OK => "ok",
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::NOT_IMPLEMENTED => "unsupported",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        _ => "error",
    }
}

/// The token check, and the log line of every call.
async fn guard(
    State(state): State<AdminState>,
    ConnectInfo(caller): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let endpoint = endpoint(request.uri().path());
    if let Err(reason) = state.token.admits(request.headers()) {
        tracing::warn!(
            target: "rate_tier_service::admin",
            endpoint,
            outcome = "unauthorized",
            reason,
            %caller,
            "admin call refused"
        );
        return (
            StatusCode::UNAUTHORIZED,
            [
                (header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")),
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                ),
            ],
            json!({"error": "unauthorized"}).to_string(),
        )
            .into_response();
    }
    let response = next.run(request).await;
    let status = response.status();
    tracing::info!(
        target: "rate_tier_service::admin",
        endpoint,
        outcome = outcome(status),
        status = status.as_u16(),
        %caller,
        "admin call"
    );
    response
}

fn answer(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    answer(status, &json!({"error": message.into()}))
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such admin endpoint")
}

fn decide_error(failed: &DecideError) -> Response {
    match failed {
        DecideError::InvalidArgument(reason) => error_400(reason),
        DecideError::Store(StorageError::Unsupported(what)) => error(
            StatusCode::NOT_IMPLEMENTED,
            format!("the store does not support {what}"),
        ),
        DecideError::Store(_) => {
            error(StatusCode::SERVICE_UNAVAILABLE, failed.to_string())
        }
    }
}

fn error_400(reason: &str) -> Response {
    error(StatusCode::BAD_REQUEST, reason)
}

/// The request of a reset or a peek, in a domain of the config in use;
/// else the status and the reason.
fn read_request(
    decider: &Decider,
    body: &[u8],
) -> Result<RateLimitRequest, (StatusCode, String)> {
    let limits = decider.options().limits;
    let request = match json::read_request(body, limits) {
        Ok(Incoming::Request(request)) => request,
        Ok(Incoming::Oversized(bound)) => {
            return Err((StatusCode::BAD_REQUEST, bound.describe(&limits)));
        }
        Err(reason) => return Err((StatusCode::BAD_REQUEST, reason)),
    };
    if request.domain.is_empty() {
        return Err((
            StatusCode::BAD_REQUEST,
            "rate limit domain must not be empty".into(),
        ));
    }
    if decider.config().domain(&request.domain).is_none() {
        return Err((StatusCode::NOT_FOUND, "unknown domain".into()));
    }
    Ok(request)
}

fn limit_json(name: &str, requests_per_unit: u32, unit: Value) -> Value {
    json!({
        "name": (!name.is_empty()).then_some(name),
        "requests_per_unit": requests_per_unit,
        "unit": unit,
    })
}

async fn reset(State(state): State<AdminState>, body: Bytes) -> Response {
    let request = match read_request(&state.decider, &body) {
        Ok(request) => request,
        Err((status, reason)) => return error(status, reason),
    };
    let done = match state.decider.reset(&request).await {
        Ok(done) => done,
        Err(error) => return decide_error(&error),
    };
    let descriptors: Vec<Value> = done
        .iter()
        .map(|d| match d {
            ResetDescriptor::Limit {
                name,
                requests_per_unit,
                unit,
                reset,
            } => json!({
                "limit": limit_json(name, *requests_per_unit, unit.name().into()),
                "unlimited": false,
                "reset": reset,
            }),
            ResetDescriptor::Unlimited => {
                json!({"limit": null, "unlimited": true, "reset": false})
            }
            _ => json!({"limit": null, "unlimited": false, "reset": false}),
        })
        .collect();
    let count = done
        .iter()
        .filter(|d| matches!(d, ResetDescriptor::Limit { reset: true, .. }))
        .count();
    answer(
        StatusCode::OK,
        &json!({"descriptors_reset": count, "descriptors": descriptors}),
    )
}

async fn peek(State(state): State<AdminState>, body: Bytes) -> Response {
    let request = match read_request(&state.decider, &body) {
        Ok(request) => request,
        Err((status, reason)) => return error(status, reason),
    };
    let response = match state.decider.peek(&request).await {
        Ok(response) => response,
        Err(error) => return decide_error(&error),
    };
    let descriptors: Vec<Value> = response
        .statuses
        .iter()
        .map(|status| {
            let code = if status.code == Code::OverLimit as i32 {
                "OVER_LIMIT"
            } else {
                "OK"
            };
            match &status.current_limit {
                Some(CurrentLimit {
                    name,
                    requests_per_unit,
                    unit,
                }) => json!({
                    "code": code,
                    "limit": limit_json(
                        name,
                        *requests_per_unit,
                        Unit::from_proto(*unit).map_or(Value::Null, |u| u.name().into()),
                    ),
                    "unlimited": false,
                    "remaining": status.limit_remaining,
                    "reset_after_seconds": status.duration_until_reset.as_ref().map(|d| d.seconds),
                }),
                // The decision's answer to an unlimited rule.
                None if status.limit_remaining == u32::MAX => json!({
                    "code": code, "limit": null, "unlimited": true,
                    "remaining": u32::MAX, "reset_after_seconds": null,
                }),
                None => json!({
                    "code": code, "limit": null, "unlimited": false,
                    "remaining": null, "reset_after_seconds": null,
                }),
            }
        })
        .collect();
    answer(StatusCode::OK, &json!({"descriptors": descriptors}))
}

async fn rules(State(state): State<AdminState>) -> Response {
    let config = state.decider.config();
    let mut rules: Vec<_> = config.rules().iter().collect();
    // Stable: each domain's rules stay in config order.
    rules.sort_by(|a, b| a.domain.cmp(&b.domain));
    let rules: Vec<Value> = rules
        .into_iter()
        .map(|rule| {
            let (unlimited, requests_per_unit, unit) = match rule.limit {
                RuleLimit::Unlimited => (true, None, None),
                RuleLimit::Never | RuleLimit::Quota(_) => (
                    false,
                    Some(rule.requests_per_unit),
                    Some(rule.unit.name()),
                ),
            };
            json!({
                "domain": rule.domain,
                "descriptors": rule
                    .entries
                    .iter()
                    .map(|(key, value)| json!({"key": key, "value": value}))
                    .collect::<Vec<_>>(),
                "path": rule.path,
                "name": (!rule.name.is_empty()).then_some(&rule.name),
                "unlimited": unlimited,
                "requests_per_unit": requests_per_unit,
                "unit": unit,
                "shadow": rule.shadow,
                "replaces": rule.replaces,
            })
        })
        .collect();
    answer(StatusCode::OK, &json!({"rules": rules}))
}
