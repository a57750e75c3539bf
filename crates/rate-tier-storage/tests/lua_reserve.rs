//! `src/redis/reserve.lua` and `src/redis/cancel.lua` in an embedded Lua
//! 5.1 (`lua_support`), against gcra-core's `reserve_all` and
//! `Quota::cancel`.
//!
//! The property test runs random sequences of reservations over 1 to 5
//! buckets of one user (burst 1 and debts among the quotas, shadow limits,
//! costs of 0 and above the burst, any wait, the clock going back, corrupt
//! values) and cancels (of earlier reservations, and of whatever is
//! stored), through the scripts and through gcra-core, and requires the
//! same reply field by field, the same verdict and wait, and exactly the
//! writes gcra-core asks for (TATs and expiries), nothing else.
#![allow(clippy::unwrap_used)]

mod cases;
mod lua_support;

use cases::{check_args, cost_strategy, key, names, subset};
use gcra_core::{
    Charge, Decision, JointReservation, MAX_TIME_US, MAX_WINDOW_US, Quota,
    Reservation, StoreTat, Write as Cancel, reserve_all,
};
use lua_support::{
    CANCEL, Corrupt, Harness, RESERVE, START_US, ScriptError, Stored, Write,
    advance_strategy, assert_error_reply, corrupt_strategy, quota_strategy,
    tick,
};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use rate_tier_storage::LimitName;

/// The reply of reserve.lua, read: each bucket's decision (its `store` the
/// TAT written, with its expiry from the script's now) and the summary.
fn read(reply: &[i64], n: usize) -> (Vec<Decision>, JointReservation, u64) {
    assert_eq!(reply.len(), 5 * n + 5, "{reply:?}");
    let u = |v: i64| u64::try_from(v).unwrap();
    let now = u(reply[5 * n + 4]);
    let decisions = reply[..5 * n]
        .chunks(5)
        .map(|d| Decision {
            allowed: match d[0] {
                1 => true,
                0 => false,
                other => panic!("allowed = {other}"),
            },
            remaining: u(d[1]),
            retry_after_us: u(d[2]),
            reset_after_us: u(d[3]),
            store: (d[4] > 0).then(|| StoreTat {
                tat_us: u(d[4]),
                ttl_ms: (u(d[4]) - now).div_ceil(1000),
            }),
        })
        .collect();
    let tail = &reply[5 * n..];
    let joint = JointReservation {
        reserved: match tail[0] {
            1 => true,
            0 => false,
            other => panic!("reserved = {other}"),
        },
        wait_us: u(tail[1]),
        by: usize::try_from(tail[2]).unwrap().checked_sub(1),
        most_us: u(tail[3]),
    };
    (decisions, joint, now)
}

/// reserve.lua's `ARGV`: gcra_all.lua's five per bucket, then the wait
/// (as `RedisStorage` sends it: capped at 2^53).
fn reserve_args(
    names: &[&LimitName],
    charges: &[Charge],
    max_wait_us: u64,
) -> Vec<String> {
    names
        .iter()
        .zip(charges)
        .flat_map(|(n, c)| check_args(n, *c))
        .map(|a| a.to_string())
        .chain([max_wait_us.min(MAX_TIME_US).to_string()])
        .collect()
}

fn refs(items: &[String]) -> Vec<&str> {
    items.iter().map(String::as_str).collect()
}

// ---------------------------------------------------------------------------
// Examples

#[test]
fn reservations_of_a_burst_of_one_go_one_interval_apart() {
    // Quota::reserve's example: T = tau = 100 ms, waits up to 1 s.
    let names = names(1);
    let k = key(&names[0]);
    let quota = Quota::per_second(10)
        .allow_burst(1)
        .allow_debt(std::time::Duration::from_secs(1));
    let h = Harness::new(RESERVE, START_US);
    let args = reserve_args(&[&names[0]], &[Charge::new(quota, 1)], 500_000);
    for i in 0..6u64 {
        let reply = h.eval(&[&k], &refs(&args)).unwrap();
        let (out, joint, now) = read(&reply, 1);
        assert_eq!(now, START_US);
        assert!(joint.reserved, "{i}: {reply:?}");
        assert_eq!(joint.wait_us, i * 100_000);
        assert_eq!(joint.by, (i > 0).then_some(0));
        assert_eq!(joint.most_us, 500_000);
        let tat = START_US + (i + 1) * 100_000;
        assert_eq!(out[0].store.map(|s| s.tat_us), Some(tat));
        assert_eq!(h.take_writes(), [Write::set(&k, tat, (i + 1) * 100)]);
    }
    // The seventh would wait 600 ms: not reserved, nothing written.
    let reply = h.eval(&[&k], &refs(&args)).unwrap();
    let (out, joint, _) = read(&reply, 1);
    assert!(!joint.reserved);
    assert_eq!(joint.wait_us, 600_000);
    assert_eq!(joint.verdict().retry_after_us, 100_000);
    assert_eq!(out[0].store, None);
    assert_eq!(h.take_writes(), []);

    // The last given back exactly; the one before it is kept.
    let cancel = h.load(CANCEL);
    let last = (START_US + 600_000).to_string();
    let before = (START_US + 500_000).to_string();
    assert_eq!(
        h.eval_on(&cancel, &[&k], &["100000", "1", &before]),
        Ok(vec![0])
    );
    assert_eq!(
        h.eval_on(&cancel, &[&k], &["100000", "1", &last]),
        Ok(vec![1])
    );
    assert_eq!(h.take_writes(), [Write::set(&k, START_US + 500_000, 500)]);
    // Again: the stored TAT is no longer that reservation's.
    assert_eq!(
        h.eval_on(&cancel, &[&k], &["100000", "1", &last]),
        Ok(vec![0])
    );
    assert_eq!(h.take_writes(), []);
}

#[test]
fn a_joint_reservation_waits_for_the_slowest_limit_and_charges_both_at_it() {
    // reserve_all's example: 2/s (burst 1) and 100/min, a call went out at 0.
    let names = names(2);
    let keys = [key(&names[0]), key(&names[1])];
    let wait = std::time::Duration::from_secs(10);
    let charges = [
        Charge::new(Quota::per_second(2).allow_burst(1).allow_debt(wait), 1),
        Charge::new(Quota::per_minute(100).allow_debt(wait), 1),
    ];
    let h = Harness::new(RESERVE, START_US);
    h.set_raw(&keys[0], Stored::Str((START_US + 500_000).to_string()));
    h.set_raw(&keys[1], Stored::Str((START_US + 600_000).to_string()));
    let args = reserve_args(&[&names[0], &names[1]], &charges, 1_000_000);
    let reply = h.eval(&[&keys[0], &keys[1]], &refs(&args)).unwrap();
    let (_, joint, _) = read(&reply, 2);
    assert_eq!(
        (joint.reserved, joint.wait_us, joint.by),
        (true, 500_000, Some(0))
    );
    assert_eq!(
        h.take_writes(),
        [
            Write::set(&keys[0], START_US + 1_000_000, 1_000),
            Write::set(&keys[1], START_US + 1_200_000, 1_200),
        ]
    );
    // Waiting at most 100 ms: refused, neither charged.
    let args = reserve_args(&[&names[0], &names[1]], &charges, 100_000);
    let reply = h.eval(&[&keys[0], &keys[1]], &refs(&args)).unwrap();
    let (_, joint, _) = read(&reply, 2);
    assert!(!joint.reserved);
    assert_eq!(h.take_writes(), []);
}

#[test]
fn reserve_bad_arguments_are_error_replies_and_write_nothing() {
    let k = "trt:a:{u}";
    let ok = ["6000000", "60000000", "1", "0", "60000000"];
    let with = |wait: &'static str| {
        let mut v: Vec<&str> = ok.to_vec();
        v.push(wait);
        v
    };
    let cases: Vec<(&str, Vec<&str>, Vec<&str>)> = vec![
        ("no key", vec![], vec!["0"]),
        ("no wait", vec![k], ok.to_vec()),
        ("two waits", vec![k], [&ok[..], &["0", "0"]].concat()),
        ("negative wait", vec![k], with("-1")),
        ("fractional wait", vec![k], with("1.5")),
        ("leading zero wait", vec![k], with("01")),
        ("wait past 2^53", vec![k], with("9007199254740993")),
        ("wait of 17 digits", vec![k], with("10000000000000000")),
        (
            "zero interval",
            vec![k],
            vec!["0", "60000000", "1", "0", "0", "0"],
        ),
        (
            "tau < T",
            vec![k],
            vec!["6000000", "5999999", "1", "0", "0", "0"],
        ),
        (
            "shadow 2",
            vec![k],
            vec!["6000000", "60000000", "1", "2", "0", "0"],
        ),
        (
            "debt past 2^50",
            vec![k],
            vec!["6000000", "60000000", "1", "0", "1125899906842625", "0"],
        ),
        (
            "cost above the burst",
            vec![k],
            vec!["6000000", "60000000", "11", "0", "0", "0"],
        ),
    ];
    for (what, keys, argv) in cases {
        let h = Harness::new(RESERVE, START_US);
        let before = Stored::Str((START_US + 30_000_000).to_string());
        h.set_raw(k, before.clone());
        assert_error_reply(h.eval(&keys, &argv), "reserve: ", what);
        assert_eq!(h.take_writes(), [], "{what}: wrote");
        assert_eq!(h.stored(k), Some(before), "{what}: changed the key");
    }
    // The largest wait is an argument.
    let h = Harness::new(RESERVE, START_US);
    assert!(h.eval(&[k], &with("9007199254740992")).is_ok());
}

#[test]
fn cancel_bad_arguments_are_error_replies_and_write_nothing() {
    let k = "trt:a:{u}";
    let tat = (START_US + 30_000_000).to_string();
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("no key", &[], &[]),
        ("2 arguments", &[k], &["6000000", "1"]),
        ("4 arguments", &[k], &["6000000", "1", &tat, "0"]),
        ("zero interval", &[k], &["0", "1", &tat]),
        ("negative cost", &[k], &["6000000", "-1", &tat]),
        ("cost 2^32", &[k], &["6000000", "4294967296", &tat]),
        ("zero TAT", &[k], &["6000000", "1", "0"]),
        ("TAT past 2^53", &[k], &["6000000", "1", "9007199254740993"]),
        ("fractional TAT", &[k], &["6000000", "1", "1.5"]),
        ("T past 2^53", &[k], &["9007199254740994", "1", &tat]),
    ];
    for (what, keys, argv) in cases {
        let h = Harness::new(CANCEL, START_US);
        let before = Stored::Str(tat.clone());
        h.set_raw(k, before.clone());
        assert_error_reply(h.eval(keys, argv), "cancel: ", what);
        assert_eq!(h.take_writes(), [], "{what}: wrote");
        assert_eq!(h.stored(k), Some(before), "{what}: changed the key");
    }
}

#[test]
fn the_scripts_define_no_function() {
    for (name, source) in [("reserve.lua", RESERVE), ("cancel.lua", CANCEL)] {
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
// The property: the scripts and gcra-core agree on every step.

#[derive(Debug, Clone)]
enum Op {
    /// A reservation of the buckets chosen (cost, shadow), waiting at most
    /// this long.
    Reserve(Vec<(usize, u32, bool)>, u64),
    /// Some of the buckets of an earlier reservation (picked by the
    /// index), given back.
    Cancel(prop::sample::Index, Vec<bool>),
    /// The buckets chosen given back with the cost given, as if a
    /// reservation had written what they hold now.
    CancelStored(Vec<(usize, u32)>),
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

/// The quotas of `lua_all.rs`, a quarter of them evenly spaced (burst 1).
fn reserve_quota() -> impl Strategy<Value = Quota> {
    (quota_strategy(), 0..4u8).prop_map(|(quota, k)| match k {
        0 => quota.try_allow_burst(1).unwrap_or(quota),
        _ => quota,
    })
}

fn wait_strategy(quota: Quota) -> impl Strategy<Value = u64> {
    let tau = quota.burst_offset_us();
    let most = quota.max_wait_us();
    prop_oneof![
        2 => Just(0u64),
        4 => 0..=3 * tau,
        2 => 0..=most.saturating_mul(2),
        1 => Just(most),
        1 => Just(MAX_TIME_US),
        2 => Just(u64::MAX),
        1 => any::<u64>(),
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
        .map(|q| (cost_strategy(*q), prop::bool::weighted(0.25)))
        .collect();
    let stored_costs: Vec<_> =
        quotas.iter().map(|q| cost_strategy(*q)).collect();
    let wait =
        prop_oneof![wait_strategy(quotas[0]), wait_strategy(quotas[n - 1])];
    let op = prop_oneof![
        6 => (subset(n), costs, wait).prop_map(|(chosen, costs, wait)| {
            Op::Reserve(
                chosen.into_iter().map(|i| (i, costs[i].0, costs[i].1)).collect(),
                wait,
            )
        }),
        2 => (any::<prop::sample::Index>(), prop::collection::vec(prop::bool::weighted(0.8), 5))
            .prop_map(|(pick, mask)| Op::Cancel(pick, mask)),
        1 => (subset(n), stored_costs).prop_map(|(chosen, costs)| {
            Op::CancelStored(chosen.into_iter().map(|i| (i, costs[i])).collect())
        }),
    ];
    (advance, corrupt, op).prop_map(|(advance_us, corrupt, op)| Step {
        advance_us,
        corrupt,
        op,
    })
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let start = prop_oneof![
        7 => START_US..=START_US + 1_000_000_000_000,
        // Near 2^53, where the TATs overflow.
        1 => MAX_TIME_US - 4 * MAX_WINDOW_US..=MAX_TIME_US,
    ];
    (prop::collection::vec(reserve_quota(), 1..=5), start).prop_flat_map(
        |(quotas, start_us)| {
            (
                Just(quotas.clone()),
                Just(start_us),
                prop::collection::vec(step_strategy(quotas), 1..30),
            )
                .prop_map(|(quotas, start_us, steps)| Case {
                    quotas,
                    start_us,
                    steps,
                })
        },
    )
}

/// The buckets of a case, on one fake Redis and in gcra-core's eyes.
struct World {
    h: Harness,
    cancel: mlua::Function,
    names: Vec<LimitName>,
    keys: Vec<String>,
    quotas: Vec<Quota>,
    /// What gcra-core is handed: the last TAT written, until Redis expires
    /// it.
    model: Vec<Option<u64>>,
    /// Every reservation made: (bucket, cost, TAT written) of each bucket
    /// it charged.
    history: Vec<Vec<(usize, u32, u64)>>,
}

fn reserve_step(
    w: &mut World,
    now: u64,
    chosen: &[(usize, u32, bool)],
    max_wait_us: u64,
    ctx: &str,
) -> Result<(), TestCaseError> {
    let World {
        h,
        names,
        keys,
        quotas,
        model,
        history,
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
    let call_names: Vec<&LimitName> =
        chosen.iter().map(|&(i, ..)| &names[i]).collect();
    let args = reserve_args(&call_names, &charges, max_wait_us);

    let reply = h.eval(&refs(&call_keys), &refs(&args));
    let writes = h.take_writes();
    let mut out = vec![Decision::default(); chosen.len()];
    match reserve_all(&charges, &stored, now, max_wait_us, &mut out) {
        Ok(joint) => {
            let reply = reply
                .map_err(|e| TestCaseError::fail(format!("{ctx}: {e:?}")))?;
            let (got, got_joint, got_now) = read(&reply, chosen.len());
            prop_assert_eq!(got_now, now, "{}", ctx);
            prop_assert_eq!(&got, &out, "{}", ctx);
            let expected = JointReservation {
                most_us: joint.most_us.min(MAX_TIME_US),
                ..joint
            };
            prop_assert_eq!(got_joint, expected, "{}", ctx);
            if joint.most_us < MAX_TIME_US {
                prop_assert_eq!(
                    got_joint.verdict(),
                    joint.verdict(),
                    "{}",
                    ctx
                );
            }
            let mut expected_writes = Vec::new();
            let mut charged = Vec::new();
            for (&(i, cost, _), d) in chosen.iter().zip(&out) {
                if let Some(s) = d.store {
                    expected_writes
                        .push(Write::set(&keys[i], s.tat_us, s.ttl_ms));
                    model[i] = Some(s.tat_us);
                    if joint.reserved && cost > 0 {
                        charged.push((i, cost, s.tat_us));
                    }
                }
            }
            prop_assert_eq!(&writes, &expected_writes, "{}", ctx);
            if !charged.is_empty() {
                history.push(charged);
            }
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

/// Gives back `(bucket, cost, TAT)` through cancel.lua and Quota::cancel.
fn cancel_step(
    w: &mut World,
    now: u64,
    chosen: &[(usize, u32, u64)],
    ctx: &str,
) -> Result<(), TestCaseError> {
    let World {
        h,
        cancel,
        keys,
        quotas,
        model,
        ..
    } = w;
    let call_keys: Vec<String> =
        chosen.iter().map(|&(i, ..)| keys[i].clone()).collect();
    let args: Vec<String> = chosen
        .iter()
        .flat_map(|&(i, cost, tat)| {
            [quotas[i].emission_interval_us(), u64::from(cost), tat]
        })
        .map(|a| a.to_string())
        .collect();
    let reply = h.eval_on(cancel, &refs(&call_keys), &refs(&args));
    let writes = h.take_writes();
    let reply =
        reply.map_err(|e| TestCaseError::fail(format!("{ctx}: {e:?}")))?;
    let mut expected_reply = Vec::new();
    let mut expected_writes = Vec::new();
    for &(i, cost, tat) in chosen {
        let reservation = Reservation {
            wait_us: 0,
            cost,
            store: StoreTat {
                tat_us: tat,
                ttl_ms: 0,
            },
        };
        match quotas[i].cancel(model[i], now, &reservation) {
            Cancel::Keep => expected_reply.push(0),
            Cancel::Set(s) => {
                expected_reply.push(1);
                expected_writes.push(Write::set(&keys[i], s.tat_us, s.ttl_ms));
                model[i] = Some(s.tat_us);
            }
            Cancel::Clear => {
                expected_reply.push(2);
                expected_writes.push(Write::del(&keys[i]));
                model[i] = None;
            }
        }
    }
    prop_assert_eq!(&reply, &expected_reply, "{}", ctx);
    prop_assert_eq!(&writes, &expected_writes, "{}", ctx);
    Ok(())
}

fn run_case(case: &Case) -> Result<(), TestCaseError> {
    let names = names(case.quotas.len());
    let h = Harness::new(RESERVE, case.start_us);
    let mut w = World {
        cancel: h.load(CANCEL),
        h,
        keys: names.iter().map(key).collect(),
        names,
        quotas: case.quotas.clone(),
        model: vec![None; case.quotas.len()],
        history: Vec::new(),
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
            Op::Reserve(chosen, wait) => {
                reserve_step(&mut w, now, chosen, *wait, &ctx)?
            }
            Op::Cancel(pick, mask) => {
                if w.history.is_empty() {
                    continue;
                }
                let reserved = w.history[pick.index(w.history.len())].clone();
                let chosen: Vec<(usize, u32, u64)> = reserved
                    .into_iter()
                    .zip(mask.iter().chain(std::iter::repeat(&true)))
                    .filter(|(_, keep)| **keep)
                    .map(|(r, _)| r)
                    .collect();
                if !chosen.is_empty() {
                    cancel_step(&mut w, now, &chosen, &ctx)?;
                }
            }
            Op::CancelStored(chosen) => {
                // Only a TAT a reservation could have written.
                let chosen: Vec<(usize, u32, u64)> = chosen
                    .iter()
                    .filter_map(|&(i, cost)| {
                        let tat = w.model[i]
                            .filter(|t| (1..=MAX_TIME_US).contains(t))?;
                        Some((i, cost, tat))
                    })
                    .collect();
                if !chosen.is_empty() {
                    cancel_step(&mut w, now, &chosen, &ctx)?;
                }
            }
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
    fn scripts_reserve_and_cancel_as_gcra_core(case in case_strategy()) {
        run_case(&case)?;
    }
}
