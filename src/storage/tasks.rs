//! Statements on the `tasks` table and its companion `task_queue`.
//!
//! `tasks` holds every task; `task_queue` holds one row per waiting (pending or queued) task with
//! the columns a heap holds (migration 11). Only `task_queue` is indexed by status and rank, so a
//! change of status, priority or lease is an in-place (HOT) update of `tasks` on PostgreSQL. Every
//! write here keeps the two in step: on PostgreSQL in the same statement (data-modifying CTEs, so
//! an engine batch of one write stays one autocommitted statement), on SQLite in statements the
//! caller runs inside one transaction.
//!
//! Statements that take many ids are split into chunks that stay well under both backends'
//! bind-parameter limits (SQLite 32,766; PostgreSQL 65,535).

use chrono::NaiveDateTime;
use diesel::QueryResult;

use super::filter_sql::push_filter;
use super::rows::{
    CountRow, HashRow, HeapRow, IdHashRow, PayloadRow, PopKey, SchedulerCount,
    SchedulerStatusCount, StatsRow, TaskRow,
};
use super::sql::{Bind, Sql};
use super::{AnyConnection, Backend};
use crate::domain::filter::FilterNode;
use crate::domain::keys::{DataKeys, KeyField};
use crate::domain::query::TaskQuery;
use crate::domain::{SchedulerId, TaskStatus};

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

/// Ids per statement.
pub const CHUNK: usize = 1000;
/// Rows per multi-row INSERT (18 binds each).
pub const INSERT_CHUNK: usize = 500;

/// Pending tasks a filtered pop examines at most when its filter names no key field: a bounded
/// look at the head of the backlog instead of a scan of all of it.
pub const PENDING_PROBE: usize = 1_000;

/// Values of an `in` list looked up one index range each; a longer list is one `IN (…)` range.
const LOOKUP_RANGES_MAX: usize = 32;

/// Pop order, as the heap ranks: most urgent first, then oldest, then id for a total order.
pub const POP_ORDER: &str = "priority ASC, created_at ASC, id ASC";

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

/// Waiting (pending or queued) tasks of `scheduler` with one of these hashes. `ix_tasks_hash`
/// finds every task of each hash (the waiting one and its past runs, a handful); the status is
/// checked in the row.
pub fn waiting_by_hash(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    hashes: &[String],
) -> QueryResult<Vec<TaskRow>> {
    let mut out = Vec::new();
    for chunk in hashes.chunks(CHUNK) {
        let mut q = sql(conn, &format!("SELECT {COLUMNS} FROM tasks WHERE hash IN "));
        q.bind_list(chunk.iter().map(String::as_str))
            .push(" AND scheduler_id = ")
            .bind(scheduler.as_str())
            .push(" AND status IN ('pending', 'queued')");
        out.extend(q.load::<TaskRow>(conn)?);
    }
    Ok(out)
}

/// The payloads of these tasks (in no particular order).
pub fn payloads(conn: &mut AnyConnection, ids: &[String]) -> QueryResult<Vec<PayloadRow>> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        let mut q = sql(conn, "SELECT id, data FROM tasks WHERE id IN ");
        q.bind_list(chunk.iter().map(String::as_str));
        out.extend(q.load::<PayloadRow>(conn)?);
    }
    Ok(out)
}

/// The scheduler a task belongs to.
pub fn scheduler_of(conn: &mut AnyConnection, id: &str) -> QueryResult<Option<String>> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        scheduler_id: String,
    }
    let mut q = sql(conn, "SELECT scheduler_id FROM tasks WHERE id = ");
    q.bind(id);
    Ok(q.load::<Row>(conn)?
        .into_iter()
        .next()
        .map(|r| r.scheduler_id))
}

/// Ids of dispatched or running tasks of `scheduler` whose lease ended before `now`, oldest lease
/// first. There is no index on leases (every pop would have to update it), so this scans; the
/// watchdog runs it on a pooled connection, never on an engine's.
pub fn expired_lease_ids(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    now: NaiveDateTime,
    limit: usize,
) -> QueryResult<Vec<String>> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        id: String,
    }
    let mut q = sql(
        conn,
        "SELECT id FROM tasks WHERE status IN ('dispatched', 'running') AND scheduler_id = ",
    );
    q.bind(scheduler.as_str())
        .push(" AND lease_expires_at < ")
        .bind(now)
        .push(" ORDER BY lease_expires_at LIMIT ")
        .bind(i64::try_from(limit).unwrap_or(i64::MAX));
    Ok(q.load::<Row>(conn)?.into_iter().map(|r| r.id).collect())
}

/// How many tasks of `scheduler` are in `status` (`pending` or `queued`).
pub fn count_waiting(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    status: TaskStatus,
) -> QueryResult<u64> {
    let mut q = sql(
        conn,
        "SELECT COUNT(*) AS count FROM task_queue WHERE scheduler_id = ",
    );
    q.bind(scheduler.as_str())
        .push(" AND status = ")
        .bind(status.as_str());
    Ok(q.load::<CountRow>(conn)?
        .first()
        .map(|r| u64::try_from(r.count).unwrap_or(0))
        .unwrap_or(0))
}

/// The columns of an insert, and their types for PostgreSQL's `json_to_recordset`.
const INSERT_COLUMNS: &str = "id, scheduler_id, schedule_id, organisation, type, hash, priority, \
     data, status, attempts, lease_expires_at, failure_reason, created_at, modified_at, \
     plugin_id, oci_image, input_ooi, deduplication_key";
const INSERT_RECORD: &str = "id text, scheduler_id text, schedule_id text, organisation text, \
     type text, hash text, priority bigint, data text, status text, attempts integer, \
     lease_expires_at timestamp, failure_reason text, created_at timestamp, \
     modified_at timestamp, plugin_id text, oci_image text, input_ooi text, \
     deduplication_key text";

/// A row as `json_to_recordset` reads it.
#[derive(serde::Serialize)]
struct InsertRecord<'a> {
    id: &'a str,
    scheduler_id: &'a str,
    schedule_id: Option<&'a str>,
    organisation: &'a str,
    #[serde(rename = "type")]
    task_type: &'a str,
    hash: Option<&'a str>,
    priority: i64,
    data: &'a str,
    status: &'a str,
    attempts: i32,
    lease_expires_at: Option<String>,
    failure_reason: Option<&'a str>,
    created_at: String,
    modified_at: String,
    plugin_id: Option<&'a str>,
    oci_image: Option<&'a str>,
    input_ooi: Option<&'a str>,
    deduplication_key: Option<&'a str>,
}

fn iso(t: NaiveDateTime) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6f").to_string()
}

/// Inserts new rows. On PostgreSQL the rows travel as one JSON document into a fixed statement
/// (`json_to_recordset`): one bind instead of 18 per row, and a statement PostgreSQL parses and
/// plans in the same short time whatever the number of rows.
pub fn insert(conn: &mut AnyConnection, rows: &[TaskRow]) -> QueryResult<()> {
    if Backend::of(conn) == Backend::Postgres {
        for chunk in rows.chunks(INSERT_CHUNK) {
            let records: Vec<InsertRecord<'_>> = chunk
                .iter()
                .map(|r| InsertRecord {
                    id: &r.id,
                    scheduler_id: &r.scheduler_id,
                    schedule_id: r.schedule_id.as_deref(),
                    organisation: &r.organisation,
                    task_type: &r.task_type,
                    hash: r.hash.as_deref(),
                    priority: r.priority,
                    data: &r.data,
                    status: r.status.as_str(),
                    attempts: r.attempts,
                    lease_expires_at: r.lease_expires_at.map(iso),
                    failure_reason: r.failure_reason.as_deref(),
                    created_at: iso(r.created_at),
                    modified_at: iso(r.modified_at),
                    plugin_id: r.plugin_id.as_deref(),
                    oci_image: r.oci_image.as_deref(),
                    input_ooi: r.input_ooi.as_deref(),
                    deduplication_key: r.deduplication_key.as_deref(),
                })
                .collect();
            let json = serde_json::to_string(&records)
                .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
            // One statement writes both tables: the rows are read once, as `x`.
            let mut q = sql(conn, "WITH x AS (SELECT * FROM json_to_recordset(");
            q.bind(json).push(&format!(
                "::json) AS x({INSERT_RECORD})), \
                 t AS (INSERT INTO tasks ({INSERT_COLUMNS}) SELECT {INSERT_COLUMNS} FROM x) \
                 INSERT INTO task_queue ({QUEUE_COLUMNS}) SELECT {QUEUE_FROM_TASK} FROM x \
                 WHERE status IN ('pending', 'queued')"
            ));
            q.execute_prepared(conn)?;
        }
        return Ok(());
    }
    for chunk in rows.chunks(INSERT_CHUNK) {
        let mut q = sql(
            conn,
            "INSERT INTO tasks (id, scheduler_id, schedule_id, organisation, type, hash, priority, \
             data, status, attempts, lease_expires_at, failure_reason, created_at, modified_at, \
             plugin_id, oci_image, input_ooi, deduplication_key) VALUES ",
        );
        for (i, r) in chunk.iter().enumerate() {
            q.push(if i == 0 { "(" } else { ", (" });
            q.bind(r.id.as_str())
                .push(", ")
                .bind(r.scheduler_id.as_str())
                .push(", ")
                .bind(Bind::OptText(r.schedule_id.clone()))
                .push(", ")
                .bind(r.organisation.as_str())
                .push(", ")
                .bind(r.task_type.as_str())
                .push(", ")
                .bind(Bind::OptText(r.hash.clone()))
                .push(", ")
                .bind(r.priority)
                .push(", ")
                .bind(r.data.as_str())
                .push(", ")
                .bind(r.status.as_str())
                .push(", ")
                .bind(Bind::Int(r.attempts))
                .push(", ")
                .bind(Bind::OptTime(r.lease_expires_at))
                .push(", ")
                .bind(Bind::OptText(r.failure_reason.clone()))
                .push(", ")
                .bind(r.created_at)
                .push(", ")
                .bind(r.modified_at)
                .push(", ")
                .bind(Bind::OptText(r.plugin_id.clone()))
                .push(", ")
                .bind(Bind::OptText(r.oci_image.clone()))
                .push(", ")
                .bind(Bind::OptText(r.input_ooi.clone()))
                .push(", ")
                .bind(Bind::OptText(r.deduplication_key.clone()))
                .push(")");
        }
        q.execute(conn)?;
    }
    sync_queue(conn, rows.iter().map(|r| (r.id.as_str(), r.status)))
}

/// Brings the `task_queue` rows of these tasks (id and the status just written) in step with
/// `tasks`: waiting ones upserted from their task, the others deleted. The SQLite path of every
/// write; PostgreSQL's statements do the same in a CTE ([`pg_sync`]).
fn sync_queue<'a>(
    conn: &mut AnyConnection,
    written: impl Iterator<Item = (&'a str, TaskStatus)>,
) -> QueryResult<()> {
    let (waiting, gone): (Vec<_>, Vec<_>) = written.partition(|(_, s)| s.is_waiting());
    for chunk in gone.chunks(CHUNK) {
        let mut q = sql(conn, "DELETE FROM task_queue WHERE task_id IN ");
        q.bind_list(chunk.iter().map(|(id, _)| *id));
        q.execute(conn)?;
    }
    for chunk in waiting.chunks(CHUNK) {
        let mut q = sql(
            conn,
            &format!(
                "INSERT INTO task_queue ({QUEUE_COLUMNS}) SELECT {QUEUE_FROM_TASK} FROM tasks \
                 WHERE status IN ('pending', 'queued') AND id IN "
            ),
        );
        q.bind_list(chunk.iter().map(|(id, _)| *id))
            .push(QUEUE_UPSERT);
        q.execute(conn)?;
    }
    Ok(())
}

/// PostgreSQL: the CTEs that bring `task_queue` in step with the rows of a preceding CTE named
/// `moved` (every column of `tasks`, as written): waiting tasks upserted, the others deleted. A
/// statement ends with them and then its own `SELECT … FROM moved`.
fn pg_sync() -> String {
    format!(
        ", gone AS (DELETE FROM task_queue USING moved WHERE task_queue.task_id = moved.id \
         AND moved.status NOT IN ('pending', 'queued')), \
         kept AS (INSERT INTO task_queue ({QUEUE_COLUMNS}) SELECT {QUEUE_FROM_TASK} FROM moved \
         WHERE status IN ('pending', 'queued'){QUEUE_UPSERT}) "
    )
}

/// Rows per multi-row UPDATE (7 binds each).
pub const UPDATE_CHUNK: usize = 1000;

/// Writes the mutable fields of `rows` (status, priority, attempts, lease, failure reason,
/// modified_at) back to their tasks, in one statement per [`UPDATE_CHUNK`] rows, and their queue
/// rows with them.
pub fn update(conn: &mut AnyConnection, rows: &[TaskRow]) -> QueryResult<usize> {
    if Backend::of(conn) == Backend::Postgres {
        return update_postgres(conn, rows);
    }
    let mut changed = 0;
    for chunk in rows.chunks(UPDATE_CHUNK) {
        let mut q = sql(
            conn,
            "UPDATE tasks SET status = v.column2, priority = v.column3, attempts = v.column4, \
             lease_expires_at = v.column5, failure_reason = v.column6, modified_at = v.column7 \
             FROM (VALUES ",
        );
        for (i, row) in chunk.iter().enumerate() {
            q.push(if i == 0 { "(" } else { ", (" })
                .bind(row.id.as_str())
                .push(", ")
                .bind(row.status.as_str())
                .push(", ")
                .bind(row.priority)
                .push(", ")
                .bind(Bind::Int(row.attempts))
                .push(", ")
                .bind(Bind::OptTime(row.lease_expires_at))
                .push(", ")
                .bind(Bind::OptText(row.failure_reason.clone()))
                .push(", ")
                .bind(row.modified_at)
                .push(")");
        }
        q.push(") AS v WHERE tasks.id = v.column1");
        changed += q.execute(conn)?;
        sync_queue(conn, chunk.iter().map(|r| (r.id.as_str(), r.status)))?;
    }
    Ok(changed)
}

/// A row of [`update`] as `json_to_recordset` reads it.
#[derive(serde::Serialize)]
struct UpdateRecord<'a> {
    id: &'a str,
    status: &'a str,
    priority: i64,
    attempts: i32,
    lease_expires_at: Option<String>,
    failure_reason: Option<&'a str>,
    modified_at: String,
}

/// [`update`] on PostgreSQL: the rows as one JSON document, so the statement's text is fixed and
/// the connection keeps it prepared; the queue rows follow in the same statement.
fn update_postgres(conn: &mut AnyConnection, rows: &[TaskRow]) -> QueryResult<usize> {
    let mut changed = 0;
    for chunk in rows.chunks(UPDATE_CHUNK) {
        let records: Vec<UpdateRecord<'_>> = chunk
            .iter()
            .map(|r| UpdateRecord {
                id: &r.id,
                status: r.status.as_str(),
                priority: r.priority,
                attempts: r.attempts,
                lease_expires_at: r.lease_expires_at.map(iso),
                failure_reason: r.failure_reason.as_deref(),
                modified_at: iso(r.modified_at),
            })
            .collect();
        let json = serde_json::to_string(&records)
            .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
        let mut q = sql(
            conn,
            "WITH moved AS (UPDATE tasks SET status = v.status, priority = v.priority, \
             attempts = v.attempts, lease_expires_at = v.lease_expires_at, \
             failure_reason = v.failure_reason, modified_at = v.modified_at \
             FROM json_to_recordset(",
        );
        q.bind(json)
            .push(
                "::json) AS v(id text, status text, priority bigint, attempts integer, \
                 lease_expires_at timestamp, failure_reason text, modified_at timestamp) \
                 WHERE tasks.id = v.id RETURNING tasks.*)",
            )
            .push(&pg_sync())
            .push("SELECT COUNT(*) AS count FROM moved");
        changed += q
            .load_prepared::<CountRow>(conn)?
            .first()
            .map_or(0, |r| usize::try_from(r.count).unwrap_or(0));
    }
    Ok(changed)
}

/// Runs a write of `tasks` that returns the rows it changed (`RETURNING {COLUMNS}`), and brings
/// their queue rows in step: `write` is the statement's text after `WITH moved AS (` on
/// PostgreSQL (where it must end `RETURNING tasks.*`), and is run as it is on SQLite (where it
/// must end `RETURNING {COLUMNS}`).
fn write_returning(
    conn: &mut AnyConnection,
    build: impl Fn(&mut Sql, bool),
) -> QueryResult<Vec<TaskRow>> {
    if Backend::of(conn) == Backend::Postgres {
        let mut q = sql(conn, "WITH moved AS (");
        build(&mut q, true);
        q.push(")")
            .push(&pg_sync())
            .push(&format!("SELECT {COLUMNS} FROM moved"));
        q.load(conn)
    } else {
        let mut q = sql(conn, "");
        build(&mut q, false);
        let rows: Vec<TaskRow> = q.load(conn)?;
        sync_queue(conn, rows.iter().map(|r| (r.id.as_str(), r.status)))?;
        Ok(rows)
    }
}

/// The tail of a write passed to [`write_returning`].
fn returning(pg: bool) -> String {
    if pg {
        " RETURNING tasks.*".to_owned()
    } else {
        format!(" RETURNING {COLUMNS}")
    }
}

/// Moves the tasks with these ids from status `from` to `to`, returning the rows that moved.
/// A task no longer in `from` is skipped: this conditional update is what makes a pop
/// exactly-once even if two broker instances ever raced for the same row.
pub fn transition(
    conn: &mut AnyConnection,
    ids: &[String],
    from: TaskStatus,
    to: TaskStatus,
    now: NaiveDateTime,
    lease_expires_at: Option<NaiveDateTime>,
) -> QueryResult<Vec<TaskRow>> {
    let pg = Backend::of(conn) == Backend::Postgres;
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        // The rows are named by `(id, expected status)` pairs joined in, not by `status = 'x'
        // AND id IN (…)`, so that the primary key finds each row directly whatever a planner
        // thinks of a constant status.
        let update_tasks = |q: &mut Sql| {
            q.push("UPDATE tasks SET status = ")
                .bind(to.as_str())
                .push(", modified_at = ")
                .bind(now)
                .push(", lease_expires_at = ")
                .bind(Bind::OptTime(lease_expires_at));
        };
        if !from.is_waiting() {
            out.extend(write_returning(conn, |q, pg| {
                update_tasks(q);
                q.push(" FROM ");
                push_pick(q, chunk, from);
                q.push(" WHERE tasks.id = pick.pid AND tasks.status = pick.was")
                    .push(&returning(pg));
            })?);
            continue;
        }
        // From a waiting status the queue row says the same status, so it is found by the same
        // pairs: deleted (the task stops waiting; a pop) or given the new status. Both sides
        // change exactly the tasks still in `from`.
        let queue_side = |q: &mut Sql, pick: &str| {
            if to.is_waiting() {
                q.push("UPDATE task_queue SET status = ")
                    .bind(to.as_str())
                    .push(", modified_at = ")
                    .bind(now)
                    .push(&format!(
                        " FROM {pick} WHERE task_queue.task_id = pick.pid \
                         AND task_queue.status = pick.was"
                    ));
            } else {
                q.push(&format!(
                    "DELETE FROM task_queue USING {pick} WHERE task_queue.task_id = pick.pid \
                     AND task_queue.status = pick.was"
                ));
            }
        };
        if pg {
            // One statement whose text is the same for any ids (they travel as one JSON array),
            // so the connection keeps it prepared and PostgreSQL plans it once: the pairs, the
            // queue side, the task side.
            let ids = serde_json::to_string(chunk)
                .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
            let mut q = sql(conn, "WITH pick (pid, was) AS (SELECT value, ");
            q.bind(from.as_str())
                .push("::text FROM json_array_elements_text(")
                .bind(ids)
                .push("::json)), queue AS (");
            queue_side(&mut q, "pick");
            q.push(") ");
            update_tasks(&mut q);
            q.push(&format!(
                " FROM pick WHERE tasks.id = pick.pid AND tasks.status = pick.was \
                 RETURNING {COLUMNS}"
            ));
            out.extend(q.load_prepared::<TaskRow>(conn)?);
        } else {
            out.extend(transition_from_waiting_sqlite(
                conn,
                chunk,
                (from, to),
                now,
                lease_expires_at,
                COLUMNS,
            )?);
        }
    }
    Ok(out)
}

/// A transition from a waiting status on SQLite (no data-modifying CTEs), for up to [`CHUNK`]
/// ids: the queue side, then the tasks still in `from`, returning `columns` of each.
fn transition_from_waiting_sqlite<T>(
    conn: &mut AnyConnection,
    ids: &[String],
    (from, to): (TaskStatus, TaskStatus),
    now: NaiveDateTime,
    lease_expires_at: Option<NaiveDateTime>,
    columns: &str,
) -> QueryResult<Vec<T>>
where
    T: diesel::deserialize::QueryableByName<super::MultiBackend> + 'static,
{
    let mut q = sql(conn, "");
    queue_side_sqlite(&mut q, ids, from, to, now);
    q.execute(conn)?;
    let mut t = sql(conn, "UPDATE tasks SET status = ");
    t.bind(to.as_str())
        .push(", modified_at = ")
        .bind(now)
        .push(", lease_expires_at = ")
        .bind(Bind::OptTime(lease_expires_at))
        .push(" FROM ");
    push_pick(&mut t, ids, from);
    t.push(&format!(
        " WHERE tasks.id = pick.pid AND tasks.status = pick.was RETURNING {columns}"
    ));
    t.load(conn)
}

/// Appends `(id, status), …` for `ids`, each expected in `was`.
fn push_pairs(q: &mut Sql, ids: &[String], was: TaskStatus) {
    for (i, id) in ids.iter().enumerate() {
        q.push(if i == 0 { "(" } else { ", (" })
            .bind(id.as_str())
            .push(", ")
            .bind(was.as_str())
            .push(")");
    }
}

/// Appends `(SELECT column1 AS pid, column2 AS was FROM (VALUES …)) AS pick`.
fn push_pick(q: &mut Sql, ids: &[String], was: TaskStatus) {
    q.push("(SELECT column1 AS pid, column2 AS was FROM (VALUES ");
    push_pairs(q, ids, was);
    q.push(")) AS pick");
}

/// The queue side of a transition from a waiting status, on SQLite (no data-modifying CTEs):
/// the rows still in `from` deleted, or moved to `to` when that is a waiting status too.
fn queue_side_sqlite(
    q: &mut Sql,
    ids: &[String],
    from: TaskStatus,
    to: TaskStatus,
    now: NaiveDateTime,
) {
    if to.is_waiting() {
        q.push("UPDATE task_queue SET status = ")
            .bind(to.as_str())
            .push(", modified_at = ")
            .bind(now)
            .push(" WHERE status = ")
            .bind(from.as_str())
            .push(" AND task_id IN ");
    } else {
        q.push("DELETE FROM task_queue WHERE status = ")
            .bind(from.as_str())
            .push(" AND task_id IN ");
    }
    q.bind_list(ids.iter().map(String::as_str));
}

/// New priorities for waiting tasks, each only while it still has the status it is named with
/// (`(id, status, priority)`).
pub fn reprioritise(
    conn: &mut AnyConnection,
    changes: &[(String, TaskStatus, i64)],
    now: NaiveDateTime,
) -> QueryResult<usize> {
    let mut n = 0;
    for chunk in changes.chunks(UPDATE_CHUNK) {
        n += write_returning(conn, |q, pg| {
            q.push("UPDATE tasks SET priority = pick.column3, modified_at = ")
                .bind(now)
                .push(" FROM (VALUES ");
            for (i, (id, status, priority)) in chunk.iter().enumerate() {
                q.push(if i == 0 { "(" } else { ", (" })
                    .bind(id.as_str())
                    .push(", ")
                    .bind(status.as_str())
                    .push(", ")
                    .bind(Bind::BigInt(*priority))
                    .push(")");
            }
            q.push(") AS pick WHERE tasks.id = pick.column1 AND tasks.status = pick.column2")
                .push(&returning(pg));
        })?
        .len();
    }
    Ok(n)
}

/// Waiting tasks of `scheduler` with a recorded explanation, after `after` in id order: `(id,
/// explanation, priority)`, at most `limit` (a re-score pages through them).
pub fn waiting_scores(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    after: &str,
    limit: usize,
) -> QueryResult<Vec<(String, String, i64)>> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        task_id: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        explanation: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        priority: i64,
    }
    let mut q = sql(
        conn,
        "SELECT s.task_id, s.explanation, t.priority FROM task_scores s \
         JOIN task_queue t ON t.task_id = s.task_id WHERE s.task_id > ",
    );
    // The same bound on both sides of the join, so each side's index scan starts at `after`
    // (without it PostgreSQL merges from the first task on every page: quadratic in the backlog).
    q.bind(after)
        .push(" AND t.task_id > ")
        .bind(after)
        .push(" AND t.scheduler_id = ")
        .bind(scheduler.as_str())
        .push(" ORDER BY s.task_id LIMIT ")
        .bind(Bind::BigInt(i64::try_from(limit).unwrap_or(i64::MAX)));
    Ok(q.load::<Row>(conn)?
        .into_iter()
        .map(|r| (r.task_id, r.explanation, r.priority))
        .collect())
}

/// Replaces recorded explanations (`(task id, explanation)`).
pub fn update_scores(conn: &mut AnyConnection, scores: &[(String, String)]) -> QueryResult<()> {
    for chunk in scores.chunks(UPDATE_CHUNK) {
        let mut q = sql(
            conn,
            "UPDATE task_scores SET explanation = pick.column2 FROM (VALUES ",
        );
        for (i, (id, e)) in chunk.iter().enumerate() {
            q.push(if i == 0 { "(" } else { ", (" })
                .bind(id.as_str())
                .push(", ")
                .bind(e.as_str())
                .push(")");
        }
        q.push(") AS pick WHERE task_scores.task_id = pick.column1");
        q.execute(conn)?;
    }
    Ok(())
}

/// Pop order over `task_queue`.
const QUEUE_ORDER: &str = "priority ASC, created_at ASC, task_id ASC";

/// Appends `AND (priority, created_at, task_id) > (key)` (or `<` with `before`): every queue row
/// ranked after (before) `key` in pop order.
fn push_ranked(q: &mut Sql, key: &PopKey, before: bool) {
    q.push(if before {
        " AND (priority, created_at, task_id) < ("
    } else {
        " AND (priority, created_at, task_id) > ("
    })
    .bind(key.priority)
    .push(", ")
    .bind(key.created_at)
    .push(", ")
    .bind(key.id.as_str())
    .push(")");
}

/// Every queued task of `scheduler`, one by one in no particular order: a rebuild that expects
/// all of them to fit reads them in the queue table's own order and sorts them in memory, since
/// reading them in pop order through an index visits the table's pages at random.
pub fn queued_all(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    each: impl FnMut(HeapRow),
) -> QueryResult<()> {
    let mut q = sql(
        conn,
        &format!(
            "SELECT {QUEUE_HEAP_COLUMNS} FROM task_queue WHERE status = 'queued' AND scheduler_id = "
        ),
    );
    q.bind(scheduler.as_str());
    q.for_each(conn, each)
}

/// Moves every queued task of `scheduler` ranked after `after` to `pending` (when the heap
/// bound is lower than what is queued); returns how many moved. Two statements: the caller's
/// transaction holds them together.
pub fn demote_after(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    after: &PopKey,
    now: NaiveDateTime,
) -> QueryResult<usize> {
    let ranked = |q: &mut Sql| {
        q.push(" WHERE status = 'queued' AND scheduler_id = ")
            .bind(scheduler.as_str());
        push_ranked(q, after, false);
    };
    let mut t = sql(conn, "UPDATE tasks SET status = 'pending', modified_at = ");
    t.bind(now)
        .push(" WHERE status = 'queued' AND id IN (SELECT task_id FROM task_queue");
    ranked(&mut t);
    t.push(")");
    t.execute(conn)?;
    let mut q = sql(
        conn,
        "UPDATE task_queue SET status = 'pending', modified_at = ",
    );
    q.bind(now);
    ranked(&mut q);
    q.execute(conn)
}

/// Every queued task as a heap holds it (tests and tools; the engine pages with [`waiting_page`]).
pub fn queued_keys(conn: &mut AnyConnection) -> QueryResult<Vec<HeapRow>> {
    sql(
        conn,
        &format!("SELECT {QUEUE_HEAP_COLUMNS} FROM task_queue WHERE status = 'queued'"),
    )
    .load(conn)
}

/// Moves the best `limit` pending tasks of `scheduler` to `queued` and returns them as a heap
/// holds them. On PostgreSQL one statement: the picks are materialised first, then each task
/// moves only if it is still pending.
pub fn refill(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    limit: usize,
    now: NaiveDateTime,
) -> QueryResult<Vec<HeapRow>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    if Backend::of(conn) == Backend::Postgres {
        let mut q = sql(
            conn,
            "WITH best AS MATERIALIZED (SELECT task_id FROM task_queue WHERE scheduler_id = ",
        );
        q.bind(scheduler.as_str())
            .push(&format!(
                " AND status = 'pending' ORDER BY {QUEUE_ORDER} LIMIT "
            ))
            .bind(limit)
            .push("), moved AS (UPDATE tasks SET status = 'queued', modified_at = ")
            .bind(now)
            .push(
                " FROM best WHERE tasks.id = best.task_id AND tasks.status = 'pending' \
                 RETURNING tasks.*)",
            )
            .push(&pg_sync())
            .push(&format!("SELECT {HEAP_COLUMNS} FROM moved"));
        return q.load(conn);
    }
    let mut q = sql(
        conn,
        "SELECT task_id AS id FROM task_queue WHERE status = 'pending' AND scheduler_id = ",
    );
    q.bind(scheduler.as_str())
        .push(&format!(" ORDER BY {QUEUE_ORDER} LIMIT "))
        .bind(limit);
    let ids: Vec<String> = q.load::<IdRow>(conn)?.into_iter().map(|r| r.id).collect();
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        // The moved tasks' heap columns come back from the update itself.
        out.extend(transition_from_waiting_sqlite(
            conn,
            chunk,
            (TaskStatus::Pending, TaskStatus::Queued),
            now,
            None,
            HEAP_COLUMNS,
        )?);
    }
    Ok(out)
}

/// One id.
#[derive(diesel::QueryableByName)]
struct IdRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    id: String,
}

/// Where a keyset page starts: after a task in pop order, or (from the best) before one.
#[derive(Debug, Clone, Copy)]
pub enum Keyset<'a> {
    /// From the best task.
    First,
    /// After this task.
    After(&'a PopKey),
    /// From the best task, up to this one (excluded).
    Before(&'a PopKey),
}

/// The next `limit` waiting tasks of `scheduler` in `status` (`queued` or `pending`) in pop
/// order from `from`, as a heap holds them: a keyset page, so a rebuild of millions of rows never
/// holds more than one page at once, and the pending rows that rank before a heap's worst task.
pub fn waiting_page(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    status: TaskStatus,
    from: Keyset<'_>,
    limit: usize,
) -> QueryResult<Vec<HeapRow>> {
    let mut q = sql(
        conn,
        &format!("SELECT {QUEUE_HEAP_COLUMNS} FROM task_queue WHERE status = "),
    );
    q.bind(status.as_str())
        .push(" AND scheduler_id = ")
        .bind(scheduler.as_str());
    match from {
        Keyset::First => {}
        Keyset::After(k) => push_ranked(&mut q, k, false),
        Keyset::Before(k) => push_ranked(&mut q, k, true),
    }
    q.push(&format!(" ORDER BY {QUEUE_ORDER} LIMIT "))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX));
    q.load(conn)
}

/// A pending task's columns from its queue row `q` and its task `t`, named as in `tasks` (the rank
/// from the queue row, so an ORDER BY on it follows the queue's indexes), plus `queue_id`.
const PENDING_JOINED: &str = "t.id, t.scheduler_id, t.schedule_id, t.organisation, t.type, \
     t.hash, q.priority AS priority, t.data, t.status, t.attempts, t.lease_expires_at, \
     t.failure_reason, q.created_at AS created_at, t.modified_at, t.plugin_id, t.oci_image, \
     t.input_ooi, t.deduplication_key, q.task_id AS queue_id";

/// The best `limit` pending tasks of `scheduler` matching `filter`, in pop order, skipping
/// `skip`. With a `lookup` on a key field the search walks that field's index of pending tasks
/// (one range per value); without one it looks only at the best [`PENDING_PROBE`] pending tasks.
pub fn pending_matching(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    lookup: Option<(KeyField, &[String])>,
    filter: &FilterNode,
    limit: usize,
    skip: &[String],
) -> QueryResult<Vec<TaskRow>> {
    let want = i64::try_from(limit.saturating_add(skip.len())).unwrap_or(i64::MAX);
    let matching = |conn: &AnyConnection, key: Option<(KeyField, &[String])>| {
        // The queue row gives the order and the key field (its indexes), the task the columns
        // the filter reads; ordered by the queue's columns, PostgreSQL and SQLite walk a key
        // field's index in pop order and stop at the limit.
        let mut q = sql(
            conn,
            &format!(
                "SELECT {COLUMNS} FROM (SELECT {PENDING_JOINED} FROM task_queue q \
                 JOIN tasks t ON t.id = q.task_id WHERE q.status = 'pending' AND q.scheduler_id = "
            ),
        );
        q.bind(scheduler.as_str());
        match key {
            Some((field, [value])) => {
                q.push(&format!(" AND q.{} = ", field.column()))
                    .bind(value.as_str());
            }
            Some((field, values)) => {
                q.push(&format!(" AND q.{} IN ", field.column()))
                    .bind_list(values.iter().map(String::as_str));
            }
            None => {}
        }
        q.push(") tasks WHERE ");
        push_filter(&mut q, filter);
        q.push(" ORDER BY priority, created_at, queue_id LIMIT ")
            .bind(want);
        q
    };
    let mut rows: Vec<TaskRow> = match lookup {
        Some((_, [])) => Vec::new(),
        Some((field, values)) if values.len() <= LOOKUP_RANGES_MAX => {
            let mut out = Vec::new();
            for value in values {
                out.extend(
                    matching(conn, Some((field, std::slice::from_ref(value))))
                        .load::<TaskRow>(conn)?,
                );
            }
            out
        }
        Some(key) => matching(conn, Some(key)).load(conn)?,
        None => {
            let mut q = sql(
                conn,
                &format!(
                    "SELECT {COLUMNS} FROM (SELECT {PENDING_JOINED} FROM task_queue q \
                     JOIN tasks t ON t.id = q.task_id WHERE q.status = 'pending' \
                     AND q.scheduler_id = "
                ),
            );
            q.bind(scheduler.as_str())
                .push(" ORDER BY q.priority, q.created_at, q.task_id LIMIT ")
                .bind(i64::try_from(PENDING_PROBE).unwrap_or(i64::MAX))
                .push(") head WHERE ");
            push_filter(&mut q, filter);
            q.push(&format!(" ORDER BY {POP_ORDER} LIMIT ")).bind(want);
            q.load(conn)?
        }
    };
    rows.retain(|r| !skip.contains(&r.id));
    rows.sort_by(|a, b| (a.priority, a.created_at, &a.id).cmp(&(b.priority, b.created_at, &b.id)));
    rows.truncate(limit);
    Ok(rows)
}

/// The hashes of `scheduler`'s pending tasks, at most `limit` (read once per rebuild, so pushes
/// into a full heap need not ask the table whether the work already waits).
pub fn pending_hashes(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    limit: usize,
) -> QueryResult<Vec<Option<String>>> {
    let mut q = sql(
        conn,
        "SELECT hash FROM task_queue WHERE status = 'pending' AND scheduler_id = ",
    );
    q.bind(scheduler.as_str())
        .push(" LIMIT ")
        .bind(i64::try_from(limit).unwrap_or(i64::MAX));
    Ok(q.load::<HashRow>(conn)?
        .into_iter()
        .map(|r| r.hash)
        .collect())
}

/// The ids and hashes of `scheduler`'s tasks in flight (`dispatched`, `running`), read once per
/// rebuild. No index serves it (one would be written by every pop): a scan, at start and after a
/// failed batch only.
pub fn in_flight_hashes(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
) -> QueryResult<Vec<IdHashRow>> {
    let mut q = sql(
        conn,
        "SELECT id, hash FROM tasks WHERE status IN ('dispatched', 'running') AND scheduler_id = ",
    );
    q.bind(scheduler.as_str());
    q.load(conn)
}

/// The last finished run (completed or failed) of each of these hashes: when, and whether it
/// failed.
pub fn last_runs(
    conn: &mut AnyConnection,
    hashes: &[String],
) -> QueryResult<std::collections::HashMap<String, (NaiveDateTime, bool)>> {
    #[derive(diesel::QueryableByName)]
    struct Run {
        #[diesel(sql_type = diesel::sql_types::Text)]
        hash: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        status: String,
        #[diesel(sql_type = diesel::sql_types::Timestamp)]
        modified_at: NaiveDateTime,
    }
    let mut out: std::collections::HashMap<String, (NaiveDateTime, bool)> =
        std::collections::HashMap::new();
    for chunk in hashes.chunks(CHUNK) {
        let mut q = sql(
            conn,
            "SELECT hash, status, modified_at FROM tasks WHERE status IN ('completed', 'failed') \
             AND hash IN (",
        );
        for (i, h) in chunk.iter().enumerate() {
            if i > 0 {
                q.push(", ");
            }
            q.bind(h.as_str());
        }
        q.push(")");
        for r in q.load::<Run>(conn)? {
            let failed = r.status == "failed";
            let e = out.entry(r.hash).or_insert((r.modified_at, failed));
            if r.modified_at > e.0 {
                *e = (r.modified_at, failed);
            }
        }
    }
    Ok(out)
}

/// Records why tasks have their priority (an explanation each, as JSON).
pub fn insert_scores(conn: &mut AnyConnection, scores: &[(String, String)]) -> QueryResult<()> {
    for chunk in scores.chunks(INSERT_CHUNK) {
        let mut q = sql(
            conn,
            "INSERT INTO task_scores (task_id, explanation) VALUES ",
        );
        for (i, (id, e)) in chunk.iter().enumerate() {
            q.push(if i == 0 { "(" } else { ", (" });
            q.bind(id.as_str()).push(", ").bind(e.as_str()).push(")");
        }
        q.push(" ON CONFLICT (task_id) DO NOTHING");
        q.execute(conn)?;
    }
    Ok(())
}

/// Why a task has its priority, if the planner recorded it.
pub fn score(conn: &mut AnyConnection, id: &str) -> QueryResult<Option<String>> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        explanation: String,
    }
    let mut q = sql(conn, "SELECT explanation FROM task_scores WHERE task_id = ");
    q.bind(id);
    Ok(q.load::<Row>(conn)?
        .into_iter()
        .next()
        .map(|r| r.explanation))
}

/// Deletes up to `limit` finished tasks (completed, failed, cancelled) last changed before
/// `before`; answers how many. No index holds the status (a pop would write it), so the search
/// walks `ix_tasks_created_at`: a task last changed before `before` was created before it.
pub fn prune(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    before: NaiveDateTime,
    limit: usize,
) -> QueryResult<usize> {
    let mut q = sql(
        conn,
        "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks WHERE created_at < ",
    );
    q.bind(before)
        .push(" AND status IN ('completed', 'failed', 'cancelled') AND modified_at < ")
        .bind(before)
        .push(" AND scheduler_id = ")
        .bind(scheduler.as_str())
        .push(" LIMIT ")
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .push(")");
    q.execute(conn)
}

/// Fills the key-field columns of `scheduler`'s waiting tasks written before they existed (or by
/// an older version during a rolling deploy); returns how many rows it filled.
pub fn backfill_keys(conn: &mut AnyConnection, scheduler: SchedulerId) -> QueryResult<usize> {
    let mut filled = 0;
    let mut after = String::new();
    loop {
        let mut q = sql(
            conn,
            "SELECT t.id, t.data FROM task_queue q JOIN tasks t ON t.id = q.task_id \
             WHERE q.plugin_id IS NULL AND q.scheduler_id = ",
        );
        q.bind(scheduler.as_str())
            .push(" AND q.task_id > ")
            .bind(after.as_str())
            .push(" ORDER BY q.task_id LIMIT ")
            .bind(i64::try_from(CHUNK).unwrap_or(i64::MAX));
        let page: Vec<PayloadRow> = q.load(conn)?;
        let Some(last) = page.last() else { break };
        after = last.id.clone();
        for row in &page {
            let keys = DataKeys::of_json(scheduler, &row.data);
            if keys == DataKeys::default() {
                continue;
            }
            for (table, id_column) in [("tasks", "id"), ("task_queue", "task_id")] {
                let mut u = sql(conn, &format!("UPDATE {table} SET plugin_id = "));
                u.bind(Bind::OptText(keys.plugin_id.clone()))
                    .push(", oci_image = ")
                    .bind(Bind::OptText(keys.oci_image.clone()))
                    .push(", input_ooi = ")
                    .bind(Bind::OptText(keys.input_ooi.clone()))
                    .push(", deduplication_key = ")
                    .bind(Bind::OptText(keys.deduplication_key.clone()))
                    .push(&format!(" WHERE {id_column} = "))
                    .bind(row.id.as_str());
                let n = u.execute(conn)?;
                if table == "tasks" {
                    filled += n;
                }
            }
        }
        if page.len() < CHUNK {
            break;
        }
    }
    Ok(filled)
}

/// Tasks per scheduler in `status`.
pub fn count_by_scheduler(
    conn: &mut AnyConnection,
    status: TaskStatus,
) -> QueryResult<Vec<SchedulerCount>> {
    let mut q = sql(
        conn,
        "SELECT scheduler_id, COUNT(*) AS count FROM tasks WHERE status = ",
    );
    q.bind(status.as_str()).push(" GROUP BY scheduler_id");
    q.load(conn)
}

/// Tasks per scheduler and status, the whole table (mula's `get_status_counts`): a scan of
/// `ix_tasks_waiting`'s leading columns at best, of the table at worst; callers cache it.
pub fn count_by_scheduler_and_status(
    conn: &mut AnyConnection,
) -> QueryResult<Vec<SchedulerStatusCount>> {
    sql(
        conn,
        "SELECT scheduler_id, status, COUNT(*) AS count FROM tasks GROUP BY scheduler_id, status",
    )
    .load(conn)
}

fn push_list_conditions(q: &mut Sql, lq: &TaskQuery) {
    q.push(" WHERE 1 = 1");
    if let Some(s) = lq.scheduler_id {
        q.push(" AND scheduler_id = ").bind(s.as_str());
    }
    if let Some(o) = &lq.organisation {
        q.push(" AND organisation = ").bind(o.as_str());
    }
    if let Some(t) = &lq.task_type {
        q.push(" AND type = ").bind(t.as_str());
    }
    if let Some(s) = lq.status {
        q.push(" AND status = ").bind(s.as_str());
    }
    if let Some(t) = lq.min_created_at {
        q.push(" AND created_at >= ").bind(t);
    }
    if let Some(t) = lq.max_created_at {
        q.push(" AND created_at <= ").bind(t);
    }
    if let Some(f) = &lq.filter {
        q.push(" AND ");
        push_filter(q, f);
    }
}

/// The total count and one page, newest first.
pub fn list(conn: &mut AnyConnection, lq: &TaskQuery) -> QueryResult<(i64, Vec<TaskRow>)> {
    let mut count = sql(conn, "SELECT COUNT(*) AS count FROM tasks");
    push_list_conditions(&mut count, lq);
    let total = count
        .load::<CountRow>(conn)?
        .first()
        .map(|r| r.count)
        .unwrap_or(0);
    if lq.limit == 0 || lq.offset >= total {
        return Ok((total, Vec::new()));
    }
    let mut page = sql(conn, &format!("SELECT {COLUMNS} FROM tasks"));
    push_list_conditions(&mut page, lq);
    page.push(" ORDER BY created_at DESC, id DESC LIMIT ")
        .bind(lq.limit)
        .push(" OFFSET ")
        .bind(lq.offset);
    Ok((total, page.load(conn)?))
}

/// Task counts per hour (by `modified_at`) and status since `since`.
pub fn stats(
    conn: &mut AnyConnection,
    since: NaiveDateTime,
    scheduler_id: Option<&str>,
    organisation: Option<&str>,
) -> QueryResult<Vec<StatsRow>> {
    let hour = match Backend::of(conn) {
        Backend::Postgres => "to_char(modified_at, 'YYYY-MM-DD HH24')",
        // SQLite keeps timestamps as 'YYYY-MM-DD HH:MM:SS…' text.
        Backend::Sqlite => "substr(modified_at, 1, 13)",
    };
    let mut q = sql(
        conn,
        &format!(
            "SELECT {hour} AS hour, status, COUNT(*) AS count FROM tasks WHERE modified_at >= "
        ),
    );
    q.bind(since);
    if let Some(s) = scheduler_id {
        q.push(" AND scheduler_id = ").bind(s);
    }
    if let Some(o) = organisation {
        q.push(" AND organisation = ").bind(o);
    }
    q.push(&format!(" GROUP BY {hour}, status"));
    q.load(conn)
}

/// Ids of tasks whose `task_queue` row is out of step with the task: a waiting task without its
/// row or with another rank, status or key field, or a row whose task is gone or no longer
/// waits. Empty when the invariant of migration 11 holds (tests check it after every run).
pub fn queue_mismatches(conn: &mut AnyConnection) -> QueryResult<Vec<String>> {
    let same = |col: &str| format!("COALESCE(q.{col}, '') = COALESCE(t.{col}, '')");
    let text = format!(
        "SELECT t.id FROM tasks t LEFT JOIN task_queue q ON q.task_id = t.id \
         WHERE t.status IN ('pending', 'queued') AND NOT (q.task_id IS NOT NULL \
         AND q.status = t.status AND q.scheduler_id = t.scheduler_id \
         AND q.priority = t.priority AND q.created_at = t.created_at \
         AND q.modified_at = t.modified_at AND q.organisation = t.organisation \
         AND {} AND {} AND {} AND {} AND {} AND {}) \
         UNION ALL SELECT q.task_id AS id FROM task_queue q LEFT JOIN tasks t ON t.id = q.task_id \
         WHERE t.id IS NULL OR t.status NOT IN ('pending', 'queued')",
        same("hash"),
        same("schedule_id"),
        same("plugin_id"),
        same("oci_image"),
        same("input_ooi"),
        same("deduplication_key"),
    );
    Ok(sql(conn, &text)
        .load::<IdRow>(conn)?
        .into_iter()
        .map(|r| r.id)
        .collect())
}
