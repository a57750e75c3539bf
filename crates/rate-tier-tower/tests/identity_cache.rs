//! CachedIdentifier: an async identity lookup made once per key and TTL.
#![cfg(feature = "identity-cache")]
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::{Router, routing::get};
use http::Request;
use http::request::Parts;
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    CachedIdentifier, IdentityError, Quota, RateTier, TierIdentifier,
    TierIdentity, TierLimitLayer, Window, rules::Rule,
};

/// A "database" that counts its lookups, takes a while to answer, and is
/// down while `down` is set.
#[derive(Clone, Default)]
struct Db {
    lookups: Arc<AtomicUsize>,
    down: Arc<AtomicBool>,
}

#[async_trait::async_trait]
impl TierIdentifier for Db {
    async fn identify(
        &self,
        parts: &Parts,
    ) -> Result<Option<TierIdentity<'static>>, IdentityError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        if self.down.load(Ordering::SeqCst) {
            return Err(IdentityError::new(std::io::Error::other("db down")));
        }
        let Some(key) = parts.headers.get("x-api-key") else {
            return Ok(None);
        };
        let key = key.to_str().map_err(IdentityError::new)?;
        Ok((key == "key_ana")
            .then(|| TierIdentity::new(key.to_owned(), "free")))
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
        let who = task.await.unwrap().unwrap().unwrap();
        assert_eq!(who.user(), "key_ana");
    }
    assert_eq!(db.lookups.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn invalidate_all_forgets() {
    let db = Db::default();
    let identifier = cached(db.clone());
    let (parts, ()) = request(Some("key_ana")).map(|_| ()).into_parts();
    identifier.identify(&parts).await.unwrap().unwrap();
    identifier.invalidate_all();
    identifier.identify(&parts).await.unwrap().unwrap();
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
    assert!(identifier.identify(&unknown).await.unwrap().is_none());
    assert!(identifier.identify(&known).await.unwrap().is_some());
    assert_eq!(db.lookups.load(Ordering::SeqCst), 2);

    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while db.lookups.load(Ordering::SeqCst) == 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "never looked up again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        identifier.identify(&unknown).await.unwrap();
    }
    // The unknown key was looked up again; the known one still is cached
    // (its TTL is a minute).
    let lookups = db.lookups.load(Ordering::SeqCst);
    assert!(identifier.identify(&known).await.unwrap().is_some());
    assert_eq!(db.lookups.load(Ordering::SeqCst), lookups);
}

/// A lookup that failed (the database is down) is not an answer:
/// it is not kept, the next request asks again, and this one gets the
/// identity error policy (503, retry after 1 s, by default).
#[tokio::test]
async fn a_failed_lookup_is_not_cached() {
    let db = Db::default();
    let app = app(db.clone());
    db.down.store(true, Ordering::SeqCst);
    for k in 1..=3 {
        let response =
            app.clone().oneshot(request(Some("key_ana"))).await.unwrap();
        assert_eq!(response.status(), 503, "request {k}");
        assert_eq!(response.headers()["retry-after"], "1");
        assert_eq!(db.lookups.load(Ordering::SeqCst), k);
    }
    db.down.store(false, Ordering::SeqCst);
    for _ in 0..3 {
        let response =
            app.clone().oneshot(request(Some("key_ana"))).await.unwrap();
        assert_eq!(response.status(), 200);
    }
    // One more lookup, then the answer is cached.
    assert_eq!(db.lookups.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_misses_that_fail_all_get_the_error_and_none_is_kept() {
    let db = Db::default();
    db.down.store(true, Ordering::SeqCst);
    let identifier = Arc::new(cached(db.clone()));
    let (parts, ()) = request(Some("key_ana")).map(|_| ()).into_parts();
    let parts = Arc::new(parts);
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (identifier, parts) = (identifier.clone(), parts.clone());
            tokio::spawn(async move { identifier.identify(&parts).await })
        })
        .collect();
    for task in tasks {
        let error = task.await.unwrap().unwrap_err();
        assert!(error.to_string().contains("db down"), "{error}");
    }
    let failed = db.lookups.load(Ordering::SeqCst);
    assert!((1..=20).contains(&failed), "{failed}");
    db.down.store(false, Ordering::SeqCst);
    let who = identifier.identify(&parts).await.unwrap().unwrap();
    assert_eq!(who.user(), "key_ana");
    assert_eq!(db.lookups.load(Ordering::SeqCst), failed + 1);
}

// ---------------------------------------------------------------------------
// A customer's own quota comes with the cached identity.

/// Accounts with ada's own quota for free, as the database holds it now;
/// counts its lookups.
#[derive(Clone)]
struct Accounts {
    ada: Arc<std::sync::Mutex<Rule>>,
    lookups: Arc<AtomicUsize>,
}

impl Accounts {
    fn with(ada: impl Into<Rule>) -> Self {
        Accounts {
            ada: Arc::new(std::sync::Mutex::new(ada.into())),
            lookups: Arc::default(),
        }
    }

    fn set(&self, ada: impl Into<Rule>) {
        *self.ada.lock().unwrap() = ada.into();
    }

    fn lookups(&self) -> usize {
        self.lookups.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl TierIdentifier for Accounts {
    async fn identify(
        &self,
        parts: &Parts,
    ) -> Result<Option<TierIdentity<'static>>, IdentityError> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        tokio::task::yield_now().await;
        let Some(key) = parts.headers.get("x-api-key") else {
            return Ok(None);
        };
        let key = key.to_str().map_err(IdentityError::new)?;
        let own = *self.ada.lock().unwrap();
        Ok((key == "key_ada").then(|| {
            TierIdentity::new(key.to_owned(), "free").with_quota("free", own)
        }))
    }
}

/// Free is 100 a minute; the accounts' lookups cached for `ttl`.
fn own_quota_app(
    accounts: Accounts,
    ttl: Duration,
) -> (Router, Arc<CachedIdentifier<Accounts, Vec<u8>>>) {
    let tiers = RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(100))
        .build();
    let cached = Arc::new(CachedIdentifier::new(
        accounts,
        |parts: &Parts| {
            Some(parts.headers.get("x-api-key")?.as_bytes().to_vec())
        },
        ttl,
        1000,
    ));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(TierLimitLayer::new(tiers).identifier(cached.clone()));
    (app, cached)
}

/// A response's status and `x-ratelimit-limit` / `-remaining`.
async fn limit_of(app: &Router) -> (u16, u64, u64) {
    let response = app.clone().oneshot(request(Some("key_ada"))).await.unwrap();
    let header = |name: &str| -> u64 {
        response.headers()[name].to_str().unwrap().parse().unwrap()
    };
    (
        response.status().as_u16(),
        header("x-ratelimit-limit"),
        header("x-ratelimit-remaining"),
    )
}

#[tokio::test]
async fn a_cached_identity_keeps_its_own_quota_until_refreshed() {
    let accounts = Accounts::with(Quota::per_minute(500));
    let (app, cached) =
        own_quota_app(accounts.clone(), Duration::from_secs(60));
    // Her own 500 a minute, not free's 100: 60 of them spend 7.2 s.
    for left in (440..500).rev() {
        assert_eq!(limit_of(&app).await, (200, 500, left));
    }
    assert_eq!(accounts.lookups(), 1);
    // Her quota becomes 200 a minute; the cached identity still has 500.
    accounts.set(Quota::per_minute(200));
    assert_eq!(limit_of(&app).await, (200, 500, 439));
    assert_eq!(accounts.lookups(), 1);
    // Refreshed: the new quota, over what was spent (7.32 s, and 0.3 s
    // for this one: 52.38 s left, 174 requests of 0.3 s).
    cached.invalidate_all();
    assert_eq!(limit_of(&app).await, (200, 200, 174));
    assert_eq!(accounts.lookups(), 2);
}

#[tokio::test]
async fn a_cached_own_quota_of_the_wrong_kind_fails_closed() {
    let accounts =
        Accounts::with(Window::new(5, Duration::from_secs(60)).unwrap());
    let (app, cached) =
        own_quota_app(accounts.clone(), Duration::from_secs(60));
    // Cached or not, refused every time: never unlimited.
    for _ in 0..5 {
        let response =
            app.clone().oneshot(request(Some("key_ada"))).await.unwrap();
        assert_eq!(response.status(), 500);
    }
    assert_eq!(accounts.lookups(), 1);
    // Corrected, and refreshed: the full bucket (nothing was charged).
    accounts.set(Quota::per_minute(500));
    cached.invalidate_all();
    assert_eq!(limit_of(&app).await, (200, 500, 499));
}
