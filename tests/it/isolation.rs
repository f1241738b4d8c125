//! One bad command fails alone: when a batch fails in the database for a reason other than a
//! lost connection, the engine retries its commands one by one. A trigger that rejects one
//! organisation's inserts stands in for such a failure.

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection, SqliteConnection};
use futures_util::StreamExt;
use reqwest::StatusCode;

use crate::helpers::*;

fn install_poison(backend: Backend, uri: &str) {
    match backend {
        Backend::Postgres => {
            let mut c = PgConnection::establish(uri).unwrap();
            c.batch_execute(
                "CREATE FUNCTION reject_poison() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN IF NEW.organisation = 'poison' THEN RAISE EXCEPTION 'poisoned row'; END IF;
                 RETURN NEW; END $$;
                 CREATE TRIGGER poison BEFORE INSERT ON tasks FOR EACH ROW EXECUTE FUNCTION reject_poison();",
            )
            .unwrap();
        }
        Backend::Sqlite => {
            let path = uri.strip_prefix("sqlite://").unwrap();
            let mut c = SqliteConnection::establish(path).unwrap();
            c.batch_execute(
                "CREATE TRIGGER poison BEFORE INSERT ON tasks WHEN NEW.organisation = 'poison'
                 BEGIN SELECT RAISE(ABORT, 'poisoned row'); END;",
            )
            .unwrap();
        }
    }
}

async fn a_command_the_database_rejects_fails_alone(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    install_poison(backend, &app.db.uri);
    let app = &app;
    let results: Vec<(bool, StatusCode)> = futures_util::stream::iter(0..40usize)
        .map(|i| async move {
            let poison = i % 10 == 5;
            let org = if poison { "poison" } else { "org1" };
            let resp = app
                .push("boefje", &boefje_push(org, &format!("b{i}"), None, 3))
                .await;
            (poison, resp.status())
        })
        .buffer_unordered(40)
        .collect()
        .await;
    for (poison, status) in &results {
        if *poison {
            assert_eq!(*status, StatusCode::INTERNAL_SERVER_ERROR);
        } else {
            assert_eq!(
                *status,
                StatusCode::CREATED,
                "a good push failed with its batch"
            );
        }
    }
    let metrics = app.get("/metrics").await.text().await.unwrap();
    let failed: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("scheduler_engine_failed_batches_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(failed >= 4, "the poisoned batches rolled back ({failed})");
    // The heap matches the table: exactly the good pushes are queued.
    let s: serde_json::Value = app.get("/schedulers/boefje").await.json().await.unwrap();
    assert_eq!(s["qsize"], 36);
    assert_eq!(app.pop_many("boefje", 100, None).await.len(), 36);
}

crate::backend_tests!(a_command_the_database_rejects_fails_alone);
