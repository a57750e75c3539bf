//! The rule tree of a domain, and how a request's descriptors are matched
//! against it (upstream's `GetLimit`).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use gcra_core::Quota;
use rate_tier_storage::LimitName;

use super::unit::Unit;
use crate::metrics::RuleStats;

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
    /// The rule's descriptors from the domain down: each key, and its
    /// value (`None`: any value).
    pub(crate) entries: Vec<(String, Option<String>)>,
    pub(crate) stats: OnceLock<RuleStats>,
}

/// One domain's rule tree.
#[derive(Debug)]
pub(crate) struct Domain {
    pub(super) root: Level,
    /// The bucket names of `limit` overrides, one per unit.
    pub(super) overrides: HashMap<Unit, LimitName>,
}

#[derive(Debug, Default)]
pub(super) struct Level {
    pub(super) keys: HashMap<String, KeyNodes>,
}

/// The config entries of one key at one level.
#[derive(Debug, Default)]
pub(super) struct KeyNodes {
    pub(super) exact: HashMap<String, Node>,
    /// In config order: the first that matches wins.
    pub(super) wildcards: Vec<(Pattern, Node)>,
    pub(super) any: Option<Node>,
}

#[derive(Debug)]
pub(super) struct Node {
    pub(super) rule: Option<Arc<Rule>>,
    pub(super) children: Level,
    pub(super) share_threshold: bool,
}

/// A value with `*`s, each matching zero or more characters.
#[derive(Debug)]
pub(super) struct Pattern {
    parts: Vec<String>,
}

impl Pattern {
    pub(super) fn new(value: &str) -> Pattern {
        Pattern {
            parts: value.split('*').map(str::to_owned).collect(),
        }
    }

    /// upstream's `wildcardMatch`, on the value alone (the key already
    /// matched).
    pub(super) fn matches(&self, value: &str) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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
