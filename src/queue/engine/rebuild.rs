//! Rebuilding a scheduler's state from the table, at start and after a failed batch: the heap
//! from the queued tasks (read from `tasks` in the table's order and sorted in memory; when more
//! are queued than fit, the best `maxsize` kept as they are read, so the excess never sits in
//! memory, and the rest moved to pending), the heap refilled from pending and, if
//! pending rows rank before the heap's worst (written by an older version, or `maxsize` changed),
//! swapped in, so the heap again holds the best waiting tasks. Then the pending hashes.

use std::collections::{BinaryHeap, HashSet};

use chrono::NaiveDateTime;
use tracing::info;

use super::place::heap_task_of;
use super::refill::{REFILL_BATCH, refilled, wanted};
use super::state::{InFlightHashes, PENDING_HASHES_MAX, PendingSet, QueueState};
use crate::domain::TaskStatus;
use crate::queue::heap::{HeapTask, SchedulerHeap, hash_bytes};
use crate::storage::rows::PopKey;
use crate::storage::{AnyConnection, StorageError, tasks};

/// A heap task ordered by its rank, for keeping the best `maxsize` of more.
struct ByRank(HeapTask);

impl PartialEq for ByRank {
    fn eq(&self, other: &Self) -> bool {
        self.0.rank() == other.0.rank()
    }
}

impl Eq for ByRank {}

impl PartialOrd for ByRank {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByRank {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.rank().cmp(&other.0.rank())
    }
}

fn corrupt(e: crate::queue::QueueError) -> StorageError {
    StorageError::Corrupt(e.to_string())
}

/// Rebuilds `st` from the table, inside the caller's transaction.
pub(crate) fn rebuild(
    c: &mut AnyConnection,
    st: &mut QueueState,
    now: NaiveDateTime,
) -> Result<(), StorageError> {
    let s = st.scheduler;
    let filled = tasks::backfill_keys(c, s)?;
    if filled > 0 {
        info!(scheduler.id = %s, rows = filled, "key fields filled in for waiting tasks");
    }
    let maxsize = st.limits.maxsize;
    let mut pending = tasks::count_waiting(c, s, TaskStatus::Pending)?;
    let queued = tasks::count_waiting(c, s, TaskStatus::Queued)?;
    let expected = usize::try_from(queued).unwrap_or(maxsize).min(maxsize);
    let mut heap = SchedulerHeap::builder(s, maxsize, expected);
    if queued <= maxsize as u64 {
        // All of them fit: read them in the table's order, one by one into the builder.
        let t = std::time::Instant::now();
        let mut bad = None;
        tasks::queued_all(c, s, |row| match heap_task_of(row) {
            Ok(task) => heap.push(task),
            Err(e) => {
                bad.get_or_insert(e);
            }
        })?;
        if let Some(e) = bad {
            return Err(corrupt(e));
        }
        tracing::debug!(scheduler.id = %s, duration_ms = t.elapsed().as_millis() as u64, "queued rows read");
    } else {
        // More than fit (maxsize was lowered): one pass in the table's order keeps the best
        // `maxsize` (the worst of them on top, so the excess never sits in memory), and the rest
        // waits as pending. No index holds queued tasks in pop order to page through: it would
        // cost every push into the heap, and every refill, an index entry, for this one rare
        // start.
        let mut best: BinaryHeap<ByRank> = BinaryHeap::with_capacity(maxsize.saturating_add(1));
        let mut bad = None;
        tasks::queued_all(c, s, |row| match heap_task_of(row) {
            Ok(task) => {
                best.push(ByRank(task));
                if best.len() > maxsize {
                    best.pop();
                }
            }
            Err(e) => {
                bad.get_or_insert(e);
            }
        })?;
        if let Some(e) = bad {
            return Err(corrupt(e));
        }
        if let Some(ByRank(worst)) = best.peek() {
            let last = PopKey {
                priority: worst.priority,
                created_at: worst.created_at,
                id: worst.id.to_string(),
            };
            let moved = tasks::demote_after(c, s, &last, now)?;
            if moved > 0 {
                pending += moved as u64;
                info!(scheduler.id = %s, moved, "queued tasks beyond maxsize moved to pending");
            }
        }
        for ByRank(task) in best.into_vec() {
            heap.push(task);
        }
    }
    let t = std::time::Instant::now();
    let fair = st.heap.take_fairness().emptied();
    st.heap = heap.finish().with_fairness(fair);
    tracing::debug!(scheduler.id = %s, duration_ms = t.elapsed().as_millis() as u64, "heap finished");
    // The hashes are read before the refill takes some of them out of the backlog.
    let hashes = if pending <= PENDING_HASHES_MAX as u64 {
        let mut set = HashSet::new();
        for h in tasks::pending_hashes(c, s, PENDING_HASHES_MAX)? {
            if let Some(b) = h.as_deref().and_then(hash_bytes) {
                set.insert(b);
            }
        }
        Some(set)
    } else {
        None
    };
    st.pending = PendingSet::with(pending, hashes);
    st.throttle = st.throttle.emptied();
    if let Some(span) = st.throttle.longest_span() {
        let since = now - span;
        for row in tasks::dispatched_since(c, s, since)? {
            let Ok(id) = row.uuid() else { continue };
            let in_flight = matches!(row.status, TaskStatus::Dispatched | TaskStatus::Running);
            // The last change is never earlier than the dispatch: a span counted from it ends no
            // sooner than the real one.
            let at = row.modified_at.and_utc();
            st.throttle.dispatched(id, &row.key_values(), at, in_flight);
        }
    }
    st.in_flight = InFlightHashes::default();
    for row in tasks::in_flight_hashes(c, s)? {
        if let Ok(id) = uuid::Uuid::parse_str(&row.id) {
            st.in_flight
                .record(id, row.hash.as_deref(), TaskStatus::Dispatched);
        }
    }
    loop {
        let n = wanted(st);
        if n == 0 {
            break;
        }
        let moved = tasks::refill(c, s, n, now, &mut |_| {})?;
        refilled(st, moved, n).map_err(corrupt)?;
    }
    swap_in_better_pending(c, st, now)
}

/// Swaps pending rows that rank before the heap's worst tasks with those.
fn swap_in_better_pending(
    c: &mut AnyConnection,
    st: &mut QueueState,
    now: NaiveDateTime,
) -> Result<(), StorageError> {
    let s = st.scheduler;
    let mut swapped = 0usize;
    while let Some(worst) = st.heap.worst() {
        let key = PopKey {
            priority: worst.priority,
            created_at: chrono::DateTime::from_timestamp_micros(worst.created_micros)
                .map(|t| t.naive_utc())
                .unwrap_or_default(),
            id: worst.id.to_string(),
        };
        let better = tasks::pending_page(c, s, tasks::Keyset::Before(&key), REFILL_BATCH)?;
        if better.is_empty() {
            break;
        }
        let mut promote = Vec::new();
        let mut demote = Vec::new();
        for row in better {
            let task = heap_task_of(row).map_err(corrupt)?;
            let Some(worst) = st.heap.worst().filter(|w| task.rank() < *w) else {
                break;
            };
            let hash = st.heap.hash_of(&worst.id);
            st.heap.remove(&worst.id);
            st.pending.add(hash.as_deref());
            demote.push(worst.id.to_string());
            st.pending.remove(task.hash.as_deref());
            promote.push(task.id.to_string());
            st.heap.insert(task);
        }
        if promote.is_empty() {
            break;
        }
        swapped += promote.len();
        tasks::transition(
            c,
            &demote,
            TaskStatus::Queued,
            TaskStatus::Pending,
            now,
            None,
        )?;
        tasks::transition(
            c,
            &promote,
            TaskStatus::Pending,
            TaskStatus::Queued,
            now,
            None,
        )?;
    }
    if swapped > 0 {
        info!(scheduler.id = %s, swapped, "pending tasks that ranked before queued ones moved into the heap");
    }
    Ok(())
}
