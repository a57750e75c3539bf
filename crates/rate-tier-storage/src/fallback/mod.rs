//! Keep limiting when the shared store is down: a local fallback behind a
//! circuit breaker.
//!
//! [`FallbackStorage`] wraps a primary store (usually Redis). While the
//! primary answers, it decides. When it fails (an error or a timeout), that
//! request is decided by a local [`MemoryStorage`] instead, and after
//! `failure_threshold` consecutive failures the breaker **opens**: every
//! check goes straight to the local store, at memory speed, with no call to
//! the primary and no timeout to wait. After a cool-down a single request
//! **probes** the primary (half-open); success closes the breaker, failure
//! reopens it for twice the cool-down (up to a cap).
//!
//! ```text
//!            N failures                cool-down passed
//!  Closed ──────────────▶ Open ──────────────────────────▶ HalfOpen (one probe)
//!    ▲                     ▲                                  │    │
//!    │                     └──────── probe failed (backoff) ──┘    │
//!    └──────────────────────────────── probe succeeded ────────────┘
//! ```
//!
//! A probe that never reaches the primary (its inputs were refused first)
//! proves nothing: the breaker goes back to open, due at once, and the next
//! check probes.
//!
//! # Several failure domains
//!
//! A primary made of independent parts (the nodes of a Redis Cluster) names
//! each bucket's part with [`Storage::failure_domain`]. Each part gets a
//! breaker of its own: when one node is down, only the buckets it holds are
//! decided locally, the others stay shared, and a probe of that node
//! closes only its breaker. A decision over buckets of several parts, some
//! of them down, is mixed (see `decide.rs`): the buckets of the parts that
//! are down are decided locally, the others on the primary, still all or
//! nothing. A failure the primary places in one part
//! ([`StorageError::InDomain`]) counts against that part's breaker alone;
//! one it does not place counts against every part of the decision.
//!
//! # Settlements
//!
//! A settlement goes to the store that charged its estimate
//! ([`BucketSettle::charged`](crate::BucketSettle::charged), from [`Decided::charged`]), not to whichever
//! the breaker points at when the response ends: charged locally, it is
//! settled locally; charged by the primary, it is sent there, or, while the
//! primary's breaker is open, kept (at most [`PENDING_MAX`]) and sent once
//! the primary answers again, a debt being charged locally meanwhile. A
//! call that fails is not sent again (it may have been applied): it is
//! reported as [`StorageEvent::SettlementLost`], like a settlement dropped
//! from a full queue.
//!
//! # During an outage
//!
//! Each instance limits on its own, so K instances allow up to K times the
//! quota. [`FallbackStorageBuilder::local_share`] divides each quota by K
//! locally ([`Quota::divided`](gcra_core::Quota::divided)): the rate exactly (the period is K times
//! longer) and the burst down to at least 1. A request whose cost is above
//! the divided burst is [`StorageError::AboveLocalShare`], a transient
//! refusal (it could pass once the primary is back), never a permanent one.
//! When a quota's burst is below K, each instance still allows 1 at once:
//! K instances may pass up to K at once, at the divided rate.
//!
//! # Concurrency limits
//!
//! A slot of a concurrency limit goes back to the store that took it: one
//! taken on the primary is released (and renewed, see [`Capabilities::lease`])
//! there, even after the breaker opened (a release that fails leaves it
//! to its lease); one taken locally during an outage is remembered by its
//! lease id ([`BucketCheck::lease_id`], required for a slot behind a
//! fallback) and released locally, even after the primary is back. So
//! while the primary is down, the slots held on it still count there, and
//! the local store counts only the requests it let through; the local
//! share divides a concurrency limit like a burst. A local slot released
//! twice is released once; the primary's are released by id on Redis and
//! PostgreSQL, where a second release changes nothing.
//!
//! Every change of state and every local decision is a [`StorageEvent`] for
//! the listeners.

mod breaker;
mod decide;
mod reserve;
mod settle;
mod slots;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use gcra_core::Decision;

use self::breaker::{Breaker, Timing, Transition};
use self::decide::Breakers;
pub use self::settle::PENDING_MAX;
use crate::bucket::BucketCheck;
use crate::clock::{Clock, MonotonicClock, SharedClock};
pub use crate::event::BreakerState;
use crate::event::{Listeners, StorageEvent, StorageListener, Subscription};
use crate::memory::MemoryStorage;
use crate::storage::{
    Adjustment, Answer, Capabilities, Decided, Mode, Storage, StorageError,
    StorageExt, micros, validate,
};

/// What [`Decided::by`] says of a decision made by the local store.
pub const LOCAL: &str = "fallback";

/// A primary store with a local fallback behind a circuit breaker.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use rate_tier_storage::{BreakerState, BucketCheck, FallbackStorage, LimitName, MemoryStorage, Storage, StorageExt};
/// use gcra_core::{Decision, Quota};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let primary = Arc::new(MemoryStorage::new()); // in production: RedisStorage
/// let store = FallbackStorage::builder(primary)
///     .failure_threshold(3)
///     .cool_down(Duration::from_secs(1), Duration::from_secs(30))
///     .build();
/// let free = LimitName::new("free")?;
/// let check = [BucketCheck::new(&free, "ana", Quota::per_minute(10), 1)?];
/// let mut out = [Decision::default()];
/// let decided = store.check(&check, &mut out).await?;
/// assert!(decided.verdict.allowed);
/// assert_eq!(decided.by, "memory"); // the primary decided
/// assert_eq!(store.state(), BreakerState::Closed);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FallbackStorage {
    inner: Arc<Inner>,
}

struct Inner {
    primary: Arc<dyn Storage>,
    local: MemoryStorage,
    clock: SharedClock,
    timing: Timing,
    local_share: u32,
    /// The breaker of a primary that is one failure domain.
    whole: Arc<Breaker>,
    /// The breakers of the parts of a primary that has several.
    domains: RwLock<HashMap<Arc<str>, Arc<Breaker>>>,
    listeners: Listeners<StorageEvent>,
    /// Settlements of the primary's waiting for it to answer again.
    pending: Mutex<VecDeque<settle::Pending>>,
    pending_len: AtomicUsize,
    replaying: AtomicBool,
    /// The slots of concurrency limits the local store took.
    local_slots: Mutex<slots::LocalSlots>,
    /// This, for the task that replays `pending`.
    this: Weak<Inner>,
    /// The primary's and the local store's own events (an eviction during
    /// an outage), passed on to our listeners.
    _forwarding: [Subscription; 2],
}

impl fmt::Debug for FallbackStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackStorage")
            .field("primary", &self.inner.primary)
            .field("state", &self.state())
            .field("failure_threshold", &self.inner.timing.failure_threshold)
            .field("local_share", &self.inner.local_share)
            .finish_non_exhaustive()
    }
}

/// Configures a [`FallbackStorage`].
#[must_use]
pub struct FallbackStorageBuilder {
    primary: Arc<dyn Storage>,
    clock: SharedClock,
    failure_threshold: u32,
    cool_down: Duration,
    max_cool_down: Duration,
    local_share: u32,
    local_capacity: Option<usize>,
}

impl fmt::Debug for FallbackStorageBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackStorageBuilder")
            .field("primary", &self.primary)
            .field("failure_threshold", &self.failure_threshold)
            .field("cool_down", &self.cool_down)
            .field("max_cool_down", &self.max_cool_down)
            .field("local_share", &self.local_share)
            .finish_non_exhaustive()
    }
}

impl FallbackStorageBuilder {
    /// Consecutive failures that open the breaker (default 3, minimum 1).
    pub fn failure_threshold(mut self, failures: u32) -> Self {
        self.failure_threshold = failures.max(1);
        self
    }

    /// How long the breaker stays open before a probe (default 1 s), and the
    /// most it grows to after failed probes, doubling each time (default 30 s).
    pub fn cool_down(mut self, first: Duration, max: Duration) -> Self {
        self.cool_down = first;
        self.max_cool_down = max.max(first);
        self
    }

    /// Divides each quota among `instances` for local decisions (default 1:
    /// the full quota per instance). See the [module docs](self#during-an-outage).
    pub fn local_share(mut self, instances: u32) -> Self {
        self.local_share = instances.max(1);
        self
    }

    /// The clock of the breaker and of the local store (default: the
    /// monotonic clock).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Bounds the local store (see [`MemoryStorage`]).
    pub fn local_capacity(mut self, capacity: usize) -> Self {
        self.local_capacity = Some(capacity);
        self
    }

    /// Builds the store, every breaker closed.
    pub fn build(self) -> FallbackStorage {
        let mut local =
            MemoryStorage::builder().shared_clock(self.clock.clone());
        if let Some(capacity) = self.local_capacity {
            local = local.capacity(capacity);
        }
        let local = local.build();
        let inner = Arc::new_cyclic(|weak: &std::sync::Weak<Inner>| {
            let forward = |weak: std::sync::Weak<Inner>| -> StorageListener {
                Arc::new(move |event| {
                    if let Some(inner) = weak.upgrade() {
                        inner.listeners.emit_with(|| event.clone());
                    }
                })
            };
            let forwarding = [
                self.primary.subscribe(forward(weak.clone())),
                local.subscribe(forward(weak.clone())),
            ];
            Inner {
                primary: self.primary,
                local,
                clock: self.clock,
                timing: Timing {
                    failure_threshold: self.failure_threshold,
                    cool_down_us: micros(self.cool_down),
                    max_cool_down_us: micros(self.max_cool_down),
                },
                local_share: self.local_share,
                whole: Arc::default(),
                domains: RwLock::default(),
                listeners: Listeners::default(),
                pending: Mutex::default(),
                pending_len: AtomicUsize::new(0),
                replaying: AtomicBool::new(false),
                local_slots: Mutex::default(),
                this: weak.clone(),
                _forwarding: forwarding,
            }
        });
        FallbackStorage { inner }
    }
}

impl FallbackStorage {
    /// Configures a fallback around `primary`.
    pub fn builder(primary: Arc<dyn Storage>) -> FallbackStorageBuilder {
        FallbackStorageBuilder {
            primary,
            clock: Arc::new(MonotonicClock),
            failure_threshold: 3,
            cool_down: Duration::from_secs(1),
            max_cool_down: Duration::from_secs(30),
            local_share: 1,
            local_capacity: None,
        }
    }

    /// The breakers' state now: open if any is open, half-open if any is
    /// probing, closed when all are.
    pub fn state(&self) -> BreakerState {
        let mut state = self.inner.whole.state();
        for (_, breaker_state) in self.domain_states() {
            state = match (state, breaker_state) {
                (BreakerState::Open, _) | (_, BreakerState::Open) => {
                    BreakerState::Open
                }
                (BreakerState::HalfOpen, _) | (_, BreakerState::HalfOpen) => {
                    BreakerState::HalfOpen
                }
                _ => BreakerState::Closed,
            };
        }
        state
    }

    /// The state of each failure domain's breaker (the nodes of a Redis
    /// Cluster), in no particular order.
    pub fn domain_states(&self) -> Vec<(Arc<str>, BreakerState)> {
        self.inner
            .domains
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(domain, breaker)| (domain.clone(), breaker.state()))
            .collect()
    }

    /// The local store (for inspection in tests and metrics).
    pub fn local(&self) -> &MemoryStorage {
        &self.inner.local
    }

    /// How many settlements of the primary's wait for it to answer again
    /// (at most [`PENDING_MAX`]).
    pub fn pending_settlements(&self) -> usize {
        self.inner.pending()
    }

    /// How many slots of concurrency limits the local store holds for
    /// requests it let through while the primary was down (see the
    /// [module docs](self#concurrency-limits)).
    pub fn local_slots(&self) -> usize {
        self.inner.local_slots()
    }
}

impl Inner {
    fn domain_breaker(&self, domain: &Arc<str>) -> Arc<Breaker> {
        let found = self
            .domains
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(domain)
            .cloned();
        found.unwrap_or_else(|| {
            self.domains
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(domain.clone())
                .or_default()
                .clone()
        })
    }

    fn report(
        &self,
        domain: &Option<Arc<str>>,
        transition: Transition,
        cause: Option<&StorageError>,
    ) {
        self.listeners.emit_with(|| StorageEvent::Breaker {
            domain: domain.clone(),
            from: transition.from,
            to: transition.to,
            cause: cause.map(ToString::to_string),
        });
    }
}

struct ProbeGuard<'a> {
    inner: &'a Inner,
    breakers: &'a Breakers,
    probes: &'a [(usize, u8)],
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        let now = self.inner.clock.now_us();
        let cancelled = StorageError::Protocol("probe cancelled".to_owned());
        for &(i, doublings) in self.probes {
            let (domain, breaker) = &self.breakers[i];
            let transition = breaker.reopen(&self.inner.timing, now, doublings);
            self.inner.report(domain, transition, Some(&cancelled));
        }
    }
}

/// Decides locally, without I/O, while every breaker of a decision is open
/// and not yet due for a probe (a memory-speed answer), else on the
/// primary; see the [module docs](self) for settlements, slots and
/// reservations.
impl Storage for FallbackStorage {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        let inner = &*self.inner;
        match mode {
            Mode::Check => {
                let now = inner.clock.now_us();
                let local = inner
                    .routing(checks)
                    .breakers
                    .iter()
                    .all(|(_, breaker)| breaker.is_local(now));
                if local {
                    Answer::Ready(
                        validate(checks, out)
                            .and_then(|()| inner.decide_locally(checks, out)),
                    )
                } else {
                    Answer::pending(async move {
                        validate(checks, out)?;
                        inner.decide(checks, out).await
                    })
                }
            }
            // On the primary while every breaker of the reservation is
            // closed (or due for a probe), else locally, whole, under the
            // local share: a reservation is one instant for every limit,
            // never split between two clocks.
            Mode::Reserve { max_wait } => {
                if !inner.primary.capabilities().reserves {
                    return Answer::Ready(Err(StorageError::Unsupported(
                        "reservations",
                    )));
                }
                if inner.reserves_here(checks) {
                    Answer::Ready(validate(checks, out).and_then(|()| {
                        inner.reserve_locally(checks, max_wait, out)
                    }))
                } else {
                    Answer::pending(async move {
                        validate(checks, out)?;
                        inner.reserve(checks, max_wait, out).await
                    })
                }
            }
        }
    }

    /// Each settlement, slot and reservation goes back to the store that
    /// took it: locally, on the primary, or, for a settlement while the
    /// primary's breaker is open, once it answers again (see the
    /// [module docs](self#settlements)). The local store's slots do not
    /// expire: only the primary's are renewed.
    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        let inner = &*self.inner;
        match adjustment {
            Adjustment::Settle(settles) => match inner.settle_now(settles) {
                Some(settled) => Answer::Ready(settled),
                None => Answer::pending(inner.settle(settles)),
            },
            Adjustment::Release(slots) => match inner.not_here(slots).len() {
                0 => Answer::Ready(inner.release_here(slots).map(drop)),
                n if n == slots.len() => inner.primary.release(slots),
                _ => Answer::pending(async move {
                    let primary = inner.release_here(slots)?;
                    inner.primary.release(&primary).await
                }),
            },
            Adjustment::Renew(slots) => {
                let primary = inner.not_here(slots);
                if primary.is_empty() {
                    return Answer::Ready(Ok(()));
                }
                Answer::pending(
                    async move { inner.primary.renew(&primary).await },
                )
            }
            Adjustment::Cancel(reserved) => {
                let local = reserved.iter().all(|cancel| {
                    matches!(cancel.charged, crate::Charged::Local { .. })
                });
                if local {
                    return Answer::Ready(
                        inner.cancel_here(reserved).map(drop),
                    );
                }
                Answer::pending(async move {
                    let primary = inner.cancel_here(reserved)?;
                    if primary.is_empty() {
                        return Ok(());
                    }
                    inner.primary.cancel(&primary).await
                })
            }
        }
    }

    /// Both stores: the local one (what this instance decided during an
    /// outage), then the primary; a primary that cannot be reached is the
    /// error (the shared buckets were not reset), the local part done.
    fn reset<'a>(&'a self, buckets: &'a [BucketCheck<'a>]) -> Answer<'a, ()> {
        let inner = &*self.inner;
        Answer::pending(async move {
            let share = inner.local_share;
            let local: smallvec::SmallVec<[BucketCheck<'_>; 4]> = buckets
                .iter()
                .map(|bucket| bucket.with_rule(bucket.rule().divided(share)))
                .collect();
            inner.local.reset(&local).await?;
            inner.primary.reset(buckets).await
        })
    }

    /// The primary's: the local store decides every kind, spans every
    /// partition and reserves, and a decision the primary cannot take must
    /// not depend on an outage.
    ///
    /// ```
    /// # #[cfg(not(feature = "redis"))] fn main() {}
    /// # #[cfg(feature = "redis")]
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use rate_tier_storage::{FallbackStorage, MemoryStorage, RedisStorage, Storage, StorageExt};
    /// // A cluster store connects on its first call: none here.
    /// let cluster = RedisStorage::from_cluster_urls(["redis://127.0.0.1:7000/"])?;
    /// let fallback = FallbackStorage::builder(Arc::new(cluster)).build();
    /// assert!(!fallback.capabilities().spans_partitions);
    /// let fallback = FallbackStorage::builder(Arc::new(MemoryStorage::new())).build();
    /// assert!(fallback.capabilities().spans_partitions);
    /// # Ok(()) }
    /// ```
    fn capabilities(&self) -> Capabilities {
        let mut capabilities = self.inner.primary.capabilities();
        // While a breaker is open, the local store answers at once.
        capabilities.answers_ready = true;
        capabilities
    }

    fn subscribe(&self, listener: StorageListener) -> Subscription {
        self.inner.listeners.subscribe(listener)
    }
}
