//! Incoming requests that wait for their slot instead of a 429
//! (`RateTierBuilder::wait_up_to`), on Tokio's paused clock (the memory
//! store reads it too): the waits, the refusal of a wait too long (which
//! charges nothing), the bound on waiting requests under a flood, a client
//! that goes away giving its slot back, and decisions that never wait.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use http::StatusCode;
use rate_tier_storage::{
    Answer, BucketCheck, Decided, Decision, Mode, StorageError,
};
use support::http::get_as;
use tokio::time::Instant;
use tower_rate_tier::clock::Clock;
use tower_rate_tier::{
    ConfigError, Limit, LimitEvent, Quota, RateTier, Storage, TierIdentity,
    TierLimitLayer, Window,
};

#[derive(Debug)]
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now_us(&self) -> u64 {
        1_000_000_000 + self.0.elapsed().as_micros() as u64
    }
}

/// Free: 10 a second, evenly (one every 100 ms); waits up to `max_wait`.
fn limiter(max_wait: Duration, max_waiting: usize) -> (RateTier, Events) {
    let events = Events::default();
    let sink = events.clone();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_second(10).allow_burst(1))
        .clock(TokioClock(Instant::now()))
        .wait_up_to(max_wait)
        .max_waiting(max_waiting)
        .on_event(move |event| sink.0.lock().unwrap().push(event.clone()))
        .build();
    (tiers, events)
}

#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<LimitEvent>>>);

impl Events {
    fn count(&self, matches: impl Fn(&LimitEvent) -> bool) -> usize {
        self.0.lock().unwrap().iter().filter(|e| matches(e)).count()
    }
}

fn app(tiers: RateTier) -> Router {
    let layer = TierLimitLayer::new(tiers)
        .identifier_fn(|headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, "free"))
        })
        .limit(
            Limit::new(
                "login",
                Window::new(2, Duration::from_secs(60)).unwrap(),
            )
            .when(|req| req.uri.path() == "/login"),
        );
    Router::new()
        .route("/data", axum::routing::get(|| async { "ok\n" }))
        .route("/login", axum::routing::get(|| async { "ok\n" }))
        .layer(layer)
}

#[tokio::test(start_paused = true)]
async fn a_short_burst_is_delayed_and_served_a_long_one_refused() {
    let (tiers, events) = limiter(Duration::from_millis(300), 16);
    let start = Instant::now();
    let mut passed = Vec::new();
    for _ in 0..4 {
        let info = tiers.check("ana", "free", 1).await.unwrap().unwrap();
        passed.push((start.elapsed().as_millis(), info.remaining));
    }
    // One every 100 ms, each served once its slot came.
    assert_eq!(passed, [(0, 0), (100, 0), (200, 0), (300, 0)]);
    assert_eq!(events.count(|e| matches!(e, LimitEvent::Waited { .. })), 3);

    // Three at once now: waits of 100, 200 ms; the third would wait
    // 300 ms... then 400: refused at once, charging nothing.
    let at = Instant::now();
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let tiers = tiers.clone();
            tokio::spawn(async move {
                let outcome = tiers.check("ana", "free", 1).await.unwrap();
                (outcome.is_ok(), at.elapsed().as_millis())
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for call in calls {
        outcomes.push(call.await.unwrap());
    }
    outcomes.sort();
    assert_eq!(
        outcomes,
        [(false, 0), (true, 100), (true, 200), (true, 300)],
        "the slots at 100, 200 and 300 ms; the fourth refused at once"
    );
    assert_eq!(
        events.count(|e| matches!(e, LimitEvent::WaitRefused { .. })),
        1
    );
    // The refusal took nothing: the next slot is right after the last.
    let info = tiers.check("ana", "free", 1).await.unwrap().unwrap();
    assert_eq!((at.elapsed().as_millis(), info.remaining), (400, 0));
}

#[tokio::test(start_paused = true)]
async fn over_http_a_waited_request_gets_its_headers_and_a_refused_one_429() {
    let (tiers, _) = limiter(Duration::from_millis(150), 16);
    let app = app(tiers);
    let start = Instant::now();
    let first = get_as(&app, Some("key_ana"), "/data").await;
    let second = get_as(&app, Some("key_ana"), "/data").await;
    assert_eq!(
        (first.status, second.status),
        (StatusCode::OK, StatusCode::OK)
    );
    assert_eq!(start.elapsed(), Duration::from_millis(100));
    assert_eq!((second.limit(), second.remaining()), (1, 0));
    // Now the next slot is 100 ms away, and the one after 200 ms: two at
    // once, the second waits too long.
    let (a, b) = tokio::join!(
        get_as(&app, Some("key_ana"), "/data"),
        get_as(&app, Some("key_ana"), "/data")
    );
    let mut statuses = [a.status, b.status];
    statuses.sort();
    assert_eq!(statuses, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
    let refused = if a.status == StatusCode::OK { b } else { a };
    assert_eq!(refused.retry_after(), 1, "a whole second, rounded up");
}

#[tokio::test(start_paused = true)]
async fn a_decision_with_a_window_never_waits() {
    let (tiers, events) = limiter(Duration::from_secs(5), 16);
    let app = app(tiers);
    let start = Instant::now();
    assert_eq!(
        get_as(&app, Some("bea"), "/login").await.status,
        StatusCode::OK
    );
    // The tier would have made it wait 100 ms: with a window in the
    // decision it is checked, and refused.
    let r = get_as(&app, Some("bea"), "/login").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(events.count(|e| matches!(e, LimitEvent::Waited { .. })), 0);
}

#[tokio::test(start_paused = true)]
async fn a_flood_waits_no_more_than_the_bound_and_the_rest_is_refused() {
    let (tiers, events) = limiter(Duration::from_secs(10), 3);
    let app = app(tiers);
    // The first passes at once; of the 19 that would wait, 3 do.
    let start = Instant::now();
    let requests: Vec<_> = (0..20)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(
                async move { get_as(&app, Some("eva"), "/data").await },
            )
        })
        .collect();
    let mut ok = 0;
    let mut refused = 0;
    for request in requests {
        match request.await.unwrap().status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("{other}"),
        }
    }
    assert_eq!((ok, refused), (4, 16));
    assert_eq!(events.count(|e| matches!(e, LimitEvent::Waited { .. })), 3);
    assert_eq!(
        events.count(|e| matches!(e, LimitEvent::WaitRefused { .. })),
        16
    );
    assert_eq!(start.elapsed(), Duration::from_millis(300));
}

#[tokio::test(start_paused = true)]
async fn a_client_that_goes_away_while_waiting_gives_its_slot_back() {
    let (tiers, _) = limiter(Duration::from_secs(1), 16);
    let app = app(tiers);
    assert_eq!(
        get_as(&app, Some("ida"), "/data").await.status,
        StatusCode::OK
    );
    let waiting = {
        let app = app.clone();
        tokio::spawn(async move { get_as(&app, Some("ida"), "/data").await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    // Its slot, at 100 ms, is the next request's: 50 ms from now.
    let at = Instant::now();
    assert_eq!(
        get_as(&app, Some("ida"), "/data").await.status,
        StatusCode::OK
    );
    assert_eq!(at.elapsed(), Duration::from_millis(50));
}

#[test]
fn waiting_needs_a_store_that_reserves() {
    #[derive(Debug)]
    struct Plain;
    impl Plain {
        async fn check_buckets(
            &self,
            _: &[tower_rate_tier::storage::BucketCheck<'_>],
            _: &mut [tower_rate_tier::storage::Decision],
        ) -> Result<
            tower_rate_tier::storage::Decided,
            tower_rate_tier::StorageError,
        > {
            unreachable!("never asked")
        }
    }

    impl Storage for Plain {
        fn decide<'a>(
            &'a self,
            checks: &'a [BucketCheck<'a>],
            mode: Mode,
            out: &'a mut [Decision],
        ) -> Answer<'a, Decided> {
            match mode {
                Mode::Check => Answer::pending(self.check_buckets(checks, out)),
                Mode::Reserve { .. } => Answer::Ready(Err(
                    StorageError::Unsupported("reservations"),
                )),
            }
        }
    }
    let error = RateTier::builder()
        .tier("free", Quota::per_second(10))
        .storage(Arc::new(Plain))
        .wait_up_to(Duration::from_millis(100))
        .try_build()
        .unwrap_err();
    assert_eq!(error, ConfigError::CannotWait { store: "custom" });
}

#[cfg(feature = "metrics")]
#[tokio::test(start_paused = true)]
async fn metrics_count_the_waits_and_the_refusals() {
    use tower_rate_tier::metrics::RateLimitMetrics;
    use tower_rate_tier::metrics::prometheus_client::encoding::text::encode;
    use tower_rate_tier::metrics::prometheus_client::registry::Registry;

    let mut registry = Registry::default();
    let metrics = RateLimitMetrics::new(&mut registry);
    let tiers = RateTier::builder()
        .tier("free", Quota::per_second(10).allow_burst(1))
        .clock(TokioClock(Instant::now()))
        .wait_up_to(Duration::from_millis(150))
        .observe(metrics)
        .build();
    let app = app(tiers);
    for _ in 0..2 {
        assert_eq!(
            get_as(&app, Some("ana"), "/data").await.status,
            StatusCode::OK
        );
    }
    let (_, _) = tokio::join!(
        get_as(&app, Some("ana"), "/data"),
        get_as(&app, Some("ana"), "/data")
    );
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(r#"rate_tier_waits_total{tier="free"} 2"#),
        "{text}"
    );
    assert!(text.contains("rate_tier_wait_seconds_count 2"), "{text}");
    assert!(text.contains("rate_tier_wait_seconds_sum 0.2"), "{text}");
    assert!(
        text.contains(r#"rate_tier_wait_refused_total{tier="free"} 1"#),
        "{text}"
    );
}

fn of(limit: &Limit) -> tower_rate_tier::LimitRequest<'_> {
    tower_rate_tier::LimitRequest::new("ana", "free", 1).limit(limit, 1)
}

#[tokio::test(start_paused = true)]
async fn a_limit_shortens_the_wait_of_the_requests_it_is_part_of() {
    let (tiers, events) = limiter(Duration::from_millis(500), 16);
    let roomy = Quota::per_second(1000);
    let never = Limit::new("search", roomy).wait_up_to(Duration::ZERO);
    let short =
        Limit::new("export", roomy).wait_up_to(Duration::from_millis(150));
    let watched = Limit::new("watch", roomy)
        .wait_up_to(Duration::ZERO)
        .shadow();
    let start = Instant::now();
    tiers.check("ana", "free", 1).await.unwrap().unwrap();
    // The tier's slot is 100 ms away: a search may not wait, refused now.
    let refused = tiers.decide(&of(&never)).await.unwrap().unwrap_err();
    assert_eq!(
        (refused.limit_name(), start.elapsed().as_millis()),
        ("free", 0)
    );
    // An export may wait 150 ms: it waits its 100.
    tiers.decide(&of(&short)).await.unwrap().unwrap();
    assert_eq!(start.elapsed().as_millis(), 100);
    // Two more are queued by the tier (slots at 200 and 300 ms): the next
    // export's slot is 200 ms away, past its 150, refused at once; a
    // plain request may wait up to the limiter's 500 ms.
    let plain = tiers.clone();
    let waiting =
        tokio::spawn(async move { plain.check("ana", "free", 1).await });
    tokio::task::yield_now().await;
    let refused = tiers.decide(&of(&short)).await.unwrap().unwrap_err();
    assert_eq!(refused.retry_after_secs(), 1);
    assert_eq!(start.elapsed().as_millis(), 100, "refused without waiting");
    waiting.await.unwrap().unwrap().unwrap();
    assert_eq!(start.elapsed().as_millis(), 200);
    // A shadow limit never refuses, so its wait shortens nothing.
    tiers.decide(&of(&watched)).await.unwrap().unwrap();
    assert_eq!(start.elapsed().as_millis(), 300);
    assert_eq!(events.count(|e| matches!(e, LimitEvent::Waited { .. })), 3);
    // Refused without waiting is not a wait refused: one for the export
    // (its slot was past its wait), none for the search (it may not wait).
    assert_eq!(
        events.count(|e| matches!(e, LimitEvent::WaitRefused { .. })),
        1
    );
}
