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

use http::request::Parts;
use http::{Extensions, HeaderMap, Response};
use smallvec::SmallVec;

use super::config::{Config, Identifier};
use super::cost::RouteCost;
use super::refusal::{Refusal, Refused};
use super::settle::{BoxFuture, SettleItem, SettlePlan};
use crate::error::Error;
use crate::event::LimitEvent;
use crate::identity::TierIdentity;
use crate::limit::{LimitCost, Scope};
use crate::limiter::LimitRequest;
use crate::limiter::ask::{Ask, Extra};
use crate::limiter::ruling::{Events, Judged, Ruling};
use crate::limiter::step::Step;
use crate::observe::Checked;
use crate::outcome::Admitted;
use crate::policy::OnIdentityError;

/// A request's decision, and what it leaves for after the response.
pub(crate) struct Judgement {
    ruling: Ruling,
    settle: Option<SettlePlan>,
}

/// What the request's decision leaves for after the response: the headers
/// to add, and a settlement to make.
pub(super) struct After {
    pub(super) info: Option<Admitted>,
    /// Boxed: rare, and the future that carries it is moved (boxed) on
    /// every request.
    pub(super) settle: Option<Box<SettlePlan>>,
}

/// What `call` could do at once.
// Consumed in the same `call` that built it: boxing the common variant would
// cost an allocation per request to save a move.
#[allow(clippy::large_enum_variant)]
pub(super) enum Now {
    /// Decided.
    Judged(Judgement),
    /// The store needs I/O: the rest of the decision runs in this future.
    Deciding(BoxFuture<Judgement>),
    /// The identifier is async: the whole decision runs in a future of
    /// [`Config::identify`].
    Identify,
}

impl Config {
    /// The common case's identity and cost, from the headers alone, without
    /// taking the request apart: an identity from the headers, the tier's
    /// limit alone at the route's cost or 1, no observer to time it for.
    /// `None`: anything else, which [`Config::judge_parts`] decides.
    pub(super) fn quick<'h>(
        &self,
        headers: &'h HeaderMap,
        route_cost: Option<RouteCost>,
    ) -> Option<(TierIdentity<'h>, u32)> {
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
        identify(headers)
            .filter(|identity| !identity.user().is_empty())
            .map(|identity| (identity, cost))
    }

    /// Events for this layer's listeners, or for no one.
    pub(super) fn events(&self) -> Events {
        Events::new(self.listening())
    }

    /// Decides `ask`: the one call into the limiter's
    /// [`step`](crate::RateTier) for every way a request comes in.
    pub(super) fn judge(
        self: &Arc<Self>,
        ask: &Ask<'_>,
        events: Events,
        settle: Option<SettlePlan>,
        started: Option<Instant>,
    ) -> Now {
        match self.tiers.step(ask, events) {
            Step::Ruled(judged) => {
                Now::Judged(self.judged(judged, ask.cost, settle, started))
            }
            Step::Pending { pending, events } => {
                self.report(events);
                let config = self.clone();
                let cost = pending.cost();
                let decision = async move {
                    let judged = pending.finish(&config.tiers).await;
                    config.judged(judged, cost, settle, started)
                };
                Now::Deciding(in_current_span(decision))
            }
        }
    }

    /// Reports a decision's events to everyone who takes them.
    pub(super) fn report(&self, events: Events) {
        for event in events.drain() {
            self.emit(event);
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

    /// Decides a request taken apart: at once if the identity and the
    /// store allow it.
    pub(super) fn judge_parts(
        self: &Arc<Self>,
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
        let mut events = self.events();
        match self.ask(identity.as_ref(), parts, route_cost, &mut events) {
            Ok((request, settle)) => {
                self.judge(&request.ask(), events, settle, started)
            }
            Err(ruling) => Now::Judged(self.ruled(ruling, events, started)),
        }
    }

    /// The whole decision with an async identifier; the parts come back
    /// with the judgement.
    pub(super) fn identify(
        self: Arc<Self>,
        parts: Parts,
        route_cost: Option<RouteCost>,
    ) -> BoxFuture<(Judgement, Parts)> {
        let decision = async move {
            let judgement = self.judge_identified(&parts, route_cost).await;
            (judgement, parts)
        };
        #[cfg(feature = "tracing")]
        if let Some(span) = rate_limit_span() {
            return Box::pin(tracing::Instrument::instrument(decision, span));
        }
        Box::pin(decision)
    }

    async fn judge_identified(
        self: &Arc<Self>,
        parts: &Parts,
        route_cost: Option<RouteCost>,
    ) -> Judgement {
        let started = self.timed().then(Instant::now);
        let mut events = self.events();
        let Identifier::Async(identifier) = &self.identifier else {
            unreachable!("only an async identifier is awaited")
        };
        let identity = match identifier.identify(parts).await {
            Ok(identity) => identity,
            Err(error) => {
                let policy = self.tiers.tiers().on_identity_error();
                events.push(|| LimitEvent::IdentityFailed {
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
                return self.ruled(ruling, events, started);
            }
        };
        let (request, settle) =
            match self.ask(identity.as_ref(), parts, route_cost, &mut events) {
                Ok(asked) => asked,
                Err(ruling) => return self.ruled(ruling, events, started),
            };
        match self.judge(&request.ask(), events, settle, started) {
            Now::Judged(judgement) => judgement,
            Now::Deciding(decision) => decision.await,
            Now::Identify => unreachable!("identified already"),
        }
    }

    /// The costs and limits of a request, and the settlement it may need;
    /// or the answer, early (moved once, not boxed: see `limiter::prepare`).
    #[allow(clippy::result_large_err)]
    fn ask<'p>(
        &'p self,
        identity: Option<&'p TierIdentity<'p>>,
        parts: &'p Parts,
        route_cost: Option<RouteCost>,
        events: &mut Events,
    ) -> Result<(LimitRequest<'p>, Option<SettlePlan>), Ruling> {
        let peek = self.peek.as_ref().is_some_and(|peek| peek(parts));
        let mut invalid = || {
            events.push(|| LimitEvent::InvalidCost);
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
        let mut request =
            LimitRequest::of(identity.map(|i| (i.user(), i.tier())), cost)
                .shadowed(self.shadow)
                .with_quotas(identity.map_or(&[], |i| i.quotas()));
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
                Scope::ClientIp(source) => {
                    match source.partition_or_mistake(parts) {
                        Some(address) => Some(Cow::Owned(address)),
                        None => {
                            let (limit, source) = (limit.name(), source.name());
                            events.push(|| LimitEvent::NoClientAddress {
                                limit,
                                source,
                            });
                            return Err(Ruling::Invalid(
                                Error::NoClientAddress(source),
                            ));
                        }
                    }
                }
            };
            let limit_cost = match &limit.cost {
                _ if peek => 0,
                LimitCost::Fixed(cost) => *cost,
                LimitCost::Tier => cost,
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
                    own: identity.and_then(|i| i.quota(limit.name())),
                });
            }
            request = request.with(Extra {
                limit,
                partition,
                cost: limit_cost,
            });
        }
        let settle = (!settle.is_empty()).then(|| {
            SettlePlan::new(settle, identity.map_or("", |i| i.user()))
        });
        Ok((request, settle))
    }

    /// The judgement of a ruling reached before the limiter was asked.
    fn ruled(
        &self,
        ruling: Ruling,
        events: Events,
        started: Option<Instant>,
    ) -> Judgement {
        let judged = Judged {
            ruling,
            by: "none",
            events,
        };
        self.judged(judged, 0, None, started)
    }

    /// The judgement of a decision, its events reported and the check to
    /// the observers.
    fn judged(
        &self,
        judged: Judged,
        cost: u32,
        settle: Option<SettlePlan>,
        started: Option<Instant>,
    ) -> Judgement {
        let Judged { ruling, by, events } = judged;
        if events.listening() {
            self.report(events);
        }
        if let Some(started) = started {
            let checked = Checked {
                tier: ruling.tier(),
                outcome: ruling.outcome(),
                cost,
                storage: by,
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
    /// What to do after the response, the request's [`RateLimitInfo`](crate::RateLimitInfo) put
    /// in its `extensions`; or the refusal.
    pub(super) fn respond<R: Refusal<B>, B>(
        self,
        config: &Arc<Config>,
        extensions: &mut Extensions,
    ) -> Result<After, Response<B>> {
        let refused = match self.ruling {
            Ruling::Allowed(info) => {
                extensions.insert(info.info().clone());
                let settle = self.settle.map(|plan| {
                    let mut plan = plan.with_config(config.clone());
                    if let Some(meter) = plan.meter() {
                        extensions.insert(meter);
                    }
                    Box::new(plan)
                });
                return Ok(After {
                    info: Some(info),
                    settle,
                });
            }
            Ruling::Unlimited => {
                return Ok(After {
                    info: None,
                    settle: None,
                });
            }
            ruling => ruling,
        };
        Err(refuse::<R, B>(&refused, config))
    }
}

/// The response to a refusal.
fn refuse<R: Refusal<B>, B>(ruling: &Ruling, config: &Config) -> Response<B> {
    let refused = match ruling {
        Ruling::Limited(limited) => Refused::Limited(limited),
        Ruling::Denied(status) => Refused::NoIdentity(*status),
        Ruling::Unavailable { status, .. } => Refused::Unavailable(*status),
        Ruling::Invalid(error) => Refused::Invalid(match error {
            Error::ZeroCost => "invalid request cost",
            Error::Check(_) => "rate limiter clock out of range",
            Error::Storage(_) => "rate limiter failed",
            Error::NoIdentity => "identity required",
            Error::OwnQuota(_) => "invalid customer quota",
            Error::NoClientAddress(_) => {
                "rate limiter misconfigured: no client address"
            }
            Error::NotSettled(_) => "rate limiter failed",
        }),
        Ruling::Allowed(_) | Ruling::Unlimited => {
            unreachable!("a passed request is not refused")
        }
    };
    R::refuse(refused, config.headers)
}

/// The rest of a decision, in the span of its check (the current one)
/// when DEBUG is wanted.
fn in_current_span<T>(
    decision: impl std::future::Future<Output = T> + Send + 'static,
) -> BoxFuture<T> {
    #[cfg(feature = "tracing")]
    if debug_wanted() {
        let span = tracing::Span::current();
        return Box::pin(tracing::Instrument::instrument(decision, span));
    }
    Box::pin(decision)
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
        LimitEvent::NoClientAddress { limit, source } => tracing::error!(
            target: TARGET,
            limit,
            source,
            "no client address for a limit per address: answered 500; serve \
             the app with into_make_service_with_connect_info::<SocketAddr>() \
             (axum), or read the address from the proxy's header",
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
