//! Steps 1 and 2 of a decision: each descriptor's limit and the partition
//! of its bucket, then `replaces`; and the buckets a request's descriptors
//! land in.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use gcra_core::Quota;
use rate_tier_storage::{BucketCheck, LimitName, StorageError};
use smallvec::SmallVec;

use crate::config::{Domain, Rule, RuleLimit, Unit, quota_for};

/// The limit a descriptor got: a config rule or its own override.
pub(super) struct Applied<'c> {
    pub(super) bucket: &'c LimitName,
    pub(super) label: &'c str,
    pub(super) name: &'c str,
    pub(super) requests_per_unit: u32,
    pub(super) unit: Unit,
    pub(super) limit: RuleLimit,
    pub(super) shadow: bool,
    pub(super) stats: StatsRef<'c>,
}

pub(super) enum StatsRef<'c> {
    Rule(&'c Rule),
    Override,
}

pub(super) enum Plan<'c> {
    NoLimit,
    Unlimited,
    Limited {
        applied: Applied<'c>,
        cost: u64,
        group: usize,
    },
}

/// The buckets of one request: descriptors in the same bucket merged.
pub(super) struct Group<'c> {
    pub(super) bucket: &'c LimitName,
    pub(super) partition: String,
    pub(super) limit: RuleLimit,
    pub(super) cost: u64,
    pub(super) shadow: bool,
}

impl Group<'_> {
    /// Whether no wait can make it pass (a limit of 0, a cost above the
    /// burst).
    pub(super) fn never(&self) -> bool {
        match self.limit {
            RuleLimit::Never => self.cost > 0,
            RuleLimit::Quota(quota) => self.cost > u64::from(quota.burst()),
            RuleLimit::Unlimited => false,
        }
    }

    /// The store's check of this bucket: the same key for a decision, a
    /// peek and a reset.
    pub(super) fn check(
        &self,
        quota: Quota,
        cost: u32,
    ) -> Result<BucketCheck<'_>, StorageError> {
        Ok(BucketCheck::new(self.bucket, &self.partition, quota, cost)?
            .shadow(self.shadow))
    }

    pub(super) fn quota(&self) -> Option<Quota> {
        match self.limit {
            RuleLimit::Quota(quota) => Some(quota),
            _ => None,
        }
    }
}

/// Step 1 of a decision: each descriptor's limit and the partition of its
/// bucket.
pub(super) fn plan_all<'c>(
    domain: &'c Domain,
    request: &RateLimitRequest,
) -> (SmallVec<[Plan<'c>; 4]>, SmallVec<[String; 4]>) {
    let request_cost = u64::from(request.hits_addend.max(1));
    let mut plans: SmallVec<[Plan<'_>; 4]> = SmallVec::new();
    let mut partitions: SmallVec<[String; 4]> = SmallVec::new();
    for descriptor in &request.descriptors {
        let cost = descriptor
            .hits_addend
            .as_ref()
            .map_or(request_cost, |h| h.value);
        let (plan, partition) = plan_of(domain, descriptor, cost);
        plans.push(plan);
        partitions.push(partition);
    }
    (plans, partitions)
}

/// Step 2 of a decision: `replaces`.
pub(super) fn drop_replaced<'c>(plans: &mut [Plan<'c>]) {
    let replaced: SmallVec<[&'c str; 4]> = plans
        .iter()
        .filter_map(|p| match p {
            Plan::Limited {
                applied:
                    Applied {
                        stats: StatsRef::Rule(rule),
                        ..
                    },
                ..
            } => {
                let rule: &'c Rule = rule;
                Some(rule.replaces.iter().map(String::as_str))
            }
            _ => None,
        })
        .flatten()
        .collect();
    if replaced.is_empty() {
        return;
    }
    for plan in plans.iter_mut() {
        if let Plan::Limited { applied, .. } = plan
            && !applied.name.is_empty()
            && applied.limit != RuleLimit::Unlimited
            && replaced.contains(&applied.name)
        {
            *plan = Plan::NoLimit;
        }
    }
}

/// The limit of one descriptor, and the partition of its bucket.
fn plan_of<'c>(
    domain: &'c Domain,
    descriptor: &RateLimitDescriptor,
    cost: u64,
) -> (Plan<'c>, String) {
    let entries = || {
        descriptor
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
    };
    if let Some(limit) = &descriptor.limit {
        // Validated before: the unit is known.
        let (Some(unit), false) =
            (Unit::from_proto(limit.unit), descriptor.entries.is_empty())
        else {
            return (Plan::NoLimit, String::new());
        };
        let Some(bucket) = domain.override_bucket(unit) else {
            return (Plan::NoLimit, String::new());
        };
        let (rule_limit, _) = quota_for(limit.requests_per_unit, unit);
        let applied = Applied {
            bucket,
            label: "override",
            name: "",
            requests_per_unit: limit.requests_per_unit,
            unit,
            limit: rule_limit,
            shadow: false,
            stats: StatsRef::Override,
        };
        return (
            Plan::Limited {
                applied,
                cost,
                group: 0,
            },
            Domain::override_partition(entries()),
        );
    }
    match domain.find(entries()) {
        Some(matched) => {
            let rule: &'c Rule = matched.rule;
            let applied = Applied {
                bucket: &rule.bucket,
                label: if rule.name.is_empty() {
                    &rule.path
                } else {
                    &rule.name
                },
                name: &rule.name,
                requests_per_unit: rule.requests_per_unit,
                unit: rule.unit,
                limit: rule.limit,
                shadow: rule.shadow,
                stats: StatsRef::Rule(rule),
            };
            (
                Plan::Limited {
                    applied,
                    cost,
                    group: 0,
                },
                matched.partition,
            )
        }
        None => (Plan::NoLimit, String::new()),
    }
}
