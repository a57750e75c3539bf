//! `CellStorage` (src/cells.rs): gcra-core over a store of read and
//! compare-and-swap, against `MemoryStorage`.
//!
//! The property test drives both stores through the same random sequences
//! (checks of every kind with shadows and peeks, settlements, reservations
//! and their cancellations, releases and renewals of slots, resets, the
//! clock moving forward) on fake clocks at the same instants, and asserts
//! the same answers field by field. The one difference it steers around:
//! `CellStorage` leases concurrency slots and `MemoryStorage` does not, so
//! there the lease is longer than any run, and the lease's own behaviour
//! has tests of its own. Slots are released only by the requests that took
//! them (a release by id frees only that id's slots; memory's frees any).
//!
//! Then: two threads hammering one bucket pass exactly the quota; a
//! corrupted cell is a fresh bucket; a store that always loses its
//! compare-and-swap gives `Contended`, a failing one an error and no
//! charge; a refused decision writes nothing. No sleeps: fake clocks, and
//! `MemoryCells` never waits, so its futures are polled once.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use rate_tier_storage::StorageExt;
use rate_tier_storage::cells::{
    CellStorage, CellWrite, Cells, Change, MemoryCells, Snapshot,
};
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{
    Adjust, BucketCheck, Concurrency, Decided, Decision, KeyLayout, LimitName,
    MemoryStorage, Period, PeriodUnit, Quota, Rule, Storage, StorageError,
    Verdict, Window,
};

/// A minute before midnight UTC (2023-11-15): runs cross a day.
const START_US: u64 = 1_700_006_340_000_000;
const DAY: Duration = Duration::from_secs(86_400);

/// The output of a future that never waits (every store here).
fn ready<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("an in-process store waited"),
    }
}

fn names() -> Vec<LimitName> {
    ["plan", "search", "login", "daily", "uploads"]
        .into_iter()
        .map(|name| LimitName::of_limit(name).unwrap())
        .collect()
}

/// The rules of `names()`: two rates, a window, a period, a concurrency
/// limit.
fn rules() -> [Rule; 5] {
    [
        Quota::per_second(4).into(),
        Quota::per_minute(6).into(),
        Window::new(3, Duration::from_secs(2)).unwrap().into(),
        Period::new(5, PeriodUnit::Day, 0).unwrap().into(),
        Concurrency::new(2).unwrap().into(),
    ]
}

const USERS: [&str; 2] = ["ana", "bea"];

#[derive(Debug, Clone)]
enum Op {
    /// `(rule, cost, shadow)`, distinct rules.
    Check(usize, Vec<(usize, u32, bool)>),
    Settle(usize, usize, Adjust),
    /// `(rate, cost)`, distinct rates.
    Reserve(usize, Vec<(usize, u32)>, u64),
    Cancel(usize),
    Release(usize),
    Renew(usize),
    Reset(usize, Vec<usize>),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let cost = prop_oneof![3 => Just(1u32), 1 => 0u32..=3];
    let picks = proptest::collection::vec((cost, any::<bool>(), 0u8..4), 5)
        .prop_map(|picks| {
            let limits = rules().map(|rule| rule.limit());
            picks
                .into_iter()
                .enumerate()
                // About one rule in two, shadow one time in four.
                .filter(|(_, (_, _, pick))| *pick >= 2)
                .map(|(i, (cost, shadow, pick))| {
                    (i, cost.min(limits[i]), shadow && pick == 3)
                })
                .collect::<Vec<_>>()
        })
        .prop_filter("a decision of one bucket or more", |p| !p.is_empty());
    let user = 0..USERS.len();
    let adjust = prop_oneof![
        (0u32..5).prop_map(Adjust::Charge),
        (0u32..5).prop_map(Adjust::Refund)
    ];
    let rates = proptest::collection::vec((any::<bool>(), 1u32..=2), 2)
        .prop_map(|rates| {
            rates
                .into_iter()
                .enumerate()
                .filter(|(_, (pick, _))| *pick)
                .map(|(i, (_, cost))| (i, cost))
                .collect::<Vec<_>>()
        })
        .prop_filter("a reservation of one rate or more", |r| !r.is_empty());
    prop_oneof![
        8 => (user.clone(), picks).prop_map(|(u, p)| Op::Check(u, p)),
        2 => (user.clone(), 0usize..2, adjust).prop_map(|(u, r, a)| Op::Settle(u, r, a)),
        2 => (user.clone(), rates, 0u64..20_000).prop_map(|(u, r, w)| Op::Reserve(u, r, w)),
        1 => any::<usize>().prop_map(Op::Cancel),
        2 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Renew),
        1 => (user, proptest::collection::vec(0usize..5, 1..3))
            .prop_map(|(u, mut r)| { r.sort_unstable(); r.dedup(); Op::Reset(u, r) }),
        4 => prop_oneof![6 => 0u64..3_000, 1 => 0u64..3_600_000].prop_map(Op::Advance),
    ]
}

/// What a store answered, without who answered.
#[derive(Debug, PartialEq)]
struct Answer {
    verdict: Verdict,
    now_us: Option<u64>,
    wait_us: u64,
    store_clock_us: Option<u64>,
    out: Vec<Decision>,
}

fn answer(
    decided: Result<Decided, StorageError>,
    out: &[Decision],
) -> Result<Answer, String> {
    decided
        .map(|d| Answer {
            verdict: d.verdict,
            now_us: d.now_us,
            wait_us: d.wait_us,
            store_clock_us: d.store_clock_us,
            out: out.to_vec(),
        })
        .map_err(|error| error.to_string())
}

/// Both stores through `ops`, asserting the same answers.
fn same_answers(ops: &[Op]) -> Result<(), TestCaseError> {
    let (names, rules) = (names(), rules());
    let memory_clock = FakeClock::at_us(START_US);
    let cells_clock = FakeClock::at_us(START_US);
    let memory = MemoryStorage::with_clock(memory_clock.clone());
    let cells = CellStorage::builder(MemoryCells::new())
        .clock(cells_clock.clone())
        // Longer than any run: memory's slots never expire.
        .lease(Some(30 * DAY))
        .build();
    let stores: [&dyn Storage; 2] = [&memory, &cells];
    let bucket = |user: usize, rule: usize, cost: u32| {
        BucketCheck::of_rule(&names[rule], USERS[user], rules[rule], cost)
            .unwrap()
    };
    // (user, rate, cost, tat), (user, cost, id).
    let mut reserved: Vec<(usize, usize, u32, u64)> = Vec::new();
    let mut held: Vec<(usize, u32, u64)> = Vec::new();
    let mut next_id = 1u64;
    for op in ops {
        match op {
            Op::Check(user, picks) => {
                let id = next_id;
                next_id += 1;
                let checks: Vec<BucketCheck<'_>> = picks
                    .iter()
                    .map(|&(rule, cost, shadow)| {
                        bucket(*user, rule, cost).shadow(shadow).lease_id(id)
                    })
                    .collect();
                let answers = stores.map(|store| {
                    let mut out = vec![Decision::default(); checks.len()];
                    let decided = ready(store.check(&checks, &mut out));
                    answer(decided, &out)
                });
                prop_assert_eq!(&answers[0], &answers[1], "{:?}", op);
                if let Ok(Answer { verdict, out, .. }) = &answers[0]
                    && verdict.allowed
                {
                    for (check, decision) in checks.iter().zip(out) {
                        if matches!(check.rule(), Rule::Concurrency(_))
                            && decision.allowed
                            && check.cost() > 0
                        {
                            held.push((*user, check.cost(), id));
                        }
                    }
                }
            }
            Op::Settle(user, rate, adjust) => {
                let settle = [bucket(*user, *rate, 0).settle(*adjust)];
                let answers = stores.map(|store| {
                    ready(store.settle(&settle)).map_err(|e| e.to_string())
                });
                prop_assert_eq!(&answers[0], &answers[1], "{:?}", op);
            }
            Op::Reserve(user, rates, max_wait_ms) => {
                let checks: Vec<BucketCheck<'_>> = rates
                    .iter()
                    .map(|&(rate, cost)| bucket(*user, rate, cost))
                    .collect();
                let max_wait = Duration::from_millis(*max_wait_ms);
                let answers = stores.map(|store| {
                    let mut out = vec![Decision::default(); checks.len()];
                    let decided =
                        ready(store.reserve(&checks, max_wait, &mut out));
                    answer(decided, &out)
                });
                prop_assert_eq!(&answers[0], &answers[1], "{:?}", op);
                if let Ok(Answer { verdict, out, .. }) = &answers[0]
                    && verdict.allowed
                {
                    for ((rate, cost), decision) in rates.iter().zip(out) {
                        if let Some(store) = decision.store {
                            reserved.push((*user, *rate, *cost, store.tat_us));
                        }
                    }
                }
            }
            Op::Cancel(pick) if !reserved.is_empty() => {
                let (user, rate, cost, tat) =
                    reserved.remove(pick % reserved.len());
                let cancel = [bucket(user, rate, cost).cancel(tat)];
                let answers = stores.map(|store| {
                    ready(store.cancel(&cancel)).map_err(|e| e.to_string())
                });
                prop_assert_eq!(&answers[0], &answers[1], "{:?}", op);
            }
            Op::Release(pick) if !held.is_empty() => {
                let (user, cost, id) = held.remove(pick % held.len());
                let slots = [bucket(user, 4, cost).lease_id(id)];
                let answers = stores.map(|store| {
                    ready(store.release(&slots)).map_err(|e| e.to_string())
                });
                prop_assert_eq!(&answers[0], &answers[1], "{:?}", op);
            }
            Op::Renew(pick) if !held.is_empty() => {
                let (user, cost, id) = held[pick % held.len()];
                let slots = [bucket(user, 4, cost).lease_id(id)];
                let answers = stores.map(|store| {
                    ready(store.renew(&slots)).map_err(|e| e.to_string())
                });
                prop_assert_eq!(&answers[0], &answers[1], "{:?}", op);
            }
            Op::Reset(user, picked) => {
                let buckets: Vec<BucketCheck<'_>> =
                    picked.iter().map(|&rule| bucket(*user, rule, 0)).collect();
                let answers = stores.map(|store| {
                    ready(store.reset(&buckets)).map_err(|e| e.to_string())
                });
                prop_assert_eq!(&answers[0], &answers[1], "{:?}", op);
            }
            Op::Advance(ms) => {
                memory_clock.advance(Duration::from_millis(*ms));
                cells_clock.advance(Duration::from_millis(*ms));
            }
            Op::Cancel(_) | Op::Release(_) | Op::Renew(_) => {}
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 400,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn cell_storage_answers_as_memory_storage(
        ops in proptest::collection::vec(op(), 1..60)
    ) {
        same_answers(&ops)?;
    }
}

// ---------------------------------------------------------------------------
// Stores that misbehave, around `MemoryCells`.

/// Counts the writes it passes on.
#[derive(Debug, Default)]
struct Counting {
    inner: MemoryCells,
    writes: AtomicU32,
}

#[async_trait::async_trait]
impl Cells for Counting {
    async fn read(
        &self,
        keys: &[String],
    ) -> Result<Vec<Option<Snapshot>>, StorageError> {
        self.inner.read(keys).await
    }

    async fn write_if(
        &self,
        writes: &[CellWrite<'_>],
    ) -> Result<bool, StorageError> {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.inner.write_if(writes).await
    }
}

/// Loses every compare-and-swap, or fails every write.
#[derive(Debug, Default)]
struct Broken {
    inner: Arc<MemoryCells>,
    fails: bool,
    tries: AtomicU32,
}

#[async_trait::async_trait]
impl Cells for Broken {
    async fn read(
        &self,
        keys: &[String],
    ) -> Result<Vec<Option<Snapshot>>, StorageError> {
        self.inner.read(keys).await
    }

    async fn write_if(
        &self,
        _: &[CellWrite<'_>],
    ) -> Result<bool, StorageError> {
        self.tries.fetch_add(1, Ordering::Relaxed);
        if self.fails {
            Err(StorageError::Backend("connection reset".into()))
        } else {
            Ok(false)
        }
    }
}

fn one(
    store: &dyn Storage,
    check: BucketCheck<'_>,
) -> Result<Decision, StorageError> {
    let mut out = [Decision::default()];
    ready(store.check(&[check], &mut out))?;
    Ok(out[0])
}

#[test]
fn two_threads_on_one_bucket_pass_exactly_the_quota() {
    let store = Arc::new(
        CellStorage::builder(MemoryCells::new())
            .clock(FakeClock::at_us(START_US))
            .build(),
    );
    let plan = LimitName::new("free").unwrap();
    let daily = LimitName::of_limit("daily").unwrap();
    let login = LimitName::of_limit("login").unwrap();
    let uploads = LimitName::of_limit("uploads").unwrap();
    let cases: [(&LimitName, Rule, u32); 4] = [
        (&plan, Quota::per_minute(50).into(), 50),
        (
            &daily,
            Period::new(40, PeriodUnit::Day, 0).unwrap().into(),
            40,
        ),
        (
            &login,
            Window::new(30, Duration::from_secs(60)).unwrap().into(),
            30,
        ),
        (&uploads, Concurrency::new(20).unwrap().into(), 20),
    ];
    for (name, rule, quota) in cases {
        let start = Arc::new(Barrier::new(2));
        let passed: u32 = thread::scope(|scope| {
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let (store, start) =
                        (Arc::clone(&store), Arc::clone(&start));
                    scope.spawn(move || {
                        let check =
                            BucketCheck::of_rule(name, "ana", rule, 1).unwrap();
                        start.wait();
                        (0..200)
                            .filter(|_| one(&*store, check).unwrap().allowed)
                            .count() as u32
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).sum()
        });
        assert_eq!(passed, quota, "{}", name);
    }
}

#[test]
fn a_corrupted_cell_is_a_fresh_bucket() {
    let cells = Arc::new(MemoryCells::new());
    let store =
        CellStorage::with_clock(Arc::clone(&cells), FakeClock::at_us(START_US));
    let name = LimitName::of_limit("any").unwrap();
    let rules = rules();
    let garbage: [&[u8]; 6] = [
        b"",
        b"\x01",
        b"\x02abc",
        b"\x03\x00",
        b"\x04\xff\xff",
        b"\x09rubbish",
    ];
    for (rule, bytes) in rules.iter().zip(garbage.iter().cycle().skip(1)) {
        for bytes in [*bytes, &[0xff; 9][..], &rate_cell(u64::MAX)[..]] {
            let check = BucketCheck::of_rule(&name, "ana", *rule, 1).unwrap();
            let key = check.key(KeyLayout::Single);
            let read = ready(cells.read(std::slice::from_ref(&key))).unwrap();
            let write = CellWrite {
                key: &key,
                expected: read[0].as_ref().map(|cell| cell.version),
                change: Change::Put {
                    value: bytes.to_vec(),
                    ttl_ms: 0,
                },
            };
            assert!(ready(cells.write_if(&[write])).unwrap());
            let decision = one(&store, check).unwrap();
            assert!(decision.allowed, "{rule:?} over {bytes:?}");
            assert_eq!(
                decision.remaining,
                u64::from(rule.limit() - 1),
                "{rule:?} over {bytes:?}"
            );
            // Replaced by a state of its kind.
            let after = ready(cells.read(std::slice::from_ref(&key))).unwrap();
            assert_ne!(after[0].as_ref().unwrap().value, bytes);
            ready(store.reset(&[check])).unwrap();
            if matches!(rule, Rule::Concurrency(_)) {
                ready(store.release(&[check])).unwrap();
            }
        }
    }
}

/// A rate's cell holding `tat`: the tag, then the TAT.
fn rate_cell(tat: u64) -> Vec<u8> {
    let mut bytes = vec![1];
    bytes.extend_from_slice(&tat.to_le_bytes());
    bytes
}

#[test]
fn a_store_that_always_loses_its_compare_and_swap_gives_contended() {
    let broken = Broken::default();
    let store = CellStorage::builder(broken)
        .clock(FakeClock::at_us(START_US))
        .build();
    let name = LimitName::new("free").unwrap();
    let check =
        BucketCheck::new(&name, "ana", Quota::per_minute(10), 1).unwrap();
    let error = one(&store, check).unwrap_err();
    assert!(
        matches!(error, StorageError::Contended { attempts: 64 }),
        "{error:?}"
    );
    assert!(!error.is_failure(), "contention is no outage");
    assert_eq!(store.cells().tries.load(Ordering::Relaxed), 64);
    assert!(store.cells().inner.is_empty(), "nothing was charged");
}

#[test]
fn a_failing_store_gives_an_error_and_charges_nothing() {
    let cells = Arc::new(MemoryCells::new());
    let clock = FakeClock::at_us(START_US);
    let broken = Broken {
        inner: Arc::clone(&cells),
        fails: true,
        ..Broken::default()
    };
    let failing = CellStorage::with_clock(broken, clock.clone());
    let working = CellStorage::with_clock(Arc::clone(&cells), clock);
    let name = LimitName::new("free").unwrap();
    let check =
        BucketCheck::new(&name, "ana", Quota::per_minute(10), 3).unwrap();
    let error = one(&failing, check).unwrap_err();
    assert!(error.is_failure(), "{error:?}");
    assert_eq!(
        failing.cells().tries.load(Ordering::Relaxed),
        1,
        "an error is not retried"
    );
    assert!(cells.is_empty());
    let peek = one(&working, check.as_peek()).unwrap();
    assert_eq!(peek.remaining, 10);
}

#[test]
fn a_refused_decision_writes_nothing() {
    let store = CellStorage::with_clock(
        Counting::default(),
        FakeClock::at_us(START_US),
    );
    let (plan, search) = (
        LimitName::new("free").unwrap(),
        LimitName::of_limit("search").unwrap(),
    );
    let login = LimitName::of_limit("login").unwrap();
    let checks = [
        BucketCheck::new(&plan, "ana", Quota::per_minute(10), 1).unwrap(),
        BucketCheck::new(&search, "ana", Quota::per_minute(1), 1).unwrap(),
        BucketCheck::of_rule(
            &login,
            "ana",
            Window::new(5, Duration::from_secs(60)).unwrap().into(),
            1,
        )
        .unwrap(),
    ];
    let mut out = [Decision::default(); 3];
    assert!(
        ready(store.check(&checks, &mut out))
            .unwrap()
            .verdict
            .allowed
    );
    let writes = store.cells().writes.load(Ordering::Relaxed);
    let keys: Vec<String> =
        checks.iter().map(|c| c.key(KeyLayout::Single)).collect();
    let before = ready(store.cells().read(&keys)).unwrap();

    let refused = ready(store.check(&checks, &mut out)).unwrap();
    assert_eq!(refused.verdict.refused_by, Some(1));
    // The tier and the window would have passed: they say so, uncharged.
    assert!(out[0].allowed && out[2].allowed);
    assert_eq!((out[0].remaining, out[2].remaining), (9, 4));
    assert_eq!(store.cells().writes.load(Ordering::Relaxed), writes);
    assert_eq!(ready(store.cells().read(&keys)).unwrap(), before);
}

#[test]
fn a_slot_not_renewed_expires_after_the_lease_and_a_renewed_one_lives_on() {
    let clock = FakeClock::at_us(START_US);
    let store = CellStorage::builder(MemoryCells::new())
        .clock(clock.clone())
        .lease(Some(Duration::from_secs(30)))
        .build();
    let uploads = LimitName::of_limit("uploads").unwrap();
    let rule: Rule = Concurrency::new(2).unwrap().into();
    let slot = |id| {
        BucketCheck::of_rule(&uploads, "ana", rule, 1)
            .unwrap()
            .lease_id(id)
    };
    assert!(one(&store, slot(1)).unwrap().allowed);
    assert!(one(&store, slot(2)).unwrap().allowed);
    assert!(!one(&store, slot(3)).unwrap().allowed, "two in flight");

    clock.advance(Duration::from_secs(20));
    ready(store.renew(&[slot(2)])).unwrap();
    clock.advance(Duration::from_secs(15));
    // The first expired; the second, renewed, still holds its slot.
    let third = one(&store, slot(3)).unwrap();
    assert_eq!((third.allowed, third.remaining), (true, 0));
    ready(store.release(&[slot(2)])).unwrap();
    assert!(one(&store, slot(4)).unwrap().allowed);
    // A release of an id that holds nothing frees nothing.
    ready(store.release(&[slot(9)])).unwrap();
    assert!(!one(&store, slot(5)).unwrap().allowed);
}

#[test]
fn a_reservation_and_its_cancellation_give_back_the_slot() {
    let store =
        CellStorage::with_clock(MemoryCells::new(), FakeClock::at_us(START_US));
    let name = LimitName::new("provider").unwrap();
    let quota = Quota::per_second(10).allow_burst(1);
    let check = [BucketCheck::new(&name, "", quota, 1).unwrap()];
    let mut out = [Decision::default()];
    let max_wait = Duration::from_secs(1);
    let first = ready(store.reserve(&check, max_wait, &mut out)).unwrap();
    let second = ready(store.reserve(&check, max_wait, &mut out)).unwrap();
    assert_eq!((first.wait_us, second.wait_us), (0, 100_000));
    let tat = out[0].store.unwrap().tat_us;
    ready(store.cancel(&[check[0].cancel(tat)])).unwrap();
    let again = ready(store.reserve(&check, max_wait, &mut out)).unwrap();
    assert_eq!(
        again.wait_us, 100_000,
        "the cancelled slot is handed out again"
    );
    let windows = LimitName::of_limit("w").unwrap();
    let window = BucketCheck::of_rule(
        &windows,
        "",
        Window::new(1, max_wait).unwrap().into(),
        1,
    )
    .unwrap();
    assert!(matches!(
        ready(store.reserve(&[window], max_wait, &mut out)),
        Err(StorageError::Unsupported(_))
    ));
}
