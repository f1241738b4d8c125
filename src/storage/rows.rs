//! Row types as the database returns them, and their conversion into domain types.

use chrono::{DateTime, NaiveDateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Integer, Nullable, Text, Timestamp};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::StorageError;
use crate::domain::{SchedulerId, Task, TaskStatus};

/// A full `tasks` row. `type` is selected as `task_type` (see [`super::tasks::COLUMNS`]).
#[derive(Debug, Clone, PartialEq, QueryableByName)]
pub struct TaskRow {
    /// UUID, lowercase and hyphenated.
    #[diesel(sql_type = Text)]
    pub id: String,
    /// `boefje`, `normalizer` or `report`.
    #[diesel(sql_type = Text)]
    pub scheduler_id: String,
    /// The schedule that produced the task.
    #[diesel(sql_type = Nullable<Text>)]
    pub schedule_id: Option<String>,
    /// The organisation.
    #[diesel(sql_type = Text)]
    pub organisation: String,
    /// The `type` column.
    #[diesel(sql_type = Text)]
    pub task_type: String,
    /// The de-duplication hash.
    #[diesel(sql_type = Nullable<Text>)]
    pub hash: Option<String>,
    /// Lower is more urgent.
    #[diesel(sql_type = BigInt)]
    pub priority: i64,
    /// The payload, as JSON text.
    #[diesel(sql_type = Text)]
    pub data: String,
    /// The status.
    #[diesel(sql_type = Text)]
    pub status: TaskStatus,
    /// How many times the task was handed out and given back by the watchdog.
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    /// When the current lease ends (dispatched and running tasks).
    #[diesel(sql_type = Nullable<Timestamp>)]
    pub lease_expires_at: Option<NaiveDateTime>,
    /// Why the broker failed the task, if it did.
    #[diesel(sql_type = Nullable<Text>)]
    pub failure_reason: Option<String>,
    /// Creation time (UTC).
    #[diesel(sql_type = Timestamp)]
    pub created_at: NaiveDateTime,
    /// Last change (UTC).
    #[diesel(sql_type = Timestamp)]
    pub modified_at: NaiveDateTime,
    /// Key field: the scheduler's plugin (see [`crate::domain::keys`]).
    #[diesel(sql_type = Nullable<Text>)]
    pub plugin_id: Option<String>,
    /// Key field: `data.boefje.oci_image`.
    #[diesel(sql_type = Nullable<Text>)]
    pub oci_image: Option<String>,
    /// Key field: `data.input_ooi`.
    #[diesel(sql_type = Nullable<Text>)]
    pub input_ooi: Option<String>,
    /// Key field: `data.deduplication_key` (boefje tasks).
    #[diesel(sql_type = Nullable<Text>)]
    pub deduplication_key: Option<String>,
}

impl TaskRow {
    /// Its values of the keys dispatch limits count by.
    pub fn key_values(&self) -> crate::domain::politeness::KeyValues<'_> {
        crate::domain::politeness::KeyValues {
            plugin_id: self.plugin_id.as_deref(),
            oci_image: self.oci_image.as_deref(),
            input_ooi: self.input_ooi.as_deref(),
            organisation: Some(&self.organisation),
        }
    }

    /// The decoded scheduler.
    pub fn scheduler(&self) -> Result<SchedulerId, StorageError> {
        self.scheduler_id.parse().map_err(|()| {
            StorageError::Corrupt(format!(
                "task {}: unknown scheduler '{}'",
                self.id, self.scheduler_id
            ))
        })
    }

    /// The decoded id.
    pub fn uuid(&self) -> Result<Uuid, StorageError> {
        Uuid::parse_str(&self.id)
            .map_err(|_| StorageError::Corrupt(format!("task id '{}' is not a UUID", self.id)))
    }

    /// Converts the row into the domain task.
    pub fn into_task(self) -> Result<Task, StorageError> {
        let id = self.uuid()?;
        let status = self.status;
        let scheduler_id = self.scheduler()?;
        let schedule_id = match &self.schedule_id {
            Some(s) => Some(Uuid::parse_str(s).map_err(|_| {
                StorageError::Corrupt(format!("task {id}: schedule_id '{s}' is not a UUID"))
            })?),
            None => None,
        };
        let data = RawValue::from_string(self.data)
            .map_err(|e| StorageError::Corrupt(format!("task {id}: data is not JSON: {e}")))?;
        Ok(Task {
            id,
            scheduler_id,
            schedule_id,
            organisation: self.organisation,
            priority: self.priority,
            status,
            task_type: self.task_type,
            hash: self.hash,
            data,
            created_at: utc(self.created_at),
            modified_at: utc(self.modified_at),
            attempts: self.attempts,
            lease_expires_at: self.lease_expires_at.map(utc),
            failure_reason: self.failure_reason,
        })
    }
}

/// A status column decodes straight into the domain's status; an unknown name is a corrupt row.
impl<DB> diesel::deserialize::FromSql<Text, DB> for TaskStatus
where
    DB: diesel::backend::Backend,
    String: diesel::deserialize::FromSql<Text, DB>,
{
    fn from_sql(bytes: DB::RawValue<'_>) -> diesel::deserialize::Result<Self> {
        let name = String::from_sql(bytes)?;
        Ok(TaskStatus::try_from(name)?)
    }
}

/// A naive UTC timestamp from the database as an aware one.
pub fn utc(t: NaiveDateTime) -> DateTime<Utc> {
    t.and_utc()
}

/// `SELECT COUNT(*) AS count …`
#[derive(Debug, QueryableByName)]
pub struct CountRow {
    /// The count.
    #[diesel(sql_type = BigInt)]
    pub count: i64,
}

/// What a heap holds of a queued task: everything but the payload and the lease.
#[derive(Debug, Clone, QueryableByName)]
pub struct HeapRow {
    /// Task id.
    #[diesel(sql_type = Text)]
    pub id: String,
    /// Priority.
    #[diesel(sql_type = BigInt)]
    pub priority: i64,
    /// Creation time.
    #[diesel(sql_type = Timestamp)]
    pub created_at: NaiveDateTime,
    /// Last change.
    #[diesel(sql_type = Timestamp)]
    pub modified_at: NaiveDateTime,
    /// The task hash.
    #[diesel(sql_type = Nullable<Text>)]
    pub hash: Option<String>,
    /// The schedule that produced the task.
    #[diesel(sql_type = Nullable<Text>)]
    pub schedule_id: Option<String>,
    /// The organisation.
    #[diesel(sql_type = Text)]
    pub organisation: String,
    /// Key field.
    #[diesel(sql_type = Nullable<Text>)]
    pub plugin_id: Option<String>,
    /// Key field.
    #[diesel(sql_type = Nullable<Text>)]
    pub oci_image: Option<String>,
    /// Key field.
    #[diesel(sql_type = Nullable<Text>)]
    pub input_ooi: Option<String>,
    /// Key field.
    #[diesel(sql_type = Nullable<Text>)]
    pub deduplication_key: Option<String>,
}

impl From<&TaskRow> for HeapRow {
    fn from(r: &TaskRow) -> HeapRow {
        HeapRow {
            id: r.id.clone(),
            priority: r.priority,
            created_at: r.created_at,
            modified_at: r.modified_at,
            hash: r.hash.clone(),
            schedule_id: r.schedule_id.clone(),
            organisation: r.organisation.clone(),
            plugin_id: r.plugin_id.clone(),
            oci_image: r.oci_image.clone(),
            input_ooi: r.input_ooi.clone(),
            deduplication_key: r.deduplication_key.clone(),
        }
    }
}

impl HeapRow {
    /// The decoded id.
    pub fn uuid(&self) -> Result<Uuid, StorageError> {
        Uuid::parse_str(&self.id)
            .map_err(|_| StorageError::Corrupt(format!("task id '{}' is not a UUID", self.id)))
    }

    /// Its values of the keys dispatch limits count by.
    pub fn key_values(&self) -> crate::domain::politeness::KeyValues<'_> {
        crate::domain::politeness::KeyValues {
            plugin_id: self.plugin_id.as_deref(),
            oci_image: self.oci_image.as_deref(),
            input_ooi: self.input_ooi.as_deref(),
            organisation: Some(&self.organisation),
        }
    }

    /// Its value of a key field.
    pub fn key(&self, field: crate::domain::keys::KeyField) -> Option<&str> {
        use crate::domain::keys::KeyField;
        match field {
            KeyField::Organisation => Some(&self.organisation),
            KeyField::PluginId => self.plugin_id.as_deref(),
            KeyField::OciImage => self.oci_image.as_deref(),
            KeyField::InputOoi => self.input_ooi.as_deref(),
            KeyField::DedupKey => self.deduplication_key.as_deref(),
        }
    }
}

/// A task's place in pop order: `(priority, created_at, id)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PopKey {
    /// Priority.
    pub priority: i64,
    /// Creation time.
    pub created_at: NaiveDateTime,
    /// Task id (the tie-breaker).
    pub id: String,
}

/// A task id and its payload.
#[derive(Debug, Clone, QueryableByName)]
pub struct PayloadRow {
    /// Task id.
    #[diesel(sql_type = Text)]
    pub id: String,
    /// The payload, as JSON text.
    #[diesel(sql_type = Text)]
    pub data: String,
}

/// A queued or in-flight task of a scheduler, as a rebuild's one scan of `tasks` reads it.
#[derive(Debug, Clone, QueryableByName)]
pub struct LiveRow {
    /// The task as a heap holds it.
    #[diesel(embed)]
    pub heap: HeapRow,
    /// `queued`, `dispatched` or `running`.
    #[diesel(sql_type = Text)]
    pub status: TaskStatus,
    /// When a task in flight must be heard of.
    #[diesel(sql_type = Nullable<Timestamp>)]
    pub lease_expires_at: Option<NaiveDateTime>,
}

/// A task hash.
#[derive(Debug, Clone, QueryableByName)]
pub struct HashRow {
    /// The hash.
    #[diesel(sql_type = Nullable<Text>)]
    pub hash: Option<String>,
}

/// `scheduler_id, COUNT(*)` of one status.
#[derive(Debug, QueryableByName)]
pub struct SchedulerCount {
    /// Scheduler.
    #[diesel(sql_type = Text)]
    pub scheduler_id: String,
    /// Count.
    #[diesel(sql_type = BigInt)]
    pub count: i64,
}

/// `scheduler_id, status, COUNT(*)`: the tasks of one scheduler in one status.
#[derive(Debug, QueryableByName)]
pub struct SchedulerStatusCount {
    /// Scheduler.
    #[diesel(sql_type = Text)]
    pub scheduler_id: String,
    /// Status.
    #[diesel(sql_type = Text)]
    pub status: String,
    /// Count.
    #[diesel(sql_type = BigInt)]
    pub count: i64,
}

/// One cell of `/tasks/stats`: tasks per hour (`YYYY-MM-DD HH`) and status.
#[derive(Debug, QueryableByName)]
pub struct StatsRow {
    /// The hour bucket, `YYYY-MM-DD HH` in UTC.
    #[diesel(sql_type = Text)]
    pub hour: String,
    /// Status.
    #[diesel(sql_type = Text)]
    pub status: String,
    /// Count.
    #[diesel(sql_type = BigInt)]
    pub count: i64,
}
