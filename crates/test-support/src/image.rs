//! Local images built from the installed servers, for a machine that has a
//! Docker engine but no registry to pull from: `FROM scratch` images holding
//! the server's binaries, the libraries `ldd` lists for them and the ELF
//! loader, under the name the tests ask for (`redis:7.0`, `postgres:15` by
//! default). Elsewhere the official images are simply pulled.
//!
//! [`Rootfs`] is the build context both are made in; this file builds the
//! Redis image ([`build_local_image`]), `postgres/image.rs` the PostgreSQL
//! one.
//!
//! The Redis image behaves like the official one for the tests: no shell and
//! no entrypoint script, so the command is always `redis-server ...`, which
//! the official image's entrypoint runs as given.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::backend::{Image, find_on_path};
use crate::error::{Error, Result};

const REDIS_DOCKERFILE: &str = "\
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
    let docker = docker_cli()?;
    let mut rootfs = Rootfs::new("redis")?;
    for dir in ["usr/local/bin", "data", "etc"] {
        rootfs.dir(dir, 0o755)?;
    }
    rootfs.dir("tmp", 0o1777)?;
    rootfs.binary(server, "usr/local/bin/redis-server")?;
    rootfs.binary(cli, "usr/local/bin/redis-cli")?;
    // Not needed to run as root (the default); they let `--user redis` work.
    rootfs.file(
        "etc/passwd",
        "root:x:0:0:root:/root:/sbin/nologin\nredis:x:999:999::/data:/sbin/nologin\n",
        0o644,
    )?;
    rootfs.file("etc/group", "root:x:0:\nredis:x:999:\n", 0o644)?;
    let libraries = rootfs.build(&docker, image, REDIS_DOCKERFILE)?;
    let version = run_in(
        &docker,
        image,
        &["redis-server", "--version"],
        "Redis server v=",
    )?;
    eprintln!(
        "trt-redis: built {image} from {} ({libraries} libraries): {}",
        server.display(),
        version.trim()
    );
    Ok(())
}

/// The `docker` command: it builds the images.
pub(crate) fn docker_cli() -> Result<PathBuf> {
    find_on_path("docker").ok_or_else(|| {
        Error::new("the `docker` command is not on PATH: it builds the image")
    })
}

/// A build context, a temporary directory removed when dropped: the
/// Dockerfile, and `rootfs/`, copied to `/` of the image. Every file copied
/// in keeps its mode; the libraries the binaries need come along.
pub(crate) struct Rootfs {
    context: PathBuf,
    /// What `ldd` listed, the loader included: copied by
    /// [`build`](Self::build).
    libraries: Vec<PathBuf>,
}

impl Rootfs {
    /// A new context, `trt-<what>-image-<pid>` in the temporary directory.
    pub(crate) fn new(what: &str) -> Result<Self> {
        let context = std::env::temp_dir()
            .join(format!("trt-{what}-image-{}", std::process::id()));
        let _ = fs::remove_dir_all(&context);
        create_dir(&context.join("rootfs"))?;
        Ok(Self {
            context,
            libraries: Vec::new(),
        })
    }

    /// Where `inside` (a path in the image) is in the context.
    fn path(&self, inside: &str) -> PathBuf {
        self.context
            .join("rootfs")
            .join(inside.trim_start_matches('/'))
    }

    /// The directory `inside` the image (and its parents), with `mode`.
    pub(crate) fn dir(&self, inside: &str, mode: u32) -> Result<()> {
        let dir = self.path(inside);
        create_dir(&dir)?;
        set_mode(&dir, mode)
    }

    /// The directory `inside` the context but outside `rootfs/` (for a
    /// `COPY --chown` of its own), with `mode`.
    pub(crate) fn context_dir(&self, inside: &str, mode: u32) -> Result<()> {
        let dir = self.context.join(inside);
        create_dir(&dir)?;
        set_mode(&dir, mode)
    }

    /// The file `inside` the image, holding `text`, with `mode`.
    pub(crate) fn file(
        &self,
        inside: &str,
        text: &str,
        mode: u32,
    ) -> Result<()> {
        let path = self.path(inside);
        if let Some(dir) = path.parent() {
            create_dir(dir)?;
        }
        fs::write(&path, text).map_err(|e| {
            Error::new(format!("write {}: {e}", path.display()))
        })?;
        set_mode(&path, mode)
    }

    /// The executable `from` (links followed) as `inside`, and the
    /// libraries it needs, the ELF loader among them.
    pub(crate) fn binary(&mut self, from: &Path, inside: &str) -> Result<()> {
        self.copy(from, inside)?;
        let libraries = libraries_of(from)?;
        if !libraries
            .iter()
            .any(|l| l.to_string_lossy().contains("ld-linux"))
        {
            return Err(Error::new(format!(
                "ldd {} names no ELF loader (ld-linux): the image could not run it",
                from.display()
            )));
        }
        self.libraries.extend(libraries);
        Ok(())
    }

    /// The file `from` (links followed, mode kept) as `inside`.
    fn copy(&self, from: &Path, inside: &str) -> Result<()> {
        let to = self.path(inside);
        if let Some(dir) = to.parent() {
            create_dir(dir)?;
        }
        fs::copy(from, &to).map(drop).map_err(|e| {
            Error::new(format!("cp {} {}: {e}", from.display(), to.display()))
        })
    }

    /// The directory `from` and everything below it, at the same path in
    /// the image, but for the entries `skip` names (by file name): files
    /// with their modes, symbolic links as links. The libraries of every
    /// shared object (`*.so`) in it come along.
    pub(crate) fn tree(&mut self, from: &Path, skip: &[&str]) -> Result<()> {
        let inside = from.to_string_lossy().into_owned();
        self.dir(&inside, 0o755)?;
        let entries = fs::read_dir(from)
            .map_err(|e| Error::new(format!("ls {}: {e}", from.display())))?;
        for entry in entries {
            let entry = entry.map_err(|e| {
                Error::new(format!("ls {}: {e}", from.display()))
            })?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if skip.iter().any(|s| wildcard(s, &name)) {
                continue;
            }
            let path = entry.path();
            let kind = entry
                .file_type()
                .map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
            let inside = path.to_string_lossy().into_owned();
            if kind.is_symlink() {
                self.link(&path, &inside)?;
            } else if kind.is_dir() {
                self.tree(&path, skip)?;
            } else {
                self.copy(&path, &inside)?;
                if name.ends_with(".so") {
                    self.libraries.extend(libraries_of(&path)?);
                }
            }
        }
        Ok(())
    }

    /// The symbolic link `from`, the same link at `inside`.
    fn link(&self, from: &Path, inside: &str) -> Result<()> {
        let target = fs::read_link(from).map_err(|e| {
            Error::new(format!("readlink {}: {e}", from.display()))
        })?;
        self.symlink(inside, &target)
    }

    /// A symbolic link `inside` the image to `target`.
    pub(crate) fn symlink(&self, inside: &str, target: &Path) -> Result<()> {
        let to = self.path(inside);
        if let Some(dir) = to.parent() {
            create_dir(dir)?;
        }
        #[cfg(unix)]
        let made = std::os::unix::fs::symlink(target, &to);
        #[cfg(not(unix))]
        let made: std::io::Result<()> = Err(std::io::Error::other("no unix"));
        made.map_err(|e| {
            Error::new(format!(
                "ln -s {} {}: {e}",
                target.display(),
                to.display()
            ))
        })
    }

    /// Copies the libraries, writes `dockerfile`, and builds `image` with
    /// the legacy builder (the engine may have no BuildKit plugin, buildx);
    /// how many libraries it holds.
    pub(crate) fn build(
        mut self,
        docker: &Path,
        image: &Image,
        dockerfile: &str,
    ) -> Result<usize> {
        let mut libraries = std::mem::take(&mut self.libraries);
        libraries.sort();
        libraries.dedup();
        for library in &libraries {
            self.copy(library, &library.to_string_lossy())?;
        }
        let path = self.context.join("Dockerfile");
        fs::write(&path, dockerfile).map_err(|e| {
            Error::new(format!("write {}: {e}", path.display()))
        })?;
        run(Command::new(docker)
            .env("DOCKER_BUILDKIT", "0")
            .args(["build", "-q", "-t", &image.to_string()])
            .arg(&self.context))?;
        Ok(libraries.len())
    }
}

impl Drop for Rootfs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.context);
    }
}

/// Runs `command` in a new container of `image` (no network, removed after)
/// and returns what it printed, which must contain `expected`.
pub(crate) fn run_in(
    docker: &Path,
    image: &Image,
    command: &[&str],
    expected: &str,
) -> Result<String> {
    let tag = image.to_string();
    let printed = run(Command::new(docker)
        .args(["run", "--rm", "--network", "none", &tag])
        .args(command))?;
    if printed.contains(expected) {
        Ok(printed)
    } else {
        Err(Error::new(format!(
            "a container of {tag} did not print {expected:?} for `{}`: {printed:?}",
            command.join(" ")
        )))
    }
}

/// Whether `name` matches `pattern`, where a trailing `*` matches any end.
fn wildcard(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(start) => name.starts_with(start),
        None => name == pattern,
    }
}

/// The absolute paths `ldd` lists for `binary`, the loader included.
fn libraries_of(binary: &Path) -> Result<Vec<PathBuf>> {
    let text = run_quietly(Command::new("ldd").arg(binary))?;
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
    Ok(libraries)
}

/// Runs `command`, printed first; its standard output, or an error with
/// what it printed.
pub(crate) fn run(command: &mut Command) -> Result<String> {
    eprintln!("$ {}", shown(command));
    run_quietly(command)
}

/// [`run`], not printed first.
fn run_quietly(command: &mut Command) -> Result<String> {
    let shown = shown(command);
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

/// `command` as a shell would show it.
fn shown(command: &Command) -> String {
    format!(
        "{} {}",
        command.get_program().to_string_lossy(),
        command
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    )
}

fn create_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir)
        .map_err(|e| Error::new(format!("mkdir {}: {e}", dir.display())))
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(
            |e| Error::new(format!("chmod {mode:o} {}: {e}", path.display())),
        )
    }
    #[cfg(not(unix))]
    {
        let _ = (path, mode);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_names_match_exactly_or_by_their_start() {
        assert!(wildcard("bitcode", "bitcode"));
        assert!(!wildcard("bitcode", "bitcode2"));
        assert!(wildcard("llvmjit*", "llvmjit.so"));
        assert!(wildcard("llvmjit*", "llvmjit_types.bc"));
        assert!(!wildcard("llvmjit*", "plpgsql.so"));
    }
}
