//! The service benchmark's helpers: the command line every benchmark
//! binary shares (from test-support), writing its results (its struct of
//! `rate_tier_bench_results`, the contract with `cargo xtask bench`), and
//! quantiles.

use rate_tier_bench_results::ResultsFile;
pub(crate) use rate_tier_test_support::bench::Args;

/// Writes `results` to `--out`, if given; panics if it cannot.
pub(crate) fn write_results(results: &impl ResultsFile, args: &Args) {
    if let Some(path) = args.get("out") {
        results.write(path).unwrap_or_else(|e| panic!("{e}"));
    }
}

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
