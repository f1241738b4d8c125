//! The real clients' call sequences (reference §3), written from their descriptions: the boefje
//! and normalizer runtime, Rocky, and Rocky's report runner.

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::*;

/// What the runtime's pydantic model insists on (reference §3.1): every key present, `priority`
/// and `type` non-null, `data.id == id`, a non-empty `data.boefje.id` for boefje tasks.
fn assert_runtime_can_parse(task: &Value) {
    for key in TASK_KEYS {
        assert!(task.get(key).is_some(), "missing {key}");
    }
    assert!(Uuid::parse_str(task["id"].as_str().unwrap()).is_ok());
    assert!(task["priority"].is_i64());
    assert!(task["type"].is_string());
    assert_eq!(task["data"]["id"], task["id"]);
    if task["type"] == "boefje" {
        assert!(!task["data"]["boefje"]["id"].as_str().unwrap().is_empty());
    }
}

async fn the_boefje_runner_loop_pops_runs_and_completes_a_task(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let image = "ghcr.io/minvws/openkat/nmap:latest";
    app.push_ok(
        "boefje",
        &boefje_push("org1", "dns-records", Some("Hostname|internet|a.nl"), 1),
    )
    .await;
    let nmap = app
        .push_ok(
            "boefje",
            &boefje_push("org1", "nmap", Some("IPAddressV4|internet|10.0.0.1"), 5),
        )
        .await;

    // BOEFJES_IMAGES set: pop limit=1 with the image filter.
    let images = json!({"filters": [{"column": "data", "field": "boefje__oci_image", "operator": "in", "value": [image]}]});
    let popped = app.pop_ok("boefje", 1, Some(&images)).await;
    assert_eq!(popped.len(), 1);
    let task = &popped[0];
    assert_runtime_can_parse(task);
    assert_eq!(task["id"], nmap["id"], "only the runner's own image");
    let id = id_of(task);

    // worker process: PATCH running → run → GET → still running → PATCH completed
    let resp = app.patch_task(&id, &json!({"status": "running"})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let current = app.task(&id).await;
    assert_runtime_can_parse(&current);
    assert_eq!(current["status"], "running");
    let resp = app.patch_task(&id, &json!({"status": "completed"})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(app.task(&id).await["status"], "completed");

    // Nothing left for this image: empty results, the runner sleeps.
    assert!(app.pop_ok("boefje", 1, Some(&images)).await.is_empty());
}

async fn the_runtime_fails_tasks_it_cannot_run_and_gives_back_buffered_ones(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    for name in ["a", "b", "c"] {
        app.push_ok(
            "boefje",
            &boefje_push("org1", name, Some("Hostname|internet|a.nl"), 3),
        )
        .await;
    }
    let hydration_failed = app.pop_ok("boefje", 1, None).await.remove(0);
    let crashed = app.pop_ok("boefje", 1, None).await.remove(0);
    let buffered = app.pop_ok("boefje", 1, None).await.remove(0);

    // OOI gone during hydration: PATCH failed straight from dispatched.
    let resp = app
        .patch_task(&id_of(&hydration_failed), &json!({"status": "failed"}))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);

    // Crashed worker: GET; dispatched or running → PATCH failed.
    app.patch_task(&id_of(&crashed), &json!({"status": "running"}))
        .await;
    let status = app.task(&id_of(&crashed)).await["status"].clone();
    assert!(status == "dispatched" || status == "running");
    assert_eq!(
        app.patch_task(&id_of(&crashed), &json!({"status": "failed"}))
            .await
            .status(),
        StatusCode::OK
    );

    // SIGTERM: the locally buffered task is pushed back as the full task JSON.
    let resp = app.push("boefje", &buffered).await;
    assert!(resp.status().is_success(), "re-push accepted, not 422");
    assert_eq!(app.task(&id_of(&buffered)).await["status"], "queued");
    assert_eq!(app.pop_ok("boefje", 1, None).await[0]["id"], buffered["id"]);
}

async fn the_normalizer_runtime_pops_its_own_queue(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.push_ok("boefje", &boefje_push("org1", "dns-records", None, 1))
        .await;
    let n = app
        .push_ok(
            "normalizer",
            &normalizer_push("org1", "kat_dns_normalize", 1700000000),
        )
        .await;
    let popped = app.pop_ok("normalizer", 1, None).await;
    assert_eq!(popped.len(), 1);
    assert_runtime_can_parse(&popped[0]);
    assert_eq!(popped[0]["id"], n["id"]);
    assert_eq!(
        popped[0]["data"]["raw_data"]["boefje_meta"]["organization"],
        "org1"
    );
    let id = id_of(&popped[0]);
    assert_eq!(
        app.patch_task(&id, &json!({"status": "running"}))
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        app.patch_task(&id, &json!({"status": "completed"}))
            .await
            .status(),
        StatusCode::OK
    );
}

async fn rocky_pushes_user_scans_lists_filters_and_reads_stats(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // Automatic work already queued.
    for i in 0..3 {
        app.push_ok(
            "boefje",
            &boefje_push(
                "org1",
                &format!("auto-{i}"),
                Some("Hostname|internet|a.nl"),
                50,
            ),
        )
        .await;
    }
    // "Run boefje": TaskPush dumped with nulls excluded, priority 1, an extra `type` in data.
    let id = Uuid::new_v4().to_string();
    let rocky = json!({
        "id": id,
        "scheduler_id": "boefje",
        "organisation": "org1",
        "priority": 1,
        "data": {
            "type": "boefje",
            "id": id,
            "boefje": {"id": "dns-records", "name": "DNS records", "version": "1.0", "oci_image": "ghcr.io/minvws/openkat/dns:latest"},
            "input_ooi": "Hostname|internet|example.com",
            "organization": "org1"
        }
    });
    let resp = app.push("boefje", &rocky).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let created: Value = resp.json().await.unwrap();
    assert_eq!(created["id"], json!(id));
    // The same scan again: "Your task is already in queue" (409).
    let mut again = rocky.clone();
    let other = Uuid::new_v4().to_string();
    again["id"] = json!(other);
    again["data"]["id"] = json!(other);
    assert_eq!(
        app.push("boefje", &again).await.status(),
        StatusCode::CONFLICT
    );
    // "Run normalizer" from Rocky.
    let mut normalizer = normalizer_push("org1", "kat_dns_normalize", 1);
    normalizer["scheduler_id"] = json!("normalizer");
    normalizer["data"]["type"] = json!("normalizer");
    assert_eq!(
        app.push("normalizer", &normalizer).await.status(),
        StatusCode::CREATED
    );

    // Task list: first limit=0 for the count, then pages, with the org filter.
    let org = json!({"filters": [{"column": "organisation", "operator": "==", "value": "org1"}]});
    let count: Value = app
        .search_tasks(
            "scheduler_id=boefje&task_type=boefje&limit=0&offset=0&input_ooi=x",
            Some(&org),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(count["count"], 4);
    let page: Value = app
        .search_tasks(
            "scheduler_id=boefje&task_type=boefje&limit=500&offset=0",
            Some(&org),
        )
        .await
        .json()
        .await
        .unwrap();
    let results = page["results"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    assert_eq!(results[0]["id"], json!(id), "newest first");
    for t in results {
        assert_runtime_can_parse(t);
    }
    // OOI page and plugin page filters; the all-organisations view uses `in`.
    let ooi = json!({"filters": [
        {"column": "organisation", "operator": "==", "value": "org1"},
        {"column": "data", "field": "input_ooi", "operator": "==", "value": "Hostname|internet|example.com"}
    ]});
    assert_eq!(app.matching_ids(&ooi).await, vec![id.clone()]);
    let plugin = json!({"filters": [{"column": "data", "field": "boefje__id", "operator": "==", "value": "dns-records"}]});
    assert_eq!(app.matching_ids(&plugin).await, vec![id.clone()]);
    let all_orgs = json!({"filters": [{"column": "organisation", "operator": "in", "value": ["org1", "org9"]}]});
    assert_eq!(app.matching_ids(&all_orgs).await.len(), 5);

    // The user scan is first in line.
    assert_eq!(app.pop_ok("boefje", 1, None).await[0]["id"], json!(id));

    // Task detail and statistics.
    assert_eq!(app.task(&id).await["organisation"], "org1");
    let stats: Value = app
        .get("/tasks/stats?scheduler_id=boefje&organisation_id=org1")
        .await
        .json()
        .await
        .unwrap();
    let hour = stats.as_object().unwrap().values().next().unwrap();
    assert_eq!(
        (
            hour["queued"].as_i64(),
            hour["dispatched"].as_i64(),
            hour["total"].as_i64()
        ),
        (Some(3), Some(1), Some(4))
    );
}

async fn the_report_runner_runs_a_report_task(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let pushed = app
        .push_ok("report", &report_push("org1", "recipe-1", 1700000000))
        .await;
    let popped = app.pop_ok("report", 1, None).await;
    assert_eq!(popped[0]["id"], pushed["id"]);
    assert_eq!(popped[0]["data"]["report_recipe_id"], "recipe-1");
    let id = id_of(&pushed);
    assert_eq!(
        app.patch_task(&id, &json!({"status": "running"}))
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(app.task(&id).await["status"], "running");
    assert_eq!(
        app.patch_task(&id, &json!({"status": "completed"}))
            .await
            .status(),
        StatusCode::OK
    );
}

crate::backend_tests!(
    the_boefje_runner_loop_pops_runs_and_completes_a_task,
    the_runtime_fails_tasks_it_cannot_run_and_gives_back_buffered_ones,
    the_normalizer_runtime_pops_its_own_queue,
    rocky_pushes_user_scans_lists_filters_and_reads_stats,
    the_report_runner_runs_a_report_task,
);
