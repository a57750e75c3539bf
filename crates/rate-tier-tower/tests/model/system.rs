//! The system under test (two or three `RateTier`s on a store) and the
//! driver that runs a scenario's operations on it and on the reference
//! model side by side.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use gcra_core::{Adjust, Decision, Quota};
use proptest::prelude::*;
use rate_tier_storage::{Adjustment, Answer, Capabilities, Mode, StorageExt};
use rate_tier_test_support::{
    TEST_TIMEOUT, cluster_urls, postgres_url, redis_url, unique,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower_rate_tier::clock::Clock;
use tower_rate_tier::{
    Ban, FallbackStorage, Limit, LimitReason, LimitRequest, MemoryStorage,
    PostgresStorage, RateLimitInfo, RateTier, RedisStorage, Settle, Storage,
    StorageError, Tiers, Window, rules::Rule, rules::RuleKind,
    storage::BucketCancel, storage::BucketCheck, storage::BucketSettle,
    storage::Decided,
};

use crate::reference::{BanRule, Bucket, Expected, Place, Reserved, Table};

/// Which store the instances share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One memory store, each instance behind a fallback of its own.
    MemoryShared,
    /// A memory store per instance: nothing shared.
    MemoryPerInstance,
    Redis,
    RedisCluster,
    Postgres,
}

impl Kind {
    fn in_memory(self) -> bool {
        matches!(self, Kind::MemoryShared | Kind::MemoryPerInstance)
    }
}

/// What a request asks for beside its tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Plan,
    /// A rate of its own, per user.
    Search,
    /// A window, per user (never waits).
    Login,
    /// A settled rate, per user, estimated at 1.
    Tokens,
}

#[derive(Debug, Clone)]
pub enum Op {
    /// A request, awaited (a wait included).
    Request {
        inst: usize,
        user: usize,
        route: Route,
        cost: u32,
    },
    /// The last request again, `more` costlier: a client that retries.
    Retry { more: u32 },
    /// A request of cost 1 in a task of its own, left waiting for its slot
    /// while the others go on (memory only).
    Spawn {
        inst: usize,
        user: usize,
        route: Route,
    },
    /// The client of a waiting request goes away (memory only).
    Drop { which: prop::sample::Index },
    /// Time passes (memory only).
    Advance { minutes: u64 },
    /// The clock is set forward or back (memory only).
    Step { back: bool, minutes: u64 },
    /// The last tokens request of this user on this instance is settled.
    Settle {
        inst: usize,
        user: usize,
        actual: u32,
    },
    /// The user's buckets, through this instance, back to full.
    Reset { inst: usize, user: usize },
    /// A settlement of a limit not declared settled: refused, nothing
    /// changed.
    SettleUndeclared {
        inst: usize,
        user: usize,
        actual: u32,
    },
    /// This instance's tiers replaced.
    Reload { inst: usize, variant: usize },
    /// The shared memory store goes down, or comes back (`MemoryShared`).
    Outage { down: bool },
}

/// How an instance is configured.
#[derive(Debug, Clone, Copy)]
pub struct InstanceSetup {
    /// Waits for its slot instead of refusing.
    pub wait: bool,
    /// Bans a customer after refusals.
    pub bans: bool,
    /// Remembers refusals (Redis).
    pub remember: bool,
}

pub fn instance_setup(kind: Kind) -> impl Strategy<Value = InstanceSetup> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        move |(wait, bans, remember)| InstanceSetup {
            wait,
            bans,
            remember: remember
                && matches!(kind, Kind::Redis | Kind::RedisCluster),
        },
    )
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub kind: Kind,
    pub setups: Vec<InstanceSetup>,
    pub ops: Vec<Op>,
    /// How long a ban lasts (the same on every instance that bans).
    pub ban_length: Duration,
    /// The clock may step back. Windows are then left out (a window's
    /// entries ahead of a clock gone back are repaired differently by
    /// each store's path, which the model does not follow), and so are
    /// outages (a breaker opened at a time the clock went back before
    /// stays open until that time comes again: a model of its own).
    pub clock_back: bool,
}

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

/// The users: their tier (0: free, 1: pro).
const PLAN_OF: [usize; 3] = [0, 1, 0];

/// The tiers of a variant: free, pro. Counted in hours, so that on a
/// shared server the seconds a case takes never matter.
fn plan_quotas(variant: usize) -> [Quota; 2] {
    match variant {
        0 => [Quota::per_hour(4), Quota::per_hour(8)],
        _ => [
            Quota::per_hour(6).allow_burst(3),
            Quota::per_hour(8).allow_burst(4),
        ],
    }
}

/// Banned after 2 refusals within an hour, for the scenario's length.
fn ban_rule(length: Duration) -> BanRule {
    BanRule {
        refusals: 2,
        within: HOUR,
        length,
    }
}

/// What the model saw, over every case of a run: counts by
/// [`SEEN_NAMES`].
pub type Seen = [AtomicUsize; 8];
/// The names of [`Seen`]'s counts.
pub const SEEN_NAMES: [&str; 8] = [
    "operations",
    "served",
    "served after a wait",
    "limited",
    "banned",
    "403",
    "503 (outage)",
    "decided locally",
];

/// A clock over Tokio's (paused) time that can be set back.
#[derive(Debug, Clone)]
struct ModelClock {
    origin: Instant,
    offset_us: Arc<AtomicI64>,
}

const ORIGIN_US: i64 = 1_000_000_000_000;

impl Clock for ModelClock {
    fn now_us(&self) -> u64 {
        let elapsed = i64::try_from(self.origin.elapsed().as_micros()).unwrap();
        u64::try_from(
            ORIGIN_US + elapsed + self.offset_us.load(Ordering::SeqCst),
        )
        .unwrap()
    }
}

/// A memory store that can be made to fail: the shared store's outage.
#[derive(Debug)]
struct Switch {
    up: AtomicBool,
    memory: MemoryStorage,
}

impl Switch {
    fn up(&self) -> Result<(), StorageError> {
        match self.up.load(Ordering::SeqCst) {
            true => Ok(()),
            false => Err(StorageError::Timeout(Duration::from_millis(100))),
        }
    }
}

impl Switch {
    async fn check_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        self.up()?;
        self.memory.check(checks, out).await
    }

    async fn settle_buckets(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        self.up()?;
        self.memory.settle(settles).await
    }

    async fn reserve_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        max_wait: Duration,
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        self.up()?;
        self.memory.reserve(checks, max_wait, out).await
    }

    async fn cancel_reservations(
        &self,
        reserved: &[BucketCancel<'_>],
    ) -> Result<(), StorageError> {
        self.up()?;
        self.memory.cancel(reserved).await
    }

    async fn reset_buckets(
        &self,
        buckets: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        self.up()?;
        self.memory.reset(buckets).await
    }

    fn decides(&self, kind: RuleKind) -> bool {
        self.memory.supports(kind)
    }

    fn can_reserve(&self) -> bool {
        true
    }

    fn label(&self) -> &'static str {
        "switch"
    }
}

impl Storage for Switch {
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
            Adjustment::Release(_) => Answer::Ready(Err(
                StorageError::Unsupported("concurrency limits"),
            )),
            Adjustment::Renew(_) => Answer::Ready(Ok(())),
        }
    }

    fn reset<'a>(&'a self, buckets: &'a [BucketCheck<'a>]) -> Answer<'a, ()> {
        Answer::pending(self.reset_buckets(buckets))
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
        capabilities
    }
}

/// The names of one case: unique on a shared server.
struct Names {
    tiers: [String; 2],
    users: [String; 3],
    search: Limit,
    login: Limit,
    tokens: Limit,
}

impl Names {
    fn new() -> Names {
        Names {
            tiers: [unique("free"), unique("pro")],
            users: [unique("ana"), unique("bea"), unique("cid")],
            search: Limit::new(unique("search"), Quota::per_hour(3)),
            login: Limit::new(unique("login"), Window::new(2, HOUR).unwrap()),
            tokens: Limit::new(unique("tokens"), Quota::per_hour(12))
                .settle(Settle::from_header("x-tokens-used")),
        }
    }

    fn plans(&self, variant: usize) -> Tiers {
        let [free, pro] = plan_quotas(variant);
        Tiers::builder()
            .tier(self.tiers[0].as_str(), free)
            .tier(self.tiers[1].as_str(), pro)
            .build()
            .unwrap()
    }

    fn limit(&self, route: Route) -> Option<&Limit> {
        match route {
            Route::Plan => None,
            Route::Search => Some(&self.search),
            Route::Login => Some(&self.login),
            Route::Tokens => Some(&self.tokens),
        }
    }
}

/// A request left waiting in a task of its own.
struct Waiting {
    task: JoinHandle<Result<Instant, String>>,
    /// When it is due to be served (Tokio's time).
    due: Instant,
    reserved: Option<Reserved>,
    inst: usize,
    user: usize,
    route: Route,
}

/// The instances, their store, the model, and what the driver keeps
/// between operations.
pub struct Setup {
    kind: Kind,
    setups: Vec<InstanceSetup>,
    clock_back: bool,
    ban: BanRule,
    names: Names,
    tiers: Vec<RateTier>,
    clock: Option<ModelClock>,
    switch: Option<Arc<Switch>>,
    /// Every memory store of the case (the shared one, each instance's
    /// own or fallback's local one), to sweep before the clock goes back.
    memories: Vec<MemoryStorage>,
    tables: HashMap<Place, Table>,
    variants: Vec<usize>,
    down: bool,
    waiting: Vec<Waiting>,
    /// The last tokens request served, per (instance, user): its answer,
    /// where it was charged, and the quota it was charged under.
    tokens: HashMap<(usize, usize), (RateLimitInfo, Place, Quota)>,
    /// (instance, user) where another instance may have written the
    /// user's buckets since this instance last asked about them: what it
    /// remembers of a refusal may then be out of date (its wait short).
    stale: std::collections::HashSet<(usize, usize)>,
    /// The last request: what a retry asks again.
    last_request: Option<(usize, usize, Route, u32)>,
    log: Vec<String>,
    seen: Arc<Seen>,
}

impl Setup {
    pub async fn new(scenario: &Scenario, seen: Arc<Seen>) -> Setup {
        let names = Names::new();
        let n = scenario.setups.len();
        let (clock, switch) = match scenario.kind {
            Kind::MemoryShared | Kind::MemoryPerInstance => {
                let clock = ModelClock {
                    origin: Instant::now(),
                    offset_us: Arc::default(),
                };
                let switch = Arc::new(Switch {
                    up: AtomicBool::new(true),
                    memory: MemoryStorage::with_clock(clock.clone()),
                });
                (Some(clock), Some(switch))
            }
            _ => (None, None),
        };
        let mut tiers = Vec::new();
        let mut memories: Vec<MemoryStorage> =
            switch.iter().map(|s| s.memory.clone()).collect();
        for setup in &scenario.setups {
            let store: Arc<dyn Storage> = match scenario.kind {
                Kind::MemoryShared => {
                    let fallback =
                        FallbackStorage::builder(switch.clone().unwrap())
                            .failure_threshold(1)
                            .cool_down(Duration::ZERO, Duration::ZERO)
                            .local_share(u32::try_from(n).unwrap())
                            .clock(clock.clone().unwrap())
                            .build();
                    memories.push(fallback.local().clone());
                    Arc::new(fallback)
                }
                Kind::MemoryPerInstance => {
                    let memory =
                        MemoryStorage::with_clock(clock.clone().unwrap());
                    memories.push(memory.clone());
                    Arc::new(memory)
                }
                Kind::Redis => Arc::new(
                    RedisStorage::from_url(&redis_url())
                        .unwrap()
                        .timeout(TEST_TIMEOUT)
                        .remember_refusals(setup.remember),
                ),
                Kind::RedisCluster => Arc::new(
                    RedisStorage::from_cluster_urls(cluster_urls(3))
                        .unwrap()
                        .timeout(TEST_TIMEOUT)
                        .remember_refusals(setup.remember),
                ),
                Kind::Postgres => {
                    let store = PostgresStorage::builder(&postgres_url())
                        .unwrap()
                        .timeout(TEST_TIMEOUT)
                        .build()
                        .unwrap();
                    store.migrate().await.unwrap();
                    Arc::new(store)
                }
            };
            let [free, pro] = plan_quotas(0);
            let mut builder = RateTier::builder()
                .tier(names.tiers[0].as_str(), free)
                .tier(names.tiers[1].as_str(), pro)
                .storage(store);
            if let Some(clock) = &clock {
                builder = builder.clock(clock.clone());
            }
            if setup.wait {
                // A shared server's time is real: its waits stay short.
                let wait = if scenario.kind.in_memory() {
                    40 * MINUTE
                } else {
                    Duration::from_secs(1)
                };
                builder = builder.wait_up_to(wait);
            }
            if setup.bans {
                builder = builder.ban(
                    Ban::after(2, HOUR)
                        .lasting(scenario.ban_length)
                        .up_to(scenario.ban_length),
                );
            }
            tiers.push(builder.build());
        }
        Setup {
            kind: scenario.kind,
            setups: scenario.setups.clone(),
            clock_back: scenario.clock_back,
            ban: ban_rule(scenario.ban_length),
            names,
            tiers,
            clock,
            switch,
            memories,
            tables: HashMap::new(),
            variants: vec![0; n],
            down: false,
            waiting: Vec::new(),
            tokens: HashMap::new(),
            stale: std::collections::HashSet::new(),
            last_request: None,
            log: Vec::new(),
            seen,
        }
    }

    /// Runs the scenario: `Err` names the first divergence, after the
    /// operations that led to it.
    pub async fn and_then_run(
        mut self,
        scenario: &Scenario,
    ) -> Result<(), String> {
        for op in &scenario.ops {
            self.seen(0);
            self.log.push(format!("{op:?}"));
            if let Err(divergence) = self.apply(op).await {
                return Err(format!(
                    "{divergence}\n{:?} on {:?}\nafter:\n  {}",
                    self.kind,
                    self.setups,
                    self.log.join("\n  ")
                ));
            }
            self.collect().await?;
        }
        // Every waiting request is served in the end.
        if self.kind.in_memory() {
            tokio::time::advance(2 * HOUR).await;
        }
        self.collect().await?;
        if !self.waiting.is_empty() {
            return Err(format!(
                "{} requests still waiting after two hours",
                self.waiting.len()
            ));
        }
        Ok(())
    }

    fn now(&self) -> u64 {
        self.clock.as_ref().map_or(0, Clock::now_us)
    }

    /// Where instance `inst`'s decisions are made now, and the share of
    /// each quota applied there.
    fn place(&self, inst: usize) -> (Place, u32) {
        match self.kind {
            Kind::MemoryShared if self.down => {
                (Place::Own(inst), u32::try_from(self.tiers.len()).unwrap())
            }
            Kind::MemoryPerInstance => (Place::Own(inst), 1),
            _ => (Place::Shared, 1),
        }
    }

    fn route(&self, route: Route) -> Route {
        match route {
            Route::Login if self.clock_back => Route::Plan,
            route => route,
        }
    }

    /// The buckets of a request, as instance `inst` applies them at a
    /// place of share `share`.
    fn buckets(
        &self,
        inst: usize,
        user: usize,
        route: Route,
        cost: u32,
        share: u32,
    ) -> Vec<Bucket> {
        let plan = PLAN_OF[user];
        let quota = plan_quotas(self.variants[inst])[plan];
        let mut buckets = vec![Bucket {
            name: self.names.tiers[plan].clone(),
            rule: Rule::Rate(quota).divided(share),
            cost,
        }];
        if let Some(limit) = self.names.limit(route) {
            buckets.push(Bucket {
                name: limit.name().to_owned(),
                rule: limit.rule_for(&self.names.tiers[plan]).divided(share),
                cost: 1,
            });
        }
        buckets
    }

    /// What the model says a request comes to, its charges made.
    fn expect(
        &mut self,
        inst: usize,
        user: usize,
        route: Route,
        cost: u32,
    ) -> (Expected, Option<Reserved>) {
        let now = self.now();
        let (place, share) = self.place(inst);
        let setup = self.setups[inst];
        let name = self.names.users[user].clone();
        let configured = plan_quotas(self.variants[inst])[PLAN_OF[user]];
        if cost > configured.burst() {
            return (Expected::CostExceedsBurst, None);
        }
        let buckets = self.buckets(inst, user, route, cost, share);
        let local_burst = buckets[0].rule.limit();
        if cost > local_burst {
            return (Expected::Unavailable, None);
        }
        let can_ban =
            place == Place::Shared || self.kind == Kind::MemoryPerInstance;
        let table = self.tables.entry(place).or_default();
        if setup.bans
            && let Some(until) = table.banned(&name, now)
        {
            return (
                Expected::Banned {
                    retry_after_us: until - now,
                },
                None,
            );
        }
        let refused = match table.check(&name, &buckets, now) {
            Ok(remaining) => {
                return (
                    Expected::Served {
                        wait_us: 0,
                        remaining,
                    },
                    None,
                );
            }
            Err(refused) => refused,
        };
        let rates_only =
            buckets.iter().all(|b| b.rule.kind() == RuleKind::Rate);
        if setup.wait && rates_only {
            let max_wait = if self.kind.in_memory() {
                40 * MINUTE
            } else {
                Duration::from_secs(1)
            };
            let max_wait = u64::try_from(max_wait.as_micros()).unwrap();
            if let Some((wait_us, remaining, reserved)) =
                table.reserve(&name, &buckets, now, max_wait, place)
            {
                return (
                    Expected::Served { wait_us, remaining },
                    Some(reserved),
                );
            }
        }
        if setup.bans {
            table.count_refusal(&name, &self.ban, share, now, can_ban);
        }
        let (index, retry_after_us) = refused;
        (
            Expected::Limited {
                limit: buckets[index].name.clone(),
                retry_after_us,
            },
            None,
        )
    }

    fn request(
        &self,
        user: usize,
        route: Route,
        cost: u32,
    ) -> LimitRequest<'_> {
        let tier = self.names.tiers[PLAN_OF[user]].as_str();
        let request =
            LimitRequest::new(self.names.users[user].as_str(), tier, cost);
        match self.names.limit(route) {
            Some(limit) => request.limit(limit, 1),
            None => request,
        }
    }

    async fn apply(&mut self, op: &Op) -> Result<(), String> {
        let retried;
        let op = match *op {
            Op::Retry { more } => match self.last_request {
                Some((inst, user, route, cost)) => {
                    retried = Op::Request {
                        inst,
                        user,
                        route,
                        cost: cost.saturating_add(more),
                    };
                    &retried
                }
                None => return Ok(()),
            },
            _ => op,
        };
        if let Op::Request {
            inst,
            user,
            route,
            cost,
        } = *op
        {
            self.last_request = Some((inst, user, route, cost));
        }
        let applied = self.apply_op(op).await;
        // Whatever an instance did with a user's buckets, the others'
        // memories of them may be out of date; its own is not.
        if let Op::Request { inst, user, .. }
        | Op::Spawn { inst, user, .. }
        | Op::Settle { inst, user, .. }
        | Op::Reset { inst, user } = *op
        {
            for other in 0..self.tiers.len() {
                self.stale.insert((other, user));
            }
            self.stale.remove(&(inst, user));
        }
        if let Op::Drop { .. } = op {
            for other in 0..self.tiers.len() {
                for user in 0..3 {
                    self.stale.insert((other, user));
                }
            }
        }
        applied
    }

    async fn apply_op(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Request {
                inst,
                user,
                route,
                cost,
            } => {
                let route = self.route(route);
                let started = Instant::now();
                let (expected, _) = self.expect(inst, user, route, cost);
                self.count(&expected);
                let outcome = self.tiers[inst]
                    .decide(&self.request(user, route, cost))
                    .await;
                let waited = Instant::now() - started;
                if std::env::var_os("TRT_MODEL_TRACE").is_some() {
                    eprintln!(
                        "{op:?} at {}: expected {expected:?}, got {outcome:?}",
                        self.now()
                    );
                }
                let stale = self.stale.contains(&(inst, user));
                self.compare(inst, stale, &expected, &outcome, waited)?;
                if route == Route::Tokens
                    && let Ok(Ok(info)) = outcome
                {
                    let (place, share) = self.place(inst);
                    let quota = self
                        .names
                        .tokens
                        .quota_for(&self.names.tiers[PLAN_OF[user]]);
                    let quota = Rule::Rate(quota).divided(share).as_quota();
                    let place = match expected {
                        Expected::Served { .. } => place,
                        _ => return Ok(()),
                    };
                    self.tokens.insert(
                        (inst, user),
                        (info.info().clone(), place, quota),
                    );
                }
            }
            Op::Spawn { inst, user, route } => {
                let route = self.route(route);
                let (expected, reserved) = self.expect(inst, user, route, 1);
                self.count(&expected);
                let tiers = self.tiers[inst].clone();
                let (user_name, tier) = (
                    self.names.users[user].clone(),
                    self.names.tiers[PLAN_OF[user]].clone(),
                );
                let limit = self.names.limit(route).cloned();
                let due = match expected {
                    Expected::Served { wait_us, .. } => {
                        Instant::now() + Duration::from_micros(wait_us)
                    }
                    _ => Instant::now(),
                };
                let expected_outcome = expected.clone();
                let task = tokio::spawn(async move {
                    let request = LimitRequest::new(&user_name, &tier, 1);
                    let request = match &limit {
                        Some(limit) => request.limit(limit, 1),
                        None => request,
                    };
                    let outcome = tiers.decide(&request).await;
                    let served = matches!(outcome, Ok(Ok(_)));
                    let expected_served =
                        matches!(expected_outcome, Expected::Served { .. });
                    if served != expected_served {
                        return Err(format!(
                            "spawned: expected {expected_outcome:?}, got {outcome:?}"
                        ));
                    }
                    Ok(Instant::now())
                });
                self.settle_tasks().await;
                self.waiting.push(Waiting {
                    task,
                    due,
                    reserved,
                    inst,
                    user,
                    route,
                });
            }
            Op::Drop { which } => {
                let now = Instant::now();
                let pending: Vec<usize> = (0..self.waiting.len())
                    .filter(|&i| {
                        self.waiting[i].due > now
                            && !self.waiting[i].task.is_finished()
                    })
                    .collect();
                if pending.is_empty() {
                    return Ok(());
                }
                let gone =
                    self.waiting.remove(pending[which.index(pending.len())]);
                gone.task.abort();
                self.settle_tasks().await;
                // A give-back the shared store cannot take (it is down)
                // loses the slot: never handed out twice.
                if let Some(reserved) = &gone.reserved
                    && !(reserved.place == Place::Shared && self.down)
                {
                    let now = self.now();
                    self.tables
                        .entry(reserved.place)
                        .or_default()
                        .cancel(reserved, now);
                }
                let _ = (gone.inst, gone.user, gone.route);
            }
            Op::Advance { minutes } => {
                tokio::time::advance(MINUTE * u32::try_from(minutes).unwrap())
                    .await;
                self.settle_tasks().await;
            }
            Op::Step { back, minutes } => {
                let by = i64::try_from(
                    (MINUTE * u32::try_from(minutes).unwrap()).as_micros(),
                )
                .unwrap();
                let by = if back && self.clock_back { -by } else { by };
                if by < 0 {
                    // What has expired may be forgotten at any time, and
                    // a clock gone back tells whether it was: sweep every
                    // store now, and forget the same in the model.
                    let now = self.now();
                    for memory in &self.memories {
                        memory.sweep();
                    }
                    for table in self.tables.values_mut() {
                        table.forget_expired(now);
                    }
                }
                if let Some(clock) = &self.clock {
                    clock.offset_us.fetch_add(by, Ordering::SeqCst);
                }
            }
            Op::Settle { inst, user, actual } => {
                let Some((info, place, quota)) =
                    self.tokens.remove(&(inst, user))
                else {
                    return Ok(());
                };
                if place == Place::Shared && self.down {
                    // Queued until the store is back: not modelled.
                    self.tokens.insert((inst, user), (info, place, quota));
                    return Ok(());
                }
                let adjust = Adjust::between(1, actual);
                let settled = self.tiers[inst]
                    .settle(
                        &self.names.users[user],
                        &info,
                        &self.names.tokens,
                        adjust,
                    )
                    .await;
                if let Err(error) = settled {
                    return Err(format!("settle failed: {error}"));
                }
                let now = self.now();
                let name = self.names.users[user].clone();
                let limit = self.names.tokens.name().to_owned();
                self.tables
                    .entry(place)
                    .or_default()
                    .settle(&limit, &name, quota, adjust, now);
            }
            Op::SettleUndeclared { inst, user, actual } => {
                let Some((info, _, _)) = self.tokens.get(&(inst, user)) else {
                    return Ok(());
                };
                let adjust = Adjust::between(1, actual);
                let settled = self.tiers[inst]
                    .settle(
                        &self.names.users[user],
                        info,
                        &self.names.search,
                        adjust,
                    )
                    .await;
                if !matches!(
                    settled,
                    Err(tower_rate_tier::Error::NotSettled(_))
                ) {
                    return Err(format!(
                        "a settlement of a limit not declared settled: {settled:?}"
                    ));
                }
            }
            Op::Reset { inst, user } => {
                let limits =
                    [&self.names.search, &self.names.login, &self.names.tokens];
                let name = self.names.users[user].clone();
                let reset = self.tiers[inst].reset(&name, &limits).await;
                match self.kind {
                    Kind::MemoryShared => {
                        self.tables
                            .entry(Place::Own(inst))
                            .or_default()
                            .reset(&name);
                        if self.down {
                            if reset.is_ok() {
                                return Err("a reset during the outage said it was done".into());
                            }
                            return Ok(());
                        }
                        self.tables
                            .entry(Place::Shared)
                            .or_default()
                            .reset(&name);
                    }
                    Kind::MemoryPerInstance => {
                        self.tables
                            .entry(Place::Own(inst))
                            .or_default()
                            .reset(&name);
                    }
                    _ => {
                        self.tables
                            .entry(Place::Shared)
                            .or_default()
                            .reset(&name);
                        if self.setups.iter().any(|s| s.remember) {
                            // Every instance's memory hears of it within a
                            // second.
                            tokio::time::sleep(Duration::from_millis(1_100))
                                .await;
                        }
                    }
                }
                reset.map_err(|error| format!("reset failed: {error}"))?;
            }
            Op::Reload { inst, variant } => {
                self.tiers[inst]
                    .try_reload(self.names.plans(variant))
                    .map_err(|e| format!("reload refused: {e}"))?;
                self.variants[inst] = variant;
            }
            Op::Retry { .. } => unreachable!("a retry is its request"),
            Op::Outage { down } => {
                if self.clock_back {
                    return Ok(());
                }
                if let Some(switch) = &self.switch
                    && self.kind == Kind::MemoryShared
                {
                    switch.up.store(!down, Ordering::SeqCst);
                    self.down = down;
                }
            }
        }
        Ok(())
    }

    fn seen(&self, what: usize) {
        self.seen[what].fetch_add(1, Ordering::Relaxed);
    }

    fn count(&self, expected: &Expected) {
        self.seen(match expected {
            Expected::Served { wait_us: 0, .. } => 1,
            Expected::Served { .. } => 2,
            Expected::Limited { .. } => 3,
            Expected::Banned { .. } => 4,
            Expected::CostExceedsBurst => 5,
            Expected::Unavailable => 6,
        });
        if self.kind == Kind::MemoryShared && self.down {
            self.seen(7);
        }
    }

    /// Lets spawned requests run until they wait (or end): no time passes.
    async fn settle_tasks(&self) {
        for _ in 0..32 {
            tokio::task::yield_now().await;
        }
    }

    /// The spawned requests that ended: each served when it was due.
    async fn collect(&mut self) -> Result<(), String> {
        self.settle_tasks().await;
        let mut still = Vec::new();
        for waiting in std::mem::take(&mut self.waiting) {
            if !waiting.task.is_finished() {
                still.push(waiting);
                continue;
            }
            let served = waiting
                .task
                .await
                .map_err(|e| format!("spawned request: {e}"))??;
            if served < waiting.due {
                return Err(format!(
                    "a waiting request was served {:?} before its slot",
                    waiting.due - served
                ));
            }
        }
        self.waiting = still;
        Ok(())
    }

    fn compare(
        &self,
        inst: usize,
        stale: bool,
        expected: &Expected,
        outcome: &Result<
            Result<tower_rate_tier::Admitted, tower_rate_tier::Limited>,
            tower_rate_tier::Error,
        >,
        waited: Duration,
    ) -> Result<(), String> {
        // On a shared server the model's time stands still while real time
        // moves on: a wait is read to the minute.
        // A refusal an instance remembers knows nothing of what others
        // charged since: its wait is then at most the model's (never
        // longer), and exact when no other instance wrote meanwhile.
        let exact = self.kind.in_memory();
        let remembers = self.setups[inst].remember && stale;
        let slack = if exact { 0 } else { 120_000_000 };
        let close = |model: u64, told: u64| {
            if remembers {
                told > 0 && told <= model.saturating_add(slack)
            } else {
                model.abs_diff(told) <= slack
            }
        };
        let fail = || {
            Err(format!(
                "expected {expected:?}, got {outcome:?} (waited {waited:?})"
            ))
        };
        match (expected, outcome) {
            (Expected::Served { wait_us, remaining }, Ok(Ok(info))) => {
                if exact && waited != Duration::from_micros(*wait_us) {
                    return fail();
                }
                for (name, left) in remaining {
                    let state = info.limits().find(|s| s.name == name);
                    if state.is_none_or(|s| s.remaining != *left) {
                        return fail();
                    }
                }
                Ok(())
            }
            (
                Expected::Limited {
                    limit,
                    retry_after_us,
                },
                Ok(Err(limited)),
            ) if limited.reason() == LimitReason::RateLimited
                && limited.limit_name() == limit
                && close(
                    *retry_after_us,
                    u64::try_from(limited.retry_after().as_micros()).unwrap(),
                ) =>
            {
                Ok(())
            }
            (Expected::Banned { retry_after_us }, Ok(Err(limited)))
                if limited.reason() == LimitReason::Banned
                    && close(
                        *retry_after_us,
                        u64::try_from(limited.retry_after().as_micros())
                            .unwrap(),
                    ) =>
            {
                Ok(())
            }
            (Expected::CostExceedsBurst, Ok(Err(limited)))
                if matches!(
                    limited.reason(),
                    LimitReason::CostExceedsBurst { .. }
                ) =>
            {
                Ok(())
            }
            (Expected::Unavailable, Err(_)) => Ok(()),
            _ => fail(),
        }
    }
}

impl Setup {
    /// The instance's tiers now (for messages).
    #[allow(dead_code)]
    fn quota_of(&self, inst: usize, user: usize) -> Quota {
        plan_quotas(self.variants[inst])[PLAN_OF[user]]
    }
}
