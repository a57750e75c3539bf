//! A local PostgreSQL image built from the installed server, for a machine
//! that has a Docker engine but no registry to pull from: `FROM scratch`,
//! under the name the tests ask for (`postgres:15` by default), in the
//! crate's [`Rootfs`]. Elsewhere the official image is simply pulled.
//!
//! It holds the server's binaries, its modules (`pkglibdir`, without the
//! LLVM JIT) and data files (`sharedir`) at the paths they were built for,
//! the time zones, the libraries `ldd` lists for all of them and the ELF
//! loader; a `postgres` user (uid 999, as in the official image) that owns
//! the empty data directory and the socket directory; and, since the
//! official image's entrypoint is a shell script that creates the cluster,
//! `/bin/sh` (dash, with its libraries) and a small entrypoint of shell
//! builtins that does the same. So `postgres -p <port> ...` runs alike in
//! both.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::backend::{Image, is_executable};
use crate::error::{Error, Result};
use crate::image::{Rootfs, docker_cli, run, run_in};

/// The uid and gid of the `postgres` user, the official image's.
const POSTGRES_UID: u32 = 999;
/// The data directory, the official image's `PGDATA`.
const PGDATA: &str = "/var/lib/postgresql/data";
/// Where the server's Unix socket goes (its compiled-in default, which the
/// official image's entrypoint connects to).
const SOCKET_DIR: &str = "/var/run/postgresql";
/// The programs copied from the binaries' directory.
const PROGRAMS: [&str; 4] = ["postgres", "initdb", "pg_ctl", "psql"];
/// What of `pkglibdir` stays out: the LLVM JIT (its library alone is
/// larger than the rest; without it PostgreSQL runs without JIT) and the
/// extension build files.
const LIB_SKIPPED: &[&str] = &["bitcode", "llvmjit*", "pgxs"];
/// What of `sharedir` stays out: the manual pages.
const SHARE_SKIPPED: &[&str] = &["man"];
/// The time zones (Debian builds PostgreSQL with the system's); UTC is the
/// image's own (`/etc/localtime`), as in the official image.
const ZONEINFO: &str = "/usr/share/zoneinfo";
/// `locale`, which `initdb` runs (`locale -a`) to import the system's
/// collations, and the compiled locales it lists (Debian's `C.utf8`):
/// copied where the machine has them.
const LOCALE: &str = "/usr/bin/locale";
const LOCALES: &str = "/usr/lib/locale";

/// What the official image's entrypoint does for the tests, in shell
/// builtins (the image holds no other program): a cluster in an empty
/// `$PGDATA`, unless the command only asks for help or the version, then
/// the command.
const ENTRYPOINT: &str = r#"#!/bin/sh
# The entrypoint of the local image `trt-postgres build-image` builds
# (tower-rate-tier's crates/test-support): what the official postgres image's
# does for the tests, in shell builtins only. An empty data directory gets a
# cluster (superuser postgres, trust authentication, UTF-8, the C locale;
# POSTGRES_* variables are not read), then the command runs.
set -e
case "$1" in -*) set -- postgres "$@" ;; esac
if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    init=yes
    for arg; do
        case "$arg" in -'?' | --help | --describe-config | -V | --version) init= ;; esac
    done
    if [ -n "$init" ]; then
        initdb -D "$PGDATA" -U postgres --auth=trust --no-locale -E UTF8 --no-sync >/dev/null
    fi
fi
exec "$@"
"#;

/// Builds `image` from the PostgreSQL server binaries of `bin_dir` (see
/// [`find_postgres_bin_dir`](crate::find_postgres_bin_dir)), then checks
/// that a container of it runs `postgres --version` and `psql --version`.
/// Prints what it does on standard error.
pub fn build_local_postgres_image(image: &Image, bin_dir: &Path) -> Result<()> {
    let docker = docker_cli()?;
    let pg_config = bin_dir.join("pg_config");
    if !is_executable(&pg_config) {
        return Err(Error::new(format!(
            "{} is missing: it says where the server's modules and data files are",
            pg_config.display()
        )));
    }
    let ask = |flag: &str| -> Result<PathBuf> {
        let printed = run(Command::new(&pg_config).arg(flag))?;
        Ok(PathBuf::from(printed.trim()))
    };
    let (bin, lib, share) =
        (ask("--bindir")?, ask("--pkglibdir")?, ask("--sharedir")?);
    let sh = Path::new("/bin/sh");

    let mut rootfs = Rootfs::new("postgres")?;
    for program in PROGRAMS {
        let inside = bin.join(program);
        rootfs.binary(&bin_dir.join(program), &inside.to_string_lossy())?;
    }
    rootfs.tree(&lib, LIB_SKIPPED)?;
    rootfs.tree(&share, SHARE_SKIPPED)?;
    rootfs.tree(Path::new(ZONEINFO), &[])?;
    rootfs.symlink("etc/localtime", &Path::new(ZONEINFO).join("Etc/UTC"))?;
    if is_executable(Path::new(LOCALE)) {
        rootfs.binary(Path::new(LOCALE), LOCALE)?;
        if Path::new(LOCALES).is_dir() {
            rootfs.tree(Path::new(LOCALES), &[])?;
        }
    }
    rootfs.binary(sh, "bin/sh")?;
    rootfs.file("usr/local/bin/docker-entrypoint.sh", ENTRYPOINT, 0o755)?;
    rootfs.file(
        "etc/passwd",
        &format!(
            "root:x:0:0:root:/root:/bin/sh\n\
             postgres:x:{POSTGRES_UID}:{POSTGRES_UID}:PostgreSQL:/var/lib/postgresql:/bin/sh\n"
        ),
        0o644,
    )?;
    rootfs.file(
        "etc/group",
        &format!("root:x:0:\npostgres:x:{POSTGRES_UID}:\n"),
        0o644,
    )?;
    rootfs.dir("tmp", 0o1777)?;
    // Outside rootfs/: copied with `--chown` (COPY makes everything root's).
    rootfs.context_dir("pgdata", 0o700)?;
    rootfs.context_dir("socket", 0o2775)?;
    let dockerfile = format!(
        "FROM scratch\n\
         COPY rootfs/ /\n\
         COPY --chown={POSTGRES_UID}:{POSTGRES_UID} pgdata/ {PGDATA}/\n\
         COPY --chown={POSTGRES_UID}:{POSTGRES_UID} socket/ {SOCKET_DIR}/\n\
         ENV PATH={bin}:/usr/local/bin:/usr/bin:/bin PGDATA={PGDATA}\n\
         USER postgres\n\
         STOPSIGNAL SIGINT\n\
         EXPOSE 5432\n\
         ENTRYPOINT [\"docker-entrypoint.sh\"]\n\
         CMD [\"postgres\"]\n",
        bin = bin.display()
    );
    let libraries = rootfs.build(&docker, image, &dockerfile)?;
    let version =
        run_in(&docker, image, &["postgres", "--version"], "(PostgreSQL)")?;
    run_in(&docker, image, &["psql", "--version"], "(PostgreSQL)")?;
    eprintln!(
        "trt-postgres: built {image} from {} ({libraries} libraries): {}",
        bin_dir.display(),
        version.trim()
    );
    Ok(())
}
