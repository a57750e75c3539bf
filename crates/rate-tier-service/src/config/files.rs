//! Walking files: one config file, or a directory of them.

use std::path::{Path, PathBuf};

use super::error::ConfigError;

/// The largest config file read, in bytes.
pub const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// The files of `path`, in order: `(name, text)`.
pub(super) fn read_sources(
    path: &Path,
    warnings: &mut Vec<String>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| {
        ConfigError::new(&shown, None, format!("cannot read the config: {e}"))
    })?;
    let mut sources = Vec::new();
    if meta.is_dir() {
        walk(path, &mut sources, warnings)?;
    } else {
        sources.push((shown.clone(), read_file(path, &shown)?));
    }
    Ok(sources)
}

fn walk(
    dir: &Path,
    sources: &mut Vec<(String, String)>,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    let shown = dir.display().to_string();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| {
            ConfigError::new(
                &shown,
                None,
                format!("cannot read the directory: {e}"),
            )
        })?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_none_or(|n| !n.starts_with('.'))
        })
        .collect();
    entries.sort();
    for entry in entries {
        let name = entry.display().to_string();
        let link = std::fs::symlink_metadata(&entry).map_err(|e| {
            ConfigError::new(&name, None, format!("cannot read: {e}"))
        })?;
        if link.is_symlink() {
            match std::fs::metadata(&entry) {
                Ok(target) if target.is_dir() => {
                    warnings.push(format!(
                        "{name}: a link to a directory: skipped (as envoyproxy/ratelimit skips it)"
                    ));
                }
                Ok(target) if target.is_file() => {
                    sources.push((name.clone(), read_file(&entry, &name)?));
                }
                Ok(_) => {}
                Err(e) => {
                    warnings
                        .push(format!("{name}: a broken link: skipped ({e})"));
                }
            }
        } else if link.is_dir() {
            walk(&entry, sources, warnings)?;
        } else if link.is_file() {
            sources.push((name.clone(), read_file(&entry, &name)?));
        }
    }
    Ok(())
}

fn read_file(path: &Path, name: &str) -> Result<String, ConfigError> {
    let too_big = |len: u64| {
        ConfigError::new(
            name,
            None,
            format!(
                "the file is {len} bytes; the largest config file read is {MAX_FILE_BYTES}"
            ),
        )
    };
    let meta = std::fs::metadata(path).map_err(|e| {
        ConfigError::new(name, None, format!("cannot read: {e}"))
    })?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(too_big(meta.len()));
    }
    let bytes = std::fs::read(path).map_err(|e| {
        ConfigError::new(name, None, format!("cannot read: {e}"))
    })?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| {
        ConfigError::new(
            name,
            None,
            format!("error loading config file: not UTF-8 text ({e})"),
        )
    })
}
