//! Migrations run up, down and up again on each backend.

use std::time::Duration;

use diesel::RunQueryDsl;
use kat_scheduler::storage::{self, DbTarget};

use crate::helpers::*;

async fn migrations_run_up_down_and_up_again(backend: Backend) {
    let Some(db) = TestDb::create(backend).await else {
        return;
    };
    let uri = db.uri.clone();
    tokio::task::spawn_blocking(move || {
        let target = DbTarget::parse(&uri).unwrap();
        let pool = storage::connect(&target, 2, Duration::from_secs(5)).unwrap();
        let mut conn = storage::checkout(&pool).unwrap();
        let applied = storage::run_migrations(&mut conn).unwrap();
        assert!(!applied.is_empty());
        assert!(storage::pending_migrations(&mut conn).unwrap().is_empty());
        let reverted = storage::revert_all_migrations(&mut conn).unwrap();
        assert_eq!(reverted, applied.len());
        assert_eq!(
            storage::pending_migrations(&mut conn).unwrap().len(),
            applied.len()
        );
        assert_eq!(storage::run_migrations(&mut conn).unwrap(), applied);
        assert!(storage::tasks::queued_keys(&mut conn).unwrap().is_empty());
    })
    .await
    .unwrap();
    drop(db);
}

async fn start_refuses_an_outdated_schema_when_told_not_to_migrate(backend: Backend) {
    let Some(db) = TestDb::create(backend).await else {
        return;
    };
    let mut settings = test_settings(&db.uri);
    settings.database.migrate = false;
    let clock = std::sync::Arc::new(kat_scheduler::clock::ManualClock::new(start_time()));
    let err = kat_scheduler::startup::Application::build(settings, clock)
        .await
        .err()
        .expect("start must fail");
    assert!(err.to_string().contains("schema is out of date"), "{err}");
}

async fn waiting_tasks_written_before_the_deduplication_key_column_are_served_as_groups(
    backend: Backend,
) {
    let Some(db) = TestDb::create(backend).await else {
        return;
    };
    let uri = db.uri.clone();
    let key = uuid::Uuid::new_v4().to_string();
    let ids: Vec<String> = (0..2).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let (k, i) = (key.clone(), ids.clone());
    tokio::task::spawn_blocking(move || {
        let target = DbTarget::parse(&uri).unwrap();
        let pool = storage::connect(&target, 2, Duration::from_secs(5)).unwrap();
        let mut conn = storage::checkout(&pool).unwrap();
        let applied = storage::run_migrations(&mut conn).unwrap();
        // Back to the schema before de-duplication groups (migration 6), and rows as it wrote
        // them.
        let since_6 = applied.len() - applied.iter().position(|m| m.contains("000006")).unwrap();
        storage::revert_last_migrations(&mut conn, since_6).unwrap();
        for (n, id) in i.iter().enumerate() {
            let org = format!("org{n}");
            let data = serde_json::json!({"id": id, "boefje": {"id": "dns"},
                "input_ooi": "Hostname|internet|a.nl", "organization": org, "deduplication_key": k});
            let hash = kat_scheduler::domain::hash::task_hash(&format!(
                "Hostname|internet|a.nl-dns-{org}"
            ));
            diesel::sql_query(format!(
                "INSERT INTO tasks (id, scheduler_id, organisation, type, hash, priority, data, \
                 status, attempts, created_at, modified_at, plugin_id, input_ooi) VALUES \
                 ('{id}', 'boefje', '{org}', 'boefje', '{hash}', 5, '{data}', 'queued', 0, \
                 '2026-11-20 10:00:0{n}', '2026-11-20 10:00:0{n}', 'dns', 'Hostname|internet|a.nl')"
            ))
            .execute(&mut *conn)
            .unwrap();
        }
    })
    .await
    .unwrap();
    // The service upgrades the schema at start and serves the old rows as one group.
    let app = spawn_app_on(db, backend, |_| {}).await;
    assert_eq!(app.pop_ids("boefje", 10).await, ids);
}

/// `(status, priority)` of waiting and dispatched tasks an earlier schema wrote: the pending one
/// that ranks before the queued ones must still come first, and the dispatched one must not come
/// back.
const EARLIER_ROWS: [(&str, i64); 6] = [
    ("queued", 3),
    ("queued", 1),
    ("pending", 0),
    ("queued", 2),
    ("pending", 5),
    ("dispatched", 0),
];

/// Writes [`EARLIER_ROWS`] into `tasks` as boefje tasks of `org1` with these ids (the `n`th
/// created at second `n`), and with `queue` their rows of `task_queue` as migrations 11 to 15
/// kept them (every waiting task).
fn insert_earlier_rows(conn: &mut storage::AnyConnection, ids: &[String], queue: bool) {
    for (n, ((status, priority), id)) in EARLIER_ROWS.iter().zip(ids).enumerate() {
        let data = serde_json::json!({"id": id, "boefje": {"id": "dns"},
            "input_ooi": format!("Hostname|internet|h{n}.nl"), "organization": "org1"});
        let at = format!("2026-11-20 10:00:0{n}");
        diesel::sql_query(format!(
            "INSERT INTO tasks (id, scheduler_id, organisation, type, hash, priority, data, \
             status, attempts, created_at, modified_at, plugin_id, input_ooi) VALUES \
             ('{id}', 'boefje', 'org1', 'boefje', 'h{n}', {priority}, '{data}', '{status}', 0, \
             '{at}', '{at}', 'dns', 'Hostname|internet|h{n}.nl')"
        ))
        .execute(&mut *conn)
        .unwrap();
        if queue && *status != "dispatched" {
            diesel::sql_query(format!(
                "INSERT INTO task_queue (task_id, scheduler_id, status, priority, created_at, \
                 modified_at, hash, organisation, plugin_id, input_ooi) VALUES ('{id}', \
                 'boefje', '{status}', {priority}, '{at}', '{at}', 'h{n}', 'org1', 'dns', \
                 'Hostname|internet|h{n}.nl')"
            ))
            .execute(&mut *conn)
            .unwrap();
        }
    }
}

/// A fresh database at the schema before the migration named `before` (`"000011"`), holding
/// [`EARLIER_ROWS`] as that schema kept them (with `queue`, their `task_queue` rows too); the
/// rows' ids. `None` where the backend is absent.
async fn earlier_database(
    backend: Backend,
    before: &'static str,
    queue: bool,
) -> Option<(TestDb, Vec<String>)> {
    let db = TestDb::create(backend).await?;
    let ids: Vec<String> = EARLIER_ROWS
        .iter()
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let (uri, i) = (db.uri.clone(), ids.clone());
    tokio::task::spawn_blocking(move || {
        let mut conn = open(&uri);
        let applied = storage::run_migrations(&mut conn).unwrap();
        let since = applied.len() - applied.iter().position(|m| m.contains(before)).unwrap();
        storage::revert_last_migrations(&mut conn, since).unwrap();
        insert_earlier_rows(&mut conn, &i, queue);
    })
    .await
    .unwrap();
    Some((db, ids))
}

/// A connection to the database at `uri`.
fn open(uri: &str) -> storage::DbConn {
    let target = DbTarget::parse(uri).unwrap();
    let pool = storage::connect(&target, 2, Duration::from_secs(5)).unwrap();
    storage::checkout(&pool).unwrap()
}

/// Every waiting task of [`EARLIER_ROWS`] is popped once, best first; the dispatched one stays.
async fn assert_earlier_rows_served(app: &TestApp, ids: &[String]) {
    let best_first = [2, 1, 3, 0, 4].map(|k| ids[k].clone()).to_vec();
    assert_eq!(app.pop_ids("boefje", 10).await, best_first);
    assert_eq!(app.task(&ids[5]).await["status"], "dispatched");
    assert!(app.pop_ids("boefje", 10).await.is_empty());
}

async fn tasks_written_before_the_queue_table_are_served_after_the_upgrade(backend: Backend) {
    let Some((db, ids)) = earlier_database(backend, "000011", false).await else {
        return;
    };
    let app = spawn_app_on(db, backend, |_| {}).await;
    assert_earlier_rows_served(&app, &ids).await;

    // The check every test ends with finds a queue row left behind by a task that is not
    // pending (ids[0], popped) and a pending task without its row (ids[5], set back by hand).
    let uri = app.db.uri.clone();
    let (left, bare) = (ids[0].clone(), ids[5].clone());
    let found = tokio::task::spawn_blocking(move || {
        let target = DbTarget::parse(&uri).unwrap();
        let pool = storage::connect(&target, 2, Duration::from_secs(5)).unwrap();
        let mut conn = storage::checkout(&pool).unwrap();
        assert!(
            storage::tasks::queue_mismatches(&mut conn)
                .unwrap()
                .is_empty()
        );
        let mut run = |s: String| {
            diesel::sql_query(s).execute(&mut *conn).unwrap();
        };
        run(format!(
            "INSERT INTO task_queue (task_id, scheduler_id, status, priority, created_at, \
             modified_at, organisation) SELECT id, scheduler_id, 'queued', priority, created_at, \
             modified_at, organisation FROM tasks WHERE id = '{left}'"
        ));
        run(format!(
            "UPDATE tasks SET status = 'pending' WHERE id = '{bare}'"
        ));
        let mut found = storage::tasks::queue_mismatches(&mut conn).unwrap();
        found.sort();
        // Put back what the test broke, so the check at the end of the test passes.
        let mut run = |s: String| {
            diesel::sql_query(s).execute(&mut *conn).unwrap();
        };
        run(format!("DELETE FROM task_queue WHERE task_id = '{left}'"));
        run(format!(
            "UPDATE tasks SET status = 'dispatched' WHERE id = '{bare}'"
        ));
        found
    })
    .await
    .unwrap();
    let mut want = vec![ids[0].clone(), ids[5].clone()];
    want.sort();
    assert_eq!(found, want);
}

/// A database as migration 15 left it: queued tasks with their `task_queue` rows. Migration 16
/// drops those rows; the service then rebuilds its heap from `tasks` and serves every waiting
/// task once, in pop order, and reverting the migration gives the rows back.
async fn queued_rows_of_the_queue_table_are_dropped_and_their_tasks_served(backend: Backend) {
    let Some((db, ids)) = earlier_database(backend, "000016", true).await else {
        return;
    };
    let uri = db.uri.clone();
    let queue_rows = |conn: &mut storage::AnyConnection, status: &str| -> i64 {
        #[derive(diesel::QueryableByName)]
        struct N {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        diesel::sql_query(format!(
            "SELECT COUNT(*) AS n FROM task_queue WHERE status = '{status}'"
        ))
        .load::<N>(conn)
        .unwrap()[0]
            .n
    };
    tokio::task::spawn_blocking(move || {
        let mut conn = open(&uri);
        let applied = storage::run_migrations(&mut conn).unwrap();
        // Migration 16 and those after it.
        let since = applied.len() - applied.iter().position(|m| m.contains("000016")).unwrap();
        assert_eq!(queue_rows(&mut conn, "queued"), 0, "queued rows dropped");
        assert_eq!(queue_rows(&mut conn, "pending"), 2, "pending rows kept");
        assert!(
            storage::tasks::queue_mismatches(&mut conn)
                .unwrap()
                .is_empty()
        );
        // Down and up again: the queued rows come back from `tasks`, and go again.
        storage::revert_last_migrations(&mut conn, since).unwrap();
        assert_eq!(queue_rows(&mut conn, "queued"), 3, "queued rows restored");
        storage::run_migrations(&mut conn).unwrap();
        assert_eq!(queue_rows(&mut conn, "queued"), 0);
    })
    .await
    .unwrap();
    let app = spawn_app_on(db, backend, |_| {}).await;
    assert_earlier_rows_served(&app, &ids).await;
}

/// Waiting tasks an older version wrote without their key-field columns (before migration 4, or
/// during a rolling deploy): queued ones, which only `tasks` holds, and pending ones with their
/// queue rows. After a start the key fields are filled in from the payloads and a runner's
/// image-filtered pop finds every one of them, best first; tasks of another image stay.
async fn waiting_tasks_without_their_key_fields_are_found_by_them_after_a_start(backend: Backend) {
    let Some(db) = TestDb::create(backend).await else {
        return;
    };
    let uri = db.uri.clone();
    // (status, priority, image): the pending task that ranks first must come first.
    let rows = [
        ("queued", 3, "img-a"),
        ("pending", 1, "img-a"),
        ("queued", 2, "img-a"),
        ("pending", 4, "img-a"),
        ("queued", 0, "img-b"),
    ];
    let ids: Vec<String> = rows
        .iter()
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let i = ids.clone();
    tokio::task::spawn_blocking(move || {
        let target = DbTarget::parse(&uri).unwrap();
        let pool = storage::connect(&target, 2, Duration::from_secs(5)).unwrap();
        let mut conn = storage::checkout(&pool).unwrap();
        storage::run_migrations(&mut conn).unwrap();
        for (n, ((status, priority, image), id)) in rows.iter().zip(&i).enumerate() {
            let data = serde_json::json!({"id": id, "boefje": {"id": "dns", "oci_image": image},
                "input_ooi": format!("Hostname|internet|h{n}.nl"), "organization": "org1"});
            let at = format!("2026-11-20 10:00:0{n}");
            diesel::sql_query(format!(
                "INSERT INTO tasks (id, scheduler_id, organisation, type, hash, priority, data, \
                 status, attempts, created_at, modified_at) VALUES ('{id}', 'boefje', 'org1', \
                 'boefje', 'h{n}', {priority}, '{data}', '{status}', 0, '{at}', '{at}')"
            ))
            .execute(&mut *conn)
            .unwrap();
            if *status == "pending" {
                diesel::sql_query(format!(
                    "INSERT INTO task_queue (task_id, scheduler_id, status, priority, created_at, \
                     modified_at, hash, organisation) VALUES ('{id}', 'boefje', 'pending', \
                     {priority}, '{at}', '{at}', 'h{n}', 'org1')"
                ))
                .execute(&mut *conn)
                .unwrap();
            }
        }
    })
    .await
    .unwrap();
    let app = spawn_app_on(db, backend, |_| {}).await;
    let image_a = serde_json::json!({"filters": [{"column": "data", "field": "boefje__oci_image",
        "operator": "in", "value": ["img-a"]}]});
    let popped: Vec<String> = app
        .pop_many("boefje", 10, Some(&image_a))
        .await
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        popped,
        vec![
            ids[1].clone(),
            ids[2].clone(),
            ids[0].clone(),
            ids[3].clone()
        ]
    );
    assert_eq!(app.task(&ids[4]).await["status"], "queued");
    let task = app.task(&ids[0]).await;
    assert_eq!(task["status"], "dispatched");
}

crate::backend_tests!(
    waiting_tasks_without_their_key_fields_are_found_by_them_after_a_start,
    queued_rows_of_the_queue_table_are_dropped_and_their_tasks_served,
    migrations_run_up_down_and_up_again,
    start_refuses_an_outdated_schema_when_told_not_to_migrate,
    waiting_tasks_written_before_the_deduplication_key_column_are_served_as_groups,
    tasks_written_before_the_queue_table_are_served_after_the_upgrade,
);

/// Instances started together on an empty PostgreSQL (`docker compose up --scale scheduler=3`)
/// each migrate at start: one applies the migrations, the others wait and find none pending,
/// rather than racing to create the same tables and failing on "already exists".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_migrating_one_database_together_all_start() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(4));
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let (uri, barrier) = (db.uri.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut conn = open(&uri);
                barrier.wait();
                storage::run_migrations(&mut conn).map(|applied| applied.len())
            })
        })
        .collect();
    let mut applied: Vec<usize> = runs
        .into_iter()
        .map(|r| r.join().unwrap().expect("every instance migrates"))
        .collect();
    applied.sort_unstable();
    let all = applied[3];
    assert!(all > 0);
    assert_eq!(applied, [0, 0, 0, all], "one applied them all");
}
