//! [`Answer`]: a store's answer, ready or pending.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use super::StorageError;

/// A store's answer: ready when it decided without I/O, pending when it
/// must wait on a backend. Either is a future: `.await` it.
///
/// ```
/// use rate_tier_storage::{Answer, StorageError};
/// let ready: Answer<'_, u32> = Answer::Ready(Ok(7));
/// assert!(matches!(ready.ready(), Some(Ok(7))));
/// # let pending: Answer<'_, u32> = Answer::pending(async { Ok(7) });
/// # assert!(pending.ready().is_none());
/// ```
pub enum Answer<'a, T> {
    /// Decided without I/O.
    Ready(Result<T, StorageError>),
    /// Decided when the future completes.
    Pending(Pin<Box<dyn Future<Output = Result<T, StorageError>> + Send + 'a>>),
}

impl<'a, T> Answer<'a, T> {
    /// An answer that waits on `future`.
    pub fn pending(
        future: impl Future<Output = Result<T, StorageError>> + Send + 'a,
    ) -> Self {
        Answer::Pending(Box::pin(future))
    }

    /// The answer if the store decided without I/O; `None` (the pending
    /// future dropped, which a store must bear) otherwise.
    #[inline]
    pub fn ready(self) -> Option<Result<T, StorageError>> {
        match self {
            Answer::Ready(result) => Some(result),
            Answer::Pending(_) => None,
        }
    }

    /// Whether the store decided without I/O.
    pub fn is_ready(&self) -> bool {
        matches!(self, Answer::Ready(_))
    }
}

// The result is moved out whole, never pinned in place.
impl<T> Unpin for Answer<'_, T> {}

impl<T> Future for Answer<'_, T> {
    type Output = Result<T, StorageError>;

    fn poll(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.get_mut();
        if let Answer::Pending(future) = this {
            return future.as_mut().poll(cx);
        }
        let done = StorageError::Protocol(
            "an answer polled after it was ready".into(),
        );
        match std::mem::replace(this, Answer::Ready(Err(done))) {
            Answer::Ready(result) => std::task::Poll::Ready(result),
            Answer::Pending(_) => unreachable!("matched above"),
        }
    }
}

impl<T> fmt::Debug for Answer<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Answer::Ready(_) => "Answer::Ready",
            Answer::Pending(_) => "Answer::Pending",
        })
    }
}
