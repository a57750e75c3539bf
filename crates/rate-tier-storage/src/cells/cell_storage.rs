//! [`CellStorage`]: every kind of limit decided with gcra-core over
//! [`Cells`] (see the [module docs](super)).

use std::sync::Arc;
use std::time::Duration;

use gcra_core::{Decision, Lease, MAX_TIME_US};

use super::codec::State;
use super::judge::{self, Next};
use super::{CellWrite, Cells, Change, Snapshot};
use crate::bucket::{BucketCancel, BucketCheck, BucketSettle};
use crate::clock::{Clock, SharedClock, SystemClock};
use crate::key::KeyLayout;
use crate::rule::{Rule, RuleKind};
use crate::storage::{
    Adjustment, Answer, Capabilities, Decided, Mode, Storage, StorageError,
    only_rates, validate, validate_reservation,
};

/// A store that decides every kind of limit with gcra-core over
/// [`Cells`]: see the [module docs](crate::cells).
///
/// Time is its [`Clock`]'s, by default the [`SystemClock`]: the instances
/// that share the cells decide at their own times, so their clocks must
/// agree (NTP); a TAT written by an instance ahead of the others is read as
/// a little debt by them. Concurrency slots are leased
/// ([`Capabilities::lease`], [`CellStorage::DEFAULT_LEASE`]).
///
/// ```
/// use rate_tier_storage::cells::{CellStorage, MemoryCells};
/// use rate_tier_storage::{RuleKind, Storage, StorageExt};
/// let store = CellStorage::new(MemoryCells::new());
/// assert!(store.supports(RuleKind::Window) && store.capabilities().reserves);
/// assert_eq!(store.capabilities().lease, Some(CellStorage::<MemoryCells>::DEFAULT_LEASE));
/// // Cells answer through a future, even in memory: never asked for a
/// // ready answer first.
/// assert!(!store.capabilities().answers_ready);
/// ```
#[derive(Debug, Clone)]
pub struct CellStorage<C> {
    cells: C,
    clock: SharedClock,
    lease: Option<Lease>,
    attempts: u32,
}

/// Builds a [`CellStorage`]: [`CellStorage::builder`].
///
/// ```
/// use std::time::Duration;
/// use rate_tier_storage::cells::{CellStorage, MemoryCells};
/// use rate_tier_storage::clock::FakeClock;
/// use rate_tier_storage::{Storage, StorageExt};
/// let store = CellStorage::builder(MemoryCells::new())
///     .clock(FakeClock::new())
///     .lease(Some(Duration::from_secs(10)))
///     .attempts(8)
///     .build();
/// assert_eq!(store.capabilities().lease, Some(Duration::from_secs(10)));
/// ```
#[derive(Debug)]
#[must_use]
pub struct CellStorageBuilder<C> {
    cells: C,
    clock: SharedClock,
    lease: Option<Duration>,
    attempts: u32,
}

impl<C: Cells> CellStorageBuilder<C> {
    /// The clock decisions are made at.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// How long a concurrency slot lives unless renewed
    /// ([`StorageExt::renew`](crate::StorageExt::renew)); `None`: until released. At most 2^50 µs;
    /// below 1 µs, 1 µs.
    pub fn lease(mut self, lease: Option<Duration>) -> Self {
        self.lease = lease;
        self
    }

    /// How many times one decision is tried before [`StorageError::Contended`]: at least
    /// 1 (default 64).
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// The store.
    pub fn build(self) -> CellStorage<C> {
        let lease = self.lease.map(|lease| {
            let lease = lease.max(Duration::from_micros(1));
            Lease::new(lease).unwrap_or_else(|_| {
                Lease::new(Duration::from_micros(gcra_core::MAX_WINDOW_US))
                    .unwrap_or_else(|_| unreachable!("2^50 µs is a lease"))
            })
        });
        CellStorage {
            cells: self.cells,
            clock: self.clock,
            lease,
            attempts: self.attempts,
        }
    }
}

impl<C: Cells> CellStorage<C> {
    /// How long a concurrency slot lives unless renewed, by default: 30 s,
    /// as on Redis.
    ///
    /// ```
    /// use rate_tier_storage::cells::{CellStorage, MemoryCells};
    /// assert_eq!(CellStorage::<MemoryCells>::DEFAULT_LEASE.as_secs(), 30);
    /// ```
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

    /// Decides over `cells` on the system clock.
    ///
    /// ```
    /// use rate_tier_storage::cells::{CellStorage, MemoryCells};
    /// use rate_tier_storage::{Storage, StorageExt};
    /// assert_eq!(CellStorage::new(MemoryCells::new()).kind(), "memory-cells");
    /// ```
    pub fn new(cells: C) -> Self {
        Self::builder(cells).build()
    }

    /// Decides over `cells` on `clock` (a [`FakeClock`](crate::clock::FakeClock) in tests).
    ///
    /// ```
    /// use rate_tier_storage::cells::{CellStorage, MemoryCells};
    /// use rate_tier_storage::clock::FakeClock;
    /// let store = CellStorage::with_clock(MemoryCells::new(), FakeClock::at_us(5));
    /// # let _ = store;
    /// ```
    pub fn with_clock(cells: C, clock: impl Clock) -> Self {
        Self::builder(cells).clock(clock).build()
    }

    /// A builder with the defaults: the system clock, a lease of
    /// [`CellStorage::DEFAULT_LEASE`], 64 attempts.
    ///
    /// ```
    /// use rate_tier_storage::cells::{CellStorage, MemoryCells};
    /// use rate_tier_storage::{Storage, StorageExt};
    /// let store = CellStorage::builder(MemoryCells::new()).lease(None).build();
    /// assert_eq!(store.capabilities().lease, None);
    /// ```
    pub fn builder(cells: C) -> CellStorageBuilder<C> {
        CellStorageBuilder {
            cells,
            clock: Arc::new(SystemClock),
            lease: Some(Self::DEFAULT_LEASE),
            attempts: 64,
        }
    }

    /// The cells it decides over.
    ///
    /// ```
    /// use rate_tier_storage::cells::{CellStorage, MemoryCells};
    /// assert!(CellStorage::new(MemoryCells::new()).cells().is_empty());
    /// ```
    pub fn cells(&self) -> &C {
        &self.cells
    }

    /// [`StorageExt::check`](crate::StorageExt::check): one decision over `checks`, every kind, all or
    /// nothing; a refused decision writes no charge.
    ///
    /// A tier and a window of logins, one decision: the third login in a
    /// minute is refused, and the tier is not charged for it.
    ///
    /// ```
    /// use rate_tier_storage::cells::{CellStorage, MemoryCells};
    /// use rate_tier_storage::clock::FakeClock;
    /// use rate_tier_storage::{BucketCheck, Decision, LimitName, Quota};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = CellStorage::with_clock(MemoryCells::new(), FakeClock::new());
    /// use rate_tier_storage::Window;
    /// let (free, login) = (LimitName::new("free")?, LimitName::of_limit("login")?);
    /// let twice = Window::new(2, std::time::Duration::from_secs(60))?;
    /// let checks = [
    ///     BucketCheck::new(&free, "ana", Quota::per_minute(10), 1)?,
    ///     BucketCheck::of_rule(&login, "ana", twice.into(), 1)?,
    /// ];
    /// let mut out = [Decision::default(); 2];
    /// for _ in 0..2 {
    ///     assert!(store.check(&checks, &mut out).await?.verdict.allowed);
    /// }
    /// let third = store.check(&checks, &mut out).await?;
    /// assert_eq!(third.verdict.refused_by, Some(1));
    /// assert_eq!(out[0].remaining, 8);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`StorageExt::check`](crate::StorageExt::check); [`StorageError::Contended`]
    /// when every attempt lost its race; the [`Cells`]' own errors, with
    /// nothing charged.
    pub async fn check(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        validate(checks, out)?;
        let slots = checks
            .iter()
            .any(|check| matches!(check.rule(), Rule::Concurrency(_)));
        let (verdict, now) = self
            .transact(checks.iter(), |states, now| {
                let expiry = if slots {
                    judge::expiry(self.lease, now)?
                } else {
                    MAX_TIME_US
                };
                judge::check(checks, states, now, expiry, out)
            })
            .await?;
        Ok(Decided::new(verdict, Some(now), self.cells.kind()))
    }

    /// [`StorageExt::reserve`](crate::StorageExt::reserve): [`gcra_core::reserve_all`] over rates' cells.
    ///
    /// ```
    /// use rate_tier_storage::cells::{CellStorage, MemoryCells};
    /// use rate_tier_storage::clock::FakeClock;
    /// use rate_tier_storage::{BucketCheck, Decision, LimitName, Quota};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = CellStorage::with_clock(MemoryCells::new(), FakeClock::new());
    /// use std::time::Duration;
    /// let name = LimitName::new("provider")?;
    /// let check = [BucketCheck::new(&name, "", Quota::per_second(10).allow_burst(1), 1)?];
    /// let mut out = [Decision::default()];
    /// let max_wait = Duration::from_secs(1);
    /// assert_eq!(store.reserve(&check, max_wait, &mut out).await?.wait_us, 0);
    /// assert_eq!(store.reserve(&check, max_wait, &mut out).await?.wait_us, 100_000);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`CellStorage::check`]; [`StorageError::Unsupported`] for a kind
    /// other than a rate.
    pub async fn reserve(
        &self,
        checks: &[BucketCheck<'_>],
        max_wait: Duration,
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        let max_wait_us = validate_reservation(checks, out, max_wait)?;
        let (joint, now) = self
            .transact(checks.iter(), |states, now| {
                judge::reserve(checks, states, now, max_wait_us, out)
            })
            .await?;
        Ok(
            Decided::of_reservation(&joint, Some(now), self.cells.kind())
                .with_store_clock(now),
        )
    }

    /// [`StorageExt::settle`](crate::StorageExt::settle): [`gcra_core::Quota::settle`] of each rate, all
    /// in one write.
    ///
    /// ```
    /// use rate_tier_storage::cells::{CellStorage, MemoryCells};
    /// use rate_tier_storage::clock::FakeClock;
    /// use rate_tier_storage::{BucketCheck, Decision, LimitName, Quota};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = CellStorage::with_clock(MemoryCells::new(), FakeClock::new());
    /// use rate_tier_storage::Adjust;
    /// let tokens = LimitName::new("tokens")?;
    /// let check = BucketCheck::new(&tokens, "ana", Quota::per_minute(1000), 1)?;
    /// let mut out = [Decision::default()];
    /// store.check(&[check], &mut out).await?;
    /// store.settle(&[check.settle(Adjust::Charge(99))]).await?;
    /// store.check(&[check.as_peek()], &mut out).await?;
    /// assert_eq!(out[0].remaining, 900);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`CellStorage::check`]; [`StorageError::Unsupported`] for a kind
    /// other than a rate.
    pub async fn settle(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        if !settles.iter().all(|settle| settle.bucket.is_rate()) {
            return Err(StorageError::Unsupported(
                "settling a window, a period or a concurrency limit (only a rate is settled)",
            ));
        }
        let buckets = settles.iter().map(|settle| &settle.bucket);
        self.transact(buckets, |states, now| {
            Ok(((), judge::settle(settles, states, now)?))
        })
        .await
        .map(drop)
    }

    /// [`StorageExt::cancel`](crate::StorageExt::cancel): [`gcra_core::Quota::cancel`] of each
    /// reservation, all in one write.
    ///
    /// ```
    /// use rate_tier_storage::cells::{CellStorage, MemoryCells};
    /// use rate_tier_storage::clock::FakeClock;
    /// use rate_tier_storage::{BucketCheck, Decision, LimitName, Quota};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = CellStorage::with_clock(MemoryCells::new(), FakeClock::new());
    /// use std::time::Duration;
    /// let name = LimitName::new("provider")?;
    /// let check = BucketCheck::new(&name, "", Quota::per_second(10).allow_burst(1), 1)?;
    /// let mut out = [Decision::default()];
    /// store.reserve(&[check], Duration::from_secs(1), &mut out).await?;
    /// let tat = out[0].store.map(|s| s.tat_us).unwrap_or_default();
    /// store.cancel(&[check.cancel(tat)]).await?;
    /// // Given back: the next reservation goes at once.
    /// assert_eq!(store.reserve(&[check], Duration::from_secs(1), &mut out).await?.wait_us, 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`CellStorage::settle`].
    pub async fn cancel(
        &self,
        reserved: &[BucketCancel<'_>],
    ) -> Result<(), StorageError> {
        let buckets: Vec<BucketCheck<'_>> =
            reserved.iter().map(|cancel| cancel.bucket).collect();
        only_rates(&buckets)?;
        self.transact(buckets.iter(), |states, now| {
            Ok(((), judge::cancel(reserved, states, now)))
        })
        .await
        .map(drop)
    }

    /// [`StorageExt::release`](crate::StorageExt::release): each check's cost of slots, held under its
    /// [`BucketCheck::lease_id`], given back.
    ///
    /// ```
    /// use rate_tier_storage::cells::{CellStorage, MemoryCells};
    /// use rate_tier_storage::clock::FakeClock;
    /// use rate_tier_storage::{BucketCheck, Decision, LimitName, Quota};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = CellStorage::with_clock(MemoryCells::new(), FakeClock::new());
    /// use rate_tier_storage::Concurrency;
    /// let uploads = LimitName::of_limit("uploads")?;
    /// let slot = [BucketCheck::of_rule(&uploads, "ana", Concurrency::new(1)?.into(), 1)?.lease_id(7)];
    /// let mut out = [Decision::default()];
    /// assert!(store.check(&slot, &mut out).await?.verdict.allowed);
    /// assert!(!store.check(&slot, &mut out).await?.verdict.allowed);
    /// store.release(&slot).await?;
    /// assert!(store.check(&slot, &mut out).await?.verdict.allowed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`CellStorage::check`]; [`StorageError::Unsupported`] for a
    /// bucket that is not a concurrency limit.
    pub async fn release(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        only_slots(slots)?;
        self.transact(slots.iter(), |states, now| {
            Ok(((), judge::release(slots, states, now)))
        })
        .await
        .map(drop)
    }

    /// [`StorageExt::renew`](crate::StorageExt::renew): the live slots each check's id holds expire a
    /// lease from now. Nothing to do without a lease.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rate_tier_storage::cells::{CellStorage, MemoryCells};
    /// use rate_tier_storage::clock::FakeClock;
    /// use rate_tier_storage::{BucketCheck, Concurrency, Decision, LimitName};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let clock = FakeClock::new();
    /// let store = CellStorage::builder(MemoryCells::new())
    ///     .clock(clock.clone())
    ///     .lease(Some(Duration::from_secs(30)))
    ///     .build();
    /// let uploads = LimitName::of_limit("uploads")?;
    /// let slot = [BucketCheck::of_rule(&uploads, "ana", Concurrency::new(1)?.into(), 1)?.lease_id(7)];
    /// let mut out = [Decision::default()];
    /// store.check(&slot, &mut out).await?;
    /// clock.advance(Duration::from_secs(20));
    /// store.renew(&slot).await?;
    /// clock.advance(Duration::from_secs(20));
    /// assert!(!store.check(&slot, &mut out).await?.verdict.allowed, "still held");
    /// clock.advance(Duration::from_secs(11));
    /// assert!(store.check(&slot, &mut out).await?.verdict.allowed, "expired");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`CellStorage::release`].
    pub async fn renew(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        only_slots(slots)?;
        let Some(lease) = self.lease else {
            return Ok(());
        };
        self.transact(slots.iter(), |states, now| {
            let expiry = lease.expiry(now)?;
            Ok(((), judge::renew(slots, states, now, expiry)))
        })
        .await
        .map(drop)
    }

    /// [`Storage::reset`]: every bucket but a concurrency limit's back to
    /// full, in one write.
    ///
    /// ```
    /// use rate_tier_storage::cells::{CellStorage, MemoryCells};
    /// use rate_tier_storage::clock::FakeClock;
    /// use rate_tier_storage::{BucketCheck, Decision, LimitName, Quota};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = CellStorage::with_clock(MemoryCells::new(), FakeClock::new());
    /// let pro = LimitName::new("pro")?;
    /// let check = [BucketCheck::new(&pro, "ada", Quota::per_minute(1), 1)?];
    /// let mut out = [Decision::default()];
    /// store.check(&check, &mut out).await?;
    /// assert!(!store.check(&check, &mut out).await?.verdict.allowed);
    /// store.reset(&check).await?;
    /// assert!(store.check(&check, &mut out).await?.verdict.allowed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`CellStorage::check`].
    pub async fn reset(
        &self,
        buckets: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        self.transact(buckets.iter(), |_, _| Ok(((), judge::reset(buckets))))
            .await
            .map(drop)
    }

    /// Reads the cells of `buckets`, decides, and writes what the decision
    /// asks if none of them changed meanwhile; else again, from a new read.
    /// The decision's value, and the time it was made at.
    async fn transact<'c, T>(
        &self,
        buckets: impl Iterator<Item = &'c BucketCheck<'c>>,
        mut decide: impl FnMut(
            &[Option<State>],
            u64,
        ) -> Result<(T, Vec<Next>), StorageError>
        + Send,
    ) -> Result<(T, u64), StorageError> {
        let (keys, kinds): (Vec<String>, Vec<RuleKind>) = buckets
            .map(|bucket| (bucket.key(KeyLayout::Single), bucket.rule().kind()))
            .unzip();
        for _ in 0..self.attempts {
            let read = if keys.is_empty() {
                Vec::new()
            } else {
                self.cells.read(&keys).await?
            };
            if read.len() != keys.len() {
                return Err(StorageError::Protocol(format!(
                    "{}: {} cells read for {} keys",
                    self.cells.kind(),
                    read.len(),
                    keys.len()
                )));
            }
            let now = self.clock.now_us();
            let states: Vec<Option<State>> = read
                .iter()
                .zip(&kinds)
                .map(|(cell, &kind)| State::decode(kind, &cell.as_ref()?.value))
                .collect();
            let (value, next) = decide(&states, now)?;
            let writes = writes(&keys, &read, next);
            if writes.iter().all(|write| write.change == Change::Keep)
                || self.cells.write_if(&writes).await?
            {
                return Ok((value, now));
            }
        }
        Err(StorageError::Contended {
            attempts: self.attempts,
        })
    }
}

/// The conditional write of a decision's next states.
fn writes<'k>(
    keys: &'k [String],
    read: &[Option<Snapshot>],
    next: Vec<Next>,
) -> Vec<CellWrite<'k>> {
    keys.iter()
        .zip(read)
        .zip(next)
        .filter_map(|((key, cell), next)| {
            let expected = cell.as_ref().map(|cell| cell.version);
            let change = match next {
                Next::Untouched => return None,
                Next::Keep => Change::Keep,
                Next::Put(state, ttl_ms) => Change::Put {
                    value: state.encode(),
                    ttl_ms,
                },
                // Absent already: only its absence holds the write.
                Next::Delete if expected.is_none() => Change::Keep,
                Next::Delete => Change::Delete,
            };
            Some(CellWrite {
                key,
                expected,
                change,
            })
        })
        .collect()
}

fn only_slots(slots: &[BucketCheck<'_>]) -> Result<(), StorageError> {
    if slots
        .iter()
        .all(|check| matches!(check.rule(), Rule::Concurrency(_)))
    {
        Ok(())
    } else {
        Err(StorageError::Unsupported(
            "releasing or renewing a bucket that is not a concurrency limit",
        ))
    }
}

impl<C: Cells> Storage for CellStorage<C> {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        match mode {
            Mode::Check => {
                Answer::pending(CellStorage::check(self, checks, out))
            }
            Mode::Reserve { max_wait } => Answer::pending(
                CellStorage::reserve(self, checks, max_wait, out),
            ),
        }
    }

    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        match adjustment {
            Adjustment::Settle(settles) => {
                Answer::pending(CellStorage::settle(self, settles))
            }
            Adjustment::Cancel(reserved) => {
                Answer::pending(CellStorage::cancel(self, reserved))
            }
            Adjustment::Release(slots) => {
                Answer::pending(CellStorage::release(self, slots))
            }
            Adjustment::Renew(slots) => {
                Answer::pending(CellStorage::renew(self, slots))
            }
        }
    }

    fn reset<'a>(&'a self, buckets: &'a [BucketCheck<'a>]) -> Answer<'a, ()> {
        Answer::pending(CellStorage::reset(self, buckets))
    }

    /// Every kind and reservations, the cells' label, and the lease of
    /// slots ([`CellStorageBuilder::lease`]); every answer a future.
    fn capabilities(&self) -> Capabilities {
        let mut cells = Capabilities::new(self.cells.kind())
            .with_every_kind()
            .always_pending();
        cells.reserves = true;
        cells.lease = self
            .lease
            .map(|lease| Duration::from_micros(lease.lease_us()));
        cells
    }
}
