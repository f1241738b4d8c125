//! The benchmark harness: the broker measured against baselines that do the same work without
//! it, each scenario in a module of its own (`benches/broker/<scenario>.rs`, whose header says
//! what it measures). This file reads the options and runs the scenarios they name.
//!
//! ```sh
//! cargo bench --bench broker                    # N = 1,000,000 queued tasks, 3 rounds
//! cargo bench --bench broker -- --tasks 100000 --seconds 3   # a quick run
//! cargo bench --bench broker -- --workers       # the pops real workers send, at 1e4, 1e5, 1e6 queued
//! cargo bench --bench broker -- --workers --depths 10000 --seconds 1   # a quick look
//! cargo bench --bench broker -- --pending       # 1e5 queued over a heap of 1e4
//! cargo bench --bench broker -- --fairness      # one organisation's flood vs ten quiet ones (broker/fairness.rs)
//! cargo bench --bench broker -- --ingest        # the listener and ColdStart (broker/ingest.rs)
//! cargo bench --bench broker -- --parked        # parked events' reads at 0, 1e4, 1e5 parked (broker/parked.rs)
//! cargo bench --bench broker -- --ingest --messages 5000 --objects 20000   # a quick look
//! cargo bench --bench broker -- --cron          # one tick over 1e5 due schedules; an hour and an object change at 1e6 waiting (broker/cron.rs)
//! cargo bench --bench broker -- --cluster --tasks 100000 --seconds 2   # one instance vs three; 10 takeovers (broker/cluster.rs)
//! cargo bench --bench broker -- --cron --due 10000 --rescore-tasks 100000   # a quick look
//! cargo bench --bench broker -- --sqlite        # the embedded default: pops and pushes (broker/sqlite.rs)
//! cargo bench --bench broker -- --pushes        # pushes at 64 clients ÷ INSERT commits (broker/pushes.rs)
//! cargo bench --bench broker -- --completions   # jobs completed/s, 16 workers ÷ Graphile Worker's pool (broker/completions.rs)
//! cargo bench --bench broker -- --wal --jobs 5000   # WAL per job's life, per step (broker/wal.rs)
//! cargo bench --bench broker -- --memory        # resident bytes per queued task at 1e5 and 1e6 (broker/memory.rs)
//! cargo bench --bench broker -- --rebuild       # a start's heap rebuild beside 0 and 1e6 finished tasks (broker/rebuild.rs)
//! cargo bench --bench broker -- --sqlite --tasks 100000 --vs OTHER-BUILD   # two builds side by side
//! ```
//!
//! `KAT_BENCH_BIN=PATH` runs every scenario against another build of the broker (an earlier
//! commit's `target/release/kat-scheduler`), for a before-and-after with the same harness; the
//! broker inherits the environment, so `SCHEDULER_*` variables set its settings.
//!
//! Options: `--tasks N`, `--rounds R` (≥ 3), `--seconds S` per measurement, `--clients C` (HTTP,
//! default 64), `--pg-clients P` (baseline, default 8), `--pg URL` (a maintenance database; the
//! harness creates and drops its own), `--keep` (keep the databases). Scenarios: with none named
//! the original measurements run (below); `--workers`, `--pending`, `--ingest`, `--cron` and
//! `--sqlite` run only themselves, and `--default` adds the original measurements to them.
//! `--depths D,D,…` (for `--workers`, default `10000,100000,1000000`; `1e5` works too),
//! `--pending-queued Q` (default 100,000), `--pending-maxsize M` (default 10,000; also the heap
//! bound of `--sqlite`), `--pending-control` (the pending scenario with room in both brokers'
//! heaps: two identical sides, for the spread its ratios have on the machine), `--rare K`
//! (default 500); for `--ingest`, `--messages M` per listener
//! round (default 20,000), `--objects O` per ColdStart round (default 100,000) over `--orgs K`
//! organisations (default 10). `--vs PATH` (for `--sqlite`): another build of the broker. Counts
//! (`--tasks` too) take `100_000` or `1e5`.
//!
//! The scenarios, one file each in `benches/broker/`:
//! - `full_load.rs`, the original run: the broker over HTTP against a bare PostgreSQL SKIP LOCKED
//!   queue and the same server's no-op endpoint, side by side on one PostgreSQL server, in
//!   alternating rounds: pops at full and half load, pushes, heap rebuild, memory per task;
//! - `workers.rs` (`--workers`): the pops real workers send, filtered, at several depths;
//! - `pending.rs` (`--pending`): the same pops on a heap bounded far below the queue, pushes into
//!   it, and the starvation check;
//! - `ingest.rs` (`--ingest`), `cron.rs` (`--cron`), `cluster.rs` (`--cluster`), `sqlite.rs`
//!   (`--sqlite`) and `fairness.rs` (`--fairness`, `--flood F`: the flooding organisation's
//!   tasks, default 9,000), with `fair_heap.rs`: the turns' cost to image pops in the heap alone
//!   (`--tasks` queued);
//! - `pushes.rs` (`--pushes`): pushes of new tasks at `--clients` against single-row INSERT
//!   commits at `--pg-clients`, alternating rounds, on their own (without the 1e6 seed);
//! - `completions.rs` (`--completions`): jobs completed per second by 16 workers (pop 10, two
//!   PATCHes each, over HTTP) against Graphile Worker's 16-way pool in process (installed from
//!   npm; `broker/graphile_completions.js`) and against the floor in bare SQL, three commits a
//!   job on 16 connections (`broker/harness/job_commits.rs`), the sides taking turns first;
//! - `wal.rs` (`--wal`, `--jobs N` default 5,000, `--pg-wal DIR`): the write-ahead log of a job's
//!   life (push, pop, running, completed) per step, read with `pg_waldump`, against a minimal
//!   SQL job queue in the same run; `broker/graphile_wal.sh` measures Graphile Worker (installed
//!   from npm) the same way on the same server;
//! - `memory.rs` (`--memory`, `--memory-depths D,D,…` default `1e5,1e6`): resident memory per
//!   queued task after a heap rebuild, against PostgreSQL's bytes per row of the same tasks;
//! - `rebuild.rs` (`--rebuild`, `--rebuild-queued Q` default 100,000, `--rebuild-history H,H,…`
//!   default `0,1e6`): a start's heap rebuild beside finished history, against `\copy` of the
//!   same queued rows;
//! - `parked.rs` (`--parked`, `--parked-depths D,D,…` default `0,1e4,1e5`): the reads of the
//!   listener's parked events (an idle tick's claim, the listener's per-batch read, a claim of
//!   100 due) at depth, against the empty table in the same run.
//!
//! What they share is in `benches/broker/harness/` (its `mod.rs` has the map): statistics, the
//! PostgreSQL seed and baseline, starting the broker, the HTTP load client, and the worker pops
//! that `--workers` and `--pending` both measure.
//!
//! Every scenario checks while it measures (no popped id seen twice, every acknowledged push in
//! the table afterwards, …). The last line is `key=value` pairs for machines (one line for all
//! the scenarios that ran).

#[path = "broker/cluster.rs"]
mod cluster;
#[path = "broker/completions.rs"]
mod completions;
#[path = "broker/cron.rs"]
mod cron;
#[path = "broker/fair_heap.rs"]
mod fair_heap;
#[path = "broker/fairness.rs"]
mod fairness;
#[path = "broker/full_load.rs"]
mod full_load;
#[path = "broker/harness/mod.rs"]
mod harness;
#[path = "broker/ingest.rs"]
mod ingest;
#[path = "broker/memory.rs"]
mod memory;
#[path = "broker/parked.rs"]
mod parked;
#[path = "broker/pending.rs"]
mod pending;
#[path = "broker/pushes.rs"]
mod pushes;
#[path = "broker/rebuild.rs"]
mod rebuild;
#[path = "broker/sqlite.rs"]
mod sqlite;
#[path = "broker/wal.rs"]
mod wal;
#[path = "broker/workers.rs"]
mod workers;

use harness::postgres::with_db;

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, Error>;

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
    /// The pending scenario as its own control: both brokers with room in their heaps, so its
    /// ratios say how far two identical sides measured this way differ on this machine.
    pending_control: bool,
    /// Tasks of an image nothing else has, pushed into the full heap for the starvation check.
    rare: usize,
    /// Run the ingest scenario: the listener and ColdStart (see `broker/ingest.rs`).
    ingest: bool,
    /// Run the cron scenario: one tick over `due` schedules; an hour passing and one object
    /// changing over `rescore_tasks` waiting tasks (`broker/cron.rs`).
    cron: bool,
    /// Run the cluster scenario: one instance against three, takeovers (`broker/cluster.rs`).
    cluster: bool,
    /// SIGKILLs of the owner in the cluster scenario.
    kills: usize,
    /// Due boefje schedules for the tick.
    due: usize,
    /// Waiting tasks for the hour and the object change.
    rescore_tasks: usize,
    /// Object events per listener round.
    messages: usize,
    /// Objects per ColdStart round.
    objects: usize,
    /// Organisations they are spread over.
    orgs: usize,
    /// Run the SQLite scenario: the broker on its embedded default (`broker/sqlite.rs`).
    sqlite: bool,
    /// Run the fairness scenario (`broker/fairness.rs`).
    fairness: bool,
    /// The flooding organisation's tasks in it.
    flood: usize,
    /// Another build of the broker to measure side by side in the SQLite scenario.
    vs: Option<String>,
    /// Run the pushes scenario (`broker/pushes.rs`).
    pushes: bool,
    /// Run the completions scenario (`broker/completions.rs`).
    completions: bool,
    /// Run the WAL scenario (`broker/wal.rs`).
    wal: bool,
    /// Jobs per side and round in it.
    jobs: usize,
    /// The server's `pg_wal` directory, when not `data_directory`/pg_wal.
    pg_wal: Option<String>,
    /// Run the memory scenario (`broker/memory.rs`) at each of `memory_depths`.
    memory: bool,
    memory_depths: Vec<usize>,
    /// Run the parked events scenario (`broker/parked.rs`).
    parked: bool,
    /// Parked events the scenario measures at.
    parked_depths: Vec<usize>,
    /// Run the rebuild scenario (`broker/rebuild.rs`).
    rebuild: bool,
    /// Queued tasks of the rebuild scenario.
    rebuild_queued: usize,
    /// Finished tasks beside them, one database each.
    rebuild_history: Vec<usize>,
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
        pending_control: false,
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
        fairness: false,
        flood: 9_000,
        vs: None,
        pushes: false,
        completions: false,
        wal: false,
        jobs: 5_000,
        pg_wal: None,
        memory: false,
        memory_depths: vec![100_000, 1_000_000],
        parked: false,
        parked_depths: vec![0, 10_000, 100_000],
        rebuild: false,
        rebuild_queued: 100_000,
        rebuild_history: vec![0, 1_000_000],
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
            "--pending-control" => {
                o.pending = true;
                o.pending_control = true;
            }
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
            "--fairness" => o.fairness = true,
            "--flood" => o.flood = count(&value()?)?,
            "--vs" => o.vs = Some(value()?),
            "--pushes" => o.pushes = true,
            "--completions" => o.completions = true,
            "--wal" => o.wal = true,
            "--jobs" => o.jobs = count(&value()?)?,
            "--pg-wal" => o.pg_wal = Some(value()?),
            "--memory" => o.memory = true,
            "--memory-depths" => {
                o.memory_depths = value()?
                    .split(',')
                    .map(|d| count(d.trim()))
                    .collect::<Result<_>>()?;
            }
            "--parked" => o.parked = true,
            "--parked-depths" => {
                o.parked_depths = value()?
                    .split(',')
                    .map(|d| count(d.trim()))
                    .collect::<Result<_>>()?;
            }
            "--rebuild" => o.rebuild = true,
            "--rebuild-queued" => o.rebuild_queued = count(&value()?)?,
            "--rebuild-history" => {
                o.rebuild_history = value()?
                    .split(',')
                    .map(|d| count(d.trim()))
                    .collect::<Result<_>>()?;
            }
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
    if !o.workers
        && !o.pending
        && !o.ingest
        && !o.cron
        && !o.sqlite
        && !o.cluster
        && !o.fairness
        && !o.pushes
        && !o.completions
        && !o.wal
        && !o.memory
        && !o.rebuild
        && !o.parked
    {
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

fn main() -> Result<()> {
    let o = options()?;
    let base =
        o.pg.rsplit_once('/')
            .map(|(b, _)| b)
            .unwrap_or(&o.pg)
            .to_owned();
    let mut line = Vec::new();
    if o.default_run {
        line.push(with_db(&o, &base, "", |db| {
            full_load::run_full_load(&o, db)
        })?);
    }
    if o.workers {
        line.push(workers::run_workers(&o, &base)?);
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
    if o.fairness {
        line.push(fairness::run_fairness(&o, &base)?);
        line.push(fair_heap::run_fair_heap(&o)?);
    }
    if o.pushes {
        line.push(pushes::run_pushes(&o, &base)?);
    }
    if o.completions {
        line.push(completions::run_completions(&o, &base)?);
    }
    if o.wal {
        line.push(wal::run_wal(&o, &base)?);
    }
    if o.rebuild {
        line.push(rebuild::run_rebuild(&o, &base)?);
    }
    if o.memory {
        line.push(memory::run_memory(&o, &base)?);
    }
    if o.parked {
        line.push(parked::run_parked(&o, &base)?);
    }
    if o.pending {
        line.push(with_db(&o, &base, "_full", |full| {
            with_db(&o, &base, "_room", |room| {
                pending::run_pending(&o, full, room)
            })
        })?);
    }
    println!("{}", line.join(" "));
    Ok(())
}
