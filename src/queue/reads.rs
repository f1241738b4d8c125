//! Reads of the `tasks` table for the API: one task, a filtered page, statistics. They go
//! straight to the pool on a blocking thread and never wait for an engine.

use chrono::NaiveDateTime;
use uuid::Uuid;

use super::Broker;
use super::types::{QueueError, StatusCounts, Wait};
use crate::domain::query::TaskQuery;
use crate::domain::{SchedulerId, Task, TaskStatus};
use crate::storage::{self, StorageError};

impl Broker {
    pub(super) async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut storage::AnyConnection) -> Result<T, QueueError> + Send + 'static,
    ) -> Result<T, QueueError> {
        let pool = self.inner.pool.clone();
        storage::run(&self.inner.pool, move |conn| {
            f(conn).map_err(|e| match e {
                // A failing read on a validated connection: the server went away mid-query
                // unless it still answers.
                QueueError::Internal(m) if !storage::reachable(&pool) => QueueError::Unavailable(m),
                other => other,
            })
        })
        .await
    }

    /// The last finished run of each hash: when, and whether it failed.
    pub async fn last_runs(
        &self,
        hashes: Vec<String>,
    ) -> Result<std::collections::HashMap<String, (NaiveDateTime, bool)>, QueueError> {
        self.read(move |c| Ok(storage::tasks::last_runs(c, &hashes).map_err(StorageError::from)?))
            .await
    }

    /// Of these tasks of `scheduler`, those still waiting with a recorded explanation:
    /// `(id, explanation, priority)`.
    pub async fn waiting_scores(
        &self,
        scheduler: SchedulerId,
        ids: Vec<Uuid>,
    ) -> Result<Vec<(Uuid, crate::scoring::Explanation, i64)>, QueueError> {
        let ids: Vec<String> = ids.iter().map(|i| i.hyphenated().to_string()).collect();
        let rows = self
            .read(move |c| {
                Ok(storage::tasks::waiting_scores(c, scheduler, &ids)
                    .map_err(StorageError::from)?)
            })
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(id, e, p)| {
                Some((
                    Uuid::parse_str(&id).ok()?,
                    serde_json::from_str(&e).ok()?,
                    p,
                ))
            })
            .collect())
    }

    /// Why a task has its priority: the strategy's explanation from the inputs the planner
    /// recorded, its terms computed at the time asked; or the client that set it.
    pub async fn explain(&self, id: Uuid) -> Result<crate::scoring::Explanation, QueueError> {
        let task = self.get_task(id).await?;
        let stored = self
            .read(move |c| {
                Ok(storage::tasks::score(c, &id.hyphenated().to_string())
                    .map_err(StorageError::from)?)
            })
            .await?;
        let now = self.inner.clock.now();
        let mut explanation = stored
            .and_then(|s| serde_json::from_str::<crate::scoring::Explanation>(&s).ok())
            .filter(|e| e.priority == task.priority)
            // The terms as they stand now (how long overdue), from the recorded inputs; as
            // recorded when they cannot be computed again.
            .map(|e| crate::scoring::explain_at(&e, now).unwrap_or(e))
            .unwrap_or_else(|| crate::scoring::Explanation {
                // Pushed by a client, or its priority changed since it was planned.
                strategy: "client".into(),
                inputs: serde_json::Value::Null,
                terms: serde_json::json!({"priority_set_by_client": task.priority}),
                priority: task.priority,
                wait: None,
            });
        explanation.wait = match task.status {
            // While the scheduler changes owner nobody can say where it stands; the rest of
            // the explanation stands.
            TaskStatus::Queued => match self.wait(task.scheduler_id, id).await {
                Err(QueueError::Moving(_)) => None,
                other => other?,
            },
            TaskStatus::Pending => Some(self.pending_wait(task.scheduler_id)),
            _ => None,
        };
        Ok(explanation)
    }

    /// The wait of a pending task: beyond its scheduler's heap, which holds better work.
    fn pending_wait(&self, s: SchedulerId) -> Wait {
        let view = self.snapshot(s);
        Wait {
            status: "pending".into(),
            rank: None,
            queued: view.qsize,
            rank_in_organisation: None,
            organisations_before: None,
            filters: Vec::new(),
            held: Vec::new(),
            reasons: vec![format!(
                "pending: beyond the {s} scheduler's heap (maxsize {}), whose {} queued tasks rank \
                 before it; it enters as they are handed out, best pending first",
                view.maxsize, view.qsize
            )],
        }
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
