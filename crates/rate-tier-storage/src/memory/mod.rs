//! The in-process store: a sharded hash table of atomic TATs.
//!
//! One bucket is one compare-and-swap loop on its `AtomicU64` under its
//! shard's read lock (governor's design): no allocation, one hash, one
//! clock read. A decision over several buckets takes each one's lock bit
//! in one global order and decides them with [`gcra_core::check_all`].
//! Periods are words of the same table (`period.rs`), counts in flight
//! tables of their own (`slots.rs`), windows a map beside it (`kinds.rs`).
//! Buckets are named by a keyed 64-bit SipHash of (limit, partition): no id
//! in clear, 16 bytes an entry. Dead entries are swept; a full store evicts
//! the bucket nearest to full among a sample ([`StorageEvent::Evicted`]).
//! Why each choice: "Memory store" in ARCHITECTURE.md.

mod decide;
mod joint;
mod kinds;
mod locked;
mod mixed;
mod period;
mod reserve;
mod reset;
mod room;
mod sip;
mod slots;
mod table;
mod trim;

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{
    Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak,
};
use std::time::Duration;

use gcra_core::{Decision, Quota};

use self::decide::{in_table, rewrite_in_place, stored};
pub use self::joint::RateCharge;
use self::room::Places;
use self::sip::SipKey;
use self::table::Table;
use crate::bucket::{BucketCheck, BucketSettle, LimitName};
use crate::clock::{Clock, MonotonicClock, SharedClock};
use crate::event::{Listeners, StorageEvent, StorageListener, Subscription};
use crate::storage::{
    Adjustment, Answer, Capabilities, Decided, Mode, Storage, StorageError,
};

const SHARDS: usize = 64;
const DEFAULT_CAPACITY: usize = 1 << 22;
const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(10);
/// Room is sought this many times before a new bucket gives up: only when
/// every bucket held is one a decision in flight keeps (a capacity below
/// the buckets decided at once).
const ROOM_ATTEMPTS: usize = 8;
/// Up to this many buckets, a joint decision works on stack arrays.
const FEW: usize = 4;
/// Multiplies a limit's id into its buckets' names (the golden ratio's
/// odd constant: every bit of the id moves many bits of the name).
const TWEAK: u64 = 0x9e37_79b9_7f4a_7c15;

/// In-memory GCRA buckets for a single process.
///
/// Cheap to clone (an `Arc`); clones share the buckets.
///
/// ```
/// use std::time::Duration;
/// use rate_tier_storage::{BucketCheck, LimitName, MemoryStorage};
/// use rate_tier_storage::clock::FakeClock;
/// use gcra_core::{Decision, Quota};
///
/// let clock = FakeClock::new();
/// let store = MemoryStorage::builder().clock(clock.clone()).capacity(10_000).build();
/// let free = LimitName::new("free")?;
/// let check = [BucketCheck::new(&free, "ana", Quota::per_minute(10), 10)?];
/// let mut out = [Decision::default()];
/// assert!(store.check_sync(&check, &mut out)?.verdict.allowed);
/// assert!(!store.check_sync(&check, &mut out)?.verdict.allowed);
/// assert_eq!(store.len(), 1);
///
/// // A minute later the bucket is full again: the entry is dead and swept.
/// clock.advance(Duration::from_secs(60));
/// store.sweep();
/// assert_eq!(store.len(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct MemoryStorage {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MemoryStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The hash key stays out: with it, ids could be aimed at one bucket.
        f.debug_struct("MemoryStorage")
            .field("capacity", &self.inner.capacity)
            .field("held", &self.inner.held)
            .field("evictions", &self.inner.evictions)
            .finish_non_exhaustive()
    }
}

/// Configures a [`MemoryStorage`].
#[derive(Debug, Clone)]
#[must_use]
pub struct MemoryStorageBuilder {
    clock: StoreClock,
    capacity: usize,
    sweep_interval: Duration,
}

struct Inner {
    shards: Box<[Shard]>,
    /// Keyed with two random words per store.
    hasher: SipKey,
    clock: StoreClock,
    capacity: usize,
    /// Buckets held, across shards and the windows: reserved before an
    /// insert, so the capacity is an exact bound.
    held: AtomicUsize,
    sweep_interval_us: u64,
    evictions: AtomicU64,
    /// Table storage given back by sweeps since the sweeper last returned
    /// memory to the system.
    freed_bytes: AtomicUsize,
    /// Sweeps of every shard completed (memory given back included).
    sweeps: AtomicU64,
    listeners: Listeners<StorageEvent>,
    /// The windows (the rates and periods are in `shards`).
    kinds: kinds::Kinds,
    /// The counts in flight, sharded as `shards`, never evicted and beside
    /// the capacity (`slots.rs`).
    slots: Box<[Shard]>,
}

/// The store's clock: the default one read directly (inlined, no virtual
/// call on the hot path), any other through its handle.
#[derive(Debug, Clone)]
enum StoreClock {
    Monotonic,
    Other(SharedClock),
}

impl StoreClock {
    fn of<C: Clock>(clock: C) -> Self {
        if std::any::TypeId::of::<C>()
            == std::any::TypeId::of::<MonotonicClock>()
        {
            StoreClock::Monotonic
        } else {
            StoreClock::Other(Arc::new(clock))
        }
    }

    #[inline]
    fn now_us(&self) -> u64 {
        match self {
            StoreClock::Monotonic => MonotonicClock.now_us(),
            StoreClock::Other(clock) => clock.now_us(),
        }
    }
}

// Aligned so that two shards' locks never share a cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    table: RwLock<Table>,
}

/// The keys of the SipHash that names buckets, random per store. Drawn from
/// std's `RandomState`, which is seeded from the OS's randomness.
fn random_keys() -> (u64, u64) {
    let state = std::collections::hash_map::RandomState::new();
    (
        state.hash_one(0x7472_745f_6b30_u64),
        state.hash_one(0x7472_745f_6b31_u64),
    )
}

impl Default for MemoryStorage {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStorage {
    /// A store on the [`MonotonicClock`] with the default bounds (about 4
    /// million live buckets, a sweep every 10 s).
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// A store on `clock`, e.g. a [`FakeClock`](crate::clock::FakeClock).
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::builder().clock(clock).build()
    }

    /// Configures a store.
    pub fn builder() -> MemoryStorageBuilder {
        MemoryStorageBuilder {
            clock: StoreClock::Monotonic,
            capacity: DEFAULT_CAPACITY,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
        }
    }

    /// The same decision as [`StorageExt::check`](crate::StorageExt::check), synchronously.
    ///
    /// A single check is decided inline in the caller (the hot path of a
    /// limiter that holds the store itself).
    #[inline(always)]
    pub fn check_sync(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        if let ([check], [slot]) = (checks, &mut *out) {
            return self.inner.decide_one(check, slot);
        }
        self.inner.check(checks, out)
    }

    /// One bucket's decision and the time it was made at (µs on the
    /// store's clock): [`check_sync`](Self::check_sync) of `[check]`, as
    /// plain values. For a caller that holds the store itself and decides
    /// one bucket per request (a limiter's hot path): inlined, and nothing
    /// to unpack.
    ///
    /// ```
    /// use rate_tier_storage::{BucketCheck, LimitName, MemoryStorage};
    /// use rate_tier_storage::clock::FakeClock;
    /// use gcra_core::Quota;
    ///
    /// let store = MemoryStorage::with_clock(FakeClock::at_us(5));
    /// let free = LimitName::new("free")?;
    /// let check = BucketCheck::new(&free, "ana", Quota::per_minute(10), 1)?;
    /// let (decision, now_us) = store.check_one(&check)?;
    /// assert!(decision.allowed);
    /// assert_eq!((decision.remaining, now_us), (9, 5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn check_one(
        &self,
        check: &BucketCheck<'_>,
    ) -> Result<(Decision, u64), StorageError> {
        if check.is_rate() {
            return self.inner.decide_rate(
                check.limit_name(),
                check.partition(),
                &check.quota(),
                check.cost(),
            );
        }
        let mut out = Decision::default();
        let decided = self.inner.decide_one(check, &mut out)?;
        Ok((out, decided.now_us.unwrap_or_default()))
    }

    /// [`check_one`](Self::check_one) of a rate's bucket (`limit`,
    /// `partition`) at `cost` (0: a peek), without building its
    /// [`BucketCheck`]: the one call of a limiter's hot path.
    ///
    /// ```
    /// use rate_tier_storage::{LimitName, MemoryStorage};
    /// use rate_tier_storage::clock::FakeClock;
    /// use gcra_core::Quota;
    ///
    /// let store = MemoryStorage::with_clock(FakeClock::at_us(5));
    /// let free = LimitName::new("free")?;
    /// let (decision, now_us) =
    ///     store.check_rate(&free, "ana", &Quota::per_minute(10), 1)?;
    /// assert!(decision.allowed);
    /// assert_eq!((decision.remaining, now_us), (9, 5));
    /// // A cost above the burst can never pass: an error, as for a check.
    /// assert!(store.check_rate(&free, "ana", &Quota::per_minute(10), 11).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn check_rate(
        &self,
        limit: &LimitName,
        partition: &str,
        quota: &Quota,
        cost: u32,
    ) -> Result<(Decision, u64), StorageError> {
        self.inner.decide_rate(limit, partition, quota, cost)
    }

    /// Several rates charged together when every one passes and their
    /// buckets are held (one user's limits, say): `out` filled and the time
    /// decided at. `None` when this path does not decide it (a refusal, a
    /// bucket not held yet, more than four buckets, a cost of 0 or above a
    /// burst): nothing was written, and
    /// [`check_sync`](Self::check_sync) decides it in full. For a caller
    /// that holds the store itself: one hash per partition, one read lock
    /// per shard (one for a user's own limits).
    ///
    /// ```
    /// use rate_tier_storage::{BucketCheck, LimitName, MemoryStorage, RateCharge};
    /// use rate_tier_storage::clock::FakeClock;
    /// use gcra_core::{Decision, Quota};
    ///
    /// let store = MemoryStorage::with_clock(FakeClock::at_us(5));
    /// let (free, search) = (LimitName::new("free")?, LimitName::new("search")?);
    /// let charges = [
    ///     RateCharge { limit: &free, partition: "ana", quota: Quota::per_minute(10), cost: 1 },
    ///     RateCharge { limit: &search, partition: "ana", quota: Quota::per_minute(2), cost: 2 },
    /// ];
    /// let mut out = [Decision::default(); 2];
    /// // New buckets are made by the full path.
    /// assert_eq!(store.try_charge_rates(&charges, &mut out), None);
    /// let checks = [
    ///     BucketCheck::new(&free, "ana", Quota::per_minute(10), 1)?,
    ///     BucketCheck::new(&search, "ana", Quota::per_minute(2), 1)?,
    /// ];
    /// store.check_sync(&checks, &mut out)?;
    /// // Held now: `search` has 1 left, and a cost of 2 is refused, nothing charged.
    /// assert_eq!(store.try_charge_rates(&charges, &mut out), None);
    /// let charges = [charges[0], RateCharge { cost: 1, ..charges[1] }];
    /// assert_eq!(store.try_charge_rates(&charges, &mut out), Some(5));
    /// assert_eq!((out[0].remaining, out[1].remaining), (8, 0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_charge_rates(
        &self,
        charges: &[RateCharge<'_>],
        out: &mut [Decision],
    ) -> Option<u64> {
        self.inner.charge_rates(charges, out)
    }

    /// The same as [`StorageExt::settle`](crate::StorageExt::settle), synchronously.
    pub fn settle_sync(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        let now = self.inner.clock.now_us();
        settles
            .iter()
            .try_for_each(|settle| self.inner.settle(settle, now))
    }

    /// The same as [`StorageExt::release`](crate::StorageExt::release),
    /// synchronously.
    pub(crate) fn release_sync(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        self.inner.release(slots)
    }

    /// The name of `check`'s bucket in this store (a keyed hash of its
    /// limit and partition).
    pub(crate) fn bucket_id(&self, check: &BucketCheck<'_>) -> u64 {
        self.inner.name(check).0
    }

    /// Drops every bucket whose TAT has passed, and gives the memory of
    /// emptied tables back. Runs by itself; public for tests and for stores
    /// built outside a Tokio runtime.
    pub fn sweep(&self) {
        self.inner.sweep_all();
    }

    /// Buckets held, live or not yet swept: rates, windows, periods and
    /// counts in flight (one given back to 0 is held until a sweep).
    pub fn len(&self) -> usize {
        let rates: usize = self
            .inner
            .shards
            .iter()
            .map(|shard| read(&shard.table).entries.len())
            .sum();
        rates + self.inner.kinds.len() + self.inner.slots_len()
    }

    /// Whether no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most buckets this store holds.
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// How many sweeps of the whole store completed (by the background
    /// sweeper or [`MemoryStorage::sweep`]), memory given back included.
    pub fn sweeps(&self) -> u64 {
        self.inner.sweeps.load(Ordering::Acquire)
    }

    /// How many buckets were evicted to make room since the store was built.
    pub fn evictions(&self) -> u64 {
        self.inner.evictions.load(Ordering::Relaxed)
    }
}

impl MemoryStorageBuilder {
    /// The clock the store decides with (default: [`MonotonicClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = StoreClock::of(clock);
        self
    }

    /// The clock, as a shared handle.
    pub fn shared_clock(mut self, clock: SharedClock) -> Self {
        self.clock = StoreClock::Other(clock);
        self
    }

    /// The most buckets held (default 4 194 304, minimum 1), an exact
    /// bound. A new bucket in a full store evicts the one nearest to full
    /// among a sample of a shard (a dead one first): it carries the least
    /// debt, so forgetting it gives the least away, and each eviction is a
    /// [`StorageEvent::Evicted`].
    ///
    /// Rates, windows and periods share the bound. Counts in flight are
    /// held beside it: one is never evicted (that would let more requests
    /// run at once than its limit), so they count for nothing here.
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity.max(1);
        self
    }

    /// How often dead buckets are swept (default 10 s).
    pub fn sweep_interval(mut self, every: Duration) -> Self {
        self.sweep_interval = every.max(Duration::from_millis(1));
        self
    }

    /// Builds the store. Inside a Tokio runtime this also starts the idle
    /// sweeper, a task that ends when the last clone of the store is dropped.
    pub fn build(self) -> MemoryStorage {
        let inner = Arc::new(Inner {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hasher: {
                let (k0, k1) = random_keys();
                SipKey::new(k0, k1)
            },
            clock: self.clock,
            capacity: self.capacity,
            held: AtomicUsize::new(0),
            sweep_interval_us: u64::try_from(self.sweep_interval.as_micros())
                .unwrap_or(u64::MAX),
            evictions: AtomicU64::new(0),
            freed_bytes: AtomicUsize::new(0),
            sweeps: AtomicU64::new(0),
            listeners: Listeners::default(),
            kinds: kinds::Kinds::default(),
            slots: (0..SHARDS).map(|_| Shard::default()).collect(),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweep_while_alive(
                Arc::downgrade(&inner),
                self.sweep_interval,
            ));
        }
        MemoryStorage { inner }
    }
}

async fn sweep_while_alive(store: Weak<Inner>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        match store.upgrade() {
            Some(inner) => inner.sweep_all(),
            None => return,
        }
    }
}

// A panic while holding a shard lock cannot leave a table half-updated in a
// way that matters (entries are inserted whole), so poisoning is ignored.
#[inline]
fn read(lock: &RwLock<Table>) -> RwLockReadGuard<'_, Table> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write(lock: &RwLock<Table>) -> RwLockWriteGuard<'_, Table> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

impl Storage for MemoryStorage {
    #[inline]
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        Answer::Ready(match mode {
            Mode::Check => self.inner.check(checks, out),
            Mode::Reserve { max_wait } => {
                self.reserve_sync(checks, max_wait, out)
            }
        })
    }

    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        Answer::Ready(match adjustment {
            Adjustment::Settle(settles) => self.settle_sync(settles),
            Adjustment::Cancel(reserved) => self.cancel_sync(reserved),
            Adjustment::Release(slots) => self.inner.release(slots),
            Adjustment::Renew(_) => Ok(()),
        })
    }

    fn reset<'a>(&'a self, buckets: &'a [BucketCheck<'a>]) -> Answer<'a, ()> {
        Answer::Ready(self.reset_sync(buckets))
    }

    fn capabilities(&self) -> Capabilities {
        let mut memory = Capabilities::new("memory").with_every_kind();
        memory.reserves = true;
        memory
    }

    fn subscribe(&self, listener: StorageListener) -> Subscription {
        self.inner.listeners.subscribe(listener)
    }
}
