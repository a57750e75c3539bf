//! `PostgresStorage` on a real PostgreSQL: the schema (migrate, the error
//! when it is missing), exact limits under concurrency across instances,
//! all-or-nothing decisions, bad stored state, the cleanup, a caller that
//! stops waiting, and faults behind `FallbackStorage` (a stopped and a hung
//! server).
//!
//! Run with `cargo xtask test`, which starts a throwaway PostgreSQL and sets
//! `TRT_POSTGRES_URL`; the fault tests start servers of their own. Time is
//! the database's: the only waits are for real timeouts, kept short.
#![allow(clippy::unwrap_used)]

mod lua_support;
mod postgres_support;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gcra_core::{Adjust, Decision, Quota};
use postgres_support::db_now;
use rate_tier_storage::StorageExt;
use rate_tier_storage::fallback::FallbackStorage;
use rate_tier_storage::{
    BucketCheck, BucketSettle, KeyLayout, LimitName, PostgresStorage, Storage,
};
use rate_tier_test_support::{PostgresServer, env, unique};
use tokio_postgres::NoTls;

/// A store on `url`, migrated into a table of its own.
async fn migrated(url: &str) -> PostgresStorage {
    let table = unique("trt_store").replace('-', "_");
    let store = PostgresStorage::builder(url)
        .unwrap()
        .table(&table)
        .unwrap()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    store.migrate().await.unwrap();
    store
}

/// Another instance on the same table, connected as production does.
async fn instance(url: &str, table: &str) -> PostgresStorage {
    PostgresStorage::builder(url)
        .unwrap()
        .table(table)
        .unwrap()
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

fn name(prefix: &str) -> LimitName {
    LimitName::new(unique(prefix)).unwrap()
}

async fn one(store: &dyn Storage, check: BucketCheck<'_>) -> Decision {
    let mut out = [Decision::default()];
    store.check(&[check], &mut out).await.unwrap();
    out[0]
}

async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn a_missing_schema_is_an_error_at_connect_naming_the_migration() {
    let url = env::postgres_url();
    let table = unique("trt_absent").replace('-', "_");
    let builder = PostgresStorage::builder(&url)
        .unwrap()
        .table(&table)
        .unwrap();
    let error = builder.connect().await.unwrap_err().to_string();
    assert!(error.contains(&table), "{error}");
    assert!(error.contains("PostgresStorage::migrate()"), "{error}");

    // Migrated twice: nothing changes, and instances connect.
    let store = PostgresStorage::builder(&url)
        .unwrap()
        .table(&table)
        .unwrap()
        .build()
        .unwrap();
    assert!(!store.is_migrated().await.unwrap());
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    assert!(store.is_migrated().await.unwrap());
    instance(&url, &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_under_300_concurrent_checks_pass_exactly_the_burst() {
    let url = env::postgres_url();
    let first = Arc::new(migrated(&url).await);
    let second = Arc::new(instance(&url, first.table()).await);
    let free = Arc::new(name("free"));
    let quota = Quota::per_hour(50);
    let mut tasks = Vec::new();
    for i in 0..300 {
        let store: Arc<PostgresStorage> = if i % 2 == 0 {
            first.clone()
        } else {
            second.clone()
        };
        let free = free.clone();
        tasks.push(tokio::spawn(async move {
            let check = [BucketCheck::new(&free, "ana", quota, 1).unwrap()];
            let mut out = [Decision::default()];
            store.check(&check, &mut out).await.unwrap().verdict.allowed
        }));
    }
    let mut passed = 0;
    for task in tasks {
        passed += usize::from(task.await.unwrap());
    }
    assert_eq!(passed, 50);
}

#[tokio::test]
async fn a_refused_decision_charges_no_bucket_and_settles_carry_a_whole_debt() {
    let url = env::postgres_url();
    let store = migrated(&url).await;
    let (plan, search) = (name("free"), name("search"));
    let both = |cost| {
        [
            BucketCheck::new(&plan, "ana", Quota::per_minute(10), cost)
                .unwrap(),
            BucketCheck::new(&search, "ana", Quota::per_minute(1), 1).unwrap(),
        ]
    };
    let mut out = [Decision::default(); 2];
    assert!(
        store
            .check(&both(1), &mut out)
            .await
            .unwrap()
            .verdict
            .allowed
    );
    let refused = store.check(&both(1), &mut out).await.unwrap();
    assert_eq!(refused.verdict.refused_by, Some(1));
    // The tier would have passed, and was not charged.
    assert!(out[0].allowed);
    assert_eq!(out[0].remaining, 9);
    let plan_now = one(
        &store,
        BucketCheck::peek(&plan, "ana", Quota::per_minute(10)),
    )
    .await;
    assert_eq!(plan_now.remaining, 9);

    // A debt of 1199 tokens on 1000/min is waited for whole (the quota
    // carries debts whole): 72 s ahead.
    let tokens = name("tokens");
    let quota = Quota::per_minute(1000).unbounded_debt();
    assert!(
        one(&store, BucketCheck::new(&tokens, "ana", quota, 1).unwrap())
            .await
            .allowed
    );
    let settle = [
        BucketCheck::peek(&tokens, "ana", quota).settle(Adjust::Charge(1199))
    ];
    store.settle(&settle).await.unwrap();
    let next =
        one(&store, BucketCheck::new(&tokens, "ana", quota, 1).unwrap()).await;
    assert!(!next.allowed);
    let waits = next.retry_after_us;
    assert!((11_900_000..=12_060_000).contains(&waits), "{waits}");
}

#[tokio::test]
async fn corrupt_or_far_stored_tats_are_absent_or_capped() {
    let url = env::postgres_url();
    let store = migrated(&url).await;
    let db = raw(&url).await;
    let free = name("free");
    let quota = Quota::per_minute(10);
    let check = BucketCheck::new(&free, "ana", quota, 1).unwrap();
    let key = check.key(KeyLayout::Single);
    let insert = format!(
        "INSERT INTO {} VALUES ($1, $2, 0) ON CONFLICT (key) DO UPDATE SET tat_us = excluded.tat_us",
        store.table()
    );
    // Negative, and beyond gcra-core's range: a full bucket.
    for corrupt in [-1i64, i64::MAX] {
        db.execute(&insert, &[&key, &corrupt]).await.unwrap();
        let d = one(&store, check).await;
        assert!(d.allowed && d.remaining == 9, "{corrupt}: {d:?}");
    }
    // A year ahead (a clock that went back): capped to the ceiling (now +
    // tau + the quota's most debt), so the wait is that debt and one
    // request, not a year.
    let ahead = db_now(&db).await + 31_536_000_000_000;
    db.execute(&insert, &[&key, &ahead]).await.unwrap();
    let d = one(&store, check).await;
    assert!(!d.allowed);
    assert_eq!(
        d.retry_after_us,
        quota.max_debt_us() + quota.emission_interval_us(),
        "{d:?}"
    );
}

#[tokio::test]
async fn the_cleanup_removes_expired_rows_and_nothing_live() {
    let url = env::postgres_url();
    let store = migrated(&url).await;
    let db = raw(&url).await;
    let insert = format!("INSERT INTO {} VALUES ($1, 0, $2)", store.table());
    let now = db_now(&db).await;
    for i in 0..25 {
        db.execute(&insert, &[&format!("dead{i}"), &(now - 1_000_000)])
            .await
            .unwrap();
    }
    for i in 0..5 {
        db.execute(&insert, &[&format!("live{i}"), &(now + 3_600_000_000)])
            .await
            .unwrap();
    }
    // Bounded batches: 10, 10, 5, then nothing.
    assert_eq!(store.cleanup(10).await.unwrap(), 10);
    assert_eq!(store.cleanup(10).await.unwrap(), 10);
    assert_eq!(store.cleanup(10).await.unwrap(), 5);
    assert_eq!(store.cleanup(10).await.unwrap(), 0);
    let left: Vec<String> = db
        .query(
            &format!("SELECT key FROM {} ORDER BY key", store.table()),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(left, ["live0", "live1", "live2", "live3", "live4"]);
}

// One thread: a decision's task cannot run, let alone answer, before the
// caller's first poll returns (on two, a preempted caller may find it
// answered already).
#[tokio::test(flavor = "current_thread")]
async fn a_caller_that_stops_waiting_leaves_no_charge() {
    let url = env::postgres_url();
    let table = migrated(&url).await.table().to_owned();
    let store = instance(&url, &table).await;
    let free = name("free");
    let quota = Quota::per_hour(10);
    // Callers that go away: each future is polled once (the decision is
    // sent) and dropped; each decision runs on, and is refunded.
    for _ in 0..20 {
        let check = [BucketCheck::new(&free, "ana", quota, 1).unwrap()];
        let mut out = [Decision::default()];
        let mut call = Box::pin(store.check(&check, &mut out));
        let first = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(call.as_mut().poll(cx).is_pending())
        })
        .await;
        assert!(first, "a PostgreSQL decision answered without a round trip");
        drop(call);
    }
    // And callers whose timeout fires first, the same way.
    let impatient = PostgresStorage::builder(&url)
        .unwrap()
        .table(&table)
        .unwrap()
        .timeout(Duration::ZERO)
        .build()
        .unwrap();
    for _ in 0..20 {
        let check = [BucketCheck::new(&free, "ana", quota, 1).unwrap()];
        let mut out = [Decision::default()];
        // A zero timeout may still let a fast answer through: either way
        // nothing may stay charged but what an answered caller saw.
        if impatient.check(&check, &mut out).await.is_ok() {
            let refund = [check[0].settle(Adjust::Refund(1))];
            store.settle(&refund).await.unwrap();
        }
    }
    let patient = &store;
    // The refunds come after the decisions: wait for them, briefly.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = one(patient, BucketCheck::peek(&free, "ana", quota)).await;
        if d.remaining == 10 {
            break;
        }
        assert!(Instant::now() < deadline, "still charged: {d:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A store on `url` that migrates by itself, behind a fallback that opens
/// after two failures.
fn behind_a_fallback(url: &str) -> (PostgresStorage, FallbackStorage) {
    let store = PostgresStorage::builder(url)
        .unwrap()
        .timeout(Duration::from_millis(200))
        .auto_migrate(true)
        .build()
        .unwrap();
    let fallback = FallbackStorage::builder(Arc::new(store.clone()))
        .failure_threshold(2)
        .cool_down(Duration::from_millis(200), Duration::from_millis(400))
        .build();
    (store, fallback)
}

/// [`behind_a_fallback`], migrated.
async fn migrated_behind_a_fallback(
    url: &str,
) -> (PostgresStorage, FallbackStorage) {
    let (store, fallback) = behind_a_fallback(url);
    store.migrate().await.unwrap();
    (store, fallback)
}

/// One check of ana's bucket (100/min) through `store`, which passes: who
/// decided it.
async fn who_decides(
    store: &FallbackStorage,
    free: &LimitName,
) -> &'static str {
    let check =
        [BucketCheck::new(free, "ana", Quota::per_minute(100), 1).unwrap()];
    let mut out = [Decision::default()];
    let decided = store.check(&check, &mut out).await.unwrap();
    assert!(out[0].allowed);
    decided.by
}

/// Polls [`who_decides`] until PostgreSQL decides again (a real server
/// coming back), with a deadline.
async fn until_postgres_decides(store: &FallbackStorage, free: &LimitName) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while who_decides(store, free).await != "postgres" {
        assert!(Instant::now() < deadline, "never decided by PostgreSQL");
        // Fewer checks in the deadline than ana's 100 a minute.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_decided_locally_then_shared_again() {
    let mut server = PostgresServer::start();
    let (_store, fallback) = migrated_behind_a_fallback(&server.url()).await;
    let free = name("free");
    assert_eq!(who_decides(&fallback, &free).await, "postgres");
    server.kill();
    for _ in 0..10 {
        assert_eq!(who_decides(&fallback, &free).await, "fallback");
    }
    server.restart();
    until_postgres_decides(&fallback, &free).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_started_while_its_server_is_down_creates_its_table_once_it_answers()
 {
    let mut server = PostgresServer::start();
    server.stop();
    let (store, fallback) = behind_a_fallback(&server.url());
    // As the example server starts: a migration that cannot run yet.
    assert!(store.migrate().await.is_err());
    let free = name("free");
    for _ in 0..5 {
        assert_eq!(who_decides(&fallback, &free).await, "fallback");
    }
    server.restart();
    until_postgres_decides(&fallback, &free).await;
    assert!(store.is_migrated().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_answers_fast_once_the_breaker_opens() {
    // Paused: the server and its backends stopped, sockets open, silent.
    let mut server = PostgresServer::start();
    let (_store, fallback) = migrated_behind_a_fallback(&server.url()).await;
    let free = name("free");
    assert_eq!(who_decides(&fallback, &free).await, "postgres");
    server.pause();
    // Two timeouts open the breaker; then every answer is local and fast.
    for _ in 0..2 {
        who_decides(&fallback, &free).await;
    }
    for _ in 0..20 {
        let started = Instant::now();
        assert_eq!(who_decides(&fallback, &free).await, "fallback");
        assert!(
            started.elapsed() < Duration::from_millis(150),
            "{:?}",
            started.elapsed()
        );
    }
    server.resume();
}

#[tokio::test]
async fn settle_of_many_buckets_and_a_refund_to_full_forgets_the_row() {
    let url = env::postgres_url();
    let store = migrated(&url).await;
    let db = raw(&url).await;
    let tokens = name("tokens");
    let quota = Quota::per_minute(1000);
    let check = BucketCheck::new(&tokens, "ana", quota, 5).unwrap();
    assert!(one(&store, check).await.allowed);
    let settle: [BucketSettle<'_>; 1] = [check.settle(Adjust::Refund(5))];
    store.settle(&settle).await.unwrap();
    let rows: i64 = db
        .query_one(&format!("SELECT count(*) FROM {}", store.table()), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "a full bucket is no row");
}

#[tokio::test]
async fn the_background_cleanup_runs_by_itself() {
    let url = env::postgres_url();
    let table = migrated(&url).await.table().to_owned();
    // Built inside a runtime: its cleanup runs every 100 ms, 10 rows a
    // statement, repeated while batches are full.
    let store = PostgresStorage::builder(&url)
        .unwrap()
        .table(&table)
        .unwrap()
        .cleanup_every(Some(Duration::from_millis(100)), 10)
        .build()
        .unwrap();
    let db = raw(&url).await;
    let insert = format!("INSERT INTO {table} VALUES ($1, 0, $2)");
    let now = db_now(&db).await;
    for i in 0..35 {
        db.execute(&insert, &[&format!("dead{i}"), &(now - 1)])
            .await
            .unwrap();
    }
    db.execute(&insert, &[&"live", &(now + 3_600_000_000)])
        .await
        .unwrap();
    let count = format!("SELECT count(*) FROM {table}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let rows: i64 = db.query_one(&count, &[]).await.unwrap().get(0);
        if rows == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "{rows} rows left");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_over_the_same_buckets_in_opposite_orders_never_deadlock() {
    // PostgreSQL detects a deadlock and fails one of its transactions: every
    // decision here must answer, and the buckets hold exactly what passed.
    let url = env::postgres_url();
    let store = Arc::new(migrated(&url).await);
    let (a, b) = (Arc::new(name("a")), Arc::new(name("b")));
    let quota = Quota::per_hour(1_000);
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (store, a, b) = (store.clone(), a.clone(), b.clone());
            tokio::spawn(async move {
                let mut passed = 0u64;
                for _ in 0..50 {
                    let first = BucketCheck::new(&a, "ana", quota, 1).unwrap();
                    let second = BucketCheck::new(&b, "ana", quota, 1).unwrap();
                    let checks = if t % 2 == 0 {
                        [first, second]
                    } else {
                        [second, first]
                    };
                    let mut out = [Decision::default(); 2];
                    let decided = store.check(&checks, &mut out).await.unwrap();
                    passed += u64::from(decided.verdict.allowed);
                }
                passed
            })
        })
        .collect();
    let mut passed = 0;
    for task in tasks {
        passed += task.await.unwrap();
    }
    assert_eq!(passed, 400);
    for bucket in [&a, &b] {
        let left = one(&*store, BucketCheck::peek(bucket, "ana", quota)).await;
        assert_eq!(left.remaining, 600, "{}", bucket.as_str());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bucket_checks_and_decisions_over_several_share_one_lock() {
    // A check of one bucket is a plain upsert and a decision over two is the
    // check function: both take the bucket's lock before reading it, or one
    // would overwrite what the other charged and more than the burst pass.
    let url = env::postgres_url();
    let store = Arc::new(migrated(&url).await);
    let (a, b) = (Arc::new(name("a")), Arc::new(name("b")));
    let quota = Quota::per_hour(100);
    let roomy = Quota::per_hour(1_000);
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (store, a, b) = (store.clone(), a.clone(), b.clone());
            tokio::spawn(async move {
                let (mut alone, mut joint) = (0u64, 0u64);
                for _ in 0..40 {
                    let first = BucketCheck::new(&a, "ana", quota, 1).unwrap();
                    if t % 2 == 0 {
                        let mut out = [Decision::default()];
                        let decided =
                            store.check(&[first], &mut out).await.unwrap();
                        alone += u64::from(decided.verdict.allowed);
                    } else {
                        let second =
                            BucketCheck::new(&b, "ana", roomy, 1).unwrap();
                        let mut out = [Decision::default(); 2];
                        let decided = store
                            .check(&[second, first], &mut out)
                            .await
                            .unwrap();
                        joint += u64::from(decided.verdict.allowed);
                    }
                }
                (alone, joint)
            })
        })
        .collect();
    let (mut alone, mut joint) = (0, 0);
    for task in tasks {
        let (a, j) = task.await.unwrap();
        alone += a;
        joint += j;
    }
    assert_eq!(alone + joint, 100, "{alone} alone, {joint} with b");
    assert!(alone > 0 && joint > 0, "{alone} alone, {joint} with b");
    let left = one(&*store, BucketCheck::peek(&b, "ana", roomy)).await;
    assert_eq!(left.remaining, 1_000 - joint);
}

#[tokio::test]
async fn an_unlogged_table_is_migrated_as_such_and_decides_like_any() {
    let url = env::postgres_url();
    let table = unique("trt_unlogged").replace('-', "_");
    let store = PostgresStorage::builder(&url)
        .unwrap()
        .table(&table)
        .unwrap()
        .unlogged(true)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    store.migrate().await.unwrap();
    // Again: nothing changes but the functions.
    store.migrate().await.unwrap();
    let db = raw(&url).await;
    let unlogged: bool = db
        .query_one(
            "SELECT relpersistence = 'u' FROM pg_class WHERE relname = $1",
            &[&table],
        )
        .await
        .unwrap()
        .get(0);
    assert!(unlogged, "{table} is not UNLOGGED");
    let free = name("free");
    let quota = Quota::per_minute(2);
    for expected in [true, true, false] {
        let d = one(&store, BucketCheck::new(&free, "ana", quota, 1).unwrap())
            .await;
        assert_eq!(d.allowed, expected);
    }
}
