//! Where the PostgreSQL server binaries are: found once per process, or an
//! error that says what to install.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::backend::is_executable;
use crate::error::{Error, Result};

/// The directory that holds `initdb`, `pg_ctl` and `postgres` (default: found
/// on `PATH`, else the newest `/usr/lib/postgresql/<version>/bin`).
pub const POSTGRES_BIN_DIR_VAR: &str = "TRT_POSTGRES_BIN_DIR";

/// Where Debian and Ubuntu install each major version's server binaries.
const DEBIAN_LIB_DIR: &str = "/usr/lib/postgresql";
/// The server binaries that must all be in one directory.
pub(super) const SERVER_PROGRAMS: [&str; 3] = ["initdb", "pg_ctl", "postgres"];

/// The directory of the PostgreSQL server binaries (`initdb`, `pg_ctl` and
/// `postgres`, together), found once per process:
///
/// 1. `TRT_POSTGRES_BIN_DIR`, if set (an error if they are not all there);
/// 2. the directory of `initdb` on `PATH` (where a symbolic link leads, or
///    the `PATH` directory itself);
/// 3. the newest `/usr/lib/postgresql/<version>/bin` (Debian, Ubuntu);
/// 4. otherwise an error that says what to install.
pub fn find_postgres_bin_dir() -> Result<PathBuf> {
    static FOUND: OnceLock<Result<PathBuf>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            find_bin_dir(
                std::env::var_os(POSTGRES_BIN_DIR_VAR)
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from),
                std::env::var_os("PATH"),
                Path::new(DEBIAN_LIB_DIR),
            )
        })
        .clone()
}

fn find_bin_dir(
    explicit: Option<PathBuf>,
    path: Option<std::ffi::OsString>,
    lib_dir: &Path,
) -> Result<PathBuf> {
    let complete = |dir: &Path| {
        SERVER_PROGRAMS.iter().all(|p| is_executable(&dir.join(p)))
    };
    if let Some(dir) = explicit {
        return if complete(&dir) {
            Ok(dir)
        } else {
            Err(Error::new(format!(
                "{POSTGRES_BIN_DIR_VAR}={} does not hold the PostgreSQL server binaries \
                 ({}, each an executable file)",
                dir.display(),
                SERVER_PROGRAMS.join(", ")
            )))
        };
    }
    let on_path = path
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("initdb"))
        .find(|initdb| is_executable(initdb));
    if let Some(initdb) = on_path {
        let candidates = [
            fs::canonicalize(&initdb)
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf)),
            initdb.parent().map(Path::to_path_buf),
        ];
        if let Some(dir) =
            candidates.into_iter().flatten().find(|d| complete(d))
        {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(Vec<u32>, PathBuf)> = fs::read_dir(lib_dir)
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry
                .file_name()
                .to_str()?
                .split('.')
                .map(str::parse)
                .collect::<std::result::Result<Vec<u32>, _>>()
                .ok()?;
            let bin = entry.path().join("bin");
            complete(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, newest)) = versions.pop() {
        return Ok(newest);
    }
    Err(Error::new(format!(
        "no PostgreSQL server binaries for the tests: `initdb`, `pg_ctl` and `postgres` are \
         not on PATH nor in {}/<version>/bin, and {POSTGRES_BIN_DIR_VAR} is not set.\n\
         Install them: `apt-get install -y postgresql` (Debian/Ubuntu; any major version), \
         `brew install postgresql` (macOS); or set {POSTGRES_BIN_DIR_VAR} to the directory \
         that holds them.",
        lib_dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_binaries_is_an_error_that_says_what_to_install() {
        let e = find_bin_dir(
            None,
            Some("".into()),
            Path::new("/nonexistent/postgresql"),
        )
        .unwrap_err();
        assert!(e.message().contains("apt-get install -y postgresql"), "{e}");
        assert!(e.message().contains(POSTGRES_BIN_DIR_VAR), "{e}");
    }

    #[test]
    fn an_explicit_directory_without_the_binaries_is_an_error() {
        let e = find_bin_dir(
            Some("/nonexistent/bin".into()),
            std::env::var_os("PATH"),
            Path::new(DEBIAN_LIB_DIR),
        )
        .unwrap_err();
        assert!(e.message().contains("/nonexistent/bin"), "{e}");
        assert!(e.message().contains("initdb, pg_ctl, postgres"), "{e}");
    }

    #[test]
    fn the_newest_debian_version_is_chosen() {
        let root = std::env::temp_dir().join(crate::unique("trt-pg-lib"));
        for version in ["9.6", "15", "13", "not-a-version"] {
            let bin = root.join(version).join("bin");
            fs::create_dir_all(&bin).unwrap();
            for program in SERVER_PROGRAMS {
                let path = bin.join(program);
                fs::write(&path, "#!/bin/sh\n").unwrap();
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    fs::set_permissions(
                        &path,
                        fs::Permissions::from_mode(0o755),
                    )
                    .unwrap();
                }
            }
        }
        let found = find_bin_dir(None, Some("".into()), &root);
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(found.unwrap(), root.join("15").join("bin"));
    }
}
