//! BENCHMARKS.md's charts, SVG files in [`DIR`] drawn from the rows and
//! results the table is made of: each goal's figure against its goal
//! ([`GOALS_SVG`]), the memory store's RSS through the waves
//! ([`MEMORY_SVG`]) and the service's latency percentiles
//! ([`LATENCY_SVG`]). A chart whose part has no figure says why instead,
//! so that no chart of an earlier run is left beside a new table.
//!
//! Text is SVG `<text>`, laid out by whatever shows the file: plotters is
//! built without a font backend (no `ttf`, no `ab_glyph`), so no font is
//! read, and its sizes for laying out are estimates that the generous label
//! areas below absorb.

use std::fs;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use rate_tier_bench_results::{GovernorMemoryResults, Latency, MemoryResults};

use super::goal::{Goal, GoalId};
use super::rows::{Results, Row, Status};
use super::runner::{Outcome, Rls};
use crate::cmd::Result;

/// Where the charts go, from the workspace root (BENCHMARKS.md links them
/// there).
pub(crate) const DIR: &str = "docs/bench";
/// Each goal row's figure against its goal.
pub(crate) const GOALS_SVG: &str = "goals.svg";
/// The memory store's RSS through the waves, against governor's.
pub(crate) const MEMORY_SVG: &str = "memory.svg";
/// The service's p50 and p99, against the constant server's.
pub(crate) const LATENCY_SVG: &str = "latency.svg";

const MET: RGBColor = RGBColor(0x2E, 0x7D, 0x32);
const NOT_MET: RGBColor = RGBColor(0xC6, 0x28, 0x28);
const NO_FIGURE: RGBColor = RGBColor(0x75, 0x75, 0x75);
const OURS: RGBColor = RGBColor(0x15, 0x65, 0xC0);
const PEER: RGBColor = RGBColor(0xEF, 0x6C, 0x00);
const FONT: &str = "sans-serif";

/// Draws every chart into `dir` (made if missing); the files written.
pub(crate) fn write(
    dir: &Path,
    rows: &[Row],
    results: &Results,
) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)
        .map_err(|e| format!("could not create {}: {e}", dir.display()))?;
    let charts = [
        (GOALS_SVG, goals(rows)?),
        (MEMORY_SVG, memory(&results.memory, &results.memory_peer)?),
        (LATENCY_SVG, latency(&results.rls)?),
    ];
    charts
        .into_iter()
        .map(|(name, svg)| {
            let path = dir.join(name);
            fs::write(&path, svg).map_err(|e| {
                format!("could not write {}: {e}", path.display())
            })?;
            Ok(path)
        })
        .collect()
}

/// A plotters error as xtask's.
fn drawing<E: std::error::Error + Send + Sync>(
    e: DrawingAreaErrorKind<E>,
) -> String {
    format!("could not draw a chart: {e}")
}

/// A chart with its caption and, instead of figures, why it has none.
fn no_figure(caption: &str, why: &str) -> Result<String> {
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (1000, 120)).into_drawing_area();
        root.fill(&WHITE).map_err(drawing)?;
        let style = (FONT, 20).into_font().color(&BLACK);
        root.draw(&Text::new(caption.to_owned(), (20, 30), style))
            .map_err(drawing)?;
        let style = (FONT, 15).into_font().color(&NO_FIGURE);
        root.draw(&Text::new(format!("no figure: {why}"), (20, 75), style))
            .map_err(drawing)?;
        root.present().map_err(drawing)?;
    }
    Ok(svg)
}

/// One bar of the goals chart: a row judged by a goal.
struct GoalBar {
    label: String,
    /// The figure the goal judges and whether it met it, or why there is
    /// none.
    judged: std::result::Result<(f64, bool), String>,
    bound: f64,
    /// The goal as the table shows it.
    goal: String,
}

/// The rows that have a goal, in the table's order (notes are left out).
fn goal_bars(rows: &[Row]) -> Vec<GoalBar> {
    rows.iter()
        .filter_map(|row| {
            let Goal::Bound { bound, .. } = row.goal else {
                return None;
            };
            let judged = match (row.status(), row.judged) {
                (Status::Met, Some(value)) => Ok((value, true)),
                (Status::NotMet, Some(value)) => Ok((value, false)),
                (Status::NoFigure(why), _) => Err(why),
                // A ratio but no judged figure: nothing to set by the goal.
                _ => Err("no figure judged".to_owned()),
            };
            Some(GoalBar {
                label: short(&row.metric.replace('`', ""), 105),
                judged,
                bound,
                goal: row.goal_text(),
            })
        })
        .collect()
}

/// `text` cut to `max` characters, with an ellipsis when cut.
fn short(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max - 1).collect();
    cut.push('…');
    cut
}

/// A number as an axis shows it: no trailing zeros.
fn tick(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// Each goal row's figure as a bar on a log scale, green when it met its
/// goal and red when not, the goal a black mark across it; a row with no
/// figure says why in grey.
fn goals(rows: &[Row]) -> Result<String> {
    const CAPTION: &str = "Each goal of the table: the figure it judges \
                           (bar) and the goal (black mark), log scale";
    let bars = goal_bars(rows);
    if bars.is_empty() {
        return no_figure(CAPTION, "no row with a goal ran");
    }
    // Whole decades around every figure and bound; a figure at or below 0
    // (an added time that is negative) is drawn at the axis's start.
    let positive = bars
        .iter()
        .filter_map(|bar| bar.judged.as_ref().ok().map(|(value, _)| *value))
        .chain(bars.iter().map(|bar| bar.bound))
        .filter(|value| *value > 0.0);
    let (min, max) = positive
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    // Half the smallest, so that no bar or mark starts on the axis.
    let lo = 10f64.powf((min / 2.0).log10().floor());
    let hi = 10f64.powf(max.log10().ceil()).max(lo * 10.0);

    let n = bars.len();
    let (width, height) = (1600, 110 + 24 * n as u32 + 60);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height))
            .into_drawing_area();
        root.fill(&WHITE).map_err(drawing)?;
        // Rows in hundredths: plotters' own key points work on integers.
        let rows = n as i32;
        let centers: Vec<i32> = (0..rows).map(|r| r * 100 + 50).collect();
        let mut chart = ChartBuilder::on(&root)
            .caption(CAPTION, (FONT, 22))
            .margin(15)
            .margin_right(260)
            .x_label_area_size(40)
            .y_label_area_size(640)
            .build_cartesian_2d(
                (lo..hi).log_scale(),
                (0..rows * 100).with_key_points(centers),
            )
            .map_err(drawing)?;
        // Bar i, counted from the top, is centred on this.
        let center = |i: usize| (rows - 1 - i as i32) * 100 + 50;
        let label = |y: &i32| {
            let i = rows - 1 - y.div_euclid(100);
            usize::try_from(i)
                .ok()
                .and_then(|i| bars.get(i))
                .map_or_else(String::new, |bar| bar.label.clone())
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_label_formatter(&label)
            .x_label_formatter(&|x| tick(*x))
            .label_style((FONT, 13))
            .x_desc("figure judged (log scale)")
            .draw()
            .map_err(drawing)?;

        for (i, bar) in bars.iter().enumerate() {
            let y = center(i);
            let (right, text, color) = match &bar.judged {
                Ok((value, met)) => {
                    let color = if *met { MET } else { NOT_MET };
                    let end = value.max(lo);
                    chart
                        .draw_series([Rectangle::new(
                            [(lo, y - 32), (end, y + 32)],
                            color.filled(),
                        )])
                        .map_err(drawing)?;
                    let verdict = if *met { "met" } else { "not met" };
                    let text = format!(
                        "{} · goal {} · {verdict}",
                        tick(*value),
                        bar.goal
                    );
                    (end.max(bar.bound), text, color)
                }
                Err(why) => (
                    bar.bound,
                    format!(
                        "no figure · goal {} · {}",
                        bar.goal,
                        short(why, 40)
                    ),
                    NO_FIGURE,
                ),
            };
            chart
                .draw_series([PathElement::new(
                    [(bar.bound, y - 45), (bar.bound, y + 45)],
                    BLACK.stroke_width(3),
                )])
                .map_err(drawing)?;
            let (px, py) = chart.backend_coord(&(right, y));
            let style = (FONT, 13)
                .into_font()
                .color(&color)
                .pos(Pos::new(HPos::Left, VPos::Center));
            root.draw(&Text::new(text, (px + 8, py), style))
                .map_err(drawing)?;
        }
        root.present().map_err(drawing)?;
    }
    Ok(svg)
}

/// `n` as a short count: `1M`, `500k`, `250`.
fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n.is_multiple_of(1_000_000) => {
            format!("{}M", n / 1_000_000)
        }
        n if n >= 1_000 && n.is_multiple_of(1_000) => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// The memory store's steps: the baseline, then each wave going in and
/// the store once idle after it, each its label and its RSS over the
/// baseline, MiB (`None`: not read).
fn memory_steps(memory: &MemoryResults) -> Vec<(String, Option<f64>)> {
    let growth = |kib: Option<u64>| {
        Some((kib? as f64 - memory.baseline_kib? as f64) / 1024.0)
    };
    let mut steps = vec![("start".to_owned(), Some(0.0))];
    for (i, wave) in memory.waves.iter().enumerate() {
        let keys = wave.keys.map_or_else(|| "?".to_owned(), count);
        steps.push((
            format!("wave {}: +{keys} keys", i + 1),
            growth(wave.after_insert_kib),
        ));
        steps.push(("idle".to_owned(), growth(wave.after_idle_kib)));
    }
    steps
}

/// The memory store's RSS over its baseline through the waves (in, then
/// idle), governor's after the first wave beside it, and the idle goal as
/// a dashed line.
fn memory(
    memory: &Outcome<MemoryResults>,
    peer: &Outcome<GovernorMemoryResults>,
) -> Result<String> {
    const CAPTION: &str =
        "Memory: RSS over the baseline through waves of distinct keys, MiB";
    let memory = match memory {
        Ok(memory) => memory,
        Err(why) => return no_figure(CAPTION, why),
    };
    let steps = memory_steps(memory);
    // Steps in tenths: plotters' own key points work on integers.
    let ours: Vec<(i32, f64)> = (0..)
        .step_by(10)
        .zip(&steps)
        .filter_map(|(x, (_, mib))| Some((x, (*mib)?)))
        .collect();
    if ours.len() < 2 {
        return no_figure(CAPTION, "no wave was read");
    }
    let peer = peer.as_ref().ok();
    let peer_growth = |kib: Option<u64>| {
        let peer = peer?;
        Some((kib? as f64 - peer.baseline_kib? as f64) / 1024.0)
    };
    let governor: Vec<(i32, f64)> = [
        (0, Some(0.0)),
        (10, peer_growth(peer.and_then(|p| p.after_insert_kib))),
        (20, peer_growth(peer.and_then(|p| p.after_idle_kib))),
    ]
    .into_iter()
    .filter_map(|(x, mib)| Some((x, mib?)))
    .collect();
    let peak = memory
        .peak_growth_kib
        .map(|kib| kib as f64 / 1024.0)
        .unwrap_or_else(|| ours.iter().map(|p| p.1).fold(0.0, f64::max));
    let goal = match GoalId::MemoryIdle.entry().goal {
        Goal::Bound { bound, .. } => Some(bound),
        Goal::Info(_) => None,
    };
    let top = ours
        .iter()
        .chain(&governor)
        .map(|p| p.1)
        .fold(peak, f64::max)
        .max(1.0)
        * 1.15;

    let (first, last) = (-3, (steps.len() as i32 - 1) * 10 + 3);
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (1300, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(drawing)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(CAPTION, (FONT, 22))
            .margin(15)
            .margin_right(40)
            .x_label_area_size(60)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (first..last).with_key_points((0..last).step_by(10).collect()),
                0.0..top,
            )
            .map_err(drawing)?;
        let label = |x: &i32| {
            usize::try_from(x / 10)
                .ok()
                .and_then(|i| steps.get(i))
                .map_or_else(String::new, |(label, _)| label.clone())
        };
        chart
            .configure_mesh()
            .x_label_formatter(&label)
            .y_label_formatter(&|y| tick(*y))
            .label_style((FONT, 13))
            .y_desc("MiB over the baseline")
            .draw()
            .map_err(drawing)?;
        chart
            .draw_series(
                LineSeries::new(ours.iter().copied(), OURS.stroke_width(3))
                    .point_size(4),
            )
            .map_err(drawing)?
            .label("tower-rate-tier memory store (its sweeper, nothing else)")
            .legend(|(x, y)| {
                PathElement::new([(x, y), (x + 20, y)], OURS.stroke_width(3))
            });
        if governor.len() > 1 {
            chart
                .draw_series(
                    LineSeries::new(
                        governor.iter().copied(),
                        PEER.stroke_width(3),
                    )
                    .point_size(4),
                )
                .map_err(drawing)?
                .label(
                    "governor's keyed limiter, the first wave's keys (no \
                     retain_recent call)",
                )
                .legend(|(x, y)| {
                    PathElement::new(
                        [(x, y), (x + 20, y)],
                        PEER.stroke_width(3),
                    )
                });
        }
        if let Some(goal) = goal {
            let at = goal * peak;
            chart
                .draw_series(DashedLineSeries::new(
                    [(first, at), (last, at)],
                    8,
                    6,
                    MET.stroke_width(2),
                ))
                .map_err(drawing)?
                .label(format!("goal: idle ≤ {goal} × the peak growth"))
                .legend(|(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], MET.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font((FONT, 14))
            .draw()
            .map_err(drawing)?;
        root.present().map_err(drawing)?;
    }
    Ok(svg)
}

/// The service's p50 and p99 at the fixed offered load, one pair of bars
/// per server that has both.
fn latency(rls: &Outcome<Rls>) -> Result<String> {
    let offered = rls
        .as_ref()
        .ok()
        .and_then(|rls| rls.results.offered_rate)
        .map_or_else(
            || "a fixed load".to_owned(),
            |rate| format!("{rate:.0} req/s"),
        );
    let caption = format!(
        "Service RLS latency at {offered} offered (open loop), µs: p50 and p99"
    );
    let results = match rls {
        Ok(rls) => &rls.results,
        Err(why) => return no_figure(&caption, why),
    };
    let servers: Vec<(&str, f64, f64)> = [
        ("constant tonic server", &results.constant_latency),
        ("service, memory store", &results.memory_latency),
        ("service, Redis", &results.redis_latency),
    ]
    .into_iter()
    .filter_map(|(name, latency): (&str, &Latency)| {
        Some((name, latency.p50_us?, latency.p99_us?))
    })
    .collect();
    if servers.is_empty() {
        return no_figure(&caption, "no latency was measured");
    }
    let top = servers.iter().map(|s| s.2).fold(1.0, f64::max) * 1.2;
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (1000, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(drawing)?;
        // Servers in hundredths: plotters' own key points work on integers.
        let k = servers.len() as i32;
        let mut chart = ChartBuilder::on(&root)
            .caption(&caption, (FONT, 22))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (0..k * 100)
                    .with_key_points((0..k).map(|i| i * 100 + 50).collect()),
                0.0..top,
            )
            .map_err(drawing)?;
        let label = |x: &i32| {
            usize::try_from(x / 100)
                .ok()
                .and_then(|i| servers.get(i))
                .map_or_else(String::new, |s| s.0.to_owned())
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&label)
            .y_label_formatter(&|y| tick(*y))
            .label_style((FONT, 14))
            .y_desc("µs")
            .draw()
            .map_err(drawing)?;
        let p50s = servers.iter().map(|s| s.1).collect();
        let p99s = servers.iter().map(|s| s.2).collect();
        for (name, color, offset, values) in
            [("p50", OURS, 14, p50s), ("p99", PEER, 52, p99s)]
        {
            let values: Vec<f64> = values;
            let bars = (0..).step_by(100).zip(&values);
            chart
                .draw_series(bars.clone().map(|(x, value)| {
                    Rectangle::new(
                        [(x + offset, 0.0), (x + offset + 34, *value)],
                        color.filled(),
                    )
                }))
                .map_err(drawing)?
                .label(name)
                .legend(move |(x, y)| {
                    Rectangle::new(
                        [(x, y - 6), (x + 14, y + 6)],
                        color.filled(),
                    )
                });
            chart
                .draw_series(bars.map(|(x, value)| {
                    let style = (FONT, 14)
                        .into_font()
                        .color(&BLACK)
                        .pos(Pos::new(HPos::Center, VPos::Bottom));
                    Text::new(
                        format!("{name} {value:.0}"),
                        (x + offset + 17, value + top * 0.01),
                        style,
                    )
                }))
                .map_err(drawing)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font((FONT, 14))
            .draw()
            .map_err(drawing)?;
        root.present().map_err(drawing)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use rate_tier_bench_results::{MemoryWave, RlsResults};

    use super::super::parse::Passes;
    use super::super::runner::WithRedis;
    use super::*;

    /// Every one of `texts` is among the chart's `shown` texts.
    fn assert_shows(shown: &[&str], texts: &[&str]) {
        for text in texts {
            assert!(shown.contains(text), "{text} missing: {shown:?}");
        }
    }

    /// A row judged by `id` with the figure `judged`.
    fn judged(metric: &str, id: GoalId, judged: Option<f64>) -> Row {
        let mut row = Row::judged_by(metric, id);
        (row.ratio, row.judged) = (judged, judged);
        row
    }

    fn failed<T>(what: &str) -> Outcome<T> {
        Err(format!("the `{what}` target did not build"))
    }

    /// Results with a memory part of two waves and a service part without
    /// Redis; every other part failed.
    fn results() -> Results {
        let wave = |keys, insert, idle| MemoryWave {
            keys: Some(keys),
            settled: Some(true),
            after_insert_kib: Some(insert),
            after_idle_kib: Some(idle),
            ..MemoryWave::default()
        };
        let latency = |p50, p99| Latency {
            p50_us: Some(p50),
            p99_us: Some(p99),
        };
        Results {
            criterion: Passes::default(),
            criterion_missing: Vec::new(),
            criterion_no_redis: None,
            shaper: failed("shaper"),
            http: failed("http"),
            redis: failed("redis_store"),
            redis_cpu: failed("redis_cpu"),
            memory: Ok(MemoryResults {
                baseline_kib: Some(3_072),
                waves: vec![
                    wave(1_000_000, 39_936, 3_328),
                    wave(500_000, 23_552, 3_354),
                ],
                peak_growth_kib: Some(36_864),
                ..MemoryResults::default()
            }),
            memory_peer: Ok(GovernorMemoryResults {
                baseline_kib: Some(2_048),
                after_insert_kib: Some(100_000),
                after_idle_kib: Some(100_000),
                ..GovernorMemoryResults::default()
            }),
            rls: Ok(WithRedis {
                results: RlsResults {
                    offered_rate: Some(5_000.0),
                    constant_latency: latency(1_281.0, 2_343.0),
                    memory_latency: latency(1_321.0, 2_384.0),
                    ..RlsResults::default()
                },
                no_redis: Some("skipped: no redis-server".to_owned()),
            }),
            limitador: failed("rls"),
            postgres: failed("postgres"),
            instructions: failed("instructions"),
        }
    }

    /// A directory of this test's own, empty.
    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir()
            .join(format!("xtask-charts-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    /// The text of each `<text>` element of `svg`.
    fn texts(svg: &str) -> Vec<&str> {
        svg.split("<text")
            .skip(1)
            .filter_map(|element| {
                element.split_once('>')?.1.split_once("</text>")
            })
            .map(|(text, _)| text.trim())
            .collect()
    }

    #[test]
    fn every_chart_is_written_and_each_goal_row_is_drawn_against_its_goal() {
        let rows = [
            judged(
                "memory, 1 hot key: `RateTier::check` vs governor",
                GoalId::MemoryVsGovernor,
                Some(2.577),
            ),
            judged(
                "memory, full store after a flood",
                GoalId::Flood,
                Some(3.033),
            ),
            judged(
                "Several limits, 1 hot user",
                GoalId::ThreeLimits,
                Some(2.4),
            ),
            judged(
                "Service vs limitador, memory",
                GoalId::ServiceVsLimitador,
                None,
            ),
            Row::info("gcra-core: one decision", "(no peer: for scale)"),
        ];
        let dir = temp("all");
        let written = write(&dir, &rows, &results()).unwrap();
        let names: Vec<_> =
            written.iter().map(|p| p.file_name().unwrap()).collect();
        assert_eq!(names, [GOALS_SVG, MEMORY_SVG, LATENCY_SVG]);

        let svg = fs::read_to_string(dir.join(GOALS_SVG)).unwrap();
        let shown = texts(&svg);
        // Each row with a goal by name (backticks dropped), the note not.
        assert_shows(
            &shown,
            &[
                "memory, 1 hot key: RateTier::check vs governor",
                "memory, full store after a flood",
                "Several limits, 1 hot user",
                "Service vs limitador, memory",
            ],
        );
        assert!(!svg.contains("gcra-core"), "a note has no goal to draw");
        // Each figure beside its goal and verdict.
        assert_shows(
            &shown,
            &[
                "2.577 · goal ≤ 1.0 · not met",
                "3.033 · goal ≤ 5.0 · met",
                "2.4 · goal &lt; 2.5 · met",
                "no figure · goal ≥ 1.1 · not run",
            ],
        );
        // One red bar, two green ones, and a goal mark per row.
        let bars = |color: RGBColor| {
            let fill = format!(
                "fill=\"#{:02X}{:02X}{:02X}\"",
                color.0, color.1, color.2
            );
            svg.split("<rect")
                .filter(|rect| rect.contains(&fill))
                .count()
        };
        assert_eq!((bars(NOT_MET), bars(MET)), (1, 2));
        let marks = svg
            .split("<polyline")
            .filter(|line| line.contains("stroke-width=\"3\""))
            .count();
        assert_eq!(marks, 4);

        let svg = fs::read_to_string(dir.join(MEMORY_SVG)).unwrap();
        let shown = texts(&svg);
        assert_shows(
            &shown,
            &["start", "wave 1: +1M keys", "wave 2: +500k keys", "idle"],
        );
        assert!(
            shown.contains(&"goal: idle ≤ 0.05 × the peak growth"),
            "{shown:?}"
        );
        assert!(svg.contains("governor"));

        let svg = fs::read_to_string(dir.join(LATENCY_SVG)).unwrap();
        let shown = texts(&svg);
        assert_shows(
            &shown,
            &[
                "constant tonic server",
                "service, memory store",
                "p50 1321",
                "p99 2384",
            ],
        );
        assert!(!svg.contains("service, Redis"), "Redis was not measured");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_part_with_no_figure_says_why_instead_of_a_chart() {
        let mut results = results();
        results.memory = Err("the `memory` target did not build".to_owned());
        results.rls = Err("skipped: not in --only".to_owned());
        let dir = temp("none");
        write(&dir, &[], &results).unwrap();
        let read = |name| fs::read_to_string(dir.join(name)).unwrap();
        assert!(read(GOALS_SVG).contains("no figure: no row with a goal ran"));
        assert!(
            read(MEMORY_SVG)
                .contains("no figure: the `memory` target did not build")
        );
        assert!(
            read(LATENCY_SVG).contains("no figure: skipped: not in --only")
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_steps_through_the_waves_are_over_the_baseline() {
        let Ok(memory) = results().memory else {
            unreachable!()
        };
        let steps = memory_steps(&memory);
        let mib: Vec<_> = steps.iter().map(|(_, mib)| mib.unwrap()).collect();
        assert_eq!(mib, [0.0, 36.0, 0.25, 20.0, 0.275390625]);
        assert_eq!(count(250_000), "250k");
        assert_eq!(count(1_500), "1500");
    }

    #[test]
    fn the_template_links_every_chart() {
        let template = include_str!("BENCHMARKS.template.md");
        for name in [GOALS_SVG, MEMORY_SVG, LATENCY_SVG] {
            let link = format!("]({DIR}/{name})");
            assert!(template.contains(&link), "no {link} in the template");
        }
    }
}
