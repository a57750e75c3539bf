//! A calendar period through the HTTP layer on a real Redis, across the end
//! of a leap-year February: `exports`, 3 a month, passes 3 on February
//! 29th, 2028, refuses the 4th until March 1st (`retry-after`,
//! `x-ratelimit-reset`, `RateLimit-Policy`'s `w` of 29 days), and passes 3
//! again right after midnight (with a `w` of 31 days).
//!
//! The period is decided on Redis's clock, so the test starts a Redis of
//! its own whose wall clock reads two seconds before March 1st
//! ([`RedisServer::start_at`]), and waits those seconds for real. The
//! limiter's own clock (what `x-ratelimit-reset` and the policy's `w` are
//! reckoned on) is the system's, shifted by as much: in production both
//! clocks read the same time. The boundary comes from gcra-core's `Period`;
//! the store's side is proven in rate-tier-storage's `redis_calendar.rs`.
//!
//! Run with `cargo xtask test-redis -- -p tower-rate-tier --test
//! redis_calendar`; without a Redis (`redis-server`, or Docker), or where
//! the fake clock cannot be set, it fails, never passes silently.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use http::StatusCode;
use rate_tier_test_support::{RedisServer, TEST_TIMEOUT, unique};
use redis::aio::ConnectionManager;
use support::http::{Reply, get_as};
use tower_rate_tier::clock::Clock;
use tower_rate_tier::layer::HeaderStyle;
use tower_rate_tier::{
    Limit, Period, PeriodUnit, Quota, RateTier, RedisStorage, TierIdentity,
    TierLimitLayer,
};

const SECOND: u64 = 1_000_000;
const DAY: u64 = 86_400 * SECOND;
/// How long before March 1st Redis's clock starts: waited for real.
const LEAD: Duration = Duration::from_secs(2);
/// 2028-02-01T00:00:00Z (2028 is a leap year).
const FEB_1_2028: u64 = 1_832_976_000 * SECOND;

/// The system's clock, shifted to read what Redis's reads.
#[derive(Debug)]
struct Shifted {
    offset_us: i64,
}

impl Clock for Shifted {
    fn now_us(&self) -> u64 {
        let real = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64;
        (real + self.offset_us) as u64
    }
}

/// Redis's `TIME`, in µs.
async fn redis_now(conn: &mut ConnectionManager) -> u64 {
    let (secs, micros): (u64, u64) =
        redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * SECOND + micros
}

/// How far Redis's clock is ahead of the system's, read once (to within
/// the round trip of one `TIME`, well under a millisecond here).
async fn offset_us(conn: &mut ConnectionManager) -> i64 {
    let real = || {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64
    };
    let before = real();
    let redis = redis_now(conn).await as i64;
    let after = real();
    redis - (before + after) / 2
}

/// `GET /export` as `key_ana`, with Redis's clock read just before and
/// just after it.
async fn export(
    app: &Router,
    conn: &mut ConnectionManager,
) -> (Reply, u64, u64) {
    let before = redis_now(conn).await;
    let reply = get_as(app, Some("key_ana"), "/export").await;
    let after = redis_now(conn).await;
    (reply, before, after)
}

/// Three exports pass, the fourth is refused until the period after the
/// one of Redis's clock: `retry-after` is its first instant less the
/// request's time, in whole seconds rounded up; `x-ratelimit-reset` is
/// that instant (the limiter's clock is within a millisecond of Redis's:
/// the whole second of the instant, or the next one); the policy's `w` is
/// the length of the period.
async fn spend_the_month(
    app: &Router,
    conn: &mut ConnectionManager,
    monthly: Period,
    exports: &str,
) -> u64 {
    for left in (0..monthly.limit()).rev() {
        let r = get_as(app, Some("key_ana"), "/export").await;
        assert_eq!(
            (r.status, r.remaining()),
            (StatusCode::OK, u64::from(left))
        );
    }
    let (r, before, after) = export(app, conn).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert!(r.body.contains(&format!(r#""limit":"{exports}""#)), "{r:?}");
    let (start, next) = (
        monthly.start_of(before).unwrap(),
        monthly.next_start(before).unwrap(),
    );
    assert_eq!(monthly.next_start(after).unwrap(), next, "straddled");
    let retry = r.retry_after();
    assert!(
        ((next - after).div_ceil(SECOND)..=(next - before).div_ceil(SECOND))
            .contains(&retry),
        "retry-after {retry}; the next month starts at {next} µs, {} to {} µs later",
        next - after,
        next - before
    );
    let reset: u64 = r.header("x-ratelimit-reset").unwrap().parse().unwrap();
    assert!(
        [next / SECOND, next / SECOND + 1].contains(&reset),
        "x-ratelimit-reset {reset}; the next month starts at {} s",
        next / SECOND
    );
    let policy = r.header("ratelimit-policy").unwrap();
    let w = (next - start) / SECOND;
    assert!(
        policy.contains(&format!(r#""{exports}";q={};w={w}"#, monthly.limit())),
        "{policy}: expected a w of {w} s"
    );
    after
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_month_quota_through_the_layer_resets_when_a_leap_february_ends() {
    let monthly = Period::new(3, PeriodUnit::Month, 0).unwrap();
    let march_1 = monthly.next_start(FEB_1_2028).unwrap();
    assert_eq!(march_1 - FEB_1_2028, 29 * DAY, "February 2028 has 29 days");

    let server = RedisServer::start_at(
        UNIX_EPOCH + Duration::from_micros(march_1) - LEAD,
    );
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let clock = Shifted {
        offset_us: offset_us(&mut conn).await,
    };
    // The store as configured by default (refusals remembered too).
    let store = RedisStorage::new(conn.clone()).timeout(TEST_TIMEOUT);
    let tier = unique("free");
    let tiers = RateTier::builder()
        .tier(&tier, Quota::per_minute(100))
        .storage(Arc::new(store))
        .clock(clock)
        .build();
    let exports = unique("exports");
    let plan = tier.clone();
    let layer = TierLimitLayer::new(tiers)
        .identifier_fn(move |headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, plan.clone()))
        })
        .limit(
            Limit::new(exports.clone(), monthly)
                .when(|req| req.uri.path() == "/export"),
        )
        .headers(HeaderStyle::Both);
    let app = Router::new()
        .route("/export", axum::routing::get(|| async { "ok\n" }))
        .layer(layer);

    // February 29th, 23:59:58: February's three, then refused.
    let after = spend_the_month(&app, &mut conn, monthly, &exports).await;
    assert!(
        after < march_1,
        "{server}'s clock reached March 1st before February's exports were spent"
    );

    // Real time, until Redis's clock is past midnight, and a little more:
    // a refusal the store remembers lasts its wait from when its answer
    // arrived, a fraction of a millisecond after Redis decided.
    let deadline = Instant::now() + LEAD + Duration::from_secs(5);
    while redis_now(&mut conn).await < march_1 + 100_000 {
        assert!(
            Instant::now() < deadline,
            "{server}'s clock never reached March"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // March 1st: three again, then refused until April (a w of 31 days).
    spend_the_month(&app, &mut conn, monthly, &exports).await;
}
