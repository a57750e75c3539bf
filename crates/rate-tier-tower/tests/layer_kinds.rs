//! Limits of the kinds beside the rate through the HTTP layer, on a fake
//! clock: an exact window (`login`, 5 in any 60 s) and a calendar period
//! (`exports`, 3 a month on free, 100 on pro), mixed with the tier's rate
//! in one decision; what the client is told; and the kinds a store cannot
//! decide refused when the layer is built.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use http::StatusCode;
use rate_tier_storage::{
    Adjustment, Answer, BucketCheck, Capabilities, Decided, Decision, Mode,
    StorageExt,
};
use support::fixtures::{START_US, plan_of, post_plans};
use support::http::get_as;
use support::stores::Narrow;
use tokio::sync::{Semaphore, mpsc};
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::layer::HeaderStyle;
use tower_rate_tier::{
    Concurrency, ConfigError, Limit, Period, PeriodUnit, Quota, RateTier,
    Settle, Storage, StorageError, TierIdentity, TierLimitLayer, Window,
    rules::RuleKind,
};

const SECOND: u64 = 1_000_000;

fn login() -> Limit {
    Limit::new("login", Window::new(5, Duration::from_secs(60)).unwrap())
        .when(|req| req.uri.path() == "/login")
}

fn exports() -> Limit {
    let month = |n| Period::new(n, PeriodUnit::Month, 0).unwrap();
    Limit::new("exports", month(3))
        .tier("pro", month(100))
        .when(|req| req.uri.path() == "/export")
}

fn layer(tiers: RateTier) -> TierLimitLayer {
    TierLimitLayer::new(tiers)
        .identifier_fn(|headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, plan_of(key)?))
        })
        .limit(login())
        .limit(exports())
        .headers(HeaderStyle::Both)
}

fn app_at(now_us: u64) -> (Router, FakeClock, RateTier) {
    let clock = FakeClock::at_us(now_us);
    let tiers = post_plans(&clock).build();
    let ok = || axum::routing::get(|| async { "ok\n" });
    let app = Router::new()
        .route("/login", ok())
        .route("/export", ok())
        .route("/data", ok())
        .layer(layer(tiers.clone()));
    (app, clock, tiers)
}

#[tokio::test]
async fn a_window_refuses_the_sixth_in_any_60_s_until_the_first_leaves() {
    let (app, clock, tiers) = app_at(START_US);
    // Logins at 0, 1, 2, 3 and 4 s.
    for left in (0..5).rev() {
        let r = get_as(&app, Some("key_ana"), "/login").await;
        assert_eq!((r.status, r.remaining()), (StatusCode::OK, left));
        assert_eq!(r.limit(), 5);
        clock.advance(Duration::from_secs(1));
    }
    // At 5 s: the first leaves the window at 60 s.
    let r = get_as(&app, Some("key_ana"), "/login").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert_eq!(r.retry_after(), 55);
    assert_eq!(
        r.body,
        r#"{"error":"rate limit exceeded","tier":"free","limit":"login","retry_after":55}"#
    );
    let policy = r.header("ratelimit-policy").unwrap();
    assert!(policy.contains(r#""login";q=5;w=60"#), "{policy}");
    // The reset told is the retry's instant, when the first login (at
    // 0 s) leaves, not when the window is empty (its newest, at 64 s).
    assert_eq!(
        r.header("x-ratelimit-reset"),
        Some(&*(START_US + 60 * SECOND).div_ceil(SECOND).to_string())
    );
    // The refusal charged the tier nothing: 5 of its 10 were spent.
    assert_eq!(tiers.peek("key_ana", "free").await.unwrap().remaining, 5);

    // A microsecond before the first leaves: still refused; at 60 s, one.
    clock.set_us(START_US + 60 * SECOND - 1);
    let r = get_as(&app, Some("key_ana"), "/login").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    clock.set_us(START_US + 60 * SECOND);
    let r = get_as(&app, Some("key_ana"), "/login").await;
    assert_eq!((r.status, r.remaining()), (StatusCode::OK, 0));
    let r = get_as(&app, Some("key_ana"), "/login").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // Until the login of 1 s leaves, at 61 s.
    assert_eq!(r.retry_after(), 1);
}

#[tokio::test]
async fn a_plan_refusal_counts_nothing_in_the_window() {
    let (app, clock, _tiers) = app_at(START_US);
    // The tier's 10 spent elsewhere.
    for _ in 0..10 {
        assert_eq!(
            get_as(&app, Some("key_ana"), "/data").await.status,
            StatusCode::OK
        );
    }
    for _ in 0..20 {
        let r = get_as(&app, Some("key_ana"), "/login").await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(!r.body.contains("login"), "the plan refused: {r:?}");
    }
    // Six seconds later the tier has one more: the window is untouched.
    clock.advance(Duration::from_secs(6));
    let r = get_as(&app, Some("key_ana"), "/login").await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let login_left = r
        .header("ratelimit")
        .map(|v| v.contains(r#""login";r=4"#))
        .unwrap_or(false);
    assert!(login_left, "{r:?}");
}

/// 2028-02-28 12:00 UTC (2028 is a leap year).
const FEB_28_2028_NOON: u64 = 1_835_352_000 * SECOND;
const DAY: u64 = 86_400 * SECOND;

#[tokio::test]
async fn a_period_passes_exactly_its_limit_per_calendar_month_then_resets_on_the_first()
 {
    let (app, clock, _tiers) = app_at(FEB_28_2028_NOON);
    for left in (0..3).rev() {
        let r = get_as(&app, Some("key_ana"), "/export").await;
        assert_eq!((r.status, r.remaining()), (StatusCode::OK, left));
    }
    // Refused until March 1st 00:00 UTC: a day and a half, February 29th
    // included.
    let r = get_as(&app, Some("key_ana"), "/export").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    let march_1 = FEB_28_2028_NOON + DAY + DAY / 2;
    assert_eq!(r.retry_after(), (march_1 - FEB_28_2028_NOON) / SECOND);
    assert_eq!(
        r.header("x-ratelimit-reset"),
        Some(&*(march_1 / SECOND).to_string())
    );
    // The policy's window is February 2028: 29 days.
    let policy = r.header("ratelimit-policy").unwrap();
    assert!(
        policy.contains(&format!(r#""exports";q=3;w={}"#, 29 * DAY / SECOND)),
        "{policy}"
    );
    clock.set_us(march_1 - 1);
    let r = get_as(&app, Some("key_ana"), "/export").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    clock.set_us(march_1);
    for left in (0..3).rev() {
        let r = get_as(&app, Some("key_ana"), "/export").await;
        assert_eq!((r.status, r.remaining()), (StatusCode::OK, left));
    }
    // Pro exports 100 a month.
    for _ in 0..100 {
        assert_eq!(
            get_as(&app, Some("key_bea"), "/export").await.status,
            StatusCode::OK
        );
        clock.advance(Duration::from_secs(1));
    }
    let r = get_as(&app, Some("key_bea"), "/export").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.body.contains(r#""limit":"exports""#), "{r:?}");
}

#[test]
fn a_kind_the_store_cannot_decide_or_a_settled_window_is_refused_at_build() {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .storage(std::sync::Arc::new(Narrow::rates_only()))
        .build();
    let error = TierLimitLayer::new(tiers.clone())
        .try_limit(exports())
        .unwrap_err();
    assert_eq!(
        error,
        ConfigError::UnsupportedKind {
            limit: "exports".into(),
            kind: RuleKind::Period,
            store: "rates-only",
        }
    );
    assert_eq!(
        error.to_string(),
        r#"limit "exports" is a period, which the rates-only store does not decide"#
    );
    // A kind of one tier only is found too.
    let pro_window = Limit::new("search", Quota::per_minute(3))
        .tier("pro", Window::new(3, Duration::from_secs(60)).unwrap());
    assert!(matches!(
        TierLimitLayer::new(tiers.clone()).try_limit(pro_window),
        Err(ConfigError::UnsupportedKind {
            kind: RuleKind::Window,
            ..
        })
    ));
    // Rates stay welcome.
    assert!(
        TierLimitLayer::new(tiers)
            .try_limit(Limit::new("search", Quota::per_minute(3)))
            .is_ok()
    );

    let memory = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .build();
    let settled = login().settle(Settle::from_header("x-used"));
    assert_eq!(
        TierLimitLayer::new(memory).try_limit(settled).unwrap_err(),
        ConfigError::SettleNeedsRate {
            limit: "login".into(),
            kind: RuleKind::Window,
        }
    );
}

#[tokio::test]
async fn a_plan_may_be_a_monthly_quota_and_a_reload_to_another_kind_starts_fresh()
 {
    let clock = FakeClock::at_us(FEB_28_2028_NOON);
    let monthly = Period::new(3, PeriodUnit::Month, 0).unwrap();
    let tiers = RateTier::builder()
        .clock(clock.clone())
        .tier("hobby", monthly)
        .build();
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = heard.clone();
    let _listening =
        tiers.subscribe(move |e| sink.lock().unwrap().push(e.clone()));
    for left in (0..3).rev() {
        let info = tiers.check("ana", "hobby", 1).await.unwrap().unwrap();
        assert_eq!((info.limit, info.remaining), (3, left));
        assert_eq!(info.window, Duration::from_secs(29 * 86_400));
    }
    let refused = tiers.check("ana", "hobby", 1).await.unwrap().unwrap_err();
    let march_1 = FEB_28_2028_NOON + DAY + DAY / 2;
    assert_eq!(
        refused.retry_after(),
        Duration::from_micros(march_1 - FEB_28_2028_NOON)
    );

    // Hobby becomes 2 a minute: a rate, fresh (nothing of the period is
    // read as a TAT), and the reload says so.
    tiers
        .try_reload(
            tower_rate_tier::Tiers::builder()
                .tier("hobby", Quota::per_minute(2))
                .build()
                .unwrap(),
        )
        .unwrap();
    let info = tiers.check("ana", "hobby", 1).await.unwrap().unwrap();
    assert_eq!((info.limit, info.remaining), (2, 1));
    assert!(heard.lock().unwrap().iter().any(|e| matches!(
        e,
        tower_rate_tier::LimitEvent::TiersReloaded { fresh, .. } if fresh == &["hobby"]
    )));
}

#[tokio::test]
async fn a_store_that_decides_only_rates_refuses_a_plan_of_another_kind() {
    let period = Period::new(3, PeriodUnit::Month, 0).unwrap();
    let store = || std::sync::Arc::new(Narrow::rates_only());
    let error = RateTier::builder()
        .tier("hobby", period)
        .storage(store())
        .try_build()
        .unwrap_err();
    assert_eq!(
        error,
        ConfigError::UnsupportedKind {
            limit: "hobby".into(),
            kind: RuleKind::Period,
            store: "rates-only",
        }
    );
    // A reload to it is refused, reported, and the running tiers stay.
    let tiers = RateTier::builder()
        .tier("hobby", Quota::per_minute(10))
        .storage(store())
        .build();
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = heard.clone();
    let _listening =
        tiers.subscribe(move |e| sink.lock().unwrap().push(e.clone()));
    tiers.reload(
        tower_rate_tier::Tiers::builder()
            .tier("hobby", period)
            .build()
            .unwrap(),
    );
    assert_eq!(tiers.quota("hobby"), Some(Quota::per_minute(10)));
    assert!(matches!(
        &heard.lock().unwrap()[..],
        [tower_rate_tier::LimitEvent::TiersRefused {
            error: ConfigError::UnsupportedKind { .. }
        }]
    ));
}

#[tokio::test]
async fn a_handler_that_keeps_its_info_keeps_no_slot() {
    let clock = FakeClock::at_us(START_US);
    let tiers = post_plans(&clock).build();
    let uploads = Limit::new("uploads", Concurrency::new(1).unwrap());
    let kept = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = kept.clone();
    let app = Router::new()
        .route(
            "/upload",
            axum::routing::get(
                move |axum::Extension(info): axum::Extension<
                    tower_rate_tier::RateLimitInfo,
                >| {
                    let keep = keep.clone();
                    async move {
                        keep.lock().unwrap().push(info);
                        "uploaded\n"
                    }
                },
            ),
        )
        .layer(keyed_layer(tiers, uploads));
    // One slot: each body read to its end gives it back, whatever the
    // handler kept.
    for _ in 0..3 {
        let r = get_as(&app, Some("key_ana"), "/upload").await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
    }
    assert_eq!(kept.lock().unwrap().len(), 3);
}

/// The layer of the upload apps: the user and tier from `x-api-key`.
fn keyed_layer(tiers: RateTier, uploads: Limit) -> TierLimitLayer {
    TierLimitLayer::new(tiers)
        .identifier_fn(|headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, plan_of(key)?))
        })
        .limit(uploads)
}

/// An app whose `/upload` (2 in flight per user on free, 10 on pro) says
/// when a request entered its handler, and answers once `gate` lets it.
fn upload_app(
    gate: Arc<Semaphore>,
    entered: mpsc::UnboundedSender<()>,
) -> Router {
    let clock = FakeClock::at_us(START_US);
    let tiers = post_plans(&clock).build();
    let uploads = Limit::new("uploads", Concurrency::new(2).unwrap())
        .tier("pro", Concurrency::new(10).unwrap())
        .when(|req| req.uri.path() == "/upload");
    Router::new()
        .route(
            "/upload",
            axum::routing::get(move || {
                let (gate, entered) = (gate.clone(), entered.clone());
                async move {
                    let _ = entered.send(());
                    // Each answer uses a permit up.
                    gate.acquire().await.unwrap().forget();
                    "uploaded\n"
                }
            }),
        )
        .route("/data", axum::routing::get(|| async { "ok\n" }))
        .layer(keyed_layer(tiers, uploads))
}

fn upload(
    app: &Router,
    key: &str,
) -> tokio::task::JoinHandle<http::Response<axum::body::Body>> {
    let request = http::Request::get("/upload")
        .header("x-api-key", key)
        .body(axum::body::Body::empty())
        .unwrap();
    let app = app.clone();
    tokio::spawn(async move {
        match app.oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    })
}

#[tokio::test]
async fn concurrency_holds_a_slot_until_the_body_ends_or_the_request_is_dropped()
 {
    let gate = Arc::new(Semaphore::new(0));
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let app = upload_app(gate.clone(), entered_tx);
    let refused = || async {
        let r = get_as(&app, Some("key_ana"), "/upload").await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
        assert_eq!(r.retry_after(), 1);
        // The reset told is the retry's instant (the clock stands still).
        let retry_at = (START_US + SECOND).div_ceil(SECOND).to_string();
        assert_eq!(r.header("x-ratelimit-reset"), Some(&*retry_at), "{r:?}");
        assert!(r.body.contains(r#""limit":"uploads""#), "{r:?}");
    };

    // Two in flight: a third is refused before any handler runs.
    let (first, second) = (upload(&app, "key_ana"), upload(&app, "key_ana"));
    entered.recv().await.unwrap();
    entered.recv().await.unwrap();
    refused().await;
    // Bea's slots are her own.
    let bea = upload(&app, "key_bea");
    entered.recv().await.unwrap();

    // Both answered, their bodies not read: the slots are still held.
    gate.add_permits(3);
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(first.status(), StatusCode::OK);
    refused().await;
    // One body read to its end: its slot is back.
    let _ = support::http::read(first).await;
    let third = upload(&app, "key_ana");
    entered.recv().await.unwrap();
    refused().await;
    // A body dropped unread gives its slot back too.
    drop(second);
    let fourth = upload(&app, "key_ana");
    entered.recv().await.unwrap();
    refused().await;
    // A request dropped while its handler runs (the client went away):
    // its slot is back.
    fourth.abort();
    assert!(fourth.await.unwrap_err().is_cancelled());
    let fifth = upload(&app, "key_ana");
    entered.recv().await.unwrap();
    refused().await;

    gate.add_permits(10);
    for handle in [third, fifth, bea] {
        let _ = support::http::read(handle.await.unwrap()).await;
    }
}

#[tokio::test]
async fn a_refusal_by_the_plan_takes_no_slot() {
    let gate = Arc::new(Semaphore::new(100));
    let (entered_tx, _entered) = mpsc::unbounded_channel();
    let app = upload_app(gate, entered_tx);
    // The tier's 10 spent.
    for _ in 0..10 {
        assert_eq!(
            get_as(&app, Some("key_ana"), "/data").await.status,
            StatusCode::OK
        );
    }
    for _ in 0..5 {
        let r = get_as(&app, Some("key_ana"), "/upload").await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(!r.body.contains("uploads"), "the plan refused: {r:?}");
    }
    // Had they taken slots, uploads would refuse the next ones.
    let pro = get_as(&app, Some("key_bea"), "/upload").await;
    assert_eq!(pro.status, StatusCode::OK);
}

#[tokio::test]
async fn a_gcra_burst_of_5_lets_a_sixth_login_through_after_12_s_a_window_does_not()
 {
    let clock = FakeClock::at_us(START_US);
    let tiers = post_plans(&clock).build();
    let rate = Limit::new("rate", Quota::per_minute(5));
    let window =
        Limit::new("window", Window::new(5, Duration::from_secs(60)).unwrap());
    for limit in [&rate, &window] {
        for _ in 0..5 {
            let request = tower_rate_tier::LimitRequest::new("bea", "pro", 1)
                .limit(limit, 1);
            assert!(tiers.decide(&request).await.unwrap().is_ok());
        }
    }
    clock.advance(Duration::from_secs(12));
    let sixth = |limit| {
        tower_rate_tier::LimitRequest::new("bea", "pro", 1).limit(limit, 1)
    };
    assert!(tiers.decide(&sixth(&rate)).await.unwrap().is_ok());
    let refused = tiers.decide(&sixth(&window)).await.unwrap().unwrap_err();
    assert_eq!(refused.retry_after(), Duration::from_secs(48));
}

#[tokio::test]
async fn a_concurrency_limit_has_no_policy_window() {
    let clock = FakeClock::at_us(START_US);
    let tiers = post_plans(&clock).build();
    let app = Router::new()
        .route("/upload", axum::routing::get(|| async { "ok\n" }))
        .layer(
            TierLimitLayer::new(tiers)
                .identifier_fn(|_| Some(TierIdentity::new("bea", "pro")))
                .limit(Limit::new("uploads", Concurrency::new(10).unwrap()))
                .headers(HeaderStyle::Both),
        );
    let r = get_as(&app, None, "/upload").await;
    assert_eq!(r.status, StatusCode::OK);
    // The most constraining limit: uploads, 9 of 10 left.
    assert_eq!((r.limit(), r.remaining()), (10, 9), "{r:?}");
    assert_eq!(
        r.header("ratelimit-policy"),
        Some(r#""pro";q=100;w=60, "uploads";q=10"#),
        "{r:?}"
    );
}

#[tokio::test]
async fn only_a_rate_is_settled() {
    let clock = FakeClock::at_us(START_US);
    let tiers = post_plans(&clock).build();
    // Declared settled (a layer refuses to be built with it), settled by
    // hand: refused, as a window has no debt.
    let login =
        login().settle(tower_rate_tier::Settle::from_header("x-tokens-used"));
    let request =
        tower_rate_tier::LimitRequest::new("ana", "free", 1).limit(&login, 1);
    let info = tiers.decide(&request).await.unwrap().unwrap();
    let error = tiers
        .settle(
            "ana",
            &info,
            &login,
            tower_rate_tier::rules::Adjust::Refund(1),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            tower_rate_tier::Error::Storage(StorageError::Unsupported(_))
        ),
        "{error}"
    );
    // Nothing was given back: after the second login, 3 left.
    let again = tiers.decide(&request).await.unwrap().unwrap();
    let left = again
        .limits()
        .find(|l| l.name == "login")
        .unwrap()
        .remaining;
    assert_eq!(left, 3);
}

/// A memory store that leases its slots for 30 ms, counting renewals and
/// releases (and the lease ids they carry).
#[derive(Debug, Default)]
struct Leasing {
    memory: tower_rate_tier::MemoryStorage,
    renewed: std::sync::Mutex<Vec<u64>>,
    released: std::sync::Mutex<Vec<u64>>,
}

impl Leasing {
    async fn check_buckets(
        &self,
        checks: &[tower_rate_tier::storage::BucketCheck<'_>],
        out: &mut [tower_rate_tier::storage::Decision],
    ) -> Result<tower_rate_tier::storage::Decided, StorageError> {
        self.memory.check(checks, out).await
    }

    async fn settle_buckets(
        &self,
        settles: &[tower_rate_tier::storage::BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        self.memory.settle(settles).await
    }

    fn decides(&self, _kind: RuleKind) -> bool {
        true
    }

    fn slot_lease(&self) -> Option<Duration> {
        Some(Duration::from_millis(30))
    }

    async fn renew_slots(
        &self,
        slots: &[tower_rate_tier::storage::BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        self.renewed
            .lock()
            .unwrap()
            .extend(slots.iter().map(|s| s.lease()));
        Ok(())
    }

    async fn release_slots(
        &self,
        slots: &[tower_rate_tier::storage::BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        self.released
            .lock()
            .unwrap()
            .extend(slots.iter().map(|s| s.lease()));
        self.memory.release(slots).await
    }
}

impl Storage for Leasing {
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
            Adjustment::Release(slots) => {
                Answer::pending(self.release_slots(slots))
            }
            Adjustment::Renew(slots) => {
                Answer::pending(self.renew_slots(slots))
            }
        }
    }

    fn capabilities(&self) -> Capabilities {
        let mut capabilities = Capabilities::new("custom");
        for kind in [RuleKind::Window, RuleKind::Period, RuleKind::Concurrency]
        {
            if self.decides(kind) {
                capabilities = capabilities.with(kind);
            }
        }
        capabilities.lease = self.slot_lease();
        capabilities
    }
}

#[tokio::test(start_paused = true)]
async fn leased_slots_are_renewed_while_held_and_released_with_their_id() {
    let store = Arc::new(Leasing::default());
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .storage(store.clone())
        .build();
    let uploads = Limit::new("uploads", Concurrency::new(1).unwrap());
    let request =
        tower_rate_tier::LimitRequest::new("ana", "free", 1).limit(&uploads, 1);
    let info = tiers.decide(&request).await.unwrap().unwrap();
    assert!(
        tiers.decide(&request).await.unwrap().is_err(),
        "one in flight"
    );
    // 100 ms held: renewed every 10 ms (a third of the lease).
    tokio::time::sleep(Duration::from_millis(105)).await;
    let renewed = store.renewed.lock().unwrap().clone();
    assert_eq!(renewed.len(), 10, "{renewed:?}");
    let id = renewed[0];
    assert!(id != 0 && renewed.iter().all(|&r| r == id), "{renewed:?}");
    // Dropped: released under the same id, and renewed no more.
    drop(info);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(*store.released.lock().unwrap(), [id]);
    assert_eq!(store.renewed.lock().unwrap().len(), 10);
    let again = tiers.decide(&request).await.unwrap().unwrap();
    // Another request, another id.
    drop(again);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let released = store.released.lock().unwrap().clone();
    assert_eq!(released.len(), 2);
    assert_ne!(released[1], id);
}
