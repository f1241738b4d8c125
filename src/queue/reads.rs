//! Reads of the `tasks` table for the API: one task, a filtered page, statistics. They go
//! straight to the pool on a blocking thread and never wait for an engine.

use chrono::NaiveDateTime;
use uuid::Uuid;

use super::{Broker, QueueError, StatusCounts};
use crate::domain::query::TaskQuery;
use crate::domain::{Task, TaskStatus};
use crate::storage::{self, StorageError};

impl Broker {
    pub(super) async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut storage::AnyConnection) -> Result<T, QueueError> + Send + 'static,
    ) -> Result<T, QueueError> {
        let pool = self.inner.pool.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = storage::checkout(&pool)?;
            f(&mut conn).map_err(|e| match e {
                // A failing read on a validated connection: the server went away mid-query
                // unless it still answers.
                QueueError::Internal(m) if !storage::reachable(&pool) => QueueError::Unavailable(m),
                other => other,
            })
        })
        .await
        .map_err(|e| QueueError::Internal(format!("read task panicked: {e}")))?
    }

    /// One task.
    pub async fn get_task(&self, id: Uuid) -> Result<Task, QueueError> {
        self.read(move |c| {
            let row = storage::tasks::get(c, &id.hyphenated().to_string())
                .map_err(StorageError::from)?
                .ok_or(QueueError::TaskNotFound(id))?;
            Ok(row.into_task()?)
        })
        .await
    }

    /// A page of tasks, newest first, with the total count.
    pub async fn list_tasks(&self, query: TaskQuery) -> Result<(i64, Vec<Task>), QueueError> {
        self.read(move |c| {
            let (count, rows) = storage::tasks::list(c, &query).map_err(StorageError::from)?;
            let tasks = rows
                .into_iter()
                .map(|r| r.into_task().map_err(QueueError::from))
                .collect::<Result<Vec<_>, _>>()?;
            Ok((count, tasks))
        })
        .await
    }

    /// Task counts per hour (on `modified_at`) and status over the last 24 hours, newest hour
    /// first, keyed like mula (`2025-01-31T14:00:00+00:00`).
    pub async fn task_stats(
        &self,
        scheduler_id: Option<String>,
        organisation: Option<String>,
    ) -> Result<Vec<(String, StatusCounts)>, QueueError> {
        let since = (self.inner.clock.now() - chrono::Duration::hours(24)).naive_utc();
        let rows = self
            .read(move |c| {
                Ok(storage::tasks::stats(
                    c,
                    since,
                    scheduler_id.as_deref(),
                    organisation.as_deref(),
                )
                .map_err(StorageError::from)?)
            })
            .await?;
        Ok(bucket_stats(rows))
    }
}

fn bucket_stats(rows: Vec<storage::rows::StatsRow>) -> Vec<(String, StatusCounts)> {
    let mut hours: std::collections::BTreeMap<String, StatusCounts> = Default::default();
    for row in rows {
        let key =
            NaiveDateTime::parse_from_str(&format!("{}:00:00", row.hour), "%Y-%m-%d %H:%M:%S")
                .map(|t| t.and_utc().format("%Y-%m-%dT%H:00:00+00:00").to_string())
                .unwrap_or(row.hour);
        let counts = hours.entry(key).or_default();
        match row.status.parse::<TaskStatus>() {
            Ok(TaskStatus::Pending) => counts.pending += row.count,
            Ok(TaskStatus::Queued) => counts.queued += row.count,
            Ok(TaskStatus::Dispatched) => counts.dispatched += row.count,
            Ok(TaskStatus::Running) => counts.running += row.count,
            Ok(TaskStatus::Completed) => counts.completed += row.count,
            Ok(TaskStatus::Failed) => counts.failed += row.count,
            Ok(TaskStatus::Cancelled) => counts.cancelled += row.count,
            Err(()) => {}
        }
        counts.total += row.count;
    }
    hours.into_iter().rev().collect()
}
