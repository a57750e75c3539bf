//! `RateTier::reset`: a customer's buckets back to full on every tier (the
//! one they upgraded from too) and their own limits; another customer's
//! and a global limit's untouched. Fake clock, memory.
#![allow(clippy::unwrap_used, missing_docs)]

use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Limit, LimitRequest, Quota, RateTier};

#[tokio::test]
async fn a_reset_refills_every_tier_and_the_customers_limits() {
    let clock = FakeClock::at_us(1_000_000_000);
    let tiers = RateTier::builder()
        .tier("free", Quota::per_hour(2))
        .tier("pro", Quota::per_hour(3))
        .clock(clock)
        .build();
    let search = Limit::new("search", Quota::per_hour(1));
    let everyone = Limit::new("everyone", Quota::per_hour(2)).global();
    // Ada spends free, then pro, and search; bea spends free.
    for tier in ["free", "pro"] {
        while tiers.check("ada", tier, 1).await.unwrap().is_ok() {}
    }
    let spend = LimitRequest::new("ada", "pro", 0)
        .limit(&search, 1)
        .limit(&everyone, 1);
    assert!(tiers.decide(&spend).await.unwrap().is_ok());
    while tiers.check("bea", "free", 1).await.unwrap().is_ok() {}

    tiers.reset("ada", &[&search, &everyone]).await.unwrap();

    let free = tiers.check("ada", "free", 1).await.unwrap().unwrap();
    let pro = tiers.check("ada", "pro", 1).await.unwrap().unwrap();
    assert_eq!((free.remaining, pro.remaining), (1, 2));
    let request = LimitRequest::new("ada", "pro", 0).limit(&search, 1);
    assert!(
        tiers.decide(&request).await.unwrap().is_ok(),
        "search refilled"
    );
    assert!(
        tiers.check("bea", "free", 1).await.unwrap().is_err(),
        "bea's stays spent"
    );
    // The global limit is everyone's: not hers to reset (1 of 2 left).
    let global = LimitRequest::new("eva", "pro", 0).limit(&everyone, 1);
    let info = tiers.decide(&global).await.unwrap().unwrap();
    let left = info
        .limits()
        .find(|l| l.name == "everyone")
        .unwrap()
        .remaining;
    assert_eq!(left, 0);
}
