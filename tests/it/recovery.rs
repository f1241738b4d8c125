//! Restart recovery: the heaps are rebuilt from the table, so queued work pops in the same
//! order after a restart, and pending work still flows back.

use chrono::Duration;
use serde_json::{Value, json};

use crate::helpers::*;

async fn tasks_queued_before_a_restart_pop_in_the_same_order_after_it(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let mut expected = Vec::new();
    for i in 0..40i64 {
        app.advance(Duration::seconds(if i % 3 == 0 { 1 } else { 7 }));
        let priority = [5, 1, 9, 5, 3][i as usize % 5];
        let t = app
            .push_ok(
                "boefje",
                &boefje_push("org1", &format!("b{i}"), None, priority),
            )
            .await;
        expected.push((
            priority,
            t["created_at"].as_str().unwrap().to_owned(),
            id_of(&t),
        ));
    }
    // Some work is already out, cancelled or re-prioritised before the restart.
    let first = app.pop_many("boefje", 3, None).await;
    let out: Vec<String> = first.iter().map(id_of).collect();
    let cancelled = expected[10].2.clone();
    assert_eq!(
        app.patch_task(&cancelled, &json!({"status": "cancelled"}))
            .await
            .status(),
        200
    );
    let boosted = expected[20].2.clone();
    let resp: Value = app
        .patch_task(&boosted, &json!({"priority": -1}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(resp["priority"], -1);
    for e in &mut expected {
        if e.2 == boosted {
            e.0 = -1;
        }
    }
    expected.sort();
    let expected: Vec<String> = expected
        .into_iter()
        .map(|(_, _, id)| id)
        .filter(|id| !out.contains(id) && *id != cancelled)
        .collect();

    let app = app.restart().await;
    let s: Value = app.get("/schedulers/boefje").await.json().await.unwrap();
    assert_eq!(s["qsize"], expected.len());
    let after: Vec<String> = app.pop_ids("boefje", 1000).await;
    assert_eq!(after, expected);
    // dispatched stays dispatched across the restart; nothing is handed out twice
    for id in out {
        assert_eq!(app.task(&id).await["status"], "dispatched");
    }
}

async fn pending_work_survives_a_restart_and_still_refills(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = 2).await else {
        return;
    };
    let mut ids = Vec::new();
    for (i, p) in [4, 2, 8, 6, 1].into_iter().enumerate() {
        ids.push((
            p,
            id_of(
                &app.push_ok("report", &report_push("org1", &format!("r{i}"), p))
                    .await,
            ),
        ));
    }
    let app = app.restart().await;
    let s: Value = app.get("/schedulers/report").await.json().await.unwrap();
    assert_eq!(
        (s["qsize"].as_u64(), s["pending"].as_u64()),
        (Some(2), Some(3))
    );
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(
            app.pop_ok("report", 1, None).await[0]["priority"]
                .as_i64()
                .unwrap(),
        );
    }
    // The user push (1) evicted the worst automatic task (4) at push time: the heap held 1 and 2.
    assert_eq!(order, vec![1, 2, 4, 6, 8]);
}

async fn a_lower_maxsize_after_a_restart_moves_the_excess_to_pending(backend: Backend) {
    let Some(mut app) = spawn_app(backend).await else {
        return;
    };
    for i in 0..6 {
        app.push_ok("report", &report_push("org1", &format!("r{i}"), 10 + i))
            .await;
    }
    app.settings.queue.maxsize = 4;
    let app = app.restart().await;
    let s: Value = app.get("/schedulers/report").await.json().await.unwrap();
    assert_eq!(
        (s["qsize"].as_u64(), s["pending"].as_u64()),
        (Some(4), Some(2))
    );
    // One pop takes what the heap holds and then the best of the backlog.
    let popped: Vec<i64> = app
        .pop_ok("report", 6, None)
        .await
        .iter()
        .map(|t| t["priority"].as_i64().unwrap())
        .collect();
    assert_eq!(popped, vec![10, 11, 12, 13, 14, 15]);
    assert!(app.pop_ok("report", 6, None).await.is_empty());
}

crate::backend_tests!(
    tasks_queued_before_a_restart_pop_in_the_same_order_after_it,
    pending_work_survives_a_restart_and_still_refills,
    a_lower_maxsize_after_a_restart_moves_the_excess_to_pending,
);
