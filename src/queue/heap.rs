//! One scheduler's bounded in-memory heap of queued tasks.
//!
//! It holds only what ranks a task, keyed by task id, never the payload: the `tasks` table is the
//! truth and the heap is its index of `queued` rows. Best first is the lowest
//! `(priority, created_at)`; the worst entry is just as cheap to find, for eviction. Beside it,
//! an index from task hash to task id lets a push find a queued duplicate without asking the
//! database.

use std::cmp::Ordering;
use std::collections::HashMap;

use priority_queue::DoublePriorityQueue;
use uuid::Uuid;

use crate::domain::USER_PRIORITY_MAX;

/// Where a task ranks: lower is popped first. It also carries the task's hash (the first 64 bits),
/// which takes no part in the order, so the hash index can be kept exact as entries leave.
#[derive(Debug, Clone, Copy)]
pub struct Rank {
    /// The task priority (lower is more urgent).
    pub priority: i64,
    /// Creation time in microseconds since the epoch (older first among equals).
    pub created_micros: i64,
    /// The first 64 bits of the task hash (0 if the task has none).
    pub hash: u64,
}

impl PartialEq for Rank {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Rank {}

impl PartialOrd for Rank {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Rank {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.priority, self.created_micros).cmp(&(other.priority, other.created_micros))
    }
}

/// The first 64 bits of a task hash (32 hex digits), or 0 when there is none.
pub fn hash_key(hash: Option<&str>) -> u64 {
    hash.and_then(|h| h.get(..16))
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or(0)
}

impl Rank {
    /// A rank from a priority, a creation time and the task hash.
    pub fn new(priority: i64, created_at: chrono::NaiveDateTime, hash: Option<&str>) -> Self {
        Self {
            priority,
            created_micros: created_at.and_utc().timestamp_micros(),
            hash: hash_key(hash),
        }
    }

    /// Whether this is a user scan (priority ≤ 1), which may evict automatic work.
    pub fn is_user(self) -> bool {
        self.priority <= USER_PRIORITY_MAX
    }
}

/// A bounded min-max heap of task ids, with an index from task hash to task id.
#[derive(Debug)]
pub struct SchedulerHeap {
    queue: DoublePriorityQueue<Uuid, Rank>,
    by_hash: HashMap<u64, Uuid>,
    maxsize: usize,
}

impl SchedulerHeap {
    /// An empty heap that holds at most `maxsize` tasks.
    pub fn new(maxsize: usize) -> Self {
        Self {
            queue: DoublePriorityQueue::new(),
            by_hash: HashMap::new(),
            maxsize,
        }
    }

    /// A heap holding `entries` (built in O(n)); the caller keeps it within `maxsize`.
    pub fn from_entries(maxsize: usize, entries: Vec<(Uuid, Rank)>) -> Self {
        let mut by_hash = HashMap::with_capacity(entries.len());
        for (id, rank) in &entries {
            if rank.hash != 0 {
                by_hash.insert(rank.hash, *id);
            }
        }
        Self {
            queue: entries.into_iter().collect(),
            by_hash,
            maxsize,
        }
    }

    fn forget(&mut self, id: &Uuid, rank: &Rank) {
        if self.by_hash.get(&rank.hash) == Some(id) {
            self.by_hash.remove(&rank.hash);
        }
    }

    /// The queued task whose hash starts with these 64 bits, if any. Two different hashes
    /// sharing 64 bits is possible in principle, so a caller that acts on a hit compares the full
    /// hash of the task it finds.
    pub fn find_hash(&self, hash: Option<&str>) -> Option<Uuid> {
        match hash_key(hash) {
            0 => None,
            key => self.by_hash.get(&key).copied(),
        }
    }

    /// The bound.
    pub fn maxsize(&self) -> usize {
        self.maxsize
    }

    /// Queued tasks held.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether the bound is reached.
    pub fn is_full(&self) -> bool {
        self.queue.len() >= self.maxsize
    }

    /// Room left before the bound.
    pub fn room(&self) -> usize {
        self.maxsize.saturating_sub(self.queue.len())
    }

    /// Adds (or re-ranks) a task. The caller checks the bound first.
    pub fn insert(&mut self, id: Uuid, rank: Rank) {
        if rank.hash != 0 {
            self.by_hash.insert(rank.hash, id);
        }
        self.queue.push(id, rank);
    }

    /// Removes a task; returns its rank if it was there.
    pub fn remove(&mut self, id: &Uuid) -> Option<Rank> {
        let (id, rank) = self.queue.remove(id)?;
        self.forget(&id, &rank);
        Some(rank)
    }

    /// Changes a queued task's rank; false if the task is not in the heap.
    pub fn rerank(&mut self, id: &Uuid, rank: Rank) -> bool {
        self.queue.change_priority(id, rank).is_some()
    }

    /// Whether a task is in the heap.
    pub fn contains(&self, id: &Uuid) -> bool {
        self.queue.get_priority(id).is_some()
    }

    /// Takes the best task out.
    pub fn pop_best(&mut self) -> Option<(Uuid, Rank)> {
        let (id, rank) = self.queue.pop_min()?;
        self.forget(&id, &rank);
        Some((id, rank))
    }

    /// The worst automatic task (priority > 1), the one a user scan may evict.
    pub fn worst_automatic(&self) -> Option<(Uuid, Rank)> {
        self.queue
            .peek_max()
            .filter(|(_, rank)| !rank.is_user())
            .map(|(id, rank)| (*id, *rank))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(priority: i64, created_micros: i64) -> Rank {
        Rank {
            priority,
            created_micros,
            hash: 0,
        }
    }

    #[test]
    fn pops_lowest_priority_then_oldest() {
        let mut heap = SchedulerHeap::new(10);
        let ids: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        heap.insert(ids[0], rank(5, 10));
        heap.insert(ids[1], rank(1, 30));
        heap.insert(ids[2], rank(5, 5));
        heap.insert(ids[3], rank(1, 20));
        let order: Vec<Uuid> = std::iter::from_fn(|| heap.pop_best().map(|(id, _)| id)).collect();
        assert_eq!(order, vec![ids[3], ids[1], ids[2], ids[0]]);
    }

    #[test]
    fn the_worst_automatic_task_is_the_eviction_candidate() {
        let mut heap = SchedulerHeap::new(3);
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        heap.insert(a, rank(1, 1));
        heap.insert(b, rank(100, 2));
        heap.insert(c, rank(50, 3));
        assert!(heap.is_full());
        assert_eq!(heap.worst_automatic().map(|(id, _)| id), Some(b));
        heap.remove(&b);
        heap.remove(&c);
        // only user scans left: nothing to evict
        assert_eq!(heap.worst_automatic(), None);
    }

    #[test]
    fn the_hash_index_follows_every_way_in_and_out() {
        let h = |n: u64| format!("{n:016x}{:016x}", 0);
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let t = chrono::DateTime::from_timestamp(0, 0).unwrap().naive_utc();
        let mut heap = SchedulerHeap::from_entries(10, vec![(a, Rank::new(1, t, Some(&h(1))))]);
        heap.insert(b, Rank::new(2, t, Some(&h(2))));
        heap.insert(c, Rank::new(3, t, Some(&h(3))));
        assert_eq!(heap.find_hash(Some(&h(1))), Some(a));
        assert_eq!(heap.pop_best().map(|(id, _)| id), Some(a));
        assert_eq!(heap.find_hash(Some(&h(1))), None, "popped");
        heap.remove(&b);
        assert_eq!(heap.find_hash(Some(&h(2))), None, "removed");
        assert!(heap.rerank(&c, Rank::new(0, t, Some(&h(3)))));
        assert_eq!(
            heap.find_hash(Some(&h(3))),
            Some(c),
            "re-ranked, still there"
        );
        assert_eq!(heap.find_hash(None), None);
    }

    #[test]
    fn rerank_moves_a_task_forward() {
        let mut heap = SchedulerHeap::new(10);
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        heap.insert(a, rank(5, 1));
        heap.insert(b, rank(9, 2));
        assert!(heap.rerank(&b, rank(1, 2)));
        assert_eq!(heap.pop_best().map(|(id, _)| id), Some(b));
        assert!(!heap.rerank(&Uuid::new_v4(), rank(1, 1)));
    }
}
