//! Pushes written as sets: one engine batch's new tasks go to `tasks`, `task_queue` and
//! `task_scores` in set statements within one transaction, with the semantics of one push at a
//! time: the same work is stored once (within the batch and against waiting work), a batch larger
//! than SQLite's parameter limit is written whole, and a batch that fails writes nothing, not even
//! the schedules its pushes carry (mula's `post_push`, written in the same transaction).

use diesel::RunQueryDsl;
use diesel::connection::SimpleConnection;
use serde_json::{Value, json};

use crate::helpers::*;
use kat_scheduler::domain::SchedulerId;
use kat_scheduler::queue::{PushRequest, QueueError};
use kat_scheduler::storage::rows::CountRow;

fn request(org: &str, boefje: &str, ooi: &str, priority: i64) -> PushRequest {
    let Value::Object(data) = boefje_data(org, boefje, Some(ooi)) else {
        unreachable!("boefje_data is an object")
    };
    PushRequest {
        organisation: org.into(),
        priority: Some(priority),
        data,
        ..Default::default()
    }
}

/// Runs `sql` on the app's database, on a connection of its own.
async fn exec(app: &TestApp, sql: &'static str) {
    let uri = app.db.uri.clone();
    tokio::task::spawn_blocking(move || {
        let target = kat_scheduler::storage::DbTarget::parse(&uri).unwrap();
        let pool =
            kat_scheduler::storage::connect(&target, 1, std::time::Duration::from_secs(5)).unwrap();
        let mut conn = kat_scheduler::storage::checkout(&pool).unwrap();
        conn.batch_execute(sql).unwrap();
    })
    .await
    .unwrap();
}

/// `SELECT COUNT(*) AS count …` on the app's database.
async fn count(app: &TestApp, sql: &'static str) -> i64 {
    let uri = app.db.uri.clone();
    tokio::task::spawn_blocking(move || {
        let target = kat_scheduler::storage::DbTarget::parse(&uri).unwrap();
        let pool =
            kat_scheduler::storage::connect(&target, 1, std::time::Duration::from_secs(5)).unwrap();
        let mut conn = kat_scheduler::storage::checkout(&pool).unwrap();
        diesel::sql_query(sql)
            .get_result::<CountRow>(&mut *conn)
            .unwrap()
            .count
    })
    .await
    .unwrap()
}

async fn a_batch_stores_each_piece_of_work_once_within_it_and_against_waiting_work(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let waiting = app
        .broker
        .push(SchedulerId::Boefje, request("o", "a", "Hostname|a", 5))
        .await
        .unwrap();
    assert!(waiting.created);
    let a = waiting.task.id;
    let answers = app
        .broker
        .push_many(
            SchedulerId::Boefje,
            vec![
                request("o", "b", "Hostname|b", 5),
                // the same work as the one before, in the same batch
                request("o", "b", "Hostname|b", 5),
                // the same work as a waiting task, not more urgent
                request("o", "a", "Hostname|a", 5),
                request("o", "c", "Hostname|c", 5),
                // more urgent than the waiting task: a boost of it
                request("o", "a", "Hostname|a", 2),
                // the same work as one created earlier in this batch, less urgent
                request("o", "c", "Hostname|c", 7),
            ],
        )
        .await
        .unwrap();
    assert_eq!(answers.len(), 6);
    let created = |k: usize| match &answers[k] {
        Ok(o) => (o.task.id, o.created, o.task.priority),
        Err(e) => panic!("answer {k}: {e}"),
    };
    let duplicate_of = |k: usize| match &answers[k] {
        Err(QueueError::Duplicate { existing }) => *existing,
        other => panic!("answer {k}: not a duplicate: {other:?}"),
    };
    let (b, b_new, _) = created(0);
    let (c, c_new, _) = created(3);
    assert!(b_new && c_new, "new work is created");
    assert_eq!(
        duplicate_of(1),
        b,
        "a duplicate within the batch names the first"
    );
    assert_eq!(duplicate_of(2), a, "a duplicate of waiting work names it");
    assert_eq!(
        created(4),
        (a, false, 2),
        "the boost moves the waiting task"
    );
    assert_eq!(duplicate_of(5), c);

    // Stored once each, in the table as in the heap; the boosted task first.
    assert_eq!(
        count(&app, "SELECT COUNT(*) AS count FROM tasks").await,
        3,
        "one row per piece of work"
    );
    assert_eq!(
        count(
            &app,
            "SELECT COUNT(*) AS count FROM tasks WHERE status = 'queued'"
        )
        .await,
        3
    );
    assert_eq!(
        count(&app, "SELECT COUNT(*) AS count FROM task_queue").await,
        0,
        "tasks in the heap have no queue row"
    );
    let popped = app.pop_ids("boefje", 10).await;
    assert_eq!(popped.len(), 3);
    assert_eq!(popped[0], a.to_string(), "the boosted task first");
}

/// A batch whose first push evicts a waiting task from a full heap, and whose next push is the
/// same work as that task, no more urgent: the second is a duplicate of the evicted task (which
/// waits on, as pending), not a second task for the same work. Neither push needs a row read,
/// so the batch knows the evicted task only from its own eviction.
async fn work_evicted_by_an_earlier_push_of_the_batch_is_still_stored_once(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = 2).await else {
        return;
    };
    let mut waiting = Vec::new();
    for (ooi, priority) in [("Hostname|a", 10), ("Hostname|b", 20)] {
        let o = app
            .broker
            .push(SchedulerId::Boefje, request("o", "x", ooi, priority))
            .await
            .unwrap();
        waiting.push(o.task.id);
    }
    let answers = app
        .broker
        .push_many(
            SchedulerId::Boefje,
            vec![
                // better than the heap's worst (b): b moves out to pending
                request("o", "x", "Hostname|urgent", 1),
                // b's work again, no sooner
                request("o", "x", "Hostname|b", 20),
            ],
        )
        .await
        .unwrap();
    assert!(matches!(&answers[0], Ok(o) if o.created));
    assert!(
        matches!(&answers[1], Err(QueueError::Duplicate { existing }) if *existing == waiting[1]),
        "a duplicate of the evicted task: {:?}",
        answers[1]
    );
    assert_eq!(
        count(
            &app,
            "SELECT COUNT(*) AS count FROM tasks WHERE data LIKE '%Hostname|b%'"
        )
        .await,
        1,
        "one task for b's work"
    );
    assert_eq!(app.task(&waiting[1].to_string()).await["status"], "pending");
    let popped = app.pop_ids("boefje", 10).await;
    assert_eq!(popped.len(), 3, "three pieces of work wait: {popped:?}");
    assert_eq!(popped[2], waiting[1].to_string(), "b last");
}

async fn a_batch_over_the_sqlite_parameter_limit_is_written_whole(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // 2,000 rows of 18 columns are 36,000 values: more than SQLite binds in one statement
    // (32,766), so the batch spans several set statements in its one transaction.
    const N: usize = 2_000;
    let requests: Vec<PushRequest> = (0..N)
        .map(|i| {
            let mut r = request("o", &format!("b{}", i % 7), &format!("Hostname|h{i}"), 5);
            r.explanation = Some(json!({"strategy": "test", "n": i}).to_string());
            r
        })
        .collect();
    let answers = app
        .broker
        .push_many(SchedulerId::Boefje, requests)
        .await
        .unwrap();
    assert_eq!(answers.len(), N);
    assert!(
        answers.iter().all(|a| a.as_ref().is_ok_and(|o| o.created)),
        "every task created"
    );
    for (table, sql) in [
        ("tasks", "SELECT COUNT(*) AS count FROM tasks"),
        ("task_scores", "SELECT COUNT(*) AS count FROM task_scores"),
    ] {
        assert_eq!(count(&app, sql).await, N as i64, "rows of {table}");
    }
    assert_eq!(
        count(&app, "SELECT COUNT(*) AS count FROM task_queue").await,
        count(
            &app,
            "SELECT COUNT(*) AS count FROM tasks WHERE status = 'pending'"
        )
        .await,
        "a queue row for each pending task"
    );
    let mut popped = app.pop_ids("boefje", 1_000).await;
    popped.extend(app.pop_ids("boefje", 1_000).await);
    popped.sort();
    popped.dedup();
    assert_eq!(popped.len(), N, "each task popped once");
}

async fn a_failed_batch_leaves_nothing_half_written(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // The last of the three tables a push writes refuses one explanation.
    exec(
        &app,
        match backend {
            Backend::Postgres => {
                "CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN IF NEW.explanation LIKE '%boom%' THEN RAISE EXCEPTION 'boom'; END IF; \
                 RETURN NEW; END $$; \
                 CREATE TRIGGER refuse_boom BEFORE INSERT ON task_scores FOR EACH ROW \
                 EXECUTE FUNCTION refuse_boom();"
            }
            Backend::Sqlite => {
                "CREATE TRIGGER refuse_boom BEFORE INSERT ON task_scores \
                 WHEN NEW.explanation LIKE '%boom%' BEGIN SELECT RAISE(ABORT, 'boom'); END;"
            }
        },
    )
    .await;
    let explained = |boefje: &str, e: &str| {
        let mut r = request("o", boefje, &format!("Hostname|{boefje}"), 5);
        r.explanation = Some(json!({ "why": e }).to_string());
        // The schedule of its hash, as a client's push carries it.
        let now = chrono::Utc::now().naive_utc();
        r.link = Some(kat_scheduler::storage::schedules::ScheduleRow {
            id: uuid::Uuid::new_v4().to_string(),
            scheduler_id: "boefje".into(),
            organisation: "o".into(),
            hash: Some(
                kat_scheduler::domain::payload::hash_for(SchedulerId::Boefje, &r.data).unwrap(),
            ),
            data: Value::Object(r.data.clone()).to_string(),
            enabled: true,
            schedule: None,
            deadline_at: Some(now),
            created_at: now,
            modified_at: now,
            disabled_reason: None,
        });
        r
    };
    let batch = vec![
        explained("a", "fine"),
        explained("b", "boom"),
        explained("c", "fine"),
    ];
    let failed = match app.broker.push_many(SchedulerId::Boefje, batch).await {
        Err(_) => true,
        Ok(answers) => answers.iter().all(Result::is_err),
    };
    assert!(failed, "the batch failed in the database");
    for sql in [
        "SELECT COUNT(*) AS count FROM tasks",
        "SELECT COUNT(*) AS count FROM task_queue",
        "SELECT COUNT(*) AS count FROM task_scores",
        "SELECT COUNT(*) AS count FROM schedules",
    ] {
        assert_eq!(count(&app, sql).await, 0, "{sql}: nothing half written");
    }
    // Nothing of it is left in memory either: the same work is new again, and a pop finds only
    // what is stored.
    assert!(app.pop_ids("boefje", 10).await.is_empty());
    let again = app
        .broker
        .push(SchedulerId::Boefje, explained("a", "fine"))
        .await
        .unwrap();
    assert!(again.created, "the work of the failed batch was not stored");
    assert_eq!(
        app.pop_ids("boefje", 10).await,
        vec![again.task.id.to_string()]
    );
    assert_eq!(
        count(&app, "SELECT COUNT(*) AS count FROM schedules").await,
        1,
        "the task and its schedule are written together"
    );
    assert_eq!(
        count(
            &app,
            "SELECT COUNT(*) AS count FROM tasks t JOIN schedules s ON s.id = t.schedule_id"
        )
        .await,
        1,
        "the task names its schedule"
    );
    assert!(again.task.schedule_id.is_some());
}

crate::backend_tests!(
    a_batch_stores_each_piece_of_work_once_within_it_and_against_waiting_work,
    a_batch_over_the_sqlite_parameter_limit_is_written_whole,
    a_failed_batch_leaves_nothing_half_written,
    work_evicted_by_an_earlier_push_of_the_batch_is_still_stored_once,
);
