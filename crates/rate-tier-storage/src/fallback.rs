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
//! During an outage each instance limits on its own, so K instances allow up
//! to K times the quota. [`FallbackStorageBuilder::local_share`] divides
//! the local quota by K to prevent that, at a price: a request whose cost is
//! above the reduced burst is refused (403) until the primary is back.
//!
//! Every change of state and every local decision is a [`StorageEvent`] for
//! the listeners (tower-rate-tier forwards them to `on_event`).

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use gcra_core::{Decision, Quota};

use crate::clock::{Clock, MonotonicClock, SharedClock};
use crate::{BucketCheck, LocalDecision, MemoryStorage, Storage, StorageError};

/// The state of a circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BreakerState {
    /// The primary decides.
    Closed,
    /// The local store decides; the primary is not called.
    Open,
    /// One probe is on its way to the primary; the others decide locally.
    HalfOpen,
}

/// Something the fallback did, for alerting and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StorageEvent {
    /// The breaker changed state.
    Breaker {
        /// The state before.
        from: BreakerState,
        /// The state now.
        to: BreakerState,
        /// The failure that caused it, if any.
        cause: Option<String>,
    },
    /// A check was decided by the local store.
    Fallback {
        /// The tier of the bucket.
        tier: String,
        /// Whether it was allowed.
        allowed: bool,
        /// The breaker's state at the time.
        state: BreakerState,
    },
}

/// Receives [`StorageEvent`]s; must be quick (it runs on the request path).
pub type StorageListener = Arc<dyn Fn(&StorageEvent) + Send + Sync>;

const CLOSED: u8 = 0;
const OPEN: u8 = 1;
const HALF_OPEN: u8 = 2;

fn state_of(raw: u8) -> BreakerState {
    match raw {
        OPEN => BreakerState::Open,
        HALF_OPEN => BreakerState::HalfOpen,
        _ => BreakerState::Closed,
    }
}

/// A primary store with a local fallback behind a circuit breaker.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use rate_tier_storage::{BucketCheck, FallbackStorage, MemoryStorage, Storage};
/// use rate_tier_storage::fallback::BreakerState;
/// use gcra_core::Quota;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let primary = Arc::new(MemoryStorage::new()); // in production: RedisStorage
/// let store = FallbackStorage::builder(primary)
///     .failure_threshold(3)
///     .cool_down(Duration::from_secs(1), Duration::from_secs(30))
///     .build();
/// let check = BucketCheck::new("free", "ana", Quota::per_minute(10), 1);
/// assert!(store.check(&check).await.unwrap().allowed);
/// assert_eq!(store.state(), BreakerState::Closed);
/// # }
/// ```
#[derive(Clone)]
pub struct FallbackStorage {
    inner: Arc<Inner>,
}

struct Inner {
    primary: Arc<dyn Storage>,
    local: MemoryStorage,
    clock: SharedClock,
    failure_threshold: u32,
    cool_down_us: u64,
    max_cool_down_us: u64,
    local_share: u32,
    /// State, back-off step and deadline in one word, so that every
    /// transition is a single compare-and-swap (see [`Breaker`]).
    breaker: AtomicU64,
    failures: AtomicU32,
    listeners: RwLock<Vec<StorageListener>>,
}

impl fmt::Debug for FallbackStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackStorage")
            .field("primary", &self.inner.primary)
            .field("state", &self.state())
            .field("failure_threshold", &self.inner.failure_threshold)
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

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
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

    /// Divides each quota by `instances` for local decisions (default 1: the
    /// full quota per instance). See the [module docs](self).
    pub fn local_share(mut self, instances: u32) -> Self {
        self.local_share = instances.max(1);
        self
    }

    /// The clock of the breaker and of the local store (default: system).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Bounds the local store (see [`MemoryStorage`]).
    pub fn local_capacity(mut self, capacity: usize) -> Self {
        self.local_capacity = Some(capacity);
        self
    }

    /// Builds the store, breaker closed.
    pub fn build(self) -> FallbackStorage {
        let mut local =
            MemoryStorage::builder().shared_clock(self.clock.clone());
        if let Some(capacity) = self.local_capacity {
            local = local.capacity(capacity);
        }
        let cool_down_us = micros(self.cool_down);
        FallbackStorage {
            inner: Arc::new(Inner {
                primary: self.primary,
                local: local.build(),
                clock: self.clock,
                failure_threshold: self.failure_threshold,
                cool_down_us,
                max_cool_down_us: micros(self.max_cool_down),
                local_share: self.local_share,
                breaker: AtomicU64::new(Breaker::CLOSED.pack()),
                failures: AtomicU32::new(0),
                listeners: RwLock::new(Vec::new()),
            }),
        }
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

    /// The breaker's state now.
    pub fn state(&self) -> BreakerState {
        state_of(self.inner.breaker().state)
    }

    /// The local store (for inspection in tests and metrics).
    pub fn local(&self) -> &MemoryStorage {
        &self.inner.local
    }
}

/// Whether a primary error means "the primary is unhealthy".
fn is_failure(error: &StorageError) -> bool {
    !matches!(error, StorageError::Check(_))
}

/// The breaker's whole state, packed in one `u64`: the state (2 bits), how
/// many times the cool-down doubled (6 bits), and when the open breaker is
/// due for a probe (56 bits of µs, beyond any GCRA time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Breaker {
    state: u8,
    doublings: u8,
    due_us: u64,
}

const DUE_BITS: u32 = 56;
const DUE_MASK: u64 = (1 << DUE_BITS) - 1;

impl Breaker {
    const CLOSED: Breaker = Breaker {
        state: CLOSED,
        doublings: 0,
        due_us: 0,
    };

    const fn pack(self) -> u64 {
        ((self.state as u64) << 62)
            | (((self.doublings & 0x3f) as u64) << DUE_BITS)
            | (self.due_us & DUE_MASK)
    }

    const fn unpack(word: u64) -> Breaker {
        Breaker {
            state: (word >> 62) as u8,
            doublings: ((word >> DUE_BITS) & 0x3f) as u8,
            due_us: word & DUE_MASK,
        }
    }
}

impl Inner {
    fn breaker(&self) -> Breaker {
        Breaker::unpack(self.breaker.load(Ordering::Acquire))
    }

    fn emit(&self, event: StorageEvent) {
        self.emit_with(|| event);
    }

    /// Builds the event only if someone listens: local decisions are on the
    /// hot path while the breaker is open.
    fn emit_with(&self, event: impl FnOnce() -> StorageEvent) {
        let listeners = self
            .listeners
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if listeners.is_empty() {
            return;
        }
        let event = event();
        for listener in listeners.iter() {
            listener(&event);
        }
    }

    fn transition(&self, from: u8, to: u8, cause: Option<String>) {
        self.emit(StorageEvent::Breaker {
            from: state_of(from),
            to: state_of(to),
            cause,
        });
    }

    fn decide_locally(
        &self,
        check: &BucketCheck<'_>,
    ) -> Result<Decision, StorageError> {
        self.decide_locally_at(check).map(|local| local.decision)
    }

    fn decide_locally_at(
        &self,
        check: &BucketCheck<'_>,
    ) -> Result<LocalDecision, StorageError> {
        let quota = local_quota(check.quota, self.local_share);
        let local = BucketCheck { quota, ..*check };
        let decided = self.local.check_local(&local).unwrap_or_else(|| {
            // MemoryStorage always decides locally.
            Err(StorageError::Protocol("local store needs I/O".into()))
        })?;
        self.emit_with(|| StorageEvent::Fallback {
            tier: check.tier.to_owned(),
            allowed: decided.decision.allowed,
            state: state_of(self.breaker().state),
        });
        Ok(decided)
    }

    /// The cool-down after `doublings` failed probes: doubled each time,
    /// capped.
    fn cool_down_us(&self, doublings: u8) -> u64 {
        self.cool_down_us
            .checked_shl(u32::from(doublings))
            .filter(|cool| *cool >= self.cool_down_us)
            .unwrap_or(u64::MAX)
            .min(self.max_cool_down_us)
    }

    /// An open breaker with this many doublings, due after its cool-down.
    fn opened(&self, doublings: u8) -> Breaker {
        let due_us = self
            .clock
            .now_us()
            .saturating_add(self.cool_down_us(doublings))
            .min(DUE_MASK);
        Breaker {
            state: OPEN,
            doublings,
            due_us,
        }
    }

    async fn check_closed(
        &self,
        check: &BucketCheck<'_>,
    ) -> Result<Decision, StorageError> {
        match self.primary.check(check).await {
            Ok(decision) => {
                if self.failures.load(Ordering::Relaxed) != 0 {
                    self.failures.store(0, Ordering::Relaxed);
                }
                Ok(decision)
            }
            Err(error) if is_failure(&error) => {
                let failures = self
                    .failures
                    .fetch_add(1, Ordering::AcqRel)
                    .saturating_add(1);
                if failures >= self.failure_threshold {
                    // State and deadline change together: no check can
                    // see it open with a stale deadline.
                    let closed = Breaker::CLOSED.pack();
                    let open = self.opened(0).pack();
                    if self
                        .breaker
                        .compare_exchange(
                            closed,
                            open,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                    {
                        self.transition(CLOSED, OPEN, Some(error.to_string()));
                    }
                }
                self.decide_locally(check)
            }
            Err(error) => Err(error),
        }
    }

    /// Runs the one probe; the caller won the OPEN -> HALF_OPEN swap, so no
    /// one else changes the breaker until this ends.
    async fn probe(
        &self,
        check: &BucketCheck<'_>,
        doublings: u8,
    ) -> Result<Decision, StorageError> {
        self.transition(OPEN, HALF_OPEN, None);
        // Dropped mid-probe (the caller gave up): count it as a failed
        // probe, rather than stay half-open with no probe in flight.
        let guard = ProbeGuard {
            inner: self,
            doublings,
        };
        let result = self.primary.check(check).await;
        std::mem::forget(guard);
        match result {
            Ok(decision) => {
                self.close();
                Ok(decision)
            }
            Err(error) if is_failure(&error) => {
                self.reopen(doublings, error.to_string());
                self.decide_locally(check)
            }
            Err(error) => {
                // Not the primary's fault: it answered. Close.
                self.close();
                Err(error)
            }
        }
    }

    fn close(&self) {
        self.failures.store(0, Ordering::Relaxed);
        self.breaker
            .store(Breaker::CLOSED.pack(), Ordering::Release);
        self.transition(HALF_OPEN, CLOSED, None);
    }

    /// A failed probe: open again, for twice as long (up to the cap).
    fn reopen(&self, doublings: u8, cause: String) {
        let doublings = doublings.saturating_add(1).min(0x3f);
        self.breaker
            .store(self.opened(doublings).pack(), Ordering::Release);
        self.transition(HALF_OPEN, OPEN, Some(cause));
    }
}

struct ProbeGuard<'a> {
    inner: &'a Inner,
    doublings: u8,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        self.inner
            .reopen(self.doublings, "probe cancelled".to_owned());
    }
}

/// `quota` divided among `share` instances: limit and burst divided
/// (at least 1), same period.
fn local_quota(quota: Quota, share: u32) -> Quota {
    if share <= 1 {
        return quota;
    }
    let limit = (quota.limit() / share).max(1);
    let burst = (quota.burst() / share).max(1);
    Quota::new(limit, quota.period())
        .and_then(|q| q.try_allow_burst(burst))
        .unwrap_or(quota)
}

#[async_trait::async_trait]
impl Storage for FallbackStorage {
    async fn check(
        &self,
        check: &BucketCheck<'_>,
    ) -> Result<Decision, StorageError> {
        let inner = &*self.inner;
        let word = inner.breaker.load(Ordering::Acquire);
        let breaker = Breaker::unpack(word);
        match breaker.state {
            CLOSED => inner.check_closed(check).await,
            OPEN if inner.clock.now_us() >= breaker.due_us => {
                let probing = Breaker {
                    state: HALF_OPEN,
                    ..breaker
                };
                let won = inner
                    .breaker
                    .compare_exchange(
                        word,
                        probing.pack(),
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok();
                if won {
                    inner.probe(check, breaker.doublings).await
                } else {
                    inner.decide_locally(check)
                }
            }
            _ => inner.decide_locally(check),
        }
    }

    fn check_local(
        &self,
        check: &BucketCheck<'_>,
    ) -> Option<Result<LocalDecision, StorageError>> {
        // Open and not yet due for a probe: a memory-speed decision.
        let inner = &*self.inner;
        let breaker = inner.breaker();
        match breaker.state {
            OPEN if inner.clock.now_us() < breaker.due_us => {
                Some(inner.decide_locally_at(check))
            }
            HALF_OPEN => Some(inner.decide_locally_at(check)),
            _ => None,
        }
    }

    fn kind(&self) -> &'static str {
        self.inner.primary.kind()
    }

    fn add_listener(&self, listener: StorageListener) {
        self.inner
            .listeners
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(listener);
    }
}
