//! Throwaway Redis servers for the tests and benchmarks: a single server or a 3-master
//! cluster, each node on a free loopback port with its own temporary
//! directory, stopped (and its directory removed) when its guard is dropped,
//! on success and on failure alike.
//!
//! The shared Redis on port 6379 is never started, stopped, flushed or even
//! contacted from here.

use std::env;
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{self, Child, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::Result;
use crate::cmd::{Cmd, find_on_path, is_executable};

/// Port of the machine's shared Redis: never ours to use.
const SHARED_REDIS_PORT: u16 = 6379;
/// How long a new server has to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new cluster has to reach `cluster_state:ok` on every node.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// Offset of a cluster node's bus port (Redis's default).
const CLUSTER_BUS_OFFSET: u16 = 10_000;

/// Environment variable naming the redis-server binary: read to choose one,
/// and set for the tests (some start and kill servers of their own).
pub(crate) const SERVER_BIN_VAR: &str = "TRT_REDIS_SERVER_BIN";

/// The `redis-server` binary: `$TRT_REDIS_SERVER_BIN` if set, else from `PATH`.
pub(crate) fn find_server() -> Result<PathBuf> {
    if let Some(bin) = env::var_os(SERVER_BIN_VAR).filter(|v| !v.is_empty()) {
        let bin = PathBuf::from(bin);
        return if is_executable(&bin) {
            Ok(bin)
        } else {
            Err(format!(
                "{SERVER_BIN_VAR}={} is not an executable file",
                bin.display()
            ))
        };
    }
    find_on_path("redis-server").ok_or_else(|| {
        "`redis-server` is not on PATH: the Redis tests start throwaway servers of their own.\n\
         Install it with `apt-get install redis-server` (Debian/Ubuntu; \
         `brew install redis` on macOS), or set TRT_REDIS_SERVER_BIN to its path."
            .to_owned()
    })
}

/// The `redis-cli` binary (to create a cluster): beside the server, else from `PATH`.
pub(crate) fn find_cli(server: &Path) -> Result<PathBuf> {
    server
        .parent()
        .map(|dir| dir.join("redis-cli"))
        .filter(|cli| is_executable(cli))
        .or_else(|| find_on_path("redis-cli"))
        .ok_or_else(|| {
            "`redis-cli` is not on PATH: it creates the test cluster.\n\
             Install it with `apt-get install redis-tools` (Debian/Ubuntu)."
                .to_owned()
        })
}

/// A running `redis-server`, killed when dropped.
pub(crate) struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers.
    pub(crate) fn start(bin: &Path) -> Result<Self> {
        let port = free_ports(1, false)?[0];
        Self::start_on(bin, port, &[])
    }

    fn start_on(bin: &Path, port: u16, extra_args: &[&str]) -> Result<Self> {
        check_not_shared(port)?;
        let dir = env::temp_dir()
            .join(format!("xtask-redis-{}-{port}", process::id()));
        // A leftover from an earlier run with the same pid and port is stale.
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)
            .map_err(|e| format!("could not create {}: {e}", dir.display()))?;
        let log = |name: &str| {
            File::create(dir.join(name)).map_err(|e| {
                format!("could not create a log file in {}: {e}", dir.display())
            })
        };
        let (stdout, stderr) = (log("stdout.log")?, log("stderr.log")?);

        let cmd = Cmd::new(bin)
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--dir"])
            .arg(&dir)
            .args(extra_args);
        println!("$ {} &", cmd.display());
        let child = cmd
            .command()
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(format!("could not start {}: {e}", bin.display()));
            }
        };
        // From here on the guard stops the server, whatever happens.
        let mut server = Self { child, port, dir };
        server.wait_until_ready()?;
        Ok(server)
    }

    fn wait_until_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "redis-server on port {} exited while starting ({status}){}",
                    self.port,
                    self.logs()
                ));
            }
            match command(self.port, &["PING"]) {
                Ok(reply) if reply == "PONG" => return Ok(()),
                _ if Instant::now() >= deadline => {
                    return Err(format!(
                        "redis-server on port {} did not answer PING within {} s{}",
                        self.port,
                        START_TIMEOUT.as_secs(),
                        self.logs()
                    ));
                }
                _ => thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// What the server printed, to explain a failure.
    fn logs(&self) -> String {
        ["stdout.log", "stderr.log"]
            .iter()
            .filter_map(|name| fs::read_to_string(self.dir.join(name)).ok())
            .filter(|text| !text.trim().is_empty())
            .map(|text| {
                format!("\n--- redis-server output ---\n{}", text.trim_end())
            })
            .collect()
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The loopback port it listens on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL: a throwaway server has nothing to save.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
        println!("xtask: stopped redis-server on 127.0.0.1:{}", self.port);
    }
}

/// A running 3-master Redis Cluster, every node stopped when dropped.
pub(crate) struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, joins them with
    /// `redis-cli --cluster create`, and waits for `cluster_state:ok`.
    pub(crate) fn start(server_bin: &Path, cli_bin: &Path) -> Result<Self> {
        let mut nodes = Vec::new();
        for port in free_ports(3, true)? {
            let cluster_args = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "5000",
            ];
            nodes.push(RedisServer::start_on(server_bin, port, &cluster_args)?);
        }
        let cluster = Self { nodes };

        let create = Cmd::new(cli_bin)
            .arg("--cluster")
            .arg("create")
            .args(
                cluster
                    .nodes
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.port)),
            )
            .args(["--cluster-replicas", "0", "--cluster-yes"]);
        // Its long report only matters when it fails, and then `read` shows it.
        create.read()?;
        cluster.wait_until_ok()?;
        println!(
            "xtask: Redis Cluster ready on ports {}",
            cluster
                .nodes
                .iter()
                .map(|n| n.port.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(cluster)
    }

    fn wait_until_ok(&self) -> Result<()> {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        for node in &self.nodes {
            loop {
                let info = command(node.port, &["CLUSTER", "INFO"]);
                if info.as_deref().is_ok_and(|info| {
                    info.lines().any(|l| l.trim() == "cluster_state:ok")
                }) {
                    break;
                }
                if Instant::now() >= deadline {
                    let info = info.unwrap_or_else(|e| e.to_string());
                    return Err(format!(
                        "the Redis Cluster was not ready within {} s: node 127.0.0.1:{} says\n{}",
                        CLUSTER_TIMEOUT.as_secs(),
                        node.port,
                        info.trim_end()
                    ));
                }
                thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// The nodes' URLs, comma-separated.
    pub(crate) fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }
}

fn check_not_shared(port: u16) -> Result<()> {
    if port == SHARED_REDIS_PORT {
        Err(format!(
            "refusing to use port {SHARED_REDIS_PORT}: it belongs to the shared Redis"
        ))
    } else {
        Ok(())
    }
}

/// `n` distinct loopback ports that were free a moment ago (bound, then
/// released). With `cluster_bus`, `port + 10000` was free too.
fn free_ports(n: usize, cluster_bus: bool) -> Result<Vec<u16>> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..100 {
        if ports.len() == n {
            break;
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| format!("could not bind a loopback port: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("could not read a bound port: {e}"))?
            .port();
        if port == SHARED_REDIS_PORT {
            continue;
        }
        if cluster_bus {
            let bus = port.checked_add(CLUSTER_BUS_OFFSET).and_then(|bus| {
                TcpListener::bind((Ipv4Addr::LOCALHOST, bus)).ok()
            });
            match bus {
                Some(bus) => held.push(bus),
                None => continue,
            }
        }
        held.push(listener);
        ports.push(port);
    }
    if ports.len() == n {
        Ok(ports)
    } else {
        Err(format!("could not find {n} free loopback ports"))
    }
}

/// Sends one command to the server on `127.0.0.1:port` and returns its
/// reply (a status, an integer or a bulk string); an error reply is an error.
fn command(port: u16, args: &[&str]) -> io::Result<String> {
    if port == SHARED_REDIS_PORT {
        return Err(io::Error::other("port 6379 belongs to the shared Redis"));
    }
    let timeout = Duration::from_secs(1);
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;

    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;

    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end_matches(['\r', '\n']);
    let bad = || io::Error::other(format!("unexpected reply {line:?}"));
    match line.split_at_checked(1) {
        Some(("+" | ":", value)) => Ok(value.to_owned()),
        Some(("-", message)) => Err(io::Error::other(message.to_owned())),
        Some(("$", len)) => {
            let len: usize = len.parse().map_err(|_| bad())?;
            let mut body = vec![0; len + 2];
            reader.read_exact(&mut body)?;
            body.truncate(len);
            Ok(String::from_utf8_lossy(&body).into_owned())
        }
        _ => Err(bad()),
    }
}
