//! `src/redis/release.lua` and `src/redis/renew.lua` in an embedded Lua 5.1
//! (`lua_support`), beside `decide_mixed.lua`'s concurrency limits (tag 3):
//! a release gives back exactly the request's own slots, a renewal sets
//! the expiry of those still live to now + the lease and takes no expired
//! one again, and the key lives as long as its latest slot.
//!
//! The property test runs random sequences of acquisitions, releases,
//! renewals and clock steps over one key, with a few slot ids, through
//! the scripts and through gcra-core (`Concurrency::acquire` over
//! `Lease::live`, a slot per unit of cost, each expiring at
//! `Lease::expiry`), and requires the same replies and exactly the same
//! slots in the key after every step.
#![allow(clippy::unwrap_used)]

mod lua_support;

use std::collections::BTreeMap;
use std::time::Duration;

use gcra_core::{Concurrency, Lease, MAX_TIME_US, RETRY_HINT_US};
use lua_support::{
    DECIDE_MIXED, Harness, RELEASE, RENEW, START_US, ScriptError, Stored,
    Write, assert_error_reply,
};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

const SECOND: u64 = 1_000_000;
const KEY: &str = "trt:limit/uploads:{u}";

/// The three scripts on one fake Redis.
struct Scripts {
    h: Harness,
    release: mlua::Function,
    renew: mlua::Function,
}

impl Scripts {
    fn new(now: u64) -> Scripts {
        let h = Harness::new(DECIDE_MIXED, now);
        let (release, renew) = (h.load(RELEASE), h.load(RENEW));
        Scripts { h, release, renew }
    }

    /// decide_mixed.lua over one concurrency limit.
    fn acquire(
        &self,
        limit: u32,
        lease_us: u64,
        id: u64,
        cost: u32,
    ) -> Result<Vec<i64>, ScriptError> {
        let args = [
            "3",
            &limit.to_string(),
            &lease_us.to_string(),
            &id.to_string(),
        ]
        .map(str::to_owned);
        let args = [&args[..], &[cost.to_string(), "0".into()]].concat();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.h.eval(&[KEY], &args)
    }

    /// release.lua: `(id, cost)` per key.
    fn release(
        &self,
        keys: &[&str],
        slots: &[(u64, u32)],
    ) -> Result<Vec<i64>, ScriptError> {
        let args: Vec<String> = slots
            .iter()
            .flat_map(|(id, cost)| [id.to_string(), cost.to_string()])
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.h.eval_on(&self.release, keys, &args)
    }

    /// renew.lua: `(id, cost, lease)` per key.
    fn renew(
        &self,
        keys: &[&str],
        slots: &[(u64, u32, u64)],
    ) -> Result<Vec<i64>, ScriptError> {
        let args: Vec<String> = slots
            .iter()
            .flat_map(|(id, cost, lease)| {
                [id.to_string(), cost.to_string(), lease.to_string()]
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.h.eval_on(&self.renew, keys, &args)
    }

    /// The key's slots, member to expiry (empty when there is no key).
    fn slots(&self, key: &str) -> BTreeMap<String, u64> {
        match self.h.stored(key) {
            None => BTreeMap::new(),
            Some(Stored::ZSet(set)) => {
                set.into_iter().map(|(m, s)| (m, s as u64)).collect()
            }
            Some(other) => panic!("{key} holds {other:?}"),
        }
    }
}

fn zset(slots: &[(&str, u64)]) -> Stored {
    Stored::ZSet(
        slots
            .iter()
            .map(|&(m, e)| (m.to_owned(), e as f64))
            .collect(),
    )
}

// ---------------------------------------------------------------------------
// Unit tests

#[test]
fn a_release_gives_back_exactly_the_requests_own_slots() {
    let s = Scripts::new(START_US);
    let lease = 30 * SECOND;
    assert_eq!(s.acquire(5, lease, 1, 1), Ok(vec![1, 4, 0, 0]));
    assert_eq!(s.acquire(5, lease, 2, 2), Ok(vec![1, 2, 0, 0]));
    assert_eq!(s.acquire(5, lease, 3, 1), Ok(vec![1, 1, 0, 0]));
    s.h.take_writes();
    assert_eq!(s.release(&[KEY], &[(2, 2)]), Ok(vec![2]));
    let expiry = START_US + lease;
    assert_eq!(
        s.h.take_writes(),
        [
            Write::Zremrangebyscore {
                key: KEY.into(),
                min: "-inf".into(),
                max: START_US.to_string(),
            },
            Write::Zrem {
                key: KEY.into(),
                members: vec!["2:1".into(), "2:2".into()],
            },
        ]
    );
    assert_eq!(
        s.slots(KEY),
        BTreeMap::from([("1:1".into(), expiry), ("3:1".into(), expiry)])
    );
    assert_eq!(s.acquire(5, lease, 4, 0), Ok(vec![1, 3, 0, 0]));
    // Again, or more than was taken: nothing that is not held.
    assert_eq!(s.release(&[KEY], &[(2, 2)]), Ok(vec![0]));
    assert_eq!(s.release(&[KEY], &[(1, 3)]), Ok(vec![1]));
    assert_eq!(s.release(&[KEY], &[(u64::MAX, 1)]), Ok(vec![0]));
    // The last one out: Redis deletes the empty set.
    assert_eq!(s.release(&[KEY], &[(3, 1)]), Ok(vec![1]));
    assert_eq!(s.h.stored(KEY), None);
    assert_eq!(s.release(&[KEY], &[(3, 1)]), Ok(vec![0]));
}

#[test]
fn a_release_drops_the_expired_slots_and_leaves_other_types_alone() {
    let s = Scripts::new(START_US);
    s.h.set_raw(
        KEY,
        zset(&[("1:1", START_US), ("2:1", START_US + 1), ("dead", 5)]),
    );
    // 1:1 expired at now: dropped with the others, not counted.
    assert_eq!(s.release(&[KEY], &[(1, 1)]), Ok(vec![0]));
    assert_eq!(s.h.stored(KEY), Some(zset(&[("2:1", START_US + 1)])));
    let (string, list) = ("trt:a:{u}", "trt:b:{u}");
    s.h.set_raw(string, Stored::Str("5".into()));
    s.h.set_raw(list, Stored::List(vec!["5".into()]));
    s.h.take_writes();
    assert_eq!(
        s.release(&[string, list, KEY], &[(2, 1), (2, 1), (2, 1)]),
        Ok(vec![0, 0, 1])
    );
    assert_eq!(s.h.stored(string), Some(Stored::Str("5".into())));
    assert_eq!(s.h.stored(list), Some(Stored::List(vec!["5".into()])));
    assert_eq!(s.h.stored(KEY), None);
}

#[test]
fn a_renewal_keeps_the_live_slots_and_takes_no_expired_one_again() {
    let s = Scripts::new(START_US);
    let lease = 3 * SECOND;
    assert_eq!(s.acquire(2, lease, 1, 1), Ok(vec![1, 1, 0, 0]));
    s.h.set_now(START_US + SECOND);
    assert_eq!(s.acquire(2, lease, 2, 1), Ok(vec![1, 0, 0, 0]));
    // Renewed every second, the first one outlives its lease.
    for t in 2..=6 {
        let now = START_US + t * SECOND;
        s.h.set_now(now);
        s.h.take_writes();
        let renewed = s.renew(&[KEY], &[(1, 1, lease)]);
        if t < 4 {
            assert_eq!(renewed, Ok(vec![1]), "at {t} s");
            assert_eq!(s.slots(KEY)["1:1"], now + lease);
            assert_eq!(
                s.h.take_writes().last(),
                Some(&Write::Pexpire {
                    key: KEY.into(),
                    ms: 3000,
                })
            );
        } else {
            // The second expired at 4 s: the first is renewed alone.
            assert_eq!(renewed, Ok(vec![1]), "at {t} s");
            assert_eq!(
                s.slots(KEY),
                BTreeMap::from([("1:1".into(), now + lease)])
            );
        }
        assert_eq!(
            s.acquire(2, lease, 9, 0),
            Ok(vec![1, if t < 4 { 0 } else { 1 }, 0, 0])
        );
    }
    // Not renewed past its lease: gone, and a late renewal takes nothing.
    let expired = START_US + 9 * SECOND;
    s.h.set_now(expired);
    assert_eq!(s.renew(&[KEY], &[(1, 1, lease)]), Ok(vec![0]));
    assert_eq!(s.h.stored(KEY), None);
    assert_eq!(s.acquire(2, lease, 9, 0), Ok(vec![1, 2, 0, 0]));
}

#[test]
fn a_renewal_touches_no_other_requests_slot_and_keeps_the_latest() {
    let s = Scripts::new(START_US);
    let later = START_US + 60 * SECOND;
    s.h.set_raw(
        KEY,
        zset(&[
            ("1:1", START_US + SECOND),
            ("1:2", START_US),
            ("2:1", later),
            ("junk", MAX_TIME_US + 2),
        ]),
    );
    assert_eq!(s.renew(&[KEY], &[(1, 3, 2 * SECOND)]), Ok(vec![1]));
    assert_eq!(
        s.h.entry(KEY),
        Some((
            zset(&[("1:1", START_US + 2 * SECOND), ("2:1", later)]),
            // The key lives until its latest slot expires.
            Some(START_US / 1000 + 60_000)
        ))
    );
    // Absent keys and keys of another type: nothing renewed, nothing
    // written.
    let string = "trt:a:{u}";
    s.h.set_raw(string, Stored::Str("5".into()));
    s.h.take_writes();
    assert_eq!(
        s.renew(&["trt:none:{u}", string], &[(1, 1, SECOND), (1, 1, SECOND)]),
        Ok(vec![0, 0])
    );
    assert_eq!(
        s.h.take_writes()
            .iter()
            .filter(|w| !matches!(w, Write::Zremrangebyscore { .. }))
            .count(),
        0
    );
    assert_eq!(s.h.stored(string), Some(Stored::Str("5".into())));
}

#[test]
fn bad_arguments_are_error_replies_and_write_nothing() {
    let s = Scripts::new(START_US);
    s.h.set_raw(KEY, zset(&[("1:1", START_US + SECOND)]));
    let k = [KEY];
    let release = |args: &[&str]| s.h.eval_on(&s.release, &k, args);
    for args in [
        &[][..],
        &["1"],
        &["1", "1", "1"],
        &["0", "1"],
        &["1", "0"],
        &["01", "1"],
        &["-1", "1"],
        &["18446744073709551616", "1"],
        &["1", "4294967296"],
        &["1", "1.5"],
        &["1e3", "1"],
    ] {
        assert_error_reply(release(args), "release: ", &format!("{args:?}"));
    }
    assert_error_reply(
        s.h.eval_on(&s.release, &[], &[]),
        "release: ",
        "no key",
    );
    let renew = |args: &[&str]| s.h.eval_on(&s.renew, &k, args);
    for args in [
        &[][..],
        &["1", "1"],
        &["0", "1", "1"],
        &["1", "0", "1"],
        &["1", "1", "0"],
        &["1", "1", "1125899906842625"],
        &["18446744073709551616", "1", "1"],
        &["1", "1", "01"],
    ] {
        assert_error_reply(renew(args), "renew: ", &format!("{args:?}"));
    }
    assert_eq!(s.h.take_writes(), []);
    assert_eq!(s.h.stored(KEY), Some(zset(&[("1:1", START_US + SECOND)])));
    // The largest id is one.
    assert_eq!(release(&["18446744073709551615", "1"]), Ok(vec![0]));
    // A lease ending past 2^53.
    let late = Scripts::new(MAX_TIME_US - 10);
    assert_error_reply(
        late.renew(&[KEY], &[(1, 1, 11)]),
        "renew: time values",
        "past 2^53",
    );
    assert_eq!(late.h.take_writes(), []);
    assert_eq!(late.renew(&[KEY], &[(1, 1, 10)]), Ok(vec![0]));
}

#[test]
fn the_scripts_define_no_function() {
    for (name, body) in [("release.lua", RELEASE), ("renew.lua", RENEW)] {
        let code: String = body
            .lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(!code.contains("function"), "{name} defines a function");
    }
}

// ---------------------------------------------------------------------------
// The property: acquisitions, releases and renewals against gcra-core.

#[derive(Debug, Clone)]
enum Op {
    /// The clock moves by this much (saturating at 0).
    Advance(i64),
    /// To a slot's expiry (the `pick`-th), `delta` µs off it.
    ToExpiry {
        pick: usize,
        delta: i64,
    },
    Acquire {
        id: u64,
        cost: u32,
    },
    Release {
        id: u64,
        cost: u32,
    },
    Renew {
        id: u64,
        cost: u32,
    },
}

#[derive(Debug, Clone)]
struct Case {
    limit: u32,
    lease_us: u64,
    start_us: u64,
    ops: Vec<Op>,
}

const IDS: [u64; 4] = [1, 2, 3, u64::MAX];

fn case_strategy() -> impl Strategy<Value = Case> {
    let lease = prop_oneof![
        3 => 1u64..=3_000,
        3 => 3_000u64..=10_000_000,
        1 => prop::sample::select(vec![1, 999, 1000, 1001, 30_000_000]),
    ];
    (1u32..=6, lease).prop_flat_map(|(limit, lease_us)| {
        let l = lease_us as i64;
        let id = prop::sample::select(IDS.to_vec());
        let cost = prop_oneof![4 => 1..=limit, 1 => Just(0u32), 1 => Just(limit + 1)];
        let op = prop_oneof![
            2 => prop_oneof![0..=l, 0..=l / 3, Just(l), 0..=3 * l, -l..=0]
                .prop_map(Op::Advance),
            1 => (any::<usize>(), prop::sample::select(vec![-1i64, 0, 1]))
                .prop_map(|(pick, delta)| Op::ToExpiry { pick, delta }),
            3 => (id.clone(), cost.clone())
                .prop_map(|(id, cost)| Op::Acquire { id, cost }),
            2 => (id.clone(), 1..=limit + 1)
                .prop_map(|(id, cost)| Op::Release { id, cost }),
            2 => (id, 1..=limit + 1).prop_map(|(id, cost)| Op::Renew { id, cost }),
        ];
        (
            Just(limit),
            Just(lease_us),
            prop_oneof![
                4 => START_US..=START_US + 1_000_000_000,
                1 => MAX_TIME_US - 100_000..=MAX_TIME_US,
            ],
            prop::collection::vec(op, 1..40),
        )
            .prop_map(|(limit, lease_us, start_us, ops)| Case {
                limit,
                lease_us,
                start_us,
                ops,
            })
    })
}

fn run_case(case: &Case) -> Result<(), TestCaseError> {
    let concurrency = Concurrency::new(case.limit).unwrap();
    let lease = Lease::new(Duration::from_micros(case.lease_us)).unwrap();
    let s = Scripts::new(case.start_us);
    let mut now = case.start_us;
    // gcra-core's model: each slot's expiry, by member.
    let mut model: BTreeMap<String, u64> = BTreeMap::new();
    for (n, op) in case.ops.iter().enumerate() {
        let ctx = format!("op {n} {op:?}, now {now}, model {model:?}");
        match *op {
            Op::Advance(by) => {
                now = now.saturating_add_signed(by).min(MAX_TIME_US);
            }
            Op::ToExpiry { pick, delta } => {
                if !model.is_empty() {
                    let at = *model.values().nth(pick % model.len()).unwrap();
                    now = at.saturating_add_signed(delta).min(MAX_TIME_US);
                }
            }
            Op::Acquire { id, cost } => {
                let expiries: Vec<u64> = model.values().copied().collect();
                let live = Lease::live(&expiries, now);
                let reply = s.acquire(case.limit, case.lease_us, id, cost);
                let expected = concurrency.acquire(live, cost).and_then(|d| {
                    let expiry = match d.write {
                        Some(_) => Some(lease.expiry(now)?),
                        None => None,
                    };
                    Ok((d, expiry))
                });
                match expected {
                    Ok((d, expiry)) => {
                        let reply = reply.map_err(|e| {
                            TestCaseError::fail(format!("{ctx}: {e:?}"))
                        })?;
                        prop_assert_eq!(
                            reply,
                            vec![
                                i64::from(d.allowed),
                                d.remaining as i64,
                                d.retry_after_us as i64,
                                0
                            ],
                            "{}",
                            &ctx
                        );
                        if !d.allowed {
                            prop_assert_eq!(d.retry_after_us, RETRY_HINT_US);
                        }
                        if let Some(expiry) = expiry {
                            model.retain(|_, e| Lease::live(&[*e], now) == 1);
                            for k in 1..=cost {
                                model.insert(format!("{id}:{k}"), expiry);
                            }
                        }
                    }
                    Err(_) => prop_assert!(
                        matches!(reply, Err(ScriptError::Reply(_))),
                        "{}: {:?}",
                        &ctx,
                        reply
                    ),
                }
            }
            Op::Release { id, cost } => {
                model.retain(|_, e| *e > now);
                let released = (1..=cost)
                    .filter(|k| model.remove(&format!("{id}:{k}")).is_some())
                    .count();
                let reply = s.release(&[KEY], &[(id, cost)]);
                prop_assert_eq!(reply, Ok(vec![released as i64]), "{}", &ctx);
            }
            Op::Renew { id, cost } => {
                let reply = s.renew(&[KEY], &[(id, cost, case.lease_us)]);
                match lease.expiry(now) {
                    Ok(expiry) => {
                        model.retain(|_, e| Lease::live(&[*e], now) == 1);
                        let mut renewed = 0;
                        for k in 1..=cost {
                            if let Some(e) = model.get_mut(&format!("{id}:{k}"))
                            {
                                *e = expiry;
                                renewed += 1;
                            }
                        }
                        prop_assert_eq!(reply, Ok(vec![renewed]), "{}", &ctx);
                    }
                    Err(_) => prop_assert!(
                        matches!(reply, Err(ScriptError::Reply(_))),
                        "{}: {:?}",
                        &ctx,
                        reply
                    ),
                }
            }
        }
        s.h.set_now(now);
        // Redis expires the key only once no slot in it is live.
        let held = s.slots(KEY);
        if held.is_empty() {
            prop_assert!(
                model.values().all(|&e| Lease::live(&[e], now) == 0),
                "{}: the key expired while a slot was live",
                &ctx
            );
            model.clear();
        }
        prop_assert_eq!(&held, &model, "{}", &ctx);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1024,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn slots_agree_with_gcra_core(case in case_strategy()) {
        run_case(&case)?;
    }
}
