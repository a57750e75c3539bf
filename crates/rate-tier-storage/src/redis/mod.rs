//! Redis storage: one atomic Lua script per decision shared by every instance, on a single
//! Redis or on a Redis Cluster. Everything about it (keys, time, expiry, the
//! script, timeouts, what redis-rs does) is documented on [`RedisStorage`],
//! the one public item; what is particular to a cluster is in `cluster.rs`.

mod cluster;
mod job;
mod link;
mod refusals;
mod reserve;
mod reset;
mod resets;
mod script;
mod slots;
mod storage;

use self::storage::run_single;

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{Client, IntoConnectionInfo};
use gcra_core::{Lease, MAX_WINDOW_US};

use self::link::{Conn, Link, Source};
use self::refusals::Refusals;
use self::slots::Slots;
use crate::clock::{Clock, MonotonicClock, SharedClock};
use crate::event::{Listeners, StorageEvent};
use crate::key::KeyLayout;
use crate::storage::StorageError;
// Named by the docs of `RedisStorage`.
#[cfg(doc)]
use crate::{BucketCheck, Decided, Rule, storage::Storage};
#[cfg(doc)]
use gcra_core::Decision;

pub(crate) use link::USER_TIMEOUT;

/// What [`Decided::by`] says of a refusal answered from the store's memory
/// of an earlier one, without a call to Redis.
pub const REMEMBERED: &str = "remembered";

/// [`RedisStorage::DEFAULT_LEASE`], as a lease.
const DEFAULT_LEASE: Lease = match Lease::new(RedisStorage::DEFAULT_LEASE) {
    Ok(lease) => lease,
    Err(_) => panic!("30 s is a lease"),
};

/// GCRA buckets in Redis, shared by every instance that uses the same Redis
/// (or the same Redis Cluster).
///
/// Cheap to clone: clones share the connection.
///
/// One type for both deployments: [`RedisStorage::new`] and
/// [`RedisStorage::from_url`] for a single Redis, [`RedisStorage::cluster`]
/// and [`RedisStorage::from_cluster_urls`] for a Redis Cluster. Everything
/// below holds for both, except where it says otherwise; the section
/// [Redis Cluster](#redis-cluster) says what differs.
///
/// The [`Decision`]s it returns have `store: None`: the script has already
/// written the new TATs in Redis, there is nothing left for the caller to
/// store.
///
/// # Example
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use rate_tier_storage::{BucketCheck, LimitName, RedisStorage, Storage, StorageExt};
/// use gcra_core::{Decision, Quota};
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let conn = redis::Client::open("redis://127.0.0.1:6379/")?
///     .get_connection_manager()
///     .await?;
/// let store: Arc<dyn Storage> =
///     Arc::new(RedisStorage::new(conn).timeout(Duration::from_millis(50)));
///
/// let free = LimitName::new("free")?;
/// let check = [BucketCheck::new(&free, "key_ana", Quota::per_minute(10), 1)?];
/// let mut out = [Decision::default()];
/// assert!(store.check(&check, &mut out).await?.verdict.allowed);
/// assert_eq!(out[0].store, None); // already stored by Redis
/// # Ok(()) }
/// ```
///
/// # The scripts
///
/// A check of one bucket is one `EVALSHA` of `gcra.lua`, the same rules as
/// [`gcra_core::Quota::check`] run by Redis as one atomic step: no other
/// command touches the bucket between the read of its TAT and the write of
/// the new one, so two instances can never both accept the last request.
/// A decision over several buckets (a plan and an endpoint limit), a peek or
/// a shadow limit is one `EVALSHA` of `gcra_all.lua`, the same as
/// [`gcra_core::check_all`]: every bucket is charged or none is, in one
/// step. A settlement is one `EVALSHA` of `gcra_settle.lua`
/// ([`gcra_core::Quota::settle`]).
///
/// A decision with a window, a period or a concurrency limit
/// ([`Rule::Window`], [`Rule::Period`], [`Rule::Concurrency`];
/// [`Capabilities::supports`] says so) is one `EVALSHA` of `decide_mixed.lua`, which decides its rates,
/// windows, periods and concurrency limits as gcra-core does, all or
/// nothing in one step: if a window, a period or a concurrency limit
/// refuses, no rate is charged; if a rate refuses, no window or period is
/// written (but a refusing bucket's repair) and no slot is taken, and a
/// bucket that passed in a refused decision answers with a read of it.
/// Decisions of rates only never send it.
///
/// # Concurrency limits and leases
///
/// A concurrency limit's slots are leased ([`Capabilities::lease`]): a slot
/// taken at `now` is held until `now + lease` ([`gcra_core::Lease`]), and
/// free from then on, as if released, so that the slots of an instance
/// that died holding them come back by themselves. The lease is
/// [`RedisStorage::lease`] (default [`RedisStorage::DEFAULT_LEASE`], 30 s),
/// the same on every instance that shares the limits. A decision counts
/// the live slots and decides by [`gcra_core::Concurrency::acquire`]'s
/// rules (a refusal waits [`gcra_core::RETRY_HINT_US`]); a pass that stands
/// takes its cost's slots under the request's id ([`BucketCheck::lease_id`],
/// required: a check that takes slots without one is
/// [`StorageError::Unsupported`]). [`StorageExt::release`] gives back exactly
/// the slots of that id (a plain `ZREM` of their members for one limit's
/// few slots, else `release.lua`); [`StorageExt::renew`] sets the expiry
/// of those still live to now + the lease (`renew.lua`; an expired slot is
/// not taken again): a limiter renews them every third of the lease while
/// its request runs, and releases them when it ends.
///
/// Each request's id must be its own (a random 64-bit number, as the
/// limiter draws): two requests under one id would share their slots' names
/// and count as one.
///
/// # Reservations
///
/// [`StorageExt::reserve`] is one `EVALSHA` of `reserve.lua`, the same as
/// [`gcra_core::reserve_all`] on Redis's `TIME`: the earliest slot every
/// enforced rate passes at, reserved in every bucket or in none, in one
/// step, so that reservations from any number of instances are exactly the
/// passes of each quota, each at its slot. Unlike a check's, a
/// reservation's decisions carry the TAT the script wrote (`store`): what
/// [`StorageExt::cancel`] (`cancel.lua`, [`gcra_core::Quota::cancel`]) compares
/// with the stored one, giving the slot back only while no later one was
/// made. Only rates reserve. A reservation is sent as a check is, in a task
/// of its own, and retried only when the connection was refused: a reply
/// lost after the script ran is a failure, never sent again (a second call
/// would reserve a second slot). When its reply comes after its caller
/// left, the task cancels it (what stays taken is reported
/// [`StorageEvent::Unrefunded`]). On a cluster a reservation's buckets
/// must share a slot (one user's do); over two it is
/// [`StorageError::Unsupported`], before anything is sent: the slot is one
/// instant on one node's clock, and a reservation could not be undone
/// exactly in one slot when another refuses.
///
/// ```no_run
/// use std::time::Duration;
/// use rate_tier_storage::{BucketCheck, Decision, LimitName, Quota, RedisStorage, Storage, StorageExt};
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStorage::from_url("redis://127.0.0.1:6379/")?;
/// let provider = LimitName::new("provider")?;
/// // One call every 100 ms; callers wait up to a second.
/// let quota = Quota::per_second(10).allow_burst(1).allow_debt(Duration::from_secs(1));
/// let check = [BucketCheck::new(&provider, "", quota, 1)?];
/// let mut out = [Decision::default()];
/// let slot = store.reserve(&check, Duration::from_secs(1), &mut out).await?;
/// if slot.verdict.allowed {
///     tokio::time::sleep(Duration::from_micros(slot.wait_us)).await;
///     // ... call the provider.
/// }
/// // A caller that gives up before its slot comes gives it back.
/// let next = store.reserve(&check, Duration::from_secs(1), &mut out).await?;
/// if let (true, Some(written)) = (next.verdict.allowed, out[0].store) {
///     store.cancel(&[check[0].cancel(written.tat_us)]).await?;
/// }
/// # Ok(()) }
/// ```
///
/// # Keys and values
///
/// One string key per (limit, user) bucket, [`BucketCheck::key`]:
/// `trt:<limit>:<sha1_hex(user)>`, or `trt:<limit>:<hmac_sha1_hex(secret, user)>`
/// with a [`KeySecret`](crate::key::KeySecret). The user id is never sent to
/// Redis in clear. The value is the TAT (theoretical arrival time) in µs on
/// Redis's clock, as an integer string, for example `1790947155000000`.
///
/// A window's key (same name) is a list of the counted requests' times
/// (µs on Redis's clock, oldest first), expiring a window after the last
/// write (`PEXPIRE`); a period's is a string `<start>:<count>` (the
/// period's first instant in µs, and its count), expiring when the next
/// period starts (`SET .. PX`). A concurrency limit's is a sorted set, one
/// member `<id>:<k>` per unit of cost a request holds (`k` from 1 to the
/// cost, `id` the request's slot id in decimal), scored by its expiry (µs on
/// Redis's clock), expiring when its latest slot does (`PEXPIRE`).
///
/// A key of another type, or a value that is not an integer string, counts
/// as no value: the bucket starts fresh (the script never fails on it).
///
/// On a Redis Cluster the user part is a hash tag,
/// `trt:<tier>:{<sha1_hex(user)>}` (see
/// [`key::cluster_bucket_key`](crate::key::cluster_bucket_key)), so that
/// every bucket of one user is in one slot.
///
/// # Time and expiry
///
/// The time is Redis's `TIME`, read inside the script, never the instances'
/// clocks: instances with skewed clocks still share one limit. Each write is
/// `SET key tat PX ceil((tat - now) / 1000)`: the key expires when the bucket
/// is full again, rounded *up* to the millisecond (a key that vanished a
/// millisecond early would give requests away). Nothing needs cleaning up.
///
/// # Loading the scripts
///
/// Each `Script` is built once per process. redis-rs's
/// `ScriptInvocation::invoke_async` sends `EVALSHA`, and on a `NOSCRIPT`
/// error (the script cache was flushed, or Redis restarted or failed over)
/// sends `SCRIPT LOAD` and the `EVALSHA` again, so no retry is needed here.
///
/// # Timeouts
///
/// Every check, including a `NOSCRIPT` reload and the wait for a connection,
/// runs under [`tokio::time::timeout`]: past [`RedisStorage::timeout`]
/// (default [`RedisStorage::DEFAULT_TIMEOUT`], 100 ms) it fails with
/// [`StorageError::Timeout`].
///
/// A check runs in a task of its own, and its caller waits for it within
/// the timeout. A caller that stops waiting (its timeout, or its future
/// dropped) answered without Redis (a fallback decided locally, or a
/// policy did), so whatever Redis decides for it must not stay charged:
/// when the answer comes after the caller left (within 1 s), every charge
/// it made is refunded (`gcra_settle.lua`), and what cannot be refunded is
/// reported as [`StorageEvent::Unrefunded`]. A call whose answer never
/// comes (the connection died after sending it) may have been charged,
/// and nothing can tell (a slot it took is free when its lease ends). Rates
/// are refunded and slots released (by their id: exactly those the late
/// decision took); of a late decision with windows and periods, the rates
/// are refunded, the slots released, and the windows and periods stay
/// charged, each reported [`StorageEvent::Unrefunded`] (over-charged, never
/// forgiven).
///
/// A check needs a Tokio runtime with the time driver enabled (as
/// `#[tokio::main]` builds it).
///
/// # Connecting: what redis-rs does
///
/// redis-rs 1.x's own timeouts and retries (read in its source, 1.8, and
/// measured): `ConnectionManagerConfig` defaults to a connection
/// timeout of 1 s per attempt (it covers the TCP connect *and* the
/// handshake: `AUTH`, `SELECT`, `CLIENT SETINFO`), 6 retries with
/// exponential back-off from 100 ms, and a response timeout of 500 ms. So
/// `Client::get_connection_manager().await` does not hang forever, but it
/// does not return quickly either: against a server that accepts
/// connections and never answers it failed after about 16 s ("timed out"),
/// against a closed port after about 9.5 s ("connection refused"). A lazy
/// manager whose connection fails makes each check wait out those same
/// retries. Hence [`RedisStorage::from_url`] builds its manager lazily
/// (`ConnectionManager::new_lazy_with_config`, no I/O until the first
/// check) and with no retries: a check against a Redis that is down fails at
/// once with [`StorageError::Backend`], and one against a Redis that does
/// not answer fails at the timeout, never later. The next check after a
/// failed connection reconnects (redis-rs starts a new connection after an
/// I/O error). A redis-rs response timeout does not make the manager
/// reconnect either (only a dropped connection does), so `from_url` turns
/// it off, leaving [`RedisStorage::timeout`] as the one limit. When you
/// build the manager yourself for [`RedisStorage::new`], the same settings
/// are a good choice:
///
/// ```no_run
/// use rate_tier_storage::RedisStorage;
/// use redis::aio::ConnectionManagerConfig;
///
/// # #[tokio::main] async fn main() -> Result<(), redis::RedisError> {
/// let config = ConnectionManagerConfig::new()
///     .set_number_of_retries(0)
///     .set_response_timeout(None);
/// let conn = redis::Client::open("redis://127.0.0.1:6379/")?
///     .get_connection_manager_lazy(config)?;
/// let store = RedisStorage::new(conn);
/// # Ok(()) }
/// ```
///
/// # Redis Cluster
///
/// On a cluster ([`RedisStorage::cluster`], [`RedisStorage::from_cluster_urls`])
/// the script, its arguments, its reply, the time and the expiry are the
/// same; what differs:
///
/// - **Keys** carry a hash tag: `trt:<tier>:{<sha1_hex(user)>}`
///   ([`key::cluster_bucket_key`](crate::key::cluster_bucket_key), which
///   says why). A store on a single Redis and one on a cluster never share
///   buckets.
/// - **Several buckets**: the buckets of one user share the user's hash tag,
///   so their decision is one script call on one node, all or nothing, as
///   on a single Redis. Buckets that cannot share a slot (a limit per
///   address, a global limit) are decided slot by slot, in the order they
///   are given: when a later slot refuses or fails, each bucket already
///   charged gets back exactly what it was charged (`gcra_settle.lua`,
///   never below a full bucket, tried three times, and reported as
///   [`StorageEvent::Unrefunded`] if it cannot be), and after a refusal the
///   slots after it are only read (a read that fails leaves the decision a
///   refusal). The sequence runs in the decision's task: a caller that
///   gives up cannot cut it in half. Between the charge and the refund
///   another request may see the charge: such a decision is all or nothing
///   in what it leaves, not in what others see meanwhile. A failure names
///   the node that failed ([`StorageError::InDomain`]), so that a fallback
///   counts it against that node alone.
/// - **Windows, periods and concurrency limits** of one decision must be
///   in one slot (one user's are, by the hash tag): that slot is decided
///   last, by `decide_mixed.lua` (with the rates of that slot), after the
///   rates-only slots, so that a refusal there is undone by refunds of
///   rates alone, and what it takes stands; after a refusal in an earlier
///   slot it is only read (a window's wait is then reported as the time
///   until all of its counted requests leave: at least the real one). In
///   two slots or more they are [`StorageError::Unsupported`] ("windows,
///   periods and concurrency limits of one decision in two slots of a Redis
///   Cluster"), before anything is sent: a window's or a period's charge
///   cannot be refunded, so no order would keep the decision all or
///   nothing. The store says so ([`Capabilities::spans_partitions`] is false),
///   and a layer whose limits could meet so is refused when it is built
///   (`tower-rate-tier`'s `ConfigError::KindsInTwoPartitions`). A release
///   or a renewal is one call per slot.
/// - **Routing**: redis-rs's cluster connection sends each `EVALSHA` to the
///   master that owns the key's slot (it reads the key after the key count),
///   whichever node the connection was seeded with; it follows `MOVED` and
///   `ASK` redirects (within its retries) and refreshes its slot map. Two
///   instances seeded with different nodes therefore run the check of one
///   bucket on the same node, atomically, and share one limit exactly.
/// - **`NOSCRIPT`**: redis-rs's `invoke_async` would answer it with a
///   `SCRIPT LOAD`, which its cluster connection sends to *every* node it
///   knows and then waits for all of their answers. One node that does not
///   answer (stopped, overloaded, cut off) then stalls the reload of a key
///   on a healthy node: measured with one node stopped (`SIGSTOP`), that
///   reload had not returned after 3 s. Here a `NOSCRIPT` is answered with
///   `EVAL` of the script instead, routed by the key like the `EVALSHA`: one
///   round trip to the one node that needs the script (which caches it for
///   the next `EVALSHA`), about 1 ms in the same setting. A node that is
///   down elsewhere in the cluster does not touch checks of keys that are
///   not on it.
/// - **Time** is the `TIME` of the node that owns the key. Every bucket is
///   on one node, so only that node's clock matters for it.
/// - **Timeouts** are the same: one limit, [`RedisStorage::timeout`], around
///   everything a check waits for (the slot map, connections, redirects, a
///   `NOSCRIPT` reload). redis-rs's cluster client has no response timeout
///   of its own by default, and by default it waits at least 1.28 s before
///   retrying after a `TRYAGAIN` or `CLUSTERDOWN`: a check against a node
///   that does not answer ends at [`RedisStorage::timeout`]. Measured with
///   [`RedisStorage::from_cluster_urls`]: while no seed node accepts
///   connections, a check fails at once with [`StorageError::Backend`]
///   ("No connections found"), while the cluster is forming with
///   `CLUSTERDOWN`, and the first check after the cluster is up passes (the
///   connection reconnects and reads the slot map by itself).
#[derive(Clone)]
pub struct RedisStorage {
    shared: Arc<Shared>,
    timeout: Duration,
    rebuild_after: u32,
    remember_refusals: bool,
    clock: SharedClock,
    lease: Lease,
}

/// What clones share: the connection, the cluster's slot map, the
/// refusals remembered and the resets that void them, the listeners.
struct Shared {
    link: Link,
    cluster: bool,
    slots: Option<Arc<Slots>>,
    refusals: Refusals,
    resets: resets::Resets,
    listeners: Listeners<StorageEvent>,
}

impl std::fmt::Debug for RedisStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The connection's details (the URL may hold a password) stay out.
        f.debug_struct("RedisStorage")
            .field("cluster", &self.is_cluster())
            .field("timeout", &self.timeout)
            .field("rebuild_after", &self.rebuild_after)
            .field("remember_refusals", &self.remember_refusals)
            .field("lease", &self.lease.lease_us())
            .finish_non_exhaustive()
    }
}

impl RedisStorage {
    /// How long a check may take before it fails with
    /// [`StorageError::Timeout`], unless set with [`RedisStorage::timeout`].
    ///
    /// ```
    /// assert_eq!(
    ///     rate_tier_storage::RedisStorage::DEFAULT_TIMEOUT,
    ///     std::time::Duration::from_millis(100)
    /// );
    /// ```
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

    /// How long a slot of a concurrency limit is held without a renewal,
    /// unless set with [`RedisStorage::lease`].
    ///
    /// ```
    /// assert_eq!(
    ///     rate_tier_storage::RedisStorage::DEFAULT_LEASE,
    ///     std::time::Duration::from_secs(30)
    /// );
    /// ```
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

    /// A store on `conn`, with the default timeout of 100 ms.
    ///
    /// Building the manager with `get_connection_manager().await` connects
    /// first and waits out redis-rs's retries if the server does not answer
    /// (see [`RedisStorage`]). To start without waiting for
    /// Redis, build it lazily:
    ///
    /// ```no_run
    /// use rate_tier_storage::RedisStorage;
    /// use redis::aio::ConnectionManagerConfig;
    ///
    /// # #[tokio::main] async fn main() -> Result<(), redis::RedisError> {
    /// // Connects now (fails if Redis is down):
    /// let conn = redis::Client::open("redis://127.0.0.1:6379/")?
    ///     .get_connection_manager()
    ///     .await?;
    /// let store = RedisStorage::new(conn);
    ///
    /// // Connects on the first check, under that check's timeout:
    /// let lazy = redis::Client::open("redis://127.0.0.1:6379/")?
    ///     .get_connection_manager_lazy(ConnectionManagerConfig::new())?;
    /// let store = RedisStorage::new(lazy);
    /// # Ok(()) }
    /// ```
    pub fn new(conn: ConnectionManager) -> Self {
        Self::on(Conn::Single(conn), None, None)
    }

    fn on(
        conn: Conn,
        source: Option<Source>,
        slots: Option<Arc<Slots>>,
    ) -> Self {
        let cluster = matches!(conn, Conn::Cluster(_));
        let shared = Arc::new(Shared {
            link: Link::new(conn, source, Self::DEFAULT_TIMEOUT),
            cluster,
            slots,
            refusals: Refusals::default(),
            resets: resets::Resets::default(),
            listeners: Listeners::default(),
        });
        resets::watch(Arc::downgrade(&shared));
        RedisStorage {
            shared,
            timeout: Self::DEFAULT_TIMEOUT,
            rebuild_after: 3,
            remember_refusals: true,
            clock: Arc::new(MonotonicClock),
            lease: DEFAULT_LEASE,
        }
    }

    /// A store on the Redis at `url`, connected lazily: this returns at
    /// once, without any I/O, and the connection is made during the first
    /// checks, each bounded by [`RedisStorage::timeout`]. The connection is
    /// not retried within a check (a refused connection fails the check at
    /// once); a later check reconnects. See [`RedisStorage`].
    ///
    /// The URL is read by redis-rs:
    /// `redis://[<user>][:<password>@]<host>[:<port>][/<db>]`, so `AUTH`
    /// (with or without an ACL user) and the database number work as in
    /// redis-rs. `rediss://` (TLS) needs one of redis-rs's TLS features
    /// enabled in the final build (e.g. `redis/tokio-rustls-comp`); without
    /// one, it is refused here with [`StorageError::Backend`].
    ///
    /// # Errors
    ///
    /// [`StorageError::Backend`] if the URL cannot be read, or if this is
    /// called outside a Tokio runtime (the connection manager needs one).
    ///
    /// ```
    /// use std::time::Duration;
    /// use rate_tier_storage::{RedisStorage, StorageError};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), StorageError> {
    /// // No I/O yet: this works even with no server at that address.
    /// let store = RedisStorage::from_url("redis://:secret@127.0.0.1:6390/0")?
    ///     .timeout(Duration::from_millis(50));
    /// assert!(!format!("{store:?}").contains("secret"));
    ///
    /// assert!(matches!(RedisStorage::from_url("not a url"), Err(StorageError::Backend(_))));
    /// # Ok(()) }
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(StorageError::Backend(
                "RedisStorage::from_url must be called inside a Tokio runtime"
                    .into(),
            ));
        }
        let info = url
            .into_connection_info()
            .map_err(backend)?
            .set_tcp_settings(link::tcp_settings());
        let client = Client::open(info).map_err(backend)?;
        // No retries inside a check: the first one alone (100 ms back-off)
        // would outlast the default timeout, and a Redis that is down should
        // fail fast. redis-rs reconnects on the next check anyway. Its
        // response timeout (500 ms by default) would only fire after this
        // store's own; leave that one as the single limit.
        let config = ConnectionManagerConfig::new()
            .set_number_of_retries(0)
            .set_response_timeout(None);
        let conn = client
            .get_connection_manager_lazy(config.clone())
            .map_err(backend)?;
        Ok(Self::on(
            Conn::Single(conn),
            Some(Source::Single(client, config)),
            None,
        ))
    }

    /// After this many timeouts in a row, the store replaces its
    /// connection (default 3; 0 never does): a connection whose peer
    /// vanished without a word would otherwise time out every call for as
    /// long as the kernel keeps the socket. Only a store built from a URL
    /// ([`RedisStorage::from_url`], [`RedisStorage::from_cluster_urls`])
    /// can open a new one. See also [`redis_user_timeout`](crate::redis_user_timeout).
    #[must_use]
    pub fn rebuild_after(mut self, timeouts: u32) -> Self {
        self.rebuild_after = if timeouts == 0 { u32::MAX } else { timeouts };
        self
    }

    /// How many times the connection was replaced after timeouts.
    pub fn rebuilds(&self) -> u64 {
        self.shared.link.rebuilds()
    }

    /// Whether refusals are remembered (default: yes): until GCRA says the
    /// same request could pass, it, and any costlier one on the same
    /// bucket, is refused without a call to Redis, and the decision says
    /// [`REMEMBERED`]. A client hammering past its limit then costs nothing
    /// to Redis. A cheaper request is sent (it may fit), and so is a
    /// request with a bucket that was not in the refused decision. The
    /// other buckets of an answer from memory are reported as they stood
    /// when the refusal was made. Refusals are kept under the buckets' real
    /// keys (a [`KeySecret`](crate::key::KeySecret) is part of them). The
    /// memory is bounded (65 536 refusals). A refund this store makes
    /// forgets the bucket's refusal at once; one settled by another
    /// instance can make a bucket pass before a remembered refusal ends (by
    /// at most the time left of that refusal's wait). A reset
    /// ([`Storage::reset`], a lifted ban) through any instance voids every
    /// instance's memory within about a second: each store reads the key
    /// `trt:resets`, which a reset rewrites, every 250 ms, and answers from
    /// its memory only while its last read is under a second old (never
    /// outside a Tokio runtime, where nothing reads it).
    #[must_use]
    pub fn remember_refusals(mut self, remember: bool) -> Self {
        self.remember_refusals = remember;
        self
    }

    /// The clock of the refusals' memory (default: the monotonic clock).
    /// Decisions use Redis's own time whatever this is.
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Sets how long a check may take (default 100 ms). Past it, the check
    /// fails with [`StorageError::Timeout`]. The timeout covers everything a
    /// check waits for: the connection (or reconnection), a `NOSCRIPT`
    /// reload, and the script's answer. A zero timeout fails every check.
    /// On a cluster built here ([`RedisStorage::from_cluster_urls`]), each
    /// node gets the same time to connect and to answer (the connection,
    /// not yet used, is made again with it; a clone shares the connection,
    /// so the last timeout set is the nodes').
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use rate_tier_storage::RedisStorage;
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStorage::from_url("redis://127.0.0.1:6379/")?
    ///     .timeout(Duration::from_millis(250));
    /// assert_eq!(store.timeout_duration(), Duration::from_millis(250));
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.shared.link.set_node_timeout(timeout);
        self
    }

    /// Sets how long a slot of a concurrency limit is held unless it is
    /// renewed or released (default [`RedisStorage::DEFAULT_LEASE`], 30 s):
    /// what [`Capabilities::lease`] answers. A limiter renews the slots of a
    /// request every third of the lease while it runs, so a request may run
    /// longer than the lease; the slots of an instance that died (never
    /// released nor renewed) are free once it ends. A shorter lease frees
    /// them sooner, at the cost of more renewals. Every instance that
    /// shares the limits should use the same lease. Clamped to 1 ms ..
    /// 2^50 µs ([`gcra_core::MAX_WINDOW_US`], about 35.7 years).
    ///
    /// ```
    /// use std::time::Duration;
    /// use rate_tier_storage::{RedisStorage, Storage, StorageExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStorage::from_url("redis://127.0.0.1:6390/")?;
    /// assert_eq!(store.capabilities().lease, Some(Duration::from_secs(30)));
    /// let store = store.lease(Duration::from_secs(10));
    /// assert_eq!(store.lease_duration(), Duration::from_secs(10));
    /// assert_eq!(store.lease(Duration::ZERO).lease_duration(), Duration::from_millis(1));
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        let lease = lease.clamp(
            Duration::from_millis(1),
            Duration::from_micros(MAX_WINDOW_US),
        );
        if let Ok(lease) = Lease::new(lease) {
            self.lease = lease;
        }
        self
    }

    /// The lease of concurrency slots (see [`RedisStorage::lease`]).
    pub fn lease_duration(&self) -> Duration {
        Duration::from_micros(self.lease.lease_us())
    }

    /// The timeout of each check (see [`RedisStorage::timeout`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use rate_tier_storage::RedisStorage;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStorage::from_url("redis://127.0.0.1:6390/")?;
    /// assert_eq!(store.timeout_duration(), Duration::from_millis(100));
    /// # Ok(()) }
    /// ```
    pub fn timeout_duration(&self) -> Duration {
        self.timeout
    }

    /// Whether this store is on a Redis Cluster ([`RedisStorage::cluster`],
    /// [`RedisStorage::from_cluster_urls`]) rather than a single Redis.
    ///
    /// ```
    /// use rate_tier_storage::RedisStorage;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// assert!(!RedisStorage::from_url("redis://127.0.0.1:6390/")?.is_cluster());
    /// assert!(RedisStorage::from_cluster_urls(["redis://127.0.0.1:6390/"])?.is_cluster());
    /// # Ok(()) }
    /// ```
    pub fn is_cluster(&self) -> bool {
        self.shared.cluster
    }

    /// How this store lays out its keys.
    fn layout(&self) -> KeyLayout {
        if self.shared.cluster {
            KeyLayout::Cluster
        } else {
            KeyLayout::Single
        }
    }
}

fn backend(error: ::redis::RedisError) -> StorageError {
    StorageError::Backend(Box::new(error))
}
