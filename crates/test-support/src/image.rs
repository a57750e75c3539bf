//! A local Redis image built from the installed `redis-server`, for a
//! machine that has a Docker engine but no registry to pull from: a
//! `FROM scratch` image holding `redis-server`, `redis-cli`, the libraries
//! `ldd` lists for them and the ELF loader, under the name the tests ask for
//! (`redis:7.0` by default). Elsewhere the official image is simply pulled.
//!
//! The image behaves like the official one for the tests: no shell and no
//! entrypoint script, so the command is always `redis-server ...`, which the
//! official image's entrypoint runs as given.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::backend::{Image, find_on_path};
use crate::error::{Error, Result};

const DOCKERFILE: &str = "\
FROM scratch
COPY rootfs/ /
ENV PATH=/usr/local/bin
WORKDIR /data
EXPOSE 6379
CMD [\"redis-server\"]
";

/// Builds `image` from `server` and `cli` (symbolic links followed: Debian's
/// `redis-server` is a link to `redis-check-rdb`, and Redis picks its mode
/// from the name it runs under), then checks that a container of it runs
/// `redis-server --version`. Prints what it does on standard error.
pub fn build_local_image(
    image: &Image,
    server: &Path,
    cli: &Path,
) -> Result<()> {
    let docker = find_on_path("docker").ok_or_else(|| {
        Error::new("the `docker` command is not on PATH: it builds the image")
    })?;
    let context = Context::new()?;
    let rootfs = context.0.join("rootfs");
    for dir in ["usr/local/bin", "data", "etc", "tmp"] {
        create_dir(&rootfs.join(dir))?;
    }
    copy(server, &rootfs.join("usr/local/bin/redis-server"))?;
    copy(cli, &rootfs.join("usr/local/bin/redis-cli"))?;
    let mut libraries = libraries_of(server)?;
    libraries.extend(libraries_of(cli)?);
    libraries.sort();
    libraries.dedup();
    for library in &libraries {
        let inside = rootfs.join(library.strip_prefix("/").unwrap_or(library));
        if let Some(dir) = inside.parent() {
            create_dir(dir)?;
        }
        copy(library, &inside)?;
    }
    // Not needed to run as root (the default); they let `--user redis` work.
    write(
        &rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nredis:x:999:999::/data:/sbin/nologin\n",
    )?;
    write(&rootfs.join("etc/group"), "root:x:0:\nredis:x:999:\n")?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(
            rootfs.join("tmp"),
            fs::Permissions::from_mode(0o1777),
        )
        .map_err(|e| Error::new(format!("chmod 1777 tmp: {e}")))?;
    }
    write(&context.0.join("Dockerfile"), DOCKERFILE)?;

    // The legacy builder: the engine may have no BuildKit (buildx) plugin.
    let tag = image.to_string();
    run(Command::new(&docker)
        .env("DOCKER_BUILDKIT", "0")
        .args(["build", "-q", "-t", &tag])
        .arg(&context.0))?;
    let version = run(Command::new(&docker).args([
        "run",
        "--rm",
        "--network",
        "none",
        &tag,
        "redis-server",
        "--version",
    ]))?;
    if !version.contains("Redis server v=") {
        return Err(Error::new(format!(
            "a container of {tag} did not print redis-server's version: {version:?}"
        )));
    }
    eprintln!(
        "trt-redis: built {tag} from {} ({} libraries): {}",
        server.display(),
        libraries.len(),
        version.trim()
    );
    Ok(())
}

/// The absolute paths `ldd` lists for `binary`, the loader included.
fn libraries_of(binary: &Path) -> Result<Vec<PathBuf>> {
    let text = run(Command::new("ldd").arg(binary))?;
    let mut libraries = Vec::new();
    for line in text.lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`, or the
        // loader `/lib64/ld-linux-x86-64.so.2 (0x...)`, or the vDSO (no file).
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        match path {
            Some(path) if path.starts_with('/') => {
                libraries.push(PathBuf::from(path))
            }
            Some("not") => {
                return Err(Error::new(format!(
                    "ldd {}: a library is missing: {line}",
                    binary.display()
                )));
            }
            _ => {}
        }
    }
    if !libraries
        .iter()
        .any(|l| l.to_string_lossy().contains("ld-linux"))
    {
        return Err(Error::new(format!(
            "ldd {} names no ELF loader (ld-linux): the image could not run it:\n{text}",
            binary.display()
        )));
    }
    Ok(libraries)
}

/// Runs `command`, printed first; its standard output, or an error with
/// what it printed.
fn run(command: &mut Command) -> Result<String> {
    let shown = format!(
        "{} {}",
        command.get_program().to_string_lossy(),
        command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    );
    eprintln!("$ {shown}");
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::new(format!("could not run `{shown}`: {e}")))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(Error::new(format!(
            "`{shown}` failed ({}):\n{stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

fn create_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir)
        .map_err(|e| Error::new(format!("mkdir {}: {e}", dir.display())))
}

/// Copies the file `from` points to (links followed), mode included.
fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to).map(drop).map_err(|e| {
        Error::new(format!("cp {} {}: {e}", from.display(), to.display()))
    })
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text)
        .map_err(|e| Error::new(format!("write {}: {e}", path.display())))
}

/// The build context, a temporary directory removed when dropped.
struct Context(PathBuf);

impl Context {
    fn new() -> Result<Self> {
        let dir = std::env::temp_dir()
            .join(format!("trt-redis-image-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        create_dir(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
