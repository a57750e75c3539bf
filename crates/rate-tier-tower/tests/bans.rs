//! Bans with backoff (`RateTierBuilder::ban`): a ban after exactly K
//! refusals within W, held on a second instance sharing the store,
//! doubling, expiring, lifted by a reset; the 429 says so. Fake clock, one
//! memory store shared by two limiters.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use http::StatusCode;
use rate_tier_storage::{
    Adjustment, Answer, BucketCheck, Capabilities, Decided, Decision, Mode,
    RuleKind, StorageError, StorageExt,
};
use support::http::get_as;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    Ban, LimitEvent, LimitReason, MemoryStorage, Quota, RateTier, Storage,
    TierIdentity, TierLimitLayer,
};

const MINUTE: Duration = Duration::from_secs(60);

/// Free: 1 a minute. Banned after 3 refusals within a minute, for a
/// minute, doubling up to 4.
fn limiter(clock: &FakeClock, store: Arc<dyn Storage>, bans: Bans) -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_minute(1))
        .clock(clock.clone())
        .storage(store)
        .ban(Ban::after(3, MINUTE).lasting(MINUTE).up_to(4 * MINUTE))
        .on_event(move |event| {
            if let LimitEvent::Banned { ban, .. } = event {
                bans.0.lock().unwrap().push(*ban);
            }
        })
        .build()
}

#[derive(Clone, Default)]
struct Bans(Arc<Mutex<Vec<Duration>>>);

async fn reason(tiers: &RateTier, user: &str) -> Option<LimitReason> {
    tiers
        .check(user, "free", 1)
        .await
        .unwrap()
        .err()
        .map(|l| l.reason())
}

/// Spends `user`'s minute, then refuses them 3 times: banned.
async fn earn_a_ban(tiers: &RateTier, user: &str) {
    assert_eq!(reason(tiers, user).await, None);
    for _ in 0..3 {
        assert_eq!(reason(tiers, user).await, Some(LimitReason::RateLimited));
    }
}

#[tokio::test]
async fn a_ban_after_exactly_k_refusals_holds_on_every_instance_and_doubles() {
    let clock = FakeClock::at_us(1_000_000_000);
    let store: Arc<dyn Storage> =
        Arc::new(MemoryStorage::with_clock(clock.clone()));
    let bans = Bans::default();
    let (a, b) = (
        limiter(&clock, store.clone(), bans.clone()),
        limiter(&clock, store.clone(), bans.clone()),
    );
    // Two refusals are no ban; the third is.
    assert_eq!(reason(&a, "eva").await, None);
    for _ in 0..2 {
        assert_eq!(reason(&a, "eva").await, Some(LimitReason::RateLimited));
    }
    assert!(bans.0.lock().unwrap().is_empty());
    assert_eq!(reason(&b, "eva").await, Some(LimitReason::RateLimited));
    assert_eq!(*bans.0.lock().unwrap(), [MINUTE]);
    // Banned on both instances, whoever banned: b knew, a asks the store.
    for tiers in [&a, &b] {
        let refused = tiers.check("eva", "free", 1).await.unwrap().unwrap_err();
        assert_eq!(refused.reason(), LimitReason::Banned);
        assert_eq!(refused.retry_after_secs(), 60);
    }
    // Another customer is not.
    assert_eq!(reason(&a, "bea").await, None);

    // The ban ends; the tier has refilled too.
    clock.advance(MINUTE + Duration::from_secs(1));
    assert_eq!(reason(&a, "eva").await, None);
    // Three more refusals while the last ban is recent: twice as long.
    for _ in 0..3 {
        assert_eq!(reason(&a, "eva").await, Some(LimitReason::RateLimited));
    }
    assert_eq!(*bans.0.lock().unwrap(), [MINUTE, 2 * MINUTE]);
    let refused = b.check("eva", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(
        (refused.reason(), refused.retry_after_secs()),
        (LimitReason::Banned, 120)
    );
}

#[tokio::test]
async fn bans_double_up_to_the_longest() {
    let clock = FakeClock::at_us(1_000_000_000);
    let store: Arc<dyn Storage> =
        Arc::new(MemoryStorage::with_clock(clock.clone()));
    let bans = Bans::default();
    let tiers = limiter(&clock, store, bans.clone());
    for _ in 0..4 {
        earn_a_ban(&tiers, "ida").await;
        let last = *bans.0.lock().unwrap().last().unwrap();
        clock.advance(last + Duration::from_secs(1));
    }
    assert_eq!(
        *bans.0.lock().unwrap(),
        [MINUTE, 2 * MINUTE, 4 * MINUTE, 4 * MINUTE]
    );
}

#[tokio::test]
async fn a_reset_lifts_a_ban_here_and_in_the_store() {
    let clock = FakeClock::at_us(1_000_000_000);
    let store: Arc<dyn Storage> =
        Arc::new(MemoryStorage::with_clock(clock.clone()));
    let (a, b) = (
        limiter(&clock, store.clone(), Bans::default()),
        limiter(&clock, store.clone(), Bans::default()),
    );
    earn_a_ban(&a, "eva").await;
    assert_eq!(reason(&b, "eva").await, Some(LimitReason::Banned));
    a.reset("eva", &[]).await.unwrap();
    assert_eq!(reason(&a, "eva").await, None, "lifted where it was known");
    assert_eq!(
        reason(&b, "eva").await,
        Some(LimitReason::RateLimited),
        "and in the store"
    );
}

#[tokio::test]
async fn a_reset_through_another_instance_lifts_the_ban_on_the_one_that_gave_it()
 {
    let clock = FakeClock::at_us(1_000_000_000);
    let store: Arc<dyn Storage> =
        Arc::new(MemoryStorage::with_clock(clock.clone()));
    let (a, b) = (
        limiter(&clock, store.clone(), Bans::default()),
        limiter(&clock, store.clone(), Bans::default()),
    );
    earn_a_ban(&a, "eva").await;
    assert_eq!(reason(&a, "eva").await, Some(LimitReason::Banned));
    b.reset("eva", &[]).await.unwrap();
    // The ban is a state in the store: lifted there, lifted for both.
    assert_eq!(reason(&a, "eva").await, None, "lifted where it was given");
    assert_eq!(reason(&b, "eva").await, Some(LimitReason::RateLimited));
}

#[tokio::test]
async fn the_429_says_banned_and_when_it_ends() {
    let clock = FakeClock::at_us(1_000_000_000);
    let store: Arc<dyn Storage> =
        Arc::new(MemoryStorage::with_clock(clock.clone()));
    let tiers = limiter(&clock, store, Bans::default());
    let layer = TierLimitLayer::new(tiers).identifier_fn(|headers| {
        let key = headers.get("x-api-key")?.to_str().ok()?;
        Some(TierIdentity::new(key, "free"))
    });
    let app = Router::new()
        .route("/data", axum::routing::get(|| async { "ok\n" }))
        .layer(layer);
    assert_eq!(
        get_as(&app, Some("eva"), "/data").await.status,
        StatusCode::OK
    );
    for _ in 0..3 {
        let r = get_as(&app, Some("eva"), "/data").await;
        assert!(!r.body.contains("banned"), "{}", r.body);
    }
    let r = get_as(&app, Some("eva"), "/data").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.retry_after(), 60);
    assert!(r.body.contains(r#""banned":true"#), "{}", r.body);
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn banned_requests_are_counted_as_banned() {
    use tower_rate_tier::metrics::RateLimitMetrics;
    use tower_rate_tier::metrics::prometheus_client::encoding::text::encode;
    use tower_rate_tier::metrics::prometheus_client::registry::Registry;

    let mut registry = Registry::default();
    let metrics = RateLimitMetrics::new(&mut registry);
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1))
        .clock(FakeClock::at_us(1_000_000_000))
        .ban(Ban::after(3, MINUTE))
        .observe(metrics)
        .build();
    earn_a_ban(&tiers, "eva").await;
    for _ in 0..2 {
        assert_eq!(reason(&tiers, "eva").await, Some(LimitReason::Banned));
    }
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(
            r#"rate_tier_checks_total{tier="free",outcome="banned"} 2"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"rate_tier_checks_total{tier="free",outcome="limited"} 3"#
        ),
        "{text}"
    );
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn on_redis_a_ban_holds_on_a_second_instance_and_a_reset_lifts_it() {
    use rate_tier_test_support::{TEST_TIMEOUT, redis_url, unique};
    use tower_rate_tier::RedisStorage;
    async fn instance() -> RateTier {
        let conn = redis::Client::open(redis_url())
            .unwrap()
            .get_connection_manager()
            .await
            .expect(
                "TRT_REDIS_URL does not answer: is the test server running?",
            );
        RateTier::builder()
            .tier("free", Quota::per_minute(1))
            .storage(Arc::new(RedisStorage::new(conn).timeout(TEST_TIMEOUT)))
            .ban(Ban::after(3, MINUTE))
            .build()
    }
    let (a, b) = (instance().await, instance().await);
    let user = unique("eva");
    earn_a_ban(&a, &user).await;
    let refused = b.check(&user, "free", 1).await.unwrap().unwrap_err();
    assert_eq!(refused.reason(), LimitReason::Banned);
    assert!(
        (59..=60).contains(&refused.retry_after_secs()),
        "{refused:?}"
    );
    b.reset(&user, &[]).await.unwrap();
    assert_eq!(reason(&b, &user).await, None, "lifted in the store");
}

/// The memory store, whose settlements wait at a gate while it is closed:
/// a ban is made of a reset and then a settlement, so a request can be
/// dropped between the two.
#[derive(Debug)]
struct Gated {
    store: Arc<MemoryStorage>,
    closed: std::sync::atomic::AtomicBool,
    entered: tokio::sync::Notify,
    gate: tokio::sync::Notify,
    settled: tokio::sync::Notify,
}

impl Gated {
    fn new(store: Arc<MemoryStorage>) -> Self {
        Gated {
            store,
            closed: Default::default(),
            entered: Default::default(),
            gate: Default::default(),
            settled: Default::default(),
        }
    }

    fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn open(&self) {
        self.closed
            .store(false, std::sync::atomic::Ordering::SeqCst);
        self.gate.notify_one();
    }
}

impl Gated {
    async fn check_buckets(
        &self,
        checks: &[tower_rate_tier::storage::BucketCheck<'_>],
        out: &mut [tower_rate_tier::storage::Decision],
    ) -> Result<tower_rate_tier::storage::Decided, tower_rate_tier::StorageError>
    {
        self.store.check(checks, out).await
    }

    async fn settle_buckets(
        &self,
        settles: &[tower_rate_tier::storage::BucketSettle<'_>],
    ) -> Result<(), tower_rate_tier::StorageError> {
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            self.entered.notify_one();
            self.gate.notified().await;
        }
        let settled = self.store.settle(settles).await;
        self.settled.notify_one();
        settled
    }

    async fn reset_buckets(
        &self,
        buckets: &[tower_rate_tier::storage::BucketCheck<'_>],
    ) -> Result<(), tower_rate_tier::StorageError> {
        self.store.reset(buckets).await
    }

    fn decides(&self, kind: tower_rate_tier::rules::RuleKind) -> bool {
        self.store.supports(kind)
    }

    fn label(&self) -> &'static str {
        "gated"
    }
}

impl Storage for Gated {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        match mode {
            Mode::Check => Answer::pending(self.check_buckets(checks, out)),
            Mode::Reserve { .. } => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
        }
    }

    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        match adjustment {
            Adjustment::Settle(settles) => {
                Answer::pending(self.settle_buckets(settles))
            }
            Adjustment::Cancel(_) => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
            Adjustment::Release(_) => Answer::Ready(Err(
                StorageError::Unsupported("concurrency limits"),
            )),
            Adjustment::Renew(_) => Answer::Ready(Ok(())),
        }
    }

    fn reset<'a>(&'a self, buckets: &'a [BucketCheck<'a>]) -> Answer<'a, ()> {
        Answer::pending(self.reset_buckets(buckets))
    }

    fn capabilities(&self) -> Capabilities {
        let mut capabilities = Capabilities::new(self.label());
        for kind in [RuleKind::Window, RuleKind::Period, RuleKind::Concurrency]
        {
            if self.decides(kind) {
                capabilities = capabilities.with(kind);
            }
        }
        capabilities
    }
}

#[tokio::test]
async fn a_request_dropped_while_its_ban_is_made_still_bans() {
    let clock = FakeClock::at_us(1_000_000_000);
    let memory = Arc::new(MemoryStorage::with_clock(clock.clone()));
    let gated = Arc::new(Gated::new(memory.clone()));
    let a = limiter(&clock, gated.clone(), Bans::default());
    let b = limiter(&clock, memory, Bans::default());
    assert_eq!(reason(&a, "eva").await, None);
    for _ in 0..2 {
        assert_eq!(reason(&a, "eva").await, Some(LimitReason::RateLimited));
    }
    // The third refusal bans her: its request goes away once the ban's
    // buckets are reset and before its end is written.
    gated.close();
    let mut third = Box::pin(a.check("eva", "free", 1));
    tokio::select! {
        _ = &mut third => panic!("answered before the ban was made"),
        () = gated.entered.notified() => {}
    }
    drop(third);
    gated.open();
    // Bounded: without the fix the settlement never comes.
    tokio::time::timeout(Duration::from_secs(10), gated.settled.notified())
        .await
        .expect("the ban's end was never written: the dropped request cut it");
    // The ban was made whole: another instance, which asks the store, sees it.
    assert_eq!(reason(&b, "eva").await, Some(LimitReason::Banned));
}
