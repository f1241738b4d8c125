//! Pending tasks read ahead for the filters that pops search the backlog with.
//!
//! A runner whose filter the heap cannot serve (its organisation's or image's tasks have all been
//! popped from the heap, while the refill brings in the best of every kind) is served from the
//! pending backlog: one index read for each such pop, on the engine's thread, which every other
//! command of the engine waits for. With sixteen runners popping sixteen organisations out of
//! fifty, a batch of pops was a run of sixteen reads, and those pops went at half the speed of
//! the same pops with room in the heap (`cargo bench --bench broker -- --pending --clients 16`).
//!
//! So a read for a key-field lookup (an organisation, images, plugin ids) takes
//! [`READ_AHEAD`] more rows than the pop needs, and the next pops with the same filter are served
//! from them. That is right only while nothing but pops and refills changes pending rows:
//! a batch that may (the rule a refill under way applies, `Engine::beside_refill`: a push, an
//! expiry, a cancel, a re-score, an explicit refill, a pop whose caller had gone, a patch of a
//! task not in flight or back to `queued`), a rebuild, a failed batch and a recount forget every
//! read ahead first ([`ReadAhead::forget`]); a pending task a pop takes, or a refill moves into
//! the heap, is dropped from every read it is in ([`ReadAhead::taken`], [`ReadAhead::moved`]). A read
//! held this way still holds the best pending tasks matching its filter, best first: no pending
//! row was added or changed since it was read, and a refill moves the best pending tasks, so
//! what it leaves of a read ranks after what it moved. A refill under way reads pending rows a
//! pop's search would meet: a pop whose match the heap lacks waits for it (set aside) before it
//! searches, so no read is served beside one.
//!
//! Two limits keep what a read cannot know from costing a runner its work. A read holding fewer
//! rows than a pop asks for is not served: the table is read, so an answer is empty only when
//! the table says so (rows put back by hand are found, as [`super::pop`] promises). And a read is
//! served for [`READ_AHEAD_MAX_AGE`] at most: a pending row changed outside the scheduler (by
//! hand, in SQL) is not seen by a read held before. A pop's write of such a row takes it only
//! while the table still holds it pending (`storage::tasks::fenced`), so the change is never
//! overwritten; the pop answers without it.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::domain::filter::FilterNode;
use crate::domain::keys::KeyField;
use crate::storage::rows::HeapRow;

/// Pending rows read beyond what a pop asks for, per filter.
pub(crate) const READ_AHEAD: usize = 64;

/// How long a read is served: under load a refill drops what it moves from the reads every few
/// hundred pops; when pops are rare, a read this old is read again.
pub(crate) const READ_AHEAD_MAX_AGE: Duration = Duration::from_millis(500);

/// Filters whose reads are kept at most: the oldest goes first (each runner pops with one filter,
/// and a fleet has a few dozen).
const FILTERS_MAX: usize = 64;

/// One filter's read: the best pending rows that matched it, best first, less those taken since.
struct Read {
    lookup: (KeyField, Vec<String>),
    filter: FilterNode,
    rows: VecDeque<HeapRow>,
    /// When it was read.
    at: Instant,
}

impl Read {
    fn is_for(&self, lookup: (KeyField, &[String]), filter: &FilterNode) -> bool {
        self.lookup.0 == lookup.0 && self.lookup.1.as_slice() == lookup.1 && &self.filter == filter
    }
}

/// The reads ahead of one engine.
#[derive(Default)]
pub(crate) struct ReadAhead {
    reads: VecDeque<Read>,
}

impl ReadAhead {
    /// The best `limit` rows of a read ahead for this lookup and filter, less those in `skip`
    /// (rows the batch has already taken from the backlog), if the read holds that many and is
    /// younger than [`READ_AHEAD_MAX_AGE`] at `now`; `None`: the table must be read.
    pub fn serve(
        &self,
        lookup: (KeyField, &[String]),
        filter: &FilterNode,
        limit: usize,
        skip: &[String],
        now: Instant,
    ) -> Option<Vec<HeapRow>> {
        let read = self.reads.iter().find(|r| r.is_for(lookup, filter))?;
        if now.saturating_duration_since(read.at) >= READ_AHEAD_MAX_AGE {
            return None;
        }
        let rows: Vec<HeapRow> = read
            .rows
            .iter()
            .filter(|r| !skip.contains(&r.id))
            .take(limit)
            .cloned()
            .collect();
        (rows.len() == limit).then_some(rows)
    }

    /// How many rows to read for a pop that wants `limit`.
    pub fn wanted(limit: usize) -> usize {
        limit.saturating_add(READ_AHEAD)
    }

    /// Keeps what a read for `limit` rows (at [`ReadAhead::wanted`]) found at `now`, best first,
    /// beside `skip` (the rows it left out); answers the best `limit` of them.
    pub fn keep(
        &mut self,
        lookup: (KeyField, &[String]),
        filter: &FilterNode,
        limit: usize,
        skip: &[String],
        mut found: Vec<HeapRow>,
        now: Instant,
    ) -> Vec<HeapRow> {
        found.sort_by(|a, b| {
            (a.priority, a.created_at, &a.id).cmp(&(b.priority, b.created_at, &b.id))
        });
        found.dedup_by(|a, b| a.id == b.id);
        // Rows this batch has taken already are pending in the table until it commits: kept, a
        // later batch would hand them out again (the heap's tasks held as read, which every
        // search of their key meets first, most of all).
        found.retain(|r| !skip.contains(&r.id));
        // A read of several values reads each value's range up to the same limit (the skipped
        // rows beside): only the best `wanted` of them are surely the best overall.
        found.truncate(Self::wanted(limit));
        let answer: Vec<HeapRow> = found.iter().take(limit).cloned().collect();
        self.reads.retain(|r| !r.is_for(lookup, filter));
        if self.reads.len() == FILTERS_MAX {
            self.reads.pop_front();
        }
        self.reads.push_back(Read {
            lookup: (lookup.0, lookup.1.to_vec()),
            filter: filter.clone(),
            rows: found.into(),
            at: now,
        });
        answer
    }

    /// A pending task was taken by a pop: no read ahead may hand it out again.
    pub fn taken(&mut self, id: &str) {
        for read in &mut self.reads {
            read.rows.retain(|r| r.id != id);
        }
    }

    /// A refill moved these tasks into the heap: no read ahead may hand them out. One pass over
    /// what the reads hold, whatever the refill's size (up to 10,000 tasks).
    pub fn moved<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>) {
        if self.reads.is_empty() {
            return;
        }
        let ids: HashSet<&str> = ids.into_iter().collect();
        for read in &mut self.reads {
            read.rows.retain(|r| !ids.contains(r.id.as_str()));
        }
    }

    /// Forgets every read: pending rows may change other than by a pop's taking them.
    pub fn forget(&mut self) {
        self.reads.clear();
    }

    /// Rows held, over every filter (for tests).
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.reads.iter().map(|r| r.rows.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::filter::parse_request;
    use crate::queue::engine::testing::row_with;
    use serde_json::json;

    fn org_filter(org: &str) -> FilterNode {
        parse_request(
            &json!({"filters": [{"column": "organisation", "operator": "==", "value": org}]}),
        )
        .unwrap()
    }

    fn rows(n: usize) -> Vec<HeapRow> {
        (0..n)
            .map(|i| HeapRow::from(&row_with(i as i64 + 1, 0, "img").1))
            .collect()
    }

    /// One instant for every read and serve of a test, so none is too old.
    fn t0() -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now)
    }

    fn lookup(values: &[String]) -> (KeyField, &[String]) {
        (KeyField::Organisation, values)
    }

    #[test]
    fn serves_the_next_best_rows_of_the_same_filter_until_it_runs_short() {
        let mut ahead = ReadAhead::default();
        let org = vec!["org1".to_string()];
        let f = org_filter("org1");
        let all = rows(READ_AHEAD + 1);
        let first = ahead.keep(lookup(&org), &f, 1, &[], all.clone(), t0());
        assert_eq!(first[0].id, all[0].id);
        ahead.taken(&all[0].id);
        // The read took the pop's row and READ_AHEAD more; the next pops are served from it.
        for row in all.iter().skip(1).take(READ_AHEAD) {
            let next = ahead.serve(lookup(&org), &f, 1, &[], t0()).unwrap();
            assert_eq!(next[0].id, row.id);
            ahead.taken(&row.id);
        }
        // Read to its end: the table is read again.
        assert!(ahead.serve(lookup(&org), &f, 1, &[], t0()).is_none());
    }

    #[test]
    fn a_read_short_of_the_pop_or_too_old_is_not_served() {
        let mut ahead = ReadAhead::default();
        let org = vec!["org1".to_string()];
        let f = org_filter("org1");
        let all = rows(3);
        ahead.keep(lookup(&org), &f, 1, &[], all.clone(), t0());
        assert_eq!(
            ahead.serve(lookup(&org), &f, 2, &[], t0()).map(|r| r.len()),
            Some(2)
        );
        // Three held, five asked: the table says whether there are more (rows put back by
        // hand), so an answer is never short from a read alone.
        assert!(ahead.serve(lookup(&org), &f, 5, &[], t0()).is_none());
        for r in &all {
            ahead.taken(&r.id);
        }
        assert!(ahead.serve(lookup(&org), &f, 1, &[], t0()).is_none());
        let full = rows(READ_AHEAD + 1);
        ahead.keep(lookup(&org), &f, 1, &[], full, t0());
        assert!(ahead.serve(lookup(&org), &f, 1, &[], t0()).is_some());
        let later = t0() + READ_AHEAD_MAX_AGE;
        assert!(ahead.serve(lookup(&org), &f, 1, &[], later).is_none());
    }

    #[test]
    fn another_filter_or_a_skipped_row_is_not_served_from_the_read() {
        let mut ahead = ReadAhead::default();
        let org = vec!["org1".to_string()];
        let all = rows(READ_AHEAD + 2);
        ahead.keep(lookup(&org), &org_filter("org1"), 1, &[], all.clone(), t0());
        assert!(
            ahead
                .serve(lookup(&org), &org_filter("org2"), 1, &[], t0())
                .is_none()
        );
        let other = vec!["org2".to_string()];
        assert!(
            ahead
                .serve(lookup(&other), &org_filter("org1"), 1, &[], t0())
                .is_none()
        );
        let served = ahead
            .serve(
                lookup(&org),
                &org_filter("org1"),
                1,
                &[all[0].id.clone()],
                t0(),
            )
            .unwrap();
        assert_eq!(served[0].id, all[1].id);
    }

    #[test]
    fn rows_the_batch_took_already_are_not_kept_for_later_batches() {
        let mut ahead = ReadAhead::default();
        let org = vec!["org1".to_string()];
        let f = org_filter("org1");
        // A pop earlier in the batch took the best row (its write is not committed: the search
        // still met it); the read skips it for this pop and keeps it for none after.
        let all = rows(READ_AHEAD + 2);
        let taken = vec![all[0].id.clone()];
        let first = ahead.keep(lookup(&org), &f, 1, &taken, all.clone(), t0());
        assert_eq!(first[0].id, all[1].id);
        ahead.taken(&all[1].id);
        let next = ahead.serve(lookup(&org), &f, 1, &[], t0()).unwrap();
        assert_eq!(
            next[0].id, all[2].id,
            "the row taken before is never served"
        );
        assert_eq!(
            ahead.held(),
            READ_AHEAD,
            "the best `wanted` beside the skipped row"
        );
    }

    #[test]
    fn a_read_of_several_ranges_keeps_only_what_is_surely_the_best_and_forgets_on_request() {
        let mut ahead = ReadAhead::default();
        let org = vec!["org1".to_string()];
        let f = org_filter("org1");
        // Two ranges of READ_AHEAD + 1 rows each, interleaved in rank: only the best
        // READ_AHEAD + 1 of the union are kept, best first.
        let mut found = rows(2 * (READ_AHEAD + 1));
        found.reverse();
        let best: Vec<String> = {
            let mut sorted = found.clone();
            sorted.sort_by_key(|r| r.priority);
            sorted
                .iter()
                .take(READ_AHEAD + 1)
                .map(|r| r.id.clone())
                .collect()
        };
        ahead.keep(lookup(&org), &f, 1, &[], found, t0());
        assert_eq!(ahead.held(), READ_AHEAD + 1);
        let served = ahead
            .serve(lookup(&org), &f, READ_AHEAD + 1, &[], t0())
            .unwrap();
        assert_eq!(
            served.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
            best
        );
        ahead.forget();
        assert!(ahead.serve(lookup(&org), &f, 1, &[], t0()).is_none());
    }

    #[test]
    fn a_row_a_refill_took_into_the_heap_is_served_no_more() {
        let mut ahead = ReadAhead::default();
        let org = vec!["org1".to_string()];
        let f = org_filter("org1");
        let all = rows(READ_AHEAD + 2);
        ahead.keep(lookup(&org), &f, 1, &[], all.clone(), t0());
        ahead.moved([all[0].id.as_str()]);
        let served = ahead.serve(lookup(&org), &f, 1, &[], t0()).unwrap();
        assert_eq!(served[0].id, all[1].id, "the heap holds the best one now");
    }
}
