//! Pruning: a component's finished tasks (completed, failed, cancelled) last changed longer ago
//! than the retention are deleted, a batch at a time, so the table does not grow forever.

use std::time::Duration;

use super::Tick;
use super::table::{CronError, Entry, Fut, Outcome};
use crate::storage::{self, DbPool, StorageError};

/// Tasks deleted per statement.
const BATCH: usize = 10_000;
/// Statements per run at most; the next run takes the rest.
const BATCHES: usize = 10;

/// The prune entry of one component; wrap it in [`super::table::Periodic`].
pub struct Prune {
    /// Where the tasks are.
    pub pool: DbPool,
    /// How long a finished task is kept.
    pub retention: Duration,
}

impl Entry for Prune {
    fn name(&self) -> &'static str {
        "prune"
    }

    fn action<'a>(&'a self, tick: &'a Tick) -> Fut<'a, Outcome> {
        Box::pin(async move {
            let before = chrono::Duration::from_std(self.retention)
                .ok()
                .and_then(|retention| tick.at.checked_sub_signed(retention))
                .ok_or(CronError::Retention(self.retention))?
                .naive_utc();
            let s = tick.component;
            let deleted = storage::run(&self.pool, move |conn| {
                let mut deleted = 0;
                for _ in 0..BATCHES {
                    let n = storage::tasks::prune(conn, s, before, BATCH)?;
                    deleted += n;
                    if n < BATCH {
                        break;
                    }
                }
                Ok::<_, StorageError>(deleted)
            })
            .await?;
            if deleted > 0 {
                tracing::info!(scheduler.id = %s, deleted, "finished tasks past their retention deleted");
            }
            Ok(format!("deleted {deleted}"))
        })
    }
}
