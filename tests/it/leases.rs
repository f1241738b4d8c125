//! Leases and the watchdog: a popped task must become `running` within the dispatch timeout and
//! finish within the run timeout (renewed by `PATCH running`); otherwise it is queued again with
//! its attempt count raised, keeping its id, and failed once its attempts are used up. A holder
//! that never renews (OpenKAT's runners) gets the longer unrenewed run lease, and a holder whose
//! lease expired may still report: its late `running` or result is taken.

use chrono::Duration;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

fn leases(s: &mut kat_scheduler::config::Settings) {
    s.queue.dispatch_timeout_secs = 60;
    s.queue.run_timeout_secs = 100;
    s.queue.unrenewed_run_timeout_secs = 100;
    s.queue.max_attempts = 3;
}

/// `PATCH running` (a start, or a heartbeat); answers the task.
async fn patch_running(app: &TestApp, id: &str) -> Value {
    app.patch_task(id, &json!({"status": "running"}))
        .await
        .json()
        .await
        .unwrap()
}

/// The ids a sweep queued again.
fn requeued(report: &kat_scheduler::queue::ExpiryReport) -> Vec<String> {
    report.requeued.iter().map(ToString::to_string).collect()
}

fn lease_of(task: &Value) -> chrono::DateTime<chrono::Utc> {
    task["lease_expires_at"].as_str().unwrap().parse().unwrap()
}

async fn a_dispatched_task_not_started_in_time_is_queued_again_keeping_its_id(backend: Backend) {
    let Some(app) = spawn_app_with(backend, leases).await else {
        return;
    };
    let pushed = app
        .push_ok("boefje", &boefje_push("org1", "dns", None, 3))
        .await;
    assert_eq!(pushed["attempts"], 0);
    assert_eq!(pushed["lease_expires_at"], Value::Null);
    let popped = app.pop_ok("boefje", 1, None).await.remove(0);
    assert_eq!(lease_of(&popped), app.now() + Duration::seconds(60));

    app.advance(Duration::seconds(59));
    assert_eq!(
        app.sweep().await,
        Default::default(),
        "the lease has not ended yet"
    );
    app.advance(Duration::seconds(2));
    let report = app.sweep().await;
    assert_eq!(report.requeued.len(), 1);
    assert_eq!(report.requeued[0].to_string(), id_of(&pushed));

    let task = app.task(&id_of(&pushed)).await;
    assert_eq!(task["status"], "queued");
    assert_eq!(task["attempts"], 1);
    assert_eq!(task["lease_expires_at"], Value::Null);
    assert_eq!(task["failure_reason"], "lease expired while dispatched");
    // Handed out again under the same id, so a worker can tell it saw it before.
    assert_eq!(app.pop_ok("boefje", 1, None).await[0]["id"], pushed["id"]);
}

async fn patching_running_again_renews_the_lease(backend: Backend) {
    let Some(app) = spawn_app_with(backend, leases).await else {
        return;
    };
    let task = app
        .push_ok("normalizer", &normalizer_push("org1", "n", 3))
        .await;
    let id = id_of(&task);
    app.pop_ok("normalizer", 1, None).await;
    let running: Value = patch_running(&app, &id).await;
    assert_eq!(lease_of(&running), app.now() + Duration::seconds(100));

    app.advance(Duration::seconds(90));
    let beat: Value = patch_running(&app, &id).await;
    assert_eq!(
        lease_of(&beat),
        app.now() + Duration::seconds(100),
        "the heartbeat renews"
    );
    app.advance(Duration::seconds(50));
    assert!(
        app.sweep().await.requeued.is_empty(),
        "the renewed lease still holds"
    );
    app.advance(Duration::seconds(51));
    assert_eq!(app.sweep().await.requeued.len(), 1);
    let task = app.task(&id).await;
    assert_eq!(task["status"], "queued");
    assert_eq!(task["failure_reason"], "lease expired while running");
}

async fn a_task_that_uses_up_its_attempts_is_failed_with_the_reason(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| {
        leases(s);
        s.schedulers.report.max_attempts = Some(2);
    })
    .await
    else {
        return;
    };
    let task = app.push_ok("report", &report_push("org1", "r", 3)).await;
    let id = id_of(&task);
    for attempt in 1..=2 {
        assert_eq!(app.pop_ok("report", 1, None).await[0]["id"], task["id"]);
        app.advance(Duration::seconds(61));
        let report = app.sweep().await;
        if attempt < 2 {
            assert_eq!(report.requeued.len(), 1);
        } else {
            assert_eq!(report.failed.len(), 1);
        }
    }
    let failed = app.task(&id).await;
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["attempts"], 2);
    assert_eq!(
        failed["failure_reason"],
        "lease expired while dispatched, 2 of 2 attempts used"
    );
    assert!(app.pop_ok("report", 1, None).await.is_empty());
    // The late worker did finish it after all: its result is taken.
    let resp = app.patch_task(&id, &json!({"status": "completed"})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let done = app.task(&id).await;
    assert_eq!(
        (done["status"].clone(), done["failure_reason"].clone()),
        (json!("completed"), Value::Null)
    );
    // An operator's cancellation is final, whatever a late worker says.
    let other = app.push_ok("report", &report_push("org1", "s", 3)).await;
    app.patch_task(&id_of(&other), &json!({"status": "cancelled"}))
        .await;
    let resp = app
        .patch_task(&id_of(&other), &json!({"status": "completed"}))
        .await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
}

/// OpenKAT's runners: `PATCH running` once, no heartbeat, then the result hours later.
fn runners_defaults(s: &mut kat_scheduler::config::Settings) {
    s.queue.dispatch_timeout_secs = 60;
    s.queue.run_timeout_secs = 100;
    s.queue.unrenewed_run_timeout_secs = 1000;
    s.queue.max_attempts = 3;
}

async fn a_runner_that_never_heartbeats_finishes_after_the_run_timeout_and_its_result_stands(
    backend: Backend,
) {
    let Some(app) = spawn_app_with(backend, runners_defaults).await else {
        return;
    };
    let task = app
        .push_ok("boefje", &boefje_push("org1", "nmap", None, 3))
        .await;
    let id = id_of(&task);
    app.pop_ok("boefje", 1, None).await;
    let running: Value = patch_running(&app, &id).await;
    assert_eq!(
        lease_of(&running),
        app.now() + Duration::seconds(1000),
        "no heartbeat yet: the unrenewed run lease"
    );
    app.advance(Duration::seconds(500));
    assert_eq!(
        app.sweep().await,
        Default::default(),
        "past the run timeout, within the unrenewed lease: not run again"
    );
    let resp = app.patch_task(&id, &json!({"status": "completed"})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let done = app.task(&id).await;
    assert_eq!(done["status"], "completed");
    assert_eq!(done["attempts"], 0);
    assert!(app.pop_ok("boefje", 1, None).await.is_empty());
}

/// OpenKAT's runtime with two workers, on the default leases: it pops until its local queue
/// holds one task more than it has workers, and starts each only when a worker is free. The
/// third task waits behind two scans of three hours and is not handed out again meanwhile (a
/// second runner would run it too: its `PATCH running` would read as a heartbeat).
async fn a_task_waiting_in_a_runners_local_queue_behind_long_scans_is_not_handed_out_again(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    for boefje in ["nmap", "nuclei", "dns-records"] {
        app.push_ok("boefje", &boefje_push("org1", boefje, None, 3))
            .await;
    }
    let local = app.pop_ids("boefje", 3).await;
    assert_eq!(local.len(), 3);
    for id in &local[..2] {
        assert_eq!(patch_running(&app, id).await["status"], "running");
    }
    for _ in 0..6 {
        app.advance(Duration::minutes(30));
        assert_eq!(app.sweep().await, Default::default());
    }
    assert!(
        app.pop_ok("boefje", 10, None).await.is_empty(),
        "nothing handed out again"
    );
    for id in &local[..2] {
        let resp = app.patch_task(id, &json!({"status": "completed"})).await;
        assert_eq!(resp.status(), StatusCode::OK);
    }
    let started = patch_running(&app, &local[2]).await;
    assert_eq!(
        (started["status"].clone(), started["attempts"].clone()),
        (json!("running"), json!(0))
    );
}

async fn a_late_result_is_taken_and_the_copy_waiting_again_withdrawn(backend: Backend) {
    let Some(app) = spawn_app_with(backend, runners_defaults).await else {
        return;
    };
    let slow = app
        .push_ok("boefje", &boefje_push("org1", "slow", None, 3))
        .await;
    let late_start = app
        .push_ok("boefje", &boefje_push("org1", "late-start", None, 4))
        .await;
    let (slow_id, late_id) = (id_of(&slow), id_of(&late_start));
    assert_eq!(app.pop_ids("boefje", 1).await, vec![slow_id.clone()]);
    assert_eq!(app.pop_ids("boefje", 1).await, vec![late_id.clone()]);
    app.patch_task(&slow_id, &json!({"status": "running"}))
        .await;
    // The slow one outlives even the unrenewed lease; the other sat in its runner's local
    // queue past the dispatch lease. Both are queued again.
    app.advance(Duration::seconds(1001));
    assert_eq!(app.sweep().await.requeued.len(), 2);
    assert_eq!(app.task(&slow_id).await["status"], "queued");

    let resp = app
        .patch_task(&slow_id, &json!({"status": "completed"}))
        .await;
    assert_eq!(resp.status(), StatusCode::OK, "{}", detail(resp).await);
    let done = app.task(&slow_id).await;
    assert_eq!(
        (done["status"].clone(), done["failure_reason"].clone()),
        (json!("completed"), Value::Null)
    );
    let resp = app
        .patch_task(&late_id, &json!({"status": "running"}))
        .await;
    assert_eq!(resp.status(), StatusCode::OK, "{}", detail(resp).await);
    let running = app.task(&late_id).await;
    assert_eq!(running["status"], "running");
    assert_eq!(lease_of(&running), app.now() + Duration::seconds(1000));
    assert!(
        app.pop_ok("boefje", 10, None).await.is_empty(),
        "the copies waiting again were withdrawn: nothing runs twice"
    );
    let resp = app
        .patch_task(&late_id, &json!({"status": "completed"}))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
}

/// A task popped, its dispatch lease ended without a word from its holder, and popped again:
/// the app and the task's id.
async fn handed_out_again(backend: Backend) -> Option<(TestApp, String)> {
    let (app, first, _) = handed_out_twice(backend).await?;
    Some((app, id_of(&first)))
}

/// [`handed_out_again`], answering the task as each of its two pops answered it (the copies
/// the two runtimes hold).
async fn handed_out_twice(backend: Backend) -> Option<(TestApp, Value, Value)> {
    let app = spawn_app_with(backend, runners_defaults).await?;
    app.push_ok("boefje", &boefje_push("org1", "a", None, 3))
        .await;
    let first = app.pop_ok("boefje", 1, None).await.remove(0);
    app.advance(Duration::seconds(61));
    assert_eq!(app.sweep().await.requeued.len(), 1);
    let second = app.pop_ok("boefje", 1, None).await.remove(0);
    assert_eq!(id_of(&second), id_of(&first));
    Some((app, first, second))
}

/// Handed out again before the first holder reports: its result completes the task, and the
/// second holder's `PATCH running` is refused (409), so that runner does not run it again.
async fn a_late_result_after_the_task_was_handed_out_again_completes_it(backend: Backend) {
    let Some((app, id)) = handed_out_again(backend).await else {
        return;
    };
    let resp = app.patch_task(&id, &json!({"status": "completed"})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = app.patch_task(&id, &json!({"status": "running"})).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(app.task(&id).await["status"], "completed");
}

/// The same with the second holder failing it: the first holder's late `running` or result
/// does not revive the task (the first result stands), and the failed task does not show the
/// earlier expiry as its reason.
async fn a_late_word_after_the_task_was_handed_out_again_and_failed_is_refused(backend: Backend) {
    let Some((app, id)) = handed_out_again(backend).await else {
        return;
    };
    let resp = app.patch_task(&id, &json!({"status": "failed"})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    for late in ["running", "completed"] {
        let resp = app.patch_task(&id, &json!({"status": late})).await;
        assert_eq!(resp.status(), StatusCode::CONFLICT, "late {late}");
    }
    let failed = app.task(&id).await;
    assert_eq!(
        (failed["status"].clone(), failed["failure_reason"].clone()),
        (json!("failed"), Value::Null),
        "{failed}"
    );
}

/// A runtime stopping gives back the tasks of its local queue, which it never started: one
/// that sat there past its dispatch lease was handed out again, and another runner runs it now.
/// That runner keeps it: the stale copy is refused (409), and nobody else is handed the task,
/// where it went back to the queue and ran twice at once.
async fn a_stale_give_back_of_a_task_another_runner_runs_is_refused(backend: Backend) {
    let Some((app, stale, _)) = handed_out_twice(backend).await else {
        return;
    };
    let id = id_of(&stale);
    assert_eq!(patch_running(&app, &id).await["status"], "running");

    let resp = app.push("boefje", &stale).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let why = resp.text().await.unwrap();
    assert!(why.contains("is running"), "{why}");
    assert_eq!(app.task(&id).await["status"], "running");
    assert!(
        app.pop_ids("boefje", 1).await.is_empty(),
        "handed out twice"
    );
}

/// The same while the runner it was handed out to again has not started it yet (it waits in
/// that runtime's buffer too): the first runtime's copy is from before the second pop and is
/// refused; the second runtime's own copy is a give-back as any, also after a user changed the
/// task's priority, and the task waits again.
async fn a_stale_give_back_of_a_task_handed_out_again_is_refused_and_the_new_holders_is_not(
    backend: Backend,
) {
    let Some((app, stale, holder)) = handed_out_twice(backend).await else {
        return;
    };
    let id = id_of(&stale);

    let resp = app.push("boefje", &stale).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    let why = resp.text().await.unwrap();
    assert!(why.contains("handed out again"), "{why}");
    assert_eq!(app.task(&id).await["status"], "dispatched");

    // A user makes it more urgent meanwhile: the task changed, but was not handed out again,
    // and the holder's copy is still its own.
    app.advance(Duration::seconds(1));
    let resp = app.patch_task(&id, &json!({"priority": 2})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let back: Value = app.push("boefje", &holder).await.json().await.unwrap();
    assert_eq!(back["status"], "queued", "{back}");
    assert_eq!(app.pop_ids("boefje", 1).await, vec![id]);
}

/// Rows of tasks out deleted behind the engine's back (an operator clearing stuck work in SQL)
/// leave nothing to expire: the sweep forgets them, instead of meeting them first every time
/// (their leases ended longest ago) and, a sweep's thousand of them, never reaching a real one.
async fn leases_of_rows_deleted_behind_the_engines_back_do_not_hold_the_sweep(backend: Backend) {
    let Some(app) = spawn_app_with(backend, leases).await else {
        return;
    };
    for n in 0..1001 {
        app.push_ok("normalizer", &normalizer_push("org1", "n", 1 + n % 7))
            .await;
    }
    let deleted = app.pop_ids("normalizer", 1000).await;
    assert_eq!(deleted.len(), 1000);
    app.advance(Duration::seconds(1));
    let kept = app.pop_ids("normalizer", 1).await;
    assert_eq!(kept.len(), 1);
    behind_its_back(
        backend,
        &app.db.uri,
        &format!(
            "DELETE FROM tasks WHERE id IN ({})",
            deleted
                .iter()
                .map(|id| format!("'{id}'"))
                .collect::<Vec<_>>()
                .join(",")
        ),
    );
    app.advance(Duration::seconds(61));
    let first = app.sweep().await;
    let second = app.sweep().await;
    assert_eq!(
        (
            first.requeued.len() + second.requeued.len(),
            requeued(&second)
        ),
        (1, kept.clone()),
        "the first sweep forgets the deleted rows, the second expires the real lease"
    );
    assert_eq!(app.task(&kept[0]).await["status"], "queued");
}

async fn finished_and_waiting_tasks_hold_no_lease(backend: Backend) {
    let Some(app) = spawn_app_with(backend, leases).await else {
        return;
    };
    let done = app
        .push_ok("boefje", &boefje_push("org1", "a", None, 3))
        .await;
    let waiting = app
        .push_ok("boefje", &boefje_push("org1", "b", None, 9))
        .await;
    app.pop_ok("boefje", 1, None).await;
    app.patch_task(&id_of(&done), &json!({"status": "running"}))
        .await;
    let completed: Value = app
        .patch_task(&id_of(&done), &json!({"status": "completed"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(completed["lease_expires_at"], Value::Null);
    app.advance(Duration::days(2));
    assert_eq!(app.sweep().await, Default::default());
    assert_eq!(app.task(&id_of(&done)).await["status"], "completed");
    assert_eq!(app.task(&id_of(&waiting)).await["status"], "queued");
}

async fn a_worker_giving_a_task_back_clears_its_lease(backend: Backend) {
    let Some(app) = spawn_app_with(backend, leases).await else {
        return;
    };
    app.push_ok("boefje", &boefje_push("org1", "a", None, 3))
        .await;
    let popped = app.pop_ok("boefje", 1, None).await.remove(0);
    let back: Value = app.push("boefje", &popped).await.json().await.unwrap();
    assert_eq!(back["status"], "queued");
    assert_eq!(back["lease_expires_at"], Value::Null);
    app.advance(Duration::seconds(61));
    assert_eq!(app.sweep().await, Default::default());
    assert_eq!(app.task(&id_of(&popped)).await["attempts"], 0);
}

/// The leases a stopped process left in the table are the next one's to expire: each engine
/// keeps its tasks' leases in memory, read back at its start, so the sweep reads no table; a
/// lease renewed before the stop ends when it was renewed to, not before.
async fn leases_left_by_the_last_process_end_under_the_next(backend: Backend) {
    let Some(app) = spawn_app_with(backend, leases).await else {
        return;
    };
    for name in ["a", "b", "c"] {
        app.push_ok("boefje", &boefje_push("org1", name, None, 3))
            .await;
    }
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(id_of(&app.pop_ok("boefje", 1, None).await.remove(0)));
    }
    // One started (run lease 100 s), one finished, one left dispatched (60 s).
    app.advance(Duration::seconds(10));
    assert_eq!(
        lease_of(&patch_running(&app, &ids[0]).await),
        app.now() + Duration::seconds(100)
    );
    let done = app
        .patch_task(&ids[1], &json!({"status": "completed"}))
        .await;
    assert_eq!(done.status(), StatusCode::OK);
    let app = app.restart().await;

    app.advance(Duration::seconds(51));
    let report = app.sweep().await;
    assert_eq!(
        requeued(&report),
        [ids[2].clone()],
        "the dispatch lease of the last process ended; the run lease has not"
    );
    assert_eq!(app.task(&ids[2]).await["status"], "queued");
    assert_eq!(app.task(&ids[0]).await["status"], "running");
    app.advance(Duration::seconds(50));
    let report = app.sweep().await;
    assert_eq!(requeued(&report), [ids[0].clone()]);
    let task = app.task(&ids[0]).await;
    assert_eq!(task["status"], "queued");
    assert_eq!(task["failure_reason"], "lease expired while running");
    assert_eq!(app.task(&ids[1]).await["status"], "completed");
}

/// A lease changed in the table behind the engine's back (an operator giving a long scan more
/// time) stands: the engine's memory says it has ended, but the expiry reads the task from the
/// table, leaves it with its holder, and keeps the new lease from then on.
async fn a_lease_lengthened_behind_the_engines_back_stands(backend: Backend) {
    let Some(app) = spawn_app_with(backend, leases).await else {
        return;
    };
    let pushed = app
        .push_ok("boefje", &boefje_push("org1", "dns", None, 3))
        .await;
    let id = id_of(&app.pop_ok("boefje", 1, None).await.remove(0));
    let an_hour_more = match backend {
        Backend::Postgres => format!(
            "UPDATE tasks SET lease_expires_at = lease_expires_at + interval '1 hour' WHERE id = '{id}'"
        ),
        Backend::Sqlite => format!(
            "UPDATE tasks SET lease_expires_at = \
             strftime('%Y-%m-%d %H:%M:%f', lease_expires_at, '+1 hour') WHERE id = '{id}'"
        ),
    };
    behind_its_back(backend, &app.db.uri, &an_hour_more);

    app.advance(Duration::seconds(61));
    assert_eq!(
        app.sweep().await,
        Default::default(),
        "the table's lease has an hour to go"
    );
    let task = app.task(&id).await;
    assert_eq!(task["status"], "dispatched");
    assert_eq!(task["attempts"], 0);
    assert!(
        lease_of(&task) > app.now() + Duration::minutes(55),
        "{task}"
    );
    // Read once, the new lease is the engine's: it ends an hour after the first.
    app.advance(Duration::minutes(59));
    assert_eq!(app.sweep().await, Default::default());
    app.advance(Duration::minutes(2));
    assert_eq!(requeued(&app.sweep().await), [id_of(&pushed)]);
    assert_eq!(app.task(&id).await["status"], "queued");
}

crate::backend_tests!(
    a_stale_give_back_of_a_task_handed_out_again_is_refused_and_the_new_holders_is_not,
    a_stale_give_back_of_a_task_another_runner_runs_is_refused,
    a_task_waiting_in_a_runners_local_queue_behind_long_scans_is_not_handed_out_again,
    a_lease_lengthened_behind_the_engines_back_stands,
    leases_left_by_the_last_process_end_under_the_next,
    a_dispatched_task_not_started_in_time_is_queued_again_keeping_its_id,
    patching_running_again_renews_the_lease,
    a_task_that_uses_up_its_attempts_is_failed_with_the_reason,
    finished_and_waiting_tasks_hold_no_lease,
    a_worker_giving_a_task_back_clears_its_lease,
    a_runner_that_never_heartbeats_finishes_after_the_run_timeout_and_its_result_stands,
    a_late_result_is_taken_and_the_copy_waiting_again_withdrawn,
    a_late_result_after_the_task_was_handed_out_again_completes_it,
    a_late_word_after_the_task_was_handed_out_again_and_failed_is_refused,
    leases_of_rows_deleted_behind_the_engines_back_do_not_hold_the_sweep,
);

/// The engine's connection cut under a pop: the batch is written (or found written) on a fresh
/// one, and the lease it gave is the watchdog's to end all the same, from the rows the engine
/// read back rather than from a scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pop_whose_connection_was_cut_keeps_a_lease_that_ends() {
    let Some(app) = spawn_app_with(Backend::Postgres, leases).await else {
        return;
    };
    let pushed = app
        .push_ok("boefje", &boefje_push("org1", "dns", None, 3))
        .await;
    let killed = terminate_connections(&app.db.uri).await;
    assert!(killed >= 1, "the service's connections were there to close");
    let popped = app.pop_ok("boefje", 1, None).await.remove(0);
    assert_eq!(popped["id"], pushed["id"]);
    assert_eq!(app.task(&id_of(&pushed)).await["status"], "dispatched");

    app.advance(Duration::seconds(61));
    let report = app.sweep().await;
    assert_eq!(requeued(&report), [id_of(&pushed)]);
    assert_eq!(app.task(&id_of(&pushed)).await["status"], "queued");
}

/// Whether the server on `port` holds a connection its client has closed and it has not yet
/// (TCP `CLOSE_WAIT`, from `/proc/net/tcp`): until it notices, a request on it is not yet
/// dropped, and an answer made meanwhile counts as delivered.
fn hang_up_unseen(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table.lines().skip(1).any(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        cols.len() > 3
            && cols[1].rsplit(':').next() == Some(format!("{port:04X}").as_str())
            && cols[3] == "08"
    })
}

/// Waits until the app has seen every client's hang-up.
async fn until_hang_ups_seen(app: &TestApp) {
    let port: u16 = app.address.rsplit(':').next().unwrap().parse().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while hang_up_unseen(port) && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
}

/// A runner that hangs up before its pop is answered (its HTTP timeout, a proxy's) gets nothing,
/// so nobody would run what the pop took: the task goes back to the queue at once, instead of
/// waiting out its dispatch lease, and the next pop hands it out. The pop is held in its
/// transaction by a lock on the table until the runner has gone; its commit is seen in the
/// task's `modified_at`, which only a committed pop and its give-back move. With the flush
/// barrier the answers (and the give-back) wait for the flush thread; without it, for nothing.
async fn a_runner_hanging_up_before_its_pop_is_answered_loses_no_task(barrier: bool) {
    let Some(app) = spawn_app_with(Backend::Postgres, |s| {
        leases(s);
        s.database.flush_barrier = Some(barrier);
    })
    .await
    else {
        return;
    };
    let first = app
        .push_ok("boefje", &boefje_push("org1", "dns", None, 1))
        .await;
    let second = app
        .push_ok("boefje", &boefje_push("org1", "nmap", None, 2))
        .await;
    let pushed_at = app.task(&id_of(&first)).await["modified_at"].clone();
    app.advance(Duration::seconds(5));

    // Another session holds the tasks table: the pop's writes wait for it.
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let uri = app.db.uri.clone();
    let holder = std::thread::spawn(move || {
        use diesel::{Connection, PgConnection, connection::SimpleConnection};
        let mut c = PgConnection::establish(&uri).expect("connect");
        c.batch_execute("BEGIN; LOCK TABLE tasks IN EXCLUSIVE MODE")
            .expect("lock");
        locked_tx.send(()).unwrap();
        let _ = release_rx.recv();
        c.batch_execute("COMMIT").expect("unlock");
    });
    locked_rx.recv().unwrap();
    let impatient = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(700))
        .build()
        .unwrap();
    let hung_up = impatient
        .post(format!("{}/schedulers/boefje/pop?limit=1", app.address))
        .json(&json!(null))
        .send()
        .await;
    assert!(
        hung_up.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the pop waits for the lock until the runner hangs up: {hung_up:?}"
    );
    until_hang_ups_seen(&app).await;
    release_tx.send(()).unwrap();
    holder.join().unwrap();

    // The pop commits once the lock is gone, finds its caller gone, and gives the task back.
    let id = id_of(&first);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let task = loop {
        let task = app.task(&id).await;
        if task["status"] != "dispatched" && task["modified_at"] != pushed_at
            || std::time::Instant::now() > deadline
        {
            break task;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(task["status"], "queued", "given back: {task}");
    assert_ne!(
        task["modified_at"], pushed_at,
        "the pop was committed before it was given back: {task}"
    );
    assert_eq!(task["lease_expires_at"], Value::Null, "{task}");
    // Handed out by the next pop, in its place ahead of the other task; no lease had to end.
    let popped = app.pop_ids("boefje", 2).await;
    assert_eq!(popped, [id, id_of(&second)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_hanging_up_before_its_pop_is_answered_loses_no_task_with_the_flush_barrier() {
    a_runner_hanging_up_before_its_pop_is_answered_loses_no_task(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_hanging_up_before_its_pop_is_answered_loses_no_task_without_it() {
    a_runner_hanging_up_before_its_pop_is_answered_loses_no_task(false).await;
}

/// A pop whose runner hung up is given back in the next batch; when that batch loses its
/// connection (its outcome unknown), the give-back goes with the batch after it, not with the
/// task's lease a day later. The server here ends the session of the first three statements that
/// requeue a dispatched task, as a proxy or a failover cutting the engine's connection would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_whose_batch_lost_its_connection_is_tried_again() {
    give_back_tried_again("PERFORM pg_terminate_backend(pg_backend_pid())", 3).await;
}

/// The same when the database refuses the give-back's batch (rolled back, so nothing was given
/// back: a deadlock, a lock timeout, a statement refused), here once: it goes with a later
/// batch. It was left to its lease, a day later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_whose_batch_the_database_refused_is_tried_again() {
    give_back_tried_again("RAISE EXCEPTION 'refused by the test''s trigger'", 1).await;
}

/// A hung-up pop given back while the server does `action` to the first `times` statements
/// that requeue a dispatched task.
async fn give_back_tried_again(action: &'static str, times: i64) {
    let Some(app) = spawn_app_with(Backend::Postgres, leases).await else {
        return;
    };
    let pushed = app
        .push_ok("boefje", &boefje_push("org1", "dns", None, 1))
        .await;
    let id = id_of(&pushed);
    app.advance(Duration::seconds(5));

    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let uri = app.db.uri.clone();
    let holder = std::thread::spawn(move || {
        use diesel::{Connection, PgConnection, connection::SimpleConnection};
        let mut c = PgConnection::establish(&uri).expect("connect");
        c.batch_execute("BEGIN; LOCK TABLE tasks IN EXCLUSIVE MODE")
            .expect("lock");
        locked_tx.send(()).unwrap();
        let _ = release_rx.recv();
        // Created while the pop waits, committed with the lock's release: the pop's own write
        // (queued to dispatched) passes; the give-back's (dispatched to queued) is cut three
        // times, so every attempt of its batch on a fresh connection is cut too.
        c.batch_execute(&format!(
            "CREATE SEQUENCE cut_give_back; \
             CREATE FUNCTION cut_give_back() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN \
                 IF OLD.status = 'dispatched' AND NEW.status = 'queued' \
                     AND nextval('cut_give_back') <= {times} THEN \
                     {action}; \
                 END IF; \
                 RETURN NEW; \
             END $$; \
             CREATE TRIGGER cut_give_back BEFORE UPDATE ON tasks \
                 FOR EACH ROW EXECUTE FUNCTION cut_give_back(); \
             COMMIT",
        ))
        .expect("trigger, unlock");
    });
    locked_rx.recv().unwrap();
    let impatient = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(700))
        .build()
        .unwrap();
    let hung_up = impatient
        .post(format!("{}/schedulers/boefje/pop?limit=1", app.address))
        .json(&json!(null))
        .send()
        .await;
    assert!(
        hung_up.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the pop waits for the lock until the runner hangs up: {hung_up:?}"
    );
    until_hang_ups_seen(&app).await;
    release_tx.send(()).unwrap();
    holder.join().unwrap();

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let task = loop {
        let task = app.task(&id).await;
        if task["status"] == "queued" && task["lease_expires_at"].is_null()
            || std::time::Instant::now() > deadline
        {
            break task;
        }
        tokio::task::yield_now().await;
    };
    let uri = app.db.uri.clone();
    let cuts = tokio::task::spawn_blocking(move || {
        use diesel::{Connection, PgConnection, RunQueryDsl};
        #[derive(diesel::QueryableByName)]
        struct Cuts {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            last_value: i64,
        }
        let mut c = PgConnection::establish(&uri).expect("connect");
        diesel::sql_query("SELECT last_value FROM cut_give_back")
            .get_result::<Cuts>(&mut c)
            .expect("the sequence")
            .last_value
    })
    .await
    .unwrap();
    assert!(cuts >= times, "the give-back's batch was cut: {cuts}");
    assert_eq!(
        task["status"], "queued",
        "given back after the cuts: {task}"
    );
    assert_eq!(app.pop_ids("boefje", 1).await, [id]);
}

/// The pids of sessions waiting for a lock in an `UPDATE` of `tasks` (a pop's write).
fn waiting_writes(uri: &str) -> Vec<i32> {
    use diesel::{Connection, PgConnection, RunQueryDsl};
    #[derive(diesel::QueryableByName)]
    struct Pid {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        pid: i32,
    }
    let mut c = PgConnection::establish(uri).expect("connect");
    diesel::sql_query(
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND datname = current_database() AND query ILIKE '%UPDATE tasks%' ORDER BY pid",
    )
    .load::<Pid>(&mut c)
    .unwrap()
    .into_iter()
    .map(|p| p.pid)
    .collect()
}

/// [`waiting_writes`] on `uri` once `until` holds of them (or after 15 s).
async fn writes_once(uri: &str, until: impl Fn(&[i32]) -> bool + Send + 'static) -> Vec<i32> {
    let uri = uri.to_owned();
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let pids = waiting_writes(&uri);
            if until(&pids) || std::time::Instant::now() > deadline {
                return pids;
            }
            std::thread::yield_now();
        }
    })
    .await
    .unwrap()
}

/// A pop whose write waits for a row lock another session holds on its task, the app reaching
/// PostgreSQL through a [`CutProxy`].
struct HeldPop {
    app: TestApp,
    proxy: CutProxy,
    /// The database's URI, not through the proxy.
    direct: String,
    /// The task the pop takes.
    id: String,
    /// The pid of the session whose write waits.
    waiting: i32,
    release: std::sync::mpsc::Sender<()>,
    holder: Option<std::thread::JoinHandle<()>>,
    pop: tokio::task::JoinHandle<reqwest::Response>,
}

impl HeldPop {
    async fn new() -> Option<HeldPop> {
        let db = TestDb::create(Backend::Postgres).await?;
        let (proxy, through) = CutProxy::start(&db.uri).await;
        let direct = db.uri.clone();
        let app = spawn_app_on(db, Backend::Postgres, |s| {
            leases(s);
            s.database.uri = through;
        })
        .await;
        let id = id_of(
            &app.push_ok("boefje", &boefje_push("org1", "dns", None, 1))
                .await,
        );
        // Another session holds the task's row against writes (reads go on); writes that wait
        // for it take it in the order they came.
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let (uri, row) = (direct.clone(), id.clone());
        let holder = std::thread::spawn(move || {
            use diesel::{Connection, PgConnection, connection::SimpleConnection};
            let mut c = PgConnection::establish(&uri).expect("connect");
            c.batch_execute(&format!(
                "BEGIN; SELECT 1 FROM tasks WHERE id = '{row}' FOR UPDATE"
            ))
            .expect("lock");
            locked_tx.send(()).unwrap();
            let _ = release_rx.recv();
            c.batch_execute("COMMIT").expect("unlock");
        });
        locked_rx.recv().unwrap();
        let address = app.address.clone();
        let pop = tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{address}/schedulers/boefje/pop?limit=1"))
                .json(&json!(null))
                .send()
                .await
                .unwrap()
        });
        let first = writes_once(&direct, |p| !p.is_empty()).await;
        assert_eq!(
            first.len(),
            1,
            "the pop's write waits for the lock: {first:?}"
        );
        Some(HeldPop {
            app,
            proxy,
            direct,
            id,
            waiting: first[0],
            release,
            holder: Some(holder),
            pop,
        })
    }

    /// Lets the row go.
    fn let_go(&mut self) {
        self.release.send(()).unwrap();
        if let Some(holder) = self.holder.take() {
            holder.join().unwrap();
        }
    }
}

/// A pop's write whose connection is cut on the client's side alone while the statement waits
/// for a lock (a load balancer's timeout): its session goes on on the server, and would commit
/// once the lock is let go. The engine ends that session before it finds out whether the write
/// landed and sends it again; otherwise the old statement committed after that check, the new
/// one found the task no longer queued, and the task stayed dispatched with nobody holding it
/// and no lease the engine knew of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pop_cut_on_the_clients_side_alone_is_not_written_behind_the_engines_back() {
    let Some(mut held) = HeldPop::new().await else {
        return;
    };
    held.proxy.cut();
    // The engine finds its connection broken and writes again on a fresh one, which waits for
    // the lock in turn.
    let old = held.waiting;
    let now = writes_once(&held.direct, move |p| p.iter().any(|&pid| pid != old)).await;
    assert!(
        now.iter().any(|&pid| pid != old),
        "written again on a fresh session: {now:?}"
    );
    held.let_go();
    let HeldPop {
        app,
        proxy,
        id,
        pop,
        ..
    } = held;

    let answer = pop.await.unwrap();
    let status = answer.status();
    let body: Value = answer.json().await.unwrap_or(Value::Null);
    let task = app.task(&id).await;
    let handed: Vec<String> = body["results"]
        .as_array()
        .map(|a| a.iter().map(id_of).collect())
        .unwrap_or_default();
    if handed == [id.clone()] {
        assert_eq!(task["status"], "dispatched", "{task}");
    } else {
        // Not handed out: it must still be there to pop.
        assert_eq!(
            task["status"], "queued",
            "answered {status} {body}; the task is {task}"
        );
        assert_eq!(app.pop_ids("boefje", 1).await, [id]);
    }
    drop(proxy);
}

/// A pop whose batch failed with its outcome unknown is answered 503; if its write was
/// committed after all, nobody holds the task, which goes back to the queue once the database
/// can be reached, not a lease later. Here the write waits for a row lock, the connection is
/// cut on the client's side and the server can then not be reached (new connections refused),
/// so the session cannot be ended and the write commits once the lock is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pop_answered_503_whose_write_committed_after_all_goes_back_to_the_queue() {
    let Some(mut held) = HeldPop::new().await else {
        return;
    };
    held.proxy.refuse(true);
    held.proxy.cut();
    let answer = (&mut held.pop).await.unwrap();
    assert_eq!(answer.status(), 503, "the outcome is unknown");
    // The write commits once the lock is let go; then the server can be reached again.
    held.let_go();
    writes_once(&held.direct, <[i32]>::is_empty).await;
    let HeldPop { app, proxy, id, .. } = held;
    proxy.refuse(false);

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let task = loop {
        let response = app.get_task(&id).await;
        if response.status() == 200 {
            let task: Value = response.json().await.unwrap();
            if task["status"] == "queued" || std::time::Instant::now() > deadline {
                break task;
            }
        } else if std::time::Instant::now() > deadline {
            panic!("the task cannot be read: {}", response.status());
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(task["status"], "queued", "nobody holds it: {task}");
    assert_eq!(app.pop_ids("boefje", 1).await, [id]);
    drop(proxy);
}
