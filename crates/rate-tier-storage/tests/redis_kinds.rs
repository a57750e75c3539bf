//! `RedisStorage` deciding windows and periods (`decide_mixed.lua`) on a
//! real Redis and a real Redis Cluster: exactly the limit passes across
//! instances, a decision is all or nothing across kinds, the waits, the
//! keys, what is remembered and what a late answer leaves.
//!
//! Run with `cargo xtask test-redis -- -p rate-tier-storage --test
//! redis_kinds` (a throwaway Redis, `TRT_REDIS_URL`) and `cargo xtask
//! test-cluster -- -p rate-tier-storage --test redis_kinds` (a throwaway
//! 3-master cluster, `TRT_REDIS_CLUSTER_URLS`: the tests whose names hold
//! `cluster`). Without them these tests fail, never pass silently. One
//! test starts a server of its own (it pauses it).
//!
//! Real time: windows are a minute long and periods calendar ones, far
//! longer than any test; one sleep (30 ms) tells a window's oldest entry
//! from its newest, and one test runs a window of a second for 2.5 s of
//! Redis's clock (no second of it ever holds more than the limit).
#![allow(clippy::unwrap_used)]

mod redis_support;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rate_tier_storage::StorageExt;
use rate_tier_storage::key::cluster_slot;
use rate_tier_storage::{
    BucketCheck, Concurrency, Decided, Decision, KeyLayout, LimitName, Period,
    PeriodUnit, Quota, REMEMBERED, RedisStorage, Rule, RuleKind, Storage,
    StorageError, StorageEvent, Window,
};
use redis::aio::{ConnectionLike, ConnectionManager};
use sha1::{Digest, Sha1};

use redis_support::{
    cluster_conn, cluster_store, connect, partition_off, store,
};

use rate_tier_test_support::{
    RedisServer, TEST_TIMEOUT, concurrent_passes, unique,
};

const SECOND: u64 = 1_000_000;
const MINUTE: u64 = 60 * SECOND;

// ---------------------------------------------------------------------------
// Helpers

/// A limit name no other test uses.
fn limit(prefix: &str) -> LimitName {
    LimitName::new(unique(prefix)).expect("a valid name")
}

fn window(limit: u32, secs: u64) -> Rule {
    Window::new(limit, Duration::from_secs(secs))
        .unwrap()
        .into()
}

fn period(limit: u32, unit: PeriodUnit, offset_s: i32) -> Period {
    Period::new(limit, unit, offset_s).unwrap()
}

fn sha1_hex(data: &str) -> String {
    hex::encode(Sha1::digest(data.as_bytes()))
}

/// One decision, answered by Redis.
async fn decide(
    store: &RedisStorage,
    checks: &[BucketCheck<'_>],
) -> (Decided, Vec<Decision>) {
    let mut out = vec![Decision::default(); checks.len()];
    let decided = store.check(checks, &mut out).await.expect("check");
    assert_eq!(decided.by, "redis");
    assert!(out.iter().all(|d| d.store.is_none()), "Redis stored them");
    (decided, out)
}

/// What `checks[i]`'s bucket holds now, read at a cost of 0.
async fn peek(store: &RedisStorage, check: &BucketCheck<'_>) -> Decision {
    decide(store, &[check.as_peek()]).await.1[0]
}

async fn query<T: redis::FromRedisValue>(
    conn: &mut (impl ConnectionLike + Send),
    args: &[&str],
) -> T {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

async fn llen(conn: &mut (impl ConnectionLike + Send), key: &str) -> u64 {
    query(conn, &["LLEN", key]).await
}

/// A window's entries, µs on Redis's clock, oldest first.
async fn entries(
    conn: &mut (impl ConnectionLike + Send),
    key: &str,
) -> Vec<u64> {
    let items: Vec<String> = query(conn, &["LRANGE", key, "0", "-1"]).await;
    items.iter().map(|e| e.parse().unwrap()).collect()
}

/// Redis's `TIME`, in µs.
async fn redis_now(conn: &mut ConnectionManager) -> u64 {
    let (secs, micros): (u64, u64) = query(conn, &["TIME"]).await;
    secs * SECOND + micros
}

// ---------------------------------------------------------------------------
// Exactly the limit, across instances

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_window_passes_exactly_its_limit_across_two_instances() {
    let login = limit("kwin");
    let rule = window(5, 60);
    let passed =
        concurrent_passes(store().await, store().await, 200, |store| {
            let login = login.clone();
            async move {
                let check =
                    [BucketCheck::of_rule(&login, "ana", rule, 1).unwrap()];
                decide(&store, &check).await.0.verdict.allowed
            }
        })
        .await;
    assert_eq!(passed, 5);
    let check = BucketCheck::of_rule(&login, "ana", rule, 1).unwrap();
    let mut conn = connect().await;
    assert_eq!(llen(&mut conn, &check.key(KeyLayout::Single)).await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_period_passes_exactly_its_limit_across_two_instances() {
    let exports = limit("kper");
    let monthly = period(7, PeriodUnit::Month, 0);
    let passed =
        concurrent_passes(store().await, store().await, 200, |store| {
            let exports = exports.clone();
            async move {
                let check =
                    [BucketCheck::of_rule(&exports, "ana", monthly.into(), 1)
                        .unwrap()];
                decide(&store, &check).await.0.verdict.allowed
            }
        })
        .await;
    assert_eq!(passed, 7);
    let check =
        BucketCheck::of_rule(&exports, "ana", monthly.into(), 1).unwrap();
    let record: String = query(
        &mut connect().await,
        &["GET", &check.key(KeyLayout::Single)],
    )
    .await;
    assert!(record.ends_with(":7"), "{record}");
}

/// A pass of a window, bracketed on Redis's clock: Redis decided it at
/// some µs in `before..=after` (two `TIME`s around the decision, each
/// answered before or after the script's own `TIME`, on one server), and
/// said `remaining`.
#[derive(Debug, Clone, Copy)]
struct Pass {
    before: u64,
    after: u64,
    remaining: u64,
}

/// Every set of `limit + 1` passes spans at least `window_us` (a pass at
/// `t` counts for `t..t + W`, so the `limit + 1`-th can only come once the
/// first has expired), as far as the brackets can tell: the earliest
/// `before` to the latest `after` of the set. Checked for the set of
/// tightest span from each `before` on.
fn no_window_holds_more_than(passes: &[Pass], limit: usize, window_us: u64) {
    for first in passes {
        let mut afters: Vec<u64> = passes
            .iter()
            .filter(|p| p.before >= first.before)
            .map(|p| p.after)
            .collect();
        afters.sort_unstable();
        if let Some(&last) = afters.get(limit) {
            assert!(
                last - first.before >= window_us,
                "{} passes within {} µs from {}: {passes:?}",
                limit + 1,
                last - first.before,
                first.before
            );
        }
    }
}

/// Each pass said `remaining`: `limit - remaining` passes counted in its
/// window, itself included. Between those surely in it (surely not after
/// it, surely less than a window before it) and those possibly in it.
fn remaining_agrees(passes: &[Pass], limit: u64, window_us: u64) {
    for (i, pass) in passes.iter().enumerate() {
        let others = || passes.iter().enumerate().filter(move |&(j, _)| j != i);
        let surely = others()
            .filter(|(_, p)| {
                p.after < pass.before && p.before + window_us > pass.after
            })
            .count() as u64;
        let possibly = others()
            .filter(|(_, p)| {
                p.before <= pass.after && p.after + window_us > pass.before
            })
            .count() as u64;
        let counted = limit - pass.remaining;
        assert!(
            (surely + 1..=possibly + 1).contains(&counted),
            "{pass:?} counted {counted}, {surely} to {possibly} others in its window"
        );
    }
}

/// Real time, as Redis's clock runs (2.5 s; nothing else here waits): a
/// window of 5 in any second, asked by four tasks on two instances every
/// 10 ms. No second of Redis's clock ever holds more than 5 passes, and
/// each pass's `remaining` agrees with the passes around it. Every instant
/// is Redis's own (`TIME` around each decision), so this process's clock
/// and its distance to Redis's play no part.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_window_never_holds_more_than_its_limit_in_any_window_over_real_seconds()
 {
    const WINDOW_US: u64 = SECOND;
    let login = limit("kreal");
    let rule: Rule = Window::new(5, Duration::from_micros(WINDOW_US))
        .unwrap()
        .into();
    let instances = [store().await, store().await];
    let started = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|task| {
            let store = instances[task % 2].clone();
            let login = login.clone();
            tokio::spawn(async move {
                let mut clock = connect().await;
                let mut passes = Vec::new();
                while started.elapsed() < Duration::from_millis(2500) {
                    let check =
                        BucketCheck::of_rule(&login, "ana", rule, 1).unwrap();
                    let before = redis_now(&mut clock).await;
                    let (decided, out) = decide(&store, &[check]).await;
                    let after = redis_now(&mut clock).await;
                    if decided.verdict.allowed {
                        let remaining = out[0].remaining;
                        passes.push(Pass {
                            before,
                            after,
                            remaining,
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                passes
            })
        })
        .collect();
    let mut passes = Vec::new();
    for task in tasks {
        passes.extend(task.await.unwrap());
    }
    passes.sort_by_key(|p| p.before);
    // More than a window's worth, so that the checks below are not empty.
    assert!(passes.len() > 5, "{passes:?}");
    no_window_holds_more_than(&passes, 5, WINDOW_US);
    remaining_agrees(&passes, 5, WINDOW_US);
}

/// 200 decisions over a window of 5 and a rate of 100: 5 pass, and the
/// rate is charged for those 5 alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_decisions_over_a_window_and_a_rate_charge_the_rate_only_for_their_passes()
 {
    let (plan, login) = (limit("kplan"), limit("klogin"));
    let quota = Quota::per_hour(100);
    let rule = window(5, 60);
    let passed =
        concurrent_passes(store().await, store().await, 200, |store| {
            let (plan, login) = (plan.clone(), login.clone());
            async move {
                let checks = [
                    BucketCheck::new(&plan, "ana", quota, 1).unwrap(),
                    BucketCheck::of_rule(&login, "ana", rule, 1).unwrap(),
                ];
                decide(&store, &checks).await.0.verdict.allowed
            }
        })
        .await;
    assert_eq!(passed, 5);
    let rate = BucketCheck::new(&plan, "ana", quota, 1).unwrap();
    assert_eq!(peek(&store().await, &rate).await.remaining, 95);
}

// ---------------------------------------------------------------------------
// All or nothing across kinds

#[tokio::test]
async fn a_window_or_period_refusal_charges_no_rate() {
    let store = store().await;
    let mut conn = connect().await;
    let (plan, login, exports) =
        (limit("aplan"), limit("alogin"), limit("aexp"));
    let quota = Quota::per_hour(100);
    let daily = period(3, PeriodUnit::Day, 0);
    let rate = BucketCheck::new(&plan, "ana", quota, 1).unwrap();
    let in_window =
        BucketCheck::of_rule(&login, "ana", window(2, 60), 1).unwrap();
    let in_period =
        BucketCheck::of_rule(&exports, "ana", daily.into(), 1).unwrap();

    // The window refuses the third: the rate keeps its two charges.
    for _ in 0..2 {
        assert!(decide(&store, &[rate, in_window]).await.0.verdict.allowed);
    }
    let (refused, out) = decide(&store, &[rate, in_window]).await;
    assert!(!refused.verdict.allowed);
    assert_eq!(refused.verdict.refused_by, Some(1));
    // The rate passed on its own and answers with a read of its bucket.
    assert!(out[0].allowed);
    assert_eq!(out[0].remaining, 98);
    assert_eq!(peek(&store, &rate).await.remaining, 98);
    assert_eq!(llen(&mut conn, &in_window.key(KeyLayout::Single)).await, 2);

    // The period refuses its fourth: neither the rate nor a fresh window
    // beside it is charged.
    let other_window =
        BucketCheck::of_rule(&login, "bea", window(10, 60), 1).unwrap();
    for _ in 0..3 {
        let (decided, _) = decide(&store, &[rate, in_period]).await;
        assert!(decided.verdict.allowed);
    }
    let (refused, out) = decide(&store, &[rate, other_window, in_period]).await;
    assert_eq!(refused.verdict.refused_by, Some(2));
    assert!(out[0].allowed && out[1].allowed);
    assert_eq!((out[0].remaining, out[1].remaining), (95, 10));
    assert_eq!(peek(&store, &rate).await.remaining, 95);
    assert_eq!(
        llen(&mut conn, &other_window.key(KeyLayout::Single)).await,
        0,
        "a window that passed in a refused decision was written"
    );
}

#[tokio::test]
async fn a_rate_refusal_appends_nothing_to_a_window_and_counts_nothing_in_a_period()
 {
    let store = store().await;
    let mut conn = connect().await;
    let (plan, login, exports) =
        (limit("rplan"), limit("rlogin"), limit("rexp"));
    let daily = period(10, PeriodUnit::Day, 0);
    let rate = BucketCheck::new(&plan, "ana", Quota::per_hour(2), 1).unwrap();
    let in_window =
        BucketCheck::of_rule(&login, "ana", window(10, 60), 1).unwrap();
    let in_period =
        BucketCheck::of_rule(&exports, "ana", daily.into(), 1).unwrap();
    let checks = [rate, in_window, in_period];
    for _ in 0..2 {
        assert!(decide(&store, &checks).await.0.verdict.allowed);
    }
    for _ in 0..3 {
        let (refused, out) = decide(&store, &checks).await;
        assert_eq!(refused.verdict.refused_by, Some(0));
        // The others passed on their own and answer with a read.
        assert!(out[1].allowed && out[2].allowed);
        assert_eq!((out[1].remaining, out[2].remaining), (8, 8));
    }
    assert_eq!(llen(&mut conn, &in_window.key(KeyLayout::Single)).await, 2);
    let record: String =
        query(&mut conn, &["GET", &in_period.key(KeyLayout::Single)]).await;
    assert!(record.ends_with(":2"), "{record}");
    assert_eq!(peek(&store, &in_period).await.remaining, 8);
    assert_eq!(peek(&store, &in_window).await.remaining, 8);
}

// ---------------------------------------------------------------------------
// Waits

/// A refused window waits until its oldest counted entry leaves (the
/// window's length after it), on Redis's clock; its reset is until the
/// newest leaves.
#[tokio::test]
async fn a_refused_window_waits_until_its_oldest_entry_leaves() {
    let store = store().await;
    let mut conn = connect().await;
    let login = limit("wlogin");
    let check = BucketCheck::of_rule(&login, "ana", window(3, 60), 1).unwrap();
    let key = check.key(KeyLayout::Single);
    assert!(decide(&store, &[check]).await.0.verdict.allowed);
    // The oldest entry and the newest must differ by more than the
    // tolerance.
    tokio::time::sleep(Duration::from_millis(30)).await;
    for _ in 0..2 {
        assert!(decide(&store, &[check]).await.0.verdict.allowed);
    }
    let before = redis_now(&mut conn).await;
    let (refused, out) = decide(&store, &[check]).await;
    let after = redis_now(&mut conn).await;
    assert!(!refused.verdict.allowed);
    let log = entries(&mut conn, &key).await;
    assert_eq!(log.len(), 3, "a refusal appended to the window");
    let (oldest, newest) = (log[0], log[2]);
    assert!(newest >= oldest + 30_000, "{log:?}");
    // Decided at some `now` in [before, after]: the wait is
    // oldest + 60 s - now.
    let wait = out[0].retry_after_us;
    assert!(
        oldest + MINUTE - after <= wait && wait <= oldest + MINUTE - before,
        "retry_after {wait}, expected {} to {}",
        oldest + MINUTE - after,
        oldest + MINUTE - before
    );
    assert_eq!(refused.verdict.retry_after_us, wait);
    let reset = out[0].reset_after_us;
    assert!(
        newest + MINUTE - after <= reset && reset <= newest + MINUTE - before,
        "reset_after {reset}"
    );
}

/// A refused period waits until the next period starts, on Redis's clock,
/// for each unit and an offset from UTC.
#[tokio::test]
async fn a_refused_period_waits_until_the_next_period() {
    let store = store().await;
    let mut conn = connect().await;
    for (unit, offset_s) in [
        (PeriodUnit::Day, 0),
        (PeriodUnit::Day, 5 * 3600 + 1800),
        (PeriodUnit::Week, -7 * 3600),
        (PeriodUnit::Month, 0),
        (PeriodUnit::Month, 14 * 3600),
    ] {
        let name = limit("pwait");
        let rule = period(1, unit, offset_s);
        let check = BucketCheck::of_rule(&name, "ana", rule.into(), 1).unwrap();
        assert!(decide(&store, &[check]).await.0.verdict.allowed);
        let (refused, out) = decide(&store, &[check]).await;
        let now = redis_now(&mut conn).await;
        assert!(!refused.verdict.allowed, "{unit:?} {offset_s}");
        let expected = rule.next_start(now).unwrap() - now;
        for (what, value) in [
            ("retry_after", out[0].retry_after_us),
            ("reset_after", out[0].reset_after_us),
        ] {
            assert!(
                value.abs_diff(expected) <= SECOND,
                "{unit:?} {offset_s}: {what} {value}, expected about {expected}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Keys and values

#[tokio::test]
async fn window_and_period_keys_are_hashed_a_list_and_a_string_with_px() {
    let store = store().await;
    let mut conn = connect().await;
    let (login, exports) = (limit("klog"), limit("kexp"));
    let user = format!("{}@example.com", unique("user"));
    let monthly = period(100, PeriodUnit::Month, 0);
    let checks = [
        BucketCheck::of_rule(&login, &user, window(5, 60), 1).unwrap(),
        BucketCheck::of_rule(&exports, &user, monthly.into(), 2).unwrap(),
    ];
    let before = redis_now(&mut conn).await;
    assert!(decide(&store, &checks).await.0.verdict.allowed);
    let after = redis_now(&mut conn).await;

    let window_key = format!("trt:{}:{}", login.as_str(), sha1_hex(&user));
    let period_key = format!("trt:{}:{}", exports.as_str(), sha1_hex(&user));
    assert_eq!(checks[0].key(KeyLayout::Single), window_key);
    assert_eq!(checks[1].key(KeyLayout::Single), period_key);
    let found: Vec<String> =
        rate_tier_test_support::scan_keys(&mut conn, &format!("*{}*", user))
            .await
            .unwrap();
    assert!(found.is_empty(), "the user id in clear: {found:?}");

    // The window: a list of Redis's times, expiring a window after.
    let kind: String = query(&mut conn, &["TYPE", &window_key]).await;
    assert_eq!(kind, "list");
    let log = entries(&mut conn, &window_key).await;
    assert_eq!(log.len(), 1);
    assert!((before..=after).contains(&log[0]), "{log:?}");
    let pttl: i64 = query(&mut conn, &["PTTL", &window_key]).await;
    assert!((59_000..=60_000).contains(&pttl), "PTTL {pttl}");

    // The period: a string `start:count`, expiring at the next period.
    let kind: String = query(&mut conn, &["TYPE", &period_key]).await;
    assert_eq!(kind, "string");
    let record: String = query(&mut conn, &["GET", &period_key]).await;
    let start = monthly.start_of(after).unwrap();
    assert_eq!(record, format!("{start}:2"));
    let pttl: i64 = query(&mut conn, &["PTTL", &period_key]).await;
    let until_next = (monthly.next_start(after).unwrap() - after) / 1000;
    assert!(
        pttl > 0 && (pttl as u64).abs_diff(until_next) <= 1000,
        "PTTL {pttl}, expected about {until_next}"
    );

    // A peek of each writes nothing.
    let (_, out) =
        decide(&store, &[checks[0].as_peek(), checks[1].as_peek()]).await;
    assert_eq!((out[0].remaining, out[1].remaining), (4, 98));
    assert_eq!(entries(&mut conn, &window_key).await, log);
    let again: String = query(&mut conn, &["GET", &period_key]).await;
    assert_eq!(again, record);
}

// ---------------------------------------------------------------------------
// What the store says it decides

/// Every kind (concurrency limits: `redis_concurrency.rs`); a slot taken
/// without an id is refused before anything is sent.
#[tokio::test]
async fn redis_supports_every_kind_and_no_slot_without_an_id() {
    let store = store().await;
    for kind in [
        RuleKind::Rate,
        RuleKind::Window,
        RuleKind::Period,
        RuleKind::Concurrency,
    ] {
        assert!(store.supports(kind), "{kind}");
    }
    let (plan, uploads) = (limit("splan"), limit("sup"));
    let checks = [
        BucketCheck::new(&plan, "ana", Quota::per_hour(10), 1).unwrap(),
        BucketCheck::of_rule(
            &uploads,
            "ana",
            Concurrency::new(2).unwrap().into(),
            1,
        )
        .unwrap(),
    ];
    let mut out = [Decision::default(); 2];
    let refused = store.check(&checks, &mut out).await;
    assert!(
        matches!(refused, Err(StorageError::Unsupported(_))),
        "{refused:?}"
    );
    // Nothing was charged.
    assert_eq!(peek(&store, &checks[0]).await.remaining, 10);
}

// ---------------------------------------------------------------------------
// Remembered refusals

/// A window's refusal is not remembered (every one goes to Redis); a
/// rate's refusal beside a window is, and charges the window nothing.
#[tokio::test]
async fn a_window_refusal_is_not_remembered_a_rate_refusal_beside_one_is() {
    let store = RedisStorage::new(connect().await).timeout(TEST_TIMEOUT);
    let mut conn = connect().await;
    let (plan, login) = (limit("mplan"), limit("mlogin"));
    let in_window =
        BucketCheck::of_rule(&login, "ana", window(1, 60), 1).unwrap();
    let mut out = [Decision::default()];
    assert!(
        store
            .check(&[in_window], &mut out)
            .await
            .unwrap()
            .verdict
            .allowed
    );
    for _ in 0..3 {
        let refused = store.check(&[in_window], &mut out).await.unwrap();
        assert!(!refused.verdict.allowed);
        assert_eq!(refused.by, "redis", "a window's refusal was remembered");
    }

    let rate = BucketCheck::new(&plan, "bea", Quota::per_hour(1), 1).unwrap();
    let beside =
        BucketCheck::of_rule(&login, "bea", window(10, 60), 1).unwrap();
    let mut two = [Decision::default(); 2];
    assert!(
        store
            .check(&[rate, beside], &mut two)
            .await
            .unwrap()
            .verdict
            .allowed
    );
    let refused = store.check(&[rate, beside], &mut two).await.unwrap();
    assert_eq!((refused.by, refused.verdict.refused_by), ("redis", Some(0)));
    let remembered = store.check(&[rate, beside], &mut two).await.unwrap();
    assert_eq!(remembered.by, REMEMBERED);
    assert_eq!(remembered.verdict.refused_by, Some(0));
    assert!(two[1].allowed && two[1].remaining == 9);
    assert_eq!(llen(&mut conn, &beside.key(KeyLayout::Single)).await, 1);
}

// ---------------------------------------------------------------------------
// A late answer

/// A decision whose caller gave up (its timeout) and whose answer came
/// later: its rate is refunded, its window stays charged (a window's entry
/// cannot be given back) and is reported `Unrefunded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_mixed_decision_refunds_its_rate_and_reports_its_window() {
    let mut server = RedisServer::start();
    let store = RedisStorage::from_url(&server.url())
        .unwrap()
        .timeout(Duration::from_millis(100))
        .remember_refusals(false);
    let events = Arc::new(Mutex::new(Vec::new()));
    let _subscription = store.subscribe({
        let events = events.clone();
        Arc::new(move |event: &StorageEvent| {
            events.lock().unwrap().push(event.clone());
        })
    });
    let (plan, login) = (limit("lplan"), limit("llogin"));
    let quota = Quota::per_hour(10);
    let checks = [
        BucketCheck::new(&plan, "ana", quota, 1).unwrap(),
        BucketCheck::of_rule(&login, "ana", window(5, 60), 1).unwrap(),
    ];
    // The scripts are loaded while Redis answers: one decision, settled.
    let mut out = [Decision::default(); 2];
    assert!(
        store
            .check(&checks, &mut out)
            .await
            .unwrap()
            .verdict
            .allowed
    );
    store
        .settle(&[checks[0].settle(rate_tier_storage::Adjust::Refund(1))])
        .await
        .unwrap();

    server.pause();
    let timed_out = store.check(&checks, &mut out).await;
    assert!(
        matches!(timed_out, Err(StorageError::Timeout(_))),
        "{timed_out:?}"
    );
    server.resume();

    let started = Instant::now();
    let unrefunded = loop {
        let found = events.lock().unwrap().iter().find_map(|e| match e {
            StorageEvent::Unrefunded { limit, units } => {
                Some((limit.clone(), *units))
            }
            _ => None,
        });
        if let Some(found) = found {
            break found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no Unrefunded event: {:?}",
            events.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(unrefunded, (login.as_str().to_owned(), 1));
    // The refund is made before the task ends: wait for the rate to be
    // full again (it was charged by the late decision, then refunded).
    let started = Instant::now();
    loop {
        let (_, out) = decide(&store, &[checks[0].as_peek()]).await;
        if out[0].remaining == 10 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the rate keeps a charge its caller never saw"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, out) = decide(&store, &[checks[1].as_peek()]).await;
    assert_eq!(out[0].remaining, 3, "both decisions stay in the window");
    let only_window = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, StorageEvent::Unrefunded { .. }))
        .count();
    assert_eq!(only_window, 1, "{:?}", events.lock().unwrap());
}

// ---------------------------------------------------------------------------
// Redis Cluster (redis_support: connections and stores seeded with one node)

/// One user's window, rate and period: one slot, one call, all or
/// nothing, and exactly the window's limit across two instances seeded
/// with different nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_one_users_window_rate_and_period_are_one_decision() {
    let (plan, login, exports) =
        (limit("cplan"), limit("clogin"), limit("cexp"));
    let quota = Quota::per_hour(100);
    let daily = period(50, PeriodUnit::Day, 0);
    let user = unique("user");
    let passed = concurrent_passes(
        cluster_store(0).await,
        cluster_store(1).await,
        200,
        {
            let (plan, login, exports, user) =
                (plan.clone(), login.clone(), exports.clone(), user.clone());
            move |store| {
                let (plan, login, exports, user) = (
                    plan.clone(),
                    login.clone(),
                    exports.clone(),
                    user.clone(),
                );
                async move {
                    let checks = [
                        BucketCheck::of_rule(&login, &user, window(5, 60), 1)
                            .unwrap(),
                        BucketCheck::new(&plan, &user, quota, 1).unwrap(),
                        BucketCheck::of_rule(&exports, &user, daily.into(), 1)
                            .unwrap(),
                    ];
                    decide(&store, &checks).await.0.verdict.allowed
                }
            }
        },
    )
    .await;
    assert_eq!(passed, 5);
    let store = cluster_store(2).await;
    let mut conn = cluster_conn(2).await;
    let in_window =
        BucketCheck::of_rule(&login, &user, window(5, 60), 1).unwrap();
    let in_period =
        BucketCheck::of_rule(&exports, &user, daily.into(), 1).unwrap();
    let rate = BucketCheck::new(&plan, &user, quota, 1).unwrap();
    assert_eq!(llen(&mut conn, &in_window.key(KeyLayout::Cluster)).await, 5);
    assert_eq!(peek(&store, &rate).await.remaining, 95);
    assert_eq!(peek(&store, &in_period).await.remaining, 45);
    let key = in_window.key(KeyLayout::Cluster);
    assert_eq!(
        key,
        format!("trt:{}:{{{}}}", login.as_str(), sha1_hex(&user))
    );
}

/// Windows or periods of one decision in two slots: refused before
/// anything is sent. A rate in another slot is fine: decided first, and
/// refunded when the window's slot refuses.
#[tokio::test]
async fn cluster_windows_and_periods_in_two_slots_are_unsupported() {
    let store = cluster_store(0).await;
    let mut conn = cluster_conn(0).await;
    let (ip, login, exports) = (limit("cip"), limit("clog2"), limit("cexp2"));
    let user = unique("user");
    let address = partition_off(cluster_slot(&user, None), "addr");
    let in_window =
        BucketCheck::of_rule(&login, &user, window(2, 60), 1).unwrap();
    let elsewhere = BucketCheck::of_rule(
        &exports,
        &address,
        period(5, PeriodUnit::Month, 0).into(),
        1,
    )
    .unwrap();
    let mut out = [Decision::default(); 2];
    match store.check(&[in_window, elsewhere], &mut out).await {
        Err(StorageError::Unsupported(what)) => assert_eq!(
            what,
            "windows, periods and concurrency limits of one decision in two slots of a Redis Cluster"
        ),
        other => panic!("{other:?}"),
    }
    let window_at_address =
        BucketCheck::of_rule(&login, &address, window(2, 60), 1).unwrap();
    assert!(matches!(
        store.check(&[in_window, window_at_address], &mut out).await,
        Err(StorageError::Unsupported(_))
    ));
    assert_eq!(llen(&mut conn, &in_window.key(KeyLayout::Cluster)).await, 0);
    let exists: i64 =
        query(&mut conn, &["EXISTS", &elsewhere.key(KeyLayout::Cluster)]).await;
    assert_eq!(exists, 0, "a refused decision wrote its period");

    // A rate of another slot beside the window: the window's slot last.
    let rate = BucketCheck::new(&ip, &address, Quota::per_hour(3), 1).unwrap();
    let checks = [in_window, rate];
    for _ in 0..2 {
        assert!(decide(&store, &checks).await.0.verdict.allowed);
    }
    // The window refuses: the rate, charged first, is refunded.
    let (refused, out) = decide(&store, &checks).await;
    assert_eq!(refused.verdict.refused_by, Some(0));
    assert!(out[1].allowed);
    assert_eq!(out[1].remaining, 1);
    assert_eq!(peek(&store, &rate).await.remaining, 1);
    // The rate refuses: the window's slot is only read, nothing appended;
    // a window that would refuse too says so, one that would pass is read.
    assert!(decide(&store, &[rate]).await.0.verdict.allowed);
    let (refused, out) = decide(&store, &checks).await;
    assert!(!refused.verdict.allowed);
    assert!(!out[0].allowed && !out[1].allowed);
    assert!(out[0].retry_after_us > 0 && out[0].retry_after_us <= MINUTE);
    let fresh_user =
        partition_off(cluster_slot(&address, None), &unique("fresh"));
    let fresh =
        BucketCheck::of_rule(&login, &fresh_user, window(2, 60), 1).unwrap();
    let (refused, out) = decide(&store, &[fresh, rate]).await;
    assert_eq!(refused.verdict.refused_by, Some(1));
    assert!(out[0].allowed);
    assert_eq!(out[0].remaining, 2);
    assert_eq!(llen(&mut conn, &in_window.key(KeyLayout::Cluster)).await, 2);
    assert_eq!(llen(&mut conn, &fresh.key(KeyLayout::Cluster)).await, 0);
}

/// A rate refusal on a cluster, whether the rate is in the user's slot
/// (one script with the window, the period and the slot) or in another
/// (decided first, the user's slot then only read): no slot taken, nothing
/// appended to the window, nothing counted in the period.
#[tokio::test]
async fn cluster_a_rate_refusal_takes_no_slot_and_counts_nothing_in_a_window_or_a_period()
 {
    let store = cluster_store(0).await;
    let mut conn = cluster_conn(1).await;
    for rate_elsewhere in [false, true] {
        let (plan, login, exports, uploads) = (
            limit("crplan"),
            limit("crlog"),
            limit("crexp"),
            limit("crup"),
        );
        let user = unique("user");
        let address = partition_off(cluster_slot(&user, None), "addr");
        let rate_of = if rate_elsewhere { &address } else { &user };
        let daily = period(10, PeriodUnit::Day, 0);
        let slots: Rule = Concurrency::new(3).unwrap().into();
        let checks = |id: u64| {
            [
                BucketCheck::new(&plan, rate_of, Quota::per_hour(2), 1)
                    .unwrap(),
                BucketCheck::of_rule(&login, &user, window(10, 60), 1).unwrap(),
                BucketCheck::of_rule(&exports, &user, daily.into(), 1).unwrap(),
                BucketCheck::of_rule(&uploads, &user, slots, 1)
                    .unwrap()
                    .lease_id(id),
            ]
        };
        for id in 1..=2 {
            assert!(decide(&store, &checks(id)).await.0.verdict.allowed);
        }
        for id in 3..=5 {
            let (refused, out) = decide(&store, &checks(id)).await;
            assert_eq!(refused.verdict.refused_by, Some(0), "{out:?}");
            // The others would pass: read, not charged.
            assert!(out[1..].iter().all(|d| d.allowed), "{out:?}");
            let left: Vec<u64> = out[1..].iter().map(|d| d.remaining).collect();
            assert_eq!(left, [8, 8, 1], "elsewhere: {rate_elsewhere}");
        }
        let [_, in_window, in_period, slot] = checks(0);
        let layout = KeyLayout::Cluster;
        assert_eq!(llen(&mut conn, &in_window.key(layout)).await, 2);
        let record: String =
            query(&mut conn, &["GET", &in_period.key(layout)]).await;
        assert!(record.ends_with(":2"), "{record}");
        let members: Vec<String> =
            query(&mut conn, &["ZRANGE", &slot.key(layout), "0", "-1"]).await;
        assert_eq!(members.len(), 2, "{members:?}");
        assert_eq!(peek(&store, &in_window).await.remaining, 8);
        assert_eq!(peek(&store, &in_period).await.remaining, 8);
        assert_eq!(peek(&store, &slot.lease_id(0)).await.remaining, 1);
    }
}
