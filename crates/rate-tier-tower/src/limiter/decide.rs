//! The decision: from who, which tier and which limits, to a [`Ruling`],
//! with the policies applied and an event for each thing worth reporting.
//! Every way in (the layer, [`RateTier::check`], [`RateTier::decide`]) goes
//! through here.
//!
//! A [`Ruling`] in an `Err` is an answer reached early (a cost above the
//! burst, a denied tier): it is moved once, and boxing it would allocate
//! on every such refusal.
#![allow(clippy::result_large_err)]

use std::borrow::Cow;
use std::time::Duration;

use gcra_core::{CheckError, Decision, Quota, Verdict};
use http::StatusCode;
use rate_tier_storage::{
    BucketCheck, Charged, Decided, LimitName, StorageError,
};
use smallvec::SmallVec;

use super::RateTier;
use crate::error::Error;
use crate::event::LimitEvent;
use crate::identity::UserId;
use crate::limit::Limit;
use crate::observe::Outcome;
use crate::outcome::{
    LimitReason, LimitState, Limited, RateLimitInfo, States, most_constraining,
    shared_states,
};
use crate::plans::{Plans, StaticName, Tier};
use crate::policy::{OnMissing, OnStorageError, OnUnknownTier};

/// Up to this many buckets (the plan and three limits), a quiet decision
/// works on stack arrays.
const FEW: usize = 4;

/// Where a decision reports its events; `None` when nobody listens, so that
/// no event (and no copy of a user id) is built per request for no one.
pub(crate) type Emit<'a> = Option<&'a (dyn Fn(LimitEvent) + Sync)>;

pub(crate) fn report(emit: Emit<'_>, event: impl FnOnce() -> LimitEvent) {
    if let Some(emit) = emit {
        emit(event());
    }
}

/// What one decision is asked.
#[derive(Debug, Clone)]
pub(crate) struct Ask<'a> {
    /// The user and the tier they claim; `None`: no identity.
    pub(crate) identity: Option<(&'a str, &'a str)>,
    /// The plan's cost; 0 reads the buckets (a peek).
    pub(crate) cost: u32,
    /// Other limits that apply, each with its partition and cost.
    pub(crate) extra: SmallVec<[Extra<'a>; 2]>,
    /// Every limit in shadow mode.
    pub(crate) shadow: bool,
}

/// A limit of its own in a decision.
#[derive(Debug, Clone)]
pub(crate) struct Extra<'a> {
    pub(crate) limit: &'a Limit,
    /// `None`: the request's user (per-user limits).
    pub(crate) partition: Option<Cow<'a, str>>,
    pub(crate) cost: u32,
}

/// What a decision came to.
#[derive(Debug)]
pub(crate) enum Ruling {
    /// Passed, charged to every bucket.
    Allowed(RateLimitInfo),
    /// Passed unchecked by an explicit policy (an unknown tier allowed, a
    /// store or identity failure with fail-open).
    Unlimited,
    /// Refused by a limit (429), or never passing (403).
    Limited(Limited),
    /// Refused before any limit applied: no identity.
    Denied(StatusCode),
    /// Refused because something needed failed (the store, the identity
    /// lookup): transient, answered with `retry-after`.
    Unavailable {
        status: StatusCode,
        /// The store's error; `None` for a failed identity lookup.
        error: Option<StorageError>,
    },
    /// A bug or a broken clock: 500.
    Invalid(Error),
}

impl Ruling {
    /// The configured tier whose quota applied, if any: never a name a
    /// client sent (metrics labels stay bounded).
    pub(crate) fn tier(&self) -> Option<&'static str> {
        let name = match self {
            Ruling::Allowed(info) => &info.tier,
            Ruling::Limited(limited) => &limited.tier,
            _ => return None,
        };
        match name {
            Cow::Borrowed(name) => Some(name),
            Cow::Owned(_) => None,
        }
    }

    /// What happened, for observers.
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Ruling::Allowed(info) if info.shadow_limited() => {
                Outcome::ShadowLimited
            }
            Ruling::Allowed(_) => Outcome::Allowed,
            Ruling::Unlimited => Outcome::Unlimited,
            Ruling::Limited(limited) => match limited.reason {
                LimitReason::RateLimited => Outcome::Limited,
                LimitReason::CostExceedsBurst { .. } => {
                    Outcome::CostExceedsBurst
                }
                LimitReason::UnknownTier => Outcome::UnknownTierDenied,
            },
            Ruling::Denied(_) => Outcome::MissingIdentity,
            Ruling::Unavailable { error: Some(_), .. } => Outcome::StorageError,
            Ruling::Unavailable { error: None, .. } => Outcome::IdentityError,
            Ruling::Invalid(_) => Outcome::Invalid,
        }
    }
}

impl Prepared<'_> {
    /// The same decision, owning what it borrowed, to await the store in a
    /// future of its own.
    pub(crate) fn into_owned(self) -> Prepared<'static> {
        let owned = |bucket: Bucket<'_>| Bucket {
            key: bucket.key,
            partition: Cow::Owned(bucket.partition.into_owned()),
            quota: bucket.quota,
            cost: bucket.cost,
            shadow: bucket.shadow,
        };
        Prepared {
            tier: self.tier,
            user: Cow::Owned(self.user.into_owned()),
            cost: self.cost,
            buckets: self.buckets.into_iter().map(owned).collect(),
            never: self.never.into_iter().map(owned).collect(),
            on_storage_error: self.on_storage_error,
        }
    }
}

/// One bucket of a prepared decision.
#[derive(Debug, Clone)]
struct Bucket<'a> {
    key: &'static LimitName,
    partition: Cow<'a, str>,
    quota: Quota,
    cost: u32,
    shadow: bool,
}

impl Bucket<'_> {
    /// The limit's name: the tier's, or a limit's of its own.
    fn label(&self) -> &'static str {
        self.key.as_str_static()
    }
}

/// A decision with every policy applied and every bucket known, ready for
/// the store.
#[derive(Debug)]
pub(crate) struct Prepared<'a> {
    tier: &'static str,
    user: Cow<'a, str>,
    cost: u32,
    /// Room for the plan and three limits of its own without spilling.
    buckets: SmallVec<[Bucket<'a>; 4]>,
    /// Shadow limits whose cost is above their burst: never checked, always
    /// reported as would-be refusals.
    never: Vec<Bucket<'a>>,
    on_storage_error: OnStorageError,
}

impl Prepared<'_> {
    /// The plan's cost of the request.
    pub(crate) fn cost(&self) -> u32 {
        self.cost
    }
}

/// The plan's limit alone, decided: what both outcomes are made of.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanDecision {
    tier: &'static str,
    cost: u32,
    /// The burst applied.
    limit: u32,
    window_us: u64,
    remaining: u64,
    reset_after_us: u64,
    /// `None`: allowed.
    retry_after_us: Option<u64>,
    now_us: u64,
    /// The store that decided.
    pub(crate) by: &'static str,
}

impl PlanDecision {
    /// Passed: the limits' state; refused: the refusal.
    #[inline]
    pub(crate) fn outcome(&self) -> Result<RateLimitInfo, Limited> {
        match self.retry_after_us {
            None => Ok(RateLimitInfo {
                tier: Cow::Borrowed(self.tier),
                limit: self.limit,
                remaining: self.remaining,
                reset_after: Duration::from_micros(self.reset_after_us),
                cost: self.cost,
                window: Duration::from_micros(self.window_us),
                now_us: self.now_us,
                limits: None,
            }),
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

    pub(crate) fn into_ruling(self) -> Ruling {
        match self.outcome() {
            Ok(info) => Ruling::Allowed(info),
            Err(limited) => Ruling::Limited(limited),
        }
    }
}

/// What a decision came to, as [`RateTier::decide`] answers it when it is
/// made (the inner result of its future).
pub(crate) type Answer = Result<RateLimitInfo, Limited>;

/// A store that failed to decide, and the policy that answers for it.
#[derive(Debug)]
pub(crate) struct Failed {
    error: StorageError,
    policy: OnStorageError,
}

impl RateTier {
    /// The ruling on a store's failure, and the store that failed.
    pub(crate) fn failed_ruling(
        &self,
        failed: Failed,
        emit: Emit<'_>,
    ) -> (Ruling, &'static str) {
        let Failed { error, policy } = failed;
        (self.failed(policy, error, emit), self.inner.storage.kind())
    }

    /// Applies the identity and tier policies and builds the buckets.
    pub(crate) fn prepare<'a>(
        &self,
        ask: &Ask<'a>,
        emit: Emit<'_>,
    ) -> Result<Prepared<'a>, Ruling> {
        self.inner
            .with_plans(|plans| self.prepare_with(plans, ask, emit))
    }

    fn prepare_with<'a>(
        &self,
        plans: &Plans,
        ask: &Ask<'a>,
        emit: Emit<'_>,
    ) -> Result<Prepared<'a>, Ruling> {
        let (user, claimed) = match ask.identity {
            Some(identity) => identity,
            None => {
                report(emit, || LimitEvent::MissingIdentity);
                match (plans.on_missing, plans.default_entry()) {
                    (OnMissing::Deny(status), _) => {
                        return Err(Ruling::Denied(status));
                    }
                    // One shared bucket: `user` "" is never an identity.
                    (OnMissing::UseDefault, Some(default)) => {
                        ("", default.name)
                    }
                    (OnMissing::UseDefault, None) => {
                        return Err(Ruling::Denied(StatusCode::UNAUTHORIZED));
                    }
                }
            }
        };
        let tier = self.resolve(plans, user, claimed, emit)?;
        let mut buckets = SmallVec::new();
        let mut never = Vec::new();
        let plan = Bucket {
            key: tier.key,
            partition: Cow::Borrowed(user),
            quota: tier.quota,
            cost: ask.cost,
            shadow: ask.shadow,
        };
        self.admit(plan, user, tier.name, &mut buckets, &mut never, emit)?;
        for extra in &ask.extra {
            let limit = extra.limit;
            let bucket = Bucket {
                key: limit.key,
                partition: extra
                    .partition
                    .clone()
                    .unwrap_or(Cow::Borrowed(user)),
                quota: limit.quota_for(tier.name),
                cost: extra.cost,
                shadow: ask.shadow || limit.shadow,
            };
            self.admit(
                bucket,
                user,
                tier.name,
                &mut buckets,
                &mut never,
                emit,
            )?;
        }
        Ok(Prepared {
            tier: tier.name,
            user: Cow::Borrowed(user),
            cost: ask.cost,
            buckets,
            never,
            on_storage_error: plans.on_storage_error,
        })
    }

    /// Adds a bucket, or refuses the decision when its cost can never pass
    /// (403, without touching the store). A shadow limit never refuses: its
    /// impossible cost is a would-be refusal to report.
    fn admit<'a>(
        &self,
        bucket: Bucket<'a>,
        user: &str,
        tier: &'static str,
        buckets: &mut SmallVec<[Bucket<'a>; 4]>,
        never: &mut Vec<Bucket<'a>>,
        emit: Emit<'_>,
    ) -> Result<(), Ruling> {
        let burst = bucket.quota.burst();
        if bucket.cost <= burst {
            buckets.push(bucket);
            return Ok(());
        }
        if bucket.shadow {
            report(emit, || LimitEvent::ShadowLimited {
                user_id: UserId::from(user),
                tier,
                limit: bucket.label(),
                retry_after: Duration::ZERO,
            });
            never.push(bucket);
            return Ok(());
        }
        let cost = bucket.cost;
        report(emit, || LimitEvent::CostExceedsBurst {
            user_id: UserId::from(user),
            tier,
            limit: bucket.label(),
            cost,
            burst,
        });
        Err(Ruling::Limited(Limited {
            tier: Cow::Borrowed(tier),
            name: Some(bucket.label()),
            limit: burst,
            window_us: bucket.quota.burst_offset_us(),
            reason: LimitReason::CostExceedsBurst { cost },
            retry_after_us: 0,
            reset_after_us: 0,
            now_us: self.inner.clock.now_us(),
            limits: None,
        }))
    }

    /// The configured tier a claimed one stands for, by the unknown-tier
    /// policy.
    fn resolve<'p>(
        &self,
        plans: &'p Plans,
        user: &str,
        claimed: &str,
        emit: Emit<'_>,
    ) -> Result<&'p Tier, Ruling> {
        if let Some(found) = plans.find(claimed) {
            return Ok(found);
        }
        let policy = plans.on_unknown_tier;
        report(emit, || LimitEvent::UnknownTier {
            user_id: UserId::from(user),
            tier: claimed.to_owned(),
            policy,
        });
        match (policy, plans.default_entry()) {
            (OnUnknownTier::UseDefault, Some(default)) => Ok(default),
            (OnUnknownTier::Allow, _) => Err(Ruling::Unlimited),
            // Deny, or UseDefault without a default (refused at build time).
            _ => Err(Ruling::Limited(Limited {
                tier: Cow::Owned(claimed.to_owned()),
                name: None,
                limit: 0,
                window_us: 0,
                reason: LimitReason::UnknownTier,
                retry_after_us: 0,
                reset_after_us: 0,
                now_us: self.inner.clock.now_us(),
                limits: None,
            })),
        }
    }

    /// Decides without awaiting, if the store decides in process; `None`
    /// when it needs I/O.
    pub(crate) fn decide_local(
        &self,
        prepared: &Prepared<'_>,
        emit: Emit<'_>,
    ) -> Option<(Ruling, &'static str)> {
        let storage = &*self.inner.storage;
        // One bucket (the plan's alone): no vector, nothing to collect.
        if let [bucket] = prepared.buckets.as_slice() {
            let check = [self.check_of(bucket)?];
            let mut out = [Decision::default()];
            let decided = storage.check_local(&check, &mut out)?;
            return Some(self.conclude(prepared, decided, &out, None, emit));
        }
        let checks = self.checks(prepared);
        let mut out: SmallVec<[Decision; 3]> =
            SmallVec::from_elem(Decision::default(), checks.len());
        if checks.is_empty() {
            // Only shadow limits that can never pass: nothing to ask.
            let nothing = Decided::new(Verdict::of([], &[]), None, "none");
            return Some(self.conclude(
                prepared,
                Ok(nothing),
                &out,
                None,
                emit,
            ));
        }
        let decided = storage.check_local(&checks, &mut out)?;
        Some(self.conclude(prepared, decided, &out, None, emit))
    }

    /// Decides through the store's I/O.
    pub(crate) async fn decide_remote(
        &self,
        prepared: &Prepared<'_>,
        emit: Emit<'_>,
    ) -> (Ruling, &'static str) {
        let checks = self.checks(prepared);
        let mut out: SmallVec<[Decision; 3]> =
            SmallVec::from_elem(Decision::default(), checks.len());
        // The store's time is Redis's: the reset times use ours.
        let now_us = self.inner.clock.now_us();
        let decided = self.inner.storage.check(&checks, &mut out).await;
        self.conclude(prepared, decided, &out, Some(now_us), emit)
    }

    /// The store's check of a bucket (its cost was checked in `admit`).
    fn check_of<'p>(
        &'p self,
        bucket: &'p Bucket<'_>,
    ) -> Option<BucketCheck<'p>> {
        BucketCheck::new(
            bucket.key,
            &bucket.partition,
            bucket.quota,
            bucket.cost,
        )
        .ok()
        .map(|check| {
            check
                .shadow(bucket.shadow)
                .key_secret(self.inner.key_secret.as_ref())
        })
    }

    fn checks<'p>(
        &'p self,
        prepared: &'p Prepared<'_>,
    ) -> SmallVec<[BucketCheck<'p>; 3]> {
        prepared
            .buckets
            .iter()
            .filter_map(|bucket| self.check_of(bucket))
            .collect()
    }

    /// The common case on its own path: the plan's limit alone, on a store
    /// that decides in process. `None` when anything else is involved (an
    /// unknown tier, a cost above the burst, a store that needs I/O): the
    /// general path then decides, and reports; or when the store failed,
    /// which `failed` then holds. It builds no vector, takes the plans'
    /// snapshot and looks the tier up once, and hands back a small plain
    /// decision that each caller turns into its own outcome (no enum of
    /// outcomes on the way: it stays in registers).
    #[inline(always)]
    pub(crate) fn decide_plan_now(
        &self,
        user: &str,
        claimed: &str,
        cost: u32,
        emit: Emit<'_>,
        failed: &mut Option<Failed>,
    ) -> Option<PlanDecision> {
        let inner = &*self.inner;
        // What the decision needs of the plans, copied out of the snapshot
        // (names are interned): a few words, not a decision, cross it.
        let (name, key, quota, policy) = inner.with_plans(|plans| {
            plans
                .tiers
                .iter()
                .find(|t| same_name(t.name, claimed))
                .map(|t| (t.name, t.key, t.quota, plans.on_storage_error))
        })?;
        if cost == 0 || cost > quota.burst() {
            return None;
        }
        let check = BucketCheck::new(key, user, quota, cost)
            .ok()?
            .key_secret(inner.key_secret.as_ref());
        let decided = match &inner.memory {
            // The default store's hot path: plain values, nothing to
            // unpack (one enforced bucket: refused iff it refused).
            Some(memory) => memory.check_one(&check).map(|(decision, now)| {
                let refused = !decision.allowed;
                let retry = refused.then_some(decision.retry_after_us);
                (decision, quota, now, retry, "memory")
            }),
            None => {
                let mut out = [Decision::default()];
                let checks = std::slice::from_ref(&check);
                inner.storage.check_local(checks, &mut out)?.map(|decided| {
                    let [decision] = out;
                    // A fallback's local share, during an outage.
                    let applied = match decided.share {
                        0 | 1 => quota,
                        _ => decided.applied(0, quota),
                    };
                    let now =
                        decided.now_us.unwrap_or_else(|| inner.clock.now_us());
                    let retry = decided
                        .verdict
                        .refused_by
                        .map(|_| decided.verdict.retry_after_us);
                    (decision, applied, now, retry, decided.by)
                })
            }
        };
        let (decision, applied, now_us, retry_after_us, by) = match decided {
            Ok(decided) => decided,
            Err(error) => {
                *failed = Some(Failed { error, policy });
                return None;
            }
        };
        if let Some(retry_after_us) = retry_after_us {
            report(emit, || LimitEvent::Limited {
                user_id: UserId::from(user),
                tier: name,
                limit: name,
                cost,
                retry_after: Duration::from_micros(retry_after_us),
            });
        }
        Some(PlanDecision {
            tier: name,
            cost,
            limit: applied.burst(),
            window_us: applied.burst_offset_us(),
            remaining: decision.remaining,
            reset_after_us: decision.reset_after_us,
            retry_after_us,
            now_us,
            by,
        })
    }

    /// [`RateTier::decide`]'s common case on a path of its own: nobody to
    /// tell (no observer, no listener), a configured tier, every cost within
    /// its burst, a store that decides in process. The buckets go straight
    /// to the store and the limits' states straight into the outcome, with
    /// the plans read once: no [`Ask`] and no [`Prepared`] to build. `None`:
    /// anything else, which the general path decides and reports (a store
    /// that failed is asked again there, and nothing was charged).
    pub(crate) fn decide_quiet(
        &self,
        user: &str,
        claimed: &str,
        cost: u32,
        shadow: bool,
        limits: &[(&Limit, Option<&str>, u32)],
    ) -> Option<Answer> {
        let inner = &*self.inner;
        if self.observed() || self.listening() {
            return None;
        }
        let (tier, key, quota) = inner.with_plans(|plans| {
            plans
                .tiers
                .iter()
                .find(|t| same_name(t.name, claimed))
                .map(|t| (t.name, t.key, t.quota))
        })?;
        // The plan and up to FEW - 1 limits, on stack arrays (slots past
        // `count` repeat the last bucket, unused); more: the general path.
        let count = limits.len() + 1;
        if count > FEW {
            return None;
        }
        let secret = inner.key_secret.as_ref();
        let bucket =
            |i: usize| match i.checked_sub(1).and_then(|i| limits.get(i)) {
                None => (key, user, quota, cost, shadow),
                Some(&(limit, partition, cost)) => (
                    limit.key,
                    partition.unwrap_or(user),
                    limit.quota_for(tier),
                    cost,
                    shadow || limit.shadow,
                ),
            };
        // Plain loops over filled arrays: `array::from_fn` costs more here.
        // The names, kept `'static` for the states; the rest is in the
        // checks.
        let check_of = |(key, partition, quota, cost, shadow)| {
            BucketCheck::new(key, partition, quota, cost)
                .ok()
                .map(|check| check.shadow(shadow).key_secret(secret))
        };
        let mut keys = [key; FEW];
        // Filled with the plan's check (slots past `count` unused).
        let mut checks = [check_of(bucket(0))?; FEW];
        for i in 1..count {
            let bucket = bucket(i);
            keys[i] = bucket.0;
            checks[i] = check_of(bucket)?;
        }
        let checks = &checks[..count];
        let mut out = [Decision::default(); FEW];
        let out = &mut out[..count];
        let decided = match &inner.memory {
            Some(memory) => memory.check_sync(checks, out),
            None => inner.storage.check_local(checks, out)?,
        }
        .ok()?;
        let now_us = decided.now_us.unwrap_or_else(|| inner.clock.now_us());
        let mut states = [LimitState::EMPTY; FEW];
        for (i, ((state_of, (&key, check)), decision)) in states
            .iter_mut()
            .zip(keys.iter().zip(checks))
            .zip(&*out)
            .enumerate()
        {
            let (quota, shadow) = (check.quota(), check.is_shadow());
            // A fallback's local share, during an outage (else not called).
            let applied = match decided.share {
                0 | 1 => quota,
                _ => decided.applied(i, quota),
            };
            *state_of =
                state(key, applied, decision, shadow, decided.charged(i));
        }
        let states = &states[..count];
        match self.rule(tier, user, cost, &decided, states, now_us, None) {
            Ruling::Allowed(info) => Some(Ok(info)),
            Ruling::Limited(limited) => Some(Err(limited)),
            _ => None,
        }
    }

    /// The store's answer, as a ruling; and the store that decided.
    fn conclude(
        &self,
        prepared: &Prepared<'_>,
        decided: Result<Decided, StorageError>,
        out: &[Decision],
        local_now: Option<u64>,
        emit: Emit<'_>,
    ) -> (Ruling, &'static str) {
        let decided = match decided {
            Ok(decided) => decided,
            Err(error) => {
                let ruling =
                    self.failed(prepared.on_storage_error, error, emit);
                return (ruling, self.inner.storage.kind());
            }
        };
        let now_us = decided
            .now_us
            .or(local_now)
            .unwrap_or_else(|| self.inner.clock.now_us());
        let mut limits: SmallVec<[LimitState; 3]> = SmallVec::new();
        for (i, (bucket, decision)) in
            prepared.buckets.iter().zip(out).enumerate()
        {
            let applied = decided.applied(i, bucket.quota);
            limits.push(state(
                bucket.key,
                applied,
                decision,
                bucket.shadow,
                decided.charged(i),
            ));
            if bucket.shadow && !decision.allowed {
                report(emit, || LimitEvent::ShadowLimited {
                    user_id: UserId::from(&*prepared.user),
                    tier: prepared.tier,
                    limit: bucket.label(),
                    retry_after: Duration::from_micros(decision.retry_after_us),
                });
            }
        }
        for bucket in &prepared.never {
            let never = Decision {
                retry_after_us: 0,
                ..Decision::default()
            };
            limits.push(state(
                bucket.key,
                bucket.quota,
                &never,
                true,
                Charged::Primary,
            ));
        }
        let ruling = self.rule(
            prepared.tier,
            &prepared.user,
            prepared.cost,
            &decided,
            &limits,
            now_us,
            emit,
        );
        (ruling, decided.by)
    }

    /// Allowed, with the most constraining limit in front; or limited by
    /// the limit that refused with the longest wait, reported.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn rule(
        &self,
        tier: &'static str,
        user: &str,
        cost: u32,
        decided: &Decided,
        states: &[LimitState],
        now_us: u64,
        emit: Emit<'_>,
    ) -> Ruling {
        // The plan's enforced limit alone is told by the outcome's fields.
        let limits: States = match states {
            [plan] if !plan.shadow => None,
            _ => Some(shared_states(states)),
        };
        match decided.verdict.refused_by {
            None => {
                let most = match states {
                    [only] => Some(*only),
                    _ => states.get(most_constraining(states)).copied(),
                };
                Ruling::Allowed(RateLimitInfo {
                    tier: Cow::Borrowed(tier),
                    limit: most.map_or(u32::MAX, |s| s.limit),
                    remaining: most.map_or(u64::MAX, |s| s.remaining),
                    reset_after: most.map_or(Duration::ZERO, |s| s.reset_after),
                    cost,
                    window: most.map_or(Duration::ZERO, |s| s.window),
                    now_us,
                    limits,
                })
            }
            Some(index) => {
                let refusing = states.get(index).copied();
                let retry_after =
                    Duration::from_micros(decided.verdict.retry_after_us);
                let name = refusing.map_or(tier, |s| s.name);
                report(emit, || LimitEvent::Limited {
                    user_id: UserId::from(user),
                    tier,
                    limit: name,
                    cost,
                    retry_after,
                });
                Ruling::Limited(Limited {
                    tier: Cow::Borrowed(tier),
                    name: Some(name),
                    limit: refusing.map_or(0, |s| s.limit),
                    window_us: refusing.map_or(0, |s| micros(s.window)),
                    reason: LimitReason::RateLimited,
                    retry_after_us: decided.verdict.retry_after_us,
                    reset_after_us: refusing
                        .map_or(0, |s| micros(s.reset_after)),
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
        emit: Emit<'_>,
    ) -> Ruling {
        match error {
            StorageError::Check(CheckError::TimeOutOfRange) => {
                Ruling::Invalid(Error::Check(CheckError::TimeOutOfRange))
            }
            StorageError::Check(CheckError::ZeroCost) => {
                Ruling::Invalid(Error::ZeroCost)
            }
            // Anything else the store says, these included, is its failure
            // to decide: the policy answers, never a silent pass.
            error => {
                report(emit, || LimitEvent::StorageError {
                    storage: self.inner.storage.kind(),
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

/// A bucket's state after a decision, under the quota the store applied.
fn state(
    key: &'static LimitName,
    applied: Quota,
    decision: &Decision,
    shadow: bool,
    charged: Charged,
) -> LimitState {
    LimitState {
        charged,
        name: key.as_str_static(),
        limit: applied.burst(),
        remaining: decision.remaining,
        reset_after: Duration::from_micros(decision.reset_after_us),
        window: Duration::from_micros(applied.burst_offset_us()),
        shadow,
        shadow_limited: shadow && !decision.allowed,
    }
}

/// Whether two names are the same, byte by byte: names are short, and a
/// call to `memcmp` costs more than the loop.
#[inline]
fn same_name(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| x == y)
}

/// A duration made from µs, in µs again.
fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}
