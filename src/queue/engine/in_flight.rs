//! Tasks handed out and not yet finished, kept in memory so that the calls a worker makes about
//! them cost no read: which scheduler a task belongs to (shared with the API side, so a `PATCH`
//! reaches its engine without a query), and, per engine, the task's row (so the patch itself
//! needs none). Both only ever hold what the table holds: a task's scheduler never changes, and
//! an engine, the only writer of its scheduler's rows, records each row as committed.

use std::collections::HashMap;
use std::sync::Mutex;

use uuid::Uuid;

use crate::domain::{SchedulerId, TaskStatus};
use crate::storage::rows::TaskRow;

/// Tasks in flight per engine at most; beyond, new ones are not remembered (their calls read
/// the table, as after a restart).
pub const IN_FLIGHT_MAX: usize = 100_000;

fn in_flight(status: TaskStatus) -> bool {
    matches!(status, TaskStatus::Dispatched | TaskStatus::Running)
}

/// Task id → scheduler, for tasks in flight.
#[derive(Debug, Default)]
pub(crate) struct Routes(Mutex<HashMap<Uuid, SchedulerId>>);

impl Routes {
    /// The scheduler of a task in flight, if known.
    pub fn get(&self, id: &Uuid) -> Option<SchedulerId> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(id)
            .copied()
    }
}

/// One engine's rows of its tasks in flight.
#[derive(Default)]
pub(crate) struct InFlight {
    rows: HashMap<Uuid, TaskRow>,
}

impl InFlight {
    /// Takes the ids it knows out of `ids` and returns their rows.
    pub fn take_known(&self, ids: &mut Vec<String>) -> Vec<TaskRow> {
        let mut known = Vec::new();
        ids.retain(
            |id| match Uuid::parse_str(id).ok().and_then(|u| self.rows.get(&u)) {
                Some(row) => {
                    known.push(row.clone());
                    false
                }
                None => true,
            },
        );
        known
    }

    /// Whether it holds this task (handed out and not finished, as committed).
    pub fn knows(&self, id: &Uuid) -> bool {
        self.rows.contains_key(id)
    }

    /// Records the committed state of the rows a batch touched.
    pub fn record<'a>(
        &mut self,
        rows: impl Iterator<Item = (&'a Uuid, &'a TaskRow)>,
        routes: &Routes,
        scheduler: SchedulerId,
    ) {
        let mut shared = routes
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (id, row) in rows {
            if row.scheduler_id != scheduler.as_str() {
                continue;
            }
            if in_flight(row.status) {
                if self.rows.len() < IN_FLIGHT_MAX || self.rows.contains_key(id) {
                    self.rows.insert(*id, row.clone());
                    shared.insert(*id, scheduler);
                }
            } else {
                self.rows.remove(id);
                shared.remove(id);
            }
        }
    }

    /// Forgets every row (after a failed batch, a rebuild or a lost ownership, the table is read
    /// again), and their routes: tasks no longer known here would otherwise keep their route
    /// for good (they finish under another instance, or with a read of the table).
    pub fn clear(&mut self, routes: &Routes) {
        let mut shared = routes
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for id in self.rows.keys() {
            shared.remove(id);
        }
        self.rows.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::engine::testing::row;

    #[test]
    fn rows_in_flight_are_known_until_they_finish() {
        let routes = Routes::default();
        let mut cache = InFlight::default();
        let (id, mut r) = row(5, 1);
        r.status = TaskStatus::Dispatched;
        cache.record([(&id, &r)].into_iter(), &routes, SchedulerId::Boefje);
        assert_eq!(routes.get(&id), Some(SchedulerId::Boefje));
        let mut ids = vec![id.to_string(), Uuid::new_v4().to_string()];
        assert_eq!(cache.take_known(&mut ids).len(), 1);
        assert_eq!(ids.len(), 1, "the unknown id is still to be read");
        r.status = TaskStatus::Completed;
        cache.record([(&id, &r)].into_iter(), &routes, SchedulerId::Boefje);
        assert_eq!(routes.get(&id), None);
        let mut ids = vec![id.to_string()];
        assert!(cache.take_known(&mut ids).is_empty());
    }

    #[test]
    fn rows_forgotten_take_their_routes_with_them() {
        let routes = Routes::default();
        let mut cache = InFlight::default();
        let (id, mut r) = row(5, 1);
        r.status = TaskStatus::Running;
        cache.record([(&id, &r)].into_iter(), &routes, SchedulerId::Boefje);
        // Another engine's task keeps its route.
        let (other, mut o) = row(6, 1);
        o.status = TaskStatus::Dispatched;
        o.scheduler_id = SchedulerId::Normalizer.as_str().into();
        let mut theirs = InFlight::default();
        theirs.record([(&other, &o)].into_iter(), &routes, SchedulerId::Normalizer);
        // Ownership lost, or a rebuild: the task may finish elsewhere, never seen here again.
        cache.clear(&routes);
        assert_eq!(routes.get(&id), None);
        assert_eq!(routes.get(&other), Some(SchedulerId::Normalizer));
        assert!(!cache.knows(&id));
    }
}
