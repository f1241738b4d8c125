//! `raw_file_received`: a raw file is recorded and gets a normalizer task for every enabled
//! normalizer that parses one of its mime types (none for an `error/…` file).

use super::{Listener, Outcome};
use crate::domain::SchedulerId;
use crate::domain::event::parse_raw_file_event;
use crate::planner;

impl Listener {
    pub(super) async fn on_raw_file(&self, body: &[u8]) -> Outcome {
        let event = match parse_raw_file_event(body) {
            Ok(e) => e,
            Err(e) => return Outcome::Poison(e.0),
        };
        let now = self.clock.now();
        if let Err(e) = self.frontier.record_raw_file(&event, now.naive_utc()).await {
            return if e.is_request_fault() {
                Outcome::Poison(format!("the raw file could not be recorded: {e}"))
            } else {
                Outcome::Retry(e.to_string())
            };
        }
        let plugins = self.catalogue.plugins(&event.organisation);
        for task in planner::normalizer_tasks(&event, &plugins, now.timestamp()) {
            if let Err(e) = self.broker.push(SchedulerId::Normalizer, task).await
                && let Some(outcome) = Outcome::of_push_error(e)
            {
                return outcome;
            }
        }
        Outcome::Done
    }
}
