//! Who hears what, once: the limiter's listeners and observers
//! (`RateTierBuilder::{on_event, observe}`, `RateTier::subscribe`) hear
//! everything (every layer's requests, direct checks, the store's events,
//! reloads); a layer's (`TierLimitLayer::{on_event, observe}`) hear that
//! layer's requests only, and nothing is registered on the shared limiter
//! by a layer (a layer built and dropped once kept receiving events).
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::{Router, routing::get};
use support::http::{Events, get_as};
use support::stores::TimingOut;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    FallbackStorage, LimitEvent, Observer, Quota, RateTier, RateTierBuilder,
    TierIdentity, TierLimitLayer, Tiers, observe::Checked, observe::Outcome,
    storage::BreakerState, storage::StorageEvent,
};

/// Counts reloads, checks and refusals.
#[derive(Clone, Default)]
struct Counts {
    reloads: Arc<AtomicUsize>,
    checks: Arc<AtomicUsize>,
    limited: Arc<AtomicUsize>,
    limited_events: Arc<AtomicUsize>,
}

impl Counts {
    fn reloads(&self) -> usize {
        self.reloads.load(Ordering::SeqCst)
    }
    fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }
    fn limited(&self) -> (usize, usize) {
        (
            self.limited.load(Ordering::SeqCst),
            self.limited_events.load(Ordering::SeqCst),
        )
    }
}

impl Observer for Counts {
    fn checked(&self, check: &Checked) {
        self.checks.fetch_add(1, Ordering::SeqCst);
        if check.outcome == Outcome::Limited {
            self.limited.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn event(&self, event: &LimitEvent) {
        match event {
            LimitEvent::TiersReloaded { .. } => {
                self.reloads.fetch_add(1, Ordering::SeqCst);
            }
            LimitEvent::Limited { .. } => {
                self.limited_events.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }
}

fn builder() -> RateTierBuilder {
    RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(1))
}

fn reload(tiers: &RateTier) {
    tiers.reload(
        Tiers::builder()
            .tier("free", Quota::per_minute(1))
            .build()
            .unwrap(),
    );
}

fn app(layer: TierLimitLayer) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer.identifier_fn(|headers| {
            let user = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(user, "free"))
        }))
}

#[test]
fn a_limiter_observer_hears_a_reload_once_however_many_layers() {
    let observer = Counts::default();
    let tiers = builder().observe(observer.clone()).build();
    let layer_observer = Counts::default();
    let _layers: Vec<TierLimitLayer> = (0..3)
        .map(|_| {
            TierLimitLayer::new(tiers.clone()).observe(layer_observer.clone())
        })
        .collect();
    reload(&tiers);
    assert_eq!(observer.reloads(), 1);
    // A reload comes from no request: no layer's observer hears it.
    assert_eq!(layer_observer.reloads(), 0);
}

#[tokio::test]
async fn each_check_is_seen_once_by_the_limiter_and_by_its_own_layer_only() {
    let limiter_observer = Counts::default();
    let limiter_events = Events::default();
    let tiers = builder()
        .observe(limiter_observer.clone())
        .on_event(limiter_events.sink())
        .build();
    let (a_observer, b_observer) = (Counts::default(), Counts::default());
    let (a_events, b_events) = (Events::default(), Events::default());
    let a = app(TierLimitLayer::new(tiers.clone())
        .observe(a_observer.clone())
        .on_event(a_events.sink()));
    let b = app(TierLimitLayer::new(tiers.clone())
        .observe(b_observer.clone())
        .on_event(b_events.sink()));

    // Ana through a (passes, then refused), Bea through b (passes).
    assert_eq!(get_as(&a, Some("ana"), "/").await.status, 200);
    assert_eq!(get_as(&a, Some("ana"), "/").await.status, 429);
    assert_eq!(get_as(&b, Some("bea"), "/").await.status, 200);
    // A direct check is the limiter's.
    tiers.check("eva", "free", 1).await.unwrap().unwrap();
    tiers.check("eva", "free", 1).await.unwrap().unwrap_err();

    assert_eq!(a_observer.checks(), 2);
    assert_eq!(a_observer.limited(), (1, 1));
    assert_eq!(b_observer.checks(), 1);
    assert_eq!(b_observer.limited(), (0, 0));
    assert_eq!(limiter_observer.checks(), 5);
    assert_eq!(limiter_observer.limited(), (2, 2));
    let limited = |e: &LimitEvent| matches!(e, LimitEvent::Limited { .. });
    assert_eq!(a_events.count(limited), 1);
    assert_eq!(b_events.count(limited), 0);
    assert_eq!(limiter_events.count(limited), 2);
}

/// `on_event`/`observe` on a layer registered on the shared
/// limiter for ever; a layer built and dropped still got events.
#[tokio::test]
async fn a_layer_built_and_dropped_leaves_nothing_on_the_limiter() {
    let tiers = builder().build();
    let token = Arc::new(());
    let heard = Arc::new(AtomicUsize::new(0));
    let observer = Counts::default();
    let weak: Weak<()> = Arc::downgrade(&token);
    {
        let heard = heard.clone();
        let layer = TierLimitLayer::new(tiers.clone())
            .on_event(move |_| {
                let _kept = &token;
                heard.fetch_add(1, Ordering::SeqCst);
            })
            .observe(observer.clone());
        let service = app(layer);
        assert_eq!(get_as(&service, Some("ana"), "/").await.status, 200);
        assert_eq!(get_as(&service, Some("ana"), "/").await.status, 429);
    }
    assert_eq!(heard.load(Ordering::SeqCst), 1);
    assert_eq!(observer.checks(), 2);
    // The layer and its services are gone: so is its listener.
    assert!(weak.upgrade().is_none(), "the layer's listener was kept");

    // Whatever the limiter does next, the dropped layer hears nothing.
    reload(&tiers);
    let other = app(TierLimitLayer::new(tiers.clone()));
    assert_eq!(get_as(&other, Some("ana"), "/").await.status, 429);
    tiers.check("ana", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(heard.load(Ordering::SeqCst), 1);
    assert_eq!(observer.checks(), 2);
    assert_eq!(observer.reloads(), 0);
}

#[tokio::test]
async fn a_subscription_hears_everything_until_it_is_dropped() {
    let tiers = builder().build();
    let events = Events::default();
    let subscription = tiers.subscribe(events.sink());
    let service = app(TierLimitLayer::new(tiers.clone()));

    assert_eq!(get_as(&service, Some("ana"), "/").await.status, 200);
    assert_eq!(get_as(&service, Some("ana"), "/").await.status, 429);
    tiers.check("ana", "free", 1).await.unwrap().unwrap_err();
    reload(&tiers);
    let heard = events.all();
    assert_eq!(heard.len(), 3, "{heard:?}");
    assert!(matches!(heard[0], LimitEvent::Limited { .. }));
    assert!(matches!(heard[1], LimitEvent::Limited { .. }));
    assert!(matches!(heard[2], LimitEvent::TiersReloaded { .. }));

    drop(subscription);
    assert_eq!(get_as(&service, Some("ana"), "/").await.status, 429);
    tiers.check("ana", "free", 1).await.unwrap().unwrap_err();
    reload(&tiers);
    assert_eq!(events.all().len(), 3, "heard after the drop");

    // Another subscription hears from its start on.
    let later = Events::default();
    let _subscription = tiers.subscribe(later.sink());
    reload(&tiers);
    assert_eq!(later.all().len(), 1);
}

/// The store's events (here a circuit breaker opening) reach the limiter's
/// listeners once each, and a layer's not at all.
#[tokio::test]
async fn store_events_reach_the_limiters_listeners_once() {
    let clock = FakeClock::new();
    let storage = FallbackStorage::builder(Arc::new(TimingOut::new("down")))
        .clock(clock.clone())
        .failure_threshold(1)
        .cool_down(Duration::from_secs(1), Duration::from_secs(1))
        .build();
    let (built, subscribed, layer) =
        (Events::default(), Events::default(), Events::default());
    let tiers = RateTier::builder()
        .clock(clock)
        .tier("free", Quota::per_minute(10))
        .storage(Arc::new(storage))
        .on_event(built.sink())
        .build();
    let _subscription = tiers.subscribe(subscribed.sink());
    let service =
        app(TierLimitLayer::new(tiers.clone()).on_event(layer.sink()));
    assert_eq!(get_as(&service, Some("ana"), "/").await.status, 200);
    assert_eq!(get_as(&service, Some("ana"), "/").await.status, 200);

    let opened = |e: &LimitEvent| {
        matches!(
            e,
            LimitEvent::Storage(StorageEvent::Breaker {
                from: BreakerState::Closed,
                to: BreakerState::Open,
                ..
            })
        )
    };
    let local = |e: &LimitEvent| {
        matches!(e, LimitEvent::Storage(StorageEvent::Fallback { .. }))
    };
    for listener in [&built, &subscribed] {
        assert_eq!(listener.count(opened), 1, "{:?}", listener.all());
        assert_eq!(listener.count(local), 2, "{:?}", listener.all());
    }
    assert_eq!(layer.count(|_| true), 0, "{:?}", layer.all());
}
