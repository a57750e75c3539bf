//! `ShouldRateLimit` round trips per second, and latency at a fixed offered
//! load, of the service against the ceilings that bound it.
//!
//! 1. **Memory**: our service (memory store) against the same tonic server
//!    answering a constant response (same protos, same response size), at
//!    the same concurrency, alternating `--rounds` times in one run: the
//!    ratio says how much of the gRPC stack's ceiling the limiter keeps.
//! 2. **Redis** (with `--url`): our service on that Redis (with its
//!    fallback, as `--redis` runs it) against `redis-benchmark` running the
//!    same script (EVALSHA of `gcra.lua`, same arguments shape) with the same
//!    number of clients.
//! 3. **Latency**: p50/p99 of each server at `--rate` requests per second
//!    (open loop: each request is timed from when it was due, so a stall
//!    counts for every request it delays).
//!
//! With `--limitador BIN` it measures instead our service against
//! Kuadrant's `limitador-server` (that binary), with the same client: see
//! `limitador/mod.rs`.
//!
//! ```text
//! cargo bench -p rate-tier-service --profile dist --bench rls -- --seconds 3 --rounds 3 --out rls.json
//! cargo bench -p rate-tier-service --profile dist --bench rls -- --url redis://127.0.0.1:PORT/ --port PORT \
//!     --sha "$(redis-cli -p PORT SCRIPT LOAD "$(cat crates/rate-tier-storage/src/redis/gcra.lua)")" \
//!     --redis-benchmark redis-benchmark --out rls.json
//! cargo bench -p rate-tier-service --profile dist --bench rls -- --limitador ../limitador/target/release/limitador-server \
//!     --url redis://127.0.0.1:PORT/ --seconds 3 --rounds 6 --out limitador.json
//! ```
//!
//! Flags: `--concurrency` (64 requests in flight), `--connections` (4 HTTP/2
//! connections), `--server-threads` and `--client-threads` (1 each: the
//! client and the server in one process, each on a runtime of its own; the
//! servers' is the one the binary runs on that many threads, on one a
//! current-thread runtime; `--server-runtime multi`: a multi-thread runtime
//! of that many workers instead),
//! `--users` (1000 distinct descriptors), `--rate` (5000/s), `--seconds`
//! (3), `--rounds` (3). The quota (1 000 000 per second) never refuses: every
//! call runs the whole decision.
#![allow(clippy::unwrap_used, missing_docs, unreachable_pub)]

mod limitador;
mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse,
};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use rate_tier_bench_results::{Latency, RlsResults};
use rate_tier_service::{Service, ServiceOptions, StoreChoice};
use support::{Args, median, percentile, write_results};
use tokio::runtime::Runtime;
use tonic::transport::Channel;

const DOMAIN: &str = "bench";
const CONFIG: &str = "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {name: per_user, unit: second, requests_per_unit: 1000000}\n";

/// The peer: the same service answering a constant response.
#[derive(Clone)]
struct Constant(RateLimitResponse);

#[tonic::async_trait]
impl RateLimitService for Constant {
    async fn should_rate_limit(
        &self,
        _request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(self.0.clone()))
    }
}

fn constant_response() -> RateLimitResponse {
    RateLimitResponse {
        overall_code: 1,
        statuses: vec![DescriptorStatus {
            code: 1,
            current_limit: Some(RateLimit {
                name: "per_user".into(),
                requests_per_unit: 1_000_000,
                unit: 1,
            }),
            limit_remaining: 999_999,
            duration_until_reset: Some(ProtoDuration {
                seconds: 1,
                nanos: 0,
            }),
            quota: None,
        }],
        ..RateLimitResponse::default()
    }
}

/// The name of our server's runtime threads: the comparison with
/// limitador reads their CPU time by it.
const SERVER_THREAD: &str = "rls-server";

/// Our server's runtime: the one the binary runs on `threads` threads
/// (`rate_tier_service::runtime`: on one thread a current-thread runtime,
/// driven here by a thread of its own), or with `multi` a multi-thread
/// runtime of that many workers, for comparison; its threads named
/// [`SERVER_THREAD`].
fn server_runtime(threads: usize, multi: bool) -> Arc<Runtime> {
    if multi {
        return Arc::new(runtime(threads, SERVER_THREAD));
    }
    let threads = std::num::NonZeroUsize::new(threads)
        .expect("--server-threads is at least 1");
    let runtime = Arc::new(
        rate_tier_service::runtime::builder(threads)
            .thread_name(SERVER_THREAD)
            .build()
            .unwrap(),
    );
    if threads.get() == 1 {
        let driven = runtime.clone();
        std::thread::Builder::new()
            .name(SERVER_THREAD.to_owned())
            .spawn(move || driven.block_on(std::future::pending::<()>()))
            .unwrap();
    }
    runtime
}

fn runtime(threads: usize, name: &str) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(name)
        .enable_all()
        .build()
        .unwrap()
}

fn requests(users: usize) -> Arc<Vec<RateLimitRequest>> {
    Arc::new(
        (0..users)
            .map(|i| RateLimitRequest {
                domain: DOMAIN.into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "user".into(),
                        value: format!("user-{i}"),
                    }],
                    ..RateLimitDescriptor::default()
                }],
                hits_addend: 0,
            })
            .collect(),
    )
}

async fn channels(
    addr: SocketAddr,
    n: usize,
) -> Vec<RateLimitServiceClient<Channel>> {
    let mut clients = Vec::new();
    for _ in 0..n {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .tcp_nodelay(true)
            .connect()
            .await
            .unwrap();
        clients.push(RateLimitServiceClient::new(channel));
    }
    clients
}

/// Closed loop: `concurrency` tasks calling for `duration`: calls/s.
async fn throughput(
    clients: &[RateLimitServiceClient<Channel>],
    requests: &Arc<Vec<RateLimitRequest>>,
    concurrency: usize,
    duration: Duration,
) -> f64 {
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let mut client = clients[task % clients.len()].clone();
            let requests = requests.clone();
            tokio::spawn(async move {
                let (mut ok, mut i) = (0_u64, task * 7919);
                while Instant::now() < deadline {
                    i = (i + 1) % requests.len();
                    let response = client
                        .should_rate_limit(requests[i].clone())
                        .await
                        .expect("a decision");
                    assert_eq!(response.into_inner().overall_code, 1);
                    ok += 1;
                }
                ok
            })
        })
        .collect();
    let mut calls = 0;
    for task in tasks {
        calls += task.await.unwrap();
    }
    calls as f64 / start.elapsed().as_secs_f64()
}

/// Open loop at `rate`/s for `duration`: latencies in µs, each from when
/// the request was due.
async fn latencies(
    clients: &[RateLimitServiceClient<Channel>],
    requests: &Arc<Vec<RateLimitRequest>>,
    rate: f64,
    duration: Duration,
) -> Vec<f64> {
    let count = (rate * duration.as_secs_f64()) as usize;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for n in 0..count {
        let due = start + interval * n as u32;
        tokio::time::sleep_until(due).await;
        let mut client = clients[n % clients.len()].clone();
        let request = requests[n % requests.len()].clone();
        tasks.push(tokio::spawn(async move {
            client.should_rate_limit(request).await.expect("a decision");
            due.elapsed().as_secs_f64() * 1e6
        }));
    }
    let mut out = Vec::with_capacity(count);
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

/// Our service, started in this process on the runtime that awaits
/// [`start_ours`]; stopped when dropped.
struct Ours {
    addr: SocketAddr,
    _running: rate_tier_service::Running,
    _dir: std::path::PathBuf,
}

/// Our service on `store`, with [`CONFIG`], on a free loopback port.
async fn start_ours(store: StoreChoice) -> Ours {
    let dir =
        std::env::temp_dir().join(format!("rls-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.yaml"), CONFIG).unwrap();
    let mut options = ServiceOptions::new(&dir);
    options.grpc_addr = "127.0.0.1:0".parse().unwrap();
    options.http_addr = "127.0.0.1:0".parse().unwrap();
    options.store = store;
    options.watch = false;
    let running = Service::start(options).await.unwrap();
    Ours {
        addr: running.grpc_addr(),
        _running: running,
        _dir: dir,
    }
}

struct Servers {
    ours: SocketAddr,
    constant: SocketAddr,
    _ours: Ours,
}

async fn start_servers(store: StoreChoice) -> Servers {
    let ours = start_ours(store).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let constant = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener)
        .with_nodelay(Some(true));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(Constant(
                constant_response(),
            )))
            .serve_with_incoming(incoming),
    );
    Servers {
        ours: ours.addr,
        constant,
        _ours: ours,
    }
}

/// `redis-benchmark` running EVALSHA of gcra.lua with `clients`
/// connections over `users` keys: calls/s.
fn redis_benchmark(
    bin: &str,
    port: &str,
    sha: &str,
    clients: usize,
    users: usize,
    requests: u64,
) -> f64 {
    let output = Command::new(bin)
        .args([
            "-p",
            port,
            "-c",
            &clients.to_string(),
            "-n",
            &requests.to_string(),
        ])
        .args(["-r", &users.to_string(), "--csv", "EVALSHA", sha, "1"])
        .args(["trt:bench:__rand_int__", "1", "1000000", "1"])
        .output()
        .expect("redis-benchmark runs");
    let text = String::from_utf8_lossy(&output.stdout);
    // "EVALSHA ...","123456.78",...
    text.lines()
        .filter_map(|line| line.split("\",\"").nth(1))
        .filter_map(|n| n.trim_matches('"').parse::<f64>().ok())
        .next_back()
        .unwrap_or_else(|| panic!("no result from redis-benchmark: {text}"))
}

/// The load offered to every server a part measures, from the command
/// line, and the runtimes of the client and of our service.
struct Load {
    concurrency: usize,
    connections: usize,
    users: usize,
    seconds: Duration,
    rounds: usize,
    requests: Arc<Vec<RateLimitRequest>>,
    server_rt: Arc<Runtime>,
    client_rt: Runtime,
}

impl Load {
    fn from_args(args: &Args) -> Self {
        let users = args.num("users", 1000);
        Load {
            concurrency: args.num("concurrency", 64),
            connections: args.num("connections", 4),
            users,
            seconds: args.secs("seconds", 3.0),
            rounds: args.num("rounds", 3),
            requests: requests(users),
            server_rt: server_runtime(
                args.num("server-threads", 1),
                args.get("server-runtime") == Some("multi"),
            ),
            client_rt: runtime(args.num("client-threads", 1), "rls-client"),
        }
    }
}

fn main() {
    let args = Args::parse();
    let load = Load::from_args(&args);
    if let Some(bin) = args.get("limitador") {
        let results = limitador::run(&load, bin, args.get("url"));
        write_results(&results, &args);
        return;
    }
    let Load {
        concurrency,
        connections,
        users,
        seconds,
        rounds,
        requests,
        server_rt,
        client_rt,
    } = load;
    let rate: f64 = args.num("rate", 5000.0);
    let mut results = RlsResults {
        concurrency: Some(concurrency as u64),
        connections: Some(connections as u64),
        rounds: Some(rounds as u64),
        seconds: Some(seconds.as_secs_f64()),
        offered_rate: Some(rate),
        ..RlsResults::default()
    };

    // 1. Memory against the constant server.
    let servers = server_rt.block_on(start_servers(StoreChoice::Memory));
    let (ours, constant) = client_rt.block_on(async {
        let ours = channels(servers.ours, connections).await;
        let constant = channels(servers.constant, connections).await;
        // Warm up both.
        throughput(&ours, &requests, concurrency, Duration::from_millis(300))
            .await;
        throughput(
            &constant,
            &requests,
            concurrency,
            Duration::from_millis(300),
        )
        .await;
        (ours, constant)
    });
    let (mut memory_rps, mut constant_rps) = (Vec::new(), Vec::new());
    // The server runtime's CPU per call of a run at `rps` calls/s.
    let server_cpu = || {
        rate_tier_test_support::bench::threads_cpu(
            std::process::id(),
            Some(SERVER_THREAD),
        )
    };
    let per_call = |before: Option<Duration>, rps: f64| {
        let used = server_cpu()?.checked_sub(before?)?;
        Some(used.as_secs_f64() * 1e6 / (rps * seconds.as_secs_f64()))
    };
    for round in 0..rounds {
        let before = server_cpu();
        let m = client_rt.block_on(throughput(
            &ours,
            &requests,
            concurrency,
            seconds,
        ));
        let m_cpu = per_call(before, m);
        let before = server_cpu();
        let c = client_rt.block_on(throughput(
            &constant,
            &requests,
            concurrency,
            seconds,
        ));
        let c_cpu = per_call(before, c);
        println!(
            "round {round}: memory {m:.0}/s, constant {c:.0}/s, ratio {:.3}; server CPU per call: memory {m_cpu:.2?} µs, constant {c_cpu:.2?} µs",
            m / c
        );
        memory_rps.push(m);
        constant_rps.push(c);
    }
    let (m, c) = (median(&mut memory_rps), median(&mut constant_rps));
    println!(
        "memory: {m:.0}/s; constant tonic server: {c:.0}/s; ratio {:.3}",
        m / c
    );
    results.memory_rps = Some(m);
    results.constant_rps = Some(c);
    results.memory_ratio = Some(m / c);

    for (name, clients, latency) in [
        ("memory", &ours, &mut results.memory_latency),
        ("constant", &constant, &mut results.constant_latency),
    ] {
        let mut lat =
            client_rt.block_on(latencies(clients, &requests, rate, seconds));
        let (p50, p99) =
            (percentile(&mut lat, 0.50), percentile(&mut lat, 0.99));
        println!("{name} at {rate:.0}/s: p50 {p50:.0} µs, p99 {p99:.0} µs");
        *latency = Latency {
            p50_us: Some(p50),
            p99_us: Some(p99),
        };
    }
    drop((ours, constant));
    drop(servers);

    // 2. Redis against redis-benchmark.
    if let Some(url) = args.get("url") {
        let port = args.get("port").expect("--port with --url");
        let sha = args.get("sha").expect("--sha with --url");
        let bench = args.get("redis-benchmark").unwrap_or("redis-benchmark");
        let servers = server_rt
            .block_on(start_servers(StoreChoice::Redis(url.to_owned())));
        let ours = client_rt.block_on(async {
            let ours = channels(servers.ours, connections).await;
            throughput(
                &ours,
                &requests,
                concurrency,
                Duration::from_millis(300),
            )
            .await;
            ours
        });
        let (mut redis_rps, mut peer_rps) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let r = client_rt.block_on(throughput(
                &ours,
                &requests,
                concurrency,
                seconds,
            ));
            let calls = (r * seconds.as_secs_f64()) as u64;
            let p = redis_benchmark(
                bench,
                port,
                sha,
                concurrency,
                users,
                calls.max(10_000),
            );
            println!(
                "round {round}: service on redis {r:.0}/s, redis-benchmark {p:.0}/s, ratio {:.3}",
                r / p
            );
            redis_rps.push(r);
            peer_rps.push(p);
        }
        let (r, p) = (median(&mut redis_rps), median(&mut peer_rps));
        println!(
            "redis: {r:.0}/s; redis-benchmark: {p:.0}/s; ratio {:.3}",
            r / p
        );
        let mut lat =
            client_rt.block_on(latencies(&ours, &requests, rate, seconds));
        let (p50, p99) =
            (percentile(&mut lat, 0.50), percentile(&mut lat, 0.99));
        println!("redis at {rate:.0}/s: p50 {p50:.0} µs, p99 {p99:.0} µs");
        results.redis_rps = Some(r);
        results.redis_benchmark_rps = Some(p);
        results.redis_ratio = Some(r / p);
        // The same run's ceiling of the gRPC stack (part 1): how much of
        // it the service keeps when every decision goes to Redis.
        results.redis_vs_constant_ratio = Some(r / c);
        results.redis_latency = Latency {
            p50_us: Some(p50),
            p99_us: Some(p99),
        };
        drop(ours);
        drop(servers);
    }
    write_results(&results, &args);
}
