//! [`SyncTier`]: one tier of a limiter over the memory store, checked
//! without a future, its answer a few `Copy` words. The tier is resolved
//! when the handle is made and again only after a reload.

use std::fmt;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use gcra_core::Decision;
use rate_tier_storage::{MemoryStorage, StorageError};

use super::RateTier;
use super::fast::TierDecision;
use super::future::{Output, failed_output};
use super::rates::RateTierEntry;
use super::step::Failed;
use crate::error::{ConfigError, Error};
use crate::outcome::ceil_secs;

/// One tier of a [`RateTier`] over the memory store, checked
/// synchronously: for code that is not async, and for the hottest paths,
/// where [`RateTier::check`]'s answer (its `Admitted` or `Limited`, the
/// tier's name and every field of the headers) is more than the caller
/// reads.
///
/// A check through it is the same decision as [`RateTier::check`] of its
/// tier: the same buckets, the same policies, bans and near-limit watch,
/// the same events. It follows reloads of the limiter (a tier removed by
/// one follows the unknown-tier policy). Clones share the limiter.
///
/// Made by [`RateTier::sync_tier`].
///
/// ```
/// use std::time::Duration;
/// use tower_rate_tier::{Quota, RateTier, clock::FakeClock};
///
/// let clock = FakeClock::new();
/// let limiter = RateTier::builder()
///     .clock(clock.clone())
///     .tier("free", Quota::per_minute(10))
///     .build();
/// let free = limiter.sync_tier("free")?;
/// for _ in 0..10 {
///     assert!(free.check("ana", 1)?.allowed);
/// }
/// let refused = free.check("ana", 1)?;
/// assert!(!refused.allowed);
/// assert_eq!(refused.retry_after(), Duration::from_secs(6));
///
/// clock.advance(Duration::from_secs(6));
/// assert_eq!(free.check("ana", 1)?.remaining, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct SyncTier {
    limiter: RateTier,
    name: Box<str>,
    /// The tier as the rate table held it at `generation`, when its own
    /// fast path may decide it; `None`: every check takes the full path.
    fast: Option<RateTierEntry>,
    generation: u64,
}

/// What [`SyncTier::check`] decided: `Copy`, built from the tier's bucket
/// only.
///
/// ```
/// use tower_rate_tier::{Quota, RateTier};
/// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
/// let answer = limiter.sync_tier("free")?.check("ana", 4)?;
/// assert_eq!((answer.allowed, answer.limit, answer.remaining), (true, 10, 6));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a refused request is told by `allowed`"]
pub struct SyncAnswer {
    /// Whether the request passes.
    pub allowed: bool,
    /// The burst of the limit that decided (`u32::MAX` for an unknown tier
    /// let through by its policy).
    pub limit: u32,
    /// Requests of cost 1 that would still pass now; 0 when refused.
    pub remaining: u64,
    /// When refused, µs until the same request would pass (0 when it
    /// never will: a cost above the burst, a ban's end unknown); 0 when
    /// allowed.
    pub retry_after_us: u64,
    /// µs until the bucket is full again.
    pub reset_after_us: u64,
}

impl SyncAnswer {
    /// [`SyncAnswer::retry_after_us`] as a `Duration`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_rate_tier::sync::SyncAnswer;
    /// let answer = SyncAnswer {
    ///     allowed: false, limit: 10, remaining: 0,
    ///     retry_after_us: 1_500_000, reset_after_us: 60_000_000,
    /// };
    /// assert_eq!(answer.retry_after(), Duration::from_micros(1_500_000));
    /// assert_eq!(answer.retry_after_secs(), 2);
    /// ```
    pub fn retry_after(&self) -> Duration {
        Duration::from_micros(self.retry_after_us)
    }

    /// [`SyncAnswer::retry_after`] in whole seconds, rounded up (the
    /// `Retry-After` header's value).
    ///
    /// ```
    /// use tower_rate_tier::sync::SyncAnswer;
    /// let answer = SyncAnswer {
    ///     allowed: false, limit: 10, remaining: 0,
    ///     retry_after_us: 6_000_001, reset_after_us: 60_000_000,
    /// };
    /// assert_eq!(answer.retry_after_secs(), 7);
    /// ```
    pub fn retry_after_secs(&self) -> u64 {
        ceil_secs(self.retry_after())
    }
}

impl fmt::Debug for SyncTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncTier")
            .field("tier", &self.name)
            .field("fast", &self.fast.is_some())
            .finish_non_exhaustive()
    }
}

impl RateTier {
    /// A handle that checks `tier` synchronously ([`SyncTier`]).
    ///
    /// ```
    /// use tower_rate_tier::{ConfigError, Quota, RateTier};
    /// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
    /// assert!(limiter.sync_tier("free").is_ok());
    /// assert!(matches!(limiter.sync_tier("gold"), Err(ConfigError::NotSync { .. })));
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::NotSync`] when a check of `tier` could have to wait:
    /// the store is not the memory store (its I/O is awaited), or the
    /// limiter lets requests wait for their turn
    /// ([`RateTierBuilder::wait_up_to`](crate::RateTierBuilder::wait_up_to));
    /// and when `tier` is not one of the tiers in force (a mistyped name
    /// found when the handle is made, not on every request).
    pub fn sync_tier(&self, tier: &str) -> Result<SyncTier, ConfigError> {
        let inner = &*self.inner;
        let not_sync = |why: &'static str| ConfigError::NotSync {
            tier: tier.to_owned(),
            why,
        };
        if inner.memory.is_none() {
            return Err(not_sync("its store is not the memory store"));
        }
        if inner.waiting.is_some() {
            return Err(not_sync("its requests may wait for their turn"));
        }
        if !inner.tiers.load().tier_names().any(|name| name == tier) {
            return Err(not_sync("it is not a configured tier"));
        }
        let generation = inner.generation.load(Ordering::Acquire);
        Ok(SyncTier {
            limiter: self.clone(),
            name: tier.into(),
            fast: self.sync_fast_entry(tier),
            generation,
        })
    }

    /// `tier`'s entry when its own fast path decides it: a rate tier, with
    /// that path open.
    fn sync_fast_entry(&self, tier: &str) -> Option<RateTierEntry> {
        if !self.tier_path_open() {
            return None;
        }
        self.inner.rates.find(tier)
    }
}

impl SyncTier {
    /// Charges `cost` to `user`'s bucket in this tier, as
    /// [`RateTier::check`] does, and answers at once.
    ///
    /// ```
    /// use tower_rate_tier::{Error, Quota, RateTier};
    /// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
    /// let free = limiter.sync_tier("free")?;
    /// // A cost above the burst never passes, and charges nothing.
    /// let answer = free.check("ana", 11)?;
    /// assert!(!answer.allowed && answer.retry_after_us == 0);
    /// assert!(matches!(free.check("ana", 0), Err(Error::ZeroCost)));
    /// assert_eq!(free.check("ana", 1)?.remaining, 9);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RateTier::check`]'s outer error: a cost of 0, or the store's
    /// error when the tiers' [`OnStorageError`](crate::policy::OnStorageError)
    /// policy refuses.
    #[inline]
    pub fn check(&self, user: &str, cost: u32) -> Result<SyncAnswer, Error> {
        let inner = &*self.limiter.inner;
        let current =
            inner.generation.load(Ordering::Acquire) == self.generation;
        match (&self.fast, &inner.memory) {
            (Some(tier), Some(memory)) if current => {
                self.check_rate(memory, tier, user, cost)
            }
            _ => self.check_reloaded(user, cost),
        }
    }

    /// The tier's own fast path: its bucket alone, in the memory store.
    #[inline(always)]
    fn check_rate(
        &self,
        memory: &MemoryStorage,
        tier: &RateTierEntry,
        user: &str,
        cost: u32,
    ) -> Result<SyncAnswer, Error> {
        let limit = tier.quota.burst();
        // 1..=limit; 0 and above the burst are the full path's.
        if cost.wrapping_sub(1) >= limit {
            return self.check_in_full(user, cost);
        }
        match memory.check_rate(tier.key, user, &tier.quota, cost) {
            Ok((decision, now_us)) => {
                if !decision.allowed {
                    // What it writes is the store's business, not the
                    // listeners': left out, it is never computed.
                    let decision = Decision {
                        store: None,
                        ..decision
                    };
                    self.refused(user, tier, cost, decision, now_us);
                }
                Ok(SyncAnswer {
                    allowed: decision.allowed,
                    limit,
                    remaining: decision.remaining,
                    retry_after_us: decision.retry_after_us,
                    reset_after_us: decision.reset_after_us,
                })
            }
            Err(error) => {
                let policy = tier.on_storage_error;
                let failed = Failed { error, policy };
                answer_of(failed_output(
                    &self.limiter,
                    &self.name,
                    cost,
                    failed,
                ))
            }
        }
    }

    /// A check after a reload: the tier as the table holds it now.
    #[cold]
    #[inline(never)]
    fn check_reloaded(
        &self,
        user: &str,
        cost: u32,
    ) -> Result<SyncAnswer, Error> {
        let inner = &*self.limiter.inner;
        match (self.limiter.sync_fast_entry(&self.name), &inner.memory) {
            (Some(tier), Some(memory)) => {
                self.check_rate(memory, &tier, user, cost)
            }
            _ => self.check_in_full(user, cost),
        }
    }

    /// Tells the listeners of a refusal on the fast path.
    #[cold]
    fn refused(
        &self,
        user: &str,
        tier: &RateTierEntry,
        cost: u32,
        decision: Decision,
        now_us: u64,
    ) {
        let decided = TierDecision::of_memory(tier, cost, decision, now_us);
        self.limiter.tell_if_refused(user, &decided);
    }

    /// Everything else, decided by [`RateTier::check`]: in process, so its
    /// future is ready when first polled.
    #[cold]
    #[inline(never)]
    fn check_in_full(
        &self,
        user: &str,
        cost: u32,
    ) -> Result<SyncAnswer, Error> {
        let future = pin!(self.limiter.check(user, &self.name, cost));
        let mut cx = Context::from_waker(Waker::noop());
        match future.poll(&mut cx) {
            Poll::Ready(output) => answer_of(output),
            // The memory store and no waiting: every check is ready. Were
            // one not, dropping it charges nothing twice and forgives no
            // debt, and the caller hears of a failure, not of a refusal.
            Poll::Pending => {
                debug_assert!(false, "a check in memory waited");
                Err(Error::Storage(StorageError::Unsupported(
                    "a synchronous check that would wait",
                )))
            }
        }
    }

    /// The tier this handle checks.
    ///
    /// ```
    /// use tower_rate_tier::{Quota, RateTier};
    /// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
    /// assert_eq!(limiter.sync_tier("free")?.tier(), "free");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tier(&self) -> &str {
        &self.name
    }
}

/// The direct API's answer, in a few words.
fn answer_of(output: Output) -> Result<SyncAnswer, Error> {
    Ok(match output? {
        Ok(admitted) => SyncAnswer {
            allowed: true,
            limit: admitted.limit,
            remaining: admitted.remaining,
            retry_after_us: 0,
            reset_after_us: micros(admitted.reset_after),
        },
        Err(limited) => SyncAnswer {
            allowed: false,
            limit: limited.limit,
            remaining: 0,
            retry_after_us: limited.retry_after_us,
            reset_after_us: limited.reset_after_us,
        },
    })
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}
