//! The rows one batch reads and changes, and the writes that follow from them.
//!
//! The rules never write to the database: they change the in-memory state and record here what
//! became of each row. Rows the batch read are changed in place, so a later command in the same
//! batch sees an earlier one; heap tasks popped or evicted without their row having been read are
//! listed for a conditional update by id. [`BatchRows::writes`] turns it all into statements.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::state::TasksByHash;
use crate::domain::TaskStatus;
use crate::metrics::{ByStatus, status_slot};
use crate::storage::rows::TaskRow;
use crate::storage::schedules::{self, ScheduleRow};
#[cfg(doc)]
use crate::storage::tasks;

/// Rows a batch must read before the commands that may meet them can be decided (pushes, work
/// coming back to wait).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Reads {
    /// Tasks by id.
    pub ids: Vec<String>,
    /// Waiting tasks by hash.
    pub hashes: Vec<String>,
}

/// Rows read or created in this batch, by task id.
#[derive(Default)]
pub(crate) struct BatchRows {
    rows: HashMap<Uuid, TaskRow>,
    /// Created in this batch, in creation order: inserted.
    created: Vec<Uuid>,
    /// Read and then changed: updated.
    changed: HashSet<Uuid>,
    /// Waiting tasks of this scheduler by hash, as this batch knows them (every one of a hash).
    waiting_by_hash: TasksByHash<String>,
    /// Heap tasks this batch evicted without their rows, by hash, with their priorities: they
    /// still wait, so a later push of the same work in the batch meets them.
    evicted_by_hash: HashMap<String, (Uuid, i64)>,
    /// Heap tasks popped whose rows were not read: moved `queued → dispatched` by id.
    pub dispatched: Vec<Uuid>,
    /// Pending tasks popped straight from the backlog, read for the pop alone: moved `pending →
    /// dispatched` by id, each only if the table still holds it pending (a read ahead may be
    /// up to half a second old), their queue rows deleted.
    pub taken_pending: Vec<Uuid>,
    /// Heap tasks popped that the heap held as a refill read them ([`QueueState::copies`](super::state::QueueState::copies)): moved
    /// `pending → dispatched` by id, as `taken_pending` are.
    pub taken_copies: Vec<Uuid>,
    /// Tasks this batch's pops took from the pending backlog rather than the heap (those in
    /// `taken_pending` and pending rows the batch had read or created), for
    /// `scheduler_engine_backlog_pops_total`.
    pub from_backlog: usize,
    /// Heap tasks evicted whose rows were not read: moved `queued → pending` by id.
    pub evicted: Vec<Uuid>,
    /// Heap tasks cancelled whose rows were not read: moved `queued → cancelled` by id.
    pub cancelled: Vec<Uuid>,
    /// Waiting tasks whose rows were not read given a new priority: `(id, status it must still
    /// have, priority)`.
    pub reprioritised: Vec<(Uuid, TaskStatus, i64)>,
    /// Re-scored tasks' new explanations (JSON), written with their priorities.
    pub explained: Vec<(Uuid, String)>,
    /// Created tasks' explanations (JSON), inserted with them.
    pub scores: Vec<(Uuid, String)>,
    /// Created tasks' schedules (mula's `post_push`): each written unless its hash has one,
    /// before the tasks, in their transaction.
    pub links: Vec<(Uuid, ScheduleRow)>,
}

/// The statements a batch makes, in order.
#[derive(Default)]
pub(crate) struct Writes {
    pub inserts: Vec<TaskRow>,
    pub updates: Vec<TaskRow>,
    pub evicted: Vec<String>,
    pub cancelled: Vec<String>,
    pub dispatched: Vec<String>,
    /// Pending tasks popped from the backlog (see [`BatchRows::taken_pending`]).
    pub taken_pending: Vec<String>,
    /// `(id, expected status, priority)`.
    pub reprioritised: Vec<(String, TaskStatus, i64)>,
    /// `(id, explanation)` for `task_scores`.
    pub explained: Vec<(String, String)>,
    /// `(id, explanation)` of created tasks, inserted into `task_scores`.
    pub scores: Vec<(String, String)>,
    /// Created tasks' schedules, written first (see [`BatchRows::links`]).
    pub links: Vec<(Uuid, ScheduleRow)>,
}

impl Writes {
    /// How many statements these writes take (with the chunk sizes of inserts and updates;
    /// `scores_with_rows`: the created tasks' explanations and schedules go in the statements of
    /// their rows).
    pub fn statements(
        &self,
        insert_chunk: usize,
        update_chunk: usize,
        scores_with_rows: bool,
    ) -> usize {
        let scores = if scores_with_rows && !self.inserts.is_empty() {
            0
        } else {
            self.scores.len().div_ceil(insert_chunk.max(1))
        };
        let links = match scores_with_rows {
            true => 0,
            false => schedules::ensure_statements(self.links.len()),
        };
        links
            + self.inserts.len().div_ceil(insert_chunk.max(1))
            + self.updates.len().div_ceil(update_chunk.max(1))
            + usize::from(!self.evicted.is_empty())
            + usize::from(!self.cancelled.is_empty())
            + usize::from(!self.dispatched.is_empty())
            + usize::from(!self.taken_pending.is_empty())
            + self.reprioritised.len().div_ceil(update_chunk.max(1))
            + self.explained.len().div_ceil(update_chunk.max(1))
            + scores
    }

    /// Whether these writes are only changed rows and heap tasks dispatched: the common batch
    /// of pops and patches, which one statement can write ([`tasks::fenced`]).
    pub fn only_changes_and_dispatches(&self) -> bool {
        self.inserts.is_empty()
            && self.evicted.is_empty()
            && self.cancelled.is_empty()
            && self.reprioritised.is_empty()
            && self.explained.is_empty()
            && self.scores.is_empty()
            && self.links.is_empty()
    }

    /// Queue rows these writes insert, change or delete: tasks written as pending (pushes into a
    /// full heap, evictions, changed pending tasks) and pending tasks popped straight from the
    /// backlog. What a refill deletes is counted once it ran.
    pub fn pending_rows(&self) -> u64 {
        let written = self
            .inserts
            .iter()
            .chain(&self.updates)
            .filter(|r| r.status == TaskStatus::Pending)
            .count();
        (written + self.evicted.len() + self.taken_pending.len()) as u64
    }

    /// Task rows these writes put in each status (a refill's are counted once it ran).
    pub fn transitions(&self) -> ByStatus {
        let mut out = ByStatus::default();
        for r in self.inserts.iter().chain(&self.updates) {
            out[status_slot(r.status)] += 1;
        }
        out[status_slot(TaskStatus::Pending)] += self.evicted.len() as u64;
        out[status_slot(TaskStatus::Cancelled)] += self.cancelled.len() as u64;
        out[status_slot(TaskStatus::Dispatched)] +=
            (self.dispatched.len() + self.taken_pending.len()) as u64;
        out
    }
}

impl BatchRows {
    /// Takes in rows read from the table (a row already known keeps its batch state).
    pub fn load(&mut self, rows: Vec<TaskRow>, scheduler: &str) {
        for row in rows {
            let Ok(id) = row.uuid() else { continue };
            if self.rows.contains_key(&id) {
                continue;
            }
            if row.status.is_waiting()
                && row.scheduler_id == scheduler
                && let Some(hash) = &row.hash
            {
                self.waiting_by_hash.add(hash.clone(), id);
            }
            self.rows.insert(id, row);
        }
    }

    /// A row of this batch.
    pub fn get(&self, id: &Uuid) -> Option<&TaskRow> {
        self.rows.get(id)
    }

    /// Whether the batch knows this row.
    pub fn contains(&self, id: &Uuid) -> bool {
        self.rows.contains_key(id)
    }

    /// A task created in this batch.
    pub fn create(&mut self, id: Uuid, row: TaskRow) {
        if row.status.is_waiting()
            && let Some(hash) = &row.hash
        {
            self.waiting_by_hash.add(hash.clone(), id);
        }
        self.created.push(id);
        self.rows.insert(id, row);
    }

    /// Records a changed row.
    pub fn update(&mut self, id: Uuid, row: TaskRow) {
        if let Some(hash) = &row.hash {
            if row.status.is_waiting() {
                self.waiting_by_hash.add(hash.clone(), id);
            } else {
                self.waiting_by_hash.remove(hash.as_str(), id);
            }
        }
        if !self.created.contains(&id) {
            self.changed.insert(id);
        }
        self.rows.insert(id, row);
    }

    /// Names the schedule a created task's link found (the one its hash had already).
    pub fn relink(&mut self, id: &Uuid, schedule: Option<String>) {
        if let Some(row) = self.rows.get_mut(id) {
            row.schedule_id = schedule;
        }
    }

    /// A waiting task with this hash, if the batch knows one (read, created or evicted).
    pub fn waiting_with_hash(&self, hash: &str) -> Option<Uuid> {
        self.waiting_by_hash
            .first(hash)
            .or_else(|| self.evicted_by_hash.get(hash).map(|(id, _)| *id))
    }

    /// A waiting task with this hash other than `id`, if the batch knows one, and whether its
    /// row was read (a task evicted in this batch without its row was not).
    pub fn waiting_besides(&self, hash: &str, id: Uuid) -> Option<(Uuid, bool)> {
        self.waiting_by_hash
            .all(hash)
            .iter()
            .find(|w| **w != id)
            .map(|w| (*w, true))
            .or_else(|| {
                self.evicted_by_hash
                    .get(hash)
                    .filter(|(w, _)| *w != id)
                    .map(|(w, _)| (*w, false))
            })
    }

    /// Records a heap task evicted without its row read: it waits on, as pending.
    pub fn evicted_unread(&mut self, id: Uuid, hash: Option<String>, priority: i64) {
        if let Some(hash) = hash {
            self.evicted_by_hash.insert(hash, (id, priority));
        }
    }

    /// The priority of a task this batch evicted without its row.
    pub fn evicted_priority(&self, id: &Uuid) -> Option<i64> {
        self.evicted_by_hash
            .values()
            .find(|(e, _)| e == id)
            .map(|(_, p)| *p)
    }

    /// Pending tasks created in this batch (not yet in the table).
    pub fn created_pending(&self) -> impl Iterator<Item = (&Uuid, &TaskRow)> {
        self.created.iter().filter_map(|id| {
            self.rows
                .get(id)
                .filter(|r| r.status == TaskStatus::Pending)
                .map(|r| (id, r))
        })
    }

    /// Rows the batch read that are no longer pending but may still be in the table as pending:
    /// a search of the pending backlog must skip them.
    pub fn left_pending(&self) -> Vec<String> {
        self.changed
            .iter()
            .filter_map(|id| self.rows.get(id))
            .filter(|r| r.status != TaskStatus::Pending)
            .map(|r| r.id.clone())
            .chain(self.taken_pending.iter().map(Uuid::to_string))
            .chain(self.taken_copies.iter().map(Uuid::to_string))
            .collect()
    }

    /// The statements, and the rows as they will be once written.
    pub fn writes(&self) -> Writes {
        Writes {
            inserts: self
                .created
                .iter()
                .filter_map(|id| self.rows.get(id).cloned())
                .collect(),
            updates: self
                .changed
                .iter()
                .filter_map(|id| self.rows.get(id).cloned())
                .collect(),
            evicted: self.evicted.iter().map(Uuid::to_string).collect(),
            cancelled: self.cancelled.iter().map(Uuid::to_string).collect(),
            dispatched: self.dispatched.iter().map(Uuid::to_string).collect(),
            taken_pending: self
                .taken_pending
                .iter()
                .chain(&self.taken_copies)
                .map(Uuid::to_string)
                .collect(),
            reprioritised: self
                .reprioritised
                .iter()
                .map(|(id, status, p)| (id.to_string(), *status, *p))
                .collect(),
            explained: self
                .explained
                .iter()
                .map(|(id, e)| (id.to_string(), e.clone()))
                .collect(),
            scores: self
                .scores
                .iter()
                .map(|(id, e)| (id.to_string(), e.clone()))
                .collect(),
            links: self.links.clone(),
        }
    }

    /// Consumes the batch's rows (to answer from).
    pub fn into_rows(self) -> HashMap<Uuid, TaskRow> {
        self.rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::engine::testing::row;

    /// The engine refreshes the queue table's statistics after so many queue rows changed: only
    /// pending tasks have one, so pops and patches of queued tasks must not count, and pops of
    /// pending tasks (which delete theirs) must.
    #[test]
    fn only_rows_written_as_pending_or_taken_from_pending_count_as_queue_rows() {
        let with = |status: TaskStatus| {
            let (_, mut r) = row(5, 1);
            r.status = status;
            r
        };
        let writes = Writes {
            inserts: vec![with(TaskStatus::Pending), with(TaskStatus::Queued)],
            updates: vec![
                with(TaskStatus::Pending),
                with(TaskStatus::Dispatched),
                with(TaskStatus::Running),
                with(TaskStatus::Completed),
            ],
            evicted: vec!["a".into(), "b".into()],
            dispatched: vec!["c".into(); 10],
            taken_pending: vec!["e".into(), "f".into(), "g".into()],
            cancelled: vec!["d".into()],
            ..Writes::default()
        };
        assert_eq!(writes.pending_rows(), 7);
        assert_eq!(
            Writes {
                dispatched: vec!["c".into(); 10],
                updates: vec![with(TaskStatus::Running)],
                ..Writes::default()
            }
            .pending_rows(),
            0,
            "pops and patches of queued tasks write no queue row"
        );
    }

    #[test]
    fn work_read_waiting_twice_is_still_known_when_one_leaves_in_the_batch() {
        let (a, mut ra) = row(5, 1);
        let (b, mut rb) = row(6, 2);
        ra.status = TaskStatus::Pending;
        rb.status = TaskStatus::Pending;
        rb.hash = ra.hash.clone();
        let h = ra.hash.clone().unwrap();
        for leaves in [a, b] {
            let mut rows = BatchRows::default();
            rows.load(vec![ra.clone(), rb.clone()], &ra.scheduler_id);
            let mut gone = rows.get(&leaves).cloned().unwrap();
            gone.status = TaskStatus::Cancelled;
            rows.update(leaves, gone);
            let stays = if leaves == a { b } else { a };
            assert_eq!(rows.waiting_with_hash(&h), Some(stays));
        }
    }
}
