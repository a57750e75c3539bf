//! Scenarios that every store must pass through the limiter, written once
//! and run by each store's tests.

use rate_tier_test_support::unique;
use tower_rate_tier::{Limit, LimitReason, LimitRequest, Quota, RateTier};

/// Three limits of one request (per user, per address, global), each in
/// turn the one that refuses: the refusal names it, and every limit keeps
/// what the passing request charged, nothing more. `instance` builds a
/// limiter whose tier `tier` allows 10 per minute, on the store under test.
pub async fn a_refusal_in_any_position_charges_nothing(
    instance: impl AsyncFn(&str) -> RateTier,
    user_id: &str,
) {
    for tight in 0..3 {
        let tier = unique("free");
        let tiers = instance(&tier).await;
        let quota =
            |i: usize| Quota::per_minute(if i == tight { 1 } else { 5 });
        let user = Limit::new(unique("user"), quota(0));
        let ip = Limit::new(unique("ip"), quota(1)).keyed_by(|_| None);
        let global = Limit::new(unique("global"), quota(2)).global();
        let request = |cost| {
            LimitRequest::new(user_id, &tier, cost)
                .limit(&user, cost)
                .limit_keyed(&ip, "203.0.113.7", cost)
                .limit(&global, cost)
        };
        let names = [user.name(), ip.name(), global.name()];
        tiers.decide(&request(1)).await.expect("storage").unwrap();
        for _ in 0..3 {
            let refused = tiers
                .decide(&request(1))
                .await
                .expect("storage")
                .unwrap_err();
            assert_eq!(refused.limit_name(), names[tight], "tight {tight}");
            assert_eq!(refused.reason(), LimitReason::RateLimited);
            assert_eq!(refused.retry_after_secs(), 60);
        }
        let read = tiers.decide(&request(0)).await.expect("storage").unwrap();
        let left: Vec<u64> = read.limits().map(|l| l.remaining).collect();
        let mut expected = vec![9];
        expected.extend((0..3).map(|i| if i == tight { 0 } else { 4 }));
        assert_eq!(left, expected, "tight {tight}");
    }
}
