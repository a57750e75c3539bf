//! The contract every store implements: [`Storage`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use gcra_core::{CheckError, Decision, JointReservation, Quota, Verdict};

use crate::bucket::{BucketCancel, BucketCheck, BucketSettle, Charged};
use crate::event::{StorageListener, Subscription};
use crate::rule::{Rule, RuleKind};

/// A store of GCRA buckets.
///
/// # Contract
///
/// [`Storage::check`] decides a set of buckets as **one decision** with
/// [`gcra_core::check_all`], atomically: the TATs it reads are the ones the
/// last decisions on those buckets stored, and it writes what the decision
/// asks (every charge, or none; see [`Decision::store`]) before any other
/// check of those buckets reads them. Under any concurrency exactly the
/// quota passes, and a refused decision charges nothing. An entry may be
/// forgotten once its TAT is in the past: GCRA treats a missing TAT and a
/// past one alike. The time is the store's own (its
/// [`Clock`](crate::clock::Clock), or the server's time for Redis).
///
/// The buckets of one decision must be distinct (the same name and
/// partition twice is [`StorageError::DuplicateBucket`]): merge their costs
/// first.
///
/// The trait is object-safe: a limiter holds an `Arc<dyn Storage>`.
///
/// ```
/// use rate_tier_storage::{BucketCheck, LimitName, MemoryStorage, Storage};
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
/// // The second search is refused by `search`, and the plan is not charged.
/// let refused = store.check(&checks, &mut out).await?;
/// assert_eq!(refused.verdict.refused_by, Some(1));
/// assert_eq!(out[0].remaining, 9);
/// # Ok(()) }
/// ```
#[async_trait::async_trait]
pub trait Storage: Send + Sync + fmt::Debug + 'static {
    /// Decides `checks` as one decision, writes each bucket's part to the
    /// same position of `out` (which must have the same length), and
    /// stores the outcome.
    async fn check(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError>;

    /// For stores that decide without I/O: the same as [`Storage::check`],
    /// synchronously. It spares the caller an allocated future on the hot
    /// path. Returns `None` when the store needs I/O (the default).
    fn check_local(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Option<Result<Decided, StorageError>> {
        let _ = (checks, out);
        None
    }

    /// Adjusts buckets after their requests were served (a cost known only
    /// then): each by [`gcra_core::Quota::settle`], atomically per bucket.
    /// The default refuses: a store that cannot settle says so.
    async fn settle(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        let _ = settles;
        Err(StorageError::Unsupported("settle"))
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

    /// For stores that settle without I/O: the same as [`Storage::settle`],
    /// synchronously; `None` when the store needs I/O (the default).
    fn settle_local(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Option<Result<(), StorageError>> {
        let _ = settles;
        None
    }

    /// A short label for metrics and logs, e.g. `"memory"` or `"redis"`.
    fn kind(&self) -> &'static str {
        "custom"
    }

    /// Gives back the slots of concurrency limits ([`Rule::Concurrency`])
    /// that a passed decision took, once its request ended: each check's
    /// cost, on its bucket. A store that does not decide concurrency
    /// limits answers [`StorageError::Unsupported`] (the default).
    ///
    /// ```
    /// use rate_tier_storage::{BucketCheck, Concurrency, Decision, LimitName, MemoryStorage, Storage};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MemoryStorage::new();
    /// let uploads = LimitName::of_limit("uploads")?;
    /// let slot = [BucketCheck::of_rule(&uploads, "ana", Concurrency::new(1)?.into(), 1)?];
    /// let mut out = [Decision::default()];
    /// assert!(store.check(&slot, &mut out).await?.verdict.allowed);
    /// assert!(!store.check(&slot, &mut out).await?.verdict.allowed, "one in flight");
    /// store.release(&slot).await?;
    /// assert!(store.check(&slot, &mut out).await?.verdict.allowed);
    /// # Ok(()) }
    /// ```
    async fn release(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        let _ = slots;
        Err(StorageError::Unsupported("concurrency limits"))
    }

    /// How long a slot of a concurrency limit lives on this store unless
    /// it is renewed ([`Storage::renew`]): a store shared by processes that
    /// may die holding slots lets them expire. `None` (the default, and an
    /// in-process store's answer): a slot lives until it is released.
    fn lease(&self) -> Option<Duration> {
        None
    }

    /// Extends the leases of slots a request still holds (see
    /// [`Storage::lease`]): a request that runs longer than the lease
    /// renews them, every third of it. Slots already expired are not
    /// taken again. Nothing to do by default.
    async fn renew(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        let _ = slots;
        Ok(())
    }

    /// [`Storage::release`] without awaiting, for a store that can do it
    /// synchronously; `None` when the store needs I/O (the default).
    fn release_local(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Option<Result<(), StorageError>> {
        let _ = slots;
        None
    }

    /// Whether this store decides buckets of rules of `kind`. Every store
    /// decides rates (the default says so of rates alone); a check of a
    /// kind it does not support is answered [`StorageError::Unsupported`],
    /// and a limiter refuses to be built on it (never a silent rate).
    ///
    /// ```
    /// use rate_tier_storage::{MemoryStorage, RuleKind, Storage};
    /// let store = MemoryStorage::new();
    /// assert!(store.supports(RuleKind::Rate) && store.supports(RuleKind::Window));
    /// ```
    fn supports(&self, kind: RuleKind) -> bool {
        kind == RuleKind::Rate
    }

    /// Whether one decision may hold windows, periods or concurrency
    /// limits (every kind but rates) of different partitions: a user's
    /// beside a global bucket, or beside another key's. True (the default)
    /// for a store that decides a whole decision in one place. False on a
    /// Redis Cluster: each partition's buckets live in a hash slot of their
    /// own, a window's or a period's charge cannot be refunded, so such a
    /// decision is answered [`StorageError::Unsupported`]. A layer refuses
    /// to be built with limits that could meet so on such a store, and a
    /// limiter refuses plans that would make them meet. Rates of any
    /// partitions always share a decision (refunded across slots).
    ///
    /// ```
    /// use rate_tier_storage::{MemoryStorage, Storage};
    /// assert!(MemoryStorage::new().spans_partitions());
    /// ```
    fn spans_partitions(&self) -> bool {
        true
    }

    /// Reserves, all or nothing, the earliest slot at which every rate
    /// limit of `checks` passes, if it is at most `max_wait` away:
    /// [`gcra_core::reserve_all`] on the store's clock, atomically. The
    /// caller waits [`Decided::wait_us`] and then goes; each bucket's
    /// [`Decision`] is its charge at that slot. Not reserved (the wait
    /// longer than `max_wait`, or than a quota's
    /// [`max_wait_us`](gcra_core::Quota::max_wait_us)), nothing is
    /// charged and `wait_us` is the wait it would have needed.
    ///
    /// Only rates reserve: a window, period or concurrency check is
    /// [`StorageError::Unsupported`]. A store that does not reserve says so
    /// in [`Storage::reserves`] and answers `Unsupported` (the default).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use rate_tier_storage::{BucketCheck, Decision, LimitName, MemoryStorage, Quota, Storage};
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
    /// # Ok(())
    /// # }
    /// ```
    async fn reserve(
        &self,
        checks: &[BucketCheck<'_>],
        max_wait: Duration,
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        let _ = (checks, max_wait, out);
        Err(StorageError::Unsupported("reservations"))
    }

    /// [`Storage::reserve`] without awaiting, for a store that can do it
    /// synchronously; `None` when the store needs I/O (the default).
    fn reserve_local(
        &self,
        checks: &[BucketCheck<'_>],
        max_wait: Duration,
        out: &mut [Decision],
    ) -> Option<Result<Decided, StorageError>> {
        let _ = (checks, max_wait, out);
        None
    }

    /// Gives back reservations whose callers went away before their slot
    /// came ([`gcra_core::Quota::cancel`] for each bucket): exact while no
    /// later reservation or pass was made in the bucket, else the slot is
    /// lost (never handed out twice). Each bucket on its own.
    async fn cancel(
        &self,
        reserved: &[BucketCancel<'_>],
    ) -> Result<(), StorageError> {
        let _ = reserved;
        Err(StorageError::Unsupported("reservations"))
    }

    /// [`Storage::cancel`] without awaiting, for a store that can do it
    /// synchronously; `None` when the store needs I/O (the default).
    fn cancel_local(
        &self,
        reserved: &[BucketCancel<'_>],
    ) -> Option<Result<(), StorageError>> {
        let _ = reserved;
        None
    }

    /// Puts `buckets` back to full, as if they had never been charged: a
    /// customer's "I upgraded, why am I still blocked?". Rates, windows and
    /// periods are cleared; a concurrency limit's slots are left as they
    /// are (their requests still run, and give them back when they end).
    /// All of the set at once where the store can (one command on Redis,
    /// one statement on PostgreSQL, the shards' write locks in memory; on
    /// a Redis Cluster, at once per hash slot: one user's buckets share
    /// theirs). A store that cannot reset answers
    /// [`StorageError::Unsupported`] (the default).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use rate_tier_storage::{BucketCheck, Decision, LimitName, MemoryStorage, Quota, Storage};
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
    async fn reset(
        &self,
        buckets: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        let _ = buckets;
        Err(StorageError::Unsupported("reset"))
    }

    /// Whether this store answers [`Storage::reserve`]; a layer that waits
    /// refuses to be built on one that does not (false by default).
    ///
    /// ```
    /// use rate_tier_storage::{MemoryStorage, Storage};
    /// assert!(MemoryStorage::new().reserves());
    /// ```
    fn reserves(&self) -> bool {
        false
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

/// A store's answer to [`Storage::check`], beside each bucket's
/// [`Decision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decided {
    /// Allowed or not, the longest wait, and which limit refused.
    pub verdict: Verdict,
    /// The store's clock, in µs, when it decided; `None` when the time was
    /// another machine's (Redis's `TIME`).
    pub now_us: Option<u64>,
    /// Which store decided: its [`Storage::kind`], or `"fallback"` when a
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
    /// [`REMEMBERED`](crate::REMEMBERED) refusal): it says nothing of the
    /// backend's health, so a breaker neither closes nor counts it.
    pub reached_backend: bool,
    /// For a reservation ([`Storage::reserve`]): how long the caller waits
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

    /// A reservation's answer ([`Storage::reserve`](crate::Storage::reserve))
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
    /// ([`Storage::reserve`]).
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
