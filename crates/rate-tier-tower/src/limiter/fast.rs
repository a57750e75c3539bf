//! The limiter's two in-process fast paths, over the memory store it
//! holds: the tier's limit alone ([`MemoryStorage::check_rate`]), and a
//! tier with rate limits of its own charged together
//! ([`MemoryStorage::try_charge_rates`]). Each answers only what it answers
//! exactly as the prepared path does (`tests/fast_paths.rs`), and leaves
//! the rest to it with nothing written.
//!
//! [`MemoryStorage::check_rate`]: rate_tier_storage::MemoryStorage::check_rate
//! [`MemoryStorage::try_charge_rates`]: rate_tier_storage::MemoryStorage::try_charge_rates

use std::borrow::Cow;
use std::time::Duration;

use gcra_core::Decision;
use rate_tier_storage::{BucketCheck, RateCharge, Rule, StorageExt};

use super::RateTier;
use super::ask::Ask;
use super::future::{Output, failed_output};
use super::prepare::INLINE;
use super::rates::RateTierEntry;
use super::ruling::{Events, Judged, Ruling};
use super::step::Failed;
use crate::event::LimitEvent;
use crate::identity::UserId;
use crate::outcome::{
    Admitted, LimitReason, Limited, RateLimitInfo, RatePart, shared_rates_with,
};

/// The tier's limit alone, decided: what both outcomes are made of, in a
/// few words that stay in registers.
#[derive(Debug, Clone, Copy)]
pub(super) struct TierDecision {
    tier: &'static str,
    cost: u32,
    /// The burst applied.
    limit: u32,
    window_us: u64,
    remaining: u64,
    reset_after_us: u64,
    /// `None`: allowed.
    pub(super) retry_after_us: Option<u64>,
    now_us: u64,
    /// The store that decided.
    by: &'static str,
}

impl TierDecision {
    /// The memory store's `decision` on `tier`, at `now_us`.
    pub(super) fn of_memory(
        tier: &RateTierEntry,
        cost: u32,
        decision: Decision,
        now_us: u64,
    ) -> Self {
        TierDecision {
            tier: tier.name,
            cost,
            limit: tier.quota.burst(),
            window_us: tier.quota.burst_offset_us(),
            remaining: decision.remaining,
            reset_after_us: decision.reset_after_us,
            retry_after_us: (!decision.allowed)
                .then_some(decision.retry_after_us),
            now_us,
            by: "memory",
        }
    }

    /// What a refusal tells the listeners.
    #[cold]
    pub(super) fn limited_event(&self, user: &str) -> LimitEvent {
        LimitEvent::Limited {
            user_id: UserId::from(user),
            tier: self.tier,
            limit: self.tier,
            of: self.limit,
            cost: self.cost,
            retry_after: Duration::from_micros(
                self.retry_after_us.unwrap_or_default(),
            ),
        }
    }

    /// The same decision as any other's.
    pub(super) fn into_judged(self, events: Events) -> Judged {
        let ruling = match self.outcome() {
            Ok(admitted) => Ruling::Allowed(admitted),
            Err(limited) => Ruling::Limited(limited),
        };
        Judged {
            ruling,
            by: self.by,
            events,
        }
    }

    #[inline(always)]
    pub(super) fn outcome(&self) -> Result<Admitted, Limited> {
        match self.retry_after_us {
            None => Ok(Admitted::new(RateLimitInfo {
                tier: Cow::Borrowed(self.tier),
                limit: self.limit,
                remaining: self.remaining,
                reset_after: Duration::from_micros(self.reset_after_us),
                cost: self.cost,
                window: Duration::from_micros(self.window_us),
                now_us: self.now_us,
                limits: None,
            })),
            Some(retry_after_us) => Err(Limited {
                tier: Cow::Borrowed(self.tier),
                name: Some(self.tier),
                limit: self.limit,
                window_us: self.window_us,
                reason: LimitReason::RateLimited,
                retry_after_us,
                reset_after_us: self.reset_after_us,
                now_us: self.now_us,
                limits: None,
            }),
        }
    }
}

impl RateTier {
    /// The tier and limits of their own, all rates, charged together in
    /// the memory store when all pass and their buckets are held: the
    /// states built from the decisions, nothing else. `None`: anything
    /// else (a refusal, a new bucket, shadow, customers' quotas, another
    /// kind), for the prepared path, which decides it in full; nothing was
    /// charged.
    #[inline]
    pub(super) fn joint_now(&self, ask: &Ask<'_>) -> Option<Admitted> {
        let inner = &*self.inner;
        let (Some((user, claimed)), false, true) =
            (ask.identity, ask.shadow, ask.quotas.is_empty())
        else {
            return None;
        };
        let memory = inner.memory.as_ref().filter(|_| inner.tier_fast)?;
        if ask.extra.len() >= INLINE {
            return None;
        }
        let tier = inner.rates.find(claimed)?;
        let mut keys = [tier.key; INLINE];
        let mut charges = [RateCharge {
            limit: tier.key,
            partition: user,
            quota: tier.quota,
            cost: ask.cost,
        }; INLINE];
        for (i, extra) in ask.extra.iter().enumerate() {
            let limit = extra.limit;
            let Rule::Rate(quota) = limit.rule_for(tier.name) else {
                return None;
            };
            if limit.shadow {
                return None;
            }
            keys[i + 1] = limit.key;
            charges[i + 1] = RateCharge {
                limit: limit.key,
                partition: extra.partition.as_deref().unwrap_or(user),
                quota,
                cost: extra.cost,
            };
        }
        let count = ask.extra.len() + 1;
        let mut out = [Decision::default(); INLINE];
        let now_us =
            memory.try_charge_rates(&charges[..count], &mut out[..count])?;
        // The most constraining: the first with the fewest left.
        let most = (0..count).min_by_key(|&i| out[i].remaining).unwrap_or(0);
        let (quota, decision) = (charges[most].quota, out[most]);
        let states = shared_rates_with(count, |i| RatePart {
            key: keys[i],
            quota: charges[i].quota,
            remaining: out[i].remaining,
            reset_after_us: out[i].reset_after_us,
        });
        Some(Admitted::new(RateLimitInfo {
            tier: Cow::Borrowed(tier.name),
            limit: quota.burst(),
            remaining: decision.remaining,
            reset_after: Duration::from_micros(decision.reset_after_us),
            cost: ask.cost,
            window: Duration::from_micros(quota.burst_offset_us()),
            now_us,
            limits: Some(states),
        }))
    }

    /// A decision on one of the fast paths, as the direct API answers it:
    /// no step, no events gathered (a refusal is told to the listeners at
    /// once), for a check nobody times. `None`: anything else, for
    /// [`RateTier::step`] (nothing was decided).
    #[inline(always)]
    pub(crate) fn tier_answer(&self, ask: &Ask<'_>) -> Option<Output> {
        match ask.tier_alone() {
            Some((user, claimed, cost)) => {
                self.tier_alone_answer(user, claimed, cost)
            }
            None if self.observed() => None,
            None => self.joint_now(ask).map(|admitted| Ok(Ok(admitted))),
        }
    }

    /// The tier's limit alone, `user` on `claimed` at `cost` (not 0),
    /// decided in process: [`RateTier::tier_answer`]'s common case.
    #[inline(always)]
    pub(crate) fn tier_alone_answer(
        &self,
        user: &str,
        claimed: &str,
        cost: u32,
    ) -> Option<Output> {
        if !self.tier_path_open() {
            return None;
        }
        let inner = &*self.inner;
        let Some(memory) = &inner.memory else {
            return Some(match self.tier_now(user, claimed, cost)? {
                Ok(decision) => self.tier_output(user, decision),
                Err(failed) => failed_output(self, claimed, cost, failed),
            });
        };
        // The common case, its answer built where it is returned.
        let tier = inner.rates.find(claimed)?;
        if cost > tier.quota.burst() {
            return None;
        }
        let (decision, now_us) =
            match memory.check_rate(tier.key, user, &tier.quota, cost) {
                Ok(decided) => decided,
                Err(error) => {
                    let policy = tier.on_storage_error;
                    let failed = Failed { error, policy };
                    return Some(failed_output(self, claimed, cost, failed));
                }
            };
        if !decision.allowed {
            let decision =
                TierDecision::of_memory(&tier, cost, decision, now_us);
            return Some(self.tier_output(user, decision));
        }
        Some(Ok(Ok(Admitted::new(RateLimitInfo {
            tier: Cow::Borrowed(tier.name),
            limit: tier.quota.burst(),
            remaining: decision.remaining,
            reset_after: Duration::from_micros(decision.reset_after_us),
            cost,
            window: Duration::from_micros(tier.quota.burst_offset_us()),
            now_us,
            limits: None,
        }))))
    }

    /// The direct API's answer to the tier's decision, a refusal told to
    /// the listeners.
    fn tier_output(&self, user: &str, decision: TierDecision) -> Output {
        self.tell_if_refused(user, &decision);
        Ok(decision.outcome())
    }

    /// Tells the listeners of the tier's refusal, if `decision` is one.
    pub(super) fn tell_if_refused(&self, user: &str, decision: &TierDecision) {
        if decision.retry_after_us.is_some() && self.listening() {
            self.emit(|| decision.limited_event(user));
        }
    }

    /// Whether the tier alone may take its own fast path: nothing else to
    /// do for it, and nobody timing checks.
    #[inline(always)]
    pub(super) fn tier_path_open(&self) -> bool {
        self.inner.tier_fast && !self.observed()
    }

    /// The tier's limit alone, decided in process. `None` when anything
    /// else is involved (an unknown tier, a cost above the burst, a store
    /// that needs I/O): the prepared path then decides, and reports.
    #[inline(always)]
    pub(super) fn tier_now(
        &self,
        user: &str,
        claimed: &str,
        cost: u32,
    ) -> Option<Result<TierDecision, Failed>> {
        let inner = &*self.inner;
        if inner.memory.is_none() && !inner.answers_ready {
            return None;
        }
        // The tier, resolved at the last reload.
        let tier = inner.rates.find(claimed)?;
        let (name, key, quota, policy) =
            (tier.name, tier.key, tier.quota, tier.on_storage_error);
        if cost > quota.burst() {
            return None;
        }
        if let Some(memory) = &inner.memory {
            // Names its buckets by its own keyed hash: no key secret.
            return Some(match memory.check_rate(key, user, &quota, cost) {
                Ok((decision, now_us)) => {
                    Ok(TierDecision::of_memory(&tier, cost, decision, now_us))
                }
                Err(error) => Err(Failed { error, policy }),
            });
        }
        let check = BucketCheck::new(key, user, quota, cost)
            .ok()?
            .key_secret(inner.key_secret.as_ref());
        let mut out = [Decision::default()];
        let checks = std::slice::from_ref(&check);
        let decided = inner.store.check(checks, &mut out).ready()?;
        let decided = match decided {
            Ok(decided) => decided,
            Err(error) => return Some(Err(Failed { error, policy })),
        };
        let [decision] = out;
        // A fallback's local share, during an outage.
        let applied = match decided.share {
            0 | 1 => quota,
            _ => decided.applied(0, quota),
        };
        Some(Ok(TierDecision {
            tier: name,
            cost,
            limit: applied.burst(),
            window_us: applied.burst_offset_us(),
            remaining: decision.remaining,
            reset_after_us: decision.reset_after_us,
            retry_after_us: decided
                .verdict
                .refused_by
                .map(|_| decided.verdict.retry_after_us),
            now_us: decided.now_us.unwrap_or_else(|| inner.clock.now_us()),
            by: decided.by,
        }))
    }
}
