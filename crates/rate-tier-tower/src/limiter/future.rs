//! [`CheckFuture`]: a decision as a small lazy future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use super::RateTier;
use super::decide::{Ask, Prepared, Ruling};
use crate::error::Error;
use crate::event::LimitEvent;
use crate::observe::Checked;
use crate::outcome::{Limited, RateLimitInfo};

type Output = Result<Result<RateLimitInfo, Limited>, Error>;

/// The future of [`RateTier::check`] and [`RateTier::decide`].
///
/// Small and lazy: nothing is decided before it is polled. With an
/// in-process store the first poll decides (no allocation, no await); only
/// a store that needs I/O puts the rest of the work in a boxed future.
/// Like any future, it must not be polled after it completed: it panics.
#[must_use = "futures do nothing unless polled"]
pub struct CheckFuture<'a> {
    state: State<'a>,
}

enum State<'a> {
    Start { tiers: &'a RateTier, ask: Ask<'a> },
    Failed(Error),
    Remote(Pin<Box<dyn Future<Output = Output> + Send + 'a>>),
    Done,
}

impl fmt::Debug for CheckFuture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Start { .. } => "start",
            State::Failed(_) => "failed",
            State::Remote(_) => "waiting for the store",
            State::Done => "done",
        };
        f.debug_struct("CheckFuture")
            .field("state", &state)
            .finish()
    }
}

impl<'a> CheckFuture<'a> {
    pub(super) fn new(tiers: &'a RateTier, ask: Ask<'a>) -> Self {
        CheckFuture {
            state: State::Start { tiers, ask },
        }
    }

    pub(super) fn failed(_tiers: &'a RateTier, error: Error) -> Self {
        CheckFuture {
            state: State::Failed(error),
        }
    }
}

impl Future for CheckFuture<'_> {
    type Output = Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Output> {
        let this = &mut *self;
        match std::mem::replace(&mut this.state, State::Done) {
            State::Start { tiers, ask } => {
                let started = tiers.observed().then(Instant::now);
                let emit = |event: LimitEvent| tiers.emit(|| event);
                let emit = tiers
                    .listening()
                    .then_some(&emit as &(dyn Fn(LimitEvent) + Sync));
                if let (Some((user, tier)), [], false) =
                    (ask.identity, ask.extra.as_slice(), ask.shadow)
                    && let Some((ruling, by)) =
                        tiers.decide_plan_now(user, tier, ask.cost, emit)
                {
                    return Poll::Ready(answer(
                        tiers, &ask, ruling, by, started,
                    ));
                }
                let prepared = match tiers.prepare(&ask, emit) {
                    Ok(prepared) => prepared,
                    Err(ruling) => {
                        return Poll::Ready(answer(
                            tiers, &ask, ruling, "none", started,
                        ));
                    }
                };
                if let Some((ruling, by)) = tiers.decide_local(&prepared, emit)
                {
                    return Poll::Ready(answer(
                        tiers, &ask, ruling, by, started,
                    ));
                }
                this.state = State::Remote(Box::pin(remote(
                    tiers, ask, prepared, started,
                )));
                self.poll(cx)
            }
            State::Failed(error) => Poll::Ready(Err(error)),
            State::Remote(mut remote) => match remote.as_mut().poll(cx) {
                Poll::Ready(output) => Poll::Ready(output),
                Poll::Pending => {
                    this.state = State::Remote(remote);
                    Poll::Pending
                }
            },
            State::Done => panic!("`CheckFuture` polled after completion"),
        }
    }
}

async fn remote<'a>(
    tiers: &'a RateTier,
    ask: Ask<'a>,
    prepared: Prepared<'a>,
    started: Option<Instant>,
) -> Output {
    let emit = |event: LimitEvent| tiers.emit(|| event);
    let emit = tiers
        .listening()
        .then_some(&emit as &(dyn Fn(LimitEvent) + Sync));
    let (ruling, by) = tiers.decide_remote(&prepared, emit).await;
    answer(tiers, &ask, ruling, by, started)
}

/// The direct API's answer to a ruling, reported to the limiter's
/// observers.
fn answer(
    tiers: &RateTier,
    ask: &Ask<'_>,
    ruling: Ruling,
    by: &'static str,
    started: Option<Instant>,
) -> Output {
    if let Some(started) = started {
        tiers.checked(&Checked {
            tier: ruling.tier(),
            outcome: ruling.outcome(),
            cost: ask.cost,
            storage: by,
            elapsed: started.elapsed(),
        });
    }
    let tier = ask.identity.map_or("", |(_, tier)| tier);
    match ruling {
        Ruling::Allowed(info) => Ok(Ok(info)),
        Ruling::Unlimited => Ok(Ok(RateLimitInfo::unlimited(
            tier,
            ask.cost,
            tiers.inner.clock.now_us(),
        ))),
        Ruling::Limited(limited) => Ok(Err(limited)),
        Ruling::Unavailable {
            error: Some(error), ..
        } => Err(Error::Storage(error)),
        Ruling::Denied(_) | Ruling::Unavailable { error: None, .. } => {
            Err(Error::NoIdentity)
        }
        Ruling::Invalid(error) => Err(error),
    }
}
