//! Windows, periods and concurrency limits in `PostgresStorage`, beside
//! rates, on a real PostgreSQL.
//!
//! - The property test drives `<table>_decide_mixed_at` (the function the
//!   store calls, with the time as a parameter) against gcra-core's kinds of
//!   limit (`Quota`, `Window`, `Period`, `Concurrency` over `Lease`)
//!   decided as one the way its crate docs say ("Several kinds in one
//!   decision"): random sequences of decisions over 1 to 4 keys of random
//!   kinds, costs from 0 to above the limit, shadow flags, clock steps that
//!   land on an entry's expiry, a period's start, a slot's expiry or a
//!   bucket's next pass (and 1 µs either side), starts around month ends
//!   and leap Februaries, rows of another kind or not what the store
//!   writes, decisions of rates alone sent the way the store sends them
//!   (the one-bucket statement, then `<table>_check_at`), releases and
//!   renewals of slots by id (`<table>_release_at`, `<table>_renew_at`,
//!   against a model of (id, units, expiry) per key), and the cleanup at
//!   the step's time. Each step requires the same reply field by field and
//!   exactly the rows gcra-core asks for (TAT, log, record, slots, expiry,
//!   and the columns a write clears), nothing else; and a row the cleanup
//!   removes must read the same as no row.
//! - The store itself: exact counts under concurrency across two
//!   instances, all or nothing across kinds, what a caller that stops
//!   waiting leaves charged, the migration of a table of rates only, the
//!   expiry and cleanup of windows and periods, `supports`.
//!
//! Run with `cargo xtask test-redis -- -p rate-tier-storage --test
//! postgres_kinds` (or `cargo xtask test`), which starts a throwaway
//! PostgreSQL and sets `TRT_POSTGRES_URL`.
#![allow(clippy::unwrap_used)]

mod cases;
mod lua_support;
mod postgres_support;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cases::{USER, decisions, key, names, subset};
use gcra_core::{
    Charge, CheckError, Concurrency, Decision, Lease, LogWrite, MAX_OFFSET_S,
    MAX_TIME_US, MAX_WINDOW_LIMIT, MAX_WINDOW_US, Period, PeriodUnit,
    PeriodWrite, Quota, StoreTat, Verdict, Window,
};
use lua_support::{START_US, advance_strategy, quota_strategy};
use postgres_support::runtime;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use rate_tier_storage::StorageExt;
use rate_tier_storage::{
    BucketCheck, KeyLayout, LimitName, PostgresStorage, Rule, RuleKind,
    Storage, StorageError,
};
use rate_tier_test_support::{env, unique};
use tokio_postgres::{Client, NoTls};

const SECOND: u64 = 1_000_000;
const HOUR: u64 = 3600 * SECOND;
const DAY: u64 = 24 * HOUR;

/// March 1st, 00:00 UTC, in s since the epoch, of 1970, 2000 (a leap
/// century), 2024 (a leap year), 2025, 2100 and 2200 (centuries, not leap)
/// and 2254.
const MARCH_1ST_S: [u64; 7] = [
    5_097_600,
    951_868_800,
    1_709_251_200,
    1_740_787_200,
    4_107_542_400,
    7_263_216_000,
    8_967_283_200,
];

// ---------------------------------------------------------------------------
// The limits, their arguments, and what the store hands gcra-core.

#[derive(Debug, Clone, Copy)]
enum Limit {
    Rate(Quota),
    Window(Window),
    Period(Period),
    /// A concurrency limit, its slots taken for this lease.
    Slots(Concurrency, Lease),
}

/// The lease the tests give the other kinds' checks (which ignore it).
const ANY_LEASE_US: u64 = 30 * SECOND;

impl Limit {
    fn rule(&self) -> Rule {
        match *self {
            Limit::Rate(q) => Rule::Rate(q),
            Limit::Window(w) => Rule::Window(w),
            Limit::Period(p) => Rule::Period(p),
            Limit::Slots(c, _) => Rule::Concurrency(c),
        }
    }

    /// The mixed function's 6 arguments of a check of the slots' `id`
    /// (ignored by the other kinds): the store's own
    /// (`PostgresStorage::mixed_args`), or the same layout by hand for a
    /// cost above the limit, which a `BucketCheck` cannot hold.
    fn args(
        &self,
        name: &LimitName,
        cost: u32,
        shadow: bool,
        id: u64,
    ) -> [i64; 6] {
        let (tag, a, b, c) = match self {
            Limit::Rate(q) => (
                0,
                q.emission_interval_us(),
                q.burst_offset_us(),
                q.max_debt_us() as i64,
            ),
            Limit::Window(w) => (1, u64::from(w.limit()), w.window_us(), 0),
            Limit::Period(p) => {
                let unit = match p.unit() {
                    PeriodUnit::Day => 0,
                    PeriodUnit::Week => 1,
                    PeriodUnit::Month => 2,
                };
                (2, u64::from(p.limit()), unit, i64::from(p.offset_s()))
            }
            Limit::Slots(c, lease) => (
                3,
                u64::from(c.limit()),
                lease.lease_us(),
                PostgresStorage::slot_id(id),
            ),
        };
        let by_hand = [
            tag,
            a as i64,
            b as i64,
            c,
            i64::from(cost),
            i64::from(shadow),
        ];
        if let Ok(check) = BucketCheck::of_rule(name, USER, self.rule(), cost) {
            let lease = match self {
                Limit::Slots(_, lease) => lease.lease_us(),
                _ => ANY_LEASE_US,
            };
            let check = check.shadow(shadow).lease_id(id);
            let args = PostgresStorage::mixed_args(&check, lease).unwrap();
            assert_eq!(args, by_hand, "the store's arguments of {self:?}");
        }
        by_hand
    }
}

/// A row as the test reads it back: `log_us` and `slots` as PostgreSQL
/// prints them, so that their bounds and dimensions are compared too.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    tat: i64,
    expires: i64,
    log: Option<String>,
    start: Option<i64>,
    count: Option<i64>,
    slots: Option<String>,
}

/// One slot of a concurrency limit as a row keeps it: its id, its units
/// and its expiry (µs).
type Slot = [i64; 3];

/// What the model keeps of a row: the row, the log it holds if it is one
/// (the store's reading of `log_us`: one dimension, no NULL, no negative
/// entry), the slots it holds if it is slots (the store's reading of
/// `slots`: one dimension, no NULL, triples), and whether the store wrote
/// it (the cleanup test's concern).
#[derive(Debug, Clone)]
struct Kept {
    row: Row,
    log: Option<Vec<u64>>,
    slots: Option<Vec<Slot>>,
    by_store: bool,
}

/// What gcra-core is handed for a key.
#[derive(Debug, Clone, PartialEq)]
enum Handed {
    Tat(Option<u64>),
    Log(Vec<u64>),
    Record(Option<(u64, u32)>),
    /// Every slot of the row, live or not.
    Slots(Vec<Slot>),
}

/// A slot still held at `now`: its expiry live by `Lease::live`, and 1 to
/// `u32::MAX` units (anything else is no slot, dropped by a write).
fn live(slot: &Slot, now: u64) -> bool {
    (1..=i64::from(u32::MAX)).contains(&slot[1])
        && u64::try_from(slot[2]).is_ok_and(|e| Lease::live(&[e], now) == 1)
}

fn slots_text(slots: &[Slot]) -> String {
    let items: Vec<String> =
        slots.iter().flatten().map(i64::to_string).collect();
    format!("{{{}}}", items.join(","))
}

/// The store's reading rules (migration.sql, the table's comment): a rate
/// reads a TAT of 0 or more; a window the log of a row marked -1; a period
/// the record of a row marked -2 with a start of 0 or more and a count of
/// a u32; a concurrency limit the slots of a row marked -3. Anything else
/// is absent.
fn handed(limit: &Limit, kept: Option<&Kept>) -> Handed {
    let row = kept.map(|k| &k.row);
    match limit {
        Limit::Rate(_) => {
            Handed::Tat(row.and_then(|r| u64::try_from(r.tat).ok()))
        }
        Limit::Window(_) => Handed::Log(
            kept.filter(|k| k.row.tat == -1)
                .and_then(|k| k.log.clone())
                .unwrap_or_default(),
        ),
        Limit::Period(_) => Handed::Record(row.and_then(|r| {
            if r.tat != -2 {
                return None;
            }
            Some((u64::try_from(r.start?).ok()?, u32::try_from(r.count?).ok()?))
        })),
        Limit::Slots(..) => Handed::Slots(
            kept.filter(|k| k.row.tat == -3)
                .and_then(|k| k.slots.clone())
                .unwrap_or_default(),
        ),
    }
}

/// The write gcra-core asks of the store for one limit.
#[derive(Debug, Clone, PartialEq)]
enum Change {
    Tat(StoreTat),
    Log(LogWrite),
    Record(PeriodWrite),
    /// The slots the row holds next: the live ones, then the request's.
    Slots(Vec<Slot>),
}

/// One limit decided alone (a cost of 0 is a peek, for every kind), a
/// concurrency limit's slots taken under `id`.
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
        (Limit::Slots(c, lease), Handed::Slots(slots)) => {
            // The store's range of time, for every kind (acquire itself
            // takes no time).
            if now > MAX_TIME_US {
                return Err(CheckError::TimeOutOfRange);
            }
            let live: Vec<Slot> =
                slots.iter().filter(|s| live(s, now)).copied().collect();
            let held: u64 = live.iter().map(|s| s[1] as u64).sum();
            let d = c.acquire(u32::try_from(held).unwrap_or(u32::MAX), cost)?;
            let change = match d.write {
                None => None,
                Some(count) => {
                    assert_eq!(u64::from(count), held + u64::from(cost));
                    let mut next = live;
                    next.push([
                        PostgresStorage::slot_id(id),
                        i64::from(cost),
                        us(lease.expiry(now)?),
                    ]);
                    Some(Change::Slots(next))
                }
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
    now: u64,
    chosen: &[(usize, u32, bool)],
    ids: &[u64],
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

fn log_text(log: &[u64]) -> String {
    let items: Vec<String> = log.iter().map(u64::to_string).collect();
    format!("{{{}}}", items.join(","))
}

fn us(v: u64) -> i64 {
    i64::try_from(v).unwrap()
}

/// The row after the store applied `change` at `now`. `whole`: a write of
/// the mixed function, which clears the other kinds' columns; else a rate's
/// write by the one-bucket statement or the check function, which sets the
/// TAT and the expiry and leaves the rest of a row as it was.
fn written(
    before: Option<&Kept>,
    handed: &Handed,
    change: &Change,
    now: u64,
    whole: bool,
) -> Kept {
    let expires = |ttl_ms: u64| us(now + ttl_ms * 1000);
    let blank = |tat, expires| Row {
        tat,
        expires,
        log: None,
        start: None,
        count: None,
        slots: None,
    };
    match (change, handed) {
        (Change::Tat(s), _) => {
            let (tat, expires) = (us(s.tat_us), expires(s.ttl_ms));
            match before {
                Some(old) if !whole => Kept {
                    row: Row {
                        tat,
                        expires,
                        ..old.row.clone()
                    },
                    log: old.log.clone(),
                    slots: old.slots.clone(),
                    by_store: true,
                },
                _ => Kept {
                    row: blank(tat, expires),
                    log: None,
                    slots: None,
                    by_store: true,
                },
            }
        }
        (Change::Log(w), Handed::Log(log)) => {
            let log = apply_log(log, w);
            Kept {
                row: Row {
                    log: Some(log_text(&log)),
                    ..blank(-1, expires(w.ttl_ms))
                },
                log: Some(log),
                slots: None,
                by_store: true,
            }
        }
        (Change::Record(w), _) => Kept {
            row: Row {
                start: Some(us(w.start_us)),
                count: Some(i64::from(w.count)),
                ..blank(-2, expires(w.ttl_ms))
            },
            log: None,
            slots: None,
            by_store: true,
        },
        // The row's expiry: its latest slot's.
        (Change::Slots(slots), _) => Kept {
            row: Row {
                slots: Some(slots_text(slots)),
                ..blank(-3, slots.iter().map(|s| s[2]).max().unwrap())
            },
            log: None,
            slots: Some(slots.clone()),
            by_store: true,
        },
        _ => unreachable!("a log write for another kind"),
    }
}

// ---------------------------------------------------------------------------
// The database.

/// An error with the database's message (the function's `RAISE`).
fn message(error: tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{error}: {}", db.message()),
        None => error.to_string(),
    }
}

/// The case's keys, limits and rows, in PostgreSQL and in the model.
struct World {
    db: Client,
    table: String,
    names: Vec<LimitName>,
    keys: Vec<String>,
    limits: Vec<Limit>,
    model: BTreeMap<String, Kept>,
    /// Steps through the mixed function, rates-only steps through the rate
    /// statements, rows the cleanup removed, slots taken, releases and
    /// renewals that found slots of their id: the run must see each.
    seen: std::cell::Cell<[u64; 5]>,
}

impl World {
    fn count(&self, what: usize) {
        let mut seen = self.seen.get();
        seen[what] += 1;
        self.seen.set(seen);
    }

    async fn rows(&self) -> BTreeMap<String, Row> {
        self.db
            .query(
                &format!(
                    "SELECT key, tat_us, expires_us, log_us::text, period_start_us, \
                     period_count, slots::text FROM {}",
                    self.table
                ),
                &[],
            )
            .await
            .unwrap()
            .into_iter()
            .map(|r| {
                (
                    r.get(0),
                    Row {
                        tat: r.get(1),
                        expires: r.get(2),
                        log: r.get(3),
                        start: r.get(4),
                        count: r.get(5),
                        slots: r.get(6),
                    },
                )
            })
            .collect()
    }

    fn expected_rows(&self) -> BTreeMap<String, Row> {
        self.model
            .iter()
            .map(|(k, kept)| (k.clone(), kept.row.clone()))
            .collect()
    }

    /// Writes a row as another client (or another kind) left it.
    async fn put(&mut self, k: usize, kept: Kept) {
        let r = &kept.row;
        self.db
            .execute(
                &format!(
                    "INSERT INTO {} VALUES ($1, $2, $3, $4::text::int8[], $5, $6, \
                     $7::text::int8[]) \
                     ON CONFLICT (key) DO UPDATE SET tat_us = excluded.tat_us, \
                     expires_us = excluded.expires_us, log_us = excluded.log_us, \
                     period_start_us = excluded.period_start_us, \
                     period_count = excluded.period_count, slots = excluded.slots",
                    self.table
                ),
                &[
                    &self.keys[k],
                    &r.tat,
                    &r.expires,
                    &r.log,
                    &r.start,
                    &r.count,
                    &r.slots,
                ],
            )
            .await
            .unwrap();
        self.model.insert(self.keys[k].clone(), kept);
    }

    async fn remove(&mut self, k: usize) {
        self.db
            .execute(
                &format!("DELETE FROM {} WHERE key = $1", self.table),
                &[&self.keys[k]],
            )
            .await
            .unwrap();
        self.model.remove(&self.keys[k]);
    }

    /// The mixed function at `now`.
    async fn mixed(
        &self,
        keys: &[String],
        args: &[i64],
        now: u64,
    ) -> Result<Vec<i64>, String> {
        let sql = PostgresStorage::mixed_sql(&self.table, true).unwrap();
        let now = i64::try_from(now).unwrap();
        self.db
            .query_one(&sql, &[&keys, &args, &now])
            .await
            .map(|row| row.get(0))
            .map_err(message)
    }

    /// A decision of rates alone as the store sends it: one enforced
    /// bucket to the one-bucket statement first, which answers only when
    /// it passes; anything else to the check function.
    async fn rates(
        &self,
        keys: &[String],
        args: &[i64],
        now: u64,
    ) -> Result<Vec<i64>, String> {
        let now = i64::try_from(now).unwrap();
        if let ([key], &[t, tau, cost, 0, _]) = (keys, args)
            && cost > 0
        {
            let sql =
                PostgresStorage::one_bucket_sql(&self.table, true).unwrap();
            let row = self
                .db
                .query_opt(&sql, &[key, &t, &tau, &cost, &now])
                .await
                .map_err(message)?;
            if let Some(row) = row {
                return Ok(row.get(0));
            }
        }
        self.db
            .query_one(
                &format!(
                    "SELECT {}_check_at($1::text[], $2::int8[], $3)",
                    self.table
                ),
                &[&keys, &args, &now],
            )
            .await
            .map(|row| row.get(0))
            .map_err(message)
    }

    /// The store's cleanup at `now`: first, every row it may remove that
    /// the store wrote must read as no row, for its own kind.
    async fn cleanup(&mut self, now: u64) -> Result<(), TestCaseError> {
        for (k, key) in self.keys.iter().enumerate() {
            let Some(kept) = self.model.get(key) else {
                continue;
            };
            if !kept.by_store || kept.row.expires > us(now) {
                continue;
            }
            let limit = &self.limits[k];
            let was = decide(limit, &handed(limit, Some(kept)), now, 0, 0);
            let gone = decide(limit, &handed(limit, None), now, 0, 0);
            if let (Ok(was), Ok(gone)) = (was, gone) {
                prop_assert_eq!(
                    was.0,
                    gone.0,
                    "key {} expired at {} while it counted: {:?}",
                    k,
                    now,
                    kept
                );
            }
        }
        let sql = PostgresStorage::cleanup_sql(&self.table, true).unwrap();
        let removed =
            self.db.execute(&sql, &[&1000i64, &us(now)]).await.unwrap();
        let before = self.model.len();
        self.model.retain(|_, kept| kept.row.expires > us(now));
        prop_assert_eq!(removed, (before - self.model.len()) as u64);
        for _ in 0..removed {
            self.count(2);
        }
        Ok(())
    }

    /// A release or a renewal of one key's slots at `now`, through the
    /// function and the model.
    async fn slot_op(
        &mut self,
        op: &SlotOp,
        now: u64,
        ctx: &str,
    ) -> Result<(), TestCaseError> {
        // Mostly a concurrency limit's key, if there is one.
        let n = self.keys.len();
        let slots: Vec<usize> = (0..n)
            .filter(|&k| matches!(self.limits[k], Limit::Slots(..)))
            .collect();
        let k = if slots.is_empty() || op.key.is_multiple_of(4) {
            op.key % n
        } else {
            slots[op.key / 4 % slots.len()]
        };
        let key = self.keys[k].clone();
        let sql =
            PostgresStorage::slots_sql(&self.table, op.renew, true).unwrap();
        let args = [PostgresStorage::slot_id(op.id), op.v];
        let reply: Result<Vec<i64>, String> = self
            .db
            .query_one(
                &sql,
                &[&std::slice::from_ref(&key), &&args[..], &us(now)],
            )
            .await
            .map(|row| row.get(0))
            .map_err(message);
        let ctx = format!("{ctx}, {op:?} on {:?}", self.model.get(&key));
        match slots_op(self.model.get(&key), op, now) {
            Ok((units, next)) => {
                let reply = reply.map_err(|err| {
                    TestCaseError::fail(format!("{ctx}: {err}"))
                })?;
                prop_assert_eq!(reply, vec![units], "{}", &ctx);
                if units > 0 {
                    self.count(4);
                }
                match next {
                    None => {}
                    Some(None) => {
                        self.model.remove(&key);
                    }
                    Some(Some(kept)) => {
                        self.model.insert(key, kept);
                    }
                }
            }
            Err(()) => {
                prop_assert!(reply.is_err(), "{}: {:?}", &ctx, reply);
            }
        }
        prop_assert_eq!(self.rows().await, self.expected_rows(), "{}", &ctx);
        Ok(())
    }
}

/// A release (`v` units at most) or a renewal (for a lease of `v` µs) of
/// the slots of `id` on a key picked by `key` (see `World::slot_op`).
#[derive(Debug, Clone)]
struct SlotOp {
    key: usize,
    id: u64,
    renew: bool,
    v: i64,
}

/// What `<table>_release_at` and `<table>_renew_at` must do (migration.sql):
/// the units given back or renewed, and the row next (`None`: unchanged,
/// `Some(None)`: deleted); `Err` for arguments or a time out of range.
/// A release gives back at most `v` units of the id's live slots, the
/// earliest taken first; a renewal sets their expiry to now + `v`; either
/// drops the slots that are no longer live, and writes only a row it
/// changes, leaving its other columns.
#[allow(clippy::type_complexity)]
fn slots_op(
    kept: Option<&Kept>,
    op: &SlotOp,
    now: u64,
) -> Result<(i64, Option<Option<Kept>>), ()> {
    let valid = if op.renew {
        (1..=us(MAX_WINDOW_US)).contains(&op.v)
    } else {
        (0..=i64::from(u32::MAX)).contains(&op.v)
    };
    if !valid || now > MAX_TIME_US {
        return Err(());
    }
    let renewed_to = us(now) + op.v;
    if op.renew {
        let lease = Lease::new(Duration::from_micros(op.v as u64)).unwrap();
        lease.expiry(now).map_err(drop)?;
    }
    let Some(kept) = kept.filter(|k| k.row.tat == -3) else {
        return Ok((0, None));
    };
    let Some(slots) = &kept.slots else {
        return Ok((0, None));
    };
    let id = PostgresStorage::slot_id(op.id);
    let (mut left, mut units_done, mut changed) = (op.v, 0, false);
    let mut next = Vec::new();
    for slot in slots {
        if !live(slot, now) {
            changed = true;
            continue;
        }
        let [slot_id, mut units, mut expiry] = *slot;
        if slot_id == id {
            if op.renew {
                units_done += units;
                changed |= expiry != renewed_to;
                expiry = renewed_to;
            } else if left > 0 {
                let give = units.min(left);
                (left, units, units_done) =
                    (left - give, units - give, units_done + give);
                changed = true;
            }
        }
        if units > 0 {
            next.push([slot_id, units, expiry]);
        }
    }
    if !changed {
        return Ok((units_done, None));
    }
    if next.is_empty() {
        return Ok((units_done, Some(None)));
    }
    let row = Row {
        expires: next.iter().map(|s| s[2]).max().unwrap(),
        slots: Some(slots_text(&next)),
        ..kept.row.clone()
    };
    Ok((
        units_done,
        Some(Some(Kept {
            row,
            log: kept.log.clone(),
            slots: Some(next),
            by_store: true,
        })),
    ))
}

// ---------------------------------------------------------------------------
// The property: random mixes, the function and gcra-core side by side.

#[derive(Debug, Clone)]
enum Advance {
    /// The clock moves by this much (saturating at 0).
    By(i64),
    /// To a boundary of the key `key % n`, `delta` µs off it: a window's
    /// entry (`pick`-th) expiry, a period's start, next or next-but-one
    /// start, a bucket's next pass or full. Stays put if there is none.
    To { key: usize, pick: usize, delta: i64 },
}

/// A row another client, or a limit of another kind, left in a key.
#[derive(Debug, Clone)]
enum Mess {
    /// A rate's row, `tat` from now (a negative value: a corrupt one, no
    /// TAT), maybe with another kind's columns left in it.
    Rate {
        offset: i64,
        absolute: Option<i64>,
        stale: bool,
    },
    /// A window's row of `now + offset` entries, sorted or as drawn, maybe
    /// not a log: a NULL or negative entry, two dimensions, other bounds.
    Log {
        offsets: Vec<i64>,
        sorted: bool,
        twist: u8,
        mark: i64,
    },
    /// A period's record, its start from an anchor (0: this period's
    /// start, 1: the next's, 2: the previous's; else an absolute value).
    Record {
        anchor: u8,
        delta: i64,
        absolute: i64,
        count: Option<i64>,
        mark: i64,
    },
    /// Slots of (id, units, expiry from now), maybe not triples: a NULL
    /// entry, two dimensions, a length not a multiple of 3, other bounds.
    Slots {
        entries: Vec<(u64, i64, i64)>,
        twist: u8,
        mark: i64,
    },
    /// No row.
    Gone,
}

impl Mess {
    /// The row, and the log the store reads in it.
    fn row(&self, limit: &Limit, now: u64) -> Option<Kept> {
        let expires = us(now) + 3_600_000_000;
        let row = |tat| Row {
            tat,
            expires,
            log: None,
            start: None,
            count: None,
            slots: None,
        };
        Some(match self {
            Mess::Gone => return None,
            Mess::Rate {
                offset,
                absolute,
                stale,
            } => {
                let tat = absolute.unwrap_or(us(now) + offset);
                let mut r = row(tat);
                let slot = [1, 1, us(now) + 1000];
                if *stale {
                    r.log = Some(format!("{{{}}}", us(now)));
                    r.start = Some(0);
                    r.count = Some(1);
                    r.slots = Some(slots_text(&[slot]));
                }
                // The stale log is a log, the stale slot a slot: a mark of
                // -1 makes the row a window's, -3 slots.
                Kept {
                    row: r,
                    log: stale.then(|| vec![now]),
                    slots: stale.then(|| vec![slot]),
                    by_store: false,
                }
            }
            Mess::Log {
                offsets,
                sorted,
                twist,
                mark,
            } => {
                let mut entries: Vec<i64> = offsets
                    .iter()
                    .map(|&o| us(now).saturating_add(o).max(0))
                    .collect();
                if *sorted {
                    entries.sort_unstable();
                }
                let items: Vec<String> =
                    entries.iter().map(i64::to_string).collect();
                let as_log: Vec<u64> =
                    entries.iter().map(|&e| e as u64).collect();
                let (text, log) = match twist {
                    // A NULL entry, a negative one: no log.
                    1 => (format!("{{{},NULL}}", items.join(",")), None),
                    2 => (format!("{{-5,{}}}", items.join(",")), None),
                    // Two dimensions: no log.
                    3 => {
                        (format!("{{{{{}}},{{{}}}}}", items[0], items[0]), None)
                    }
                    // Subscripts from 0: a log all the same.
                    4 => (
                        format!(
                            "[0:{}]={{{}}}",
                            items.len() - 1,
                            items.join(",")
                        ),
                        Some(as_log),
                    ),
                    // Entries beyond 2^53: garbage, dropped by a write.
                    5 => {
                        let mut log = as_log;
                        log.sort_unstable();
                        log.extend([MAX_TIME_US + 1, u64::MAX >> 1]);
                        (log_text(&log), Some(log))
                    }
                    // Empty.
                    6 => ("{}".to_owned(), Some(Vec::new())),
                    _ => (log_text(&as_log), Some(as_log)),
                };
                Kept {
                    row: Row {
                        log: Some(text),
                        ..row(*mark)
                    },
                    log,
                    slots: None,
                    by_store: false,
                }
            }
            Mess::Record {
                anchor,
                delta,
                absolute,
                count,
                mark,
            } => {
                let start = match (limit, anchor) {
                    (Limit::Period(p), 0) => p.start_of(now).ok(),
                    (Limit::Period(p), 1) => p.next_start(now).ok(),
                    (Limit::Period(p), 2) => p
                        .start_of(now)
                        .ok()
                        .and_then(|s| p.start_of(s.saturating_sub(1)).ok()),
                    _ => None,
                };
                let start = start.map_or(*absolute, us).saturating_add(*delta);
                Kept {
                    row: Row {
                        start: Some(start),
                        count: *count,
                        ..row(*mark)
                    },
                    log: None,
                    slots: None,
                    by_store: false,
                }
            }
            Mess::Slots {
                entries,
                twist,
                mark,
            } => {
                let mut slots: Vec<Slot> = entries
                    .iter()
                    .map(|&(id, units, offset)| {
                        let expiry = us(now).saturating_add(offset);
                        [PostgresStorage::slot_id(id), units, expiry]
                    })
                    .collect();
                let items: Vec<String> =
                    slots.iter().flatten().map(i64::to_string).collect();
                let (text, slots) = match twist {
                    // A NULL entry, a length not a multiple of 3: none.
                    1 => (format!("{{{},NULL,1,2}}", items.join(",")), None),
                    2 => (format!("{{{},7}}", items.join(",")), None),
                    // Two dimensions: none.
                    3 => {
                        let one = items[..3].join(",");
                        (format!("{{{{{one}}},{{{one}}}}}"), None)
                    }
                    // Subscripts from 0: slots all the same.
                    4 => (
                        format!(
                            "[0:{}]={{{}}}",
                            items.len() - 1,
                            items.join(",")
                        ),
                        Some(slots),
                    ),
                    // Expiries beyond 2^53, units that are no u32 above 0:
                    // no slot, dropped by a write.
                    5 => {
                        slots.extend([
                            [1, 1, us(MAX_TIME_US) + 1],
                            [2, 1, i64::MAX],
                            [1, 0, us(now) + 1000],
                            [3, -1, us(now) + 1000],
                            [1, i64::from(u32::MAX) + 1, us(now) + 1000],
                        ]);
                        (slots_text(&slots), Some(slots))
                    }
                    // Empty.
                    6 => ("{}".to_owned(), Some(Vec::new())),
                    _ => (slots_text(&slots), Some(slots)),
                };
                Kept {
                    row: Row {
                        slots: Some(text),
                        ..row(*mark)
                    },
                    log: None,
                    slots,
                    by_store: false,
                }
            }
        })
    }
}

#[derive(Debug, Clone)]
struct Step {
    advance: Advance,
    mess: Vec<Option<Mess>>,
    /// The keys of the decision, in order, with their cost and shadow flag.
    chosen: Vec<(usize, u32, bool)>,
    /// Per key, the id its slots are taken under (if it is a concurrency
    /// limit).
    ids: Vec<u64>,
    /// A release or a renewal after the decision.
    slot_op: Option<SlotOp>,
    /// Rates alone: through the rate statements, as the store sends them.
    rate_path: bool,
    /// The cleanup at the step's time, before the decision.
    cleanup: bool,
}

#[derive(Debug, Clone)]
struct Case {
    limits: Vec<Limit>,
    start_us: u64,
    steps: Vec<Step>,
}

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

fn lease_strategy() -> impl Strategy<Value = Lease> {
    let lease_us = prop_oneof![
        3 => 1u64..=2_000,
        3 => 2_000u64..=60_000_000,
        1 => 60_000_000u64..=100 * DAY,
        1 => Just(MAX_WINDOW_US),
        1 => prop::sample::select(vec![1, 999, 1000, 1001, 30 * SECOND]),
    ];
    lease_us.prop_map(|l| Lease::new(Duration::from_micros(l)).unwrap())
}

fn slots_strategy() -> impl Strategy<Value = Limit> {
    let limit = prop_oneof![
        6 => 1u32..=4,
        2 => 5u32..=40,
        1 => Just(u32::MAX),
        1 => 1u32..=u32::MAX,
    ];
    (limit, lease_strategy()).prop_map(|(l, lease)| {
        Limit::Slots(Concurrency::new(l).unwrap(), lease)
    })
}

fn limit_strategy() -> impl Strategy<Value = Limit> {
    prop_oneof![
        quota_strategy().prop_map(Limit::Rate),
        window_strategy().prop_map(Limit::Window),
        period_strategy().prop_map(Limit::Period),
        slots_strategy(),
    ]
}

/// The ids of slots: a few, so that releases and renewals find them, and
/// the ends of the range (0: slots without an id).
fn id_strategy() -> impl Strategy<Value = u64> {
    prop::sample::select(vec![1, 2, 3, 1, 2, 0, u64::MAX, 1 << 63])
}

fn cost_strategy(limit: &Limit) -> BoxedStrategy<u32> {
    let most = match limit {
        Limit::Rate(q) => return cases::cost_strategy(*q).boxed(),
        Limit::Window(w) => w.limit(),
        Limit::Period(p) => p.limit(),
        Limit::Slots(c, _) => c.limit(),
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
        Limit::Slots(_, lease) => {
            let l = lease.lease_us() as i64;
            prop_oneof![
                0..=l,
                0..=l / 3,
                Just(l),
                Just(l - 1),
                -l..=0,
                0..=3 * l
            ]
            .boxed()
        }
    }
}

fn mess_strategy(limit: &Limit) -> BoxedStrategy<Option<Mess>> {
    let scale = match limit {
        Limit::Rate(q) => q.burst_offset_us() as i64,
        Limit::Window(w) => w.window_us() as i64,
        Limit::Period(_) => DAY as i64,
        Limit::Slots(_, lease) => lease.lease_us() as i64,
    };
    let rate = (
        prop_oneof![3 => -3 * scale..=3 * scale, 1 => Just(-i64::MAX / 2)],
        prop::option::weighted(
            0.3,
            prop::sample::select(vec![
                -1i64,
                -2,
                -3,
                0,
                us(MAX_TIME_US),
                us(MAX_TIME_US) + 1,
                i64::MAX,
            ]),
        ),
        any::<bool>(),
    )
        .prop_map(|(offset, absolute, stale)| Mess::Rate {
            offset,
            absolute,
            stale,
        });
    let offset = prop_oneof![
        3 => -3 * scale..=scale,
        2 => prop::sample::select(vec![-scale, -scale - 1, -scale + 1, 0, -1, 1, scale]),
    ];
    let log = (
        prop::collection::vec(offset, 1..=12),
        prop::bool::weighted(0.8),
        prop_oneof![6 => Just(0u8), 1 => 1u8..=6],
        prop_oneof![8 => Just(-1i64), 1 => Just(-2i64), 1 => Just(-3i64), 1 => Just(5i64)],
    )
        .prop_map(|(offsets, sorted, twist, mark)| Mess::Log {
            offsets,
            sorted,
            twist,
            mark,
        });
    let most = match limit {
        Limit::Period(p) => i64::from(p.limit()),
        Limit::Slots(c, _) => i64::from(c.limit()),
        _ => 5,
    };
    let record = (
        0u8..=3,
        prop_oneof![3 => Just(0i64), 2 => -1i64..=1, 1 => -(DAY as i64)..=DAY as i64],
        prop::sample::select(vec![
            0,
            -1,
            us(MAX_TIME_US) - 1,
            us(MAX_TIME_US),
            us(MAX_TIME_US) + 1,
            i64::MAX,
        ]),
        prop_oneof![
            3 => (0..=most + 2).prop_map(Some),
            1 => Just(Some(most)),
            1 => Just(Some(i64::from(u32::MAX))),
            1 => Just(Some(i64::from(u32::MAX) + 1)),
            1 => Just(Some(-1)),
            1 => Just(None),
        ],
        prop_oneof![8 => Just(-2i64), 1 => Just(-1i64), 1 => Just(-3i64), 1 => Just(7i64)],
    )
        .prop_map(|(anchor, delta, absolute, count, mark)| Mess::Record {
            anchor,
            delta,
            absolute,
            count,
            mark,
        });
    let units = prop_oneof![
        6 => 1..=most.min(3),
        2 => 1..=most,
        1 => Just(most),
        1 => prop::sample::select(vec![0, -1, i64::from(u32::MAX), i64::from(u32::MAX) + 1]),
    ];
    let expiry = prop_oneof![
        3 => -2 * scale..=2 * scale,
        2 => prop::sample::select(vec![-scale, 0, 1, -1, scale, scale + 1, -i64::MAX / 2]),
    ];
    let slots = (
        prop::collection::vec((id_strategy(), units, expiry), 1..=8),
        prop_oneof![6 => Just(0u8), 1 => 1u8..=6],
        prop_oneof![8 => Just(-3i64), 1 => Just(-1i64), 1 => Just(-2i64), 1 => Just(4i64)],
    )
        .prop_map(|(entries, twist, mark)| Mess::Slots {
            entries,
            twist,
            mark,
        });
    // Mostly rows of the key's own kind, sometimes of the others.
    let (own, others) = match limit {
        Limit::Rate(_) => {
            (rate.boxed(), [log.boxed(), record.boxed(), slots.boxed()])
        }
        Limit::Window(_) => {
            (log.boxed(), [rate.boxed(), record.boxed(), slots.boxed()])
        }
        Limit::Period(_) => {
            (record.boxed(), [rate.boxed(), log.boxed(), slots.boxed()])
        }
        Limit::Slots(..) => {
            (slots.boxed(), [rate.boxed(), log.boxed(), record.boxed()])
        }
    };
    let [other_a, other_b, other_c] = others;
    prop_oneof![
        32 => Just(None),
        4 => own.prop_map(Some),
        1 => other_a.prop_map(Some),
        1 => other_b.prop_map(Some),
        1 => other_c.prop_map(Some),
        1 => Just(Some(Mess::Gone)),
    ]
    .boxed()
}

fn slot_op_strategy() -> impl Strategy<Value = Option<SlotOp>> {
    let v = prop_oneof![
        4 => 0..=4i64,
        2 => 1..=(2 * HOUR as i64),
        1 => Just(i64::from(u32::MAX)),
        1 => prop::sample::select(vec![-1, 1 << 32, 1 << 50, (1 << 50) + 1]),
    ];
    let op = (any::<usize>(), id_strategy(), any::<bool>(), v)
        .prop_map(|(key, id, renew, v)| SlotOp { key, id, renew, v });
    prop::option::weighted(0.4, op)
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
    (
        advance,
        mess,
        chosen,
        (prop::collection::vec(id_strategy(), n), slot_op_strategy()),
        prop::bool::weighted(0.5),
        prop::bool::weighted(0.15),
    )
        .prop_map(
            |(advance, mess, chosen, (ids, slot_op), rate_path, cleanup)| {
                Step {
                    advance,
                    mess,
                    chosen,
                    ids,
                    slot_op,
                    rate_path,
                    cleanup,
                }
            },
        )
}

fn start_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        5 => START_US..=START_US + 1_000_000_000_000,
        2 => 0..=MAX_TIME_US,
        1 => 0..=400 * DAY,
        1 => MAX_TIME_US - 400 * DAY..=MAX_TIME_US,
        // Around the end of February of leap years, of years that are not
        // (2100 and 2200 among them), and of the leap century 2000; and
        // around the end of other months.
        3 => (prop::sample::select(MARCH_1ST_S.to_vec()), -3 * DAY as i64..=DAY as i64)
            .prop_map(|(s, d)| (s * SECOND).saturating_add_signed(d)),
        1 => (prop::sample::select(MARCH_1ST_S.to_vec()), -40 * DAY as i64..=300 * DAY as i64)
            .prop_map(|(s, d)| (s * SECOND).saturating_add_signed(d)),
    ]
}

fn case_strategy() -> impl Strategy<Value = Case> {
    prop::collection::vec(limit_strategy(), 1..=4).prop_flat_map(|limits| {
        (
            Just(limits.clone()),
            start_strategy(),
            prop::collection::vec(step_strategy(limits), 1..24),
        )
            .prop_map(|(limits, start_us, steps)| Case {
                limits,
                start_us,
                steps,
            })
    })
}

/// Where `advance` takes the clock from `now`.
fn target(w: &World, now: u64, advance: &Advance) -> u64 {
    let (k, pick, delta) = match *advance {
        Advance::By(d) => return now.saturating_add_signed(d),
        Advance::To { key, pick, delta } => (key % w.limits.len(), pick, delta),
    };
    let limit = &w.limits[k];
    let at = match (limit, handed(limit, w.model.get(&w.keys[k]))) {
        (Limit::Window(window), Handed::Log(log)) if !log.is_empty() => {
            Some(log[pick % log.len()].saturating_add(window.window_us()))
        }
        (Limit::Period(p), _) => match pick % 3 {
            0 => p.start_of(now).ok(),
            1 => p.next_start(now).ok(),
            _ => p
                .next_start(now)
                .ok()
                .and_then(|next| p.next_start(next).ok()),
        },
        (Limit::Rate(q), Handed::Tat(Some(tat))) => Some(if pick % 2 == 0 {
            tat
        } else {
            tat.saturating_add(q.emission_interval_us())
                .saturating_sub(q.burst_offset_us())
        }),
        (Limit::Slots(..), Handed::Slots(slots)) if !slots.is_empty() => {
            u64::try_from(slots[pick % slots.len()][2]).ok()
        }
        _ => None,
    };
    at.map_or(now, |at| at.saturating_add_signed(delta))
}

/// One decision through PostgreSQL and through gcra-core.
async fn check_step(
    w: &mut World,
    now: u64,
    step: &Step,
    ctx: &str,
) -> Result<(), TestCaseError> {
    let chosen = &step.chosen;
    let handed_all: Vec<Handed> = w
        .limits
        .iter()
        .zip(&w.keys)
        .map(|(l, k)| handed(l, w.model.get(k)))
        .collect();
    let keys: Vec<String> =
        chosen.iter().map(|&(i, ..)| w.keys[i].clone()).collect();
    let rates_only = chosen
        .iter()
        .all(|&(i, ..)| matches!(w.limits[i], Limit::Rate(_)));
    let rate_path = rates_only && step.rate_path;
    let reply = if rate_path {
        w.count(1);
        let args: Vec<i64> = chosen
            .iter()
            .flat_map(|&(i, cost, shadow)| {
                let Limit::Rate(quota) = w.limits[i] else {
                    unreachable!()
                };
                cases::check_args(
                    &w.names[i],
                    Charge {
                        quota,
                        cost,
                        shadow,
                    },
                )
            })
            .collect();
        w.rates(&keys, &args, now).await
    } else {
        w.count(0);
        let args: Vec<i64> = chosen
            .iter()
            .flat_map(|&(i, cost, shadow)| {
                w.limits[i].args(&w.names[i], cost, shadow, step.ids[i])
            })
            .collect();
        w.mixed(&keys, &args, now).await
    };
    let ctx = format!("{ctx}, handed {handed_all:?}, rate path {rate_path}");
    match combine(&w.limits, &handed_all, now, chosen, &step.ids) {
        Ok(e) => {
            let reply = reply
                .map_err(|err| TestCaseError::fail(format!("{ctx}: {err}")))?;
            let got = decisions(&reply);
            prop_assert_eq!(&got, &e.reply, "{}", &ctx);
            prop_assert_eq!(
                Verdict::of(chosen.iter().map(|c| c.2), &got),
                e.verdict,
                "{}",
                &ctx
            );
            for (i, change) in &e.writes {
                if matches!(change, Change::Slots(_)) {
                    w.count(3);
                }
                let key = &w.keys[*i];
                let kept = written(
                    w.model.get(key),
                    &handed_all[*i],
                    change,
                    now,
                    !rate_path,
                );
                w.model.insert(key.clone(), kept);
            }
        }
        Err(err) => {
            prop_assert!(
                reply.is_err(),
                "{}: gcra-core says {:?}, PostgreSQL {:?}",
                &ctx,
                err,
                reply
            );
        }
    }
    prop_assert_eq!(w.rows().await, w.expected_rows(), "{}", &ctx);
    Ok(())
}

async fn run_case(w: &mut World, case: &Case) -> Result<(), TestCaseError> {
    w.db.batch_execute(&format!("TRUNCATE {}", w.table))
        .await
        .unwrap();
    let n = case.limits.len();
    w.limits = case.limits.clone();
    w.names = names(n);
    w.keys = w.names.iter().map(key).collect();
    w.model.clear();
    let mut now = case.start_us;
    for (s, step) in case.steps.iter().enumerate() {
        // The clock, kept within reach of 2^53 so that it can come back.
        now = target(w, now, &step.advance).min(MAX_TIME_US + 1000);
        if step.cleanup {
            w.cleanup(now).await?;
        }
        for (k, mess) in step.mess.iter().enumerate() {
            if let Some(mess) = mess {
                match mess.row(&w.limits[k], now) {
                    Some(kept) => w.put(k, kept).await,
                    None => w.remove(k).await,
                }
            }
        }
        let ctx = format!(
            "step {s}: now {now}, limits {:?}, {:?}",
            w.limits, step.chosen
        );
        check_step(w, now, step, &ctx).await?;
        if let Some(op) = &step.slot_op {
            w.slot_op(op, now, &ctx).await?;
        }
    }
    Ok(())
}

fn world(runtime: &tokio::runtime::Runtime) -> World {
    let (db, table) = runtime.block_on(postgres_support::connect("trt_kinds"));
    World {
        db,
        table,
        names: Vec::new(),
        keys: Vec::new(),
        limits: Vec::new(),
        model: BTreeMap::new(),
        seen: std::cell::Cell::default(),
    }
}

#[test]
fn the_mixed_function_agrees_with_gcra_core() {
    let runtime = runtime();
    let mut world = world(&runtime);
    let config = ProptestConfig {
        cases: 384,
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
    let [mixed, rates, cleaned, taken, found] = world.borrow().seen.get();
    assert!(
        mixed > 0 && rates > 0 && cleaned > 0 && taken > 0 && found > 0,
        "{mixed} mixed decisions, {rates} through the rate statements, {cleaned} rows \
         cleaned up, {taken} slots taken, {found} releases and renewals of slots \
         held: the cases must exercise each"
    );
}

/// A period's bounds at any time, and at its next start and 1 µs either
/// side, months of every length among them: the reply and the row are
/// gcra-core's.
#[test]
fn calendar_periods_agree_with_gcra_core() {
    let runtime = runtime();
    let w = world(&runtime);
    let time = prop_oneof![
        3 => 0..=MAX_TIME_US,
        2 => START_US..=START_US + 400 * DAY,
        1 => 0..=400 * DAY,
        1 => MAX_TIME_US - 400 * DAY..=MAX_TIME_US + 1,
        3 => (prop::sample::select(MARCH_1ST_S.to_vec()), -40 * DAY as i64..=40 * DAY as i64)
            .prop_map(|(s, d)| (s * SECOND).saturating_add_signed(d)),
    ];
    let config = ProptestConfig {
        cases: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let name = LimitName::new("calendar").unwrap();
    let k = key(&name);
    runner
        .run(
            &(unit_strategy(), offset_strategy(), time),
            |(unit, offset, t)| {
                runtime.block_on(async {
                    w.db.batch_execute(&format!("TRUNCATE {}", w.table))
                        .await
                        .unwrap();
                    let period = Period::new(3, unit, offset).unwrap();
                    let args = Limit::Period(period).args(&name, 1, false, 0);
                    let mut record = None;
                    let mut times = vec![t, t];
                    if let Ok(next) = period.next_start(t) {
                        times.extend([next - 1, next, next + 1]);
                    }
                    for (step, now) in times.into_iter().enumerate() {
                        let reply =
                            w.mixed(std::slice::from_ref(&k), &args, now).await;
                        let ctx = format!("step {step} at {now}: {record:?}");
                        match period.check(record, now, 1) {
                            Ok(d) => {
                                prop_assert_eq!(
                                    decisions(&reply.unwrap()),
                                    vec![d.as_decision()],
                                    "{}",
                                    &ctx
                                );
                                if let Some(write) = d.write {
                                    record =
                                        Some((write.start_us, write.count));
                                }
                                let row = w.rows().await.remove(&k);
                                prop_assert_eq!(
                                    row.map(|r| (r.start, r.count)),
                                    record.map(|(s, c)| (
                                        Some(us(s)),
                                        Some(i64::from(c))
                                    )),
                                    "{}",
                                    &ctx
                                );
                            }
                            Err(_) => prop_assert!(
                                reply.is_err(),
                                "{}: {:?}",
                                &ctx,
                                reply
                            ),
                        }
                    }
                    Ok(())
                })
            },
        )
        .unwrap();
}

/// The docs' examples (Window::check's, Period::check's February 2024),
/// to the microsecond, through the function.
#[test]
fn the_examples_of_the_docs() {
    let runtime = runtime();
    let w = world(&runtime);
    runtime.block_on(async {
        let name = LimitName::new("example").unwrap();
        let k = vec![key(&name)];
        // Three requests in any 10 s: at 0 s, 4 s and 5 s; at 9 s the
        // fourth waits 1 s, at 10 s it passes.
        let window =
            Limit::Window(Window::new(3, Duration::from_secs(10)).unwrap());
        let at = |s: u64| START_US + s * SECOND;
        for s in [0, 4, 5] {
            let reply =
                w.mixed(&k, &window.args(&name, 1, false, 0), at(s)).await;
            assert!(decisions(&reply.unwrap())[0].allowed);
        }
        let args = window.args(&name, 1, false, 0);
        assert_eq!(
            w.mixed(&k, &args, at(9)).await,
            Ok(vec![0, 0, SECOND as i64, 6 * SECOND as i64])
        );
        assert_eq!(
            w.mixed(&k, &args, at(10)).await,
            Ok(vec![1, 0, 0, 10 * SECOND as i64])
        );
        let row = w.rows().await.remove(&k[0]).unwrap();
        assert_eq!(
            row,
            Row {
                tat: -1,
                expires: us(at(10) + 10 * SECOND),
                log: Some(log_text(&[at(4), at(5), at(10)])),
                start: None,
                count: None,
                slots: None,
            }
        );
        assert_eq!(
            w.mixed(&k, &window.args(&name, 2, false, 0), at(10)).await,
            Ok(vec![0, 0, 5 * SECOND as i64, 10 * SECOND as i64])
        );

        // 1000 a month, 998 spent on February 28th 2024 at 23:00 UTC: the
        // last two pass, the next waits 25 h, for March 1st.
        let monthly =
            Limit::Period(Period::new(1000, PeriodUnit::Month, 0).unwrap());
        let name = LimitName::new("monthly").unwrap();
        let k = vec![key(&name)];
        let feb_1: u64 = 1_706_745_600_000_000;
        let feb_28_23h = 1_709_161_200_000_000;
        let march_1 = 1_709_251_200_000_000;
        assert_eq!(
            w.mixed(&k, &monthly.args(&name, 998, false, 0), feb_1 + 5)
                .await,
            Ok(vec![1, 2, 0, (29 * DAY - 5) as i64])
        );
        assert_eq!(
            w.mixed(&k, &monthly.args(&name, 2, false, 0), feb_28_23h)
                .await,
            Ok(vec![1, 0, 0, 25 * HOUR as i64])
        );
        assert_eq!(
            w.mixed(&k, &monthly.args(&name, 1, false, 0), feb_28_23h)
                .await,
            Ok(vec![0, 0, 25 * HOUR as i64, 25 * HOUR as i64])
        );
        let row = w.rows().await.remove(&k[0]).unwrap();
        assert_eq!(
            (row.tat, row.expires, row.start, row.count),
            (-2, us(march_1), Some(us(feb_1)), Some(1000))
        );
        assert_eq!(
            w.mixed(&k, &monthly.args(&name, 1, false, 0), march_1)
                .await,
            Ok(vec![1, 999, 0, 31 * DAY as i64])
        );
        // In India (UTC+05:30) that instant is already February 29th,
        // 04:30: the month ends 19 h 30 min later.
        let india = Limit::Period(
            Period::new(1000, PeriodUnit::Month, 5 * 3600 + 1800).unwrap(),
        );
        let name = LimitName::new("india").unwrap();
        assert_eq!(
            w.mixed(&[key(&name)], &india.args(&name, 0, false, 0), feb_28_23h)
                .await,
            Ok(vec![1, 1000, 0, (19 * HOUR + HOUR / 2) as i64])
        );
    });
}

#[test]
fn bad_arguments_raise_and_write_nothing() {
    let runtime = runtime();
    let w = world(&runtime);
    runtime.block_on(async {
        let (a, b) = ("trt:a".to_owned(), "trt:b".to_owned());
        let rate = [0, 6_000_000, 60_000_000, 60_000_000, 1, 0];
        let window = [1, 3, 10_000_000, 0, 1, 0];
        let period = [2, 5, 0, 0, 1, 0];
        let slots = [3, 5, 1_000_000, 7, 1, 0];
        let with = |base: [i64; 6], slot: usize, v: i64| {
            let mut args = base;
            args[slot] = v;
            args
        };
        // Per kind: its good arguments, and bad values for some slots.
        type Bad = &'static [(usize, i64)];
        let mut cases: Vec<(String, Vec<String>, Vec<i64>)> = vec![
            ("no key".into(), vec![], vec![]),
            ("5 arguments".into(), vec![a.clone()], rate[..5].to_vec()),
            (
                "6 arguments for 2 keys".into(),
                vec![a.clone(), b.clone()],
                rate.to_vec(),
            ),
            (
                "the same key twice".into(),
                vec![a.clone(), a.clone()],
                [rate, rate].concat(),
            ),
            ("tag 4".into(), vec![a.clone()], with(rate, 0, 4).to_vec()),
            ("tag -1".into(), vec![a.clone()], with(rate, 0, -1).to_vec()),
        ];
        let per_kind: [(&str, [i64; 6], Bad); 4] = [
            (
                "rate",
                rate,
                &[
                    (1, 0),
                    (2, 5_999_999),
                    (3, -1),
                    (3, 1 << 51),
                    (4, 11),
                    (4, -1),
                    (5, 2),
                ],
            ),
            (
                "window",
                window,
                &[
                    (1, 0),
                    (1, 1025),
                    (2, 0),
                    (2, (1 << 50) + 1),
                    (3, 1),
                    (4, 4),
                    (5, -1),
                ],
            ),
            (
                "period",
                period,
                &[
                    (1, 0),
                    (1, 1 << 32),
                    (2, 3),
                    (3, 64_801),
                    (3, -64_801),
                    (4, 6),
                    (4, 1 << 32),
                ],
            ),
            (
                "slots",
                slots,
                &[
                    (1, 0),
                    (1, 1 << 32),
                    (2, 0),
                    (2, (1 << 50) + 1),
                    (4, 6),
                    (4, -1),
                    (5, 2),
                ],
            ),
        ];
        for (kind, base, bad) in per_kind {
            for &(slot, v) in bad {
                cases.push((
                    format!("{kind}: argument {slot} = {v}"),
                    vec![a.clone()],
                    with(base, slot, v).to_vec(),
                ));
                // In shadow too, after a limit that passes.
                cases.push((
                    format!("{kind}: argument {slot} = {v}, after a window"),
                    vec![b.clone(), a.clone()],
                    [&window[..], &with(with(base, 5, 1), slot, v)].concat(),
                ));
            }
        }
        for (what, keys, args) in &cases {
            let error = w.mixed(keys, args, START_US).await.unwrap_err();
            assert!(
                error.contains("rate_tier_decide_mixed"),
                "{what}: {error}"
            );
            assert_eq!(w.rows().await, BTreeMap::new(), "{what}: wrote");
        }
        // Past 2^53, a period that ends past it (even a peek), and slots
        // whose lease ends past it.
        let day = [2, 5, 0, 0, 0, 0];
        let peek_slots = with(slots, 4, 0);
        for (now, args) in [
            (MAX_TIME_US + 1, window),
            (MAX_TIME_US - 1, day),
            (MAX_TIME_US + 1, peek_slots),
            (MAX_TIME_US - 999_999, slots),
        ] {
            let error = w
                .mixed(std::slice::from_ref(&a), &args, now)
                .await
                .unwrap_err();
            assert!(error.contains("time out of range"), "{error}");
        }
        // A peek of slots at 2^53 raises nothing: no lease starts.
        let reply = w.mixed(std::slice::from_ref(&a), &peek_slots, MAX_TIME_US);
        assert_eq!(reply.await, Ok(vec![1, 5, 0, 0]));

        // The release and renew functions: their arguments, and the time.
        for renew in [false, true] {
            let sql =
                PostgresStorage::slots_sql(&w.table, renew, true).unwrap();
            let run = |keys: Vec<String>, args: Vec<i64>, now: u64| {
                let sql = sql.clone();
                let db = &w.db;
                async move {
                    db.query_one(&sql, &[&keys, &args, &us(now)])
                        .await
                        .map(|row| row.get::<_, Vec<i64>>(0))
                        .map_err(message)
                }
            };
            let name = if renew {
                "rate_tier_renew"
            } else {
                "rate_tier_release"
            };
            let mut bad: Vec<(Vec<String>, Vec<i64>, u64)> = vec![
                (vec![], vec![], START_US),
                (vec![a.clone()], vec![1], START_US),
                (vec![a.clone()], vec![1, 1, 1], START_US),
                (vec![a.clone()], vec![1, -1], START_US),
                (vec![a.clone()], vec![1, 1], MAX_TIME_US + 1),
            ];
            if renew {
                bad.extend([
                    (vec![a.clone()], vec![1, 0], START_US),
                    (vec![a.clone()], vec![1, (1 << 50) + 1], START_US),
                    (vec![a.clone()], vec![1, 10], MAX_TIME_US - 9),
                ]);
            } else {
                bad.push((vec![a.clone()], vec![1, 1 << 32], START_US));
            }
            for (keys, args, now) in bad {
                let what = format!("{name} {keys:?} {args:?} at {now}");
                let error = run(keys, args, now).await.unwrap_err();
                assert!(error.contains(name), "{what}: {error}");
            }
            // Two keys, one twice, without a row: nothing to do.
            let keys = vec![a.clone(), b.clone(), a.clone()];
            let reply = run(keys, vec![1, 1, 2, 1, 1, 1], START_US).await;
            assert_eq!(reply, Ok(vec![0, 0, 0]));
            assert_eq!(w.rows().await, BTreeMap::new());
        }
    });
}

// ---------------------------------------------------------------------------
// The store.

/// A store on `url`, migrated into a table of its own.
async fn migrated(url: &str) -> PostgresStorage {
    let table = unique("trt_kinds").replace('-', "_");
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

fn name(prefix: &str) -> LimitName {
    LimitName::of_limit(unique(prefix)).unwrap()
}

async fn raw(url: &str) -> Client {
    let (client, connection) =
        tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

async fn run(
    store: &dyn Storage,
    checks: &[BucketCheck<'_>],
) -> (bool, Vec<Decision>) {
    let mut out = vec![Decision::default(); checks.len()];
    let decided = store.check(checks, &mut out).await.unwrap();
    (decided.verdict.allowed, out)
}

/// A bucket read without a charge: its decision.
async fn peek(store: &dyn Storage, check: BucketCheck<'_>) -> Decision {
    run(store, &[check.as_peek()]).await.1[0]
}

/// The row of a bucket, as the test reads rows.
async fn row_of(
    db: &Client,
    table: &str,
    check: &BucketCheck<'_>,
) -> Option<Row> {
    db.query_opt(
        &format!(
            "SELECT tat_us, expires_us, log_us::text, period_start_us, period_count, \
             slots::text FROM {table} WHERE key = $1"
        ),
        &[&check.key(KeyLayout::Single)],
    )
    .await
    .unwrap()
    .map(|r| Row {
        tat: r.get(0),
        expires: r.get(1),
        log: r.get(2),
        start: r.get(3),
        count: r.get(4),
        slots: r.get(5),
    })
}

/// A daily period whose local day is at noon now (its offset chosen so):
/// no test run crosses its midnight.
fn daily_at_noon(limit: u32) -> Period {
    let now_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let offset = 12 * 3600 - i64::try_from(now_s % 86_400).unwrap();
    Period::new(limit, PeriodUnit::Day, i32::try_from(offset).unwrap()).unwrap()
}

#[tokio::test]
async fn postgres_supports_every_kind() {
    let url = env::postgres_url();
    let store = migrated(&url).await;
    for kind in [
        RuleKind::Rate,
        RuleKind::Window,
        RuleKind::Period,
        RuleKind::Concurrency,
    ] {
        assert!(store.supports(kind), "{kind}");
    }
    assert_eq!(store.capabilities().lease, Some(Duration::from_secs(30)));
    let slots = name("slots");
    let window = name("window");
    let concurrency = Concurrency::new(3).unwrap();
    let checks = [
        BucketCheck::of_rule(
            &window,
            "ana",
            Window::new(5, Duration::from_secs(60)).unwrap().into(),
            1,
        )
        .unwrap(),
        BucketCheck::of_rule(&slots, "ana", concurrency.into(), 1)
            .unwrap()
            .lease_id(7),
    ];
    let (allowed, out) = run(&store, &checks).await;
    assert!(allowed);
    assert_eq!((out[0].remaining, out[1].remaining), (4, 2));
    assert_eq!(peek(&store, checks[1]).await.remaining, 2);
    store.release(&checks[1..]).await.unwrap();
    assert_eq!(peek(&store, checks[1]).await.remaining, 3);
    // Only a concurrency limit's slots are released or renewed.
    for error in [
        store.release(&checks[..1]).await.unwrap_err(),
        store.renew(&checks[..1]).await.unwrap_err(),
    ] {
        assert!(matches!(error, StorageError::Unsupported(_)), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_under_200_concurrent_checks_pass_exactly_the_limit() {
    let url = env::postgres_url();
    let first = Arc::new(migrated(&url).await);
    let second = Arc::new(instance(&url, first.table()).await);
    let login = Arc::new(name("login"));
    let export = Arc::new(name("export"));
    let window: Rule =
        Window::new(5, Duration::from_secs(3600)).unwrap().into();
    let period: Rule = daily_at_noon(7).into();
    for (limit, rule, expected) in [(&login, window, 5), (&export, period, 7)] {
        let mut tasks = Vec::new();
        for i in 0..200 {
            let store = Arc::clone(if i % 2 == 0 { &first } else { &second });
            let limit = Arc::clone(limit);
            tasks.push(tokio::spawn(async move {
                let check =
                    [BucketCheck::of_rule(&limit, "ana", rule, 1).unwrap()];
                run(&*store, &check).await.0
            }));
        }
        let mut passed = 0;
        for task in tasks {
            passed += usize::from(task.await.unwrap());
        }
        assert_eq!(passed, expected, "{rule:?}");
        let left = peek(
            &*first,
            BucketCheck::of_rule(limit, "ana", rule, 1).unwrap(),
        )
        .await;
        assert_eq!(left.remaining, 0, "{rule:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_statements_and_mixed_decisions_over_one_rate_share_its_lock() {
    // The same rate, alone (the one-bucket statement, or the check function
    // when it refuses) and beside a window (the mixed function), from two
    // instances: both take the rate's lock before they read it, or one
    // would overwrite what the other charged and more than the burst pass.
    let url = env::postgres_url();
    let first = Arc::new(migrated(&url).await);
    let second = Arc::new(instance(&url, first.table()).await);
    let (plan, login) = (Arc::new(name("plan")), Arc::new(name("login")));
    let quota = Quota::per_hour(60);
    let window: Rule =
        Window::new(1000, Duration::from_secs(3600)).unwrap().into();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let store = Arc::clone(if i % 2 == 0 { &first } else { &second });
        let (plan, login) = (Arc::clone(&plan), Arc::clone(&login));
        tasks.push(tokio::spawn(async move {
            let rate = BucketCheck::new(&plan, "ana", quota, 1).unwrap();
            if i % 4 < 2 {
                (run(&*store, &[rate]).await.0, false)
            } else {
                let login =
                    BucketCheck::of_rule(&login, "ana", window, 1).unwrap();
                (run(&*store, &[login, rate]).await.0, true)
            }
        }));
    }
    let (mut alone, mut mixed) = (0u64, 0u64);
    for task in tasks {
        match task.await.unwrap() {
            (true, false) => alone += 1,
            (true, true) => mixed += 1,
            _ => {}
        }
    }
    assert_eq!(
        alone + mixed,
        60,
        "{alone} alone, {mixed} beside the window"
    );
    assert!(alone > 0 && mixed > 0, "{alone} alone, {mixed} mixed");
    // The window counted exactly the mixed decisions that passed: a refused
    // rate wrote nothing to it.
    let left = peek(
        &*first,
        BucketCheck::of_rule(&login, "ana", window, 1).unwrap(),
    )
    .await;
    assert_eq!(left.remaining, 1000 - mixed);
}

#[tokio::test]
async fn a_refusal_of_one_kind_charges_none_of_the_others() {
    let url = env::postgres_url();
    let store = migrated(&url).await;
    let db = raw(&url).await;
    let (plan, login, export) = (name("plan"), name("login"), name("export"));
    let quota = Quota::per_minute(10);
    let window: Rule = Window::new(2, Duration::from_secs(60)).unwrap().into();
    let period: Rule = daily_at_noon(5).into();
    let rate = BucketCheck::new(&plan, "ana", quota, 1).unwrap();
    let login_1 = BucketCheck::of_rule(&login, "ana", window, 1).unwrap();
    let export_1 = BucketCheck::of_rule(&export, "ana", period, 1).unwrap();

    // Two pass: the window is full, the tier has 8 left, the day 3.
    for _ in 0..2 {
        assert!(run(&store, &[rate, login_1, export_1]).await.0);
    }
    // The window refuses: no rate and no period is charged, and those
    // that would have passed reply with their buckets as they stand.
    let (allowed, out) = run(&store, &[rate, login_1, export_1]).await;
    assert!(!allowed);
    assert!(
        out[0].allowed && !out[1].allowed && out[2].allowed,
        "{out:?}"
    );
    assert_eq!((out[0].remaining, out[2].remaining), (8, 3));
    assert_eq!(peek(&store, rate).await.remaining, 8);
    assert_eq!(peek(&store, export_1).await.remaining, 3);
    assert!(out[1].retry_after_us > 0 && out[1].retry_after_us <= 60 * SECOND);

    // A rate refuses (its burst of 1 spent): the window and the period are
    // left as they are, row for row.
    let (tight, fresh_login) = (name("tight"), name("fresh"));
    let one = BucketCheck::new(&tight, "ana", Quota::per_hour(1), 1).unwrap();
    let fresh = BucketCheck::of_rule(&fresh_login, "ana", window, 1).unwrap();
    assert!(run(&store, &[one]).await.0);
    let rows_before = (
        row_of(&db, store.table(), &fresh).await,
        row_of(&db, store.table(), &export_1).await,
    );
    let (allowed, out) = run(&store, &[fresh, one, export_1]).await;
    assert!(!allowed);
    assert!(
        out[0].allowed && !out[1].allowed && out[2].allowed,
        "{out:?}"
    );
    assert_eq!((out[0].remaining, out[2].remaining), (2, 3));
    let rows_after = (
        row_of(&db, store.table(), &fresh).await,
        row_of(&db, store.table(), &export_1).await,
    );
    assert_eq!(rows_after, rows_before);
    assert_eq!(rows_after.0, None, "a window nobody charged has no row");
    assert_eq!(peek(&store, fresh).await.remaining, 2);

    // A shadow window that refuses refuses nothing: the others are charged.
    let shadow = login_1.shadow(true);
    let (allowed, out) = run(&store, &[rate, shadow, export_1]).await;
    assert!(allowed && !out[1].allowed, "{out:?}");
    assert_eq!(peek(&store, rate).await.remaining, 7);
    assert_eq!(peek(&store, export_1).await.remaining, 2);
}

#[tokio::test]
async fn a_row_of_another_kind_is_absent_and_replaced() {
    // A limit whose kind changed (a tier reload) reads its old row as no
    // row, whichever the kinds.
    let url = env::postgres_url();
    let store = migrated(&url).await;
    let db = raw(&url).await;
    let limit = name("changes");
    let rate =
        BucketCheck::new(&limit, "ana", Quota::per_minute(10), 4).unwrap();
    let window: Rule = Window::new(5, Duration::from_secs(60)).unwrap().into();
    let window_2 = BucketCheck::of_rule(&limit, "ana", window, 2).unwrap();
    let period: Rule = daily_at_noon(5).into();
    let period_3 = BucketCheck::of_rule(&limit, "ana", period, 3).unwrap();
    // A rate's row, then a window on it, a period on that, a rate again
    // (the one-bucket statement), a window again.
    assert_eq!(run(&store, &[rate]).await.1[0].remaining, 6);
    assert_eq!(run(&store, &[window_2]).await.1[0].remaining, 3);
    assert_eq!(run(&store, &[period_3]).await.1[0].remaining, 2);
    let row = row_of(&db, store.table(), &period_3).await.unwrap();
    assert_eq!((row.tat, row.log, row.count), (-2, None, Some(3)));
    assert_eq!(run(&store, &[rate]).await.1[0].remaining, 6);
    // The rate's statement leaves the period's columns: its TAT says whose
    // row it is.
    let row = row_of(&db, store.table(), &rate).await.unwrap();
    assert!(row.tat > 0 && row.count == Some(3), "{row:?}");
    assert_eq!(peek(&store, period_3).await.remaining, 5);
    assert_eq!(run(&store, &[window_2]).await.1[0].remaining, 3);
    let row = row_of(&db, store.table(), &window_2).await.unwrap();
    assert_eq!((row.tat, row.start, row.count), (-1, None, None));
    assert_eq!(peek(&store, rate).await.remaining, 10);
}

// One thread: a decision's task cannot run, let alone answer, before the
// caller's first poll returns (on two, a preempted caller may find it
// answered already).
#[tokio::test(flavor = "current_thread")]
async fn a_caller_that_stops_waiting_is_refunded_its_rates_only() {
    let url = env::postgres_url();
    let table = migrated(&url).await.table().to_owned();
    let store = instance(&url, &table).await;
    let (plan, login) = (name("plan"), name("login"));
    let quota = Quota::per_hour(100);
    let window: Rule =
        Window::new(50, Duration::from_secs(3600)).unwrap().into();
    let checks = [
        BucketCheck::new(&plan, "ana", quota, 1).unwrap(),
        BucketCheck::of_rule(&login, "ana", window, 1).unwrap(),
    ];
    // Callers that go away: each future is polled once (the decision is
    // sent) and dropped; each decision runs on, its rate refunded, its
    // window left charged (an over-charge, never a request forgiven).
    for _ in 0..20 {
        let mut out = [Decision::default(); 2];
        let mut call = Box::pin(store.check(&checks, &mut out));
        let first = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(call.as_mut().poll(cx).is_pending())
        })
        .await;
        assert!(first, "a PostgreSQL decision answered without a round trip");
        drop(call);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rate = peek(&store, checks[0]).await;
        let login = peek(&store, checks[1]).await;
        if rate.remaining == 100 && login.remaining == 30 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rate {rate:?}, the window {login:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_table_of_rates_only_is_migrated_in_place_and_again() {
    // A table as an earlier version created it, with a rate's row in it.
    let url = env::postgres_url();
    let db = raw(&url).await;
    let table = unique("trt_old").replace('-', "_");
    db.batch_execute(&format!(
        "CREATE TABLE {table} (key text COLLATE \"C\" PRIMARY KEY, \
         tat_us bigint NOT NULL, expires_us bigint NOT NULL) WITH (fillfactor = 70)"
    ))
    .await
    .unwrap();
    let store = PostgresStorage::builder(&url)
        .unwrap()
        .table(&table)
        .unwrap()
        .build()
        .unwrap();
    assert!(!store.is_migrated().await.unwrap());
    let plan = name("plan");
    let quota = Quota::per_hour(10);
    let rate = BucketCheck::new(&plan, "ana", quota, 1).unwrap();
    // Three spent: the TAT 3 emission intervals ahead.
    db.execute(
        &format!(
            "INSERT INTO {table} SELECT $1, now_us + 3 * 360000000, now_us + 3 * 360000000 \
             FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8 AS now_us) AS c"
        ),
        &[&rate.key(KeyLayout::Single)],
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    assert!(store.is_migrated().await.unwrap());
    let columns: Vec<String> = db
        .query(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = $1::text::regclass \
             AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            &[&table],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        columns,
        [
            "key",
            "tat_us",
            "expires_us",
            "log_us",
            "period_start_us",
            "period_count",
            "slots"
        ]
    );
    let store = instance(&url, &table).await;
    assert_eq!(peek(&store, rate).await.remaining, 7);
    let login = name("login");
    let window: Rule = Window::new(2, Duration::from_secs(60)).unwrap().into();
    let both = [
        rate,
        BucketCheck::of_rule(&login, "ana", window, 1).unwrap(),
    ];
    assert!(run(&store, &both).await.0);
    assert_eq!(peek(&store, rate).await.remaining, 6);
}

#[tokio::test]
async fn windows_and_periods_expire_when_they_no_longer_count() {
    let url = env::postgres_url();
    let store = migrated(&url).await;
    let db = raw(&url).await;
    let (brief, daily) = (name("brief"), name("daily"));
    // A window of 1.5 ms rounds up to an expiry 2 ms after its newest entry.
    let window: Rule =
        Window::new(3, Duration::from_micros(1500)).unwrap().into();
    let period = Period::new(5, PeriodUnit::Day, 0).unwrap();
    let w = BucketCheck::of_rule(&brief, "ana", window, 2).unwrap();
    let p = BucketCheck::of_rule(&daily, "ana", period.into(), 1).unwrap();
    assert!(run(&store, &[w, p]).await.0);
    let row = row_of(&db, store.table(), &w).await.unwrap();
    let log = row.log.clone().unwrap();
    let newest: i64 = log
        .trim_matches(|c| c == '{' || c == '}')
        .split(',')
        .next_back()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!((row.tat, row.expires), (-1, newest + 2000), "{row:?}");
    assert_eq!(log, format!("{{{newest},{newest}}}"));
    let row = row_of(&db, store.table(), &p).await.unwrap();
    let start = u64::try_from(row.start.unwrap()).unwrap();
    assert_eq!(start % DAY, 0);
    // The next midnight (UTC), the time to live rounded up to the ms.
    let next = us(period.next_start(start).unwrap());
    assert!(
        (next..next + 1000).contains(&row.expires),
        "{row:?}, next {next}"
    );
    // Once the window has passed, the cleanup removes its row alone.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(store.cleanup(100).await.unwrap(), 1);
    assert!(row_of(&db, store.table(), &w).await.is_none());
    assert!(row_of(&db, store.table(), &p).await.is_some());
    assert_eq!(peek(&store, w).await.remaining, 3);
    assert_eq!(peek(&store, p).await.remaining, 4);
}
