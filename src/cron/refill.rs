//! Refill: tops a component's heap up from `pending` when it has room and pending tasks wait.
//!
//! Every batch of requests already moves up to [`REFILL_BATCH`] pending tasks into the heap as it
//! drains. This entry covers the room no batch fills: a cancellation that empties much of the
//! heap at once, or a quiet queue whose last batch left room. Filtered pops are answered from the
//! heap's indexes, so a heap kept full serves them without reading `pending`.

use super::Tick;
use super::table::{Entry, Fut, Outcome};
use crate::queue::{Broker, REFILL_BATCH};

/// Refills per tick at most (each one transaction of up to [`REFILL_BATCH`] tasks), so a table
/// is not held for long; the next tick goes on.
const REFILLS_PER_TICK: usize = 100;

/// The refill entry of one component.
pub struct Refill {
    /// The component's engine.
    pub broker: Broker,
}

impl Entry for Refill {
    fn name(&self) -> &'static str {
        "refill"
    }

    /// Runs only when the heap has room and tasks are pending, read from the engine's published
    /// figures: a quiet tick sends the engine nothing.
    fn rule<'a>(&'a self, tick: &'a Tick) -> Fut<'a, bool> {
        Box::pin(async move {
            let s = self.broker.snapshot(tick.component);
            s.pending > 0 && (s.qsize as usize) < s.maxsize
        })
    }

    fn action<'a>(&'a self, tick: &'a Tick) -> Fut<'a, Outcome> {
        Box::pin(async move {
            let mut moved = 0;
            for _ in 0..REFILLS_PER_TICK {
                let n = self.broker.refill(tick.component).await?;
                moved += n;
                if n < REFILL_BATCH {
                    break;
                }
            }
            Ok(format!("moved {moved}"))
        })
    }
}
