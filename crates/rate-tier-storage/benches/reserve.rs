//! A reservation (`StorageExt::reserve`) against a check (`StorageExt::check`)
//! of the same buckets, in memory and on Redis, side by side in one run:
//! what a shaped call costs over a limited one.
//!
//! Every reservation measured never waits: the quota is roomy (1 per µs
//! with a burst of about 71 minutes, limits.rs's quota), the most the
//! caller waits is 0, and every call is asserted to be reserved with a
//! wait of 0 (a reservation that waited, or was refused, would measure
//! something else; the bench never sleeps). Before any group, a probe on
//! the same store asserts that a reservation really charges its buckets:
//! with a tight quota (1 a second, a burst of 1), a reservation of wait 0
//! passes, a check right after it is refused, and a second reservation
//! of wait 0 is refused with the wait it would have needed (about 1 s),
//! for one bucket and for two (all or nothing); in memory, on a clock
//! standing still, two reservations of the roomy quota leave one fewer
//! remaining each.
//!
//! Each group measures four cases, one after the other on the same store
//! and the same buckets: `check` and `reserve` of one bucket, and
//! `check_2` and `reserve_2` of two limits of the same user in one call
//! (all or nothing). Each call builds its checks (`BucketCheck::new`, as a
//! limiter builds them per request).
//!
//! # Memory
//!
//! On `MemoryStorage::check_sync` and `MemoryStorage::reserve_sync`, with
//! a `FakeClock` set forward by one step before every call, as `kinds.rs`
//! runs it: one hot user (`reserve/memory_one_user`, a step of 1 ms) and
//! 100,000 users round-robin (`reserve/memory_100k_users`, a step of
//! 10 µs), every bucket made before it is measured.
//!
//! # Redis
//!
//! With `--features redis` and `TRT_REDIS_URL` set (`cargo xtask bench`
//! starts a throwaway Redis and sets it), the same cases on `RedisStorage`
//! (one multiplexed connection, a timeout of 5 s) on a current-thread
//! Tokio runtime, each iteration timed by itself (`iter_custom`): a check
//! of one bucket is one `EVALSHA` of `gcra.lua`, of two one of
//! `gcra_all.lua`; a reservation one of `reserve.lua`, sent from a task
//! of its own (as `RedisStorage` sends it, so that a caller that goes
//! away leaves the task to give the slot back). One hot user
//! (`reserve/redis_one_user`) and 1,000 users round-robin
//! (`reserve/redis_1k_users`), each case warmed for 300 ms. The limit
//! names carry the process's id and start time, so that no run reads
//! another's keys; the keys expire by themselves within seconds.
//!
//! # Running it
//!
//! ```text
//! cargo bench -p rate-tier-storage --bench reserve -- --quick
//! TRT_REDIS_URL=redis://127.0.0.1:PORT/ cargo bench -p rate-tier-storage \
//!     --features redis --bench reserve -- --quick
//! ```
//!
//! The rows "a reservation vs a check" (goal ≤ 1.2) and "a joint
//! reservation of 2 vs a joint check of 2" (info) are read by xtask
//! (`rows.rs`, `RESERVE_GROUPS`).
#![allow(clippy::unwrap_used, missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{
    BucketCheck, Decided, Decision, LimitName, MemoryStorage, Quota,
};

const USERS: usize = 100_000;
/// 2026-01-01T00:00:00Z, in µs.
const START_US: u64 = 1_767_225_600_000_000;

/// The quota measured: never makes a call wait, never refuses.
fn roomy() -> Quota {
    Quota::per_second(1_000_000).allow_burst(u32::MAX)
}

/// The probe's quota: one a second, no burst, so that a charge shows.
fn tight() -> Quota {
    Quota::per_second(1)
        .allow_burst(1)
        .allow_debt(Duration::from_secs(10))
}

/// The cases of every group: (bench, buckets, a reservation).
const CASES: [(&str, usize, bool); 4] = [
    ("check", 1, false),
    ("reserve", 1, true),
    ("check_2", 2, false),
    ("reserve_2", 2, true),
];

/// Asserts what a measured call answered: passed, and for a
/// reservation, reserved without a wait.
#[inline(always)]
fn assert_passed(decided: &Decided, reserve: bool) {
    assert!(decided.verdict.allowed, "refused (reserve: {reserve})");
    if reserve {
        assert_eq!(decided.wait_us, 0, "a reservation that waits");
    }
}

/// Asserts that a reservation charges its buckets (see the module
/// docs): `reserve` and `check` are the store's, on `names` and a
/// partition of their own, with the tight quota.
fn assert_reservations_charge(
    names: &[LimitName; 2],
    partition: &str,
    mut reserve: impl FnMut(
        &[BucketCheck<'_>],
        Duration,
        &mut [Decision],
    ) -> Decided,
    mut check: impl FnMut(&[BucketCheck<'_>], &mut [Decision]) -> Decided,
) {
    for n in [1, 2] {
        let part = format!("{partition}-{n}");
        let checks: Vec<BucketCheck<'_>> = names[..n]
            .iter()
            .map(|name| BucketCheck::new(name, &part, tight(), 1).unwrap())
            .collect();
        let mut out = vec![Decision::default(); n];
        let first = reserve(&checks, Duration::ZERO, &mut out);
        assert!(first.verdict.allowed, "the probe's first reservation");
        assert_eq!(first.wait_us, 0);
        for (i, check_one) in checks.iter().enumerate() {
            let mut one = [Decision::default()];
            let after = check(std::slice::from_ref(check_one), &mut one);
            assert!(
                !after.verdict.allowed,
                "a check after a reservation of {n} passed in bucket {i}: \
                 the reservation charged nothing"
            );
        }
        let second = reserve(&checks, Duration::ZERO, &mut out);
        assert!(!second.verdict.allowed, "a second slot without a wait");
        assert!(
            second.wait_us > 900_000,
            "a second reservation would wait {} µs",
            second.wait_us
        );
    }
}

/// One memory group's store and loop.
struct Case {
    store: MemoryStorage,
    clock: FakeClock,
    names: [LimitName; 2],
    now_us: u64,
    step_us: u64,
    next: usize,
}

impl Case {
    fn new(step_us: u64) -> Case {
        let clock = FakeClock::at_us(START_US);
        Case {
            store: MemoryStorage::builder().clock(clock.clone()).build(),
            clock,
            names: [
                LimitName::new("plan").unwrap(),
                LimitName::new("route").unwrap(),
            ],
            now_us: START_US,
            step_us,
            next: 0,
        }
    }

    /// The next user, the clock a step on, one decision over `N`
    /// buckets: a reservation of wait 0 or a check.
    #[inline(always)]
    fn call<const N: usize>(
        &mut self,
        users: &[String],
        reserve: bool,
    ) -> Decision {
        self.next = (self.next + 1) % users.len();
        self.now_us += self.step_us;
        self.clock.set_us(self.now_us);
        let user = black_box(&users[self.next]);
        let checks: [BucketCheck<'_>; N] = std::array::from_fn(|i| {
            BucketCheck::new(&self.names[i], user, roomy(), 1).unwrap()
        });
        let mut out = [Decision::default(); N];
        let decided = if reserve {
            self.store.reserve_sync(&checks, Duration::ZERO, &mut out)
        } else {
            self.store.check_sync(&checks, &mut out)
        }
        .unwrap();
        assert_passed(&decided, reserve);
        out[0]
    }

    fn case(
        &mut self,
        users: &[String],
        buckets: usize,
        reserve: bool,
    ) -> Decision {
        match buckets {
            1 => self.call::<1>(users, reserve),
            _ => self.call::<2>(users, reserve),
        }
    }

    /// The probes of the module docs, on this store.
    fn probe(&self) {
        assert_reservations_charge(
            &self.names,
            "probe",
            |checks, wait, out| {
                self.store.reserve_sync(checks, wait, out).unwrap()
            },
            |checks, out| self.store.check_sync(checks, out).unwrap(),
        );
        // The roomy quota on a clock standing still: each reservation
        // takes one from what remains.
        let check =
            [BucketCheck::new(&self.names[0], "still", roomy(), 1).unwrap()];
        let mut out = [Decision::default()];
        let remaining: Vec<u64> = (0..3)
            .map(|_| {
                let decided =
                    self.store.reserve_sync(&check, Duration::ZERO, &mut out);
                assert_passed(&decided.unwrap(), true);
                out[0].remaining
            })
            .collect();
        assert_eq!(
            [remaining[0] - remaining[1], remaining[1] - remaining[2]],
            [1, 1],
            "the roomy reservations did not charge: {remaining:?}"
        );
    }
}

fn reserve(c: &mut Criterion) {
    let users: Vec<String> =
        (0..USERS).map(|i| format!("user-{i:08}")).collect();
    for (group, spread, step_us) in
        [("one_user", 1, 1_000), ("100k_users", USERS, 10)]
    {
        let users = &users[..spread];
        let mut bench = Case::new(step_us);
        bench.probe();
        // Every bucket made, for both limits.
        for _ in 0..spread {
            bench.call::<2>(users, false);
        }
        let mut group = c.benchmark_group(format!("reserve/memory_{group}"));
        for (case, buckets, reserve) in CASES {
            group.bench_function(case, |b| {
                b.iter(|| bench.case(users, buckets, reserve))
            });
        }
        group.finish();
    }
    redis::reserve(c, &users);
}

criterion_group!(benches, reserve);
criterion_main!(benches);

/// The Redis groups (see the module docs).
#[cfg(feature = "redis")]
mod redis {
    use std::hint::black_box;
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use criterion::Criterion;
    use rate_tier_storage::StorageExt;
    use rate_tier_storage::{
        BucketCheck, Decision, LimitName, RedisStorage, Storage,
    };
    use tokio::runtime::Runtime;

    use super::{CASES, assert_passed, assert_reservations_charge, roomy};

    /// The environment variable of the Redis to run on.
    const URL_VAR: &str = "TRT_REDIS_URL";
    /// How long each case runs before criterion measures it.
    const WARM_UP: Duration = Duration::from_millis(300);

    /// One group's store and loop on Redis.
    struct Case {
        store: RedisStorage,
        names: [LimitName; 2],
        next: usize,
    }

    impl Case {
        fn new(group: &str, run: &str, url: &str) -> Case {
            let store = RedisStorage::from_url(url)
                .unwrap()
                .timeout(Duration::from_secs(5));
            let name = |limit: &str| {
                LimitName::new(format!("reserve-{limit}-{group}-{run}"))
                    .unwrap()
            };
            Case {
                store,
                names: [name("plan"), name("route")],
                next: 0,
            }
        }

        /// One call over `buckets` buckets of the next user: the time it
        /// took.
        async fn call(
            &mut self,
            users: &[String],
            buckets: usize,
            reserve: bool,
        ) -> Duration {
            self.next = (self.next + 1) % users.len();
            let start = Instant::now();
            let user = black_box(&users[self.next]);
            let checks = [
                BucketCheck::new(&self.names[0], user, roomy(), 1).unwrap(),
                BucketCheck::new(&self.names[1], user, roomy(), 1).unwrap(),
            ];
            let checks = &checks[..buckets];
            let mut out = [Decision::default(); 2];
            let out = &mut out[..buckets];
            let decided = if reserve {
                self.store.reserve(checks, Duration::ZERO, out).await
            } else {
                self.store.check(checks, out).await
            }
            .unwrap();
            let took = start.elapsed();
            assert_passed(&decided, reserve);
            black_box(out[0]);
            took
        }

        /// `calls` calls of a case, on the runtime.
        fn run(
            &mut self,
            runtime: &Runtime,
            users: &[String],
            (buckets, reserve): (usize, bool),
            calls: usize,
        ) {
            runtime.block_on(async {
                for _ in 0..calls {
                    self.call(users, buckets, reserve).await;
                }
            });
        }

        /// Warm: the connection, the server and this machine busy, as
        /// criterion's quick mode has no warm-up of its own.
        fn warm(
            &mut self,
            runtime: &Runtime,
            users: &[String],
            case: (usize, bool),
        ) {
            let warm = Instant::now();
            while warm.elapsed() < WARM_UP {
                self.run(runtime, users, case, 100);
            }
        }
    }

    pub(super) fn reserve(c: &mut Criterion, users: &[String]) {
        let Some(url) =
            std::env::var(URL_VAR).ok().filter(|url| !url.is_empty())
        else {
            eprintln!(
                "reserve: {URL_VAR} is not set: the Redis groups are skipped"
            );
            return;
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _entered = runtime.enter();
        let started = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let run = format!("{}-{:x}", std::process::id(), started.as_micros());
        // A Redis that does not answer fails the bench, before any group;
        // then the probes on it.
        let probe = Case::new("probe", &run, &url);
        let name = &probe.names[0];
        let check = [BucketCheck::new(name, "probe", roomy(), 1).unwrap()];
        let mut out = [Decision::default()];
        if let Err(e) = runtime.block_on(probe.store.check(&check, &mut out)) {
            panic!("{URL_VAR}={url} does not answer: {e}");
        }
        assert!(
            probe.store.capabilities().reserves,
            "RedisStorage does not reserve"
        );
        assert_reservations_charge(
            &probe.names,
            "probe",
            |checks, wait, out| {
                runtime
                    .block_on(probe.store.reserve(checks, wait, out))
                    .unwrap()
            },
            |checks, out| {
                runtime.block_on(probe.store.check(checks, out)).unwrap()
            },
        );
        for (group, spread) in [("one_user", 1), ("1k_users", 1_000)] {
            let users = &users[..spread];
            let group = format!("reserve/redis_{group}");
            let mut bench = Case::new(&format!("u{spread}"), &run, &url);
            // Every bucket made, for both limits.
            bench.run(&runtime, users, (2, false), spread);
            let mut criterion_group = c.benchmark_group(&group);
            for (case, buckets, reserve) in CASES {
                bench.warm(&runtime, users, (buckets, reserve));
                criterion_group.bench_function(case, |b| {
                    b.iter_custom(|iters| {
                        runtime.block_on(async {
                            let mut total = Duration::ZERO;
                            for _ in 0..iters {
                                total +=
                                    bench.call(users, buckets, reserve).await;
                            }
                            total
                        })
                    });
                });
            }
            criterion_group.finish();
        }
    }
}

/// Without the `redis` feature: no Redis group, and a word if one was asked.
#[cfg(not(feature = "redis"))]
mod redis {
    use criterion::Criterion;
    use rate_tier_storage::StorageExt;

    pub(super) fn reserve(_: &mut Criterion, _: &[String]) {
        if std::env::var_os("TRT_REDIS_URL").is_some() {
            eprintln!(
                "reserve: the Redis groups need `--features redis`: skipped"
            );
        }
    }
}
