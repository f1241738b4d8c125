//! `--rebuild`: how long a start takes to rebuild the heaps from the table, with `--rebuild-queued`
//! queued tasks (default 100,000) beside each of `--rebuild-history` finished tasks (default 0 and
//! 1e6), against reading the same queued rows out of the table (`\copy … TO /dev/null`) in the
//! same run.
//!
//! Since migration 16 queued tasks have no `task_queue` row: a rebuild finds them in `tasks`,
//! which has no status index, so it scans the scheduler's rows, finished history included (as
//! it already did for the tasks in flight). This scenario measures that price at a depth of
//! history; `KAT_BENCH_BIN` runs an earlier build on the same seed for the before. For each
//! history depth, on a database of its own: the history seeded as `completed` in the runners'
//! mix, then the queued tasks, then the broker started `--rounds` times (the rebuild's time from
//! its log line, median of the starts), and the `\copy` of the queued rows' heap columns from
//! `tasks` timed the same number of times.

use std::process::Command;
use std::time::Instant;

use super::harness::instance::{start_broker, stop_broker};
use super::harness::postgres::{
    BOEFJE_HEAVY, extra_columns, machine, pg_exec, seed_tasks, seed_tasks_as, with_db,
};
use super::harness::stats::{median, thousands};
use super::{Options, Result};

/// Seconds `\copy` takes to read the heap columns of every queued task out of `tasks`.
fn copy_out_seconds(db: &str) -> Result<f64> {
    let started = Instant::now();
    let status = Command::new("psql")
        .arg(db)
        .arg("-qc")
        .arg(
            "\\copy (SELECT id, priority, created_at, modified_at, hash, schedule_id, organisation, \
             plugin_id, oci_image, input_ooi FROM tasks WHERE status = 'queued') TO '/dev/null'",
        )
        .status()?;
    if !status.success() {
        return Err("psql \\copy failed".into());
    }
    Ok(started.elapsed().as_secs_f64())
}

pub fn run_rebuild(o: &Options, base: &str) -> Result<String> {
    let q = o.rebuild_queued;
    println!(
        "rebuild: {} queued tasks beside {} finished ones, {} broker starts each",
        thousands(q),
        o.rebuild_history
            .iter()
            .map(|h| thousands(*h))
            .collect::<Vec<_>>()
            .join(" or "),
        o.rounds
    );
    let mut rows = Vec::new();
    for &h in &o.rebuild_history {
        rows.push(with_db(o, base, &format!("_rebuild{h}"), |db| {
            println!("{}", machine(db)?);
            // Migrated by the broker under test, so the seed fits its schema.
            stop_broker(start_broker(db, q * 2)?)?;
            let cols = extra_columns(db)?;
            if h > 0 {
                eprintln!("seeding {} finished tasks…", thousands(h));
                seed_tasks_as(db, h, &BOEFJE_HEAVY, &cols, "completed")?;
            }
            eprintln!("seeding {} queued tasks…", thousands(q));
            seed_tasks(db, q, &BOEFJE_HEAVY, &cols)?;
            pg_exec(db, "VACUUM ANALYZE")?;
            let (mut rebuilds, mut copies) = (Vec::new(), Vec::new());
            for round in 0..o.rounds {
                eprintln!("start {}/{}…", round + 1, o.rounds);
                let broker = start_broker(db, q * 2)?;
                rebuilds.push(broker.rebuild_ms / 1000.0);
                stop_broker(broker)?;
                copies.push(copy_out_seconds(db)?);
            }
            Ok((h, median(rebuilds), median(copies)))
        })?);
    }
    println!();
    println!(
        "{:>12} {:>10} {:>12} {:>14}",
        "history", "rebuild s", "\\copy s", "rebuild ÷ copy"
    );
    let mut pairs = Vec::new();
    for (h, r, c) in &rows {
        println!("{:>12} {r:>10.3} {c:>12.3} {:>14.2}", thousands(*h), r / c);
        pairs.push(format!("rebuild_{h}_s={r:.3} rebuild_{h}_copy_s={c:.3}"));
    }
    Ok(pairs.join(" "))
}
