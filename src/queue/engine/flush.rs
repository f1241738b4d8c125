//! Grouped WAL flushes: the engines' answers wait for one shared flush barrier.
//!
//! On PostgreSQL an engine's connection commits with `synchronous_commit = off`: the commit
//! returns once its WAL is written to the server's buffers, not flushed to disk, and the engine
//! goes on to its next batch at once. Its answers wait here. One thread runs a barrier — a
//! transaction of its own with the server's synchronous commit, which returns only once the WAL
//! up to its commit record is on disk — and then hands out every answer that was waiting when it
//! began: their commits came before the barrier's in the WAL, so they are on disk too. So one
//! flush serves every batch of every engine committed meanwhile, and no answer is sent before
//! what it reports is durable.
//!
//! On SQLite (WAL journal) an engine's connection commits with `synchronous = NORMAL`: its
//! frames are appended to the `-wal` file without an `fsync`. The barrier is the same one-row
//! update on a pooled connection, which keeps `synchronous = FULL`, so its commit syncs the
//! `-wal` file: every frame appended before it, by any connection, reaches the disk with it (a
//! sync is of the file, not of the descriptor). The barrier takes the engines' write lock like
//! any writer (SQLite has one writer at a time), so the three schedulers' commits share one sync
//! where each paid its own.
//!
//! If the barrier fails (the server is gone), the waiting answers are 503: what they report may
//! be lost with the server's buffers. Their tasks popped go back to the queue when the engine
//! can (a task whose pop was lost is still queued; one whose pop survived is given back).

use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use diesel::connection::SimpleConnection;
use tracing::{debug, warn};

use crate::queue::types::QueueError;
use crate::storage::{self, DbConn, DbPool};

/// What to do once the barrier has passed (`Ok`) or failed.
pub(crate) type Delivery = Box<dyn FnOnce(Result<(), QueueError>) + Send>;

/// Deliveries waiting for a barrier at most; an engine that gets this far ahead of the disk
/// waits.
const WAITING_MAX: usize = 256;

/// The barrier: an autocommitted change of one row, whose synchronous commit waits until the WAL
/// up to its commit record is flushed. It must write WAL: a transaction that only took a
/// transaction id (`SELECT txid_current()`) commits without waiting for the disk (found by the
/// outage test, whose acknowledged pop was lost with the server's buffers).
const BARRIER: &str = "UPDATE flush_barrier SET n = n + 1 WHERE id = 1";

/// A handle to the flush thread.
#[derive(Clone)]
pub(crate) struct Flush {
    tx: SyncSender<Delivery>,
}

impl Flush {
    /// Starts the flush thread on a connection of `pool`; its barrier takes `write_lock`, the
    /// engines' turn to write, where the database has one writer at a time.
    pub fn start(
        pool: DbPool,
        write_lock: Option<Arc<Mutex<()>>>,
    ) -> Result<(Flush, JoinHandle<()>), std::io::Error> {
        let (tx, rx) = std::sync::mpsc::sync_channel(WAITING_MAX);
        let join = std::thread::Builder::new()
            .name("wal-flush".into())
            .spawn(move || run(&pool, write_lock.as_ref(), &rx))?;
        Ok((Flush { tx }, join))
    }

    /// Runs `delivery` after the next barrier. Answers at once with a failure when the flush
    /// thread is gone.
    pub fn after_flush(&self, delivery: Delivery) {
        if let Err(e) = self.tx.send(delivery) {
            (e.0)(Err(QueueError::Unavailable(
                "the WAL flush thread stopped".into(),
            )));
        }
    }
}

fn run(pool: &DbPool, write_lock: Option<&Arc<Mutex<()>>>, rx: &Receiver<Delivery>) {
    let mut conn: Option<DbConn> = None;
    while let Ok(first) = rx.recv() {
        let mut due = vec![first];
        due.extend(rx.try_iter());
        let result = barrier(pool, write_lock, &mut conn);
        for delivery in due {
            delivery(match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(e.duplicate()),
            });
        }
    }
    debug!("WAL flush thread stopped");
}

/// Runs the barrier, on a fresh connection for a second try.
fn barrier(
    pool: &DbPool,
    write_lock: Option<&Arc<Mutex<()>>>,
    conn: &mut Option<DbConn>,
) -> Result<(), QueueError> {
    let mut last = String::new();
    for _ in 0..2 {
        let mut c = match conn.take() {
            Some(c) => c,
            None => match storage::checkout(pool) {
                Ok(c) => c,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            },
        };
        let turn = write_turn(write_lock);
        let done = c.batch_execute(BARRIER);
        drop(turn);
        match done {
            Ok(()) => {
                *conn = Some(c);
                return Ok(());
            }
            Err(e) => last = e.to_string(),
        }
    }
    warn!(error = %last, "WAL flush barrier failed; answers waiting for it get 503");
    Err(QueueError::Unavailable(format!(
        "the database did not confirm the write: {last}"
    )))
}

/// Takes the shared write lock, if any (SQLite takes one writer at a time: the engines' batches
/// and the barrier's sync); a panic in another engine does not make it unusable.
pub(super) fn write_turn(lock: Option<&Arc<Mutex<()>>>) -> Option<MutexGuard<'_, ()>> {
    lock.map(|l| l.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
}
