//! mula's `post_push` for a client's push: boefje and report work pushed through the API gets
//! the schedule of its hash, made if there is none, so the work recurs (a scan a user starts in
//! Rocky is rescheduled after it, as mula does).
//!
//! The push carries the schedule row its hash gets if it has none ([`PushRequest::link`]); the
//! engine writes it in the transaction that creates the task, or finds the hash's schedule and
//! names that one. A push the queue refuses (409, 429, 503), or that boosts work already waiting,
//! writes no schedule. Normalizer work has no schedule.

use tracing::warn;

use crate::clients::catalogue::Catalogue;
use crate::clock::SharedClock;
use crate::domain::SchedulerId;
use crate::domain::schedule::Cadence;
use crate::queue::{Broker, PushOutcome, PushRequest, QueueError};
use crate::schedules::{Schedules, Seed};

/// Links a client's boefje and report pushes to their schedule.
#[derive(Clone)]
pub struct PushLinker {
    /// Where the schedules are.
    pub schedules: Schedules,
    /// When a boefje schedule is next due.
    pub cadence: Cadence,
    /// A boefje's cron expression and interval.
    pub catalogue: Catalogue,
    /// Deadlines count from now.
    pub clock: SharedClock,
}

impl PushLinker {
    /// Pushes `request` onto `scheduler`, linked to the schedule of its hash.
    pub async fn push(
        &self,
        broker: &Broker,
        scheduler: SchedulerId,
        mut request: PushRequest,
    ) -> Result<PushOutcome, QueueError> {
        if scheduler == SchedulerId::Normalizer || request.schedule_id.is_some() {
            return broker.push(scheduler, request).await;
        }
        // A push that is malformed as it is gets its 4xx before the catalogue is asked.
        broker.check(scheduler, &request)?;
        if let Some(seed) = self.seed(scheduler, &request).await {
            request.link = self.schedules.link_row(scheduler, seed);
        }
        broker.push(scheduler, request).await
    }

    /// The schedule `request`'s work gets when it has none: a boefje's from its plugin (cron
    /// expression, else its interval, else the grace period; none for a plugin that runs only
    /// on events), a report's with no deadline (a one-off, as mula keeps it).
    async fn seed(&self, scheduler: SchedulerId, request: &PushRequest) -> Option<Seed> {
        let now = self.clock.now();
        let (cron, wait) = match scheduler {
            SchedulerId::Normalizer => return None,
            SchedulerId::Report => (None, None),
            SchedulerId::Boefje => match self.catalogue.plugins(&request.organisation).await {
                Ok(plugins) => {
                    let known = request
                        .data
                        .get("boefje")
                        .and_then(|b| b.get("id"))
                        .and_then(|id| id.as_str())
                        .is_some_and(|id| plugins.iter().any(|p| p.id == id));
                    if known {
                        let (cron, interval) = super::schedule_of(request, &plugins)?;
                        (cron, Some(interval))
                    } else {
                        (None, Some(None))
                    }
                }
                // Katalogus not answering does not hold the push up: the grace period applies.
                Err(e) => {
                    warn!(organisation = %request.organisation, error = %e, "plugin unknown for a pushed task's schedule; the grace period applies");
                    (None, Some(None))
                }
            },
        };
        let key = serde_json::Value::Object(request.data.clone()).to_string();
        Some(Seed {
            organisation: request.organisation.clone(),
            data: request.data.clone(),
            deadline_at: self.cadence.next(&key, cron.as_deref(), wait, now),
            cron,
        })
    }
}
