//! Refill: as the heap drains, the best pending tasks move into it, so the heap keeps holding the
//! best waiting tasks and the backlog flows back, best first.

use super::place::heap_task_of;
use super::state::QueueState;
use crate::queue::types::QueueError;
use crate::storage::rows::HeapRow;

/// Pending tasks moved into a heap per batch at most.
pub const REFILL_BATCH: usize = 1_000;

/// How many pending tasks the heap should take in now.
pub(crate) fn wanted(st: &QueueState) -> usize {
    let pending = usize::try_from(st.pending.count()).unwrap_or(usize::MAX);
    st.heap.room().min(pending).min(REFILL_BATCH)
}

/// Takes in the rows a refill of `wanted` moved to `queued`; answers how many.
pub(crate) fn refilled(
    st: &mut QueueState,
    moved: Vec<HeapRow>,
    wanted: usize,
) -> Result<usize, QueueError> {
    let n = moved.len();
    let short = n < wanted;
    for row in moved {
        st.pending.remove(row.hash.as_deref());
        let task = heap_task_of(row)?;
        st.heap.insert(task);
    }
    if short {
        // Fewer than counted: the count drifted (e.g. a row changed by hand); the table had no
        // more.
        st.pending.correct(0);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::engine::testing::{heap_row, state};
    use crate::queue::types::WhenFull;

    #[test]
    fn the_heap_takes_what_it_has_room_for_and_the_count_follows_the_table() {
        let mut st = state(3, WhenFull::Pending);
        for _ in 0..5 {
            st.pending.add(None);
        }
        assert_eq!(wanted(&st), 3);
        assert_eq!(
            refilled(&mut st, vec![heap_row(1), heap_row(2)], 3).unwrap(),
            2
        );
        assert_eq!(st.heap.len(), 2);
        assert_eq!(st.pending.count(), 0, "the table had only two");
        assert_eq!(wanted(&st), 0);
    }
}
