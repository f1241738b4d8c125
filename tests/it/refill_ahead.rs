//! The refill ahead on PostgreSQL reads on a connection and thread of its own, beside the engine:
//! pops the heap serves and patches of tasks in flight are answered while it runs, and what it
//! reads is taken in before anything that may meet a pending row, so every task is still handed
//! out once, in pop order; a pop whose match the heap lacks waits set aside while the engine
//! serves the others. A lock on the queue table held by another session keeps the refill's read
//! waiting for as long as the test needs it to be under way.

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
const TOTAL: i64 = (MAXSIZE + PENDING) as i64;
/// How long an answer that does not wait for the refill may take at most on a loaded machine.
const ANSWER: Duration = Duration::from_secs(20);
/// The one task of a normalizer no other task has: pending, after the second refill's picks.
const RARE_AT: i64 = 1_200;
/// The one task of another such normalizer: among the second refill's picks.
const PICKED_AT: i64 = 1_150;

/// A normalizer push of priority `p`: the lower, the sooner.
fn request(p: i64) -> PushRequest {
    let normalizer = match p {
        RARE_AT => "rare",
        PICKED_AT => "picked",
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

/// The app on PostgreSQL with normalizer tasks of priorities 1 to [`TOTAL`]: the heap full with
/// the best [`MAXSIZE`], the rest pending. `None` when PostgreSQL is absent (outside CI).
async fn full_heap() -> Option<TestApp> {
    heap_of(MAXSIZE, TOTAL).await
}

/// The app on PostgreSQL with a heap of `maxsize` and normalizer tasks of priorities 1 to
/// `total`: the heap full with the best, the rest pending.
async fn heap_of(maxsize: usize, total: i64) -> Option<TestApp> {
    let app = spawn_app_with(Backend::Postgres, |s| s.queue.maxsize = maxsize).await?;
    let pushed = app
        .broker
        .push_many(SchedulerId::Normalizer, (1..=total).map(request).collect())
        .await
        .unwrap();
    assert!(pushed.iter().all(|r| r.as_ref().is_ok_and(|o| o.created)));
    let pending = total as u64 - maxsize as u64;
    assert_eq!(sizes(&app).await, (maxsize as u64, pending));
    Some(app)
}

/// The normalizer heap's size and pending count, as `/schedulers/normalizer` shows them.
async fn sizes(app: &TestApp) -> (u64, u64) {
    let s: Value = app
        .get("/schedulers/normalizer")
        .await
        .json()
        .await
        .unwrap();
    (s["qsize"].as_u64().unwrap(), s["pending"].as_u64().unwrap())
}

/// A refill's read, from the backlog's head or on after what the heap holds as read (the text
/// of `storage::tasks::refill_picks`).
const REFILL_READ: &str = "(query LIKE '%FROM task_queue WHERE status = ''pending'' \
     AND scheduler_id = $1 ORDER BY%' OR query LIKE '%FROM task_queue WHERE status = ''pending'' \
     AND scheduler_id = $1 AND (priority, created_at, task_id) >%')";

/// Whether a refill's read of this database waits for a lock.
fn refill_waits(conn: &mut PgConnection) -> bool {
    diesel::sql_query(format!(
        "SELECT COUNT(*) AS count FROM pg_stat_activity WHERE datname = current_database() \
         AND wait_event_type = 'Lock' AND {REFILL_READ}"
    ))
    .get_result::<CountRow>(conn)
    .unwrap()
    .count
        > 0
}

/// A refill held under way: another session locks the queue table, a tenth of the heap is
/// popped (answers `popped`, in order; the heap's tasks were pushed into it, so their pops do
/// not touch the queue table), and the refill that starts after that batch waits for the lock
/// before it has read anything. Answers the holding session (its `ROLLBACK` lets the refill go
/// on) and a session to watch from.
async fn refill_held(app: &TestApp, popped: &[i64]) -> (PgConnection, PgConnection) {
    let mut blocker = PgConnection::establish(&app.db.uri).unwrap();
    blocker
        .batch_execute("BEGIN; LOCK TABLE task_queue IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let got = app.pop_many("normalizer", popped.len(), None).await;
    assert_eq!(priorities(&got), popped);
    let mut watch = PgConnection::establish(&app.db.uri).unwrap();
    let deadline = Instant::now() + ANSWER;
    while !refill_waits(&mut watch) {
        assert!(Instant::now() < deadline, "no refill started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (blocker, watch)
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

/// Pops until the answer is empty, as many as a pop may take at a time.
/// Has the server end the session of the refill waiting for the lock (as an administrator or a
/// failover would); answers how many it ended.
fn cut_waiting_refill(watch: &mut PgConnection) -> i64 {
    diesel::sql_query(format!(
        "SELECT COUNT(pg_terminate_backend(pid)) AS count FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock' AND {REFILL_READ}"
    ))
    .get_result::<CountRow>(watch)
    .unwrap()
    .count
}

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

fn range(from: i64, to: i64) -> Vec<i64> {
    (from..=to).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pops_from_the_heap_and_patches_go_on_while_a_refill_ahead_runs() {
    let Some(app) = full_heap().await else {
        return;
    };
    let (mut blocker, mut watch) = refill_held(&app, &range(1, 100)).await;

    // While it waits: the heap's next tasks are handed out, and a task in flight is finished.
    let more = tokio::time::timeout(ANSWER, app.pop_many("normalizer", 50, None))
        .await
        .expect("a pop the heap serves does not wait for the refill");
    assert_eq!(priorities(&more), range(101, 150));
    let done = tokio::time::timeout(
        ANSWER,
        app.patch_task(&id_of(&more[0]), &json!({"status": "completed"})),
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
    assert_eq!(priorities(&drain(&app).await), range(151, TOTAL));
    assert_eq!(sizes(&app).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_and_a_pop_of_pending_work_wait_for_a_refill_under_way_and_nothing_is_lost() {
    let Some(app) = full_heap().await else {
        return;
    };
    let app = std::sync::Arc::new(app);

    // A push, while a refill waits: it may merge into a pending task or place one, so it waits
    // for the refill, and then goes into the full heap before everything (1,100 moves out).
    let (mut blocker, _) = refill_held(&app, &range(1, 100)).await;
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

    // The next refill waits before it has read its picks (the best 100 pending tasks, 1,100 to
    // 1,199, the task the push evicted first).
    let popped: Vec<i64> = std::iter::once(-1).chain(101..=199).collect();
    let (mut blocker, mut watch) = refill_held(&app, &popped).await;
    let only = |normalizer: &str| {
        json!({"filters": [{"column": "data", "field": "normalizer__id",
            "operator": "in", "value": [normalizer]}]})
    };
    let pop_only = |normalizer: &'static str| {
        let app = app.clone();
        let filter = only(normalizer);
        tokio::spawn(async move { app.pop_ok("normalizer", 1, Some(&filter)).await })
    };
    // Pops whose match the heap lacks cannot tell yet whether the refill will bring it (one of
    // the picks) or not (a task pending after them): both wait for it, set aside.
    let mut rare = pop_only("rare");
    let mut picked = pop_only("picked");
    waits(&mut rare, "a pop of work pending after the picks").await;
    waits(&mut picked, "a pop of work among the picks").await;
    // Meanwhile the engine goes on with the pops the heap serves.
    let next = tokio::time::timeout(ANSWER, app.pop_ok("normalizer", 1, None))
        .await
        .expect("a pop the heap serves does not wait behind pops that wait for the refill");
    assert_eq!(priorities(&next), vec![200]);
    assert!(
        refill_waits(&mut watch),
        "the refill was under way all along"
    );
    assert!(!rare.is_finished() && !picked.is_finished());
    blocker.batch_execute("ROLLBACK").unwrap();
    assert_eq!(
        priorities(&rare.await.unwrap()),
        vec![RARE_AT],
        "the pending task, not an empty answer"
    );
    assert_eq!(priorities(&picked.await.unwrap()), vec![PICKED_AT]);
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l == "scheduler_engine_pops_set_aside_total 2"),
        "the pops set aside are counted: {}",
        metrics
            .lines()
            .filter(|l| l.contains("set_aside"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    // Of all the tasks popped so far, one came from the pending backlog (the rare one, found
    // by a search once the refill had read its picks); the others from the heap, the picked one
    // among what the refill read.
    let counted = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} is served"))
    };
    assert_eq!(counted("scheduler_engine_backlog_pops_total"), 1.0);
    assert!(counted("scheduler_engine_backlog_searches_total") >= 1.0);
    // The picked task was popped straight from `pending`: the refill wrote nothing.
    let mut conn = PgConnection::establish(&app.db.uri).unwrap();
    let queued = diesel::sql_query(
        "SELECT COUNT(*) AS count FROM tasks WHERE scheduler_id = 'normalizer' \
         AND status = 'queued' AND priority BETWEEN 1100 AND 1199",
    )
    .get_result::<CountRow>(&mut conn)
    .unwrap()
    .count;
    assert_eq!(
        queued, 0,
        "what the refill read is pending in the table until popped"
    );

    // Everything else comes out once, in pop order.
    let expected: Vec<i64> = (201..=TOTAL)
        .filter(|p| *p != RARE_AT && *p != PICKED_AT)
        .collect();
    assert_eq!(priorities(&drain(&app).await), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refill_whose_connection_is_cut_leaves_no_task_lost_or_handed_out_twice() {
    let Some(app) = full_heap().await else {
        return;
    };
    let rebuilds_before = app.metric(REBUILDS).await;
    let (mut blocker, mut watch) = refill_held(&app, &range(1, 100)).await;
    // An administrator (or a failover) ends the refill's session while it waits.
    assert_eq!(cut_waiting_refill(&mut watch), 1, "the refill's session");
    blocker.batch_execute("ROLLBACK").unwrap();
    // Every task left comes out once, in pop order.
    assert_eq!(priorities(&drain(&app).await), range(101, TOTAL));
    assert_eq!(sizes(&app).await, (0, 0));
    // The refill had read nothing into the heap and written nothing: the heap went on as it
    // was, without a rebuild from the table (which holds every request while it reads).
    assert_eq!(app.metric(REBUILDS).await, rebuilds_before, "no rebuild");
}

/// A refill too small to read apart (under a hundred tasks) reads on the engine's own
/// connection, as every refill does on SQLite. When that read fails (here the server ends the
/// session while the read waits for a lock; on SQLite a file locked by another writer), nothing
/// was read in or written: the heap keeps what it holds, with no rebuild from the table, and
/// every task still comes out once, in pop order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refill_on_the_engines_connection_whose_read_fails_rebuilds_nothing() {
    const SMALL: usize = 50;
    const ALL: i64 = 80;
    let Some(app) = heap_of(SMALL, ALL).await else {
        return;
    };
    let rebuilds_before = app.metric(REBUILDS).await;
    // A tenth of the heap popped: the refill of five after that batch waits for the lock on the
    // engine's connection.
    let (mut blocker, mut watch) = refill_held(&app, &range(1, 5)).await;
    assert_eq!(cut_waiting_refill(&mut watch), 1, "the engine's session");
    blocker.batch_execute("ROLLBACK").unwrap();
    let left = drain(&app).await;
    assert_eq!(priorities(&left), range(6, ALL));
    assert_eq!(sizes(&app).await, (0, 0));
    assert_eq!(app.metric(REBUILDS).await, rebuilds_before, "no rebuild");
}

/// How many normalizer tasks of priorities `from..=to` the table holds in `status`.
fn count_at(conn: &mut PgConnection, status: &str, from: i64, to: i64) -> i64 {
    diesel::sql_query(format!(
        "SELECT COUNT(*) AS count FROM tasks WHERE scheduler_id = 'normalizer' \
         AND status = '{status}' AND priority BETWEEN {from} AND {to}"
    ))
    .get_result::<CountRow>(conn)
    .unwrap()
    .count
}

/// The id of the normalizer task of priority `p`.
fn task_at(conn: &mut PgConnection, p: i64) -> String {
    #[derive(diesel::QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::Text)]
        id: String,
    }
    diesel::sql_query(format!(
        "SELECT id FROM tasks WHERE scheduler_id = 'normalizer' AND priority = {p}"
    ))
    .get_result::<Id>(conn)
    .unwrap()
    .id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_a_refill_read_stay_pending_until_popped_or_named_and_a_hand_edit_of_one_stands() {
    let Some(app) = full_heap().await else {
        return;
    };
    let mut conn = PgConnection::establish(&app.db.uri).unwrap();
    // A tenth of the heap popped: the refill ahead reads the best 100 pending tasks into it (an
    // explicit refill waits for it, and then finds the heap full).
    assert_eq!(
        priorities(&app.pop_many("normalizer", 100, None).await),
        range(1, 100)
    );
    assert_eq!(app.broker.refill(SchedulerId::Normalizer).await.unwrap(), 0);
    assert_eq!(sizes(&app).await, (MAXSIZE as u64, PENDING as u64 - 100));
    assert_eq!(
        count_at(&mut conn, "pending", 1001, 1100),
        100,
        "the refill wrote nothing"
    );
    assert_eq!(
        out_of_step(&app),
        Vec::<String>::new(),
        "each pending task, held as read or not, keeps its queue row"
    );

    // An operator cancels two of them by hand, in SQL, queue rows left as they are.
    conn.batch_execute(
        "UPDATE tasks SET status = 'cancelled' WHERE scheduler_id = 'normalizer' \
         AND priority IN (1020, 1070)",
    )
    .unwrap();
    // Pops take the heap's tasks in order; the one cancelled by hand is skipped, not handed
    // out (the runner's next pop takes the next task), and the others are written straight
    // from `pending`.
    let got = app.pop_many("normalizer", 950, None).await;
    let want: Vec<i64> = (101..=1051).filter(|p| *p != 1020).collect();
    assert_eq!(priorities(&got), want);
    assert_eq!(
        count_at(&mut conn, "cancelled", 1020, 1020),
        1,
        "the hand edit stands"
    );
    assert_eq!(count_at(&mut conn, "dispatched", 1001, 1051), 50);

    // A push that names none of them writes none of them: they stay pending, as read, the one
    // cancelled by hand too. The heap holds every waiting task, so the push goes into it.
    let pushed = app
        .push_ok("normalizer", &normalizer_push("org1", "late", 5_000))
        .await;
    assert_eq!(pushed["status"], "queued", "{pushed}");
    assert_eq!(
        count_at(&mut conn, "pending", 1052, TOTAL),
        448,
        "the tasks held as read stay pending through the push"
    );
    assert_eq!(count_at(&mut conn, "queued", 1052, TOTAL), 0);
    assert_eq!(
        count_at(&mut conn, "cancelled", 1070, 1070),
        1,
        "the hand edit stands"
    );

    // A push that boosts one of them (the same work, better) writes that one `queued` first
    // (the boost reads its row), and it moves ahead; the others stay pending.
    let held = task_at(&mut conn, 1_100);
    let task = app.task(&held).await;
    let again = json!({"organisation": "org1", "priority": 50, "data": task["data"]});
    let resp = app.push("normalizer", &again).await;
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
    let boosted: Value = resp.json().await.unwrap();
    assert_eq!(boosted["id"], held.as_str(), "boosted in place");
    assert_eq!(
        boosted["status"], "queued",
        "written `queued` with its boost"
    );
    assert_eq!(
        count_at(&mut conn, "pending", 1052, TOTAL),
        447,
        "the others stay pending"
    );
    let first = app.pop_ok("normalizer", 1, None).await;
    assert_eq!(first[0]["id"], held.as_str(), "the boost comes first");

    // Everything else comes out once, in pop order, the late push last.
    let expected: Vec<i64> = (1052..=TOTAL)
        .filter(|p| *p != 1070 && *p != 1100)
        .chain([5_000])
        .collect();
    assert_eq!(priorities(&drain(&app).await), expected);
    assert_eq!(sizes(&app).await, (0, 0));
}

/// Pushes that name none of the tasks the heap holds as read write none of them: a better push
/// into the full heap evicts its worst (held as read: its row stays pending, queue row and all),
/// and a push that ranks after the heap's worst but before that evicted task waits as pending.
/// The refills after them read from the first of those, so every task still comes out once, in
/// pop order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_that_name_no_task_held_as_read_write_none_and_the_order_holds() {
    pushes_past_tasks_held_as_read(false).await;
}

/// The same, the evicted task cancelled by hand in SQL after the refill read it (its queue row
/// left behind): the engine evicts it as pending, writing nothing, and the refill that reads its
/// queue row again takes it back; the pop that meets it skips it and the runner gets the next
/// task, not an empty answer, and the row is cleaned up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_held_as_read_and_cancelled_by_hand_then_evicted_is_never_handed_out() {
    pushes_past_tasks_held_as_read(true).await;
}

async fn pushes_past_tasks_held_as_read(cancel_the_evicted: bool) {
    let Some(app) = full_heap().await else {
        return;
    };
    let mut conn = PgConnection::establish(&app.db.uri).unwrap();
    assert_eq!(
        priorities(&app.pop_many("normalizer", 100, None).await),
        range(1, 100)
    );
    // The refill ahead read 1001 to 1100 into the heap, full again.
    assert_eq!(app.broker.refill(SchedulerId::Normalizer).await.unwrap(), 0);
    assert_eq!(sizes(&app).await, (MAXSIZE as u64, PENDING as u64 - 100));
    let evicted = task_at(&mut conn, 1_100);
    if cancel_the_evicted {
        conn.batch_execute(&format!(
            "UPDATE tasks SET status = 'cancelled' WHERE id = '{evicted}'"
        ))
        .unwrap();
    }

    let better = app
        .push_ok("normalizer", &normalizer_push("org1", "better", 2))
        .await;
    assert_eq!(better["status"], "queued");
    let between = app
        .push_ok("normalizer", &normalizer_push("org1", "between", 1_099))
        .await;
    assert_eq!(
        between["status"], "pending",
        "after the heap's worst (the other 1099, pushed before it)"
    );
    let held = 100 - i64::from(cancel_the_evicted);
    assert_eq!(
        count_at(&mut conn, "pending", 1001, 1100),
        held + 1,
        "nothing held as read was written: the evicted 1100 is as it was"
    );
    assert_eq!(count_at(&mut conn, "queued", 1001, TOTAL), 0);
    if cancel_the_evicted {
        assert_eq!(
            count_at(&mut conn, "cancelled", 1100, 1100),
            1,
            "the hand edit stands"
        );
        assert_eq!(
            out_of_step(&app),
            vec![evicted.clone()],
            "the queue row it left"
        );
    } else {
        assert_eq!(
            sizes(&app).await,
            (MAXSIZE as u64, PENDING as u64 - 100 + 2)
        );
        assert_eq!(out_of_step(&app), Vec::<String>::new());
    }

    let expected: Vec<i64> = [2]
        .into_iter()
        .chain(101..=1_099)
        .chain([1_099])
        .chain(1_100 + i64::from(cancel_the_evicted)..=TOTAL)
        .collect();
    // Most of the heap first, so a refill runs while it still holds some of the tasks read.
    let mut got = app.pop_many("normalizer", 950, None).await;
    got.extend(drain(&app).await);
    assert_eq!(
        priorities(&got),
        expected,
        "every task once, in pop order, no empty answer"
    );
    assert_eq!(
        got[1_000]["id"], between["id"],
        "the later 1099 after the earlier"
    );
    assert_eq!(sizes(&app).await, (0, 0));
    assert_eq!(
        app.task(&evicted).await["status"],
        if cancel_the_evicted {
            "cancelled"
        } else {
            "dispatched"
        }
    );
    assert_eq!(
        out_of_step(&app),
        Vec::<String>::new(),
        "no queue row left behind"
    );
}

/// Pending tasks and queue rows out of step (`storage::tasks::queue_mismatches`).
fn out_of_step(app: &TestApp) -> Vec<String> {
    let mut conn = kat_scheduler::storage::AnyConnection::establish(&app.db.uri).unwrap();
    kat_scheduler::storage::tasks::queue_mismatches(&mut conn).unwrap()
}
