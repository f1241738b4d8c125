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
