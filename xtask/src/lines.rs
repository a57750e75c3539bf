//! `cargo xtask lines`: the library's size without its tests, per crate and
//! language, in the working tree or at a git revision (`--at REV`), so that
//! two versions are counted by the same rules.
//!
//! The library is gcra-core, rate-tier-storage, tower-rate-tier and
//! rate-tier-axum: the Rust, Lua and SQL files under their `src/`. Tests are
//! left out: `tests/` and `benches/` are not under `src/`, and in a Rust
//! file an item behind a test `cfg` (`test`, `all(test, ..)`, `doctest`) is
//! skipped, with the file of a `mod name;` so gated. A line is blank, a
//! comment (`//` in Rust, doc comments included; `--` in Lua and SQL) or
//! code.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;

use crate::cmd::{self, Result};

/// The library's crates, in dependency order.
const CRATES: [&str; 4] = [
    "crates/gcra-core",
    "crates/rate-tier-storage",
    "crates/rate-tier-tower",
    "crates/rate-tier-axum",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Language {
    Rust,
    Lua,
    Sql,
}

impl Language {
    fn of(path: &str) -> Option<Self> {
        let (_, extension) = path.rsplit_once('.')?;
        match extension {
            "rs" => Some(Self::Rust),
            "lua" => Some(Self::Lua),
            "sql" => Some(Self::Sql),
            _ => None,
        }
    }

    fn comment(self) -> &'static str {
        match self {
            Self::Rust => "//",
            Self::Lua | Self::Sql => "--",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Rust => "Rust",
            Self::Lua => "Lua",
            Self::Sql => "SQL",
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Count {
    files: usize,
    lines: usize,
    code: usize,
    comments: usize,
}

impl Count {
    fn add(&mut self, other: Self) {
        self.files += other.files;
        self.lines += other.lines;
        self.code += other.code;
        self.comments += other.comments;
    }
}

/// Counts the lines of one file, kept lines only.
fn count(language: Language, lines: &[&str]) -> Count {
    let mut count = Count {
        files: 1,
        ..Count::default()
    };
    for line in lines {
        let line = line.trim();
        count.lines += 1;
        if line.starts_with(language.comment()) {
            count.comments += 1;
        } else if !line.is_empty() {
            count.code += 1;
        }
    }
    count
}

/// Whether an attribute gates its item to tests alone: `cfg(test)`,
/// `cfg(doctest)`, `cfg(all(test, ..))`; not `not(test)` nor `any(test, ..)`,
/// which also build outside tests.
fn is_test_cfg(line: &str) -> bool {
    let line = line.trim();
    line.starts_with("#[cfg(")
        && !line.contains("not(")
        && !line.contains("any(")
        && (line.contains("(test")
            || line.contains(" test")
            || line.contains("doctest"))
}

/// The lines of a Rust file without the items behind a test `cfg`, and the
/// names of the `mod name;` so gated (their files are tests).
fn without_tests(text: &str) -> (Vec<&str>, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let mut kept = Vec::with_capacity(lines.len());
    let mut test_modules = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !is_test_cfg(lines[i]) {
            kept.push(lines[i]);
            i += 1;
            continue;
        }
        // The item's other attributes, then its first line.
        i += 1;
        while i < lines.len() && lines[i].trim_start().starts_with("#[") {
            i += 1;
        }
        let Some(first) = lines.get(i) else { break };
        let trimmed = first.trim();
        if trimmed.ends_with(';') {
            if let Some(name) = trimmed
                .strip_suffix(';')
                .and_then(|item| item.rsplit_once("mod "))
                .map(|(_, name)| name.trim())
            {
                test_modules.push(name.to_owned());
            }
            i += 1;
            continue;
        }
        // rustfmt closes an item at the indentation it opened it.
        let indent = &first[..first.len() - first.trim_start().len()];
        i += 1;
        while i < lines.len() {
            let line = lines[i].trim_end();
            i += 1;
            if line.strip_prefix(indent).is_some_and(|rest| {
                rest.starts_with('}') && !rest.starts_with("} else")
            }) {
                break;
            }
        }
    }
    (kept, test_modules)
}

/// The files of the library under `src/`: path and text, from the working
/// tree or at `at`.
fn library_files(
    root: &Path,
    at: Option<&str>,
) -> Result<Vec<(String, String)>> {
    let mut files = Vec::new();
    for krate in CRATES {
        let src = format!("{krate}/src");
        match at {
            None => walk(root, &root.join(&src), &mut files)?,
            Some(revision) => {
                let listed = git(
                    root,
                    &["ls-tree", "-r", "--name-only", revision, "--", &src],
                )?;
                for path in listed.lines().filter(|p| Language::of(p).is_some())
                {
                    let text =
                        git(root, &["show", &format!("{revision}:{path}")])?;
                    files.push((path.to_owned(), text));
                }
            }
        }
    }
    Ok(files)
}

/// Git's standard output, quietly: one call per file.
fn git(root: &Path, args: &[&str]) -> Result<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(root)
        .output()
        .map_err(|e| format!("could not start git: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "`git {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    String::from_utf8(output.stdout)
        .map_err(|e| format!("`git {}`: not UTF-8: {e}", args.join(" ")))
}

fn walk(
    root: &Path,
    dir: &Path,
    files: &mut Vec<(String, String)>,
) -> Result<()> {
    let entries =
        fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path.is_dir() {
            walk(root, &path, files)?;
            continue;
        }
        let Some(relative) = path
            .strip_prefix(root)
            .ok()
            .and_then(|p| p.to_str())
            .filter(|p| Language::of(p).is_some())
        else {
            continue;
        };
        let text = fs::read_to_string(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        files.push((relative.to_owned(), text));
    }
    Ok(())
}

/// Where the file of `mod name;` declared in `declared_in` lives, as
/// `dir/name` (without `.rs` or `/mod.rs`).
fn module_stem(declared_in: &str, name: &str) -> String {
    let dir = match declared_in.rsplit_once('/') {
        Some((dir, "mod.rs" | "lib.rs" | "main.rs")) => dir.to_owned(),
        Some(_) => declared_in.trim_end_matches(".rs").to_owned(),
        None => String::new(),
    };
    format!("{dir}/{name}")
}

type Table = BTreeMap<(&'static str, Language), Count>;

fn tally(files: &[(String, String)]) -> Table {
    let mut test_files = Vec::new();
    let mut counted = Vec::new();
    for (path, text) in files {
        let Some(language) = Language::of(path) else {
            continue;
        };
        let lines = if language == Language::Rust {
            let (kept, modules) = without_tests(text);
            test_files
                .extend(modules.iter().map(|name| module_stem(path, name)));
            kept
        } else {
            text.lines().collect()
        };
        counted.push((path, language, count(language, &lines)));
    }
    let mut table = Table::new();
    for (path, language, count) in counted {
        let stem = path.trim_end_matches(".rs").trim_end_matches("/mod");
        if language == Language::Rust && test_files.iter().any(|t| t == stem) {
            continue;
        }
        let Some(krate) =
            CRATES.iter().find(|k| path.starts_with(&format!("{k}/")))
        else {
            continue;
        };
        table.entry((krate, language)).or_default().add(count);
    }
    table
}

fn render(table: &Table) -> String {
    let mut out = String::from(
        "| crate | language | files | lines | code | comments |\n|---|---|---|---|---|---|\n",
    );
    let mut totals: BTreeMap<Language, Count> = BTreeMap::new();
    let mut all = Count::default();
    for ((krate, language), count) in table {
        let name = krate.trim_start_matches("crates/");
        out += &format!(
            "| {name} | {} | {} | {} | {} | {} |\n",
            language.name(),
            count.files,
            count.lines,
            count.code,
            count.comments
        );
        totals.entry(*language).or_default().add(*count);
        all.add(*count);
    }
    for (language, count) in &totals {
        out += &format!(
            "| all | {} | {} | {} | {} | {} |\n",
            language.name(),
            count.files,
            count.lines,
            count.code,
            count.comments
        );
    }
    out += &format!(
        "| all | all | {} | {} | {} | {} |\n",
        all.files, all.lines, all.code, all.comments
    );
    out
}

/// `cargo xtask lines [--at REV]`.
pub(crate) fn lines(at: Option<&str>) -> Result<()> {
    let root = cmd::project_root();
    let files = library_files(&root, at)?;
    println!(
        "The library without its tests ({}):\n",
        at.unwrap_or("the working tree")
    );
    print!("{}", render(&tally(&files)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_behind_a_test_cfg_are_left_out() {
        let text = "\
use std::fmt;

/// Kept.
pub fn kept() -> u32 {
    if true {
        1
    } else {
        2
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn inner() {
        assert!(true);
    }
}

#[cfg(all(test, trt_loom))]
mod loom_model;

impl Kept {
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        0
    }

    fn after(&self) {}
}
";
        let (kept, modules) = without_tests(text);
        assert_eq!(modules, ["loom_model"]);
        let kept = kept.join("\n");
        assert!(kept.contains("pub fn kept()") && kept.contains("fn after"));
        assert!(kept.contains("    } else {"));
        assert!(!kept.contains("inner") && !kept.contains("len(&self)"));
        // One doc comment; blank lines after `use`, `kept`, each skipped
        // item, and the one left where `len` was.
        let counted = count(Language::Rust, &kept.lines().collect::<Vec<_>>());
        assert_eq!(
            (
                counted.comments,
                counted.lines - counted.code - counted.comments
            ),
            (1, 5)
        );
    }

    #[test]
    fn only_attributes_that_build_for_tests_alone_count_as_tests() {
        for gated in [
            "#[cfg(test)]",
            "#[cfg(doctest)]",
            "#[cfg(all(test, trt_loom))]",
        ] {
            assert!(is_test_cfg(gated), "{gated}");
        }
        for kept in [
            "#[cfg(not(test))]",
            "#[cfg(any(test, feature = \"x\"))]",
            "#[cfg(feature = \"test-support\")]",
            "#[cfg_attr(test, derive(Debug))]",
        ] {
            assert!(!is_test_cfg(kept), "{kept}");
        }
    }

    #[test]
    fn a_gated_module_file_is_not_counted() {
        let files = vec![
            (
                "crates/rate-tier-storage/src/fallback/mod.rs".to_owned(),
                "pub struct F;\n#[cfg(test)]\nmod tests;\n".to_owned(),
            ),
            (
                "crates/rate-tier-storage/src/fallback/tests.rs".to_owned(),
                "fn a() {}\nfn b() {}\n".to_owned(),
            ),
            (
                "crates/rate-tier-storage/src/redis/gcra.lua".to_owned(),
                "-- the rule\nlocal x = 1\n\nreturn x\n".to_owned(),
            ),
        ];
        let table = tally(&files);
        let rust = table[&("crates/rate-tier-storage", Language::Rust)];
        assert_eq!((rust.files, rust.code), (1, 1));
        let lua = table[&("crates/rate-tier-storage", Language::Lua)];
        assert_eq!((lua.lines, lua.code, lua.comments), (4, 2, 1));
        assert_eq!(module_stem("a/src/lib.rs", "m"), "a/src/m");
        assert_eq!(module_stem("a/src/x.rs", "m"), "a/src/x/m");
    }
}
