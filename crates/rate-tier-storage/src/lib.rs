//! Where the state of tower-rate-tier's buckets lives.
//!
//! Every store implements one contract, [`Storage`]: *apply
//! [`gcra_core::check_all`] atomically to a set of buckets*. Read the
//! buckets' TATs, decide them as one decision (every bucket charged, or
//! none), write the new TATs back, with no other check of the same buckets
//! in between, so that under any concurrency exactly the quota passes.
//!
//! | store | shared by | atomicity | feature |
//! |---|---|---|---|
//! | [`MemoryStorage`] | one process | a compare-and-swap per bucket; the buckets of one decision locked together | always |
//! | `RedisStorage` | every instance on one Redis or Redis Cluster | one Lua script per decision | `redis` |
//! | [`FallbackStorage`] | wraps another store | the primary's, or local while it is down | always |
//!
//! A request against a bucket is a [`BucketCheck`]: a [`LimitName`] (the
//! tier, or a limit of its own such as `search`), a partition (the user, an
//! address, nothing for a global limit), a quota and a cost. The crate also
//! holds the [`clock`]s (a fake one for tests), the [`key`] layout of
//! shared stores, and the [`event`]s a store reports by itself.
//!
//! ```
//! use rate_tier_storage::{BucketCheck, LimitName, MemoryStorage, StorageExt};
//! use rate_tier_storage::clock::FakeClock;
//! use gcra_core::{Decision, Quota};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStorage::with_clock(FakeClock::new());
//! let free = LimitName::new("free")?;
//! let check = [BucketCheck::new(&free, "ana", Quota::per_minute(10), 1)?];
//! let mut out = [Decision::default()];
//! let decided = store.check(&check, &mut out).await?;
//! assert!(decided.verdict.allowed);
//! assert_eq!(out[0].remaining, 9);
//! # Ok(()) }
//! ```
//!
//! # Feature flags
//!
//! | feature | enables |
//! |---|---|
//! | `redis` | `RedisStorage`: one limit shared through Redis or a Redis Cluster |
//! | `postgres` | `PostgresStorage`: one limit shared through PostgreSQL, for services without Redis |
#![warn(clippy::unwrap_used)]
#![cfg_attr(test, allow(clippy::unwrap_used))]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod bucket;
pub mod cells;
pub mod clock;
pub mod event;
pub mod fallback;
pub mod key;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
mod rule;
mod storage;
mod sync;
#[cfg(any(feature = "redis", feature = "postgres"))]
mod tls;

pub use bucket::{BucketCancel, BucketCheck, BucketSettle, Charged, LimitName};
pub use event::{BreakerState, StorageEvent, StorageListener, Subscription};
pub use fallback::FallbackStorage;
pub use gcra_core::{
    Adjust, CheckError, Concurrency, Decision, Period, PeriodUnit, Quota,
    StoreTat, Verdict, Window, Write,
};
pub use key::KeyLayout;
pub use memory::{MemoryStorage, MemoryStorageBuilder, RateCharge};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{
    InvalidTable, PostgresConfigError, PostgresStorage, PostgresStorageBuilder,
};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{REMEMBERED, RedisStorage};
pub use rule::{Rule, RuleKind};

/// How long unacknowledged data may wait before the kernel drops a socket
/// of the Redis store (Linux's `TCP_USER_TIMEOUT`), with keepalive probes
/// after 5 s idle.
///
/// ```
/// assert_eq!(rate_tier_storage::redis_user_timeout(), std::time::Duration::from_secs(5));
/// ```
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub fn redis_user_timeout() -> std::time::Duration {
    redis::USER_TIMEOUT
}
pub use storage::{
    Adjustment, Answer, Capabilities, Decided, Mode, Storage, StorageError,
    StorageExt,
};

// The README's examples, run as doctests so that they never drift.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
