//! Outgoing calls shaped across processes: two worker processes call one
//! upstream through one quota in Redis (`ShapeLayer`), each firing all its
//! calls at once; the upstream prints the rate it saw.
//!
//! ```text
//! cargo run --example shaper -- --redis redis://127.0.0.1:6379/
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example shaper -- --calls 50 --rate 10
//! ```
//!
//! `--calls N` is each worker's number of calls (100), `--rate R` the
//! upstream's quota in calls per second, evenly spaced (20), `--workers W`
//! the number of worker processes (2), `--results FILE` where to write
//! the same figures as JSON as well (`ShaperResults` of
//! `crates/bench-results`: how `cargo xtask bench` reads them). The upstream is a TCP listener on
//! loopback that notes when each call (one line) arrives and answers
//! `ok`; the workers' client is a plain `tower::Service` over a
//! `TcpStream`, wrapped in the `ShapeLayer`: any client service works the
//! same (a hyper client, reqwest through its tower adapter, a tonic
//! channel).
//!
//! It prints, for 2 workers of 100 calls at 20 a second:
//!
//! ```text
//! upstream: 200 calls from 2 workers in 9.95 s: 20.0 calls/s (quota 20/s)
//! most in any second: 20; closest two calls: 44.0 ms apart (interval 50.0 ms); refused: 0
//! ```
//!
//! The slots are exactly one interval apart on Redis's clock; what the
//! upstream sees adds each call's own delays (the reply of its
//! reservation, the scheduler, the connection), so two calls may arrive a
//! few milliseconds closer than the interval. Times are measured, so they
//! vary from run to run.
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rate_tier_bench_results::{ResultsFile, ShaperResults};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tower::{Service, ServiceExt, service_fn};
use tower_rate_tier::{
    Quota, RedisStorage, shape::ShapeError, shape::ShapeLayer,
};

struct Args {
    redis: Option<String>,
    calls: u32,
    rate: u32,
    workers: u32,
    /// Where to write the figures as JSON too, when given.
    results: Option<std::path::PathBuf>,
    /// Set in a worker process: the upstream's address and the account.
    worker: Option<(String, String)>,
}

fn parse_args() -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut args = Args {
        redis: std::env::var("REDIS_URL")
            .ok()
            .filter(|url| !url.is_empty()),
        calls: 100,
        rate: 20,
        workers: 2,
        results: None,
        worker: None,
    };
    let mut parser = lexopt::Parser::from_env();
    let text = |parser: &mut lexopt::Parser| -> Result<String, String> {
        parser
            .value()
            .map_err(|e| e.to_string())?
            .string()
            .map_err(|e| e.to_string())
    };
    let number = |name: &str, value: String| -> Result<u32, String> {
        value
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{name} needs a number above 0"))
    };
    let mut upstream = None;
    let mut account = None;
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Long("redis") => args.redis = Some(text(&mut parser)?),
            Long("calls") => {
                args.calls = number("--calls", text(&mut parser)?)?
            }
            Long("rate") => args.rate = number("--rate", text(&mut parser)?)?,
            Long("workers") => {
                args.workers = number("--workers", text(&mut parser)?)?
            }
            Long("results") => args.results = Some(text(&mut parser)?.into()),
            // A worker process, started by the example itself.
            Long("upstream") => upstream = Some(text(&mut parser)?),
            Long("account") => account = Some(text(&mut parser)?),
            Short('h') | Long("help") => return Err(String::new()),
            other => return Err(other.unexpected().to_string()),
        }
    }
    args.worker = upstream.zip(account);
    Ok(args)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(error) => {
            if !error.is_empty() {
                eprintln!("shaper: {error}");
            }
            eprintln!(
                "usage: shaper --redis URL [--calls N] [--rate PER_SECOND] [--workers W] [--results FILE]\n\
                 (or REDIS_URL): the workers share the quota through Redis"
            );
            return ExitCode::from(2);
        }
    };
    let Some(redis) = args.redis.clone() else {
        eprintln!(
            "shaper: needs a Redis to share the quota between processes: --redis URL or REDIS_URL"
        );
        return ExitCode::from(2);
    };
    let result = match &args.worker {
        Some((upstream, account)) => {
            worker(&redis, upstream, account, &args).await
        }
        None => run(&redis, &args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("shaper: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The upstream, and the workers that call it; then what it saw.
async fn run(redis: &str, args: &Args) -> Result<(), String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| format!("upstream: {e}"))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let upstream = tokio::spawn(serve(listener, seen.clone()));

    // One account per run: the quota is shared by this run's workers only.
    let account = format!("shaper-example-{}", std::process::id());
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut workers = Vec::new();
    for _ in 0..args.workers {
        let child = tokio::process::Command::new(&exe)
            .args(["--redis", redis, "--upstream", &address.to_string()])
            .args(["--account", &account])
            .args(["--calls", &args.calls.to_string()])
            .args(["--rate", &args.rate.to_string()])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting a worker: {e}"))?;
        workers.push(child);
    }
    let mut refused = 0u64;
    for child in workers {
        let output = child
            .wait_with_output()
            .await
            .map_err(|e| format!("a worker: {e}"))?;
        if !output.status.success() {
            return Err(format!("a worker failed: {}", output.status));
        }
        // Each worker prints how many of its calls were refused.
        let text = String::from_utf8_lossy(&output.stdout);
        refused += text
            .trim()
            .strip_prefix("refused ")
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(|| format!("a worker said {text:?}"))?;
    }
    upstream.abort();

    let mut times = seen.lock().map_err(|_| "poisoned")?.clone();
    times.sort_unstable();
    let (Some(first), Some(last)) = (times.first(), times.last()) else {
        return Err("the upstream saw no call".into());
    };
    let span = last.duration_since(*first);
    let rate = (times.len() - 1) as f64 / span.as_secs_f64().max(1e-9);
    let closest = times
        .windows(2)
        .map(|pair| pair[1].duration_since(pair[0]))
        .min()
        .unwrap_or_default();
    // What a provider counts: the most calls in any second, [t, t + 1 s).
    let busiest = (0..times.len())
        .map(|i| {
            let end = times[i] + Duration::from_secs(1);
            times[i..].iter().take_while(|&&t| t < end).count()
        })
        .max()
        .unwrap_or_default();
    println!(
        "upstream: {} calls from {} workers in {:.2} s: {:.1} calls/s (quota {}/s)",
        times.len(),
        args.workers,
        span.as_secs_f64(),
        rate,
        args.rate,
    );
    println!(
        "most in any second: {busiest}; closest two calls: {:.1} ms apart (interval {:.1} ms); refused: {refused}",
        closest.as_secs_f64() * 1e3,
        1e3 / f64::from(args.rate),
    );
    if let Some(path) = &args.results {
        let results = ShaperResults {
            workers: Some(u64::from(args.workers)),
            calls: Some(times.len() as u64),
            quota_per_sec: Some(f64::from(args.rate)),
            seconds: Some(span.as_secs_f64()),
            observed_per_sec: Some(rate),
            busiest_second: Some(busiest as u64),
            closest_ms: Some(closest.as_secs_f64() * 1e3),
            interval_ms: Some(1e3 / f64::from(args.rate)),
            refused: Some(refused),
        };
        results.write(path)?;
    }
    Ok(())
}

/// The upstream: notes when each line arrives, answers `ok`.
async fn serve(listener: TcpListener, seen: Arc<Mutex<Vec<Instant>>>) {
    while let Ok((stream, _)) = listener.accept().await {
        let seen = seen.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(_)) = lines.next_line().await {
                if let Ok(mut seen) = seen.lock() {
                    seen.push(Instant::now());
                }
                if write.write_all(b"ok\n").await.is_err() {
                    return;
                }
            }
        });
    }
}

/// A worker: all its calls at once, each through the shared quota.
async fn worker(
    redis: &str,
    upstream: &str,
    account: &str,
    args: &Args,
) -> Result<(), String> {
    let connection = redis::Client::open(redis)
        .map_err(|e| format!("--redis: {e}"))?
        .get_connection_manager()
        .await
        .map_err(|e| format!("Redis at {redis}: {e}"))?;
    let store = Arc::new(RedisStorage::new(connection));
    let shaper = ShapeLayer::builder(store, account)
        .quota("per-second", Quota::per_second(args.rate).allow_burst(1))
        .map_err(|e| e.to_string())?
        .max_wait(Duration::from_secs(60))
        .build()
        .map_err(|e| e.to_string())?;
    // The client: one connection per call, a line out, a line back.
    let upstream = upstream.to_owned();
    let client = service_fn(move |call: u32| {
        let upstream = upstream.clone();
        async move {
            let stream = TcpStream::connect(&upstream).await?;
            let (read, mut write) = stream.into_split();
            write.write_all(format!("call {call}\n").as_bytes()).await?;
            let mut answer = String::new();
            BufReader::new(read).read_line(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        }
    });
    let client = tower::ServiceBuilder::new().layer(shaper).service(client);
    let calls: Vec<_> = (0..args.calls)
        .map(|call| {
            let mut client = client.clone();
            tokio::spawn(async move { client.ready().await?.call(call).await })
        })
        .collect();
    let mut refused = 0;
    for call in calls {
        match call.await.map_err(|e| e.to_string())? {
            Ok(_) => {}
            Err(ShapeError::WaitTooLong { .. }) => refused += 1,
            Err(error) => return Err(error.to_string()),
        }
    }
    println!("refused {refused}");
    Ok(())
}
