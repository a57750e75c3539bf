//! Decode: a file's first YAML document into a tree of [`Yaml`] nodes, each
//! with the line it starts on. No key is checked here (that is
//! [`super::check`]); only the YAML itself: syntax, anchors and aliases,
//! and merge keys (`<<`), which are applied here so that every later step
//! sees plain maps whose entries still know their lines.
//!
//! Scalars keep their text and whether they were plain (unquoted): what a
//! scalar means (a number, a boolean, null) is decided where it is read,
//! with YAML 1.1's rules, as envoyproxy/ratelimit's go-yaml v2 does.

use std::collections::HashMap;
use std::fmt;

use saphyr_parser::{Event, Parser, ScalarStyle, Span, StrInput};

use super::error::ConfigError;

/// At most this many nodes in a document, aliases expanded: a few aliases
/// of aliases must not expand into gigabytes ("billion laughs").
pub(super) const MAX_NODES: usize = 1_000_000;

/// At most this many lists and maps inside one another: decoding and
/// checking recurse, and a file of 8 MiB of `[` must not overflow a stack.
pub(super) const MAX_DEPTH: usize = 128;

/// One YAML node and the line (from 1) it starts on.
#[derive(Debug, Clone)]
pub(super) struct Yaml {
    pub(super) line: usize,
    pub(super) value: Value,
}

/// What a node holds.
#[derive(Debug, Clone)]
pub(super) enum Value {
    /// A scalar's text; `plain` when it was written unquoted (only a plain
    /// scalar can be null, a number or a boolean).
    Scalar {
        text: String,
        plain: bool,
    },
    List(Vec<Yaml>),
    /// Entries in file order, merge keys applied.
    Map(Vec<(Yaml, Yaml)>),
}

impl Yaml {
    /// Whether this is a null: `~`, `null`, or nothing, unquoted.
    pub(super) fn is_null(&self) -> bool {
        matches!(
            &self.value,
            Value::Scalar { text, plain: true }
                if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL")
        )
    }

    /// The node as upstream's messages show it: a scalar's text, `<nil>`,
    /// `[...]` or `map[...]`.
    pub(super) fn shown(&self) -> String {
        if self.is_null() {
            return "<nil>".to_owned();
        }
        match &self.value {
            Value::Scalar { text, .. } => text.clone(),
            Value::List(_) => "[...]".to_owned(),
            Value::Map(_) => "map[...]".to_owned(),
        }
    }
}

/// The first document of `text` (`None` when there is none, or it is
/// empty), merge keys applied.
///
/// # Errors
///
/// A YAML syntax error, an unknown alias, a merge key whose value is not a
/// map (or a list of maps), more than [`MAX_NODES`] nodes.
pub(super) fn decode(
    file: &str,
    text: &str,
) -> Result<Option<Yaml>, ConfigError> {
    let mut decoder = Decoder {
        file,
        events: Parser::new_from_str(text),
        anchors: HashMap::new(),
        nodes: 0,
        depth: 0,
    };
    // Only the first document is read, as upstream does.
    loop {
        match decoder.next()?.0 {
            Event::StreamStart | Event::Nothing => {}
            Event::DocumentStart(_) => break,
            _ => return Ok(None),
        }
    }
    let (event, span) = decoder.next()?;
    match event {
        Event::DocumentEnd | Event::StreamEnd => Ok(None),
        event => decoder.node(event, span).map(Some),
    }
}

struct Decoder<'f, 't> {
    file: &'f str,
    events: Parser<'t, StrInput<'t>>,
    anchors: HashMap<usize, Yaml>,
    nodes: usize,
    depth: usize,
}

impl<'t> Decoder<'_, 't> {
    fn error(&self, line: usize, message: impl fmt::Display) -> ConfigError {
        ConfigError::new(
            self.file,
            Some(line),
            format!("error loading config file: {message}"),
        )
    }

    fn next(&mut self) -> Result<(Event<'t>, Span), ConfigError> {
        match self.events.next() {
            Some(Ok(next)) => Ok(next),
            Some(Err(error)) => {
                Err(self.error(error.marker().line(), error.info()))
            }
            None => Ok((Event::StreamEnd, Span::default())),
        }
    }

    /// Counts `nodes` more against [`MAX_NODES`].
    fn count(&mut self, line: usize, nodes: usize) -> Result<(), ConfigError> {
        self.nodes = self.nodes.saturating_add(nodes);
        if self.nodes > MAX_NODES {
            return Err(self.error(
                line,
                format_args!(
                    "more than {MAX_NODES} YAML nodes (aliases expanded)"
                ),
            ));
        }
        Ok(())
    }

    /// The node that `event` starts, read to its end.
    fn node(
        &mut self,
        event: Event<'t>,
        span: Span,
    ) -> Result<Yaml, ConfigError> {
        if self.depth >= MAX_DEPTH {
            return Err(self.error(
                span.start.line(),
                format_args!(
                    "more than {MAX_DEPTH} lists and maps inside one another"
                ),
            ));
        }
        self.depth += 1;
        let node = self.node_within(event, span);
        self.depth -= 1;
        node
    }

    fn node_within(
        &mut self,
        event: Event<'t>,
        span: Span,
    ) -> Result<Yaml, ConfigError> {
        let line = span.start.line();
        let (value, anchor) = match event {
            Event::Scalar(text, style, anchor, _) => {
                self.count(line, 1)?;
                let plain = style == ScalarStyle::Plain;
                (
                    Value::Scalar {
                        text: text.into_owned(),
                        plain,
                    },
                    anchor,
                )
            }
            Event::SequenceStart(anchor, _) => {
                self.count(line, 1)?;
                let mut items = Vec::new();
                loop {
                    let (event, span) = self.next()?;
                    if matches!(event, Event::SequenceEnd) {
                        break;
                    }
                    items.push(self.node(event, span)?);
                }
                (Value::List(items), anchor)
            }
            Event::MappingStart(anchor, _) => {
                self.count(line, 1)?;
                let mut entries = Vec::new();
                loop {
                    let (event, span) = self.next()?;
                    if matches!(event, Event::MappingEnd) {
                        break;
                    }
                    let key = self.node(event, span)?;
                    let (event, span) = self.next()?;
                    let value = self.node(event, span)?;
                    entries.push((key, value));
                }
                let entries = merged(entries).map_err(|line| {
                    self.error(
                        line,
                        "a merge key (<<) takes a map or a list of maps",
                    )
                })?;
                (Value::Map(entries), anchor)
            }
            Event::Alias(id) => {
                let Some(target) = self.anchors.get(&id).cloned() else {
                    return Err(
                        self.error(line, "an alias of an unknown anchor")
                    );
                };
                self.count(line, size(&target))?;
                return Ok(Yaml { line, ..target });
            }
            _ => return Err(self.error(line, "unexpected end of the document")),
        };
        let node = Yaml { line, value };
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
        Ok(node)
    }
}

/// How many nodes `node` holds, itself included.
fn size(node: &Yaml) -> usize {
    match &node.value {
        Value::Scalar { .. } => 1,
        Value::List(items) => {
            items.iter().map(size).fold(1, usize::saturating_add)
        }
        Value::Map(entries) => entries
            .iter()
            .map(|(k, v)| size(k).saturating_add(size(v)))
            .fold(1, usize::saturating_add),
    }
}

/// A map's entries with its merge keys (`<<`) applied, YAML 1.1's way: the
/// map's own keys win, then the merged maps in order; a merged key keeps
/// the line where it was written. `Err(line)`: a merge key's value is not
/// a map or a list of maps.
fn merged(entries: Vec<(Yaml, Yaml)>) -> Result<Vec<(Yaml, Yaml)>, usize> {
    let is_merge = |key: &Yaml| matches!(&key.value, Value::Scalar { text, plain: true } if text == "<<");
    if !entries.iter().any(|(key, _)| is_merge(key)) {
        return Ok(entries);
    }
    let mut own = Vec::new();
    let mut sources = Vec::new();
    for (key, value) in entries {
        if !is_merge(&key) {
            own.push((key, value));
            continue;
        }
        match value.value {
            Value::Map(merged) => sources.push(merged),
            Value::List(items) => {
                for item in items {
                    match item.value {
                        Value::Map(merged) => sources.push(merged),
                        _ => return Err(item.line),
                    }
                }
            }
            Value::Scalar { .. } => return Err(value.line),
        }
    }
    let text_of = |key: &Yaml| match &key.value {
        Value::Scalar { text, .. } => Some(text.clone()),
        _ => None,
    };
    for source in sources {
        for (key, value) in source {
            let known = text_of(&key).is_some_and(|text| {
                own.iter()
                    .any(|(k, _)| text_of(k).as_deref() == Some(&text))
            });
            if !known {
                own.push((key, value));
            }
        }
    }
    Ok(own)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_keys(node: &Yaml) -> Vec<(String, usize)> {
        let Value::Map(entries) = &node.value else {
            panic!("{node:?}")
        };
        entries.iter().map(|(k, _)| (k.shown(), k.line)).collect()
    }

    #[test]
    fn every_node_knows_its_line() {
        let root = decode("c.yaml", "a: 1\nb:\n  - x\n  - {y: 2}\n")
            .unwrap()
            .unwrap();
        assert_eq!(map_keys(&root), [("a".to_owned(), 1), ("b".to_owned(), 2)]);
        let Value::Map(entries) = &root.value else {
            unreachable!()
        };
        let Value::List(items) = &entries[1].1.value else {
            unreachable!()
        };
        assert_eq!((items[0].line, items[1].line), (3, 4));
    }

    #[test]
    fn merge_keys_keep_the_maps_own_keys_first_and_the_merged_lines() {
        let text = "base: &base\n  unit: second\n  requests_per_unit: 5\nrule:\n  <<: *base\n  unit: minute\n";
        let root = decode("c.yaml", text).unwrap().unwrap();
        let Value::Map(entries) = &root.value else {
            unreachable!()
        };
        assert_eq!(
            map_keys(&entries[1].1),
            [("unit".to_owned(), 6), ("requests_per_unit".to_owned(), 3)]
        );
    }

    #[test]
    fn quoted_and_plain_scalars_are_told_apart() {
        let root = decode("c.yaml", "a: ~\nb: '~'\n").unwrap().unwrap();
        let Value::Map(entries) = &root.value else {
            unreachable!()
        };
        assert!(entries[0].1.is_null());
        assert!(!entries[1].1.is_null());
    }

    #[test]
    fn aliases_cannot_expand_without_bound() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..8 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let error = decode("c.yaml", &text).unwrap_err();
        assert!(
            error.message.contains("more than 1000000 YAML nodes"),
            "{error}"
        );
    }

    #[test]
    fn syntax_errors_and_unknown_aliases_have_a_line() {
        let error =
            decode("c.yaml", "domain: d\ndescriptors: [\n").unwrap_err();
        assert!(error.line.is_some(), "{error}");
        assert!(error.message.starts_with("error loading config file: "));
        let error = decode("c.yaml", "a: 1\nb: *nowhere\n").unwrap_err();
        assert_eq!(error.line, Some(2), "{error}");
    }

    #[test]
    fn nesting_is_bounded_before_any_stack_is() {
        // The parser's own limit, or ours: an error, never a crash.
        let text = "[".repeat(1_000_000);
        let error = decode("c.yaml", &text).unwrap_err();
        assert!(error.message.starts_with("error loading config file: "));
        let text = format!("{}x", "{a: ".repeat(MAX_DEPTH + 1));
        let text = format!("{text}{}", "}".repeat(MAX_DEPTH + 1));
        let error = decode("c.yaml", &text).unwrap_err();
        assert!(error.message.contains("error loading config file: "));
        let nested = format!("{}x{}", "[".repeat(100), "]".repeat(100));
        assert!(decode("c.yaml", &nested).is_ok());
    }

    #[test]
    fn an_empty_file_is_no_document() {
        assert!(decode("c.yaml", "").unwrap().is_none());
        assert!(decode("c.yaml", "# only a comment\n").unwrap().is_none());
    }
}
