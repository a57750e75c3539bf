//! A real browser for the status pages' tests: headless Chromium loads a
//! page, runs its script and gives back the DOM a person would see (or a
//! screenshot). Light on purpose: a crate that does not want the rest of
//! these helpers includes this file alone (`#[path]`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Chromium (`CHROME`, else `chromium`, `chromium-browser`,
/// `google-chrome` or `chrome` on PATH), or `None`, said loudly on stderr.
///
/// # Panics
///
/// Under CI (`CI` set), where a missing browser must fail the test rather
/// than skip it.
pub fn chromium() -> Option<PathBuf> {
    let from_env = std::env::var_os("CHROME").map(PathBuf::from);
    let found = from_env.or_else(|| {
        ["chromium", "chromium-browser", "google-chrome", "chrome"]
            .iter()
            .find_map(|name| {
                std::env::var_os("PATH").and_then(|paths| {
                    std::env::split_paths(&paths)
                        .map(|dir| dir.join(name))
                        .find(|path| path.is_file())
                })
            })
    });
    if found.is_none() {
        let message = "NO CHROMIUM: the status page's browser test did not run \
                       (install Debian's `chromium`, or set CHROME)";
        assert!(std::env::var_os("CI").is_none(), "{message}");
        eprintln!("\n!!! {message} !!!\n");
    }
    found
}

/// Headless `chromium` with its own `profile`, scripts given time to run
/// and fetch (`--virtual-time-budget`).
fn headless(chromium: &Path, profile: &Path) -> Command {
    let mut command = Command::new(chromium);
    command.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        "--virtual-time-budget=4000",
        "--window-size=1100,900",
    ]);
    command.arg(format!("--user-data-dir={}", profile.display()));
    command
}

fn run(mut command: Command) -> Vec<u8> {
    let output = command.output().expect("chromium runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

/// The page at `url` as a person's browser shows it after its script ran:
/// the DOM.
pub fn dom(chromium: &Path, profile: &Path, url: &str) -> String {
    let mut command = headless(chromium, profile);
    command.arg("--dump-dom").arg(url);
    String::from_utf8(run(command)).expect("UTF-8")
}

/// A PNG of the page at `url`, written to `path`.
pub fn screenshot(chromium: &Path, profile: &Path, url: &str, path: &Path) {
    let _ = std::fs::remove_file(path);
    let mut command = headless(chromium, profile);
    command
        .arg(format!("--screenshot={}", path.display()))
        .arg(url);
    run(command);
}

/// The text of the first element whose opening tag contains `marker`.
///
/// # Panics
///
/// If there is none.
pub fn text_after<'a>(dom: &'a str, marker: &str) -> &'a str {
    let at = dom
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} in {dom}"));
    let rest = &dom[at..];
    let start = rest.find('>').map_or(rest.len(), |i| i + 1);
    let end = rest[start..].find('<').map_or(rest.len(), |i| i + start);
    &rest[start..end]
}
