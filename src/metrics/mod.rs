//! What the service counts for `/metrics`, on the Prometheus project's Rust client
//! (`prometheus-client`): one [`Registry`] per service (tests run several in a process, so it
//! is not a global) holding the families the engines, the cron tables and the API record into,
//! the process' own figures and the build's; the client's encoder writes the page in
//! Prometheus' text format (version 0.0.4).
//!
//! Recording is a few relaxed atomic adds: no lock on the paths that pops and pushes take. A
//! labelled family's lookup takes the family's lock, so each scheduler's series are looked up
//! once, when the registry is built, and recording adds to those handles; the latency and batch
//! histograms are this module's own ([`Histogram`]), because the client's takes a lock per
//! observation. Only the cron figures are looked up as they are recorded (an entry's series
//! exists once it has run; they change a few times a second at most).
//! Figures that other parts already keep (heap depth, listener and ColdStart counters, the
//! connection pool) are read from their owners when `/metrics` is scraped, by a collector
//! `api/metrics.rs` hands to [`Metrics::encode`], not copied here. The process' own figures
//! are read from `/proc/self` at scrape time, and mula's per-status task counts from the table
//! at most once per [`STATUS_COUNTS_MAX_AGE`].
//! Every metric the service exposes is listed in [`CATALOGUE`]: what is registered or written by
//! a collector takes its name, type and help text from there, and docs/OPERATIONS.md is checked
//! against it.

mod catalogue;
mod histogram;
mod process;

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    EncodeCounterValue, EncodeGaugeValue, EncodeMetric, MetricEncoder, prometheus_text,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family as Labelled;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::domain::fire::FireReason;
use crate::domain::{PerScheduler, SchedulerId, TaskStatus};
use catalogue::register;
pub use catalogue::{CATALOGUE, Family, Kind, describe};
pub use histogram::Histogram;
pub use process::ProcessFigures;

/// The `Content-Type` of the page: Prometheus' text format, version 0.0.4, which the encoder
/// writes.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// How old the counts of `scheduler_task_status_counts` may be before a scrape counts again.
/// Counting is a `GROUP BY` over the whole task table (finished tasks included, as mula counts
/// them), so it is done at most once a minute per instance, whatever the scrape rate.
pub const STATUS_COUNTS_MAX_AGE: Duration = Duration::from_secs(60);
/// How long a scrape waits for that count: past it (a slow or unreachable database, or a table
/// long enough that counting it takes longer) the page is served with the last count, so the
/// figures that show an outage are not lost with it. The count goes on, and the next scrape
/// serves it.
pub const STATUS_COUNTS_WAIT: Duration = Duration::from_secs(2);

/// The last count of `scheduler_task_status_counts`.
#[derive(Debug, Default)]
pub(crate) struct StatusCountsCache {
    /// When a count was last started, whether it succeeded or not.
    pub(crate) tried: Option<Instant>,
    /// The last count that succeeded.
    pub(crate) counts: Option<PerScheduler<ByStatus>>,
    /// A count still running: it outlives a scrape that stopped waiting for it, so a count
    /// slower than [`STATUS_COUNTS_WAIT`] still lands (none if it failed).
    pub(crate) counting: Option<tokio::task::JoinHandle<Option<PerScheduler<ByStatus>>>>,
}

/// Latency buckets, in seconds: from a cached answer (0.5 ms) to a stalled disk (10 s).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
/// Group-commit batch sizes, in commands per transaction.
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];
/// Cron entry durations, in seconds: a watchdog sweep to a tick over a deep backlog of due
/// schedules.
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

/// How one object lookup in Octopoes ended.
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

/// What Bytes said of one piece of planned work the table has no finished run of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunLookupOutcome {
    /// Bytes has a run of the boefje on the object.
    Ran = 0,
    /// Bytes has none.
    None = 1,
    /// No answer that says anything: unreachable, slow, an error status, an unreadable body.
    Failed = 2,
    /// Not asked: Bytes is backing off after failures, or the planning step's time is spent.
    Deferred = 3,
}

impl RunLookupOutcome {
    /// All of them, in label order.
    pub const ALL: [RunLookupOutcome; 4] = [
        RunLookupOutcome::Ran,
        RunLookupOutcome::None,
        RunLookupOutcome::Failed,
        RunLookupOutcome::Deferred,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RunLookupOutcome::Ran => "ran",
            RunLookupOutcome::None => "none",
            RunLookupOutcome::Failed => "failed",
            RunLookupOutcome::Deferred => "deferred",
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

/// A label set of `N` labels, names and values known when the registry is built.
type Labels<const N: usize> = [(&'static str, &'static str); N];
/// A labelled family of counters.
type Counters<const N: usize> = Labelled<Labels<N>, Counter>;
/// A labelled family of histograms, each over the buckets its constructor gives.
type Histograms<const N: usize> = Labelled<Labels<N>, Histogram, fn() -> Histogram>;

/// The status classes of HTTP answers, in label order.
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Every figure recorded as the service runs, and the registry that writes them. One per service
/// (tests run several in a process, so it is not a global).
#[derive(Debug)]
pub struct Metrics {
    /// Every family below, the process' figures and the build's, registered once.
    registry: Registry,
    /// Answers per scheduler, by [`Op`] and [`Outcome`].
    requests: PerScheduler<[[Counter; Outcome::ALL.len()]; Op::ALL.len()]>,
    /// Time from a call to its answer, per scheduler and [`Op`], whatever the outcome.
    latency: PerScheduler<[Histogram; Op::ALL.len()]>,
    /// Task rows committed, by the status they were written in ([`TaskStatus::ALL`] order).
    transitions: PerScheduler<[Counter; TaskStatus::ALL.len()]>,
    /// Leases that ended: re-queued, failed.
    lease_expiries: PerScheduler<[Counter; 2]>,
    /// Commands per committed transaction.
    batch_sizes: PerScheduler<Histogram>,
    /// How long each cron entry's action took, by component and entry.
    cron_duration: Histograms<2>,
    /// Cron entry runs whose action failed.
    cron_failures: Counters<2>,
    /// How late each entry's last run started after the time of its tick, in seconds.
    cron_lag: Labelled<Labels<2>, Gauge<f64, AtomicU64>>,
    /// Objects asked of Octopoes before a decision that cannot be undone, by [`LookupOutcome`].
    object_lookups: [Counter; LookupOutcome::ALL.len()],
    /// Planned work without a finished run in the table, asked of Bytes, by [`RunLookupOutcome`].
    run_lookups: [Counter; RunLookupOutcome::ALL.len()],
    /// Answers of the HTTP API by status class (1xx … 5xx).
    http_responses: [Counter; STATUS_CLASSES.len()],
    /// Schedules' due fires decided: fired on time, fired late, then skipped by reason (in
    /// [`FireReason::ALL`] order; the slots of reasons that only make a fire wait are never
    /// recorded into, and not on the page).
    schedule_fires: PerScheduler<[Counter; 2 + FireReason::ALL.len()]>,
    /// `scheduler_task_status_counts`, as last counted from the table. A tokio lock, so
    /// concurrent scrapes wait for one count rather than each running one.
    pub(crate) status_counts: tokio::sync::Mutex<StatusCountsCache>,
}

impl Default for Metrics {
    fn default() -> Self {
        let requests = Counters::<3>::default();
        let latency = Histograms::<2>::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS));
        let transitions = Counters::<2>::default();
        let lease_expiries = Counters::<2>::default();
        let batch_sizes = Histograms::<1>::new_with_constructor(|| Histogram::new(BATCH_BUCKETS));
        let object_lookups = Counters::<1>::default();
        let run_lookups = Counters::<1>::default();
        let http_responses = Counters::<1>::default();
        let schedule_fires = Counters::<3>::default();
        // Every series of the fixed label sets is made here, so the page shows each from the
        // start (at 0), and its handle kept: recording never looks a family up again.
        let mut metrics = Self {
            requests: PerScheduler::from_fn(|s| {
                Op::ALL.map(|op| {
                    Outcome::ALL.map(|outcome| {
                        requests.get_or_create_owned(&[
                            ("scheduler_id", s.as_str()),
                            ("op", op.as_str()),
                            ("outcome", outcome.as_str()),
                        ])
                    })
                })
            }),
            latency: PerScheduler::from_fn(|s| {
                Op::ALL.map(|op| {
                    latency
                        .get_or_create_owned(&[("scheduler_id", s.as_str()), ("op", op.as_str())])
                })
            }),
            transitions: PerScheduler::from_fn(|s| {
                TaskStatus::ALL.map(|status| {
                    transitions.get_or_create_owned(&[
                        ("scheduler_id", s.as_str()),
                        ("status", status.as_str()),
                    ])
                })
            }),
            lease_expiries: PerScheduler::from_fn(|s| {
                ["requeued", "failed"].map(|outcome| {
                    lease_expiries
                        .get_or_create_owned(&[("scheduler_id", s.as_str()), ("outcome", outcome)])
                })
            }),
            batch_sizes: PerScheduler::from_fn(|s| {
                batch_sizes.get_or_create_owned(&[("scheduler_id", s.as_str())])
            }),
            cron_duration: Histograms::new_with_constructor(|| Histogram::new(CRON_BUCKETS)),
            cron_failures: Counters::default(),
            cron_lag: Labelled::default(),
            object_lookups: LookupOutcome::ALL.map(|outcome| {
                object_lookups.get_or_create_owned(&[("outcome", outcome.as_str())])
            }),
            run_lookups: RunLookupOutcome::ALL
                .map(|outcome| run_lookups.get_or_create_owned(&[("outcome", outcome.as_str())])),
            http_responses: STATUS_CLASSES
                .map(|class| http_responses.get_or_create_owned(&[("status_class", class)])),
            schedule_fires: PerScheduler::from_fn(|s| {
                let series = |outcome, reason| {
                    schedule_fires.get_or_create_owned(&[
                        ("scheduler_id", s.as_str()),
                        ("outcome", outcome),
                        ("reason", reason),
                    ])
                };
                let mut slots: [Counter; 2 + FireReason::ALL.len()] = Default::default();
                slots[0] = series("fired", "on_time");
                slots[1] = series("fired", "late");
                for (slot, r) in slots[2..].iter_mut().zip(FireReason::ALL) {
                    if r.skips() {
                        *slot = series("skipped", r.as_str());
                    }
                }
                slots
            }),
            status_counts: Default::default(),
            registry: Registry::default(),
        };
        let registry = &mut metrics.registry;
        register(registry, "scheduler_requests_total", requests);
        register(registry, "scheduler_request_duration_seconds", latency);
        register(registry, "scheduler_task_transitions_total", transitions);
        register(registry, "scheduler_lease_expiries_total", lease_expiries);
        register(registry, "scheduler_batch_commands", batch_sizes);
        // The cron entries' series are made as the entries first run.
        register(
            registry,
            "scheduler_cron_duration_seconds",
            metrics.cron_duration.clone(),
        );
        register(
            registry,
            "scheduler_cron_failures_total",
            metrics.cron_failures.clone(),
        );
        register(
            registry,
            "scheduler_cron_lag_seconds",
            metrics.cron_lag.clone(),
        );
        register(registry, "scheduler_object_lookups_total", object_lookups);
        register(registry, "scheduler_run_lookups_total", run_lookups);
        register(registry, "scheduler_http_responses_total", http_responses);
        register(registry, "scheduler_schedule_fires_total", schedule_fires);
        register(
            registry,
            "app_settings_info",
            Info::new([
                ("version", env!("CARGO_PKG_VERSION").to_owned()),
                ("schedulers", SchedulerId::ALL.map(|s| s.as_str()).join(",")),
            ]),
        );
        registry.register_collector(Box::new(process::ProcessCollector));
        metrics
    }
}

impl Metrics {
    /// Records one answered operation.
    pub fn op(&self, s: SchedulerId, op: Op, outcome: Outcome, took: Duration) {
        self.requests[s][op as usize][outcome as usize].inc();
        self.latency[s][op as usize].observe_duration(took);
    }

    /// Records one answer of the HTTP API with `status`.
    pub fn http_response(&self, status: u16) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.http_responses[class].inc();
    }

    /// Records task rows committed, counted by the status they were written in.
    pub fn transitions(&self, s: SchedulerId, written: &ByStatus) {
        for (counter, n) in self.transitions[s].iter().zip(written) {
            if *n > 0 {
                counter.inc_by(*n);
            }
        }
    }

    /// Records leases that ended: tasks re-queued and tasks failed for it.
    pub fn lease_expiries(&self, s: SchedulerId, requeued: u64, failed: u64) {
        let [r, f] = &self.lease_expiries[s];
        r.inc_by(requeued);
        f.inc_by(failed);
    }

    /// Records `n` object lookups that ended as `outcome`.
    pub fn object_lookups(&self, outcome: LookupOutcome, n: u64) {
        self.object_lookups[outcome as usize].inc_by(n);
    }

    /// Records `n` pieces of planned work whose last run Bytes was asked for, ended as `outcome`.
    pub fn run_lookups(&self, outcome: RunLookupOutcome, n: u64) {
        self.run_lookups[outcome as usize].inc_by(n);
    }

    /// Records one due fire of a schedule decided and committed: fired (`skipped` is `None`) or
    /// skipped for a reason, and whether it was decided late.
    pub fn schedule_fire(&self, s: SchedulerId, skipped: Option<FireReason>, late: bool) {
        let slot = match skipped {
            None => usize::from(late),
            Some(r) => 2 + FireReason::ALL.iter().position(|x| *x == r).unwrap_or(0),
        };
        self.schedule_fires[s][slot].inc();
    }

    /// Records one committed transaction of `commands` commands.
    pub fn batch(&self, s: SchedulerId, commands: usize) {
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
        let labels = [("component", component), ("entry", entry)];
        self.cron_duration
            .get_or_create(&labels)
            .observe_duration(took);
        // Made at the first run whether it failed or not, so the page shows the entry's 0.
        self.cron_failures
            .get_or_create(&labels)
            .inc_by(u64::from(failed));
        self.cron_lag.get_or_create(&labels).set(lag.as_secs_f64());
    }

    /// The page: the families registered here, then those `scraped` reads from their owners as
    /// the page is written, in Prometheus' text format ([`CONTENT_TYPE`]).
    pub fn encode(&self, scraped: impl Collector) -> Result<String, std::fmt::Error> {
        let mut page = String::new();
        prometheus_text::encode(&mut page, &self.registry)?;
        // The owners' collector goes into a registry of this scrape's own rather than this one:
        // it holds the broker, which holds these metrics, and the service's registry holding
        // the broker would make the two keep each other alive.
        let mut scrape = Registry::default();
        scrape.register_collector(Box::new(scraped));
        prometheus_text::encode(&mut page, &scrape)?;
        Ok(page)
    }
}

/// Writes one gauge sample with `labels` into a family a collector started with [`describe`].
pub fn gauge(
    family: &mut MetricEncoder<'_>,
    labels: &[(&str, &str)],
    value: impl EncodeGaugeValue,
) -> Result<(), std::fmt::Error> {
    ConstGauge::new(value).encode(family.encode_family(&labels)?)
}

/// Writes one counter sample with `labels` into a family a collector started with
/// [`describe`].
pub fn counter(
    family: &mut MetricEncoder<'_>,
    labels: &[(&str, &str)],
    value: impl EncodeCounterValue,
) -> Result<(), std::fmt::Error> {
    ConstCounter::new(value).encode(family.encode_family(&labels)?)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use prometheus_client::encoding::DescriptorEncoder;

    /// A scrape with nothing read from owners.
    #[derive(Debug)]
    struct Nothing;

    impl Collector for Nothing {
        fn encode(&self, _: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            Ok(())
        }
    }

    /// A scrape that writes every family of the catalogue through [`describe`], one sample each.
    #[derive(Debug)]
    struct EveryFamily;

    impl Collector for EveryFamily {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            for f in CATALOGUE {
                let mut family = describe(&mut encoder, f.name)?;
                match f.kind {
                    Kind::Counter => counter(&mut family, &[], 1u64)?,
                    Kind::Gauge | Kind::Histogram => gauge(&mut family, &[], 1u64)?,
                }
            }
            Ok(())
        }
    }

    /// The `# HELP` and `# TYPE` lines of `page`: name → (help, type).
    fn descriptors(page: &str) -> BTreeMap<String, (String, String)> {
        let mut out: BTreeMap<String, (String, String)> = BTreeMap::new();
        for line in page.lines() {
            if let Some((name, help)) = line.strip_prefix("# HELP ").and_then(|l| l.split_once(' '))
            {
                out.entry(name.to_owned()).or_default().0 = help.to_owned();
            }
            if let Some((name, kind)) = line.strip_prefix("# TYPE ").and_then(|l| l.split_once(' '))
            {
                out.entry(name.to_owned()).or_default().1 = kind.to_owned();
            }
        }
        out
    }

    #[test]
    fn operations_and_transitions_are_counted_per_scheduler() {
        let m = Metrics::default();
        for (outcome, ms) in [
            (Outcome::Ok, 3),
            (Outcome::Error, 30),
            (Outcome::Refused, 1),
        ] {
            m.op(
                SchedulerId::Boefje,
                Op::Pop,
                outcome,
                Duration::from_millis(ms),
            );
        }
        let mut written = ByStatus::default();
        written[status_slot(TaskStatus::Dispatched)] = 5;
        m.transitions(SchedulerId::Boefje, &written);
        m.lease_expiries(SchedulerId::Report, 2, 1);
        m.object_lookups(LookupOutcome::NotFound, 3);
        m.http_response(503);
        m.batch(SchedulerId::Normalizer, 7);

        let page = m.encode(Nothing).unwrap();
        for line in [
            "scheduler_requests_total{scheduler_id=\"boefje\",op=\"pop\",outcome=\"ok\"} 1\n",
            "scheduler_requests_total{scheduler_id=\"boefje\",op=\"pop\",outcome=\"error\"} 1\n",
            "scheduler_requests_total{scheduler_id=\"boefje\",op=\"pop\",outcome=\"refused\"} 1\n",
            "scheduler_requests_total{scheduler_id=\"normalizer\",op=\"pop\",outcome=\"ok\"} 0\n",
            "scheduler_request_duration_seconds_count{scheduler_id=\"boefje\",op=\"pop\"} 3\n",
            "scheduler_request_duration_seconds_bucket{scheduler_id=\"boefje\",op=\"pop\",le=\"0.0005\"} 0\n",
            "scheduler_request_duration_seconds_bucket{scheduler_id=\"boefje\",op=\"pop\",le=\"0.001\"} 1\n",
            "scheduler_request_duration_seconds_bucket{scheduler_id=\"boefje\",op=\"pop\",le=\"0.005\"} 2\n",
            "scheduler_request_duration_seconds_count{scheduler_id=\"normalizer\",op=\"pop\"} 0\n",
            "scheduler_task_transitions_total{scheduler_id=\"boefje\",status=\"dispatched\"} 5\n",
            "scheduler_task_transitions_total{scheduler_id=\"report\",status=\"dispatched\"} 0\n",
            "scheduler_lease_expiries_total{scheduler_id=\"report\",outcome=\"requeued\"} 2\n",
            "scheduler_lease_expiries_total{scheduler_id=\"report\",outcome=\"failed\"} 1\n",
            "scheduler_object_lookups_total{outcome=\"not_found\"} 3\n",
            "scheduler_object_lookups_total{outcome=\"found\"} 0\n",
            "scheduler_http_responses_total{status_class=\"5xx\"} 1\n",
            "scheduler_http_responses_total{status_class=\"1xx\"} 0\n",
            "scheduler_batch_commands_bucket{scheduler_id=\"normalizer\",le=\"8\"} 1\n",
            "scheduler_batch_commands_sum{scheduler_id=\"normalizer\"} 7.0\n",
        ] {
            assert!(page.contains(line), "no {line} in\n{page}");
        }
        let settings = format!(
            "app_settings_info{{version=\"{}\",schedulers=\"boefje,normalizer,report\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        );
        assert!(page.contains(&settings), "{page}");
    }

    #[test]
    fn schedule_fires_are_counted_by_outcome_and_skip_reason() {
        let m = Metrics::default();
        m.schedule_fire(SchedulerId::Report, None, false);
        m.schedule_fire(SchedulerId::Report, None, true);
        m.schedule_fire(SchedulerId::Report, None, true);
        m.schedule_fire(SchedulerId::Boefje, Some(FireReason::DuplicateQueued), true);
        let page = m.encode(Nothing).unwrap();
        for line in [
            "scheduler_schedule_fires_total{scheduler_id=\"report\",outcome=\"fired\",reason=\"on_time\"} 1\n",
            "scheduler_schedule_fires_total{scheduler_id=\"report\",outcome=\"fired\",reason=\"late\"} 2\n",
            "scheduler_schedule_fires_total{scheduler_id=\"boefje\",outcome=\"skipped\",reason=\"duplicate_queued\"} 1\n",
            "scheduler_schedule_fires_total{scheduler_id=\"report\",outcome=\"skipped\",reason=\"duplicate_queued\"} 0\n",
        ] {
            assert!(page.contains(line), "no {line} in\n{page}");
        }
        for waits in ["octopoes_unavailable", "still_running"] {
            assert!(
                !page.contains(&format!("reason=\"{waits}\"")),
                "a waiting fire is not a decided one"
            );
        }
    }

    #[test]
    fn a_cron_entry_is_on_the_page_from_its_first_run() {
        let m = Metrics::default();
        let before = m.encode(Nothing).unwrap();
        assert!(!before.contains("scheduler_cron_"), "{before}");
        m.cron_run(
            "boefje",
            "reschedule",
            Duration::from_millis(1500),
            Duration::from_millis(20),
            false,
        );
        let page = m.encode(Nothing).unwrap();
        for line in [
            "scheduler_cron_duration_seconds_count{component=\"boefje\",entry=\"reschedule\"} 1\n",
            "scheduler_cron_failures_total{component=\"boefje\",entry=\"reschedule\"} 0\n",
            "scheduler_cron_lag_seconds{component=\"boefje\",entry=\"reschedule\"} 1.5\n",
        ] {
            assert!(page.contains(line), "no {line} in\n{page}");
        }
    }

    #[test]
    fn what_is_registered_has_the_catalogues_name_type_and_help() {
        let m = Metrics::default();
        m.cron_run("boefje", "prune", Duration::ZERO, Duration::ZERO, true);
        let page = m.encode(Nothing).unwrap();
        let served = descriptors(&page);
        assert!(served.len() >= 12, "{page}");
        for (name, (help, kind)) in &served {
            let f = CATALOGUE
                .iter()
                .find(|f| f.name == name)
                .unwrap_or_else(|| panic!("{name} is not in the catalogue"));
            assert_eq!(kind, f.kind.as_str(), "{name}");
            assert_eq!(help, f.help, "{name}");
        }
    }

    #[test]
    fn what_a_collector_describes_has_the_catalogues_name_type_and_help() {
        let page = Metrics::default().encode(EveryFamily).unwrap();
        let served = descriptors(&page);
        for f in CATALOGUE {
            assert_eq!(
                served.get(f.name),
                Some(&(f.help.to_owned(), f.kind.as_str().to_owned())),
                "{}",
                f.name
            );
        }
        assert!(
            page.contains("\nscheduler_engine_batches_total 1\n"),
            "{page}"
        );
        assert!(page.contains("\nscheduler_qsize 1\n"), "{page}");
    }

    #[test]
    fn label_values_are_escaped() {
        #[derive(Debug)]
        struct Odd;
        impl Collector for Odd {
            fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
                let mut family = describe(&mut encoder, "scheduler_listener_lag_messages")?;
                gauge(&mut family, &[("queue", "a\"b\\c\nd")], 2u64)
            }
        }
        let page = Metrics::default().encode(Odd).unwrap();
        assert!(
            page.contains("scheduler_listener_lag_messages{queue=\"a\\\"b\\\\c\\nd\"} 2\n"),
            "{page}"
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
                resident_memory_bytes: 2048 * 1024,
                virtual_memory_bytes: 1073741824,
                open_fds: 12,
                max_fds: 1024,
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
    fn every_family_has_a_help_text_ending_with_a_full_stop() {
        // The client's registry ends a help text with a full stop of its own, which
        // `register` takes off first: a text without one would be served with one added.
        for f in CATALOGUE {
            assert!(f.help.len() > 1 && f.help.ends_with('.'), "{}", f.name);
        }
    }
}
