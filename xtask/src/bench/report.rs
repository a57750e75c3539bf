//! The table and BENCHMARKS.md: the prose is `BENCHMARKS.template.md`,
//! its `{{name}}` placeholders filled here.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::goal::{GOALS, GoalEntry};
use super::plan::Plan;
use super::rows::{Row, Status};
use crate::cmd::Cmd;
use crate::cmd::Result;

/// The prose of BENCHMARKS.md.
const TEMPLATE: &str = include_str!("BENCHMARKS.template.md");

pub(crate) fn render_table(rows: &[Row]) -> String {
    let mut table =
        String::from("| metric | ours | peer | ratio | goal | met? |\n");
    table.push_str("|---|---|---|---|---|---|\n");
    for row in rows {
        let ratio = row.ratio.map_or("—".to_owned(), |r| format!("{r:.3}"));
        let met = match row.status() {
            Status::Met => "yes",
            Status::NotMet => "**no**",
            Status::Info => "—",
            Status::NoFigure(_) => "**no figure**",
        };
        let _ = writeln!(
            table,
            "| {} | {} | {} | {ratio} | {} | {met} |",
            row.metric,
            row.ours_text(),
            row.peer,
            row.goal_text()
        );
    }
    table
}

/// The rows whose goal was not met, and those with no figure: a list for
/// the report, empty when every goal with a figure was met.
pub(crate) fn unmet(rows: &[Row]) -> Vec<String> {
    rows.iter()
        .filter_map(|row| match row.status() {
            Status::NotMet => Some(format!(
                "{}: ratio {}, goal {}",
                row.metric,
                row.ratio.map_or("—".to_owned(), |r| format!("{r:.3}")),
                row.goal_text()
            )),
            Status::NoFigure(why) => {
                Some(format!("{}: no figure ({why})", row.metric))
            }
            Status::Met | Status::Info => None,
        })
        .collect()
}

/// The goals that rows with a figure did not meet, each once, in the
/// goals table's order.
pub(crate) fn missed(rows: &[Row]) -> Vec<&'static GoalEntry> {
    GOALS
        .iter()
        .filter(|entry| {
            rows.iter().any(|row| {
                row.goal_id == Some(entry.id) && row.status() == Status::NotMet
            })
        })
        .collect()
}

/// What the figures were measured on.
pub(crate) struct Machine {
    cpus: usize,
    cpu_model: String,
    kernel: String,
    rustc: String,
    commit: String,
    wrk: String,
    redis: String,
    postgres: String,
    /// limitador-server's version and path, or why it was not measured.
    limitador: String,
}

impl Machine {
    pub(crate) fn read(
        wrk: Option<&Path>,
        redis: Option<String>,
        postgres: Option<String>,
        limitador: String,
    ) -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
            .map_or("unknown".to_owned(), |(_, model)| model.trim().to_owned());
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or("unknown".to_owned(), |k| format!("Linux {}", k.trim()));
        let quiet = |cmd: Cmd| {
            cmd.command()
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        };
        let rustc = quiet(Cmd::new("rustc").arg("-V"))
            .unwrap_or_else(|| "unknown".to_owned());
        let commit =
            quiet(Cmd::new("git").args(["rev-parse", "--short", "HEAD"]))
                .map_or("unknown".to_owned(), |sha| {
                    let dirty =
                        quiet(Cmd::new("git").args(["status", "--porcelain"]))
                            .is_some_and(|s| !s.is_empty());
                    if dirty {
                        format!("{sha} with uncommitted changes")
                    } else {
                        sha
                    }
                });
        let wrk = match wrk {
            // `wrk -v` prints its version and exits with 1.
            Some(bin) => Cmd::new(bin)
                .arg("-v")
                .command()
                .output()
                .ok()
                .and_then(|o| {
                    let text = String::from_utf8_lossy(&o.stdout).into_owned();
                    let first = text.lines().next()?;
                    let version = first.split(" Copyright").next()?;
                    Some(version.trim().to_owned())
                })
                .unwrap_or_else(|| "wrk".to_owned()),
            None => "built-in Rust client (wrk not installed)".to_owned(),
        };
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu_model,
            kernel,
            rustc,
            commit,
            wrk,
            redis: redis.unwrap_or_else(|| "not installed".to_owned()),
            postgres: postgres.unwrap_or_else(|| "not measured".to_owned()),
            limitador,
        }
    }
}

/// Now (UTC) as `YYYY-MM-DD HH:MM UTC`, from the system clock.
fn now_utc() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days.cast_signed() + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rest / 3600,
        rest % 3600 / 60
    )
}

/// BENCHMARKS.md: the template with every placeholder filled.
pub(crate) fn report(
    plan: &Plan,
    command: &str,
    machine: &Machine,
    rows: &[Row],
    redis_cpu_commands: &[String],
    run_time: Duration,
) -> Result<String> {
    let unmet = unmet(rows);
    let verdict = if unmet.is_empty() {
        "Every goal with a figure was met in this run.".to_owned()
    } else {
        let mut text =
            String::from("Goals not met, or with no figure, in this run:\n");
        for line in &unmet {
            let _ = write!(text, "\n- {line}");
        }
        text
    };
    let criterion_mode = format!(
        "{}, {} passes; shown: the median over the passes of each time and \
         of each pass's ratio",
        if plan.full {
            "criterion's default settings"
        } else {
            "criterion `--quick`"
        },
        plan.criterion_passes
    );
    let cpu_commands = if redis_cpu_commands.is_empty() {
        "(not run)".to_owned()
    } else {
        redis_cpu_commands
            .iter()
            .map(|c| format!("    {c}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let (http_secs, http_rounds) = plan.http;
    let (redis_secs, redis_rounds) = plan.redis;
    let (cpu_requests, cpu_rounds) = plan.redis_cpu;
    let (rls_secs, rls_rounds) = plan.rls;
    let (limitador_secs, limitador_rounds) = plan.limitador;
    let (postgres_secs, postgres_rounds) = plan.postgres;
    let (shaper_calls, shaper_rate, shaper_workers) = plan.shaper;
    let values = [
        ("command", command.to_owned()),
        ("mode", if plan.full { "full" } else { "quick" }.to_owned()),
        ("date", now_utc()),
        ("cpus", machine.cpus.to_string()),
        ("cpu_model", machine.cpu_model.clone()),
        ("kernel", machine.kernel.clone()),
        ("rustc", machine.rustc.clone()),
        ("commit", machine.commit.clone()),
        ("wrk", machine.wrk.clone()),
        ("redis", machine.redis.clone()),
        ("postgres", machine.postgres.clone()),
        ("limitador", machine.limitador.clone()),
        ("run_secs", format!("{:.0}", run_time.as_secs_f64())),
        ("table", render_table(rows)),
        ("verdict", verdict),
        ("criterion_mode", criterion_mode),
        ("http_secs", http_secs.to_string()),
        ("http_rounds", http_rounds.to_string()),
        ("redis_secs", redis_secs.to_string()),
        ("redis_rounds", redis_rounds.to_string()),
        ("cpu_requests", cpu_requests.to_string()),
        ("cpu_rounds", cpu_rounds.to_string()),
        ("cpu_commands", cpu_commands),
        ("sweep_secs", plan.sweep_secs.to_string()),
        ("rls_secs", rls_secs.to_string()),
        ("rls_rounds", rls_rounds.to_string()),
        ("limitador_secs", limitador_secs.to_string()),
        ("limitador_rounds", limitador_rounds.to_string()),
        ("postgres_secs", postgres_secs.to_string()),
        ("postgres_rounds", postgres_rounds.to_string()),
        ("shaper_calls", shaper_calls.to_string()),
        ("shaper_rate", shaper_rate.to_string()),
        ("shaper_workers", shaper_workers.to_string()),
    ];
    fill(TEMPLATE, &values)
}

/// `template` with each `{{name}}` replaced by its value; an error names a
/// placeholder with no value, or a value no placeholder uses.
fn fill(template: &str, values: &[(&str, String)]) -> Result<String> {
    let mut out = String::with_capacity(template.len() * 2);
    let mut used = vec![false; values.len()];
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find("}}")
            .ok_or("BENCHMARKS.template.md: a `{{` is never closed")?;
        let name = &after[..end];
        let index = values
            .iter()
            .position(|(key, _)| *key == name)
            .ok_or_else(|| {
                format!("BENCHMARKS.template.md: no value for {{{{{name}}}}}")
            })?;
        used[index] = true;
        out.push_str(&values[index].1);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    match values.iter().zip(&used).find(|(_, used)| !**used) {
        Some(((name, _), _)) => {
            Err(format!("BENCHMARKS.template.md never uses {{{{{name}}}}}"))
        }
        None => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use super::super::goal::GoalId;
    use super::*;

    #[test]
    fn a_goal_not_met_is_named_once_with_why() {
        let judged = |id, ratio: Option<f64>| {
            let mut row = Row::judged_by("a row", id);
            (row.ratio, row.judged) = (ratio, ratio);
            row
        };
        let rows = [
            judged(GoalId::ThreeLimits, Some(2.0)),
            judged(GoalId::MemoryVsGovernor, Some(1.5)),
            judged(GoalId::MemoryVsGovernor, Some(1.2)),
            judged(GoalId::Flood, None),
        ];
        let missed = missed(&rows);
        assert_eq!(missed.len(), 1, "{missed:?}");
        assert_eq!(missed[0].id, GoalId::MemoryVsGovernor);
        assert!(missed[0].why.contains("governor"));
    }

    #[test]
    fn placeholders_are_filled_and_checked() {
        let values = [("a", "1".to_owned()), ("b", "two".to_owned())];
        assert_eq!(
            fill("x {{a}} y {{b}}{{a}}", &values).unwrap(),
            "x 1 y two1"
        );
        assert!(fill("{{a}} {{c}}", &values).unwrap_err().contains("{{c}}"));
        assert!(fill("{{a}}", &values).unwrap_err().contains("{{b}}"));
        assert!(fill("{{a", &values).is_err());
    }

    #[test]
    fn the_template_has_a_value_for_each_placeholder() {
        let plan = Plan::new(false, None);
        let machine = Machine::read(None, None, None, String::new());
        let rows = vec![Row::judged_by("a row", GoalId::MemoryVsGovernor)];
        let report = report(
            &plan,
            "cargo xtask bench",
            &machine,
            &rows,
            &["redis-benchmark TIME".to_owned()],
            Duration::from_secs(3),
        )
        .unwrap();
        assert!(report.starts_with("# Benchmarks"));
        assert!(report.contains("| a row | not run |"), "{report}");
        assert!(report.contains("- a row: no figure (not run)"), "{report}");
        assert!(report.contains("    redis-benchmark TIME"));
    }
}
