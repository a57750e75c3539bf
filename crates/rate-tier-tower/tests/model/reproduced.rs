//! Scenarios of the defects reproduced by hand, as the model's operations:
//! each fails against the defect it is named after, whatever the random
//! search finds.

use std::time::Duration;

use crate::system::{InstanceSetup, Kind, Op, Route, Scenario};

const fn setup(wait: bool, bans: bool, remember: bool) -> InstanceSetup {
    InstanceSetup {
        wait,
        bans,
        remember,
    }
}

fn request(inst: usize, user: usize, route: Route, cost: u32) -> Op {
    Op::Request {
        inst,
        user,
        route,
        cost,
    }
}

/// User 0's free tier (4 an hour) spent through instance `inst`.
fn spend(inst: usize) -> Vec<Op> {
    (0..4).map(|_| request(inst, 0, Route::Plan, 1)).collect()
}

fn scenario(kind: Kind, setups: Vec<InstanceSetup>, ops: Vec<Op>) -> Scenario {
    Scenario {
        kind,
        setups,
        ops,
        ban_length: Duration::from_secs(20 * 60),
        clock_back: false,
    }
}

pub fn scenarios() -> Vec<(&'static str, Scenario)> {
    let memory = Kind::MemoryShared;
    let mut out = Vec::new();

    // Requests waiting for their slots make their customer look banned.
    let mut ops: Vec<Op> =
        (0..3).map(|_| request(0, 0, Route::Search, 1)).collect();
    ops.extend([
        Op::Spawn {
            inst: 0,
            user: 0,
            route: Route::Search,
        },
        request(0, 0, Route::Plan, 1),
        request(0, 0, Route::Login, 1),
        Op::Advance { minutes: 30 },
    ]);
    out.push((
        "waiting and bans",
        scenario(memory, vec![setup(true, true, false)], ops),
    ));

    // An instance that does not wait caps away the slots another reserved
    // (a burst window of 30 minutes, waits of up to 40).
    let mut ops = vec![
        Op::Reload {
            inst: 0,
            variant: 1,
        },
        Op::Reload {
            inst: 1,
            variant: 1,
        },
    ];
    ops.extend((0..3).map(|_| request(0, 0, Route::Plan, 1)));
    ops.extend((0..3).map(|_| Op::Spawn {
        inst: 0,
        user: 0,
        route: Route::Plan,
    }));
    ops.extend([
        request(1, 0, Route::Plan, 1),
        Op::Spawn {
            inst: 0,
            user: 0,
            route: Route::Plan,
        },
    ]);
    ops.push(Op::Advance { minutes: 60 });
    out.push((
        "an instance that does not wait beside one that does",
        scenario(
            memory,
            vec![setup(true, false, false), setup(false, false, false)],
            ops,
        ),
    ));

    // A ban of 13 hours ends at 11.93 on the instances that did not give it.
    let mut ops = spend(0);
    ops.extend([request(0, 0, Route::Plan, 1), request(0, 0, Route::Plan, 1)]);
    ops.extend([Op::Advance { minutes: 720 }, request(1, 0, Route::Plan, 1)]);
    let mut long = scenario(
        memory,
        vec![setup(false, true, false), setup(false, true, false)],
        ops,
    );
    long.ban_length = Duration::from_secs(13 * 3600);
    out.push(("a long ban read elsewhere", long));

    // Settling a limit not declared settled forgives the debt.
    let ops = vec![
        request(0, 0, Route::Tokens, 1),
        Op::SettleUndeclared {
            inst: 0,
            user: 0,
            actual: 29,
        },
        request(0, 0, Route::Search, 1),
    ];
    out.push((
        "a settlement of an undeclared limit",
        scenario(memory, vec![setup(false, false, false)], ops),
    ));

    // A reset through an instance that does not ban leaves the ban.
    let mut ops = spend(0);
    ops.extend([
        request(0, 0, Route::Plan, 1),
        request(0, 0, Route::Plan, 1),
        Op::Reset { inst: 1, user: 0 },
        request(0, 0, Route::Plan, 1),
    ]);
    out.push((
        "a reset through an instance that does not ban",
        scenario(
            memory,
            vec![setup(false, true, false), setup(false, false, false)],
            ops,
        ),
    ));

    // On Redis: a reset through one instance is not seen by another's
    // memory of refusals.
    let mut ops = spend(0);
    ops.extend([
        request(0, 0, Route::Plan, 1),
        request(0, 0, Route::Plan, 1),
        Op::Reset { inst: 1, user: 0 },
        request(0, 0, Route::Plan, 1),
    ]);
    out.push((
        "a reset through another instance, on Redis",
        scenario(
            Kind::Redis,
            vec![setup(false, false, true), setup(false, false, false)],
            ops,
        ),
    ));

    // On Redis: a costlier request answered from memory is told the wait
    // of the cheaper one.
    let mut ops = spend(0);
    ops.extend([request(0, 0, Route::Plan, 1), Op::Retry { more: 1 }]);
    out.push((
        "a costlier request answered from memory",
        scenario(
            Kind::Redis,
            vec![setup(false, false, true), setup(false, false, false)],
            ops,
        ),
    ));

    // On Redis: a refusal that banned, answered from memory as a rate's.
    let mut ops = spend(0);
    ops.extend([
        request(0, 0, Route::Plan, 1),
        request(0, 0, Route::Plan, 1),
        request(0, 0, Route::Plan, 1),
    ]);
    out.push((
        "a remembered refusal beside a ban",
        scenario(
            Kind::Redis,
            vec![setup(false, true, true), setup(false, false, false)],
            ops,
        ),
    ));
    out
}
