//! The Tokio runtime the service runs on: as many threads as it may use,
//! and on one thread a current-thread runtime.
//!
//! A multi-thread runtime of one worker pays for handing tasks between
//! threads it does not have; on one thread the service answers each call
//! on a current-thread runtime, as limitador answers on actix's
//! (`benches/rls.rs --server-runtime multi` measures the difference).

use std::num::NonZeroUsize;

use tokio::runtime::{Builder, Runtime};

/// The variable that sets the number of threads (Tokio's own name for it).
pub const THREADS_VAR: &str = "TOKIO_WORKER_THREADS";

/// How many threads the service runs on: `var` (the value of
/// [`THREADS_VAR`]) when set, else `available` (the CPUs the process may
/// use: `std::thread::available_parallelism`, which reads its affinity and
/// its cgroup's CPU quota). A value that is not a whole number of at least
/// 1 is an error naming the variable, never a guess.
///
/// ```
/// use std::num::NonZeroUsize;
/// use rate_tier_service::runtime::threads;
/// let two = NonZeroUsize::new(2).unwrap();
/// assert_eq!(threads(None, two), Ok(two));
/// assert_eq!(threads(Some("1"), two).map(NonZeroUsize::get), Ok(1));
/// assert!(threads(Some("0"), two).unwrap_err().contains("TOKIO_WORKER_THREADS"));
/// ```
pub fn threads(
    var: Option<&str>,
    available: NonZeroUsize,
) -> Result<NonZeroUsize, String> {
    match var {
        None => Ok(available),
        Some(value) => value.trim().parse().map_err(|_| {
            format!(
                "{THREADS_VAR}={value:?}: not a number of threads (1 or more)"
            )
        }),
    }
}

/// A runtime of `threads` threads, with its I/O and timers: on one thread
/// a current-thread runtime (driven by the thread that calls `block_on`),
/// else a multi-thread one.
///
/// ```
/// use std::num::NonZeroUsize;
/// use tokio::runtime::RuntimeFlavor;
/// let one = rate_tier_service::runtime::build(NonZeroUsize::MIN).unwrap();
/// assert_eq!(one.handle().runtime_flavor(), RuntimeFlavor::CurrentThread);
/// let three = rate_tier_service::runtime::build(NonZeroUsize::new(3).unwrap()).unwrap();
/// assert_eq!(three.metrics().num_workers(), 3);
/// ```
pub fn build(threads: NonZeroUsize) -> std::io::Result<Runtime> {
    builder(threads).build()
}

/// The builder of [`build`]'s runtime, for a caller that names its threads
/// (the benchmarks read a runtime's CPU time by its threads' name).
///
/// ```
/// use std::num::NonZeroUsize;
/// let runtime = rate_tier_service::runtime::builder(NonZeroUsize::new(2).unwrap())
///     .thread_name("rls")
///     .build()
///     .unwrap();
/// assert_eq!(runtime.metrics().num_workers(), 2);
/// ```
pub fn builder(threads: NonZeroUsize) -> Builder {
    let mut builder = if threads.get() == 1 {
        Builder::new_current_thread()
    } else {
        let mut builder = Builder::new_multi_thread();
        builder.worker_threads(threads.get());
        builder
    };
    builder.enable_all();
    builder
}

/// What the service says of its runtime when it starts.
///
/// ```
/// use std::num::NonZeroUsize;
/// use rate_tier_service::runtime::describe;
/// assert_eq!(describe(NonZeroUsize::MIN), "1 thread (a current-thread runtime)");
/// assert_eq!(describe(NonZeroUsize::new(4).unwrap()), "4 threads");
/// ```
pub fn describe(threads: NonZeroUsize) -> String {
    match threads.get() {
        1 => "1 thread (a current-thread runtime)".to_owned(),
        n => format!("{n} threads"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::runtime::RuntimeFlavor;

    const TWO: NonZeroUsize = NonZeroUsize::new(2).unwrap();

    #[test]
    fn the_variable_wins_over_the_cpus_and_a_bad_value_is_an_error() {
        assert_eq!(threads(None, TWO), Ok(TWO));
        assert_eq!(threads(Some(" 3 "), TWO).map(NonZeroUsize::get), Ok(3));
        for bad in ["0", "-1", "", "two", "1.5"] {
            let error = threads(Some(bad), TWO).unwrap_err();
            assert!(error.starts_with("TOKIO_WORKER_THREADS="), "{error}");
        }
    }

    #[test]
    fn one_thread_is_a_current_thread_runtime_and_more_are_workers() {
        let one = build(NonZeroUsize::MIN).unwrap();
        assert_eq!(one.handle().runtime_flavor(), RuntimeFlavor::CurrentThread);
        // Its I/O and timers are on: a timer completes.
        one.block_on(async {
            tokio::time::sleep(std::time::Duration::ZERO).await;
        });
        let two = build(TWO).unwrap();
        assert_eq!(two.handle().runtime_flavor(), RuntimeFlavor::MultiThread);
        assert_eq!(two.metrics().num_workers(), 2);
    }
}
