//! An engine: the one thread that changes one scheduler's queue state.
//!
//! Each scheduler has its own engine, heap and database connection, so the three schedulers'
//! transactions run side by side and PostgreSQL merges their commits. An engine takes every
//! command waiting in its channel (up to `max_batch`), applies them in one transaction — pushes,
//! then patches, then lease expiry, then pops, then a refill from `pending` — commits, and only
//! then answers each caller. Requests that arrive while a commit is in flight wait in the channel
//! and form the next batch, so commits are grouped without any timer.
//!
//! Being the only writer of its heap, it needs no locks. The heap changes as the batch is
//! applied; if the transaction fails it may hold changes that were rolled back, so the engine
//! marks itself dirty and rebuilds the heap from the table (the truth) before the next batch. A
//! batch that fails for a reason other than a lost database is retried command by command, so one
//! bad command cannot fail the others.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDateTime, Utc};
use diesel::Connection;
use tokio::sync::oneshot;
use tracing::{debug, error, info, warn};
use uuid::Uuid;

use super::heap::{Rank, SchedulerHeap};
use super::push::NewTask;
use super::{ExpiryReport, Gauges, PushOutcome, QueueError, SchedulerLimits, TaskPatch, WhenFull};
use crate::clock::SharedClock;
use crate::domain::filter::FilterNode;
use crate::domain::{SchedulerId, Task, TaskStatus};
use crate::storage::rows::{TaskRow, WaitingKey};
use crate::storage::{self, AnyConnection, Backend, DbConn, DbPool, StorageError, tasks};

/// Pending tasks moved back into a heap per refill statement at most.
const REFILL_BATCH: usize = 1_000;

/// Queued rows read per page when rebuilding a heap: bounds the transient memory of a rebuild of
/// millions of rows.
const REBUILD_PAGE: usize = 10_000;

/// After the database was found unreachable, commands are answered 503 at once for this long
/// before the next connection attempt, so an outage costs callers no wait beyond one connect
/// timeout.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

type Reply<T> = oneshot::Sender<Result<T, QueueError>>;

/// A request to an engine.
pub(crate) enum Command {
    Push {
        task: NewTask,
        reply: Reply<PushOutcome>,
    },
    Pop {
        limit: usize,
        filter: Option<FilterNode>,
        reply: Reply<Vec<Task>>,
    },
    Patch {
        id: Uuid,
        patch: TaskPatch,
        reply: Reply<Task>,
    },
    /// The watchdog: re-queue or fail these tasks if their lease has ended.
    Expire {
        ids: Vec<String>,
        reply: Reply<ExpiryReport>,
    },
    Shutdown,
}

/// What a command produced, before it is turned into its reply.
enum Answer {
    Task { row: Box<TaskRow>, created: bool },
    Tasks(Vec<TaskRow>),
    Expired(ExpiryReport),
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
    /// Waiting (pending or queued) tasks of this scheduler by hash.
    waiting_by_hash: HashMap<String, String>,
}

/// The running engines; stops them in order.
pub struct EngineHandle {
    engines: Vec<(SyncSender<Command>, JoinHandle<()>)>,
}

impl EngineHandle {
    /// Asks every engine to stop after the commands already queued and waits for them.
    pub fn shutdown(self) {
        for (tx, _) in &self.engines {
            // A full channel still drains: a blocking send waits behind earlier commands.
            let _ = tx.send(Command::Shutdown);
        }
        for (_, join) in self.engines {
            if join.join().is_err() {
                error!("a queue engine thread panicked");
            }
        }
    }
}

/// Starts one engine per scheduler, each rebuilding its heap first (in parallel); returns their
/// channels once all are ready, or the first rebuild error.
pub(crate) fn start_all(
    pool: &DbPool,
    backend: Backend,
    clock: &SharedClock,
    limits: [SchedulerLimits; 3],
    max_batch: usize,
    channel_capacity: usize,
    gauges: &Arc<Gauges>,
) -> Result<([SyncSender<Command>; 3], EngineHandle), StorageError> {
    let mut engines = Vec::new();
    let mut ready = Vec::new();
    // SQLite has one writer at a time, and a transaction that read before it writes fails at
    // once (not after busy_timeout) if another connection wrote in between. So on SQLite the
    // engines take turns; PostgreSQL lets them write side by side.
    let write_lock = (backend == Backend::Sqlite).then(|| Arc::new(Mutex::new(())));
    for s in SchedulerId::ALL {
        let (tx, rx) = std::sync::mpsc::sync_channel(channel_capacity);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let mut engine = Engine {
            scheduler: s,
            pool: pool.clone(),
            write_lock: write_lock.clone(),
            conn: None,
            clock: clock.clone(),
            limits: limits[s.index()],
            max_batch: max_batch.max(1),
            gauges: gauges.clone(),
            heap: SchedulerHeap::new(limits[s.index()].maxsize),
            pending: 0,
            dirty: true,
            down_since: None,
            last_created: i64::MIN,
        };
        let join = std::thread::Builder::new()
            .name(format!("engine-{s}"))
            .spawn(move || {
                let result = engine.rebuild();
                let ok = result.is_ok();
                let _ = ready_tx.send(result);
                if ok {
                    engine.run(rx);
                }
            })
            .map_err(|e| StorageError::Unavailable(format!("cannot start an engine: {e}")))?;
        engines.push((tx, join));
        ready.push(ready_rx);
    }
    let mut first_error = None;
    for rx in ready {
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert(StorageError::Unavailable(
                    "an engine stopped during start".into(),
                ));
            }
        }
    }
    let senders: Vec<SyncSender<Command>> = engines.iter().map(|(tx, _)| tx.clone()).collect();
    let handle = EngineHandle { engines };
    if let Some(e) = first_error {
        handle.shutdown();
        return Err(e);
    }
    let senders: [SyncSender<Command>; 3] = senders
        .try_into()
        .map_err(|_| StorageError::Unavailable("engine count".into()))?;
    Ok((senders, handle))
}

struct Engine {
    scheduler: SchedulerId,
    pool: DbPool,
    /// Held for each transaction when the database takes one writer at a time (SQLite).
    write_lock: Option<Arc<Mutex<()>>>,
    /// The engine's own connection, kept between batches; dropped after a failure so the next
    /// batch starts on a fresh one.
    conn: Option<DbConn>,
    clock: SharedClock,
    limits: SchedulerLimits,
    max_batch: usize,
    gauges: Arc<Gauges>,
    heap: SchedulerHeap,
    /// Tasks of this scheduler waiting as `pending`.
    pending: u64,
    /// The heap may hold changes a failed transaction rolled back.
    dirty: bool,
    /// When the database was last found unreachable.
    down_since: Option<Instant>,
    /// The last `created_at` handed out, in microseconds: creation times are strictly
    /// increasing, so pop order among equal priorities is push order even within a microsecond.
    last_created: i64,
}

/// The batch's pushes, with their positions.
fn pushes_of(batch: &[Command]) -> Vec<(usize, &NewTask)> {
    batch
        .iter()
        .enumerate()
        .filter_map(|(i, c)| match c {
            Command::Push { task, .. } => Some((i, task)),
            _ => None,
        })
        .collect()
}

/// The batch's pops (limit and filter), with their positions.
fn pops_of(batch: &[Command]) -> Vec<(usize, usize, Option<&FilterNode>)> {
    batch
        .iter()
        .enumerate()
        .filter_map(|(i, c)| match c {
            Command::Pop { limit, filter, .. } => Some((i, *limit, filter.as_ref())),
            _ => None,
        })
        .collect()
}

fn naive(t: DateTime<Utc>) -> NaiveDateTime {
    t.naive_utc()
}

fn rank_of(row: &TaskRow) -> Rank {
    Rank::new(row.priority, row.created_at, row.hash.as_deref())
}

fn parse_uuid(id: &str) -> Result<Uuid, StorageError> {
    Uuid::parse_str(id).map_err(|_| StorageError::Corrupt(format!("task id '{id}' is not a UUID")))
}

/// Takes the shared write lock, if any; a panic in another engine does not make it unusable.
fn write_turn(lock: &Option<Arc<Mutex<()>>>) -> Option<MutexGuard<'_, ()>> {
    lock.as_ref()
        .map(|l| l.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
}

impl Engine {
    fn run(mut self, rx: Receiver<Command>) {
        loop {
            let Ok(first) = rx.recv() else { break };
            let mut batch = vec![first];
            while batch.len() < self.max_batch {
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
        debug!(scheduler.id = %self.scheduler, "queue engine stopped");
    }

    fn connection(&mut self) -> Result<&mut DbConn, StorageError> {
        if self.conn.is_none() {
            self.conn = Some(storage::checkout(&self.pool)?);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| StorageError::Unavailable("no connection".into()))
    }

    /// Rebuilds the heap and the pending count from the table. Queued tasks beyond the heap's
    /// bound (after `maxsize` was lowered) are moved to `pending`; then the heap is refilled.
    fn rebuild(&mut self) -> Result<(), StorageError> {
        let lock = self.write_lock.clone();
        let _turn = write_turn(&lock);
        let started = Instant::now();
        let s = self.scheduler;
        let now = naive(self.clock.now());
        let maxsize = self.limits.maxsize;
        let result = (|| {
            let conn = self.connection()?;
            conn.transaction::<_, StorageError, _>(|c| {
                let mut pending = tasks::count_waiting(c, s, TaskStatus::Pending)?;
                let mut entries: Vec<(Uuid, Rank)> = Vec::new();
                let mut last: Option<WaitingKey> = None;
                loop {
                    let want = REBUILD_PAGE.min(maxsize - entries.len());
                    if want == 0 {
                        // The heap is full: whatever ranks after its last entry waits as pending.
                        if let Some(last) = &last {
                            let moved = tasks::demote_after(c, s, last, now)?;
                            if moved > 0 {
                                pending += moved as u64;
                                info!(scheduler.id = %s, moved, "queued tasks beyond maxsize moved to pending");
                            }
                        }
                        break;
                    }
                    let page = tasks::queued_page(c, s, last.as_ref(), want)?;
                    let got = page.len();
                    for key in &page {
                        entries.push((
                            parse_uuid(&key.id)?,
                            Rank::new(key.priority, key.created_at, key.hash.as_deref()),
                        ));
                    }
                    if let Some(key) = page.into_iter().last() {
                        last = Some(key);
                    }
                    if got < want {
                        break;
                    }
                }
                Ok((entries, pending))
            })
        })();
        let (entries, pending) = match result {
            Ok(r) => r,
            Err(e) => {
                self.conn = None;
                return Err(e);
            }
        };
        self.heap = SchedulerHeap::from_entries(maxsize, entries);
        self.pending = pending;
        self.dirty = false;
        let refill = (|| {
            let conn = self.conn.take();
            let mut conn = match conn {
                Some(c) => c,
                None => storage::checkout(&self.pool)?,
            };
            let r = conn.transaction::<_, StorageError, _>(|c| self.refill(c, now));
            self.conn = Some(conn);
            r
        })();
        if let Err(e) = refill {
            self.dirty = true;
            self.conn = None;
            return Err(e);
        }
        self.publish();
        info!(
            scheduler.id = %s,
            queued = self.heap.len(),
            pending = self.pending,
            duration_ms = started.elapsed().as_millis() as u64,
            "heaps rebuilt from the tasks table"
        );
        Ok(())
    }

    fn publish(&self) {
        self.gauges
            .set(self.scheduler, self.heap.len(), self.pending);
    }

    fn fail_all(batch: Vec<Command>, err: &QueueError) {
        for cmd in batch {
            reply(cmd, Err(clone_err(err)));
        }
    }

    fn unavailable(&mut self, batch: Vec<Command>, why: &str) {
        if self.down_since.is_none() {
            warn!(scheduler.id = %self.scheduler, error = %why, "database unavailable; answering 503 until it returns");
        }
        self.down_since = Some(Instant::now());
        Self::fail_all(batch, &QueueError::Unavailable(why.to_owned()));
    }

    fn process(&mut self, batch: Vec<Command>) {
        if let Some(since) = self.down_since
            && since.elapsed() < RECONNECT_PAUSE
        {
            Self::fail_all(
                batch,
                &QueueError::Unavailable("the database is unreachable".into()),
            );
            return;
        }
        if self.dirty
            && let Err(e) = self.rebuild()
        {
            if e.is_unavailable() || !storage::reachable(&self.pool) {
                self.unavailable(batch, &e.to_string());
            } else {
                error!(scheduler.id = %self.scheduler, error = %e, "heap could not be rebuilt");
                Self::fail_all(batch, &QueueError::from(e));
            }
            return;
        }
        if self.down_since.take().is_some() {
            info!(scheduler.id = %self.scheduler, "database reachable again");
        }
        let lock = self.write_lock.clone();
        let turn = write_turn(&lock);
        let now = self.clock.now();
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => match storage::checkout(&self.pool) {
                Ok(c) => c,
                Err(e) => {
                    self.unavailable(batch, &e.to_string());
                    return;
                }
            },
        };
        let mut done: Vec<Option<Done>> = (0..batch.len()).map(|_| None).collect();
        let began = Instant::now();
        let mut applied = Duration::ZERO;
        // A batch that needs one statement runs it in autocommit: one round trip instead of
        // BEGIN, statement, COMMIT, and a single statement is atomic all the same.
        let result = match self.single_statement(&mut conn, &batch, now, &mut done) {
            Ok(true) => {
                applied = began.elapsed();
                Ok(())
            }
            Ok(false) => conn.transaction::<_, StorageError, _>(|c| {
                let r = self.apply(c, &batch, now, &mut done);
                applied = began.elapsed();
                r
            }),
            Err(e) => Err(e),
        };
        let total = began.elapsed();
        // The transaction is over; a retry below (one command at a time) takes its own turn.
        drop(turn);
        let counters = &self.gauges.engine;
        match result {
            Ok(()) => {
                self.conn = Some(conn);
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
                // The connection may be the cause (a dropped server); start over on a fresh one.
                drop(conn);
                self.dirty = true;
                counters.failed_batches.fetch_add(1, Ordering::Relaxed);
                // Tell a lost database from a bad statement by asking the database.
                if e.is_unavailable() || !storage::reachable(&self.pool) {
                    self.unavailable(batch, &e.to_string());
                } else if batch.len() > 1 {
                    warn!(scheduler.id = %self.scheduler, error = %e, size = batch.len(), "batch failed; retrying its commands one by one");
                    for cmd in batch {
                        self.process(vec![cmd]);
                    }
                } else {
                    error!(scheduler.id = %self.scheduler, error = %e, "command failed in the database");
                    Self::fail_all(batch, &QueueError::from(e));
                }
            }
        }
    }

    /// Applies the batch with a single autocommitted statement if it can be: only unfiltered pops
    /// with nothing pending to refill, or only new pushes that fit the heap and duplicate nothing
    /// (checked by a read first). Returns false, having changed nothing, when it cannot.
    fn single_statement(
        &mut self,
        c: &mut AnyConnection,
        batch: &[Command],
        now: DateTime<Utc>,
        done: &mut [Option<Done>],
    ) -> Result<bool, StorageError> {
        let all_pops = batch
            .iter()
            .all(|c| matches!(c, Command::Pop { filter: None, .. }));
        if all_pops && self.pending == 0 {
            let pops = pops_of(batch);
            let wanted: usize = pops.iter().map(|(_, limit, _)| limit).sum();
            if wanted.min(self.heap.len()) <= tasks::CHUNK {
                self.apply_pops(c, &pops, now, done)?;
                return Ok(true);
            }
        }
        let plain_pushes = batch.len() <= tasks::INSERT_CHUNK
            && batch.len() <= self.heap.room()
            && batch
                .iter()
                .all(|c| matches!(c, Command::Push { task, .. } if !task.id_given));
        if plain_pushes {
            let pushes = pushes_of(batch);
            let mut hashes: Vec<String> = pushes.iter().map(|(_, t)| t.hash.clone()).collect();
            hashes.sort_unstable();
            let count = hashes.len();
            hashes.dedup();
            // With nothing pending, every waiting task of this scheduler is in the heap, and its
            // hash index answers without a read; otherwise the table does.
            let duplicates_none = if self.pending == 0 {
                hashes
                    .iter()
                    .all(|h| self.heap.find_hash(Some(h)).is_none())
            } else {
                tasks::find_for_push(c, self.scheduler, &[], &hashes)?.is_empty()
            };
            if hashes.len() == count && duplicates_none {
                let mut st = BatchState::default();
                // Nothing waits with these hashes and the heap has room: each push is a plain
                // insert, so this issues exactly one INSERT.
                self.apply_pushes(c, &mut st, &pushes, now, done, false)?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn apply(
        &mut self,
        c: &mut AnyConnection,
        batch: &[Command],
        now: DateTime<Utc>,
        done: &mut [Option<Done>],
    ) -> Result<(), StorageError> {
        let mut st = BatchState::default();
        let pushes = pushes_of(batch);
        if !pushes.is_empty() {
            self.apply_pushes(c, &mut st, &pushes, now, done, true)?;
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
        for (i, cmd) in batch.iter().enumerate() {
            if let Command::Expire { ids, .. } = cmd {
                done[i] = Some(self.expire(c, &mut st, ids, now)?);
            }
        }
        let pops = pops_of(batch);
        if !pops.is_empty() {
            self.apply_pops(c, &pops, now, done)?;
        }
        self.refill(c, naive(now))
    }

    // ---------------------------------------------------------------- pushes

    fn apply_pushes(
        &mut self,
        c: &mut AnyConnection,
        st: &mut BatchState,
        pushes: &[(usize, &NewTask)],
        now: DateTime<Utc>,
        done: &mut [Option<Done>],
        lookup: bool,
    ) -> Result<(), StorageError> {
        let ids: Vec<String> = pushes
            .iter()
            .filter(|(_, t)| t.id_given)
            .map(|(_, t)| t.id.to_string())
            .collect();
        let mut hashes: Vec<String> = pushes.iter().map(|(_, t)| t.hash.clone()).collect();
        hashes.sort_unstable();
        hashes.dedup();
        let found = if lookup {
            tasks::find_for_push(c, self.scheduler, &ids, &hashes)?
        } else {
            Vec::new()
        };
        for row in found {
            if row.status()?.is_waiting()
                && row.scheduler_id == self.scheduler.as_str()
                && let Some(hash) = &row.hash
            {
                st.waiting_by_hash.insert(hash.clone(), row.id.clone());
            }
            st.rows.insert(row.id.clone(), row);
        }
        let mut answers: Vec<(usize, Pushed)> = Vec::with_capacity(pushes.len());
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
        self.gauges.touch(self.scheduler, now);
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
        let s = self.scheduler;
        if task.id_given
            && let Some(existing) = st.rows.get(&id)
        {
            if existing.scheduler_id != s.as_str() {
                return Ok(Err(QueueError::BadRequest(format!(
                    "task {id} belongs to scheduler '{}', not '{s}'",
                    existing.scheduler_id
                ))));
            }
            return match existing.status()? {
                TaskStatus::Queued | TaskStatus::Pending => {
                    self.boost_or_conflict(c, st, &id, task.priority, now)
                }
                TaskStatus::Dispatched | TaskStatus::Running => self.requeue(c, st, &id, task, now),
                finished => Ok(Err(QueueError::Conflict(format!(
                    "task {id} is {finished}; a finished task is not pushed again (push it without an id to run the work again)"
                )))),
            };
        }
        if let Some(other) = st.waiting_by_hash.get(&task.hash).cloned() {
            return self.boost_or_conflict(c, st, &other, task.priority, now);
        }
        let created = self.next_created(now);
        let rank = Rank::new(task.priority, created, Some(&task.hash));
        let status = match self.place(c, st, task.id, rank, true, naive(now))? {
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
        st.waiting_by_hash.insert(task.hash.clone(), id.clone());
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
        let Some(mut row) = st.rows.get(id).cloned() else {
            return Ok(Err(QueueError::Internal("waiting task not loaded".into())));
        };
        let uuid = parse_uuid(id)?;
        if priority >= row.priority {
            return Ok(Err(QueueError::Duplicate { existing: uuid }));
        }
        row.priority = priority;
        row.modified_at = naive(now);
        let rank = rank_of(&row);
        match row.status()? {
            TaskStatus::Queued => {
                self.heap.rerank(&uuid, rank);
            }
            TaskStatus::Pending
                if rank.is_user()
                    && (!self.heap.is_full() || self.heap.worst_automatic().is_some()) =>
            {
                // A user scan waiting outside a full heap gets in now by evicting.
                self.pending = self.pending.saturating_sub(1);
                if let Ok(status) = self.place(c, st, uuid, rank, false, naive(now))? {
                    row.status = status.as_str().to_owned();
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
        if let Some(other) = st.waiting_by_hash.get(&task.hash)
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
        let status = match self.place(c, st, task.id, rank_of(&row), false, naive(now))? {
            Ok(status) => status,
            Err(e) => return Ok(Err(e)),
        };
        row.status = status.as_str().to_owned();
        if let Some(hash) = &row.hash {
            st.waiting_by_hash.insert(hash.clone(), id.to_owned());
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
    fn place(
        &mut self,
        c: &mut AnyConnection,
        st: &mut BatchState,
        id: Uuid,
        rank: Rank,
        allow_reject: bool,
        now: NaiveDateTime,
    ) -> Result<Result<TaskStatus, QueueError>, StorageError> {
        if !self.heap.is_full() {
            self.heap.insert(id, rank);
            return Ok(Ok(TaskStatus::Queued));
        }
        if rank.is_user()
            && let Some((victim, _)) = self.heap.worst_automatic()
        {
            self.heap.remove(&victim);
            self.demote(c, st, victim, now)?;
            self.heap.insert(id, rank);
            return Ok(Ok(TaskStatus::Queued));
        }
        if allow_reject && !rank.is_user() && self.limits.when_full == WhenFull::Reject {
            return Ok(Err(QueueError::QueueFull(self.scheduler)));
        }
        self.pending += 1;
        Ok(Ok(TaskStatus::Pending))
    }

    /// Moves an evicted task from `queued` to `pending`.
    fn demote(
        &mut self,
        c: &mut AnyConnection,
        st: &mut BatchState,
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
        self.pending += 1;
        debug!(task.id = %victim, scheduler.id = %self.scheduler, "evicted to pending by a user scan");
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

    fn lease(&self, now: DateTime<Utc>, status: TaskStatus) -> Option<NaiveDateTime> {
        let ttl = match status {
            TaskStatus::Dispatched => self.limits.dispatch_timeout,
            TaskStatus::Running => self.limits.run_timeout,
            _ => return None,
        };
        chrono::Duration::from_std(ttl)
            .ok()
            .and_then(|ttl| now.checked_add_signed(ttl))
            .map(naive)
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
        if row.scheduler_id != self.scheduler.as_str() {
            // Routed by the task's scheduler, so this only happens if the row changed hands.
            return Ok(Err(QueueError::TaskNotFound(id)));
        }
        let from = row.status()?;
        let mut changed = false;
        if let Some(p) = patch.priority
            && p != row.priority
        {
            row.priority = p;
            if from == TaskStatus::Queued {
                self.heap.rerank(&id, rank_of(&row));
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
                        self.heap.remove(&id);
                    }
                    TaskStatus::Pending => {
                        self.pending = self.pending.saturating_sub(1);
                    }
                    _ => {}
                }
                let status = if to == TaskStatus::Queued {
                    match self.place(c, st, id, rank_of(&row), false, naive(now))? {
                        Ok(status) => status,
                        Err(e) => return Ok(Err(e)),
                    }
                } else {
                    to
                };
                row.status = status.as_str().to_owned();
                row.lease_expires_at = self.lease(now, status);
                changed = true;
            } else if to == TaskStatus::Running {
                // A repeated `running` is a heartbeat: it renews the lease.
                row.lease_expires_at = self.lease(now, TaskStatus::Running);
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

    // ---------------------------------------------------------------- leases

    /// Re-queues (attempts + 1) or fails those of `ids` whose lease has ended. The watchdog found
    /// them with a read outside this transaction, so each is checked again here: a task finished
    /// or renewed since is left alone.
    fn expire(
        &mut self,
        c: &mut AnyConnection,
        st: &mut BatchState,
        ids: &[String],
        now: DateTime<Utc>,
    ) -> Result<Done, StorageError> {
        let mut report = ExpiryReport::default();
        let missing: Vec<String> = ids
            .iter()
            .filter(|id| !st.rows.contains_key(*id))
            .cloned()
            .collect();
        for row in tasks::get_many(c, &missing)? {
            st.rows.insert(row.id.clone(), row);
        }
        let candidates: Vec<TaskRow> = ids
            .iter()
            .filter_map(|id| st.rows.get(id).cloned())
            .collect();
        for mut row in candidates {
            let held = row.status()?;
            let ended = row.lease_expires_at.is_some_and(|at| at < naive(now));
            if !matches!(held, TaskStatus::Dispatched | TaskStatus::Running)
                || !ended
                || row.scheduler_id != self.scheduler.as_str()
            {
                continue;
            }
            let id = row.uuid()?;
            row.attempts = row.attempts.saturating_add(1);
            row.lease_expires_at = None;
            row.modified_at = naive(now);
            let max = self.limits.max_attempts;
            if u32::try_from(row.attempts).unwrap_or(u32::MAX) >= max {
                row.status = TaskStatus::Failed.as_str().to_owned();
                row.failure_reason = Some(format!(
                    "lease expired while {held}, {} of {max} attempts used",
                    row.attempts
                ));
                report.failed.push(id);
                warn!(task.id = %id, scheduler.id = %self.scheduler, attempts = row.attempts, "lease expired; attempts used up, task failed");
            } else {
                let status = match self.place(c, st, id, rank_of(&row), false, naive(now))? {
                    Ok(status) => status,
                    Err(e) => return Ok(Err(e)),
                };
                row.status = status.as_str().to_owned();
                row.failure_reason = Some(format!("lease expired while {held}"));
                report.requeued.push(id);
                info!(task.id = %id, scheduler.id = %self.scheduler, attempts = row.attempts, "lease expired; task queued again");
            }
            self.save(c, st, row)?;
        }
        Ok(Ok(Answer::Expired(report)))
    }

    // ---------------------------------------------------------------- pops

    fn apply_pops(
        &mut self,
        c: &mut AnyConnection,
        pops: &[(usize, usize, Option<&FilterNode>)],
        now: DateTime<Utc>,
        done: &mut [Option<Done>],
    ) -> Result<(), StorageError> {
        let at = naive(now);
        let lease = self.lease(now, TaskStatus::Dispatched);
        // Unfiltered pops come straight off the heap and are dispatched in one statement.
        let mut claims: Vec<(usize, Vec<String>)> = Vec::new();
        let mut all: Vec<String> = Vec::new();
        for &(i, limit, filter) in pops {
            if filter.is_some() {
                continue;
            }
            let heap = &mut self.heap;
            let ids: Vec<String> = std::iter::from_fn(|| heap.pop_best())
                .take(limit)
                .map(|(id, _)| id.to_string())
                .collect();
            all.extend(ids.iter().cloned());
            claims.push((i, ids));
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
                    lease,
                )?
                .into_iter()
                .map(|r| (r.id.clone(), r))
                .collect()
            };
            for (i, ids) in claims {
                let rows: Vec<TaskRow> = ids.iter().filter_map(|id| by_id.remove(id)).collect();
                if rows.len() < ids.len() {
                    warn!(
                        scheduler.id = %self.scheduler,
                        missing = ids.len() - rows.len(),
                        "heap held tasks the table no longer has queued; skipped"
                    );
                }
                done[i] = Some(Ok(Answer::Tasks(rows)));
            }
        }
        // Filtered pops select in SQL, in pop order, and take the rows out of the heap.
        for &(i, limit, filter) in pops {
            let Some(filter) = filter else { continue };
            let mut rows = tasks::dispatch_matching(c, self.scheduler, filter, limit, at, lease)?;
            for row in &rows {
                self.heap.remove(&parse_uuid(&row.id)?);
            }
            rows.sort_by(|a, b| {
                (a.priority, a.created_at, &a.id).cmp(&(b.priority, b.created_at, &b.id))
            });
            done[i] = Some(Ok(Answer::Tasks(rows)));
        }
        self.gauges.touch(self.scheduler, now);
        Ok(())
    }

    // ---------------------------------------------------------------- refill

    /// Moves the best pending tasks into the heap while it has room.
    fn refill(&mut self, c: &mut AnyConnection, now: NaiveDateTime) -> Result<(), StorageError> {
        while self.pending > 0 && self.heap.room() > 0 {
            let want = self.heap.room().min(REFILL_BATCH);
            let keys = tasks::best_pending(c, self.scheduler, want)?;
            if keys.len() < want {
                // Fewer than counted: the count drifted (e.g. another writer); trust the table.
                self.pending = keys.len() as u64;
            }
            if keys.is_empty() {
                break;
            }
            let ids: Vec<String> = keys.iter().map(|k| k.id.clone()).collect();
            let moved =
                tasks::transition(c, &ids, TaskStatus::Pending, TaskStatus::Queued, now, None)?;
            for row in &moved {
                self.heap.insert(parse_uuid(&row.id)?, rank_of(row));
            }
            self.pending = self.pending.saturating_sub(moved.len() as u64);
            if moved.is_empty() {
                break;
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
    let wrong = || QueueError::Internal("command answered with the wrong shape".into());
    match cmd {
        Command::Push { reply, .. } => {
            let _ = reply.send(done.and_then(|a| match a {
                Answer::Task { row, created } => Ok(PushOutcome {
                    task: row.into_task()?,
                    created,
                }),
                _ => Err(wrong()),
            }));
        }
        Command::Pop { reply, .. } => {
            let _ = reply.send(done.and_then(|a| {
                match a {
                    Answer::Tasks(rows) => rows
                        .into_iter()
                        .map(|r| r.into_task().map_err(QueueError::from))
                        .collect(),
                    _ => Err(wrong()),
                }
            }));
        }
        Command::Patch { reply, .. } => {
            let _ = reply.send(done.and_then(|a| match a {
                Answer::Task { row, .. } => Ok(row.into_task()?),
                _ => Err(wrong()),
            }));
        }
        Command::Expire { reply, .. } => {
            let _ = reply.send(done.and_then(|a| match a {
                Answer::Expired(report) => Ok(report),
                _ => Err(wrong()),
            }));
        }
        Command::Shutdown => {}
    }
}
