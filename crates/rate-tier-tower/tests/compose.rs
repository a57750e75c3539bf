//! Where two features meet, or two instances configured differently share
//! one store, no limit goes: waiting beside bans, an instance that waits
//! beside one that does not, a long ban read by an instance that did not
//! give it, a settlement of a limit not declared settled. Tokio's paused
//! clock (the memory store reads it too), or a fake clock.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tower_rate_tier::clock::{Clock, FakeClock};
use tower_rate_tier::{
    Ban, Error, Limit, LimitReason, LimitRequest, MemoryStorage, Quota,
    RateTier, Settle, Storage, Window, rules::Adjust,
};

/// Tokio's clock, paused in these tests: waits take no real time.
#[derive(Debug, Clone)]
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now_us(&self) -> u64 {
        1_000_000_000 + self.0.elapsed().as_micros() as u64
    }
}

const SECOND: Duration = Duration::from_secs(1);

/// Free: one a second, one at once.
fn one_a_second() -> Quota {
    Quota::per_second(1).allow_burst(1)
}

/// Passes at once, or after a wait: the instant it was served, if it was.
async fn served_at(tiers: &RateTier, user: &str) -> Option<Instant> {
    let outcome = tiers.check(user, "free", 1).await.unwrap();
    outcome.ok().map(|_| Instant::now())
}

#[tokio::test(start_paused = true)]
async fn requests_waiting_for_their_slot_ban_no_one_and_delay_nothing_else() {
    let clock = TokioClock(Instant::now());
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(100))
        .clock(clock)
        .wait_up_to(Duration::from_secs(5))
        .ban(Ban::after(3, Duration::from_secs(60)))
        .build();
    let search = Limit::new("search", one_a_second());
    let login = Limit::new("login", Window::new(5, 60 * SECOND).unwrap());
    let start = Instant::now();

    // Three searches at once: one passes, two wait for their slots (1 s and
    // 2 s away), holding reservations in search's bucket and the tier's.
    let searching: Vec<_> = (0..3)
        .map(|_| {
            let (tiers, search) = (tiers.clone(), search.clone());
            tokio::spawn(async move {
                let request =
                    LimitRequest::new("ana", "free", 1).limit(&search, 1);
                tiers
                    .decide(&request)
                    .await
                    .unwrap()
                    .map(|_| Instant::now())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(10)).await;

    // Meanwhile her login (a window: never waits) is served at once, not
    // refused as banned, and a request of the tier alone, which has room,
    // is served at once too: nothing waits behind the searches.
    let request = LimitRequest::new("ana", "free", 1).limit(&login, 1);
    let outcome = tiers.decide(&request).await.unwrap();
    assert!(
        outcome.is_ok(),
        "login: {:?}",
        outcome.err().map(|l| l.reason())
    );
    let asked = Instant::now();
    assert!(tiers.check("ana", "free", 1).await.unwrap().is_ok());
    assert_eq!(asked.elapsed(), Duration::ZERO);

    let mut served = Vec::new();
    for search in searching {
        served.push(search.await.unwrap().unwrap().duration_since(start));
    }
    served.sort();
    assert_eq!(served, [Duration::ZERO, SECOND, 2 * SECOND]);
    // No ban came of it: a request later is served.
    let later = tiers.decide(&LimitRequest::new("ana", "free", 1)).await;
    assert!(later.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_banned_customer_waits_for_nothing_and_is_refused_at_once() {
    let clock = TokioClock(Instant::now());
    let store: Arc<dyn Storage> =
        Arc::new(MemoryStorage::with_clock(clock.clone()));
    let build = |wait: bool| {
        let builder = RateTier::builder()
            .tier("free", one_a_second())
            .clock(clock.clone())
            .storage(store.clone())
            .ban(Ban::after(2, Duration::from_secs(60)));
        match wait {
            true => builder.wait_up_to(Duration::from_secs(5)).build(),
            false => builder.build(),
        }
    };
    let (banning, waiting) = (build(false), build(true));
    // Spent, then refused twice on the instance that does not wait: banned.
    assert!(served_at(&banning, "eva").await.is_some());
    for _ in 0..2 {
        assert!(served_at(&banning, "eva").await.is_none());
    }
    // The waiting instance reads the ban from the store: refused at once,
    // as banned, not queued until the ban ends.
    let asked = Instant::now();
    let refused = waiting.check("eva", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(refused.reason(), LimitReason::Banned);
    assert_eq!(asked.elapsed(), Duration::ZERO);
}

/// At most `1 + span / T` requests pass in any span of a rate of burst 1
/// (T = 1 s here), served across every instance.
fn assert_within_rate(mut served: Vec<Instant>) {
    served.sort();
    for (i, first) in served.iter().enumerate() {
        for (j, last) in served.iter().enumerate().skip(i) {
            let span = last.duration_since(*first);
            let allowed = 1 + span.as_micros() / 1_000_000;
            assert!(
                (j - i + 1) as u128 <= allowed,
                "{} served in {span:?}: {:?}",
                j - i + 1,
                served
                    .iter()
                    .map(|s| s.duration_since(served[0]))
                    .collect::<Vec<_>>()
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_instance_that_does_not_wait_honours_the_slots_another_reserved() {
    let clock = TokioClock(Instant::now());
    let store: Arc<dyn Storage> =
        Arc::new(MemoryStorage::with_clock(clock.clone()));
    let waiting = RateTier::builder()
        .tier("free", one_a_second())
        .clock(clock.clone())
        .storage(store.clone())
        .wait_up_to(Duration::from_secs(5))
        .build();
    let checking = RateTier::builder()
        .tier("free", one_a_second())
        .clock(clock.clone())
        .storage(store.clone())
        .build();
    let mut tasks = Vec::new();
    for _ in 0..6 {
        // Each second: three requests on the waiting instance (they reserve
        // slots up to 5 s ahead) and two on the other.
        for _ in 0..3 {
            let tiers = waiting.clone();
            tasks.push(tokio::spawn(
                async move { served_at(&tiers, "ana").await },
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        for _ in 0..2 {
            let tiers = checking.clone();
            tasks.push(tokio::spawn(
                async move { served_at(&tiers, "ana").await },
            ));
        }
        tokio::time::sleep(SECOND - Duration::from_millis(10)).await;
    }
    let mut served = Vec::new();
    for task in tasks {
        served.extend(task.await.unwrap());
    }
    assert_within_rate(served);
}

#[tokio::test]
async fn a_ban_of_a_day_lasts_a_day_on_an_instance_that_did_not_give_it() {
    const DAY: Duration = Duration::from_secs(24 * 3600);
    let clock = FakeClock::at_us(1_000_000_000);
    let store: Arc<dyn Storage> =
        Arc::new(MemoryStorage::with_clock(clock.clone()));
    let build = || {
        RateTier::builder()
            .tier("free", Quota::per_minute(1))
            .clock(clock.clone())
            .storage(store.clone())
            .ban(
                Ban::after(1, Duration::from_secs(60))
                    .lasting(DAY)
                    .up_to(DAY),
            )
            .build()
    };
    let (banning, other) = (build(), build());
    banning.check("eva", "free", 1).await.unwrap().unwrap();
    let refused = banning.check("eva", "free", 1).await.unwrap().unwrap_err();
    assert_eq!(refused.reason(), LimitReason::RateLimited);
    // Banned: the other instance reads it, to the last second of the day.
    for at in [Duration::from_secs(12 * 3600), DAY - SECOND] {
        clock.set_us(1_000_000_000 + at.as_micros() as u64);
        let refused = other.check("eva", "free", 1).await.unwrap().unwrap_err();
        assert_eq!(refused.reason(), LimitReason::Banned, "at {at:?}");
        assert_eq!(refused.retry_after(), DAY - at);
    }
    clock.set_us(1_000_000_000 + DAY.as_micros() as u64);
    assert!(other.check("eva", "free", 1).await.unwrap().is_ok());
}

#[tokio::test]
async fn settling_a_limit_not_declared_settled_is_refused_and_changes_nothing()
{
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .build();
    let plain = Limit::new("tokens", Quota::per_minute(1000));
    let request = LimitRequest::new("ana", "free", 1).limit(&plain, 1);
    let info = tiers.decide(&request).await.unwrap().unwrap();
    let settled = tiers
        .settle("ana", &info, &plain, Adjust::between(1, 1_000_000))
        .await;
    assert!(
        matches!(settled, Err(Error::NotSettled(ref name)) if name == "tokens"),
        "{settled:?}"
    );
    // Nothing was charged: 998 of the 1000 are left after the next.
    let next = tiers.decide(&request).await.unwrap().unwrap();
    let tokens = next.limits().find(|s| s.name == "tokens").unwrap();
    assert_eq!(tokens.remaining, 998);

    // Declared settled, the debt is carried whole: 1000 minutes.
    let declared = Limit::new("tokens", Quota::per_minute(1000))
        .settle(Settle::from_header("x-tokens-used"));
    let request = LimitRequest::new("bea", "free", 1).limit(&declared, 1);
    let info = tiers.decide(&request).await.unwrap().unwrap();
    tiers
        .settle("bea", &info, &declared, Adjust::between(1, 1_000_000))
        .await
        .unwrap();
    let refused = tiers.decide(&request).await.unwrap().unwrap_err();
    assert!(
        refused.retry_after() > Duration::from_secs(999 * 60),
        "{:?}",
        refused.retry_after()
    );
}
