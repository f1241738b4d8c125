//! The leases of an engine's tasks in flight, kept in memory in the order they end, so the
//! watchdog's sweep reads no table.
//!
//! `tasks` has no index on leases or on status: a status in an index predicate makes every pop,
//! start and finish a non-HOT update, a new entry in each of the table's indexes (the write-ahead
//! log per job, docs/BENCHMARKS.md). So the sweep's search of the table was a scan of every row
//! of the scheduler, history included, every watchdog interval: about 0.1 s of the server per
//! sweep and million rows, for each scheduler, however few tasks were in flight. The engine
//! writes every row of its scheduler and reads back what each batch committed, and a rebuild
//! (start, takeover, a failed batch) reads the tasks in flight with the queued ones: so it knows
//! every lease the table holds, and the tasks whose lease has ended are the front of this book.
//! The rule that expires them reads each of those rows from the table, not from the engine's
//! memory ([`super::lease::expire`]), so a lease lengthened in SQL behind the engine's back
//! stands (and is the book's from then on); one shortened in SQL is seen at the next rebuild,
//! as every such change is (docs/OPERATIONS.md).

use std::collections::{BTreeSet, HashMap};

use chrono::NaiveDateTime;
use uuid::Uuid;

use crate::domain::TaskStatus;

/// When each task in flight must be heard of, by task and in order.
#[derive(Debug, Default)]
pub(crate) struct LeaseBook {
    by_task: HashMap<Uuid, NaiveDateTime>,
    by_end: BTreeSet<(NaiveDateTime, Uuid)>,
}

impl LeaseBook {
    /// Records a task's committed status and lease: a task in flight with a lease is kept, any
    /// other forgotten.
    pub fn record(&mut self, id: Uuid, status: TaskStatus, lease: Option<NaiveDateTime>) {
        let held = matches!(status, TaskStatus::Dispatched | TaskStatus::Running);
        let lease = lease.filter(|_| held);
        match (self.by_task.get(&id).copied(), lease) {
            (Some(was), Some(now)) if was == now => {}
            (was, now) => {
                if let Some(was) = was {
                    self.by_end.remove(&(was, id));
                    self.by_task.remove(&id);
                }
                if let Some(now) = now {
                    self.by_end.insert((now, id));
                    self.by_task.insert(id, now);
                }
            }
        }
    }

    /// Up to `limit` tasks whose lease ended before `now`, the longest ended first (the order
    /// of the table scan it replaces).
    pub fn ended(&self, now: NaiveDateTime, limit: usize) -> Vec<Uuid> {
        self.by_end
            .iter()
            .take_while(|(end, _)| *end < now)
            .take(limit)
            .map(|(_, id)| *id)
            .collect()
    }

    /// Tasks it holds.
    pub fn len(&self) -> usize {
        self.by_task.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::DateTime;

    fn at(s: i64) -> NaiveDateTime {
        DateTime::from_timestamp(1_800_000_000 + s, 0)
            .unwrap()
            .naive_utc()
    }

    #[test]
    fn the_ended_leases_come_longest_ended_first_and_only_those() {
        let mut book = LeaseBook::default();
        let ids: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        book.record(ids[0], TaskStatus::Dispatched, Some(at(30)));
        book.record(ids[1], TaskStatus::Running, Some(at(10)));
        book.record(ids[2], TaskStatus::Dispatched, Some(at(20)));
        book.record(ids[3], TaskStatus::Running, Some(at(40)));
        assert_eq!(book.ended(at(31), 10), vec![ids[1], ids[2], ids[0]]);
        assert_eq!(
            book.ended(at(31), 2),
            vec![ids[1], ids[2]],
            "up to the limit"
        );
        assert_eq!(
            book.ended(at(10), 10),
            Vec::<Uuid>::new(),
            "ends at now: not yet"
        );
    }

    #[test]
    fn a_renewed_lease_moves_and_a_finished_or_requeued_task_leaves() {
        let mut book = LeaseBook::default();
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        book.record(a, TaskStatus::Dispatched, Some(at(10)));
        book.record(b, TaskStatus::Dispatched, Some(at(10)));
        book.record(c, TaskStatus::Dispatched, Some(at(10)));
        // Started: a new lease, later.
        book.record(a, TaskStatus::Running, Some(at(100)));
        book.record(b, TaskStatus::Completed, None);
        // Back in the queue (its lease taken away), or a status that holds none.
        book.record(c, TaskStatus::Queued, Some(at(10)));
        assert_eq!(book.ended(at(50), 10), Vec::<Uuid>::new());
        assert_eq!(book.ended(at(101), 10), vec![a]);
        assert_eq!(book.len(), 1);
        // In flight without a lease (leases switched off): nothing to expire.
        book.record(a, TaskStatus::Running, None);
        assert_eq!(book.len(), 0);
        assert!(book.ended(at(1_000), 10).is_empty());
    }
}
