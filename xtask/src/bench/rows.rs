//! The table: one function per section, each turning what its part
//! measured into rows. A new row is a [`Row`] in the section it belongs
//! to, judged by a goal of [`GOALS`](super::goal::GOALS) or with a note (a
//! new part: a [`Part`] in `plan.rs`, a field of [`Results`] filled in
//! `mod.rs`, its results struct in `crates/bench-results`, and a section
//! here, in [`sections`]).

use rate_tier_bench_results::{
    GovernorMemoryResults, HttpResults, InstructionsResults, Latency,
    MemoryResults, PostgresResults, RedisResults, ShaperResults, VersusRound,
};

use super::goal::{Goal, GoalId};
use super::parse::{Passes, median};
use super::plan::Part;
use super::runner::{Limitador, Outcome, RedisCpu, Rls};

/// Everything one run measured; each part, or why it has no figure.
pub(crate) struct Results {
    pub(crate) criterion: Passes,
    /// Why criterion rows are missing, per bench target that did not build.
    pub(crate) criterion_missing: Vec<(&'static str, String)>,
    /// Why the kinds and reserve rows on Redis have no figure, when they
    /// have none (no Redis programs, or a throwaway Redis that did not
    /// start).
    pub(crate) criterion_no_redis: Option<String>,
    /// The shaper example.
    pub(crate) shaper: Outcome<ShaperResults>,
    pub(crate) http: Outcome<HttpResults>,
    pub(crate) redis: Outcome<RedisResults>,
    pub(crate) redis_cpu: Outcome<RedisCpu>,
    pub(crate) memory: Outcome<MemoryResults>,
    pub(crate) memory_peer: Outcome<GovernorMemoryResults>,
    /// Instructions counted by callgrind.
    pub(crate) instructions: Outcome<InstructionsResults>,
    /// The standalone service's RLS part.
    pub(crate) rls: Outcome<Rls>,
    /// The service against limitador-server.
    pub(crate) limitador: Outcome<Limitador>,
    pub(crate) postgres: Outcome<PostgresResults>,
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
    /// The entry of the goals table the goal comes from (none for a note).
    pub(crate) goal_id: Option<GoalId>,
    /// The figure the goal judges: the ratio unless the goal names another.
    pub(crate) judged: Option<f64>,
    /// Something that voids the figure (errors during the run): not met.
    pub(crate) void: Option<String>,
    /// Why there is no figure, when there is none.
    pub(crate) missing: Option<String>,
}

impl Row {
    /// A row judged by the goal `id` of the goals table.
    pub(crate) fn judged_by(metric: impl Into<String>, id: GoalId) -> Self {
        Row {
            goal_id: Some(id),
            ..Row::new(metric, id.entry().goal.clone())
        }
    }

    /// A row with no goal, shown for scale or information, with `note`.
    pub(crate) fn info(metric: impl Into<String>, note: &'static str) -> Self {
        Row::new(metric, Goal::Info(note))
    }

    fn new(metric: impl Into<String>, goal: Goal) -> Self {
        Row {
            metric: metric.into(),
            ours: String::new(),
            peer: "—".to_owned(),
            ratio: None,
            goal,
            goal_id: None,
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
    /// Its figures from a criterion group: `bench` against `peer` of the
    /// same passes, the peer shown with its name.
    fn against(
        mut self,
        criterion: &Passes,
        group: &str,
        (bench, peer): (&str, &str),
    ) -> Self {
        if let (Some(ours), Some(theirs), Some(ratio)) = (
            criterion.ns(group, bench),
            criterion.ns(group, peer),
            criterion.ratio(group, bench, peer),
        ) {
            self.figures(
                ns(ours),
                format!("{} ({peer})", ns(theirs)),
                Some(ratio),
            );
        }
        self
    }

    fn missing_unless_run(mut self, why: &str) -> Self {
        self.missing = Some(why.to_owned());
        self
    }

    fn judging(mut self, value: Option<f64>) -> Self {
        self.judged = value;
        self
    }

    /// No figure, because of `why` (a part that failed, or was skipped
    /// or not measured for a missing tool: it says so itself).
    fn without(mut self, why: &str) -> Self {
        self.missing = Some(
            if why.starts_with("skipped") || why.starts_with("not measured") {
                why.to_owned()
            } else {
                format!("failed: {why}")
            },
        );
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
#[cfg(test)]
pub(crate) fn rows(results: &Results) -> Vec<Row> {
    sections(results)
        .into_iter()
        .flat_map(|(_, rows)| rows)
        .collect()
}

/// Every part's rows, in the table's order (`--only` keeps its parts').
pub(crate) fn sections(results: &Results) -> Vec<(Part, Vec<Row>)> {
    vec![
        (Part::Check, hot_path(results)),
        (Part::Limits, limits(results)),
        (Part::Instructions, instructions(&results.instructions)),
        (Part::Kinds, kinds(results)),
        (Part::Reserve, reserve(results)),
        (Part::Shaper, shaper(&results.shaper)),
        (Part::Http, http(&results.http)),
        (Part::RedisStore, redis(&results.redis)),
        (Part::RedisCpu, redis_cpu(&results.redis_cpu)),
        (Part::Breaker, breaker(results)),
        (Part::Memory, memory(&results.memory, &results.memory_peer)),
        (Part::Rls, service(&results.rls)),
        (Part::Limitador, limitador(&results.limitador)),
        (Part::Postgres, postgres(&results.postgres)),
    ]
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
    let mut decision = Row::info(
        "gcra-core: one decision (`Quota::check`)",
        "(no peer: for scale)",
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
        let mut row = Row::judged_by(
            format!(
                "{label}: `RateTier::check` vs governor `check_key` (time per check)"
            ),
            GoalId::MemoryVsGovernor,
        )
        .missing_unless_run(&missing);
        let ours = criterion.ns(group, "tower_rate_tier");
        let peer = criterion.ns(group, "governor");
        let ratio = criterion.ratio(group, "tower_rate_tier", "governor");
        if let (Some(ours), Some(peer), Some(ratio)) = (ours, peer, ratio) {
            row.figures(ns(ours), ns(peer), Some(ratio));
        }
        rows.push(row);
        let mut sync = Row::judged_by(
            format!(
                "{label}: `SyncTier::check` (synchronous, `Copy` answer) vs \
                 governor `check_key` (time per check)"
            ),
            GoalId::MemoryVsGovernor,
        )
        .missing_unless_run(&missing);
        let ours = criterion.ns(group, "sync_tier");
        let ratio = criterion.ratio(group, "sync_tier", "governor");
        if let (Some(ours), Some(peer), Some(ratio)) = (ours, peer, ratio) {
            sync.figures(ns(ours), ns(peer), Some(ratio));
        }
        rows.push(sync);
    }
    // A full store keeps serving new ids at about the usual cost.
    let mut flood = Row::judged_by(
        "memory, full store after a flood of 20× its capacity of one-shot ids: \
         time per check of a new id vs of an existing id, unflooded",
        GoalId::Flood,
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
    // (group, 3 limits, 1 limit, label)
    let cases = [
        ("limits_one_user", "three_limits", "one_limit", "1 hot user"),
        (
            "limits_100k_users",
            "three_limits",
            "one_limit",
            "100k users round-robin",
        ),
    ];
    let mut rows: Vec<Row> = cases
        .into_iter()
        .map(|(group, three, one, label)| {
            let mut row = Row::judged_by(
                format!(
                    "Several limits, memory, {label}: plan + 2 `Limit`s in one \
                     `RateTier::decide` vs the plan alone (`RateTier::check`)"
                ),
                GoalId::ThreeLimits,
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
    let mut store = Row::info(
        "Several limits, the store alone (`MemoryStorage::check_sync`), 1 hot \
         user: 3 buckets vs 1",
        "(info)",
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

/// Instructions per check, and per request, counted by callgrind.
fn instructions(counted: &Outcome<InstructionsResults>) -> Vec<Row> {
    let label = |what: &str| format!("Instructions (callgrind), {what}");
    let vs_governor = |what: &str| {
        Row::judged_by(
            label(&format!("memory, {what} vs governor's `check_key`")),
            GoalId::InstructionsVsGovernor,
        )
    };
    let one_key = vs_governor("1 hot key: `RateTier::check`");
    let many_keys = vs_governor("100k keys round-robin: `RateTier::check`");
    let sync_one_key = vs_governor(
        "1 hot key: `SyncTier::check` (synchronous, `Copy` answer)",
    );
    let sync_many_keys =
        vs_governor("100k keys round-robin: `SyncTier::check`");
    let three = Row::judged_by(
        label(
            "memory, 1 hot user: plan + 2 `Limit`s in one `RateTier::decide` \
             vs the plan alone",
        ),
        GoalId::InstructionsThreeLimits,
    );
    let store = Row::info(
        label(
            "memory, 1 hot key: the store alone (`MemoryStorage::check_sync`) vs governor's `check_key`",
        ),
        "(info)",
    );
    let http = Row::judged_by(
        label(
            "HTTP through axum in process: `TierLimitLayer` vs tower_governor",
        ),
        GoalId::InstructionsHttpVsGovernor,
    );
    let layer = Row::info(
        label("HTTP through axum in process: `TierLimitLayer` vs no layer"),
        "(info)",
    );
    let mut rows = [
        one_key,
        many_keys,
        sync_one_key,
        sync_many_keys,
        three,
        store,
        http,
        layer,
    ];
    let counted = match counted {
        Ok(counted) => counted,
        Err(why) => return rows.map(|row| row.without(why)).into(),
    };
    // Each row's (ours, peer), in `rows`' order.
    let figures = [
        (counted.ours_one_key, counted.governor_one_key),
        (counted.ours_100k_keys, counted.governor_100k_keys),
        (counted.sync_one_key, counted.governor_one_key),
        (counted.sync_100k_keys, counted.governor_100k_keys),
        (counted.ours_three_limits, counted.ours_one_key),
        (counted.store_one_key, counted.governor_one_key),
        (counted.http_ours, counted.http_governor),
        (counted.http_ours, counted.http_no_layer),
    ];
    let count = |n: f64| format!("{n:.1} instr.");
    for (row, figures) in rows.iter_mut().zip(figures) {
        if let (Some(ours), Some(peer)) = figures {
            row.figures(count(ours), count(peer), Some(ours / peer));
        }
    }
    rows.into()
}

/// A store of the kinds rows.
struct KindsStore {
    /// The groups' store part: `kinds_<store>_<users>`.
    store: &'static str,
    label: &'static str,
    /// How a slot is given back.
    release: &'static str,
    /// The groups' users part, and its label.
    users: &'static [(&'static str, &'static str)],
}

/// The stores of the kinds rows, each with its groups in
/// `parse::CRITERION_GROUPS` (`kinds.rs` of the store's crate).
const KINDS_STORES: [KindsStore; 2] = [
    KindsStore {
        store: "memory",
        label: "memory (`MemoryStorage::check_sync`)",
        release: "release_local",
        users: &[
            ("one_user", "1 hot user"),
            ("10k_users", "10k users round-robin"),
            ("100k_users", "100k users round-robin"),
        ],
    },
    KindsStore {
        store: "redis",
        label: "Redis (`RedisStorage`, `Storage::check`)",
        release: "Storage::release",
        users: &[
            ("one_user", "1 hot user"),
            ("1k_users", "1k users round-robin"),
        ],
    },
];

/// Each kind beside the rate: its bench in the `kinds` groups, what one
/// iteration is, and its goal.
const KINDS: [(&str, &str, GoalId); 3] = [
    (
        "period",
        "one calendar period (`u32::MAX` a month)",
        GoalId::PeriodVsRate,
    ),
    (
        "window",
        "one sliding window of N = 100, its log full",
        GoalId::WindowVsRate,
    ),
    (
        "slot",
        "a concurrency slot taken and given back",
        GoalId::SlotVsRate,
    ),
];

/// Windows, periods and concurrency slots, each against one GCRA rate
/// check of the same store and loop (`kinds.rs` of the store's crate).
fn kinds(results: &Results) -> Vec<Row> {
    let criterion = &results.criterion;
    let mut rows = Vec::new();
    for kinds_store in &KINDS_STORES {
        let missing =
            criterion_store_missing(results, "kinds", kinds_store.store);
        for (users, users_label) in kinds_store.users {
            let group = format!("kinds_{}_{users}", kinds_store.store);
            for (bench, what, id) in KINDS {
                let what = if bench == "slot" {
                    format!("{what} (`{}`)", kinds_store.release)
                } else {
                    what.to_owned()
                };
                let metric = format!(
                    "Other kinds, {}, {users_label}: {what} vs one GCRA \
                     rate (time per decision)",
                    kinds_store.label
                );
                // Logs past the cache: the window is judged against the
                // machine's floor (below), its ratio to a rate shown.
                let past_cache = bench == "window"
                    && criterion.ns(&group, "floor").is_some();
                let row = match past_cache {
                    true => {
                        Row::info(metric, "(info: judged against the floor)")
                    }
                    false => Row::judged_by(metric, id),
                };
                rows.push(row.missing_unless_run(&missing).against(
                    criterion,
                    &group,
                    (bench, "rate"),
                ));
            }
            if kinds_store.store == "redis" {
                let row = Row::judged_by(
                    format!(
                        "Other kinds, {}, {users_label}: a concurrency slot \
                         taken, given back off the request's path (untimed) vs \
                         one GCRA rate (time per decision)",
                        kinds_store.label
                    ),
                    GoalId::SlotTakeVsRate,
                );
                rows.push(row.missing_unless_run(&missing).against(
                    criterion,
                    &group,
                    ("take", "rate"),
                ));
            }
            if criterion.ns(&group, "floor").is_some() {
                let row = Row::judged_by(
                    format!(
                        "Other kinds, {}, {users_label}: one sliding window \
                         of N = 100, its log full vs the machine's floor: a \
                         random read (its address read by the one before) and \
                         a write over an array the size of the logs (time per \
                         decision)",
                        kinds_store.label
                    ),
                    GoalId::WindowVsFloor,
                );
                rows.push(row.against(criterion, &group, ("window", "floor")));
            }
        }
    }
    rows
}

/// Why a row of a criterion target with memory and Redis groups has no
/// figure: for `store` "redis", a Redis that was not there, first.
fn criterion_store_missing(
    results: &Results,
    target: &str,
    store: &str,
) -> String {
    match &results.criterion_no_redis {
        Some(why) if store == "redis" => {
            if why.starts_with("skipped") {
                why.clone()
            } else {
                format!("failed: {why}")
            }
        }
        _ => criterion_missing(results, target),
    }
}

/// A store of the reserve rows: its groups are `reserve_<store>_<users>`
/// in `parse::CRITERION_GROUPS` (`reserve.rs` of the store's crate).
struct ReserveStore {
    store: &'static str,
    /// The store, and what it calls.
    label: &'static str,
    /// The groups' users part, and its label.
    users: [(&'static str, &'static str); 2],
}

const RESERVE_GROUPS: [ReserveStore; 2] = [
    ReserveStore {
        store: "memory",
        label: "memory (`MemoryStorage::reserve_sync` vs `check_sync`)",
        users: [
            ("one_user", "1 hot user"),
            ("100k_users", "100k users round-robin"),
        ],
    },
    ReserveStore {
        store: "redis",
        label: "Redis (`RedisStorage`, `Storage::reserve` vs `Storage::check`)",
        users: [
            ("one_user", "1 hot user"),
            ("1k_users", "1k users round-robin"),
        ],
    },
];

/// A reservation that does not wait against a check of the same buckets:
/// of one bucket, judged; of two limits of one user in one call, for
/// information.
fn reserve(results: &Results) -> Vec<Row> {
    let criterion = &results.criterion;
    let mut rows = Vec::new();
    for ReserveStore {
        store,
        label,
        users,
    } in RESERVE_GROUPS
    {
        let missing = criterion_store_missing(results, "reserve", store);
        for (users, users_label) in users {
            let group = format!("reserve_{store}_{users}");
            let one = Row::judged_by(
                format!(
                    "Reserve, {label}, {users_label}: a reservation that does \
                     not wait vs a check of the same bucket (time per call)"
                ),
                GoalId::ReserveVsCheck,
            );
            let two = Row::info(
                format!(
                    "Reserve, {label}, {users_label}: a joint reservation of 2 \
                     limits of one user vs a joint check of the 2"
                ),
                "(info)",
            );
            for (row, reserve, check) in
                [(one, "reserve", "check"), (two, "reserve_2", "check_2")]
            {
                let mut row = row.missing_unless_run(&missing);
                if let (Some(ours), Some(peer), Some(ratio)) = (
                    criterion.ns(&group, reserve),
                    criterion.ns(&group, check),
                    criterion.ratio(&group, reserve, check),
                ) {
                    row.figures(
                        ns(ours),
                        format!("{} (check)", ns(peer)),
                        Some(ratio),
                    );
                }
                rows.push(row);
            }
        }
    }
    rows
}

/// What the upstream of the shaper example saw against the quota: judged
/// on the calls per second; void when a call was refused, or a second
/// held more than one call over the quota (one over: a call's
/// own delay can land it beside the next slot's call; more is a quota not
/// kept).
fn shaper(shaper: &Outcome<ShaperResults>) -> Vec<Row> {
    let row = Row::judged_by(
        "Shaped calls/s an upstream saw: 2 worker processes, every call \
         fired at once, through one `ShapeLayer` quota on Redis, vs the quota \
         (`examples/shaper.rs`)",
        GoalId::ShapedVsQuota,
    );
    let results = match shaper {
        Ok(results) => results,
        Err(why) => return vec![row.without(why)],
    };
    let (Some(observed), Some(quota)) =
        (results.observed_per_sec, results.quota_per_sec)
    else {
        return vec![row.without("the results hold no rate or no quota")];
    };
    let mut row = row;
    let ms = |ms: Option<f64>| {
        ms.map_or_else(|| "?".to_owned(), |ms| format!("{ms:.1} ms"))
    };
    let seconds = results
        .seconds
        .map_or_else(|| "?".to_owned(), |s| format!("{s:.2} s"));
    row.figures(
        format!(
            "{observed:.2} calls/s ({} calls in {seconds}; most in any \
             second: {}; closest two: {} apart, interval {}; refused: {})",
            count(results.calls),
            count(results.busiest_second),
            ms(results.closest_ms),
            ms(results.interval_ms),
            count(results.refused),
        ),
        format!("{quota:.0} /s (quota)"),
        (quota > 0.0).then(|| observed / quota),
    );
    row.void = match (results.refused, results.busiest_second) {
        (Some(0), Some(busiest)) if busiest as f64 <= quota + 1.0 => None,
        (Some(0), Some(busiest)) => {
            Some(format!("{busiest} calls in one second"))
        }
        (Some(refused), _) if refused > 0 => Some(format!("{refused} refused")),
        _ => Some("no count of refusals or of the busiest second".to_owned()),
    };
    vec![row]
}

fn ns(value: f64) -> String {
    if value >= 1000.0 {
        format!("{:.2} µs", value / 1000.0)
    } else {
        format!("{value:.1} ns")
    }
}

fn http(http: &Outcome<HttpResults>) -> Vec<Row> {
    let mut vs_none = Row::judged_by(
        "HTTP req/s: `TierLimitLayer` (memory) vs no layer",
        GoalId::HttpVsNoLayer,
    );
    let mut vs_governor = Row::judged_by(
        "HTTP req/s: `TierLimitLayer` vs tower_governor",
        GoalId::HttpVsGovernor,
    );
    let mut cpu = Row::info(
        "HTTP server CPU per request: layer vs no layer / vs tower_governor",
        "(info)",
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
        http.tower_rate_tier.rps,
        http.no_layer.rps,
        http.tower_governor.rps,
    ) {
        vs_none.figures(
            per_sec(ours, "req/s"),
            per_sec(none, "req/s"),
            http.ratio_layer_vs_no_layer,
        );
        vs_governor.figures(
            per_sec(ours, "req/s"),
            per_sec(governor, "req/s"),
            http.ratio_layer_vs_tower_governor,
        );
        let errors: u64 =
            [&http.no_layer, &http.tower_rate_tier, &http.tower_governor]
                .iter()
                .filter_map(|server| server.errors)
                .sum();
        if errors > 0 {
            // Not 200s or socket errors: the figures are not comparable.
            vs_none.void = Some(format!("{errors} errors"));
            vs_governor.void = Some(format!("{errors} errors"));
        }
    }
    if let (Some(ours), Some(none), Some(governor)) = (
        http.tower_rate_tier.cpu_us,
        http.no_layer.cpu_us,
        http.tower_governor.cpu_us,
    ) {
        let vs_governor =
            http.cpu_ratio_layer_vs_tower_governor.unwrap_or(f64::NAN);
        cpu.figures(
            format!("{ours:.2} µs"),
            format!(
                "{none:.2} µs / {governor:.2} µs (ratio vs tower_governor \
                 {vs_governor:.3})"
            ),
            http.cpu_ratio_layer_vs_no_layer,
        );
    }
    vec![vs_none, vs_governor, cpu]
}

fn redis(redis: &Outcome<RedisResults>) -> Vec<Row> {
    let mut ceiling = Row::judged_by(
        "Redis checks/s: `RedisStorage`, 64 tasks on 1 multiplexed connection, vs \
         redis-benchmark `-c 64` EVALSHA",
        GoalId::RedisVsBenchmark,
    );
    let mut pipelined = Row::info(
        "Redis checks/s: the same vs redis-benchmark `-c 1 -P 64` (pipelined, our shape)",
        "(info)",
    );
    // 3 limits of one user are one round trip.
    let mut trips = Row::judged_by(
        "Redis, 3 limits of one user (`RateTier::decide`, plan + 2 `Limit`s): \
         commands sent per decision (`MONITOR`; the store's background read \
         of `trt:resets`, every 250 ms, apart)",
        GoalId::RedisRoundTrips,
    );
    let mut three = Row::info(
        "Redis, 3 limits of one user vs the plan alone: time per decision, one \
         at a time",
        "(info)",
    );
    let redis = match redis {
        Ok(redis) => redis,
        Err(why) => {
            return [ceiling, pipelined, trips, three]
                .map(|row| row.without(why))
                .into();
        }
    };
    let limits = &redis.limits;
    if let Some(sent) = limits.commands_per_decision {
        let scripts = limits.script_calls_per_decision.unwrap_or(f64::NAN);
        let keys = limits.keys_per_decision.unwrap_or(f64::NAN);
        trips = trips.judging(Some(sent));
        trips.figures(
            format!(
                "{sent:.3} ({scripts:.3} script calls, {keys:.3} keys written)"
            ),
            "—".to_owned(),
            None,
        );
        // Fewer than 3 keys a decision: not every limit was decided.
        let refused = limits.refused.unwrap_or(0);
        if keys.is_nan() || keys < 3.0 || refused > 0 {
            trips.void =
                Some(format!("{keys:.3} keys a decision, {refused} refused"));
        }
    }
    if let (Some(all), Some(one)) = (limits.three_us, limits.one_us) {
        three.figures(
            format!("{all:.1} µs"),
            format!("{one:.1} µs (1 limit)"),
            limits.time_ratio,
        );
    }
    if let (Some(ours), Some(peer)) =
        (redis.ours_per_sec, redis.redis_benchmark_per_sec)
    {
        ceiling.figures(per_sec(ours, "/s"), per_sec(peer, "/s"), redis.ratio);
        if let Some(errors) = redis.errors.filter(|e| *e > 0) {
            ceiling.void = Some(format!("{errors} errors"));
        }
        if let Some(peer) = redis.redis_benchmark_pipelined_per_sec {
            pipelined.figures(
                per_sec(ours, "/s"),
                per_sec(peer, "/s"),
                redis.ratio_pipelined,
            );
        }
    }
    vec![ceiling, pipelined, trips, three]
}

/// The Redis CPU rows: each script call against the commands it cannot
/// avoid (TIME, and a GET and a SET PX per key), measured in the same round.
fn redis_cpu(cpu: &Outcome<RedisCpu>) -> Vec<Row> {
    // (case, keys its floor counts, label)
    let scripts: [(&str, usize, &str); 4] = [
        ("gcra", 1, "`gcra.lua` (1 limit)"),
        (
            "gcra_all_1",
            1,
            "`gcra_all.lua`, 1 key (a peek, a shadow limit)",
        ),
        ("gcra_all_3", 3, "`gcra_all.lua`, 3 keys of one user"),
        ("gcra_settle", 1, "`gcra_settle.lua`, 1 key (a debt)"),
    ];
    let mut rows: Vec<Row> = scripts
        .iter()
        .map(|(_, keys, label)| {
            let floor = match keys {
                1 => "GET + SET PX + TIME".to_owned(),
                n => format!("{n} × (GET + SET PX) + TIME"),
            };
            Row::judged_by(
                format!("Redis CPU per call: {label}, server µs vs {floor}"),
                GoalId::RedisCpuVsFloor,
            )
        })
        .collect();
    let mut three = Row::judged_by(
        "Redis CPU: 3 limits of one user in one call vs 1 limit \
         (`gcra_all.lua` 3 keys / `gcra.lua`)",
        GoalId::RedisCpuThreeLimits,
    );
    let mut fcall = Row::info(
        "Redis CPU: `gcra.lua` as a Redis 7 function (`FCALL`) vs `EVALSHA`",
        "(info: < 1.0 = cheaper)",
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
    for (row, (case, keys, _)) in rows.iter_mut().zip(&scripts) {
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
        let mut row = Row::judged_by(
            format!(
                "Breaker open (Redis down): added time per check, {label} vs memory"
            ),
            GoalId::BreakerAdded,
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

fn memory(
    memory: &Outcome<MemoryResults>,
    memory_peer: &Outcome<GovernorMemoryResults>,
) -> Vec<Row> {
    let mut peak = Row::info(
        "Memory: RSS growth after 1M distinct keys, vs governor",
        "(info)",
    );
    // Idle after every wave, not only the first. The bound: what
    // glibc kept before (half the peak) is 10× it; measured: under 0.01.
    let mut worst = Row::judged_by(
        "Memory: RSS growth once idle, the worst wave of several (1M, 500k, \
         1M, 250k, 1M keys; ratio: of the peak growth)",
        GoalId::MemoryIdle,
    );
    let memory = match memory {
        Ok(memory) => memory,
        Err(why) => {
            return [peak, worst].map(|row| row.without(why)).into();
        }
    };
    // KiB over the baseline.
    let growth = |kib: Option<u64>, baseline: Option<u64>| {
        Some(kib? as f64 - baseline? as f64)
    };
    let ours = |kib| growth(kib, memory.baseline_kib);
    let peer = memory_peer.as_ref().ok();
    let peer_growth = |kib: fn(&GovernorMemoryResults) -> Option<u64>| {
        peer.and_then(|p| growth(kib(p), p.baseline_kib))
    };
    let first = memory.waves.first();
    if let Some(ours_peak) = ours(first.and_then(|w| w.after_insert_kib)) {
        let peer_peak = peer_growth(|p| p.after_insert_kib);
        peak.figures(
            format!(
                "+{} (from {})",
                mib(ours_peak),
                mib(memory.baseline_kib.unwrap_or(0) as f64)
            ),
            peer_peak
                .map_or_else(|| "—".to_owned(), |p| format!("+{}", mib(p))),
            peer_peak.map(|p| ours_peak / p),
        );
    }
    let waves = (!memory.waves.is_empty()).then_some(memory.waves.len());
    if let (Some(idle), Some(peak_growth), Some(wave), Some(waves)) = (
        memory.worst_idle_growth_kib,
        memory.peak_growth_kib,
        memory.worst_idle_wave,
        waves,
    ) {
        let (idle, peak_growth) = (idle as f64, peak_growth as f64);
        let every: Vec<String> = memory
            .waves
            .iter()
            .map(|w| {
                ours(w.after_idle_kib).map_or_else(
                    || "?".to_owned(),
                    |g| format!("{:.2}", g / 1024.0),
                )
            })
            .collect();
        let held = (wave as usize)
            .checked_sub(1)
            .and_then(|i| memory.waves.get(i)?.held_after_idle);
        let peer_idle = peer_growth(|p| p.after_idle_kib);
        let peer_held = peer.and_then(|p| p.held_after_idle);
        worst.figures(
            format!(
                "+{} after wave {wave} of {waves} ({} buckets held; peak +{}; \
                 every wave: +{} MiB)",
                mib(idle),
                count(held),
                mib(peak_growth),
                every.join(", +")
            ),
            peer_idle.map_or_else(
                || "—".to_owned(),
                |p| {
                    format!(
                        "+{} ({} held, no manual call)",
                        mib(p),
                        count(peer_held)
                    )
                },
            ),
            Some(idle / peak_growth.max(1.0)),
        );
        // A wave read before the sweeper was done says nothing.
        if let Some(n) = memory.unsettled_waves.filter(|n| *n > 0) {
            worst.void = Some(format!("{n} waves read before the sweep"));
        }
    }
    vec![peak, worst]
}

/// A count as shown, `?` when missing.
fn count(n: Option<u64>) -> String {
    n.map_or_else(|| "?".to_owned(), |n| n.to_string())
}

/// The standalone service: `ShouldRateLimit` round trips/s against the
/// ceilings that bound them, and latency at a fixed offered load.
pub(crate) fn service(rls: &Outcome<Rls>) -> Vec<Row> {
    let settings = rls.as_ref().ok().map(|rls| &rls.results);
    let setting = |value: Option<f64>, unit: &str| {
        value.map_or_else(|| "?".to_owned(), |n| per_sec(n, unit))
    };
    let in_flight = setting(
        settings.and_then(|s| s.concurrency).map(|n| n as f64),
        "in flight",
    );
    let offered =
        setting(settings.and_then(|s| s.offered_rate), "req/s offered");
    let mut memory = Row::judged_by(
        format!(
            "Service RLS `ShouldRateLimit`/s, memory store, vs the same tonic \
             server answering a constant response ({in_flight})"
        ),
        GoalId::ServiceVsConstant,
    );
    let mut redis = Row::judged_by(
        format!(
            "Service RLS `ShouldRateLimit`/s on Redis vs redis-benchmark EVALSHA \
             of `gcra.lua` ({in_flight}, as many clients)"
        ),
        GoalId::ServiceRedisVsBenchmark,
    );
    // The gRPC hop's ceiling, which on a small machine is below Redis's.
    let mut redis_vs_constant = Row::info(
        "Service RLS on Redis vs the constant tonic server (the gRPC hop's \
         ceiling, from the memory row)",
        "(info)",
    );
    let mut memory_latency = Row::info(
        format!(
            "Service RLS latency p50 / p99 at {offered}, memory store vs the \
             constant server (ratio: of the p50s)"
        ),
        "(info)",
    );
    let mut redis_latency = Row::info(
        format!(
            "Service RLS latency p50 / p99 at {offered}, on Redis vs the \
             constant server (ratio: of the p50s)"
        ),
        "(info)",
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
    let latency = |latency: &Latency| {
        let (p50, p99) = (latency.p50_us?, latency.p99_us?);
        Some((p50, format!("p50 {p50:.0} µs / p99 {p99:.0} µs")))
    };
    let constant_rps = results.constant_rps;
    if let (Some(ours), Some(peer)) = (results.memory_rps, constant_rps) {
        memory.figures(
            per_sec(ours, "/s"),
            per_sec(peer, "/s (constant)"),
            results.memory_ratio,
        );
    }
    let constant_latency = latency(&results.constant_latency);
    for (row, measured) in [
        (&mut memory_latency, &results.memory_latency),
        (&mut redis_latency, &results.redis_latency),
    ] {
        if let (Some((ours, text)), Some((peer, peer_text))) =
            (latency(measured), &constant_latency)
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
    if let Some(ours) = results.redis_rps {
        if let Some(peer) = results.redis_benchmark_rps {
            redis.figures(
                per_sec(ours, "/s"),
                per_sec(peer, "/s (redis-benchmark)"),
                results.redis_ratio,
            );
        }
        if let Some(peer) = constant_rps {
            redis_vs_constant.figures(
                per_sec(ours, "/s"),
                per_sec(peer, "/s (constant)"),
                results.redis_vs_constant_ratio,
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

/// The service against limitador-server: one row per mode, each the
/// medians of the rounds of each side, judged by the median of the
/// rounds' ratios (each round measured both sides one after the other),
/// with the range of those ratios.
fn limitador(limitador: &Outcome<Limitador>) -> Vec<Row> {
    // The load, when the bench said what it offered.
    let load = limitador
        .as_ref()
        .ok()
        .and_then(|l| Some((l.results.concurrency?, l.results.users?)))
        .map_or_else(String::new, |(in_flight, users)| {
            format!("{in_flight} in flight, {} users, ", thousands(users))
        });
    let mut memory = Row::judged_by(
        format!(
            "Service vs limitador: `ShouldRateLimit`/s, memory store, vs \
             limitador-server `memory` ({load}alternating rounds)"
        ),
        GoalId::ServiceVsLimitador,
    );
    let mut redis = Row::judged_by(
        format!(
            "Service vs limitador: `ShouldRateLimit`/s on Redis vs \
             limitador-server `redis` on the same Redis ({load}\
             alternating rounds)"
        ),
        GoalId::ServiceRedisVsLimitador,
    );
    let mut cached = Row::judged_by(
        format!(
            "Service vs limitador: `ShouldRateLimit`/s on Redis (exact) vs \
             limitador-server `redis_cached` (batched, approximate) on the \
             same Redis ({load}alternating rounds)"
        ),
        GoalId::ServiceRedisVsLimitadorCached,
    );
    let (results, no_redis) = match limitador {
        Ok(limitador) => (&limitador.results, limitador.no_redis.as_deref()),
        Err(why) => {
            return [memory, redis, cached].map(|row| row.without(why)).into();
        }
    };
    let version = results
        .limitador_version
        .as_deref()
        .unwrap_or("limitador-server");
    for (row, rounds, mode) in [
        (&mut memory, &results.memory, "memory"),
        (&mut redis, &results.redis, "redis"),
        (&mut cached, &results.redis_cached, "redis_cached"),
    ] {
        if let Some(versus) = Versus::of(rounds) {
            row.figures(
                per_sec(versus.ours, "/s"),
                format!(
                    "{} ({version}, `{mode}`; rounds' ratios {:.3}–{:.3} over \
                     {} rounds)",
                    per_sec(versus.theirs, "/s"),
                    versus.lowest,
                    versus.highest,
                    rounds.len()
                ),
                Some(versus.ratio),
            );
        }
    }
    match no_redis {
        Some(why) => vec![memory, redis.without(why), cached.without(why)],
        None => vec![memory, redis, cached],
    }
}

/// A comparison summed up over its rounds.
#[derive(Debug, PartialEq)]
struct Versus {
    /// The median of our rounds, calls/s.
    ours: f64,
    /// The median of their rounds, calls/s.
    theirs: f64,
    /// The median of the rounds' ratios (ours / theirs).
    ratio: f64,
    /// The lowest and the highest of the rounds' ratios.
    lowest: f64,
    highest: f64,
}

impl Versus {
    /// `None` for no round, or a round that measured nothing.
    fn of(rounds: &[VersusRound]) -> Option<Versus> {
        if rounds.iter().any(|r| r.theirs <= 0.0) {
            return None;
        }
        let ratios: Vec<f64> =
            rounds.iter().map(|r| r.ours / r.theirs).collect();
        Some(Versus {
            ours: median(rounds.iter().map(|r| r.ours).collect())?,
            theirs: median(rounds.iter().map(|r| r.theirs).collect())?,
            ratio: median(ratios.clone())?,
            lowest: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            highest: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }
}

/// The PostgreSQL rows: the store against pgbench running the statement
/// it sends, and what a check costs the server against a plain `UPDATE`.
fn postgres(postgres: &Outcome<PostgresResults>) -> Vec<Row> {
    let mut ceiling = Row::judged_by(
        "PostgreSQL checks/s: `PostgresStorage`, 64 tasks on a pool of 64, vs \
         pgbench `-c 64` running the same statement",
        GoalId::PostgresVsPgbench,
    );
    let mut cpu = Row::judged_by(
        "PostgreSQL server CPU per check vs per plain `UPDATE` of one row by \
         primary key (pgbench `-c 64`)",
        GoalId::PostgresCpuVsUpdate,
    );
    let mut function = Row::info(
        "PostgreSQL server CPU per call of the check function, one bucket \
         (the path of several limits and of refusals) vs the plain `UPDATE`",
        "(info)",
    );
    let results = match postgres {
        Ok(results) => results,
        Err(why) => {
            return [ceiling, cpu, function].map(|row| row.without(why)).into();
        }
    };
    if let (Some(ours), Some(peer)) =
        (results.ours_per_sec, results.pgbench_per_sec)
    {
        ceiling.figures(
            per_sec(ours, "/s"),
            per_sec(peer, "/s"),
            results.ratio,
        );
        if let Some(errors) = results.errors.filter(|e| *e > 0) {
            ceiling.void = Some(format!("{errors} errors or refusals"));
        }
    }
    if let (Some(ours), Some(update)) =
        (results.ours_cpu_us, results.update_cpu_us)
    {
        cpu.figures(
            format!("{ours:.1} µs"),
            format!("{update:.1} µs"),
            results.cpu_ratio,
        );
        if let Some(call) = results.function_cpu_us {
            function.figures(
                format!("{call:.1} µs"),
                format!("{update:.1} µs"),
                results.function_cpu_ratio,
            );
        }
    }
    vec![ceiling, cpu, function]
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

    use rate_tier_bench_results::{
        HttpServer, LimitadorResults, MemoryWave, RedisLimits, RlsResults,
        ShaperResults,
    };

    use super::super::runner::{CpuRound, Floor};
    use super::*;

    fn results(redis_cpu: Outcome<RedisCpu>) -> Results {
        Results {
            criterion: Passes::default(),
            criterion_missing: vec![(
                "check",
                "bench target `check` did not build".to_owned(),
            )],
            criterion_no_redis: None,
            shaper: Err("example `shaper` did not build".to_owned()),
            http: Err("the `http` target did not build".to_owned()),
            redis: Err("skipped: no redis-benchmark".to_owned()),
            redis_cpu,
            memory: Err("the `memory` target did not build".to_owned()),
            memory_peer: Err("the `memory` target did not build".to_owned()),
            rls: Err("bench target `rls` did not build".to_owned()),
            limitador: Err("not measured: no limitador-server; build it with \
                 cargo build --release -p limitador-server"
                .to_owned()),
            postgres: Err("skipped: no pgbench".to_owned()),
            instructions: Err("skipped: `valgrind` is not on PATH".to_owned()),
        }
    }

    #[test]
    fn the_instruction_rows_judge_ours_against_each_peer() {
        let mut results = results(Err("skipped: no redis-server".to_owned()));
        let statuses = |results: &Results| -> Vec<(String, Status)> {
            rows(results)
                .into_iter()
                .filter(|row| row.metric.starts_with("Instructions"))
                .map(|row| (row.metric.clone(), row.status()))
                .collect()
        };
        let skipped = statuses(&results);
        assert_eq!(skipped.len(), 8);
        let why =
            Status::NoFigure("skipped: `valgrind` is not on PATH".to_owned());
        assert!(skipped.iter().all(|(_, status)| *status == why));

        results.instructions = Ok(InstructionsResults {
            ours_one_key: Some(330.0),
            governor_one_key: Some(377.0),
            ours_100k_keys: Some(611.5),
            governor_100k_keys: Some(406.9),
            sync_one_key: Some(372.0),
            sync_100k_keys: Some(360.0),
            ours_three_limits: Some(800.0),
            store_one_key: Some(365.6),
            http_ours: Some(13_443.0),
            http_governor: Some(13_305.0),
            http_no_layer: Some(7_580.0),
            ..InstructionsResults::default()
        });
        let counted = statuses(&results);
        let status = |prefix: &str| {
            counted
                .iter()
                .find(|(metric, _)| metric.contains(prefix))
                .map(|(_, status)| status.clone())
                .unwrap()
        };
        // 330 / 377 = 0.875 meets ≤ 0.9; 611.5 / 406.9 = 1.50 does not.
        assert_eq!(status("1 hot key: `RateTier::check`"), Status::Met);
        assert_eq!(status("100k keys round-robin: `RateTier"), Status::NotMet);
        // 372 / 377 = 0.987 does not; 360 / 406.9 = 0.885 does.
        assert_eq!(status("1 hot key: `SyncTier::check`"), Status::NotMet);
        assert_eq!(status("100k keys round-robin: `SyncTier"), Status::Met);
        // 800 / 330 = 2.42 < 2.5.
        assert_eq!(status("plan + 2"), Status::Met);
        // 13,443 / 13,305 = 1.010 > 0.95.
        assert_eq!(status("vs tower_governor"), Status::NotMet);
        assert_eq!(status("the store alone"), Status::Info);
        assert_eq!(status("vs no layer"), Status::Info);
        let three = rows(&results)
            .into_iter()
            .find(|row| {
                row.metric.contains("plan + 2 `Limit`s in one")
                    && row.metric.starts_with("Instructions")
            })
            .unwrap();
        assert_eq!(three.ratio, Some(800.0 / 330.0));
    }

    #[test]
    fn the_postgres_rows_judge_both_goals_and_errors_void_the_rate() {
        let mut results = results(Err("skipped: no redis-server".to_owned()));
        let find = |rows: &[Row], prefix: &str| {
            rows.iter()
                .find(|row| row.metric.starts_with(prefix))
                .map(Row::status)
                .unwrap()
        };
        let rate = "PostgreSQL checks/s";
        let cpu = "PostgreSQL server CPU per check";
        assert_eq!(
            find(&rows(&results), rate),
            Status::NoFigure("skipped: no pgbench".to_owned())
        );
        results.postgres = Ok(PostgresResults {
            ours_per_sec: Some(12_000.0),
            pgbench_per_sec: Some(13_000.0),
            ratio: Some(0.92),
            ours_cpu_us: Some(70.0),
            update_cpu_us: Some(40.0),
            cpu_ratio: Some(1.75),
            errors: Some(0),
            ..PostgresResults::default()
        });
        assert_eq!(find(&rows(&results), rate), Status::Met);
        assert_eq!(find(&rows(&results), cpu), Status::Met);
        if let Ok(postgres) = &mut results.postgres {
            postgres.cpu_ratio = Some(2.5);
            postgres.errors = Some(3);
        }
        assert_eq!(find(&rows(&results), rate), Status::NotMet);
        assert_eq!(find(&rows(&results), cpu), Status::NotMet);
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
        results.memory = Ok(MemoryResults {
            baseline_kib: Some(2048),
            waves: vec![
                MemoryWave {
                    after_insert_kib: Some(40960),
                    after_idle_kib: Some(2304),
                    ..MemoryWave::default()
                },
                MemoryWave {
                    after_idle_kib: Some(3072),
                    held_after_idle: Some(0),
                    ..MemoryWave::default()
                },
            ],
            unsettled_waves: Some(0),
            peak_growth_kib: Some(40960),
            worst_idle_growth_kib: Some(1024),
            worst_idle_wave: Some(2),
            ..MemoryResults::default()
        });
        results.redis = Ok(RedisResults {
            limits: RedisLimits {
                commands_per_decision: Some(1.0),
                script_calls_per_decision: Some(1.0),
                keys_per_decision: Some(2.0),
                refused: Some(0),
                ..RedisLimits::default()
            },
            ..RedisResults::default()
        });
        let rows = rows(&results);
        let row = |prefix: &str| {
            rows.iter().find(|r| r.metric.starts_with(prefix)).unwrap()
        };
        let worst = row("Memory: RSS growth once idle");
        assert_eq!(worst.ratio, Some(0.025));
        assert_eq!(worst.status(), Status::Met);
        assert!(worst.ours.contains("every wave: +0.25, +1.00 MiB"));
        assert!(
            worst
                .ours
                .starts_with("+1.0 MiB after wave 2 of 2 (0 buckets held;"),
            "{}",
            worst.ours
        );
        let trips = row("Redis, 3 limits of one user (");
        assert_eq!(trips.judged, Some(1.0));
        assert_eq!(trips.goal.to_string(), "commands ≤ 1.0 per decision");
        // 2 keys a decision: a limit was not decided, the figure is void.
        assert_eq!(trips.status(), Status::NotMet);
    }

    #[test]
    fn the_service_rows_judge_both_ceilings_and_say_why_redis_has_none() {
        let mut results = results(Err("skipped: no redis-server".to_owned()));
        let memory_only = RlsResults {
            concurrency: Some(64),
            offered_rate: Some(5000.0),
            memory_rps: Some(18000.0),
            constant_rps: Some(20000.0),
            memory_ratio: Some(0.9),
            memory_latency: Latency {
                p50_us: Some(150.0),
                p99_us: Some(400.0),
            },
            constant_latency: Latency {
                p50_us: Some(120.0),
                p99_us: Some(300.0),
            },
            ..RlsResults::default()
        };
        // The memory and latency parts alone: the Redis rows say why.
        results.rls = Ok(Rls {
            results: memory_only.clone(),
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
        results.rls = Ok(Rls {
            results: RlsResults {
                redis_rps: Some(12000.0),
                redis_benchmark_rps: Some(48000.0),
                redis_ratio: Some(0.25),
                redis_vs_constant_ratio: Some(0.6),
                redis_latency: Latency {
                    p50_us: Some(240.0),
                    p99_us: Some(900.0),
                },
                ..memory_only
            },
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
    fn the_limitador_rows_say_loudly_when_there_is_no_limitador() {
        let results = results(Err("skipped: no redis-server".to_owned()));
        let rows = limitador(&results.limitador);
        assert_eq!(rows.len(), 3);
        for row in &rows {
            let Status::NoFigure(why) = row.status() else {
                panic!("{} has a figure", row.metric);
            };
            assert!(
                why.starts_with("not measured: no limitador-server; build it"),
                "{why}"
            );
            assert_eq!(row.ours_text(), why);
        }
        let unmet = super::super::report::unmet(&rows);
        assert_eq!(unmet.len(), 3, "{unmet:?}");
        assert!(unmet[0].contains("no figure (not measured"), "{unmet:?}");
    }

    #[test]
    fn the_limitador_rows_judge_the_median_of_the_rounds_ratios() {
        let round = |ours, theirs| VersusRound { ours, theirs };
        let memory = vec![
            round(10_000.0, 10_000.0),
            round(12_000.0, 10_000.0),
            round(9_000.0, 10_000.0),
        ];
        let limitador_results = LimitadorResults {
            limitador_version: Some("Limitador Server v2.2.0".to_owned()),
            concurrency: Some(64),
            users: Some(1000),
            memory,
            ..LimitadorResults::default()
        };
        let measured = Ok(Limitador {
            results: limitador_results.clone(),
            no_redis: Some("skipped: no redis-benchmark".to_owned()),
        });
        let rows = limitador(&measured);
        assert!(
            rows[0].metric.contains("(64 in flight, 1,000 users,"),
            "{}",
            rows[0].metric
        );
        assert_eq!(rows[0].ratio, Some(1.0));
        assert_eq!(rows[0].status(), Status::NotMet, "goal ≥ 1.1");
        assert_eq!(rows[0].ours, "10,000 /s");
        assert_eq!(
            rows[0].peer,
            "10,000 /s (Limitador Server v2.2.0, `memory`; rounds' ratios \
             0.900–1.200 over 3 rounds)"
        );
        for row in &rows[1..] {
            assert_eq!(
                row.status(),
                Status::NoFigure("skipped: no redis-benchmark".to_owned())
            );
        }

        let redis = vec![round(9_000.0, 5_000.0), round(8_000.0, 5_000.0)];
        let cached = vec![round(9_000.0, 9_000.0), round(8_000.0, 8_500.0)];
        let measured = Ok(Limitador {
            results: LimitadorResults {
                redis,
                redis_cached: cached,
                ..limitador_results
            },
            no_redis: None,
        });
        let rows = limitador(&measured);
        let redis_ratio = rows[1].ratio.unwrap();
        assert!((redis_ratio - 1.7).abs() < 1e-12, "{redis_ratio}");
        assert_eq!(rows[1].status(), Status::Met);
        let cached_ratio = rows[2].ratio.unwrap();
        assert!((cached_ratio - (1.0 + 8.0 / 8.5) / 2.0).abs() < 1e-12);
        assert_eq!(rows[2].status(), Status::NotMet, "goal ≥ 1.0");
        let goals: Vec<String> =
            rows.iter().map(|r| r.goal.to_string()).collect();
        assert_eq!(goals, ["≥ 1.1", "≥ 1.5", "≥ 1.0"]);
        // A round that measured nothing leaves the row without a figure.
        assert_eq!(Versus::of(&[round(1.0, 0.0)]), None);
        assert_eq!(Versus::of(&[]), None);
    }

    #[test]
    fn http_errors_void_both_ratios() {
        let mut results = results(Err("skipped: no redis-server".to_owned()));
        let server = |rps, cpu_us, errors| HttpServer {
            rps: Some(rps),
            cpu_us: Some(cpu_us),
            errors: Some(errors),
        };
        results.http = Ok(HttpResults {
            no_layer: server(100_000.0, 5.0, 0),
            tower_rate_tier: server(96_000.0, 5.5, 2),
            tower_governor: server(90_000.0, 6.0, 1),
            ratio_layer_vs_no_layer: Some(0.96),
            ratio_layer_vs_tower_governor: Some(1.066),
            cpu_ratio_layer_vs_no_layer: Some(1.1),
            cpu_ratio_layer_vs_tower_governor: Some(0.917),
            ..HttpResults::default()
        });
        let rows = rows(&results);
        let row = |prefix: &str| {
            rows.iter().find(|r| r.metric.starts_with(prefix)).unwrap()
        };
        let vs_none = row("HTTP req/s: `TierLimitLayer` (memory) vs no layer");
        assert_eq!(vs_none.ours, "96,000 req/s");
        assert_eq!(vs_none.ratio, Some(0.96));
        assert_eq!(vs_none.status(), Status::NotMet);
        assert_eq!(vs_none.goal_text(), "≥ 0.95 (3 errors!)");
        let cpu = row("HTTP server CPU per request");
        assert_eq!(cpu.status(), Status::Info);
        assert!(cpu.peer.ends_with("(ratio vs tower_governor 0.917)"));
        let vs_governor = row("HTTP req/s: `TierLimitLayer` vs");
        assert_eq!(vs_governor.status(), Status::NotMet);

        // No errors: the figures stand.
        if let Ok(http) = &mut results.http {
            http.tower_rate_tier.errors = Some(0);
            http.tower_governor.errors = None;
        }
        let rows = super::rows(&results);
        let statuses: Vec<Status> = rows
            .iter()
            .filter(|r| r.metric.starts_with("HTTP req/s"))
            .map(Row::status)
            .collect();
        assert_eq!(statuses, [Status::Met, Status::Met]);
    }

    #[test]
    fn the_kinds_rows_judge_each_kind_against_the_rate_of_its_pass() {
        let mut results = results(Err("skipped: no redis-server".to_owned()));
        let group = "kinds_memory_one_user";
        let pass = |rate: f64, period, window, slot| {
            [
                (group, "rate", rate),
                (group, "period", period),
                (group, "window", window),
                (group, "slot", slot),
            ]
        };
        // The second pass is slow everywhere: its ratios are like the others'.
        let passes = [
            pass(100.0, 110.0, 250.0, 190.0),
            pass(200.0, 230.0, 700.0, 380.0),
            pass(100.0, 130.0, 280.0, 210.0),
        ];
        results.criterion =
            Passes::of(&passes.each_ref().map(|pass| &pass[..]));
        let rows = rows(&results);
        let row = |prefix: &str| {
            rows.iter().find(|r| r.metric.starts_with(prefix)).unwrap()
        };
        let hot =
            "Other kinds, memory (`MemoryStorage::check_sync`), 1 hot user";
        let period = row(&format!("{hot}: one calendar period"));
        // 1.1, 1.15, 1.3: the median 1.15, met (≤ 1.2).
        assert_eq!(period.ratio, Some(1.15));
        assert_eq!(period.status(), Status::Met);
        assert_eq!(period.ours, "130.0 ns");
        assert_eq!(period.peer, "100.0 ns (rate)");
        // 2.5, 3.5, 2.8: 2.8, met (≤ 3).
        let window = row(&format!("{hot}: one sliding window"));
        assert_eq!(window.ratio, Some(2.8));
        assert_eq!(window.status(), Status::Met);
        // 1.9, 1.9, 2.1: 1.9, met (≤ 2).
        let slot = row(&format!("{hot}: a concurrency slot"));
        assert_eq!(slot.ratio, Some(1.9));
        assert_eq!(slot.goal.to_string(), "≤ 2.0");
        assert_eq!(slot.status(), Status::Met);
        // The 100k group did not run: its rows say so.
        let spread =
            row("Other kinds, memory (`MemoryStorage::check_sync`), 100k");
        assert_eq!(
            spread.status(),
            Status::NoFigure("not run (filtered out after `--`?)".to_owned())
        );
        let slow = [pass(100.0, 125.0, 310.0, 210.0)];
        results.criterion = Passes::of(&slow.each_ref().map(|p| &p[..]));
        let statuses: Vec<Status> = super::rows(&results)
            .iter()
            .filter(|r| r.metric.starts_with(hot))
            .map(Row::status)
            .collect();
        // 1.25, 3.1, 2.1: none met.
        assert_eq!(statuses, vec![Status::NotMet; 3]);
    }

    #[test]
    fn the_kinds_rows_on_redis_are_judged_alike_or_say_why_they_are_missing() {
        let mut results = results(Err("skipped: no redis-server".to_owned()));
        let redis = "Other kinds, Redis (`RedisStorage`, `Storage::check`)";
        let group = "kinds_redis_1k_users";
        let passes = [
            [
                (group, "rate", 40_000.0),
                (group, "period", 40_000.0),
                (group, "window", 60_000.0),
                (group, "slot", 80_000.0),
                (group, "take", 44_000.0),
            ],
            [
                (group, "rate", 50_000.0),
                (group, "period", 62_500.0),
                (group, "window", 70_000.0),
                (group, "slot", 95_000.0),
                (group, "take", 62_500.0),
            ],
        ];
        results.criterion =
            Passes::of(&passes.each_ref().map(|pass| &pass[..]));
        let all = rows(&results);
        let row = |prefix: &str| {
            all.iter().find(|r| r.metric.starts_with(prefix)).unwrap()
        };
        let spread = format!("{redis}, 1k users round-robin");
        // 1.0 and 1.25: the median 1.125, met (≤ 1.2).
        let period = row(&format!("{spread}: one calendar period"));
        assert_eq!(period.ratio, Some(1.125));
        assert_eq!(period.status(), Status::Met);
        assert_eq!(period.ours, "51.25 µs");
        assert_eq!(period.peer, "45.00 µs (rate)");
        // 1.5 and 1.4.
        let window = row(&format!("{spread}: one sliding window"));
        assert!((window.ratio.unwrap() - 1.45).abs() < 1e-9);
        assert_eq!(window.status(), Status::Met);
        // 2.0 and 1.9: 1.95, met (≤ 2).
        let slot = row(&format!(
            "{spread}: a concurrency slot taken and given back \
             (`Storage::release`)"
        ));
        assert!((slot.ratio.unwrap() - 1.95).abs() < 1e-9);
        assert_eq!(slot.status(), Status::Met);
        // 1.1 and 1.25: 1.175, met (≤ 1.2).
        let take =
            row(&format!("{spread}: a concurrency slot taken, given back"));
        assert!((take.ratio.unwrap() - 1.175).abs() < 1e-9);
        assert_eq!(take.status(), Status::Met);
        // The hot user's group did not run.
        assert_eq!(
            row(&format!("{redis}, 1 hot user")).status(),
            Status::NoFigure("not run (filtered out after `--`?)".to_owned())
        );

        // No Redis: every Redis row says why, the memory rows do not.
        results.criterion = Passes::default();
        results.criterion_no_redis =
            Some("skipped: no redis-server".to_owned());
        let all = rows(&results);
        let kinds: Vec<&Row> = all
            .iter()
            .filter(|r| r.metric.starts_with("Other kinds, "))
            .collect();
        assert_eq!(
            kinds.len(),
            17,
            "3 kinds; memory 3 groups, Redis 2 with a slot's take"
        );
        for row in kinds {
            let why = if row.metric.starts_with(redis) {
                "skipped: no redis-server"
            } else {
                "not run (filtered out after `--`?)"
            };
            assert_eq!(row.status(), Status::NoFigure(why.to_owned()));
        }
        results.criterion_no_redis = Some("trt-redis did not start".to_owned());
        let all = rows(&results);
        assert_eq!(
            all.iter()
                .find(|r| r.metric.starts_with(redis))
                .unwrap()
                .status(),
            Status::NoFigure("failed: trt-redis did not start".to_owned())
        );
    }

    #[test]
    fn a_window_past_the_cache_is_judged_against_the_floor() {
        let mut results = results(Err("skipped: no redis-server".to_owned()));
        let group = "kinds_memory_100k_users";
        let passes = [[
            (group, "rate", 40.0),
            (group, "window", 300.0),
            (group, "floor", 150.0),
        ]];
        results.criterion =
            Passes::of(&passes.each_ref().map(|pass| &pass[..]));
        let all = rows(&results);
        let spread = "Other kinds, memory (`MemoryStorage::check_sync`), 100k \
                      users round-robin: one sliding window";
        let of = |peer: &str| {
            all.iter()
                .find(|r| {
                    r.metric.starts_with(spread) && r.metric.contains(peer)
                })
                .unwrap()
        };
        // 7.5 times the rate: shown, not judged.
        let rate = of("vs one GCRA rate");
        assert!((rate.ratio.unwrap() - 7.5).abs() < 1e-9);
        assert_eq!(rate.status(), Status::Info);
        // 2.0 times the floor: met (≤ 2.5).
        let floor = of("vs the machine's floor");
        assert!((floor.ratio.unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(floor.status(), Status::Met);
        assert_eq!(floor.peer, "150.0 ns (floor)");
    }

    #[test]
    fn the_reserve_rows_judge_a_reservation_against_the_check_of_its_pass() {
        let mut results = results(Err("skipped: no redis-server".to_owned()));
        let group = "reserve_memory_100k_users";
        let pass = |check: f64, reserve, check_2, reserve_2| {
            [
                (group, "check", check),
                (group, "reserve", reserve),
                (group, "check_2", check_2),
                (group, "reserve_2", reserve_2),
            ]
        };
        // The second pass is slow everywhere: its ratios are like the others'.
        let passes = [
            pass(100.0, 110.0, 150.0, 180.0),
            pass(200.0, 230.0, 300.0, 330.0),
            pass(100.0, 125.0, 150.0, 150.0),
        ];
        results.criterion =
            Passes::of(&passes.each_ref().map(|pass| &pass[..]));
        let all = rows(&results);
        let row = |prefix: &str| {
            all.iter().find(|r| r.metric.starts_with(prefix)).unwrap()
        };
        let spread = "Reserve, memory (`MemoryStorage::reserve_sync` vs \
                      `check_sync`), 100k users round-robin";
        // 1.1, 1.15, 1.25: the median 1.15, met (≤ 1.2).
        let one = row(&format!("{spread}: a reservation that does not wait"));
        assert_eq!(one.ratio, Some(1.15));
        assert_eq!(one.status(), Status::Met);
        assert_eq!(one.goal.to_string(), "≤ 1.2");
        assert_eq!(one.ours, "125.0 ns");
        assert_eq!(one.peer, "100.0 ns (check)");
        // 1.2, 1.1, 1.0: 1.1, for information.
        let two = row(&format!("{spread}: a joint reservation of 2"));
        assert!((two.ratio.unwrap() - 1.1).abs() < 1e-9);
        assert_eq!(two.status(), Status::Info);
        // The hot user's group did not run; the Redis ones neither.
        assert_eq!(
            row("Reserve, memory (`MemoryStorage::reserve_sync` vs \
                 `check_sync`), 1 hot user")
            .status(),
            Status::NoFigure("not run (filtered out after `--`?)".to_owned())
        );
        let slow = [pass(100.0, 121.0, 150.0, 150.0)];
        results.criterion = Passes::of(&slow.each_ref().map(|p| &p[..]));
        let all = super::rows(&results);
        assert_eq!(
            all.iter()
                .find(|r| r.metric.starts_with(spread))
                .map(Row::status),
            Some(Status::NotMet),
            "1.21 > 1.2"
        );

        // No Redis: the 4 Redis rows say why, the 4 memory rows do not.
        results.criterion = Passes::default();
        results.criterion_no_redis =
            Some("skipped: no redis-server".to_owned());
        let all = rows(&results);
        let reserve: Vec<&Row> = all
            .iter()
            .filter(|r| r.metric.starts_with("Reserve, "))
            .collect();
        assert_eq!(reserve.len(), 8, "2 stores, 2 groups, 1 and 2 buckets");
        for row in reserve {
            let why = if row.metric.starts_with("Reserve, Redis") {
                "skipped: no redis-server"
            } else {
                "not run (filtered out after `--`?)"
            };
            assert_eq!(row.status(), Status::NoFigure(why.to_owned()));
        }
    }

    #[test]
    fn the_shaper_row_judges_the_rate_and_is_void_when_the_quota_was_not_kept()
    {
        let mut results = results(Err("skipped: no redis-server".to_owned()));
        let find = |results: &Results| {
            rows(results)
                .into_iter()
                .find(|r| r.metric.starts_with("Shaped calls/s"))
                .unwrap()
        };
        assert_eq!(
            find(&results).status(),
            Status::NoFigure(
                "failed: example `shaper` did not build".to_owned()
            )
        );
        let seen = ShaperResults {
            workers: Some(2),
            calls: Some(200),
            quota_per_sec: Some(20.0),
            seconds: Some(9.94),
            observed_per_sec: Some(20.02),
            busiest_second: Some(21),
            closest_ms: Some(39.5),
            interval_ms: Some(50.0),
            refused: Some(0),
        };
        results.shaper = Ok(seen.clone());
        let row = find(&results);
        assert!((row.ratio.unwrap() - 1.001).abs() < 1e-9);
        assert_eq!(row.status(), Status::Met);
        assert_eq!(
            row.ours,
            "20.02 calls/s (200 calls in 9.94 s; most in any second: 21; \
             closest two: 39.5 ms apart, interval 50.0 ms; refused: 0)"
        );
        assert_eq!(row.peer, "20 /s (quota)");
        assert_eq!(row.goal_text(), "≥ 0.98");

        // Slower than 0.98 of the quota: not met.
        results.shaper = Ok(ShaperResults {
            observed_per_sec: Some(19.5),
            ..seen.clone()
        });
        assert_eq!(find(&results).status(), Status::NotMet);
        // Fast enough, but not shaped: void.
        for (over, void) in [
            (
                ShaperResults {
                    busiest_second: Some(22),
                    ..seen.clone()
                },
                "≥ 0.98 (22 calls in one second!)",
            ),
            (
                ShaperResults {
                    refused: Some(3),
                    ..seen.clone()
                },
                "≥ 0.98 (3 refused!)",
            ),
            (
                ShaperResults {
                    refused: None,
                    ..seen.clone()
                },
                "≥ 0.98 (no count of refusals or of the busiest second!)",
            ),
        ] {
            results.shaper = Ok(over);
            let row = find(&results);
            assert_eq!(row.status(), Status::NotMet);
            assert_eq!(row.goal_text(), void);
        }
        results.shaper = Ok(ShaperResults {
            quota_per_sec: None,
            ..seen
        });
        assert_eq!(
            find(&results).status(),
            Status::NoFigure(
                "failed: the results hold no rate or no quota".to_owned()
            )
        );
    }

    #[test]
    fn every_part_has_a_section_in_the_order_of_parts() {
        let results = results(Err("skipped: no redis-server".to_owned()));
        let parts: Vec<Part> = sections(&results)
            .into_iter()
            .map(|(part, _)| part)
            .collect();
        let table: Vec<Part> =
            super::super::plan::PARTS.map(|(part, _)| part).into();
        assert_eq!(parts, table);
    }

    #[test]
    fn errors_void_a_figure() {
        let mut row = Row::judged_by("x", GoalId::ServiceVsConstant);
        row.figures("1".to_owned(), "1".to_owned(), Some(1.0));
        assert_eq!(row.status(), Status::Met);
        row.void = Some("3 errors".to_owned());
        assert_eq!(row.status(), Status::NotMet);
        assert_eq!(row.goal_text(), "≥ 0.8 (3 errors!)");
    }
}
