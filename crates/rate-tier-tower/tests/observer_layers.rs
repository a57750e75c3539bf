//! Events that come from no request (reloads, the store's breaker and
//! fallback) reach an observer once, however many layers observe it.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tower_rate_tier::{
    LimitEvent, Observer, Plans, Quota, RateTier, TierLimitLayer,
};

#[derive(Clone, Default)]
struct Reloads {
    seen: Arc<AtomicUsize>,
    keyed: bool,
}

impl Observer for Reloads {
    fn event(&self, event: &LimitEvent) {
        if matches!(event, LimitEvent::PlansReloaded { .. }) {
            self.seen.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn key(&self) -> Option<usize> {
        self.keyed.then_some(Arc::as_ptr(&self.seen) as usize)
    }
}

fn tiers() -> RateTier {
    RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .build()
}

fn reload(tiers: &RateTier) {
    tiers.reload(
        Plans::builder()
            .tier("free", Quota::per_minute(20))
            .build()
            .unwrap(),
    );
}

#[test]
fn a_keyed_observer_on_three_layers_hears_a_reload_once() {
    let tiers = tiers();
    let observer = Reloads {
        keyed: true,
        ..Reloads::default()
    };
    let _layers: Vec<TierLimitLayer> = (0..3)
        .map(|_| TierLimitLayer::new(tiers.clone()).observe(observer.clone()))
        .collect();
    reload(&tiers);
    assert_eq!(observer.seen.load(Ordering::SeqCst), 1);
}

#[test]
fn an_unkeyed_observer_hears_it_once_per_layer() {
    let tiers = tiers();
    let observer = Reloads::default();
    let _layers: Vec<TierLimitLayer> = (0..3)
        .map(|_| TierLimitLayer::new(tiers.clone()).observe(observer.clone()))
        .collect();
    reload(&tiers);
    assert_eq!(observer.seen.load(Ordering::SeqCst), 3);
}

#[test]
fn cloned_layers_share_one_registration() {
    let tiers = tiers();
    let observer = Reloads::default();
    let layer = TierLimitLayer::new(tiers.clone()).observe(observer.clone());
    let _clones = [layer.clone(), layer.clone(), layer];
    reload(&tiers);
    assert_eq!(observer.seen.load(Ordering::SeqCst), 1);
}
