//! Statements on the `tasks` table and its companion `task_queue`.
//!
//! `tasks` holds every task; `task_queue` holds one row per pending task (the backlog beyond the
//! heaps) with the columns a heap holds (migrations 11 and 16). Only `task_queue` is indexed by
//! status and rank, so a change of status, priority or lease is an in-place (HOT) update of
//! `tasks` on PostgreSQL. Queued tasks are in a heap, in memory, and have no queue row: a push
//! into a heap with room writes its task alone, and a pop or a patch of it updates the task in
//! place; a rebuild reads them from `tasks`. Every write here keeps the two in step: on
//! PostgreSQL in the same statement (data-modifying CTEs, so an engine batch of one write stays
//! one autocommitted statement), on SQLite in statements the caller runs inside one transaction.
//!
//! Statements that take many ids are split into chunks that stay well under both backends'
//! bind-parameter limits (SQLite 32,766; PostgreSQL 65,535).
//!
//! | file | serves |
//! |---|---|
//! | `mod.rs` | what every caller shares: the column lists, reading tasks by id |
//! | `write.rs` | the queue engines' writes |
//! | `fenced.rs` | a queue engine's common batch as one statement with its fence (PostgreSQL) |
//! | `heap.rs` | the queue engines' reads of waiting work: rebuild, refill, pending for a pop |
//! | `reads.rs` | the API's and the planner's reads: listings, counts, statistics, history |
//! | `upkeep.rs` | the pruner's statement, the after-upgrade fill, the consistency check |
//!
//! Every statement is reachable as `storage::tasks::…`, whichever file holds it.

use chrono::NaiveDateTime;
use diesel::QueryResult;

use super::filter_sql::push_filter;
use super::listing::{count_and_page, push_created_and_filter, push_where};
use super::rows::{
    CountRow, HashRow, HeapRow, LiveRow, PayloadRow, PopKey, SchedulerCount, SchedulerStatusCount,
    StatsRow, TaskRow,
};
use super::schedules::ScheduleRow;
use super::sql::{Bind, Sql};
use super::{AnyConnection, Backend};
use crate::domain::filter::FilterNode;
use crate::domain::keys::{DataKeys, KeyField};
use crate::domain::query::TaskQuery;
use crate::domain::{SchedulerId, TaskStatus};

pub mod fenced;
pub mod heap;
pub mod reads;
pub mod upkeep;
pub mod write;

pub use heap::*;
pub use reads::*;
pub use upkeep::*;
pub use write::*;

/// The column list that decodes into [`TaskRow`].
pub const COLUMNS: &str = "id, scheduler_id, schedule_id, organisation, type AS task_type, hash, \
     priority, data, status, attempts, lease_expires_at, failure_reason, created_at, modified_at, \
     plugin_id, oci_image, input_ooi, deduplication_key";

/// The column list that decodes into [`HeapRow`].
const HEAP_COLUMNS: &str = "id, priority, created_at, modified_at, hash, schedule_id, organisation, \
     plugin_id, oci_image, input_ooi, deduplication_key";

/// The same columns read from `task_queue`.
const QUEUE_HEAP_COLUMNS: &str = "task_id AS id, priority, created_at, modified_at, hash, \
     schedule_id, organisation, plugin_id, oci_image, input_ooi, deduplication_key";

/// The columns of a `task_queue` row, and the same read from a `tasks`-shaped row.
const QUEUE_COLUMNS: &str = "task_id, scheduler_id, status, priority, created_at, modified_at, \
     hash, schedule_id, organisation, plugin_id, oci_image, input_ooi, deduplication_key";

const QUEUE_FROM_TASK: &str = "id, scheduler_id, status, priority, created_at, modified_at, hash, \
     schedule_id, organisation, plugin_id, oci_image, input_ooi, deduplication_key";

/// An upsert of queue rows takes every column that can change while a task waits.
const QUEUE_UPSERT: &str = " ON CONFLICT (task_id) DO UPDATE SET status = excluded.status, \
     priority = excluded.priority, modified_at = excluded.modified_at, \
     schedule_id = excluded.schedule_id, plugin_id = excluded.plugin_id, \
     oci_image = excluded.oci_image, input_ooi = excluded.input_ooi, \
     deduplication_key = excluded.deduplication_key";

pub use super::CHUNK;

/// Rows per multi-row INSERT (18 binds each).
pub const INSERT_CHUNK: usize = 500;

/// Pending tasks a filtered pop examines at most when its filter names no key field: a bounded
/// look at the head of the backlog instead of a scan of all of it.
pub const PENDING_PROBE: usize = 1_000;

/// Values of an `in` list looked up one index range each; a longer list is one `IN (…)` range.
pub(crate) const LOOKUP_RANGES_MAX: usize = 32;

/// Pop order, as the heap ranks: most urgent first, then oldest, then id for a total order.
pub const POP_ORDER: &str = "priority ASC, created_at ASC, id ASC";

/// `value` as one JSON text to bind: rows or ids travel to PostgreSQL as one bind, so a
/// statement's text is the same whatever their number and the connection keeps it prepared.
fn json_bind<T: serde::Serialize + ?Sized>(value: &T) -> QueryResult<String> {
    serde_json::to_string(value).map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))
}

fn sql(conn: &AnyConnection, text: &str) -> Sql {
    Sql::new(Backend::of(conn), text)
}

/// One task by id.
pub fn get(conn: &mut AnyConnection, id: &str) -> QueryResult<Option<TaskRow>> {
    let mut q = sql(conn, &format!("SELECT {COLUMNS} FROM tasks WHERE id = "));
    q.bind(id);
    Ok(q.load::<TaskRow>(conn)?.into_iter().next())
}

/// The tasks with these ids (in no particular order; missing ids are skipped).
pub fn get_many(conn: &mut AnyConnection, ids: &[String]) -> QueryResult<Vec<TaskRow>> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        let mut q = sql(conn, &format!("SELECT {COLUMNS} FROM tasks WHERE id IN "));
        q.bind_list(chunk.iter().map(String::as_str));
        out.extend(q.load::<TaskRow>(conn)?);
    }
    Ok(out)
}

/// Which of these ids are tasks already (in no particular order).
pub fn existing_ids(conn: &mut AnyConnection, ids: &[String]) -> QueryResult<Vec<String>> {
    let mut out = Vec::new();
    for chunk in ids.chunks(CHUNK) {
        let mut q = sql(conn, "SELECT id FROM tasks WHERE id IN ");
        q.bind_list(chunk.iter().map(String::as_str));
        out.extend(q.load::<IdRow>(conn)?.into_iter().map(|r| r.id));
    }
    Ok(out)
}

fn iso(t: NaiveDateTime) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6f").to_string()
}

/// Rows per multi-row UPDATE (7 binds each).
pub const UPDATE_CHUNK: usize = 1000;

/// Pop order over `task_queue`.
const QUEUE_ORDER: &str = "priority ASC, created_at ASC, task_id ASC";

/// One id.
#[derive(diesel::QueryableByName)]
struct IdRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub(super) id: String,
}
