//! From an [`Ask`] to a [`Prepared`] decision: the identity, tier and cost
//! policies applied, every bucket known, nothing asked of the store yet.
//!
//! A [`Ruling`] in an `Err` is an answer reached early (a cost above the
//! burst, a denied tier): it is moved once, and boxing it would allocate
//! on every such refusal.
#![allow(clippy::result_large_err)]

use std::borrow::Cow;
use std::time::Duration;

use http::StatusCode;
use rate_tier_storage::key::KeySecret;
use rate_tier_storage::{BucketCheck, LimitName, Rule};
use smallvec::SmallVec;

use super::RateTier;
use super::ask::Ask;
use super::ruling::{Events, Ruling};
use crate::error::Error;
use crate::event::LimitEvent;
use crate::identity::UserId;
use crate::outcome::{LimitReason, Limited};
use crate::policy::{OnMissing, OnStorageError, OnUnknownTier};
use crate::tiers::StaticName;
use crate::tiers::{Tier, Tiers};

/// Buckets of one decision held without spilling to the heap: the tier and
/// three limits of its own.
pub(crate) const INLINE: usize = 4;

/// A decision with every policy applied and every bucket's check built,
/// ready for the store. It borrows the ask's names and partitions: nothing
/// is copied on the way.
#[derive(Debug)]
pub(crate) struct Prepared<'a> {
    pub(crate) tier: &'static str,
    pub(crate) user: &'a str,
    pub(crate) cost: u32,
    /// Each check's limit name, `'static` for the states.
    pub(crate) keys: SmallVec<[&'static LimitName; INLINE]>,
    pub(crate) checks: SmallVec<[BucketCheck<'a>; INLINE]>,
    /// Shadow limits whose cost is above their burst: never checked, always
    /// reported as would-be refusals.
    pub(crate) never: Vec<(&'static LimitName, Rule)>,
    pub(crate) on_storage_error: OnStorageError,
    /// The shortest [`Limit::wait_up_to`](crate::Limit::wait_up_to) of
    /// the decision's enforced limits, if one has one.
    pub(crate) limits_wait: Option<Duration>,
}

impl Prepared<'_> {
    /// Whether the decision may wait for its slot: rates alone, and some
    /// charged (a peek never waits).
    pub(crate) fn may_wait(&self) -> bool {
        self.checks.iter().all(BucketCheck::is_rate)
            && self.checks.iter().any(|check| check.cost() > 0)
    }

    /// Nothing prepared yet.
    pub(crate) fn new() -> Self {
        Prepared {
            tier: "",
            user: "",
            cost: 0,
            keys: SmallVec::new(),
            checks: SmallVec::new(),
            never: Vec::new(),
            on_storage_error: OnStorageError::default(),
            limits_wait: None,
        }
    }

    /// The same decision, owning what it borrowed, to await the store in a
    /// future of its own.
    pub(crate) fn to_owned(&self) -> Owned {
        let user = self.user.to_owned();
        let buckets = self
            .checks
            .iter()
            .zip(&self.keys)
            .map(|(check, &key)| OwnedBucket {
                key,
                partition: (check.partition() != self.user)
                    .then(|| check.partition().to_owned()),
                rule: check.rule(),
                cost: check.cost(),
                shadow: check.is_shadow(),
                lease: check.lease(),
            })
            .collect();
        Owned {
            tier: self.tier,
            user,
            cost: self.cost,
            buckets,
            never: self.never.clone(),
            on_storage_error: self.on_storage_error,
            limits_wait: self.limits_wait,
        }
    }
}

/// A [`Prepared`] decision that owns its partitions.
#[derive(Debug)]
pub(crate) struct Owned {
    tier: &'static str,
    user: String,
    pub(crate) cost: u32,
    buckets: SmallVec<[OwnedBucket; INLINE]>,
    never: Vec<(&'static LimitName, Rule)>,
    on_storage_error: OnStorageError,
    limits_wait: Option<Duration>,
}

#[derive(Debug)]
struct OwnedBucket {
    key: &'static LimitName,
    /// `None`: the user's.
    partition: Option<String>,
    rule: Rule,
    cost: u32,
    shadow: bool,
    lease: u64,
}

impl Owned {
    /// The decision again, its checks borrowing from here.
    pub(crate) fn prepared<'p>(
        &'p self,
        secret: Option<&'p KeySecret>,
    ) -> Prepared<'p> {
        let mut keys = SmallVec::new();
        let mut checks = SmallVec::new();
        for bucket in &self.buckets {
            let partition = bucket.partition.as_deref().unwrap_or(&self.user);
            // Built from a check that was valid: it still is.
            if let Ok(check) = BucketCheck::of_rule(
                bucket.key,
                partition,
                bucket.rule,
                bucket.cost,
            ) {
                keys.push(bucket.key);
                checks.push(
                    check
                        .shadow(bucket.shadow)
                        .key_secret(secret)
                        .lease_id(bucket.lease),
                );
            }
        }
        Prepared {
            tier: self.tier,
            user: &self.user,
            cost: self.cost,
            keys,
            checks,
            never: self.never.clone(),
            on_storage_error: self.on_storage_error,
            limits_wait: self.limits_wait,
        }
    }
}

/// What a decision needs of the tiers: the tier that applies, and the
/// store's failure policy.
#[derive(Debug, Clone, Copy)]
struct Resolved {
    name: &'static str,
    key: &'static LimitName,
    rule: Rule,
    on_storage_error: OnStorageError,
}

impl Resolved {
    fn of(tiers: &Tiers, tier: &Tier) -> Self {
        Resolved {
            name: tier.name,
            key: tier.key,
            rule: tier.rule,
            on_storage_error: tiers.on_storage_error,
        }
    }
}

/// A bucket as the policies find it: its limit, partition, rule, cost,
/// and whether it is in shadow mode.
type Bucket<'a> = (&'static LimitName, &'a str, Rule, u32, bool);

impl RateTier {
    /// Applies the identity and tier policies and builds the buckets.
    pub(crate) fn prepare<'p>(
        &'p self,
        ask: &Ask<'p>,
        prepared: &mut Prepared<'p>,
        events: &mut Events,
    ) -> Result<(), Ruling> {
        // What the decision needs of the tiers, copied out of the snapshot
        // (names are interned): a few words cross it, not the decision.
        let (user, tier) = self
            .inner
            .with_tiers(|tiers| self.resolve(tiers, ask, events))?;
        prepared.tier = tier.name;
        prepared.user = user;
        prepared.cost = ask.cost;
        prepared.on_storage_error = tier.on_storage_error;
        prepared.limits_wait = None;
        let secret = self.inner.key_secret.as_ref();
        let tier_rule =
            own_rule(ask, tier.name, tier.rule)?.unwrap_or(tier.rule);
        self.admit(
            prepared,
            (tier.key, user, tier_rule, ask.cost, ask.shadow),
            secret,
            events,
        )?;
        for extra in ask.extra {
            let limit = extra.limit;
            let configured = limit.rule_for(tier.name);
            let rule = match own_rule(ask, limit.name(), configured)? {
                Some(own) => limit.with_settle_debt(own),
                None => configured,
            };
            let shadow = ask.shadow || limit.shadow;
            if let Some(wait) = limit.wait_up_to.filter(|_| !shadow) {
                prepared.limits_wait =
                    Some(prepared.limits_wait.map_or(wait, |w| w.min(wait)));
            }
            let bucket = (
                limit.key,
                extra.partition.as_deref().unwrap_or(user),
                rule,
                extra.cost,
                shadow,
            );
            self.admit(prepared, bucket, secret, events)?;
        }
        // Last: a ban refuses the decision by itself (see `crate::ban`): a
        // state read, never charged.
        if let Some(bans) = &self.inner.bans
            && !user.is_empty()
        {
            prepared.keys.push(&crate::ban::UNTIL);
            prepared.checks.push(bans.until_check(user, secret));
        }
        Ok(())
    }

    /// Adds a bucket's check, or refuses the decision when its cost can
    /// never pass (403, without touching the store). A shadow limit never
    /// refuses: its impossible cost is a would-be refusal to report.
    fn admit<'a>(
        &self,
        prepared: &mut Prepared<'a>,
        (key, partition, rule, cost, shadow): Bucket<'a>,
        secret: Option<&'a KeySecret>,
        events: &mut Events,
    ) -> Result<(), Ruling> {
        if let Ok(check) = BucketCheck::of_rule(key, partition, rule, cost) {
            // A slot of a concurrency limit is known by its request's id
            // on a store that leases slots.
            let lease = match rule {
                Rule::Concurrency(_) => lease_id(),
                _ => 0,
            };
            prepared.keys.push(key);
            prepared
                .checks
                .push(check.shadow(shadow).key_secret(secret).lease_id(lease));
            return Ok(());
        }
        let (tier, label) = (prepared.tier, key.as_str_static());
        if shadow {
            events.push(|| LimitEvent::ShadowLimited {
                user_id: UserId::from(prepared.user),
                tier,
                limit: label,
                retry_after: Duration::ZERO,
            });
            prepared.never.push((key, rule));
            return Ok(());
        }
        let burst = rule.limit();
        let now_us = self.inner.clock.now_us();
        events.push(|| LimitEvent::CostExceedsBurst {
            user_id: UserId::from(prepared.user),
            tier,
            limit: label,
            cost,
            burst,
        });
        Err(Ruling::Limited(Limited {
            tier: Cow::Borrowed(tier),
            name: Some(label),
            limit: burst,
            window_us: rule.policy_window_us(now_us),
            reason: LimitReason::CostExceedsBurst { cost },
            retry_after_us: 0,
            reset_after_us: 0,
            now_us,
            limits: None,
        }))
    }

    /// The user, and the configured tier whose quota applies, by the
    /// identity and unknown-tier policies.
    fn resolve<'a>(
        &self,
        tiers: &Tiers,
        ask: &Ask<'a>,
        events: &mut Events,
    ) -> Result<(&'a str, Resolved), Ruling> {
        let (user, claimed) = match ask.identity {
            Some(identity) => identity,
            None => {
                events.push(|| LimitEvent::MissingIdentity);
                match (tiers.on_missing, tiers.default_entry()) {
                    (OnMissing::Deny(status), _) => {
                        return Err(Ruling::Denied(status));
                    }
                    // One shared bucket: `user` "" is never an identity.
                    (OnMissing::UseDefault, Some(default)) => {
                        return Ok(("", Resolved::of(tiers, default)));
                    }
                    (OnMissing::UseDefault, None) => {
                        return Err(Ruling::Denied(StatusCode::UNAUTHORIZED));
                    }
                }
            }
        };
        if let Some(found) = tiers.find(claimed) {
            return Ok((user, Resolved::of(tiers, found)));
        }
        let policy = tiers.on_unknown_tier;
        events.push(|| LimitEvent::UnknownTier {
            user_id: UserId::from(user),
            tier: claimed.to_owned(),
            policy,
        });
        match (policy, tiers.default_entry()) {
            (OnUnknownTier::UseDefault, Some(default)) => {
                Ok((user, Resolved::of(tiers, default)))
            }
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
}

/// The customer's own rule for the tier or limit `name` in place of
/// `configured`, if `ask` has one; one of another kind is refused (never a
/// silent change of kind, never unlimited).
fn own_rule(
    ask: &Ask<'_>,
    name: &str,
    configured: Rule,
) -> Result<Option<Rule>, Ruling> {
    match ask.quotas.iter().find(|(n, _)| n == name) {
        None => Ok(None),
        Some((_, own)) if own.kind() == configured.kind() => Ok(Some(*own)),
        Some(_) => Err(Ruling::Invalid(Error::OwnQuota(name.to_owned()))),
    }
}

/// A new id for a request's slots: 64 random bits (std's per-process
/// random keys over a counter), never 0.
fn lease_id() -> u64 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let keys = KEYS.get_or_init(std::collections::hash_map::RandomState::new);
    keys.hash_one(NEXT.fetch_add(1, Ordering::Relaxed)).max(1)
}
