//! [`Storage::reset`](crate::Storage::reset) on Redis: one `DEL` of the
//! buckets' keys (on a Redis Cluster, one per hash slot), their remembered
//! refusals forgotten on this instance, and a new value under
//! `trt:resets`, which makes every other instance forget what it
//! remembers within a second (see `resets.rs`).

use std::time::Duration;

use ::redis::Value;

use super::cluster;
use super::link::Conn;
use super::resets::{RESETS_KEY, new_value};
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
            let mut del = ::redis::pipe();
            del.cmd("DEL").arg(&keys).ignore();
            del.cmd("SET").arg(RESETS_KEY).arg(new_value()).ignore();
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
            let mut conn = cluster_conn.clone();
            let set = ::redis::cmd("SET")
                .arg(RESETS_KEY)
                .arg(new_value())
                .to_owned();
            tokio::time::timeout(timeout, set.query_async::<Value>(&mut conn))
                .await
                .map_err(|_| StorageError::Timeout(timeout))?
                .map_err(backend)?;
        }
    }
    for key in &keys {
        shared.refusals.forget(key);
    }
    Ok(())
}
