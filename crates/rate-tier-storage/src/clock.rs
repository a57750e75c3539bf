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
/// so that costs the user at most the quota's ceiling, never a lockout. A
/// clock whose readings become calendar instants or headers follows the
/// wall clock ([`MonotonicClock`] does).
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

/// A fast clock that follows the wall clock: the default.
///
/// It reads the CPU's time-stamp counter (through `quanta`, as governor
/// does), which costs a fraction of a system call, from an anchor on the
/// wall clock that each thread takes again every [`REANCHOR`]. The counter's
/// calibration is off by parts per million (+220 to +245 ppm measured on
/// one machine: 20 s a day), and its readings become `x-ratelimit-reset`
/// and calendar periods' boundaries, so it is never left to run for long:
/// between two anchors it is off by at most the drift of one second (a few
/// hundred microseconds), and a wall clock stepped by NTP is followed
/// within a second. Readings are monotonic within an anchor; at a new one
/// a fast counter steps back by that drift, which GCRA takes as any clock
/// correction.
///
/// ```
/// use rate_tier_storage::clock::{Clock, MonotonicClock, SystemClock};
/// let (fast, wall) = (MonotonicClock.now_us(), SystemClock.now_us());
/// assert!(fast.abs_diff(wall) < 1_000_000);
/// assert!(MonotonicClock.now_us() >= fast);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

/// How long a thread reads the counter from one anchor on the wall clock.
pub const REANCHOR: Duration = Duration::from_secs(1);

static COUNTER: std::sync::LazyLock<quanta::Clock> =
    std::sync::LazyLock::new(quanta::Clock::new);

thread_local! {
    /// This thread's anchor: the counter's raw reading and the wall
    /// clock's µs at it; `(0, 0)` before the first reading.
    static ANCHOR: std::cell::Cell<(u64, u64)> =
        const { std::cell::Cell::new((0, 0)) };
}

/// The time at counter reading `raw`, from `anchor`, or from a new anchor
/// on the wall clock (`wall`) when the old one is missing or over
/// [`REANCHOR`] old. `ns_between` converts two readings into nanoseconds.
#[inline]
fn anchored(
    anchor: &std::cell::Cell<(u64, u64)>,
    raw: u64,
    ns_between: impl Fn(u64, u64) -> u64,
    wall: impl FnOnce() -> u64,
) -> u64 {
    let (from, unix_us) = anchor.get();
    let elapsed_ns = ns_between(from, raw);
    if from == 0 || elapsed_ns >= REANCHOR.as_nanos() as u64 {
        let now = wall();
        anchor.set((raw, now));
        return now;
    }
    unix_us.saturating_add(elapsed_ns / 1000)
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_us(&self) -> u64 {
        let counter = &*COUNTER;
        let raw = counter.raw();
        ANCHOR.with(|anchor| {
            anchored(
                anchor,
                raw,
                |from, to| counter.delta_as_nanos(from, to),
                || SystemClock.now_us(),
            )
        })
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

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn a_counter_running_fast_is_brought_back_to_the_wall_every_second() {
        // A counter 1% fast (in ns per tick: 1.01), a wall clock from 10 s.
        let fast = |from: u64, to: u64| (to - from) * 101 / 100;
        let anchor = Cell::new((0, 0));
        let wall_at = |tick: u64| 10_000_000 + tick / 1000;
        // The first reading anchors on the wall.
        assert_eq!(anchored(&anchor, 1, fast, || wall_at(1)), 10_000_000);
        // Half a second of wall time later: 1% ahead, from the anchor.
        let half = 1 + 500_000_000;
        assert_eq!(
            anchored(&anchor, half, fast, || unreachable!()),
            10_505_000
        );
        // At a second of counter time (990 ms of wall time), back on the
        // wall clock, and counted from there.
        let tick = 1 + 990_099_010;
        assert_eq!(
            anchored(&anchor, tick, fast, || wall_at(tick)),
            wall_at(tick)
        );
        let later = tick + 100_000_000;
        assert_eq!(
            anchored(&anchor, later, fast, || unreachable!()),
            wall_at(tick) + 101_000
        );
    }

    #[test]
    fn the_default_clock_is_the_wall_clock_within_the_drift_of_a_second() {
        for _ in 0..1000 {
            // The wall clock read before and after: the thread may be
            // preempted between two reads on a loaded machine.
            let before = SystemClock.now_us();
            let fast = MonotonicClock.now_us();
            let after = SystemClock.now_us();
            // A millisecond: a second's drift at 245 ppm, with room.
            assert!(
                fast + 1_000 > before && fast < after + 1_000,
                "{fast} vs {before}..{after}"
            );
        }
    }
}
