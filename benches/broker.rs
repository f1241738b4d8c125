//! The benchmark harness: the broker over HTTP against a bare PostgreSQL SKIP LOCKED queue and
//! the same server's no-op endpoint, side by side on one PostgreSQL server, in alternating rounds.
//!
//! ```sh
//! cargo bench --bench broker                    # N = 1,000,000 queued tasks, 3 rounds
//! cargo bench --bench broker -- --tasks 100000 --seconds 3   # a quick run
//! ```
//!
//! Options: `--tasks N`, `--rounds R` (≥ 3), `--seconds S` per measurement, `--clients C` (HTTP,
//! default 64), `--pg-clients P` (baseline, default 8), `--pg URL` (a maintenance database; the
//! harness creates and drops its own), `--keep` (keep the database).
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
//! - resident memory per queued task against PostgreSQL's on-disk bytes per baseline row.
//!
//! It also checks while it measures: no popped id is seen twice, and every acknowledged push is
//! in the table afterwards. The last line is `key=value` pairs for machines.

use std::collections::HashSet;
use std::io::{BufRead, BufReader as StdBufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Text};
use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

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
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--tasks" => o.tasks = value()?.replace('_', "").parse()?,
            "--rounds" => o.rounds = value()?.parse()?,
            "--seconds" => o.seconds = value()?.parse()?,
            "--clients" => o.clients = value()?.parse()?,
            "--pg-clients" => o.pg_clients = value()?.parse()?,
            "--pg" => o.pg = value()?,
            "--keep" => o.keep = true,
            "--profile-pops" => o.profile_pops = Some(value()?.parse()?),
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
    Ok(o)
}

// ------------------------------------------------------------------------------------ statistics

#[derive(Debug, Clone, Copy, Default)]
struct Figure {
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

fn seed_ceiling(url: &str, n: usize) -> Result<()> {
    pg_exec(
        url,
        &format!(
            "INSERT INTO tasks (id, scheduler_id, schedule_id, organisation, type, hash, priority, data, \
               status, attempts, created_at, modified_at)
             SELECT t.id, '{CEILING_SCHEDULER}', NULL, 'org' || (t.g % 300), 'boefje', md5(t.id), (t.g % 1000) + 2,
               json_build_object('boefje', json_build_object('id', 'bench-' || (t.g % 50),
                 'oci_image', 'ghcr.io/minvws/openkat/bench:latest'),
                 'input_ooi', 'Hostname|internet|host' || t.g || '.example.com',
                 'organization', 'org' || (t.g % 300), 'id', t.id)::text,
               'queued', 0, now() AT TIME ZONE 'utc', now() AT TIME ZONE 'utc'
             FROM (SELECT g, gen_random_uuid()::text AS id FROM generate_series(1, {n}) g) t"
        ),
    )
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

/// Queues `n` tasks across the three schedulers straight in the table (pushing a million over
/// HTTP would take longer than the benchmark), with payloads shaped like real ones.
fn seed_tasks(url: &str, n: usize) -> Result<()> {
    pg_exec(
        url,
        &format!(
            "INSERT INTO tasks (id, scheduler_id, schedule_id, organisation, type, hash, priority, data, \
               status, attempts, created_at, modified_at)
             SELECT t.id, t.s, NULL, 'org' || (t.g % 300), t.s, md5(t.id), (t.g % 1000) + 2,
               CASE t.s
                 WHEN 'boefje' THEN json_build_object('boefje', json_build_object('id', 'bench-' || (t.g % 50),
                     'oci_image', 'ghcr.io/minvws/openkat/bench:latest'),
                     'input_ooi', 'Hostname|internet|host' || t.g || '.example.com',
                     'organization', 'org' || (t.g % 300), 'id', t.id)::text
                 WHEN 'normalizer' THEN json_build_object('normalizer', json_build_object('id', 'kat_bench_normalize'),
                     'raw_data', json_build_object('id', t.id, 'boefje_meta', json_build_object('id', t.id,
                     'organization', 'org' || (t.g % 300))), 'id', t.id)::text
                 ELSE json_build_object('report_recipe_id', 'recipe-' || t.g, 'organisation_id',
                     'org' || (t.g % 300), 'id', t.id)::text
               END,
               'queued', 0, t.created, t.created
             FROM (SELECT g, gen_random_uuid()::text AS id, (ARRAY['boefje','normalizer','report'])[g % 3 + 1] AS s,
                          (now() AT TIME ZONE 'utc') - make_interval(secs => ({n} - g) / 1000000.0) AS created
                   FROM generate_series(1, {n}) g) t"
        ),
    )?;
    pg_exec(url, "VACUUM ANALYZE tasks")
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
    let deadline = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let handles: Vec<_> = (0..conns)
        .map(|c| {
            let url = url.to_owned();
            std::thread::spawn(move || -> Result<(usize, Vec<u32>)> {
                let mut conn = PgConnection::establish(&url)?;
                let mut lat = Vec::new();
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
                    lat.push(u32::try_from(scheduled.elapsed().as_micros()).unwrap_or(u32::MAX));
                }
                Ok((ops, lat))
            })
        })
        .collect();
    let mut ops = 0;
    let mut lat = Vec::new();
    for h in handles {
        let (o, l) = h.join().map_err(|_| "baseline thread panicked")??;
        ops += o;
        lat.extend(l);
    }
    Ok(figure(ops, start.elapsed(), lat))
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
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kat-scheduler"))
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
        get("scheduler_engine_apply_microseconds_total "),
        get("scheduler_engine_batch_microseconds_total "),
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
}

fn copy_out_seconds(db: &str) -> Result<f64> {
    let started = Instant::now();
    let status = Command::new("psql")
        .arg(db)
        .arg("-qc")
        .arg("\\copy (SELECT id, scheduler_id, priority, created_at FROM tasks WHERE status = 'queued') TO '/dev/null'")
        .status()?;
    if !status.success() {
        return Err("psql \\copy failed".into());
    }
    Ok(started.elapsed().as_secs_f64())
}

fn main() -> Result<()> {
    let o = options()?;
    let name = format!("kat_bench_{}", std::process::id());
    let base =
        o.pg.rsplit_once('/')
            .map(|(b, _)| b)
            .unwrap_or(&o.pg)
            .to_owned();
    let db = format!("{base}/{name}");
    pg_exec(&o.pg, &format!("CREATE DATABASE {name}"))?;
    let result = run(&o, &db);
    if !o.keep {
        let _ = pg_exec(
            &o.pg,
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        );
    }
    result
}

fn run(o: &Options, db: &str) -> Result<()> {
    let maxsize = o.tasks * 2 + 1_000_000;
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
    println!(
        "kat-scheduler benchmark: {} tasks, {} rounds of {} s, {} HTTP clients, {} baseline connections",
        o.tasks, o.rounds, o.seconds, o.clients, o.pg_clients
    );
    println!(
        "machine: {} CPUs ({cpu}); PostgreSQL synchronous_commit={sync}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );

    // Empty broker: migrations, then the resident size with nothing queued.
    let empty = start_broker(db, maxsize)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(http_load(empty.port, 8, 0.5, None, Op::Noop, 0))?;
    let rss_empty = rss_bytes(empty.child.id())?;
    stop_broker(empty)?;

    eprintln!("seeding {} tasks and {} baseline rows…", o.tasks, o.tasks);
    seed_tasks(db, o.tasks)?;
    seed_baseline(db, o.tasks)?;
    seed_ceiling(db, o.tasks.max(300_000))?;
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
        return stop_broker(broker);
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
        for turn in 0..2 {
            if (turn == 0) == broker_first {
                let before = rt.block_on(engine_counters(broker.port))?;
                let (f, r) = rt.block_on(http_load(
                    broker.port,
                    o.clients,
                    o.seconds,
                    None,
                    Op::Pop,
                    round,
                ))?;
                pop_engine = engine_delta(before, rt.block_on(engine_counters(broker.port))?);
                record(r.ids, &mut popped)?;
                broker_pop = f;
            } else {
                baseline_pop = baseline(db, o.pg_clients, o.seconds, None, "pop")?;
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
                let (f, r) = rt.block_on(http_load(
                    broker.port,
                    o.clients,
                    o.seconds,
                    None,
                    Op::Push,
                    round,
                ))?;
                push_engine = engine_delta(before, rt.block_on(engine_counters(broker.port))?);
                acked_pushes.extend(r.ids);
                broker_push = f;
            } else {
                baseline_insert = baseline(db, o.pg_clients, o.seconds, None, "insert")?;
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
        "resident memory: {:.1} MB empty, {:.1} MB with {} queued: {:.1} B per task; baseline table on disk: {:.1} B per row",
        rss_empty as f64 / 1e6,
        rss_loaded as f64 / 1e6,
        o.tasks,
        rss_per_task,
        pg_bytes_per_row
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
         write_p98_half_load_us={write_p98:.0} pop_p99_lower_bound_vs_noop={:.3}",
        ceiling / lp.ops_per_sec,
        push_ceiling / lins.ops_per_sec,
        bound / nh.p99_us
    ));
    for (k, v, _) in ratios {
        line.push_str(&format!(" {k}={v:.3}"));
    }
    println!("{line}");
    Ok(())
}
