//! Pruning: a component's finished tasks (completed, failed, cancelled) last changed longer ago
//! than the retention are deleted, a batch at a time, so the table does not grow forever; and so
//! are its schedules' due fires decided longer ago than the history's retention (the fire
//! ledger, through [`Schedules`], its owner).

use std::time::Duration;

use super::Tick;
use super::table::{CronError, Entry, Fut, Outcome};
use crate::schedules::Schedules;
use crate::storage::{self, DbPool, StorageError};

/// Rows deleted per statement.
const BATCH: usize = 10_000;
/// Statements per run at most; the next run takes the rest.
const BATCHES: usize = 10;

/// The prune entry of one component; wrap it in [`super::table::Periodic`].
pub struct Prune {
    /// Where the tasks are.
    pub pool: DbPool,
    /// How long a finished task is kept; `None`: forever.
    pub retention: Option<Duration>,
    /// The schedules, whose fires are pruned.
    pub schedules: Schedules,
    /// How long a schedule's due fire is kept after it was decided; `None`: forever.
    pub history: Option<Duration>,
}

/// The time `retention` before the tick: what is older goes.
fn before(tick: &Tick, retention: Duration) -> Result<chrono::NaiveDateTime, CronError> {
    Ok(chrono::Duration::from_std(retention)
        .ok()
        .and_then(|r| tick.at.checked_sub_signed(r))
        .ok_or(CronError::Retention(retention))?
        .naive_utc())
}

impl Prune {
    /// Deletes the component's finished tasks past their retention; answers how many.
    async fn tasks(&self, tick: &Tick, retention: Duration) -> Result<usize, CronError> {
        let before = before(tick, retention)?;
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
        Ok(deleted)
    }

    /// Deletes the component's schedules' fires past the history's retention; answers how many.
    async fn fires(&self, tick: &Tick, retention: Duration) -> Result<usize, CronError> {
        let s = tick.component;
        let deleted = self
            .schedules
            .prune_history(s, before(tick, retention)?, BATCH, BATCHES)
            .await?;
        if deleted > 0 {
            tracing::info!(scheduler.id = %s, deleted, "schedule fires past their retention deleted");
        }
        Ok(deleted)
    }
}

impl Entry for Prune {
    fn name(&self) -> &'static str {
        "prune"
    }

    fn action<'a>(&'a self, tick: &'a Tick) -> Fut<'a, Outcome> {
        Box::pin(async move {
            let tasks = match self.retention {
                Some(r) => self.tasks(tick, r).await?,
                None => 0,
            };
            let fires = match self.history {
                Some(r) => self.fires(tick, r).await?,
                None => 0,
            };
            Ok(format!("deleted {tasks} tasks, {fires} fires"))
        })
    }
}
