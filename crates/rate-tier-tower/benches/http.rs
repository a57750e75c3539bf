//! Requests/s of a hello-world axum route over loopback HTTP/1.1: with no
//! layer, with `TierLimitLayer` (memory store), and with tower_governor's
//! layer, configured alike. `cargo xtask bench` runs this.
//!
//! The three servers run in this process on one Tokio runtime with
//! `--server-threads` workers (default 1: on a 2-core machine the server gets
//! one core and the load generator the other, so the server is the
//! bottleneck and the layer's cost shows). The load generator is `wrk`
//! (`--wrk PATH`, one thread) when given, else a small Rust client here (a
//! runtime of its own, one thread, `--connections` keep-alive connections).
//! Every request carries `x-api-key: user-NNNN`, rotating over `--keys` ids.
//! Each configuration runs `--seconds` per round, in the order A B C A B C,
//! so that noise on a shared machine hits all three alike.
//!
//! Besides requests/s it reports the server threads' CPU time per request
//! (from /proc/self/task/*/schedstat), which noise from other processes
//! disturbs less.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rate_tier_bench_results::HttpResults;
use support::{Args, mean, median, thread_cpu, thread_id, write_results};

use support::apps::{
    API_KEY, no_layer, with_tower_governor, with_tower_rate_tier,
};

/// What one load run measured.
#[derive(Debug, Default, Clone, Copy)]
struct Run {
    requests_per_sec: f64,
    /// Responses that were not 200 (none expected) and socket errors.
    errors: u64,
    /// Server CPU time per request, µs.
    cpu_us_per_request: f64,
}

/// The load generator.
enum Client {
    Wrk {
        bin: String,
        script: std::path::PathBuf,
    },
    Rust {
        runtime: tokio::runtime::Runtime,
    },
}

impl Client {
    fn name(&self) -> &'static str {
        match self {
            Client::Wrk { .. } => "wrk",
            Client::Rust { .. } => "rust",
        }
    }

    /// Loads `addr` for `duration`: (requests/s, requests, errors).
    fn load(
        &self,
        addr: SocketAddr,
        duration: Duration,
        connections: usize,
        keys: usize,
    ) -> (f64, u64, u64) {
        match self {
            Client::Wrk { bin, script } => {
                wrk(bin, script, addr, duration, connections)
            }
            Client::Rust { runtime } => {
                runtime.block_on(rust_client(addr, duration, connections, keys))
            }
        }
    }
}

/// The requests wrk sends: one per key, rotating (formatted once).
fn wrk_script(keys: usize) -> String {
    format!(
        "local reqs = {{}}\n\
         local n = 0\n\
         init = function(args)\n\
           for i = 1, {keys} do\n\
             reqs[i] = wrk.format(\"GET\", \"/\", {{[\"{API_KEY}\"] = string.format(\"user-%04d\", i)}})\n\
           end\n\
         end\n\
         request = function()\n\
           n = n % {keys} + 1\n\
           return reqs[n]\n\
         end\n"
    )
}

fn wrk(
    bin: &str,
    script: &Path,
    addr: SocketAddr,
    duration: Duration,
    connections: usize,
) -> (f64, u64, u64) {
    let output = Command::new(bin)
        .args(["-t1", "-c", &connections.to_string()])
        .arg("-d")
        .arg(format!("{}s", duration.as_secs().max(1)))
        .arg("-s")
        .arg(script)
        .arg(format!("http://{addr}/"))
        .output()
        .unwrap_or_else(|e| panic!("could not run {bin}: {e}"));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "wrk failed:\n{text}");
    let field = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .map(|rest| rest.trim().to_owned())
    };
    let rps: f64 = field("Requests/sec:")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no Requests/sec in wrk's output:\n{text}"));
    let requests: u64 = text
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let non_2xx: u64 = field("Non-2xx or 3xx responses:")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // "Socket errors: connect 0, read 0, write 0, timeout 0"
    let socket_errors: u64 = field("Socket errors:")
        .map(|v| {
            v.split(',')
                .filter_map(|part| {
                    part.split_whitespace().nth(1)?.parse::<u64>().ok()
                })
                .sum()
        })
        .unwrap_or(0);
    (rps, requests, non_2xx + socket_errors)
}

/// `connections` keep-alive connections sending one request at a time.
async fn rust_client(
    addr: SocketAddr,
    duration: Duration,
    connections: usize,
    keys: usize,
) -> (f64, u64, u64) {
    let requests: Arc<Vec<Vec<u8>>> = Arc::new(
        (1..=keys)
            .map(|i| {
                format!(
                    "GET / HTTP/1.1\r\nHost: {addr}\r\n{API_KEY}: user-{i:04}\r\n\r\n"
                )
                .into_bytes()
            })
            .collect(),
    );
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = (0..connections)
        .map(|c| {
            let requests = requests.clone();
            tokio::spawn(async move {
                connection(addr, deadline, &requests, c * 31).await
            })
        })
        .collect();
    let (mut ok, mut errors) = (0, 0);
    for task in tasks {
        let (o, e) = task.await.unwrap();
        ok += o;
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    (ok as f64 / elapsed, ok, errors)
}

/// One connection's loop: (200 responses, other outcomes).
async fn connection(
    addr: SocketAddr,
    deadline: Instant,
    requests: &[Vec<u8>],
    mut next: usize,
) -> (u64, u64) {
    let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
        return (0, 1);
    };
    stream.set_nodelay(true).unwrap();
    let mut buf = vec![0u8; 8192];
    let (mut ok, mut errors) = (0, 0);
    while Instant::now() < deadline {
        next = (next + 1) % requests.len();
        if write_all(&stream, &requests[next]).await.is_err() {
            return (ok, errors + 1);
        }
        match read_response(&stream, &mut buf).await {
            Some(200) => ok += 1,
            Some(_) => errors += 1,
            None => return (ok, errors + 1),
        }
    }
    (ok, errors)
}

async fn write_all(
    stream: &tokio::net::TcpStream,
    mut bytes: &[u8],
) -> std::io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads one response with a Content-Length body; returns its status.
async fn read_response(
    stream: &tokio::net::TcpStream,
    buf: &mut [u8],
) -> Option<u16> {
    let mut filled = 0;
    let mut expected: Option<(usize, u16)> = None;
    loop {
        if let Some((total, status)) = expected
            && filled >= total
        {
            return Some(status);
        }
        if filled == buf.len() {
            return None;
        }
        stream.readable().await.ok()?;
        match stream.try_read(&mut buf[filled..]) {
            Ok(0) => return None,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return None,
        }
        if expected.is_none()
            && let Some(end) =
                buf[..filled].windows(4).position(|w| w == b"\r\n\r\n")
        {
            let head = std::str::from_utf8(&buf[..end]).ok()?;
            let status = head.get(9..12)?.parse().ok()?;
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .unwrap_or(0);
            expected = Some((end + 4 + length, status));
        }
    }
}

/// One request with std's blocking socket: the response's head.
fn one_request(addr: SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET / HTTP/1.1\r\nHost: {addr}\r\n{API_KEY}: user-0001\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn main() {
    let args = Args::parse();
    let seconds = args.secs("seconds", 3.0);
    let warmup = args.secs("warmup", 1.0);
    let rounds: usize = args.num("rounds", 3);
    let connections: usize = args.num("connections", 32);
    let keys: usize = args.num("keys", 1000);
    let server_threads: usize = args.num("server-threads", 1);

    // The servers' threads, to read their CPU time.
    let tids = Arc::new(Mutex::new(Vec::new()));
    let t = tids.clone();
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(server_threads)
        .thread_name("http-bench-server")
        .on_thread_start(move || t.lock().unwrap().extend(thread_id()))
        .enable_all()
        .build()
        .unwrap();
    let configs = [
        ("no_layer", no_layer()),
        ("tower_rate_tier", with_tower_rate_tier()),
        ("tower_governor", with_tower_governor()),
    ];
    let addrs: Vec<(&str, SocketAddr)> = configs
        .into_iter()
        .map(|(name, app)| {
            let listener = server_rt
                .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
                .unwrap();
            let addr = listener.local_addr().unwrap();
            server_rt.spawn(async move {
                axum::serve(listener, app).await.unwrap()
            });
            (name, addr)
        })
        .collect();
    let server_cpu = || -> Duration {
        tids.lock().unwrap().iter().map(|&t| thread_cpu(t)).sum()
    };

    let client = match args.get("wrk") {
        Some(bin) => {
            let script = std::env::temp_dir()
                .join(format!("trt-http-bench-{}.lua", std::process::id()));
            std::fs::write(&script, wrk_script(keys)).unwrap();
            Client::Wrk {
                bin: bin.to_owned(),
                script,
            }
        }
        None => Client::Rust {
            runtime: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("http-bench-client")
                .enable_all()
                .build()
                .unwrap(),
        },
    };
    println!(
        "http: client {}, {connections} connections, {keys} keys, server {server_threads} \
         worker thread(s), {rounds} rounds of {:.0} s per configuration (A B C A B C)",
        client.name(),
        seconds.as_secs_f64()
    );

    for &(name, addr) in &addrs {
        let head = one_request(addr);
        let limited =
            head.to_ascii_lowercase().contains("x-ratelimit-remaining:");
        assert!(head.starts_with("HTTP/1.1 200"), "{name}: {head}");
        assert_eq!(limited, name != "no_layer", "{name} answers:\n{head}");
        let (rps, _, errors) = client.load(addr, warmup, connections, keys);
        println!("  warm-up {name:<16} {rps:>10.0} req/s  ({errors} errors)");
    }
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); addrs.len()];
    for round in 1..=rounds {
        for (i, &(name, addr)) in addrs.iter().enumerate() {
            let cpu_before = server_cpu();
            let (rps, requests, errors) =
                client.load(addr, seconds, connections, keys);
            let cpu = server_cpu().saturating_sub(cpu_before);
            let run = Run {
                requests_per_sec: rps,
                errors,
                cpu_us_per_request: cpu.as_secs_f64() * 1e6
                    / requests.max(1) as f64,
            };
            println!(
                "  round {round} {name:<16} {rps:>10.0} req/s  {:>6.2} µs server CPU/request  ({errors} errors)",
                run.cpu_us_per_request
            );
            runs[i].push(run);
        }
    }
    if let Client::Wrk { script, .. } = &client {
        let _ = std::fs::remove_file(script);
    }

    let mut results = HttpResults {
        client: Some(client.name().to_owned()),
        seconds: Some(seconds.as_secs_f64()),
        rounds: Some(rounds as u64),
        connections: Some(connections as u64),
        keys: Some(keys as u64),
        server_threads: Some(server_threads as u64),
        ..HttpResults::default()
    };
    // `configs`' order: no layer, ours, tower_governor.
    let servers = [
        &mut results.no_layer,
        &mut results.tower_rate_tier,
        &mut results.tower_governor,
    ];
    for ((i, &(name, _)), server) in addrs.iter().enumerate().zip(servers) {
        let rps: Vec<f64> =
            runs[i].iter().map(|r| r.requests_per_sec).collect();
        let cpu: Vec<f64> =
            runs[i].iter().map(|r| r.cpu_us_per_request).collect();
        let errors: u64 = runs[i].iter().map(|r| r.errors).sum();
        println!(
            "  mean  {name:<16} {:>10.0} req/s  {:>6.2} µs server CPU/request  ({errors} errors)",
            mean(&rps),
            mean(&cpu)
        );
        server.rps = Some(mean(&rps));
        server.cpu_us = Some(mean(&cpu));
        server.errors = Some(errors);
    }
    // Each round ran the three back to back: their ratios within a round
    // are what noise disturbs least. The median over rounds.
    let paired = |a: usize, b: usize, f: fn(&Run) -> f64| {
        median(
            runs[a]
                .iter()
                .zip(&runs[b])
                .map(|(x, y)| f(x) / f(y))
                .collect(),
        )
    };
    let rps = |r: &Run| r.requests_per_sec;
    let cpu = |r: &Run| r.cpu_us_per_request;
    let (layer_vs_none, layer_vs_governor) =
        (paired(1, 0, rps), paired(1, 2, rps));
    let (cpu_vs_none, cpu_vs_governor) = (paired(1, 0, cpu), paired(1, 2, cpu));
    println!(
        "  median of the rounds' ratios: req/s layer/no-layer {layer_vs_none:.3}, \
         layer/tower_governor {layer_vs_governor:.3}; server CPU per request \
         layer/no-layer {cpu_vs_none:.3}, layer/tower_governor {cpu_vs_governor:.3}"
    );
    results.ratio_layer_vs_no_layer = Some(layer_vs_none);
    results.ratio_layer_vs_tower_governor = Some(layer_vs_governor);
    results.cpu_ratio_layer_vs_no_layer = Some(cpu_vs_none);
    results.cpu_ratio_layer_vs_tower_governor = Some(cpu_vs_governor);
    write_results(&results, &args);
}
