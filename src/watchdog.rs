//! The lease watchdog: a loop that asks each engine, every `watchdog_interval_secs`, to re-queue
//! or fail the tasks whose lease ended (after LUCI's watchdog, which repairs jobs stuck in a
//! state). The rule itself lives in the queue engine; this module only keeps time. It becomes an
//! entry of the cron table once that exists.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::queue::Broker;

/// Sweeps every `every` until `shutdown` is cancelled.
pub async fn run(broker: Broker, every: Duration, shutdown: CancellationToken) {
    let mut ticks = tokio::time::interval(every);
    // A sweep that overran should not be followed by a burst of catch-up sweeps.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = ticks.tick() => {}
        }
        match broker.expire_leases().await {
            Ok(report) if report.requeued.is_empty() && report.failed.is_empty() => {}
            Ok(report) => info!(
                requeued = report.requeued.len(),
                failed = report.failed.len(),
                "lease sweep"
            ),
            Err(e) => warn!(error = %e, "lease sweep failed; retrying at the next tick"),
        }
    }
}
