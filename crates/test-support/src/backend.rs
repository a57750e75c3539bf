//! What runs the test servers: `redis-server` processes, or Docker containers
//! through testcontainers; and how it is chosen ([`choose`], which
//! PostgreSQL's [`PostgresBackend`](crate::PostgresBackend) shares, as it
//! shares the engine's address and [`Image`]).

use std::env;
use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::error::{Error, Result};

/// `docker` forces containers; `process` forces `redis-server` processes;
/// unset (or empty) chooses (see [`Backend::from_env`]).
pub const BACKEND_VAR: &str = "TRT_REDIS_BACKEND";
/// The `redis-server` binary to run (default: `redis-server` from `PATH`).
pub const SERVER_BIN_VAR: &str = "TRT_REDIS_SERVER_BIN";
/// The image the Docker backend runs, `name:tag` (default [`DEFAULT_IMAGE`]).
pub const IMAGE_VAR: &str = "TRT_REDIS_IMAGE";
/// The official image the Docker backend runs unless told otherwise. On a
/// machine with no registry, `cargo xtask redis-image` builds a local image
/// under this name from the installed `redis-server`.
pub const DEFAULT_IMAGE: &str = "redis:7.0";

/// What runs the servers.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    /// `redis-server` processes, children of this process.
    Process {
        /// The `redis-server` binary.
        server: PathBuf,
        /// `redis-cli` (beside the server, else from `PATH`): it creates
        /// clusters. `None` if there is none; a cluster then fails to start.
        cli: Option<PathBuf>,
    },
    /// Containers of an image, through testcontainers, on the host's network
    /// (so their ports are loopback ports, as for a process).
    Docker {
        /// The image, pulled if the engine does not have it.
        image: Image,
    },
}

impl Backend {
    /// The backend the environment asks for, found once per process:
    ///
    /// 1. `TRT_REDIS_BACKEND=docker` forces Docker, `=process` forces
    ///    `redis-server` processes;
    /// 2. otherwise `redis-server` (from `TRT_REDIS_SERVER_BIN`, or on `PATH`);
    /// 3. otherwise a Docker engine that answers;
    /// 4. otherwise an error that says how to get either.
    pub fn from_env() -> Result<Self> {
        static CHOSEN: OnceLock<Result<Backend>> = OnceLock::new();
        CHOSEN.get_or_init(Self::choose).clone()
    }

    fn choose() -> Result<Self> {
        choose(
            BACKEND_VAR,
            &env::var(BACKEND_VAR).unwrap_or_default(),
            env::var_os(SERVER_BIN_VAR).is_some_and(|v| !v.is_empty()),
            Self::process,
            Self::docker,
            docker_engine,
            |docker| {
                Error::new(format!(
                    "no Redis for the tests: `redis-server` is not on PATH, and no Docker \
                     engine answered ({docker}).\n\
                     Either install Redis (`apt-get install redis-server redis-tools` on \
                     Debian/Ubuntu, `brew install redis` on macOS; or set {SERVER_BIN_VAR} \
                     to a redis-server binary), or start Docker (the tests then run \
                     {image} in containers; set DOCKER_HOST if its socket is elsewhere).",
                    image = Image::from_env()
                ))
            },
        )
    }

    /// `redis-server` processes, whatever else is installed: fails if there
    /// is no `redis-server`.
    pub fn process() -> Result<Self> {
        find_server().map(Self::with_server)
    }

    fn with_server(server: PathBuf) -> Self {
        let cli = find_cli(&server);
        Self::Process { server, cli }
    }

    /// Docker containers of [`Image::from_env`], whatever else is installed:
    /// fails if no Docker engine answers.
    pub fn docker() -> Result<Self> {
        engine_for(BACKEND_VAR)?;
        Ok(Self::Docker {
            image: Image::from_env(),
        })
    }

    /// `process` or `docker`: the value of `TRT_REDIS_BACKEND` that chooses
    /// this backend.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Process { .. } => "process",
            Self::Docker { .. } => "docker",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Process { server, .. } => {
                write!(f, "redis-server processes ({})", server.display())
            }
            Self::Docker { image } => {
                write!(f, "Docker containers of {image} (host network)")
            }
        }
    }
}

/// A Docker image reference, `name:tag`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    name: String,
    tag: String,
}

impl Image {
    /// `name:tag`; a reference without a tag means `latest`.
    pub fn parse(reference: &str) -> Self {
        let reference = reference.trim();
        // A colon after the last slash separates the tag (a registry's
        // `host:port/` comes before a slash).
        let slash = reference.rfind('/').map_or(0, |i| i + 1);
        match reference[slash..].rfind(':') {
            Some(i) => Self {
                name: reference[..slash + i].to_owned(),
                tag: reference[slash + i + 1..].to_owned(),
            },
            None => Self {
                name: reference.to_owned(),
                tag: "latest".to_owned(),
            },
        }
    }

    /// `TRT_REDIS_IMAGE`, else [`DEFAULT_IMAGE`].
    pub fn from_env() -> Self {
        Self::from_env_var(IMAGE_VAR, DEFAULT_IMAGE)
    }

    /// The image the environment variable `var` names, else `default`
    /// (PostgreSQL's: `TRT_POSTGRES_IMAGE`, else `postgres:15`).
    pub fn from_env_var(var: &str, default: &str) -> Self {
        match env::var(var) {
            Ok(image) if !image.trim().is_empty() => Self::parse(&image),
            _ => Self::parse(default),
        }
    }

    /// The repository, e.g. `redis`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tag, e.g. `7.0`.
    pub fn tag(&self) -> &str {
        &self.tag
    }
}

impl fmt::Display for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

/// The `redis-server` binary: `TRT_REDIS_SERVER_BIN` if set, else from `PATH`.
pub fn find_server() -> Result<PathBuf> {
    if let Some(bin) = env::var_os(SERVER_BIN_VAR).filter(|v| !v.is_empty()) {
        let bin = PathBuf::from(bin);
        return if is_executable(&bin) {
            Ok(bin)
        } else {
            Err(Error::new(format!(
                "{SERVER_BIN_VAR}={} is not an executable file",
                bin.display()
            )))
        };
    }
    find_on_path("redis-server").ok_or_else(|| {
        Error::new(
            "`redis-server` is not on PATH: install it (`apt-get install redis-server` on \
             Debian/Ubuntu, `brew install redis` on macOS), set TRT_REDIS_SERVER_BIN to its \
             path, or use Docker (TRT_REDIS_BACKEND=docker, `cargo xtask ... --docker`)",
        )
    })
}

/// `redis-cli`: beside the server, else from `PATH`.
pub fn find_cli(server: &Path) -> Option<PathBuf> {
    server
        .parent()
        .map(|dir| dir.join("redis-cli"))
        .filter(|cli| is_executable(cli))
        .or_else(|| find_on_path("redis-cli"))
}

/// The first executable file called `name` in the directories of `PATH`.
pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

pub(crate) fn is_executable(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        path.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        path.is_file()
    }
}

/// How a kind of test server chooses what runs it, from the value of its
/// environment variable `var` (`TRT_REDIS_BACKEND`, `TRT_POSTGRES_BACKEND`):
///
/// 1. `docker` forces `docker` (which fails if no engine answers), `process`
///    forces `process`;
/// 2. otherwise `process`, if it finds the server binaries;
/// 3. otherwise, unless the binaries were named explicitly (`explicit`: a
///    binary that is not there is a mistake to report, not a reason to go to
///    Docker), `docker` if `engine` answers;
/// 4. otherwise the error `neither` makes of why no engine answered.
pub(crate) fn choose<B>(
    var: &str,
    value: &str,
    explicit: bool,
    process: impl FnOnce() -> Result<B>,
    docker: impl FnOnce() -> Result<B>,
    engine: impl FnOnce() -> Result<String, String>,
    neither: impl FnOnce(&str) -> Error,
) -> Result<B> {
    match value.trim() {
        "docker" => docker(),
        "process" => process(),
        "" => match process() {
            Ok(backend) => Ok(backend),
            Err(e) if explicit => Err(e),
            Err(_) => match engine() {
                Ok(_) => docker(),
                Err(why) => Err(neither(&why)),
            },
        },
        other => Err(Error::new(format!(
            "{var}={other:?}: expected `docker`, `process`, or nothing (choose by what is \
             installed)"
        ))),
    }
}

/// Fails, saying so, if no Docker engine answers though `var=docker` (or
/// `--docker`) asked for one.
pub(crate) fn engine_for(var: &str) -> Result<()> {
    docker_engine().map(drop).map_err(|why| {
        Error::new(format!(
            "the Docker path was asked for ({var}=docker or `--docker`), but no Docker \
             engine answered: {why}. Start Docker, or set DOCKER_HOST."
        ))
    })
}

/// Where a Docker engine answered `GET /_ping`, or why none did. Looks where
/// testcontainers looks: `DOCKER_HOST`, else the usual socket paths.
pub fn docker_engine() -> Result<String, String> {
    if let Some(host) = env::var("DOCKER_HOST")
        .ok()
        .filter(|h| !h.trim().is_empty())
    {
        let host = host.trim();
        return match send_to(host, PING) {
            Some(answer) => answer.map(|()| host.to_owned()),
            // https, ssh, npipe: testcontainers will say whether it can
            // reach it.
            None => Ok(host.to_owned()),
        };
    }
    let mut sockets = vec![PathBuf::from("/var/run/docker.sock")];
    if let Some(runtime) = env::var_os("XDG_RUNTIME_DIR") {
        sockets.push(Path::new(&runtime).join(".docker/run/docker.sock"));
    }
    if let Some(home) = env::var_os("HOME") {
        sockets.push(Path::new(&home).join(".docker/run/docker.sock"));
        sockets.push(Path::new(&home).join(".docker/desktop/docker.sock"));
    }
    let mut tried = Vec::new();
    for socket in sockets.iter().filter(|s| s.exists()) {
        match send_unix(socket, PING) {
            Ok(()) => return Ok(format!("unix://{}", socket.display())),
            Err(why) => tried.push(why),
        }
    }
    if tried.is_empty() {
        Err(format!(
            "DOCKER_HOST is unset and there is no Docker socket at {}",
            sockets
                .iter()
                .map(|s| s.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    } else {
        Err(tried.join("; "))
    }
}

/// Sends `request` (`METHOD /path`, no body) to the engine [`docker_engine`]
/// finds, for what testcontainers does not offer (`docker kill`): an error
/// unless it answers 2xx, or if it is reached through neither a Unix socket
/// nor plain TCP (https, ssh).
pub(crate) fn engine_request(request: &str) -> Result<(), String> {
    let host = docker_engine()?;
    send_to(&host, request).unwrap_or_else(|| {
        Err(format!(
            "{host}: only an engine on a Unix socket or plain TCP is spoken to directly"
        ))
    })
}

const PING: &str = "GET /_ping";
const ENGINE_TIMEOUT: Duration = Duration::from_secs(3);

/// `request` to the engine at `host` (`unix://...`, `tcp://...`,
/// `http://...`); `None` for another scheme.
fn send_to(host: &str, request: &str) -> Option<Result<(), String>> {
    if let Some(path) = host.strip_prefix("unix://") {
        return Some(send_unix(Path::new(path), request));
    }
    host.strip_prefix("tcp://")
        .or_else(|| host.strip_prefix("http://"))
        .map(|addr| send_tcp(addr.trim_end_matches('/'), request))
}

#[cfg(unix)]
fn send_unix(path: &Path, request: &str) -> Result<(), String> {
    use std::os::unix::net::UnixStream;
    let place = path.display();
    let stream =
        UnixStream::connect(path).map_err(|e| format!("{place}: {e}"))?;
    stream
        .set_read_timeout(Some(ENGINE_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(ENGINE_TIMEOUT)))
        .map_err(|e| format!("{place}: {e}"))?;
    send_over(stream, request).map_err(|e| format!("{place}: {e}"))
}

#[cfg(not(unix))]
fn send_unix(path: &Path, _request: &str) -> Result<(), String> {
    Err(format!("{}: unix sockets need a unix", path.display()))
}

fn send_tcp(addr: &str, request: &str) -> Result<(), String> {
    use std::net::{TcpStream, ToSocketAddrs};
    let resolved = addr
        .to_socket_addrs()
        .map_err(|e| format!("{addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr}: no address"))?;
    let stream = TcpStream::connect_timeout(&resolved, ENGINE_TIMEOUT)
        .map_err(|e| format!("{addr}: {e}"))?;
    stream
        .set_read_timeout(Some(ENGINE_TIMEOUT))
        .map_err(|e| format!("{addr}: {e}"))?;
    send_over(stream, request).map_err(|e| format!("{addr}: {e}"))
}

fn send_over(
    mut stream: impl Read + Write,
    request: &str,
) -> Result<(), String> {
    let http = format!(
        "{request} HTTP/1.1\r\nHost: docker\r\nContent-Length: 0\r\nConnection: \
         close\r\n\r\n"
    );
    stream
        .write_all(http.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    // The engine closes the connection after its short answer.
    let _ = stream.take(4096).read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    let status = reply.lines().next().unwrap_or_default();
    if status.starts_with("HTTP/1.")
        && status
            .split_whitespace()
            .nth(1)
            .is_some_and(|code| code.starts_with('2'))
    {
        Ok(())
    } else if status.is_empty() {
        Err(format!("no answer to {request}"))
    } else {
        Err(format!("{request} answered {status:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references() {
        let image = Image::parse("redis:7.0");
        assert_eq!((image.name(), image.tag()), ("redis", "7.0"));
        assert_eq!(image.to_string(), "redis:7.0");
        let image = Image::parse("localhost:5000/team/redis:7.2");
        assert_eq!(
            (image.name(), image.tag()),
            ("localhost:5000/team/redis", "7.2")
        );
        let image = Image::parse("localhost:5000/redis");
        assert_eq!(
            (image.name(), image.tag()),
            ("localhost:5000/redis", "latest")
        );
    }
}
