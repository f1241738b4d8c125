//! Request and response shapes of the REST API (mula's wire format). Task JSON itself is
//! [`crate::domain::Task`].

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::domain::{SchedulerId, Task, TaskStatus};
use crate::queue::{PushRequest, SchedulerSnapshot, StatusCounts};

/// A task to push (mula's `TaskPush`). A worker may also push back a full task as it popped
/// it; the task keys that are not listed here (`status`, `type`, `hash`, `schedule_id`,
/// `created_at`, `attempts`, `lease_expires_at`, `failure_reason`) are then accepted and
/// ignored, and `modified_at` tells a stale copy. Any other key is refused.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskPush {
    /// The task id (`data.id` is set to it). With the id of a task that a worker holds and has
    /// not started, the push puts that task back in the queue; a running task's is refused.
    pub id: Option<Uuid>,
    /// Must equal the scheduler in the path, when given.
    pub scheduler_id: Option<String>,
    /// The organisation the task runs for.
    pub organisation: String,
    /// Lower is more urgent; required and non-zero. User scans use 1.
    #[serde(default, deserialize_with = "integral")]
    pub priority: Option<i64>,
    /// The payload: BoefjeTask, NormalizerTask or ReportTask.
    #[schema(value_type = Object)]
    pub data: Map<String, Value>,
    /// Ignored (accepted for re-pushes of a full task).
    #[schema(value_type = Option<TaskStatus>)]
    pub status: Option<Value>,
    /// Ignored (accepted for re-pushes of a full task).
    #[serde(rename = "type")]
    #[schema(value_type = Option<String>)]
    pub task_type: Option<Value>,
    /// Ignored: the hash is always computed from `data`.
    #[schema(value_type = Option<String>)]
    pub hash: Option<Value>,
    /// Ignored (accepted for re-pushes of a full task).
    #[schema(value_type = Option<String>, format = Uuid)]
    pub schedule_id: Option<Value>,
    /// Ignored (accepted for re-pushes of a full task).
    #[schema(value_type = Option<String>, format = DateTime)]
    pub created_at: Option<Value>,
    /// With the id of a task handed out again after its dispatch lease ended: a copy from
    /// before that (another runtime's, which lost it) is refused (409). Otherwise ignored.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub modified_at: Option<Value>,
    /// Ignored (accepted for re-pushes of a full task).
    #[schema(value_type = Option<i32>)]
    pub attempts: Option<Value>,
    /// Ignored (accepted for re-pushes of a full task).
    #[schema(value_type = Option<String>, format = DateTime)]
    pub lease_expires_at: Option<Value>,
    /// Ignored (accepted for re-pushes of a full task).
    #[schema(value_type = Option<String>)]
    pub failure_reason: Option<Value>,
}

/// An integer that JSON may also spell as a number with a zero fraction (`134.0`), as JSON Schema
/// counts those as integers too.
fn integral<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    let v: Option<Value> = Option::deserialize(d)?;
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => as_integer(&n)
            .map(Some)
            .ok_or_else(|| serde::de::Error::custom(format!("{n} is not an integer"))),
        Some(other) => Err(serde::de::Error::custom(format!(
            "expected an integer, got {other}"
        ))),
    }
}

pub use crate::domain::filter::as_integer;

impl From<TaskPush> for PushRequest {
    fn from(p: TaskPush) -> Self {
        PushRequest {
            id: p.id,
            scheduler_id: p.scheduler_id,
            organisation: p.organisation,
            priority: p.priority,
            data: p.data,
            planned: false,
            once: false,
            schedule_id: None,
            explanation: None,
            link: None,
            // A runtime gives a task back as it popped it: that copy's time tells a copy from
            // before the task was handed out again (see the engine's give-back).
            copy_modified_at: p
                .modified_at
                .as_ref()
                .and_then(Value::as_str)
                .and_then(crate::domain::filter::parse_datetime),
        }
    }
}

/// A filter body: `{"filters": [F, …]}` or `{"filters": {"and"|"or"|"not": [F, …]}}` with
/// `F = {"column", "field"?, "operator", "value"}`. See the README for columns and operators.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"filters": [{"column": "data", "field": "boefje__oci_image", "operator": "in", "value": ["ghcr.io/minvws/openkat/nmap:latest"]}]}))]
pub struct FilterRequest {
    /// A list of filters (all must hold) or an object of combinators.
    #[schema(value_type = Object)]
    pub filters: Value,
}

/// Query of `POST /schedulers/{id}/pop`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PopQuery {
    /// Tasks to pop at most (1–1000, default 1).
    pub limit: Option<i64>,
}

/// The answer of a pop: the tasks, already `dispatched`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PopResponse {
    /// Best first; empty when nothing (matching) is queued.
    pub results: Vec<Task>,
}

/// A scheduler (mula's shape plus `maxsize` and `pending`).
#[derive(Debug, Serialize, ToSchema)]
pub struct SchedulerOut {
    /// `boefje`, `normalizer` or `report`.
    pub id: SchedulerId,
    /// The task type it schedules (same as the id).
    #[serde(rename = "type")]
    pub scheduler_type: String,
    /// The payload schema of its tasks.
    pub item_type: String,
    /// Tasks queued in its heap.
    pub qsize: u64,
    /// The heap's bound.
    pub maxsize: usize,
    /// Tasks waiting outside the full heap.
    pub pending: u64,
    /// The last push or pop.
    pub last_activity: Option<DateTime<Utc>>,
}

impl From<SchedulerSnapshot> for SchedulerOut {
    fn from(s: SchedulerSnapshot) -> Self {
        SchedulerOut {
            id: s.id,
            scheduler_type: s.id.as_str().to_owned(),
            item_type: s.id.item_type().to_owned(),
            qsize: s.qsize,
            maxsize: s.maxsize,
            pending: s.pending,
            last_activity: s.last_activity,
        }
    }
}

/// Query of `GET|POST /tasks`. Unknown parameters are ignored.
#[derive(Debug, Deserialize, Serialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TaskListQuery {
    /// Only this scheduler's tasks.
    pub scheduler_id: Option<String>,
    /// Only this organisation's tasks.
    pub organisation: Option<String>,
    /// Only tasks of this type.
    pub task_type: Option<String>,
    /// Only tasks in this status (lowercase).
    pub status: Option<String>,
    /// Rows to skip (default 0).
    pub offset: Option<i64>,
    /// Rows to return (0–1000, default 10; 0 returns only `count`).
    pub limit: Option<i64>,
    /// Created at or after (ISO 8601 date-time or date).
    pub min_created_at: Option<String>,
    /// Created at or before (ISO 8601 date-time or date).
    pub max_created_at: Option<String>,
}

/// A page of tasks, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct PaginatedTasks {
    /// Matching tasks in all pages.
    pub count: i64,
    /// The next page's URL.
    pub next: Option<String>,
    /// The previous page's URL.
    pub previous: Option<String>,
    /// This page.
    pub results: Vec<Task>,
}

/// Query of `GET /tasks/stats`.
#[derive(Debug, Deserialize, Serialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StatsQuery {
    /// Only this scheduler's tasks.
    pub scheduler_id: Option<String>,
    /// Only this organisation's tasks.
    pub organisation_id: Option<String>,
}

/// Task counts per hour (`2025-01-31T14:00:00+00:00`) of the last 24 hours, newest first.
#[derive(Debug, ToSchema)]
#[schema(value_type = HashMap<String, StatusCounts>)]
pub struct TaskStats(#[allow(dead_code)] HashMap<String, StatusCounts>);

/// A body for `PATCH /tasks/{id}`: `status` and/or `priority`. Other task keys are read-only
/// and unknown keys are ignored, so a client may send back a whole task.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"status": "running"}))]
pub struct TaskPatchBody {
    /// The new status (see the state machine in docs/ARCHITECTURE.md).
    pub status: Option<TaskStatus>,
    /// A new priority (non-zero).
    pub priority: Option<i64>,
}

/// Query of `GET /health`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HealthQuery {
    /// Also report the platform services this scheduler uses.
    pub externals: Option<bool>,
}

/// The health of one dependency.
#[derive(Debug, Serialize, ToSchema)]
pub struct ServiceHealth {
    /// Its name.
    pub service: String,
    /// Whether it answers.
    pub healthy: bool,
    /// Its version, when known.
    pub version: Option<String>,
    /// Extra facts.
    #[schema(value_type = Object)]
    pub additional: Value,
    /// Nested checks (always empty here).
    #[schema(value_type = Vec<Object>)]
    pub results: Vec<Value>,
}

/// `GET /health` (mula's `ServiceHealth` shape).
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// Always `scheduler`.
    pub service: String,
    /// False when the database does not answer, or a scheduler is served by no instance (one
    /// changing owner); then the status is 503.
    pub healthy: bool,
    /// This build's version.
    pub version: String,
    /// Unused (null), as in mula.
    #[schema(value_type = Option<Object>)]
    pub additional: Value,
    /// The dependencies checked.
    pub results: Vec<ServiceHealth>,
    /// Platform services, by name (filled when asked with `externals=true`).
    pub externals: HashMap<String, bool>,
}

/// Body of `POST /schedules` (mula's `ScheduleCreate`; other keys are refused).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleCreate {
    /// `boefje`, `normalizer` or `report`.
    pub scheduler_id: String,
    /// The organisation.
    pub organisation: String,
    /// The task data to run (the scheduler's item type).
    #[schema(value_type = Object)]
    pub data: Map<String, Value>,
    /// A cron expression (five fields, UTC); with no `deadline_at`, its next fire is the first
    /// deadline.
    pub schedule: Option<String>,
    /// When it is first due.
    pub deadline_at: Option<String>,
}

/// Query of `GET /schedules`. Unknown parameters are ignored.
#[derive(Debug, Deserialize, Serialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ScheduleListQuery {
    /// Only this scheduler's schedules.
    pub scheduler_id: Option<String>,
    /// Only this organisation's schedules.
    pub organisation: Option<String>,
    /// Only the schedule with this hash.
    pub schedule_hash: Option<String>,
    /// Only enabled (`true`) or disabled (`false`) schedules.
    pub enabled: Option<String>,
    /// Rows to skip (default 0).
    pub offset: Option<i64>,
    /// Rows to return (0–1000, default 10; 0 returns only `count`).
    pub limit: Option<i64>,
    /// Due at or after (ISO 8601 date-time or date).
    pub min_deadline_at: Option<String>,
    /// Due at or before (ISO 8601 date-time or date).
    pub max_deadline_at: Option<String>,
    /// Created at or after (ISO 8601 date-time or date).
    pub min_created_at: Option<String>,
    /// Created at or before (ISO 8601 date-time or date).
    pub max_created_at: Option<String>,
}

/// Query of `POST /schedules/search` and `GET /schedules/{id}/history`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// Rows to skip (default 0).
    pub offset: Option<i64>,
    /// Rows to return (0–1000, default 10; 0 returns only `count`).
    pub limit: Option<i64>,
}

/// A page of schedules, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct PaginatedSchedules {
    /// Matching schedules in all pages.
    pub count: i64,
    /// The next page's URL.
    pub next: Option<String>,
    /// The previous page's URL.
    pub previous: Option<String>,
    /// This page.
    pub results: Vec<crate::domain::schedule::Schedule>,
}

/// A page of a schedule's due fires, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct PaginatedFires {
    /// The schedule's fires in all pages.
    pub count: i64,
    /// The next page's URL.
    pub next: Option<String>,
    /// The previous page's URL.
    pub previous: Option<String>,
    /// This page.
    pub results: Vec<crate::domain::fire::Fire>,
}

/// Both listings' answers, made by [`super::paging::answer`]: the same four fields.
macro_rules! paginated {
    ($answer:ty, $item:ty) => {
        impl super::paging::Paginated for $answer {
            type Item = $item;

            fn new(
                count: i64,
                next: Option<String>,
                previous: Option<String>,
                results: Vec<$item>,
            ) -> Self {
                Self {
                    count,
                    next,
                    previous,
                    results,
                }
            }
        }
    };
}

paginated!(PaginatedTasks, Task);
paginated!(PaginatedSchedules, crate::domain::schedule::Schedule);
paginated!(PaginatedFires, crate::domain::fire::Fire);

/// Body of `PATCH /schedules/{schedule_id}`: any of these; other keys are ignored.
#[derive(Debug, Serialize, ToSchema)]
pub struct SchedulePatchBody {
    /// New task data (its hash follows).
    #[schema(value_type = Option<Object>)]
    pub data: Option<Value>,
    /// Run it or not.
    pub enabled: Option<bool>,
    /// A new cron expression, or null for none (the deadline is kept).
    pub schedule: Option<String>,
    /// A new deadline, or null for none.
    pub deadline_at: Option<String>,
}
