//! The engines' `ANALYZE task_queue` after bulk changes (`storage::analyse`) on PostgreSQL: from
//! a small sample (statistics target 10, a tenth of the cost of the server's default), and the
//! pooled connection it ran on keeps its settings. On a server without autovacuum it is a
//! `VACUUM (ANALYZE)`, so the rows pops and refills delete are reclaimed.

use std::time::Duration;

use diesel::RunQueryDsl;
use diesel::connection::SimpleConnection;
use kat_scheduler::storage::rows::CountRow;
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
