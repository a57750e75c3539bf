//! The reference model: what every request should come to, from the rules
//! alone (gcra-core's rates, windows, settlements and reservations) over
//! tables of buckets, and a customer's ban as a plain state (the end of a
//! ban, and the refusals that lead to one). No store, no limiter code: a
//! store or an instance that diverges from it has let a limit go, charged
//! what it refused, forgiven a debt, or banned without cause.

use std::collections::HashMap;
use std::time::Duration;

use gcra_core::{
    Adjust, Charge, Decision, Quota, Reservation, Write, reserve_all,
};
use tower_rate_tier::{Window, rules::Rule};

/// Where a bucket lives: the shared store, or an instance's own memory (a
/// fallback's local store during an outage, or a store per instance).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    Shared,
    Own(usize),
}

/// The buckets of one place, by (limit, partition).
#[derive(Debug, Default, Clone)]
pub struct Table {
    tats: HashMap<(String, String), u64>,
    /// A window's log, and when the whole of it expires (its last write
    /// and the window, rounded up to the ms, as a store keeps it).
    logs: HashMap<(String, String), (Vec<u64>, u64)>,
    /// A customer's ban: its end, and the refusals counted towards one.
    bans: HashMap<String, u64>,
    refusals: HashMap<String, (Vec<u64>, u64)>,
}

/// A reservation's wait, the TATs it writes (bucket, TAT) and what it
/// reserved.
type Reserving = (u64, Vec<(String, u64)>, Reserved);

impl Table {
    /// Forgets what has expired at `now`, as a store may at any time once
    /// it has (a sweep): a rate whose TAT has passed, a log whose every
    /// entry has expired. (Only a clock that later goes back tells.)
    pub fn forget_expired(&mut self, now: u64) {
        self.tats.retain(|_, tat| *tat > now);
        self.logs.retain(|_, (_, expires)| *expires > now);
        self.refusals.retain(|_, (_, expires)| *expires > now);
        // A store holds a ban's end as a TAT a millisecond later.
        self.bans.retain(|_, until| *until + 1_000 > now);
    }

    /// Forgets every bucket of `user` (a reset): their tiers, their own
    /// limits, their ban.
    pub fn reset(&mut self, user: &str) {
        self.tats.retain(|(_, partition), _| partition != user);
        self.logs.retain(|(_, partition), _| partition != user);
        self.bans.remove(user);
        self.refusals.remove(user);
    }
}

/// One bucket of a request: its limit's name, its rule, its cost.
#[derive(Debug, Clone)]
pub struct Bucket {
    pub name: String,
    pub rule: Rule,
    pub cost: u32,
}

/// What a request should come to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// Served now, or after `wait_us`, each limit with this much left
    /// (in the request's order).
    Served {
        wait_us: u64,
        remaining: Vec<(String, u64)>,
    },
    /// Refused by this limit, told to retry after this long.
    Limited { limit: String, retry_after_us: u64 },
    /// Refused: the customer is banned until this long from now.
    Banned { retry_after_us: u64 },
    /// Refused: the cost can never pass (403).
    CostExceedsBurst,
    /// The store could not decide (503; nothing changed).
    Unavailable,
}

/// A reservation made for a request that may still be given back (its
/// client went away before its slot): each rate bucket's reservation.
#[derive(Debug, Clone)]
pub struct Reserved {
    pub place: Place,
    pub buckets: Vec<(String, String, Quota, Reservation)>,
}

/// A customer's bans: after `refusals` refusals within `within`, banned
/// for `length` (a ban that never doubles).
#[derive(Debug, Clone, Copy)]
pub struct BanRule {
    pub refusals: u32,
    pub within: Duration,
    pub length: Duration,
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap()
}

impl Table {
    /// The customer's ban end, if it is still ahead of `now`.
    pub fn banned(&self, user: &str, now: u64) -> Option<u64> {
        self.bans.get(user).copied().filter(|&until| until > now)
    }

    /// A refusal of `user` counted towards a ban (by `rule`, its window of
    /// refusals divided by `share` for a local decision): `Some(end)` when
    /// it bans. `can_ban`: a ban can be written (its store answers);
    /// otherwise the K-th refusal only clears the count, as a reset that
    /// failed half-way leaves it.
    pub fn count_refusal(
        &mut self,
        user: &str,
        rule: &BanRule,
        share: u32,
        now: u64,
        can_ban: bool,
    ) -> Option<u64> {
        let window =
            match Rule::from(Window::new(rule.refusals, rule.within).unwrap())
                .divided(share)
            {
                Rule::Window(window) => window,
                _ => unreachable!("a window stays a window"),
            };
        let log = live_log(&mut self.refusals, user.to_owned(), now);
        let decided = window.check(&log.0, now, 1).unwrap();
        // A pass's write is its charge, a refusal's a repair.
        apply_log(log, decided.write, now);
        if !decided.allowed || decided.remaining > 0 {
            return None;
        }
        self.refusals.remove(user);
        if !can_ban {
            return None;
        }
        let until = now + us(rule.length);
        self.bans.insert(user.to_owned(), until);
        Some(until)
    }

    /// Decides `buckets` of `user` at `now`, all or nothing, as a check;
    /// charges them if every one passes. `Ok(remaining)` or
    /// `Err((index, retry_after))` of the refusing bucket with the longest
    /// wait (the first on a tie).
    pub fn check(
        &mut self,
        user: &str,
        buckets: &[Bucket],
        now: u64,
    ) -> Result<Vec<(String, u64)>, (usize, u64)> {
        let mut decided = Vec::new();
        let mut refused: Option<(usize, u64)> = None;
        for (i, bucket) in buckets.iter().enumerate() {
            let key = (bucket.name.clone(), user.to_owned());
            let d = match bucket.rule {
                Rule::Rate(quota) => {
                    let d = quota
                        .check(self.tats.get(&key).copied(), now, bucket.cost)
                        .unwrap();
                    (d.allowed, d.remaining, d.retry_after_us, Some(d), None)
                }
                Rule::Window(window) => {
                    let log = live_log(&mut self.logs, key.clone(), now);
                    let d = window.check(&log.0, now, bucket.cost).unwrap();
                    (
                        d.allowed,
                        d.remaining,
                        d.retry_after_us,
                        None,
                        Some(d.write),
                    )
                }
                other => panic!("the model has no {other:?}"),
            };
            if !d.0 && refused.is_none_or(|(_, r)| d.2 > r) {
                refused = Some((i, d.2));
            }
            decided.push((key, d));
        }
        if let Some(refused) = refused {
            return Err(refused);
        }
        let mut remaining = Vec::new();
        for ((key, (_, left, _, rate, log)), bucket) in
            decided.into_iter().zip(buckets)
        {
            if let Some(Decision {
                store: Some(store), ..
            }) = rate
            {
                self.tats.insert(key.clone(), store.tat_us);
            }
            if let Some(write) = log {
                apply_log(
                    self.logs.entry(key.clone()).or_default(),
                    write,
                    now,
                );
            }
            remaining.push((bucket.name.clone(), left));
        }
        Ok(remaining)
    }

    /// Reserves the earliest slot of `buckets` (rates alone) within
    /// `max_wait_us`: `reserve_all` on this table. `Some((wait, remaining,
    /// reservation))` when reserved, its charges written.
    pub fn reserve(
        &mut self,
        user: &str,
        buckets: &[Bucket],
        now: u64,
        max_wait_us: u64,
        place: Place,
    ) -> Option<Reserving> {
        let quotas: Vec<Quota> = buckets
            .iter()
            .map(|b| match b.rule {
                Rule::Rate(quota) => quota,
                _ => unreachable!("only rates reserve"),
            })
            .collect();
        let charges: Vec<Charge> = quotas
            .iter()
            .zip(buckets)
            .map(|(&quota, b)| Charge::new(quota, b.cost))
            .collect();
        let keys: Vec<(String, String)> = buckets
            .iter()
            .map(|b| (b.name.clone(), user.to_owned()))
            .collect();
        let stored: Vec<Option<u64>> =
            keys.iter().map(|k| self.tats.get(k).copied()).collect();
        let mut out = vec![Decision::default(); buckets.len()];
        let joint =
            reserve_all(&charges, &stored, now, max_wait_us, &mut out).unwrap();
        if !joint.reserved {
            return None;
        }
        let mut reserved = Reserved {
            place,
            buckets: Vec::new(),
        };
        let mut remaining = Vec::new();
        for (((key, decision), quota), bucket) in
            keys.into_iter().zip(&out).zip(quotas).zip(buckets)
        {
            if let Some(store) = decision.store {
                self.tats.insert(key.clone(), store.tat_us);
                reserved.buckets.push((
                    key.0.clone(),
                    key.1.clone(),
                    quota,
                    Reservation {
                        wait_us: joint.wait_us,
                        cost: bucket.cost,
                        store,
                    },
                ));
            }
            remaining.push((bucket.name.clone(), decision.remaining));
        }
        Some((joint.wait_us, remaining, reserved))
    }

    /// Gives back a reservation whose client went away (`Quota::cancel`:
    /// exact while no later charge moved the bucket, else kept).
    pub fn cancel(&mut self, reserved: &Reserved, now: u64) {
        for (name, partition, quota, reservation) in &reserved.buckets {
            let key = (name.clone(), partition.clone());
            match quota.cancel(self.tats.get(&key).copied(), now, reservation) {
                Write::Set(store) => {
                    self.tats.insert(key, store.tat_us);
                }
                Write::Clear => {
                    self.tats.remove(&key);
                }
                Write::Keep => {}
            }
        }
    }

    /// Settles `name`'s bucket of `user` under `quota` by `adjust`.
    pub fn settle(
        &mut self,
        name: &str,
        user: &str,
        quota: Quota,
        adjust: Adjust,
        now: u64,
    ) {
        let key = (name.to_owned(), user.to_owned());
        let settled = quota
            .settle(self.tats.get(&key).copied(), now, adjust)
            .unwrap();
        match settled.write {
            Write::Set(store) => {
                self.tats.insert(key, store.tat_us);
            }
            Write::Clear => {
                self.tats.remove(&key);
            }
            Write::Keep => {}
        }
    }
}

/// The log of `key`, read as empty once the whole of it has expired (a
/// store reads an expired log as absent).
fn live_log<K: std::hash::Hash + Eq>(
    logs: &mut HashMap<K, (Vec<u64>, u64)>,
    key: K,
    now: u64,
) -> &mut (Vec<u64>, u64) {
    let log = logs.entry(key).or_default();
    if log.1 <= now {
        log.0.clear();
    }
    log
}

/// Applies a window's write to its log, which then expires `ttl_ms` from
/// `now`.
fn apply_log(
    log: &mut (Vec<u64>, u64),
    write: Option<gcra_core::LogWrite>,
    now: u64,
) {
    if let Some(write) = write {
        let kept = write.kept(log.0.len());
        log.0.truncate(kept.end);
        log.0.drain(..kept.start);
        log.0
            .extend(std::iter::repeat_n(write.entry_us, write.append));
        log.1 = now + write.ttl_ms * 1000;
    }
}
