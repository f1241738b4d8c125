//! `raw_file_received`: raw files are recorded and get a normalizer task for every enabled
//! normalizer that parses one of their mime types (none for an `error/…` file).

use super::{Listener, Outcome};
use crate::domain::event::{RawFileEvent, parse_raw_file_event};

impl Listener {
    /// Decides a batch of messages: one frontier write and one push for all the files.
    pub(super) async fn on_raw_files(&self, bodies: &[&[u8]]) -> Vec<Outcome> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; bodies.len()];
        let mut files: Vec<(usize, RawFileEvent)> = Vec::new();
        for (i, body) in bodies.iter().enumerate() {
            match parse_raw_file_event(body) {
                Ok(e) => files.push((i, e)),
                Err(e) => outcomes[i] = Some(Outcome::Poison(e.0)),
            }
        }
        self.apply_files(files, &mut outcomes).await;
        outcomes
            .into_iter()
            .map(|o| o.unwrap_or(Outcome::Done))
            .collect()
    }

    pub(super) async fn apply_files(
        &self,
        files: Vec<(usize, RawFileEvent)>,
        outcomes: &mut [Option<Outcome>],
    ) {
        if files.is_empty() {
            return;
        }
        let now = self.planner.clock.now();
        let events: Vec<&RawFileEvent> = files.iter().map(|(_, e)| e).collect();
        let (recorded, planned) = tokio::join!(
            self.frontier.record_raw_files(&events, now.naive_utc()),
            self.planner.raw_files(&events)
        );
        if let Err(e) = recorded {
            if files.len() > 1 && e.is_request_fault() {
                for (i, file) in files {
                    Box::pin(self.apply_files(vec![(i, file)], outcomes)).await;
                }
            } else {
                let outcome = Outcome::of_storage(&e);
                for (i, _) in &files {
                    outcomes[*i] = Some(outcome.clone());
                }
            }
            return;
        }
        for ((i, _), planned) in files.iter().zip(planned) {
            outcomes[*i] = Some(Outcome::of_plan(&planned));
        }
    }
}
