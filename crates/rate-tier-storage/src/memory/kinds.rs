//! Windows, the kind the table does not hold: their logs in one map
//! under one lock, beside the lock-free table of rates and periods and the
//! tables of counts in flight (`slots.rs`).
//!
//! A decision with a window, or with a count among other kinds, is made
//! under that lock, the table's buckets included: its windows and counts
//! are read and decided first (the counts under their shards' write locks,
//! taken after the map); if one refuses, the rates and periods are only
//! read, so nothing is charged; if they pass, the rates and periods are
//! decided by the table as always (atomically among themselves,
//! `mixed.rs`), and the windows' and counts' writes are applied only if
//! the table's buckets passed too. So one decision is all or nothing
//! across every kind, as gcra-core's crate docs say ("Several kinds in one
//! decision"), and two decisions over one window never interleave. The map
//! is locked before any shard: every path that holds both takes them in
//! that order.
//!
//! The windows share the store's capacity with the table (its count of
//! buckets held); counts in flight are beside it, never evicted. A new
//! window in a full store first drops the expired entries of the map and
//! of the tables (at most once per sweep interval), then evicts the window
//! nearest to its expiry among a few (the least given away), else a bucket
//! of the table, as the table does: never one of the decision that needs
//! the room, and reported once the lock is released. A new rate or period
//! in a full store whose table has nothing to evict takes a window's place
//! the same way (`Inner::spare_window`).

use std::collections::HashMap as StdHashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use gcra_core::{CheckError, Decision, Verdict};
use smallvec::SmallVec;

use super::{FEW, Inner, in_table};
use crate::bucket::BucketCheck;
use crate::rule::Rule;
use crate::storage::StorageError;

/// The map of names: a name already is a keyed SipHash of the bucket, so
/// it is its own hash.
type HashMap<K, V> = StdHashMap<K, V, BuildHasherDefault<NameHasher>>;

/// Hashes a name (a `u64`) to itself.
#[derive(Default)]
struct NameHasher(u64);

impl Hasher for NameHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are hashed here; anything else is folded in.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, name: u64) {
        self.0 = name;
    }
}

/// How many entries a full map looks at for one to evict.
const EVICTION_SAMPLE: usize = 16;

/// The windows of a store.
#[derive(Debug, Default)]
pub(super) struct Kinds {
    map: Mutex<HashMap<u64, Kept>>,
    /// When a full map last dropped its expired entries (µs).
    swept_at: AtomicU64,
}

/// A window's log: its entries (the counted requests' timestamps, oldest
/// first) in a ring, and its expiry and place in the ring beside the
/// pointer, in the map's entry. A decision reads the entry, then the few
/// entries at the log's ends that gcra-core's search reads; a pass drops
/// its oldest entries by moving `head` and writes its new ones after the
/// newest, never moving the others. A full ring's newest entry is next to
/// its oldest, so the common decision on a full log (one expired, one
/// appended) touches one or two cache lines of it.
///
/// The ring grows by doubling up to the window's limit (the longest log
/// its decisions write: a log at its limit is exactly its ring), and
/// beyond only to take a longer log (after the limit was raised).
#[derive(Debug)]
struct Kept {
    /// When every entry has expired (µs).
    expires_us: u64,
    /// Where the oldest entry is, and how many there are.
    head: u32,
    len: u32,
    ring: Box<[u64]>,
}

/// The smallest ring a window's log starts with.
const FIRST_RING: usize = 4;

impl Kept {
    /// A new log of `write`'s entries, expiring at `expires_us`, for a
    /// window of `limit`.
    fn new(write: &gcra_core::LogWrite, expires_us: u64, limit: u32) -> Kept {
        let capacity = ring_capacity(write.append, FIRST_RING / 2, limit);
        let mut ring = vec![0; capacity].into_boxed_slice();
        for entry in ring.iter_mut().take(write.append) {
            *entry = write.entry_us;
        }
        Kept {
            expires_us,
            head: 0,
            len: u32::try_from(write.append).unwrap_or(u32::MAX),
            ring,
        }
    }

    /// When every entry has expired (µs).
    #[inline]
    fn expires_us(&self) -> u64 {
        self.expires_us
    }

    /// The entries, oldest first, in two parts (where the ring wraps).
    #[inline]
    fn entries(&self) -> [&[u64]; 2] {
        let (head, len) = (self.head as usize, self.len as usize);
        let (wrapped, from_head) =
            self.ring.split_at(head.min(self.ring.len()));
        let first = len.min(from_head.len());
        [
            from_head.get(..first).unwrap_or(&[]),
            wrapped.get(..len - first).unwrap_or(&[]),
        ]
    }

    /// Applies `write`, growing the ring if the new log does not fit.
    fn write(
        &mut self,
        write: &gcra_core::LogWrite,
        expires_us: u64,
        limit: u32,
    ) {
        let capacity = self.ring.len();
        let kept = write.kept(self.len as usize);
        let new_len = kept.len().saturating_add(write.append);
        self.expires_us = expires_us;
        if new_len <= capacity {
            let head = (self.head as usize + kept.start) % capacity.max(1);
            for j in kept.len()..new_len {
                if let Some(entry) = self.ring.get_mut((head + j) % capacity) {
                    *entry = write.entry_us;
                }
            }
            (self.head, self.len) = (head as u32, new_len as u32);
            return;
        }
        // Grown: the kept entries moved to the front, the new ones after.
        let mut ring =
            vec![0; ring_capacity(new_len, capacity, limit)].into_boxed_slice();
        let [first, second] = self.entries();
        let old = first.iter().chain(second).skip(kept.start).take(kept.len());
        let new = std::iter::repeat_n(write.entry_us, write.append);
        for (slot, entry) in ring.iter_mut().zip(old.copied().chain(new)) {
            *slot = entry;
        }
        self.ring = ring;
        (self.head, self.len) = (0, u32::try_from(new_len).unwrap_or(u32::MAX));
    }
}

/// The ring for a log of `need` entries, grown from one of `capacity`:
/// twice as large, but no larger than the window's `limit` unless the log
/// needs it.
fn ring_capacity(need: usize, capacity: usize, limit: u32) -> usize {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    capacity.saturating_mul(2).min(limit).max(need).max(1)
}

/// A bucket's decision, and the write it makes if the decision stands.
enum Pending {
    /// A window's, with the window's limit (how far its ring may grow).
    Window(Option<gcra_core::LogWrite>, u32),
    /// A count in flight's (`slots.rs`).
    Slot(Option<u32>),
}

impl Kinds {
    /// Entries held.
    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Kept>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Inner {
    /// Drops every entry of the map expired at `now`.
    pub(super) fn sweep_kinds(&self, now: u64) {
        self.drop_expired(&mut self.kinds.lock(), now);
    }

    /// Drops the expired entries of `map`, giving their places back.
    fn drop_expired(&self, map: &mut HashMap<u64, Kept>, now: u64) {
        let before = map.len();
        map.retain(|_, kept| kept.expires_us() > now);
        let dropped = before.saturating_sub(map.len());
        if dropped > 0 {
            self.held.fetch_sub(dropped, Ordering::AcqRel);
        }
    }

    /// Forgets the windows `names` (a reset), holding the map while
    /// `meanwhile` runs: the map is locked before the shards, as every
    /// decision over both locks them.
    pub(super) fn forget_with<T>(
        &self,
        names: &[u64],
        meanwhile: impl FnOnce() -> T,
    ) -> T {
        let mut map = self.kinds.lock();
        let done = meanwhile();
        for name in names {
            if map.remove(name).is_some() {
                self.held.fetch_sub(1, Ordering::AcqRel);
            }
        }
        done
    }

    /// A window's place for a new bucket of the table, when the table has
    /// nothing to evict (see the module docs); only where this thread
    /// holds no lock of the store.
    pub(super) fn spare_window(
        &self,
        now: u64,
        keep: &[u64],
    ) -> Option<Option<u64>> {
        self.evict_window(&mut self.kinds.lock(), now, keep)
    }

    /// Evicts, from a sample of `map`, the window nearest to its expiry
    /// (never one of `keep`), keeping its place
    /// for the caller: `Some` with its debt (`None` for an expired one),
    /// or `None` if the map holds none.
    fn evict_window(
        &self,
        map: &mut HashMap<u64, Kept>,
        now: u64,
        keep: &[u64],
    ) -> Option<Option<u64>> {
        let (name, expires_us) = map
            .iter()
            .filter(|(name, _)| !keep.contains(name))
            .take(EVICTION_SAMPLE)
            .min_by_key(|(_, kept)| kept.expires_us())
            .map(|(&name, kept)| (name, kept.expires_us()))?;
        map.remove(&name);
        // An entry already expired is gone, not evicted.
        Some((expires_us > now).then(|| expires_us - now))
    }

    /// A place for a new window: reserved, or made (see [`make_room`]);
    /// the debt of the bucket evicted for it, if any.
    fn window_place(
        &self,
        map: &mut HashMap<u64, Kept>,
        now: u64,
        keep: &[u64],
    ) -> Option<u64> {
        if self.reserve() {
            return None;
        }
        match make_room(map, now, self, keep) {
            Some(debt_us) => debt_us,
            None => {
                // Every place is another decision's for a moment (or the
                // capacity is below one decision's buckets): over the
                // bound by one, as the decision needs.
                self.held.fetch_add(1, Ordering::AcqRel);
                None
            }
        }
    }

    /// One window alone, on a live bucket: decided and written under one
    /// lookup. `None` when the bucket is absent or expired (the general
    /// path then makes it, with room).
    pub(super) fn decide_live_alone(
        &self,
        check: &BucketCheck<'_>,
        now: u64,
        out: &mut Decision,
    ) -> Result<Option<Verdict>, StorageError> {
        let (name, _) = self.name(check);
        let mut map = self.kinds.lock();
        let Some(kept) = map.get_mut(&name).filter(|k| k.expires_us() > now)
        else {
            return Ok(None);
        };
        let Some((decision, write)) =
            decide(check, Some(kept.entries()), 0, now)?
        else {
            return Ok(None);
        };
        if write_in_place(kept, write, now).is_err() {
            return Ok(None);
        }
        *out = decision;
        Ok(Some(Verdict::of(
            std::iter::once(check.is_shadow()),
            std::slice::from_ref(out),
        )))
    }

    /// A decision with at least one window, period or concurrency limit:
    /// see the module docs.
    pub(super) fn decide_kinds(
        &self,
        checks: &[BucketCheck<'_>],
        now: u64,
        out: &mut [Decision],
    ) -> Result<Verdict, StorageError> {
        if !crate::bucket::distinct(checks) {
            return Err(StorageError::DuplicateBucket);
        }
        // Declared before the lock, so dropped after it: the evictions are
        // reported once the map is unlocked, on every path out.
        let mut evicted = Evictions {
            inner: self,
            debts: SmallVec::new(),
        };
        let mut map = self.kinds.lock();
        // The counts' shards after the map, before any of the table's.
        let mut slots = self.lock_slots(checks);
        let mut names: SmallVec<[u64; FEW]> = SmallVec::new();
        let mut shards: SmallVec<[usize; FEW]> = SmallVec::new();
        let mut pending: SmallVec<[Option<Pending>; FEW]> = SmallVec::new();
        let mut refused = false;
        for (check, slot) in checks.iter().zip(out.iter_mut()) {
            let (name, shard) = self.name(check);
            names.push(name);
            shards.push(shard);
            let kept = map.get(&name).filter(|k| k.expires_us() > now);
            let held = slots.count(name, shard);
            let decided = decide(check, kept.map(Kept::entries), held, now)?;
            if let Some((decision, write)) = decided {
                refused |= !decision.allowed && !check.is_shadow();
                *slot = decision;
                pending.push(Some(write));
            } else {
                pending.push(None);
            }
        }

        // The rates and periods: charged only when every window passed.
        let table: SmallVec<[usize; FEW]> = (0..checks.len())
            .filter(|&i| in_table(&checks[i]))
            .collect();
        let mut table_allowed = true;
        if !table.is_empty() {
            let table_checks: SmallVec<[BucketCheck<'_>; FEW]> =
                table.iter().map(|&i| checks[i]).collect();
            let mut table_out: SmallVec<[Decision; FEW]> =
                SmallVec::from_elem(Decision::default(), table.len());
            let verdict = {
                // Room for the table's new buckets from a window, through
                // the map this decision holds; never one of its own.
                let (map, keep) = (&mut *map, names.as_slice());
                let mut spare =
                    |now: u64, _: &[u64]| self.evict_window(map, now, keep);
                self.decide_table(
                    &table_checks,
                    now,
                    &mut table_out,
                    refused,
                    &mut spare,
                    Some(&mut evicted.debts),
                )?
            };
            table_allowed = verdict.allowed;
            for (&i, decision) in table.iter().zip(&table_out) {
                out[i] = *decision;
            }
        }
        let allowed = !refused && table_allowed;

        // The writes of the windows and counts: all of them if the
        // decision stands; else only a refusing bucket's repair, and a
        // bucket that passed answers with a read of its state.
        for (i, write) in pending.into_iter().enumerate() {
            let Some(write) = write else { continue };
            let passed = out[i].allowed;
            let (name, shard) = (names[i], shards[i]);
            if allowed || !passed {
                match write {
                    Pending::Slot(Some(count)) => slots.set(name, shard, count),
                    Pending::Slot(None) => {}
                    write => {
                        let keep = names.as_slice();
                        apply(
                            &mut map,
                            name,
                            write,
                            now,
                            self,
                            keep,
                            &mut evicted,
                        );
                    }
                }
            } else {
                let kept = map.get(&name).filter(|k| k.expires_us() > now);
                let peek = checks[i].as_peek();
                let held = slots.count(name, shard);
                if let Some((decision, _)) =
                    decide(&peek, kept.map(Kept::entries), held, now)?
                {
                    out[i] = decision;
                }
            }
        }
        let shadows = checks.iter().map(BucketCheck::is_shadow);
        Ok(Verdict::of(shadows, out))
    }
}

/// A window's decision on what it keeps, or a count's on the count in
/// flight `held` (`None`: a rate's or a period's bucket, decided by the
/// table).
fn decide(
    check: &BucketCheck<'_>,
    log: Option<[&[u64]; 2]>,
    held: u32,
    now: u64,
) -> Result<Option<(Decision, Pending)>, CheckError> {
    Ok(match check.rule() {
        Rule::Rate(_) | Rule::Period(_) => None,
        Rule::Window(window) => {
            let log = log.unwrap_or([&[], &[]]);
            // Only this store's decisions write its logs: always sorted.
            let decided = window.check_sorted_parts(log, now, check.cost())?;
            let write = Pending::Window(decided.write, window.limit());
            Some((decided.as_decision(), write))
        }
        Rule::Concurrency(concurrency) => {
            let decided = concurrency.acquire(held, check.cost())?;
            Some((decided.as_decision(), Pending::Slot(decided.write)))
        }
    })
}

/// Applies a decision's write to the bucket `name`.
fn apply(
    map: &mut HashMap<u64, Kept>,
    name: u64,
    write: Pending,
    now: u64,
    inner: &Inner,
    keep: &[u64],
    evicted: &mut Evictions<'_>,
) {
    // A live bucket of the same kind is written in place (no second
    // lookup); anything else read as absent, and is replaced.
    let write = match map.get_mut(&name).filter(|kept| kept.expires_us() > now)
    {
        Some(kept) => match write_in_place(kept, write, now) {
            Ok(()) => return,
            Err(write) => write,
        },
        None => write,
    };
    let Some(kept) = fresh(write, now) else {
        return;
    };
    // The place of what it replaces (an expired window) goes to it.
    if !map.contains_key(&name) {
        evicted.debts.extend(inner.window_place(map, now, keep));
    }
    map.insert(name, kept);
}

fn expiry(now: u64, ttl_ms: u64) -> u64 {
    now.saturating_add(ttl_ms.saturating_mul(1000))
}

/// Writes `write` into `kept`, a live window; gives back a count's write
/// (never made here: counts are in `slots.rs`).
fn write_in_place(
    kept: &mut Kept,
    write: Pending,
    now: u64,
) -> Result<(), Pending> {
    match write {
        Pending::Window(None, _) | Pending::Slot(None) => {}
        Pending::Window(Some(write), limit) => {
            kept.write(&write, expiry(now, write.ttl_ms), limit);
        }
        write @ Pending::Slot(Some(_)) => return Err(write),
    }
    Ok(())
}

/// A new bucket holding `write` (`None`: a write that writes nothing).
fn fresh(write: Pending, now: u64) -> Option<Kept> {
    match write {
        Pending::Window(None, _) | Pending::Slot(_) => None,
        Pending::Window(Some(write), limit) => {
            Some(Kept::new(&write, expiry(now, write.ttl_ms), limit))
        }
    }
}

/// Room for a new window in a full store: the expired entries of the map
/// and of the tables dropped, else the window of a sample nearest to its
/// expiry evicted, else a bucket of the table; `Some` with the debt of the
/// one evicted (`None` when it had expired), for the caller to report once
/// it unlocked the map. `None` when no place could be had.
///
/// Never one of `keep`, the buckets of the decision making room (as the
/// table): one of them evicted here would be written afresh, or not at
/// all, after the decision answered with its count, so a window that said
/// "0 remaining" would hold one entry and give its limit again. Only when
/// every entry held is the decision's own (a capacity below the buckets of
/// one decision) is one of them taken, to keep the bound.
///
/// Never a count in flight either (they are in tables of their own, which
/// make no room): forgetting one would let more requests run at once than
/// the limit.
///
/// The expired entries are dropped at most once per sweep interval (as the
/// table sweeps): a flood of new buckets into a full map costs a sample
/// each, never a scan of the store.
///
/// The eviction is not reported here: a listener runs under no lock of the
/// store (one that reads the store, its size for a gauge, would deadlock on
/// this map's lock).
fn make_room(
    map: &mut HashMap<u64, Kept>,
    now: u64,
    inner: &Inner,
    keep: &[u64],
) -> Option<Option<u64>> {
    let swept = &inner.kinds.swept_at;
    if now
        >= swept
            .load(Ordering::Relaxed)
            .saturating_add(inner.sweep_interval_us)
    {
        swept.store(now, Ordering::Relaxed);
        inner.drop_expired(map, now);
        // The map is locked before the shards: this order is every path's.
        inner.sweep_due(now);
        if inner.reserve() {
            return Some(None);
        }
    }
    inner
        .evict_window(map, now, keep)
        .or_else(|| inner.evict_anywhere(now, keep).map(Some))
        .or_else(|| inner.evict_window(map, now, &[]))
}

/// The evictions of one decision, reported when it is dropped: after the
/// map's lock, which is taken after it.
struct Evictions<'a> {
    inner: &'a Inner,
    debts: SmallVec<[u64; FEW]>,
}

impl Drop for Evictions<'_> {
    fn drop(&mut self) {
        for &debt_us in &self.debts {
            self.inner.evicted(debt_us);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use gcra_core::{Decision, Window};

    use crate::bucket::{BucketCheck, LimitName};
    use crate::clock::FakeClock;
    use crate::event::StorageEvent;
    use crate::memory::MemoryStorage;
    use crate::storage::Storage;

    const START_US: u64 = 1_000_000_000;
    const SECOND: u64 = 1_000_000;

    /// One request of `user` on `login`, 5 a minute in a sliding window.
    fn login(store: &MemoryStorage, name: &LimitName, user: &str) {
        let window = Window::new(5, Duration::from_secs(60)).unwrap();
        let check = BucketCheck::of_rule(name, user, window.into(), 1).unwrap();
        let mut out = [Decision::default()];
        assert!(
            store
                .check_sync(&[check], &mut out)
                .unwrap()
                .verdict
                .allowed
        );
    }

    #[test]
    fn a_sweep_drops_a_window_from_its_expiry_on_and_frees_its_place() {
        let clock = FakeClock::at_us(START_US);
        let store = MemoryStorage::builder()
            .clock(clock.clone())
            .capacity(1)
            .build();
        let name = LimitName::of_limit("login").unwrap();
        login(&store, &name, "ana");
        // Its only entry counts until a minute after it: kept till then.
        clock.advance(Duration::from_micros(60 * SECOND - 1));
        store.sweep();
        assert_eq!(store.len(), 1);
        clock.advance(Duration::from_micros(1));
        store.sweep();
        assert_eq!(store.len(), 0);
        // Its place is free again: a new window evicts no one.
        login(&store, &name, "bea");
        assert_eq!((store.len(), store.evictions()), (1, 0));
    }

    #[test]
    fn a_new_window_in_a_full_store_evicts_a_live_one_and_reuses_an_expired_one()
     {
        let clock = FakeClock::at_us(START_US);
        let store = MemoryStorage::builder()
            .clock(clock.clone())
            .capacity(1)
            .sweep_interval(Duration::from_secs(100))
            .build();
        let heard = Arc::new(Mutex::new(Vec::new()));
        let _subscription = store.subscribe({
            let heard = heard.clone();
            Arc::new(move |e: &StorageEvent| {
                heard.lock().unwrap().push(e.clone())
            })
        });
        let name = LimitName::of_limit("login").unwrap();
        login(&store, &name, "ana");
        // A second of ana's minute gone: hers is evicted, 59 s of it left.
        clock.advance(Duration::from_secs(1));
        login(&store, &name, "bea");
        // bea's has just expired (no sweep is due): its place is taken, and
        // that is no eviction.
        clock.advance(Duration::from_secs(60));
        login(&store, &name, "cai");
        assert_eq!(store.len(), 1);
        assert_eq!(store.evictions(), 1);
        assert_eq!(
            *heard.lock().unwrap(),
            [StorageEvent::Evicted {
                debt_us: 59 * SECOND
            }]
        );
    }
}
