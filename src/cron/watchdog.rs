//! The lease watchdog as a cron entry (after LUCI's watchdog): re-queues a component's tasks
//! whose dispatch or run lease ended (attempts + 1), or fails them once their attempts are used.

use super::Tick;
use super::table::{Entry, Fut, Outcome};
use crate::queue::Broker;

/// The lease watchdog of one component; wrap it in [`super::table::Periodic`].
pub struct LeaseWatchdog {
    /// Where the leases are.
    pub broker: Broker,
}

impl Entry for LeaseWatchdog {
    fn name(&self) -> &'static str {
        "lease watchdog"
    }

    fn action<'a>(&'a self, tick: &'a Tick) -> Fut<'a, Outcome> {
        Box::pin(async move {
            let r = self.broker.expire_leases_of(tick.component).await?;
            if !r.requeued.is_empty() || !r.failed.is_empty() {
                tracing::info!(scheduler.id = %tick.component, requeued = r.requeued.len(), failed = r.failed.len(), "expired leases handled");
            }
            Ok(format!(
                "requeued {}, failed {}",
                r.requeued.len(),
                r.failed.len()
            ))
        })
    }
}
