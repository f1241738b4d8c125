//! Exactly-one pop under concurrency: many poppers, every task handed out once.

use std::collections::HashSet;

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::helpers::*;

const TASKS: usize = 2000;
const POPPERS: usize = 8;

async fn push_many(app: &TestApp, range: std::ops::Range<usize>) -> Vec<String> {
    futures_util::stream::iter(range)
        .map(|i| async move {
            let body = boefje_push("org1", &format!("boefje-{i}"), None, (i % 17) as i64 + 2);
            id_of(&app.push_ok("boefje", &body).await)
        })
        .buffer_unordered(64)
        .collect()
        .await
}

async fn pop_until_empty(
    app: &TestApp,
    worker: usize,
    stop_when_empty: &tokio::sync::watch::Receiver<bool>,
) -> Vec<String> {
    let mut got = Vec::new();
    loop {
        // Limits 1..=4 so single and multi-task pops interleave.
        let limit = 1 + (worker + got.len()) % 4;
        let popped = app.pop_ok("boefje", limit, None).await;
        if popped.is_empty() {
            if *stop_when_empty.borrow() {
                break;
            }
            tokio::task::yield_now().await;
            continue;
        }
        for t in &popped {
            assert_eq!(t["status"], "dispatched");
        }
        got.extend(popped.iter().map(id_of));
    }
    got
}

/// Each engine's commit waits for its own flush (PostgreSQL's default).
async fn eight_concurrent_poppers_get_each_of_2000_tasks_exactly_once_with_a_flush_per_commit(
    backend: Backend,
) {
    poppers_get_each_task_exactly_once(backend, false).await;
}

/// Answers wait for a flush barrier shared by the three engines (SQLite's default).
async fn eight_concurrent_poppers_get_each_of_2000_tasks_exactly_once_with_the_flush_barrier(
    backend: Backend,
) {
    poppers_get_each_task_exactly_once(backend, true).await;
}

async fn poppers_get_each_task_exactly_once(backend: Backend, barrier: bool) {
    let Some(app) = spawn_app_with(backend, |s| s.database.flush_barrier = Some(barrier)).await
    else {
        return;
    };
    // Half the tasks are queued up front, half arrive while the poppers run.
    let mut pushed = push_many(&app, 0..TASKS / 2).await;
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let poppers = futures_util::future::join_all((0..POPPERS).map(|w| {
        let rx = done_rx.clone();
        let app = &app;
        async move { pop_until_empty(app, w, &rx).await }
    }));
    let pushers = async {
        let ids = push_many(&app, TASKS / 2..TASKS).await;
        done_tx.send(true).expect("poppers listen");
        ids
    };
    let (per_worker, late) = tokio::join!(poppers, pushers);
    pushed.extend(late);

    let all: Vec<String> = per_worker.iter().flatten().cloned().collect();
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(all.len(), TASKS, "every task popped once, none twice");
    assert_eq!(unique.len(), TASKS);
    assert_eq!(unique, pushed.iter().collect::<HashSet<_>>());
    assert!(
        per_worker.iter().filter(|w| !w.is_empty()).count() > 1,
        "the work was shared"
    );

    let queued: Value = app
        .get("/tasks?status=queued&limit=0")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(queued["count"], 0);
    let dispatched: Value = app
        .get("/tasks?status=dispatched&limit=0")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(dispatched["count"], TASKS);
}

async fn concurrent_pushes_and_pops_on_all_three_schedulers_all_succeed(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let app = &app;
    // The three schedulers' engines write side by side; on SQLite they share one file.
    let codes: Vec<u16> = futures_util::stream::iter(0..600usize)
        .map(|i| async move {
            let s = ["boefje", "normalizer", "report"][i % 3];
            if i % 4 == 3 {
                return app.pop(s, Some(2), None).await.status().as_u16();
            }
            // Every fifth push repeats the work of the push 15 before it (same scheduler), so
            // de-duplication runs too: a boost or a 409.
            let n = if i % 5 == 0 && i >= 15 { i - 15 } else { i };
            let body = match s {
                "boefje" => boefje_push("org1", &format!("b{n}"), None, 5 - (i % 5 == 0) as i64),
                "normalizer" => json!({"organisation": "org1", "priority": 5, "data": {
                    "normalizer": {"id": format!("n{n}")},
                    "raw_data": {"boefje_meta": {"id": format!("00000000-0000-4000-8000-{n:012}"), "organization": "org1"}}}}),
                _ => report_push("org1", &format!("r{n}"), 5),
            };
            app.push(s, &body).await.status().as_u16()
        })
        .buffer_unordered(48)
        .collect()
        .await;
    let failed: Vec<u16> = codes
        .iter()
        .copied()
        .filter(|c| !(200..300).contains(c) && *c != 409)
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {:?}",
        failed.len(),
        codes.len(),
        &failed[..failed.len().min(10)]
    );
    assert!(
        codes.contains(&409) || codes.contains(&200),
        "duplicates were exercised"
    );
}

crate::backend_tests!(
    eight_concurrent_poppers_get_each_of_2000_tasks_exactly_once_with_a_flush_per_commit,
    eight_concurrent_poppers_get_each_of_2000_tasks_exactly_once_with_the_flush_barrier,
    concurrent_pushes_and_pops_on_all_three_schedulers_all_succeed,
);
