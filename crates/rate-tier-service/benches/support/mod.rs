//! The service benchmark's helpers: the command line and JSON results
//! every benchmark binary shares (from test-support), and quantiles.

pub(crate) use rate_tier_test_support::bench::{Args, Results};

/// The median (nearest rank) of `values`.
pub(crate) fn median(values: &mut [f64]) -> f64 {
    percentile(values, 0.5)
}

/// The `q` quantile (nearest rank) of `values`.
pub(crate) fn percentile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((values.len() as f64) * q).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}
