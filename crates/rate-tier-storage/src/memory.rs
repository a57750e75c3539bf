//! The in-process store: a sharded hash table of atomic TATs.
//!
//! A check on a known bucket takes a shard's read lock and runs one
//! compare-and-swap loop on the bucket's `AtomicU64` (governor's design): no
//! allocation, one fast hash of (tier, user), one clock read. No SHA-1, as
//! keys never leave the process, except for ids over 64 bytes, which are
//! held as their digest so that huge ids cannot inflate memory. Only a new
//! bucket takes the write lock.
//!
//! Entries whose TAT has passed are dead (GCRA treats them as absent) and are
//! swept: from the insert path, at most once per sweep interval per shard,
//! and by a background task while the store is idle (when built inside a
//! Tokio runtime). Memory therefore follows the live buckets, not every user
//! ever seen.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use gcra_core::Decision;
use hashbrown::{DefaultHashBuilder, HashTable};

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
    hasher: DefaultHashBuilder,
    clock: SharedClock,
    capacity: usize,
    shard_capacity: usize,
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
    /// `tier` then the user part, in one allocation.
    key: Box<[u8]>,
    tier_len: usize,
    /// Whether the user part is the SHA-1 of a long id.
    digest: bool,
    hash: u64,
    tat: AtomicU64,
}

/// User ids longer than this are held as their SHA-1, so that a client
/// sending huge ids cannot make each bucket cost kilobytes.
const MAX_INLINE_USER: usize = 64;

/// The user part of a bucket's key: the id itself, or its SHA-1.
#[derive(Hash)]
enum UserKey<'a> {
    Plain(&'a [u8]),
    Digest([u8; 20]),
}

impl<'a> UserKey<'a> {
    fn of(user: &'a str) -> Self {
        if user.len() <= MAX_INLINE_USER {
            UserKey::Plain(user.as_bytes())
        } else {
            use sha1::Digest as _;
            UserKey::Digest(sha1::Sha1::digest(user.as_bytes()).into())
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            UserKey::Plain(bytes) => bytes,
            UserKey::Digest(digest) => digest,
        }
    }

    fn is_digest(&self) -> bool {
        matches!(self, UserKey::Digest(_))
    }
}

impl Entry {
    fn is(&self, tier: &str, user: &UserKey<'_>) -> bool {
        let user_bytes = user.bytes();
        self.tier_len == tier.len()
            && self.digest == user.is_digest()
            && self.key.len() == tier.len().saturating_add(user_bytes.len())
            && self.key.starts_with(tier.as_bytes())
            && self.key.ends_with(user_bytes)
    }

    fn is_live(&self, now_us: u64) -> bool {
        self.tat.load(Ordering::Relaxed) > now_us
    }
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

    /// The most live buckets held (default 4 194 304, minimum 64). When a
    /// new bucket finds its shard full even after a sweep, the check fails
    /// with [`StorageError::CapacityExceeded`] rather than forget a live
    /// bucket (which would hand out free requests): the limiter's storage
    /// error policy decides the response. The bound is enforced per shard,
    /// so it can be reached slightly before the total.
    pub fn capacity(mut self, capacity: usize) -> Self {
        self.capacity = capacity.max(SHARDS);
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
            hasher: DefaultHashBuilder::default(),
            clock: self.clock,
            capacity: self.capacity,
            // Rounded down: the total never exceeds `capacity`.
            shard_capacity: self.capacity / SHARDS,
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
    fn shard(&self, hash: u64) -> &Shard {
        // Bits 40..46: hashbrown uses the low bits for the slot and the top 7
        // for its tags, so the shard must come from neither.
        let index = usize::try_from(hash >> 40).unwrap_or(0) % SHARDS;
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
        let user = UserKey::of(check.user);
        let hash = self.hasher.hash_one((check.tier, &user));
        let shard = self.shard(hash);
        {
            let table = read(&shard.table);
            if let Some(entry) =
                table.entries.find(hash, |e| e.is(check.tier, &user))
            {
                return decide_in_place(&entry.tat, check, now);
            }
        }

        // A new bucket: decide before taking the write lock, so that a
        // refused input (cost 0, cost above the burst) stores nothing.
        let decision = check.quota.check(None, now, check.cost)?;
        let mut table = write(&shard.table);
        // Another thread may have created it in between.
        if let Some(entry) =
            table.entries.find(hash, |e| e.is(check.tier, &user))
        {
            return decide_in_place(&entry.tat, check, now);
        }
        let Some(store) = decision.store else {
            return Ok(decision);
        };
        if now >= table.next_sweep_us
            || table.entries.len() >= self.shard_capacity
        {
            table.sweep(now, self.sweep_interval_us);
        }
        if table.entries.len() >= self.shard_capacity {
            return Err(StorageError::CapacityExceeded {
                capacity: self.capacity,
            });
        }
        let key = [check.tier.as_bytes(), user.bytes()].concat();
        table.entries.insert_unique(
            hash,
            Entry {
                key: key.into_boxed_slice(),
                tier_len: check.tier.len(),
                digest: user.is_digest(),
                hash,
                tat: AtomicU64::new(store.tat_us),
            },
            |e| e.hash,
        );
        Ok(decision)
    }

    fn sweep_all(&self) {
        let now = self.clock.now_us();
        for shard in &*self.shards {
            write(&shard.table).sweep(now, self.sweep_interval_us);
        }
    }
}

impl Table {
    fn sweep(&mut self, now: u64, interval_us: u64) {
        self.entries.retain(|e| e.is_live(now));
        if self.entries.capacity()
            > self.entries.len().saturating_mul(4).max(16)
        {
            self.entries.shrink_to(self.entries.len(), |e| e.hash);
        }
        self.next_sweep_us = now.saturating_add(interval_us);
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
