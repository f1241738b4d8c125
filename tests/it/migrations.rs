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
    assert_eq!(app.pop_ids("boefje", 1).await, ids);
}

crate::backend_tests!(
    migrations_run_up_down_and_up_again,
    start_refuses_an_outdated_schema_when_told_not_to_migrate,
    waiting_tasks_written_before_the_deduplication_key_column_are_served_as_groups,
);
