//! `PostgresStorage` reads the database's clock after its locks: a decision
//! that waited for a bucket's lock is decided at the time it got the lock,
//! never at the time it asked for it (a stale time would charge, cap or
//! refund the bucket as if the wait had not been).
//!
//! Each test holds the advisory locks of its buckets in a transaction of its
//! own (`<table>_locked`, the locks every decision takes), lets a call of
//! the store wait for them, reads the clock, releases them, and requires
//! what the call decided and wrote to be gcra-core's answer at a time
//! between that reading and the call's answer. These are real lock waits,
//! kept short.
//!
//! Run with `cargo xtask test`, which starts a throwaway PostgreSQL and sets
//! `TRT_POSTGRES_URL`.
#![allow(clippy::unwrap_used)]

mod lua_support;
mod postgres_support;
use std::slice;
use std::time::{Duration, Instant};

use gcra_core::{Adjust, Charge, Decision, Quota, Window, Write, check_all};
use postgres_support::db_now;
use rate_tier_storage::StorageExt;
use rate_tier_storage::{BucketCheck, KeyLayout, LimitName, PostgresStorage};
use rate_tier_test_support::{env, unique};
use tokio_postgres::Client;

/// How long a call waits for the held locks once it is seen waiting.
const HOLD: Duration = Duration::from_millis(300);

/// The tests' PostgreSQL: a client, and a store on a table of its own.
struct World {
    db: Client,
    store: PostgresStorage,
}

impl World {
    async fn new(prefix: &str) -> World {
        let (db, table) = postgres_support::connect(prefix).await;
        let store = PostgresStorage::builder(&env::postgres_url())
            .unwrap()
            .table(&table)
            .unwrap()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        World { db, store }
    }

    /// The TAT of `key`, if it has a row.
    async fn tat(&self, key: &str) -> Option<u64> {
        let sql =
            format!("SELECT tat_us FROM {} WHERE key = $1", self.store.table());
        let row = self.db.query_opt(&sql, &[&key]).await.unwrap()?;
        Some(u64::try_from(row.get::<_, i64>(0)).unwrap())
    }

    /// `check` charged once: its bucket's key and TAT.
    async fn charged(&self, check: BucketCheck<'_>) -> (String, u64) {
        let key = check.key(KeyLayout::Single);
        decide(&self.store, &[check]).await;
        let tat = self.tat(&key).await.expect("a charged bucket");
        (key, tat)
    }

    /// Runs `call` while a transaction of `db` holds the advisory locks of
    /// `keys`; releases them once the call has waited for them [`HOLD`].
    async fn behind_held_locks<T>(
        &self,
        keys: &[String],
        call: impl Future<Output = T>,
    ) -> Waited<T> {
        let db = &self.db;
        db.batch_execute("BEGIN").await.unwrap();
        let locked = format!("SELECT {}_locked($1)", self.store.table());
        db.execute(&locked, &[&keys]).await.unwrap();
        let hold = async {
            // The call is waiting for one of the locks (an advisory lock of
            // two int4 keys: its second in objid).
            let waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                 AND NOT granted AND objsubid = 2 AND objid IN \
                 (SELECT (hashtext(k)::int8 & 4294967295)::oid FROM unnest($1::text[]) AS k)";
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let n: i64 =
                    db.query_one(waiting, &[&keys]).await.unwrap().get(0);
                if n > 0 {
                    break;
                }
                assert!(Instant::now() < deadline, "the call never waited");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(HOLD).await;
            let released = db_now(db).await;
            db.batch_execute("COMMIT").await.unwrap();
            released
        };
        let (value, released) = tokio::join!(call, hold);
        let answered = db_now(db).await;
        Waited {
            value,
            released: u64::try_from(released).unwrap(),
            answered: u64::try_from(answered).unwrap(),
        }
    }
}

fn name(prefix: &str) -> LimitName {
    LimitName::new(unique(prefix)).unwrap()
}

/// What a call behind held locks answered, and the database's clock just
/// before the locks were released and just after the call answered: a
/// call decided after its wait is decided at a time between the two.
struct Waited<T> {
    value: T,
    released: u64,
    answered: u64,
}

impl<T> Waited<T> {
    /// Requires `now` (the time the call decided at, as read from what it
    /// wrote or answered) to be after the wait.
    fn decided_at(&self, now: u64) {
        assert!(
            self.released <= now && now <= self.answered,
            "decided at {now}, {} µs before the locks were released (at {}; answered at {})",
            self.released.saturating_sub(now),
            self.released,
            self.answered,
        );
    }
}

async fn decide(
    store: &PostgresStorage,
    checks: &[BucketCheck<'_>],
) -> Vec<Decision> {
    let mut out = vec![Decision::default(); checks.len()];
    store.check(checks, &mut out).await.unwrap();
    out
}

/// gcra-core's decisions for `checks` over `stored` at `now`: as a store
/// replies them (without the writes), and with the writes.
fn expected(
    checks: &[BucketCheck<'_>],
    stored: &[Option<u64>],
    now: u64,
) -> (Vec<Decision>, Vec<Decision>) {
    let charges: Vec<Charge> = checks.iter().map(BucketCheck::charge).collect();
    let mut out = vec![Decision::default(); checks.len()];
    check_all(&charges, stored, now, &mut out).unwrap();
    let replies = out.iter().map(|d| Decision { store: None, ..*d }).collect();
    (replies, out)
}

// 10/s below: T = 100 ms, less than the wait, so a bucket charged before
// it refilled while the call waited, and a stale time shows.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_of_one_bucket_that_passes_after_a_wait_is_charged_at_its_end()
{
    // The one-bucket statement.
    let w = World::new("clock_one").await;
    let free = name("free");
    let checks =
        [BucketCheck::new(&free, "ana", Quota::per_second(10), 1).unwrap()];
    let (key, before) = w.charged(checks[0]).await;

    let waited = w
        .behind_held_locks(slice::from_ref(&key), decide(&w.store, &checks))
        .await;
    let after = w.tat(&key).await.unwrap();
    let now = after - waited.value[0].reset_after_us;
    waited.decided_at(now);
    let (replies, writes) = expected(&checks, &[Some(before)], now);
    assert_eq!(waited.value, replies);
    assert_eq!(Some(after), writes[0].store.map(|s| s.tat_us));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_after_a_wait_caps_a_far_tat_from_the_wait_s_end() {
    // Two buckets: the check function. The second's TAT is a year ahead
    // (a clock that went back): refused, and capped to now + tau + debt,
    // where now is after the wait, or the bucket would be lowered by it.
    let w = World::new("clock_cap").await;
    let (plan, search) = (name("plan"), name("search"));
    let debt = Quota::per_second(10).allow_debt(Duration::from_secs(1));
    let checks = [
        BucketCheck::new(&plan, "ana", Quota::per_minute(100), 1).unwrap(),
        BucketCheck::new(&search, "ana", debt, 1).unwrap(),
    ];
    let keys: Vec<String> =
        checks.iter().map(|c| c.key(KeyLayout::Single)).collect();
    let far = db_now(&w.db).await + 365 * 86_400_000_000;
    let insert = format!("INSERT INTO {} VALUES ($1, $2, $2)", w.store.table());
    w.db.execute(&insert, &[&keys[1], &far]).await.unwrap();

    let waited = w.behind_held_locks(&keys, decide(&w.store, &checks)).await;
    assert!(!waited.value[1].allowed, "{:?}", waited.value);
    let capped = w.tat(&keys[1]).await.unwrap();
    let now = capped - debt.ceiling_us();
    waited.decided_at(now);
    let far = u64::try_from(far).unwrap();
    let (replies, writes) = expected(&checks, &[None, Some(far)], now);
    assert_eq!(waited.value, replies);
    assert_eq!(Some(capped), writes[1].store.map(|s| s.tat_us));
    assert_eq!(w.tat(&keys[0]).await, None, "charged");
}

/// A peek of one bucket (cost 0: the check function, which writes nothing)
/// behind held locks reads the bucket at the end of its wait.
async fn a_peek_after_a_wait(w: &World) {
    let free = name("free");
    let quota = Quota::per_minute(60);
    let (key, stored) = w
        .charged(BucketCheck::new(&free, "ana", quota, 30).unwrap())
        .await;

    let peek = [BucketCheck::peek(&free, "ana", quota)];
    let waited = w.behind_held_locks(&[key], decide(&w.store, &peek)).await;
    let now = stored - waited.value[0].reset_after_us;
    waited.decided_at(now);
    let (replies, _) = expected(&peek, &[Some(stored)], now);
    assert_eq!(waited.value, replies);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_after_a_wait_reads_the_bucket_at_the_wait_s_end() {
    a_peek_after_a_wait(&World::new("clock_peek").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_after_a_wait_charges_from_the_wait_s_end() {
    let w = World::new("clock_settle").await;
    let tokens = name("tokens");
    let quota = Quota::per_second(10);
    let check = BucketCheck::new(&tokens, "ana", quota, 1).unwrap();
    let (key, before) = w.charged(check).await;

    let settle = [check.settle(Adjust::Charge(3))];
    let waited = w
        .behind_held_locks(slice::from_ref(&key), w.store.settle(&settle))
        .await;
    waited.value.as_ref().unwrap();
    let after = w.tat(&key).await.unwrap();
    let now = after - 3 * quota.emission_interval_us();
    waited.decided_at(now);
    let settled = quota.settle(Some(before), now, Adjust::Charge(3)).unwrap();
    assert!(
        matches!(settled.write, Write::Set(s) if s.tat_us == after),
        "{settled:?}, stored {after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_after_a_wait_is_counted_from_the_wait_s_end() {
    let w = World::new("clock_reserve").await;
    let provider = name("provider");
    let quota = Quota::per_second(10);
    let checks = [BucketCheck::new(&provider, "", quota, 1).unwrap()];
    let (key, before) = w.charged(checks[0]).await;

    let reserve = async {
        let mut out = [Decision::default()];
        let wait = Duration::from_secs(1);
        let decided = w.store.reserve(&checks, wait, &mut out).await.unwrap();
        (decided.verdict.allowed, out[0])
    };
    let waited = w.behind_held_locks(slice::from_ref(&key), reserve).await;
    let (reserved, out) = waited.value;
    assert!(reserved, "{out:?}");
    let after = w.tat(&key).await.unwrap();
    let now = after - out.reset_after_us;
    waited.decided_at(now);
    let expected = quota.check(Some(before), now, 1).unwrap();
    assert_eq!(Some(after), expected.store.map(|s| s.tat_us));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_entry_after_a_wait_is_stamped_at_the_wait_s_end() {
    // The mixed function: the entry is the time of the decision.
    let w = World::new("clock_window").await;
    let login = name("login");
    let window = Window::new(5, Duration::from_secs(60)).unwrap();
    let checks =
        [BucketCheck::of_rule(&login, "ana", window.into(), 1).unwrap()];
    let key = checks[0].key(KeyLayout::Single);

    let waited = w
        .behind_held_locks(slice::from_ref(&key), decide(&w.store, &checks))
        .await;
    assert!(waited.value[0].allowed);
    let sql = format!("SELECT log_us FROM {} WHERE key = $1", w.store.table());
    let log: Vec<i64> = w.db.query_one(&sql, &[&key]).await.unwrap().get(0);
    assert_eq!(log.len(), 1);
    waited.decided_at(u64::try_from(log[0]).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_replaces_entry_points_that_read_the_clock_before_the_locks() {
    // A schema deployed with the clock read by the entry points, before
    // the functions take their locks: migrate() replaces it in place.
    let w = World::new("clock_upgrade").await;
    let table = w.store.table();
    for (function, reads) in [("check", "check_at"), ("settle", "settle_at")] {
        w.db.batch_execute(&format!(
            "CREATE OR REPLACE FUNCTION {table}_{function}(keys text[], args bigint[]) \
             RETURNS bigint[] LANGUAGE sql AS $$ SELECT {table}_{reads}(keys, args, \
             (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) $$"
        ))
        .await
        .unwrap();
    }
    w.store.migrate().await.unwrap();
    a_peek_after_a_wait(&w).await;
}
