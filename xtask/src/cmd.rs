//! Running child processes: each command is printed (`$ cargo test ...`)
//! before it runs, and a failure names the command that failed.

use std::env;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Errors are messages for a person: what failed, and what to do about it.
pub(crate) type Result<T> = std::result::Result<T, String>;

/// The workspace root: the parent of this crate's manifest directory.
pub(crate) fn project_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .expect("xtask/ lives directly in the workspace root")
        .to_path_buf()
}

/// A command to run from the workspace root, with the environment it adds.
pub(crate) struct Cmd {
    program: OsString,
    /// How the program is shown in the printed command line.
    shown_as: String,
    args: Vec<OsString>,
    envs: Vec<(String, OsString)>,
}

impl Cmd {
    pub(crate) fn new(program: impl AsRef<OsStr>) -> Self {
        let program = program.as_ref().to_os_string();
        let shown_as = program.to_string_lossy().into_owned();
        Self {
            program,
            shown_as,
            args: Vec::new(),
            envs: Vec::new(),
        }
    }

    /// The cargo that runs this xtask (`$CARGO`), or `cargo` from `PATH`.
    pub(crate) fn cargo() -> Self {
        let mut cmd =
            Self::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.shown_as = "cargo".to_owned();
        cmd
    }

    pub(crate) fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    pub(crate) fn args<I>(mut self, args: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    pub(crate) fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Self {
        self.envs
            .push((key.to_owned(), value.as_ref().to_os_string()));
        self
    }

    /// The command line as a shell would take it, environment first.
    pub(crate) fn display(&self) -> String {
        let envs = self
            .envs
            .iter()
            .map(|(k, v)| format!("{k}={}", shell_quote(v)));
        let program = std::iter::once(shell_quote(OsStr::new(&self.shown_as)));
        let args = self.args.iter().map(|a| shell_quote(a));
        envs.chain(program)
            .chain(args)
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub(crate) fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args).current_dir(project_root());
        for (key, value) in &self.envs {
            command.env(key, value);
        }
        command
    }

    /// Prints the command, runs it with the terminal's stdio, fails unless it
    /// exits with 0.
    pub(crate) fn run(&self) -> Result<()> {
        println!("$ {}", self.display());
        let status = self.command().status().map_err(|e| {
            format!("could not start `{}`: {e}", self.display())
        })?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("`{}` failed ({status})", self.display()))
        }
    }

    /// Prints the command, runs it, and returns its standard output; fails
    /// (showing what it printed) unless it exits with 0.
    pub(crate) fn read(&self) -> Result<String> {
        println!("$ {}", self.display());
        let output =
            self.command().stdin(Stdio::null()).output().map_err(|e| {
                format!("could not start `{}`: {e}", self.display())
            })?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "`{}` failed ({})\n{stdout}{}",
                self.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    /// Like [`Cmd::read`], but what the command prints on its standard error
    /// goes to the terminal as it comes (for a build's progress).
    pub(crate) fn read_stdout(&self) -> Result<String> {
        println!("$ {}", self.display());
        let output = self
            .command()
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| {
                format!("could not start `{}`: {e}", self.display())
            })?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!("`{}` failed ({})", self.display(), output.status))
        }
    }

    /// Runs the command without printing anything; true if it exits with 0.
    /// For probes such as `cargo fmt --version`.
    pub(crate) fn succeeds_quietly(&self) -> bool {
        self.command()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }
}

/// Quotes an argument for display when a shell would need it.
fn shell_quote(arg: &OsStr) -> String {
    let arg = arg.to_string_lossy();
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.into_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
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
