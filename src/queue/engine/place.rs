//! Placement and eviction: where a waiting task goes.
//!
//! The heap holds the best `maxsize` waiting tasks. A task goes into the heap while it has room;
//! into a full heap only if it ranks before the heap's worst task, which then moves out to the
//! pending backlog; otherwise it waits as pending itself. So whatever waits as pending ranks after
//! everything in the heap, and pops take from the backlog only what the heap cannot give them
//! (the exceptions: a `PATCH` that makes a queued task less urgent leaves it in the heap; and
//! where organisations take turns, a full heap makes room for automatic work of an organisation
//! that holds fewer of its tasks than the largest by moving the largest one's worst task out, so
//! a flood of one organisation cannot keep the others out of the heap, where turns are taken).
//!
//! A scheduler configured to refuse (`when_full = reject`) answers a *new* automatic push 429
//! instead, when the heap is full; user scans and work already accepted are always placed.

use uuid::Uuid;

use super::batch::BatchRows;
use super::state::QueueState;
use crate::domain::keys::DataKeys;
use crate::domain::{Placement, TaskStatus};
use crate::queue::heap::{HeapTask, Rank};
use crate::queue::types::{QueueError, WhenFull};
use crate::storage::rows::{HeapRow, TaskRow};

/// Whether a placement may be refused when the heap is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// A new push: an automatic one may be refused (429) when the scheduler says so.
    New,
    /// Work already accepted (a boost, a re-queue, an expired lease): never refused.
    Accepted,
}

/// The heap's view of a row.
pub(crate) fn heap_task(id: Uuid, row: &TaskRow) -> Result<HeapTask, QueueError> {
    Ok(HeapTask {
        id,
        priority: row.priority,
        created_at: row.created_at,
        modified_at: row.modified_at,
        hash: row.hash.clone(),
        schedule_id: parse_schedule(&row.schedule_id)?,
        organisation: row.organisation.clone(),
        data_keys: DataKeys {
            plugin_id: row.plugin_id.clone(),
            oci_image: row.oci_image.clone(),
            input_ooi: row.input_ooi.clone(),
            deduplication_key: row.deduplication_key.clone(),
        },
    })
}

/// The heap's view of a queued row read for a rebuild or a refill.
pub(crate) fn heap_task_of(row: HeapRow) -> Result<HeapTask, QueueError> {
    Ok(HeapTask {
        id: Uuid::parse_str(&row.id)
            .map_err(|_| QueueError::Internal(format!("task id '{}' is not a UUID", row.id)))?,
        priority: row.priority,
        created_at: row.created_at,
        modified_at: row.modified_at,
        schedule_id: parse_schedule(&row.schedule_id)?,
        hash: row.hash,
        organisation: row.organisation,
        data_keys: DataKeys {
            plugin_id: row.plugin_id,
            oci_image: row.oci_image,
            input_ooi: row.input_ooi,
            deduplication_key: row.deduplication_key,
        },
    })
}

fn parse_schedule(s: &Option<String>) -> Result<Option<Uuid>, QueueError> {
    s.as_deref()
        .map(|s| {
            Uuid::parse_str(s)
                .map_err(|_| QueueError::Internal(format!("schedule id '{s}' is not a UUID")))
        })
        .transpose()
}

/// Finds `row` a place, updating the heap and the pending set; the caller sets the row's status
/// from the placement. An automatic new push to a full, refusing scheduler is a `QueueFull`.
pub(crate) fn place(
    st: &mut QueueState,
    rows: &mut BatchRows,
    id: Uuid,
    row: &TaskRow,
    admission: Admission,
) -> Result<Placement, QueueError> {
    let task = heap_task(id, row)?;
    let rank = task.rank();
    // A heap with room while tasks are pending is waiting for its refill ahead (see
    // [`super::refill`]): a task that ranks after its worst may rank after pending ones too, so it
    // waits as pending, and the refill brings the best of them in, in order.
    if !st.heap.is_full() {
        // A count that drifted (read again after the batch) may say none while some wait.
        let none_pending = st.pending.count() == 0 && !st.pending.needs_recount();
        if none_pending || st.heap.worst().is_some_and(|w| rank < w) {
            st.heap.insert(task);
            return Ok(Placement::Heap);
        }
        st.pending.add(row.hash.as_deref());
        st.copies.became_pending(rank);
        return Ok(Placement::Backlog);
    }
    if admission == Admission::New && !rank.is_user() && st.limits.when_full == WhenFull::Reject {
        return Err(QueueError::QueueFull(st.scheduler));
    }
    if let Some(worst) = st.heap.worst().filter(|w| rank < *w) {
        evict(st, rows, worst)?;
        st.heap.insert(task);
        return Ok(Placement::Heap);
    }
    if !rank.is_user()
        && let Some(victim) = st.heap.fair_victim(&task.organisation)
    {
        evict(st, rows, victim)?;
        st.heap.insert(task);
        return Ok(Placement::Heap);
    }
    st.pending.add(row.hash.as_deref());
    st.copies.became_pending(rank);
    Ok(Placement::Backlog)
}

/// Moves a heap task out to the pending backlog.
fn evict(st: &mut QueueState, rows: &mut BatchRows, victim: Rank) -> Result<(), QueueError> {
    let hash = st.heap.hash_of(&victim.id);
    st.heap.remove(&victim.id);
    st.pending.add(hash.as_deref());
    st.copies.became_pending(victim);
    let held = st.copies.evicted(&victim.id);
    let row = match held {
        false => rows.get(&victim.id).cloned(),
        true => None,
    };
    let Some(mut row) = row else {
        // Not read: a later push of the same work in this batch must still meet it.
        rows.evicted_unread(victim.id, hash, victim.priority);
        if held {
            // Held as a refill read it: its row is pending, with its queue row, as it is to be.
            tracing::debug!(task.id = %victim.id, scheduler.id = %st.scheduler, "evicted to pending by a better task (its row was pending still)");
        } else {
            rows.evicted.push(victim.id);
            tracing::debug!(task.id = %victim.id, scheduler.id = %st.scheduler, "evicted to pending by a better task");
        }
        return Ok(());
    };
    row.status = row.status.enqueue(Placement::Backlog).map_err(internal)?;
    rows.update(victim.id, row);
    tracing::debug!(task.id = %victim.id, scheduler.id = %st.scheduler, "evicted to pending by a better task");
    Ok(())
}

/// An illegal move the broker tried on its own: a bug, reported as an internal error.
pub(crate) fn internal(e: crate::domain::IllegalTransition) -> QueueError {
    QueueError::Internal(format!("broker move refused: {e}"))
}

/// The row's status after being placed.
pub(crate) fn placed_status(from: TaskStatus, p: Placement) -> Result<TaskStatus, QueueError> {
    from.enqueue(p).map_err(internal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::engine::testing::{limits, row, state};

    #[test]
    fn a_better_task_pushes_the_worst_out_of_a_full_heap() {
        let mut st = state(2, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (a, ra) = row(10, 1);
        let (b, rb) = row(20, 2);
        let (c, rc) = row(5, 3);
        let (d, rd) = row(30, 4);
        assert_eq!(
            place(&mut st, &mut rows, a, &ra, Admission::New).unwrap(),
            Placement::Heap
        );
        assert_eq!(
            place(&mut st, &mut rows, b, &rb, Admission::New).unwrap(),
            Placement::Heap
        );
        assert_eq!(
            place(&mut st, &mut rows, c, &rc, Admission::New).unwrap(),
            Placement::Heap
        );
        assert_eq!(rows.evicted, vec![b], "the worst went out, by id");
        assert_eq!(st.pending.count(), 1);
        assert_eq!(
            place(&mut st, &mut rows, d, &rd, Admission::New).unwrap(),
            Placement::Backlog,
            "worse than all: waits outside"
        );
        assert_eq!(st.pending.count(), 2);
        assert!(st.pending.may_hold(rd.hash.as_deref().unwrap()));
    }

    #[test]
    fn a_heap_waiting_for_its_refill_takes_only_what_ranks_before_its_worst() {
        let mut st = state(3, WhenFull::Reject);
        let mut rows = BatchRows::default();
        let (a, ra) = row(10, 1);
        let (b, rb) = row(20, 2);
        for (id, r) in [(a, &ra), (b, &rb)] {
            place(&mut st, &mut rows, id, r, Admission::New).unwrap();
        }
        // Something waits as pending (ranked after 20): the room is the refill's to fill.
        st.pending.add(None);
        let (c, rc) = row(30, 3);
        assert_eq!(
            place(&mut st, &mut rows, c, &rc, Admission::New).unwrap(),
            Placement::Backlog,
            "may rank after a pending task; not refused either, the heap is not full"
        );
        let (d, rd) = row(15, 4);
        assert_eq!(
            place(&mut st, &mut rows, d, &rd, Admission::New).unwrap(),
            Placement::Heap,
            "ranks before the heap's worst, so before every pending task"
        );
        assert_eq!(st.pending.count(), 2);
        assert!(rows.evicted.is_empty(), "nothing moved out");
    }

    #[test]
    fn a_full_heap_makes_room_for_an_organisation_a_flood_would_keep_out() {
        use crate::queue::engine::state::QueueState;
        use crate::queue::fair::Fairness;
        let mut fair = limits(4, WhenFull::Pending);
        fair.fairness = Fairness::Organisation;
        let mut st = QueueState::new(crate::domain::SchedulerId::Boefje, fair);
        let mut rows = BatchRows::default();
        let mut big = Vec::new();
        for i in 0..4 {
            let (id, r) = row(10 + i, i);
            place(&mut st, &mut rows, id, &r, Admission::New).unwrap();
            big.push(id);
        }
        // Worse than everything held, but its organisation holds nothing: the flood's worst
        // makes room.
        let (q, mut rq) = row(50, 10);
        rq.organisation = "quiet".into();
        assert_eq!(
            place(&mut st, &mut rows, q, &rq, Admission::New).unwrap(),
            Placement::Heap
        );
        assert_eq!(
            rows.evicted,
            vec![big[3]],
            "the largest organisation's worst"
        );
        // Two each minus one: the quiet one may not push the flood below itself.
        let (q2, mut rq2) = row(50, 11);
        rq2.organisation = "quiet".into();
        place(&mut st, &mut rows, q2, &rq2, Admission::New).unwrap();
        let (q3, mut rq3) = row(50, 12);
        rq3.organisation = "quiet".into();
        assert_eq!(
            place(&mut st, &mut rows, q3, &rq3, Admission::New).unwrap(),
            Placement::Backlog
        );
        assert_eq!(st.pending.count(), 3);
        // Off: the heap's order alone.
        let mut st = state(1, WhenFull::Pending);
        let (a, ra) = row(10, 1);
        place(&mut st, &mut rows, a, &ra, Admission::New).unwrap();
        assert_eq!(
            place(&mut st, &mut rows, q, &rq, Admission::New).unwrap(),
            Placement::Backlog
        );
    }

    #[test]
    fn a_refusing_scheduler_refuses_only_new_automatic_pushes() {
        let mut st = state(1, WhenFull::Reject);
        let mut rows = BatchRows::default();
        let (a, ra) = row(10, 1);
        let (b, rb) = row(5, 2);
        let (u, ru) = row(1, 3);
        place(&mut st, &mut rows, a, &ra, Admission::New).unwrap();
        assert!(matches!(
            place(&mut st, &mut rows, b, &rb, Admission::New),
            Err(QueueError::QueueFull(_))
        ));
        assert_eq!(
            place(&mut st, &mut rows, b, &rb, Admission::Accepted).unwrap(),
            Placement::Heap
        );
        assert_eq!(
            place(&mut st, &mut rows, u, &ru, Admission::New).unwrap(),
            Placement::Heap,
            "user scan"
        );
        let _ = limits(1, WhenFull::Reject);
    }
}
