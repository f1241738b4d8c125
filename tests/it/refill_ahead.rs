//! The refill ahead on PostgreSQL runs on a connection and thread of its own, beside the engine:
//! pops the heap serves and patches of tasks in flight are answered while it runs, and what it
//! moves is taken in before anything that may meet a pending row, so every task is still handed
//! out once, in pop order. A row lock held by another session keeps the refill waiting for as long
//! as the test needs it to be under way.

use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection, RunQueryDsl};
use kat_scheduler::domain::SchedulerId;
use kat_scheduler::queue::PushRequest;
use kat_scheduler::storage::rows::CountRow;
use serde_json::{Value, json};

use crate::helpers::*;

/// The heap's bound: its refill ahead moves a tenth of it, enough to run beside the engine.
const MAXSIZE: usize = 1_000;
const PENDING: usize = 500;
/// How long an answer that does not wait for the refill may take at most on a loaded machine.
const ANSWER: Duration = Duration::from_secs(20);

/// The one task of a normalizer no other task has.
const RARE_AT: i64 = 1_200;

/// A normalizer push of priority `p`: the lower, the sooner.
fn request(p: i64) -> PushRequest {
    let normalizer = match p {
        RARE_AT => "rare",
        _ => "kat_dns_normalize",
    };
    let Value::Object(data) = normalizer_push("org1", normalizer, p)["data"].clone() else {
        unreachable!("normalizer_push has a data object")
    };
    PushRequest {
        organisation: "org1".into(),
        priority: Some(p),
        data,
        ..Default::default()
    }
}

/// Whether a refill statement of this database waits for a row lock.
fn refill_waits(conn: &mut PgConnection) -> bool {
    diesel::sql_query(
        "SELECT COUNT(*) AS count FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND query LIKE 'WITH best AS MATERIALIZED%'",
    )
    .get_result::<CountRow>(conn)
    .unwrap()
    .count
        > 0
}

/// Pops until the answer is empty, as many as a pop may take at a time.
async fn drain(app: &TestApp) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let got = app.pop_ok("normalizer", MAXSIZE, None).await;
        if got.is_empty() {
            return out;
        }
        out.extend(got);
    }
}

fn priorities(tasks: &[Value]) -> Vec<i64> {
    tasks
        .iter()
        .map(|t| t["priority"].as_i64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pops_from_the_heap_and_patches_go_on_while_a_refill_ahead_runs() {
    let Some(app) = spawn_app_with(Backend::Postgres, |s| s.queue.maxsize = MAXSIZE).await else {
        return;
    };
    let total = (MAXSIZE + PENDING) as i64;
    let pushed = app
        .broker
        .push_many(SchedulerId::Normalizer, (1..=total).map(request).collect())
        .await
        .unwrap();
    assert!(pushed.iter().all(|r| r.as_ref().is_ok_and(|o| o.created)));
    let s: Value = app
        .get("/schedulers/normalizer")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (s["qsize"].as_u64(), s["pending"].as_u64()),
        (Some(MAXSIZE as u64), Some(PENDING as u64)),
        "{s}"
    );

    // Another session holds the best pending task's row: a refill that moves it waits.
    let mut blocker = hold(&app.db.uri, MAXSIZE as i64 + 1);
    // Room for a tenth of the heap: the refill ahead starts after the batch that made it.
    let first = app.pop_many("normalizer", MAXSIZE / 10, None).await;
    assert_eq!(priorities(&first), (1..=100).collect::<Vec<_>>());
    let mut watch = PgConnection::establish(&app.db.uri).unwrap();
    refill_under_way(&mut watch).await;

    // While it waits: the heap's next tasks are handed out, and a task in flight is finished.
    let more = tokio::time::timeout(ANSWER, app.pop_many("normalizer", 50, None))
        .await
        .expect("a pop the heap serves does not wait for the refill");
    assert_eq!(priorities(&more), (101..=150).collect::<Vec<_>>());
    let done = tokio::time::timeout(
        ANSWER,
        app.patch_task(&id_of(&first[0]), &json!({"status": "completed"})),
    )
    .await
    .expect("a patch of a task in flight does not wait for the refill");
    assert!(done.status().is_success());
    assert!(
        refill_waits(&mut watch),
        "the refill was under way all along"
    );

    // Once the lock goes, the refill lands, and everything comes out once, in pop order.
    blocker.batch_execute("ROLLBACK").unwrap();
    let rest = drain(&app).await;
    assert_eq!(priorities(&rest), (151..=total).collect::<Vec<_>>());
    let s: Value = app
        .get("/schedulers/normalizer")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (s["qsize"].as_u64(), s["pending"].as_u64()),
        (Some(0), Some(0)),
        "{s}"
    );
}

/// Holds the row of the waiting normalizer task of priority `p` in a transaction of another
/// session: a refill that moves it waits until the session ends its transaction.
fn hold(uri: &str, p: i64) -> PgConnection {
    let mut blocker = PgConnection::establish(uri).unwrap();
    blocker
        .batch_execute(&format!(
            "BEGIN; SELECT id FROM tasks WHERE scheduler_id = 'normalizer' AND priority = {p} \
             AND status = 'pending' FOR UPDATE"
        ))
        .unwrap();
    blocker
}

/// Waits until a refill statement waits for a row lock.
async fn refill_under_way(watch: &mut PgConnection) {
    let deadline = Instant::now() + ANSWER;
    while !refill_waits(watch) {
        assert!(Instant::now() < deadline, "no refill started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Asserts that `task` is not answered within a moment (it waits for the refill under way), which
/// also lets its request reach the engine.
async fn waits<T>(task: &mut tokio::task::JoinHandle<T>, what: &str) {
    assert!(
        tokio::time::timeout(Duration::from_millis(300), task)
            .await
            .is_err(),
        "{what} answered before the refill it waits for ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_and_a_pop_of_pending_work_wait_for_a_refill_under_way_and_nothing_is_lost() {
    let Some(app) = spawn_app_with(Backend::Postgres, |s| s.queue.maxsize = MAXSIZE).await else {
        return;
    };
    let total = (MAXSIZE + PENDING) as i64;
    app.broker
        .push_many(SchedulerId::Normalizer, (1..=total).map(request).collect())
        .await
        .unwrap();
    let app = std::sync::Arc::new(app);
    let mut watch = PgConnection::establish(&app.db.uri).unwrap();

    // A push, while a refill waits: it may merge into a pending task or place one, so it waits
    // for the refill, and then goes into the full heap before everything (1,100 moves out).
    let mut blocker = hold(&app.db.uri, 1001);
    let first = app.pop_many("normalizer", MAXSIZE / 10, None).await;
    assert_eq!(priorities(&first), (1..=100).collect::<Vec<_>>());
    refill_under_way(&mut watch).await;
    let mut push = {
        let app = app.clone();
        tokio::spawn(async move {
            app.push_ok("normalizer", &normalizer_push("org2", "urgent", -1))
                .await
        })
    };
    waits(&mut push, "the push").await;
    blocker.batch_execute("ROLLBACK").unwrap();
    let pushed = push.await.unwrap();
    assert_eq!(pushed["status"], "queued", "{pushed}");

    // A pop whose filter only a pending task matches, while the next refill waits: it would
    // search the backlog the refill is moving, so it waits, and then finds its task.
    let mut blocker = hold(&app.db.uri, 1100);
    let second = app.pop_many("normalizer", MAXSIZE / 10, None).await;
    assert_eq!(
        priorities(&second),
        std::iter::once(-1).chain(101..=199).collect::<Vec<_>>()
    );
    refill_under_way(&mut watch).await;
    let filter = json!({"filters": [{"column": "data", "field": "normalizer__id",
        "operator": "in", "value": ["rare"]}]});
    let mut pop = {
        let app = app.clone();
        tokio::spawn(async move { app.pop_ok("normalizer", 1, Some(&filter)).await })
    };
    waits(&mut pop, "the pop").await;
    blocker.batch_execute("ROLLBACK").unwrap();
    let popped = pop.await.unwrap();
    assert_eq!(
        priorities(&popped),
        vec![RARE_AT],
        "the pending task, not an empty answer"
    );

    // Everything else comes out once, in pop order.
    let rest = drain(&app).await;
    let expected: Vec<i64> = (200..=total).filter(|p| *p != RARE_AT).collect();
    assert_eq!(priorities(&rest), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refill_whose_connection_is_cut_leaves_no_task_lost_or_handed_out_twice() {
    let Some(app) = spawn_app_with(Backend::Postgres, |s| s.queue.maxsize = MAXSIZE).await else {
        return;
    };
    let total = (MAXSIZE + PENDING) as i64;
    app.broker
        .push_many(SchedulerId::Normalizer, (1..=total).map(request).collect())
        .await
        .unwrap();
    let mut blocker = hold(&app.db.uri, MAXSIZE as i64 + 1);
    let first = app.pop_many("normalizer", MAXSIZE / 10, None).await;
    assert_eq!(priorities(&first), (1..=100).collect::<Vec<_>>());
    let mut watch = PgConnection::establish(&app.db.uri).unwrap();
    refill_under_way(&mut watch).await;
    // An administrator (or a failover) ends the refill's session while it waits.
    let cut = diesel::sql_query(
        "SELECT COUNT(pg_terminate_backend(pid)) AS count FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock' \
         AND query LIKE 'WITH best AS MATERIALIZED%'",
    )
    .get_result::<CountRow>(&mut watch)
    .unwrap()
    .count;
    assert_eq!(cut, 1, "the refill's session");
    blocker.batch_execute("ROLLBACK").unwrap();
    // The engine rebuilds its heap from the table: every task left comes out once, in pop order.
    let rest = drain(&app).await;
    assert_eq!(priorities(&rest), (101..=total).collect::<Vec<_>>());
    let s: Value = app
        .get("/schedulers/normalizer")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (s["qsize"].as_u64(), s["pending"].as_u64()),
        (Some(0), Some(0)),
        "{s}"
    );
}
