//! `--memory`: resident memory per queued task, at each of `--memory-depths` (default 1e5 and
//! 1e6), against what PostgreSQL stores per row of the same tasks, in the same run.
//!
//! For each depth, on a database of its own: the broker's resident size with nothing queued
//! (after migrating and answering requests for half a second); then the depth's tasks seeded
//! straight into the table in the runners' mix (ten boefje tasks to one normalizer and one
//! report task; boefje tasks on 30 plugins, 10 images and 50 organisations, each with its own
//! input OOI, as `harness::postgres::seed_tasks` describes), and the broker started `--rounds`
//! times over them, each time rebuilding its heaps from the table (every task queued, the heap
//! bounded above the depth); the resident size after the rebuild and half a second of requests,
//! less the empty size, per task (median of the starts); beside it the heaps' own count of
//! what they allocated (`heap_bytes` in the rebuild's log line), which leaves out the
//! allocator's overhead and whatever else the process holds. The scheduler's settings are its
//! defaults, so the organisations take turns on the boefje and normalizer heaps and each keeps its
//! own sets.
//!
//! Baselines, from the same database: the bytes per row of the broker's own `tasks` and
//! `task_queue` tables with their indexes, and of a minimal queue table (`bench_q`: an id, a
//! priority, a queue name and a short payload, with one index).

use super::harness::baseline::seed_baseline;
use super::harness::http::{Op, current_thread, http_load};
use super::harness::instance::{rss_bytes, start_broker, stop_broker};
use super::harness::postgres::{
    BOEFJE_HEAVY, extra_columns, machine, pg_exec, pg_number, seed_tasks, with_db,
};
use super::harness::stats::{median, thousands};
use super::{Options, Result};

/// One depth's figures.
struct Depth {
    tasks: usize,
    rss_empty: f64,
    rss_loaded: f64,
    per_task: f64,
    /// The heaps' own count of their allocations, per task (NaN for a build that logs none).
    heap_per_task: f64,
    rebuild_s: f64,
    tasks_row: f64,
    queue_row: f64,
    minimal_row: f64,
}

pub fn run_memory(o: &Options, base: &str) -> Result<String> {
    println!(
        "memory: resident bytes per queued task at {} queued, {} broker starts each",
        o.memory_depths
            .iter()
            .map(|d| thousands(*d))
            .collect::<Vec<_>>()
            .join(" and "),
        o.rounds
    );
    let mut figures = Vec::new();
    for &n in &o.memory_depths {
        figures.push(with_db(o, base, &format!("_mem{n}"), |db| depth(o, db, n))?);
    }
    println!();
    println!(
        "{:>10} {:>12} {:>12} {:>10} {:>11} {:>10} {:>12} {:>12} {:>12} {:>10}",
        "queued",
        "RSS empty MB",
        "RSS full MB",
        "B/task",
        "heap B/task",
        "rebuild s",
        "tasks B/row",
        "queue B/task",
        "minimal B/row",
        "÷ tasks row"
    );
    let mut pairs = Vec::new();
    for d in &figures {
        println!(
            "{:>10} {:>12.1} {:>12.1} {:>10.1} {:>11.1} {:>10.2} {:>12.1} {:>12.1} {:>12.1} {:>10.2}",
            thousands(d.tasks),
            d.rss_empty / 1e6,
            d.rss_loaded / 1e6,
            d.per_task,
            d.heap_per_task,
            d.rebuild_s,
            d.tasks_row,
            d.queue_row,
            d.minimal_row,
            d.per_task / d.tasks_row
        );
        pairs.push(format!(
            "memory_{n}_rss_per_task_b={:.1} memory_{n}_heap_per_task_b={:.1} memory_{n}_tasks_row_b={:.1} memory_{n}_rebuild_s={:.3}",
            d.per_task,
            d.heap_per_task,
            d.tasks_row,
            d.rebuild_s,
            n = d.tasks
        ));
    }
    Ok(pairs.join(" "))
}

fn depth(o: &Options, db: &str, n: usize) -> Result<Depth> {
    println!("{}", machine(db)?);
    let maxsize = n * 2 + 1_000;
    let rt = current_thread()?;
    let empty = start_broker(db, maxsize)?;
    rt.block_on(http_load(empty.port, 8, 0.5, None, Op::Noop, 0))?;
    let rss_empty = rss_bytes(empty.child.id())? as f64;
    stop_broker(empty)?;

    eprintln!("seeding {} tasks…", thousands(n));
    let cols = extra_columns(db)?;
    seed_tasks(db, n, &BOEFJE_HEAVY, &cols)?;
    seed_baseline(db, n)?;
    pg_exec(db, "VACUUM ANALYZE")?;
    let per_row = |table: &str| -> Result<f64> {
        let bytes = pg_number(
            db,
            &format!("SELECT pg_total_relation_size('{table}') AS n"),
        )?;
        let rows = pg_number(db, &format!("SELECT count(*) AS n FROM {table}"))?;
        Ok(bytes as f64 / rows.max(1) as f64)
    };
    // Every task is queued here: since migration 16 none has a queue row, and the queue table's
    // bytes (its empty pages and indexes) are given per task, not per row.
    let queue_row =
        pg_number(db, "SELECT pg_total_relation_size('task_queue') AS n")? as f64 / n.max(1) as f64;
    let (tasks_row, minimal_row) = (per_row("tasks")?, per_row("bench_q")?);

    let mut loaded = Vec::new();
    let mut rebuilds = Vec::new();
    let mut heaps = Vec::new();
    for round in 0..o.rounds {
        eprintln!(
            "start {}/{} over {} queued…",
            round + 1,
            o.rounds,
            thousands(n)
        );
        let broker = start_broker(db, maxsize)?;
        rt.block_on(http_load(broker.port, 8, 0.5, None, Op::Noop, 0))?;
        loaded.push(rss_bytes(broker.child.id())? as f64);
        rebuilds.push(broker.rebuild_ms / 1000.0);
        heaps.push(broker.heap_bytes / n as f64);
        stop_broker(broker)?;
    }
    let rss_loaded = median(loaded);
    Ok(Depth {
        tasks: n,
        rss_empty,
        rss_loaded,
        per_task: (rss_loaded - rss_empty) / n as f64,
        heap_per_task: median(heaps),
        rebuild_s: median(rebuilds),
        tasks_row,
        queue_row,
        minimal_row,
    })
}
