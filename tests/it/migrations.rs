//! Migrations run up, down and up again on each backend.

use std::time::Duration;

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

crate::backend_tests!(
    migrations_run_up_down_and_up_again,
    start_refuses_an_outdated_schema_when_told_not_to_migrate,
);
