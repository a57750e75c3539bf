//! `src/redis/gcra.lua` in an embedded Lua 5.1 (the version Redis runs), with
//! a stub of the `redis` library (`lua_support`): no server needed.
//!
//! The property test drives the script and `gcra_core::Quota::check` through
//! the same random sequences (clock jumps forwards and backwards, costs above
//! the burst, corrupted values) and requires the same answer and the same
//! write, field by field. Running it against a real Redis is a separate test.
#![allow(clippy::unwrap_used)]

mod lua_support;

use std::time::Duration;

use gcra_core::{MAX_TIME_US, Quota};
use lua_support::{
    Corrupt, GARBAGE, GCRA, Harness as Lua, START_US, ScriptError, Stored,
    Write, advance_strategy, corrupt_strategy, quota_strategy, tick,
};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

const KEY: &str = "trt:free:33d2315cbeb866b8b237240a98d605f2e6e41b8a";

type Reply = (i64, i64, i64, i64);

/// gcra.lua on one key.
struct Harness(Lua);

impl Harness {
    fn new(now_us: u64) -> Harness {
        Harness(Lua::new(GCRA, now_us))
    }

    fn with_script(body: &str, now_us: u64) -> Harness {
        Harness(Lua::new(body, now_us))
    }

    fn set_now(&self, now_us: u64) {
        self.0.set_now(now_us);
    }

    fn set_raw(&self, value: Stored) {
        self.0.set_raw(KEY, value);
    }

    fn stored(&self) -> Option<Stored> {
        self.0.stored(KEY)
    }

    fn take_writes(&self) -> Vec<Write> {
        self.0.take_writes()
    }

    /// The script's reply, which must be 4 integers.
    fn eval(&self, keys: &[&str], argv: &[&str]) -> Result<Reply, ScriptError> {
        match self.0.eval(keys, argv)?.as_slice() {
            &[a, b, c, d] => Ok((a, b, c, d)),
            other => Err(ScriptError::Crash(format!(
                "expected 4 values, got {other:?}"
            ))),
        }
    }

    /// The script with a quota's arguments, as the store sends them (the
    /// max debt only when it is not `tau`).
    fn check(&self, quota: &Quota, cost: u32) -> Result<Reply, ScriptError> {
        let t = quota.emission_interval_us().to_string();
        let tau = quota.burst_offset_us().to_string();
        let cost = cost.to_string();
        let debt = quota.max_debt_us().to_string();
        if quota.max_debt_us() == quota.burst_offset_us() {
            self.eval(&[KEY], &[&t, &tau, &cost])
        } else {
            self.eval(&[KEY], &[&t, &tau, &cost, &debt])
        }
    }
}

// ---------------------------------------------------------------------------
// Unit tests.

#[track_caller]
fn assert_error_reply(result: Result<Reply, ScriptError>, what: &str) {
    match result {
        Err(ScriptError::Reply(msg)) => {
            assert!(msg.starts_with("gcra: "), "{what}: error reply {msg:?}")
        }
        other => panic!("{what}: expected an error reply, got {other:?}"),
    }
}

#[test]
fn bad_arguments_are_error_replies_and_write_nothing() {
    let cases: &[(&str, &[&str])] = &[
        ("no ARGV", &[]),
        ("no cost", &["6000000", "60000000"]),
        ("no burst offset", &["6000000"]),
        ("zero interval", &["0", "60000000", "1"]),
        ("zero cost", &["6000000", "60000000", "0"]),
        ("zero burst offset", &["6000000", "0", "1"]),
        ("negative interval", &["-1", "60000000", "1"]),
        ("negative cost", &["6000000", "60000000", "-1"]),
        ("fractional interval", &["1.5", "60000000", "1"]),
        ("fractional cost", &["6000000", "60000000", "1.5"]),
        ("text", &["abc", "60000000", "1"]),
        ("text cost", &["6000000", "60000000", "abc"]),
        ("empty", &["", "60000000", "1"]),
        ("exponent", &["6e6", "60000000", "1"]),
        ("hex", &["0x10", "60000000", "1"]),
        ("leading space", &[" 6000000", "60000000", "1"]),
        ("leading zero", &["06000000", "60000000", "1"]),
        ("nan", &["nan", "60000000", "1"]),
        ("inf", &["6000000", "inf", "1"]),
        ("tau < T", &["6000000", "5999999", "1"]),
        (
            "T past 2^53",
            &["9007199254740994", "9007199254740994", "1"],
        ),
        // Would round to 2^53 as a double: refused, not guessed.
        (
            "T at 2^53 + 1",
            &["9007199254740993", "9007199254740993", "1"],
        ),
        ("tau past 2^53", &["1", "9007199254740994", "1"]),
        ("cost past 2^53", &["1", "60000000", "10000000000000000"]),
        ("cost 1e400", &["1", "60000000", "1e400"]),
        ("cost above the burst", &["6000000", "60000000", "11"]),
        (
            "cost at 2^53 + 1",
            &["1", "9007199254740992", "9007199254740993"],
        ),
        (
            "two extra arguments",
            &["6000000", "60000000", "1", "1", "1"],
        ),
        ("negative debt", &["6000000", "60000000", "1", "-1"]),
        ("fractional debt", &["6000000", "60000000", "1", "1.5"]),
        ("leading zero debt", &["6000000", "60000000", "1", "01"]),
        (
            "debt past 2^50",
            &["6000000", "60000000", "1", "1125899906842625"],
        ),
        ("empty debt", &["6000000", "60000000", "1", ""]),
        ("trailing space", &["6000000 ", "60000000", "1"]),
        ("inner space", &["6000000", "60000000 1", "1"]),
        ("plus sign", &["+6000000", "60000000", "1"]),
        ("decimal point", &["6000000.", "60000000", "1"]),
    ];
    for (what, argv) in cases {
        let h = Harness::new(START_US);
        h.set_raw(Stored::Str((START_US + 30_000_000).to_string()));
        assert_error_reply(h.eval(&[KEY], argv), what);
        assert_eq!(h.take_writes(), [], "{what}: wrote");
        assert_eq!(
            h.stored(),
            Some(Stored::Str((START_US + 30_000_000).to_string())),
            "{what}: changed the key"
        );
    }

    let h = Harness::new(START_US);
    assert_error_reply(h.eval(&[], &["6000000", "60000000", "1"]), "no key");
    assert_eq!(h.take_writes(), []);
}

#[test]
fn largest_arguments_are_accepted() {
    // 2^53 itself is exact: a valid (if absurd) burst offset.
    let h = Harness::new(START_US);
    let max = MAX_TIME_US.to_string();
    assert_eq!(
        h.eval(&[KEY], &["1", &max, "2"]),
        Ok((1, (MAX_TIME_US - 2) as i64, 0, 2))
    );
}

#[test]
fn increment_past_2_pow_53_is_an_error() {
    // tat = now = START_US; T * cost = 2^53 - now + 1 is one µs too far.
    let h = Harness::new(START_US);
    let t = (MAX_TIME_US - START_US + 1).to_string();
    let reply = h.eval(&[KEY], &[&t, &t, "1"]);
    assert_eq!(
        reply,
        Err(ScriptError::Reply(
            "gcra: time values exceed the exact range of Lua numbers".into()
        ))
    );
    assert_eq!(h.take_writes(), []);
    // gcra-core agrees: such a quota cannot even be built (its window is
    // far beyond MAX_WINDOW_US), so no decision is ever asked for.
    assert_eq!(
        Quota::new(1, Duration::from_micros(MAX_TIME_US - START_US + 1)),
        Err(gcra_core::QuotaError::OutOfRange)
    );

    // One µs less lands exactly on 2^53: allowed, and stored exactly.
    let t = (MAX_TIME_US - START_US).to_string();
    let reply = h.eval(&[KEY], &[&t, &t, "1"]).unwrap();
    assert_eq!(reply, (1, 0, 0, (MAX_TIME_US - START_US) as i64));
    let px = (MAX_TIME_US - START_US).div_ceil(1000);
    assert_eq!(h.take_writes(), [Write::set(KEY, MAX_TIME_US, px)]);

    // T * cost itself past 2^53, from the product.
    let h = Harness::new(START_US);
    assert_error_reply(
        h.eval(&[KEY], &["4503599627370496", "9007199254740992", "3"]),
        "T * cost = 1.5 * 2^53",
    );
    assert_eq!(h.take_writes(), []);
}

#[test]
fn the_posts_ten_per_minute_sequence() {
    let quota = Quota::per_minute(10);
    let h = Harness::new(START_US);
    for remaining in (0..10).rev() {
        let (allowed, rem, retry, _) = h.check(&quota, 1).unwrap();
        assert_eq!((allowed, rem, retry), (1, remaining, 0));
    }
    // The 11th waits one emission interval, and changes nothing.
    h.take_writes();
    assert_eq!(h.check(&quota, 1), Ok((0, 0, 6_000_000, 60_000_000)));
    assert_eq!(h.take_writes(), []);

    // At 6 s one fits; at 36 s, five more.
    h.set_now(START_US + 6_000_000);
    assert_eq!(h.check(&quota, 1), Ok((1, 0, 0, 60_000_000)));
    assert_eq!(h.check(&quota, 1), Ok((0, 0, 6_000_000, 60_000_000)));
    h.set_now(START_US + 36_000_000);
    for remaining in (0..5).rev() {
        let (allowed, rem, _, _) = h.check(&quota, 1).unwrap();
        assert_eq!((allowed, rem), (1, remaining));
    }
    assert_eq!(h.check(&quota, 1), Ok((0, 0, 6_000_000, 60_000_000)));
    // The key lives exactly until the bucket is full: the 0.3 example's PTTL 59841
    // was this 60000 ms, read a little later.
    let writes = h.take_writes();
    assert_eq!(
        writes.last(),
        Some(&Write::Set {
            key: KEY.into(),
            value: (START_US + 96_000_000).to_string(),
            px: 60_000,
        })
    );
}

#[test]
fn stored_tat_is_an_integer_string_near_1_79e15() {
    // A TAT that is not a multiple of anything round, far above 1e15.
    let now = START_US + 123_457;
    let h = Harness::new(now);
    let quota = Quota::new(7, Duration::from_micros(1_000_003)).unwrap();
    let (allowed, ..) = h.check(&quota, 3).unwrap();
    assert_eq!(allowed, 1);
    let expected = quota.check(None, now, 3).unwrap().store.unwrap();
    let writes = h.take_writes();
    assert_eq!(
        writes,
        [Write::Set {
            key: KEY.into(),
            value: expected.tat_us.to_string(),
            px: expected.ttl_ms,
        }]
    );
    // T = ceil(1_000_003 / 7) = 142_858 µs, three of them after now.
    assert!(
        matches!(&writes[0], Write::Set { value, .. } if value == "1790947155552031")
    );

    // It reads back as the same TAT.
    let (allowed, remaining, ..) = h.check(&quota, 1).unwrap();
    let d = quota.check(Some(expected.tat_us), now, 1).unwrap();
    assert_eq!((allowed, remaining as u64), (1, d.remaining));
}

#[test]
fn corrupted_values_start_fresh() {
    let quota = Quota::per_minute(10);
    let fresh = Ok((1, 9, 0, 6_000_000));
    for garbage in [
        "abc",
        "",
        "1.5",
        "nan",
        "-nan",
        "inf",
        "-inf",
        "1e400",
        "-1",
        // Numbers, but not what the script writes: not a TAT.
        "1.8e15",
        " 1790947155000001",
        "0x65CE3A6FE1C40",
        "+1790947155000001",
        "9007199254740993",
        "18446744073709551615",
    ]
    .into_iter()
    .chain(GARBAGE.iter().copied())
    {
        let h = Harness::new(START_US);
        h.set_raw(Stored::Str(garbage.into()));
        assert_eq!(h.check(&quota, 1), fresh, "{garbage:?}");
    }
    let h = Harness::new(START_US);
    h.set_raw(Stored::WrongType);
    assert_eq!(h.check(&quota, 1), fresh, "wrong type");
    // SET replaces a key of any type.
    assert_eq!(
        h.stored(),
        Some(Stored::Str((START_US + 6_000_000).to_string()))
    );
}

#[test]
fn clock_going_backwards_caps_and_stores_even_when_refused() {
    // The doc example of Quota::check, through the script (its default
    // debt, ARGV[4] absent): capped at the ceiling, a burst window and an
    // hour ahead.
    let quota = Quota::per_second(1);
    let h = Harness::new(START_US);
    h.set_raw(Stored::Str((START_US + 7_200_000_000).to_string()));
    assert_eq!(h.check(&quota, 1), Ok((0, 0, 3_601_000_000, 3_601_000_000)));
    assert_eq!(
        h.take_writes(),
        [Write::Set {
            key: KEY.into(),
            value: (START_US + 3_601_000_000).to_string(),
            px: 3_601_000,
        }]
    );
}

#[test]
fn harness_catches_global_leaks_and_undefined_globals() {
    let h = Harness::with_script("counter = 1\nreturn {1, 0, 0, 0}", START_US);
    match h.eval(&[KEY], &[]) {
        Err(ScriptError::Crash(msg)) => {
            assert!(msg.contains("create global variable 'counter'"), "{msg}")
        }
        other => panic!("a global leak ran: {other:?}"),
    }
    let h = Harness::with_script("return {undefined_name, 0, 0, 0}", START_US);
    match h.eval(&[KEY], &[]) {
        Err(ScriptError::Crash(msg)) => {
            assert!(msg.contains("nonexistent global variable"), "{msg}")
        }
        other => panic!("an undefined global was read: {other:?}"),
    }
    // Neither io nor os exist for a script.
    let h = Harness::with_script("return {os.time(), 0, 0, 0}", START_US);
    assert!(matches!(h.eval(&[KEY], &[]), Err(ScriptError::Crash(_))));
    // Locals are fine.
    let h = Harness::with_script("local x = 1\nreturn {x, 0, 0, 0}", START_US);
    assert_eq!(h.eval(&[KEY], &[]), Ok((1, 0, 0, 0)));
}

#[test]
fn harness_get_follows_redis() {
    // call raises on WRONGTYPE; pcall returns the error table; a missing key
    // is false, not nil.
    let probe = r#"
        local missing = redis.call("GET", "missing")
        local ok, raised = pcall(redis.call, "GET", KEYS[1])
        local reply = redis.pcall("GET", KEYS[1])
        return {
          missing == false and 1 or 0,
          (not ok) and 1 or 0,
          type(reply) == "table" and string.find(reply.err, "^WRONGTYPE") and 1 or 0,
          tostring(raised):find("WRONGTYPE") and 1 or 0,
        }
    "#;
    let h = Harness::with_script(probe, START_US);
    h.set_raw(Stored::WrongType);
    assert_eq!(h.eval(&[KEY], &[]), Ok((1, 1, 1, 1)));

    // A Lua number sent to SET is refused (Redis's formatting varies).
    let h = Harness::with_script(
        r#"redis.call("SET", KEYS[1], 1790947155000000, "PX", "1") return {1, 0, 0, 0}"#,
        START_US,
    );
    assert!(matches!(h.eval(&[KEY], &[]), Err(ScriptError::Crash(_))));

    // Keys expire once the ms clock is past the expiry, not at it.
    let h = Harness::new(START_US + 999);
    h.check(&Quota::new(1, Duration::from_micros(1_000)).unwrap(), 1)
        .unwrap();
    assert_eq!(
        h.take_writes(),
        [Write::Set {
            key: KEY.into(),
            value: (START_US + 1_999).to_string(),
            px: 1,
        }]
    );
    h.set_now(START_US + 1_999);
    assert!(h.stored().is_some());
    h.set_now(START_US + 2_000);
    assert_eq!(h.stored(), None);
}

// ---------------------------------------------------------------------------
// The property: the script and gcra-core agree on every step.

#[derive(Debug, Clone)]
struct Step {
    advance_us: i64,
    corrupt: Option<Corrupt>,
    cost: u32,
}

#[derive(Debug, Clone)]
struct Case {
    quota: Quota,
    start_us: u64,
    steps: Vec<Step>,
}

fn step_strategy(quota: Quota) -> impl Strategy<Value = Step> {
    let burst = quota.burst();
    let cost = prop_oneof![
        8 => 1..=burst,
        2 => Just(1u32),
        1 => Just(burst),
        1 => burst.saturating_add(1)..=burst.saturating_mul(2).saturating_add(1),
    ];
    (advance_strategy(quota), corrupt_strategy(quota), cost).prop_map(
        |(advance_us, corrupt, cost)| Step {
            advance_us,
            corrupt,
            cost,
        },
    )
}

fn case_strategy() -> impl Strategy<Value = Case> {
    quota_strategy().prop_flat_map(|quota| {
        (
            Just(quota),
            START_US..=START_US + 1_000_000_000_000,
            prop::collection::vec(step_strategy(quota), 1..40),
        )
            .prop_map(|(quota, start_us, steps)| Case {
                quota,
                start_us,
                steps,
            })
    })
}

/// Runs one case; `Err` describes the first disagreement.
fn run_case(case: &Case) -> Result<(), TestCaseError> {
    let quota = case.quota;
    let h = Harness::new(case.start_us);
    let keys = [KEY.to_owned()];
    let mut now = case.start_us;
    // What gcra-core is handed: the last TAT written, until Redis expires it.
    let mut model = [None];

    for (i, step) in case.steps.iter().enumerate() {
        now = now.saturating_add_signed(step.advance_us).max(1);
        tick(&h.0, &keys, &mut model, now)?;
        if let Some(corrupt) = &step.corrupt {
            model[0] = corrupt.apply(&h.0, KEY, now);
        }
        h.take_writes();
        let ctx =
            format!("step {i}: now {now}, stored {:?}, {step:?}", model[0]);

        let reply = h.check(&quota, step.cost);
        let writes = h.take_writes();
        match quota.check(model[0], now, step.cost) {
            Ok(d) => {
                let reply = reply.map_err(|e| {
                    TestCaseError::fail(format!("{ctx}: {e:?}"))
                })?;
                let expected = (
                    i64::from(d.allowed),
                    d.remaining as i64,
                    d.retry_after_us as i64,
                    d.reset_after_us as i64,
                );
                prop_assert_eq!(reply, expected, "{}", ctx);
                match d.store {
                    Some(s) => {
                        prop_assert_eq!(
                            &writes,
                            &[Write::set(KEY, s.tat_us, s.ttl_ms)],
                            "{}",
                            ctx
                        );
                        model[0] = Some(s.tat_us);
                    }
                    None => prop_assert_eq!(&writes, &[], "{}", ctx),
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
    fn script_agrees_with_gcra_core(case in case_strategy()) {
        run_case(&case)?;
    }
}
