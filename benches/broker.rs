//! The benchmark harness: the broker over HTTP against a bare PostgreSQL SKIP LOCKED queue and
//! the same server's no-op endpoint, side by side on one PostgreSQL server, in alternating rounds.
//!
//! ```sh
//! cargo bench --bench broker                    # N = 1,000,000 queued tasks, 3 rounds
//! cargo bench --bench broker -- --tasks 100000 --seconds 3   # a quick run
//! cargo bench --bench broker -- --workers       # the pops real workers send, at 1e4, 1e5, 1e6 queued
//! cargo bench --bench broker -- --workers --depths 10000 --seconds 1   # a quick look
//! cargo bench --bench broker -- --pending       # 1e5 queued over a heap of 1e4
//! cargo bench --bench broker -- --ingest        # the listener and ColdStart (broker/ingest.rs)
//! cargo bench --bench broker -- --ingest --messages 5000 --objects 20000   # a quick look
//! cargo bench --bench broker -- --cron          # one tick over 1e5 due schedules; re-score of 1e6 (broker/cron.rs)
//! cargo bench --bench broker -- --cluster --tasks 100000 --seconds 2   # one instance vs three; 10 takeovers (broker/cluster.rs)
//! cargo bench --bench broker -- --cron --due 10000 --rescore-tasks 100000   # a quick look
//! cargo bench --bench broker -- --sqlite        # the embedded default: pops and pushes (broker/sqlite.rs)
//! cargo bench --bench broker -- --sqlite --tasks 100000 --vs OTHER-BUILD   # two builds side by side
//! ```
//!
//! Options: `--tasks N`, `--rounds R` (≥ 3), `--seconds S` per measurement, `--clients C` (HTTP,
//! default 64), `--pg-clients P` (baseline, default 8), `--pg URL` (a maintenance database; the
//! harness creates and drops its own), `--keep` (keep the databases). Scenarios: with none named
//! the original measurements run (below); `--workers`, `--pending`, `--ingest`, `--cron` and
//! `--sqlite` run only themselves, and `--default` adds the original measurements to them.
//! `--depths D,D,…` (for `--workers`, default `10000,100000,1000000`; `1e5` works too),
//! `--pending-queued Q` (default 100,000), `--pending-maxsize M` (default 10,000; also the heap
//! bound of `--sqlite`), `--rare K` (default 500); for `--ingest`, `--messages M` per listener
//! round (default 20,000), `--objects O` per ColdStart round (default 100,000) over `--orgs K`
//! organisations (default 10). `--vs PATH` (for `--sqlite`): another build of the broker. Counts
//! (`--tasks` too) take `100_000` or `1e5`.
//!
//! What the original run measures, each as the median of the rounds:
//! - pops/s and p50/p99 at full load: the broker (64 keep-alive HTTP clients, `POST pop?limit=1`,
//!   each pop durable before its answer), the baseline (`DELETE … FOR UPDATE SKIP LOCKED
//!   RETURNING`, 8 connections), and the no-op endpoint (`GET /livez`);
//! - p99 at 50 % load: broker pops and no-op requests paced at half the broker's full-load rate,
//!   the baseline paced at half its own full-load rate (at the broker's rate it would saturate);
//!   latency counts from each request's scheduled time, so queueing delay is not hidden;
//! - pushes/s: the broker (new tasks, 64 clients) against single-row INSERT commits (8 clients);
//! - heap rebuild time for N queued tasks against `\copy (SELECT …) TO /dev/null` of the same rows;
//! - resident memory per queued task against PostgreSQL's on-disk bytes per baseline row.
//!
//! It also checks while it measures: no popped id is seen twice, and every acknowledged push is
//! in the table afterwards. The last line is `key=value` pairs for machines (one line for all the
//! scenarios that ran).
//!
//! Seeded tasks look like the field's: boefje tasks spread evenly over 30 boefje ids (`b0`…`b29`)
//! on 10 OCI images (`ghcr.io/minvws/openkat/img{0..9}:latest`, boefje `bK` on image `K % 10`)
//! and 50 organisations (`org0`…`org49`), each with its own input OOI, random priorities 2–1001;
//! normalizer and report tasks beside them. When `tasks` has the columns `plugin_id`,
//! `oci_image` and `input_ooi` (checked in `information_schema` after the broker migrated), the
//! seed fills them (the boefje, normalizer or report recipe id; the image; the input OOI), else it
//! leaves them out, so the harness runs on schemas with and without them.
//!
//! `--workers`: for each depth D, a database and broker of its own with D queued boefje tasks (and
//! D/10 normalizer and D/10 report tasks), and D rows in the baseline queue. Each round measures,
//! in an order reversed every other round, with 64 clients on `POST /schedulers/boefje/pop?limit=1`
//! and the body the boefje runner sends (`Content-Type: application/json`):
//! - unfiltered: no body;
//! - one image of ten: `{"filters": [{"column": "data", "field": "boefje__oci_image", "operator":
//!   "in", "value": ["<image>"]}]}`, client c asking for image c % 10;
//! - two boefje ids of thirty: `{"filters": [{"column": "data", "field": "boefje__id",
//!   "operator": "in", "value": ["b4", "b5"]}]}`, client c asking for the pair c % 15;
//! - one organisation of fifty: `{"filters": [{"column": "organisation", "operator": "==",
//!   "value": "org7"}]}`, client c asking for org c % 50;
//! - the fleet: each client pops with its image filter, then `PATCH /tasks/{id}` `running`, then
//!   `completed`, while 1 client in 8 pushes a new boefje task for each completed one (as far as
//!   it keeps up);
//! - the SKIP LOCKED baseline's pop (8 connections).
//!
//! The depth is held: a measurement runs in bursts that stop after D/4 pops, and after each burst
//! the popped tasks are queued again (`PATCH queued`, so they keep their rank), tasks the fleet
//! completed are replaced by new ones of the same image, and popped baseline rows are inserted
//! again. Only each burst's steady part counts (from the 64th answer to the moment the budget ran
//! out), so many short bursts at a small depth measure the same as one long run at a large one.
//! Reported per body: pops/s, p50, p99, the ratio to the unfiltered pop and to the baseline in the
//! same run; at the end, pops/s at the largest depth ÷ pops/s at the smallest, per body. Checks:
//! no task popped twice within a burst, every popped task matches its filter, every acknowledged
//! push is stored, and at the end the table holds D waiting boefje tasks, none dispatched or
//! running, and one completed task per fleet cycle.
//!
//! `--pending`: two databases with Q queued boefje tasks (and Q/10 of each other kind). A broker
//! with `SCHEDULER_PQ_MAXSIZE` = M on the first (at its start, queued rows beyond M become
//! `pending`; the harness reports the table's counts), a broker with room on the second. The
//! same pop bodies on the full heap, then pushes (64 clients) into the full heap against pushes
//! into the broker with room, alternating, and the ratio. Last, the starvation check: K tasks of
//! an image no other task has (`ghcr.io/minvws/openkat/rare:latest`), ranked after everything
//! waiting, are pushed into the full heap, and one worker pops that image until it has them all
//! or gets nothing for 3 s: `rare_image_popped=<n>/<K>`.
//!
//! How long (this project's 2 shared CPUs, today's engine, where a filtered pop is an SQL
//! statement over the backlog and runs at a few hundred a second): `--workers --depths 10000
//! --seconds 1` about 40 s; each depth at the default 3 rounds of 5 s about 2–4 minutes plus its
//! seeding (1e6: about a minute to seed 1.2M tasks and 1M baseline rows); `--pending --seconds 1`
//! about 50 s, at 5 s about 3 minutes. Putting popped tasks back costs about as long again as
//! popping them, so a faster engine makes the runs longer, not shorter.

use std::collections::HashSet;
use std::io::{BufRead, BufReader as StdBufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Text};
use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

#[path = "broker/cluster.rs"]
mod cluster;
#[path = "broker/cron.rs"]
mod cron;
#[path = "broker/ingest.rs"]
mod ingest;
#[path = "broker/sqlite.rs"]
mod sqlite;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, Error>;

const SCHEDULERS: [&str; 3] = ["boefje", "normalizer", "report"];

// ------------------------------------------------------------------------------------ options

struct Options {
    tasks: usize,
    rounds: usize,
    seconds: f64,
    clients: usize,
    pg_clients: usize,
    pg: String,
    keep: bool,
    /// Only run broker pops for this many seconds (for profiling), then stop.
    profile_pops: Option<f64>,
    /// Run the original measurements (the default when no scenario is named).
    default_run: bool,
    /// Run the worker pops at each of `depths`.
    workers: bool,
    /// Queued boefje tasks for the worker pops, one broker and database per depth.
    depths: Vec<usize>,
    /// Run the pending scenario: a heap of `pending_maxsize` under `pending_queued` boefje tasks.
    pending: bool,
    pending_queued: usize,
    pending_maxsize: usize,
    /// Tasks of an image nothing else has, pushed into the full heap for the starvation check.
    rare: usize,
    /// Run the ingest scenario: the listener and ColdStart (see `broker/ingest.rs`).
    ingest: bool,
    /// Run the cron scenario: one tick over `due` schedules, one re-score (`broker/cron.rs`).
    cron: bool,
    /// Run the cluster scenario: one instance against three, takeovers (`broker/cluster.rs`).
    cluster: bool,
    /// SIGKILLs of the owner in the cluster scenario.
    kills: usize,
    /// Due boefje schedules for the tick.
    due: usize,
    /// Waiting tasks for the re-score.
    rescore_tasks: usize,
    /// Object events per listener round.
    messages: usize,
    /// Objects per ColdStart round.
    objects: usize,
    /// Organisations they are spread over.
    orgs: usize,
    /// Run the SQLite scenario: the broker on its embedded default (`broker/sqlite.rs`).
    sqlite: bool,
    /// Another build of the broker to measure side by side in the SQLite scenario.
    vs: Option<String>,
}

/// A count like `100000`, `100_000` or `1e5`.
fn count(v: &str) -> Result<usize> {
    let v = v.replace('_', "");
    if v.contains(['e', 'E']) {
        let f: f64 = v.parse()?;
        if !(f >= 0.0 && f.fract() == 0.0) {
            return Err(format!("{v} is not a whole count").into());
        }
        Ok(f as usize)
    } else {
        Ok(v.parse()?)
    }
}

fn options() -> Result<Options> {
    let mut o = Options {
        tasks: 1_000_000,
        rounds: 3,
        seconds: 5.0,
        clients: 64,
        pg_clients: 8,
        pg: std::env::var("KAT_TEST_PG_URL")
            .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/postgres".into()),
        keep: false,
        profile_pops: None,
        default_run: false,
        workers: false,
        depths: vec![10_000, 100_000, 1_000_000],
        pending: false,
        pending_queued: 100_000,
        pending_maxsize: 10_000,
        rare: 500,
        ingest: false,
        cron: false,
        cluster: false,
        kills: 10,
        due: 100_000,
        rescore_tasks: 1_000_000,
        messages: 20_000,
        objects: 100_000,
        orgs: 10,
        sqlite: false,
        vs: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--tasks" => o.tasks = count(&value()?)?,
            "--rounds" => o.rounds = value()?.parse()?,
            "--seconds" => o.seconds = value()?.parse()?,
            "--clients" => o.clients = value()?.parse()?,
            "--pg-clients" => o.pg_clients = value()?.parse()?,
            "--pg" => o.pg = value()?,
            "--keep" => o.keep = true,
            "--profile-pops" => o.profile_pops = Some(value()?.parse()?),
            "--default" => o.default_run = true,
            "--workers" => o.workers = true,
            "--depths" => {
                o.depths = value()?
                    .split(',')
                    .map(|d| count(d.trim()))
                    .collect::<Result<_>>()?;
            }
            "--pending" => o.pending = true,
            "--pending-queued" => o.pending_queued = count(&value()?)?,
            "--pending-maxsize" => o.pending_maxsize = count(&value()?)?,
            "--rare" => o.rare = count(&value()?)?,
            "--ingest" => o.ingest = true,
            "--cron" => o.cron = true,
            "--cluster" => o.cluster = true,
            "--kills" => o.kills = count(&value()?)?,
            "--due" => o.due = count(&value()?)?,
            "--rescore-tasks" => o.rescore_tasks = count(&value()?)?,
            "--messages" => o.messages = count(&value()?)?,
            "--objects" => o.objects = count(&value()?)?,
            "--orgs" => o.orgs = count(&value()?)?,
            "--sqlite" => o.sqlite = true,
            "--vs" => o.vs = Some(value()?),
            "--bench" => {} // cargo bench passes this
            other => {
                return Err(
                    format!("unknown option {other}; see the header of benches/broker.rs").into(),
                );
            }
        }
    }
    if o.rounds < 3 {
        return Err(
            "--rounds must be at least 3 (figures are medians of alternating rounds)".into(),
        );
    }
    if o.vs.is_some() && !o.sqlite {
        return Err("--vs is for the SQLite scenario (--sqlite)".into());
    }
    if !o.workers && !o.pending && !o.ingest && !o.cron && !o.sqlite && !o.cluster {
        o.default_run = true;
    }
    o.depths.sort_unstable();
    o.depths.dedup();
    if o.workers && (o.depths.is_empty() || o.depths.iter().any(|&d| d < 1_000)) {
        return Err("--depths needs depths of at least 1000 queued tasks".into());
    }
    if o.pending && o.pending_maxsize >= o.pending_queued {
        return Err(
            "--pending-maxsize must be below --pending-queued (the heap must be full)".into(),
        );
    }
    Ok(o)
}

// ------------------------------------------------------------------------------------ statistics

#[derive(Debug, Clone, Copy, Default)]
struct Figure {
    /// Operations done in the measurement.
    ops: usize,
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
}

fn percentile(sorted: &[u32], pct: usize) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    f64::from(sorted[(sorted.len() * pct / 100).min(sorted.len() - 1)])
}

fn figure(ops: usize, elapsed: Duration, mut latencies: Vec<u32>) -> Figure {
    latencies.sort_unstable();
    Figure {
        ops,
        ops_per_sec: ops as f64 / elapsed.as_secs_f64(),
        p50_us: percentile(&latencies, 50),
        p99_us: percentile(&latencies, 99),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

fn median_figure(figs: &[Figure]) -> Figure {
    Figure {
        ops: figs.iter().map(|f| f.ops).sum(),
        ops_per_sec: median(figs.iter().map(|f| f.ops_per_sec).collect()),
        p50_us: median(figs.iter().map(|f| f.p50_us).collect()),
        p99_us: median(figs.iter().map(|f| f.p99_us).collect()),
    }
}

// ------------------------------------------------------------------------------------ PostgreSQL

fn pg_exec(url: &str, sql: &str) -> Result<()> {
    let mut conn = PgConnection::establish(url)?;
    conn.batch_execute(sql)?;
    Ok(())
}

#[derive(QueryableByName)]
struct Num {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

fn pg_number(url: &str, sql: &str) -> Result<i64> {
    let mut conn = PgConnection::establish(url)?;
    let rows: Vec<Num> = diesel::sql_query(sql).load(&mut conn)?;
    Ok(rows.first().map(|r| r.n).unwrap_or(0))
}

/// Rows for the PostgreSQL-only ceiling: same shape and table as the broker's, under a scheduler
/// id the broker never loads, so measuring them leaves the broker's heaps alone.
const CEILING_SCHEDULER: &str = "bench-ceiling";

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

/// Gives every waiting task seeded straight into `tasks` its `task_queue` row (migration 11), as
/// the broker's own writes do.
fn fill_queue(url: &str) -> Result<()> {
    pg_exec(
        url,
        "INSERT INTO task_queue (task_id, scheduler_id, status, priority, created_at, modified_at,
           hash, schedule_id, organisation, plugin_id, oci_image, input_ooi, deduplication_key)
         SELECT id, scheduler_id, status, priority, created_at, modified_at, hash, schedule_id,
           organisation, plugin_id, oci_image, input_ooi, deduplication_key
         FROM tasks t WHERE status IN ('pending', 'queued')
           AND NOT EXISTS (SELECT 1 FROM task_queue q WHERE q.task_id = t.id)",
    )?;
    pg_exec(url, "VACUUM ANALYZE task_queue")
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

/// PostgreSQL alone inserting new tasks the way the broker does (the library's multi-row insert),
/// three connections, `batch` rows per statement, no HTTP: what durable pushes could reach if
/// the broker cost nothing.
fn ceiling_pushes(db: &str, conns: usize, batch: usize, seconds: f64) -> Result<f64> {
    use kat_scheduler::storage::rows::TaskRow;
    use kat_scheduler::storage::{self, DbTarget, tasks};
    let target = DbTarget::parse(db).map_err(|e| e.to_string())?;
    let pool = storage::connect(&target, conns as u32 + 1, Duration::from_secs(5))?;
    let start = Instant::now();
    let handles: Vec<_> = (0..conns)
        .map(|c| {
            let pool = pool.clone();
            std::thread::spawn(move || -> Result<usize> {
                let mut conn = storage::checkout(&pool)?;
                let mut done = 0usize;
                while start.elapsed().as_secs_f64() < seconds {
                    let now = chrono::Utc::now().naive_utc();
                    let rows: Vec<TaskRow> = (0..batch)
                        .map(|k| {
                            let id = uuid::Uuid::new_v4().to_string();
                            let name = format!("ceiling-{c}-{done}-{k}");
                            TaskRow {
                                data: format!(
                                    r#"{{"boefje":{{"id":"{name}","oci_image":"ghcr.io/minvws/openkat/bench:latest"}},"input_ooi":"Hostname|internet|{name}.example.com","organization":"bench-ceiling","id":"{id}"}}"#
                                ),
                                hash: Some(kat_scheduler::domain::hash::task_hash(&name)),
                                id,
                                scheduler_id: CEILING_SCHEDULER.into(),
                                schedule_id: None,
                                organisation: "bench-ceiling".into(),
                                task_type: "boefje".into(),
                                priority: 2 + (k as i64 % 1000),
                                status: kat_scheduler::domain::TaskStatus::Queued,
                                attempts: 0,
                                lease_expires_at: None,
                                failure_reason: None,
                                created_at: now,
                                modified_at: now,
                                plugin_id: Some(name.clone()),
                                oci_image: Some("ghcr.io/minvws/openkat/bench:latest".into()),
                                input_ooi: Some(format!("Hostname|internet|{name}.example.com")),
                                deduplication_key: None,
                            }
                        })
                        .collect();
                    tasks::insert(&mut conn, &rows)?;
                    done += batch;
                }
                Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h.join().map_err(|_| "ceiling thread panicked")??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// The columns the engine may keep beside `data` (the plugin, the image and the input OOI of a
/// task) that the table has. Seeding fills those that exist, so the harness runs on schemas
/// with and without them. Call it after the broker has migrated the database.
fn extra_columns(url: &str) -> Result<Vec<&'static str>> {
    #[derive(QueryableByName)]
    struct Col {
        #[diesel(sql_type = Text)]
        column_name: String,
    }
    let mut conn = PgConnection::establish(url)?;
    let have: Vec<String> = diesel::sql_query(
        "SELECT column_name::text AS column_name FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name = 'tasks'",
    )
    .load::<Col>(&mut conn)?
    .into_iter()
    .map(|c| c.column_name)
    .collect();
    Ok(["plugin_id", "oci_image", "input_ooi"]
        .into_iter()
        .filter(|c| have.iter().any(|h| h == c))
        .collect())
}

/// The column list and the value list that fill `cols` for a row of `t` (with `t.s` the
/// scheduler, and for boefje tasks `t.boefje`, `t.image` and `t.ooi`).
fn extra_sql(cols: &[&str]) -> (String, String) {
    let mut names = String::new();
    let mut values = String::new();
    for c in cols {
        names.push_str(", ");
        names.push_str(c);
        values.push_str(match *c {
            "plugin_id" => {
                ", CASE t.s WHEN 'boefje' THEN t.boefje WHEN 'normalizer' THEN 'kat_bench_normalize' \
                 ELSE 'recipe-' || t.g END"
            }
            "oci_image" => ", CASE t.s WHEN 'boefje' THEN t.image END",
            _ => ", CASE t.s WHEN 'boefje' THEN t.ooi END",
        });
    }
    (names, values)
}

/// Boefje images, boefje ids and organisations of the seeded tasks: boefje `b{k}` runs image
/// `img{k % 10}`.
const IMAGES: usize = 10;
const BOEFJES: usize = 30;
const ORGS: usize = 50;

fn image_name(i: usize) -> String {
    format!("ghcr.io/minvws/openkat/img{i}:latest")
}

/// The schedulers of consecutive seeded rows, repeated: the original run's even split, and the
/// worker runs' ten boefje tasks to one normalizer and one report task.
const EVEN_SPLIT: [&str; 3] = ["boefje", "normalizer", "report"];
const BOEFJE_HEAVY: [&str; 12] = [
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "normalizer",
    "report",
];

/// Queues `n` tasks straight in the table (pushing a million over HTTP would take longer than
/// the benchmark), the schedulers cycling as `cycle` (boefje entries first), with payloads
/// shaped like real ones: boefje tasks spread evenly over 30 boefje ids on 10 images and 50
/// organisations, each with its own input OOI, random priorities. Fills the extra columns
/// `cols` that the table has (see [`extra_columns`]).
fn seed_tasks(url: &str, n: usize, cycle: &[&str], cols: &[&str]) -> Result<()> {
    let l = cycle.len();
    let b = cycle.iter().filter(|s| **s == "boefje").count();
    let array = cycle
        .iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(",");
    let (extra_names, extra_values) = extra_sql(cols);
    pg_exec(
        url,
        &format!(
            "INSERT INTO tasks (id, scheduler_id, schedule_id, organisation, type, hash, priority, data, \
               status, attempts, created_at, modified_at{extra_names})
             SELECT t.id, t.s, NULL, t.org, t.s, md5(t.id), t.priority,
               CASE t.s
                 WHEN 'boefje' THEN json_build_object('boefje', json_build_object('id', t.boefje,
                     'oci_image', t.image), 'input_ooi', t.ooi, 'organization', t.org, 'id', t.id)::text
                 WHEN 'normalizer' THEN json_build_object('normalizer', json_build_object('id', 'kat_bench_normalize'),
                     'raw_data', json_build_object('id', t.id, 'boefje_meta', json_build_object('id', t.id,
                     'organization', t.org)), 'id', t.id)::text
                 ELSE json_build_object('report_recipe_id', 'recipe-' || t.g, 'organisation_id',
                     t.org, 'id', t.id)::text
               END,
               'queued', 0, t.created, t.created{extra_values}
             FROM (SELECT u.*, 'b' || (u.k % {BOEFJES}) AS boefje,
                          'ghcr.io/minvws/openkat/img' || (u.k % {BOEFJES} % {IMAGES}) || ':latest' AS image,
                          'org' || ((u.k / {BOEFJES}) % {ORGS}) AS org,
                          'Hostname|internet|host' || u.g || '.example.com' AS ooi
                   FROM (SELECT g, gen_random_uuid()::text AS id, (ARRAY[{array}])[g % {l} + 1] AS s,
                                (g / {l}) * {b} + g % {l} AS k, 2 + floor(random() * 1000)::bigint AS priority,
                                (now() AT TIME ZONE 'utc') - make_interval(secs => ({n} - g) / 1000000.0) AS created
                         FROM generate_series(1, {n}) g) u) t"
        ),
    )?;
    pg_exec(url, "VACUUM ANALYZE tasks")?;
    fill_queue(url)
}

/// Counts of the table's tasks by scheduler and status.
fn count_tasks(url: &str, scheduler: &str, statuses: &str) -> Result<i64> {
    pg_number(
        url,
        &format!(
            "SELECT COUNT(*) AS n FROM tasks WHERE scheduler_id = '{scheduler}' AND status IN ({statuses})"
        ),
    )
}

/// How many of `ids` the table has.
fn count_stored(url: &str, ids: &[String]) -> Result<usize> {
    count_ids(url, ids, "TRUE")
}

fn seed_baseline(url: &str, n: usize) -> Result<()> {
    pg_exec(
        url,
        &format!(
            "CREATE TABLE bench_q (id bigserial PRIMARY KEY, prio int NOT NULL, queue text NOT NULL,
                                   payload text, created timestamptz DEFAULT now());
             CREATE INDEX bench_q_pick ON bench_q (queue, prio, id);
             INSERT INTO bench_q (prio, queue, payload)
               SELECT (random() * 1000)::int, 'w' || (1 + g % 3), 'boefje-task-payload-0123456789abcdef'
               FROM generate_series(1, {n}) g;
             CREATE TABLE bench_ins (id bigserial PRIMARY KEY, prio int, payload text);"
        ),
    )?;
    pg_exec(url, "VACUUM ANALYZE bench_q")
}

/// A row the baseline pop returns (read so the transfer is paid, as a worker would).
#[derive(QueryableByName)]
struct Popped {
    #[diesel(sql_type = BigInt)]
    #[allow(dead_code)]
    id: i64,
}

/// The baseline at full speed (`rate` = None) or paced at `rate` ops/s over all connections.
fn baseline(
    url: &str,
    conns: usize,
    seconds: f64,
    rate: Option<f64>,
    op: &'static str,
) -> Result<Figure> {
    let r = baseline_run(url, conns, seconds, rate, op, None)?;
    let ops = r.samples.len();
    Ok(figure(ops, r.elapsed, r.latencies))
}

/// (issued, done) of each operation, in µs from the start of its run.
type Samples = Vec<(u32, u32)>;

/// What one load run saw: each operation's issue and completion time (µs from the start), the
/// latencies, and when the pop budget ran out.
#[derive(Default)]
struct LoadRun {
    samples: Vec<(u32, u32)>,
    latencies: Vec<u32>,
    exhausted_us: Option<u32>,
    elapsed: Duration,
}

fn micros_since(start: Instant) -> u32 {
    u32::try_from(start.elapsed().as_micros()).unwrap_or(u32::MAX)
}

/// The baseline, stopping early once `budget` operations were started (if given).
fn baseline_run(
    url: &str,
    conns: usize,
    seconds: f64,
    rate: Option<f64>,
    op: &'static str,
    budget: Option<usize>,
) -> Result<LoadRun> {
    let deadline = Duration::from_secs_f64(seconds);
    let tickets = Arc::new(AtomicI64::new(
        budget.map_or(i64::MAX, |b| i64::try_from(b).unwrap_or(i64::MAX)),
    ));
    let exhausted = Arc::new(AtomicU32::new(u32::MAX));
    let start = Instant::now();
    let handles: Vec<_> = (0..conns)
        .map(|c| {
            let url = url.to_owned();
            let (tickets, exhausted) = (tickets.clone(), exhausted.clone());
            std::thread::spawn(move || -> Result<(Samples, Vec<u32>)> {
                let mut conn = PgConnection::establish(&url)?;
                let mut lat = Vec::new();
                let mut samples = Vec::new();
                let mut ops = 0usize;
                let interval = rate.map(|r| Duration::from_secs_f64(conns as f64 / r));
                let mut k = 0u32;
                loop {
                    let scheduled = match interval {
                        Some(i) => {
                            let at = start + i.mul_f64(f64::from(k) + c as f64 / conns as f64);
                            k += 1;
                            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                                std::thread::sleep(wait);
                            }
                            at
                        }
                        None => Instant::now(),
                    };
                    if start.elapsed() >= deadline {
                        break;
                    }
                    if tickets.fetch_sub(1, Ordering::Relaxed) <= 0 {
                        exhausted.fetch_min(micros_since(start), Ordering::Relaxed);
                        break;
                    }
                    let issued = micros_since(start);
                    let w = 1 + (c + ops) % 3;
                    let done = if op == "pop" {
                        let rows: Vec<Popped> = diesel::sql_query(format!(
                            "DELETE FROM bench_q WHERE id = (SELECT id FROM bench_q WHERE queue = 'w{w}' \
                             ORDER BY prio, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id"
                        ))
                        .load(&mut conn)?;
                        rows.len()
                    } else {
                        diesel::sql_query(format!(
                            "INSERT INTO bench_ins (prio, payload) VALUES ({}, 'boefje-task-payload-0123456789abcdef')",
                            ops % 1000
                        ))
                        .execute(&mut conn)?
                    };
                    if done == 0 {
                        return Err("the baseline queue ran dry; use more --tasks".into());
                    }
                    ops += 1;
                    samples.push((issued, micros_since(start)));
                    lat.push(u32::try_from(scheduled.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
                Ok((samples, lat))
            })
        })
        .collect();
    let mut run = LoadRun::default();
    for h in handles {
        let (s, l) = h.join().map_err(|_| "baseline thread panicked")??;
        run.samples.extend(s);
        run.latencies.extend(l);
    }
    run.elapsed = start.elapsed();
    let e = exhausted.load(Ordering::Relaxed);
    run.exhausted_us = (e != u32::MAX).then_some(e);
    Ok(run)
}

/// Puts `n` rows back into the baseline queue, spread over its three queues like the seed.
fn refill_baseline(url: &str, n: usize) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    pg_exec(
        url,
        &format!(
            "INSERT INTO bench_q (prio, queue, payload)
               SELECT (random() * 1000)::int, 'w' || (1 + g % 3), 'boefje-task-payload-0123456789abcdef'
               FROM generate_series(1, {n}) g"
        ),
    )
}

// ------------------------------------------------------------------------------------ the broker

struct Broker {
    child: Child,
    port: u16,
    rebuild_ms: f64,
    ready_after: Duration,
}

fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or("no VmRSS")?;
    Ok(kb * 1024)
}

/// Starts the release binary on `db` and waits until it listens; reads its JSON log for the port
/// and the heap rebuild time.
fn start_broker(db: &str, maxsize: usize) -> Result<Broker> {
    start_broker_bin(env!("CARGO_BIN_EXE_kat-scheduler"), db, maxsize)
}

/// [`start_broker`] with another build of the broker (`--vs`).
fn start_broker_bin(bin: &str, db: &str, maxsize: usize) -> Result<Broker> {
    let started = Instant::now();
    let mut child = Command::new(bin)
        .env("SCHEDULER_DB_URI", db)
        .env("SCHEDULER_API_HOST", "127.0.0.1")
        .env("SCHEDULER_API_PORT", "0")
        .env("SCHEDULER_LOGGING_FORMAT", "json")
        .env("SCHEDULER_LOG_LEVEL", "info")
        .env("SCHEDULER_PQ_MAXSIZE", maxsize.to_string())
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in StdBufReader::new(stderr)
            .lines()
            .map_while(std::result::Result::ok)
        {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let msg = v["message"].as_str().unwrap_or_default();
            if msg.starts_with("heaps rebuilt") {
                let _ = tx.send((
                    "rebuild",
                    v["duration_ms"].as_f64().unwrap_or(f64::NAN).to_string(),
                ));
            } else if msg == "listening" {
                let _ = tx.send((
                    "listening",
                    v["address"].as_str().unwrap_or_default().to_owned(),
                ));
            } else if v["level"] == "ERROR" || v["level"] == "WARN" {
                eprintln!("broker: {line}");
            }
        }
    });
    let mut rebuild_ms = f64::NAN;
    loop {
        let (kind, value) = rx
            .recv_timeout(Duration::from_secs(600))
            .map_err(|_| "the broker did not start (see its log above)")?;
        match kind {
            "rebuild" => rebuild_ms = value.parse().unwrap_or(f64::NAN),
            _ => {
                let port = value.rsplit(':').next().ok_or("no port")?.parse()?;
                return Ok(Broker {
                    child,
                    port,
                    rebuild_ms,
                    ready_after: started.elapsed(),
                });
            }
        }
    }
}

fn stop_broker(mut b: Broker) -> Result<()> {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(b.child.id().to_string())
        .status();
    let status = b.child.wait()?;
    if !status.success() {
        return Err(format!("the broker exited with {status}").into());
    }
    Ok(())
}

// ------------------------------------------------------------------------------------ HTTP client

/// A minimal HTTP/1.1 keep-alive client: the load generator shares two cores with the broker and
/// PostgreSQL, so it must cost as little as possible per request.
struct Http {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    line: Vec<u8>,
}

impl Http {
    async fn connect(port: u16) -> Result<Http> {
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        let (r, w) = stream.into_split();
        Ok(Http {
            reader: BufReader::with_capacity(16 * 1024, r),
            writer: w,
            line: Vec::with_capacity(256),
        })
    }

    async fn call(&mut self, request: &[u8], body: &mut Vec<u8>) -> Result<u16> {
        self.writer.write_all(request).await?;
        self.line.clear();
        self.reader.read_until(b'\n', &mut self.line).await?;
        let status: u16 =
            std::str::from_utf8(self.line.get(9..12).ok_or("short status line")?)?.parse()?;
        let mut len = 0usize;
        loop {
            self.line.clear();
            self.reader.read_until(b'\n', &mut self.line).await?;
            if self.line == b"\r\n" || self.line.is_empty() {
                break;
            }
            if self.line.len() > 15 && self.line[..15].eq_ignore_ascii_case(b"content-length:") {
                len = std::str::from_utf8(&self.line[15..])?.trim().parse()?;
            }
        }
        body.resize(len, 0);
        self.reader.read_exact(body).await?;
        Ok(status)
    }
}

fn pop_request(scheduler: &str) -> Vec<u8> {
    format!("POST /schedulers/{scheduler}/pop?limit=1 HTTP/1.1\r\nHost: bench\r\nContent-Length: 0\r\n\r\n").into_bytes()
}

fn push_request(scheduler: &str, client: usize, seq: usize, round: usize) -> Vec<u8> {
    let name = format!("push-{round}-{client}-{seq}");
    let data = match scheduler {
        "boefje" => format!(
            r#"{{"boefje":{{"id":"{name}","oci_image":"ghcr.io/minvws/openkat/bench:latest"}},"input_ooi":"Hostname|internet|{name}.example.com","organization":"bench-push"}}"#
        ),
        "normalizer" => format!(
            r#"{{"normalizer":{{"id":"{name}"}},"raw_data":{{"id":"{id}","boefje_meta":{{"id":"{id}","organization":"bench-push"}}}}}}"#,
            id = uuid_like(round, client, seq)
        ),
        _ => format!(r#"{{"report_recipe_id":"{name}","organisation_id":"bench-push"}}"#),
    };
    let body = format!(
        r#"{{"organisation":"bench-push","priority":{},"data":{data}}}"#,
        2 + seq % 1000
    );
    format!(
        "POST /schedulers/{scheduler}/push HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn uuid_like(round: usize, client: usize, seq: usize) -> String {
    format!("{round:08x}-{client:04x}-4000-8000-{seq:012x}")
}

const NOOP_REQUEST: &[u8] = b"GET /livez HTTP/1.1\r\nHost: bench\r\n\r\n";

/// The engine's counters from `/metrics`: (batches, commands, apply µs, batch µs).
async fn engine_counters(port: u16) -> Result<[f64; 4]> {
    let mut http = Http::connect(port).await?;
    let mut body = Vec::new();
    http.call(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n", &mut body)
        .await?;
    let text = String::from_utf8(body)?;
    let get = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .unwrap_or(f64::NAN)
    };
    Ok([
        get("scheduler_engine_batches_total "),
        get("scheduler_engine_commands_total "),
        // Served in seconds; the figures here are in microseconds.
        get("scheduler_engine_apply_seconds_total ") * 1e6,
        get("scheduler_engine_batch_seconds_total ") * 1e6,
    ])
}

/// Commands per batch, apply µs per batch and batch µs (BEGIN to COMMIT) between two readings.
fn engine_delta(before: [f64; 4], after: [f64; 4]) -> [f64; 3] {
    let batches = after[0] - before[0];
    [
        (after[1] - before[1]) / batches,
        (after[2] - before[2]) / batches,
        (after[3] - before[3]) / batches,
    ]
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Pop,
    Push,
    Noop,
}

#[derive(Default)]
struct ClientResult {
    ops: usize,
    latencies: Vec<u32>,
    ids: Vec<String>,
    empty: usize,
}

/// The id of a popped task: the first `"id":"…"` of the first result.
fn popped_id(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let at = text.find("[{\"id\":\"")? + 8;
    text.get(at..at + 36).map(str::to_owned)
}

/// Runs `clients` connections for `seconds`, closed-loop (`rate` None) or paced.
async fn http_load(
    port: u16,
    clients: usize,
    seconds: f64,
    rate: Option<f64>,
    op: Op,
    round: usize,
) -> Result<(Figure, ClientResult)> {
    let start = Instant::now();
    let deadline = Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut http = Http::connect(port).await?;
        tasks.push(tokio::spawn(async move {
            let scheduler = SCHEDULERS[c % 3];
            let pop = pop_request(scheduler);
            let mut r = ClientResult::default();
            let mut body = Vec::with_capacity(1024);
            let interval = rate.map(|x| Duration::from_secs_f64(clients as f64 / x));
            let mut k = 0u32;
            loop {
                let scheduled = match interval {
                    Some(i) => {
                        let at = start + i.mul_f64(f64::from(k) + c as f64 / clients as f64);
                        k += 1;
                        tokio::time::sleep_until(at.into()).await;
                        at
                    }
                    None => Instant::now(),
                };
                if start.elapsed() >= deadline {
                    break;
                }
                let status = match op {
                    Op::Pop => http.call(&pop, &mut body).await?,
                    Op::Noop => http.call(NOOP_REQUEST, &mut body).await?,
                    Op::Push => {
                        http.call(
                            &push_request(scheduler, c, r.ops + r.empty, round),
                            &mut body,
                        )
                        .await?
                    }
                };
                let lat = u32::try_from(scheduled.elapsed().as_micros()).unwrap_or(u32::MAX);
                match (op, status) {
                    (Op::Pop, 200) => match popped_id(&body) {
                        Some(id) => {
                            r.ids.push(id);
                            r.ops += 1;
                            r.latencies.push(lat);
                        }
                        None => r.empty += 1,
                    },
                    (Op::Push, 201) => {
                        if let Some(id) = std::str::from_utf8(&body).ok().and_then(|t| t.get(7..43))
                        {
                            r.ids.push(id.to_owned());
                        }
                        r.ops += 1;
                        r.latencies.push(lat);
                    }
                    (Op::Noop, 200) => {
                        r.ops += 1;
                        r.latencies.push(lat);
                    }
                    (_, s) => {
                        return Err::<ClientResult, Error>(
                            format!("unexpected HTTP {s}: {}", String::from_utf8_lossy(&body))
                                .into(),
                        );
                    }
                }
            }
            Ok(r)
        }));
    }
    let mut all = ClientResult::default();
    for t in tasks {
        let r = t.await??;
        all.ops += r.ops;
        all.empty += r.empty;
        all.latencies.extend(r.latencies);
        all.ids.extend(r.ids);
    }
    let elapsed = start.elapsed();
    if all.empty > 0 {
        eprintln!(
            "warning: {} pops found their queue empty; use more --tasks",
            all.empty
        );
    }
    let lat = std::mem::take(&mut all.latencies);
    Ok((figure(all.ops, elapsed, lat), all))
}

// ------------------------------------------------------------------------------------ worker pops

/// The pops the boefje runner sends (`POST /schedulers/boefje/pop?limit=1`, a filter body only
/// when it has filters), and the fleet mix.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Body {
    Unfiltered,
    Image,
    BoefjeIds,
    Organisation,
    Fleet,
}

impl Body {
    const ALL: [Body; 5] = [
        Body::Unfiltered,
        Body::Image,
        Body::BoefjeIds,
        Body::Organisation,
        Body::Fleet,
    ];

    fn index(self) -> usize {
        self as usize
    }

    fn key(self) -> &'static str {
        match self {
            Body::Unfiltered => "unfiltered",
            Body::Image => "image",
            Body::BoefjeIds => "boefje_ids",
            Body::Organisation => "organisation",
            Body::Fleet => "fleet",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Body::Unfiltered => "unfiltered pop (no body)",
            Body::Image => "one image of ten",
            Body::BoefjeIds => "two boefje ids of thirty",
            Body::Organisation => "one organisation of fifty",
            Body::Fleet => "fleet: pop, running, completed",
        }
    }

    /// The roles of `clients` clients for this body: client `c` asks for image `c % 10`,
    /// boefje ids `b{2j}` and `b{2j+1}` with `j = c % 15`, or organisation `org{c % 50}`, so
    /// the pops spread over the values as a fleet's would. In the fleet, one client in eight
    /// pushes new boefje tasks, one for each task the others complete.
    fn roles(self, clients: usize) -> Vec<Role> {
        (0..clients)
            .map(|c| match self {
                Body::Unfiltered => Role::pop(None, Want::Any),
                Body::Image => Role::pop(
                    Some(image_filter(&image_name(c % IMAGES))),
                    Want::Image(image_name(c % IMAGES)),
                ),
                Body::BoefjeIds => {
                    let j = c % (BOEFJES / 2);
                    let (a, b) = (format!("b{}", 2 * j), format!("b{}", 2 * j + 1));
                    Role::pop(
                        Some(format!(
                            r#"{{"filters": [{{"column": "data", "field": "boefje__id", "operator": "in", "value": ["{a}", "{b}"]}}]}}"#
                        )),
                        Want::BoefjeIds(a, b),
                    )
                }
                Body::Organisation => Role::pop(
                    Some(format!(
                        r#"{{"filters": [{{"column": "organisation", "operator": "==", "value": "org{}"}}]}}"#,
                        c % ORGS
                    )),
                    Want::Organisation(format!("org{}", c % ORGS)),
                ),
                Body::Fleet if c % 8 == 7 => Role::Push { per_completion: true },
                Body::Fleet => Role::Fleet {
                    request: pop_request_with("boefje", Some(&image_filter(&image_name(c % IMAGES)))),
                    want: Want::Image(image_name(c % IMAGES)),
                    image: c % IMAGES,
                },
            })
            .collect()
    }
}

/// The runner's image filter (`BOEFJES_IMAGES`).
fn image_filter(image: &str) -> String {
    format!(
        r#"{{"filters": [{{"column": "data", "field": "boefje__oci_image", "operator": "in", "value": ["{image}"]}}]}}"#
    )
}

/// What a popped task must match.
#[derive(Clone, Debug)]
enum Want {
    Any,
    Image(String),
    BoefjeIds(String, String),
    Organisation(String),
}

impl Want {
    fn check(&self, task: &serde_json::Value) -> bool {
        let data = &task["data"];
        let s = |v: &serde_json::Value| v.as_str().map(str::to_owned);
        task["scheduler_id"] == "boefje"
            && match self {
                Want::Any => true,
                Want::Image(i) => s(&data["boefje"]["oci_image"]).as_deref() == Some(i),
                Want::BoefjeIds(a, b) => {
                    let id = s(&data["boefje"]["id"]);
                    id.as_deref() == Some(a) || id.as_deref() == Some(b)
                }
                Want::Organisation(o) => s(&task["organisation"]).as_deref() == Some(o),
            }
    }
}

#[derive(Clone)]
enum Role {
    /// Pops with one body, closed loop.
    Pop { request: Vec<u8>, want: Want },
    /// Pops, then `PATCH running`, then `PATCH completed`, as a boefje worker does.
    Fleet {
        request: Vec<u8>,
        want: Want,
        image: usize,
    },
    /// Pushes new boefje tasks: one for each task the fleet completes (`per_completion`), or
    /// closed loop.
    Push { per_completion: bool },
}

impl Role {
    fn pop(body: Option<String>, want: Want) -> Role {
        Role::Pop {
            request: pop_request_with("boefje", body.as_deref()),
            want,
        }
    }
}

fn pop_request_with(scheduler: &str, body: Option<&str>) -> Vec<u8> {
    match body {
        None => pop_request(scheduler),
        Some(b) => format!(
            "POST /schedulers/{scheduler}/pop?limit=1 HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )
        .into_bytes(),
    }
}

fn patch_request(id: &str, status: &str) -> Vec<u8> {
    let body = format!(r#"{{"status":"{status}"}}"#);
    format!(
        "PATCH /tasks/{id} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Numbers the harness's pushes, so each has its own input OOI (and hash).
static PUSH_SEQ: AtomicUsize = AtomicUsize::new(0);

fn spread_priority(k: usize) -> usize {
    2 + (k.wrapping_mul(2_654_435_761) >> 7) % 1000
}

fn boefje_push(boefje: &str, image: &str, org: &str, priority: usize) -> Vec<u8> {
    let n = PUSH_SEQ.fetch_add(1, Ordering::Relaxed);
    let data = format!(
        r#"{{"boefje":{{"id":"{boefje}","oci_image":"{image}"}},"input_ooi":"Hostname|internet|push{n}.example.com","organization":"{org}"}}"#
    );
    let body = format!(r#"{{"organisation":"{org}","priority":{priority},"data":{data}}}"#);
    format!(
        "POST /schedulers/boefje/push HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A new boefje task spread like the seeded ones (boefje, image, organisation, priority).
fn spread_push() -> Vec<u8> {
    let k = PUSH_SEQ.load(Ordering::Relaxed);
    let b = k % BOEFJES;
    boefje_push(
        &format!("b{b}"),
        &image_name(b % IMAGES),
        &format!("org{}", (k / BOEFJES) % ORGS),
        spread_priority(k),
    )
}

/// A new boefje task of image `image`, to replace a completed one of that image.
fn replacement_push(image: usize, k: usize) -> Vec<u8> {
    boefje_push(
        &format!("b{}", image + IMAGES * (k % (BOEFJES / IMAGES))),
        &image_name(image),
        &format!("org{}", (k / 3) % ORGS),
        spread_priority(k),
    )
}

/// The id of a task answer (`{"id":"…`).
fn task_id(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let at = text.find("\"id\":\"")? + 6;
    text.get(at..at + 36).map(str::to_owned)
}

/// One task a burst popped.
struct WorkerPop {
    id: String,
    /// The answer, checked against `want` after the burst (not while timing).
    body: Vec<u8>,
    want: Want,
    /// Completed by the fleet (else put back after the burst).
    completed: bool,
    image: usize,
}

/// What one burst did; times in µs from its start.
#[derive(Default)]
struct Burst {
    pops: Vec<WorkerPop>,
    pop_samples: Vec<(u32, u32)>,
    pushes: Vec<String>,
    push_samples: Vec<(u32, u32)>,
    empty: usize,
    exhausted_us: Option<u32>,
    elapsed: Duration,
    /// The first `clients` completions: after them every client is in its steady loop.
    clients: usize,
}

/// The steady part of a run: from the `clients`-th completion to the moment the budget ran out
/// (or the end). Only operations issued and done inside it count, so neither the first wave of
/// requests nor the tail after the budget ran out (when fewer clients are busy) bends the figures;
/// short bursts at small depths measure the same thing as one long run at a large depth.
/// The run ended at `limit` (its time was up) unless the budget ran out first.
fn steady(
    samples: &[&[(u32, u32)]],
    clients: usize,
    exhausted: Option<u32>,
    limit: Duration,
    elapsed: Duration,
) -> (u32, u32) {
    let mut done: Vec<u32> = samples.iter().flat_map(|s| s.iter().map(|x| x.1)).collect();
    done.sort_unstable();
    let us = |d: Duration| u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
    let end = exhausted
        .unwrap_or(u32::MAX)
        .min(us(limit))
        .min(us(elapsed));
    let t0 = if done.len() > 4 * clients {
        done[clients - 1]
    } else {
        0
    };
    if t0 >= end { (0, end) } else { (t0, end) }
}

/// Runs `roles` (one connection each) until `budget` pops were started or `seconds` passed.
async fn burst(port: u16, roles: &[Role], budget: usize, seconds: f64) -> Result<Burst> {
    let tickets = Arc::new(AtomicI64::new(i64::try_from(budget).unwrap_or(i64::MAX)));
    let exhausted = Arc::new(AtomicU32::new(u32::MAX));
    let stop = Arc::new(AtomicBool::new(false));
    let credits = Arc::new(tokio::sync::Semaphore::new(0));
    let mut conns = Vec::with_capacity(roles.len());
    for _ in roles {
        conns.push(Http::connect(port).await?);
    }
    let deadline = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (role, mut http) in roles.iter().cloned().zip(conns) {
        let (tickets, exhausted, stop, credits) = (
            tickets.clone(),
            exhausted.clone(),
            stop.clone(),
            credits.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut b = Burst::default();
            let mut body = Vec::with_capacity(1024);
            let unexpected = |what: &str, s: u16, body: &[u8]| -> Error {
                format!(
                    "{what}: unexpected HTTP {s}: {}",
                    String::from_utf8_lossy(body)
                )
                .into()
            };
            loop {
                if start.elapsed() >= deadline || stop.load(Ordering::Relaxed) {
                    break;
                }
                match &role {
                    Role::Push { per_completion } => {
                        if *per_completion {
                            let left = deadline.saturating_sub(start.elapsed());
                            match tokio::time::timeout(left, credits.acquire()).await {
                                Ok(Ok(permit)) => permit.forget(),
                                _ => break,
                            }
                        }
                        let request = spread_push();
                        let issued = micros_since(start);
                        let s = http.call(&request, &mut body).await?;
                        if s != 201 {
                            return Err(unexpected("push", s, &body));
                        }
                        b.push_samples.push((issued, micros_since(start)));
                        b.pushes
                            .push(task_id(&body).ok_or("a push answer without an id")?);
                    }
                    Role::Pop { request, want } | Role::Fleet { request, want, .. } => {
                        if tickets.fetch_sub(1, Ordering::Relaxed) <= 0 {
                            exhausted.fetch_min(micros_since(start), Ordering::Relaxed);
                            stop.store(true, Ordering::Relaxed);
                            credits.close();
                            break;
                        }
                        let issued = micros_since(start);
                        let s = http.call(request, &mut body).await?;
                        if s != 200 {
                            return Err(unexpected("pop", s, &body));
                        }
                        let Some(id) = popped_id(&body) else {
                            b.empty += 1;
                            continue;
                        };
                        b.pop_samples.push((issued, micros_since(start)));
                        let fleet = matches!(role, Role::Fleet { .. });
                        if fleet {
                            let mut answer = Vec::new();
                            for status in ["running", "completed"] {
                                let s = http.call(&patch_request(&id, status), &mut answer).await?;
                                if s != 200 {
                                    return Err(unexpected("PATCH", s, &answer));
                                }
                            }
                            credits.add_permits(1);
                        }
                        b.pops.push(WorkerPop {
                            id,
                            body: body.clone(),
                            want: want.clone(),
                            completed: fleet,
                            image: if let Role::Fleet { image, .. } = role {
                                image
                            } else {
                                0
                            },
                        });
                    }
                }
            }
            Ok::<Burst, Error>(b)
        }));
    }
    let mut all = Burst {
        clients: roles.len(),
        ..Burst::default()
    };
    for t in tasks {
        let b = t.await??;
        all.pops.extend(b.pops);
        all.pop_samples.extend(b.pop_samples);
        all.pushes.extend(b.pushes);
        all.push_samples.extend(b.push_samples);
        all.empty += b.empty;
    }
    all.elapsed = start.elapsed();
    let e = exhausted.load(Ordering::Relaxed);
    all.exhausted_us = (e != u32::MAX).then_some(e);
    Ok(all)
}

/// Sends `requests` over up to `clients` connections; every answer must have status `expect`.
/// Returns the task ids of the answers.
async fn send_all(
    port: u16,
    clients: usize,
    requests: Vec<Vec<u8>>,
    expect: u16,
) -> Result<Vec<String>> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let requests = Arc::new(requests);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients.clamp(1, requests.len()) {
        let mut http = Http::connect(port).await?;
        let (requests, next) = (requests.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            let mut body = Vec::new();
            while let Some(request) = requests.get(next.fetch_add(1, Ordering::Relaxed)) {
                let s = http.call(request, &mut body).await?;
                if s != expect {
                    return Err::<Vec<String>, Error>(
                        format!(
                            "unexpected HTTP {s} (wanted {expect}): {}",
                            String::from_utf8_lossy(&body)
                        )
                        .into(),
                    );
                }
                ids.extend(task_id(&body));
            }
            Ok(ids)
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await??);
    }
    Ok(ids)
}

/// Checks a burst (no task popped twice, each popped task matches its filter) and puts the queue
/// back as it was: popped tasks are queued again (`PATCH queued`, so they keep their rank), and
/// tasks the fleet completed are replaced by new tasks of the same image (or, if the fleet's
/// pushers got ahead, their surplus is cancelled). Returns the acknowledged pushes.
async fn check_and_restore(port: u16, clients: usize, b: &Burst) -> Result<Vec<String>> {
    let mut seen = HashSet::with_capacity(b.pops.len());
    for p in &b.pops {
        if !seen.insert(p.id.as_str()) {
            return Err(format!("task {} was popped twice", p.id).into());
        }
        let v: serde_json::Value = serde_json::from_slice(&p.body)?;
        let task = &v["results"][0];
        if task["id"].as_str() != Some(p.id.as_str()) || !p.want.check(task) {
            return Err(format!(
                "a pop for {:?} returned a task that does not match: {task}",
                p.want
            )
            .into());
        }
    }
    let requeue: Vec<Vec<u8>> = b
        .pops
        .iter()
        .filter(|p| !p.completed)
        .map(|p| patch_request(&p.id, "queued"))
        .collect();
    send_all(port, clients, requeue, 200).await?;
    let completed: Vec<usize> = b
        .pops
        .iter()
        .filter(|p| p.completed)
        .map(|p| p.image)
        .collect();
    let mut acked = b.pushes.clone();
    if completed.len() > b.pushes.len() {
        let replace: Vec<Vec<u8>> = completed[b.pushes.len()..]
            .iter()
            .enumerate()
            .map(|(k, &image)| replacement_push(image, k))
            .collect();
        acked.extend(send_all(port, clients, replace, 201).await?);
    } else if b.pushes.len() > completed.len() {
        let cancel: Vec<Vec<u8>> = b.pushes[completed.len()..]
            .iter()
            .map(|id| patch_request(id, "cancelled"))
            .collect();
        send_all(port, clients, cancel, 200).await?;
    }
    Ok(acked)
}

/// One measurement of a pop body at a held depth: bursts of at most `budget` pops until
/// `seconds` of load have run, the queue restored after each.
#[derive(Default, Clone, Copy)]
struct BodyFigure {
    pops: Figure,
    pushes: Figure,
    bursts: usize,
    popped: usize,
    completed: usize,
    empty: usize,
}

struct Tally {
    window_us: u64,
    pops: usize,
    pushes: usize,
    pop_lat: Vec<u32>,
    push_lat: Vec<u32>,
}

impl Tally {
    fn new() -> Self {
        Tally {
            window_us: 0,
            pops: 0,
            pushes: 0,
            pop_lat: Vec::new(),
            push_lat: Vec::new(),
        }
    }

    /// Adds the steady part of one run.
    fn add(&mut self, pops: &[(u32, u32)], pushes: &[(u32, u32)], window: (u32, u32)) {
        let (t0, end) = window;
        self.window_us += u64::from(end - t0);
        let counted = |s: &[(u32, u32)]| s.iter().filter(|(_, d)| *d > t0 && *d <= end).count();
        let lat = |s: &[(u32, u32)]| -> Vec<u32> {
            s.iter()
                .filter(|(i, d)| *i >= t0 && *d <= end)
                .map(|(i, d)| d.saturating_sub(*i))
                .collect()
        };
        self.pops += counted(pops);
        self.pushes += counted(pushes);
        self.pop_lat.extend(lat(pops));
        self.push_lat.extend(lat(pushes));
    }

    fn figures(self) -> (Figure, Figure) {
        let w = Duration::from_micros(self.window_us.max(1));
        (
            figure(self.pops, w, self.pop_lat),
            figure(self.pushes, w, self.push_lat),
        )
    }
}

async fn measure_body(
    port: u16,
    clients: usize,
    body: Body,
    budget: usize,
    seconds: f64,
    acked: &mut Vec<String>,
) -> Result<BodyFigure> {
    let roles = body.roles(clients);
    let mut tally = Tally::new();
    let mut out = BodyFigure::default();
    let mut ran = 0.0;
    while ran < seconds * 0.98 {
        let b = burst(port, &roles, budget, seconds - ran).await?;
        let window = steady(
            &[&b.pop_samples, &b.push_samples],
            b.clients,
            b.exhausted_us,
            Duration::from_secs_f64(seconds - ran),
            b.elapsed,
        );
        ran += b.elapsed.as_secs_f64();
        tally.add(&b.pop_samples, &b.push_samples, window);
        out.bursts += 1;
        out.popped += b.pops.len();
        out.completed += b.pops.iter().filter(|p| p.completed).count();
        out.empty += b.empty;
        acked.extend(check_and_restore(port, clients, &b).await?);
    }
    if out.empty > 0 {
        eprintln!(
            "warning: {} {} pops found nothing to pop",
            out.empty,
            body.key()
        );
    }
    (out.pops, out.pushes) = tally.figures();
    Ok(out)
}

/// The baseline measured the same way: bursts of at most `budget` pops, the popped rows put back.
fn measure_baseline(db: &str, conns: usize, budget: usize, seconds: f64) -> Result<Figure> {
    let mut tally = Tally::new();
    let mut ran = 0.0;
    while ran < seconds * 0.98 {
        let r = baseline_run(db, conns, seconds - ran, None, "pop", Some(budget))?;
        let limit = Duration::from_secs_f64(seconds - ran);
        ran += r.elapsed.as_secs_f64();
        let window = steady(&[&r.samples], conns, r.exhausted_us, limit, r.elapsed);
        tally.add(&r.samples, &[], window);
        refill_baseline(db, r.samples.len())?;
    }
    Ok(tally.figures().0)
}

// ------------------------------------------------------------------------------------ the run

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
        // The columns a heap holds of each queued task (all but the payload and the lease).
        .arg("\\copy (SELECT task_id, priority, created_at, modified_at, hash, schedule_id, organisation, \
              plugin_id, oci_image, input_ooi FROM task_queue WHERE status = 'queued') TO '/dev/null'")
        .status()?;
    if !status.success() {
        return Err("psql \\copy failed".into());
    }
    Ok(started.elapsed().as_secs_f64())
}

fn main() -> Result<()> {
    let o = options()?;
    let base =
        o.pg.rsplit_once('/')
            .map(|(b, _)| b)
            .unwrap_or(&o.pg)
            .to_owned();
    let mut line = Vec::new();
    if o.default_run {
        line.push(with_db(&o, &base, "", |db| run(&o, db))?);
    }
    if o.workers {
        line.push(run_workers(&o, &base)?);
    }
    if o.ingest {
        line.push(ingest::run_ingest(&o, &base)?);
    }
    if o.cron {
        line.push(cron::run_cron(&o, &base)?);
    }
    if o.sqlite {
        line.push(sqlite::run_sqlite(&o)?);
    }
    if o.cluster {
        line.push(cluster::run_cluster(&o, &base)?);
    }
    if o.pending {
        line.push(with_db(&o, &base, "_full", |full| {
            with_db(&o, &base, "_room", |room| run_pending(&o, full, room))
        })?);
    }
    println!("{}", line.join(" "));
    Ok(())
}

/// Runs `f` on a database of its own (`kat_bench_<pid><suffix>`), dropped afterwards unless
/// `--keep`.
fn with_db<T>(
    o: &Options,
    base: &str,
    suffix: &str,
    f: impl FnOnce(&str) -> Result<T>,
) -> Result<T> {
    let name = format!("kat_bench_{}{suffix}", std::process::id());
    pg_exec(&o.pg, &format!("CREATE DATABASE {name}"))?;
    let result = f(&format!("{base}/{name}"));
    if !o.keep {
        let _ = pg_exec(
            &o.pg,
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        );
    }
    result
}

/// The machine and PostgreSQL's commit setting, as a line for the reader.
fn machine(db: &str) -> Result<String> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let sync = {
        let mut conn = PgConnection::establish(db)?;
        #[derive(QueryableByName)]
        struct S {
            #[diesel(sql_type = Text)]
            synchronous_commit: String,
        }
        let s: Vec<S> = diesel::sql_query("SHOW synchronous_commit").load(&mut conn)?;
        s.first()
            .map(|s| s.synchronous_commit.clone())
            .unwrap_or_default()
    };
    Ok(format!(
        "machine: {} CPUs ({cpu}); PostgreSQL synchronous_commit={sync}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    ))
}

fn run(o: &Options, db: &str) -> Result<String> {
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
            push_ceiling: ceiling_pushes(
                db,
                3,
                push_engine[0].round().max(1.0) as usize,
                (o.seconds / 2.0).max(1.0),
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

// ------------------------------------------------------------------------------------ worker scenarios

/// `1e4` for 10,000; the number itself otherwise.
fn depth_label(n: usize) -> String {
    let mut k = 0;
    let mut m = n;
    while m >= 10 && m.is_multiple_of(10) {
        m /= 10;
        k += 1;
    }
    if m == 1 && k > 0 {
        format!("1e{k}")
    } else {
        n.to_string()
    }
}

fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn current_thread() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Medians over rounds of the pop bodies.
fn body_medians(rounds: &[[BodyFigure; 5]]) -> [BodyFigure; 5] {
    let mut out = [BodyFigure::default(); 5];
    for (i, o) in out.iter_mut().enumerate() {
        let pick = |f: fn(&BodyFigure) -> Figure| {
            median_figure(&rounds.iter().map(|r| f(&r[i])).collect::<Vec<_>>())
        };
        o.pops = pick(|b| b.pops);
        o.pushes = pick(|b| b.pushes);
        o.bursts = rounds.iter().map(|r| r[i].bursts).sum();
        o.popped = rounds.iter().map(|r| r[i].popped).sum();
    }
    out
}

/// Measures every pop body in `rounds` rounds (the order reversed every other round), with the
/// baseline among them when `baseline` names its database and budget. Returns the medians, the
/// baseline's median, the acknowledged pushes and how many tasks the fleet completed.
fn measure_bodies(
    o: &Options,
    port: u16,
    budget: usize,
    baseline: Option<(&str, usize)>,
    what: &str,
) -> Result<([BodyFigure; 5], Figure, Vec<String>, usize)> {
    let rt = current_thread()?;
    let mut rounds = Vec::new();
    let mut base_rounds = Vec::new();
    let mut acked = Vec::new();
    let mut completed = 0;
    for round in 0..o.rounds {
        eprintln!("{what}: round {}/{}…", round + 1, o.rounds);
        let mut order: Vec<Option<Body>> = Body::ALL.iter().copied().map(Some).collect();
        if baseline.is_some() {
            order.push(None);
        }
        if round % 2 == 1 {
            order.reverse();
        }
        let mut figs = [BodyFigure::default(); 5];
        for item in order {
            match (item, baseline) {
                (Some(body), _) => {
                    let f = rt.block_on(measure_body(
                        port, o.clients, body, budget, o.seconds, &mut acked,
                    ))?;
                    completed += f.completed;
                    figs[body.index()] = f;
                }
                (None, Some((db, b))) => {
                    base_rounds.push(measure_baseline(db, o.pg_clients, b, o.seconds)?);
                }
                (None, None) => {}
            }
        }
        rounds.push(figs);
    }
    Ok((
        body_medians(&rounds),
        median_figure(&base_rounds),
        acked,
        completed,
    ))
}

fn print_bodies(figs: &[BodyFigure; 5], baseline: Option<Figure>) {
    println!(
        "{:<44} {:>10} {:>9} {:>9} {:>12} {:>11}",
        "pop body (median of rounds)", "pops/s", "p50 µs", "p99 µs", "÷ unfiltered", "÷ baseline"
    );
    let un = figs[Body::Unfiltered.index()].pops.ops_per_sec;
    for body in Body::ALL {
        let f = figs[body.index()].pops;
        let vs_base = baseline.map_or(String::from("-"), |b| {
            format!("{:.2}", f.ops_per_sec / b.ops_per_sec)
        });
        println!(
            "{:<44} {:>10.0} {:>9.0} {:>9.0} {:>12.2} {:>11}",
            body.label(),
            f.ops_per_sec,
            f.p50_us,
            f.p99_us,
            f.ops_per_sec / un,
            vs_base
        );
    }
    if let Some(b) = baseline {
        println!(
            "{:<44} {:>10.0} {:>9.0} {:>9.0} {:>12.2} {:>11}",
            "baseline SKIP LOCKED pop",
            b.ops_per_sec,
            b.p50_us,
            b.p99_us,
            b.ops_per_sec / un,
            "1.00"
        );
    }
    let p = figs[Body::Fleet.index()].pushes;
    println!(
        "{:<44} {:>10.0} {:>9.0} {:>9.0}   (pushes/s: one for each completed task, 1 client in 8)",
        "fleet pushes", p.ops_per_sec, p.p50_us, p.p99_us
    );
}

fn body_pairs(prefix: &str, figs: &[BodyFigure; 5], baseline: Option<Figure>) -> Vec<String> {
    let un = figs[Body::Unfiltered.index()].pops.ops_per_sec;
    let mut kv = Vec::new();
    for body in Body::ALL {
        let f = figs[body.index()].pops;
        let k = body.key();
        kv.push(format!("{prefix}_{k}_pops_per_s={:.0}", f.ops_per_sec));
        kv.push(format!("{prefix}_{k}_p50_us={:.0}", f.p50_us));
        kv.push(format!("{prefix}_{k}_p99_us={:.0}", f.p99_us));
        if body != Body::Unfiltered {
            kv.push(format!(
                "{prefix}_{k}_vs_unfiltered={:.3}",
                f.ops_per_sec / un
            ));
        }
        if let Some(b) = baseline {
            kv.push(format!(
                "{prefix}_{k}_vs_baseline={:.3}",
                f.ops_per_sec / b.ops_per_sec
            ));
        }
    }
    if let Some(b) = baseline {
        kv.push(format!("{prefix}_baseline_pops_per_s={:.0}", b.ops_per_sec));
        kv.push(format!("{prefix}_baseline_p99_us={:.0}", b.p99_us));
    }
    kv.push(format!(
        "{prefix}_fleet_pushes_per_s={:.0}",
        figs[Body::Fleet.index()].pushes.ops_per_sec
    ));
    kv
}

/// The table must hold what the harness did: every acknowledged push, the seeded depth waiting
/// again, nothing left dispatched or running, and one completed task per fleet cycle.
fn check_table(
    db: &str,
    acked: &[String],
    waiting: usize,
    held: usize,
    completed: usize,
) -> Result<String> {
    let stored = count_stored(db, acked)?;
    if stored != acked.len() {
        return Err(format!(
            "{} acknowledged pushes are not stored",
            acked.len() - stored
        )
        .into());
    }
    let w = count_tasks(db, "boefje", "'queued', 'pending'")? as usize;
    if w != waiting {
        return Err(format!("{w} boefje tasks are waiting, expected {waiting}").into());
    }
    let h = count_tasks(db, "boefje", "'dispatched', 'running'")? as usize;
    if h != held {
        return Err(format!("{h} boefje tasks are dispatched or running, expected {held}").into());
    }
    let c = count_tasks(db, "boefje", "'completed'")? as usize;
    if c != completed {
        return Err(format!("{c} boefje tasks are completed, expected {completed}").into());
    }
    Ok(format!(
        "{} acknowledged pushes, all stored; {w} boefje tasks waiting, {h} dispatched and {c} completed, as expected",
        acked.len()
    ))
}

struct DepthResult {
    depth: usize,
    figs: [BodyFigure; 5],
    wall_s: f64,
}

/// The worker pops at each depth, each on a database and broker of its own.
fn run_workers(o: &Options, base: &str) -> Result<String> {
    println!(
        "kat-scheduler benchmark, worker pops: depths {}, {} rounds of {} s, {} HTTP clients, {} baseline connections",
        o.depths
            .iter()
            .map(|d| thousands(*d))
            .collect::<Vec<_>>()
            .join(", "),
        o.rounds,
        o.seconds,
        o.clients,
        o.pg_clients
    );
    println!("{}", machine(&o.pg)?);
    let mut kv = Vec::new();
    let mut results = Vec::new();
    for &depth in &o.depths {
        let r = with_db(o, base, &format!("_w{}", depth_label(depth)), |db| {
            run_workers_depth(o, db, depth, &mut kv)
        })?;
        results.push(r);
    }
    if let (Some(first), Some(last)) = (results.first(), results.last())
        && results.len() > 1
    {
        println!();
        println!(
            "pops/s at {} queued ÷ pops/s at {} queued (target ≥ 0.9 for each pop body):",
            thousands(last.depth),
            thousands(first.depth)
        );
        for body in Body::ALL {
            let i = body.index();
            let ratio = last.figs[i].pops.ops_per_sec / first.figs[i].pops.ops_per_sec;
            println!(
                "  {:<42} {:>10.0} → {:>10.0}   {ratio:.2}",
                body.label(),
                first.figs[i].pops.ops_per_sec,
                last.figs[i].pops.ops_per_sec
            );
            kv.push(format!("workers_{}_depth_ratio={ratio:.3}", body.key()));
        }
        kv.push(format!(
            "workers_depth_ratio_of={}/{}",
            depth_label(last.depth),
            depth_label(first.depth)
        ));
    }
    let worst = results
        .iter()
        .flat_map(|r| {
            let un = r.figs[Body::Unfiltered.index()].pops.ops_per_sec;
            [Body::Image, Body::BoefjeIds, Body::Organisation]
                .map(|b| r.figs[b.index()].pops.ops_per_sec / un)
        })
        .fold(f64::INFINITY, f64::min);
    println!("lowest filtered ÷ unfiltered pops/s over the depths: {worst:.2} (target ≥ 0.9)");
    kv.push(format!("workers_min_filtered_vs_unfiltered={worst:.3}"));
    for r in &results {
        kv.push(format!(
            "workers_{}_wall_s={:.0}",
            depth_label(r.depth),
            r.wall_s
        ));
    }
    println!();
    Ok(kv.join(" "))
}

fn run_workers_depth(
    o: &Options,
    db: &str,
    depth: usize,
    kv: &mut Vec<String>,
) -> Result<DepthResult> {
    let began = Instant::now();
    let maxsize = depth * 2 + 1_000_000;
    // A first start creates the schema; its columns decide what the seed fills.
    stop_broker(start_broker(db, maxsize)?)?;
    let cols = extra_columns(db)?;
    let rows = depth.div_ceil(IMAGES) * BOEFJE_HEAVY.len();
    eprintln!(
        "workers at {}: seeding {rows} tasks and {depth} baseline rows (extra columns: {})…",
        thousands(depth),
        if cols.is_empty() {
            "none".to_owned()
        } else {
            cols.join(", ")
        }
    );
    seed_tasks(db, rows, &BOEFJE_HEAVY, &cols)?;
    seed_baseline(db, depth)?;
    let boefje = count_tasks(db, "boefje", "'queued'")? as usize;
    let seed_s = began.elapsed().as_secs_f64();
    let broker = start_broker(db, maxsize)?;
    let rebuild_s = broker.rebuild_ms / 1000.0;
    // A burst pops at most a quarter of the queue before it is put back, so the depth stays
    // between 3/4 and all of the seeded one.
    let budget = (boefje / 4).max(o.clients * 8);
    let measured = measure_bodies(
        o,
        broker.port,
        budget,
        Some((db, (depth / 4).max(o.pg_clients * 8))),
        &format!("workers at {}", thousands(depth)),
    );
    stop_broker(broker)?;
    let (figs, base, acked, completed) = measured?;
    let checks = check_table(db, &acked, boefje, 0, completed)?;
    let wall_s = began.elapsed().as_secs_f64();
    println!();
    println!(
        "workers at {} queued boefje tasks ({} in the table with normalizer and report tasks): \
         {} rounds of {} s, {} clients; bursts of at most {} pops, each put back after",
        thousands(boefje),
        thousands(rows),
        o.rounds,
        o.seconds,
        o.clients,
        thousands(budget)
    );
    print_bodies(&figs, Some(base));
    let bursts: Vec<String> = Body::ALL
        .iter()
        .map(|b| format!("{} {}", b.key(), figs[b.index()].bursts))
        .collect();
    println!(
        "seeding {seed_s:.0} s, heap rebuild {rebuild_s:.2} s, {:.0} s in all; bursts per body over all rounds: {}",
        wall_s,
        bursts.join(", ")
    );
    println!(
        "checks: no task popped twice in a burst, every popped task matched its filter; {checks}"
    );
    let label = format!("workers_{}", depth_label(depth));
    kv.push(format!("{label}_queued={boefje}"));
    kv.extend(body_pairs(&label, &figs, Some(base)));
    Ok(DepthResult {
        depth,
        figs,
        wall_s,
    })
}

/// The pending scenario: a heap bounded far below the queue, the same pops, pushes into the full
/// heap against pushes into a broker with room, and the starvation check.
fn run_pending(o: &Options, full_db: &str, room_db: &str) -> Result<String> {
    let began = Instant::now();
    let (q, m) = (o.pending_queued, o.pending_maxsize);
    let room_maxsize = q * 2 + 1_000_000;
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
    let checks_room = check_table(room_db, &p.acked_room, boefje + p.acked_room.len(), 0, 0)?;

    println!();
    println!(
        "pending: {} queued boefje tasks with heap maxsize {}: after the start {} are queued and {} pending in the table",
        thousands(boefje),
        thousands(m),
        thousands(at_start.0),
        thousands(at_start.1)
    );
    print_bodies(&p.figs, None);
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
         a worker popping that image got {} of them in {:.1} s",
        p.rare_ids.len(),
        p.rare_pending,
        p.rare_popped,
        p.rare_s
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
    kv.push(format!("rare_image_pending_when_pushed={}", p.rare_pending));
    kv.push(format!("pending_wall_s={wall_s:.0}"));
    Ok(kv.join(" "))
}

struct PendingFigures {
    figs: [BodyFigure; 5],
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
    let (figs, _, mut acked_full, completed) =
        measure_bodies(o, full.port, budget, None, "pending")?;
    let rt = current_thread()?;
    let pushers = vec![
        Role::Push {
            per_completion: false
        };
        o.clients
    ];
    let mut full_rounds = Vec::new();
    let mut room_rounds = Vec::new();
    let mut acked_room = Vec::new();
    let mut full_pushed = 0;
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
    let rare_popped = rt.block_on(rare_worker(full.port, &rare_ids))?;
    let rare_s = started.elapsed().as_secs_f64();
    Ok(PendingFigures {
        figs,
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
async fn rare_worker(port: u16, ids: &[String]) -> Result<usize> {
    let wanted: HashSet<&str> = ids.iter().map(String::as_str).collect();
    let mut got: HashSet<String> = HashSet::new();
    let mut http = Http::connect(port).await?;
    let request = pop_request_with("boefje", Some(&image_filter(RARE_IMAGE)));
    let want = Want::Image(RARE_IMAGE.to_owned());
    let mut body = Vec::new();
    let start = Instant::now();
    let mut last = Instant::now();
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
    Ok(got.len())
}

/// How many of `ids` the table has with `condition`.
fn count_ids(url: &str, ids: &[String], condition: &str) -> Result<usize> {
    let mut conn = PgConnection::establish(url)?;
    let mut found = 0;
    for chunk in ids.chunks(5_000) {
        let list = chunk
            .iter()
            .map(|id| format!("'{id}'"))
            .collect::<Vec<_>>()
            .join(",");
        let rows: Vec<Num> = diesel::sql_query(format!(
            "SELECT COUNT(*) AS n FROM tasks WHERE id IN ({list}) AND {condition}"
        ))
        .load(&mut conn)?;
        found += rows.first().map(|r| r.n).unwrap_or(0) as usize;
    }
    Ok(found)
}
