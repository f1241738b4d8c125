//! `--sqlite`: the broker on its embedded default, an SQLite file with the broker's pragmas
//! (`journal_mode = WAL`, `synchronous = FULL`: every commit is on disk before its answer),
//! measured as users run it.
//!
//! A fresh file per broker, seeded with `--tasks` N tasks by pushes over HTTP (64 clients over the
//! three schedulers; the seeding's rate is reported too) into heaps of `--pending-maxsize` M
//! (default 10,000) per scheduler, so that with N above 3M work waits in `pending` as it does
//! wherever a backlog builds up: pops refill the heap from it, pushes beyond the bound go there.
//! Then per round: pops at full load
//! (`POST /schedulers/{id}/pop?limit=1` over the three schedulers), pushes at full load (new
//! boefje, normalizer and report tasks, as in the original run), and the no-op route. Beside
//! them, SQLite alone on a file of its own with the same pragmas, from this process,
//! `--pg-clients` connections (default 8): a pop as `DELETE … RETURNING` of the best row of one
//! of three queues (SQLite has one writer at a time, so there is nothing like SKIP LOCKED: the
//! connections take turns, by a lock in this process as the broker's engines do), and single-row
//! INSERT commits, each in a `BEGIN IMMEDIATE` transaction.
//!
//! With `--vs BIN`, a second build of the broker (for instance the code before a change, built
//! in a tree of its own) gets a file of its own, seeded the same way, and each round measures
//! both, in an order reversed every other round; each measure is also given as this build ÷ the
//! other.
//!
//! Checks, per broker: no task popped twice, every popped task dispatched, every acknowledged
//! push stored.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Text};
use diesel::{Connection, QueryableByName, RunQueryDsl, SqliteConnection};
use kat_scheduler::storage::SQLITE_PRAGMAS;

use super::harness::http::{
    Http, Op, SCHEDULERS, engine_counters, engine_delta, http_load, push_request,
};
use super::harness::instance::{Broker, start_broker_bin, stop_broker};
use super::harness::stats::{Figure, figure, median, median_figure};
use super::{Options, Result};

/// The `round` argument of the seeding pushes, so their names never meet a measurement's.
const SEED_ROUND: usize = 0xffff;

/// One broker under test and what it saw.
struct Subject {
    label: &'static str,
    bin: String,
    file: PathBuf,
    broker: Option<Broker>,
    seed: Figure,
    pops: Vec<Figure>,
    pushes: Vec<Figure>,
    noop: Vec<Figure>,
    popped: HashSet<String>,
    acked: Vec<String>,
    /// Per pop run: commands per engine transaction, µs applying and µs in all per transaction.
    pop_engine: Vec<[f64; 3]>,
}

impl Subject {
    fn new(label: &'static str, bin: &str, file: PathBuf) -> Subject {
        Subject {
            label,
            bin: bin.to_owned(),
            file,
            broker: None,
            seed: Figure::default(),
            pops: Vec::new(),
            pushes: Vec::new(),
            noop: Vec::new(),
            popped: HashSet::new(),
            acked: Vec::new(),
            pop_engine: Vec::new(),
        }
    }
}

#[derive(QueryableByName)]
struct N {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = Text)]
    id: String,
}

fn connect(file: &Path) -> Result<SqliteConnection> {
    let mut conn = SqliteConnection::establish(&file.to_string_lossy())?;
    conn.batch_execute(SQLITE_PRAGMAS)
        .map_err(|e| format!("{}: setting the pragmas: {e}", file.display()))?;
    Ok(conn)
}

fn sqlite_number(file: &Path, sql: &str) -> Result<i64> {
    let rows: Vec<N> = diesel::sql_query(sql).load(&mut connect(file)?)?;
    Ok(rows.first().map_or(0, |r| r.n))
}

/// `n` pushes over `clients` connections, spread over the three schedulers: the seed.
async fn seed(port: u16, clients: usize, n: usize) -> Result<(Figure, Vec<String>)> {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut http = Http::connect(port).await?;
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut body = Vec::with_capacity(256);
            let (mut ids, mut latencies) = (Vec::new(), Vec::new());
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= n {
                    break;
                }
                let issued = Instant::now();
                let request = push_request(SCHEDULERS[k % 3], c, k, SEED_ROUND);
                let status = http.call(&request, &mut body).await?;
                if status != 201 {
                    return Err::<_, super::Error>(
                        format!(
                            "seeding push answered {status}: {}",
                            String::from_utf8_lossy(&body)
                        )
                        .into(),
                    );
                }
                latencies.push(u32::try_from(issued.elapsed().as_micros()).unwrap_or(u32::MAX));
                if let Some(id) = std::str::from_utf8(&body).ok().and_then(|t| t.get(7..43)) {
                    ids.push(id.to_owned());
                }
            }
            Ok((ids, latencies))
        }));
    }
    let (mut ids, mut latencies) = (Vec::new(), Vec::new());
    for t in tasks {
        let (i, l) = t.await??;
        ids.extend(i);
        latencies.extend(l);
    }
    Ok((figure(ids.len(), start.elapsed(), latencies), ids))
}

/// SQLite alone: a queue of `n` rows and a table for inserts, on a file of their own.
fn seed_baseline(file: &Path, n: usize) -> Result<()> {
    connect(file)?.batch_execute(
        "CREATE TABLE bench_q (id INTEGER PRIMARY KEY, prio INTEGER NOT NULL, queue TEXT NOT NULL,
                               payload TEXT, created TEXT DEFAULT CURRENT_TIMESTAMP);
         CREATE INDEX bench_q_pick ON bench_q (queue, prio, id);
         CREATE TABLE bench_ins (id INTEGER PRIMARY KEY, prio INTEGER, payload TEXT);",
    )?;
    top_up_baseline(file, n)?;
    connect(file)?.batch_execute("ANALYZE")?;
    Ok(())
}

/// Brings the baseline's queue back to `n` rows, so every round pops from the same depth (a
/// fast disk empties it within a few rounds).
fn top_up_baseline(file: &Path, n: usize) -> Result<()> {
    let missing =
        n.saturating_sub(sqlite_number(file, "SELECT COUNT(*) AS n FROM bench_q")? as usize);
    if missing > 0 {
        connect(file)?.batch_execute(&format!(
            "WITH RECURSIVE g(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM g WHERE x < {missing})
             INSERT INTO bench_q (prio, queue, payload)
               SELECT abs(random()) % 1000, 'w' || (1 + x % 3), 'boefje-task-payload-0123456789abcdef'
               FROM g;"
        ))?;
    }
    Ok(())
}

/// SQLite alone at full speed: `pop` (`DELETE … RETURNING` of a queue's best row) or `insert`
/// (a single-row INSERT), one statement per commit, `conns` connections.
fn baseline(file: &Path, conns: usize, seconds: f64, op: &'static str) -> Result<Figure> {
    let deadline = Duration::from_secs_f64(seconds);
    let turn = Arc::new(Mutex::new(()));
    let start = Instant::now();
    let handles: Vec<_> = (0..conns)
        .map(|c| {
            let file = file.to_owned();
            let turn = turn.clone();
            std::thread::spawn(move || -> Result<Vec<u32>> {
                let mut conn = connect(&file)?;
                let mut latencies = Vec::new();
                let mut ops = 0usize;
                while start.elapsed() < deadline {
                    let issued = Instant::now();
                    // The connections take turns in this process, as the broker's engines do:
                    // SQLite's busy handler sleeps and retries, which starves some writers for
                    // seconds under this load. `BEGIN IMMEDIATE` takes the write lock before
                    // anything is read.
                    let guard = turn.lock().map_err(|_| "a baseline thread panicked")?;
                    let done = conn.immediate_transaction(|conn| {
                        if op == "pop" {
                            diesel::sql_query(format!(
                                "DELETE FROM bench_q WHERE id = (SELECT id FROM bench_q WHERE queue = 'w{}' \
                                 ORDER BY prio, id LIMIT 1) RETURNING id AS n",
                                1 + (c + ops) % 3
                            ))
                            .load::<N>(conn)
                            .map(|rows| rows.len())
                        } else {
                            diesel::sql_query(format!(
                                "INSERT INTO bench_ins (prio, payload) VALUES ({}, 'boefje-task-payload-0123456789abcdef')",
                                ops % 1000
                            ))
                            .execute(conn)
                        }
                    })
                    .map_err(|e| format!("SQLite baseline {op}: {e}"))?;
                    drop(guard);
                    if done == 0 {
                        return Err("the SQLite baseline queue ran dry; use more --tasks".into());
                    }
                    ops += 1;
                    latencies.push(u32::try_from(issued.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
                Ok(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for h in handles {
        latencies.extend(h.join().map_err(|_| "baseline thread panicked")??);
    }
    Ok(figure(latencies.len(), start.elapsed(), latencies))
}

/// One round's measurements of one broker.
fn measure(o: &Options, rt: &tokio::runtime::Runtime, s: &mut Subject, round: usize) -> Result<()> {
    let port = s.broker.as_ref().ok_or("the broker is not running")?.port;
    let before = rt.block_on(engine_counters(port))?;
    let (pops, r) = rt.block_on(http_load(port, o.clients, o.seconds, None, Op::Pop, round))?;
    s.pop_engine
        .push(engine_delta(before, rt.block_on(engine_counters(port))?));
    for id in r.ids {
        if !s.popped.insert(id.clone()) {
            return Err(format!("{}: task {id} was popped twice", s.label).into());
        }
    }
    let (pushes, r) = rt.block_on(http_load(port, o.clients, o.seconds, None, Op::Push, round))?;
    s.acked.extend(r.ids);
    let (noop, _) = rt.block_on(http_load(port, o.clients, o.seconds, None, Op::Noop, round))?;
    s.pops.push(pops);
    s.pushes.push(pushes);
    s.noop.push(noop);
    Ok(())
}

/// After the broker stopped: every popped task dispatched, every acknowledged push stored.
fn check(s: &Subject) -> Result<()> {
    let dispatched = sqlite_number(
        &s.file,
        "SELECT COUNT(*) AS n FROM tasks WHERE status = 'dispatched'",
    )?;
    if dispatched != s.popped.len() as i64 {
        return Err(format!(
            "{}: {} tasks popped, {dispatched} dispatched in the table",
            s.label,
            s.popped.len()
        )
        .into());
    }
    let stored: HashSet<String> =
        diesel::sql_query("SELECT id FROM tasks WHERE organisation = 'bench-push'")
            .load::<Id>(&mut connect(&s.file)?)?
            .into_iter()
            .map(|r| r.id)
            .collect();
    let lost = s.acked.iter().filter(|id| !stored.contains(*id)).count();
    if lost > 0 {
        return Err(format!(
            "{}: {lost} of {} acknowledged pushes are not stored",
            s.label,
            s.acked.len()
        )
        .into());
    }
    Ok(())
}

fn fmt(f: &Figure) -> String {
    format!(
        "{:>9.0}/s  p50 {:>6.1} ms  p99 {:>6.1} ms",
        f.ops_per_sec,
        f.p50_us / 1000.0,
        f.p99_us / 1000.0
    )
}

pub(super) fn run_sqlite(o: &Options) -> Result<String> {
    let dir = std::env::temp_dir().join(format!("kat_bench_sqlite_{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run_in(o, &dir);
    if !o.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn run_in(o: &Options, dir: &Path) -> Result<String> {
    // A heap smaller than the backlog, as where work piles up: pops refill the heap from
    // `pending`, pushes beyond the bound wait there.
    let maxsize = o.pending_maxsize;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let base_file = dir.join("baseline.db");
    seed_baseline(&base_file, o.tasks)?;
    #[derive(QueryableByName)]
    struct V {
        #[diesel(sql_type = Text)]
        v: String,
    }
    let version: Vec<V> =
        diesel::sql_query("SELECT sqlite_version() AS v").load(&mut connect(&base_file)?)?;
    println!(
        "kat-scheduler SQLite benchmark: {} tasks, {} rounds of {} s, {} HTTP clients, {} SQLite connections for the baseline",
        o.tasks, o.rounds, o.seconds, o.clients, o.pg_clients
    );
    println!(
        "machine: {} CPUs; SQLite {} (journal_mode=WAL, synchronous=FULL) in {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        version.first().map_or("?", |v| v.v.as_str()),
        dir.display()
    );

    let mut subjects = vec![Subject::new(
        "this build",
        env!("CARGO_BIN_EXE_kat-scheduler"),
        dir.join("this.db"),
    )];
    if let Some(vs) = &o.vs {
        subjects.push(Subject::new("--vs build", vs, dir.join("vs.db")));
    }
    for s in &mut subjects {
        let uri = format!("sqlite://{}", s.file.display());
        let broker = start_broker_bin(&s.bin, &uri, maxsize)?;
        eprintln!("{}: seeding {} tasks by pushes…", s.label, o.tasks);
        let (f, ids) = rt.block_on(seed(broker.port, o.clients, o.tasks))?;
        s.seed = f;
        s.acked.extend(ids);
        s.broker = Some(broker);
        println!(
            "{}: seeded; {} queued (heaps of {maxsize} per scheduler), {} pending",
            s.label,
            sqlite_number(
                &s.file,
                "SELECT COUNT(*) AS n FROM tasks WHERE status = 'queued'"
            )?,
            sqlite_number(
                &s.file,
                "SELECT COUNT(*) AS n FROM tasks WHERE status = 'pending'"
            )?
        );
    }

    let mut base_pop = Vec::new();
    let mut base_insert = Vec::new();
    for round in 0..o.rounds {
        eprintln!("round {}/{}…", round + 1, o.rounds);
        let order: Vec<usize> = if round % 2 == 0 {
            (0..subjects.len()).collect()
        } else {
            (0..subjects.len()).rev().collect()
        };
        for i in order {
            measure(o, &rt, &mut subjects[i], round)?;
        }
        top_up_baseline(&base_file, o.tasks)?;
        base_pop.push(baseline(&base_file, o.pg_clients, o.seconds, "pop")?);
        base_insert.push(baseline(&base_file, o.pg_clients, o.seconds, "insert")?);
    }
    for s in &mut subjects {
        if let Some(b) = s.broker.take() {
            stop_broker(b)?;
        }
        check(s)?;
    }

    let base_pop = median_figure(&base_pop);
    let base_insert = median_figure(&base_insert);
    println!();
    println!(
        "SQLite alone, pop (DELETE … RETURNING)   {}",
        fmt(&base_pop)
    );
    println!(
        "SQLite alone, single-row INSERT commits {}",
        fmt(&base_insert)
    );
    let mut pairs = vec![
        format!("sqlite_baseline_pop={:.0}", base_pop.ops_per_sec),
        format!("sqlite_baseline_insert={:.0}", base_insert.ops_per_sec),
    ];
    let mut medians = Vec::new();
    for s in &subjects {
        let (pops, pushes, noop) = (
            median_figure(&s.pops),
            median_figure(&s.pushes),
            median_figure(&s.noop),
        );
        println!("{} ({}):", s.label, s.bin);
        println!("  seeding pushes     {}", fmt(&s.seed));
        println!(
            "  pops               {}  = {:.2}× SQLite alone",
            fmt(&pops),
            pops.ops_per_sec / base_pop.ops_per_sec
        );
        println!(
            "  pushes             {}  = {:.2}× single-row INSERTs",
            fmt(&pushes),
            pushes.ops_per_sec / base_insert.ops_per_sec
        );
        let e = |k: usize| median(s.pop_engine.iter().map(|e| e[k]).collect());
        println!(
            "  pop transactions   {:.1} pops each, {:.2} ms applying, {:.2} ms in all (BEGIN to COMMIT)",
            e(0),
            e(1) / 1000.0,
            e(2) / 1000.0
        );
        println!("  no-op              {}", fmt(&noop));
        println!(
            "  checked: {} pops, none twice, all dispatched; {} acknowledged pushes, all stored",
            s.popped.len(),
            s.acked.len()
        );
        let key = if medians.is_empty() {
            "sqlite"
        } else {
            "sqlite_vs"
        };
        pairs.push(format!("{key}_seed_pushes={:.0}", s.seed.ops_per_sec));
        pairs.push(format!("{key}_pops={:.0}", pops.ops_per_sec));
        pairs.push(format!("{key}_pop_p99_ms={:.1}", pops.p99_us / 1000.0));
        pairs.push(format!("{key}_pushes={:.0}", pushes.ops_per_sec));
        pairs.push(format!("{key}_noop={:.0}", noop.ops_per_sec));
        medians.push((s.seed, pops, pushes));
    }
    if let [this, vs] = medians.as_slice() {
        let ratio = |a: &Figure, b: &Figure| a.ops_per_sec / b.ops_per_sec;
        // Per round as well, since the two brokers ran side by side in each.
        let per_round = |f: fn(&Subject) -> &Vec<Figure>| {
            median(
                f(&subjects[0])
                    .iter()
                    .zip(f(&subjects[1]))
                    .map(|(a, b)| ratio(a, b))
                    .collect(),
            )
        };
        println!(
            "this build ÷ --vs build: pops {:.2}× (median of rounds {:.2}×), pushes {:.2}× ({:.2}×), seeding pushes {:.2}×",
            ratio(&this.1, &vs.1),
            per_round(|s| &s.pops),
            ratio(&this.2, &vs.2),
            per_round(|s| &s.pushes),
            ratio(&this.0, &vs.0)
        );
        pairs.push(format!("sqlite_pops_vs={:.2}", ratio(&this.1, &vs.1)));
        pairs.push(format!("sqlite_pushes_vs={:.2}", ratio(&this.2, &vs.2)));
    }
    Ok(pairs.join(" "))
}
