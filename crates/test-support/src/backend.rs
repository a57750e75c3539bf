//! What runs the test servers: `redis-server` processes, or Docker containers
//! through testcontainers; and how it is chosen.

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
        match env::var(BACKEND_VAR).unwrap_or_default().trim() {
            "docker" => Self::docker(),
            "process" => Self::process(),
            "" => {
                let server = find_server();
                if let Ok(backend) = server.clone().map(Self::with_server) {
                    return Ok(backend);
                }
                // An explicit binary that is not there is a mistake to report,
                // not a reason to go to Docker.
                if env::var_os(SERVER_BIN_VAR).is_some_and(|v| !v.is_empty()) {
                    return server.map(Self::with_server);
                }
                match docker_engine() {
                    Ok(_) => Self::docker(),
                    Err(docker) => Err(Error::new(format!(
                        "no Redis for the tests: `redis-server` is not on PATH, and no Docker \
                         engine answered ({docker}).\n\
                         Either install Redis (`apt-get install redis-server redis-tools` on \
                         Debian/Ubuntu, `brew install redis` on macOS; or set {SERVER_BIN_VAR} \
                         to a redis-server binary), or start Docker (the tests then run \
                         {image} in containers; set DOCKER_HOST if its socket is elsewhere).",
                        image = Image::from_env()
                    ))),
                }
            }
            other => Err(Error::new(format!(
                "{BACKEND_VAR}={other:?}: expected `docker`, `process`, or nothing (choose by \
                 what is installed)"
            ))),
        }
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
        docker_engine().map_err(|why| {
            Error::new(format!(
                "the Docker path was asked for ({BACKEND_VAR}=docker or `--docker`), but no \
                 Docker engine answered: {why}. Start Docker, or set DOCKER_HOST."
            ))
        })?;
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
        match env::var(IMAGE_VAR) {
            Ok(image) if !image.trim().is_empty() => Self::parse(&image),
            _ => Self::parse(DEFAULT_IMAGE),
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

fn is_executable(path: &Path) -> bool {
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

/// Where a Docker engine answered `GET /_ping`, or why none did. Looks where
/// testcontainers looks: `DOCKER_HOST`, else the usual socket paths.
pub fn docker_engine() -> Result<String, String> {
    if let Some(host) = env::var("DOCKER_HOST")
        .ok()
        .filter(|h| !h.trim().is_empty())
    {
        let host = host.trim();
        if let Some(path) = host.strip_prefix("unix://") {
            return ping_unix(Path::new(path)).map(|()| host.to_owned());
        }
        if let Some(addr) = host
            .strip_prefix("tcp://")
            .or_else(|| host.strip_prefix("http://"))
        {
            return ping_tcp(addr.trim_end_matches('/'))
                .map(|()| host.to_owned());
        }
        // https, ssh, npipe: testcontainers will say whether it can reach it.
        return Ok(host.to_owned());
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
        match ping_unix(socket) {
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

const PING: &[u8] =
    b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n";
const PING_TIMEOUT: Duration = Duration::from_secs(3);

#[cfg(unix)]
fn ping_unix(path: &Path) -> Result<(), String> {
    use std::os::unix::net::UnixStream;
    let place = path.display();
    let stream =
        UnixStream::connect(path).map_err(|e| format!("{place}: {e}"))?;
    stream
        .set_read_timeout(Some(PING_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(PING_TIMEOUT)))
        .map_err(|e| format!("{place}: {e}"))?;
    ping_over(stream).map_err(|e| format!("{place}: {e}"))
}

#[cfg(not(unix))]
fn ping_unix(path: &Path) -> Result<(), String> {
    Err(format!("{}: unix sockets need a unix", path.display()))
}

fn ping_tcp(addr: &str) -> Result<(), String> {
    use std::net::{TcpStream, ToSocketAddrs};
    let resolved = addr
        .to_socket_addrs()
        .map_err(|e| format!("{addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr}: no address"))?;
    let stream = TcpStream::connect_timeout(&resolved, PING_TIMEOUT)
        .map_err(|e| format!("{addr}: {e}"))?;
    stream
        .set_read_timeout(Some(PING_TIMEOUT))
        .map_err(|e| format!("{addr}: {e}"))?;
    ping_over(stream).map_err(|e| format!("{addr}: {e}"))
}

fn ping_over(mut stream: impl Read + Write) -> Result<(), String> {
    stream.write_all(PING).map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    // The engine closes the connection after its short answer.
    let _ = stream.take(4096).read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    let status = reply.lines().next().unwrap_or_default();
    if status.starts_with("HTTP/1.")
        && status.split_whitespace().nth(1) == Some("200")
    {
        Ok(())
    } else if status.is_empty() {
        Err("no answer to GET /_ping".to_owned())
    } else {
        Err(format!("GET /_ping answered {status:?}"))
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
