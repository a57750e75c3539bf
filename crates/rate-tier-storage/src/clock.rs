//! Time sources, in integer microseconds since the Unix epoch.
//!
//! Every store reads time from a [`Clock`]: production uses
//! [`MonotonicClock`] (the default) or [`SystemClock`], tests move a
//! [`FakeClock`] by hand instead of sleeping. (The Redis store
//! is the exception: its script reads Redis's own `TIME`, so that instances
//! with skewed clocks still share one limit.)

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of "now", in µs.
///
/// Contract: `now_us` is cheap, never panics, and is usually monotonic. It may
/// jump backwards (a system clock being corrected): GCRA caps the stored state
/// so that costs the user at most one burst offset, never a lockout.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Microseconds since the Unix epoch (or since any fixed origin).
    fn now_us(&self) -> u64;
}

/// A cheap-to-clone handle to any clock.
pub type SharedClock = Arc<dyn Clock>;

/// The operating system's wall clock.
///
/// ```
/// use rate_tier_storage::clock::{Clock, SystemClock};
/// // After 2020-01-01 and within the exact range of GCRA times.
/// let now = SystemClock.now_us();
/// assert!(now > 1_577_836_800_000_000 && now < gcra_core::MAX_TIME_US);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        // Before 1970 is a broken clock; 0 makes every bucket look fresh,
        // the same as GCRA's answer to any clock that went backwards.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
            })
    }
}

/// A fast monotonic clock, anchored to the wall clock once per process.
///
/// It reads the CPU's time-stamp counter (through `quanta`, as governor
/// does), which costs a fraction of a system call, and never jumps: a wall
/// clock stepped by NTP does not move it. It starts at the Unix time of its
/// first use in the process and then runs at the counter's calibrated rate,
/// so over weeks it can drift from the wall clock by the calibration error
/// (parts per million): fine for rate limits and `x-ratelimit-reset`. Use
/// [`SystemClock`] where exact wall time matters more than speed.
///
/// ```
/// use rate_tier_storage::clock::{Clock, MonotonicClock, SystemClock};
/// let (fast, wall) = (MonotonicClock.now_us(), SystemClock.now_us());
/// assert!(fast.abs_diff(wall) < 1_000_000);
/// assert!(MonotonicClock.now_us() >= fast);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

struct Anchor {
    clock: quanta::Clock,
    raw: u64,
    unix_us: u64,
}

static ANCHOR: std::sync::LazyLock<Anchor> = std::sync::LazyLock::new(|| {
    let clock = quanta::Clock::new();
    let raw = clock.raw();
    Anchor {
        unix_us: SystemClock.now_us(),
        raw,
        clock,
    }
});

impl Clock for MonotonicClock {
    #[inline]
    fn now_us(&self) -> u64 {
        let anchor = &*ANCHOR;
        let elapsed_ns =
            anchor.clock.delta_as_nanos(anchor.raw, anchor.clock.raw());
        anchor.unix_us.saturating_add(elapsed_ns / 1000)
    }
}

/// A clock that only moves when told to: for tests and examples.
///
/// Clones share one time, so a test keeps a clone and advances the clock
/// the limiter reads.
///
/// ```
/// use std::time::Duration;
/// use rate_tier_storage::clock::{Clock, FakeClock};
///
/// let clock = FakeClock::new();
/// let limiter_side = clock.clone();
/// assert_eq!(limiter_side.now_us(), 0);
/// clock.advance(Duration::from_secs(6));
/// assert_eq!(limiter_side.now_us(), 6_000_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    now_us: Arc<AtomicU64>,
}

impl FakeClock {
    /// A clock at time 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock at `now_us` µs.
    ///
    /// ```
    /// use rate_tier_storage::clock::{Clock, FakeClock};
    /// assert_eq!(FakeClock::at_us(1_790_947_155_000_000).now_us(), 1_790_947_155_000_000);
    /// ```
    pub fn at_us(now_us: u64) -> Self {
        FakeClock {
            now_us: Arc::new(AtomicU64::new(now_us)),
        }
    }

    /// Moves time forward (saturating at `u64::MAX` µs).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        // fetch_update with a saturating add: never wraps around to the past.
        let _ = self.now_us.fetch_update(
            Ordering::SeqCst,
            Ordering::SeqCst,
            |now| Some(now.saturating_add(by)),
        );
    }

    /// Sets the time, forwards or backwards (to simulate a clock correction).
    ///
    /// ```
    /// use rate_tier_storage::clock::{Clock, FakeClock};
    /// let clock = FakeClock::at_us(10);
    /// clock.set_us(3);
    /// assert_eq!(clock.now_us(), 3);
    /// ```
    pub fn set_us(&self, now_us: u64) {
        self.now_us.store(now_us, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_us(&self) -> u64 {
        self.now_us.load(Ordering::SeqCst)
    }
}
