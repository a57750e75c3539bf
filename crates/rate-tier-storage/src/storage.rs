//! The contract every store implements: [`Storage`], about state, not
//! math: a decision over a set of buckets, an adjustment of what a decision
//! left, a reset. [`StorageExt`] gives every store the short forms
//! (`check`, `settle`, `release`, ...).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use gcra_core::{CheckError, Decision, JointReservation, Quota, Verdict};

use crate::bucket::{BucketCancel, BucketCheck, BucketSettle, Charged};
use crate::event::{StorageListener, Subscription};
use crate::rule::{Rule, RuleKind};

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
    /// Gives back the concurrency slots ([`Rule::Concurrency`]) a passed
    /// decision took, once its request ended: each check's cost.
    Release(&'a [BucketCheck<'a>]),
    /// Extends the lease of slots still held (see
    /// [`Capabilities::lease`]).
    Renew(&'a [BucketCheck<'a>]),
}

/// A store's answer: ready when it decided without I/O, pending when it
/// must wait on a backend. Either is a future: `.await` it.
///
/// ```
/// use rate_tier_storage::{Answer, StorageError};
/// let ready: Answer<'_, u32> = Answer::Ready(Ok(7));
/// assert!(matches!(ready.ready(), Some(Ok(7))));
/// # let pending: Answer<'_, u32> = Answer::pending(async { Ok(7) });
/// # assert!(pending.ready().is_none());
/// ```
pub enum Answer<'a, T> {
    /// Decided without I/O.
    Ready(Result<T, StorageError>),
    /// Decided when the future completes.
    Pending(Pin<Box<dyn Future<Output = Result<T, StorageError>> + Send + 'a>>),
}

impl<'a, T> Answer<'a, T> {
    /// An answer that waits on `future`.
    pub fn pending(
        future: impl Future<Output = Result<T, StorageError>> + Send + 'a,
    ) -> Self {
        Answer::Pending(Box::pin(future))
    }

    /// The answer if the store decided without I/O; `None` (the pending
    /// future dropped, which a store must bear) otherwise.
    #[inline]
    pub fn ready(self) -> Option<Result<T, StorageError>> {
        match self {
            Answer::Ready(result) => Some(result),
            Answer::Pending(_) => None,
        }
    }

    /// Whether the store decided without I/O.
    pub fn is_ready(&self) -> bool {
        matches!(self, Answer::Ready(_))
    }
}

// The result is moved out whole, never pinned in place.
impl<T> Unpin for Answer<'_, T> {}

impl<T> Future for Answer<'_, T> {
    type Output = Result<T, StorageError>;

    fn poll(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.get_mut();
        if let Answer::Pending(future) = this {
            return future.as_mut().poll(cx);
        }
        let done = StorageError::Protocol(
            "an answer polled after it was ready".into(),
        );
        match std::mem::replace(this, Answer::Ready(Err(done))) {
            Answer::Ready(result) => std::task::Poll::Ready(result),
            Answer::Pending(_) => unreachable!("matched above"),
        }
    }
}

impl<T> fmt::Debug for Answer<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Answer::Ready(_) => "Answer::Ready",
            Answer::Pending(_) => "Answer::Pending",
        })
    }
}

/// What a store decides and how, as [`Storage::capabilities`] says.
///
/// ```
/// use rate_tier_storage::{Capabilities, RuleKind};
/// let custom = Capabilities::new("dynamodb").with(RuleKind::Window);
/// assert!(custom.supports(RuleKind::Rate) && custom.supports(RuleKind::Window));
/// assert!(!custom.supports(RuleKind::Period) && !custom.reserves);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// A short label for metrics and logs, e.g. `"memory"` or `"redis"`.
    pub label: &'static str,
    /// The kinds decided, one bit per [`RuleKind`] (see
    /// [`Capabilities::supports`]); rates always.
    kinds: u8,
    /// Whether one decision may hold windows, periods or concurrency
    /// limits of different partitions (a user's beside a global bucket).
    /// False on a Redis Cluster, where each partition's buckets live in a
    /// hash slot of their own and a window's or a period's charge cannot
    /// be refunded: a layer refuses to be built with limits that could
    /// meet so on such a store. Rates of any partitions always share a
    /// decision.
    pub spans_partitions: bool,
    /// Whether the store answers [`Mode::Reserve`]; a layer that waits
    /// refuses to be built on one that does not.
    pub reserves: bool,
    /// How long a concurrency slot outlives its holder if it is never
    /// released (its holder's process died): the holder renews it
    /// ([`Adjustment::Renew`]) well before. `None`: slots are held until
    /// released.
    pub lease: Option<Duration>,
    /// Whether the store may answer [`Answer::Ready`], deciding without
    /// I/O (the memory store; a fallback while its breaker is open). False
    /// for a store that always answers [`Answer::Pending`] (a network
    /// store): a caller then does not ask it for a ready answer first,
    /// which would build a pending one only to drop it.
    pub answers_ready: bool,
}

impl Capabilities {
    /// A store labelled `label` that decides rates, within one place
    /// (spanning partitions), without reservations or leases.
    pub const fn new(label: &'static str) -> Self {
        Capabilities {
            label,
            kinds: Self::bit(RuleKind::Rate),
            spans_partitions: true,
            reserves: false,
            lease: None,
            answers_ready: true,
        }
    }

    /// The same, for a store that always answers [`Answer::Pending`].
    ///
    /// ```
    /// use rate_tier_storage::Capabilities;
    /// assert!(Capabilities::new("memory").answers_ready);
    /// assert!(!Capabilities::new("redis").always_pending().answers_ready);
    /// ```
    #[must_use]
    pub const fn always_pending(mut self) -> Self {
        self.answers_ready = false;
        self
    }

    /// The same, also deciding `kind`.
    #[must_use]
    pub const fn with(mut self, kind: RuleKind) -> Self {
        self.kinds |= Self::bit(kind);
        self
    }

    /// The same, deciding every kind.
    #[must_use]
    pub const fn with_every_kind(mut self) -> Self {
        let mut i = 0;
        while i < RuleKind::ALL.len() {
            self = self.with(RuleKind::ALL[i]);
            i += 1;
        }
        self
    }

    /// Whether the store decides limits of `kind`; a layer refuses to be
    /// built with a limit its store does not decide.
    pub const fn supports(&self, kind: RuleKind) -> bool {
        self.kinds & Self::bit(kind) != 0
    }

    const fn bit(kind: RuleKind) -> u8 {
        1 << kind as u8
    }
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

/// A store's answer to [`StorageExt::check`], beside each bucket's
/// [`Decision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decided {
    /// Allowed or not, the longest wait, and which limit refused.
    pub verdict: Verdict,
    /// The store's clock, in µs, when it decided; `None` when the time was
    /// another machine's (Redis's `TIME`).
    pub now_us: Option<u64>,
    /// Which store decided: its [`Capabilities::label`], or `"fallback"` when a
    /// [`FallbackStorage`](crate::FallbackStorage) decided some of the
    /// buckets locally.
    pub by: &'static str,
    /// The quotas of the buckets decided locally were divided by this many
    /// instances (a fallback's
    /// [`local_share`](crate::fallback::FallbackStorageBuilder::local_share)
    /// during an outage, [`Quota::divided`]); 1: the quotas as given. See
    /// [`Decided::applied`].
    pub share: u32,
    /// Which buckets were decided by a fallback's local store, one bit per
    /// position (bit `i` for `checks[i]`; every bit when the whole decision
    /// was local, whatever its length): see [`Decided::charged`].
    pub local: u64,
    /// Whether the store's backend answered. `false` for an answer from
    /// what the store remembers in process (a
    /// `REMEMBERED` refusal of a Redis store): it says nothing of the
    /// backend's health, so a breaker neither closes nor counts it.
    pub reached_backend: bool,
    /// For a reservation ([`StorageExt::reserve`]): how long the caller waits
    /// before it goes, or, not reserved, the wait it would have needed. 0
    /// for a check.
    pub wait_us: u64,
    /// For a reservation: the store's own clock when it decided (µs), for
    /// a caller that compares it with its own to see how late the answer
    /// came (a shaper leaves at the slot, not at the slot plus the
    /// answer's delay). `None` when the store does not say.
    pub store_clock_us: Option<u64>,
}

impl Decided {
    /// A decision made with the quotas as given, by the store's backend.
    pub fn new(
        verdict: Verdict,
        now_us: Option<u64>,
        by: &'static str,
    ) -> Self {
        Decided {
            verdict,
            now_us,
            by,
            share: 1,
            local: 0,
            reached_backend: true,
            wait_us: 0,
            store_clock_us: None,
        }
    }

    /// The same decision, made at `us` on the store's own clock (see
    /// [`Decided::store_clock_us`]).
    #[must_use]
    pub fn with_store_clock(mut self, us: u64) -> Self {
        self.store_clock_us = Some(us);
        self
    }

    /// A reservation's answer ([`StorageExt::reserve`](crate::StorageExt::reserve))
    /// from [`gcra_core::reserve_all`]'s summary: its verdict and wait.
    ///
    /// ```
    /// use gcra_core::JointReservation;
    /// use rate_tier_storage::Decided;
    /// let joint = JointReservation { reserved: true, wait_us: 250, by: Some(0), most_us: 1_000 };
    /// let decided = Decided::of_reservation(&joint, Some(7), "custom");
    /// assert!(decided.verdict.allowed);
    /// assert_eq!(decided.wait_us, 250);
    /// ```
    pub fn of_reservation(
        joint: &JointReservation,
        now_us: Option<u64>,
        by: &'static str,
    ) -> Decided {
        Decided::new(joint.verdict(), now_us, by).with_wait(joint.wait_us)
    }

    /// A reservation of no bucket (`reserve_all` of no charge): reserved,
    /// nothing to wait for, answered by `by` without a call.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    pub(crate) fn reserved_at_once(
        max_wait_us: u64,
        by: &'static str,
    ) -> Decided {
        let joint = JointReservation {
            reserved: true,
            wait_us: 0,
            by: None,
            most_us: max_wait_us,
        };
        Decided::of_reservation(&joint, None, by)
    }

    /// The same decision, with the wait of a reservation
    /// ([`StorageExt::reserve`]).
    #[must_use]
    pub fn with_wait(mut self, wait_us: u64) -> Self {
        self.wait_us = wait_us;
        self
    }

    /// The same decision, answered without the backend.
    ///
    /// ```
    /// use rate_tier_storage::Decided;
    /// use gcra_core::Verdict;
    /// let verdict = Verdict { allowed: false, retry_after_us: 5, refused_by: Some(0) };
    /// let decided = Decided::new(verdict, None, "remembered").without_backend();
    /// assert!(!decided.reached_backend);
    /// ```
    #[must_use]
    pub fn without_backend(mut self) -> Self {
        self.reached_backend = false;
        self
    }

    /// Where `checks[index]` was charged: what a settlement of it must be
    /// sent to ([`BucketSettle::charged`]).
    ///
    /// ```
    /// use rate_tier_storage::{Charged, Decided};
    /// use gcra_core::Verdict;
    /// let verdict = Verdict { allowed: true, retry_after_us: 0, refused_by: None };
    /// assert_eq!(Decided::new(verdict, None, "redis").charged(0), Charged::Primary);
    /// ```
    #[inline]
    pub fn charged(&self, index: usize) -> Charged {
        if self.local == 0 {
            return Charged::Primary;
        }
        let bit = u32::try_from(index)
            .map_or(0, |i| 1u64.checked_shl(i).unwrap_or(0));
        if self.local == u64::MAX || self.local & bit != 0 {
            Charged::Local { share: self.share }
        } else {
            Charged::Primary
        }
    }

    /// The quota applied to `checks[index]`, checked under `quota`: divided
    /// by [`Decided::share`] if it was decided locally.
    ///
    /// ```
    /// use rate_tier_storage::Decided;
    /// use gcra_core::{Quota, Verdict};
    /// let decided = Decided::new(
    ///     Verdict { allowed: true, retry_after_us: 0, refused_by: None },
    ///     None,
    ///     "redis",
    /// );
    /// assert_eq!(decided.applied(0, Quota::per_minute(10)), Quota::per_minute(10));
    /// ```
    #[inline]
    pub fn applied(&self, index: usize, quota: Quota) -> Quota {
        match self.charged(index) {
            Charged::Local { share } => quota.divided(share),
            Charged::Primary => quota,
        }
    }

    /// [`Decided::applied`] for a rule of any kind: the rule the store
    /// applied to the bucket at `index` ([`Rule::divided`] by a fallback's
    /// local share).
    ///
    /// ```
    /// use rate_tier_storage::{Decided, Rule};
    /// use gcra_core::{Quota, Verdict};
    /// let decided = Decided::new(Verdict::of([], &[]), None, "memory");
    /// let rule = Rule::from(Quota::per_minute(10));
    /// assert_eq!(decided.applied_rule(0, rule), rule);
    /// ```
    #[inline]
    pub fn applied_rule(&self, index: usize, rule: Rule) -> Rule {
        match self.charged(index) {
            Charged::Local { share } => rule.divided(share),
            Charged::Primary => rule,
        }
    }
}

/// Why a store gave no decision.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The store did not answer in time.
    #[error("storage did not answer within {0:?}")]
    Timeout(Duration),
    /// The backend failed (connection refused, I/O error, script error).
    #[error("storage backend failed: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The backend answered something this crate cannot read.
    #[error("unexpected reply from storage: {0}")]
    Protocol(String),
    /// The GCRA math refused the inputs.
    #[error(transparent)]
    Check(#[from] CheckError),
    /// The same bucket appeared twice in one decision.
    #[error("the same bucket appears twice in one decision: merge its costs")]
    DuplicateBucket,
    /// `out` is not as long as the checks.
    #[error("{checks} checks but room for {out} decisions")]
    LengthMismatch {
        /// How many checks.
        checks: usize,
        /// How many decisions fit in `out`.
        out: usize,
    },
    /// During an outage a fallback decides with each quota divided among
    /// the instances, and this cost is above the divided burst: it could
    /// pass once the primary is back (a transient refusal, never a
    /// permanent one).
    #[error(
        "cost {cost} is above the burst of {burst} this instance applies while the primary store is down"
    )]
    AboveLocalShare {
        /// The cost asked for.
        cost: u32,
        /// The burst applied locally.
        burst: u32,
    },
    /// The store does not do this.
    #[error("this store does not support {0}")]
    Unsupported(&'static str),
    /// Every attempt of a decision lost its compare-and-swap to other
    /// writers of the same buckets (a [`CellStorage`](crate::cells::CellStorage)
    /// under heavy contention): nothing was charged. Not a failure of the
    /// store, which answered every call: a breaker does not count it.
    #[error("{attempts} attempts in a row lost their compare-and-swap")]
    Contended {
        /// How many attempts were made.
        attempts: u32,
    },
    /// A store made of parts that fail independently (the nodes of a Redis
    /// Cluster, see [`Storage::failure_domain`]) failed in one of them: a
    /// fallback counts the failure against that part alone.
    #[error("{domain}: {error}")]
    InDomain {
        /// The part that failed, as [`Storage::failure_domain`] names it.
        domain: Arc<str>,
        /// Its failure.
        #[source]
        error: Box<StorageError>,
    },
}

impl StorageError {
    /// Whether the error says the store is unhealthy (down, slow, or
    /// answering nonsense), as opposed to a refusal of the inputs: what a
    /// circuit breaker counts.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rate_tier_storage::StorageError;
    /// assert!(StorageError::Timeout(Duration::from_millis(100)).is_failure());
    /// assert!(!StorageError::DuplicateBucket.is_failure());
    /// ```
    pub fn is_failure(&self) -> bool {
        match self {
            StorageError::Timeout(_)
            | StorageError::Backend(_)
            | StorageError::Protocol(_) => true,
            StorageError::InDomain { error, .. } => error.is_failure(),
            _ => false,
        }
    }

    /// The part of the store that failed, when the store names one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rate_tier_storage::StorageError;
    /// let failed = StorageError::InDomain {
    ///     domain: "10.0.0.2:7000".into(),
    ///     error: Box::new(StorageError::Timeout(Duration::from_millis(100))),
    /// };
    /// assert_eq!(failed.domain(), Some("10.0.0.2:7000"));
    /// assert!(failed.is_failure());
    /// ```
    pub fn domain(&self) -> Option<&str> {
        match self {
            StorageError::InDomain { domain, .. } => Some(domain),
            _ => None,
        }
    }
}

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
