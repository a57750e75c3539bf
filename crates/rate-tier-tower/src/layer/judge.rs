//! From a request's parts to a [`Judgement`]: identity, costs, the limits
//! that apply, the limiter, and the reporting around them. Shared by every
//! protocol's service.
//!
//! With the `tracing` feature, each decision ends with a `DEBUG` event
//! (target `tower_rate_tier`) carrying tier, outcome, cost, storage and
//! elapsed µs; store failures, failed identity lookups and bad costs are
//! `WARN` events. When no subscriber wants `DEBUG`, the clock is not read for
//! it: one atomic load per request. No event carries a user id.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use http::Response;
use http::request::Parts;
use smallvec::SmallVec;

use super::cost::RouteCost;
use super::future::{After, BoxFuture};
use super::layer::{Config, Identifier};
use super::refusal::{Refusal, Refused};
use super::settle::{SettleItem, SettlePlan};
use crate::error::Error;
use crate::event::LimitEvent;
use crate::identity::TierIdentity;
use crate::limit::{LimitCost, Scope};
use crate::limiter::decide::{Ask, Emit, Extra, Prepared, Ruling, report};
use crate::observe::Checked;
use crate::outcome::{Limited, RateLimitInfo};
use crate::policy::OnIdentityError;

/// A request's decision, and what it leaves for after the response.
pub(crate) struct Judgement {
    ruling: Ruling,
    settle: Option<SettlePlan>,
}

/// What `call` decided from the headers alone (see [`Config::judge_quick`]).
pub(super) enum Quick {
    /// Passed: the request goes on with this in its extensions.
    Passed(RateLimitInfo),
    /// Refused by the plan's limit.
    Refused(Limited),
    /// The store failed: its policy's ruling.
    Ruled(Judgement),
}

/// What `call` could do at once.
pub(super) enum Now {
    /// Decided.
    Judged(Judgement),
    /// The store needs I/O: the rest runs in a future that owns this.
    /// (Boxed: the common variants stay small.)
    Remote(Box<Prepared<'static>>, Pending),
    /// The identifier is async: everything runs in a future.
    Identify,
}

/// What a decision carries into its future.
pub(super) struct Pending {
    started: Option<Instant>,
    settle: Option<SettlePlan>,
    #[cfg(feature = "tracing")]
    span: Option<tracing::Span>,
}

impl Config {
    /// The common case, decided from the headers alone, without taking the
    /// request apart: an identity from the headers, the plan's limit alone
    /// at the route's cost or 1, no observer to time it for. `None`:
    /// anything else (no identity, an unknown tier, a cost function, limits
    /// of the layer's own, a store that needs I/O), which [`judge_now`]
    /// decides and reports.
    ///
    /// [`judge_now`]: Config::judge_now
    pub(super) fn judge_quick(
        &self,
        headers: &http::HeaderMap,
        route_cost: Option<RouteCost>,
    ) -> Option<Quick> {
        let Identifier::Headers(identify) = &self.identifier else {
            return None;
        };
        let plain =
            self.limits.is_empty() && self.peek.is_none() && !self.shadow;
        let cost = match (route_cost, &self.cost) {
            (Some(RouteCost(cost)), _) => cost,
            (None, None) => 1,
            (None, Some(_)) => return None,
        };
        if !plain || cost == 0 || self.timed() {
            return None;
        }
        let identity = identify(headers)?;
        if identity.user().is_empty() {
            return None;
        }
        let emit = |event: LimitEvent| self.emit(event);
        let emit: Emit<'_> = self.listening().then_some(&emit);
        let mut failed = None;
        let decided = self.tiers.decide_plan_now(
            identity.user(),
            identity.tier(),
            cost,
            emit,
            &mut failed,
        );
        match (decided, failed) {
            (Some(decided), _) => Some(match decided.outcome() {
                Ok(info) => Quick::Passed(info),
                Err(limited) => Quick::Refused(limited),
            }),
            (None, Some(failed)) => {
                let (ruling, _) = self.tiers.failed_ruling(failed, emit);
                Some(Quick::Ruled(Judgement {
                    ruling,
                    settle: None,
                }))
            }
            (None, None) => None,
        }
    }

    pub(super) fn emit(&self, event: LimitEvent) {
        #[cfg(feature = "tracing")]
        trace_event(&event);
        if let Some(on_event) = &self.on_event {
            on_event(&event);
        }
        if let Some(observer) = &self.observer {
            observer.event(&event);
        }
        self.tiers.emit(|| event);
    }

    /// Whether anyone takes events: this layer's callbacks, the limiter's
    /// listeners, or a tracing subscriber (events are traced at WARN at
    /// most).
    fn listening(&self) -> bool {
        #[cfg(feature = "tracing")]
        if tracing::Level::WARN
            <= tracing::level_filters::LevelFilter::current()
        {
            return true;
        }
        self.on_event.is_some()
            || self.observer.is_some()
            || self.tiers.listening()
    }

    /// Whether a check is worth timing.
    fn timed(&self) -> bool {
        #[cfg(feature = "tracing")]
        if debug_wanted() {
            return true;
        }
        self.observer.is_some() || self.tiers.observed()
    }

    /// Decides at once if the identity and the store allow it.
    pub(super) fn judge_now(
        &self,
        parts: &Parts,
        route_cost: Option<RouteCost>,
    ) -> Now {
        let identity = match &self.identifier {
            Identifier::Async(_) => return Now::Identify,
            Identifier::None => None,
            Identifier::Headers(identify) => identify(&parts.headers),
        };
        #[cfg(feature = "tracing")]
        let span = rate_limit_span();
        #[cfg(feature = "tracing")]
        let _entered = span.as_ref().map(tracing::Span::enter);
        let started = self.timed().then(Instant::now);
        let emit = |event: LimitEvent| self.emit(event);
        let emit: Emit<'_> = self.listening().then_some(&emit);
        let (ask, settle) =
            match self.ask(identity.as_ref(), parts, route_cost, emit) {
                Ok(asked) => asked,
                Err(ruling) => {
                    return Now::Judged(
                        self.judged(ruling, "none", 0, None, started),
                    );
                }
            };
        if let (Some((user, tier)), [], false) =
            (ask.identity, ask.extra.as_slice(), ask.shadow)
            && ask.cost > 0
        {
            let mut failed = None;
            let decided = self.tiers.decide_plan_now(
                user,
                tier,
                ask.cost,
                emit,
                &mut failed,
            );
            let judged = match (decided, failed) {
                (Some(decided), _) => Some((decided.into_ruling(), decided.by)),
                (None, Some(failed)) => {
                    Some(self.tiers.failed_ruling(failed, emit))
                }
                (None, None) => None,
            };
            if let Some((ruling, by)) = judged {
                return Now::Judged(
                    self.judged(ruling, by, ask.cost, settle, started),
                );
            }
        }
        let prepared = match self.tiers.prepare(&ask, emit) {
            Ok(prepared) => prepared,
            Err(ruling) => {
                return Now::Judged(
                    self.judged(ruling, "none", ask.cost, None, started),
                );
            }
        };
        match self.tiers.decide_local(&prepared, emit) {
            Some((ruling, by)) => {
                Now::Judged(self.judged(ruling, by, ask.cost, settle, started))
            }
            None => {
                let pending = Pending {
                    started,
                    settle,
                    #[cfg(feature = "tracing")]
                    span: span.clone(),
                };
                Now::Remote(Box::new(prepared.into_owned()), pending)
            }
        }
    }

    /// The decision of [`Now::Remote`], through the store's I/O.
    pub(super) fn remote(
        self: Arc<Self>,
        prepared: Box<Prepared<'static>>,
        pending: Pending,
    ) -> BoxFuture<(Judgement, Option<Parts>)> {
        let Pending {
            started,
            settle,
            #[cfg(feature = "tracing")]
            span,
        } = pending;
        let decision = async move {
            let emit = |event: LimitEvent| self.emit(event);
            let emit: Emit<'_> = self.listening().then_some(&emit);
            let (ruling, by) = self.tiers.decide_remote(&prepared, emit).await;
            let judged =
                self.judged(ruling, by, prepared.cost(), settle, started);
            (judged, None)
        };
        #[cfg(feature = "tracing")]
        if let Some(span) = span {
            return Box::pin(tracing::Instrument::instrument(decision, span));
        }
        Box::pin(decision)
    }

    /// The whole decision with an async identifier; the parts come back
    /// with the judgement.
    pub(super) fn identify(
        self: Arc<Self>,
        parts: Parts,
        route_cost: Option<RouteCost>,
    ) -> BoxFuture<(Judgement, Option<Parts>)> {
        let decision = async move {
            let judged = self.judge_async(&parts, route_cost).await;
            (judged, Some(parts))
        };
        #[cfg(feature = "tracing")]
        if let Some(span) = rate_limit_span() {
            return Box::pin(tracing::Instrument::instrument(decision, span));
        }
        Box::pin(decision)
    }

    async fn judge_async(
        &self,
        parts: &Parts,
        route_cost: Option<RouteCost>,
    ) -> Judgement {
        let started = self.timed().then(Instant::now);
        let emit = |event: LimitEvent| self.emit(event);
        let emit: Emit<'_> = self.listening().then_some(&emit);
        let identity = match &self.identifier {
            Identifier::Async(identifier) => match identifier
                .identify(parts)
                .await
            {
                Ok(identity) => identity,
                Err(error) => {
                    let policy = self.tiers.plans().on_identity_error();
                    report(emit, || LimitEvent::IdentityFailed {
                        error: error.to_string(),
                        policy,
                    });
                    let ruling = match policy {
                        OnIdentityError::Allow => Ruling::Unlimited,
                        OnIdentityError::Deny(status) => Ruling::Unavailable {
                            status,
                            error: None,
                        },
                    };
                    return self.judged(ruling, "none", 0, None, started);
                }
            },
            Identifier::None => None,
            Identifier::Headers(identify) => identify(&parts.headers),
        };
        let (ask, settle) =
            match self.ask(identity.as_ref(), parts, route_cost, emit) {
                Ok(asked) => asked,
                Err(ruling) => {
                    return self.judged(ruling, "none", 0, None, started);
                }
            };
        let prepared = match self.tiers.prepare(&ask, emit) {
            Ok(prepared) => prepared,
            Err(ruling) => {
                return self.judged(ruling, "none", ask.cost, None, started);
            }
        };
        let (ruling, by) = match self.tiers.decide_local(&prepared, emit) {
            Some(decided) => decided,
            None => self.tiers.decide_remote(&prepared, emit).await,
        };
        self.judged(ruling, by, ask.cost, settle, started)
    }

    /// The costs and limits of a request, and the settlement it may need;
    /// or the answer, early (moved once, not boxed: see `limiter::decide`).
    #[allow(clippy::result_large_err)]
    fn ask<'p>(
        &'p self,
        identity: Option<&'p TierIdentity<'p>>,
        parts: &'p Parts,
        route_cost: Option<RouteCost>,
        emit: Emit<'_>,
    ) -> Result<(Ask<'p>, Option<SettlePlan>), Ruling> {
        let peek = self.peek.as_ref().is_some_and(|peek| peek(parts));
        let invalid = || {
            report(emit, || LimitEvent::InvalidCost);
            Ruling::Invalid(Error::ZeroCost)
        };
        let cost = if peek {
            0
        } else {
            match route_cost {
                Some(RouteCost(cost)) => cost,
                None => self.cost.as_ref().map_or(1, |cost_fn| cost_fn(parts)),
            }
        };
        if cost == 0 && !peek {
            return Err(invalid());
        }
        let identity = identity.filter(|i| !i.user().is_empty());
        let mut extra: SmallVec<[Extra<'p>; 2]> = SmallVec::new();
        let mut settle: SmallVec<[SettleItem; 1]> = SmallVec::new();
        for (index, limit) in self.limits.iter().enumerate() {
            if !peek && limit.when.as_ref().is_some_and(|when| !when(parts)) {
                continue;
            }
            let partition = match &limit.scope {
                Scope::User => None,
                Scope::Global => Some(Cow::Borrowed("")),
                Scope::Keyed(key) => match key(parts) {
                    Some(key) => Some(Cow::Owned(key)),
                    None => continue,
                },
            };
            let limit_cost = match &limit.cost {
                _ if peek => 0,
                LimitCost::Fixed(cost) => *cost,
                LimitCost::Plan => cost,
                LimitCost::Fn(cost_fn) => match cost_fn(parts) {
                    0 => return Err(invalid()),
                    cost => cost,
                },
            };
            if !peek && limit.settle.is_some() {
                settle.push(SettleItem {
                    index,
                    name: limit.name,
                    partition: partition.as_ref().map(|p| p.to_string()),
                    estimate: limit_cost,
                    charged: rate_tier_storage::Charged::Primary,
                });
            }
            extra.push(Extra {
                limit,
                partition,
                cost: limit_cost,
            });
        }
        let ask = Ask {
            identity: identity.map(|i| (i.user(), i.tier())),
            cost,
            extra,
            shadow: self.shadow,
        };
        let settle = (!settle.is_empty()).then(|| {
            SettlePlan::new(settle, identity.map_or("", |i| i.user()))
        });
        Ok((ask, settle))
    }

    /// The judgement of a ruling, reported to the observers.
    fn judged(
        &self,
        ruling: Ruling,
        storage: &'static str,
        cost: u32,
        settle: Option<SettlePlan>,
        started: Option<Instant>,
    ) -> Judgement {
        if let Some(started) = started {
            let checked = Checked {
                tier: ruling.tier(),
                outcome: ruling.outcome(),
                cost,
                storage,
                elapsed: started.elapsed(),
            };
            #[cfg(feature = "tracing")]
            trace_checked(&checked);
            if let Some(observer) = &self.observer {
                observer.checked(&checked);
            }
            self.tiers.checked(&checked);
        }
        // Only a request that was charged has something to settle.
        let settle = match &ruling {
            Ruling::Allowed(info) => settle.map(|plan| plan.bind(info)),
            _ => None,
        };
        Judgement { ruling, settle }
    }
}

impl Judgement {
    /// The request to pass on (with its [`RateLimitInfo`] in the
    /// extensions) and what to do after, or the refusal.
    ///
    /// [`RateLimitInfo`]: crate::RateLimitInfo
    pub(super) fn respond<R: Refusal<B>, B>(
        self,
        config: &Arc<Config>,
        mut parts: Parts,
    ) -> Result<(Parts, After), Response<B>> {
        let style = config.headers;
        let refused = match &self.ruling {
            Ruling::Allowed(info) => {
                parts.extensions.insert(info.clone());
                let settle = self.settle.map(|plan| {
                    let mut plan = plan.with_config(config.clone());
                    if let Some(meter) = plan.meter() {
                        parts.extensions.insert(meter);
                    }
                    Box::new(plan)
                });
                let Ruling::Allowed(info) = self.ruling else {
                    unreachable!("matched just above")
                };
                return Ok((
                    parts,
                    After {
                        info: Some(info),
                        settle,
                    },
                ));
            }
            Ruling::Unlimited => {
                return Ok((
                    parts,
                    After {
                        info: None,
                        settle: None,
                    },
                ));
            }
            Ruling::Limited(limited) => Refused::Limited(limited),
            Ruling::Denied(status) => Refused::NoIdentity(*status),
            Ruling::Unavailable { status, .. } => Refused::Unavailable(*status),
            Ruling::Invalid(error) => Refused::Invalid(match error {
                Error::ZeroCost => "invalid request cost",
                Error::Check(_) => "rate limiter clock out of range",
                Error::Storage(_) => "rate limiter failed",
                Error::NoIdentity => "identity required",
            }),
        };
        Err(R::refuse(refused, style))
    }
}

/// The `tracing` target of the limiter's events.
#[cfg(feature = "tracing")]
const TARGET: &str = "tower_rate_tier";

/// Whether any subscriber may want `DEBUG`: one atomic load, and `false`
/// when none is installed. The macros check it too, but with tracing's
/// `log` feature on (other crates often turn it on) a disabled event still
/// costs a trip through the `log` fallback (~15 ns); this gate skips it.
#[cfg(feature = "tracing")]
#[inline]
fn debug_wanted() -> bool {
    use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};
    tracing::Level::DEBUG <= STATIC_MAX_LEVEL
        && tracing::Level::DEBUG <= LevelFilter::current()
}

/// The span each decision runs in, when DEBUG is wanted: what the
/// identifier and the store log inside it is attributed to the check.
#[cfg(feature = "tracing")]
fn rate_limit_span() -> Option<tracing::Span> {
    debug_wanted().then(|| tracing::debug_span!(target: TARGET, "rate_limit"))
}

#[cfg(feature = "tracing")]
fn trace_checked(checked: &Checked) {
    if debug_wanted() {
        tracing::debug!(
            target: TARGET,
            tier = checked.tier.unwrap_or("none"),
            outcome = checked.outcome.as_str(),
            cost = checked.cost,
            storage = checked.storage,
            elapsed_us = u64::try_from(checked.elapsed.as_micros()).unwrap_or(u64::MAX),
            "rate limit check",
        );
    }
}

/// The events worth a log line of their own. Refusals are in the check's
/// event; the claimed tier of an unknown tier is client input: `Debug`
/// formatting escapes it. No user id is ever written.
#[cfg(feature = "tracing")]
fn trace_event(event: &LimitEvent) {
    match event {
        LimitEvent::StorageError {
            storage,
            error,
            policy,
        } => tracing::warn!(
            target: TARGET,
            storage,
            error = %error,
            policy = ?policy,
            "rate limiter store failed",
        ),
        LimitEvent::IdentityFailed { error, policy } => tracing::warn!(
            target: TARGET,
            error = %error,
            policy = ?policy,
            "identity lookup failed",
        ),
        LimitEvent::InvalidCost => tracing::warn!(
            target: TARGET,
            "request cost function returned 0: answered 500",
        ),
        LimitEvent::UnknownTier { tier, policy, .. } => tracing::debug!(
            target: TARGET,
            claimed_tier = ?tier,
            policy = ?policy,
            "unknown tier",
        ),
        LimitEvent::MissingIdentity => {
            tracing::debug!(target: TARGET, "request without identity");
        }
        _ => {}
    }
}
