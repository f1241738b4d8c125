//! Re-scoring on the event that changed a task's inputs. Priorities do not age (see
//! [`crate::scoring`]), so a waiting task's priority changes only when something its strategy
//! reads changes: its object's scan level or findings (an object event from the listener, or
//! ColdStart seeing the object changed), or the plugin's interval. Those all arrive as planning
//! of the same work: the push of it is a duplicate of the task that waits, and the planner has
//! just scored the work with the inputs as they are now. The waiting task is re-scored from
//! those (its planning moment kept), only if its recorded explanation still matches its priority
//! (otherwise a client set it) and the priority differs: cost ∝ the tasks the event concerns.
//!
//! A finished run changes no waiting task's inputs: while the same work is dispatched or
//! running, planned work for it is refused (no concurrent invocation), and a copy queued again
//! after its lease ended is withdrawn when the late result comes; the next planning reads the
//! run (and whether it failed) from the history.

use uuid::Uuid;

use super::{PlanError, Planner};
use crate::domain::SchedulerId;
use crate::scoring::ScoreInput;

impl Planner {
    /// Re-scores the waiting tasks `waiting` names (`(task, its inputs as the event gives
    /// them)`) on `scheduler`; answers how many got a new priority.
    pub(super) async fn rescore_waiting(
        &self,
        scheduler: SchedulerId,
        waiting: Vec<(Uuid, ScoreInput)>,
    ) -> Result<usize, PlanError> {
        if waiting.is_empty() {
            return Ok(0);
        }
        let ids = waiting.iter().map(|(id, _)| *id).collect();
        let recorded = self
            .broker
            .waiting_scores(scheduler, ids)
            .await
            .map_err(|e| PlanError::Passing(e.to_string()))?;
        let inputs: std::collections::HashMap<Uuid, ScoreInput> = waiting.into_iter().collect();
        let mut changes = Vec::new();
        for (id, was, priority) in recorded {
            if was.priority != priority {
                // A client set this priority; it stands.
                continue;
            }
            let Some(now) = inputs.get(&id) else { continue };
            if let Some((p, e)) = self.scorer.rescore(scheduler, &was, now) {
                changes.push((id, priority, p, e));
            }
        }
        let n = changes.len();
        if n > 0 {
            self.broker
                .rescore(scheduler, changes)
                .await
                .map_err(|e| PlanError::Passing(e.to_string()))?;
            tracing::debug!(scheduler.id = %scheduler, rescored = n, "waiting tasks re-scored on an event");
        }
        Ok(n)
    }
}
