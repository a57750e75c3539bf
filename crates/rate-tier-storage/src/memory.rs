//! The in-process store: a sharded hash table of atomic TATs.
//!
//! A check on a known bucket takes a shard's read lock and runs one
//! compare-and-swap loop on the bucket's `AtomicU64` (governor's design): no
//! allocation, one hash, one clock read. Only a new bucket takes the write
//! lock.
//!
//! A bucket is named by a 128-bit SipHash-1-3 of (tier, user) under a key
//! drawn at random per store: the id is not kept in clear even in memory,
//! an entry is 32 bytes whatever the id's length (huge ids cannot inflate
//! memory, and there is no allocation per bucket to leave behind), and a
//! client cannot aim two ids at one bucket without the key. Two ids share a
//! name with probability 2^-128.
//!
//! Entries whose TAT has passed are dead (GCRA treats them as absent) and are
//! swept: from the insert path, at most once per sweep interval per shard,
//! and by a background task while the store is idle (when built inside a
//! Tokio runtime). Memory therefore follows the live buckets, not every user
//! ever seen.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use gcra_core::Decision;
use hashbrown::HashTable;
use siphasher::sip128::{Hasher128, SipHasher13};

use crate::clock::{Clock, MonotonicClock, SharedClock};
use crate::{BucketCheck, LocalDecision, Storage, StorageError};

const SHARDS: usize = 64;
const DEFAULT_CAPACITY: usize = 1 << 22;
const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(10);
/// A TAT is never 0 once stored (it is at least `now + T`), so 0 marks "none".
const NO_TAT: u64 = 0;

/// In-memory GCRA buckets for a single process.
///
/// Cheap to clone (an `Arc`); clones share the buckets.
///
/// ```
/// use std::time::Duration;
/// use rate_tier_storage::{BucketCheck, MemoryStorage};
/// use rate_tier_storage::clock::FakeClock;
/// use gcra_core::Quota;
///
/// let clock = FakeClock::new();
/// let store = MemoryStorage::builder().clock(clock.clone()).capacity(10_000).build();
/// let check = BucketCheck::new("free", "ana", Quota::per_minute(10), 10);
/// assert!(store.check_sync(&check)?.allowed);
/// assert!(!store.check_sync(&check)?.allowed);
/// assert_eq!(store.len(), 1);
///
/// // A minute later the bucket is full again: the entry is dead and swept.
/// clock.advance(Duration::from_secs(60));
/// store.sweep();
/// assert_eq!(store.len(), 0);
/// # Ok::<(), rate_tier_storage::StorageError>(())
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStorage {
    inner: Arc<Inner>,
}

/// Configures a [`MemoryStorage`].
#[derive(Debug, Clone)]
pub struct MemoryStorageBuilder {
    clock: SharedClock,
    capacity: usize,
    sweep_interval: Duration,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Shard]>,
    keys: (u64, u64),
    clock: SharedClock,
    capacity: usize,
    /// Buckets held, across shards: reserved before an insert, so the
    /// capacity is an exact bound.
    held: AtomicUsize,
    /// When every shard was last swept because the store was full (0:
    /// never).
    last_full_sweep_us: AtomicU64,
    sweep_interval_us: u64,
}

// Aligned so that two shards' locks never share a cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    table: RwLock<Table>,
}

#[derive(Debug, Default)]
struct Table {
    entries: HashTable<Entry>,
    next_sweep_us: u64,
}

#[derive(Debug)]
struct Entry {
    /// The bucket's name: a keyed 128-bit hash of (tier, user).
    name: u128,
    tat: AtomicU64,
}

impl Entry {
    fn hash(&self) -> u64 {
        table_hash(self.name)
    }

    fn is_live(&self, now_us: u64) -> bool {
        self.tat.load(Ordering::Relaxed) > now_us
    }
}

/// The table's hash: the low half of the name (already uniform).
fn table_hash(name: u128) -> u64 {
    name as u64
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
    /// A store on the [`MonotonicClock`] with the default bounds (about 4 million
    /// live buckets, a sweep every 10 s).
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
            clock: Arc::new(MonotonicClock),
            capacity: DEFAULT_CAPACITY,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
        }
    }

    /// The same decision as [`Storage::check`], synchronously.
    pub fn check_sync(
        &self,
        check: &BucketCheck<'_>,
    ) -> Result<Decision, StorageError> {
        self.inner.check(check).map(|local| local.decision)
    }

    /// Drops every bucket whose TAT has passed. Runs by itself; public for
    /// tests and for stores built outside a Tokio runtime.
    pub fn sweep(&self) {
        self.inner.sweep_all();
    }

    /// Buckets held, live or not yet swept.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|shard| read(&shard.table).entries.len())
            .sum()
    }

    /// Whether no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most live buckets this store holds before refusing new ones.
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }
}

impl MemoryStorageBuilder {
    /// The clock the store decides with (default: [`MonotonicClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The clock, as a shared handle.
    pub fn shared_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The most buckets held (default 4 194 304, minimum 1). When a new
    /// bucket finds the store full even after sweeping its shard, the check
    /// fails with [`StorageError::CapacityExceeded`] rather than forget a
    /// live bucket (which would hand out free requests): the limiter's
    /// storage error policy decides the response. The bound is exact. A
    /// full store sweeps every shard before refusing, at most once per
    /// sweep interval (so that a store full of live buckets does not sweep
    /// on every new user).
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
            keys: random_keys(),
            clock: self.clock,
            capacity: self.capacity,
            held: AtomicUsize::new(0),
            last_full_sweep_us: AtomicU64::new(0),
            sweep_interval_us: u64::try_from(self.sweep_interval.as_micros())
                .unwrap_or(u64::MAX),
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

impl Inner {
    /// The bucket's name: tier, a separator no UTF-8 string holds (so
    /// ("ab", "c") and ("a", "bc") differ), user.
    fn name(&self, tier: &str, user: &str) -> u128 {
        let hasher = SipHasher13::new_with_keys(self.keys.0, self.keys.1);
        // One call over a stack copy is much cheaper than three streaming
        // writes, and gives the same hash (SipHash reads a byte stream).
        let mut buffer = [0u8; 128];
        let (tier, user) = (tier.as_bytes(), user.as_bytes());
        let len = tier.len().saturating_add(1).saturating_add(user.len());
        if let Some(bytes) = buffer.get_mut(..len) {
            let (head, rest) = bytes.split_at_mut(tier.len());
            head.copy_from_slice(tier);
            if let Some((separator, tail)) = rest.split_first_mut() {
                *separator = 0xff;
                tail.copy_from_slice(user);
            }
            return hasher.hash(bytes).as_u128();
        }
        let mut hasher = hasher;
        hasher.write(tier);
        hasher.write(&[0xff]);
        hasher.write(user);
        hasher.finish128().as_u128()
    }

    fn shard(&self, name: u128) -> &Shard {
        // From the high half: the table uses the low one.
        let index = usize::try_from(name >> 64).unwrap_or(0) % SHARDS;
        &self.shards[index]
    }

    fn check(
        &self,
        check: &BucketCheck<'_>,
    ) -> Result<LocalDecision, StorageError> {
        let now_us = self.clock.now_us();
        let decision = self.decide(check, now_us)?;
        Ok(LocalDecision { decision, now_us })
    }

    fn decide(
        &self,
        check: &BucketCheck<'_>,
        now: u64,
    ) -> Result<Decision, StorageError> {
        let name = self.name(check.tier, check.user);
        let hash = table_hash(name);
        let shard = self.shard(name);
        {
            let table = read(&shard.table);
            if let Some(entry) = table.entries.find(hash, |e| e.name == name) {
                return decide_in_place(&entry.tat, check, now);
            }
        }

        // A new bucket: decide before taking the write lock, so that a
        // refused input (cost 0, cost above the burst) stores nothing.
        let decision = check.quota.check(None, now, check.cost)?;
        let mut table = write(&shard.table);
        // Another thread may have created it in between.
        if let Some(entry) = table.entries.find(hash, |e| e.name == name) {
            return decide_in_place(&entry.tat, check, now);
        }
        let Some(store) = decision.store else {
            return Ok(decision);
        };
        if now >= table.next_sweep_us || self.is_full() {
            self.sweep_table(&mut table, now);
        }
        if !self.reserve() {
            // Full: dead buckets in other shards may be holding places.
            // Sweep them all (not holding this shard's lock: one lock at a
            // time), at most once per sweep interval, so that a store full
            // of live buckets does not sweep on every new user.
            if !self.claim_full_sweep(now) {
                return Err(StorageError::CapacityExceeded {
                    capacity: self.capacity,
                });
            }
            drop(table);
            self.sweep_all_at(now);
            table = write(&shard.table);
            if let Some(entry) = table.entries.find(hash, |e| e.name == name) {
                return decide_in_place(&entry.tat, check, now);
            }
            if !self.reserve() {
                return Err(StorageError::CapacityExceeded {
                    capacity: self.capacity,
                });
            }
        }
        table.entries.insert_unique(
            hash,
            Entry {
                name,
                tat: AtomicU64::new(store.tat_us),
            },
            Entry::hash,
        );
        Ok(decision)
    }

    /// Reserves a place before an insert: two inserts in two shards cannot
    /// both take the last one.
    fn reserve(&self) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < self.capacity).then(|| held.saturating_add(1))
            })
            .is_ok()
    }

    /// Whether this caller may sweep every shard now (and note that it did).
    fn claim_full_sweep(&self, now: u64) -> bool {
        self.last_full_sweep_us
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
                let due = last == 0
                    || now >= last.saturating_add(self.sweep_interval_us);
                due.then_some(now.max(1))
            })
            .is_ok()
    }

    fn is_full(&self) -> bool {
        self.held.load(Ordering::Acquire) >= self.capacity
    }

    fn sweep_table(&self, table: &mut Table, now: u64) {
        let removed = table.sweep(now, self.sweep_interval_us);
        self.held.fetch_sub(removed, Ordering::AcqRel);
    }

    fn sweep_all(&self) {
        self.sweep_all_at(self.clock.now_us());
    }

    fn sweep_all_at(&self, now: u64) {
        for shard in &*self.shards {
            self.sweep_table(&mut write(&shard.table), now);
        }
    }
}

impl Table {
    /// Drops the dead buckets; returns how many.
    fn sweep(&mut self, now: u64, interval_us: u64) -> usize {
        let before = self.entries.len();
        self.entries.retain(|e| e.is_live(now));
        let removed = before.saturating_sub(self.entries.len());
        if self.entries.capacity()
            > self.entries.len().saturating_mul(4).max(16)
        {
            self.entries.shrink_to(self.entries.len(), Entry::hash);
        }
        self.next_sweep_us = now.saturating_add(interval_us);
        removed
    }
}

/// One compare-and-swap loop: the decision is applied only if the TAT it
/// was made from is still the stored one.
fn decide_in_place(
    tat: &AtomicU64,
    check: &BucketCheck<'_>,
    now: u64,
) -> Result<Decision, StorageError> {
    let mut current = tat.load(Ordering::Acquire);
    loop {
        let stored = (current != NO_TAT).then_some(current);
        let decision = check.quota.check(stored, now, check.cost)?;
        let Some(store) = decision.store else {
            return Ok(decision);
        };
        match tat.compare_exchange_weak(
            current,
            store.tat_us,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Ok(decision),
            Err(actual) => current = actual,
        }
    }
}

// A panic while holding a shard lock cannot leave a table half-updated in a
// way that matters (entries are inserted whole), so poisoning is ignored.
fn read(lock: &RwLock<Table>) -> std::sync::RwLockReadGuard<'_, Table> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write(lock: &RwLock<Table>) -> std::sync::RwLockWriteGuard<'_, Table> {
    lock.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[async_trait::async_trait]
impl Storage for MemoryStorage {
    async fn check(
        &self,
        check: &BucketCheck<'_>,
    ) -> Result<Decision, StorageError> {
        self.check_sync(check)
    }

    fn check_local(
        &self,
        check: &BucketCheck<'_>,
    ) -> Option<Result<LocalDecision, StorageError>> {
        Some(self.inner.check(check))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}
