//! `[queue]` and `[schedulers.<id>]`: every scheduler's heap and leases, and one scheduler's
//! overrides of them; what [`crate::queue`] is built with.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Settings};
use crate::domain::politeness::{Rule, parse_concurrency, parse_rates};
use crate::domain::{PerScheduler, SchedulerId};
use crate::queue::fair::{Fairness, Weights};
use crate::queue::{QueueConfig, SchedulerLimits, WhenFull};
use crate::scoring::Strategy;

/// Default bound of each scheduler's heap.
pub const DEFAULT_MAXSIZE: usize = 100_000;
/// Default policy of a full heap: automatic pushes wait as pending.
pub const DEFAULT_WHEN_FULL: WhenFull = WhenFull::Pending;
/// Default commands per engine transaction.
pub const DEFAULT_MAX_BATCH: usize = 512;
/// Default commands waiting for an engine before callers get 503.
pub const DEFAULT_CHANNEL_CAPACITY: usize = 16_384;
/// Default seconds a popped task may stay `dispatched` before it must be `running`: 24 hours,
/// mula's grace period for a dispatched task. OpenKAT's runtime pops until its local queue holds
/// one task more than it has workers and sends `PATCH running` only when a worker picks a task
/// up, so a popped task waits behind scans that run for hours; a shorter lease handed such a
/// task out again while its first holder still held it, and both ran it (the API names no
/// holder, so the second `PATCH running` reads as a heartbeat).
pub const DEFAULT_DISPATCH_TIMEOUT_SECS: u64 = 24 * 60 * 60;
/// Default seconds a `running` task may go without finishing (or a `PATCH running` heartbeat).
/// Real runtimes do not heartbeat, so it must outlast the longest scan.
pub const DEFAULT_RUN_TIMEOUT_SECS: u64 = 4 * 60 * 60;
/// Default run lease of a task whose holder never renewed it (24 hours, mula's grace period):
/// OpenKAT's runners send no heartbeat, and a boefje may run for hours.
pub const DEFAULT_UNRENEWED_RUN_TIMEOUT_SECS: u64 = 24 * 60 * 60;
/// Default leases a task may let expire before it is failed.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Default seconds between lease-expiry sweeps.
pub const DEFAULT_WATCHDOG_INTERVAL_SECS: u64 = 30;
/// Default seconds a command may wait for its engine before it is answered 503 unapplied.
pub const DEFAULT_SHED_AFTER_SECS: u64 = 20;
/// Default ranking of planned work, for a scheduler that names none.
pub const DEFAULT_SCORING: Strategy = Strategy::TimeBased;

/// Queue settings that apply to every scheduler unless overridden.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSettings {
    /// Queued tasks each heap holds in memory at most.
    pub maxsize: usize,
    /// What a full heap does with automatic pushes: `pending` or `reject` (429).
    pub when_full: WhenFull,
    /// Commands applied per transaction at most (group commit).
    pub max_batch: usize,
    /// Commands waiting for an engine at most before callers get 503.
    pub channel_capacity: usize,
    /// Seconds a popped task may stay `dispatched` (its lease) before it is re-queued.
    pub dispatch_timeout_secs: u64,
    /// Seconds a `running` task may go without finishing or a renewing `PATCH running`, once its
    /// holder has renewed the lease at least once.
    pub run_timeout_secs: u64,
    /// Seconds a `running` task whose holder never renewed its lease may go without finishing
    /// (the longer of this and `run_timeout_secs` applies).
    pub unrenewed_run_timeout_secs: u64,
    /// Leases a task may let expire; at that count it is failed instead of re-queued.
    pub max_attempts: u32,
    /// Seconds between lease-expiry sweeps (0 turns the watchdog off).
    pub watchdog_interval_secs: u64,
    /// Seconds a command may wait for its scheduler's engine; one that waited longer is answered
    /// 503 (with `Retry-After`) without being applied.
    pub shed_after_secs: u64,
}

/// Per-scheduler overrides.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct SchedulerOverrides {
    /// `boefje`
    pub boefje: SchedulerOverride,
    /// `normalizer`
    pub normalizer: SchedulerOverride,
    /// `report`
    pub report: SchedulerOverride,
}

/// One scheduler's overrides.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerOverride {
    /// This scheduler's heap bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maxsize: Option<usize>,
    /// This scheduler's full-heap policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub when_full: Option<WhenFull>,
    /// This scheduler's dispatch lease, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dispatch_timeout_secs: Option<u64>,
    /// This scheduler's run lease, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_timeout_secs: Option<u64>,
    /// This scheduler's run lease of a holder that never renewed it, in seconds (OpenKAT's
    /// runners never do, so this is the one that brings a dead runner's task back).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unrenewed_run_timeout_secs: Option<u64>,
    /// This scheduler's attempts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// How this scheduler ranks planned work: `time-based` (default), `grace-period` or
    /// `change-delta`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scoring: Option<Strategy>,
    /// Whether organisations take turns for automatic work: `organisation` (the default of
    /// boefje and normalizer) or `off` (report's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fairness: Option<Fairness>,
    /// Organisations' weights in their turns, `org=weight;org=weight` (default 1 each).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fairness_weights: Option<String>,
    /// Rate limits, `key=value:N/S;…`: at most N tasks with that value dispatched in any span of
    /// S seconds (`*`: each value apart).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<String>,
    /// Concurrency limits, `key=value:N;…`: at most N tasks with that value dispatched or
    /// running at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<String>,
}

impl SchedulerOverride {
    /// Its rate and concurrency rules; an error names the setting and what is wrong.
    pub fn politeness(&self, s: SchedulerId) -> Result<Vec<Rule>, ConfigError> {
        let mut rules = Vec::new();
        if let Some(spec) = &self.rate_limits {
            rules
                .extend(parse_rates(spec).map_err(|e| {
                    ConfigError::setting(&format!("schedulers.{s}.rate_limits"), e)
                })?);
        }
        if let Some(spec) = &self.concurrency {
            rules
                .extend(parse_concurrency(spec).map_err(|e| {
                    ConfigError::setting(&format!("schedulers.{s}.concurrency"), e)
                })?);
        }
        Ok(rules)
    }
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            maxsize: DEFAULT_MAXSIZE,
            when_full: DEFAULT_WHEN_FULL,
            max_batch: DEFAULT_MAX_BATCH,
            channel_capacity: DEFAULT_CHANNEL_CAPACITY,
            dispatch_timeout_secs: DEFAULT_DISPATCH_TIMEOUT_SECS,
            run_timeout_secs: DEFAULT_RUN_TIMEOUT_SECS,
            unrenewed_run_timeout_secs: DEFAULT_UNRENEWED_RUN_TIMEOUT_SECS,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            watchdog_interval_secs: DEFAULT_WATCHDOG_INTERVAL_SECS,
            shed_after_secs: DEFAULT_SHED_AFTER_SECS,
        }
    }
}

impl QueueSettings {
    /// Refuses an engine that could take no command. The values a scheduler may override are
    /// checked per scheduler, by [`SchedulerOverrides::validate`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        ConfigError::at_least_one("queue.max_batch", self.max_batch)?;
        ConfigError::at_least_one("queue.channel_capacity", self.channel_capacity)?;
        ConfigError::at_least_one("queue.shed_after_secs", self.shed_after_secs)
    }
}

impl SchedulerOverrides {
    /// One scheduler's overrides.
    pub fn of(&self, s: SchedulerId) -> &SchedulerOverride {
        match s {
            SchedulerId::Boefje => &self.boefje,
            SchedulerId::Normalizer => &self.normalizer,
            SchedulerId::Report => &self.report,
        }
    }

    /// The effective limits of one scheduler: its overrides, else `queue`'s values.
    pub fn limits(&self, queue: &QueueSettings, s: SchedulerId) -> SchedulerLimits {
        let o = self.of(s);
        SchedulerLimits {
            maxsize: o.maxsize.unwrap_or(queue.maxsize),
            when_full: o.when_full.unwrap_or(queue.when_full),
            dispatch_timeout: Duration::from_secs(
                o.dispatch_timeout_secs
                    .unwrap_or(queue.dispatch_timeout_secs),
            ),
            run_timeout: Duration::from_secs(o.run_timeout_secs.unwrap_or(queue.run_timeout_secs)),
            unrenewed_run_timeout: Duration::from_secs(
                o.unrenewed_run_timeout_secs
                    .unwrap_or(queue.unrenewed_run_timeout_secs),
            ),
            max_attempts: o.max_attempts.unwrap_or(queue.max_attempts),
            fairness: o.fairness.unwrap_or(Fairness::default_for(s)),
            // Checked by `validate`; an unparsable text is refused before any engine starts.
            weights: o
                .fairness_weights
                .as_deref()
                .and_then(|w| Weights::parse(w).ok())
                .unwrap_or_default(),
            // Checked by `validate` too.
            politeness: o.politeness(s).unwrap_or_default(),
        }
    }

    /// Refuses a scheduler whose effective leases, attempts or heap bound are zero, naming the
    /// override when one sets it and `queue`'s key otherwise. It takes `queue` because a zero in
    /// `queue` is fine for a value every scheduler overrides.
    pub fn validate(&self, queue: &QueueSettings) -> Result<(), ConfigError> {
        for s in SchedulerId::ALL {
            let limits = self.limits(queue, s);
            let o = self.of(s);
            o.politeness(s)?;
            if let Some(w) = &o.fairness_weights {
                Weights::parse(w).map_err(|e| {
                    ConfigError::setting(&format!("schedulers.{s}.fairness_weights"), &e)
                })?;
            }
            let key = |field: &str, overridden: bool| {
                if overridden {
                    format!("schedulers.{s}.{field}")
                } else {
                    format!("queue.{field}")
                }
            };
            for (field, overridden, zero) in [
                (
                    "dispatch_timeout_secs",
                    o.dispatch_timeout_secs.is_some(),
                    limits.dispatch_timeout.is_zero(),
                ),
                (
                    "run_timeout_secs",
                    o.run_timeout_secs.is_some(),
                    limits.run_timeout.is_zero(),
                ),
                (
                    "max_attempts",
                    o.max_attempts.is_some(),
                    limits.max_attempts == 0,
                ),
                ("maxsize", o.maxsize.is_some(), limits.maxsize == 0),
            ] {
                if zero {
                    let why = if field == "maxsize" {
                        // mula's 0 means an unbounded queue in memory.
                        "must be at least 1: the heap in memory is bounded, and tasks beyond it \
                         wait in the database (`pending`), never refused unless `when_full` is \
                         `reject`; for mula's 0 (unbounded), leave it unset"
                    } else {
                        "must be at least 1"
                    };
                    return Err(ConfigError::setting(&key(field, overridden), why));
                }
            }
        }
        Ok(())
    }
}

impl Settings {
    /// Each scheduler's ranking strategy.
    pub fn scoring(&self) -> PerScheduler<Strategy> {
        PerScheduler::from_fn(|s| self.schedulers.of(s).scoring.unwrap_or(DEFAULT_SCORING))
    }

    /// The effective limits of one scheduler.
    pub fn limits(&self, s: SchedulerId) -> SchedulerLimits {
        self.schedulers.limits(&self.queue, s)
    }

    /// What the queue needs.
    pub fn queue_config(&self) -> QueueConfig {
        QueueConfig {
            limits: PerScheduler::from_fn(|s| self.limits(s)),
            max_batch: self.queue.max_batch,
            channel_capacity: self.queue.channel_capacity,
            shed_after: Duration::from_secs(self.queue.shed_after_secs),
            input: self.limits,
            flush_barrier: self.flush_barrier(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::load;

    #[test]
    fn per_scheduler_overrides_apply_to_that_scheduler_only() {
        let s = load(&[
            ("SCHEDULER_PQ_MAXSIZE", "50"),
            ("SCHEDULER_REPORT_PQ_MAXSIZE", "5"),
            ("SCHEDULER_REPORT_PQ_WHEN_FULL", "reject"),
        ])
        .unwrap();
        assert_eq!(s.limits(SchedulerId::Boefje).maxsize, 50);
        assert_eq!(s.limits(SchedulerId::Report).maxsize, 5);
        assert_eq!(s.limits(SchedulerId::Report).when_full, WhenFull::Reject);
        assert_eq!(s.limits(SchedulerId::Boefje).when_full, WhenFull::Pending);
    }
    #[test]
    fn a_zero_maxsize_is_refused() {
        let err = load(&[("SCHEDULER_PQ_MAXSIZE", "0")]).unwrap_err().0;
        assert!(
            err.starts_with("queue.maxsize (from SCHEDULER_PQ_MAXSIZE): must be at least 1")
                && err.contains("for mula's 0 (unbounded), leave it unset"),
            "{err}"
        );
    }
    #[test]
    fn lease_variables_set_the_leases_and_per_scheduler_ones_override_them() {
        let s = load(&[
            ("SCHEDULER_DISPATCH_TIMEOUT", "20"),
            ("SCHEDULER_RUN_TIMEOUT", "60"),
            ("SCHEDULER_UNRENEWED_RUN_TIMEOUT", "7200"),
            ("SCHEDULER_MAX_ATTEMPTS", "5"),
            ("SCHEDULER_WATCHDOG_INTERVAL", "0"),
            ("SCHEDULER_REPORT_DISPATCH_TIMEOUT", "90"),
            ("SCHEDULER_NORMALIZER_MAX_ATTEMPTS", "1"),
            ("SCHEDULER_NORMALIZER_UNRENEWED_RUN_TIMEOUT", "600"),
        ])
        .unwrap();
        assert_eq!(
            (
                s.queue.dispatch_timeout_secs,
                s.queue.run_timeout_secs,
                s.queue.max_attempts,
                s.queue.watchdog_interval_secs
            ),
            (20, 60, 5, 0)
        );
        assert_eq!(s.queue.unrenewed_run_timeout_secs, 7200);
        assert_eq!(
            s.limits(SchedulerId::Boefje).unrenewed_run_timeout,
            Duration::from_secs(7200)
        );
        assert_eq!(
            s.limits(SchedulerId::Normalizer).unrenewed_run_timeout,
            Duration::from_secs(600),
            "a normalizer's dead runner gives its task back within ten minutes"
        );
        assert_eq!(s.schedulers.report.dispatch_timeout_secs, Some(90));
        assert_eq!(s.schedulers.normalizer.max_attempts, Some(1));
    }
}
