//! The `tracing` feature: what a subscriber sees of the decision path, at
//! `DEBUG` and at `INFO`, captured from a `fmt` subscriber.
#![cfg(feature = "tracing")]
#![allow(clippy::unwrap_used)]

mod support;

use std::convert::Infallible;
use std::io::Write;
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use support::stores::TimingOut;
use tower::{Layer, ServiceExt, service_fn};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
use tracing::Level;
use tracing::subscriber::DefaultGuard;

/// Everything a `fmt` subscriber writes, for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// A subscriber at `level` for this thread (the tests run on a
/// current-thread runtime, so the layer's futures run here).
fn capture(level: Level) -> (Captured, DefaultGuard) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

fn layer(tiers: RateTier) -> TierLimitLayer {
    TierLimitLayer::new(tiers).identifier_fn(|headers| {
        let key = headers.get("x-api-key")?.to_str().ok()?;
        let tier = headers.get("x-tier")?.to_str().ok()?;
        Some(TierIdentity::new(key, tier))
    })
}

async fn get(layer: &TierLimitLayer, tier: &str) -> u16 {
    let service = layer.layer(service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    }));
    let request = Request::builder()
        .header("x-api-key", "key_ana")
        .header("x-tier", tier)
        .body(String::new())
        .unwrap();
    service.oneshot(request).await.unwrap().status().as_u16()
}

fn one_per_second() -> RateTier {
    RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_second(1))
        .default_tier("free")
        .build()
}

#[tokio::test(flavor = "current_thread")]
async fn debug_shows_each_check() {
    let layer = layer(one_per_second());
    let (captured, _guard) = capture(Level::DEBUG);

    assert_eq!(get(&layer, "free").await, 200);
    assert_eq!(get(&layer, "free").await, 429);
    assert_eq!(get(&layer, "gold").await, 429); // unknown: free's quota

    let text = captured.text();
    let checks: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("rate limit check"))
        .collect();
    assert_eq!(checks.len(), 3, "{text}");
    for (line, outcome) in checks.iter().zip(["allowed", "limited", "limited"])
    {
        assert!(line.contains("DEBUG"), "{line}");
        assert!(line.contains("tower_rate_tier"), "{line}");
        assert!(line.contains(&format!("outcome=\"{outcome}\"")), "{line}");
        assert!(line.contains("tier=\"free\""), "{line}");
        assert!(line.contains("storage=\"memory\""), "{line}");
        assert!(line.contains("elapsed_us="), "{line}");
    }
    let unknown: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("unknown tier"))
        .collect();
    assert_eq!(unknown.len(), 1, "{text}");
    assert!(
        unknown[0].contains("claimed_tier=\"gold\""),
        "{}",
        unknown[0]
    );
    assert!(unknown[0].contains("policy=UseDefault"), "{}", unknown[0]);
    // The user id stays out of the logs.
    assert!(!text.contains("key_ana"), "{text}");
}

/// The check's `DEBUG` event carries the cost, as the layer's docs say
/// ("tier, outcome, cost, storage and elapsed µs"), as 0.3's did.
#[tokio::test(flavor = "current_thread")]
async fn each_check_event_carries_its_cost() {
    let layer = layer(one_per_second());
    let (captured, _guard) = capture(Level::DEBUG);
    assert_eq!(get(&layer, "free").await, 200);
    let text = captured.text();
    let line = text
        .lines()
        .find(|line| line.contains("rate limit check"))
        .unwrap_or_else(|| panic!("no check event: {text}"));
    assert!(line.contains("cost=1"), "{line}");
}

/// With the `tracing` feature, each decision runs in a `rate_limit` span
/// (the crate's feature list: "`tracing` events (and a span) on the
/// decision path"), as in 0.3, so that what the identifier and the store
/// log is attributed to it.
#[tokio::test(flavor = "current_thread")]
async fn each_check_runs_in_a_rate_limit_span() {
    let layer = layer(one_per_second());
    let (captured, _guard) = capture(Level::DEBUG);
    assert_eq!(get(&layer, "free").await, 200);
    let text = captured.text();
    let line = text
        .lines()
        .find(|line| line.contains("rate limit check"))
        .unwrap_or_else(|| panic!("no check event: {text}"));
    assert!(line.contains("rate_limit:"), "not in the span: {line}");
}

#[tokio::test(flavor = "current_thread")]
async fn info_shows_store_failures_and_no_checks() {
    let ok = layer(one_per_second());
    let failing = layer(
        RateTier::builder()
            .clock(FakeClock::new())
            .tier("free", Quota::per_second(1))
            .storage(Arc::new(TimingOut::new("timing_out")))
            .build(),
    );
    let (captured, _guard) = capture(Level::INFO);

    assert_eq!(get(&ok, "free").await, 200);
    assert_eq!(get(&ok, "free").await, 429);
    assert_eq!(get(&failing, "free").await, 503);

    let text = captured.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "only the store failure: {text}");
    let line = lines[0];
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("rate limiter store failed"), "{line}");
    assert!(line.contains("storage=\"timing_out\""), "{line}");
    assert!(line.contains("did not answer within 100ms"), "{line}");
    assert!(line.contains("policy=Deny(503)"), "{line}");
}
