//! The circuit breaker and the local fallback, with a fake clock and a
//! primary that fails on command: per node, like the nodes of a cluster.
#![allow(clippy::unwrap_used)]

use rate_tier_storage::StorageExt;
use rate_tier_storage::{Adjustment, Answer, Capabilities, Mode};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use BreakerState::{Closed, HalfOpen, Open};
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{
    Adjust, BreakerState, BucketCancel, BucketCheck, BucketSettle, Charged,
    CheckError, Concurrency, Decided, Decision, FallbackStorage, LimitName,
    MemoryStorage, Quota, Rule, RuleKind, Storage, StorageError, StorageEvent,
    Subscription,
};

const START_US: u64 = 1_000_000_000;
const SECOND: u64 = 1_000_000;

/// The two "nodes" of a primary with failure domains: a user whose id
/// starts with `b` lives on node-b, every other on node-a.
const NODES: [&str; 2] = ["node-a", "node-b"];

fn node_of(partition: &str) -> usize {
    usize::from(partition.starts_with('b'))
}

fn takes_slot(check: &BucketCheck<'_>) -> bool {
    matches!(check.rule(), Rule::Concurrency(_)) && check.cost() > 0
}

/// A primary that decides like memory until told to fail, to hang, or to
/// refuse its inputs; per node when built with failure domains.
#[derive(Debug)]
struct Flaky {
    store: MemoryStorage,
    /// Whether the store names failure domains (`NODES`).
    domains: bool,
    /// Each node down (without domains, node 0 is the whole store).
    down: [AtomicBool; 2],
    hang: AtomicBool,
    /// Answers a non-failure error: the inputs refused by the primary.
    refuse: AtomicBool,
    /// Calls of `check`, per node of the first bucket.
    calls: [AtomicUsize; 2],
    settles: AtomicUsize,
    cancels: AtomicUsize,
    /// The lease ids of the slots held here: a release or a renewal goes
    /// by id, as on Redis and PostgreSQL.
    leases: Mutex<HashSet<u64>>,
    /// Slots released and renewed here, by id.
    released: Mutex<Vec<u64>>,
    renewed: Mutex<Vec<u64>>,
}

impl Flaky {
    fn new(clock: &FakeClock, domains: bool) -> Flaky {
        Flaky {
            store: MemoryStorage::with_clock(clock.clone()),
            domains,
            down: Default::default(),
            hang: AtomicBool::new(false),
            refuse: AtomicBool::new(false),
            calls: Default::default(),
            settles: AtomicUsize::new(0),
            cancels: AtomicUsize::new(0),
            leases: Mutex::default(),
            released: Mutex::default(),
            renewed: Mutex::default(),
        }
    }

    fn node(&self, check: &BucketCheck<'_>) -> usize {
        if self.domains {
            node_of(check.partition())
        } else {
            0
        }
    }

    fn set_down(&self, down: bool) {
        self.down[0].store(down, Ordering::SeqCst);
    }

    fn calls(&self) -> usize {
        self.calls.iter().map(|c| c.load(Ordering::SeqCst)).sum()
    }
}

impl Flaky {
    async fn check_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        let first = checks.first().map_or(0, |c| self.node(c));
        self.calls[first].fetch_add(1, Ordering::SeqCst);
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.refuse.load(Ordering::SeqCst) {
            return Err(StorageError::Check(CheckError::TimeOutOfRange));
        }
        if checks
            .iter()
            .any(|c| self.down[self.node(c)].load(Ordering::SeqCst))
        {
            return Err(StorageError::Timeout(Duration::from_millis(100)));
        }
        let decided = self.store.check(checks, out).await?;
        if decided.verdict.allowed {
            let mut leases = self.leases.lock().unwrap();
            for (check, decision) in checks.iter().zip(out.iter()) {
                if takes_slot(check) && decision.allowed {
                    leases.insert(check.lease());
                }
            }
        }
        Ok(Decided::new(decided.verdict, decided.now_us, "flaky"))
    }

    fn decides(&self, _kind: RuleKind) -> bool {
        true
    }

    async fn release_slots(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        if slots
            .iter()
            .any(|c| self.down[self.node(c)].load(Ordering::SeqCst))
        {
            return Err(StorageError::Timeout(Duration::from_millis(100)));
        }
        for check in slots {
            self.released.lock().unwrap().push(check.lease());
            if self.leases.lock().unwrap().remove(&check.lease()) {
                self.store.release(&[*check]).await?;
            }
        }
        Ok(())
    }

    fn slot_lease(&self) -> Option<Duration> {
        Some(Duration::from_secs(30))
    }

    async fn renew_slots(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        let mut renewed = self.renewed.lock().unwrap();
        renewed.extend(slots.iter().map(BucketCheck::lease));
        Ok(())
    }

    async fn settle_buckets(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        self.settles.fetch_add(1, Ordering::SeqCst);
        self.store.settle(settles).await
    }

    async fn reserve_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        max_wait: Duration,
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        let first = checks.first().map_or(0, |c| self.node(c));
        self.calls[first].fetch_add(1, Ordering::SeqCst);
        if checks
            .iter()
            .any(|c| self.down[self.node(c)].load(Ordering::SeqCst))
        {
            return Err(StorageError::Timeout(Duration::from_millis(100)));
        }
        let decided = self.store.reserve(checks, max_wait, out).await?;
        Ok(Decided::new(decided.verdict, decided.now_us, "flaky")
            .with_wait(decided.wait_us))
    }

    async fn cancel_reservations(
        &self,
        reserved: &[BucketCancel<'_>],
    ) -> Result<(), StorageError> {
        self.cancels.fetch_add(1, Ordering::SeqCst);
        self.store.cancel(reserved).await
    }

    fn can_reserve(&self) -> bool {
        true
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
            Mode::Reserve { max_wait } => {
                Answer::pending(self.reserve_buckets(checks, max_wait, out))
            }
        }
    }

    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        match adjustment {
            Adjustment::Settle(settles) => {
                Answer::pending(self.settle_buckets(settles))
            }
            Adjustment::Cancel(reserved) => {
                Answer::pending(self.cancel_reservations(reserved))
            }
            Adjustment::Release(slots) => {
                Answer::pending(self.release_slots(slots))
            }
            Adjustment::Renew(slots) => {
                Answer::pending(self.renew_slots(slots))
            }
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
        capabilities.reserves = self.can_reserve();
        capabilities.lease = self.slot_lease();
        capabilities
    }

    fn failure_domain(&self, check: &BucketCheck<'_>) -> Option<Arc<str>> {
        self.domains.then(|| Arc::from(NODES[self.node(check)]))
    }
}

struct Setup {
    clock: FakeClock,
    primary: Arc<Flaky>,
    store: FallbackStorage,
    events: Arc<Mutex<Vec<StorageEvent>>>,
    _subscription: Subscription,
    plan: LimitName,
    search: LimitName,
}

fn setup(share: u32) -> Setup {
    build(share, false)
}

fn build(share: u32, domains: bool) -> Setup {
    let clock = FakeClock::at_us(START_US);
    let primary = Arc::new(Flaky::new(&clock, domains));
    let store = FallbackStorage::builder(primary.clone())
        .clock(clock.clone())
        .failure_threshold(3)
        .cool_down(Duration::from_secs(1), Duration::from_secs(4))
        .local_share(share)
        .build();
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let subscription = store.subscribe(Arc::new(move |e: &StorageEvent| {
        sink.lock().unwrap().push(e.clone())
    }));
    Setup {
        clock,
        primary,
        store,
        events,
        _subscription: subscription,
        plan: LimitName::new("free").unwrap(),
        search: LimitName::new("search").unwrap(),
    }
}

impl Setup {
    /// One check of `cost` on the tier (10 per minute) of `user`.
    async fn check(&self, user: &str, cost: u32) -> (Decided, Decision) {
        self.try_check(user, cost).await.unwrap()
    }

    async fn try_check(
        &self,
        user: &str,
        cost: u32,
    ) -> Result<(Decided, Decision), StorageError> {
        let checks = [self.bucket(user, cost)];
        let mut out = [Decision::default()];
        let decided = self.store.check(&checks, &mut out).await?;
        Ok((decided, out[0]))
    }

    fn bucket<'a>(&'a self, user: &'a str, cost: u32) -> BucketCheck<'a> {
        BucketCheck::new(&self.plan, user, Quota::per_minute(10), cost).unwrap()
    }

    /// The tier and a `search` limit of 1 per minute, as one decision.
    async fn joint(&self, user: &str) -> (Decided, [Decision; 2]) {
        let checks = [
            self.bucket(user, 1),
            BucketCheck::new(&self.search, user, Quota::per_minute(1), 1)
                .unwrap(),
        ];
        let mut out = [Decision::default(); 2];
        let decided = self.store.check(&checks, &mut out).await.unwrap();
        (decided, out)
    }

    /// Fails `n` checks of `user` against a primary that is down.
    async fn fail(&self, user: &str, n: usize) {
        for _ in 0..n {
            let (decided, _) = self.check(user, 1).await;
            assert_eq!(decided.by, "fallback");
        }
    }

    fn transitions(&self) -> Vec<(BreakerState, BreakerState)> {
        self.breaker_events()
            .into_iter()
            .map(|(_, from, to, _)| (from, to))
            .collect()
    }

    #[allow(clippy::type_complexity)]
    fn breaker_events(
        &self,
    ) -> Vec<(Option<Arc<str>>, BreakerState, BreakerState, Option<String>)>
    {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                StorageEvent::Breaker {
                    domain,
                    from,
                    to,
                    cause,
                } => Some((domain.clone(), *from, *to, cause.clone())),
                _ => None,
            })
            .collect()
    }

    fn fallbacks(&self) -> usize {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| matches!(e, StorageEvent::Fallback { .. }))
            .count()
    }

    fn domain_state(&self, node: usize) -> Option<BreakerState> {
        self.store
            .domain_states()
            .into_iter()
            .find(|(domain, _)| &**domain == NODES[node])
            .map(|(_, state)| state)
    }
}

// ---------------------------------------------------------------------------
// The breaker

#[tokio::test]
async fn opens_after_n_failures_and_never_errors_to_the_caller() {
    let s = setup(1);
    s.primary.set_down(true);
    for _ in 0..2 {
        let (decided, decision) = s.check("ana", 1).await;
        assert!(decided.verdict.allowed && decision.allowed);
        assert_eq!(s.store.state(), Closed);
    }
    assert!(s.check("ana", 1).await.0.verdict.allowed);
    assert_eq!(s.store.state(), Open);
    assert_eq!(s.primary.calls(), 3);
    assert_eq!(s.transitions(), [(Closed, Open)]);
    // The opening says why.
    let (domain, _, _, cause) = s.breaker_events().remove(0);
    assert_eq!(domain, None, "one store, one domain");
    assert!(cause.unwrap().contains("did not answer"));
    // Each failed check was decided locally, and said so.
    assert_eq!(s.fallbacks(), 3);
}

#[tokio::test]
async fn while_open_the_primary_is_not_called_and_limits_hold_locally() {
    let s = setup(1);
    s.primary.set_down(true);
    s.fail("warmup", 3).await;
    assert_eq!(s.store.state(), Open);
    let calls = s.primary.calls();
    let mut allowed = 0;
    for _ in 0..15 {
        // The memory-speed path answers synchronously while open.
        let checks = [s.bucket("ana", 1)];
        let mut out = [Decision::default()];
        let decided =
            s.store.check(&checks, &mut out).ready().unwrap().unwrap();
        assert_eq!(decided.by, "fallback");
        allowed += usize::from(decided.verdict.allowed);
    }
    assert_eq!(allowed, 10, "the local quota is the tier's quota");
    // And through the trait's check: local too.
    let (decided, decision) = s.check("ana", 1).await;
    assert!(!decided.verdict.allowed);
    assert_eq!(
        (decided.by, decision.retry_after_us),
        ("fallback", 6 * SECOND)
    );
    assert_eq!(s.primary.calls(), calls);
}

#[tokio::test]
async fn while_closed_check_local_leaves_the_decision_to_the_primary() {
    let s = setup(1);
    let checks = [s.bucket("ana", 1)];
    let mut out = [Decision::default()];
    assert!(s.store.check(&checks, &mut out).ready().is_none());
    assert_eq!(s.primary.calls(), 0);
}

#[tokio::test]
async fn probe_after_cool_down_closes_when_the_primary_is_back() {
    let s = setup(1);
    s.primary.set_down(true);
    s.fail("ana", 3).await;
    s.primary.set_down(false);
    s.clock.advance(Duration::from_millis(999));
    assert_eq!(s.check("ana", 1).await.0.by, "fallback");
    assert_eq!(s.store.state(), Open, "cool-down not over");
    let calls = s.primary.calls();

    s.clock.advance(Duration::from_millis(1));
    let (decided, _) = s.check("bea", 1).await;
    assert!(decided.verdict.allowed);
    assert_eq!(decided.by, "flaky", "the probe's answer is the primary's");
    assert_eq!(s.primary.calls(), calls + 1);
    assert_eq!(s.store.state(), Closed);
    assert_eq!(
        s.transitions(),
        [(Closed, Open), (Open, HalfOpen), (HalfOpen, Closed)]
    );
    // Closed again: the primary decides.
    assert_eq!(s.check("bea", 1).await.0.by, "flaky");
    assert_eq!(s.primary.calls(), calls + 2);
}

#[tokio::test]
async fn failed_probes_back_off_doubling_up_to_the_cap() {
    let s = setup(1);
    s.primary.set_down(true);
    s.fail("ana", 3).await;
    // Cool-downs: 1 s, then 2 s, then 4 s, then 4 s (the cap).
    for cool_down in [1, 2, 4, 4] {
        let calls = s.primary.calls();
        s.clock
            .advance(Duration::from_secs(cool_down) - Duration::from_micros(1));
        s.check("ana", 1).await;
        assert_eq!(s.primary.calls(), calls, "too early");
        s.clock.advance(Duration::from_micros(1));
        s.check("ana", 1).await;
        assert_eq!(s.primary.calls(), calls + 1, "probe");
        assert_eq!(s.store.state(), Open);
    }
}

#[tokio::test]
async fn a_success_resets_the_failure_count() {
    let s = setup(1);
    for _ in 0..3 {
        s.primary.set_down(true);
        s.check("ana", 1).await;
        s.check("ana", 1).await;
        s.primary.set_down(false);
        assert_eq!(s.check("ana", 1).await.0.by, "flaky");
    }
    assert_eq!(s.store.state(), Closed);
    assert!(s.transitions().is_empty());
}

#[tokio::test]
async fn input_errors_pass_through_and_are_not_failures() {
    let s = setup(1);
    let (plan, user) = (&s.plan, "ana");
    let quota = Quota::per_minute(10);
    let twice = [
        BucketCheck::new(plan, user, quota, 1).unwrap(),
        BucketCheck::peek(plan, user, quota),
    ];
    for _ in 0..5 {
        let mut out = [Decision::default(); 2];
        let error = s.store.check(&twice, &mut out).await.unwrap_err();
        assert!(matches!(error, StorageError::DuplicateBucket), "{error:?}");
        let mut short = [Decision::default()];
        let error = s.store.check(&twice, &mut short).await.unwrap_err();
        assert!(
            matches!(error, StorageError::LengthMismatch { checks: 2, out: 1 }),
            "{error:?}"
        );
    }
    assert_eq!(s.store.state(), Closed);
    assert_eq!(s.primary.calls(), 0, "refused before the primary");
    // The primary refusing the inputs itself is no failure either.
    s.primary.refuse.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        let error = s.try_check(user, 1).await.unwrap_err();
        assert!(matches!(error, StorageError::Check(_)), "{error:?}");
    }
    assert_eq!(s.store.state(), Closed);
    assert_eq!(s.fallbacks(), 0);
}

#[tokio::test]
async fn a_probe_refused_before_reaching_the_primary_does_not_close_it() {
    let s = setup(1);
    s.primary.set_down(true);
    s.fail("ana", 3).await;
    // One failed probe: the next cool-down is 2 s.
    s.clock.advance(Duration::from_secs(1));
    s.check("ana", 1).await;
    s.clock.advance(Duration::from_secs(2));

    // The probe's inputs are refused (the primary learned nothing of its
    // health): the error is the caller's, and the breaker is open again,
    // not closed, and due at once.
    s.primary.refuse.store(true, Ordering::SeqCst);
    let calls = s.primary.calls();
    let error = s.try_check("ana", 1).await.unwrap_err();
    assert!(matches!(error, StorageError::Check(_)), "{error:?}");
    assert_eq!(s.primary.calls(), calls + 1);
    assert_eq!(s.store.state(), Open);
    let after_refusal = [(Open, HalfOpen), (HalfOpen, Open)];
    assert!(
        s.transitions().ends_with(&after_refusal),
        "{:?}",
        s.transitions()
    );
    let (_, _, _, cause) = s.breaker_events().pop().unwrap();
    assert_eq!(cause, None, "a refused input is no failure");

    // Due at once: the next check, at the same instant, probes. It fails,
    // and the back-off goes on from where it was (2 s, now 4 s).
    s.primary.refuse.store(false, Ordering::SeqCst);
    s.check("ana", 1).await;
    assert_eq!(s.primary.calls(), calls + 2, "the next check probed");
    assert_eq!(s.store.state(), Open);
    s.clock
        .advance(Duration::from_secs(4) - Duration::from_micros(1));
    s.check("ana", 1).await;
    assert_eq!(s.primary.calls(), calls + 2, "too early");

    // Back up: the next probe closes it.
    s.primary.set_down(false);
    s.clock.advance(Duration::from_micros(1));
    assert_eq!(s.check("ana", 1).await.0.by, "flaky");
    assert_eq!(s.store.state(), Closed);
}

#[tokio::test]
async fn a_probe_cancelled_mid_flight_does_not_leave_it_half_open() {
    let s = setup(1);
    s.primary.set_down(true);
    s.fail("ana", 3).await;
    s.primary.hang.store(true, Ordering::SeqCst);
    s.clock.advance(Duration::from_secs(1));
    let store = s.store.clone();
    let plan = s.plan.clone();
    let probe = tokio::spawn(async move {
        let checks = [
            BucketCheck::new(&plan, "ana", Quota::per_minute(10), 1).unwrap()
        ];
        let mut out = [Decision::default()];
        store
            .check(&checks, &mut out)
            .await
            .map(|d| d.verdict.allowed)
    });
    // Bounded: a breaker that never turns half-open fails, not hangs.
    for spins in 0.. {
        if s.store.state() == HalfOpen {
            break;
        }
        assert!(
            spins < 1_000_000,
            "the probe never made the breaker half-open"
        );
        tokio::task::yield_now().await;
    }
    // Meanwhile the others decide locally, without waiting for the probe.
    assert_eq!(s.check("bea", 1).await.0.by, "fallback");
    probe.abort();
    assert!(probe.await.unwrap_err().is_cancelled());
    // A cancelled probe is a failed probe: open again, said so, and for
    // twice the cool-down, so that callers who give up early cannot make
    // every request a probe.
    assert_eq!(s.store.state(), Open);
    let (_, from, to, cause) = s.breaker_events().pop().unwrap();
    assert_eq!((from, to), (HalfOpen, Open));
    assert!(cause.unwrap().contains("probe cancelled"));
    s.primary.hang.store(false, Ordering::SeqCst);
    s.primary.set_down(false);
    let calls = s.primary.calls();
    s.clock
        .advance(Duration::from_secs(2) - Duration::from_micros(1));
    s.check("ana", 1).await;
    assert_eq!(s.primary.calls(), calls, "too early");
    s.clock.advance(Duration::from_micros(1));
    s.check("ana", 1).await;
    assert_eq!(s.store.state(), Closed);
}

/// The breaker opens with its deadline in the same atomic step: a check
/// racing the opening never sees it open and already due.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_failures_open_once_and_never_probe_early() {
    let s = Arc::new(setup(1));
    s.primary.set_down(true);
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let user = format!("user-{}", i % 20);
                s.try_check(&user, 1).await.map(|(d, _)| d.by)
            })
        })
        .collect();
    for task in tasks {
        let by = task.await.unwrap();
        assert_eq!(by.ok(), Some("fallback"), "never an error to the caller");
    }
    // The clock never moved: no probe can have been due.
    assert_eq!(s.transitions(), [(Closed, Open)]);
    assert_eq!(s.store.state(), Open);
}

// ---------------------------------------------------------------------------
// Who decided

#[tokio::test]
async fn decided_by_names_the_local_store_or_the_primary() {
    let s = setup(1);
    // The store's label is the primary's (for metrics of the backend)...
    assert_eq!(s.store.kind(), "flaky");
    // ... but each decision says who made it.
    let (decided, _) = s.check("ana", 1).await;
    assert_eq!((decided.by, decided.share), ("flaky", 1));
    s.primary.set_down(true);
    let (decided, _) = s.check("ana", 1).await;
    assert_eq!((decided.by, decided.share), ("fallback", 1));
    assert!(decided.now_us.is_some(), "the local clock decided");
}

// ---------------------------------------------------------------------------
// During an outage: the local share

#[tokio::test]
async fn local_share_divides_the_quota() {
    let s = setup(2);
    s.primary.set_down(true);
    let quota = Quota::per_minute(10);
    let local = quota.divided(2);
    assert_eq!(
        (local.burst(), local.emission_interval_us()),
        (5, 12 * SECOND)
    );
    let mut remaining = Vec::new();
    for _ in 0..10 {
        let (decided, decision) = s.check("ana", 1).await;
        assert_eq!((decided.by, decided.share), ("fallback", 2));
        assert_eq!(decided.applied(0, quota), local);
        if decided.verdict.allowed {
            remaining.push(decision.remaining);
        } else {
            assert_eq!(decision.retry_after_us, 12 * SECOND);
        }
    }
    assert_eq!(remaining, [4, 3, 2, 1, 0], "10/min shared by 2 instances");
    // The primary back, the quota is whole again.
    s.primary.set_down(false);
    s.clock.advance(Duration::from_secs(1));
    let (decided, decision) = s.check("bea", 1).await;
    assert_eq!((decided.by, decided.share), ("flaky", 1));
    assert_eq!(decided.applied(0, quota), quota);
    assert_eq!(decision.remaining, 9);
}

#[tokio::test]
async fn a_cost_above_the_local_share_is_a_transient_error() {
    let s = setup(2);
    // Closed: the primary takes a cost of 6 of 10.
    assert!(s.check("ana", 6).await.0.verdict.allowed);

    // A failing primary: the local store would apply a burst of 5. The
    // request is not refused for good (403): the error says it could pass
    // once the primary is back.
    s.primary.set_down(true);
    let error = s.try_check("bea", 6).await.unwrap_err();
    assert!(
        matches!(error, StorageError::AboveLocalShare { cost: 6, burst: 5 }),
        "{error:?}"
    );
    assert!(!error.is_failure(), "the store is not what failed here");
    s.fail("bea", 2).await;
    assert_eq!(s.store.state(), Open, "the primary's failure still counted");

    // Open: the same, without asking the primary, and nothing charged.
    let calls = s.primary.calls();
    let error = s.try_check("eva", 6).await.unwrap_err();
    assert!(matches!(error, StorageError::AboveLocalShare { .. }));
    let checks = [s.bucket("eva", 6)];
    let mut out = [Decision::default()];
    let local = s.store.check(&checks, &mut out).ready().unwrap();
    assert!(matches!(
        local,
        Err(StorageError::AboveLocalShare { cost: 6, burst: 5 })
    ));
    let (_, decision) = s.check("eva", 5).await;
    assert_eq!((decision.allowed, decision.remaining), (true, 0));
    assert_eq!(s.primary.calls(), calls);
}

#[tokio::test]
async fn a_limit_below_the_share_allows_one_at_once_per_instance_at_the_divided_rate()
 {
    // 2 per minute shared by 3 instances: each allows 1 at once, then one
    // every 90 s (2 per 3 minutes), whatever the others do.
    let quota = Quota::per_minute(2);
    let clock = FakeClock::at_us(START_US);
    let primary = Arc::new(Flaky::new(&clock, false));
    primary.set_down(true);
    let instances: Vec<FallbackStorage> = (0..3)
        .map(|_| {
            FallbackStorage::builder(primary.clone())
                .clock(clock.clone())
                .local_share(3)
                .build()
        })
        .collect();
    let plan = LimitName::new("tiny").unwrap();
    let check = |cost| [BucketCheck::new(&plan, "ana", quota, cost).unwrap()];
    let mut out = [Decision::default()];
    for instance in &instances {
        let decided = instance.check(&check(1), &mut out).await.unwrap();
        assert_eq!((decided.verdict.allowed, decided.share), (true, 3));
        assert_eq!(out[0].remaining, 0);
        let decided = instance.check(&check(1), &mut out).await.unwrap();
        assert!(!decided.verdict.allowed);
        assert_eq!(decided.verdict.retry_after_us, 90 * SECOND);
        // The burst of 2 is a request the primary would take, not this
        // instance alone.
        let error = instance.check(&check(2), &mut out).await.unwrap_err();
        assert!(matches!(
            error,
            StorageError::AboveLocalShare { cost: 2, burst: 1 }
        ));
    }
    clock.advance(Duration::from_micros(90 * SECOND - 1));
    for instance in &instances {
        let decided = instance.check(&check(1), &mut out).await.unwrap();
        assert!(!decided.verdict.allowed);
        assert_eq!(decided.verdict.retry_after_us, 1);
    }
    clock.advance(Duration::from_micros(1));
    for instance in &instances {
        assert!(
            instance
                .check(&check(1), &mut out)
                .await
                .unwrap()
                .verdict
                .allowed
        );
        assert!(
            !instance
                .check(&check(1), &mut out)
                .await
                .unwrap()
                .verdict
                .allowed
        );
    }
}

// ---------------------------------------------------------------------------
// Several limits, peek and settle

#[tokio::test]
async fn joint_decisions_fall_back_as_a_whole() {
    let s = setup(1);
    s.primary.set_down(true);
    // A failing joint decision is one failure, not one per bucket.
    for _ in 0..2 {
        s.joint("warmup").await;
    }
    assert_eq!(s.store.state(), Closed);
    s.joint("warmup").await;
    assert_eq!(s.store.state(), Open);
    let calls = s.primary.calls();

    let (decided, out) = s.joint("ana").await;
    assert!(decided.verdict.allowed);
    assert_eq!(decided.by, "fallback");
    assert_eq!((out[0].remaining, out[1].remaining), (9, 0));
    // The second search: refused by `search`, and the tier not charged.
    let (decided, out) = s.joint("ana").await;
    assert!(!decided.verdict.allowed);
    assert_eq!(decided.verdict.refused_by, Some(1));
    assert_eq!(decided.verdict.retry_after_us, 60 * SECOND);
    assert!(out[0].allowed);
    assert_eq!(out[0].remaining, 9);
    // A peek of the tier, through the fallback: still 9.
    let peek = [BucketCheck::peek(&s.plan, "ana", Quota::per_minute(10))];
    let mut read = [Decision::default()];
    s.store.check(&peek, &mut read).await.unwrap();
    assert_eq!(read[0].remaining, 9);
    assert_eq!(s.primary.calls(), calls, "all of it local");
    // One fallback event per decision, named after its first limit.
    let limits: Vec<String> = s
        .events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            StorageEvent::Fallback { limit, .. } => Some(limit.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(limits, vec!["free".to_owned(); 6]);
}

#[tokio::test]
async fn settle_goes_to_the_primary_when_closed_and_to_the_local_store_when_open()
 {
    let s = setup(2);
    let tokens = LimitName::new("tokens").unwrap();
    let quota = Quota::per_minute(1000);
    let bucket = |user| BucketCheck::new(&tokens, user, quota, 1).unwrap();
    let mut out = [Decision::default()];

    // Closed: estimate 1, actual 100, settled on the primary.
    s.store.check(&[bucket("ana")], &mut out).await.unwrap();
    s.store
        .settle(&[bucket("ana").settle(Adjust::between(1, 100))])
        .await
        .unwrap();
    assert_eq!(s.primary.settles.load(Ordering::SeqCst), 1);
    let peek = |user| [BucketCheck::peek(&tokens, user, quota)];
    s.primary.store.check_sync(&peek("ana"), &mut out).unwrap();
    assert_eq!(out[0].remaining, 900);
    assert!(s.store.local().is_empty());

    // Open: the local store, under the local share (500 per 2 minutes).
    s.primary.set_down(true);
    s.fail("warmup", 3).await;
    let decided = s.store.check(&[bucket("bea")], &mut out).await.unwrap();
    assert_eq!((decided.by, out[0].remaining), ("fallback", 499));
    let charged = decided.charged(0);
    assert_eq!(charged, Charged::Local { share: 2 });
    s.store
        .settle(&[bucket("bea")
            .settle(Adjust::between(1, 100))
            .charged(charged)])
        .await
        .unwrap();
    assert_eq!(
        s.primary.settles.load(Ordering::SeqCst),
        1,
        "primary untouched"
    );
    let local = quota.divided(2);
    s.store
        .local()
        .check_sync(&[BucketCheck::peek(&tokens, "bea", local)], &mut out)
        .unwrap();
    assert_eq!(out[0].remaining, 400);
    // The same through the fallback's own peek.
    let decided = s.store.check(&peek("bea"), &mut out).await.unwrap();
    assert_eq!((decided.by, out[0].remaining), ("fallback", 400));
    // A refund, locally too.
    s.store
        .settle(&[bucket("bea").settle(Adjust::Refund(50)).charged(charged)])
        .await
        .unwrap();
    s.store.check(&peek("bea"), &mut out).await.unwrap();
    assert_eq!(out[0].remaining, 450);
}

#[tokio::test]
async fn a_settlement_goes_to_the_store_that_charged_its_estimate() {
    // Regression: a settlement must not go to whichever store the breaker
    // points at when the response ends. Charged locally during an outage
    // and refunded after it, the primary would be credited tokens it never
    // charged; charged on the primary and settled during an outage, the
    // debt would be lost.
    let s = setup(1);
    let tokens = LimitName::new("tokens").unwrap();
    let quota = Quota::per_minute(1000);
    let bucket = |user| BucketCheck::new(&tokens, user, quota, 1).unwrap();
    let peek = |user| [BucketCheck::peek(&tokens, user, quota)];
    let mut out = [Decision::default()];

    // Ana is charged on the primary; then the primary goes down.
    let on_primary = s.store.check(&[bucket("ana")], &mut out).await.unwrap();
    assert_eq!(on_primary.charged(0), Charged::Primary);
    s.primary.set_down(true);
    s.fail("warmup", 3).await;
    assert_eq!(s.store.state(), Open);
    // Bea is charged locally, during the outage.
    let locally = s.store.check(&[bucket("bea")], &mut out).await.unwrap();
    assert_eq!(locally.charged(0), Charged::Local { share: 1 });

    // Ana's actual cost is 300 while the primary is down: kept for it, and
    // charged locally meanwhile.
    s.store
        .settle(&[bucket("ana")
            .settle(Adjust::between(1, 300))
            .charged(on_primary.charged(0))])
        .await
        .unwrap();
    assert_eq!(s.store.pending_settlements(), 1);
    assert_eq!(s.primary.settles.load(Ordering::SeqCst), 0);

    // The primary comes back; a probe closes the breaker.
    s.primary.set_down(false);
    s.clock.advance(Duration::from_secs(2));
    s.store.check(&[bucket("cai")], &mut out).await.unwrap();
    assert_eq!(s.store.state(), Closed);
    // Bea's estimate is refunded now: to the local store, which charged it.
    s.store
        .settle(&[bucket("bea")
            .settle(Adjust::Refund(1))
            .charged(locally.charged(0))])
        .await
        .unwrap();
    s.primary.store.check_sync(&peek("bea"), &mut out).unwrap();
    assert_eq!(out[0].remaining, 1000, "the primary was credited nothing");
    s.store.local().check_sync(&peek("bea"), &mut out).unwrap();
    assert_eq!(out[0].remaining, 1000, "the local charge was refunded");

    // Ana's debt reached the primary once it answered, as of then: her
    // estimate of 1 had come back in the 2 s, the 299 more are spent.
    for _ in 0..200 {
        if s.store.pending_settlements() == 0
            && s.primary.settles.load(Ordering::SeqCst) == 1
        {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(s.store.pending_settlements(), 0);
    assert_eq!(s.primary.settles.load(Ordering::SeqCst), 1);
    s.primary.store.check_sync(&peek("ana"), &mut out).unwrap();
    assert_eq!(out[0].remaining, 701);
}

// ---------------------------------------------------------------------------
// Several failure domains

#[tokio::test]
async fn each_failure_domain_has_its_own_breaker() {
    let s = build(1, true);
    // node-b fails: its users go local after 3 failures.
    s.primary.down[1].store(true, Ordering::SeqCst);
    s.fail("bea", 3).await;
    assert_eq!(s.domain_state(1), Some(Open));
    assert_ne!(s.domain_state(0), Some(Open));
    assert_eq!(s.store.state(), Open, "open somewhere");
    assert_eq!(
        s.breaker_events(),
        [(
            Some(Arc::from("node-b")),
            Closed,
            Open,
            Some("storage did not answer within 100ms".to_owned())
        )]
    );

    // node-a's users still reach the primary; node-b's do not.
    let (a_calls, b_calls) = (
        s.primary.calls[0].load(Ordering::SeqCst),
        s.primary.calls[1].load(Ordering::SeqCst),
    );
    for _ in 0..5 {
        assert_eq!(s.check("ana", 1).await.0.by, "flaky");
        assert_eq!(s.check("bob", 1).await.0.by, "fallback");
    }
    assert_eq!(s.primary.calls[0].load(Ordering::SeqCst), a_calls + 5);
    assert_eq!(s.primary.calls[1].load(Ordering::SeqCst), b_calls);
    // A decision over buckets of both nodes is mixed: node-a's bucket on
    // the primary, node-b's locally, one decision.
    let checks = [s.bucket("ana", 1), s.bucket("bea", 1)];
    let mut out = [Decision::default(); 2];
    let decided = s.store.check(&checks, &mut out).await.unwrap();
    assert!(decided.verdict.allowed);
    assert_eq!(decided.by, "fallback");
    assert_eq!(
        (decided.charged(0), decided.charged(1)),
        (Charged::Primary, Charged::Local { share: 1 })
    );
    assert_eq!(s.primary.calls[0].load(Ordering::SeqCst), a_calls + 6);
    assert_eq!(s.primary.calls[1].load(Ordering::SeqCst), b_calls);

    // node-a fails too; then it comes back, and its probe closes its own
    // breaker only: node-b's, due as well, waits for a check of its own.
    s.primary.down[0].store(true, Ordering::SeqCst);
    s.fail("ana", 3).await;
    assert_eq!(s.domain_state(0), Some(Open));
    s.primary.down[0].store(false, Ordering::SeqCst);
    s.clock.advance(Duration::from_secs(4));
    assert_eq!(s.check("ana", 1).await.0.by, "flaky");
    assert_eq!(s.domain_state(0), Some(Closed));
    assert_eq!(s.domain_state(1), Some(Open));
    // node-b's probe fails (still down), and only node-b reopens.
    let b_calls = s.primary.calls[1].load(Ordering::SeqCst);
    assert_eq!(s.check("bea", 1).await.0.by, "fallback");
    assert_eq!(s.primary.calls[1].load(Ordering::SeqCst), b_calls + 1);
    assert_eq!(s.domain_state(0), Some(Closed));
    assert_eq!(s.domain_state(1), Some(Open));
    assert_eq!(s.check("ana", 1).await.0.by, "flaky");
    // Every event names its node.
    let per_domain: Vec<(String, BreakerState, BreakerState)> = s
        .breaker_events()
        .into_iter()
        .map(|(domain, from, to, _)| (domain.unwrap().to_string(), from, to))
        .collect();
    let named = |node: &str, from, to| (node.to_owned(), from, to);
    assert_eq!(
        per_domain,
        [
            named("node-b", Closed, Open),
            named("node-a", Closed, Open),
            named("node-a", Open, HalfOpen),
            named("node-a", HalfOpen, Closed),
            named("node-b", Open, HalfOpen),
            named("node-b", HalfOpen, Open),
        ]
    );
    // node-b back: its probe closes it, and every breaker is closed.
    s.primary.down[1].store(false, Ordering::SeqCst);
    s.clock.advance(Duration::from_secs(2));
    assert_eq!(s.check("bea", 1).await.0.by, "flaky");
    assert_eq!(s.store.state(), Closed);
    let mut states = s.store.domain_states();
    states.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        states,
        [(Arc::from("node-a"), Closed), (Arc::from("node-b"), Closed)]
    );
}

#[tokio::test]
async fn a_failure_of_a_decision_over_two_domains_counts_against_both() {
    let s = build(1, true);
    s.primary.down[1].store(true, Ordering::SeqCst);
    let checks = [s.bucket("ana", 1), s.bucket("bea", 1)];
    let mut out = [Decision::default(); 2];
    for _ in 0..3 {
        let decided = s.store.check(&checks, &mut out).await.unwrap();
        assert_eq!(decided.by, "fallback");
    }
    assert_eq!(s.domain_state(0), Some(Open));
    assert_eq!(s.domain_state(1), Some(Open));
}

// ---------------------------------------------------------------------------
// Events

#[tokio::test]
async fn the_primarys_own_events_reach_the_fallbacks_listeners() {
    let clock = FakeClock::at_us(START_US);
    let primary = Arc::new(
        MemoryStorage::builder()
            .clock(clock.clone())
            .capacity(1)
            .build(),
    );
    let store = FallbackStorage::builder(primary.clone())
        .clock(clock)
        .build();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let subscription = store.subscribe({
        let heard = heard.clone();
        Arc::new(move |e: &StorageEvent| heard.lock().unwrap().push(e.clone()))
    });
    let plan = LimitName::new("free").unwrap();
    let mut out = [Decision::default()];
    for user in ["ana", "bea"] {
        let checks = [
            BucketCheck::new(&plan, user, Quota::per_minute(10), 1).unwrap()
        ];
        let decided = store.check(&checks, &mut out).await.unwrap();
        assert_eq!(decided.by, "memory");
    }
    assert_eq!(
        *heard.lock().unwrap(),
        [StorageEvent::Evicted {
            debt_us: 6 * SECOND
        }]
    );
    drop(subscription);
    let checks =
        [BucketCheck::new(&plan, "eva", Quota::per_minute(10), 1).unwrap()];
    store.check(&checks, &mut out).await.unwrap();
    assert_eq!(heard.lock().unwrap().len(), 1, "unsubscribed");
    assert_eq!(primary.evictions(), 2);
}

// ---------------------------------------------------------------------------
// Concurrency limits: each slot goes back to the store that took it

impl Setup {
    /// A slot of `uploads` (2 in flight) for `user`, under `lease`.
    fn slot<'a>(&'a self, user: &'a str, lease: u64) -> BucketCheck<'a> {
        let rule = Rule::from(Concurrency::new(2).unwrap());
        BucketCheck::of_rule(&self.search, user, rule, 1)
            .unwrap()
            .lease_id(lease)
    }

    /// Takes the slot of `lease` for `user`: whether it passed, and where.
    async fn take(&self, user: &str, lease: u64) -> (bool, &'static str) {
        let mut out = [Decision::default()];
        let decided = self
            .store
            .check(&[self.slot(user, lease)], &mut out)
            .await
            .unwrap();
        (decided.verdict.allowed, decided.by)
    }

    async fn release(
        &self,
        user: &str,
        lease: u64,
    ) -> Result<(), StorageError> {
        self.store.release(&[self.slot(user, lease)]).await
    }

    /// Slots of `user` in flight on `store`, read with a check of cost 0.
    fn in_flight(&self, store: &MemoryStorage, user: &str) -> u64 {
        let rule = Rule::from(Concurrency::new(2).unwrap());
        let peek = [BucketCheck::of_rule(&self.search, user, rule, 0).unwrap()];
        let mut out = [Decision::default()];
        store.check_sync(&peek, &mut out).unwrap();
        2 - out[0].remaining
    }

    async fn open(&self) {
        self.primary.set_down(true);
        self.fail("ana", 3).await;
        assert_eq!(self.store.state(), Open);
    }
}

#[tokio::test]
async fn a_slot_taken_on_the_primary_is_released_there() {
    let s = setup(1);
    assert!(
        s.store.supports(RuleKind::Concurrency),
        "the primary's kinds"
    );
    assert_eq!(s.store.capabilities().lease, Some(Duration::from_secs(30)));
    assert_eq!(s.take("ana", 1).await, (true, "flaky"));
    assert_eq!(s.in_flight(&s.primary.store, "ana"), 1);
    assert_eq!(s.store.local_slots(), 0);
    s.store.renew(&[s.slot("ana", 1)]).await.unwrap();
    assert_eq!(*s.primary.renewed.lock().unwrap(), [1]);
    s.release("ana", 1).await.unwrap();
    assert_eq!(s.in_flight(&s.primary.store, "ana"), 0);
    assert_eq!(*s.primary.released.lock().unwrap(), [1]);
}

#[tokio::test]
async fn during_an_outage_slots_are_taken_and_released_locally_by_id() {
    let s = setup(1);
    s.open().await;
    assert_eq!(s.take("ana", 1).await, (true, "fallback"));
    assert_eq!(s.take("ana", 2).await, (true, "fallback"));
    assert_eq!(s.take("ana", 3).await, (false, "fallback"), "2 in flight");
    assert_eq!(s.store.local_slots(), 2);
    assert_eq!(s.in_flight(s.store.local(), "ana"), 2);
    // Local slots are not renewed on the primary, and their release
    // needs no I/O.
    s.store.renew(&[s.slot("ana", 1)]).await.unwrap();
    assert!(s.primary.renewed.lock().unwrap().is_empty());
    assert_eq!(
        s.store.release(&[s.slot("ana", 1)]).ready().map(Result::ok),
        Some(Some(()))
    );
    assert_eq!(s.in_flight(s.store.local(), "ana"), 1);
    // Released twice, the slot frees nothing more: the second release
    // goes to the primary, which does not hold it.
    assert!(s.release("ana", 1).await.is_err(), "the primary is down");
    assert_eq!(s.in_flight(s.store.local(), "ana"), 1);
    assert_eq!(s.take("ana", 4).await, (true, "fallback"));
    assert_eq!(s.take("ana", 5).await, (false, "fallback"));
    assert!(s.primary.released.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_local_slot_goes_back_locally_after_the_primary_is_back() {
    let s = setup(1);
    s.open().await;
    assert_eq!(s.take("ana", 1).await, (true, "fallback"));
    s.primary.set_down(false);
    s.clock.advance(Duration::from_secs(2));
    assert_eq!(s.check("ana", 1).await.0.by, "flaky", "closed again");
    // The primary never saw slot 1: it is released where it was taken.
    s.release("ana", 1).await.unwrap();
    assert_eq!(s.in_flight(s.store.local(), "ana"), 0);
    assert_eq!(s.store.local_slots(), 0);
    assert!(s.primary.released.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_slot_taken_on_the_primary_stays_there_when_the_breaker_opens() {
    let s = setup(1);
    assert_eq!(s.take("ana", 1).await, (true, "flaky"));
    s.open().await;
    // Its release goes to the primary, fails (left to its lease there),
    // and frees nothing locally.
    assert!(s.release("ana", 1).await.is_err());
    assert_eq!(s.in_flight(&s.primary.store, "ana"), 1);
    assert_eq!(s.in_flight(s.store.local(), "ana"), 0);
    assert!(
        s.store.release(&[s.slot("ana", 1)]).ready().is_none(),
        "needs I/O"
    );
}

#[tokio::test]
async fn the_local_share_divides_a_concurrency_limit() {
    let s = setup(2);
    s.open().await;
    assert_eq!(s.take("ana", 1).await, (true, "fallback"));
    assert_eq!(
        s.take("ana", 2).await,
        (false, "fallback"),
        "2 / 2 instances"
    );
    s.release("ana", 1).await.unwrap();
    assert_eq!(s.take("ana", 3).await, (true, "fallback"));
}

#[tokio::test]
async fn a_local_slot_without_a_lease_id_is_an_error_not_a_pass() {
    let s = setup(1);
    s.open().await;
    let mut out = [Decision::default()];
    let error = s
        .store
        .check(&[s.slot("ana", 0)], &mut out)
        .await
        .unwrap_err();
    assert!(matches!(error, StorageError::Unsupported(_)), "{error}");
    assert_eq!(s.in_flight(s.store.local(), "ana"), 0);
}

#[tokio::test]
async fn a_mixed_decision_refused_by_the_primary_gives_the_local_slot_back() {
    let s = build(1, true);
    s.primary.down[1].store(true, Ordering::SeqCst);
    s.fail("bea", 3).await;
    assert_eq!(s.domain_state(1), Some(Open));
    // ana's tier on node-a is spent; bea's slot on node-b is local.
    for _ in 0..10 {
        assert!(s.check("ana", 1).await.1.allowed);
    }
    let checks = [s.bucket("ana", 1), s.slot("bea", 7)];
    let mut out = [Decision::default(); 2];
    let decided = s.store.check(&checks, &mut out).await.unwrap();
    assert!(!decided.verdict.allowed);
    assert_eq!(decided.verdict.refused_by, Some(0));
    assert_eq!(s.in_flight(s.store.local(), "bea"), 0, "given back");
    assert_eq!(out[1].remaining, 2);
    assert_eq!(s.store.local_slots(), 0);
    // Passed, the local slot is held and goes back locally.
    let checks = [s.bucket("bob", 1), s.slot("bea", 8)];
    let decided = s.store.check(&checks, &mut out).await.unwrap();
    assert!(decided.verdict.allowed);
    assert_eq!(s.store.local_slots(), 1);
    s.release("bea", 8).await.unwrap();
    assert_eq!(s.in_flight(s.store.local(), "bea"), 0);
}

/// 10 a second, evenly, waits up to 1 s: the provider's quota of a shaper.
fn even() -> Quota {
    Quota::per_second(10)
        .allow_burst(1)
        .allow_debt(Duration::from_secs(1))
}

impl Setup {
    async fn reserve(&self, user: &str) -> (Decided, Decision) {
        let checks = [BucketCheck::new(&self.plan, user, even(), 1).unwrap()];
        let mut out = [Decision::default()];
        let decided = self
            .store
            .reserve(&checks, Duration::from_secs(1), &mut out)
            .await
            .unwrap();
        (decided, out[0])
    }
}

#[tokio::test]
async fn reservations_are_made_on_the_primary_while_it_answers() {
    let s = setup(2);
    assert!(s.store.capabilities().reserves);
    let (first, _) = s.reserve("ana").await;
    let (second, decision) = s.reserve("ana").await;
    assert_eq!((first.by, second.by), ("flaky", "flaky"));
    assert_eq!((first.wait_us, second.wait_us), (0, 100_000));
    assert_eq!(second.charged(0), Charged::Primary);
    // Given back on the primary.
    let check = BucketCheck::new(&s.plan, "ana", even(), 1).unwrap();
    let cancel = check.cancel(decision.store.unwrap().tat_us);
    s.store.cancel(&[cancel]).await.unwrap();
    assert_eq!(s.primary.cancels.load(Ordering::SeqCst), 1);
    assert_eq!(s.reserve("ana").await.0.wait_us, 100_000);
}

#[tokio::test]
async fn while_the_primary_is_down_reservations_are_local_under_the_share() {
    let s = setup(2);
    s.primary.set_down(true);
    // The first failures go local too: no caller sees an error.
    let mut waits = Vec::new();
    let mut last = None;
    for _ in 0..4 {
        let (decided, decision) = s.reserve("ana").await;
        assert_eq!((decided.by, decided.share), ("fallback", 2));
        assert!(decided.verdict.allowed);
        waits.push(decided.wait_us);
        last = Some((decided, decision));
    }
    assert_eq!(s.store.state(), Open);
    // Two instances share 10 a second: 5 each, one every 200 ms.
    assert_eq!(waits, [0, 200_000, 400_000, 600_000]);
    // Open: no call to the primary, and the local reservation is given
    // back locally, whole, without I/O.
    let calls = s.primary.calls();
    let (decided, decision) = last.unwrap();
    let check = BucketCheck::new(&s.plan, "ana", even(), 1).unwrap();
    let cancel = check
        .cancel(decision.store.unwrap().tat_us)
        .charged(decided.charged(0));
    s.store.cancel(&[cancel]).ready().unwrap().unwrap();
    assert_eq!(s.reserve("ana").await.0.wait_us, 600_000);
    assert_eq!(s.primary.calls(), calls);
    assert_eq!(s.primary.cancels.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_reservation_over_an_open_node_is_local_whole() {
    let s = build(1, true);
    s.primary.down[1].store(true, Ordering::SeqCst);
    s.fail("bea", 3).await;
    assert_eq!(s.domain_state(1), Some(Open));
    let checks = [
        BucketCheck::new(&s.plan, "ana", even(), 1).unwrap(),
        BucketCheck::new(&s.search, "bea", even(), 1).unwrap(),
    ];
    let mut out = [Decision::default(); 2];
    let calls = s.primary.calls();
    let decided = s
        .store
        .reserve(&checks, Duration::from_secs(1), &mut out)
        .await
        .unwrap();
    assert_eq!(decided.by, "fallback");
    assert_eq!(decided.charged(0), Charged::Local { share: 1 });
    assert_eq!(s.primary.calls(), calls, "never split between two clocks");
}

#[tokio::test]
async fn a_fallback_over_a_store_that_does_not_reserve_refuses_at_once() {
    #[derive(Debug)]
    struct Plain(MemoryStorage);
    impl Plain {
        async fn check_buckets(
            &self,
            checks: &[BucketCheck<'_>],
            out: &mut [Decision],
        ) -> Result<Decided, StorageError> {
            self.0.check(checks, out).await
        }
    }

    impl Storage for Plain {
        fn decide<'a>(
            &'a self,
            checks: &'a [BucketCheck<'a>],
            mode: Mode,
            out: &'a mut [Decision],
        ) -> Answer<'a, Decided> {
            match mode {
                Mode::Check => Answer::pending(self.check_buckets(checks, out)),
                Mode::Reserve { .. } => Answer::Ready(Err(
                    StorageError::Unsupported("reservations"),
                )),
            }
        }
    }
    let store =
        FallbackStorage::builder(Arc::new(Plain(MemoryStorage::new()))).build();
    assert!(!store.capabilities().reserves);
    let name = LimitName::new("free").unwrap();
    let checks = [BucketCheck::new(&name, "ana", even(), 1).unwrap()];
    let mut out = [Decision::default()];
    let error = store
        .reserve(&checks, Duration::from_secs(1), &mut out)
        .await
        .unwrap_err();
    assert!(matches!(error, StorageError::Unsupported(_)), "{error}");
}
