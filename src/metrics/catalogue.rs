//! The catalogue: every metric `/metrics` serves, with its type, labels and help text. What is
//! registered takes its name, type and help from here ([`register`], [`describe`]), and
//! docs/OPERATIONS.md, the Grafana dashboard and the alert rules are checked against it; it
//! holds no figures.

use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Metric, Registry};

/// What kind of metric a family is, as Prometheus' `# TYPE` line says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (from 0 at each start); its name ends in `_total`.
    Counter,
    /// A figure that goes up and down.
    Gauge,
    /// Observations in buckets, with their sum and count.
    Histogram,
}

impl Kind {
    /// The word of the `# TYPE` line.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }

    fn metric_type(self) -> MetricType {
        match self {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
            Kind::Histogram => MetricType::Histogram,
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A metric's name, type, labels and meaning: what `/metrics` serves and the docs list.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// Its name as the page shows it: a counter's with its `_total`.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its labels, comma-separated.
    pub labels: &'static str,
    /// What it measures: one or more sentences, ending with a full stop.
    pub help: &'static str,
}

const fn family(
    name: &'static str,
    kind: Kind,
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

/// The catalogue's entry of `name`.
fn lookup(name: &str) -> Option<&'static Family> {
    CATALOGUE.iter().find(|f| f.name == name)
}

/// The name prometheus-client is given for `name`: the client writes a counter's `_total` and an
/// info's `_info` itself, so the catalogue's name (the page's) loses that suffix here.
fn stem(name: &str, metric_type: MetricType) -> &str {
    let suffix = match metric_type {
        MetricType::Counter => "_total",
        MetricType::Info => "_info",
        _ => "",
    };
    name.strip_suffix(suffix).unwrap_or(name)
}

/// Registers `metric` in `registry` as the catalogue's family `name`. A name the catalogue
/// lacks is registered without a help text, and the tests comparing the page with the catalogue
/// find it.
pub(crate) fn register(registry: &mut Registry, name: &str, metric: impl Metric) {
    let help = lookup(name).map_or("", |f| f.help);
    // The registry ends every help text with a full stop of its own; the catalogue's have theirs.
    let help = help.strip_suffix('.').unwrap_or(help);
    registry.register(stem(name, metric.metric_type()), help, metric);
}

/// Starts the catalogue's family `name` in a collector (figures read at scrape time): its
/// `# HELP` and `# TYPE` lines as the catalogue has them; its samples go into the encoder
/// returned. A name the catalogue lacks is written as a gauge without a help text.
pub fn describe<'a>(
    encoder: &'a mut DescriptorEncoder<'_>,
    name: &'a str,
) -> Result<MetricEncoder<'a>, std::fmt::Error> {
    let (kind, help) = lookup(name).map_or((Kind::Gauge, ""), |f| (f.kind, f.help));
    let metric_type = kind.metric_type();
    encoder.encode_descriptor(stem(name, metric_type), help, None, metric_type)
}

/// Every metric `/metrics` serves.
pub const CATALOGUE: &[Family] = &[
    family(
        "scheduler_qsize",
        Kind::Gauge,
        "scheduler_id",
        "Tasks queued in the scheduler's in-memory heap.",
    ),
    family(
        "scheduler_pending",
        Kind::Gauge,
        "scheduler_id",
        "Tasks waiting in the database outside the full heap.",
    ),
    family(
        "scheduler_maxsize",
        Kind::Gauge,
        "scheduler_id",
        "The bound of the scheduler's heap.",
    ),
    family(
        "scheduler_oldest_queued_age_seconds",
        Kind::Gauge,
        "scheduler_id",
        "Age of the oldest task in the heap (0 when it is empty).",
    ),
    family(
        "scheduler_requests_total",
        Kind::Counter,
        "scheduler_id,op,outcome",
        "Pushes, pops and patches the queue answered, by outcome: ok, refused (what the request asked cannot be done: a duplicate, a full queue, an unknown task, an illegal transition, bad input; a 4xx answer) or error (the service could not serve it: unavailable, busy, shed, internal; a 5xx answer, but 429 for a shed push); a request refused before it reaches the queue (a malformed body) is not counted, and a forwarded one is counted by the owner that applied it.",
    ),
    family(
        "scheduler_request_duration_seconds",
        Kind::Histogram,
        "scheduler_id,op",
        "Time from a push, pop or patch reaching the queue to its answer (committed).",
    ),
    family(
        "scheduler_task_status_counts",
        Kind::Gauge,
        "scheduler_id,status",
        "Tasks in the database per status, finished ones included (mula's family); counted from the table at most once a minute.",
    ),
    family(
        "scheduler_task_transitions_total",
        Kind::Counter,
        "scheduler_id,status",
        "Task rows committed, by the status they were written in.",
    ),
    family(
        "scheduler_lease_expiries_total",
        Kind::Counter,
        "scheduler_id,outcome",
        "Leases that ended before the worker reported: the task re-queued or failed.",
    ),
    family(
        "scheduler_batch_commands",
        Kind::Histogram,
        "scheduler_id",
        "Commands per committed transaction (group commit).",
    ),
    family(
        "scheduler_engine_batches_total",
        Kind::Counter,
        "",
        "Transactions the queue engines committed.",
    ),
    family(
        "scheduler_engine_commands_total",
        Kind::Counter,
        "",
        "Pushes, pops and patches answered from committed transactions (÷ batches: the batch size).",
    ),
    family(
        "scheduler_engine_statements_total",
        Kind::Counter,
        "",
        "Statements written by committed transactions.",
    ),
    family(
        "scheduler_engine_apply_seconds_total",
        Kind::Counter,
        "",
        "Time spent reading and deciding batches, before their writes.",
    ),
    family(
        "scheduler_engine_batch_seconds_total",
        Kind::Counter,
        "",
        "Time from a batch's first read to the end of its commit.",
    ),
    family(
        "scheduler_engine_failed_batches_total",
        Kind::Counter,
        "",
        "Transactions the queue engines rolled back.",
    ),
    family(
        "scheduler_engine_shed_total",
        Kind::Counter,
        "",
        "Commands answered without being applied: pops whose caller had gone, commands that waited too long.",
    ),
    family(
        "scheduler_engine_pops_set_aside_total",
        Kind::Counter,
        "",
        "Pops set aside until the refill under way ended (their match not in the heap), while the engine served others.",
    ),
    family(
        "scheduler_engine_pops_decided_again_total",
        Kind::Counter,
        "",
        "Pops decided again because every task they took had been changed outside the scheduler since it was read.",
    ),
    family(
        "scheduler_engine_backlog_pops_total",
        Kind::Counter,
        "",
        "Tasks pops took from the pending backlog beyond the heap, their match not being in it.",
    ),
    family(
        "scheduler_engine_backlog_searches_total",
        Kind::Counter,
        "",
        "Searches of the pending backlog's indexes for pops (a read ahead serves the next pops of its filter).",
    ),
    family(
        "scheduler_engine_rebuilds_total",
        Kind::Counter,
        "",
        "Heaps rebuilt from the tasks table, the start's included (after a batch whose outcome is not known, a failed upkeep, a takeover); the engine serves nothing meanwhile.",
    ),
    family(
        "scheduler_listener_messages_total",
        Kind::Counter,
        "queue,outcome",
        "AMQP messages by outcome: received, acked, dead_lettered, retried, parked.",
    ),
    family(
        "scheduler_listener_lag_messages",
        Kind::Gauge,
        "queue",
        "Messages ready in the queue, not yet delivered to the listener (read at most once a second).",
    ),
    family(
        "scheduler_listener_up",
        Kind::Gauge,
        "",
        "1 while the listener consumes, else 0.",
    ),
    family(
        "scheduler_coldstart_objects",
        Kind::Gauge,
        "kind",
        "ColdStart's current (or last) round: objects loaded, objects known from the first pages, tasks planned, objects found gone.",
    ),
    family(
        "scheduler_coldstart_organisations",
        Kind::Gauge,
        "state",
        "ColdStart's current (or last) round: organisations in it, done, failed.",
    ),
    family(
        "scheduler_coldstart_rounds_total",
        Kind::Counter,
        "",
        "ColdStart rounds completed since start.",
    ),
    family(
        "scheduler_cron_duration_seconds",
        Kind::Histogram,
        "component,entry",
        "How long each cron entry's action took.",
    ),
    family(
        "scheduler_cron_failures_total",
        Kind::Counter,
        "component,entry",
        "Cron entry runs whose action failed.",
    ),
    family(
        "scheduler_cron_lag_seconds",
        Kind::Gauge,
        "component,entry",
        "How late the entry's last run started after its tick's time.",
    ),
    family(
        "scheduler_object_lookups_total",
        Kind::Counter,
        "outcome",
        "Objects asked of Octopoes before a decision that cannot be undone (a schedule's fire or disable, a cancel; the frontier is a mirror): found, not_found, failed (no answer that says anything) or deferred (backing off, or the run's budget spent).",
    ),
    family(
        "scheduler_run_lookups_total",
        Kind::Counter,
        "outcome",
        "Planned boefje work the table has no finished run of, asked of Bytes (when did the boefje last run on the object?): ran, none, failed (no answer that says anything; the work is planned as the table says) or deferred (Bytes backing off after failures, or the planning step's 30 s spent).",
    ),
    family(
        "scheduler_schedule_fires_total",
        Kind::Counter,
        "scheduler_id,outcome,reason",
        "Schedules' due fires decided: fired (reason on_time, or late: decided more than one cron tick after it was due) or skipped (reason: plugin_gone, plugin_disabled, object_gone, not_permitted, task_refused, duplicate_queued, within_grace_period). A fire that waits (still_running among others) is counted once decided.",
    ),
    family(
        "scheduler_db_pool_connections",
        Kind::Gauge,
        "state",
        "Database connections of the pool: idle or in use.",
    ),
    family(
        "scheduler_db_pool_max",
        Kind::Gauge,
        "",
        "The pool's bound.",
    ),
    family(
        "scheduler_ownership_owned",
        Kind::Gauge,
        "scheduler_id",
        "1 when this instance owns the scheduler's heap (always 1 on SQLite, which runs one instance).",
    ),
    family(
        "scheduler_ownership_owner_info",
        Kind::Gauge,
        "scheduler_id,owner,address",
        "The scheduler's owner (its instance id) as this instance last read it (always 1; PostgreSQL only).",
    ),
    family(
        "scheduler_ownership_epoch",
        Kind::Gauge,
        "scheduler_id",
        "The scheduler's ownership epoch (fencing token) as last read; raised by every takeover.",
    ),
    family(
        "scheduler_ownership_takeovers_total",
        Kind::Counter,
        "scheduler_id",
        "Leases of the scheduler this instance took (its first included).",
    ),
    family(
        "scheduler_http_responses_total",
        Kind::Counter,
        "status_class",
        "Answers of the HTTP API by status class (1xx to 5xx), every route included: the 5xx of reads, schedules and health too.",
    ),
    family(
        "scheduler_dependency_failures_total",
        Kind::Counter,
        "service,kind",
        "Calls to Katalogus, Octopoes or Bytes that failed: unreachable (no answer after the retries), status (an answer outside 2xx other than 404) or decode (a 2xx body not as the API promises). Health checks are not counted.",
    ),
    family(
        "process_cpu_seconds_total",
        Kind::Counter,
        "",
        "User and system CPU time of the process (Linux only).",
    ),
    family(
        "process_resident_memory_bytes",
        Kind::Gauge,
        "",
        "Resident memory of the process (Linux only).",
    ),
    family(
        "process_virtual_memory_bytes",
        Kind::Gauge,
        "",
        "Virtual memory of the process (Linux only).",
    ),
    family(
        "process_open_fds",
        Kind::Gauge,
        "",
        "Open file descriptors of the process (Linux only).",
    ),
    family(
        "process_max_fds",
        Kind::Gauge,
        "",
        "The process' limit of open file descriptors (Linux only).",
    ),
    family(
        "process_start_time_seconds",
        Kind::Gauge,
        "",
        "When the process started, in seconds since the Unix epoch (Linux only).",
    ),
    family(
        "app_settings_info",
        Kind::Gauge,
        "version,schedulers",
        "Build information (always 1).",
    ),
];
