//! The engine: the one thread that changes queue state.
//!
//! It takes every command waiting in its channel (up to `max_batch`), applies them in one
//! transaction in three phases — pushes, then patches, then pops, then refills from `pending` —
//! commits, and only then answers each caller. Requests that arrive while a commit is in flight
//! wait in the channel and form the next batch, so commits are grouped without any timer.
//!
//! Being the only writer of the heaps, it needs no locks. The heaps change as the batch is
//! applied; if the transaction fails they may hold changes that were rolled back, so the engine
//! marks itself dirty and rebuilds them from the table (the truth) before the next batch. A batch
//! that fails for a reason other than a lost database is retried command by command, so one bad
//! command cannot fail the others.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDateTime, Utc};
use diesel::Connection;
use tokio::sync::oneshot;
use tracing::{debug, error, info, warn};
use uuid::Uuid;

use super::heap::{Rank, SchedulerHeap};
use super::push::NewTask;
use super::{Gauges, PushOutcome, QueueConfig, QueueError, TaskPatch, WhenFull};
use crate::clock::SharedClock;
use crate::domain::filter::FilterNode;
use crate::domain::{SchedulerId, Task, TaskStatus};
use crate::storage::rows::{TaskRow, WaitingKey};
use crate::storage::{self, AnyConnection, DbPool, StorageError, tasks};

/// Pending tasks moved back into a heap per refill statement at most.
const REFILL_BATCH: usize = 1_000;

/// Queued rows read per page when rebuilding the heaps: bounds the transient memory of a
/// rebuild of millions of rows.
const REBUILD_PAGE: usize = 10_000;

type Reply<T> = oneshot::Sender<Result<T, QueueError>>;

/// A request to the engine.
pub(crate) enum Command {
    Push {
        task: NewTask,
        reply: Reply<PushOutcome>,
    },
    Pop {
        scheduler: SchedulerId,
        limit: usize,
        filter: Option<FilterNode>,
        reply: Reply<Vec<Task>>,
    },
    Patch {
        id: Uuid,
        patch: TaskPatch,
        reply: Reply<Task>,
    },
    Shutdown,
}

/// What a command produced, before it is turned into its reply.
enum Answer {
    Task { row: Box<TaskRow>, created: bool },
    Tasks(Vec<TaskRow>),
}

type Done = Result<Answer, QueueError>;

/// A push's answer before it is resolved to a row: the task id and whether it is new.
type Pushed = Result<(String, bool), QueueError>;

/// What the batch knows about rows it has read or written, so later commands in the same batch
/// see earlier ones.
#[derive(Default)]
struct BatchState {
    /// Current state of every row the batch touched or read.
    rows: HashMap<String, TaskRow>,
    /// Rows pushed in this batch and not yet inserted.
    unsaved: HashSet<String>,
    /// Waiting (pending or queued) tasks by scheduler and hash.
    waiting_by_hash: HashMap<(SchedulerId, String), String>,
}

/// Stops the engine: finishes what it already received, then exits.
pub struct EngineHandle {
    tx: SyncSender<Command>,
    join: Option<JoinHandle<()>>,
}

impl EngineHandle {
    /// Asks the engine to stop after the commands already queued and waits for it.
    pub fn shutdown(mut self) {
        // A full channel still drains: a blocking send waits for room behind earlier commands.
        let _ = self.tx.send(Command::Shutdown);
        if let Some(join) = self.join.take()
            && join.join().is_err()
        {
            error!("the queue engine thread panicked");
        }
    }
}

pub(crate) struct Engine {
    pool: DbPool,
    clock: SharedClock,
    config: QueueConfig,
    gauges: Arc<Gauges>,
    heaps: [SchedulerHeap; 3],
    pending: [u64; 3],
    /// The heaps may hold changes a failed transaction rolled back.
    dirty: bool,
    /// The last `created_at` handed out, in microseconds: creation times are strictly
    /// increasing, so pop order among equal priorities is push order even within a microsecond.
    last_created: i64,
}

fn naive(t: DateTime<Utc>) -> NaiveDateTime {
    t.naive_utc()
}

fn rank_of(row: &TaskRow) -> Rank {
    Rank::new(row.priority, row.created_at)
}

fn parse_uuid(id: &str) -> Result<Uuid, StorageError> {
    Uuid::parse_str(id).map_err(|_| StorageError::Corrupt(format!("task id '{id}' is not a UUID")))
}

impl Engine {
    pub(crate) fn new(
        pool: DbPool,
        clock: SharedClock,
        config: QueueConfig,
        gauges: Arc<Gauges>,
    ) -> Self {
        let heaps = config.limits.map(|l| SchedulerHeap::new(l.maxsize));
        Self {
            pool,
            clock,
            config,
            gauges,
            heaps,
            pending: [0; 3],
            dirty: true,
            last_created: i64::MIN,
        }
    }

    pub(crate) fn spawn(
        self,
        rx: Receiver<Command>,
        tx: SyncSender<Command>,
    ) -> Result<EngineHandle, StorageError> {
        let join = std::thread::Builder::new()
            .name("queue-engine".into())
            .spawn(move || self.run(rx))
            .map_err(|e| StorageError::Unavailable(format!("cannot start the engine: {e}")))?;
        Ok(EngineHandle {
            tx,
            join: Some(join),
        })
    }

    fn run(mut self, rx: Receiver<Command>) {
        let max_batch = self.config.max_batch.max(1);
        loop {
            let Ok(first) = rx.recv() else { break };
            let mut batch = vec![first];
            while batch.len() < max_batch {
                match rx.try_recv() {
                    Ok(cmd) => batch.push(cmd),
                    Err(_) => break,
                }
            }
            let stop = batch.iter().any(|c| matches!(c, Command::Shutdown));
            batch.retain(|c| !matches!(c, Command::Shutdown));
            if !batch.is_empty() {
                self.process(batch);
            }
            if stop {
                break;
            }
        }
        debug!("queue engine stopped");
    }

    /// Rebuilds every heap and pending count from the table. Queued tasks beyond a heap's bound
    /// (after `maxsize` was lowered) are moved to `pending`, then the heaps are refilled.
    pub(crate) fn rebuild(&mut self) -> Result<(), StorageError> {
        let started = Instant::now();
        let mut conn = storage::checkout(&self.pool)?;
        let now = naive(self.clock.now());
        let limits = self.config.limits;
        let (heaps, pending) = conn.transaction::<_, StorageError, _>(|c| {
            let mut pending = [0u64; 3];
            for row in tasks::count_by_scheduler(c, TaskStatus::Pending)? {
                if let Ok(s) = row.scheduler_id.parse::<SchedulerId>() {
                    pending[s.index()] = u64::try_from(row.count).unwrap_or(0);
                }
            }
            let mut per: [Vec<(Uuid, Rank)>; 3] = Default::default();
            for s in SchedulerId::ALL {
                let i = s.index();
                let maxsize = limits[i].maxsize;
                let mut last: Option<WaitingKey> = None;
                loop {
                    let want = REBUILD_PAGE.min(maxsize - per[i].len());
                    if want == 0 {
                        // The heap is full: whatever ranks after the last entry waits as pending.
                        if let Some(last) = &last {
                            let moved = tasks::demote_after(c, s, last, now)?;
                            if moved > 0 {
                                pending[i] += moved as u64;
                                info!(scheduler.id = %s, moved, "queued tasks beyond maxsize moved to pending");
                            }
                        }
                        break;
                    }
                    let page = tasks::queued_page(c, s, last.as_ref(), want)?;
                    let got = page.len();
                    for key in &page {
                        per[i].push((parse_uuid(&key.id)?, Rank::new(key.priority, key.created_at)));
                    }
                    if let Some(key) = page.into_iter().last() {
                        last = Some(key);
                    }
                    if got < want {
                        break;
                    }
                }
            }
            Ok((per, pending))
        })?;
        let mut i = 0;
        self.heaps = heaps.map(|entries| {
            let heap = SchedulerHeap::from_entries(limits[i].maxsize, entries);
            i += 1;
            heap
        });
        self.pending = pending;
        self.dirty = false;
        // Fill any room from pending.
        conn.transaction::<_, StorageError, _>(|c| self.refill_all(c, now))
            .inspect_err(|_| self.dirty = true)?;
        self.publish();
        info!(
            boefje = self.heaps[0].len(),
            normalizer = self.heaps[1].len(),
            report = self.heaps[2].len(),
            pending = self.pending.iter().sum::<u64>(),
            duration_ms = started.elapsed().as_millis() as u64,
            "heaps rebuilt from the tasks table"
        );
        Ok(())
    }

    fn publish(&self) {
        for s in SchedulerId::ALL {
            self.gauges
                .set(s, self.heaps[s.index()].len(), self.pending[s.index()]);
        }
    }

    fn process(&mut self, batch: Vec<Command>) {
        if self.dirty
            && let Err(e) = self.rebuild()
        {
            warn!(error = %e, "heaps could not be rebuilt; answering 503");
            let err = QueueError::from(e);
            for cmd in batch {
                reply(cmd, Err(clone_err(&err)));
            }
            return;
        }
        let now = self.clock.now();
        let mut conn = match storage::checkout(&self.pool) {
            Ok(c) => c,
            Err(e) => {
                let err = QueueError::from(e);
                for cmd in batch {
                    reply(cmd, Err(clone_err(&err)));
                }
                return;
            }
        };
        let mut done: Vec<Option<Done>> = (0..batch.len()).map(|_| None).collect();
        let began = Instant::now();
        let mut applied = Duration::ZERO;
        let result = conn.transaction::<_, StorageError, _>(|c| {
            let r = self.apply(c, &batch, now, &mut done);
            applied = began.elapsed();
            r
        });
        let total = began.elapsed();
        drop(conn);
        let counters = &self.gauges.engine;
        match result {
            Ok(()) => {
                counters.batches.fetch_add(1, Ordering::Relaxed);
                counters
                    .commands
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                counters
                    .apply_micros
                    .fetch_add(applied.as_micros() as u64, Ordering::Relaxed);
                counters
                    .batch_micros
                    .fetch_add(total.as_micros() as u64, Ordering::Relaxed);
                self.publish();
                for (cmd, d) in batch.into_iter().zip(done) {
                    reply(
                        cmd,
                        d.unwrap_or_else(|| {
                            Err(QueueError::Internal("command not applied".into()))
                        }),
                    );
                }
            }
            Err(e) => {
                self.dirty = true;
                counters.failed_batches.fetch_add(1, Ordering::Relaxed);
                if batch.len() > 1 && !e.is_unavailable() {
                    warn!(error = %e, size = batch.len(), "batch failed; retrying its commands one by one");
                    for cmd in batch {
                        self.process(vec![cmd]);
                    }
                } else {
                    if e.is_unavailable() {
                        warn!(error = %e, "database unavailable");
                    } else {
                        error!(error = %e, "command failed in the database");
                    }
                    let err = QueueError::from(e);
                    for cmd in batch {
                        reply(cmd, Err(clone_err(&err)));
                    }
                }
            }
        }
    }

    fn apply(
        &mut self,
        c: &mut AnyConnection,
        batch: &[Command],
        now: DateTime<Utc>,
        done: &mut [Option<Done>],
    ) -> Result<(), StorageError> {
        let mut st = BatchState::default();
        let pushes: Vec<(usize, &NewTask)> = batch
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c {
                Command::Push { task, .. } => Some((i, task)),
                _ => None,
            })
            .collect();
        if !pushes.is_empty() {
            self.apply_pushes(c, &mut st, &pushes, now, done)?;
        }
        let patches: Vec<(usize, Uuid, &TaskPatch)> = batch
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c {
                Command::Patch { id, patch, .. } => Some((i, *id, patch)),
                _ => None,
            })
            .collect();
        if !patches.is_empty() {
            self.apply_patches(c, &mut st, &patches, now, done)?;
        }
        let pops: Vec<(usize, SchedulerId, usize, Option<&FilterNode>)> = batch
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c {
                Command::Pop {
                    scheduler,
                    limit,
                    filter,
                    ..
                } => Some((i, *scheduler, *limit, filter.as_ref())),
                _ => None,
            })
            .collect();
        if !pops.is_empty() {
            self.apply_pops(c, &pops, now, done)?;
        }
        self.refill_all(c, naive(now))
    }

    // ---------------------------------------------------------------- pushes

    fn apply_pushes(
        &mut self,
        c: &mut AnyConnection,
        st: &mut BatchState,
        pushes: &[(usize, &NewTask)],
        now: DateTime<Utc>,
        done: &mut [Option<Done>],
    ) -> Result<(), StorageError> {
        let ids: Vec<String> = pushes
            .iter()
            .filter(|(_, t)| t.id_given)
            .map(|(_, t)| t.id.to_string())
            .collect();
        let mut hashes: Vec<String> = pushes.iter().map(|(_, t)| t.hash.clone()).collect();
        hashes.sort_unstable();
        hashes.dedup();
        for row in tasks::find_for_push(c, &ids, &hashes)? {
            let waiting = row.status()?.is_waiting();
            if waiting && let (Some(hash), Ok(s)) = (&row.hash, row.scheduler()) {
                st.waiting_by_hash.insert((s, hash.clone()), row.id.clone());
            }
            st.rows.insert(row.id.clone(), row);
        }
        let mut answers: Vec<(usize, Pushed)> = Vec::new();
        for &(i, task) in pushes {
            let result = self.push_one(c, st, task, now)?;
            answers.push((i, result));
        }
        let mut new_rows: Vec<TaskRow> = st
            .unsaved
            .iter()
            .filter_map(|id| st.rows.get(id).cloned())
            .collect();
        // Insert in creation order so the table's physical order follows the queue's.
        new_rows.sort_by_key(|r| r.created_at);
        tasks::insert(c, &new_rows)?;
        st.unsaved.clear();
        let touched: HashSet<SchedulerId> = pushes.iter().map(|(_, t)| t.scheduler).collect();
        for s in touched {
            self.gauges.touch(s, now);
        }
        for (i, result) in answers {
            done[i] = Some(result.and_then(|(id, created)| {
                st.rows
                    .get(&id)
                    .cloned()
                    .map(|row| Answer::Task {
                        row: Box::new(row),
                        created,
                    })
                    .ok_or_else(|| QueueError::Internal("pushed row vanished".into()))
            }));
        }
        Ok(())
    }

    /// Decides one push. The outer error aborts the batch; the inner one is this push's answer.
    fn push_one(
        &mut self,
        c: &mut AnyConnection,
        st: &mut BatchState,
        task: &NewTask,
        now: DateTime<Utc>,
    ) -> Result<Pushed, StorageError> {
        let id = task.id.to_string();
        let s = task.scheduler;
        if task.id_given
            && let Some(existing) = st.rows.get(&id)
        {
            if existing.scheduler_id != s.as_str() {
                return Ok(Err(QueueError::BadRequest(format!(
                    "task {id} belongs to scheduler '{}', not '{s}'",
                    existing.scheduler_id
                ))));
            }
            let status = existing.status()?;
            return match status {
                TaskStatus::Queued | TaskStatus::Pending => {
                    self.boost_or_conflict(c, st, &id, task.priority, now)
                }
                TaskStatus::Dispatched | TaskStatus::Running => self.requeue(c, st, &id, task, now),
                finished => Ok(Err(QueueError::Conflict(format!(
                    "task {id} is {finished}; a finished task is not pushed again (push it without an id to run the work again)"
                )))),
            };
        }
        if let Some(other) = st.waiting_by_hash.get(&(s, task.hash.clone())).cloned() {
            return self.boost_or_conflict(c, st, &other, task.priority, now);
        }
        let created = self.next_created(now);
        let rank = Rank::new(task.priority, created);
        let status = match self.place(c, st, s, task.id, rank, true, naive(now))? {
            Ok(status) => status,
            Err(e) => return Ok(Err(e)),
        };
        let row = TaskRow {
            id: id.clone(),
            scheduler_id: s.as_str().to_owned(),
            schedule_id: None,
            organisation: task.organisation.clone(),
            task_type: s.as_str().to_owned(),
            hash: Some(task.hash.clone()),
            priority: task.priority,
            data: task.data.clone(),
            status: status.as_str().to_owned(),
            attempts: 0,
            lease_expires_at: None,
            failure_reason: None,
            created_at: created,
            modified_at: created,
        };
        st.rows.insert(id.clone(), row);
        st.unsaved.insert(id.clone());
        st.waiting_by_hash
            .insert((s, task.hash.clone()), id.clone());
        Ok(Ok((id, true)))
    }

    /// A push of work that is already waiting: a strictly better priority moves the waiting task
    /// forward; anything else is a 409 naming the waiting task.
    fn boost_or_conflict(
        &mut self,
        c: &mut AnyConnection,
        st: &mut BatchState,
        id: &str,
        priority: i64,
        now: DateTime<Utc>,
    ) -> Result<Pushed, StorageError> {
        let Some(row) = st.rows.get(id).cloned() else {
            return Ok(Err(QueueError::Internal("waiting task not loaded".into())));
        };
        let uuid = parse_uuid(id)?;
        if priority >= row.priority {
            return Ok(Err(QueueError::Duplicate { existing: uuid }));
        }
        let s = row.scheduler()?;
        let mut row = row;
        row.priority = priority;
        row.modified_at = naive(now);
        let rank = rank_of(&row);
        match row.status()? {
            TaskStatus::Queued => {
                self.heaps[s.index()].rerank(&uuid, rank);
            }
            TaskStatus::Pending if rank.is_user() => {
                // A user scan waiting outside a full heap gets in now if it can evict.
                let heap = &self.heaps[s.index()];
                if !heap.is_full() || heap.worst_automatic().is_some() {
                    self.pending[s.index()] = self.pending[s.index()].saturating_sub(1);
                    if let Ok(status) = self.place(c, st, s, uuid, rank, false, naive(now))? {
                        row.status = status.as_str().to_owned();
                    }
                }
            }
            _ => {}
        }
        self.save(c, st, row)?;
        Ok(Ok((id.to_owned(), false)))
    }

    /// A worker gives back a task it was handed (re-push of the full task): it waits again,
    /// keeping its id.
    fn requeue(
        &mut self,
        c: &mut AnyConnection,
        st: &mut BatchState,
        id: &str,
        task: &NewTask,
        now: DateTime<Utc>,
    ) -> Result<Pushed, StorageError> {
        let s = task.scheduler;
        if let Some(other) = st.waiting_by_hash.get(&(s, task.hash.clone()))
            && other != id
        {
            return Ok(Err(QueueError::Duplicate {
                existing: parse_uuid(other)?,
            }));
        }
        let Some(mut row) = st.rows.get(id).cloned() else {
            return Ok(Err(QueueError::Internal("task not loaded".into())));
        };
        row.priority = task.priority;
        row.lease_expires_at = None;
        row.modified_at = naive(now);
        let status = match self.place(c, st, s, task.id, rank_of(&row), false, naive(now))? {
            Ok(status) => status,
            Err(e) => return Ok(Err(e)),
        };
        row.status = status.as_str().to_owned();
        if let Some(hash) = &row.hash {
            st.waiting_by_hash.insert((s, hash.clone()), id.to_owned());
        }
        self.save(c, st, row)?;
        Ok(Ok((id.to_owned(), false)))
    }

    /// Writes a changed row: to the batch state only if it is still to be inserted, else to the
    /// table as well.
    fn save(
        &mut self,
        c: &mut AnyConnection,
        st: &mut BatchState,
        row: TaskRow,
    ) -> Result<(), StorageError> {
        if !st.unsaved.contains(&row.id) {
            tasks::update(c, &row)?;
        }
        st.rows.insert(row.id.clone(), row);
        Ok(())
    }

    /// Finds a task a place: the heap if it has room; else a user scan evicts the worst automatic
    /// task; else `pending`, or 429 for an automatic push when the scheduler refuses
    /// (`allow_reject`, new pushes only: work already accepted is never refused).
    #[allow(clippy::too_many_arguments)]
    fn place(
        &mut self,
        c: &mut AnyConnection,
        st: &mut BatchState,
        s: SchedulerId,
        id: Uuid,
        rank: Rank,
        allow_reject: bool,
        now: NaiveDateTime,
    ) -> Result<Result<TaskStatus, QueueError>, StorageError> {
        let i = s.index();
        if !self.heaps[i].is_full() {
            self.heaps[i].insert(id, rank);
            return Ok(Ok(TaskStatus::Queued));
        }
        if rank.is_user()
            && let Some((victim, _)) = self.heaps[i].worst_automatic()
        {
            self.heaps[i].remove(&victim);
            self.demote(c, st, s, victim, now)?;
            self.heaps[i].insert(id, rank);
            return Ok(Ok(TaskStatus::Queued));
        }
        if allow_reject && !rank.is_user() && self.config.limits[i].when_full == WhenFull::Reject {
            return Ok(Err(QueueError::QueueFull(s)));
        }
        self.pending[i] += 1;
        Ok(Ok(TaskStatus::Pending))
    }

    /// Moves an evicted task from `queued` to `pending`.
    fn demote(
        &mut self,
        c: &mut AnyConnection,
        st: &mut BatchState,
        s: SchedulerId,
        victim: Uuid,
        now: NaiveDateTime,
    ) -> Result<(), StorageError> {
        let key = victim.to_string();
        if st.unsaved.contains(&key) {
            if let Some(row) = st.rows.get_mut(&key) {
                row.status = TaskStatus::Pending.as_str().to_owned();
            }
        } else {
            for row in tasks::transition(
                c,
                std::slice::from_ref(&key),
                TaskStatus::Queued,
                TaskStatus::Pending,
                now,
                None,
            )? {
                st.rows.insert(row.id.clone(), row);
            }
        }
        self.pending[s.index()] += 1;
        debug!(task.id = %victim, scheduler.id = %s, "evicted to pending by a user scan");
        Ok(())
    }

    fn next_created(&mut self, now: DateTime<Utc>) -> NaiveDateTime {
        let micros = now
            .timestamp_micros()
            .max(self.last_created.saturating_add(1));
        self.last_created = micros;
        DateTime::from_timestamp_micros(micros)
            .unwrap_or(now)
            .naive_utc()
    }

    // ---------------------------------------------------------------- patches

    fn apply_patches(
        &mut self,
        c: &mut AnyConnection,
        st: &mut BatchState,
        patches: &[(usize, Uuid, &TaskPatch)],
        now: DateTime<Utc>,
        done: &mut [Option<Done>],
    ) -> Result<(), StorageError> {
        let missing: Vec<String> = patches
            .iter()
            .map(|(_, id, _)| id.to_string())
            .filter(|id| !st.rows.contains_key(id))
            .collect();
        for row in tasks::get_many(c, &missing)? {
            st.rows.insert(row.id.clone(), row);
        }
        for &(i, id, patch) in patches {
            done[i] = Some(self.patch_one(c, st, id, patch, now)?);
        }
        Ok(())
    }

    fn patch_one(
        &mut self,
        c: &mut AnyConnection,
        st: &mut BatchState,
        id: Uuid,
        patch: &TaskPatch,
        now: DateTime<Utc>,
    ) -> Result<Done, StorageError> {
        let key = id.to_string();
        let Some(mut row) = st.rows.get(&key).cloned() else {
            return Ok(Err(QueueError::TaskNotFound(id)));
        };
        let s = row.scheduler()?;
        let from = row.status()?;
        let mut changed = false;
        if let Some(p) = patch.priority
            && p != row.priority
        {
            row.priority = p;
            if from == TaskStatus::Queued {
                self.heaps[s.index()].rerank(&id, rank_of(&row));
            }
            changed = true;
        }
        if let Some(to) = patch.status {
            if let Err(e) = from.check_patch(to) {
                return Ok(Err(QueueError::IllegalTransition(e)));
            }
            if to != from {
                match from {
                    TaskStatus::Queued => {
                        self.heaps[s.index()].remove(&id);
                    }
                    TaskStatus::Pending => {
                        self.pending[s.index()] = self.pending[s.index()].saturating_sub(1);
                    }
                    _ => {}
                }
                let status = if to == TaskStatus::Queued {
                    match self.place(c, st, s, id, rank_of(&row), false, naive(now))? {
                        Ok(status) => status,
                        Err(e) => return Ok(Err(e)),
                    }
                } else {
                    to
                };
                row.status = status.as_str().to_owned();
                if !matches!(status, TaskStatus::Dispatched | TaskStatus::Running) {
                    row.lease_expires_at = None;
                }
                changed = true;
            }
        }
        if changed {
            row.modified_at = naive(now);
            self.save(c, st, row.clone())?;
        }
        Ok(Ok(Answer::Task {
            row: Box::new(row),
            created: false,
        }))
    }

    // ---------------------------------------------------------------- pops

    fn apply_pops(
        &mut self,
        c: &mut AnyConnection,
        pops: &[(usize, SchedulerId, usize, Option<&FilterNode>)],
        now: DateTime<Utc>,
        done: &mut [Option<Done>],
    ) -> Result<(), StorageError> {
        let at = naive(now);
        // Unfiltered pops come straight off the heaps and are dispatched in one statement.
        let mut claims: Vec<(usize, Vec<String>)> = Vec::new();
        let mut all: Vec<String> = Vec::new();
        for &(i, s, limit, filter) in pops {
            if filter.is_some() {
                continue;
            }
            let heap = &mut self.heaps[s.index()];
            let ids: Vec<String> = std::iter::from_fn(|| heap.pop_best())
                .take(limit)
                .map(|(id, _)| id.to_string())
                .collect();
            all.extend(ids.iter().cloned());
            claims.push((i, ids));
            self.gauges.touch(s, now);
        }
        if !claims.is_empty() {
            let mut by_id: HashMap<String, TaskRow> = if all.is_empty() {
                HashMap::new()
            } else {
                tasks::transition(
                    c,
                    &all,
                    TaskStatus::Queued,
                    TaskStatus::Dispatched,
                    at,
                    None,
                )?
                .into_iter()
                .map(|r| (r.id.clone(), r))
                .collect()
            };
            for (i, ids) in claims {
                let rows: Vec<TaskRow> = ids.iter().filter_map(|id| by_id.remove(id)).collect();
                if rows.len() < ids.len() {
                    warn!(
                        missing = ids.len() - rows.len(),
                        "heap held tasks the table no longer has queued; skipped"
                    );
                }
                done[i] = Some(Ok(Answer::Tasks(rows)));
            }
        }
        // Filtered pops select in SQL, in pop order, and take the rows out of the heap.
        for &(i, s, limit, filter) in pops {
            let Some(filter) = filter else { continue };
            let mut rows = tasks::dispatch_matching(c, s, filter, limit, at, None)?;
            for row in &rows {
                self.heaps[s.index()].remove(&parse_uuid(&row.id)?);
            }
            rows.sort_by(|a, b| {
                (a.priority, a.created_at, &a.id).cmp(&(b.priority, b.created_at, &b.id))
            });
            self.gauges.touch(s, now);
            done[i] = Some(Ok(Answer::Tasks(rows)));
        }
        Ok(())
    }

    // ---------------------------------------------------------------- refill

    /// Moves the best pending tasks into every heap that has room.
    fn refill_all(
        &mut self,
        c: &mut AnyConnection,
        now: NaiveDateTime,
    ) -> Result<(), StorageError> {
        for s in SchedulerId::ALL {
            let i = s.index();
            while self.pending[i] > 0 && self.heaps[i].room() > 0 {
                let want = self.heaps[i].room().min(REFILL_BATCH);
                let keys = tasks::best_pending(c, s, want)?;
                if keys.len() < want {
                    // Fewer than counted: the count drifted (e.g. another writer); trust the table.
                    self.pending[i] = keys.len() as u64;
                }
                if keys.is_empty() {
                    break;
                }
                let ids: Vec<String> = keys.iter().map(|k| k.id.clone()).collect();
                let moved =
                    tasks::transition(c, &ids, TaskStatus::Pending, TaskStatus::Queued, now, None)?;
                for row in &moved {
                    self.heaps[i].insert(parse_uuid(&row.id)?, rank_of(row));
                }
                self.pending[i] = self.pending[i].saturating_sub(moved.len() as u64);
                if moved.is_empty() {
                    break;
                }
            }
        }
        Ok(())
    }
}

fn clone_err(e: &QueueError) -> QueueError {
    match e {
        QueueError::Unavailable(m) => QueueError::Unavailable(m.clone()),
        other => QueueError::Internal(other.to_string()),
    }
}

fn reply(cmd: Command, done: Done) {
    // A caller that went away (client disconnected) no longer needs its answer; its change is
    // committed all the same.
    match cmd {
        Command::Push { reply, .. } => {
            let _ = reply.send(done.and_then(|a| match a {
                Answer::Task { row, created } => Ok(PushOutcome {
                    task: row.into_task()?,
                    created,
                }),
                Answer::Tasks(_) => Err(QueueError::Internal("push answered with a list".into())),
            }));
        }
        Command::Pop { reply, .. } => {
            let _ = reply.send(done.and_then(|a| {
                match a {
                    Answer::Tasks(rows) => rows
                        .into_iter()
                        .map(|r| r.into_task().map_err(QueueError::from))
                        .collect(),
                    Answer::Task { .. } => {
                        Err(QueueError::Internal("pop answered with one task".into()))
                    }
                }
            }));
        }
        Command::Patch { reply, .. } => {
            let _ = reply.send(done.and_then(|a| match a {
                Answer::Task { row, .. } => Ok(row.into_task()?),
                Answer::Tasks(_) => Err(QueueError::Internal("patch answered with a list".into())),
            }));
        }
        Command::Shutdown => {}
    }
}
