//! Pops: the best tasks, optionally matching a filter, handed out exactly once.
//!
//! The heap answers first, from memory: unfiltered pops take its best tasks; a filter is planned
//! ([`crate::domain::filter::plan`]) and the heap walks the narrowest key-field index it allows (or
//! the whole heap in pop order), evaluating the filter on each candidate and stopping at the
//! limit. A filter that reads payload fields the heap does not hold has the payloads of its
//! candidates read a page at a time. Pending tasks all rank after the heap's (see
//! [`super::place`]), so the backlog is searched only for what the heap could not give, through
//! its key-field indexes in the table: a worker whose filter matches only pending tasks is served.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::backlog::Search;
use super::batch::BatchRows;
use super::command::PopRequest;
use super::state::QueueState;
use crate::domain::SchedulerId;
use crate::domain::filter::eval::{self, Json, Record, json_at};
use crate::domain::filter::plan::Plan;
use crate::domain::filter::plan::plan as plan_filter;
use crate::domain::filter::{Column, FilterNode};
use crate::domain::keys::{DEDUP_PATH, KeyField};
use crate::queue::heap::SchedulerHeap;
use crate::storage::StorageError;
use crate::storage::rows::{HeapRow, TaskRow};

/// Payloads read per round trip when a filter needs them.
const PAYLOAD_PAGE: usize = 256;

/// Siblings handed out with one boefje task of a de-duplication group at most (a group has one
/// task per organisation holding the object).
pub const GROUP_MAX: usize = 1_000;

/// What a pop reads from the table.
pub(crate) trait Reads {
    /// The best `limit` pending tasks matching `filter` (through `lookup` when given), skipping
    /// the ids in `skip`, whole (a cancel writes them).
    fn pending_matching(
        &mut self,
        lookup: Option<(KeyField, &[String])>,
        filter: &FilterNode,
        limit: usize,
        skip: &[String],
    ) -> Result<Vec<TaskRow>, StorageError>;

    /// The best pending tasks a pop may take for `search`, in pop order, as their queue rows
    /// hold them (see [`super::backlog`]).
    fn pending_to_pop(&mut self, search: &Search<'_>) -> Result<Vec<HeapRow>, StorageError>;

    /// The payloads (JSON text) of these tasks.
    fn payloads(&mut self, ids: &[Uuid]) -> Result<HashMap<Uuid, String>, StorageError>;

    /// Waits for a refill ahead under way, if any, and takes the tasks it moved into `st`'s
    /// heap; answers whether it took any. The backlog is searched only after it: the refill may
    /// be moving the very rows the search would find.
    fn settle_refill(&mut self, _st: &mut QueueState) -> Result<bool, StorageError> {
        Ok(false)
    }

    /// A pending task this batch takes (see [`super::read_ahead`]).
    fn taken(&mut self, _id: &str) {}

    /// Sets the pop aside instead of waiting for the refill under way, if the engine can: it
    /// is decided again, from the start, in the first batch after the refill has ended, and the
    /// engine goes on with everything else meanwhile. `false`: there is no refill to wait for,
    /// or the pop waits for it here ([`Reads::settle_refill`]).
    fn set_aside(&mut self) -> bool {
        false
    }
}

/// Decides one pop; answers the ids handed out, best first.
///
/// On the boefje scheduler an answer is one unit of work (mula's boefje pop): the best task
/// alone, or, when it has a de-duplication group, it and up to `limit - 1` other waiting tasks
/// with the same `data.deduplication_key` that match the pop's filter, right after it (mula
/// cuts the group at `limit` too). A runner in the runtime's `deduplicate` mode reads every task
/// after the first of an answer as a duplicate of the first: it runs the first and marks the
/// others done with its result, so an answer that mixed unrelated tasks in would have work
/// marked done that never ran. Each task is still handed out exactly once.
pub(crate) fn pop(
    st: &mut QueueState,
    rows: &mut BatchRows,
    reads: &mut dyn Reads,
    req: &PopRequest,
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, StorageError> {
    let every = FilterNode::And(Vec::new());
    let (filter, plan) = match &req.filter {
        Some((f, p)) => (f, Some(p)),
        None => (&every, None),
    };
    if st.scheduler != SchedulerId::Boefje {
        let chosen = pop_matching(st, rows, reads, filter, plan, req.limit, true, now)?;
        return Ok(chosen.into_iter().map(|(id, _)| id).collect());
    }
    let chosen = pop_matching(st, rows, reads, filter, plan, req.limit.min(1), true, now)?;
    let mut out = Vec::with_capacity(chosen.len());
    let mut groups_done: Vec<Arc<str>> = Vec::new();
    for (id, key) in chosen {
        out.push(id);
        let Some(key) = key else { continue };
        if groups_done.contains(&key) {
            continue;
        }
        groups_done.push(key.clone());
        // The same filter, narrowed to the group: planned, it looks the key up in the heap's
        // index and in the pending backlog's.
        let group = FilterNode::And(vec![
            filter.clone(),
            FilterNode::equals(Column::Data, DEDUP_PATH, &key),
        ]);
        let group_plan = plan_filter(&group, st.scheduler);
        // Siblings go with it up to the pop's `limit`, as in mula (its group query is cut at
        // `limit`), whose turn it is does not choose among them. The runners pop one task at a
        // time, and OpenKAT's boefje worker treats every task of an answer past the first as
        // a duplicate of it and saves the first's output for each through the boefje API,
        // which refuses a task that is not `running`: a group handed out whole at `limit=1`
        // left its siblings `dispatched`, unrun, until their lease ran out.
        let room = req.limit.saturating_sub(1).min(GROUP_MAX);
        if room == 0 {
            continue;
        }
        let siblings = pop_matching(st, rows, reads, &group, Some(&group_plan), room, false, now)?;
        out.extend(siblings.into_iter().map(|(id, _)| id));
    }
    Ok(out)
}

/// A task a pop took, with its de-duplication key.
type Taken = (Uuid, Option<Arc<str>>);

/// Takes up to `limit` tasks matching `filter` (planned as `plan`; `None`: unfiltered), best
/// first, heap before backlog, and marks them dispatched; answers each with its de-duplication
/// key. A `leader` pop is held to the scheduler's rules on whom to serve: automatic work in the
/// organisations' turn (see [`crate::queue::fair`]) and the dispatch limits (see
/// [`crate::domain::politeness`]: a held task is skipped, never dropped, and the next one that
/// may go is taken). A boefje group's siblings are no leader: they go with theirs, and run no
/// scan of their own. A filter that reads payload fields is served in the heap's order.
#[allow(clippy::too_many_arguments)]
fn pop_matching(
    st: &mut QueueState,
    rows: &mut BatchRows,
    reads: &mut dyn Reads,
    filter: &FilterNode,
    plan: Option<&Plan>,
    limit: usize,
    leader: bool,
    now: DateTime<Utc>,
) -> Result<Vec<Taken>, StorageError> {
    let polite = leader && st.throttle.is_active();
    let fair = leader && st.heap.fairness().is_on();
    let mut chosen: Vec<Taken> = Vec::new();
    let mut take = |st: &mut QueueState, id: Uuid| {
        let key = st.heap.key_of(&id, KeyField::DedupKey);
        if polite && let Some(k) = st.heap.key_values(&id) {
            st.throttle.dispatched(id, &k, now, true);
        }
        st.heap.take(&id);
        chosen.push((id, key));
    };
    // Unfiltered pops walk the whole heap when a held task must be skipped.
    let everything;
    let plan = match plan {
        None if polite => {
            everything = plan_filter(filter, st.scheduler);
            Some(&everything)
        }
        p => p,
    };
    match plan {
        None => {
            for _ in 0..limit {
                let next = if fair {
                    st.heap.next_fair()
                } else {
                    st.heap.best()
                };
                let Some(next) = next else { break };
                take(st, next.id);
            }
        }
        Some(p) if p.nothing => {}
        Some(p) if p.needs_payload => {
            let admitted = |id: &Uuid| admits(st, id, polite, now);
            let found = matching_with_payloads(&st.heap, filter, p, limit, reads, &admitted)?;
            for id in found {
                take(st, id);
            }
        }
        Some(p) if fair || polite => {
            for _ in 0..limit {
                let next = {
                    let admitted = |id: &Uuid| admits(st, id, polite, now);
                    if fair && !st.heap.user_waits() {
                        // No user scan is queued: whose turn it is decides, in one walk; the
                        // best match in priority order only past the turns' budget.
                        st.heap
                            .fair_match(filter, p, &admitted)
                            .or_else(|| st.heap.first_admitted(filter, p, &admitted))
                    } else {
                        st.heap
                            .first_admitted(filter, p, &admitted)
                            .map(|first| match fair {
                                true => st.heap.next_fair_matching(filter, p, first, &admitted),
                                false => first,
                            })
                    }
                };
                let Some(id) = next else { break };
                take(st, id);
            }
        }
        Some(p) => {
            for id in st.heap.matching(filter, p, limit) {
                take(st, id);
            }
        }
    }
    for (id, _) in &chosen {
        if dispatch(st, rows, *id, now)? {
            // Still pending in the table: a read ahead may hold it too.
            reads.taken(&id.to_string());
        }
    }
    let nothing = plan.as_ref().is_some_and(|p| p.nothing);
    // The pending count is a hint: rows changed behind the engine's back (by hand, a restore)
    // leave it low, and an empty answer sends a runner to sleep for its poll interval (10 s)
    // while matching work waits. So a pop about to answer empty searches the backlog even when
    // the count says there is none: one index probe, and finding something marks the count for
    // a recount (see `PendingSet::remove`). A count already marked is not to be trusted either.
    let look =
        st.pending.count() > 0 || st.pending.needs_recount() || (leader && chosen.is_empty());
    if chosen.len() < limit && look && !nothing {
        // A refill under way reads the best pending tasks, which this search would meet: the
        // pop waits for them to reach the heap. A pop that has taken nothing yet waits set
        // aside, not on the engine's thread: the pops the heap serves, all the other runners',
        // go on meanwhile (a refill of a thousand tasks takes a few milliseconds).
        if leader && chosen.is_empty() && reads.set_aside() {
            return Ok(chosen);
        }
        if reads.settle_refill(st)? {
            // The heap took the best of the backlog in: it answers first again.
            let more = pop_matching(
                st,
                rows,
                reads,
                filter,
                plan,
                limit - chosen.len(),
                leader,
                now,
            )?;
            chosen.extend(more);
            return Ok(chosen);
        }
        let want = limit - chosen.len();
        let lookup = plan
            .as_ref()
            .and_then(|p| p.narrowest())
            .map(|l| (l.field, l.values.as_slice()));
        let skip = rows.left_pending();
        // Pending tasks created in this batch are not in the table yet.
        let mut found: Vec<HeapRow> = rows
            .created_pending()
            .filter(|(_, r)| RowRecord::new(r).is_some_and(|rec| eval::matches(filter, &rec)))
            .map(|(_, r)| HeapRow::from(r))
            .collect();
        found.extend(reads.pending_to_pop(&Search {
            lookup,
            filter,
            needs_payload: plan.is_some_and(|p| p.needs_payload),
            limit: want,
            skip: &skip,
        })?);
        found.sort_by(|a, b| {
            (a.priority, a.created_at, &a.id).cmp(&(b.priority, b.created_at, &b.id))
        });
        found.dedup_by(|a, b| a.id == b.id);
        // The heap's tasks held as read are pending rows too, and rank first: not this search's
        // to take (those this batch took are skipped above).
        found.retain(|r| r.uuid().is_ok_and(|id| !st.copies.contains(&id)));
        let mut admitted = Vec::with_capacity(want);
        for row in found {
            if admitted.len() == want {
                break;
            }
            if polite {
                if !st.throttle.admits(&row.key_values(), now) {
                    continue;
                }
                // Counted at once: the next row of the same value may be held by this one.
                let id = row.uuid()?;
                st.throttle.dispatched(id, &row.key_values(), now, true);
            }
            admitted.push(row);
        }
        for row in admitted {
            let id = row.uuid()?;
            reads.taken(&row.id);
            rows.from_backlog += 1;
            st.pending.remove(row.hash.as_deref());
            let key = row.deduplication_key.as_deref().map(Arc::from);
            if rows.contains(&id) {
                // Created or read by this batch: written with the rest of its row.
                dispatch(st, rows, id, now)?;
            } else {
                // Read for this pop alone, perhaps from a read ahead: moved by id, and only if
                // the table still holds it pending, so a row changed since it was read is
                // skipped, never overwritten.
                rows.taken_pending.push(id);
            }
            chosen.push((id, key));
        }
    }
    Ok(chosen)
}

/// Marks a task dispatched: its row if the batch knows it, else by id (a heap task, from
/// `pending` if the heap held it as a refill read it). Answers whether it was so held.
fn dispatch(
    st: &mut QueueState,
    rows: &mut BatchRows,
    id: Uuid,
    now: DateTime<Utc>,
) -> Result<bool, StorageError> {
    match rows.get(&id).cloned() {
        Some(mut row) => {
            // Its row was read (pending, if the heap held it as a refill read it): written
            // from the row, so it is held no more.
            st.copies.taken(&id);
            row.status = row
                .status
                .dispatch()
                .map_err(|e| StorageError::Corrupt(format!("task {id}: {e}")))?;
            row.modified_at = now.naive_utc();
            row.lease_expires_at = st.lease(now, row.status);
            rows.update(id, row);
        }
        None if st.copies.taken(&id) => {
            rows.taken_copies.push(id);
            return Ok(true);
        }
        None => rows.dispatched.push(id),
    }
    Ok(false)
}

/// Whether the dispatch limits let a heap task go now (always, when the pop is not held to them).
fn admits(st: &QueueState, id: &Uuid, polite: bool, now: DateTime<Utc>) -> bool {
    !polite
        || st
            .heap
            .key_values(id)
            .is_none_or(|k| st.throttle.admits(&k, now))
}

/// The heap's candidates for `filter` that `admitted` lets go, in pop order, their payloads read
/// a page at a time.
fn matching_with_payloads(
    heap: &SchedulerHeap,
    filter: &FilterNode,
    plan: &Plan,
    limit: usize,
    reads: &mut dyn Reads,
    admitted: &dyn Fn(&Uuid) -> bool,
) -> Result<Vec<Uuid>, StorageError> {
    let mut out = Vec::new();
    let mut candidates = heap.candidates(plan);
    while out.len() < limit {
        let page: Vec<Uuid> = candidates.by_ref().take(PAYLOAD_PAGE).collect();
        if page.is_empty() {
            break;
        }
        let payloads = reads.payloads(&page)?;
        for id in page {
            let data: Value = payloads
                .get(&id)
                .and_then(|d| serde_json::from_str(d).ok())
                .unwrap_or(Value::Null);
            if heap
                .record(&id, Some(&data))
                .is_some_and(|r| eval::matches(filter, &r))
                && admitted(&id)
            {
                out.push(id);
                if out.len() == limit {
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// A row as the filter evaluator sees it.
pub(crate) struct RowRecord<'a> {
    row: &'a TaskRow,
    data: Value,
}

impl<'a> RowRecord<'a> {
    /// `None` if the payload is not JSON.
    pub fn new(row: &'a TaskRow) -> Option<Self> {
        Some(Self {
            row,
            data: serde_json::from_str(&row.data).ok()?,
        })
    }
}

impl Record for RowRecord<'_> {
    fn text(&self, column: Column) -> Option<Cow<'_, str>> {
        let r = self.row;
        match column {
            Column::Id => Some(Cow::Borrowed(&r.id)),
            Column::SchedulerId => Some(Cow::Borrowed(&r.scheduler_id)),
            Column::ScheduleId => r.schedule_id.as_deref().map(Cow::Borrowed),
            Column::Organisation => Some(Cow::Borrowed(&r.organisation)),
            Column::Type => Some(Cow::Borrowed(&r.task_type)),
            Column::Hash => r.hash.as_deref().map(Cow::Borrowed),
            Column::Status => Some(Cow::Borrowed(r.status.as_str())),
            _ => None,
        }
    }

    fn priority(&self) -> i64 {
        self.row.priority
    }

    fn time(&self, column: Column) -> Option<NaiveDateTime> {
        match column {
            Column::CreatedAt => Some(self.row.created_at),
            Column::ModifiedAt => Some(self.row.modified_at),
            _ => None,
        }
    }

    fn json(&self, path: &[String]) -> Json<'_> {
        json_at(&self.data, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::filter::parse_request;
    use crate::domain::{SchedulerId, TaskStatus};
    use crate::queue::engine::place::{Admission, place};
    use crate::queue::engine::testing::{FakeTable, now, row_with, state};
    use crate::queue::types::WhenFull;
    use serde_json::json;

    fn image_filter(image: &str) -> FilterNode {
        parse_request(&json!({"filters": [
            {"column": "data", "field": "boefje__oci_image", "operator": "in", "value": [image]}
        ]}))
        .unwrap()
    }

    /// A queued boefje row of `org` in de-duplication group `key`.
    fn sibling(priority: i64, created: i64, org: &str, key: &str) -> (Uuid, TaskRow) {
        let (id, mut r) = row_with(priority, created, "img");
        r.organisation = org.into();
        r.deduplication_key = Some(key.into());
        r.data = json!({"boefje": {"id": "b1", "oci_image": "img"}, "organization": org,
                        "deduplication_key": key})
        .to_string();
        (id, r)
    }

    #[test]
    fn a_boefje_pop_brings_the_group_along_queued_and_pending_but_only_what_matches() {
        let mut st = state(3, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let mut table = FakeTable::default();
        let key = Uuid::new_v4().to_string();
        let (other, r_other) = row_with(3, 1, "img");
        let (leader, r_leader) = sibling(5, 2, "org1", &key);
        let (s1, r_s1) = sibling(5, 3, "org2", &key);
        for (id, r) in [(other, &r_other), (leader, &r_leader), (s1, &r_s1)] {
            place(&mut st, &mut rows, id, r, Admission::New).unwrap();
        }
        // The heap is full: the third sibling waits in the backlog, and so does org4's.
        let (s2, mut r_s2) = sibling(5, 4, "org3", &key);
        r_s2.status = TaskStatus::Pending;
        let (s3, mut r_s3) = sibling(5, 5, "org4", &key);
        r_s3.status = TaskStatus::Pending;
        table.pending = vec![r_s2, r_s3];
        st.pending = crate::queue::engine::state::PendingSet::with(2, None);

        let one = PopRequest::new(SchedulerId::Boefje, 1, None);
        assert_eq!(
            pop(&mut st, &mut rows, &mut table, &one, now()).unwrap(),
            vec![other],
            "a task without a group comes alone"
        );
        // A runner of three organisations: the group, but not org4's sibling.
        let orgs = parse_request(&json!({"filters": [
            {"column": "organisation", "operator": "in", "value": ["org1", "org2", "org3"]}
        ]}))
        .unwrap();
        let req = PopRequest::new(SchedulerId::Boefje, 10, Some(orgs));
        let got = pop(&mut st, &mut rows, &mut table, &req, now()).unwrap();
        assert_eq!(got, vec![leader, s1, s2], "within the limit, best first");
        assert!(st.heap.is_empty());
        assert_eq!(
            rows.taken_pending,
            vec![s2],
            "moved by id, if still pending"
        );
        assert!(!got.contains(&s3));
    }

    /// The boefje runtime in `deduplicate` mode: the first task of an answer runs, every other
    /// is marked done with its result. Answers each answer's (task run, tasks marked done).
    fn runner_reading(answer: &[Uuid]) -> Option<(Uuid, Vec<Uuid>)> {
        let (first, rest) = answer.split_first()?;
        Some((*first, rest.to_vec()))
    }

    #[test]
    fn a_boefje_answer_is_one_task_or_the_group_up_to_the_limit() {
        for limit in [1, 10] {
            let mut st = state(10, WhenFull::Pending);
            let mut rows = BatchRows::default();
            let key = Uuid::new_v4().to_string();
            let (a, ra) = row_with(3, 1, "img");
            let (leader, r_leader) = sibling(4, 2, "org1", &key);
            let (s1, r_s1) = sibling(4, 3, "org2", &key);
            let (b, rb) = row_with(5, 4, "img");
            let (c, rc) = row_with(6, 5, "img");
            for (id, r) in [
                (a, &ra),
                (leader, &r_leader),
                (s1, &r_s1),
                (b, &rb),
                (c, &rc),
            ] {
                place(&mut st, &mut rows, id, r, Admission::New).unwrap();
            }
            let group_of = |id: &Uuid| -> Option<String> {
                [(leader, &key), (s1, &key)]
                    .iter()
                    .find(|(i, _)| i == id)
                    .map(|(_, k)| (*k).clone())
            };
            let req = PopRequest::new(SchedulerId::Boefje, limit, None);
            let mut answers = Vec::new();
            loop {
                let got = pop(&mut st, &mut rows, &mut FakeTable::default(), &req, now()).unwrap();
                if got.is_empty() {
                    break;
                }
                answers.push(got);
            }
            let group = match limit {
                1 => vec![vec![leader], vec![s1]],
                _ => vec![vec![leader, s1]],
            };
            let expected: Vec<Vec<Uuid>> = [vec![vec![a]], group, vec![vec![b], vec![c]]].concat();
            assert_eq!(
                answers, expected,
                "limit {limit}: best first, a group up to the limit, nothing mixed in"
            );
            for answer in &answers {
                let (run, marked_done) = runner_reading(answer).unwrap();
                for done in marked_done {
                    assert!(
                        group_of(&done).is_some() && group_of(&done) == group_of(&run),
                        "limit {limit}: {done} would be marked done by {run}'s run"
                    );
                }
            }
        }
    }

    #[test]
    fn other_schedulers_have_no_groups() {
        let mut st = QueueState::new(
            SchedulerId::Normalizer,
            crate::queue::engine::testing::limits(10, WhenFull::Pending),
        );
        let mut rows = BatchRows::default();
        let key = Uuid::new_v4().to_string();
        let (a, ra) = sibling(5, 1, "org1", &key);
        let (b, rb) = sibling(5, 2, "org2", &key);
        for (id, r) in [(a, &ra), (b, &rb)] {
            place(&mut st, &mut rows, id, r, Admission::New).unwrap();
        }
        let req = PopRequest::new(SchedulerId::Normalizer, 1, None);
        let got = pop(&mut st, &mut rows, &mut FakeTable::default(), &req, now()).unwrap();
        assert_eq!(got, vec![a]);
    }

    #[test]
    fn a_filtered_pop_takes_the_best_match_from_the_heap_and_reads_nothing() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let mut table = FakeTable::default();
        let (a, ra) = row_with(5, 1, "img1");
        let (b, rb) = row_with(3, 2, "img2");
        let (c, rc) = row_with(4, 3, "img1");
        for (id, r) in [(a, &ra), (b, &rb), (c, &rc)] {
            place(&mut st, &mut rows, id, r, Admission::New).unwrap();
        }
        let req = PopRequest::new(SchedulerId::Boefje, 1, Some(image_filter("img1")));
        let got = pop(&mut st, &mut rows, &mut table, &req, now()).unwrap();
        assert_eq!(got, vec![c]);
        assert_eq!(rows.dispatched, vec![c]);
        assert!(!st.heap.contains(&c));
        assert_eq!(table.reads, 0);
    }

    #[test]
    fn a_task_held_as_a_refill_read_it_whose_row_the_batch_read_is_written_from_its_row() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let mut table = FakeTable::default();
        let (a, mut ra) = row_with(5, 1, "img1");
        place(&mut st, &mut rows, a, &ra, Admission::New).unwrap();
        // A refill read it (the heap holds it, its row is still pending), and this batch read
        // its row (the same work came back and stayed out).
        st.copies.read([a], None);
        ra.status = TaskStatus::Pending;
        rows.load(vec![ra], "boefje");
        let req = PopRequest::new(SchedulerId::Boefje, 1, None);
        assert_eq!(
            pop(&mut st, &mut rows, &mut table, &req, now()).unwrap(),
            vec![a]
        );
        assert_eq!(rows.get(&a).unwrap().status, TaskStatus::Dispatched);
        assert!(rows.taken_copies.is_empty() && rows.dispatched.is_empty());
        assert!(!st.copies.contains(&a), "held no more");
    }

    #[test]
    fn a_worker_whose_filter_matches_only_pending_tasks_is_served() {
        let mut st = state(1, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (a, ra) = row_with(1, 1, "common");
        place(&mut st, &mut rows, a, &ra, Admission::New).unwrap();
        let (r, mut rr) = row_with(9, 2, "rare");
        rr.status = TaskStatus::Pending;
        st.pending.add(rr.hash.as_deref());
        let mut table = FakeTable {
            pending: vec![rr.clone()],
            ..Default::default()
        };
        let req = PopRequest::new(SchedulerId::Boefje, 1, Some(image_filter("rare")));
        let got = pop(&mut st, &mut rows, &mut table, &req, now()).unwrap();
        assert_eq!(got, vec![r]);
        assert_eq!(rows.taken_pending, vec![r], "moved by id, if still pending");
        assert!(
            rows.get(&r).is_none(),
            "read for the pop alone, not written whole"
        );
        assert_eq!(st.pending.count(), 0);
        assert!(st.heap.contains(&a), "the heap's task stays");
    }

    /// A heap of 4 holding one task of image `common` (priority 1), and pending rows of these
    /// priorities and images, which the state counts.
    fn common_queued_and_pending(
        pending: &[(i64, &str)],
    ) -> (QueueState, BatchRows, Uuid, Vec<TaskRow>) {
        let mut st = state(4, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (a, ra) = row_with(1, 1, "common");
        place(&mut st, &mut rows, a, &ra, Admission::New).unwrap();
        let mut out = Vec::new();
        for &(p, image) in pending {
            let (_, mut r) = row_with(p, p, image);
            r.status = TaskStatus::Pending;
            st.pending.add(r.hash.as_deref());
            out.push(r);
        }
        (st, rows, a, out)
    }

    #[test]
    fn a_pop_whose_match_a_refill_under_way_does_not_read_waits_for_it_all_the_same() {
        let (mut st, mut rows, _, pending) =
            common_queued_and_pending(&[(5, "common"), (6, "common"), (7, "rare")]);
        // The refill under way reads the two best pending rows, neither of them rare: the rows
        // it reads are known only once it has ended, so the pop cannot tell and waits.
        let moved: Vec<String> = pending[..2].iter().map(|r| r.id.clone()).collect();
        let mut table = FakeTable {
            pending: pending.clone(),
            refilling: Some(moved),
            ..Default::default()
        };
        let rare = PopRequest::new(SchedulerId::Boefje, 1, Some(image_filter("rare")));
        let got = pop(&mut st, &mut rows, &mut table, &rare, now()).unwrap();
        assert_eq!(table.waited, 1, "it waited for the refill");
        assert_eq!(
            got,
            vec![pending[2].uuid().unwrap()],
            "then found its match pending, after the rows the refill took in"
        );
        assert_eq!(table.reads, 1);
    }

    #[test]
    fn a_pop_whose_match_a_refill_under_way_moves_waits_for_it_and_takes_it_from_the_heap() {
        let (mut st, mut rows, a, pending) =
            common_queued_and_pending(&[(5, "rare"), (6, "common"), (7, "rare")]);
        // The refill under way moves the two best pending rows, one of them the rare one.
        let moved: Vec<String> = pending[..2].iter().map(|r| r.id.clone()).collect();
        let mut table = FakeTable {
            pending: pending.clone(),
            refilling: Some(moved),
            ..Default::default()
        };
        let common = PopRequest::new(SchedulerId::Boefje, 1, Some(image_filter("common")));
        assert_eq!(
            pop(&mut st, &mut rows, &mut table, &common, now()).unwrap(),
            vec![a],
            "a match in the heap goes without waiting for the refill"
        );
        assert!(table.refilling.is_some(), "the refill is still under way");
        let rare = PopRequest::new(SchedulerId::Boefje, 1, Some(image_filter("rare")));
        let got = pop(&mut st, &mut rows, &mut table, &rare, now()).unwrap();
        let best_rare = pending[0].uuid().unwrap();
        assert_eq!(
            got,
            vec![best_rare],
            "the best rare task, which the refill moved"
        );
        assert!(table.refilling.is_none(), "the pop waited for the refill");
        assert_eq!(
            table.reads, 0,
            "found in the heap: the backlog was not searched"
        );
        assert_eq!(
            rows.dispatched,
            vec![a, best_rare],
            "both dispatched from the heap"
        );
        assert!(st.heap.contains(&pending[1].uuid().unwrap()));
        assert_eq!(st.pending.count(), 1, "one rare task still pending");
        // The next rare pop finds the last one in the backlog.
        let got = pop(&mut st, &mut rows, &mut table, &rare, now()).unwrap();
        assert_eq!(got, vec![pending[2].uuid().unwrap()]);
        assert_eq!(table.reads, 1);
    }

    #[test]
    fn a_pop_finds_pending_work_the_count_does_not_know_of_and_marks_the_count() {
        let mut st = state(1, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (a, ra) = row_with(1, 1, "common");
        place(&mut st, &mut rows, a, &ra, Admission::New).unwrap();
        // Written behind the engine's back: the count says nothing is pending.
        let (r, mut rr) = row_with(9, 2, "rare");
        rr.status = TaskStatus::Pending;
        let mut table = FakeTable {
            pending: vec![rr.clone()],
            ..Default::default()
        };
        assert_eq!(st.pending.count(), 0);
        let req = PopRequest::new(SchedulerId::Boefje, 1, Some(image_filter("rare")));
        let got = pop(&mut st, &mut rows, &mut table, &req, now()).unwrap();
        assert_eq!(got, vec![r], "no empty answer while the task waits");
        assert!(st.pending.needs_recount());
        // A pop the heap serves reads nothing.
        let reads = table.reads;
        let common = PopRequest::new(SchedulerId::Boefje, 1, Some(image_filter("common")));
        assert_eq!(
            pop(&mut st, &mut rows, &mut table, &common, now()).unwrap(),
            vec![a]
        );
        assert_eq!(table.reads, reads);
    }

    #[test]
    fn a_filter_on_other_payload_fields_reads_payloads_in_pop_order() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let mut table = FakeTable::default();
        let mut ids = Vec::new();
        for (i, depth) in [3, 9, 7].into_iter().enumerate() {
            let (id, mut r) = row_with(i as i64 + 2, i as i64, "img");
            r.data = json!({"depth": depth}).to_string();
            table.payloads.insert(id, r.data.clone());
            place(&mut st, &mut rows, id, &r, Admission::New).unwrap();
            ids.push(id);
        }
        let f = parse_request(&json!({"filters": [{"column": "data", "field": "depth", "operator": ">", "value": 5}]})).unwrap();
        // A boefje answer is one task: two pops take the two matches, best first.
        let req = PopRequest::new(SchedulerId::Boefje, 5, Some(f));
        let mut got = pop(&mut st, &mut rows, &mut table, &req, now()).unwrap();
        got.extend(pop(&mut st, &mut rows, &mut table, &req, now()).unwrap());
        assert_eq!(got, vec![ids[1], ids[2]]);
        assert!(
            pop(&mut st, &mut rows, &mut table, &req, now())
                .unwrap()
                .is_empty()
        );
        assert_eq!(st.heap.len(), 1);
    }
}
