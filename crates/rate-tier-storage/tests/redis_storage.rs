//! `RedisStorage` against a real Redis (and a few fake servers): one limit
//! shared by every instance, decisions over several buckets in one script
//! call, peek, settle and shadow limits, the keys and values, the scripts'
//! protocol, and the timeouts.
//!
//! Run with `cargo xtask test-redis`, which starts a throwaway redis-server
//! and sets `TRT_REDIS_URL`. Without it these tests fail: they never pass
//! silently, and they never use the shared Redis on port 6379.
//!
//! Every test uses its own limit names and user ids, so the tests can run in
//! parallel on one server. Quotas are per hour where an exact count is
//! checked: Redis's clock runs while a test does, and an hour's emission
//! interval is far longer than any test.

mod redis_support;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream as StdTcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use rate_tier_storage::StorageExt;
use rate_tier_storage::key::KeySecret;
use rate_tier_storage::{
    Adjust, BucketCheck, CheckError, Decided, Decision, KeyLayout, LimitName,
    Quota, RedisStorage, Storage, StorageError,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sha1::{Digest, Sha1};

use rate_tier_test_support::{
    Monitor, TEST_TIMEOUT, concurrent_passes, redis_url, unique,
};
use redis_support::{connect, store};

const SECOND: u64 = 1_000_000;
const MINUTE: u64 = 60 * SECOND;
const GCRA: &str = include_str!("../src/redis/gcra.lua");
const GCRA_ALL: &str = include_str!("../src/redis/gcra_all.lua");
const GCRA_SETTLE: &str = include_str!("../src/redis/gcra_settle.lua");

// ---------------------------------------------------------------------------
// Helpers

/// A limit name no other test uses.
fn limit(prefix: &str) -> LimitName {
    LimitName::new(unique(prefix)).expect("a valid name")
}

fn sha1_hex(data: &str) -> String {
    hex::encode(Sha1::digest(data.as_bytes()))
}

fn hmac_sha1_hex(secret: &[u8], data: &str) -> String {
    let mut mac =
        <Hmac<Sha1> as Mac>::new_from_slice(secret).expect("any key length");
    mac.update(data.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

fn key(check: &BucketCheck<'_>) -> String {
    check.key(KeyLayout::Single)
}

/// `check`'s bucket, read only.
fn read<'a>(name: &'a LimitName, check: &BucketCheck<'a>) -> BucketCheck<'a> {
    BucketCheck::peek(name, check.partition(), check.quota())
}

/// One decision over `checks`, which every Redis decision answers alike.
async fn decide(
    store: &RedisStorage,
    checks: &[BucketCheck<'_>],
) -> (Decided, Vec<Decision>) {
    let mut out = vec![Decision::default(); checks.len()];
    let decided = store.check(checks, &mut out).await.expect("check");
    assert_eq!(decided.by, "redis");
    assert_eq!((decided.now_us, decided.share), (None, 1));
    assert!(
        out.iter().all(|d| d.store.is_none()),
        "Redis stored the TATs"
    );
    (decided, out)
}

/// One check of one enforced bucket.
async fn check(store: &RedisStorage, check: &BucketCheck<'_>) -> Decision {
    let (decided, out) = decide(store, std::slice::from_ref(check)).await;
    assert_eq!(decided.verdict.allowed, out[0].allowed);
    out[0]
}

async fn get(conn: &mut ConnectionManager, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET")
}

async fn exists(conn: &mut ConnectionManager, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

async fn pttl(conn: &mut ConnectionManager, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

/// Redis's `TIME`, in µs.
async fn redis_now(conn: &mut ConnectionManager) -> u64 {
    let (secs, micros): (u64, u64) =
        redis::cmd("TIME").query_async(conn).await.expect("TIME");
    secs * SECOND + micros
}

/// How far ahead of Redis's clock the stored TAT of `key` is, in µs.
async fn tat_ahead(conn: &mut ConnectionManager, key: &str) -> i64 {
    let tat: i64 = get(conn, key)
        .await
        .unwrap_or_else(|| panic!("{key} is missing"))
        .parse()
        .expect("an integer TAT");
    tat - i64::try_from(redis_now(conn).await).expect("a time")
}

/// Whether a command run inside a script reads keys (`GET`, `MGET`): a
/// script reads each of its keys once per run.
fn is_read(command: &[String]) -> bool {
    command[0] == "get" || command[0] == "mget"
}

/// Asserts `value` is in `(expected - slack, expected]`: a duration Redis
/// measured from a TAT, a little shorter for the time the test took.
#[track_caller]
fn about(value: u64, expected: u64, slack: u64, what: &str) {
    assert!(
        value <= expected && value + slack > expected,
        "{what}: {value}, expected {expected} (less at most {slack})"
    );
}

async fn scan(conn: &mut ConnectionManager, pattern: &str) -> Vec<String> {
    rate_tier_test_support::scan_keys(conn, pattern)
        .await
        .expect("SCAN")
}

// ---------------------------------------------------------------------------
// Sharing and atomicity

#[tokio::test]
async fn two_stores_share_one_limit() {
    let (a, b) = (store().await, store().await);
    let tier = limit("share");
    let ana = BucketCheck::new(&tier, "ana", Quota::per_minute(10), 1).unwrap();

    for (i, expected_remaining) in (0..10).rev().enumerate() {
        let instance = if i % 2 == 0 { &b } else { &a };
        let decision = check(instance, &ana).await;
        assert!(decision.allowed, "request {} refused", i + 1);
        assert_eq!(decision.remaining, expected_remaining);
        assert_eq!(decision.retry_after_us, 0);
        // The TAT moves 6 s per request (less the few ms this loop takes).
        let full_in = 6 * SECOND * (i as u64 + 1);
        about(decision.reset_after_us, full_in, SECOND, "reset_after_us");
    }

    let eleventh = check(&b, &ana).await;
    assert!(!eleventh.allowed);
    assert_eq!(eleventh.remaining, 0);
    about(
        eleventh.retry_after_us,
        6 * SECOND,
        SECOND,
        "retry_after_us",
    );
    // Retry-After rounds up: 6 s, as in the 0.3 example.
    assert_eq!(eleventh.retry_after_us.div_ceil(SECOND), 6);
    about(eleventh.reset_after_us, MINUTE, SECOND, "reset_after_us");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_checks_pass_exactly_the_quota() {
    for (quota, limit_count) in
        [(Quota::per_minute(10), 10), (Quota::per_hour(100), 100)]
    {
        let tier = limit("conc");
        let passed =
            concurrent_passes(store().await, store().await, 300, |store| {
                let tier = tier.clone();
                async move {
                    let ana = BucketCheck::new(&tier, "ana", quota, 1).unwrap();
                    check(&store, &ana).await.allowed
                }
            })
            .await;
        assert_eq!(passed, limit_count);
    }
}

#[tokio::test]
async fn cost_is_charged_atomically() {
    let store = store().await;
    let tier = limit("cost");
    let five =
        BucketCheck::new(&tier, "bea", Quota::per_minute(10), 5).unwrap();
    assert_eq!(check(&store, &five).await.remaining, 5);
    assert_eq!(check(&store, &five).await.remaining, 0);
    let refused = check(&store, &five).await;
    assert!(!refused.allowed);
    // 5 requests' worth: 30 s.
    about(
        refused.retry_after_us,
        30 * SECOND,
        SECOND,
        "retry_after_us",
    );
}

// ---------------------------------------------------------------------------
// Several buckets, one decision (gcra_all.lua)

#[tokio::test]
async fn two_stores_share_a_plan_and_an_endpoint_limit_in_one_call_each() {
    let (a, b) = (store().await, store().await);
    // One marker in both names: MONITOR shows every command on either key.
    let marker = unique("joint");
    let plan = LimitName::new(format!("{marker}-plan")).unwrap();
    let search = LimitName::new(format!("{marker}-search")).unwrap();
    let monitor = Monitor::start(&redis_url(), &marker);
    let checks = [
        BucketCheck::new(&plan, "ana", Quota::per_hour(10), 1).unwrap(),
        BucketCheck::new(&search, "ana", Quota::per_hour(3), 1).unwrap(),
    ];
    for (i, (plan_left, search_left)) in
        [(9, 2), (8, 1), (7, 0)].into_iter().enumerate()
    {
        let instance = if i % 2 == 0 { &a } else { &b };
        let (decided, out) = decide(instance, &checks).await;
        assert!(decided.verdict.allowed, "search {}", i + 1);
        assert_eq!(
            (out[0].remaining, out[1].remaining),
            (plan_left, search_left)
        );
    }
    // The fourth and fifth searches: refused by `search` (20 min to wait),
    // and the tier is not charged.
    for instance in [&b, &a] {
        let (decided, out) = decide(instance, &checks).await;
        assert!(!decided.verdict.allowed);
        assert_eq!(decided.verdict.refused_by, Some(1));
        about(decided.verdict.retry_after_us, 20 * MINUTE, SECOND, "retry");
        assert_eq!(decided.verdict.retry_after_us, out[1].retry_after_us);
        assert!(out[0].allowed);
        assert_eq!(out[0].remaining, 7);
    }
    let (_, plan_now) = decide(&a, &[read(&plan, &checks[0])]).await;
    assert_eq!(plan_now[0].remaining, 7);

    // Each decision was one script reading both buckets: no call held
    // only one of them, and each run read each key once.
    let (plan_key, search_key) = (key(&checks[0]), key(&checks[1]));
    let all_sha = sha1_hex(GCRA_ALL);
    let commands = monitor.client_commands();
    assert!(
        commands.iter().filter(|c| c[2] == "2").count() >= 5,
        "{commands:?}"
    );
    for command in commands {
        assert_eq!(command[0], "evalsha", "{command:?}");
        assert_eq!(command[1], all_sha, "not gcra_all.lua: {command:?}");
        if command[2] == "2" {
            assert_eq!(command[3..5], [plan_key.clone(), search_key.clone()]);
        } else {
            assert_eq!(command[2..4], ["1".to_owned(), plan_key.clone()]);
        }
    }
    let reads = |key: &str| {
        monitor
            .script_commands()
            .iter()
            .filter(|c| is_read(c) && c.iter().any(|w| w == key))
            .count()
    };
    assert_eq!(reads(&plan_key), 6, "5 decisions and a peek");
    assert_eq!(reads(&search_key), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_joint_requests_pass_exactly_the_smaller_quota() {
    // The endpoint limit is the smaller one, then the tier.
    for (plan_limit, search_limit) in [(100u32, 10u32), (10, 100)] {
        let (plan, search) = (limit("jplan"), limit("jsearch"));
        let (plan_quota, search_quota) =
            (Quota::per_hour(plan_limit), Quota::per_hour(search_limit));
        let passed =
            concurrent_passes(store().await, store().await, 300, |store| {
                let (plan, search) = (plan.clone(), search.clone());
                async move {
                    let checks = [
                        BucketCheck::new(&plan, "ana", plan_quota, 1).unwrap(),
                        BucketCheck::new(&search, "ana", search_quota, 1)
                            .unwrap(),
                    ];
                    decide(&store, &checks).await.0.verdict.allowed
                }
            })
            .await;
        let smaller = plan_limit.min(search_limit);
        assert_eq!(passed, smaller as usize);
        // The 290 refused decisions charged nothing.
        let store = store().await;
        let peeks = [
            BucketCheck::peek(&plan, "ana", plan_quota),
            BucketCheck::peek(&search, "ana", search_quota),
        ];
        let (_, out) = decide(&store, &peeks).await;
        assert_eq!(
            (out[0].remaining, out[1].remaining),
            (
                u64::from(plan_limit - smaller),
                u64::from(search_limit - smaller)
            )
        );
    }
}

#[tokio::test]
async fn a_refusal_in_any_position_charges_nothing() {
    let store = store().await;
    let mut conn = connect().await;
    let quotas = [Quota::per_hour(10), Quota::per_hour(3), Quota::per_hour(5)];
    for refusing in 0..3 {
        let names = [limit("plan"), limit("search"), limit("ip")];
        let partitions = ["ana", "ana", "10.0.0.1"];
        let checks: Vec<BucketCheck<'_>> = (0..3)
            .map(|i| {
                BucketCheck::new(&names[i], partitions[i], quotas[i], 1)
                    .unwrap()
            })
            .collect();
        // Spend the refusing bucket alone.
        let burst = quotas[refusing].burst();
        let spend = BucketCheck::new(
            &names[refusing],
            partitions[refusing],
            quotas[refusing],
            burst,
        )
        .unwrap();
        assert!(check(&store, &spend).await.allowed);
        let spent_key = key(&checks[refusing]);
        let (value, ttl) = (
            get(&mut conn, &spent_key).await,
            pttl(&mut conn, &spent_key).await,
        );

        let (decided, out) = decide(&store, &checks).await;
        assert!(!decided.verdict.allowed);
        assert_eq!(decided.verdict.refused_by, Some(refusing));
        let wait = quotas[refusing].emission_interval_us();
        about(decided.verdict.retry_after_us, wait, SECOND, "retry");
        for (i, d) in out.iter().enumerate() {
            if i == refusing {
                assert!(!d.allowed);
                continue;
            }
            // Would have passed: reported full, and not even a key made.
            let full = u64::from(quotas[i].burst());
            assert_eq!(
                (d.allowed, d.remaining, d.reset_after_us),
                (true, full, 0),
                "bucket {i} with bucket {refusing} refusing"
            );
            assert!(!exists(&mut conn, &key(&checks[i])).await, "bucket {i}");
        }
        // The refusing bucket is as it was.
        assert_eq!(get(&mut conn, &spent_key).await, value);
        assert!(pttl(&mut conn, &spent_key).await <= ttl);
    }
}

#[tokio::test]
async fn shadow_limits_refuse_nothing_and_are_charged_only_when_they_pass_alone()
 {
    let store = store().await;
    let mut conn = connect().await;
    let (plan, search, other) =
        (limit("plan"), limit("shadow"), limit("shadow2"));
    let one_an_hour = Quota::per_hour(1);
    let enforced =
        BucketCheck::new(&plan, "ana", Quota::per_hour(10), 1).unwrap();
    let watched = BucketCheck::new(&search, "ana", one_an_hour, 1)
        .unwrap()
        .shadow(true);

    // Both pass: both charged.
    let (decided, out) = decide(&store, &[enforced, watched]).await;
    assert!(decided.verdict.allowed && out[1].allowed);
    let search_key = key(&watched);
    let value = get(&mut conn, &search_key).await;
    assert!(value.is_some(), "the shadow bucket was not charged");

    // It would refuse: the request passes, the would-be refusal is
    // reported, and the shadow bucket is not charged again.
    let (decided, out) = decide(&store, &[enforced, watched]).await;
    assert!(decided.verdict.allowed);
    assert_eq!(
        (decided.verdict.refused_by, decided.verdict.retry_after_us),
        (None, 0)
    );
    assert!(!out[1].allowed);
    about(out[1].retry_after_us, 60 * MINUTE, SECOND, "shadow's wait");
    assert_eq!(out[0].remaining, 8);
    assert_eq!(get(&mut conn, &search_key).await, value);
    // Alone too.
    let (decided, out) = decide(&store, &[watched]).await;
    assert!(decided.verdict.allowed && !out[0].allowed);
    assert_eq!(get(&mut conn, &search_key).await, value);

    // An enforced refusal charges nothing, not even a shadow bucket that
    // would pass on its own.
    let rest = BucketCheck::new(&plan, "ana", Quota::per_hour(10), 8).unwrap();
    assert!(check(&store, &rest).await.allowed);
    let fresh = BucketCheck::new(&other, "ana", one_an_hour, 1)
        .unwrap()
        .shadow(true);
    let (decided, out) = decide(&store, &[enforced, fresh]).await;
    assert_eq!(decided.verdict.refused_by, Some(0));
    assert!(out[1].allowed);
    assert!(!exists(&mut conn, &key(&fresh)).await);
}

// ---------------------------------------------------------------------------
// Peek

#[tokio::test]
async fn a_peek_changes_nothing() {
    let store = store().await;
    let mut conn = connect().await;
    let (plan, search) = (limit("peek"), limit("peek-search"));
    let quota = Quota::per_hour(10);
    let four = BucketCheck::new(&plan, "ana", quota, 4).unwrap();
    let plan_key = key(&four);

    // A missing bucket: full, and still missing.
    let (_, out) = decide(&store, &[read(&plan, &four)]).await;
    assert_eq!(
        (out[0].allowed, out[0].remaining, out[0].reset_after_us),
        (true, 10, 0)
    );
    assert!(!exists(&mut conn, &plan_key).await, "a peek made a key");

    // A known bucket: read as it stands, and neither its value nor its
    // expiry touched.
    assert!(check(&store, &four).await.allowed);
    let (value, ttl) = (
        get(&mut conn, &plan_key).await,
        pttl(&mut conn, &plan_key).await,
    );
    for _ in 0..3 {
        let (_, out) = decide(&store, &[read(&plan, &four)]).await;
        assert_eq!(out[0].remaining, 6);
        about(out[0].reset_after_us, 24 * MINUTE, SECOND, "reset_after_us");
        assert_eq!(get(&mut conn, &plan_key).await, value);
        let now = pttl(&mut conn, &plan_key).await;
        assert!(now <= ttl && now > ttl - 1_000, "PTTL {ttl} then {now}");
    }
    // The next charge sees it untouched.
    let one = BucketCheck::new(&plan, "ana", quota, 1).unwrap();
    assert_eq!(check(&store, &one).await.remaining, 5);

    // A peek beside a charge: only the charged bucket gets a key.
    let charged = BucketCheck::new(&plan, "bea", quota, 1).unwrap();
    let looked_at = BucketCheck::peek(&search, "bea", Quota::per_hour(3));
    let (decided, out) = decide(&store, &[charged, looked_at]).await;
    assert!(decided.verdict.allowed);
    assert_eq!((out[0].remaining, out[1].remaining), (9, 3));
    assert!(exists(&mut conn, &key(&charged)).await);
    assert!(
        !exists(&mut conn, &key(&looked_at)).await,
        "a peek made a key"
    );
}

#[tokio::test]
async fn a_peek_does_not_write_the_cap_of_a_tat_from_a_clock_that_went_back() {
    // A TAT far beyond the cap (now + 2 tau): a check would cap it and
    // store the cap (rule 1), but a peek only reads, as gcra-core's
    // `Quota::peek` and the memory store do: the value stays as it was.
    let store = store().await;
    let mut conn = connect().await;
    let plan = limit("peek-cap");
    let quota = Quota::per_hour(10);
    let looked_at = BucketCheck::peek(&plan, "ana", quota);
    let plan_key = key(&looked_at);
    let far = redis_now(&mut conn).await + 10 * 60 * MINUTE;
    let () = redis::cmd("SET")
        .arg(&plan_key)
        .arg(far.to_string())
        .arg("PX")
        .arg(10 * 3_600_000)
        .query_async(&mut conn)
        .await
        .expect("SET");
    let (_, out) = decide(&store, &[looked_at]).await;
    // Read as capped: two hours ahead, nothing left.
    assert_eq!(out[0].remaining, 0);
    about(
        out[0].reset_after_us,
        120 * MINUTE,
        SECOND,
        "reset_after_us",
    );
    assert_eq!(
        get(&mut conn, &plan_key).await,
        Some(far.to_string()),
        "the peek wrote the cap"
    );
    assert!(pttl(&mut conn, &plan_key).await > 9 * 3_600_000);
}

// ---------------------------------------------------------------------------
// Settle (gcra_settle.lua)

#[tokio::test]
async fn a_settled_debt_is_stored_and_waited_for_and_its_expiry_follows() {
    let store = store().await;
    let mut conn = connect().await;
    // 1000 per hour: T = 3.6 s, tau = 1 h.
    let tokens = limit("tokens");
    let estimate =
        BucketCheck::new(&tokens, "ana", Quota::per_hour(1000), 1).unwrap();
    let tokens_key = key(&estimate);
    assert!(check(&store, &estimate).await.allowed);

    // 1200 used: a debt 20 min beyond the burst offset.
    store
        .settle(&[estimate.settle(Adjust::between(1, 1200))])
        .await
        .expect("settle");
    let ahead = tat_ahead(&mut conn, &tokens_key).await;
    about(ahead as u64, 72 * MINUTE, SECOND, "TAT ahead");
    let ttl = pttl(&mut conn, &tokens_key).await as u64;
    about(ttl, 72 * 60_000, 1_000, "PTTL (ms)");
    let next = check(&store, &estimate).await;
    assert!(!next.allowed);
    about(
        next.retry_after_us,
        12 * MINUTE + 3_600_000,
        SECOND,
        "the wait",
    );

    // A refund of 600 brings it back by 36 min, and the expiry with it.
    store
        .settle(&[estimate.settle(Adjust::Refund(600))])
        .await
        .expect("refund");
    about(
        tat_ahead(&mut conn, &tokens_key).await as u64,
        36 * MINUTE,
        SECOND,
        "TAT",
    );
    about(
        pttl(&mut conn, &tokens_key).await as u64,
        36 * 60_000,
        1_000,
        "PTTL",
    );

    // Refunded beyond everything: full, and the key gone.
    store
        .settle(&[estimate.settle(Adjust::Refund(10_000))])
        .await
        .expect("refund");
    assert!(!exists(&mut conn, &tokens_key).await);
    let (_, out) = decide(&store, &[read(&tokens, &estimate)]).await;
    assert_eq!(out[0].remaining, 1000);
}

#[tokio::test]
async fn a_debt_stops_at_twice_the_burst_offset_and_a_refund_of_nothing_makes_no_key()
 {
    let store = store().await;
    let mut conn = connect().await;
    let (plan, tokens) = (limit("cap"), limit("cap-tokens"));
    let one = BucketCheck::new(&plan, "ana", Quota::per_hour(10), 1).unwrap();
    assert!(check(&store, &one).await.allowed);
    // Two buckets settled in one call: a huge debt on one, a refund on a
    // bucket never seen.
    let never =
        BucketCheck::new(&tokens, "ana", Quota::per_hour(10), 1).unwrap();
    store
        .settle(&[
            one.settle(Adjust::Charge(u32::MAX)),
            never.settle(Adjust::Refund(5)),
        ])
        .await
        .expect("settle");
    about(
        tat_ahead(&mut conn, &key(&one)).await as u64,
        120 * MINUTE,
        SECOND,
        "TAT",
    );
    about(
        pttl(&mut conn, &key(&one)).await as u64,
        120 * 60_000,
        1_000,
        "PTTL",
    );
    assert!(
        !exists(&mut conn, &key(&never)).await,
        "a refund made a key"
    );
    // The next request waits the debt beyond tau and its own interval.
    let next = check(&store, &one).await;
    about(next.retry_after_us, 66 * MINUTE, SECOND, "the wait");
}

// ---------------------------------------------------------------------------
// Keys and values

#[tokio::test]
async fn key_is_tier_and_sha1_of_user_and_expires_when_full() {
    let store = store().await;
    let mut conn = connect().await;
    let tier = limit("key");
    let user = unique("user");
    let one = BucketCheck::new(&tier, &user, Quota::per_minute(10), 1).unwrap();
    for _ in 0..10 {
        assert!(check(&store, &one).await.allowed);
    }

    let expected = format!("trt:{tier}:{}", sha1_hex(&user));
    assert_eq!(key(&one), expected);
    assert!(exists(&mut conn, &expected).await, "{expected} is missing");
    let ttl = pttl(&mut conn, &expected).await;
    assert!(ttl > 59_000 && ttl <= 60_000, "PTTL {ttl}");

    let kind: String = redis::cmd("TYPE")
        .arg(&expected)
        .query_async(&mut conn)
        .await
        .expect("TYPE");
    assert_eq!(kind, "string");
    let value = get(&mut conn, &expected).await.expect("GET");
    assert!(
        !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()),
        "stored value {value:?} is not an integer string"
    );
    // The TAT, in µs on Redis's clock: about a minute ahead of Redis's TIME.
    about(
        tat_ahead(&mut conn, &expected).await as u64,
        MINUTE,
        SECOND,
        "TAT",
    );

    // Only this bucket's key was written for this tier.
    assert_eq!(
        scan(&mut conn, &format!("trt:{tier}:*")).await,
        vec![expected]
    );
}

#[tokio::test]
async fn key_of_the_post_example() {
    // printf key_ana | sha1sum
    assert_eq!(
        sha1_hex("key_ana"),
        "33d2315cbeb866b8b237240a98d605f2e6e41b8a"
    );
    let store = store().await;
    let mut conn = connect().await;
    let tier = limit("free");
    let one =
        BucketCheck::new(&tier, "key_ana", Quota::per_minute(10), 1).unwrap();
    check(&store, &one).await;
    let expected =
        format!("trt:{tier}:33d2315cbeb866b8b237240a98d605f2e6e41b8a");
    assert!(exists(&mut conn, &expected).await, "{expected} is missing");
}

#[tokio::test]
async fn key_secret_makes_an_hmac_key_and_no_key_holds_the_user_id() {
    let store = store().await;
    let mut conn = connect().await;
    let tier = limit("hmac");
    let user = unique("ana.secret.user");
    let secret = KeySecret::new(b"s3cret").expect("a secret");
    let one = BucketCheck::new(&tier, &user, Quota::per_minute(10), 1)
        .unwrap()
        .key_secret(Some(&secret));
    assert!(check(&store, &one).await.allowed);

    let hmac_key = format!("trt:{tier}:{}", hmac_sha1_hex(b"s3cret", &user));
    let sha1_key = format!("trt:{tier}:{}", sha1_hex(&user));
    assert!(exists(&mut conn, &hmac_key).await, "{hmac_key} is missing");
    assert!(!exists(&mut conn, &sha1_key).await, "{sha1_key} exists");
    let leaked: Vec<String> = scan(&mut conn, "*")
        .await
        .into_iter()
        .filter(|key| key.contains(&user))
        .collect();
    assert!(leaked.is_empty(), "keys holding the user id: {leaked:?}");
}

#[tokio::test]
async fn wrong_type_key_is_a_fresh_bucket() {
    let store = store().await;
    let mut conn = connect().await;
    let (tier, other) = (limit("type"), limit("type-all"));
    let one = BucketCheck::new(&tier, "ana", Quota::per_minute(10), 1).unwrap();
    // The same through gcra_all.lua, beside another bucket.
    let both = [
        BucketCheck::new(&other, "ana", Quota::per_minute(10), 1).unwrap(),
        BucketCheck::new(&tier, "bea", Quota::per_minute(10), 1).unwrap(),
    ];
    for k in [key(&one), key(&both[0])] {
        let _: i64 = redis::cmd("LPUSH")
            .arg(&k)
            .arg("x")
            .query_async(&mut conn)
            .await
            .expect("LPUSH");
    }

    let decision = check(&store, &one).await;
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 9);
    let (decided, out) = decide(&store, &both).await;
    assert!(decided.verdict.allowed);
    assert_eq!((out[0].remaining, out[1].remaining), (9, 9));
    for k in [key(&one), key(&both[0])] {
        let kind: String = redis::cmd("TYPE")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .expect("TYPE");
        assert_eq!(kind, "string", "the script overwrote the list with a TAT");
    }
}

#[tokio::test]
async fn corrupted_values_are_fresh_buckets() {
    let store = store().await;
    let mut conn = connect().await;
    for value in [
        "abc",
        "1.5",
        "",
        "nan",
        "inf",
        "-inf",
        "2e15",
        " 7",
        "99999999999999999999",
    ] {
        let (tier, other) = (limit("corrupt"), limit("corrupt-all"));
        let one =
            BucketCheck::new(&tier, "ana", Quota::per_minute(10), 1).unwrap();
        let peeked = BucketCheck::peek(&other, "ana", Quota::per_minute(10));
        for k in [key(&one), key(&peeked)] {
            let () = redis::cmd("SET")
                .arg(k)
                .arg(value)
                .query_async(&mut conn)
                .await
                .expect("SET");
        }
        let decision = check(&store, &one).await;
        assert!(decision.allowed, "value {value:?}");
        assert_eq!(
            decision.remaining, 9,
            "value {value:?} was not read as a fresh bucket"
        );
        // gcra_all.lua reads it the same way.
        let (_, out) = decide(&store, &[peeked]).await;
        assert_eq!(out[0].remaining, 10, "value {value:?} (gcra_all.lua)");
    }
}

#[tokio::test]
async fn key_expires_when_the_bucket_is_full_again() {
    let store = store().await;
    let mut conn = connect().await;
    let tier = limit("expiry");
    let one = BucketCheck::new(&tier, "ana", Quota::per_second(1), 1).unwrap();
    let k = key(&one);
    assert!(check(&store, &one).await.allowed);
    assert!(!check(&store, &one).await.allowed);
    let ttl = pttl(&mut conn, &k).await;
    assert!(ttl > 0 && ttl <= 1_000, "PTTL {ttl}");

    // A real expiry is the point here: a short wait.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(!exists(&mut conn, &k).await, "{k} outlived its bucket");
    let decision = check(&store, &one).await;
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 0);
}

// ---------------------------------------------------------------------------
// The scripts

#[tokio::test]
async fn script_flush_is_recovered_from() {
    let store = store().await;
    let mut conn = connect().await;
    let (tier, search) = (limit("noscript"), limit("noscript-all"));
    let one = BucketCheck::new(&tier, "ana", Quota::per_minute(10), 1).unwrap();
    let both = [
        one,
        BucketCheck::new(&search, "ana", Quota::per_minute(10), 1).unwrap(),
    ];
    assert_eq!(check(&store, &one).await.remaining, 9);

    for (source, run) in [(GCRA, 0), (GCRA_ALL, 1), (GCRA_SETTLE, 2)] {
        let script_sha = sha1_hex(source);
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .expect("FLUSH");
        match run {
            0 => {
                let decision = check(&store, &one).await;
                assert!(decision.allowed);
                assert_eq!(
                    decision.remaining, 8,
                    "the bucket survived the flush"
                );
            }
            1 => {
                let (_, out) = decide(&store, &both).await;
                assert_eq!((out[0].remaining, out[1].remaining), (7, 9));
            }
            _ => {
                store
                    .settle(&[one.settle(Adjust::Refund(1))])
                    .await
                    .expect("settle after SCRIPT FLUSH");
                assert_eq!(check(&store, &one).await.remaining, 7);
            }
        }
        let loaded: Vec<i64> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(&script_sha)
            .query_async(&mut conn)
            .await
            .expect("SCRIPT EXISTS");
        assert_eq!(loaded, [1], "script {run} was loaded again");
    }
}

#[tokio::test]
async fn refused_inputs_never_reach_redis() {
    // A fake server that records what it is sent.
    let fake = FakeRedis::start(|_| b"*4\r\n:1\r\n:0\r\n:0\r\n:0\r\n".to_vec());
    let store = RedisStorage::from_url(&fake.url)
        .expect("store")
        .timeout(TEST_TIMEOUT);
    let (plan, search) = (
        LimitName::new("free").unwrap(),
        LimitName::new("search").unwrap(),
    );
    let quota = Quota::per_minute(10);

    // A cost above the burst cannot even be asked.
    assert_eq!(
        BucketCheck::new(&plan, "ana", quota, 11).unwrap_err(),
        CheckError::CostExceedsBurst {
            cost: 11,
            burst: 10
        }
    );
    let twice = [
        BucketCheck::new(&plan, "ana", quota, 1).unwrap(),
        BucketCheck::new(&search, "ana", quota, 1).unwrap(),
        BucketCheck::peek(&plan, "ana", quota),
    ];
    let mut out = [Decision::default(); 3];
    let duplicate = store.check(&twice, &mut out).await;
    assert!(
        matches!(duplicate, Err(StorageError::DuplicateBucket)),
        "{duplicate:?}"
    );
    let mut short = [Decision::default()];
    let mismatch = store.check(&twice[..2], &mut short).await;
    assert!(
        matches!(
            mismatch,
            Err(StorageError::LengthMismatch { checks: 2, out: 1 })
        ),
        "{mismatch:?}"
    );
    assert!(fake.commands().is_empty(), "sent: {:?}", fake.commands());

    // The burst itself is a request like any other.
    let burst = store
        .check(
            &[BucketCheck::new(&plan, "ana", quota, 10).unwrap()],
            &mut short,
        )
        .await;
    assert!(burst.is_ok(), "{burst:?}");
    assert!(fake.commands().iter().any(|c| c[0] == "EVALSHA"));
}

// ---------------------------------------------------------------------------
// The protocol, against fake servers

#[tokio::test]
async fn evalsha_arguments_and_noscript_reload() {
    let script_sha = sha1_hex(GCRA);
    let evals = Arc::new(AtomicU64::new(0));
    let fake = {
        let (evals, script_sha) = (evals.clone(), script_sha.clone());
        FakeRedis::start(move |command| match command[0].as_str() {
            "EVALSHA" if evals.fetch_add(1, Ordering::SeqCst) == 0 => {
                b"-NOSCRIPT No matching script. Please use EVAL.\r\n".to_vec()
            }
            "EVALSHA" => b"*4\r\n:1\r\n:9\r\n:0\r\n:6000000\r\n".to_vec(),
            "SCRIPT" => format!("$40\r\n{script_sha}\r\n").into_bytes(),
            _ => b"+OK\r\n".to_vec(),
        })
    };
    let store = RedisStorage::from_url(&fake.url)
        .expect("store")
        .timeout(TEST_TIMEOUT);
    let plan = LimitName::new("free").unwrap();
    let one =
        BucketCheck::new(&plan, "key_ana", Quota::per_minute(10), 1).unwrap();
    let decision = check(&store, &one).await;
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 9);
    assert_eq!(decision.reset_after_us, 6_000_000);

    let evalsha = words(&[
        "EVALSHA",
        &script_sha,
        "1",
        "trt:free:33d2315cbeb866b8b237240a98d605f2e6e41b8a",
        "6000000",
        "60000000",
        "1",
    ]);
    let load = words(&["SCRIPT", "LOAD", GCRA]);
    assert_eq!(fake.script_commands(), vec![evalsha.clone(), load, evalsha]);
}

fn words(words: &[&str]) -> Vec<String> {
    words.iter().map(|&w| w.to_owned()).collect()
}

/// `n` integers, as a RESP array.
fn ints(values: &[i64]) -> Vec<u8> {
    let mut reply = format!("*{}\r\n", values.len());
    for v in values {
        reply.push_str(&format!(":{v}\r\n"));
    }
    reply.into_bytes()
}

#[tokio::test]
async fn joint_decisions_peeks_and_settles_send_their_scripts_arguments() {
    let (all_sha, settle_sha) = (sha1_hex(GCRA_ALL), sha1_hex(GCRA_SETTLE));
    let fake = {
        let settle_sha = settle_sha.clone();
        FakeRedis::start(move |command| {
            if command[0] != "EVALSHA" {
                return b"+OK\r\n".to_vec();
            }
            let keys: usize = command[2].parse().expect("a key count");
            if command[1] == settle_sha {
                ints(&vec![5; 2 * keys])
            } else {
                // Every bucket allowed, 9 left, 6 s to full.
                ints(&[1, 9, 0, 6_000_000].repeat(keys))
            }
        })
    };
    let store = RedisStorage::from_url(&fake.url)
        .expect("store")
        .timeout(TEST_TIMEOUT);
    let (plan, search) = (
        LimitName::new("free").unwrap(),
        LimitName::new("search").unwrap(),
    );
    let ana = "trt:free:33d2315cbeb866b8b237240a98d605f2e6e41b8a";
    let ana_search = "trt:search:33d2315cbeb866b8b237240a98d605f2e6e41b8a";

    // The tier and a shadow endpoint limit: one gcra_all.lua call.
    let joint = [
        BucketCheck::new(&plan, "key_ana", Quota::per_minute(10), 1).unwrap(),
        BucketCheck::new(&search, "key_ana", Quota::per_minute(3), 2)
            .unwrap()
            .shadow(true),
    ];
    let (decided, out) = decide(&store, &joint).await;
    assert!(decided.verdict.allowed);
    assert_eq!((out[1].remaining, out[1].reset_after_us), (9, 6_000_000));
    // A peek: gcra_all.lua with a cost of 0.
    decide(
        &store,
        &[BucketCheck::peek(&plan, "key_ana", Quota::per_minute(10))],
    )
    .await;
    // A shadow limit alone: gcra_all.lua too (gcra.lua knows no shadow).
    decide(&store, &joint[1..]).await;
    // Settles: units charged positive, refunded negative.
    store
        .settle(&[
            joint[0].settle(Adjust::Refund(1)),
            joint[1].settle(Adjust::Charge(2)),
        ])
        .await
        .expect("settle");

    assert_eq!(
        fake.script_commands(),
        vec![
            words(&[
                "EVALSHA",
                &all_sha,
                "2",
                ana,
                ana_search,
                "6000000",
                "60000000",
                "1",
                "0",
                "3600000000",
                "20000000",
                "60000000",
                "2",
                "1",
                "3600000000",
            ]),
            words(&[
                "EVALSHA",
                &all_sha,
                "1",
                ana,
                "6000000",
                "60000000",
                "0",
                "0",
                "3600000000",
            ]),
            words(&[
                "EVALSHA",
                &all_sha,
                "1",
                ana_search,
                "20000000",
                "60000000",
                "2",
                "1",
                "3600000000",
            ]),
            words(&[
                "EVALSHA",
                &settle_sha,
                "2",
                ana,
                ana_search,
                "6000000",
                "60000000",
                "-1",
                "3600000000",
                "20000000",
                "60000000",
                "2",
                "3600000000",
            ]),
        ]
    );
}

#[tokio::test]
async fn script_error_reply_is_a_backend_error() {
    let fake = FakeRedis::start(|command| match command[0].as_str() {
        "EVALSHA" => {
            b"-ERR gcra: ARGV[3] (cost) must be an integer from 1 to 2^53\r\n"
                .to_vec()
        }
        _ => b"+OK\r\n".to_vec(),
    });
    let store = RedisStorage::from_url(&fake.url)
        .expect("store")
        .timeout(TEST_TIMEOUT);
    let plan = LimitName::new("free").unwrap();
    let one = BucketCheck::new(&plan, "ana", Quota::per_minute(10), 1).unwrap();
    let mut out = [Decision::default()];
    match store.check(&[one], &mut out).await {
        Err(StorageError::Backend(error)) => {
            assert!(error.to_string().contains("gcra: ARGV[3]"), "{error}");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    let settled = store.settle(&[one.settle(Adjust::Charge(1))]).await;
    assert!(
        matches!(settled, Err(StorageError::Backend(_))),
        "{settled:?}"
    );
}

#[tokio::test]
async fn malformed_replies_are_protocol_errors() {
    let plan = LimitName::new("free").unwrap();
    let search = LimitName::new("search").unwrap();
    let quota = Quota::per_minute(10);
    let one = [BucketCheck::new(&plan, "ana", quota, 1).unwrap()];
    let two = [one[0], BucketCheck::new(&search, "ana", quota, 1).unwrap()];
    // (the checks, the reply)
    let cases: [(&[BucketCheck<'_>], &[u8]); 9] = [
        (&one, b"*3\r\n:1\r\n:9\r\n:0\r\n"),
        (&one, b"*5\r\n:1\r\n:9\r\n:0\r\n:0\r\n:0\r\n"),
        (&one, b"*4\r\n:1\r\n:-1\r\n:0\r\n:0\r\n"),
        (&one, b"*4\r\n:2\r\n:0\r\n:0\r\n:0\r\n"),
        (&one, b"*4\r\n:1\r\n$1\r\n9\r\n:0\r\n:0\r\n"),
        (&one, b"$-1\r\n"),
        (&one, b":1\r\n"),
        // Two keys answered as one, or the second one wrong.
        (&two, b"*4\r\n:1\r\n:9\r\n:0\r\n:0\r\n"),
        (
            &two,
            b"*8\r\n:1\r\n:9\r\n:0\r\n:0\r\n:1\r\n:9\r\n:0\r\n:-5\r\n",
        ),
    ];
    for (checks, reply) in cases {
        let fake = FakeRedis::start(move |command| match command[0].as_str() {
            "EVALSHA" => reply.to_vec(),
            _ => b"+OK\r\n".to_vec(),
        });
        let store = RedisStorage::from_url(&fake.url)
            .expect("store")
            .timeout(TEST_TIMEOUT);
        let mut out = vec![Decision::default(); checks.len()];
        let result = store.check(checks, &mut out).await;
        assert!(
            matches!(result, Err(StorageError::Protocol(_))),
            "reply {:?} gave {result:?}",
            String::from_utf8_lossy(reply)
        );
    }
    // A settle answered with the wrong count.
    let fake = FakeRedis::start(|command| match command[0].as_str() {
        "EVALSHA" => b"*3\r\n:0\r\n:0\r\n:0\r\n".to_vec(),
        _ => b"+OK\r\n".to_vec(),
    });
    let store = RedisStorage::from_url(&fake.url)
        .expect("store")
        .timeout(TEST_TIMEOUT);
    let settled = store.settle(&[one[0].settle(Adjust::Charge(1))]).await;
    assert!(
        matches!(settled, Err(StorageError::Protocol(_))),
        "{settled:?}"
    );
}

// ---------------------------------------------------------------------------
// Timeouts

/// A server that accepts connections and never answers: holds every socket.
async fn silent_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    format!("redis://127.0.0.1:{port}/")
}

async fn assert_times_out<T: std::fmt::Debug>(
    call: impl std::future::Future<Output = Result<T, StorageError>>,
    timeout: Duration,
) {
    let started = Instant::now();
    let result = call.await;
    let took = started.elapsed();
    assert!(
        matches!(result, Err(StorageError::Timeout(d)) if d == timeout),
        "expected a timeout, got {result:?}"
    );
    assert!(
        took >= timeout,
        "gave up after {took:?}, before the timeout"
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

/// One check of `check` on `store`, as a future of its decision.
async fn check_once(
    store: &RedisStorage,
    check: BucketCheck<'_>,
) -> Result<Decision, StorageError> {
    let mut out = [Decision::default()];
    store.check(&[check], &mut out).await.map(|_| out[0])
}

#[tokio::test]
async fn silent_server_times_out_with_from_url() {
    let url = silent_server().await;
    let timeout = Duration::from_millis(50);
    let started = Instant::now();
    let store = RedisStorage::from_url(&url)
        .expect("store")
        .timeout(timeout);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "from_url waited for the server"
    );
    // Every check, not only the first, ends at the timeout; so do joint
    // checks and settles.
    let (plan, search) = (
        LimitName::new("free").unwrap(),
        LimitName::new("search").unwrap(),
    );
    let one = BucketCheck::new(&plan, "ana", Quota::per_minute(10), 1).unwrap();
    for _ in 0..3 {
        assert_times_out(check_once(&store, one), timeout).await;
    }
    let two = [
        one,
        BucketCheck::new(&search, "ana", Quota::per_minute(3), 1).unwrap(),
    ];
    let mut out = [Decision::default(); 2];
    assert_times_out(store.check(&two, &mut out), timeout).await;
    assert_times_out(store.settle(&[one.settle(Adjust::Charge(5))]), timeout)
        .await;
}

#[tokio::test]
async fn silent_server_times_out_with_a_lazy_connection_manager() {
    let url = silent_server().await;
    let conn = redis::Client::open(url)
        .expect("URL")
        .get_connection_manager_lazy(ConnectionManagerConfig::new())
        .expect("lazy manager");
    let timeout = Duration::from_millis(50);
    let store = RedisStorage::new(conn).timeout(timeout);
    let plan = LimitName::new("free").unwrap();
    let one = BucketCheck::new(&plan, "ana", Quota::per_minute(10), 1).unwrap();
    assert_times_out(check_once(&store, one), timeout).await;
    assert_times_out(check_once(&store, one), timeout).await;
}

#[tokio::test]
async fn eager_connection_manager_waits_on_a_silent_server() {
    // What redis-rs does (documented in the module): connecting eagerly to a
    // server that never answers does not return within the storage timeout;
    // redis-rs retries its handshake (1 s per attempt) before failing.
    let url = silent_server().await;
    let client = redis::Client::open(url).expect("URL");
    let connect = tokio::time::timeout(
        Duration::from_millis(500),
        client.get_connection_manager(),
    );
    assert!(
        connect.await.is_err(),
        "connected to a server that never answers"
    );
}

/// A TCP proxy to the test server that can be frozen: while frozen, nothing
/// is forwarded either way (the bytes wait in the socket buffers).
struct Proxy {
    url: String,
    frozen: Arc<AtomicBool>,
}

impl Proxy {
    fn start(upstream: &str) -> Proxy {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        Proxy::on(listener, upstream)
    }

    fn on(listener: std::net::TcpListener, upstream: &str) -> Proxy {
        let client = redis::Client::open(upstream).expect("URL");
        let target = match client.get_connection_info().addr() {
            redis::ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
            other => panic!(
                "the proxy test needs a TCP TRT_REDIS_URL, not {other:?}"
            ),
        };
        let port = listener.local_addr().expect("addr").port();
        let frozen = Arc::new(AtomicBool::new(false));
        let flag = frozen.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = StdTcpStream::connect(&target) else {
                    return;
                };
                for (mut from, mut to) in [
                    (
                        client.try_clone().expect("clone"),
                        server.try_clone().expect("clone"),
                    ),
                    (server, client),
                ] {
                    let frozen = flag.clone();
                    thread::spawn(move || {
                        let mut buf = [0_u8; 16 * 1024];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            while frozen.load(Ordering::SeqCst) {
                                thread::sleep(Duration::from_millis(5));
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        Proxy {
            url: format!("redis://127.0.0.1:{port}/"),
            frozen,
        }
    }
}

#[tokio::test]
async fn stalled_server_times_out_and_the_store_recovers() {
    let proxy = Proxy::start(&redis_url());
    let conn = redis::Client::open(proxy.url.as_str())
        .expect("URL")
        .get_connection_manager()
        .await
        .expect("connect through the proxy");
    let timeout = Duration::from_millis(50);
    let store = RedisStorage::new(conn).timeout(timeout);
    // The same connection with room for a loaded machine, for the checks
    // that are not about the timeout.
    let patient = store.clone().timeout(TEST_TIMEOUT);
    let tier = limit("stall");
    let one = BucketCheck::new(&tier, "ana", Quota::per_hour(10), 1).unwrap();
    assert_eq!(check(&patient, &one).await.remaining, 9);

    proxy.frozen.store(true, Ordering::SeqCst);
    assert_times_out(check_once(&store, one), timeout).await;
    proxy.frozen.store(false, Ordering::SeqCst);

    // The timed-out check reached Redis once the proxy thawed, and was
    // charged; but its caller had answered without it (a fallback decides
    // locally), so the store gives the late charge back: a timeout never
    // charges twice.
    let peek = BucketCheck::peek(&tier, "ana", Quota::per_hour(10));
    let mut refunded = false;
    for _ in 0..200 {
        if check(&patient, &peek).await.remaining == 9 {
            refunded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(refunded, "the late charge stayed");
    // Later answers are matched to their own requests, not shifted by the
    // late one.
    let decision = check(&patient, &one).await;
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 8);
    assert_eq!(check(&patient, &one).await.remaining, 7);
}

#[tokio::test]
async fn refused_connection_fails_fast_and_reconnects_later() {
    let upstream = redis_url();
    // A port with nothing on it (for now).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let store = RedisStorage::from_url(&format!("redis://127.0.0.1:{port}/"))
        .expect("store")
        .timeout(Duration::from_secs(2));
    let tier = limit("refused");
    let one = BucketCheck::new(&tier, "ana", Quota::per_minute(10), 1).unwrap();
    for _ in 0..2 {
        let started = Instant::now();
        let result = check_once(&store, one).await;
        assert!(
            matches!(result, Err(StorageError::Backend(_))),
            "expected a backend error, got {result:?}"
        );
        // No redis-rs retries with back-off: well within the 2 s timeout.
        assert!(started.elapsed() < Duration::from_millis(500));
    }

    // Redis comes up at that address: the same store reconnects.
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))
        .expect("bind the same port again");
    let _proxy = Proxy::on(listener, &upstream);
    // The first check reconnects: the stale "refused" the connection
    // manager kept from the outage is retried once, within the timeout.
    let decision = check_once(&store, one).await.expect("reconnected");
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 9);
}

#[test]
fn from_url_outside_a_runtime_is_an_error_not_a_panic() {
    let result = RedisStorage::from_url("redis://127.0.0.1:6390/");
    assert!(
        matches!(&result, Err(StorageError::Backend(e)) if e.to_string().contains("Tokio runtime")),
        "{result:?}"
    );
}

#[tokio::test]
async fn from_url_reads_what_redis_rs_reads() {
    for url in [
        "redis://127.0.0.1:6390/",
        "redis://:password@127.0.0.1:6390/2",
        "redis://user:password@localhost/",
        "redis+unix:///tmp/redis.sock",
    ] {
        assert!(RedisStorage::from_url(url).is_ok(), "{url}");
    }
    for url in ["", "not a url", "http://127.0.0.1/", "redis://127.0.0.1/x"] {
        assert!(
            matches!(
                RedisStorage::from_url(url),
                Err(StorageError::Backend(_))
            ),
            "{url}"
        );
    }
}

#[tokio::test]
async fn the_store_is_redis_and_needs_io() {
    let store =
        RedisStorage::from_url("redis://127.0.0.1:6390/").expect("store");
    assert_eq!(store.kind(), "redis");
    assert!(!store.is_cluster());
    let plan = LimitName::new("free").unwrap();
    let one =
        [BucketCheck::new(&plan, "ana", Quota::per_minute(10), 1).unwrap()];
    let mut out = [Decision::default()];
    assert!(store.check(&one, &mut out).ready().is_none());
    assert_eq!(
        store.failure_domain(&one[0]),
        None,
        "a single Redis is one part"
    );
}

// ---------------------------------------------------------------------------
// A fake Redis that records commands and answers with a function of them.

struct FakeRedis {
    url: String,
    commands: Arc<Mutex<Vec<Vec<String>>>>,
}

impl FakeRedis {
    fn start(
        reply: impl Fn(&[String]) -> Vec<u8> + Send + Sync + 'static,
    ) -> FakeRedis {
        let listener =
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let commands = Arc::new(Mutex::new(Vec::new()));
        let (log, reply) = (commands.clone(), Arc::new(reply));
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (log, reply) = (log.clone(), reply.clone());
                thread::spawn(move || {
                    let mut writer = stream.try_clone().expect("clone");
                    let mut reader = BufReader::new(stream);
                    while let Ok(Some(command)) = read_command(&mut reader) {
                        let answer = reply(&command);
                        log.lock().expect("log").push(command);
                        if writer.write_all(&answer).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        FakeRedis {
            url: format!("redis://127.0.0.1:{port}/"),
            commands,
        }
    }

    fn commands(&self) -> Vec<Vec<String>> {
        self.commands.lock().expect("log").clone()
    }

    /// The commands about scripts (not the connection's own `CLIENT ...`).
    fn script_commands(&self) -> Vec<Vec<String>> {
        self.commands()
            .into_iter()
            .filter(|c| c[0] == "EVALSHA" || c[0] == "EVAL" || c[0] == "SCRIPT")
            .collect()
    }
}

/// One RESP command (an array of bulk strings), or `None` at end of stream.
fn read_command(reader: &mut impl BufRead) -> io::Result<Option<Vec<String>>> {
    fn bad(what: &str) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
    }
    fn header(
        reader: &mut impl BufRead,
        prefix: char,
    ) -> io::Result<Option<usize>> {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let count = line
            .trim_end()
            .strip_prefix(prefix)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| bad("not a RESP header"))?;
        Ok(Some(count))
    }
    let Some(count) = header(reader, '*')? else {
        return Ok(None);
    };
    let mut command = Vec::with_capacity(count);
    for _ in 0..count {
        let len = header(reader, '$')?.ok_or_else(|| bad("truncated"))?;
        let mut bytes = vec![0; len + 2];
        reader.read_exact(&mut bytes)?;
        bytes.truncate(len);
        command.push(String::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?);
    }
    Ok(Some(command))
}
