//! Concurrency limits in `PostgresStorage`, with leases, on a real
//! PostgreSQL: the store itself (the functions against a model are
//! `postgres_kinds.rs`'s property test).
//!
//! - exact counts under concurrency across two instances, and never more
//!   than the limit in flight while slots are taken and given back over
//!   and over;
//! - a release by id gives back exactly that request's slots;
//! - a renewal keeps slots past their lease, and never takes back one
//!   that expired;
//! - slots never released nor renewed (an instance that died) are free
//!   once their lease ends, and their row goes by the cleanup;
//! - all or nothing with the other kinds: a refusal by a rate or a window
//!   takes no slot, and a refused slot charges no rate;
//! - a caller that stops waiting gets its slots given back;
//! - the migration of a table without the slots' column.
//!
//! Time is injected where the functions take it (`<table>_decide_mixed_at`,
//! `_release_at`, `_renew_at`, the cleanup at a time); a real short lease
//! otherwise. Run with `cargo xtask test-redis -- -p rate-tier-storage
//! --test postgres_concurrency` (or `cargo xtask test`), which starts a
//! throwaway PostgreSQL and sets `TRT_POSTGRES_URL`.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gcra_core::{Concurrency, Decision, Quota, RETRY_HINT_US, Window};
use rate_tier_storage::StorageExt;
use rate_tier_storage::{
    BucketCheck, KeyLayout, LimitName, PostgresConfigError, PostgresStorage,
    Rule, Storage,
};
use rate_tier_test_support::{env, unique};
use tokio_postgres::{Client, NoTls};

const SECOND: u64 = 1_000_000;
/// 2026-10-02, in µs since the epoch: the injected clock's start.
const T0: u64 = 1_790_947_155_000_000;

// ---------------------------------------------------------------------------
// Helpers.

/// A store on `url`, migrated into a table of its own, with `lease`.
async fn migrated(url: &str, lease: Duration) -> PostgresStorage {
    let table = unique("trt_slots").replace('-', "_");
    let store = builder(url, &table, lease).build().unwrap();
    store.migrate().await.unwrap();
    store
}

/// Another instance on the same table, connected as production does.
async fn instance(url: &str, table: &str, lease: Duration) -> PostgresStorage {
    builder(url, table, lease).connect().await.unwrap()
}

fn builder(
    url: &str,
    table: &str,
    lease: Duration,
) -> rate_tier_storage::PostgresStorageBuilder {
    PostgresStorage::builder(url)
        .unwrap()
        .table(table)
        .unwrap()
        .timeout(Duration::from_secs(5))
        .lease(lease)
        .unwrap()
}

fn name(prefix: &str) -> LimitName {
    LimitName::of_limit(unique(prefix)).unwrap()
}

fn slots(limit: u32) -> Rule {
    Concurrency::new(limit).unwrap().into()
}

async fn raw(url: &str) -> Client {
    let (client, connection) =
        tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

async fn run(
    store: &dyn Storage,
    checks: &[BucketCheck<'_>],
) -> (bool, Vec<Decision>) {
    let mut out = vec![Decision::default(); checks.len()];
    let decided = store.check(checks, &mut out).await.unwrap();
    (decided.verdict.allowed, out)
}

/// A bucket read without a charge: its decision.
async fn peek(store: &dyn Storage, check: BucketCheck<'_>) -> Decision {
    run(store, &[check.as_peek()]).await.1[0]
}

/// The slots of a bucket's row, as (id, units, expiry) triples, and the
/// row's mark and expiry; `None`: no row.
async fn slots_of(
    db: &Client,
    table: &str,
    check: &BucketCheck<'_>,
) -> Option<(i64, i64, Vec<[i64; 3]>)> {
    let row = db
        .query_opt(
            &format!(
                "SELECT tat_us, expires_us, slots FROM {table} WHERE key = $1"
            ),
            &[&check.key(KeyLayout::Single)],
        )
        .await
        .unwrap()?;
    let flat: Option<Vec<i64>> = row.get(2);
    let triples = flat
        .unwrap_or_default()
        .chunks(3)
        .map(|t| [t[0], t[1], t[2]])
        .collect();
    Some((row.get(0), row.get(1), triples))
}

fn id(n: u64) -> i64 {
    PostgresStorage::slot_id(n)
}

/// The functions with an injected clock, on one table.
struct At<'a> {
    db: &'a Client,
    table: String,
}

impl At<'_> {
    /// A decision of `checks` at `now`, as a store of `lease_us` sends it.
    async fn decide(
        &self,
        checks: &[BucketCheck<'_>],
        lease_us: u64,
        now: u64,
    ) -> Vec<i64> {
        let keys: Vec<String> =
            checks.iter().map(|c| c.key(KeyLayout::Single)).collect();
        let args: Vec<i64> = checks
            .iter()
            .flat_map(|c| PostgresStorage::mixed_args(c, lease_us).unwrap())
            .collect();
        let sql = PostgresStorage::mixed_sql(&self.table, true).unwrap();
        let now = i64::try_from(now).unwrap();
        self.db
            .query_one(&sql, &[&keys, &args, &now])
            .await
            .unwrap()
            .get(0)
    }

    /// Whether one slot of `check` (cost 1) passes at `now`.
    async fn takes(&self, check: BucketCheck<'_>, now: u64) -> bool {
        self.decide(&[check], 10 * SECOND, now).await[0] == 1
    }

    /// Units of `check`'s slots free at `now` (a peek).
    async fn free(&self, check: BucketCheck<'_>, now: u64) -> i64 {
        self.decide(&[check.as_peek()], 10 * SECOND, now).await[1]
    }

    /// A release (`v` the units) or a renewal (`v` the lease) of `id` on
    /// `check`'s bucket at `now`: the units it found.
    async fn slots(
        &self,
        renew: bool,
        check: &BucketCheck<'_>,
        id: i64,
        v: i64,
        now: u64,
    ) -> i64 {
        let sql = PostgresStorage::slots_sql(&self.table, renew, true).unwrap();
        let keys = vec![check.key(KeyLayout::Single)];
        let now = i64::try_from(now).unwrap();
        let reply: Vec<i64> = self
            .db
            .query_one(&sql, &[&keys, &vec![id, v], &now])
            .await
            .unwrap()
            .get(0);
        reply[0]
    }

    /// The cleanup at `now`: the rows it removed.
    async fn cleanup(&self, now: u64) -> u64 {
        let sql = PostgresStorage::cleanup_sql(&self.table, true).unwrap();
        let now = i64::try_from(now).unwrap();
        self.db.execute(&sql, &[&1000i64, &now]).await.unwrap()
    }
}

// ---------------------------------------------------------------------------
// The tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_under_100_concurrent_acquisitions_hold_exactly_the_limit()
 {
    let url = env::postgres_url();
    let lease = Duration::from_secs(60);
    let first = Arc::new(migrated(&url, lease).await);
    let second = Arc::new(instance(&url, first.table(), lease).await);
    let uploads = Arc::new(name("uploads"));
    let rule = slots(5);
    let mut tasks = Vec::new();
    for i in 0..100u64 {
        let store = Arc::clone(if i % 2 == 0 { &first } else { &second });
        let uploads = Arc::clone(&uploads);
        tasks.push(tokio::spawn(async move {
            let check = BucketCheck::of_rule(&uploads, "ana", rule, 1)
                .unwrap()
                .lease_id(1000 + i);
            let (allowed, out) = run(&*store, &[check]).await;
            if !allowed {
                assert_eq!(
                    (out[0].remaining, out[0].retry_after_us),
                    (0, RETRY_HINT_US)
                );
            }
            allowed.then_some(1000 + i)
        }));
    }
    let mut passed = BTreeSet::new();
    for task in tasks {
        passed.extend(task.await.unwrap());
    }
    assert_eq!(passed.len(), 5, "{passed:?}");
    let check = BucketCheck::of_rule(&uploads, "ana", rule, 1).unwrap();
    assert_eq!(peek(&*first, check).await.remaining, 0);
    // The row holds one slot per request that passed, under its id.
    let db = raw(&url).await;
    let (mark, expires, held) =
        slots_of(&db, first.table(), &check).await.unwrap();
    assert_eq!(mark, -3);
    let ids: BTreeSet<i64> = held.iter().map(|s| s[0]).collect();
    assert_eq!(ids, passed.iter().map(|&n| id(n)).collect());
    assert!(held.iter().all(|s| s[1] == 1));
    assert_eq!(expires, held.iter().map(|s| s[2]).max().unwrap());
    // Each instance gives back what it took: all are free again.
    for n in &passed {
        let store = if n % 2 == 0 { &first } else { &second };
        store.release(&[check.lease_id(*n)]).await.unwrap();
    }
    assert_eq!(peek(&*first, check).await.remaining, 5);
    assert_eq!(slots_of(&db, first.table(), &check).await, None);
}

/// 16 tasks, alternately on two instances, each 20 times: take a slot (3
/// in flight), hold it 5 ms (real time: well under a second in all), give
/// it back. Never more than 3 in flight (counted between a pass and its
/// release), and all 3 free at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_taken_and_given_back_in_a_race_never_exceed_the_limit() {
    let url = env::postgres_url();
    let lease = Duration::from_secs(60);
    let first = Arc::new(migrated(&url, lease).await);
    let second = Arc::new(instance(&url, first.table(), lease).await);
    let jobs = Arc::new(name("hold"));
    fn check(jobs: &LimitName, id: u64) -> BucketCheck<'_> {
        BucketCheck::of_rule(jobs, "ana", slots(3), 1)
            .unwrap()
            .lease_id(id)
    }
    let take = {
        let jobs = jobs.clone();
        move |store: Arc<PostgresStorage>, id| {
            let jobs = jobs.clone();
            async move { run(&*store, &[check(&jobs, id)]).await.0 }
        }
    };
    let release = {
        let jobs = jobs.clone();
        move |store: Arc<PostgresStorage>, id| {
            let jobs = jobs.clone();
            async move { store.release(&[check(&jobs, id)]).await.unwrap() }
        }
    };
    let hold = Duration::from_millis(5);
    env::hold_and_release(
        (first.clone(), second),
        (16, 20),
        hold,
        take,
        release,
    )
    .await
    .assert_never_above(3);
    assert_eq!(peek(&*first, check(&jobs, 0)).await.remaining, 3);
}

#[tokio::test]
async fn a_release_by_id_frees_exactly_its_slots() {
    let url = env::postgres_url();
    let store = migrated(&url, Duration::from_secs(60)).await;
    let db = raw(&url).await;
    let (jobs, other) = (name("jobs"), name("other"));
    let check = |id: u64, cost: u32| {
        BucketCheck::of_rule(&jobs, "ana", slots(4), cost)
            .unwrap()
            .lease_id(id)
    };
    // A takes 1, B 2, C 1: the limit of 4 is held.
    for (n, cost) in [(0xa, 1), (0xb, 2), (0xc, 1)] {
        assert!(run(&store, &[check(n, cost)]).await.0);
    }
    assert!(!run(&store, &[check(0xd, 1)]).await.0);
    // B's release frees its 2 units, no more; A's and C's stay.
    store.release(&[check(0xb, 2)]).await.unwrap();
    assert_eq!(peek(&store, check(0, 1)).await.remaining, 2);
    let (_, _, held) =
        slots_of(&db, store.table(), &check(0, 1)).await.unwrap();
    let ids: Vec<i64> = held.iter().map(|s| s[0]).collect();
    assert_eq!(ids, [0xa, 0xc]);
    // Again, an id that holds nothing, A's id on another bucket: nothing.
    store.release(&[check(0xb, 2)]).await.unwrap();
    store.release(&[check(0xe, 1)]).await.unwrap();
    let elsewhere = BucketCheck::of_rule(&other, "ana", slots(4), 1)
        .unwrap()
        .lease_id(0xa);
    store.release(&[elsewhere]).await.unwrap();
    assert_eq!(peek(&store, check(0, 1)).await.remaining, 2);
    // D takes the 2 units B gave back; E finds none.
    assert!(run(&store, &[check(0xd, 2)]).await.0);
    assert!(!run(&store, &[check(0xe, 1)]).await.0);
    // Several at once, across buckets: one statement.
    assert!(run(&store, &[elsewhere]).await.0);
    store
        .release(&[check(0xa, 1), check(0xd, 2), elsewhere])
        .await
        .unwrap();
    assert_eq!(peek(&store, check(0, 1)).await.remaining, 3);
    assert_eq!(peek(&store, elsewhere).await.remaining, 4);
    // Only C is left; ids are 64-bit, the high ones as well.
    let high = check(u64::MAX, 1);
    assert!(run(&store, &[high]).await.0);
    store.release(&[high]).await.unwrap();
    let (_, _, held) =
        slots_of(&db, store.table(), &check(0, 1)).await.unwrap();
    assert_eq!(held.iter().map(|s| s[0]).collect::<Vec<_>>(), [0xc]);
}

#[tokio::test]
async fn renewed_slots_outlive_their_lease_and_expired_ones_stay_free() {
    let url = env::postgres_url();
    let store = migrated(&url, Duration::from_secs(10)).await;
    let db = raw(&url).await;
    let at = At {
        db: &db,
        table: store.table().to_owned(),
    };
    let jobs = name("jobs");
    let check = |n: u64| {
        BucketCheck::of_rule(&jobs, "ana", slots(2), 1)
            .unwrap()
            .lease_id(n)
    };
    // Two slots at T0, for 10 s: A is renewed at 5 s and 12 s, B never.
    assert!(at.takes(check(1), T0).await);
    assert!(at.takes(check(2), T0 + SECOND).await);
    assert!(!at.takes(check(3), T0 + 2 * SECOND).await);
    let lease = 10 * i64::try_from(SECOND).unwrap();
    assert_eq!(
        at.slots(true, &check(1), id(1), lease, T0 + 5 * SECOND)
            .await,
        1
    );
    // B's lease ends at 11 s; A's renewal holds it to 15 s.
    assert_eq!(at.free(check(0), T0 + 11 * SECOND - 1).await, 0);
    assert_eq!(at.free(check(0), T0 + 11 * SECOND).await, 1);
    assert_eq!(
        at.slots(true, &check(1), id(1), lease, T0 + 12 * SECOND)
            .await,
        1
    );
    // B's renewal comes too late: B's slot stays free, and C takes it.
    assert_eq!(
        at.slots(true, &check(2), id(2), lease, T0 + 12 * SECOND)
            .await,
        0
    );
    assert_eq!(at.free(check(0), T0 + 12 * SECOND).await, 1);
    assert!(at.takes(check(3), T0 + 13 * SECOND).await);
    assert!(!at.takes(check(2), T0 + 14 * SECOND).await);
    // A holds until 22 s (its last renewal), C until 23 s.
    assert_eq!(at.free(check(0), T0 + 22 * SECOND - 1).await, 0);
    assert_eq!(at.free(check(0), T0 + 22 * SECOND).await, 1);
    let (_, expires, _) =
        slots_of(&db, store.table(), &check(0)).await.unwrap();
    assert_eq!(expires, i64::try_from(T0 + 23 * SECOND).unwrap());
    // A renewal after the end: nothing.
    assert_eq!(
        at.slots(true, &check(1), id(1), lease, T0 + 23 * SECOND)
            .await,
        0
    );
    assert_eq!(at.free(check(0), T0 + 23 * SECOND).await, 2);
    assert_eq!(
        slots_of(&db, store.table(), &check(0)).await,
        None,
        "renewing dropped them"
    );
}

#[tokio::test]
async fn slots_never_released_expire_after_the_lease() {
    // Injected time: two slots taken at T0 for 10 s, never released nor
    // renewed (their instance died).
    let url = env::postgres_url();
    let store = migrated(&url, Duration::from_secs(10)).await;
    let db = raw(&url).await;
    let at = At {
        db: &db,
        table: store.table().to_owned(),
    };
    let jobs = name("jobs");
    let check = |n: u64| {
        BucketCheck::of_rule(&jobs, "ana", slots(2), 1)
            .unwrap()
            .lease_id(n)
    };
    assert!(at.takes(check(1), T0).await);
    assert!(at.takes(check(2), T0).await);
    assert!(!at.takes(check(3), T0 + 10 * SECOND - 1).await);
    assert!(at.takes(check(3), T0 + 10 * SECOND).await);
    // The write dropped both expired slots.
    let (_, _, held) = slots_of(&db, store.table(), &check(0)).await.unwrap();
    assert_eq!(held.iter().map(|s| s[0]).collect::<Vec<_>>(), [3]);

    // A real short lease: an instance takes the only slot and goes away.
    let dying = migrated(&url, Duration::from_millis(400)).await;
    let table = dying.table().to_owned();
    let uploads = name("uploads");
    let slot = BucketCheck::of_rule(&uploads, "ana", slots(1), 1)
        .unwrap()
        .lease_id(7);
    assert!(run(&dying, &[slot]).await.0);
    drop(dying);
    let survivor = instance(&url, &table, Duration::from_millis(400)).await;
    let other = slot.lease_id(8);
    assert!(
        !run(&survivor, &[other]).await.0,
        "held until its lease ends"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(run(&survivor, &[other]).await.0, "free after the lease");
}

#[tokio::test]
async fn a_refusal_by_another_kind_takes_no_slot_and_a_refused_slot_charges_nothing()
 {
    let url = env::postgres_url();
    let store = migrated(&url, Duration::from_secs(60)).await;
    let db = raw(&url).await;
    let (plan, login, jobs) = (name("plan"), name("login"), name("jobs"));
    let rate = BucketCheck::new(&plan, "ana", Quota::per_hour(1), 1).unwrap();
    let slot = BucketCheck::of_rule(&jobs, "ana", slots(2), 1)
        .unwrap()
        .lease_id(5);
    // The rate's burst of 1 spent: the decision is refused, and the slot
    // that would have passed replies as its bucket stands, untaken.
    assert!(run(&store, &[rate]).await.0);
    let (allowed, out) = run(&store, &[slot, rate]).await;
    assert!(!allowed);
    assert!(out[0].allowed && !out[1].allowed, "{out:?}");
    assert_eq!((out[0].remaining, out[0].reset_after_us), (2, 0));
    assert_eq!(slots_of(&db, store.table(), &slot).await, None);
    assert_eq!(peek(&store, slot).await.remaining, 2);
    // A window that refuses: the same.
    let window: Rule = Window::new(1, Duration::from_secs(60)).unwrap().into();
    let login_1 = BucketCheck::of_rule(&login, "ana", window, 1).unwrap();
    assert!(run(&store, &[login_1]).await.0);
    assert!(!run(&store, &[login_1, slot]).await.0);
    assert_eq!(peek(&store, slot).await.remaining, 2);
    // The slots full: a fresh rate beside them is not charged.
    let (fresh, more) = (name("fresh"), slot.lease_id(6));
    let spare = BucketCheck::new(&fresh, "ana", Quota::per_hour(3), 1).unwrap();
    assert!(run(&store, &[slot, spare]).await.0);
    assert!(run(&store, &[more, spare]).await.0);
    let (allowed, out) = run(&store, &[slot.lease_id(7), spare]).await;
    assert!(!allowed && !out[0].allowed && out[1].allowed, "{out:?}");
    assert_eq!(out[0].retry_after_us, RETRY_HINT_US);
    assert_eq!(peek(&store, spare).await.remaining, 1);
    // A shadow limit of slots refuses nothing, and takes nothing it
    // refused.
    let shadow = slot.lease_id(8).shadow(true);
    let (allowed, out) = run(&store, &[shadow, spare]).await;
    assert!(allowed && !out[0].allowed, "{out:?}");
    let (_, _, held) = slots_of(&db, store.table(), &slot).await.unwrap();
    assert_eq!(held.iter().map(|s| s[0]).collect::<Vec<_>>(), [5, 6]);
}

#[tokio::test]
async fn the_cleanup_removes_a_row_whose_slots_expired() {
    let url = env::postgres_url();
    let store = migrated(&url, Duration::from_secs(10)).await;
    let db = raw(&url).await;
    let at = At {
        db: &db,
        table: store.table().to_owned(),
    };
    let (jobs, kept) = (name("jobs"), name("kept"));
    let a = BucketCheck::of_rule(&jobs, "ana", slots(3), 1)
        .unwrap()
        .lease_id(1);
    let b = BucketCheck::of_rule(&kept, "ana", slots(3), 1)
        .unwrap()
        .lease_id(2);
    // Slots at T0 and T0 + 1 s on `jobs` (the row lives to 11 s), one at
    // T0 on `kept`, renewed at 9 s (to 19 s).
    assert!(at.takes(a, T0).await);
    assert!(at.takes(a.lease_id(3), T0 + SECOND).await);
    assert!(at.takes(b, T0).await);
    let lease = 10 * i64::try_from(SECOND).unwrap();
    assert_eq!(at.slots(true, &b, id(2), lease, T0 + 9 * SECOND).await, 1);
    assert_eq!(at.cleanup(T0 + 11 * SECOND - 1).await, 0);
    assert_eq!(at.cleanup(T0 + 11 * SECOND).await, 1);
    assert_eq!(slots_of(&db, store.table(), &a).await, None);
    assert!(slots_of(&db, store.table(), &b).await.is_some());
    assert_eq!(at.cleanup(T0 + 19 * SECOND).await, 1);

    // At the database's clock, with a real lease of 50 ms.
    let brief = migrated(&url, Duration::from_millis(50)).await;
    assert!(run(&brief, &[a]).await.0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(brief.cleanup(100).await.unwrap(), 1);
    assert_eq!(peek(&brief, a).await.remaining, 3);
}

// One thread: a decision's task cannot run, let alone answer, before the
// caller's first poll returns (on two, a preempted caller may find it
// answered already).
#[tokio::test(flavor = "current_thread")]
async fn a_caller_that_stops_waiting_gets_its_slots_given_back() {
    let url = env::postgres_url();
    let table = migrated(&url, Duration::from_secs(60))
        .await
        .table()
        .to_owned();
    let store = instance(&url, &table, Duration::from_secs(60)).await;
    let db = raw(&url).await;
    let (plan, jobs) = (name("plan"), name("jobs"));
    let rate = BucketCheck::new(&plan, "ana", Quota::per_hour(100), 1).unwrap();
    let slot = BucketCheck::of_rule(&jobs, "ana", slots(50), 2).unwrap();
    // One request holds its slots throughout: never given back for others.
    let holder = slot.lease_id(1);
    assert!(run(&store, &[holder]).await.0);
    // Callers that go away: each future is polled once (the decision is
    // sent) and dropped; each decision runs on, its rate refunded and its
    // slots released by its id.
    for n in 0..20 {
        let checks = [rate, slot.lease_id(100 + n)];
        let mut out = [Decision::default(); 2];
        let mut call = Box::pin(store.check(&checks, &mut out));
        let first = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(call.as_mut().poll(cx).is_pending())
        })
        .await;
        assert!(first, "a PostgreSQL decision answered without a round trip");
        drop(call);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rate = peek(&store, rate).await;
        let free = peek(&store, slot).await;
        let held = slots_of(&db, &table, &slot).await.map(|(_, _, held)| held);
        if rate.remaining == 100 && free.remaining == 48 {
            assert_eq!(held, Some(vec![[1, 2, held.as_ref().unwrap()[0][2]]]));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rate {rate:?}, the slots {free:?}: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_table_without_slots_is_migrated_in_place() {
    // A table as the previous version created it (windows and periods),
    // with a window's row in it.
    let url = env::postgres_url();
    let db = raw(&url).await;
    let table = unique("trt_noslots").replace('-', "_");
    db.batch_execute(&format!(
        "CREATE TABLE {table} (key text COLLATE \"C\" PRIMARY KEY, \
         tat_us bigint NOT NULL, expires_us bigint NOT NULL, log_us bigint[], \
         period_start_us bigint, period_count bigint) WITH (fillfactor = 70)"
    ))
    .await
    .unwrap();
    let store = builder(&url, &table, Duration::from_secs(30))
        .build()
        .unwrap();
    assert!(!store.is_migrated().await.unwrap());
    let login = name("login");
    let window: Rule =
        Window::new(3, Duration::from_secs(3600)).unwrap().into();
    let login_1 = BucketCheck::of_rule(&login, "ana", window, 1).unwrap();
    db.execute(
        &format!(
            "INSERT INTO {table} (key, tat_us, expires_us, log_us) \
             SELECT $1, -1, now_us + 3600000000, ARRAY[now_us] \
             FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8 AS now_us) AS c"
        ),
        &[&login_1.key(KeyLayout::Single)],
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let store = instance(&url, &table, Duration::from_secs(30)).await;
    assert_eq!(peek(&store, login_1).await.remaining, 2);
    let jobs = name("jobs");
    let slot = BucketCheck::of_rule(&jobs, "ana", slots(1), 1)
        .unwrap()
        .lease_id(9);
    assert!(run(&store, &[login_1, slot]).await.0);
    assert!(!run(&store, &[slot.lease_id(10)]).await.0);
    store.release(&[slot]).await.unwrap();
    assert!(run(&store, &[slot.lease_id(10)]).await.0);
}

#[tokio::test]
async fn limits_and_leases_at_their_ends() {
    let url = env::postgres_url();
    // A lease is 1 µs to 2^50 µs.
    for bad in [Duration::ZERO, Duration::from_nanos(999), Duration::MAX] {
        let error = PostgresStorage::builder(&url)
            .unwrap()
            .lease(bad)
            .unwrap_err();
        assert!(matches!(error, PostgresConfigError::Lease(_)), "{error}");
    }
    // The largest limit, the largest cost.
    let store = migrated(&url, Duration::from_secs(60)).await;
    let (many, all) = (name("many"), name("all"));
    let rule = slots(u32::MAX);
    let some = BucketCheck::of_rule(&many, "ana", rule, 5)
        .unwrap()
        .lease_id(1);
    assert_eq!(
        run(&store, &[some]).await.1[0].remaining,
        u64::from(u32::MAX) - 5
    );
    let whole = BucketCheck::of_rule(&all, "ana", rule, u32::MAX)
        .unwrap()
        .lease_id(2);
    assert!(run(&store, &[whole]).await.0);
    assert_eq!(peek(&store, whole).await.remaining, 0);
    let one = BucketCheck::of_rule(&all, "ana", rule, 1)
        .unwrap()
        .lease_id(3);
    assert!(!run(&store, &[one]).await.0);
    store.release(&[whole]).await.unwrap();
    assert_eq!(peek(&store, whole).await.remaining, u64::from(u32::MAX));
}
