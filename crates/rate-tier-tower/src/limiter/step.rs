//! The decision, in one step: [`RateTier::step`] answers an [`Ask`] at
//! once when the store decides in process, or hands back the [`Pending`]
//! work that awaits it. Every way in (the HTTP and gRPC layer,
//! [`RateTier::check`], [`RateTier::decide`], [`RateTier::peek`]) drives
//! this one function, and reports the events it returns.
//!
//! [`RateTier::check`]: crate::RateTier::check
//! [`RateTier::decide`]: crate::RateTier::decide
//! [`RateTier::peek`]: crate::RateTier::peek

use std::borrow::Cow;
use std::time::Duration;

use gcra_core::{CheckError, Decision, Verdict, saturating_micros};
use rate_tier_storage::StorageExt;
use rate_tier_storage::{Charged, Decided, LimitName, Rule, StorageError};
use smallvec::SmallVec;

use super::RateTier;
use super::ask::Ask;
use super::prepare::{INLINE, Owned, Prepared};
use super::ruling::{Events, Judged, Ruling};
use super::slots::Slots;
use super::wait::Waited;
use crate::error::Error;
use crate::event::LimitEvent;
use crate::identity::UserId;
use crate::outcome::{
    Admitted, LimitReason, LimitState, Limited, RateLimitInfo, States,
    most_constraining, shared_states,
};
use crate::policy::OnStorageError;
use crate::tiers::StaticName;

/// What one step of a decision came to.
#[derive(Debug)]
pub(crate) enum Step {
    /// Decided, with the events to report.
    Ruled(Judged),
    /// The store needs I/O: `pending` finishes the decision. `events` are
    /// those of the step so far, to report now (they are not repeated).
    Pending {
        pending: Box<Pending>,
        events: Events,
    },
}

/// A decision prepared and waiting for the store's I/O; it owns what it
/// needs, so the future that awaits it may outlive the request.
#[derive(Debug)]
pub(crate) struct Pending {
    prepared: Owned,
    /// Whether the step's events were wanted (so are the rest).
    listening: bool,
}

impl Pending {
    /// The tier's cost of the request.
    pub(crate) fn cost(&self) -> u32 {
        self.prepared.cost
    }

    /// Decides through the store's I/O.
    pub(crate) async fn finish(self: Box<Self>, tiers: &RateTier) -> Judged {
        let mut events = Events::new(self.listening);
        let prepared = self.prepared.prepared(tiers.inner.key_secret.as_ref());
        let mut out: SmallVec<[Decision; INLINE]> =
            SmallVec::from_elem(Decision::default(), prepared.checks.len());
        // The store's time may be another machine's (Redis's): the reset
        // times use ours, read before the wait.
        let now_us = tiers.inner.clock.now_us();
        let store = &tiers.inner.store;
        let decided = match &tiers.inner.waiting {
            Some(room) if prepared.may_wait() => {
                // The room holds it to its own longest wait.
                let max_wait = prepared.limits_wait.unwrap_or(room.max_wait);
                let (decided, waited) = room
                    .decide(store, &prepared.checks, max_wait, &mut out)
                    .await;
                let (user, tier) = (prepared.user, prepared.tier);
                match waited {
                    Waited::No => {}
                    Waited::For(wait) => events.push(|| LimitEvent::Waited {
                        user_id: UserId::from(user),
                        tier,
                        wait,
                    }),
                    Waited::Refused => {
                        events.push(|| LimitEvent::WaitRefused {
                            user_id: UserId::from(user),
                            tier,
                        })
                    }
                }
                decided
            }
            _ => store.check(&prepared.checks, &mut out).await,
        };
        let (ruling, by) =
            tiers.conclude(&prepared, decided, &out, Some(now_us), &mut events);
        if let (Some(_), Ruling::Limited(limited)) =
            (&tiers.inner.bans, &ruling)
            && limited.reason == LimitReason::RateLimited
            && !prepared.user.is_empty()
        {
            match count_refusal(tiers, prepared.user).await {
                Ok(Some(ban)) => events.push(|| LimitEvent::Banned {
                    user_id: UserId::from(prepared.user),
                    tier: prepared.tier,
                    ban,
                }),
                Ok(None) => {}
                // Not counted: the store is down, and the refusal stands.
                Err(error) => events.push(|| LimitEvent::StorageError {
                    storage: store.kind(),
                    error: format!("counting a refusal for a ban: {error}"),
                    policy: prepared.on_storage_error,
                }),
            }
        }
        Judged { ruling, by, events }
    }
}

/// Counts a refusal of `user` towards a ban ([`crate::ban`]), to its end:
/// in a task of its own where there is a Tokio runtime, so that a request
/// dropped half-way (its client gone, which a hammering client often is)
/// neither forgets the refusals it counted nor leaves a ban half made (its
/// buckets reset, its end not yet written).
async fn count_refusal(
    tiers: &RateTier,
    user: &str,
) -> Result<Option<Duration>, StorageError> {
    async fn count(
        tiers: &RateTier,
        user: &str,
    ) -> Result<Option<Duration>, StorageError> {
        let inner = &tiers.inner;
        match &inner.bans {
            Some(bans) => {
                let secret = inner.key_secret.as_ref();
                bans.refused(&inner.store, user, secret).await
            }
            None => Ok(None),
        }
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return count(tiers, user).await;
    };
    let (tiers, user) = (tiers.clone(), user.to_owned());
    runtime
        .spawn(async move { count(&tiers, &user).await })
        .await
        .unwrap_or_else(|failed| {
            Err(StorageError::Protocol(format!(
                "counting a refusal stopped: {failed}"
            )))
        })
}

/// A store that failed to decide, and the policy that answers for it.
#[derive(Debug)]
pub(crate) struct Failed {
    pub(super) error: StorageError,
    pub(super) policy: OnStorageError,
}

impl RateTier {
    /// Decides `ask` now if the store decides in process, or prepares the
    /// work that awaits its I/O. The tier's limit alone on a configured
    /// tier, the common case, takes a path of its own: the tiers read and
    /// the tier looked up once, no vector built.
    #[inline(always)]
    pub(crate) fn step(&self, ask: &Ask<'_>, mut events: Events) -> Step {
        if let Some((user, tier, cost)) = ask.tier_alone()
            && self.inner.tier_fast
            && let Some(decided) = self.tier_now(user, tier, cost)
        {
            return match decided {
                Ok(decision) => {
                    if decision.retry_after_us.is_some() {
                        events.push(|| decision.limited_event(user));
                    }
                    Step::Ruled(decision.into_judged(events))
                }
                Err(failed) => {
                    let (ruling, by) = self.failed_tier(failed, &mut events);
                    Step::Ruled(Judged { ruling, by, events })
                }
            };
        }
        if let Some(admitted) = self.joint_now(ask) {
            let ruling = Ruling::Allowed(admitted);
            return Step::Ruled(Judged {
                ruling,
                by: "memory",
                events,
            });
        }
        self.step_prepared(ask, events)
    }

    /// A store's failure on the tier's path as a decision, with its events.
    #[cold]
    #[inline(never)]
    pub(crate) fn failed_judged(&self, failed: Failed) -> Judged {
        let mut events = Events::new(self.listening());
        let (ruling, by) = self.failed_tier(failed, &mut events);
        Judged { ruling, by, events }
    }

    /// [`RateTier::step`] for everything but the tier alone decided in
    /// process: the policies applied, every bucket built.
    #[inline(never)]
    fn step_prepared(&self, ask: &Ask<'_>, mut events: Events) -> Step {
        let mut prepared = Prepared::new();
        if let Err(ruling) = self.prepare(ask, &mut prepared, &mut events) {
            return Step::Ruled(Judged {
                ruling,
                by: "none",
                events,
            });
        }
        // A request that may wait is decided where it can wait; with bans,
        // where a refusal can be counted.
        let local = match (&self.inner.waiting, &self.inner.bans) {
            (Some(_), _) if prepared.may_wait() => None,
            (_, Some(_)) => None,
            // A store that always answers later is not asked twice.
            _ if !self.inner.answers_ready => None,
            _ => self.decide_local(&prepared, &mut events),
        };
        match local {
            Some((ruling, by)) => Step::Ruled(Judged { ruling, by, events }),
            None => Step::Pending {
                pending: Box::new(Pending {
                    prepared: prepared.to_owned(),
                    listening: events.listening(),
                }),
                events,
            },
        }
    }

    /// The ruling on a store's failure on the tier's path: rare, and kept
    /// out of the common one.
    #[cold]
    #[inline(never)]
    fn failed_tier(
        &self,
        failed: Failed,
        events: &mut Events,
    ) -> (Ruling, &'static str) {
        let Failed { error, policy } = failed;
        (self.failed(policy, error, events), self.inner.store.kind())
    }

    /// Decides without awaiting, if the store decides in process; `None`
    /// when it needs I/O.
    fn decide_local(
        &self,
        prepared: &Prepared<'_>,
        events: &mut Events,
    ) -> Option<(Ruling, &'static str)> {
        let checks = &prepared.checks;
        // On the stack for the usual few buckets (a plain array: built in
        // place, where a small vector's constructor is a call).
        let mut inline = [Decision::default(); INLINE];
        let mut spilled: Vec<Decision>;
        let out: &mut [Decision] = match inline.get_mut(..checks.len()) {
            Some(out) => out,
            None => {
                spilled = vec![Decision::default(); checks.len()];
                &mut spilled
            }
        };
        let decided = if checks.is_empty() {
            // Only shadow limits that can never pass: nothing to ask.
            Ok(Decided::new(Verdict::of([], &[]), None, "none"))
        } else {
            self.inner.store.check(checks, out).ready()?
        };
        Some(self.conclude(prepared, decided, out, None, events))
    }

    /// The store's answer, as a ruling; and the store that decided.
    fn conclude(
        &self,
        prepared: &Prepared<'_>,
        decided: Result<Decided, StorageError>,
        out: &[Decision],
        local_now: Option<u64>,
        events: &mut Events,
    ) -> (Ruling, &'static str) {
        let decided = match decided {
            Ok(decided) => decided,
            Err(error) => {
                let ruling =
                    self.failed(prepared.on_storage_error, error, events);
                return (ruling, self.inner.store.kind());
            }
        };
        let now_us = decided
            .now_us
            .or(local_now)
            .unwrap_or_else(|| self.inner.clock.now_us());
        let mut limits: SmallVec<[LimitState; INLINE]> = SmallVec::new();
        // The ban's bucket, read with the limits when bans are on.
        let until: Option<&LimitName> =
            self.inner.bans.is_some().then(|| &*crate::ban::UNTIL);
        let is_until =
            |key: &LimitName| until.is_some_and(|u| std::ptr::eq(key, u));
        let buckets = prepared.keys.iter().zip(&prepared.checks);
        for (i, ((&key, check), decision)) in buckets.zip(out).enumerate() {
            // The ban's bucket is no limit of the customer's to show.
            if is_until(key) {
                continue;
            }
            let shadow = check.is_shadow();
            let applied = decided.applied_rule(i, check.rule());
            limits.push(state(
                key,
                (check.rule(), applied),
                decision,
                shadow,
                decided.charged(i),
                now_us,
            ));
            if shadow && !decision.allowed {
                events.push(|| LimitEvent::ShadowLimited {
                    user_id: UserId::from(prepared.user),
                    tier: prepared.tier,
                    limit: key.as_str_static(),
                    retry_after: Duration::from_micros(decision.retry_after_us),
                });
            }
        }
        for &(key, rule) in &prepared.never {
            let never = Decision {
                retry_after_us: 0,
                ..Decision::default()
            };
            limits.push(state(
                key,
                (rule, rule),
                &never,
                true,
                Charged::Primary,
                now_us,
            ));
        }
        // A ban refuses whatever else would have, with its own end.
        let ban = prepared.keys.iter().zip(out).find(|(key, _)| is_until(key));
        if let Some((_, until)) = ban
            && !until.allowed
        {
            let ruling = banned(prepared, until.retry_after_us, now_us, events);
            return (ruling, decided.by);
        }
        // A peek reads the customer's state, it is not refused: a bucket in
        // debt reads as nothing left (only a ban, above, refuses it).
        let mut decided = decided;
        if prepared.cost == 0 {
            decided.verdict = Verdict::of([], &[]);
        }
        let ruling = self.rule(prepared, &decided, &limits, now_us, events);
        (ruling, decided.by)
    }

    /// Allowed, with the most constraining limit in front; or limited by
    /// the limit that refused with the longest wait, reported.
    fn rule(
        &self,
        prepared: &Prepared<'_>,
        decided: &Decided,
        states: &[LimitState],
        now_us: u64,
        events: &mut Events,
    ) -> Ruling {
        let (tier, cost) = (prepared.tier, prepared.cost);
        // The tier's enforced limit alone is told by the outcome's fields.
        let limits: States = match states {
            [plan] if !plan.shadow => None,
            _ => Some(shared_states(states)),
        };
        match decided.verdict.refused_by {
            None => {
                if let Some(ratio) = self.inner.near_limit {
                    near_limits(prepared, states, ratio, events);
                }
                let most = states.get(most_constraining(states)).copied();
                let info = RateLimitInfo {
                    tier: Cow::Borrowed(tier),
                    limit: most.map_or(u32::MAX, |s| s.limit),
                    remaining: most.map_or(u64::MAX, |s| s.remaining),
                    reset_after: most.map_or(Duration::ZERO, |s| s.reset_after),
                    cost,
                    window: most.map_or(Duration::ZERO, |s| s.window),
                    now_us,
                    limits,
                };
                // A shadow limit that would have refused took no slot.
                let taken = prepared
                    .keys
                    .iter()
                    .copied()
                    .zip(&prepared.checks)
                    .zip(states)
                    .filter(|(_, state)| !state.shadow_limited)
                    .map(|(taken, _)| taken);
                let slots = takes_slots(prepared)
                    .then(|| Slots::held(&self.inner, taken))
                    .flatten();
                Ruling::Allowed(Admitted { info, slots })
            }
            Some(index) => {
                let refusing = states.get(index).copied();
                let retry_after =
                    Duration::from_micros(decided.verdict.retry_after_us);
                let name = refusing.map_or(tier, |s| s.name);
                let of = refusing.map_or(0, |s| s.limit);
                events.push(|| LimitEvent::Limited {
                    user_id: UserId::from(prepared.user),
                    tier,
                    limit: name,
                    of,
                    cost,
                    retry_after,
                });
                Ruling::Limited(Limited {
                    tier: Cow::Borrowed(tier),
                    name: Some(name),
                    limit: of,
                    window_us: refusing
                        .map_or(0, |s| saturating_micros(s.window)),
                    reason: LimitReason::RateLimited,
                    retry_after_us: decided.verdict.retry_after_us,
                    reset_after_us: refusing
                        .map_or(0, |s| saturating_micros(s.reset_after)),
                    now_us,
                    limits,
                })
            }
        }
    }

    /// A store that gave no decision: the storage error policy, unless the
    /// inputs or the clock are at fault.
    fn failed(
        &self,
        policy: OnStorageError,
        error: StorageError,
        events: &mut Events,
    ) -> Ruling {
        match error {
            StorageError::Check(CheckError::TimeOutOfRange) => {
                Ruling::Invalid(Error::Check(CheckError::TimeOutOfRange))
            }
            StorageError::Check(CheckError::ZeroCost) => {
                Ruling::Invalid(Error::ZeroCost)
            }
            // A limit of a kind the store does not decide (one asked for
            // at check time: a layer refuses to be built with one) is a
            // mistake in the code, never a store's failure that a policy
            // could answer with a pass.
            error @ StorageError::Unsupported(_) => {
                Ruling::Invalid(Error::Storage(error))
            }
            // Anything else the store says, these included, is its failure
            // to decide: the policy answers, never a silent pass.
            error => {
                events.push(|| LimitEvent::StorageError {
                    storage: self.inner.store.kind(),
                    error: error.to_string(),
                    policy,
                });
                match policy {
                    OnStorageError::Allow => Ruling::Unlimited,
                    OnStorageError::Deny(status) => Ruling::Unavailable {
                        status,
                        error: Some(error),
                    },
                }
            }
        }
    }
}

/// A bucket's state after a decision at `now_us`, under the rule asked
/// for (kept for a settlement) and the rule the store applied.
fn state(
    key: &'static LimitName,
    (asked, applied): (Rule, Rule),
    decision: &Decision,
    shadow: bool,
    charged: Charged,
    now_us: u64,
) -> LimitState {
    LimitState {
        charged,
        name: key.as_str_static(),
        limit: applied.limit(),
        remaining: decision.remaining,
        reset_after: Duration::from_micros(reset_after_us(applied, decision)),
        window: Duration::from_micros(applied.policy_window_us(now_us)),
        shadow,
        shadow_limited: shadow && !decision.allowed,
        rule: Some(asked),
    }
}

/// When a bucket decided so is told to reset: on a refusal by a rule that
/// [resets at retry](Rule::resets_at_retry), the instant its request may
/// retry; else the store's.
fn reset_after_us(applied: Rule, decision: &Decision) -> u64 {
    if !decision.allowed && applied.resets_at_retry() {
        decision.retry_after_us
    } else {
        decision.reset_after_us
    }
}

/// Whether two names are the same, byte by byte: names are short, and a
/// call to `memcmp` costs more than the loop.
#[inline]
/// A refusal by a ban: 429 until its end, the tier's size for the headers.
fn banned(
    prepared: &Prepared<'_>,
    retry_after_us: u64,
    now_us: u64,
    events: &mut Events,
) -> Ruling {
    let tier = prepared.tier;
    let limit = prepared.checks.first().map_or(0, |c| c.rule().limit());
    events.push(|| LimitEvent::Limited {
        user_id: UserId::from(prepared.user),
        tier,
        limit: "ban",
        of: limit,
        cost: prepared.cost,
        retry_after: Duration::from_micros(retry_after_us),
    });
    Ruling::Limited(Limited {
        tier: Cow::Borrowed(tier),
        name: Some("ban"),
        limit,
        window_us: 0,
        reason: LimitReason::Banned,
        retry_after_us,
        reset_after_us: retry_after_us,
        now_us,
        limits: None,
    })
}

/// The limits this allowed decision brought near their end: what is left
/// fell to at most `1 - ratio` of the limit with this request (reported
/// once per crossing, not on every request beyond it).
fn near_limits(
    prepared: &Prepared<'_>,
    states: &[LimitState],
    ratio: f64,
    events: &mut Events,
) {
    for (state, check) in states.iter().zip(&prepared.checks) {
        if state.shadow
            || check.cost() == 0
            || matches!(check.rule(), Rule::Concurrency(_))
        {
            continue;
        }
        let threshold = near_threshold(state.limit, ratio);
        let before = state.remaining.saturating_add(u64::from(check.cost()));
        if state.remaining <= threshold && before > threshold {
            events.push(|| LimitEvent::NearLimit {
                user_id: UserId::from(prepared.user),
                tier: prepared.tier,
                limit: state.name,
                remaining: state.remaining,
                of: state.limit,
            });
        }
    }
}

/// What is left of `limit` once `ratio` of it is used, rounded down.
fn near_threshold(limit: u32, ratio: f64) -> u64 {
    // ratio in (0, 1], checked at build: the product is in [0, limit]. A
    // hair above it, so that 5 * (1 - 0.8) is 1, not 0.9999999999999998.
    (f64::from(limit) * (1.0 - ratio) + 1e-6).floor() as u64
}

/// Whether a decision has a concurrency limit to take slots of: the slots'
/// bookkeeping is skipped for every other.
#[inline]
fn takes_slots(prepared: &Prepared<'_>) -> bool {
    prepared
        .checks
        .iter()
        .any(|check| matches!(check.rule(), Rule::Concurrency(_)))
}
