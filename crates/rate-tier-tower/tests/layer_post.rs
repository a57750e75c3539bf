//! Every scenario of the 0.3 example server (`examples/post_server.rs`),
//! through the real layer, with its
//! server configuration (free 10/min, pro 100/min, default free, 401 without
//! a key, cost 5 for /report and 50 for /backup) on a fake clock: no sleep.
//!
//! Most tests go through an axum `Router` with `tower::ServiceExt::oneshot`;
//! the last ones wrap a plain `tower::service_fn` (a `Full<Bytes>` body and a
//! `String` body) to show the layer needs no axum.
#![allow(clippy::unwrap_used)]

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use support::fixtures::{START_US, plan_of, post_plans};
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    LimitEvent, MemoryStorage, RateTier, TierIdentity, TierLimitLayer,
    policy::OnUnknownTier,
};

type Events = Arc<Mutex<Vec<LimitEvent>>>;

/// The 0.3 example's layer, on `clock`, reporting into `events`.
fn post_layer(tiers: RateTier, events: &Events) -> TierLimitLayer {
    let sink = events.clone();
    TierLimitLayer::new(tiers)
        .identifier_fn(|headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, plan_of(key)?))
        })
        .cost_fn(|req| match req.uri.path() {
            "/report" => 5,
            "/backup" => 50,
            _ => 1,
        })
        .on_event(move |event| sink.lock().unwrap().push(event.clone()))
}

/// The 0.3 example's service: the three routes, each counting its calls.
struct Post {
    app: Router,
    clock: FakeClock,
    events: Events,
    calls: Arc<AtomicUsize>,
}

fn routes(calls: &Arc<AtomicUsize>) -> Router {
    let (c1, c2, c3) = (calls.clone(), calls.clone(), calls.clone());
    Router::new()
        .route(
            "/data",
            get(move || async move {
                c1.fetch_add(1, Ordering::SeqCst);
                "data\n"
            }),
        )
        .route(
            "/report",
            get(move || async move {
                c2.fetch_add(1, Ordering::SeqCst);
                "report\n"
            }),
        )
        .route(
            "/backup",
            get(move || async move {
                c3.fetch_add(1, Ordering::SeqCst);
                "backup\n"
            }),
        )
}

fn post() -> Post {
    let clock = FakeClock::at_us(START_US);
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let app =
        routes(&calls).layer(post_layer(post_plans(&clock).build(), &events));
    Post {
        app,
        clock,
        events,
        calls,
    }
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    fn remaining(&self) -> u64 {
        self.header("x-ratelimit-remaining")
            .unwrap()
            .parse()
            .unwrap()
    }
}

async fn get_path(app: &Router, key: Option<&str>, path: &str) -> Reply {
    let mut request = Request::builder().uri(path);
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

/// `x-ratelimit-reset` computed here, independently of the crate: the Unix
/// second, rounded up, at which the bucket is full again.
fn reset_secs(now_us: u64, full_in: Duration) -> u64 {
    let at = now_us + u64::try_from(full_in.as_micros()).unwrap();
    at / 1_000_000 + u64::from(!at.is_multiple_of(1_000_000))
}

fn events(post: &Post) -> Vec<LimitEvent> {
    post.events.lock().unwrap().clone()
}

#[tokio::test]
async fn ana_gets_ten_then_the_exact_429_of_the_post() {
    let p = post();
    for k in 1..=10u64 {
        let r = get_path(&p.app, Some("key_ana"), "/data").await;
        assert_eq!(r.status, StatusCode::OK, "request {k}");
        assert_eq!(r.body, "data\n");
        assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
        assert_eq!(r.remaining(), 10 - k, "request {k}");
        // After k requests the TAT is k * 6 s ahead.
        let reset = reset_secs(START_US, Duration::from_secs(6 * k));
        assert_eq!(r.header("x-ratelimit-reset"), Some(&*reset.to_string()));
        assert_eq!(r.header("retry-after"), None);
    }
    assert_eq!(p.calls.load(Ordering::SeqCst), 10);

    let r = get_path(&p.app, Some("key_ana"), "/data").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("retry-after"), Some("6"));
    assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    let reset = reset_secs(START_US, Duration::from_secs(60));
    assert_eq!(reset, 1_790_947_155, "the 0.3 example's x-ratelimit-reset");
    assert_eq!(r.header("x-ratelimit-reset"), Some("1790947155"));
    // The 0.3 example's content-length (axum adds it for a sized body).
    assert_eq!(r.header("content-length"), Some("61"));
    // Exactly these six headers: nothing else is added.
    assert_eq!(r.headers.len(), 6, "{:?}", r.headers);
    assert_eq!(
        r.body,
        r#"{"error":"rate limit exceeded","tier":"free","retry_after":6}"#
    );
    assert_eq!(r.body.len(), 61, "the 0.3 example's content-length");
    // The handler did not run for the refusal.
    assert_eq!(p.calls.load(Ordering::SeqCst), 10);

    assert_eq!(
        events(&p),
        vec![LimitEvent::Limited {
            user_id: "key_ana".into(),
            tier: "free",
            limit: "free",
            of: 10,
            cost: 1,
            retry_after: Duration::from_secs(6),
        }]
    );
}

#[tokio::test]
async fn reset_header_on_a_whole_second_start_is_exact() {
    // The brief's start time, on a whole second: no rounding to do.
    let clock = FakeClock::at_us(1_790_947_094_000_000);
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let app =
        routes(&calls).layer(post_layer(post_plans(&clock).build(), &events));
    let r = get_path(&app, Some("key_ana"), "/data").await;
    assert_eq!(r.header("x-ratelimit-reset"), Some("1790947100"));
    for _ in 0..9 {
        get_path(&app, Some("key_ana"), "/data").await;
    }
    let r = get_path(&app, Some("key_ana"), "/data").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("x-ratelimit-reset"), Some("1790947154"));
}

#[tokio::test]
async fn gcra_steps_of_the_post_through_http() {
    // The 0.3 example's transcript: (wait, requests) = (0, 11), (6, 2), (30, 6).
    let p = post();
    let mut lines = Vec::new();
    let mut t = 0;
    for (wait, count) in [(0, 11), (6, 2), (30, 6)] {
        p.clock.advance(Duration::from_secs(wait));
        t += wait;
        for _ in 0..count {
            let r = get_path(&p.app, Some("key_ana"), "/data").await;
            match r.status {
                StatusCode::OK => lines.push(format!(
                    "t={t:>2}s  200  remaining {}",
                    r.remaining()
                )),
                StatusCode::TOO_MANY_REQUESTS => lines.push(format!(
                    "t={t:>2}s  429  retry after {} s",
                    r.header("retry-after").unwrap()
                )),
                other => panic!("unexpected {other}"),
            }
        }
    }
    let expected = "\
t= 0s  200  remaining 9
t= 0s  200  remaining 8
t= 0s  200  remaining 7
t= 0s  200  remaining 6
t= 0s  200  remaining 5
t= 0s  200  remaining 4
t= 0s  200  remaining 3
t= 0s  200  remaining 2
t= 0s  200  remaining 1
t= 0s  200  remaining 0
t= 0s  429  retry after 6 s
t= 6s  200  remaining 0
t= 6s  429  retry after 6 s
t=36s  200  remaining 4
t=36s  200  remaining 3
t=36s  200  remaining 2
t=36s  200  remaining 1
t=36s  200  remaining 0
t=36s  429  retry after 6 s";
    assert_eq!(lines.join("\n"), expected);
    assert_eq!(p.calls.load(Ordering::SeqCst), 16);
}

#[tokio::test]
async fn after_waiting_retry_after_one_more_request_passes() {
    let p = post();
    for _ in 0..10 {
        assert_eq!(
            get_path(&p.app, Some("key_ana"), "/data").await.status,
            StatusCode::OK
        );
    }
    let refused = get_path(&p.app, Some("key_ana"), "/data").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    p.clock.advance(Duration::from_secs(wait));

    let r = get_path(&p.app, Some("key_ana"), "/data").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.remaining(), 0);
    let now = START_US + 6_000_000;
    assert_eq!(
        r.header("x-ratelimit-reset"),
        Some(&*reset_secs(now, Duration::from_secs(60)).to_string())
    );
    let r = get_path(&p.app, Some("key_ana"), "/data").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("6"));
}

#[tokio::test]
async fn two_instances_on_one_store_share_one_limit() {
    // The 0.3 example's two instances (ports 3000 and 3001) on one Redis: here two
    // separately built limiters and services on one shared store.
    let clock = FakeClock::at_us(START_US);
    let store = Arc::new(MemoryStorage::with_clock(clock.clone()));
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let instance = |events: &Events| {
        let tiers = post_plans(&clock).storage(store.clone()).build();
        routes(&calls).layer(post_layer(tiers, events))
    };
    let ports = [instance(&events), instance(&events)];
    let mut out = Vec::new();
    for i in 1..=11 {
        let port = 3000 + i % 2;
        let r = get_path(&ports[i % 2], Some("key_ana"), "/data").await;
        out.push(format!("{port} {}", r.status.as_u16()));
    }
    assert_eq!(
        out.join("\n"),
        "3001 200\n3000 200\n3001 200\n3000 200\n3001 200\n3000 200\n\
         3001 200\n3000 200\n3001 200\n3000 200\n3001 429"
    );
}

#[tokio::test]
async fn bea_pays_one_for_data_and_five_for_a_report() {
    let p = post();
    let data = get_path(&p.app, Some("key_bea"), "/data").await;
    assert_eq!(data.status, StatusCode::OK);
    assert_eq!(data.header("x-ratelimit-limit"), Some("100"));
    assert_eq!(data.remaining(), 99);
    let report = get_path(&p.app, Some("key_bea"), "/report").await;
    assert_eq!(report.status, StatusCode::OK);
    assert_eq!(report.body, "report\n");
    assert_eq!(report.header("x-ratelimit-limit"), Some("100"));
    assert_eq!(report.remaining(), 94);
    // pro: T = 0.6 s; 6 units charged so far.
    assert_eq!(
        report.header("x-ratelimit-reset"),
        Some(&*reset_secs(START_US, Duration::from_millis(3_600)).to_string())
    );
    assert!(events(&p).is_empty(), "{:?}", events(&p));
}

fn eva_unknown() -> LimitEvent {
    LimitEvent::UnknownTier {
        user_id: "key_eva".into(),
        tier: "gold".into(),
        policy: OnUnknownTier::UseDefault,
    }
}

#[tokio::test]
async fn eva_gets_the_default_quota_in_her_own_bucket() {
    let p = post();
    // Ana empties her bucket first: Eva must not be affected.
    for _ in 0..10 {
        get_path(&p.app, Some("key_ana"), "/data").await;
    }
    assert_eq!(
        get_path(&p.app, Some("key_ana"), "/data").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    p.events.lock().unwrap().clear();

    let r = get_path(&p.app, Some("key_eva"), "/data").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-ratelimit-limit"), Some("10"));
    assert_eq!(r.remaining(), 9, "Eva has her own bucket");
    assert_eq!(events(&p), vec![eva_unknown()]);

    // Her own full quota of 10, one UnknownTier event per request, then 429.
    for k in 2..=10u64 {
        let r = get_path(&p.app, Some("key_eva"), "/data").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.remaining(), 10 - k);
    }
    assert_eq!(events(&p), vec![eva_unknown(); 10]);
    let r = get_path(&p.app, Some("key_eva"), "/data").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.body,
        r#"{"error":"rate limit exceeded","tier":"free","retry_after":6}"#
    );
    let evs = events(&p);
    assert_eq!(evs.len(), 12);
    assert_eq!(evs[10], eva_unknown());
    assert_eq!(
        evs[11],
        LimitEvent::Limited {
            user_id: "key_eva".into(),
            tier: "free",
            limit: "free",
            of: 10,
            cost: 1,
            retry_after: Duration::from_secs(6),
        }
    );
}

#[tokio::test]
async fn eva_using_her_quota_leaves_ana_untouched() {
    let p = post();
    for _ in 0..10 {
        assert_eq!(
            get_path(&p.app, Some("key_eva"), "/data").await.status,
            StatusCode::OK
        );
    }
    assert_eq!(
        get_path(&p.app, Some("key_eva"), "/data").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let ana = get_path(&p.app, Some("key_ana"), "/data").await;
    assert_eq!(ana.status, StatusCode::OK);
    assert_eq!(ana.remaining(), 9);
}

#[tokio::test]
async fn the_posts_safe_defaults_transcript() {
    // /data for Eva, /backup for Eva, /data without a key.
    let p = post();
    let data = get_path(&p.app, Some("key_eva"), "/data").await;
    let backup = get_path(&p.app, Some("key_eva"), "/backup").await;
    let anonymous = get_path(&p.app, None, "/data").await;
    let out = format!(
        "/data {} limit {}\n/backup {}\n/data {}",
        data.status.as_u16(),
        data.header("x-ratelimit-limit").unwrap(),
        backup.status.as_u16(),
        anonymous.status.as_u16()
    );
    assert_eq!(out, "/data 200 limit 10\n/backup 403\n/data 401");

    // What the 0.3 example's on_event printed, and nothing more about unknown tiers.
    let printed: Vec<String> = events(&p)
        .iter()
        .filter_map(|e| match e {
            LimitEvent::UnknownTier { user_id, tier, .. } => {
                Some(format!("unknown tier {tier:?} for {user_id}"))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        printed,
        vec![
            "unknown tier \"gold\" for key_eva",
            "unknown tier \"gold\" for key_eva"
        ]
    );
    assert_eq!(
        events(&p),
        vec![
            eva_unknown(),
            eva_unknown(),
            LimitEvent::CostExceedsBurst {
                user_id: "key_eva".into(),
                tier: "free",
                limit: "free",
                cost: 50,
                burst: 10,
            },
            LimitEvent::MissingIdentity,
        ]
    );
    // Only Eva's /data reached a handler.
    assert_eq!(p.calls.load(Ordering::SeqCst), 1);
    // A typical `on_event(|e| info!(?e))` logs no API key: the events'
    // Debug output carries a tag, never the id (Display, above, is the
    // explicit way to print it).
    for event in events(&p) {
        let logged = format!("{event:?}");
        assert!(!logged.contains("key_eva"), "{logged}");
    }
}

#[tokio::test]
async fn logged_events_never_show_the_api_key() {
    let p = post();
    for _ in 0..11 {
        get_path(&p.app, Some("key_ana"), "/data").await;
    }
    get_path(&p.app, Some("key_ana"), "/backup").await;
    let all = events(&p);
    assert_eq!(all.len(), 2, "{all:?}"); // the 429 and the 403
    let logged = format!("{all:?}");
    assert!(!logged.contains("key_ana"), "{logged}");
    // The same user gets the same tag: log lines can be followed.
    let tag = tower_rate_tier::UserId::from("key_ana").redacted();
    assert_eq!(logged.matches(&*tag).count(), 2, "{logged}");
    match &all[0] {
        LimitEvent::Limited { user_id, .. } => {
            assert_eq!(user_id.as_str(), "key_ana");
            assert_eq!(user_id.to_string(), "key_ana");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn backup_is_403_without_retry_after_and_leaves_the_bucket_alone() {
    let p = post();
    assert_eq!(
        get_path(&p.app, Some("key_ana"), "/data").await.remaining(),
        9
    );

    let r = get_path(&p.app, Some("key_ana"), "/backup").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(r.body.contains("cost"), "{}", r.body);
    assert!(r.body.contains("50"), "{}", r.body);
    assert_eq!(
        p.calls.load(Ordering::SeqCst),
        1,
        "/backup handler not called"
    );

    // Untouched: the next /data shows what it would have without /backup.
    assert_eq!(
        get_path(&p.app, Some("key_ana"), "/data").await.remaining(),
        8
    );
    // Also on an empty bucket: still 403 (never 429), still untouched.
    for _ in 0..8 {
        get_path(&p.app, Some("key_ana"), "/data").await;
    }
    let r = get_path(&p.app, Some("key_ana"), "/backup").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.header("retry-after"), None);
    p.clock.advance(Duration::from_secs(6));
    assert_eq!(
        get_path(&p.app, Some("key_ana"), "/data").await.remaining(),
        0
    );

    let backups = events(&p)
        .into_iter()
        .filter(|e| matches!(e, LimitEvent::CostExceedsBurst { .. }))
        .count();
    assert_eq!(backups, 2);
    // A pro user's burst (100) covers a backup: 200, 50 left.
    let r = get_path(&p.app, Some("key_bea"), "/backup").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.remaining(), 50);
}

#[tokio::test]
async fn no_key_or_an_unknown_key_is_401_with_a_missing_identity_event() {
    let p = post();
    let r = get_path(&p.app, None, "/data").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.header("x-ratelimit-limit"), None);
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(r.body, r#"{"error":"identity required"}"#);
    let r = get_path(&p.app, Some("key_zoe"), "/report").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(p.calls.load(Ordering::SeqCst), 0);
    assert_eq!(
        events(&p),
        vec![LimitEvent::MissingIdentity, LimitEvent::MissingIdentity]
    );
    // Refusing the anonymous did not charge anyone.
    assert_eq!(
        get_path(&p.app, Some("key_ana"), "/data").await.remaining(),
        9
    );
}

// ---------------------------------------------------------------------------
// Without axum: a plain `tower::service_fn`.

fn plain_layer(clock: &FakeClock, events: &Events) -> TierLimitLayer {
    post_layer(post_plans(clock).build(), events)
}

fn request<B>(key: &str, path: &str, body: B) -> Request<B> {
    Request::builder()
        .uri(path)
        .header("x-api-key", key)
        .body(body)
        .unwrap()
}

#[tokio::test]
async fn works_on_a_plain_service_fn_with_a_full_bytes_body() {
    let clock = FakeClock::at_us(START_US);
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let inner = tower::service_fn(move |_req: Request<Full<Bytes>>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                b"data\n",
            ))))
        }
    });
    let service = tower::ServiceBuilder::new()
        .layer(plain_layer(&clock, &events))
        .service(inner);

    for k in 1..=10u64 {
        let response = service
            .clone()
            .oneshot(request("key_ana", "/data", Full::default()))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["x-ratelimit-remaining"],
            (10 - k).to_string()
        );
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"data\n");
    }
    let response = service
        .clone()
        .oneshot(request("key_ana", "/data", Full::default()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(headers["retry-after"], "6");
    assert_eq!(headers["x-ratelimit-limit"], "10");
    assert_eq!(headers["x-ratelimit-remaining"], "0");
    assert_eq!(headers["x-ratelimit-reset"], "1790947155");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        &body[..],
        br#"{"error":"rate limit exceeded","tier":"free","retry_after":6}"#
    );
    assert_eq!(calls.load(Ordering::SeqCst), 10);

    // Bea's report, and the 401 without a key, on the same plain service.
    let response = service
        .clone()
        .oneshot(request("key_bea", "/report", Full::default()))
        .await
        .unwrap();
    assert_eq!(response.headers()["x-ratelimit-remaining"], "95");
    let anonymous = Request::builder()
        .uri("/data")
        .body(Full::default())
        .unwrap();
    let response = service.clone().oneshot(anonymous).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(calls.load(Ordering::SeqCst), 11);
}

#[tokio::test]
async fn works_on_a_plain_service_fn_with_a_string_body() {
    let clock = FakeClock::at_us(START_US);
    let events: Events = Arc::default();
    let inner = tower::service_fn(|req: Request<String>| async move {
        Ok::<_, Infallible>(Response::new(format!("echo {}", req.into_body())))
    });
    let service = plain_layer(&clock, &events).layer_service(inner);

    let response = service
        .clone()
        .oneshot(request("key_eva", "/data", "hi".to_owned()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-ratelimit-limit"], "10");
    assert_eq!(response.headers()["x-ratelimit-remaining"], "9");
    assert_eq!(response.body().get_ref(), "echo hi");
    assert_eq!(*events.lock().unwrap(), vec![eva_unknown()]);

    let response = service
        .clone()
        .oneshot(request("key_eva", "/backup", String::new()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(response.headers().get("retry-after").is_none());
    assert!(
        response.body().get_ref().contains("cost"),
        "{}",
        response.body().get_ref()
    );
}

/// `Layer::layer`, spelled as a method for readability above.
trait LayerService {
    fn layer_service<S>(
        &self,
        inner: S,
    ) -> tower_rate_tier::layer::TierLimit<S>;
}

impl LayerService for TierLimitLayer {
    fn layer_service<S>(
        &self,
        inner: S,
    ) -> tower_rate_tier::layer::TierLimit<S> {
        tower::Layer::layer(self, inner)
    }
}
