//! Parked events: applies the listener's events parked in `listener_parked` once they are due
//! (see [`crate::listener::parked`]): object events in the boefje table, raw files in the
//! normalizer table, so one instance at a time (the scheduler's owner) applies each queue's.

use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};

use super::Tick;
use super::table::{Entry, Fut, Outcome};
use crate::listener::parked::FIRST_AGAIN;
use crate::listener::{Listener, Source};

/// The parked events entry of one queue.
pub struct ParkedEvents {
    listener: Arc<Listener>,
    source: Source,
    /// After a tick whose events all failed again: no look before this. While the cause lasts
    /// (Katalogus down for hours), the parked events are not read every tick, each time past
    /// those not due yet.
    quiet_until: Mutex<Option<DateTime<Utc>>>,
}

impl ParkedEvents {
    /// The entry applying `source`'s parked events with `listener`'s code.
    pub fn new(listener: Arc<Listener>, source: Source) -> Self {
        Self {
            listener,
            source,
            quiet_until: Mutex::new(None),
        }
    }

    fn quiet_until(&self) -> std::sync::MutexGuard<'_, Option<DateTime<Utc>>> {
        self.quiet_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Entry for ParkedEvents {
    fn name(&self) -> &'static str {
        "parked"
    }

    fn rule<'a>(&'a self, tick: &'a Tick) -> Fut<'a, bool> {
        Box::pin(async move { self.quiet_until().is_none_or(|t| tick.at >= t) })
    }

    fn action<'a>(&'a self, tick: &'a Tick) -> Fut<'a, Outcome> {
        Box::pin(async move {
            let r = self.listener.redrive(self.source, tick.at).await?;
            let stalled = r.again > 0 && r.applied == 0 && r.refused == 0;
            *self.quiet_until() = stalled.then(|| tick.at + FIRST_AGAIN);
            Ok(format!(
                "applied {}, failed again {}, refused {}",
                r.applied, r.again, r.refused
            ))
        })
    }
}
