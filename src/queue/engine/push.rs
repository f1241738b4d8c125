//! Pushes: a new task, a boost of work already waiting, or a worker giving a task back.
//!
//! Whether the work already waits is answered from memory when it can be: the heap's hash index
//! covers queued tasks, and the pending set covers the backlog while it is not too large. Only a
//! push that may meet an existing row (its id was given, it would boost a waiting task, or the
//! backlog's hashes are not known) needs rows read first; [`reads`] says which.

use chrono::DateTime;
use chrono::Utc;
use uuid::Uuid;

use super::batch::{BatchRows, Reads};
use super::lease::taken_back;
use super::place::{Admission, internal, place, placed_status};
use super::rejoin;
use super::state::QueueState;
use crate::domain::{Placement, TaskStatus};
use crate::queue::push::NewTask;
use crate::queue::types::QueueError;
use crate::storage::rows::TaskRow;

/// The rows `pushes` may meet: what the batch must read before they can be decided.
pub(crate) fn reads<'a>(st: &QueueState, pushes: impl Iterator<Item = &'a NewTask>) -> Reads {
    let mut out = Reads::default();
    for task in pushes {
        if task.id_given {
            out.ids.push(task.id.to_string());
        }
        match st.heap.find_hash(&task.hash) {
            // A boost answers with the whole task, so its row is read; a duplicate that would
            // not run sooner, or planned work, is refused from memory.
            Some(id)
                if !task.planned
                    && st
                        .heap
                        .rank(&id)
                        .is_some_and(|r| task.priority < r.priority) =>
            {
                out.ids.push(id.to_string());
            }
            Some(_) => {}
            None if st.pending.may_hold(&task.hash) => out.hashes.push(task.hash.clone()),
            None => {}
        }
    }
    out.ids.sort_unstable();
    out.ids.dedup();
    out.hashes.sort_unstable();
    out.hashes.dedup();
    out
}

/// Decides one push; answers the task's id and whether it is new.
pub(crate) fn push(
    st: &mut QueueState,
    rows: &mut BatchRows,
    task: &NewTask,
    now: DateTime<Utc>,
) -> Result<(Uuid, bool), QueueError> {
    let s = st.scheduler;
    if task.once && rows.contains(&task.id) {
        // This fire was pushed before (a restart between the push and the schedule's update).
        return Err(QueueError::Duplicate { existing: task.id });
    }
    if task.id_given
        && let Some(existing) = rows.get(&task.id)
    {
        if existing.scheduler_id != s.as_str() {
            // The id is taken, by another scheduler's task: a conflict with that task.
            return Err(QueueError::Conflict(format!(
                "task {} belongs to scheduler '{}', not '{s}'",
                task.id, existing.scheduler_id
            )));
        }
        return match existing.status {
            TaskStatus::Queued | TaskStatus::Pending => {
                boost_or_conflict(st, rows, task.id, task.priority, now)
            }
            // Handed out again after its dispatch lease ended, and this copy is from before:
            // the runtime that gives it back lost it then, and the task is another's now (one
            // that has not started it yet).
            TaskStatus::Dispatched
                if taken_back(existing) && copy_from_before(st, existing, task) =>
            {
                Err(QueueError::Conflict(format!(
                    "task {} was handed out again after its dispatch lease ended; this copy is from before, so it is not given back",
                    task.id
                )))
            }
            TaskStatus::Dispatched => requeue(st, rows, task, now),
            // OpenKAT's runtimes give back, as they stop, only tasks they have not started: a
            // running one is another runner's now (this copy's dispatch lease ended and the
            // task was handed out again). Taken back, it would run twice at once.
            TaskStatus::Running => Err(QueueError::Conflict(format!(
                "task {} is running; a runner started it, so this copy is not given back (a give-back is of a task not started, and this one was handed out again after its dispatch lease ended)",
                task.id
            ))),
            finished => Err(QueueError::Conflict(format!(
                "task {} is {finished}; a finished task is not pushed again (push it without an id to run the work again)",
                task.id
            ))),
        };
    }
    let waiting = rows
        .waiting_with_hash(&task.hash)
        .or_else(|| st.heap.find_hash(&task.hash));
    if let Some(other) = waiting {
        if task.planned {
            // The same work waits already: planning it again changes nothing, not even its
            // priority (which a client may have set, or a re-score keeps up to date).
            return Err(QueueError::Duplicate { existing: other });
        }
        return boost_or_conflict(st, rows, other, task.priority, now);
    }
    // Pushes are decided before the batch's patches and pops, so the committed state is the
    // one to ask.
    if task.planned
        && let Some(running) = st.in_flight.find(&task.hash)
    {
        return Err(QueueError::InFlight { existing: running });
    }
    let created = st.next_created(now);
    let mut row = TaskRow {
        id: task.id.to_string(),
        scheduler_id: s.as_str().to_owned(),
        // A link's schedule until the write finds the one the hash had (`write::link`).
        schedule_id: task
            .schedule_id
            .map(|s| s.hyphenated().to_string())
            .or_else(|| task.link.as_ref().map(|l| l.id.clone())),
        organisation: task.organisation.clone(),
        task_type: s.as_str().to_owned(),
        hash: Some(task.hash.clone()),
        priority: task.priority,
        data: task.data.clone(),
        status: TaskStatus::Pending,
        attempts: 0,
        lease_expires_at: None,
        failure_reason: None,
        created_at: created,
        modified_at: created,
        plugin_id: task.keys.plugin_id.clone(),
        oci_image: task.keys.oci_image.clone(),
        input_ooi: task.keys.input_ooi.clone(),
        deduplication_key: task.keys.deduplication_key.clone(),
    };
    let placement = place(st, rows, task.id, &row, Admission::New)?;
    row.status = TaskStatus::new_task(placement);
    rows.create(task.id, row);
    if let Some(e) = &task.explanation {
        rows.scores.push((task.id, e.clone()));
    }
    if let Some(link) = &task.link {
        rows.links.push((task.id, link.clone()));
    }
    Ok((task.id, true))
}

/// A push of work that already waits: a strictly better priority moves the waiting task forward;
/// anything else is a 409 naming the waiting task.
fn boost_or_conflict(
    st: &mut QueueState,
    rows: &mut BatchRows,
    id: Uuid,
    priority: i64,
    now: DateTime<Utc>,
) -> Result<(Uuid, bool), QueueError> {
    // A boost reads the row first (`reads`): one without it is a task in the heap or evicted
    // from it in this batch, which only a push that would not run sooner meets.
    let current = match rows.get(&id) {
        Some(row) => row.priority,
        None => st
            .heap
            .rank(&id)
            .map(|r| r.priority)
            .or_else(|| rows.evicted_priority(&id))
            .ok_or_else(|| QueueError::Internal("waiting task not loaded".into()))?,
    };
    if priority >= current {
        return Err(QueueError::Duplicate { existing: id });
    }
    let mut row = rows
        .get(&id)
        .cloned()
        .ok_or_else(|| QueueError::Internal("waiting task not loaded".into()))?;
    row.priority = priority;
    row.modified_at = now.naive_utc();
    match row.status {
        TaskStatus::Queued => {
            st.heap.rerank(&id, priority, row.modified_at);
        }
        TaskStatus::Pending => {
            // Better now: it may belong in the heap.
            st.pending.remove(row.hash.as_deref());
            let p = place(st, rows, id, &row, Admission::Accepted)?;
            row.status = placed_status(row.status, p)?;
        }
        _ => {}
    }
    rows.update(id, row);
    Ok((id, false))
}

/// Whether `task`, a copy given back of the dispatched `existing`, was taken before `existing`
/// was last handed out. When that was is read from its lease (a dispatched task's is never
/// renewed: handed out at its end less the dispatch timeout), not from its `modified_at`, which
/// a client's change of priority moves as well.
fn copy_from_before(st: &QueueState, existing: &TaskRow, task: &NewTask) -> bool {
    let handed_out = chrono::Duration::from_std(st.limits.dispatch_timeout)
        .ok()
        .and_then(|ttl| existing.lease_expires_at?.checked_sub_signed(ttl));
    matches!((task.copy_modified_at, handed_out), (Some(copy), Some(out)) if copy < out)
}

/// A worker gives back a task it was handed (re-push of the full task): it waits again, keeping
/// its id. Should the same work wait already (pushed again while this task was out), this task
/// takes its place ([`rejoin`]).
fn requeue(
    st: &mut QueueState,
    rows: &mut BatchRows,
    task: &NewTask,
    now: DateTime<Utc>,
) -> Result<(Uuid, bool), QueueError> {
    let id = task.id;
    let mut row = rows
        .get(&id)
        .cloned()
        .ok_or_else(|| QueueError::Internal("task not loaded".into()))?;
    // The worker pushes the task as it got it: a priority made more urgent since (it came back
    // once and took over a user's scan of the same work) is kept, not undone by that copy.
    row.priority = row.priority.min(task.priority);
    row.lease_expires_at = None;
    row.modified_at = now.naive_utc();
    rejoin::join(st, rows, id, &mut row, now);
    let p: Placement = place(st, rows, id, &row, Admission::Accepted)?;
    row.status = row.status.enqueue(p).map_err(internal)?;
    rows.update(id, row);
    Ok((id, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::engine::testing::{new_task, now, state};
    use crate::queue::types::WhenFull;

    #[test]
    fn a_task_given_back_keeps_a_priority_made_more_urgent_while_it_was_out() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let (id, mut r) = crate::queue::engine::testing::row(3, 1);
        r.status = TaskStatus::Running;
        let hash = r.hash.clone().unwrap();
        rows.load(vec![r], "boefje");
        // The worker's copy, from its pop, says 6.
        let mut back = new_task("b1", 6);
        back.id = id;
        back.id_given = true;
        back.hash = hash;
        // Running: another runner's now, not given back.
        assert!(matches!(
            push(&mut st, &mut rows, &back, now()),
            Err(QueueError::Conflict(_))
        ));
        assert_eq!(rows.get(&id).unwrap().status, TaskStatus::Running);
        let mut r = rows.get(&id).unwrap().clone();
        r.status = TaskStatus::Dispatched;
        rows.update(id, r);
        push(&mut st, &mut rows, &back, now()).unwrap();
        let row = rows.get(&id).unwrap();
        assert_eq!((row.status, row.priority), (TaskStatus::Queued, 3));
        // A copy more urgent than the task is taken.
        let mut row = row.clone();
        st.heap.remove(&id);
        row.status = TaskStatus::Dispatched;
        rows.update(id, row);
        back.priority = 2;
        push(&mut st, &mut rows, &back, now()).unwrap();
        assert_eq!(rows.get(&id).unwrap().priority, 2);
    }

    #[test]
    fn a_created_task_is_written_with_its_explanation_and_a_refused_one_writes_none() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let mut first = new_task("a", 5);
        first.planned = true;
        first.explanation = Some(r#"{"priority": 5}"#.into());
        push(&mut st, &mut rows, &first, now()).unwrap();
        let mut again = new_task("a", 4);
        again.planned = true;
        again.hash = first.hash.clone();
        again.explanation = Some(r#"{"priority": 4}"#.into());
        assert!(push(&mut st, &mut rows, &again, now()).is_err());
        assert_eq!(
            rows.scores,
            vec![(first.id, r#"{"priority": 5}"#.to_owned())],
            "in the batch that inserts the task, not after it"
        );
    }

    #[test]
    fn a_duplicate_that_would_not_run_sooner_is_refused_without_a_read() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let first = new_task("a", 5);
        push(&mut st, &mut rows, &first, now()).unwrap();
        let mut again = new_task("a", 5);
        again.hash = first.hash.clone();
        // a fresh batch: nothing read
        let mut rows = BatchRows::default();
        assert_eq!(reads(&st, [&again].into_iter()), Reads::default());
        assert!(matches!(
            push(&mut st, &mut rows, &again, now()),
            Err(QueueError::Duplicate { existing }) if existing == first.id
        ));
        // a better one is a boost and needs the row
        again.priority = 1;
        assert_eq!(
            reads(&st, [&again].into_iter()).ids,
            vec![first.id.to_string()]
        );
    }

    #[test]
    fn the_planner_does_not_push_work_whose_previous_task_still_runs_but_a_user_may() {
        let mut st = state(10, WhenFull::Pending);
        let mut rows = BatchRows::default();
        let running = Uuid::new_v4();
        let mut planned = new_task("a", 5);
        st.in_flight
            .record(running, Some(&planned.hash), TaskStatus::Running);
        planned.planned = true;
        assert!(matches!(
            push(&mut st, &mut rows, &planned, now()),
            Err(QueueError::InFlight { existing }) if existing == running
        ));
        let mut user = new_task("a", 1);
        user.hash = planned.hash.clone();
        assert!(push(&mut st, &mut rows, &user, now()).unwrap().1);
        // Finished: the planner may push again (here a duplicate of the user's waiting task).
        st.in_flight
            .record(running, Some(&planned.hash), TaskStatus::Completed);
        assert!(matches!(
            push(&mut st, &mut rows, &planned, now()),
            Err(QueueError::Duplicate { .. })
        ));
    }

    #[test]
    fn work_evicted_earlier_in_the_batch_is_still_met_by_a_push_of_the_same_hash() {
        // Two ways a heap task's row is not read: queued (the table has it queued) and held as
        // a refill read it (pending in the table already).
        for held_as_read in [false, true] {
            let mut st = state(1, WhenFull::Pending);
            let mut rows = BatchRows::default();
            let waiting = new_task("a", 10);
            push(&mut st, &mut rows, &waiting, now()).unwrap();
            if held_as_read {
                st.copies.read([waiting.id], None);
            }
            // A new batch: a better push evicts it, then the same work is pushed again, no
            // sooner. Neither push needs a row read.
            let mut rows = BatchRows::default();
            let better = new_task("b", 1);
            let mut again = new_task("a", 10);
            again.hash = waiting.hash.clone();
            assert_eq!(reads(&st, [&better, &again].into_iter()), Reads::default());
            push(&mut st, &mut rows, &better, now()).unwrap();
            assert!(!st.heap.contains(&waiting.id), "evicted");
            assert!(
                matches!(
                    push(&mut st, &mut rows, &again, now()),
                    Err(QueueError::Duplicate { existing }) if existing == waiting.id
                ),
                "the evicted task still waits (held as read: {held_as_read}): no second task for the same work"
            );
            assert_eq!(st.pending.count(), 1, "one task waits outside the heap");
        }
    }

    #[test]
    fn pushes_into_a_full_heap_need_no_read_while_the_backlog_is_known() {
        let mut st = state(1, WhenFull::Pending);
        let mut rows = BatchRows::default();
        push(&mut st, &mut rows, &new_task("a", 5), now()).unwrap();
        let b = new_task("b", 9);
        assert_eq!(reads(&st, [&b].into_iter()), Reads::default());
        push(&mut st, &mut rows, &b, now()).unwrap();
        assert_eq!(rows.get(&b.id).unwrap().status, TaskStatus::Pending);
        // the same work again may be pending: now the table must be asked
        let mut b2 = new_task("b", 9);
        b2.hash = b.hash.clone();
        assert_eq!(reads(&st, [&b2].into_iter()).hashes, vec![b.hash.clone()]);
        // within the batch it is known already
        assert!(matches!(
            push(&mut st, &mut rows, &b2, now()),
            Err(QueueError::Duplicate { existing }) if existing == b.id
        ));
    }
}
