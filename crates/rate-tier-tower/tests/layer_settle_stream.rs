//! Settling when the response body ends: a streamed answer reports its
//! cost at its end (a trailer, or a meter the handler fills), and a client
//! that goes away mid-stream pays for what was streamed.
#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use tower::{Layer, ServiceExt, service_fn};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    Limit, LimitRequest, Quota, RateTier, Settle, TierIdentity, TierLimitLayer,
    Usage,
};

/// A streamed body: its frames, one per poll.
struct Frames(VecDeque<Frame<Bytes>>);

impl Frames {
    fn response(frames: Vec<Frame<Bytes>>) -> Response<Frames> {
        Response::new(Frames(frames.into()))
    }
}

/// A refusal's body: its text, one frame.
impl From<String> for Frames {
    fn from(text: String) -> Self {
        Frames(VecDeque::from([Frame::data(Bytes::from(text))]))
    }
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

fn tiers() -> RateTier {
    RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(100))
        .build()
}

fn tokens(settle: Settle) -> Limit {
    Limit::new("tokens", Quota::per_minute(1000)).settle(settle)
}

/// What the `tokens` bucket of ana has left.
async fn left(tiers: &RateTier, tokens: &Limit) -> u64 {
    let read = LimitRequest::new("ana", "free", 0).limit(tokens, 0);
    let info = tiers.decide(&read).await.unwrap().unwrap();
    info.limits().nth(1).unwrap().remaining
}

fn request() -> Request<()> {
    Request::get("/generate").body(()).unwrap()
}

#[tokio::test]
async fn a_streamed_answer_is_settled_from_its_meter_when_the_body_ends() {
    // Regression: a settlement that read only the response head would
    // leave a streamed answer charged its estimate.
    let tiers = tiers();
    let limit = tokens(Settle::from_usage());
    let layer = TierLimitLayer::new(tiers.clone())
        .identifier_fn(|_| Some(TierIdentity::new("ana", "free")))
        .limit(limit.clone());
    let service = layer.layer(service_fn(|request: Request<()>| async move {
        let usage = request.extensions().get::<Usage>().unwrap().clone();
        // Three chunks; the model's usage is known as it streams.
        let frames: Vec<Frame<Bytes>> = (0..3)
            .map(|i| {
                usage.add(100);
                Frame::data(Bytes::from(format!("chunk {i}\n")))
            })
            .collect();
        Ok::<_, Infallible>(Frames::response(frames))
    }));
    let response = service.oneshot(request()).await.unwrap();
    assert_eq!(left(&tiers, &limit).await, 999, "only the estimate, so far");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "chunk 0\nchunk 1\nchunk 2\n");
    assert_eq!(left(&tiers, &limit).await, 700, "settled to 300");
}

#[tokio::test]
async fn a_trailer_settles_the_stream_it_ends() {
    let tiers = tiers();
    let limit = tokens(Settle::from_trailer("x-tokens-used"));
    let layer = TierLimitLayer::new(tiers.clone())
        .identifier_fn(|_| Some(TierIdentity::new("ana", "free")))
        .limit(limit.clone());
    let service = layer.layer(service_fn(|_: Request<()>| async {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-tokens-used", "450".parse().unwrap());
        let frames = vec![
            Frame::data(Bytes::from("answer\n")),
            Frame::trailers(trailers),
        ];
        Ok::<_, Infallible>(Frames::response(frames))
    }));
    let response = service.oneshot(request()).await.unwrap();
    let collected = response.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["x-tokens-used"], "450");
    assert_eq!(left(&tiers, &limit).await, 550);
}

#[tokio::test]
async fn a_client_that_goes_away_pays_for_what_was_streamed() {
    let tiers = tiers();
    let limit = tokens(Settle::from_usage());
    let layer = TierLimitLayer::new(tiers.clone())
        .identifier_fn(|_| Some(TierIdentity::new("ana", "free")))
        .limit(limit.clone());
    let service = layer.layer(service_fn(|request: Request<()>| async move {
        let usage = request.extensions().get::<Usage>().unwrap().clone();
        let frames: Vec<Frame<Bytes>> = (0..5)
            .map(|i| Frame::data(Bytes::from(format!("chunk {i}\n"))))
            .collect();
        // Generated (and counted) before the client left.
        usage.add(250);
        Ok::<_, Infallible>(Frames::response(frames))
    }));
    let response = service.oneshot(request()).await.unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "chunk 0\n");
    drop(body);
    assert_eq!(left(&tiers, &limit).await, 750, "settled when dropped");
}
