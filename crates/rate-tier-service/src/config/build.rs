//! Build: a checked file's raw tree into its domain's rule tree, with
//! upstream's semantic rules (units, `unlimited`, `replaces`, composite
//! keys, `share_threshold`) and their messages.

use std::fmt;
use std::sync::{Arc, OnceLock};

use gcra_core::Quota;
use rate_tier_storage::LimitName;
use sha1::{Digest, Sha1};

use super::check::{RawDescriptor, RawRoot};
use super::error::ConfigError;
use super::tree::{Domain, Level, Node, Pattern, Rule, RuleLimit};
use super::unit::Unit;

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

/// One file's domain, built.
pub(super) struct Built {
    pub(super) domain: Domain,
    pub(super) rules: Vec<Arc<Rule>>,
    pub(super) warnings: Vec<String>,
}

/// Builds one checked file.
///
/// # Errors
///
/// The first rule upstream refuses, with the line of its descriptor.
pub(super) fn build(file: &str, raw: &RawRoot) -> Result<Built, ConfigError> {
    let domain = raw.domain.clone().unwrap_or_default();
    if domain.is_empty() {
        return Err(ConfigError::new(
            file,
            None,
            "config file cannot have empty domain",
        ));
    }
    let mut cx = FileContext {
        file,
        domain: domain.clone(),
        rules: Vec::new(),
        warnings: Vec::new(),
    };
    for key in &raw.misplaced {
        cx.warn(
            raw.line,
            format_args!("key '{key}' is not used at the top level: ignored"),
        );
    }
    let root = build_level(
        &mut cx,
        &format!("{domain}."),
        &raw.descriptors,
        &mut Vec::new(),
    )?;
    let overrides = Unit::ALL
        .into_iter()
        .map(|unit| (unit, override_name(&domain, unit)))
        .collect();
    Ok(Built {
        domain: Domain { root, overrides },
        rules: cx.rules,
        warnings: cx.warnings,
    })
}

/// The state of one file while it is built.
struct FileContext<'f> {
    file: &'f str,
    domain: String,
    rules: Vec<Arc<Rule>>,
    warnings: Vec<String>,
}

impl FileContext<'_> {
    fn error(&self, line: usize, message: impl Into<String>) -> ConfigError {
        ConfigError::new(self.file, Some(line), message)
    }

    fn warn(&mut self, line: usize, message: impl fmt::Display) {
        let warning =
            ConfigError::new(self.file, Some(line), message.to_string());
        self.warnings.push(warning.to_string());
    }
}

fn build_level(
    cx: &mut FileContext<'_>,
    parent_key: &str,
    descriptors: &[RawDescriptor],
    rule_path: &mut Vec<(String, Option<String>)>,
) -> Result<Level, ConfigError> {
    let mut level = Level::default();
    let mut composites: Vec<String> = Vec::new();
    for d in descriptors {
        let key = d.key.clone().unwrap_or_default();
        if key.is_empty() {
            return Err(cx.error(d.line, "descriptor has empty key"));
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
                d.line,
                format!("duplicate descriptor composite key '{full_key}'"),
            ));
        }
        composites.push(composite.clone());
        for misplaced in &d.misplaced {
            cx.warn(
                d.line,
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
                            d.line,
                            "should not specify rate limit unit when unlimited",
                        ));
                    }
                } else if unit.is_none() {
                    return Err(cx.error(
                        d.line,
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
                                d.line,
                                "should not have an empty replaces entry",
                            ));
                        }
                        Some(target) if *target == name => {
                            return Err(cx.error(
                                d.line,
                                "replaces should not contain name of same descriptor",
                            ));
                        }
                        Some(target) => replaces.push(target.clone()),
                    }
                }
                for misplaced in &raw.misplaced {
                    cx.warn(
                        d.line,
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
                                d.line,
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
                        d.line,
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
                    entries: rule_path.clone(),
                    stats: OnceLock::new(),
                });
                cx.rules.push(rule.clone());
                Some(rule)
            }
            None => None,
        };
        if d.share_threshold && !composite.contains('*') {
            return Err(cx.error(
                d.line,
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), \
                     but found key '{composite}'"
                ),
            ));
        }
        if key.contains('*') {
            cx.warn(
                d.line,
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
    }
    Ok(level)
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
}
