//! The table: one function per section, each turning what its part
//! measured into rows. A new row is a [`Row`] with its [`Goal`] in the
//! section it belongs to (a new part: a field of [`Results`] filled in
//! `mod.rs`, and a section here).

use serde_json::Value;

use super::goal::Goal;
use super::parse::{Passes, median, num};
use super::runner::{Outcome, RedisCpu, Rls};

/// Everything one run measured; each part, or why it has no figure.
pub(crate) struct Results {
    pub(crate) criterion: Passes,
    /// Why criterion rows are missing, per bench target that did not build.
    pub(crate) criterion_missing: Vec<(&'static str, String)>,
    pub(crate) http: Outcome<Value>,
    pub(crate) redis: Outcome<Value>,
    pub(crate) redis_cpu: Outcome<RedisCpu>,
    pub(crate) memory: Outcome<Value>,
    pub(crate) memory_peer: Outcome<Value>,
    /// The standalone service's RLS part.
    pub(crate) rls: Outcome<Rls>,
}

/// Whether a row met its goal.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Status {
    Met,
    NotMet,
    /// A figure with no goal (for scale, or information).
    Info,
    /// No figure: why (a part that failed, a tool that is missing, a
    /// benchmark filtered out).
    NoFigure(String),
}

/// One line of the table.
pub(crate) struct Row {
    pub(crate) metric: String,
    pub(crate) ours: String,
    pub(crate) peer: String,
    pub(crate) ratio: Option<f64>,
    pub(crate) goal: Goal,
    /// The figure the goal judges: the ratio unless the goal names another.
    pub(crate) judged: Option<f64>,
    /// Something that voids the figure (errors during the run): not met.
    pub(crate) void: Option<String>,
    /// Why there is no figure, when there is none.
    pub(crate) missing: Option<String>,
}

impl Row {
    pub(crate) fn new(metric: impl Into<String>, goal: Goal) -> Self {
        Row {
            metric: metric.into(),
            ours: String::new(),
            peer: "—".to_owned(),
            ratio: None,
            goal,
            judged: None,
            void: None,
            missing: None,
        }
    }

    /// The figures: ours, the peer's, and their ratio (which the goal
    /// judges, unless [`Row::judging`] says otherwise).
    fn figures(&mut self, ours: String, peer: String, ratio: Option<f64>) {
        self.ours = ours;
        self.peer = peer;
        self.ratio = ratio;
        if self.judged.is_none() {
            self.judged = ratio;
        }
    }

    /// Why there will be no figure if none comes, as is.
    fn missing_unless_run(mut self, why: &str) -> Self {
        self.missing = Some(why.to_owned());
        self
    }

    fn judging(mut self, value: Option<f64>) -> Self {
        self.judged = value;
        self
    }

    /// No figure, because of `why` (a part that failed, or was skipped
    /// for a missing tool: it says so itself).
    fn without(mut self, why: &str) -> Self {
        self.missing = Some(if why.starts_with("skipped") {
            why.to_owned()
        } else {
            format!("failed: {why}")
        });
        self
    }

    pub(crate) fn status(&self) -> Status {
        if self.ratio.is_none() && self.judged.is_none() {
            return Status::NoFigure(
                self.missing.clone().unwrap_or_else(|| "not run".to_owned()),
            );
        }
        if self.void.is_some() {
            return Status::NotMet;
        }
        match self.judged.and_then(|value| self.goal.met(value)) {
            Some(true) => Status::Met,
            Some(false) => Status::NotMet,
            None => Status::Info,
        }
    }

    /// The goal as shown: with what voids the figure, if anything.
    pub(crate) fn goal_text(&self) -> String {
        match &self.void {
            Some(void) => format!("{} ({void}!)", self.goal),
            None => self.goal.to_string(),
        }
    }

    /// Ours as shown: the figure, or why there is none.
    pub(crate) fn ours_text(&self) -> String {
        match self.status() {
            Status::NoFigure(why) => why,
            _ => self.ours.clone(),
        }
    }
}

/// Every row, in the table's order.
pub(crate) fn rows(results: &Results) -> Vec<Row> {
    let mut rows = hot_path(results);
    rows.extend(limits(results));
    rows.extend(http(&results.http));
    rows.extend(redis(&results.redis));
    rows.extend(redis_cpu(&results.redis_cpu));
    rows.extend(breaker(results));
    rows.extend(memory(&results.memory, &results.memory_peer));
    rows.extend(service(&results.rls));
    rows
}

/// Why a criterion row has no figure: a target that did not build, else
/// a filter after `--`.
fn criterion_missing(results: &Results, target: &str) -> String {
    results
        .criterion_missing
        .iter()
        .find(|(t, _)| *t == target)
        .map_or_else(
            || "not run (filtered out after `--`?)".to_owned(),
            |(_, why)| format!("failed: {why}"),
        )
}

fn hot_path(results: &Results) -> Vec<Row> {
    let criterion = &results.criterion;
    let missing = criterion_missing(results, "check");
    let mut decision = Row::new(
        "gcra-core: one decision (`Quota::check`)",
        Goal::Info("(no peer: for scale)"),
    )
    .missing_unless_run(&missing);
    if let Some(t) = criterion.ns("gcra_core", "decision") {
        decision.figures(ns(t), "—".to_owned(), None);
        decision.judged = Some(t);
    }
    let mut rows = vec![decision];
    for (group, label) in [
        ("memory_one_key", "memory, 1 hot key"),
        ("memory_100k_keys", "memory, 100k keys round-robin"),
        ("memory_2_threads_one_key", "memory, 2 threads, 1 hot key"),
        ("memory_2_threads_100k_keys", "memory, 2 threads, 100k keys"),
    ] {
        let mut row = Row::new(
            format!(
                "{label}: `RateTier::check` vs governor `check_key` (time per check)"
            ),
            Goal::at_most(1.0),
        )
        .missing_unless_run(&missing);
        let ours = criterion.ns(group, "tower_rate_tier");
        let peer = criterion.ns(group, "governor");
        let ratio = criterion.ratio(group, "tower_rate_tier", "governor");
        if let (Some(ours), Some(peer), Some(ratio)) = (ours, peer, ratio) {
            row.figures(ns(ours), ns(peer), Some(ratio));
        }
        rows.push(row);
    }
    // A full store keeps serving new ids at about the usual cost.
    let mut flood = Row::new(
        "memory, full store after a flood of 20× its capacity of one-shot ids: \
         time per check of a new id vs of an existing id, unflooded",
        Goal::at_most(5.0),
    )
    .missing_unless_run(&missing);
    if let (Some(flooded), Some(unflooded), Some(ratio)) = (
        criterion.ns("memory_flood", "flooded"),
        criterion.ns("memory_flood", "unflooded"),
        criterion.ratio("memory_flood", "flooded", "unflooded"),
    ) {
        flood.figures(
            ns(flooded),
            format!("{} (unflooded)", ns(unflooded)),
            Some(ratio),
        );
    }
    rows.push(flood);
    rows
}

/// Several limits of one user as one decision, in memory.
fn limits(results: &Results) -> Vec<Row> {
    let criterion = &results.criterion;
    let missing = criterion_missing(results, "limits");
    // (group, 3 limits, 1 limit, label, goal)
    let cases = [
        (
            "limits_one_user",
            "three_limits",
            "one_limit",
            "1 hot user",
            Goal::below(3.0),
        ),
        (
            "limits_100k_users",
            "three_limits",
            "one_limit",
            "100k users round-robin",
            Goal::below(3.0),
        ),
    ];
    let mut rows: Vec<Row> = cases
        .into_iter()
        .map(|(group, three, one, label, goal)| {
            let mut row = Row::new(
                format!(
                    "Several limits, memory, {label}: plan + 2 `Limit`s in one \
                     `RateTier::decide` vs the plan alone (`RateTier::check`)"
                ),
                goal,
            )
            .missing_unless_run(&missing);
            if let (Some(t), Some(o), Some(ratio)) = (
                criterion.ns(group, three),
                criterion.ns(group, one),
                criterion.ratio(group, three, one),
            ) {
                row.figures(ns(t), format!("{} (1 limit)", ns(o)), Some(ratio));
            }
            row
        })
        .collect();
    // Where the time goes: the store's share of the rows above.
    let group = "limits_store_one_user";
    let mut store = Row::new(
        "Several limits, the store alone (`MemoryStorage::check_sync`), 1 hot \
         user: 3 buckets vs 1",
        Goal::Info("(info)"),
    )
    .missing_unless_run(&missing);
    if let (Some(t), Some(o), Some(ratio)) = (
        criterion.ns(group, "three_buckets"),
        criterion.ns(group, "one_bucket"),
        criterion.ratio(group, "three_buckets", "one_bucket"),
    ) {
        store.figures(ns(t), format!("{} (1 bucket)", ns(o)), Some(ratio));
    }
    rows.push(store);
    rows
}

fn ns(value: f64) -> String {
    if value >= 1000.0 {
        format!("{:.2} µs", value / 1000.0)
    } else {
        format!("{value:.1} ns")
    }
}

fn http(http: &Outcome<Value>) -> Vec<Row> {
    let mut vs_none = Row::new(
        "HTTP req/s: `TierLimitLayer` (memory) vs no layer",
        Goal::at_least(0.95),
    );
    let mut vs_governor = Row::new(
        "HTTP req/s: `TierLimitLayer` vs tower_governor",
        Goal::at_least(1.05),
    );
    let mut cpu = Row::new(
        "HTTP server CPU per request: layer vs no layer / vs tower_governor",
        Goal::Info("(info)"),
    );
    let http = match http {
        Ok(http) => http,
        Err(why) => {
            return [vs_none, vs_governor, cpu]
                .map(|row| row.without(why))
                .into();
        }
    };
    if let (Some(ours), Some(none), Some(governor)) = (
        num(http, "tower_rate_tier_rps"),
        num(http, "no_layer_rps"),
        num(http, "tower_governor_rps"),
    ) {
        vs_none.figures(
            per_sec(ours, "req/s"),
            per_sec(none, "req/s"),
            num(http, "ratio_layer_vs_no_layer"),
        );
        vs_governor.figures(
            per_sec(ours, "req/s"),
            per_sec(governor, "req/s"),
            num(http, "ratio_layer_vs_tower_governor"),
        );
        let errors: f64 = ["no_layer", "tower_rate_tier", "tower_governor"]
            .iter()
            .filter_map(|name| num(http, &format!("{name}_errors")))
            .sum();
        if errors > 0.0 {
            // Not 200s or socket errors: the figures are not comparable.
            vs_none.void = Some(format!("{errors} errors"));
            vs_governor.void = Some(format!("{errors} errors"));
        }
    }
    if let (Some(ours), Some(none), Some(governor)) = (
        num(http, "tower_rate_tier_cpu_us"),
        num(http, "no_layer_cpu_us"),
        num(http, "tower_governor_cpu_us"),
    ) {
        let vs_governor =
            num(http, "cpu_ratio_layer_vs_tower_governor").unwrap_or(f64::NAN);
        cpu.figures(
            format!("{ours:.2} µs"),
            format!(
                "{none:.2} µs / {governor:.2} µs (ratio vs tower_governor \
                 {vs_governor:.3})"
            ),
            num(http, "cpu_ratio_layer_vs_no_layer"),
        );
    }
    vec![vs_none, vs_governor, cpu]
}

fn redis(redis: &Outcome<Value>) -> Vec<Row> {
    let mut ceiling = Row::new(
        "Redis checks/s: `RedisStorage`, 64 tasks on 1 multiplexed connection, vs \
         redis-benchmark `-c 64` EVALSHA",
        Goal::at_least(0.8),
    );
    let mut pipelined = Row::new(
        "Redis checks/s: the same vs redis-benchmark `-c 1 -P 64` (pipelined, our shape)",
        Goal::Info("(info)"),
    );
    // 3 limits of one user are one round trip.
    let mut trips = Row::new(
        "Redis, 3 limits of one user (`RateTier::decide`, plan + 2 `Limit`s): \
         commands sent per decision (`MONITOR`)",
        Goal::at_most(1.0).on("commands", " per decision"),
    );
    let mut three = Row::new(
        "Redis, 3 limits of one user vs the plan alone: time per decision, one \
         at a time",
        Goal::Info("(info)"),
    );
    let redis = match redis {
        Ok(redis) => redis,
        Err(why) => {
            return [ceiling, pipelined, trips, three]
                .map(|row| row.without(why))
                .into();
        }
    };
    if let Some(sent) = num(redis, "limits_commands_per_decision") {
        let scripts =
            num(redis, "limits_script_calls_per_decision").unwrap_or(f64::NAN);
        let keys = num(redis, "limits_keys_per_decision").unwrap_or(f64::NAN);
        trips = trips.judging(Some(sent));
        trips.figures(
            format!(
                "{sent:.3} ({scripts:.3} script calls, {keys:.3} keys written)"
            ),
            "—".to_owned(),
            None,
        );
        // Fewer than 3 keys a decision: not every limit was decided.
        let refused = num(redis, "limits_refused").unwrap_or(0.0);
        if keys.is_nan() || keys < 3.0 || refused > 0.0 {
            trips.void =
                Some(format!("{keys:.3} keys a decision, {refused} refused"));
        }
    }
    if let (Some(all), Some(one)) =
        (num(redis, "limits_three_us"), num(redis, "limits_one_us"))
    {
        three.figures(
            format!("{all:.1} µs"),
            format!("{one:.1} µs (1 limit)"),
            num(redis, "limits_time_ratio"),
        );
    }
    if let (Some(ours), Some(peer)) = (
        num(redis, "ours_per_sec"),
        num(redis, "redis_benchmark_per_sec"),
    ) {
        ceiling.figures(
            per_sec(ours, "/s"),
            per_sec(peer, "/s"),
            num(redis, "ratio"),
        );
        if let Some(errors) = num(redis, "errors").filter(|e| *e > 0.0) {
            ceiling.void = Some(format!("{errors} errors"));
        }
        if let Some(peer) = num(redis, "redis_benchmark_pipelined_per_sec") {
            pipelined.figures(
                per_sec(ours, "/s"),
                per_sec(peer, "/s"),
                num(redis, "ratio_pipelined"),
            );
        }
    }
    vec![ceiling, pipelined, trips, three]
}

/// The Redis CPU rows: each script call against the commands it cannot
/// avoid (TIME, and a GET and a SET PX per key), measured in the same round.
fn redis_cpu(cpu: &Outcome<RedisCpu>) -> Vec<Row> {
    // (case, keys its floor counts, label, goal)
    let scripts: [(&str, usize, &str, Goal); 4] = [
        ("gcra", 1, "`gcra.lua` (1 limit)", Goal::at_most(5.0)),
        (
            "gcra_all_1",
            1,
            "`gcra_all.lua`, 1 key (a peek, a shadow limit)",
            Goal::at_most(5.0),
        ),
        (
            "gcra_all_3",
            3,
            "`gcra_all.lua`, 3 keys of one user",
            Goal::at_most(5.0),
        ),
        (
            "gcra_settle",
            1,
            "`gcra_settle.lua`, 1 key (a debt)",
            Goal::at_most(5.0),
        ),
    ];
    let mut rows: Vec<Row> = scripts
        .iter()
        .map(|(_, keys, label, goal)| {
            let floor = match keys {
                1 => "GET + SET PX + TIME".to_owned(),
                n => format!("{n} × (GET + SET PX) + TIME"),
            };
            Row::new(
                format!("Redis CPU per call: {label}, server µs vs {floor}"),
                goal.clone(),
            )
        })
        .collect();
    let mut three = Row::new(
        "Redis CPU: 3 limits of one user in one call vs 1 limit \
         (`gcra_all.lua` 3 keys / `gcra.lua`)",
        Goal::at_most(2.0),
    );
    let mut fcall = Row::new(
        "Redis CPU: `gcra.lua` as a Redis 7 function (`FCALL`) vs `EVALSHA`",
        Goal::Info("(info: < 1.0 = cheaper)"),
    );
    let cpu = match cpu {
        Ok(cpu) => cpu,
        Err(why) => {
            rows.extend([three, fcall]);
            return rows.into_iter().map(|row| row.without(why)).collect();
        }
    };
    let failed = |case: &str| {
        cpu.failed.get(case).map_or_else(
            || "not run".to_owned(),
            |why| format!("failed: {why}"),
        )
    };
    // Per round: the case's µs, and its ratio to `denominator` of the same round.
    let per_round = |case: &str,
                     denominator: &dyn Fn(
        &super::runner::CpuRound,
    ) -> Option<f64>| {
        let mut us = Vec::new();
        let mut ratios = Vec::new();
        for round in &cpu.rounds {
            if let (Some(&v), Some(d)) =
                (round.calls.get(case), denominator(round))
            {
                us.push(v);
                ratios.push(v / d);
            }
        }
        (median(us), median(ratios))
    };
    for (row, (case, keys, _, _)) in rows.iter_mut().zip(&scripts) {
        let floor =
            |round: &super::runner::CpuRound| Some(round.floor.for_keys(*keys));
        let (us, ratio) = per_round(case, &floor);
        let floor_us = median(
            cpu.rounds.iter().map(|r| r.floor.for_keys(*keys)).collect(),
        );
        match (us, floor_us) {
            (Some(us), Some(floor_us)) => row.figures(
                format!("{us:.2} µs"),
                format!("{floor_us:.2} µs"),
                ratio,
            ),
            _ => row.missing = Some(failed(case)),
        }
    }
    let (us, ratio) =
        per_round("gcra_all_3", &|round| round.calls.get("gcra").copied());
    let single = median(
        cpu.rounds
            .iter()
            .filter_map(|r| r.calls.get("gcra").copied())
            .collect(),
    );
    match (us, single) {
        (Some(us), Some(single)) => {
            three.figures(
                format!("{us:.2} µs"),
                format!("{single:.2} µs"),
                ratio,
            );
        }
        _ => three.missing = Some(failed("gcra_all_3")),
    }
    let (us, ratio) =
        per_round("gcra_fcall", &|round| round.calls.get("gcra").copied());
    match (us, single) {
        (Some(us), Some(single)) => {
            fcall.figures(
                format!("{us:.2} µs"),
                format!("{single:.2} µs"),
                ratio,
            );
        }
        _ => fcall.missing = Some(failed("gcra_fcall")),
    }
    rows.extend([three, fcall]);
    rows
}

fn breaker(results: &Results) -> Vec<Row> {
    let criterion = &results.criterion;
    let missing = criterion_missing(results, "breaker");
    [
        ("breaker_open_storage", "`Storage::check`"),
        ("breaker_open_rate_tier", "`RateTier::check`"),
    ]
    .into_iter()
    .map(|(group, label)| {
        let added = criterion.difference(group, "fallback_open", "memory");
        let mut row = Row::new(
            format!(
                "Breaker open (Redis down): added time per check, {label} vs memory"
            ),
            Goal::below(5.0).on("added", " µs"),
        )
        .missing_unless_run(&missing)
        .judging(added.map(|ns| ns / 1000.0));
        let open = criterion.ns(group, "fallback_open");
        let memory = criterion.ns(group, "memory");
        if let (Some(open), Some(memory), Some(added)) = (open, memory, added) {
            let sign = if added < 0.0 { "−" } else { "+" };
            row.figures(
                format!("{} ({sign}{})", ns(open), ns(added.abs())),
                format!("{} (memory)", ns(memory)),
                criterion.ratio(group, "fallback_open", "memory"),
            );
        }
        row
    })
    .collect()
}

fn memory(memory: &Outcome<Value>, memory_peer: &Outcome<Value>) -> Vec<Row> {
    let mut peak = Row::new(
        "Memory: RSS growth after 1M distinct keys, vs governor",
        Goal::Info("(info)"),
    );
    // Idle after every wave, not only the first. The bound: what
    // glibc kept before (half the peak) is 10× it; measured: under 0.01.
    let mut worst = Row::new(
        "Memory: RSS growth once idle, the worst wave of several (1M, 500k, \
         1M, 250k, 1M keys; ratio: of the peak growth)",
        Goal::at_most(0.05),
    );
    let memory = match memory {
        Ok(memory) => memory,
        Err(why) => {
            return [peak, worst].map(|row| row.without(why)).into();
        }
    };
    let growth =
        |v: &Value, key: &str| Some(num(v, key)? - num(v, "baseline_kib")?);
    let peer = memory_peer.as_ref().ok();
    if let Some(ours_peak) = growth(memory, "wave1_after_insert_kib") {
        let peer_peak = peer.and_then(|p| growth(p, "after_insert_kib"));
        peak.figures(
            format!(
                "+{} (from {})",
                mib(ours_peak),
                mib(num(memory, "baseline_kib").unwrap_or(0.0))
            ),
            peer_peak
                .map_or_else(|| "—".to_owned(), |p| format!("+{}", mib(p))),
            peer_peak.map(|p| ours_peak / p),
        );
    }
    if let (Some(idle), Some(peak_growth), Some(wave), Some(waves)) = (
        num(memory, "worst_idle_growth_kib"),
        num(memory, "peak_growth_kib"),
        num(memory, "worst_idle_wave"),
        num(memory, "waves"),
    ) {
        let every: Vec<String> = (1..=waves as usize)
            .map(|w| {
                growth(memory, &format!("wave{w}_after_idle_kib")).map_or_else(
                    || "?".to_owned(),
                    |g| format!("{:.2}", g / 1024.0),
                )
            })
            .collect();
        let held = num(memory, &format!("wave{wave}_held_after_idle"))
            .unwrap_or(f64::NAN);
        let peer_idle = peer.and_then(|p| growth(p, "after_idle_kib"));
        let peer_held = peer
            .and_then(|p| num(p, "held_after_idle"))
            .unwrap_or(f64::NAN);
        worst.figures(
            format!(
                "+{} after wave {wave} of {waves} ({held} buckets held; peak +{}; \
                 every wave: +{} MiB)",
                mib(idle),
                mib(peak_growth),
                every.join(", +")
            ),
            peer_idle.map_or_else(
                || "—".to_owned(),
                |p| format!("+{} ({peer_held} held, no manual call)", mib(p)),
            ),
            Some(idle / peak_growth.max(1.0)),
        );
        // A wave read before the sweeper was done says nothing.
        if let Some(n) = num(memory, "unsettled_waves").filter(|n| *n > 0.0) {
            worst.void = Some(format!("{n} waves read before the sweep"));
        }
    }
    vec![peak, worst]
}

/// The standalone service: `ShouldRateLimit` round trips/s against the
/// ceilings that bound them, and latency at a fixed offered load.
pub(crate) fn service(rls: &Outcome<Rls>) -> Vec<Row> {
    let settings = rls.as_ref().ok().map(|rls| &rls.results);
    let setting = |key: &str, unit: &str| {
        settings
            .and_then(|v| num(v, key))
            .map_or_else(|| "?".to_owned(), |n| per_sec(n, unit))
    };
    let in_flight = setting("concurrency", "in flight");
    let offered = setting("offered_rate", "req/s offered");
    let mut memory = Row::new(
        format!(
            "Service RLS `ShouldRateLimit`/s, memory store, vs the same tonic \
             server answering a constant response ({in_flight})"
        ),
        Goal::at_least(0.8),
    );
    let mut redis = Row::new(
        format!(
            "Service RLS `ShouldRateLimit`/s on Redis vs redis-benchmark EVALSHA \
             of `gcra.lua` ({in_flight}, as many clients)"
        ),
        Goal::at_least(0.8),
    );
    // The gRPC hop's ceiling, which on a small machine is below Redis's.
    let mut redis_vs_constant = Row::new(
        "Service RLS on Redis vs the constant tonic server (the gRPC hop's \
         ceiling, from the memory row)",
        Goal::Info("(info)"),
    );
    let mut memory_latency = Row::new(
        format!(
            "Service RLS latency p50 / p99 at {offered}, memory store vs the \
             constant server (ratio: of the p50s)"
        ),
        Goal::Info("(info)"),
    );
    let mut redis_latency = Row::new(
        format!(
            "Service RLS latency p50 / p99 at {offered}, on Redis vs the \
             constant server (ratio: of the p50s)"
        ),
        Goal::Info("(info)"),
    );
    let (results, no_redis) = match rls {
        Ok(rls) => (&rls.results, rls.no_redis.as_deref()),
        Err(why) => {
            return [
                memory,
                redis,
                redis_vs_constant,
                memory_latency,
                redis_latency,
            ]
            .map(|row| row.without(why))
            .into();
        }
    };
    let latency = |name: &str| {
        let p50 = num(results, &format!("{name}_p50_us"))?;
        let p99 = num(results, &format!("{name}_p99_us"))?;
        Some((p50, format!("p50 {p50:.0} µs / p99 {p99:.0} µs")))
    };
    let constant_rps = num(results, "constant_rps");
    if let (Some(ours), Some(peer)) = (num(results, "memory_rps"), constant_rps)
    {
        memory.figures(
            per_sec(ours, "/s"),
            per_sec(peer, "/s (constant)"),
            num(results, "memory_ratio"),
        );
    }
    let constant_latency = latency("constant");
    for (row, name) in [
        (&mut memory_latency, "memory"),
        (&mut redis_latency, "redis"),
    ] {
        if let (Some((ours, text)), Some((peer, peer_text))) =
            (latency(name), &constant_latency)
        {
            row.figures(
                text,
                format!("{peer_text} (constant)"),
                Some(ours / peer),
            );
        }
    }
    if let Some(why) = no_redis {
        return vec![
            memory,
            redis.without(why),
            redis_vs_constant.without(why),
            memory_latency,
            redis_latency.without(why),
        ];
    }
    if let Some(ours) = num(results, "redis_rps") {
        if let Some(peer) = num(results, "redis_benchmark_rps") {
            redis.figures(
                per_sec(ours, "/s"),
                per_sec(peer, "/s (redis-benchmark)"),
                num(results, "redis_ratio"),
            );
        }
        if let Some(peer) = constant_rps {
            redis_vs_constant.figures(
                per_sec(ours, "/s"),
                per_sec(peer, "/s (constant)"),
                num(results, "redis_vs_constant_ratio"),
            );
        }
    }
    vec![
        memory,
        redis,
        redis_vs_constant,
        memory_latency,
        redis_latency,
    ]
}

fn per_sec(value: f64, unit: &str) -> String {
    format!("{} {unit}", thousands(value.round() as u64))
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn mib(kib: f64) -> String {
    format!("{:.1} MiB", kib / 1024.0)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::runner::{CpuRound, Floor};
    use super::*;

    fn results(redis_cpu: Outcome<RedisCpu>) -> Results {
        Results {
            criterion: Passes::default(),
            criterion_missing: vec![(
                "check",
                "bench target `check` did not build".to_owned(),
            )],
            http: Err("the `http` target did not build".to_owned()),
            redis: Err("skipped: no redis-benchmark".to_owned()),
            redis_cpu,
            memory: Err("the `memory` target did not build".to_owned()),
            memory_peer: Err("the `memory` target did not build".to_owned()),
            rls: Err("bench target `rls` did not build".to_owned()),
        }
    }

    #[test]
    fn a_part_that_failed_keeps_its_rows_and_says_why() {
        let rows = rows(&results(Err("skipped: no redis-server".to_owned())));
        let check = &rows[1];
        assert!(check.metric.starts_with("memory, 1 hot key"));
        assert_eq!(
            check.status(),
            Status::NoFigure(
                "failed: bench target `check` did not build".to_owned()
            )
        );
        let breaker = rows
            .iter()
            .find(|r| r.metric.starts_with("Breaker open"))
            .unwrap();
        assert_eq!(
            breaker.status(),
            Status::NoFigure("not run (filtered out after `--`?)".to_owned())
        );
        for row in &rows {
            assert!(
                matches!(row.status(), Status::NoFigure(_)),
                "{} has a figure",
                row.metric
            );
        }
    }

    #[test]
    fn redis_cpu_ratios_are_medians_of_same_round_ratios() {
        let round = |get, script: f64, three: f64| CpuRound {
            floor: Floor {
                get,
                set: 1.0,
                time: 0.5,
            },
            calls: BTreeMap::from([
                ("gcra", script),
                ("gcra_all_1", script),
                ("gcra_all_3", three),
                ("gcra_settle", script),
            ]),
        };
        let cpu = RedisCpu {
            // Floors 2.0, 2.5, 3.0; the slow round is slow everywhere.
            rounds: vec![
                round(0.5, 8.0, 14.0),
                round(1.0, 10.0, 22.0),
                round(1.5, 18.0, 30.0),
            ],
            failed: BTreeMap::from([(
                "gcra_fcall",
                "not measured: this server has no functions".to_owned(),
            )]),
            commands: Vec::new(),
        };
        let rows = rows(&results(Ok(cpu)));
        let row = |prefix: &str| {
            rows.iter().find(|r| r.metric.starts_with(prefix)).unwrap()
        };
        let single = row("Redis CPU per call: `gcra.lua`");
        // Ratios 4.0, 4.0, 6.0: the median is 4.0, met.
        assert_eq!(single.ratio, Some(4.0));
        assert_eq!(single.status(), Status::Met);
        assert_eq!(single.ours, "10.00 µs");
        let three = row("Redis CPU per call: `gcra_all.lua`, 3 keys");
        // Floors for 3 keys: 5.0, 6.5, 8.0; ratios 2.8, 3.38.., 3.75.
        assert_eq!(three.ratio, Some(22.0 / 6.5));
        let per_limit = row("Redis CPU: 3 limits");
        // 14/8, 22/10, 30/18: 1.75, 2.2, 1.67 -> 1.75, met.
        assert_eq!(per_limit.ratio, Some(1.75));
        assert_eq!(per_limit.status(), Status::Met);
        assert_eq!(
            row("Redis CPU: `gcra.lua` as a Redis 7").status(),
            Status::NoFigure(
                "failed: not measured: this server has no functions".to_owned()
            )
        );
    }

    #[test]
    fn the_worst_wave_and_one_round_trip_are_judged() {
        let mut results = results(Err("skipped: no redis-server".to_owned()));
        results.memory = Ok(serde_json::json!({
            "baseline_kib": 2048.0, "waves": 2.0, "unsettled_waves": 0.0,
            "wave1_after_insert_kib": 40960.0, "wave1_after_idle_kib": 2304.0,
            "wave2_after_idle_kib": 3072.0, "wave2_held_after_idle": 0.0,
            "peak_growth_kib": 40960.0, "worst_idle_growth_kib": 1024.0,
            "worst_idle_wave": 2.0,
        }));
        results.redis = Ok(serde_json::json!({
            "limits_commands_per_decision": 1.0,
            "limits_script_calls_per_decision": 1.0,
            "limits_keys_per_decision": 2.0, "limits_refused": 0.0,
        }));
        let rows = rows(&results);
        let row = |prefix: &str| {
            rows.iter().find(|r| r.metric.starts_with(prefix)).unwrap()
        };
        let worst = row("Memory: RSS growth once idle");
        assert_eq!(worst.ratio, Some(0.025));
        assert_eq!(worst.status(), Status::Met);
        assert!(worst.ours.contains("every wave: +0.25, +1.00 MiB"));
        let trips = row("Redis, 3 limits of one user (");
        assert_eq!(trips.judged, Some(1.0));
        assert_eq!(trips.goal.to_string(), "commands ≤ 1.0 per decision");
        // 2 keys a decision: a limit was not decided, the figure is void.
        assert_eq!(trips.status(), Status::NotMet);
    }

    #[test]
    fn the_service_rows_judge_both_ceilings_and_say_why_redis_has_none() {
        let mut results = results(Err("skipped: no redis-server".to_owned()));
        let mut json = serde_json::json!({
            "concurrency": 64.0, "offered_rate": 5000.0,
            "memory_rps": 18000.0, "constant_rps": 20000.0, "memory_ratio": 0.9,
            "memory_p50_us": 150.0, "memory_p99_us": 400.0,
            "constant_p50_us": 120.0, "constant_p99_us": 300.0,
        });
        // The memory and latency parts alone: the Redis rows say why.
        results.rls = Ok(Rls {
            results: json.clone(),
            no_redis: Some("skipped: no redis-benchmark".to_owned()),
        });
        let all = rows(&results);
        let row = |rows: &[Row], prefix: &str| {
            let row = rows.iter().find(|r| r.metric.starts_with(prefix));
            (
                row.unwrap().ratio,
                row.unwrap().status(),
                row.unwrap().ours.clone(),
            )
        };
        let memory = "Service RLS `ShouldRateLimit`/s, memory store";
        let redis = "Service RLS `ShouldRateLimit`/s on Redis";
        let grpc_ceiling = "Service RLS on Redis vs the constant";
        let latency =
            "Service RLS latency p50 / p99 at 5,000 req/s offered, memory";
        let redis_latency =
            "Service RLS latency p50 / p99 at 5,000 req/s offered, on Redis";
        assert_eq!(
            row(&all, memory),
            (Some(0.9), Status::Met, "18,000 /s".to_owned())
        );
        assert_eq!(
            row(&all, latency),
            (
                Some(1.25),
                Status::Info,
                "p50 150 µs / p99 400 µs".to_owned()
            )
        );
        for prefix in [redis, grpc_ceiling, redis_latency] {
            assert_eq!(
                row(&all, prefix).1,
                Status::NoFigure("skipped: no redis-benchmark".to_owned())
            );
        }

        // With Redis: below 0.8 of redis-benchmark is not met, whatever
        // the reason; the gRPC ceiling row is for information.
        let redis_json = serde_json::json!({
            "redis_rps": 12000.0, "redis_benchmark_rps": 48000.0,
            "redis_ratio": 0.25, "redis_vs_constant_ratio": 0.6,
            "redis_p50_us": 240.0, "redis_p99_us": 900.0,
        });
        json.as_object_mut()
            .unwrap()
            .extend(redis_json.as_object().unwrap().clone());
        results.rls = Ok(Rls {
            results: json,
            no_redis: None,
        });
        let all = rows(&results);
        assert_eq!(
            row(&all, redis),
            (Some(0.25), Status::NotMet, "12,000 /s".to_owned())
        );
        assert_eq!(row(&all, grpc_ceiling).0, Some(0.6));
        assert_eq!(row(&all, grpc_ceiling).1, Status::Info);
        assert_eq!(row(&all, redis_latency).0, Some(2.0));
        let goals: Vec<String> = all
            .iter()
            .filter(|r| r.metric.starts_with("Service RLS `"))
            .map(|r| r.goal.to_string())
            .collect();
        assert_eq!(goals, ["≥ 0.8", "≥ 0.8"]);
    }

    #[test]
    fn errors_void_a_figure() {
        let mut row = Row::new("x", Goal::at_least(0.8));
        row.figures("1".to_owned(), "1".to_owned(), Some(1.0));
        assert_eq!(row.status(), Status::Met);
        row.void = Some("3 errors".to_owned());
        assert_eq!(row.status(), Status::NotMet);
        assert_eq!(row.goal_text(), "≥ 0.8 (3 errors!)");
    }
}
