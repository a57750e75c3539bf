//! The PostgreSQL functions of `PostgresStorage` (`src/postgres/migration.sql`)
//! on a real PostgreSQL, against gcra-core's `check_all` and `Quota::settle`:
//! the same random cases as the Redis scripts' property test (`lua_all.rs`),
//! through `<table>_check_at` and `<table>_settle_at` with the case's clock
//! (a check of one enforced bucket first through the one-bucket statement,
//! as the store sends it, and the function only when it answers nothing),
//! requiring the same reply field by field and exactly the rows gcra-core
//! asks for (`Decision::store`, `Settled::write`), nothing else.
//!
//! Run with `cargo xtask test`, which starts a throwaway PostgreSQL and sets
//! `TRT_POSTGRES_URL`.
#![allow(clippy::unwrap_used)]

mod cases;
mod lua_support;
mod postgres_support;

use cases::{
    Case, Op, case_strategy, check_args, decisions, key, names, settle_args,
};
use gcra_core::{
    Adjust, Charge, Decision, Quota, Verdict, Write as Settle, check_all,
};
use lua_support::Corrupt;
use postgres_support::{Rows, runtime};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use rate_tier_storage::PostgresStorage;
use tokio_postgres::Client;

/// The buckets of a case, in PostgreSQL and in gcra-core's eyes.
struct World {
    db: Client,
    table: String,
    keys: Vec<String>,
    quotas: Vec<Quota>,
    /// What gcra-core is handed for each bucket.
    model: Vec<Option<u64>>,
    rows: Rows,
    /// One-bucket checks the one-bucket statement answered, and those it
    /// left to the function: the run must see both.
    one_bucket: std::cell::Cell<(u64, u64)>,
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
        function: &str,
        keys: &[String],
        args: &[i64],
        now: u64,
    ) -> Result<Vec<i64>, String> {
        let now = i64::try_from(now).unwrap();
        // As the store: one enforced bucket tries the one-bucket statement
        // first, which answers only when it passes.
        if let ("check", [key], &[t, tau, cost, 0, _]) = (function, keys, args)
            && cost > 0
        {
            let sql = PostgresStorage::one_bucket_sql(&self.table, true)
                .map_err(|e| e.to_string())?;
            let row = self
                .db
                .query_opt(&sql, &[key, &t, &tau, &cost, &now])
                .await
                .map_err(|e| e.to_string())?;
            let (answered, declined) = self.one_bucket.get();
            if let Some(row) = row {
                self.one_bucket.set((answered + 1, declined));
                return Ok(row.get(0));
            }
            self.one_bucket.set((answered, declined + 1));
        }
        self.db
            .query_one(
                &format!(
                    "SELECT {}_{function}_at($1::text[], $2::int8[], $3)",
                    self.table
                ),
                &[&keys, &args, &now],
            )
            .await
            .map(|row| row.get(0))
            .map_err(|e| e.to_string())
    }
}

fn stored_row(now: u64, tat: u64, ttl_ms: u64) -> (i64, i64) {
    let tat = i64::try_from(tat).unwrap();
    let expires = i64::try_from(now + ttl_ms * 1000).unwrap();
    (tat, expires)
}

async fn check_step(
    w: &mut World,
    now: u64,
    chosen: &[(usize, u32, bool)],
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
    let reply = w.call("check", &keys, &args, now).await;
    let mut out = vec![Decision::default(); chosen.len()];
    match check_all(&charges, &stored, now, &mut out) {
        Ok(verdict) => {
            let reply = reply
                .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
            let got = decisions(&reply);
            let expected: Vec<Decision> =
                out.iter().map(|d| Decision { store: None, ..*d }).collect();
            prop_assert_eq!(&got, &expected, "{}", ctx);
            prop_assert_eq!(
                Verdict::of(charges.iter().map(|c| c.shadow), &got),
                verdict,
                "{}",
                ctx
            );
            for (&(i, ..), d) in chosen.iter().zip(&out) {
                if let Some(s) = d.store {
                    w.rows.insert(
                        w.keys[i].clone(),
                        stored_row(now, s.tat_us, s.ttl_ms),
                    );
                    w.model[i] = Some(s.tat_us);
                }
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

async fn settle_step(
    w: &mut World,
    now: u64,
    chosen: &[(usize, Adjust)],
    ctx: &str,
) -> Result<(), TestCaseError> {
    let keys: Vec<String> =
        chosen.iter().map(|&(i, _)| w.keys[i].clone()).collect();
    let args: Vec<i64> = chosen
        .iter()
        .flat_map(|&(i, adjust)| settle_args(w.quotas[i], adjust))
        .collect();
    let reply = w.call("settle", &keys, &args, now).await;
    let settled: Result<Vec<_>, _> = chosen
        .iter()
        .map(|&(i, adjust)| w.quotas[i].settle(w.model[i], now, adjust))
        .collect();
    match settled {
        Ok(settled) => {
            let reply = reply
                .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
            let expected: Vec<i64> = settled
                .iter()
                .flat_map(|s| [s.remaining as i64, s.reset_after_us as i64])
                .collect();
            prop_assert_eq!(&reply, &expected, "{}", ctx);
            for (&(i, _), s) in chosen.iter().zip(&settled) {
                match s.write {
                    Settle::Keep => {}
                    Settle::Set(store) => {
                        w.rows.insert(
                            w.keys[i].clone(),
                            stored_row(now, store.tat_us, store.ttl_ms),
                        );
                        w.model[i] = Some(store.tat_us);
                    }
                    Settle::Clear => {
                        w.rows.remove(&w.keys[i]);
                        w.model[i] = None;
                    }
                }
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

async fn run_case(w: &mut World, case: &Case) -> Result<(), TestCaseError> {
    w.db.batch_execute(&format!("TRUNCATE {}", w.table))
        .await
        .unwrap();
    w.quotas = case.quotas.clone();
    w.keys = names(case.quotas.len()).iter().map(key).collect();
    w.model = vec![None; case.quotas.len()];
    w.rows.clear();
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
            Op::Check(chosen) => check_step(w, now, chosen, &ctx).await?,
            Op::Settle(chosen) => settle_step(w, now, chosen, &ctx).await?,
        }
    }
    Ok(())
}

fn world(runtime: &tokio::runtime::Runtime) -> World {
    let (db, table) = runtime.block_on(postgres_support::connect("trt_sql"));
    World {
        db,
        table,
        keys: Vec::new(),
        quotas: Vec::new(),
        model: Vec::new(),
        rows: Rows::new(),
        one_bucket: std::cell::Cell::default(),
    }
}

/// Random time steps seldom land on the microsecond where a bucket starts
/// or stops passing: these land on each side of every such instant of a
/// bucket drained to empty, with costs 1 and 2, and of the cap of a TAT
/// too far ahead.
#[test]
fn one_bucket_boundaries_agree_with_gcra_core() {
    let runtime = runtime();
    let mut w = world(&runtime);
    let quota = Quota::per_second(10).allow_burst(3);
    let case = Case {
        quotas: vec![quota],
        start_us: lua_support::START_US,
        steps: Vec::new(),
    };
    runtime.block_on(async {
        run_case(&mut w, &case).await.unwrap();
        let t = quota.emission_interval_us();
        let mut now = lua_support::START_US;
        for cost in [1, 3, 1, 2] {
            check_step(&mut w, now, &[(0, cost, false)], "drain")
                .await
                .unwrap();
        }
        for k in 0..4 {
            for delta in [-1i64, 0, 1] {
                let at = (now + k * t).saturating_add_signed(delta);
                for cost in [2, 1] {
                    let ctx = format!("T * {k} {delta:+} µs, cost {cost}");
                    check_step(&mut w, at, &[(0, cost, false)], &ctx)
                        .await
                        .unwrap();
                }
            }
        }
        // A TAT further ahead than tau + max debt: capped, to the µs.
        now += 10 * t;
        let ceiling = quota.ceiling_us();
        for ahead in [ceiling - 1, ceiling, ceiling + 1] {
            let raw = i64::try_from(now + ahead).unwrap();
            w.db.execute(
                &format!("UPDATE {} SET tat_us = $1", w.table),
                &[&raw],
            )
            .await
            .unwrap();
            w.model[0] = Some(now + ahead);
            w.rows.get_mut(&w.keys[0]).unwrap().0 = raw;
            let ctx = format!("{ahead} µs ahead");
            check_step(&mut w, now, &[(0, 1, false)], &ctx)
                .await
                .unwrap();
        }
    });
    let (answered, declined) = w.one_bucket.get();
    assert!(
        answered > 0 && declined > 0,
        "{answered} answered, {declined} declined"
    );
}

#[test]
fn the_functions_agree_with_gcra_core() {
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
    let (answered, declined) = world.borrow().one_bucket.get();
    assert!(
        answered > 0 && declined > 0,
        "the one-bucket statement answered {answered} checks and left {declined}: \
         the cases must exercise both"
    );
}
