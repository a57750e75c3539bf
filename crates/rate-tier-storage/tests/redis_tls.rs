//! `rediss://`: a throwaway Redis with a TLS port, its certificate signed
//! by a CA each test makes (rate-tier-test-support's `TestCa`, never a
//! committed key). A store that trusts that CA decides through TLS; one
//! that does not is refused by the handshake, and charges nothing.
#![allow(clippy::unwrap_used)]

use gcra_core::{Decision, Quota};
use rate_tier_storage::{
    BucketCheck, LimitName, RedisStorage, Storage, StorageError, StorageExt,
};
use rate_tier_test_support::{RedisServer, TestCa, unique};

/// The keys the server holds.
fn keys(server: &RedisServer) -> u64 {
    server.command(&["DBSIZE"]).unwrap().trim().parse().unwrap()
}

async fn check(
    store: &dyn Storage,
    name: &LimitName,
    user: &str,
) -> Result<u64, StorageError> {
    let check =
        [BucketCheck::new(name, user, Quota::per_minute(10), 1).unwrap()];
    let mut out = [Decision::default()];
    store.check(&check, &mut out).await?;
    Ok(out[0].remaining)
}

fn tls_server(ca: &TestCa) -> (RedisServer, u16) {
    RedisServer::try_start_tls(ca).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn a_store_that_trusts_the_ca_decides_through_tls() {
    let ca = TestCa::generate().unwrap();
    let (server, tls_port) = tls_server(&ca);
    let name = LimitName::new(unique("tls")).unwrap();
    // By address and by name: the certificate holds both.
    for host in ["127.0.0.1", "localhost"] {
        let url = format!("rediss://{host}:{tls_port}/");
        let store =
            RedisStorage::from_url_with_ca(&url, ca.ca_pem().as_bytes())
                .unwrap()
                .timeout(std::time::Duration::from_secs(5));
        let user = format!("ana-{host}");
        assert_eq!(check(&store, &name, &user).await.unwrap(), 9);
        assert_eq!(check(&store, &name, &user).await.unwrap(), 8);
    }
    // The buckets are on that server, as over a plain connection.
    assert_eq!(keys(&server), 2, "one bucket per user");
}

#[tokio::test]
async fn a_server_another_ca_signed_is_refused_and_nothing_is_charged() {
    let ca = TestCa::generate().unwrap();
    let stranger = TestCa::generate().unwrap();
    let (server, tls_port) = tls_server(&ca);
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    let name = LimitName::new(unique("tls")).unwrap();
    let timeout = std::time::Duration::from_secs(5);

    // A CA that did not sign the server's certificate.
    let wrong =
        RedisStorage::from_url_with_ca(&url, stranger.ca_pem().as_bytes())
            .unwrap()
            .timeout(timeout);
    let refused = check(&wrong, &name, "ana").await.unwrap_err();
    assert!(
        refused.to_string().contains("certificate"),
        "the handshake refuses the server: {refused}"
    );
    // The public roots do not know the test CA either.
    let public = RedisStorage::from_url(&url).unwrap().timeout(timeout);
    let refused = check(&public, &name, "ana").await.unwrap_err();
    assert!(refused.to_string().contains("certificate"), "{refused}");
    assert_eq!(keys(&server), 0);

    // The right CA: the bucket starts full, nothing was charged before.
    let trusted = RedisStorage::from_url_with_ca(&url, ca.ca_pem().as_bytes())
        .unwrap()
        .timeout(timeout);
    assert_eq!(check(&trusted, &name, "ana").await.unwrap(), 9);
}

#[tokio::test]
async fn a_bad_ca_file_is_an_error_at_once() {
    let ca = TestCa::generate().unwrap();
    let key = std::fs::read(ca.key_file()).unwrap();
    for (pem, why) in [
        (&b""[..], "empty"),
        (&b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"[..], "garbled"),
        (&key[..], "a key, not a certificate"),
    ] {
        let error = RedisStorage::from_url_with_ca("rediss://127.0.0.1:1/", pem)
            .err()
            .unwrap_or_else(|| panic!("{why}: accepted"));
        assert!(error.to_string().contains("CA certificate"), "{why}: {error}");
    }
}
