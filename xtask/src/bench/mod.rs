//! `cargo xtask bench`: every benchmark in one run, each figure a ratio
//! against a peer measured side by side in the same run, a table of them,
//! and BENCHMARKS.md rewritten with it.
//!
//! | part | what | peer |
//! |---|---|---|
//! | `check` (criterion) | gcra-core decision; `RateTier::check` in memory; a check in a flooded full store | governor's keyed limiter; the unflooded check |
//! | `limits` (criterion) | one decision over 3 limits of a user, in memory | the plan alone |
//! | `instructions` (callgrind) | instructions per check (one key, 100k keys, 3 limits, the store alone) and per HTTP request through axum in process | governor's `check_key`; the plan alone; tower_governor's layer, no layer |
//! | `kinds` (storage, criterion) | a decision with one window (N = 100), one period, a concurrency slot taken and given back, in memory and on a throwaway Redis | one GCRA rate check of the same store |
//! | `reserve` (storage, criterion) | a reservation that does not wait (`Storage::reserve`), of one bucket and of two, in memory and on a throwaway Redis | a check of the same buckets |
//! | `shaper` (the example) | calls/s an upstream sees from 2 worker processes shaped through one quota on a throwaway Redis | the quota |
//! | `breaker` (criterion) | a check with Redis down, breaker open | a plain memory check |
//! | `http` | req/s of an axum route with `TierLimitLayer` | no layer; tower_governor |
//! | `redis_store` | checks/s of `RedisStorage`, 64 tasks, one connection; commands sent per 3-limit decision | redis-benchmark, same script; 1 |
//! | Redis CPU (xtask) | server µs per call of each Lua script | `GET` + `SET PX` + `TIME` |
//! | `memory` | RSS after 1M keys, then idle after each of 5 waves | governor's keyed limiter |
//! | `postgres` (storage) | checks/s of `PostgresStorage`, 64 tasks; the server's CPU per check | pgbench running the same statement, 64 clients; a plain `UPDATE` by primary key |
//! | `rls` (service) | `ShouldRateLimit`/s on memory, on Redis; p50/p99 at a fixed load | the same tonic server answering a constant response; redis-benchmark, same script |
//! | `limitador` (service) | `ShouldRateLimit`/s on memory, on Redis, in alternating rounds with the same client | Kuadrant's `limitador-server` in its `memory`, `redis` and `redis_cached` modes |
//!
//! The named parts are bench targets of `tower-rate-tier`
//! (`crates/rate-tier-tower/benches/`, `--features redis`), except `rls`, of
//! `rate-tier-service` (`crates/rate-tier-service/benches/`), which
//! also serves `limitador` (`rls --limitador BIN`), and
//! `kinds`, `reserve` and `postgres`, of `rate-tier-storage` (`--features
//! redis` and `--features postgres`), and `shaper`, the example
//! `examples/shaper.rs` (built with `cargo build -p examples`); the Redis
//! CPU part runs `redis-benchmark` itself. `--only` runs the parts it
//! names (`plan::PARTS`) and prints their rows, leaving BENCHMARKS.md as
//! it is. The modules: `runner` runs each part and hands back its figures
//! or why it has none, `parse` reads their
//! outputs (criterion's; the bench targets' results are the typed structs
//! of `crates/bench-results`, which the benches write), `rows` turns them
//! into the table's rows, each judged by a goal of `goal::GOALS` (one table
//! of every goal, each one value that both prints the goal and decides it,
//! and why it is the goal), `report` fills `BENCHMARKS.template.md`, and
//! `charts` draws the same rows and results as SVG charts into `docs/bench/`,
//! which BENCHMARKS.md shows.
//!
//! A part that fails (a bench target that does not build, a missing tool)
//! fails its own rows, which say why; the other parts still run.
//!
//! The `limitador` part needs a `limitador-server` binary, built outside
//! the project (its code is never copied in): `TRT_LIMITADOR_BIN`, else
//! `limitador-server` on PATH, else `../limitador/target/release/
//! limitador-server` (a checkout beside the project):
//!
//! ```text
//! apt-get install -y protobuf-compiler libclang-dev   # protoc, libclang
//! git clone https://github.com/Kuadrant/limitador ../limitador
//! (cd ../limitador && cargo build --release -p limitador-server)
//! cargo xtask bench --only limitador
//! ```
//!
//! Without it, its rows read "not measured: no limitador-server; build it
//! with ..." and count among the goals with no figure.

mod charts;
mod goal;
mod parse;
mod plan;
mod report;
mod rows;
mod runner;

use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::Value;

use crate::cmd::Result;
use crate::cmd::{Cmd, project_root};

pub(crate) use self::plan::Part;
use self::plan::{Plan, Tools};
use self::report::Machine;
use self::rows::Results;

/// One benchmark run, quick by default; of the parts `only` names, when
/// it names some.
pub(crate) fn bench(
    full: bool,
    only: Option<Vec<Part>>,
    criterion_args: &[OsString],
) -> Result<()> {
    let started = Instant::now();
    let plan = Plan::new(full, only);
    let tools = Tools::find(&plan);
    let target_dir = target_directory()?;
    let results_dir = target_dir.join("xtask-bench");
    let _ = fs::remove_dir_all(&results_dir);
    fs::create_dir_all(&results_dir).map_err(|e| {
        format!("could not create {}: {e}", results_dir.display())
    })?;

    let build_started = Instant::now();
    let targets: Vec<runner::Target> = runner::targets()
        .into_iter()
        .filter(|&(_, _, target)| plan.runs_target(target))
        .collect();
    let mut built = runner::build(&targets);
    if plan.runs(Part::Shaper) {
        built.add_example(runner::SHAPER_EXAMPLE);
    }
    let build_time = build_started.elapsed();
    let runs_started = Instant::now();

    let criterion_home = target_dir.join("criterion");
    let criterion = runner::criterion(
        &plan,
        &tools,
        &built,
        &criterion_home,
        criterion_args,
    );
    let criterion_missing = runner::CRITERION_BENCHES
        .into_iter()
        .filter_map(|(_, _, target)| Some((target, built.exe(target).err()?)))
        .collect();
    let results = Results {
        criterion: criterion.passes,
        criterion_missing,
        criterion_no_redis: criterion.no_redis,
        shaper: runner::shaper(&plan, &tools, &built, &results_dir),
        http: runner::http(&plan, &tools, &built, &results_dir),
        redis: runner::redis_store(&plan, &tools, &built, &results_dir),
        redis_cpu: runner::redis_cpu(&plan, &tools),
        rls: runner::rls(&plan, &tools, &built, &results_dir),
        limitador: runner::limitador(&plan, &tools, &built, &results_dir),
        postgres: runner::postgres(&plan, &tools, &built, &results_dir),
        memory: runner::memory(&plan, &built, &results_dir),
        memory_peer: runner::memory_peer(&plan, &built, &results_dir),
        instructions: runner::instructions(&tools, &built, &results_dir),
    };
    let run_time = runs_started.elapsed();

    let rows: Vec<rows::Row> = rows::sections(&results)
        .into_iter()
        .filter(|(part, _)| plan.runs(*part))
        .flat_map(|(_, rows)| rows)
        .collect();
    println!("\n{}", report::render_table(&rows));
    if plan.only.is_some() {
        println!(
            "xtask: `{}` ran some parts only: BENCHMARKS.md is left as it is \
             (benchmarks {:.0} s, total {:.0} s)",
            plan.command(criterion_args),
            run_time.as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
        print_unmet(&rows);
        return Ok(());
    }
    let redis_version = tools.redis.as_ref().ok().and_then(|bins| {
        Cmd::new(&bins.server)
            .arg("--version")
            .read()
            .ok()
            .map(|v| v.trim().to_owned())
    });
    let postgres_version = results
        .postgres
        .as_ref()
        .ok()
        .and_then(|postgres| postgres.server_version.clone());
    let limitador = match (&tools.limitador, &results.limitador) {
        (Err(why), _) => why.clone(),
        (Ok(bin), Ok(measured)) => format!(
            "{} ({})",
            measured
                .results
                .limitador_version
                .as_deref()
                .unwrap_or("version unknown"),
            bin.display()
        ),
        (Ok(bin), Err(why)) => format!("{}: {why}", bin.display()),
    };
    let machine = Machine::read(
        tools.wrk.as_deref(),
        redis_version,
        postgres_version,
        limitador,
    );
    let cpu_commands = results
        .redis_cpu
        .as_ref()
        .map_or(&[][..], |cpu| cpu.commands.as_slice());
    let text = report::report(
        &plan,
        &plan.command(criterion_args),
        &machine,
        &rows,
        cpu_commands,
        run_time,
    )?;
    let path = project_root().join("BENCHMARKS.md");
    fs::write(&path, text)
        .map_err(|e| format!("could not write {}: {e}", path.display()))?;
    // After BENCHMARKS.md, so that a chart that fails loses no figure.
    let charts_dir = project_root().join(charts::DIR);
    let charts = charts::write(&charts_dir, &rows, &results)?;
    println!(
        "xtask: wrote {} and {} charts in {} (build {:.0} s, benchmarks \
         {:.0} s, total {:.0} s)",
        path.display(),
        charts.len(),
        charts_dir.display(),
        build_time.as_secs_f64(),
        run_time.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    print_unmet(&rows);
    Ok(())
}

/// The goals not met, or with no figure, and why each is a goal.
fn print_unmet(rows: &[rows::Row]) {
    let unmet = report::unmet(rows);
    if !unmet.is_empty() {
        println!("xtask: goals not met, or with no figure:");
        for line in unmet {
            println!("  - {line}");
        }
    }
    let missed = report::missed(rows);
    if !missed.is_empty() {
        println!("xtask: the goals not met, and why each is a goal (goal.rs):");
        for entry in missed {
            println!("  - {} {}: {}", entry.metric, entry.goal, entry.why);
        }
    }
}

/// Cargo's target directory (`cargo metadata`).
fn target_directory() -> Result<PathBuf> {
    let metadata = Cmd::cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .read()?;
    let metadata: Value = serde_json::from_str(&metadata).map_err(|e| {
        format!("could not read `cargo metadata`'s output: {e}")
    })?;
    metadata["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| {
            "`cargo metadata` printed no target_directory".to_owned()
        })
}
