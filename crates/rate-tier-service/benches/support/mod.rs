//! The command line and the JSON results of the service's benchmark, in the
//! shape of the workspace's other benchmark binaries (`--name value` pairs,
//! `--bench` ignored, one flat JSON object written to `--out`).
#![allow(dead_code)]

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
                continue;
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

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

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

    pub(crate) fn secs(&self, name: &str, default: f64) -> Duration {
        Duration::from_secs_f64(self.num(name, default))
    }
}

/// A flat JSON object of numbers.
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

pub(crate) fn median(values: &mut [f64]) -> f64 {
    percentile(values, 0.5)
}

/// The `q` quantile (nearest rank) of `values`.
pub(crate) fn percentile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((values.len() as f64) * q).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}
