//! The command line the workspace's benchmark binaries share with `cargo
//! xtask bench`: `--name value` pairs (the `--bench` flag that `cargo bench`
//! adds is ignored). Their results are the typed structs of
//! `crates/bench-results`.

use std::collections::BTreeMap;
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

/// The median of `values` (NaN for none): the figure the benchmarks'
/// rounds are summed up by.
///
/// ```
/// use rate_tier_test_support::bench::median;
///
/// assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
/// assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
/// assert!(median(Vec::new()).is_nan());
/// ```
pub fn median(mut values: Vec<f64>) -> f64 {
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

/// CPU seconds (user + system) of process `pid` and of its children, those
/// that exited included (their time is `pid`'s `cutime`/`cstime` once it
/// reaped them): a server's whole cost, a postmaster's and its backends'.
/// Read from `/proc` (0 where there is none).
pub fn process_tree_cpu_secs(pid: u32) -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    let mut ticks = 0;
    for entry in entries.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat"))
        else {
            continue;
        };
        let own = entry.file_name().to_str().and_then(|n| n.parse().ok());
        let fields = stat_fields(&stat);
        let parent = fields.get(1).and_then(|p| p.parse::<u32>().ok());
        if parent == Some(pid) {
            ticks += stat_ticks(&fields, 11..13);
        }
        if own == Some(pid) {
            ticks += stat_ticks(&fields, 11..15);
        }
    }
    ticks as f64 / USER_HZ
}

/// The CPU time thread `tid` of process `pid` has run: the first field of
/// its `/proc/<pid>/task/<tid>/schedstat` (Linux, in ns). `None` where it
/// cannot be read (another system, or a thread that ended).
pub fn thread_cpu(pid: u32, tid: &str) -> Option<Duration> {
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))
            .ok()?;
    stat.split_whitespace()
        .next()?
        .parse()
        .ok()
        .map(Duration::from_nanos)
}

/// The CPU time every thread of process `pid` has run (only those named
/// `named`, when given: a runtime's threads in a process of several), from
/// their schedstat (see [`thread_cpu`]). `None` where `/proc` cannot be
/// read; a thread that ended since the listing is left out.
pub fn threads_cpu(pid: u32, named: Option<&str>) -> Option<Duration> {
    let mut total = Duration::ZERO;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let task = task.ok()?;
        let tid = task.file_name();
        let Some(tid) = tid.to_str() else { continue };
        if let Some(named) = named {
            let comm = std::fs::read_to_string(task.path().join("comm"));
            if comm.map_or(true, |comm| comm.trim_end() != named) {
                continue;
            }
        }
        total += thread_cpu(pid, tid).unwrap_or_default();
    }
    Some(total)
}

/// CPU seconds (user + system) of this process.
pub fn own_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    stat_ticks(&stat_fields(&stat), 11..13) as f64 / USER_HZ
}

/// Clock ticks per second of `/proc/<pid>/stat` on Linux.
const USER_HZ: f64 = 100.0;

/// The fields of a `/proc/<pid>/stat` after the command's closing
/// parenthesis: state, ppid, ...
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default()
}

fn stat_ticks(fields: &[&str], range: std::ops::Range<usize>) -> u64 {
    range
        .filter_map(|i| fields.get(i)?.parse::<u64>().ok())
        .sum()
}

/// pgbench on `server` running `script` (prepared statements, `clients`
/// clients on 2 threads, about `seconds`): (transactions per second, server
/// CPU µs per transaction). A reference ceiling for the PostgreSQL benches.
pub fn pgbench(
    server: &crate::PostgresServer,
    script: &str,
    clients: usize,
    seconds: f64,
) -> (f64, f64) {
    let path = server.dir().join("pgbench.sql");
    std::fs::write(&path, script).unwrap();
    let pid = server.postmaster_pid().unwrap();
    let before = process_tree_cpu_secs(pid);
    let output = std::process::Command::new(server.bin_dir().join("pgbench"))
        .args(["-n", "-M", "prepared", "-j", "2", "-c"])
        .arg(clients.to_string())
        .args(["-T", &(seconds.round() as u64).max(1).to_string(), "-f"])
        .arg(&path)
        .arg(server.url())
        .output()
        .unwrap();
    let cpu = process_tree_cpu_secs(pid) - before;
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pgbench: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let field = |prefix: &str| -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix(prefix))
            .and_then(|rest| rest.split(['/', ' ']).find(|s| !s.is_empty()))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| {
                panic!("no `{prefix}` in pgbench's output: {text}")
            })
    };
    let transactions = field("number of transactions actually processed: ");
    (field("tps = "), cpu / transactions * 1e6)
}
