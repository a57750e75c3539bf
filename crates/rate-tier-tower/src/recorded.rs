//! What an observer that forwards to a metrics library records: each check,
//! event and shaped call as a named metric with its labels, written once
//! for every such library (the `metrics` facade, OpenTelemetry). The names
//! are [`RateLimitMetrics`](crate::metrics::RateLimitMetrics)'s Prometheus
//! ones; label values come from the configuration and fixed sets only.

use std::borrow::Cow;

use rate_tier_storage::{BreakerState, StorageEvent};

use crate::event::LimitEvent;
use crate::observe::Checked;
use crate::shape::ShapeEvent;

/// A metric, by its Prometheus name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Metric {
    Checks,
    CheckDuration,
    UnknownTier,
    MissingIdentity,
    StorageErrors,
    ShadowLimited,
    Evictions,
    FallbackDecisions,
    #[cfg_attr(not(feature = "metrics-facade"), allow(dead_code))]
    BreakerState,
    BreakerTransitions,
    Waits,
    WaitDuration,
    NearLimit,
    WaitRefused,
    ShapedCalls,
    ShapedWait,
}

impl Metric {
    /// Its name as Prometheus exposes it.
    #[cfg_attr(not(feature = "metrics-facade"), allow(dead_code))]
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Metric::Checks => "rate_tier_checks_total",
            Metric::CheckDuration => "rate_tier_check_duration_seconds",
            Metric::UnknownTier => "rate_tier_unknown_tier_total",
            Metric::MissingIdentity => "rate_tier_missing_identity_total",
            Metric::StorageErrors => "rate_tier_storage_errors_total",
            Metric::ShadowLimited => "rate_tier_shadow_limited_total",
            Metric::Evictions => "rate_tier_evictions_total",
            Metric::FallbackDecisions => "rate_tier_fallback_decisions_total",
            Metric::BreakerState => "rate_tier_breaker_state",
            Metric::BreakerTransitions => "rate_tier_breaker_transitions_total",
            Metric::Waits => "rate_tier_waits_total",
            Metric::WaitDuration => "rate_tier_wait_seconds",
            Metric::NearLimit => "rate_tier_near_limit_total",
            Metric::WaitRefused => "rate_tier_wait_refused_total",
            Metric::ShapedCalls => "rate_tier_shaped_calls_total",
            Metric::ShapedWait => "rate_tier_shaped_wait_seconds",
        }
    }
}

/// `impl Observer for $sink`: each check, event and shaped call recorded
/// into the [`Sink`].
#[cfg_attr(
    not(any(feature = "metrics-facade", feature = "opentelemetry")),
    allow(unused_macros)
)]
macro_rules! observer_of_sink {
    ($sink:ty) => {
        impl $crate::observe::Observer for $sink {
            fn checked(&self, check: &$crate::observe::Checked) {
                $crate::recorded::checked(self, check);
            }

            fn event(&self, event: &$crate::event::LimitEvent) {
                $crate::recorded::event(self, event);
            }

            fn shaped(&self, event: &$crate::shape::ShapeEvent) {
                $crate::recorded::shaped(self, event);
            }
        }
    };
}
#[cfg_attr(
    not(any(feature = "metrics-facade", feature = "opentelemetry")),
    allow(unused_imports)
)]
pub(crate) use observer_of_sink;

/// Labels of fixed or configured values.
pub(crate) type Labels<'a> = &'a [(&'static str, &'static str)];

/// Where the records go.
pub(crate) trait Sink {
    /// One more of a counter.
    fn add(&self, metric: Metric, labels: Labels<'_>);
    /// A duration, in seconds, into a histogram.
    fn record(&self, metric: Metric, seconds: f64, labels: Labels<'_>);
    /// A breaker's state (0 closed, 1 half-open, 2 open) for `domain`.
    fn breaker(&self, domain: Cow<'static, str>, state: i64);
}

/// A check: counted by tier and outcome, timed by store.
pub(crate) fn checked(sink: &impl Sink, check: &Checked) {
    let tier = check.tier.unwrap_or("none");
    sink.add(
        Metric::Checks,
        &[("tier", tier), ("outcome", check.outcome.as_str())],
    );
    sink.record(
        Metric::CheckDuration,
        check.elapsed.as_secs_f64(),
        &[("storage", check.storage)],
    );
}

/// An event: the metric it moves, if any.
pub(crate) fn event(sink: &impl Sink, event: &LimitEvent) {
    match event {
        LimitEvent::UnknownTier { policy, .. } => {
            sink.add(Metric::UnknownTier, &[("policy", policy.as_str())]);
        }
        LimitEvent::MissingIdentity => sink.add(Metric::MissingIdentity, &[]),
        LimitEvent::StorageError { storage, .. } => {
            sink.add(Metric::StorageErrors, &[("storage", storage)]);
        }
        LimitEvent::ShadowLimited { limit, .. } => {
            sink.add(Metric::ShadowLimited, &[("limit", limit)]);
        }
        LimitEvent::Storage(StorageEvent::Evicted { .. }) => {
            sink.add(Metric::Evictions, &[]);
        }
        LimitEvent::Storage(StorageEvent::Fallback { allowed, .. }) => {
            let allowed = if *allowed { "true" } else { "false" };
            sink.add(Metric::FallbackDecisions, &[("allowed", allowed)]);
        }
        LimitEvent::Storage(StorageEvent::Breaker { domain, to, .. }) => {
            let domain = match domain {
                Some(domain) => Cow::Owned(domain.to_string()),
                None => Cow::Borrowed("all"),
            };
            sink.breaker(domain, breaker_value(*to));
            sink.add(Metric::BreakerTransitions, &[("to", to.as_str())]);
        }
        LimitEvent::Waited { tier, wait, .. } => {
            sink.add(Metric::Waits, &[("tier", tier)]);
            sink.record(Metric::WaitDuration, wait.as_secs_f64(), &[]);
        }
        LimitEvent::NearLimit { tier, limit, .. } => {
            sink.add(Metric::NearLimit, &[("tier", tier), ("limit", limit)]);
        }
        LimitEvent::WaitRefused { tier, .. } => {
            sink.add(Metric::WaitRefused, &[("tier", tier)]);
        }
        // Refusals are counted by `checked` (by outcome).
        _ => {}
    }
}

/// A shaped call: counted by outcome; its wait, if it went.
pub(crate) fn shaped(sink: &impl Sink, event: &ShapeEvent) {
    let outcome = match event {
        ShapeEvent::Reserved { wait } => {
            sink.record(Metric::ShapedWait, wait.as_secs_f64(), &[]);
            if wait.is_zero() { "went" } else { "waited" }
        }
        ShapeEvent::WaitTooLong { .. } => "wait_too_long",
        ShapeEvent::GaveBack => "gave_back",
    };
    sink.add(Metric::ShapedCalls, &[("outcome", outcome)]);
}

/// A breaker's state as the gauge reads it, worse as it grows (as the
/// service's `ratelimit_service_breaker_state`): 0 closed, 1 half-open,
/// 2 open.
pub(crate) fn breaker_value(state: BreakerState) -> i64 {
    match state {
        BreakerState::Closed => 0,
        BreakerState::HalfOpen => 1,
        BreakerState::Open => 2,
        // `BreakerState` is non-exhaustive.
        _ => -1,
    }
}
