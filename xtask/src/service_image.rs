//! `cargo xtask service-image [--check]`: the standalone service's image,
//! for a machine whose Docker engine cannot pull (no registry), so neither
//! the Dockerfile's `rust:1-bookworm` builder nor its `debian:bookworm-slim`
//! runtime is there.
//!
//! The image is built `FROM scratch` from what this machine has: the
//! binary as the Dockerfile builds it (`cargo build --profile dist -p
//! rate-tier-service`), the libraries `ldd`
//! lists for it and the ELF loader, `/etc/passwd` and `/etc/group` with the
//! Dockerfile's non-root user, and what the Dockerfile's health check runs
//! (`/bin/bash`, `head`, `grep`, and their libraries). The runtime's
//! instructions are read from the repository's `Dockerfile` (its last stage:
//! `EXPOSE`, `USER`, `ENTRYPOINT`, `CMD`, `HEALTHCHECK`, `ENV`, `WORKDIR`,
//! `LABEL`; its `COPY`s of the repository's files), so the local image runs
//! as the Dockerfile's would. No CA certificates: the service links no TLS.
//!
//! `--check` then runs a container of it on published free loopback ports
//! and asks it: `/healthcheck`, a `/json` request that passes and one that is
//! limited (the rules the image holds, `examples/ratelimit`), the gRPC port
//! answers HTTP/2, the health check Docker runs turns `healthy`, and the
//! service runs as the non-root user. The container is removed in the end,
//! whatever happened. Without a `docker` command, or without an engine that
//! answers, the task fails.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use crate::cmd::{Cmd, Result, find_on_path, project_root};

/// The tag of the image built.
pub(crate) const IMAGE: &str = "rate-tier-service:local";

/// The label of the check's containers.
const LABEL: &str = "tower-rate-tier.xtask=service-image";

/// The container's HTTP and gRPC ports (the Dockerfile's `EXPOSE`, the
/// service's defaults).
const HTTP_PORT: u16 = 8080;
const GRPC_PORT: u16 = 8081;
const DEBUG_PORT: u16 = 6070;

/// The programs the Dockerfile's `HEALTHCHECK` runs, and where they go.
const HEALTH_TOOLS: [(&str, &str); 3] = [
    ("bash", "bin/bash"),
    ("head", "usr/bin/head"),
    ("grep", "usr/bin/grep"),
];

/// How long the container has to answer, and Docker's health check to pass.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Builds [`IMAGE`], then, with `check`, runs and asks a container of it.
pub(crate) fn service_image(check: bool) -> Result<()> {
    let docker = docker()?;
    let binary = build_binary()?;
    let dockerfile_path = project_root().join("Dockerfile");
    let dockerfile = fs::read_to_string(&dockerfile_path).map_err(|e| {
        format!("could not read {}: {e}", dockerfile_path.display())
    })?;
    let runtime = Runtime::parse(&dockerfile)?;
    build_image(&docker, &binary, &runtime)?;
    println!("xtask: built {IMAGE} from {}", binary.display());
    if check {
        check_image(&docker, &runtime)?;
        println!("xtask: {IMAGE} passed its check");
    }
    Ok(())
}

/// The `docker` command, with an engine that answers: an error otherwise
/// (never a check that passes without running).
fn docker() -> Result<PathBuf> {
    let docker = find_on_path("docker").ok_or_else(|| {
        "the `docker` command is not on PATH: `cargo xtask service-image` builds a \
         Docker image (install Docker, or run the Dockerfile's build elsewhere)"
            .to_owned()
    })?;
    if !Cmd::new(&docker).arg("info").succeeds_quietly() {
        return Err(format!(
            "no Docker engine answered (`{} info` failed): start the engine, or run \
             as a user that may use it",
            docker.display()
        ));
    }
    Ok(docker)
}

/// `cargo build --profile dist -p rate-tier-service`: the binary's path.
fn build_binary() -> Result<PathBuf> {
    let messages = Cmd::cargo()
        .args(["build", "--profile", "dist", "-p", "rate-tier-service"])
        .args(["--bin", "rate-tier-service"])
        .arg("--message-format=json-render-diagnostics")
        .read_stdout()?;
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|message| {
            message["reason"] == "compiler-artifact"
                && message["target"]["name"] == "rate-tier-service"
                && message["executable"].is_string()
        })
        .and_then(|artifact| artifact["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| {
            "cargo built no `rate-tier-service` executable".to_owned()
        })
}

/// What the Dockerfile's last stage (the runtime) says.
#[derive(Debug, Default, PartialEq, Eq)]
struct Runtime {
    /// The instructions the local image repeats as they are written, in
    /// order (`EXPOSE`, `USER`, `ENTRYPOINT`, `CMD`, `HEALTHCHECK`, ...).
    instructions: Vec<String>,
    /// `COPY --from=<builder> <binary> DEST`: where the binary goes.
    binary_dest: Option<String>,
    /// `COPY SRC DEST` of the repository's files (the rules).
    copies: Vec<(String, String)>,
    /// `USER UID[:GID]`, numeric.
    user: Option<(u32, u32)>,
}

impl Runtime {
    /// Reads the last stage of `dockerfile`.
    fn parse(dockerfile: &str) -> Result<Self> {
        let instructions = instructions(dockerfile);
        let start = instructions
            .iter()
            .rposition(|i| keyword(i) == "FROM")
            .ok_or("the Dockerfile has no FROM")?;
        let mut runtime = Runtime::default();
        for instruction in &instructions[start + 1..] {
            let rest = instruction[keyword(instruction).len()..].trim();
            match keyword(instruction).as_str() {
                "EXPOSE" | "ENTRYPOINT" | "CMD" | "HEALTHCHECK" | "ENV"
                | "WORKDIR" | "LABEL" | "STOPSIGNAL" => {
                    runtime.instructions.push(instruction.clone())
                }
                "USER" => {
                    runtime.user = Some(numeric_user(rest)?);
                    runtime.instructions.push(instruction.clone());
                }
                "COPY" => {
                    let words: Vec<&str> = rest.split_whitespace().collect();
                    match words.as_slice() {
                        [from, _, dest] if from.starts_with("--from=") => {
                            runtime.binary_dest = Some((*dest).to_owned());
                        }
                        [src, dest] if !src.starts_with("--") => runtime
                            .copies
                            .push(((*src).to_owned(), (*dest).to_owned())),
                        _ => {
                            return Err(format!(
                                "the Dockerfile's runtime: a COPY this task cannot repeat: \
                                 {instruction}"
                            ));
                        }
                    }
                }
                // RUN (the user is written into /etc/passwd here) and the
                // rest: nothing to repeat in a scratch image.
                _ => {}
            }
        }
        if runtime.binary_dest.is_none() {
            return Err(
                "the Dockerfile's runtime copies no binary from the builder \
                        (COPY --from=builder ...)"
                    .to_owned(),
            );
        }
        if !runtime
            .instructions
            .iter()
            .any(|i| keyword(i) == "HEALTHCHECK")
        {
            return Err(
                "the Dockerfile's runtime has no HEALTHCHECK".to_owned()
            );
        }
        Ok(runtime)
    }

    /// The Dockerfile of the local image.
    fn dockerfile(&self) -> String {
        let mut text = String::from(
            "# cargo xtask service-image: the Dockerfile's runtime, FROM scratch\n\
             FROM scratch\nCOPY rootfs/ /\nENV PATH=/usr/local/bin:/usr/bin:/bin\n",
        );
        for instruction in &self.instructions {
            text.push_str(instruction);
            text.push('\n');
        }
        text
    }

    /// The `USER`'s uid and gid (root when the Dockerfile names none).
    fn uid_gid(&self) -> (u32, u32) {
        self.user.unwrap_or((0, 0))
    }
}

/// The Dockerfile's instructions, one line each: continuation lines joined,
/// comments and blank lines left out.
fn instructions(dockerfile: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#')
            || (trimmed.is_empty() && current.is_empty())
        {
            continue;
        }
        let (text, continued) = match trimmed.strip_suffix('\\') {
            Some(text) => (text.trim_end(), true),
            None => (trimmed, false),
        };
        if !current.is_empty() && !text.is_empty() {
            current.push(' ');
        }
        current.push_str(text);
        if !continued && !current.is_empty() {
            out.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// An instruction's keyword, upper case.
fn keyword(instruction: &str) -> String {
    instruction
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_ascii_uppercase()
}

/// `UID[:GID]`: numeric, so that the image needs no lookup to switch.
fn numeric_user(user: &str) -> Result<(u32, u32)> {
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    let number = |s: &str| {
        s.parse::<u32>().map_err(|_| {
            format!("the Dockerfile's USER {user:?}: this task needs UID:GID numbers")
        })
    };
    Ok((number(uid)?, number(gid)?))
}

/// A build context in the temporary directory, removed when dropped.
struct Context {
    dir: PathBuf,
    libraries: Vec<PathBuf>,
}

impl Context {
    fn new() -> Result<Self> {
        let dir = std::env::temp_dir()
            .join(format!("trt-service-image-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        create_dir(&dir.join("rootfs"))?;
        Ok(Self {
            dir,
            libraries: Vec::new(),
        })
    }

    fn path(&self, inside: &str) -> PathBuf {
        self.dir.join("rootfs").join(inside.trim_start_matches('/'))
    }

    /// `text` as the file `inside` the image.
    fn file(&self, inside: &str, text: &str) -> Result<()> {
        let path = self.path(inside);
        create_dir(path.parent().expect("a file inside the image"))?;
        fs::write(&path, text)
            .map_err(|e| format!("write {}: {e}", path.display()))
    }

    /// The file `from` (links followed, mode kept) as `inside`.
    fn copy(&self, from: &Path, inside: &str) -> Result<()> {
        let to = self.path(inside);
        create_dir(to.parent().expect("a file inside the image"))?;
        fs::copy(from, &to)
            .map(drop)
            .map_err(|e| format!("cp {} {}: {e}", from.display(), to.display()))
    }

    /// The executable `from` as `inside`, with the libraries it needs.
    fn binary(&mut self, from: &Path, inside: &str) -> Result<()> {
        self.copy(from, inside)?;
        let libraries = libraries_of(from)?;
        if !libraries
            .iter()
            .any(|l| l.to_string_lossy().contains("ld-linux"))
        {
            return Err(format!(
                "ldd {} names no ELF loader (ld-linux): a scratch image could not run it \
                 (a static binary needs no image of this kind)",
                from.display()
            ));
        }
        self.libraries.extend(libraries);
        Ok(())
    }

    /// A `COPY SRC DEST` of the repository: a file, or a directory's
    /// contents (below DEST).
    fn repository_copy(&self, src: &Path, dest: &str) -> Result<()> {
        if src.is_dir() {
            let entries = fs::read_dir(src)
                .map_err(|e| format!("ls {}: {e}", src.display()))?;
            for entry in entries {
                let entry =
                    entry.map_err(|e| format!("ls {}: {e}", src.display()))?;
                let name = entry.file_name();
                let inside = format!(
                    "{}/{}",
                    dest.trim_end_matches('/'),
                    name.to_string_lossy()
                );
                self.repository_copy(&entry.path(), &inside)?;
            }
            Ok(())
        } else if dest.ends_with('/') {
            let name = src.file_name().ok_or("a COPY of no file")?;
            self.copy(src, &format!("{dest}{}", name.to_string_lossy()))
        } else {
            self.copy(src, dest)
        }
    }

    /// Copies the libraries in, writes the Dockerfile, builds `IMAGE` (the
    /// legacy builder: the engine may have no BuildKit).
    fn build(mut self, docker: &Path, dockerfile: &str) -> Result<()> {
        let mut libraries = std::mem::take(&mut self.libraries);
        libraries.sort();
        libraries.dedup();
        for library in &libraries {
            self.copy(library, &library.to_string_lossy())?;
        }
        let path = self.dir.join("Dockerfile");
        fs::write(&path, dockerfile)
            .map_err(|e| format!("write {}: {e}", path.display()))?;
        Cmd::new(docker)
            .env("DOCKER_BUILDKIT", "0")
            .args(["build", "-q", "-t", IMAGE])
            .arg(&self.dir)
            .run()
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn build_image(docker: &Path, binary: &Path, runtime: &Runtime) -> Result<()> {
    let mut context = Context::new()?;
    let dest = runtime.binary_dest.as_deref().expect("checked by parse");
    context.binary(binary, dest)?;
    for (tool, inside) in HEALTH_TOOLS {
        let path = find_on_path(tool).ok_or_else(|| {
            format!("`{tool}` is not on PATH: the image's HEALTHCHECK runs it")
        })?;
        context.binary(&path, inside)?;
    }
    for (src, dest) in &runtime.copies {
        context.repository_copy(&project_root().join(src), dest)?;
    }
    let (uid, gid) = runtime.uid_gid();
    context.file(
        "etc/passwd",
        &format!(
            "root:x:0:0:root:/root:/usr/sbin/nologin\n\
             ratelimit:x:{uid}:{gid}::/nonexistent:/usr/sbin/nologin\n"
        ),
    )?;
    context.file("etc/group", &format!("root:x:0:\nratelimit:x:{gid}:\n"))?;
    create_dir(&context.path("tmp"))?;
    set_mode(&context.path("tmp"), 0o1777)?;
    context.build(docker, &runtime.dockerfile())
}

/// The absolute paths `ldd` lists for `binary`, the loader included.
fn libraries_of(binary: &Path) -> Result<Vec<PathBuf>> {
    let output = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| {
            format!("could not run `ldd {}`: {e}", binary.display())
        })?;
    if !output.status.success() {
        return Err(format!(
            "`ldd {}` failed: {}{}",
            binary.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    parse_ldd(&String::from_utf8_lossy(&output.stdout)).map_err(|line| {
        format!("ldd {}: a library is missing: {line}", binary.display())
    })
}

/// The files of `ldd`'s lines: `libc.so.6 => /lib/.../libc.so.6 (0x..)`,
/// the loader `/lib64/ld-linux-x86-64.so.2 (0x..)`, the vDSO (no file); a
/// missing library is the error, its line.
fn parse_ldd(text: &str) -> std::result::Result<Vec<PathBuf>, String> {
    let mut libraries = Vec::new();
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        match path {
            Some(path) if path.starts_with('/') => {
                libraries.push(PathBuf::from(path))
            }
            Some("not") => return Err(line.trim().to_owned()),
            _ => {}
        }
    }
    Ok(libraries)
}

fn create_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(|e| format!("chmod {mode:o} {}: {e}", path.display()))
    }
    #[cfg(not(unix))]
    {
        let _ = (path, mode);
        Ok(())
    }
}

/// A running container, removed (`docker rm -f`) when dropped.
struct Container<'a> {
    docker: &'a Path,
    id: String,
}

impl Container<'_> {
    /// The host address `docker port` gives for the container's `port`.
    fn published(&self, port: u16) -> Result<SocketAddr> {
        let text = Cmd::new(self.docker)
            .args(["port", &self.id, &format!("{port}/tcp")])
            .read()?;
        let line = text.lines().next().unwrap_or("").trim();
        line.parse().map_err(|_| {
            format!(
                "`docker port` gave {text:?} for {port}/tcp, not an address"
            )
        })
    }

    /// `docker inspect --format FORMAT` of the container.
    fn inspect(&self, format: &str) -> Result<String> {
        Cmd::new(self.docker)
            .args(["inspect", "--format", format, &self.id])
            .read()
            .map(|s| s.trim().to_owned())
    }

    /// What the container logged, for an error.
    fn logs(&self) -> String {
        let output = Cmd::new(self.docker)
            .args(["logs", &self.id])
            .command()
            .output();
        match output {
            Ok(o) => format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => format!("(docker logs failed: {e})"),
        }
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = Cmd::new(self.docker).args(["rm", "-f", &self.id]).read();
    }
}

/// Runs and asks a container of [`IMAGE`].
fn check_image(docker: &Path, runtime: &Runtime) -> Result<()> {
    // The binary runs, and the rules the image holds are valid.
    let version = Cmd::new(docker)
        .args(["run", "--rm", "--network", "none", IMAGE, "--version"])
        .read()?;
    expect(
        version.starts_with("rate-tier-service "),
        "--version",
        &version,
    )?;
    // The rules the Dockerfile copies, where the image's environment has
    // the service read them.
    let rules = runtime
        .copies
        .iter()
        .find(|(src, _)| src.trim_end_matches('/') == "examples/ratelimit")
        .map(|(_, dest)| dest.clone())
        .ok_or("the Dockerfile copies no examples/ratelimit")?;
    Cmd::new(docker)
        .args(["run", "--rm", "--network", "none", IMAGE])
        .args(["check-config", &rules])
        .read()?;

    // A container an interrupted check left behind (Ctrl-C skips the
    // removal below) goes first.
    let leftovers = Cmd::new(docker)
        .args(["ps", "-aq", "--filter", &format!("label={LABEL}")])
        .read()?;
    for id in leftovers.split_whitespace() {
        Cmd::new(docker).args(["rm", "-f", id]).read()?;
    }
    // The service, on free loopback ports of the host (Docker picks them),
    // with Docker's health check every second instead of every ten.
    let id = Cmd::new(docker)
        .args([
            "run",
            "-d",
            "--label",
            LABEL,
            "--health-interval=1s",
            "--health-start-period=30s",
        ])
        .arg(format!("--publish=127.0.0.1::{HTTP_PORT}"))
        .arg(format!("--publish=127.0.0.1::{GRPC_PORT}"))
        .arg(format!("--publish=127.0.0.1::{DEBUG_PORT}"))
        .arg(IMAGE)
        .read()?
        .trim()
        .to_owned();
    let container = Container { docker, id };
    asked(&container, runtime).map_err(|e| {
        format!("{e}\n--- the container's log ---\n{}", container.logs())
    })
}

fn asked(container: &Container<'_>, runtime: &Runtime) -> Result<()> {
    let http = container.published(HTTP_PORT)?;
    let grpc = container.published(GRPC_PORT)?;
    println!("xtask: the container's HTTP on {http}, gRPC on {grpc}");

    // /healthcheck: retried while the service starts (Docker's proxy
    // accepts, then closes, until the container listens).
    let deadline = Instant::now() + READY_TIMEOUT;
    let health = loop {
        match request(http, "GET", "/healthcheck", "") {
            Ok(answer) if answer.status == 200 => break answer,
            Ok(answer) if Instant::now() > deadline => {
                return Err(format!("/healthcheck answered {answer:?}"));
            }
            Err(e) if Instant::now() > deadline => {
                return Err(format!("/healthcheck never answered: {e}"));
            }
            _ => thread::sleep(Duration::from_millis(250)),
        }
    };
    expect(health.body == "OK", "GET /healthcheck", &health.body)?;
    println!("xtask: GET /healthcheck: 200 {}", health.body);

    // A request the rules let through, and one they always refuse
    // (examples/ratelimit: 60/min per address; 192.0.2.66 never).
    let json = |address: &str| {
        format!(
            r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"remote_address","value":"{address}"}}]}}]}}"#
        )
    };
    let ok = request(http, "POST", "/json", &json("10.0.0.1"))?;
    let value: serde_json::Value = serde_json::from_str(&ok.body)
        .map_err(|e| format!("/json answered no JSON ({e}): {ok:?}"))?;
    expect(
        ok.status == 200
            && value["overallCode"] == "OK"
            && value["statuses"][0]["currentLimit"]["name"] == "per_address",
        "POST /json for 10.0.0.1 (200, OK, per_address)",
        &format!("{ok:?}"),
    )?;
    println!("xtask: POST /json 10.0.0.1: {} {}", ok.status, ok.body);
    let over = request(http, "POST", "/json", &json("192.0.2.66"))?;
    let value: serde_json::Value = serde_json::from_str(&over.body)
        .map_err(|e| format!("/json answered no JSON ({e}): {over:?}"))?;
    expect(
        over.status == 429 && value["overallCode"] == "OVER_LIMIT",
        "POST /json for 192.0.2.66 (429, OVER_LIMIT)",
        &format!("{over:?}"),
    )?;
    println!(
        "xtask: POST /json 192.0.2.66: {} {}",
        over.status, over.body
    );

    // The debug listener: the rules, as envoyproxy/ratelimit prints them.
    let debug = container.published(DEBUG_PORT)?;
    let rlconfig = request(debug, "GET", "/rlconfig", "")?;
    expect(
        rlconfig.status == 200
            && rlconfig.body.lines().any(|line| {
                line.starts_with(
                    "edge.remote_address: unit=MINUTE requests_per_unit=60",
                )
            }),
        "GET /rlconfig on the debug port (edge.remote_address: unit=MINUTE ...)",
        &format!("{rlconfig:?}"),
    )?;
    println!("xtask: GET /rlconfig on {debug}: {}", rlconfig.status);

    // The gRPC listener speaks HTTP/2: its first frame is SETTINGS.
    let frame = http2_first_frame(grpc)?;
    expect(
        frame == 4,
        "the gRPC port's first HTTP/2 frame (SETTINGS, 4)",
        &frame.to_string(),
    )?;
    println!("xtask: the gRPC port answers HTTP/2 (SETTINGS)");

    // The Dockerfile's HEALTHCHECK, as Docker runs it.
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let status = container.inspect("{{.State.Health.Status}}")?;
        match status.as_str() {
            "healthy" => break,
            "unhealthy" => {
                return Err(format!(
                    "Docker's health check says unhealthy: {}",
                    container.inspect("{{json .State.Health}}")?
                ));
            }
            _ if Instant::now() > deadline => {
                return Err(format!(
                    "Docker's health check still {status:?} after {READY_TIMEOUT:?}: {}",
                    container.inspect("{{json .State.Health}}")?
                ));
            }
            _ => thread::sleep(Duration::from_millis(500)),
        }
    }
    println!("xtask: Docker's HEALTHCHECK: healthy");

    // The service (the container's process 1) runs as the Dockerfile's user.
    let (uid, _) = runtime.uid_gid();
    let status = Cmd::new(container.docker)
        .args(["exec", &container.id, "/bin/bash", "-c"])
        .arg("while read -r key real rest; do [ \"$key\" = Uid: ] && echo \"$real\"; done < /proc/1/status; exit 0")
        .read()?;
    expect(
        uid != 0 && status.trim() == uid.to_string(),
        &format!("the service's uid (the Dockerfile's USER, {uid}, not root)"),
        status.trim(),
    )?;
    println!("xtask: the service runs as uid {uid}");
    Ok(())
}

fn expect(ok: bool, what: &str, got: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(format!("{what}: not what the check expects: {got}"))
    }
}

/// An HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    body: String,
}

/// One HTTP/1.1 request on a new connection (`Connection: close`).
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> Result<Answer> {
    let timeout = Duration::from_secs(5);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream
        .write_all(format!("{head}{body}").as_bytes())
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .map_err(|e| format!("{method} {path}: {e}"))?;
    parse_answer(&String::from_utf8_lossy(&answer)).ok_or_else(|| {
        format!("{method} {path}: no HTTP answer ({} bytes)", answer.len())
    })
}

/// The status and body of an HTTP/1.1 answer with a `Content-Length`.
fn parse_answer(text: &str) -> Option<Answer> {
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some(Answer {
        status,
        body: body.to_owned(),
    })
}

/// Sends HTTP/2's preface and an empty SETTINGS frame; the type of the
/// first frame the server sends back.
fn http2_first_frame(addr: SocketAddr) -> Result<u8> {
    let timeout = Duration::from_secs(5);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    // length 0, type SETTINGS (4), no flags, stream 0.
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    stream
        .write_all(&hello)
        .map_err(|e| format!("HTTP/2 to {addr}: {e}"))?;
    let mut header = [0u8; 9];
    stream
        .read_exact(&mut header)
        .map_err(|e| format!("HTTP/2 from {addr}: no frame ({e})"))?;
    Ok(header[3])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_join_continuations_and_drop_comments() {
        let text = "FROM a AS b\n# a comment\nRUN x \\\n    && y\n\nHEALTHCHECK --interval=1s \\\n  # inside\n  CMD [\"z\"]\n";
        assert_eq!(
            instructions(text),
            [
                "FROM a AS b",
                "RUN x && y",
                "HEALTHCHECK --interval=1s CMD [\"z\"]"
            ]
        );
    }

    #[test]
    fn the_runtime_is_the_last_stage() {
        let text = "FROM rust AS builder\nEXPOSE 1\nCOPY . .\n\
                    FROM debian\nRUN useradd x\nCOPY --from=builder /b /usr/local/bin/b\n\
                    COPY examples/ratelimit/ /etc/r/\nUSER 7:8\nEXPOSE 8081 8080\n\
                    ENTRYPOINT [\"/usr/local/bin/b\"]\nHEALTHCHECK CMD [\"true\"]\n";
        let runtime = Runtime::parse(text).unwrap();
        assert_eq!(runtime.binary_dest.as_deref(), Some("/usr/local/bin/b"));
        assert_eq!(
            runtime.copies,
            [("examples/ratelimit/".to_owned(), "/etc/r/".to_owned())]
        );
        assert_eq!(runtime.user, Some((7, 8)));
        assert_eq!(
            runtime.instructions,
            [
                "USER 7:8",
                "EXPOSE 8081 8080",
                "ENTRYPOINT [\"/usr/local/bin/b\"]",
                "HEALTHCHECK CMD [\"true\"]"
            ]
        );
        assert!(runtime.dockerfile().starts_with("# cargo xtask"));
        assert!(
            runtime
                .dockerfile()
                .contains("FROM scratch\nCOPY rootfs/ /\n")
        );
        assert!(
            Runtime::parse(
                "FROM a\nCOPY --from=b /x /y\nUSER app\nHEALTHCHECK NONE\n"
            )
            .is_err()
        );
        assert!(
            Runtime::parse("FROM a\nHEALTHCHECK CMD true\n").is_err(),
            "no binary"
        );
        assert!(
            Runtime::parse("FROM a\nCOPY --from=b /x /y\n").is_err(),
            "no health check"
        );
    }

    /// The repository's Dockerfile is one this task can repeat: its binary,
    /// its rules, a numeric non-root user, the ports the check asks, a
    /// HEALTHCHECK on /healthcheck with the tools the image gets.
    #[test]
    fn the_repository_dockerfile_parses() {
        let text =
            fs::read_to_string(project_root().join("Dockerfile")).unwrap();
        let runtime = Runtime::parse(&text).unwrap();
        assert_eq!(
            runtime.binary_dest.as_deref(),
            Some("/usr/local/bin/rate-tier-service")
        );
        assert!(
            runtime
                .copies
                .iter()
                .all(|(src, _)| project_root().join(src).exists())
        );
        let (uid, _) = runtime.uid_gid();
        assert_ne!(uid, 0, "a non-root user");
        let expose = runtime
            .instructions
            .iter()
            .find(|i| keyword(i) == "EXPOSE")
            .unwrap();
        for port in [HTTP_PORT, GRPC_PORT, DEBUG_PORT] {
            assert!(
                expose.split_whitespace().any(|p| p == port.to_string()),
                "{expose}"
            );
        }
        let health = runtime
            .instructions
            .iter()
            .find(|i| keyword(i) == "HEALTHCHECK")
            .unwrap();
        assert!(
            health.contains(&format!("/dev/tcp/127.0.0.1/{HTTP_PORT}")),
            "{health}"
        );
        assert!(health.contains("GET /healthcheck "), "{health}");
        for (tool, _) in HEALTH_TOOLS {
            assert!(health.contains(tool), "{tool}: {health}");
        }
        // Every interface, by envoyproxy/ratelimit's variables (the
        // service's tests parse them as the binary does).
        let env = runtime
            .instructions
            .iter()
            .find(|i| keyword(i) == "ENV")
            .unwrap();
        for var in ["HOST=0.0.0.0", "GRPC_HOST=0.0.0.0", "DEBUG_HOST=0.0.0.0"] {
            assert!(env.split_whitespace().any(|w| w == var), "{env}");
        }
    }

    #[test]
    fn ldd_lines() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text).unwrap(),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
        assert!(parse_ldd("\tlibfoo.so.1 => not found\n").is_err());
    }

    #[test]
    fn http_answers() {
        let answer = parse_answer(
            "HTTP/1.1 429 Too Many Requests\r\ncontent-length: 2\r\n\r\n{}",
        )
        .unwrap();
        assert_eq!((answer.status, answer.body.as_str()), (429, "{}"));
        assert!(parse_answer("garbage").is_none());
    }
}
