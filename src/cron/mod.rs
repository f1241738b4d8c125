//! Cron: ticks and cron tables, after Concord's ccron.
//!
//! A ticks generator ([`ticks`]) emits a tick per component (a scheduler) every period, with at
//! most one tick pending per component: a slow table is not flooded with ticks it cannot catch
//! up on. Each tick runs that component's cron table ([`table`]): an ordered list of entries,
//! each with a rule (does it run on this tick?), an action, and, for periodic entries, a next
//! run persisted in `cron_state` before the action, so a restart neither skips nor repeats a run.
//!
//! | entry | file | component | what it does |
//! |---|---|---|---|
//! | reschedule | [`reschedule`] | boefje, report | turns due schedules into tasks, oldest due first, no cap; records each due fire's fate |
//! | lease watchdog | [`watchdog`] | each | re-queues or fails tasks whose lease ended |
//! | refill | [`refill`] | each | tops the heap up from `pending` when it has room no request filled |
//! | coldstart | [`coldstart`] | boefje (when Octopoes is configured) | asks ColdStart for a round: at the first tick, then every minute while it is idle |
//! | parked | [`parked`] | boefje, normalizer | applies the listener's events parked after failing too long, once due, in each object's order |
//! | prune | [`prune`] | each | deletes finished tasks and schedules' fires past their retention |
//!
//! There is no re-score entry: priorities do not age (see [`crate::scoring`]), so nothing is
//! rewritten as time passes; a waiting task is re-scored only on the event that changed its
//! inputs (`planner/rescore.rs`). `cron.rescore_secs`, which set the old entry's period, is
//! accepted and has no effect (a warning at start says so when it is set).

pub mod coldstart;
pub mod parked;
pub mod prune;
pub mod refill;
pub mod reschedule;
pub mod table;
pub mod ticks;
pub mod watchdog;

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::Mutex;

use crate::clock::SharedClock;
use crate::domain::{PerScheduler, SchedulerId};
use crate::metrics::Metrics;
use table::CronTable;

/// A tick: the component it is for, its sequence number, and the time it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tick {
    /// The component (scheduler) whose table runs.
    pub component: SchedulerId,
    /// Ticks emitted for this component before this one.
    pub seq: u64,
    /// The time of the tick (from the injected clock).
    pub at: DateTime<Utc>,
}

/// What one entry did on one tick.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EntryReport {
    /// Whether its rule let it run.
    pub ran: bool,
    /// What it did, in its own words (`"fired 12, disabled 1"`), or why it failed.
    pub summary: String,
}

/// What a tick did, per entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TickReport {
    /// Entry name → what it did.
    pub entries: HashMap<&'static str, EntryReport>,
}

/// The cron tables of every component; runs a component's table for a tick, one tick at a
/// time per component.
#[derive(Clone)]
pub struct Cron {
    tables: Arc<PerScheduler<Mutex<CronTable>>>,
    metrics: Arc<Metrics>,
    clock: SharedClock,
}

impl Cron {
    /// The cron over these tables; each entry's run is timed into `metrics`, its lag read on
    /// `clock` (the clock the ticks are made on).
    pub fn new(tables: PerScheduler<CronTable>, metrics: Arc<Metrics>, clock: SharedClock) -> Self {
        Self {
            tables: Arc::new(tables.map(Mutex::new)),
            metrics,
            clock,
        }
    }

    /// Runs `tick`'s component table now (the ticks generator calls it; tests call it directly
    /// with a tick of their own time).
    pub async fn run(&self, tick: Tick) -> TickReport {
        let mut table = self.tables[tick.component].lock().await;
        table.run(&tick, &self.metrics, &self.clock).await
    }
}
