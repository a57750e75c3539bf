//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` on tonic.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use tonic::{Request, Response, Status};

use crate::decide::{DecideError, Decider};

/// The hard cap tonic applies to a request message before it is decoded,
/// above [`RequestLimits::max_request_bytes`](crate::RequestLimits): a
/// request between the two is refused with `INVALID_ARGUMENT` and a clear
/// message; beyond this one tonic refuses it (`OUT_OF_RANGE`).
pub const DECODE_CAP_BYTES: usize = 4 * 1024 * 1024;

/// The gRPC service: [`Decider`] behind tonic.
#[derive(Debug, Clone)]
pub struct RlsService {
    decider: Arc<Decider>,
}

impl RlsService {
    /// The service over `decider`.
    pub fn new(decider: Arc<Decider>) -> Self {
        RlsService { decider }
    }

    /// The tonic server of this service, with the decode cap set.
    pub fn into_server(self) -> RateLimitServiceServer<RlsService> {
        let cap = DECODE_CAP_BYTES
            .max(self.decider.options().limits.max_request_bytes);
        RateLimitServiceServer::new(self).max_decoding_message_size(cap)
    }
}

/// Turns tonic's answer to a request it could not decode (`INTERNAL`,
/// "failed to decode Protobuf message": a string that is not UTF-8, a
/// malformed message) into `INVALID_ARGUMENT`: the caller sent it, the
/// server is fine. The message is kept.
pub fn undecodable_is_invalid_argument(
    mut response: http::Response<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
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

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        let max = self.decider.options().limits.max_request_bytes;
        let size = request.encoded_len();
        if size > max {
            self.decider.metrics().call("grpc", "invalid_argument");
            return Err(Status::invalid_argument(format!(
                "the request is {size} bytes; at most {max} are accepted"
            )));
        }
        match self.decider.decide(&request, "grpc").await {
            Ok(response) => Ok(Response::new(response)),
            Err(error) => {
                if let DecideError::Store(store) = &error {
                    tracing::warn!(error = %store, "no decision from the store");
                }
                Err(status_of(&error))
            }
        }
    }
}
