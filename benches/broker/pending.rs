//! `--pending`: two databases with Q queued boefje tasks (and Q/10 of each other kind). A broker
//! with `SCHEDULER_PQ_MAXSIZE` = M on the first (at its start, queued rows beyond M become
//! `pending`; the harness reports the table's counts), a broker with room on the second. The
//! first database's planner statistics are dropped before its broker starts, so its tables are
//! as never analysed (a fresh database, PostgreSQL with `autovacuum = off`, or any server
//! between a bulk load and its next analyse). The same pop bodies as `--workers` on the full
//! heap, so the pops run over the backlog beyond it (a burst pops up to Q/4), and on the broker
//! with room, side by side (in each round each body on one broker and then on the other, the
//! first by turns), and each body's ratio: `pending_vs_room_<body>=` (target ≥ 0.8), and how many
//! pops the full heap's broker set aside for a refill's picks (`pending_pops_set_aside=`), and
//! for each body on each broker the engines' work per batch and the server's WAL per task popped
//! (`<side>_<body>_batch_us_per_batch=`, `<side>_<body>_wal_bytes_per_pop=`), with where the log
//! began and ended while each body ran in the last round, for `pg_waldump`; the engines' figures
//! and the log are of the bursts alone, the put-backs after them apart
//! (`<side>_<body>_put_back_wal_bytes_per_pop=`), and, over the backlog, the share of the tasks
//! popped that came straight from it rather than the heap (`<side>_<body>_from_backlog_share=`)
//! and the searches of its indexes (`<side>_<body>_backlog_searches_per_1000_pops=`), and the task
//! rows written `queued` while the bursts ran (`<side>_<body>_written_queued_per_1000_pops=`:
//! pushes into the heap, and tasks the heap held as read written so before a batch that meets
//! them). Then pushes (64
//! clients) into the full heap against pushes into the broker with room, alternating, and the
//! ratio. Last, the starvation check: K tasks of an image no other task has
//! (`ghcr.io/minvws/openkat/rare:latest`), ranked after everything waiting, are pushed into the
//! full heap, and one worker pops that image until it has them all or gets nothing for 3 s:
//! `rare_image_popped=<n>/<K>`, and `rare_empty_answers=<e>`, the empty answers it got while
//! some of them still waited (target 0: each sends a real runner to sleep for 10 s).
//! Last, with both brokers stopped, the bound the server sets on the pops' ratio: the boefje
//! engine's own batch statement on one connection, as the engine runs it, taking pending tasks
//! (the task's update and its queue row's delete) on the first database against heap tasks (the
//! update alone) on the second: `alone_pending_vs_heap=`; and beside them, on the first, half its
//! pending tasks written as heap tasks are with their queue rows deleted afterwards in sets of a
//! thousand, timed apart: the pops' statement without the delete on the same table
//! (`alone_pending_vs_unswept=`, `alone_delete_in_statement_us_per_task=`) and what the delete
//! costs elsewhere, in sets (`alone_sweep_us_per_task=`). Before that, on the first database, a
//! backlog search for each organisation's best 65 pending tasks on an engine's connection, joined
//! to `tasks` against from the queue rows alone: `search_queue_rows_vs_joined=`; a refill read
//! against read and moved (`refill_read_vs_move=`); and a push batch's read of waiting work by
//! hash, on `tasks` never analysed, as a lookup of the hash index per hash against one `IN` list
//! (`hash_read_lookups_vs_list=`).
//!
//! `--pending-control` runs the same with room in both brokers' heaps and stops after the
//! starvation check: two identical sides measured as the scenario measures its two, whose ratios
//! (`control_vs_room_<body>=`) show the spread the machine alone gives them.
//!
//! How long (this project's 2 shared CPUs): `--pending --seconds 1` about 50 s, at 5 s about 3
//! minutes.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::harness::http::{Http, current_thread, metric_values, pop_request_with, send_all};
use super::harness::instance::{Broker, start_broker, stop_broker};
use super::harness::pg_alone::{
    Dispatch, dispatches, hash_reads, ids_in, own_boefje, refills, searches,
};
use super::harness::postgres::{
    BOEFJE_HEAVY, IMAGES, ORGS, count_ids, count_tasks, extra_columns, machine, pg_exec, seed_tasks,
};
use super::harness::stats::{Figure, median, median_figure, thousands};
use super::harness::worker_pops::{
    Body, BodyFigure, Role, SideFigures, Tally, Want, body_pairs, boefje_push, burst, check_table,
    image_filter, measure_side_by_side, print_bodies, print_engine_per_batch, steady,
};
use super::{Options, Result};

/// The pending scenario: a heap bounded far below the queue, the same pops, pushes into the full
/// heap against pushes into a broker with room, and the starvation check.
pub fn run_pending(o: &Options, full_db: &str, room_db: &str) -> Result<String> {
    let began = Instant::now();
    let q = o.pending_queued;
    let room_maxsize = q * 2 + 1_000_000;
    let m = if o.pending_control {
        room_maxsize
    } else {
        o.pending_maxsize
    };
    println!(
        "kat-scheduler benchmark, pending: {} queued boefje tasks, heap maxsize {}, {} rounds of {} s, {} HTTP clients",
        thousands(q),
        thousands(m),
        o.rounds,
        o.seconds,
        o.clients
    );
    println!("{}", machine(full_db)?);
    let rows = q.div_ceil(IMAGES) * BOEFJE_HEAVY.len();
    for db in [full_db, room_db] {
        stop_broker(start_broker(db, room_maxsize)?)?;
        let cols = extra_columns(db)?;
        eprintln!("pending: seeding {rows} tasks…");
        seed_tasks(db, rows, &BOEFJE_HEAVY, &cols)?;
    }
    let boefje = count_tasks(full_db, "boefje", "'queued'")? as usize;
    forget_statistics(full_db)?;
    let full = start_broker(full_db, m)?;
    let room = match start_broker(room_db, room_maxsize) {
        Ok(r) => r,
        Err(e) => {
            let _ = stop_broker(full);
            return Err(e);
        }
    };
    let at_start = (
        count_tasks(full_db, "boefje", "'queued'")? as usize,
        count_tasks(full_db, "boefje", "'pending'")? as usize,
    );
    let result = pending_measurements(o, full_db, &full, &room, boefje);
    // Pops that waited for a refill's picks, set aside while the engine served the others.
    let set_aside = current_thread()
        .and_then(|rt| {
            rt.block_on(metric_values(
                full.port,
                ["scheduler_engine_pops_set_aside_total"],
            ))
        })
        .map_or(f64::NAN, |[n]| n);
    let stopped = (stop_broker(full), stop_broker(room));
    let p = result?;
    stopped.0?;
    stopped.1?;
    let checks_full = check_table(
        full_db,
        &p.acked_full,
        boefje + p.full_pushed + p.rare_ids.len() - p.rare_popped,
        p.rare_popped,
        p.completed,
    )?;
    let checks_room = check_table(
        room_db,
        &p.acked_room,
        boefje + p.room_pushed,
        0,
        p.room_completed,
    )?;
    if o.pending_control {
        return Ok(control_report(&p, &checks_full, &checks_room, began));
    }
    // What a backlog search for an organisation costs, read both ways, on what the brokers
    // left (before PostgreSQL alone uses the pending tasks up).
    eprintln!("pending: backlog searches, joined and from the queue rows alone…");
    let search_us = searches(full_db, SEARCH_ROWS, 5)?;
    // What a refill costs per task, as the engines moved the tasks until now and as they read
    // them now (the moves take the best pending tasks; PostgreSQL alone takes what is left).
    eprintln!("pending: refills, moved and read…");
    let refill_us = refills(full_db, REFILL_PICKS, REFILL_PASSES)?;
    eprintln!("pending: push batches' reads by hash, as one list and one lookup a hash…");
    // The service analyses `tasks` at its start (`storage::statistics`): forgotten again, so the
    // reads meet the table as a bulk load leaves it before anything analyses it.
    forget_statistics(full_db)?;
    let hash_us = hash_reads(full_db, HASH_BATCH, HASH_PASSES)?;
    // The checks above count what the brokers left; what PostgreSQL alone does next uses it up.
    let alone = alone_dispatches(o, full_db, room_db)?;

    println!();
    println!(
        "pending: {} queued boefje tasks with heap maxsize {}: after the start {} are queued and {} pending in the table",
        thousands(boefje),
        thousands(m),
        thousands(at_start.0),
        thousands(at_start.1)
    );
    println!(
        "pops over the backlog beyond the heap (tables never analysed when the broker started):"
    );
    print_bodies(&p.figs, None);
    println!("the same pops on the broker with room in its heap:");
    print_bodies(&p.room_figs, None);
    let ratios = print_ratios(
        &p,
        [
            "pops over the backlog ÷ pops with room",
            "backlog/s",
            "room/s",
        ],
        "pending_vs_room",
    );
    println!("(target ≥ 0.8 for every body)");
    print_engine_per_batch([&p.figs, &p.room_figs], ["over the backlog", "with room"]);
    println!(
        "pops that waited for a refill's picks, set aside while the engine served others (the full heap's whole run): {set_aside}"
    );
    println!(
        "over the backlog, tasks popped straight from the pending backlog (not the heap), searches of its indexes, and task rows written `queued` (with room, the latter beside):"
    );
    for body in Body::ALL {
        let [share, searches, queued] = p.figs[body.index()].backlog;
        println!(
            "{:<44} {:>9.1} % of tasks popped {:>8.1} searches {:>8.1} queued ({:.1} with room) per 1,000 pops",
            body.label(),
            share * 100.0,
            searches,
            queued,
            p.room_figs[body.index()].backlog[2]
        );
    }
    println!(
        "PostgreSQL alone, the engine's batch statement on one connection, {ALONE_BATCH} tasks a statement (tasks/s):"
    );
    println!(
        "{:<44} {:>10.0} {:>10.0} {:>9.2}",
        "  pending tasks (update + queue row) ÷ heap tasks",
        alone.pending,
        alone.heap,
        alone.pending / alone.heap
    );
    println!(
        "{:<44} {:>10.0} {:>10.0} {:>9.2}",
        "  pending tasks, update + queue row ÷ update alone",
        alone.pending,
        alone.unswept,
        alone.pending / alone.unswept
    );
    println!(
        "  their queue rows deleted apart, a thousand a statement: {:.1} µs a task, against {:.1} µs a task that the delete in the pops' statement costs",
        alone.sweep_us,
        1e6 / alone.pending - 1e6 / alone.unswept
    );
    println!(
        "a backlog search for one organisation's best {SEARCH_ROWS} pending tasks, on the engine's connection (median µs):"
    );
    println!(
        "{:<44} {:>10.0} {:>10.0} {:>9.2}",
        "  queue rows alone ÷ joined to tasks",
        search_us.1,
        search_us.0,
        search_us.1 / search_us.0
    );
    println!(
        "a refill of {REFILL_PICKS} pending tasks into the heap, on the engine's connection (median µs a task):"
    );
    println!(
        "{:<44} {:>10.1} {:>10.1} {:>9.2}",
        "  read (now) ÷ read and moved (until now)",
        refill_us.1,
        refill_us.0,
        refill_us.1 / refill_us.0
    );
    println!(
        "a push batch's read of {HASH_BATCH} hashes (half waiting), on the engine's connection, `tasks` never analysed (median µs):"
    );
    println!(
        "{:<44} {:>10.0} {:>10.0} {:>9.2}",
        "  a lookup a hash (now) ÷ one list (until now)",
        hash_us.1,
        hash_us.0,
        hash_us.1 / hash_us.0
    );
    let (pf, pr) = (p.push_full, p.push_room);
    println!(
        "{:<44} {:>10.0} {:>9.0} {:>9.0}",
        "pushes into the full heap (pending)", pf.ops_per_sec, pf.p50_us, pf.p99_us
    );
    println!(
        "{:<44} {:>10.0} {:>9.0} {:>9.0}",
        "pushes into a broker with room", pr.ops_per_sec, pr.p50_us, pr.p99_us
    );
    let push_ratio = pf.ops_per_sec / pr.ops_per_sec;
    println!("pushes into pending ÷ pushes with room: {push_ratio:.2} (target ≥ 0.5)");
    println!(
        "starvation: {} tasks of an image no other task has, pushed into the full heap ({} stored as pending): \
         a worker popping that image got {} of them in {:.1} s, and {} empty answers while some waited",
        p.rare_ids.len(),
        p.rare_pending,
        p.rare_popped,
        p.rare_s,
        p.rare_empty
    );
    println!(
        "checks: no task popped twice, every popped task matched its filter; full heap: {checks_full}; with room: {checks_room}"
    );
    let wall_s = began.elapsed().as_secs_f64();
    println!("pending scenario: {wall_s:.0} s in all");
    println!();
    let mut kv = vec![
        format!("pending_queued={boefje}"),
        format!("pending_maxsize={m}"),
        format!("pending_rows_at_start={}", at_start.1),
        format!("queued_rows_at_start={}", at_start.0),
    ];
    kv.extend(body_pairs("pending", &p.figs, None));
    kv.extend(body_pairs("room", &p.room_figs, None));
    kv.extend(ratios);
    kv.push(format!("pending_pops_set_aside={set_aside}"));
    for (side, figs) in [("pending", &p.figs), ("room", &p.room_figs)] {
        for body in Body::ALL {
            let [c, a, b] = figs[body.index()].engine;
            kv.push(format!("{side}_{}_commands_per_batch={c:.1}", body.key()));
            kv.push(format!("{side}_{}_apply_us_per_batch={a:.0}", body.key()));
            kv.push(format!("{side}_{}_batch_us_per_batch={b:.0}", body.key()));
            let [bytes, fpi, restore] = figs[body.index()].wal;
            kv.push(format!(
                "{side}_{}_wal_bytes_per_pop={bytes:.0}",
                body.key()
            ));
            kv.push(format!(
                "{side}_{}_put_back_wal_bytes_per_pop={restore:.0}",
                body.key()
            ));
            let [share, searches, queued] = figs[body.index()].backlog;
            kv.push(format!(
                "{side}_{}_from_backlog_share={share:.3}",
                body.key()
            ));
            kv.push(format!(
                "{side}_{}_backlog_searches_per_1000_pops={searches:.1}",
                body.key()
            ));
            kv.push(format!(
                "{side}_{}_written_queued_per_1000_pops={queued:.1}",
                body.key()
            ));
            kv.push(format!(
                "{side}_{}_wal_fpi_per_1000_pops={fpi:.0}",
                body.key()
            ));
        }
    }
    kv.push(format!(
        "alone_pending_dispatches_per_s={:.0}",
        alone.pending
    ));
    kv.push(format!("alone_heap_dispatches_per_s={:.0}", alone.heap));
    kv.push(format!(
        "alone_pending_vs_heap={:.3}",
        alone.pending / alone.heap
    ));
    kv.push(format!(
        "alone_unswept_dispatches_per_s={:.0}",
        alone.unswept
    ));
    kv.push(format!(
        "alone_pending_vs_unswept={:.3}",
        alone.pending / alone.unswept
    ));
    kv.push(format!(
        "alone_delete_in_statement_us_per_task={:.1}",
        1e6 / alone.pending - 1e6 / alone.unswept
    ));
    kv.push(format!("alone_sweep_us_per_task={:.1}", alone.sweep_us));
    kv.push(format!("search_joined_us={:.0}", search_us.0));
    kv.push(format!("search_queue_rows_us={:.0}", search_us.1));
    kv.push(format!(
        "search_queue_rows_vs_joined={:.3}",
        search_us.1 / search_us.0
    ));
    kv.push(format!("refill_move_us_per_task={:.1}", refill_us.0));
    kv.push(format!("refill_read_us_per_task={:.1}", refill_us.1));
    kv.push(format!(
        "refill_read_vs_move={:.3}",
        refill_us.1 / refill_us.0
    ));
    kv.push(format!("hash_read_list_us={:.0}", hash_us.0));
    kv.push(format!("hash_read_lookups_us={:.0}", hash_us.1));
    kv.push(format!(
        "hash_read_lookups_vs_list={:.3}",
        hash_us.1 / hash_us.0
    ));
    kv.push(format!("pending_pushes_per_s={:.0}", pf.ops_per_sec));
    kv.push(format!("pending_push_p99_us={:.0}", pf.p99_us));
    kv.push(format!("room_pushes_per_s={:.0}", pr.ops_per_sec));
    kv.push(format!("room_push_p99_us={:.0}", pr.p99_us));
    kv.push(format!("push_pending_vs_room={push_ratio:.3}"));
    kv.push(format!(
        "rare_image_popped={}/{}",
        p.rare_popped,
        p.rare_ids.len()
    ));
    kv.push(format!("rare_empty_answers={}", p.rare_empty));
    kv.push(format!("rare_image_pending_when_pushed={}", p.rare_pending));
    kv.push(format!("pending_wall_s={wall_s:.0}"));
    Ok(kv.join(" "))
}

/// Each body's pops a second on the first broker ÷ the second, printed under `heads` (the
/// ratio's name, then each side's column) and answered as `<key>_<body>=` pairs.
fn print_ratios(p: &PendingFigures, heads: [&str; 3], key: &str) -> Vec<String> {
    println!(
        "{:<44} {:>10} {:>10} {:>9}",
        heads[0], heads[1], heads[2], "ratio"
    );
    Body::ALL
        .into_iter()
        .map(|body| {
            let (a, b) = (
                p.figs[body.index()].pops.ops_per_sec,
                p.room_figs[body.index()].pops.ops_per_sec,
            );
            println!(
                "{:<44} {:>10.0} {:>10.0} {:>9.2}",
                body.label(),
                a,
                b,
                a / b
            );
            format!("{key}_{}={:.3}", body.key(), a / b)
        })
        .collect()
}

/// `--pending-control`: the same bodies on two brokers with room, measured as the scenario
/// measures its two sides. Their ratios are what identical sides give on this machine, the spread
/// within which a ratio of the scenario proper says nothing.
fn control_report(p: &PendingFigures, checks: &str, checks_room: &str, began: Instant) -> String {
    println!();
    println!("control: both brokers with room in their heaps (nothing pending)");
    println!("the pops on the first broker:");
    print_bodies(&p.figs, None);
    println!("the same pops on the second:");
    print_bodies(&p.room_figs, None);
    let mut kv = print_ratios(
        p,
        ["pops on the first ÷ on the second", "first/s", "second/s"],
        "control_vs_room",
    );
    println!("(identical sides: the spread of these ratios over runs is the measurement's own)");
    println!(
        "checks: no task popped twice, every popped task matched its filter; first: {checks}; second: {checks_room}"
    );
    let wall_s = began.elapsed().as_secs_f64();
    println!("pending control: {wall_s:.0} s in all");
    println!();
    kv.push(format!("pending_control_wall_s={wall_s:.0}"));
    kv.join(" ")
}

/// Tasks a refill moves in the refill comparison: a tenth of the benchmark's heap, what a refill
/// ahead moves once the heap has that much room (`queue::engine::refill::refill_at`).
const REFILL_PICKS: usize = 1_000;

/// Refills each way in the refill comparison: 20,000 tasks moved in all, of some 70,000 pending
/// after the runs.
const REFILL_PASSES: usize = 10;

/// Hashes a push batch reads in the comparison of reads by hash: about what the engines group
/// in a batch at 64 clients (9.5–10.5 pushes, BENCHMARKS).
const HASH_BATCH: usize = 10;

/// Reads each way in the comparison of reads by hash.
const HASH_PASSES: usize = 40;

/// Rows a backlog search reads in the search comparison: one pop's and the read ahead's
/// (`queue::engine::read_ahead`, 64).
const SEARCH_ROWS: usize = 65;

/// Tasks a statement in [`alone_dispatches`]: about what a batch of the organisation body's pops
/// holds at 16 clients (pops ÷ the engine's statements in the server's log).
const ALONE_BATCH: usize = 8;

/// The bound the server sets on the ratio of pops over the backlog to pops with room: the boefje
/// engine's own batch statement on one connection, as the engine runs it, with nothing of the
/// broker around it (no HTTP, no heap, no search): pending tasks taken from the backlog (the
/// task's update and its queue row's delete) on the full database, against heap tasks (the
/// task's update alone) on the one with room, `ALONE_BATCH` a statement. And, on the full
/// database beside them, the same pending tasks written as heap tasks are, their queue rows
/// deleted afterwards in sets (half its pending tasks, made `queued` beforehand with their queue
/// rows kept): the pops' statement with the delete taken off it, on the same table as the
/// pending side, and the delete's cost apart. In alternating rounds, each of the same number of
/// tasks (the full database's pending tasks shared out, so that no round runs dry). Run once
/// both brokers have stopped (the harness takes the scheduler's owner row over).
fn alone_dispatches(o: &Options, full_db: &str, room_db: &str) -> Result<Alone> {
    eprintln!("pending: PostgreSQL alone, the engine's statement…");
    let owners = [own_boefje(full_db)?, own_boefje(room_db)?];
    let mut pending = ids_in(full_db, "pending")?;
    let mut swept = pending.split_off(pending.len() / 2);
    pg_exec(
        full_db,
        &format!(
            "UPDATE tasks SET status = 'queued' WHERE id IN ({}); CHECKPOINT;",
            swept
                .iter()
                .map(|id| format!("'{id}'"))
                .collect::<Vec<_>>()
                .join(",")
        ),
    )?;
    let mut heap = ids_in(room_db, "queued")?;
    let rounds = o.rounds.max(1);
    let per_round = pending.len().min(swept.len()).min(heap.len()) / rounds;
    let mut rates: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let mut sweeps = Vec::new();
    for round in 0..rounds {
        for k in 0..3 {
            let side = (round + k) % 3;
            let (db, owner, ids, how) = match side {
                0 => (full_db, &owners[0], &mut pending, Dispatch::Pending),
                1 => (room_db, &owners[1], &mut heap, Dispatch::Heap),
                _ => (full_db, &owners[0], &mut swept, Dispatch::Swept),
            };
            let (rate, sweep_us) = dispatches(db, owner, ids, how, ALONE_BATCH, per_round)?;
            rates[side].push(rate);
            if how == Dispatch::Swept {
                sweeps.push(sweep_us);
            }
        }
    }
    let [pending, heap, swept] = rates;
    Ok(Alone {
        pending: median(pending),
        heap: median(heap),
        unswept: median(swept),
        sweep_us: median(sweeps),
    })
}

/// What [`alone_dispatches`] measured: medians, tasks a second, and µs a task.
struct Alone {
    /// Pending tasks, the update and the queue row's delete in the statement.
    pending: f64,
    /// Heap tasks on the database with room, the update alone.
    heap: f64,
    /// Pending tasks on the full database written without the delete in the statement.
    unswept: f64,
    /// Deleting those tasks' queue rows afterwards, a thousand a statement, µs a task.
    sweep_us: f64,
}

/// Drops the planner's statistics of the queue tables and their indexes, so PostgreSQL plans
/// from its defaults as on tables never analysed (needs a superuser, as the harness is).
fn forget_statistics(db: &str) -> Result<()> {
    pg_exec(
        db,
        "DELETE FROM pg_statistic WHERE starelid IN ('tasks'::regclass, 'task_queue'::regclass);
         UPDATE pg_class SET reltuples = -1, relpages = 0, relallvisible = 0
          WHERE oid IN ('tasks'::regclass, 'task_queue'::regclass)
             OR oid IN (SELECT indexrelid FROM pg_index
                         WHERE indrelid IN ('tasks'::regclass, 'task_queue'::regclass));",
    )
}

struct PendingFigures {
    figs: [BodyFigure; 5],
    room_figs: [BodyFigure; 5],
    room_pushed: usize,
    room_completed: usize,
    rare_empty: usize,
    push_full: Figure,
    push_room: Figure,
    acked_full: Vec<String>,
    acked_room: Vec<String>,
    /// Acknowledged pushes of the push measurement on the full heap (they stay waiting).
    full_pushed: usize,
    completed: usize,
    rare_ids: Vec<String>,
    rare_pending: usize,
    rare_popped: usize,
    rare_s: f64,
}

fn pending_measurements(
    o: &Options,
    full_db: &str,
    full: &Broker,
    room: &Broker,
    boefje: usize,
) -> Result<PendingFigures> {
    let budget = (boefje / 4).max(o.clients * 8);
    let [full_side, room_side] = measure_side_by_side(
        o,
        [full.port, room.port],
        full_db,
        budget,
        ["pending", "room"],
    )?;
    let SideFigures {
        figs,
        acked: mut acked_full,
        completed,
    } = full_side;
    let SideFigures {
        figs: room_figs,
        acked: mut acked_room,
        completed: room_completed,
    } = room_side;
    let rt = current_thread()?;
    let pushers = vec![
        Role::Push {
            per_completion: false
        };
        o.clients
    ];
    let mut full_rounds = Vec::new();
    let mut room_rounds = Vec::new();
    let mut full_pushed = 0;
    let mut room_pushed = 0;
    for round in 0..o.rounds {
        eprintln!("pending: push round {}/{}…", round + 1, o.rounds);
        for turn in 0..2 {
            let into_full = (turn == 0) == (round % 2 == 0);
            let port = if into_full { full.port } else { room.port };
            let b = rt.block_on(burst(port, &pushers, usize::MAX, o.seconds))?;
            let mut tally = Tally::new();
            let window = steady(
                &[&b.push_samples],
                b.clients,
                None,
                Duration::from_secs_f64(o.seconds),
                b.elapsed,
            );
            tally.add(&[], &b.push_samples, window);
            let f = tally.figures().1;
            if into_full {
                full_pushed += b.pushes.len();
                acked_full.extend(b.pushes);
                full_rounds.push(f);
            } else {
                room_pushed += b.pushes.len();
                acked_room.extend(b.pushes);
                room_rounds.push(f);
            }
        }
    }

    // Starvation: tasks of an image nothing else has, pushed once the heap is full and ranked
    // after everything waiting (as new automatic work is); one worker pops only that image.
    eprintln!("pending: starvation check…");
    let rare: Vec<Vec<u8>> = (0..o.rare)
        .map(|k| boefje_push("rare-boefje", RARE_IMAGE, &format!("org{}", k % ORGS), 1001))
        .collect();
    let rare_ids = rt.block_on(send_all(full.port, o.clients, rare, 201))?;
    acked_full.extend(rare_ids.iter().cloned());
    let rare_pending = count_ids(full_db, &rare_ids, "status = 'pending'")?;
    let started = Instant::now();
    let (rare_popped, rare_empty) = rt.block_on(rare_worker(full.port, &rare_ids))?;
    let rare_s = started.elapsed().as_secs_f64();
    Ok(PendingFigures {
        figs,
        room_figs,
        room_pushed,
        room_completed,
        rare_empty,
        push_full: median_figure(&full_rounds),
        push_room: median_figure(&room_rounds),
        acked_full,
        acked_room,
        full_pushed,
        completed,
        rare_ids,
        rare_pending,
        rare_popped,
        rare_s,
    })
}

const RARE_IMAGE: &str = "ghcr.io/minvws/openkat/rare:latest";

/// One worker popping only the rare image, as the runner does: until it has them all, or until
/// 3 s pass without a task (polling every 20 ms; the real runner waits 10 s), or 120 s in all.
/// Answers how many it got, and how many empty answers it got while some still waited.
async fn rare_worker(port: u16, ids: &[String]) -> Result<(usize, usize)> {
    let wanted: HashSet<&str> = ids.iter().map(String::as_str).collect();
    let mut got: HashSet<String> = HashSet::new();
    let mut http = Http::connect(port).await?;
    let request = pop_request_with("boefje", Some(&image_filter(RARE_IMAGE)));
    let want = Want::Image(RARE_IMAGE.to_owned());
    let mut body = Vec::new();
    let start = Instant::now();
    let mut last = Instant::now();
    let mut empty = 0;
    while got.len() < wanted.len()
        && last.elapsed() < Duration::from_secs(3)
        && start.elapsed() < Duration::from_secs(120)
    {
        let s = http.call(&request, &mut body).await?;
        if s != 200 {
            return Err(format!(
                "rare pop: unexpected HTTP {s}: {}",
                String::from_utf8_lossy(&body)
            )
            .into());
        }
        let v: serde_json::Value = serde_json::from_slice(&body)?;
        let Some(task) = v["results"].as_array().and_then(|r| r.first()) else {
            // Every one of them was pushed before the first pop: one is still waiting.
            empty += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let id = task["id"].as_str().unwrap_or_default().to_owned();
        if !want.check(task) || !wanted.contains(id.as_str()) {
            return Err(format!("the rare-image pop returned another task: {task}").into());
        }
        if !got.insert(id.clone()) {
            return Err(format!("task {id} was popped twice").into());
        }
        last = Instant::now();
    }
    Ok((got.len(), empty))
}
