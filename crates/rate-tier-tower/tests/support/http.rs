//! One request through a service, its answer read back; and the events a
//! layer reports, collected.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_rate_tier::LimitEvent;

/// A response, read to the end.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    /// A header as text, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// `x-ratelimit-remaining`, which must be present.
    pub fn remaining(&self) -> u64 {
        self.number("x-ratelimit-remaining")
    }

    /// `x-ratelimit-limit`, which must be present.
    pub fn limit(&self) -> u64 {
        self.number("x-ratelimit-limit")
    }

    /// `retry-after`, which must be present.
    pub fn retry_after(&self) -> u64 {
        self.number("retry-after")
    }

    fn number(&self, name: &str) -> u64 {
        self.header(name)
            .unwrap_or_else(|| panic!("no {name}: {self:?}"))
            .parse()
            .unwrap()
    }

    /// Whether any `x-ratelimit-*` header is present.
    pub fn has_rate_headers(&self) -> bool {
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ]
        .iter()
        .any(|h| self.headers.contains_key(*h))
    }
}

/// Sends `request` through a clone of `app`.
pub async fn send(app: &Router, request: Request<Body>) -> Reply {
    let response = app.clone().oneshot(request).await;
    let response = match response {
        Ok(response) => response,
        Err(never) => match never {},
    };
    read(response).await
}

/// Reads a response to the end.
pub async fn read(response: http::Response<Body>) -> Reply {
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

/// `GET path` with these headers, through `app`.
pub async fn get(app: &Router, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut request = Request::get(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send(app, request.body(Body::empty()).unwrap()).await
}

/// `GET path` with `x-api-key: key` (none if `None`), through `app`.
pub async fn get_as(app: &Router, key: Option<&str>, path: &str) -> Reply {
    match key {
        Some(key) => get(app, path, &[("x-api-key", key)]).await,
        None => get(app, path, &[]).await,
    }
}

/// The events of a layer or a limiter, in order.
#[derive(Clone, Default)]
pub struct Events(Arc<Mutex<Vec<LimitEvent>>>);

impl Events {
    /// A listener that records here, for `on_event`.
    pub fn sink(&self) -> impl Fn(&LimitEvent) + Send + Sync + 'static {
        let events = self.0.clone();
        move |event| events.lock().unwrap().push(event.clone())
    }

    /// Everything recorded so far.
    pub fn all(&self) -> Vec<LimitEvent> {
        self.0.lock().unwrap().clone()
    }

    /// Forgets what was recorded.
    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }

    /// How many recorded events `matches` accepts.
    pub fn count(&self, matches: impl Fn(&LimitEvent) -> bool) -> usize {
        self.0.lock().unwrap().iter().filter(|e| matches(e)).count()
    }
}

/// The type of a router's error, for services built by hand.
pub type Never = Infallible;
