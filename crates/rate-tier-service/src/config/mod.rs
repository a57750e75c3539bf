//! The rules: envoyproxy/ratelimit's YAML format, loaded, validated and
//! matched.
//!
//! A config is one YAML file or a directory of them, one `domain` per
//! file. [`Config::load`] reads them, checks them with upstream's rules and
//! messages (`<file>: <reason>`, with the line where it is known), and
//! builds the rule tree that a request's descriptors are matched against.
//!
//! ```
//! use rate_tier_service::config::Config;
//!
//! let config = Config::from_yaml("rl.yaml", "
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit: {unit: minute, requests_per_unit: 60}
//! ")?;
//! assert_eq!(config.domains().collect::<Vec<_>>(), ["edge"]);
//!
//! let error = Config::from_yaml("bad.yaml", "
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit: {unit: minutes, requests_per_unit: 60}
//! ").unwrap_err();
//! assert_eq!(error.to_string(), "bad.yaml:4: invalid rate limit unit 'minutes'");
//! # Ok::<(), rate_tier_service::config::ConfigError>(())
//! ```
//!
//! # How a file is read
//!
//! In three steps, one module each:
//!
//! 1. `decode.rs`: the first YAML document into nodes that know their line
//!    (anchors, aliases and merge keys applied; nesting and alias expansion
//!    bounded);
//! 2. `check.rs`: upstream's keys, level by level, into a raw tree;
//! 3. `build.rs`: upstream's rules, into the domain's rule tree (`tree.rs`),
//!    which requests are matched against.
//!
//! `files.rs` finds the files; every error is a [`ConfigError`].
//!
//! # Files
//!
//! A directory is read recursively, every regular file whatever its name
//! (as upstream does), in path order, **except** names that start with a
//! `.`: editors' swap files, and the `..data` directories of a Kubernetes
//! ConfigMap (upstream's `RUNTIME_IGNOREDOTFILES=true`, which a ConfigMap
//! needs). Symbolic links to files are followed; links to directories are
//! skipped with a warning, as upstream skips them. Two files with the same
//! `domain` are an error (upstream's default, `MERGE_DOMAIN_CONFIG=false`).
//! A file larger than [`MAX_FILE_BYTES`] is refused. A directory with no
//! config file (empty, or of dotfiles only) is an error
//! ([`ConfigError::is_no_file`]), not a config that limits nothing:
//! upstream loads it as no rule at all, and a deploy that empties the
//! directory for a moment would switch every limit off. A config with no
//! rule says so: a file with a `domain` and no `descriptors`.
//!
//! # Keys
//!
//! Every key upstream documents is accepted:
//!
//! | key | here |
//! |---|---|
//! | `domain`, `descriptors`, `key`, `value`, `rate_limit` {`unit`, `requests_per_unit`, `unlimited`, `name`, `replaces`} | implemented |
//! | `shadow_mode` | implemented: the rule decides and counts, and never refuses |
//! | `share_threshold` | implemented: every value matching the wildcard shares one bucket |
//! | `quota_mode` | accepted, **ignored**: the rule is enforced like any other (a warning says so) |
//! | `detailed_metric`, `value_to_metric` | accepted, **ignored**: metrics are labelled by the rule's path, never by a request's values (bounded cardinality, no user data) |
//! | `metadata` | accepted (a map), **ignored**: no dynamic metadata is sent back |
//!
//! A known key at a level that does not use it (a `shadow_mode` inside
//! `rate_limit`) is accepted and ignored as upstream does, with a warning.
//! An unknown key is an error, and so is a key given twice in one map
//! (upstream keeps the last one silently; this refuses rather than guess).
//!
//! # Quotas
//!
//! `requests_per_unit: R` per `unit` is a GCRA quota of R per unit with a
//! burst of R: R requests at once, then one every `unit / R`.
//!
//! - `R = 0` is valid and refuses every request of cost 1 or more, without
//!   touching the store (a peek of cost 0 is OK with 0 remaining).
//! - An interval below 1 µs (more than 1 000 000 per second, 60 000 000 per
//!   minute, 3 600 000 000 per hour) cannot be expressed by GCRA here. Such a
//!   rule is **clamped**, with a warning: the burst stays R, the rate is one
//!   request per µs. Upstream accepts these values, so refusing them would
//!   break configs that load there.
//! - The burst window is at most 2^50 µs (35.7 years); the longest unit is a
//!   year, whatever R: every rule fits.

mod build;
mod check;
mod decode;
mod error;
mod files;
mod tree;
mod unit;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use sha1::{Digest, Sha1};

pub(crate) use self::build::quota_for;
pub use self::error::ConfigError;
pub use self::files::MAX_FILE_BYTES;
pub(crate) use self::tree::{Domain, Rule, RuleLimit};
pub use self::unit::Unit;

/// A loaded, valid config: the domains and their rules.
///
/// Immutable: a reload builds a new one and swaps it in whole.
#[derive(Debug)]
pub struct Config {
    domains: HashMap<String, Domain>,
    rules: Vec<Arc<Rule>>,
    warnings: Vec<String>,
    fingerprint: [u8; 20],
}

impl Config {
    /// Loads `path`: one file, or a directory of them (see the [module
    /// docs](self#files)).
    ///
    /// # Errors
    ///
    /// The first problem found, with its file: one that cannot be read, a
    /// YAML error, a rule upstream refuses, two files with one domain; or
    /// no config file at all ([`ConfigError::is_no_file`]: a config with
    /// no rule is valid only when a file says so, with a `domain` and no
    /// `descriptors`).
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let mut warnings = Vec::new();
        let sources = files::read_sources(path, &mut warnings)?;
        if sources.is_empty() {
            // Never a config that limits nothing by accident: a deploy
            // that empties the directory for a moment.
            return Err(ConfigError::no_file(&path.display().to_string()));
        }
        let mut config = Config::from_sources(
            sources
                .iter()
                .map(|(name, text)| (name.as_str(), text.as_str())),
        )?;
        warnings.append(&mut config.warnings);
        config.warnings = warnings;
        Ok(config)
    }

    /// A config of one file's text, named `file` in errors.
    ///
    /// # Errors
    ///
    /// As [`Config::load`].
    pub fn from_yaml(file: &str, text: &str) -> Result<Config, ConfigError> {
        Config::from_sources([(file, text)])
    }

    /// A config of several files: `(name, text)` pairs, one domain each.
    /// Each file is decoded (YAML, with its lines), checked (upstream's
    /// keys), then built (upstream's rules) into its domain's rule tree.
    ///
    /// # Errors
    ///
    /// As [`Config::load`].
    pub fn from_sources<'a>(
        sources: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Config, ConfigError> {
        let mut domains: HashMap<String, Domain> = HashMap::new();
        let mut rules = Vec::new();
        let mut warnings = Vec::new();
        let mut fingerprint = Sha1::new();
        for (file, text) in sources {
            fingerprint.update((file.len() as u64).to_be_bytes());
            fingerprint.update(file.as_bytes());
            fingerprint.update((text.len() as u64).to_be_bytes());
            fingerprint.update(text.as_bytes());
            let document = decode::decode(file, text)?;
            let raw = check::check(file, document.as_ref())?;
            let domain = raw.domain.clone().unwrap_or_default();
            if domains.contains_key(&domain) {
                return Err(ConfigError::new(
                    file,
                    None,
                    format!("duplicate domain '{domain}' in config file"),
                ));
            }
            let mut built = build::build(file, &raw)?;
            rules.append(&mut built.rules);
            warnings.append(&mut built.warnings);
            domains.insert(domain, built.domain);
        }
        Ok(Config {
            domains,
            rules,
            warnings,
            fingerprint: fingerprint.finalize().into(),
        })
    }

    /// The domains, in no particular order.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// How many `rate_limit`s the config holds.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// What was accepted but deserves a word: ignored keys, clamped quotas,
    /// skipped files. Each names its file (and line, when known).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// A hash of every file's name and text: equal for configs read from
    /// the same files (a reload that changed nothing is skipped).
    pub fn fingerprint(&self) -> [u8; 20] {
        self.fingerprint
    }

    /// The rules as envoyproxy/ratelimit's `/rlconfig` prints them: one
    /// line each, its full key (the domain, then each descriptor's key, or
    /// `key_value`, dot-separated), its unit and requests per unit (or
    /// `unlimited`), and its shadow mode; by domain, each in config order.
    ///
    /// ```
    /// use rate_tier_service::Config;
    /// let config = Config::from_yaml("rl.yaml", "
    /// domain: edge
    /// descriptors:
    ///   - key: remote_address
    ///     rate_limit: { unit: minute, requests_per_unit: 60 }
    ///   - key: path
    ///     value: /health
    ///     rate_limit: { unlimited: true }
    /// ")?;
    /// assert_eq!(config.dump(), "\
    /// edge.remote_address: unit=MINUTE requests_per_unit=60, shadow_mode: false, quota_mode: false
    /// edge.path_/health: unlimited, shadow_mode: false, quota_mode: false
    /// ");
    /// # Ok::<(), rate_tier_service::ConfigError>(())
    /// ```
    pub fn dump(&self) -> String {
        let mut rules: Vec<&Arc<Rule>> = self.rules.iter().collect();
        // Stable: each domain's rules stay in config order.
        rules.sort_by(|a, b| a.domain.cmp(&b.domain));
        let mut out = String::new();
        for rule in rules {
            let limit = match rule.limit {
                RuleLimit::Unlimited => "unlimited".to_owned(),
                RuleLimit::Never | RuleLimit::Quota(_) => format!(
                    "unit={} requests_per_unit={}",
                    rule.unit.name(),
                    rule.requests_per_unit
                ),
            };
            out.push_str(&format!(
                "{}.{}: {limit}, shadow_mode: {}, quota_mode: false\n",
                rule.domain, rule.path, rule.shadow
            ));
        }
        out
    }

    pub(crate) fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    pub(crate) fn rules(&self) -> &[Arc<Rule>] {
        &self.rules
    }
}
