//! [`RedisStorage`] on a Redis Cluster: the constructors, and the calls,
//! which differ from the single-node ones in their keys (a hash tag), in
//! how they answer `NOSCRIPT` (an `EVAL` routed by the keys, not a `SCRIPT
//! LOAD` sent to every node), and in decisions over buckets of several
//! slots (slot by slot, with refunds, in the decision's own task: see
//! `job.rs`). Windows, periods and concurrency limits must share one slot,
//! decided last, since their charges cannot be refunded
//! ([`one_slot_of_kinds`] refuses the rest before any call). The scripts
//! are shared with the single-node store (`script.rs`); releases and
//! renewals are one call per slot ([`slots`]).

use std::sync::Arc;
use std::time::Duration;

use ::redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use gcra_core::{Adjust, Lease, Quota};
use smallvec::SmallVec;

use super::job::Job;
use super::link::{Conn, Source};
use super::reply::{read_counts, read_settled};
use super::script::{Call, release_by_zrem, within};
use super::slots::Slots;
use super::{RedisStorage, Shared, backend};
use crate::bucket::BucketSettle;
use crate::key;
use crate::storage::StorageError;

/// Retries of one command inside redis-rs's cluster connection: enough to
/// follow a `MOVED` and then an `ASK` during a resharding or a failover
/// (redirects count as retries and are followed at once). Everything is
/// bounded by the store's timeout anyway.
const CLUSTER_RETRIES: u32 = 2;
/// Shortest and longest wait, in ms, before redis-rs retries after a
/// `TRYAGAIN` or `CLUSTERDOWN` (its defaults, 1.28 s to 11 min, would
/// outlast any check's timeout).
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (10, 50);

impl RedisStorage {
    /// A store on a Redis Cluster, through `conn`, with the default timeout
    /// of 100 ms.
    ///
    /// The connection may be seeded with any node (or several): redis-rs
    /// reads the slot map from it and sends each check to the master that
    /// owns the bucket's slot. Keys are
    /// [`cluster_bucket_key`](crate::key::cluster_bucket_key)s. See
    /// [`RedisStorage`], section *Redis Cluster*.
    ///
    /// `get_async_connection().await` connects first (and fails if no seed
    /// node answers); `get_pending_async_connection_with_config` returns at
    /// once and connects in the background, as
    /// [`RedisStorage::from_cluster_urls`] does.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use rate_tier_storage::{BucketCheck, LimitName, RedisStorage, Storage, StorageExt};
    /// use gcra_core::{Decision, Quota};
    ///
    /// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let conn = redis::cluster::ClusterClient::new(vec![
    ///     "redis://10.0.0.1:7000/",
    ///     "redis://10.0.0.2:7000/",
    /// ])?
    /// .get_async_connection()
    /// .await?;
    /// let store: Arc<dyn Storage> = Arc::new(RedisStorage::cluster(conn));
    ///
    /// let free = LimitName::new("free")?;
    /// let check = [BucketCheck::new(&free, "key_ana", Quota::per_minute(10), 1)?];
    /// // Runs on the node that owns trt:free:{33d2315cbeb866b8b237240a98d605f2e6e41b8a}.
    /// let mut out = [Decision::default()];
    /// assert!(store.check(&check, &mut out).await?.verdict.allowed);
    /// # Ok(()) }
    /// ```
    pub fn cluster(conn: ClusterConnection) -> Self {
        Self::on_cluster(conn, None)
    }

    /// The store, with its slot map kept fresh in the background: the
    /// failure domain of each bucket (see [`RedisStorage`]'s section
    /// *Redis Cluster*).
    fn on_cluster(
        conn: ClusterConnection,
        client: Option<ClusterClient>,
    ) -> Self {
        let slots = Slots::new();
        let store = Self::on(
            Conn::Cluster(conn),
            client.map(Source::Cluster),
            Some(slots.clone()),
        );
        let shared = Arc::downgrade(&store.shared);
        let current = move || match &*shared.upgrade()?.link.current() {
            Conn::Cluster(conn) => Some(conn.clone()),
            Conn::Single(_) => None,
        };
        Slots::keep_fresh(&slots, current, Self::DEFAULT_TIMEOUT);
        store
    }

    /// A store on the Redis Cluster that the nodes at `urls` belong to (one
    /// is enough; more let it start while some are down). It returns at
    /// once: redis-rs connects to the seed nodes and reads the slot map in
    /// the background, and a check made before that is done waits for it,
    /// within [`RedisStorage::timeout`].
    ///
    /// Each URL is read by redis-rs: `redis://[<user>][:<password>@]<host>:<port>[/]`
    /// (a cluster has no database number but 0). The nodes must share one
    /// user and password.
    ///
    /// The connection is built with few, short retries inside redis-rs (2,
    /// enough to follow a `MOVED` and an `ASK`; 10 to 50 ms before retrying
    /// a `TRYAGAIN` or `CLUSTERDOWN`), TCP keepalive and a user timeout
    /// (see [`redis_user_timeout`](crate::redis_user_timeout)), and a connection and
    /// response timeout per node equal to the store's
    /// [`timeout`](RedisStorage::timeout): redis-rs refreshes its slot map
    /// under a lock that stops every call, and a node that does not answer
    /// must not hold it longer than a check may take.
    ///
    /// # Errors
    ///
    /// [`StorageError::Backend`] if `urls` is empty, a URL cannot be read,
    /// the URLs disagree on the user or password, or this is called outside
    /// a Tokio runtime.
    ///
    /// ```
    /// use rate_tier_storage::{RedisStorage, StorageError};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), StorageError> {
    /// // No waiting: this works even with no server at those addresses.
    /// let store = RedisStorage::from_cluster_urls([
    ///     "redis://:secret@127.0.0.1:7000/",
    ///     "redis://:secret@127.0.0.1:7001/",
    /// ])?;
    /// assert!(store.is_cluster());
    /// assert!(!format!("{store:?}").contains("secret"));
    ///
    /// let none: [&str; 0] = [];
    /// assert!(matches!(RedisStorage::from_cluster_urls(none), Err(StorageError::Backend(_))));
    /// assert!(matches!(
    ///     RedisStorage::from_cluster_urls(["not a url"]),
    ///     Err(StorageError::Backend(_))
    /// ));
    /// # Ok(()) }
    /// ```
    pub fn from_cluster_urls<I>(urls: I) -> Result<Self, StorageError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Self::connect_cluster(urls, None)
    }

    /// [`RedisStorage::from_cluster_urls`] of `rediss://` URLs whose
    /// servers' certificates are checked against `ca_pem` (the PEM of one
    /// or more CA certificates) instead of the public roots.
    ///
    /// # Errors
    ///
    /// [`StorageError::Backend`], at once: a URL that is not `rediss://`,
    /// a `ca_pem` that holds no certificate, and what
    /// [`RedisStorage::from_cluster_urls`] refuses.
    ///
    /// ```
    /// use rate_tier_storage::RedisStorage;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let plain = RedisStorage::from_cluster_urls_with_ca(["redis://10.0.0.1:7000/"], b"");
    /// assert!(plain.unwrap_err().to_string().contains("rediss://"));
    /// # }
    /// ```
    pub fn from_cluster_urls_with_ca<I>(
        urls: I,
        ca_pem: &[u8],
    ) -> Result<Self, StorageError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Self::connect_cluster(urls, Some(ca_pem))
    }

    fn connect_cluster<I>(
        urls: I,
        ca_pem: Option<&[u8]>,
    ) -> Result<Self, StorageError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(StorageError::Backend(
                "RedisStorage::from_cluster_urls must be called inside a Tokio runtime"
                    .into(),
            ));
        }
        let urls: Vec<String> = urls
            .into_iter()
            .map(|url| url.as_ref().to_owned())
            .collect();
        if urls.is_empty() {
            return Err(StorageError::Backend(
                "RedisStorage::from_cluster_urls needs at least one node URL"
                    .into(),
            ));
        }
        let tls = urls.iter().any(|url| url.starts_with("rediss://"));
        let certificates = match ca_pem {
            Some(_) if !urls.iter().all(|url| url.starts_with("rediss://")) => {
                return Err(super::tls::needs_rediss());
            }
            Some(ca_pem) => Some(super::tls::certificates(ca_pem)?),
            None => {
                if tls {
                    super::tls::install_provider();
                }
                None
            }
        };
        let (min_wait, max_wait) = CLUSTER_RETRY_WAIT_MS;
        let mut builder = ClusterClientBuilder::new(urls)
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(min_wait)
            .max_retry_wait(max_wait)
            .tcp_settings(super::link::tcp_settings());
        if let Some(certificates) = certificates {
            builder = builder.certs(certificates);
        }
        let client = builder.build().map_err(backend)?;
        let conn = client.get_pending_async_connection_with_config(
            ClusterConfig::new()
                .set_connection_timeout(Self::DEFAULT_TIMEOUT)
                .set_response_timeout(Self::DEFAULT_TIMEOUT),
        );
        Ok(Self::on_cluster(conn, Some(client)))
    }
}

/// Runs `call`: `EVALSHA`, and on `NOSCRIPT`, `EVAL` with the source. Both
/// are routed by their first key, to the master that owns its slot.
pub(super) async fn run(
    conn: &ClusterConnection,
    call: &Call<'_>,
) -> Result<Value, RedisError> {
    let mut conn = conn.clone();
    match call.command("EVALSHA").query_async(&mut conn).await {
        Err(error)
            if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
        {
            call.command("EVAL").query_async(&mut conn).await
        }
        result => result,
    }
}

/// The buckets of one slot: its number, and the positions of its keys.
pub(super) type Groups = SmallVec<[(u16, SmallVec<[usize; 4]>); 2]>;

/// The positions of `keys`, grouped by slot, each group in the order its
/// first key was given.
pub(super) fn by_slot<'k>(keys: impl Iterator<Item = &'k str>) -> Groups {
    let mut groups = Groups::new();
    for (i, key) in keys.enumerate() {
        let slot = key::slot_of_key(key);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, SmallVec::from_elem(i, 1))),
        }
    }
    groups
}

/// What a decision whose windows, periods and concurrency limits are in two
/// slots or more is answered.
pub(super) const KINDS_IN_TWO_SLOTS: &str = "windows, periods and concurrency limits of one decision in two slots of a Redis Cluster";

/// Refuses a decision whose windows, periods and concurrency limits are not
/// all in one slot (see the module docs), before anything is sent.
pub(super) fn one_slot_of_kinds(job: &Job) -> Result<(), StorageError> {
    let mut slots = (0..job.keys.len())
        .filter(|&i| !job.is_rate(i))
        .map(|i| key::slot_of_key(&job.keys[i]));
    let first = slots.next();
    match first {
        Some(first) if slots.any(|slot| slot != first) => {
            Err(StorageError::Unsupported(KINDS_IN_TWO_SLOTS))
        }
        _ => Ok(()),
    }
}

/// `error`, named with the master that owns `slot` when the slot map knows
/// it: a fallback then counts it against that node alone.
pub(super) fn in_domain(
    shared: &Shared,
    slot: u16,
    error: StorageError,
) -> StorageError {
    match shared.slots.as_ref().and_then(|slots| slots.owner(slot)) {
        Some(domain) => StorageError::InDomain {
            domain,
            error: Box::new(error),
        },
        None => error,
    }
}

/// Settles `settles`, one call per slot, each within `timeout`.
pub(super) async fn settle(
    conn: &ClusterConnection,
    keys: &[String],
    settles: &[BucketSettle<'_>],
    timeout: Duration,
) -> Result<(), StorageError> {
    let groups = by_slot(keys.iter().map(String::as_str));
    for (_, group) in &groups {
        let adjusts: SmallVec<[(Quota, Adjust); 4]> = group
            .iter()
            .map(|&i| (settles[i].bucket.quota(), settles[i].adjust))
            .collect();
        let call =
            Call::settle(group.iter().map(|&i| keys[i].as_str()), &adjusts);
        let reply = within(timeout, run(conn, &call)).await?;
        read_settled(call.lua, reply, adjusts.len())?;
    }
    Ok(())
}

/// Releases (`renew` `None`) or renews for a lease the slots `(id, cost)`
/// of `keys`, by position: one call per slot of the cluster, each within
/// `timeout`, a failure named by the node that owns the slot. Returns the
/// slots released or renewed, by position.
pub(super) async fn slots(
    shared: &Shared,
    conn: &ClusterConnection,
    keys: &[String],
    taken: &[(u64, u32)],
    renew: Option<Lease>,
    timeout: Duration,
) -> Result<Vec<u64>, StorageError> {
    let mut counts = vec![0; keys.len()];
    for (slot, group) in by_slot(keys.iter().map(String::as_str)) {
        let part: SmallVec<[(u64, u32); 4]> =
            group.iter().map(|&i| taken[i]).collect();
        // One key's few slots: a plain ZREM (routed by its key).
        let zrem = match (renew, &*group, &*part) {
            (None, &[i], &[one]) => {
                release_by_zrem(&mut conn.clone(), &keys[i], one, timeout)
                    .await
                    .map(|released| released.map(|n| vec![n]))
            }
            _ => None,
        };
        let done = match zrem {
            Some(done) => done,
            None => {
                let group_keys = group.iter().map(|&i| keys[i].as_str());
                let call = match renew {
                    Some(lease) => Call::renew(group_keys, &part, lease),
                    None => Call::release(group_keys, &part),
                };
                match within(timeout, run(conn, &call)).await {
                    Ok(reply) => read_counts(call.lua, reply, group.len()),
                    Err(error) => Err(error),
                }
            }
        }
        .map_err(|error| in_domain(shared, slot, error))?;
        for (&i, count) in group.iter().zip(done) {
            counts[i] = count;
        }
    }
    Ok(counts)
}
