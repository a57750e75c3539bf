//! [`ResponseFuture`]: what a [`TierLimit`](super::TierLimit) returns, a
//! pin-projected state machine. A decision made in `call` (a header
//! identity and an in-process store) allocates nothing; only an async
//! identifier or a remote store puts the decision in a boxed future. What
//! waits for the end of the response (a settlement) rides in its body
//! ([`LimitBody`]).

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::LimitBody;
use super::config::Config;
use super::judge::{After, Judgement};
use super::refusal::Refusal;
use super::response;
use super::settle::BoxFuture;
use crate::headers::HeaderStyle;

/// A decision that needs I/O.
pub(super) enum Decision {
    /// The store's: the request's parts wait beside it.
    Store(BoxFuture<Judgement>),
    /// An async identifier's: the future holds the parts, and hands them
    /// back.
    Identify(BoxFuture<(Judgement, Parts)>),
}

impl Decision {
    fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<(Judgement, Option<Parts>)> {
        match self {
            Decision::Store(decision) => decision
                .as_mut()
                .poll(cx)
                .map(|judgement| (judgement, None)),
            Decision::Identify(decision) => decision
                .as_mut()
                .poll(cx)
                .map(|(judgement, parts)| (judgement, Some(parts))),
        }
    }
}

/// What a decision that needs I/O keeps for when it is made: boxed, so
/// that the common states keep the future small (it is moved on every
/// request, and boxed by routers).
struct Waiting<S, ReqBody> {
    config: Arc<Config>,
    inner: S,
    parts: Option<Parts>,
    body: ReqBody,
}

pin_project! {
    /// The response future of [`TierLimit`](super::TierLimit).
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, ReqBody, B, R>
    where
        S: Service<Request<ReqBody>, Response = Response<B>>,
        B: http_body::Body,
    {
        #[pin]
        state: State<S, S::Future, ReqBody, B>,
        headers: HeaderStyle,
        refusal: PhantomData<fn() -> R>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, F, ReqBody, B: http_body::Body> {
        /// The decision needs I/O (an async identifier, a remote store).
        Deciding {
            decision: Decision,
            waiting: Option<Box<Waiting<S, ReqBody>>>,
        },
        /// Passed: the inner service answers.
        Calling {
            #[pin]
            future: F,
            after: Option<After>,
        },
        /// Answered already (a refusal).
        Answered {
            response: Option<Response<LimitBody<B>>>,
        },
        Done,
    }
}

impl<S, ReqBody, B, R> ResponseFuture<S, ReqBody, B, R>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    B: http_body::Body,
    R: Refusal<B>,
{
    pub(super) fn deciding(
        config: Arc<Config>,
        decision: Decision,
        inner: S,
        parts: Option<Parts>,
        body: ReqBody,
    ) -> Self {
        let headers = config.headers;
        ResponseFuture {
            state: State::Deciding {
                decision,
                waiting: Some(Box::new(Waiting {
                    config,
                    inner,
                    parts,
                    body,
                })),
            },
            headers,
            refusal: PhantomData,
        }
    }

    pub(super) fn calling(
        headers: HeaderStyle,
        future: S::Future,
        after: After,
    ) -> Self {
        ResponseFuture {
            state: State::Calling {
                future,
                after: Some(after),
            },
            headers,
            refusal: PhantomData,
        }
    }

    pub(super) fn answered(
        headers: HeaderStyle,
        response: Response<B>,
    ) -> Self {
        ResponseFuture {
            state: State::Answered {
                response: Some(response.map(LimitBody::new)),
            },
            headers,
            refusal: PhantomData,
        }
    }
}

impl<S, ReqBody, B, R> Future for ResponseFuture<S, ReqBody, B, R>
where
    S: Service<Request<ReqBody>, Response = Response<B>>,
    B: http_body::Body,
    R: Refusal<B>,
{
    type Output = Result<Response<LimitBody<B>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Deciding { decision, waiting } => {
                    let (judgement, moved) = ready!(decision.poll(cx));
                    let Some(waiting) = waiting.take() else {
                        panic!("`ResponseFuture` polled after completion");
                    };
                    let Waiting {
                        config,
                        mut inner,
                        parts,
                        body,
                    } = *waiting;
                    let Some(mut parts) = moved.or(parts) else {
                        panic!("`ResponseFuture` polled after completion");
                    };
                    let respond = judgement
                        .respond::<R, _>(&config, &mut parts.extensions);
                    let next = match respond {
                        Ok(after) => State::Calling {
                            future: inner
                                .call(Request::from_parts(parts, body)),
                            after: Some(after),
                        },
                        Err(response) => State::Answered {
                            response: Some(response.map(LimitBody::new)),
                        },
                    };
                    this.state.set(next);
                }
                StateProj::Calling { future, after } => {
                    let mut response = ready!(future.poll(cx))?;
                    let Some(after) = after.take() else {
                        panic!("`ResponseFuture` polled after completion");
                    };
                    if let Some(info) = &after.info {
                        // Also on an error response of the inner service
                        // (a gRPC trailers-only status), left as it is.
                        response::insert_info_headers(
                            response.headers_mut(),
                            info,
                            *this.headers,
                        );
                    }
                    let (head, body) = response.into_parts();
                    let slots = after.info.and_then(|admitted| admitted.slots);
                    // What waits for the end of the body rides in it.
                    let body =
                        match after.settle.and_then(|s| s.at_head(&head)) {
                            Some(finish) => LimitBody::finishing(body, finish),
                            None => LimitBody::new(body),
                        }
                        .holding(slots);
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(Response::from_parts(head, body)));
                }
                StateProj::Answered { response } => {
                    let response = response.take();
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(response.unwrap_or_else(|| {
                        panic!("`ResponseFuture` polled after completion")
                    })));
                }
                StateProj::Done => {
                    panic!("`ResponseFuture` polled after completion")
                }
            }
        }
    }
}
