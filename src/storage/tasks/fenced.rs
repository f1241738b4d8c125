//! A queue engine's batch of the common kind — rows it changed (patches, lease expiries), heap
//! tasks it dispatched and pending tasks it popped straight from the backlog — written on
//! PostgreSQL as one autocommitted statement with the multi-instance fence inside it.
//!
//! Written as a transaction the same batch takes five round trips: `BEGIN`, the fence's locking
//! read, the update, the dispatch, `COMMIT`. An engine runs one batch at a time, so every round
//! trip is time its callers wait (docs/BENCHMARKS.md, "Jobs completed per second"). Here the fence
//! is a CTE that every write of the statement is conditioned on: while this instance holds the
//! scheduler under its epoch the fence locks the owner row `FOR SHARE` until the statement
//! commits (a takeover waits for it, and its rebuild then sees the batch); once another instance
//! took it the fence is empty and the statement writes nothing. The result tells the two apart:
//! one row at least while the fence held (the dispatched tasks, or one empty row), none once it
//! did not.
//!
//! Outside a transaction, a connection that breaks while the statement runs leaves its outcome
//! unknown: the server may have committed it before the answer was lost. [`recover`] finds out on
//! a fresh connection, from the rows themselves: every row the statement writes gets the batch's
//! `modified_at` and its new status, which the row had not before (on the system clock each batch
//! has a time of its own, and the rows change only through their engine; a clock injected for
//! tests may repeat a time, so there a row re-written to the same status at the same instant would
//! read as written). So the batch is either known written (its dispatched rows are read back) or
//! known not written (it is written again), and never applied twice.

use super::write::{pg_sync, push_update_from_json};
use super::*;
use crate::storage::StorageError;
use crate::storage::owners;

/// One batch's writes, as [`write()`] takes them.
pub struct FencedWrite<'a> {
    /// The scheduler whose engine writes.
    pub scheduler: SchedulerId,
    /// This instance's name, as its owner row holds it.
    pub instance: &'a str,
    /// The epoch the engine's state was built under.
    pub epoch: i64,
    /// Rows read and changed, written whole (their mutable fields).
    pub updates: &'a [TaskRow],
    /// Heap tasks dispatched (`queued → dispatched`), by id.
    pub dispatched: &'a [String],
    /// Pending tasks popped from the backlog (`pending → dispatched`), by id; their queue rows
    /// are deleted.
    pub taken_pending: &'a [String],
    /// Whether a row of `updates` may have been or become pending: then its queue row is written
    /// with it. A batch of pops and patches of tasks in flight has none, and its statement leaves
    /// the queue table alone (no lock of it to wait for, no part of it to plan).
    pub pending_rows: bool,
    /// The batch's time: every row written gets it as `modified_at`.
    pub at: NaiveDateTime,
    /// The dispatched tasks' lease.
    pub lease: Option<NaiveDateTime>,
}

impl FencedWrite<'_> {
    /// Whether one statement can write this batch: each side within one statement's chunk, no
    /// row on both sides (two writes of one row in one statement are undefined), and every
    /// changed row stamped with the batch's time (what [`recover`] reads).
    pub fn fits(&self) -> bool {
        self.updates.len() <= UPDATE_CHUNK
            && self.dispatched.len() <= CHUNK
            && self.taken_pending.len() <= CHUNK
            && !(self.updates.is_empty()
                && self.dispatched.is_empty()
                && self.taken_pending.is_empty())
            && self.updates.iter().all(|r| r.modified_at == self.at)
            && self.disjoint()
    }

    fn disjoint(&self) -> bool {
        let sides = [
            !self.updates.is_empty(),
            !self.dispatched.is_empty(),
            !self.taken_pending.is_empty(),
        ];
        // The common batch has one side only (pops, or patches): nothing to compare.
        if sides.iter().filter(|&&s| s).count() < 2 {
            return true;
        }
        let n = self.updates.len() + self.dispatched.len() + self.taken_pending.len();
        let mut seen = std::collections::HashSet::with_capacity(n);
        self.updates
            .iter()
            .map(|r| r.id.as_str())
            .chain(self.dispatched.iter().map(String::as_str))
            .chain(self.taken_pending.iter().map(String::as_str))
            .all(|id| seen.insert(id))
    }
}

/// Writes the batch in one statement; answers the dispatched tasks' rows (heap tasks still
/// queued and backlog tasks still pending: a task no longer in the status it was taken in is
/// skipped, as [`transition`] skips it). `Fenced` when another instance owns the scheduler now:
/// then nothing was written.
pub fn write(conn: &mut AnyConnection, w: &FencedWrite<'_>) -> Result<Vec<TaskRow>, StorageError> {
    let rows = statement(w)?.load_prepared::<Option<TaskRow>>(conn)?;
    if rows.is_empty() {
        return Err(StorageError::Fenced(w.scheduler));
    }
    Ok(rows.into_iter().flatten().collect())
}

/// [`write()`]'s statement: the fence, the updates of rows read (their queue rows in step when
/// `pending_rows`), the dispatches of heap and backlog tasks by id, and the backlog tasks' queue
/// rows deleted; each part joined to `tasks` by primary key.
pub fn statement(w: &FencedWrite<'_>) -> QueryResult<Sql> {
    let mut q = Sql::new(Backend::Postgres, "WITH fence AS MATERIALIZED (");
    owners::push_fence(&mut q, w.scheduler, w.instance, w.epoch);
    q.push("), moved AS (");
    push_update_from_json(&mut q, w.updates)?;
    q.push(" AND EXISTS (SELECT 1 FROM fence) RETURNING tasks.*)");
    if w.pending_rows && !w.updates.is_empty() {
        q.push(&pg_sync());
    }
    push_dispatch(&mut q, "dispatched", w.dispatched, TaskStatus::Queued, w)?;
    push_dispatch(&mut q, "taken", w.taken_pending, TaskStatus::Pending, w)?;
    if !w.taken_pending.is_empty() {
        q.push(
            ", unqueued AS (DELETE FROM task_queue USING taken \
             WHERE task_queue.task_id = taken.id)",
        );
    }
    q.push(
        " SELECT d.* FROM fence LEFT JOIN \
         (SELECT * FROM dispatched UNION ALL SELECT * FROM taken) AS d ON true",
    );
    Ok(q)
}

/// Appends `, {name}_ids (pid) AS (…), {name} AS (UPDATE tasks …)`: the tasks `ids` (one JSON
/// bind, so the statement's text is the same for any ids) moved to `dispatched` with the batch's
/// time and lease, each only while it still has status `was` and the fence holds, returned.
fn push_dispatch(
    q: &mut Sql,
    name: &str,
    ids: &[String],
    was: TaskStatus,
    w: &FencedWrite<'_>,
) -> QueryResult<()> {
    let ids = json_bind(ids)?;
    q.push(&format!(
        ", {name}_ids (pid) AS (SELECT value FROM json_array_elements_text("
    ))
    .bind(ids)
    .push(&format!(
        "::json)), {name} AS (UPDATE tasks SET status = 'dispatched', modified_at = "
    ))
    .bind(w.at)
    .push(", lease_expires_at = ")
    .bind(Bind::OptTime(w.lease))
    .push(&format!(
        " FROM {name}_ids WHERE tasks.id = {name}_ids.pid AND tasks.status = '{}' \
         AND EXISTS (SELECT 1 FROM fence) RETURNING {COLUMNS})",
        was.as_str()
    ));
    Ok(())
}

/// After [`write()`] failed on a broken connection, on a fresh one: reads whether the batch was
/// committed, and answers its dispatched rows as they were written if so; writes it now if not.
pub fn recover(
    conn: &mut AnyConnection,
    w: &FencedWrite<'_>,
) -> Result<Vec<TaskRow>, StorageError> {
    if !landed(conn, w)? {
        return write(conn, w);
    }
    let ids: Vec<String> = w
        .dispatched
        .iter()
        .chain(w.taken_pending)
        .cloned()
        .collect();
    let mut rows = get_many(conn, &ids)?;
    rows.retain(|r| r.status == TaskStatus::Dispatched && r.modified_at == w.at);
    Ok(rows)
}

/// Whether the batch was committed: a row it names holds the status and time it wrote. (The
/// statement is atomic, so one row tells for all; a batch that would change no row is found not
/// written, and writing it again changes none either.)
pub fn landed(conn: &mut AnyConnection, w: &FencedWrite<'_>) -> QueryResult<bool> {
    #[derive(serde::Serialize)]
    struct Written<'a> {
        id: &'a str,
        status: &'a str,
    }
    let written: Vec<Written<'_>> = w
        .updates
        .iter()
        .map(|r| Written {
            id: &r.id,
            status: r.status.as_str(),
        })
        .chain(
            w.dispatched
                .iter()
                .chain(w.taken_pending)
                .map(|id| Written {
                    id,
                    status: TaskStatus::Dispatched.as_str(),
                }),
        )
        .collect();
    let json = json_bind(&written)?;
    let mut q = Sql::new(
        Backend::Postgres,
        "SELECT COUNT(*) AS count FROM tasks JOIN json_to_recordset(",
    );
    q.bind(json)
        .push(
            "::json) AS w(id text, status text) ON tasks.id = w.id AND tasks.status = w.status \
             WHERE tasks.modified_at = ",
        )
        .bind(w.at);
    Ok(q.load_prepared::<CountRow>(conn)?
        .first()
        .is_some_and(|r| r.count > 0))
}
