//! The limiter: [`RateTier`], the tiers it applies, the store it asks, and
//! who hears what it does.
//!
//! - `ask.rs`: what a decision is asked, and [`LimitRequest`];
//! - `prepare.rs`: the identity, tier and cost policies, and the buckets;
//! - `step.rs`: [`RateTier::step`], the one function every request's
//!   decision goes through;
//! - `rates.rs`: the rate tiers, resolved once per reload for the tier's
//!   own path;
//! - `ruling.rs`: what a decision came to, and the events it tells;
//! - `future.rs`: [`CheckFuture`], the decision as a small lazy future;
//! - `sync.rs`: [`SyncTier`], one tier checked without a future;
//! - `builder.rs`: [`RateTierBuilder`].

pub(crate) mod ask;
mod builder;
pub(crate) use builder::decided_by;
mod fast;
mod future;
pub(crate) mod leftover;
mod partitions;
mod prepare;
mod rates;
pub(crate) mod ruling;
pub(crate) mod slots;
pub(crate) mod step;
mod sync;
mod wait;

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use gcra_core::{Adjust, Quota};
use rate_tier_storage::clock::SharedClock;
use rate_tier_storage::event::Listeners;
use rate_tier_storage::key::KeySecret;
use rate_tier_storage::{
    BucketCheck, MemoryStorage, Rule, Storage, StorageError, StorageExt,
    Subscription,
};

pub use ask::LimitRequest;
pub use builder::RateTierBuilder;
pub use future::CheckFuture;
pub use sync::{SyncAnswer, SyncTier};

use self::ruling::Events;
use crate::error::{ConfigError, Error};
use crate::event::LimitEvent;
use crate::limit::Limit;
use crate::observe::{Checked, Observer};
use crate::tiers::Tiers;

/// Tiers, their quotas and the policies for what does not fit: the limiter.
///
/// Build one with [`RateTier::builder`]; clones share the configuration and
/// the store. Use it through [`TierLimitLayer`](crate::TierLimitLayer), or
/// directly with [`RateTier::check`] and [`RateTier::decide`].
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
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) tiers: ArcSwap<Tiers>,
    /// The rate tiers of `tiers`, for the tier's own path.
    pub(crate) rates: rates::RateTable,
    /// Unique per limiter (never reused, unlike an address): the key of the
    /// thread-local copy of the tiers.
    pub(crate) id: u64,
    /// Bumped after every reload: a thread's copy of older tiers is stale.
    pub(crate) generation: AtomicU64,
    /// The store.
    pub(crate) store: Arc<dyn Storage>,
    /// The same store when it is the memory store: its decision inlined
    /// (no virtual call, nothing boxed).
    pub(crate) memory: Option<MemoryStorage>,
    /// Whether the store may decide without I/O
    /// ([`Capabilities::answers_ready`](rate_tier_storage::Capabilities::answers_ready)):
    /// if not, a decision goes straight to its awaited path.
    pub(crate) answers_ready: bool,
    pub(crate) clock: SharedClock,
    pub(crate) key_secret: Option<KeySecret>,
    /// Who hears every event, the store's included, each once.
    pub(crate) listeners: Listeners<LimitEvent>,
    /// Who sees every check, each once.
    observers: Vec<Arc<dyn Observer>>,
    /// The store's events, passed on once someone listens.
    store_events: OnceLock<Subscription>,
    /// Where requests wait for their slot, if they may.
    pub(crate) waiting: Option<wait::WaitRoom>,
    /// The share of a limit used from which a customer is near it
    /// ([`RateTierBuilder::near_limit`]).
    pub(crate) near_limit: Option<f64>,
    /// The tier alone may take its own fast path: nothing else to do for
    /// it (no waiting, no near-limit watch, no bans).
    pub(crate) tier_fast: bool,
    /// Who is banned, and when one is ([`RateTierBuilder::ban`]).
    pub(crate) bans: Option<crate::ban::Bans>,
    /// The limits of live layers that a reload must not make meet in two
    /// partitions (see `partitions.rs`).
    pub(crate) layers: partitions::Layers,
}

impl fmt::Debug for RateTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("RateTier")
            .field("tiers", &*inner.tiers.load())
            .field("store", &inner.store)
            .field("key_secret", &inner.key_secret)
            .finish_non_exhaustive()
    }
}

impl RateTier {
    /// Configures a limiter.
    pub fn builder() -> RateTierBuilder {
        RateTierBuilder::default()
    }

    /// The quota of a configured tier, in the tiers in force now.
    pub fn quota(&self, tier: &str) -> Option<Quota> {
        self.inner.tiers.load().quota(tier)
    }

    /// The default tier of the tiers in force now, if one is set.
    pub fn default_tier(&self) -> Option<&'static str> {
        self.inner.tiers.load().default_tier()
    }

    /// The tiers in force now.
    pub fn tiers(&self) -> Arc<Tiers> {
        self.inner.tiers.load_full()
    }

    /// The store the limiter uses.
    ///
    /// ```
    /// use tower_rate_tier::{Quota, RateTier};
    /// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
    /// assert_eq!(limiter.storage().capabilities().label, "memory");
    /// ```
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.inner.store
    }

    /// Replaces the tiers, for every clone of this limiter, without a
    /// restart and without losing any bucket: requests already deciding
    /// finish on the old tiers, later ones use the new. A bucket is its tier
    /// name and user, and its TAT stays: a user who spent half of their
    /// bucket has spent half of the new one; with a smaller burst, what
    /// they spent beyond it is a debt that drains at the rate (the time
    /// their requests took of the tier, never more). Reported as
    /// [`LimitEvent::TiersReloaded`].
    ///
    /// A policy the new tiers do not set (`on_missing`, `on_unknown_tier`,
    /// `on_storage_error`, `on_identity_error`) is kept from the running
    /// tiers where it was set and still applies, so tiers read from a file
    /// do not quietly turn a 401 into the default tier. Tiers are validated
    /// when built ([`TiersBuilder::build`](crate::TiersBuilder::build)), so a
    /// bad configuration never reaches this call: the old tiers stay.
    ///
    /// ```
    /// use tower_rate_tier::{Tiers, Quota, RateTier, clock::FakeClock};
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
    /// limiter.reload(Tiers::builder().tier("free", Quota::per_minute(20)).build().unwrap());
    /// let info = limiter.check("ana", "free", 1).await.unwrap().unwrap();
    /// assert_eq!((info.limit, info.remaining), (20, 9));
    /// # }
    /// ```
    ///
    /// Tiers with a tier of a kind the store does not decide are refused
    /// (the running tiers stay), reported as [`LimitEvent::TiersRefused`]:
    /// see [`RateTier::try_reload`].
    pub fn reload(&self, tiers: Tiers) {
        // Reported to the listeners by `try_reload`.
        let _refused = self.try_reload(tiers);
    }

    /// [`RateTier::reload`], with the refusal as an error as well as a
    /// [`LimitEvent::TiersRefused`] to the listeners (so an observer such as
    /// a status page sees every refused reload, whoever asked for it).
    ///
    /// ```
    /// use tower_rate_tier::{ConfigError, LimitEvent, Period, PeriodUnit, Tiers, Quota, RateTier};
    /// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
    /// // In memory, a tier may become a monthly quota; its buckets start
    /// // fresh, and the reload says so.
    /// let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    /// let sink = heard.clone();
    /// let _listening = limiter.subscribe(move |e| sink.lock().unwrap().push(e.clone()));
    /// let monthly = Period::new(1000, PeriodUnit::Month, 0)?;
    /// limiter.try_reload(Tiers::builder().tier("free", monthly).build()?)?;
    /// assert!(matches!(
    ///     &heard.lock().unwrap()[..],
    ///     [LimitEvent::TiersReloaded { fresh, .. }] if fresh == &["free"]
    /// ));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::UnsupportedKind`]: a tier of a kind the store does
    /// not decide. [`ConfigError::KindsInTwoPartitions`]: on a Redis
    /// Cluster, a tier that becomes a window, a period or a concurrency
    /// limit beside a live layer's global or keyed limit of those kinds.
    /// Nothing changed.
    pub fn try_reload(&self, tiers: Tiers) -> Result<(), ConfigError> {
        self.replace_tiers(tiers).inspect_err(|error| {
            self.emit(|| LimitEvent::TiersRefused {
                error: error.clone(),
            });
        })
    }

    /// `tiers` in force, or the reason they cannot be.
    fn replace_tiers(&self, tiers: Tiers) -> Result<(), ConfigError> {
        builder::check_kinds(&tiers, &self.inner.store)?;
        let names = tiers.tier_names().map(str::to_owned).collect();
        let mut fresh = Vec::new();
        // rcu: policies are kept from the tiers actually replaced, even
        // if two reloads race.
        self.swap_tiers(&tiers, || {
            self.inner.tiers.rcu(|running| {
                let mut next = tiers.clone();
                next.keep_policies_of(running);
                fresh = next.kinds_changed_from(running);
                next
            });
            // Under the reloads' lock: the last reload's tiers win.
            self.inner.rates.set(&self.inner.tiers.load());
        })?;
        // After the store: a thread that sees the new generation loads the
        // new tiers.
        self.inner.generation.fetch_add(1, Ordering::Release);
        self.emit(|| LimitEvent::TiersReloaded {
            tiers: names,
            fresh,
        });
        Ok(())
    }

    /// Adds a listener for every event of this limiter (its checks', its
    /// layers' requests', its store's, its reloads'), until the returned
    /// [`Subscription`] is dropped. For a listener that lives as long as the
    /// limiter, [`RateTierBuilder::on_event`] is simpler.
    pub fn subscribe(
        &self,
        listener: impl Fn(&LimitEvent) + Send + Sync + 'static,
    ) -> Subscription {
        let subscription = self.inner.listeners.subscribe(Arc::new(listener));
        self.inner.forward_store_events();
        subscription
    }

    /// Charges `cost` to `user`'s bucket in `tier`: the tier's limit alone.
    ///
    /// The outer `Result` is an error of the store or of the input (cost 0);
    /// the inner one is the decision. An unknown tier follows the
    /// [`OnUnknownTier`](crate::policy::OnUnknownTier) policy (an explicit `Allow`
    /// yields an `info` with `u64::MAX` remaining); a cost above the burst is
    /// [`LimitReason::CostExceedsBurst`](crate::LimitReason::CostExceedsBurst),
    /// decided without touching the store; a store that fails follows the
    /// [`OnStorageError`](crate::policy::OnStorageError) policy (`Allow`: passed;
    /// `Deny`: the error). Every such case is reported to the limiter's
    /// listeners.
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
        CheckFuture::tier(self, user, tier, cost)
    }

    /// Decides a request against its tier and other limits, as one
    /// decision: every bucket is charged, or none is. A refusal names the
    /// limit that refused ([`Limited::limit_name`](crate::Limited::limit_name))
    /// and waits for the longest of the refusing limits.
    ///
    /// The limits of a request are not known before it: on a store that
    /// cannot decide windows, periods or concurrency limits of different
    /// partitions together (a Redis Cluster: see
    /// [`ConfigError::KindsInTwoPartitions`], which a layer's limits are
    /// checked for when it is built), a request that has them is
    /// [`Error::Storage`]`(`[`StorageError::Unsupported`]`)`.
    ///
    /// ```
    /// use tower_rate_tier::{Limit, LimitRequest, Quota, RateTier, clock::FakeClock};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = RateTier::builder()
    ///     .clock(FakeClock::new())
    ///     .tier("free", Quota::per_minute(10))
    ///     .build();
    /// let search = Limit::new("search", Quota::per_minute(3));
    /// let request = LimitRequest::new("ana", "free", 1).limit(&search, 1);
    /// for _ in 0..3 {
    ///     limiter.decide(&request).await.unwrap().unwrap();
    /// }
    /// let refused = limiter.decide(&request).await.unwrap().unwrap_err();
    /// assert_eq!(refused.limit_name(), "search");
    /// assert_eq!(refused.retry_after_secs(), 20);
    /// // All or nothing: the tier was not charged for the refusal.
    /// let tier = limiter.peek("ana", "free").await.unwrap();
    /// assert_eq!(tier.remaining, 7);
    /// # }
    /// ```
    pub fn decide<'a, 'r: 'a>(
        &'a self,
        request: &'a LimitRequest<'r>,
    ) -> CheckFuture<'a> {
        CheckFuture::asking(self, request.ask())
    }

    /// Reads the tier's bucket of `user` in `tier` without charging it.
    ///
    /// ```
    /// use tower_rate_tier::{Quota, RateTier};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
    /// limiter.check("ana", "free", 4).await.unwrap().unwrap();
    /// let info = limiter.peek("ana", "free").await.unwrap();
    /// assert_eq!(info.remaining, 6);
    /// assert_eq!(limiter.peek("ana", "free").await.unwrap().remaining, 6);
    /// # }
    /// ```
    pub async fn peek(
        &self,
        user: &str,
        tier: &str,
    ) -> Result<crate::outcome::RateLimitInfo, Error> {
        let request = LimitRequest::new(user, tier, 0);
        match self.decide(&request).await? {
            Ok(admitted) => Ok(admitted.info),
            // A peek never refuses, but a denied unknown tier has nothing
            // to allow.
            Err(limited) => Ok(crate::outcome::RateLimitInfo::nothing(
                limited.tier(),
                limited.now_us,
            )),
        }
    }

    /// Adjusts `limit`'s bucket of `user` (a per-user limit) after the
    /// request `info` answered, by `adjust`: the debt of an estimate below
    /// the actual cost, or a refund (see [`gcra_core::Quota::settle`]). The
    /// quota is the one that charged the estimate: the customer's own for
    /// the limit if the request carried one
    /// ([`LimitRequest::quota`], [`TierIdentity::with_quota`](crate::TierIdentity::with_quota)),
    /// else the limit's for `info`'s tier; and the settlement goes to the
    /// store that charged the estimate (during an outage, a fallback's local
    /// store; see [`FallbackStorage`](rate_tier_storage::FallbackStorage)).
    /// Only a rate is settled: a limit of another kind is
    /// [`StorageError::Unsupported`], and nothing changes. So is a limit not
    /// declared settled ([`Limit::settle`]): [`Error::NotSettled`], never a
    /// debt accepted and then forgiven.
    ///
    /// ```
    /// use tower_rate_tier::{rules::Adjust, Limit, LimitRequest, Quota, RateTier, Settle, clock::FakeClock};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let limiter = RateTier::builder()
    ///     .clock(FakeClock::new())
    ///     .tier("free", Quota::per_minute(10))
    ///     .build();
    /// let tokens = Limit::new("tokens", Quota::per_minute(1000))
    ///     .settle(Settle::from_header("x-tokens-used"));
    /// let request = LimitRequest::new("ana", "free", 1).limit(&tokens, 1);
    /// let info = limiter.decide(&request).await.unwrap().unwrap();
    /// // The answer used 1200 tokens: 1199 more, a debt of about 12 s.
    /// limiter.settle("ana", &info, &tokens, Adjust::between(1, 1200)).await.unwrap();
    /// let refused = limiter.decide(&request).await.unwrap().unwrap_err();
    /// assert_eq!(refused.limit_name(), "tokens");
    /// assert_eq!(refused.retry_after_secs(), 13);
    ///
    /// // Bea has her own 100 tokens a minute (0.6 s each): 101 used are a
    /// // debt of 100 of hers, 60 s (not 6 s of the limit's 1000).
    /// let bea = LimitRequest::new("bea", "free", 1)
    ///     .limit(&tokens, 1)
    ///     .quota("tokens", Quota::per_minute(100));
    /// let info = limiter.decide(&bea).await.unwrap().unwrap();
    /// limiter.settle("bea", &info, &tokens, Adjust::between(1, 101)).await.unwrap();
    /// // Her bucket is 60.6 s ahead, of 60 s: 1.2 s until the next token.
    /// let refused = limiter.decide(&bea).await.unwrap().unwrap_err();
    /// assert_eq!(refused.limit_name(), "tokens");
    /// assert_eq!(refused.retry_after(), std::time::Duration::from_millis(1200));
    /// # }
    /// ```
    pub async fn settle(
        &self,
        user: &str,
        info: &crate::outcome::RateLimitInfo,
        limit: &Limit,
        adjust: Adjust,
    ) -> Result<(), Error> {
        if limit.settle.is_none() {
            return Err(Error::NotSettled(limit.name().to_owned()));
        }
        let decided = info.limits().find(|state| state.name == limit.name());
        let charged = decided
            .map_or(rate_tier_storage::Charged::Primary, |state| state.charged);
        // The rule that charged the estimate (a customer's own quota, in
        // place of the limit's); the limit's for a limit not decided.
        let rule = decided
            .and_then(|state| state.rule)
            .unwrap_or_else(|| limit.rule_for(&info.tier));
        // Only a rate carries a debt or takes a refund.
        let Rule::Rate(quota) = rule else {
            return Err(Error::Storage(StorageError::Unsupported(
                "settling a window, a period or a concurrency limit",
            )));
        };
        let bucket = BucketCheck::peek(limit.key, user, quota)
            .key_secret(self.inner.key_secret.as_ref());
        self.inner
            .store
            .settle(&[bucket.settle(adjust).charged(charged)])
            .await?;
        Ok(())
    }

    /// Puts `user`'s buckets back to full: the tier's, on every tier (the
    /// one they left when they upgraded too), and those of `limits` of
    /// their own (a global or keyed limit is everyone's, and is left as it
    /// is), and their ban if they are banned. Every store resets the set at
    /// once (see [`Storage::reset`]); a
    /// concurrency limit's slots in flight stay taken. Refusals a Redis
    /// store remembers are forgotten on this instance at once, and on every
    /// other instance sharing the Redis within about a second.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use tower_rate_tier::{Quota, RateTier};
    /// let limiter = RateTier::builder().tier("free", Quota::per_minute(1)).build();
    /// limiter.check("ana", "free", 1).await.unwrap().unwrap();
    /// assert!(limiter.check("ana", "free", 1).await.unwrap().is_err());
    /// limiter.reset("ana", &[]).await.unwrap();
    /// assert!(limiter.check("ana", "free", 1).await.unwrap().is_ok());
    /// # }
    /// ```
    pub async fn reset(
        &self,
        user: &str,
        limits: &[&Limit],
    ) -> Result<(), Error> {
        let secret = self.inner.key_secret.as_ref();
        let tiers: Vec<(&'static rate_tier_storage::LimitName, Rule)> =
            self.inner.with_tiers(|current| {
                current.tiers.iter().map(|t| (t.key, t.rule)).collect()
            });
        let mut buckets: Vec<BucketCheck<'_>> = Vec::new();
        for (key, rule) in tiers {
            buckets.push(
                BucketCheck::of_rule(key, user, rule, 0)
                    .map_err(Error::Check)?
                    .key_secret(secret),
            );
        }
        for limit in limits {
            if !matches!(limit.scope, crate::limit::Scope::User) {
                continue;
            }
            let rule = limit.rule_for("");
            buckets.push(
                BucketCheck::of_rule(limit.key, user, rule, 0)
                    .map_err(Error::Check)?
                    .key_secret(secret),
            );
        }
        if !user.is_empty() {
            buckets.extend(crate::ban::buckets(user, secret));
        }
        self.inner.store.reset(&buckets).await?;
        Ok(())
    }

    /// Reports an event to the limiter's listeners, building it only if
    /// someone listens.
    pub(crate) fn emit(&self, event: impl FnOnce() -> LimitEvent) {
        self.inner.listeners.emit_with(event);
    }

    /// Whether the limiter's listeners want events.
    pub(crate) fn listening(&self) -> bool {
        !self.inner.listeners.is_empty()
    }

    /// Reports a decision's events to the limiter's listeners.
    pub(crate) fn report(&self, events: Events) {
        for event in events.drain() {
            self.emit(|| event);
        }
    }

    /// Reports a check to the limiter's observers.
    pub(crate) fn checked(&self, check: &Checked) {
        for observer in &self.inner.observers {
            observer.checked(check);
        }
    }

    /// Whether the limiter has observers (worth timing a check for).
    pub(crate) fn observed(&self) -> bool {
        !self.inner.observers.is_empty()
    }
}

thread_local! {
    /// The tiers this thread used last, and whose they are: reading them is
    /// a comparison, where a snapshot of the shared tiers is a few atomic
    /// operations. One limiter's at a time (the last one used).
    static TIERS: RefCell<Option<(u64, u64, Arc<Tiers>)>> =
        const { RefCell::new(None) };
}

impl Inner {
    /// Runs `f` on the tiers in force, from this thread's copy when it is
    /// current: no atomic read-modify-write on a shared counter.
    #[inline(always)]
    pub(crate) fn with_tiers<R>(&self, f: impl FnOnce(&Tiers) -> R) -> R {
        let generation = self.generation.load(Ordering::Acquire);
        let mut f = Some(f);
        let done = TIERS.try_with(|cell| {
            // A listener that checks again on this thread from inside `f`
            // finds it borrowed: it takes the shared snapshot instead.
            let mut slot = cell.try_borrow_mut().ok()?;
            let current = matches!(
                &*slot,
                Some((id, seen, _)) if *id == self.id && *seen == generation
            );
            if !current {
                *slot = Some((self.id, generation, self.tiers.load_full()));
            }
            let (_, _, tiers) = slot.as_ref()?;
            let f = f.take()?;
            Some(f(tiers))
        });
        match (done, f) {
            (Ok(Some(result)), _) => result,
            (_, Some(f)) => f(&self.tiers.load()),
            (_, None) => unreachable!("`f` runs once: it returned above"),
        }
    }

    /// Forwards the store's events to the listeners, from the first
    /// listener on: a limiter nobody listens to costs the store nothing.
    fn forward_store_events(&self) {
        self.store_events.get_or_init(|| {
            let listeners = self.listeners.clone();
            self.store.subscribe(Arc::new(move |event| {
                listeners.emit_with(|| LimitEvent::Storage(event.clone()));
            }))
        });
    }
}
