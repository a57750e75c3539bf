//! One shard's table: entries of 16 bytes, a bucket name and its TAT, and
//! the two ways they leave: swept once dead, or evicted when the store is
//! full.

use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashTable;

/// A TAT is never 0 once stored (it is at least `now + T`), so 0 marks
/// "none": a placeholder made for a joint decision, or a settled bucket.
pub(super) const NO_TAT: u64 = 0;

/// Set on a TAT while a joint decision holds the bucket: TATs are at most
/// 2^53, so the top bit is free.
pub(super) const LOCKED: u64 = 1 << 63;

/// How many entries a full shard looks at to choose one to evict.
const EVICTION_SAMPLE: usize = 16;

#[derive(Debug, Default)]
pub(super) struct Table {
    pub(super) entries: HashTable<Entry>,
    pub(super) next_sweep_us: u64,
}

#[derive(Debug)]
pub(super) struct Entry {
    /// The bucket's name: a keyed 64-bit hash of (limit, partition).
    pub(super) name: u64,
    pub(super) tat: AtomicU64,
}

impl Entry {
    pub(super) fn new(name: u64, tat: u64) -> Self {
        Entry {
            name,
            tat: AtomicU64::new(tat),
        }
    }

    pub(super) fn hash(&self) -> u64 {
        table_hash(self.name)
    }

    /// The TAT, without the lock bit. Under the table's write lock no bit
    /// is ever set: locks are only taken under a read lock.
    fn tat(&self) -> u64 {
        self.tat.load(Ordering::Relaxed) & !LOCKED
    }

    fn is_live(&self, now_us: u64) -> bool {
        self.tat() > now_us
    }
}

/// The table's hash: the name itself (already uniform).
#[inline]
pub(super) fn table_hash(name: u64) -> u64 {
    name
}

/// What a sweep did.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Swept {
    /// Entries removed.
    pub(super) removed: usize,
    /// Bytes of table storage given back by shrinking.
    pub(super) freed_bytes: usize,
}

impl Table {
    pub(super) fn find(&self, name: u64) -> Option<&Entry> {
        self.entries.find(table_hash(name), |e| e.name == name)
    }

    pub(super) fn insert(&mut self, name: u64, tat: u64) {
        self.entries.insert_unique(
            table_hash(name),
            Entry::new(name, tat),
            Entry::hash,
        );
    }

    /// Drops the dead buckets, and shrinks a table that became mostly empty.
    pub(super) fn sweep(&mut self, now: u64, interval_us: u64) -> Swept {
        let before = self.entries.len();
        self.entries.retain(|e| e.is_live(now));
        let removed = before.saturating_sub(self.entries.len());
        let mut freed_bytes = 0;
        let capacity = self.entries.capacity();
        if capacity > self.entries.len().saturating_mul(4).max(16) {
            self.entries.shrink_to(self.entries.len(), Entry::hash);
            let slots = capacity.saturating_sub(self.entries.capacity());
            // A slot is an entry and a control byte.
            freed_bytes =
                slots.saturating_mul(std::mem::size_of::<Entry>() + 1);
        }
        self.next_sweep_us = now.saturating_add(interval_us);
        Swept {
            removed,
            freed_bytes,
        }
    }

    /// Forgets the bucket nearest to full among a sample (a dead one if the
    /// sample holds one), never one of `keep`: evicting it gives its user
    /// back the least. Returns how far ahead of `now` its TAT was, or `None`
    /// if the table holds nothing to evict.
    pub(super) fn evict_one(&mut self, now: u64, keep: &[u64]) -> Option<u64> {
        let (name, tat) = self
            .entries
            .iter()
            .filter(|e| !keep.contains(&e.name))
            .take(EVICTION_SAMPLE)
            .map(|e| (e.name, e.tat()))
            .min_by_key(|&(_, tat)| tat)?;
        if let Ok(entry) = self
            .entries
            .find_entry(table_hash(name), |e| e.name == name)
        {
            entry.remove();
        }
        Some(tat.saturating_sub(now))
    }
}
