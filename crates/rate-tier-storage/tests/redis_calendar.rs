//! Calendar periods decided by `decide_mixed.lua` on a real Redis, across
//! the instants where they end: the end of a month (and of the year), of a
//! leap-year February in UTC and at UTC+05:30, and of an ISO week. Exactly
//! the limit passes before the boundary, across two instances; the next one
//! is refused until the next period's first instant (to within the few
//! hundred µs between two readings of Redis's clock); exactly the limit
//! passes again right after it, and a period that does not end there goes
//! on refusing.
//!
//! The period is decided on Redis's own clock (`TIME`), which no fake clock
//! of this process reaches: each test starts a Redis of its own whose wall
//! clock reads two seconds before the boundary
//! ([`RedisServer::start_at`]: an `LD_PRELOAD` library built by
//! rate-tier-test-support), and waits those real seconds for it to cross.
//! Every boundary is derived from gcra-core's `Period` (`start_of`,
//! `next_start`), whose calendar is proven against a naive one by its
//! property tests; the dates below are the inputs, checked against what
//! the calendar says of them (31 days in December, 29 in February 2028, a
//! Monday).
//!
//! Run with `cargo xtask test-redis -- -p rate-tier-storage --test
//! redis_calendar` (or any way that finds a Redis: `redis-server`, or
//! Docker, whose containers get the library copied in). Without a Redis,
//! or where the fake clock cannot be set (not Linux, no C compiler), these
//! tests fail, never pass silently.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant, UNIX_EPOCH};

use rate_tier_storage::StorageExt;
use rate_tier_storage::{
    BucketCheck, Decision, KeyLayout, LimitName, Period, PeriodUnit,
    RedisStorage,
};
use redis::aio::ConnectionManager;

use rate_tier_test_support::{
    RedisServer, TEST_TIMEOUT, concurrent_passes, unique,
};

const SECOND: u64 = 1_000_000;
const HOUR: u64 = 3600 * SECOND;
const DAY: u64 = 24 * HOUR;
/// How long before the boundary the server's clock starts: time enough to
/// start it (a container too) and spend every limit, well under 100 ms
/// here. These seconds are waited for real: Redis's clock cannot be moved
/// once it runs.
const LEAD: Duration = Duration::from_secs(2);
/// How far a record's PTTL may be from the end of its period, in ms.
const TTL_SLACK_MS: u64 = 50;
/// India's offset from UTC, in seconds.
const INDIA: i32 = 5 * 3600 + 1800;

/// 2026-12-01T00:00:00Z, a Tuesday.
const DEC_1_2026: u64 = 1_796_083_200 * SECOND;
/// 2027-01-01T00:00:00Z, a Friday.
const JAN_1_2027: u64 = 1_798_761_600 * SECOND;
/// 2028-02-01T00:00:00Z (2028 is a leap year).
const FEB_1_2028: u64 = 1_832_976_000 * SECOND;

fn period(limit: u32, unit: PeriodUnit, offset_s: i32) -> Period {
    Period::new(limit, unit, offset_s).unwrap()
}

/// A period of the test, and whether one of its periods starts at the
/// boundary (what the calendar says: checked against gcra-core).
struct Case {
    rule: Period,
    resets: bool,
}

fn resets(rule: Period) -> Case {
    Case { rule, resets: true }
}

fn goes_on(rule: Period) -> Case {
    Case {
        rule,
        resets: false,
    }
}

async fn connect(server: &RedisServer) -> ConnectionManager {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap_or_else(|e| panic!("{server}: {e}"))
}

/// A store with its own connection, like a separate instance; every
/// answer from Redis itself (no refusal remembered here).
async fn store(server: &RedisServer) -> RedisStorage {
    RedisStorage::new(connect(server).await)
        .timeout(TEST_TIMEOUT)
        .remember_refusals(false)
}

/// Redis's `TIME`, in µs.
async fn redis_now(conn: &mut ConnectionManager) -> u64 {
    let (secs, micros): (u64, u64) =
        redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * SECOND + micros
}

/// One decision of `check`, answered by Redis.
async fn decide(store: &RedisStorage, check: BucketCheck<'_>) -> Decision {
    let mut out = [Decision::default()];
    let decided = store.check(&[check], &mut out).await.expect("check");
    assert_eq!(decided.by, "redis");
    assert_eq!(decided.verdict.allowed, out[0].allowed);
    if !out[0].allowed {
        assert_eq!(decided.verdict.retry_after_us, out[0].retry_after_us);
    }
    out[0]
}

/// A bucket of a case: its limit's name, its rule, and whether its record
/// is made to outlive its period.
struct Bucket {
    name: LimitName,
    rule: Period,
    resets: bool,
    linger: bool,
}

impl Bucket {
    fn check(&self) -> BucketCheck<'_> {
        BucketCheck::of_rule(&self.name, "ana", self.rule.into(), 1).unwrap()
    }
}

/// `attempts` concurrent decisions through the two instances: how many
/// passed.
async fn passes(
    a: &RedisStorage,
    b: &RedisStorage,
    bucket: &Bucket,
    attempts: usize,
) -> usize {
    let (name, rule) = (bucket.name.clone(), bucket.rule);
    concurrent_passes(a.clone(), b.clone(), attempts, move |store| {
        let name = name.clone();
        async move {
            let check =
                BucketCheck::of_rule(&name, "ana", rule.into(), 1).unwrap();
            decide(&store, check).await.allowed
        }
    })
    .await
}

/// A decision that must be refused until the period after the one that
/// holds Redis's clock, read just before and just after it: the retry and
/// the reset are that period's first instant less the decision's time,
/// which lies between the two readings. Returns the later reading.
async fn refused_until_the_next_period(
    store: &RedisStorage,
    conn: &mut ConnectionManager,
    bucket: &Bucket,
    what: &str,
) -> u64 {
    let before = redis_now(conn).await;
    let decision = decide(store, bucket.check()).await;
    let after = redis_now(conn).await;
    let next = bucket.rule.next_start(before).unwrap();
    assert_eq!(
        bucket.rule.next_start(after).unwrap(),
        next,
        "{what}: the decision straddled the boundary; \
         it cannot be told which period it belongs to"
    );
    assert!(
        !decision.allowed,
        "{what}: {:?} let one more pass",
        bucket.rule
    );
    for (field, value) in [
        ("retry_after", decision.retry_after_us),
        ("reset_after", decision.reset_after_us),
    ] {
        assert!(
            (next - after..=next - before).contains(&value),
            "{what}: {:?}: {field} {value} µs; the next period starts at {next} µs, \
             {} to {} µs after the decision",
            bucket.rule,
            next - after,
            next - before
        );
    }
    after
}

/// The period's record, `start:count` (the start in µs).
async fn record(conn: &mut ConnectionManager, bucket: &Bucket) -> String {
    redis::cmd("GET")
        .arg(bucket.check().key(KeyLayout::Single))
        .query_async(conn)
        .await
        .unwrap()
}

/// The record's time to live, in ms.
async fn pttl(conn: &mut ConnectionManager, bucket: &Bucket) -> u64 {
    redis::cmd("PTTL")
        .arg(bucket.check().key(KeyLayout::Single))
        .query_async(conn)
        .await
        .unwrap()
}

/// The test: a Redis whose clock starts [`LEAD`] before `boundary`; each
/// case's limit spent before it, by exactly its limit, and again after it
/// if one of its periods starts there, else still refused.
async fn across(boundary: u64, cases: &[Case]) {
    for case in cases {
        assert_eq!(
            case.rule.start_of(boundary).unwrap() == boundary,
            case.resets,
            "the calendar says {:?} {} at {boundary} µs; gcra-core does not",
            case.rule,
            if case.resets {
                "starts a period"
            } else {
                "starts none"
            }
        );
    }
    let server = RedisServer::start_at(
        UNIX_EPOCH + Duration::from_micros(boundary) - LEAD,
    );
    let (a, b) = (store(&server).await, store(&server).await);
    let mut conn = connect(&server).await;
    // A period that starts at the boundary twice: a record that expires
    // there, as written, and one that outlives it (its TTL is rounded up to
    // the ms; a promoted replica may hold it longer), whose count must not
    // be carried into the new period either.
    let buckets: Vec<Bucket> = cases
        .iter()
        .flat_map(|case| {
            let lingers: &[bool] = if case.resets {
                &[false, true]
            } else {
                &[false]
            };
            lingers.iter().map(|&linger| Bucket {
                name: LimitName::new(unique("cal")).unwrap(),
                rule: case.rule,
                resets: case.resets,
                linger,
            })
        })
        .collect();

    // Before the boundary: exactly the limit, then refused until the next
    // period starts.
    for bucket in &buckets {
        let limit = bucket.rule.limit() as usize;
        let passed = passes(&a, &b, bucket, 2 * limit + 4).await;
        assert_eq!(passed, limit, "before the boundary: {:?}", bucket.rule);
        let after =
            refused_until_the_next_period(&a, &mut conn, bucket, "before")
                .await;
        assert!(
            after < boundary,
            "{server}'s clock reached the boundary ({boundary} µs) at {after} µs, \
             before the limits were spent: it took more than {LEAD:?} to start and \
             spend them"
        );
        let start = bucket.rule.start_of(after).unwrap();
        assert_eq!(record(&mut conn, bucket).await, format!("{start}:{limit}"));
        // Kept until its period ends: to the ms, and a few ms more since
        // Redis reads its clock for a TTL when it likes (its cached time),
        // not at our TIME (2 ms apart was seen in a container).
        let next = bucket.rule.next_start(after).unwrap();
        let early = redis_now(&mut conn).await;
        let pttl = pttl(&mut conn, bucket).await;
        let late = redis_now(&mut conn).await;
        let slack = TTL_SLACK_MS;
        assert!(
            (next - late) / 1000 <= pttl + slack
                && pttl <= (next - early) / 1000 + 1 + slack,
            "{:?}: PTTL {pttl} ms; its period ends {} to {} ms later",
            bucket.rule,
            (next - late) / 1000,
            (next - early) / 1000
        );
        if bucket.linger {
            let _: () = redis::cmd("PEXPIRE")
                .arg(bucket.check().key(KeyLayout::Single))
                .arg(60_000)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }

    // Real time: Redis's clock crosses the boundary at the real pace.
    let deadline = Instant::now() + LEAD + Duration::from_secs(5);
    loop {
        let now = redis_now(&mut conn).await;
        if now >= boundary {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{server}'s clock never reached {boundary} µs (it reads {now} µs)"
        );
        let left = Duration::from_micros(boundary - now);
        tokio::time::sleep(left.min(Duration::from_millis(200))).await;
    }

    // After it: the periods that start there pass exactly their limit
    // again, counted from the boundary; the others go on refusing until
    // their own next period.
    for bucket in &buckets {
        let limit = bucket.rule.limit() as usize;
        let passed = passes(&a, &b, bucket, 2 * limit + 4).await;
        let expected = if bucket.resets { limit } else { 0 };
        assert_eq!(
            passed, expected,
            "after the boundary: {:?} (its record outlived its period: {})",
            bucket.rule, bucket.linger
        );
        refused_until_the_next_period(&b, &mut conn, bucket, "after").await;
        let start = if bucket.resets {
            boundary
        } else {
            bucket.rule.start_of(boundary).unwrap()
        };
        assert_eq!(
            record(&mut conn, bucket).await,
            format!("{start}:{limit}"),
            "after the boundary: {:?}",
            bucket.rule
        );
    }
}

/// 2026 ends: a month and a day in UTC, not the ISO week (2027 begins on a
/// Friday) nor the month in UTC-08:00 (still 16:00 on December 31st).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_month_ends_with_the_year() {
    let monthly = period(3, PeriodUnit::Month, 0);
    let boundary = monthly.next_start(DEC_1_2026).unwrap();
    assert_eq!(boundary - DEC_1_2026, 31 * DAY, "December has 31 days");
    assert_eq!(boundary, JAN_1_2027);
    across(
        boundary,
        &[
            resets(monthly),
            resets(period(4, PeriodUnit::Day, 0)),
            goes_on(period(5, PeriodUnit::Week, 0)),
            goes_on(period(2, PeriodUnit::Month, -8 * 3600)),
        ],
    )
    .await;
}

/// A leap-year February ends after its 29th day, in UTC: the month and the
/// day, not the ISO week (March 1st, 2028 is a Wednesday) nor the month at
/// UTC+05:30 (whose March began at 18:30 UTC the day before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leap_february_ends_after_its_29th_in_utc() {
    let monthly = period(3, PeriodUnit::Month, 0);
    let boundary = monthly.next_start(FEB_1_2028).unwrap();
    assert_eq!(boundary - FEB_1_2028, 29 * DAY, "February 2028 has 29 days");
    across(
        boundary,
        &[
            resets(monthly),
            resets(period(4, PeriodUnit::Day, 0)),
            goes_on(period(5, PeriodUnit::Week, 0)),
            goes_on(period(2, PeriodUnit::Month, INDIA)),
        ],
    )
    .await;
}

/// The same February ends at UTC+05:30 at 18:30 UTC on the 29th: the month
/// and the day there, not the month in UTC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leap_february_ends_at_18_30_utc_in_india() {
    let india = period(3, PeriodUnit::Month, INDIA);
    let boundary = india.next_start(FEB_1_2028).unwrap();
    let utc_march_1 = period(1, PeriodUnit::Month, 0)
        .next_start(FEB_1_2028)
        .unwrap();
    assert_eq!(
        boundary,
        utc_march_1 - 5 * HOUR - HOUR / 2,
        "India's March 1st begins at 18:30 UTC on February 29th"
    );
    across(
        boundary,
        &[
            resets(india),
            resets(period(4, PeriodUnit::Day, INDIA)),
            goes_on(period(5, PeriodUnit::Month, 0)),
        ],
    )
    .await;
}

/// An ISO week ends on Sunday night: the week and the day in UTC, not the
/// month, nor the week at UTC-07:00 (still Sunday, 17:00).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_iso_week_ends_on_sunday_night() {
    let weekly = period(3, PeriodUnit::Week, 0);
    let boundary = weekly.next_start(JAN_1_2027).unwrap();
    assert_eq!(boundary, JAN_1_2027 + 3 * DAY, "Friday to Monday");
    // 1970-01-01 was a Thursday: 4 days before a Monday.
    assert_eq!((boundary / DAY + 3) % 7, 0, "a Monday");
    across(
        boundary,
        &[
            resets(weekly),
            resets(period(4, PeriodUnit::Day, 0)),
            goes_on(period(5, PeriodUnit::Month, 0)),
            goes_on(period(2, PeriodUnit::Week, -7 * 3600)),
        ],
    )
    .await;
}
