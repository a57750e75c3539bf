//! Reading what a store wrote: the keys on a server.

use redis::aio::ConnectionLike;

/// Every key matching `pattern`, with SCAN (which, on a cluster node, sees
/// that node's own keys only). Unlike `DBSIZE`, SCAN skips expired keys.
///
/// ```no_run
/// # async fn f(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<()> {
/// let keys = rate_tier_test_support::scan_keys(conn, "trt:free:*").await?;
/// assert!(keys.iter().all(|key| key.starts_with("trt:free:")));
/// # Ok(())
/// # }
/// ```
pub async fn scan_keys<C: ConnectionLike + Send>(
    conn: &mut C,
    pattern: &str,
) -> redis::RedisResult<Vec<String>> {
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}
