//! The concurrency limit: at most `limit` requests in flight, and the
//! leases that free the slots of holders that never release them.

use core::fmt;
use core::time::Duration;

use crate::{CheckError, Decision, MAX_TIME_US, MAX_WINDOW_US};

/// The `retry_after` of a refused [`Concurrency::acquire`], in µs: 1 s.
///
/// No wait is exact: a slot frees when a request in flight ends, which
/// nothing here can know. One second is the smallest `Retry-After` an HTTP
/// answer can say (it counts whole seconds), and short enough for a client
/// to try again soon.
///
/// ```
/// assert_eq!(gcra_core::RETRY_HINT_US, 1_000_000);
/// ```
pub const RETRY_HINT_US: u64 = 1_000_000;

/// A concurrency limit: at most `limit` units of cost in flight at once.
///
/// The state of a key is the number of units in flight, which the store
/// raises on a pass of [`Concurrency::acquire`] and lowers with
/// [`Concurrency::release`] when the request ends. A store shared by
/// processes that may die holding a slot keeps instead one expiry per
/// slot, a [`Lease`], and counts the live ones ([`Lease::live`]).
///
/// # The rules
///
/// [`Concurrency::acquire`] decides a request of `cost` with `in_flight`
/// units held, with `N` the limit:
///
/// 1. A cost above `N` can never pass: [`CheckError::CostExceedsBurst`],
///    with the limit as the burst. A cost of 0 is a peek (rule 4).
/// 2. If `in_flight + cost > N`: refused, `remaining` 0,
///    `retry_after` = [`RETRY_HINT_US`] (a hint, not a promise), nothing
///    to write.
/// 3. Else allowed: `remaining = N - in_flight - cost`, and the store
///    holds `in_flight + cost` (its write). The request must release
///    `cost` when it ends.
/// 4. A cost of 0 is a peek: allowed, `remaining = N - in_flight` (0 if
///    more are in flight than `N`, after the limit was lowered), never a
///    write.
///
/// [`Concurrency::release`] lowers the count by `cost`, never below 0 (a
/// release after the store lost its count frees nothing that is not held).
///
/// ```
/// use gcra_core::{Concurrency, RETRY_HINT_US};
///
/// let uploads = Concurrency::new(2)?;
/// let first = uploads.acquire(0, 1)?;
/// assert_eq!((first.allowed, first.remaining, first.write), (true, 1, Some(1)));
/// let second = uploads.acquire(1, 1)?;
/// assert_eq!(second.write, Some(2));
///
/// let third = uploads.acquire(2, 1)?;
/// assert!(!third.allowed);
/// assert_eq!((third.retry_after_us, third.write), (RETRY_HINT_US, None));
///
/// // The first upload ends: its slot is free again.
/// let in_flight = uploads.release(2, 1);
/// assert!(uploads.acquire(in_flight, 1)?.allowed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Concurrency {
    limit: u32,
}

/// Why a [`Concurrency`] or a [`Lease`] could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConcurrencyError {
    /// The limit was 0: no request could ever pass.
    ZeroLimit,
    /// The lease was shorter than 1 µs: no slot could ever be held.
    ZeroLease,
    /// The lease was longer than [`MAX_WINDOW_US`] (about 35.7 years).
    LeaseOutOfRange,
}

impl fmt::Display for ConcurrencyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConcurrencyError::ZeroLimit => {
                "concurrency limit must be at least 1"
            }
            ConcurrencyError::ZeroLease => {
                "lease must be at least 1 microsecond"
            }
            ConcurrencyError::LeaseOutOfRange => {
                "lease exceeds 2^50 microseconds"
            }
        })
    }
}

impl core::error::Error for ConcurrencyError {}

/// A concurrency limit as a person says it: `4 at once`.
///
/// ```
/// assert_eq!(gcra_core::Concurrency::new(4)?.to_string(), "4 at once");
/// # Ok::<(), gcra_core::ConcurrencyError>(())
/// ```
impl fmt::Display for Concurrency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at once", self.limit())
    }
}

impl Concurrency {
    /// At most `limit` units of cost in flight.
    ///
    /// ```
    /// use gcra_core::{Concurrency, ConcurrencyError};
    /// assert_eq!(Concurrency::new(8)?.limit(), 8);
    /// assert_eq!(Concurrency::new(0), Err(ConcurrencyError::ZeroLimit));
    /// # Ok::<(), ConcurrencyError>(())
    /// ```
    pub const fn new(limit: u32) -> Result<Concurrency, ConcurrencyError> {
        if limit == 0 {
            return Err(ConcurrencyError::ZeroLimit);
        }
        Ok(Concurrency { limit })
    }

    /// Units of cost that may be in flight at once.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// Decides a request of `cost` with `in_flight` units held, by the
    /// [rules](Concurrency#the-rules). A cost of 0 is a peek.
    ///
    /// ```
    /// use gcra_core::{CheckError, Concurrency};
    /// let c = Concurrency::new(3)?;
    /// // The limit was lowered to 3 with 5 in flight: a peek says 0 left.
    /// assert_eq!(c.acquire(5, 0)?.remaining, 0);
    /// assert_eq!(c.acquire(0, 3)?.write, Some(3));
    /// assert_eq!(c.acquire(0, 4), Err(CheckError::CostExceedsBurst { cost: 4, burst: 3 }));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn acquire(
        &self,
        in_flight: u32,
        cost: u32,
    ) -> Result<ConcurrencyDecision, CheckError> {
        // Rule 1.
        if cost > self.limit {
            return Err(CheckError::CostExceedsBurst {
                cost,
                burst: self.limit,
            });
        }
        let limit = self.limit as u64;
        let held = in_flight as u64;
        if cost == 0 {
            // Rule 4.
            return Ok(ConcurrencyDecision {
                allowed: true,
                remaining: limit.saturating_sub(held),
                retry_after_us: 0,
                write: None,
            });
        }
        let need = held.saturating_add(cost as u64);
        if need > limit {
            // Rule 2.
            return Ok(ConcurrencyDecision {
                allowed: false,
                remaining: 0,
                retry_after_us: RETRY_HINT_US,
                write: None,
            });
        }
        // Rule 3. need <= limit <= u32::MAX: lossless.
        Ok(ConcurrencyDecision {
            allowed: true,
            remaining: limit.saturating_sub(need),
            retry_after_us: 0,
            write: Some(need as u32),
        })
    }

    /// The count in flight after a request of `cost` ends: `in_flight -
    /// cost`, never below 0.
    ///
    /// ```
    /// let c = gcra_core::Concurrency::new(4)?;
    /// assert_eq!(c.release(3, 2), 1);
    /// assert_eq!(c.release(1, 2), 0);
    /// # Ok::<(), gcra_core::ConcurrencyError>(())
    /// ```
    pub const fn release(&self, in_flight: u32, cost: u32) -> u32 {
        in_flight.saturating_sub(cost)
    }
}

/// The outcome of [`Concurrency::acquire`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ConcurrencyDecision {
    /// Whether the request passes.
    pub allowed: bool,
    /// Units of cost that could still be acquired now; 0 when refused.
    pub remaining: u64,
    /// When refused, [`RETRY_HINT_US`]; 0 when allowed.
    pub retry_after_us: u64,
    /// The count in flight the store must now hold, or `None` to leave it
    /// as it is. Only a pass writes; its write is its charge.
    pub write: Option<u32>,
}

impl ConcurrencyDecision {
    /// This answer in the shape of a GCRA [`Decision`], with nothing to
    /// store in a TAT and a `reset_after_us` of 0 (when the slots free
    /// is unknown): for [`Verdict::of`](crate::Verdict::of) over limits of
    /// several kinds, and for the same response headers.
    ///
    /// ```
    /// let d = gcra_core::ConcurrencyDecision { allowed: true, remaining: 2, ..Default::default() };
    /// assert_eq!((d.as_decision().remaining, d.as_decision().reset_after_us), (2, 0));
    /// ```
    pub const fn as_decision(&self) -> Decision {
        Decision {
            allowed: self.allowed,
            remaining: self.remaining,
            retry_after_us: self.retry_after_us,
            reset_after_us: 0,
            store: None,
        }
    }
}

/// How long a slot of a [`Concurrency`] limit is held without a release:
/// for a store shared by processes that may die holding one.
///
/// Such a store keeps, per key, one expiry per slot held (a Redis sorted
/// set scored by expiry, a PostgreSQL array). A slot acquired at `now`
/// expires at `now + lease` ([`Lease::expiry`]), and is held while
/// `now < expiry`: from its expiry on it is free, as if released. To
/// acquire, the store counts the live slots ([`Lease::live`]), asks
/// [`Concurrency::acquire`], and on a pass removes the expired slots (every
/// expiry `<= now`) and adds `cost` slots expiring at
/// [`Lease::expiry`]; the key may expire after [`Lease::ttl_ms`], since
/// the newest slots expire last. A release removes the request's own slots;
/// a long request renews them by setting their expiry anew.
///
/// An expiry beyond [`MAX_TIME_US`] is garbage: not a live slot.
///
/// ```
/// use std::time::Duration;
/// use gcra_core::{Concurrency, Lease};
///
/// let jobs = Concurrency::new(2)?;
/// let lease = Lease::new(Duration::from_secs(30))?;
///
/// // Two slots: one expired at 10 s, one expires at 40 s.
/// let slots = [10_000_000, 40_000_000];
/// let now = 20_000_000;
/// assert_eq!(Lease::live(&slots, now), 1);
/// let d = jobs.acquire(Lease::live(&slots, now), 1)?;
/// assert!(d.allowed);
/// assert_eq!(lease.expiry(now)?, 50_000_000);
/// assert_eq!(lease.ttl_ms(), 30_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    lease_us: u64,
}

impl Lease {
    /// A lease of `lease` (truncated to the microsecond): 1 µs to
    /// [`MAX_WINDOW_US`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use gcra_core::{ConcurrencyError, Lease};
    /// assert_eq!(Lease::new(Duration::from_millis(1500))?.lease_us(), 1_500_000);
    /// assert_eq!(Lease::new(Duration::ZERO), Err(ConcurrencyError::ZeroLease));
    /// # Ok::<(), ConcurrencyError>(())
    /// ```
    pub const fn new(lease: Duration) -> Result<Lease, ConcurrencyError> {
        let micros = lease.as_micros();
        if micros == 0 {
            return Err(ConcurrencyError::ZeroLease);
        }
        if micros > MAX_WINDOW_US as u128 {
            return Err(ConcurrencyError::LeaseOutOfRange);
        }
        // Lossless: checked against MAX_WINDOW_US just above.
        Ok(Lease {
            lease_us: micros as u64,
        })
    }

    /// The lease, in µs.
    pub const fn lease_us(&self) -> u64 {
        self.lease_us
    }

    /// The expiry of a slot acquired (or renewed) at `now_us`:
    /// `now + lease`. [`CheckError::TimeOutOfRange`] if `now` or the expiry
    /// is beyond [`MAX_TIME_US`].
    ///
    /// ```
    /// use std::time::Duration;
    /// let lease = gcra_core::Lease::new(Duration::from_secs(1))?;
    /// assert_eq!(lease.expiry(5)?, 1_000_005);
    /// assert!(lease.expiry(gcra_core::MAX_TIME_US).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn expiry(&self, now_us: u64) -> Result<u64, CheckError> {
        if now_us > MAX_TIME_US {
            return Err(CheckError::TimeOutOfRange);
        }
        // Both at most 2^53: no overflow.
        let expiry = now_us.saturating_add(self.lease_us);
        if expiry > MAX_TIME_US {
            return Err(CheckError::TimeOutOfRange);
        }
        Ok(expiry)
    }

    /// `ceil(lease / 1000)`: how long a key whose newest slots were just
    /// acquired must be kept, in ms. At least 1.
    pub const fn ttl_ms(&self) -> u64 {
        self.lease_us.div_ceil(1000)
    }

    /// The slots of `expiries` (in any order) still held at `now_us`:
    /// those with `now < expiry <= MAX_TIME_US`. At most `u32::MAX`.
    ///
    /// ```
    /// use gcra_core::{Lease, MAX_TIME_US};
    /// assert_eq!(Lease::live(&[5, 9, 7, MAX_TIME_US + 1], 7), 1);
    /// assert_eq!(Lease::live(&[], 7), 0);
    /// ```
    pub fn live(expiries: &[u64], now_us: u64) -> u32 {
        let live = expiries
            .iter()
            .filter(|&&expiry| expiry > now_us && expiry <= MAX_TIME_US)
            .count();
        u32::try_from(live).unwrap_or(u32::MAX)
    }
}
