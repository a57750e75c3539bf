//! Checks a Grafana dashboard against what a binary's `/metrics` really
//! exposes: every PromQL query of every panel and template variable may
//! name only series of that binary, with labels they carry, and use them
//! as their type allows (counters and histograms through `rate`, gauges
//! not). Included with `#[path]` by the dashboard tests of the example
//! server (`examples/tests/grafana_dashboard.rs`) and of the service
//! (`crates/rate-tier-service/tests/grafana_dashboard.rs`).
//!
//! The PromQL reading is deliberately small: identifiers, strings, label
//! matchers, `by (...)` lists and parentheses. Anything it does not know
//! (a function, a selector without a name) is reported, never skipped.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// Labels Prometheus adds to every series at scrape time.
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

/// Functions over range vectors of counters (and histogram buckets).
const COUNTER_FUNCTIONS: &str = "rate irate increase resets";

/// The PromQL functions and aggregations a dashboard may call.
const FUNCTIONS: &str = "abs absent absent_over_time avg avg_over_time \
    bottomk ceil changes clamp clamp_max clamp_min count count_over_time \
    count_values delta deriv floor group histogram_quantile idelta increase \
    irate label_join label_replace last_over_time max max_over_time min \
    min_over_time quantile quantile_over_time rate resets round scalar sort \
    sort_desc stddev stdvar sum sum_over_time timestamp topk vector";

/// Words that open a label list: `sum by (tier) (...)`, `/ on (rule)`.
const GROUPING: &str = "by without on ignoring group_left group_right";

/// Binary operators and modifiers spelt as words (`group_left` may come
/// without a label list).
const KEYWORDS: &str = "and or unless bool offset atan2 group_left group_right";

/// Whether `word` is one of the whitespace-separated `list`.
fn listed(list: &str, word: &str) -> bool {
    list.split_whitespace().any(|w| w == word)
}

/// One sample name of a scrape: its family's type, the labels seen on it.
#[derive(Debug)]
struct Series {
    kind: String,
    labels: BTreeSet<String>,
}

/// What one or more scrapes exposed, by sample name (`x_total`,
/// `x_bucket`, ...), as Prometheus stores them.
#[derive(Debug, Default)]
pub(crate) struct Exposed {
    series: BTreeMap<String, Series>,
}

impl Exposed {
    /// Adds a scrape in the Prometheus or OpenMetrics text format. A
    /// sample whose family has no `# TYPE` line is an error: its name
    /// cannot be checked against its type.
    pub(crate) fn add(&mut self, text: &str) -> Result<(), String> {
        let families: BTreeMap<&str, &str> = text
            .lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|rest| rest.split_once(' '))
            .collect();
        for line in text.lines() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            let (name, rest) = line.split_at(end);
            let kind = family_kind(&families, name)
                .ok_or_else(|| format!("{name}: no `# TYPE` line"))?;
            let series =
                self.series
                    .entry(name.to_owned())
                    .or_insert_with(|| Series {
                        kind: kind.to_owned(),
                        labels: BTreeSet::new(),
                    });
            if let Some(labels) = rest.strip_prefix('{') {
                series.labels.extend(label_names(labels)?);
            }
        }
        Ok(())
    }

    /// The sample names seen, for a failure message.
    fn names(&self) -> Vec<&str> {
        self.series.keys().map(String::as_str).collect()
    }
}

/// The type of the family `name` is a sample of: a gauge's own name, a
/// counter's `_total`, a histogram's `_bucket`, `_sum` or `_count`.
fn family_kind<'a>(
    families: &BTreeMap<&str, &'a str>,
    name: &str,
) -> Option<&'a str> {
    families.iter().find_map(|(family, &kind)| {
        let suffix = name.strip_prefix(family)?;
        let fits = match kind {
            "counter" => matches!(suffix, "_total" | "_created"),
            "histogram" => {
                matches!(suffix, "_bucket" | "_sum" | "_count" | "_created")
            }
            "summary" => matches!(suffix, "" | "_sum" | "_count" | "_created"),
            _ => suffix.is_empty(),
        };
        fits.then_some(kind)
    })
}

/// The label names of `a="x",b="y\"z"} 1`.
fn label_names(mut text: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    loop {
        text = text.trim_start_matches([',', ' ']);
        if text.starts_with('}') {
            return Ok(names);
        }
        let (name, rest) = text
            .split_once("=\"")
            .ok_or_else(|| format!("a label without a value: {text}"))?;
        names.push(name.to_owned());
        // The value ends at the first quote not escaped by a backslash.
        let mut escaped = false;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                let closes = c == '"' && !escaped;
                escaped = c == '\\' && !escaped;
                closes
            })
            .ok_or_else(|| format!("an unterminated label value: {rest}"))?;
        text = &rest[end.0 + 1..];
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Punct(char),
    /// A string, a number, a `[range]` or a Grafana `$variable`.
    Literal,
}

fn tokens(expr: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '"' | '\'' | '`' => {
                let mut escaped = false;
                loop {
                    let Some(next) = chars.next() else {
                        return Err(format!("an unterminated string: {expr}"));
                    };
                    if next == c && !escaped {
                        break;
                    }
                    escaped = next == '\\' && !escaped;
                }
                out.push(Token::Literal);
            }
            '[' => {
                if !chars.by_ref().any(|c| c == ']') {
                    return Err(format!("an unterminated range: {expr}"));
                }
                out.push(Token::Literal);
            }
            '$' => {
                if chars.next_if_eq(&'{').is_some() {
                    chars.by_ref().find(|&c| c == '}');
                } else {
                    while chars.next_if(|c| is_word(*c)).is_some() {}
                }
                out.push(Token::Literal);
            }
            c if c.is_ascii_digit() || c == '.' => {
                while chars
                    .next_if(|c| c.is_ascii_alphanumeric() || *c == '.')
                    .is_some()
                {}
                out.push(Token::Literal);
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let mut word = String::from(c);
                while let Some(c) = chars.next_if(|c| is_word(*c)) {
                    word.push(c);
                }
                out.push(Token::Word(word));
            }
            c => out.push(Token::Punct(c)),
        }
    }
    Ok(out)
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// A metric named in a query, with what surrounds it.
#[derive(Debug)]
struct Use {
    name: String,
    /// The label names of its matchers.
    matchers: Vec<String>,
    /// The functions it is inside, outermost first.
    inside: Vec<String>,
}

/// A query, read: its metrics and the labels of its `by (...)` lists.
#[derive(Debug, Default)]
struct Query {
    uses: Vec<Use>,
    grouping: Vec<String>,
}

fn read(expr: &str) -> Result<Query, String> {
    let tokens = tokens(expr)?;
    let mut query = Query::default();
    // One entry per open parenthesis: the function it calls, if any.
    let mut stack: Vec<Option<String>> = Vec::new();
    // An aggregation waiting for its `(` after a `by (...)` list.
    let mut pending: Option<String> = None;
    let mut i = 0;
    let next_is =
        |i: usize, c: char| tokens.get(i + 1) == Some(&Token::Punct(c));
    while let Some(token) = tokens.get(i) {
        match token {
            Token::Word(word) if listed(GROUPING, word) && next_is(i, '(') => {
                i += 2;
                while let Some(Token::Word(label)) = tokens.get(i) {
                    query.grouping.push(label.clone());
                    i += 1;
                    if tokens.get(i) == Some(&Token::Punct(',')) {
                        i += 1;
                    }
                }
                if tokens.get(i) != Some(&Token::Punct(')')) {
                    return Err(format!(
                        "a `{word} (...)` list not closed: {expr}"
                    ));
                }
            }
            Token::Word(word) if listed(KEYWORDS, word) => {}
            Token::Word(word) if listed(FUNCTIONS, word) => {
                pending = Some(word.clone());
            }
            Token::Word(word) if next_is(i, '(') => {
                return Err(format!(
                    "`{word}` is not a PromQL function: {expr}"
                ));
            }
            Token::Word(word) => {
                let mut matchers = Vec::new();
                if next_is(i, '{') {
                    i += 2;
                    // label, operator, "value", then `,` or `}`.
                    while let Some(Token::Word(label)) = tokens.get(i) {
                        matchers.push(label.clone());
                        i += 1;
                        while matches!(
                            tokens.get(i),
                            Some(Token::Punct('=' | '!' | '~'))
                        ) {
                            i += 1;
                        }
                        if tokens.get(i) != Some(&Token::Literal) {
                            return Err(format!(
                                "a matcher of `{label}` without a value: {expr}"
                            ));
                        }
                        i += 1;
                        if tokens.get(i) == Some(&Token::Punct(',')) {
                            i += 1;
                        }
                    }
                    if tokens.get(i) != Some(&Token::Punct('}')) {
                        return Err(format!(
                            "matchers of `{word}` not closed: {expr}"
                        ));
                    }
                }
                query.uses.push(Use {
                    name: word.clone(),
                    matchers,
                    inside: stack.iter().flatten().cloned().collect(),
                });
            }
            Token::Punct('{') => {
                return Err(format!(
                    "a selector without a metric name: {expr}"
                ));
            }
            Token::Punct('(') => stack.push(pending.take()),
            Token::Punct(')') => {
                stack
                    .pop()
                    .ok_or_else(|| format!("a `)` too many: {expr}"))?;
            }
            _ => {}
        }
        i += 1;
    }
    if !stack.is_empty() {
        return Err(format!("a `(` not closed: {expr}"));
    }
    Ok(query)
}

/// Checks one query: `place` names it in the problems. `typed` also
/// checks each series is used as its type allows (not for a variable's
/// `label_values`, which reads any series).
fn check_query(
    place: &str,
    expr: &str,
    typed: bool,
    prefixes: &[&str],
    exposed: &Exposed,
    used: &mut BTreeSet<String>,
    problems: &mut Vec<String>,
) -> Option<Query> {
    let query = match read(expr) {
        Ok(query) => query,
        Err(error) => {
            problems.push(format!("{place}: {error}"));
            return None;
        }
    };
    let mut problem =
        |text: String| problems.push(format!("{place}: {text} in `{expr}`"));
    if query.uses.is_empty() {
        problem("no metric".to_owned());
    }
    let mut labels: BTreeSet<&str> = TARGET_LABELS.into_iter().collect();
    for metric in &query.uses {
        let name = metric.name.as_str();
        if !prefixes.iter().any(|prefix| name.starts_with(prefix)) {
            problem(format!(
                "`{name}` is not a metric of this binary ({prefixes:?})"
            ));
            continue;
        }
        used.insert(metric.name.clone());
        let Some(series) = exposed.series.get(name) else {
            problem(format!("`{name}` is not in the scrape"));
            continue;
        };
        labels.extend(series.labels.iter().map(String::as_str));
        for label in &metric.matchers {
            if !series.labels.contains(label)
                && !TARGET_LABELS.contains(&label.as_str())
            {
                problem(format!(
                    "`{name}` has no label `{label}` (it has {:?})",
                    series.labels
                ));
            }
        }
        if !typed {
            continue;
        }
        let in_rate =
            metric.inside.iter().any(|f| listed(COUNTER_FUNCTIONS, f));
        let monotonic = series.kind == "counter" || name.ends_with("_bucket");
        if monotonic && !in_rate {
            problem(format!(
                "`{name}` is a counter: chart its rate or increase"
            ));
        }
        if series.kind == "gauge" && in_rate {
            problem(format!(
                "`{name}` is a gauge: rate and increase are for counters"
            ));
        }
        if metric.inside.iter().any(|f| f == "histogram_quantile")
            && !name.ends_with("_bucket")
        {
            problem(format!(
                "histogram_quantile of `{name}`, not of a `_bucket`"
            ));
        }
    }
    for label in &query.grouping {
        if !labels.contains(label.as_str()) {
            problem(format!("no metric of the query has the label `{label}`"));
        }
    }
    Some(query)
}

/// Every panel, rows' panels included.
fn panels(list: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in list.as_array().into_iter().flatten() {
        out.push(panel);
        out.extend(panels(&panel["panels"]));
    }
    out
}

/// Checks `dashboard` against `exposed`: the metric names its queries use,
/// or every problem found. Metric names must start with one of `prefixes`.
pub(crate) fn check(
    dashboard: &Value,
    prefixes: &[&str],
    exposed: &Exposed,
) -> Result<BTreeSet<String>, Vec<String>> {
    let mut used = BTreeSet::new();
    let mut problems = Vec::new();
    let mut ids = BTreeSet::new();
    let mut queries = 0;
    for panel in panels(&dashboard["panels"]) {
        let title = panel["title"].as_str().unwrap_or("");
        if !ids.insert(panel["id"].as_u64()) {
            problems.push(format!(
                "panel {title:?}: its id is missing or not unique"
            ));
        }
        let targets = panel["targets"].as_array();
        if targets.is_some() && panel["datasource"]["uid"] != "${DS_PROMETHEUS}"
        {
            problems.push(format!(
                "panel {title:?}: its datasource is not ${{DS_PROMETHEUS}}"
            ));
        }
        for target in targets.into_iter().flatten() {
            let place = format!("panel {title:?} query {}", target["refId"]);
            match target["expr"].as_str() {
                Some(expr) => {
                    queries += 1;
                    check_query(
                        &place,
                        expr,
                        true,
                        prefixes,
                        exposed,
                        &mut used,
                        &mut problems,
                    );
                }
                None => problems.push(format!("{place}: no `expr`")),
            }
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] != "query" {
            continue;
        }
        let place = format!("variable {}", variable["name"]);
        let query = variable["query"]["query"]
            .as_str()
            .or(variable["query"].as_str());
        // label_values(SELECTOR, LABEL): the selector is PromQL.
        let Some((selector, label)) = query
            .and_then(|q| q.strip_prefix("label_values("))
            .and_then(|q| q.strip_suffix(')'))
            .and_then(|q| q.rsplit_once(','))
        else {
            problems.push(format!(
                "{place}: not a label_values(metric, label) query: {query:?}"
            ));
            continue;
        };
        queries += 1;
        let label = label.trim();
        if let Some(read) = check_query(
            &place,
            selector,
            false,
            prefixes,
            exposed,
            &mut used,
            &mut problems,
        ) {
            for metric in read.uses {
                let has = exposed
                    .series
                    .get(&metric.name)
                    .is_some_and(|s| s.labels.contains(label));
                if !has {
                    problems.push(format!(
                        "{place}: `{}` has no label `{label}`",
                        metric.name
                    ));
                }
            }
        }
    }
    if queries == 0 {
        problems.push("no query at all".to_owned());
    }
    if problems.is_empty() {
        Ok(used)
    } else {
        problems.push(format!("the scrape has: {:?}", exposed.names()));
        Err(problems)
    }
}
