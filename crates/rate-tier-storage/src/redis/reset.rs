//! [`Storage::reset`](crate::Storage::reset) on Redis: one `DEL` of the
//! buckets' keys (on a Redis Cluster, one per hash slot), and their
//! remembered refusals forgotten on this instance. Other instances
//! remember a refusal at most until its own retry time.

use std::time::Duration;

use ::redis::Value;

use super::cluster;
use super::link::Conn;
use super::{Shared, backend};
use crate::bucket::BucketCheck;
use crate::key::KeyLayout;
use crate::rule::Rule;
use crate::storage::StorageError;

/// `DEL` is the same however often it runs: a connection refused, or a
/// reply lost, may be sent again.
pub(super) async fn reset(
    shared: &Shared,
    buckets: &[BucketCheck<'_>],
    layout: KeyLayout,
    timeout: Duration,
) -> Result<(), StorageError> {
    // A concurrency limit's slots belong to requests that still run.
    let keys: Vec<String> = buckets
        .iter()
        .filter(|bucket| !matches!(bucket.rule(), Rule::Concurrency(_)))
        .map(|bucket| bucket.key(layout))
        .collect();
    if keys.is_empty() {
        return Ok(());
    }
    let conn = shared.link.current();
    match &*conn {
        Conn::Single(single) => {
            let mut single = single.clone();
            let del = ::redis::cmd("DEL").arg(&keys).to_owned();
            let run = async {
                match del.query_async::<Value>(&mut single).await {
                    Err(error) if error.is_connection_refusal() => {
                        del.query_async::<Value>(&mut single).await
                    }
                    result => result,
                }
            };
            tokio::time::timeout(timeout, run)
                .await
                .map_err(|_| StorageError::Timeout(timeout))?
                .map_err(backend)?;
        }
        Conn::Cluster(cluster_conn) => {
            for (slot, group) in
                cluster::by_slot(keys.iter().map(String::as_str))
            {
                let mut conn = cluster_conn.clone();
                let part: Vec<&str> =
                    group.iter().map(|&i| keys[i].as_str()).collect();
                let del = ::redis::cmd("DEL").arg(&part).to_owned();
                let done = tokio::time::timeout(
                    timeout,
                    del.query_async::<Value>(&mut conn),
                )
                .await
                .map_err(|_| StorageError::Timeout(timeout))
                .and_then(|result| result.map_err(backend))
                .map_err(|error| cluster::in_domain(shared, slot, error));
                done?;
            }
        }
    }
    for key in &keys {
        shared.refusals.forget(key);
    }
    Ok(())
}
