//! CachedIdentifier: an async identity lookup made once per key and TTL.
#![cfg(feature = "identity-cache")]
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::{Router, routing::get};
use http::Request;
use http::request::Parts;
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    CachedIdentifier, Quota, RateTier, TierIdentifier, TierIdentity,
    TierLimitLayer,
};

/// A "database" that counts its lookups and takes a while to answer.
#[derive(Clone, Default)]
struct Db {
    lookups: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl TierIdentifier for Db {
    async fn identify(&self, parts: &Parts) -> Option<TierIdentity> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        let key = parts.headers.get("x-api-key")?.to_str().ok()?;
        (key == "key_ana").then(|| TierIdentity::new(key, "free"))
    }
}

fn cached(db: Db) -> CachedIdentifier<Db, Vec<u8>> {
    CachedIdentifier::new(
        db,
        |parts: &Parts| {
            Some(parts.headers.get("x-api-key")?.as_bytes().to_vec())
        },
        Duration::from_secs(60),
        1000,
    )
}

fn app(db: Db) -> Router {
    let tiers = RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(100))
        .build();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier(cached(db)))
}

fn request(key: Option<&str>) -> Request<Body> {
    let mut builder = Request::get("/");
    if let Some(key) = key {
        builder = builder.header("x-api-key", key);
    }
    builder.body(Body::empty()).unwrap()
}

#[tokio::test]
async fn one_lookup_per_key_however_many_requests() {
    let db = Db::default();
    let app = app(db.clone());
    for _ in 0..20 {
        let response =
            app.clone().oneshot(request(Some("key_ana"))).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(db.lookups.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn unknown_keys_are_cached_too() {
    let db = Db::default();
    let app = app(db.clone());
    for _ in 0..5 {
        let response =
            app.clone().oneshot(request(Some("nope"))).await.unwrap();
        assert_eq!(response.status(), 401, "no identity, no default tier");
    }
    assert_eq!(db.lookups.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn requests_without_a_cache_key_are_looked_up_every_time() {
    let db = Db::default();
    let app = app(db.clone());
    for _ in 0..3 {
        app.clone().oneshot(request(None)).await.unwrap();
    }
    assert_eq!(db.lookups.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_misses_on_one_key_make_one_lookup() {
    let db = Db::default();
    let identifier = Arc::new(cached(db.clone()));
    let (parts, ()) = request(Some("key_ana")).map(|_| ()).into_parts();
    let parts = Arc::new(parts);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (identifier, parts) = (identifier.clone(), parts.clone());
            tokio::spawn(async move { identifier.identify(&parts).await })
        })
        .collect();
    for task in tasks {
        let who = task.await.unwrap().unwrap();
        assert_eq!(who.user(), "key_ana");
    }
    assert_eq!(db.lookups.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn invalidate_all_forgets() {
    let db = Db::default();
    let identifier = cached(db.clone());
    let (parts, ()) = request(Some("key_ana")).map(|_| ()).into_parts();
    identifier.identify(&parts).await.unwrap();
    identifier.invalidate_all();
    identifier.identify(&parts).await.unwrap();
    assert_eq!(db.lookups.load(Ordering::SeqCst), 2);
}

/// "No identity" lives for the negative TTL only. moka keeps time by
/// itself (no fake clock reaches it), so this test waits, briefly, for a
/// real expiry, as the Redis expiry tests do.
#[tokio::test]
async fn no_identity_is_forgotten_after_the_negative_ttl() {
    let db = Db::default();
    let identifier = cached(db.clone()).negative_ttl(Duration::from_millis(30));
    let (unknown, ()) = request(Some("nope")).map(|_| ()).into_parts();
    let (known, ()) = request(Some("key_ana")).map(|_| ()).into_parts();
    assert!(identifier.identify(&unknown).await.is_none());
    assert!(identifier.identify(&known).await.is_some());
    assert_eq!(db.lookups.load(Ordering::SeqCst), 2);

    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while db.lookups.load(Ordering::SeqCst) == 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "never looked up again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        identifier.identify(&unknown).await;
    }
    // The unknown key was looked up again; the known one still is cached
    // (its TTL is a minute).
    let lookups = db.lookups.load(Ordering::SeqCst);
    assert!(identifier.identify(&known).await.is_some());
    assert_eq!(db.lookups.load(Ordering::SeqCst), lookups);
}
