//! The atomics the stores' lock-free protocols are made of (a bucket's TAT
//! word and its lock bit, a breaker's state word): std's, or loom's under
//! `--cfg trt_loom`, where the model checker runs every interleaving of the
//! tests in `loom_models` (`cargo xtask loom`).

#[cfg(trt_loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(trt_loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// A pause in a spin loop, after `spins` turns: a hint, then a yield of
/// the thread (under loom, a yield to the model at every turn).
#[inline]
pub(crate) fn spin(spins: u32) {
    #[cfg(trt_loom)]
    {
        let _ = spins;
        loom::thread::yield_now();
    }
    #[cfg(not(trt_loom))]
    if spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}
