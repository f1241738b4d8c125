//! Refill: as the heap drains, the best pending tasks go into it, so the heap keeps holding the
//! best waiting tasks and the backlog flows back, best first.
//!
//! The refill runs ahead of need and off the pops' path: once the heap has room for a tenth of
//! its bound ([`ahead`]), the engine reads that many of the best pending tasks in pop order, in
//! one statement, after it has answered the batch that made the room. It writes nothing: the heap
//! holds the rows as read, still `pending` in the table with their queue rows
//! ([`super::state::Copies`]), and a pop that takes one writes it `pending → dispatched` and
//! deletes its queue row, in the statement that writes its other pops, as a pop from the backlog
//! does. A refill that moved its picks to `queued` wrote every task twice and cost the server
//! about 25 µs a task beside the pops (docs/BENCHMARKS.md). A batch that may read any pending row
//! first writes what the heap holds so `queued`, as such a refill did, so the rules it runs see
//! the table as the heap does; a push, only what it names ([`super::state::Copies`]). A refill
//! reads on from where the last one ended, or from a task that became pending ahead of that
//! ([`ReadFrom`]).
//!
//! While the heap has room and tasks are pending, a new task that ranks after the heap's worst
//! waits as pending too (see [`super::place`]), so whatever is pending still ranks after
//! everything in the heap, and a pop whose match the heap lacks searches the pending backlog
//! itself ([`super::pop`]): no pop needs the refill to be served.
//!
//! On PostgreSQL a refill ahead of [`AHEAD_APART_MIN`] tasks or more reads on a connection and
//! thread of its own ([`Ahead`]) while the engine goes on. Meanwhile the engine serves only what
//! cannot meet a row the refill reads: pops from the heap and patches of tasks in flight.
//! Anything else that may read or write a pending row (a push, which may merge into one or evict
//! to pending; a patch of a task not in flight; a cancel, an expiry, a re-score; a pop whose match
//! the heap lacks, which would search the rows the refill reads) first waits for the refill and
//! takes its tasks in, so the two never decide about the same row, and the refill's `n` (the room
//! when it began) still fits: pops only make more. A pop that has taken nothing yet waits set
//! aside, off the engine's thread, and is decided again once the refill has ended. SQLite takes
//! one writer at a time, so there the refill stays on the engine's thread.

use std::collections::HashSet;
use std::sync::Arc;
use std::thread::JoinHandle;

use chrono::NaiveDateTime;
use diesel::Connection;
use uuid::Uuid;

use super::place::heap_task_of;
use super::read_ahead::ReadAhead;
use super::state::{QueueState, Start};
use crate::domain::SchedulerId;
use crate::ownership::Ownership;
use crate::queue::heap::Rank;
use crate::queue::types::QueueError;
use crate::storage::rows::HeapRow;
use crate::storage::{AnyConnection, DbPool, StorageError, WriterConn, owners, tasks};

/// Pending tasks taken into a heap per statement at most by an explicit refill and at a
/// rebuild.
pub const REFILL_BATCH: usize = 1_000;

/// Pending tasks read into a heap by one refill ahead at most: one read, about 5 ms of
/// PostgreSQL's time per thousand rows, so a refill of a large heap holds the engine for a
/// bounded time.
pub const REFILL_AHEAD_MAX: usize = 10_000;

/// Pending tasks a refill ahead reads at least to run on a thread and connection of its own
/// ([`Ahead`]): a smaller one (a small heap's) takes less of the server than the pooled
/// connection's check-out and settings would, and is over before a pop could go on beside it.
pub(crate) const AHEAD_APART_MIN: usize = 100;

/// How many pending tasks the heap should take in now.
pub(crate) fn wanted(st: &QueueState) -> usize {
    let pending = usize::try_from(st.pending.count()).unwrap_or(usize::MAX);
    st.heap.room().min(pending).min(REFILL_BATCH)
}

/// The room at which a heap of `maxsize` is refilled ahead: a tenth of it (between one task and
/// [`REFILL_BATCH`]), so a refill reads many rows in one statement and the heap never runs dry
/// while the backlog has work.
pub(crate) fn refill_at(maxsize: usize) -> usize {
    (maxsize / 10).clamp(1, REFILL_BATCH)
}

/// How many pending tasks a refill ahead should move now: none until the heap's room reaches
/// [`refill_at`], then as many as it has room for, up to [`REFILL_AHEAD_MAX`].
pub(crate) fn ahead(st: &QueueState) -> usize {
    let pending = usize::try_from(st.pending.count()).unwrap_or(usize::MAX);
    let room = st.heap.room();
    if pending == 0 || room < refill_at(st.limits.maxsize) {
        return 0;
    }
    room.min(pending).min(REFILL_AHEAD_MAX)
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
        // Fewer than counted: rows changed behind the engine's back. Either the table had no
        // more, or picks were no longer pending (a task cancelled by hand, whose queue row the
        // move deleted) and more wait after them: the count is read again after the batch, so
        // the refills go on while the backlog holds work.
        st.pending.correct(0);
        st.pending.drift();
    }
    Ok(n)
}

/// Writes these tasks the heap held as read (`held`, taken from [`Copies`]) `queued`, their
/// queue rows deleted, in a transaction that checks the fence first (when several instances
/// share the database): before a batch that may meet them reads anything. A task no longer
/// pending (changed by hand) is let go from the heap, and the count is read again. Answers how
/// many it wrote. On a failure the heap holds tasks the table may not: the engine rebuilds it.
/// `ran` is set once the write has run and only the `COMMIT` is left: a connection that broke
/// before that wrote nothing, and the same may go again on a fresh one.
///
/// [`Copies`]: super::state::Copies
pub(crate) fn settle_held(
    conn: &mut AnyConnection,
    st: &mut QueueState,
    held: &[Uuid],
    now: NaiveDateTime,
    fence: Option<&(Arc<Ownership>, i64)>,
    ran: &mut bool,
) -> Result<usize, StorageError> {
    if held.is_empty() {
        return Ok(0);
    }
    let ids: Vec<String> = held.iter().map(Uuid::to_string).collect();
    let scheduler = st.scheduler;
    let written: HashSet<String> = conn
        .transaction(|c| {
            if let Some((own, epoch)) = fence
                && !owners::holds(c, scheduler, own.instance(), *epoch)?
            {
                return Err(StorageError::Fenced(scheduler));
            }
            let settled = tasks::settle(c, &ids, now)?;
            *ran = true;
            Ok(settled)
        })?
        .into_iter()
        .map(|r| r.id)
        .collect();
    if written.len() < held.len() {
        for (id, text) in held.iter().zip(&ids) {
            if !written.contains(text) {
                st.heap.remove(id);
            }
        }
        st.pending.drift();
    }
    Ok(written.len())
}

/// Where a refill reads from, and the tasks the heap holds as read that it meets again there
/// (skipped): see [`Copies`](super::state::Copies).
#[derive(Debug, Default)]
pub(crate) struct ReadFrom {
    start: Option<Start>,
    skip: HashSet<Uuid>,
}

impl ReadFrom {
    /// Where the next refill of `st`'s heap reads from.
    pub fn of(st: &QueueState) -> ReadFrom {
        let start = st.copies.start();
        let skip = start
            .map(|s| st.copies.ahead_of(s, &st.heap))
            .unwrap_or_default();
        ReadFrom { start, skip }
    }

    /// Where it starts.
    #[cfg(test)]
    pub fn start(&self) -> Option<Start> {
        self.start
    }

    /// How many rows to read for `n` new to the heap: the skipped ones beside them.
    pub fn limit(&self, n: usize) -> usize {
        n + self.skip.len()
    }

    /// What a read from here for `n` new rows ([`ReadFrom::limit`] rows in pop order) brings the
    /// heap: the first `n` it does not skip. A skipped task may rank after them (then it was not
    /// needed to reach them), so there may be more than `n` rows: the rest wait for the next read.
    pub fn sift(&self, rows: Vec<HeapRow>, n: usize) -> Result<Read, StorageError> {
        let mut out = Read::default();
        for r in rows {
            if out.rows.len() == n {
                break;
            }
            let id = r.uuid()?;
            out.last = Some(Rank::new(r.priority, r.created_at, id));
            if !self.skip.contains(&id) {
                out.rows.push(r);
            }
        }
        Ok(out)
    }
}

/// What a refill read: the rows new to the heap, in pop order, and the rank of the last row it
/// read (skipped or not).
#[derive(Debug, Default)]
pub(crate) struct Read {
    pub rows: Vec<HeapRow>,
    pub last: Option<Rank>,
}

/// Reads the best `n` pending tasks of `scheduler` in pop order from `from`, less those it
/// skips. Nothing is written, so no fence is checked: a pop that takes one writes it, fenced,
/// from `pending`.
pub(crate) fn read(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    n: usize,
    from: &ReadFrom,
) -> Result<Read, StorageError> {
    let key = from.start.map(|s| (s, s.rank().key()));
    let keyset = match &key {
        None => tasks::Keyset::First,
        Some((Start::After(_), k)) => tasks::Keyset::After(k),
        Some((Start::At(_), k)) => tasks::Keyset::From(k),
    };
    let rows = tasks::refill_picks(conn, scheduler, keyset, from.limit(n))?;
    from.sift(rows, n)
}

/// Takes in the rows a refill of `wanted` read (in pop order) as the heap's, their rows still
/// pending ([`Copies`](super::state::Copies)); answers how many.
pub(crate) fn read_in(st: &mut QueueState, read: Read, wanted: usize) -> Result<usize, QueueError> {
    let ids = read
        .rows
        .iter()
        .map(HeapRow::uuid)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| QueueError::Internal(e.to_string()))?;
    let n = refilled(st, read.rows, wanted)?;
    st.copies.read(ids, read.last);
    Ok(n)
}

/// A refill ahead under way on a connection of its own.
pub(crate) struct Ahead {
    handle: JoinHandle<Result<Read, StorageError>>,
    /// How many pending tasks it was asked to read.
    wanted: usize,
}

/// What a refill ahead a pop waited for came to, for the engine to count after the batch: the
/// tasks it moved, or the error it met.
#[derive(Default)]
pub(crate) struct Settled {
    pub moved: usize,
    /// The error its read met: nothing of it was taken in, and the heap is as it was.
    pub unread: Option<StorageError>,
    /// The error taking its rows in met: the state is to be rebuilt from the table.
    pub failed: Option<StorageError>,
}

impl Ahead {
    /// Starts reading the best `n` pending tasks of `scheduler` from `from` (see [`read`]) on
    /// a pooled connection (planned as the engine's, [`WriterConn::checkout_engine`]).
    pub fn start(
        pool: &DbPool,
        scheduler: SchedulerId,
        n: usize,
        from: ReadFrom,
        unsynced: bool,
    ) -> std::io::Result<Ahead> {
        let pool = pool.clone();
        let handle = std::thread::Builder::new()
            .name(format!("refill-{scheduler}"))
            .spawn(move || {
                let mut conn = WriterConn::checkout_engine(&pool, unsynced)?;
                read(&mut conn, scheduler, n, &from)
            })?;
        Ok(Ahead { handle, wanted: n })
    }

    /// Whether it has ended (its outcome is ready).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Waits for its end: what it read, and how many it was asked for.
    pub fn wait(self) -> (Result<Read, StorageError>, usize) {
        let outcome = self.handle.join().unwrap_or_else(|_| {
            Err(StorageError::Unavailable(
                "the refill's thread stopped".into(),
            ))
        });
        (outcome, self.wanted)
    }
}

/// Waits for the refill ahead in `slot`, if one is under way, and takes its tasks into the heap;
/// answers whether it took any. Its error is kept in `settled` for the engine.
pub(crate) fn settle_into(
    st: &mut QueueState,
    slot: &mut Option<Ahead>,
    settled: &mut Settled,
    read_ahead: &mut ReadAhead,
) -> Result<bool, StorageError> {
    let Some(ahead) = slot.take() else {
        return Ok(false);
    };
    match ahead.wait() {
        (Ok(read), wanted) => {
            // The tasks read are in the heap now: a read ahead must not hand them out again.
            read_ahead.moved(read.rows.iter().map(|r| r.id.as_str()));
            let n = read_in(st, read, wanted).map_err(|e| StorageError::Corrupt(e.to_string()))?;
            settled.moved += n;
            Ok(n > 0)
        }
        (Err(e), _) => {
            settled.unread = Some(e);
            Ok(false)
        }
    }
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
        assert_eq!(st.pending.count(), 0, "no more until the table is asked");
        assert!(
            st.pending.needs_recount(),
            "it may hold more after picks it did not move"
        );
        assert_eq!(wanted(&st), 0);
    }

    #[test]
    fn a_refill_ahead_waits_for_a_tenth_of_the_heap_and_then_moves_all_it_has_room_for() {
        let mut st = state(100, WhenFull::Pending);
        for _ in 0..500 {
            st.pending.add(None);
        }
        let fill = |st: &mut QueueState, n: usize| {
            let rows = (0..n).map(|i| heap_row(i as i64 + 1)).collect();
            refilled(st, rows, n).unwrap();
        };
        fill(&mut st, 91);
        assert_eq!(ahead(&st), 0, "room for 9: below a tenth, no refill yet");
        st.heap.take(&st.heap.best().unwrap().id);
        assert_eq!(ahead(&st), 10, "room for a tenth: refill all the room");
        let mut few = state(100, WhenFull::Pending);
        few.pending.add(None);
        few.pending.add(None);
        assert_eq!(ahead(&few), 2, "no more than are pending");
        assert_eq!(refill_at(3), 1, "a small heap refills at every free place");
        assert_eq!(refill_at(1_000_000), REFILL_BATCH);
    }
}

/// The refills, pops and pushes of one engine against a model of the table's pending rows, in
/// random order: what each refill reads is the best pending rows the heap does not hold, and
/// every task pushed is popped once.
#[cfg(test)]
mod model {
    use std::collections::{BTreeMap, HashMap, HashSet};

    use uuid::Uuid;

    use super::{ReadFrom, ahead, read_in};
    use crate::domain::SchedulerId;
    use crate::queue::engine::batch::BatchRows;
    use crate::queue::engine::place::{Admission, place};
    use crate::queue::engine::state::QueueState;
    use crate::queue::engine::testing::{limits, row};
    use crate::queue::fair::Fairness;
    use crate::queue::heap::Rank;
    use crate::queue::types::WhenFull;
    use crate::storage::rows::{HeapRow, TaskRow};

    /// A small deterministic generator (xorshift64*), so a failing case reproduces.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    /// The table: every task's row, and the pending ones by rank (their queue rows).
    #[derive(Default)]
    struct Table {
        rows: HashMap<Uuid, TaskRow>,
        pending: BTreeMap<Rank, Uuid>,
    }

    impl Table {
        fn rank(&self, id: &Uuid) -> Rank {
            let r = &self.rows[id];
            Rank::new(r.priority, r.created_at, *id)
        }

        /// The rows `refill_picks` answers: pending, in pop order, from `from`, up to `limit`.
        fn picks(&self, from: &ReadFrom, limit: usize) -> Vec<HeapRow> {
            self.pending
                .iter()
                .filter(|(r, _)| from.start().is_none_or(|s| s.reads(**r)))
                .take(limit)
                .map(|(_, id)| HeapRow::from(&self.rows[id]))
                .collect()
        }
    }

    fn refill(st: &mut QueueState, table: &Table, n: usize) {
        let from = ReadFrom::of(st);
        let read = from.sift(table.picks(&from, from.limit(n)), n).unwrap();
        let want: Vec<Uuid> = table
            .pending
            .values()
            .filter(|id| !st.heap.contains(id))
            .take(n)
            .copied()
            .collect();
        let got: Vec<Uuid> = read.rows.iter().map(|r| r.uuid().unwrap()).collect();
        assert_eq!(
            got, want,
            "a refill reads the best pending tasks the heap lacks"
        );
        read_in(st, read, n).unwrap();
    }

    /// Every pending task the heap does not hold ranks after everything it holds.
    fn check_order(st: &QueueState, table: &Table) {
        let Some(worst) = st.heap.worst() else { return };
        if let Some((first, _)) = table.pending.iter().find(|(_, id)| !st.heap.contains(id)) {
            assert!(
                *first > worst,
                "a pending task the heap lacks ranks before its worst"
            );
        }
    }

    /// Where organisations take turns (odd seeds), a push evicts the largest organisation's
    /// worst task, which may rank before tasks the heap holds as read: the refill that reads it
    /// again skips those.
    #[test]
    fn refills_read_the_best_pending_tasks_the_heap_lacks_whatever_pushes_and_pops_do_between() {
        for seed in 1..=400u64 {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
            let fair = seed % 2 == 1;
            let mut limits = limits(8, WhenFull::Pending);
            if fair {
                limits.fairness = Fairness::Organisation;
            }
            let mut st = QueueState::new(SchedulerId::Boefje, limits);
            let mut table = Table::default();
            let mut pushed = HashSet::new();
            let mut popped = Vec::new();
            let mut clock = 0;
            for _ in 0..300 {
                match rng.below(10) {
                    // A push, of any priority: into the heap (evicting its worst) or pending.
                    0..=3 => {
                        clock += 1;
                        let (id, mut r) = row(rng.below(40) as i64, clock % 7);
                        // Mostly one organisation's, so its share of the heap is the largest.
                        r.organisation = format!("org{}", rng.below(5).saturating_sub(2));
                        let mut rows = BatchRows::default();
                        let placed = place(&mut st, &mut rows, id, &r, Admission::New).unwrap();
                        r.status = crate::domain::TaskStatus::new_task(placed);
                        table.rows.insert(id, r);
                        if placed == crate::domain::Placement::Backlog {
                            table.pending.insert(table.rank(&id), id);
                        }
                        // Evicted tasks written `queued → pending`; one held as read wrote
                        // nothing (its row is pending already).
                        for victim in rows.evicted {
                            assert!(!table.pending.values().any(|p| *p == victim));
                            table.pending.insert(table.rank(&victim), victim);
                        }
                        pushed.insert(id);
                    }
                    // A pop of the heap's best: one held as read leaves the pending rows.
                    4..=7 => {
                        if let Some(best) = st.heap.best() {
                            st.heap.take(&best.id);
                            let held = st.copies.taken(&best.id);
                            let was_pending = table.pending.remove(&best).is_some();
                            assert_eq!(held, was_pending, "held as read ⇔ pending in the table");
                            popped.push(best.id);
                        }
                    }
                    // A refill ahead once a tenth of the heap is free.
                    _ => {
                        let n = ahead(&st);
                        if n > 0 {
                            refill(&mut st, &table, n);
                        }
                    }
                }
                if !fair {
                    check_order(&st, &table);
                }
            }
            // Drain: everything comes out once.
            loop {
                let n = st.heap.room().min(table.pending.len());
                if n > 0 {
                    refill(&mut st, &table, n);
                }
                let Some(best) = st.heap.best() else { break };
                st.heap.take(&best.id);
                if st.copies.taken(&best.id) {
                    table.pending.remove(&best);
                }
                popped.push(best.id);
                if !fair {
                    check_order(&st, &table);
                }
            }
            let once: HashSet<Uuid> = popped.iter().copied().collect();
            assert_eq!(once.len(), popped.len(), "seed {seed}: a task popped twice");
            assert_eq!(once, pushed, "seed {seed}: a task lost");
            assert!(table.pending.is_empty());
        }
    }
}
