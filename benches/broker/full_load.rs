//! The original run (with no scenario named, or `--default`): the broker over HTTP against a
//! bare PostgreSQL SKIP LOCKED queue and the same server's no-op endpoint, side by side on one
//! PostgreSQL server, in alternating rounds.
//!
//! What it measures, each as the median of the rounds:
//! - pops/s and p50/p99 at full load: the broker (64 keep-alive HTTP clients, `POST pop?limit=1`,
//!   each pop durable before its answer), the baseline (`DELETE … FOR UPDATE SKIP LOCKED
//!   RETURNING`, 8 connections), and the no-op endpoint (`GET /livez`);
//! - p99 at 50 % load: broker pops and no-op requests paced at half the broker's full-load rate,
//!   the baseline paced at half its own full-load rate (at the broker's rate it would saturate);
//!   latency counts from each request's scheduled time, so queueing delay is not hidden;
//! - pushes/s: the broker (new tasks, 64 clients) against single-row INSERT commits (8 clients);
//! - heap rebuild time for N queued tasks against `\copy (SELECT …) TO /dev/null` of the same rows;
//! - resident memory per queued task against PostgreSQL's on-disk bytes per baseline row;
//! - beside them, PostgreSQL alone doing the broker's own writes (the ceiling, and the write part
//!   of a pop's latency at half load), WAL bytes per operation and the HOT share of the updates.
//!
//! It also checks while it measures: no popped id is seen twice, and every acknowledged push is
//! in the table afterwards.

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};

use diesel::sql_types::Text;
use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl};

use super::harness::baseline::{baseline, seed_baseline};
use super::harness::http::{Op, engine_counters, engine_delta, http_load};
use super::harness::instance::{rss_bytes, start_broker, stop_broker};
use super::harness::postgres::{
    EVEN_SPLIT, extra_columns, extra_sql, fill_queue, machine, pg_exec, pg_number, seed_tasks,
};
use super::harness::stats::{Figure, median, median_figure, percentile};
use super::{Options, Result};

/// Rows for the PostgreSQL-only ceiling: same shape and table as the broker's, under a scheduler
/// id the broker never loads, so measuring them leaves the broker's heaps alone.
const CEILING_SCHEDULER: &str = super::harness::pg_alone::SCHEDULER;

fn seed_ceiling(url: &str, n: usize, cols: &[&str]) -> Result<()> {
    let (extra_names, extra_values) = extra_sql(cols);
    pg_exec(
        url,
        &format!(
            "INSERT INTO tasks (id, scheduler_id, schedule_id, organisation, type, hash, priority, data, \
               status, attempts, created_at, modified_at{extra_names})
             SELECT t.id, '{CEILING_SCHEDULER}', NULL, 'org' || (t.g % 300), 'boefje', md5(t.id), (t.g % 1000) + 2,
               json_build_object('boefje', json_build_object('id', t.boefje,
                 'oci_image', t.image), 'input_ooi', t.ooi,
                 'organization', 'org' || (t.g % 300), 'id', t.id)::text,
               'queued', 0, now() AT TIME ZONE 'utc', now() AT TIME ZONE 'utc'{extra_values}
             FROM (SELECT g, gen_random_uuid()::text AS id, 'boefje' AS s, 'bench-' || (g % 50) AS boefje,
                          'ghcr.io/minvws/openkat/bench:latest' AS image,
                          'Hostname|internet|host' || g || '.example.com' AS ooi
                   FROM generate_series(1, {n}) g) t"
        ),
    )?;
    fill_queue(url)
}

/// Where PostgreSQL's write-ahead log stands, in bytes.
fn wal_position(url: &str) -> Result<i64> {
    pg_number(
        url,
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS n",
    )
}

/// Updates of `tasks` so far, and how many of them were HOT (in place, no index entries).
/// PostgreSQL's statistics lag by up to a second (backends flush them at most once a second).
fn task_updates(url: &str) -> Result<(i64, i64)> {
    Ok((
        pg_number(
            url,
            "SELECT n_tup_upd AS n FROM pg_stat_user_tables WHERE relname = 'tasks'",
        )?,
        pg_number(
            url,
            "SELECT n_tup_hot_upd AS n FROM pg_stat_user_tables WHERE relname = 'tasks'",
        )?,
    ))
}

/// A pool of `conns + 1` connections to `db` and the ids of the queued ceiling rows.
fn ceiling_rows(db: &str, conns: usize) -> Result<(kat_scheduler::storage::DbPool, Vec<String>)> {
    use kat_scheduler::storage::{self, DbTarget};
    let target = DbTarget::parse(db).map_err(|e| e.to_string())?;
    let pool = storage::connect(&target, conns as u32 + 1, Duration::from_secs(5))?;
    #[derive(QueryableByName)]
    struct IdRow {
        #[diesel(sql_type = Text)]
        id: String,
    }
    let ids = {
        let mut c = storage::checkout(&pool)?;
        diesel::sql_query(format!(
            "SELECT id FROM tasks WHERE scheduler_id = '{CEILING_SCHEDULER}' AND status = 'queued'"
        ))
        .load::<IdRow>(&mut *c)?
        .into_iter()
        .map(|r| r.id)
        .collect()
    };
    Ok((pool, ids))
}

/// PostgreSQL alone doing the broker's durable write per pop (the engine's own statement, from
/// the library), three connections like the three engines, `batch` tasks per statement, no HTTP
/// and no heap: what durable pops could reach if the broker cost nothing.
fn ceiling_pops(db: &str, conns: usize, batch: usize, seconds: f64) -> Result<f64> {
    use kat_scheduler::domain::TaskStatus;
    use kat_scheduler::storage::{self, tasks};
    let (pool, ids) = ceiling_rows(db, conns)?;
    let per = ids.len() / conns;
    let start = Instant::now();
    let handles: Vec<_> = (0..conns)
        .map(|i| {
            let mine: Vec<String> = ids[i * per..(i + 1) * per].to_vec();
            let pool = pool.clone();
            std::thread::spawn(move || -> Result<usize> {
                let mut c = storage::checkout(&pool)?;
                let mut done = 0;
                for chunk in mine.chunks(batch) {
                    if start.elapsed().as_secs_f64() >= seconds {
                        break;
                    }
                    let now = chrono::Utc::now().naive_utc();
                    done += tasks::transition(
                        &mut c,
                        chunk,
                        TaskStatus::Queued,
                        TaskStatus::Dispatched,
                        now,
                        Some(now),
                    )?
                    .len();
                }
                Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h.join().map_err(|_| "ceiling thread panicked")??;
    }
    if start.elapsed().as_secs_f64() < seconds * 0.9 {
        return Err("the ceiling ran out of rows; use more --tasks".into());
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// PostgreSQL alone doing the broker's pop write for tasks arriving at `rate` per second, with
/// group commit as the engines do it: each of `conns` connections writes, in one statement,
/// every task that arrived while its previous statement ran. Each task's latency counts from its
/// scheduled arrival to the end of its statement. Returns the p98: a lower bound for the write
/// part of a pop's latency at that load (the broker adds HTTP and hand-offs on top).
fn paced_write_p98(db: &str, conns: usize, rate: f64, seconds: f64) -> Result<f64> {
    use kat_scheduler::domain::TaskStatus;
    use kat_scheduler::storage::{self, tasks};
    let (pool, ids) = ceiling_rows(db, conns)?;
    let per = ids.len() / conns;
    let needed = (rate / conns as f64 * seconds) as usize + 1;
    if per < needed {
        return Err("the paced write ran out of rows; use more --tasks".into());
    }
    let interval = Duration::from_secs_f64(conns as f64 / rate);
    let start = Instant::now();
    let handles: Vec<_> = (0..conns)
        .map(|i| {
            let mine: Vec<String> = ids[i * per..i * per + needed].to_vec();
            let pool = pool.clone();
            std::thread::spawn(move || -> Result<Vec<u32>> {
                let mut c = storage::checkout(&pool)?;
                let arrival =
                    |k: usize| start + interval.mul_f64(k as f64 + i as f64 / conns as f64);
                let mut lat = Vec::new();
                let mut next = 0;
                while next < mine.len() && start.elapsed().as_secs_f64() < seconds {
                    if let Some(wait) = arrival(next).checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let now = Instant::now();
                    let mut end = next + 1;
                    while end < mine.len() && arrival(end) <= now {
                        end += 1;
                    }
                    let at = chrono::Utc::now().naive_utc();
                    tasks::transition(
                        &mut c,
                        &mine[next..end],
                        TaskStatus::Queued,
                        TaskStatus::Dispatched,
                        at,
                        Some(at),
                    )?;
                    for k in next..end {
                        lat.push(
                            u32::try_from(arrival(k).elapsed().as_micros()).unwrap_or(u32::MAX),
                        );
                    }
                    next = end;
                }
                Ok(lat)
            })
        })
        .collect();
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(h.join().map_err(|_| "paced write thread panicked")??);
    }
    lat.sort_unstable();
    Ok(percentile(&lat, 98))
}

struct Round {
    broker_pop: Figure,
    baseline_pop: Figure,
    noop: Figure,
    broker_pop_half: Figure,
    baseline_pop_half: Figure,
    noop_half: Figure,
    broker_push: Figure,
    baseline_insert: Figure,
    pop_engine: [f64; 3],
    push_engine: [f64; 3],
    ceiling: f64,
    push_ceiling: f64,
    half_engine: [f64; 3],
    write_p98_half: f64,
    /// WAL bytes per broker pop, baseline pop, broker push, baseline insert (full load).
    wal: [f64; 4],
    /// Share of the broker's full-load pops' updates of `tasks` that were HOT.
    hot_pop: f64,
}

fn copy_out_seconds(db: &str) -> Result<f64> {
    let started = Instant::now();
    let status = Command::new("psql")
        .arg(db)
        .arg("-qc")
        // The columns a heap holds of each queued task (all but the payload and the lease), from
        // where a rebuild reads them.
        .arg("\\copy (SELECT id, priority, created_at, modified_at, hash, schedule_id, organisation, \
              plugin_id, oci_image, input_ooi FROM tasks WHERE status = 'queued') TO '/dev/null'")
        .status()?;
    if !status.success() {
        return Err("psql \\copy failed".into());
    }
    Ok(started.elapsed().as_secs_f64())
}

pub fn run_full_load(o: &Options, db: &str) -> Result<String> {
    let maxsize = o.tasks * 2 + 1_000_000;
    println!(
        "kat-scheduler benchmark: {} tasks, {} rounds of {} s, {} HTTP clients, {} baseline connections",
        o.tasks, o.rounds, o.seconds, o.clients, o.pg_clients
    );
    println!("{}", machine(db)?);

    // Empty broker: migrations, then the resident size with nothing queued.
    let empty = start_broker(db, maxsize)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(http_load(empty.port, 8, 0.5, None, Op::Noop, 0))?;
    let rss_empty = rss_bytes(empty.child.id())?;
    stop_broker(empty)?;

    eprintln!("seeding {} tasks and {} baseline rows…", o.tasks, o.tasks);
    let cols = extra_columns(db)?;
    seed_tasks(db, o.tasks, &EVEN_SPLIT, &cols)?;
    seed_baseline(db, o.tasks)?;
    seed_ceiling(db, o.tasks.max(300_000), &cols)?;
    pg_exec(db, "VACUUM ANALYZE tasks")?;

    // Rebuild: a restart with N queued, against COPY-out of the same rows.
    let copy_s = copy_out_seconds(db)?;
    let broker = start_broker(db, maxsize)?;
    let rebuild_s = broker.rebuild_ms / 1000.0;
    rt.block_on(http_load(broker.port, 8, 0.5, None, Op::Noop, 0))?;
    let rss_loaded = rss_bytes(broker.child.id())?;
    let rss_per_task = (rss_loaded as f64 - rss_empty as f64) / o.tasks as f64;
    let pg_bytes_per_row =
        pg_number(db, "SELECT pg_total_relation_size('bench_q') AS n")? as f64 / o.tasks as f64;
    // The broker's own table, with its indexes, per queued task (the ceiling's rows included).
    let tasks_bytes_per_row = pg_number(db, "SELECT pg_total_relation_size('tasks') AS n")? as f64
        / pg_number(db, "SELECT count(*) AS n FROM tasks")?.max(1) as f64;

    if let Some(seconds) = o.profile_pops {
        eprintln!(
            "profiling: broker pops only, {seconds} s (pid {})",
            broker.child.id()
        );
        let before = rt.block_on(engine_counters(broker.port))?;
        let (f, _) = rt.block_on(http_load(broker.port, o.clients, seconds, None, Op::Pop, 0))?;
        let e = engine_delta(before, rt.block_on(engine_counters(broker.port))?);
        println!(
            "broker pops: {:.0}/s, p50 {:.0} µs, p99 {:.0} µs; {:.1} per transaction, {:.0} µs applying, {:.0} µs committing",
            f.ops_per_sec,
            f.p50_us,
            f.p99_us,
            e[0],
            e[1],
            e[2] - e[1]
        );
        stop_broker(broker)?;
        return Ok(String::new());
    }

    let mut rounds = Vec::new();
    let mut popped: HashSet<String> = HashSet::new();
    let mut acked_pushes: Vec<String> = Vec::new();
    let record = |ids: Vec<String>, popped: &mut HashSet<String>| -> Result<()> {
        for id in ids {
            if !popped.insert(id.clone()) {
                return Err(format!("task {id} was popped twice").into());
            }
        }
        Ok(())
    };
    for round in 0..o.rounds {
        eprintln!("round {}/{}…", round + 1, o.rounds);
        let broker_first = round % 2 == 0;
        let mut broker_pop = Figure::default();
        let mut baseline_pop = Figure::default();
        let mut pop_engine = [f64::NAN; 3];
        let mut push_engine = [f64::NAN; 3];
        let mut wal = [f64::NAN; 4];
        let mut hot_pop = f64::NAN;
        for turn in 0..2 {
            if (turn == 0) == broker_first {
                let before = rt.block_on(engine_counters(broker.port))?;
                let (w0, u0) = (wal_position(db)?, task_updates(db)?);
                let (f, r) = rt.block_on(http_load(
                    broker.port,
                    o.clients,
                    o.seconds,
                    None,
                    Op::Pop,
                    round,
                ))?;
                wal[0] = (wal_position(db)? - w0) as f64 / f.ops.max(1) as f64;
                pop_engine = engine_delta(before, rt.block_on(engine_counters(broker.port))?);
                record(r.ids, &mut popped)?;
                broker_pop = f;
                // The statistics of the last second of pops arrive up to a second later.
                std::thread::sleep(Duration::from_millis(1500));
                let u1 = task_updates(db)?;
                hot_pop = (u1.1 - u0.1) as f64 / (u1.0 - u0.0).max(1) as f64;
            } else {
                let w0 = wal_position(db)?;
                baseline_pop = baseline(db, o.pg_clients, o.seconds, None, "pop")?;
                wal[1] = (wal_position(db)? - w0) as f64 / baseline_pop.ops.max(1) as f64;
            }
        }
        let (noop, _) = rt.block_on(http_load(
            broker.port,
            o.clients,
            o.seconds,
            None,
            Op::Noop,
            round,
        ))?;

        let half = broker_pop.ops_per_sec / 2.0;
        let before = rt.block_on(engine_counters(broker.port))?;
        let (broker_pop_half, r) = rt.block_on(http_load(
            broker.port,
            o.clients,
            o.seconds,
            Some(half),
            Op::Pop,
            round,
        ))?;
        let half_engine = engine_delta(before, rt.block_on(engine_counters(broker.port))?);
        record(r.ids, &mut popped)?;
        // PostgreSQL alone doing the same writes for tasks arriving at the same rate, right
        // after, under the same conditions: a lower bound for the write part of a pop's latency.
        let write_p98 = paced_write_p98(db, 3, half, o.seconds)?;
        let (noop_half, _) = rt.block_on(http_load(
            broker.port,
            o.clients,
            o.seconds,
            Some(half),
            Op::Noop,
            round,
        ))?;
        let baseline_pop_half = baseline(
            db,
            o.pg_clients,
            o.seconds,
            Some(baseline_pop.ops_per_sec / 2.0),
            "pop",
        )?;

        let mut broker_push = Figure::default();
        let mut baseline_insert = Figure::default();
        for turn in 0..2 {
            if (turn == 0) == broker_first {
                let before = rt.block_on(engine_counters(broker.port))?;
                let w0 = wal_position(db)?;
                let (f, r) = rt.block_on(http_load(
                    broker.port,
                    o.clients,
                    o.seconds,
                    None,
                    Op::Push,
                    round,
                ))?;
                wal[2] = (wal_position(db)? - w0) as f64 / f.ops.max(1) as f64;
                push_engine = engine_delta(before, rt.block_on(engine_counters(broker.port))?);
                acked_pushes.extend(r.ids);
                broker_push = f;
            } else {
                let w0 = wal_position(db)?;
                baseline_insert = baseline(db, o.pg_clients, o.seconds, None, "insert")?;
                wal[3] = (wal_position(db)? - w0) as f64 / baseline_insert.ops.max(1) as f64;
            }
        }
        // The same durable writes without HTTP, at the batch sizes the broker just ran with; last
        // in the round, so the rows they dirty do not disturb the latency measurements.
        let batch = pop_engine[0].round().max(1.0) as usize;
        let ceiling = ceiling_pops(db, 3, batch, (o.seconds / 2.0).max(1.0))?;
        rounds.push(Round {
            broker_pop,
            baseline_pop,
            noop,
            broker_pop_half,
            baseline_pop_half,
            noop_half,
            broker_push,
            baseline_insert,
            pop_engine,
            push_engine,
            ceiling,
            half_engine,
            write_p98_half: write_p98,
            wal,
            hot_pop,
            push_ceiling: super::harness::pg_alone::pushes(
                db,
                3,
                push_engine[0].round().max(1.0) as usize,
                (o.seconds / 2.0).max(1.0),
                true,
            )?,
        });
    }
    let ready_s = broker.ready_after.as_secs_f64();
    stop_broker(broker)?;

    // Checks: every acknowledged push is stored, every popped task is dispatched.
    let dispatched_sql = "SELECT COUNT(*) AS n FROM tasks WHERE status = 'dispatched' AND scheduler_id IN ('boefje', 'normalizer', 'report')";
    let stored = pg_number(
        db,
        "SELECT COUNT(*) AS n FROM tasks WHERE organisation = 'bench-push'",
    )?;
    let mut conn = PgConnection::establish(db)?;
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = Text)]
        id: String,
    }
    let stored_ids: HashSet<String> =
        diesel::sql_query("SELECT id FROM tasks WHERE organisation = 'bench-push'")
            .load::<Id>(&mut conn)?
            .into_iter()
            .map(|r| r.id)
            .collect();
    let missing = acked_pushes
        .iter()
        .filter(|id| !stored_ids.contains(*id))
        .count();
    let dispatched = pg_number(db, dispatched_sql)?;
    if missing > 0 {
        return Err(format!("{missing} acknowledged pushes are not stored").into());
    }
    if dispatched as usize != popped.len() {
        return Err(format!(
            "{} tasks popped but {dispatched} dispatched in the table",
            popped.len()
        )
        .into());
    }

    let ceiling = median(rounds.iter().map(|r| r.ceiling).collect());
    let push_ceiling = median(rounds.iter().map(|r| r.push_ceiling).collect());
    let m = |f: fn(&Round) -> Figure| median_figure(&rounds.iter().map(f).collect::<Vec<_>>());
    let (bp, lp, np) = (m(|r| r.broker_pop), m(|r| r.baseline_pop), m(|r| r.noop));
    let (bh, lh, nh) = (
        m(|r| r.broker_pop_half),
        m(|r| r.baseline_pop_half),
        m(|r| r.noop_half),
    );
    let (bpush, lins) = (m(|r| r.broker_push), m(|r| r.baseline_insert));

    println!();
    println!(
        "{:<44} {:>12} {:>10} {:>10}",
        "measure (median of rounds)", "ops/s", "p50 µs", "p99 µs"
    );
    let row = |name: &str, f: Figure| {
        println!(
            "{name:<44} {:>12.0} {:>10.0} {:>10.0}",
            f.ops_per_sec, f.p50_us, f.p99_us
        )
    };
    row("broker pop, full load", bp);
    row("baseline SKIP LOCKED pop, full load", lp);
    row("no-op GET /livez, full load", np);
    row("broker pop, 50% of its full-load rate", bh);
    row("no-op, same rate", nh);
    row("baseline pop, 50% of its full-load rate", lh);
    row("broker push", bpush);
    row("baseline single-row INSERT commit", lins);
    println!();
    println!(
        "heap rebuild of {} queued: {:.3} s; COPY-out of the same rows: {:.3} s; service ready after {:.3} s",
        o.tasks, rebuild_s, copy_s, ready_s
    );
    println!(
        "resident memory: {:.1} MB empty, {:.1} MB with {} queued: {:.1} B per task; on disk: baseline table {:.1} B per row, tasks table {:.1} B per row",
        rss_empty as f64 / 1e6,
        rss_loaded as f64 / 1e6,
        o.tasks,
        rss_per_task,
        pg_bytes_per_row,
        tasks_bytes_per_row
    );
    for (what, pick) in [("pop", 0usize), ("push", 1)] {
        let e = |k: usize| {
            median(
                rounds
                    .iter()
                    .map(|r| {
                        if pick == 0 {
                            r.pop_engine[k]
                        } else {
                            r.push_engine[k]
                        }
                    })
                    .collect(),
            )
        };
        println!(
            "engine during full-load {what}s: {:.1} commands per transaction, {:.0} µs applying + {:.0} µs committing per transaction",
            e(0),
            e(1),
            e(2) - e(1)
        );
    }
    let write_p98 = median(rounds.iter().map(|r| r.write_p98_half).collect());
    let half_batch = median(rounds.iter().map(|r| r.half_engine[0]).collect());
    let bound = nh.p50_us + write_p98;
    println!(
        "latency at 50 % load: PostgreSQL alone doing the broker's pop write for tasks arriving at that rate (group-committed; the broker's engines formed {half_batch:.1} per transaction) has p98 {write_p98:.0} µs; \
         so a pop's p99 is at least no-op p50 + that = {bound:.0} µs = {:.2}x the no-op p99 (the target allows 2x)",
        bound / nh.p99_us
    );
    let batch_of = |pick: usize| {
        median(
            rounds
                .iter()
                .map(|r| {
                    if pick == 0 {
                        r.pop_engine[0]
                    } else {
                        r.push_engine[0]
                    }
                })
                .collect(),
        )
        .round()
    };
    println!(
        "ceiling, PostgreSQL alone doing the broker's writes (3 connections, no HTTP, same batch size): \
         pops {ceiling:.0}/s at {:.0} per statement = {:.2}x the baseline (the broker reaches {:.0}% of it); \
         pushes {push_ceiling:.0}/s at {:.0} per statement = {:.2}x single-row INSERTs (the broker reaches {:.0}%)",
        batch_of(0),
        ceiling / lp.ops_per_sec,
        100.0 * bp.ops_per_sec / ceiling,
        batch_of(1),
        push_ceiling / lins.ops_per_sec,
        100.0 * bpush.ops_per_sec / push_ceiling
    );
    let wal = |k: usize| median(rounds.iter().map(|r| r.wal[k]).collect());
    let hot_pop = median(rounds.iter().map(|r| r.hot_pop).collect());
    println!(
        "WAL per operation at full load: broker pop {:.0} B, baseline pop {:.0} B, broker push {:.0} B, \
         baseline INSERT {:.0} B; HOT share of the broker's updates of tasks during pops: {:.1} %",
        wal(0),
        wal(1),
        wal(2),
        wal(3),
        100.0 * hot_pop
    );
    println!(
        "checks: {} pops, none twice; {} acknowledged pushes, all stored ({stored} rows)",
        popped.len(),
        acked_pushes.len()
    );

    let ratios = [
        (
            "pop_throughput_ratio",
            bp.ops_per_sec / lp.ops_per_sec,
            "≥ 10",
        ),
        (
            "pop_p99_vs_baseline_at_half_load",
            bh.p99_us / lh.p99_us,
            "≤ 0.25",
        ),
        ("pop_p99_vs_noop_at_half_load", bh.p99_us / nh.p99_us, "≤ 2"),
        (
            "push_throughput_ratio",
            bpush.ops_per_sec / lins.ops_per_sec,
            "≥ 5",
        ),
        ("rebuild_vs_copy_ratio", rebuild_s / copy_s, "≤ 2"),
        (
            "rss_per_task_vs_pg_row_ratio",
            rss_per_task / pg_bytes_per_row,
            "≤ 1",
        ),
        (
            "rss_per_task_vs_tasks_row_ratio",
            rss_per_task / tasks_bytes_per_row,
            "(reported)",
        ),
    ];
    println!();
    println!("{:<36} {:>8}   target", "ratio", "value");
    for (k, v, t) in ratios {
        println!("{k:<36} {v:>8.2}   {t}");
    }
    println!();
    let mut line = format!(
        "tasks={} rounds={} broker_pops_per_s={:.0} baseline_pops_per_s={:.0} noop_per_s={:.0} broker_pop_p99_us={:.0} \
         baseline_pop_p99_us={:.0} broker_pop_half_p99_us={:.0} noop_half_p99_us={:.0} baseline_pop_half_p99_us={:.0} \
         broker_pushes_per_s={:.0} baseline_inserts_per_s={:.0} rebuild_s={:.3} copy_s={:.3} rss_per_task_b={:.1} pg_bytes_per_row={:.1}",
        o.tasks,
        o.rounds,
        bp.ops_per_sec,
        lp.ops_per_sec,
        np.ops_per_sec,
        bp.p99_us,
        lp.p99_us,
        bh.p99_us,
        nh.p99_us,
        lh.p99_us,
        bpush.ops_per_sec,
        lins.ops_per_sec,
        rebuild_s,
        copy_s,
        rss_per_task,
        pg_bytes_per_row
    );
    line.push_str(&format!(
        " ceiling_pops_per_s={ceiling:.0} ceiling_pop_ratio={:.3} ceiling_pushes_per_s={push_ceiling:.0} ceiling_push_ratio={:.3} \
         write_p98_half_load_us={write_p98:.0} pop_p99_lower_bound_vs_noop={:.3} \
         wal_per_pop_b={:.0} wal_per_baseline_pop_b={:.0} wal_per_push_b={:.0} wal_per_baseline_insert_b={:.0} \
         hot_share_pops={:.3}",
        ceiling / lp.ops_per_sec,
        push_ceiling / lins.ops_per_sec,
        bound / nh.p99_us,
        wal(0),
        wal(1),
        wal(2),
        wal(3),
        hot_pop
    ));
    for (k, v, _) in ratios {
        line.push_str(&format!(" {k}={v:.3}"));
    }
    Ok(line)
}
