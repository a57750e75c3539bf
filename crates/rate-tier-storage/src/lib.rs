//! Where the state of tower-rate-tier's buckets lives.
//!
//! Every store implements one contract, [`Storage`]: *apply
//! [`gcra_core::Quota::check`] atomically per bucket*. Read the bucket's TAT,
//! decide, write the new TAT back, with no other check of the same bucket in
//! between, so that under any concurrency exactly the quota passes.
//!
//! | store | shared by | atomicity | feature |
//! |---|---|---|---|
//! | [`MemoryStorage`] | one process | a compare-and-swap per bucket | always |
//! | `RedisStorage` | every instance on one Redis | one Lua script per check | `redis` |
//! | [`FallbackStorage`] | wraps another store | the primary's, or local while it is down | always |
//!
//! The crate also holds the [`clock`]s (a fake one for tests) and the
//! [`key`] layout of shared stores.
//!
//! ```
//! use rate_tier_storage::{BucketCheck, MemoryStorage, Storage};
//! use rate_tier_storage::clock::FakeClock;
//! use gcra_core::Quota;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let store = MemoryStorage::with_clock(FakeClock::new());
//! let check = BucketCheck::new("free", "ana", Quota::per_minute(10), 1);
//! let first = store.check(&check).await.unwrap();
//! assert!(first.allowed);
//! assert_eq!(first.remaining, 9);
//! # }
//! ```
#![warn(clippy::unwrap_used)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod clock;
pub mod fallback;
pub mod key;
mod memory;
#[cfg(feature = "redis")]
mod redis;

use std::fmt;
use std::time::Duration;

pub use fallback::{FallbackStorage, StorageEvent, StorageListener};
pub use gcra_core::{CheckError, Decision, Quota, StoreTat};
pub use memory::{MemoryStorage, MemoryStorageBuilder};
#[cfg(feature = "redis")]
pub use redis::RedisStorage;

use key::KeySecret;

/// One request against one bucket: who, under which quota, at what cost.
///
/// ```
/// use rate_tier_storage::BucketCheck;
/// use rate_tier_storage::key::KeySecret;
/// use gcra_core::Quota;
///
/// let secret = KeySecret::new("k");
/// let check = BucketCheck::new("pro", "bea", Quota::per_minute(100), 5)
///     .key_secret(Some(&secret));
/// assert!(check.shared_key().starts_with("trt:pro:"));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct BucketCheck<'a> {
    /// The tier (plan) name; validated by [`key::validate_tier_name`] when
    /// the limiter is built.
    pub tier: &'a str,
    /// The user id, as identified. Shared stores only ever see its hash.
    pub user: &'a str,
    /// The quota that applies to this bucket.
    pub quota: Quota,
    /// The request's cost, `1..=quota.burst()`.
    pub cost: u32,
    /// The secret for HMAC keys in shared stores, if any.
    pub key_secret: Option<&'a KeySecret>,
}

impl<'a> BucketCheck<'a> {
    /// A check without a key secret.
    pub fn new(tier: &'a str, user: &'a str, quota: Quota, cost: u32) -> Self {
        BucketCheck {
            tier,
            user,
            quota,
            cost,
            key_secret: None,
        }
    }

    /// Sets the secret used for [`BucketCheck::shared_key`].
    pub fn key_secret(mut self, secret: Option<&'a KeySecret>) -> Self {
        self.key_secret = secret;
        self
    }

    /// The key of this bucket in a shared store: see [`key::bucket_key`].
    pub fn shared_key(&self) -> String {
        key::bucket_key(self.tier, self.user, self.key_secret)
    }
}

/// A store of GCRA buckets.
///
/// # Contract
///
/// [`Storage::check`] applies [`Quota::check`] to the bucket atomically: the
/// TAT it reads is the one the last decision on that bucket stored, and it
/// writes [`Decision::store`] (if any) before any other check of the bucket
/// reads it. An entry may be forgotten once its TAT is in the past: GCRA
/// treats a missing TAT and a past one alike. The time is the store's own
/// (its [`clock::Clock`], or the server's time for Redis).
///
/// The trait is object-safe: a limiter holds an `Arc<dyn Storage>`.
/// Checking several buckets all-or-nothing (a plan-wide quota plus a
/// per-endpoint quota) is meant to be a further method with the same
/// contract over a slice of [`BucketCheck`]s.
#[async_trait::async_trait]
pub trait Storage: Send + Sync + fmt::Debug + 'static {
    /// Decides `check` atomically and stores the outcome.
    async fn check(
        &self,
        check: &BucketCheck<'_>,
    ) -> Result<Decision, StorageError>;

    /// For stores that decide without I/O: the same as [`Storage::check`],
    /// synchronously, with the time the store decided at. It spares the
    /// caller an async call and a second clock read on the hot path.
    /// Returns `None` when the store needs I/O (the default).
    fn check_local(
        &self,
        check: &BucketCheck<'_>,
    ) -> Option<Result<LocalDecision, StorageError>> {
        let _ = check;
        None
    }

    /// A short label for metrics and logs, e.g. `"memory"` or `"redis"`.
    fn kind(&self) -> &'static str {
        "custom"
    }

    /// Registers a listener for what the store does by itself (a circuit
    /// breaker opening, a fallback decision). Stores that do nothing of the
    /// kind ignore it (the default).
    fn add_listener(&self, listener: StorageListener) {
        let _ = listener;
    }
}

/// A decision made in process, with the store's time when it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalDecision {
    /// The decision.
    pub decision: Decision,
    /// The store's clock, in µs, when it decided.
    pub now_us: u64,
}

/// Why a store gave no decision.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The store did not answer in time.
    #[error("storage did not answer within {0:?}")]
    Timeout(Duration),
    /// The backend failed (connection refused, I/O error, script error).
    #[error("storage backend failed: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The backend answered something this crate cannot read.
    #[error("unexpected reply from storage: {0}")]
    Protocol(String),
    /// The in-memory store holds as many live buckets as it may.
    #[error("memory storage is full: {capacity} live buckets")]
    CapacityExceeded {
        /// The configured bound.
        capacity: usize,
    },
    /// The GCRA math refused the inputs.
    #[error(transparent)]
    Check(#[from] CheckError),
}
