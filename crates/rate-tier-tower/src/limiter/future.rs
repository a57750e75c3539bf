//! [`CheckFuture`]: a decision as a small lazy future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use smallvec::SmallVec;

use super::decide::{Ask, Failed, Prepared, Ruling};
use super::{AskFor, RateTier};
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
    tiers: &'a RateTier,
    /// [`RateTier::check`]'s user, tier and cost, beside the state rather
    /// than in it: the common path builds and reads plain fields, and no
    /// [`Ask`] is built, moved or dropped.
    user: &'a str,
    tier: &'a str,
    cost: u32,
    state: State<'a>,
}

/// Small on purpose: a future is moved (pinned, returned) before it is
/// polled, and every byte of it is copied each time.
enum State<'a> {
    /// [`RateTier::check`]: the plan's limit alone, from the fields above.
    Plan,
    /// [`RateTier::decide`]: the request, read when polled.
    Request(&'a (dyn AskFor<'a> + Sync + 'a)),
    /// A cost of 0 to [`RateTier::check`].
    ZeroCost,
    Remote(Pin<Box<dyn Future<Output = Output> + Send + 'a>>),
    Done,
}

impl fmt::Debug for CheckFuture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Plan | State::Request(_) => "start",
            State::ZeroCost => "failed",
            State::Remote(_) => "waiting for the store",
            State::Done => "done",
        };
        f.debug_struct("CheckFuture")
            .field("state", &state)
            .finish()
    }
}

impl<'a> CheckFuture<'a> {
    pub(super) fn plan(
        tiers: &'a RateTier,
        user: &'a str,
        tier: &'a str,
        cost: u32,
    ) -> Self {
        CheckFuture {
            tiers,
            user,
            tier,
            cost,
            state: State::Plan,
        }
    }

    pub(super) fn request(
        tiers: &'a RateTier,
        request: &'a (dyn AskFor<'a> + Sync + 'a),
    ) -> Self {
        CheckFuture {
            tiers,
            user: "",
            tier: "",
            cost: 0,
            state: State::Request(request),
        }
    }

    pub(super) fn zero_cost(tiers: &'a RateTier) -> Self {
        CheckFuture {
            tiers,
            user: "",
            tier: "",
            cost: 0,
            state: State::ZeroCost,
        }
    }
}

impl Future for CheckFuture<'_> {
    type Output = Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Output> {
        let this = &mut *self;
        // The common case first, on its own: the plan's limit alone,
        // nobody to tell, an in-process store.
        let (tiers, user, tier, cost) =
            (this.tiers, this.user, this.tier, this.cost);
        if matches!(this.state, State::Plan)
            && !tiers.observed()
            && !tiers.listening()
        {
            // `Plan` holds nothing to drop: forgetting it spares a call to
            // the drop glue of every state.
            std::mem::forget(std::mem::replace(&mut this.state, State::Done));
            let mut failed = None;
            if let Some(decided) =
                tiers.decide_plan_now(user, tier, cost, None, &mut failed)
            {
                return Poll::Ready(Ok(decided.outcome()));
            }
            if let Some(failed) = failed {
                return Poll::Ready(failed_answer(tiers, tier, cost, failed));
            }
            this.state = State::Plan;
        }
        // `decide` and nobody to tell: its own path too.
        if let State::Request(request) = this.state
            && let Some(decided) = request.decide_quiet(this.tiers)
        {
            this.state = State::Done;
            return Poll::Ready(Ok(decided));
        }
        this.poll_slow(cx)
    }
}

/// The answer to a store's failure on the common path.
#[cold]
#[inline(never)]
fn failed_answer(
    tiers: &RateTier,
    tier: &str,
    cost: u32,
    failed: Failed,
) -> Output {
    let (ruling, by) = tiers.failed_ruling(failed, None);
    answer(tiers, tier, cost, ruling, by, None)
}

impl CheckFuture<'_> {
    /// Everything but the common case: observers or listeners to tell,
    /// other limits, a store that fails or needs I/O.
    #[inline(never)]
    fn poll_slow(&mut self, cx: &mut Context<'_>) -> Poll<Output> {
        let tiers = self.tiers;
        let ask = match std::mem::replace(&mut self.state, State::Done) {
            State::Plan => Ask {
                identity: Some((self.user, self.tier)),
                cost: self.cost,
                extra: SmallVec::new(),
                shadow: false,
            },
            State::Request(request) => request.ask(),
            State::ZeroCost => return Poll::Ready(Err(Error::ZeroCost)),
            State::Remote(mut remote) => {
                let output = remote.as_mut().poll(cx);
                if output.is_pending() {
                    self.state = State::Remote(remote);
                }
                return output;
            }
            State::Done => panic!("`CheckFuture` polled after completion"),
        };
        let started = tiers.observed().then(Instant::now);
        let emit = |event: LimitEvent| tiers.emit(|| event);
        let emit = tiers
            .listening()
            .then_some(&emit as &(dyn Fn(LimitEvent) + Sync));
        let tier = ask.identity.map_or("", |(_, tier)| tier);
        // The plan's limit alone: its own path, the tier looked up once.
        if let (Some((user, _)), [], false) =
            (ask.identity, ask.extra.as_slice(), ask.shadow)
        {
            let mut failed = None;
            let decided =
                tiers.decide_plan_now(user, tier, ask.cost, emit, &mut failed);
            let judged = match (decided, failed) {
                (Some(decided), _) => Some((decided.into_ruling(), decided.by)),
                (None, Some(failed)) => Some(tiers.failed_ruling(failed, emit)),
                (None, None) => None,
            };
            if let Some((ruling, by)) = judged {
                return Poll::Ready(answer(
                    tiers, tier, ask.cost, ruling, by, started,
                ));
            }
        }
        let prepared = match tiers.prepare(&ask, emit) {
            Ok(prepared) => prepared,
            Err(ruling) => {
                return Poll::Ready(answer(
                    tiers, tier, ask.cost, ruling, "none", started,
                ));
            }
        };
        if let Some((ruling, by)) = tiers.decide_local(&prepared, emit) {
            return Poll::Ready(answer(
                tiers, tier, ask.cost, ruling, by, started,
            ));
        }
        self.state =
            State::Remote(Box::pin(remote(tiers, ask, prepared, started)));
        self.poll_slow(cx)
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
    let tier = ask.identity.map_or("", |(_, tier)| tier);
    answer(tiers, tier, ask.cost, ruling, by, started)
}

/// The direct API's answer to a ruling on a request for `tier` (the
/// claimed one) at `cost`, reported to the limiter's observers.
fn answer(
    tiers: &RateTier,
    tier: &str,
    cost: u32,
    ruling: Ruling,
    by: &'static str,
    started: Option<Instant>,
) -> Output {
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
        Ruling::Unlimited => Ok(Ok(RateLimitInfo::unlimited(
            tier,
            cost,
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
