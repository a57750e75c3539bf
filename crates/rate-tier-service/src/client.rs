//! [`RlsStorage`]: a [`Storage`] that asks a central rate limit service for
//! the decision, over Envoy's RLS v3 gRPC API: this service, or
//! envoyproxy/ratelimit itself, when limits are decided by a dedicated
//! service rather than by a store each instance talks to.
//!
//! A Tower layer (`tower_rate_tier::RateTier`) uses it like any store; wrap
//! it in a [`FallbackStorage`](rate_tier_storage::FallbackStorage) and the
//! same circuit breaker and local limiter take over when the service is
//! unreachable (every transport error and timeout is a
//! [`StorageError::is_failure`]).
//!
//! ```no_run
//! use std::sync::Arc;
//! use rate_tier_service::client::RlsStorage;
//! use rate_tier_storage::FallbackStorage;
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let rls = RlsStorage::connect_lazy("http://127.0.0.1:8081", "api")?;
//! let store = FallbackStorage::builder(Arc::new(rls)).build();
//! // tower_rate_tier::RateTier::builder().storage(Arc::new(store)) ...
//! # Ok(()) }
//! ```
//!
//! # The mapping
//!
//! One [`StorageExt::check`](rate_tier_storage::StorageExt::check) is **one** `ShouldRateLimit` call in the
//! configured domain, one descriptor per bucket, in order:
//!
//! | bucket check | descriptor |
//! |---|---|
//! | limit name (`free`, `search`) | entry `limit` = the name |
//! | partition (the user) | entry `partition` = the SHA-1 (or, with the check's key secret, the HMAC) of the partition, hex, as in the shared stores' keys; [`RlsStorage::partition_in_clear`] sends it as it is |
//! | quota, when expressible | the descriptor's `limit` override: `requests_per_unit` = the limit, `unit` = the period, when the period is exactly one second, minute, hour, day, 30 days or 365 days and the burst equals the limit |
//! | cost | the descriptor's `hits_addend` (0: a peek) |
//!
//! The server's config needs the domain (an override in an unknown domain
//! is ignored upstream), e.g. a file with `domain: api` and no rules. A
//! quota that an override cannot express (a burst other than the limit, a
//! period of 2 minutes) is sent without one: the server's config must then
//! hold a rule for `limit` = that name (and key-only `partition` below it),
//! else the descriptor has no limit and passes.
//!
//! This service decides the descriptors of a call all or nothing, as the
//! workspace's stores do; envoyproxy/ratelimit charges every descriptor,
//! even when one refuses.
//!
//! What cannot be expressed:
//!
//! - **settle and refunds** ([`StorageExt::settle`](rate_tier_storage::StorageExt::settle)): the RLS API has no
//!   reliable way to give units back (`is_negative_hits` is ignored by
//!   envoyproxy/ratelimit): `StorageError::Unsupported`.
//! - **shadow checks**: RLS has no per-descriptor shadow flag. Shadow
//!   checks are sent in calls of their own, one descriptor each, after the
//!   enforced ones: charged if those passed, only read if they refused. A
//!   refusal there is reported (the decision's part says refused) and never
//!   refuses the decision; a failure there never fails it.
//! - **a late answer**: a call that times out may still be decided by the
//!   server, and RLS cannot give units back: such a call may be charged
//!   there while the caller (a fallback) decides locally.
//! - **retry after**: the response has `duration_until_reset` (this
//!   service: until the bucket is full again) but no retry time. The wait
//!   of a refused check is derived from it with GCRA (`reset - (tau - T *
//!   cost)`), and is the reset itself when that is not positive (a server
//!   counting in fixed windows, whose reset is the end of the window).

use std::time::Duration;

use rate_tier_storage::{Answer, Capabilities, Mode};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use gcra_core::{Decision, Quota, Verdict};
use rate_tier_storage::{BucketCheck, Decided, KeyLayout, Storage, StorageError};
use tonic::transport::{Channel, Endpoint};

use crate::config::Unit;

/// The entry key that carries a check's limit name.
pub const LIMIT_KEY: &str = "limit";
/// The entry key that carries a check's partition.
pub const PARTITION_KEY: &str = "partition";

/// A [`Storage`] that asks an RLS server (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct RlsStorage {
    client: RateLimitServiceClient<Channel>,
    domain: String,
    timeout: Duration,
    clear: bool,
}

impl RlsStorage {
    /// The default timeout of a call.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(100);

    /// A store asking the server at `uri` (`http://host:port`) in `domain`,
    /// connected lazily: no I/O now, the connection is made by the first
    /// call (within its timeout) and remade after a failure.
    ///
    /// # Errors
    ///
    /// [`StorageError::Backend`] if `uri` is not a valid URI.
    ///
    /// ```
    /// use rate_tier_service::client::RlsStorage;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// assert!(RlsStorage::connect_lazy("http://127.0.0.1:8081", "api").is_ok());
    /// assert!(RlsStorage::connect_lazy("not a uri", "api").is_err());
    /// # }
    /// ```
    pub fn connect_lazy(
        uri: &str,
        domain: impl Into<String>,
    ) -> Result<Self, StorageError> {
        let endpoint = Endpoint::from_shared(uri.to_owned())
            .map_err(|e| StorageError::Backend(Box::new(e)))?
            .connect_timeout(Self::DEFAULT_TIMEOUT)
            .tcp_nodelay(true);
        Ok(Self::new(endpoint.connect_lazy(), domain))
    }

    /// A store asking through `channel` in `domain`.
    pub fn new(channel: Channel, domain: impl Into<String>) -> Self {
        RlsStorage {
            client: RateLimitServiceClient::new(channel),
            domain: domain.into(),
            timeout: Self::DEFAULT_TIMEOUT,
            clear: false,
        }
    }

    /// Sets the timeout of a call (default 100 ms); past it the check fails
    /// with [`StorageError::Timeout`].
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sends partitions as they are instead of their hash, for a server
    /// config that matches particular values.
    #[must_use]
    pub fn partition_in_clear(mut self, clear: bool) -> Self {
        self.clear = clear;
        self
    }

    /// The descriptor of `check`.
    pub fn descriptor(&self, check: &BucketCheck<'_>) -> RateLimitDescriptor {
        let partition = if self.clear {
            check.partition().to_owned()
        } else {
            let key = check.key(KeyLayout::Single);
            key.rsplit(':').next().unwrap_or_default().to_owned()
        };
        RateLimitDescriptor {
            entries: vec![
                Entry {
                    key: LIMIT_KEY.to_owned(),
                    value: check.limit_name().key_part().to_owned(),
                },
                Entry {
                    key: PARTITION_KEY.to_owned(),
                    value: partition,
                },
            ],
            limit: override_of(check.quota()),
            hits_addend: Some(UInt64Value {
                value: u64::from(check.cost()),
            }),
            is_negative_hits: false,
        }
    }

    async fn call(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, StorageError> {
        let mut client = self.client.clone();
        match tokio::time::timeout(
            self.timeout,
            client.should_rate_limit(request),
        )
        .await
        {
            Err(_) => Err(StorageError::Timeout(self.timeout)),
            Ok(Err(status)) => Err(StorageError::Backend(Box::new(status))),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }

    async fn ask_server(
        &self,
        checks: &[BucketCheck<'_>],
        indexes: &[usize],
        out: &mut [Decision],
    ) -> Result<bool, StorageError> {
        let request = RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: indexes
                .iter()
                .map(|&i| self.descriptor(&checks[i]))
                .collect(),
            hits_addend: 0,
        };
        let response = self.call(request).await?;
        if response.statuses.len() != indexes.len() {
            return Err(StorageError::Protocol(format!(
                "{} statuses for {} descriptors",
                response.statuses.len(),
                indexes.len()
            )));
        }
        for (&i, status) in indexes.iter().zip(&response.statuses) {
            out[i] = decision_of(&checks[i], status);
        }
        Ok(response.overall_code != Code::OverLimit as i32)
    }
}

/// The override for `quota`, when one can say it exactly.
fn override_of(quota: Quota) -> Option<RateLimitOverride> {
    if quota.burst() != quota.limit() {
        return None;
    }
    let period = quota.period();
    Unit::ALL
        .into_iter()
        .filter(|unit| *unit != Unit::Week) // not in envoy.type.v3.RateLimitUnit
        .find(|unit| unit.duration() == period)
        .map(|unit| RateLimitOverride {
            requests_per_unit: quota.limit(),
            unit: unit.proto(),
        })
}

/// A descriptor's status as the check's [`Decision`].
fn decision_of(check: &BucketCheck<'_>, status: &DescriptorStatus) -> Decision {
    let quota = check.quota();
    // A remote reply: any number may come, none may overflow.
    let reset_after_us = status.duration_until_reset.as_ref().map_or(0, |d| {
        u64::try_from(d.seconds)
            .unwrap_or(0)
            .saturating_mul(1_000_000)
            .saturating_add(u64::try_from(d.nanos).unwrap_or(0) / 1_000)
            .min(gcra_core::MAX_TIME_US)
    });
    let allowed = status.code != Code::OverLimit as i32;
    let remaining = match (&status.current_limit, status.limit_remaining) {
        // No limit on the server (or unlimited): the whole burst is there.
        (None, _) => u64::from(quota.burst()),
        (Some(_), remaining) => u64::from(remaining),
    };
    let retry_after_us = if allowed {
        0
    } else {
        let room = quota.burst_offset_us().saturating_sub(
            quota
                .emission_interval_us()
                .saturating_mul(u64::from(check.cost())),
        );
        match reset_after_us.saturating_sub(room) {
            0 => reset_after_us.max(1),
            wait => wait,
        }
    };
    Decision {
        allowed,
        remaining: if allowed { remaining } else { 0 },
        retry_after_us,
        reset_after_us,
        store: None,
    }
}

impl RlsStorage {
    /// One `ShouldRateLimit` call for the enforced checks (all or nothing
    /// on this service), then one per shadow check: charged when the
    /// enforced ones passed, only read (a cost of 0) when they refused, as
    /// every store decides a shadow limit. A shadow call that fails never
    /// fails the decision (it refuses nothing, and the enforced checks are
    /// charged already): its part says it passed, its state unknown.
    async fn check_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        if checks.len() != out.len() {
            return Err(StorageError::LengthMismatch {
                checks: checks.len(),
                out: out.len(),
            });
        }
        let enforced: Vec<usize> = (0..checks.len())
            .filter(|&i| !checks[i].is_shadow())
            .collect();
        let mut server_allowed = true;
        if !enforced.is_empty() {
            server_allowed = self.ask_server(checks, &enforced, out).await?;
        }
        let enforced_passed =
            server_allowed && enforced.iter().all(|&i| out[i].allowed);
        for i in (0..checks.len()).filter(|&i| checks[i].is_shadow()) {
            let shadow = if enforced_passed {
                checks[i]
            } else {
                // Refused: no bucket of the decision is charged.
                checks[i].as_peek()
            };
            let peeked = shadow.cost() == 0 && checks[i].cost() > 0;
            let mut part = [Decision::default()];
            match self.ask_server(&[shadow], &[0], &mut part).await {
                Ok(_) if peeked => out[i] = checks[i].would_meet(&part[0]),
                Ok(_) => out[i] = part[0],
                Err(_) => {
                    out[i] = Decision {
                        allowed: true,
                        ..Decision::default()
                    };
                }
            }
        }
        let mut verdict =
            Verdict::of(checks.iter().map(BucketCheck::is_shadow), out);
        if server_allowed && !verdict.allowed {
            // The server let it through (its global shadow mode).
            verdict = Verdict {
                allowed: true,
                retry_after_us: 0,
                refused_by: None,
            };
        } else if !server_allowed && verdict.allowed {
            // Refused with no status saying why: blame the first.
            verdict = Verdict {
                allowed: false,
                retry_after_us: 1_000_000,
                refused_by: enforced.first().copied(),
            };
        }
        Ok(Decided::new(verdict, None, "rls"))
    }
}

impl Storage for RlsStorage {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        match mode {
            Mode::Check => Answer::pending(self.check_buckets(checks, out)),
            Mode::Reserve { .. } => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("rls").always_pending()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_only_for_exact_units() {
        let o = override_of(Quota::per_minute(10)).expect("a minute");
        assert_eq!((o.requests_per_unit, o.unit), (10, Unit::Minute.proto()));
        assert!(override_of(Quota::per_minute(10).allow_burst(3)).is_none());
        assert!(
            override_of(
                Quota::new(5, Duration::from_secs(120)).expect("valid")
            )
            .is_none()
        );
        assert!(
            override_of(Quota::new(5, Unit::Week.duration()).expect("valid"))
                .is_none()
        );
        let o =
            override_of(Quota::new(5, Unit::Year.duration()).expect("valid"))
                .expect("a year");
        assert_eq!(o.unit, 6);
    }
}
