//! `scan_profile_mutations`: objects created or updated are upserted into the frontier and get a
//! boefje task for every plugin that may run on them; deleted ones are marked gone and their
//! organisation's waiting tasks for them are cancelled.

use std::collections::HashSet;

use super::{Listener, Outcome};
use crate::domain::event::{ObjectEvent, parse_object_event};

impl Listener {
    /// Decides a batch of messages, in order: the frontier write of a run of events about
    /// different objects is one transaction and their tasks one push; an object named twice
    /// starts a new run, so its events apply in the order they came.
    pub(super) async fn on_mutations(&self, bodies: &[&[u8]]) -> Vec<Outcome> {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; bodies.len()];
        let mut run: Vec<(usize, ObjectEvent)> = Vec::new();
        let mut seen: HashSet<(String, String)> = HashSet::new();
        for (i, body) in bodies.iter().enumerate() {
            match parse_object_event(body) {
                Ok(e) => {
                    let key = (e.organisation.clone(), e.reference.clone());
                    if seen.contains(&key) {
                        self.apply_run(std::mem::take(&mut run), &mut outcomes)
                            .await;
                        seen.clear();
                    }
                    seen.insert(key);
                    run.push((i, e));
                }
                Err(e) => outcomes[i] = Some(Outcome::Poison(e.0)),
            }
        }
        self.apply_run(run, &mut outcomes).await;
        outcomes
            .into_iter()
            .map(|o| o.unwrap_or(Outcome::Done))
            .collect()
    }

    async fn apply_run(&self, run: Vec<(usize, ObjectEvent)>, outcomes: &mut [Option<Outcome>]) {
        if run.is_empty() {
            return;
        }
        let now = self.planner.clock.now();
        let events: Vec<&ObjectEvent> = run.iter().map(|(_, e)| e).collect();
        // The frontier write and the planning do not wait for each other (planning reads other
        // organisations' rows, never this run's): both commit before anything is acked.
        let (written, planned) = tokio::join!(
            self.frontier.apply_objects(&events, now.naive_utc()),
            self.planner.objects(&events)
        );
        if let Err(e) = written {
            if run.len() > 1 && e.is_request_fault() {
                // One event broke the statement: apply them one by one to find it.
                for (i, event) in run {
                    Box::pin(self.apply_run(vec![(i, event)], outcomes)).await;
                }
            } else {
                let outcome = Outcome::of_storage(&e);
                for (i, _) in &run {
                    outcomes[*i] = Some(outcome.clone());
                }
            }
            return;
        }
        for ((i, event), planned) in run.iter().zip(planned) {
            let mut outcome = Outcome::of_plan(&planned);
            if event.object.is_none() && matches!(outcome, Outcome::Done) {
                outcome = Outcome::of_plan(
                    &self
                        .planner
                        .gone(&event.organisation, &event.reference)
                        .await,
                );
            }
            outcomes[*i] = Some(outcome);
        }
    }
}
