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
        }
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
