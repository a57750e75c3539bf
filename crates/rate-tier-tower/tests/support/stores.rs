//! Stores that misbehave on purpose.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use rate_tier_storage::{Adjustment, Answer, Capabilities, Mode, StorageExt};
use tower_rate_tier::{
    MemoryStorage, Storage, StorageError, rules::RuleKind,
    storage::BucketCheck, storage::BucketSettle, storage::Decided,
    storage::Decision,
};

/// Every check times out (after no time at all). Counts its calls.
#[derive(Debug)]
pub struct TimingOut {
    kind: &'static str,
    calls: AtomicUsize,
    every_kind: bool,
}

impl TimingOut {
    /// A store of this `kind` (its label in events and metrics).
    pub fn new(kind: &'static str) -> Self {
        TimingOut {
            kind,
            calls: AtomicUsize::new(0),
            every_kind: false,
        }
    }

    /// The same, saying it decides every kind of limit (as Redis does).
    #[allow(dead_code)]
    pub fn of_every_kind(kind: &'static str) -> Self {
        TimingOut {
            every_kind: true,
            ..TimingOut::new(kind)
        }
    }

    /// Checks and settles asked so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl TimingOut {
    async fn check_buckets(
        &self,
        _checks: &[BucketCheck<'_>],
        _out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(StorageError::Timeout(Duration::from_millis(100)))
    }

    async fn settle_buckets(
        &self,
        _settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(StorageError::Timeout(Duration::from_millis(100)))
    }

    fn label(&self) -> &'static str {
        self.kind
    }

    fn decides(&self, kind: RuleKind) -> bool {
        self.every_kind || kind == RuleKind::Rate
    }

    async fn release_slots(
        &self,
        _slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(StorageError::Timeout(Duration::from_millis(100)))
    }
}

impl Storage for TimingOut {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        match mode {
            Mode::Check => Answer::pending(self.check_buckets(checks, out)),
            Mode::Reserve { .. } => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
        }
    }

    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        match adjustment {
            Adjustment::Settle(settles) => {
                Answer::pending(self.settle_buckets(settles))
            }
            Adjustment::Cancel(_) => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
            Adjustment::Release(slots) => {
                Answer::pending(self.release_slots(slots))
            }
            Adjustment::Renew(_) => Answer::Ready(Ok(())),
        }
    }

    fn capabilities(&self) -> Capabilities {
        let mut capabilities = Capabilities::new(self.label());
        for kind in [RuleKind::Window, RuleKind::Period, RuleKind::Concurrency]
        {
            if self.decides(kind) {
                capabilities = capabilities.with(kind);
            }
        }
        capabilities
    }
}

/// A primary that times out until [`Flaky::up`]; then a memory store
/// decides, asynchronously (as a remote store would: no `check_local`).
/// `before_call` runs at each call (e.g. to read a metric then).
pub struct Flaky {
    up: AtomicBool,
    store: MemoryStorage,
    calls: AtomicUsize,
    before_call: Box<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for Flaky {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flaky")
            .field("up", &self.up)
            .finish_non_exhaustive()
    }
}

impl Flaky {
    /// Down, deciding with `store` once up.
    pub fn new(store: MemoryStorage) -> Self {
        Flaky::watched(store, || {})
    }

    /// Down; `before_call` runs at each call.
    pub fn watched(
        store: MemoryStorage,
        before_call: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        Flaky {
            up: AtomicBool::new(false),
            store,
            calls: AtomicUsize::new(0),
            before_call: Box::new(before_call),
        }
    }

    /// Answers from now on (or fails again).
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
    }

    /// Calls that reached this store.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Flaky {
    async fn check_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        (self.before_call)();
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.up.load(Ordering::SeqCst) {
            let decided = self.store.check(checks, out).await?;
            Ok(Decided::new(decided.verdict, decided.now_us, "flaky"))
        } else {
            Err(StorageError::Timeout(Duration::from_millis(100)))
        }
    }

    async fn settle_buckets(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.up.load(Ordering::SeqCst) {
            self.store.settle(settles).await
        } else {
            Err(StorageError::Timeout(Duration::from_millis(100)))
        }
    }

    fn label(&self) -> &'static str {
        "flaky"
    }
}

impl Storage for Flaky {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        match mode {
            Mode::Check => Answer::pending(self.check_buckets(checks, out)),
            Mode::Reserve { .. } => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
        }
    }

    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        match adjustment {
            Adjustment::Settle(settles) => {
                Answer::pending(self.settle_buckets(settles))
            }
            Adjustment::Cancel(_) => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
            Adjustment::Release(_) => Answer::Ready(Err(
                StorageError::Unsupported("concurrency limits"),
            )),
            Adjustment::Renew(_) => Answer::Ready(Ok(())),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(self.label())
    }
}

/// A memory store that decides only through I/O, as a network store does
/// (and says so: `Capabilities::always_pending`): the remote path, without
/// a network. Counts the decisions asked of it, awaited or not.
#[derive(Debug, Clone)]
pub struct Remote {
    memory: MemoryStorage,
    asked: std::sync::Arc<AtomicUsize>,
    /// Says it decides windows and periods too, as memory does.
    every_kind: bool,
}

impl Remote {
    pub fn new(memory: MemoryStorage) -> Self {
        Remote {
            memory,
            asked: std::sync::Arc::default(),
            every_kind: false,
        }
    }

    /// One that says it decides every kind memory does.
    #[allow(dead_code)]
    pub fn of_every_kind(memory: MemoryStorage) -> Self {
        Remote {
            every_kind: true,
            ..Remote::new(memory)
        }
    }

    /// Decisions asked so far (each answer built, awaited or dropped).
    #[allow(dead_code)]
    pub fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }

    async fn check_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        tokio::task::yield_now().await;
        self.memory.check(checks, out).await
    }

    async fn settle_buckets(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        tokio::task::yield_now().await;
        self.memory.settle(settles).await
    }

    fn label(&self) -> &'static str {
        "remote"
    }
}

impl Storage for Remote {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        match mode {
            Mode::Check => Answer::pending(self.check_buckets(checks, out)),
            Mode::Reserve { .. } => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
        }
    }

    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        match adjustment {
            Adjustment::Settle(settles) => {
                Answer::pending(self.settle_buckets(settles))
            }
            Adjustment::Cancel(_) => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
            Adjustment::Release(_) => Answer::Ready(Err(
                StorageError::Unsupported("concurrency limits"),
            )),
            Adjustment::Renew(_) => Answer::Ready(Ok(())),
        }
    }

    fn reset<'a>(&'a self, buckets: &'a [BucketCheck<'a>]) -> Answer<'a, ()> {
        Answer::pending(async move {
            tokio::task::yield_now().await;
            self.memory.reset(buckets).await
        })
    }

    fn capabilities(&self) -> Capabilities {
        let capabilities = Capabilities::new(self.label()).always_pending();
        match self.every_kind {
            true => capabilities.with_every_kind(),
            false => capabilities,
        }
    }
}

/// Memory that says it can do less than it does, as other stores may:
/// decide rates alone ([`Narrow::rates_only`]), or not decide windows,
/// periods and concurrency limits of two partitions in one decision
/// ([`Narrow::one_partition`], as a Redis Cluster says). What it decides
/// is memory's.
#[derive(Debug)]
pub struct Narrow {
    memory: MemoryStorage,
    kind: &'static str,
    rates_only: bool,
}

impl Narrow {
    /// Says it decides rates alone; labelled `rates-only`.
    pub fn rates_only() -> Self {
        Narrow {
            memory: MemoryStorage::new(),
            kind: "rates-only",
            rates_only: true,
        }
    }

    /// Says it decides every kind, but only in one partition per decision;
    /// labelled `one-slot`.
    pub fn one_partition() -> Self {
        Narrow {
            memory: MemoryStorage::new(),
            kind: "one-slot",
            rates_only: false,
        }
    }
}

impl Narrow {
    async fn check_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        self.memory.check(checks, out).await
    }

    async fn settle_buckets(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        self.memory.settle(settles).await
    }

    async fn release_slots(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        self.memory.release(slots).await
    }

    fn decides(&self, kind: RuleKind) -> bool {
        kind == RuleKind::Rate
            || (!self.rates_only && self.memory.supports(kind))
    }

    fn can_span_partitions(&self) -> bool {
        self.rates_only
    }

    fn label(&self) -> &'static str {
        self.kind
    }
}

impl Storage for Narrow {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        match mode {
            Mode::Check => Answer::pending(self.check_buckets(checks, out)),
            Mode::Reserve { .. } => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
        }
    }

    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        match adjustment {
            Adjustment::Settle(settles) => {
                Answer::pending(self.settle_buckets(settles))
            }
            Adjustment::Cancel(_) => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
            Adjustment::Release(slots) => {
                Answer::pending(self.release_slots(slots))
            }
            Adjustment::Renew(_) => Answer::Ready(Ok(())),
        }
    }

    fn capabilities(&self) -> Capabilities {
        let mut capabilities = Capabilities::new(self.label());
        for kind in [RuleKind::Window, RuleKind::Period, RuleKind::Concurrency]
        {
            if self.decides(kind) {
                capabilities = capabilities.with(kind);
            }
        }
        capabilities.spans_partitions = self.can_span_partitions();
        capabilities
    }
}
