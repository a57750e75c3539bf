//! `ShapeLayer` (src/shape.rs) over the memory store, on Tokio's paused
//! clock (the store reads the same clock): calls spaced exactly by the
//! quota, waits too long failing at once and taking nothing, a dropped
//! call giving its slot back, costs, several quotas, events, build errors.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rate_tier_storage::{
    Answer, BucketCheck, Decided, Decision, Mode, StorageError,
};
use tokio::time::Instant;
use tower::{Service, ServiceExt, service_fn};
use tower_rate_tier::clock::Clock;
use tower_rate_tier::shape::ShapeEvent;
use tower_rate_tier::{
    ConfigError, MemoryStorage, Quota, Storage, shape::ShapeError,
    shape::ShapeLayer,
};

/// The store's clock is Tokio's: paused, it moves only as timers fire.
#[derive(Debug)]
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now_us(&self) -> u64 {
        1_000_000_000 + self.0.elapsed().as_micros() as u64
    }
}

fn store() -> Arc<MemoryStorage> {
    Arc::new(MemoryStorage::with_clock(TokioClock(Instant::now())))
}

/// An upstream that notes when each call reached it (ms since `start`).
#[derive(Clone)]
struct Upstream {
    start: Instant,
    seen: Arc<Mutex<Vec<(u64, u32)>>>,
}

impl Upstream {
    fn new() -> Upstream {
        Upstream {
            start: Instant::now(),
            seen: Arc::default(),
        }
    }

    fn service(
        &self,
    ) -> impl Service<
        u32,
        Response = u32,
        Error = std::io::Error,
        Future = impl Send,
    > + Clone
    + Send
    + 'static {
        let upstream = self.clone();
        service_fn(move |call: u32| {
            let upstream = upstream.clone();
            async move {
                let at = upstream.start.elapsed().as_millis() as u64;
                upstream.seen.lock().unwrap().push((at, call));
                Ok::<_, std::io::Error>(call)
            }
        })
    }

    fn times(&self) -> Vec<u64> {
        let mut times: Vec<u64> =
            self.seen.lock().unwrap().iter().map(|&(t, _)| t).collect();
        times.sort_unstable();
        times
    }
}

/// 10 a second, evenly: one call every 100 ms.
fn even() -> Quota {
    Quota::per_second(10).allow_burst(1)
}

#[tokio::test(start_paused = true)]
async fn calls_at_once_go_out_one_interval_apart() {
    let upstream = Upstream::new();
    let layer = ShapeLayer::builder(store(), "provider")
        .quota("per-second", even())
        .unwrap()
        .build()
        .unwrap();
    let client = layer_service(&layer, &upstream);
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move { client.ready().await?.call(i).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    let expected: Vec<u64> = (0..20).map(|i| i * 100).collect();
    assert_eq!(upstream.times(), expected);
}

fn layer_service<C: Clone>(
    layer: &ShapeLayer<C>,
    upstream: &Upstream,
) -> tower_rate_tier::shape::Shape<
    impl Service<u32, Response = u32, Error = std::io::Error, Future = impl Send>
    + Clone
    + Send
    + 'static,
    C,
> {
    tower::Layer::layer(layer, upstream.service())
}

#[tokio::test(start_paused = true)]
async fn a_call_that_would_wait_too_long_fails_at_once_and_takes_nothing() {
    let upstream = Upstream::new();
    let layer = ShapeLayer::builder(store(), "provider")
        .quota("per-second", even())
        .unwrap()
        .max_wait(Duration::from_millis(300))
        .build()
        .unwrap();
    let client = layer_service(&layer, &upstream);
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move { client.ready().await?.call(i).await })
        })
        .collect();
    let started = Instant::now();
    let mut refused = Vec::new();
    for call in calls {
        match call.await.unwrap() {
            Ok(_) => {}
            Err(ShapeError::WaitTooLong { wait, quota }) => {
                assert_eq!(quota, "per-second");
                refused.push(wait);
            }
            Err(other) => panic!("{other}"),
        }
    }
    // Slots at 0, 100, 200 and 300 ms; the fifth and sixth would wait
    // 400 ms: refused, and neither took a slot.
    assert_eq!(upstream.times(), [0, 100, 200, 300]);
    assert_eq!(refused, [Duration::from_millis(400); 2]);
    let mut client = client.clone();
    client.ready().await.unwrap().call(9).await.unwrap();
    assert_eq!(
        upstream.times().last().copied(),
        Some(400),
        "the next call takes the slot after the last one kept"
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_it_waits_gives_its_slot_back() {
    let upstream = Upstream::new();
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let layer = ShapeLayer::builder(store(), "provider")
        .quota("per-second", even())
        .unwrap()
        .on_event(move |event: &ShapeEvent| sink.lock().unwrap().push(*event))
        .build()
        .unwrap();
    let mut client = layer_service(&layer, &upstream);
    client.ready().await.unwrap().call(0).await.unwrap();
    // The second call waits 100 ms for its slot; it is dropped at 50 ms.
    let mut waiting = client.clone();
    let dropped = tokio::spawn(async move { waiting.call(1).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    // The next call gets that slot, at 100 ms, not one at 200 ms.
    client.ready().await.unwrap().call(2).await.unwrap();
    assert_eq!(upstream.times(), [0, 100]);
    let events = events.lock().unwrap().clone();
    assert_eq!(
        events,
        [
            ShapeEvent::Reserved {
                wait: Duration::ZERO
            },
            ShapeEvent::Reserved {
                wait: Duration::from_millis(100)
            },
            ShapeEvent::GaveBack,
            ShapeEvent::Reserved {
                wait: Duration::from_millis(50)
            },
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn each_call_waits_for_its_cost_in_every_quota() {
    let upstream = Upstream::new();
    // 10 units a second, evenly, and 6 units a minute (a burst of 6).
    let layer = ShapeLayer::builder(store(), "provider")
        .quota("per-second", even().allow_burst(3))
        .unwrap()
        .quota("per-minute", Quota::per_minute(6))
        .unwrap()
        .max_wait(Duration::from_secs(5))
        .cost(|units: &u32| *units)
        .build()
        .unwrap();
    let mut client = layer_service(&layer, &upstream);
    // 3 units at once (the burst), then 3 more after 300 ms.
    client.ready().await.unwrap().call(3).await.unwrap();
    client.ready().await.unwrap().call(3).await.unwrap();
    assert_eq!(upstream.times(), [0, 300]);
    // The minute's 6 are spent: the next unit would wait 10 s.
    let error = client.ready().await.unwrap().call(1).await.unwrap_err();
    match error {
        ShapeError::WaitTooLong { wait, quota } => {
            assert_eq!(quota, "per-minute");
            assert_eq!(wait, Duration::from_millis(9_700));
        }
        other => panic!("{other}"),
    }
    // A cost of 0 goes at once and takes nothing.
    client.ready().await.unwrap().call(0).await.unwrap();
    assert_eq!(upstream.times(), [0, 300, 300]);
    // A cost no quota can ever hold is the store's error, not a wait.
    let error = client.ready().await.unwrap().call(7).await.unwrap_err();
    assert!(matches!(error, ShapeError::Store(_)), "{error}");
}

#[tokio::test]
async fn a_shaper_needs_a_quota_and_a_store_that_reserves() {
    let error = ShapeLayer::builder(store(), "provider")
        .build()
        .unwrap_err();
    assert_eq!(error, ConfigError::NoQuota);
    let error = ShapeLayer::builder(store(), "provider")
        .quota("per-second", even())
        .unwrap()
        .quota("per-second", even())
        .unwrap_err();
    assert_eq!(error, ConfigError::DuplicateLimit("per-second".into()));

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
    let error = ShapeLayer::builder(Arc::new(Plain), "provider")
        .quota("per-second", even())
        .unwrap()
        .build()
        .unwrap_err();
    assert_eq!(error, ConfigError::CannotWait { store: "custom" });
}
