//! [`SyncTier::check`] is [`RateTier::check`] of its tier, answered
//! without a future: two limiters with the same configuration, one asked
//! through its synchronous handles, the other through `check` over a store
//! reached only through I/O (every decision on the full path). Random
//! sequences of checks, clock steps and reloads must get the same answers
//! and tell the listeners and observers the same, with bans, the
//! near-limit watch or observers configured.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use support::http::Events;
use support::stores::Remote;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::observe::Checked;
use tower_rate_tier::sync::{SyncAnswer, SyncTier};
use tower_rate_tier::{
    Ban, ConfigError, Error, MemoryStorage, Observer, Quota, RateTier,
    RateTierBuilder, Tiers, TiersBuilder, Window,
};

const MINUTE: Duration = Duration::from_secs(60);

/// What a limiter has beside its tiers.
#[derive(Debug, Clone, Copy)]
enum Extra {
    Nothing,
    Bans,
    NearLimit,
    Observed,
}

/// Counts the checks it sees.
#[derive(Default)]
struct Counted(AtomicUsize);

impl Observer for Counted {
    fn checked(&self, _: &Checked) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The tiers a sequence may reload: 0 is the first.
fn tiers(which: usize) -> Tiers {
    tiers_builder(which).build().unwrap()
}

fn tiers_builder(which: usize) -> TiersBuilder {
    let pro = Quota::per_second(2).allow_burst(4);
    let free: Option<tower_rate_tier::rules::Rule> = match which {
        0 => Some(Quota::per_minute(10).into()),
        1 => Some(Quota::per_minute(5).into()),
        2 => Some(Window::new(3, Duration::from_secs(30)).unwrap().into()),
        _ => None,
    };
    let builder = Tiers::builder().tier("pro", pro);
    match free {
        Some(rule) => builder.tier("free", rule),
        None => builder,
    }
}

struct Limiter {
    limiter: RateTier,
    events: Events,
    observed: Arc<Counted>,
}

fn limiter(clock: &FakeClock, extra: Extra, remote: bool) -> Limiter {
    let memory = MemoryStorage::with_clock(clock.clone());
    let (events, observed) = (Events::default(), Arc::new(Counted::default()));
    let builder: RateTierBuilder = RateTier::builder()
        .clock(clock.clone())
        .tiers(tiers_builder(0))
        .on_event(events.sink());
    let builder = match extra {
        Extra::Nothing => builder,
        Extra::Bans => builder.ban(Ban::after(3, MINUTE).lasting(MINUTE)),
        Extra::NearLimit => builder.near_limit(0.5),
        Extra::Observed => builder.observe(observed.clone()),
    };
    let limiter = match remote {
        false => builder.storage(Arc::new(memory)),
        true => builder.storage(Arc::new(Remote::of_every_kind(memory))),
    }
    .build();
    Limiter {
        limiter,
        events,
        observed,
    }
}

/// `RateTier::check`'s answer in a few words: what `SyncTier::check` must
/// answer.
fn words(
    output: Result<
        Result<tower_rate_tier::Admitted, tower_rate_tier::Limited>,
        Error,
    >,
) -> Result<SyncAnswer, String> {
    match output {
        Ok(Ok(admitted)) => Ok(SyncAnswer {
            allowed: true,
            limit: admitted.limit,
            remaining: admitted.remaining,
            retry_after_us: 0,
            reset_after_us: admitted.reset_after.as_micros() as u64,
        }),
        Ok(Err(limited)) => Ok(SyncAnswer {
            allowed: false,
            limit: limited.limit(),
            remaining: 0,
            retry_after_us: limited.retry_after().as_micros() as u64,
            reset_after_us: limited.reset_after().as_micros() as u64,
        }),
        Err(error) => Err(error.to_string()),
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A user, a tier (0: free, 1: pro), a cost.
    Check(usize, usize, u32),
    Advance(u64),
    Reload(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..2usize, 0..2usize, 0..6u32)
            .prop_map(|(user, tier, cost)| Op::Check(user, tier, cost)),
        2 => (0..20_000_000u64).prop_map(Op::Advance),
        1 => (0..4usize).prop_map(Op::Reload),
    ]
}

fn extra() -> impl Strategy<Value = Extra> {
    prop_oneof![
        Just(Extra::Nothing),
        Just(Extra::Bans),
        Just(Extra::NearLimit),
        Just(Extra::Observed),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_sync_check_is_the_checks_decision(
        extra in extra(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let clock = FakeClock::at_us(1_000_000);
        let sync = limiter(&clock, extra, false);
        let full = limiter(&clock, extra, true);
        let handles: Vec<SyncTier> = ["free", "pro"]
            .iter()
            .map(|tier| sync.limiter.sync_tier(tier).unwrap())
            .collect();
        let users = ["ana", "bo"];
        for op in ops {
            match op {
                Op::Advance(us) => clock.advance(Duration::from_micros(us)),
                Op::Reload(which) => {
                    sync.limiter.reload(tiers(which));
                    full.limiter.reload(tiers(which));
                }
                Op::Check(user, tier, cost) => {
                    let answered = handles[tier]
                        .check(users[user], cost)
                        .map_err(|error| error.to_string());
                    let checked = runtime.block_on(
                        full.limiter.check(users[user], handles[tier].tier(), cost),
                    );
                    prop_assert_eq!(answered, words(checked), "{:?}", op);
                }
            }
        }
        let told = |l: &Limiter| format!("{:?}", l.events.all());
        prop_assert_eq!(told(&sync), told(&full));
        prop_assert_eq!(
            sync.observed.0.load(Ordering::SeqCst),
            full.observed.0.load(Ordering::SeqCst),
        );
    }
}

/// Both handles and `check` spend one bucket.
#[tokio::test(flavor = "current_thread")]
async fn the_handle_and_check_share_the_buckets() {
    let limiter = limiter(&FakeClock::new(), Extra::Nothing, false).limiter;
    let free = limiter.sync_tier("free").unwrap();
    let again = free.clone();
    assert_eq!(free.check("ana", 3).unwrap().remaining, 7);
    let info = limiter.check("ana", "free", 3).await.unwrap().unwrap();
    assert_eq!(info.remaining, 4);
    assert_eq!(again.check("ana", 4).unwrap().remaining, 0);
    assert!(!free.check("ana", 1).unwrap().allowed);
    assert!(limiter.check("ana", "free", 1).await.unwrap().is_err());
}

/// A refusal changes nothing: the bucket is as the last pass left it.
#[test]
fn a_refusal_charges_nothing() {
    let clock = FakeClock::new();
    let limiter = limiter(&clock, Extra::Nothing, false).limiter;
    let free = limiter.sync_tier("free").unwrap();
    assert_eq!(free.check("ana", 8).unwrap().remaining, 2);
    for cost in [3, 10, 11] {
        let refused = free.check("ana", cost).unwrap();
        assert!(!refused.allowed, "cost {cost}");
    }
    // 2 left after 8 of 10 at 6 s each: 2 more pass now, not one later.
    assert_eq!(free.check("ana", 2).unwrap().remaining, 0);
    clock.advance(Duration::from_secs(6));
    assert_eq!(free.check("ana", 1).unwrap().remaining, 0);
}

/// A refusal says when to retry, as a `Duration` and in whole seconds
/// rounded up (`Retry-After`); a pass says 0.
#[test]
fn a_refusal_says_when_to_retry() {
    let clock = FakeClock::new();
    let limiter = limiter(&clock, Extra::Nothing, false).limiter;
    let free = limiter.sync_tier("free").unwrap();
    let passed = free.check("ana", 10).unwrap();
    assert_eq!(
        (passed.retry_after(), passed.retry_after_secs()),
        (Duration::ZERO, 0)
    );
    // 10 per minute: the next one is 6 s away.
    let refused = free.check("ana", 1).unwrap();
    assert_eq!(refused.retry_after(), Duration::from_secs(6));
    assert_eq!(refused.retry_after_secs(), 6);
    clock.advance(Duration::from_millis(4_500));
    let refused = free.check("ana", 1).unwrap();
    assert_eq!(refused.retry_after(), Duration::from_millis(1_500));
    assert_eq!(refused.retry_after_secs(), 2);
}

/// A reload reaches a handle made before it, on its fast path and off it.
#[test]
fn a_handle_follows_reloads() {
    let limiter = limiter(&FakeClock::new(), Extra::Nothing, false).limiter;
    let free = limiter.sync_tier("free").unwrap();
    assert_eq!(free.check("ana", 1).unwrap().limit, 10);
    limiter.reload(tiers(1));
    let answer = free.check("ana", 1).unwrap();
    assert_eq!((answer.limit, answer.remaining), (5, 3));
    // A window: the full path decides it.
    limiter.reload(tiers(2));
    let answer = free.check("ana", 1).unwrap();
    assert_eq!((answer.limit, answer.remaining), (3, 2));
    // Removed: the unknown-tier policy (refused, never unlimited).
    limiter.reload(tiers(3));
    assert!(!free.check("ana", 1).unwrap().allowed);
    limiter.reload(tiers(0));
    assert_eq!(free.check("ana", 1).unwrap().limit, 10);
}

/// A handle is made only where every check is decided at once.
#[test]
fn a_handle_needs_the_memory_store_no_waiting_and_a_known_tier() {
    let reason = |result: Result<SyncTier, ConfigError>| match result {
        Err(ConfigError::NotSync { why, .. }) => why,
        other => panic!("{other:?}"),
    };
    let free = || RateTier::builder().tier("free", Quota::per_minute(10));
    let remote = free()
        .storage(Arc::new(Remote::new(MemoryStorage::new())))
        .build();
    let waiting = free().wait_up_to(Duration::from_secs(1)).build();
    let plain = free().build();
    for (limiter, tier, why) in [
        (&remote, "free", "its store is not the memory store"),
        (&waiting, "free", "its requests may wait for their turn"),
        (&plain, "fre", "it is not a configured tier"),
    ] {
        assert_eq!(reason(limiter.sync_tier(tier)), why);
    }
    let error = plain.sync_tier("gold").unwrap_err().to_string();
    assert!(error.contains("\"gold\""), "{error}");
}

/// The GCRA math refuses a clock beyond 2^53 µs: the tiers' storage-error
/// policy answers, as for `check`.
#[tokio::test(flavor = "current_thread")]
async fn a_store_that_cannot_decide_follows_the_policy() {
    let clock = FakeClock::at_us(1 << 54);
    let limiter = limiter(&clock, Extra::Nothing, false).limiter;
    let free = limiter.sync_tier("free").unwrap();
    let answered = free.check("ana", 1).map_err(|e| e.to_string());
    let checked = words(limiter.check("ana", "free", 1).await);
    assert_eq!(answered, checked);
    // The default policy: a 503, never a pass nor a refusal.
    assert!(answered.is_err(), "{answered:?}");
}

/// One handle shared by threads: exactly the burst passes, however the
/// checks interleave.
#[test]
fn threads_sharing_a_handle_pass_exactly_the_burst() {
    fn shared<T: Send + Sync + Clone>(_: &T) {}
    let limiter = RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(1000))
        .build();
    let free = limiter.sync_tier("free").unwrap();
    shared(&free);
    let passed = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..400 {
                    if free.check("ana", 1).unwrap().allowed {
                        passed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    assert_eq!(passed.load(Ordering::SeqCst), 1000);
}
