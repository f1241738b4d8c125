//! Re-score: a strategy whose priorities move with time (`grace-period`: the longer overdue, the
//! sooner) gives waiting work the priority it gives *now*. Each waiting task the planner or the
//! reschedule entry scored is scored again from its recorded inputs at the tick's time, a page at
//! a time in task id order; the changed priorities of a page and their explanations are one
//! engine command (heap, table and explanations in one transaction), so `GET
//! /tasks/{id}/explain` tells the new terms and a crash cannot leave an explanation behind its
//! priority. A task whose priority a client changed since (its recorded explanation no
//! longer matches it) keeps the client's priority. A strategy that does not depend on time makes
//! this entry a no-op.

use std::sync::Arc;

use super::Tick;
use super::table::{CronError, Entry, Fut, Outcome};
use uuid::Uuid;

use crate::domain::SchedulerId;
use crate::queue::Broker;
use crate::scoring::{Explanation, ScoreInput, Scorer};

/// Waiting tasks read and re-scored per page.
pub const PAGE: usize = 10_000;

/// The re-score of one component; wrap it in [`super::table::Periodic`].
pub struct Rescore {
    /// Where the tasks are.
    pub broker: Broker,
    /// The component's strategy.
    pub scorer: Arc<Scorer>,
}

/// A page of waiting tasks with their recorded explanations and priorities, and its last id.
type Page = (Vec<(Uuid, Explanation, i64)>, Option<String>);

/// A page's changes: new priorities with the explanations that go with them.
type Changes = Vec<(Uuid, i64, Explanation)>;

impl Rescore {
    async fn read(&self, s: SchedulerId, after: String) -> Result<Page, CronError> {
        Ok(self.broker.waiting_scores(s, after, PAGE).await?)
    }

    /// The page's new priorities and explanations, for the tasks whose strategy's priority
    /// changed at the tick's time and whose priority no client set.
    fn rescored(&self, page: Vec<(Uuid, Explanation, i64)>, tick: &Tick) -> Changes {
        let mut out = Vec::new();
        for (id, was, current) in page {
            if was.priority != current {
                // A client set this priority; it stands.
                continue;
            }
            let Ok(mut input) = serde_json::from_value::<ScoreInput>(was.inputs) else {
                continue;
            };
            input.now = tick.at;
            if let Some((p, e)) = self.scorer.score(tick.component, &input)
                && p != current
            {
                out.push((id, p, e));
            }
        }
        out
    }
}

impl Entry for Rescore {
    fn name(&self) -> &'static str {
        "rescore"
    }

    fn rule<'a>(&'a self, tick: &'a Tick) -> Fut<'a, bool> {
        Box::pin(async move { self.scorer.depends_on_time(tick.component) })
    }

    /// Pages through the waiting tasks, the next page read while the last one's new priorities
    /// and explanations are applied (one engine command, one transaction).
    fn action<'a>(&'a self, tick: &'a Tick) -> Fut<'a, Outcome> {
        Box::pin(async move {
            let s = tick.component;
            let (mut seen, mut changed) = (0usize, 0usize);
            let mut next = Some(self.read(s, String::new()).await?);
            while let Some((page, last)) = next {
                seen += page.len();
                let scores = self.rescored(page, tick);
                changed += scores.len();
                let reading = async {
                    match last {
                        Some(after) => self.read(s, after).await.map(Some),
                        None => Ok(None),
                    }
                };
                let applying = self.broker.rescore(s, scores);
                let (applied, following) = tokio::join!(applying, reading);
                applied?;
                next = following?;
            }
            if changed > 0 {
                tracing::info!(scheduler.id = %s, seen, changed, "waiting tasks re-scored");
            }
            Ok(format!("re-scored {changed} of {seen}"))
        })
    }
}
