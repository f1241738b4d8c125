//! Leases: a popped task must be started, and a running one finished or renewed, in time. The
//! watchdog finds tasks whose lease ended with a read outside the engine; this rule checks each
//! again (a task finished or renewed since is left alone) and re-queues it with one more attempt,
//! or fails it once its attempts are used up.

use chrono::{DateTime, Utc};
use tracing::{info, warn};
use uuid::Uuid;

use super::batch::BatchRows;
use super::place::{Admission, internal, place};
use super::rejoin;
use super::state::QueueState;
use crate::domain::{Placement, TaskStatus};
use crate::queue::types::{ExpiryReport, QueueError};
use crate::storage::rows::TaskRow;

/// How the reason of a task whose lease expired begins; [`taken_back`] reads it.
const EXPIRED: &str = "lease expired while";

/// Whether the watchdog took `row` back from a holder whose lease expired (it waits again, or
/// was failed with its attempts used up): a late `PATCH` from that holder is its result after
/// all (see [`super::patch`]).
pub(crate) fn taken_back(row: &TaskRow) -> bool {
    row.attempts > 0
        && row
            .failure_reason
            .as_deref()
            .is_some_and(|r| r.starts_with(EXPIRED))
}

/// Expires the leases of those of `ids` (their rows read) that have ended.
pub(crate) fn expire(
    st: &mut QueueState,
    rows: &mut BatchRows,
    ids: &[Uuid],
    now: DateTime<Utc>,
) -> Result<ExpiryReport, QueueError> {
    let mut report = ExpiryReport::default();
    let at = now.naive_utc();
    for id in ids {
        let Some(mut row) = rows.get(id).cloned() else {
            // Deleted behind the engine's back: nothing to expire. Kept in the book, it would
            // come first in every sweep (its lease ended longest ago) and, a thousand such,
            // hold every real expiry back.
            st.leases.record(*id, TaskStatus::Cancelled, None);
            continue;
        };
        let held = row.status;
        let ended = row.lease_expires_at.is_some_and(|end| end < at);
        if row.scheduler_id != st.scheduler.as_str() {
            st.leases.record(*id, TaskStatus::Cancelled, None);
            continue;
        }
        if !matches!(held, TaskStatus::Dispatched | TaskStatus::Running) || !ended {
            // Finished, or its lease lengthened, behind the engine's back: the book follows
            // the table.
            st.leases.record(*id, held, row.lease_expires_at);
            continue;
        }
        row.attempts = row.attempts.saturating_add(1);
        row.lease_expires_at = None;
        row.modified_at = at;
        let max = st.limits.max_attempts;
        let exhausted = u32::try_from(row.attempts).unwrap_or(u32::MAX) >= max;
        if exhausted {
            row.status = held.expire(true, Placement::Heap).map_err(internal)?;
            row.failure_reason = Some(format!(
                "{EXPIRED} {held}, {} of {max} attempts used",
                row.attempts
            ));
            report.failed.push(*id);
            warn!(task.id = %id, scheduler.id = %st.scheduler, attempts = row.attempts, "lease expired; attempts used up, task failed");
        } else {
            rejoin::join(st, rows, *id, &mut row, now);
            let p = place(st, rows, *id, &row, Admission::Accepted)?;
            row.status = held.expire(false, p).map_err(internal)?;
            row.failure_reason = Some(format!("{EXPIRED} {held}"));
            report.requeued.push(*id);
            info!(task.id = %id, scheduler.id = %st.scheduler, attempts = row.attempts, "lease expired; task queued again");
        }
        rows.update(*id, row);
    }
    Ok(report)
}

/// Tasks whose pop was committed but whose answer never reached the caller (it hung up) go back
/// to the queue at once rather than waiting out their lease. A task the worker has since touched
/// (it is no longer `dispatched`) is left alone.
pub(crate) fn give_back(
    st: &mut QueueState,
    rows: &mut BatchRows,
    ids: &[Uuid],
    now: DateTime<Utc>,
) {
    for id in ids {
        let Some(mut row) = rows.get(id).cloned() else {
            continue;
        };
        if row.status != TaskStatus::Dispatched || row.scheduler_id != st.scheduler.as_str() {
            continue;
        }
        rejoin::join(st, rows, *id, &mut row, now);
        let placed = place(st, rows, *id, &row, Admission::Accepted)
            .and_then(|p| row.status.enqueue(p).map_err(internal));
        match placed {
            Ok(status) => {
                row.status = status;
                row.lease_expires_at = None;
                row.modified_at = now.naive_utc();
                rows.update(*id, row);
            }
            Err(e) => {
                warn!(task.id = %id, error = %e, "an undelivered task could not be given back; its lease will")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::engine::testing::{now, row, state};
    use crate::queue::types::WhenFull;

    #[test]
    fn an_ended_lease_requeues_until_the_attempts_are_used() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (id, mut r) = row(5, 1);
        r.status = TaskStatus::Running;
        r.lease_expires_at = Some(now().naive_utc() - chrono::Duration::seconds(1));
        r.attempts = i32::try_from(st.limits.max_attempts).unwrap() - 2;
        rows.load(vec![r], "boefje");
        let report = expire(&mut st, &mut rows, &[id], now()).unwrap();
        assert_eq!(report.requeued, vec![id]);
        assert!(st.heap.contains(&id));
        // popped again, and again not finished in time: failed
        let mut r = rows.get(&id).unwrap().clone();
        st.heap.remove(&id);
        r.status = TaskStatus::Dispatched;
        r.lease_expires_at = Some(now().naive_utc() - chrono::Duration::seconds(1));
        rows.update(id, r);
        let report = expire(&mut st, &mut rows, &[id], now()).unwrap();
        assert_eq!(report.failed, vec![id]);
        let r = rows.get(&id).unwrap();
        assert_eq!(r.status, TaskStatus::Failed);
        assert!(
            r.failure_reason
                .as_deref()
                .unwrap()
                .contains("attempts used")
        );
    }

    #[test]
    fn an_undelivered_pop_gives_its_task_back_unless_the_worker_touched_it() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (lost, mut r) = row(5, 1);
        r.status = TaskStatus::Dispatched;
        r.lease_expires_at = Some(now().naive_utc());
        let (started, mut s) = row(6, 2);
        s.status = TaskStatus::Running;
        rows.load(vec![r, s], "boefje");
        give_back(&mut st, &mut rows, &[lost, started], now());
        let r = rows.get(&lost).unwrap();
        assert_eq!((r.status, r.lease_expires_at), (TaskStatus::Queued, None));
        assert!(st.heap.contains(&lost));
        assert_eq!(rows.get(&started).unwrap().status, TaskStatus::Running);
        assert!(!st.heap.contains(&started));
    }

    #[test]
    fn an_undelivered_task_whose_work_was_pushed_again_meanwhile_takes_that_tasks_place() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (lost, mut r) = row(5, 1);
        r.status = TaskStatus::Dispatched;
        let (again, mut a) = row(1, 2);
        a.hash = r.hash.clone();
        place(&mut st, &mut rows, again, &a, Admission::New).unwrap();
        rows.load(vec![r, a], "boefje");
        give_back(&mut st, &mut rows, &[lost], now());
        let r = rows.get(&lost).unwrap();
        assert_eq!((r.status, r.priority), (TaskStatus::Queued, 1));
        assert_eq!(rows.get(&again).unwrap().status, TaskStatus::Cancelled);
        assert!(st.heap.contains(&lost) && !st.heap.contains(&again));
    }

    #[test]
    fn a_renewed_lease_is_left_alone() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (id, mut r) = row(5, 1);
        r.status = TaskStatus::Running;
        r.lease_expires_at = Some(now().naive_utc() + chrono::Duration::seconds(30));
        rows.load(vec![r], "boefje");
        let report = expire(&mut st, &mut rows, &[id], now()).unwrap();
        assert!(report.requeued.is_empty() && report.failed.is_empty());
    }
}
