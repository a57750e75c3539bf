//! Reservations ([`StorageExt::reserve`], [`StorageExt::cancel`]) of
//! `RedisStorage` on a real Redis and a real Redis Cluster.
//!
//! Run with `cargo xtask test-redis` (the single-node tests) and `cargo
//! xtask test-cluster` (those whose names hold `cluster`), which start
//! throwaway servers and set `TRT_REDIS_URL` / `TRT_REDIS_CLUSTER_URLS`.
//! Without them these tests fail: they never pass silently, and they never
//! use the shared Redis on port 6379.
//!
//! Every test uses its own limit names. Waits are numbers the tests read,
//! never slept: an interval of a second is far longer than a test's calls,
//! so each reservation's slot is exact whatever Redis's clock does.

mod redis_support;
use std::time::{Duration, Instant};

use rate_tier_storage::StorageExt;
use rate_tier_storage::{
    BucketCheck, Decided, Decision, KeyLayout, LimitName, Quota, RedisStorage,
    Storage, StorageError, Window,
};
use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

use rate_tier_test_support::{
    Monitor, TEST_TIMEOUT, TcpProxy, redis_url, unique,
};
use redis_support::{connect, store};
use sha1::{Digest, Sha1};

const RESERVE: &str = include_str!("../src/redis/reserve.lua");

const SECOND: u64 = 1_000_000;

// ---------------------------------------------------------------------------
// Helpers

fn limit(prefix: &str) -> LimitName {
    LimitName::new(unique(prefix)).expect("a valid name")
}

/// One call a second, evenly (burst 1), waits of up to `debt`.
fn even(debt: Duration) -> Quota {
    Quota::per_second(1).allow_burst(1).allow_debt(debt)
}

/// The stored TAT of `check`'s bucket, `None` when there is no key.
async fn stored(
    conn: &mut ConnectionManager,
    check: &BucketCheck<'_>,
) -> Option<u64> {
    let value: Option<String> = redis::cmd("GET")
        .arg(check.key(KeyLayout::Single))
        .query_async(conn)
        .await
        .expect("GET");
    value.map(|v| v.parse().expect("a TAT"))
}

async fn reserve(
    store: &impl Storage,
    checks: &[BucketCheck<'_>],
    max_wait: Duration,
) -> (Decided, Vec<Decision>) {
    let mut out = vec![Decision::default(); checks.len()];
    let decided = store
        .reserve(checks, max_wait, &mut out)
        .await
        .expect("reserve");
    assert_eq!((decided.by, decided.now_us), ("redis", None));
    (decided, out)
}

/// The TAT a reservation wrote in bucket `i`.
fn written(out: &[Decision], i: usize) -> u64 {
    out[i]
        .store
        .expect("the reservation wrote the bucket")
        .tat_us
}

// ---------------------------------------------------------------------------
// A single Redis

#[tokio::test]
async fn reserves_answers_yes() {
    assert!(store().await.capabilities().reserves);
}

/// Nothing to reserve: the slot is now, and no call is made.
#[tokio::test]
async fn a_reservation_of_no_bucket_is_at_once() {
    let store = store().await;
    let max_wait = Duration::from_millis(250);
    let decided = store.reserve(&[], max_wait, &mut []).await.unwrap();
    assert!(decided.verdict.allowed);
    assert_eq!((decided.wait_us, decided.by), (0, "redis"));
    store.cancel(&[]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_reservations_from_two_instances_take_one_slot_each()
 {
    let (a, b) = (store().await, store().await);
    let name = limit("provider");
    let quota = even(Duration::from_secs(200));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..100 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            let check = [BucketCheck::new(&name, "", quota, 1).unwrap()];
            let (decided, out) =
                reserve(&store, &check, Duration::from_secs(150)).await;
            assert!(decided.verdict.allowed, "{decided:?}");
            (written(&out, 0), decided.wait_us)
        }));
    }
    let mut slots = Vec::new();
    for task in tasks {
        slots.push(task.await.expect("a reservation"));
    }
    let elapsed = u64::try_from(started.elapsed().as_micros()).unwrap();
    assert!(
        elapsed < SECOND,
        "the calls took {elapsed} µs: slots would overlap"
    );
    slots.sort_unstable();
    let first = slots[0].0;
    for (k, &(tat, wait)) in (0u64..).zip(&slots) {
        // Every slot one interval after the one before: no two reserved
        // the same, none skipped.
        assert_eq!(tat, first + k * SECOND, "slot {k}");
        // Each waits for its slot, from the instant Redis reserved it.
        assert!(
            wait <= k * SECOND && wait + elapsed > k * SECOND,
            "slot {k}: wait {wait}"
        );
    }
    let mut waits: Vec<u64> = slots.iter().map(|s| s.1).collect();
    waits.dedup();
    assert_eq!(waits.len(), 100, "distinct waits");
    let mut conn = connect().await;
    let check = BucketCheck::new(&name, "", quota, 1).unwrap();
    assert_eq!(stored(&mut conn, &check).await, Some(first + 99 * SECOND));
}

#[tokio::test]
async fn a_reservation_too_long_charges_nothing() {
    let store = store().await;
    let mut conn = connect().await;
    let name = limit("too-long");
    let check = [
        BucketCheck::new(&name, "", even(Duration::from_secs(10)), 1).unwrap(),
    ];
    let (first, out) = reserve(&store, &check, Duration::from_secs(5)).await;
    assert!(first.verdict.allowed);
    assert_eq!(first.wait_us, 0);
    let tat = written(&out, 0);
    let (second, out) =
        reserve(&store, &check, Duration::from_millis(500)).await;
    assert!(!second.verdict.allowed);
    assert!(second.wait_us > 500_000 && second.wait_us <= SECOND);
    assert_eq!(second.verdict.refused_by, Some(0));
    assert_eq!(out[0].store, None);
    assert_eq!(stored(&mut conn, &check[0]).await, Some(tat), "uncharged");
    // Longer than the quota's own most (its debt, 10 s): the same.
    let later = Duration::from_secs(60);
    for _ in 0..10 {
        assert!(reserve(&store, &check, later).await.0.verdict.allowed);
    }
    let (last, _) = reserve(&store, &check, later).await;
    assert!(!last.verdict.allowed, "{last:?}");
    assert!(last.wait_us > 10 * SECOND);
    assert_eq!(stored(&mut conn, &check[0]).await, Some(tat + 10 * SECOND));
}

#[tokio::test]
async fn a_joint_reservation_refused_by_one_limit_charges_neither() {
    let store = store().await;
    let mut conn = connect().await;
    let (plan, provider) = (limit("plan"), limit("slow"));
    let checks = [
        BucketCheck::new(&plan, "ana", Quota::per_minute(100), 1).unwrap(),
        BucketCheck::new(&provider, "ana", even(Duration::from_secs(10)), 1)
            .unwrap(),
    ];
    // Both charged at once, then the slow one's next slot is a second away.
    let (decided, out) = reserve(&store, &checks, Duration::ZERO).await;
    assert!(decided.verdict.allowed);
    let before = [written(&out, 0), written(&out, 1)];
    let (refused, out) =
        reserve(&store, &checks, Duration::from_millis(100)).await;
    assert!(!refused.verdict.allowed);
    assert_eq!(refused.verdict.refused_by, Some(1));
    assert!(refused.wait_us > 900_000, "{refused:?}");
    assert_eq!((out[0].store, out[1].store), (None, None));
    assert_eq!(stored(&mut conn, &checks[0]).await, Some(before[0]));
    assert_eq!(stored(&mut conn, &checks[1]).await, Some(before[1]));

    // Waiting long enough: both charged, the tier at the slow one's slot.
    let (reserved, out) =
        reserve(&store, &checks, Duration::from_secs(2)).await;
    assert!(reserved.verdict.allowed);
    assert_eq!(reserved.verdict.refused_by, None);
    assert_eq!(written(&out, 1), before[1] + SECOND);
    // The slot is the slow one's TAT (burst 1: it goes when its last one
    // is due); the tier is charged as a check at that instant.
    let t = Quota::per_minute(100).emission_interval_us();
    assert_eq!(written(&out, 0), before[0].max(before[1]) + t);
}

#[tokio::test]
async fn cancel_while_last_gives_back_exactly_and_after_a_later_one_keeps() {
    let store = store().await;
    let mut conn = connect().await;
    let name = limit("cancel");
    let check = [
        BucketCheck::new(&name, "", even(Duration::from_secs(10)), 1).unwrap(),
    ];
    let wait = Duration::from_secs(5);
    let (_, out) = reserve(&store, &check, wait).await;
    let first = written(&out, 0);
    let (second, out) = reserve(&store, &check, wait).await;
    let tat = written(&out, 0);
    assert_eq!(tat, first + SECOND);
    assert!(second.wait_us > 0);

    // The last one given back: the TAT as before it, exactly.
    store.cancel(&[check[0].cancel(tat)]).await.expect("cancel");
    assert_eq!(stored(&mut conn, &check[0]).await, Some(first));
    // Twice: nothing more.
    store.cancel(&[check[0].cancel(tat)]).await.expect("cancel");
    assert_eq!(stored(&mut conn, &check[0]).await, Some(first));

    // The slot given back is the next one's; then the first, no longer
    // last, is kept.
    let (_, out) = reserve(&store, &check, wait).await;
    assert_eq!(written(&out, 0), tat);
    store
        .cancel(&[check[0].cancel(first)])
        .await
        .expect("cancel");
    assert_eq!(stored(&mut conn, &check[0]).await, Some(tat));
}

#[tokio::test]
async fn a_reservation_whose_caller_left_is_given_back_and_never_sent_twice() {
    // Through a proxy that can go silent: the reservation reaches Redis
    // only after its caller gave up.
    let target = redis_url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .parse()
        .expect("TRT_REDIS_URL is host:port");
    let proxy = TcpProxy::start(target);
    let conn = redis::Client::open(proxy.redis_url())
        .expect("URL")
        .get_connection_manager()
        .await
        .expect("connect through the proxy");
    let timeout = Duration::from_millis(50);
    let hasty = RedisStorage::new(conn).timeout(timeout);
    let patient = hasty.clone().timeout(TEST_TIMEOUT);
    let marker = unique("gone");
    let name = LimitName::new(marker.clone()).unwrap();
    let monitor = Monitor::start(&redis_url(), &marker);
    let check = [
        BucketCheck::new(&name, "", even(Duration::from_secs(10)), 1).unwrap(),
    ];
    let (_, out) = reserve(&patient, &check, Duration::from_secs(5)).await;
    let first = written(&out, 0);

    proxy.freeze();
    let mut out = [Decision::default()];
    let error = hasty
        .reserve(&check, Duration::from_secs(5), &mut out)
        .await
        .expect_err("no answer in time");
    // A failure, never a refusal.
    assert!(matches!(error, StorageError::Timeout(_)), "{error}");
    assert!(error.is_failure());
    proxy.heal();

    // Redis reserved it once the proxy thawed; the task, its caller gone,
    // gave it back: the script's writes are the first slot, the late one,
    // and the first again.
    let key = check[0].key(KeyLayout::Single);
    let deadline = Instant::now() + Duration::from_secs(3);
    let sets = loop {
        let sets: Vec<Vec<String>> = monitor
            .script_commands()
            .into_iter()
            .filter(|c| c[0] == "set" && c[1] == key)
            .collect();
        if sets.len() >= 3 || Instant::now() > deadline {
            break sets;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let values: Vec<&str> = sets.iter().map(|c| c[2].as_str()).collect();
    let (first_s, late_s) = (first.to_string(), (first + SECOND).to_string());
    assert_eq!(values, [&first_s, &late_s, &first_s], "{sets:?}");
    let mut conn = connect().await;
    assert_eq!(stored(&mut conn, &check[0]).await, Some(first));
    // The reservation was sent once: a lost reply is not sent again.
    let reserve_sha = hex::encode(Sha1::digest(RESERVE.as_bytes()));
    let sent = monitor
        .client_commands()
        .into_iter()
        .filter(|c| c[0] == "evalsha" && c[1] == reserve_sha)
        .count();
    assert_eq!(sent, 2, "the first reservation and the late one");

    let (next, out) = reserve(&patient, &check, Duration::from_secs(5)).await;
    assert!(next.verdict.allowed);
    assert_eq!(written(&out, 0), first + SECOND, "the slot given back");
}

#[tokio::test]
async fn only_rates_reserve() {
    let store = store().await;
    let login = limit("login");
    let window = Window::new(5, Duration::from_secs(60)).unwrap();
    let check =
        [BucketCheck::of_rule(&login, "ana", window.into(), 1).unwrap()];
    let mut out = [Decision::default()];
    let error = store
        .reserve(&check, Duration::from_secs(1), &mut out)
        .await
        .expect_err("a window");
    assert!(matches!(error, StorageError::Unsupported(_)), "{error}");
    assert!(!error.is_failure());
    let error = store
        .cancel(&[check[0].cancel(1)])
        .await
        .expect_err("a window");
    assert!(matches!(error, StorageError::Unsupported(_)), "{error}");
}

// ---------------------------------------------------------------------------
// A Redis Cluster

async fn cluster_store() -> (RedisStorage, ClusterConnection) {
    let urls = rate_tier_test_support::cluster_urls(3);
    let conn = || async {
        ClusterClient::new(urls.clone())
            .expect("valid URLs")
            .get_async_connection()
            .await
            .expect("the cluster does not answer")
    };
    let store = RedisStorage::cluster(conn().await)
        .timeout(TEST_TIMEOUT)
        .remember_refusals(false);
    (store, conn().await)
}

async fn cluster_stored(
    conn: &mut ClusterConnection,
    check: &BucketCheck<'_>,
) -> Option<u64> {
    let value: Option<String> = redis::cmd("GET")
        .arg(check.key(KeyLayout::Cluster))
        .query_async(conn)
        .await
        .expect("GET");
    value.map(|v| v.parse().expect("a TAT"))
}

#[tokio::test]
async fn a_joint_reservation_of_one_users_limits_on_the_cluster() {
    let (store, mut conn) = cluster_store().await;
    let (plan, provider) = (limit("cluster-plan"), limit("cluster-slow"));
    let checks = [
        BucketCheck::new(&plan, "ana", Quota::per_minute(100), 1).unwrap(),
        BucketCheck::new(&provider, "ana", even(Duration::from_secs(10)), 1)
            .unwrap(),
    ];
    let (first, out) = reserve(&store, &checks, Duration::from_secs(5)).await;
    assert!(first.verdict.allowed);
    let before = [written(&out, 0), written(&out, 1)];
    // Too long for 100 ms: neither charged.
    let (refused, _) =
        reserve(&store, &checks, Duration::from_millis(100)).await;
    assert!(!refused.verdict.allowed);
    assert_eq!(refused.verdict.refused_by, Some(1));
    assert_eq!(cluster_stored(&mut conn, &checks[0]).await, Some(before[0]));
    assert_eq!(cluster_stored(&mut conn, &checks[1]).await, Some(before[1]));
    // Both at the slow one's next slot, and given back exactly.
    let (second, out) = reserve(&store, &checks, Duration::from_secs(5)).await;
    assert!(
        second.verdict.allowed && second.wait_us > 900_000,
        "{second:?}"
    );
    assert_eq!(written(&out, 1), before[1] + SECOND);
    let cancels = [
        checks[0].cancel(written(&out, 0)),
        checks[1].cancel(written(&out, 1)),
    ];
    store.cancel(&cancels).await.expect("cancel");
    assert_eq!(cluster_stored(&mut conn, &checks[1]).await, Some(before[1]));
    // The tier's back by its interval: to the slot, still ahead (it had
    // drained while the reservation waited; what came back with time stays).
    let t = Quota::per_minute(100).emission_interval_us();
    assert_eq!(
        cluster_stored(&mut conn, &checks[0]).await,
        Some(written(&out, 0) - t)
    );
}

#[tokio::test]
async fn a_reservation_over_two_slots_is_unsupported_on_the_cluster() {
    let (store, mut conn) = cluster_store().await;
    let (user, global) = (limit("cluster-user"), limit("cluster-global"));
    // Find a second partition in another slot than ana's.
    let ana = BucketCheck::new(&user, "ana", Quota::per_minute(10), 1).unwrap();
    let slot = |c: &BucketCheck<'_>| {
        rate_tier_storage::key::slot_of_key(&c.key(KeyLayout::Cluster))
    };
    let other = (0..)
        .map(|i| format!("p{i}"))
        .find(|p| {
            slot(
                &BucketCheck::new(&global, p, Quota::per_minute(10), 1)
                    .unwrap(),
            ) != slot(&ana)
        })
        .unwrap();
    let checks = [
        ana,
        BucketCheck::new(&global, &other, Quota::per_minute(10), 1).unwrap(),
    ];
    let mut out = [Decision::default(); 2];
    let error = store
        .reserve(&checks, Duration::from_secs(1), &mut out)
        .await
        .expect_err("two slots");
    assert!(matches!(error, StorageError::Unsupported(_)), "{error}");
    assert!(!error.is_failure());
    assert_eq!(cluster_stored(&mut conn, &checks[0]).await, None);
    assert_eq!(cluster_stored(&mut conn, &checks[1]).await, None);
}
