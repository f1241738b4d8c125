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
use crate::storage::{self, Backend, DbPool, StorageError};

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
    while let Some(first) = rx.recv().await {
        let mut rows = first.rows.len();
        let mut jobs = vec![first];
        while rows < BATCH_ROWS {
            let Ok(job) = rx.try_recv() else { break };
            rows += job.rows.len();
            jobs.push(job);
        }
        let all: Vec<ScheduleRow> = jobs.iter().flat_map(|j| j.rows.iter().cloned()).collect();
        let p = pool.clone();
        let result = tokio::task::spawn_blocking(move || write(&p, asynchronous, &all))
            .await
            .unwrap_or_else(|e| Err(ScheduleError::Internal(format!("linker: {e}"))));
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

fn write(pool: &DbPool, asynchronous: bool, rows: &[ScheduleRow]) -> Result<Ids, ScheduleError> {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    let mut conn = storage::checkout(pool)?;
    let sqlite = Backend::of(&conn) == Backend::Sqlite;
    if asynchronous && sqlite {
        // SQLite takes this outside a transaction, per connection: the connection goes back to
        // the pool with FULL again below.
        conn.batch_execute("PRAGMA synchronous = NORMAL")
            .map_err(StorageError::from)?;
    }
    let result = conn.transaction::<_, ScheduleError, _>(|c| {
        if asynchronous && !sqlite {
            c.batch_execute("SET LOCAL synchronous_commit = off")
                .map_err(StorageError::from)?;
        }
        Ok(schedules::ensure(c, rows).map_err(StorageError::from)?)
    });
    if asynchronous
        && sqlite
        && let Err(e) = conn.batch_execute("PRAGMA synchronous = FULL")
    {
        // A connection that cannot take a pragma is broken; the pool's check-out test drops it.
        tracing::debug!(error = %e, "could not make a returned connection wait for the disk again");
    }
    result.map_err(|e| match e {
        ScheduleError::Internal(m) if !storage::reachable(pool) => ScheduleError::Unavailable(m),
        other => other,
    })
}
