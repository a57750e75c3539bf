//! `src/redis/gcra_all.lua` and `src/redis/gcra_settle.lua` in an embedded
//! Lua 5.1 (`lua_support`), against gcra-core's `check_all` and
//! `Quota::settle`.
//!
//! The property test runs random sequences of decisions over 1 to 5
//! buckets of one user (cluster keys, one slot: as `RedisStorage` sends
//! them) and settlements, through the script and through gcra-core, and
//! requires the same reply field by field and exactly the writes gcra-core
//! asks for (`Decision::store`, `Settled::write`), nothing else.
#![allow(clippy::unwrap_used)]

mod cases;
mod lua_support;

use std::time::Duration;

use cases::{
    Case, Op, case_strategy, check_args, decisions, key, names, settle_args,
};
use gcra_core::{
    Adjust, Charge, Decision, MAX_TIME_US, Quota, Verdict, Write as Settle,
    check_all,
};
use lua_support::{
    GCRA, GCRA_ALL, GCRA_SETTLE, Harness, START_US, ScriptError, Stored, Write,
    assert_error_reply, tick,
};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use rate_tier_storage::LimitName;

// ---------------------------------------------------------------------------
// gcra_all.lua

#[test]
fn the_fourth_search_of_the_minute_refuses_and_charges_no_one() {
    // check_all's doc example: tier 10/min, `search` 3/min, three searches.
    let names = names(2);
    let (plan, search) = (key(&names[0]), key(&names[1]));
    let h = Harness::new(GCRA_ALL, START_US);
    h.set_raw(&plan, Stored::Str((START_US + 18_000_000).to_string()));
    h.set_raw(&search, Stored::Str((START_US + 60_000_000).to_string()));
    let charges = [
        Charge::new(Quota::per_minute(10), 1),
        Charge::new(Quota::per_minute(3), 1),
    ];
    let args: Vec<i64> = names
        .iter()
        .zip(charges)
        .flat_map(|(n, c)| check_args(n, c))
        .collect();
    let reply = h.eval_args(&[plan.clone(), search.clone()], &args).unwrap();
    assert_eq!(
        reply,
        [1, 7, 0, 18_000_000, 0, 0, 20_000_000, 60_000_000],
        "the plan would pass, uncharged; search waits 20 s"
    );
    assert_eq!(h.take_writes(), []);
    let v = Verdict::of([false, false], &decisions(&reply));
    assert_eq!(
        (v.allowed, v.refused_by, v.retry_after_us),
        (false, Some(1), 20_000_000)
    );
}

#[test]
fn a_shadow_refusal_refuses_nothing_and_is_not_charged() {
    let names = names(2);
    let keys = [key(&names[0]), key(&names[1])];
    let h = Harness::new(GCRA_ALL, START_US);
    h.set_raw(&keys[1], Stored::Str((START_US + 60_000_000).to_string()));
    let charges = [
        Charge::new(Quota::per_minute(10), 1),
        Charge::new(Quota::per_minute(3), 1).shadow(),
    ];
    let args: Vec<i64> = names
        .iter()
        .zip(charges)
        .flat_map(|(n, c)| check_args(n, c))
        .collect();
    let reply = h.eval_args(&keys, &args).unwrap();
    assert_eq!(reply, [1, 9, 0, 6_000_000, 0, 0, 20_000_000, 60_000_000]);
    assert_eq!(
        h.take_writes(),
        [Write::set(&keys[0], START_US + 6_000_000, 6_000)]
    );
}

#[test]
fn a_peek_never_writes_not_even_a_cap() {
    let names = names(1);
    let k = key(&names[0]);
    let h = Harness::new(GCRA_ALL, START_US);
    // The clock went back two hours: a check would cap and store; a peek
    // reads (an hour in debt after the cap: refused for that long).
    let far = Stored::Str((START_US + 7_200_000_000).to_string());
    h.set_raw(&k, far.clone());
    let args = check_args(&names[0], Charge::new(Quota::per_second(1), 0));
    assert_eq!(
        h.eval_args(std::slice::from_ref(&k), &args),
        Ok(vec![0, 0, 3_600_000_000, 3_601_000_000])
    );
    assert_eq!(h.take_writes(), []);
    assert_eq!(h.stored(&k), Some(far));
}

#[test]
fn bad_arguments_are_error_replies_and_write_nothing() {
    let k = "trt:a:{u}";
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("no key", &[], &[]),
        ("no arguments", &[k], &[]),
        ("4 arguments", &[k], &["6000000", "60000000", "1", "0"]),
        (
            "6 arguments",
            &[k],
            &["6000000", "60000000", "1", "0", "0", "0"],
        ),
        (
            "5 arguments for 2 keys",
            &[k, "trt:b:{u}"],
            &["6000000", "60000000", "1", "0", "0"],
        ),
        ("zero interval", &[k], &["0", "60000000", "1", "0", "0"]),
        ("zero burst offset", &[k], &["6000000", "0", "1", "0", "0"]),
        ("tau < T", &[k], &["6000000", "5999999", "1", "0", "0"]),
        (
            "negative cost",
            &[k],
            &["6000000", "60000000", "-1", "0", "0"],
        ),
        (
            "leading zero cost",
            &[k],
            &["6000000", "60000000", "01", "0", "0"],
        ),
        (
            "double zero cost",
            &[k],
            &["6000000", "60000000", "00", "0", "0"],
        ),
        (
            "leading zero T",
            &[k],
            &["06000000", "60000000", "1", "0", "0"],
        ),
        ("exponent", &[k], &["6e6", "60000000", "1", "0", "0"]),
        ("hex", &[k], &["0x10", "60000000", "1", "0", "0"]),
        ("spaces", &[k], &[" 6000000", "60000000", "1", "0", "0"]),
        (
            "inner space",
            &[k],
            &["6000000", "60000000 1", "1", "0", "0"],
        ),
        ("fraction", &[k], &["6000000", "60000000", "1.0", "0", "0"]),
        ("empty", &[k], &["", "60000000", "1", "0", "0"]),
        ("nan", &[k], &["nan", "60000000", "1", "0", "0"]),
        ("shadow 2", &[k], &["6000000", "60000000", "1", "2", "0"]),
        ("shadow empty", &[k], &["6000000", "60000000", "1", "", "0"]),
        (
            "shadow true",
            &[k],
            &["6000000", "60000000", "1", "true", "0"],
        ),
        (
            "cost above the burst",
            &[k],
            &["6000000", "60000000", "11", "0", "0"],
        ),
        (
            "cost above the burst, in shadow",
            &[k],
            &["6000000", "60000000", "11", "1", "0"],
        ),
        (
            "T past 2^53",
            &[k],
            &["9007199254740994", "9007199254740994", "1", "0", "0"],
        ),
        (
            "T at 2^53 + 1",
            &[k],
            &["9007199254740993", "9007199254740993", "1", "0", "0"],
        ),
        (
            "cost at 2^53 + 1",
            &[k],
            &["1", "9007199254740992", "9007199254740993", "0", "0"],
        ),
        (
            "a bad second key",
            &[k, "trt:b:{u}"],
            &[
                "6000000", "60000000", "1", "0", "0", "6000000", "60000000",
                "x", "0", "0",
            ],
        ),
        (
            "negative debt",
            &[k],
            &["6000000", "60000000", "1", "0", "-1"],
        ),
        (
            "fractional debt",
            &[k],
            &["6000000", "60000000", "1", "0", "1.5"],
        ),
        (
            "leading zero debt",
            &[k],
            &["6000000", "60000000", "1", "0", "01"],
        ),
        (
            "debt past 2^50",
            &[k],
            &["6000000", "60000000", "1", "0", "1125899906842625"],
        ),
        (
            "debt of 17 digits",
            &[k],
            &["6000000", "60000000", "1", "0", "10000000000000000"],
        ),
    ];
    for (what, keys, argv) in cases {
        let h = Harness::new(GCRA_ALL, START_US);
        let before = Stored::Str((START_US + 30_000_000).to_string());
        h.set_raw(k, before.clone());
        assert_error_reply(h.eval(keys, argv), "gcra_all: ", what);
        assert_eq!(h.take_writes(), [], "{what}: wrote");
        assert_eq!(h.stored(k), Some(before), "{what}: changed the key");
    }
}

#[test]
fn largest_arguments_are_accepted_and_past_them_is_an_error() {
    let k = "trt:a:{u}";
    let h = Harness::new(GCRA_ALL, START_US);
    let max = MAX_TIME_US.to_string();
    assert_eq!(
        h.eval(&[k], &["1", &max, "2", "0", "0"]),
        Ok(vec![1, (MAX_TIME_US - 2) as i64, 0, 2])
    );
    h.take_writes();
    // tat = now: T * cost lands exactly on 2^53, then one µs past it.
    let h = Harness::new(GCRA_ALL, START_US);
    let t = (MAX_TIME_US - START_US).to_string();
    assert_eq!(
        h.eval(&[k], &[&t, &t, "1", "1", "0"]),
        Ok(vec![1, 0, 0, (MAX_TIME_US - START_US) as i64])
    );
    let px = (MAX_TIME_US - START_US).div_ceil(1000);
    assert_eq!(h.take_writes(), [Write::set(k, MAX_TIME_US, px)]);
    let h = Harness::new(GCRA_ALL, START_US);
    let t = (MAX_TIME_US - START_US + 1).to_string();
    assert_eq!(
        h.eval(
            &[k, "trt:b:{u}"],
            &["1", "10", "1", "0", "10", &t, &t, "1", "0", "0"]
        ),
        Err(ScriptError::Reply(
            "gcra_all: time values exceed the exact range of Lua numbers"
                .into()
        ))
    );
    assert_eq!(h.take_writes(), [], "the first key is not charged either");
}

#[test]
fn the_scripts_define_no_function() {
    // Redis runs a script's body as one function: a function defined in it
    // is a new closure on every call, paid in Redis's CPU.
    for (name, source) in [
        ("gcra.lua", GCRA),
        ("gcra_all.lua", GCRA_ALL),
        ("gcra_settle.lua", GCRA_SETTLE),
    ] {
        let code: String = source
            .lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(!code.contains("function"), "{name} defines a function");
        assert!(!code.contains("%.0f"), "{name} formats with %.0f");
    }
}

// ---------------------------------------------------------------------------
// gcra_settle.lua

#[test]
fn a_debt_of_1200_tokens_makes_the_next_request_wait_12_seconds() {
    // Quota::settle's doc example, through gcra.lua and gcra_settle.lua on
    // one Redis.
    let quota = Quota::per_minute(1000);
    let k = "trt:tokens:{u}";
    let h = Harness::new(GCRA, START_US);
    let settle = h.load(GCRA_SETTLE);
    let [t, tau] = [quota.emission_interval_us(), quota.burst_offset_us()]
        .map(|v| v.to_string());
    assert_eq!(h.eval(&[k], &[&t, &tau, "1"]), Ok(vec![1, 999, 0, 60_000]));
    assert_eq!(
        h.eval_on(&settle, &[k], &[&t, &tau, "1199", &tau]),
        Ok(vec![0, 72_000_000])
    );
    assert_eq!(
        h.take_writes()[1..],
        [Write::set(k, START_US + 72_000_000, 72_000)]
    );
    assert_eq!(
        h.eval(&[k], &[&t, &tau, "1"]),
        Ok(vec![0, 0, 12_060_000, 72_000_000])
    );

    // Everything back: the bucket is full, the key deleted.
    assert_eq!(
        h.eval_on(&settle, &[k], &[&t, &tau, "-1200", &tau]),
        Ok(vec![1000, 0])
    );
    assert_eq!(h.take_writes(), [Write::del(k)]);
    assert_eq!(h.stored(k), None);
}

#[test]
fn settle_bad_arguments_are_error_replies_and_write_nothing() {
    let k = "trt:a:{u}";
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("no key", &[], &[]),
        ("no arguments", &[k], &[]),
        ("3 arguments", &[k], &["6000000", "60000000", "1"]),
        ("5 arguments", &[k], &["6000000", "60000000", "1", "0", "0"]),
        ("zero interval", &[k], &["0", "60000000", "1", "0"]),
        ("tau < T", &[k], &["6000000", "5999999", "1", "0"]),
        ("minus zero", &[k], &["6000000", "60000000", "-0", "0"]),
        ("leading zero", &[k], &["6000000", "60000000", "01", "0"]),
        (
            "negative leading zero",
            &[k],
            &["6000000", "60000000", "-01", "0"],
        ),
        ("plus", &[k], &["6000000", "60000000", "+1", "0"]),
        ("fraction", &[k], &["6000000", "60000000", "1.5", "0"]),
        ("exponent", &[k], &["6000000", "60000000", "1e3", "0"]),
        (
            "units 2^32",
            &[k],
            &["6000000", "60000000", "4294967296", "0"],
        ),
        (
            "units -2^32",
            &[k],
            &["6000000", "60000000", "-4294967296", "0"],
        ),
        (
            "T at 2^53 + 1",
            &[k],
            &["9007199254740993", "9007199254740993", "1", "0"],
        ),
        ("negative debt", &[k], &["6000000", "60000000", "1", "-1"]),
        (
            "debt past 2^50",
            &[k],
            &["6000000", "60000000", "1", "1125899906842625"],
        ),
        (
            "a bad second key",
            &[k, "trt:b:{u}"],
            &[
                "6000000", "60000000", "1", "0", "6000000", "60000000", "x",
                "0",
            ],
        ),
    ];
    for (what, keys, argv) in cases {
        let h = Harness::new(GCRA_SETTLE, START_US);
        let before = Stored::Str((START_US + 30_000_000).to_string());
        h.set_raw(k, before.clone());
        assert_error_reply(h.eval(keys, argv), "gcra_settle: ", what);
        assert_eq!(h.take_writes(), [], "{what}: wrote");
        assert_eq!(h.stored(k), Some(before), "{what}: changed the key");
    }
    // The extremes of units are arguments, not errors.
    let h = Harness::new(GCRA_SETTLE, START_US);
    assert_eq!(
        h.eval(&[k], &["6000000", "60000000", "4294967295", "60000000"]),
        Ok(vec![0, 120_000_000])
    );
    assert_eq!(
        h.eval(&[k], &["6000000", "60000000", "-4294967295", "60000000"]),
        Ok(vec![10, 0])
    );
    // With the largest bound, the debt stops only there.
    let h = Harness::new(GCRA_SETTLE, START_US);
    assert_eq!(
        h.eval(
            &[k],
            &["6000000", "60000000", "4294967295", "1125899906842624"]
        ),
        Ok(vec![0, 60_000_000 + 1_125_899_906_842_624])
    );
}

// ---------------------------------------------------------------------------
// The property: the scripts and gcra-core agree on every step.

/// The buckets of a case, on one fake Redis and in gcra-core's eyes.
struct World {
    h: Harness,
    settle: mlua::Function,
    names: Vec<LimitName>,
    keys: Vec<String>,
    quotas: Vec<Quota>,
    /// What gcra-core is handed: the last TAT written, until Redis expires
    /// it.
    model: Vec<Option<u64>>,
}

/// One decision through gcra_all.lua and check_all.
fn check_step(
    w: &mut World,
    now: u64,
    chosen: &[(usize, u32, bool)],
    ctx: &str,
) -> Result<(), TestCaseError> {
    let World {
        h,
        names,
        keys,
        quotas,
        model,
        ..
    } = w;
    let charges: Vec<Charge> = chosen
        .iter()
        .map(|&(i, cost, shadow)| Charge {
            quota: quotas[i],
            cost,
            shadow,
        })
        .collect();
    let stored: Vec<Option<u64>> =
        chosen.iter().map(|&(i, ..)| model[i]).collect();
    let call_keys: Vec<String> =
        chosen.iter().map(|&(i, ..)| keys[i].clone()).collect();
    let args: Vec<i64> = chosen
        .iter()
        .zip(&charges)
        .flat_map(|(&(i, ..), charge)| check_args(&names[i], *charge))
        .collect();

    let reply = h.eval_args(&call_keys, &args);
    let writes = h.take_writes();
    let mut out = vec![Decision::default(); chosen.len()];
    match check_all(&charges, &stored, now, &mut out) {
        Ok(verdict) => {
            let reply = reply
                .map_err(|e| TestCaseError::fail(format!("{ctx}: {e:?}")))?;
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
            let mut expected_writes = Vec::new();
            for (&(i, ..), d) in chosen.iter().zip(&out) {
                if let Some(s) = d.store {
                    expected_writes
                        .push(Write::set(&keys[i], s.tat_us, s.ttl_ms));
                    model[i] = Some(s.tat_us);
                }
            }
            prop_assert_eq!(&writes, &expected_writes, "{}", ctx);
        }
        Err(e) => {
            prop_assert!(
                matches!(reply, Err(ScriptError::Reply(_))),
                "{}: gcra-core says {:?}, the script {:?}",
                ctx,
                e,
                reply
            );
            prop_assert_eq!(&writes, &[], "{}", ctx);
        }
    }
    Ok(())
}

/// One settlement through gcra_settle.lua and Quota::settle.
fn settle_step(
    w: &mut World,
    now: u64,
    chosen: &[(usize, Adjust)],
    ctx: &str,
) -> Result<(), TestCaseError> {
    let World {
        h,
        settle,
        keys,
        quotas,
        model,
        ..
    } = w;
    let call_keys: Vec<String> =
        chosen.iter().map(|&(i, _)| keys[i].clone()).collect();
    let args: Vec<String> = chosen
        .iter()
        .flat_map(|&(i, adjust)| settle_args(quotas[i], adjust))
        .map(|a| a.to_string())
        .collect();
    let key_refs: Vec<&str> = call_keys.iter().map(String::as_str).collect();
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let reply = h.eval_on(settle, &key_refs, &arg_refs);
    let writes = h.take_writes();

    let settled: Result<Vec<_>, _> = chosen
        .iter()
        .map(|&(i, adjust)| quotas[i].settle(model[i], now, adjust))
        .collect();
    match settled {
        Ok(settled) => {
            let reply = reply
                .map_err(|e| TestCaseError::fail(format!("{ctx}: {e:?}")))?;
            let expected: Vec<i64> = settled
                .iter()
                .flat_map(|s| [s.remaining as i64, s.reset_after_us as i64])
                .collect();
            prop_assert_eq!(&reply, &expected, "{}", ctx);
            let mut expected_writes = Vec::new();
            for (&(i, _), s) in chosen.iter().zip(&settled) {
                match s.write {
                    Settle::Keep => {}
                    Settle::Set(store) => {
                        expected_writes.push(Write::set(
                            &keys[i],
                            store.tat_us,
                            store.ttl_ms,
                        ));
                        model[i] = Some(store.tat_us);
                    }
                    Settle::Clear => {
                        expected_writes.push(Write::del(&keys[i]));
                        model[i] = None;
                    }
                }
            }
            prop_assert_eq!(&writes, &expected_writes, "{}", ctx);
        }
        Err(e) => {
            prop_assert!(
                matches!(reply, Err(ScriptError::Reply(_))),
                "{}: gcra-core says {:?}, the script {:?}",
                ctx,
                e,
                reply
            );
            prop_assert_eq!(&writes, &[], "{}", ctx);
        }
    }
    Ok(())
}

fn run_case(case: &Case) -> Result<(), TestCaseError> {
    let names = names(case.quotas.len());
    let h = Harness::new(GCRA_ALL, case.start_us);
    let mut w = World {
        settle: h.load(GCRA_SETTLE),
        h,
        keys: names.iter().map(key).collect(),
        names,
        quotas: case.quotas.clone(),
        model: vec![None; case.quotas.len()],
    };
    let mut now = case.start_us;
    for (i, step) in case.steps.iter().enumerate() {
        now = now.saturating_add_signed(step.advance_us).max(1);
        tick(&w.h, &w.keys, &mut w.model, now)?;
        for (k, corrupt) in step.corrupt.iter().enumerate() {
            if let Some(corrupt) = corrupt {
                w.model[k] = corrupt.apply(&w.h, &w.keys[k], now);
            }
        }
        w.h.take_writes();
        let ctx =
            format!("step {i}: now {now}, stored {:?}, {:?}", w.model, step.op);
        match &step.op {
            Op::Check(chosen) => check_step(&mut w, now, chosen, &ctx)?,
            Op::Settle(chosen) => settle_step(&mut w, now, chosen, &ctx)?,
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn scripts_agree_with_gcra_core(case in case_strategy()) {
        run_case(&case)?;
    }
}

#[test]
fn quotas_of_the_property_reach_the_largest_windows() {
    // The strategy's large quotas are real quotas, near 2^50 µs.
    let period = gcra_core::MAX_WINDOW_US / 4;
    let quota = Quota::new(1, Duration::from_micros(period))
        .unwrap()
        .try_allow_burst(4)
        .unwrap();
    assert_eq!(quota.burst_offset_us(), gcra_core::MAX_WINDOW_US);
}
