//! `src/redis/gcra.lua` in an embedded Lua 5.1 (the version Redis runs), with
//! a stub of the `redis` library: no server needed.
//!
//! The property test drives the script and `gcra_core::Quota::check` through
//! the same random sequences (clock jumps forwards and backwards, costs above
//! the burst, corrupted values) and requires the same answer and the same
//! write, field by field. Running it against a real Redis is a separate test.
#![allow(clippy::unwrap_used)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use gcra_core::{MAX_TIME_US, Quota};
use mlua::{Function, Lua, LuaOptions, StdLib, Table, Value, Variadic};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

const SCRIPT: &str = include_str!("../src/redis/gcra.lua");

/// A realistic Redis `TIME`, in µs: 2026-10-02.
const START_US: u64 = 1_790_947_155_000_000;

const KEY: &str = "trt:free:33d2315cbeb866b8b237240a98d605f2e6e41b8a";

// ---------------------------------------------------------------------------
// A fake Redis: the commands the script uses, with Redis's Lua conversions.

#[derive(Debug, Clone, PartialEq)]
enum Stored {
    Str(String),
    /// A key of another type (a list, say): `GET` fails with WRONGTYPE.
    WrongType,
}

#[derive(Debug)]
struct Entry {
    value: Stored,
    /// Absolute expiry in ms, as Redis keeps it.
    expire_at_ms: Option<u64>,
}

/// One `SET key value PX ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Write {
    key: String,
    value: String,
    px: u64,
}

#[derive(Debug, Default)]
struct FakeRedis {
    now_us: u64,
    keys: HashMap<String, Entry>,
    writes: Vec<Write>,
}

impl FakeRedis {
    /// Redis's `keyIsExpired`: expired once the ms clock is *past* the expiry.
    fn expire(&mut self) {
        let now_ms = self.now_us / 1000;
        self.keys
            .retain(|_, e| e.expire_at_ms.is_none_or(|at| now_ms <= at));
    }

    fn set_raw(&mut self, key: &str, value: Stored) {
        self.keys.insert(
            key.to_owned(),
            Entry {
                value,
                expire_at_ms: None,
            },
        );
    }

    fn get_raw(&mut self, key: &str) -> Option<Stored> {
        self.expire();
        self.keys.get(key).map(|e| e.value.clone())
    }
}

fn is_canonical_uint(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'))
}

/// Runs one command. `Err` is a Redis error reply (`call` raises it, `pcall`
/// returns it as `{err = ...}`).
fn command(
    lua: &Lua,
    redis: &RefCell<FakeRedis>,
    args: &[Value],
) -> Result<Value, String> {
    let mut words = Vec::with_capacity(args.len());
    for arg in args {
        match arg {
            Value::String(s) => {
                words.push(s.to_str().map_err(|e| e.to_string())?.to_owned())
            }
            // Redis accepts numbers, but formats them its own way (%.17g, or
            // fpconv in newer versions): the script must send strings.
            Value::Integer(_) | Value::Number(_) => {
                return Err(format!(
                    "harness: pass numbers to redis.call as strings, got {arg:?}"
                ));
            }
            _ => {
                return Err(
                    "ERR Lua redis lib command arguments must be strings or integers".into(),
                );
            }
        }
    }
    let Some(name) = words.first() else {
        return Err(
            "ERR Please specify at least one argument for this redis lib call"
                .into(),
        );
    };
    let mut redis = redis.borrow_mut();
    redis.expire();
    let lua_err = |e: mlua::Error| e.to_string();
    match (name.to_ascii_uppercase().as_str(), &words[1..]) {
        ("TIME", []) => {
            let t = lua.create_table().map_err(lua_err)?;
            t.raw_set(1, (redis.now_us / 1_000_000).to_string())
                .map_err(lua_err)?;
            t.raw_set(2, (redis.now_us % 1_000_000).to_string())
                .map_err(lua_err)?;
            Ok(Value::Table(t))
        }
        ("GET", [key]) => match redis.keys.get(key) {
            // A nil bulk reply becomes `false` in Redis's Lua.
            None => Ok(Value::Boolean(false)),
            Some(Entry {
                value: Stored::Str(s),
                ..
            }) => Ok(Value::String(lua.create_string(s).map_err(lua_err)?)),
            Some(Entry {
                value: Stored::WrongType,
                ..
            }) => Err("WRONGTYPE Operation against a key holding the wrong kind of value".into()),
        },
        ("SET", [key, value, px_word, px]) if px_word.eq_ignore_ascii_case("PX") => {
            // Stricter than Redis, which would accept " 5" or a Lua number:
            // both the value and the expiry must be canonical integers.
            if !is_canonical_uint(px) || !is_canonical_uint(value) {
                return Err(format!(
                    "harness: SET {value:?} PX {px:?}: not integer strings"
                ));
            }
            let px: u64 = px
                .parse()
                .map_err(|_| "ERR value is not an integer or out of range")?;
            if px == 0 {
                return Err("ERR invalid expire time in 'set' command".into());
            }
            let expire_at_ms = redis.now_us / 1000 + px;
            redis.keys.insert(
                key.clone(),
                Entry {
                    value: Stored::Str(value.clone()),
                    expire_at_ms: Some(expire_at_ms),
                },
            );
            redis.writes.push(Write {
                key: key.clone(),
                value: value.clone(),
                px,
            });
            let ok = lua.create_table().map_err(lua_err)?;
            ok.raw_set("ok", "OK").map_err(lua_err)?;
            Ok(Value::Table(ok))
        }
        _ => Err(format!("harness: unsupported command {words:?}")),
    }
}

// ---------------------------------------------------------------------------
// The harness: the script compiled and run the way Redis does.

/// What a script run produced, besides a decision.
#[derive(Debug, PartialEq)]
enum ScriptError {
    /// An error reply (`redis.error_reply`): what bad input must give.
    Reply(String),
    /// The script crashed (a Lua runtime error), or returned something that
    /// is neither a decision nor an error reply.
    Crash(String),
}

type Reply = (i64, i64, i64, i64);

struct Harness {
    lua: Lua,
    script: Function,
    redis: Rc<RefCell<FakeRedis>>,
}

impl Harness {
    fn new(now_us: u64) -> Harness {
        Harness::with_script(SCRIPT, now_us)
    }

    fn with_script(body: &str, now_us: u64) -> Harness {
        // Redis loads base, table, string and math (plus cjson, struct,
        // cmsgpack, bit, and os.clock alone since 7): no io, no os.time.
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::default(),
        )
        .unwrap();
        let redis = Rc::new(RefCell::new(FakeRedis {
            now_us,
            ..FakeRedis::default()
        }));

        let lib = lua.create_table().unwrap();
        for (name, protected) in [("call", false), ("pcall", true)] {
            let state = Rc::clone(&redis);
            let f =
                lua.create_function(move |lua, args: Variadic<Value>| {
                    match command(lua, &state, &args) {
                        Ok(v) => Ok(v),
                        Err(msg) if protected => {
                            let t = lua.create_table()?;
                            t.raw_set("err", msg)?;
                            Ok(Value::Table(t))
                        }
                        Err(msg) => Err(mlua::Error::RuntimeError(msg)),
                    }
                })
                .unwrap();
            lib.raw_set(name, f).unwrap();
        }
        let error_reply = lua
            .create_function(|lua, msg: mlua::String| {
                let t = lua.create_table()?;
                t.raw_set("err", msg)?;
                Ok(t)
            })
            .unwrap();
        lib.raw_set("error_reply", error_reply).unwrap();
        // Deprecated and a no-op since Redis 7, but still there.
        let replicate = lua.create_function(|_, ()| Ok(true)).unwrap();
        lib.raw_set("replicate_commands", replicate).unwrap();
        let globals = lua.globals();
        globals.raw_set("redis", lib).unwrap();
        globals
            .raw_set("KEYS", lua.create_table().unwrap())
            .unwrap();
        globals
            .raw_set("ARGV", lua.create_table().unwrap())
            .unwrap();
        for unsafe_fn in ["dofile", "loadfile"] {
            globals.raw_set(unsafe_fn, Value::Nil).unwrap();
        }

        // Redis compiles the body as `function f_<sha>() <body> end`: a
        // top-level `return` returns the reply, and a `local` is the
        // function's.
        let script: Function = lua
            .load(format!("return function() {body}\nend"))
            .set_name("@gcra.lua")
            .call(())
            .unwrap();

        // Redis's globals protection: a script may neither create a global
        // nor read an undefined one.
        lua.load(
            r#"
            setmetatable(_G, {
              __newindex = function(_, name)
                error("Script attempted to create global variable '" .. tostring(name) .. "'", 2)
              end,
              __index = function(_, name)
                error("Script attempted to access nonexistent global variable '" .. tostring(name) .. "'", 2)
              end,
            })
            "#,
        )
        .exec()
        .unwrap();

        Harness { lua, script, redis }
    }

    fn set_now(&self, now_us: u64) {
        self.redis.borrow_mut().now_us = now_us;
    }

    fn set_raw(&self, value: Stored) {
        self.redis.borrow_mut().set_raw(KEY, value);
    }

    fn stored(&self) -> Option<Stored> {
        self.redis.borrow_mut().get_raw(KEY)
    }

    fn take_writes(&self) -> Vec<Write> {
        std::mem::take(&mut self.redis.borrow_mut().writes)
    }

    fn eval(&self, keys: &[&str], argv: &[&str]) -> Result<Reply, ScriptError> {
        let strings = |items: &[&str]| -> Table {
            let t = self.lua.create_table().unwrap();
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, *item).unwrap();
            }
            t
        };
        let globals = self.lua.globals();
        globals.raw_set("KEYS", strings(keys)).unwrap();
        globals.raw_set("ARGV", strings(argv)).unwrap();

        let value: Value = self
            .script
            .call(())
            .map_err(|e| ScriptError::Crash(e.to_string()))?;
        let Value::Table(t) = value else {
            return Err(ScriptError::Crash(format!("not a table: {value:?}")));
        };
        if let Value::String(err) = t.raw_get::<Value>("err").unwrap() {
            return Err(ScriptError::Reply(err.to_str().unwrap().to_owned()));
        }
        if t.raw_len() != 4 {
            return Err(ScriptError::Crash(format!(
                "expected 4 values, got {}",
                t.raw_len()
            )));
        }
        let mut out = [0i64; 4];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = match t.raw_get::<Value>(i + 1).unwrap() {
                Value::Integer(n) => n,
                // Redis truncates a Lua number to an integer reply; the
                // script must not depend on that.
                Value::Number(n) if n.fract() == 0.0 && n.abs() < 9.3e18 => {
                    n as i64
                }
                other => {
                    return Err(ScriptError::Crash(format!(
                        "not an integer: {other:?}"
                    )));
                }
            };
        }
        Ok((out[0], out[1], out[2], out[3]))
    }

    /// The script with a quota's arguments.
    fn check(&self, quota: &Quota, cost: u32) -> Result<Reply, ScriptError> {
        let t = quota.emission_interval_us().to_string();
        let tau = quota.burst_offset_us().to_string();
        let cost = cost.to_string();
        self.eval(&[KEY], &[&t, &tau, &cost])
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
    let writes = h.take_writes();
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].value, MAX_TIME_US.to_string());

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
    // The key lives exactly until the bucket is full: the post's PTTL 59841
    // was this 60000 ms, read a little later.
    let writes = h.take_writes();
    assert_eq!(
        writes.last(),
        Some(&Write {
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
        [Write {
            key: KEY.into(),
            value: expected.tat_us.to_string(),
            px: expected.ttl_ms,
        }]
    );
    // T = ceil(1_000_003 / 7) = 142_858 µs, three of them after now.
    assert_eq!(writes[0].value, "1790947155552031");

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
    ] {
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
    // The doc example of Quota::check, through the script: capped at the
    // ceiling, two burst windows ahead.
    let quota = Quota::per_second(1);
    let h = Harness::new(START_US);
    h.set_raw(Stored::Str((START_US + 100_000_000).to_string()));
    assert_eq!(h.check(&quota, 1), Ok((0, 0, 2_000_000, 2_000_000)));
    assert_eq!(
        h.take_writes(),
        [Write {
            key: KEY.into(),
            value: (START_US + 2_000_000).to_string(),
            px: 2000,
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
        [Write {
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
enum Corrupt {
    /// Not a TAT at all: gcra-core sees no value.
    Garbage(&'static str),
    /// A key of another type: gcra-core sees no value.
    WrongType,
    /// An integer string `now + offset` (offsets that cross the horizon
    /// model clocks that went backwards).
    Relative(i64),
    /// An integer string, near or above 2^53.
    Absolute(u64),
}

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

fn quota_strategy() -> impl Strategy<Value = Quota> {
    let period_us = prop_oneof![
        1_000u64..=10_000,
        10_000u64..=1_000_000,
        1_000_000u64..=3_600_000_000,
        3_600_000_000u64..=86_400_000_000,
        prop::sample::select(vec![
            1_000u64,
            1_000_000,
            60_000_000,
            3_600_000_000,
            86_400_000_000
        ]),
    ];
    let burst = prop_oneof![2 => Just(None), 1 => (1u32..=100).prop_map(Some)];
    (1u32..=50, period_us, burst).prop_filter_map(
        "invalid quota",
        |(limit, period, burst)| {
            let quota =
                Quota::new(limit, Duration::from_micros(period)).ok()?;
            match burst {
                Some(b) => quota.try_allow_burst(b).ok(),
                None => Some(quota),
            }
        },
    )
}

fn step_strategy(quota: Quota) -> impl Strategy<Value = Step> {
    let t = quota.emission_interval_us() as i64;
    let tau = quota.burst_offset_us() as i64;
    let period = quota.period().as_micros() as i64;
    let burst = quota.burst();
    let advance = prop_oneof![
        4 => Just(0i64),
        4 => 0..=2 * t,
        3 => 0..=2 * tau,
        1 => 0..=3 * period,
        1 => -2 * tau..=0,
        1 => -20 * tau..=0,
        1 => 0..=999i64,
    ];
    let cost = prop_oneof![
        8 => 1..=burst,
        2 => Just(1u32),
        1 => Just(burst),
        1 => burst + 1..=2 * burst + 1,
    ];
    let corrupt = prop_oneof![
        5 => prop::sample::select(vec![
            "abc", "", "1.5", "nan", "-nan", "inf", "-inf", "1e400", "-1", "2e15",
            " 1790947155000000", "0x10", "+1790947155000000", "1790947155000000.5",
        ])
        .prop_map(Corrupt::Garbage),
        2 => Just(Corrupt::WrongType),
        5 => (-3 * tau..=3 * tau).prop_map(Corrupt::Relative),
        2 => prop::sample::select(vec![
            0u64,
            MAX_TIME_US - 1,
            MAX_TIME_US,
            MAX_TIME_US + 1,
            MAX_TIME_US + 2,
            u64::MAX,
        ])
        .prop_map(Corrupt::Absolute),
    ];
    let corrupt = prop_oneof![12 => Just(None), 1 => corrupt.prop_map(Some)];
    (advance, corrupt, cost).prop_map(|(advance_us, corrupt, cost)| Step {
        advance_us,
        corrupt,
        cost,
    })
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
    let mut now = case.start_us;
    // What gcra-core is handed: the last TAT written, until Redis expires it.
    let mut model: Option<u64> = None;

    for (i, step) in case.steps.iter().enumerate() {
        now = now.saturating_add_signed(step.advance_us).max(1);
        h.set_now(now);
        if h.stored().is_none()
            && let Some(tat) = model
        {
            // Redis expired the key. It must not have while the TAT was still
            // ahead (the PX was long enough); from now on it is gone, even if
            // the clock goes back.
            prop_assert!(
                tat < now,
                "step {}: key expired at {} before its TAT {}",
                i,
                now,
                tat
            );
            model = None;
        }
        match &step.corrupt {
            None => {}
            Some(Corrupt::Garbage(s)) => {
                h.set_raw(Stored::Str((*s).to_owned()));
                model = None;
            }
            Some(Corrupt::WrongType) => {
                h.set_raw(Stored::WrongType);
                model = None;
            }
            Some(Corrupt::Relative(offset)) => {
                let v = now.saturating_add_signed(*offset);
                h.set_raw(Stored::Str(v.to_string()));
                model = Some(v);
            }
            Some(Corrupt::Absolute(v)) => {
                h.set_raw(Stored::Str(v.to_string()));
                model = Some(*v);
            }
        }
        h.take_writes();
        let ctx = format!("step {i}: now {now}, stored {model:?}, {step:?}");

        let reply = h.check(&quota, step.cost);
        let writes = h.take_writes();
        match quota.check(model, now, step.cost) {
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
                            &[Write {
                                key: KEY.into(),
                                value: s.tat_us.to_string(),
                                px: s.ttl_ms,
                            }],
                            "{}",
                            ctx
                        );
                        prop_assert_eq!(
                            writes[0].value.parse::<u64>().ok(),
                            Some(s.tat_us)
                        );
                        model = Some(s.tat_us);
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
