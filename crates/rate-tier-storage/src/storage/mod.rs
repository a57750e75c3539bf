//! The contract every store implements: [`Storage`], about state, not
//! math: a decision over a set of buckets, an adjustment of what a decision
//! left, a reset. [`StorageExt`] gives every store the short forms
//! (`check`, `settle`, `release`, ...).

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use gcra_core::Decision;

use crate::bucket::{BucketCancel, BucketCheck, BucketSettle};
use crate::event::{StorageListener, Subscription};
use crate::rule::RuleKind;

mod answer;
mod capabilities;
mod decided;
mod error;

pub use self::answer::Answer;
pub use self::capabilities::Capabilities;
pub use self::decided::Decided;
pub use self::error::StorageError;

/// A store of buckets.
///
/// # Contract
///
/// [`Storage::decide`] decides a set of buckets as **one decision**,
/// atomically: the state it reads is the one the last decisions on those
/// buckets stored, and it writes what the decision asks (every charge, or
/// none) before any other decision on those buckets reads them. Under any
/// concurrency exactly the quota passes, and a refused decision charges
/// nothing. An entry may be forgotten once its TAT is in the past: GCRA
/// treats a missing TAT and a past one alike. The time is the store's own
/// (its [`Clock`](crate::clock::Clock), or the server's time for Redis).
///
/// The buckets of one decision must be distinct (the same name and
/// partition twice is [`StorageError::DuplicateBucket`]): merge their costs
/// first.
///
/// A store answers [`Answer::Ready`] when it decided without I/O (nothing
/// boxed, nothing to poll: the in-process hot path), else
/// [`Answer::Pending`]. Only [`Storage::decide`] is required; a store that
/// keeps its state as small values read and compared-and-swapped can
/// implement [`Cells`](crate::cells::Cells) instead and get every kind from
/// [`CellStorage`](crate::cells::CellStorage).
///
/// The trait is object-safe: a limiter holds an `Arc<dyn Storage>`.
///
/// ```
/// use rate_tier_storage::{BucketCheck, LimitName, MemoryStorage, StorageExt};
/// use rate_tier_storage::clock::FakeClock;
/// use gcra_core::{Decision, Quota};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStorage::with_clock(FakeClock::new());
/// let (free, search) = (LimitName::new("free")?, LimitName::new("search")?);
/// let checks = [
///     BucketCheck::new(&free, "ana", Quota::per_minute(10), 1)?,
///     BucketCheck::new(&search, "ana", Quota::per_minute(1), 1)?,
/// ];
/// let mut out = [Decision::default(); 2];
/// assert!(store.check(&checks, &mut out).await?.verdict.allowed);
/// assert_eq!(out[0].remaining, 9);
///
/// // The second search is refused by `search`, and the tier is not charged.
/// let refused = store.check(&checks, &mut out).await?;
/// assert_eq!(refused.verdict.refused_by, Some(1));
/// assert_eq!(out[0].remaining, 9);
/// # Ok(()) }
/// ```
pub trait Storage: Send + Sync + fmt::Debug + Any {
    /// Decides `checks` as one decision in `mode`, writes each bucket's
    /// part to the same position of `out` (which must have the same
    /// length), and stores the outcome.
    ///
    /// In [`Mode::Reserve`] the store reserves, all or nothing, the
    /// earliest slot at which every rate of `checks` passes, if it is at
    /// most `max_wait` away ([`gcra_core::reserve_all`]): the caller waits
    /// [`Decided::wait_us`] and then goes. Not reserved, nothing is charged
    /// and `wait_us` is the wait it would have needed. Only rates reserve;
    /// a store that does not reserve says so in
    /// [`Capabilities::reserves`] and answers [`StorageError::Unsupported`].
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided>;

    /// Changes what earlier decisions left: see [`Adjustment`]. The
    /// default settles, cancels and releases nothing
    /// ([`StorageError::Unsupported`]) and renews as a no-op (a store
    /// whose slots have no lease).
    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        Answer::Ready(match adjustment {
            Adjustment::Renew(_) => Ok(()),
            Adjustment::Settle(_) => Err(StorageError::Unsupported("settle")),
            Adjustment::Cancel(_) => {
                Err(StorageError::Unsupported("reservations"))
            }
            Adjustment::Release(_) => {
                Err(StorageError::Unsupported("concurrency limits"))
            }
        })
    }

    /// Puts `buckets` back to full, as if they had never been charged: a
    /// customer's "I upgraded, why am I still blocked?". Rates, windows and
    /// periods are cleared; a concurrency limit's slots are left as they
    /// are (their requests still run, and give them back when they end).
    /// All of the set at once where the store can. A store that cannot
    /// reset answers [`StorageError::Unsupported`] (the default).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use rate_tier_storage::{BucketCheck, Decision, LimitName, MemoryStorage, Quota, Storage, StorageExt};
    /// let store = MemoryStorage::new();
    /// let pro = LimitName::new("pro")?;
    /// let check = [BucketCheck::new(&pro, "key_ada", Quota::per_minute(2), 2)?];
    /// let mut out = [Decision::default()];
    /// store.check(&check, &mut out).await?;
    /// store.check(&check, &mut out).await?;
    /// assert!(!out[0].allowed);
    /// store.reset(&check).await?;
    /// store.check(&check, &mut out).await?;
    /// assert!(out[0].allowed);
    /// # Ok(())
    /// # }
    /// ```
    fn reset<'a>(&'a self, buckets: &'a [BucketCheck<'a>]) -> Answer<'a, ()> {
        let _ = buckets;
        Answer::Ready(Err(StorageError::Unsupported("reset")))
    }

    /// What the store decides and how: see [`Capabilities`].
    ///
    /// ```
    /// use rate_tier_storage::{MemoryStorage, RuleKind, Storage};
    /// let memory = MemoryStorage::new().capabilities();
    /// assert_eq!(memory.label, "memory");
    /// assert!(memory.supports(RuleKind::Window) && memory.reserves);
    /// ```
    fn capabilities(&self) -> Capabilities {
        Capabilities::new("custom")
    }

    /// The part of the store that holds `check`'s bucket, for a store made
    /// of parts that fail independently (the nodes of a Redis Cluster):
    /// a [`FallbackStorage`](crate::FallbackStorage) keeps a circuit
    /// breaker per part, so that one part's failure sends only its own
    /// buckets to the local fallback. `None` (the default): the store is
    /// one part.
    fn failure_domain(&self, check: &BucketCheck<'_>) -> Option<Arc<str>> {
        let _ = check;
        None
    }

    /// Adds a listener for what the store does by itself (a circuit
    /// breaker opening, a fallback decision, an eviction), until the
    /// returned [`Subscription`] is dropped. Stores that do nothing of the
    /// kind return [`Subscription::none`] (the default).
    fn subscribe(&self, listener: StorageListener) -> Subscription {
        let _ = listener;
        Subscription::none()
    }
}

/// How a [`Storage::decide`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Charges every bucket now, or none.
    Check,
    /// Reserves the earliest slot at most `max_wait` away, or nothing.
    Reserve {
        /// The longest the caller will wait.
        max_wait: Duration,
    },
}

/// A change to what earlier decisions left, for [`Storage::adjust`].
#[derive(Debug, Clone, Copy)]
pub enum Adjustment<'a> {
    /// Corrects the charges of served requests whose cost was known only
    /// then ([`gcra_core::Quota::settle`]), atomically per bucket.
    Settle(&'a [BucketSettle<'a>]),
    /// Gives back reservations whose callers went away before their slot.
    Cancel(&'a [BucketCancel<'a>]),
    /// Gives back the concurrency slots ([`Rule::Concurrency`](crate::Rule::Concurrency)) a passed
    /// decision took, once its request ended: each check's cost.
    Release(&'a [BucketCheck<'a>]),
    /// Extends the lease of slots still held (see
    /// [`Capabilities::lease`]).
    Renew(&'a [BucketCheck<'a>]),
}

/// The short forms of [`Storage`]'s calls, for every store.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use rate_tier_storage::{BucketCheck, Decision, LimitName, MemoryStorage, Quota, StorageExt};
/// use rate_tier_storage::clock::FakeClock;
/// let store = MemoryStorage::with_clock(FakeClock::at_us(0));
/// let name = LimitName::new("provider")?;
/// // 10 a second, evenly: one call every 100 ms; callers wait up to 1 s.
/// let quota = Quota::per_second(10).allow_burst(1).allow_debt(Duration::from_secs(1));
/// let check = [BucketCheck::new(&name, "", quota, 1)?];
/// let mut out = [Decision::default()];
/// let first = store.reserve(&check, Duration::from_secs(1), &mut out).await?;
/// let second = store.reserve(&check, Duration::from_secs(1), &mut out).await?;
/// assert!(first.verdict.allowed && second.verdict.allowed);
/// assert_eq!((first.wait_us, second.wait_us), (0, 100_000));
/// // In process, the answer is ready without polling.
/// assert!(store.check(&check, &mut out).ready().is_some());
/// # Ok(())
/// # }
/// ```
pub trait StorageExt: Storage {
    /// [`Storage::decide`] in [`Mode::Check`].
    #[inline]
    fn check<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        self.decide(checks, Mode::Check, out)
    }

    /// [`Storage::decide`] in [`Mode::Reserve`].
    fn reserve<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        max_wait: Duration,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        self.decide(checks, Mode::Reserve { max_wait }, out)
    }

    /// [`Adjustment::Settle`].
    fn settle<'a>(&'a self, settles: &'a [BucketSettle<'a>]) -> Answer<'a, ()> {
        self.adjust(Adjustment::Settle(settles))
    }

    /// [`Adjustment::Cancel`].
    fn cancel<'a>(
        &'a self,
        reserved: &'a [BucketCancel<'a>],
    ) -> Answer<'a, ()> {
        self.adjust(Adjustment::Cancel(reserved))
    }

    /// [`Adjustment::Release`].
    fn release<'a>(&'a self, slots: &'a [BucketCheck<'a>]) -> Answer<'a, ()> {
        self.adjust(Adjustment::Release(slots))
    }

    /// [`Adjustment::Renew`].
    fn renew<'a>(&'a self, slots: &'a [BucketCheck<'a>]) -> Answer<'a, ()> {
        self.adjust(Adjustment::Renew(slots))
    }

    /// [`Capabilities::label`].
    fn kind(&self) -> &'static str {
        self.capabilities().label
    }

    /// [`Capabilities::supports`].
    fn supports(&self, kind: RuleKind) -> bool {
        self.capabilities().supports(kind)
    }
}

impl<S: Storage + ?Sized> StorageExt for S {}

/// The checks every store makes of its arguments before deciding.
pub(crate) fn validate(
    checks: &[BucketCheck<'_>],
    out: &[Decision],
) -> Result<(), StorageError> {
    if checks.len() != out.len() {
        return Err(StorageError::LengthMismatch {
            checks: checks.len(),
            out: out.len(),
        });
    }
    if !crate::bucket::distinct(checks) {
        return Err(StorageError::DuplicateBucket);
    }
    Ok(())
}

pub(crate) use gcra_core::saturating_micros as micros;

/// The checks every store makes of a reservation's arguments: a check's,
/// and rates only; the longest wait, in µs.
pub(crate) fn validate_reservation(
    checks: &[BucketCheck<'_>],
    out: &[Decision],
    max_wait: Duration,
) -> Result<u64, StorageError> {
    validate(checks, out)?;
    only_rates(checks)?;
    Ok(micros(max_wait))
}

/// Only rates reserve: a window, a period or a slot is refused, never
/// decided as a rate.
pub(crate) fn only_rates(
    checks: &[BucketCheck<'_>],
) -> Result<(), StorageError> {
    if checks.iter().all(BucketCheck::is_rate) {
        Ok(())
    } else {
        Err(StorageError::Unsupported(
            "reserving a window, a period or a concurrency slot (only rates reserve)",
        ))
    }
}
