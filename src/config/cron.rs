//! `[cron]`: the ticks and what their tables do, read by [`crate::cron`].

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// Default seconds between ticks.
pub const DEFAULT_TICK_SECS: u64 = 1;
/// Default seconds before a boefje schedule without cron runs again, when its plugin names no
/// interval (mula's `SCHEDULER_PQ_GRACE_PERIOD`).
pub const DEFAULT_GRACE_PERIOD_SECS: u64 = 86_400;
/// Default jitter added to a schedule's next run: up to 5 hours, mula's range
/// (`calculate_default_deadline` adds a random 0–5 h to every boefje schedule's next deadline).
/// Without it, the work one ColdStart planned within minutes came due within the same minutes
/// every day, for good, where mula spread it over hours.
pub const DEFAULT_JITTER_SECS: u64 = 5 * 60 * 60;
/// Default days a finished task is kept: 0, forever.
pub const DEFAULT_TASK_RETENTION_DAYS: u64 = 0;
/// The default of [`CronSettings::rescore_secs`], which no longer does anything.
pub const DEFAULT_RESCORE_SECS: u64 = 600;
/// Default days a schedule's fire stays in the fire ledger: a month of "did it run?".
pub const DEFAULT_SCHEDULE_HISTORY_DAYS: u64 = 30;

/// The cron ticks (see [`crate::cron`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct CronSettings {
    /// Seconds between ticks; 0 turns the ticks (and so rescheduling, the lease watchdog,
    /// refills, ColdStart's rounds and pruning) off.
    pub tick_secs: u64,
    /// Seconds before a boefje schedule without cron runs again when its plugin names no
    /// interval, and before an object's events or ColdStart plan the same boefje on it again
    /// (mula's grace period, and its gate).
    pub grace_period_secs: u64,
    /// Up to this many seconds more, spread over schedules.
    pub jitter_secs: u64,
    /// Days a finished task is kept before it is deleted; 0 keeps them.
    pub task_retention_days: u64,
    /// No longer has an effect (accepted so configurations from before still load; a warning
    /// at start says so when it is not the default). It was the period of the re-score of all
    /// waiting work under `grace-period`, whose priorities now do not age (see
    /// [`crate::scoring`]).
    pub rescore_secs: u64,
    /// Days a schedule's due fire stays in the fire ledger (`GET /schedules/{id}/history`)
    /// after it was decided; 0 keeps them.
    pub schedule_history_days: u64,
}

impl Default for CronSettings {
    fn default() -> Self {
        Self {
            tick_secs: DEFAULT_TICK_SECS,
            grace_period_secs: DEFAULT_GRACE_PERIOD_SECS,
            jitter_secs: DEFAULT_JITTER_SECS,
            task_retention_days: DEFAULT_TASK_RETENTION_DAYS,
            rescore_secs: DEFAULT_RESCORE_SECS,
            schedule_history_days: DEFAULT_SCHEDULE_HISTORY_DAYS,
        }
    }
}

impl CronSettings {
    /// Every value is usable: 0 turns the ticks or pruning off, and a zero grace
    /// period or jitter is what it says.
    pub fn validate(&self) -> Result<(), ConfigError> {
        Ok(())
    }
}
