//! The SVG figures, strict and fair side by side: queue depth, waits by organisation class,
//! schedules' late and skipped fires, held tasks per limited key.

use std::path::Path;

use plotters::prelude::*;

use super::Result;
use super::day::{Mode, Outcome, Queue, Record};
use super::figures::{percentile, waits};
use super::workload::{Class, Day};

const SIZE: (u32, u32) = (1100, 460);
const STRICT: RGBColor = RGBColor(200, 50, 40);
const FAIR: RGBColor = RGBColor(30, 90, 200);

fn mode_color(m: &Mode) -> RGBColor {
    if m.name == "strict" { STRICT } else { FAIR }
}

fn class_color(c: Class) -> RGBColor {
    match c {
        Class::Large => RGBColor(120, 120, 120),
        Class::Medium => RGBColor(230, 140, 20),
        Class::Small => RGBColor(20, 150, 70),
    }
}

/// One line of a chart: its label, colour, width and points (hours, value).
struct Line {
    label: String,
    color: RGBColor,
    width: u32,
    points: Vec<(f64, f64)>,
}

/// A chart of `lines` on `area`, hours on x.
fn chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
    y_desc: &str,
    hours: f64,
    y_max: f64,
    lines: Vec<Line>,
    legend: SeriesLabelPosition,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let mut c = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..hours, 0f64..y_max.max(1.0) * 1.05)
        .map_err(|e| e.to_string())?;
    c.configure_mesh()
        .x_desc("hour of the simulated day")
        .y_desc(y_desc)
        .light_line_style(WHITE.mix(0.0))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;
    for l in lines {
        let (color, width) = (l.color, l.width);
        c.draw_series(LineSeries::new(l.points, color.stroke_width(l.width)))
            .map_err(|e| e.to_string())?
            .label(l.label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(width))
            });
    }
    c.configure_series_labels()
        .position(legend)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn hours(day: &Day) -> f64 {
    day.pushes.len() as f64 / 60.0
}

fn y_max(lines: &[Line]) -> f64 {
    lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0, f64::max)
}

/// Queued + pending per scheduler, per minute.
fn queue_depth(day: &Day, records: &[(Mode, Record)], path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((1, 2));
    for (k, (name, area)) in ["boefje", "normalizer"]
        .iter()
        .zip(panels.iter())
        .enumerate()
    {
        let lines: Vec<Line> = records
            .iter()
            .map(|(m, r)| Line {
                label: m.name.to_owned(),
                color: mode_color(m),
                width: 2,
                points: r
                    .depth
                    .iter()
                    .enumerate()
                    .filter_map(|(i, d)| d.map(|d| (i as f64 / 60.0, d[k] as f64)))
                    .collect(),
            })
            .collect();
        let top = y_max(&lines);
        chart(
            area,
            &format!("{name}: queued + pending (service down at the gap)"),
            "tasks",
            hours(day),
            top,
            lines,
            SeriesLabelPosition::UpperRight,
        )?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

/// Per hour of creation: the p50 (thick) and p99 (thin) wait of automatic boefje tasks, per
/// class (by creation rather than pop, so a task made during the burst counts where it was made).
fn wait_by_org(day: &Day, records: &[(Mode, Record)], path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((1, 2));
    let hours_n = day.pushes.len().div_ceil(60);
    let mut all = Vec::new();
    for (m, r) in records {
        let mut lines = Vec::new();
        for class in Class::ALL {
            for (p, width, tag) in [(50.0, 3, "p50"), (99.0, 1, "p99")] {
                let points = (0..hours_n)
                    .filter_map(|h| {
                        let mut w = waits(day, r, Queue::Boefje, Some(class), |x| {
                            (x.minute as i64 * 60 - x.wait_secs).div_euclid(3_600) == h as i64
                        });
                        percentile(&mut w, p).map(|s| (h as f64 + 0.5, s as f64 / 60.0))
                    })
                    .collect();
                lines.push(Line {
                    label: format!("{} {tag}", class.name()),
                    color: class_color(class),
                    width,
                    points,
                });
            }
        }
        all.push((m, lines));
    }
    let top = all.iter().map(|(_, l)| y_max(l)).fold(0.0, f64::max);
    for ((m, lines), area) in all.into_iter().zip(panels.iter()) {
        chart(
            area,
            &format!(
                "{}: boefje wait (created → dispatched) by hour created",
                m.name
            ),
            "minutes",
            hours(day),
            top,
            lines,
            SeriesLabelPosition::UpperRight,
        )?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

/// Cumulative late and skipped fires of the schedules over the day.
fn fires(day: &Day, records: &[(Mode, Record)], path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut lines = Vec::new();
    for (m, r) in records {
        for (tag, width, is) in [
            (
                "skipped",
                3,
                (|o: Outcome| o == Outcome::Skipped) as fn(Outcome) -> bool,
            ),
            ("late", 1, |o: Outcome| matches!(o, Outcome::Late(_))),
        ] {
            let mut per_minute = vec![0usize; day.pushes.len()];
            for f in r.fires.iter().filter(|f| is(f.outcome)) {
                if let Some(slot) = per_minute.get_mut(f.due_minute) {
                    *slot += 1;
                }
            }
            let mut total = 0;
            let points = per_minute
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    total += n;
                    (i as f64 / 60.0, total as f64)
                })
                .collect();
            lines.push(Line {
                label: format!("{} {tag}", m.name),
                color: mode_color(m),
                width,
                points,
            });
        }
    }
    let top = y_max(&lines);
    chart(
        &root,
        &format!(
            "schedules' fires late (>1 min) or skipped, cumulative by due time ({} due in all per run)",
            records.first().map_or(0, |(_, r)| r.fires.len())
        ),
        "fires",
        hours(day),
        top,
        lines,
        // The top right is where the strict skipped line ends; the morning is empty.
        SeriesLabelPosition::UpperLeft,
    )?;
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

/// Held tasks per limited key, per minute.
fn held(day: &Day, records: &[(Mode, Record)], path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((1, 2));
    for (k, (name, area)) in ["boefje.id=shodan:10/60 (rate)", "host=*:2 (concurrency)"]
        .iter()
        .zip(panels.iter())
        .enumerate()
    {
        let lines: Vec<Line> = records
            .iter()
            .map(|(m, r)| Line {
                label: m.name.to_owned(),
                color: mode_color(m),
                width: 2,
                points: r
                    .held
                    .iter()
                    .enumerate()
                    .filter_map(|(i, h)| h.map(|h| (i as f64 / 60.0, h[k] as f64)))
                    .collect(),
            })
            .collect();
        let top = y_max(&lines);
        chart(
            area,
            &format!("held by {name}"),
            "queued tasks held",
            hours(day),
            top,
            lines,
            SeriesLabelPosition::UpperRight,
        )?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

/// Writes the four figures into `out`.
pub fn draw_all(day: &Day, records: &[(Mode, Record)], out: &Path) -> Result<()> {
    queue_depth(day, records, &out.join("queue-depth.svg"))?;
    wait_by_org(day, records, &out.join("wait-by-organisation.svg"))?;
    fires(day, records, &out.join("fires.svg"))?;
    held(day, records, &out.join("held.svg"))?;
    Ok(())
}
