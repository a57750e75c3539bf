//! Check: the decoded YAML of one file against envoyproxy/ratelimit's keys,
//! into a raw tree (still no semantic rule: those are in [`super::build`]).
//!
//! Upstream reads a file twice: once into a generic map whose keys must all
//! belong to one global set (`config error, unknown key 'x'`), then into
//! typed structs that silently drop a known key in the wrong place (a
//! `shadow_mode` inside `rate_limit`). Here each level takes its own keys,
//! refuses a key outside the global set with upstream's message, and keeps
//! a known key of another level as a warning (accepted, as upstream accepts
//! it, but said). A key given twice in one map is an error (go-yaml v2
//! keeps the last one silently).
//!
//! Scalars follow go-yaml v2 (YAML 1.1) where it matters: a number or a
//! boolean read into a string keeps its text (`value: 200` is `"200"`);
//! `~`, `null` and an empty value are "absent"; booleans accept `yes`/`no`/
//! `on`/`off`/`y`/`n`; integers accept `0x`, `0b`, `0o`, a leading-zero
//! octal (`010` is 8) and underscores.

use super::decode::{Value, Yaml};
use super::error::ConfigError;

/// Every key upstream knows, at any level (`validKeys` in its
/// `config_impl.go`).
pub(super) const VALID_KEYS: [&str; 16] = [
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// The top of a file.
#[derive(Debug, Default)]
pub(super) struct RawRoot {
    pub(super) line: usize,
    pub(super) domain: Option<String>,
    pub(super) descriptors: Vec<RawDescriptor>,
    /// Known keys found at a level that does not use them (ignored).
    pub(super) misplaced: Vec<String>,
}

/// One `descriptors` entry, at any depth.
#[derive(Debug, Default)]
pub(super) struct RawDescriptor {
    /// Where its map starts.
    pub(super) line: usize,
    pub(super) key: Option<String>,
    pub(super) value: Option<String>,
    pub(super) rate_limit: Option<RawRateLimit>,
    pub(super) descriptors: Vec<RawDescriptor>,
    pub(super) shadow_mode: bool,
    pub(super) quota_mode: bool,
    pub(super) detailed_metric: bool,
    pub(super) value_to_metric: bool,
    pub(super) share_threshold: bool,
    pub(super) has_metadata: bool,
    pub(super) misplaced: Vec<String>,
}

/// A `rate_limit` map.
#[derive(Debug, Default)]
pub(super) struct RawRateLimit {
    pub(super) unit: Option<String>,
    pub(super) requests_per_unit: u32,
    pub(super) unlimited: bool,
    pub(super) name: Option<String>,
    /// The `name` of each `replaces` entry (`None` when missing or empty).
    pub(super) replaces: Vec<Option<String>>,
    pub(super) misplaced: Vec<String>,
}

/// Checks one file's document (`None`: an empty file).
///
/// # Errors
///
/// The first key or value upstream would refuse, with its line.
pub(super) fn check(
    file: &str,
    document: Option<&Yaml>,
) -> Result<RawRoot, ConfigError> {
    let cx = Checker { file };
    let Some(document) = document.filter(|d| !d.is_null()) else {
        return Ok(RawRoot::default());
    };
    let mut root = RawRoot {
        line: document.line,
        ..RawRoot::default()
    };
    for Entry { key, line, value } in cx.map(document, "the top level")? {
        match key {
            "domain" => root.domain = cx.text(value)?,
            "descriptors" => {
                root.descriptors = cx
                    .maps(value, "descriptors")?
                    .into_iter()
                    .map(|d| cx.descriptor(d))
                    .collect::<Result<_, _>>()?;
            }
            other => cx.foreign(other, line, value, &mut root.misplaced)?,
        }
    }
    Ok(root)
}

/// A map entry whose key was checked.
struct Entry<'y> {
    key: &'y str,
    /// The key's line.
    line: usize,
    value: &'y Yaml,
}

struct Checker<'f> {
    file: &'f str,
}

impl Checker<'_> {
    fn config_error(
        &self,
        line: usize,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::new(self.file, Some(line), message)
    }

    fn loading_error(
        &self,
        line: usize,
        message: impl std::fmt::Display,
    ) -> ConfigError {
        self.config_error(line, format!("error loading config file: {message}"))
    }

    /// A map's entries, its keys checked: strings, each once.
    fn map<'y>(
        &self,
        node: &'y Yaml,
        what: &str,
    ) -> Result<Vec<Entry<'y>>, ConfigError> {
        let Value::Map(entries) = &node.value else {
            return Err(self.loading_error(
                node.line,
                format_args!("{what} must be a map, not {}", node.shown()),
            ));
        };
        let mut checked: Vec<Entry<'y>> = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            let name = self.key(key)?;
            if checked.iter().any(|seen| seen.key == name) {
                return Err(self.config_error(
                    key.line,
                    format!("config error, key '{name}' appears twice in the same map"),
                ));
            }
            checked.push(Entry {
                key: name,
                line: key.line,
                value,
            });
        }
        Ok(checked)
    }

    /// A map key: a string, or upstream's error for any other scalar.
    fn key<'y>(&self, key: &'y Yaml) -> Result<&'y str, ConfigError> {
        let not_a_string = |shown: &dyn std::fmt::Display| {
            self.config_error(
                key.line,
                format!("config error, key is not of type string: {shown}"),
            )
        };
        match &key.value {
            Value::Scalar { text, plain: false } => Ok(text),
            Value::Scalar { text, plain: true } => match plain_scalar(text) {
                Plain::Text => Ok(text),
                Plain::Null => Err(not_a_string(&"<nil>")),
                Plain::Bool(b) => Err(not_a_string(&b)),
                Plain::Int(n) => Err(not_a_string(&n)),
                Plain::Float => Err(not_a_string(text)),
            },
            _ => Err(not_a_string(&key.shown())),
        }
    }

    /// A string field: the scalar's text whatever its type; `None` when null.
    fn text(&self, node: &Yaml) -> Result<Option<String>, ConfigError> {
        if node.is_null() {
            return Ok(None);
        }
        match &node.value {
            Value::Scalar { text, .. } => Ok(Some(text.clone())),
            _ => Err(self.loading_error(
                node.line,
                format_args!("cannot unmarshal {} into string", node.shown()),
            )),
        }
    }

    /// A boolean, YAML 1.1 style (`yes`, `on`, `y`...); null is false.
    fn flag(&self, node: &Yaml, name: &str) -> Result<bool, ConfigError> {
        if node.is_null() {
            return Ok(false);
        }
        let shown = node.shown();
        match yaml11_bool(&shown) {
            Some(b) if matches!(node.value, Value::Scalar { .. }) => Ok(b),
            _ => Err(self.loading_error(
                node.line,
                format_args!("cannot read {shown:?} as a boolean for `{name}`"),
            )),
        }
    }

    /// `requests_per_unit`: an unsigned 32-bit integer (null is 0).
    fn count(&self, node: &Yaml) -> Result<u32, ConfigError> {
        if node.is_null() {
            return Ok(0);
        }
        let out_of_range = |shown: &dyn std::fmt::Display| {
            self.loading_error(
                node.line,
                format_args!(
                    "cannot unmarshal {shown} into uint32 (requests_per_unit)"
                ),
            )
        };
        let Value::Scalar { text, plain } = &node.value else {
            return Err(out_of_range(&node.shown()));
        };
        match yaml11_int(text) {
            Some(n) => u32::try_from(n).map_err(|_| out_of_range(&n)),
            None if *plain
                && matches!(
                    plain_scalar(text),
                    Plain::Float | Plain::Bool(_)
                ) =>
            {
                Err(out_of_range(text))
            }
            None => Err(out_of_range(&format_args!("{text:?}"))),
        }
    }

    /// A list whose elements must all be maps (null: no elements).
    fn maps<'y>(
        &self,
        node: &'y Yaml,
        what: &str,
    ) -> Result<Vec<&'y Yaml>, ConfigError> {
        if node.is_null() {
            return Ok(Vec::new());
        }
        let Value::List(items) = &node.value else {
            return Err(self.loading_error(
                node.line,
                format_args!(
                    "`{what}` must be a list of maps, not {}",
                    node.shown()
                ),
            ));
        };
        items
            .iter()
            .map(|item| match item.value {
                Value::Map(_) => Ok(item),
                _ => Err(self.config_error(
                    item.line,
                    format!(
                        "config error, yaml file contains list of type other than map: {}",
                        item.shown()
                    ),
                )),
            })
            .collect()
    }

    fn descriptor(&self, node: &Yaml) -> Result<RawDescriptor, ConfigError> {
        let mut d = RawDescriptor {
            line: node.line,
            ..RawDescriptor::default()
        };
        for Entry { key, line, value } in self.map(node, "a descriptor")? {
            match key {
                "key" => d.key = self.text(value)?,
                "value" => d.value = self.text(value)?,
                "rate_limit" => d.rate_limit = self.rate_limit(value)?,
                "descriptors" => {
                    d.descriptors = self
                        .maps(value, "descriptors")?
                        .into_iter()
                        .map(|child| self.descriptor(child))
                        .collect::<Result<_, _>>()?;
                }
                "shadow_mode" => d.shadow_mode = self.flag(value, key)?,
                "quota_mode" => d.quota_mode = self.flag(value, key)?,
                "detailed_metric" => {
                    d.detailed_metric = self.flag(value, key)?
                }
                "value_to_metric" => {
                    d.value_to_metric = self.flag(value, key)?
                }
                "share_threshold" => {
                    d.share_threshold = self.flag(value, key)?
                }
                "metadata" => d.has_metadata = self.metadata(value)?,
                other => self.foreign(other, line, value, &mut d.misplaced)?,
            }
        }
        Ok(d)
    }

    /// `rate_limit`: a map, or null (the same as absent).
    fn rate_limit(
        &self,
        node: &Yaml,
    ) -> Result<Option<RawRateLimit>, ConfigError> {
        if node.is_null() {
            return Ok(None);
        }
        let mut r = RawRateLimit::default();
        for Entry { key, line, value } in self.map(node, "`rate_limit`")? {
            match key {
                "unit" => r.unit = self.text(value)?,
                "requests_per_unit" => {
                    r.requests_per_unit = self.count(value)?
                }
                "unlimited" => r.unlimited = self.flag(value, key)?,
                "name" => r.name = self.text(value)?,
                "replaces" => {
                    r.replaces = self
                        .maps(value, "replaces")?
                        .into_iter()
                        .map(|entry| self.replaces(entry))
                        .collect::<Result<_, _>>()?;
                }
                other => self.foreign(other, line, value, &mut r.misplaced)?,
            }
        }
        Ok(Some(r))
    }

    /// A `replaces` entry: `{name: ...}`.
    fn replaces(&self, node: &Yaml) -> Result<Option<String>, ConfigError> {
        let mut name = None;
        let mut ignored = Vec::new();
        for Entry { key, line, value } in
            self.map(node, "a `replaces` entry")?
        {
            match key {
                "name" => name = self.text(value)?,
                other => self.foreign(other, line, value, &mut ignored)?,
            }
        }
        Ok(name.filter(|n| !n.is_empty()))
    }

    /// `metadata`: any map, or null. It is accepted and not used (see the
    /// module docs), but its keys are checked like any map's.
    fn metadata(&self, node: &Yaml) -> Result<bool, ConfigError> {
        if node.is_null() {
            return Ok(false);
        }
        let Value::Map(entries) = &node.value else {
            return Err(
                self.loading_error(node.line, "`metadata` must be a map")
            );
        };
        let mut seen: Vec<String> = Vec::with_capacity(entries.len());
        for (key, _) in entries {
            let shown = key.shown();
            if seen.contains(&shown) {
                return Err(self.loading_error(
                    key.line,
                    format_args!("key {shown:?} appears twice in `metadata`"),
                ));
            }
            seen.push(shown);
        }
        Ok(true)
    }

    /// A key that is not this level's own: upstream's error outside the
    /// global set, else ignored (and said); the keys below it are still
    /// checked, as upstream's generic pass checks them.
    fn foreign(
        &self,
        key: &str,
        line: usize,
        value: &Yaml,
        misplaced: &mut Vec<String>,
    ) -> Result<(), ConfigError> {
        if !VALID_KEYS.contains(&key) {
            return Err(self.config_error(
                line,
                format!("config error, unknown key '{key}'"),
            ));
        }
        misplaced.push(key.to_owned());
        if key != "metadata" {
            self.generic(value)?;
        }
        Ok(())
    }

    /// Upstream's generic key check: every map's keys in the global set,
    /// every list's elements maps.
    fn generic(&self, node: &Yaml) -> Result<(), ConfigError> {
        match &node.value {
            Value::Scalar { .. } => Ok(()),
            Value::List(_) => {
                for item in self.maps(node, "a list")? {
                    self.generic(item)?;
                }
                Ok(())
            }
            Value::Map(_) => {
                for Entry { key, line, value } in self.map(node, "a map")? {
                    if !VALID_KEYS.contains(&key) {
                        return Err(self.config_error(
                            line,
                            format!("config error, unknown key '{key}'"),
                        ));
                    }
                    if key != "metadata" {
                        self.generic(value)?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// What an unquoted scalar is in YAML 1.1.
enum Plain {
    Null,
    Bool(bool),
    Int(i128),
    Float,
    Text,
}

fn plain_scalar(text: &str) -> Plain {
    if matches!(text, "" | "~" | "null" | "Null" | "NULL") {
        return Plain::Null;
    }
    if let Some(b) = yaml11_bool(text) {
        return Plain::Bool(b);
    }
    if let Some(n) = yaml11_int(text) {
        return Plain::Int(n);
    }
    let unsigned = text.trim_start_matches(['-', '+']);
    let special = matches!(
        unsigned,
        ".inf" | ".Inf" | ".INF" | ".nan" | ".NaN" | ".NAN"
    );
    let number = unsigned.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && text.replace('_', "").parse::<f64>().is_ok();
    if special || number {
        Plain::Float
    } else {
        Plain::Text
    }
}

/// A YAML 1.1 boolean.
fn yaml11_bool(text: &str) -> Option<bool> {
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true"
        | "True" | "TRUE" => Some(true),
        "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false"
        | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// An integer in YAML 1.1's syntax: sign, `0x`, `0b`, `0o` or a leading
/// `0` (octal), `_` separators.
fn yaml11_int(text: &str) -> Option<i128> {
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let digits: String = digits.chars().filter(|c| *c != '_').collect();
    let (radix, body) = if let Some(hex) = digits.strip_prefix("0x") {
        (16, hex)
    } else if let Some(bin) = digits.strip_prefix("0b") {
        (2, bin)
    } else if let Some(oct) = digits.strip_prefix("0o") {
        (8, oct)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, &digits[1..])
    } else {
        (10, digits.as_str())
    };
    // `from_str_radix` would take a second sign.
    if body.is_empty() || body.starts_with(['+', '-']) {
        return None;
    }
    let magnitude = i128::from_str_radix(body, radix).ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml11_integers() {
        assert_eq!(yaml11_int("010"), Some(8));
        assert_eq!(yaml11_int("0x10"), Some(16));
        assert_eq!(yaml11_int("1_000"), Some(1000));
        assert_eq!(yaml11_int("-3"), Some(-3));
        assert_eq!(yaml11_int("abc"), None);
        assert_eq!(yaml11_int("0"), Some(0));
        assert_eq!(yaml11_int("--3"), None);
    }

    #[test]
    fn plain_scalars_resolve_as_yaml_1_1() {
        assert!(matches!(plain_scalar("0.25"), Plain::Float));
        assert!(matches!(plain_scalar("yes"), Plain::Bool(true)));
        assert!(matches!(plain_scalar("~"), Plain::Null));
        assert!(matches!(plain_scalar("remote_address"), Plain::Text));
        assert!(matches!(plain_scalar("1.2.3.4"), Plain::Text));
    }
}
