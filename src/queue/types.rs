//! The queue's shared types: what callers pass to the broker and get back (pushes' outcomes,
//! patches, expiry reports, a scheduler's snapshot, the errors), and each scheduler's limits
//! and the queue's configuration. The broker, its engines and the API all name these.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::domain::filter::FilterNode;
use crate::domain::limits::Limits;
use crate::domain::politeness::Rule;
pub use crate::domain::wait::{FilterRank, Wait};
use crate::domain::{IllegalTransition, PerScheduler, SchedulerId, Task, TaskStatus};
use crate::metrics::Outcome;
use crate::queue::fair::{Fairness, Weights};
use crate::storage::StorageError;

/// What to do with an automatic push when its scheduler's heap is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WhenFull {
    /// Store it as `pending`; it enters the heap as the heap drains.
    Pending,
    /// Refuse it with 429 and `Retry-After`.
    Reject,
}

/// One scheduler's bound, leases and order across organisations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerLimits {
    /// Queued tasks held in memory at most.
    pub maxsize: usize,
    /// What a full heap does with automatic pushes.
    pub when_full: WhenFull,
    /// How long a popped task may stay `dispatched` before it must be `running`.
    pub dispatch_timeout: Duration,
    /// How long a `running` task may go without finishing or a renewing `PATCH running`, once
    /// its holder has sent one such heartbeat.
    pub run_timeout: Duration,
    /// How long a `running` task whose holder never renewed its lease may go without finishing
    /// (the longer of this and `run_timeout` applies): OpenKAT's runners send no heartbeat, and a
    /// boefje may run for hours.
    pub unrenewed_run_timeout: Duration,
    /// How many leases a task may let expire; at that count it is failed instead of re-queued.
    pub max_attempts: u32,
    /// Whether organisations take turns for automatic work.
    pub fairness: Fairness,
    /// Their weights, when they do.
    pub weights: Weights,
    /// Rate and concurrency limits per key (see [`crate::domain::politeness`]).
    pub politeness: Vec<Rule>,
}

/// Everything the queue needs from the configuration.
#[derive(Debug, Clone)]
pub struct QueueConfig {
    /// Limits per scheduler.
    pub limits: PerScheduler<SchedulerLimits>,
    /// Commands applied in one transaction at most.
    pub max_batch: usize,
    /// Commands waiting for an engine at most; beyond it callers get 503 at once.
    pub channel_capacity: usize,
    /// A command that waited longer than this for its engine is answered 503 without being
    /// applied: its caller has likely given up, and the work would only delay the others.
    pub shed_after: Duration,
    /// How large inputs may be.
    pub input: Limits,
    /// PostgreSQL: commit without waiting for the flush, answer after a shared flush barrier
    /// (`database.flush_barrier`).
    pub flush_barrier: bool,
}

/// Seconds a client is told to wait (`Retry-After`) after a 429 (queue full) or a 503
/// (database unavailable).
pub const DEFAULT_RETRY_AFTER_SECS: u64 = 5;

/// Errors of the queue layer; `api::error` maps each to one HTTP status. They cross between
/// instances as they are (a forwarded request's answer), hence serde.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum QueueError {
    /// No such scheduler (404).
    #[error("Scheduler {0} not found")]
    UnknownScheduler(String),
    /// No such task (404).
    #[error("task not found, by task_id: {0}")]
    TaskNotFound(Uuid),
    /// A request that contradicts itself (400).
    #[error("{0}")]
    BadRequest(String),
    /// A payload that does not fit the scheduler's item type (400).
    #[error("malformed item: {0}")]
    Malformed(String),
    /// The same work is already waiting and the push would not make it sooner (409).
    #[error(
        "a task with the same hash is already queued (task {existing}); push with a lower priority number to run it sooner"
    )]
    Duplicate {
        /// The waiting task.
        existing: Uuid,
    },
    /// The planner's push of work whose previous task is still dispatched or running (no
    /// concurrent invocation; 409 should a client ever meet it).
    #[error("a task with the same hash is still dispatched or running (task {existing})")]
    InFlight {
        /// The task handed out.
        existing: Uuid,
    },
    /// A status change the state machine forbids (409).
    #[error("{0}")]
    IllegalTransition(IllegalTransition),
    /// Another conflict with the task's state (409).
    #[error("{0}")]
    Conflict(String),
    /// The heap is full and the scheduler refuses automatic pushes (429).
    #[error("queue {0} is full")]
    QueueFull(SchedulerId),
    /// Too many requests waiting for the engine (503).
    #[error("the scheduler is busy; retry shortly")]
    Busy,
    /// The database cannot be reached, or the service is stopping (503).
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// The scheduler's ownership is moving between instances, or its owner could not be
    /// reached: the command was not applied (503 with a short `Retry-After`).
    #[error("scheduler {0} is changing owner; retry shortly")]
    Moving(SchedulerId),
    /// A fault of ours (500); logged with its cause.
    #[error("internal error: {0}")]
    Internal(String),
}

impl QueueError {
    /// How the request metrics count this answer: a refusal of what the request asked (4xx),
    /// or an error of the service (5xx).
    pub fn outcome(&self) -> Outcome {
        match self {
            QueueError::UnknownScheduler(_)
            | QueueError::TaskNotFound(_)
            | QueueError::BadRequest(_)
            | QueueError::Malformed(_)
            | QueueError::Duplicate { .. }
            | QueueError::InFlight { .. }
            | QueueError::IllegalTransition(_)
            | QueueError::Conflict(_)
            | QueueError::QueueFull(_) => Outcome::Refused,
            QueueError::Busy
            | QueueError::Unavailable(_)
            | QueueError::Moving(_)
            | QueueError::Internal(_) => Outcome::Error,
        }
    }

    /// The same error for another caller of a failed batch.
    pub(crate) fn duplicate(&self) -> QueueError {
        match self {
            QueueError::Unavailable(m) => QueueError::Unavailable(m.clone()),
            QueueError::BadRequest(m) => QueueError::BadRequest(m.clone()),
            QueueError::Busy => QueueError::Busy,
            QueueError::Moving(s) => QueueError::Moving(*s),
            other => QueueError::Internal(other.to_string()),
        }
    }
}

impl From<StorageError> for QueueError {
    fn from(e: StorageError) -> Self {
        if let StorageError::Fenced(s) = e {
            QueueError::Moving(s)
        } else if e.is_unavailable() || e.is_connection_lost() {
            // The driver's text names the server's internals and helps no client: logged here,
            // answered plainly.
            tracing::warn!(error = %e, "a database call failed; answering 503");
            QueueError::Unavailable(e.client_text().into())
        } else if e.is_request_fault() {
            QueueError::BadRequest(format!("the database refused this request: {e}"))
        } else {
            QueueError::Internal(e.to_string())
        }
    }
}

/// The result of a push.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PushOutcome {
    /// The task as stored (for a boost or re-queue: the existing task).
    pub task: Task,
    /// True for a new task (201), false for a boosted or re-queued one (200).
    pub created: bool,
}

/// What one lease-expiry sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct ExpiryReport {
    /// Tasks put back in the queue, their attempt count raised.
    pub requeued: Vec<Uuid>,
    /// Tasks failed because they used up their attempts.
    pub failed: Vec<Uuid>,
}

/// The fields a `PATCH /tasks/{id}` may change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskPatch {
    /// A new status, checked against the state machine.
    pub status: Option<TaskStatus>,
    /// A new priority; re-ranks a queued task.
    pub priority: Option<i64>,
}

/// A scheduler as `/schedulers` shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SchedulerSnapshot {
    /// The scheduler id.
    pub id: SchedulerId,
    /// Queued tasks in the heap.
    pub qsize: u64,
    /// Tasks waiting outside the heap because it was full.
    pub pending: u64,
    /// The heap's bound.
    pub maxsize: usize,
    /// Last push or pop.
    pub last_activity: Option<DateTime<Utc>>,
}

/// Task counts of one hour, per status.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct StatusCounts {
    /// `pending` tasks.
    pub pending: i64,
    /// `queued` tasks.
    pub queued: i64,
    /// `dispatched` tasks.
    pub dispatched: i64,
    /// `running` tasks.
    pub running: i64,
    /// `completed` tasks.
    pub completed: i64,
    /// `failed` tasks.
    pub failed: i64,
    /// `cancelled` tasks.
    pub cancelled: i64,
    /// All of them.
    pub total: i64,
}

/// A pop's filter: parsed, and as the client sent it (to forward it to the owner).
#[derive(Debug, Clone)]
pub struct PopFilter {
    /// The parsed filter.
    pub node: FilterNode,
    /// The client's filter JSON.
    pub source: serde_json::Value,
}
