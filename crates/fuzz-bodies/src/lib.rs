//! What each fuzz target checks, one function per target, for any bytes:
//! `cargo xtask fuzz` runs them under libFuzzer (`fuzz/`), and
//! `tests/corpora.rs` runs them over every committed corpus and
//! regression input, so that CI keeps what fuzzing found.
//!
//! Each function panics on a defect (a panic of the code under test, or a
//! broken invariant) and returns normally otherwise.
//!
//! ```
//! rate_tier_fuzz_bodies::gcra_check_all(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
//! rate_tier_fuzz_bodies::plans_toml(b"[tiers.free]\nlimit = 10\nper = \"minute\"\n");
//! ```

mod gcra;
mod layer;
mod service;

pub use gcra::gcra_check_all;
pub use layer::layer_headers;
pub use service::{json_body, plans_toml, rls_request, service_config};

/// A fuzz target's body: any bytes in, a panic on a defect.
pub type Target = fn(&[u8]);

/// Every target, by the name of its `fuzz/fuzz_targets/<name>.rs`.
pub const TARGETS: &[(&str, Target)] = &[
    ("gcra_check_all", gcra_check_all),
    ("json_body", json_body),
    ("layer_headers", layer_headers),
    ("plans_toml", plans_toml),
    ("rls_request", rls_request),
    ("service_config", service_config),
];

/// Polls `future` to completion with a waker that does nothing: for code
/// that completes without waiting on anything (an in-memory store).
///
/// # Panics
///
/// If the future is not ready after the first poll.
fn now<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => {
            panic!("waited on I/O in an in-memory path")
        }
    }
}

/// A reader of fuzz bytes: numbers off the front, zeros once they end.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0u64, |n, _| (n << 8) | u64::from(self.u8()))
    }

    fn u32(&mut self) -> u32 {
        (0..4).fold(0u32, |n, _| (n << 8) | u32::from(self.u8()))
    }

    fn rest(&mut self) -> &[u8] {
        std::mem::take(&mut self.0)
    }
}
