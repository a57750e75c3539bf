//! [`LimitBody`]: the response body, watched for its end.
//!
//! What a request leaves for after its response is done when the body
//! ends, not when its head is ready: a streamed answer (server-sent
//! events, a gRPC stream) reports what it cost at its end (a trailer, or a
//! [`Usage`](crate::Usage) meter its handler filled). The end is the body's
//! last frame, an error, or the body dropped (the client went away), once.
//! A body with nothing to do after it is the inner body, passed through.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use std::sync::Arc;

use super::settle::{self, BoxFuture, Finish};
use crate::limiter::slots::Slots;

pin_project! {
    /// The body of a response through [`TierLimit`](super::TierLimit): the
    /// inner service's body (or a refusal's), and what is left to do when
    /// it ends. Its data and errors are the inner body's.
    ///
    /// ```
    /// use http_body_util::{BodyExt, Full};
    /// use tower_rate_tier::layer::LimitBody;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let body = LimitBody::new(Full::new(bytes::Bytes::from("hi")));
    /// assert_eq!(body.collect().await.unwrap().to_bytes(), "hi");
    /// # }
    /// ```
    pub struct LimitBody<B: Body> {
        #[pin]
        inner: B,
        // Boxed: rare, and the body is moved on every response.
        finish: Option<Box<Finish>>,
        settling: Option<BoxFuture<()>>,
        // The last frame, held until the settlement is made: a client that
        // has the whole body sees the settlement's effect.
        held: Option<Frame<B::Data>>,
        // The slots of concurrency limits the request holds: given back
        // when the body ends, fails or is dropped.
        slots: Option<Arc<Slots>>,
    }

    impl<B: Body> PinnedDrop for LimitBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(finish) = this.finish.take() {
                finish.abandon();
            }
            if let Some(settling) = this.settling.take() {
                settle::spawn(settling);
            }
        }
    }
}

impl<B: Body + std::fmt::Debug> std::fmt::Debug for LimitBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimitBody")
            .field("inner", &self.inner)
            .field(
                "pending",
                &(self.finish.is_some() || self.settling.is_some()),
            )
            .finish()
    }
}

impl<B: Body> LimitBody<B> {
    /// `inner`, with nothing to do at its end.
    pub fn new(inner: B) -> Self {
        LimitBody {
            inner,
            finish: None,
            settling: None,
            held: None,
            slots: None,
        }
    }

    /// The inner body.
    ///
    /// ```
    /// let body = tower_rate_tier::layer::LimitBody::new(String::from("hi"));
    /// assert_eq!(body.get_ref(), "hi");
    /// ```
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// `inner`, settled by `finish` at its end.
    pub(super) fn finishing(inner: B, finish: Finish) -> Self {
        LimitBody {
            inner,
            finish: Some(Box::new(finish)),
            settling: None,
            held: None,
            slots: None,
        }
    }

    /// The same body, holding `slots` until it ends.
    pub(super) fn holding(mut self, slots: Option<Arc<Slots>>) -> Self {
        self.slots = slots;
        self
    }
}

impl<B: Body + Default> Default for LimitBody<B> {
    fn default() -> Self {
        LimitBody::new(B::default())
    }
}

impl<B: Body + From<String>> From<String> for LimitBody<B> {
    fn from(text: String) -> Self {
        LimitBody::new(B::from(text))
    }
}

impl<B> Body for LimitBody<B>
where
    B: Body,
    B::Data: Buf,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        loop {
            if let Some(settling) = this.settling.as_mut() {
                // The end (or the last frame), once the settlement is made.
                ready!(settling.as_mut().poll(cx));
                *this.settling = None;
                return Poll::Ready(this.held.take().map(Ok));
            }
            let polled = ready!(this.inner.as_mut().poll_frame(cx));
            if matches!(polled, None | Some(Err(_)))
                || this.inner.is_end_stream()
            {
                *this.slots = None;
            }
            let frame = match polled {
                Some(Ok(frame)) => frame,
                Some(Err(error)) => {
                    if let Some(finish) = this.finish.take() {
                        finish.abandon();
                    }
                    return Poll::Ready(Some(Err(error)));
                }
                None => match this.finish.take().and_then(|f| f.settle()) {
                    Some(settling) => {
                        *this.settling = Some(settling);
                        continue;
                    }
                    None => return Poll::Ready(None),
                },
            };
            let Some(finish) = this.finish.as_mut() else {
                return Poll::Ready(Some(Ok(frame)));
            };
            if let Some(trailers) = frame.trailers_ref() {
                finish.trailers(trailers);
            }
            if !this.inner.is_end_stream() {
                return Poll::Ready(Some(Ok(frame)));
            }
            // The last frame: settle first.
            match this.finish.take().and_then(|f| f.settle()) {
                Some(settling) => {
                    *this.held = Some(frame);
                    *this.settling = Some(settling);
                }
                None => return Poll::Ready(Some(Ok(frame))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Not before what waits for the end is done: polled once more.
        self.finish.is_none()
            && self.settling.is_none()
            && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
