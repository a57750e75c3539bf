//! The README's "why GCRA" picture: the 0.3 post's 20 requests (10 at
//! second 59, 10 at second 60, a limit of 10 per minute) under a fixed
//! window and under GCRA, one above the other, each request a dot at its
//! time, green allowed and red refused, drawn as one SVG.
//!
//! ```text
//! cargo run -p examples --example gcra_picture -- docs/why-gcra.svg
//! ```
//!
//! The argument is the SVG to write (`docs/why-gcra.svg` when none is
//! given, from where it runs; its folder is made if missing). GCRA's
//! decisions are `RateTier::check`'s on a `FakeClock`; the fixed window is
//! a counter per calendar minute that starts again at 0 on the minute, as
//! `fixed_window.rs` computes it. It prints:
//!
//! ```text
//! fixed window: 20 of 20 allowed; most in any 60 s: 20
//! GCRA:         10 of 20 allowed; most in any 60 s: 10
//! wrote docs/why-gcra.svg
//! ```
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{Quota, RateTier};

/// The post's requests: how many arrive at each second.
const ARRIVALS: [(u64, u32); 2] = [(59, 10), (60, 10)];
/// The limit of both algorithms, per minute.
const LIMIT: u32 = 10;

const ALLOWED: RGBColor = RGBColor(0x2E, 0x7D, 0x32);
const REFUSED: RGBColor = RGBColor(0xC6, 0x28, 0x28);
const FONT: &str = "sans-serif";

/// One algorithm's decisions: each request's second, and whether it was
/// allowed, in arrival order.
struct Run {
    name: &'static str,
    decisions: Vec<(u64, bool)>,
}

impl Run {
    fn allowed(&self) -> usize {
        self.decisions.iter().filter(|(_, ok)| *ok).count()
    }

    /// The most requests allowed in any 60 s, `[t, t + 60)` from each
    /// allowed request: what a limit of 10 per minute promises to keep at
    /// 10.
    fn most_in_any_minute(&self) -> usize {
        let allowed: Vec<u64> = self
            .decisions
            .iter()
            .filter(|(_, ok)| *ok)
            .map(|(t, _)| *t)
            .collect();
        allowed
            .iter()
            .map(|start| {
                allowed
                    .iter()
                    .filter(|t| (*start..start + 60).contains(t))
                    .count()
            })
            .max()
            .unwrap_or(0)
    }

    /// The line it prints and the SVG shows.
    fn summary(&self) -> String {
        format!(
            "{} of {} allowed; most in any 60 s: {}",
            self.allowed(),
            self.decisions.len(),
            self.most_in_any_minute()
        )
    }
}

/// Each request's second, in arrival order.
fn arrivals() -> impl Iterator<Item = u64> {
    ARRIVALS
        .into_iter()
        .flat_map(|(t, count)| (0..count).map(move |_| t))
}

/// A fixed window: one counter per calendar minute, back to 0 when the
/// minute changes.
fn fixed_window() -> Run {
    let (mut minute, mut used) = (0, 0);
    let decisions = arrivals()
        .map(|t| {
            if t / 60 != minute {
                (minute, used) = (t / 60, 0);
            }
            let ok = used < LIMIT;
            used += u32::from(ok);
            (t, ok)
        })
        .collect();
    Run {
        name: "fixed window",
        decisions,
    }
}

/// GCRA, decided by tower-rate-tier's limiter on a fake clock; with its
/// first refusal's second and retry-after, seconds.
async fn gcra() -> Result<(Run, Option<(u64, u64)>), String> {
    let clock = FakeClock::new();
    let limiter = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(LIMIT))
        .build();
    let (mut now, mut decisions, mut retry_after) = (0, Vec::new(), None);
    for t in arrivals() {
        clock.advance(Duration::from_secs(t - now));
        now = t;
        let decision = limiter
            .check("ana", "free", 1)
            .await
            .map_err(|e| format!("the limiter failed: {e}"))?;
        if let Err(limited) = &decision {
            retry_after.get_or_insert((t, limited.retry_after_secs()));
        }
        decisions.push((t, decision.is_ok()));
    }
    let run = Run {
        name: "GCRA",
        decisions,
    };
    Ok((run, retry_after))
}

/// A plotters error as this program's.
fn drawing<E: std::error::Error + Send + Sync>(
    e: DrawingAreaErrorKind<E>,
) -> String {
    format!("could not draw: {e}")
}

/// One panel: an algorithm's requests as dots over time, those of one
/// second stacked, with a dashed line at `mark` (its second and what
/// happens there).
fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    title: &str,
    run: &Run,
    mark: (f64, &str),
) -> Result<(), String> {
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 19))
        .margin(12)
        .margin_right(30)
        .x_label_area_size(35)
        .y_label_area_size(20)
        .build_cartesian_2d(57.5..67.5, 0.0..f64::from(LIMIT) + 1.5)
        .map_err(drawing)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_labels(11)
        .x_max_light_lines(0)
        .x_label_formatter(&|t| format!("{t:.0} s"))
        .label_style((FONT, 13))
        .draw()
        .map_err(drawing)?;
    let (at, what) = mark;
    let top = f64::from(LIMIT) + 1.2;
    chart
        .draw_series(DashedLineSeries::new(
            [(at, 0.0), (at, top)],
            6,
            4,
            BLACK.stroke_width(1),
        ))
        .map_err(drawing)?;
    // Over the line: each second's requests stacked, the first at the bottom.
    let dots = run.decisions.iter().enumerate().map(|(i, (t, ok))| {
        let below = run.decisions[..i].iter().filter(|(s, _)| s == t).count();
        let color = if *ok { ALLOWED } else { REFUSED };
        Circle::new((*t as f64, below as f64 + 0.7), 6, color.filled())
    });
    chart.draw_series(dots).map_err(drawing)?;
    let style = (FONT, 14)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    chart
        .draw_series([Text::new(
            what.to_owned(),
            (at + 0.15, top - 0.4),
            style,
        )])
        .map_err(drawing)?;
    Ok(())
}

/// The picture: the legend, then the fixed window above GCRA.
fn draw(
    path: &Path,
    fixed: &Run,
    gcra: &Run,
    retry_after: Option<(u64, u64)>,
) -> Result<(), String> {
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (1100, 620)).into_drawing_area();
        root.fill(&WHITE).map_err(drawing)?;
        let (top, rest) = root.split_vertically(50);
        let arrivals: Vec<String> = ARRIVALS
            .iter()
            .map(|(t, count)| format!("{count} at second {t}"))
            .collect();
        let title = format!(
            "{} requests, a limit of {LIMIT} per minute: {}",
            fixed.decisions.len(),
            arrivals.join(", ")
        );
        top.draw(&Text::new(
            title,
            (20, 20),
            (FONT, 20).into_font().color(&BLACK),
        ))
        .map_err(drawing)?;
        for (x, color, label) in
            [(820, ALLOWED, "allowed"), (930, REFUSED, "refused")]
        {
            top.draw(&Circle::new((x, 27), 6, color.filled()))
                .map_err(drawing)?;
            let style = (FONT, 15)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Center));
            top.draw(&Text::new(label, (x + 12, 27), style))
                .map_err(drawing)?;
        }
        let panels = rest.split_evenly((2, 1));
        // When GCRA's first refusal says the next request may pass.
        let (next_at, next) = retry_after.map_or_else(
            || (60, "nothing refused".to_owned()),
            |(refused_at, secs)| {
                let at = refused_at + secs;
                (
                    at,
                    format!("{at} s: the next may pass (retry-after {secs} s)"),
                )
            },
        );
        panel(
            &panels[0],
            &format!("Fixed window: {}", fixed.summary()),
            fixed,
            (60.0, "60 s: a new minute, the counter is back to 0"),
        )?;
        panel(
            &panels[1],
            &format!("GCRA (tower-rate-tier): {}", gcra.summary()),
            gcra,
            (next_at as f64, &next),
        )?;
        root.present().map_err(drawing)?;
    }
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("could not create {}: {e}", dir.display()))?;
    }
    std::fs::write(path, svg)
        .map_err(|e| format!("could not write {}: {e}", path.display()))
}

/// The SVG's path: the one argument, else `docs/why-gcra.svg`.
fn path() -> Result<PathBuf, String> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_env();
    let mut path = None;
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Value(value) if path.is_none() => path = Some(PathBuf::from(value)),
            Long("help") | Short('h') => {
                return Err(
                    "usage: gcra_picture [SVG] (docs/why-gcra.svg)".to_owned()
                );
            }
            other => return Err(other.unexpected().to_string()),
        }
    }
    Ok(path.unwrap_or_else(|| PathBuf::from("docs/why-gcra.svg")))
}

async fn run() -> Result<(), String> {
    let path = path()?;
    let fixed = fixed_window();
    let (gcra, retry_after) = gcra().await?;
    draw(&path, &fixed, &gcra, retry_after)?;
    for run in [&fixed, &gcra] {
        println!("{:<13} {}", format!("{}:", run.name), run.summary());
    }
    println!("wrote {}", path.display());
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(why) => {
            eprintln!("gcra_picture: {why}");
            ExitCode::FAILURE
        }
    }
}
