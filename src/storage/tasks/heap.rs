//! What the queue engines read of waiting work: the heap's rows at a rebuild, the refill from
//! `pending`, the pending tasks a filtered pop may take, and what a push must know (hashes
//! waiting or in flight).

use super::*;

/// Waiting (pending or queued) tasks of `scheduler` with one of these hashes: every task of each
/// hash through the leading column of `ix_tasks_hash_created` (the waiting one and its past
/// runs), the status checked in the row. A push reads it only when the backlog's hashes are not
/// all known in memory (`queue::engine::push::reads`).
pub fn waiting_by_hash(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    hashes: &[String],
) -> QueryResult<Vec<TaskRow>> {
    if Backend::of(conn) == Backend::Postgres {
        return waiting_by_hash_statement(scheduler, hashes)?.load_prepared(conn);
    }
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

/// [`waiting_by_hash`]'s statement on PostgreSQL: one lookup of the hash index per hash (the
/// hashes in one JSON bind, so one text for any number, kept prepared), fenced by `OFFSET 0` so
/// that it stays one. Written as `hash IN (…) AND scheduler_id = … AND status IN (…)`, on a
/// `tasks` never analysed the default selectivities of the three conditions together promised a
/// handful of rows, and the engine's connection (no bitmap scans) was planned a parallel scan of
/// the whole table for every push batch: 50–80 ms at 200,000 tasks, pushes into a full heap at
/// about 200/s. Per hash, the index costs a fraction of a scan whatever the table's size or
/// statistics, so no state of the table changes the plan.
pub fn waiting_by_hash_statement(scheduler: SchedulerId, hashes: &[String]) -> QueryResult<Sql> {
    let mut q = Sql::new(
        Backend::Postgres,
        "SELECT t.* FROM json_array_elements_text(",
    );
    q.bind(json_bind(hashes)?)
        .push(&format!(
            "::json) AS h (hash) CROSS JOIN LATERAL (SELECT {COLUMNS} FROM tasks \
             WHERE tasks.hash = h.hash AND scheduler_id = "
        ))
        .bind(scheduler.as_str())
        .push(" AND status IN ('pending', 'queued') OFFSET 0) AS t");
    Ok(q)
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

/// How many tasks of `scheduler` are in `status` (`pending` or `queued`). Pending tasks are
/// counted in their queue rows' index; queued ones, which have no queue row, in `tasks`, a scan
/// (a rebuild's, and a view of a scheduler whose owner cannot be asked).
pub fn count_waiting(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    status: TaskStatus,
) -> QueryResult<u64> {
    // The status in the text, as in [`pending_page`]: pending rows are counted in their index.
    let table = match status {
        TaskStatus::Pending => "task_queue",
        _ => "tasks",
    };
    let mut q = sql(
        conn,
        &format!(
            "SELECT COUNT(*) AS count FROM {table} WHERE status = '{}' AND scheduler_id = ",
            status.as_str()
        ),
    );
    q.bind(scheduler.as_str());
    Ok(q.load::<CountRow>(conn)?
        .first()
        .map(|r| u64::try_from(r.count).unwrap_or(0))
        .unwrap_or(0))
}

/// Appends `AND (priority, created_at, task_id) > (key)` (or `<` with `before`): every queue row
/// ranked after (before) `key` in pop order; an index condition on every index of pending rows in
/// pop order.
fn push_ranked(q: &mut Sql, key: &PopKey, op: &str) {
    q.push(&format!(" AND (priority, created_at, task_id) {op} ("))
        .bind(key.priority)
        .push(", ")
        .bind(key.created_at)
        .push(", ")
        .bind(key.id.as_str())
        .push(")");
}

/// Rows a rebuild reads from its cursor at a time on PostgreSQL.
const REBUILD_FETCH: usize = 2_000;

/// Every queued and in-flight (`dispatched`, `running`) task of `scheduler`, one by one in the
/// table's order: what a rebuild reads of `tasks`, in one scan. `tasks` has no status index
/// (every pop and patch would write it), so a rebuild pays one pass over the scheduler's rows,
/// finished history included, and no more (queued tasks have no queue row since migration 16).
pub fn live_all(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    each: impl FnMut(LiveRow),
) -> QueryResult<()> {
    scan_scheduler(
        conn,
        scheduler,
        &format!(
            "SELECT {HEAP_COLUMNS}, status, lease_expires_at FROM tasks \
             WHERE status IN ('queued', 'dispatched', 'running') AND scheduler_id = "
        ),
        each,
    )
}

/// Every queued task of `scheduler`, one by one in the table's order, from `tasks`: a second pass
/// of a rebuild that found more queued than fit (the heap sorts them in memory).
pub fn queued_all(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    each: impl FnMut(HeapRow),
) -> QueryResult<()> {
    scan_scheduler(
        conn,
        scheduler,
        &format!("SELECT {HEAP_COLUMNS} FROM tasks WHERE status = 'queued' AND scheduler_id = "),
        each,
    )
}

/// Runs `select` (ending `scheduler_id = `) for `scheduler` and hands each row to `each`.
///
/// On PostgreSQL through a cursor, [`REBUILD_FETCH`] rows at a time, inside the caller's
/// transaction: libpq holds a statement's whole result in memory, so a million rows read at
/// once took about 300 MB for the rebuild's length, allocated between the heap's own growing
/// tables, and the allocator could not give it back afterwards (it stayed resident, about as
/// large again as the heap). SQLite steps through its rows already.
fn scan_scheduler<T>(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    select: &str,
    mut each: impl FnMut(T),
) -> QueryResult<()>
where
    T: diesel::deserialize::QueryableByName<crate::storage::MultiBackend> + 'static,
{
    if Backend::of(conn) == Backend::Postgres {
        // A utility statement takes no binds: the scheduler id is one of three fixed names.
        sql(
            conn,
            &format!(
                "DECLARE heap_rebuild NO SCROLL CURSOR FOR {select}'{}'",
                scheduler.as_str()
            ),
        )
        .execute(conn)?;
        loop {
            let rows: Vec<T> = sql(
                conn,
                &format!("FETCH FORWARD {REBUILD_FETCH} FROM heap_rebuild"),
            )
            .load(conn)?;
            let last = rows.len() < REBUILD_FETCH;
            rows.into_iter().for_each(&mut each);
            if last {
                break;
            }
        }
        return sql(conn, "CLOSE heap_rebuild").execute(conn).map(drop);
    }
    let mut q = sql(conn, select);
    q.bind(scheduler.as_str());
    q.for_each(conn, each)
}

/// Moves every queued task of `scheduler` ranked after `after` to `pending` (when the heap
/// bound is lower than what is queued), their queue rows written with them; returns how many
/// moved. A scan of `tasks`, at a rebuild after `maxsize` was lowered.
pub fn demote_after(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    after: &PopKey,
    now: NaiveDateTime,
) -> QueryResult<usize> {
    let moved = write_returning(conn, |q, pg| {
        q.push("UPDATE tasks SET status = 'pending', modified_at = ")
            .bind(now)
            .push(" WHERE status = 'queued' AND scheduler_id = ")
            .bind(scheduler.as_str())
            .push(" AND (priority, created_at, id) > (")
            .bind(after.priority)
            .push(", ")
            .bind(after.created_at)
            .push(", ")
            .bind(after.id.as_str())
            .push(")")
            .push(&returning(pg));
    })?;
    Ok(moved.len())
}

/// Every queued task as a heap holds it (tests and tools), from `tasks`.
pub fn queued_keys(conn: &mut AnyConnection) -> QueryResult<Vec<HeapRow>> {
    sql(
        conn,
        &format!("SELECT {HEAP_COLUMNS} FROM tasks WHERE status = 'queued'"),
    )
    .load(conn)
}

/// Moves the best `limit` pending tasks of `scheduler` to `queued` and returns them as a heap
/// holds them: a rebuild's refill, for the caller's transaction. The picks are read in pop order
/// ([`refill_picks`]) and handed to `picked` before they move ([`settle`]: a pick changed
/// meanwhile does not move, and its queue row goes).
pub fn refill(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    limit: usize,
    now: NaiveDateTime,
    picked: &mut dyn FnMut(Vec<HeapRow>),
) -> QueryResult<Vec<HeapRow>> {
    let picks = refill_picks(conn, scheduler, Keyset::First, limit)?;
    if picks.is_empty() {
        return Ok(picks);
    }
    let ids: Vec<String> = picks.iter().map(|p| p.id.clone()).collect();
    picked(picks);
    settle(conn, &ids, now)
}

/// The best `limit` pending tasks of `scheduler` in pop order from `from` (not
/// [`Keyset::Before`]), as a heap holds them: what a refill reads, through
/// `ix_task_queue_pending_rank` (the row comparison is a condition of that index). One text for
/// each kind of start, kept prepared. The engines' refills read and write nothing: the heap holds
/// what they read until a pop takes it (`queue::engine::state::Copies`).
pub fn refill_picks(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    from: Keyset<'_>,
    limit: usize,
) -> QueryResult<Vec<HeapRow>> {
    refill_picks_statement(Backend::of(conn), scheduler, from, limit).load_prepared(conn)
}

/// [`refill_picks`]' statement: a walk of `ix_task_queue_pending_rank` from `from`, to `limit`.
pub fn refill_picks_statement(
    backend: Backend,
    scheduler: SchedulerId,
    from: Keyset<'_>,
    limit: usize,
) -> Sql {
    let mut q = pending_queue_rows(backend, scheduler);
    push_keyset(&mut q, from);
    q.push(&format!(" ORDER BY {QUEUE_ORDER} LIMIT "))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX));
    q
}

/// Writes these tasks (ids) `queued` where they are still pending, and deletes their queue rows:
/// what a heap holds as a refill read it, before a batch that may meet those rows, and a
/// rebuild's refill. Answers the tasks written, as a heap holds them.
pub fn settle(
    conn: &mut AnyConnection,
    ids: &[String],
    now: NaiveDateTime,
) -> QueryResult<Vec<HeapRow>> {
    let mut out = Vec::with_capacity(ids.len());
    if Backend::of(conn) == Backend::Postgres {
        for chunk in ids.chunks(SETTLE_CHUNK) {
            out.extend(refill_move(conn, chunk, now)?);
        }
        return Ok(out);
    }
    for chunk in ids.chunks(CHUNK) {
        // The moved tasks' heap columns come back from the update itself.
        out.extend(transition_sqlite(
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

/// Tasks [`settle`] writes per statement on PostgreSQL (a heap may hold 10,000 as read).
pub const SETTLE_CHUNK: usize = 5_000;

/// Moves these picks of a refill (ids) to `queued` where they are still pending (PostgreSQL), in
/// one statement: each task still pending updated in place, and every pick's queue row deleted.
/// So a queue row left for a task no longer pending (changed by hand) goes with its refill instead
/// of being picked again by every refill after it, which would move nothing for it and find the
/// backlog short each time; a pending task whose row was lost still moves. One text for any picks
/// (the ids in one JSON bind), kept prepared. Answers the moved tasks as a heap holds them, from
/// `tasks`. Its text begins with `WITH refilled`, which the tests that hold a refill under way
/// look for.
fn refill_move(
    conn: &mut AnyConnection,
    ids: &[String],
    now: NaiveDateTime,
) -> QueryResult<Vec<HeapRow>> {
    let ids = json_bind(ids)?;
    let mut q = sql(
        conn,
        "WITH refilled_picks AS (SELECT value AS pick FROM json_array_elements_text(",
    );
    q.bind(ids)
        .push("::json)), refilled AS (UPDATE tasks SET status = 'queued', modified_at = ")
        .bind(now)
        .push(&format!(
            " FROM refilled_picks WHERE tasks.id = refilled_picks.pick \
             AND tasks.status = 'pending' RETURNING {HEAP_COLUMNS}), \
             gone AS (DELETE FROM task_queue USING refilled_picks \
             WHERE task_queue.task_id = refilled_picks.pick) \
             SELECT {HEAP_COLUMNS} FROM refilled"
        ));
    q.load_prepared(conn)
}

/// Where a keyset page starts: after a task in pop order, at one, or (from the best) before one.
#[derive(Debug, Clone, Copy)]
pub enum Keyset<'a> {
    /// From the best task.
    First,
    /// After this task.
    After(&'a PopKey),
    /// At this task's place in pop order (included): a refill's, where a task became pending
    /// ahead of what the heap's refills had read.
    From(&'a PopKey),
    /// From the best task, up to this one (excluded).
    Before(&'a PopKey),
}

/// The condition of a keyset page.
fn push_keyset(q: &mut Sql, from: Keyset<'_>) {
    match from {
        Keyset::First => {}
        Keyset::After(k) => push_ranked(q, k, ">"),
        Keyset::From(k) => push_ranked(q, k, ">="),
        Keyset::Before(k) => push_ranked(q, k, "<"),
    }
}

/// `SELECT` of the queue rows of `scheduler`'s pending tasks as a heap holds them, for the caller
/// to add its conditions, order and limit to. The status is written into the text, not bound:
/// the indexes of `task_queue` in pop order are partial (pending rows), and a planner uses one
/// only for a condition it can see implies the index's (SQLite never for a bound value).
fn pending_queue_rows(backend: Backend, scheduler: SchedulerId) -> Sql {
    let mut q = Sql::new(
        backend,
        &format!(
            "SELECT {QUEUE_HEAP_COLUMNS} FROM task_queue WHERE status = 'pending' \
             AND scheduler_id = "
        ),
    );
    q.bind(scheduler.as_str());
    q
}

/// The next `limit` pending tasks of `scheduler` in pop order from `from`, as a heap holds them
/// (a keyset page through `ix_task_queue_pending_rank`): the pending rows that rank before a
/// heap's worst task, at a rebuild.
pub fn pending_page(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    from: Keyset<'_>,
    limit: usize,
) -> QueryResult<Vec<HeapRow>> {
    let mut q = pending_queue_rows(Backend::of(conn), scheduler);
    push_keyset(&mut q, from);
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
                    .bind(value.as_str())
                    .push(&index_bound(field, std::slice::from_ref(value), "q."));
            }
            Some((field, values)) => {
                q.push(&format!(" AND q.{} IN ", field.column()))
                    .bind_list(values.iter().map(String::as_str))
                    .push(&index_bound(field, values, "q."));
            }
            None => {}
        }
        q.push(") tasks WHERE ");
        push_filter(&mut q, filter);
        q.push(" ORDER BY priority, created_at, queue_id LIMIT ")
            .bind(want);
        q
    };
    let rows: Vec<TaskRow> = match lookup {
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
            q.bind(scheduler.as_str());
            q.push(" ORDER BY q.priority, q.created_at, q.task_id LIMIT ")
                .bind(i64::try_from(PENDING_PROBE).unwrap_or(i64::MAX))
                .push(") head WHERE ");
            push_filter(&mut q, filter);
            q.push(&format!(" ORDER BY {POP_ORDER} LIMIT ")).bind(want);
            q.load(conn)?
        }
    };
    // A queue row whose task is no longer pending was left by a change made behind the
    // service's back (a task cancelled by hand in SQL, its queue row kept). Not a match, and
    // deleted, so the next search does not meet it again. (Not a condition of the statement:
    // a predicate on the task's status had the planner read every task of an organisation
    // through `ix_tasks_organisation`, 7 ms a search instead of 0.1.)
    let (mut rows, stale): (Vec<TaskRow>, Vec<TaskRow>) = rows
        .into_iter()
        .partition(|r| r.status == TaskStatus::Pending);
    if !stale.is_empty() {
        let ids: Vec<&str> = stale.iter().map(|r| r.id.as_str()).collect();
        forget_stale_queue_rows(conn, &ids)?;
    }
    rows.retain(|r| !skip.contains(&r.id));
    rows.sort_by(|a, b| (a.priority, a.created_at, &a.id).cmp(&(b.priority, b.created_at, &b.id)));
    rows.truncate(limit);
    Ok(rows)
}

/// The best `limit` queue rows of `scheduler`'s pending tasks with one of `values` in key field
/// `field`, in pop order, read from `task_queue` alone (its index of that field, one range per
/// value): what a pop needs to choose and take pending tasks, without their payloads.
///
/// Without the join to `tasks` a search costs the server a seventh (run and plan: 0.27 + 0.3 ms
/// for 65 rows, against 2.5 + 2.1 ms joined, on the pending benchmark's table) and the engine
/// half (docs/BENCHMARKS.md, "Backlog searches from the queue rows alone"), and a runner's filter (an organisation, images, plugin ids) is decided
/// from the key fields a queue row holds. A queue row whose task is no longer pending (changed
/// by hand in SQL) is not told apart here: the pop's write takes a task only while it is pending,
/// and the engine deletes such rows when a write skips them.
pub fn pending_keyed(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    field: KeyField,
    values: &[String],
    limit: usize,
) -> QueryResult<Vec<HeapRow>> {
    let range = |conn: &AnyConnection, values: &[String]| {
        pending_keyed_statement(Backend::of(conn), scheduler, field, values, limit)
    };
    match values {
        [] => Ok(Vec::new()),
        values if values.len() <= LOOKUP_RANGES_MAX => {
            // One text per key field: kept prepared, so a search is neither parsed nor (once the
            // server settles on the generic plan, the same index walk) planned again.
            let mut out = Vec::new();
            for value in values {
                out.extend(
                    range(conn, std::slice::from_ref(value)).load_prepared::<HeapRow>(conn)?,
                );
            }
            Ok(out)
        }
        values => range(conn, values).load(conn),
    }
}

/// [`pending_keyed`]'s statement for `values` (one value: a walk of the field's index of pending
/// rows in pop order, to `limit`).
pub fn pending_keyed_statement(
    backend: Backend,
    scheduler: SchedulerId,
    field: KeyField,
    values: &[String],
    limit: usize,
) -> Sql {
    let mut q = pending_queue_rows(backend, scheduler);
    let column = field.column();
    let bound = index_bound(field, values, "");
    q.push(&bound);
    // A reference longer than the index holds has no walk of its own: the pop order's, filtered.
    let indexed = field != KeyField::InputOoi || !bound.is_empty();
    match values {
        [value] if backend == Backend::Postgres && indexed => {
            // The value as a range of one, and the order led by the field: only the field's own
            // index gives that order without a sort, which the engine's connection does not do.
            // As `= value` with `ORDER BY priority, …`, the index of all pending rows in pop
            // order gives the order as well (an equality makes its column constant, dropped
            // from the order), and on a queue table never analysed both walks are estimated
            // at a row or two: the planner took that one and filtered it, reading every pending
            // row of the scheduler for a value few or none of them have. A deterministic
            // collation (every one PostgreSQL creates by default) makes the range the equality.
            q.push(&format!(" AND {column} >= "))
                .bind(value.as_str())
                .push(&format!(" AND {column} <= "))
                .bind(value.as_str())
                .push(&format!(" ORDER BY {column}, {QUEUE_ORDER} LIMIT "));
        }
        [value] => {
            q.push(&format!(" AND {column} = "))
                .bind(value.as_str())
                .push(&format!(" ORDER BY {QUEUE_ORDER} LIMIT "));
        }
        values => {
            q.push(&format!(" AND {column} IN "))
                .bind_list(values.iter().map(String::as_str))
                .push(&format!(" ORDER BY {QUEUE_ORDER} LIMIT "));
        }
    }
    q.bind(i64::try_from(limit).unwrap_or(i64::MAX));
    q
}

/// The longest object reference (`input_ooi`) the index of pending rows by reference holds
/// (migration 20): PostgreSQL refuses an index entry over 2,704 bytes, a character takes up to
/// four, and a reference may be a URL of any length.
pub const INDEXED_REFERENCE_CHARS: usize = 600;

/// The condition that lets the planner use the index of pending rows by reference, which holds
/// only references of up to [`INDEXED_REFERENCE_CHARS`] (its predicate, repeated: neither
/// PostgreSQL nor SQLite can prove it of a bound value), when every value searched for is that
/// short; empty for another key field, or for a longer value, whose search walks the pop order.
/// Naming the bound changes no answer: a row equal to a short value is as short.
fn index_bound(field: KeyField, values: &[String], alias: &str) -> String {
    if field == KeyField::InputOoi
        && values
            .iter()
            .all(|v| v.chars().count() <= INDEXED_REFERENCE_CHARS)
    {
        format!(" AND length({alias}input_ooi) <= {INDEXED_REFERENCE_CHARS}")
    } else {
        String::new()
    }
}

/// Deletes the queue rows of these tasks whose task is no longer pending (read so in the same
/// statement: a task made pending again meanwhile keeps its row).
pub fn forget_stale_queue_rows(conn: &mut AnyConnection, ids: &[&str]) -> QueryResult<()> {
    for chunk in ids.chunks(CHUNK) {
        let mut q = sql(conn, "DELETE FROM task_queue WHERE task_id IN ");
        q.bind_list(chunk.iter().copied()).push(
            " AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = task_queue.task_id \
             AND t.status = 'pending')",
        );
        q.execute(conn)?;
    }
    Ok(())
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

/// `scheduler`'s tasks that count against its dispatch limits after a rebuild: those in flight
/// (`dispatched`, `running`), and those finished since `since` (the start of the longest rate
/// span). Like [`live_all`], a scan, read once per rebuild and only when limits are set.
pub fn dispatched_since(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    since: NaiveDateTime,
) -> QueryResult<Vec<TaskRow>> {
    let mut q = sql(
        conn,
        &format!("SELECT {COLUMNS} FROM tasks WHERE scheduler_id = "),
    );
    q.bind(scheduler.as_str());
    q.push(
        " AND (status IN ('dispatched', 'running') \
         OR (status IN ('completed', 'failed', 'cancelled') AND modified_at > ",
    );
    q.bind(since);
    q.push("))");
    q.load(conn)
}
