//! [`CheckFuture`]: a decision as a small lazy future, driving
//! [`RateTier::step`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use super::RateTier;
use super::ask::Ask;
use super::ruling::{Events, Judged, Ruling};
use super::step::{Failed, Step};
use crate::error::Error;
use crate::observe::Checked;
use crate::outcome::{Admitted, Limited, RateLimitInfo};

/// What a decision answers the direct API.
pub(super) type Output = Result<Result<Admitted, Limited>, Error>;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The future of [`RateTier::check`] and [`RateTier::decide`].
///
/// Small and lazy: nothing is decided before it is polled. With an
/// in-process store the first poll decides (no allocation, no await); only
/// a store that needs I/O puts the rest of the work in a boxed future.
/// Like any future, it must not be polled after it completed: it panics.
///
/// ```
/// use tower_rate_tier::{Quota, RateTier};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
/// let future = limiter.check("ana", "free", 1);
/// // Nothing is charged before the future is polled.
/// assert_eq!(limiter.peek("ana", "free").await.unwrap().remaining, 10);
/// assert_eq!(future.await.unwrap().unwrap().remaining, 9);
/// # }
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct CheckFuture<'a> {
    tiers: &'a RateTier,
    state: State<'a>,
}

enum State<'a> {
    /// [`RateTier::check`], not polled yet: the tier alone.
    Tier {
        user: &'a str,
        tier: &'a str,
        cost: u32,
    },
    /// [`RateTier::decide`], not polled yet: what the decision is asked.
    Start(Ask<'a>),
    Remote(BoxFuture<'a, Output>),
    Done,
}

impl fmt::Debug for CheckFuture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Tier { .. } | State::Start(_) => "start",
            State::Remote(_) => "waiting for the store",
            State::Done => "done",
        };
        f.debug_struct("CheckFuture")
            .field("state", &state)
            .finish()
    }
}

impl<'a> CheckFuture<'a> {
    /// [`RateTier::check`] of `user` on `tier` at `cost`.
    #[inline]
    pub(super) fn tier(
        tiers: &'a RateTier,
        user: &'a str,
        tier: &'a str,
        cost: u32,
    ) -> Self {
        CheckFuture {
            tiers,
            state: State::Tier { user, tier, cost },
        }
    }

    /// [`RateTier::decide`] of what `ask` asks.
    #[inline]
    pub(super) fn asking(tiers: &'a RateTier, ask: Ask<'a>) -> Self {
        CheckFuture {
            tiers,
            state: State::Start(ask),
        }
    }
}

impl Future for CheckFuture<'_> {
    type Output = Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Output> {
        let this = &mut *self;
        let tiers = this.tiers;
        let ask = match this.state {
            State::Tier { user, tier, cost } => {
                // Neither start state holds anything to drop: overwriting
                // it skips the drop glue of every state.
                this.state = State::Done;
                if cost == 0 {
                    return Poll::Ready(Err(Error::ZeroCost));
                }
                if let Some(answered) =
                    tiers.tier_alone_answer(user, tier, cost)
                {
                    return Poll::Ready(answered);
                }
                Ask::plan(user, tier, cost)
            }
            State::Start(ask) => {
                this.state = State::Done;
                if let Some(answered) = tiers.tier_answer(&ask) {
                    return Poll::Ready(answered);
                }
                ask
            }
            State::Remote(ref mut remote) => {
                let output = remote.as_mut().poll(cx);
                if output.is_ready() {
                    this.state = State::Done;
                }
                return output;
            }
            State::Done => panic!("`CheckFuture` polled after completion"),
        };
        let started = tiers.observed().then(Instant::now);
        let events = Events::new(tiers.listening());
        let (tier, cost) = (ask.tier(), ask.cost);
        match tiers.step(&ask, events) {
            Step::Ruled(judged) => {
                Poll::Ready(answer(tiers, tier, cost, judged, started))
            }
            Step::Pending { pending, events } => {
                tiers.report(events);
                this.state = State::Remote(Box::pin(async move {
                    let judged = pending.finish(tiers).await;
                    answer(tiers, tier, cost, judged, started)
                }));
                self.poll(cx)
            }
        }
    }
}
/// The direct API's answer to a store's failure on the tier's own path,
/// for a request for `tier` (the claimed one) at `cost`.
#[cold]
#[inline(never)]
pub(super) fn failed_output(
    tiers: &RateTier,
    tier: &str,
    cost: u32,
    failed: Failed,
) -> Output {
    let judged = tiers.failed_judged(failed);
    answer(tiers, tier, cost, judged, None)
}

/// The direct API's answer to a decision on a request for `tier` (the
/// claimed one) at `cost`, its events reported to the limiter's listeners
/// and the check to its observers.
#[inline(always)]
fn answer(
    tiers: &RateTier,
    tier: &str,
    cost: u32,
    judged: Judged,
    started: Option<Instant>,
) -> Output {
    let Judged { ruling, by, events } = judged;
    if events.listening() {
        tiers.report(events);
    }
    if let Some(started) = started {
        tiers.checked(&Checked {
            tier: ruling.tier(),
            outcome: ruling.outcome(),
            cost,
            storage: by,
            elapsed: started.elapsed(),
        });
    }
    match ruling {
        Ruling::Allowed(info) => Ok(Ok(info)),
        Ruling::Limited(limited) => Ok(Err(limited)),
        ruling => unusual(tiers, tier, cost, ruling),
    }
}

/// Every answer but a pass or a refusal by a limit.
#[cold]
#[inline(never)]
fn unusual(tiers: &RateTier, tier: &str, cost: u32, ruling: Ruling) -> Output {
    match ruling {
        Ruling::Allowed(info) => Ok(Ok(info)),
        Ruling::Limited(limited) => Ok(Err(limited)),
        Ruling::Unlimited => Ok(Ok(Admitted::new(RateLimitInfo::unlimited(
            tier,
            cost,
            tiers.inner.clock.now_us(),
        )))),
        Ruling::Unavailable {
            error: Some(error), ..
        } => Err(Error::Storage(error)),
        Ruling::Denied(_) | Ruling::Unavailable { error: None, .. } => {
            Err(Error::NoIdentity)
        }
        Ruling::Invalid(error) => Err(error),
    }
}
