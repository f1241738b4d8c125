//! `PATCH /tasks/{id}`: a client moves a task along the edges the state machine allows, or gives
//! it a new priority. The task's row is read first (see [`super::Engine`]).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::batch::BatchRows;
use super::lease::taken_back;
use super::place::{Admission, place, placed_status};
use super::rejoin;
use super::state::QueueState;
use crate::domain::TaskStatus;
use crate::queue::types::{QueueError, TaskPatch};

/// Applies one patch; answers the task's id (its row is in `rows`).
pub(crate) fn patch(
    st: &mut QueueState,
    rows: &mut BatchRows,
    id: Uuid,
    patch: &TaskPatch,
    now: DateTime<Utc>,
) -> Result<Uuid, QueueError> {
    let Some(mut row) = rows.get(&id).cloned() else {
        return Err(QueueError::TaskNotFound(id));
    };
    if row.scheduler_id != st.scheduler.as_str() {
        // Routed by the task's scheduler, so this only happens if the row changed hands.
        return Err(QueueError::TaskNotFound(id));
    }
    let from = row.status;
    // A holder whose lease expired may still start or finish the work: its word is taken, and
    // the copy waiting again is withdrawn (see `TaskStatus::check_late_patch`). Once handed out
    // again the task is simply dispatched or running, and any result moves it on. Checked before
    // anything changes: a refused PATCH must leave the heap as the table has it (a priority
    // applied to the heap first would rank the task by a value no row holds).
    let late = taken_back(&row);
    if let Some(to) = patch.status {
        if late {
            from.check_late_patch(to)
        } else {
            from.check_patch(to)
        }
        .map_err(QueueError::IllegalTransition)?;
    }
    let mut changed = false;
    if let Some(p) = patch.priority
        && p != row.priority
    {
        row.priority = p;
        row.modified_at = now.naive_utc();
        match from {
            TaskStatus::Queued => {
                st.heap.rerank(&id, p, row.modified_at);
            }
            TaskStatus::Pending if patch.status.is_none_or(|to| to == from) => {
                // More urgent now: it may belong in the heap.
                st.pending.remove(row.hash.as_deref());
                let placement = place(st, rows, id, &row, Admission::Accepted)?;
                row.status = placed_status(from, placement)?;
            }
            _ => {}
        }
        changed = true;
    }
    if let Some(to) = patch.status {
        if to != from {
            match row.status {
                TaskStatus::Queued => {
                    st.heap.remove(&id);
                }
                TaskStatus::Pending => st.pending.remove(row.hash.as_deref()),
                _ => {}
            }
            row.status = if to == TaskStatus::Queued {
                rejoin::join(st, rows, id, &mut row, now);
                let placement = place(st, rows, id, &row, Admission::Accepted)?;
                placed_status(from, placement)?
            } else {
                to
            };
            row.lease_expires_at = st.lease(now, row.status);
            if late
                && (matches!(to, TaskStatus::Running | TaskStatus::Completed)
                    || to == TaskStatus::Failed
                        && matches!(from, TaskStatus::Dispatched | TaskStatus::Running))
            {
                // The expiry that took it back is history now: the holder did run it, or the
                // task was handed out again and its holder failed it, which is the task's
                // result. Kept, it would let the first holder's late word revive a failed task.
                row.failure_reason = None;
            }
            changed = true;
        } else if to == TaskStatus::Running {
            // A repeated `running` is a heartbeat: it renews the lease, and from now on the
            // holder is one that renews, so the run timeout applies.
            row.lease_expires_at = st.renewed_lease(now);
            changed = true;
        }
    }
    if changed {
        row.modified_at = now.naive_utc();
        rows.update(id, row);
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::engine::testing::{now, row, state};
    use crate::queue::types::WhenFull;

    fn loaded(rows: &mut BatchRows, r: &crate::storage::rows::TaskRow) {
        rows.load(vec![r.clone()], "boefje");
    }

    #[test]
    fn running_then_completed_takes_and_drops_the_lease() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (id, mut r) = row(5, 1);
        r.status = TaskStatus::Dispatched;
        loaded(&mut rows, &r);
        let running = TaskPatch {
            status: Some(TaskStatus::Running),
            priority: None,
        };
        patch(&mut st, &mut rows, id, &running, now()).unwrap();
        let got = rows.get(&id).unwrap();
        assert_eq!(got.status, TaskStatus::Running);
        assert!(got.lease_expires_at.is_some());
        let done = TaskPatch {
            status: Some(TaskStatus::Completed),
            priority: None,
        };
        patch(&mut st, &mut rows, id, &done, now()).unwrap();
        assert_eq!(rows.get(&id).unwrap().lease_expires_at, None);
        let back = TaskPatch {
            status: Some(TaskStatus::Running),
            priority: None,
        };
        assert!(matches!(
            patch(&mut st, &mut rows, id, &back, now()),
            Err(QueueError::IllegalTransition(_))
        ));
    }

    #[test]
    fn cancelling_a_queued_task_takes_it_out_of_the_heap() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (id, r) = row(5, 1);
        place(&mut st, &mut rows, id, &r, Admission::New).unwrap();
        loaded(&mut rows, &r);
        let cancel = TaskPatch {
            status: Some(TaskStatus::Cancelled),
            priority: None,
        };
        patch(&mut st, &mut rows, id, &cancel, now()).unwrap();
        assert!(st.heap.is_empty());
        assert_eq!(rows.get(&id).unwrap().status, TaskStatus::Cancelled);
    }

    #[test]
    fn a_refused_patch_leaves_the_heaps_order_alone() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (a, ra) = row(5, 1);
        let (b, rb) = row(9, 2);
        for (id, r) in [(a, &ra), (b, &rb)] {
            place(&mut st, &mut rows, id, r, Admission::New).unwrap();
        }
        rows.load(vec![ra.clone(), rb.clone()], "boefje");
        let refused = TaskPatch {
            status: Some(TaskStatus::Completed),
            priority: Some(1),
        };
        assert!(matches!(
            patch(&mut st, &mut rows, b, &refused, now()),
            Err(QueueError::IllegalTransition(_))
        ));
        assert_eq!(st.heap.best().map(|r| r.id), Some(a), "b is still ranked 9");
        assert_eq!(rows.get(&b).unwrap().priority, 9);
    }

    #[test]
    fn a_pending_task_made_more_urgent_moves_into_the_heap() {
        let mut st = state(1, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (a, ra) = row(5, 1);
        place(&mut st, &mut rows, a, &ra, Admission::New).unwrap();
        let (b, mut rb) = row(9, 2);
        rb.status = TaskStatus::Pending;
        st.pending.add(rb.hash.as_deref());
        loaded(&mut rows, &rb);
        let urgent = TaskPatch {
            status: None,
            priority: Some(2),
        };
        patch(&mut st, &mut rows, b, &urgent, now()).unwrap();
        assert_eq!(rows.get(&b).unwrap().status, TaskStatus::Queued);
        assert_eq!(st.heap.best().map(|r| r.id), Some(b));
        assert_eq!(rows.evicted, vec![a]);
        assert_eq!(st.pending.count(), 1);
    }
}
