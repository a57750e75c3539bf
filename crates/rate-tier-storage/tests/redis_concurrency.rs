//! `RedisStorage` deciding concurrency limits with leases
//! (`decide_mixed.lua`'s tag 3, `release.lua`, `renew.lua`) on a real
//! Redis and a real Redis Cluster: exactly the limit is in flight across
//! instances, and never more in flight while slots are taken and given
//! back over and over, a release gives back exactly its own slots, a
//! renewal keeps them past the lease, an instance that dies loses them
//! when the lease ends (on a cluster too), a refusal by another limit
//! takes none, and a late answer gives back what it took.
//!
//! Run with `cargo xtask test-redis -- -p rate-tier-storage --test
//! redis_concurrency` (a throwaway Redis, `TRT_REDIS_URL`) and `cargo xtask
//! test-cluster -- -p rate-tier-storage --test redis_concurrency` (a
//! throwaway 3-master cluster, `TRT_REDIS_CLUSTER_URLS`: the tests whose
//! names hold `cluster`). Without them these tests fail, never pass
//! silently. One test starts a server of its own (it pauses it).
//!
//! Real time: the tests of leases take slots for 300 ms and wait for Redis
//! to free them (a second at most each); the races hold each slot 5 ms.
#![allow(clippy::unwrap_used)]

mod redis_support;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gcra_core::RETRY_HINT_US;
use rate_tier_storage::StorageExt;
use rate_tier_storage::key::cluster_slot;
use rate_tier_storage::{
    BucketCheck, Concurrency, Decided, Decision, KeyLayout, LimitName, Quota,
    RedisStorage, Rule, RuleKind, Storage, StorageError, StorageEvent,
};
use redis::aio::ConnectionLike;
use sha1::{Digest, Sha1};

use redis_support::{
    cluster_conn, cluster_store, connect, partition_off, store,
};

use rate_tier_test_support::env::hold_and_release;
use rate_tier_test_support::{RedisServer, unique};

const SHORT_LEASE: Duration = Duration::from_millis(300);

// ---------------------------------------------------------------------------
// Helpers

/// A limit of its own, named so that no other test uses it.
fn limit(prefix: &str) -> LimitName {
    LimitName::of_limit(unique(prefix)).expect("a valid name")
}

fn slots(limit: u32) -> Rule {
    Concurrency::new(limit).unwrap().into()
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
    (decided, out)
}

/// The slots a request of `id` takes: `cost` of `name`'s limit for `user`.
fn slot<'a>(
    name: &'a LimitName,
    user: &'a str,
    limit: u32,
    cost: u32,
    id: u64,
) -> BucketCheck<'a> {
    BucketCheck::of_rule(name, user, slots(limit), cost)
        .unwrap()
        .lease_id(id)
}

/// Whether the request of `id` takes its slot.
async fn takes(store: &RedisStorage, check: BucketCheck<'_>) -> bool {
    decide(store, &[check]).await.0.verdict.allowed
}

/// The slots free now: a peek (which needs no id).
async fn free(store: &RedisStorage, check: &BucketCheck<'_>) -> u64 {
    decide(store, &[check.as_peek().lease_id(0)]).await.1[0].remaining
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

/// The key's members, sorted.
async fn members(
    conn: &mut (impl ConnectionLike + Send),
    key: &str,
) -> Vec<String> {
    let mut members: Vec<String> =
        query(conn, &["ZRANGE", key, "0", "-1"]).await;
    members.sort();
    members
}

/// Redis's `TIME`, in µs.
async fn redis_now(conn: &mut (impl ConnectionLike + Send)) -> u64 {
    let (secs, micros): (u64, u64) = query(conn, &["TIME"]).await;
    secs * 1_000_000 + micros
}

/// `attempts` requests at once, half on each store, each with its own id
/// (1, 2, ...): the ids of those that took a slot.
async fn race<F>(
    a: RedisStorage,
    b: RedisStorage,
    attempts: u64,
    checks: F,
) -> Vec<u64>
where
    F: Fn(u64) -> Vec<(LimitName, String, Rule, u32)> + Send + Sync + 'static,
{
    let checks = Arc::new(checks);
    let tasks: Vec<_> = (1..=attempts)
        .map(|id| {
            let store = if id % 2 == 0 { a.clone() } else { b.clone() };
            let checks = checks.clone();
            tokio::spawn(async move {
                let owned = checks(id);
                let checks: Vec<BucketCheck<'_>> = owned
                    .iter()
                    .map(|(name, user, rule, cost)| {
                        BucketCheck::of_rule(name, user, *rule, *cost)
                            .unwrap()
                            .lease_id(id)
                    })
                    .collect();
                decide(&store, &checks)
                    .await
                    .0
                    .verdict
                    .allowed
                    .then_some(id)
            })
        })
        .collect();
    let mut passed = Vec::new();
    for task in tasks {
        passed.extend(task.await.expect("a check task panicked"));
    }
    passed
}

/// Waits until `ok` holds, within `within`.
async fn eventually<F, Fut>(within: Duration, what: &str, ok: F) -> Duration
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if ok().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------------------
// What the store says

#[tokio::test]
async fn redis_supports_every_kind_and_leases_slots_for_30_s() {
    let store = store().await;
    for kind in [
        RuleKind::Rate,
        RuleKind::Window,
        RuleKind::Period,
        RuleKind::Concurrency,
    ] {
        assert!(store.supports(kind), "{kind}");
    }
    assert_eq!(store.capabilities().lease, Some(Duration::from_secs(30)));
    let store = store.lease(SHORT_LEASE);
    assert_eq!(store.capabilities().lease, Some(SHORT_LEASE));
    assert_eq!(store.lease_duration(), SHORT_LEASE);
}

#[tokio::test]
async fn taking_a_slot_needs_an_id_and_a_peek_does_not() {
    let store = store().await;
    let uploads = limit("cid");
    let mut out = [Decision::default()];
    let anonymous =
        [BucketCheck::of_rule(&uploads, "ana", slots(2), 1).unwrap()];
    assert!(
        matches!(
            store.check(&anonymous, &mut out).await,
            Err(StorageError::Unsupported(_))
        ),
        "{out:?}"
    );
    assert_eq!(free(&store, &anonymous[0]).await, 2);
    // Nothing to release or renew without an id; another kind is refused.
    store.release(&anonymous).await.unwrap();
    store.renew(&anonymous).await.unwrap();
    let rate = LimitName::new(unique("crate")).unwrap();
    let not_slots =
        [BucketCheck::new(&rate, "ana", Quota::per_hour(1), 1).unwrap()];
    assert!(matches!(
        store.release(&not_slots).await,
        Err(StorageError::Unsupported(_))
    ));
}

// ---------------------------------------------------------------------------
// Exactly the limit, across instances

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_of_100_concurrent_acquisitions_across_two_instances_pass() {
    let uploads = limit("c100");
    let passed = race(store().await, store().await, 100, {
        let uploads = uploads.clone();
        move |_| vec![(uploads.clone(), "ana".into(), slots(5), 1)]
    })
    .await;
    assert_eq!(passed.len(), 5, "{passed:?}");
    let store = store().await;
    let mut conn = connect().await;
    let check = slot(&uploads, "ana", 5, 1, 0);
    let key = check.key(KeyLayout::Single);
    let mut expected: Vec<String> =
        passed.iter().map(|id| format!("{id}:1")).collect();
    expected.sort();
    assert_eq!(members(&mut conn, &key).await, expected);
    assert_eq!(free(&store, &check).await, 0);
    let (refused, out) =
        decide(&store, &[slot(&uploads, "ana", 5, 1, 999)]).await;
    assert!(!refused.verdict.allowed);
    assert_eq!(
        (out[0].retry_after_us, out[0].reset_after_us),
        (RETRY_HINT_US, 0)
    );

    // Every holder releases: all free again, the key gone.
    let holders: Vec<BucketCheck<'_>> = passed
        .iter()
        .map(|&id| slot(&uploads, "ana", 5, 1, id))
        .collect();
    for holder in &holders {
        store.release(std::slice::from_ref(holder)).await.unwrap();
    }
    assert_eq!(free(&store, &check).await, 5);
    let exists: i64 = query(&mut conn, &["EXISTS", &key]).await;
    assert_eq!(exists, 0);
}

#[tokio::test]
async fn a_release_by_id_frees_exactly_that_requests_slots() {
    let (a, b) = (store().await, store().await);
    let mut conn = connect().await;
    let uploads = limit("crel");
    let user = "bea";
    assert!(takes(&a, slot(&uploads, user, 4, 2, 11)).await);
    assert!(takes(&b, slot(&uploads, user, 4, 1, 12)).await);
    assert!(takes(&a, slot(&uploads, user, 4, 1, u64::MAX)).await);
    assert!(!takes(&b, slot(&uploads, user, 4, 1, 14)).await, "4 of 4");
    let key = slot(&uploads, user, 4, 1, 0).key(KeyLayout::Single);

    // Another instance releases request 11's two slots: exactly those.
    b.release(&[slot(&uploads, user, 4, 2, 11)]).await.unwrap();
    assert_eq!(
        members(&mut conn, &key).await,
        ["12:1", "18446744073709551615:1"]
    );
    assert_eq!(free(&a, &slot(&uploads, user, 4, 1, 0)).await, 2);
    // Again, or an id that holds nothing: nothing else is freed.
    a.release(&[slot(&uploads, user, 4, 2, 11)]).await.unwrap();
    a.release(&[slot(&uploads, user, 4, 1, 77)]).await.unwrap();
    assert_eq!(free(&a, &slot(&uploads, user, 4, 1, 0)).await, 2);
    assert!(takes(&b, slot(&uploads, user, 4, 2, 14)).await);
    assert!(!takes(&b, slot(&uploads, user, 4, 1, 15)).await);
}

/// A release of one limit's slots is a plain `ZREM` up to 64 of them and
/// `release.lua` beyond (several limits too): each frees exactly its
/// request's slots; a key of another type holds none and answers no error.
#[tokio::test]
async fn releases_of_a_few_slots_and_of_many_free_exactly_theirs() {
    let (a, b) = (store().await, store().await);
    let mut conn = connect().await;
    let (uploads, exports) = (limit("cfew"), limit("cmany"));
    let user = "eva";
    // 64 slots (one ZREM names them all), 65 (the script's), and 1.
    assert!(takes(&a, slot(&uploads, user, 200, 64, 21)).await);
    assert!(takes(&a, slot(&uploads, user, 200, 65, 22)).await);
    assert!(takes(&b, slot(&uploads, user, 200, 1, 23)).await);
    let peek = slot(&uploads, user, 200, 1, 0);
    assert_eq!(free(&a, &peek).await, 200 - 130);
    b.release(&[slot(&uploads, user, 200, 65, 22)])
        .await
        .unwrap();
    assert_eq!(free(&a, &peek).await, 200 - 65);
    a.release(&[slot(&uploads, user, 200, 64, 21)])
        .await
        .unwrap();
    let key = peek.key(KeyLayout::Single);
    assert_eq!(members(&mut conn, &key).await, ["23:1"]);

    // Two limits at once: the script, each key exactly its own.
    assert!(takes(&a, slot(&exports, user, 3, 2, 31)).await);
    b.release(&[
        slot(&uploads, user, 200, 1, 23),
        slot(&exports, user, 3, 2, 31),
    ])
    .await
    .unwrap();
    assert_eq!(free(&a, &peek).await, 200);
    assert_eq!(free(&a, &slot(&exports, user, 3, 1, 0)).await, 3);

    // Someone else's string at the key: nothing of ours, no error.
    let _: () = query(&mut conn, &["SET", &key, "not slots"]).await;
    a.release(&[slot(&uploads, user, 200, 1, 23)])
        .await
        .unwrap();
    a.release(&[slot(&uploads, user, 200, 65, 22)])
        .await
        .unwrap();
    let kept: String = query(&mut conn, &["GET", &key]).await;
    assert_eq!(kept, "not slots");
}

// ---------------------------------------------------------------------------
// Leases

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_slots_are_held_past_their_lease() {
    let holder = store().await.lease(SHORT_LEASE);
    let other = store().await;
    let mut conn = connect().await;
    let jobs = limit("cren");
    let held = slot(&jobs, "ana", 1, 1, 21);
    assert!(takes(&holder, held).await);
    let key = held.key(KeyLayout::Single);
    let started = Instant::now();
    // Renewed every 100 ms (a third of the lease) for three leases.
    while started.elapsed() < 3 * SHORT_LEASE {
        tokio::time::sleep(SHORT_LEASE / 3).await;
        holder.renew(&[held]).await.unwrap();
        assert!(!takes(&other, slot(&jobs, "ana", 1, 1, 22)).await);
        let score: f64 = query(&mut conn, &["ZSCORE", &key, "21:1"]).await;
        let now = redis_now(&mut conn).await;
        assert!(
            score as u64 > now && score as u64 <= now + 300_000,
            "{score} at {now}"
        );
        let pttl: i64 = query(&mut conn, &["PTTL", &key]).await;
        assert!(pttl > 0 && pttl <= 300, "PTTL {pttl}");
    }
    // No longer renewed: free once its lease ends.
    let waited = eventually(Duration::from_secs(2), "the slot's lease", || {
        let other = other.clone();
        let jobs = jobs.clone();
        async move { free(&other, &slot(&jobs, "ana", 1, 1, 0)).await == 1 }
    })
    .await;
    assert!(
        waited <= SHORT_LEASE + Duration::from_millis(200),
        "{waited:?}"
    );
    // A late renewal takes nothing back.
    holder.renew(&[held]).await.unwrap();
    assert_eq!(free(&other, &slot(&jobs, "ana", 1, 1, 0)).await, 1);
}

/// An instance that dies holding slots (never released nor renewed): they
/// are free once their lease ends, and the key goes with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instances_slots_are_free_after_its_lease() {
    let mut conn = connect().await;
    let uploads = limit("ckill");
    let check = slot(&uploads, "cid", 2, 1, 0);
    let key = check.key(KeyLayout::Single);
    {
        let doomed = store().await.lease(SHORT_LEASE);
        assert!(takes(&doomed, slot(&uploads, "cid", 2, 2, 31)).await);
        // Dropped here: the instance is gone.
    }
    let survivor = store().await;
    assert!(!takes(&survivor, slot(&uploads, "cid", 2, 1, 32)).await);
    let pttl: i64 = query(&mut conn, &["PTTL", &key]).await;
    assert!(pttl > 0 && pttl <= 300, "PTTL {pttl}");
    let waited =
        eventually(Duration::from_secs(2), "the dead slots", || {
            let survivor = survivor.clone();
            let uploads = uploads.clone();
            async move {
                free(&survivor, &slot(&uploads, "cid", 2, 1, 0)).await == 2
            }
        })
        .await;
    assert!(
        waited <= SHORT_LEASE + Duration::from_millis(200),
        "{waited:?}"
    );
    assert!(takes(&survivor, slot(&uploads, "cid", 2, 2, 33)).await);
    assert_eq!(members(&mut conn, &key).await, ["33:1", "33:2"]);
}

// ---------------------------------------------------------------------------
// Taken, held and given back, over and over

/// 16 tasks, alternately on `a` and `b`, each 20 times: take a slot of
/// `user`'s (3 in flight), hold it 5 ms (real time: about 0.1 s in all),
/// give it back. Never more than 3 in flight (counted between a pass and
/// its release), and all 3 free at the end.
async fn hold_race(a: RedisStorage, b: RedisStorage, user: &str) {
    let uploads = limit("chold");
    let take = {
        let (uploads, user) = (uploads.clone(), user.to_owned());
        move |store: RedisStorage, id| {
            let (uploads, user) = (uploads.clone(), user.clone());
            async move { takes(&store, slot(&uploads, &user, 3, 1, id)).await }
        }
    };
    let release = {
        let (uploads, user) = (uploads.clone(), user.to_owned());
        move |store: RedisStorage, id| {
            let (uploads, user) = (uploads.clone(), user.clone());
            async move {
                let held = slot(&uploads, &user, 3, 1, id);
                store.release(&[held]).await.unwrap();
            }
        }
    };
    let hold = Duration::from_millis(5);
    hold_and_release((a.clone(), b), (16, 20), hold, take, release)
        .await
        .assert_never_above(3);
    assert_eq!(free(&a, &slot(&uploads, user, 3, 1, 0)).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slots_taken_and_given_back_in_a_race_never_exceed_the_limit() {
    hold_race(store().await, store().await, &unique("racer")).await;
}

// ---------------------------------------------------------------------------
// All or nothing

#[tokio::test]
async fn a_refusal_by_a_rate_takes_no_slot_and_a_full_limit_charges_no_rate() {
    let store = store().await;
    let mut conn = connect().await;
    let plan = LimitName::new(unique("cplan")).unwrap();
    let uploads = limit("cup");
    let rate = BucketCheck::new(&plan, "dan", Quota::per_hour(2), 1).unwrap();
    let up = |id| slot(&uploads, "dan", 3, 1, id);
    assert!(decide(&store, &[rate, up(1)]).await.0.verdict.allowed);
    assert!(decide(&store, &[rate, up(2)]).await.0.verdict.allowed);
    // The tier is spent: refused by it, and the upload's slot not taken.
    let (refused, out) = decide(&store, &[rate, up(3)]).await;
    assert_eq!(refused.verdict.refused_by, Some(0));
    assert!(out[1].allowed);
    assert_eq!(out[1].remaining, 1, "the slots as they stand");
    let key = up(0).key(KeyLayout::Single);
    assert_eq!(members(&mut conn, &key).await, ["1:1", "2:1"]);

    // The uploads are full: the tier is not charged.
    let other = LimitName::new(unique("cplan2")).unwrap();
    let roomy =
        BucketCheck::new(&other, "dan", Quota::per_hour(10), 1).unwrap();
    assert!(decide(&store, &[roomy, up(4)]).await.0.verdict.allowed);
    let (refused, out) = decide(&store, &[roomy, up(5)]).await;
    assert_eq!(refused.verdict.refused_by, Some(1));
    assert_eq!(refused.verdict.retry_after_us, RETRY_HINT_US);
    assert!(out[0].allowed);
    assert_eq!(out[0].remaining, 9);
    assert_eq!(decide(&store, &[roomy.as_peek()]).await.1[0].remaining, 9);
    assert_eq!(members(&mut conn, &key).await, ["1:1", "2:1", "4:1"]);
}

#[tokio::test]
async fn slot_keys_are_hashed_sorted_sets_of_id_members_scored_by_expiry() {
    let store = store().await;
    let mut conn = connect().await;
    let uploads = limit("ckey");
    let user = "key_ana";
    let check = slot(&uploads, user, 5, 2, 41);
    let before = redis_now(&mut conn).await;
    assert!(takes(&store, check).await);
    let after = redis_now(&mut conn).await;
    let key = check.key(KeyLayout::Single);
    assert_eq!(
        key,
        format!("trt:limit/{}:{}", uploads.as_str(), sha1_hex(user))
    );
    assert!(!key.contains(user), "the user id in clear: {key}");
    let kind: String = query(&mut conn, &["TYPE", &key]).await;
    assert_eq!(kind, "zset");
    let scored: Vec<(String, f64)> =
        query(&mut conn, &["ZRANGE", &key, "0", "-1", "WITHSCORES"]).await;
    assert_eq!(scored.len(), 2);
    for (k, (member, score)) in scored.iter().enumerate() {
        assert_eq!(member, &format!("41:{}", k + 1));
        let expiry = *score as u64;
        assert!(
            expiry >= before + 30_000_000 && expiry <= after + 30_000_000,
            "{expiry} not 30 s after {before}..{after}"
        );
    }
    let pttl: i64 = query(&mut conn, &["PTTL", &key]).await;
    assert!(pttl > 29_000 && pttl <= 30_000, "PTTL {pttl}");
}

// ---------------------------------------------------------------------------
// A late answer

/// A decision whose caller gave up (its timeout) and whose answer came
/// later: the slot it took is released by its id, and nothing is reported
/// lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_decision_releases_the_slots_it_took() {
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
    let (plan, uploads) =
        (LimitName::new(unique("lplan")).unwrap(), limit("lup"));
    let quota = Quota::per_hour(10);
    let checks = |id| {
        [
            BucketCheck::new(&plan, "ana", quota, 1).unwrap(),
            slot(&uploads, "ana", 2, 1, id),
        ]
    };
    // The script is loaded while Redis answers: one decision, given back.
    let mut out = [Decision::default(); 2];
    assert!(
        store
            .check(&checks(1), &mut out)
            .await
            .unwrap()
            .verdict
            .allowed
    );
    store.release(&checks(1)[1..]).await.unwrap();
    store
        .settle(&[checks(1)[0].settle(rate_tier_storage::Adjust::Refund(1))])
        .await
        .unwrap();

    server.pause();
    let timed_out = store.check(&checks(2), &mut out).await;
    assert!(
        matches!(timed_out, Err(StorageError::Timeout(_))),
        "{timed_out:?}"
    );
    server.resume();

    // The late answer took a slot and a unit of the tier: both come back.
    let peek = |store: RedisStorage| {
        let (plan, uploads) = (plan.clone(), uploads.clone());
        async move {
            let checks = [
                BucketCheck::new(&plan, "ana", quota, 0).unwrap(),
                BucketCheck::of_rule(&uploads, "ana", slots(2), 0).unwrap(),
            ];
            let mut out = [Decision::default(); 2];
            store.check(&checks, &mut out).await.unwrap();
            (out[0].remaining, out[1].remaining)
        }
    };
    eventually(Duration::from_secs(5), "the late slot back", || {
        let store = store.clone();
        async move { peek(store).await == (10, 2) }
    })
    .await;
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = checks(0)[1].key(KeyLayout::Single);
    let exists: i64 = query(&mut conn, &["EXISTS", &key]).await;
    assert_eq!(exists, 0, "the late slot is still held");
    assert!(
        !events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, StorageEvent::Unrefunded { .. })),
        "{:?}",
        events.lock().unwrap()
    );
}

// ---------------------------------------------------------------------------
// Redis Cluster (redis_support: connections and stores seeded with one node)

/// One user's concurrency limit and rate: one slot, one call, all or
/// nothing, and exactly the limit in flight across two instances seeded
/// with different nodes; released and renewed on the node of the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_one_users_concurrency_and_rate_are_one_decision() {
    let (plan, uploads) =
        (LimitName::new(unique("ccplan")).unwrap(), limit("ccup"));
    let user = unique("user");
    let quota = Quota::per_hour(1000);
    let passed = race(cluster_store(0).await, cluster_store(1).await, 100, {
        let (plan, uploads, user) =
            (plan.clone(), uploads.clone(), user.clone());
        move |_| {
            vec![
                (uploads.clone(), user.clone(), slots(5), 1),
                (plan.clone(), user.clone(), Rule::Rate(quota), 1),
            ]
        }
    })
    .await;
    assert_eq!(passed.len(), 5, "{passed:?}");
    let store = cluster_store(2).await;
    let mut conn = cluster_conn(2).await;
    let rate = BucketCheck::new(&plan, &user, quota, 0).unwrap();
    assert_eq!(
        decide(&store, &[rate]).await.1[0].remaining,
        995,
        "the rate charged for the passes alone"
    );
    let check = slot(&uploads, &user, 5, 1, 0);
    let key = check.key(KeyLayout::Cluster);
    assert_eq!(
        key,
        format!("trt:limit/{}:{{{}}}", uploads.as_str(), sha1_hex(&user))
    );
    assert_eq!(members(&mut conn, &key).await.len(), 5);
    assert_eq!(free(&store, &check).await, 0);

    // Renewed and released through another node than the one that took
    // them.
    let holders: Vec<BucketCheck<'_>> = passed
        .iter()
        .map(|&id| slot(&uploads, &user, 5, 1, id))
        .collect();
    let before: f64 =
        query(&mut conn, &["ZSCORE", &key, &format!("{}:1", passed[0])]).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.renew(&holders).await.unwrap();
    let after: f64 =
        query(&mut conn, &["ZSCORE", &key, &format!("{}:1", passed[0])]).await;
    assert!(after > before, "{after} not after {before}");
    store.release(&holders[..2]).await.unwrap();
    assert_eq!(free(&store, &check).await, 2);
    store.release(&holders[2..]).await.unwrap();
    assert_eq!(free(&store, &check).await, 5);
}

/// A rate of another slot beside a user's concurrency limit: the rate is
/// decided first and refunded when the limit refuses; concurrency limits
/// in two slots are refused before anything is sent.
#[tokio::test]
async fn cluster_slots_are_decided_last_and_in_one_slot_only() {
    let store = cluster_store(0).await;
    let mut conn = cluster_conn(0).await;
    let (ip, uploads) = (LimitName::new(unique("cip")).unwrap(), limit("ccu"));
    let user = unique("user");
    let address = partition_off(cluster_slot(&user, None), "addr");
    let rate = BucketCheck::new(&ip, &address, Quota::per_hour(5), 1).unwrap();
    let up = |id| slot(&uploads, &user, 1, 1, id);
    assert!(decide(&store, &[up(1), rate]).await.0.verdict.allowed);
    let (refused, out) = decide(&store, &[up(2), rate]).await;
    assert_eq!(refused.verdict.refused_by, Some(0));
    assert!(out[1].allowed);
    assert_eq!(
        decide(&store, &[rate.as_peek()]).await.1[0].remaining,
        4,
        "the rate's charge refunded"
    );
    let elsewhere = slot(&uploads, &address, 1, 1, 3);
    let mut two = [Decision::default(); 2];
    match store.check(&[up(3), elsewhere], &mut two).await {
        Err(StorageError::Unsupported(what)) => assert_eq!(
            what,
            "windows, periods and concurrency limits of one decision in two slots of a Redis Cluster"
        ),
        other => panic!("{other:?}"),
    }
    let key = elsewhere.key(KeyLayout::Cluster);
    let exists: i64 = query(&mut conn, &["EXISTS", &key]).await;
    assert_eq!(exists, 0);
    // Releases in two slots: one call each.
    store.release(&[up(1), elsewhere]).await.unwrap();
    assert_eq!(free(&store, &up(0)).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_slots_taken_and_given_back_in_a_race_never_exceed_the_limit() {
    hold_race(
        cluster_store(0).await,
        cluster_store(1).await,
        &unique("racer"),
    )
    .await;
}

/// An instance that dies holding slots on a cluster (never released nor
/// renewed): another instance, seeded with another node, finds them free
/// once their lease ends, and the key goes with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_killed_instances_slots_are_free_after_its_lease() {
    let mut conn = cluster_conn(1).await;
    let uploads = limit("cckill");
    let user = unique("user");
    let check = slot(&uploads, &user, 2, 1, 0);
    let key = check.key(KeyLayout::Cluster);
    {
        let doomed = cluster_store(0).await.lease(SHORT_LEASE);
        assert!(takes(&doomed, slot(&uploads, &user, 2, 2, 31)).await);
        // Dropped here: the instance is gone.
    }
    let survivor = cluster_store(1).await;
    assert!(!takes(&survivor, slot(&uploads, &user, 2, 1, 32)).await);
    let pttl: i64 = query(&mut conn, &["PTTL", &key]).await;
    assert!(pttl > 0 && pttl <= 300, "PTTL {pttl}");
    let waited =
        eventually(Duration::from_secs(2), "the dead slots", || {
            let (survivor, uploads, user) =
                (survivor.clone(), uploads.clone(), user.clone());
            async move {
                free(&survivor, &slot(&uploads, &user, 2, 1, 0)).await == 2
            }
        })
        .await;
    assert!(
        waited <= SHORT_LEASE + Duration::from_millis(200),
        "{waited:?}"
    );
    assert!(takes(&survivor, slot(&uploads, &user, 2, 2, 33)).await);
    assert_eq!(members(&mut conn, &key).await, ["33:1", "33:2"]);
}
