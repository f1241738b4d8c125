//! The engines' `ANALYZE task_queue` after bulk changes (`storage::analyse`) on PostgreSQL: from
//! a small sample (statistics target 10, a tenth of the cost of the server's default), and the
//! pooled connection it ran on keeps its settings. On a server without autovacuum it is a
//! `VACUUM (ANALYZE)`, so the rows pops and refills delete are reclaimed.

use std::time::Duration;

use diesel::RunQueryDsl;
use diesel::connection::SimpleConnection;
use kat_scheduler::storage::rows::CountRow;
use kat_scheduler::storage::sql::Sql;
use kat_scheduler::storage::{self, ANALYSE_SAMPLE_TARGET, AnyConnection, DbTarget};

use crate::helpers::*;

fn number(conn: &mut AnyConnection, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<CountRow>(conn)
        .unwrap()
        .count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_table_is_analysed_from_a_small_sample_and_the_connection_keeps_its_settings() {
    let Some(app) = spawn_app(Backend::Postgres).await else {
        return;
    };
    let uri = app.db.uri.clone();
    tokio::task::spawn_blocking(move || {
        let pool =
            storage::connect(&DbTarget::parse(&uri).unwrap(), 1, Duration::from_secs(5)).unwrap();
        let mut conn = storage::checkout(&pool).unwrap();
        // 2,000 waiting rows, each of its own priority (1,000 left below).
        conn.batch_execute(
            "INSERT INTO task_queue (task_id, scheduler_id, status, priority, created_at, \
             modified_at, organisation) SELECT md5(i::text), 'boefje', 'pending', i, \
             now()::timestamp, now()::timestamp, 'org' || (i % 7) FROM generate_series(1, 2000) i",
        )
        .unwrap();
        let setting = "SELECT current_setting('default_statistics_target')::bigint AS count";
        let before = number(&mut conn, setting);
        assert!(
            before > i64::from(ANALYSE_SAMPLE_TARGET),
            "the server's target: {before}"
        );
        // Half of them gone, as pops and refills delete queue rows.
        conn.batch_execute("DELETE FROM task_queue WHERE priority % 2 = 0")
            .unwrap();
        let autovacuum = number(
            &mut conn,
            "SELECT (current_setting('autovacuum') = 'on')::int::bigint AS count",
        ) == 1;
        let upkept = storage::analyse(&mut conn).unwrap();
        assert_eq!(
            number(&mut conn, setting),
            before,
            "the connection's setting"
        );
        if autovacuum {
            assert_eq!(upkept, storage::Upkept::Analysed);
        } else {
            // Nothing else would reclaim the deleted rows.
            assert_eq!(upkept, storage::Upkept::Vacuumed);
            let vacuumed = number(
                &mut conn,
                "SELECT count(*) AS count FROM pg_stat_user_tables \
                 WHERE relname = 'task_queue' AND last_vacuum IS NOT NULL",
            );
            assert_eq!(vacuumed, 1, "task_queue vacuumed");
        }
        // A histogram has as many buckets as the target: 11 bounds, not the server's 101.
        let bounds = number(
            &mut conn,
            "SELECT COALESCE(array_length(histogram_bounds, 1), 0)::bigint AS count \
             FROM pg_stats WHERE tablename = 'task_queue' AND attname = 'priority'",
        );
        assert_eq!(bounds, i64::from(ANALYSE_SAMPLE_TARGET) + 1);
        let organisations = number(
            &mut conn,
            "SELECT n_distinct::bigint AS count FROM pg_stats \
             WHERE tablename = 'task_queue' AND attname = 'organisation'",
        );
        assert_eq!(organisations, 7, "what the plans read is there");
        // The rows stood in for waiting tasks; no task has them.
        conn.batch_execute("DELETE FROM task_queue").unwrap();
    })
    .await
    .unwrap();
}

/// The webapp's task list, as `storage::listing` writes it: one scheduler's tasks, newest first,
/// a page of ten, the values bound.
fn task_list() -> Sql {
    let mut q = Sql::new(
        storage::Backend::Postgres,
        "SELECT id, data FROM tasks WHERE 1 = 1",
    );
    q.push(" AND scheduler_id = ")
        .bind("boefje")
        .push(" AND type = ")
        .bind("boefje")
        .push(" ORDER BY created_at DESC, id DESC LIMIT ")
        .bind(10_i64)
        .push(" OFFSET ")
        .bind(0_i64);
    q
}

/// Loads `n` boefje tasks behind the service's back (as an import or a restore does), numbered
/// from `from`, and has the server's cumulative statistics count them at once.
fn load(conn: &mut AnyConnection, from: i64, n: i64) {
    conn.batch_execute(&format!(
        "INSERT INTO tasks (id, scheduler_id, organisation, type, hash, priority, data, status, \
             created_at, modified_at) \
         SELECT 't' || i, 'boefje', 'org' || (i % 50), 'boefje', 'h' || i, i, repeat('x', 300), \
             'completed', now()::timestamp - i * interval '1 second', now()::timestamp \
         FROM generate_series({from}, {last}) AS i; \
         SELECT pg_stat_force_next_flush()",
        last = from + n - 1
    ))
    .unwrap();
}

/// A database loaded behind the service's back and never analysed (an import from mula, a
/// restore; a server with `autovacuum = off`, or any before its next round): the service
/// analyses the tables the API lists from at its start, so the webapp's task list walks
/// `ix_tasks_created_at` from its end instead of scanning and sorting the whole history; it
/// analyses them again once a tenth of them has changed, and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_the_api_lists_from_are_analysed_at_start_and_after_bulk_changes() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let uri = db.uri.clone();
    let pool = tokio::task::spawn_blocking(move || {
        // Autovacuum, where the server runs it, must not analyse before the service does.
        let (pool, mut conn) = never_analysed(&uri, 1, &["tasks", "schedules"]);
        load(&mut conn, 0, 20_000);
        let before = plan_of(&mut conn, task_list());
        assert!(
            !before.contains("ix_tasks_created_at"),
            "never analysed, the list is planned from default estimates:\n{before}"
        );
        drop(conn);
        pool
    })
    .await
    .unwrap();

    let app = spawn_app_on(db, Backend::Postgres, |_| {}).await;
    tokio::task::spawn_blocking(move || {
        let mut conn = storage::checkout(&pool).unwrap();
        assert_eq!(
            number(
                &mut conn,
                "SELECT count(*) AS count FROM pg_stat_user_tables \
                 WHERE relname = 'tasks' AND last_analyze IS NOT NULL"
            ),
            1,
            "analysed at the start"
        );
        let after = plan_of(&mut conn, task_list());
        assert!(
            after.contains("Index Scan Backward using ix_tasks_created_at on tasks")
                && !after.contains("Seq Scan"),
            "the list walks the creation index from its end:\n{after}"
        );
        // `schedules` is empty: nothing to analyse.
        assert_eq!(
            storage::statistics::refresh(&mut conn).unwrap(),
            Vec::<&str>::new()
        );
        // A tenth of 20,000 and 50 is 2,050 changes: 2,000 more are not yet stale, 100 more are.
        load(&mut conn, 20_000, 2_000);
        assert_eq!(
            storage::statistics::refresh(&mut conn).unwrap(),
            Vec::<&str>::new()
        );
        load(&mut conn, 22_000, 100);
        assert_eq!(
            storage::statistics::refresh(&mut conn).unwrap(),
            vec!["tasks"]
        );
        assert_eq!(
            storage::statistics::refresh(&mut conn).unwrap(),
            Vec::<&str>::new(),
            "fresh again"
        );
    })
    .await
    .unwrap();
    drop(app);
}
