//! Resets seen by every instance: a refusal an instance remembers
//! (`refusals.rs`) must not outlive a reset made through another one (an
//! operator lifting a ban behind a load balancer cannot choose the
//! instance).
//!
//! A reset writes a new random value under [`RESETS_KEY`]; every store
//! reads that key every [`POLL`] and, when it changed, forgets every
//! refusal it remembers. A store answers from its memory only while its
//! last read is under [`FRESH`] old, so a reset reaches every instance's
//! memory within about a second, or the memory is not used: a Redis that
//! does not answer the read, or a store outside a Tokio runtime (no task
//! to read it), answers every decision from Redis. One `GET` every 250 ms
//! per instance; it works alike on a single Redis and a Redis Cluster, and
//! with any connection (no subscriber connection to open).

use std::hash::{BuildHasher, Hasher};
use std::sync::Weak;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ::redis::Value;

use super::Shared;
use super::link::Conn;

/// The key every reset rewrites: its value means nothing but that it
/// changed.
pub(super) const RESETS_KEY: &str = "trt:resets";

/// How often each store reads [`RESETS_KEY`].
pub(super) const POLL: Duration = Duration::from_millis(250);

/// How long after its last read a store still answers from memory.
pub(super) const FRESH: Duration = Duration::from_secs(1);

/// What a store knows of the resets: the value it last read, and until
/// when that read vouches for its memory.
#[derive(Debug)]
pub(super) struct Resets {
    origin: Instant,
    /// A hash of the value last read; [`NEVER`] before the first read.
    seen: AtomicU64,
    /// Nanoseconds after `origin` until which the memory may answer.
    fresh_until_ns: AtomicU64,
}

const NEVER: u64 = u64::MAX;

impl Default for Resets {
    fn default() -> Self {
        Resets {
            origin: Instant::now(),
            seen: AtomicU64::new(NEVER),
            fresh_until_ns: AtomicU64::new(0),
        }
    }
}

impl Resets {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether a read of the resets is recent enough for the memory to
    /// answer.
    pub(super) fn fresh(&self) -> bool {
        self.now_ns() < self.fresh_until_ns.load(Ordering::Acquire)
    }

    /// A read of [`RESETS_KEY`] that answered `value`, sent at `sent_ns`:
    /// the memory is forgotten when the value changed (or on the first
    /// read, which cannot tell what came before), then vouched for until
    /// [`FRESH`] after the read was sent.
    fn read(&self, value: u64, sent_ns: u64, forget: impl FnOnce()) {
        if self.seen.swap(value, Ordering::AcqRel) != value || value == NEVER {
            forget();
        }
        let fresh = sent_ns.saturating_add(duration_ns(FRESH));
        self.fresh_until_ns.fetch_max(fresh, Ordering::AcqRel);
    }
}

fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// A value for [`RESETS_KEY`] that no other reset writes.
pub(super) fn new_value() -> String {
    let mut hasher =
        std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(Instant::now().elapsed().as_nanos());
    format!("{:016x}", hasher.finish())
}

/// Reads [`RESETS_KEY`] every [`POLL`] for as long as the store lives, on
/// the current Tokio runtime; without one, nothing (and the memory never
/// answers).
pub(super) fn watch(shared: Weak<Shared>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        loop {
            let Some(store) = shared.upgrade() else {
                return;
            };
            let sent_ns = store.resets.now_ns();
            let conn = store.link.current();
            if let Ok(Some(value)) =
                tokio::time::timeout(FRESH / 2, read(&conn)).await
            {
                store.resets.read(value, sent_ns, || store.refusals.clear());
            }
            drop((conn, store));
            tokio::time::sleep(POLL).await;
        }
    });
}

/// The value under [`RESETS_KEY`], hashed (none, or a value this crate did
/// not write, is a value like any other); `None` if Redis did not answer.
async fn read(conn: &Conn) -> Option<u64> {
    let get = ::redis::cmd("GET").arg(RESETS_KEY).to_owned();
    let value = match conn {
        Conn::Single(single) => {
            get.query_async::<Value>(&mut single.clone()).await
        }
        Conn::Cluster(cluster) => {
            get.query_async::<Value>(&mut cluster.clone()).await
        }
    }
    .ok()?;
    let mut hasher = std::hash::DefaultHasher::new();
    match value {
        Value::BulkString(bytes) => hasher.write(&bytes),
        Value::Nil => hasher.write_u8(0),
        other => hasher.write(format!("{other:?}").as_bytes()),
    }
    // NEVER is kept for "not read yet".
    Some(hasher.finish().min(NEVER - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_value_forgets_the_memory_and_a_read_vouches_for_a_second() {
        let resets = Resets::default();
        assert!(!resets.fresh(), "not read yet");
        let mut forgotten = 0;
        resets.read(7, resets.now_ns(), || forgotten += 1);
        assert_eq!(forgotten, 1, "the first read cannot tell what came before");
        assert!(resets.fresh());
        resets.read(7, resets.now_ns(), || forgotten += 1);
        assert_eq!(forgotten, 1, "the same value: nothing to forget");
        resets.read(8, resets.now_ns(), || forgotten += 1);
        assert_eq!(forgotten, 2);
        // A read sent long ago vouches for nothing now.
        let late = Resets::default();
        late.fresh_until_ns.store(0, Ordering::Release);
        late.read(8, 0, || {});
        late.fresh_until_ns.store(1, Ordering::Release);
        assert!(!late.fresh());
    }

    #[test]
    fn every_reset_writes_a_value_of_its_own() {
        let values: std::collections::HashSet<String> =
            (0..1000).map(|_| new_value()).collect();
        assert_eq!(values.len(), 1000);
    }

    #[test]
    fn a_read_vouches_for_a_second_from_when_it_was_sent() {
        let resets = Resets {
            origin: Instant::now().checked_sub(2 * FRESH).unwrap(),
            ..Resets::default()
        };
        resets.read(7, 0, || {});
        assert!(!resets.fresh(), "a read sent two seconds ago");
        resets.read(7, resets.now_ns(), || {});
        assert!(resets.fresh(), "a read sent now");
    }
}
