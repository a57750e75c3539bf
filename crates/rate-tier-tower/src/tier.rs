//! Plans and their quotas: [`RateTier`], the limiter a layer or a caller uses.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError, RwLock};
use std::task::{Context, Poll, ready};

use arc_swap::ArcSwap;
use std::time::Duration;

use gcra_core::{CheckError, Decision, Quota};
use http::StatusCode;
use rate_tier_storage::clock::{Clock, MonotonicClock, SharedClock};
use rate_tier_storage::key::{InvalidTierName, KeySecret};
use rate_tier_storage::{BucketCheck, MemoryStorage, Storage, StorageError};

use crate::event::LimitEvent;
use crate::plans::{Plans, PlansBuilder, Tier};

/// What a request without an identity gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnMissing {
    /// The default tier's quota, in one bucket shared by every anonymous
    /// request. Requires a default tier.
    UseDefault,
    /// Refused with this status (e.g. 401 Unauthorized), storage untouched.
    Deny(StatusCode),
}

/// What a request whose tier is not configured gets. Never unlimited, unless
/// chosen explicitly with [`OnUnknownTier::Allow`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnUnknownTier {
    /// The default tier's quota, in the user's own bucket. Requires a
    /// default tier. The default when one is set.
    UseDefault,
    /// Refused with 403 Forbidden. The default without a default tier.
    Deny,
    /// Passed without any limit. Every such request is still reported as
    /// [`LimitEvent::UnknownTier`].
    Allow,
}

/// What a request gets when the store fails (or times out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnStorageError {
    /// Refused with this status and `retry-after: 1` (the default: 503
    /// Service Unavailable). Fails closed: no one exceeds a quota.
    Deny(StatusCode),
    /// Passed without a check (fails open). Every such request is reported
    /// as [`LimitEvent::StorageError`].
    Allow,
}

impl Default for OnStorageError {
    fn default() -> Self {
        OnStorageError::Deny(StatusCode::SERVICE_UNAVAILABLE)
    }
}

/// A configuration that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// No tier was configured.
    #[error("no tier configured: add at least one with .tier(name, quota)")]
    NoTiers,
    /// A tier name is not valid.
    #[error("invalid tier name: {0}")]
    InvalidTierName(#[from] InvalidTierName),
    /// The same tier was configured twice.
    #[error("tier {0:?} is configured twice")]
    DuplicateTier(String),
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
}

/// Why [`RateTier::check`] could not decide.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The store failed or timed out.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A cost of 0 was asked for: every request costs at least 1.
    #[error("request cost must be at least 1")]
    ZeroCost,
    /// The GCRA math refused the inputs (a time beyond 2^53 µs).
    #[error(transparent)]
    Check(CheckError),
}

/// The state of a bucket after an allowed request.
///
/// ```
/// use tower_rate_tier::{Quota, RateTier};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
/// let info = limiter.check("ana", "free", 3).await.unwrap().unwrap();
/// assert_eq!((info.limit, info.remaining), (10, 7));
/// assert_eq!(&*info.tier, "free");
/// assert_eq!(info.reset_after, std::time::Duration::from_secs(18));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimitInfo {
    /// The tier whose quota applied (the default tier for an unknown one,
    /// or the claimed tier when `OnUnknownTier::Allow` let it pass).
    pub tier: Cow<'static, str>,
    /// The burst: requests of cost 1 a full bucket allows at once.
    pub limit: u32,
    /// Requests of cost 1 still allowed right now.
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset_after: Duration,
    /// The cost charged.
    pub cost: u32,
    /// How long a full burst takes to come back (`tau = T * burst`): the
    /// window of the IETF `RateLimit-Policy`.
    pub window: Duration,
    /// When this was decided, in µs on the limiter's clock.
    pub now_us: u64,
}

impl RateLimitInfo {
    /// Unix time, in whole seconds rounded up, when the bucket is full again
    /// (the `x-ratelimit-reset` header).
    ///
    /// ```
    /// # use tower_rate_tier::{Quota, RateTier, clock::FakeClock};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let clock = FakeClock::at_us(1_500_000); // t = 1.5 s
    /// let limiter = RateTier::builder().clock(clock).tier("t", Quota::per_second(1)).build();
    /// let info = limiter.check("u", "t", 1).await.unwrap().unwrap();
    /// assert_eq!(info.reset_unix_secs(), 3); // full again at 2.5 s: rounded up
    /// # }
    /// ```
    pub fn reset_unix_secs(&self) -> u64 {
        let reset_us = self.now_us.saturating_add(
            u64::try_from(self.reset_after.as_micros()).unwrap_or(u64::MAX),
        );
        reset_us.div_ceil(1_000_000)
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitReason {
    /// The bucket is empty for now: retry after [`Limited::retry_after`]
    /// (HTTP 429).
    RateLimited,
    /// The cost is above the tier's burst: no wait would make it pass
    /// (HTTP 403). The store was not touched.
    CostExceedsBurst {
        /// The cost asked for.
        cost: u32,
    },
    /// The tier is unknown and the policy is [`OnUnknownTier::Deny`] (HTTP 403).
    UnknownTier,
}

/// A refused request.
///
/// ```
/// use tower_rate_tier::{LimitReason, Quota, RateTier};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
/// let never = limiter.check("ana", "free", 50).await.unwrap().unwrap_err();
/// assert_eq!(never.reason(), LimitReason::CostExceedsBurst { cost: 50 });
/// assert!(!never.can_retry());
///
/// limiter.check("ana", "free", 10).await.unwrap().unwrap();
/// let limited = limiter.check("ana", "free", 1).await.unwrap().unwrap_err();
/// assert_eq!(limited.reason(), LimitReason::RateLimited);
/// assert!(limited.retry_after() <= std::time::Duration::from_secs(6));
/// assert_eq!(limited.retry_after_secs(), 6); // rounded up
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    pub(crate) tier: Cow<'static, str>,
    pub(crate) limit: u32,
    pub(crate) reason: LimitReason,
    pub(crate) retry_after: Duration,
    pub(crate) reset_after: Duration,
    pub(crate) now_us: u64,
    pub(crate) window: Duration,
}

impl Limited {
    /// Why the request was refused.
    pub fn reason(&self) -> LimitReason {
        self.reason
    }

    /// Whether waiting helps: only for [`LimitReason::RateLimited`].
    pub fn can_retry(&self) -> bool {
        self.reason == LimitReason::RateLimited
    }

    /// How long until the same request would pass; zero when it never will
    /// (see [`Limited::can_retry`]).
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// [`Limited::retry_after`] in whole seconds, rounded up: a client that
    /// waits exactly this long is not refused again.
    pub fn retry_after_secs(&self) -> u64 {
        let secs = self.retry_after.as_secs();
        if self.retry_after.subsec_nanos() > 0 {
            secs.saturating_add(1)
        } else {
            secs
        }
    }

    /// The tier whose quota refused the request.
    pub fn tier(&self) -> &str {
        &self.tier
    }

    /// The tier's burst (the `x-ratelimit-limit`).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Until the bucket is full again.
    pub fn reset_after(&self) -> Duration {
        self.reset_after
    }

    /// How long a full burst takes to come back (`tau = T * burst`).
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Unix time, in whole seconds rounded up, when the bucket is full again.
    pub fn reset_unix_secs(&self) -> u64 {
        let reset_us = self.now_us.saturating_add(
            u64::try_from(self.reset_after.as_micros()).unwrap_or(u64::MAX),
        );
        reset_us.div_ceil(1_000_000)
    }
}

/// Plans, their quotas and the policies for what does not fit: the limiter.
///
/// Build one with [`RateTier::builder`]; clones share the configuration and
/// the store. Use it through [`TierLimitLayer`](crate::TierLimitLayer), or
/// directly with [`RateTier::check`].
///
/// ```
/// use tower_rate_tier::{OnMissing, Quota, RateTier};
/// use http::StatusCode;
///
/// let tiers = RateTier::builder()
///     .tier("free", Quota::per_minute(10))
///     .tier("pro", Quota::per_minute(100))
///     .default_tier("free")
///     .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
///     .build();
/// assert_eq!(tiers.quota("pro"), Some(Quota::per_minute(100)));
/// ```
#[derive(Clone)]
pub struct RateTier {
    inner: Arc<Inner>,
}

struct Inner {
    plans: ArcSwap<Plans>,
    storage: Arc<dyn Storage>,
    clock: SharedClock,
    key_secret: Option<KeySecret>,
    /// Who hears the limiter's and the store's own events, each once: a
    /// keyed listener registered twice (one metrics object observed by two
    /// layers) is kept once.
    listeners: RwLock<Vec<(Option<usize>, Listener)>>,
    /// Set once the store forwards its events here (on the first listener).
    forwarding: std::sync::Once,
}

type Listener = Arc<dyn Fn(&LimitEvent) + Send + Sync>;

impl Inner {
    /// Builds the event only if someone listens (the store's events come
    /// on every local decision while its breaker is open).
    fn emit_with(&self, event: impl FnOnce() -> LimitEvent) {
        let listeners = self
            .listeners
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        if listeners.is_empty() {
            return;
        }
        let event = event();
        for (_, listener) in listeners.iter() {
            listener(&event);
        }
    }
}

impl fmt::Debug for RateTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("RateTier")
            .field("plans", &*inner.plans.load())
            .field("storage", &inner.storage)
            .field("key_secret", &inner.key_secret)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RateTier`]. Every setting has a safe default; see each method.
#[derive(Debug, Default)]
#[must_use]
pub struct RateTierBuilder {
    plans: PlansBuilder,
    storage: Option<Arc<dyn Storage>>,
    clock: Option<SharedClock>,
    key_secret: Option<KeySecret>,
}

impl RateTierBuilder {
    /// Adds a tier (plan): a name of 1 to 64 `[A-Za-z0-9_.-]` and its quota.
    pub fn tier(mut self, name: impl Into<String>, quota: Quota) -> Self {
        self.plans = self.plans.tier(name, quota);
        self
    }

    /// The tier for requests without an identity ([`OnMissing::UseDefault`])
    /// and for unknown tiers ([`OnUnknownTier::UseDefault`]).
    pub fn default_tier(mut self, name: impl Into<String>) -> Self {
        self.plans = self.plans.default_tier(name);
        self
    }

    /// What a request without identity gets. Default: the default tier if
    /// one is set, else 401 Unauthorized.
    pub fn on_missing(mut self, policy: OnMissing) -> Self {
        self.plans = self.plans.on_missing(policy);
        self
    }

    /// What a request with an unconfigured tier gets. Default: the default
    /// tier's quota in the user's own bucket if a default tier is set, else
    /// 403 Forbidden. Never unlimited unless [`OnUnknownTier::Allow`].
    pub fn on_unknown_tier(mut self, policy: OnUnknownTier) -> Self {
        self.plans = self.plans.on_unknown_tier(policy);
        self
    }

    /// What a request gets when the store fails. Default: 503, fail closed.
    pub fn on_storage_error(mut self, policy: OnStorageError) -> Self {
        self.plans = self.plans.on_storage_error(policy);
        self
    }

    /// Where buckets live. Default: a [`MemoryStorage`] on this builder's
    /// clock. A store passed here keeps its own clock.
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = Some(storage);
        self
    }

    /// The clock (default: [`MonotonicClock`](crate::clock::MonotonicClock)). It drives the default memory
    /// store and the `x-ratelimit-reset` times.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Replaces the tiers and policies set so far with `plans` (for
    /// example read from a file with `PlansBuilder::from_toml`).
    ///
    /// ```
    /// use tower_rate_tier::{Plans, Quota, RateTier};
    /// let plans = Plans::builder().tier("free", Quota::per_minute(10));
    /// let tiers = RateTier::builder().plans(plans).build();
    /// assert_eq!(tiers.quota("free"), Some(Quota::per_minute(10)));
    /// ```
    pub fn plans(mut self, plans: PlansBuilder) -> Self {
        self.plans = plans;
        self
    }

    /// Keys in shared stores become `trt:<tier>:<hmac_sha1_hex(secret, user)>`,
    /// so low-entropy ids (IPs, emails) cannot be recovered from them.
    pub fn key_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.key_secret = Some(KeySecret::new(secret));
        self
    }

    /// Builds the limiter.
    ///
    /// # Panics
    ///
    /// On an invalid configuration, with the [`ConfigError`] as message: at
    /// start-up, never at request time. Use [`RateTierBuilder::try_build`]
    /// to handle the error instead.
    #[track_caller]
    pub fn build(self) -> RateTier {
        match self.try_build() {
            Ok(tiers) => tiers,
            Err(error) => panic!("invalid RateTier configuration: {error}"),
        }
    }

    /// Builds the limiter, or says what is wrong with the configuration.
    ///
    /// ```
    /// use tower_rate_tier::{ConfigError, Quota, RateTier};
    /// let err = RateTier::builder()
    ///     .tier("free", Quota::per_minute(10))
    ///     .default_tier("gold")
    ///     .try_build()
    ///     .unwrap_err();
    /// assert_eq!(err, ConfigError::UnknownDefaultTier("gold".into()));
    ///
    /// let err = RateTier::builder().tier("free:x", Quota::per_minute(1)).try_build();
    /// assert!(matches!(err, Err(ConfigError::InvalidTierName(_))));
    /// ```
    pub fn try_build(self) -> Result<RateTier, ConfigError> {
        let plans = self.plans.build()?;
        let clock = self.clock.unwrap_or_else(|| Arc::new(MonotonicClock));
        let storage = match self.storage {
            Some(storage) => storage,
            None => Arc::new(
                MemoryStorage::builder().shared_clock(clock.clone()).build(),
            ),
        };
        let inner = Arc::new(Inner {
            plans: ArcSwap::from_pointee(plans),
            storage,
            clock,
            key_secret: self.key_secret,
            listeners: RwLock::new(Vec::new()),
            forwarding: std::sync::Once::new(),
        });
        Ok(RateTier { inner })
    }
}

/// What the limiter decided for one request, with the policy applied.
#[derive(Debug)]
pub(crate) enum Verdict {
    Allowed(RateLimitInfo),
    /// Passed unchecked by an explicit policy (unknown tier allowed, or a
    /// storage error with fail-open).
    Unlimited,
    Limited(Limited),
    /// Refused before any tier applied: no identity.
    Denied(StatusCode),
    /// The store failed and the policy refuses.
    Unavailable(StatusCode),
    /// A time out of GCRA's range: the clock is broken.
    Invalid,
    /// The cost function returned 0.
    InvalidCost,
}

impl RateTier {
    /// Configures a limiter.
    pub fn builder() -> RateTierBuilder {
        RateTierBuilder::default()
    }

    /// The quota of a configured tier, in the plans in force now.
    pub fn quota(&self, tier: &str) -> Option<Quota> {
        self.inner.plans.load().quota(tier)
    }

    /// The default tier of the plans in force now, if one is set.
    pub fn default_tier(&self) -> Option<&'static str> {
        self.inner.plans.load().default_tier()
    }

    /// The plans in force now.
    pub fn plans(&self) -> Arc<Plans> {
        self.inner.plans.load_full()
    }

    /// Replaces the plans, for every clone of this limiter, without a
    /// restart and without losing any bucket: requests already deciding
    /// finish on the old plans, later ones use the new. A bucket is its tier
    /// name and user, and its TAT stays: a user who spent half of their
    /// bucket has spent half of the new one, and a smaller burst caps the
    /// bucket rather than lock the user out.
    /// Reported as [`LimitEvent::PlansReloaded`] to the layers' `on_event`.
    ///
    /// A policy the new plans do not set (`on_missing`, `on_unknown_tier`,
    /// `on_storage_error`) is kept from the running plans where it was set
    /// and still applies, so plans read from a file do not quietly turn a
    /// 401 into the default tier. Plans are validated when built
    /// ([`PlansBuilder::build`]), so a bad configuration never reaches this
    /// call: the old plans stay.
    ///
    /// ```
    /// use tower_rate_tier::{Plans, Quota, RateTier, clock::FakeClock};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = RateTier::builder()
    ///     .clock(FakeClock::new())
    ///     .tier("free", Quota::per_minute(10))
    ///     .build();
    /// for _ in 0..5 {
    ///     limiter.check("ana", "free", 1).await.unwrap().unwrap();
    /// }
    /// // Ana spent half her bucket (its TAT is 30 s ahead, of 60 s). Free
    /// // becomes 20 per minute: she still has half of it, 10, left.
    /// limiter.reload(Plans::builder().tier("free", Quota::per_minute(20)).build().unwrap());
    /// let info = limiter.check("ana", "free", 1).await.unwrap().unwrap();
    /// assert_eq!((info.limit, info.remaining), (20, 9));
    /// # }
    /// ```
    pub fn reload(&self, plans: Plans) {
        let tiers = plans.tier_names().map(str::to_owned).collect();
        // rcu: policies are kept from the plans actually replaced, even
        // if two reloads race.
        self.inner.plans.rcu(|running| {
            let mut next = plans.clone();
            next.keep_policies_of(running);
            next
        });
        self.inner.emit_with(|| LimitEvent::PlansReloaded { tiers });
    }

    /// Registers a listener for the events that come from no request: the
    /// store's (breaker, fallback) and the limiter's (reloads). A listener
    /// with a `key` already registered is not added again.
    pub(crate) fn subscribe(&self, key: Option<usize>, listener: Listener) {
        // One forwarder per limiter, registered when someone first listens,
        // so a limiter nobody listens to costs the store nothing. Weak: the
        // store must not keep the limiter alive.
        self.inner.forwarding.call_once(|| {
            let limiter = Arc::downgrade(&self.inner);
            self.inner.storage.add_listener(Arc::new(move |event| {
                if let Some(inner) = limiter.upgrade() {
                    inner.emit_with(|| LimitEvent::Storage(event.clone()));
                }
            }));
        });
        let mut listeners = self
            .inner
            .listeners
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if key.is_some() && listeners.iter().any(|(k, _)| *k == key) {
            return;
        }
        listeners.push((key, listener));
    }

    /// The store the limiter uses.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.inner.storage
    }

    /// Charges `cost` to `user`'s bucket in `tier`.
    ///
    /// The outer `Result` is an error of the store or of the input (cost 0);
    /// the inner one is the decision. An unknown tier follows the
    /// [`OnUnknownTier`] policy (an explicit `Allow` yields an `info` with
    /// `u64::MAX` remaining); a cost above the burst is
    /// [`LimitReason::CostExceedsBurst`], decided without touching the store.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_rate_tier::{Quota, RateTier, clock::FakeClock};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let clock = FakeClock::new();
    /// let limiter = RateTier::builder()
    ///     .clock(clock.clone())
    ///     .tier("free", Quota::per_minute(10))
    ///     .build();
    /// for _ in 0..10 {
    ///     assert!(limiter.check("ana", "free", 1).await.unwrap().is_ok());
    /// }
    /// let limited = limiter.check("ana", "free", 1).await.unwrap().unwrap_err();
    /// assert_eq!(limited.retry_after_secs(), 6);
    ///
    /// clock.advance(Duration::from_secs(6));
    /// let info = limiter.check("ana", "free", 1).await.unwrap().unwrap();
    /// assert_eq!(info.remaining, 0);
    /// # }
    /// ```
    pub fn check<'a>(
        &'a self,
        user: &'a str,
        tier: &'a str,
        cost: u32,
    ) -> CheckFuture<'a> {
        CheckFuture {
            state: CheckState::Start {
                tiers: self,
                user,
                tier,
                cost,
            },
        }
    }

    /// The whole decision for the layer: identity, tier policy, cost, store,
    /// storage-error policy, with an event for each thing worth reporting.
    pub(crate) async fn decide(
        &self,
        identity: Option<&crate::TierIdentity>,
        cost: u32,
        emit: Emit<'_>,
    ) -> Verdict {
        // A snapshot of the plans; the guard is dropped before any await.
        let (user, tier, on_storage_error) = {
            let plans = self.inner.plans.load();
            let (user, tier) = match identity {
                Some(identity) if !identity.user().is_empty() => {
                    (identity.user(), identity.tier())
                }
                _ => {
                    report(emit, || LimitEvent::MissingIdentity);
                    match (plans.on_missing, plans.default_entry()) {
                        (OnMissing::Deny(status), _) => {
                            return Verdict::Denied(status);
                        }
                        // One shared bucket: `user` "" is never an identity.
                        (OnMissing::UseDefault, Some(default)) => {
                            ("", default.name)
                        }
                        (OnMissing::UseDefault, None) => {
                            return Verdict::Denied(StatusCode::UNAUTHORIZED);
                        }
                    }
                }
            };
            let tier = match self.resolve(&plans, user, tier, emit) {
                Resolved::Bucket(tier) => tier,
                Resolved::Unlimited => return Verdict::Unlimited,
                Resolved::Refused(limited) => {
                    return Verdict::Limited(limited);
                }
            };
            (user, tier, plans.on_storage_error)
        };
        match self.charge(tier, user, cost).await {
            Ok(Ok(info)) => Verdict::Allowed(info),
            Ok(Err(limited)) => {
                report(emit, || match limited.reason {
                    LimitReason::CostExceedsBurst { cost } => {
                        LimitEvent::CostExceedsBurst {
                            user_id: user.to_owned(),
                            tier: limited.tier.to_string(),
                            cost,
                            burst: limited.limit,
                        }
                    }
                    _ => LimitEvent::Limited {
                        user_id: user.to_owned(),
                        tier: limited.tier.to_string(),
                        cost,
                        retry_after: limited.retry_after,
                    },
                });
                Verdict::Limited(limited)
            }
            Err(Error::Storage(error)) => {
                let policy = on_storage_error;
                report(emit, || LimitEvent::StorageError {
                    storage: self.inner.storage.kind(),
                    error: error.to_string(),
                    policy,
                });
                match policy {
                    OnStorageError::Allow => Verdict::Unlimited,
                    OnStorageError::Deny(status) => {
                        Verdict::Unavailable(status)
                    }
                }
            }
            Err(_) => Verdict::Invalid,
        }
    }

    fn resolve(
        &self,
        plans: &Plans,
        user: &str,
        tier: &str,
        emit: Emit<'_>,
    ) -> Resolved {
        if let Some(found) = plans.find(tier) {
            return Resolved::Bucket(found);
        }
        let policy = plans.on_unknown_tier;
        report(emit, || LimitEvent::UnknownTier {
            user_id: user.to_owned(),
            tier: tier.to_owned(),
            policy,
        });
        match (policy, plans.default_entry()) {
            (OnUnknownTier::UseDefault, Some(default)) => {
                Resolved::Bucket(default)
            }
            (OnUnknownTier::Allow, _) => Resolved::Unlimited,
            // Deny, or UseDefault without a default (refused at build time).
            _ => Resolved::Refused(Limited {
                tier: Cow::Owned(tier.to_owned()),
                limit: 0,
                window: Duration::ZERO,
                reason: LimitReason::UnknownTier,
                retry_after: Duration::ZERO,
                reset_after: Duration::ZERO,
                now_us: self.inner.clock.now_us(),
            }),
        }
    }

    /// Charges a resolved tier, without awaiting if the store decides in
    /// process; `None` when the store needs I/O.
    fn charge_local(
        &self,
        tier: Tier,
        user: &str,
        cost: u32,
    ) -> Option<CheckOutput> {
        if let Some(early) = self.refuse_early(tier, cost) {
            return Some(early);
        }
        let check = BucketCheck::new(tier.name, user, tier.quota, cost)
            .key_secret(self.inner.key_secret.as_ref());
        // In-process stores decide synchronously and tell the time they
        // used: one clock read per check.
        let local = self.inner.storage.check_local(&check)?;
        Some(outcome(
            tier,
            cost,
            local.map(|l| (l.decision, l.now_us)),
            &*self.inner.clock,
        ))
    }

    async fn charge(&self, tier: Tier, user: &str, cost: u32) -> CheckOutput {
        if let Some(local) = self.charge_local(tier, user, cost) {
            return local;
        }
        self.charge_remote(tier, user, cost).await
    }

    /// The store needs I/O (Redis): read the local clock for the reset
    /// times, and await the store.
    async fn charge_remote(
        &self,
        tier: Tier,
        user: &str,
        cost: u32,
    ) -> CheckOutput {
        let check = BucketCheck::new(tier.name, user, tier.quota, cost)
            .key_secret(self.inner.key_secret.as_ref());
        let now_us = self.inner.clock.now_us();
        let decided = self.inner.storage.check(&check).await;
        outcome(tier, cost, decided.map(|d| (d, now_us)), &*self.inner.clock)
    }

    /// Cost 0, or a cost that can never pass: decided without the store.
    fn refuse_early(&self, tier: Tier, cost: u32) -> Option<CheckOutput> {
        if cost == 0 {
            return Some(Err(Error::ZeroCost));
        }
        if tier.quota.can_ever_pass(cost) {
            return None;
        }
        Some(Ok(Err(Limited {
            tier: Cow::Borrowed(tier.name),
            limit: tier.quota.burst(),
            window: Duration::from_micros(tier.quota.burst_offset_us()),
            reason: LimitReason::CostExceedsBurst { cost },
            retry_after: Duration::ZERO,
            reset_after: Duration::ZERO,
            now_us: self.inner.clock.now_us(),
        })))
    }

    fn unlimited_info(&self, tier: &str, cost: u32) -> RateLimitInfo {
        RateLimitInfo {
            tier: Cow::Owned(tier.to_owned()),
            limit: u32::MAX,
            window: Duration::ZERO,
            remaining: u64::MAX,
            reset_after: Duration::ZERO,
            cost,
            now_us: self.inner.clock.now_us(),
        }
    }
}

type CheckOutput = Result<Result<RateLimitInfo, Limited>, Error>;

/// Where the decision reports its events; `None` when nobody listens, so
/// that no event (and no copy of a user id) is built per request for no one.
pub(crate) type Emit<'a> = Option<&'a (dyn Fn(LimitEvent) + Sync)>;

fn report(emit: Emit<'_>, event: impl FnOnce() -> LimitEvent) {
    if let Some(emit) = emit {
        emit(event());
    }
}

/// A store's answer, as the limiter's.
fn outcome(
    tier: Tier,
    cost: u32,
    decided: Result<(Decision, u64), StorageError>,
    clock: &dyn Clock,
) -> CheckOutput {
    let (decision, now_us) = match decided {
        Ok(decided) => decided,
        Err(StorageError::Check(CheckError::ZeroCost)) => {
            return Err(Error::ZeroCost);
        }
        // The store applied a smaller quota than the tier's (a fallback's
        // local share during an outage), and this cost is above its burst:
        // no wait helps until the primary is back. 403, as for the tier.
        Err(StorageError::Check(CheckError::CostExceedsBurst {
            cost,
            burst,
        })) => {
            return Ok(Err(Limited {
                tier: Cow::Borrowed(tier.name),
                limit: burst,
                window: Duration::from_micros(tier.quota.burst_offset_us()),
                reason: LimitReason::CostExceedsBurst { cost },
                retry_after: Duration::ZERO,
                reset_after: Duration::ZERO,
                now_us: clock.now_us(),
            }));
        }
        Err(StorageError::Check(error)) => return Err(Error::Check(error)),
        Err(error) => return Err(Error::Storage(error)),
    };
    let reset_after = Duration::from_micros(decision.reset_after_us);
    let window = Duration::from_micros(tier.quota.burst_offset_us());
    if decision.allowed {
        Ok(Ok(RateLimitInfo {
            tier: Cow::Borrowed(tier.name),
            limit: tier.quota.burst(),
            window,
            remaining: decision.remaining,
            reset_after,
            cost,
            now_us,
        }))
    } else {
        Ok(Err(Limited {
            tier: Cow::Borrowed(tier.name),
            limit: tier.quota.burst(),
            window,
            reason: LimitReason::RateLimited,
            retry_after: Duration::from_micros(decision.retry_after_us),
            reset_after,
            now_us,
        }))
    }
}

/// The future of [`RateTier::check`].
///
/// Small and lazy: nothing is decided before it is polled. With an
/// in-process store the first poll decides (no allocation, no await); only
/// a store that needs I/O puts the rest of the work in a boxed future.
#[must_use = "futures do nothing unless polled"]
pub struct CheckFuture<'a> {
    state: CheckState<'a>,
}

enum CheckState<'a> {
    Start {
        tiers: &'a RateTier,
        user: &'a str,
        tier: &'a str,
        cost: u32,
    },
    Remote(Pin<Box<dyn Future<Output = CheckOutput> + Send + 'a>>),
    Done,
}

impl fmt::Debug for CheckFuture<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            CheckState::Start { .. } => "start",
            CheckState::Remote(_) => "waiting for the store",
            CheckState::Done => "done",
        };
        f.debug_struct("CheckFuture")
            .field("state", &state)
            .finish()
    }
}

impl Future for CheckFuture<'_> {
    type Output = CheckOutput;

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<CheckOutput> {
        let this = &mut *self;
        if let CheckState::Start {
            tiers,
            user,
            tier,
            cost,
        } = this.state
        {
            if cost == 0 {
                this.state = CheckState::Done;
                return Poll::Ready(Err(Error::ZeroCost));
            }
            let plans = tiers.inner.plans.load();
            let resolved = tiers.resolve(&plans, user, tier, None);
            drop(plans);
            let resolved = match resolved {
                Resolved::Bucket(resolved) => resolved,
                Resolved::Unlimited => {
                    this.state = CheckState::Done;
                    return Poll::Ready(Ok(Ok(
                        tiers.unlimited_info(tier, cost)
                    )));
                }
                Resolved::Refused(limited) => {
                    this.state = CheckState::Done;
                    return Poll::Ready(Ok(Err(limited)));
                }
            };
            if let Some(local) = tiers.charge_local(resolved, user, cost) {
                this.state = CheckState::Done;
                return Poll::Ready(local);
            }
            this.state = CheckState::Remote(Box::pin(
                tiers.charge_remote(resolved, user, cost),
            ));
        }
        match &mut this.state {
            CheckState::Remote(remote) => {
                let output = ready!(remote.as_mut().poll(cx));
                this.state = CheckState::Done;
                Poll::Ready(output)
            }
            // Polled again after it finished: a misuse the Future contract
            // leaves open; answer it without a panic.
            _ => Poll::Pending,
        }
    }
}

enum Resolved {
    Bucket(Tier),
    Unlimited,
    Refused(Limited),
}
