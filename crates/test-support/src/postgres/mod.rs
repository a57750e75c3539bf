//! [`PostgresServer`]: one throwaway PostgreSQL on a free loopback port
//! (never 5432), the same API whatever runs it ([`PostgresBackend`]):
//!
//! - `process.rs`: the installed server binaries (Debian's `postgresql`
//!   package), `initdb` into a temporary directory of its own and `pg_ctl`;
//!   as root, run as the `postgres` system user.
//! - `docker.rs`: a container of `TRT_POSTGRES_IMAGE` (default
//!   `postgres:15`) through testcontainers, on the host's network, whose
//!   entrypoint creates the cluster.
//! - `image.rs`: that image built from the installed binaries, for a machine
//!   whose Docker engine cannot pull (`trt-postgres build-image`).

use std::fmt;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::backend::{Image, choose, docker_engine, engine_for};
use crate::error::{Error, Result};
use crate::ports::try_free_port;
use crate::tls::TestCa;

mod docker;
mod image;
mod process;

use docker::DockerCluster;
pub use image::build_local_postgres_image;
use process::ProcessCluster;
pub use process::{POSTGRES_BIN_DIR_VAR, find_postgres_bin_dir};

/// `docker` forces containers; `process` forces the installed server
/// binaries; unset (or empty) chooses (see [`PostgresBackend::from_env`]).
pub const POSTGRES_BACKEND_VAR: &str = "TRT_POSTGRES_BACKEND";
/// The image the Docker backend runs, `name:tag` (default
/// [`DEFAULT_POSTGRES_IMAGE`]).
pub const POSTGRES_IMAGE_VAR: &str = "TRT_POSTGRES_IMAGE";
/// The official image the Docker backend runs unless told otherwise. On a
/// machine with no registry, `cargo xtask postgres-image` builds a local
/// image under this name from the installed PostgreSQL.
pub const DEFAULT_POSTGRES_IMAGE: &str = "postgres:15";
/// The port of the machine's own PostgreSQL: never started, stopped or
/// contacted by these helpers.
pub const SHARED_POSTGRES_PORT: u16 = 5432;
/// The superuser every throwaway cluster is created with (`initdb -U`), and
/// the user of [`PostgresServer::url`]; trust authentication on loopback, so
/// no password. The same name whoever runs the tests, so a URL never depends
/// on the machine's user names.
pub const POSTGRES_SUPERUSER: &str = "postgres";
/// The system user that runs the server when this process is root
/// (PostgreSQL refuses to run as root); Debian's `postgresql` package
/// creates it.
pub const POSTGRES_SYSTEM_USER: &str = "postgres";

/// The settings of every throwaway server, after its port (and, for a
/// process, its socket directory; a container keeps the default,
/// `/var/run/postgresql`, which the official image's entrypoint connects
/// to): loopback TCP only; no fsync and no full-page images (nothing here
/// must survive a crash of the machine, only of the server); dynamic shared
/// memory in files of the data directory (removed with it, and not limited
/// by a container's small `/dev/shm`). `synchronous_commit` stays on: with
/// fsync off a commit costs one `write`, and every committed transaction
/// then survives [`PostgresServer::kill`] (the kernel keeps what was
/// written), as it would on a real server.
const SETTINGS: &[&str] = &[
    "listen_addresses=127.0.0.1",
    "fsync=off",
    "full_page_writes=off",
    "dynamic_shared_memory_type=mmap",
];
/// How long a start or a stop may take (`pg_ctl -t`; a container's first
/// start, which creates the cluster, too).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long [`PostgresServer::psql`] waits for `psql`.
const PSQL_TIMEOUT: Duration = Duration::from_secs(30);
/// How many ports a new server tries when its port was taken between the
/// check and the start (by another process).
const PORT_ATTEMPTS: usize = 3;
/// How much of its log a failure shows.
const LOG_LINES: usize = 60;

/// What runs the PostgreSQL servers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PostgresBackend {
    /// The installed server binaries (`initdb`, `pg_ctl`, `postgres`).
    Process {
        /// Their directory ([`find_postgres_bin_dir`]).
        bin_dir: PathBuf,
    },
    /// Containers of an image, through testcontainers, on the host's
    /// network (so their ports are loopback ports, as for a process).
    Docker {
        /// The image, pulled if the engine does not have it.
        image: Image,
    },
}

impl PostgresBackend {
    /// The backend the environment asks for, found once per process:
    ///
    /// 1. `TRT_POSTGRES_BACKEND=docker` forces Docker, `=process` forces the
    ///    installed binaries;
    /// 2. otherwise the server binaries, if [`find_postgres_bin_dir`] finds
    ///    them;
    /// 3. otherwise (unless `TRT_POSTGRES_BIN_DIR` names a directory without
    ///    them: that is an error) a Docker engine that answers;
    /// 4. otherwise an error that says how to get either.
    pub fn from_env() -> Result<Self> {
        static CHOSEN: OnceLock<Result<PostgresBackend>> = OnceLock::new();
        CHOSEN
            .get_or_init(|| {
                choose(
                    POSTGRES_BACKEND_VAR,
                    &std::env::var(POSTGRES_BACKEND_VAR).unwrap_or_default(),
                    std::env::var_os(POSTGRES_BIN_DIR_VAR)
                        .is_some_and(|v| !v.is_empty()),
                    Self::process,
                    Self::docker,
                    docker_engine,
                    neither,
                )
            })
            .clone()
    }

    /// The installed server binaries, whatever else there is: fails if
    /// there are none.
    pub fn process() -> Result<Self> {
        find_postgres_bin_dir().map(|bin_dir| Self::Process { bin_dir })
    }

    /// Docker containers of [`PostgresBackend::image_from_env`], whatever
    /// else is installed: fails if no Docker engine answers.
    pub fn docker() -> Result<Self> {
        engine_for(POSTGRES_BACKEND_VAR)?;
        Ok(Self::Docker {
            image: Self::image_from_env(),
        })
    }

    /// `TRT_POSTGRES_IMAGE`, else [`DEFAULT_POSTGRES_IMAGE`].
    pub fn image_from_env() -> Image {
        Image::from_env_var(POSTGRES_IMAGE_VAR, DEFAULT_POSTGRES_IMAGE)
    }

    /// `process` or `docker`: the value of `TRT_POSTGRES_BACKEND` that
    /// chooses this backend.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Process { .. } => "process",
            Self::Docker { .. } => "docker",
        }
    }
}

/// The error when there is neither the binaries nor an engine (`docker`:
/// why no engine answered).
fn neither(docker: &str) -> Error {
    Error::new(format!(
        "no PostgreSQL for the tests: its server binaries (initdb, pg_ctl, postgres) are \
         not on PATH nor in /usr/lib/postgresql/<version>/bin, and no Docker engine \
         answered ({docker}).\n\
         Either install them (`apt-get install -y postgresql` on Debian/Ubuntu, `brew \
         install postgresql` on macOS; or set {POSTGRES_BIN_DIR_VAR} to their directory), \
         or start Docker (the tests then run {image} in containers; set DOCKER_HOST if its \
         socket is elsewhere).",
        image = PostgresBackend::image_from_env()
    ))
}

impl fmt::Display for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Process { bin_dir } => {
                write!(f, "PostgreSQL processes ({})", bin_dir.display())
            }
            Self::Docker { image } => {
                write!(f, "Docker containers of {image} (host network)")
            }
        }
    }
}

/// A throwaway PostgreSQL on a loopback port of its own (never 5432), run
/// by the chosen [`PostgresBackend`]: a cluster of the installed binaries
/// in a new temporary directory, or a Docker container on the host's
/// network. Stopped, and its directory or container removed, when dropped,
/// whatever happened.
///
/// The cluster has one superuser, [`POSTGRES_SUPERUSER`] (`postgres`), and
/// trusts every local connection: [`url`](Self::url) is
/// `postgres://postgres@127.0.0.1:<port>/postgres`, usable as it is by
/// tokio-postgres (`NoTls`), psql or any libpq client. It is UTF-8 with the
/// C locale, whatever runs it.
///
/// Unlike [`RedisServer`](crate::RedisServer), its data survives
/// [`restart`](Self::restart), after [`kill`](Self::kill) too (crash
/// recovery replays the WAL): what a real PostgreSQL does. A container is
/// kept while it is down, with its data.
///
/// The methods block (milliseconds to seconds); those that change its state
/// panic with the server's log when they fail, as a test would. The process
/// backend is Linux only (it reads `/proc` to find the server's processes).
pub struct PostgresServer {
    port: u16,
    cluster: Box<dyn Cluster>,
    state: State,
}

/// What runs a [`PostgresServer`]'s cluster: `process.rs`'s
/// [`ProcessCluster`] or `docker.rs`'s [`DockerCluster`]. The server keeps
/// the state (running, paused, down) and checks each call against it;
/// errors say what failed, and the server adds its log.
trait Cluster: Send + Sync {
    /// `process` or `docker`, as [`PostgresBackend::name`].
    fn backend(&self) -> &'static str;
    /// Starts its server on `port` and returns once it accepts queries.
    fn start(&mut self, port: u16) -> Result<()>;
    /// A fast shutdown; its data kept.
    fn stop(&mut self) -> Result<()>;
    /// SIGKILL to all of it, paused or not; returns once it is gone.
    fn kill(&mut self) -> Result<()>;
    fn pause(&self) -> Result<()>;
    fn resume(&self) -> Result<()>;
    /// Everything it logged, every run.
    fn logs(&self) -> String;
    /// Where [`logs`](Self::logs) come from, for a person.
    fn log_place(&self) -> String;
    /// `psql` with [`psql_args`]: what it printed.
    fn psql(&self, port: u16, sql: &str) -> Result<String>;
    fn bin_dir(&self) -> &Path;
    fn dir(&self) -> &Path;
    /// The postmaster's pid on this machine, while it runs there.
    fn postmaster(&self) -> Option<u32>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Paused,
    /// Killed (SIGKILL) or stopped: [`PostgresServer::restart`] starts it.
    Down,
}

impl PostgresServer {
    /// Starts a server with the backend the environment chooses
    /// ([`PostgresBackend::from_env`]) on a free loopback port, and returns
    /// once it accepts connections.
    ///
    /// # Panics
    ///
    /// With the reason (and what to install, or the server's log) if there
    /// is no PostgreSQL to run or it does not start.
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`PostgresServer::start`], as a `Result`.
    pub fn try_start() -> Result<Self> {
        Self::start_on(&PostgresBackend::from_env()?)
    }

    /// [`PostgresServer::try_start`] with `backend`.
    pub fn start_on(backend: &PostgresBackend) -> Result<Self> {
        match backend {
            PostgresBackend::Process { bin_dir } => Self::start_with(bin_dir),
            PostgresBackend::Docker { image } => {
                // A new container for each port tried: the port is in its
                // command.
                let mut started = None;
                on_a_free_port(|port| {
                    let mut server = Self::new(
                        port,
                        Box::new(DockerCluster::launch(image, port)?),
                    );
                    server.bring_up("start")?;
                    started = Some(server);
                    Ok(())
                })?;
                Ok(started.expect("a server once an attempt succeeded"))
            }
        }
    }

    /// [`PostgresServer::try_start`] with the installed binaries of
    /// `bin_dir` (which holds `initdb`, `pg_ctl` and `postgres`), whatever
    /// the environment says.
    pub fn start_with(bin_dir: &Path) -> Result<Self> {
        // From here on, dropping `server` removes the directory (and stops
        // whatever runs). One cluster for every port tried.
        let mut server =
            Self::new(0, Box::new(ProcessCluster::create(bin_dir)?));
        on_a_free_port(|port| {
            server.port = port;
            server.bring_up("start")
        })?;
        Ok(server)
    }

    fn new(port: u16, cluster: Box<dyn Cluster>) -> Self {
        Self {
            port,
            cluster,
            state: State::Down,
        }
    }

    /// Starts it on `self.port` and waits until it accepts connections.
    fn bring_up(&mut self, what: &str) -> Result<()> {
        match self.cluster.start(self.port) {
            Ok(()) => {
                self.state = State::Running;
                Ok(())
            }
            Err(e) => Err(self.failure(&format!("did not {what}: {e}"))),
        }
    }

    /// An error about this server, with the end of its log.
    fn failure(&self, what: &str) -> Error {
        let logs = self.logs();
        let lines: Vec<&str> = logs.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_LINES)..].join("\n");
        Error::new(format!(
            "{self} {what}\n--- its log, {} (last {LOG_LINES} lines at most) ---\n{tail}",
            self.cluster.log_place()
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
        addr(self.port)
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`: the superuser, on
    /// the `postgres` database, no password (trust authentication), no TLS.
    pub fn url(&self) -> String {
        format!(
            "postgres://{POSTGRES_SUPERUSER}@127.0.0.1:{}/postgres",
            self.port
        )
    }

    /// What runs it: `process` or `docker` (as [`PostgresBackend::name`]).
    pub fn backend(&self) -> &'static str {
        self.cluster.backend()
    }

    /// The directory of the binaries it runs: for a process, on this
    /// machine; for a container, inside its image (where `docker exec`
    /// finds them; the server's own `BINDIR`), not here.
    pub fn bin_dir(&self) -> &Path {
        self.cluster.bin_dir()
    }

    /// A temporary directory of its own on this machine, removed on drop:
    /// for a process the cluster in `data/`, the socket in `sock/`, the log
    /// in `postgres.log`; for a container (whose cluster is inside it) an
    /// empty directory, for the caller's files.
    pub fn dir(&self) -> &Path {
        self.cluster.dir()
    }

    /// The postmaster's process id, while it runs as a process of this
    /// machine; `None` for a container (its processes are the engine's).
    pub fn postmaster_pid(&self) -> Option<u32> {
        self.cluster.postmaster()
    }

    /// Whether it runs (paused or not): false after [`kill`](Self::kill) or
    /// [`stop`](Self::stop) until [`restart`](Self::restart).
    pub fn is_running(&self) -> bool {
        self.state != State::Down
    }

    /// Whether it is paused.
    pub fn is_paused(&self) -> bool {
        self.state == State::Paused
    }

    /// Whether it answers a TLS request (the first message of a connection)
    /// within `timeout`: true for a running server, false for a paused,
    /// killed or stopped one. Opens and closes one TCP connection.
    pub fn answers(&self, timeout: Duration) -> bool {
        answers(self.addr(), timeout)
    }

    /// Kills it with no warning to its clients, paused or not, and waits
    /// until it is gone: SIGKILL to every one of its processes (backends
    /// included), or to the container (`docker kill`). Connections are
    /// closed under their clients with no message, and new ones are
    /// refused. The data is left as a crash leaves it:
    /// [`restart`](Self::restart) recovers it.
    ///
    /// # Panics
    ///
    /// If it is not running, or could not be killed.
    pub fn kill(&mut self) {
        assert!(self.is_running(), "kill: {self} is not running");
        let result = self.cluster.kill();
        self.expect_ok(result, "kill it");
        self.state = State::Down;
    }

    /// Stops it cleanly (a fast shutdown: clients are disconnected,
    /// everything is written; `pg_ctl stop -m fast`, or `docker stop`, whose
    /// signal is SIGINT in the official image and ours):
    /// [`restart`](Self::restart) starts it again.
    ///
    /// # Panics
    ///
    /// If it is not running, or did not stop.
    pub fn stop(&mut self) {
        assert!(self.is_running(), "stop: {self} is not running");
        if self.state == State::Paused {
            self.resume();
        }
        let result = self.cluster.stop();
        self.expect_ok(result, "stop it");
        self.state = State::Down;
    }

    /// Starts it again on the same port with the same data (directory or
    /// container), and returns once it accepts connections: its data is
    /// there (after a [`kill`](Self::kill), once crash recovery has run). A
    /// running (or paused) server is first stopped cleanly, as `pg_ctl
    /// restart` does.
    ///
    /// # Panics
    ///
    /// If it does not come back (the port taken meanwhile, for one).
    pub fn restart(&mut self) {
        if self.is_running() {
            self.stop();
        }
        if let Err(e) = self.bring_up("restart") {
            panic!("{e}");
        }
    }

    /// Freezes it: SIGSTOP to the postmaster, then to each of its processes
    /// (every backend), or `docker pause`; returns once all of them are
    /// stopped. Its port still accepts connections and data (the kernel
    /// does that), and nothing is answered, on new connections and open
    /// ones alike: a hung server, not a dead one.
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
        let result = self.cluster.pause();
        self.expect_ok(result, "pause it");
        self.state = State::Paused;
    }

    /// Undoes [`pause`](Self::pause) (SIGCONT to each of its processes, or
    /// `docker unpause`): it answers what it was sent meanwhile.
    ///
    /// # Panics
    ///
    /// If it is not paused, or could not be resumed.
    pub fn resume(&mut self) {
        assert_eq!(self.state, State::Paused, "resume: {self} is not paused");
        let result = self.cluster.resume();
        self.expect_ok(result, "resume it");
        self.state = State::Running;
    }

    /// Everything it logged (every run, for a restarted server).
    pub fn logs(&self) -> String {
        self.cluster.logs()
    }

    /// Runs `sql` with `psql` as the superuser, over TCP, stopping at the
    /// first error, and returns what it printed: unaligned, tuples only
    /// (`select 1` gives `"1\n"`). Within 30 seconds. For setting up and
    /// looking. For a process, the `psql` of the server's binaries (else
    /// `PATH`); for a container, the image's (`docker exec`, bounded by a
    /// `statement_timeout`).
    pub fn psql(&self, sql: &str) -> Result<String> {
        self.cluster
            .psql(self.port, sql)
            .map_err(|e| e.context(format!("`psql -c {sql:?}` on {self}")))
    }

    /// Turns TLS on, with `ca`'s server certificate: the server writes the
    /// certificate and its key into its data directory itself (`COPY ...
    /// TO PROGRAM`, as its own user, mode 0600: what it asks of a key,
    /// whatever runs it), then restarts with `ssl = on`. Plain connections are
    /// still accepted; a client asks for TLS.
    ///
    /// # Errors
    ///
    /// The server refused a statement, or says TLS is still off.
    pub fn enable_tls(&mut self, ca: &TestCa) -> Result<()> {
        let read = |path: PathBuf| {
            std::fs::read_to_string(&path)
                .map_err(|e| Error::new(format!("{}: {e}", path.display())))
        };
        let data = self.psql("SHOW data_directory")?;
        let data = data.trim();
        for (name, pem) in [
            ("server.crt", read(ca.cert_file())?),
            ("server.key", read(ca.key_file())?),
        ] {
            // One row per line (PEM holds no tab, backslash or quote),
            // written by the server's shell with mode 0600, as PostgreSQL
            // asks of a key (`COPY ... TO` a file would make it 0644), and
            // with no program but the shell's builtins (the local image
            // has no `cat`).
            self.psql(&format!(
                "COPY (SELECT unnest(string_to_array('{}', E'\\n'))) TO PROGRAM \
                 'umask 077 && while IFS= read -r l; do printf ''%s\\n'' \"$l\"; done > {data}/{name}'",
                pem.trim_end()
            ))?;
        }
        for sql in [
            "ALTER SYSTEM SET ssl_cert_file = 'server.crt'",
            "ALTER SYSTEM SET ssl_key_file = 'server.key'",
            "ALTER SYSTEM SET ssl = on",
        ] {
            self.psql(sql)?;
        }
        // A restart, not a reload: the settings hold when it answers again
        // (a reload is taken later, asynchronously).
        self.restart();
        if self.psql("SHOW ssl")?.trim() != "on" {
            return Err(Error::new(format!(
                "{self}: ssl is off after a restart with it on\n{}",
                self.logs()
            )));
        }
        Ok(())
    }
}

impl fmt::Display for PostgresServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.backend() {
            "docker" => "PostgreSQL container",
            _ => "PostgreSQL",
        };
        write!(f, "{what} on 127.0.0.1:{}", self.port)
    }
}

impl fmt::Debug for PostgresServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresServer")
            .field("port", &self.port)
            .field("backend", &self.backend())
            .field("dir", &self.dir())
            .field("postmaster", &self.postmaster_pid())
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// Runs `attempt` on new free ports until it does not fail because its port
/// was taken between the check and the start (by another process).
fn on_a_free_port(mut attempt: impl FnMut(u16) -> Result<()>) -> Result<()> {
    let mut last = None;
    for _ in 0..PORT_ATTEMPTS {
        let port = try_free_port()?;
        assert_ne!(
            port, SHARED_POSTGRES_PORT,
            "port 5432 belongs to the machine's PostgreSQL"
        );
        match attempt(port) {
            Err(e) if e.message().contains("Address already in use") => {
                last = Some(e);
            }
            result => return result,
        }
    }
    Err(last.expect("at least one attempt"))
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// `psql`'s arguments for `sql` on `127.0.0.1:<port>`, both backends'.
fn psql_args(port: u16, sql: &str) -> Vec<String> {
    let mut args: Vec<String> =
        ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d"]
            .map(str::to_owned)
            .into();
    args.push(format!(
        "host=127.0.0.1 port={port} user={POSTGRES_SUPERUSER} dbname=postgres \
         sslmode=disable connect_timeout=10"
    ));
    args.extend(["-c".to_owned(), sql.to_owned()]);
    args
}

/// Whether a PostgreSQL server answers on `addr` within `timeout`: it sends
/// an `SSLRequest` (the 8 bytes a client may open with) and waits for the
/// one-byte answer (`S` or `N`).
fn answers(addr: SocketAddr, timeout: Duration) -> bool {
    const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let mut reply = [0_u8; 1];
    stream.set_read_timeout(Some(timeout)).is_ok()
        && stream.set_write_timeout(Some(timeout)).is_ok()
        && stream.write_all(&SSL_REQUEST).is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && matches!(&reply, b"S" | b"N")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chosen(
        value: &str,
        binaries: bool,
        explicit: bool,
        engine: bool,
    ) -> Result<&'static str> {
        choose(
            POSTGRES_BACKEND_VAR,
            value,
            explicit,
            || {
                if binaries {
                    Ok("process")
                } else {
                    Err(Error::new("no binaries"))
                }
            },
            || {
                if engine {
                    Ok("docker")
                } else {
                    Err(Error::new("no engine (forced)"))
                }
            },
            || {
                if engine {
                    Ok("unix:///var/run/docker.sock".to_owned())
                } else {
                    Err("/var/run/docker.sock: refused".to_owned())
                }
            },
            neither,
        )
    }

    #[test]
    fn the_binaries_come_first_then_docker() {
        assert_eq!(chosen("", true, false, true).unwrap(), "process");
        assert_eq!(chosen("", false, false, true).unwrap(), "docker");
        assert_eq!(chosen("docker", true, false, true).unwrap(), "docker");
        assert_eq!(chosen(" process ", true, false, true).unwrap(), "process");
    }

    #[test]
    fn with_neither_the_error_says_how_to_get_either() {
        let e = chosen("", false, false, false).unwrap_err();
        for needle in [
            "no PostgreSQL for the tests",
            "apt-get install -y postgresql",
            POSTGRES_BIN_DIR_VAR,
            "no Docker engine answered (/var/run/docker.sock: refused)",
            "start Docker",
        ] {
            assert!(e.message().contains(needle), "{needle:?} in {e}");
        }
    }

    #[test]
    fn a_forced_or_explicit_choice_that_cannot_be_had_is_an_error() {
        let e = chosen("docker", true, false, false).unwrap_err();
        assert_eq!(e.message(), "no engine (forced)");
        let e = chosen("process", false, false, true).unwrap_err();
        assert_eq!(e.message(), "no binaries");
        // TRT_POSTGRES_BIN_DIR naming a wrong directory: no Docker instead.
        let e = chosen("", false, true, true).unwrap_err();
        assert_eq!(e.message(), "no binaries");
        let e = chosen("podman", true, false, true).unwrap_err();
        assert!(
            e.message().contains("TRT_POSTGRES_BACKEND=\"podman\""),
            "{e}"
        );
    }

    #[test]
    fn psql_prints_unaligned_tuples_only_and_stops_at_the_first_error() {
        let args = psql_args(15432, "select 1");
        assert_eq!(
            args[..7],
            ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d"]
        );
        assert!(args[7].starts_with(
            "host=127.0.0.1 port=15432 user=postgres dbname=postgres"
        ));
        assert_eq!(args[8..], ["-c", "select 1"]);
    }
}
