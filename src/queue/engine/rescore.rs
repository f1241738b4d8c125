//! A re-score: waiting tasks get new priorities, when an event changed what their strategy
//! reads (`planner/rescore.rs`; priorities do not age, so time alone never re-scores). A queued
//! task is re-ranked in the heap and its row updated only while it is still queued with the
//! priority the new one was computed from (a client's change in between stands); a pending one
//! has its row updated only while it is still pending (it enters the heap by priority as the heap
//! drains). A task handed out since the scores were computed is left alone. Each new priority's
//! explanation is written in the same transaction: an explanation that disagreed with its task's
//! priority (after a crash between two commits) would read as a client's choice.

use chrono::{DateTime, Utc};

use super::batch::BatchRows;
use super::command::Rescored;
use super::state::QueueState;
use crate::domain::TaskStatus;

/// Applies new priorities; answers how many were queued in the heap or may be pending (their
/// update holds only if they still are).
pub(crate) fn rescore(
    st: &mut QueueState,
    rows: &mut BatchRows,
    rescored: &[Rescored],
    now: DateTime<Utc>,
) -> usize {
    let at = now.naive_utc();
    let mut waiting = 0;
    for r in rescored {
        let (id, priority) = (r.id, r.priority);
        if let Some(row) = rows.get(&id).cloned() {
            // Read by another command of this batch: change it where it is.
            if matches!(row.status, TaskStatus::Queued | TaskStatus::Pending)
                && row.priority == r.was
            {
                if row.status == TaskStatus::Queued {
                    st.heap.rerank(&id, priority, at);
                }
                let mut row = row;
                row.priority = priority;
                row.modified_at = at;
                rows.update(id, row);
                rows.explained.push((id, r.explanation.clone()));
                waiting += 1;
            }
            continue;
        }
        if let Some(now) = st.heap.rank(&id).map(|k| k.priority) {
            if now != r.was || !st.heap.rerank(&id, priority, at) {
                // A client gave it another priority since it was read: that one stands.
                continue;
            }
            rows.reprioritised.push((id, TaskStatus::Queued, priority));
        } else {
            // Not in the heap: pending, or no longer waiting, which the update's condition
            // tells apart without a read (an explanation of a task no longer waiting is not
            // read: `explain` shows one only while it matches the task's priority).
            rows.reprioritised.push((id, TaskStatus::Pending, priority));
        }
        rows.explained.push((id, r.explanation.clone()));
        waiting += 1;
    }
    waiting
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::engine::place::{Admission, place};
    use crate::queue::engine::testing::{now, row, state};
    use crate::queue::types::WhenFull;
    use uuid::Uuid;

    #[test]
    fn a_queued_task_is_reranked_and_its_row_updated_only_while_queued_as_it_was_read() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (a, ra) = row(500, 1);
        let (b, rb) = row(400, 2);
        place(&mut st, &mut rows, a, &ra, Admission::New).unwrap();
        place(&mut st, &mut rows, b, &rb, Admission::New).unwrap();
        assert_eq!(st.heap.best().map(|r| r.id), Some(b));
        let mut rows = BatchRows::default();
        let other = Uuid::new_v4();
        let rescored = |id, was, priority| Rescored {
            id,
            was,
            priority,
            explanation: format!("{{\"priority\": {priority}}}"),
        };
        let n = rescore(
            &mut st,
            &mut rows,
            &[
                rescored(a, 500, 3),
                rescored(other, 9, 7),
                rescored(b, 401, 1),
            ],
            now(),
        );
        assert_eq!(
            st.heap.best().map(|r| r.id),
            Some(a),
            "a is now the most urgent"
        );
        assert_eq!(st.heap.rank(&a).map(|r| r.priority), Some(3));
        assert_eq!(
            st.heap.rank(&b).map(|r| r.priority),
            Some(400),
            "b's priority changed since it was read: it stands"
        );
        assert_eq!(n, 2);
        assert_eq!(
            rows.reprioritised,
            vec![(a, TaskStatus::Queued, 3), (other, TaskStatus::Pending, 7)]
        );
        assert_eq!(
            rows.explained,
            vec![
                (a, "{\"priority\": 3}".to_owned()),
                (other, "{\"priority\": 7}".to_owned())
            ],
            "each new priority with its explanation"
        );
    }
}
