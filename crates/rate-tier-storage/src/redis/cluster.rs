//! [`RedisStorage`] on a Redis Cluster: the constructors, and the check,
//! which differs from the single-node one in its key (a hash tag) and in
//! how it answers `NOSCRIPT` (an `EVAL` routed by the key, not a `SCRIPT
//! LOAD` sent to every node). The rest (the script, the reply, the timeout)
//! is shared with the single-node store in `mod.rs`.

use ::redis::cluster::{ClusterClientBuilder, ClusterConfig};
use ::redis::cluster_async::ClusterConnection;
use ::redis::{ErrorKind, RedisError, ServerErrorKind, Value};

use super::{Conn, GCRA_SCRIPT, GCRA_SOURCE, RedisStorage, backend};
use crate::{BucketCheck, StorageError, key};

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
    /// owns the bucket's slot. Keys are [`key::cluster_bucket_key`]s. See
    /// [`RedisStorage`], section *Redis Cluster*.
    ///
    /// `get_async_connection().await` connects first (and fails if no seed
    /// node answers); `get_pending_async_connection_with_config` returns at
    /// once and connects in the background, as
    /// [`RedisStorage::from_cluster_urls`] does.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use rate_tier_storage::{BucketCheck, RedisStorage, Storage};
    /// use gcra_core::Quota;
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
    /// let check = BucketCheck::new("free", "key_ana", Quota::per_minute(10), 1);
    /// // Runs on the node that owns trt:free:{33d2315cbeb866b8b237240a98d605f2e6e41b8a}.
    /// assert!(store.check(&check).await?.allowed);
    /// # Ok(()) }
    /// ```
    pub fn cluster(conn: ClusterConnection) -> Self {
        RedisStorage {
            conn: Conn::Cluster(conn),
            timeout: Self::DEFAULT_TIMEOUT,
        }
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
    /// a `TRYAGAIN` or `CLUSTERDOWN`) and no response timeout of its own:
    /// [`RedisStorage::timeout`] is the one limit of a check.
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
            .build()
            .map_err(backend)?;
        // The default config: no response timeout, redis-rs's connection
        // timeout (1 s per connection attempt, under the check's timeout).
        let conn = client
            .get_pending_async_connection_with_config(ClusterConfig::new());
        Ok(Self::cluster(conn))
    }
}

/// Runs `gcra.lua` on the cluster bucket of `check`: `EVALSHA`, and on
/// `NOSCRIPT`, `EVAL` with the source. Both are routed by their one key, to
/// the master that owns its slot.
pub(super) async fn eval(
    mut conn: ClusterConnection,
    check: &BucketCheck<'_>,
) -> Result<Value, RedisError> {
    let key = key::cluster_bucket_key(check.tier, check.user, check.key_secret);
    let script_call = |command: &str, script: &str| {
        let mut call = ::redis::cmd(command);
        call.arg(script)
            .arg(1)
            .arg(&key)
            .arg(check.quota.emission_interval_us())
            .arg(check.quota.burst_offset_us())
            .arg(check.cost);
        call
    };
    match script_call("EVALSHA", GCRA_SCRIPT.get_hash())
        .query_async(&mut conn)
        .await
    {
        Err(error)
            if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
        {
            script_call("EVAL", GCRA_SOURCE)
                .query_async(&mut conn)
                .await
        }
        result => result,
    }
}
