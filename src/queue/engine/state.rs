//! What an engine keeps in memory of its scheduler's queue: the heap, what it knows of the
//! pending backlog, and the clock of creation times. The rules change it; only the engine's
//! thread owns it.

use std::collections::HashSet;

use chrono::{DateTime, NaiveDateTime, Utc};

use crate::domain::{SchedulerId, TaskStatus};
use crate::queue::SchedulerLimits;
use crate::queue::heap::{SchedulerHeap, hash_bytes};

/// Hashes of pending tasks kept in memory per scheduler at most (16 bytes each, about 24 with
/// the set's overhead). Beyond it the set is dropped and pushes ask the table again, until the
/// backlog has drained.
pub const PENDING_HASHES_MAX: usize = 2_000_000;

/// One scheduler's queue state.
pub(crate) struct QueueState {
    pub scheduler: SchedulerId,
    pub limits: SchedulerLimits,
    pub heap: SchedulerHeap,
    pub pending: PendingSet,
    /// The last `created_at` handed out, in microseconds: creation times are strictly
    /// increasing, so pop order among equal priorities is push order even within a microsecond.
    last_created: i64,
}

impl QueueState {
    /// An empty state (the engine rebuilds it from the table before use).
    pub fn new(scheduler: SchedulerId, limits: SchedulerLimits) -> Self {
        Self {
            scheduler,
            limits,
            heap: SchedulerHeap::new(scheduler, limits.maxsize),
            pending: PendingSet::default(),
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

    /// When a lease taken now on a task in `status` ends (`None` for statuses without one).
    pub fn lease(&self, now: DateTime<Utc>, status: TaskStatus) -> Option<NaiveDateTime> {
        let ttl = match status {
            TaskStatus::Dispatched => self.limits.dispatch_timeout,
            TaskStatus::Running => self.limits.run_timeout,
            _ => return None,
        };
        chrono::Duration::from_std(ttl)
            .ok()
            .and_then(|ttl| now.checked_add_signed(ttl))
            .map(|t| t.naive_utc())
    }
}

/// What the engine knows of the pending backlog: how many tasks wait there and, while they are
/// not too many, their hashes, so a push can tell a new task from a duplicate without a read.
#[derive(Debug)]
pub(crate) struct PendingSet {
    count: u64,
    /// `None`: not known (too many, or not loaded); pushes must ask the table.
    hashes: Option<HashSet<[u8; 16]>>,
}

impl Default for PendingSet {
    fn default() -> Self {
        Self {
            count: 0,
            hashes: Some(HashSet::new()),
        }
    }
}

impl PendingSet {
    /// A backlog of `count` tasks with these hashes (`None`: unknown).
    pub fn with(count: u64, hashes: Option<HashSet<[u8; 16]>>) -> Self {
        let mut set = Self { count, hashes };
        set.settle();
        set
    }

    /// Tasks waiting as pending.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// A task became pending.
    pub fn add(&mut self, hash: Option<&str>) {
        self.count += 1;
        if let (Some(set), Some(h)) = (self.hashes.as_mut(), hash.and_then(hash_bytes)) {
            set.insert(h);
            if set.len() > PENDING_HASHES_MAX {
                self.hashes = None;
            }
        }
    }

    /// A task left pending.
    pub fn remove(&mut self, hash: Option<&str>) {
        self.count = self.count.saturating_sub(1);
        if let (Some(set), Some(h)) = (self.hashes.as_mut(), hash.and_then(hash_bytes)) {
            set.remove(&h);
        }
        self.settle();
    }

    /// The table says there are `count` (after a refill found fewer than counted).
    pub fn correct(&mut self, count: u64) {
        self.count = count;
        self.settle();
    }

    /// Whether a pending task may have this hash (false only when it certainly has not).
    pub fn may_hold(&self, hash: &str) -> bool {
        if self.count == 0 {
            return false;
        }
        match (&self.hashes, hash_bytes(hash)) {
            (Some(set), Some(h)) => set.contains(&h),
            _ => true,
        }
    }

    fn settle(&mut self) {
        // An empty backlog is fully known again.
        if self.count == 0 {
            self.hashes = Some(HashSet::new());
        }
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
    }
}
