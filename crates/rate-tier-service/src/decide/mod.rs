//! One `ShouldRateLimit` call: the request's descriptors matched against the
//! config, decided by the store as **one** decision, and the response.
//!
//! # The decision
//!
//! Each descriptor is matched (see [`config`](crate::config)). Every
//! descriptor that has a limit becomes one bucket check (descriptors of one
//! request that land in the same bucket are merged, their costs added), and
//! all the checks are decided together by
//! [`StorageExt::check`]: if any enforced
//! limit refuses, **nothing** is charged (envoyproxy/ratelimit charges every
//! descriptor, even when one refuses).
//!
//! | descriptor | status |
//! |---|---|
//! | unknown domain, no rule, replaced, or a request deeper than the rule | `OK`, no `current_limit` |
//! | `unlimited` | `OK`, `limit_remaining` 4294967295, no store touched |
//! | `requests_per_unit: 0`, cost >= 1 | `OVER_LIMIT`, no store touched; the request is refused |
//! | cost above the limit (it can never pass) | `OVER_LIMIT`; the request is refused, nothing charged |
//! | a limit | `OK` or `OVER_LIMIT` from GCRA; `limit_remaining` after the charge; `duration_until_reset` until the bucket is full again (whole seconds, rounded up) |
//! | `shadow_mode` rule that refuses | `OK`, `limit_remaining` 0; counted in `shadow_mode`; never refuses the request |
//! | `--shadow` | every limit in shadow: the request is `OK`; statuses still say `OVER_LIMIT` where a limit would have refused (as upstream's `SHADOW_MODE`) |
//!
//! A descriptor that passed on its own in a refused request reports its
//! bucket as it stands, uncharged.
//!
//! # Costs
//!
//! `hits_addend` of the request is the cost of each descriptor (0 or absent
//! means 1); a descriptor's own `hits_addend` overrides it, and a present 0
//! there is a **peek**: the state is reported, nothing is charged, and it is
//! `OK` unless the bucket is already beyond its limit (a peek at a limit of
//! 0 is `OK` with 0 remaining). `is_negative_hits` is ignored, as upstream
//! ignores it (the hits are charged).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse,
};
use envoy_types::pb::google::protobuf::UInt64Value;
use gcra_core::Decision;
use rate_tier_storage::StorageExt;
use rate_tier_storage::{BucketCheck, Decided, Storage, StorageError};
use smallvec::SmallVec;
use tower_rate_tier::headers::HeaderStyle;

use crate::config::{Config, RuleLimit, Unit};
use crate::metrics::Metrics;
use crate::status::{Board, Reload};

mod bounds;
mod plan;
mod response;
mod stats;

pub use bounds::{Incoming, Oversized, RequestLimits};
use plan::{Applied, Group, Plan, drop_replaced, plan_all};
use response::Answering;
/// Why a call got no decision.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecideError {
    /// The request is malformed or beyond a [`RequestLimits`] bound
    /// (`INVALID_ARGUMENT`, HTTP 400). Nothing was charged.
    #[error("{0}")]
    InvalidArgument(String),
    /// The store gave no decision (`UNAVAILABLE`, HTTP 503). With Redis the
    /// fallback decides locally instead, so this is rare.
    #[error("rate limit store unavailable: {0}")]
    Store(#[from] StorageError),
}

/// How the service decides, beside the config.
///
/// ```
/// use rate_tier_service::DecideOptions;
/// use tower_rate_tier::headers::HeaderStyle;
/// // As envoyproxy/ratelimit: no rate-limit headers unless asked for.
/// assert_eq!(DecideOptions::default().headers, HeaderStyle::None);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct DecideOptions {
    /// `--shadow`: every limit in shadow mode.
    pub shadow: bool,
    /// `--headers`.
    pub headers: HeaderStyle,
    /// Request bounds.
    pub limits: RequestLimits,
    /// The share of a rule's limit above which an allowed cost counts as
    /// near it (`ratelimit_service_rate_limit_near_limit_total`): 0.8 by
    /// default, as envoyproxy/ratelimit's `NEAR_LIMIT_RATIO`.
    pub near_limit_ratio: f64,
    /// `--status-keys-in-clear`: the status page shows the keys nearest
    /// their limit as sent, not as tags (default false).
    pub status_keys_in_clear: bool,
}

impl Default for DecideOptions {
    fn default() -> Self {
        DecideOptions {
            shadow: false,
            headers: HeaderStyle::None,
            limits: RequestLimits::default(),
            near_limit_ratio: 0.8,
            status_keys_in_clear: false,
        }
    }
}

/// The decision engine: the config in use (swapped whole on reload), the
/// store, the options and the metrics. Shared by the gRPC and HTTP servers.
#[derive(Debug)]
pub struct Decider {
    config: ArcSwap<Config>,
    store: Arc<dyn Storage>,
    options: DecideOptions,
    metrics: Arc<Metrics>,
    status: Board,
}

/// What [`Decider::reset`] did for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResetDescriptor {
    /// No rule applies (an unknown domain or key, a descriptor deeper than
    /// the rule): nothing reset.
    NoLimit,
    /// An `unlimited` rule: no bucket to reset.
    Unlimited,
    /// A limit (a rule, or the descriptor's own `limit` override).
    Limit {
        /// The rule's `name` (empty when it has none, or an override).
        name: String,
        /// Its `requests_per_unit`.
        requests_per_unit: u32,
        /// Its `unit`.
        unit: Unit,
        /// Whether its bucket was reset: false for `requests_per_unit: 0`,
        /// which has no bucket.
        reset: bool,
    },
}

/// A bucket's part of the answer.
#[derive(Clone, Copy, Default)]
struct Outcome {
    passed: bool,
    charged: bool,
    remaining: u64,
    reset_after_us: u64,
    has_reset: bool,
}

fn ceil_secs(us: u64) -> u64 {
    tower_rate_tier::headers::ceil_secs(Duration::from_micros(us))
}

impl Decider {
    /// A decider over `config` and `store`.
    pub fn new(
        config: Config,
        store: Arc<dyn Storage>,
        options: DecideOptions,
        metrics: Arc<Metrics>,
    ) -> Decider {
        let decider = Decider {
            config: ArcSwap::from_pointee(
                Config::from_sources([]).unwrap_or_else(|_| {
                    unreachable!("an empty config is valid")
                }),
            ),
            store,
            status: Board::new(options.status_keys_in_clear),
            options,
            metrics,
        };
        decider.install(config);
        decider
    }

    /// Puts `config` in use (the next calls see it, calls in flight finish
    /// with the old one).
    pub fn install(&self, config: Config) {
        for rule in config.rules() {
            let _ = rule.stats.set(self.metrics.rule(&rule.domain, &rule.path));
        }
        self.metrics.config_loaded(true, config.domains().count());
        self.status.reloaded(Reload::loaded(&config));
        self.config.store(Arc::new(config));
    }

    /// What the status page shows.
    pub(crate) fn status(&self) -> &Board {
        &self.status
    }

    /// The config in use.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// The options.
    pub fn options(&self) -> &DecideOptions {
        &self.options
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Storage> {
        &self.store
    }

    /// What no gateway's client can cause: an empty domain or descriptor
    /// list (upstream refuses them too), an override with an unknown unit
    /// (Envoy sends its config's). Answered `INVALID_ARGUMENT`.
    fn validate(&self, request: &RateLimitRequest) -> Result<(), DecideError> {
        if request.domain.is_empty() {
            return Err(DecideError::InvalidArgument(
                "rate limit domain must not be empty".into(),
            ));
        }
        if request.descriptors.is_empty() {
            return Err(DecideError::InvalidArgument(
                "rate limit descriptor list must not be empty".into(),
            ));
        }
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            if let Some(limit) = &descriptor.limit
                && Unit::from_proto(limit.unit).is_none()
            {
                return Err(DecideError::InvalidArgument(format!(
                    "descriptor {i}: the limit override's unit {} is not one of SECOND (1) \
                     to YEAR (6) or WEEK (7)",
                    limit.unit
                )));
            }
        }
        Ok(())
    }

    /// The answer to a request beyond the [`RequestLimits`]: refused with
    /// one `OVER_LIMIT` status, whatever the request held (with `--shadow`
    /// the request is `OK`, as for any refusal: nothing is refused), and
    /// counted as `oversized`. `transport` labels the call in the metrics.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// use rate_tier_service::decide::Oversized;
    /// use rate_tier_service::{Config, DecideOptions, Decider, Metrics};
    /// let decider = Decider::new(
    ///     Config::from_yaml("rl.yaml", "domain: edge\n")?,
    ///     Arc::new(rate_tier_storage::MemoryStorage::new()),
    ///     DecideOptions::default(),
    ///     Arc::new(Metrics::new(None)),
    /// );
    /// let answer = decider.oversized(Oversized::Descriptors, "doc");
    /// assert_eq!(answer.overall_code, 2); // OVER_LIMIT
    /// assert_eq!(answer.statuses.len(), 1);
    /// assert_eq!(answer.statuses[0].code, 2);
    /// # Ok::<(), rate_tier_service::ConfigError>(())
    /// ```
    pub fn oversized(
        &self,
        bound: Oversized,
        transport: &'static str,
    ) -> RateLimitResponse {
        self.metrics.call(transport, "oversized");
        tracing::debug!(?bound, transport, "a request beyond a bound: refused");
        let overall = if self.options.shadow {
            self.metrics.global_shadow.inc();
            Code::Ok
        } else {
            Code::OverLimit
        };
        RateLimitResponse {
            overall_code: overall as i32,
            statuses: vec![DescriptorStatus {
                code: Code::OverLimit as i32,
                ..DescriptorStatus::default()
            }],
            ..RateLimitResponse::default()
        }
    }

    /// Answers what a transport read: [`Decider::decide`] for a request
    /// within the bounds, [`Decider::oversized`] for one beyond.
    ///
    /// # Errors
    ///
    /// As [`Decider::decide`].
    pub async fn answer(
        &self,
        incoming: &Incoming,
        transport: &'static str,
    ) -> Result<RateLimitResponse, DecideError> {
        match incoming {
            Incoming::Request(request) => self.decide(request, transport).await,
            Incoming::Oversized(bound) => Ok(self.oversized(*bound, transport)),
        }
    }

    /// Decides `request`. `transport` labels the call in the metrics
    /// (`"grpc"`, `"json"`).
    ///
    /// # Errors
    ///
    /// [`DecideError::InvalidArgument`] for a malformed request (nothing
    /// charged), [`DecideError::Store`] when the store gave no decision.
    pub async fn decide(
        &self,
        request: &RateLimitRequest,
        transport: &'static str,
    ) -> Result<RateLimitResponse, DecideError> {
        if request.descriptors.len() > self.options.limits.max_descriptors {
            return Ok(self.oversized(Oversized::Descriptors, transport));
        }
        let result = self.decide_inner(request).await;
        let code = match &result {
            Ok(r) if r.overall_code == Code::OverLimit as i32 => "over_limit",
            Ok(_) => "ok",
            Err(DecideError::InvalidArgument(_)) => "invalid_argument",
            Err(DecideError::Store(_)) => "unavailable",
        };
        self.metrics.call(transport, code);
        result
    }

    /// What `request`'s descriptors would be told now, charging nothing: the
    /// request decided with every descriptor's `hits_addend` set to 0 (a
    /// peek, see the [module docs](self#costs)), `replaces` applied as for
    /// a decision. Not counted as a call in the metrics.
    ///
    /// # Errors
    ///
    /// [`DecideError::InvalidArgument`] for a malformed request or one of
    /// more than [`RequestLimits::max_descriptors`] descriptors,
    /// [`DecideError::Store`] when the store gave no answer.
    pub async fn peek(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, DecideError> {
        self.within_bounds(request)?;
        let mut request = request.clone();
        for descriptor in &mut request.descriptors {
            descriptor.hits_addend = Some(UInt64Value { value: 0 });
        }
        self.decide_inner(&request).await
    }

    /// Puts back to full the buckets that `request`'s descriptors map to
    /// under the config in use (the same buckets, by the same code, as a
    /// decision: [`Storage::reset`]). Each descriptor is matched on its
    /// own: `replaces` does not apply, a reset names buckets rather than
    /// asks for a decision; `hits_addend` is ignored. Returns what each
    /// descriptor got, in order.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    /// #     RateLimitDescriptor, rate_limit_descriptor::Entry,
    /// # };
    /// # use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    /// use rate_tier_service::decide::ResetDescriptor;
    /// use rate_tier_service::{Config, DecideOptions, Decider, Metrics};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = Config::from_yaml("rl.yaml", "
    /// domain: edge
    /// descriptors:
    ///   - key: user
    ///     rate_limit: {unit: minute, requests_per_unit: 1}
    /// ")?;
    /// let store = Arc::new(rate_tier_storage::MemoryStorage::new());
    /// let decider = Decider::new(config, store, DecideOptions::default(), Arc::new(Metrics::new(None)));
    /// let request = RateLimitRequest {
    ///     domain: "edge".into(),
    ///     descriptors: vec![RateLimitDescriptor {
    ///         entries: vec![Entry { key: "user".into(), value: "ada".into() }],
    ///         ..Default::default()
    ///     }],
    ///     hits_addend: 0,
    /// };
    /// decider.decide(&request, "doc").await?;
    /// assert_eq!(decider.decide(&request, "doc").await?.overall_code, 2); // OVER_LIMIT
    /// let reset = decider.reset(&request).await?;
    /// assert!(matches!(reset[0], ResetDescriptor::Limit { reset: true, .. }));
    /// assert_eq!(decider.decide(&request, "doc").await?.overall_code, 1); // OK
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Decider::peek`]; a store without resets is
    /// [`StorageError::Unsupported`].
    pub async fn reset(
        &self,
        request: &RateLimitRequest,
    ) -> Result<Vec<ResetDescriptor>, DecideError> {
        self.within_bounds(request)?;
        self.validate(request)?;
        let config = self.config.load();
        let Some(domain) = config.domain(&request.domain) else {
            return Ok(vec![
                ResetDescriptor::NoLimit;
                request.descriptors.len()
            ]);
        };
        let (mut plans, mut partitions) = plan_all(domain, request);
        let groups = self.group_all(&mut plans, &mut partitions);
        let mut checks: SmallVec<[BucketCheck<'_>; 4]> = SmallVec::new();
        for group in &groups {
            if let Some(quota) = group.quota() {
                checks.push(group.check(quota, 0)?);
            }
        }
        if !checks.is_empty() {
            self.store.reset(&checks).await?;
        }
        Ok(plans
            .iter()
            .map(|plan| match plan {
                Plan::NoLimit => ResetDescriptor::NoLimit,
                Plan::Unlimited => ResetDescriptor::Unlimited,
                Plan::Limited { applied, group, .. } => {
                    ResetDescriptor::Limit {
                        name: applied.name.to_owned(),
                        requests_per_unit: applied.requests_per_unit,
                        unit: applied.unit,
                        reset: groups[*group].quota().is_some(),
                    }
                }
            })
            .collect())
    }

    fn within_bounds(
        &self,
        request: &RateLimitRequest,
    ) -> Result<(), DecideError> {
        let limits = &self.options.limits;
        if request.descriptors.len() > limits.max_descriptors {
            return Err(DecideError::InvalidArgument(
                Oversized::Descriptors.describe(limits),
            ));
        }
        Ok(())
    }

    /// Step 3 of a decision: descriptors in one bucket merged (their costs
    /// added); unlimited tiers marked.
    fn group_all<'c>(
        &self,
        plans: &mut [Plan<'c>],
        partitions: &mut [String],
    ) -> SmallVec<[Group<'c>; 4]> {
        let mut groups: SmallVec<[Group<'c>; 4]> = SmallVec::new();
        for (plan, partition) in plans.iter_mut().zip(partitions.iter_mut()) {
            let Plan::Limited {
                applied,
                cost,
                group,
            } = plan
            else {
                continue;
            };
            if applied.limit == RuleLimit::Unlimited {
                *plan = Plan::Unlimited;
                continue;
            }
            let found = groups.iter().position(|g| {
                g.bucket == applied.bucket && g.partition == *partition
            });
            *group = match found {
                Some(index) => {
                    groups[index].cost =
                        groups[index].cost.saturating_add(*cost);
                    index
                }
                None => {
                    groups.push(Group {
                        bucket: applied.bucket,
                        partition: std::mem::take(partition),
                        limit: applied.limit,
                        cost: *cost,
                        shadow: applied.shadow || self.options.shadow,
                    });
                    groups.len() - 1
                }
            };
        }
        groups
    }

    async fn decide_inner(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, DecideError> {
        self.validate(request)?;
        let config = self.config.load();
        let Some(domain) = config.domain(&request.domain) else {
            self.metrics
                .domain_not_found
                .inc_by(request.descriptors.len() as u64);
            return Ok(RateLimitResponse {
                overall_code: Code::Ok as i32,
                statuses: request
                    .descriptors
                    .iter()
                    .map(|_| no_limit())
                    .collect(),
                ..RateLimitResponse::default()
            });
        };
        let override_stats = request
            .descriptors
            .iter()
            .any(|d| d.limit.is_some())
            .then(|| self.metrics.rule(&request.domain, "override"));

        // 1. Each descriptor's limit.
        let (mut plans, mut partitions) = plan_all(domain, request);

        // 2. `replaces`: rules named by another matched rule of the request
        //    are dropped. An unlimited rule replaces, but stays unlimited
        //    itself (upstream marks unlimited descriptors first).
        drop_replaced(&mut plans);

        // 3. Buckets: descriptors in one bucket merged.
        let groups = self.group_all(&mut plans, &mut partitions);

        // 4. One decision. A bucket that can never pass refuses before the
        //    store: every other bucket is then only read.
        let refused_early = groups.iter().any(|g| g.never() && !g.shadow);
        let mut outcomes: SmallVec<[Outcome; 4]> =
            SmallVec::from_elem(Outcome::default(), groups.len());
        let mut checks: SmallVec<[BucketCheck<'_>; 4]> = SmallVec::new();
        let mut checked: SmallVec<[usize; 4]> = SmallVec::new();
        for (index, group) in groups.iter().enumerate() {
            let Some(quota) = group.quota() else {
                // A limit of 0: refused unless a peek, never stored.
                outcomes[index] = Outcome {
                    passed: group.cost == 0,
                    ..Outcome::default()
                };
                continue;
            };
            let cost = if refused_early || group.never() {
                0
            } else {
                // <= burst here.
                u32::try_from(group.cost).unwrap_or(u32::MAX)
            };
            checks.push(group.check(quota, cost)?);
            checked.push(index);
        }
        let mut allowed = !refused_early;
        let mut retry_after_us = 0;
        if !checks.is_empty() {
            let mut out: SmallVec<[Decision; 4]> =
                SmallVec::from_elem(Decision::default(), checks.len());
            let started = Instant::now();
            let decided: Decided =
                match self.store.check(&checks, &mut out).ready() {
                    Some(result) => result?,
                    None => self.store.check(&checks, &mut out).await?,
                };
            let took = started.elapsed();
            self.metrics.store_latency(decided.by, took);
            self.status.store_latency(took);
            allowed &= decided.verdict.allowed;
            retry_after_us = decided.verdict.retry_after_us;
            for ((&index, check), decision) in
                checked.iter().zip(&checks).zip(&out)
            {
                let group = &groups[index];
                let peeked = check.cost() == 0;
                let passed = if peeked {
                    // Read only: would it have passed on its own?
                    !group.never() && decision.remaining >= group.cost
                } else {
                    decision.allowed
                };
                outcomes[index] = Outcome {
                    passed,
                    charged: !peeked && allowed && decision.allowed,
                    remaining: if passed { decision.remaining } else { 0 },
                    reset_after_us: decision.reset_after_us,
                    has_reset: true,
                };
            }
        }

        // 5. The response, and the stats.
        let answering = Answering {
            decider: self,
            groups: &groups,
            outcomes: &outcomes,
            override_stats: override_stats.as_ref(),
        };
        Ok(answering.response(&plans, allowed, retry_after_us))
    }
}

fn no_limit() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    }
}
