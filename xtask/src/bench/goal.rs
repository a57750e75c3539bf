//! A goal is data: one value both prints it in the table and decides
//! whether a figure meets it, so the two can never disagree. Every goal of
//! the table is in [`GOALS`], with why it is the goal; a row takes its goal
//! from there by [`GoalId`].

use std::fmt;

/// A goal of [`GOALS`], by name. Its value is its index in the table (a
/// new goal: a variant here and its entry at the same place in [`GOALS`];
/// the last variant is the one the length check below names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GoalId {
    MemoryVsGovernor,
    Flood,
    ThreeLimits,
    InstructionsVsGovernor,
    InstructionsThreeLimits,
    InstructionsHttpVsGovernor,
    PeriodVsRate,
    WindowVsRate,
    WindowVsFloor,
    SlotVsRate,
    SlotTakeVsRate,
    ReserveVsCheck,
    ShapedVsQuota,
    HttpVsNoLayer,
    HttpVsGovernor,
    RedisVsBenchmark,
    RedisRoundTrips,
    RedisCpuVsFloor,
    RedisCpuThreeLimits,
    BreakerAdded,
    MemoryIdle,
    ServiceVsConstant,
    ServiceRedisVsBenchmark,
    ServiceVsLimitador,
    ServiceRedisVsLimitador,
    ServiceRedisVsLimitadorCached,
    PostgresVsPgbench,
    PostgresCpuVsUpdate,
}

/// One goal: the figure it judges, the bound (in [`Goal`]: the comparison,
/// the threshold), and why that is the goal.
#[derive(Debug)]
pub(crate) struct GoalEntry {
    pub(crate) id: GoalId,
    /// The figure judged (the rows' own labels say more).
    pub(crate) metric: &'static str,
    pub(crate) goal: Goal,
    pub(crate) why: &'static str,
}

/// Every goal of `cargo xtask bench`'s table, in the table's order. Rows
/// without a goal (for scale, or information) carry a [`Goal::Info`] note
/// instead.
pub(crate) const GOALS: &[GoalEntry] = &[
    GoalEntry {
        id: GoalId::MemoryVsGovernor,
        metric: "memory: `RateTier::check` / governor's `check_key`, time \
                 per check (1 hot key; 100k keys; each on 2 threads)",
        goal: Goal::at_most(1.0),
        why: "the hot path costs no more than governor's keyed limiter on \
              the same keys in the same loop",
    },
    GoalEntry {
        id: GoalId::Flood,
        metric: "memory: a new id in a store full after a flood of one-shot \
                 ids / an existing id, unflooded",
        goal: Goal::at_most(5.0),
        why: "a flood of new identities costs each check at most a small \
              factor: a full store keeps serving new ids",
    },
    GoalEntry {
        id: GoalId::ThreeLimits,
        metric: "memory: plan + 2 `Limit`s in one `RateTier::decide` / the \
                 plan alone (1 hot user; 100k users)",
        goal: Goal::below(2.5),
        why: "a decision over 3 limits of one user costs well under 3 \
              separate ones: one hash, one lock, the states built only \
              when asked",
    },
    GoalEntry {
        id: GoalId::InstructionsVsGovernor,
        metric: "memory: `RateTier::check` / governor's `check_key`, \
                 instructions per check (callgrind; 1 hot key; 100k keys)",
        goal: Goal::at_most(0.9),
        why: "the plain check decided in process, nothing built that \
              nobody reads: below governor's own work on the same keys, \
              a figure that no load on the machine moves",
    },
    GoalEntry {
        id: GoalId::InstructionsThreeLimits,
        metric: "memory: plan + 2 `Limit`s in one `RateTier::decide` / the \
                 plan alone, instructions (callgrind; 1 hot user)",
        goal: Goal::below(2.5),
        why: "the time goal of 3 limits, counted where no load moves it",
    },
    GoalEntry {
        id: GoalId::InstructionsHttpVsGovernor,
        metric: "HTTP through axum in process: `TierLimitLayer` / \
                 tower_governor's layer, instructions per request \
                 (callgrind)",
        goal: Goal::at_most(0.95),
        why: "the layer does less per request than tower_governor \
              configured alike (the same key header, headers answered)",
    },
    GoalEntry {
        id: GoalId::PeriodVsRate,
        metric: "a decision with one calendar period / with one GCRA rate, \
                 the same store and loop (memory: 1 hot user, 10k users, \
                 100k users; Redis: 1 hot user, 1k users)",
        goal: Goal::at_most(1.2),
        why: "a period keeps one count per bucket as a rate keeps one TAT: \
              a monthly quota costs at most a fifth more than a rate",
    },
    GoalEntry {
        id: GoalId::WindowVsRate,
        metric: "a decision with one sliding window of N = 100, its log \
                 full / with one GCRA rate, where the logs fit in the \
                 cache (memory: 1 hot user, 10k users; Redis: 1 hot user, \
                 1k users)",
        goal: Goal::at_most(3.0),
        why: "an exact window reads and shifts a log of up to N timestamps \
              where a rate reads one: at N = 100 it costs at most three \
              rate checks",
    },
    GoalEntry {
        id: GoalId::WindowVsFloor,
        metric: "a decision with one sliding window of N = 100, its log \
                 full / the machine's floor under it, a random read (each \
                 one's address read by the one before) and a write over an \
                 array the size of the logs, measured in the same run \
                 (memory, 100k users: the logs past the cache)",
        goal: Goal::at_most(2.5),
        why: "past the last-level cache a window waits for main memory as \
              any random access does, and a rate's small bucket does not: \
              against a rate that is the machine's cost, not the window's. \
              Its own is at most two and a half such accesses (the map's \
              entry, then the ring)",
    },
    GoalEntry {
        id: GoalId::SlotVsRate,
        metric: "a concurrency slot taken and given back / one GCRA rate \
                 check (memory: 1 hot user, 10k users, 100k users; Redis: \
                 1 hot user, 1k users)",
        goal: Goal::at_most(2.0),
        why: "a slot is two calls, taken at the decision and given back \
              when the request ends: together at most two rate checks",
    },
    GoalEntry {
        id: GoalId::SlotTakeVsRate,
        metric: "a concurrency slot taken, its give-back off the request's \
                 path (untimed) / one GCRA rate check (Redis: 1 hot user, 1k \
                 users)",
        goal: Goal::at_most(1.2),
        why: "what a request waits for is the take, one round trip and one \
              script as a rate check is; the give-back comes after its \
              answer: on the request's path a slot costs at most a fifth \
              more than a rate",
    },
    GoalEntry {
        id: GoalId::ReserveVsCheck,
        metric: "a reservation that does not wait (`Storage::reserve`) / a \
                 check of the same bucket, the same store and loop \
                 (memory: 1 hot user, 100k users; Redis: 1 hot user, 1k \
                 users)",
        goal: Goal::at_most(1.2),
        why: "a shaped call reserves where a limited one checks: waiting \
              instead of refusing costs a call that goes at once at most a \
              fifth more than a check",
    },
    GoalEntry {
        id: GoalId::ShapedVsQuota,
        metric: "calls/s an upstream saw from 2 worker processes shaped \
                 through one quota on Redis / the quota",
        goal: Goal::at_least(0.98),
        why: "a shaper spends the quota, it does not only guard it: calls \
              that wait take the slots back to back, so the upstream gets \
              the rate it sells, less 2%; a refused call, or more \
              than one call over the quota in any second, voids the figure",
    },
    GoalEntry {
        id: GoalId::HttpVsNoLayer,
        metric: "HTTP req/s: `TierLimitLayer` / no layer",
        goal: Goal::at_least(0.95),
        why: "the layer costs a hello-world route at most 5% of its req/s",
    },
    GoalEntry {
        id: GoalId::HttpVsGovernor,
        metric: "HTTP req/s: `TierLimitLayer` / tower_governor",
        goal: Goal::at_least(1.05),
        why: "the layer serves more than tower_governor configured alike",
    },
    GoalEntry {
        id: GoalId::RedisVsBenchmark,
        metric: "Redis checks/s: `RedisStorage` / redis-benchmark running \
                 the same script",
        goal: Goal::at_least(0.8),
        why: "one multiplexed connection gets most of what the server gives \
              a C client: the client's cost stays small beside Redis's",
    },
    GoalEntry {
        id: GoalId::RedisRoundTrips,
        metric: "Redis, 3 limits of one user: commands sent per decision",
        goal: Goal::at_most(1.0).on("commands", " per decision"),
        why: "the limits of one decision are one script call: one round \
              trip, not one per limit",
    },
    GoalEntry {
        id: GoalId::RedisCpuVsFloor,
        metric: "Redis server µs per script call / its floor (`TIME`, and \
                 a `GET` and a `SET PX` per key)",
        goal: Goal::at_most(5.0),
        why: "Redis's time per call is the limiter's ceiling at scale: a \
              script costs a small factor over the commands it cannot avoid",
    },
    GoalEntry {
        id: GoalId::RedisCpuThreeLimits,
        metric: "Redis server µs: 3 limits in one call / 1 limit",
        goal: Goal::at_most(2.0),
        why: "3 limits in one call share the call's cost: at most twice one \
              limit",
    },
    GoalEntry {
        id: GoalId::BreakerAdded,
        metric: "breaker open (Redis down): time per check added to memory's",
        goal: Goal::below(5.0).on("added", " µs"),
        why: "with Redis down, a check goes to memory at once, without \
              waiting on Redis",
    },
    GoalEntry {
        id: GoalId::MemoryIdle,
        metric: "memory: RSS growth once idle, the worst wave / the peak \
                 growth",
        goal: Goal::at_most(0.05),
        why: "room for the runtime's own growth (about 0.25 MiB), ten times \
              below the failure it guards against (half the peak, kept for \
              good)",
    },
    GoalEntry {
        id: GoalId::ServiceVsConstant,
        metric: "service RLS calls/s: memory store / the same tonic server \
                 answering a constant response",
        goal: Goal::at_least(0.8),
        why: "the limiter keeps most of the gRPC stack's ceiling",
    },
    GoalEntry {
        id: GoalId::ServiceRedisVsBenchmark,
        metric: "service RLS calls/s: on Redis / redis-benchmark running the \
                 same script",
        goal: Goal::at_least(0.8),
        why: "the service's Redis path keeps most of what Redis gives a C \
              client (the gRPC hop can bound it first: see its ceiling row)",
    },
    GoalEntry {
        id: GoalId::ServiceVsLimitador,
        metric: "service RLS calls/s, memory store / limitador-server's \
                 `memory` mode (the same client, alternating rounds)",
        goal: Goal::at_least(1.1),
        why: "the service answers more than its Rust peer, Kuadrant's \
              limitador, in the mode where nothing but the server itself \
              bounds either: GCRA's one number per bucket is no more work \
              than a counter",
    },
    GoalEntry {
        id: GoalId::ServiceRedisVsLimitador,
        metric: "service RLS calls/s, on Redis / limitador-server's `redis` \
                 mode on the same Redis",
        goal: Goal::at_least(1.5),
        why: "one atomic script call per decision (one round trip) \
              against limitador's two (an `MGET`, then a script that \
              increments): on a shared store, fewer round trips show",
    },
    GoalEntry {
        id: GoalId::ServiceRedisVsLimitadorCached,
        metric: "service RLS calls/s, on Redis (exact) / limitador-server's \
                 `redis_cached` mode (batched, approximate) on the same Redis",
        goal: Goal::at_least(1.0),
        why: "exactness costs nothing against a peer that answers from its \
              memory and writes to Redis in batches, letting instances \
              overshoot the limit",
    },
    GoalEntry {
        id: GoalId::PostgresVsPgbench,
        metric: "PostgreSQL checks/s: `PostgresStorage` / pgbench running \
                 the same statement (64 clients)",
        goal: Goal::at_least(0.8),
        why: "the pool and the client cost little beside the database's \
              own work: the store gets most of what PostgreSQL's own \
              client gets",
    },
    GoalEntry {
        id: GoalId::PostgresCpuVsUpdate,
        metric: "PostgreSQL server CPU per check / per plain `UPDATE` of \
                 one row by primary key",
        goal: Goal::at_most(2.0),
        why: "a decision costs the database at most twice the cheapest \
              write there is",
    },
];

// Each entry at its id's index, every id with an entry.
const _: () = {
    let mut i = 0;
    while i < GOALS.len() {
        assert!(GOALS[i].id as usize == i, "GOALS is out of GoalId's order");
        i += 1;
    }
    assert!(
        GOALS.len() == GoalId::PostgresCpuVsUpdate as usize + 1,
        "a GoalId has no entry in GOALS"
    );
};

impl GoalId {
    /// Its entry of [`GOALS`].
    pub(crate) fn entry(self) -> &'static GoalEntry {
        &GOALS[self as usize]
    }
}

/// How a figure is compared with a goal's bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cmp {
    AtMost,
    AtLeast,
    Below,
}

/// What a row aims at.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Goal {
    /// No goal: the row is shown for scale, with this note.
    Info(&'static str),
    /// The figure (the ratio, unless the row says otherwise) compared with
    /// `bound`; `what` names the figure when it is not the ratio, `unit`
    /// follows the bound.
    Bound {
        cmp: Cmp,
        bound: f64,
        what: &'static str,
        unit: &'static str,
    },
}

impl Goal {
    pub(crate) const fn at_most(bound: f64) -> Goal {
        Goal::Bound {
            cmp: Cmp::AtMost,
            bound,
            what: "",
            unit: "",
        }
    }

    pub(crate) const fn at_least(bound: f64) -> Goal {
        Goal::Bound {
            cmp: Cmp::AtLeast,
            bound,
            what: "",
            unit: "",
        }
    }

    pub(crate) const fn below(bound: f64) -> Goal {
        Goal::Bound {
            cmp: Cmp::Below,
            bound,
            what: "",
            unit: "",
        }
    }

    /// The same goal on a figure other than the ratio, named `what`, its
    /// bound shown with `unit`.
    pub(crate) const fn on(
        self,
        what: &'static str,
        unit: &'static str,
    ) -> Goal {
        match self {
            Goal::Bound { cmp, bound, .. } => Goal::Bound {
                cmp,
                bound,
                what,
                unit,
            },
            info @ Goal::Info(_) => info,
        }
    }

    /// Whether `value` meets it; `None` for a goal that is only a note.
    pub(crate) fn met(&self, value: f64) -> Option<bool> {
        match *self {
            Goal::Info(_) => None,
            Goal::Bound { cmp, bound, .. } => Some(match cmp {
                Cmp::AtMost => value <= bound,
                Cmp::AtLeast => value >= bound,
                Cmp::Below => value < bound,
            }),
        }
    }
}

impl fmt::Display for Goal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Goal::Info(note) => f.write_str(note),
            Goal::Bound {
                cmp,
                bound,
                what,
                unit,
            } => {
                let sign = match cmp {
                    Cmp::AtMost => "≤",
                    Cmp::AtLeast => "≥",
                    Cmp::Below => "<",
                };
                if !what.is_empty() {
                    write!(f, "{what} ")?;
                }
                write!(f, "{sign} {bound:?}{unit}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_goal_and_why() {
        let flood = GoalId::Flood.entry();
        assert_eq!(flood.id, GoalId::Flood);
        assert_eq!(flood.goal.to_string(), "≤ 5.0");
        assert_eq!(
            GoalId::RedisRoundTrips.entry().goal.to_string(),
            "commands ≤ 1.0 per decision"
        );
        // The goals of the kinds beside the rate.
        let kinds = [GoalId::PeriodVsRate, GoalId::WindowVsRate];
        let kinds = kinds.map(|id| id.entry().goal.to_string());
        assert_eq!(kinds, ["≤ 1.2", "≤ 3.0"]);
        // A reservation against a check, shaping against the quota.
        let shaping = [GoalId::ReserveVsCheck, GoalId::ShapedVsQuota];
        let shaping = shaping.map(|id| id.entry().goal.to_string());
        assert_eq!(shaping, ["≤ 1.2", "≥ 0.98"]);
        assert_eq!(GoalId::ShapedVsQuota.entry().goal.met(0.979), Some(false));
        assert_eq!(GoalId::SlotVsRate.entry().goal.met(2.0), Some(true));
        assert_eq!(GoalId::SlotVsRate.entry().goal.met(2.01), Some(false));
        for entry in GOALS {
            assert!(!entry.metric.is_empty() && !entry.why.is_empty());
            assert!(entry.goal.met(0.0).is_some(), "{:?} is a note", entry.id);
        }
    }

    #[test]
    fn the_text_and_the_decision_come_from_one_value() {
        let goal = Goal::at_most(1.0);
        assert_eq!(goal.to_string(), "≤ 1.0");
        assert_eq!(goal.met(1.0), Some(true));
        assert_eq!(goal.met(1.01), Some(false));

        let goal = Goal::below(5.0).on("added", " µs");
        assert_eq!(goal.to_string(), "added < 5.0 µs");
        assert_eq!(goal.met(4.9), Some(true));
        assert_eq!(goal.met(5.0), Some(false));

        let goal = Goal::at_least(0.95);
        assert_eq!(goal.to_string(), "≥ 0.95");
        assert_eq!(goal.met(0.95), Some(true));

        assert_eq!(Goal::Info("(info)").met(3.0), None);
        assert_eq!(Goal::Info("(info)").to_string(), "(info)");
    }
}
