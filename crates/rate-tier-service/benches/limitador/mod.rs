//! Our service against Kuadrant's `limitador-server`, its Rust peer (an
//! Envoy RLS v3 server too), driven by the same client as the rest of this
//! bench: [`throughput`](crate::throughput) over the same requests (one
//! `user` descriptor each, `--users` values), `--concurrency` in flight
//! over `--connections` HTTP/2 connections to each server. The servers
//! take turns, round after round, so that the machine's noise (it is
//! shared) falls on every side alike. Each round's line also gives each
//! server's CPU time per call (Linux's schedstat of our server's runtime
//! threads, of limitador's whole process): times calls/s, how much of a
//! core the server took.
//!
//! - **Memory**: our service on the memory store, then limitador's
//!   `memory` mode; `--rounds` rounds.
//! - **Redis** (with `--url`): our service on that Redis (with its
//!   fallback, as `--redis` runs it), then limitador's `redis` mode, then
//!   its `redis_cached` mode (counters cached in its memory and written
//!   to Redis in batches every second: approximate across instances,
//!   where ours stays exact, one script call per decision), all on the
//!   same Redis; each round measures the three in turn, and both
//!   comparisons divide by our figure of the same round.
//!
//! The limit is one per `user` value on both sides, large enough that
//! nothing is refused during the measure (a refusal fails the run): ours
//! is [`CONFIG`](crate::CONFIG), 1,000,000 per second; limitador's is
//! [`LIMITS`], 1,000,000 per one-second window of `descriptors[0].user`.
//! So every call runs the whole decision on both sides and neither takes
//! a cheaper refusal path (the two refuse at different costs: the same
//! refusal ratio would still not be the same work). Before measuring,
//! each server is sent a probe of [`PROBE_HITS`] hits on a user of its
//! own, twice, and must answer the second `OVER_LIMIT`: the limit does
//! apply to these descriptors (a limitador whose limit matched nothing
//! would answer `OK` at no cost). Twice, because `redis_cached` lets the
//! first hits of a counter it does not hold yet pass unchecked, and
//! refuses from the next request on.
//!
//! Threads: our service runs in this process on a runtime of
//! `--server-threads` workers (1), the client on a runtime of its own;
//! limitador's RLS server runs on the one thread of actix's system
//! runtime (its `main` is `#[actix_rt::main]`, a current-thread Tokio
//! runtime; its HTTP API's workers stay idle). Each limitador runs with
//! its defaults otherwise (`RUST_LOG=error`, no rate-limit headers, the
//! `redis_cached` mode's batch of 100 and flush period of 1 s), its
//! output in a log file beside the limits file, quoted if it fails.

use std::fs::{self, File};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use rate_tier_bench_results::{LimitadorResults, VersusRound};
use rate_tier_service::StoreChoice;
use rate_tier_test_support::bench::threads_cpu;
use rate_tier_test_support::free_port;
use tonic::transport::Channel;

use crate::{Load, SERVER_THREAD, channels, requests, start_ours, throughput};

/// limitador's limit: the equivalent of [`CONFIG`](crate::CONFIG) (the
/// domain is limitador's namespace; the variable makes one counter per
/// `user` value, as ours keeps one bucket per value).
const LIMITS: &str = "- namespace: bench
  name: per_user
  max_value: 1000000
  seconds: 1
  conditions: []
  variables:
    - descriptors[0].user
";

/// Hits of the probe: twice the limit, refused by any server whose limit
/// applies to the request.
const PROBE_HITS: u32 = 2_000_000;

/// How long each server is driven before the first round.
const WARM_UP: Duration = Duration::from_secs(1);

/// How long a limitador may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Our service against `limitador-server` at `bin`, in memory, then on the
/// Redis at `url` when given.
pub(crate) fn run(
    load: &Load,
    bin: &str,
    url: Option<&str>,
) -> LimitadorResults {
    let dir = std::env::temp_dir()
        .join(format!("rls-bench-limitador-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("limits.yaml"), LIMITS).unwrap();
    let version = version(bin);
    println!("limitador: {version} ({bin})");
    let mut results = LimitadorResults {
        limitador_version: Some(version),
        concurrency: Some(load.concurrency as u64),
        connections: Some(load.connections as u64),
        users: Some(load.users as u64),
        seconds: Some(load.seconds.as_secs_f64()),
        ..LimitadorResults::default()
    };

    let ours = load.server_rt.block_on(start_ours(StoreChoice::Memory));
    let theirs = Limitador::start(bin, &dir, &["memory"]);
    let rounds = compare(
        load,
        &[
            ("ours, memory", ours.addr, Cpu::OurServer),
            ("limitador memory", theirs.addr, theirs.cpu()),
        ],
    );
    results.memory = versus(&rounds, 1);
    drop((ours, theirs));

    if let Some(url) = url {
        let ours = load
            .server_rt
            .block_on(start_ours(StoreChoice::Redis(url.to_owned())));
        let redis = Limitador::start(bin, &dir, &["redis", url]);
        let cached = Limitador::start(bin, &dir, &["redis_cached", url]);
        let rounds = compare(
            load,
            &[
                ("ours, redis", ours.addr, Cpu::OurServer),
                ("limitador redis", redis.addr, redis.cpu()),
                ("limitador redis_cached", cached.addr, cached.cpu()),
            ],
        );
        results.redis = versus(&rounds, 1);
        results.redis_cached = versus(&rounds, 2);
    }
    results
}

/// Ours (the first server of each round) against the server at `index`.
fn versus(rounds: &[Vec<Measured>], index: usize) -> Vec<VersusRound> {
    rounds
        .iter()
        .map(|round| VersusRound {
            ours: round[0].rps,
            theirs: round[index].rps,
        })
        .collect()
}

/// One server in one round.
#[derive(Debug, Clone, Copy)]
struct Measured {
    /// Calls per second.
    rps: f64,
    /// The server's CPU time per call, µs (`None`: not readable here).
    cpu_us: Option<f64>,
}

/// Whose CPU time a round reads: our server's runtime threads (in this
/// process, beside the client's), or a limitador-server's process.
#[derive(Debug, Clone, Copy)]
enum Cpu {
    OurServer,
    Process(u32),
}

impl Cpu {
    /// The CPU time its threads have run so far (Linux's schedstat);
    /// `None` where `/proc` cannot be read.
    fn used(self) -> Option<Duration> {
        match self {
            Cpu::OurServer => {
                threads_cpu(std::process::id(), Some(SERVER_THREAD))
            }
            Cpu::Process(pid) => threads_cpu(pid, None),
        }
    }
}

/// Connects to each server, checks that its limit applies and warms it
/// up, then runs the rounds, each driving every server in turn: the
/// calls/s and the server's CPU per call of each round, in the order of
/// `servers`.
fn compare(
    load: &Load,
    servers: &[(&str, SocketAddr, Cpu)],
) -> Vec<Vec<Measured>> {
    let clients = load.client_rt.block_on(async {
        let mut all = Vec::new();
        for &(name, addr, _) in servers {
            let clients = channels(addr, load.connections).await;
            probe(&clients[0], name).await;
            throughput(&clients, &load.requests, load.concurrency, WARM_UP)
                .await;
            all.push(clients);
        }
        all
    });
    (0..load.rounds)
        .map(|round| {
            let measured: Vec<Measured> = clients
                .iter()
                .zip(servers)
                .map(|(clients, &(_, _, cpu))| {
                    let before = cpu.used();
                    let rps = load.client_rt.block_on(throughput(
                        clients,
                        &load.requests,
                        load.concurrency,
                        load.seconds,
                    ));
                    let calls = rps * load.seconds.as_secs_f64();
                    let cpu_us = match (before, cpu.used()) {
                        (Some(before), Some(after)) if calls > 0.0 => Some(
                            after.saturating_sub(before).as_secs_f64() * 1e6
                                / calls,
                        ),
                        _ => None,
                    };
                    Measured { rps, cpu_us }
                })
                .collect();
            let mut line = format!("round {round}:");
            for (&(name, _, _), m) in servers.iter().zip(&measured) {
                line.push_str(&format!(" {name} {:.0}/s", m.rps));
                if let Some(cpu_us) = m.cpu_us {
                    line.push_str(&format!(" ({cpu_us:.2} µs CPU/call)"));
                }
                line.push(',');
            }
            for (&(name, _, _), m) in servers.iter().zip(&measured).skip(1) {
                line.push_str(&format!(
                    " ours / {name} {:.3}",
                    measured[0].rps / m.rps
                ));
            }
            println!("{line}");
            measured
        })
        .collect()
}

/// Fails the run unless `client`'s server refuses [`PROBE_HITS`] hits on a
/// user of the probe's own the second time they are asked.
async fn probe(client: &RateLimitServiceClient<Channel>, name: &str) {
    let mut request: RateLimitRequest = requests(1)[0].clone();
    request.descriptors[0].entries[0].value = "probe".into();
    request.hits_addend = PROBE_HITS;
    let mut code = 0;
    for _ in 0..2 {
        code = client
            .clone()
            .should_rate_limit(request.clone())
            .await
            .unwrap_or_else(|e| panic!("{name}: the probe failed: {e}"))
            .into_inner()
            .overall_code;
    }
    assert_eq!(
        code,
        Code::OverLimit as i32,
        "{name} answered code {code} to a second {PROBE_HITS} hits over a \
         limit of 1,000,000: its limit does not apply to the bench's \
         descriptors"
    );
}

/// `limitador-server --version`.
fn version(bin: &str) -> String {
    let output = Command::new(bin)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("could not run {bin}: {e}"));
    assert!(
        output.status.success(),
        "{bin} --version failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A `limitador-server` process on free loopback ports, killed when
/// dropped.
struct Limitador {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Limitador {
    /// `bin` with the limits file of `dir` and the storage arguments
    /// `storage` (`memory`, `redis URL`, `redis_cached URL`), once its RLS
    /// port accepts connections.
    fn start(bin: &str, dir: &Path, storage: &[&str]) -> Self {
        let (rls_port, http_port) = (free_port(), free_port());
        let log = dir.join(format!("limitador-{}.log", storage[0]));
        let out = File::create(&log).unwrap();
        let child = Command::new(bin)
            .args(["--rls-ip", "127.0.0.1", "--rls-port"])
            .arg(rls_port.to_string())
            .args(["--http-ip", "127.0.0.1", "--http-port"])
            .arg(http_port.to_string())
            .arg(dir.join("limits.yaml"))
            .args(storage)
            // Its settings come from the command line only.
            .env("RUST_LOG", "error")
            .env_remove("REDIS_URL")
            .env_remove("REDIS_LOCAL_CACHE_ENABLED")
            .env_remove("LIMITS_FILE")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("could not run {bin}: {e}"));
        let mut server = Limitador {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], rls_port)),
            log,
        };
        server.wait_until_listening(storage[0]);
        server
    }

    fn wait_until_listening(&mut self, mode: &str) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "limitador-server {mode} exited ({status}) before it \
                     listened; its output:\n{}",
                    self.output()
                );
            }
            if TcpStream::connect(self.addr).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "limitador-server {mode} did not listen on {} within {:?}; \
                 its output:\n{}",
                self.addr,
                START_TIMEOUT,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its process's CPU time.
    fn cpu(&self) -> Cpu {
        Cpu::Process(self.child.id())
    }

    fn output(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Limitador {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
