//! A piece of work's history as the planner and the cron read it: the last finished run of a
//! hash is its newest finished task (mula's `get_latest_task_by_hash`), whatever waits after it
//! and however many runs came before.

use diesel::connection::SimpleConnection;
use kat_scheduler::storage::{self, tasks};

use crate::helpers::*;

/// A task row of the boefje scheduler, created `day` days into the year and changed `hours`
/// later.
fn row(id: &str, hash: &str, status: &str, day: u32, hours: u32) -> String {
    let created = chrono::NaiveDate::from_ymd_opt(2026, 1, 1)
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap()
        + chrono::Duration::days(day.into());
    let modified = created + chrono::Duration::hours(hours.into());
    format!(
        "('{id}', 'boefje', 'org', 'boefje', '{hash}', 1, '{{}}', '{status}', '{}', '{}')",
        created.format("%Y-%m-%d %H:%M:%S"),
        modified.format("%Y-%m-%d %H:%M:%S"),
    )
}

async fn the_last_run_of_a_hash_is_its_newest_finished_task(backend: Backend) {
    let Some(db) = TestDb::create(backend).await else {
        return;
    };
    let uri = db.uri.clone();
    tokio::task::spawn_blocking(move || {
        let target = storage::DbTarget::parse(&uri).unwrap();
        let pool = storage::connect(&target, 1, std::time::Duration::from_secs(5)).unwrap();
        let mut conn = storage::checkout(&pool).unwrap();
        storage::run_migrations(&mut conn).unwrap();
        // daily: 300 completed daily runs, then a failed one, then a run waiting and one
        // cancelled (neither finished). late: an old run that finished after a newer one did.
        // waiting: nothing finished yet.
        let mut rows: Vec<String> = (0..300)
            .map(|d| row(&format!("daily-{d}"), "daily", "completed", d, 1))
            .collect();
        rows.push(row("daily-failed", "daily", "failed", 300, 2));
        rows.push(row("daily-queued", "daily", "queued", 301, 0));
        rows.push(row("daily-cancelled", "daily", "cancelled", 302, 0));
        rows.push(row("late-old", "late", "completed", 0, 24 * 200));
        rows.push(row("late-new", "late", "completed", 10, 1));
        rows.push(row("waiting-1", "waiting", "pending", 5, 0));
        conn.batch_execute(&format!(
            "INSERT INTO tasks (id, scheduler_id, organisation, type, hash, priority, data, \
                 status, created_at, modified_at) VALUES {}",
            rows.join(", ")
        ))
        .unwrap();

        let hashes: Vec<String> = ["daily", "late", "waiting", "unknown"]
            .map(String::from)
            .to_vec();
        let runs = tasks::last_runs(&mut conn, &hashes).unwrap();
        let at = |day: i64, hours: i64| {
            chrono::NaiveDate::from_ymd_opt(2026, 1, 1)
                .unwrap()
                .and_hms_opt(0, 0, 0)
                .unwrap()
                + chrono::Duration::days(day)
                + chrono::Duration::hours(hours)
        };
        assert_eq!(runs.get("daily"), Some(&(at(300, 2), true)), "{runs:?}");
        // The newest created, as mula reads it, not the one that finished last.
        assert_eq!(runs.get("late"), Some(&(at(10, 1), false)), "{runs:?}");
        assert_eq!(runs.len(), 2, "only finished runs answer: {runs:?}");
    })
    .await
    .unwrap();
    drop(db);
}

crate::backend_tests!(the_last_run_of_a_hash_is_its_newest_finished_task);
