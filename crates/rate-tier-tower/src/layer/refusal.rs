//! How a refused request is answered: a strategy the service is generic
//! over, so that one service serves HTTP and gRPC alike.

use http::{Response, StatusCode};

use super::response;
use crate::headers::HeaderStyle;
use crate::outcome::Limited;

/// Why a request is refused, as a [`Refusal`] answers it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Refused<'a> {
    /// A limit refused (429, [`LimitReason::RateLimited`](crate::LimitReason)),
    /// a cost can never pass (403), or an unknown tier is denied (403).
    Limited(&'a Limited),
    /// No identity, and [`OnMissing::Deny`](crate::OnMissing::Deny) with
    /// this status.
    NoIdentity(StatusCode),
    /// The store or the identity lookup failed, and its policy refuses with
    /// this status: transient, retry after 1 s.
    Unavailable(StatusCode),
    /// A bug (the cost function returned 0) or a broken clock: 500, with a
    /// message.
    Invalid(&'static str),
}

/// Answers refused requests for a [`TierLimit`](super::TierLimit): the
/// strategy that makes one service serve HTTP ([`HttpRefusal`]) and gRPC
/// (`GrpcRefusal`, feature `grpc`). Implement it to answer
/// refusals your own way (a problem+json body, say).
///
/// ```
/// use http::{Response, StatusCode};
/// use tower_rate_tier::layer::{HeaderStyle, Refusal, Refused};
///
/// /// Every refusal as a bare status, no body.
/// struct Bare;
///
/// impl Refusal<String> for Bare {
///     fn refuse(refused: Refused<'_>, _style: HeaderStyle) -> Response<String> {
///         let status = match refused {
///             Refused::Limited(limited) if limited.can_retry() => StatusCode::TOO_MANY_REQUESTS,
///             Refused::Limited(_) => StatusCode::FORBIDDEN,
///             Refused::NoIdentity(status) | Refused::Unavailable(status) => status,
///             _ => StatusCode::INTERNAL_SERVER_ERROR,
///         };
///         let mut response = Response::new(String::new());
///         *response.status_mut() = status;
///         response
///     }
/// }
/// ```
pub trait Refusal<B>: Send + Sync + 'static {
    /// The response to a refused request; the inner service is not called.
    fn refuse(refused: Refused<'_>, style: HeaderStyle) -> Response<B>;
}

/// HTTP refusals: a JSON body, 429 with `retry-after` and the rate-limit
/// headers, 403 when no wait helps (see the [module docs](super)).
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct HttpRefusal;

impl<B: From<String>> Refusal<B> for HttpRefusal {
    fn refuse(refused: Refused<'_>, style: HeaderStyle) -> Response<B> {
        match refused {
            Refused::Limited(limited) => {
                response::limited_response_with(limited, style)
            }
            Refused::NoIdentity(status) => {
                response::error(status, "identity required")
            }
            Refused::Unavailable(status) => response::unavailable(status),
            Refused::Invalid(message) => {
                response::error(StatusCode::INTERNAL_SERVER_ERROR, message)
            }
        }
    }
}
