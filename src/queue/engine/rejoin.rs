//! Work that comes back to wait while the same work already waits as another task.
//!
//! A task comes back to wait when its worker gives it back (the full task pushed again, or
//! `PATCH queued`), when its lease ends, or when its pop's answer never reached the caller. While
//! it was out, the same work (its hash) may have been pushed again: a user's scan is taken while
//! the work runs, as mula takes it. Were both to wait, the work would run twice, and two runners
//! could run it at once (no concurrent invocation). So the task coming back joins the one that
//! waits: it stays, with its id, its attempts and its holder's late word (see [`super::patch`]),
//! and takes the more urgent of the two priorities; the other, which never ran, is withdrawn
//! (`cancelled`, its reason naming the task that runs the work). The task that stays is the
//! older one, as when a push of waiting work boosts the task that waits.
//!
//! Withdrawing is for good, so only a task the table holds as waiting is withdrawn: its row is
//! read before the batch decides ([`reads`]): by id when the heap holds a task of the hash, by
//! hash when the backlog may hold one. A task the heap holds whose row says it no longer waits
//! (changed behind the engine's back), or one the batch has not read, is left alone. A task the
//! heap holds as a refill read it is read `pending`; withdrawn (or popped later in the batch), it
//! is written from that row and held no more ([`super::state::Copies`]).

use chrono::{DateTime, Utc};
use tracing::info;
use uuid::Uuid;

use super::batch::{BatchRows, Reads};
use super::state::QueueState;
use crate::domain::TaskStatus;
use crate::storage::rows::TaskRow;

/// How the reason of a withdrawn task begins.
const WITHDRAWN: &str = "withdrawn: the same work came back to wait as task";

/// The rows the tasks of `returning` (their rows read, with the batch's other reads) may meet:
/// by id, a task of the same hash in the heap; by hash, the waiting tasks of a hash the backlog
/// may hold. Tasks not out with a worker come back to nothing and read nothing.
pub(crate) fn reads(
    st: &QueueState,
    rows: &BatchRows,
    returning: impl IntoIterator<Item = Uuid>,
) -> Reads {
    let mut out = Reads::default();
    for id in returning {
        let Some(hash) = rows.get(&id).and_then(|row| out_with_a_worker(st, row)) else {
            continue;
        };
        if rows.waiting_besides(hash, id).is_some() {
            continue;
        }
        if let Some(w) = st.heap.find_hash(hash).filter(|w| !rows.contains(w)) {
            out.ids.push(w.to_string());
        }
        if st.pending.may_hold(hash) {
            out.hashes.push(hash.to_owned());
        }
    }
    out.ids.sort_unstable();
    out.ids.dedup();
    out.hashes.sort_unstable();
    out.hashes.dedup();
    out
}

/// The hash of `row` if the task is out with a worker of this scheduler (`dispatched`,
/// `running`), so that it may come back to wait.
fn out_with_a_worker<'a>(st: &QueueState, row: &'a TaskRow) -> Option<&'a str> {
    let out = matches!(row.status, TaskStatus::Dispatched | TaskStatus::Running)
        && row.scheduler_id == st.scheduler.as_str();
    row.hash.as_deref().filter(|_| out)
}

/// Before task `id` (`row`, coming back) waits again: withdraws the other waiting tasks of its
/// hash whose rows the batch read, and gives `row` the most urgent of their priorities and its
/// own. Answers the tasks withdrawn.
pub(crate) fn join(
    st: &mut QueueState,
    rows: &mut BatchRows,
    id: Uuid,
    row: &mut TaskRow,
    now: DateTime<Utc>,
) -> Vec<Uuid> {
    let mut withdrawn = Vec::new();
    let Some(hash) = row.hash.clone() else {
        return withdrawn;
    };
    // Each round withdraws one task or ends; a hash has one waiting task but for rows written
    // behind the engine's back, so the bound is never reached in practice.
    for _ in 0..16 {
        let Some((other, true)) = rows.waiting_besides(&hash, id) else {
            break;
        };
        let Some(mut w) = rows.get(&other).cloned() else {
            break;
        };
        if w.scheduler_id != row.scheduler_id {
            break;
        }
        if st.heap.remove(&other).is_some() {
            // The heap may hold it as a refill read it, its row still pending: the row is
            // written here, so it is held no more.
            st.copies.taken(&other);
        } else if w.status == TaskStatus::Pending {
            st.pending.remove(w.hash.as_deref());
        }
        row.priority = row.priority.min(w.priority);
        w.status = TaskStatus::Cancelled;
        w.failure_reason = Some(format!("{WITHDRAWN} {id}"));
        w.modified_at = now.naive_utc();
        rows.update(other, w);
        info!(task.id = %other, scheduler.id = %st.scheduler, stays = %id, "the same work came back to wait as another task; this one withdrawn");
        withdrawn.push(other);
    }
    withdrawn
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::engine::place::{Admission, place};
    use crate::queue::engine::testing::{now, row, state};
    use crate::queue::types::WhenFull;

    /// A task out with a worker and a task of the same work waiting in the heap.
    fn out_and_waiting(
        st: &mut QueueState,
        rows: &mut BatchRows,
        out_priority: i64,
        waiting_priority: i64,
    ) -> (Uuid, Uuid) {
        let (r, mut out) = row(out_priority, 1);
        out.status = TaskStatus::Dispatched;
        let (w, mut waiting) = row(waiting_priority, 2);
        waiting.hash = out.hash.clone();
        place(st, rows, w, &waiting, Admission::New).unwrap();
        rows.load(vec![out], "boefje");
        // The heap's task is read (by id) before the batch decides.
        assert_eq!(reads(st, rows, [r]).ids, vec![w.to_string()]);
        waiting.status = TaskStatus::Queued;
        rows.load(vec![waiting], "boefje");
        (r, w)
    }

    #[test]
    fn the_task_coming_back_stays_with_the_more_urgent_priority_and_the_other_is_withdrawn() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (r, w) = out_and_waiting(&mut st, &mut rows, 5, 1);
        let mut back = rows.get(&r).cloned().unwrap();
        assert_eq!(join(&mut st, &mut rows, r, &mut back, now()), vec![w]);
        assert_eq!(back.priority, 1, "the user's priority goes with the work");
        assert!(!st.heap.contains(&w));
        let gone = rows.get(&w).unwrap();
        assert_eq!(gone.status, TaskStatus::Cancelled);
        assert!(
            gone.failure_reason
                .as_deref()
                .is_some_and(|why| why.ends_with(&r.to_string())),
            "{:?}",
            gone.failure_reason
        );
        assert_eq!(
            rows.writes().updates.len(),
            1,
            "the withdrawn row is written"
        );
    }

    #[test]
    fn a_less_urgent_waiting_task_does_not_lower_the_priority_of_the_one_coming_back() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (r, w) = out_and_waiting(&mut st, &mut rows, 2, 7);
        let mut back = rows.get(&r).cloned().unwrap();
        assert_eq!(join(&mut st, &mut rows, r, &mut back, now()), vec![w]);
        assert_eq!(back.priority, 2);
    }

    #[test]
    fn a_pending_task_of_the_same_work_is_read_by_hash_and_leaves_the_backlog() {
        let mut st = state(1, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (first, filler) = row(1, 0);
        place(&mut st, &mut rows, first, &filler, Admission::New).unwrap();
        let (r, mut out) = row(5, 1);
        out.status = TaskStatus::Dispatched;
        let (w, mut waiting) = row(5, 2);
        waiting.hash = out.hash.clone();
        // The heap is full: the same work waits in the backlog.
        assert_eq!(
            place(&mut st, &mut rows, w, &waiting, Admission::New).unwrap(),
            crate::domain::Placement::Backlog
        );
        assert_eq!(st.pending.count(), 1);
        rows.load(vec![out.clone()], "boefje");
        let needs = reads(&st, &rows, [r]);
        assert_eq!(needs.hashes, vec![out.hash.clone().unwrap()]);
        assert!(needs.ids.is_empty());
        waiting.status = TaskStatus::Pending;
        rows.load(vec![waiting], "boefje");
        let mut back = out;
        assert_eq!(join(&mut st, &mut rows, r, &mut back, now()), vec![w]);
        assert_eq!(st.pending.count(), 0);
        assert_eq!(rows.get(&w).unwrap().status, TaskStatus::Cancelled);
    }

    #[test]
    fn a_task_the_heap_holds_whose_row_no_longer_waits_is_left_alone() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (r, mut out) = row(5, 1);
        out.status = TaskStatus::Dispatched;
        let (w, mut waiting) = row(1, 2);
        waiting.hash = out.hash.clone();
        place(&mut st, &mut rows, w, &waiting, Admission::New).unwrap();
        // Cancelled by hand in the table; the heap does not know yet.
        waiting.status = TaskStatus::Cancelled;
        waiting.failure_reason = Some("by hand".into());
        rows.load(vec![out.clone(), waiting], "boefje");
        let mut back = out;
        assert!(join(&mut st, &mut rows, r, &mut back, now()).is_empty());
        assert_eq!(
            back.priority, 5,
            "no priority taken from a task that does not wait"
        );
        let row = rows.get(&w).unwrap();
        assert_eq!(row.failure_reason.as_deref(), Some("by hand"));
        assert!(rows.writes().updates.is_empty(), "nothing written");
    }

    #[test]
    fn work_no_other_task_waits_for_reads_nothing_and_withdraws_nothing() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (r, mut out) = row(5, 1);
        out.status = TaskStatus::Running;
        let (other, queued) = row(5, 2);
        place(&mut st, &mut rows, other, &queued, Admission::New).unwrap();
        rows.load(vec![out.clone()], "boefje");
        let needs = reads(&st, &rows, [r]);
        assert!(needs.ids.is_empty() && needs.hashes.is_empty());
        let mut back = out;
        assert!(join(&mut st, &mut rows, r, &mut back, now()).is_empty());
        assert!(st.heap.contains(&other));
    }
}
