//! `PostgresStorage`'s reservations (`<table>_reserve_at` and
//! `<table>_cancel_at` in `src/postgres/migration.sql`) on a real
//! PostgreSQL.
//!
//! - Against gcra-core's `reserve_all` and `Quota::cancel`, side by side,
//!   with the case's clock (the `_at` forms, as `postgres_sql.rs` proves the
//!   check): random quotas (burst 1, debts), costs (0, above the burst),
//!   shadows, several limits, caller's waits (around the wait itself),
//!   clocks that go back, corrupt TATs, and give-backs of the latest and of
//!   earlier reservations; the same decisions, verdict and wait field by
//!   field (read by the store's own reader), and exactly the rows gcra-core
//!   asks for, nothing else.
//! - On the store itself, on the database's clock: two instances under 100
//!   concurrent reservations of one burst-1 quota, a wait too long or a
//!   refused joint reservation that writes nothing, give-backs, callers
//!   that left, reservations and checks over the same rows at once, and the
//!   migration of a schema without reservations.
//!
//! Run with `cargo xtask test-redis -- -p rate-tier-storage --test
//! postgres_reserve`, which starts a throwaway PostgreSQL and sets
//! `TRT_POSTGRES_URL`.
#![allow(clippy::unwrap_used)]

mod cases;
mod lua_support;
mod postgres_support;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cases::{check_args, cost_strategy, key, names, subset};
use gcra_core::{
    Charge, Decision, Quota, Reservation, StoreTat, Write, reserve_all,
};
use lua_support::{Corrupt, START_US, advance_strategy, corrupt_strategy};
use postgres_support::{Rows, runtime};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use rate_tier_storage::StorageExt;
use rate_tier_storage::{
    BucketCheck, KeyLayout, LimitName, PostgresStorage, Storage, StorageError,
    Window,
};
use rate_tier_test_support::{env, unique};
use tokio_postgres::{Client, NoTls};

// ---------------------------------------------------------------------------
// The functions against gcra-core.

/// The caller's wait of a reservation.
#[derive(Debug, Clone)]
enum MaxWait {
    Fixed(u64),
    /// The wait the reservation needs, moved by this much: the boundary
    /// of "reserved".
    Around(i64),
}

#[derive(Debug, Clone)]
enum Op {
    /// One reservation over the buckets chosen, in that order, with their
    /// cost and shadow flag.
    Reserve(Vec<(usize, u32, bool)>, MaxWait),
    /// Give-backs, in one call: each of the reservation `pick` back from
    /// the latest, its TAT moved by `shift` µs (0: as written).
    Cancel(Vec<(usize, i64)>),
}

#[derive(Debug, Clone)]
struct Step {
    advance_us: i64,
    corrupt: Vec<Option<Corrupt>>,
    op: Op,
}

#[derive(Debug, Clone)]
struct Case {
    quotas: Vec<Quota>,
    start_us: u64,
    steps: Vec<Step>,
}

/// What a reservation charged in one bucket: what a give-back sends.
#[derive(Debug, Clone, Copy)]
struct Taken {
    bucket: usize,
    cost: u32,
    tat_us: u64,
}

/// The buckets of a case, in PostgreSQL and in gcra-core's eyes.
struct World {
    db: Client,
    table: String,
    keys: Vec<String>,
    quotas: Vec<Quota>,
    /// What gcra-core is handed for each bucket.
    model: Vec<Option<u64>>,
    rows: Rows,
    taken: Vec<Taken>,
    /// Reservations made, waited for, refused as too long, and give-backs
    /// exact and kept: the run must see each.
    seen: [u64; 5],
}

/// A quota that shapes: a burst of 1 to 3 and a debt of up to 30
/// intervals, so that reservations wait.
fn shaping_quota() -> impl Strategy<Value = Quota> {
    let period = prop::sample::select(vec![
        1_000u64,
        100_000,
        1_000_000,
        60_000_000,
        3_600_000_000,
    ]);
    (1u32..=20, period, 1u32..=3, 0u64..=30).prop_filter_map(
        "invalid quota",
        |(limit, period, burst, intervals)| {
            let quota = Quota::new(limit, Duration::from_micros(period))
                .ok()?
                .try_allow_burst(burst)
                .ok()?;
            let debt = quota.emission_interval_us() * intervals;
            quota.try_allow_debt(Duration::from_micros(debt)).ok()
        },
    )
}

fn quota_strategy() -> impl Strategy<Value = Quota> {
    prop_oneof![
        3 => shaping_quota(),
        2 => lua_support::quota_strategy(),
    ]
}

fn max_wait_strategy() -> impl Strategy<Value = MaxWait> {
    prop_oneof![
        4 => (-2i64..=2).prop_map(MaxWait::Around),
        2 => (-1_000_000i64..=1_000_000).prop_map(MaxWait::Around),
        2 => (0u64..=10_000_000).prop_map(MaxWait::Fixed),
        1 => (0u64..=100_000_000_000).prop_map(MaxWait::Fixed),
        1 => prop::sample::select(vec![
            0u64,
            gcra_core::MAX_WINDOW_US,
            gcra_core::MAX_TIME_US,
            gcra_core::MAX_TIME_US + 1,
            u64::MAX,
        ])
        .prop_map(MaxWait::Fixed),
    ]
}

fn step_strategy(quotas: Vec<Quota>) -> impl Strategy<Value = Step> {
    let n = quotas.len();
    let advance = prop_oneof![
        advance_strategy(quotas[0]),
        advance_strategy(quotas[n - 1])
    ];
    let corrupt: Vec<_> = quotas.iter().map(|q| corrupt_strategy(*q)).collect();
    let costs: Vec<_> = quotas
        .iter()
        .map(|q| (cost_strategy(*q), prop::bool::weighted(0.2)))
        .collect();
    let shift = prop_oneof![
        8 => Just(0i64),
        1 => prop::sample::select(vec![-1i64, 1]),
        1 => -10_000_000i64..=10_000_000,
    ];
    let pick =
        prop_oneof![4 => Just(0usize), 2 => 1usize..=3, 1 => 0usize..=50];
    let op = prop_oneof![
        4 => (subset(n), costs, max_wait_strategy()).prop_map(|(chosen, costs, wait)| {
            let chosen = chosen.into_iter().map(|i| (i, costs[i].0, costs[i].1)).collect();
            Op::Reserve(chosen, wait)
        }),
        1 => prop::collection::vec((pick, shift), 1..=3).prop_map(Op::Cancel),
    ];
    (advance, corrupt, op).prop_map(|(advance_us, corrupt, op)| Step {
        advance_us,
        corrupt,
        op,
    })
}

fn case_strategy() -> impl Strategy<Value = Case> {
    prop::collection::vec(quota_strategy(), 1..=4).prop_flat_map(|quotas| {
        (
            Just(quotas.clone()),
            START_US..=START_US + 1_000_000_000_000,
            prop::collection::vec(step_strategy(quotas), 1..30),
        )
            .prop_map(|(quotas, start_us, steps)| Case {
                quotas,
                start_us,
                steps,
            })
    })
}

fn us(v: u64) -> i64 {
    i64::try_from(v).unwrap()
}

fn stored_row(now: u64, store: StoreTat) -> (i64, i64) {
    (us(store.tat_us), us(now + store.ttl_ms * 1000))
}

impl World {
    async fn rows(&self) -> Rows {
        postgres_support::rows(&self.db, &self.table).await
    }

    /// Writes a corrupted TAT; what gcra-core is handed for it.
    async fn corrupt(
        &mut self,
        k: usize,
        corrupt: &Corrupt,
        now: u64,
    ) -> Option<u64> {
        postgres_support::corrupt(
            &self.db,
            &self.table,
            &mut self.rows,
            &self.keys[k],
            corrupt,
            now,
        )
        .await
    }

    async fn call(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<i64>, String> {
        self.db
            .query_one(sql, params)
            .await
            .map(|row| row.get(0))
            .map_err(|e| {
                e.as_db_error()
                    .map_or_else(|| e.to_string(), |db| db.message().to_owned())
            })
    }
}

async fn reserve_step(
    w: &mut World,
    now: u64,
    chosen: &[(usize, u32, bool)],
    wait: &MaxWait,
    ctx: &str,
) -> Result<(), TestCaseError> {
    let names = names(w.quotas.len());
    let charges: Vec<Charge> = chosen
        .iter()
        .map(|&(i, cost, shadow)| Charge {
            quota: w.quotas[i],
            cost,
            shadow,
        })
        .collect();
    let stored: Vec<Option<u64>> =
        chosen.iter().map(|&(i, ..)| w.model[i]).collect();
    let keys: Vec<String> =
        chosen.iter().map(|&(i, ..)| w.keys[i].clone()).collect();
    let args: Vec<i64> = chosen
        .iter()
        .zip(&charges)
        .flat_map(|(&(i, ..), charge)| check_args(&names[i], *charge))
        .collect();
    let mut out = vec![Decision::default(); chosen.len()];
    let max_wait_us = match *wait {
        MaxWait::Fixed(v) => v,
        MaxWait::Around(delta) => {
            reserve_all(&charges, &stored, now, u64::MAX, &mut out)
                .map_or(0, |r| r.wait_us.saturating_add_signed(delta))
        }
    };
    let ctx = format!("{ctx}, max wait {max_wait_us}");
    let sql = PostgresStorage::reserve_sql(&w.table, true).unwrap();
    let wait_arg = PostgresStorage::reserve_wait_arg(max_wait_us);
    let reply = w.call(&sql, &[&keys, &args, &wait_arg, &us(now)]).await;
    match reserve_all(&charges, &stored, now, max_wait_us, &mut out) {
        Ok(joint) => {
            let reply = reply
                .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
            let mut got = vec![Decision::default(); chosen.len()];
            let (got_joint, got_now) = PostgresStorage::read_reservation(
                &reply,
                max_wait_us,
                &mut got,
            )
            .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
            prop_assert_eq!(got_now, now, "{}", ctx);
            prop_assert_eq!(&got, &out, "{}", ctx);
            prop_assert_eq!(got_joint, joint, "{}", ctx);
            prop_assert_eq!(got_joint.verdict(), joint.verdict(), "{}", ctx);
            for (&(i, cost, _), d) in chosen.iter().zip(&out) {
                if let Some(s) = d.store {
                    w.rows.insert(w.keys[i].clone(), stored_row(now, s));
                    w.model[i] = Some(s.tat_us);
                    if joint.reserved && cost > 0 && d.allowed {
                        w.taken.push(Taken {
                            bucket: i,
                            cost,
                            tat_us: s.tat_us,
                        });
                    }
                }
            }
            match (joint.reserved, joint.wait_us) {
                (true, 0) => w.seen[0] += 1,
                (true, _) => w.seen[1] += 1,
                (false, _) => w.seen[2] += 1,
            }
        }
        Err(e) => {
            prop_assert!(
                reply.is_err(),
                "{}: gcra-core says {:?}, the function {:?}",
                ctx,
                e,
                reply
            );
        }
    }
    prop_assert_eq!(&w.rows().await, &w.rows, "{}", ctx);
    Ok(())
}

async fn cancel_step(
    w: &mut World,
    now: u64,
    picks: &[(usize, i64)],
    ctx: &str,
) -> Result<(), TestCaseError> {
    if w.taken.is_empty() {
        return Ok(());
    }
    let chosen: Vec<Taken> = picks
        .iter()
        .map(|&(pick, shift)| {
            let taken = w.taken[w.taken.len() - 1 - pick % w.taken.len()];
            Taken {
                tat_us: taken.tat_us.saturating_add_signed(shift),
                ..taken
            }
        })
        .collect();
    let keys: Vec<String> =
        chosen.iter().map(|c| w.keys[c.bucket].clone()).collect();
    let args: Vec<i64> = chosen
        .iter()
        .flat_map(|c| {
            let t = w.quotas[c.bucket].emission_interval_us();
            [us(t), i64::from(c.cost), us(c.tat_us)]
        })
        .collect();
    let sql = PostgresStorage::cancel_sql(&w.table, true).unwrap();
    let reply = w.call(&sql, &[&keys, &args, &us(now)]).await;
    if now > gcra_core::MAX_TIME_US {
        // A clock past gcra-core's range: refused, changing nothing (the
        // slots are lost, never handed out twice), where gcra-core's
        // cancel, which checks no time, would still compute a write.
        prop_assert_eq!(
            reply,
            Err("rate_tier_cancel: time out of range".to_owned()),
            "{}",
            ctx
        );
        return Ok(());
    }
    let reply =
        reply.map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
    // One after the other, as the function does.
    let mut expected = Vec::new();
    for c in &chosen {
        let reservation = Reservation {
            wait_us: 0,
            cost: c.cost,
            store: StoreTat {
                tat_us: c.tat_us,
                ttl_ms: 0,
            },
        };
        let write =
            w.quotas[c.bucket].cancel(w.model[c.bucket], now, &reservation);
        let key = w.keys[c.bucket].clone();
        expected.push(match write {
            Write::Keep => {
                w.seen[4] += 1;
                0
            }
            Write::Set(store) => {
                w.rows.insert(key, stored_row(now, store));
                w.model[c.bucket] = Some(store.tat_us);
                w.seen[3] += 1;
                1
            }
            Write::Clear => {
                w.rows.remove(&key);
                w.model[c.bucket] = None;
                w.seen[3] += 1;
                2
            }
        });
    }
    prop_assert_eq!(&reply, &expected, "{}: {:?}", ctx, chosen);
    prop_assert_eq!(&w.rows().await, &w.rows, "{}", ctx);
    Ok(())
}

async fn run_case(w: &mut World, case: &Case) -> Result<(), TestCaseError> {
    w.db.batch_execute(&format!("TRUNCATE {}", w.table))
        .await
        .unwrap();
    w.quotas = case.quotas.clone();
    w.keys = names(case.quotas.len()).iter().map(key).collect();
    w.model = vec![None; case.quotas.len()];
    w.rows.clear();
    w.taken.clear();
    let mut now = case.start_us;
    for (i, step) in case.steps.iter().enumerate() {
        now = now.saturating_add_signed(step.advance_us).max(1);
        for (k, corrupt) in step.corrupt.iter().enumerate() {
            if let Some(corrupt) = corrupt {
                w.model[k] = w.corrupt(k, corrupt, now).await;
            }
        }
        let ctx =
            format!("step {i}: now {now}, stored {:?}, {:?}", w.model, step.op);
        match &step.op {
            Op::Reserve(chosen, wait) => {
                reserve_step(w, now, chosen, wait, &ctx).await?;
            }
            Op::Cancel(picks) => cancel_step(w, now, picks, &ctx).await?,
        }
    }
    Ok(())
}

fn world(runtime: &tokio::runtime::Runtime) -> World {
    let (db, table) =
        runtime.block_on(postgres_support::connect("trt_reserve"));
    World {
        db,
        table,
        keys: Vec::new(),
        quotas: Vec::new(),
        model: Vec::new(),
        rows: Rows::new(),
        taken: Vec::new(),
        seen: [0; 5],
    }
}

#[test]
fn the_reservation_functions_agree_with_gcra_core() {
    let runtime = runtime();
    let mut world = world(&runtime);
    let config = ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(
            FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let world = std::cell::RefCell::new(&mut world);
    runner
        .run(&case_strategy(), |case| {
            runtime.block_on(run_case(&mut world.borrow_mut(), &case))
        })
        .unwrap();
    let seen = world.borrow().seen;
    assert!(
        seen.iter().all(|&n| n > 0),
        "reserved now, reserved with a wait, too long, given back, kept: {seen:?}: \
         the cases must exercise each"
    );
}

/// The boundaries random steps seldom land on: a wait exactly the
/// caller's, or the quota's debt, and one µs either side, for one limit and
/// for two (one a shadow).
#[test]
fn reservations_at_their_boundaries_agree_with_gcra_core() {
    let runtime = runtime();
    let mut w = world(&runtime);
    let even = Quota::per_second(10)
        .allow_burst(1)
        .allow_debt(Duration::from_millis(500));
    let day = Quota::per_day(3).allow_debt(Duration::from_secs(1));
    let case = Case {
        quotas: vec![even, day],
        start_us: START_US,
        steps: Vec::new(),
    };
    runtime.block_on(async {
        run_case(&mut w, &case).await.unwrap();
        let t = even.emission_interval_us();
        let mut now = START_US;
        // Up to the debt of 500 ms, one step of T at a time.
        for i in 0..7 {
            let ctx = format!("reservation {i}");
            let wait = MaxWait::Fixed(u64::MAX);
            reserve_step(&mut w, now, &[(0, 1, false)], &wait, &ctx)
                .await
                .unwrap();
        }
        assert_eq!(w.seen[2], 1, "the 7th waits 600 ms: too long");
        for delta in [-1i64, 0, 1] {
            for at in [now + t - 1, now + t, now + t + 1] {
                let ctx = format!("at {at}, max wait {delta:+}");
                let wait = MaxWait::Around(delta);
                reserve_step(&mut w, at, &[(0, 1, false)], &wait, &ctx)
                    .await
                    .unwrap();
                let shadowed = [(0, 1, false), (1, 1, true)];
                reserve_step(&mut w, at, &shadowed, &wait, &ctx)
                    .await
                    .unwrap();
            }
        }
        // The day spent, as a shadow it refuses at the slot and is not
        // charged; enforced, it makes the reservation too long.
        now += 10 * t;
        for shadow in [true, false] {
            for _ in 0..4 {
                let wait = MaxWait::Fixed(1_000_000);
                let both = [(1, 1, shadow), (0, 1, false)];
                reserve_step(&mut w, now, &both, &wait, "the day")
                    .await
                    .unwrap();
            }
        }
        // Give-backs while last (exact) and after a later one (kept).
        let picks = [(1, 0), (0, 0), (0, 0)];
        cancel_step(&mut w, now, &picks, "give-backs")
            .await
            .unwrap();
    });
    let seen = w.seen;
    assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
}

// ---------------------------------------------------------------------------
// The store, on the database's clock.

/// A store on `url`, migrated into a table of its own.
async fn migrated(url: &str) -> PostgresStorage {
    let table = unique("trt_reserve").replace('-', "_");
    let store = PostgresStorage::builder(url)
        .unwrap()
        .table(&table)
        .unwrap()
        .timeout(Duration::from_secs(5))
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
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap()
}

async fn raw(url: &str) -> Client {
    let (client, connection) =
        tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

fn name(prefix: &str) -> LimitName {
    LimitName::new(unique(prefix)).unwrap()
}

/// The rows of `checks`' buckets: key -> (TAT, expiry).
async fn rows_of(db: &Client, table: &str, checks: &[BucketCheck<'_>]) -> Rows {
    let keys: Vec<String> =
        checks.iter().map(|c| c.key(KeyLayout::Single)).collect();
    db.query(
        &format!(
            "SELECT key, tat_us, expires_us FROM {table} WHERE key = ANY($1)"
        ),
        &[&keys],
    )
    .await
    .unwrap()
    .into_iter()
    .map(|row| (row.get(0), (row.get(1), row.get(2))))
    .collect()
}

async fn reserve(
    store: &dyn Storage,
    checks: &[BucketCheck<'_>],
    max_wait: Duration,
) -> (rate_tier_storage::Decided, Vec<Decision>) {
    let mut out = vec![Decision::default(); checks.len()];
    let decided = store.reserve(checks, max_wait, &mut out).await.unwrap();
    (decided, out)
}

/// 10 a second, evenly (one every 100 ms), waits up to 1 s.
fn even() -> Quota {
    Quota::per_second(10)
        .allow_burst(1)
        .allow_debt(Duration::from_secs(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_reserve_100_slots_of_a_burst_of_1_each_t_apart() {
    let url = env::postgres_url();
    let first = Arc::new(migrated(&url).await);
    let second = Arc::new(instance(&url, first.table()).await);
    assert!(first.capabilities().reserves && second.capabilities().reserves);
    let provider = Arc::new(name("provider"));
    // One a minute: 100 slots are 99 minutes ahead, and no two callers
    // can be a minute apart, so every one of them waits.
    let quota = Quota::per_minute(1).allow_debt(Duration::from_secs(3 * 3600));
    let t = quota.emission_interval_us();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..100 {
        let store = if i % 2 == 0 { &first } else { &second }.clone();
        let provider = provider.clone();
        tasks.push(tokio::spawn(async move {
            let check = [BucketCheck::new(&provider, "", quota, 1).unwrap()];
            let mut out = [Decision::default()];
            let decided = store
                .reserve(&check, Duration::from_secs(3 * 3600), &mut out)
                .await
                .unwrap();
            (decided, out[0])
        }));
    }
    let mut slots = Vec::new();
    for task in tasks {
        let (decided, d) = task.await.unwrap();
        assert!(decided.verdict.allowed, "{decided:?}");
        assert_eq!(decided.by, "postgres");
        let tat = d.store.expect("a reservation writes its TAT").tat_us;
        // The database's now: the TAT less its reset, both from then.
        let now = tat - d.reset_after_us;
        slots.push((tat, decided.wait_us, now));
    }
    let elapsed = u64::try_from(started.elapsed().as_micros()).unwrap();
    slots.sort_unstable();
    let (first_tat, first_wait, first_now) = slots[0];
    assert_eq!(first_wait, 0, "the first goes at once: {slots:?}");
    for (k, &(tat, wait, now)) in slots.iter().enumerate() {
        let k = k as u64;
        // Each its own slot, exactly k T after the first...
        assert_eq!(tat, first_tat + k * t, "slot {k}: {slots:?}");
        // ...which its caller waits for from its own now: k T less the
        // time since the first reservation (the database's clock).
        let since = now.checked_sub(first_now).expect("in turn");
        assert_eq!(wait + since, k * t, "slot {k}: {slots:?}");
        assert!(since <= elapsed + 1_000_000, "slot {k}: {since} µs later");
    }
    let mut waits: Vec<u64> = slots.iter().map(|s| s.1).collect();
    waits.sort_unstable();
    waits.dedup();
    assert_eq!(waits.len(), 100, "distinct waits: {slots:?}");
    let db = raw(&url).await;
    let check = [BucketCheck::new(&provider, "", quota, 1).unwrap()];
    let rows = rows_of(&db, first.table(), &check).await;
    let stored = rows.values().next().unwrap().0;
    assert_eq!(stored, us(first_tat + 99 * t), "the last slot is stored");
}

#[tokio::test]
async fn a_wait_too_long_or_a_refused_joint_reservation_writes_nothing() {
    let url = env::postgres_url();
    let store = migrated(&url).await;
    let db = raw(&url).await;
    let (second, day) = (name("per-second"), name("per-day"));
    let per_day = Quota::per_day(2).allow_debt(Duration::from_secs(10));
    let both = [
        BucketCheck::new(&second, "acct", even(), 1).unwrap(),
        BucketCheck::new(&day, "acct", per_day, 1).unwrap(),
    ];
    for i in 0..2 {
        let (decided, out) =
            reserve(&store, &both, Duration::from_secs(1)).await;
        assert!(decided.verdict.allowed, "{decided:?}");
        assert_eq!(out[1].remaining, 1 - i);
    }
    // The day is spent: a wait of hours, beyond its debt of 10 s and the
    // caller's 1 s. Nothing is charged, in either limit.
    let before = rows_of(&db, store.table(), &both).await;
    assert_eq!(before.len(), 2);
    let (decided, out) = reserve(&store, &both, Duration::from_secs(1)).await;
    assert!(!decided.verdict.allowed);
    assert_eq!(decided.verdict.refused_by, Some(1));
    assert!(decided.wait_us > 3_600_000_000, "{decided:?}");
    assert!(out.iter().all(|d| d.store.is_none()), "{out:?}");
    assert_eq!(rows_of(&db, store.table(), &both).await, before);

    // One limit, a wait longer than the caller's: nothing written. (Times
    // are the database's: reserved ahead until a wait is long enough.)
    let alone = [both[0]];
    for _ in 0..10 {
        let (decided, _) =
            reserve(&store, &alone, Duration::from_secs(1)).await;
        if decided.wait_us > 300_000 {
            break;
        }
    }
    let before = rows_of(&db, store.table(), &alone).await;
    let (decided, out) =
        reserve(&store, &alone, Duration::from_millis(50)).await;
    assert!(!decided.verdict.allowed, "{decided:?}");
    assert!(decided.wait_us > 50_000, "{decided:?}");
    assert_eq!(out[0].store, None);
    assert_eq!(rows_of(&db, store.table(), &alone).await, before);
    // Nor longer than the quota's debt of 1 s, whatever the caller waits.
    let mut refused = false;
    for _ in 0..30 {
        let before = rows_of(&db, store.table(), &alone).await;
        let (decided, _) =
            reserve(&store, &alone, Duration::from_secs(3600)).await;
        if !decided.verdict.allowed {
            assert!(decided.wait_us > 1_000_000, "{decided:?}");
            assert_eq!(rows_of(&db, store.table(), &alone).await, before);
            refused = true;
            break;
        }
        assert!(decided.wait_us <= 1_000_000, "{decided:?}");
    }
    assert!(refused, "30 reservations within a debt of 1 s");

    // A shadow spent is not charged, and does not hold the reservation.
    let other = name("per-second");
    let shadowed = [
        BucketCheck::new(&other, "acct", even(), 1).unwrap(),
        both[1].shadow(true),
    ];
    let before = rows_of(&db, store.table(), &shadowed[1..]).await;
    let (decided, out) = reserve(&store, &shadowed, Duration::ZERO).await;
    assert!(
        decided.verdict.allowed && decided.wait_us == 0,
        "{decided:?}"
    );
    assert!(out[0].store.is_some() && !out[1].allowed, "{out:?}");
    assert_eq!(rows_of(&db, store.table(), &shadowed[1..]).await, before);
}

#[tokio::test]
async fn only_rates_reserve_and_bad_calls_are_no_failures() {
    let url = env::postgres_url();
    let store = migrated(&url).await;
    let login = name("login");
    let window = Window::new(3, Duration::from_secs(60)).unwrap();
    let check =
        [BucketCheck::of_rule(&login, "ana", window.into(), 1).unwrap()];
    let mut out = [Decision::default()];
    let error = store
        .reserve(&check, Duration::from_secs(1), &mut out)
        .await
        .unwrap_err();
    assert!(matches!(error, StorageError::Unsupported(_)), "{error}");
    assert!(!error.is_failure());
    let error = store.cancel(&[check[0].cancel(1)]).await.unwrap_err();
    assert!(matches!(error, StorageError::Unsupported(_)), "{error}");
    // Out of length, a bucket twice: refused before anything is sent.
    let rate = name("rate");
    let r = BucketCheck::new(&rate, "ana", even(), 1).unwrap();
    let error = store
        .reserve(
            &[r, r],
            Duration::from_secs(1),
            &mut [Decision::default(); 2],
        )
        .await
        .unwrap_err();
    assert!(matches!(error, StorageError::DuplicateBucket), "{error}");
    let error = store
        .reserve(&[r], Duration::from_secs(1), &mut [])
        .await
        .unwrap_err();
    assert!(
        matches!(error, StorageError::LengthMismatch { .. }),
        "{error}"
    );
    // Nothing to reserve: the slot is now; nothing to give back: done.
    let decided = store.reserve(&[], Duration::ZERO, &mut []).await.unwrap();
    assert!(decided.verdict.allowed && decided.wait_us == 0);
    store.cancel(&[]).await.unwrap();
    // A database that is not there is a failure, never a refusal.
    let absent = PostgresStorage::builder(&url)
        .unwrap()
        .table(&unique("trt_absent").replace('-', "_"))
        .unwrap()
        .build()
        .unwrap();
    let error = absent
        .reserve(&[r], Duration::from_secs(1), &mut out)
        .await
        .unwrap_err();
    assert!(error.is_failure(), "{error}");
    assert!(error.to_string().contains("migrate"), "{error}");
    let error = absent.cancel(&[r.cancel(1)]).await.unwrap_err();
    assert!(error.is_failure(), "{error}");
}

#[tokio::test]
async fn a_give_back_while_last_is_exact_and_after_a_later_one_keeps() {
    let url = env::postgres_url();
    let store = migrated(&url).await;
    let db = raw(&url).await;
    let provider = name("provider");
    // One every 6 s: slots far apart beside the time a call takes.
    let slow = Quota::per_minute(10)
        .allow_burst(1)
        .allow_debt(Duration::from_secs(60));
    let check = BucketCheck::new(&provider, "", slow, 1).unwrap();
    let wait = Duration::from_secs(60);
    let (_, first) = reserve(&store, &[check], wait).await;
    let before = rows_of(&db, store.table(), &[check]).await;
    let (_, second) = reserve(&store, &[check], wait).await;
    let (tat_1, tat_2) = (
        first[0].store.unwrap().tat_us,
        second[0].store.unwrap().tat_us,
    );
    assert_eq!(tat_2, tat_1 + 6_000_000);

    // The latest given back: the TAT is the first's again, and the next
    // caller gets its slot.
    store.cancel(&[check.cancel(tat_2)]).await.unwrap();
    let after = rows_of(&db, store.table(), &[check]).await;
    assert_eq!(
        after.values().next().unwrap().0,
        before.values().next().unwrap().0
    );
    let (_, third) = reserve(&store, &[check], wait).await;
    assert_eq!(third[0].store.unwrap().tat_us, tat_2);

    // The first, after later ones: kept, the slot lost (never handed out
    // twice), and so is a second give-back of the same one.
    let before = rows_of(&db, store.table(), &[check]).await;
    store.cancel(&[check.cancel(tat_1)]).await.unwrap();
    store.cancel(&[check.cancel(tat_2 + 1)]).await.unwrap();
    assert_eq!(rows_of(&db, store.table(), &[check]).await, before);

    // The third given back twice in one call: exact, then kept.
    store
        .cancel(&[check.cancel(tat_2), check.cancel(tat_2)])
        .await
        .unwrap();
    let rows = rows_of(&db, store.table(), &[check]).await;
    assert_eq!(rows.values().next().unwrap().0, us(tat_1));

    // The only one given back: the bucket is full again, its row gone.
    let other = name("provider");
    let alone = BucketCheck::new(&other, "", slow, 1).unwrap();
    let (_, only) = reserve(&store, &[alone], wait).await;
    store
        .cancel(&[alone.cancel(only[0].store.unwrap().tat_us)])
        .await
        .unwrap();
    assert!(rows_of(&db, store.table(), &[alone]).await.is_empty());
}

/// Waits (bounded) until `check`'s bucket has no TAT ahead of now.
async fn until_full(store: &PostgresStorage, check: BucketCheck<'_>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut out = [Decision::default()];
        store.check(&[check.as_peek()], &mut out).await.unwrap();
        if out[0].reset_after_us == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "still reserved: {:?}", out[0]);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded) until a reservation on `table` waits for a lock.
async fn until_blocked(db: &Client, table: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let pattern = format!("%{table}_reserve(%");
    loop {
        let row = db
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND query LIKE $1",
                &[&pattern],
            )
            .await
            .unwrap();
        if row.get::<_, i64>(0) > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "no reservation waits");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_caller_that_stops_waiting_has_its_reservation_given_back() {
    let url = env::postgres_url();
    let store = migrated(&url).await;
    let table = store.table().to_owned();
    let impatient = PostgresStorage::builder(&url)
        .unwrap()
        .table(&table)
        .unwrap()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let provider = name("provider");
    let quota = Quota::per_hour(1).allow_debt(Duration::from_secs(3600));
    let check = [BucketCheck::new(&provider, "", quota, 1).unwrap()];
    let keys = vec![check[0].key(KeyLayout::Single)];
    let args: Vec<i64> = check[0].script_args().map(us).to_vec();
    let wait = Duration::from_secs(7200);
    // A transaction holds the bucket's lock (by a reservation of its own,
    // undone), so each reply comes after its caller left.
    let holder = raw(&url).await;
    // Another session sees the others' waits (a transaction's view of
    // pg_stat_activity stays as it first read it).
    let watcher = raw(&url).await;
    let hold = PostgresStorage::reserve_sql(&table, false).unwrap();
    for i in 0..6 {
        holder.batch_execute("BEGIN").await.unwrap();
        holder
            .query_one(&hold, &[&keys, &args, &us(0)])
            .await
            .unwrap();
        let mut out = [Decision::default()];
        if i < 3 {
            // A caller that goes away once its reservation is sent.
            let mut call = Box::pin(store.reserve(&check, wait, &mut out));
            let pending = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(call.as_mut().poll(cx).is_pending())
            })
            .await;
            assert!(
                pending,
                "a PostgreSQL reservation answered without a trip"
            );
            until_blocked(&watcher, &table).await;
            drop(call);
        } else {
            // A caller whose timeout fires first: a failure.
            let error = impatient.reserve(&check, wait, &mut out).await;
            let error = error.unwrap_err();
            assert!(matches!(error, StorageError::Timeout(_)), "{error}");
            assert!(error.is_failure());
            until_blocked(&watcher, &table).await;
        }
        holder.batch_execute("ROLLBACK").await.unwrap();
        // The reservation ran after the lock, then was given back.
        until_full(&store, check[0]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_and_checks_over_the_same_rows_never_deadlock() {
    let url = env::postgres_url();
    let first = Arc::new(migrated(&url).await);
    let second = Arc::new(instance(&url, first.table()).await);
    let (a, b) = (Arc::new(name("a")), Arc::new(name("b")));
    let quota = Quota::per_second(1000).allow_debt(Duration::from_secs(60));
    let mut tasks = Vec::new();
    for i in 0..60 {
        let store = if i % 2 == 0 { &first } else { &second }.clone();
        let (a, b) = (a.clone(), b.clone());
        tasks.push(tokio::spawn(async move {
            let ca = BucketCheck::new(&a, "ana", quota, 1).unwrap();
            let cb = BucketCheck::new(&b, "ana", quota, 1).unwrap();
            let mut out = [Decision::default(); 2];
            // Both orders, both calls: the locks are taken in one order.
            match i % 4 {
                0 => store.check(&[ca, cb], &mut out).await.map(drop),
                1 => store.check(&[cb, ca], &mut out).await.map(drop),
                2 => store
                    .reserve(&[ca, cb], Duration::from_secs(60), &mut out)
                    .await
                    .map(drop),
                _ => {
                    let r = store
                        .reserve(&[cb, ca], Duration::from_secs(60), &mut out)
                        .await?;
                    assert!(r.verdict.allowed);
                    let tats = [out[0].store.unwrap(), out[1].store.unwrap()];
                    store
                        .cancel(&[
                            cb.cancel(tats[0].tat_us),
                            ca.cancel(tats[1].tat_us),
                        ])
                        .await
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn a_schema_without_reservations_is_migrated_again() {
    let url = env::postgres_url();
    let store = migrated(&url).await;
    let table = store.table().to_owned();
    // As the previous version left it: no reservation functions.
    let db = raw(&url).await;
    db.batch_execute(&format!(
        "DROP FUNCTION {table}_reserve(text[], int8[], int8); \
         DROP FUNCTION {table}_reserve_at(text[], int8[], int8, int8); \
         DROP FUNCTION {table}_cancel(text[], int8[]); \
         DROP FUNCTION {table}_cancel_at(text[], int8[], int8)"
    ))
    .await
    .unwrap();
    assert!(!store.is_migrated().await.unwrap());
    let error = PostgresStorage::builder(&url)
        .unwrap()
        .table(&table)
        .unwrap()
        .connect()
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains(&format!("{table}_reserve")), "{error}");
    assert!(error.contains(&format!("{table}_cancel")), "{error}");
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let store = instance(&url, &table).await;
    let provider = name("provider");
    let check = [BucketCheck::new(&provider, "", even(), 1).unwrap()];
    let (decided, _) = reserve(&store, &check, Duration::ZERO).await;
    assert!(decided.verdict.allowed);
}
