//! An identity lookup that fails (the database behind an async
//! `TierIdentifier` is down) is not "no identity". It follows its own
//! policy, `OnIdentityError`, failing closed by default (503 with
//! `retry-after`), and it never pools callers into the one anonymous bucket.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::{Router, routing::get};
use http::StatusCode;
use http::request::Parts;
use support::http::{Events, get_as};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    IdentityError, LimitEvent, MemoryStorage, Observer, OnMissing, Quota,
    RateTier, TierIdentifier, TierIdentity, TierLimitLayer, observe::Checked,
    observe::Outcome, policy::OnIdentityError,
};

/// Keys `key_*` are free users; no key is no identity; while `down` is
/// set every lookup fails.
#[derive(Clone, Default)]
struct Accounts {
    down: Arc<AtomicBool>,
}

#[async_trait::async_trait]
impl TierIdentifier for Accounts {
    async fn identify(
        &self,
        parts: &Parts,
    ) -> Result<Option<TierIdentity<'static>>, IdentityError> {
        tokio::task::yield_now().await;
        if self.down.load(Ordering::SeqCst) {
            return Err(IdentityError::new(std::io::Error::other(
                "connection refused",
            )));
        }
        let Some(key) = parts.headers.get("x-api-key") else {
            return Ok(None);
        };
        let key = key.to_str().map_err(IdentityError::new)?.to_owned();
        Ok(Some(TierIdentity::new(key, "free")))
    }
}

/// Counts outcomes.
#[derive(Clone, Default)]
struct Outcomes(Arc<std::sync::Mutex<Vec<Outcome>>>);

impl Observer for Outcomes {
    fn checked(&self, check: &Checked) {
        self.0.lock().unwrap().push(check.outcome);
    }
}

struct Fixture {
    app: Router,
    accounts: Accounts,
    store: MemoryStorage,
    events: Events,
    outcomes: Outcomes,
    calls: Arc<AtomicUsize>,
}

/// Free: 3 a minute, the default tier, anonymous requests share its one
/// bucket (`OnMissing::UseDefault`).
fn fixture(policy: Option<OnIdentityError>) -> Fixture {
    let clock = FakeClock::new();
    let store = MemoryStorage::with_clock(clock.clone());
    let mut tiers = RateTier::builder()
        .clock(clock)
        .tier("free", Quota::per_minute(3))
        .default_tier("free")
        .on_missing(OnMissing::UseDefault)
        .storage(Arc::new(store.clone()));
    if let Some(policy) = policy {
        tiers = tiers.on_identity_error(policy);
    }
    let accounts = Accounts::default();
    let events = Events::default();
    let outcomes = Outcomes::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let layer = TierLimitLayer::new(tiers.build())
        .identifier(accounts.clone())
        .on_event(events.sink())
        .observe(outcomes.clone());
    let app = Router::new()
        .route(
            "/",
            get(move || async move {
                c.fetch_add(1, Ordering::SeqCst);
                "ok"
            }),
        )
        .layer(layer);
    Fixture {
        app,
        accounts,
        store,
        events,
        outcomes,
        calls,
    }
}

#[tokio::test]
async fn a_failed_lookup_is_503_with_retry_after_by_default() {
    let f = fixture(None);
    f.accounts.down.store(true, Ordering::SeqCst);
    for key in [Some("key_ana"), None] {
        let r = get_as(&f.app, key, "/").await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{key:?}");
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.body, r#"{"error":"rate limiter unavailable"}"#);
        assert!(!r.has_rate_headers());
    }
    assert_eq!(f.calls.load(Ordering::SeqCst), 0, "the inner service ran");
    assert_eq!(f.store.len(), 0, "a bucket was charged");
    let failed = f.events.all();
    assert_eq!(failed.len(), 2, "{failed:?}");
    for event in failed {
        match event {
            LimitEvent::IdentityFailed { error, policy } => {
                assert!(error.contains("connection refused"), "{error}");
                assert_eq!(
                    policy,
                    OnIdentityError::Deny(StatusCode::SERVICE_UNAVAILABLE)
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        *f.outcomes.0.lock().unwrap(),
        [Outcome::IdentityError, Outcome::IdentityError]
    );
    assert_eq!(Outcome::IdentityError.as_str(), "identity_error");
}

/// Before the fix, a failed lookup was "no identity": with
/// `OnMissing::UseDefault` every caller was charged to the one anonymous
/// bucket, so an outage of the database let one client lock out everyone
/// anonymous (or everyone share 3 requests a minute).
#[tokio::test]
async fn a_failed_lookup_never_charges_the_anonymous_bucket() {
    for policy in [
        None,
        Some(OnIdentityError::Deny(StatusCode::BAD_GATEWAY)),
        Some(OnIdentityError::Allow),
    ] {
        let f = fixture(policy);
        f.accounts.down.store(true, Ordering::SeqCst);
        for i in 0..10 {
            let key = format!("key_{i}");
            let r = get_as(&f.app, Some(&key), "/").await;
            let expected = match policy {
                Some(OnIdentityError::Allow) => StatusCode::OK,
                Some(OnIdentityError::Deny(status)) => status,
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            assert_eq!(r.status, expected, "{policy:?}");
            assert!(!r.has_rate_headers(), "{policy:?}: {r:?}");
        }
        assert_eq!(f.store.len(), 0, "{policy:?}: a bucket was charged");
        // The database is back: the anonymous bucket is still full.
        f.accounts.down.store(false, Ordering::SeqCst);
        let anonymous = get_as(&f.app, None, "/").await;
        assert_eq!(anonymous.status, StatusCode::OK);
        assert_eq!(anonymous.remaining(), 2, "{policy:?}");
        let ana = get_as(&f.app, Some("key_ana"), "/").await;
        assert_eq!(ana.remaining(), 2, "{policy:?}");
    }
}

#[tokio::test]
async fn failing_open_is_explicit_and_reported_each_time() {
    let f = fixture(Some(OnIdentityError::Allow));
    f.accounts.down.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        let r = get_as(&f.app, Some("key_ana"), "/").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, "ok");
    }
    assert_eq!(f.calls.load(Ordering::SeqCst), 5);
    assert_eq!(
        f.events.count(|e| matches!(
            e,
            LimitEvent::IdentityFailed {
                policy: OnIdentityError::Allow,
                ..
            }
        )),
        5
    );
    assert_eq!(*f.outcomes.0.lock().unwrap(), [Outcome::Unlimited; 5]);
}

#[tokio::test]
async fn a_chosen_status_is_kept_with_its_retry_after() {
    let f = fixture(Some(OnIdentityError::Deny(StatusCode::BAD_GATEWAY)));
    f.accounts.down.store(true, Ordering::SeqCst);
    let r = get_as(&f.app, Some("key_ana"), "/").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(r.header("retry-after"), Some("1"));
    // The database answers again: limits apply as usual.
    f.accounts.down.store(false, Ordering::SeqCst);
    assert_eq!(get_as(&f.app, Some("key_ana"), "/").await.remaining(), 2);
}
