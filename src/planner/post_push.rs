//! mula's `post_push` for a client's push: boefje and report work pushed through the API gets
//! the schedule of its hash, made if there is none, so the work recurs (a scan a user starts in
//! Rocky is rescheduled after it, as mula does).
//!
//! The schedule is linked *before* the push so the task carries its id from the start, in the
//! database and in the heap alike. A push the queue then refuses (409, 429, 503) takes back a
//! schedule this push made, so a refused push writes nothing. Normalizer work has no schedule.

use tracing::warn;

use crate::clients::catalogue::Catalogue;
use crate::clock::SharedClock;
use crate::domain::SchedulerId;
use crate::domain::schedule::Cadence;
use crate::queue::{Broker, PushOutcome, PushRequest, QueueError};
use crate::schedules::{Linked, Schedules, Seed};

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
        // A push that is malformed as it is gets its 4xx before anything is written.
        broker.check(scheduler, &request)?;
        let linked = match self.seed(scheduler, &request).await {
            Some(seed) => match self.schedules.link(scheduler, vec![seed]).await {
                Ok(mut ids) => ids.pop().flatten(),
                Err(e) => {
                    // The schedule only makes the work recur; the push itself goes ahead.
                    warn!(%scheduler, error = %e, "pushed task not linked to a schedule");
                    None
                }
            },
            None => None,
        };
        request.schedule_id = linked.map(|l| l.id);
        let outcome = broker.push(scheduler, request).await;
        if outcome.is_err()
            && let Some(Linked { id, created: true }) = linked
            && let Err(e) = self.schedules.delete(id).await
        {
            warn!(%scheduler, schedule = %id, error = %e, "schedule of a refused push not taken back");
        }
        outcome
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
