//! What the non-criterion benchmarks share: their command line, the JSON
//! file of results that `cargo xtask bench` reads, and the resident size.
//!
//! Each benchmark binary takes `--name value` pairs and ignores the `--bench`
//! flag that `cargo bench` adds. It prints what it measures as it goes, and
//! writes its results, one flat JSON object of numbers and strings, to the
//! path given by `--out` (if any).
#![allow(dead_code)]

pub(crate) mod apps;
pub(crate) mod hot;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// `--name value` pairs from the command line.
pub(crate) struct Args {
    values: BTreeMap<String, String>,
}

impl Args {
    /// Reads the command line; panics on a flag without a value.
    pub(crate) fn parse() -> Self {
        let mut values = BTreeMap::new();
        let mut args = std::env::args().skip(1);
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
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// The value of `--name` parsed, or `default`.
    pub(crate) fn num<T: std::str::FromStr>(
        &self,
        name: &str,
        default: T,
    ) -> T {
        match self.get(name) {
            Some(value) => value.parse().unwrap_or_else(|_| {
                panic!("--{name} {value:?} is not a number")
            }),
            None => default,
        }
    }

    /// `--name` as a number of seconds (fractions allowed), or `default`.
    pub(crate) fn secs(&self, name: &str, default: f64) -> Duration {
        Duration::from_secs_f64(self.num(name, default))
    }
}

/// A flat JSON object, written with no dependency.
#[derive(Default)]
pub(crate) struct Results {
    fields: Vec<(String, String)>,
}

impl Results {
    pub(crate) fn num(&mut self, name: &str, value: f64) -> &mut Self {
        let json = if value.is_finite() {
            format!("{value}")
        } else {
            "null".to_owned()
        };
        self.fields.push((name.to_owned(), json));
        self
    }

    pub(crate) fn text(&mut self, name: &str, value: &str) -> &mut Self {
        let escaped: String = value
            .chars()
            .flat_map(|c| match c {
                '"' => vec!['\\', '"'],
                '\\' => vec!['\\', '\\'],
                c if c.is_control() => vec![' '],
                c => vec![c],
            })
            .collect();
        self.fields
            .push((name.to_owned(), format!("\"{escaped}\"")));
        self
    }

    /// Writes the object to `--out`, if given.
    pub(crate) fn write(&self, args: &Args) {
        let Some(path) = args.get("out") else {
            return;
        };
        let mut json = String::from("{\n");
        for (i, (name, value)) in self.fields.iter().enumerate() {
            let comma = if i + 1 < self.fields.len() { "," } else { "" };
            writeln!(json, "  \"{name}\": {value}{comma}").unwrap();
        }
        json.push_str("}\n");
        std::fs::write(path, json)
            .unwrap_or_else(|e| panic!("could not write {path}: {e}"));
    }
}

/// This process's resident set size in KiB (`VmRSS` in /proc/self/status).
pub(crate) fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status (Linux only)");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line in /proc/self/status")
}

/// The id of the calling thread (Linux: from `/proc/thread-self`).
pub(crate) fn thread_id() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// The CPU time a thread of this process has run, from its schedstat.
pub(crate) fn thread_cpu(tid: u32) -> Duration {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map(Duration::from_nanos)
        .unwrap_or_default()
}

/// Mean of a slice (0 for an empty one).
pub(crate) fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

/// The median of a list (NaN for an empty one).
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}
