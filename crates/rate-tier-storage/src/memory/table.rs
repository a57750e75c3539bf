//! One shard's table: entries of 16 bytes, a bucket name and its word (a
//! rate's TAT or a period's packed count, see `period.rs`), and
//! the two ways they leave: swept once dead, or evicted when the store is
//! full.

use crate::sync::{AtomicU64, Ordering};

use hashbrown::HashTable;

/// A TAT is never 0 once stored (it is at least `now + T`), so 0 marks
/// "none": a bucket a refund left full.
pub(super) const NO_TAT: u64 = 0;

/// Set on a word while a joint decision holds the bucket: TATs are at most
/// 2^53, and a period's word leaves it free, so the top bit is free.
pub(super) const LOCKED: u64 = 1 << 63;

/// How many entries a full shard looks at to choose one to evict.
const EVICTION_SAMPLE: usize = 16;

#[derive(Debug, Default)]
pub(super) struct Table {
    pub(super) entries: HashTable<Entry>,
    pub(super) next_sweep_us: u64,
    /// Where the next eviction sample starts, as a slot index: a clock
    /// hand, so that samples walk the whole table. Always sampling from
    /// the start would drain the first slots until a sample of 16 spans
    /// the whole table (under a flood, every new id scanned it).
    evict_hand: usize,
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

    /// When the bucket is dead: its TAT, or a period's next start (see
    /// `period.rs`), the lock bit ignored. Under the table's write lock no
    /// bit is ever set: locks are only taken under a read lock.
    fn expiry(&self) -> u64 {
        super::period::expiry(self.tat.load(Ordering::Relaxed))
    }

    fn is_live(&self, now_us: u64) -> bool {
        self.expiry() > now_us
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
    #[inline]
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
        self.sweep_by(now, interval_us, |e| e.is_live(now))
    }

    /// Drops the entries `live` rejects, and shrinks a table that became
    /// mostly empty (a table of counts in flight keeps its nonzero ones).
    pub(super) fn sweep_by(
        &mut self,
        now: u64,
        interval_us: u64,
        live: impl Fn(&Entry) -> bool,
    ) -> Swept {
        let before = self.entries.len();
        self.entries.retain(|e| live(e));
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
    /// back the least. The sample is the next [`EVICTION_SAMPLE`] entries
    /// from the clock hand. Returns how far ahead of `now` its expiry was
    /// (a rate's TAT, a period's next start), or
    /// `None` if the table holds nothing to evict.
    pub(super) fn evict_one(&mut self, now: u64, keep: &[u64]) -> Option<u64> {
        let slots = self.entries.num_buckets();
        let mut chosen: Option<(usize, u64)> = None;
        let mut sampled = 0;
        let mut index = self.evict_hand;
        // At most one lap: a table of fewer entries is sampled whole.
        for _ in 0..slots {
            index = if index + 1 >= slots { 0 } else { index + 1 };
            let Some(entry) = self.entries.get_bucket(index) else {
                continue;
            };
            if keep.contains(&entry.name) {
                continue;
            }
            // A rate's TAT, or a period's next start: the nearest is the
            // least given away.
            let expiry = entry.expiry();
            if chosen.is_none_or(|(_, least)| expiry < least) {
                chosen = Some((index, expiry));
            }
            sampled += 1;
            if sampled == EVICTION_SAMPLE {
                break;
            }
        }
        self.evict_hand = index;
        let (index, expiry) = chosen?;
        if let Ok(entry) = self.entries.get_bucket_entry(index) {
            entry.remove();
        }
        Some(expiry.saturating_sub(now))
    }
}

#[cfg(test)]
mod tests {
    use super::{EVICTION_SAMPLE, Table};

    fn filled(count: u64, tat: u64) -> Table {
        let mut table = Table::default();
        for name in 1..=count {
            // Spread names: the table hashes by the name itself.
            table.insert(name.wrapping_mul(0x9e37_79b9_7f4a_7c15), tat);
        }
        table
    }

    #[test]
    fn the_samples_walk_the_whole_table() {
        let count = 1_000;
        let mut table = filled(count, 1_000);
        // The entry nearest to full sits in the last occupied slot: a
        // sample that always began at the first slot would reach it only
        // once nearly everything else was gone.
        let last = (0..table.entries.num_buckets())
            .rev()
            .find_map(|i| table.entries.get_bucket(i).map(|e| e.name))
            .expect("a full table");
        table
            .find(last)
            .expect("held")
            .tat
            .store(10, std::sync::atomic::Ordering::Relaxed);
        let lap = usize::try_from(count).expect("small") / EVICTION_SAMPLE + 2;
        let mut debts = Vec::new();
        for _ in 0..lap {
            debts.push(table.evict_one(0, &[]).expect("something to evict"));
        }
        assert!(table.find(last).is_none(), "one lap never sampled it");
        assert!(debts.contains(&10), "{debts:?}");
    }

    #[test]
    fn an_eviction_never_takes_a_kept_bucket() {
        let mut table = filled(40, 1_000);
        let keep: Vec<u64> = table.entries.iter().map(|e| e.name).collect();
        let (spared, others) = keep.split_at(30);
        for _ in 0..others.len() {
            table.evict_one(0, spared).expect("one to evict");
        }
        assert_eq!(table.evict_one(0, spared), None, "only kept ones left");
        assert!(spared.iter().all(|&name| table.find(name).is_some()));
        assert_eq!(table.entries.len(), spared.len());
    }
}
