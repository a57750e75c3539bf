//! `src/redis/decide_mixed.lua` in an embedded Lua 5.1 (`lua_support`),
//! against gcra-core's kinds of limit (`Quota`, `Window`, `Period`,
//! `Concurrency` with a `Lease`) decided as one the way its crate docs say
//! ("Several kinds in one decision").
//!
//! The property test runs random sequences of decisions over 1 to 4 keys
//! of random kinds (cluster keys of one user, as `RedisStorage` names
//! them), with clock steps that land on an entry's expiry, a period's
//! start, a slot's expiry or a bucket's next pass (and 1 µs either side),
//! corrupt values and shadow flags, through the script and through
//! gcra-core, and requires the same reply field by field and exactly the
//! state gcra-core asks for in every key (TAT, list, record, sorted set of
//! slots, and their expiry), nothing else. A concurrency limit's model is
//! gcra-core's: the list of the slots' expiries, of which
//! `Lease::live` counts the live ones, `Concurrency::acquire` decides, and a
//! pass that stands keeps the live ones and adds its cost's, expiring at
//! `Lease::expiry`.
#![allow(clippy::unwrap_used)]

mod cases;
mod lua_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cases::{decisions, key, names, subset};
use gcra_core::{
    Charge, CheckError, Concurrency, Decision, Lease, LogWrite, MAX_OFFSET_S,
    MAX_TIME_US, MAX_WINDOW_LIMIT, MAX_WINDOW_US, Period, PeriodUnit,
    PeriodWrite, Quota, RETRY_HINT_US, StoreTat, Verdict, Window, check_all,
};
use lua_support::{
    Corrupt, DECIDE_MIXED, GARBAGE, Harness, START_US, ScriptError, Stored,
    Write, advance_strategy, assert_error_reply, corrupt_strategy,
    quota_strategy,
};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

const SECOND: u64 = 1_000_000;
const HOUR: u64 = 3600 * SECOND;
const DAY: u64 = 24 * HOUR;

// ---------------------------------------------------------------------------
// The limits, the script's arguments, and what gcra-core is handed.

#[derive(Debug, Clone, Copy)]
enum Limit {
    Rate(Quota),
    Window(Window),
    Period(Period),
    /// A concurrency limit, and the lease of the store that decides it.
    Concurrency(Concurrency, Lease),
}

impl Limit {
    /// The script's 6 arguments for this limit: tag, a, b, c, cost, shadow;
    /// `id` is a concurrency limit's slot id.
    fn args(&self, cost: u32, shadow: bool, id: u64) -> [String; 6] {
        let (tag, a, b, c) = match self {
            Limit::Rate(q) => (
                0,
                q.emission_interval_us(),
                q.burst_offset_us(),
                q.max_debt_us().to_string(),
            ),
            Limit::Window(w) => {
                (1, u64::from(w.limit()), w.window_us(), "0".to_owned())
            }
            Limit::Period(p) => {
                let unit = match p.unit() {
                    PeriodUnit::Day => 0,
                    PeriodUnit::Week => 1,
                    PeriodUnit::Month => 2,
                };
                (2, u64::from(p.limit()), unit, p.offset_s().to_string())
            }
            Limit::Concurrency(c, lease) => {
                (3, u64::from(c.limit()), lease.lease_us(), id.to_string())
            }
        };
        [
            tag.to_string(),
            a.to_string(),
            b.to_string(),
            c,
            cost.to_string(),
            u8::from(shadow).to_string(),
        ]
    }
}

/// What gcra-core is handed for a key: the store's reading of its value.
#[derive(Debug, Clone, PartialEq)]
enum Handed {
    Tat(Option<u64>),
    Log(Vec<u64>),
    Record(Option<(u64, u32)>),
    /// A concurrency limit's slots: member to expiry (a sorted set's
    /// score).
    Slots(BTreeMap<String, f64>),
}

/// A slot's expiry as gcra-core reads it: the score rounded up (Redis
/// compares the double with integer bounds: `score > now` is `ceil(score) >
/// now`), an infinite one beyond every time.
fn expiry_of(score: f64) -> u64 {
    if score.is_nan() {
        0
    } else {
        score.ceil() as u64
    }
}

/// Whether a slot scored `score` is live at `now`: `Lease::live`'s rule.
fn is_live(score: f64, now: u64) -> bool {
    Lease::live(&[expiry_of(score)], now) == 1
}

fn is_canonical(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'))
}

/// The store's reading rules (the script's header): a rate's TAT is a
/// canonical integer string; a window's log a list of canonical integers
/// up to 2^53, else none; a period's record `start:count`, a u64 and a
/// u32; a concurrency limit's slots a sorted set. Anything else, and a key
/// of another type, is absent.
fn handed(limit: &Limit, stored: Option<&Stored>) -> Handed {
    match limit {
        Limit::Rate(_) => Handed::Tat(match stored {
            Some(Stored::Str(s)) if is_canonical(s) => s.parse().ok(),
            _ => None,
        }),
        Limit::Window(_) => Handed::Log(match stored {
            Some(Stored::List(items)) => items
                .iter()
                .map(|s| {
                    is_canonical(s)
                        .then(|| s.parse::<u64>().ok())
                        .flatten()
                        .filter(|&v| v <= MAX_TIME_US)
                })
                .collect::<Option<Vec<u64>>>()
                .unwrap_or_default(),
            _ => Vec::new(),
        }),
        Limit::Period(_) => Handed::Record(match stored {
            Some(Stored::Str(s)) => s.split_once(':').and_then(|(a, b)| {
                if is_canonical(a) && is_canonical(b) {
                    Some((a.parse().ok()?, b.parse().ok()?))
                } else {
                    None
                }
            }),
            _ => None,
        }),
        Limit::Concurrency(..) => Handed::Slots(match stored {
            Some(Stored::ZSet(set)) => set.clone(),
            _ => BTreeMap::new(),
        }),
    }
}

/// The write gcra-core asks of the store for one limit.
#[derive(Debug, Clone, PartialEq)]
enum Change {
    Tat(StoreTat),
    Log(LogWrite),
    Record(PeriodWrite),
    /// Slots taken: these members, expiring at `expiry`.
    Slots {
        expiry: u64,
        members: Vec<String>,
    },
}

/// One limit decided alone (a cost of 0 is a peek, for every kind); `id`
/// is a concurrency limit's slot id.
fn decide(
    limit: &Limit,
    handed: &Handed,
    now: u64,
    cost: u32,
    id: u64,
) -> Result<(Decision, Option<Change>), CheckError> {
    Ok(match (limit, handed) {
        (Limit::Rate(q), Handed::Tat(tat)) => {
            let d = if cost == 0 {
                q.peek(*tat, now)?
            } else {
                q.check(*tat, now, cost)?
            };
            (Decision { store: None, ..d }, d.store.map(Change::Tat))
        }
        (Limit::Window(w), Handed::Log(log)) => {
            let d = w.check(log, now, cost)?;
            (d.as_decision(), d.write.map(Change::Log))
        }
        (Limit::Period(p), Handed::Record(record)) => {
            let d = p.check(*record, now, cost)?;
            (d.as_decision(), d.write.map(Change::Record))
        }
        (Limit::Concurrency(c, lease), Handed::Slots(slots)) => {
            // Past 2^53 the store decides nothing, as for every kind (and
            // as Lease::expiry says of a pass), even a peek.
            if now > MAX_TIME_US {
                return Err(CheckError::TimeOutOfRange);
            }
            let expiries: Vec<u64> =
                slots.values().map(|&s| expiry_of(s)).collect();
            let d = c.acquire(Lease::live(&expiries, now), cost)?;
            let change = match d.write {
                Some(_) => Some(Change::Slots {
                    expiry: lease.expiry(now)?,
                    members: (1..=cost).map(|k| format!("{id}:{k}")).collect(),
                }),
                None => None,
            };
            (d.as_decision(), change)
        }
        _ => unreachable!("a key read for another kind"),
    })
}

/// What the decision must reply and write.
#[derive(Debug)]
struct Expected {
    reply: Vec<Decision>,
    verdict: Verdict,
    /// The writes to apply, by key index.
    writes: Vec<(usize, Change)>,
}

/// gcra-core's combination of kinds (crate docs, "Several kinds in one
/// decision"): each limit alone, `Verdict::of` over the answers; on a pass
/// every write; on a refusal no write of a limit that passed (it replies
/// with a peek), and a refusing limit's write (a repair) applied.
fn combine(
    limits: &[Limit],
    handed: &[Handed],
    ids: &[u64],
    now: u64,
    chosen: &[(usize, u32, bool)],
) -> Result<Expected, CheckError> {
    let parts = chosen
        .iter()
        .map(|&(i, cost, _)| decide(&limits[i], &handed[i], now, cost, ids[i]))
        .collect::<Result<Vec<_>, _>>()?;
    let answers: Vec<Decision> = parts.iter().map(|p| p.0).collect();
    let verdict = Verdict::of(chosen.iter().map(|c| c.2), &answers);
    let mut reply = Vec::new();
    let mut writes = Vec::new();
    for (&(i, cost, _), (decision, change)) in chosen.iter().zip(parts) {
        if !verdict.allowed && decision.allowed && cost > 0 {
            reply.push(decide(&limits[i], &handed[i], now, 0, ids[i])?.0);
        } else {
            reply.push(decision);
            writes.extend(change.map(|c| (i, c)));
        }
    }
    Ok(Expected {
        reply,
        verdict,
        writes,
    })
}

fn apply_log(log: &[u64], write: &LogWrite) -> Vec<u64> {
    let kept = write.kept(log.len());
    let mut log = log[kept].to_vec();
    log.extend(std::iter::repeat_n(write.entry_us, write.append));
    log
}

/// The key's value and expiry (ms) after the store applied `change` at
/// `now`.
fn written(
    handed: &Handed,
    change: &Change,
    now: u64,
) -> (Stored, Option<u64>) {
    let ms = now / 1000;
    match (change, handed) {
        (Change::Tat(s), _) => {
            (Stored::Str(s.tat_us.to_string()), Some(ms + s.ttl_ms))
        }
        (Change::Log(w), Handed::Log(log)) => (
            Stored::List(
                apply_log(log, w).iter().map(u64::to_string).collect(),
            ),
            Some(ms + w.ttl_ms),
        ),
        (Change::Record(w), _) => (
            Stored::Str(format!("{}:{}", w.start_us, w.count)),
            Some(ms + w.ttl_ms),
        ),
        (Change::Slots { expiry, members }, Handed::Slots(slots)) => {
            // The live slots kept, the new ones added (a member of the same
            // name moved), and the key kept until the latest expires.
            let mut kept: BTreeMap<String, f64> = slots
                .iter()
                .filter(|&(_, &s)| is_live(s, now))
                .map(|(m, &s)| (m.clone(), s))
                .collect();
            for member in members {
                kept.insert(member.clone(), *expiry as f64);
            }
            let latest = kept.values().map(|&s| expiry_of(s)).max().unwrap();
            (Stored::ZSet(kept), Some(ms + (latest - now).div_ceil(1000)))
        }
        _ => unreachable!("a log write for another kind"),
    }
}

fn write_key(write: &Write) -> &str {
    match write {
        Write::Set { key, .. }
        | Write::Del { key }
        | Write::Rpush { key, .. }
        | Write::Ltrim { key, .. }
        | Write::Pexpire { key, .. }
        | Write::Zadd { key, .. }
        | Write::Zrem { key, .. }
        | Write::Zremrangebyscore { key, .. } => key,
    }
}

/// The script's call for these limits (a concurrency limit's slot id: 1).
fn eval(
    h: &Harness,
    keys: &[&str],
    limits: &[(Limit, u32, bool)],
) -> Result<Vec<i64>, ScriptError> {
    eval_ids(h, keys, limits, &vec![1; limits.len()])
}

/// The script's call for these limits, `ids[i]` the slot id of the `i`-th.
fn eval_ids(
    h: &Harness,
    keys: &[&str],
    limits: &[(Limit, u32, bool)],
    ids: &[u64],
) -> Result<Vec<i64>, ScriptError> {
    let args: Vec<String> = limits
        .iter()
        .zip(ids)
        .flat_map(|((limit, cost, shadow), id)| limit.args(*cost, *shadow, *id))
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    h.eval(keys, &args)
}

fn strs(items: &[u64]) -> Stored {
    Stored::List(items.iter().map(u64::to_string).collect())
}

// ---------------------------------------------------------------------------
// Unit tests: the docs' examples, and what a refusal writes.

#[test]
fn three_requests_in_any_ten_seconds() {
    // Window::check's doc example, at Redis's clock.
    let k = "trt:w:{u}";
    let window =
        Limit::Window(Window::new(3, Duration::from_secs(10)).unwrap());
    let at = |s: u64| START_US + s * SECOND;
    let h = Harness::new(DECIDE_MIXED, at(9));
    h.set_raw(k, strs(&[at(0), at(4), at(5)]));
    assert_eq!(
        eval(&h, &[k], &[(window, 1, false)]),
        Ok(vec![0, 0, SECOND as i64, 6 * SECOND as i64])
    );
    assert_eq!(h.take_writes(), []);
    h.set_now(at(10));
    assert_eq!(
        eval(&h, &[k], &[(window, 1, false)]),
        Ok(vec![1, 0, 0, 10 * SECOND as i64])
    );
    let writes = h.take_writes();
    assert_eq!(
        h.entry(k),
        Some((strs(&[at(4), at(5), at(10)]), Some(at(10) / 1000 + 10_000)))
    );
    assert_eq!(
        writes.last(),
        Some(&Write::Pexpire {
            key: k.into(),
            ms: 10_000
        })
    );
    // Two at once wait for two entries to expire: at 15 s.
    assert_eq!(
        eval(&h, &[k], &[(window, 2, false)]),
        Ok(vec![0, 0, 5 * SECOND as i64, 10 * SECOND as i64])
    );
}

#[test]
fn the_quota_of_february_2024_comes_back_on_march_1st() {
    // Period::check's doc example: 1000 a month, 998 spent on the 28th at
    // 23:00 UTC, February having 29 days.
    let k = "trt:m:{u}";
    let monthly =
        Limit::Period(Period::new(1000, PeriodUnit::Month, 0).unwrap());
    let feb_28_23h = 1_709_161_200_000_000;
    let march_1 = 1_709_251_200_000_000;
    let feb_1: u64 = 1_706_745_600_000_000;
    let h = Harness::new(DECIDE_MIXED, feb_28_23h);
    h.set_raw(k, Stored::Str(format!("{feb_1}:998")));
    assert_eq!(
        eval(&h, &[k], &[(monthly, 2, false)]),
        Ok(vec![1, 0, 0, 25 * HOUR as i64])
    );
    assert_eq!(
        h.take_writes(),
        [Write::Set {
            key: k.into(),
            value: format!("{feb_1}:1000"),
            px: 90_000_000
        }]
    );
    assert_eq!(
        eval(&h, &[k], &[(monthly, 1, false)]),
        Ok(vec![0, 0, 25 * HOUR as i64, 25 * HOUR as i64])
    );
    assert_eq!(h.take_writes(), []);
    h.set_now(march_1 - 1);
    assert_eq!(eval(&h, &[k], &[(monthly, 0, false)]), Ok(vec![1, 0, 0, 1]));
    h.set_now(march_1);
    assert_eq!(
        eval(&h, &[k], &[(monthly, 1, false)]),
        Ok(vec![1, 999, 0, 31 * DAY as i64])
    );
    // In India (UTC+05:30) the same instant is February 29th, 04:30.
    let india = Limit::Period(
        Period::new(1000, PeriodUnit::Month, 5 * 3600 + 1800).unwrap(),
    );
    let h = Harness::new(DECIDE_MIXED, feb_28_23h);
    assert_eq!(
        eval(&h, &["trt:i:{u}"], &[(india, 0, false)]),
        Ok(vec![1, 1000, 0, (19 * HOUR + HOUR / 2) as i64])
    );
}

/// A tier of 10/min with 4 spent, a window of 2 per minute full, a day of
/// 5 with 1 spent.
fn three_kinds(h: &Harness, keys: [&str; 3], window_ahead: bool) -> [Limit; 3] {
    let now = h.now();
    h.set_raw(keys[0], Stored::Str((now + 24 * SECOND).to_string()));
    let latest = if window_ahead {
        now + SECOND
    } else {
        now - SECOND
    };
    h.set_raw(keys[1], strs(&[now - 10 * SECOND, latest]));
    let daily = Period::new(5, PeriodUnit::Day, 0).unwrap();
    h.set_raw(
        keys[2],
        Stored::Str(format!("{}:1", daily.start_of(now).unwrap())),
    );
    [
        Limit::Rate(Quota::per_minute(10)),
        Limit::Window(Window::new(2, Duration::from_secs(60)).unwrap()),
        Limit::Period(daily),
    ]
}

#[test]
fn a_refusal_writes_nothing_and_the_others_stand_as_they_are() {
    let keys = ["trt:plan:{u}", "trt:win:{u}", "trt:day:{u}"];
    let h = Harness::new(DECIDE_MIXED, START_US);
    let [plan, win, day] = three_kinds(&h, keys, false);
    let before: Vec<_> = keys.iter().map(|k| h.entry(k)).collect();
    let until_midnight = (DAY - START_US % DAY) as i64;
    let reply = eval(
        &h,
        &keys,
        &[(plan, 1, false), (win, 1, false), (day, 2, false)],
    );
    assert_eq!(
        reply,
        Ok([
            [1, 6, 0, 24_000_000], // the plan as it stands: a peek
            [0, 0, 50_000_000, 59_000_000], // the entry 10 s old expires in 50 s
            [1, 4, 0, until_midnight],      // the day as it stands
        ]
        .concat())
    );
    assert_eq!(h.take_writes(), [], "a refusal issues no write");
    let after: Vec<_> = keys.iter().map(|k| h.entry(k)).collect();
    assert_eq!(after, before);

    // The same refusal, with the window's newest entry 1 s ahead (the
    // clock went back): its re-stamp, a repair, is the only write.
    let h = Harness::new(DECIDE_MIXED, START_US);
    let [plan, win, day] = three_kinds(&h, keys, true);
    let before: Vec<_> = keys.iter().map(|k| h.entry(k)).collect();
    let reply = eval(
        &h,
        &keys,
        &[(plan, 1, false), (win, 1, false), (day, 2, false)],
    );
    assert_eq!(reply.unwrap()[4..8], [0, 0, 50_000_000, 60_000_000]);
    let writes = h.take_writes();
    let touched: BTreeSet<&str> = writes.iter().map(write_key).collect();
    assert_eq!(touched, BTreeSet::from([keys[1]]));
    assert_eq!(
        h.entry(keys[1]),
        Some((
            strs(&[START_US - 10 * SECOND, START_US]),
            Some(START_US / 1000 + 60_000)
        ))
    );
    assert_eq!(h.entry(keys[0]), before[0]);
    assert_eq!(h.entry(keys[2]), before[2]);
}

#[test]
fn a_shadow_refusal_refuses_nothing_and_is_not_charged() {
    let keys = ["trt:plan:{u}", "trt:win:{u}", "trt:day:{u}"];
    let h = Harness::new(DECIDE_MIXED, START_US);
    let [plan, win, day] = three_kinds(&h, keys, false);
    let window_before = h.entry(keys[1]);
    let reply = eval(
        &h,
        &keys,
        &[(plan, 1, false), (win, 1, true), (day, 2, false)],
    );
    let until_midnight = (DAY - START_US % DAY) as i64;
    assert_eq!(
        reply,
        Ok([
            [1, 5, 0, 30_000_000],          // charged
            [0, 0, 50_000_000, 59_000_000], // the would-be refusal
            [1, 2, 0, until_midnight],      // charged
        ]
        .concat())
    );
    assert_eq!(h.entry(keys[1]), window_before);
    let start = START_US - START_US % DAY;
    assert_eq!(
        h.entry(keys[2]).map(|e| e.0),
        Some(Stored::Str(format!("{start}:3")))
    );
    assert_eq!(
        h.entry(keys[0]).map(|e| e.0),
        Some(Stored::Str((START_US + 30 * SECOND).to_string()))
    );
}

#[test]
fn a_value_of_another_kind_is_absent_and_replaced() {
    let keys = ["trt:plan:{u}", "trt:win:{u}", "trt:day:{u}"];
    let h = Harness::new(DECIDE_MIXED, START_US);
    h.set_raw(keys[0], strs(&[START_US]));
    h.set_raw(keys[1], Stored::Str((START_US + 24 * SECOND).to_string()));
    h.set_raw(keys[2], Stored::WrongType);
    let limits = [
        Limit::Rate(Quota::per_minute(10)),
        Limit::Window(Window::new(2, Duration::from_secs(60)).unwrap()),
        Limit::Period(Period::new(5, PeriodUnit::Day, 0).unwrap()),
    ];
    let calls: Vec<_> = limits.iter().map(|l| (*l, 2, false)).collect();
    let reply = eval(&h, &keys, &calls).unwrap();
    assert_eq!(
        decisions(&reply)
            .iter()
            .map(|d| d.remaining)
            .collect::<Vec<_>>(),
        [8, 0, 3]
    );
    assert_eq!(
        h.entry(keys[1]).map(|e| e.0),
        Some(strs(&[START_US, START_US]))
    );
    let start = START_US - START_US % DAY;
    assert_eq!(
        h.entry(keys[2]).map(|e| e.0),
        Some(Stored::Str(format!("{start}:2")))
    );
    // A list with an entry that is no timestamp: no log.
    let h = Harness::new(DECIDE_MIXED, START_US);
    let bad = Stored::List(vec![START_US.to_string(), "x".into()]);
    h.set_raw(keys[1], bad.clone());
    assert_eq!(
        eval(&h, &keys[1..2], &[(limits[1], 0, false)]),
        Ok(vec![1, 2, 0, 0])
    );
    assert_eq!(
        h.entry(keys[1]).map(|e| e.0),
        Some(bad),
        "a peek writes nothing"
    );
    assert_eq!(
        eval(&h, &keys[1..2], &[(limits[1], 1, false)]),
        Ok(vec![1, 1, 0, 60 * SECOND as i64])
    );
    assert_eq!(h.entry(keys[1]).map(|e| e.0), Some(strs(&[START_US])));
}

#[test]
fn bad_arguments_are_error_replies_and_write_nothing() {
    let k = "trt:a:{u}";
    let k2 = "trt:b:{u}";
    let rate = ["0", "6000000", "60000000", "60000000", "1", "0"];
    let window = ["1", "3", "10000000", "0", "1", "0"];
    let period = ["2", "5", "0", "0", "1", "0"];
    let slots = ["3", "2", "30000000", "7", "1", "0"];
    let with = |base: [&'static str; 6], slot: usize, v: &'static str| {
        let mut a = base;
        a[slot] = v;
        a
    };
    let mut cases: Vec<(String, Vec<&str>, Vec<&str>)> = vec![
        ("no key".into(), vec![], vec![]),
        ("no arguments".into(), vec![k], vec![]),
        ("5 arguments".into(), vec![k], rate[..5].to_vec()),
        ("7 arguments".into(), vec![k], [&rate[..], &["0"]].concat()),
        ("6 arguments for 2 keys".into(), vec![k, k2], rate.to_vec()),
        (
            "the same key twice".into(),
            vec![k, k],
            [rate, rate].concat(),
        ),
        ("tag 4".into(), vec![k], with(rate, 0, "4").to_vec()),
        ("tag 00".into(), vec![k], with(rate, 0, "00").to_vec()),
        ("empty tag".into(), vec![k], with(rate, 0, "").to_vec()),
        (
            "a bad second key".into(),
            vec![k, k2],
            [&rate[..], &with(window, 2, "x")].concat(),
        ),
    ];
    // Per kind: its good arguments, and bad values for some slots.
    type Bad = &'static [(usize, &'static str)];
    let per_kind: [(&str, [&str; 6], Bad); 4] = [
        (
            "rate",
            rate,
            &[
                (1, "0"),
                (1, "06000000"),
                (1, "6e6"),
                (2, "5999999"),
                (2, "9007199254740993"),
                (3, "-1"),
                (3, "1125899906842625"),
                (3, "10000000000000000"),
                (4, "11"),
                (4, "01"),
                (4, "-1"),
                (4, "9007199254740993"),
                (5, "2"),
                (5, ""),
            ],
        ),
        (
            "window",
            window,
            &[
                (1, "0"),
                (1, "1025"),
                (1, "03"),
                (2, "0"),
                (2, "1125899906842625"),
                (2, "1.5"),
                (3, "1"),
                (3, ""),
                (4, "4"),
                (4, "99999999999999999999999"),
                (5, "true"),
            ],
        ),
        (
            "period",
            period,
            &[
                (1, "0"),
                (1, "4294967296"),
                (1, "-5"),
                (2, "3"),
                (2, "-0"),
                (3, "64801"),
                (3, "-64801"),
                (3, "-0"),
                (3, "+5"),
                (3, "05"),
                (3, "1.5"),
                (4, "6"),
                (4, " 1"),
                (5, "-1"),
            ],
        ),
        (
            "concurrency",
            slots,
            &[
                (1, "0"),
                (1, "4294967296"),
                (1, "02"),
                (2, "0"),
                (2, "1125899906842625"),
                (2, "10000000000000000"),
                (2, "1.5"),
                (3, "-1"),
                (3, "07"),
                (3, ""),
                (3, "1e3"),
                (3, "18446744073709551616"),
                (3, "99999999999999999999"),
                (3, "100000000000000000000"),
                // Taking slots needs an id (a peek does not: see below).
                (3, "0"),
                (4, "3"),
                (5, "2"),
            ],
        ),
    ];
    for (kind, base, bad) in per_kind {
        for &(slot, v) in bad {
            cases.push((
                format!("{kind}: argument {slot} = {v:?}"),
                vec![k],
                with(base, slot, v).to_vec(),
            ));
            // In shadow too, and beside a limit that passes.
            cases.push((
                format!("{kind}: argument {slot} = {v:?}, after a rate"),
                vec![k2, k],
                [&rate[..], &with(with(base, 5, "1"), slot, v)].concat(),
            ));
        }
    }
    for (what, keys, argv) in &cases {
        let h = Harness::new(DECIDE_MIXED, START_US);
        let before = Stored::Str(format!("{START_US}:1"));
        h.set_raw(k, before.clone());
        h.set_raw(k2, strs(&[START_US]));
        assert_error_reply(h.eval(keys, argv), "decide_mixed: ", what);
        assert_eq!(h.take_writes(), [], "{what}: wrote");
        assert_eq!(h.stored(k), Some(before), "{what}: changed the key");
        assert_eq!(h.stored(k2), Some(strs(&[START_US])), "{what}: changed");
    }
}

#[test]
fn past_2_to_the_53_is_an_error_even_for_a_peek() {
    let day = Limit::Period(Period::new(5, PeriodUnit::Day, 0).unwrap());
    // The last day before 2^53 ends after it.
    let h = Harness::new(DECIDE_MIXED, MAX_TIME_US - 1);
    assert_error_reply(
        eval(&h, &["trt:a:{u}"], &[(day, 0, false)]),
        "decide_mixed: time values",
        "a day ending past 2^53",
    );
    let window = Limit::Window(
        Window::new(5, Duration::from_micros(MAX_WINDOW_US)).unwrap(),
    );
    assert_eq!(
        eval(&h, &["trt:a:{u}"], &[(window, 1, false)]),
        Ok(vec![1, 4, 0, MAX_WINDOW_US as i64])
    );
    let h = Harness::new(DECIDE_MIXED, MAX_TIME_US + 1);
    assert_error_reply(
        eval(&h, &["trt:a:{u}"], &[(window, 0, false)]),
        "decide_mixed: time values",
        "now past 2^53",
    );
    assert_eq!(h.take_writes(), []);
}

/// A sorted set of slots, member to expiry.
fn zset(slots: &[(&str, u64)]) -> Stored {
    Stored::ZSet(
        slots
            .iter()
            .map(|&(m, e)| (m.to_owned(), e as f64))
            .collect(),
    )
}

fn uploads(limit: u32, lease: Duration) -> Limit {
    Limit::Concurrency(
        Concurrency::new(limit).unwrap(),
        Lease::new(lease).unwrap(),
    )
}

#[test]
fn two_uploads_at_once_and_a_slot_frees_when_its_lease_ends() {
    // Concurrency::acquire's doc example, leased for 30 s at Redis's clock.
    let k = "trt:up:{u}";
    let two = uploads(2, Duration::from_secs(30));
    let h = Harness::new(DECIDE_MIXED, START_US);
    let take = |h: &Harness, id: u64, cost: u32| {
        eval_ids(h, &[k], &[(two, cost, false)], &[id])
    };
    assert_eq!(take(&h, 7, 1), Ok(vec![1, 1, 0, 0]));
    let expiry = START_US + 30 * SECOND;
    assert_eq!(
        h.take_writes(),
        [
            Write::Zremrangebyscore {
                key: k.into(),
                min: "-inf".into(),
                max: START_US.to_string(),
            },
            Write::Zremrangebyscore {
                key: k.into(),
                min: "(9007199254740992".into(),
                max: "+inf".into(),
            },
            Write::Zadd {
                key: k.into(),
                xx: false,
                pairs: vec![(expiry.to_string(), "7:1".into())],
            },
            Write::Pexpire {
                key: k.into(),
                ms: 30_000,
            },
        ]
    );
    assert_eq!(
        h.entry(k),
        Some((zset(&[("7:1", expiry)]), Some(START_US / 1000 + 30_000)))
    );
    h.set_now(START_US + 10 * SECOND);
    assert_eq!(take(&h, 8, 1), Ok(vec![1, 0, 0, 0]));
    h.take_writes();
    // Full: refused with the hint, and a peek (no id needed) says 0 left;
    // neither writes.
    assert_eq!(take(&h, 9, 1), Ok(vec![0, 0, RETRY_HINT_US as i64, 0]));
    assert_eq!(take(&h, 0, 0), Ok(vec![1, 0, 0, 0]));
    assert_eq!(h.take_writes(), []);
    // The first slot is held until its expiry, and free from it on.
    h.set_now(expiry - 1);
    assert_eq!(take(&h, 9, 1), Ok(vec![0, 0, RETRY_HINT_US as i64, 0]));
    h.set_now(expiry);
    assert_eq!(take(&h, 9, 1), Ok(vec![1, 0, 0, 0]));
    assert_eq!(
        h.entry(k),
        Some((
            zset(&[
                ("8:1", expiry + 10 * SECOND),
                ("9:1", expiry + 30 * SECOND)
            ]),
            Some(expiry / 1000 + 30_000)
        ))
    );
    // A cost above the limit can never pass: an error, nothing written.
    h.take_writes();
    assert_error_reply(
        take(&h, 10, 3),
        "decide_mixed: key 1: cost exceeds",
        "cost 3 of 2",
    );
    assert_eq!(h.take_writes(), []);
    // The largest id, and a cost of several slots: one member per unit.
    let h = Harness::new(DECIDE_MIXED, START_US);
    assert_eq!(take(&h, u64::MAX, 2), Ok(vec![1, 0, 0, 0]));
    assert_eq!(
        h.entry(k).map(|e| e.0),
        Some(zset(&[
            ("18446744073709551615:1", expiry),
            ("18446744073709551615:2", expiry)
        ]))
    );
}

#[test]
fn a_slot_is_taken_only_when_the_decision_stands() {
    let keys = ["trt:plan:{u}", "trt:up:{u}"];
    let plan = Limit::Rate(Quota::per_hour(1));
    let two = uploads(2, Duration::from_secs(30));
    let h = Harness::new(DECIDE_MIXED, START_US);
    // The tier is spent: the upload's slot is not taken, and it replies
    // with the limit as it stands.
    h.set_raw(keys[0], Stored::Str((START_US + 3600 * SECOND).to_string()));
    let reply = eval(&h, &keys, &[(plan, 1, false), (two, 1, false)]).unwrap();
    assert_eq!(reply[0], 0);
    assert_eq!(reply[4..], [1, 2, 0, 0]);
    assert_eq!(h.take_writes(), []);
    assert_eq!(h.entry(keys[1]), None);

    // The uploads are full: the tier is not charged.
    let h = Harness::new(DECIDE_MIXED, START_US);
    let held = START_US + 5 * SECOND;
    h.set_raw(keys[1], zset(&[("1:1", held), ("2:1", held)]));
    let reply = eval(&h, &keys, &[(plan, 1, false), (two, 1, false)]).unwrap();
    assert_eq!(reply[0..4], [1, 1, 0, 0], "the plan as it stands");
    assert_eq!(reply[4..], [0, 0, RETRY_HINT_US as i64, 0]);
    assert_eq!(h.take_writes(), []);
    // In shadow the full uploads refuse nothing, and take nothing.
    let reply = eval(&h, &keys, &[(plan, 1, false), (two, 1, true)]).unwrap();
    assert_eq!(reply[0], 1);
    assert_eq!(reply[4..], [0, 0, RETRY_HINT_US as i64, 0]);
    let writes = h.take_writes();
    let touched: BTreeSet<&str> = writes.iter().map(write_key).collect();
    assert_eq!(touched, BTreeSet::from([keys[0]]));
    assert_eq!(
        h.entry(keys[1]).map(|e| e.0),
        Some(zset(&[("1:1", held), ("2:1", held)]))
    );
}

#[test]
fn a_key_of_another_kind_holds_no_slots_and_is_replaced() {
    let k = "trt:up:{u}";
    let two = uploads(2, Duration::from_secs(30));
    let expiry = START_US + 30 * SECOND;
    for other in [
        Stored::Str((START_US + SECOND).to_string()),
        Stored::Str(format!("{START_US}:1")),
        strs(&[START_US]),
        Stored::WrongType,
    ] {
        let h = Harness::new(DECIDE_MIXED, START_US);
        h.set_raw(k, other.clone());
        assert_eq!(eval(&h, &[k], &[(two, 0, false)]), Ok(vec![1, 2, 0, 0]));
        assert_eq!(h.take_writes(), [], "{other:?}: a peek writes nothing");
        assert_eq!(eval(&h, &[k], &[(two, 2, false)]), Ok(vec![1, 0, 0, 0]));
        let writes = h.take_writes();
        assert_eq!(writes[0], Write::del(k), "{other:?}");
        assert_eq!(
            h.entry(k),
            Some((
                zset(&[("1:1", expiry), ("1:2", expiry)]),
                Some(START_US / 1000 + 30_000)
            ))
        );
    }
    // And the other kinds read a sorted set as no value.
    let h = Harness::new(DECIDE_MIXED, START_US);
    h.set_raw(k, zset(&[("1:1", START_US + SECOND)]));
    let window =
        Limit::Window(Window::new(2, Duration::from_secs(60)).unwrap());
    assert_eq!(eval(&h, &[k], &[(window, 0, false)]), Ok(vec![1, 2, 0, 0]));
    let day = Limit::Period(Period::new(5, PeriodUnit::Day, 0).unwrap());
    assert_eq!(eval(&h, &[k], &[(day, 0, false)]).unwrap()[..2], [1, 5]);
    let rate = Limit::Rate(Quota::per_minute(10));
    assert_eq!(eval(&h, &[k], &[(rate, 0, false)]), Ok(vec![1, 10, 0, 0]));
}

#[test]
fn a_pass_drops_the_expired_and_garbage_slots_a_peek_leaves_them() {
    let k = "trt:up:{u}";
    let three = uploads(3, Duration::from_secs(30));
    let h = Harness::new(DECIDE_MIXED, START_US);
    let mut slots: BTreeMap<String, f64> = BTreeMap::new();
    slots.insert("expired".into(), START_US as f64);
    slots.insert("live".into(), (START_US + 1) as f64);
    slots.insert("last".into(), MAX_TIME_US as f64);
    slots.insert("beyond".into(), (MAX_TIME_US + 2) as f64);
    slots.insert("forever".into(), f64::INFINITY);
    slots.insert("past".into(), f64::NEG_INFINITY);
    h.set_raw(k, Stored::ZSet(slots.clone()));
    // Two live: "live" and "last".
    assert_eq!(eval(&h, &[k], &[(three, 0, false)]), Ok(vec![1, 1, 0, 0]));
    assert_eq!(
        eval(&h, &[k], &[(three, 2, false)]),
        Ok(vec![0, 0, RETRY_HINT_US as i64, 0])
    );
    assert_eq!(h.take_writes(), []);
    assert_eq!(h.stored(k), Some(Stored::ZSet(slots)));
    assert_eq!(eval(&h, &[k], &[(three, 1, false)]), Ok(vec![1, 0, 0, 0]));
    assert_eq!(
        h.entry(k),
        Some((
            zset(&[
                ("live", START_US + 1),
                ("last", MAX_TIME_US),
                ("1:1", START_US + 30 * SECOND)
            ]),
            // Until the latest slot expires, rounded up to the ms.
            Some(START_US / 1000 + (MAX_TIME_US - START_US).div_ceil(1000))
        ))
    );
}

#[test]
fn a_lease_is_rounded_up_to_the_ms_and_may_not_end_past_2_to_the_53() {
    let k = "trt:up:{u}";
    let short = uploads(1, Duration::from_micros(1500));
    let h = Harness::new(DECIDE_MIXED, START_US + 1);
    assert_eq!(eval(&h, &[k], &[(short, 1, false)]), Ok(vec![1, 0, 0, 0]));
    assert_eq!(
        h.take_writes().last(),
        Some(&Write::Pexpire {
            key: k.into(),
            ms: 2
        })
    );
    // Held until START_US + 1501, and the key until its ms has passed.
    h.set_now(START_US + 1500);
    assert_eq!(eval(&h, &[k], &[(short, 0, false)]), Ok(vec![1, 0, 0, 0]));
    h.set_now(START_US + 1501);
    assert_eq!(eval(&h, &[k], &[(short, 0, false)]), Ok(vec![1, 1, 0, 0]));

    let h = Harness::new(DECIDE_MIXED, MAX_TIME_US - 10);
    let ends_at_max = uploads(1, Duration::from_micros(10));
    let beyond = uploads(1, Duration::from_micros(11));
    assert_eq!(eval(&h, &[k], &[(beyond, 0, false)]), Ok(vec![1, 1, 0, 0]));
    assert_error_reply(
        eval(&h, &[k], &[(beyond, 1, false)]),
        "decide_mixed: time values",
        "a lease ending past 2^53",
    );
    assert_eq!(h.take_writes(), []);
    assert_eq!(
        eval(&h, &[k], &[(ends_at_max, 1, false)]),
        Ok(vec![1, 0, 0, 0])
    );
    assert_eq!(h.entry(k).map(|e| e.0), Some(zset(&[("1:1", MAX_TIME_US)])));
}

#[test]
fn the_script_defines_no_function() {
    let code: String = DECIDE_MIXED
        .lines()
        .map(|line| line.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        !code.contains("function"),
        "decide_mixed.lua defines a function"
    );
    assert!(!code.contains("%.0f"), "decide_mixed.lua formats with %.0f");
}

// ---------------------------------------------------------------------------
// The calendar alone, over every time below 2^53.

/// March 1st, 00:00 UTC, in s since the epoch, of 1970, 2000, 2024, 2100,
/// 2200 and 2254.
const MARCH_1ST_S: [u64; 6] = [
    5_097_600,
    951_868_800,
    1_709_251_200,
    4_107_542_400,
    7_263_216_000,
    8_967_283_200,
];

fn unit_strategy() -> impl Strategy<Value = PeriodUnit> {
    prop::sample::select(vec![
        PeriodUnit::Day,
        PeriodUnit::Week,
        PeriodUnit::Month,
    ])
}

fn offset_strategy() -> impl Strategy<Value = i32> {
    prop_oneof![
        3 => Just(0),
        3 => -MAX_OFFSET_S..=MAX_OFFSET_S,
        2 => prop::sample::select(vec![
            -MAX_OFFSET_S, MAX_OFFSET_S, 19_800, 20_700, -28_800, -43_200, 50_400, 1, -1,
        ]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2048,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    /// A period's bounds at any time, and at its next start and 1 µs
    /// either side: the script's reply and record are gcra-core's.
    #[test]
    fn calendar_periods_agree_with_gcra_core(
        unit in unit_strategy(),
        offset in offset_strategy(),
        t in prop_oneof![
            3 => 0..=MAX_TIME_US,
            2 => START_US..=START_US + 400 * DAY,
            1 => 0..=400 * DAY,
            1 => MAX_TIME_US - 400 * DAY..=MAX_TIME_US + 1,
            // Around March 1st of years that are leap, not leap (2100,
            // 2200: centuries), or leap centuries (2000).
            2 => (prop::sample::select(MARCH_1ST_S.to_vec()), -40 * DAY as i64..=40 * DAY as i64)
                .prop_map(|(s, d)| (s * SECOND).saturating_add_signed(d)),
        ],
    ) {
        let period = Period::new(3, unit, offset).unwrap();
        let limit = Limit::Period(period);
        let k = "trt:p:{u}";
        let h = Harness::new(DECIDE_MIXED, t);
        let mut record = None;
        let mut times = vec![t, t];
        if let Ok(next) = period.next_start(t) {
            times.extend([next - 1, next, next + 1]);
        }
        for (step, now) in times.into_iter().enumerate() {
            h.set_now(now);
            let expected = period.check(record, now, 1);
            let reply = eval(&h, &[k], &[(limit, 1, false)]);
            let ctx = format!("step {step} at {now}: {record:?}");
            match expected {
                Ok(d) => {
                    prop_assert_eq!(decisions(&reply.unwrap()), vec![d.as_decision()], "{}", &ctx);
                    if let Some(w) = d.write {
                        record = Some((w.start_us, w.count));
                        prop_assert_eq!(
                            h.entry(k),
                            Some((Stored::Str(format!("{}:{}", w.start_us, w.count)), Some(now / 1000 + w.ttl_ms))),
                            "{}", &ctx
                        );
                    }
                }
                Err(_) => prop_assert!(matches!(reply, Err(ScriptError::Reply(_))), "{}: {:?}", &ctx, reply),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The property: random mixes, the script and gcra-core side by side.

#[derive(Debug, Clone)]
enum Advance {
    /// The clock moves by this much (saturating at 0).
    By(i64),
    /// To a boundary of the key `key % n`, `delta` µs off it: a window's
    /// entry (`pick`-th) expiry, a period's start, next or next-but-one
    /// start, a bucket's next pass or full. Stays put if there is none.
    To { key: usize, pick: usize, delta: i64 },
}

/// A value another client left in a key.
#[derive(Debug, Clone)]
enum Mess {
    /// lua_support's corruptions of a TAT.
    Tat(Corrupt),
    /// A value as it is.
    Raw(Stored),
    /// A list of `now + offset`, sorted or as drawn, maybe with a bad entry
    /// at a position.
    Log {
        offsets: Vec<i64>,
        sorted: bool,
        bad: Option<(usize, &'static str)>,
    },
    /// A record `start:count`, its start from an anchor (0: this period's
    /// start, 1: the next's, 2: the previous's; else an absolute value).
    Record {
        anchor: u8,
        delta: i64,
        absolute: u64,
        /// A u64: a count above u32::MAX is no record.
        count: u64,
    },
    /// A sorted set of slots: each member, scored `now + offset` or as
    /// given.
    Slots(Vec<(&'static str, SlotScore)>),
}

#[derive(Debug, Clone, Copy)]
enum SlotScore {
    Relative(i64),
    Absolute(f64),
}

impl Mess {
    fn apply(&self, h: &Harness, limit: &Limit, key: &str, now: u64) {
        let value = match self {
            Mess::Tat(c) => {
                c.apply(h, key, now);
                return;
            }
            Mess::Raw(v) => v.clone(),
            Mess::Log {
                offsets,
                sorted,
                bad,
            } => {
                let mut entries: Vec<u64> = offsets
                    .iter()
                    .map(|&o| now.saturating_add_signed(o))
                    .collect();
                if *sorted {
                    entries.sort_unstable();
                }
                let mut items: Vec<String> =
                    entries.iter().map(u64::to_string).collect();
                if let Some((at, s)) = bad {
                    items.insert(at % (items.len() + 1), (*s).to_owned());
                }
                Stored::List(items)
            }
            Mess::Record {
                anchor,
                delta,
                absolute,
                count,
            } => {
                let Limit::Period(period) = *limit else {
                    unreachable!("a record is drawn for a period's key only")
                };
                let start = match anchor {
                    0 => period.start_of(now).ok(),
                    1 => period.next_start(now).ok(),
                    2 => period.start_of(now).ok().and_then(|s| {
                        period.start_of(s.saturating_sub(1)).ok()
                    }),
                    _ => Some(*absolute),
                };
                let start =
                    start.unwrap_or(*absolute).saturating_add_signed(*delta);
                Stored::Str(format!("{start}:{count}"))
            }
            Mess::Slots(slots) if slots.is_empty() => {
                // Redis keeps no empty set: the key is gone.
                h.remove(key);
                return;
            }
            Mess::Slots(slots) => Stored::ZSet(
                slots
                    .iter()
                    .map(|&(member, score)| {
                        let score = match score {
                            SlotScore::Relative(o) => {
                                now.saturating_add_signed(o) as f64
                            }
                            SlotScore::Absolute(v) => v,
                        };
                        (member.to_owned(), score)
                    })
                    .collect(),
            ),
        };
        h.set_raw(key, value);
    }
}

#[derive(Debug, Clone)]
struct Step {
    advance: Advance,
    mess: Vec<Option<Mess>>,
    /// The keys of the decision, in order, with their cost and shadow flag.
    chosen: Vec<(usize, u32, bool)>,
    /// Each key's slot id, for a concurrency limit.
    ids: Vec<u64>,
}

#[derive(Debug, Clone)]
struct Case {
    limits: Vec<Limit>,
    start_us: u64,
    steps: Vec<Step>,
}

fn window_strategy() -> impl Strategy<Value = Window> {
    let limit =
        prop_oneof![6 => 1u32..=4, 3 => 5u32..=40, 1 => Just(MAX_WINDOW_LIMIT)];
    let window_us = prop_oneof![
        3 => 1u64..=2_000,
        3 => 2_000u64..=10_000_000,
        2 => 10_000_000u64..=100 * DAY,
        1 => Just(MAX_WINDOW_US),
        1 => 1u64..=MAX_WINDOW_US,
        // Where the expiry in ms rounds up, or does not.
        2 => prop::sample::select(vec![1, 999, 1000, 1001, 1999, 2001, 60_000_001, DAY + 1]),
    ];
    (limit, window_us)
        .prop_map(|(l, w)| Window::new(l, Duration::from_micros(w)).unwrap())
}

fn period_strategy() -> impl Strategy<Value = Period> {
    let limit = prop_oneof![
        6 => 1u32..=5,
        2 => 5u32..=1000,
        1 => Just(u32::MAX),
        1 => 1u32..=u32::MAX,
    ];
    (limit, unit_strategy(), offset_strategy())
        .prop_map(|(l, u, o)| Period::new(l, u, o).unwrap())
}

fn concurrency_strategy() -> impl Strategy<Value = Limit> {
    let limit = prop_oneof![
        6 => 1u32..=4,
        2 => 5u32..=40,
        1 => Just(u32::MAX),
        1 => 1u32..=u32::MAX,
    ];
    let lease_us = prop_oneof![
        3 => 1u64..=2_000,
        3 => 2_000u64..=60_000_000,
        1 => 60_000_000u64..=MAX_WINDOW_US,
        1 => Just(MAX_WINDOW_US),
        // Where the expiry in ms rounds up, or does not.
        2 => prop::sample::select(vec![1, 999, 1000, 1001, 1500, 30_000_000]),
    ];
    (limit, lease_us).prop_map(|(l, lease)| {
        Limit::Concurrency(
            Concurrency::new(l).unwrap(),
            Lease::new(Duration::from_micros(lease)).unwrap(),
        )
    })
}

fn limit_strategy() -> impl Strategy<Value = Limit> {
    prop_oneof![
        quota_strategy().prop_map(Limit::Rate),
        window_strategy().prop_map(Limit::Window),
        period_strategy().prop_map(Limit::Period),
        concurrency_strategy(),
    ]
}

/// The slot ids of the steps: few, so that a release or a second
/// acquisition meets an id's own members.
const IDS: [u64; 4] = [1, 2, 3, u64::MAX];

fn cost_strategy(limit: &Limit) -> BoxedStrategy<u32> {
    let most = match limit {
        Limit::Rate(q) => return cases::cost_strategy(*q).boxed(),
        Limit::Window(w) => w.limit(),
        Limit::Period(p) => p.limit(),
        // One member per unit: costs a test can hold.
        Limit::Concurrency(c, _) if c.limit() > 64 => {
            return prop_oneof![3 => 1..=64u32, 1 => Just(0u32)].boxed();
        }
        Limit::Concurrency(c, _) => c.limit(),
    };
    prop_oneof![
        6 => 1..=most,
        3 => Just(1u32),
        2 => Just(0u32),
        1 => Just(most),
        // Above the limit: the whole decision is an error.
        1 => Just(most.saturating_add(1)),
    ]
    .boxed()
}

/// Clock steps at the pace of a limit.
fn pace_strategy(limit: &Limit) -> BoxedStrategy<i64> {
    match limit {
        Limit::Rate(q) => advance_strategy(*q).boxed(),
        Limit::Window(w) => {
            let w = w.window_us() as i64;
            prop_oneof![0..=w, Just(w), Just(w - 1), -w..=0, 0..=3 * w].boxed()
        }
        Limit::Period(p) => {
            let length = match p.unit() {
                PeriodUnit::Day => DAY,
                PeriodUnit::Week => 7 * DAY,
                PeriodUnit::Month => 31 * DAY,
            } as i64;
            prop_oneof![0..=length, 0..=length / 24, -length..=0].boxed()
        }
        Limit::Concurrency(_, lease) => {
            let l = lease.lease_us() as i64;
            prop_oneof![
                0..=l,
                Just(l),
                Just(l - 1),
                0..=l / 3,
                -l..=0,
                0..=3 * l
            ]
            .boxed()
        }
    }
}

fn mess_strategy(limit: &Limit) -> BoxedStrategy<Option<Mess>> {
    let raw = prop_oneof![
        Just(Stored::WrongType),
        prop::sample::select(GARBAGE.to_vec())
            .prop_map(|s| Stored::Str(s.to_owned())),
        prop::sample::select(vec![
            "1:2:3",
            "01:2",
            "1:02",
            ":5",
            "5:",
            "-1:5",
            "5:-1",
            "1.5:2",
            "5:4294967296",
            "9007199254740993:1",
            "18446744073709551616:1",
            " 1:1",
            "1:1 ",
            "0:0",
            "1790947155000000",
        ])
        .prop_map(|s| Stored::Str(s.to_owned())),
        Just(Stored::List(vec![START_US.to_string()])),
    ]
    .prop_map(Mess::Raw);
    match limit {
        Limit::Rate(q) => prop_oneof![
            12 => corrupt_strategy(*q).prop_map(|c| c.map(Mess::Tat)),
            1 => raw.prop_map(Some),
        ]
        .boxed(),
        Limit::Window(w) => {
            let w = w.window_us() as i64;
            let offset = prop_oneof![
                3 => -3 * w..=w,
                2 => prop::sample::select(vec![-w, -w - 1, -w + 1, 0, -1, 1, w]),
            ];
            let bad = prop::sample::select(vec![
                "abc",
                "",
                "-1",
                "1.5",
                "05",
                " 5",
                "1e3",
                "9007199254740993",
                "9007199254740994",
                "18446744073709551616",
            ]);
            let log = (
                prop::collection::vec(offset, 1..=12),
                prop::bool::weighted(0.8),
                prop::option::weighted(0.2, (any::<usize>(), bad)),
            )
                .prop_map(|(offsets, sorted, bad)| Mess::Log {
                    offsets,
                    sorted,
                    bad,
                });
            prop_oneof![14 => Just(None), 2 => log.prop_map(Some), 1 => raw.prop_map(Some)]
                .boxed()
        }
        Limit::Period(p) => {
            let most = p.limit();
            let record = (
                0u8..=3,
                prop_oneof![3 => Just(0i64), 2 => -1i64..=1, 1 => -(DAY as i64)..=DAY as i64],
                prop::sample::select(vec![
                    0, MAX_TIME_US - 1, MAX_TIME_US, MAX_TIME_US + 1, u64::MAX,
                ]),
                prop_oneof![
                    3 => 0..=u64::from(most) + 2,
                    1 => Just(u64::from(most)),
                    1 => Just(u64::from(u32::MAX)),
                    1 => Just(u64::from(u32::MAX) + 1),
                    1 => Just(u64::MAX),
                ],
            )
                .prop_map(|(anchor, delta, absolute, count)| Mess::Record {
                    anchor,
                    delta,
                    absolute,
                    count,
                });
            prop_oneof![14 => Just(None), 2 => record.prop_map(Some), 1 => raw.prop_map(Some)]
                .boxed()
        }
        Limit::Concurrency(_, lease) => {
            let l = lease.lease_us() as i64;
            let member = prop::sample::select(vec![
                "1:1",
                "1:2",
                "2:1",
                "3:1",
                "3:2",
                "18446744073709551615:1",
                "",
                "x",
                "1",
                "1:1:1",
                "01:1",
            ]);
            let score = prop_oneof![
                4 => (-2 * l..=2 * l).prop_map(SlotScore::Relative),
                2 => prop::sample::select(vec![0, 1, -1, l, l + 1, -l])
                    .prop_map(SlotScore::Relative),
                1 => prop::sample::select(vec![
                    0.0,
                    MAX_TIME_US as f64,
                    (MAX_TIME_US - 1) as f64,
                    (MAX_TIME_US + 2) as f64,
                    f64::INFINITY,
                    f64::NEG_INFINITY,
                ])
                .prop_map(SlotScore::Absolute),
            ];
            let slots = prop::collection::vec((member, score), 0..=8)
                .prop_map(Mess::Slots);
            prop_oneof![14 => Just(None), 3 => slots.prop_map(Some), 1 => raw.prop_map(Some)]
                .boxed()
        }
    }
}

fn step_strategy(limits: Vec<Limit>) -> impl Strategy<Value = Step> {
    let n = limits.len();
    let mut paces: Vec<BoxedStrategy<i64>> =
        limits.iter().map(pace_strategy).collect();
    paces.push(
        prop_oneof![
            3 => Just(0i64),
            2 => 0..=1_000i64,
            2 => 0..=(HOUR as i64),
            1 => 0..=40 * DAY as i64,
            1 => -(DAY as i64)..=0,
        ]
        .boxed(),
    );
    let by = prop::strategy::Union::new(paces).prop_map(Advance::By);
    let to = (
        0..n,
        any::<usize>(),
        prop::sample::select(vec![-1000i64, -1, -1, 0, 0, 1, 1, 1000]),
    )
        .prop_map(|(key, pick, delta)| Advance::To { key, pick, delta });
    let advance = prop_oneof![3 => by, 2 => to];
    let mess: Vec<_> = limits.iter().map(mess_strategy).collect();
    let costs: Vec<_> = limits
        .iter()
        .map(|l| (cost_strategy(l), prop::bool::weighted(0.25)))
        .collect();
    let chosen = (subset(n), costs).prop_map(|(order, costs)| {
        order
            .into_iter()
            .map(|i| (i, costs[i].0, costs[i].1))
            .collect::<Vec<_>>()
    });
    let ids = prop::collection::vec(prop::sample::select(IDS.to_vec()), n);
    (advance, mess, chosen, ids).prop_map(|(advance, mess, chosen, ids)| Step {
        advance,
        mess,
        chosen,
        ids,
    })
}

fn case_strategy() -> impl Strategy<Value = Case> {
    prop::collection::vec(limit_strategy(), 1..=4).prop_flat_map(|limits| {
        (
            Just(limits.clone()),
            prop_oneof![
                6 => START_US..=START_US + 1_000_000_000_000,
                2 => 0..=MAX_TIME_US,
                1 => 0..=400 * DAY,
                1 => MAX_TIME_US - 400 * DAY..=MAX_TIME_US,
            ],
            prop::collection::vec(step_strategy(limits), 1..30),
        )
            .prop_map(|(limits, start_us, steps)| Case {
                limits,
                start_us,
                steps,
            })
    })
}

/// Where `advance` takes the clock from `now`.
fn target(
    h: &Harness,
    limits: &[Limit],
    keys: &[String],
    now: u64,
    advance: &Advance,
) -> u64 {
    let (k, pick, delta) = match *advance {
        Advance::By(d) => return now.saturating_add_signed(d),
        Advance::To { key, pick, delta } => (key % limits.len(), pick, delta),
    };
    let limit = &limits[k];
    let at = match (limit, handed(limit, h.stored(&keys[k]).as_ref())) {
        (Limit::Window(w), Handed::Log(log)) if !log.is_empty() => {
            Some(log[pick % log.len()].saturating_add(w.window_us()))
        }
        (Limit::Period(p), _) => match pick % 3 {
            0 => p.start_of(now).ok(),
            1 => p.next_start(now).ok(),
            _ => p
                .next_start(now)
                .ok()
                .and_then(|next| p.next_start(next).ok()),
        },
        (Limit::Concurrency(..), Handed::Slots(slots)) if !slots.is_empty() => {
            slots
                .values()
                .nth(pick % slots.len())
                .map(|&s| expiry_of(s))
        }
        (Limit::Rate(q), Handed::Tat(Some(tat))) => Some(if pick % 2 == 0 {
            tat
        } else {
            tat.saturating_add(q.emission_interval_us())
                .saturating_sub(q.burst_offset_us())
        }),
        _ => None,
    };
    at.map_or(now, |at| at.saturating_add_signed(delta))
}

/// One decision through the script and through gcra-core.
fn check_step(
    h: &Harness,
    limits: &[Limit],
    keys: &[String],
    ids: &[u64],
    now: u64,
    chosen: &[(usize, u32, bool)],
    ctx: &str,
) -> Result<(), TestCaseError> {
    let handed_all: Vec<Handed> = limits
        .iter()
        .zip(keys)
        .map(|(l, k)| handed(l, h.stored(k).as_ref()))
        .collect();
    let before: Vec<_> = keys.iter().map(|k| h.entry(k)).collect();
    let call_keys: Vec<&str> =
        chosen.iter().map(|&(i, ..)| keys[i].as_str()).collect();
    let calls: Vec<(Limit, u32, bool)> =
        chosen.iter().map(|&(i, c, s)| (limits[i], c, s)).collect();
    let call_ids: Vec<u64> = chosen.iter().map(|&(i, ..)| ids[i]).collect();
    let reply = eval_ids(h, &call_keys, &calls, &call_ids);
    let writes = h.take_writes();
    let ctx = format!("{ctx}, ids {ids:?}, handed {handed_all:?}");

    let expected = combine(limits, &handed_all, ids, now, chosen);
    // Over rates alone the combination is check_all's.
    if chosen
        .iter()
        .all(|&(i, ..)| matches!(limits[i], Limit::Rate(_)))
    {
        let charges: Vec<Charge> = chosen
            .iter()
            .map(|&(i, cost, shadow)| match limits[i] {
                Limit::Rate(quota) => Charge {
                    quota,
                    cost,
                    shadow,
                },
                _ => unreachable!(),
            })
            .collect();
        let stored: Vec<Option<u64>> = chosen
            .iter()
            .map(|&(i, ..)| match handed_all[i] {
                Handed::Tat(t) => t,
                _ => unreachable!(),
            })
            .collect();
        let mut out = vec![Decision::default(); chosen.len()];
        match (check_all(&charges, &stored, now, &mut out), &expected) {
            (Ok(verdict), Ok(e)) => {
                prop_assert_eq!(verdict, e.verdict, "{}", &ctx);
                let reply: Vec<Decision> = out
                    .iter()
                    .map(|d| Decision { store: None, ..*d })
                    .collect();
                prop_assert_eq!(&reply, &e.reply, "{}", &ctx);
                let stores: Vec<(usize, Change)> = chosen
                    .iter()
                    .zip(&out)
                    .filter_map(|(&(i, ..), d)| {
                        d.store.map(|s| (i, Change::Tat(s)))
                    })
                    .collect();
                prop_assert_eq!(&stores, &e.writes, "{}", &ctx);
            }
            (Err(_), Err(_)) => {}
            (all, mixed) => prop_assert!(
                false,
                "{}: check_all {:?}, combined {:?}",
                &ctx,
                all,
                mixed
            ),
        }
    }

    match expected {
        Ok(e) => {
            let reply = reply.map_err(|err| {
                TestCaseError::fail(format!("{ctx}: {err:?}"))
            })?;
            let got = decisions(&reply);
            prop_assert_eq!(&got, &e.reply, "{}", &ctx);
            prop_assert_eq!(
                Verdict::of(chosen.iter().map(|c| c.2), &got),
                e.verdict,
                "{}",
                &ctx
            );
            for (k, key) in keys.iter().enumerate() {
                let want = match e.writes.iter().find(|(i, _)| *i == k) {
                    Some((_, change)) => {
                        Some(written(&handed_all[k], change, now))
                    }
                    None => before[k].clone(),
                };
                prop_assert_eq!(h.entry(key), want, "{}: key {}", &ctx, k);
            }
            let touched: BTreeSet<&str> =
                writes.iter().map(write_key).collect();
            let asked: BTreeSet<&str> =
                e.writes.iter().map(|(i, _)| keys[*i].as_str()).collect();
            prop_assert_eq!(touched, asked, "{}: {:?}", &ctx, writes);
        }
        Err(err) => {
            prop_assert!(
                matches!(reply, Err(ScriptError::Reply(_))),
                "{}: gcra-core says {:?}, the script {:?}",
                &ctx,
                err,
                reply
            );
            prop_assert_eq!(&writes, &[], "{}", &ctx);
        }
    }
    Ok(())
}

fn run_case(case: &Case) -> Result<(), TestCaseError> {
    let n = case.limits.len();
    let keys: Vec<String> = names(n).iter().map(key).collect();
    let limits = &case.limits;
    let h = Harness::new(DECIDE_MIXED, case.start_us);
    let mut now = case.start_us;
    for (s, step) in case.steps.iter().enumerate() {
        // The clock, kept within reach of 2^53 so that it can come back.
        let next = target(&h, limits, &keys, now, &step.advance)
            .min(MAX_TIME_US + 1000);
        let before: Vec<Option<Stored>> =
            keys.iter().map(|k| h.stored(k)).collect();
        h.set_now(next);
        now = next;
        // Redis expires a key only once it no longer counts.
        for (k, old) in before.iter().enumerate() {
            if let Some(old) = old
                && h.stored(&keys[k]).is_none()
            {
                let limit = &limits[k];
                let old = handed(limit, Some(old));
                let absent = handed(limit, None);
                if let (Ok(was), Ok(gone)) = (
                    decide(limit, &old, now, 0, 1),
                    decide(limit, &absent, now, 0, 1),
                ) {
                    prop_assert_eq!(
                        was,
                        gone,
                        "step {}: key {} expired at {} while it counted: {:?}",
                        s,
                        k,
                        now,
                        old
                    );
                }
            }
        }
        for (k, mess) in step.mess.iter().enumerate() {
            if let Some(mess) = mess {
                mess.apply(&h, &limits[k], &keys[k], now);
            }
        }
        h.take_writes();
        let ctx = format!(
            "step {s}: now {now}, limits {limits:?}, {:?}",
            step.chosen
        );
        check_step(&h, limits, &keys, &step.ids, now, &step.chosen, &ctx)?;
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
    fn decide_mixed_agrees_with_gcra_core(case in case_strategy()) {
        run_case(&case)?;
    }
}
