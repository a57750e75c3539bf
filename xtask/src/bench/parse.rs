//! Reading what the benchmarks leave behind: criterion's estimates and
//! Redis's `INFO commandstats`. The other bench targets' results are typed,
//! read with `rate_tier_bench_results::ResultsFile::read`.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde_json::Value;

/// The criterion groups read (as directories: `/` becomes `_`).
pub(crate) const CRITERION_GROUPS: [&str; 20] = [
    "gcra_core",
    "memory_one_key",
    "memory_100k_keys",
    "memory_2_threads_one_key",
    "memory_2_threads_100k_keys",
    "memory_flood",
    "breaker_open_storage",
    "breaker_open_rate_tier",
    "limits_one_user",
    "limits_100k_users",
    "limits_store_one_user",
    "kinds_memory_one_user",
    "kinds_memory_10k_users",
    "kinds_memory_100k_users",
    "kinds_redis_one_user",
    "kinds_redis_1k_users",
    "reserve_memory_one_user",
    "reserve_memory_100k_users",
    "reserve_redis_one_user",
    "reserve_redis_1k_users",
];

/// A JSON file of criterion's, or `Null` when missing or unreadable.
fn read_json(path: &Path) -> Value {
    fs::read_to_string(path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null)
}

/// criterion's headline estimate of one benchmark, in ns: the slope when
/// it fitted one, else the mean.
fn criterion_ns(home: &Path, group: &str, bench: &str) -> Option<f64> {
    let path = home.join(group).join(bench).join("new/estimates.json");
    let estimates = read_json(&path);
    ["slope", "mean"]
        .iter()
        .find_map(|kind| estimates[kind]["point_estimate"].as_f64())
}

/// Removes the last run's `new` estimates of the groups read here, so that
/// a benchmark that did not run (a filter after `--`) shows as missing
/// rather than as an old figure.
pub(crate) fn forget_criterion_results(criterion_home: &Path) {
    for group in CRITERION_GROUPS {
        let Ok(benches) = fs::read_dir(criterion_home.join(group)) else {
            continue;
        };
        for bench in benches.flatten() {
            let _ = fs::remove_dir_all(bench.path().join("new"));
        }
    }
}

/// The criterion estimates of every pass: (group, bench) -> ns.
#[derive(Default)]
pub(crate) struct Passes(Vec<BTreeMap<(String, String), f64>>);

impl Passes {
    /// Passes of the given estimates, each `(group, bench, ns)`: for tests.
    #[cfg(test)]
    pub(crate) fn of(passes: &[&[(&str, &str, f64)]]) -> Self {
        Passes(
            passes
                .iter()
                .map(|pass| {
                    pass.iter()
                        .map(|&(group, bench, ns)| {
                            ((group.to_owned(), bench.to_owned()), ns)
                        })
                        .collect()
                })
                .collect(),
        )
    }

    /// Reads this pass's estimates of every benchmark of the groups read.
    pub(crate) fn read(&mut self, home: &Path) {
        let mut pass = BTreeMap::new();
        for group in CRITERION_GROUPS {
            let Ok(benches) = fs::read_dir(home.join(group)) else {
                continue;
            };
            for bench in benches.flatten() {
                let bench = bench.file_name().to_string_lossy().into_owned();
                if let Some(ns) = criterion_ns(home, group, &bench) {
                    pass.insert((group.to_owned(), bench), ns);
                }
            }
        }
        self.0.push(pass);
    }

    /// `f` of each pass that measured `group`'s `a` and `b`: the median.
    fn median(
        &self,
        group: &str,
        (a, b): (&str, &str),
        f: fn(f64, f64) -> f64,
    ) -> Option<f64> {
        let key = |bench: &str| (group.to_owned(), bench.to_owned());
        let values: Vec<f64> = self
            .0
            .iter()
            .filter_map(|pass| {
                Some(f(*pass.get(&key(a))?, *pass.get(&key(b))?))
            })
            .collect();
        median(values)
    }

    /// The median time of one benchmark over the passes, in ns.
    pub(crate) fn ns(&self, group: &str, bench: &str) -> Option<f64> {
        self.median(group, (bench, bench), |a, _| a)
    }

    /// The median over the passes of `a / b`.
    pub(crate) fn ratio(&self, group: &str, a: &str, b: &str) -> Option<f64> {
        self.median(group, (a, b), |a, b| a / b)
    }

    /// The median over the passes of `a - b`, in ns.
    pub(crate) fn difference(
        &self,
        group: &str,
        a: &str,
        b: &str,
    ) -> Option<f64> {
        self.median(group, (a, b), |a, b| a - b)
    }
}

/// The median of a list, `None` for an empty one.
pub(crate) fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        f64::midpoint(values[mid - 1], values[mid])
    } else {
        values[mid]
    })
}

/// One command's line of `INFO commandstats`: how many calls, and the
/// server's time in them (µs, wall clock inside the command).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CommandStat {
    pub(crate) calls: u64,
    pub(crate) usec: u64,
}

impl CommandStat {
    /// Server µs per call, from the totals (Redis's own `usec_per_call`
    /// has two decimals: too coarse for a 0.2 µs `TIME`).
    pub(crate) fn usec_per_call(self) -> Option<f64> {
        (self.calls > 0).then(|| self.usec as f64 / self.calls as f64)
    }
}

/// A field of `command`'s line of an `INFO commandstats` reply, e.g.
/// `cmdstat_get:calls=10,usec=15,usec_per_call=1.50,rejected_calls=0,failed_calls=0`.
pub(crate) fn command_field(
    info: &str,
    command: &str,
    name: &str,
) -> Option<u64> {
    let prefix = format!("cmdstat_{}:", command.to_ascii_lowercase());
    let fields = info
        .lines()
        .find_map(|line| line.trim().strip_prefix(prefix.as_str()))?;
    fields.split(',').find_map(|kv| {
        let (key, value) = kv.split_once('=')?;
        (key == name).then(|| value.parse().ok()).flatten()
    })
}

/// `command`'s calls and time in an `INFO commandstats` reply.
pub(crate) fn command_stat(info: &str, command: &str) -> Option<CommandStat> {
    Some(CommandStat {
        calls: command_field(info, command, "calls")?,
        usec: command_field(info, command, "usec")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }

    #[test]
    fn reads_a_command_from_commandstats() {
        let info = "# Commandstats\r\n\
            cmdstat_get:calls=20000,usec=7634,usec_per_call=0.38,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_evalsha:calls=3,usec=28,usec_per_call=9.33,rejected_calls=0,failed_calls=1\r\n";
        assert_eq!(
            command_stat(info, "GET"),
            Some(CommandStat {
                calls: 20_000,
                usec: 7634
            })
        );
        let evalsha = command_stat(info, "evalsha").unwrap();
        assert_eq!(evalsha.usec_per_call(), Some(28.0 / 3.0));
        assert_eq!(command_stat(info, "set"), None);
        assert_eq!(command_stat(info, "evals"), None);
        assert_eq!(command_field(info, "evalsha", "failed_calls"), Some(1));
        assert_eq!(
            CommandStat { calls: 0, usec: 0 }.usec_per_call(),
            None,
            "no call, no figure"
        );
    }
}
