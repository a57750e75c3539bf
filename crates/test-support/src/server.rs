//! [`RedisServer`]: one throwaway Redis, the same API whatever runs it.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crate::backend::Backend;
use crate::docker::{DockerNode, Launch};
use crate::error::{Error, Result};
use crate::fake_clock;
use crate::ports::{SHARED_REDIS_PORT, free_ports};
use crate::process::ProcessNode;
use crate::resp;
use crate::tls::TestCa;

/// How long a new (or restarted) server has to answer `PING`. Pulling a
/// missing image happens before, in the container's creation.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How many ports a new server tries when its port was taken between the
/// check and the start (by another process).
const PORT_ATTEMPTS: usize = 3;
/// How much of its log a failure shows.
const LOG_LINES: usize = 60;

/// A throwaway Redis on a loopback port of its own (never 6379), run by the
/// chosen [`Backend`]: a `redis-server` child process, or a Docker container
/// on the host's network. Stopped, and its directory or container removed,
/// when dropped, whatever happened.
///
/// It starts empty and saves nothing (`--save "" --appendonly no`): a
/// restarted server is empty again, scripts included.
///
/// The methods block (a few milliseconds to a few seconds); the helpers that
/// change its state panic with the server's log when they fail, as a test
/// would. In a `#[tokio::test]` they block the test's thread, which suits
/// the usual "break it, then watch the client" steps; clients on other
/// runtimes (the [`TcpProxy`](crate::TcpProxy) has its own) keep running.
pub struct RedisServer {
    port: u16,
    node: Node,
    state: State,
}

enum Node {
    Process(ProcessNode),
    // A testcontainers container is large.
    Docker(Box<DockerNode>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Paused,
    Killed,
}

impl RedisServer {
    /// Starts a server with the backend the environment chooses
    /// ([`Backend::from_env`]) and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// With the reason and what to install, if there is no Redis to run or
    /// it does not start.
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`RedisServer::start`], as a `Result`.
    pub fn try_start() -> Result<Self> {
        Self::start_with(&Backend::from_env()?)
    }

    /// Starts a server with `backend` and waits until it answers `PING`.
    pub fn start_with(backend: &Backend) -> Result<Self> {
        Self::launch(backend, &[], false, None)
    }

    /// Starts a server (with the backend the environment chooses) that
    /// also listens for TLS on a port of its own, with `ca`'s server
    /// certificate; returns it and that port. Its plain port stays for the
    /// helpers ([`command`](Self::command), readiness).
    ///
    /// # Errors
    ///
    /// No Redis to run, a Redis built without TLS, or one that does not
    /// start.
    pub fn try_start_tls(ca: &TestCa) -> Result<(Self, u16)> {
        let backend = Backend::from_env()?;
        let tls_port = free_ports(1, false)?[0];
        let server = Self::launch_with(
            &backend,
            &[],
            false,
            None,
            Some((ca, tls_port)),
        )?;
        Ok((server, tls_port))
    }

    /// Starts a server (with the backend the environment chooses) whose
    /// wall clock reads `at` when it starts and runs on at the real pace
    /// from there: `TIME`, and so every script that reads it, key expiry
    /// and its log. For what happens at an instant of the calendar (the end
    /// of a month, of a leap-year February) on a real Redis, waiting only
    /// the seconds before it: start a couple of seconds ahead of it.
    ///
    /// How: an `LD_PRELOAD` library (`src/fake_clock.c`, built by this
    /// crate's build script with the C compiler) shifts the server's
    /// readings of the wall clock (`clock_gettime` of `CLOCK_REALTIME`,
    /// `gettimeofday`, `time`); its monotonic clock stays the real one. A
    /// process gets it in its environment; a container gets the library
    /// copied in and the same environment (it needs only glibc's `getenv`
    /// and `syscall`: the local image works, tried; the official
    /// `redis:7.0`, a Debian image, should too, untried here). libfaketime
    /// is not used:
    /// `redis-server` deadlocks under it at start (it clashes with jemalloc,
    /// Redis's allocator).
    ///
    /// Once the server answers, its `TIME` is checked: from `at` to `at`
    /// plus the time it took to start. A clock that did not take (an image
    /// without glibc, a library that failed to build: not Linux, no C
    /// compiler) is an error that says so, never a server on the real
    /// clock. A [`restart`](Self::restart) starts the clock at `at` again.
    ///
    /// ```no_run
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use rate_tier_test_support::RedisServer;
    ///
    /// // 2026-12-31T23:59:58Z: two seconds before 2027.
    /// let server = RedisServer::start_at(UNIX_EPOCH + Duration::from_secs(1_798_761_598));
    /// let now_us = server.time_us().unwrap(); // about 1_798_761_598_000_000
    /// ```
    ///
    /// # Panics
    ///
    /// With the reason, if there is no Redis to run, it does not start, or
    /// its clock could not be set.
    pub fn start_at(at: SystemTime) -> Self {
        Self::try_start_at(at).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`RedisServer::start_at`], as a `Result`.
    pub fn try_start_at(at: SystemTime) -> Result<Self> {
        Self::start_at_with(&Backend::from_env()?, at)
    }

    /// [`RedisServer::start_at`] with `backend`.
    pub fn start_at_with(backend: &Backend, at: SystemTime) -> Result<Self> {
        let launched = Instant::now();
        let server = Self::launch(backend, &[], false, Some(at))?;
        let now = server.time_us()?;
        let earliest = fake_clock::micros(at);
        // What the clock may have run since it was set, with a second to
        // spare for the gap between the launch and the first reading.
        let latest =
            earliest + launched.elapsed().as_micros() as i128 + 1_000_000;
        if !(earliest..=latest).contains(&i128::from(now)) {
            return Err(server.failure(&format!(
                "started with its wall clock at {earliest} µs since the epoch, but its TIME \
                 reads {now} µs: the fake clock did not take (LD_PRELOAD={}; a container's \
                 image needs glibc and a dynamically linked redis-server)",
                match backend {
                    Backend::Process { .. } => fake_clock::library()?.display().to_string(),
                    Backend::Docker { .. } => fake_clock::CONTAINER_PATH.to_owned(),
                }
            )));
        }
        Ok(server)
    }

    /// Starts a server on a new free port (with its cluster bus port free
    /// too if `cluster_bus`), with `extra_args`, its wall clock at `clock`
    /// when it starts if given ([`start_at`](Self::start_at)); tries other
    /// ports if the one chosen was taken meanwhile.
    pub(crate) fn launch(
        backend: &Backend,
        extra_args: &[String],
        cluster_bus: bool,
        clock: Option<SystemTime>,
    ) -> Result<Self> {
        Self::launch_with(backend, extra_args, cluster_bus, clock, None)
    }

    /// [`launch`](Self::launch), with a TLS listener on `tls`'s port
    /// serving `tls`'s certificate.
    fn launch_with(
        backend: &Backend,
        extra_args: &[String],
        cluster_bus: bool,
        clock: Option<SystemTime>,
        tls: Option<(&TestCa, u16)>,
    ) -> Result<Self> {
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_ports(1, cluster_bus)?[0];
            match Self::launch_on(backend, port, extra_args, clock, tls) {
                Err(e) if e.message().contains("Address already in use") => {
                    last = Some(e)
                }
                result => return result,
            }
        }
        Err(last.expect("at least one attempt"))
    }

    fn launch_on(
        backend: &Backend,
        port: u16,
        extra_args: &[String],
        clock: Option<SystemTime>,
        tls: Option<(&TestCa, u16)>,
    ) -> Result<Self> {
        assert_ne!(
            port, SHARED_REDIS_PORT,
            "port 6379 belongs to the shared Redis"
        );
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .map(str::to_owned)
        .into();
        args.extend_from_slice(extra_args);
        // The fake clock: its library, and the start in its environment.
        let clock = match clock {
            Some(at) => {
                Some((fake_clock::library()?, fake_clock::start_ns(at)))
            }
            None => None,
        };
        // TLS: the files where the server reads them (a container gets
        // copies), clients' certificates not asked for.
        let tls_files = tls.map(|(ca, tls_port)| {
            (tls_port, [ca.cert_file(), ca.key_file(), ca.ca_file()])
        });
        let tls_args = |paths: [&str; 3], tls_port: u16| {
            let [cert, key, ca] = paths;
            [
                "--tls-port",
                &tls_port.to_string(),
                "--tls-cert-file",
                cert,
                "--tls-key-file",
                key,
                "--tls-ca-cert-file",
                ca,
                "--tls-auth-clients",
                "no",
            ]
            .map(str::to_owned)
        };
        const IN_CONTAINER: [&str; 3] =
            ["/tls/server.crt", "/tls/server.key", "/tls/ca.crt"];
        let node = match backend {
            Backend::Process { server, cli } => {
                let mut args = args;
                if let Some((tls_port, files)) = &tls_files {
                    let paths =
                        files.each_ref().map(|f| f.to_str().unwrap_or(""));
                    args.extend(tls_args(paths, *tls_port));
                }
                let env = match &clock {
                    Some((lib, start)) => vec![
                        ("LD_PRELOAD".to_owned(), lib.display().to_string()),
                        (fake_clock::START_VAR.to_owned(), start.clone()),
                    ],
                    None => Vec::new(),
                };
                Node::Process(ProcessNode::launch(
                    server,
                    cli.as_deref(),
                    port,
                    args,
                    env,
                )?)
            }
            Backend::Docker { image } => {
                let mut cmd = vec!["redis-server".to_owned()];
                cmd.extend(args);
                let (env, mut files) = match &clock {
                    Some((lib, start)) => (
                        vec![
                            ("LD_PRELOAD", fake_clock::CONTAINER_PATH),
                            (fake_clock::START_VAR, start.as_str()),
                        ],
                        vec![(fake_clock::CONTAINER_PATH, *lib)],
                    ),
                    None => (Vec::new(), Vec::new()),
                };
                if let Some((tls_port, host_files)) = &tls_files {
                    cmd.extend(tls_args(IN_CONTAINER, *tls_port));
                    for (inside, host) in IN_CONTAINER.iter().zip(host_files) {
                        files.push((inside, host.as_path()));
                    }
                }
                Node::Docker(Box::new(DockerNode::launch(Launch {
                    image,
                    name: format!("trt-redis-{port}"),
                    cmd,
                    env: &env,
                    files: &files,
                    local_build: "build it from the local redis-server with `cargo xtask \
                                  redis-image`",
                })?))
            }
        };
        // From here on, dropping `server` stops it.
        let mut server = Self {
            port,
            node,
            state: State::Running,
        };
        server.wait_until_ready("start")?;
        Ok(server)
    }

    fn wait_until_ready(&mut self, what: &str) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if resp::pings(self.port) {
                return Ok(());
            }
            if let Some(status) = self.exited() {
                return Err(self
                    .failure(&format!("exited during its {what} ({status})")));
            }
            if Instant::now() >= deadline {
                return Err(self.failure(&format!(
                    "did not answer PING within {} s of its {what}",
                    START_TIMEOUT.as_secs()
                )));
            }
            thread::sleep(Duration::from_millis(25));
        }
    }

    fn exited(&mut self) -> Option<String> {
        match &mut self.node {
            Node::Process(node) => node.exited(),
            Node::Docker(node) => node.exited(),
        }
    }

    /// An error about this server, with the end of its log.
    pub(crate) fn failure(&self, what: &str) -> Error {
        let logs = self.logs();
        let lines: Vec<&str> = logs.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_LINES)..].join("\n");
        Error::new(format!(
            "{self} {what}\n--- its log (last {LOG_LINES} lines at most) ---\n{tail}"
        ))
    }

    fn expect_ok(&self, result: Result<()>, what: &str) {
        if let Err(e) = result {
            panic!("{}", self.failure(&format!("could not {what}: {e}")));
        }
    }

    /// Its loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// What runs it: `process` or `docker` (as [`Backend::name`]).
    pub fn backend(&self) -> &'static str {
        match self.node {
            Node::Process(_) => "process",
            Node::Docker(_) => "docker",
        }
    }

    /// Whether it runs (paused or not): false after [`kill`](Self::kill)
    /// until [`restart`](Self::restart).
    pub fn is_running(&self) -> bool {
        self.state != State::Killed
    }

    /// Whether it is paused.
    pub fn is_paused(&self) -> bool {
        self.state == State::Paused
    }

    /// Kills it with no warning to its clients: SIGKILL, to the process or
    /// (`docker kill`) to the container.
    /// Its clients see their connections closed, and new connections are
    /// refused.
    ///
    /// # Panics
    ///
    /// If it is not running, or could not be killed.
    pub fn kill(&mut self) {
        assert!(self.is_running(), "kill: {self} is not running");
        if self.state == State::Paused {
            // A frozen container cannot be stopped; a stopped process can,
            // but resuming first treats both alike.
            self.resume();
        }
        let result = match &mut self.node {
            Node::Process(node) => node.kill(),
            Node::Docker(node) => node.kill(),
        };
        self.expect_ok(result, "kill it");
        self.state = State::Killed;
    }

    /// Starts it again on the same port after [`kill`](Self::kill) (same
    /// directory or container, so a cluster node keeps its `nodes.conf` and
    /// rejoins); returns once it answers `PING`.
    ///
    /// # Panics
    ///
    /// If it is running, or does not come back.
    pub fn restart(&mut self) {
        assert!(
            !self.is_running(),
            "restart: {self} is still running: kill it first"
        );
        let result = match &mut self.node {
            Node::Process(node) => node.relaunch(),
            Node::Docker(node) => node.relaunch(),
        };
        self.expect_ok(result, "start it again");
        self.state = State::Running;
        if let Err(e) = self.wait_until_ready("restart") {
            panic!("{e}");
        }
    }

    /// Freezes it (SIGSTOP for a process, `docker pause` for a container):
    /// its port still accepts connections and data (the kernel does that),
    /// and nothing is answered: a hung server, not a dead one.
    ///
    /// # Panics
    ///
    /// If it is not running (or already paused), or could not be paused.
    pub fn pause(&mut self) {
        assert_eq!(
            self.state,
            State::Running,
            "pause: {self} is not running unpaused"
        );
        let result = match &self.node {
            Node::Process(node) => node.pause(),
            Node::Docker(node) => node.pause(),
        };
        self.expect_ok(result, "pause it");
        self.state = State::Paused;
    }

    /// Undoes [`pause`](Self::pause) (SIGCONT, `docker unpause`): it answers
    /// what it was sent meanwhile, in order.
    ///
    /// # Panics
    ///
    /// If it is not paused, or could not be resumed.
    pub fn resume(&mut self) {
        assert_eq!(self.state, State::Paused, "resume: {self} is not paused");
        let result = match &self.node {
            Node::Process(node) => node.resume(),
            Node::Docker(node) => node.resume(),
        };
        self.expect_ok(result, "resume it");
        self.state = State::Running;
    }

    /// Everything it printed (every run, for a restarted server).
    pub fn logs(&self) -> String {
        match &self.node {
            Node::Process(node) => node.logs(),
            Node::Docker(node) => node.logs(),
        }
    }

    /// Sends one command over a new connection and returns the reply (a
    /// status, an integer or a bulk string; nil is empty), within a second:
    /// for setting up and looking, e.g. `server.command(&["DBSIZE"])`.
    ///
    /// Not for what depends on the connection: `WAIT` sent this way waits
    /// for the writes of its own new connection, none, and proves nothing
    /// about an earlier write. Use [`commands`](Self::commands).
    pub fn command(&self, args: &[&str]) -> Result<String> {
        resp::command(self.port, args).map_err(|e| {
            Error::new(format!("{} on {self}: {e}", args.join(" ")))
        })
    }

    /// Sends `commands` in order over one new connection and returns their
    /// replies (as [`command`](Self::command)), each within `timeout`; stops
    /// at the first error reply. For what belongs to a connection: a write
    /// then `WAIT` (which counts the replicas that acknowledged the writes
    /// sent over its own connection), or `READONLY` then a read on a cluster
    /// replica, e.g.
    /// `server.commands(&[&["SET", "k", "v"], &["WAIT", "1", "5000"]], Duration::from_secs(6))`.
    pub fn commands(
        &self,
        commands: &[&[&str]],
        timeout: Duration,
    ) -> Result<Vec<String>> {
        resp::commands(self.port, commands, timeout).map_err(|e| {
            let sent: Vec<String> =
                commands.iter().map(|args| args.join(" ")).collect();
            Error::new(format!("{} on {self}: {e}", sent.join("; ")))
        })
    }

    /// Its wall clock: `TIME`, in µs since the Unix epoch (the fake one of
    /// a server started with [`start_at`](Self::start_at)).
    pub fn time_us(&self) -> Result<u64> {
        // One integer reply: TIME's two halves joined in a script (exact:
        // below 2^53).
        let reply = self.command(&[
            "EVAL",
            "local t = redis.call('TIME') return t[1] * 1000000 + t[2]",
            "0",
        ])?;
        reply.parse().map_err(|_| {
            Error::new(format!("TIME on {self}: not a number of µs: {reply:?}"))
        })
    }

    /// Runs `redis-cli` with `args`: the installed one for a process, the
    /// image's inside the container (on the host's network) for Docker.
    pub(crate) fn redis_cli(&self, args: &[String]) -> Result<String> {
        match &self.node {
            Node::Process(node) => node.cli(args),
            Node::Docker(node) => {
                let mut cmd = vec!["redis-cli".to_owned()];
                cmd.extend_from_slice(args);
                node.exec(cmd, &[])
            }
        }
    }
}

impl fmt::Display for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.node {
            Node::Process(_) => "redis-server",
            Node::Docker(_) => "redis-server container",
        };
        write!(f, "{what} on 127.0.0.1:{}", self.port)
    }
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("port", &self.port)
            .field("backend", &self.backend())
            .field("state", &self.state)
            .finish()
    }
}
