//! An object was deleted: its organisation's waiting tasks for it (queued or pending, found through
//! the `organisation` and `input_ooi` indexes) are cancelled. Tasks already handed out run on; the
//! worker finds the object gone. The same, for some boefjes only, when the object's scan level
//! dropped below theirs (its clearance was withdrawn).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::batch::BatchRows;
use super::command::CancelObject;
use super::pop::Reads;
use super::state::QueueState;
use crate::domain::TaskStatus;
use crate::domain::filter::plan::plan;
use crate::domain::filter::{Column, Condition, FilterNode, Operand, Operator, Scalar};
use crate::domain::keys::KeyField;
use crate::storage::StorageError;

/// Tasks of one object cancelled per command at most (an object has a few dozen).
const CANCEL_MAX: usize = 10_000;

/// Cancels the waiting tasks of `target`; answers their ids.
pub(crate) fn cancel_object(
    st: &mut QueueState,
    rows: &mut BatchRows,
    reads: &mut dyn Reads,
    target: &CancelObject,
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, StorageError> {
    let mut conditions = vec![
        FilterNode::equals(Column::Organisation, &[], &target.organisation),
        FilterNode::equals(Column::Data, &["input_ooi"], &target.reference),
    ];
    if let Some(plugins) = &target.plugins {
        conditions.push(FilterNode::Cond(Condition {
            column: Column::Data,
            path: vec!["boefje".into(), "id".into()],
            op: Operator::In,
            operand: Operand::Many(plugins.iter().cloned().map(Scalar::Text).collect()),
        }));
    }
    let filter = FilterNode::And(conditions);
    let p = plan(&filter, st.scheduler);
    let mut cancelled = st.heap.matching(&filter, &p, CANCEL_MAX);
    for id in &cancelled {
        st.heap.remove(id);
        match rows.get(id).cloned() {
            Some(mut row) => {
                row.status = TaskStatus::Cancelled;
                row.modified_at = now.naive_utc();
                rows.update(*id, row);
            }
            None => rows.cancelled.push(*id),
        }
    }
    // A deleted object's backlog is searched whatever the pending count says: the count misses
    // rows written behind the engine's back (by hand, a restore), and those tasks must not run
    // against a deleted object. One probe of the pending `input_ooi` index; a row the count did
    // not hold marks it for a recount (`PendingSet::remove`). A withdrawal names its work (each
    // boefje's hash on the object): it probes only when the pending set may hold one of them,
    // since a probe for every update of an object (a statement each) cut the listener's updates
    // to a fifth.
    if may_be_pending(st, target) {
        let values = [target.reference.clone()];
        let skip = rows.left_pending();
        for mut row in reads.pending_matching(
            Some((KeyField::InputOoi, &values)),
            &filter,
            CANCEL_MAX,
            &skip,
        )? {
            let id = row.uuid()?;
            st.pending.remove(row.hash.as_deref());
            if !rows.contains(&id) {
                rows.load(vec![row.clone()], st.scheduler.as_str());
            }
            row.status = TaskStatus::Cancelled;
            row.modified_at = now.naive_utc();
            rows.update(id, row);
            cancelled.push(id);
        }
    }
    Ok(cancelled)
}

/// Whether the backlog may hold a task `target` cancels: always for a deleted object, and for a
/// withdrawal when the pending set may hold the hash of one of its boefjes' work on the object.
fn may_be_pending(st: &QueueState, target: &CancelObject) -> bool {
    let Some(plugins) = &target.plugins else {
        return true;
    };
    plugins.iter().any(|plugin| {
        let data = serde_json::json!({
            "boefje": {"id": plugin},
            "input_ooi": target.reference,
            "organization": target.organisation,
        });
        data.as_object()
            .and_then(|d| crate::domain::payload::hash_for(st.scheduler, d).ok())
            .is_none_or(|hash| st.pending.may_hold(&hash))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::engine::place::{Admission, place};
    use crate::queue::engine::testing::{FakeTable, now, row};
    use crate::queue::types::WhenFull;

    #[test]
    fn only_that_organisations_tasks_for_that_object_are_cancelled() {
        let mut st = crate::queue::engine::testing::state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let mut ids = Vec::new();
        for (org, ooi) in [("org1", "h1"), ("org2", "h1"), ("org1", "h2")] {
            let (id, mut r) = row(5, ids.len() as i64);
            r.organisation = org.into();
            r.input_ooi = Some(ooi.into());
            place(&mut st, &mut rows, id, &r, Admission::New).unwrap();
            ids.push(id);
        }
        let target = CancelObject {
            organisation: "org1".into(),
            reference: "h1".into(),
            plugins: None,
        };
        let got = cancel_object(
            &mut st,
            &mut rows,
            &mut FakeTable::default(),
            &target,
            now(),
        )
        .unwrap();
        assert_eq!(got, vec![ids[0]]);
        assert_eq!(rows.cancelled, vec![ids[0]]);
        assert_eq!(st.heap.len(), 2);
    }

    #[test]
    fn a_withdrawal_reads_the_backlog_only_when_it_may_hold_its_work() {
        let mut st = crate::queue::engine::testing::state(10, WhenFull::Pending);
        st.pending = crate::queue::engine::state::PendingSet::with(0, Some(Default::default()));
        let hash = |plugin: &str| {
            let data = serde_json::json!({"boefje": {"id": plugin}, "input_ooi": "h1", "organization": "org1"});
            crate::domain::payload::hash_for(st.scheduler, data.as_object().unwrap()).unwrap()
        };
        let (b1, other) = (hash("b1"), hash("other"));
        st.pending.add(Some(&other));
        let (mine, mut r) = row(5, 1);
        r.organisation = "org1".into();
        r.input_ooi = Some("h1".into());
        r.data = r#"{"boefje": {"id": "b1"}, "input_ooi": "h1", "organization": "org1"}"#.into();
        r.hash = Some(b1.clone());
        r.status = TaskStatus::Pending;
        let mut table = FakeTable {
            pending: vec![r],
            ..Default::default()
        };
        let target = CancelObject {
            organisation: "org1".into(),
            reference: "h1".into(),
            plugins: Some(vec!["b1".into()]),
        };
        let mut rows = BatchRows::default();
        let got = cancel_object(&mut st, &mut rows, &mut table, &target, now()).unwrap();
        assert!(got.is_empty());
        assert_eq!(table.reads, 0, "the backlog holds none of b1's work on h1");
        st.pending.add(Some(&b1));
        let got = cancel_object(&mut st, &mut rows, &mut table, &target, now()).unwrap();
        assert_eq!(got, vec![mine]);
        assert!(table.reads > 0);
    }

    #[test]
    fn pending_tasks_the_count_does_not_hold_are_cancelled_too() {
        let mut st = crate::queue::engine::testing::state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        // Written behind the engine's back: the count says nothing is pending.
        let (mine, mut r) = row(5, 1);
        r.organisation = "org1".into();
        r.input_ooi = Some("h1".into());
        r.data = r#"{"boefje": {"id": "b1"}, "input_ooi": "h1"}"#.into();
        r.status = TaskStatus::Pending;
        let (other, mut o) = row(5, 2);
        o.organisation = "org2".into();
        o.input_ooi = Some("h1".into());
        o.data = r#"{"boefje": {"id": "b1"}, "input_ooi": "h1"}"#.into();
        o.status = TaskStatus::Pending;
        let mut table = FakeTable {
            pending: vec![r, o],
            ..Default::default()
        };
        assert_eq!(st.pending.count(), 0);
        let target = CancelObject {
            organisation: "org1".into(),
            reference: "h1".into(),
            plugins: None,
        };
        let got = cancel_object(&mut st, &mut rows, &mut table, &target, now()).unwrap();
        assert_eq!(got, vec![mine], "only org1's task for the deleted object");
        assert_eq!(rows.get(&mine).unwrap().status, TaskStatus::Cancelled);
        assert!(!rows.contains(&other));
        assert!(st.pending.needs_recount(), "the count is read again");
    }
}
