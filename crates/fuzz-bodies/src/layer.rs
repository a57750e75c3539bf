//! `layer_headers`: the Tower layer over requests whose headers (identity,
//! cost, forwarded addresses) and whose response's settle header are any
//! bytes.

use std::convert::Infallible;
use std::sync::LazyLock;

use http::{HeaderName, HeaderValue, Request, Response};
use http_body::Body;
use tower::{Layer, ServiceExt, service_fn};
use tower_rate_tier::{
    Limit, OnMissing, Quota, RateTier, Settle, TierIdentity, TierLimitLayer,
    client_ip::ClientIp,
};

use crate::{Bytes, now};

static LAYER: LazyLock<TierLimitLayer> = LazyLock::new(|| {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .on_missing(OnMissing::Deny(http::StatusCode::UNAUTHORIZED))
        .build();
    TierLimitLayer::new(tiers)
        .identifier_fn(|headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            let tier = headers.get("x-plan").and_then(|p| p.to_str().ok());
            Some(TierIdentity::new(key, tier.unwrap_or("free")))
        })
        .cost_fn(|request| {
            request
                .headers
                .get("x-cost")
                .and_then(|c| c.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        })
        .limit(
            Limit::new("ip", Quota::per_minute(50))
                .per_client_ip(ClientIp::RIGHTMOST_X_FORWARDED_FOR),
        )
        .limit(Limit::new("tokens", Quota::per_minute(1000)).settle(
            Settle::from_header("x-tokens-used").refund_on_server_error(),
        ))
});

/// The header names the layer reads, chosen by a byte.
const NAMES: &[&str] = &[
    "x-api-key",
    "x-plan",
    "x-cost",
    "x-forwarded-for",
    "forwarded",
    "x-other",
];

/// A request with fuzz-chosen headers through the layer, its inner service
/// answering with a fuzz-chosen `x-tokens-used`: any answer the layer's
/// table lists, never a panic, and the body read to its end.
pub fn layer_headers(data: &[u8]) {
    let mut bytes = Bytes(data);
    let mut request = Request::get("/generate");
    for _ in 0..bytes.u8() % 8 {
        let name = NAMES[usize::from(bytes.u8()) % NAMES.len()];
        let len = usize::from(bytes.u8() % 64);
        let value: Vec<u8> = (0..len).map(|_| bytes.u8()).collect();
        if let Ok(value) = HeaderValue::from_bytes(&value) {
            request = request.header(HeaderName::from_static(name), value);
        }
    }
    let used = HeaderValue::from_bytes(bytes.rest()).ok();
    let Ok(request) = request.body(String::new()) else {
        return;
    };
    let inner = service_fn(move |_: Request<String>| {
        let used = used.clone();
        async move {
            let mut response = Response::new(String::from("ok"));
            if let Some(used) = used {
                response.headers_mut().insert("x-tokens-used", used);
            }
            Ok::<_, Infallible>(response)
        }
    });
    // The inner service's error is Infallible.
    let Ok(response) = now(LAYER.layer(inner).oneshot(request));
    let status = response.status().as_u16();
    assert!(
        matches!(status, 200 | 401 | 403 | 429 | 500 | 503),
        "answered {status}"
    );
    let mut body = std::pin::pin!(response.into_body());
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    while let std::task::Poll::Ready(Some(frame)) =
        body.as_mut().poll_frame(&mut cx)
    {
        let Ok(_) = frame;
    }
}
