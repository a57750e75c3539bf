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

/// Ours, on the default memory store, with a quota that never refuses
/// here: 1 per µs and a burst of about 71 minutes, so a hot key checked
/// tens of millions of times a second never runs out and every call
/// reads, decides and writes (at a second's burst, nine calls in ten
/// would be refusals, which write nothing).
pub(crate) fn ours() -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_second(1_000_000).allow_burst(u32::MAX))
        .build()
}

pub(crate) type Governor = governor::DefaultKeyedRateLimiter<String>;

/// governor's keyed limiter with the same quota.
pub(crate) fn governor() -> Governor {
    RateLimiter::keyed(
        GovQuota::per_second(NonZeroU32::new(1_000_000).unwrap())
            .allow_burst(NonZeroU32::MAX),
    )
}

/// `count` distinct user ids.
pub(crate) fn user_ids(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("user-{i:08}")).collect()
}
