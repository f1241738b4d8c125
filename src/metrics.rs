//! What the service counts for `/metrics`: the registry the engines, the cron tables and the API
//! record into, its histograms, and the writer of Prometheus' text format.
//!
//! Recording is a few relaxed atomic adds: no lock on the paths that pops and pushes take.
//! Figures that other parts already keep (heap depth, listener and ColdStart counters, the
//! connection pool) are read from their owners when `/metrics` is scraped, not copied here.
//! The process' own figures are read from `/proc/self` at scrape time, and mula's per-status task
//! counts from the table at most once per [`STATUS_COUNTS_MAX_AGE`].
//! Every metric the service exposes is listed in [`CATALOGUE`], which `/metrics` takes its help
//! texts from and docs/OPERATIONS.md is checked against.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::domain::fire::FireReason;
use crate::domain::{PerScheduler, TaskStatus};

/// How old the counts of `scheduler_task_status_counts` may be before a scrape counts again.
/// Counting is a `GROUP BY` over the whole task table (finished tasks included, as mula counts
/// them), so it is done at most once a minute per instance, whatever the scrape rate.
pub const STATUS_COUNTS_MAX_AGE: Duration = Duration::from_secs(60);
/// How long a scrape waits for that count: past it (a slow or unreachable database) the page is
/// served with the last count, so the figures that show an outage are not lost with it.
pub const STATUS_COUNTS_WAIT: Duration = Duration::from_secs(2);

/// The last count of `scheduler_task_status_counts`.
#[derive(Debug, Default)]
pub(crate) struct StatusCountsCache {
    /// When a count was last tried, whether it succeeded or not.
    pub(crate) tried: Option<Instant>,
    /// The last count that succeeded.
    pub(crate) counts: Option<PerScheduler<ByStatus>>,
}

/// Latency buckets, in seconds: from a cached answer (0.5 ms) to a stalled disk (10 s).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
/// Group-commit batch sizes, in commands per transaction.
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];
/// Cron entry durations, in seconds: a watchdog sweep to a re-score of a deep backlog.
pub const CRON_BUCKETS: &[f64] = &[0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0];

/// A count per task status, in [`TaskStatus::ALL`] order.
pub type ByStatus = [u64; TaskStatus::ALL.len()];

/// Where `status` counts in a [`ByStatus`].
pub fn status_slot(status: TaskStatus) -> usize {
    TaskStatus::ALL
        .iter()
        .position(|x| *x == status)
        .unwrap_or_default()
}

/// A Prometheus histogram: a count per bucket (not cumulative; the writer sums them), the sum
/// of the observations and their count.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One per bound, then one for `+Inf`.
    buckets: Box<[AtomicU64]>,
    /// The sum, in millionths of the unit (atomics hold integers).
    sum_micro: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_micro: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// Records one observation of `value` (seconds, or a count).
    pub fn observe(&self, value: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micro
            .fetch_add((value.max(0.0) * 1e6) as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a duration, in seconds.
    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// The operations clients call on a queue, each counted and timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `POST /schedulers/{id}/push` and every other push (planner, cron).
    Push = 0,
    /// `POST /schedulers/{id}/pop`.
    Pop = 1,
    /// `PATCH /tasks/{id}`.
    Patch = 2,
}

impl Op {
    /// All of them, in label order.
    pub const ALL: [Op; 3] = [Op::Push, Op::Pop, Op::Patch];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Push => "push",
            Op::Pop => "pop",
            Op::Patch => "patch",
        }
    }
}

/// How one object lookup in Octopoes ended (the frontier lacked the object).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupOutcome {
    /// Octopoes holds it.
    Found = 0,
    /// Octopoes' own "not found".
    NotFound = 1,
    /// No answer that says anything: unreachable, an error status, a 404 of no object.
    Failed = 2,
    /// Not asked now: the organisation's backoff after failures, or the run's budget spent.
    Deferred = 3,
}

impl LookupOutcome {
    /// All of them, in label order.
    pub const ALL: [LookupOutcome; 4] = [
        LookupOutcome::Found,
        LookupOutcome::NotFound,
        LookupOutcome::Failed,
        LookupOutcome::Deferred,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            LookupOutcome::Found => "found",
            LookupOutcome::NotFound => "not_found",
            LookupOutcome::Failed => "failed",
            LookupOutcome::Deferred => "deferred",
        }
    }
}

/// How the queue answered one operation: a success, a refusal the caller caused (normal in a
/// busy system: a duplicate push, a full queue, an unknown task, an illegal transition, bad
/// input), or an error of the service (unavailable, busy, shed, internal). Only the last is
/// what an operator acts on, so refusals are counted apart from errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered with a success.
    Ok = 0,
    /// Refused for what the request asked (a 4xx answer).
    Refused = 1,
    /// Not served (a 5xx answer).
    Error = 2,
}

impl Outcome {
    /// All of them, in label order.
    pub const ALL: [Outcome; 3] = [Outcome::Ok, Outcome::Refused, Outcome::Error];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Refused => "refused",
            Outcome::Error => "error",
        }
    }
}

/// One operation's figures on one scheduler.
#[derive(Debug)]
pub struct OpFigures {
    /// Answers by [`Outcome`].
    pub outcomes: [AtomicU64; 3],
    /// Time from the call to its answer, whatever the outcome.
    pub latency: Histogram,
}

impl Default for OpFigures {
    fn default() -> Self {
        Self {
            outcomes: Default::default(),
            latency: Histogram::new(LATENCY_BUCKETS),
        }
    }
}

/// One cron entry's figures on one component.
#[derive(Debug)]
pub struct CronFigures {
    /// How long its actions took.
    pub duration: Histogram,
    /// Runs whose action failed.
    pub failures: u64,
    /// How late its last run started after the time of its tick, in seconds.
    pub lag_seconds: f64,
}

/// Every figure recorded as the service runs. One per service (tests run several in a process,
/// so it is not a global).
#[derive(Debug)]
pub struct Metrics {
    ops: PerScheduler<[OpFigures; 3]>,
    /// Task rows committed, by the status they were written in.
    transitions: PerScheduler<[AtomicU64; TaskStatus::ALL.len()]>,
    /// Leases that ended: re-queued, failed.
    lease_expiries: PerScheduler<[AtomicU64; 2]>,
    /// Commands per committed transaction.
    batch_sizes: PerScheduler<Histogram>,
    /// (component, entry) → its figures; cron runs seldom, so a lock is fine here.
    cron: Mutex<BTreeMap<(&'static str, &'static str), CronFigures>>,
    /// Objects asked of Octopoes because the frontier lacked them, by [`LookupOutcome`].
    object_lookups: [AtomicU64; 4],
    /// Answers of the HTTP API by status class (1xx … 5xx).
    http_responses: [AtomicU64; 5],
    /// Schedules' due fires decided: fired on time, fired late, then skipped by reason (in
    /// [`FireReason::ALL`] order; the slots of reasons that only wait stay 0 and unwritten).
    schedule_fires: PerScheduler<[AtomicU64; 2 + FireReason::ALL.len()]>,
    /// `scheduler_task_status_counts`, as last counted from the table. A tokio lock, so
    /// concurrent scrapes wait for one count rather than each running one.
    pub(crate) status_counts: tokio::sync::Mutex<StatusCountsCache>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            ops: PerScheduler::from_fn(|_| Default::default()),
            transitions: PerScheduler::from_fn(|_| Default::default()),
            lease_expiries: PerScheduler::from_fn(|_| Default::default()),
            batch_sizes: PerScheduler::from_fn(|_| Histogram::new(BATCH_BUCKETS)),
            cron: Mutex::default(),
            object_lookups: Default::default(),
            http_responses: Default::default(),
            schedule_fires: PerScheduler::from_fn(|_| Default::default()),
            status_counts: Default::default(),
        }
    }
}

impl Metrics {
    /// Records one answered operation.
    pub fn op(&self, s: crate::domain::SchedulerId, op: Op, outcome: Outcome, took: Duration) {
        let f = &self.ops[s][op as usize];
        f.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
        f.latency.observe_duration(took);
    }

    /// Records one answer of the HTTP API with `status`.
    pub fn http_response(&self, status: u16) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.http_responses[class].fetch_add(1, Ordering::Relaxed);
    }

    /// Answers of the HTTP API of status class `class` (1 … 5) so far.
    pub fn http_responses_of(&self, class: usize) -> u64 {
        self.http_responses
            .get(class.wrapping_sub(1))
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }

    /// One operation's figures.
    pub fn op_figures(&self, s: crate::domain::SchedulerId, op: Op) -> &OpFigures {
        &self.ops[s][op as usize]
    }

    /// Records task rows committed, counted by the status they were written in.
    pub fn transitions(&self, s: crate::domain::SchedulerId, written: &ByStatus) {
        for (counter, n) in self.transitions[s].iter().zip(written) {
            if *n > 0 {
                counter.fetch_add(*n, Ordering::Relaxed);
            }
        }
    }

    /// Task rows committed in `status` so far.
    pub fn transitions_to(&self, s: crate::domain::SchedulerId, status: TaskStatus) -> u64 {
        self.transitions[s][status_slot(status)].load(Ordering::Relaxed)
    }

    /// Records leases that ended: tasks re-queued and tasks failed for it.
    pub fn lease_expiries(&self, s: crate::domain::SchedulerId, requeued: u64, failed: u64) {
        self.lease_expiries[s][0].fetch_add(requeued, Ordering::Relaxed);
        self.lease_expiries[s][1].fetch_add(failed, Ordering::Relaxed);
    }

    /// Records `n` object lookups that ended as `outcome`.
    pub fn object_lookups(&self, outcome: LookupOutcome, n: u64) {
        self.object_lookups[outcome as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Object lookups that ended as `outcome` so far.
    pub fn object_lookups_of(&self, outcome: LookupOutcome) -> u64 {
        self.object_lookups[outcome as usize].load(Ordering::Relaxed)
    }

    /// Records one due fire of a schedule decided and committed: fired (`skipped` is `None`) or
    /// skipped for a reason, and whether it was decided late.
    pub fn schedule_fire(
        &self,
        s: crate::domain::SchedulerId,
        skipped: Option<FireReason>,
        late: bool,
    ) {
        let slot = match skipped {
            None => usize::from(late),
            Some(r) => 2 + FireReason::ALL.iter().position(|x| *x == r).unwrap_or(0),
        };
        self.schedule_fires[s][slot].fetch_add(1, Ordering::Relaxed);
    }

    /// Records one committed transaction of `commands` commands.
    pub fn batch(&self, s: crate::domain::SchedulerId, commands: usize) {
        self.batch_sizes[s].observe(commands as f64);
    }

    /// Records one run of a cron entry.
    pub fn cron_run(
        &self,
        component: &'static str,
        entry: &'static str,
        lag: Duration,
        took: Duration,
        failed: bool,
    ) {
        let mut cron = self
            .cron
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let f = cron
            .entry((component, entry))
            .or_insert_with(|| CronFigures {
                duration: Histogram::new(CRON_BUCKETS),
                failures: 0,
                lag_seconds: 0.0,
            });
        f.duration.observe_duration(took);
        f.failures += u64::from(failed);
        f.lag_seconds = lag.as_secs_f64();
    }

    /// Writes the figures recorded here (the rest of the page comes from their owners).
    pub fn write(&self, out: &mut Exposition) {
        out.family("scheduler_requests_total");
        for (s, ops) in self.ops.iter() {
            for op in Op::ALL {
                let f = &ops[op as usize];
                for outcome in Outcome::ALL {
                    out.sample(
                        "scheduler_requests_total",
                        &[
                            ("scheduler_id", s.as_str()),
                            ("op", op.as_str()),
                            ("outcome", outcome.as_str()),
                        ],
                        f.outcomes[outcome as usize].load(Ordering::Relaxed) as f64,
                    );
                }
            }
        }
        out.family("scheduler_request_duration_seconds");
        for (s, ops) in self.ops.iter() {
            for op in Op::ALL {
                out.histogram(
                    "scheduler_request_duration_seconds",
                    &[("scheduler_id", s.as_str()), ("op", op.as_str())],
                    &ops[op as usize].latency,
                );
            }
        }
        out.family("scheduler_task_transitions_total");
        for (s, counts) in self.transitions.iter() {
            for (status, n) in TaskStatus::ALL.iter().zip(counts) {
                out.sample(
                    "scheduler_task_transitions_total",
                    &[("scheduler_id", s.as_str()), ("status", status.as_str())],
                    n.load(Ordering::Relaxed) as f64,
                );
            }
        }
        out.family("scheduler_lease_expiries_total");
        for (s, [requeued, failed]) in self.lease_expiries.iter() {
            for (outcome, n) in [("requeued", requeued), ("failed", failed)] {
                out.sample(
                    "scheduler_lease_expiries_total",
                    &[("scheduler_id", s.as_str()), ("outcome", outcome)],
                    n.load(Ordering::Relaxed) as f64,
                );
            }
        }
        out.family("scheduler_batch_commands");
        for (s, h) in self.batch_sizes.iter() {
            out.histogram(
                "scheduler_batch_commands",
                &[("scheduler_id", s.as_str())],
                h,
            );
        }
        let cron = self
            .cron
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        out.family("scheduler_cron_duration_seconds");
        for ((component, entry), f) in cron.iter() {
            out.histogram(
                "scheduler_cron_duration_seconds",
                &[("component", component), ("entry", entry)],
                &f.duration,
            );
        }
        out.family("scheduler_cron_failures_total");
        for ((component, entry), f) in cron.iter() {
            out.sample(
                "scheduler_cron_failures_total",
                &[("component", component), ("entry", entry)],
                f.failures as f64,
            );
        }
        out.family("scheduler_object_lookups_total");
        for outcome in LookupOutcome::ALL {
            out.sample(
                "scheduler_object_lookups_total",
                &[("outcome", outcome.as_str())],
                self.object_lookups_of(outcome) as f64,
            );
        }
        out.family("scheduler_cron_lag_seconds");
        for ((component, entry), f) in cron.iter() {
            out.sample(
                "scheduler_cron_lag_seconds",
                &[("component", component), ("entry", entry)],
                f.lag_seconds,
            );
        }
        out.family("scheduler_schedule_fires_total");
        for (s, slots) in self.schedule_fires.iter() {
            let fired = [("on_time", &slots[0]), ("late", &slots[1])];
            let skipped = FireReason::ALL
                .iter()
                .zip(&slots[2..])
                .filter(|(r, _)| r.skips())
                .map(|(r, n)| (r.as_str(), n));
            for (outcome, (reason, n)) in fired
                .into_iter()
                .map(|f| ("fired", f))
                .chain(skipped.map(|k| ("skipped", k)))
            {
                out.sample(
                    "scheduler_schedule_fires_total",
                    &[
                        ("scheduler_id", s.as_str()),
                        ("outcome", outcome),
                        ("reason", reason),
                    ],
                    n.load(Ordering::Relaxed) as f64,
                );
            }
        }
        out.family("scheduler_http_responses_total");
        for (class, label) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
            out.sample(
                "scheduler_http_responses_total",
                &[("status_class", label)],
                self.http_responses_of(class + 1) as f64,
            );
        }
    }
}

/// The process' own figures, as Prometheus' client libraries name them, read from `/proc/self`
/// at scrape time (Linux only: elsewhere nothing is written).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ProcessFigures {
    /// User and system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory, in bytes.
    pub resident_memory_bytes: f64,
    /// Virtual memory, in bytes.
    pub virtual_memory_bytes: f64,
    /// Open file descriptors.
    pub open_fds: f64,
    /// The limit of open file descriptors (the soft one).
    pub max_fds: f64,
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

/// Clock ticks per second of `/proc`'s times (`USER_HZ`): 100 on every Linux architecture the
/// service is built for; reading `sysconf(_SC_CLK_TCK)` would take `unsafe` code.
const USER_HZ: f64 = 100.0;

impl ProcessFigures {
    /// This process' figures; `None` where `/proc` is not there.
    pub fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
        Self::parse(&stat, &status, &boot, &limits, open_fds)
    }

    /// The figures from the text of `/proc/self/stat`, `/proc/self/status`, `/proc/stat` and
    /// `/proc/self/limits`, and the count of `/proc/self/fd`.
    pub fn parse(
        stat: &str,
        status: &str,
        boot: &str,
        limits: &str,
        open_fds: usize,
    ) -> Option<Self> {
        // The command name, in parentheses, may hold spaces: fields are counted after it.
        let fields: Vec<&str> = stat
            .get(stat.rfind(')')? + 1..)?
            .split_whitespace()
            .collect();
        // Fields 14, 15, 22 and 23 of proc(5), counted from field 3 (the state).
        let number = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
        let (utime, stime) = (number(11)?, number(12)?);
        let started_ticks = number(19)?;
        let virtual_bytes = number(20)?;
        let rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        let btime = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse::<f64>().ok())?;
        let max_fds = limits
            .lines()
            .find_map(|l| l.strip_prefix("Max open files"))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        Some(Self {
            cpu_seconds: (utime + stime) / USER_HZ,
            resident_memory_bytes: rss_kib * 1024.0,
            virtual_memory_bytes: virtual_bytes,
            open_fds: open_fds as f64,
            max_fds,
            start_time_seconds: btime + started_ticks / USER_HZ,
        })
    }

    /// Writes the `process_*` families.
    pub fn write(&self, out: &mut Exposition) {
        for (name, value) in [
            ("process_cpu_seconds_total", self.cpu_seconds),
            ("process_resident_memory_bytes", self.resident_memory_bytes),
            ("process_virtual_memory_bytes", self.virtual_memory_bytes),
            ("process_open_fds", self.open_fds),
            ("process_max_fds", self.max_fds),
            ("process_start_time_seconds", self.start_time_seconds),
        ] {
            out.family(name);
            out.sample(name, &[], value);
        }
    }
}

/// A metric's name, type, labels and meaning: what `/metrics` serves and the docs list.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// Its name.
    pub name: &'static str,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Its labels, comma-separated.
    pub labels: &'static str,
    /// What it measures.
    pub help: &'static str,
}

const fn family(
    name: &'static str,
    kind: &'static str,
    labels: &'static str,
    help: &'static str,
) -> Family {
    Family {
        name,
        kind,
        labels,
        help,
    }
}

/// Every metric `/metrics` serves.
pub const CATALOGUE: &[Family] = &[
    family(
        "scheduler_qsize",
        "gauge",
        "scheduler_id",
        "Tasks queued in the scheduler's in-memory heap.",
    ),
    family(
        "scheduler_pending",
        "gauge",
        "scheduler_id",
        "Tasks waiting in the database outside the full heap.",
    ),
    family(
        "scheduler_maxsize",
        "gauge",
        "scheduler_id",
        "The bound of the scheduler's heap.",
    ),
    family(
        "scheduler_oldest_queued_age_seconds",
        "gauge",
        "scheduler_id",
        "Age of the oldest task in the heap (0 when it is empty).",
    ),
    family(
        "scheduler_requests_total",
        "counter",
        "scheduler_id,op,outcome",
        "Pushes, pops and patches the queue answered, by outcome: ok, refused (what the request asked cannot be done: a duplicate, a full queue, an unknown task, an illegal transition, bad input; a 4xx answer) or error (the service could not serve it: unavailable, busy, shed, internal; a 5xx answer); a request refused before it reaches the queue (a malformed body) is not counted, and a forwarded one is counted by the owner that applied it.",
    ),
    family(
        "scheduler_request_duration_seconds",
        "histogram",
        "scheduler_id,op",
        "Time from a push, pop or patch reaching the queue to its answer (committed).",
    ),
    family(
        "scheduler_task_status_counts",
        "gauge",
        "scheduler_id,status",
        "Tasks in the database per status, finished ones included (mula's family); counted from the table at most once a minute.",
    ),
    family(
        "scheduler_task_transitions_total",
        "counter",
        "scheduler_id,status",
        "Task rows committed, by the status they were written in.",
    ),
    family(
        "scheduler_lease_expiries_total",
        "counter",
        "scheduler_id,outcome",
        "Leases that ended before the worker reported: the task re-queued or failed.",
    ),
    family(
        "scheduler_batch_commands",
        "histogram",
        "scheduler_id",
        "Commands per committed transaction (group commit).",
    ),
    family(
        "scheduler_engine_batches_total",
        "counter",
        "",
        "Transactions the queue engines committed.",
    ),
    family(
        "scheduler_engine_commands_total",
        "counter",
        "",
        "Pushes, pops and patches answered from committed transactions (÷ batches: the batch size).",
    ),
    family(
        "scheduler_engine_statements_total",
        "counter",
        "",
        "Statements written by committed transactions.",
    ),
    family(
        "scheduler_engine_apply_seconds_total",
        "counter",
        "",
        "Time spent reading and deciding batches, before their writes.",
    ),
    family(
        "scheduler_engine_batch_seconds_total",
        "counter",
        "",
        "Time from a batch's first read to the end of its commit.",
    ),
    family(
        "scheduler_engine_failed_batches_total",
        "counter",
        "",
        "Transactions the queue engines rolled back.",
    ),
    family(
        "scheduler_engine_shed_total",
        "counter",
        "",
        "Commands answered without being applied: pops whose caller had gone, commands that waited too long.",
    ),
    family(
        "scheduler_listener_messages_total",
        "counter",
        "queue,outcome",
        "AMQP messages by outcome: received, acked, dead_lettered, retried.",
    ),
    family(
        "scheduler_listener_lag_messages",
        "gauge",
        "queue",
        "Messages ready in the queue, not yet delivered to the listener (read at most once a second).",
    ),
    family(
        "scheduler_listener_up",
        "gauge",
        "",
        "1 while the listener consumes, else 0.",
    ),
    family(
        "scheduler_coldstart_objects",
        "gauge",
        "kind",
        "ColdStart's current (or last) round: objects loaded, objects known from the first pages, tasks planned, objects found gone.",
    ),
    family(
        "scheduler_coldstart_organisations",
        "gauge",
        "state",
        "ColdStart's current (or last) round: organisations in it, done, failed.",
    ),
    family(
        "scheduler_coldstart_rounds_total",
        "counter",
        "",
        "ColdStart rounds completed since start.",
    ),
    family(
        "scheduler_cron_duration_seconds",
        "histogram",
        "component,entry",
        "How long each cron entry's action took.",
    ),
    family(
        "scheduler_cron_failures_total",
        "counter",
        "component,entry",
        "Cron entry runs whose action failed.",
    ),
    family(
        "scheduler_cron_lag_seconds",
        "gauge",
        "component,entry",
        "How late the entry's last run started after its tick's time.",
    ),
    family(
        "scheduler_object_lookups_total",
        "counter",
        "outcome",
        "Objects asked of Octopoes because the frontier lacked them: found, not_found, failed (no answer that says anything) or deferred (backing off, or the run's budget spent).",
    ),
    family(
        "scheduler_schedule_fires_total",
        "counter",
        "scheduler_id,outcome,reason",
        "Schedules' due fires decided: fired (reason on_time, or late: decided more than one cron tick after it was due) or skipped (reason: plugin_gone, plugin_disabled, object_gone, not_permitted, task_refused, still_running, duplicate_queued, within_grace_period). A fire that waits is counted once decided.",
    ),
    family(
        "scheduler_db_pool_connections",
        "gauge",
        "state",
        "Database connections of the pool: idle or in use.",
    ),
    family("scheduler_db_pool_max", "gauge", "", "The pool's bound."),
    family(
        "scheduler_ownership_owned",
        "gauge",
        "scheduler_id",
        "1 when this instance owns the scheduler's heap (always 1 on SQLite, which runs one instance).",
    ),
    family(
        "scheduler_ownership_owner_info",
        "gauge",
        "scheduler_id,owner,address",
        "The scheduler's owner (its instance id) as this instance last read it (always 1; PostgreSQL only).",
    ),
    family(
        "scheduler_ownership_epoch",
        "gauge",
        "scheduler_id",
        "The scheduler's ownership epoch (fencing token) as last read; raised by every takeover.",
    ),
    family(
        "scheduler_ownership_takeovers_total",
        "counter",
        "scheduler_id",
        "Leases of the scheduler this instance took (its first included).",
    ),
    family(
        "scheduler_http_responses_total",
        "counter",
        "status_class",
        "Answers of the HTTP API by status class (1xx to 5xx), every route included: the 5xx of reads, schedules and health too.",
    ),
    family(
        "scheduler_dependency_failures_total",
        "counter",
        "service,kind",
        "Calls to Katalogus, Octopoes or Bytes that failed: unreachable (no answer after the retries), status (an answer outside 2xx other than 404) or decode (a 2xx body not as the API promises). Health checks are not counted.",
    ),
    family(
        "process_cpu_seconds_total",
        "counter",
        "",
        "User and system CPU time of the process (Linux only).",
    ),
    family(
        "process_resident_memory_bytes",
        "gauge",
        "",
        "Resident memory of the process (Linux only).",
    ),
    family(
        "process_virtual_memory_bytes",
        "gauge",
        "",
        "Virtual memory of the process (Linux only).",
    ),
    family(
        "process_open_fds",
        "gauge",
        "",
        "Open file descriptors of the process (Linux only).",
    ),
    family(
        "process_max_fds",
        "gauge",
        "",
        "The process' limit of open file descriptors (Linux only).",
    ),
    family(
        "process_start_time_seconds",
        "gauge",
        "",
        "When the process started, in seconds since the Unix epoch (Linux only).",
    ),
    family(
        "app_settings_info",
        "gauge",
        "version,schedulers",
        "Build information (always 1).",
    ),
];

/// A page of Prometheus' text format (version 0.0.4) being written.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a family: its `# HELP` and `# TYPE` lines, from [`CATALOGUE`].
    pub fn family(&mut self, name: &str) {
        if let Some(f) = CATALOGUE.iter().find(|f| f.name == name) {
            let _ = writeln!(self.out, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(self.out, "# TYPE {} {}", f.name, f.kind);
        }
    }

    /// One sample.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        write_labels(&mut self.out, labels, None);
        let _ = writeln!(self.out, " {}", number(value));
    }

    /// A histogram's `_bucket` (cumulative), `_sum` and `_count` samples.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram) {
        let mut cumulative = 0;
        for (i, n) in h.buckets.iter().enumerate() {
            cumulative += n.load(Ordering::Relaxed);
            let le = h.bounds.get(i).map_or("+Inf".to_owned(), |b| number(*b));
            let _ = write!(self.out, "{name}_bucket");
            write_labels(&mut self.out, labels, Some(&le));
            let _ = writeln!(self.out, " {cumulative}");
        }
        let sum = h.sum_micro.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = write!(self.out, "{name}_sum");
        write_labels(&mut self.out, labels, None);
        let _ = writeln!(self.out, " {}", number(sum));
        let _ = write!(self.out, "{name}_count");
        write_labels(&mut self.out, labels, None);
        let _ = writeln!(self.out, " {}", h.count());
    }

    /// The page.
    pub fn finish(self) -> String {
        self.out
    }
}

fn write_labels(out: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (k, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
        if !first {
            out.push(',');
        }
        first = false;
        let _ = write!(out, "{k}=\"");
        // The format's three escapes: backslash, quote, newline.
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
}

/// A sample value as Prometheus reads it: integers without a fraction.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::SchedulerId;

    #[test]
    fn histogram_buckets_are_cumulative_with_sum_and_count() {
        let h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.5, 0.7, 3.0] {
            h.observe(v);
        }
        let mut out = Exposition::default();
        out.histogram("x", &[("a", "b")], &h);
        let page = out.finish();
        assert!(page.contains("x_bucket{a=\"b\",le=\"0.1\"} 1\n"), "{page}");
        assert!(page.contains("x_bucket{a=\"b\",le=\"1\"} 3\n"), "{page}");
        assert!(page.contains("x_bucket{a=\"b\",le=\"+Inf\"} 4\n"), "{page}");
        assert!(page.contains("x_sum{a=\"b\"} 4.25\n"), "{page}");
        assert!(page.contains("x_count{a=\"b\"} 4\n"), "{page}");
    }

    #[test]
    fn label_values_are_escaped() {
        let mut out = Exposition::default();
        out.sample("y", &[("q", "a\"b\\c\nd")], 2.0);
        assert_eq!(out.finish(), "y{q=\"a\\\"b\\\\c\\nd\"} 2\n");
    }

    #[test]
    fn operations_and_transitions_are_counted_per_scheduler() {
        let m = Metrics::default();
        m.op(
            SchedulerId::Boefje,
            Op::Pop,
            Outcome::Ok,
            Duration::from_millis(3),
        );
        m.op(
            SchedulerId::Boefje,
            Op::Pop,
            Outcome::Error,
            Duration::from_millis(30),
        );
        m.op(
            SchedulerId::Boefje,
            Op::Pop,
            Outcome::Refused,
            Duration::from_millis(1),
        );
        let mut written = ByStatus::default();
        written[status_slot(TaskStatus::Dispatched)] = 5;
        m.transitions(SchedulerId::Boefje, &written);
        let f = m.op_figures(SchedulerId::Boefje, Op::Pop);
        for outcome in Outcome::ALL {
            assert_eq!(f.outcomes[outcome as usize].load(Ordering::Relaxed), 1);
        }
        assert_eq!(f.latency.count(), 3);
        assert_eq!(
            m.op_figures(SchedulerId::Normalizer, Op::Pop)
                .latency
                .count(),
            0
        );
        assert_eq!(
            m.transitions_to(SchedulerId::Boefje, TaskStatus::Dispatched),
            5
        );
        assert_eq!(
            m.transitions_to(SchedulerId::Report, TaskStatus::Dispatched),
            0
        );
        let mut out = Exposition::default();
        m.write(&mut out);
        let page = out.finish();
        assert!(page.contains(
            "scheduler_requests_total{scheduler_id=\"boefje\",op=\"pop\",outcome=\"error\"} 1\n"
        ));
        assert!(page.contains(
            "scheduler_requests_total{scheduler_id=\"boefje\",op=\"pop\",outcome=\"refused\"} 1\n"
        ));
        assert!(page.contains(
            "scheduler_task_transitions_total{scheduler_id=\"boefje\",status=\"dispatched\"} 5\n"
        ));
    }

    #[test]
    fn schedule_fires_are_counted_by_outcome_and_skip_reason() {
        let m = Metrics::default();
        m.schedule_fire(SchedulerId::Report, None, false);
        m.schedule_fire(SchedulerId::Report, None, true);
        m.schedule_fire(SchedulerId::Report, None, true);
        m.schedule_fire(SchedulerId::Boefje, Some(FireReason::StillRunning), true);
        let mut out = Exposition::default();
        m.write(&mut out);
        let page = out.finish();
        let sample = |labels: &str| format!("scheduler_schedule_fires_total{{{labels}}}");
        for (labels, n) in [
            (
                "scheduler_id=\"report\",outcome=\"fired\",reason=\"on_time\"",
                1,
            ),
            (
                "scheduler_id=\"report\",outcome=\"fired\",reason=\"late\"",
                2,
            ),
            (
                "scheduler_id=\"boefje\",outcome=\"skipped\",reason=\"still_running\"",
                1,
            ),
            (
                "scheduler_id=\"report\",outcome=\"skipped\",reason=\"still_running\"",
                0,
            ),
        ] {
            assert!(
                page.contains(&format!("{} {n}\n", sample(labels))),
                "{labels}: {page}"
            );
        }
        assert!(
            !page.contains("reason=\"octopoes_unavailable\""),
            "a waiting fire is not a decided one"
        );
    }

    #[test]
    fn process_figures_are_read_from_procs_text() {
        // A command name with a space and a parenthesis, as proc(5) allows.
        let stat = "42 (kat sched) x) S 1 42 42 0 -1 4194304 97 0 0 0 250 50 0 0 20 0 9 0 1000 \
                    1073741824 359 18446744073709551615";
        let status = "Name:\tkat\nVmRSS:\t   2048 kB\n";
        let boot = "cpu  1 2 3\nbtime 1700000000\n";
        let limits = "Limit  Soft Limit  Hard Limit  Units\n\
                      Max open files            1024                 524288               files\n";
        let p = ProcessFigures::parse(stat, status, boot, limits, 12).unwrap();
        assert_eq!(
            p,
            ProcessFigures {
                cpu_seconds: 3.0,
                resident_memory_bytes: 2048.0 * 1024.0,
                virtual_memory_bytes: 1073741824.0,
                open_fds: 12.0,
                max_fds: 1024.0,
                start_time_seconds: 1700000010.0,
            }
        );
        assert_eq!(ProcessFigures::parse("garbage", "", "", "", 0), None);
    }

    #[test]
    fn the_operations_guide_lists_every_family_with_its_type() {
        let guide =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/OPERATIONS.md"))
                .unwrap();
        for f in CATALOGUE {
            let row = format!("| `{}` | {} |", f.name, f.kind);
            assert!(guide.contains(&row), "docs/OPERATIONS.md has no row {row}");
        }
    }

    #[test]
    fn every_family_has_a_help_text_and_a_known_type() {
        for f in CATALOGUE {
            assert!(!f.help.is_empty(), "{}", f.name);
            assert!(
                ["counter", "gauge", "histogram"].contains(&f.kind),
                "{}",
                f.name
            );
        }
    }
}
