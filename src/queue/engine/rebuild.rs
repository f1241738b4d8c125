//! Rebuilding a scheduler's state from the table, at start and after a failed batch: the heap
//! from the queued tasks (read from `tasks` in the table's order, in the same pass as the tasks
//! in flight, and sorted in memory; when more are queued than fit, a second pass keeps the best
//! `maxsize` as it reads, so the excess never sits in memory, and moves the rest to pending), the
//! heap refilled from pending and, if
//! pending rows rank before the heap's worst (written by an older version, or `maxsize` changed),
//! swapped in, so the heap again holds the best waiting tasks. Then the pending hashes.

use std::collections::BinaryHeap;

use chrono::NaiveDateTime;
use tracing::info;

use super::leases::LeaseBook;
use super::place::heap_task_of;
use super::refill::{REFILL_BATCH, refilled, wanted};
use super::state::{InFlightHashes, PENDING_HASHES_MAX, PendingHashes, PendingSet, QueueState};
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
    // What the heap held as read is pending in the table, and read again from there.
    st.copies.take_all();
    let mut filled = tasks::backfill_keys(c, s)?;
    let maxsize = st.limits.maxsize;
    let mut pending = tasks::count_waiting(c, s, TaskStatus::Pending)?;
    // How many are queued is not counted first: that would be a second pass over the
    // scheduler's rows, history included, at every start and takeover. The heap's tables grow
    // as the tasks come (a heap rebuilt after a failed batch starts from its old size) and give
    // back their spare room when finished.
    let expected = st.heap.len();
    // One pass over the scheduler's queued and in-flight rows of `tasks`: the queued ones into
    // the heap as they come (while they fit), the others' hashes kept.
    let t = std::time::Instant::now();
    let mut heap = SchedulerHeap::builder(s, maxsize, expected.min(maxsize));
    let (mut queued, mut unkeyed, mut in_flight, mut bad) = (0usize, Vec::new(), Vec::new(), None);
    tasks::live_all(c, s, |row| {
        if row.status != TaskStatus::Queued {
            in_flight.push((row.heap.id, row.heap.hash, row.status, row.lease_expires_at));
            return;
        }
        queued += 1;
        if row.heap.plugin_id.is_none() {
            unkeyed.push(row.heap.id.clone());
        }
        if queued > maxsize {
            return;
        }
        match heap_task_of(row.heap) {
            Ok(task) => heap.push(task),
            Err(e) => {
                bad.get_or_insert(e);
            }
        }
    })?;
    if let Some(e) = bad {
        return Err(corrupt(e));
    }
    tracing::debug!(scheduler.id = %s, queued, duration_ms = t.elapsed().as_millis() as u64, "queued and in-flight rows read");
    // Rows an older version wrote without their key fields: filled in, then read again, so the
    // heap finds them by those fields.
    let refilled_keys = match unkeyed.is_empty() {
        true => 0,
        false => tasks::fill_keys_of(c, s, &unkeyed)?,
    };
    filled += refilled_keys;
    if filled > 0 {
        info!(scheduler.id = %s, rows = filled, "key fields filled in for waiting tasks");
    }
    if queued > maxsize || refilled_keys > 0 {
        heap = SchedulerHeap::builder(s, maxsize, queued.min(maxsize));
        pending += read_queued_again(c, st, &mut heap, queued, now)?;
    }
    let t = std::time::Instant::now();
    let fair = st.heap.take_fairness().emptied();
    st.heap = heap.finish().with_fairness(fair);
    tracing::debug!(scheduler.id = %s, duration_ms = t.elapsed().as_millis() as u64, "heap finished");
    // The hashes are read before the refill takes some of them out of the backlog.
    let hashes = if pending <= PENDING_HASHES_MAX as u64 {
        let mut set = PendingHashes::new();
        for h in tasks::pending_hashes(c, s, PENDING_HASHES_MAX)? {
            if let Some(b) = h.as_deref().and_then(hash_bytes) {
                *set.entry(b).or_default() += 1;
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
    st.leases = LeaseBook::default();
    for (id, hash, status, lease) in in_flight {
        if let Ok(id) = uuid::Uuid::parse_str(&id) {
            st.in_flight
                .record(id, hash.as_deref(), TaskStatus::Dispatched);
            st.leases.record(id, status, lease);
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

/// The rebuild's second pass over the queued rows, when the first could not build the heap: after
/// key fields were filled in, or when more are queued than fit (`maxsize` was lowered). Then one
/// pass in the table's order keeps the best `maxsize` (the worst of them on top, so the excess
/// never sits in memory), and the rest waits as pending; answers how many moved there. No index
/// holds queued tasks in pop order to page through: it would cost every push into the heap, and
/// every refill, an index entry, for this one rare start.
fn read_queued_again(
    c: &mut AnyConnection,
    st: &QueueState,
    heap: &mut crate::queue::heap::HeapBuilder,
    queued: usize,
    now: NaiveDateTime,
) -> Result<u64, StorageError> {
    let (s, maxsize) = (st.scheduler, st.limits.maxsize);
    let mut bad = None;
    if queued <= maxsize {
        tasks::queued_all(c, s, |row| match heap_task_of(row) {
            Ok(task) => heap.push(task),
            Err(e) => {
                bad.get_or_insert(e);
            }
        })?;
        return match bad {
            Some(e) => Err(corrupt(e)),
            None => Ok(0),
        };
    }
    let mut best: BinaryHeap<ByRank> = BinaryHeap::with_capacity(maxsize.saturating_add(1));
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
    let mut moved = 0;
    if let Some(ByRank(worst)) = best.peek() {
        let last = PopKey {
            priority: worst.priority,
            created_at: worst.created_at,
            id: worst.id.to_string(),
        };
        moved = tasks::demote_after(c, s, &last, now)?;
        if moved > 0 {
            info!(scheduler.id = %s, moved, "queued tasks beyond maxsize moved to pending");
        }
    }
    for ByRank(task) in best.into_vec() {
        heap.push(task);
    }
    Ok(moved as u64)
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
