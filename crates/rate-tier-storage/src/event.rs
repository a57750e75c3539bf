//! What a store does by itself, and who hears it.
//!
//! A store reports its own decisions and changes of state (a circuit breaker
//! opening, a check decided by the local fallback, a bucket evicted from a
//! full memory store) as [`StorageEvent`]s. [`Listeners`] is the registry a
//! store keeps: [`Listeners::subscribe`] returns a [`Subscription`], and
//! dropping it unsubscribes, so a listener lives exactly as long as whoever
//! asked for it.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, Weak};

/// The state of a circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakerState {
    /// The primary decides.
    Closed,
    /// The local store decides; the primary is not called.
    Open,
    /// One probe is on its way to the primary; the others decide locally.
    HalfOpen,
}

impl BreakerState {
    /// A stable lower-case label, e.g. for a metric.
    ///
    /// ```
    /// assert_eq!(rate_tier_storage::BreakerState::HalfOpen.as_str(), "half_open");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// Something a store did by itself, for alerting and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StorageEvent {
    /// A circuit breaker changed state.
    Breaker {
        /// Which part of the primary it guards: `None` for the whole store,
        /// or a node of a Redis Cluster (`host:port`).
        domain: Option<Arc<str>>,
        /// The state before.
        from: BreakerState,
        /// The state now.
        to: BreakerState,
        /// The failure that caused it, if any.
        cause: Option<String>,
    },
    /// A check was decided by the local store.
    Fallback {
        /// The limit (tier) of the first bucket of the decision.
        limit: String,
        /// Whether it was allowed.
        allowed: bool,
    },
    /// A store replaced its connection: the old one had gone silent (the
    /// peer vanished without closing it).
    Reconnected {
        /// Why.
        cause: String,
    },
    /// A charge a store had to give back could not be: a decision whose
    /// caller gave up before Redis answered it (a late answer), or a slot of
    /// a Redis Cluster decision that a later slot refused. The bucket keeps
    /// `units` too many until it refills; nothing else is wrong. A window's
    /// or a period's charge is never refunded (only rates can be): of a
    /// late answer, each is reported so, and counts until its entries leave
    /// the window or the period ends. Slots of a concurrency limit that a
    /// late answer took and that could not be released are reported so
    /// too: they are free when their lease ends.
    Unrefunded {
        /// The limit (tier) of the bucket.
        limit: String,
        /// The units that stay charged.
        units: u32,
    },
    /// A settlement could not reach the store that charged its estimate
    /// (a debt or a refund lost): its queue of settlements waiting for the
    /// store to come back was full, or the call failed after it may have
    /// been applied (sending it again could apply it twice).
    SettlementLost {
        /// The limit (tier) of the bucket.
        limit: String,
    },
    /// A full memory store made room for a new bucket by forgetting the
    /// one, among a sample, nearest to full (the least debt to give away).
    Evicted {
        /// How far ahead of now the evicted bucket's TAT was, in µs: what
        /// its user was given back. 0 for a bucket already full.
        debt_us: u64,
    },
}

/// Receives [`StorageEvent`]s; must be quick (it runs on the request path).
pub type StorageListener = Arc<dyn Fn(&StorageEvent) + Send + Sync>;

/// A registry of listeners for events of type `E`.
///
/// Emitting costs one atomic load when nobody listens, and builds the event
/// only for someone who does.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use rate_tier_storage::event::Listeners;
///
/// let listeners: Listeners<u32> = Listeners::default();
/// let heard = Arc::new(AtomicU32::new(0));
/// let counter = heard.clone();
/// let subscription = listeners.subscribe(Arc::new(move |n: &u32| {
///     counter.fetch_add(*n, Ordering::Relaxed);
/// }));
/// listeners.emit_with(|| 2);
/// drop(subscription); // unsubscribes
/// listeners.emit_with(|| 40);
/// assert_eq!(heard.load(Ordering::Relaxed), 2);
/// ```
pub struct Listeners<E> {
    inner: Arc<Registry<E>>,
}

type Listener<E> = Arc<dyn Fn(&E) + Send + Sync>;

struct Registry<E> {
    /// Set while `listeners` is not empty: the emit fast path.
    any: AtomicBool,
    next_id: AtomicU64,
    listeners: RwLock<Vec<(u64, Listener<E>)>>,
}

impl<E> Clone for Listeners<E> {
    /// Another handle on the same registry.
    fn clone(&self) -> Self {
        Listeners {
            inner: self.inner.clone(),
        }
    }
}

impl<E> Default for Listeners<E> {
    fn default() -> Self {
        Listeners {
            inner: Arc::new(Registry {
                any: AtomicBool::new(false),
                next_id: AtomicU64::new(0),
                listeners: RwLock::new(Vec::new()),
            }),
        }
    }
}

impl<E: 'static> fmt::Debug for Listeners<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listeners")
            .field("count", &self.len())
            .finish()
    }
}

impl<E: 'static> Listeners<E> {
    /// Adds `listener` until the returned [`Subscription`] is dropped.
    #[must_use = "dropping the subscription unsubscribes at once"]
    pub fn subscribe(&self, listener: Listener<E>) -> Subscription {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let mut listeners = self
            .inner
            .listeners
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        listeners.push((id, listener));
        self.inner.any.store(true, Ordering::Release);
        let registry: Arc<dyn Unsubscribe> = self.inner.clone();
        Subscription {
            registry: Some(Arc::downgrade(&registry)),
            id,
        }
    }

    /// Whether anyone listens: when not, callers need not build an event.
    pub fn is_empty(&self) -> bool {
        !self.inner.any.load(Ordering::Acquire)
    }

    /// How many listeners are subscribed.
    pub fn len(&self) -> usize {
        self.inner
            .listeners
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Calls every listener with the event `event()` builds, building it
    /// only if someone listens.
    pub fn emit_with(&self, event: impl FnOnce() -> E) {
        if self.is_empty() {
            return;
        }
        let listeners = self
            .inner
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

trait Unsubscribe: Send + Sync {
    fn unsubscribe(&self, id: u64);
}

impl<E> Unsubscribe for Registry<E> {
    fn unsubscribe(&self, id: u64) {
        let mut listeners = self
            .listeners
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        listeners.retain(|(other, _)| *other != id);
        if listeners.is_empty() {
            self.any.store(false, Ordering::Release);
        }
    }
}

/// A listener's registration: dropping it unsubscribes the listener.
///
/// A store that reports nothing returns a [`Subscription::none`]. To keep
/// a listener for the life of the process, [`Subscription::forever`].
#[must_use = "dropping the subscription unsubscribes at once"]
pub struct Subscription {
    registry: Option<Weak<dyn Unsubscribe>>,
    id: u64,
}

impl Subscription {
    /// A subscription to nothing (a store with no events of its own).
    pub fn none() -> Subscription {
        Subscription {
            registry: None,
            id: 0,
        }
    }

    /// Keeps the listener for as long as the emitter lives.
    pub fn forever(mut self) {
        self.registry = None;
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("active", &self.registry.is_some())
            .finish()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.take().and_then(|r| r.upgrade()) {
            registry.unsubscribe(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_emitter_leaves_subscriptions_harmless() {
        let listeners: Listeners<()> = Listeners::default();
        let subscription = listeners.subscribe(Arc::new(|_: &()| {}));
        assert_eq!(listeners.len(), 1);
        drop(listeners);
        drop(subscription);
    }

    #[test]
    fn unsubscribing_one_keeps_the_others() {
        let listeners: Listeners<()> = Listeners::default();
        let a = listeners.subscribe(Arc::new(|_: &()| {}));
        let b = listeners.subscribe(Arc::new(|_: &()| {}));
        drop(a);
        assert_eq!(listeners.len(), 1);
        assert!(!listeners.is_empty());
        drop(b);
        assert!(listeners.is_empty());
        let mut built = false;
        listeners.emit_with(|| built = true);
        assert!(!built, "an event was built for no one");
    }
}
