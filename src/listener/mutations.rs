//! `scan_profile_mutations`: an object created or updated is upserted into the frontier and gets
//! a boefje task for every plugin that may run on it; a deleted one is marked gone and its
//! organisation's waiting tasks for it are cancelled.

use super::{Listener, Outcome};
use crate::domain::SchedulerId;
use crate::domain::event::{Operation, parse_object_event};
use crate::planner;

impl Listener {
    pub(super) async fn on_mutation(&self, body: &[u8]) -> Outcome {
        let event = match parse_object_event(body) {
            Ok(e) => e,
            Err(e) => return Outcome::Poison(e.0),
        };
        let now = self.clock.now();
        if let Err(e) = self.frontier.apply_object(&event, now.naive_utc()).await {
            return if e.is_request_fault() {
                Outcome::Poison(format!("the frontier refused the object: {e}"))
            } else {
                Outcome::Retry(e.to_string())
            };
        }
        if event.operation == Operation::Delete {
            return match self
                .broker
                .cancel_object(&event.organisation, &event.reference)
                .await
            {
                Ok(_) => Outcome::Done,
                Err(e) => Outcome::of_push_error(e).unwrap_or(Outcome::Done),
            };
        }
        let plugins = self.catalogue.plugins(&event.organisation);
        // Time-based priority (mula's): older work first.
        let priority = now.timestamp();
        for task in planner::boefje_tasks(&event, &plugins, priority) {
            if let Err(e) = self.broker.push(SchedulerId::Boefje, task).await
                && let Some(outcome) = Outcome::of_push_error(e)
            {
                return outcome;
            }
        }
        Outcome::Done
    }
}
