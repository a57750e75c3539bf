//! Room for new buckets: the store's exact capacity bound, the evictions
//! that make a place when it is full (the bucket nearest to full among a
//! sample, never one of the decision's own), and the sweeps that drop dead
//! buckets first.

use smallvec::SmallVec;

use super::table::Table;
use super::{Inner, ROOM_ATTEMPTS, Shard, mixed, trim, write};
use crate::event::StorageEvent;
use crate::storage::StorageError;
use std::sync::RwLockWriteGuard;
use std::sync::atomic::Ordering;

/// A shard's write lock with a place reserved for a new entry, and the
/// eviction that made it, to report once the lock is released.
pub(super) struct Room<'a> {
    pub(super) table: RwLockWriteGuard<'a, Table>,
    pub(super) evicted: Option<u64>,
}

impl Inner {
    /// `count` places reserved for new buckets of one decision, evicting
    /// (never one of `keep`) where the store is full.
    pub(super) fn places(
        &self,
        count: usize,
        keep: &[u64],
        now: u64,
    ) -> Result<Places<'_>, StorageError> {
        self.places_with(count, keep, now, &mut |now, keep| {
            self.spare_window(now, keep)
        })
    }

    /// [`places`](Self::places), taking a window's place through `spare`
    /// when the table has nothing to evict (it returns the evicted
    /// window's debt, `None` for an expired one).
    pub(super) fn places_with(
        &self,
        count: usize,
        keep: &[u64],
        now: u64,
        spare: &mut mixed::Spare<'_>,
    ) -> Result<Places<'_>, StorageError> {
        let mut places = Places {
            inner: self,
            reserved: 0,
            evicted: SmallVec::new(),
        };
        let mut tries = 0;
        while places.reserved < count {
            if self.reserve() {
                places.reserved += 1;
                continue;
            }
            let evicted = self
                .evict_anywhere(now, keep)
                .map(Some)
                .or_else(|| spare(now, keep));
            match evicted {
                Some(debt_us) => {
                    places.reserved += 1;
                    places.evicted.extend(debt_us);
                }
                None if tries < ROOM_ATTEMPTS => {
                    // Every place is in a decision's hands for a moment.
                    tries += 1;
                    std::thread::yield_now();
                }
                None => return Err(full()),
            }
        }
        Ok(places)
    }

    /// The write lock of `shard` with a place reserved for `name`'s new
    /// entry: after a sweep if one is due, and an eviction if the store is
    /// full (never one of `keep`). If `name` turns out to exist, no place is
    /// reserved.
    ///
    /// The place of an evicted bucket goes to the new one directly (the
    /// count of buckets held does not move): no other insert can take it in
    /// between, so under any contention one eviction makes room for one
    /// insert, and the search ends.
    pub(super) fn room_for<'a>(
        &'a self,
        shard: &'a Shard,
        name: u64,
        now: u64,
        keep: &[u64],
    ) -> Result<Room<'a>, StorageError> {
        for _ in 0..ROOM_ATTEMPTS {
            let mut table = write(&shard.table);
            if table.find(name).is_some() {
                return Ok(Room {
                    table,
                    evicted: None,
                });
            }
            if now >= table.next_sweep_us {
                self.sweep_table(&mut table, now);
            }
            if self.reserve() {
                return Ok(Room {
                    table,
                    evicted: None,
                });
            }
            if let Some(debt_us) = table.evict_one(now, keep) {
                return Ok(Room {
                    table,
                    evicted: Some(debt_us),
                });
            }
            // This shard holds nothing to evict: a place from another one,
            // one lock at a time, or a window's (no lock is held here).
            drop(table);
            let evicted = self
                .evict_anywhere(now, keep)
                .map(Some)
                .or_else(|| self.spare_window(now, keep));
            if let Some(debt_us) = evicted {
                if let Some(debt_us) = debt_us {
                    self.evicted(debt_us);
                }
                let table = write(&shard.table);
                if table.find(name).is_some() {
                    // Not needed after all: the place goes back.
                    self.held.fetch_sub(1, Ordering::AcqRel);
                }
                return Ok(Room {
                    table,
                    evicted: None,
                });
            }
            // Every place is in a decision's hands for a moment.
            std::thread::yield_now();
        }
        Err(full())
    }

    /// Releases a [`Room`]'s lock, then reports its eviction (listeners
    /// never run under a shard's lock).
    pub(super) fn made(&self, room: Room<'_>) {
        let evicted = room.evicted;
        drop(room);
        if let Some(debt_us) = evicted {
            self.evicted(debt_us);
        }
    }

    /// Evicts one bucket from any shard (never one of `keep`), keeping its
    /// place for the caller; returns how far ahead its TAT was.
    pub(super) fn evict_anywhere(&self, now: u64, keep: &[u64]) -> Option<u64> {
        self.shards
            .iter()
            .find_map(|shard| write(&shard.table).evict_one(now, keep))
    }

    /// Counts and reports an eviction whose place was handed on.
    pub(super) fn evicted(&self, debt_us: u64) {
        self.evictions.fetch_add(1, Ordering::Relaxed);
        self.listeners
            .emit_with(|| StorageEvent::Evicted { debt_us });
    }

    /// Reserves a place before an insert: two inserts in two shards cannot
    /// both take the last one.
    pub(super) fn reserve(&self) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < self.capacity).then(|| held.saturating_add(1))
            })
            .is_ok()
    }

    pub(super) fn sweep_table(&self, table: &mut Table, now: u64) {
        let swept = table.sweep(now, self.sweep_interval_us);
        self.held.fetch_sub(swept.removed, Ordering::AcqRel);
        self.freed_bytes
            .fetch_add(swept.freed_bytes, Ordering::Relaxed);
    }

    /// Sweeps the tables whose sweep is due (a full store's windows make
    /// room with the periods and rates that died too).
    pub(super) fn sweep_due(&self, now: u64) {
        for shard in &*self.shards {
            let mut table = write(&shard.table);
            if now >= table.next_sweep_us {
                self.sweep_table(&mut table, now);
            }
        }
    }

    pub(super) fn sweep_all(&self) {
        let now = self.clock.now_us();
        // The windows' map first: it is locked before the shards.
        self.sweep_kinds(now);
        for shard in &*self.shards {
            self.sweep_table(&mut write(&shard.table), now);
        }
        self.sweep_slots(now);
        // Tables freed by this sweep or by inserts' since the last trim.
        if self.freed_bytes.load(Ordering::Relaxed) >= trim::TRIM_AFTER {
            self.freed_bytes.store(0, Ordering::Relaxed);
            trim::trim();
        }
        self.sweeps.fetch_add(1, Ordering::Release);
    }
}

/// Places reserved for new buckets ([`Inner::places`]), and the evictions
/// that made them, reported once every lock is released. Places not taken
/// are given back when it is dropped.
pub(super) struct Places<'a> {
    inner: &'a Inner,
    /// Places held for new buckets: counted in `held`, no entry yet.
    pub(super) reserved: usize,
    pub(super) evicted: SmallVec<[u64; 4]>,
}

impl Drop for Places<'_> {
    fn drop(&mut self) {
        if self.reserved > 0 {
            self.inner.held.fetch_sub(self.reserved, Ordering::AcqRel);
        }
        for &debt_us in &self.evicted {
            self.inner.evicted(debt_us);
        }
    }
}

/// No place can be made: every bucket held belongs to a decision in flight.
fn full() -> StorageError {
    StorageError::Backend(
        "memory storage: every bucket is held by a decision in flight: the \
         capacity is below the buckets decided at once"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::super::{MemoryStorage, ROOM_ATTEMPTS};
    use crate::storage::StorageError;

    /// A store of one place, held by a decision in flight (reserved, no
    /// entry yet): nothing to evict.
    fn held_elsewhere() -> MemoryStorage {
        let store = MemoryStorage::builder().capacity(1).build();
        assert!(store.inner.reserve());
        store
    }

    #[test]
    fn a_place_given_back_by_a_decision_in_flight_is_waited_for() {
        let store = held_elsewhere();
        let inner = &*store.inner;
        let mut looked = 0;
        let places = inner
            .places_with(1, &[], 0, &mut |_, _| {
                looked += 1;
                // The other decision ends (its place unused) on the third
                // look.
                if looked == 3 {
                    inner.held.fetch_sub(1, Ordering::AcqRel);
                }
                None
            })
            .map(|places| places.reserved);
        assert_eq!(places.ok(), Some(1));
        assert_eq!(looked, 3);
        // Dropped untaken, the place was given back.
        assert!(inner.reserve());
    }

    #[test]
    fn a_place_never_given_back_is_waited_for_a_bounded_number_of_times() {
        let store = held_elsewhere();
        let mut looked = 0;
        let places = store.inner.places_with(1, &[], 0, &mut |_, _| {
            looked += 1;
            None
        });
        assert!(matches!(places, Err(StorageError::Backend(_))));
        assert_eq!(looked, ROOM_ATTEMPTS + 1);
    }
}
