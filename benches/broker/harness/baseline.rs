//! The baseline: a bare PostgreSQL queue (`bench_q`, an index on `(queue, prio, id)`) popped with
//! `DELETE … FOR UPDATE SKIP LOCKED RETURNING` and filled with single-row INSERT commits, at full
//! speed or paced, from one thread per connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use diesel::sql_types::BigInt;
use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl};

use super::postgres::pg_exec;
use super::stats::{Figure, figure, micros_since};
use crate::Result;

pub fn seed_baseline(url: &str, n: usize) -> Result<()> {
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
pub fn baseline(
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
pub struct LoadRun {
    pub samples: Vec<(u32, u32)>,
    latencies: Vec<u32>,
    pub exhausted_us: Option<u32>,
    pub elapsed: Duration,
}

/// The baseline, stopping early once `budget` operations were started (if given).
pub fn baseline_run(
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
pub fn refill_baseline(url: &str, n: usize) -> Result<()> {
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
