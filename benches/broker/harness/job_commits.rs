//! A remote worker's job in bare SQL: each of `workers` threads, on a connection of
//! its own, takes a job of its image with `UPDATE … FOR UPDATE SKIP LOCKED RETURNING`, then marks
//! it `running`, then `completed`: three single-statement commits in a row, as a boefje runner
//! makes three durable requests in a row (pop, `PATCH running`, `PATCH completed`), with nothing
//! between them: no HTTP, no JSON, no batching but the server's own group commit. What each
//! durable request costs unbatched; a broker that batches shares commits between requests.

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::sql_types::BigInt;
use diesel::{Connection, PgConnection, RunQueryDsl};

use super::postgres::{IMAGES, image_name, pg_exec, pg_number};
use super::stats::{CpuSpan, cpu_ticks};
use crate::Result;

/// What the floor's round saw.
pub struct JobCommits {
    /// Jobs completed in the window, per second.
    pub per_s: f64,
    /// Mean µs per commit in the window: take, `running`, `completed`.
    pub commit_us: [f64; 3],
    /// The machine's CPU busy over the window, as a share of both cores.
    pub busy: f64,
}

/// Seeds `jobs` queued jobs over the seed's images, with an index of queued jobs by image and
/// priority (the broker's pop reads its heap; this reads the index), and a checkpoint after.
pub fn seed_jobs(url: &str, jobs: usize) -> Result<()> {
    pg_exec(
        url,
        &format!(
            "CREATE TABLE bench_jobs (id bigserial PRIMARY KEY, image text NOT NULL,
                                      prio int NOT NULL, status text NOT NULL);
             INSERT INTO bench_jobs (image, prio, status)
               SELECT 'ghcr.io/minvws/openkat/img' || (g % {IMAGES}) || ':latest',
                      (random() * 1000)::int, 'queued'
               FROM generate_series(1, {jobs}) g;
             CREATE INDEX bench_jobs_queued ON bench_jobs (image, prio, id) WHERE status = 'queued';"
        ),
    )?;
    // Each on its own: VACUUM cannot run in the implicit transaction of several statements.
    pg_exec(url, "VACUUM ANALYZE bench_jobs")?;
    pg_exec(url, "CHECKPOINT")
}

#[derive(diesel::QueryableByName)]
struct Taken {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// One worker's tally: jobs completed in the window, summed µs and commits per kind in it.
#[derive(Default)]
struct Tally {
    completed: i64,
    in_window: usize,
    us: [u64; 3],
    commits: [u64; 3],
}

/// Runs `workers` threads over `warm_up + seconds`, counting jobs completed in the window.
/// Fails when a job is taken twice, the queue runs dry, or the table afterwards holds other than
/// the jobs completed.
pub fn run_jobs(url: &str, workers: usize, warm_up: f64, seconds: f64) -> Result<JobCommits> {
    let start = Instant::now();
    let window = (
        Duration::from_secs_f64(warm_up),
        Duration::from_secs_f64(warm_up + seconds),
    );
    let handles: Vec<_> = (0..workers)
        .map(|c| {
            let url = url.to_owned();
            std::thread::spawn(move || -> Result<Tally> {
                let mut conn = PgConnection::establish(&url)?;
                // Prepared once per connection, as a service's statements are: each commit then
                // costs the server an `EXECUTE` of a statement parsed once (the broker's are
                // prepared too).
                conn.batch_execute(
                    "PREPARE take(text) AS UPDATE bench_jobs SET status = 'dispatched' WHERE id = \
                       (SELECT id FROM bench_jobs WHERE status = 'queued' AND image = $1 \
                        ORDER BY prio, id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id;
                     PREPARE mark(text, bigint, text) AS \
                       UPDATE bench_jobs SET status = $1 WHERE id = $2 AND status = $3",
                )?;
                let image = image_name(c % IMAGES);
                let mut t = Tally::default();
                while start.elapsed() < window.1 {
                    let issued = start.elapsed();
                    let taken: Vec<Taken> =
                        diesel::sql_query(format!("EXECUTE take('{image}')")).load(&mut conn)?;
                    let id = taken
                        .first()
                        .ok_or("the jobs' queue ran dry (raise SEED_PER_SECOND)")?
                        .id;
                    let mut at = [issued, start.elapsed(), Duration::ZERO, Duration::ZERO];
                    for (k, (from, to)) in [("dispatched", "running"), ("running", "completed")]
                        .into_iter()
                        .enumerate()
                    {
                        let changed =
                            diesel::sql_query(format!("EXECUTE mark('{to}', {id}, '{from}')"))
                                .execute(&mut conn)?;
                        if changed != 1 {
                            return Err(format!("job {id} was not {from} when set {to}").into());
                        }
                        at[k + 2] = start.elapsed();
                    }
                    t.completed += 1;
                    if at[3] >= window.0 && at[3] < window.1 {
                        t.in_window += 1;
                        for k in 0..3 {
                            t.us[k] += (at[k + 1] - at[k]).as_micros() as u64;
                            t.commits[k] += 1;
                        }
                    }
                }
                Ok(t)
            })
        })
        .collect();
    let busy = busy_in(start, window);
    let mut tallies = Vec::with_capacity(workers);
    for h in handles {
        tallies.push(h.join().map_err(|_| "a job thread panicked")??);
    }
    let mut commit_us = [0.0; 3];
    for (k, us) in commit_us.iter_mut().enumerate() {
        let sum: u64 = tallies.iter().map(|t| t.us[k]).sum();
        let n: u64 = tallies.iter().map(|t| t.commits[k]).sum();
        *us = sum as f64 / n.max(1) as f64;
    }
    let completed: i64 = tallies.iter().map(|t| t.completed).sum();
    let in_table = pg_number(
        url,
        "SELECT COUNT(*) AS n FROM bench_jobs WHERE status = 'completed'",
    )?;
    let held = pg_number(
        url,
        "SELECT COUNT(*) AS n FROM bench_jobs WHERE status IN ('dispatched', 'running')",
    )?;
    if in_table != completed || held != 0 {
        return Err(format!(
            "the jobs' table holds {in_table} completed and {held} held jobs; {completed} were completed"
        )
        .into());
    }
    let in_window: usize = tallies.iter().map(|t| t.in_window).sum();
    Ok(JobCommits {
        per_s: in_window as f64 / seconds,
        commit_us,
        busy,
    })
}

/// The machine's CPU busy share from `start + window.0` to `start + window.1`, read by the
/// calling thread, which sleeps until each end.
pub fn busy_in(start: Instant, window: (Duration, Duration)) -> f64 {
    let at = |d: Duration| {
        if let Some(wait) = (start + d).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        cpu_ticks()
    };
    let from = at(window.0);
    let mut span = CpuSpan::default();
    span.add(from, at(window.1));
    span.share()
}
