//! What the non-criterion benchmarks share: their command line, the file
//! of results that `cargo xtask bench` reads, and the resident size.
//!
//! Each benchmark binary takes `--name value` pairs and ignores the `--bench`
//! flag that `cargo bench` adds. It prints what it measures as it goes, and
//! writes its results, its struct of `rate_tier_bench_results` (the contract
//! with xtask), to the path given by `--out` (if any).
#![allow(dead_code)]

pub(crate) mod apps;
pub(crate) mod hot;

use std::time::Duration;

use rate_tier_bench_results::ResultsFile;
// Not every bench that includes this module takes arguments.
#[allow(unused_imports)]
pub(crate) use rate_tier_test_support::bench::Args;

/// Writes `results` to `--out`, if given; panics if it cannot.
pub(crate) fn write_results(results: &impl ResultsFile, args: &Args) {
    if let Some(path) = args.get("out") {
        results.write(path).unwrap_or_else(|e| panic!("{e}"));
    }
}

/// This process's resident set size in KiB (`VmRSS` in /proc/self/status).
pub(crate) fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status (Linux only)");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line in /proc/self/status")
}

/// The id of the calling thread (Linux: from `/proc/thread-self`).
pub(crate) fn thread_id() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// The CPU time a thread of this process has run, from its schedstat.
pub(crate) fn thread_cpu(tid: u32) -> Duration {
    rate_tier_test_support::bench::thread_cpu(
        std::process::id(),
        &tid.to_string(),
    )
    .unwrap_or_default()
}

/// Mean of a slice (0 for an empty one).
pub(crate) fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

// Not every bench that includes this module sums rounds up.
#[allow(unused_imports)]
pub(crate) use rate_tier_test_support::bench::median;
