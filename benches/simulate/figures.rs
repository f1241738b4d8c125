//! The figures of the two runs, printed side by side: waits per organisation class (p50/p99,
//! over the day and over the burst's six hours), user scans, late and skipped fires, held tasks,
//! the crash's lost and returned tasks, and the explain check of the held counts.

use super::day::{Mode, Outcome, Pop, Queue, Record};
use super::workload::{Class, Day};

/// Minutes after the burst starts that "during the burst" covers.
pub const BURST_WINDOW: usize = 360;

/// The `p`th percentile (nearest rank) of `v`, sorted in place; `None` when empty.
pub fn percentile(v: &mut [i64], p: f64) -> Option<i64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// Waits in seconds of the automatic pops of `class` on `queue` that `keep` accepts.
pub fn waits(
    day: &Day,
    r: &Record,
    queue: Queue,
    class: Option<Class>,
    keep: impl Fn(&Pop) -> bool,
) -> Vec<i64> {
    r.pops
        .iter()
        .filter(|p| p.queue == queue && keep(p))
        .filter(|p| match class {
            Some(c) => !p.user && day.orgs.get(p.org).is_some_and(|o| o.class == c),
            None => p.user,
        })
        .map(|p| p.wait_secs)
        .collect()
}

fn minutes(secs: Option<i64>) -> String {
    match secs {
        None => "–".into(),
        Some(s) if s < 60 => format!("{s} s"),
        Some(s) => format!("{:.0} min", s as f64 / 60.0),
    }
}

fn p50_p99(mut v: Vec<i64>) -> String {
    format!(
        "{} / {} (n={})",
        minutes(percentile(&mut v, 50.0)),
        minutes(percentile(&mut v, 99.0)),
        v.len()
    )
}

/// Prints the figures of `records` (strict first, then fair).
pub fn print(day: &Day, records: &[(Mode, Record)]) {
    let (b0, _) = day.burst;
    let during = |p: &Pop| p.minute >= b0 && p.minute < b0 + BURST_WINDOW;
    println!();
    for (queue, qname) in [(Queue::Boefje, "boefje"), (Queue::Normalizer, "normalizer")] {
        for (window, wname) in [
            (false, "the whole day"),
            (true, "the burst's first 6 hours"),
        ] {
            println!("{qname} waits, created → dispatched, p50 / p99, {wname}:");
            for class in Class::ALL.map(Some).into_iter().chain([None]) {
                let label = class.map_or("user scans", Class::name);
                let cells: Vec<String> = records
                    .iter()
                    .map(|(m, r)| {
                        let w = waits(day, r, queue, class, |p| !window || during(p));
                        format!("{:>6} {:<30}", m.name, p50_p99(w))
                    })
                    .collect();
                println!("  {label:<11} {}", cells.join(" "));
            }
        }
    }
    println!("schedules' due fires (a tick a minute): on time / late / skipped");
    for (m, r) in records {
        let by_class: Vec<String> = Class::ALL
            .iter()
            .map(|c| {
                let of: Vec<_> = r
                    .fires
                    .iter()
                    .filter(|f| day.orgs[f.org].class == *c)
                    .collect();
                let late = of
                    .iter()
                    .filter(|f| matches!(f.outcome, Outcome::Late(_)))
                    .count();
                let skipped = of.iter().filter(|f| f.outcome == Outcome::Skipped).count();
                format!(
                    "{} {}/{late}/{skipped}",
                    c.name(),
                    of.len() - late - skipped
                )
            })
            .collect();
        let worst = r
            .fires
            .iter()
            .filter_map(|f| match f.outcome {
                Outcome::Late(s) => Some(s),
                _ => None,
            })
            .max();
        println!(
            "  {:>6}: {}; latest {}",
            m.name,
            by_class.join(", "),
            minutes(worst)
        );
    }
    println!("held tasks (counted from the pops; peak, and mean over the minutes served):");
    for (m, r) in records {
        let served: Vec<[usize; 2]> = r.held.iter().flatten().copied().collect();
        let n = served.len().max(1) as f64;
        let stat = |k: usize| {
            let peak = served.iter().map(|h| h[k]).max().unwrap_or(0);
            let mean = served.iter().map(|h| h[k]).sum::<usize>() as f64 / n;
            format!("peak {peak}, mean {mean:.0}")
        };
        println!(
            "  {:>6}: shodan rate {}; host concurrency {}; explain agreed on {} of {} sampled",
            m.name,
            stat(0),
            stat(1),
            r.explain_check.0,
            r.explain_check.1
        );
    }
    println!("queue depth and the crash:");
    for (m, r) in records {
        let peak = |k: usize| r.depth.iter().flatten().map(|d| d[k]).max().unwrap_or(0);
        let drained = r
            .depth
            .iter()
            .enumerate()
            .skip(b0)
            .find(|(_, d)| d.is_some_and(|d| d[0] < 100))
            .map(|(i, _)| format!("{:02}:{:02}", i / 60, i % 60))
            .unwrap_or_else(|| "not within the day".into());
        println!(
            "  {:>6}: boefje peak {}, under 100 again at {drained}; normalizer peak {}; {} pushes deferred while down, {} refused as already waiting, {} tasks lost with their runners, {} queued again by the watchdog",
            m.name,
            peak(0),
            peak(1),
            r.deferred,
            r.duplicates,
            r.lost,
            r.requeued
        );
    }
}
