//! The kinds of limit beside the GCRA rate, in memory and on Redis: one
//! decision with one window (N = 100), with one calendar period, and a
//! concurrency slot taken then given back, each against one GCRA rate
//! check of the same store: what each kind costs over a rate.
//!
//! # Memory
//!
//! On `MemoryStorage::check_sync`. Every case runs the same loop on a
//! store of its own: the check built per call (`BucketCheck::of_rule`, as
//! a limiter builds it per request), a `FakeClock` set forward by the same
//! step before every call, one `check_sync`, and an assertion that it
//! passed. No case ever refuses (a refusal writes nothing and would
//! flatter it): every call reads, decides and writes its bucket.
//!
//! - `rate`: 1 per µs with a burst of about 71 minutes (limits.rs's quota).
//! - `window`: at most 100 in a window of `100 × step × users`, so that
//!   each user comes back once every `window / 100`: after a prefill of
//!   100 rounds the log is full (100 entries) and at every call its oldest
//!   entry has just expired, 99 are counted, and the call passes with 0
//!   left, drops the expired entry and appends one. That is a window's
//!   realistic cost, a full log read and shifted, not an empty log's.
//! - `period`: `u32::MAX` a calendar month (UTC): never refuses.
//! - `slot`: a concurrency limit of 100, one slot taken (`check_sync`) and
//!   given back (`Storage::release_local`) per iteration: the entry is
//!   made and dropped each time, as for a user with nothing else in flight.
//!
//! Three groups: one hot user (`kinds/memory_one_user`, a step of 1 ms, a
//! window of 100 ms), 10,000 users round-robin (`kinds/memory_10k_users`,
//! a step of 100 µs, a window of 100 s; about 8 MB of logs, which fit in
//! a server CPU's last-level cache) and 100,000 users round-robin
//! (`kinds/memory_100k_users`, a step of 10 µs, a window of 100 s; the
//! windows' prefill is 10M checks and holds about 100 MiB of logs, which
//! do not: every window decision then waits for main memory, while the
//! rates' 100k small buckets still fit). The two spreads show where a
//! window's cost against a rate comes from the machine's cache rather
//! than from the window's own work. So the 100k group also measures
//! `floor`: a window decision's random access without the store (a log
//! of N entries per user in one array as large as the rings, the users in
//! a random order, each call reading an entry of the next user's log and
//! writing the one beside it, where the entry read says which log is next:
//! the latency of main memory, which a window decision waits for), against
//! which that group's window is judged.
//!
//! # Redis
//!
//! With `--features redis` and `TRT_REDIS_URL` set (`cargo xtask bench`
//! starts a throwaway Redis and sets it), the same four cases on
//! `RedisStorage` (`StorageExt::check`, one multiplexed connection, a timeout
//! of 5 s), on a current-thread Tokio runtime: the loop, the store and its
//! connection on one client thread, as the `redis_store` bench runs them.
//! The rate is one `EVALSHA` of `gcra.lua`; a window, a period or a slot
//! one of `decide_mixed.lua`, as a limiter sends them. Each iteration is
//! timed by itself (`iter_custom`): the check built, the decision awaited,
//! for a slot its release awaited. The limit names carry the process's id
//! and start time, so that no run reads another's keys; the keys expire by
//! themselves (the periods' at the end of the month: use a Redis of your
//! own).
//!
//! Redis decides on its own clock (`TIME`), so the loop cannot set the
//! time; each case is made so that no call refuses on real time, and every
//! call is asserted to pass:
//!
//! - `rate`, `period`: the same rules as in memory; they never refuse.
//! - `slot`: the same; a slot id of its own per iteration
//!   (`BucketCheck::lease_id`), given back by `StorageExt::release`: two round
//!   trips, a `ZADD` and a `ZREM` of the same member.
//! - `take`: the same slot, only its take timed: the give-back follows, as
//!   a request's ends after its answer, off its path. In the 1k group, the
//!   server's CPU per take against per rate check is printed too: 20,000
//!   calls of each between two reads of `INFO cpu` (the takes given back
//!   only after the second).
//! - `window`: N = 100, and a window as close as the real calls allow to
//!   the memory case's full log. It cannot be exact: a user comes back
//!   whenever the other users' calls are done, not at a fixed step. So the
//!   window is measured from the calls themselves: a first estimate from
//!   calls whose log holds one entry (a window of 1 µs), 100 rounds with a
//!   window of 97% of 100 comebacks, then the window made again from the
//!   time those calls took (their logs near full) and the rounds the logs
//!   need to grow to it (5 to 100). A user's log then counts about 97
//!   entries of the 99 a full log counts, and one expires at about every
//!   call, as long as the calls keep the pace they had; fewer when they
//!   slow down (on a noisy machine, 90 or less: the bench prints the mean
//!   count). And so that no call ever refuses
//!   whatever the timing does, the loop paces itself: a user is only called
//!   once its call 100 calls back was answered at least a window ago (plus
//!   a thousandth and 10 µs for the clocks), so that entry has expired at
//!   Redis and at most 99 are counted. The wait is not timed. The bench
//!   prints the window, the mean count of the measured calls and how many
//!   were paced.
//!
//! Each case then runs for 300 ms before criterion measures it (its quick
//! mode has no warm-up, and a loopback round trip is slower on an idle
//! machine).
//!
//! Two groups: one hot user (`kinds/redis_one_user`, a window of about
//! 100 round trips) and 1,000 users round-robin (`kinds/redis_1k_users`:
//! 100,000 users would take a window prefill of 10M round trips, minutes
//! in `--quick` mode). As in memory, the prefills run before criterion's
//! filter is applied (a filter after `--` does not spare them). Without
//! `TRT_REDIS_URL` (or the feature), the Redis groups are skipped, saying
//! so; a `TRT_REDIS_URL` that does not answer fails the bench.
//!
//! # Running it
//!
//! `cargo bench -p rate-tier-storage --bench kinds` (`-- --quick` as
//! `cargo xtask bench` runs it) for the rows "period / rate" (goal ≤ 1.2),
//! "window / rate" (≤ 3) and "slot taken and given back / rate" (≤ 2) of
//! each store; with Redis:
//!
//! ```text
//! TRT_REDIS_URL=redis://127.0.0.1:PORT/ cargo bench -p rate-tier-storage \
//!     --features redis --bench kinds -- --quick redis
//! ```
//!
//! The rows are read by xtask (`rows.rs`, `KINDS_STORES`).
#![allow(clippy::unwrap_used, missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use rate_tier_storage::StorageExt;
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{
    BucketCheck, Concurrency, Decision, LimitName, MemoryStorage, Period,
    PeriodUnit, Quota, Rule, Window,
};

const USERS: usize = 100_000;
/// The window's limit: its log holds this many entries.
const N: u32 = 100;
/// 2026-01-01T00:00:00Z, in µs: a calendar the period can place.
const START_US: u64 = 1_767_225_600_000_000;

/// The rule of each case, by bench name, for a group whose window is
/// `window`.
fn rule(case: &str, window: Duration) -> Rule {
    match case {
        "rate" => Quota::per_second(1_000_000).allow_burst(u32::MAX).into(),
        "window" => Window::new(N, window).unwrap().into(),
        "period" => Period::new(u32::MAX, PeriodUnit::Month, 0).unwrap().into(),
        "slot" | "take" => Concurrency::new(N).unwrap().into(),
        _ => unreachable!("no case {case}"),
    }
}

/// One case's loop: the next user, the clock a step on, one decision (and
/// for a slot, its release).
struct Case {
    store: MemoryStorage,
    clock: FakeClock,
    name: LimitName,
    rule: Rule,
    now_us: u64,
    step_us: u64,
    next: usize,
}

impl Case {
    fn new(case: &'static str, window: Duration, step_us: u64) -> Case {
        let clock = FakeClock::at_us(START_US);
        Case {
            store: MemoryStorage::builder().clock(clock.clone()).build(),
            clock,
            name: LimitName::new(case).unwrap(),
            rule: rule(case, window),
            now_us: START_US,
            step_us,
            next: 0,
        }
    }

    #[inline(always)]
    fn call(&mut self, users: &[String]) -> Decision {
        self.next = (self.next + 1) % users.len();
        self.now_us += self.step_us;
        self.clock.set_us(self.now_us);
        let check = BucketCheck::of_rule(
            &self.name,
            black_box(&users[self.next]),
            self.rule,
            1,
        )
        .unwrap();
        let mut out = [Decision::default()];
        let verdict = self
            .store
            .check_sync(std::slice::from_ref(&check), &mut out)
            .unwrap()
            .verdict;
        assert!(verdict.allowed, "{:?} refused", self.rule.kind());
        if matches!(self.rule, Rule::Concurrency(_)) {
            self.store.release(&[check]).ready().unwrap().unwrap();
        }
        out[0]
    }
}

/// The machine's floor under a window decision over logs that do not fit
/// in its cache: its random access without the store. A log of `N`
/// entries per user in one array (as much memory as the windows' rings),
/// the users in a random order (a window's ring lies at a place of the
/// heap no prefetcher foresees); per call, an entry of the next user's
/// log read and the one beside it written. Each entry read holds where
/// the next one is, so that a call waits for its read as a window
/// decision does (which must find its map's entry before its ring): the
/// latency of main memory, not the throughput of reads the processor
/// would overlap.
struct Floor {
    logs: Vec<u64>,
    at: usize,
    calls: u64,
}

impl Floor {
    fn new(users: usize) -> Floor {
        let per_log = N as usize;
        // A fixed shuffle (xorshift, Fisher-Yates): the same every run.
        let mut order: Vec<usize> = (0..users).collect();
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for i in (1..order.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            order.swap(i, (state % (i as u64 + 1)) as usize);
        }
        // A user's entry, somewhere in its log (the one beside it too).
        let entry = |user: usize| user * per_log + (user * 37) % (per_log - 1);
        let mut logs = vec![0; users * per_log];
        for (i, &user) in order.iter().enumerate() {
            logs[entry(user)] = entry(order[(i + 1) % users]) as u64;
        }
        Floor {
            logs,
            at: entry(order[0]),
            calls: 0,
        }
    }

    #[inline(always)]
    fn call(&mut self) -> u64 {
        self.calls += 1;
        let next = self.logs[self.at];
        self.logs[self.at + 1] = self.calls;
        self.at = next as usize;
        next
    }
}

fn kinds(c: &mut Criterion) {
    let users: Vec<String> =
        (0..USERS).map(|i| format!("user-{i:08}")).collect();
    // (group, users, step): each user comes back every `window / N`.
    for (group, spread, step_us) in [
        ("one_user", 1, 1_000),
        ("10k_users", USERS / 10, 100),
        ("100k_users", USERS, 10),
    ] {
        let users = &users[..spread];
        let window =
            Duration::from_micros(u64::from(N) * spread as u64 * step_us);
        let mut group = c.benchmark_group(format!("kinds/memory_{group}"));
        for case in ["rate", "window", "period", "slot"] {
            let mut bench = Case::new(case, window, step_us);
            // Every bucket made; a window's log full (N rounds).
            let rounds = if case == "window" { N as usize } else { 1 };
            let mut last = Decision::default();
            for _ in 0..rounds * spread {
                last = bench.call(users);
            }
            if case == "window" {
                assert_eq!(last.remaining, 0, "the log is not full");
            }
            group.bench_function(case, |b| b.iter(|| bench.call(users)));
        }
        if spread == USERS {
            let mut floor = Floor::new(spread);
            group.bench_function("floor", |b| b.iter(|| floor.call()));
        }
        group.finish();
    }
    redis::kinds(c, &users);
}

criterion_group!(benches, kinds);
criterion_main!(benches);

/// The Redis groups (see the module docs).
#[cfg(feature = "redis")]
mod redis {
    use rate_tier_storage::StorageExt;
    use std::collections::VecDeque;
    use std::hint::black_box;
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use criterion::Criterion;
    use rate_tier_storage::{
        BucketCheck, Decision, LimitName, RedisStorage, Rule, Window,
    };
    use tokio::runtime::Runtime;

    use super::{N, rule};

    /// The environment variable of the Redis to run on.
    const URL_VAR: &str = "TRT_REDIS_URL";
    /// The share of 100 comebacks a window lasts: about this many of the
    /// 100 entries a log can hold are counted at each call.
    const FILL: f64 = 0.97;
    /// How long each case runs before criterion measures it.
    const WARM_UP: Duration = Duration::from_millis(300);
    /// Calls per user of a server CPU measurement (`Case::server_cpu_us`):
    /// a slot's takes are held until its end, under the limit of `N`.
    const CPU_CALLS_PER_USER: usize = 20;

    /// One case's loop on Redis: the next user, one decision (and for a
    /// slot, its release), each timed by itself.
    struct Case {
        store: RedisStorage,
        name: LimitName,
        rule: Rule,
        next: usize,
        slot_id: u64,
        /// A slot's take alone is timed: its give-back follows, off the
        /// request's path.
        take_only: bool,
        /// Per user, when its last `N` calls were answered (a window's
        /// pace; empty for the other kinds).
        answered: Vec<VecDeque<Instant>>,
        /// The time spent waiting for the pace (not timed).
        waited: Duration,
        /// Calls since the prefill, those paced, and the entries their
        /// logs counted before them (windows).
        calls: u64,
        paced: u64,
        counted: u64,
    }

    impl Case {
        fn new(case: &str, run: &str, users: usize, url: &str) -> Case {
            let store = RedisStorage::from_url(url)
                .unwrap()
                .timeout(Duration::from_secs(5));
            let window = matches!(case, "window");
            Case {
                store,
                name: LimitName::new(format!("kinds-{case}-{run}")).unwrap(),
                rule: rule(case, Duration::from_micros(1)),
                next: 0,
                slot_id: 0,
                take_only: case == "take",
                answered: if window {
                    vec![VecDeque::with_capacity(N as usize); users]
                } else {
                    Vec::new()
                },
                waited: Duration::ZERO,
                calls: 0,
                paced: 0,
                counted: 0,
            }
        }

        /// Waits until the user's call `N` calls back was answered at
        /// least a window ago (plus a thousandth and 10 µs: Redis's clock
        /// is the real time, ours the monotonic one), so that its entry
        /// has expired at Redis.
        fn pace(&mut self, user: usize) {
            let Rule::Window(window) = self.rule else {
                return;
            };
            let log = &self.answered[user];
            if log.len() < N as usize {
                return;
            }
            let window = Duration::from_micros(window.window_us());
            let due =
                log[0] + window + window / 1000 + Duration::from_micros(10);
            if Instant::now() < due {
                self.paced += 1;
                let start = Instant::now();
                while Instant::now() < due {
                    std::hint::spin_loop();
                }
                self.waited += start.elapsed();
            }
        }

        /// One call: the time it took.
        async fn call(&mut self, users: &[String]) -> Duration {
            self.next = (self.next + 1) % users.len();
            self.pace(self.next);
            let start = Instant::now();
            let mut check = BucketCheck::of_rule(
                &self.name,
                black_box(&users[self.next]),
                self.rule,
                1,
            )
            .unwrap();
            let slot = matches!(self.rule, Rule::Concurrency(_));
            if slot {
                self.slot_id += 1;
                check = check.lease_id(self.slot_id);
            }
            let (allowed, decision) = self.decide(&check).await;
            let taken = start.elapsed();
            if slot {
                self.store.release(&[check]).await.unwrap();
            }
            let took = match self.take_only {
                true => taken,
                false => start.elapsed(),
            };
            assert!(allowed, "{:?} refused", self.rule.kind());
            black_box(decision);
            if let Some(log) = self.answered.get_mut(self.next) {
                if log.len() == N as usize {
                    log.pop_front();
                }
                log.push_back(start + took);
                // The entries counted before the call: N - 1 - remaining.
                self.counted += u64::from(N) - 1 - decision.remaining;
            }
            self.calls += 1;
            took
        }

        /// One decision of `check`: whether it passed, and its bucket's
        /// decision.
        async fn decide(&self, check: &BucketCheck<'_>) -> (bool, Decision) {
            let mut out = [Decision::default()];
            let verdict = self
                .store
                .check(std::slice::from_ref(check), &mut out)
                .await
                .unwrap()
                .verdict;
            (verdict.allowed, out[0])
        }

        /// `calls` calls: their mean wall time, waits for the pace left out.
        fn run(
            &mut self,
            runtime: &Runtime,
            users: &[String],
            calls: usize,
        ) -> Duration {
            let (start, waited) = (Instant::now(), self.waited);
            runtime.block_on(async {
                for _ in 0..calls {
                    self.call(users).await;
                }
            });
            (start.elapsed() - (self.waited - waited)) / calls as u32
        }

        /// Every bucket made; a window's length measured from the calls
        /// and its logs filled (see the module docs).
        fn prefill(&mut self, runtime: &Runtime, users: &[String]) {
            let spread = users.len();
            if let Rule::Window(_) = self.rule {
                // Logs of one entry: a first estimate of a call's time.
                let mut per_call = self.run(runtime, users, spread.max(200));
                let (mut last, mut rounds) = (0.0, N as usize);
                for _ in 0..2 {
                    let comeback = per_call.as_secs_f64() * spread as f64;
                    let window = (comeback * f64::from(N) * FILL).max(1e-6);
                    if last > 0.0 {
                        // The logs grow from the last window to this one.
                        let grow = (1.0 - last / window).max(0.0);
                        rounds = (grow * f64::from(N)).ceil() as usize + 5;
                        rounds = rounds.min(N as usize);
                    }
                    last = window;
                    self.rule = Window::new(N, Duration::from_secs_f64(window))
                        .unwrap()
                        .into();
                    per_call = self.run(runtime, users, rounds * spread);
                }
            } else {
                self.run(runtime, users, spread);
            }
            // Warm: the connection, the server and this machine busy, as
            // criterion's quick mode has no warm-up of its own.
            let warm = Instant::now();
            while warm.elapsed() < WARM_UP {
                self.run(runtime, users, 100);
            }
            (self.calls, self.paced, self.counted) = (0, 0, 0);
            self.waited = Duration::ZERO;
        }

        /// The server's CPU time per call of this case, in µs: `calls`
        /// calls between two reads of `INFO cpu` (user and system time). A
        /// slot's takes are given back only after the second read, so that
        /// the figure is the take's alone.
        async fn server_cpu_us(
            &mut self,
            users: &[String],
            calls: usize,
            info: &mut ::redis::aio::MultiplexedConnection,
        ) -> f64 {
            let slot = matches!(self.rule, Rule::Concurrency(_));
            let mut taken = Vec::new();
            let before = used_cpu_us(info).await;
            for _ in 0..calls {
                self.next = (self.next + 1) % users.len();
                let mut check = BucketCheck::of_rule(
                    &self.name,
                    &users[self.next],
                    self.rule,
                    1,
                )
                .unwrap();
                if slot {
                    self.slot_id += 1;
                    check = check.lease_id(self.slot_id);
                    taken.push((self.next, self.slot_id));
                }
                let (allowed, _) = self.decide(&check).await;
                assert!(allowed, "{:?} refused", self.rule.kind());
            }
            let after = used_cpu_us(info).await;
            for (user, id) in taken {
                let check = BucketCheck::of_rule(
                    &self.name,
                    &users[user],
                    self.rule,
                    1,
                )
                .unwrap()
                .lease_id(id);
                self.store.release(&[check]).await.unwrap();
            }
            (after - before) / calls as f64
        }

        /// What a window's measured calls saw.
        fn report(&self, group: &str) {
            let Rule::Window(window) = self.rule else {
                return;
            };
            if self.calls == 0 {
                return;
            }
            eprintln!(
                "{group}/window: a window of {:.3} ms; the measured calls' \
                 logs counted {:.1} entries on average before each call (a \
                 full log: {}); {} of {} calls paced, {:.1} ms waited (not \
                 timed)",
                window.window_us() as f64 / 1000.0,
                self.counted as f64 / self.calls as f64,
                N - 1,
                self.paced,
                self.calls,
                self.waited.as_secs_f64() * 1000.0,
            );
        }
    }

    /// The server's CPU time so far, user and system, in µs.
    async fn used_cpu_us(
        info: &mut ::redis::aio::MultiplexedConnection,
    ) -> f64 {
        let text: String = ::redis::cmd("INFO")
            .arg("cpu")
            .query_async(info)
            .await
            .unwrap();
        let seconds: f64 = text
            .lines()
            .filter_map(|line| {
                line.strip_prefix("used_cpu_sys:")
                    .or_else(|| line.strip_prefix("used_cpu_user:"))
            })
            .map(|value| value.trim().parse::<f64>().unwrap())
            .sum();
        seconds * 1e6
    }

    pub(super) fn kinds(c: &mut Criterion, users: &[String]) {
        let Some(url) =
            std::env::var(URL_VAR).ok().filter(|url| !url.is_empty())
        else {
            eprintln!(
                "kinds: {URL_VAR} is not set: the Redis groups are skipped"
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
        // A Redis that does not answer fails the bench, before any group.
        let probe = Case::new("rate", &run, 1, &url);
        let name = LimitName::new(format!("kinds-probe-{run}")).unwrap();
        let check =
            [BucketCheck::of_rule(&name, "probe", probe.rule, 1).unwrap()];
        let mut out = [Decision::default()];
        if let Err(e) = runtime.block_on(probe.store.check(&check, &mut out)) {
            panic!("{URL_VAR}={url} does not answer: {e}");
        }
        let mut info = runtime
            .block_on(
                ::redis::Client::open(url.as_str())
                    .unwrap()
                    .get_multiplexed_async_connection(),
            )
            .unwrap();
        for (group, spread) in [("one_user", 1), ("1k_users", 1_000)] {
            let users = &users[..spread];
            let group = format!("kinds/redis_{group}");
            let mut criterion_group = c.benchmark_group(&group);
            let mut rate_cpu_us = None;
            for case in ["rate", "window", "period", "slot", "take"] {
                let mut bench = Case::new(case, &run, spread, &url);
                bench.prefill(&runtime, users);
                // Server CPU, where a user's slots held at once stay under
                // the limit: 20 calls a user.
                if spread > 1 && matches!(case, "rate" | "take") {
                    let calls = CPU_CALLS_PER_USER * spread;
                    let cpu = runtime
                        .block_on(bench.server_cpu_us(users, calls, &mut info));
                    match rate_cpu_us {
                        None => rate_cpu_us = Some(cpu),
                        Some(rate) => eprintln!(
                            "{group}/take: server CPU {cpu:.2} µs per take, \
                             {rate:.2} µs per rate check: {:.3} ({calls} \
                             calls each, INFO cpu)",
                            cpu / rate
                        ),
                    }
                }
                criterion_group.bench_function(case, |b| {
                    b.iter_custom(|iters| {
                        runtime.block_on(async {
                            let mut total = Duration::ZERO;
                            for _ in 0..iters {
                                total += bench.call(users).await;
                            }
                            total
                        })
                    });
                });
                bench.report(&group);
            }
            criterion_group.finish();
        }
    }
}

/// Without the `redis` feature: no Redis group, and a word if one was asked.
#[cfg(not(feature = "redis"))]
mod redis {
    use criterion::Criterion;

    pub(super) fn kinds(_: &mut Criterion, _: &[String]) {
        if std::env::var_os("TRT_REDIS_URL").is_some() {
            eprintln!(
                "kinds: the Redis groups need `--features redis`: skipped"
            );
        }
    }
}
