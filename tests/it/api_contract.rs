//! Each endpoint and each status code of mula's API (reference §2.2), plus this product's own.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

async fn root_answers_null(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let resp = app.get("/").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.json::<Value>().await.unwrap(), Value::Null);
}

async fn health_reports_the_database(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let resp = app.get("/health?externals=true").await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["service"], "scheduler");
    assert_eq!(body["healthy"], true);
    assert_eq!(body["additional"], Value::Null);
    assert_eq!(body["results"][0]["service"], "database");
    let want = if backend == Backend::Sqlite {
        "sqlite"
    } else {
        "postgresql"
    };
    assert_eq!(body["results"][0]["additional"]["backend"], want);
}

async fn schedulers_list_the_three_with_their_sizes(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.push_ok(
        "normalizer",
        &normalizer_push("org1", "kat_dns_normalize", 3),
    )
    .await;
    let body: Value = app.get("/schedulers").await.json().await.unwrap();
    let list = body.as_array().unwrap();
    let ids: Vec<&str> = list.iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["boefje", "normalizer", "report"]);
    assert_eq!(list[1]["item_type"], "NormalizerTask");
    assert_eq!(list[1]["type"], "normalizer");
    assert_eq!(list[1]["qsize"], 1);
    assert_eq!(list[0]["qsize"], 0);
    assert!(list[1]["last_activity"].is_string());
    assert_eq!(list[0]["last_activity"], Value::Null);

    let resp = app.get("/schedulers/report").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["item_type"],
        "ReportTask"
    );

    let resp = app.get("/schedulers/boefje-org1").await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        detail(resp).await,
        "Resource not found: Scheduler boefje-org1 not found"
    );
}

async fn a_pushed_task_carries_every_key_and_its_hash(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let task = app
        .push_ok(
            "boefje",
            &boefje_push(
                "org1",
                "dns-records",
                Some("Hostname|internet|example.com"),
                7,
            ),
        )
        .await;
    for key in TASK_KEYS {
        assert!(task.get(key).is_some(), "missing key {key} in {task}");
    }
    assert_eq!(task["data"]["id"], task["id"]);
    assert_eq!(task["status"], "queued");
    assert_eq!(task["type"], "boefje");
    assert_eq!(task["scheduler_id"], "boefje");
    assert_eq!(task["priority"], 7);
    assert_eq!(task["hash"], "74956880324db1838156e1ebf7847448");
    assert!(task["created_at"].as_str().unwrap().ends_with('Z'));
    // GET returns the same task.
    assert_eq!(app.task(&id_of(&task)).await, task);
}

async fn each_scheduler_hashes_its_own_payload(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let n = app
        .push_ok(
            "normalizer",
            &normalizer_push("org1", "kat_dns_normalize", 3),
        )
        .await;
    let meta = n["data"]["raw_data"]["boefje_meta"]["id"].as_str().unwrap();
    assert_eq!(
        n["hash"],
        kat_scheduler::domain::hash::task_hash(&format!("kat_dns_normalize-{meta}-org1"))
    );
    let r = app
        .push_ok("report", &report_push("org1", "recipe-1", 3))
        .await;
    assert_eq!(
        r["hash"],
        kat_scheduler::domain::hash::task_hash("recipe-1-org1")
    );
    assert_eq!(r["data"]["id"], r["id"]);
}

async fn push_errors_have_mulas_status_codes(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let good = boefje_push("org1", "dns-records", None, 3);

    let resp = app.push("nope", &good).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);

    let mut wrong = good.clone();
    wrong["scheduler_id"] = json!("normalizer");
    let resp = app.push("boefje", &wrong).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(
        detail(resp)
            .await
            .contains("scheduler_id in item does not match")
    );

    let resp = app
        .push(
            "boefje",
            &json!({"organisation": "org1", "priority": 3, "data": {"organization": "org1"}}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        detail(resp).await,
        "Bad request error occurred: malformed item: data.boefje: required"
    );

    let mut zero = good.clone();
    zero["priority"] = json!(0);
    let resp = app.push("boefje", &zero).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(
        detail(resp)
            .await
            .contains("priority: 0 is not a valid priority")
    );

    let mut extra = good.clone();
    extra["colour"] = json!("red");
    let resp = app.push("boefje", &extra).await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["detail"][0]["msg"]
            .as_str()
            .unwrap()
            .contains("unknown field `colour`")
    );

    let mut typed = good.clone();
    typed["priority"] = json!("high");
    let resp = app.push("boefje", &typed).await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["detail"][0]["loc"], json!(["body", "priority"]));

    let resp = app
        .post_raw("/schedulers/boefje/push", "{\"organisation\": ")
        .await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["detail"][0]["type"], "json_invalid");

    let resp = app.post_raw("/schedulers/boefje/push", "").await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);

    let mut bad_id = good.clone();
    bad_id["id"] = json!("not-a-uuid");
    let resp = app.push("boefje", &bad_id).await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);

    app.push_ok("boefje", &good).await;
    let resp = app.push("boefje", &good).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(resp.headers()["retry-after"], "60");
    assert!(
        detail(resp)
            .await
            .starts_with("Conflict error occurred: a task with the same hash is already queued")
    );
}

async fn an_oversized_body_is_refused_with_413(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.api.max_body_bytes = 1024).await else {
        return;
    };
    let mut big = boefje_push("org1", "dns-records", None, 3);
    big["data"]["padding"] = json!("x".repeat(4096));
    let resp = app.push("boefje", &big).await;
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let schedulers: Value = app.get("/schedulers/boefje").await.json().await.unwrap();
    assert_eq!(schedulers["qsize"], 0);
}

async fn pop_answers_dispatched_tasks_and_empty_results(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let resp = app.pop("boefje", None, None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.json::<Value>().await.unwrap(), json!({"results": []}));

    let pushed = app
        .push_ok("boefje", &boefje_push("org1", "dns-records", None, 3))
        .await;
    let popped = app.pop_ok("boefje", 1, None).await;
    assert_eq!(popped.len(), 1);
    assert_eq!(popped[0]["id"], pushed["id"]);
    assert_eq!(popped[0]["status"], "dispatched");
    assert_eq!(app.task(&id_of(&pushed)).await["status"], "dispatched");

    assert_eq!(
        app.pop("report-org1", None, None).await.status(),
        StatusCode::NOT_FOUND
    );
    let resp = app.pop("boefje", Some(0), None).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(
        detail(resp)
            .await
            .contains("limit must be between 1 and 1000")
    );
    let resp = app.post("/schedulers/boefje/pop?limit=many", None).await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let resp = app.post_raw("/schedulers/boefje/pop", "{not json").await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let resp = app
        .pop(
            "boefje",
            Some(1),
            Some(&json!({"filters": [{"column": "colour", "value": "red"}]})),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(detail(resp).await.contains("unknown column 'colour'"));
}

async fn a_pop_limit_returns_that_many_tasks(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    for i in 0..5 {
        app.push_ok("report", &report_push("org1", &format!("r{i}"), 10))
            .await;
    }
    assert_eq!(app.pop_ok("report", 3, None).await.len(), 3);
    assert_eq!(app.pop_ok("report", 3, None).await.len(), 2);
    assert_eq!(app.pop_ok("report", 3, None).await.len(), 0);
}

async fn get_task_answers_404_and_422(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let id = uuid::Uuid::new_v4();
    let resp = app.get_task(&id.to_string()).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        detail(resp).await,
        format!("Resource not found: task not found, by task_id: {id}")
    );
    let resp = app.get_task("12345").await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["detail"][0]["loc"], json!(["path", "task_id"]));
}

async fn patch_follows_the_state_machine(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let task = app
        .push_ok("boefje", &boefje_push("org1", "dns-records", None, 3))
        .await;
    let id = id_of(&task);

    let resp = app.patch_task(&id, &json!({"status": "completed"})).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(
        detail(resp).await,
        "Conflict error occurred: a task cannot move from status 'queued' to 'completed'"
    );

    app.pop_ok("boefje", 1, None).await;
    let resp = app.patch_task(&id, &json!({"status": "running"})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let running: Value = resp.json().await.unwrap();
    assert_eq!(running["status"], "running");
    assert!(running["modified_at"].as_str() >= task["modified_at"].as_str());

    let resp = app.patch_task(&id, &json!({"status": "completed"})).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = app.patch_task(&id, &json!({"status": "failed"})).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert!(
        detail(resp)
            .await
            .contains("from status 'completed' to 'failed'")
    );
    assert_eq!(app.task(&id).await["status"], "completed");

    let resp = app.patch_task(&id, &json!({})).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(detail(resp).await.contains("no data to patch"));
    let resp = app.patch_task(&id, &json!({"status": "done"})).await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let resp = app
        .patch_task(
            &uuid::Uuid::new_v4().to_string(),
            &json!({"status": "running"}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let resp = app.patch_task("x", &json!({"status": "running"})).await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

async fn a_queued_task_can_be_cancelled_and_is_not_popped(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let task = app
        .push_ok("boefje", &boefje_push("org1", "dns-records", None, 3))
        .await;
    let resp = app
        .patch_task(&id_of(&task), &json!({"status": "cancelled"}))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(app.pop_ok("boefje", 1, None).await.is_empty());
    let s: Value = app.get("/schedulers/boefje").await.json().await.unwrap();
    assert_eq!(s["qsize"], 0);
}

async fn a_priority_patch_reorders_the_queue(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let first = app
        .push_ok("boefje", &boefje_push("org1", "a", None, 10))
        .await;
    let second = app
        .push_ok("boefje", &boefje_push("org1", "b", None, 20))
        .await;
    let resp = app
        .patch_task(&id_of(&second), &json!({"priority": 2}))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let popped = app.pop_many("boefje", 2, None).await;
    assert_eq!(popped[0]["id"], second["id"]);
    assert_eq!(popped[1]["id"], first["id"]);
}

async fn task_listing_paginates_like_mula(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let mut ids = Vec::new();
    for i in 0..5 {
        app.advance(chrono::Duration::seconds(1));
        ids.push(id_of(
            &app.push_ok("report", &report_push("org1", &format!("r{i}"), 5))
                .await,
        ));
    }
    // limit=0 gives the count only
    let body: Value = app.get("/tasks?limit=0").await.json().await.unwrap();
    assert_eq!(body["count"], 5);
    assert_eq!(body["results"], json!([]));

    let body: Value = app
        .get("/tasks?limit=2&offset=0&scheduler_id=report")
        .await
        .json()
        .await
        .unwrap();
    let page: Vec<&str> = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(page, [ids[4].as_str(), ids[3].as_str()], "newest first");
    let next = body["next"].as_str().unwrap();
    assert!(
        next.starts_with(&app.address)
            && next.contains("offset=2")
            && next.contains("scheduler_id=report"),
        "{next}"
    );
    assert_eq!(body["previous"], Value::Null);

    let body: Value = app
        .get("/tasks?limit=2&offset=4")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["results"].as_array().unwrap().len(), 1);
    assert_eq!(body["next"], Value::Null);
    assert!(body["previous"].as_str().unwrap().contains("offset=2"));

    // query filters
    let body: Value = app
        .get("/tasks?organisation=org2")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["count"], 0);
    let body: Value = app
        .get("/tasks?status=queued&task_type=report")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(body["count"], 5);
    let min = (app.now() - chrono::Duration::milliseconds(2500)).to_rfc3339();
    let body: Value = app
        .get(&format!("/tasks?min_created_at={}", urlencode(&min)))
        .await
        .json()
        .await
        .unwrap();
    // created at +3 s, +4 s and +5 s
    assert_eq!(body["count"], 3);
    // unknown parameters (Rocky sends some) are ignored
    assert_eq!(
        app.get("/tasks?input_ooi=x&plugin_id=y").await.status(),
        StatusCode::OK
    );
}

fn urlencode(s: &str) -> String {
    s.replace('+', "%2B").replace(':', "%3A")
}

async fn task_listing_rejects_bad_parameters(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // A window that ends before it starts is empty (mula answers 400; the API document cannot
    // say one parameter must not exceed another).
    let resp = app
        .get("/tasks?min_created_at=2025-02-01&max_created_at=2025-01-01")
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.json::<serde_json::Value>().await.unwrap()["count"], 0);
    // Rocky's task filter sends equal dates when From = To.
    let resp = app
        .get("/tasks?min_created_at=2025-01-31&max_created_at=2025-01-31")
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = app.get("/tasks?limit=ten").await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let resp = app.get("/tasks?limit=5000").await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let resp = app.get("/tasks?status=finished").await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(detail(resp).await.contains("status 'finished' is unknown"));
    let resp = app.get("/tasks?min_created_at=yesterday").await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let resp = app
        .search_tasks(
            "",
            Some(&json!({"filters": [{"column": "status", "operator": "~", "value": "x"}]})),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(detail(resp).await.contains("unknown operator '~'"));
}

async fn stats_count_tasks_per_hour_and_status(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.push_ok("boefje", &boefje_push("org1", "a", None, 3))
        .await;
    app.push_ok("boefje", &boefje_push("org2", "a", None, 3))
        .await;
    app.push_ok("report", &report_push("org1", "r", 3)).await;
    app.pop_ok("boefje", 1, None).await;

    let body: Value = app.get("/tasks/stats").await.json().await.unwrap();
    let hours = body.as_object().unwrap();
    assert_eq!(hours.len(), 1);
    let (hour, counts) = hours.iter().next().unwrap();
    assert!(hour.ends_with(":00:00+00:00"), "{hour}");
    assert_eq!(counts["queued"], 2);
    assert_eq!(counts["dispatched"], 1);
    assert_eq!(counts["total"], 3);

    let body: Value = app
        .get("/tasks/stats?scheduler_id=boefje&organisation_id=org2")
        .await
        .json()
        .await
        .unwrap();
    let counts = body.as_object().unwrap().values().next().unwrap().clone();
    assert_eq!(counts["total"], 1);

    // tasks modified more than a day ago drop out
    app.advance(chrono::Duration::hours(25));
    let body: Value = app.get("/tasks/stats").await.json().await.unwrap();
    assert_eq!(body, json!({}));
}

async fn unknown_paths_are_json_404s(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let resp = app.get("/queues").await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(detail(resp).await, "Not Found");
}

async fn docs_and_openapi_are_served_offline(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let resp = app.get("/openapi.json").await;
    assert_eq!(resp.status(), StatusCode::OK);
    let spec: Value = resp.json().await.unwrap();
    assert!(spec["paths"]["/schedulers/{scheduler_id}/pop"]["post"].is_object());
    let resp = app.get("/docs/").await;
    assert_eq!(resp.status(), StatusCode::OK);
    let html = resp.text().await.unwrap();
    assert!(html.contains("swagger-ui"));
    assert!(
        !html.contains("cdn") && !html.contains("unpkg"),
        "the docs page must not load from a CDN"
    );
    let init = app
        .get("/docs/swagger-initializer.js")
        .await
        .text()
        .await
        .unwrap();
    assert!(init.contains("/openapi.json"));
    assert_eq!(
        app.get("/docs/swagger-ui-bundle.js").await.status(),
        StatusCode::OK
    );
}

async fn metrics_expose_queue_sizes(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.push_ok("report", &report_push("org1", "r", 3)).await;
    let text = app.get("/metrics").await.text().await.unwrap();
    assert!(
        text.contains("scheduler_qsize{scheduler_id=\"report\"} 1"),
        "{text}"
    );
    assert!(text.contains("scheduler_qsize{scheduler_id=\"boefje\"} 0"));
}

crate::backend_tests!(
    root_answers_null,
    health_reports_the_database,
    schedulers_list_the_three_with_their_sizes,
    a_pushed_task_carries_every_key_and_its_hash,
    each_scheduler_hashes_its_own_payload,
    push_errors_have_mulas_status_codes,
    an_oversized_body_is_refused_with_413,
    pop_answers_dispatched_tasks_and_empty_results,
    a_pop_limit_returns_that_many_tasks,
    get_task_answers_404_and_422,
    patch_follows_the_state_machine,
    a_queued_task_can_be_cancelled_and_is_not_popped,
    a_priority_patch_reorders_the_queue,
    task_listing_paginates_like_mula,
    task_listing_rejects_bad_parameters,
    stats_count_tasks_per_hour_and_status,
    unknown_paths_are_json_404s,
    docs_and_openapi_are_served_offline,
    metrics_expose_queue_sizes,
);
