//! `--completions`: jobs completed per second by 16 workers through the broker against Graphile
//! Worker's 16-way pool in process, on the same PostgreSQL server, in alternating rounds; the
//! figure is the ratio of the medians (issue 25, row 8: target ≥ 2×).
//!
//! The broker (its release binary, over HTTP): 16 keep-alive clients, each a boefje runner's loop:
//! `POST /schedulers/boefje/pop?limit=10` with the runner's image filter (client c asking for
//! image c % 10, as the worker pops), then for each task popped `PATCH /tasks/{id}` `running`,
//! then `completed`. A completion is a 200 answer to the `completed` PATCH. On the boefje
//! scheduler a pop answers one unit of work whatever its limit (a task, or a de-duplication group,
//! as mula's boefje pop; the seed has no groups), so each job costs its worker three requests in
//! a row; the run prints the tasks per pop and each call's mean time. Graphile Worker
//! (installed once per run from npm into a temporary directory, `GRAPHILE_WORKER_VERSION`, default
//! 0.17.3; the script is `graphile_completions.js` beside this file): `run({concurrency: 16})` with
//! a task that does nothing, in one node process; a completion is a job's deletion committed. Both
//! count over `--seconds` after a warm-up of a second, and both start with the same number of jobs
//! queued, each round on a fresh database of its own with a `CHECKPOINT` after the seed, so no
//! round pays for another's rows or dirty pages. A third side is the same job in bare SQL
//! (`harness/job_commits.rs`): 16 connections each making a job's three commits in a row (take
//! with `SKIP LOCKED`, `running`, `completed`), what unbatched durable requests cost this server
//! (a broker's batches share commits, so this is not its floor). Beside each side's figure, the
//! machine's CPU busy over the window gives its CPU per job. The sides take turns going first:
//! round r starts with side r % 3 of broker, Graphile Worker, the three commits.
//!
//! Checks: on the broker, no task completed twice, every popped task of the image asked for, no
//! pop empty (the queue never ran dry), and afterwards the table's completed boefje tasks exactly
//! the completions answered (none left dispatched or running); on Graphile Worker, jobs left at
//! the window's end, none failed, and every job it ran deleted but those in flight when it
//! stopped. Beside the figures: each broker call's mean time and the engine's batches, to see
//! where a job's time goes.
//! Without node or npm (or the npm registry) Graphile Worker is not measured: the run says so
//! loudly and prints the broker's figure alone.

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::harness::http::{Http, current_thread, engine_counters, engine_delta, patch_request};
use super::harness::instance::{start_broker, stop_broker};
use super::harness::job_commits::{JobCommits, busy_in, run_jobs, seed_jobs};
use super::harness::postgres::{
    IMAGES, count_tasks, extra_columns, image_name, machine, pg_exec, seed_tasks, with_db,
};
use super::harness::stats::{median, thousands};
use super::harness::worker_pops::image_filter;
use super::{Error, Options, Result};

/// Workers on each side: the broker's HTTP clients, Graphile Worker's concurrency.
const WORKERS: usize = 16;

/// Tasks a broker worker asks for per pop.
const LIMIT: usize = 10;

/// Seconds of start-up not counted (connections, prepared statements, the pool's first fetches).
const WARM_UP_S: f64 = 1.0;

/// Jobs queued per second of warm-up and window on each side: about five times what this project's
/// machine completes, so neither queue runs dry (checked) and both sides start at the same depth.
const SEED_PER_SECOND: f64 = 10_000.0;

/// Graphile Worker's version when `GRAPHILE_WORKER_VERSION` does not name one (as
/// `graphile_wal.sh`).
const GRAPHILE_VERSION: &str = "0.17.3";

/// Graphile Worker's side, written into the install's directory so node finds the package.
const GRAPHILE_SCRIPT: &str = include_str!("graphile_completions.js");

/// The broker's heap bound: room for every seeded task, so no pop crosses a pending backlog (that
/// is `--pending`'s measurement).
const MAXSIZE: usize = 10_000_000;

/// The sides of a round.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Broker,
    Graphile,
    Floor,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Broker => "broker",
            Side::Graphile => "graphile",
            Side::Floor => "3 commits",
        }
    }
}

/// A broker round: completions in the window and where a worker's time went.
struct BrokerRound {
    per_s: f64,
    /// Completions answered over the whole round (warm-up and the batches finished after the
    /// window included): what the table must hold.
    completed: usize,
    /// Tasks per pop answer: one on the boefje scheduler, whatever the limit (one unit of work,
    /// as mula's boefje pop), but for a de-duplication group's siblings (the seed has none).
    per_pop: f64,
    /// Mean µs per call in the window: pop, PATCH `running`, PATCH `completed`.
    call_us: [f64; 3],
    /// The engine over the round: commands per batch, apply µs and batch µs (BEGIN to COMMIT)
    /// per batch.
    engine: [f64; 3],
    /// The machine's CPU busy over the window, as a share of both cores.
    busy: f64,
}

/// One worker's tally.
#[derive(Default)]
struct Worker {
    completed: Vec<String>,
    in_window: usize,
    /// Summed µs and calls in the window, per kind of call (pop, running, completed).
    us: [u64; 3],
    calls: [u64; 3],
    pops: usize,
    empty_pops: usize,
    wrong_image: usize,
}

#[derive(Deserialize)]
struct Popped {
    results: Vec<PoppedTask>,
}

#[derive(Deserialize)]
struct PoppedTask {
    id: String,
    data: PoppedData,
}

#[derive(Deserialize)]
struct PoppedData {
    boefje: PoppedBoefje,
}

#[derive(Deserialize)]
struct PoppedBoefje {
    oci_image: String,
}

/// The runner's pop: up to `LIMIT` tasks of one image.
fn pop_request(image: &str) -> Vec<u8> {
    let body = image_filter(image);
    format!(
        "POST /schedulers/boefje/pop?limit={LIMIT} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn unexpected(what: &str, status: u16, body: &[u8]) -> Error {
    format!(
        "{what}: unexpected HTTP {status}: {}",
        String::from_utf8_lossy(body)
    )
    .into()
}

/// One runner's loop until the window's end; the batch in hand is finished after it, so nothing is
/// left dispatched.
async fn worker(
    mut http: Http,
    c: usize,
    start: Instant,
    window: (Duration, Duration),
) -> Result<Worker> {
    let image = image_name(c % IMAGES);
    let pop = pop_request(&image);
    let mut w = Worker::default();
    let mut body = Vec::with_capacity(16 * 1024);
    let mut answer = Vec::with_capacity(4 * 1024);
    let counted = |at: Duration| at >= window.0 && at < window.1;
    while start.elapsed() < window.1 {
        let issued = start.elapsed();
        let s = http.call(&pop, &mut body).await?;
        if s != 200 {
            return Err(unexpected("pop", s, &body));
        }
        let done = start.elapsed();
        if counted(done) {
            w.us[0] += (done - issued).as_micros() as u64;
            w.calls[0] += 1;
        }
        let popped: Popped = serde_json::from_slice(&body)?;
        w.pops += 1;
        if popped.results.is_empty() {
            w.empty_pops += 1;
        }
        for task in popped.results {
            if task.data.boefje.oci_image != image {
                w.wrong_image += 1;
            }
            for (k, status) in [(1, "running"), (2, "completed")] {
                let issued = start.elapsed();
                let s = http
                    .call(&patch_request(&task.id, status), &mut answer)
                    .await?;
                if s != 200 {
                    return Err(unexpected(status, s, &answer));
                }
                let done = start.elapsed();
                if counted(done) {
                    w.us[k] += (done - issued).as_micros() as u64;
                    w.calls[k] += 1;
                    if k == 2 {
                        w.in_window += 1;
                    }
                }
            }
            w.completed.push(task.id);
        }
    }
    Ok(w)
}

/// The broker's round on a fresh database: seed `jobs` boefje tasks, start the broker, run the
/// workers, check the table.
fn broker_round(o: &Options, db: &str, jobs: usize) -> Result<BrokerRound> {
    // A first start creates the schema; its columns decide what the seed fills.
    stop_broker(start_broker(db, MAXSIZE)?)?;
    let cols = extra_columns(db)?;
    seed_tasks(db, jobs, &["boefje"], &cols)?;
    pg_exec(db, "CHECKPOINT")?;
    let broker = start_broker(db, MAXSIZE)?;
    let rt = current_thread()?;
    let warm = Duration::from_secs_f64(WARM_UP_S);
    let window = (warm, warm + Duration::from_secs_f64(o.seconds));
    let ran = rt.block_on(async {
        let mut conns = Vec::with_capacity(WORKERS);
        for _ in 0..WORKERS {
            conns.push(Http::connect(broker.port).await?);
        }
        let before = engine_counters(broker.port).await?;
        let start = Instant::now();
        let tasks: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(c, http)| tokio::spawn(worker(http, c, start, window)))
            .collect();
        let busy = tokio::task::spawn_blocking(move || busy_in(start, window));
        let mut all = Vec::with_capacity(WORKERS);
        for t in tasks {
            all.push(t.await??);
        }
        let engine = engine_delta(before, engine_counters(broker.port).await?);
        Ok::<_, Error>((all, engine, busy.await?))
    });
    stop_broker(broker)?;
    let (workers, engine, busy) = ran?;
    let mut seen = HashSet::new();
    for id in workers.iter().flat_map(|w| &w.completed) {
        if !seen.insert(id.as_str()) {
            return Err(format!("task {id} was completed twice").into());
        }
    }
    let wrong: usize = workers.iter().map(|w| w.wrong_image).sum();
    if wrong > 0 {
        return Err(format!("{wrong} popped tasks were not of the image asked for").into());
    }
    let empty: usize = workers.iter().map(|w| w.empty_pops).sum();
    if empty > 0 {
        return Err(format!(
            "{empty} pops found no task: the queue ran dry (raise SEED_PER_SECOND)"
        )
        .into());
    }
    let completed = seen.len();
    let pops: usize = workers.iter().map(|w| w.pops).sum();
    let in_table = count_tasks(db, "boefje", "'completed'")? as usize;
    if in_table != completed {
        return Err(format!(
            "{in_table} boefje tasks are completed in the table, {completed} completions were answered"
        )
        .into());
    }
    let held = count_tasks(db, "boefje", "'dispatched', 'running'")?;
    if held != 0 {
        return Err(format!("{held} boefje tasks are left dispatched or running").into());
    }
    let mut call_us = [0.0; 3];
    for (k, us) in call_us.iter_mut().enumerate() {
        let sum: u64 = workers.iter().map(|w| w.us[k]).sum();
        let calls: u64 = workers.iter().map(|w| w.calls[k]).sum();
        *us = sum as f64 / calls.max(1) as f64;
    }
    let in_window: usize = workers.iter().map(|w| w.in_window).sum();
    Ok(BrokerRound {
        per_s: in_window as f64 / o.seconds,
        completed,
        per_pop: completed as f64 / pops.max(1) as f64,
        call_us,
        engine,
        busy,
    })
}

/// Graphile Worker installed from npm into a temporary directory, with the script beside it.
struct Graphile {
    dir: tempfile::TempDir,
    version: String,
}

/// Installs Graphile Worker, or says why it cannot.
fn install_graphile() -> std::result::Result<Graphile, String> {
    let version =
        std::env::var("GRAPHILE_WORKER_VERSION").unwrap_or_else(|_| GRAPHILE_VERSION.into());
    for tool in ["node", "npm"] {
        match Command::new(tool).arg("--version").output() {
            Ok(out) if out.status.success() => {}
            _ => return Err(format!("{tool} is not on PATH")),
        }
    }
    let dir = tempfile::tempdir().map_err(|e| format!("no temporary directory: {e}"))?;
    let npm = |args: &[&str]| -> std::result::Result<(), String> {
        let out = Command::new("npm")
            .args(args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("npm: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "npm {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    // Not `npm init`: it names the package after the directory, and a temporary directory's name
    // (`.tmpXXXX`) is not a valid package name.
    std::fs::write(
        dir.path().join("package.json"),
        r#"{"name": "kat-bench-graphile", "private": true}"#,
    )
    .map_err(|e| format!("cannot write package.json: {e}"))?;
    npm(&[
        "install",
        "--silent",
        "--no-audit",
        "--no-fund",
        &format!("graphile-worker@{version}"),
    ])?;
    std::fs::write(dir.path().join("completions.js"), GRAPHILE_SCRIPT)
        .map_err(|e| format!("cannot write the script: {e}"))?;
    Ok(Graphile { dir, version })
}

/// Graphile Worker's round on a fresh database: its figure and the line it printed.
fn graphile_round(g: &Graphile, db: &str, jobs: usize, seconds: f64) -> Result<f64> {
    let out = Command::new("node")
        .arg("completions.js")
        .current_dir(g.dir.path())
        .env("URL", db)
        .env("JOBS", jobs.to_string())
        .env("SECONDS", seconds.to_string())
        .env("WARM_UP", WARM_UP_S.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("Graphile Worker's round failed ({})", out.status).into());
    }
    let stdout = String::from_utf8(out.stdout)?;
    let line = stdout
        .lines()
        .last()
        .ok_or("Graphile Worker printed nothing")?;
    let get = |key: &str| -> Result<f64> {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            .ok_or_else(|| format!("no {key} in Graphile Worker's line: {line}"))?
            .parse::<f64>()
            .map_err(Error::from)
    };
    let (completed, window, ran, deleted) = (
        get("completed")?,
        get("window_s")?,
        get("ran")?,
        get("deleted")?,
    );
    if get("left")? == 0.0 {
        return Err("Graphile Worker's queue ran dry in the window (raise SEED_PER_SECOND)".into());
    }
    if get("failed")? != 0.0 {
        return Err(format!("Graphile Worker failed jobs: {line}").into());
    }
    // A job whose task ran as the pool stopped may not have its deletion committed yet.
    if deleted > ran || ran - deleted > WORKERS as f64 {
        return Err(format!("Graphile Worker ran and deleted different jobs: {line}").into());
    }
    Ok(completed / window)
}

pub fn run_completions(o: &Options, base: &str) -> Result<String> {
    let jobs = (SEED_PER_SECOND * (WARM_UP_S + o.seconds)).ceil() as usize;
    println!(
        "completions: {WORKERS} broker workers (pop {LIMIT} with an image filter, PATCH running, PATCH completed, over HTTP) against Graphile Worker's pool of {WORKERS} in process, {} rounds of {} s after {WARM_UP_S} s of warm-up, {} jobs queued per side and round",
        o.rounds,
        o.seconds,
        thousands(jobs)
    );
    println!("{}", machine(&o.pg)?);
    eprintln!("completions: installing Graphile Worker from npm…");
    let graphile = match install_graphile() {
        Ok(g) => Some(g),
        Err(why) => {
            eprintln!(
                "\n*** completions: GRAPHILE WORKER IS NOT MEASURED ({why}); the broker's figure alone follows ***\n"
            );
            println!("Graphile Worker not measured: {why}");
            None
        }
    };
    let mut broker_rounds = Vec::new();
    let mut graphile_rounds = Vec::new();
    let mut floor_rounds: Vec<JobCommits> = Vec::new();
    let mut orders = Vec::new();
    for round in 0..o.rounds {
        eprintln!("completions: round {}/{}…", round + 1, o.rounds);
        // Each side goes first, second and third in turn.
        let mut order = vec![Side::Broker, Side::Graphile, Side::Floor];
        order.rotate_left(round % 3);
        if graphile.is_none() {
            order.retain(|s| *s != Side::Graphile);
        }
        for side in &order {
            match side {
                Side::Broker => {
                    let r = with_db(o, base, &format!("_completions_b{round}"), |db| {
                        broker_round(o, db, jobs)
                    })?;
                    broker_rounds.push(r);
                }
                Side::Graphile => {
                    if let Some(g) = &graphile {
                        let r = with_db(o, base, &format!("_completions_g{round}"), |db| {
                            graphile_round(g, db, jobs, o.seconds)
                        })?;
                        graphile_rounds.push(r);
                    }
                }
                Side::Floor => {
                    let r = with_db(o, base, &format!("_completions_f{round}"), |db| {
                        seed_jobs(db, jobs)?;
                        run_jobs(db, WORKERS, WARM_UP_S, o.seconds)
                    })?;
                    floor_rounds.push(r);
                }
            }
        }
        orders.push(
            order
                .iter()
                .map(|s| s.name())
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    println!();
    println!(
        "{:<8} {:<28} {:>10} {:>12} {:>12} {:>9} {:>9}",
        "round", "order", "broker/s", "graphile/s", "3 commits/s", "÷ graph.", "÷ 3 comm."
    );
    for (r, b) in broker_rounds.iter().enumerate() {
        let g = graphile_rounds.get(r);
        let f = floor_rounds.get(r).map_or(f64::NAN, |f| f.per_s);
        println!(
            "{:<8} {:<28} {:>10.0} {:>12} {:>12.0} {:>9} {:>9.2}",
            r + 1,
            orders.get(r).map_or("", String::as_str),
            b.per_s,
            g.map_or("-".into(), |g| format!("{g:.0}")),
            f,
            g.map_or("-".into(), |g| format!("{:.2}", b.per_s / g)),
            b.per_s / f
        );
    }
    let b = median(broker_rounds.iter().map(|r| r.per_s).collect());
    let call = |k: usize| median(broker_rounds.iter().map(|r| r.call_us[k]).collect());
    let mut kv = vec![
        format!("completions_broker_per_s={b:.0}"),
        format!("completions_pop10_us={:.0}", call(0)),
        format!("completions_patch_running_us={:.0}", call(1)),
        format!("completions_patch_completed_us={:.0}", call(2)),
    ];
    let f = median(floor_rounds.iter().map(|r| r.per_s).collect());
    let floor_ratio = b / f;
    let g = graphile.as_ref().map(|_| median(graphile_rounds.clone()));
    println!(
        "{:<8} {:<28} {b:>10.0} {:>12} {f:>12.0} {:>9} {floor_ratio:>9.2}",
        "median",
        "",
        g.map_or("-".into(), |g| format!("{g:.0}")),
        g.map_or("-".into(), |g| format!("{:.2}", b / g)),
    );
    match (&graphile, g) {
        (Some(gw), Some(g)) => {
            let ratio = b / g;
            println!(
                "broker completions ÷ Graphile Worker {}'s: {ratio:.2} (target ≥ 2)",
                gw.version
            );
            kv.push(format!("completions_graphile_per_s={g:.0}"));
            kv.push(format!("completions_ratio={ratio:.3}"));
            kv.push(format!("completions_graphile_version={}", gw.version));
        }
        _ => println!("*** Graphile Worker was not measured: no ratio ***"),
    }
    let commit = |k: usize| median(floor_rounds.iter().map(|r| r.commit_us[k]).collect());
    println!(
        "broker completions ÷ three bare SQL commits a job ({WORKERS} connections: take with SKIP LOCKED, running, completed): {floor_ratio:.2}; their commits (medians of the rounds' means) {:.0} / {:.0} / {:.0} µs",
        commit(0),
        commit(1),
        commit(2)
    );
    let busy = |v: Vec<f64>| median(v) * 100.0;
    let (busy_b, busy_f) = (
        busy(broker_rounds.iter().map(|r| r.busy).collect()),
        busy(floor_rounds.iter().map(|r| r.busy).collect()),
    );
    println!(
        "the machine's CPU busy over the window (medians, share of both cores): broker {busy_b:.0} %, three commits {busy_f:.0} %"
    );
    kv.push(format!("completions_busy_broker_pct={busy_b:.0}"));
    kv.push(format!("completions_busy_three_commits_pct={busy_f:.0}"));
    kv.push(format!("completions_three_commits_per_s={f:.0}"));
    kv.push(format!("completions_three_commits_ratio={floor_ratio:.3}"));
    let per_pop = median(broker_rounds.iter().map(|r| r.per_pop).collect());
    println!(
        "a broker worker's calls in the window (medians of the rounds' means): pop (limit {LIMIT}, {per_pop:.2} tasks an answer) {:.0} µs, PATCH running {:.0} µs, PATCH completed {:.0} µs",
        call(0),
        call(1),
        call(2)
    );
    let engine = |k: usize| median(broker_rounds.iter().map(|r| r.engine[k]).collect());
    println!(
        "the broker's engine over the rounds (medians): {:.1} commands per batch, {:.0} µs applying and {:.0} µs from BEGIN to COMMIT per batch",
        engine(0),
        engine(1),
        engine(2)
    );
    kv.push(format!("completions_tasks_per_pop={per_pop:.2}"));
    kv.push(format!("completions_commands_per_batch={:.1}", engine(0)));
    kv.push(format!("completions_batch_us={:.0}", engine(2)));
    println!(
        "checks: no task completed twice, no pop empty, every task of the image asked for, the table's completed tasks = the completions answered ({} over the rounds), none left dispatched or running{}",
        thousands(broker_rounds.iter().map(|r| r.completed).sum()),
        if graphile.is_some() {
            "; Graphile Worker: jobs left at every window's end, none failed, every job it ran deleted but those in flight at its stop"
        } else {
            ""
        }
    );
    Ok(kv.join(" "))
}
