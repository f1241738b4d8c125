//! Turning a push request into a task ready to store: scheduler check, priority rule, payload
//! validation, id reconciliation and the hash. Pure; the engine decides where the task goes.

use serde_json::{Map, Value};
use uuid::Uuid;

use super::types::QueueError;
use crate::domain::SchedulerId;
use crate::domain::keys::DataKeys;
use crate::domain::limits::Limits;
use crate::domain::payload::{data_id, hash_for};
use crate::storage::schedules::ScheduleRow;

/// What a client pushes (mula's `TaskPush`, plus the keys of a full task a worker re-pushes).
/// Serde only for forwarding to the owning instance, which takes every field as it is.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct PushRequest {
    /// The task id; with a known id the push re-queues that task.
    pub id: Option<Uuid>,
    /// Must match the scheduler pushed to, when given.
    pub scheduler_id: Option<String>,
    /// The organisation.
    pub organisation: String,
    /// Lower is more urgent; required and non-zero (mula's rule).
    pub priority: Option<i64>,
    /// The payload.
    pub data: Map<String, Value>,
    /// The planner's push, not a client's: it is refused while a task with the same hash is
    /// still dispatched or running, so the same work never runs twice at once (no concurrent
    /// invocation; a client's push is not held back, a user may run a scan again), and an id it
    /// names is a fresh one (the planner names ids to link de-duplication siblings), never a
    /// re-push of an existing task, so it costs no read.
    pub planned: bool,
    /// With `planned`: the id names this one piece of work (a schedule's fire): a push whose id
    /// exists already, in whatever status, changes nothing, so a fire pushed again after a
    /// restart is not run twice.
    pub once: bool,
    /// The schedule the task comes from.
    pub schedule_id: Option<Uuid>,
    /// Why the planner's strategy gave this priority (its explanation as JSON): stored with the
    /// task when the push creates it, in the same transaction, so every planned task that waits
    /// has the explanation its re-scores start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<String>,
    /// The schedule of the work's hash, made if there is none (mula's `post_push`; see
    /// [`crate::schedules::Schedules::link_row`]): written by the engine in the transaction that
    /// creates the task, which then names the schedule of its hash (this row's id, or the one
    /// that existed). A push that creates no task (a boost, a refusal) writes no schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<ScheduleRow>,
    /// With the id of a task that exists: the `modified_at` of the copy given back, as the
    /// worker got it. A copy from before the task was last handed out is another holder's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_modified_at: Option<chrono::NaiveDateTime>,
}

/// A validated task, not yet placed.
#[derive(Debug, Clone)]
pub(crate) struct NewTask {
    pub id: Uuid,
    /// See [`PushRequest::planned`].
    pub planned: bool,
    /// See [`PushRequest::once`].
    pub once: bool,
    /// See [`PushRequest::schedule_id`].
    pub schedule_id: Option<Uuid>,
    /// The client named this id, so it may be a re-push of a task that exists.
    pub id_given: bool,
    pub organisation: String,
    pub priority: i64,
    pub hash: String,
    /// The payload as JSON text, with `id` set to the task id.
    pub data: String,
    /// The payload's key fields.
    pub keys: DataKeys,
    /// See [`PushRequest::explanation`].
    pub explanation: Option<String>,
    /// See [`PushRequest::link`]; none when the push names its schedule.
    pub link: Option<ScheduleRow>,
    /// See [`PushRequest::copy_modified_at`].
    pub copy_modified_at: Option<chrono::NaiveDateTime>,
}

/// Validates `req` for `scheduler`, within `limits`.
pub(crate) fn prepare(
    scheduler: SchedulerId,
    req: PushRequest,
    limits: &Limits,
) -> Result<NewTask, QueueError> {
    let over = |e: crate::domain::limits::LimitError| QueueError::BadRequest(e.0);
    limits
        .check_text("organisation", &req.organisation)
        .map_err(over)?;
    if let Some(s) = &req.scheduler_id {
        limits.check_text("scheduler_id", s).map_err(over)?;
    }
    limits.check_object("data", &req.data).map_err(over)?;
    if let Some(sent) = &req.scheduler_id
        && sent != scheduler.as_str()
    {
        return Err(QueueError::BadRequest(format!(
            "scheduler_id in item does not match the scheduler: the item names '{sent}' but was pushed to '{scheduler}'"
        )));
    }
    if req.organisation.trim().is_empty() {
        return Err(QueueError::Malformed(
            "organisation: must not be empty".into(),
        ));
    }
    let priority = match req.priority {
        None => {
            return Err(QueueError::Malformed(
                "priority: required (a non-zero integer; lower is more urgent)".into(),
            ));
        }
        Some(0) => {
            return Err(QueueError::Malformed(
                "priority: 0 is not a valid priority (use a non-zero integer; lower is more urgent)"
                    .into(),
            ));
        }
        Some(p) => p,
    };
    let mut data = req.data;
    let hash = hash_for(scheduler, &data).map_err(|e| QueueError::Malformed(e.0))?;
    let in_data = data_id(&data).map_err(|e| QueueError::Malformed(e.0))?;
    // mula keeps `id == data.id`; when a client sends two different ids it gives the task a
    // fresh one rather than guess which was meant.
    let (id, id_given) = match (req.id, in_data) {
        (Some(a), Some(b)) if a != b => (Uuid::new_v4(), false),
        (Some(a), _) | (None, Some(a)) => (a, !req.planned || req.once),
        (None, None) => (Uuid::new_v4(), false),
    };
    data.insert("id".into(), Value::String(id.hyphenated().to_string()));
    let keys = DataKeys::of(scheduler, &data);
    limits.check_keys(&keys).map_err(over)?;
    let data = Value::Object(data).to_string();
    Ok(NewTask {
        id,
        planned: req.planned,
        once: req.planned && req.once,
        schedule_id: req.schedule_id,
        id_given,
        organisation: req.organisation,
        priority,
        hash,
        data,
        keys,
        explanation: req.explanation,
        link: req.link.filter(|_| req.schedule_id.is_none()),
        copy_modified_at: req.copy_modified_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn boefje_request() -> PushRequest {
        let Value::Object(data) =
            json!({"boefje": {"id": "dns-records"}, "input_ooi": null, "organization": "org1"})
        else {
            unreachable!()
        };
        PushRequest {
            organisation: "org1".into(),
            priority: Some(5),
            data,
            ..Default::default()
        }
    }

    #[test]
    fn data_id_is_set_to_the_task_id() {
        let task = prepare(SchedulerId::Boefje, boefje_request(), &Limits::default()).unwrap();
        let data: Value = serde_json::from_str(&task.data).unwrap();
        assert_eq!(data["id"], json!(task.id.to_string()));
        assert_eq!(task.hash, "316d04d4f0baf363b64ec113ce54f9ce");
        assert!(!task.id_given);
    }

    #[test]
    fn a_given_id_is_kept_and_marks_a_possible_re_push() {
        let id = Uuid::new_v4();
        let mut req = boefje_request();
        req.id = Some(id);
        let task = prepare(SchedulerId::Boefje, req, &Limits::default()).unwrap();
        assert_eq!((task.id, task.id_given), (id, true));
    }

    #[test]
    fn two_different_ids_give_a_fresh_one() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut req = boefje_request();
        req.id = Some(a);
        req.data.insert("id".into(), json!(b.to_string()));
        let task = prepare(SchedulerId::Boefje, req, &Limits::default()).unwrap();
        assert!(task.id != a && task.id != b);
    }

    #[test]
    fn priority_zero_or_missing_is_refused() {
        let mut req = boefje_request();
        req.priority = Some(0);
        assert!(
            matches!(prepare(SchedulerId::Boefje, req, &Limits::default()), Err(QueueError::Malformed(m)) if m.starts_with("priority"))
        );
        let mut req = boefje_request();
        req.priority = None;
        assert!(prepare(SchedulerId::Boefje, req, &Limits::default()).is_err());
    }

    #[test]
    fn a_mismatched_scheduler_id_is_a_bad_request() {
        let mut req = boefje_request();
        req.scheduler_id = Some("normalizer".into());
        assert!(matches!(
            prepare(SchedulerId::Boefje, req, &Limits::default()),
            Err(QueueError::BadRequest(_))
        ));
    }
}
