//! What the engines publish for readers without a command: each scheduler's heap depth,
//! pending count, oldest task and last activity, and the engines' counters, read by the
//! schedulers' API, `/metrics` and the health check.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use chrono::{DateTime, NaiveDateTime, Utc};

use crate::domain::{PerScheduler, SchedulerId};
use crate::metrics::Metrics;

/// Live per-scheduler figures the engines publish for readers.
#[derive(Debug)]
pub(crate) struct Gauges {
    pub(super) qsize: PerScheduler<AtomicU64>,
    pub(super) pending: PerScheduler<AtomicU64>,
    /// When the oldest task in the heap was created, in microseconds since the epoch;
    /// `i64::MIN` for an empty heap.
    pub(super) oldest: PerScheduler<AtomicI64>,
    /// Microseconds since the epoch; `i64::MIN` for never.
    pub(super) last_activity: PerScheduler<AtomicI64>,
    /// Engine counters, for `/metrics`.
    pub(crate) engine: EngineCounters,
    /// Operations, transitions, lease expiries and batch sizes, for `/metrics`.
    pub(crate) metrics: Arc<Metrics>,
}

/// What the engine has done since start: batches, commands, and time spent.
#[derive(Debug, Default)]
pub struct EngineCounters {
    /// Transactions committed.
    pub batches: AtomicU64,
    /// Commands answered from committed batches.
    pub commands: AtomicU64,
    /// Microseconds spent reading and deciding batches, before their writes.
    pub apply_micros: AtomicU64,
    /// Microseconds from a batch's first read to the end of its commit.
    pub batch_micros: AtomicU64,
    /// Statements written by committed batches.
    pub statements: AtomicU64,
    /// Batches that failed and were rolled back.
    pub failed_batches: AtomicU64,
    /// Commands answered without being applied: pops whose caller had gone, and commands that
    /// waited past `shed_after`.
    pub shed: AtomicU64,
    /// Pops set aside until a refill under way had ended (their match may have been among its
    /// picks), so that the engine went on with the others meanwhile.
    pub set_aside: AtomicU64,
    /// Pops decided again because the write skipped every task they took (changed outside the
    /// scheduler since the engine read it): each is a sign of hand edits to waiting rows.
    pub decided_again: AtomicU64,
    /// Tasks pops took straight from the pending backlog beyond the heap (their match was not in
    /// it): many of them say the heap is small for the filters runners pop with.
    pub backlog_pops: AtomicU64,
    /// Searches of the pending backlog's indexes for such pops (a read ahead serves the next
    /// pops of the same filter without one).
    pub backlog_searches: AtomicU64,
    /// Heaps rebuilt from the table, the start's included: after a batch whose outcome is not
    /// known, a failed upkeep, a takeover. The engine serves nothing while it reads the table.
    pub rebuilds: AtomicU64,
}

impl Gauges {
    pub(super) fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            metrics,
            qsize: Default::default(),
            pending: Default::default(),
            oldest: PerScheduler::from_fn(|_| AtomicI64::new(i64::MIN)),
            last_activity: PerScheduler::from_fn(|_| AtomicI64::new(i64::MIN)),
            engine: EngineCounters::default(),
        }
    }

    pub(crate) fn set(
        &self,
        s: SchedulerId,
        qsize: usize,
        pending: u64,
        oldest: Option<NaiveDateTime>,
    ) {
        self.qsize[s].store(qsize as u64, Ordering::Relaxed);
        self.pending[s].store(pending, Ordering::Relaxed);
        self.oldest[s].store(
            oldest.map_or(i64::MIN, |t| t.and_utc().timestamp_micros()),
            Ordering::Relaxed,
        );
    }

    pub(crate) fn touch(&self, s: SchedulerId, at: DateTime<Utc>) {
        self.last_activity[s].store(at.timestamp_micros(), Ordering::Relaxed);
    }
}
