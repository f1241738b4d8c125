//! What an engine keeps in memory of its scheduler's queue: the heap, what it knows of the
//! pending backlog, and the clock of creation times. The rules change it; only the engine's
//! thread owns it.

use super::leases::LeaseBook;
use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use chrono::{DateTime, NaiveDateTime, Utc};
use uuid::Uuid;

use crate::domain::politeness::Throttle;
use crate::domain::{SchedulerId, TaskStatus};
use crate::queue::fair::FairShare;
use crate::queue::heap::{Rank, SchedulerHeap, hash_bytes};
use crate::queue::types::SchedulerLimits;

/// Hashes of pending tasks kept in memory per scheduler at most (16 bytes and a count each, 24 to
/// 48 with the map's overhead as it fills and grows: 88 MB at this bound). Beyond it the hashes
/// are dropped and pushes ask the table again, until the backlog has drained.
pub const PENDING_HASHES_MAX: usize = 2_000_000;

/// One scheduler's queue state.
pub(crate) struct QueueState {
    pub scheduler: SchedulerId,
    pub limits: SchedulerLimits,
    pub heap: SchedulerHeap,
    pub pending: PendingSet,
    /// The hashes of the tasks handed out and not finished (`dispatched`, `running`), so the
    /// planner's push of the same work is refused from memory (no concurrent invocation). As
    /// many as there are tasks in flight: workers times their local queues, plus what leases
    /// hold for dead workers until the watchdog takes it back.
    pub in_flight: InFlightHashes,
    /// The leases of the tasks in flight, in the order they end: what the watchdog expires.
    pub leases: LeaseBook,
    /// The dispatch limits and what counts against them.
    pub throttle: Throttle,
    /// What the heap holds as the refills read it, not yet written: see [`Copies`].
    pub copies: Copies,
    /// The last `created_at` handed out, in microseconds: creation times are strictly
    /// increasing, so pop order among equal priorities is push order even within a microsecond.
    last_created: i64,
}

impl QueueState {
    /// An empty state (the engine rebuilds it from the table before use).
    pub fn new(scheduler: SchedulerId, limits: SchedulerLimits) -> Self {
        Self {
            scheduler,
            heap: SchedulerHeap::new(scheduler, limits.maxsize)
                .with_fairness(FairShare::new(limits.fairness, limits.weights.clone())),
            throttle: Throttle::new(limits.politeness.clone()),
            limits,
            pending: PendingSet::default(),
            in_flight: InFlightHashes::default(),
            leases: LeaseBook::default(),
            copies: Copies::default(),
            last_created: i64::MIN,
        }
    }

    /// A creation time for a new task: `now`, or just after the last one handed out.
    pub fn next_created(&mut self, now: DateTime<Utc>) -> NaiveDateTime {
        let micros = now
            .timestamp_micros()
            .max(self.last_created.saturating_add(1));
        self.last_created = micros;
        DateTime::from_timestamp_micros(micros)
            .unwrap_or(now)
            .naive_utc()
    }

    /// When a lease taken now on a task moving into `status` ends (`None` for statuses without
    /// one). A task that starts running gets the lease of a holder that may never renew it
    /// (OpenKAT's runners send one `PATCH running` and no heartbeat), the longer of the two run
    /// leases; [`Self::renewed_lease`] is the lease of a heartbeat.
    pub fn lease(&self, now: DateTime<Utc>, status: TaskStatus) -> Option<NaiveDateTime> {
        let ttl = match status {
            TaskStatus::Dispatched => self.limits.dispatch_timeout,
            TaskStatus::Running => self
                .limits
                .unrenewed_run_timeout
                .max(self.limits.run_timeout),
            _ => return None,
        };
        Self::until(now, ttl)
    }

    /// When the lease of a running task renewed now (a repeated `PATCH running`) ends: once a
    /// holder has shown that it sends heartbeats, the run timeout applies.
    pub fn renewed_lease(&self, now: DateTime<Utc>) -> Option<NaiveDateTime> {
        Self::until(now, self.limits.run_timeout)
    }

    fn until(now: DateTime<Utc>, ttl: std::time::Duration) -> Option<NaiveDateTime> {
        chrono::Duration::from_std(ttl)
            .ok()
            .and_then(|ttl| now.checked_add_signed(ttl))
            .map(|t| t.naive_utc())
    }
}

/// Heap tasks a refill read from the pending backlog and has not written: their rows are still
/// `pending`, with their queue rows, until a pop takes them (`pending → dispatched`, the queue
/// row deleted, as a pop from the backlog writes) or a batch that may meet one in the table
/// writes them `queued` before it reads anything (`refill::settle_held`): all of them before a
/// cancel, a re-score or a patch of a task not in flight, which may read any pending row; the
/// ones it names before a push ([`Copies::take`]: a boost of one, by its hash or id).
///
/// A refill that moved its picks wrote every task a second time (`pending → queued`, then the
/// pop's `queued → dispatched`) and deleted its queue row apart: about 25 µs of the server per
/// task, on two cores that the pops share (docs/BENCHMARKS.md, "The bursts apart from the
/// put-backs"). Deferred, a task popped from the heap costs what a task popped from the backlog
/// does. A push that evicts one writes nothing for it: its row is pending already.
///
/// Every pending row not held here ranks after where the next refill reads from
/// ([`Copies::start`]): after the last row a refill read, or, once a task became pending ahead of
/// that (pushed into the backlog or evicted, [`Copies::became_pending`]), at that task. A refill
/// from there skips the tasks held here that it meets again ([`Copies::ahead_of`]).
#[derive(Debug, Default)]
pub(crate) struct Copies {
    ids: HashSet<Uuid>,
    /// Where the next refill reads from while tasks are held here.
    start: Option<Start>,
    /// The worst rank a refill read while tasks are held here: no task held ranks after it.
    read_to: Option<Rank>,
}

/// Where a refill reads from in pop order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// After this rank (the last row a refill read).
    After(Rank),
    /// At this rank, included (a task that became pending there).
    At(Rank),
}

impl Start {
    /// The rank it starts at or after.
    pub fn rank(self) -> Rank {
        match self {
            Start::After(r) | Start::At(r) => r,
        }
    }

    /// Whether a refill from here reads a row of rank `r`.
    pub fn reads(self, r: Rank) -> bool {
        match self {
            Start::After(k) => r > k,
            Start::At(k) => r >= k,
        }
    }
}

impl Copies {
    /// Whether the heap holds this task as read, not written.
    pub fn contains(&self, id: &Uuid) -> bool {
        self.ids.contains(id)
    }

    /// How many tasks are held as read.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Takes in the rows a refill read (in pop order) as held: the heap has them. `last` is the
    /// last row it read, held here before or not: every pending row up to it is held now.
    pub fn read(&mut self, ids: impl IntoIterator<Item = Uuid>, last: Option<Rank>) {
        if self.ids.is_empty() {
            self.read_to = None;
        }
        self.ids.extend(ids);
        if let Some(last) = last {
            self.start = Some(Start::After(last));
            self.read_to = self.read_to.max(Some(last));
        }
    }

    /// A task taken from the heap: answers whether its row is still pending (to be written
    /// from `pending`).
    pub fn taken(&mut self, id: &Uuid) -> bool {
        self.ids.remove(id)
    }

    /// A task evicted from the heap to the backlog: answers whether it was held here (its row is
    /// pending already, with its queue row: nothing to write).
    pub fn evicted(&mut self, id: &Uuid) -> bool {
        self.ids.remove(id)
    }

    /// A task of rank `r` became pending, not held here: the next refill reads from it if it
    /// would not have read it.
    pub fn became_pending(&mut self, r: Rank) {
        if let Some(start) = self.start
            && !start.reads(r)
        {
            self.start = Some(Start::At(r));
        }
    }

    /// Where the next refill reads from: see [`Copies`]; from the backlog's head when no task is
    /// held (which also finds rows added behind the engine's back).
    pub fn start(&self) -> Option<Start> {
        self.start.filter(|_| !self.ids.is_empty())
    }

    /// The tasks held here that a refill from `start` reads again (`heap` gives their ranks).
    pub fn ahead_of(&self, start: Start, heap: &SchedulerHeap) -> HashSet<Uuid> {
        if self.read_to.is_none_or(|to| !start.reads(to)) {
            // None ranks after the worst read, which the refill does not read.
            return HashSet::new();
        }
        self.ids
            .iter()
            .filter(|id| heap.rank(id).is_some_and(|r| start.reads(r)))
            .copied()
            .collect()
    }

    /// The tasks of `ids` held here, held no more: to be written `queued` before a batch that
    /// names them reads them.
    pub fn take(&mut self, ids: impl IntoIterator<Item = Uuid>) -> Vec<Uuid> {
        ids.into_iter().filter(|id| self.ids.remove(id)).collect()
    }

    /// Every task held, to be written `queued` before a batch that may meet any pending row; the
    /// next refill reads from the backlog's head again.
    pub fn take_all(&mut self) -> Vec<Uuid> {
        self.start = None;
        self.read_to = None;
        self.ids.drain().collect()
    }
}

/// Pending tasks per hash.
pub(crate) type PendingHashes = HashMap<[u8; 16], u32>;

/// What the engine knows of the pending backlog: how many tasks wait there and, while they are
/// not too many, their hashes, so a push can tell a new task from a duplicate without a read.
#[derive(Debug)]
pub(crate) struct PendingSet {
    count: u64,
    /// How many pending tasks have each hash; `None`: not known (too many, or not loaded),
    /// pushes must ask the table. Counted, not a set: the same work can wait twice in a table
    /// written behind the engine's back (a database written by mula, rows changed by hand), and
    /// the one left must still be found once the other leaves.
    hashes: Option<PendingHashes>,
    /// A task left the backlog that the count did not hold: rows changed behind the engine's
    /// back (by hand, a restore, another tool), so the count is low and must be read again
    /// ([`Self::needs_recount`]). A low count would stop the refill early and leave pending
    /// work only a filtered pop's search of the table can find.
    drifted: bool,
}

impl Default for PendingSet {
    fn default() -> Self {
        Self {
            count: 0,
            hashes: Some(PendingHashes::new()),
            drifted: false,
        }
    }
}

impl PendingSet {
    /// A backlog of `count` tasks with these hashes (`None`: unknown).
    pub fn with(count: u64, hashes: Option<PendingHashes>) -> Self {
        let mut set = Self {
            count,
            hashes,
            drifted: false,
        };
        set.settle();
        set
    }

    /// The count as the table has it now, after drift. The hashes of rows that appeared behind
    /// the engine's back are not known: pushes ask the table until the backlog has drained.
    pub fn recounted(count: u64) -> Self {
        Self::with(count, None)
    }

    /// Whether the count was found low and must be read from the table again.
    pub fn needs_recount(&self) -> bool {
        self.drifted
    }

    /// Tasks waiting as pending.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// A task became pending.
    pub fn add(&mut self, hash: Option<&str>) {
        self.count += 1;
        if let (Some(set), Some(h)) = (self.hashes.as_mut(), hash.and_then(hash_bytes)) {
            *set.entry(h).or_default() += 1;
            if set.len() > PENDING_HASHES_MAX {
                self.hashes = None;
            }
        }
    }

    /// A task left pending.
    pub fn remove(&mut self, hash: Option<&str>) {
        if self.count == 0 {
            // The table held one more than counted.
            self.drifted = true;
        }
        self.count = self.count.saturating_sub(1);
        if let (Some(set), Some(h)) = (self.hashes.as_mut(), hash.and_then(hash_bytes))
            && let Some(n) = set.get_mut(&h)
        {
            *n -= 1;
            if *n == 0 {
                set.remove(&h);
            }
        }
        self.settle();
    }

    /// The table no longer held pending a task the engine took from the backlog (changed
    /// behind its back): the count is read again.
    pub fn drift(&mut self) {
        self.drifted = true;
    }

    /// The table says there are `count` (after a refill found fewer than counted).
    pub fn correct(&mut self, count: u64) {
        self.count = count;
        self.settle();
    }

    /// Whether a pending task may have this hash (false only when it certainly has not).
    pub fn may_hold(&self, hash: &str) -> bool {
        // A count that drifted (rows changed behind the engine's back; read again after the
        // batch) does not know the backlog: a count of none may hide this very work, and
        // answering "certainly not" would create it twice.
        if self.drifted {
            return true;
        }
        if self.count == 0 {
            return false;
        }
        match (&self.hashes, hash_bytes(hash)) {
            (Some(set), Some(h)) => set.contains_key(&h),
            _ => true,
        }
    }

    fn settle(&mut self) {
        // An empty backlog is fully known again.
        if self.count == 0 {
            self.hashes = Some(PendingHashes::new());
        }
    }
}

/// Tasks by hash, every task of each: the same work can be out with runners twice (a user pushes
/// work again while it runs), or wait twice in a table written behind the engine's back (see
/// [`super::rejoin`] for work coming back), and the one left must still be found once the other
/// has gone.
#[derive(Debug)]
pub(crate) struct TasksByHash<K>(HashMap<K, Vec<Uuid>>);

impl<K> Default for TasksByHash<K> {
    fn default() -> Self {
        Self(HashMap::new())
    }
}

impl<K: Eq + Hash> TasksByHash<K> {
    /// A task of this hash, if any.
    pub fn first<Q: Eq + Hash + ?Sized>(&self, key: &Q) -> Option<Uuid>
    where
        K: Borrow<Q>,
    {
        self.0.get(key).and_then(|ids| ids.first()).copied()
    }

    /// Every task of this hash.
    pub fn all<Q: Eq + Hash + ?Sized>(&self, key: &Q) -> &[Uuid]
    where
        K: Borrow<Q>,
    {
        self.0.get(key).map_or(&[], Vec::as_slice)
    }

    /// Records a task of this hash (once).
    pub fn add(&mut self, key: K, id: Uuid) {
        let ids = self.0.entry(key).or_default();
        if !ids.contains(&id) {
            ids.push(id);
        }
    }

    /// Forgets a task of this hash.
    pub fn remove<Q: Eq + Hash + ?Sized>(&mut self, key: &Q, id: Uuid)
    where
        K: Borrow<Q>,
    {
        if let Some(ids) = self.0.get_mut(key) {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                self.0.remove(key);
            }
        }
    }

    /// How many hashes.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// Hash → task, for the tasks in flight.
#[derive(Debug, Default)]
pub(crate) struct InFlightHashes(TasksByHash<[u8; 16]>);

impl InFlightHashes {
    /// A task in flight with this hash, if any.
    pub fn find(&self, hash: &str) -> Option<Uuid> {
        self.0.first(&hash_bytes(hash)?)
    }

    /// Records a task's committed status: in flight, or not (any more). The work is in flight
    /// until the last of its tasks out finishes.
    pub fn record(&mut self, id: Uuid, hash: Option<&str>, status: TaskStatus) {
        let Some(h) = hash.and_then(hash_bytes) else {
            return;
        };
        if matches!(status, TaskStatus::Dispatched | TaskStatus::Running) {
            self.0.add(h, id);
        } else {
            self.0.remove(&h, id);
        }
    }

    /// How many hashes.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pending_set_answers_without_the_table_while_it_knows() {
        let h = format!("{:032x}", 7u128);
        let other = format!("{:032x}", 8u128);
        let mut set = PendingSet::default();
        assert!(!set.may_hold(&h));
        set.add(Some(&h));
        assert!(set.may_hold(&h));
        assert!(!set.may_hold(&other));
        set.remove(Some(&h));
        assert_eq!(set.count(), 0);
        assert!(!set.may_hold(&h));
        let mut unknown = PendingSet::with(3, None);
        assert!(unknown.may_hold(&other), "unknown: ask the table");
        unknown.correct(0);
        assert!(!unknown.may_hold(&other), "an empty backlog is known");
        // A refill that came short: none counted, but the table may hold more.
        let mut short = PendingSet::with(5, Some(PendingHashes::new()));
        short.correct(0);
        short.drift();
        assert!(short.may_hold(&other), "drifted: ask the table");
        let recounted = PendingSet::recounted(0);
        assert!(!recounted.may_hold(&other), "read again: known");
    }

    #[test]
    fn a_task_leaving_a_backlog_counted_empty_marks_the_count_for_a_recount() {
        let h = format!("{:032x}", 7u128);
        let mut set = PendingSet::default();
        set.add(Some(&h));
        set.remove(Some(&h));
        assert!(!set.needs_recount(), "counted, so no drift");
        set.remove(None);
        assert!(set.needs_recount(), "one more left than the count held");
        let again = PendingSet::recounted(4);
        assert!(!again.needs_recount());
        assert_eq!(again.count(), 4);
        assert!(
            again.may_hold(&h),
            "hashes unknown after drift: ask the table"
        );
    }

    #[test]
    fn a_hash_is_in_flight_from_dispatch_until_its_task_finishes() {
        let h = format!("{:032x}", 9u128);
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut f = InFlightHashes::default();
        f.record(a, Some(&h), TaskStatus::Dispatched);
        assert_eq!(f.find(&h), Some(a));
        f.record(a, Some(&h), TaskStatus::Running);
        // Another task of the same hash finishing does not clear a's entry.
        f.record(b, Some(&h), TaskStatus::Completed);
        assert_eq!(f.find(&h), Some(a));
        f.record(a, Some(&h), TaskStatus::Failed);
        assert_eq!(f.find(&h), None);
        assert_eq!(f.len(), 0);
    }

    #[test]
    fn work_out_twice_is_in_flight_until_both_finish() {
        let h = format!("{:032x}", 9u128);
        for first_done in [0, 1] {
            let ids = [Uuid::new_v4(), Uuid::new_v4()];
            let mut f = InFlightHashes::default();
            f.record(ids[0], Some(&h), TaskStatus::Running);
            f.record(ids[1], Some(&h), TaskStatus::Dispatched);
            f.record(ids[first_done], Some(&h), TaskStatus::Completed);
            assert_eq!(f.find(&h), Some(ids[1 - first_done]));
            f.record(ids[1 - first_done], Some(&h), TaskStatus::Completed);
            assert_eq!(f.find(&h), None);
        }
    }

    #[test]
    fn work_waiting_twice_is_known_until_both_leave_the_backlog() {
        let h = format!("{:032x}", 7u128);
        let mut set = PendingSet::default();
        set.add(Some(&h));
        set.add(Some(&h));
        set.remove(Some(&h));
        assert!(set.may_hold(&h), "the other still waits");
        set.remove(Some(&h));
        assert!(!set.may_hold(&h));
        let mut loaded = PendingHashes::new();
        loaded.insert(hash_bytes(&h).unwrap(), 2);
        let mut set = PendingSet::with(2, Some(loaded));
        set.remove(Some(&h));
        assert!(set.may_hold(&h), "as loaded from the table");
    }
}
