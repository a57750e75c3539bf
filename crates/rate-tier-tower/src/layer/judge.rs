//! From a request's parts to a verdict: identity, cost, the limiter, and
//! the reporting around them. Shared by every protocol's service.
//!
//! With the `tracing` feature, each decision runs in a `DEBUG` span
//! `rate_limit` (target `tower_rate_tier`) and ends with a `DEBUG` event
//! carrying tier, outcome, cost, storage and elapsed µs; store failures and
//! bad costs are `WARN` events. When no subscriber wants `DEBUG` (none
//! installed, or all at a higher level), the span is not created and the
//! clock is not read for it: one atomic load per request. (So the `DEBUG`
//! span and event do not reach tracing's `log` fallback; the `WARN` events
//! do.)

use std::time::Instant;

use http::request::Parts;

use super::cost::RouteCost;
use super::layer::{Config, Identifier};
use crate::observe::{Checked, Outcome};
use crate::tier::{Emit, Verdict};
use crate::{LimitEvent, LimitReason, TierIdentity};

impl Config {
    pub(crate) fn emit(&self, event: LimitEvent) {
        #[cfg(feature = "tracing")]
        trace_event(&event);
        if let Some(on_event) = &self.on_event {
            on_event(&event);
        }
        if let Some(observer) = &self.observer {
            observer.event(&event);
        }
    }

    /// Whether anyone takes events: the callbacks, or a tracing subscriber
    /// (events are traced at WARN at most).
    fn listening(&self) -> bool {
        // One atomic load, as in `debug_wanted`.
        #[cfg(feature = "tracing")]
        if tracing::Level::WARN
            <= tracing::level_filters::LevelFilter::current()
        {
            return true;
        }
        self.on_event.is_some() || self.observer.is_some()
    }

    /// Decides one request. Never calls the inner service.
    pub(crate) async fn judge(&self, parts: &Parts) -> Verdict {
        #[cfg(feature = "tracing")]
        if debug_wanted() {
            let span = tracing::debug_span!(target: TARGET, "rate_limit");
            if !span.is_disabled() {
                use tracing::Instrument;
                return self.judge_in_span(parts).instrument(span).await;
            }
        }
        self.judge_in_span(parts).await
    }

    async fn judge_in_span(&self, parts: &Parts) -> Verdict {
        #[cfg(feature = "tracing")]
        let traced = debug_wanted()
            && tracing::enabled!(target: TARGET, tracing::Level::DEBUG);
        #[cfg(not(feature = "tracing"))]
        let traced = false;
        let started = (self.observer.is_some() || traced).then(Instant::now);
        let identity: Option<TierIdentity> = match &self.identifier {
            Identifier::None => None,
            Identifier::Headers(identify) => identify(&parts.headers),
            Identifier::Async(identifier) => identifier.identify(parts).await,
        };
        let cost = match parts.extensions.get::<RouteCost>() {
            Some(RouteCost(cost)) => *cost,
            None => self.cost.as_ref().map_or(1, |cost_fn| cost_fn(parts)),
        };
        let verdict = if cost == 0 {
            self.emit(LimitEvent::InvalidCost);
            Verdict::InvalidCost
        } else {
            let emit = |event: LimitEvent| self.emit(event);
            let emit: Emit<'_> =
                if self.listening() { Some(&emit) } else { None };
            self.tiers.decide(identity.as_ref(), cost, emit).await
        };
        if let Some(started) = started {
            let checked = Checked {
                tier: verdict.tier(),
                outcome: verdict.outcome(),
                storage: self.tiers.storage().kind(),
                elapsed: started.elapsed(),
            };
            #[cfg(feature = "tracing")]
            trace_checked(&checked, cost);
            if let Some(observer) = &self.observer {
                observer.checked(&checked);
            }
        }
        verdict
    }
}

/// The `tracing` target of the limiter's spans and events.
#[cfg(feature = "tracing")]
const TARGET: &str = "tower_rate_tier";

/// Whether any subscriber may want `DEBUG`: one atomic load, and `false`
/// when none is installed. The macros check it too, but with tracing's
/// `log` feature on (other crates often turn it on) a disabled span still
/// costs a trip through the `log` fallback (~15 ns); this gate skips it.
#[cfg(feature = "tracing")]
#[inline]
fn debug_wanted() -> bool {
    use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};
    tracing::Level::DEBUG <= STATIC_MAX_LEVEL
        && tracing::Level::DEBUG <= LevelFilter::current()
}

#[cfg(feature = "tracing")]
fn trace_checked(checked: &Checked, cost: u32) {
    tracing::debug!(
        target: TARGET,
        tier = checked.tier.unwrap_or("none"),
        outcome = checked.outcome.as_str(),
        cost,
        storage = checked.storage,
        elapsed_us = u64::try_from(checked.elapsed.as_micros()).unwrap_or(u64::MAX),
        "rate limit check",
    );
}

/// The events worth a log line of their own. Refusals are in the check's
/// event; the claimed tier of an unknown tier is client input: `Debug`
/// formatting escapes it.
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

impl Verdict {
    fn tier(&self) -> Option<&'static str> {
        match self {
            Verdict::Allowed(info) => static_name(&info.tier),
            Verdict::Limited(limited) => static_name(&limited.tier),
            _ => None,
        }
    }

    fn outcome(&self) -> Outcome {
        match self {
            Verdict::Allowed(_) => Outcome::Allowed,
            Verdict::Unlimited => Outcome::Unlimited,
            Verdict::Limited(limited) => match limited.reason() {
                LimitReason::RateLimited => Outcome::Limited,
                LimitReason::CostExceedsBurst { .. } => {
                    Outcome::CostExceedsBurst
                }
                LimitReason::UnknownTier => Outcome::UnknownTierDenied,
            },
            Verdict::Denied(_) => Outcome::MissingIdentity,
            Verdict::Unavailable(_) => Outcome::StorageError,
            Verdict::Invalid | Verdict::InvalidCost => Outcome::Invalid,
        }
    }
}

/// Configured tier names are `Cow::Borrowed` interned names; a claimed
/// (client-sent) name is owned and must not become a label.
// The variant is the point: a `&str` would not tell them apart.
#[allow(clippy::ptr_arg)]
fn static_name(name: &std::borrow::Cow<'static, str>) -> Option<&'static str> {
    match name {
        std::borrow::Cow::Borrowed(name) => Some(name),
        std::borrow::Cow::Owned(_) => None,
    }
}
