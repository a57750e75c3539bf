//! [`RedisStorage`] on a Redis Cluster: the constructors, and the calls,
//! which differ from the single-node ones in their keys (a hash tag), in
//! how they answer `NOSCRIPT` (an `EVAL` routed by the keys, not a `SCRIPT
//! LOAD` sent to every node), and in decisions over buckets of several
//! slots (slot by slot, with refunds). The scripts, their arguments and
//! replies are shared with the single-node store (`script.rs`).

use std::sync::Arc;

use ::redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::Slot;
use ::redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use gcra_core::{Adjust, Decision, Verdict};
use smallvec::SmallVec;

use super::link::{Conn, Source};
use super::script::{Call, read_decisions, read_settled};
use super::slots::Slots;
use super::{RedisStorage, backend};
use crate::bucket::{BucketCheck, BucketSettle};
use crate::key::KeyLayout;
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
    /// use rate_tier_storage::{BucketCheck, LimitName, RedisStorage, Storage};
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
        let mut store =
            Self::on(Conn::Cluster(conn), client.map(Source::Cluster));
        let slots = Slots::new();
        if let Some(shared) = Arc::get_mut(&mut store.shared) {
            shared.slots = Some(slots.clone());
        }
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
        let (min_wait, max_wait) = CLUSTER_RETRY_WAIT_MS;
        let client = ClusterClientBuilder::new(urls)
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(min_wait)
            .max_retry_wait(max_wait)
            .tcp_settings(super::link::tcp_settings())
            .build()
            .map_err(backend)?;
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
async fn run(
    conn: &ClusterConnection,
    call: &Call,
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

/// The positions of `keys`, grouped by slot, each group in the order its
/// first key was given.
fn by_slot(
    keys: impl Iterator<Item = String>,
) -> SmallVec<[SmallVec<[usize; 4]>; 2]> {
    let mut groups: SmallVec<[(Slot, SmallVec<[usize; 4]>); 2]> =
        SmallVec::new();
    for (i, key) in keys.enumerate() {
        let slot = Slot::for_key(key.as_bytes());
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(i),
            None => groups.push((slot, SmallVec::from_elem(i, 1))),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// Decides `checks` into `out`. One slot: one call, all or nothing. Several:
/// slot by slot; a refusal refunds the slots already charged and only reads
/// the ones after it.
pub(super) async fn decide(
    conn: &ClusterConnection,
    checks: &[BucketCheck<'_>],
    out: &mut [Decision],
) -> Result<(), StorageError> {
    let groups = by_slot(checks.iter().map(|c| c.key(KeyLayout::Cluster)));
    if let [_] = groups.as_slice() {
        let call = Call::check(checks, KeyLayout::Cluster);
        let reply = run(conn, &call).await.map_err(backend)?;
        return read_decisions(call.lua, reply, out);
    }
    let mut charged: SmallVec<[usize; 2]> = SmallVec::new();
    for (g, group) in groups.iter().enumerate() {
        let part: SmallVec<[BucketCheck<'_>; 4]> =
            group.iter().map(|&i| checks[i]).collect();
        let mut decided: SmallVec<[Decision; 4]> =
            SmallVec::from_elem(Decision::default(), part.len());
        let call = Call::check(&part, KeyLayout::Cluster);
        let result = match run(conn, &call).await {
            Ok(reply) => read_decisions(call.lua, reply, &mut decided),
            Err(error) => Err(backend(error)),
        };
        if let Err(error) = result {
            // Give back what was taken; the error is the answer.
            let _ = refund(conn, checks, out, &groups, &charged).await;
            return Err(error);
        }
        for (&i, decision) in group.iter().zip(&decided) {
            out[i] = *decision;
        }
        let verdict = Verdict::of(part.iter().map(|c| c.is_shadow()), &decided);
        if !verdict.allowed {
            refund(conn, checks, out, &groups, &charged).await?;
            return read_only(conn, checks, out, &groups[g + 1..]).await;
        }
        charged.push(g);
    }
    Ok(())
}

/// Gives back the charges of the `charged` groups, and says so in `out`:
/// those buckets passed, but are not charged.
async fn refund(
    conn: &ClusterConnection,
    checks: &[BucketCheck<'_>],
    out: &mut [Decision],
    groups: &[SmallVec<[usize; 4]>],
    charged: &[usize],
) -> Result<(), StorageError> {
    for &g in charged {
        let taken: SmallVec<[usize; 4]> = groups[g]
            .iter()
            .copied()
            .filter(|&i| checks[i].cost() > 0 && out[i].allowed)
            .collect();
        if taken.is_empty() {
            continue;
        }
        let settles: SmallVec<[BucketSettle<'_>; 4]> = taken
            .iter()
            .map(|&i| checks[i].settle(Adjust::Refund(checks[i].cost())))
            .collect();
        let call = Call::settle(&settles, KeyLayout::Cluster);
        let reply = run(conn, &call).await.map_err(backend)?;
        let settled = read_settled(call.lua, reply, settles.len())?;
        for (&i, (remaining, reset_after_us)) in taken.iter().zip(settled) {
            out[i] = Decision {
                allowed: true,
                remaining,
                retry_after_us: 0,
                reset_after_us,
                store: None,
            };
        }
    }
    Ok(())
}

/// Reads the buckets of `groups` without charging them, and says of each
/// what its charge would have met: GCRA is the same at any origin of time,
/// so the bucket read `reset_after` ahead is checked at 0. A bucket that
/// would refuse too is reported refusing, with its wait, so that the
/// decision's wait is the longest, as one call would have told it.
async fn read_only(
    conn: &ClusterConnection,
    checks: &[BucketCheck<'_>],
    out: &mut [Decision],
    groups: &[SmallVec<[usize; 4]>],
) -> Result<(), StorageError> {
    for group in groups {
        let peeks: SmallVec<[BucketCheck<'_>; 4]> =
            group.iter().map(|&i| checks[i].as_peek()).collect();
        let mut decided: SmallVec<[Decision; 4]> =
            SmallVec::from_elem(Decision::default(), peeks.len());
        let call = Call::check(&peeks, KeyLayout::Cluster);
        let reply = run(conn, &call).await.map_err(backend)?;
        read_decisions(call.lua, reply, &mut decided)?;
        for (&i, peek) in group.iter().zip(&decided) {
            let check = &checks[i];
            out[i] = match check.cost() {
                0 => *peek,
                cost => match check.quota().check(
                    Some(peek.reset_after_us),
                    0,
                    cost,
                ) {
                    Ok(would) if !would.allowed => Decision {
                        store: None,
                        ..would
                    },
                    _ => *peek,
                },
            };
        }
    }
    Ok(())
}

/// Settles `settles`, one call per slot.
pub(super) async fn settle(
    conn: &ClusterConnection,
    settles: &[BucketSettle<'_>],
) -> Result<(), StorageError> {
    let groups =
        by_slot(settles.iter().map(|s| s.bucket.key(KeyLayout::Cluster)));
    for group in &groups {
        let part: SmallVec<[BucketSettle<'_>; 4]> =
            group.iter().map(|&i| settles[i]).collect();
        let call = Call::settle(&part, KeyLayout::Cluster);
        let reply = run(conn, &call).await.map_err(backend)?;
        read_settled(call.lua, reply, part.len())?;
    }
    Ok(())
}
