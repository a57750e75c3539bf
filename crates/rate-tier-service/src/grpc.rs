//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` on tonic.
//!
//! The method is served here rather than by the server `envoy-types`
//! generates, for two reasons: the request is decoded with its strings as
//! bytes ([`WireRequest`](crate::wire::WireRequest)), so that a header
//! value that is not UTF-8 is a bucket like any other instead of an
//! undecodable request (see [`wire`](crate::wire)); and it is read within
//! the [`RequestLimits`] (its length, then its descriptors counted, before
//! anything is decoded: [`read_request`]). The response is Envoy's own
//! message.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use prost::bytes::Buf;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::codegen::{BoxFuture, StdError};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstEncoder;

use crate::decide::{DecideError, Decider, Incoming, RequestLimits};
use crate::wire::read_request;

/// The hard cap on what is read of a request message (on `/json`, of a
/// body): twice Envoy's own largest request headers
/// (`max_request_headers_kb`, at most 8 MiB), so that nothing Envoy can
/// send goes unanswered. A request between
/// [`RequestLimits::max_request_bytes`] and this is read but never decoded,
/// and answered `OVER_LIMIT` (refused, never an error); beyond it tonic
/// refuses it (`OUT_OF_RANGE`).
pub const DECODE_CAP_BYTES: usize = 16 * 1024 * 1024;

/// The gRPC method's full path.
pub const SHOULD_RATE_LIMIT: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The gRPC service: [`Decider`] behind tonic, as
/// `envoy.service.ratelimit.v3.RateLimitService`.
///
/// ```
/// use tonic::server::NamedService;
/// assert_eq!(
///     rate_tier_service::grpc::RlsService::NAME,
///     "envoy.service.ratelimit.v3.RateLimitService"
/// );
/// ```
#[derive(Debug, Clone)]
pub struct RlsService {
    decider: Arc<Decider>,
}

impl RlsService {
    /// The service over `decider`.
    pub fn new(decider: Arc<Decider>) -> Self {
        RlsService { decider }
    }
}

impl NamedService for RlsService {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

/// Turns tonic's answer to a request it could not decode (`INTERNAL`,
/// "failed to decode Protobuf message": a malformed message) into
/// `INVALID_ARGUMENT`: the caller sent it, the server is fine. The message
/// is kept.
pub fn undecodable_is_invalid_argument(
    mut response: http::Response<Body>,
) -> http::Response<Body> {
    let headers = response.headers_mut();
    let internal = headers.get("grpc-status").is_some_and(|v| v == "13");
    let undecodable = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .is_some_and(|m| {
            m.starts_with("failed%20to%20decode")
                || m.starts_with("failed to decode")
        });
    if internal && undecodable {
        headers.insert("grpc-status", http::HeaderValue::from_static("3"));
    }
    response
}

/// A [`DecideError`] as a gRPC status: `INVALID_ARGUMENT`, or
/// `UNAVAILABLE` when the store gave no decision.
pub fn status_of(error: &DecideError) -> Status {
    match error {
        DecideError::InvalidArgument(message) => {
            Status::invalid_argument(message.clone())
        }
        DecideError::Store(_) => Status::unavailable(error.to_string()),
    }
}

/// The method's codec: Envoy's response out; in, the request read within
/// the [`RequestLimits`] ([`read_request`]).
struct RlsCodec(RequestLimits);

impl Codec for RlsCodec {
    type Encode = RateLimitResponse;
    type Decode = Incoming;
    type Encoder = ProstEncoder<RateLimitResponse>;
    type Decoder = BoundedDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        BoundedDecoder(self.0)
    }
}

/// [`read_request`] of each message: a malformed one is
/// `INVALID_ARGUMENT`; one beyond a bound is [`Incoming::Oversized`],
/// refused by the method, never an error.
struct BoundedDecoder(RequestLimits);

impl Decoder for BoundedDecoder {
    type Item = Incoming;
    type Error = Status;

    fn decode(
        &mut self,
        buf: &mut DecodeBuf<'_>,
    ) -> Result<Option<Incoming>, Status> {
        // The whole message, without a copy (the buffer is contiguous).
        let message = buf.copy_to_bytes(buf.remaining());
        read_request(&message, self.0)
            .map(Some)
            .map_err(|error| Status::invalid_argument(error.to_string()))
    }
}

/// The unary method.
struct ShouldRateLimit(Arc<Decider>);

impl UnaryService<Incoming> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<Incoming>) -> Self::Future {
        let decider = self.0.clone();
        Box::pin(async move {
            // Beyond a bound: refused, never an error (a gateway that fails
            // open would let an error through, past every limit).
            match decider.answer(request.get_ref(), "grpc").await {
                Ok(response) => Ok(Response::new(response)),
                Err(error) => {
                    if let DecideError::Store(store) = &error {
                        tracing::warn!(error = %store, "no decision from the store");
                    }
                    Err(status_of(&error))
                }
            }
        })
    }
}

impl<B> tower::Service<http::Request<B>> for RlsService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _cx: &mut Context<'_>,
    ) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            return Box::pin(async {
                Ok(Status::unimplemented("no such method").into_http())
            });
        }
        let method = ShouldRateLimit(self.decider.clone());
        let codec = RlsCodec(self.decider.options().limits);
        Box::pin(async move {
            let mut grpc = Grpc::new(codec)
                .apply_max_message_size_config(Some(DECODE_CAP_BYTES), None);
            Ok(grpc.unary(method, request).await)
        })
    }
}
