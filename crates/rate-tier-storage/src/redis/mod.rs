//! Redis storage: one atomic Lua script per decision, shared by every
//! instance, on a single Redis or on a Redis Cluster. [`RedisStorage`] is
//! the one public item; what is particular to a cluster is in `cluster.rs`,
//! the scripts' arguments and replies in `script.rs`.

mod cluster;
mod job;
mod link;
mod refusals;
mod reply;
mod reserve;
mod reset;
mod resets;
mod script;
mod slots;
mod storage;
mod tls;

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

/// GCRA rates, windows, periods and concurrency slots ([`Rule`]) in Redis,
/// shared by every instance that uses the same Redis (or Redis Cluster).
///
/// Each decision is one `EVALSHA` of a Lua script that applies gcra-core's
/// rules to all of its buckets as one atomic step, on Redis's own clock
/// (`TIME`): instances with skewed clocks still share one limit, and two
/// instances never both take the last request. The [`Decision`]s it returns
/// from a check have `store: None`: the script has already written them.
/// Keys never hold a user id in clear ([`BucketCheck::key`]) and expire
/// when their bucket is full again, so nothing needs cleaning up. Every
/// call is bounded by [`RedisStorage::timeout`] (default 100 ms); a call
/// whose caller gave up is refunded when its late answer comes, and what
/// cannot be is reported [`StorageEvent::Unrefunded`]. A check that takes
/// concurrency slots needs a [`BucketCheck::lease_id`] of its own per
/// request (else [`StorageError::Unsupported`]); the slots are leased
/// ([`RedisStorage::lease`]) so that a dead instance's slots come back.
/// A check needs a Tokio runtime with the time driver enabled.
///
/// Cheap to clone: clones share the connection. [`RedisStorage::new`] and
/// [`RedisStorage::from_url`] are for a single Redis,
/// [`RedisStorage::cluster`] and [`RedisStorage::from_cluster_urls`] for a
/// Redis Cluster. Which script serves which call, the keys' layout and how
/// timeouts and late answers are handled are described in the repository's
/// `ARCHITECTURE.md`.
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
/// # Reservations
///
/// [`StorageExt::reserve`](crate::StorageExt::reserve) reserves the earliest slot every rate passes at, in
/// every bucket or in none, in one step (`reserve.lua`); only rates
/// reserve. Its decisions carry the TAT written (`store`), which
/// [`StorageExt::cancel`](crate::StorageExt::cancel) compares to give a slot back only while no later one
/// was made. A reservation whose reply is lost is never sent again (that
/// would reserve a second slot). On a cluster a reservation's buckets must
/// share a slot (one user's do), else [`StorageError::Unsupported`].
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
/// # Redis Cluster
///
/// Keys carry the user's hash as a hash tag
/// ([`key::cluster_bucket_key`](crate::key::cluster_bucket_key)), so every
/// bucket of one user is in one slot and decided in one call on one node,
/// all or nothing, as on a single Redis; a store on a single Redis and one
/// on a cluster never share buckets. Buckets in several slots (a limit per
/// address, a global limit) are decided slot by slot, each charge refunded
/// when a later slot refuses or fails: all or nothing in what the decision
/// leaves, not in what others see meanwhile. Windows, periods and
/// concurrency limits of one decision must share a slot, else
/// [`StorageError::Unsupported`] before anything is sent
/// ([`Capabilities::spans_partitions`](crate::Capabilities::spans_partitions) is false). A failure names the node
/// ([`StorageError::InDomain`]), so that a fallback counts it against that
/// node alone.
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
    /// redis-rs's `ConnectionManagerConfig` defaults to 6 retries with
    /// back-off from 100 ms, 1 s per attempt and a response timeout of
    /// 500 ms: `get_connection_manager().await` against a Redis that does
    /// not answer fails only after about 16 s, and a lazy manager makes each
    /// check wait out the same retries. Built lazily with no retries and no
    /// response timeout, as [`RedisStorage::from_url`] builds it, a check
    /// against a Redis that is down fails at once, one against a Redis that
    /// does not answer at [`RedisStorage::timeout`], and the next check
    /// reconnects:
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
    /// let config = ConnectionManagerConfig::new()
    ///     .set_number_of_retries(0)
    ///     .set_response_timeout(None);
    /// let lazy = redis::Client::open("redis://127.0.0.1:6379/")?
    ///     .get_connection_manager_lazy(config)?;
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
    /// once); a later check reconnects. See [`RedisStorage::new`] for why.
    ///
    /// The URL is read by redis-rs:
    /// `redis://[<user>][:<password>@]<host>[:<port>][/<db>]`, so `AUTH`
    /// (with or without an ACL user) and the database number work as in
    /// redis-rs. `rediss://` is TLS (rustls), the server's certificate
    /// checked against the bundled public roots (webpki-roots) and its
    /// name: what a managed Redis presents. For a certificate a private CA
    /// signed, [`RedisStorage::from_url_with_ca`].
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
        Self::connect(url, None)
    }

    /// [`RedisStorage::from_url`] of a `rediss://` URL whose server's
    /// certificate is checked against `ca_pem` (the PEM of one or more CA
    /// certificates, as in a CA file) instead of the public roots.
    ///
    /// # Errors
    ///
    /// [`StorageError::Backend`], at once: a URL that is not `rediss://`,
    /// a `ca_pem` that holds no certificate, and what
    /// [`RedisStorage::from_url`] refuses.
    ///
    /// ```
    /// use rate_tier_storage::{RedisStorage, StorageError};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let error = RedisStorage::from_url_with_ca("rediss://cache:6380/", b"not a certificate")
    ///     .unwrap_err();
    /// assert!(error.to_string().contains("CA"), "{error}");
    /// let error = RedisStorage::from_url_with_ca("redis://cache:6379/", b"").unwrap_err();
    /// assert!(error.to_string().contains("rediss://"), "{error}");
    /// # }
    /// ```
    pub fn from_url_with_ca(
        url: &str,
        ca_pem: &[u8],
    ) -> Result<Self, StorageError> {
        Self::connect(url, Some(ca_pem))
    }

    fn connect(url: &str, ca_pem: Option<&[u8]>) -> Result<Self, StorageError> {
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
        let client = match ca_pem {
            None => {
                if tls::is_tls(&info) {
                    tls::install_provider();
                }
                Client::open(info).map_err(backend)?
            }
            Some(ca_pem) => {
                if !tls::is_tls(&info) {
                    return Err(tls::needs_rediss());
                }
                Client::build_with_tls(info, tls::certificates(ca_pem)?)
                    .map_err(backend)?
            }
        };
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
    /// what [`Capabilities::lease`](crate::Capabilities::lease) answers. A limiter renews the slots of a
    /// request every third of the lease while it runs, so a request may run
    /// longer than the lease; the slots of an instance that died (never
    /// released nor renewed) are free once it ends. A shorter lease frees
    /// them sooner, at the cost of more renewals. Every instance that
    /// shares the limits should use the same lease. Clamped to 1 ms ..
    /// 2^50 µs ([`gcra_core::MAX_WINDOW_US`], about 35.7 years).
    ///
    /// ```
    /// use std::time::Duration;
    /// use rate_tier_storage::{RedisStorage, Storage};
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
