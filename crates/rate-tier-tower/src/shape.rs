//! Waiting instead of refusing, for outgoing calls: [`ShapeLayer`] wraps a
//! client (any [`Service`]: a hyper client, reqwest through its tower
//! adapter, a tonic channel) so that every call waits for its slot in a
//! quota shared through the store, then goes out. A leaky bucket: calls
//! leave at the quota's rate however they arrive.
//!
//! Each call reserves its slot ([`StorageExt::reserve`]) in every quota of the
//! shaper at once, waits until it, and goes. Every instance that shapes
//! through the same store and account shares the quota, so together they
//! never exceed it. A call whose wait would be longer than the shaper's
//! maximum fails at once with [`ShapeError::WaitTooLong`], which says how
//! long it would have waited, and takes nothing. A call dropped while it
//! waits gives its slot back ([`StorageExt::cancel`]): exactly, when no later
//! call reserved after it; else the slot is lost, never handed out twice.
//!
//! Slots are exact on the store's clock. A call leaves at its slot plus
//! the delay of the fastest answer this shaper has seen from the store, not
//! plus its own (answers queued behind others would bunch the calls they
//! carry); the network and the scheduler still move each call by a few
//! milliseconds, a margin to leave under a provider's strict limit.
//!
//! Strictly even spacing is a burst of 1 (`Quota::per_second(20)
//! .allow_burst(1)`: one call every 50 ms, none closer); a larger burst
//! lets that many go at once after a quiet spell.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tower::{Service, ServiceExt, service_fn};
//! use tower_rate_tier::{MemoryStorage, Quota, shape::ShapeLayer};
//!
//! // The provider allows 100 calls a second, evenly, for the whole account.
//! let layer = ShapeLayer::builder(Arc::new(MemoryStorage::new()), "provider")
//!     .quota("per-second", Quota::per_second(100).allow_burst(1))?
//!     .max_wait(Duration::from_secs(5))
//!     .build()?;
//! let upstream = service_fn(|call: &'static str| async move { Ok::<_, std::io::Error>(call.len()) });
//! let mut client = tower::ServiceBuilder::new().layer(layer).service(upstream);
//! assert_eq!(client.ready().await?.call("charge").await?, 6);
//! # Ok(())
//! # }
//! ```

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use gcra_core::{Decision, Quota, saturating_micros};
use rate_tier_storage::StorageExt;
use rate_tier_storage::{
    BucketCancel, BucketCheck, Charged, Decided, LimitName, Storage,
    StorageError,
};
use smallvec::SmallVec;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::error::ConfigError;
use crate::limiter::leftover::Leftover;
use crate::observe::Observer;

/// The cost of a call in a shaper's quotas: [`EachCall`] (1), or a
/// function of the request.
///
/// ```
/// use tower_rate_tier::shape::CallCost;
/// let by_batch = |batch: &Vec<u32>| batch.len() as u32;
/// assert_eq!(by_batch.cost(&vec![1, 2, 3]), 3);
/// ```
pub trait CallCost<Req> {
    /// The units this call takes (0: it waits for nothing and takes
    /// nothing).
    fn cost(&self, request: &Req) -> u32;
}

impl<Req, F: Fn(&Req) -> u32> CallCost<Req> for F {
    fn cost(&self, request: &Req) -> u32 {
        self(request)
    }
}

/// Every call costs 1.
///
/// ```
/// use tower_rate_tier::shape::{CallCost, EachCall};
/// assert_eq!(EachCall.cost(&"any request"), 1);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct EachCall;

impl<Req> CallCost<Req> for EachCall {
    fn cost(&self, _request: &Req) -> u32 {
        1
    }
}

/// What a shaper did with a call, for an [`Observer`] (metrics, logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShapeEvent {
    /// The call got its slot and waited `wait` (zero: it went at once).
    Reserved {
        /// How long it waits before it goes.
        wait: Duration,
    },
    /// The call would have waited `wait`, longer than allowed: failed at
    /// once, nothing taken.
    WaitTooLong {
        /// The wait it would have needed.
        wait: Duration,
    },
    /// The call was dropped while it waited: its slot was given back.
    GaveBack,
}

/// A closure as an [`Observer`] of a shaper's events
/// ([`ShapeLayerBuilder::on_event`]).
struct OnShapeEvent<F>(F);

impl<F: Fn(&ShapeEvent) + Send + Sync + 'static> Observer for OnShapeEvent<F> {
    fn shaped(&self, event: &ShapeEvent) {
        (self.0)(event)
    }
}

/// Why a shaped call did not go out, or the upstream's own error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShapeError<E> {
    /// The call would have waited `wait` for its slot, longer than the
    /// shaper allows (or than its quotas can hold): nothing was taken.
    /// Retrying after `wait` less the maximum would find a slot.
    #[error(
        "the call would wait {wait:?} for its slot in {quota:?}, longer than allowed"
    )]
    WaitTooLong {
        /// The wait the call would have needed.
        wait: Duration,
        /// The quota that set it.
        quota: String,
    },
    /// The store could not reserve (unreachable, timed out, or the cost is
    /// above a quota's burst: [`StorageError::Check`]). Nothing was sent.
    #[error("the shaper's store failed: {0}")]
    Store(#[source] StorageError),
    /// The upstream service's error.
    #[error(transparent)]
    Upstream(E),
}

/// The shaper every clone of a layer and its services shares.
struct Shaper {
    store: Arc<dyn Storage>,
    account: String,
    quotas: Vec<(LimitName, Quota)>,
    max_wait: Duration,
    observer: Option<Arc<dyn Observer>>,
    /// Where this shaper's clock readings count from.
    origin: Instant,
    /// The least (our clock at an answer) - (the store's clock when it
    /// decided) seen, in µs: the offset of the two clocks plus the fastest
    /// answer's delay. See [`Shaper::late_by`].
    fastest: AtomicI64,
}

impl fmt::Debug for Shaper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shaper")
            .field("store", &self.store.kind())
            .field("quotas", &self.quotas)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

impl Shaper {
    fn emit(&self, event: ShapeEvent) {
        if let Some(observer) = &self.observer {
            observer.shaped(&event);
        }
    }

    /// How much later than the fastest answer this one came, on the
    /// store's clock: a call goes at its slot plus the fastest answer's
    /// delay, not plus its own (answers queued behind others would bunch
    /// the calls they carry). Zero when the store does not give its clock.
    /// At most the call's round trip: a larger gap is the store's clock
    /// moving (a failover), and the reckoning starts again from here.
    fn late_by(
        &self,
        decided: &Decided,
        sent: Instant,
        received: Instant,
    ) -> Duration {
        let Some(store_us) = decided.store_clock_us else {
            return Duration::ZERO;
        };
        let ours = received.duration_since(self.origin).as_micros();
        let seen =
            i128::try_from(ours).unwrap_or(i128::MAX) - i128::from(store_us);
        let seen = i64::try_from(seen).unwrap_or(if seen < 0 {
            i64::MIN
        } else {
            i64::MAX
        });
        let fastest = self.fastest.fetch_min(seen, Ordering::AcqRel);
        if seen <= fastest {
            return Duration::ZERO;
        }
        let late = Duration::from_micros(seen.abs_diff(fastest));
        if late > received.duration_since(sent) {
            self.fastest.store(seen, Ordering::Release);
            return Duration::ZERO;
        }
        late
    }

    fn checks(
        &self,
        cost: u32,
    ) -> Result<SmallVec<[BucketCheck<'_>; 2]>, StorageError> {
        self.quotas
            .iter()
            .map(|(name, quota)| {
                BucketCheck::new(name, &self.account, *quota, cost)
                    .map_err(StorageError::Check)
            })
            .collect()
    }

    /// Reserves a slot for a call of `cost`: how long to wait for it, and
    /// what to give back if the call goes away first.
    async fn reserve<E>(
        self: &Arc<Self>,
        cost: u32,
    ) -> Result<Slot, ShapeError<E>> {
        if cost == 0 {
            return Ok(Slot::free(self.clone()));
        }
        let checks = self.checks(cost).map_err(ShapeError::Store)?;
        let mut out: SmallVec<[Decision; 2]> =
            SmallVec::from_elem(Decision::default(), checks.len());
        let sent = Instant::now();
        let decided = self
            .store
            .reserve(&checks, self.max_wait, &mut out)
            .await
            .map_err(ShapeError::Store)?;
        let received = Instant::now();
        let wait = Duration::from_micros(decided.wait_us);
        if !decided.verdict.allowed {
            self.emit(ShapeEvent::WaitTooLong { wait });
            let quota = decided
                .verdict
                .refused_by
                .and_then(|i| self.quotas.get(i))
                .map_or_else(String::new, |(name, _)| name.as_str().to_owned());
            return Err(ShapeError::WaitTooLong { wait, quota });
        }
        self.emit(ShapeEvent::Reserved { wait });
        let written = out
            .iter()
            .enumerate()
            // Every quota charged the call (none is shadow): each
            // allowed decision wrote its slot.
            .filter(|(_, decision)| decision.allowed)
            .filter_map(|(i, decision)| {
                decision.store.map(|s| (i, s.tat_us, decided.charged(i)))
            })
            .collect();
        let late = self.late_by(&decided, sent, received);
        Ok(Slot {
            shaper: self.clone(),
            cost,
            at: (received + wait).checked_sub(late).unwrap_or(received),
            written,
        })
    }
}

/// A reserved slot: given back when dropped before the call goes.
struct Slot {
    shaper: Arc<Shaper>,
    cost: u32,
    /// When the call goes.
    at: Instant,
    /// Each quota's index, the TAT the reservation wrote, and where.
    written: SmallVec<[(usize, u64, Charged); 2]>,
}

impl Slot {
    fn free(shaper: Arc<Shaper>) -> Slot {
        Slot {
            shaper,
            cost: 0,
            at: Instant::now(),
            written: SmallVec::new(),
        }
    }

    /// Waits for the slot; the call then goes, and keeps it.
    async fn wait(mut self) {
        if self.at > Instant::now() {
            tokio::time::sleep_until(self.at).await;
        }
        self.written.clear();
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.written.is_empty() {
            return;
        }
        let written = std::mem::take(&mut self.written);
        self.shaper.emit(ShapeEvent::GaveBack);
        let cancels = self.shaper.cancels(self.cost, &written);
        // A failed give-back loses the slot: never handed out twice.
        Leftover::cancel(&self.shaper.store, &cancels).in_background(drop);
    }
}

impl Shaper {
    /// The give-backs of a slot's `written` TATs.
    fn cancels(
        &self,
        cost: u32,
        written: &[(usize, u64, Charged)],
    ) -> SmallVec<[BucketCancel<'_>; 2]> {
        written
            .iter()
            .filter_map(|&(i, tat, charged)| {
                let (name, quota) = self.quotas.get(i)?;
                let check =
                    BucketCheck::new(name, &self.account, *quota, cost).ok()?;
                Some(check.cancel(tat).charged(charged))
            })
            .collect()
    }
}

/// Builds a [`ShapeLayer`]: the store, the account the quotas belong to,
/// the quotas, the longest wait, the cost of a call.
#[must_use]
pub struct ShapeLayerBuilder<C = EachCall> {
    store: Arc<dyn Storage>,
    account: String,
    quotas: Vec<(LimitName, Quota)>,
    max_wait: Duration,
    cost: C,
    observer: Option<Arc<dyn Observer>>,
}

impl<C> fmt::Debug for ShapeLayerBuilder<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShapeLayerBuilder")
            .field("quotas", &self.quotas)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

/// The longest a call waits by default: 30 s.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(tower_rate_tier::shape::DEFAULT_MAX_WAIT, Duration::from_secs(30));
/// ```
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(30);

impl<C> ShapeLayerBuilder<C> {
    /// Adds a quota every call waits for (the provider's per second, per
    /// day, ...), named apart from the tiers and limits of a
    /// [`RateTier`](crate::RateTier) on the same store.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower_rate_tier::{MemoryStorage, Quota, shape::ShapeLayer};
    /// let layer = ShapeLayer::builder(Arc::new(MemoryStorage::new()), "llm")
    ///     .quota("per-second", Quota::per_second(50).allow_burst(1))?
    ///     .quota("per-day", Quota::per_day(100_000))?
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), tower_rate_tier::ConfigError>(())
    /// ```
    pub fn quota(
        mut self,
        name: impl Into<Cow<'static, str>>,
        quota: Quota,
    ) -> Result<Self, ConfigError> {
        let name = LimitName::of_shaper(name)?;
        if self.quotas.iter().any(|(n, _)| *n == name) {
            return Err(ConfigError::DuplicateLimit(name.as_str().to_owned()));
        }
        self.quotas.push((name, quota));
        Ok(self)
    }

    /// The longest a call waits for its slot ([`DEFAULT_MAX_WAIT`] by
    /// default); a call that would wait longer fails at once with
    /// [`ShapeError::WaitTooLong`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tower::{Service, ServiceExt, service_fn};
    /// use tower_rate_tier::{MemoryStorage, Quota, shape::ShapeError, shape::ShapeLayer};
    ///
    /// // One call a second; a caller that waits at most 10 ms.
    /// let layer = ShapeLayer::builder(Arc::new(MemoryStorage::new()), "provider")
    ///     .quota("per-second", Quota::per_second(1).allow_burst(1))?
    ///     .max_wait(Duration::from_millis(10))
    ///     .build()?;
    /// let upstream = service_fn(|call: u32| async move { Ok::<_, std::io::Error>(call) });
    /// let mut client = tower::ServiceBuilder::new().layer(layer).service(upstream);
    /// assert_eq!(client.ready().await?.call(1).await?, 1);
    /// // The next slot is about a second away: refused at once, never sent.
    /// match client.ready().await?.call(2).await {
    ///     Err(ShapeError::WaitTooLong { wait, quota }) => {
    ///         assert!(wait > Duration::from_millis(900), "{wait:?}");
    ///         assert_eq!(quota, "per-second");
    ///     }
    ///     other => panic!("{other:?}"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The cost of each call, from its request ([`EachCall`]: 1, by
    /// default).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower_rate_tier::{MemoryStorage, Quota, shape::ShapeLayer};
    /// // A batch of n items is n calls of the provider's quota.
    /// let layer = ShapeLayer::builder(Arc::new(MemoryStorage::new()), "provider")
    ///     .quota("per-second", Quota::per_second(100))?
    ///     .cost(|batch: &Vec<String>| batch.len() as u32)
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), tower_rate_tier::ConfigError>(())
    /// ```
    pub fn cost<D>(self, cost: D) -> ShapeLayerBuilder<D> {
        ShapeLayerBuilder {
            store: self.store,
            account: self.account,
            quotas: self.quotas,
            max_wait: self.max_wait,
            cost,
            observer: self.observer,
        }
    }

    /// Tells `on_event` every call's [`ShapeEvent`]: the thin form of
    /// [`ShapeLayerBuilder::observe`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::{Arc, Mutex};
    /// use std::time::Duration;
    /// use tower::{Service, ServiceExt, service_fn};
    /// use tower_rate_tier::shape::ShapeEvent;
    /// use tower_rate_tier::{MemoryStorage, Quota, shape::ShapeLayer};
    ///
    /// let events = Arc::new(Mutex::new(Vec::new()));
    /// let sink = events.clone();
    /// let layer = ShapeLayer::builder(Arc::new(MemoryStorage::new()), "provider")
    ///     .quota("per-second", Quota::per_second(10))?
    ///     .on_event(move |event| sink.lock().unwrap().push(*event))
    ///     .build()?;
    /// let upstream = service_fn(|call: u32| async move { Ok::<_, std::io::Error>(call) });
    /// let mut client = tower::ServiceBuilder::new().layer(layer).service(upstream);
    /// client.ready().await?.call(1).await?;
    /// assert_eq!(
    ///     *events.lock().unwrap(),
    ///     [ShapeEvent::Reserved { wait: Duration::ZERO }]
    /// );
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_event(
        self,
        on_event: impl Fn(&ShapeEvent) + Send + Sync + 'static,
    ) -> Self {
        self.observe(OnShapeEvent(on_event))
    }

    /// Shows every call's [`ShapeEvent`] to `observer`
    /// ([`Observer::shaped`]), e.g.
    /// `metrics::ShapeMetrics` with the `metrics`
    /// feature.
    pub fn observe(mut self, observer: impl Observer) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// The layer. Fails without a quota
    /// ([`ConfigError::NoQuota`]), on a store that cannot reserve
    /// ([`ConfigError::CannotWait`]), and on a wait no quota can hold
    /// ([`ConfigError::WaitTooLong`]).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tower_rate_tier::{ConfigError, MemoryStorage, shape::ShapeLayer};
    /// let error = ShapeLayer::builder(Arc::new(MemoryStorage::new()), "provider")
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(error, ConfigError::NoQuota);
    /// ```
    pub fn build(self) -> Result<ShapeLayer<C>, ConfigError> {
        if self.quotas.is_empty() {
            return Err(ConfigError::NoQuota);
        }
        if !self.store.capabilities().reserves {
            return Err(ConfigError::CannotWait {
                store: self.store.kind(),
            });
        }
        // A quota holds a wait as debt: every process shaping through it
        // must read a slot reserved that far ahead as one, not as a clock
        // gone back, so the bound is the quota's, never raised here.
        let quotas = self.quotas;
        if quotas.iter().any(|(_, quota)| {
            quota.max_debt_us() < saturating_micros(self.max_wait)
        }) {
            return Err(ConfigError::WaitTooLong(self.max_wait));
        }
        Ok(ShapeLayer {
            shaper: Arc::new(Shaper {
                store: self.store,
                account: self.account,
                quotas,
                max_wait: self.max_wait,
                observer: self.observer,
                origin: Instant::now(),
                fastest: AtomicI64::new(i64::MAX),
            }),
            cost: self.cost,
        })
    }
}

/// Makes every call of the service it wraps wait for its slot in a quota
/// shared through a store: see the [module docs](self).
#[derive(Clone)]
pub struct ShapeLayer<C = EachCall> {
    shaper: Arc<Shaper>,
    cost: C,
}

impl<C> fmt::Debug for ShapeLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShapeLayer")
            .field("shaper", &self.shaper)
            .finish_non_exhaustive()
    }
}

impl ShapeLayer {
    /// A builder of a shaper over `store`, for the quotas of `account`
    /// (every instance that shapes the same account through the same store
    /// shares them).
    pub fn builder(
        store: Arc<dyn Storage>,
        account: impl Into<String>,
    ) -> ShapeLayerBuilder {
        ShapeLayerBuilder {
            store,
            account: account.into(),
            quotas: Vec::new(),
            max_wait: DEFAULT_MAX_WAIT,
            cost: EachCall,
            observer: None,
        }
    }
}

impl<S, C: Clone> Layer<S> for ShapeLayer<C> {
    type Service = Shape<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Shape {
            inner,
            shaper: self.shaper.clone(),
            cost: self.cost.clone(),
        }
    }
}

/// The service [`ShapeLayer`] makes: each call waits for its slot, then
/// goes to the inner service.
#[derive(Clone)]
pub struct Shape<S, C = EachCall> {
    inner: S,
    shaper: Arc<Shaper>,
    cost: C,
}

impl<S: fmt::Debug, C> fmt::Debug for Shape<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shape")
            .field("inner", &self.inner)
            .field("shaper", &self.shaper)
            .finish_non_exhaustive()
    }
}

/// The future of a shaped call.
pub type ShapeFuture<T, E> =
    Pin<Box<dyn Future<Output = Result<T, ShapeError<E>>> + Send + 'static>>;

impl<S, C, Req> Service<Req> for Shape<S, C>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    C: CallCost<Req>,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = ShapeError<S::Error>;
    type Future = ShapeFuture<S::Response, S::Error>;

    /// Always ready: a call waits for its slot first, then for the inner
    /// service's readiness (so a clone of it is called).
    fn poll_ready(
        &mut self,
        _cx: &mut Context<'_>,
    ) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let cost = self.cost.cost(&request);
        let shaper = self.shaper.clone();
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let slot = shaper.reserve(cost).await?;
            slot.wait().await;
            std::future::poll_fn(|cx| inner.poll_ready(cx))
                .await
                .map_err(ShapeError::Upstream)?;
            inner.call(request).await.map_err(ShapeError::Upstream)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use gcra_core::{Quota, Verdict};
    use rate_tier_storage::{Decided, MemoryStorage};

    use super::ShapeLayer;

    const MS: u64 = 1000;

    /// An answer decided at `store_ms` on the store's clock.
    fn decided_at(store_ms: u64) -> Decided {
        let verdict = Verdict {
            allowed: true,
            retry_after_us: 0,
            refused_by: None,
        };
        Decided::new(verdict, None, "test").with_store_clock(store_ms * MS)
    }

    #[test]
    fn a_call_goes_at_its_slot_plus_the_fastest_answers_delay_not_its_own() {
        let layer = ShapeLayer::builder(Arc::new(MemoryStorage::new()), "acct")
            .quota("per-second", Quota::per_second(10))
            .unwrap()
            .build()
            .unwrap();
        let shaper = &layer.shaper;
        let at = |ms: u64| shaper.origin + Duration::from_millis(ms);
        // The fastest answer: decided at 5 ms on the store's clock, here
        // at 10 ms (offset and delay together: 5 ms).
        assert_eq!(
            shaper.late_by(&decided_at(5), at(8), at(10)),
            Duration::ZERO
        );
        // One queued 4 ms more behind others: its call goes 4 ms earlier
        // than its own answer, as if it had come as fast.
        assert_eq!(
            shaper.late_by(&decided_at(20), at(19), at(29)),
            Duration::from_millis(4)
        );
        // A faster answer still: the new reference, nothing to take off.
        assert_eq!(
            shaper.late_by(&decided_at(40), at(43), at(44)),
            Duration::ZERO
        );
        assert_eq!(
            shaper.late_by(&decided_at(50), at(50), at(56)),
            Duration::from_millis(2)
        );
        // Later than its own round trip allows: the store's clock moved (a
        // failover); the reckoning starts again from this answer.
        assert_eq!(
            shaper.late_by(&decided_at(60), at(99), at(100)),
            Duration::ZERO
        );
        assert_eq!(
            shaper.late_by(&decided_at(70), at(108), at(111)),
            Duration::from_millis(1)
        );
        // A store that does not give its clock: nothing to reckon with.
        let clockless = Decided::new(decided_at(0).verdict, None, "test");
        assert_eq!(
            shaper.late_by(&clockless, at(120), at(200)),
            Duration::ZERO
        );
    }
}
