//! Re-score: a strategy whose priorities move with time (`grace-period`: the longer overdue, the
//! sooner) gives waiting work the priority it gives *now*. Each waiting task the planner or the
//! reschedule entry scored is scored again from its recorded inputs at the tick's time, a page at
//! a time in task id order; the changed priorities of a page are one engine command (heap and
//! table in one transaction), then their explanations are replaced so `GET /tasks/{id}/explain`
//! tells the new terms. A task whose priority a client changed since (its recorded explanation no
//! longer matches it) keeps the client's priority. A strategy that does not depend on time makes
//! this entry a no-op.

use std::sync::Arc;

use super::Tick;
use super::table::{Entry, Fut, Outcome};
use crate::queue::Broker;
use crate::scoring::{ScoreInput, Scorer};

/// Waiting tasks read and re-scored per page.
pub const PAGE: usize = 10_000;

/// The re-score of one component; wrap it in [`super::table::Periodic`].
pub struct Rescore {
    /// Where the tasks are.
    pub broker: Broker,
    /// The component's strategy.
    pub scorer: Arc<Scorer>,
}

impl Entry for Rescore {
    fn name(&self) -> &'static str {
        "rescore"
    }

    fn rule<'a>(&'a self, tick: &'a Tick) -> Fut<'a, bool> {
        Box::pin(async move { self.scorer.depends_on_time(tick.component) })
    }

    fn action<'a>(&'a self, tick: &'a Tick) -> Fut<'a, Outcome> {
        Box::pin(async move {
            let s = tick.component;
            let (mut seen, mut changed) = (0usize, 0usize);
            let mut after = String::new();
            loop {
                let (page, last) = self
                    .broker
                    .waiting_scores(s, after.clone(), PAGE)
                    .await
                    .map_err(|e| e.to_string())?;
                seen += page.len();
                let mut priorities = Vec::new();
                let mut explanations = Vec::new();
                for (id, was, current) in page {
                    if was.priority != current {
                        // A client set this priority; it stands.
                        continue;
                    }
                    let Ok(mut input) = serde_json::from_value::<ScoreInput>(was.inputs) else {
                        continue;
                    };
                    input.now = tick.at;
                    if let Some((p, e)) = self.scorer.score(s, &input)
                        && p != current
                    {
                        priorities.push((id, p));
                        explanations.push((id, e));
                    }
                }
                changed += priorities.len();
                self.broker
                    .rescore(s, priorities)
                    .await
                    .map_err(|e| e.to_string())?;
                if !explanations.is_empty() {
                    self.broker
                        .update_scores(explanations)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                match last {
                    Some(id) => after = id,
                    None => break,
                }
            }
            if changed > 0 {
                tracing::info!(scheduler.id = %s, seen, changed, "waiting tasks re-scored");
            }
            Ok(format!("re-scored {changed} of {seen}"))
        })
    }
}
