//! Explaining a wait: where a queued task stands in its scheduler's heap and what holds it back,
//! read from the engine's state (no database), for `GET /tasks/{id}/explain`.
//!
//! Ranks are counted by walking the heap's indexes up to the task: O(rank) for the filters and
//! the organisation, O(n) for the place among all queued tasks (the heap keeps no order
//! statistics; an operator's question is rare and a million entries are walked in milliseconds).

use std::collections::VecDeque;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::state::QueueState;
use crate::domain::filter::FilterNode;
use crate::domain::filter::eval;
use crate::domain::filter::plan::Plan;
use crate::queue::types::{FilterRank, Wait};

/// Distinct pop filters remembered per scheduler: a fleet runs a few kinds of runner.
pub const RECENT_FILTERS: usize = 8;

/// The filters recent pops sent, newest first, each once.
#[derive(Default)]
pub(crate) struct RecentFilters(VecDeque<(Value, FilterNode, Plan)>);

impl RecentFilters {
    /// A pop sent this filter.
    pub fn saw(&mut self, source: &Value, node: &FilterNode, plan: &Plan) {
        if let Some(at) = self.0.iter().position(|(s, _, _)| s == source) {
            if let Some(seen) = self.0.remove(at) {
                self.0.push_front(seen);
            }
            return;
        }
        self.0
            .push_front((source.clone(), node.clone(), plan.clone()));
        self.0.truncate(RECENT_FILTERS);
    }
}

/// Where queued task `id` stands and what holds it back; `None` if it is not in the heap.
pub(crate) fn wait(
    st: &QueueState,
    recent: &RecentFilters,
    id: Uuid,
    now: DateTime<Utc>,
) -> Option<Wait> {
    let heap = &st.heap;
    let me = heap.rank(&id)?;
    let queued = heap.len() as u64;
    let rank = heap.rank_of(&id);
    let (org, in_org) = heap.organisation_rank(&id).unzip();
    let mut reasons = Vec::new();
    if let Some(r) = rank {
        reasons.push(format!(
            "{r} of {queued} queued on the {} scheduler in priority order",
            st.scheduler
        ));
    }
    let organisations_before = match (&org, heap.fairness().is_on() && !me.is_user()) {
        (Some(org), true) => heap.fairness().turn_of(org).map(|t| t as u64),
        _ => None,
    };
    if me.is_user() {
        reasons.push("a user scan: served before any automatic work".into());
    } else if let (Some(before), Some(org)) = (organisations_before, &org) {
        reasons.push(match before {
            0 => format!("organisation {org} is next in the organisations' turns"),
            n => format!("{n} organisations are served before {org} in their turns"),
        });
    }
    if let (Some(org), Some(n)) = (&org, in_org) {
        reasons.push(format!("{n} of {org}'s queued tasks"));
    }
    let mut filters = Vec::new();
    for (source, node, plan) in &recent.0 {
        if plan.needs_payload || plan.nothing {
            continue;
        }
        let Some(rec) = heap.record(&id, None) else {
            continue;
        };
        if !eval::matches(node, &rec) {
            continue;
        }
        let ahead = heap
            .candidates(plan)
            .take_while(|c| *c != id)
            .filter(|c| {
                heap.record(c, None)
                    .is_some_and(|r| eval::matches(node, &r))
            })
            .count() as u64;
        reasons.push(format!(
            "{} among the tasks a runner popping with {source} sees",
            ahead + 1
        ));
        filters.push(FilterRank {
            filter: source.clone(),
            rank: ahead + 1,
        });
    }
    let mut held = Vec::new();
    if st.throttle.is_active()
        && let Some(keys) = heap.key_values(&id)
        && let Some(hold) = st.throttle.hold(&keys, now)
    {
        held.push(hold.to_string());
        reasons.push(format!("held: {hold}"));
    }
    Some(Wait {
        status: "queued".into(),
        rank,
        queued,
        rank_in_organisation: in_org,
        organisations_before,
        filters,
        held,
        reasons,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::SchedulerId;
    use crate::domain::filter::parse_request;
    use crate::domain::filter::plan::plan;
    use crate::domain::politeness::{Throttle, parse_concurrency};
    use crate::queue::engine::batch::BatchRows;
    use crate::queue::engine::place::{Admission, place};
    use crate::queue::engine::testing::{limits, now, row_with};
    use crate::queue::fair::Fairness;
    use crate::queue::types::WhenFull;
    use serde_json::json;

    #[test]
    fn a_wait_says_where_the_task_stands_and_what_holds_it() {
        let mut l = limits(100, WhenFull::Pending);
        l.fairness = Fairness::Organisation;
        let mut st = QueueState::new(SchedulerId::Boefje, l);
        st.throttle = Throttle::new(parse_concurrency("boefje.id=b1:1").unwrap());
        let mut rows = BatchRows::default();
        let mut ids = Vec::new();
        for (i, (org, image)) in [("a", "img1"), ("a", "img2"), ("b", "img1"), ("b", "img1")]
            .into_iter()
            .enumerate()
        {
            let (id, mut r) = row_with(10 + i as i64, i as i64, image);
            r.organisation = org.into();
            r.plugin_id = Some("b1".into());
            place(&mut st, &mut rows, id, &r, Admission::New).unwrap();
            ids.push(id);
        }
        // A runner of img1 popped lately; another b1 task runs.
        let f = parse_request(
            &json!({"filters": [{"column": "data", "field": "boefje__oci_image",
            "operator": "in", "value": ["img1"]}]}),
        )
        .unwrap();
        let p = plan(&f, SchedulerId::Boefje);
        let mut recent = RecentFilters::default();
        let source = json!([{"column": "data", "field": "boefje__oci_image", "operator": "in",
            "value": ["img1"]}]);
        recent.saw(&source, &f, &p);
        let keys = crate::domain::politeness::KeyValues {
            plugin_id: Some("b1"),
            ..Default::default()
        };
        let running = Uuid::new_v4();
        st.throttle.dispatched(running, &keys, now(), true);

        let w = wait(&st, &recent, ids[3], now()).unwrap();
        assert_eq!(w.rank, Some(4));
        assert_eq!(w.queued, 4);
        assert_eq!(w.rank_in_organisation, Some(2));
        assert_eq!(
            w.organisations_before,
            Some(1),
            "a goes before b (level, by name)"
        );
        assert_eq!(
            w.filters,
            vec![FilterRank {
                filter: source.clone(),
                rank: 3
            }]
        );
        assert_eq!(w.held.len(), 1);
        assert!(w.held[0].contains(&running.to_string()), "{:?}", w.held);
        assert!(
            w.reasons.iter().any(|r| r.contains("4 of 4 queued")),
            "{:?}",
            w.reasons
        );
        // img2's task: the img1 runner does not see it.
        let w = wait(&st, &recent, ids[1], now()).unwrap();
        assert!(w.filters.is_empty());
        assert_eq!(wait(&st, &recent, Uuid::new_v4(), now()), None);
    }

    #[test]
    fn recent_filters_are_kept_once_newest_first_and_bounded() {
        let mut recent = RecentFilters::default();
        let f = parse_request(&json!({"filters": []})).unwrap();
        let p = plan(&f, SchedulerId::Boefje);
        for i in 0..20 {
            recent.saw(&json!(i % 10), &f, &p);
        }
        recent.saw(&json!(3), &f, &p);
        assert_eq!(recent.0.len(), RECENT_FILTERS);
        assert_eq!(recent.0[0].0, json!(3));
        assert_eq!(
            recent.0.iter().filter(|(s, _, _)| *s == json!(3)).count(),
            1
        );
    }
}
