//! Schedule links in batches: the schedules of concurrent pushes written together.
//!
//! Every client push of boefje or report work, and every planned task, first needs the schedule
//! of its hash (made when missing). One transaction per push made that the push path's bound, so
//! links go through one task that takes every link waiting when it is free and writes all of
//! them in one transaction, as an engine does with its commands: under load a transaction serves
//! many pushes, and alone a link waits for nothing.

use std::collections::HashMap;

use tokio::sync::{mpsc, oneshot};

use super::ScheduleError;
use crate::storage::schedules::{self, ScheduleRow};
use crate::storage::{self, DbPool, StorageError, WriterConn};

/// Links waiting for the linker at most; further callers wait for room.
const WAITING_MAX: usize = 1024;
/// Schedule rows written in one transaction at most.
const BATCH_ROWS: usize = 2_000;

/// The schedule id of each hash written or found.
type Ids = HashMap<String, String>;

struct Job {
    rows: Vec<ScheduleRow>,
    reply: oneshot::Sender<Result<Ids, ScheduleError>>,
}

/// A handle to the linker task.
pub(super) struct Linker {
    tx: mpsc::Sender<Job>,
}

impl Linker {
    /// Starts the linker on `pool`. `asynchronous`: commit without waiting for the disk (see
    /// `Schedules::asynchronous_links`).
    pub fn start(pool: DbPool, asynchronous: bool) -> Linker {
        let (tx, rx) = mpsc::channel(WAITING_MAX);
        tokio::spawn(run(pool, asynchronous, rx));
        Linker { tx }
    }

    /// Writes `rows` where their hash has no schedule yet; answers the schedule id of each hash.
    pub async fn ensure(&self, rows: Vec<ScheduleRow>) -> Result<Ids, ScheduleError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || ScheduleError::Unavailable("the schedule linker stopped".into());
        self.tx
            .send(Job { rows, reply })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(pool: DbPool, asynchronous: bool, mut rx: mpsc::Receiver<Job>) {
    // The linker's own connection, kept between batches as an engine keeps its own (no check-out
    // and no change of commit mode per batch); dropped after a failure.
    let mut conn: Option<WriterConn> = None;
    while let Some(first) = rx.recv().await {
        let mut rows = first.rows.len();
        let mut jobs = vec![first];
        while rows < BATCH_ROWS {
            let Ok(job) = rx.try_recv() else { break };
            rows += job.rows.len();
            jobs.push(job);
        }
        let all: Vec<ScheduleRow> = jobs.iter().flat_map(|j| j.rows.iter().cloned()).collect();
        let (p, held) = (pool.clone(), conn.take());
        let (kept, result) =
            tokio::task::spawn_blocking(move || write(&p, held, asynchronous, &all))
                .await
                .unwrap_or_else(|e| (None, Err(ScheduleError::Internal(format!("linker: {e}")))));
        conn = kept;
        for job in jobs {
            let answer = match &result {
                Ok(ids) => Ok(ids.clone()),
                Err(ScheduleError::Unavailable(m)) => Err(ScheduleError::Unavailable(m.clone())),
                Err(e) => Err(ScheduleError::Internal(e.to_string())),
            };
            let _ = job.reply.send(answer);
        }
    }
}

/// Writes `rows` in one transaction on `held`, and once more on a fresh connection if that
/// fails (the kept connection may have died with a database restart, and a push whose link
/// fails goes ahead unlinked); gives the connection back unless the write failed.
fn write(
    pool: &DbPool,
    held: Option<WriterConn>,
    asynchronous: bool,
    rows: &[ScheduleRow],
) -> (Option<WriterConn>, Result<Ids, ScheduleError>) {
    let again = held.is_some();
    match write_on(pool, held, asynchronous, rows) {
        (None, Err(_)) if again => write_on(pool, None, asynchronous, rows),
        done => done,
    }
}

fn write_on(
    pool: &DbPool,
    held: Option<WriterConn>,
    asynchronous: bool,
    rows: &[ScheduleRow],
) -> (Option<WriterConn>, Result<Ids, ScheduleError>) {
    use diesel::Connection;
    let mut conn = match held.map_or_else(|| WriterConn::checkout(pool, asynchronous), Ok) {
        Ok(c) => c,
        Err(e) => return (None, Err(e.into())),
    };
    let result = conn.transaction::<_, ScheduleError, _>(|c| {
        Ok(schedules::ensure(c, rows).map_err(StorageError::from)?)
    });
    match result {
        Ok(ids) => (Some(conn), Ok(ids)),
        Err(ScheduleError::Internal(m)) if !storage::reachable(pool) => {
            (None, Err(ScheduleError::Unavailable(m)))
        }
        Err(e) => (None, Err(e)),
    }
}
