//! The queue engines' writes: new tasks, changed rows, status transitions, priorities and
//! explanations, each keeping `task_queue` in step with `tasks`.

use super::*;

/// The columns of an insert, and their types for PostgreSQL's `json_to_recordset`.
const INSERT_COLUMNS: &str = "id, scheduler_id, schedule_id, organisation, type, hash, priority, \
     data, status, attempts, lease_expires_at, failure_reason, created_at, modified_at, \
     plugin_id, oci_image, input_ooi, deduplication_key";

/// The record `json_to_recordset` reads: the row (its schedule as `given_schedule_id`: the
/// statement names the column `schedule_id` once the link is resolved), the explanation, and the
/// schedule the task's hash gets if it has none (`link_*`).
const INSERT_RECORD: &str = "id text, scheduler_id text, given_schedule_id text, \
     organisation text, type text, hash text, priority bigint, data text, status text, \
     attempts integer, lease_expires_at timestamp, failure_reason text, created_at timestamp, \
     modified_at timestamp, plugin_id text, oci_image text, input_ooi text, \
     deduplication_key text, explanation text, link_id text, link_hash text, link_data text, \
     link_schedule text, link_deadline_at timestamp, link_at timestamp";

/// A row as `json_to_recordset` reads it, with the explanation of its priority when the planner
/// gave one (for `task_scores`) and the schedule row of its link, if any.
#[derive(serde::Serialize)]
struct InsertRecord<'a> {
    id: &'a str,
    scheduler_id: &'a str,
    #[serde(rename = "given_schedule_id")]
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
    explanation: Option<&'a str>,
    #[serde(flatten)]
    link: LinkRecord<'a>,
}

/// The schedule row of a task's link, as the record's `link_*` fields (all null without one).
#[derive(serde::Serialize, Default)]
struct LinkRecord<'a> {
    link_id: Option<&'a str>,
    link_hash: Option<&'a str>,
    link_data: Option<&'a str>,
    link_schedule: Option<&'a str>,
    link_deadline_at: Option<String>,
    link_at: Option<String>,
}

impl<'a> LinkRecord<'a> {
    fn of(link: Option<&'a ScheduleRow>) -> Self {
        link.map_or_else(Self::default, |l| Self {
            link_id: Some(&l.id),
            link_hash: l.hash.as_deref(),
            link_data: Some(&l.data),
            link_schedule: l.schedule.as_deref(),
            link_deadline_at: l.deadline_at.map(iso),
            link_at: Some(iso(l.created_at)),
        })
    }
}

/// A created task whose link met the schedule its hash had: that schedule's id.
#[derive(diesel::QueryableByName)]
struct Relinked {
    #[diesel(sql_type = diesel::sql_types::Text)]
    id: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    schedule_id: Option<String>,
}

/// A created task's schedule to write with it unless its hash has one (mula's `post_push`):
/// `(task id, schedule row)`.
pub type Link<'a> = (&'a str, &'a ScheduleRow);

/// Inserts new rows (no explanations); see [`insert_explained`].
pub fn insert(conn: &mut AnyConnection, rows: &[TaskRow]) -> QueryResult<()> {
    insert_explained(conn, rows, &[])
}

/// Whether [`insert_linked`] writes the explanations and the links in the statements of the rows
/// (so a batch of pushes with explanations and schedules takes no statement of its own for them).
pub fn explanations_with_rows(backend: Backend) -> bool {
    backend == Backend::Postgres
}

/// Inserts new rows, their queue rows and explanations ([`insert_explained`]), and first the
/// schedules of `links` whose hash has none; a task whose hash had one names that one instead.
/// Answers those tasks with the schedule they name (`None` if a concurrent writer took the hash
/// between the statement's snapshot and its insert: the task is then stored unlinked).
///
/// On PostgreSQL all in the rows' one statement: the schedules are inserted in a CTE (`ON
/// CONFLICT (hash) DO NOTHING`), and each linked task names the schedule the CTE wrote for its
/// hash or, when it wrote none, the one the statement's snapshot holds. On SQLite the schedules
/// are written first ([`super::super::schedules::ensure`]), then the rows with their schedule.
pub fn insert_linked(
    conn: &mut AnyConnection,
    rows: &[TaskRow],
    scores: &[(String, String)],
    links: &[Link<'_>],
) -> QueryResult<Vec<(String, Option<String>)>> {
    if Backend::of(conn) == Backend::Postgres {
        return insert_pg(conn, rows, scores, links);
    }
    if links.is_empty() {
        insert_explained(conn, rows, scores)?;
        return Ok(Vec::new());
    }
    let schedules: Vec<ScheduleRow> = links.iter().map(|(_, r)| (*r).clone()).collect();
    let ids = super::super::schedules::ensure(conn, &schedules)?;
    let relinked: std::collections::HashMap<&str, Option<String>> = links
        .iter()
        .filter_map(|(task, link)| {
            let found = link.hash.as_ref().and_then(|h| ids.get(h)).cloned();
            (found.as_deref() != Some(link.id.as_str())).then_some((*task, found))
        })
        .collect();
    let fixed: Vec<TaskRow> = rows
        .iter()
        .map(|r| {
            let mut r = r.clone();
            if let Some(s) = relinked.get(r.id.as_str()) {
                r.schedule_id = s.clone();
            }
            r
        })
        .collect();
    insert_explained(conn, &fixed, scores)?;
    Ok(relinked
        .into_iter()
        .map(|(id, s)| (id.to_owned(), s))
        .collect())
}

/// Inserts new rows, their `task_queue` rows and the explanations of their priorities (`(task id,
/// explanation)`, for rows among `rows`): a push batch's rows as sets, never a statement per row.
///
/// On PostgreSQL the rows travel as one JSON document into one fixed statement per
/// [`INSERT_CHUNK`] rows (`json_to_recordset`, whose CTE writes `tasks`, `task_queue` and
/// `task_scores`): one bind instead of 18 per row, a statement text the connection keeps prepared
/// and PostgreSQL plans in the same short time whatever the number of rows, and one statement for
/// the whole batch, so the engine sends it autocommitted, without `BEGIN` and `COMMIT` round trips.
/// (Arrays through `unnest` would do the same, but the storage layer binds only the types both
/// backends share; a JSON text is one of them.) On SQLite: multi-row `VALUES` of [`INSERT_CHUNK`]
/// rows (18 binds each, well under its limit of 32,766), the queue rows copied from them by id, the
/// explanations in multi-row `VALUES`, in the caller's transaction.
pub fn insert_explained(
    conn: &mut AnyConnection,
    rows: &[TaskRow],
    scores: &[(String, String)],
) -> QueryResult<()> {
    if Backend::of(conn) == Backend::Postgres {
        return insert_pg(conn, rows, scores, &[]).map(drop);
    }
    insert_sqlite(conn, rows, scores)
}

/// [`insert_linked`] on PostgreSQL.
fn insert_pg(
    conn: &mut AnyConnection,
    rows: &[TaskRow],
    scores: &[(String, String)],
    links: &[Link<'_>],
) -> QueryResult<Vec<(String, Option<String>)>> {
    let explained: std::collections::HashMap<&str, &str> = scores
        .iter()
        .map(|(id, e)| (id.as_str(), e.as_str()))
        .collect();
    let linked: std::collections::HashMap<&str, &ScheduleRow> =
        links.iter().map(|(id, r)| (*id, *r)).collect();
    let mut relinked = Vec::new();
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
                explanation: explained.get(r.id.as_str()).copied(),
                link: LinkRecord::of(linked.get(r.id.as_str()).copied()),
            })
            .collect();
        let json = json_bind(&records)?;
        // One statement writes the four tables: the rows are read once, as `x`; the links'
        // schedules are written first (`l`), and `y` is the rows with the schedule each
        // names: the one `l` wrote for its hash (a join: a subquery over `l` per row scanned
        // all of `l` each time, 35 ms a chunk of 500 links), else the one the hash had (its
        // unique index). Foreign keys (a task's schedule, an explanation's task) are checked
        // at the end of the statement, when every row is in.
        let mut q = sql(conn, "WITH x AS (SELECT * FROM json_to_recordset(");
        q.bind(json).push(&format!(
            "::json) AS x({INSERT_RECORD})), \
             l AS (INSERT INTO schedules (id, scheduler_id, organisation, hash, data, enabled, \
             schedule, deadline_at, created_at, modified_at) SELECT link_id, scheduler_id, \
             organisation, link_hash, link_data, TRUE, link_schedule, link_deadline_at, \
             link_at, link_at FROM x WHERE link_id IS NOT NULL \
             ON CONFLICT (hash) DO NOTHING RETURNING id, hash), \
             y AS (SELECT x.*, CASE WHEN x.link_id IS NULL THEN x.given_schedule_id \
             ELSE COALESCE(l.id, \
             (SELECT s.id FROM schedules s WHERE s.hash = x.link_hash)) END AS schedule_id \
             FROM x LEFT JOIN l ON l.hash = x.link_hash), \
             t AS (INSERT INTO tasks ({INSERT_COLUMNS}) SELECT {INSERT_COLUMNS} FROM y), \
             s AS (INSERT INTO task_scores (task_id, explanation) SELECT id, explanation \
             FROM y WHERE explanation IS NOT NULL ON CONFLICT (task_id) DO NOTHING), \
             q AS (INSERT INTO task_queue ({QUEUE_COLUMNS}) SELECT {QUEUE_FROM_TASK} FROM y \
             WHERE status = 'pending') \
             SELECT id, schedule_id FROM y \
             WHERE link_id IS NOT NULL AND schedule_id IS DISTINCT FROM link_id"
        ));
        relinked.extend(
            q.load_prepared::<Relinked>(conn)?
                .into_iter()
                .map(|r| (r.id, r.schedule_id)),
        );
    }
    Ok(relinked)
}

/// [`insert_explained`] on SQLite.
fn insert_sqlite(
    conn: &mut AnyConnection,
    rows: &[TaskRow],
    scores: &[(String, String)],
) -> QueryResult<()> {
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
    sync_queue(conn, rows.iter().map(|r| (r.id.as_str(), r.status)))?;
    insert_scores(conn, scores)
}

/// Brings the `task_queue` rows of these tasks (id and the status just written) in step with
/// `tasks`: pending ones upserted from their task, the others deleted (queued tasks have no queue
/// row: they are in a heap). The SQLite path of every write; PostgreSQL's statements do the same
/// in a CTE ([`pg_sync`]).
fn sync_queue<'a>(
    conn: &mut AnyConnection,
    written: impl Iterator<Item = (&'a str, TaskStatus)>,
) -> QueryResult<()> {
    let (pending, gone): (Vec<_>, Vec<_>) = written.partition(|(_, s)| *s == TaskStatus::Pending);
    for chunk in gone.chunks(CHUNK) {
        let mut q = sql(conn, "DELETE FROM task_queue WHERE task_id IN ");
        q.bind_list(chunk.iter().map(|(id, _)| *id));
        q.execute(conn)?;
    }
    for chunk in pending.chunks(CHUNK) {
        let mut q = sql(
            conn,
            &format!(
                "INSERT INTO task_queue ({QUEUE_COLUMNS}) SELECT {QUEUE_FROM_TASK} FROM tasks \
                 WHERE status = 'pending' AND id IN "
            ),
        );
        q.bind_list(chunk.iter().map(|(id, _)| *id))
            .push(QUEUE_UPSERT);
        q.execute(conn)?;
    }
    Ok(())
}

/// PostgreSQL: the CTEs that bring `task_queue` in step with the rows of a preceding CTE named
/// `moved` (every column of `tasks`, as written): pending tasks upserted, the others' rows
/// deleted. A statement ends with them and then its own `SELECT … FROM moved`.
pub(super) fn pg_sync() -> String {
    format!(
        ", gone AS (DELETE FROM task_queue USING moved WHERE task_queue.task_id = moved.id \
         AND moved.status <> 'pending'), \
         kept AS (INSERT INTO task_queue ({QUEUE_COLUMNS}) SELECT {QUEUE_FROM_TASK} FROM moved \
         WHERE status = 'pending'{QUEUE_UPSERT}) "
    )
}

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
        let mut q = sql(conn, "WITH moved AS (");
        push_update_from_json(&mut q, chunk)?;
        q.push(" RETURNING tasks.*)")
            .push(&pg_sync())
            .push("SELECT COUNT(*) AS count FROM moved");
        changed += q
            .load_prepared::<CountRow>(conn)?
            .first()
            .map_or(0, |r| usize::try_from(r.count).unwrap_or(0));
    }
    Ok(changed)
}

/// PostgreSQL: appends `UPDATE tasks SET … FROM json_to_recordset(…) AS v WHERE tasks.id = v.id`
/// writing the mutable fields of `rows` (at most [`UPDATE_CHUNK`]), all of them in one JSON bind,
/// so the text is the same for any rows. The caller may add conditions and its `RETURNING`.
pub(super) fn push_update_from_json(q: &mut Sql, rows: &[TaskRow]) -> QueryResult<()> {
    let records: Vec<UpdateRecord<'_>> = rows
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
    let json = json_bind(&records)?;
    q.push(
        "UPDATE tasks SET status = v.status, priority = v.priority, \
         attempts = v.attempts, lease_expires_at = v.lease_expires_at, \
         failure_reason = v.failure_reason, modified_at = v.modified_at \
         FROM json_to_recordset(",
    )
    .bind(json)
    .push(
        "::json) AS v(id text, status text, priority bigint, attempts integer, \
         lease_expires_at timestamp, failure_reason text, modified_at timestamp) \
         WHERE tasks.id = v.id",
    );
    Ok(())
}

/// Runs a write of `tasks` that returns the rows it changed (`RETURNING {COLUMNS}`), and brings
/// their queue rows in step: `write` is the statement's text after `WITH moved AS (` on
/// PostgreSQL (where it must end `RETURNING tasks.*`), and is run as it is on SQLite (where it
/// must end `RETURNING {COLUMNS}`).
pub(super) fn write_returning(
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
pub(super) fn returning(pg: bool) -> String {
    if pg {
        " RETURNING tasks.*".to_owned()
    } else {
        format!(" RETURNING {COLUMNS}")
    }
}

/// Moves the tasks with these ids from status `from` to `to`, returning the rows that moved.
/// A task no longer in `from` is skipped: this conditional update is what makes a pop
/// exactly-once even if two broker instances ever raced for the same row.
///
/// Only pending tasks have a queue row, so the queue side follows from the two statuses: from
/// `pending` the row is deleted (found by the same pairs as the task, so both sides change
/// exactly the tasks still pending); to `pending` it is written from the moved task; between
/// other statuses (a pop of a queued task, a patch) only the task changes, in place.
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
        if !pg {
            out.extend(transition_sqlite(
                conn,
                chunk,
                (from, to),
                now,
                lease_expires_at,
                COLUMNS,
            )?);
            continue;
        }
        // One statement whose text is the same for any ids (they travel as one JSON array), so
        // the connection keeps it prepared and PostgreSQL plans it once: the pairs, the queue
        // rows of tasks leaving `pending` deleted, the task side, and the queue rows of tasks
        // moved to `pending` written from them.
        let ids = json_bind(chunk)?;
        let mut q = sql(conn, "WITH pick (pid, was) AS (SELECT value, ");
        q.bind(from.as_str())
            .push("::text FROM json_array_elements_text(")
            .bind(ids)
            .push("::json))");
        if from == TaskStatus::Pending {
            q.push(
                ", queue AS (DELETE FROM task_queue USING pick \
                 WHERE task_queue.task_id = pick.pid AND task_queue.status = pick.was)",
            );
        }
        let to_pending = to == TaskStatus::Pending;
        q.push(if to_pending { ", moved AS (" } else { " " });
        push_status_update(&mut q, to, now, lease_expires_at);
        q.push(" FROM pick WHERE tasks.id = pick.pid AND tasks.status = pick.was");
        if to_pending {
            q.push(" RETURNING tasks.*)")
                .push(&pg_sync())
                .push(&format!("SELECT {COLUMNS} FROM moved"));
        } else {
            q.push(&format!(" RETURNING {COLUMNS}"));
        }
        out.extend(q.load_prepared::<TaskRow>(conn)?);
    }
    Ok(out)
}

/// Appends `UPDATE tasks SET status = to, modified_at = now, lease_expires_at = lease`.
fn push_status_update(
    q: &mut Sql,
    to: TaskStatus,
    now: NaiveDateTime,
    lease_expires_at: Option<NaiveDateTime>,
) {
    q.push("UPDATE tasks SET status = ")
        .bind(to.as_str())
        .push(", modified_at = ")
        .bind(now)
        .push(", lease_expires_at = ")
        .bind(Bind::OptTime(lease_expires_at));
}

/// [`transition`] on SQLite (no data-modifying CTEs), for up to [`CHUNK`] ids, in the caller's
/// transaction: the queue rows of tasks leaving `pending` deleted first, then the tasks still in
/// `from` moved (returning `columns` of each), then the queue rows of tasks moved to `pending`
/// written from them.
pub(super) fn transition_sqlite<T>(
    conn: &mut AnyConnection,
    ids: &[String],
    (from, to): (TaskStatus, TaskStatus),
    now: NaiveDateTime,
    lease_expires_at: Option<NaiveDateTime>,
    columns: &str,
) -> QueryResult<Vec<T>>
where
    T: diesel::deserialize::QueryableByName<crate::storage::MultiBackend> + 'static,
{
    if from == TaskStatus::Pending {
        let mut q = sql(
            conn,
            "DELETE FROM task_queue WHERE status = 'pending' AND task_id IN ",
        );
        q.bind_list(ids.iter().map(String::as_str));
        q.execute(conn)?;
    }
    let mut t = sql(conn, "");
    push_status_update(&mut t, to, now, lease_expires_at);
    t.push(" FROM ");
    push_pick(&mut t, ids, from);
    t.push(&format!(
        " WHERE tasks.id = pick.pid AND tasks.status = pick.was RETURNING {columns}"
    ));
    let moved = t.load(conn)?;
    if to == TaskStatus::Pending {
        // Every id of the chunk that is pending now gets its row (those that did not move and
        // were pending already get theirs again, the same).
        sync_queue(
            conn,
            ids.iter().map(|id| (id.as_str(), TaskStatus::Pending)),
        )?;
    }
    Ok(moved)
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

/// Appends `(SELECT column1 AS pid, column2 AS was FROM (VALUES …) AS pairs) AS pick`
/// (PostgreSQL before 16 wants every subquery in `FROM` named).
fn push_pick(q: &mut Sql, ids: &[String], was: TaskStatus) {
    q.push("(SELECT column1 AS pid, column2 AS was FROM (VALUES ");
    push_pairs(q, ids, was);
    q.push(") AS pairs) AS pick");
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
