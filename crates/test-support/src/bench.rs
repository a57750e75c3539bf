//! What the workspace's benchmark binaries share with `cargo xtask bench`:
//! a command line of `--name value` pairs (the `--bench` flag that `cargo
//! bench` adds is ignored), and results written to `--out` as one flat JSON
//! object.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// `--name value` pairs from the command line.
///
/// ```
/// use rate_tier_test_support::bench::Args;
///
/// let args = Args::from_args(["--bench", "--seconds", "1.5", "--rounds", "3"]);
/// assert_eq!(args.num("rounds", 1_u32), 3);
/// assert_eq!(args.secs("seconds", 5.0).as_millis(), 1_500);
/// assert_eq!(args.get("out"), None);
/// ```
#[derive(Debug)]
pub struct Args {
    values: BTreeMap<String, String>,
}

impl Args {
    /// Reads this process's command line; panics on a flag without a value.
    pub fn parse() -> Self {
        Self::from_args(std::env::args().skip(1))
    }

    /// Reads `args` as a command line (without the program's name).
    pub fn from_args<I>(args: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        let mut values = BTreeMap::new();
        let mut args = args.into_iter().map(Into::into);
        while let Some(arg) = args.next() {
            if arg == "--bench" {
                continue; // added by `cargo bench`
            }
            let Some(name) = arg.strip_prefix("--") else {
                panic!("unexpected argument {arg:?}: expected --name value");
            };
            let value = args
                .next()
                .unwrap_or_else(|| panic!("--{name} needs a value"));
            values.insert(name.to_owned(), value);
        }
        Args { values }
    }

    /// The value of `--name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// The value of `--name` parsed, or `default`.
    pub fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> T {
        match self.get(name) {
            Some(value) => value.parse().unwrap_or_else(|_| {
                panic!("--{name} {value:?} is not a number")
            }),
            None => default,
        }
    }

    /// `--name` as a number of seconds (fractions allowed), or `default`.
    pub fn secs(&self, name: &str, default: f64) -> Duration {
        Duration::from_secs_f64(self.num(name, default))
    }
}

/// A flat JSON object of numbers and strings, written with no dependency.
///
/// ```
/// use rate_tier_test_support::bench::Results;
///
/// let mut results = Results::default();
/// results.num("rps", 1500.5).num("p99", f64::NAN).text("by", "a \"b\"");
/// assert_eq!(
///     results.to_json(),
///     "{\n  \"rps\": 1500.5,\n  \"p99\": null,\n  \"by\": \"a \\\"b\\\"\"\n}\n"
/// );
/// ```
#[derive(Debug, Default)]
pub struct Results {
    fields: Vec<(String, String)>,
}

impl Results {
    /// Adds a number (`null` when it is not finite).
    pub fn num(&mut self, name: &str, value: f64) -> &mut Self {
        let json = if value.is_finite() {
            format!("{value}")
        } else {
            "null".to_owned()
        };
        self.fields.push((name.to_owned(), json));
        self
    }

    /// Adds a string (quotes and backslashes escaped, control characters
    /// made spaces).
    pub fn text(&mut self, name: &str, value: &str) -> &mut Self {
        let mut escaped = String::with_capacity(value.len());
        for c in value.chars() {
            match c {
                '"' | '\\' => {
                    escaped.push('\\');
                    escaped.push(c);
                }
                c if c.is_control() => escaped.push(' '),
                c => escaped.push(c),
            }
        }
        self.fields
            .push((name.to_owned(), format!("\"{escaped}\"")));
        self
    }

    /// The object, one field per line.
    pub fn to_json(&self) -> String {
        let mut json = String::from("{\n");
        for (i, (name, value)) in self.fields.iter().enumerate() {
            let comma = if i + 1 < self.fields.len() { "," } else { "" };
            let _ = writeln!(json, "  \"{name}\": {value}{comma}");
        }
        json.push_str("}\n");
        json
    }

    /// Writes the object to `--out`, if given; panics if it cannot.
    pub fn write(&self, args: &Args) {
        let Some(path) = args.get("out") else {
            return;
        };
        std::fs::write(path, self.to_json())
            .unwrap_or_else(|e| panic!("could not write {path}: {e}"));
    }
}
