//! [`RateTierBuilder`]: every setting of a limiter, with a safe default.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use rate_tier_storage::clock::{Clock, MonotonicClock, SharedClock};
use rate_tier_storage::event::Listeners;
use rate_tier_storage::key::KeySecret;
use rate_tier_storage::{MemoryStorage, Rule, Storage, StorageExt};

use super::wait::{DEFAULT_MAX_WAITING, WaitRoom};
use super::{Inner, RateTier};
use crate::error::ConfigError;
use crate::event::LimitEvent;
use crate::observe::Observer;
use crate::policy::{
    OnIdentityError, OnMissing, OnStorageError, OnUnknownTier,
};
use crate::tiers::{Tiers, TiersBuilder};

type Listener = Arc<dyn Fn(&LimitEvent) + Send + Sync>;

/// Builds a [`RateTier`]. Every setting has a safe default; see each method.
#[derive(Default)]
#[must_use]
pub struct RateTierBuilder {
    tiers: TiersBuilder,
    storage: Option<Arc<dyn Storage>>,
    clock: Option<SharedClock>,
    key_secret: Option<Vec<u8>>,
    listeners: Vec<Listener>,
    observers: Vec<Arc<dyn Observer>>,
    wait_up_to: Option<Duration>,
    max_waiting: Option<usize>,
    near_limit: Option<f64>,
    ban: Option<crate::ban::Ban>,
}

impl std::fmt::Debug for RateTierBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateTierBuilder")
            .field("tiers", &self.tiers)
            .field("storage", &self.storage)
            .field("key_secret", &self.key_secret.as_ref().map(|_| ".."))
            .field("listeners", &self.listeners.len())
            .field("observers", &self.observers.len())
            .finish_non_exhaustive()
    }
}

impl RateTierBuilder {
    /// How many requests of one limiter may wait at once unless
    /// [`max_waiting`](Self::max_waiting) says otherwise.
    ///
    /// ```
    /// assert_eq!(tower_rate_tier::RateTierBuilder::DEFAULT_MAX_WAITING, 1024);
    /// ```
    pub const DEFAULT_MAX_WAITING: usize = DEFAULT_MAX_WAITING;

    /// Adds a tier (a plan a customer is on): a name of 1 to 64 `[A-Za-z0-9_.-]` and its quota.
    pub fn tier(
        mut self,
        name: impl Into<String>,
        rule: impl Into<Rule>,
    ) -> Self {
        self.tiers = self.tiers.tier(name, rule);
        self
    }

    /// The tier for requests without an identity ([`OnMissing::UseDefault`])
    /// and for unknown tiers ([`OnUnknownTier::UseDefault`]).
    pub fn default_tier(mut self, name: impl Into<String>) -> Self {
        self.tiers = self.tiers.default_tier(name);
        self
    }

    /// What a request without identity gets. Default: the default tier if
    /// one is set, else 401 Unauthorized.
    pub fn on_missing(mut self, policy: OnMissing) -> Self {
        self.tiers = self.tiers.on_missing(policy);
        self
    }

    /// What a request with an unconfigured tier gets. Default: the default
    /// tier's quota in the user's own bucket if a default tier is set, else
    /// 403 Forbidden. Never unlimited unless [`OnUnknownTier::Allow`].
    pub fn on_unknown_tier(mut self, policy: OnUnknownTier) -> Self {
        self.tiers = self.tiers.on_unknown_tier(policy);
        self
    }

    /// What a request gets when the store fails. Default: 503, fail closed.
    pub fn on_storage_error(mut self, policy: OnStorageError) -> Self {
        self.tiers = self.tiers.on_storage_error(policy);
        self
    }

    /// What a request gets when its identity lookup fails. Default: 503,
    /// fail closed.
    pub fn on_identity_error(mut self, policy: OnIdentityError) -> Self {
        self.tiers = self.tiers.on_identity_error(policy);
        self
    }

    /// Where buckets live. Default: a [`MemoryStorage`] on this builder's
    /// clock. A store passed here keeps its own clock.
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = Some(storage);
        self
    }

    /// The clock (default: [`MonotonicClock`]). It drives the default memory
    /// store and the `x-ratelimit-reset` times.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Replaces the tiers and policies set so far with `tiers` (for
    /// example read from a file with `TiersBuilder::from_toml`).
    ///
    /// ```
    /// use tower_rate_tier::{Tiers, Quota, RateTier};
    /// let tiers = Tiers::builder().tier("free", Quota::per_minute(10));
    /// let tiers = RateTier::builder().tiers(tiers).build();
    /// assert_eq!(tiers.quota("free"), Some(Quota::per_minute(10)));
    /// ```
    pub fn tiers(mut self, tiers: TiersBuilder) -> Self {
        self.tiers = tiers;
        self
    }

    /// Keys in shared stores become `trt:<tier>:<hmac_sha1_hex(secret, user)>`,
    /// so low-entropy ids (IPs, emails) cannot be recovered from them. An
    /// empty secret is a [`ConfigError::EmptyKeySecret`].
    pub fn key_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.key_secret = Some(secret.as_ref().to_vec());
        self
    }

    /// Called with every [`LimitEvent`] of the limiter, once each: the
    /// requests' of every layer over it and of direct checks, the store's
    /// own (a circuit breaker, fallback decisions, evictions), and reloads.
    /// It runs on the request path: keep it short (log, count, send to a
    /// channel). It lives as long as the limiter.
    ///
    /// ```
    /// use tower_rate_tier::{LimitEvent, Quota, RateTier, storage::StorageEvent};
    /// let tiers = RateTier::builder()
    ///     .tier("free", Quota::per_minute(10))
    ///     .on_event(|event| {
    ///         if let LimitEvent::Storage(StorageEvent::Breaker { to, .. }) = event {
    ///             eprintln!("breaker {to:?}");
    ///         }
    ///     })
    ///     .build();
    /// # let _ = tiers;
    /// ```
    pub fn on_event<F>(mut self, on_event: F) -> Self
    where
        F: Fn(&LimitEvent) + Send + Sync + 'static,
    {
        self.listeners.push(Arc::new(on_event));
        self
    }

    /// Lets a request that would be refused for its rate wait up to
    /// `max_wait` for its slot instead, and then be served (a leaky
    /// bucket: a short burst delayed by a few hundred milliseconds rather
    /// than answered 429). Longer waits are refused as without it.
    ///
    /// Only decisions of rate limits alone wait (a window, period or
    /// concurrency limit in the decision: checked as without waiting), on a
    /// store that reserves ([`Capabilities::reserves`](crate::storage::Capabilities::reserves); else
    /// [`ConfigError::CannotWait`] at build). At most
    /// [`max_waiting`](Self::max_waiting) requests wait at once; beyond
    /// that they are refused rather than queued. A request whose client
    /// goes away while it waits gives its slot back.
    ///
    /// A reserved slot is a debt in the bucket that every instance sharing
    /// the store honours, whether it waits or not: a wait is at most
    /// [`DEFAULT_MAX_DEBT`](gcra_core::DEFAULT_MAX_DEBT) (an hour; longer is
    /// [`ConfigError::WaitTooLong`]), and at most a quota's own
    /// [`max_debt_us`](gcra_core::Quota::max_debt_us) where that is shorter.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use tower_rate_tier::{Quota, RateTier};
    /// tokio::time::pause();
    /// let limiter = RateTier::builder()
    ///     .tier("free", Quota::per_second(10).allow_burst(1))
    ///     .wait_up_to(Duration::from_millis(500))
    ///     .build();
    /// limiter.check("ana", "free", 1).await.unwrap().unwrap();
    /// // The second waits its 100 ms, then passes.
    /// let started = tokio::time::Instant::now();
    /// limiter.check("ana", "free", 1).await.unwrap().unwrap();
    /// assert!(started.elapsed() >= Duration::from_millis(99));
    /// # }
    /// ```
    pub fn wait_up_to(mut self, max_wait: Duration) -> Self {
        self.wait_up_to = Some(max_wait);
        self
    }

    /// Reports [`LimitEvent::NearLimit`] (and the metric
    /// `rate_tier_near_limit_total`) when an allowed request brings a
    /// customer to `ratio` of a limit used (envoyproxy/ratelimit's
    /// `NEAR_LIMIT_RATIO`, 0.8 there): what is left falls to at most
    /// `1 - ratio` of it. Once per crossing. A ratio outside (0, 1] is
    /// [`ConfigError::InvalidNearLimit`]. The tier alone then takes the
    /// general path (a few tens of ns more per check in memory).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::sync::{Arc, Mutex};
    /// use tower_rate_tier::{LimitEvent, Quota, RateTier};
    /// let near = Arc::new(Mutex::new(Vec::new()));
    /// let seen = near.clone();
    /// let limiter = RateTier::builder()
    ///     .tier("free", Quota::per_minute(10))
    ///     .near_limit(0.8)
    ///     .on_event(move |event| {
    ///         if let LimitEvent::NearLimit { remaining, of, .. } = event {
    ///             seen.lock().unwrap().push((*remaining, *of));
    ///         }
    ///     })
    ///     .build();
    /// for _ in 0..10 {
    ///     limiter.check("ana", "free", 1).await.unwrap().unwrap();
    /// }
    /// assert_eq!(*near.lock().unwrap(), [(2, 10)], "once, as 8 of 10 were used");
    /// # }
    /// ```
    pub fn near_limit(mut self, ratio: f64) -> Self {
        self.near_limit = Some(ratio);
        self
    }

    /// Bans a customer who keeps going: after `ban`'s K refusals within W,
    /// every request of theirs is refused for its length, doubling while
    /// the last ban is recent (see [`Ban`](crate::Ban)). Shared through
    /// the store, so every instance bans; a banned request costs no store
    /// call on the instance that banned; the 429 says `"banned": true` and
    /// `retry-after` is the ban's end; [`LimitEvent::Banned`] and
    /// `outcome="banned"`. [`RateTier::reset`](crate::RateTier::reset)
    /// lifts a ban. A ban that cannot be kept is
    /// [`ConfigError::InvalidBan`]; a store that decides no windows cannot
    /// count refusals ([`ConfigError::UnsupportedKind`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use tower_rate_tier::{Ban, LimitReason, Quota, RateTier};
    /// let limiter = RateTier::builder()
    ///     .tier("free", Quota::per_minute(1))
    ///     .ban(Ban::after(3, Duration::from_secs(60)).lasting(Duration::from_secs(600)))
    ///     .build();
    /// limiter.check("eva", "free", 1).await.unwrap().unwrap();
    /// for _ in 0..3 {
    ///     let refused = limiter.check("eva", "free", 1).await.unwrap().unwrap_err();
    ///     assert_eq!(refused.reason(), LimitReason::RateLimited);
    /// }
    /// let banned = limiter.check("eva", "free", 1).await.unwrap().unwrap_err();
    /// assert_eq!(banned.reason(), LimitReason::Banned);
    /// assert!(banned.retry_after_secs() > 590);
    /// # }
    /// ```
    pub fn ban(mut self, ban: crate::ban::Ban) -> Self {
        self.ban = Some(ban);
        self
    }

    /// How many requests may wait at once
    /// ([`wait_up_to`](Self::wait_up_to)): [`DEFAULT_MAX_WAITING`] (1024)
    /// by default. Each waiting request holds its connection and a timer.
    ///
    /// [`DEFAULT_MAX_WAITING`]: Self::DEFAULT_MAX_WAITING
    pub fn max_waiting(mut self, requests: usize) -> Self {
        self.max_waiting = Some(requests);
        self
    }

    /// Reports every check of the limiter (through any layer, or
    /// [`RateTier::check`]) and every event to `observer`, once each: where
    /// metrics belong. It lives as long as the limiter.
    pub fn observe(mut self, observer: impl Observer) -> Self {
        self.observers.push(Arc::new(observer));
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
            Ok(limiter) => limiter,
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
    ///
    /// let err = RateTier::builder().tier("free", Quota::per_minute(1)).key_secret("").try_build();
    /// assert!(matches!(err, Err(ConfigError::EmptyKeySecret(_))));
    /// ```
    pub fn try_build(self) -> Result<RateTier, ConfigError> {
        let tiers = self.tiers.build()?;
        let key_secret = self.key_secret.map(KeySecret::new).transpose()?;
        let store: Arc<dyn Storage> = match self.storage {
            Some(storage) => storage,
            None => Arc::new(match &self.clock {
                Some(clock) => {
                    MemoryStorage::builder().shared_clock(clock.clone()).build()
                }
                // The store's own default clock: read without a virtual call.
                None => MemoryStorage::new(),
            }),
        };
        let memory = (store.as_ref() as &dyn std::any::Any)
            .downcast_ref::<MemoryStorage>()
            .cloned();
        check_kinds(&tiers, &store)?;
        if let Some(ratio) = self.near_limit
            && !(ratio > 0.0 && ratio <= 1.0)
        {
            return Err(ConfigError::InvalidNearLimit(ratio.to_string()));
        }
        let bans = match self.ban {
            Some(ban) => {
                decided_by(&store, "ban", rate_tier_storage::RuleKind::Window)?;
                Some(crate::ban::Bans::new(ban)?)
            }
            None => None,
        };
        let waiting = match self.wait_up_to {
            Some(_) if !store.capabilities().reserves => {
                return Err(ConfigError::CannotWait {
                    store: store.kind(),
                });
            }
            Some(max_wait) if max_wait > gcra_core::DEFAULT_MAX_DEBT => {
                return Err(ConfigError::WaitTooLong(max_wait));
            }
            Some(max_wait) => Some(WaitRoom::new(
                max_wait,
                self.max_waiting.unwrap_or(DEFAULT_MAX_WAITING),
            )),
            None => None,
        };
        let clock = self.clock.unwrap_or_else(|| Arc::new(MonotonicClock));
        let listeners = Listeners::default();
        for listener in self.listeners {
            listeners.subscribe(listener).forever();
        }
        for observer in &self.observers {
            let observer = observer.clone();
            listeners
                .subscribe(Arc::new(move |event| observer.event(event)))
                .forever();
        }
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let answers_ready = store.capabilities().answers_ready;
        let inner = Arc::new(Inner {
            rates: super::rates::RateTable::new(&tiers),
            tiers: ArcSwap::from_pointee(tiers),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            generation: AtomicU64::new(0),
            store,
            memory,
            answers_ready,
            clock,
            key_secret,
            listeners,
            observers: self.observers,
            store_events: OnceLock::new(),
            tier_fast: waiting.is_none()
                && self.near_limit.is_none()
                && bans.is_none(),
            bans,
            waiting,
            near_limit: self.near_limit,
            layers: Default::default(),
        });
        if !inner.listeners.is_empty() {
            inner.forward_store_events();
        }
        Ok(RateTier { inner })
    }
}

/// Every tier of `tiers` is of a kind `store` decides: never a rate in its
/// place.
pub(super) fn check_kinds(
    tiers: &Tiers,
    store: &Arc<dyn Storage>,
) -> Result<(), ConfigError> {
    tiers
        .kinds()
        .try_for_each(|(tier, kind)| decided_by(store, tier, kind))
}

/// `limit` (a tier or a limit of its own) is of `kind`, which `store` must
/// decide.
pub(crate) fn decided_by(
    store: &Arc<dyn Storage>,
    limit: &str,
    kind: rate_tier_storage::RuleKind,
) -> Result<(), ConfigError> {
    if store.supports(kind) {
        return Ok(());
    }
    Err(ConfigError::UnsupportedKind {
        limit: limit.to_owned(),
        kind,
        store: store.kind(),
    })
}
