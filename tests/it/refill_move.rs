//! A refill's move on PostgreSQL (`storage::tasks::refill`): it reads its picks, then moves each
//! to `queued` and deletes its queue row. Between the two, rows may change behind the engine's
//! back (an administrator's SQL, a restore). Whatever changed, the move takes only picks still
//! pending, leaves no queue row for a task it moved, and deletes a queue row it picked for a task
//! no longer pending (else every refill would pick it again, move nothing for it and find the
//! backlog short).

use std::time::Duration;

use diesel::Connection;
use kat_scheduler::domain::{SchedulerId, TaskStatus};
use kat_scheduler::storage::rows::TaskRow;
use kat_scheduler::storage::{self, DbTarget, tasks};

use crate::helpers::row_time as at;
use crate::helpers::*;

/// A pending boefje task of priority `n` (the lower, the sooner) with id `p{n}`.
fn pending(n: i64) -> TaskRow {
    boefje_row(format!("p{n}"), n, TaskStatus::Pending)
}

/// The ids of the tasks that have a queue row, in id order.
fn queue_rows(uri: &str) -> Vec<String> {
    use diesel::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::Text)]
        task_id: String,
    }
    let mut conn = diesel::PgConnection::establish(uri).unwrap();
    diesel::sql_query("SELECT task_id FROM task_queue ORDER BY task_id")
        .load::<Id>(&mut conn)
        .unwrap()
        .into_iter()
        .map(|r| r.task_id)
        .collect()
}

#[tokio::test]
async fn a_refill_moves_only_the_picks_still_pending_and_drops_stale_queue_rows() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let uri = db.uri.clone();
    tokio::task::spawn_blocking(move || {
        let pool =
            storage::connect(&DbTarget::parse(&uri).unwrap(), 2, Duration::from_secs(5)).unwrap();
        let mut conn = storage::checkout(&pool).unwrap();
        storage::run_migrations(&mut conn).unwrap();
        tasks::insert(&mut conn, &(1..=6).map(pending).collect::<Vec<_>>()).unwrap();
        assert_eq!(queue_rows(&uri), ["p1", "p2", "p3", "p4", "p5", "p6"]);

        let mut picked = Vec::new();
        let moved = conn
            .transaction(|c| {
                tasks::refill(c, SchedulerId::Boefje, 4, at(10), &mut |picks| {
                    picked = picks.iter().map(|p| p.id.clone()).collect();
                    // p1's queue row rewritten; p2 cancelled by hand, its queue row left
                    // behind; p3's queue row deleted by hand (the task left pending).
                    behind_its_back(
                        Backend::Postgres,
                        &uri,
                        "UPDATE task_queue SET modified_at = modified_at WHERE task_id = 'p1'; \
                         UPDATE tasks SET status = 'cancelled' WHERE id = 'p2'; \
                         DELETE FROM task_queue WHERE task_id = 'p3'",
                    );
                })
            })
            .unwrap();
        assert_eq!(picked, ["p1", "p2", "p3", "p4"]);
        let mut moved: Vec<&str> = moved.iter().map(|r| r.id.as_str()).collect();
        moved.sort_unstable();
        assert_eq!(moved, ["p1", "p3", "p4"], "the picks still pending");
        for (id, now) in [
            ("p1", TaskStatus::Queued),
            ("p2", TaskStatus::Cancelled),
            ("p3", TaskStatus::Queued),
            ("p4", TaskStatus::Queued),
            ("p5", TaskStatus::Pending),
        ] {
            assert_eq!(row_status(&mut conn, id), now, "{id}");
        }
        // No queue row for a task moved, none left for the cancelled one, the others' untouched.
        assert_eq!(queue_rows(&uri), ["p5", "p6"]);
    })
    .await
    .unwrap();
    drop(db);
}
