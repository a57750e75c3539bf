//! The last step of a decision: each descriptor's status from its bucket's
//! outcome, the stats counted, and the response's headers.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as CurrentLimit,
};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use smallvec::SmallVec;

use super::plan::{Applied, Group, Plan, StatsRef};
use super::stats::{count, near_limit};
use super::{Decider, Outcome, ceil_secs, no_limit};
use crate::headers::{self, Limited};
use crate::metrics::RuleStats;

/// What a decision's response is made of: its buckets (`groups`) and their
/// `outcomes`, in the same order.
pub(super) struct Answering<'d, 'c> {
    pub(super) decider: &'d Decider,
    pub(super) groups: &'d [Group<'c>],
    pub(super) outcomes: &'d [Outcome],
    /// The stats of the request's overrides, if it has any.
    pub(super) override_stats: Option<&'d RuleStats>,
}

impl<'c> Answering<'_, 'c> {
    /// The response to a request of `plans`, `allowed` or refused for
    /// `retry_after_us`; the stats counted as it is made.
    pub(super) fn response(
        &self,
        plans: &[Plan<'c>],
        allowed: bool,
        retry_after_us: u64,
    ) -> RateLimitResponse {
        let mut limited: SmallVec<[Limited<'_>; 4]> = SmallVec::new();
        let mut shadowed = false;
        let statuses = plans
            .iter()
            .map(|plan| match plan {
                Plan::NoLimit => no_limit(),
                Plan::Unlimited => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..DescriptorStatus::default()
                },
                Plan::Limited {
                    applied,
                    cost,
                    group,
                } => {
                    let outcome = self.outcomes[*group];
                    limited.push(Limited {
                        label: applied.label,
                        requests_per_unit: applied.requests_per_unit,
                        window_secs: applied.unit.seconds(),
                        passed: outcome.passed,
                        remaining: outcome.remaining,
                        reset_secs: ceil_secs(outcome.reset_after_us),
                    });
                    shadowed |= !outcome.passed
                        && !applied.shadow
                        && self.decider.options.shadow;
                    self.limited(applied, *cost, &self.groups[*group], outcome)
                }
            })
            .collect();
        if shadowed {
            self.decider.metrics.global_shadow.inc();
        }
        let retry_secs =
            (!allowed && retry_after_us > 0).then(|| ceil_secs(retry_after_us));
        let options = &self.decider.options;
        RateLimitResponse {
            overall_code: if allowed { Code::Ok } else { Code::OverLimit }
                as i32,
            statuses,
            response_headers_to_add: headers::headers(
                options.headers,
                &limited,
                retry_secs,
            ),
            ..RateLimitResponse::default()
        }
    }

    /// The status of a descriptor `applied` at `cost` in bucket `group`,
    /// which came out as `outcome`; its rule's stats counted, and the status
    /// page told of a refusal or a pass near the limit.
    fn limited(
        &self,
        applied: &Applied<'c>,
        cost: u64,
        group: &Group<'c>,
        outcome: Outcome,
    ) -> DescriptorStatus {
        let decider = self.decider;
        let ratio = decider.options.near_limit_ratio;
        let stats = match applied.stats {
            StatsRef::Rule(rule) => rule.stats.get(),
            StatsRef::Override => self.override_stats,
        };
        if let Some(stats) = stats {
            count(stats, applied, cost, &outcome, ratio);
        }
        if let StatsRef::Rule(rule) = applied.stats
            && (!outcome.passed || near_limit(applied, &outcome, ratio))
        {
            decider.status.near(
                &rule.domain,
                &rule.path,
                &group.partition,
                outcome.remaining,
                u64::from(applied.requests_per_unit),
                !outcome.passed,
            );
        }
        let code = if outcome.passed || applied.shadow {
            Code::Ok
        } else {
            Code::OverLimit
        };
        DescriptorStatus {
            code: code as i32,
            current_limit: Some(CurrentLimit {
                name: applied.name.to_owned(),
                requests_per_unit: applied.requests_per_unit,
                unit: applied.unit.proto(),
            }),
            limit_remaining: u32::try_from(outcome.remaining)
                .unwrap_or(u32::MAX),
            duration_until_reset: outcome.has_reset.then(|| ProtoDuration {
                seconds: i64::try_from(ceil_secs(outcome.reset_after_us))
                    .unwrap_or(i64::MAX),
                nanos: 0,
            }),
            quota: None,
        }
    }
}
