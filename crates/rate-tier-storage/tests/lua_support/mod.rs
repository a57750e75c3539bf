//! The Lua scripts of `src/redis/` in an embedded Lua 5.1 (the version Redis
//! runs), with a stub of the `redis` library: no server needed. Shared by
//! `lua_script.rs` (gcra.lua) and `lua_all.rs` (gcra_all.lua, gcra_settle.lua),
//! and `lua_mixed.rs` (decide_mixed.lua, which adds lists: `LRANGE 0 -1`,
//! `RPUSH`, `LTRIM`, `PEXPIRE`, and `SET` of a period's `start:count`; and
//! sorted sets for concurrency limits: `ZCOUNT`, `ZREMRANGEBYSCORE`, `ZADD
//! [XX]`, `ZRANGE -1 -1 WITHSCORES`, `ZSCORE`, `ZREM`), with `lua_slots.rs`
//! (release.lua, renew.lua), and `lua_reserve.rs` (reserve.lua, cancel.lua).
//!
//! The stub is as strict as Redis or stricter: the commands the scripts use
//! (`TIME`, `GET`, `MGET`, `SET .. PX`, `DEL`) with Redis's replies and
//! conversions, lazy expiry on Redis's millisecond clock, Redis's globals
//! protection, and every write recorded so that a test can require exactly
//! the writes gcra-core asks for.
#![allow(dead_code, clippy::unwrap_used)]

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::time::Duration;

use gcra_core::{MAX_TIME_US, Quota};
use mlua::{Function, Lua, LuaOptions, StdLib, Table, Value, Variadic};
use proptest::prelude::*;

pub(crate) const GCRA: &str = include_str!("../../src/redis/gcra.lua");
pub(crate) const GCRA_ALL: &str = include_str!("../../src/redis/gcra_all.lua");
pub(crate) const GCRA_SETTLE: &str =
    include_str!("../../src/redis/gcra_settle.lua");
pub(crate) const DECIDE_MIXED: &str =
    include_str!("../../src/redis/decide_mixed.lua");
pub(crate) const RELEASE: &str = include_str!("../../src/redis/release.lua");
pub(crate) const RENEW: &str = include_str!("../../src/redis/renew.lua");
pub(crate) const RESERVE: &str = include_str!("../../src/redis/reserve.lua");
pub(crate) const CANCEL: &str = include_str!("../../src/redis/cancel.lua");

/// A realistic Redis `TIME`, in µs: 2026-10-02.
pub(crate) const START_US: u64 = 1_790_947_155_000_000;

// ---------------------------------------------------------------------------
// A fake Redis: the commands the scripts use, with Redis's Lua conversions.

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Stored {
    Str(String),
    /// A key of another type (a list, say): `GET` fails with WRONGTYPE,
    /// `MGET` answers nil.
    WrongType,
    /// A list, as `RPUSH` builds it: `GET` fails with WRONGTYPE, `MGET`
    /// answers nil. (Never empty: Redis deletes a list that becomes empty.)
    /// [`Stored::WrongType`] stays a key of a third type for the list
    /// commands: they fail on it with WRONGTYPE, as on a string.
    List(Vec<String>),
    /// A sorted set: member to score (a double, as Redis keeps it). Never
    /// empty: Redis deletes a sorted set that becomes empty. The list
    /// commands fail on it with WRONGTYPE, and the sorted set commands on
    /// every other type.
    ZSet(BTreeMap<String, f64>),
}

#[derive(Debug)]
struct Entry {
    value: Stored,
    /// Absolute expiry in ms, as Redis keeps it.
    expire_at_ms: Option<u64>,
}

/// One write a script made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Write {
    /// `SET key value PX px`.
    Set { key: String, value: String, px: u64 },
    /// `DEL key`.
    Del { key: String },
    /// `RPUSH key values..`.
    Rpush { key: String, values: Vec<String> },
    /// `LTRIM key start stop`.
    Ltrim { key: String, start: i64, stop: i64 },
    /// `PEXPIRE key ms`.
    Pexpire { key: String, ms: u64 },
    /// `ZADD key [XX] score member ..`, the pairs as sent.
    Zadd {
        key: String,
        xx: bool,
        pairs: Vec<(String, String)>,
    },
    /// `ZREM key member ..`.
    Zrem { key: String, members: Vec<String> },
    /// `ZREMRANGEBYSCORE key min max`.
    Zremrangebyscore {
        key: String,
        min: String,
        max: String,
    },
}

impl Write {
    pub(crate) fn set(key: &str, value: u64, px: u64) -> Write {
        Write::Set {
            key: key.to_owned(),
            value: value.to_string(),
            px,
        }
    }

    pub(crate) fn del(key: &str) -> Write {
        Write::Del {
            key: key.to_owned(),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct FakeRedis {
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
}

fn is_canonical_uint(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'))
}

const WRONGTYPE: &str =
    "WRONGTYPE Operation against a key holding the wrong kind of value";

/// `start:count`, two canonical integers: a period's record as
/// decide_mixed.lua writes it.
fn is_period_record(s: &str) -> bool {
    s.split_once(':')
        .is_some_and(|(a, b)| is_canonical_uint(a) && is_canonical_uint(b))
}

/// A Redis status reply as Lua sees it: `{ok = "OK"}`.
fn ok(lua: &Lua) -> mlua::Result<Value> {
    let ok = lua.create_table()?;
    ok.raw_set("ok", "OK")?;
    Ok(Value::Table(ok))
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
            // fpconv since 7.2, which writes 1e+08): the scripts send strings.
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
                value: Stored::WrongType | Stored::List(_) | Stored::ZSet(_),
                ..
            }) => Err("WRONGTYPE Operation against a key holding the wrong kind of value".into()),
        },
        ("MGET", keys) if !keys.is_empty() => {
            let t = lua.create_table().map_err(lua_err)?;
            for (i, key) in keys.iter().enumerate() {
                let value = match redis.keys.get(key) {
                    Some(Entry {
                        value: Stored::Str(s),
                        ..
                    }) => Value::String(lua.create_string(s).map_err(lua_err)?),
                    // Missing, or not a string: nil, false in Lua.
                    _ => Value::Boolean(false),
                };
                t.raw_set(i + 1, value).map_err(lua_err)?;
            }
            Ok(Value::Table(t))
        }
        ("MGET", []) => Err("ERR wrong number of arguments for 'mget' command".into()),
        // A period's record: SET of `start:count`, as strict as the SET below.
        ("SET", [key, value, px_word, px])
            if px_word.eq_ignore_ascii_case("PX") && is_period_record(value) =>
        {
            if !is_canonical_uint(px) {
                return Err(format!("harness: SET {value:?} PX {px:?}: not an integer string"));
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
            redis.writes.push(Write::Set {
                key: key.clone(),
                value: value.clone(),
                px,
            });
            ok(lua).map_err(lua_err)
        }
        ("LRANGE", [key, start, stop]) if start == "0" && stop == "-1" => {
            let t = lua.create_table().map_err(lua_err)?;
            match redis.keys.get(key) {
                None => {}
                Some(Entry {
                    value: Stored::List(items),
                    ..
                }) => {
                    for (i, item) in items.iter().enumerate() {
                        t.raw_set(i + 1, item.as_str()).map_err(lua_err)?;
                    }
                }
                Some(_) => return Err(WRONGTYPE.into()),
            }
            Ok(Value::Table(t))
        }
        ("RPUSH", [key, values @ ..]) if !values.is_empty() => {
            // Stricter than Redis: the scripts push integer strings.
            if let Some(v) = values.iter().find(|v| !is_canonical_uint(v)) {
                return Err(format!("harness: RPUSH {v:?}: not an integer string"));
            }
            let len = match redis.keys.get_mut(key) {
                None => {
                    redis.keys.insert(
                        key.clone(),
                        Entry {
                            value: Stored::List(values.to_vec()),
                            expire_at_ms: None,
                        },
                    );
                    values.len()
                }
                Some(Entry {
                    value: Stored::List(items),
                    ..
                }) => {
                    items.extend(values.iter().cloned());
                    items.len()
                }
                Some(_) => return Err(WRONGTYPE.into()),
            };
            redis.writes.push(Write::Rpush {
                key: key.clone(),
                values: values.to_vec(),
            });
            Ok(Value::Integer(i64::try_from(len).unwrap()))
        }
        ("LTRIM", [key, start, stop]) => {
            let (Ok(start), Ok(stop)) = (start.parse::<i64>(), stop.parse::<i64>())
            else {
                return Err("ERR value is not an integer or out of range".into());
            };
            let emptied = match redis.keys.get_mut(key) {
                None => false,
                Some(Entry {
                    value: Stored::List(items),
                    ..
                }) => {
                    // Redis's ltrimCommand.
                    let len = i64::try_from(items.len()).unwrap();
                    let from = if start < 0 { len + start } else { start }.max(0);
                    let to = if stop < 0 { len + stop } else { stop };
                    if from > to || from >= len {
                        items.clear();
                    } else {
                        let to = to.min(len - 1);
                        items.truncate(usize::try_from(to + 1).unwrap());
                        items.drain(..usize::try_from(from).unwrap());
                    }
                    items.is_empty()
                }
                Some(_) => return Err(WRONGTYPE.into()),
            };
            if emptied {
                redis.keys.remove(key);
            }
            redis.writes.push(Write::Ltrim {
                key: key.clone(),
                start,
                stop,
            });
            ok(lua).map_err(lua_err)
        }
        ("PEXPIRE", [key, ms]) => {
            // Stricter than Redis, which deletes the key for 0 or less.
            if !is_canonical_uint(ms) || ms == "0" {
                return Err(format!("harness: PEXPIRE {ms:?}: not a positive integer string"));
            }
            let ms: u64 = ms
                .parse()
                .map_err(|_| "ERR value is not an integer or out of range")?;
            let at = redis.now_us / 1000 + ms;
            let set = match redis.keys.get_mut(key) {
                Some(entry) => {
                    entry.expire_at_ms = Some(at);
                    1
                }
                None => 0,
            };
            redis.writes.push(Write::Pexpire {
                key: key.clone(),
                ms,
            });
            Ok(Value::Integer(set))
        }
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
            redis.writes.push(Write::Set {
                key: key.clone(),
                value: value.clone(),
                px,
            });
            ok(lua).map_err(lua_err)
        }
        ("ZCOUNT", [key, min, max]) => {
            let range = ScoreRange::parse(min, max)?;
            match redis.keys.get(key) {
                None => Ok(Value::Integer(0)),
                Some(Entry {
                    value: Stored::ZSet(set),
                    ..
                }) => {
                    let n = set.values().filter(|&&s| range.holds(s)).count();
                    Ok(Value::Integer(i64::try_from(n).unwrap()))
                }
                Some(_) => Err(WRONGTYPE.into()),
            }
        }
        ("ZREMRANGEBYSCORE", [key, min, max]) => {
            let range = ScoreRange::parse(min, max)?;
            let (removed, emptied) = match redis.keys.get_mut(key) {
                None => (0, false),
                Some(Entry {
                    value: Stored::ZSet(set),
                    ..
                }) => {
                    let before = set.len();
                    set.retain(|_, s| !range.holds(*s));
                    (before - set.len(), set.is_empty())
                }
                Some(_) => return Err(WRONGTYPE.into()),
            };
            if emptied {
                redis.keys.remove(key);
            }
            redis.writes.push(Write::Zremrangebyscore {
                key: key.clone(),
                min: min.clone(),
                max: max.clone(),
            });
            Ok(Value::Integer(i64::try_from(removed).unwrap()))
        }
        ("ZADD", [key, rest @ ..]) => {
            let (xx, pairs) = match rest {
                [flag, pairs @ ..] if flag.eq_ignore_ascii_case("XX") => (true, pairs),
                pairs => (false, pairs),
            };
            if pairs.is_empty() || pairs.len() % 2 != 0 {
                return Err("ERR syntax error".into());
            }
            // Stricter than Redis: the scripts send integer scores.
            let mut parsed = Vec::with_capacity(pairs.len() / 2);
            for pair in pairs.chunks_exact(2) {
                if !is_canonical_uint(&pair[0]) {
                    return Err(format!("harness: ZADD score {:?}: not an integer string", pair[0]));
                }
                let score: u64 = pair[0]
                    .parse()
                    .map_err(|_| "ERR value is not a valid float")?;
                parsed.push((score as f64, pair[1].clone()));
            }
            let added = match redis.keys.get_mut(key) {
                None if xx => 0,
                None => {
                    let set: BTreeMap<String, f64> =
                        parsed.iter().map(|(s, m)| (m.clone(), *s)).collect();
                    let n = set.len();
                    redis.keys.insert(
                        key.clone(),
                        Entry {
                            value: Stored::ZSet(set),
                            expire_at_ms: None,
                        },
                    );
                    n
                }
                Some(Entry {
                    value: Stored::ZSet(set),
                    ..
                }) => {
                    let mut added = 0;
                    for (score, member) in &parsed {
                        match set.get_mut(member) {
                            Some(old) => *old = *score,
                            None if xx => {}
                            None => {
                                set.insert(member.clone(), *score);
                                added += 1;
                            }
                        }
                    }
                    added
                }
                Some(_) => return Err(WRONGTYPE.into()),
            };
            redis.writes.push(Write::Zadd {
                key: key.clone(),
                xx,
                pairs: pairs
                    .chunks_exact(2)
                    .map(|p| (p[0].clone(), p[1].clone()))
                    .collect(),
            });
            Ok(Value::Integer(i64::try_from(added).unwrap()))
        }
        ("ZRANGE", [key, start, stop, with]) if start == "-1" && stop == "-1"
            && with.eq_ignore_ascii_case("WITHSCORES") =>
        {
            let t = lua.create_table().map_err(lua_err)?;
            match redis.keys.get(key) {
                None => {}
                Some(Entry {
                    value: Stored::ZSet(set),
                    ..
                }) => {
                    // The highest score, ties by the greatest member.
                    let top = set
                        .iter()
                        .max_by(|a, b| a.1.total_cmp(b.1).then(a.0.cmp(b.0)))
                        .unwrap();
                    t.raw_set(1, top.0.as_str()).map_err(lua_err)?;
                    t.raw_set(2, redis_double(*top.1)).map_err(lua_err)?;
                }
                Some(_) => return Err(WRONGTYPE.into()),
            }
            Ok(Value::Table(t))
        }
        ("ZSCORE", [key, member]) => match redis.keys.get(key) {
            None => Ok(Value::Boolean(false)),
            Some(Entry {
                value: Stored::ZSet(set),
                ..
            }) => match set.get(member) {
                None => Ok(Value::Boolean(false)),
                Some(score) => Ok(Value::String(
                    lua.create_string(redis_double(*score)).map_err(lua_err)?,
                )),
            },
            Some(_) => Err(WRONGTYPE.into()),
        },
        ("ZREM", [key, members @ ..]) if !members.is_empty() => {
            let (removed, emptied) = match redis.keys.get_mut(key) {
                None => (0, false),
                Some(Entry {
                    value: Stored::ZSet(set),
                    ..
                }) => {
                    let removed = members
                        .iter()
                        .filter(|m| set.remove(m.as_str()).is_some())
                        .count();
                    (removed, set.is_empty())
                }
                Some(_) => return Err(WRONGTYPE.into()),
            };
            if emptied {
                redis.keys.remove(key);
            }
            redis.writes.push(Write::Zrem {
                key: key.clone(),
                members: members.to_vec(),
            });
            Ok(Value::Integer(i64::try_from(removed).unwrap()))
        }
        ("DEL", [key]) => {
            let existed = redis.keys.remove(key).is_some();
            redis.writes.push(Write::Del { key: key.clone() });
            Ok(Value::Integer(i64::from(existed)))
        }
        _ => Err(format!("harness: unsupported command {words:?}")),
    }
}

/// A score as Redis replies it to Lua (a bulk string): integers in full,
/// infinities as `inf`. Stricter than Redis's `%.17g` for the rest (an
/// exponent always), which the scripts must read with `tonumber` anyway.
pub(crate) fn redis_double(score: f64) -> String {
    if score.is_infinite() {
        return if score > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    if score.fract() == 0.0 && score.abs() < 1e17 {
        return format!("{}", score as i64);
    }
    format!("{score:e}")
}

/// The bounds of `ZCOUNT` and `ZREMRANGEBYSCORE`: `-inf`, `+inf`, or an
/// integer string, `(` before it for an open bound (stricter than Redis,
/// which takes any double).
struct ScoreRange {
    min: (f64, bool),
    max: (f64, bool),
}

impl ScoreRange {
    fn parse(min: &str, max: &str) -> Result<ScoreRange, String> {
        let bound = |s: &str| -> Result<(f64, bool), String> {
            let (open, rest) = match s.strip_prefix('(') {
                Some(rest) => (true, rest),
                None => (false, s),
            };
            let value = match rest {
                "-inf" => f64::NEG_INFINITY,
                "+inf" | "inf" => f64::INFINITY,
                digits if is_canonical_uint(digits) => {
                    digits.parse::<u64>().map_err(|e| e.to_string())? as f64
                }
                other => {
                    return Err(format!(
                        "harness: score bound {other:?}: not an integer string"
                    ));
                }
            };
            Ok((value, open))
        };
        Ok(ScoreRange {
            min: bound(min)?,
            max: bound(max)?,
        })
    }

    fn holds(&self, score: f64) -> bool {
        let above = if self.min.1 {
            score > self.min.0
        } else {
            score >= self.min.0
        };
        let below = if self.max.1 {
            score < self.max.0
        } else {
            score <= self.max.0
        };
        above && below
    }
}

// ---------------------------------------------------------------------------
// The harness: a script compiled and run the way Redis does.

/// What a script run produced, besides a decision.
#[derive(Debug, PartialEq)]
pub(crate) enum ScriptError {
    /// An error reply (`redis.error_reply`): what bad input must give.
    Reply(String),
    /// The script crashed (a Lua runtime error), or returned something that
    /// is neither a decision nor an error reply.
    Crash(String),
}

pub(crate) struct Harness {
    lua: Lua,
    script: Function,
    redis: Rc<RefCell<FakeRedis>>,
}

impl Harness {
    pub(crate) fn new(body: &str, now_us: u64) -> Harness {
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
            .set_name("@script.lua")
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

    /// Another script on the same Redis, compiled the same way.
    pub(crate) fn load(&self, body: &str) -> Function {
        self.lua
            .load(format!("return function() {body}\nend"))
            .set_name("@other.lua")
            .call(())
            .unwrap()
    }

    pub(crate) fn set_now(&self, now_us: u64) {
        self.redis.borrow_mut().now_us = now_us;
    }

    /// Stores a value with no expiry, as another client would.
    pub(crate) fn set_raw(&self, key: &str, value: Stored) {
        self.redis.borrow_mut().keys.insert(
            key.to_owned(),
            Entry {
                value,
                expire_at_ms: None,
            },
        );
    }

    /// Deletes the key, as another client would.
    pub(crate) fn remove(&self, key: &str) {
        self.redis.borrow_mut().keys.remove(key);
    }

    /// The key's value now (after expiry), as `GET` would see it.
    pub(crate) fn stored(&self, key: &str) -> Option<Stored> {
        let mut redis = self.redis.borrow_mut();
        redis.expire();
        redis.keys.get(key).map(|e| e.value.clone())
    }

    pub(crate) fn take_writes(&self) -> Vec<Write> {
        std::mem::take(&mut self.redis.borrow_mut().writes)
    }

    /// Runs the script with these `KEYS` and `ARGV`: its reply as Redis
    /// would send it (a flat array of integers), or why there is none.
    pub(crate) fn eval(
        &self,
        keys: &[&str],
        argv: &[&str],
    ) -> Result<Vec<i64>, ScriptError> {
        self.eval_on(&self.script, keys, argv)
    }

    /// [`Harness::eval`] of a script from [`Harness::load`].
    pub(crate) fn eval_on(
        &self,
        script: &Function,
        keys: &[&str],
        argv: &[&str],
    ) -> Result<Vec<i64>, ScriptError> {
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

        let value: Value = script
            .call(())
            .map_err(|e| ScriptError::Crash(e.to_string()))?;
        let Value::Table(t) = value else {
            return Err(ScriptError::Crash(format!("not a table: {value:?}")));
        };
        if let Value::String(err) = t.raw_get::<Value>("err").unwrap() {
            return Err(ScriptError::Reply(err.to_str().unwrap().to_owned()));
        }
        // Redis reads the array part up to the first nil; anything else in
        // the table is a mistake.
        let len = t.raw_len();
        if t.clone().pairs::<Value, Value>().count() != len {
            return Err(ScriptError::Crash(
                "the reply table has entries beyond its array part".into(),
            ));
        }
        (1..=len)
            .map(|i| match t.raw_get::<Value>(i).unwrap() {
                Value::Integer(n) => Ok(n),
                // Redis truncates a Lua number to an integer reply; the
                // scripts must not depend on that.
                Value::Number(n) if n.fract() == 0.0 && n.abs() < 9.3e18 => {
                    Ok(n as i64)
                }
                other => Err(ScriptError::Crash(format!(
                    "reply[{i}] is not an integer: {other:?}"
                ))),
            })
            .collect()
    }

    /// Like [`Harness::eval`] with numbers for arguments.
    pub(crate) fn eval_args(
        &self,
        keys: &[String],
        args: &[i64],
    ) -> Result<Vec<i64>, ScriptError> {
        let args: Vec<String> = args.iter().map(i64::to_string).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.eval(&keys, &args)
    }
}

impl Harness {
    /// The key's value and absolute expiry in ms (`None`: none) now, after
    /// expiry: what a write must leave exactly.
    pub(crate) fn entry(&self, key: &str) -> Option<(Stored, Option<u64>)> {
        let mut redis = self.redis.borrow_mut();
        redis.expire();
        redis
            .keys
            .get(key)
            .map(|e| (e.value.clone(), e.expire_at_ms))
    }

    /// The clock, in µs.
    pub(crate) fn now(&self) -> u64 {
        self.redis.borrow().now_us
    }
}

/// Asserts an error reply that starts with `prefix`.
#[track_caller]
pub(crate) fn assert_error_reply<T: std::fmt::Debug>(
    result: Result<T, ScriptError>,
    prefix: &str,
    what: &str,
) {
    match result {
        Err(ScriptError::Reply(msg)) => {
            assert!(msg.starts_with(prefix), "{what}: error reply {msg:?}")
        }
        other => panic!("{what}: expected an error reply, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// What the property tests draw.

/// A stored value that is not what gcra-core last wrote.
#[derive(Debug, Clone)]
pub(crate) enum Corrupt {
    /// Not a TAT at all: gcra-core sees no value.
    Garbage(&'static str),
    /// A key of another type: gcra-core sees no value.
    WrongType,
    /// An integer string `now + offset` (offsets that cross the horizon
    /// model clocks that went backwards, or debts).
    Relative(i64),
    /// An integer string, near or above 2^53.
    Absolute(u64),
}

impl Corrupt {
    /// Writes it into `key`: what gcra-core is now handed for the key.
    pub(crate) fn apply(
        &self,
        h: &Harness,
        key: &str,
        now: u64,
    ) -> Option<u64> {
        match self {
            Corrupt::Garbage(s) => {
                h.set_raw(key, Stored::Str((*s).to_owned()));
                None
            }
            Corrupt::WrongType => {
                h.set_raw(key, Stored::WrongType);
                None
            }
            Corrupt::Relative(offset) => {
                let v = now.saturating_add_signed(*offset);
                h.set_raw(key, Stored::Str(v.to_string()));
                Some(v)
            }
            Corrupt::Absolute(v) => {
                h.set_raw(key, Stored::Str(v.to_string()));
                Some(*v)
            }
        }
    }
}

/// Strings that are not what the scripts write: no TAT. Among them
/// numbers in other forms, and 2^53 + 1, which a double reads as 2^53.
pub(crate) const GARBAGE: &[&str] = &[
    "abc",
    "",
    "1.5",
    "nan",
    "-nan",
    "inf",
    "-inf",
    "1e400",
    "-1",
    "2e15",
    " 1790947155000000",
    "1790947155000000 ",
    "0x10",
    "+1790947155000000",
    "1790947155000000.5",
    "01790947155000000",
    "17909471550000e2",
    "9007199254740993",
    "18446744073709551615",
];

/// Quotas small, medium and large: intervals from 1 µs, bursts from 1 to
/// 100 000, windows up to gcra-core's largest (2^50 µs).
pub(crate) fn quota_strategy() -> impl Strategy<Value = Quota> {
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
    let burst = prop_oneof![
        4 => Just(None),
        2 => (1u32..=100).prop_map(Some),
        1 => (100u32..=100_000).prop_map(Some),
    ];
    let small_or_medium = (1u32..=50, period_us, burst).prop_filter_map(
        "invalid quota",
        |(limit, period, burst)| {
            let quota =
                Quota::new(limit, Duration::from_micros(period)).ok()?;
            match burst {
                Some(b) => quota.try_allow_burst(b).ok(),
                None => Some(quota),
            }
        },
    );
    // Windows near gcra-core's bound, where TATs get close to 2^53.
    let large = (1u32..=4, 0u32..=3).prop_filter_map(
        "invalid quota",
        |(burst, shift)| {
            let period = (gcra_core::MAX_WINDOW_US >> shift) / u64::from(burst);
            Quota::new(1, Duration::from_micros(period))
                .ok()?
                .try_allow_burst(burst)
                .ok()
        },
    );
    let debt = prop_oneof![
        6 => Just(None),
        1 => Just(Some(0u64)),
        2 => (0u64..=100_000_000_000).prop_map(Some),
        1 => Just(Some(gcra_core::MAX_WINDOW_US)),
    ];
    (prop_oneof![8 => small_or_medium, 1 => large], debt).prop_map(
        |(quota, debt): (Quota, Option<u64>)| match debt {
            Some(debt) => quota
                .try_allow_debt(Duration::from_micros(debt))
                .unwrap_or(quota),
            None => quota,
        },
    )
}

/// A clock step for `quota`: forwards, not at all, or backwards.
pub(crate) fn advance_strategy(quota: Quota) -> impl Strategy<Value = i64> {
    let t = quota.emission_interval_us() as i64;
    let tau = quota.burst_offset_us() as i64;
    let period = quota.period().as_micros() as i64;
    prop_oneof![
        4 => Just(0i64),
        4 => 0..=2 * t,
        3 => 0..=2 * tau,
        1 => 0..=3 * period,
        1 => -2 * tau..=0,
        1 => -20 * tau..=0,
        1 => 0..=999i64,
    ]
}

/// A corruption of a bucket of `quota`, or none.
pub(crate) fn corrupt_strategy(
    quota: Quota,
) -> impl Strategy<Value = Option<Corrupt>> {
    let tau = quota.burst_offset_us() as i64;
    // The ceiling: tau + the max debt (2 tau by default).
    let ceiling = quota.ceiling_us() as i64;
    let corrupt = prop_oneof![
        5 => prop::sample::select(GARBAGE.to_vec()).prop_map(Corrupt::Garbage),
        2 => Just(Corrupt::WrongType),
        5 => (-3 * tau..=3 * tau).prop_map(Corrupt::Relative),
        1 => prop::sample::select(vec![ceiling, ceiling + 1, tau, tau + 1])
            .prop_map(Corrupt::Relative),
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
    prop_oneof![12 => Just(None), 1 => corrupt.prop_map(Some)]
}

/// Moves the clock, and tells the model which keys Redis expired: a key
/// must not expire while its TAT is still ahead (its PX was long enough);
/// once expired it is gone, even if the clock goes back.
pub(crate) fn tick(
    h: &Harness,
    keys: &[String],
    model: &mut [Option<u64>],
    now: u64,
) -> Result<(), TestCaseError> {
    h.set_now(now);
    for (key, tat) in keys.iter().zip(model.iter_mut()) {
        if h.stored(key).is_none()
            && let Some(v) = *tat
        {
            prop_assert!(
                v < now,
                "{}: expired at {} before its TAT {}",
                key,
                now,
                v
            );
            *tat = None;
        }
    }
    Ok(())
}
