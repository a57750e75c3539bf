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
use rate_tier_storage::{BucketCheck, Decided, LimitName, StorageError};
use smallvec::SmallVec;

use super::RateTier;
use crate::error::Error;
use crate::event::LimitEvent;
use crate::identity::UserId;
use crate::limit::Limit;
use crate::observe::Outcome;
use crate::outcome::{LimitReason, LimitState, Limited, RateLimitInfo, States};
use crate::plans::{Plans, StaticName, Tier};
use crate::policy::{OnMissing, OnStorageError, OnUnknownTier};
use std::sync::Arc;

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
    buckets: SmallVec<[Bucket<'a>; 2]>,
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

impl RateTier {
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
        buckets: &mut SmallVec<[Bucket<'a>; 2]>,
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
            name: Cow::Borrowed(bucket.label()),
            limit: burst,
            window: Duration::from_micros(bucket.quota.burst_offset_us()),
            reason: LimitReason::CostExceedsBurst { cost },
            retry_after: Duration::ZERO,
            reset_after: Duration::ZERO,
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
                name: Cow::Owned(claimed.to_owned()),
                limit: 0,
                window: Duration::ZERO,
                reason: LimitReason::UnknownTier,
                retry_after: Duration::ZERO,
                reset_after: Duration::ZERO,
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
    /// general path then decides, and reports. It builds no vector and
    /// takes the plans' snapshot once.
    pub(crate) fn decide_plan_now(
        &self,
        user: &str,
        claimed: &str,
        cost: u32,
        emit: Emit<'_>,
    ) -> Option<(Ruling, &'static str)> {
        self.inner.with_plans(|plans| {
            let tier = plans.find(claimed)?;
            let check = [BucketCheck::new(tier.key, user, tier.quota, cost)
                .ok()
                .filter(|_| cost > 0)?
                .key_secret(self.inner.key_secret.as_ref())];
            let mut out = [Decision::default()];
            let decided =
                match self.inner.storage.check_local(&check, &mut out)? {
                    Ok(decided) => decided,
                    Err(error) => {
                        let ruling =
                            self.failed(plans.on_storage_error, error, emit);
                        return Some((ruling, self.inner.storage.kind()));
                    }
                };
            let [decision] = out;
            let plan = [state(
                tier.key,
                decided.applied(tier.quota),
                &decision,
                false,
            )];
            let now_us =
                decided.now_us.unwrap_or_else(|| self.inner.clock.now_us());
            let ruling =
                self.rule(tier.name, user, cost, &decided, &plan, now_us, emit);
            Some((ruling, decided.by))
        })
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
        for (bucket, decision) in prepared.buckets.iter().zip(out) {
            let applied = decided.applied(bucket.quota);
            limits.push(state(bucket.key, applied, decision, bucket.shadow));
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
            limits.push(state(bucket.key, bucket.quota, &never, true));
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
            _ => Some(Arc::from(states)),
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
                    name: most.map_or(tier, |s| s.name),
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
                    name: Cow::Borrowed(name),
                    limit: refusing.map_or(0, |s| s.limit),
                    window: refusing.map_or(Duration::ZERO, |s| s.window),
                    reason: LimitReason::RateLimited,
                    retry_after,
                    reset_after: refusing
                        .map_or(Duration::ZERO, |s| s.reset_after),
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
) -> LimitState {
    LimitState {
        name: key.as_str_static(),
        limit: applied.burst(),
        remaining: decision.remaining,
        reset_after: Duration::from_micros(decision.reset_after_us),
        window: Duration::from_micros(applied.burst_offset_us()),
        shadow,
        shadow_limited: shadow && !decision.allowed,
    }
}

/// The enforced limit with the least remaining (the first on a tie, so the
/// plan's when they are equal).
fn most_constraining(limits: &[LimitState]) -> usize {
    let mut most = 0;
    for (i, state) in limits.iter().enumerate() {
        let best = limits.get(most);
        let better = match best {
            Some(best) if best.shadow && !state.shadow => true,
            Some(best) => !state.shadow && state.remaining < best.remaining,
            None => true,
        };
        if better {
            most = i;
        }
    }
    most
}
