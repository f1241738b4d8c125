//! Statements on the `tasks` table.
//!
//! Statements that take many ids are split into chunks that stay well under both backends'
//! bind-parameter limits (SQLite 32,766; PostgreSQL 65,535).

use chrono::NaiveDateTime;
use diesel::QueryResult;

use super::filter_sql::push_filter;
use super::rows::{CountRow, SchedulerCount, StatsRow, TaskRow, WaitingKey};
use super::sql::{Bind, Sql};
use super::{AnyConnection, Backend};
use crate::domain::filter::FilterNode;
use crate::domain::{SchedulerId, TaskStatus};

/// The column list that decodes into [`TaskRow`].
pub const COLUMNS: &str = "id, scheduler_id, schedule_id, organisation, type AS task_type, hash, \
     priority, data, status, attempts, lease_expires_at, failure_reason, created_at, modified_at";

/// Ids per statement.
pub const CHUNK: usize = 1000;
/// Rows per multi-row INSERT (14 binds each).
pub const INSERT_CHUNK: usize = 500;

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

/// What a batch of pushes must know: tasks with one of these ids, and waiting (pending or
/// queued) tasks of `scheduler` with one of these hashes.
pub fn find_for_push(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    ids: &[String],
    hashes: &[String],
) -> QueryResult<Vec<TaskRow>> {
    let mut out = get_many(conn, ids)?;
    for chunk in hashes.chunks(CHUNK) {
        let mut q = sql(
            conn,
            &format!("SELECT {COLUMNS} FROM tasks WHERE {WAITING} AND scheduler_id = "),
        );
        q.bind(scheduler.as_str())
            .push(" AND hash IN ")
            .bind_list(chunk.iter().map(String::as_str));
        out.extend(q.load::<TaskRow>(conn)?);
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
        &format!("SELECT COUNT(*) AS count FROM tasks WHERE {WAITING} AND scheduler_id = "),
    );
    q.bind(scheduler.as_str())
        .push(" AND status = ")
        .bind(status.as_str());
    Ok(q.load::<CountRow>(conn)?
        .first()
        .map(|r| u64::try_from(r.count).unwrap_or(0))
        .unwrap_or(0))
}

/// Inserts new rows.
pub fn insert(conn: &mut AnyConnection, rows: &[TaskRow]) -> QueryResult<()> {
    for chunk in rows.chunks(INSERT_CHUNK) {
        let mut q = sql(
            conn,
            "INSERT INTO tasks (id, scheduler_id, schedule_id, organisation, type, hash, priority, \
             data, status, attempts, lease_expires_at, failure_reason, created_at, modified_at) VALUES ",
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
                .push(")");
        }
        q.execute(conn)?;
    }
    Ok(())
}

/// Writes the mutable fields of `row` (status, priority, attempts, lease, failure reason,
/// modified_at) back to its task.
pub fn update(conn: &mut AnyConnection, row: &TaskRow) -> QueryResult<usize> {
    let mut q = sql(conn, "UPDATE tasks SET status = ");
    q.bind(row.status.as_str())
        .push(", priority = ")
        .bind(row.priority)
        .push(", attempts = ")
        .bind(Bind::Int(row.attempts))
        .push(", lease_expires_at = ")
        .bind(Bind::OptTime(row.lease_expires_at))
        .push(", failure_reason = ")
        .bind(Bind::OptText(row.failure_reason.clone()))
        .push(", modified_at = ")
        .bind(row.modified_at)
        .push(" WHERE id = ")
        .bind(row.id.as_str());
    q.execute(conn)
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
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        let mut q = sql(conn, "UPDATE tasks SET status = ");
        q.bind(to.as_str())
            .push(", modified_at = ")
            .bind(now)
            .push(", lease_expires_at = ")
            .bind(Bind::OptTime(lease_expires_at))
            .push(" WHERE status = ")
            .bind(from.as_str())
            .push(" AND id IN ")
            .bind_list(chunk.iter().map(String::as_str))
            .push(&format!(" RETURNING {COLUMNS}"));
        out.extend(q.load::<TaskRow>(conn)?);
    }
    Ok(out)
}

/// Dispatches up to `limit` queued tasks of `scheduler` that match `filter`, best first, in one
/// statement; returns the dispatched rows.
pub fn dispatch_matching(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    filter: &FilterNode,
    limit: usize,
    now: NaiveDateTime,
    lease_expires_at: Option<NaiveDateTime>,
) -> QueryResult<Vec<TaskRow>> {
    let mut q = sql(
        conn,
        "UPDATE tasks SET status = 'dispatched', modified_at = ",
    );
    q.bind(now)
        .push(", lease_expires_at = ")
        .bind(Bind::OptTime(lease_expires_at))
        .push(" WHERE status = 'queued' AND id IN (SELECT id FROM tasks WHERE scheduler_id = ")
        .bind(scheduler.as_str())
        .push(&format!(" AND {WAITING} AND status = 'queued' AND "));
    push_filter(&mut q, filter);
    q.push(&format!(" ORDER BY {POP_ORDER} LIMIT "))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .push(&format!(") RETURNING {COLUMNS}"));
    q.load::<TaskRow>(conn)
}

/// The redundant `status IN (…)` term lets SQLite use the partial index `ix_tasks_waiting`:
/// it only recognises a partial index whose WHERE terms appear in the query as written.
const WAITING: &str = "status IN ('pending', 'queued')";

/// The columns that decode into [`WaitingKey`].
const KEY_COLUMNS: &str = "id, scheduler_id, priority, created_at, hash";

/// Appends `AND (priority, created_at, id) > (key)`: everything ranked after `key` in pop order.
fn push_ranked_after(q: &mut Sql, key: &WaitingKey) {
    q.push(" AND (priority, created_at, id) > (")
        .bind(key.priority)
        .push(", ")
        .bind(key.created_at)
        .push(", ")
        .bind(key.id.as_str())
        .push(")");
}

/// The next `limit` queued tasks of `scheduler` in pop order, after `after` (a keyset page, so a
/// rebuild of millions of rows never holds more than one page of rows at once).
pub fn queued_page(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    after: Option<&WaitingKey>,
    limit: usize,
) -> QueryResult<Vec<WaitingKey>> {
    let mut q = sql(
        conn,
        &format!(
            "SELECT {KEY_COLUMNS} FROM tasks WHERE {WAITING} \
             AND status = 'queued' AND scheduler_id = "
        ),
    );
    q.bind(scheduler.as_str());
    if let Some(k) = after {
        push_ranked_after(&mut q, k);
    }
    q.push(&format!(" ORDER BY {POP_ORDER} LIMIT "))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX));
    q.load(conn)
}

/// Moves every queued task of `scheduler` ranked after `after` to `pending` (when the heap
/// bound is lower than what is queued); returns how many moved.
pub fn demote_after(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    after: &WaitingKey,
    now: NaiveDateTime,
) -> QueryResult<usize> {
    let mut q = sql(conn, "UPDATE tasks SET status = 'pending', modified_at = ");
    q.bind(now)
        .push(&format!(
            " WHERE {WAITING} AND status = 'queued' AND scheduler_id = "
        ))
        .bind(scheduler.as_str());
    push_ranked_after(&mut q, after);
    q.execute(conn)
}

/// Every queued task's heap key (tests and tools; the engine pages with [`queued_page`]).
pub fn queued_keys(conn: &mut AnyConnection) -> QueryResult<Vec<WaitingKey>> {
    sql(
        conn,
        &format!("SELECT {KEY_COLUMNS} FROM tasks WHERE status = 'queued'"),
    )
    .load(conn)
}

/// The best `limit` pending tasks of `scheduler`, in pop order.
pub fn best_pending(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    limit: usize,
) -> QueryResult<Vec<WaitingKey>> {
    let mut q = sql(
        conn,
        &format!(
            "SELECT {KEY_COLUMNS} FROM tasks WHERE {WAITING} \
             AND status = 'pending' AND scheduler_id = "
        ),
    );
    q.bind(scheduler.as_str())
        .push(&format!(" ORDER BY {POP_ORDER} LIMIT "))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX));
    q.load(conn)
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

/// A `/tasks` listing: equality filters from the query string plus an optional filter tree.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// `scheduler_id = …`
    pub scheduler_id: Option<SchedulerId>,
    /// `organisation = …`
    pub organisation: Option<String>,
    /// `type = …`
    pub task_type: Option<String>,
    /// `status = …`
    pub status: Option<TaskStatus>,
    /// `created_at >= …`
    pub min_created_at: Option<NaiveDateTime>,
    /// `created_at <= …`
    pub max_created_at: Option<NaiveDateTime>,
    /// The body's filters.
    pub filter: Option<FilterNode>,
    /// Rows to skip.
    pub offset: i64,
    /// Rows to return (0: only count).
    pub limit: i64,
}

fn push_list_conditions(q: &mut Sql, lq: &ListQuery) {
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
pub fn list(conn: &mut AnyConnection, lq: &ListQuery) -> QueryResult<(i64, Vec<TaskRow>)> {
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
