//! The table: one function per section, each turning what its part
//! measured into rows. A new row is a [`Row`] with its [`Goal`] in the
//! section it belongs to (a new part: a field of [`Results`] filled in
//! `mod.rs`, and a section here).

use serde_json::Value;

use super::goal::Goal;
use super::parse::{Passes, median, num};
use super::runner::{Outcome, RedisCpu};

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
    rows.extend(http(&results.http));
    rows.extend(redis(&results.redis));
    rows.extend(redis_cpu(&results.redis_cpu));
    rows.extend(breaker(results));
    rows.extend(memory(&results.memory, &results.memory_peer));
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
        Goal::above(1.0),
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
    let redis = match redis {
        Ok(redis) => redis,
        Err(why) => {
            return [ceiling, pipelined].map(|row| row.without(why)).into();
        }
    };
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
    vec![ceiling, pipelined]
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
    let mut idle = Row::new(
        "Memory: RSS growth once their period passed, store idle (ratio: of the peak growth)",
        Goal::at_most(0.10),
    );
    // A second wave of as many new keys, then idle again: reused or lost?
    let mut wave2 = Row::new(
        "Memory: RSS growth after a second wave of 1M new keys, idle again \
         (ratio: of the first wave's)",
        Goal::Info("(info: 1.0 = reused)"),
    );
    let memory = match memory {
        Ok(memory) => memory,
        Err(why) => {
            return [peak, idle, wave2].map(|row| row.without(why)).into();
        }
    };
    let growth =
        |v: &Value, key: &str| Some(num(v, key)? - num(v, "baseline_kib")?);
    if let (Some(ours_peak), Some(ours_idle)) = (
        growth(memory, "after_insert_kib"),
        growth(memory, "after_idle_kib"),
    ) {
        let held = num(memory, "held_after_idle").unwrap_or(f64::NAN);
        let peer = memory_peer.as_ref().ok();
        let peer_peak = peer.and_then(|p| growth(p, "after_insert_kib"));
        let peer_idle = peer.and_then(|p| growth(p, "after_idle_kib"));
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
        let peer_held = peer
            .and_then(|p| num(p, "held_after_idle"))
            .unwrap_or(f64::NAN);
        idle.figures(
            format!("+{} ({held} buckets held)", mib(ours_idle)),
            peer_idle.map_or_else(
                || "—".to_owned(),
                |p| format!("+{} ({peer_held} held, no manual call)", mib(p)),
            ),
            Some(ours_idle / ours_peak),
        );
    }
    if let (Some(first), Some(second)) = (
        growth(memory, "after_idle_kib"),
        growth(memory, "wave2_after_idle_kib"),
    ) {
        let held = num(memory, "wave2_held_after_idle").unwrap_or(f64::NAN);
        wave2.figures(
            format!("+{} ({held} buckets held)", mib(second)),
            "—".to_owned(),
            Some(second / first),
        );
    }
    vec![peak, idle, wave2]
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
    fn errors_void_a_figure() {
        let mut row = Row::new("x", Goal::at_least(0.8));
        row.figures("1".to_owned(), "1".to_owned(), Some(1.0));
        assert_eq!(row.status(), Status::Met);
        row.void = Some("3 errors".to_owned());
        assert_eq!(row.status(), Status::NotMet);
        assert_eq!(row.goal_text(), "≥ 0.8 (3 errors!)");
    }
}
