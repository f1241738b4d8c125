//! The pending backlog as a pop searches it: the queue rows of the best pending tasks matching
//! the pop's filter, without their payloads.
//!
//! A pop takes a pending task by id (its write moves the task only while the table still holds
//! it pending, and answers with the row it wrote), so what it needs of the backlog is what a
//! queue row holds: the rank, the key fields, the hash. A filter that reads nothing else (every
//! runner's: an organisation, images, plugin ids; a boefje group's de-duplication key) is decided
//! on the queue rows read through the narrowest key field's index of `task_queue` alone
//! ([`tasks::pending_keyed`]), in memory, with the heap's semantics. Joined to `tasks`, the same
//! search took twice as long on the engine's thread, which every other command of the engine
//! waits for (docs/BENCHMARKS.md, "Backlog searches from the queue rows alone"). A filter
//! that reads the payload, or one that has no key field to walk, is searched joined, as before
//! ([`tasks::pending_matching`]).

use std::borrow::Cow;
use std::collections::HashMap;

use chrono::NaiveDateTime;

use crate::domain::SchedulerId;
use crate::domain::filter::eval::{self, Json, Record};
use crate::domain::filter::{Column, FilterNode};
use crate::domain::keys::KeyField;
use crate::storage::rows::HeapRow;
use crate::storage::{AnyConnection, StorageError, tasks};

/// A queue row as the filter evaluator sees it: the heap's columns and key fields, no payload.
pub(crate) struct QueueRowRecord<'a> {
    /// Its scheduler (the `type` and `scheduler_id` columns).
    pub scheduler: SchedulerId,
    /// The row.
    pub row: &'a HeapRow,
    /// Its status as the evaluator should see it: `pending` in the backlog, `queued` for a
    /// refill's pick on its way into the heap.
    pub status: &'static str,
}

impl Record for QueueRowRecord<'_> {
    fn text(&self, column: Column) -> Option<Cow<'_, str>> {
        let r = self.row;
        match column {
            Column::Id => Some(Cow::Borrowed(&r.id)),
            Column::SchedulerId | Column::Type => Some(Cow::Borrowed(self.scheduler.as_str())),
            Column::ScheduleId => r.schedule_id.as_deref().map(Cow::Borrowed),
            Column::Organisation => Some(Cow::Borrowed(&r.organisation)),
            Column::Hash => r.hash.as_deref().map(Cow::Borrowed),
            Column::Status => Some(Cow::Borrowed(self.status)),
            _ => None,
        }
    }

    fn priority(&self) -> i64 {
        self.row.priority
    }

    fn time(&self, column: Column) -> Option<NaiveDateTime> {
        match column {
            Column::CreatedAt => Some(self.row.created_at),
            Column::ModifiedAt => Some(self.row.modified_at),
            _ => None,
        }
    }

    fn json(&self, path: &[String]) -> Json<'_> {
        KeyField::of_data_path(self.scheduler, path)
            .and_then(|f| self.row.key(f))
            .map_or(Json::Missing, Json::Text)
    }
}

/// What a pop searches the backlog for.
#[derive(Clone, Copy)]
pub(crate) struct Search<'a> {
    /// The key field and values to walk the index of, if the filter has one.
    pub lookup: Option<(KeyField, &'a [String])>,
    /// The pop's filter.
    pub filter: &'a FilterNode,
    /// Whether the filter reads payload fields (a queue row cannot decide it).
    pub needs_payload: bool,
    /// How many matches are wanted.
    pub limit: usize,
    /// Tasks already taken by the batch.
    pub skip: &'a [String],
}

/// The best `s.limit` pending tasks of `scheduler` matching the search, in pop order.
pub(crate) fn search(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    s: &Search<'_>,
) -> Result<Vec<HeapRow>, StorageError> {
    if let Some((field, values)) = s.lookup
        && !s.needs_payload
    {
        let want = s.limit.saturating_add(s.skip.len());
        let rows = tasks::pending_keyed(conn, scheduler, field, values, want)?;
        if let Some(found) = decided(scheduler, s.filter, field, values, want, rows) {
            return Ok(bounded(found, s));
        }
    }
    let rows = tasks::pending_matching(conn, scheduler, s.lookup, s.filter, s.limit, s.skip)?;
    Ok(rows.iter().map(HeapRow::from).collect())
}

/// The rows of a key field's ranges (up to `want` each) that match `filter`; `None` when a
/// range was read to its limit and the filter turned some of its rows down, so more matches may
/// lie beyond it (the joined search, which filters in the statement, answers then).
fn decided(
    scheduler: SchedulerId,
    filter: &FilterNode,
    field: KeyField,
    values: &[String],
    want: usize,
    rows: Vec<HeapRow>,
) -> Option<Vec<HeapRow>> {
    let matched: Vec<bool> = rows
        .iter()
        .map(|row| {
            let record = QueueRowRecord {
                scheduler,
                row,
                status: "pending",
            };
            eval::matches(filter, &record)
        })
        .collect();
    // The runners' filters are their lookup: nothing turned down, nothing more to count.
    if matched.iter().all(|&m| m) {
        return Some(rows);
    }
    // Each value's range was read up to `want` rows (one range for them all beyond
    // `LOOKUP_RANGES_MAX` values): a turned-down row's range was read whole only if it came back
    // short.
    let short = if values.len() > tasks::LOOKUP_RANGES_MAX {
        rows.len() < want
    } else {
        let mut read: HashMap<Option<&str>, usize> = HashMap::new();
        for row in &rows {
            *read.entry(row.key(field)).or_default() += 1;
        }
        rows.iter()
            .zip(&matched)
            .filter(|(_, m)| !**m)
            .all(|(r, _)| read.get(&r.key(field)).is_none_or(|&n| n < want))
    };
    short.then(|| {
        rows.into_iter()
            .zip(matched)
            .filter_map(|(r, m)| m.then_some(r))
            .collect()
    })
}

/// The best `s.limit` of `found` (one key field's ranges, one after the other), in pop order,
/// less the batch's skipped tasks.
fn bounded(mut found: Vec<HeapRow>, s: &Search<'_>) -> Vec<HeapRow> {
    found.retain(|r| !s.skip.contains(&r.id));
    found.sort_by(|a, b| (a.priority, a.created_at, &a.id).cmp(&(b.priority, b.created_at, &b.id)));
    found.dedup_by(|a, b| a.id == b.id);
    found.truncate(s.limit);
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::filter::parse_request;
    use crate::queue::engine::testing::{heap_row_of, row_with};
    use serde_json::json;

    fn filter(v: serde_json::Value) -> FilterNode {
        parse_request(&json!({ "filters": v })).unwrap()
    }

    /// Rows of `org1` with images `img0`, `img1`, `img0`, … by priority.
    fn rows(n: usize) -> Vec<HeapRow> {
        (0..n)
            .map(|i| {
                let mut r = row_with(i as i64 + 1, 0, &format!("img{}", i % 2)).1;
                r.organisation = "org1".into();
                heap_row_of(&r)
            })
            .collect()
    }

    #[test]
    fn a_filter_the_lookup_decides_keeps_every_row() {
        let orgs = vec!["org1".to_string()];
        let f = filter(json!([{"column": "organisation", "value": "org1"}]));
        let found = decided(
            SchedulerId::Boefje,
            &f,
            KeyField::Organisation,
            &orgs,
            4,
            rows(4),
        );
        assert_eq!(found.map(|r| r.len()), Some(4));
    }

    #[test]
    fn rows_turned_down_in_a_full_range_send_the_search_to_the_table() {
        let orgs = vec!["org1".to_string()];
        let f = filter(json!([
            {"column": "organisation", "value": "org1"},
            {"column": "data", "field": "boefje__oci_image", "value": "img1"}
        ]));
        // Four read, four wanted, two turned down: more matches may follow in the index.
        assert!(
            decided(
                SchedulerId::Boefje,
                &f,
                KeyField::Organisation,
                &orgs,
                4,
                rows(4)
            )
            .is_none()
        );
        // Three read of five wanted: the range was read whole, its matches are all there.
        let found = decided(
            SchedulerId::Boefje,
            &f,
            KeyField::Organisation,
            &orgs,
            5,
            rows(3),
        )
        .unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].oci_image.as_deref(), Some("img1"));
    }

    #[test]
    fn the_status_a_record_shows_is_the_one_it_is_given() {
        let row = rows(1).remove(0);
        let pending = filter(json!([{"column": "status", "value": "pending"}]));
        let record = |status| QueueRowRecord {
            scheduler: SchedulerId::Boefje,
            row: &row,
            status,
        };
        assert!(eval::matches(&pending, &record("pending")));
        assert!(!eval::matches(&pending, &record("queued")));
    }

    #[test]
    fn the_skipped_rows_are_left_out_best_first() {
        let all = rows(6);
        let skip = vec![all[1].id.clone()];
        let f = FilterNode::And(Vec::new());
        let mut shuffled = all.clone();
        shuffled.reverse();
        let s = Search {
            lookup: None,
            filter: &f,
            needs_payload: false,
            limit: 3,
            skip: &skip,
        };
        let got: Vec<String> = bounded(shuffled, &s).into_iter().map(|r| r.id).collect();
        assert_eq!(
            got,
            vec![all[0].id.clone(), all[2].id.clone(), all[3].id.clone()]
        );
    }
}
