//! Helpers for the rules' unit tests: states, rows and a stand-in for the table's reads.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};
use uuid::Uuid;

use super::pop::Reads;
use super::state::QueueState;
use crate::domain::filter::FilterNode;
use crate::domain::filter::eval;
use crate::domain::keys::{DataKeys, KeyField};
use crate::domain::{SchedulerId, TaskStatus};
use crate::queue::push::NewTask;
use crate::queue::types::{SchedulerLimits, WhenFull};
use crate::storage::StorageError;
use crate::storage::rows::{HeapRow, TaskRow};

pub fn now() -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default()
}

fn at(secs: i64) -> NaiveDateTime {
    DateTime::from_timestamp(1_700_000_000 + secs, 0)
        .unwrap_or_default()
        .naive_utc()
}

pub fn limits(maxsize: usize, when_full: WhenFull) -> SchedulerLimits {
    SchedulerLimits {
        maxsize,
        when_full,
        dispatch_timeout: Duration::from_secs(60),
        run_timeout: Duration::from_secs(600),
        unrenewed_run_timeout: Duration::from_secs(3600),
        max_attempts: 3,
        fairness: crate::queue::fair::Fairness::Off,
        weights: Default::default(),
        politeness: Vec::new(),
    }
}

pub fn state(maxsize: usize, when_full: WhenFull) -> QueueState {
    QueueState::new(SchedulerId::Boefje, limits(maxsize, when_full))
}

/// A queued boefje row of image `img`.
pub fn row_with(priority: i64, created_secs: i64, image: &str) -> (Uuid, TaskRow) {
    let id = Uuid::new_v4();
    let row = TaskRow {
        id: id.to_string(),
        scheduler_id: "boefje".into(),
        schedule_id: None,
        organisation: "org1".into(),
        task_type: "boefje".into(),
        hash: Some(format!("{:032x}", id.as_u128())),
        priority,
        data: format!(r#"{{"boefje": {{"id": "b1", "oci_image": "{image}"}}}}"#),
        status: TaskStatus::Queued,
        attempts: 0,
        lease_expires_at: None,
        failure_reason: None,
        created_at: at(created_secs),
        modified_at: at(created_secs),
        plugin_id: Some("b1".into()),
        oci_image: Some(image.into()),
        input_ooi: None,
        deduplication_key: None,
    };
    (id, row)
}

pub fn row(priority: i64, created_secs: i64) -> (Uuid, TaskRow) {
    row_with(priority, created_secs, "img")
}

pub fn heap_row(priority: i64) -> HeapRow {
    heap_row_of(&row(priority, priority).1)
}

/// A new push of plugin `plugin` (its hash derived from it).
pub fn new_task(plugin: &str, priority: i64) -> NewTask {
    NewTask {
        id: Uuid::new_v4(),
        planned: false,
        once: false,
        schedule_id: None,
        id_given: false,
        organisation: "org1".into(),
        priority,
        hash: crate::domain::hash::task_hash(plugin),
        data: format!(r#"{{"boefje": {{"id": "{plugin}"}}}}"#),
        keys: DataKeys {
            plugin_id: Some(plugin.into()),
            ..DataKeys::default()
        },
        explanation: None,
        link: None,
        copy_modified_at: None,
    }
}

/// The table as a pop sees it: pending rows and payloads, and a refill ahead under way that
/// moves some of the pending rows; counts the reads.
#[derive(Default)]
pub struct FakeTable {
    pub pending: Vec<TaskRow>,
    pub payloads: HashMap<Uuid, String>,
    pub reads: usize,
    /// The ids of the pending rows a refill under way moves to `queued`, once waited for.
    pub refilling: Option<Vec<String>>,
    /// How many times a pop waited for the refill.
    pub waited: usize,
}

/// A task row as a heap holds it.
pub fn heap_row_of(r: &TaskRow) -> HeapRow {
    HeapRow::from(r)
}

impl Reads for FakeTable {
    fn pending_matching(
        &mut self,
        lookup: Option<(KeyField, &[String])>,
        filter: &FilterNode,
        limit: usize,
        skip: &[String],
    ) -> Result<Vec<TaskRow>, StorageError> {
        self.reads += 1;
        let mut out: Vec<TaskRow> = self
            .pending
            .iter()
            .filter(|r| !skip.contains(&r.id))
            .filter(|r| match lookup {
                Some((KeyField::OciImage, values)) => {
                    r.oci_image.as_ref().is_some_and(|v| values.contains(v))
                }
                _ => true,
            })
            .filter(|r| {
                super::pop::RowRecord::new(r).is_some_and(|rec| eval::matches(filter, &rec))
            })
            .cloned()
            .collect();
        out.sort_by_key(|r| (r.priority, r.created_at));
        out.truncate(limit);
        Ok(out)
    }

    fn pending_to_pop(
        &mut self,
        s: &super::backlog::Search<'_>,
    ) -> Result<Vec<HeapRow>, StorageError> {
        let rows = self.pending_matching(s.lookup, s.filter, s.limit, s.skip)?;
        Ok(rows.iter().map(HeapRow::from).collect())
    }

    fn payloads(&mut self, ids: &[Uuid]) -> Result<HashMap<Uuid, String>, StorageError> {
        self.reads += 1;
        Ok(ids
            .iter()
            .filter_map(|id| self.payloads.get(id).map(|d| (*id, d.clone())))
            .collect())
    }

    fn settle_refill(&mut self, st: &mut QueueState) -> Result<bool, StorageError> {
        let Some(ids) = self.refilling.take() else {
            return Ok(false);
        };
        self.waited += 1;
        let (moved, kept): (Vec<TaskRow>, Vec<TaskRow>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|r| ids.contains(&r.id));
        self.pending = kept;
        let n = super::refill::refilled(st, moved.iter().map(heap_row_of).collect(), ids.len())
            .map_err(|e| StorageError::Corrupt(e.to_string()))?;
        Ok(n > 0)
    }
}
