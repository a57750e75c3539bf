//! `ShapeLayer` (src/shape.rs) around real clients, not `service_fn`s:
//! hyper-util's legacy `Client` calling a local HTTP server (axum), and a
//! tonic `Channel` under a gRPC client calling a local gRPC server (the
//! standard health service), each on a free loopback port, through a
//! memory store on Tokio's paused clock (the store reads the same clock).
//!
//! Paused, Tokio's clock jumps to the next timer whenever the runtime is
//! idle, even while a call waits on the network, so the times a server
//! sees are not the shaper's. Each call's departure is stamped where the shaper
//! hands it to the client (`map_request` between the two, which adds no
//! wait): exact on the paused clock. The server says which calls reached
//! it.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_rate_tier::clock::Clock;
use tower_rate_tier::{
    MemoryStorage, Quota, shape::ShapeError, shape::ShapeLayer,
};

/// The store's clock is Tokio's: paused, it moves only as timers fire.
#[derive(Debug)]
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now_us(&self) -> u64 {
        1_000_000_000 + self.0.elapsed().as_micros() as u64
    }
}

/// 10 a second, evenly: one call every 100 ms. With a longest wait of
/// 300 ms, 4 calls fired at once get slots at 0, 100, 200 and 300 ms; a
/// fifth would wait 400 ms.
fn shaper() -> ShapeLayer {
    let store = MemoryStorage::with_clock(TokioClock(Instant::now()));
    ShapeLayer::builder(Arc::new(store), "provider")
        .quota("per-second", Quota::per_second(10).allow_burst(1))
        .unwrap()
        .max_wait(Duration::from_millis(300))
        .build()
        .unwrap()
}

/// The calls fired at once: 4 get a slot, the fifth would wait too long.
const CALLS: u32 = 5;

/// When each call left the shaper, with its number.
#[derive(Clone, Default)]
struct Departures(Arc<Mutex<Vec<(Instant, u32)>>>);

impl Departures {
    fn note(&self, call: u32) {
        self.0.lock().unwrap().push((Instant::now(), call));
    }

    /// Each departure's ms after the first, in order, and the calls.
    fn spacing(&self) -> (Vec<u128>, Vec<u32>) {
        let mut departures = self.0.lock().unwrap().clone();
        departures.sort_unstable();
        let first = departures.first().map(|&(at, _)| at).unwrap();
        departures
            .iter()
            .map(|&(at, call)| ((at - first).as_millis(), call))
            .unzip()
    }
}

/// The calls a server received, by number.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<u32>>>);

impl Received {
    fn note(&self, call: u32) {
        self.0.lock().unwrap().push(call);
    }

    fn sorted(&self) -> Vec<u32> {
        let mut calls = self.0.lock().unwrap().clone();
        calls.sort_unstable();
        calls
    }
}

/// What the calls fired at once came to: the calls that went (sorted),
/// and the waits of those refused.
fn outcomes<E: std::fmt::Display>(
    results: Vec<(u32, Result<(), ShapeError<E>>)>,
) -> (Vec<u32>, Vec<(u32, Duration)>) {
    let mut went = Vec::new();
    let mut refused = Vec::new();
    for (call, result) in results {
        match result {
            Ok(()) => went.push(call),
            Err(ShapeError::WaitTooLong { wait, quota }) => {
                assert_eq!(quota, "per-second");
                refused.push((call, wait));
            }
            Err(other) => panic!("call {call}: {other}"),
        }
    }
    went.sort_unstable();
    (went, refused)
}

/// Asserts what 5 calls fired at once came to: 4 went out one interval
/// apart and reached the server, the fifth failed at once and did not.
fn assert_shaped(
    departures: &Departures,
    received: &Received,
    (went, refused): (Vec<u32>, Vec<(u32, Duration)>),
) {
    let (spacing, departed) = departures.spacing();
    assert_eq!(spacing, [0, 100, 200, 300], "one interval apart");
    assert_eq!(refused.len(), 1, "{refused:?}");
    let (refused_call, wait) = refused[0];
    assert_eq!(wait, Duration::from_millis(400));
    let mut departed = departed;
    departed.sort_unstable();
    assert_eq!(departed, went);
    assert_eq!(received.sorted(), went, "every call that went arrived");
    assert!(
        !received.sorted().contains(&refused_call),
        "the refused call {refused_call} reached the server"
    );
}

// ---------------------------------------------------------------------------
// hyper

/// An HTTP server on a free loopback port answering `GET /call/{n}` with
/// `n`, noting each call it receives.
async fn http_server(received: &Received) -> String {
    use axum::extract::Path;
    let received = received.clone();
    let router = axum::Router::new().route(
        "/call/{n}",
        axum::routing::get(move |Path(call): Path<u32>| async move {
            received.note(call);
            call.to_string()
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{address}")
}

#[tokio::test(start_paused = true)]
async fn a_hyper_client_sends_at_the_quota_and_a_call_that_would_wait_too_long_never_leaves()
 {
    let received = Received::default();
    let server = http_server(&received).await;
    let departures = Departures::default();
    let stamp = departures.clone();
    let client =
        Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let client = ServiceBuilder::new()
        .layer(shaper())
        .map_request(move |request: http::Request<Empty<Bytes>>| {
            let call = request.uri().path().trim_start_matches("/call/");
            stamp.note(call.parse().unwrap());
            request
        })
        .service(client);

    let calls: Vec<_> = (0..CALLS)
        .map(|call| {
            let mut client = client.clone();
            let uri = format!("{server}/call/{call}");
            tokio::spawn(async move {
                let request = http::Request::get(uri)
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                let response = client.ready().await?.call(request).await?;
                assert_eq!(response.status(), http::StatusCode::OK);
                let body = response.into_body().collect().await.unwrap();
                assert_eq!(body.to_bytes(), call.to_string());
                Ok(())
            })
        })
        .collect();
    let mut results = Vec::new();
    for (call, task) in (0..CALLS).zip(calls) {
        results.push((call, task.await.unwrap()));
    }
    assert_shaped(&departures, &received, outcomes(results));
}

// ---------------------------------------------------------------------------
// tonic

#[cfg(feature = "grpc")]
mod grpc {
    use std::task::{Context, Poll};

    use tonic::transport::server::TcpIncoming;
    use tonic::transport::{Endpoint, Server};
    use tonic::{Code, Request};
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    use super::*;

    /// The metadata that numbers a call.
    const CALL: &str = "x-call";

    /// The number of a call, from its metadata.
    fn call_of<B>(request: &http::Request<B>) -> u32 {
        request.headers()[CALL].to_str().unwrap().parse().unwrap()
    }

    /// The server's side: notes each call that reaches the service.
    #[derive(Clone)]
    struct Noting<S> {
        inner: S,
        received: Received,
    }

    impl<S: Service<http::Request<B>>, B> Service<http::Request<B>> for Noting<S> {
        type Response = S::Response;
        type Error = S::Error;
        type Future = S::Future;

        fn poll_ready(
            &mut self,
            cx: &mut Context<'_>,
        ) -> Poll<Result<(), S::Error>> {
            self.inner.poll_ready(cx)
        }

        fn call(&mut self, request: http::Request<B>) -> S::Future {
            self.received.note(call_of(&request));
            self.inner.call(request)
        }
    }

    /// The health service on a free loopback port, noting each call.
    async fn grpc_server(received: &Received) -> String {
        let (_reporter, health) = tonic_health::server::health_reporter();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let received = received.clone();
        let server = Server::builder()
            .layer(tower::layer::layer_fn(move |inner| Noting {
                inner,
                received: received.clone(),
            }))
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener));
        tokio::spawn(async move { server.await.unwrap() });
        format!("http://{address}")
    }

    #[tokio::test(start_paused = true)]
    async fn a_tonic_channel_sends_at_the_quota_and_a_call_that_would_wait_too_long_never_leaves()
     {
        let received = Received::default();
        let server = grpc_server(&received).await;
        let channel = Endpoint::from_shared(server)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let departures = Departures::default();
        let stamp = departures.clone();
        let channel = ServiceBuilder::new()
            .layer(shaper())
            .map_request(move |request: http::Request<tonic::body::Body>| {
                stamp.note(call_of(&request));
                request
            })
            .service(channel);
        let client = HealthClient::new(channel);

        let calls: Vec<_> = (0..CALLS)
            .map(|call| {
                let mut client = client.clone();
                tokio::spawn(async move {
                    let mut request = Request::new(HealthCheckRequest {
                        service: String::new(),
                    });
                    request
                        .metadata_mut()
                        .insert(CALL, call.to_string().parse().unwrap());
                    client.check(request).await
                })
            })
            .collect();
        let mut results = Vec::new();
        for (call, task) in (0..CALLS).zip(calls) {
            let result = match task.await.unwrap() {
                Ok(response) => {
                    assert_eq!(
                        response.into_inner().status(),
                        ServingStatus::Serving
                    );
                    Ok(())
                }
                // The shaper's error, as the gRPC client hands it back: an
                // UNKNOWN status with it as the source.
                Err(status) => {
                    assert_eq!(status.code(), Code::Unknown, "{status:?}");
                    let source = std::error::Error::source(&status)
                        .and_then(|source| {
                            source.downcast_ref::<ShapeError<tonic::transport::Error>>()
                        })
                        .unwrap_or_else(|| panic!("{status:?}"));
                    match source {
                        ShapeError::WaitTooLong { wait, quota } => {
                            Err(ShapeError::WaitTooLong {
                                wait: *wait,
                                quota: quota.clone(),
                            })
                        }
                        other => panic!("call {call}: {other}"),
                    }
                }
            };
            results.push((call, result));
        }
        assert_shaped(
            &departures,
            &received,
            outcomes::<tonic::transport::Error>(results),
        );
    }
}
