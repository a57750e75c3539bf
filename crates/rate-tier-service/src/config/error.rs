//! Why a config was refused.

use std::fmt;

/// Why a config was refused: the file, the line when known, and the reason
/// (upstream's message where upstream has one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file, as it was found (or the path given, when it could not be
    /// read).
    pub file: String,
    /// The line (from 1) where the problem is, when known.
    pub line: Option<usize>,
    /// Why.
    pub message: String,
    /// Whether the path held no config file at all.
    no_file: bool,
}

impl ConfigError {
    pub(super) fn new(
        file: &str,
        line: Option<usize>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError {
            file: file.to_owned(),
            line,
            message: message.into(),
            no_file: false,
        }
    }

    /// `path` holds no config file (an empty directory, or one of
    /// dotfiles only).
    pub(super) fn no_file(path: &str) -> Self {
        ConfigError {
            no_file: true,
            ..ConfigError::new(
                path,
                None,
                "no config file found; a config with no rule must say so: \
                 a file with `domain: NAME` and no `descriptors`",
            )
        }
    }

    /// Whether the path held no config file at all (an empty directory,
    /// or one of dotfiles only): a config with no rule that did not say
    /// so. A reload that finds it keeps the config in use.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("rts-doc-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir)?;
    /// use rate_tier_service::Config;
    /// let error = Config::load(&dir).expect_err("an empty directory");
    /// assert!(error.is_no_file());
    /// assert!(error.to_string().contains("no config file found"));
    /// // Said on purpose: a domain with no descriptors.
    /// std::fs::write(dir.join("none.yaml"), "domain: none\n")?;
    /// assert_eq!(Config::load(&dir)?.rule_count(), 0);
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    pub fn is_no_file(&self) -> bool {
        self.no_file
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}
