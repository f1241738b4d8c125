//! ColdStart resync: asks the ColdStart process for a round at the first tick and then every
//! [`CHECK_EVERY`] while it is idle; the round pages the organisations that are due.
//!
//! The schedule that matters is kept per organisation in `coldstart_progress` (when its last
//! complete pass ended, how far an interrupted one got), so a restart neither repeats a complete
//! pass nor skips a due one; this entry only decides how often to look, and needs no `cron_state`
//! row. The round runs in the ColdStart process, not in the action: a round over many objects
//! takes minutes, and the table's other entries (rescheduling, the watchdog) must not wait.

use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};

use super::Tick;
use super::table::{Entry, Fut, Outcome};
use crate::coldstart::ColdStartStatus;

/// How often an idle ColdStart looks for due organisations.
pub const CHECK_EVERY: chrono::Duration = chrono::Duration::minutes(1);

/// The ColdStart resync entry (in the boefje table: ColdStart plans boefje work).
pub struct ColdStartResync {
    status: Arc<ColdStartStatus>,
    /// When this instance last asked for a round (tick time).
    asked: Mutex<Option<DateTime<Utc>>>,
}

impl ColdStartResync {
    /// The entry that wakes the ColdStart process sharing `status`.
    pub fn new(status: Arc<ColdStartStatus>) -> Self {
        Self {
            status,
            asked: Mutex::new(None),
        }
    }

    fn asked(&self) -> std::sync::MutexGuard<'_, Option<DateTime<Utc>>> {
        self.asked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Entry for ColdStartResync {
    fn name(&self) -> &'static str {
        "coldstart"
    }

    /// The first tick, then every [`CHECK_EVERY`]; never while a round runs.
    fn rule<'a>(&'a self, tick: &'a Tick) -> Fut<'a, bool> {
        Box::pin(async move {
            !self.status.running() && self.asked().is_none_or(|at| tick.at - at >= CHECK_EVERY)
        })
    }

    fn action<'a>(&'a self, tick: &'a Tick) -> Fut<'a, Outcome> {
        Box::pin(async move {
            *self.asked() = Some(tick.at);
            self.status.wake();
            Ok("round asked for".to_owned())
        })
    }
}
