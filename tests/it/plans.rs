//! The plans PostgreSQL gives a queue engine's statements on its own connection, on `tasks` and
//! `task_queue` loaded in bulk and never analysed (a server between an import, a ColdStart or a
//! restore and its next analyse; any server with `autovacuum = off`), and once analysed: the
//! statement's shape, not the tables' statistics, decides which index it walks.

use diesel::connection::SimpleConnection;
use kat_scheduler::domain::keys::KeyField;
use kat_scheduler::domain::{SchedulerId, TaskStatus};
use kat_scheduler::storage::rows::{PopKey, TaskRow};
use kat_scheduler::storage::tasks::fenced::{self, FencedWrite};
use kat_scheduler::storage::{self, WriterConn, tasks};

use crate::helpers::*;

/// Tasks the bulk load writes: one in two boefje tasks, the others the normalizer's; of each
/// scheduler's, a third pending, a third queued, a third completed.
const LOADED: usize = 60_000;

/// Whether `plan` walks the index `scan` names (`Index Scan using … on …`), with no sort, no
/// sequential scan and no JIT compilation.
fn walks(plan: &str, scan: &str) -> bool {
    plan.contains(scan)
        && !plan.contains("Sort")
        && !plan.contains("Seq Scan")
        && !plan.contains("JIT")
}

#[tokio::test]
async fn an_engines_statements_walk_their_index_whatever_the_tables_statistics() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let uri = db.uri.clone();
    tokio::task::spawn_blocking(move || {
        let (pool, mut conn) = never_analysed(&uri, 2, &["tasks", "task_queue"]);
        // Task i has hash h{i mod LOADED/3}: each hash has a task of each status for one
        // scheduler (a waiting one and its past runs, as a rescheduled piece of work has).
        conn.batch_execute(&format!(
            "INSERT INTO tasks (id, scheduler_id, organisation, type, hash, priority, data, \
                 status, created_at, modified_at) \
             SELECT 't' || i, CASE WHEN i % 2 = 0 THEN 'boefje' ELSE 'normalizer' END, \
                 'org' || (i % 50), 'boefje', 'h' || (i % {third}), i, repeat('x', 300), \
                 CASE (i / {third}) WHEN 0 THEN 'pending' WHEN 1 THEN 'queued' \
                     ELSE 'completed' END, \
                 now(), now() \
             FROM generate_series(0, {last}) AS i",
            third = LOADED / 3,
            last = LOADED - 1,
        ))
        .unwrap();
        // The pending tasks' queue rows, as the engines write them: an image of ten, a plugin of
        // thirty, the organisation, its own object, and for one in a hundred a de-duplication
        // group of seven.
        conn.batch_execute(
            "INSERT INTO task_queue (task_id, scheduler_id, status, priority, created_at, \
                 modified_at, hash, organisation, plugin_id, oci_image, input_ooi, \
                 deduplication_key) \
             SELECT id, scheduler_id, status, priority, created_at, modified_at, hash, \
                 organisation, 'b' || (priority % 30), 'img' || (priority % 10), \
                 'Hostname|internet|' || id, \
                 CASE WHEN priority % 100 = 0 THEN 'group-' || (priority % 7) END \
             FROM tasks WHERE status = 'pending'",
        )
        .unwrap();
        drop(conn);

        // A push batch's hashes: ten, of which h2, h4 and h6 are boefje work (even i) and h1
        // the normalizer's; the others no task has.
        let hashes: Vec<String> = ["h1", "h2", "h4", "h6", "x1", "x2", "x3", "x4", "x5", "x6"]
            .map(String::from)
            .to_vec();
        let mut engine = WriterConn::checkout_engine(&pool, false).unwrap();
        for state in ["never analysed", "analysed"] {
            if state == "analysed" {
                engine.batch_execute("ANALYZE tasks; ANALYZE task_queue").unwrap();
            }
            let plan = plan_of(
                &mut engine,
                tasks::waiting_by_hash_statement(SchedulerId::Boefje, &hashes).unwrap(),
            );
            assert!(
                walks(&plan, "Index Scan using ix_tasks_hash_created on tasks"),
                "{state}: the lookup by hash does not walk ix_tasks_hash_created:\n{plan}"
            );
            // The last finished run of each hash: a walk of its tasks from the newest back, not
            // a fetch of every past run nor a sort of them.
            let plan = plan_of(
                &mut engine,
                tasks::last_runs_statement(storage::Backend::Postgres, &hashes).unwrap(),
            );
            assert!(
                walks(&plan, "Index Scan Backward using ix_tasks_hash_created on tasks")
                    && plan.contains("Limit"),
                "{state}: the last runs are not one short walk per hash:\n{plan}"
            );

            // The refill's read: a walk of the pending rows in pop order, from the backlog's head,
            // from after the last row read and from a task that became pending (included), never
            // a sort of every pending row.
            let last = PopKey {
                priority: 900,
                created_at: chrono::Utc::now().naive_utc(),
                id: "t900".into(),
            };
            for from in [
                tasks::Keyset::First,
                tasks::Keyset::After(&last),
                tasks::Keyset::From(&last),
            ] {
                let plan = plan_of(
                    &mut engine,
                    tasks::refill_picks_statement(
                        storage::Backend::Postgres,
                        SchedulerId::Boefje,
                        from,
                        1_000,
                    ),
                );
                assert!(
                    walks(
                        &plan,
                        "Index Scan using ix_task_queue_pending_rank on task_queue"
                    ),
                    "{state}, {from:?}: the refill does not walk the pending rows in pop order:\n{plan}"
                );
            }
            // A filtered pop's search of the backlog: a walk of its key field's index.
            for (field, value, index) in [
                (KeyField::Organisation, "org4", "ix_task_queue_pending_organisation"),
                (KeyField::OciImage, "img3", "ix_task_queue_pending_oci_image"),
                (KeyField::PluginId, "b7", "ix_task_queue_pending_plugin_id"),
                (
                    KeyField::InputOoi,
                    "Hostname|internet|t4",
                    "ix_task_queue_pending_input_ooi",
                ),
                (
                    KeyField::DedupKey,
                    "group-1",
                    "ix_task_queue_pending_deduplication_key",
                ),
            ] {
                let plan = plan_of(
                    &mut engine,
                    tasks::pending_keyed_statement(
                        storage::Backend::Postgres,
                        SchedulerId::Boefje,
                        field,
                        &[value.to_owned()],
                        65,
                    ),
                );
                assert!(
                    walks(&plan, &format!("Index Scan using {index} on task_queue")),
                    "{state}: the search by {field:?} does not walk {index}:\n{plan}"
                );
            }
            // A reference longer than that index holds (migration 20): the pop order, filtered,
            // not a sort of every pending row.
            let plan = plan_of(
                &mut engine,
                tasks::pending_keyed_statement(
                    storage::Backend::Postgres,
                    SchedulerId::Boefje,
                    KeyField::InputOoi,
                    &["u".repeat(tasks::INDEXED_REFERENCE_CHARS + 1)],
                    65,
                ),
            );
            assert!(
                walks(
                    &plan,
                    "Index Scan using ix_task_queue_pending_rank on task_queue"
                ) && !plan.contains("Sort"),
                "{state}: the search by a long reference does not walk the pop order:\n{plan}"
            );

            // A batch's one statement: PATCHes of ten tasks read (written whole, their queue
            // rows in step), pops of ten heap tasks and of ten backlog tasks, by id. Each part
            // is joined to `tasks` by its primary key, never a scan or a hash join over it.
            let at = chrono::Utc::now().naive_utc();
            let ids = |from: usize| -> Vec<String> {
                (0..10).map(|i| format!("t{}", from + 2 * i)).collect()
            };
            let updates: Vec<TaskRow> = tasks::get_many(&mut engine, &ids(0))
                .unwrap()
                .into_iter()
                .map(|mut r| {
                    r.status = TaskStatus::Queued;
                    r.modified_at = at;
                    r
                })
                .collect();
            assert_eq!(updates.len(), 10);
            let (dispatched, taken) = (ids(LOADED / 3), ids(100));
            let batch = FencedWrite {
                scheduler: SchedulerId::Boefje,
                instance: "me",
                epoch: 1,
                updates: &updates,
                dispatched: &dispatched,
                taken_pending: &taken,
                pending_rows: true,
                at,
                lease: Some(at),
            };
            let plan = plan_of(&mut engine, fenced::statement(&batch).unwrap());
            assert!(
                plan.contains("Index Scan using tasks_pkey on tasks")
                    && !plan.contains("Seq Scan on tasks")
                    && !plan.contains("Seq Scan on task_queue")
                    && !plan.contains("Hash Join")
                    && !plan.contains("Merge Join")
                    && !plan.contains("JIT"),
                "{state}: a batch's statement does not reach its rows by primary key:\n{plan}"
            );

            // What it answers: the waiting tasks of the boefje scheduler with those hashes (the
            // pending and the queued one of each), not their completed runs nor the
            // normalizer's.
            let mut found: Vec<(String, String, TaskStatus)> =
                tasks::waiting_by_hash(&mut engine, SchedulerId::Boefje, &hashes)
                    .unwrap()
                    .into_iter()
                    .map(|t| (t.hash.unwrap_or_default(), t.id, t.status))
                    .collect();
            found.sort_by(|a, b| a.1.cmp(&b.1));
            let third = LOADED / 3;
            let mut expected: Vec<(String, String, TaskStatus)> = [2, 4, 6]
                .into_iter()
                .flat_map(|h| {
                    [
                        (format!("h{h}"), format!("t{h}"), TaskStatus::Pending),
                        (
                            format!("h{h}"),
                            format!("t{}", h + third),
                            TaskStatus::Queued,
                        ),
                    ]
                })
                .collect();
            expected.sort_by(|a, b| a.1.cmp(&b.1));
            assert_eq!(found, expected, "{state}");
        }
    })
    .await
    .unwrap();
    drop(db);
}

/// The cron's due schedules are read a page at a time, each page starting in `ix_schedules_due`
/// where the last ended and only among its own scheduler's rows: with many due schedules
/// waiting (an Octopoes outage), page k of the OR-spelt keyset read the k pages before it, and
/// the report table's tick read every due boefje schedule. Analysed, a page walks the index in
/// order; never analysed (the service analyses `schedules` at start and after bulk creates),
/// the planner still starts in the index at the page's start, then sorts what follows.
#[tokio::test]
async fn a_page_of_due_schedules_starts_where_the_last_ended_whatever_the_statistics() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let uri = db.uri.clone();
    tokio::task::spawn_blocking(move || {
        let (_pool, mut conn) = never_analysed(&uri, 2, &["schedules"]);
        conn.batch_execute(
            "INSERT INTO schedules (id, scheduler_id, organisation, hash, data, enabled, \
                 deadline_at, created_at, modified_at) \
             SELECT 's' || i, CASE WHEN i % 1000 = 0 THEN 'report' ELSE 'boefje' END, 'org', \
                 'h' || i, '{}', TRUE, timestamp '2027-01-01' + (i % 600) * interval '1 second', \
                 now(), now() \
             FROM generate_series(0, 29999) AS i",
        )
        .unwrap();
        let now = chrono::NaiveDate::from_ymd_opt(2027, 2, 1)
            .unwrap()
            .and_hms_opt(0, 0, 0)
            .unwrap();
        let middle = chrono::NaiveDate::from_ymd_opt(2027, 1, 1)
            .unwrap()
            .and_hms_opt(0, 5, 0)
            .unwrap();
        for state in ["never analysed", "analysed"] {
            if state == "analysed" {
                conn.batch_execute("ANALYZE schedules").unwrap();
            }
            for (scheduler, after) in [
                (SchedulerId::Boefje, None),
                (SchedulerId::Boefje, Some((middle, "s15000".to_owned()))),
                (SchedulerId::Report, Some((middle, "s15000".to_owned()))),
            ] {
                let plan = plan_of(
                    &mut conn,
                    storage::schedules::due_statement(
                        storage::Backend::Postgres,
                        scheduler,
                        now,
                        after.clone(),
                        1_000,
                    ),
                );
                let cond = plan
                    .lines()
                    .find(|l| l.contains("Index Cond"))
                    .unwrap_or_default();
                let in_order = state == "never analysed"
                    || walks(&plan, "Index Scan using ix_schedules_due on schedules");
                assert!(
                    in_order
                        && plan.contains("ix_schedules_due")
                        && !plan.contains("Seq Scan")
                        && cond.contains("scheduler_id")
                        && (after.is_none() || cond.contains("ROW(deadline_at, id) >")),
                    "{state}, {scheduler} after {after:?}: the page does not start in the index:\n{plan}"
                );
            }
        }
    })
    .await
    .unwrap();
}

/// The listener's parked events, 100,000 of them loaded and never analysed (a long outage of
/// one organisation's Katalogus): the listener's read of a batch's objects walks the index by
/// object, and the claim's read of the events due walks the index of due rows, whatever the
/// statistics, in the plan made with the values and in the generic plan a prepared statement
/// may switch to. Measured before the statements were shaped so (`--parked`): 1.8 s and 145 ms
/// at 100,000 parked events, a join over the whole table.
#[tokio::test]
async fn the_parked_events_reads_walk_their_index_whatever_the_tables_statistics() {
    use kat_scheduler::storage::Backend as Dialect;
    use kat_scheduler::storage::parked;
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let uri = db.uri.clone();
    tokio::task::spawn_blocking(move || {
        let (_pool, mut conn) = never_analysed(&uri, 1, &["listener_parked"]);
        conn.batch_execute(
            "INSERT INTO listener_parked (id, source, seq, organisation, object_key, body, \
                 reason, attempts, parked_at, next_try_at) \
             SELECT 'p' || i, 'mutations', i, 'org' || (i % 50), 'k' || i, repeat('x', 200), \
                 'the plugin catalogue is unavailable', 0, now(), now() + interval '1 hour' \
             FROM generate_series(0, 99999) AS i",
        )
        .unwrap();
        let keys: Vec<String> = (0..100).map(|i| format!("k{}", i * 7)).collect();
        let now = chrono::Utc::now().naive_utc();
        for state in ["never analysed", "analysed"] {
            if state == "analysed" {
                conn.batch_execute("ANALYZE listener_parked").unwrap();
            }
            let plan = plan_of(
                &mut conn,
                parked::objects_statement(Dialect::Postgres, &keys),
            );
            assert!(
                plan.contains("ix_listener_parked_object")
                    && !plan.contains("Seq Scan")
                    && !plan.contains("Join"),
                "{state}: {plan}"
            );
            let plan = plan_of(
                &mut conn,
                parked::due_statement(Dialect::Postgres, "mutations", now, None, 200),
            );
            assert!(
                walks(&plan, "Index Scan using ix_listener_parked_due"),
                "{state}: {plan}"
            );
        }
    })
    .await
    .unwrap();
}
