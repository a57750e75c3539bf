//! What the memory hot-path benchmarks share (check.rs, instructions.rs,
//! limits.rs, observe.rs): the same limiters, ids and polling, so that
//! each compares the same work.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use governor::{Quota as GovQuota, RateLimiter};
use tower_rate_tier::{Quota, RateTier};

/// Polls a future that completes without waiting (the memory path).
/// Inlined: the future is built where it is polled, as `.await` builds it
/// in place, rather than copied into this function first.
#[inline(always)]
pub(crate) fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the memory path never waits"),
    }
}

/// Ours, on the default memory store. A quota that mostly allows, like
/// governor's below: both do the same work (read, decide, write) on every
/// call.
pub(crate) fn ours() -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_second(1_000_000))
        .build()
}

pub(crate) type Governor = governor::DefaultKeyedRateLimiter<String>;

/// governor's keyed limiter with the same quota.
pub(crate) fn governor() -> Governor {
    RateLimiter::keyed(GovQuota::per_second(
        NonZeroU32::new(1_000_000).unwrap(),
    ))
}

/// `count` distinct user ids.
pub(crate) fn user_ids(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("user-{i:08}")).collect()
}
