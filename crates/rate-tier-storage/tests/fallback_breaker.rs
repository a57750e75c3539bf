//! The circuit breaker and local fallback, with a fake clock and a primary
//! that fails on command.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gcra_core::{Decision, Quota};
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::fallback::BreakerState;
use rate_tier_storage::{
    BucketCheck, FallbackStorage, MemoryStorage, Storage, StorageError,
    StorageEvent,
};

/// A primary that works like memory until told to fail, or to hang.
#[derive(Debug)]
struct Flaky {
    store: MemoryStorage,
    down: AtomicBool,
    hang: AtomicBool,
    calls: AtomicUsize,
}

#[async_trait::async_trait]
impl Storage for Flaky {
    async fn check(
        &self,
        check: &BucketCheck<'_>,
    ) -> Result<Decision, StorageError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.down.load(Ordering::SeqCst) {
            return Err(StorageError::Timeout(Duration::from_millis(100)));
        }
        self.store.check(check).await
    }

    fn kind(&self) -> &'static str {
        "flaky"
    }
}

struct Setup {
    clock: FakeClock,
    primary: Arc<Flaky>,
    store: FallbackStorage,
    events: Arc<Mutex<Vec<StorageEvent>>>,
}

fn setup(share: u32) -> Setup {
    let clock = FakeClock::at_us(1_000_000_000);
    let primary = Arc::new(Flaky {
        store: MemoryStorage::with_clock(clock.clone()),
        down: AtomicBool::new(false),
        hang: AtomicBool::new(false),
        calls: AtomicUsize::new(0),
    });
    let store = FallbackStorage::builder(primary.clone())
        .clock(clock.clone())
        .failure_threshold(3)
        .cool_down(Duration::from_secs(1), Duration::from_secs(4))
        .local_share(share)
        .build();
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    store.add_listener(Arc::new(move |e: &StorageEvent| {
        sink.lock().unwrap().push(e.clone())
    }));
    Setup {
        clock,
        primary,
        store,
        events,
    }
}

fn check(user: &str, cost: u32) -> BucketCheck<'_> {
    BucketCheck::new("free", user, Quota::per_minute(10), cost)
}

fn transitions(
    events: &Mutex<Vec<StorageEvent>>,
) -> Vec<(BreakerState, BreakerState)> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            StorageEvent::Breaker { from, to, .. } => Some((*from, *to)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn opens_after_n_failures_and_never_errors_to_the_caller() {
    let s = setup(1);
    s.primary.down.store(true, Ordering::SeqCst);
    for _ in 0..2 {
        assert!(s.store.check(&check("ana", 1)).await.unwrap().allowed);
        assert_eq!(s.store.state(), BreakerState::Closed);
    }
    assert!(s.store.check(&check("ana", 1)).await.unwrap().allowed);
    assert_eq!(s.store.state(), BreakerState::Open);
    assert_eq!(s.primary.calls.load(Ordering::SeqCst), 3);
    assert_eq!(
        transitions(&s.events),
        [(BreakerState::Closed, BreakerState::Open)]
    );
    // Each failed check was decided locally, and said so.
    let fallbacks = s
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, StorageEvent::Fallback { .. }))
        .count();
    assert_eq!(fallbacks, 3);
}

#[tokio::test]
async fn while_open_the_primary_is_not_called_and_limits_hold_locally() {
    let s = setup(1);
    s.primary.down.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        s.store.check(&check("warmup", 1)).await.unwrap();
    }
    assert_eq!(s.store.state(), BreakerState::Open);
    let calls = s.primary.calls.load(Ordering::SeqCst);
    let mut allowed = 0;
    for _ in 0..15 {
        // The memory-speed path answers synchronously while open.
        let decision = s
            .store
            .check_local(&check("ana", 1))
            .unwrap()
            .unwrap()
            .decision;
        allowed += usize::from(decision.allowed);
    }
    assert_eq!(allowed, 10, "the local quota is the tier's quota");
    assert_eq!(s.primary.calls.load(Ordering::SeqCst), calls);
}

#[tokio::test]
async fn probe_after_cool_down_closes_when_the_primary_is_back() {
    let s = setup(1);
    s.primary.down.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        s.store.check(&check("ana", 1)).await.unwrap();
    }
    s.primary.down.store(false, Ordering::SeqCst);
    s.clock.advance(Duration::from_millis(999));
    s.store.check(&check("ana", 1)).await.unwrap();
    assert_eq!(s.store.state(), BreakerState::Open, "cool-down not over");
    let calls = s.primary.calls.load(Ordering::SeqCst);

    s.clock.advance(Duration::from_millis(1));
    let decision = s.store.check(&check("bea", 1)).await.unwrap();
    assert!(decision.allowed);
    assert_eq!(s.primary.calls.load(Ordering::SeqCst), calls + 1);
    assert_eq!(s.store.state(), BreakerState::Closed);
    assert_eq!(
        transitions(&s.events),
        [
            (BreakerState::Closed, BreakerState::Open),
            (BreakerState::Open, BreakerState::HalfOpen),
            (BreakerState::HalfOpen, BreakerState::Closed),
        ]
    );
    // Closed again: the primary decides.
    s.store.check(&check("bea", 1)).await.unwrap();
    assert_eq!(s.primary.calls.load(Ordering::SeqCst), calls + 2);
}

#[tokio::test]
async fn failed_probes_back_off_doubling_up_to_the_cap() {
    let s = setup(1);
    s.primary.down.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        s.store.check(&check("ana", 1)).await.unwrap();
    }
    // Cool-downs: 1 s, then 2 s, then 4 s, then 4 s (the cap).
    for cool_down in [1, 2, 4, 4] {
        let calls = s.primary.calls.load(Ordering::SeqCst);
        s.clock
            .advance(Duration::from_secs(cool_down) - Duration::from_micros(1));
        s.store.check(&check("ana", 1)).await.unwrap();
        assert_eq!(s.primary.calls.load(Ordering::SeqCst), calls, "too early");
        s.clock.advance(Duration::from_micros(1));
        s.store.check(&check("ana", 1)).await.unwrap();
        assert_eq!(s.primary.calls.load(Ordering::SeqCst), calls + 1, "probe");
        assert_eq!(s.store.state(), BreakerState::Open);
    }
}

#[tokio::test]
async fn local_share_divides_the_quota() {
    let s = setup(2);
    s.primary.down.store(true, Ordering::SeqCst);
    let mut allowed = 0;
    for _ in 0..10 {
        allowed +=
            usize::from(s.store.check(&check("ana", 1)).await.unwrap().allowed);
    }
    assert_eq!(allowed, 5, "10/min shared by 2 instances");
}

#[tokio::test]
async fn input_errors_pass_through_and_are_not_failures() {
    let s = setup(1);
    for _ in 0..5 {
        let error = s.store.check(&check("ana", 0)).await.unwrap_err();
        assert!(matches!(error, StorageError::Check(_)));
    }
    assert_eq!(s.store.state(), BreakerState::Closed);
}

#[tokio::test]
async fn a_success_resets_the_failure_count() {
    let s = setup(1);
    for _ in 0..3 {
        s.primary.down.store(true, Ordering::SeqCst);
        s.store.check(&check("ana", 1)).await.unwrap();
        s.store.check(&check("ana", 1)).await.unwrap();
        s.primary.down.store(false, Ordering::SeqCst);
        s.store.check(&check("ana", 1)).await.unwrap();
    }
    assert_eq!(s.store.state(), BreakerState::Closed);
}

#[tokio::test]
async fn a_probe_cancelled_mid_flight_does_not_leave_it_half_open() {
    let s = setup(1);
    s.primary.down.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        s.store.check(&check("ana", 1)).await.unwrap();
    }
    s.primary.hang.store(true, Ordering::SeqCst);
    s.clock.advance(Duration::from_secs(1));
    let store = s.store.clone();
    let probe = tokio::spawn(async move {
        store.check(&check("ana", 1)).await.map(|d| d.allowed)
    });
    while s.store.state() != BreakerState::HalfOpen {
        tokio::task::yield_now().await;
    }
    probe.abort();
    assert!(probe.await.unwrap_err().is_cancelled());
    // A cancelled probe is a failed probe: open again, said so, and for
    // twice the cool-down, so that callers who give up early cannot make
    // every request a probe.
    assert_eq!(s.store.state(), BreakerState::Open);
    let last = s.events.lock().unwrap().iter().rev().find_map(|e| match e {
        StorageEvent::Breaker { from, to, cause } => {
            Some((*from, *to, cause.clone()))
        }
        _ => None,
    });
    assert_eq!(
        last,
        Some((
            BreakerState::HalfOpen,
            BreakerState::Open,
            Some("probe cancelled".to_owned())
        ))
    );
    s.primary.hang.store(false, Ordering::SeqCst);
    s.primary.down.store(false, Ordering::SeqCst);
    let calls = s.primary.calls.load(Ordering::SeqCst);
    s.clock
        .advance(Duration::from_secs(2) - Duration::from_micros(1));
    s.store.check(&check("ana", 1)).await.unwrap();
    assert_eq!(s.primary.calls.load(Ordering::SeqCst), calls, "too early");
    s.clock.advance(Duration::from_micros(1));
    s.store.check(&check("ana", 1)).await.unwrap();
    assert_eq!(s.store.state(), BreakerState::Closed);
}

/// The breaker opens with its deadline in the same atomic step: a check
/// racing the opening never sees it open and already due.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_failures_open_once_and_never_probe_early() {
    let s = setup(1);
    s.primary.down.store(true, Ordering::SeqCst);
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let store = s.store.clone();
            tokio::spawn(async move {
                let user = format!("user-{}", i % 20);
                store.check(&check(&user, 1)).await.map(|d| d.allowed)
            })
        })
        .collect();
    for task in tasks {
        assert!(task.await.unwrap().is_ok(), "never an error to the caller");
    }
    // The clock never moved: no probe can have been due.
    assert_eq!(
        transitions(&s.events),
        [(BreakerState::Closed, BreakerState::Open)]
    );
    assert_eq!(s.store.state(), BreakerState::Open);
}
