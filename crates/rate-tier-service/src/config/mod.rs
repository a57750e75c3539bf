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
//! # Files
//!
//! A directory is read recursively, every regular file whatever its name
//! (as upstream does), in path order, **except** names that start with a
//! `.`: editors' swap files, and the `..data` directories of a Kubernetes
//! ConfigMap (upstream's `RUNTIME_IGNOREDOTFILES=true`, which a ConfigMap
//! needs). Symbolic links to files are followed; links to directories are
//! skipped with a warning, as upstream skips them. Two files with the same
//! `domain` are an error (upstream's default, `MERGE_DOMAIN_CONFIG=false`).
//! A file larger than [`MAX_FILE_BYTES`] is refused.
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

mod unit;
mod yaml;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use gcra_core::Quota;
use rate_tier_storage::LimitName;
use sha1::{Digest, Sha1};

pub use self::unit::Unit;
use self::yaml::{RawDescriptor, RawRoot};
use crate::metrics::RuleStats;

/// The largest config file read, in bytes.
pub const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;

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
    fn new(
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

/// How a descriptor's limit is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RuleLimit {
    /// `unlimited: true`: OK, nothing stored.
    Unlimited,
    /// `requests_per_unit: 0`: every request of cost >= 1 is refused.
    Never,
    /// A GCRA quota.
    Quota(Quota),
}

/// One `rate_limit` of the config (or a descriptor's own `limit`).
#[derive(Debug)]
pub(crate) struct Rule {
    /// The bucket's name in the store: derived from the domain, the rule's
    /// path and its unit, so that it is stable across reloads.
    pub(crate) bucket: LimitName,
    /// `name` in the config (sent back in `current_limit.name`).
    pub(crate) name: String,
    /// The names this rule replaces in the same request.
    pub(crate) replaces: Vec<String>,
    pub(crate) limit: RuleLimit,
    pub(crate) requests_per_unit: u32,
    pub(crate) unit: Unit,
    pub(crate) shadow: bool,
    pub(crate) domain: String,
    /// The rule's path below the domain, values as written in the config
    /// (`key1_value1.key2`): its metrics label.
    pub(crate) path: String,
    pub(crate) stats: OnceLock<RuleStats>,
}

/// One domain's rule tree.
#[derive(Debug)]
pub(crate) struct Domain {
    root: Level,
    /// The bucket names of `limit` overrides, one per unit.
    overrides: HashMap<Unit, LimitName>,
}

#[derive(Debug, Default)]
struct Level {
    keys: HashMap<String, KeyNodes>,
}

/// The config entries of one key at one level.
#[derive(Debug, Default)]
struct KeyNodes {
    exact: HashMap<String, Node>,
    /// In config order: the first that matches wins.
    wildcards: Vec<(Pattern, Node)>,
    any: Option<Node>,
}

#[derive(Debug)]
struct Node {
    rule: Option<Arc<Rule>>,
    children: Level,
    share_threshold: bool,
}

/// A value with `*`s, each matching zero or more characters.
#[derive(Debug)]
struct Pattern {
    parts: Vec<String>,
}

impl Pattern {
    fn new(value: &str) -> Pattern {
        Pattern {
            parts: value.split('*').map(str::to_owned).collect(),
        }
    }

    /// upstream's `wildcardMatch`, on the value alone (the key already
    /// matched).
    fn matches(&self, value: &str) -> bool {
        let parts = &self.parts;
        let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
            return false;
        };
        if parts.len() == 1 {
            return first == value;
        }
        let fixed: usize = parts.iter().map(String::len).sum();
        if value.len() < fixed
            || !value.starts_with(first.as_str())
            || !value.ends_with(last.as_str())
        {
            return false;
        }
        let mut rest = &value[first.len()..value.len() - last.len()];
        for part in &parts[1..parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// A request descriptor's rule, and the part of the bucket that comes from
/// the request's values.
#[derive(Debug)]
pub(crate) struct Matched<'c> {
    pub(crate) rule: &'c Arc<Rule>,
    pub(crate) partition: String,
}

/// Appends one value to a partition, length-prefixed so that no two value
/// lists give the same partition.
fn push_part(partition: &mut String, value: &str) {
    use std::fmt::Write as _;
    let _ = write!(partition, "{}:", value.len());
    partition.push_str(value);
}

impl Domain {
    /// upstream's `GetLimit` without an override: walk the entries down the
    /// tree (exact value, then the first matching wildcard, then key-only,
    /// at each level, no backtracking); the rule applies only if it sits on
    /// the node of the **last** entry.
    ///
    /// The bucket is the rule (its name) and the request's values at the
    /// levels matched by key-only or by a wildcard without
    /// `share_threshold` (the partition); values matched exactly are part
    /// of the rule already. This is upstream's cache key (domain, every
    /// entry, unit) without its ambiguity (`a_b`+`c` vs `a`+`b_c`).
    pub(crate) fn find<'a, 'c>(
        &'c self,
        entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ) -> Option<Matched<'c>> {
        let last = entries.len().checked_sub(1)?;
        let mut level = &self.root;
        let mut partition = String::new();
        for (i, (key, value)) in entries.enumerate() {
            let nodes = level.keys.get(key)?;
            let node = if let Some(node) = nodes.exact.get(value) {
                node
            } else if let Some((_, node)) =
                nodes.wildcards.iter().find(|(p, _)| p.matches(value))
            {
                if !node.share_threshold {
                    push_part(&mut partition, value);
                }
                node
            } else {
                let node = nodes.any.as_ref()?;
                push_part(&mut partition, value);
                node
            };
            if i == last {
                return node
                    .rule
                    .as_ref()
                    .map(|rule| Matched { rule, partition });
            }
            level = &node.children;
        }
        None
    }

    /// The bucket name of a descriptor's `limit` override in `unit`.
    pub(crate) fn override_bucket(&self, unit: Unit) -> Option<&LimitName> {
        self.overrides.get(&unit)
    }

    /// The partition of an override: every entry, keys and values.
    pub(crate) fn override_partition<'a>(
        entries: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> String {
        let mut partition = String::new();
        for (key, value) in entries {
            push_part(&mut partition, key);
            push_part(&mut partition, value);
        }
        partition
    }
}

/// The quota of `requests_per_unit` per `unit`, burst R; clamped to one
/// request per µs (burst still R) when R is above the unit's µs.
pub(crate) fn quota_for(
    requests_per_unit: u32,
    unit: Unit,
) -> (RuleLimit, bool) {
    if requests_per_unit == 0 {
        return (RuleLimit::Never, false);
    }
    let period = unit.duration();
    if let Ok(quota) = Quota::new(requests_per_unit, period) {
        return (RuleLimit::Quota(quota), false);
    }
    // T < 1 µs: one per µs, burst R. The unit's µs fit in u32 for the units
    // that can get here (second, minute, hour).
    let per_us = u32::try_from(unit.seconds() * 1_000_000).unwrap_or(u32::MAX);
    match Quota::new(per_us, period)
        .ok()
        .and_then(|q| q.try_allow_burst(requests_per_unit).ok())
    {
        Some(quota) => (RuleLimit::Quota(quota), true),
        // Unreachable for any u32 and unit (see the tests): refuse all
        // rather than allow all.
        None => (RuleLimit::Never, true),
    }
}

/// A stable name for the bucket of a rule: `rls.` and the SHA-1 of the
/// domain, the rule's path and its unit (or "unlimited").
fn bucket_name(
    domain: &str,
    path: &[(String, Option<String>)],
    unit: &str,
) -> LimitName {
    let mut hash = Sha1::new();
    let mut field = |bytes: &[u8]| {
        hash.update((bytes.len() as u64).to_be_bytes());
        hash.update(bytes);
    };
    field(b"rls-rule-v1");
    field(domain.as_bytes());
    for (key, value) in path {
        field(key.as_bytes());
        match value {
            Some(value) => field(format!("={value}").as_bytes()),
            None => field(b"*any"),
        }
    }
    field(unit.as_bytes());
    let name = format!("rls.{}", hex::encode(hash.finalize()));
    match LimitName::new(name) {
        Ok(name) => name,
        Err(_) => unreachable!("`rls.` and hex digits make a valid name"),
    }
}

fn override_name(domain: &str, unit: Unit) -> LimitName {
    let mut hash = Sha1::new();
    for part in ["rls-override-v1", domain, unit.name()] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    match LimitName::new(format!("rls.o.{}", hex::encode(hash.finalize()))) {
        Ok(name) => name,
        Err(_) => unreachable!("`rls.o.` and hex digits make a valid name"),
    }
}

/// The state of one file while it is built.
struct FileContext<'t> {
    file: &'t str,
    text: &'t str,
    merged: bool,
    domain: String,
    rules: Vec<Arc<Rule>>,
    warnings: Vec<String>,
}

impl FileContext<'_> {
    fn line(&self, path: &[usize]) -> Option<usize> {
        if self.merged {
            None
        } else {
            yaml::locate(self.text, path)
        }
    }

    fn error(&self, path: &[usize], message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.file, self.line(path), message)
    }

    fn warn(&mut self, path: &[usize], message: impl fmt::Display) {
        let warning =
            ConfigError::new(self.file, self.line(path), message.to_string());
        self.warnings.push(warning.to_string());
    }
}

impl Config {
    /// Loads `path`: one file, or a directory of them (see the [module
    /// docs](self#files)).
    ///
    /// # Errors
    ///
    /// The first problem found, with its file: one that cannot be read, a
    /// YAML error, a rule upstream refuses, two files with one domain.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let mut warnings = Vec::new();
        let sources = read_sources(path, &mut warnings)?;
        if sources.is_empty() {
            warnings.push(format!(
                "{}: no config file found: every domain is unknown and nothing is limited",
                path.display()
            ));
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
            let (raw, merged) = parse(file, text)?;
            let domain_name = raw.domain.clone().unwrap_or_default();
            if domain_name.is_empty() {
                return Err(ConfigError::new(
                    file,
                    None,
                    "config file cannot have empty domain",
                ));
            }
            if domains.contains_key(&domain_name) {
                return Err(ConfigError::new(
                    file,
                    None,
                    format!("duplicate domain '{domain_name}' in config file"),
                ));
            }
            let mut cx = FileContext {
                file,
                text,
                merged,
                domain: domain_name.clone(),
                rules: Vec::new(),
                warnings: Vec::new(),
            };
            for key in &raw.misplaced {
                cx.warn(
                    &[],
                    format_args!(
                        "key '{key}' is not used at the top level: ignored"
                    ),
                );
            }
            let root = build_level(
                &mut cx,
                &format!("{domain_name}."),
                &raw.descriptors,
                &mut Vec::new(),
                &mut Vec::new(),
            )?;
            let overrides = Unit::ALL
                .into_iter()
                .map(|unit| (unit, override_name(&domain_name, unit)))
                .collect();
            rules.append(&mut cx.rules);
            warnings.append(&mut cx.warnings);
            domains.insert(domain_name, Domain { root, overrides });
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

    pub(crate) fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    pub(crate) fn rules(&self) -> &[Arc<Rule>] {
        &self.rules
    }
}

/// Decodes one file: directly (errors with their line), or, when it uses
/// merge keys (`<<`), through `yaml_serde::Value::apply_merge` (errors
/// without a line). Only the first YAML document is read, as upstream does.
fn parse(file: &str, text: &str) -> Result<(RawRoot, bool), ConfigError> {
    use serde::Deserialize;
    let Some(document) = yaml_serde::Deserializer::from_str(text).next() else {
        return Ok((RawRoot::default(), false));
    };
    match RawRoot::deserialize(document) {
        Ok(root) => Ok((root, false)),
        Err(error) if error.to_string().contains(yaml::MERGE_KEY_MARKER) => {
            let document = yaml_serde::Deserializer::from_str(text)
                .next()
                .ok_or_else(|| {
                    ConfigError::new(file, None, "error loading config file")
                })?;
            let mut value = yaml_serde::Value::deserialize(document)
                .map_err(|e| yaml_error(file, &e))?;
            value.apply_merge().map_err(|e| yaml_error(file, &e))?;
            RawRoot::deserialize(value)
                .map(|root| (root, true))
                .map_err(|e| yaml_error(file, &e))
        }
        Err(error) => Err(yaml_error(file, &error)),
    }
}

/// A `yaml_serde` error as a [`ConfigError`]: its line apart, its path
/// (`descriptors[0].rate_limit`) after the message, and upstream's prefix
/// for errors that are not upstream's own messages.
fn yaml_error(file: &str, error: &yaml_serde::Error) -> ConfigError {
    let mut text = error.to_string();
    let line = error.location().map(|l| l.line());
    if let Some(location) = error.location() {
        let suffix = format!(
            " at line {} column {}",
            location.line(),
            location.column()
        );
        if let Some(stripped) = text.strip_suffix(&suffix) {
            text = stripped.to_owned();
        }
    }
    // yaml_serde writes `<path>: <message>`; a path is made of key names,
    // indexes and dots, never spaces.
    let mut at = None;
    if let Some((head, rest)) = text.split_once(": ") {
        let is_path = !head.is_empty()
            && head
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.[]".contains(c))
            && (head.contains('[')
                || head.contains('.')
                || yaml::VALID_KEYS.contains(&head));
        if is_path {
            at = Some(head.to_owned());
            text = rest.to_owned();
        }
    }
    if !text.starts_with("config error")
        && !text.starts_with("error loading config file")
    {
        text = format!("error loading config file: {text}");
    }
    if let Some(at) = at {
        text = format!("{text} (at {at})");
    }
    ConfigError::new(file, line, text)
}

fn build_level(
    cx: &mut FileContext<'_>,
    parent_key: &str,
    descriptors: &[RawDescriptor],
    index_path: &mut Vec<usize>,
    rule_path: &mut Vec<(String, Option<String>)>,
) -> Result<Level, ConfigError> {
    let mut level = Level::default();
    let mut composites: Vec<String> = Vec::new();
    for (i, d) in descriptors.iter().enumerate() {
        index_path.push(i);
        let key = d.key.clone().unwrap_or_default();
        if key.is_empty() {
            return Err(cx.error(index_path, "descriptor has empty key"));
        }
        let value = d.value.clone().filter(|v| !v.is_empty());
        let composite = match &value {
            Some(value) => format!("{key}_{value}"),
            None => key.clone(),
        };
        let full_key = format!("{parent_key}{composite}");
        // Upstream keys a level by `key_value`: `{a, b_c}` and `{a_b, c}`
        // collide there, and so they are refused here too.
        if composites.contains(&composite) {
            return Err(cx.error(
                index_path,
                format!("duplicate descriptor composite key '{full_key}'"),
            ));
        }
        composites.push(composite.clone());
        for misplaced in &d.misplaced {
            cx.warn(
                index_path,
                format_args!(
                    "key '{misplaced}' is not used in a descriptor: ignored"
                ),
            );
        }
        rule_path.push((key.clone(), value.clone()));
        let rule = match &d.rate_limit {
            Some(raw) => {
                let unit = raw.unit.as_deref().and_then(Unit::parse);
                if raw.unlimited {
                    if unit.is_some() {
                        return Err(cx.error(
                            index_path,
                            "should not specify rate limit unit when unlimited",
                        ));
                    }
                } else if unit.is_none() {
                    return Err(cx.error(
                        index_path,
                        format!(
                            "invalid rate limit unit '{}'",
                            raw.unit.as_deref().unwrap_or_default()
                        ),
                    ));
                }
                let name = raw.name.clone().unwrap_or_default();
                let mut replaces = Vec::new();
                for entry in &raw.replaces {
                    match entry {
                        None => {
                            return Err(cx.error(
                                index_path,
                                "should not have an empty replaces entry",
                            ));
                        }
                        Some(target) if *target == name => {
                            return Err(cx.error(
                                index_path,
                                "replaces should not contain name of same descriptor",
                            ));
                        }
                        Some(target) => replaces.push(target.clone()),
                    }
                }
                for misplaced in &raw.misplaced {
                    cx.warn(
                        index_path,
                        format_args!("key '{misplaced}' is not used in rate_limit: ignored"),
                    );
                }
                let path_label = full_key
                    .strip_prefix(&format!("{}.", cx.domain))
                    .unwrap_or(&full_key)
                    .to_owned();
                let (limit, unit, bucket_unit) = match (raw.unlimited, unit) {
                    (true, _) | (false, None) => {
                        (RuleLimit::Unlimited, Unit::Second, "unlimited")
                    }
                    (false, Some(unit)) => {
                        let (limit, clamped) =
                            quota_for(raw.requests_per_unit, unit);
                        if clamped {
                            cx.warn(
                                index_path,
                                format_args!(
                                    "'{full_key}': {} per {} is more than one request per \
                                     microsecond: clamped to 1 per µs, burst {}",
                                    raw.requests_per_unit,
                                    unit.name().to_ascii_lowercase(),
                                    raw.requests_per_unit
                                ),
                            );
                        }
                        (limit, unit, unit.name())
                    }
                };
                if d.quota_mode {
                    cx.warn(
                        index_path,
                        format_args!(
                            "'{full_key}': quota_mode is not implemented: the rule is enforced"
                        ),
                    );
                }
                let rule = Arc::new(Rule {
                    bucket: bucket_name(&cx.domain, rule_path, bucket_unit),
                    name,
                    replaces,
                    limit,
                    requests_per_unit: raw.requests_per_unit,
                    unit,
                    shadow: d.shadow_mode,
                    domain: cx.domain.clone(),
                    path: path_label,
                    stats: OnceLock::new(),
                });
                cx.rules.push(rule.clone());
                Some(rule)
            }
            None => None,
        };
        if d.share_threshold && !composite.contains('*') {
            return Err(cx.error(
                index_path,
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), \
                     but found key '{composite}'"
                ),
            ));
        }
        if key.contains('*') {
            cx.warn(
                index_path,
                format_args!(
                    "'{full_key}': a '*' in a key is matched literally here (upstream \
                     matches it as a wildcard over key and value)"
                ),
            );
        }
        let children = build_level(
            cx,
            &format!("{full_key}."),
            &d.descriptors,
            index_path,
            rule_path,
        )?;
        rule_path.pop();
        let wildcard = value.as_deref().is_some_and(|v| v.contains('*'));
        let node = Node {
            rule,
            children,
            share_threshold: d.share_threshold && wildcard,
        };
        let nodes = level.keys.entry(key).or_default();
        match value {
            None => nodes.any = Some(node),
            Some(value) if wildcard => {
                nodes.wildcards.push((Pattern::new(&value), node))
            }
            Some(value) => {
                nodes.exact.insert(value, node);
            }
        }
        index_path.pop();
    }
    Ok(level)
}

/// The files of `path`, in order: `(name, text)`.
fn read_sources(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_and_count_makes_a_rule() {
        for unit in Unit::ALL {
            for count in [
                1,
                2,
                7,
                999_999,
                1_000_000,
                1_000_001,
                3_600_000_001,
                u32::MAX,
            ] {
                let (limit, _) = quota_for(count, unit);
                let RuleLimit::Quota(quota) = limit else {
                    panic!("{count} per {unit}: {limit:?}");
                };
                assert_eq!(quota.burst(), count, "{count} per {unit}");
            }
        }
        assert_eq!(quota_for(0, Unit::Second).0, RuleLimit::Never);
        assert!(quota_for(1_000_001, Unit::Second).1, "clamped");
        assert!(!quota_for(1_000_000, Unit::Second).1);
    }

    #[test]
    fn wildcards_match_like_upstream() {
        let p = Pattern::new("bar*b");
        assert!(p.matches("barb"));
        assert!(p.matches("barXb"));
        assert!(!p.matches("barXbc"));
        let p = Pattern::new("foo*");
        assert!(p.matches("foo"));
        assert!(p.matches("foobar"));
        assert!(!p.matches("fo"));
        let p = Pattern::new("*");
        assert!(p.matches(""));
        let p = Pattern::new("a*b*c");
        assert!(p.matches("abc"));
        assert!(p.matches("a1b2c"));
        assert!(!p.matches("acb"));
        let p = Pattern::new("ab*ba");
        assert!(!p.matches("aba"), "prefix and suffix may not overlap");
    }

    #[test]
    fn partitions_are_unambiguous() {
        let a = Domain::override_partition([("a_b", "c")].into_iter());
        let b = Domain::override_partition([("a", "b_c")].into_iter());
        assert_ne!(a, b);
    }
}
