//! The ticks generator: every period, a tick for each component, at most one pending per
//! component (ccron's throttling): while a component's table still runs the last tick, the next
//! one waits, and any beyond it are not made. The period only sets the granularity of the
//! tables' rules, not how often an entry's action runs.
//!
//! With several instances on one database, an instance ticks only the components (schedulers)
//! it owns: each table runs on one instance at a time, the one whose engine its entries talk to.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use std::sync::Arc;

use super::{Cron, Tick};
use crate::clock::SharedClock;
use crate::domain::SchedulerId;
use crate::ownership::Ownership;

/// Emits ticks every `period` until `token` is cancelled; each component's table runs on its own
/// task, one tick at a time. Returns once every table has finished the tick it was running.
pub async fn run(
    cron: Cron,
    clock: SharedClock,
    period: Duration,
    ownership: Option<Arc<Ownership>>,
    token: CancellationToken,
) {
    let mut runners = JoinSet::new();
    let mut senders = Vec::new();
    for component in SchedulerId::ALL {
        // Capacity 1: one tick pending per component at most.
        let (tx, mut rx) = mpsc::channel::<Tick>(1);
        senders.push((component, tx));
        let cron = cron.clone();
        runners.spawn(async move {
            while let Some(tick) = rx.recv().await {
                cron.run(tick).await;
            }
        });
    }
    info!(period_ms = period.as_millis() as u64, "cron ticks started");
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    loop {
        tokio::select! {
            () = token.cancelled() => break,
            _ = interval.tick() => {}
            // A table ends only when its channel closes below, so one ending here panicked:
            // the ticks end too (the others aborted with the set), to be started again whole
            // by the process' supervisor, rather than go on without that table.
            Some(ended) = runners.join_next() => {
                let why = ended.err().map_or_else(|| "ended".to_owned(), |e| e.to_string());
                error!(error = %why, "a cron table stopped; the cron ticks stop to be started again");
                return;
            }
        }
        let at = clock.now();
        for (component, tx) in &senders {
            if ownership.as_ref().is_some_and(|o| o.epoch(*component) == 0) {
                continue;
            }
            // A full channel: the table is still behind; this tick is not made.
            let _ = tx.try_send(Tick {
                component: *component,
                seq,
                at,
            });
        }
        seq += 1;
    }
    drop(senders);
    while runners.join_next().await.is_some() {}
    info!("cron ticks stopped");
}
