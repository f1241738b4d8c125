//! The queue: one bounded heap per scheduler and its durable twin, the `tasks` table, kept in
//! step by one engine thread per scheduler that applies pushes, pops, patches and lease expiry
//! in group-committed batches. This is where the rules of docs/DESIGN.md §5 live:
//!
//! - exactly-one pop: only its engine takes tasks out of a heap, and a task is dispatched by a
//!   conditional `UPDATE … WHERE status = 'queued'`;
//! - durability: a caller is answered only after the batch holding its change has committed;
//! - recovery: the heaps are rebuilt from the table at start and after any failed batch;
//! - leases: a popped task that is not started, or a running one that is not finished, in time
//!   goes back to the queue (attempts + 1) or is failed once its attempts are used;
//! - bounded memory: a full heap stores automatic pushes as `pending` (or refuses them), user
//!   scans evict the worst automatic task, and pending tasks flow back best first.
//!
//! Reads (`GET /tasks…`, `reads`) go straight to the pool and never wait for an engine.
//!
//! | file | holds |
//! |---|---|
//! | `mod.rs` | the [`Broker`]: the commands (push, pop, patch, cancel, expire, rescore, refill) sent to the engines |
//! | `routing.rs` | where a command goes with several instances: the local engine, the owner (forwarded), or 503 while the owner changes |
//! | `types.rs` | the shared types: limits and configuration, the errors, what commands take and answer |
//! | `gauges.rs` | what the engines publish for readers: heap depth, pending, oldest task, counters |
//! | `reads.rs` | reads on the pool |
//! | [`forward`] | the commands as they cross to the owning instance |
//! | [`push`] | a push checked and shaped before it reaches an engine |
//! | [`heap`] | the bounded heap and its indexes |
//! | `engine/` | one thread per scheduler: batches, one file per rule |

mod engine;
pub mod fair;
pub mod forward;
mod gauges;
pub mod heap;
pub mod push;
mod reads;
mod routing;
mod types;

pub use gauges::EngineCounters;
pub(crate) use gauges::Gauges;
pub use routing::Cluster;
pub use types::*;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::clock::SharedClock;
use crate::domain::limits::Limits;
use crate::domain::{PerScheduler, SchedulerId, Task, TaskStatus};
use crate::metrics::{
    ByStatus, Metrics, Op, Outcome, STATUS_COUNTS_MAX_AGE, STATUS_COUNTS_WAIT, status_slot,
};
use crate::storage::{self, Backend, DbPool, StorageError};
use engine::command::{CancelObject, Command, PatchRequest, PopRequest, Request, Rescored};
pub use engine::{EngineHandle, REFILL_BATCH};
use forward::Forward;
pub use push::PushRequest;

/// Expired leases handled per scheduler per sweep at most; the next sweep takes the rest.
const EXPIRY_BATCH: usize = 1_000;

/// How the request metrics count an answer.
fn outcome_of<T>(answer: &Result<T, QueueError>) -> Outcome {
    answer
        .as_ref()
        .map_or_else(QueueError::outcome, |_| Outcome::Ok)
}

/// An engine's answer to a counted call, as the request metrics count it.
trait Counted {
    /// The outcome of a call answered with this.
    fn outcome(&self) -> Outcome;
}

impl Counted for Vec<Task> {
    fn outcome(&self) -> Outcome {
        Outcome::Ok
    }
}

impl Counted for Task {
    fn outcome(&self) -> Outcome {
        Outcome::Ok
    }
}

/// A batch of pushes is one call: an error of any task makes it an error, else a refusal of
/// any a refusal (a duplicate among a forwarded push or the planner's batch), else ok.
impl Counted for Vec<Result<PushOutcome, QueueError>> {
    fn outcome(&self) -> Outcome {
        self.iter()
            .map(outcome_of)
            .max_by_key(|o| *o as u8)
            .unwrap_or(Outcome::Ok)
    }
}

/// The handle everything else uses to reach the queue. Cheap to clone.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
    /// Serving a command another instance forwarded: apply it here or answer 503, never
    /// forward it again.
    local_only: bool,
}

struct Inner {
    /// One engine per scheduler.
    txs: PerScheduler<SyncSender<Command>>,
    gauges: Arc<Gauges>,
    /// Which scheduler each task in flight belongs to (kept by the engines).
    routes: Arc<engine::Routes>,
    pool: DbPool,
    backend: Backend,
    clock: SharedClock,
    config: QueueConfig,
    cluster: Cluster,
}

impl Broker {
    /// Rebuilds the heaps from the table and starts one engine thread per scheduler. Blocking:
    /// call it from a blocking context. Fails if the database cannot be read.
    pub fn start(
        pool: DbPool,
        backend: Backend,
        clock: SharedClock,
        config: QueueConfig,
        metrics: Arc<Metrics>,
        cluster: Cluster,
    ) -> Result<(Broker, EngineHandle), StorageError> {
        let gauges = Arc::new(Gauges::new(metrics));
        let routes = Arc::new(engine::Routes::default());
        let (txs, handle) = engine::start_all(
            &pool,
            backend,
            &clock,
            &config,
            &gauges,
            &routes,
            cluster.ownership.as_ref(),
        )?;
        let broker = Broker {
            inner: Arc::new(Inner {
                txs,
                gauges,
                routes,
                pool,
                backend,
                clock,
                config,
                cluster,
            }),
            local_only: false,
        };
        Ok((broker, handle))
    }

    /// The input limits in force.
    pub fn limits(&self) -> &Limits {
        &self.inner.config.input
    }

    /// The connected backend.
    pub fn backend(&self) -> Backend {
        self.inner.backend
    }

    async fn call<R, T>(
        &self,
        scheduler: SchedulerId,
        body: R,
        make: impl FnOnce(Request<R, T>) -> Command,
    ) -> Result<T, QueueError> {
        let (reply, answer) = oneshot::channel();
        match self.inner.txs[scheduler].try_send(make(Request::new(body, reply))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => return Err(QueueError::Busy),
            Err(TrySendError::Disconnected(_)) => {
                return Err(QueueError::Unavailable(
                    "the queue engine has stopped".into(),
                ));
            }
        }
        answer
            .await
            .map_err(|_| QueueError::Unavailable("the queue engine has stopped".into()))?
    }

    /// Pushes a task onto `scheduler`'s queue; answered once committed.
    pub async fn push(
        &self,
        scheduler: SchedulerId,
        request: PushRequest,
    ) -> Result<PushOutcome, QueueError> {
        if !self.is_local(scheduler) {
            return self
                .push_many(scheduler, vec![request])
                .await?
                .pop()
                .unwrap_or_else(|| Err(QueueError::Internal("a push went unanswered".into())));
        }
        // Counted from here, as in `push_many`: a request refused before it reaches the queue
        // is the API's 4xx, not the queue's answer.
        let task = push::prepare(scheduler, request, &self.inner.config.input)?;
        let started = Instant::now();
        let answer = self
            .call(scheduler, vec![task], Command::Push)
            .await
            .and_then(|mut a| {
                a.pop()
                    .unwrap_or_else(|| Err(QueueError::Internal("a push went unanswered".into())))
            });
        self.record(scheduler, Op::Push, outcome_of(&answer), started);
        answer
    }

    fn record(&self, s: SchedulerId, op: Op, outcome: Outcome, started: Instant) {
        self.inner
            .gauges
            .metrics
            .op(s, op, outcome, started.elapsed());
    }

    /// [`Broker::call`], its answer counted in the request metrics from `started`.
    async fn call_counted<R, T: Counted>(
        &self,
        s: SchedulerId,
        op: Op,
        started: Instant,
        body: R,
        make: impl FnOnce(Request<R, T>) -> Command,
    ) -> Result<T, QueueError> {
        let answer = self.call(s, body, make).await;
        let outcome = match &answer {
            Ok(a) => a.outcome(),
            Err(e) => e.outcome(),
        };
        self.record(s, op, outcome, started);
        answer
    }

    /// Whether `request` is a push `scheduler` takes as it is (the checks of a push that need no
    /// state: scheduler, priority, payload, limits); writes nothing.
    pub fn check(&self, scheduler: SchedulerId, request: &PushRequest) -> Result<(), QueueError> {
        push::prepare(scheduler, request.clone(), &self.inner.config.input).map(|_| ())
    }

    /// Pushes several tasks onto `scheduler`'s queue in one transaction (a task and its
    /// de-duplication siblings, or the tasks of a batch of events); answers each in order, once
    /// committed. A task refused (a duplicate, a malformed payload) does not stop the others.
    pub async fn push_many(
        &self,
        scheduler: SchedulerId,
        requests: Vec<PushRequest>,
    ) -> Result<Vec<Result<PushOutcome, QueueError>>, QueueError> {
        self.routed(
            scheduler,
            requests,
            |r| self.push_many_here(scheduler, r),
            |requests| Forward::Push { requests },
        )
        .await
    }

    /// [`Broker::push_many`] on this instance's engine.
    async fn push_many_here(
        &self,
        scheduler: SchedulerId,
        requests: Vec<PushRequest>,
    ) -> Result<Vec<Result<PushOutcome, QueueError>>, QueueError> {
        let mut out: Vec<Option<Result<PushOutcome, QueueError>>> = Vec::new();
        let mut tasks = Vec::with_capacity(requests.len());
        for r in requests {
            match push::prepare(scheduler, r, &self.inner.config.input) {
                Ok(t) => {
                    tasks.push(t);
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        let started = Instant::now();
        let mut answers = if tasks.is_empty() {
            Vec::new()
        } else {
            self.call_counted(scheduler, Op::Push, started, tasks, Command::Push)
                .await?
        }
        .into_iter();
        Ok(out
            .into_iter()
            .map(|slot| {
                slot.unwrap_or_else(|| {
                    answers.next().unwrap_or_else(|| {
                        Err(QueueError::Internal("a push went unanswered".into()))
                    })
                })
            })
            .collect())
    }

    /// Pops up to `limit` tasks (best first) matching `filter`; they are `dispatched` and that
    /// is committed before this returns.
    pub async fn pop(
        &self,
        scheduler: SchedulerId,
        limit: usize,
        filter: Option<PopFilter>,
    ) -> Result<Vec<Task>, QueueError> {
        let started = Instant::now();
        self.routed(
            scheduler,
            filter,
            |f| {
                let (node, source) = f.map(|f| (f.node, f.source)).unzip();
                let mut request = PopRequest::new(scheduler, limit, node);
                request.source = source;
                self.call_counted(scheduler, Op::Pop, started, request, Command::Pop)
            },
            |f| Forward::Pop {
                limit,
                filter: f.map(|f| f.source),
            },
        )
        .await
    }

    /// Changes a task's status and/or priority; answered once committed. The change goes to the
    /// engine of the task's scheduler: known from memory for a task in flight, else read first.
    pub async fn patch(&self, id: Uuid, patch: TaskPatch) -> Result<Task, QueueError> {
        let started = Instant::now();
        let scheduler = self.task_scheduler(id).await?;
        self.routed(
            scheduler,
            patch,
            |patch| {
                let request = PatchRequest { id, patch };
                self.call_counted(scheduler, Op::Patch, started, request, Command::Patch)
            },
            |patch| Forward::Patch { id, patch },
        )
        .await
    }

    /// Where queued task `id` of `scheduler` stands and what holds it back, as the scheduler's
    /// owner sees it; `None` if it is not in the heap.
    pub async fn wait(&self, scheduler: SchedulerId, id: Uuid) -> Result<Option<Wait>, QueueError> {
        self.routed_within(
            std::time::Duration::ZERO,
            scheduler,
            id,
            |id| self.call(scheduler, id, Command::Explain),
            |id| Forward::Explain { id },
        )
        .await
    }

    /// The scheduler a task belongs to: from memory for a task in flight, else read.
    pub async fn task_scheduler(&self, id: Uuid) -> Result<SchedulerId, QueueError> {
        if let Some(scheduler) = self.inner.routes.get(&id) {
            return Ok(scheduler);
        }
        self.read(move |c| {
            storage::tasks::scheduler_of(c, &id.hyphenated().to_string())
                .map_err(|e| QueueError::from(StorageError::from(e)))
        })
        .await?
        .ok_or(QueueError::TaskNotFound(id))?
        .parse::<SchedulerId>()
        .map_err(|()| QueueError::Internal(format!("task {id} has an unknown scheduler")))
    }

    /// Gives `scheduler`'s waiting tasks new priorities and their explanations (`(id, was,
    /// priority, explanation)`: an event changed what their strategy reads), in one
    /// transaction, on the instance that owns `scheduler`; tasks no longer waiting, and queued
    /// ones whose priority is no longer `was` (a client changed it since), are left alone.
    /// Answers how many were waiting.
    pub async fn rescore(
        &self,
        scheduler: SchedulerId,
        scores: Vec<(Uuid, i64, i64, crate::scoring::Explanation)>,
    ) -> Result<usize, QueueError> {
        if scores.is_empty() {
            return Ok(0);
        }
        self.routed(
            scheduler,
            scores,
            |scores| {
                // Serialised here, off the engine's thread.
                let priorities: Vec<Rescored> = scores
                    .into_iter()
                    .map(|(id, was, priority, e)| Rescored {
                        id,
                        was,
                        priority,
                        explanation: serde_json::to_string(&e).unwrap_or_default(),
                    })
                    .collect();
                self.call(scheduler, priorities, Command::Rescore)
            },
            |scores| Forward::Rescore { scores },
        )
        .await
    }

    /// Moves `scheduler`'s best pending tasks into its heap as far as it has room, at most
    /// [`REFILL_BATCH`] in one transaction; answers how many moved. After every batch of
    /// requests the engine refills ahead once the heap's room reaches a tenth of its bound; this
    /// is for smaller room, and for when no requests come.
    pub async fn refill(&self, scheduler: SchedulerId) -> Result<usize, QueueError> {
        self.owner_only(scheduler)?;
        self.call(scheduler, (), Command::Refill).await
    }

    /// An object was deleted: cancels `organisation`'s waiting (queued or pending) tasks whose
    /// `data.input_ooi` is `reference`, on every scheduler; answers their ids, once committed.
    pub async fn cancel_object(
        &self,
        organisation: &str,
        reference: &str,
    ) -> Result<Vec<Uuid>, QueueError> {
        let mut out = Vec::new();
        for s in SchedulerId::ALL {
            out.extend(self.cancel_object_on(s, organisation, reference).await?);
        }
        Ok(out)
    }

    /// [`Broker::cancel_object`] on one scheduler.
    pub async fn cancel_object_on(
        &self,
        s: SchedulerId,
        organisation: &str,
        reference: &str,
    ) -> Result<Vec<Uuid>, QueueError> {
        self.cancel_on(s, organisation, reference, None).await
    }

    /// An object's scan level dropped below that of `plugins` (its clearance was withdrawn):
    /// cancels `organisation`'s waiting boefje tasks of these boefjes on `reference`, so that
    /// nothing runs that the object's level no longer permits; answers their ids, once
    /// committed. Tasks already handed out run on.
    pub async fn withdraw(
        &self,
        organisation: &str,
        reference: &str,
        plugins: Vec<String>,
    ) -> Result<Vec<Uuid>, QueueError> {
        self.cancel_on(SchedulerId::Boefje, organisation, reference, Some(plugins))
            .await
    }

    /// Cancels waiting tasks of an object on `s`: all, or with `plugins` those of these boefjes.
    pub(crate) async fn cancel_on(
        &self,
        s: SchedulerId,
        organisation: &str,
        reference: &str,
        plugins: Option<Vec<String>>,
    ) -> Result<Vec<Uuid>, QueueError> {
        let target = (organisation.to_owned(), reference.to_owned(), plugins);
        self.routed(
            s,
            target,
            |(organisation, reference, plugins)| {
                let target = CancelObject {
                    organisation,
                    reference,
                    plugins,
                };
                self.call(s, target, Command::Cancel)
            },
            |(organisation, reference, plugins)| Forward::Cancel {
                organisation,
                reference,
                plugins,
            },
        )
        .await
    }

    /// Sweeps every scheduler for expired leases: each such task is queued again with its
    /// attempt count raised, or failed once it has used its attempts. Each engine knows its
    /// tasks' leases (`engine::leases`): it answers which have ended from memory, then checks
    /// each again on its row, read from the table, as it expires it.
    pub async fn expire_leases(&self) -> Result<ExpiryReport, QueueError> {
        let mut report = ExpiryReport::default();
        for s in SchedulerId::ALL {
            let r = self.expire_leases_of(s).await?;
            report.requeued.extend(r.requeued);
            report.failed.extend(r.failed);
        }
        Ok(report)
    }

    /// The lease sweep of one scheduler (see [`Broker::expire_leases`]).
    pub async fn expire_leases_of(&self, s: SchedulerId) -> Result<ExpiryReport, QueueError> {
        // The owner sweeps its own schedulers; the others are its business.
        if !self.is_local(s) {
            return Ok(ExpiryReport::default());
        }
        let ids = self.call(s, EXPIRY_BATCH, Command::EndedLeases).await?;
        if ids.is_empty() {
            return Ok(ExpiryReport::default());
        }
        let report = self.call(s, ids, Command::Expire).await?;
        self.inner.gauges.metrics.lease_expiries(
            s,
            report.requeued.len() as u64,
            report.failed.len() as u64,
        );
        Ok(report)
    }

    /// Every scheduler's live figures.
    pub fn schedulers(&self) -> Vec<SchedulerSnapshot> {
        SchedulerId::ALL
            .into_iter()
            .map(|s| self.snapshot(s))
            .collect()
    }

    /// One scheduler's live figures.
    pub fn snapshot(&self, s: SchedulerId) -> SchedulerSnapshot {
        let g = &self.inner.gauges;
        let last = g.last_activity[s].load(Ordering::Relaxed);
        SchedulerSnapshot {
            id: s,
            qsize: g.qsize[s].load(Ordering::Relaxed),
            pending: g.pending[s].load(Ordering::Relaxed),
            maxsize: self.inner.config.limits[s].maxsize,
            last_activity: (last != i64::MIN)
                .then(|| DateTime::from_timestamp_micros(last))
                .flatten(),
        }
    }

    /// `s`'s figures wherever its heap is: this instance's own when it owns `s`, else the
    /// owner's (forwarded), so `/schedulers` answers the same on every instance; counted from
    /// the table while no owner can be reached (queued tasks by a scan of `tasks`: they have no
    /// queue row). An owner that refuses the request is answered as every forwarded command is:
    /// a scan per request would hide a misconfigured peer token. `last_activity` is known to
    /// the owner only.
    pub async fn scheduler_view(&self, s: SchedulerId) -> Result<SchedulerSnapshot, QueueError> {
        let mut view = self.snapshot(s);
        if self.is_local(s) {
            return Ok(view);
        }
        let (queued, pending) = match self.counts(s).await {
            Ok(counts) => counts,
            Err(QueueError::Moving(_)) => {
                tracing::debug!(scheduler.id = %s, "no owner to ask for its counts; counting the table");
                self.read(move |c| {
                    let count = |c: &mut storage::AnyConnection, status| {
                        storage::tasks::count_waiting(c, s, status)
                            .map_err(|e| QueueError::from(StorageError::from(e)))
                    };
                    Ok((
                        count(c, TaskStatus::Queued)?,
                        count(c, TaskStatus::Pending)?,
                    ))
                })
                .await?
            }
            Err(e) => return Err(e),
        };
        view.qsize = queued;
        view.pending = pending;
        Ok(view)
    }

    /// `(queued, pending)` of `s`, as its owner's heap and count hold them.
    pub async fn counts(&self, s: SchedulerId) -> Result<(u64, u64), QueueError> {
        self.routed_within(
            std::time::Duration::ZERO,
            s,
            (),
            |()| {
                let view = self.snapshot(s);
                std::future::ready(Ok((view.qsize, view.pending)))
            },
            |()| Forward::Counts,
        )
        .await
    }

    /// When the oldest task in `s`'s heap was created; `None` for an empty heap.
    pub fn oldest_queued(&self, s: SchedulerId) -> Option<DateTime<Utc>> {
        let m = self.inner.gauges.oldest[s].load(Ordering::Relaxed);
        (m != i64::MIN)
            .then(|| DateTime::from_timestamp_micros(m))
            .flatten()
    }

    /// How long the oldest task in `s`'s heap has waited, on the broker's clock; `None` for an
    /// empty heap.
    pub fn oldest_queued_age(&self, s: SchedulerId) -> Option<Duration> {
        self.oldest_queued(s)
            .map(|t| (self.inner.clock.now() - t).to_std().unwrap_or_default())
    }

    /// Operations, transitions, lease expiries and batch sizes so far.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.gauges.metrics
    }

    /// Tasks in the table per scheduler and status (mula's `scheduler_task_status_counts`),
    /// counted at most once per [`STATUS_COUNTS_MAX_AGE`], concurrent callers waiting for one
    /// count, each at most [`STATUS_COUNTS_WAIT`]. A count that takes longer goes on in the
    /// background and the next call serves it; meanwhile the last count is answered, if any. (A
    /// count dropped at the wait would never land once the table took longer than the wait to
    /// count, and each period would start another only to drop it.)
    pub async fn task_status_counts(&self) -> Option<PerScheduler<ByStatus>> {
        let mut cache = self.inner.gauges.metrics.status_counts.lock().await;
        let stale = cache
            .tried
            .is_none_or(|at| at.elapsed() >= STATUS_COUNTS_MAX_AGE);
        if cache.counting.is_none() && stale {
            cache.tried = Some(Instant::now());
            let broker = self.clone();
            cache.counting = Some(tokio::spawn(async move { broker.count_statuses().await }));
        }
        if let Some(counting) = cache.counting.as_mut() {
            match tokio::time::timeout(STATUS_COUNTS_WAIT, counting).await {
                Ok(done) => {
                    cache.counting = None;
                    if let Some(counts) = done.ok().flatten() {
                        cache.counts = Some(counts);
                    }
                }
                Err(_) => tracing::warn!(
                    wait_ms = STATUS_COUNTS_WAIT.as_millis() as u64,
                    "counting the tasks per status for /metrics takes longer than a scrape waits; the last count is served, and the next scrape serves this one"
                ),
            }
        }
        cache.counts.clone()
    }

    /// One count of the table per scheduler and status; none when it fails (logged).
    async fn count_statuses(&self) -> Option<PerScheduler<ByStatus>> {
        let started = Instant::now();
        let rows = self
            .read(|c| {
                storage::tasks::count_by_scheduler_and_status(c)
                    .map_err(|e| QueueError::from(StorageError::from(e)))
            })
            .await;
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "cannot count the tasks per status for /metrics");
                return None;
            }
        };
        tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "counted the tasks per status for /metrics"
        );
        let mut counts = PerScheduler::<ByStatus>::default();
        for row in rows {
            if let (Ok(s), Ok(status)) = (
                row.scheduler_id.parse::<SchedulerId>(),
                row.status.parse::<TaskStatus>(),
            ) {
                counts[s][status_slot(status)] = u64::try_from(row.count).unwrap_or(0);
            }
        }
        Some(counts)
    }

    /// The database pool's connections: (in use, idle, bound).
    pub fn pool_state(&self) -> (u32, u32, u32) {
        let st = self.inner.pool.state();
        (
            st.connections - st.idle_connections,
            st.idle_connections,
            self.inner.pool.max_size(),
        )
    }

    /// The engine's counters.
    pub fn engine_counters(&self) -> &EngineCounters {
        &self.inner.gauges.engine
    }

    /// Whether the database answers (`false`) and, if it takes no writes now, why (see
    /// [`storage::write_state`]): one checkout and one round trip for `/health`.
    pub async fn database_state(&self) -> (bool, Option<String>) {
        let pool = self.inner.pool.clone();
        match tokio::task::spawn_blocking(move || storage::write_state(&pool)).await {
            Ok(Ok(refusing)) => (true, refusing),
            _ => (false, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_the_request_broke_is_a_bad_request_and_a_lost_database_a_503() {
        let refused = StorageError::Query(diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::Unknown,
            Box::new("value too long for type character varying(32)".to_owned()),
        ));
        assert!(matches!(
            QueueError::from(refused),
            QueueError::BadRequest(_)
        ));
        let down = StorageError::Unavailable("connection refused".into());
        assert!(matches!(QueueError::from(down), QueueError::Unavailable(_)));
    }
}
