//! The connection a store runs its calls on, and its replacement when it
//! goes silent.
//!
//! A call bounded by the store's timeout drops its future when the timeout
//! fires: redis-rs's connection never learns that anything went wrong, and
//! a connection whose peer vanished without a reset (a lost VM, a
//! partition, a failover behind DNS) would time out every call until the
//! kernel gives up on the socket, about 15 minutes on Linux. So:
//!
//! - every connection this crate opens sets TCP keepalive and, on Linux,
//!   `TCP_USER_TIMEOUT`: the kernel kills a socket whose data goes
//!   unacknowledged for [`USER_TIMEOUT`];
//! - after [`RedisStorage::rebuild_after`](super::RedisStorage::rebuild_after)
//!   consecutive timeouts the store builds a new connection (lazily: the
//!   next call connects), so the next call, a circuit breaker's probe
//!   included, never reuses the one known silent.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use ::redis::Client;
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::io::tcp::TcpSettings;
use ::redis::io::tcp::socket2::TcpKeepalive;
use arc_swap::ArcSwap;

/// How long unacknowledged data may wait before the kernel drops a socket.
pub(crate) const USER_TIMEOUT: Duration = Duration::from_secs(5);

/// The TCP settings of every connection this crate opens: keepalive
/// probes after 5 s idle, every 1 s, 3 of them; and on Linux a
/// [`USER_TIMEOUT`].
pub(super) fn tcp_settings() -> TcpSettings {
    let tcp = TcpSettings::default().set_nodelay(true).set_keepalive(
        TcpKeepalive::new()
            .with_time(Duration::from_secs(5))
            .with_interval(Duration::from_secs(1))
            .with_retries(3),
    );
    #[cfg(any(
        target_os = "linux",
        target_os = "android",
        target_os = "fuchsia"
    ))]
    let tcp = tcp.set_user_timeout(USER_TIMEOUT);
    tcp
}

/// The connection a store runs its checks on.
#[derive(Clone)]
pub(super) enum Conn {
    /// One Redis server (or a proxy that looks like one).
    Single(ConnectionManager),
    /// A Redis Cluster: redis-rs routes each call to the node of its keys.
    Cluster(ClusterConnection),
}

/// How to open the connection again.
pub(super) enum Source {
    Single(Client, ConnectionManagerConfig),
    Cluster(ClusterClient),
}

impl Source {
    /// A new connection, made lazily (no I/O here). A cluster's nodes each
    /// get `node_timeout` to connect and to answer: redis-rs refreshes its
    /// slot map under a lock that stops every call, and a silent node must
    /// not hold it longer than a check may take.
    fn open(&self, node_timeout: Duration) -> Option<Conn> {
        match self {
            Source::Single(client, config) => client
                .get_connection_manager_lazy(config.clone())
                .ok()
                .map(Conn::Single),
            Source::Cluster(client) => Some(Conn::Cluster(
                client.get_pending_async_connection_with_config(
                    ::redis::cluster::ClusterConfig::new()
                        .set_connection_timeout(node_timeout)
                        .set_response_timeout(node_timeout),
                ),
            )),
        }
    }
}

/// The current connection, and what replaces it.
pub(super) struct Link {
    conn: ArcSwap<Conn>,
    /// `None` for a connection the caller built: it cannot be rebuilt.
    source: Option<Source>,
    timeouts: AtomicU32,
    rebuilds: AtomicU64,
    /// A cluster node's own connection and response timeout, in µs.
    node_timeout_us: AtomicU64,
}

impl Link {
    pub(super) fn new(
        conn: Conn,
        source: Option<Source>,
        node_timeout: Duration,
    ) -> Self {
        Link {
            conn: ArcSwap::from_pointee(conn),
            source,
            timeouts: AtomicU32::new(0),
            rebuilds: AtomicU64::new(0),
            node_timeout_us: AtomicU64::new(
                u64::try_from(node_timeout.as_micros()).unwrap_or(u64::MAX),
            ),
        }
    }

    pub(super) fn current(&self) -> Arc<Conn> {
        self.conn.load_full()
    }

    /// A call answered: the connection is alive.
    pub(super) fn answered(&self) {
        if self.timeouts.load(Ordering::Relaxed) != 0 {
            self.timeouts.store(0, Ordering::Relaxed);
        }
    }

    /// A call timed out; after `rebuild_after` in a row, a new connection
    /// replaces this one. Returns whether it did.
    pub(super) fn timed_out(&self, rebuild_after: u32) -> bool {
        let timeouts = self
            .timeouts
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if timeouts < rebuild_after {
            return false;
        }
        self.timeouts.store(0, Ordering::Relaxed);
        let Some(conn) = self.open() else {
            return false;
        };
        self.conn.store(Arc::new(conn));
        self.rebuilds.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn open(&self) -> Option<Conn> {
        let node_timeout =
            Duration::from_micros(self.node_timeout_us.load(Ordering::Relaxed));
        self.source.as_ref()?.open(node_timeout)
    }

    /// Gives a cluster's nodes `timeout` each. The connection it had is
    /// replaced (a pending one: no I/O here); a single server's is kept, its
    /// calls being bounded by the store.
    pub(super) fn set_node_timeout(&self, timeout: Duration) {
        let timeout_us = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX);
        let before = self.node_timeout_us.swap(timeout_us, Ordering::Relaxed);
        if before != timeout_us
            && matches!(self.source, Some(Source::Cluster(_)))
            && let Some(conn) = self.open()
        {
            self.conn.store(Arc::new(conn));
        }
    }

    /// How many times the connection was replaced.
    pub(super) fn rebuilds(&self) -> u64 {
        self.rebuilds.load(Ordering::Relaxed)
    }
}
