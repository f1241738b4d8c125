//! `--wal`: the write-ahead log a job's life writes on PostgreSQL, step by step, against a minimal
//! SQL job queue on the same server in the same run.
//!
//! The broker (its release binary, over its HTTP API, 16 clients): `--jobs` boefje tasks pushed
//! (`POST /schedulers/boefje/push`, each new, so each also gets mula's schedule of its hash),
//! popped (`POST /schedulers/boefje/pop?limit=1`), PATCHed `running`, PATCHed `completed`. The
//! baseline: a table with a `bigserial` key and one index for the pick, the same payload, single
//! row `INSERT` commits and `DELETE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED) RETURNING` (a
//! job's whole life there: it has no `running` or `completed`).
//!
//! The server is shared (other databases write too), so the bytes are not a difference of
//! `pg_current_wal_lsn()`: `pg_waldump` reads the log between the marks and only the records of
//! this scenario's database count (those naming one of its relations, and the commit records of
//! the transactions that wrote them). Each side starts right after a `CHECKPOINT`, so both pay
//! the full-page images of the pages they touch first the same way; the figures are given with
//! and without those images (a server whose checkpoints are far apart pays them less often).
//! Beside the totals, the relations (tables and indexes) that wrote the most: where a push's bytes
//! go.
//!
//! `pg_waldump` must be able to read the server's `pg_wal` (the same machine, run as its owner or
//! root); `--pg-wal DIR` names the directory (default: the server's `data_directory`/pg_wal). A
//! physical replication slot, made for the run and dropped after it, keeps the log from being
//! recycled by a checkpoint before it is read.

use std::collections::{HashMap, HashSet};
use std::process::Command;

use diesel::sql_types::{BigInt, Text};
use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl};

use super::harness::http::{current_thread, patch_request, pop_request, push_request, send_all};
use super::harness::instance::{start_broker, stop_broker};
use super::harness::postgres::{machine, pg_exec, with_db};
use super::{Options, Result};

/// HTTP clients of the broker side, connections of the baseline.
const CLIENTS: usize = 16;

/// Jobs run through both sides before the measurement (statements prepared, files extended).
const WARM_UP: usize = 200;

#[derive(QueryableByName)]
struct Lsn {
    #[diesel(sql_type = Text)]
    lsn: String,
}

fn lsn(conn: &mut PgConnection) -> Result<String> {
    Ok(
        diesel::sql_query("SELECT pg_current_wal_insert_lsn()::text AS lsn")
            .get_result::<Lsn>(conn)?
            .lsn,
    )
}

/// `X/Y` as a number.
fn lsn_value(s: &str) -> Result<u64> {
    let (hi, lo) = s.split_once('/').ok_or("not an LSN")?;
    Ok((u64::from_str_radix(hi, 16)? << 32) | u64::from_str_radix(lo, 16)?)
}

/// WAL of one database between two marks: all bytes, the full-page images among them, and by
/// relation.
#[derive(Default, Clone)]
struct Wal {
    bytes: u64,
    fpi: u64,
    /// (bytes, fpi bytes) by relfilenode.
    by_rel: HashMap<u32, (u64, u64)>,
    /// Commit records (and other records without a relation) of its transactions.
    commits: u64,
}

/// Reads the log from `marks[0]` to the last mark with `pg_waldump` and sums, per step between two
/// marks, the records of database `db_oid`.
fn waldump(dir: &str, major: i64, db_oid: u32, marks: &[String]) -> Result<Vec<Wal>> {
    let (Some(first), Some(last)) = (marks.first(), marks.last()) else {
        return Ok(Vec::new());
    };
    // On PATH, else where Debian puts the server's own (of the server's major version).
    let bin = [
        "pg_waldump".to_owned(),
        format!("/usr/lib/postgresql/{major}/bin/pg_waldump"),
    ]
    .into_iter()
    .find(|b| Command::new(b).arg("--version").output().is_ok())
    .ok_or("pg_waldump not found: put the server's bin directory on PATH")?;
    let out = Command::new(bin)
        .args(["-p", dir, "-s", first, "-e", last])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.is_empty() {
        return Err(format!(
            "pg_waldump read nothing: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let bounds: Vec<u64> = marks.iter().map(|m| lsn_value(m)).collect::<Result<_>>()?;
    // Records without a relation (commits) count for a transaction that wrote in this database;
    // a transaction's commit comes after its other records, so one pass suffices.
    let mut xids: HashSet<u64> = HashSet::new();
    let mut steps = vec![Wal::default(); marks.len() - 1];
    for line in text.lines() {
        let Some(rec) = parse(line) else { continue };
        let Some(step) = bounds
            .windows(2)
            .position(|w| rec.lsn >= w[0] && rec.lsn < w[1])
        else {
            continue;
        };
        let s = &mut steps[step];
        match rec.rel {
            Some((db, rel)) if db == db_oid => {
                xids.insert(rec.xid);
                s.bytes += rec.total;
                s.fpi += rec.fpi;
                let e = s.by_rel.entry(rel).or_default();
                e.0 += rec.total;
                e.1 += rec.fpi;
            }
            Some(_) => {}
            None if rec.xid != 0 && xids.contains(&rec.xid) => {
                s.bytes += rec.total;
                s.commits += rec.total;
            }
            None => {}
        }
    }
    Ok(steps)
}

struct Record {
    lsn: u64,
    xid: u64,
    total: u64,
    fpi: u64,
    /// (database, relfilenode) of the first block reference.
    rel: Option<(u32, u32)>,
}

/// One line of `pg_waldump`: `rmgr: Heap len (rec/tot): 59/ 7923, tx: 745, lsn: 0/01A2B3C8, prev
/// …, desc: … blkref #0: rel 1663/16384/16385 blk 0 FPW`.
fn parse(line: &str) -> Option<Record> {
    let after = |key: &str| line.split_once(key).map(|(_, r)| r.trim_start());
    let lens = after("len (rec/tot):")?;
    let (rec, rest) = lens.split_once('/')?;
    let rec: u64 = rec.trim().parse().ok()?;
    let total: u64 = rest.split(',').next()?.trim().parse().ok()?;
    let xid: u64 = after("tx:")?.split(',').next()?.trim().parse().ok()?;
    let lsn = after("lsn:")?.split(',').next()?.trim();
    let lsn = lsn_value(lsn).ok()?;
    let rel = after("rel ").and_then(|r| {
        let mut parts = r.split(|c: char| c == '/' || c.is_whitespace());
        let _tablespace = parts.next()?;
        let db: u32 = parts.next()?.parse().ok()?;
        let rel: u32 = parts.next()?.parse().ok()?;
        Some((db, rel))
    });
    let fpi = if line.contains("FPW") { total - rec } else { 0 };
    Some(Record {
        lsn,
        xid,
        total,
        fpi,
        rel,
    })
}

#[derive(QueryableByName)]
struct RelName {
    #[diesel(sql_type = BigInt)]
    node: i64,
    #[diesel(sql_type = Text)]
    name: String,
}

/// Relation names by relfilenode, for the breakdown.
fn rel_names(conn: &mut PgConnection) -> Result<HashMap<u32, String>> {
    Ok(diesel::sql_query(
        "SELECT pg_relation_filenode(oid)::bigint AS node, relname::text AS name FROM pg_class \
         WHERE pg_relation_filenode(oid) IS NOT NULL",
    )
    .load::<RelName>(conn)?
    .into_iter()
    .filter_map(|r| u32::try_from(r.node).ok().map(|n| (n, r.name)))
    .collect())
}

#[derive(QueryableByName)]
struct Num {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

fn number(conn: &mut PgConnection, sql: &str) -> Result<i64> {
    Ok(diesel::sql_query(sql).get_result::<Num>(conn)?.n)
}

/// The broker's side: `jobs` boefje tasks through their life over HTTP; the marks between steps.
fn broker_life(
    rt: &tokio::runtime::Runtime,
    port: u16,
    conn: &mut PgConnection,
    jobs: usize,
    round: usize,
) -> Result<Vec<String>> {
    let mut marks = vec![lsn(conn)?];
    let pushes = (0..jobs)
        .map(|i| push_request("boefje", CLIENTS, i, round))
        .collect();
    let ids = rt.block_on(send_all(port, CLIENTS, pushes, 201))?;
    marks.push(lsn(conn)?);
    let pops = (0..jobs).map(|_| pop_request("boefje")).collect();
    let popped = rt.block_on(send_all(port, CLIENTS, pops, 200))?;
    marks.push(lsn(conn)?);
    if popped.len() != jobs || ids.len() != jobs {
        return Err(format!(
            "{} pushed, {} popped of {jobs}: the queue held other work",
            ids.len(),
            popped.len()
        )
        .into());
    }
    for status in ["running", "completed"] {
        let patches = popped.iter().map(|id| patch_request(id, status)).collect();
        rt.block_on(send_all(port, CLIENTS, patches, 200))?;
        marks.push(lsn(conn)?);
    }
    Ok(marks)
}

/// The minimal SQL job queue's side: `jobs` single-row INSERT commits, then as many
/// `DELETE … SKIP LOCKED RETURNING` pops, over [`CLIENTS`] connections.
fn baseline_life(db: &str, conn: &mut PgConnection, jobs: usize) -> Result<Vec<String>> {
    let payload = String::from_utf8(push_request("boefje", 0, 0, 0))?;
    let payload = payload
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
        .replace('\'', "''");
    let run = |sql: String| -> Result<()> {
        let per = jobs.div_ceil(CLIENTS);
        let handles: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (db, sql) = (db.to_owned(), sql.clone());
                std::thread::spawn(move || -> Result<()> {
                    let mut conn = PgConnection::establish(&db)?;
                    for k in (c * per..((c + 1) * per).min(jobs)).map(|k| k % 1000) {
                        let n = diesel::sql_query(sql.replace("$K", &k.to_string()))
                            .execute(&mut conn)?;
                        if n != 1 {
                            return Err("the baseline job queue ran dry".into());
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "baseline thread panicked")??;
        }
        Ok(())
    };
    let mut marks = vec![lsn(conn)?];
    run(format!(
        "INSERT INTO bench_jobs (queue, priority, payload) VALUES ('boefje', $K, '{payload}')"
    ))?;
    marks.push(lsn(conn)?);
    run(
        "DELETE FROM bench_jobs WHERE id = (SELECT id FROM bench_jobs WHERE queue = 'boefje' \
         ORDER BY priority, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id"
            .into(),
    )?;
    marks.push(lsn(conn)?);
    Ok(marks)
}

/// A physical replication slot that keeps the server's log from its creation on, dropped with it.
struct Slot {
    db: String,
    name: String,
}

impl Slot {
    fn create(db: &str) -> Result<Slot> {
        let name = format!("kat_bench_wal_{}", std::process::id());
        pg_exec(
            db,
            &format!("SELECT pg_create_physical_replication_slot('{name}', true)"),
        )?;
        Ok(Slot {
            db: db.to_owned(),
            name,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Err(e) = pg_exec(
            &self.db,
            &format!("SELECT pg_drop_replication_slot('{}')", self.name),
        ) {
            eprintln!(
                "warning: replication slot {} not dropped ({e}); drop it by hand, it holds the server's log",
                self.name
            );
        }
    }
}

/// Bytes per job.
fn per(b: u64, jobs: usize) -> f64 {
    b as f64 / jobs.max(1) as f64
}

pub fn run_wal(o: &Options, base: &str) -> Result<String> {
    with_db(o, base, "_wal", |db| {
        let jobs = o.jobs;
        println!(
            "WAL per job's life: {jobs} jobs, {CLIENTS} clients; the broker (push, pop, running, completed over HTTP) against a minimal SQL job queue (INSERT, DELETE … SKIP LOCKED RETURNING) in one database"
        );
        println!("{}", machine(db)?);
        let mut conn = PgConnection::establish(db)?;
        let dir = match &o.pg_wal {
            Some(d) => d.clone(),
            None => {
                #[derive(QueryableByName)]
                struct Dir {
                    #[diesel(sql_type = Text)]
                    data_directory: String,
                }
                let d: Dir = diesel::sql_query("SHOW data_directory").get_result(&mut conn)?;
                format!("{}/pg_wal", d.data_directory)
            }
        };
        let db_oid = u32::try_from(number(
            &mut conn,
            "SELECT oid::bigint AS n FROM pg_database WHERE datname = current_database()",
        )?)?;
        let major = number(
            &mut conn,
            "SELECT current_setting('server_version_num')::bigint / 10000 AS n",
        )?;
        pg_exec(
            db,
            "CREATE TABLE bench_jobs (id bigserial PRIMARY KEY, queue text NOT NULL, \
             priority int NOT NULL, run_at timestamptz NOT NULL DEFAULT now(), payload text NOT NULL); \
             CREATE INDEX bench_jobs_pick ON bench_jobs (queue, priority, id);",
        )?;
        // A checkpoint (ours, the server's, another client's) may recycle the log before it is
        // read: a replication slot holds it from here until the slot is dropped.
        let _slot = Slot::create(db)?;
        let broker = start_broker(db, jobs * 4 + 10_000)?;
        let rt = current_thread()?;
        // Warm up both sides: statements prepared, the first pages and files made.
        broker_life(&rt, broker.port, &mut conn, WARM_UP, 0)?;
        baseline_life(db, &mut conn, WARM_UP)?;

        let mut rounds = Vec::new();
        for round in 1..=o.rounds {
            eprintln!("round {round}/{}…", o.rounds);
            let broker_first = round % 2 == 1;
            let mut b = Vec::new();
            let mut l = Vec::new();
            for turn in 0..2 {
                pg_exec(db, "CHECKPOINT")?;
                if (turn == 0) == broker_first {
                    let marks = broker_life(&rt, broker.port, &mut conn, jobs, round)?;
                    b = waldump(&dir, major, db_oid, &marks)?;
                } else {
                    let marks = baseline_life(db, &mut conn, jobs)?;
                    l = waldump(&dir, major, db_oid, &marks)?;
                }
            }
            let steps = |w: &[Wal]| {
                w.iter()
                    .map(|s| format!("{:.0}", per(s.bytes, jobs)))
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            eprintln!(
                "round {round}: broker push / pop / running / completed {} B per job; baseline insert / delete {} B",
                steps(&b),
                steps(&l)
            );
            rounds.push((b, l));
        }
        stop_broker(broker)?;
        let names = rel_names(&mut conn)?;

        // The median round by the broker's total.
        rounds.sort_by_key(|(b, _)| b.iter().map(|w| w.bytes).sum::<u64>());
        let (b, l) = rounds
            .get(rounds.len() / 2)
            .cloned()
            .ok_or("no rounds ran")?;
        let total = |w: &[Wal]| w.iter().fold((0, 0), |a, s| (a.0 + s.bytes, a.1 + s.fpi));
        println!();
        println!(
            "{:<40} {:>12} {:>14} {:>12}",
            "WAL per job (median round)", "bytes", "without FPIs", "commits"
        );
        let row = |name: &str, w: &Wal| {
            println!(
                "{name:<40} {:>12.0} {:>14.0} {:>12.0}",
                per(w.bytes, jobs),
                per(w.bytes - w.fpi, jobs),
                per(w.commits, jobs)
            );
        };
        for (name, w) in [
            "broker push",
            "broker pop",
            "broker PATCH running",
            "broker PATCH completed",
        ]
        .iter()
        .zip(&b)
        {
            row(name, w);
        }
        for (name, w) in ["baseline INSERT", "baseline DELETE … SKIP LOCKED"]
            .iter()
            .zip(&l)
        {
            row(name, w);
        }
        let (bt, bf) = total(&b);
        let (lt, lf) = total(&l);
        println!(
            "{:<40} {:>12.0} {:>14.0}",
            "broker, a job's whole life",
            per(bt, jobs),
            per(bt - bf, jobs)
        );
        println!(
            "{:<40} {:>12.0} {:>14.0}",
            "baseline, a job's whole life",
            per(lt, jobs),
            per(lt - lf, jobs)
        );
        println!(
            "ratio broker / baseline: {:.2} (with FPIs), {:.2} (without)",
            bt as f64 / lt.max(1) as f64,
            (bt - bf) as f64 / (lt - lf).max(1) as f64
        );
        println!();
        println!("where the broker's bytes go, per job (median round; FPI part in brackets):");
        for (step, w) in ["push", "pop", "PATCH running", "PATCH completed"]
            .iter()
            .zip(&b)
        {
            // Largest first (two indexes of the same key types write the same bytes).
            let mut rels: Vec<(u64, String)> = w
                .by_rel
                .iter()
                .map(|(rel, (bytes, fpi))| {
                    let name = names
                        .get(rel)
                        .cloned()
                        .unwrap_or_else(|| format!("relfilenode {rel}"));
                    (
                        *bytes,
                        format!("{name} {:.0} ({:.0})", per(*bytes, jobs), per(*fpi, jobs)),
                    )
                })
                .collect();
            rels.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            let list: Vec<String> = rels.into_iter().map(|(_, r)| r).collect();
            println!(
                "  {step}: {}; commits {:.0}",
                list.join(", "),
                per(w.commits, jobs)
            );
        }
        let step = |w: &[Wal], k: usize| w.get(k).map_or(f64::NAN, |s| per(s.bytes, jobs));
        let step_nofpi =
            |w: &[Wal], k: usize| w.get(k).map_or(f64::NAN, |s| per(s.bytes - s.fpi, jobs));
        Ok(format!(
            "wal_jobs={jobs} wal_life_b={:.0} wal_life_nofpi_b={:.0} wal_push_b={:.0} wal_push_nofpi_b={:.0} \
             wal_pop_b={:.0} wal_running_b={:.0} wal_completed_b={:.0} wal_baseline_life_b={:.0} \
             wal_baseline_life_nofpi_b={:.0} wal_life_ratio={:.3}",
            per(bt, jobs),
            per(bt - bf, jobs),
            step(&b, 0),
            step_nofpi(&b, 0),
            step(&b, 1),
            step(&b, 2),
            step(&b, 3),
            per(lt, jobs),
            per(lt - lf, jobs),
            bt as f64 / lt.max(1) as f64
        ))
    })
}
