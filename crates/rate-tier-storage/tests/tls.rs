//! TLS to the shared stores, against throwaway servers whose certificates
//! a CA each test makes signed (rate-tier-test-support's `TestCa`, never a
//! committed key): a Redis with a TLS port (`rediss://`), a PostgreSQL with
//! `ssl = on` (`sslmode`, `sslrootcert`). A store that trusts the CA
//! decides through TLS; one that does not is refused by the handshake, and
//! nothing is charged.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use gcra_core::{Decision, Quota};
use rate_tier_storage::{
    BucketCheck, LimitName, PostgresConfigError, PostgresStorage, RedisStorage,
    Storage, StorageError, StorageExt,
};
use rate_tier_test_support::{PostgresServer, RedisServer, TestCa, unique};

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

/// Whether the error is a TLS handshake's refusal of the certificate.
fn refused_certificate(error: &StorageError) -> bool {
    format!("{error:?}").to_lowercase().contains("certificate")
}

// --- Redis --------------------------------------------------------------------

/// The keys the server holds.
fn redis_keys(server: &RedisServer) -> u64 {
    server.command(&["DBSIZE"]).unwrap().trim().parse().unwrap()
}

fn redis_with_tls(ca: &TestCa) -> (RedisServer, u16) {
    RedisServer::try_start_tls(ca).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn redis_a_store_that_trusts_the_ca_decides_through_tls() {
    let ca = TestCa::generate().unwrap();
    let (server, tls_port) = redis_with_tls(&ca);
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
    assert_eq!(redis_keys(&server), 2, "one bucket per user");
}

#[tokio::test]
async fn redis_a_server_another_ca_signed_is_refused_and_nothing_is_charged() {
    let ca = TestCa::generate().unwrap();
    let stranger = TestCa::generate().unwrap();
    let (server, tls_port) = redis_with_tls(&ca);
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    let name = LimitName::new(unique("tls")).unwrap();
    let timeout = std::time::Duration::from_secs(5);

    // A CA that did not sign the server's certificate.
    let wrong =
        RedisStorage::from_url_with_ca(&url, stranger.ca_pem().as_bytes())
            .unwrap()
            .timeout(timeout);
    let refused = check(&wrong, &name, "ana").await.unwrap_err();
    assert!(refused_certificate(&refused), "{refused}");
    // The public roots do not know the test CA either.
    let public = RedisStorage::from_url(&url).unwrap().timeout(timeout);
    let refused = check(&public, &name, "ana").await.unwrap_err();
    assert!(refused_certificate(&refused), "{refused}");
    assert_eq!(redis_keys(&server), 0);

    // The right CA: the bucket starts full, nothing was charged before.
    let trusted = RedisStorage::from_url_with_ca(&url, ca.ca_pem().as_bytes())
        .unwrap()
        .timeout(timeout);
    assert_eq!(check(&trusted, &name, "ana").await.unwrap(), 9);
}

#[tokio::test]
async fn redis_a_bad_ca_file_is_an_error_at_once() {
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

// --- PostgreSQL ---------------------------------------------------------------

/// A table of its own (a name of lowercase letters, digits and `_`).
fn table() -> String {
    unique("tls").replace('-', "_")
}

fn store(url: &str) -> PostgresStorage {
    postgres_store(url, &table())
}

fn postgres_store(url: &str, table: &str) -> PostgresStorage {
    PostgresStorage::builder(url)
        .unwrap()
        .table(table)
        .unwrap()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// TLS connections the server holds now.
fn tls_connections(server: &PostgresServer) -> u64 {
    server
        .psql("SELECT count(*) FROM pg_stat_ssl WHERE ssl")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn postgres_verify_full_with_the_test_ca_decides_through_tls() {
    let ca = TestCa::generate().unwrap();
    let mut server = PostgresServer::start();
    server.enable_tls(&ca).unwrap();
    let root = ca.ca_file();
    let name = LimitName::new("tls").unwrap();
    for mode in ["verify-full", "require"] {
        let url = format!(
            "{}?sslmode={mode}&sslrootcert={}",
            server.url(),
            root.display()
        );
        let store = store(&url);
        store.migrate().await.unwrap();
        assert_eq!(check(&store, &name, "ana").await.unwrap(), 9, "{mode}");
        assert_eq!(check(&store, &name, "ana").await.unwrap(), 8, "{mode}");
        assert!(tls_connections(&server) >= 1, "{mode}: a TLS connection");
    }
}

#[tokio::test]
async fn postgres_a_server_another_ca_signed_is_refused() {
    let ca = TestCa::generate().unwrap();
    let stranger = TestCa::generate().unwrap();
    let mut server = PostgresServer::start();
    server.enable_tls(&ca).unwrap();
    let name = LimitName::new("tls").unwrap();
    // Migrated over a plain connection, so that only the check can fail.
    let table = table();
    let plain = postgres_store(&server.url(), &table);
    plain.migrate().await.unwrap();
    for url in [
        format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            server.url(),
            stranger.ca_file().display()
        ),
        // The public roots do not know the test CA.
        format!("{}?sslmode=verify-full", server.url()),
    ] {
        let untrusting = postgres_store(&url, &table);
        let error = check(&untrusting, &name, "ana").await.unwrap_err();
        assert!(refused_certificate(&error), "{error:?}");
    }
    // Nothing was charged: the bucket starts full.
    assert_eq!(check(&plain, &name, "ana").await.unwrap(), 9);
}

#[tokio::test]
async fn postgres_tls_asked_of_a_server_without_it_is_refused() {
    let ca = TestCa::generate().unwrap();
    let server = PostgresServer::start();
    let url = format!(
        "{}?sslmode=require&sslrootcert={}",
        server.url(),
        ca.ca_file().display()
    );
    let store = store(&url);
    assert!(store.migrate().await.is_err());
}

#[test]
fn postgres_a_bad_root_file_is_an_error_at_once() {
    let ca = TestCa::generate().unwrap();
    for (root, why) in [
        (ca.key_file(), "a key, not a certificate"),
        (ca.dir().join("missing.pem"), "missing"),
    ] {
        let url = format!(
            "postgres://app@db/app?sslmode=verify-full&sslrootcert={}",
            root.display()
        );
        match PostgresStorage::builder(&url) {
            Err(PostgresConfigError::Tls(message)) => {
                assert!(message.contains("sslrootcert"), "{why}: {message}");
            }
            other => panic!("{why}: {other:?}"),
        }
    }
}
