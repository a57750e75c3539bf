//! The fake wall clock of [`RedisServer::start_at`](crate::RedisServer::start_at):
//! a small `LD_PRELOAD` library (`fake_clock.c`, built by this crate's
//! `build.rs` with the C compiler) that makes a server's wall clock read a
//! chosen instant when it starts, then run on at the real pace.
//!
//! Not libfaketime: `redis-server` under it deadlocks at start (jemalloc,
//! Redis's allocator, reads the clock under its lock while libfaketime's
//! initialisation allocates; libfaketime issue #130). See `fake_clock.c`.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// The server's start, in ns since the Unix epoch (negative before it).
pub(crate) const START_VAR: &str = "TRT_FAKE_CLOCK_START_NS";
/// Where a container gets the library (copied in before it starts).
pub(crate) const CONTAINER_PATH: &str = "/trt-fake-clock.so";

/// The library built for this machine, or why there is none.
pub(crate) fn library() -> Result<&'static Path> {
    match (
        option_env!("TRT_FAKE_CLOCK_LIB"),
        option_env!("TRT_FAKE_CLOCK_ERROR"),
    ) {
        (Some(lib), _) if Path::new(lib).is_file() => Ok(Path::new(lib)),
        (Some(lib), _) => Err(Error::new(format!(
            "the fake clock's library {lib} is gone: rebuild (`cargo clean -p \
             rate-tier-test-support`)"
        ))),
        (None, why) => Err(Error::new(format!(
            "a server with a fake clock needs the fake clock's LD_PRELOAD library, which \
             rate-tier-test-support's build script builds from src/fake_clock.c with a C \
             compiler ($CC, else `cc`: `apt-get install gcc` on Debian/Ubuntu), on Linux; \
             it could not: {}",
            why.unwrap_or("unknown reason")
        ))),
    }
}

/// The value of [`START_VAR`] for a clock that reads `at` when it starts.
pub(crate) fn start_ns(at: SystemTime) -> String {
    match at.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_nanos().to_string(),
        Err(before) => format!("-{}", before.duration().as_nanos()),
    }
}

/// `at` in µs since the epoch (negative before it), to compare with `TIME`.
pub(crate) fn micros(at: SystemTime) -> i128 {
    match at.duration_since(UNIX_EPOCH) {
        Ok(after) => i128::try_from(after.as_micros()).unwrap_or(i128::MAX),
        Err(before) => {
            -i128::try_from(before.duration().as_micros()).unwrap_or(i128::MAX)
        }
    }
}
