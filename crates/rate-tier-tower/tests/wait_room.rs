//! What the waiting room decides (`RateTierBuilder::wait_up_to`), beyond
//! the waits themselves (`layer_wait.rs`): a ban is read, never waited
//! for; a request of rates alone is one reservation; a request that passes
//! at once, or that a check passes after its reservation was refused, is
//! no refused wait; a request that goes away gives its slot back, at once
//! where the store needs no I/O and through a task where it does. On
//! Tokio's paused clock; the stores' clock stands still.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use rate_tier_storage::{Adjustment, Answer, Capabilities, Mode, StorageExt};
use tokio::time::Instant;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    Ban, Limit, LimitEvent, LimitReason, LimitRequest, MemoryStorage, Quota,
    RateTier, RateTierBuilder, Storage, StorageError, rules::RuleKind,
    storage::BucketCancel, storage::BucketCheck, storage::BucketSettle,
    storage::Decided, storage::Decision,
};

const SECOND: Duration = Duration::from_secs(1);

/// Memory, counting its checks and reservations. With `io`, it answers
/// nothing without I/O (as Redis: a reservation is given back through a
/// task); with `frees`, the buckets of a refused reservation are emptied
/// before it answers (another request's slot came back meanwhile).
#[derive(Debug)]
struct Counted {
    memory: MemoryStorage,
    io: bool,
    frees: AtomicBool,
    checks: AtomicUsize,
    reservations: AtomicUsize,
}

impl Counted {
    fn new(clock: &FakeClock, io: bool) -> Arc<Counted> {
        Arc::new(Counted {
            memory: MemoryStorage::with_clock(clock.clone()),
            io,
            frees: AtomicBool::new(false),
            checks: AtomicUsize::new(0),
            reservations: AtomicUsize::new(0),
        })
    }

    /// Checks and reservations made since the last call.
    fn calls(&self) -> (usize, usize) {
        (
            self.checks.swap(0, Ordering::SeqCst),
            self.reservations.swap(0, Ordering::SeqCst),
        )
    }
}

impl Counted {
    async fn check_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        self.memory.check(checks, out).await
    }

    async fn reserve_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        max_wait: Duration,
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        self.reservations.fetch_add(1, Ordering::SeqCst);
        let decided = self.memory.reserve(checks, max_wait, out).await?;
        if !decided.verdict.allowed && self.frees.load(Ordering::SeqCst) {
            self.memory.reset(checks).await?;
        }
        Ok(decided)
    }

    fn can_reserve(&self) -> bool {
        true
    }

    async fn cancel_reservations(
        &self,
        reserved: &[BucketCancel<'_>],
    ) -> Result<(), StorageError> {
        self.memory.cancel(reserved).await
    }

    fn cancel_in_process(
        &self,
        reserved: &[BucketCancel<'_>],
    ) -> Option<Result<(), StorageError>> {
        (!self.io)
            .then(|| self.memory.cancel(reserved).ready())
            .flatten()
    }

    async fn settle_buckets(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        self.memory.settle(settles).await
    }

    async fn reset_buckets(
        &self,
        buckets: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        self.memory.reset(buckets).await
    }

    fn decides(&self, kind: RuleKind) -> bool {
        self.memory.supports(kind)
    }
}

impl Storage for Counted {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        match mode {
            Mode::Check => Answer::pending(self.check_buckets(checks, out)),
            Mode::Reserve { max_wait } => {
                Answer::pending(self.reserve_buckets(checks, max_wait, out))
            }
        }
    }

    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        match adjustment {
            Adjustment::Settle(settles) => {
                Answer::pending(self.settle_buckets(settles))
            }
            Adjustment::Cancel(reserved) => {
                match self.cancel_in_process(reserved) {
                    Some(done) => Answer::Ready(done),
                    None => Answer::pending(self.cancel_reservations(reserved)),
                }
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
        let mut capabilities = Capabilities::new("custom");
        for kind in [RuleKind::Window, RuleKind::Period, RuleKind::Concurrency]
        {
            if self.decides(kind) {
                capabilities = capabilities.with(kind);
            }
        }
        capabilities.reserves = self.can_reserve();
        capabilities
    }
}

/// Free: one a second, a burst of 1, on `clock`; `refused` counts the
/// requests that would have waited and were refused.
fn limiter(clock: &FakeClock, refused: &Arc<AtomicUsize>) -> RateTierBuilder {
    let refused = refused.clone();
    RateTier::builder()
        .tier("free", Quota::per_second(1).allow_burst(1))
        .clock(clock.clone())
        .on_event(move |event| {
            if let LimitEvent::WaitRefused { .. } = event {
                refused.fetch_add(1, Ordering::SeqCst);
            }
        })
}

/// How long `user`'s request takes, and whether it is served.
async fn served(
    tiers: &RateTier,
    user: &str,
) -> (Duration, Option<LimitReason>) {
    let asked = Instant::now();
    let outcome = tiers.check(user, "free", 1).await.unwrap();
    (
        asked.elapsed(),
        outcome.err().map(|limited| limited.reason()),
    )
}

#[tokio::test(start_paused = true)]
async fn a_ban_shorter_than_the_wait_is_refused_at_once_not_waited_for() {
    let clock = FakeClock::new();
    let refused = Arc::new(AtomicUsize::new(0));
    let store: Arc<dyn Storage> =
        Arc::new(MemoryStorage::with_clock(clock.clone()));
    let ban = Ban::after(2, 60 * SECOND)
        .lasting(2 * SECOND)
        .up_to(2 * SECOND);
    let build = |wait: bool| {
        let builder = limiter(&clock, &refused).storage(store.clone()).ban(ban);
        match wait {
            true => builder.wait_up_to(5 * SECOND).build(),
            false => builder.build(),
        }
    };
    let (banning, waiting) = (build(false), build(true));
    // Spent, then refused twice where requests do not wait: banned for 2 s,
    // and the tier's next slot is in 1 s: both within the wait.
    assert_eq!(served(&banning, "eva").await.1, None);
    for _ in 0..2 {
        assert_eq!(
            served(&banning, "eva").await.1,
            Some(LimitReason::RateLimited)
        );
    }
    assert_eq!(
        served(&waiting, "eva").await,
        (Duration::ZERO, Some(LimitReason::Banned))
    );
    assert_eq!(refused.load(Ordering::SeqCst), 0, "no wait was refused");
}

#[tokio::test(start_paused = true)]
async fn a_request_that_passes_while_the_room_is_full_is_no_refused_wait() {
    let clock = FakeClock::new();
    let refused = Arc::new(AtomicUsize::new(0));
    let tiers = limiter(&clock, &refused)
        .wait_up_to(5 * SECOND)
        .max_waiting(1)
        .build();
    assert_eq!(served(&tiers, "ana").await.1, None);
    let waiting = {
        let tiers = tiers.clone();
        tokio::spawn(async move { served(&tiers, "ana").await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The room is full (ana waits her second); bea passes at once.
    assert_eq!(served(&tiers, "bea").await, (Duration::ZERO, None));
    assert_eq!(waiting.await.unwrap(), (SECOND, None));
    assert_eq!(refused.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_of_rates_alone_is_one_reservation_and_a_read_is_checked_first()
 {
    let clock = FakeClock::new();
    let refused = Arc::new(AtomicUsize::new(0));
    let store = Counted::new(&clock, false);
    let plain = limiter(&clock, &refused)
        .storage(store.clone())
        .wait_up_to(5 * SECOND)
        .build();
    assert_eq!(served(&plain, "ana").await.1, None);
    assert_eq!(store.calls(), (0, 1), "one reservation, no check");
    // With bans, a decision reads the ban's end: checked first, and,
    // passing, not reserved.
    let banning = limiter(&clock, &refused)
        .storage(store.clone())
        .ban(Ban::after(3, 60 * SECOND))
        .wait_up_to(5 * SECOND)
        .build();
    assert_eq!(served(&banning, "bea").await.1, None);
    assert_eq!(store.calls(), (1, 0), "one check, no reservation");
}

#[tokio::test(start_paused = true)]
async fn a_reservation_refused_while_its_bucket_frees_is_served_by_the_check() {
    let clock = FakeClock::new();
    let refused = Arc::new(AtomicUsize::new(0));
    let store = Counted::new(&clock, false);
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(1).allow_burst(1))
        .clock(clock.clone())
        .storage(store.clone())
        .wait_up_to(5 * SECOND)
        .on_event({
            let refused = refused.clone();
            move |event| {
                if let LimitEvent::WaitRefused { .. } = event {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
        .build();
    assert_eq!(served(&tiers, "ana").await.1, None);
    // Her next slot is a minute away: the reservation is refused, and her
    // bucket frees before the check that follows, which passes.
    store.frees.store(true, Ordering::SeqCst);
    store.calls();
    assert_eq!(served(&tiers, "ana").await, (Duration::ZERO, None));
    assert_eq!(store.calls(), (1, 1));
    assert_eq!(refused.load(Ordering::SeqCst), 0, "served, no refused wait");
}

/// ana is served, then waits a second for her next slot and goes away
/// after 10 ms; her next request is made as soon as she has gone, after
/// `settle` (which lets the tasks spawned meanwhile run, or not).
async fn goes_away_then_asks_again<F: Future<Output = ()>>(
    tiers: &RateTier,
    settle: impl FnOnce() -> F,
) -> Duration {
    assert_eq!(served(tiers, "ana").await.1, None);
    let waiting = {
        let tiers = tiers.clone();
        tokio::spawn(async move { served(&tiers, "ana").await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    settle().await;
    let (took, refused) = served(tiers, "ana").await;
    assert_eq!(refused, None);
    took
}

#[tokio::test(start_paused = true)]
async fn a_request_that_goes_away_gives_its_slot_back_at_once_without_io() {
    let clock = FakeClock::new();
    let refused = Arc::new(AtomicUsize::new(0));
    let tiers = limiter(&clock, &refused).wait_up_to(5 * SECOND).build();
    // Its slot is the next one's, with nothing run in between.
    let took = goes_away_then_asks_again(&tiers, || async {}).await;
    assert_eq!(took, SECOND);
}

/// The same, the request dropped in the test's own task: nothing else
/// runs between its going away and the next request's reservation.
#[tokio::test(start_paused = true)]
async fn a_request_dropped_gives_its_slot_back_before_another_task_runs() {
    let clock = FakeClock::new();
    let refused = Arc::new(AtomicUsize::new(0));
    let tiers = limiter(&clock, &refused).wait_up_to(5 * SECOND).build();
    assert_eq!(served(&tiers, "ana").await.1, None);
    let waited =
        tokio::time::timeout(Duration::from_millis(10), served(&tiers, "ana"))
            .await;
    assert!(waited.is_err(), "dropped while it waited");
    assert_eq!(served(&tiers, "ana").await, (SECOND, None));
}

#[tokio::test(start_paused = true)]
async fn a_request_that_goes_away_gives_its_slot_back_through_a_store_with_io()
{
    let clock = FakeClock::new();
    let refused = Arc::new(AtomicUsize::new(0));
    let tiers = limiter(&clock, &refused)
        .storage(Counted::new(&clock, true))
        .wait_up_to(5 * SECOND)
        .build();
    // Given back by a task of its own: once it ran, the slot is free.
    let took = goes_away_then_asks_again(&tiers, || async {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(took, SECOND);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_goes_away_gives_back_nothing_a_shadow_limit_refused() {
    const START_US: u64 = 1_000_000_000;
    let clock = FakeClock::at_us(START_US);
    let shadowed = Arc::new(AtomicUsize::new(0));
    let tiers = RateTier::builder()
        .tier("free", Quota::per_hour(3600))
        .clock(clock.clone())
        .wait_up_to(5 * SECOND)
        .on_event({
            let shadowed = shadowed.clone();
            move |event| {
                if let LimitEvent::ShadowLimited { .. } = event {
                    shadowed.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
        .build();
    // `search` in shadow, carrying no debt; `slow`, one a second.
    let search =
        Limit::new("search", Quota::per_minute(1).allow_debt(Duration::ZERO))
            .shadow();
    let slow = Limit::new("slow", Quota::per_second(1).allow_burst(1));
    fn request<'a>(limits: &[&'a Limit]) -> LimitRequest<'a> {
        limits
            .iter()
            .fold(LimitRequest::new("ana", "free", 1), |request, limit| {
                request.limit(limit, 1)
            })
    }
    assert!(tiers.decide(&request(&[&search])).await.unwrap().is_ok());
    // The clock goes back 30 s: `search` is now 30 s beyond what it may
    // hold. `slow` is spent.
    clock.set_us(START_US - 30_000_000);
    assert!(tiers.decide(&request(&[&slow])).await.unwrap().is_ok());
    // Waiting a second for `slow`'s slot, the request reserved `search`
    // refused in shadow (its capped TAT written); it goes away.
    let waiting = {
        let (tiers, search, slow) =
            (tiers.clone(), search.clone(), slow.clone());
        tokio::spawn(async move {
            let request = LimitRequest::new("ana", "free", 1)
                .limit(&search, 1)
                .limit(&slow, 1);
            tiers.decide(&request).await.unwrap().is_ok()
        })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    // `slow`'s slot came back; `search` was given back nothing it had not
    // charged: it still refuses, in shadow.
    let asked = Instant::now();
    assert!(
        tiers
            .decide(&request(&[&search, &slow]))
            .await
            .unwrap()
            .is_ok()
    );
    assert_eq!(asked.elapsed(), SECOND);
    assert_eq!(shadowed.load(Ordering::SeqCst), 1);
}
