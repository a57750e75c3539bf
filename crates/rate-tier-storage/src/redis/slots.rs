//! Which node of a Redis Cluster holds a bucket: the failure domain of its
//! checks.
//!
//! One node down must not send every user to the local fallback, nor make
//! every user pay its timeout: a [`FallbackStorage`](crate::FallbackStorage)
//! keeps a breaker per node, by what [`Storage::failure_domain`] says. The
//! map from slot to master (`CLUSTER SLOTS`, asked of a random node) is
//! read in the background every [`REFRESH`], and at once after a failure
//! (at most every [`REFRESH_AFTER_FAILURE`]): after a failover the promoted
//! replica is a new domain, with a closed breaker, and its users are
//! shared again.
//!
//! [`Storage::failure_domain`]: crate::Storage::failure_domain

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use ::redis::Value;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use arc_swap::ArcSwap;
use tokio::sync::Notify;

use crate::clock::{Clock, MonotonicClock};

/// How often the map is read when all is well.
pub(super) const REFRESH: Duration = Duration::from_secs(2);
/// The shortest time between two reads asked for by failures.
pub(super) const REFRESH_AFTER_FAILURE: Duration = Duration::from_millis(200);

const SLOTS: usize = 16_384;

/// The masters and which one owns each slot.
#[derive(Debug, Default)]
struct Table {
    masters: Vec<Arc<str>>,
    /// Per slot: 1 + the index of its master in `masters`; 0 when unknown.
    owner: Vec<u16>,
}

/// The slot map of one cluster connection, kept fresh by a task.
pub(super) struct Slots {
    table: ArcSwap<Table>,
    wake: Notify,
    last_read_us: AtomicU64,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("masters", &self.table.load().masters)
            .finish_non_exhaustive()
    }
}

impl Slots {
    /// An empty map; [`Slots::keep_fresh`] fills it.
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Slots {
            table: ArcSwap::from_pointee(Table::default()),
            wake: Notify::new(),
            last_read_us: AtomicU64::new(0),
        })
    }

    /// The master that owns `slot`, as `host:port`, if known.
    pub(super) fn owner(&self, slot: u16) -> Option<Arc<str>> {
        let table = self.table.load();
        let index = usize::from(*table.owner.get(usize::from(slot))?);
        table.masters.get(index.checked_sub(1)?).cloned()
    }

    /// A call failed: read the map again soon (a failover may have moved
    /// the slot).
    pub(super) fn failed(&self) {
        self.wake.notify_one();
    }

    /// Reads the map now and every [`REFRESH`], or sooner after a
    /// failure, for as long as the store lives. Needs a Tokio runtime; a
    /// store built outside one keeps an empty map (one failure domain).
    pub(super) fn keep_fresh(
        slots: &Arc<Slots>,
        conn: impl Fn() -> Option<ClusterConnection> + Send + 'static,
        timeout: Duration,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak: Weak<Slots> = Arc::downgrade(slots);
        runtime.spawn(async move {
            loop {
                let Some(slots) = weak.upgrade() else { return };
                if let Some(mut conn) = conn() {
                    slots.read(&mut conn, timeout).await;
                }
                let wait = tokio::time::sleep(REFRESH);
                tokio::select! {
                    () = wait => {}
                    () = slots.wake.notified() => {
                        // Failures come in bursts: one read for a burst.
                        let since = MonotonicClock
                            .now_us()
                            .saturating_sub(slots.last_read_us.load(Ordering::Relaxed));
                        let floor = u64::try_from(REFRESH_AFTER_FAILURE.as_micros()).unwrap_or(u64::MAX);
                        if since < floor {
                            tokio::time::sleep(Duration::from_micros(floor - since)).await;
                        }
                    }
                }
            }
        });
    }

    async fn read(&self, conn: &mut ClusterConnection, timeout: Duration) {
        self.last_read_us
            .store(MonotonicClock.now_us(), Ordering::Relaxed);
        let mut cmd = ::redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let reply =
            tokio::time::timeout(timeout, conn.route_command(cmd, routing))
                .await;
        if let Ok(Ok(reply)) = reply
            && let Some(table) = parse(&reply)
        {
            self.table.store(Arc::new(table));
        }
    }
}

/// `CLUSTER SLOTS`: `[[start, end, [host, port, id, ..], replicas..], ..]`.
/// Anything else is not a map (the old one stays).
fn parse(reply: &Value) -> Option<Table> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut table = Table {
        masters: Vec::new(),
        owner: vec![0; SLOTS],
    };
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let (start, end, master) = match fields.as_slice() {
            [Value::Int(start), Value::Int(end), Value::Array(master), ..] => {
                (*start, *end, master)
            }
            _ => return None,
        };
        let host = match master.first()? {
            Value::BulkString(host) => String::from_utf8(host.clone()).ok()?,
            Value::SimpleString(host) => host.clone(),
            _ => return None,
        };
        let Value::Int(port) = master.get(1)? else {
            return None;
        };
        let name: Arc<str> = format!("{host}:{port}").into();
        let index = match table.masters.iter().position(|m| *m == name) {
            Some(index) => index,
            None => {
                table.masters.push(name);
                table.masters.len() - 1
            }
        };
        let tag = u16::try_from(index.checked_add(1)?).ok()?;
        let start = usize::try_from(start).ok()?;
        let end = usize::try_from(end).ok()?;
        for slot in table.owner.get_mut(start..=end)? {
            *slot = tag;
        }
    }
    Some(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn reads_the_masters_of_cluster_slots() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![
                    bulk("127.0.0.1"),
                    Value::Int(7000),
                    bulk("a"),
                ]),
                Value::Array(vec![
                    bulk("127.0.0.1"),
                    Value::Int(7003),
                    bulk("d"),
                ]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                Value::Array(vec![
                    bulk("127.0.0.1"),
                    Value::Int(7001),
                    bulk("b"),
                ]),
            ]),
        ]);
        let slots = Slots::new();
        slots.table.store(Arc::new(parse(&reply).unwrap()));
        assert_eq!(slots.owner(0).as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(slots.owner(5460).as_deref(), Some("127.0.0.1:7000"));
        assert_eq!(slots.owner(5461).as_deref(), Some("127.0.0.1:7001"));
        assert_eq!(slots.owner(16383).as_deref(), Some("127.0.0.1:7001"));
        assert_eq!(slots.owner(16384), None);
    }

    #[test]
    fn anything_else_is_no_map() {
        for reply in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(20000),
                Value::Array(vec![bulk("h"), Value::Int(1)]),
            ])]),
        ] {
            assert!(parse(&reply).is_none(), "{reply:?}");
        }
    }
}
