//! Parked events: applies the listener's events parked in `listener_parked` once they are due
//! (see [`crate::listener::parked`]): object events in the boefje table, raw files in the
//! normalizer table, so one instance at a time (the scheduler's owner) applies each queue's.

use std::sync::Arc;

use super::Tick;
use super::table::{Entry, Fut, Outcome};
use crate::listener::{Listener, Source};

/// The parked events entry of one queue.
pub struct ParkedEvents {
    listener: Arc<Listener>,
    source: Source,
}

impl ParkedEvents {
    /// The entry applying `source`'s parked events with `listener`'s code.
    pub fn new(listener: Arc<Listener>, source: Source) -> Self {
        Self { listener, source }
    }
}

impl Entry for ParkedEvents {
    fn name(&self) -> &'static str {
        "parked"
    }

    /// Every tick: with nothing due, one read of an index's range that holds nothing.
    fn action<'a>(&'a self, _tick: &'a Tick) -> Fut<'a, Outcome> {
        Box::pin(async move {
            let r = self.listener.redrive(self.source).await?;
            Ok(format!(
                "applied {}, failed again {}, refused {}",
                r.applied, r.again, r.refused
            ))
        })
    }
}
