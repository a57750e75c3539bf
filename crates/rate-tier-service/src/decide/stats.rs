//! envoyproxy/ratelimit's per-rule stats, counted from a decision.

use super::{Applied, Outcome};
use crate::metrics::RuleStats;

/// The units of `limit` used above which a pass is near it: the floor of
/// `limit * ratio` (a hair of slack, so that 0.8 of 10 is 8 and not 7).
fn near_limit_threshold(limit: u64, ratio: f64) -> u64 {
    // A limit is at most u32::MAX: exact in an f64.
    (limit as f64 * ratio + 1e-9).floor() as u64
}

/// Whether an allowed, charged cost left the bucket above the near-limit
/// share of its limit used.
pub(super) fn near_limit(
    applied: &Applied<'_>,
    outcome: &Outcome,
    ratio: f64,
) -> bool {
    let limit = u64::from(applied.requests_per_unit);
    outcome.charged
        && limit.saturating_sub(outcome.remaining)
            > near_limit_threshold(limit, ratio)
}

/// envoyproxy/ratelimit's per-rule stats, in GCRA terms.
pub(super) fn count(
    stats: &RuleStats,
    applied: &Applied<'_>,
    cost: u64,
    outcome: &Outcome,
    near_limit_ratio: f64,
) {
    stats.total_hits.inc_by(cost);
    if outcome.passed {
        stats.within_limit.inc_by(cost);
        if outcome.charged {
            let limit = u64::from(applied.requests_per_unit);
            let threshold = near_limit_threshold(limit, near_limit_ratio);
            let used = limit.saturating_sub(outcome.remaining);
            if used > threshold {
                stats.near_limit.inc_by(cost.min(used - threshold));
            }
        }
    } else {
        stats.over_limit.inc_by(cost);
        if applied.shadow {
            stats.shadow_mode.inc_by(cost);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::near_limit_threshold;

    #[test]
    fn near_limit_threshold_is_the_floor_of_the_ratio() {
        assert_eq!(near_limit_threshold(10, 0.8), 8);
        assert_eq!(near_limit_threshold(7, 0.8), 5);
        assert_eq!(near_limit_threshold(100, 0.9), 90);
        assert_eq!(near_limit_threshold(3, 1.0), 3);
        // The default ratio is the integer arithmetic's 4/5, at every limit.
        for limit in 0..100_000u64 {
            assert_eq!(
                near_limit_threshold(limit, 0.8),
                limit * 4 / 5,
                "{limit}"
            );
        }
        let max = u64::from(u32::MAX);
        assert_eq!(near_limit_threshold(max, 1.0), max);
    }
}
