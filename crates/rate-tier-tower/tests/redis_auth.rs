//! AUTH in the Redis URL works as in redis-rs: a password, or an ACL user
//! and password. Against a throwaway redis-server of the test's own.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::sync::Arc;

use rate_tier_test_support::RedisServer;
use tower_rate_tier::{Error, Quota, RateTier, RedisStorage, StorageError};

fn limiter(url: &str) -> RateTier {
    let storage = RedisStorage::from_url(url).unwrap();
    RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .storage(Arc::new(storage))
        .build()
}

#[tokio::test]
async fn passwords_and_acl_users_in_the_url() {
    let server = RedisServer::start();
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "ana", "on", ">ana-pw", "~*", "+@all"][..])
        .query_async(&mut admin)
        .await
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "s3cret"][..])
        .query_async(&mut admin)
        .await
        .unwrap();
    let port = server.port();

    let with_password = limiter(&format!("redis://:s3cret@127.0.0.1:{port}/"));
    let info = with_password
        .check("bea", "free", 1)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.remaining, 9);

    let as_user = limiter(&format!("redis://ana:ana-pw@127.0.0.1:{port}/"));
    let info = as_user.check("bea", "free", 1).await.unwrap().unwrap();
    assert_eq!(info.remaining, 8, "the same bucket, through another login");

    for url in [
        format!("redis://:wrong@127.0.0.1:{port}/"),
        format!("redis://127.0.0.1:{port}/"),
    ] {
        let refused = limiter(&url).check("bea", "free", 1).await;
        assert!(
            matches!(refused, Err(Error::Storage(StorageError::Backend(_)))),
            "{url}: {refused:?}"
        );
    }
}
