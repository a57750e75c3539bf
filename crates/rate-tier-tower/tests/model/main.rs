//! A model-based test of the whole limiter: random sequences of requests
//! (of random cost, on routes with several kinds of limit), waits,
//! settlements, resets, bans, tier reloads, clock steps forward and back,
//! and a store's outage and its end, spread over two or three instances
//! configured differently (waiting or not, banning or not, remembering
//! refusals or not), each answer compared with [`reference`]: the rules
//! alone over one table of buckets (or one per instance, where each has
//! its own store). A divergence is a limit that went, a refused request
//! that charged, a debt forgiven, a reset that did not hold everywhere, or
//! a ban without cause.
//!
//! Stores: one memory store shared by every instance (each behind a
//! fallback, so the shared store can go down), a memory store per
//! instance, and, on `cargo xtask test-redis` / `test-cluster`, Redis, a
//! Redis Cluster and PostgreSQL. Time is a clock over Tokio's paused time
//! (moved by waits, `Advance` and `Step`) for memory; on the shared
//! servers it is real, so their quotas count hours and their operations
//! take no time worth a bucket's interval: the model's time stands still.
//!
//! `TRT_MODEL_CASES` sets the number of cases (default 256 per memory
//! store, 16 on a server; each case is 10 to 60 operations on 2 or 3
//! instances), `TRT_MODEL_SEED` their seed (fixed by default: the same
//! cases on every run; `random` for new ones).
#![allow(clippy::unwrap_used, missing_docs, unreachable_pub)]

mod reference;
mod reproduced;
mod system;

use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};

use system::{Kind, Op, Route, Scenario, Setup};

/// The operations of a case on a store of `kind`.
fn ops(kind: Kind, instances: usize) -> impl Strategy<Value = Vec<Op>> {
    let inst = 0..instances;
    let user = 0..3usize;
    let route = prop_oneof![
        3 => Just(Route::Plan),
        2 => Just(Route::Search),
        1 => Just(Route::Login),
        2 => Just(Route::Tokens),
    ];
    let cost = prop_oneof![8 => Just(1u32), 4 => Just(2u32), 1 => Just(9u32)];
    let request = (inst.clone(), user.clone(), route.clone(), cost.clone())
        .prop_map(|(inst, user, route, cost)| Op::Request {
            inst,
            user,
            route,
            cost,
        });
    let settle = (inst.clone(), user.clone(), 1u32..30, 0..6u8).prop_map(
        |(inst, user, actual, undeclared)| match undeclared {
            0 => Op::SettleUndeclared { inst, user, actual },
            _ => Op::Settle { inst, user, actual },
        },
    );
    let reset = (inst.clone(), user.clone())
        .prop_map(|(inst, user)| Op::Reset { inst, user });
    let reload = (inst.clone(), 0..2usize)
        .prop_map(|(inst, variant)| Op::Reload { inst, variant });
    // On a server, resets are what its instances' memories must hear of.
    let resets = if matches!(kind, Kind::MemoryShared | Kind::MemoryPerInstance)
    {
        2
    } else {
        3
    };
    let retry = (0u32..=1).prop_map(|more| Op::Retry { more });
    let common = prop_oneof![
        20 => request,
        4 => retry,
        3 => settle,
        resets => reset,
        2 => reload,
    ];
    let op = match kind {
        Kind::MemoryShared | Kind::MemoryPerInstance => {
            let spawn =
                (
                    inst,
                    user,
                    prop_oneof![
                        Just(Route::Plan),
                        Just(Route::Search),
                        Just(Route::Tokens)
                    ],
                )
                    .prop_map(|(inst, user, route)| {
                        Op::Spawn { inst, user, route }
                    });
            let advance = prop_oneof![9 => 1u64..=15, 1 => 60u64..=720]
                .prop_map(|minutes| Op::Advance { minutes });
            let step = (any::<bool>(), 1u64..=10)
                .prop_map(|(back, minutes)| Op::Step { back, minutes });
            let drop = any::<prop::sample::Index>()
                .prop_map(|which| Op::Drop { which });
            let outage = any::<bool>().prop_map(|down| Op::Outage { down });
            let outage_weight = if kind == Kind::MemoryShared { 2 } else { 0 };
            prop_oneof![
                16 => common,
                3 => spawn,
                2 => advance,
                2 => step,
                1 => drop,
                outage_weight => outage,
            ]
            .boxed()
        }
        _ => common.boxed(),
    };
    prop::collection::vec(op, 10..60)
}

fn scenario(kind: Kind) -> impl Strategy<Value = Scenario> {
    (2usize..=3)
        .prop_flat_map(move |instances| {
            (
                prop::collection::vec(system::instance_setup(kind), instances),
                ops(kind, instances),
                any::<bool>(),
                prop_oneof![Just(20u64), Just(13 * 60)],
            )
        })
        .prop_map(move |(setups, ops, clock_back, ban_minutes)| Scenario {
            kind,
            setups,
            ops,
            ban_length: std::time::Duration::from_secs(ban_minutes * 60),
            clock_back,
        })
}

/// The seed of the cases: fixed (the same cases on every run) unless
/// `TRT_MODEL_SEED` says otherwise (a number, or `random`).
fn seed() -> RngSeed {
    match std::env::var("TRT_MODEL_SEED").as_deref() {
        Ok("random") => RngSeed::Fixed(rand_seed()),
        Ok(seed) => {
            RngSeed::Fixed(seed.parse().expect("TRT_MODEL_SEED: a number"))
        }
        Err(_) => RngSeed::Fixed(0x7472_745f_6d6f_6465),
    }
}

/// A new seed, printed with a failure so that it can be run again.
fn rand_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// How many cases on a store of `kind`: `TRT_MODEL_CASES`, or 256 in
/// memory (a few seconds) and 16 on a server (real round trips, and a
/// second's wait after each reset for the instances' memories to hear of
/// it).
fn cases(kind: Kind) -> u32 {
    let default = match kind {
        Kind::MemoryShared | Kind::MemoryPerInstance => 256,
        _ => 16,
    };
    std::env::var("TRT_MODEL_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// Plays one scenario on a runtime of its own (paused time for memory).
fn play(scenario: &Scenario, seen: &Arc<system::Seen>) -> Result<(), String> {
    let runtime = match scenario.kind {
        Kind::MemoryShared | Kind::MemoryPerInstance => {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
        }
        _ => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    }
    .unwrap();
    runtime.block_on(async {
        Setup::new(scenario, seen.clone())
            .await
            .and_then_run(scenario)
            .await
    })
}

/// Runs `cases` scenarios on a store of `kind`, each on a runtime of its
/// own (paused time for memory), shrinking a failure to a short sequence.
fn run(kind: Kind, cases: u32) {
    let seed = seed();
    let seen: Arc<system::Seen> = Arc::default();
    let mut runner = TestRunner::new(Config {
        cases,
        rng_seed: seed,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&scenario(kind), |scenario| {
        let outcome = play(&scenario, &seen);
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}\n(TRT_MODEL_SEED={seed}, TRT_MODEL_CASES={cases})");
    }
    let seen: Vec<String> = seen
        .iter()
        .zip(system::SEEN_NAMES)
        .map(|(n, name)| {
            format!(
                "{name} {}",
                n.swap(0, std::sync::atomic::Ordering::Relaxed)
            )
        })
        .collect();
    eprintln!("{kind:?}, {cases} cases: {}", seen.join(", "));
}

/// The defects that were reproduced by hand, each as the model's
/// operations: the search must find them, and these find them always.
fn reproduced(kinds: &[Kind]) {
    let seen = Arc::default();
    for (what, scenario) in reproduced::scenarios() {
        if kinds.contains(&scenario.kind)
            && let Err(divergence) = play(&scenario, &seen)
        {
            panic!("{what}: {divergence}");
        }
    }
}

#[test]
fn the_defects_reproduced_by_hand_agree_with_the_model_in_memory() {
    reproduced(&[Kind::MemoryShared, Kind::MemoryPerInstance]);
}

#[test]
fn the_defects_reproduced_by_hand_agree_with_the_model_on_redis() {
    reproduced(&[Kind::Redis]);
}

#[test]
fn instances_on_one_memory_store_behind_fallbacks_agree_with_the_model() {
    run(Kind::MemoryShared, cases(Kind::MemoryShared));
}

#[test]
fn instances_each_on_a_memory_store_of_their_own_agree_with_the_model() {
    run(Kind::MemoryPerInstance, cases(Kind::MemoryPerInstance));
}

#[test]
fn instances_on_one_redis_agree_with_the_model() {
    run(Kind::Redis, cases(Kind::Redis));
}

#[test]
fn instances_on_one_redis_cluster_agree_with_the_model() {
    run(Kind::RedisCluster, cases(Kind::RedisCluster));
}

#[test]
fn instances_on_one_postgres_agree_with_the_model() {
    run(Kind::Postgres, cases(Kind::Postgres));
}
