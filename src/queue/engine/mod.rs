//! An engine: the one thread that changes one scheduler's queue.
//!
//! Each scheduler has its own engine, state and database connection, so the three schedulers'
//! transactions run side by side and PostgreSQL merges their commits. An engine takes every
//! command waiting in its channel (up to `max_batch`) and applies them as one batch:
//!
//! 1. **read** the rows the batch may meet ([`push::reads`], the tasks patched or expired, and
//!    the work waiting that tasks coming back to wait meet, [`rejoin::reads`]);
//! 2. **decide**, in memory, rule by rule: pushes ([`push`]), patches ([`patch`]), lease expiry
//!    ([`lease`]), cancellations of a deleted object's tasks ([`cancel`]), pops ([`pop`]), each placing tasks through [`place`]
//!    (a task coming back to wait first takes the place of the same work waiting, [`rejoin`]); a pop may read pending
//!    tasks or payloads through [`pop::Reads`]. The rules change the state and record what became
//!    of each row in [`batch::BatchRows`]; they never write;
//! 3. **write** what the batch decided (one statement per kind of write: inserts, updates, the
//!    heap tasks dispatched), in one transaction (or one autocommitted statement when that is
//!    all it takes: on PostgreSQL a batch of pops and patches is one statement with the
//!    multi-instance fence inside it, [`tasks::fenced`]);
//! 4. **answer** each caller, only after the commit is durable: with
//!    `database.flush_barrier`, the commit does not wait for the disk and the answers wait for
//!    a flush barrier shared by all engines ([`flush`]) while the engine goes on;
//! 5. **upkeep**, off the callers' path: a recount of the pending backlog after drift, a
//!    [`refill`] of the heap ahead of need in a transaction of its own (on PostgreSQL on a
//!    connection and thread of its own, beside the pops the heap serves), `ANALYZE` after bulk
//!    changes (on a thread of its own).
//!
//! Requests that arrive while a commit is in flight wait in the channel and form the next batch,
//! so commits are grouped without any timer. If a batch fails, the state may hold changes that
//! were not committed: the engine rebuilds it from the table ([`rebuild`]) before the next
//! batch, and retries the failed batch's commands one by one, so one bad command cannot fail the
//! others. A lost database is answered 503 at once until it returns.

mod backlog;
mod batch;
mod cancel;
pub(crate) mod command;
mod explain;
mod flush;
use self::flush::write_turn;
mod in_flight;
mod lease;
mod leases;
mod patch;
mod place;
mod pop;
mod push;
mod read_ahead;
mod rebuild;
mod refill;
mod rejoin;
mod rescore;
mod state;
#[cfg(test)]
mod testing;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::Connection;
use tracing::{debug, error, info, warn};
use uuid::Uuid;

use self::batch::{BatchRows, Writes};
use self::command::{Batch, Command};
use self::in_flight::InFlight;
pub(crate) use self::in_flight::Routes;
use self::pop::Reads;
pub use self::refill::REFILL_BATCH;
use self::state::QueueState;
use super::gauges::Gauges;
use super::types::{ExpiryReport, PushOutcome, QueueConfig, QueueError};
use crate::clock::SharedClock;
use crate::domain::filter::FilterNode;
use crate::domain::keys::KeyField;
use crate::domain::{PerScheduler, SchedulerId, Task, TaskStatus};
use crate::metrics::{ByStatus, status_slot};
use crate::ownership::Ownership;
use crate::storage::rows::{HeapRow, TaskRow};
use crate::storage::{
    self, AnyConnection, Backend, DbPool, StorageError, WriterConn, owners, tasks,
};

/// After the database was found unreachable, commands are answered 503 at once for this long
/// before the next connection attempt, so an outage costs callers no wait beyond one connect
/// timeout.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

/// A kept connection idle this long is checked (`SELECT 1`) before a batch uses it: a server
/// restart, a failover or an administrator's `pg_terminate_backend` closes idle connections, and
/// a dead one found this way costs no request. A busy engine never pays for the check.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Queue rows an engine writes or deletes (pending tasks pushed or evicted, refilled, taken) before it refreshes the planner's
/// statistics of the queue tables, or a fifth of its scheduler's waiting tasks when that is
/// more: a bulk push, an import, a ColdStart batch, a rebuild or a long run of refills changes
/// what the API's listings and counts are planned from (the engine's own statements do not
/// depend on it: see `storage::WriterConn::checkout_engine`). PostgreSQL's autovacuum, where it
/// runs, analyses after a tenth of a table changed, but only on its next round.
const ANALYSE_AFTER: u64 = 20_000;

/// Connections a step of a batch is tried on at most when each breaks under it (the server
/// closed it, a network fault): the engine's own, then fresh ones. More than one fresh one,
/// because a server ending its sessions ends them one after another, and the pool may hand out
/// one it has not reached yet.
const CONNECTION_ATTEMPTS: u32 = 3;

/// Runs a step of a batch (`step`: the connection, the attempt from 1, and a flag it sets once
/// only its `COMMIT` is left) on `conn` and, each time the connection breaks before that point,
/// again on a fresh one, up to [`CONNECTION_ATTEMPTS`] in all; `message` is logged at each
/// break. What a step that ran but whose `COMMIT` broke did is not known here: it fails, and the
/// batch with it (a step that can tell, like the fenced write, never sets the flag and finds
/// out in its later attempts).
fn on_fresh_after_break<T>(
    conn: &mut WriterConn,
    fresh: (&DbPool, bool),
    at: (SchedulerId, &str, &str),
    mut step: impl FnMut(&mut AnyConnection, u32, &mut bool) -> Result<T, StorageError>,
) -> Result<T, StorageError> {
    let (scheduler, operation, message) = at;
    let mut attempt = 1;
    loop {
        let mut ran = false;
        let e = match step(conn, attempt, &mut ran) {
            Err(e) if !ran && e.is_connection_lost() && attempt < CONNECTION_ATTEMPTS => e,
            other => return other,
        };
        warn!(scheduler.id = %scheduler, operation, attempt, error = %e, "{message}");
        attempt += 1;
        let broken = conn.session().cloned();
        // The fresh connection's own set-up may meet the same end.
        loop {
            match WriterConn::checkout_engine(fresh.0, fresh.1) {
                Ok(mut c) => {
                    // The broken connection's session may still run on the server (a cut on the
                    // client's side alone): it is ended before anything is read or sent again.
                    if let Some(s) = &broken {
                        c.end_session(s)?;
                    }
                    *conn = c;
                    break;
                }
                Err(e) if e.is_connection_lost() && attempt < CONNECTION_ATTEMPTS => {
                    warn!(scheduler.id = %scheduler, operation, attempt, error = %e, "{message}");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Reads the rows `ids` names and `scheduler`'s waiting tasks of `hashes` (those by id first: a
/// row already known keeps its batch state), on a fresh connection when this one breaks.
fn read_named(
    conn: &mut WriterConn,
    fresh: (&DbPool, bool),
    scheduler: SchedulerId,
    ids: &[String],
    hashes: &[String],
) -> Result<Vec<TaskRow>, StorageError> {
    on_fresh_after_break(
        conn,
        fresh,
        (
            scheduler,
            "read",
            "the database connection broke; reading again on a fresh one",
        ),
        |c, _, _| {
            let mut rows = match ids.is_empty() {
                true => Vec::new(),
                false => tasks::get_many(c, ids)?,
            };
            if !hashes.is_empty() {
                rows.extend(tasks::waiting_by_hash(c, scheduler, hashes)?);
            }
            Ok(rows)
        },
    )
}

/// Batches in a row the database may refuse while giving back the same undelivered pops before
/// they are left to their leases.
const GIVE_BACK_REFUSALS: u32 = 3;

/// How often an engine with nothing to do looks for tasks whose pop answers went undelivered
/// after a flush barrier.
const GIVE_BACK_POLL: Duration = Duration::from_millis(100);

/// How often an engine with nothing to do looks whether its refill ahead has ended, to take its
/// tasks in (a refill of a thousand tasks takes a few to a hundred milliseconds).
const REFILL_POLL: Duration = Duration::from_millis(2);

/// The running engines; stops them in order.
pub struct EngineHandle {
    engines: Vec<(SyncSender<Command>, JoinHandle<()>)>,
    /// The flush thread, which stops once every engine has.
    flush: Option<JoinHandle<()>>,
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
        if let Some(join) = self.flush
            && join.join().is_err()
        {
            error!("the WAL flush thread panicked");
        }
    }
}

/// Starts one engine per scheduler, each rebuilding its state first (in parallel); returns their
/// channels once all are ready, or the first rebuild error.
pub(crate) fn start_all(
    pool: &DbPool,
    backend: Backend,
    clock: &SharedClock,
    config: &QueueConfig,
    gauges: &Arc<Gauges>,
    routes: &Arc<Routes>,
    ownership: Option<&Arc<Ownership>>,
) -> Result<(PerScheduler<SyncSender<Command>>, EngineHandle), StorageError> {
    let mut engines = Vec::new();
    let mut ready = Vec::new();
    // SQLite has one writer at a time, and a transaction that read before it writes fails at
    // once (not after busy_timeout) if another connection wrote in between. So on SQLite the
    // engines take turns writing; PostgreSQL lets them write side by side.
    let write_lock = (backend == Backend::Sqlite).then(|| Arc::new(Mutex::new(())));
    let (flush, flush_join) = if config.flush_barrier {
        let (f, join) = flush::Flush::start(pool.clone(), write_lock.clone())
            .map_err(|e| StorageError::Unavailable(format!("cannot start a thread: {e}")))?;
        (Some(f), Some(join))
    } else {
        (None, None)
    };
    for s in SchedulerId::ALL {
        let (tx, rx) = std::sync::mpsc::sync_channel(config.channel_capacity);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let mut engine = Engine {
            state: QueueState::new(s, config.limits[s].clone()),
            pool: pool.clone(),
            write_lock: write_lock.clone(),
            conn: None,
            conn_used: Instant::now(),
            clock: clock.clone(),
            max_batch: config.max_batch.max(1),
            shed_after: config.shed_after,
            gauges: gauges.clone(),
            routes: routes.clone(),
            in_flight: InFlight::default(),
            recent_filters: explain::RecentFilters::default(),
            dirty: true,
            down_since: None,
            undelivered: Vec::new(),
            giving_back: Vec::new(),
            popping: Vec::new(),
            give_back_failed: false,
            give_back_refusals: 0,
            broken_session: None,
            flush: flush.clone(),
            given_back: Arc::default(),
            barrier_failed: Arc::default(),
            ownership: ownership.cloned(),
            epoch: 0,
            changed_since_analyse: 0,
            created_since_stats: 0,
            refilling: None,
            refill_failed_at: None,
            analysing: None,
            settled: refill::Settled::default(),
            read_ahead: read_ahead::ReadAhead::default(),
            stale_queue_rows: Vec::new(),
            aside: Vec::new(),
        };
        let join = std::thread::Builder::new()
            .name(format!("engine-{s}"))
            .spawn(move || {
                // A scheduler another instance owns is built when this one takes it over.
                let result = if engine.owned() {
                    engine.rebuild()
                } else {
                    Ok(())
                };
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
    drop(flush);
    let handle = EngineHandle {
        engines,
        flush: flush_join,
    };
    if let Some(e) = first_error {
        handle.shutdown();
        return Err(e);
    }
    match PerScheduler::try_from(senders) {
        Ok(senders) => Ok((senders, handle)),
        Err(_) => {
            handle.shutdown();
            Err(StorageError::Unavailable("engine count".into()))
        }
    }
}

struct Engine {
    state: QueueState,
    pool: DbPool,
    /// Held for each transaction when the database takes one writer at a time (SQLite).
    write_lock: Option<Arc<Mutex<()>>>,
    /// The engine's own connection, kept between batches; dropped after a failure so the next
    /// batch starts on a fresh one.
    conn: Option<WriterConn>,
    /// When the kept connection was last taken for use.
    conn_used: Instant,
    clock: SharedClock,
    max_batch: usize,
    /// Commands that waited longer than this are answered 503 without being applied.
    shed_after: Duration,
    gauges: Arc<Gauges>,
    /// Which scheduler each task in flight belongs to, shared with the API side.
    routes: Arc<Routes>,
    /// This engine's tasks in flight, as committed.
    in_flight: InFlight,
    /// The state may hold changes a failed batch did not commit.
    dirty: bool,
    /// When the database was last found unreachable.
    down_since: Option<Instant>,
    /// Tasks popped and committed whose caller had gone when the answer was ready: they go back
    /// to the queue in the next batch instead of waiting out their lease.
    undelivered: Vec<Uuid>,
    /// The undelivered tasks the batch being applied gives back, and the tasks its pops took:
    /// a batch that fails with its outcome unknown (a lost connection, the database away) hands
    /// both to the next batch's give-back, which requeues those its table rows show
    /// `dispatched` (the pops' callers were answered 503; nobody holds those tasks).
    giving_back: Vec<Uuid>,
    popping: Vec<Uuid>,
    /// A batch that gave tasks back failed: the next try waits a moment rather than spinning.
    give_back_failed: bool,
    /// Batches in a row that the database refused while they gave tasks back: past
    /// [`GIVE_BACK_REFUSALS`], the give-backs are left to their leases.
    give_back_refusals: u32,
    /// The server session of a connection a batch broke on, to end before the next.
    broken_session: Option<storage::Session>,
    /// The flush barrier the answers wait for (with `database.flush_barrier`).
    flush: Option<flush::Flush>,
    /// Undelivered pops found after a flush barrier, by the flush thread.
    given_back: Arc<Mutex<Vec<(Uuid, i64)>>>,
    /// Set by the flush thread when a barrier failed: the batches it covered may be lost with
    /// the server's buffers (a crash), while the state holds them; it is rebuilt from the table.
    barrier_failed: Arc<std::sync::atomic::AtomicBool>,
    /// Who owns which scheduler, when several instances share the database (PostgreSQL).
    ownership: Option<Arc<Ownership>>,
    /// The epoch the state was built under; 0 while another instance owns the scheduler.
    epoch: i64,
    /// The filters runners popped with lately, to explain a wait by them.
    recent_filters: explain::RecentFilters,
    /// Queue rows written or deleted since the planner's statistics were last refreshed
    /// ([`ANALYSE_AFTER`]): a pop or a patch of a queued task writes none.
    changed_since_analyse: u64,
    /// Tasks created since the listed tables' statistics were last checked
    /// ([`storage::statistics`], every [`ANALYSE_AFTER`]).
    created_since_stats: u64,
    /// The refill ahead under way on a connection of its own (PostgreSQL; [`refill::Ahead`]).
    refilling: Option<refill::Ahead>,
    /// When a refill ahead's read last failed: none starts for [`RECONNECT_PAUSE`] after it.
    refill_failed_at: Option<Instant>,
    /// The `ANALYZE` under way on a connection of its own.
    analysing: Option<JoinHandle<()>>,
    /// What a refill a pop waited for came to, counted after its batch.
    settled: refill::Settled,
    /// Pending tasks read ahead for the filters pops searched the backlog with.
    read_ahead: read_ahead::ReadAhead,
    /// Pending tasks a pop's write skipped (no longer pending in the table), whose queue rows
    /// the upkeep deletes if their task is still not pending.
    stale_queue_rows: Vec<String>,
    /// Pops set aside until the refill under way has ended (it reads what their search would meet),
    /// and pops whose every task a batch's write skipped (to be decided again), in the order they
    /// came; they join the first batch with no refill under way ([`Engine::aside_ready`]).
    aside: Vec<PopCommand>,
}

/// A pop as the engine receives it.
type PopCommand = command::Request<command::PopRequest, Vec<Task>>;

/// What a committed batch came to.
struct Applied {
    decisions: Decisions,
    /// The rows to answer from.
    rows: HashMap<Uuid, TaskRow>,
    /// Statements written.
    statements: usize,
    /// Task rows written, by the status they were written in.
    moved: ByStatus,
    /// Queue rows written or deleted (pending tasks only have one), for [`ANALYSE_AFTER`].
    queue_rows: u64,
    /// Tasks created, for [`ANALYSE_AFTER`].
    created: u64,
    /// Pending tasks popped from the backlog that the write skipped: the table no longer held
    /// them pending.
    skipped_pending: Vec<String>,
    /// The batch's pops set aside until the refill under way has ended, by their place in it.
    set_aside: Vec<usize>,
    /// Tasks its pops took from the pending backlog, and the searches of the backlog's indexes
    /// they made.
    backlog: [u64; 2],
}

/// What a batch decided, per command, before it is written.
#[derive(Default)]
struct Decisions {
    pushes: Vec<Vec<Result<(Uuid, bool), QueueError>>>,
    patches: Vec<Result<Uuid, QueueError>>,
    expiries: Vec<Result<ExpiryReport, QueueError>>,
    cancels: Vec<Vec<Uuid>>,
    pops: Vec<Vec<Uuid>>,
    rescores: Vec<usize>,
    /// Pending tasks the batch's refill moved into the heap.
    refilled: usize,
}

/// The pop rule's view of the table, on the engine's connection.
struct TableReads<'a> {
    conn: &'a mut WriterConn,
    /// Where a fresh connection comes from when the engine's breaks during a read.
    pool: &'a DbPool,
    /// Whether the engine's connections commit without waiting for the disk.
    unsynced: bool,
    scheduler: SchedulerId,
    /// The refill ahead under way, which a pop about to search the backlog waits for.
    refill: &'a mut Option<refill::Ahead>,
    /// What the refill a pop waited for came to.
    settled: &'a mut refill::Settled,
    /// Pending tasks read ahead for pops' filters ([`read_ahead`]).
    ahead: &'a mut read_ahead::ReadAhead,
    /// Whether reads may be kept and served ahead: the batch holds nothing but pops, so nothing
    /// in it adds or changes a pending row the table would not show yet.
    keep: bool,
    /// The last pop decided was set aside until the refill under way has ended.
    set_aside: bool,
    /// Searches of the backlog's indexes for pops (reads ahead included).
    searches: u64,
}

impl TableReads<'_> {
    /// Runs `read` on the engine's connection and, where the server closed that connection or
    /// the network broke it, again on a fresh one ([`on_fresh_after_break`]). A read changes
    /// nothing, so reading again is safe; answering the batch 503 would send every runner in it
    /// to sleep for its poll interval with work waiting.
    fn read<T>(
        &mut self,
        read: impl Fn(&mut AnyConnection, SchedulerId) -> Result<T, StorageError>,
    ) -> Result<T, StorageError> {
        let s = self.scheduler;
        on_fresh_after_break(
            self.conn,
            (self.pool, self.unsynced),
            (
                s,
                "search",
                "the database connection broke; reading again on a fresh one",
            ),
            |c, _, _| read(c, s),
        )
    }
}

impl Reads for TableReads<'_> {
    fn pending_matching(
        &mut self,
        lookup: Option<(KeyField, &[String])>,
        filter: &FilterNode,
        limit: usize,
        skip: &[String],
    ) -> Result<Vec<TaskRow>, StorageError> {
        self.read(|c, s| Ok(tasks::pending_matching(c, s, lookup, filter, limit, skip)?))
    }

    fn pending_to_pop(&mut self, s: &backlog::Search<'_>) -> Result<Vec<HeapRow>, StorageError> {
        // A search without a key field (a probe of the backlog's head only) is read as it is.
        match s.lookup {
            // A batch of pops and patches of tasks in flight reads ahead ([`read_ahead`]).
            Some(lookup) if self.keep => {
                let now = Instant::now();
                if let Some(rows) = self.ahead.serve(lookup, s.filter, s.limit, s.skip, now) {
                    return Ok(rows);
                }
                let wide = backlog::Search {
                    limit: read_ahead::ReadAhead::wanted(s.limit),
                    ..*s
                };
                self.searches += 1;
                let found = self.read(|c, sch| backlog::search(c, sch, &wide))?;
                Ok(self
                    .ahead
                    .keep(lookup, s.filter, s.limit, s.skip, found, now))
            }
            _ => {
                self.searches += 1;
                self.read(|c, sch| backlog::search(c, sch, s))
            }
        }
    }

    fn taken(&mut self, id: &str) {
        self.ahead.taken(id);
    }

    fn payloads(&mut self, ids: &[Uuid]) -> Result<HashMap<Uuid, String>, StorageError> {
        let ids: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        Ok(self
            .read(|c, _| Ok(tasks::payloads(c, &ids)?))?
            .into_iter()
            .filter_map(|r| Uuid::parse_str(&r.id).ok().map(|id| (id, r.data)))
            .collect())
    }

    fn settle_refill(&mut self, st: &mut QueueState) -> Result<bool, StorageError> {
        refill::settle_into(st, self.refill, self.settled, self.ahead)
    }

    fn set_aside(&mut self) -> bool {
        self.set_aside = self.refill.is_some();
        self.set_aside
    }
}

impl Engine {
    fn scheduler(&self) -> SchedulerId {
        self.state.scheduler
    }

    fn run(mut self, rx: Receiver<Command>) {
        loop {
            let back = std::mem::take(
                &mut *self
                    .given_back
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            // Only what was popped under the epoch the engine holds now goes back: after a
            // change of owner those tasks' leases are the table's, which expire them.
            let (now, earlier): (Vec<_>, Vec<_>) = back
                .into_iter()
                .partition(|(_, epoch)| *epoch == self.epoch);
            self.undelivered.extend(now.into_iter().map(|(id, _)| id));
            if !earlier.is_empty() {
                debug!(scheduler.id = %self.scheduler(), "undelivered pops of an earlier ownership left to their leases");
            }
            let first = if self.undelivered.is_empty() && !self.aside_ready() {
                // The flush thread may find undelivered pops while nothing else arrives, and a
                // refill ahead's tasks are taken in as soon as it ends.
                let poll = match (self.flush.is_some(), self.refilling.is_some()) {
                    (_, true) => Some(REFILL_POLL),
                    (true, false) => Some(GIVE_BACK_POLL),
                    (false, false) => None,
                };
                if let Some(poll) = poll {
                    match rx.recv_timeout(poll) {
                        Ok(cmd) => Some(cmd),
                        Err(RecvTimeoutError::Timeout) => {
                            self.settle_refill(false);
                            if self.aside_ready() {
                                self.process(Batch::default());
                            }
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                } else {
                    match rx.recv() {
                        Ok(cmd) => Some(cmd),
                        Err(_) => break,
                    }
                }
            } else if self.down_since.is_some() || self.give_back_failed || !self.owned() {
                // Answers went undelivered, but they cannot be given back now (the database is
                // away, the last try failed, or another instance serves the scheduler): wait for
                // work rather than spin.
                match rx.recv_timeout(GIVE_BACK_POLL) {
                    Ok(cmd) => Some(cmd),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                // Answers went undelivered, or pops set aside may go now: with whatever is waiting.
                match rx.try_recv() {
                    Ok(cmd) => Some(cmd),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => break,
                }
            };
            let mut batch = Batch::default();
            let mut stop = false;
            let mut next = first;
            while let Some(cmd) = next.take() {
                if matches!(cmd, Command::Shutdown) {
                    stop = true;
                } else {
                    batch.add(cmd);
                }
                if batch.len() < self.max_batch {
                    next = rx.try_recv().ok();
                }
            }
            self.process(batch);
            if stop {
                break;
            }
        }
        self.settle_refill(true);
        // Tasks whose answers went undelivered go back before the engine stops, not a lease
        // later.
        if !self.aside.is_empty() || !self.undelivered.is_empty() {
            self.process(Batch::default());
        }
        if let Some(join) = self.analysing.take()
            && join.join().is_err()
        {
            error!(scheduler.id = %self.scheduler(), "the thread analysing the queue tables panicked");
        }
        debug!(scheduler.id = %self.scheduler(), "queue engine stopped");
    }

    /// Whether this instance owns the scheduler now. On a change of epoch the state is dropped
    /// (lost: another instance serves it) or marked for a rebuild from the table (taken over:
    /// the former owner's last commits are in the table, its heap is not).
    fn owned(&mut self) -> bool {
        let Some(own) = &self.ownership else {
            return true;
        };
        let now = own.epoch(self.scheduler());
        if now != self.epoch {
            self.epoch = now;
            self.dirty = true;
            // Whatever it moved is in the table, where the next owner's rebuild reads it; pops
            // whose answers went undelivered are left to their leases there.
            self.undelivered.clear();
            self.give_back_refusals = 0;
            self.forget_refill();
            if now == 0 {
                let s = self.scheduler();
                self.state = QueueState::new(s, self.state.limits.clone());
                self.in_flight.clear(&self.routes);
                self.undelivered.clear();
                self.publish();
                info!(scheduler.id = %s, "heap dropped: another instance owns this scheduler");
            }
        }
        now != 0
    }

    /// The fence a batch checks in its transaction: (instance, epoch), or none when this
    /// instance runs alone.
    fn fence(&self) -> Option<(Arc<Ownership>, i64)> {
        self.ownership.as_ref().map(|o| (o.clone(), self.epoch))
    }

    /// The engine's connection; with a flush barrier its commits do not wait for the disk. A
    /// kept connection that sat idle is checked first and replaced when the server closed it.
    fn connection(&mut self) -> Result<WriterConn, StorageError> {
        let idle = self.conn_used.elapsed();
        self.conn_used = Instant::now();
        match self.conn.take() {
            Some(mut c) if idle >= IDLE_CHECK => match storage::ping(&mut c) {
                Ok(()) => Ok(c),
                Err(e) => {
                    info!(scheduler.id = %self.scheduler(), error = %e, idle_ms = idle.as_millis() as u64, "the kept database connection was closed while idle; a fresh one replaces it");
                    drop(c);
                    WriterConn::checkout_engine(&self.pool, self.flush.is_some())
                }
            },
            Some(c) => Ok(c),
            None => {
                let mut c = WriterConn::checkout_engine(&self.pool, self.flush.is_some())?;
                // A batch that broke with its outcome unknown left its session, which may still
                // be running on the server: it ends before the rebuild reads the table.
                if let Some(s) = self.broken_session.take()
                    && let Err(e) = c.end_session(&s)
                {
                    self.broken_session = Some(s);
                    return Err(e);
                }
                Ok(c)
            }
        }
    }

    /// Rebuilds the state from the table.
    fn rebuild(&mut self) -> Result<(), StorageError> {
        // A refill under way commits its moves while the table is read, or not: wait for it.
        self.forget_refill();
        self.read_ahead.forget();
        let lock = self.write_lock.clone();
        let _turn = write_turn(lock.as_ref());
        let started = Instant::now();
        let now = self.clock.now().naive_utc();
        let mut conn = self.connection()?;
        let (fence, s) = (self.fence(), self.scheduler());
        let state = &mut self.state;
        let result = conn.transaction::<_, StorageError, _>(|c| {
            // It reads the whole queue before its first write: on SQLite a write committed by
            // another connection meanwhile (the listener's frontier, a schedule) would fail
            // that write at once.
            storage::begin_write(c)?;
            // A rebuild writes too (its refill settles pending rows `queued`, its demotions
            // write them back): fenced like a batch, so a former owner that has not yet heard it
            // lost the scheduler (its ownership round cannot reach the database either) does not
            // move the new owner's rows under it.
            if let Some((own, epoch)) = &fence
                && !owners::holds(c, s, own.instance(), *epoch)?
            {
                return Err(StorageError::Fenced(s));
            }
            rebuild::rebuild(c, state, now)
        });
        self.in_flight.clear(&self.routes);
        if let Err(e) = result {
            self.dirty = true;
            if let StorageError::Fenced(s) = &e {
                self.conn = Some(conn);
                if let Some(own) = &self.ownership {
                    own.lost(*s, self.epoch);
                }
                self.owned();
            }
            return Err(e);
        }
        self.conn = Some(conn);
        self.dirty = false;
        self.gauges.engine.rebuilds.fetch_add(1, Ordering::Relaxed);
        self.publish();
        // What the table went through before (a load, an import, another instance's work) is
        // not known: the whole backlog counts as changed, so a large one is analysed.
        self.changed_since_analyse = self.waiting();
        info!(
            scheduler.id = %self.scheduler(),
            queued = self.state.heap.len(),
            pending = self.state.pending.count(),
            in_flight = self.state.in_flight.len(),
            leased = self.state.leases.len(),
            heap_bytes = self.state.heap.heap_bytes(),
            duration_ms = started.elapsed().as_millis() as u64,
            "heaps rebuilt from the tasks table"
        );
        Ok(())
    }

    /// Tasks waiting in the heap and as pending.
    fn waiting(&self) -> u64 {
        self.state.heap.len() as u64 + self.state.pending.count()
    }

    /// What an engine does after it has answered a batch, off its callers' path: reads the
    /// pending count again after drift, refills the heap ahead of need, and refreshes the
    /// planner's statistics after bulk changes. A failure leaves the state to be rebuilt
    /// before the next batch, as a failed batch does.
    fn upkeep(&mut self) {
        if self.dirty || !self.owned() {
            return;
        }
        let s = self.scheduler();
        // A write that skipped a pending task marked the count for a recount (`drift`).
        if self.state.pending.needs_recount() {
            // Rows changed outside the scheduler: no read ahead is to be trusted.
            self.read_ahead.forget();
            // A queue row whose task was changed by hand is met by every search of the backlog
            // (which reads queue rows alone, `backlog`) until it is gone: deleted, if its task
            // is still not pending.
            let stale = std::mem::take(&mut self.stale_queue_rows);
            if !stale.is_empty() {
                let ids: Vec<&str> = stale.iter().map(String::as_str).collect();
                self.on_connection("stale queue rows", |c, _| {
                    Ok(tasks::forget_stale_queue_rows(c, &ids)?)
                });
            }
            // A refill under way changes what the count reads.
            self.settle_refill(true);
            if self.dirty {
                return;
            }
            let counted = self.on_connection("recount", |c, _| {
                Ok(tasks::count_waiting(c, s, TaskStatus::Pending)?)
            });
            if let Some(n) = counted {
                // The heap's tasks held as read are pending rows too.
                let n = n.saturating_sub(self.state.copies.len() as u64);
                warn!(scheduler.id = %s, pending = n, "pending tasks found that the count did not hold (rows changed outside the scheduler); counted again");
                self.state.pending = state::PendingSet::recounted(n);
                self.publish();
            }
        }
        let n = refill::ahead(&self.state);
        let paused = self
            .refill_failed_at
            .is_some_and(|at| at.elapsed() < RECONNECT_PAUSE);
        if n > 0 && self.refilling.is_none() && !paused {
            self.refill_ahead(n);
        }
        let queue = self.changed_since_analyse >= ANALYSE_AFTER.max(self.waiting() / 5);
        let listed = self.created_since_stats >= ANALYSE_AFTER;
        if (queue || listed) && self.analysing.as_ref().is_none_or(JoinHandle::is_finished) {
            self.analyse(queue, listed);
        }
    }

    /// Refreshes the planner's statistics on a pooled connection and thread of their own (tens
    /// of milliseconds, which the engine's callers would wait for on its thread, every second or
    /// two over a backlog): of the queue table after bulk changes to it (`queue`,
    /// [`storage::analyse`]), and of the tables the API lists from where many tasks were created
    /// (`listed`, [`storage::statistics::refresh`]). It changes no row the engine reads.
    fn analyse(&mut self, queue: bool, listed: bool) {
        let s = self.scheduler();
        let rows = match queue {
            true => std::mem::take(&mut self.changed_since_analyse),
            false => 0,
        };
        let created = match listed {
            true => std::mem::take(&mut self.created_since_stats),
            false => 0,
        };
        let pool = self.pool.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("analyse-{s}"))
            .spawn(move || {
                let began = Instant::now();
                let mut conn = match storage::checkout(&pool) {
                    Ok(c) => c,
                    Err(e) => {
                        warn!(scheduler.id = %s, rows, created, error = %e, "the planner's statistics could not be refreshed; tried again after the next bulk changes");
                        return;
                    }
                };
                if queue {
                    match storage::analyse(&mut conn) {
                        Ok(storage::Upkept::Vacuumed) => debug!(scheduler.id = %s, rows, duration_ms = began.elapsed().as_millis() as u64, "queue tables vacuumed and analysed after bulk changes (the server runs no autovacuum)"),
                        Ok(_) => debug!(scheduler.id = %s, rows, duration_ms = began.elapsed().as_millis() as u64, "queue tables analysed after bulk changes"),
                        Err(e) => warn!(scheduler.id = %s, rows, error = %e, "the queue tables' statistics could not be refreshed; tried again after the next bulk changes"),
                    }
                }
                if listed {
                    match storage::statistics::refresh(&mut conn) {
                        Ok(t) if t.is_empty() => {}
                        Ok(tables) => info!(scheduler.id = %s, created, ?tables, duration_ms = began.elapsed().as_millis() as u64, "tables the API lists from analysed (never analysed, or a tenth of their rows changed since)"),
                        Err(e) => warn!(scheduler.id = %s, created, error = %e, "the statistics of the tables the API lists from could not be refreshed; tried again after the next bulk changes"),
                    }
                }
            });
        match spawned {
            Ok(join) => self.analysing = Some(join),
            Err(e) => {
                self.changed_since_analyse += rows;
                self.created_since_stats += created;
                warn!(scheduler.id = %s, error = %e, "cannot start a thread to analyse the queue tables");
            }
        }
    }

    /// Reads the best `n` pending tasks into the heap ([`refill`]): on PostgreSQL on a connection
    /// and thread of its own while the engine goes on ([`refill::Ahead`]), on SQLite (one
    /// writer at a time, whose reads wait for it) here.
    fn refill_ahead(&mut self, n: usize) {
        let s = self.scheduler();
        if self.write_lock.is_none() && n >= refill::AHEAD_APART_MIN {
            let from = refill::ReadFrom::of(&self.state);
            match refill::Ahead::start(&self.pool, s, n, from, self.flush.is_some()) {
                Ok(ahead) => {
                    self.refilling = Some(ahead);
                    return;
                }
                Err(e) => {
                    warn!(scheduler.id = %s, error = %e, "cannot start a thread for the refill; refilling on the engine's");
                }
            }
        }
        let mut conn = match self.connection() {
            Ok(c) => c,
            Err(e) => {
                warn!(scheduler.id = %s, operation = "refill", error = %e, "no connection for the engine's upkeep; tried again after the next batch");
                return;
            }
        };
        // A read that fails (a locked SQLite file, a connection closed under it) changed
        // nothing, and nothing of it was taken in: the heap keeps what it holds, as after a
        // refill ahead's failed read, rather than being rebuilt from the table.
        let read = match refill::read(&mut conn, s, n, &refill::ReadFrom::of(&self.state)) {
            Ok(read) => read,
            Err(e) => {
                drop(conn);
                self.refill_failed(e, false);
                return;
            }
        };
        self.conn = Some(conn);
        let ids: Vec<String> = read.rows.iter().map(|r| r.id.clone()).collect();
        match refill::read_in(&mut self.state, read, n) {
            Ok(k) => {
                // The tasks read are in the heap now: a read ahead must not hand them out again.
                self.read_ahead.moved(ids.iter().map(String::as_str));
                self.took_refill(k);
            }
            Err(e) => self.refill_failed(StorageError::Corrupt(e.to_string()), true),
        }
    }

    /// Publishes the heap's size after a refill took `k` tasks in (it wrote none: their moves are
    /// counted when a pop or a batch writes them).
    fn took_refill(&mut self, k: usize) {
        if k == 0 {
            return;
        }
        self.publish();
    }

    /// Takes in the tasks of the refill ahead under way once it has ended (with `wait`, waits
    /// for it).
    fn settle_refill(&mut self, wait: bool) {
        let mut ended = self.refilling.take_if(|a| wait || a.is_finished());
        if self.dirty {
            // The state is rebuilt from the table, where the refill's moves are.
            drop(ended.map(refill::Ahead::wait));
            return;
        }
        if let Err(e) = refill::settle_into(
            &mut self.state,
            &mut ended,
            &mut self.settled,
            &mut self.read_ahead,
        ) {
            self.settled.failed = Some(e);
        }
        self.report_settled();
    }

    /// Counts what the refill the engine or a pop of the last batch waited for came to.
    fn report_settled(&mut self) {
        let settled = std::mem::take(&mut self.settled);
        self.took_refill(settled.moved);
        if let Some(e) = settled.unread {
            self.refill_failed(e, false);
        }
        if let Some(e) = settled.failed {
            self.refill_failed(e, true);
        }
    }

    /// A refill ahead failed: another instance took the scheduler; or its read failed (a
    /// connection closed under it, the database gone), which changed nothing, so the heap keeps
    /// what it holds and a later upkeep reads again; or taking its rows in failed (`taken_in`),
    /// which leaves the state to be rebuilt from the table before the next batch.
    fn refill_failed(&mut self, e: StorageError, taken_in: bool) {
        if let StorageError::Fenced(s) = e {
            if let Some(own) = &self.ownership {
                own.lost(s, self.epoch);
            }
            self.owned();
            return;
        }
        if !taken_in {
            // A refill writes nothing (its rows stay pending in the table until popped), and
            // the engine took nothing of it in. A rebuild would hold every request for the time
            // it reads the whole table (seconds at a million queued) for nothing.
            self.refill_failed_at = Some(Instant::now());
            warn!(scheduler.id = %self.scheduler(), operation = "refill", error = %e, "a refill's read failed; the heap keeps what it holds, and a refill reads again after a pause");
            return;
        }
        self.dirty = true;
        warn!(scheduler.id = %self.scheduler(), operation = "refill", error = %e, "the engine's upkeep failed; the heap is rebuilt from the table before the next batch");
    }

    /// Waits for the refill ahead under way and drops its outcome: the state is about to be
    /// read from the table again, or dropped.
    fn forget_refill(&mut self) {
        if let Some(ahead) = self.refilling.take() {
            drop(ahead.wait());
        }
    }

    /// Puts the pops set aside first in `batch`, once no refill is under way; answers how many
    /// were dropped because their caller had gone.
    fn take_aside(&mut self, batch: &mut Batch) -> usize {
        if self.refilling.is_some() || self.aside.is_empty() {
            return 0;
        }
        let mut aside = Batch {
            pops: std::mem::take(&mut self.aside),
            ..Batch::default()
        };
        let abandoned = aside.drop_abandoned_pops();
        aside.pops.append(&mut batch.pops);
        batch.pops = aside.pops;
        abandoned
    }

    /// Whether pops set aside wait for nothing any more: the refill they waited for has ended
    /// (and been taken in, or is taken in by the next batch).
    fn aside_ready(&self) -> bool {
        !self.aside.is_empty()
            && self
                .refilling
                .as_ref()
                .is_none_or(refill::Ahead::is_finished)
    }

    /// Whether a batch can be applied while a refill ahead moves pending rows: it holds nothing
    /// that may read or write one, or place a task, before a pop's backlog search (which waits
    /// for the refill itself). A patch of a task in flight that does not queue it again changes
    /// that task alone. See [`refill`]. The same holds the reads ahead ([`read_ahead`]) true.
    fn beside_refill(&self, batch: &Batch) -> bool {
        batch.refills.is_empty() && !self.meets_pending(batch)
    }

    /// Whether a batch may read or write a pending row, or place a task: all but pops, patches of
    /// tasks in flight that do not queue them again, and explicit refills (which read). Before
    /// one, what the heap holds as a refill read it and the batch may meet is written `queued`
    /// ([`state::Copies`], [`Engine::settles_all`]).
    fn meets_pending(&self, batch: &Batch) -> bool {
        !(batch.pushes.is_empty()
            && batch.expiries.is_empty()
            && batch.cancels.is_empty()
            && batch.rescores.is_empty()
            && self.undelivered.is_empty()
            && batch.patches.iter().all(|p| {
                self.in_flight.knows(&p.body.id) && p.body.patch.status != Some(TaskStatus::Queued)
            }))
    }

    /// Whether a batch may read pending rows it does not name by id, or rewrite one by the status
    /// the heap gives it: a cancel (which searches the pending rows of an object), a re-score
    /// (every waiting task's priority, each written only while its status is the one the engine
    /// knows) and a patch of a task not in flight (any task, by id). Before one, everything the
    /// heap holds as read is written `queued` ([`state::Copies`]); before another batch that
    /// meets pending rows (pushes, give-backs, expiries), only what its pushes name.
    fn settles_all(&self, batch: &Batch) -> bool {
        !batch.cancels.is_empty()
            || !batch.rescores.is_empty()
            || batch
                .patches
                .iter()
                .any(|p| !self.in_flight.knows(&p.body.id))
    }

    /// Runs `f` on the engine's connection; `None` after a failure, which is logged and leaves
    /// the state to be rebuilt (it may hold what was not committed).
    fn on_connection<T>(
        &mut self,
        operation: &str,
        f: impl FnOnce(&mut AnyConnection, &mut QueueState) -> Result<T, StorageError>,
    ) -> Option<T> {
        let mut conn = match self.connection() {
            Ok(c) => c,
            Err(e) => {
                warn!(scheduler.id = %self.scheduler(), operation, error = %e, "no connection for the engine's upkeep; tried again after the next batch");
                return None;
            }
        };
        match f(&mut conn, &mut self.state) {
            Ok(v) => {
                self.conn = Some(conn);
                Some(v)
            }
            Err(StorageError::Fenced(s)) => {
                self.conn = Some(conn);
                if let Some(own) = &self.ownership {
                    own.lost(s, self.epoch);
                }
                self.owned();
                None
            }
            Err(e) => {
                drop(conn);
                self.dirty = true;
                warn!(scheduler.id = %self.scheduler(), operation, error = %e, "the engine's upkeep failed; the heap is rebuilt from the table before the next batch");
                None
            }
        }
    }

    fn publish(&self) {
        self.gauges.set(
            self.scheduler(),
            self.state.heap.len(),
            self.state.pending.count(),
            self.state.heap.oldest_created(),
        );
    }

    /// The database cannot be reached: this batch and those of the next [`RECONNECT_PAUSE`] are
    /// answered 503 at once. The driver's text is logged once per outage, never answered.
    fn unavailable(&mut self, batch: Batch, e: &StorageError, operation: &str) {
        if self.down_since.is_none() {
            warn!(scheduler.id = %self.scheduler(), operation, error = %e, "database unavailable; answering 503 until it returns");
        }
        self.down_since = Some(Instant::now());
        batch.fail(&QueueError::Unavailable(
            "the database is unreachable; retry shortly".into(),
        ));
    }

    fn process(&mut self, mut batch: Batch) {
        let mut abandoned = batch.drop_abandoned_pops();
        let shed = batch.shed_older_than(self.shed_after);
        // Pops set aside for a refill that has ended go first, in this batch: the upkeep after
        // it may start the next refill. They waited for the engine, not for a queue of commands
        // too long to serve, so they are not shed.
        if self
            .refilling
            .as_ref()
            .is_some_and(refill::Ahead::is_finished)
        {
            self.settle_refill(false);
        }
        abandoned += self.take_aside(&mut batch);
        if abandoned + shed > 0 {
            debug!(scheduler.id = %self.scheduler(), abandoned, shed, "commands dropped before any work");
            self.gauges
                .engine
                .shed
                .fetch_add((abandoned + shed) as u64, Ordering::Relaxed);
        }
        if !self.owned() {
            batch.fail(&QueueError::Moving(self.scheduler()));
            return;
        }
        if batch.is_empty() && self.undelivered.is_empty() {
            // Woken to take over: build the heap now rather than at the first request.
            if self.dirty
                && self.down_since.is_none()
                && let Err(e) = self.rebuild()
            {
                warn!(scheduler.id = %self.scheduler(), error = %e, "heap not rebuilt after a takeover; retried with the next request");
            }
            return;
        }
        if let Some(since) = self.down_since
            && since.elapsed() < RECONNECT_PAUSE
        {
            batch.fail(&QueueError::Unavailable(
                "the database is unreachable".into(),
            ));
            return;
        }
        // A refill ahead under way: only what cannot meet a row it moves goes on beside it (a
        // refill that failed leaves the state to be rebuilt, here).
        if self.refilling.is_some() {
            let beside = self.beside_refill(&batch);
            self.settle_refill(!beside);
            // This batch waited for the refill: the pops set aside for it go with it.
            let abandoned = self.take_aside(&mut batch);
            self.gauges
                .engine
                .shed
                .fetch_add(abandoned as u64, Ordering::Relaxed);
        }
        if self.barrier_failed.swap(false, Ordering::AcqRel) {
            // Pushes answered 503 may be in the heap though their commit was lost: a retry would
            // be told 409 naming a task the table lacks.
            warn!(scheduler.id = %self.scheduler(), "a flush barrier failed: the heap is rebuilt from the table");
            self.dirty = true;
        }
        if self.dirty
            && let Err(e) = self.rebuild()
        {
            if let StorageError::Fenced(s) = e {
                batch.fail(&QueueError::Moving(s));
            } else if e.is_unavailable() || !storage::reachable(&self.pool) {
                self.unavailable(batch, &e, "rebuild");
            } else {
                error!(scheduler.id = %self.scheduler(), error = %e, "heap could not be rebuilt");
                batch.fail(&QueueError::from(e));
            }
            return;
        }
        if self.down_since.take().is_some() {
            info!(scheduler.id = %self.scheduler(), "database reachable again");
        }
        // Read-only questions, answered from the state as it stands; the pops of this batch
        // teach which filters runners send.
        let now = self.clock.now();
        for r in std::mem::take(&mut batch.explains) {
            let w = explain::wait(&self.state, &self.recent_filters, r.body, now);
            r.answer(Ok(w));
        }
        for r in std::mem::take(&mut batch.ended_leases) {
            let ended = self.state.leases.ended(now.naive_utc(), r.body);
            r.answer(Ok(ended));
        }
        for r in &batch.pops {
            if let (Some(source), Some((node, plan))) = (&r.body.source, &r.body.filter) {
                self.recent_filters.saw(source, node, plan);
            }
        }
        if batch.is_empty() && self.undelivered.is_empty() {
            return;
        }
        let mut conn = match self.connection() {
            Ok(c) => c,
            Err(e) => {
                self.unavailable(batch, &e, "connect");
                return;
            }
        };
        let began = Instant::now();
        self.giving_back.clear();
        self.popping.clear();
        let result = self.apply(&mut conn, &batch);
        if result.is_err() {
            // Its pops took rows out of the reads ahead that the table still holds as pending.
            self.read_ahead.forget();
        }
        self.give_back_failed = false;
        self.report_settled();
        let counters = &self.gauges.engine;
        match result {
            Ok(Applied {
                mut decisions,
                rows,
                statements,
                moved,
                queue_rows,
                created,
                skipped_pending,
                set_aside,
                backlog,
            }) => {
                self.conn = Some(conn);
                if !self.giving_back.is_empty() {
                    self.give_back_refusals = 0;
                }
                self.stale_queue_rows.extend(skipped_pending);
                counters.batches.fetch_add(1, Ordering::Relaxed);
                counters
                    .commands
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                let metrics = &self.gauges.metrics;
                metrics.batch(self.scheduler(), batch.len());
                metrics.transitions(self.scheduler(), &moved);
                counters
                    .statements
                    .fetch_add(statements as u64, Ordering::Relaxed);
                counters
                    .backlog_pops
                    .fetch_add(backlog[0], Ordering::Relaxed);
                counters
                    .backlog_searches
                    .fetch_add(backlog[1], Ordering::Relaxed);
                counters
                    .batch_micros
                    .fetch_add(began.elapsed().as_micros() as u64, Ordering::Relaxed);
                self.publish();
                self.in_flight
                    .record(rows.iter(), &self.routes, self.state.scheduler);
                for (id, row) in &rows {
                    self.state
                        .in_flight
                        .record(*id, row.hash.as_deref(), row.status);
                    if row.scheduler_id == self.state.scheduler.as_str() {
                        self.state
                            .leases
                            .record(*id, row.status, row.lease_expires_at);
                    }
                    if !matches!(row.status, TaskStatus::Dispatched | TaskStatus::Running) {
                        self.state.throttle.released(id);
                    } else if row.scheduler_id == self.state.scheduler.as_str() {
                        // A late `running` of a task whose lease had ended (and freed its
                        // slots) puts it back in flight; a pop's took its slots already.
                        self.state.throttle.in_flight_again(*id, &row.key_values());
                    }
                }
                self.changed_since_analyse += queue_rows;
                self.created_since_stats += created;
                // Pops set aside are answered after the refill they wait for (they took nothing).
                let mut aside: Vec<PopCommand> = Vec::with_capacity(set_aside.len());
                for i in set_aside.into_iter().rev() {
                    decisions.pops.remove(i);
                    aside.push(batch.pops.remove(i));
                }
                if !aside.is_empty() {
                    counters
                        .set_aside
                        .fetch_add(aside.len() as u64, Ordering::Relaxed);
                    self.aside.extend(aside.into_iter().rev());
                }
                // A pop whose every task the write skipped (changed by hand since the engine read
                // it) would answer empty, and send its runner to sleep while work waits: it is
                // decided again in the next batch, the heap without those tasks now.
                let mut again = Vec::new();
                for i in (0..decisions.pops.len()).rev() {
                    let ids = &decisions.pops[i];
                    if !ids.is_empty() && ids.iter().all(|id| !rows.contains_key(id)) {
                        decisions.pops.remove(i);
                        again.push(batch.pops.remove(i));
                    }
                }
                if !again.is_empty() {
                    counters
                        .decided_again
                        .fetch_add(again.len() as u64, Ordering::Relaxed);
                    warn!(scheduler.id = %self.scheduler(), pops = again.len(), "popped tasks the table no longer held waiting (changed outside the scheduler); those pops are decided again");
                    self.aside.extend(again.into_iter().rev());
                }
                self.answer(batch, decisions, rows);
                self.upkeep();
            }
            Err(StorageError::Fenced(s)) => {
                // Another instance took the scheduler: nothing was written; its owner serves
                // these commands once they are retried.
                self.conn = Some(conn);
                if let Some(own) = &self.ownership {
                    own.lost(s, self.epoch);
                }
                self.gauges
                    .engine
                    .failed_batches
                    .fetch_add(1, Ordering::Relaxed);
                self.owned();
                batch.fail(&QueueError::Moving(s));
            }
            Err(e) => {
                // The connection may be the cause (a dropped server); start over on a fresh one,
                // and rebuild the heap from the table, since what this batch decided may or may
                // not have been committed.
                if e.is_connection_lost() {
                    self.broken_session = conn.session().cloned();
                }
                drop(conn);
                self.dirty = true;
                counters.failed_batches.fetch_add(1, Ordering::Relaxed);
                // Tell a lost database from a lost connection from a bad statement by asking
                // the database.
                let unknown =
                    !storage::reachable(&self.pool) || e.is_unavailable() || e.is_connection_lost();
                if unknown {
                    // What it gave back and what its pops took may or may not be written: the
                    // next batch gives back those the table shows dispatched.
                    let again: Vec<Uuid> = std::mem::take(&mut self.giving_back)
                        .into_iter()
                        .chain(std::mem::take(&mut self.popping))
                        .collect();
                    self.give_back_later(again);
                    self.give_back_failed = !self.undelivered.is_empty();
                }
                // A batch the database refused was rolled back, so nothing was given back: the
                // give-backs go with a later batch (after a pause), not with their leases a day
                // later; after its commands are retried one by one, so that a give-back the
                // database refuses fails none of them. One it keeps refusing is left to its lease.
                let mut refused = Vec::new();
                let carried_give_backs = !self.giving_back.is_empty();
                if !unknown && carried_give_backs {
                    self.give_back_refusals += 1;
                    if self.give_back_refusals < GIVE_BACK_REFUSALS {
                        warn!(scheduler.id = %self.scheduler(), tasks = self.giving_back.len(), error = %e, "the batch giving back undelivered pops failed in the database; they are given back with a later batch");
                        refused = std::mem::take(&mut self.giving_back);
                    } else {
                        warn!(scheduler.id = %self.scheduler(), tasks = self.giving_back.len(), error = %e, "the database refused the give-back of undelivered pops again; their leases will requeue them");
                        self.give_back_refusals = 0;
                    }
                }
                if !storage::reachable(&self.pool) {
                    self.unavailable(batch, &e, "batch");
                } else if e.is_unavailable() || e.is_connection_lost() {
                    warn!(scheduler.id = %self.scheduler(), operation = "batch", size = batch.len(), error = %e, "the database connection failed with the batch's outcome unknown; answering 503, the heap is rebuilt from the table");
                    batch.fail(&QueueError::Unavailable(e.client_text().into()));
                } else if batch.commands() > 1 || carried_give_backs {
                    // By command, not by task: one push of several tasks is one transaction
                    // whatever happens, and split it could not be (retrying it as it is would
                    // fail again, without end). A lone command is tried again without the
                    // give-backs it went with, which may be what the database refused.
                    warn!(scheduler.id = %self.scheduler(), error = %e, size = batch.len(), "batch failed; retrying its commands one by one");
                    for single in batch.into_singles() {
                        self.process(single);
                    }
                } else {
                    error!(scheduler.id = %self.scheduler(), error = %e, "command failed in the database");
                    batch.fail(&QueueError::from(e));
                }
                if !refused.is_empty() {
                    self.give_back_later(refused);
                    self.give_back_failed = true;
                }
            }
        }
    }

    /// `ids` go back to the queue with a later batch (each once).
    fn give_back_later(&mut self, ids: Vec<Uuid>) {
        for id in ids {
            if !self.undelivered.contains(&id) {
                self.undelivered.push(id);
            }
        }
    }

    /// Reads, decides and writes one batch.
    ///
    /// A broken connection costs no request where the outcome is known: the reads before any
    /// decision, and a write transaction that failed on a statement before its `COMMIT` was sent
    /// (a session that ends inside a transaction is rolled back, so nothing of it was applied),
    /// are tried once more on a fresh connection. A failure at the `COMMIT` itself, or of a
    /// batch written as one statement outside a transaction, leaves the outcome unknown: it is
    /// not retried (a write is never applied twice), and the caller rebuilds the heap.
    fn apply(&mut self, conn: &mut WriterConn, batch: &Batch) -> Result<Applied, StorageError> {
        let started = Instant::now();
        // A batch that may add or change a pending row (as one a refill waits for) forgets the
        // reads ahead, and keeps none of its own.
        let keep = self.beside_refill(batch);
        if !keep {
            self.read_ahead.forget();
        }
        let settle = self.meets_pending(batch);
        let now = self.clock.now();
        let s = self.scheduler();
        let held = match settle && self.state.copies.len() > 0 {
            false => Vec::new(),
            true if self.settles_all(batch) => self.state.copies.take_all(),
            true => {
                let named = push::reads(&self.state, batch.pushes.iter().flat_map(|r| &r.body));
                let ids = named.ids.iter().filter_map(|id| Uuid::parse_str(id).ok());
                self.state.copies.take(ids)
            }
        };
        if !held.is_empty() {
            // What the heap holds as read that the batch may meet is written `queued` first,
            // before the batch reads anything: its rules and its searches then meet the table as
            // the heap holds it.
            let (fence, lock) = (self.fence(), self.write_lock.clone());
            let written = {
                let _turn = write_turn(lock.as_ref());
                let at = now.naive_utc();
                let st = &mut self.state;
                // Broken before the write ran: the server rolled it back, so it goes again on a
                // fresh connection (the state changes only once it is written).
                on_fresh_after_break(
                    conn,
                    (&self.pool, self.flush.is_some()),
                    (
                        s,
                        "settle",
                        "the database connection broke before the commit; writing the batch again on a fresh one",
                    ),
                    |c, _, ran| refill::settle_held(c, st, &held, at, fence.as_ref(), ran),
                )?
            };
            let mut by = ByStatus::default();
            by[status_slot(TaskStatus::Queued)] = written as u64;
            self.gauges.metrics.transitions(s, &by);
            self.changed_since_analyse += written as u64;
        }
        let st = &mut self.state;
        let mut rows = BatchRows::default();

        // 1. Read what the batch may meet.
        let needs = push::reads(st, batch.pushes.iter().flat_map(|r| &r.body));
        let mut ids = needs.ids;
        ids.extend(batch.patches.iter().map(|r| r.body.id.to_string()));
        let undelivered = std::mem::take(&mut self.undelivered);
        self.giving_back.clone_from(&undelivered);
        ids.extend(undelivered.iter().map(Uuid::to_string));
        // A task whose lease the engine's memory says has ended is read from the table, never
        // from memory: expiring it may fail it for good, and a lease changed behind the engine's
        // back (an operator giving a long scan more time) must stand. Expiries are few.
        let mut expiring: Vec<String> = batch
            .expiries
            .iter()
            .flat_map(|r| r.body.iter().map(Uuid::to_string))
            .collect();
        expiring.sort_unstable();
        ids.retain(|id| expiring.binary_search(id).is_err());
        ids.sort_unstable();
        ids.dedup();
        rows.load(self.in_flight.take_known(&mut ids), s.as_str());
        ids.extend(expiring);
        ids.dedup();
        let fresh = (&self.pool, self.flush.is_some());
        let read = read_named(conn, fresh, s, &ids, &needs.hashes)?;
        rows.load(read, s.as_str());
        // Tasks coming back to wait may meet the same work waiting as another task, which they
        // withdraw ([`rejoin`]): its row is read too. Seldom anything to read: the hash must be
        // waiting twice.
        let returning = batch
            .patches
            .iter()
            .filter(|r| r.body.patch.status == Some(TaskStatus::Queued))
            .map(|r| r.body.id)
            .chain(batch.expiries.iter().flat_map(|r| r.body.iter().copied()))
            .chain(undelivered.iter().copied())
            .chain(
                batch
                    .pushes
                    .iter()
                    .flat_map(|r| &r.body)
                    .filter(|t| t.id_given)
                    .map(|t| t.id),
            );
        let meets = rejoin::reads(st, &rows, returning);
        if meets != batch::Reads::default() {
            let read = read_named(conn, fresh, s, &meets.ids, &meets.hashes)?;
            rows.load(read, s.as_str());
        }

        // 2. Decide, rule by rule.
        let mut d = Decisions::default();
        let mut set_aside = Vec::new();
        let searches;
        lease::give_back(st, &mut rows, &undelivered, now);
        for r in &batch.pushes {
            d.pushes.push(
                r.body
                    .iter()
                    .map(|t| push::push(st, &mut rows, t, now))
                    .collect(),
            );
        }
        for r in &batch.patches {
            d.patches
                .push(patch::patch(st, &mut rows, r.body.id, &r.body.patch, now));
        }
        for r in &batch.expiries {
            d.expiries.push(lease::expire(st, &mut rows, &r.body, now));
        }
        for r in &batch.rescores {
            d.rescores
                .push(rescore::rescore(st, &mut rows, &r.body, now));
        }
        {
            let mut reads = TableReads {
                conn: &mut *conn,
                pool: &self.pool,
                unsynced: self.flush.is_some(),
                scheduler: s,
                refill: &mut self.refilling,
                settled: &mut self.settled,
                ahead: &mut self.read_ahead,
                keep,
                set_aside: false,
                searches: 0,
            };
            for r in &batch.cancels {
                d.cancels.push(cancel::cancel_object(
                    st, &mut rows, &mut reads, &r.body, now,
                )?);
            }
            for (i, r) in batch.pops.iter().enumerate() {
                d.pops
                    .push(pop::pop(st, &mut rows, &mut reads, &r.body, now)?);
                if std::mem::take(&mut reads.set_aside) {
                    set_aside.push(i);
                }
            }
            searches = reads.searches;
        }
        let writes = rows.writes();
        self.popping = d.pops.iter().flatten().copied().collect();

        self.gauges
            .engine
            .apply_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);

        // 3. Write, in one transaction unless one statement does it.
        let statements = writes.statements(
            tasks::INSERT_CHUNK,
            tasks::UPDATE_CHUNK,
            tasks::explanations_with_rows(Backend::of(conn)),
        );
        let lock = self.write_lock.clone();
        let _turn = write_turn(lock.as_ref());
        // Read before the batch took its undelivered pops in (see `meets_pending`).
        let pending_rows = settle;
        let lease = self.state.lease(now, TaskStatus::Dispatched);
        let fence = self.fence();
        let (pool, unsynced) = (self.pool.clone(), self.flush.is_some());
        let state = &mut self.state;
        // In a transaction: whether its statements all ran, so the next step is `COMMIT`.
        let transaction = |c: &mut AnyConnection, statements_ran: &mut bool| {
            c.transaction::<_, StorageError, _>(|c| {
                if let Some((own, epoch)) = &fence
                    && !owners::holds(c, s, own.instance(), *epoch)?
                {
                    return Err(StorageError::Fenced(s));
                }
                let written = write(c, &writes, now, lease)?;
                *statements_ran = true;
                Ok(written)
            })
        };
        // Pops and patches on PostgreSQL: one statement with the fence inside it, instead of a
        // transaction's five round trips, which the batch's callers would all wait for.
        let one = match &fence {
            Some((own, epoch))
                if Backend::of(conn) == Backend::Postgres
                    && writes.only_changes_and_dispatches() =>
            {
                Some(tasks::fenced::FencedWrite {
                    scheduler: s,
                    instance: own.instance(),
                    epoch: *epoch,
                    updates: &writes.updates,
                    dispatched: &writes.dispatched,
                    taken_pending: &writes.taken_pending,
                    pending_rows,
                    at: now.naive_utc(),
                    lease,
                })
                .filter(tasks::fenced::FencedWrite::fits)
            }
            _ => None,
        };
        // On SQLite a write to `tasks` and its queue rows are separate statements; with several
        // instances the fence is one more.
        // A batch that writes nothing (a pop that found nothing) needs no fence either.
        let (returned, relinked) = if let Some(w) = &one {
            // The statement may or may not have been committed before the connection broke:
            // the rows tell, on a fresh connection (written: read back; not: written now).
            let written = on_fresh_after_break(
                conn,
                (&pool, unsynced),
                (
                    s,
                    "write",
                    "the database connection broke during the batch's statement; finding out on a fresh one whether it was written",
                ),
                |c, attempt, _| match attempt {
                    1 => tasks::fenced::write(c, w),
                    _ => tasks::fenced::recover(c, w),
                },
            )?;
            let mut out = HashMap::with_capacity(written.len());
            for row in written {
                out.insert(row.uuid()?, row);
            }
            (out, Vec::new())
        } else if statements == 0
            || (statements <= 1 && fence.is_none() && Backend::of(conn) == Backend::Postgres)
        {
            write(conn, &writes, now, lease)?
        } else {
            // A statement failed on a broken connection before `COMMIT` was sent: the server
            // rolled the transaction back, so the same writes go again on a fresh connection.
            // (The rules changed `state` before the write; `write` itself changes none of it.)
            on_fresh_after_break(
                conn,
                (&pool, unsynced),
                (
                    s,
                    "write",
                    "the database connection broke before the commit; writing the batch again on a fresh one",
                ),
                |c, _, ran| transaction(c, ran),
            )?
        };
        // A pending task popped from the backlog that the table no longer held pending was
        // changed behind the engine's back (by hand): skipped, like a heap task no longer
        // queued (its answer says so in the log), and the backlog's count read again.
        let skipped = |taken: &[Uuid]| -> Vec<String> {
            taken
                .iter()
                .filter(|id| !returned.contains_key(id))
                .map(Uuid::to_string)
                .collect()
        };
        let mut skipped_pending = skipped(&rows.taken_pending);
        let from_backlog = rows.from_backlog.saturating_sub(skipped_pending.len()) as u64;
        // The heap's tasks held as read are written from `pending` too (not counted as taken
        // from the backlog).
        skipped_pending.extend(skipped(&rows.taken_copies));
        if !skipped_pending.is_empty() {
            state.pending.drift();
        }
        // Tasks whose link met the schedule their hash had: they name that one, in the heap and
        // in their answers, as in the table.
        for (id, schedule) in relinked {
            let parsed = schedule.as_deref().and_then(|s| Uuid::parse_str(s).ok());
            state.heap.set_schedule(&id, parsed);
            rows.relink(&id, schedule);
        }
        let statements = match one {
            Some(_) => 1,
            None => statements,
        };
        // The heap is refilled ahead, after the batch is answered (`upkeep`); an explicit
        // refill request is served in its batch, with a read once the batch's writes are in the
        // table (before, it would meet the pending tasks this batch's pops took as pending).
        // The batch's writes are committed by now: a refill that fails here must not fail the
        // batch (its callers would be told 503 for work that is done, and a re-run would pop
        // other tasks). A read that failed changed nothing; the heap is refilled later. Rows read
        // but not taken in leave the state to be rebuilt before the next batch.
        if !batch.refills.is_empty() {
            let wanted = refill::wanted(state);
            if wanted > 0 {
                match refill::read(conn, s, wanted, &refill::ReadFrom::of(state)) {
                    Ok(picks) => {
                        self.read_ahead
                            .moved(picks.rows.iter().map(|r| r.id.as_str()));
                        match refill::read_in(state, picks, wanted) {
                            Ok(n) => d.refilled = n,
                            Err(e) => {
                                warn!(scheduler.id = %s, error = %e, "a refill's rows could not be taken into the heap after its batch; the heap is rebuilt before the next one");
                                self.dirty = true;
                            }
                        }
                    }
                    Err(e) => {
                        warn!(scheduler.id = %s, error = %e, "a refill's read after its batch failed; the heap is refilled later");
                    }
                }
            }
        }
        let moved = writes.transitions();
        let queue_rows = writes.pending_rows();
        let created = writes.inserts.len() as u64;
        if !batch.pushes.is_empty() || !batch.pops.is_empty() {
            self.gauges.touch(s, now);
        }
        let mut rows = rows.into_rows();
        rows.extend(returned);
        Ok(Applied {
            decisions: d,
            rows,
            statements,
            moved,
            queue_rows,
            created,
            skipped_pending,
            set_aside,
            backlog: [from_backlog, searches],
        })
    }

    /// Answers every command from the committed rows, once they are durable: at once, or after
    /// the next flush barrier.
    fn answer(&mut self, batch: Batch, d: Decisions, rows: HashMap<Uuid, TaskRow>) {
        let s = self.scheduler();
        let Some(flush) = &self.flush else {
            let back = deliver(s, batch, d, rows);
            self.undelivered.extend(back);
            return;
        };
        let (given_back, epoch) = (self.given_back.clone(), self.epoch);
        let failed = self.barrier_failed.clone();
        flush.after_flush(Box::new(move |flushed| {
            let back = match flushed {
                Ok(()) => deliver(s, batch, d, rows),
                Err(e) => {
                    failed.store(true, Ordering::Release);
                    // Whether these pops survive is unknown: give their tasks back either way.
                    let popped: Vec<Uuid> = d.pops.iter().flatten().copied().collect();
                    batch.fail(&e);
                    popped
                }
            };
            if !back.is_empty() {
                given_back
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .extend(back.into_iter().map(|id| (id, epoch)));
            }
        }));
    }
}

/// Answers every command of a batch from its committed rows; returns the tasks popped whose
/// caller had gone.
fn deliver(
    scheduler: SchedulerId,
    batch: Batch,
    d: Decisions,
    rows: HashMap<Uuid, TaskRow>,
) -> Vec<Uuid> {
    let mut undelivered = Vec::new();
    let task = |id: &Uuid| -> Result<Task, QueueError> {
        rows.get(id)
            .cloned()
            .ok_or_else(|| QueueError::Internal(format!("task {id} vanished from its batch")))?
            .into_task()
            .map_err(QueueError::from)
    };
    for (r, outs) in batch.pushes.into_iter().zip(d.pushes) {
        r.answer(Ok(outs
            .into_iter()
            .map(|out| {
                out.and_then(|(id, created)| {
                    Ok(PushOutcome {
                        task: task(&id)?,
                        created,
                    })
                })
            })
            .collect()));
    }
    for (r, out) in batch.patches.into_iter().zip(d.patches) {
        r.answer(out.and_then(|id| task(&id)));
    }
    for (r, out) in batch.expiries.into_iter().zip(d.expiries) {
        r.answer(out);
    }
    for (r, ids) in batch.cancels.into_iter().zip(d.cancels) {
        r.answer(Ok(ids));
    }
    for (r, n) in batch.rescores.into_iter().zip(d.rescores) {
        r.answer(Ok(n));
    }
    // One batch's refill answers every refill request in it.
    for r in batch.refills {
        r.answer(Ok(d.refilled));
    }
    for (r, ids) in batch.pops.into_iter().zip(d.pops) {
        let found: Vec<Task> = ids.iter().filter_map(|id| task(id).ok()).collect();
        if found.len() < ids.len() {
            warn!(
                scheduler.id = %scheduler,
                missing = ids.len() - found.len(),
                "popped tasks the table no longer held waiting (changed outside the scheduler); skipped"
            );
        }
        let handed: Vec<Uuid> = found.iter().map(|t| t.id).collect();
        if !r.answer(Ok(found)) && !handed.is_empty() {
            // Committed, but the caller is gone: nobody will run these tasks.
            info!(scheduler.id = %scheduler, tasks = handed.len(), "pop answer not delivered; the tasks go back to the queue");
            undelivered.extend(handed);
        }
    }
    undelivered
}
/// What [`write`] did beyond its statements: the rows of tasks dispatched by id (heap tasks and
/// pending tasks taken from the backlog), and the created tasks whose link met an existing
/// schedule (with that schedule's id).
type Written = (HashMap<Uuid, TaskRow>, Vec<(Uuid, Option<String>)>);

/// Executes a batch's writes (see [`Written`]).
fn write(
    c: &mut AnyConnection,
    w: &Writes,
    now: DateTime<Utc>,
    lease: Option<chrono::NaiveDateTime>,
) -> Result<Written, StorageError> {
    let at = now.naive_utc();
    let mut relinked = Vec::new();
    if !w.inserts.is_empty() {
        // The explanations and schedules are those of created tasks: written with them (a link
        // whose hash has a schedule writes none, and its task names that one).
        let ids: Vec<String> = w.links.iter().map(|(id, _)| id.to_string()).collect();
        let links: Vec<tasks::Link<'_>> = ids
            .iter()
            .zip(&w.links)
            .map(|(id, (_, row))| (id.as_str(), row))
            .collect();
        for (id, schedule) in tasks::insert_linked(c, &w.inserts, &w.scores, &links)? {
            if let Ok(id) = Uuid::parse_str(&id) {
                relinked.push((id, schedule));
            }
        }
    } else if !w.scores.is_empty() {
        tasks::insert_scores(c, &w.scores)?;
    }
    if !w.updates.is_empty() {
        tasks::update(c, &w.updates)?;
    }
    if !w.evicted.is_empty() {
        tasks::transition(
            c,
            &w.evicted,
            TaskStatus::Queued,
            TaskStatus::Pending,
            at,
            None,
        )?;
    }
    if !w.reprioritised.is_empty() {
        tasks::reprioritise(c, &w.reprioritised, at)?;
    }
    if !w.explained.is_empty() {
        tasks::update_scores(c, &w.explained)?;
    }
    if !w.cancelled.is_empty() {
        tasks::transition(
            c,
            &w.cancelled,
            TaskStatus::Queued,
            TaskStatus::Cancelled,
            at,
            None,
        )?;
    }
    let mut out = HashMap::new();
    for (ids, from) in [
        (&w.dispatched, TaskStatus::Queued),
        (&w.taken_pending, TaskStatus::Pending),
    ] {
        if ids.is_empty() {
            continue;
        }
        for row in tasks::transition(c, ids, from, TaskStatus::Dispatched, at, lease)? {
            out.insert(row.uuid()?, row);
        }
    }
    Ok((out, relinked))
}
