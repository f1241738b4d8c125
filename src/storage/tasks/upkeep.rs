//! Upkeep: finished tasks past their retention, key columns filled in after an upgrade, and the
//! check that `tasks` and `task_queue` agree. (Leases past their end are found in the engines'
//! memory: `queue::engine::leases`.)

use super::*;

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

/// Fills the key-field columns of `scheduler`'s pending tasks written before they existed (or by
/// an older version during a rolling deploy), found through their queue rows' index; returns how
/// many rows it filled. Queued tasks have no queue row: a rebuild finds theirs in its scan of
/// `tasks` and fills them with [`fill_keys_of`].
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
            filled += fill_keys(conn, scheduler, row)?;
        }
        if page.len() < CHUNK {
            break;
        }
    }
    Ok(filled)
}

/// Fills the key-field columns of these tasks from their payloads (and of their queue rows, for
/// pending ones); returns how many tasks got any.
pub fn fill_keys_of(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    ids: &[String],
) -> QueryResult<usize> {
    let mut filled = 0;
    for chunk in ids.chunks(CHUNK) {
        for row in payloads(conn, chunk)? {
            filled += fill_keys(conn, scheduler, &row)?;
        }
    }
    Ok(filled)
}

/// Writes the key fields `row`'s payload gives into its task and its queue row (if pending);
/// answers how many tasks changed (0 when the payload names none).
fn fill_keys(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    row: &PayloadRow,
) -> QueryResult<usize> {
    let keys = DataKeys::of_json(scheduler, &row.data);
    if keys == DataKeys::default() {
        return Ok(0);
    }
    let mut filled = 0;
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
    Ok(filled)
}

/// Ids of tasks whose `task_queue` row is out of step with the task: a pending task without its
/// row or with another rank or key field, or a row whose task is gone or no longer pending
/// (queued tasks have no row: they are in a heap). Empty when the invariant of migrations 11 and
/// 16 holds (tests check it after every run).
pub fn queue_mismatches(conn: &mut AnyConnection) -> QueryResult<Vec<String>> {
    let same = |col: &str| format!("COALESCE(q.{col}, '') = COALESCE(t.{col}, '')");
    let text = format!(
        "SELECT t.id FROM tasks t LEFT JOIN task_queue q ON q.task_id = t.id \
         WHERE t.status = 'pending' AND NOT (q.task_id IS NOT NULL \
         AND q.status = t.status AND q.scheduler_id = t.scheduler_id \
         AND q.priority = t.priority AND q.created_at = t.created_at \
         AND q.modified_at = t.modified_at AND q.organisation = t.organisation \
         AND {} AND {} AND {} AND {} AND {} AND {}) \
         UNION ALL SELECT q.task_id AS id FROM task_queue q LEFT JOIN tasks t ON t.id = q.task_id \
         WHERE t.id IS NULL OR t.status <> 'pending' OR q.status <> 'pending'",
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
