//! The API's and the planner's reads of tasks: listings, counts, statistics, a task's scheduler,
//! its explanation, the last run of a piece of work.

use super::*;

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

/// When the oldest task the table holds was created, if it holds any: the start of the history
/// the table can tell of (`ix_tasks_created_at`).
pub fn earliest(conn: &mut AnyConnection) -> QueryResult<Option<NaiveDateTime>> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Timestamp>)]
        at: Option<NaiveDateTime>,
    }
    let q = sql(conn, "SELECT MIN(created_at) AS at FROM tasks");
    Ok(q.load::<Row>(conn)?.into_iter().next().and_then(|r| r.at))
}

/// The last finished run (completed or failed) of each of these hashes, the latest created as
/// mula's `get_latest_task_by_hash` reads it: when it finished, and whether it failed.
///
/// Each hash is one walk of `ix_tasks_hash_created` from its newest task back to the first
/// finished one, so a piece of work run daily for years costs what one run a day costs: reading
/// every finished task of a hash (as this did through an index on the hash alone) cost one row
/// fetch per past run, for every planned batch.
pub fn last_runs(
    conn: &mut AnyConnection,
    hashes: &[String],
) -> QueryResult<std::collections::HashMap<String, (NaiveDateTime, bool)>> {
    let mut out = std::collections::HashMap::new();
    for chunk in hashes.chunks(CHUNK) {
        let backend = Backend::of(conn);
        let q = last_runs_statement(backend, chunk)?;
        // PostgreSQL's text is the same for any chunk, so it is kept prepared.
        let rows: Vec<LastRun> = match backend {
            Backend::Postgres => q.load_prepared(conn)?,
            Backend::Sqlite => q.load(conn)?,
        };
        for r in rows {
            out.insert(r.hash, (r.modified_at, r.status == "failed"));
        }
    }
    Ok(out)
}

/// A hash's last finished run, as [`last_runs_statement`] answers it.
#[derive(diesel::QueryableByName)]
struct LastRun {
    #[diesel(sql_type = diesel::sql_types::Text)]
    hash: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    status: String,
    #[diesel(sql_type = diesel::sql_types::Timestamp)]
    modified_at: NaiveDateTime,
}

/// [`last_runs`]' statement for one chunk of hashes: per hash, its newest finished task. On
/// PostgreSQL a lateral walk per hash of a JSON bind (one text for any number of hashes);
/// SQLite, which has no `LATERAL`, takes the same walk as a correlated subquery per hash. The
/// walk's `ORDER BY created_at DESC LIMIT 1` over `(hash, created_at)` leaves no other index
/// worth taking, whatever the table's statistics (`tests/it/plans.rs`).
pub fn last_runs_statement(backend: Backend, hashes: &[String]) -> QueryResult<Sql> {
    const NEWEST_FINISHED: &str =
        "status IN ('completed', 'failed') ORDER BY created_at DESC LIMIT 1";
    if backend == Backend::Postgres {
        let mut q = Sql::new(
            backend,
            "SELECT h.hash, l.status, l.modified_at FROM json_array_elements_text(",
        );
        q.bind(json_bind(hashes)?).push(&format!(
            "::json) AS h (hash) CROSS JOIN LATERAL (SELECT status, modified_at FROM tasks \
             WHERE tasks.hash = h.hash AND {NEWEST_FINISHED}) AS l"
        ));
        return Ok(q);
    }
    let mut q = Sql::new(backend, "SELECT h.hash, t.status, t.modified_at FROM (");
    for (i, h) in hashes.iter().enumerate() {
        q.push(if i == 0 {
            "SELECT "
        } else {
            " UNION ALL SELECT "
        })
        .bind(h.as_str())
        .push(" AS hash");
    }
    if hashes.is_empty() {
        q.push("SELECT NULL AS hash WHERE 1 = 0");
    }
    q.push(&format!(
        ") AS h JOIN tasks t ON t.id = (SELECT f.id FROM tasks f WHERE f.hash = h.hash AND f.{NEWEST_FINISHED})"
    ));
    Ok(q)
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

/// Of these tasks of `scheduler`, those waiting (queued or pending) with a recorded
/// explanation: `(id, explanation, priority)`. An event's re-score reads only the tasks it
/// concerns, each by its primary keys in `task_scores` and `tasks`.
pub fn waiting_scores(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    ids: &[String],
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
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        let mut q = sql(
            conn,
            "SELECT s.task_id, s.explanation, t.priority FROM task_scores s \
             JOIN tasks t ON t.id = s.task_id WHERE s.task_id IN ",
        );
        q.bind_list(chunk.iter().map(String::as_str))
            .push(" AND t.status IN ('pending', 'queued') AND t.scheduler_id = ")
            .bind(scheduler.as_str());
        out.extend(
            q.load::<Row>(conn)?
                .into_iter()
                .map(|r| (r.task_id, r.explanation, r.priority)),
        );
    }
    Ok(out)
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
    push_where(q, lq.scheduler_id, lq.organisation.as_deref());
    if let Some(t) = &lq.task_type {
        q.push(" AND type = ").bind(t.as_str());
    }
    if let Some(s) = lq.status {
        q.push(" AND status = ").bind(s.as_str());
    }
    push_created_and_filter(q, lq.min_created_at, lq.max_created_at, lq.filter.as_ref());
}

/// The total count and one page, newest first.
pub fn list(conn: &mut AnyConnection, lq: &TaskQuery) -> QueryResult<(i64, Vec<TaskRow>)> {
    let conditions = |q: &mut Sql| push_list_conditions(q, lq);
    count_and_page(conn, "tasks", COLUMNS, conditions, lq.offset, lq.limit)
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
