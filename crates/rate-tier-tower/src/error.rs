//! What can go wrong: a configuration that cannot be built, and a check that
//! cannot be decided.

use http::StatusCode;
use rate_tier_storage::key::{EmptySecret, InvalidTierName};
use rate_tier_storage::{CheckError, RuleKind, StorageError};

/// A configuration that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No tier was configured.
    #[error("no tier configured: add at least one with .tier(name, quota)")]
    NoTiers,
    /// A tier or limit name is not valid.
    #[error("invalid name: {0}")]
    InvalidTierName(#[from] InvalidTierName),
    /// The same tier was configured twice.
    #[error("tier {0:?} is configured twice")]
    DuplicateTier(String),
    /// Two limits of one layer have the same name: they would share
    /// buckets.
    #[error("limit {0:?} is configured twice")]
    DuplicateLimit(String),
    /// The default tier is not one of the configured tiers.
    #[error("default tier {0:?} is not a configured tier")]
    UnknownDefaultTier(String),
    /// A policy needs a default tier and none is set.
    #[error("{0} needs a default tier: set one with .default_tier(name)")]
    NoDefaultTier(&'static str),
    /// A refusal policy was given a status that is not an error (4xx or
    /// 5xx): a refused request would look served.
    #[error("{policy} needs a 4xx or 5xx status, not {status}")]
    NotAnErrorStatus {
        /// The policy, e.g. `"OnMissing::Deny"`.
        policy: &'static str,
        /// The status given.
        status: StatusCode,
    },
    /// The key secret is empty.
    #[error(transparent)]
    EmptyKeySecret(#[from] EmptySecret),
    /// A limit's rule is of a kind the limiter's store does not decide
    /// (see [`Capabilities::supports`](rate_tier_storage::Capabilities::supports)):
    /// it would never be enforced as written.
    #[error(
        "limit {limit:?} is {}, which the {store} store does not decide",
        kind.described()
    )]
    UnsupportedKind {
        /// The limit.
        limit: String,
        /// Its rule's kind.
        kind: RuleKind,
        /// The store's [`kind`](rate_tier_storage::Capabilities::label).
        store: &'static str,
    },
    /// Two windows, periods or concurrency limits of different partitions
    /// may meet in one decision, on a store that cannot decide them
    /// together
    /// ([`Capabilities::spans_partitions`](rate_tier_storage::Capabilities::spans_partitions)
    /// is false: a Redis Cluster, where each partition has a hash slot of
    /// its own). Every request in which they met would fail. Refused by
    /// [`TierLimitLayer::try_limit`](crate::TierLimitLayer::try_limit), and
    /// by [`RateTier::try_reload`](crate::RateTier::try_reload) for tiers
    /// that would make a live layer's limits meet so.
    ///
    /// Conservative: limits whose [`when`](crate::Limit::when)s never hold
    /// together are refused too, as no one can tell so before a request.
    /// Per-user limits (the default) and the tier share the user's
    /// partition, and global limits share theirs; a keyed limit shares with
    /// no other. Rates are never in the way: on a Redis Cluster they are
    /// refunded across slots. The way out is to partition the limits per
    /// user, to make one of them a rate, or to use a single Redis.
    ///
    /// ```
    /// # #[cfg(not(feature = "redis"))] fn main() {}
    /// # #[cfg(feature = "redis")]
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tower_rate_tier::{
    ///     Concurrency, ConfigError, Limit, Quota, RateTier, RedisStorage, TierLimitLayer, Window,
    /// };
    /// // A cluster store connects on its first call: none here.
    /// let store = RedisStorage::from_cluster_urls(["redis://127.0.0.1:7000/"])?;
    /// let tiers = RateTier::builder()
    ///     .tier("free", Quota::per_minute(60))
    ///     .storage(Arc::new(store))
    ///     .build();
    /// let layer = TierLimitLayer::new(tiers)
    ///     .limit(Limit::new("uploads", Concurrency::new(2)?)); // per user
    /// let logins = Limit::new("logins", Window::new(100, Duration::from_secs(60))?).global();
    /// let error = layer.clone().try_limit(logins).unwrap_err();
    /// assert!(matches!(&error, ConfigError::KindsInTwoPartitions { limits, .. }
    ///     if limits == &["uploads", "logins"]));
    /// assert!(error.to_string().contains("partition them per user"));
    /// // Per user, it shares the user's slot; as a rate, it may be global.
    /// let logins = Limit::new("logins", Window::new(5, Duration::from_secs(60))?);
    /// let layer = layer.try_limit(logins)?;
    /// layer.try_limit(Limit::new("site", Quota::per_second(1000)).global())?;
    /// # Ok(()) }
    /// ```
    #[error(
        "{:?} ({}) and {:?} ({}) are windows, periods or concurrency limits in \
         different partitions that may meet in a request of tier {tier:?}, which \
         the {store} store cannot decide together (on a Redis Cluster each \
         partition has a hash slot of its own): partition them per user (the \
         default), make one of them a rate, or use a single Redis",
        limits[0], partitions[0], limits[1], partitions[1]
    )]
    KindsInTwoPartitions {
        /// The two: a tier's name for the tier, or a limit's.
        limits: [String; 2],
        /// Their partitions: "the tier, per user", "per user", "global"
        /// or "per key".
        partitions: [&'static str; 2],
        /// A tier whose requests may meet both.
        tier: String,
        /// The store's [`kind`](rate_tier_storage::Capabilities::label).
        store: &'static str,
    },
    /// A [`ShapeLayer`](crate::shape::ShapeLayer) without a quota.
    #[error(
        "a shaper needs at least one quota: add one with .quota(name, quota)"
    )]
    NoQuota,
    /// Waiting for a slot ([`ShapeLayer`](crate::shape::ShapeLayer),
    /// `wait_up_to`) needs a store that reserves
    /// ([`Capabilities::reserves`](rate_tier_storage::Capabilities::reserves)).
    #[error(
        "the {store} store cannot reserve slots, so requests cannot wait on it"
    )]
    CannotWait {
        /// The store's kind.
        store: &'static str,
    },
    /// A ban that cannot be kept: no refusals, a zero length or window, a
    /// first ban longer than the longest, a longest beyond a day, or more
    /// refusals than a window counts
    /// ([`RateTierBuilder::ban`](crate::RateTierBuilder::ban)).
    #[error("invalid ban: {0}")]
    InvalidBan(String),
    /// A near-limit ratio outside (0, 1]
    /// ([`RateTierBuilder::near_limit`](crate::RateTierBuilder::near_limit)).
    #[error("a near-limit ratio must be above 0 and at most 1, not {0}")]
    InvalidNearLimit(String),
    /// A wait longer than the quotas hold as debt: a slot reserved so far
    /// ahead would be read as a clock gone back, and erased, by any
    /// instance that does not wait as long. At most
    /// [`DEFAULT_MAX_DEBT`](gcra_core::DEFAULT_MAX_DEBT) for a limiter; for
    /// a shaper, at most its quotas' [`Quota::max_debt_us`](gcra_core::Quota::max_debt_us)
    /// (raise it with [`Quota::allow_debt`](gcra_core::Quota::allow_debt),
    /// alike on every instance).
    #[error("a wait of {0:?} is longer than the quotas hold as debt")]
    WaitTooLong(std::time::Duration),
    /// A settled limit ([`Limit::settle`](crate::Limit::settle)) must be a
    /// rate: a window or a period has no debt to carry.
    #[error("limit {limit:?} is settled, so it must be a rate, not {}", kind.described())]
    SettleNeedsRate {
        /// The limit.
        limit: String,
        /// The kind of its rule that is not a rate.
        kind: RuleKind,
    },
    /// A tier that cannot be checked synchronously
    /// ([`RateTier::sync_tier`](crate::RateTier::sync_tier)).
    #[error("tier {tier:?} cannot be checked synchronously: {why}")]
    NotSync {
        /// The tier asked for.
        tier: String,
        /// Why not.
        why: &'static str,
    },
}

/// Why [`RateTier::check`](crate::RateTier::check) could not decide.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store failed, timed out, or cannot decide for now.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A cost of 0 was asked for: every request costs at least 1 (read a
    /// bucket with [`RateTier::peek`](crate::RateTier::peek) instead).
    #[error("request cost must be at least 1")]
    ZeroCost,
    /// The GCRA math refused the inputs: the clock is beyond 2^53 µs.
    #[error(transparent)]
    Check(CheckError),
    /// The request had no identity and the policy refuses such requests.
    #[error("the request has no identity")]
    NoIdentity,
    /// A customer's own quota ([`TierIdentity::with_quota`]) is not of the
    /// kind of the rule it replaces: refused, never unlimited.
    ///
    /// [`TierIdentity::with_quota`]: crate::TierIdentity::with_quota
    #[error(
        "the customer's own quota for {0:?} is not of the kind of the limit it replaces"
    )]
    OwnQuota(String),
    /// [`RateTier::settle`](crate::RateTier::settle) of a limit not
    /// declared settled ([`Limit::settle`](crate::Limit::settle)): its
    /// buckets carry only a bounded debt, so a large actual cost would be
    /// partly forgiven. Nothing was changed.
    #[error(
        "limit {0:?} is not declared settled: build it with Limit::settle to settle it"
    )]
    NotSettled(String),
    /// A limit per client address reads the connection's address, and the
    /// request had none (see
    /// [`LimitEvent::NoClientAddress`](crate::LimitEvent::NoClientAddress)).
    #[error(
        "no client address from {0}: serve the app with into_make_service_with_connect_info::<SocketAddr>()"
    )]
    NoClientAddress(&'static str),
}
