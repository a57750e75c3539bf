//! Helpers shared by the tests that need a Redis of their own.
//!
//! [`RedisProcess`] is a `redis-server` this test process starts, kills
//! (SIGKILL) and restarts on the same port, to test real outages. The binary
//! comes from `TRT_REDIS_SERVER_BIN`, which `cargo xtask test-redis` and
//! `cargo xtask test` set. Port 6379 (the shared Redis) is never used.

// Each test binary uses part of it.
#![allow(dead_code)]
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The shared Redis's port: never ours.
const SHARED_REDIS_PORT: u16 = 6379;
/// How long a new server has to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The redis-server binary, from `TRT_REDIS_SERVER_BIN`; panics if unset.
pub(crate) fn redis_server_bin() -> PathBuf {
    match std::env::var_os("TRT_REDIS_SERVER_BIN") {
        Some(bin) if !bin.is_empty() => PathBuf::from(bin),
        _ => panic!(
            "TRT_REDIS_SERVER_BIN is not set: run `cargo xtask test-redis`"
        ),
    }
}

/// A loopback port that was free a moment ago (never 6379).
fn free_port() -> u16 {
    for _ in 0..100 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .expect("bind a loopback port");
        let port = listener.local_addr().expect("local addr").port();
        if port != SHARED_REDIS_PORT {
            return port;
        }
    }
    panic!("no free loopback port found");
}

/// A `redis-server` owned by this test: killed (and its directory removed)
/// when dropped, whatever happened.
pub(crate) struct RedisProcess {
    bin: PathBuf,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl RedisProcess {
    /// Starts a server on a free loopback port; returns once it answers PING.
    pub(crate) fn start() -> Self {
        let bin = redis_server_bin();
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let port = free_port();
        let dir = std::env::temp_dir().join(format!(
            "trt-redis-outage-{}-{}-{port}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let mut server = RedisProcess {
            bin,
            port,
            dir,
            child: None,
        };
        server.spawn();
        server
    }

    /// `redis://127.0.0.1:<port>/`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILL (no shutdown, no goodbye to the clients), then reaps it.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL redis-server");
            child.wait().expect("reap redis-server");
        }
    }

    /// Starts the server again on the same port; returns once it answers
    /// PING.
    pub(crate) fn restart(&mut self) {
        assert!(self.child.is_none(), "restart: the server is still running");
        self.spawn();
    }

    fn spawn(&mut self) {
        assert_ne!(self.port, SHARED_REDIS_PORT, "port 6379 is not ours");
        let log = fs::File::create(self.dir.join("redis.log"))
            .expect("create the log file");
        let child = Command::new(&self.bin)
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--dir"])
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("could not start {}: {e}", self.bin.display())
            });
        self.child = Some(child);
        self.wait_for_ping();
    }

    fn wait_for_ping(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let exited = self
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                panic!(
                    "redis-server on port {} exited while starting ({status}):\n{}",
                    self.port,
                    self.log()
                );
            }
            if ping(self.port) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer PING within {:?}:\n{}",
                self.port,
                START_TIMEOUT,
                self.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Whether the server on `127.0.0.1:port` answers `PING` within 500 ms.
fn ping(port: u16) -> bool {
    if port == SHARED_REDIS_PORT {
        return false;
    }
    let timeout = Duration::from_millis(500);
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    if stream.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut reply = [0_u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}
