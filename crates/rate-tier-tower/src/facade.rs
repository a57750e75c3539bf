//! The limiter's metrics through the [`metrics`] facade: whatever recorder
//! the application installed (metrics-exporter-prometheus, StatsD, ...)
//! receives them.

use std::borrow::Cow;

use metrics::{counter, gauge, histogram};
use rate_tier_storage::{BreakerState, StorageEvent};

use crate::event::LimitEvent;
use crate::observe::{Checked, Observer};
use crate::shape::ShapeEvent;

/// The limiter's metrics through the [`metrics`] facade, under the names
/// and labels of [`RateLimitMetrics`](crate::metrics::RateLimitMetrics)'s
/// Prometheus ones (`rate_tier_checks_total{tier,outcome}`,
/// `rate_tier_check_duration_seconds{storage}`, `rate_tier_breaker_state{domain}`,
/// ...), so that one dashboard reads either. Give it to
/// [`RateTierBuilder::observe`](crate::RateTierBuilder::observe), and to a
/// shaper's [`observe`](crate::shape::ShapeLayerBuilder::observe) for
/// `rate_tier_shaped_calls_total{outcome}` and
/// `rate_tier_shaped_wait_seconds`.
///
/// Label values come from the configuration and fixed sets, never from a
/// request.
///
/// ```
/// use metrics_util::debugging::{DebugValue, DebuggingRecorder};
/// use tower_rate_tier::observe::FacadeMetrics;
/// use tower_rate_tier::{Quota, RateTier};
///
/// let recorder = DebuggingRecorder::new();
/// let snapshotter = recorder.snapshotter();
/// metrics::with_local_recorder(&recorder, || {
///     let limiter = RateTier::builder()
///         .tier("free", Quota::per_minute(1))
///         .observe(FacadeMetrics::new())
///         .build();
///     let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
///     runtime.block_on(async {
///         assert!(limiter.check("ana", "free", 1).await.unwrap().is_ok());
///         assert!(limiter.check("ana", "free", 1).await.unwrap().is_err());
///     });
/// });
/// let refused = snapshotter.snapshot().into_vec().into_iter().find(|(key, ..)| {
///     let key = key.key();
///     key.name() == "rate_tier_checks_total"
///         && key.labels().any(|l| l.key() == "outcome" && l.value() == "limited")
/// });
/// assert!(matches!(refused, Some((_, _, _, DebugValue::Counter(1)))));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct FacadeMetrics;

impl FacadeMetrics {
    /// The observer: it holds nothing, the recorder does.
    pub fn new() -> Self {
        FacadeMetrics
    }
}

impl Observer for FacadeMetrics {
    fn checked(&self, check: &Checked) {
        counter!(
            "rate_tier_checks_total",
            "tier" => check.tier.unwrap_or("none"),
            "outcome" => check.outcome.as_str(),
        )
        .increment(1);
        histogram!("rate_tier_check_duration_seconds", "storage" => check.storage)
            .record(check.elapsed.as_secs_f64());
    }

    fn event(&self, event: &LimitEvent) {
        match event {
            LimitEvent::UnknownTier { policy, .. } => {
                counter!("rate_tier_unknown_tier_total", "policy" => policy.as_str())
                    .increment(1);
            }
            LimitEvent::MissingIdentity => {
                counter!("rate_tier_missing_identity_total").increment(1);
            }
            LimitEvent::StorageError { storage, .. } => {
                counter!("rate_tier_storage_errors_total", "storage" => *storage)
                    .increment(1);
            }
            LimitEvent::ShadowLimited { limit, .. } => {
                counter!("rate_tier_shadow_limited_total", "limit" => *limit)
                    .increment(1);
            }
            LimitEvent::Storage(StorageEvent::Evicted { .. }) => {
                counter!("rate_tier_evictions_total").increment(1);
            }
            LimitEvent::Storage(StorageEvent::Fallback { allowed, .. }) => {
                let allowed = if *allowed { "true" } else { "false" };
                counter!("rate_tier_fallback_decisions_total", "allowed" => allowed)
                    .increment(1);
            }
            LimitEvent::Storage(StorageEvent::Breaker {
                domain, to, ..
            }) => {
                let domain: Cow<'static, str> = match domain {
                    Some(domain) => Cow::Owned(domain.to_string()),
                    None => Cow::Borrowed("all"),
                };
                gauge!("rate_tier_breaker_state", "domain" => domain)
                    .set(breaker_value(*to));
                counter!("rate_tier_breaker_transitions_total", "to" => to.as_str())
                    .increment(1);
            }
            LimitEvent::Waited { tier, wait, .. } => {
                counter!("rate_tier_waits_total", "tier" => *tier).increment(1);
                histogram!("rate_tier_wait_seconds").record(wait.as_secs_f64());
            }
            LimitEvent::NearLimit { tier, limit, .. } => {
                counter!("rate_tier_near_limit_total", "tier" => *tier, "limit" => *limit)
                    .increment(1);
            }
            LimitEvent::WaitRefused { tier, .. } => {
                counter!("rate_tier_wait_refused_total", "tier" => *tier)
                    .increment(1);
            }
            // Refusals are counted by `checked` (by outcome).
            _ => {}
        }
    }

    fn shaped(&self, event: &ShapeEvent) {
        let outcome = match event {
            ShapeEvent::Reserved { wait } => {
                histogram!("rate_tier_shaped_wait_seconds")
                    .record(wait.as_secs_f64());
                if wait.is_zero() { "went" } else { "waited" }
            }
            ShapeEvent::WaitTooLong { .. } => "wait_too_long",
            ShapeEvent::GaveBack => "gave_back",
        };
        counter!("rate_tier_shaped_calls_total", "outcome" => outcome)
            .increment(1);
    }
}

/// As the Prometheus gauge reads it: 0 closed, 1 open, 2 half-open.
fn breaker_value(state: BreakerState) -> f64 {
    match state {
        BreakerState::Closed => 0.0,
        BreakerState::Open => 1.0,
        BreakerState::HalfOpen => 2.0,
        // `BreakerState` is non-exhaustive.
        _ => -1.0,
    }
}
