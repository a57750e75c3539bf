//! Caching an async identity lookup, with moka.

use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;

use crate::identity::{IdentityError, TierIdentifier, TierIdentity};

type KeyFn<K> = dyn Fn(&Parts) -> Option<K> + Send + Sync;

/// A [`TierIdentifier`] that remembers answers for a while.
///
/// A database lookup per request is what a limiter should save, not add.
/// This wraps any identifier with a bounded moka cache keyed by what
/// `cache_key` takes from the request (an API key header, say). Concurrent
/// misses on one key make a single lookup. "No identity" answers are cached
/// too, so a flood of unknown keys does not reach the database either, but
/// for a shorter time ([`CachedIdentifier::negative_ttl`], 5 s by default):
/// a key created a moment ago should not wait the whole TTL. A lookup that
/// *failed* (`Err`: the database is down) is never cached: the next request
/// asks again, and the [`OnIdentityError`](crate::policy::OnIdentityError) policy
/// answers this one. A request for which `cache_key` returns `None` is
/// looked up every time.
///
/// ```
/// use std::time::Duration;
/// use tower_rate_tier::{CachedIdentifier, IdentityError, TierIdentifier, TierIdentity};
/// use http::request::Parts;
///
/// struct Db;
/// #[async_trait::async_trait]
/// impl TierIdentifier for Db {
///     async fn identify(
///         &self,
///         parts: &Parts,
///     ) -> Result<Option<TierIdentity<'static>>, IdentityError> {
///         let key = parts.headers.get("x-api-key").and_then(|v| v.to_str().ok());
///         Ok(key.map(|key| TierIdentity::new(key.to_owned(), "free")))
///     }
/// }
///
/// let cached = CachedIdentifier::new(
///     Db,
///     |parts: &Parts| Some(parts.headers.get("x-api-key")?.as_bytes().to_vec()),
///     Duration::from_secs(60),
///     10_000,
/// );
/// # let _ = cached;
/// ```
pub struct CachedIdentifier<I, K> {
    inner: Arc<I>,
    cache_key: Arc<KeyFn<K>>,
    cache: moka::future::Cache<K, Option<TierIdentity<'static>>>,
    capacity: u64,
    ttls: Ttls,
}

/// How long answers live: an identity, and "no identity".
#[derive(Debug, Clone, Copy)]
struct Ttls {
    found: Duration,
    missing: Duration,
}

impl<K> moka::Expiry<K, Option<TierIdentity<'static>>> for Ttls {
    fn expire_after_create(
        &self,
        _key: &K,
        value: &Option<TierIdentity<'static>>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(if value.is_some() {
            self.found
        } else {
            self.missing
        })
    }
}

fn cache<K>(
    capacity: u64,
    ttls: Ttls,
) -> moka::future::Cache<K, Option<TierIdentity<'static>>>
where
    K: Hash + Eq + Send + Sync + 'static,
{
    moka::future::Cache::builder()
        .max_capacity(capacity)
        .expire_after(ttls)
        .build()
}

impl<I, K> CachedIdentifier<I, K>
where
    I: TierIdentifier,
    K: Hash + Eq + Send + Sync + 'static,
{
    /// Caches `inner`'s answers for `ttl`, at most `capacity` of them.
    pub fn new<F>(inner: I, cache_key: F, ttl: Duration, capacity: u64) -> Self
    where
        F: Fn(&Parts) -> Option<K> + Send + Sync + 'static,
    {
        let ttls = Ttls {
            found: ttl,
            missing: ttl.min(Duration::from_secs(5)),
        };
        CachedIdentifier {
            inner: Arc::new(inner),
            cache_key: Arc::new(cache_key),
            cache: cache(capacity, ttls),
            capacity,
            ttls,
        }
    }

    /// How long a "no identity" answer is kept (default: the TTL, at most
    /// 5 s). Set it before use: the cache starts empty again.
    pub fn negative_ttl(mut self, ttl: Duration) -> Self {
        self.ttls.missing = ttl;
        self.cache = cache(self.capacity, self.ttls);
        self
    }

    /// Forgets every cached answer (e.g. after tiers changed).
    pub fn invalidate_all(&self) {
        self.cache.invalidate_all();
    }
}

#[async_trait::async_trait]
impl<I, K> TierIdentifier for CachedIdentifier<I, K>
where
    I: TierIdentifier,
    K: Hash + Eq + Send + Sync + 'static,
{
    async fn identify(
        &self,
        parts: &Parts,
    ) -> Result<Option<TierIdentity<'static>>, IdentityError> {
        let Some(key) = (self.cache_key)(parts) else {
            return self.inner.identify(parts).await;
        };
        // Concurrent misses on one key make one lookup; a failure is
        // returned to all of them and not kept.
        self.cache
            .try_get_with(key, self.inner.identify(parts))
            .await
            .map_err(|error| (*error).clone())
    }
}
