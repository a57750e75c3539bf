//! The fallback's paths that need no I/O, its breakers' state and their
//! routes, decisions over several failure domains, and settlements kept
//! for a primary that is down: with a fake clock, the breakers opened by
//! hand where a test is about what an open breaker does, and a primary
//! whose buckets live on two nodes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gcra_core::{Adjust, Concurrency, Decision, Quota};

use super::breaker::{Breaker, Route};
use super::{BreakerState, FallbackStorage, PENDING_MAX};
use crate::bucket::{BucketCheck, Charged, LimitName};
use crate::clock::{Clock, FakeClock};
use crate::event::{StorageEvent, Subscription};
use crate::memory::MemoryStorage;
use crate::rule::{Rule, RuleKind};

use crate::storage::{
    Adjustment, Answer, Capabilities, Decided, Mode, Storage, StorageError,
    StorageExt,
};

const START_US: u64 = 1_000_000_000;
const SECOND: u64 = 1_000_000;

/// A primary over memory whose buckets live on two nodes: a user whose id
/// starts with `b` on `node-b`, every other on `node-a`. Its checks fail
/// with the error it is given (every call, or only on the node named), or
/// answer from its own memory, without its backend, as a Redis store
/// answers a refusal it remembers; its settlements can be held at a gate.
/// It takes rates only and cannot decide windows of two partitions at
/// once (the trait's default kinds; a Redis Cluster's partitions).
#[derive(Debug, Default)]
struct Nodes {
    store: MemoryStorage,
    failure: Mutex<Option<Failure>>,
    from_memory: AtomicBool,
    checks: AtomicUsize,
    gate: Option<tokio::sync::Semaphore>,
    settling: AtomicUsize,
    most_settling: AtomicUsize,
}

/// How [`Nodes`] fails its checks: on one node (or every one, `None`),
/// with an error of its making.
type Failure = (Option<&'static str>, fn() -> StorageError);

fn node(check: &BucketCheck<'_>) -> &'static str {
    if check.partition().starts_with('b') {
        "node-b"
    } else {
        "node-a"
    }
}

fn timeout() -> StorageError {
    StorageError::Timeout(Duration::from_millis(100))
}

impl Nodes {
    /// Fails every check with `error` (on `node` alone, if named).
    fn fail(&self, node: Option<&'static str>, error: fn() -> StorageError) {
        *self.failure.lock().unwrap() = Some((node, error));
    }
}

impl Storage for Nodes {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        if let Mode::Reserve { .. } = mode {
            return Answer::pending(self.store.decide(checks, mode, out));
        }
        Answer::pending(async move {
            self.checks.fetch_add(1, Ordering::SeqCst);
            let failure = *self.failure.lock().unwrap();
            if let Some((on, error)) = failure
                && on.is_none_or(|on| checks.iter().any(|c| node(c) == on))
            {
                return Err(error());
            }
            let decided = self.store.check(checks, out).await?;
            Ok(if self.from_memory.load(Ordering::SeqCst) {
                decided.without_backend()
            } else {
                decided
            })
        })
    }

    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        match adjustment {
            Adjustment::Settle(settles) => Answer::pending(async move {
                let now = self.settling.fetch_add(1, Ordering::SeqCst) + 1;
                self.most_settling.fetch_max(now, Ordering::SeqCst);
                if let Some(gate) = &self.gate {
                    drop(gate.acquire().await);
                }
                self.settling.fetch_sub(1, Ordering::SeqCst);
                self.store.settle(settles).await
            }),
            Adjustment::Release(_) => self.store.adjust(adjustment),
            Adjustment::Renew(_) => Answer::Ready(Ok(())),
            Adjustment::Cancel(_) => {
                Answer::Ready(Err(StorageError::Unsupported("reservations")))
            }
        }
    }

    fn failure_domain(&self, check: &BucketCheck<'_>) -> Option<Arc<str>> {
        Some(Arc::from(node(check)))
    }

    fn capabilities(&self) -> Capabilities {
        let mut nodes = Capabilities::new("custom");
        nodes.spans_partitions = false;
        nodes.reserves = true;
        nodes
    }
}

struct Setup {
    clock: FakeClock,
    primary: Arc<Nodes>,
    store: FallbackStorage,
    /// Settlements reported lost.
    lost: Arc<AtomicUsize>,
    _subscription: Subscription,
    plan: LimitName,
    uploads: LimitName,
    tokens: LimitName,
}

/// A fallback over [`Nodes`]: opened by 2 failures, a cool-down of 1 s
/// doubling up to 4 s, each quota divided by `share` locally.
fn setup(share: u32) -> Setup {
    with_primary(share, Nodes::default())
}

fn with_primary(share: u32, nodes: Nodes) -> Setup {
    let clock = FakeClock::at_us(START_US);
    let primary = Arc::new(Nodes {
        store: MemoryStorage::with_clock(clock.clone()),
        ..nodes
    });
    let store = FallbackStorage::builder(primary.clone())
        .clock(clock.clone())
        .failure_threshold(2)
        .cool_down(Duration::from_secs(1), Duration::from_secs(4))
        .local_share(share)
        .build();
    let lost = Arc::new(AtomicUsize::new(0));
    let counter = lost.clone();
    let subscription = store.subscribe(Arc::new(move |e: &StorageEvent| {
        if matches!(e, StorageEvent::SettlementLost { .. }) {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    }));
    Setup {
        clock,
        primary,
        store,
        lost,
        _subscription: subscription,
        plan: LimitName::new("free").unwrap(),
        uploads: LimitName::new("uploads").unwrap(),
        tokens: LimitName::new("tokens").unwrap(),
    }
}

impl Setup {
    /// A check of `cost` on the tier (10 per minute) of `user`.
    fn bucket<'a>(&'a self, user: &'a str, cost: u32) -> BucketCheck<'a> {
        BucketCheck::new(&self.plan, user, Quota::per_minute(10), cost).unwrap()
    }

    /// A slot of `uploads` (2 in flight) for `user`, under `lease`.
    fn slot<'a>(&'a self, user: &'a str, lease: u64) -> BucketCheck<'a> {
        let rule = Rule::from(Concurrency::new(2).unwrap());
        BucketCheck::of_rule(&self.uploads, user, rule, 1)
            .unwrap()
            .lease_id(lease)
    }

    async fn decide(
        &self,
        checks: &[BucketCheck<'_>],
    ) -> (Decided, Vec<Decision>) {
        let mut out = vec![Decision::default(); checks.len()];
        let decided = self.store.check(checks, &mut out).await.unwrap();
        (decided, out)
    }

    fn breaker(&self, node: &str) -> Arc<Breaker> {
        self.store.inner.domain_breaker(&Arc::from(node))
    }

    fn state_of(&self, node: &str) -> BreakerState {
        self.breaker(node).state()
    }

    /// Opens `node`'s breaker, as its threshold of failures in a row
    /// would, due for a probe after the cool-down.
    fn open(&self, node: &str) {
        let (breaker, now) = (self.breaker(node), self.clock.now_us());
        for _ in 0..self.store.inner.timing.failure_threshold {
            breaker.failed(&self.store.inner.timing, now);
        }
        assert_eq!(breaker.state(), BreakerState::Open);
    }

    /// What `store` holds of `check`'s bucket, read with a peek.
    fn read(&self, store: &MemoryStorage, check: BucketCheck<'_>) -> Decision {
        let mut out = [Decision::default()];
        store.check_sync(&[check.as_peek()], &mut out).unwrap();
        out[0]
    }

    fn lost(&self) -> usize {
        self.lost.load(Ordering::SeqCst)
    }

    /// `bucket`'s estimate of 1 settled to 300 while node-a's breaker is
    /// open: kept for the primary.
    async fn settle_during_an_outage(&self, bucket: BucketCheck<'_>) {
        self.open("node-a");
        let settle = bucket.settle(Adjust::between(1, 300));
        self.store.settle(&[settle]).await.unwrap();
        assert_eq!(self.store.pending_settlements(), 1);
    }

    /// A check of 1 token of `user`'s, 1000 per minute: a limit settled
    /// after the response.
    fn tokens_of<'a>(&'a self, user: &'a str) -> BucketCheck<'a> {
        BucketCheck::new(&self.tokens, user, Quota::per_minute(1000), 1)
            .unwrap()
    }
}

// ---------------------------------------------------------------------------
// What the store says of itself

#[test]
fn the_debug_form_names_the_primary_the_state_and_the_settings() {
    let s = setup(3);
    let shown = format!("{:?}", s.store);
    for part in [
        "FallbackStorage",
        "Nodes",
        "state: Closed",
        "failure_threshold: 2",
        "local_share: 3",
    ] {
        assert!(shown.contains(part), "{part} in {shown}");
    }
    s.open("node-a");
    assert!(format!("{:?}", s.store).contains("state: Open"));

    let builder = FallbackStorage::builder(s.primary.clone())
        .failure_threshold(5)
        .cool_down(Duration::from_secs(2), Duration::from_secs(8))
        .local_share(4);
    let shown = format!("{builder:?}");
    for part in [
        "FallbackStorageBuilder",
        "failure_threshold: 5",
        "cool_down: 2s",
        "max_cool_down: 8s",
        "local_share: 4",
    ] {
        assert!(shown.contains(part), "{part} in {shown}");
    }
}

#[test]
fn the_state_is_open_if_any_breaker_is_half_open_if_any_probes() {
    let s = setup(1);
    s.breaker("node-a");
    s.open("node-b");
    assert_eq!(s.store.state(), BreakerState::Open);
    // node-b's probe goes out; node-a is closed.
    s.clock.advance(Duration::from_secs(1));
    let (route, _) = s.breaker("node-b").route(s.clock.now_us());
    assert_eq!(route, Route::Probe(0));
    assert_eq!(s.state_of("node-a"), BreakerState::Closed);
    assert_eq!(s.store.state(), BreakerState::HalfOpen);
    // Open beats probing.
    s.open("node-a");
    assert_eq!(s.store.state(), BreakerState::Open);
}

#[test]
fn the_fallback_claims_its_primarys_kinds_and_partitions() {
    let s = setup(1);
    assert!(s.store.supports(RuleKind::Rate));
    assert!(!s.store.supports(RuleKind::Window), "the primary's kinds");
    assert!(
        !s.store.capabilities().spans_partitions,
        "the primary's partitions"
    );
    let over_memory =
        FallbackStorage::builder(Arc::new(MemoryStorage::new())).build();
    assert!(over_memory.supports(RuleKind::Window));
    assert!(over_memory.capabilities().spans_partitions);
}

// ---------------------------------------------------------------------------
// Without I/O

#[tokio::test]
async fn settle_local_settles_without_io_what_needs_none() {
    let s = setup(2);
    let local = Charged::Local { share: 2 };
    // Charged locally: settled in the local store, under the share.
    let debt = s.bucket("ana", 1).settle(Adjust::Charge(3)).charged(local);
    assert!(matches!(s.store.settle(&[debt]).ready(), Some(Ok(()))));
    let divided = s
        .bucket("ana", 1)
        .with_quota(Quota::per_minute(10).divided(2));
    assert_eq!(s.read(s.store.local(), divided).remaining, 2);
    // Charged by the primary, its breaker closed: it needs the primary.
    let on_primary = s.bucket("ana", 1).settle(Adjust::Charge(3));
    assert!(s.store.settle(&[on_primary]).ready().is_none());
    assert!(s.store.settle(&[debt, on_primary]).ready().is_none());
    assert_eq!(s.primary.settling.load(Ordering::SeqCst), 0);
    // Its breaker open: kept for the primary, without I/O.
    s.open("node-a");
    assert!(matches!(
        s.store.settle(&[on_primary]).ready(),
        Some(Ok(()))
    ));
    assert_eq!(s.store.pending_settlements(), 1);
}

#[tokio::test]
async fn release_local_releases_without_io_only_what_one_store_holds() {
    let s = setup(1);
    // Taken on the primary, which releases without I/O: released there.
    let (decided, _) = s.decide(&[s.slot("ana", 1)]).await;
    assert_eq!(decided.charged(0), Charged::Primary);
    assert_eq!(s.read(&s.primary.store, s.slot("ana", 1)).remaining, 1);
    assert!(matches!(
        s.store.release(&[s.slot("ana", 1)]).ready(),
        Some(Ok(()))
    ));
    assert_eq!(s.read(&s.primary.store, s.slot("ana", 1)).remaining, 2);
    s.decide(&[s.slot("ana", 2)]).await;

    // One slot taken locally, one on the primary: no single store holds
    // both, so the release is not made at once, and nothing is released.
    s.open("node-b");
    let (decided, _) = s.decide(&[s.slot("bea", 3)]).await;
    assert_eq!(decided.charged(0), Charged::Local { share: 1 });
    let both = [s.slot("bea", 3), s.slot("ana", 2)];
    assert!(s.store.release(&both).ready().is_none());
    assert_eq!(s.store.local_slots(), 1);
    assert_eq!(s.read(s.store.local(), s.slot("bea", 3)).remaining, 1);
    assert_eq!(s.read(&s.primary.store, s.slot("ana", 2)).remaining, 1);
    // Each alone: at once, each in its own store.
    assert!(matches!(s.store.release(&both[..1]).ready(), Some(Ok(()))));
    assert_eq!(s.read(s.store.local(), s.slot("bea", 3)).remaining, 2);
    assert!(matches!(s.store.release(&both[1..]).ready(), Some(Ok(()))));
    assert_eq!(s.read(&s.primary.store, s.slot("ana", 2)).remaining, 2);
}

#[tokio::test]
async fn reserve_local_reserves_without_io_only_behind_an_open_breaker() {
    let s = setup(1);
    let even = Quota::per_second(10)
        .allow_burst(1)
        .allow_debt(Duration::from_secs(1));
    let ana = [BucketCheck::new(&s.plan, "ana", even, 1).unwrap()];
    let wait = Duration::from_secs(1);
    let mut out = [Decision::default()];
    // Closed: the primary reserves.
    assert!(s.store.reserve(&ana, wait, &mut out).ready().is_none());
    // Open and not due: here, at once, and said so.
    s.open("node-a");
    let decided = s
        .store
        .reserve(&ana, wait, &mut out)
        .ready()
        .unwrap()
        .unwrap();
    assert_eq!((decided.by, decided.verdict.allowed), ("fallback", true));
    assert_eq!(decided.charged(0), Charged::Local { share: 1 });
    // Due for a probe: the primary's call to make.
    s.clock.advance(Duration::from_secs(1));
    assert!(s.store.reserve(&ana, wait, &mut out).ready().is_none());
}

#[tokio::test]
async fn check_local_decides_at_once_while_another_check_probes() {
    let s = setup(1);
    s.open("node-a");
    s.clock.advance(Duration::from_secs(1));
    // Another check took the probe: this one does not wait for it.
    let (route, _) = s.breaker("node-a").route(s.clock.now_us());
    assert_eq!(route, Route::Probe(0));
    let mut out = [Decision::default()];
    let decided = s
        .store
        .check(&[s.bucket("ana", 1)], &mut out)
        .ready()
        .unwrap()
        .unwrap();
    assert_eq!(decided.by, "fallback");
    assert_eq!(s.primary.checks.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_peek_of_a_concurrency_limit_needs_no_lease_id_behind_an_open_breaker()
 {
    let s = setup(1);
    s.open("node-a");
    let rule = Rule::from(Concurrency::new(2).unwrap());
    let peek = BucketCheck::of_rule(&s.uploads, "ana", rule, 0).unwrap();
    let (decided, out) = s.decide(&[peek]).await;
    assert_eq!(decided.by, "fallback");
    assert_eq!((out[0].allowed, out[0].remaining), (true, 2));
    assert_eq!(s.store.local_slots(), 0, "a read takes no slot");
}

// ---------------------------------------------------------------------------
// Probes and failure domains

#[tokio::test]
async fn a_probe_answered_from_the_primarys_memory_neither_closes_nor_counts() {
    let s = setup(1);
    s.open("node-a");
    s.clock.advance(Duration::from_secs(1));
    s.primary.from_memory.store(true, Ordering::SeqCst);
    let (decided, _) = s.decide(&[s.bucket("ana", 1)]).await;
    assert!(!decided.reached_backend);
    // Nothing was learned of the backend: open, and due at once.
    assert_eq!(s.state_of("node-a"), BreakerState::Open);
    s.primary.from_memory.store(false, Ordering::SeqCst);
    let checks = s.primary.checks.load(Ordering::SeqCst);
    let (decided, _) = s.decide(&[s.bucket("ana", 1)]).await;
    assert_eq!(decided.by, "memory", "the next check probed");
    assert_eq!(s.primary.checks.load(Ordering::SeqCst), checks + 1);
    assert_eq!(s.state_of("node-a"), BreakerState::Closed);
}

#[tokio::test]
async fn a_failure_placed_in_one_domain_counts_against_that_domain_alone() {
    let s = setup(1);
    s.primary.fail(None, || StorageError::InDomain {
        domain: Arc::from("node-b"),
        error: Box::new(timeout()),
    });
    let both = [s.bucket("ana", 1), s.bucket("bea", 1)];
    for _ in 0..2 {
        assert_eq!(s.decide(&both).await.0.by, "fallback");
    }
    assert_eq!(s.state_of("node-b"), BreakerState::Open);
    assert_eq!(s.state_of("node-a"), BreakerState::Closed);
}

#[tokio::test]
async fn a_mixed_decision_counts_each_remote_breaker_once() {
    let s = setup(1);
    s.open("node-b");
    // Two buckets on node-a (failing), one on node-b (open): each failed
    // decision is one failure of node-a's.
    s.primary.fail(Some("node-a"), timeout);
    let search = LimitName::new("search").unwrap();
    let checks = [
        s.bucket("ana", 1),
        BucketCheck::new(&search, "ana", Quota::per_minute(10), 1).unwrap(),
        s.bucket("bea", 1),
    ];
    let (decided, _) = s.decide(&checks).await;
    assert!(decided.verdict.allowed);
    assert_eq!(s.state_of("node-a"), BreakerState::Closed, "one failure");
    s.decide(&checks).await;
    assert_eq!(s.state_of("node-a"), BreakerState::Open, "two failures");
}

#[tokio::test]
async fn a_mixed_decision_refused_here_reports_an_unread_remote_part_as_passing()
 {
    let s = setup(1);
    s.open("node-b");
    for _ in 0..10 {
        assert!(s.decide(&[s.bucket("bea", 1)]).await.0.verdict.allowed);
    }
    // bea's tier refuses here; the read of ana's on the primary fails.
    s.primary.fail(Some("node-a"), timeout);
    let (decided, out) =
        s.decide(&[s.bucket("ana", 1), s.bucket("bea", 1)]).await;
    assert!(!decided.verdict.allowed);
    assert_eq!(decided.verdict.refused_by, Some(1));
    assert!(out[0].allowed, "unread, it would pass: {:?}", out[0]);
    assert!(!out[1].allowed);
}

#[tokio::test]
async fn a_mixed_decision_whose_primary_fails_is_decided_here_whole_and_kept() {
    let s = setup(1);
    s.open("node-b");
    s.primary.fail(Some("node-a"), timeout);
    let (decided, out) =
        s.decide(&[s.bucket("ana", 1), s.bucket("bea", 1)]).await;
    assert!(decided.verdict.allowed);
    assert_eq!((out[0].remaining, out[1].remaining), (9, 9));
    // Both charged here, and said so: a settlement goes here.
    let here = Charged::Local { share: 1 };
    assert_eq!((decided.charged(0), decided.charged(1)), (here, here));
    assert_eq!(s.read(s.store.local(), s.bucket("ana", 1)).remaining, 9);
    assert_eq!(s.read(s.store.local(), s.bucket("bea", 1)).remaining, 9);
}

#[tokio::test]
async fn a_mixed_decision_of_64_buckets_names_where_each_was_charged() {
    let s = setup(1);
    s.open("node-b");
    let names: Vec<LimitName> = (0..64)
        .map(|i| LimitName::new(format!("limit-{i}")).unwrap())
        .collect();
    // 63 on node-a, on the primary; the last on node-b, here.
    let checks: Vec<BucketCheck<'_>> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let user = if i == 63 { "bea" } else { "ana" };
            BucketCheck::new(name, user, Quota::per_minute(10), 1).unwrap()
        })
        .collect();
    let (decided, _) = s.decide(&checks).await;
    assert!(decided.verdict.allowed);
    assert_eq!(decided.charged(0), Charged::Primary);
    assert_eq!(decided.charged(62), Charged::Primary);
    assert_eq!(decided.charged(63), Charged::Local { share: 1 });
}

#[tokio::test]
async fn a_mixed_decision_refused_by_the_primary_gives_back_only_what_it_charged_here()
 {
    let s = setup(1);
    s.open("node-b");
    // ana's tier is spent on the primary.
    for _ in 0..10 {
        s.decide(&[s.bucket("ana", 1)]).await;
    }
    // bea's `search` is spent here, in shadow: it refuses, and is not
    // charged, nor given anything back.
    let search = LimitName::new("search").unwrap();
    let quota = Quota::per_minute(1);
    let shadow = BucketCheck::new(&search, "bea", quota, 1)
        .unwrap()
        .shadow(true);
    assert!(s.decide(&[shadow]).await.0.verdict.allowed);
    let spent = s.read(s.store.local(), shadow);
    assert_eq!(spent.reset_after_us, 60 * SECOND);

    let checks = [s.bucket("ana", 1), s.bucket("bea", 1), shadow];
    let (decided, out) = s.decide(&checks).await;
    assert!(!decided.verdict.allowed);
    assert_eq!(decided.verdict.refused_by, Some(0));
    assert!(!out[2].allowed, "the shadow limit refused");
    // bea's tier was charged here and given back; the shadow limit holds
    // what it held.
    assert_eq!(out[1].remaining, 10);
    assert_eq!(s.read(s.store.local(), s.bucket("bea", 1)).remaining, 10);
    assert_eq!(s.read(s.store.local(), shadow), spent);
}

// ---------------------------------------------------------------------------
// Settlements kept for the primary

#[tokio::test]
async fn a_debt_settled_during_an_outage_is_charged_here_under_the_share() {
    let s = setup(2);
    let bucket = s.tokens_of("ana");
    s.decide(&[bucket]).await;
    s.settle_during_an_outage(bucket).await;
    // 500 per 2 minutes here, 299 of them owed meanwhile.
    let here = bucket.with_quota(bucket.quota().divided(2));
    assert_eq!(s.read(s.store.local(), here).remaining, 201);
    // A refund is kept, and gives nothing here.
    s.store
        .settle(&[bucket.settle(Adjust::Refund(100))])
        .await
        .unwrap();
    assert_eq!(s.store.pending_settlements(), 2);
    assert_eq!(s.read(s.store.local(), here).remaining, 201);
}

#[tokio::test]
async fn the_kept_settlements_are_the_newest_and_each_one_dropped_is_reported()
{
    let s = setup(1);
    s.open("node-a");
    let refund = [s.bucket("ana", 1).settle(Adjust::Refund(1))];
    for _ in 0..PENDING_MAX {
        s.store.settle(&refund).await.unwrap();
    }
    assert_eq!((s.store.pending_settlements(), s.lost()), (PENDING_MAX, 0));
    for _ in 0..2 {
        s.store.settle(&refund).await.unwrap();
    }
    assert_eq!((s.store.pending_settlements(), s.lost()), (PENDING_MAX, 2));
}

/// Runs the tasks spawned so far (the replay of kept settlements), on the
/// test's own runtime; bounded, so a replay that never comes fails.
async fn let_tasks_run() {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn kept_settlements_reach_the_primary_once_its_probe_succeeds() {
    let s = setup(1);
    let bucket = s.tokens_of("ana");
    // Decisions on a healthy primary, with nothing kept, send nothing.
    s.decide(&[bucket]).await;
    let_tasks_run().await;
    assert_eq!(s.primary.most_settling.load(Ordering::SeqCst), 0);

    s.settle_during_an_outage(bucket).await;
    s.clock.advance(Duration::from_secs(1));
    s.decide(&[s.bucket("ana", 1)]).await;
    assert_eq!(s.state_of("node-a"), BreakerState::Closed);
    let_tasks_run().await;
    assert_eq!(s.store.pending_settlements(), 0);
    // The estimate of 1 came back in the second; the 299 more are spent.
    assert_eq!(s.read(&s.primary.store, bucket).remaining, 701);
}

#[tokio::test]
async fn kept_settlements_are_replayed_one_replay_at_a_time() {
    let s = with_primary(
        1,
        Nodes {
            gate: Some(tokio::sync::Semaphore::new(0)),
            ..Nodes::default()
        },
    );
    let bucket = s.bucket("ana", 1);
    let settle = [bucket.settle(Adjust::Charge(1))];
    // A first outage's settlement, kept (without I/O, so never held at
    // the gate here); its replay is held at the gate.
    s.open("node-a");
    assert!(matches!(s.store.settle(&settle).ready(), Some(Ok(()))));
    s.clock.advance(Duration::from_secs(1));
    s.decide(&[bucket]).await;
    let_tasks_run().await;
    assert_eq!(s.primary.settling.load(Ordering::SeqCst), 1);
    // A second outage's, while the first replay is still out: it waits.
    s.open("node-a");
    assert!(matches!(s.store.settle(&settle).ready(), Some(Ok(()))));
    s.clock.advance(Duration::from_secs(1));
    s.decide(&[bucket]).await;
    let_tasks_run().await;
    assert_eq!(s.primary.most_settling.load(Ordering::SeqCst), 1);
    assert_eq!(s.store.pending_settlements(), 1);
    let gate = s.primary.gate.as_ref().unwrap();
    gate.add_permits(2);
    let_tasks_run().await;
    assert_eq!(s.primary.most_settling.load(Ordering::SeqCst), 1);
}
