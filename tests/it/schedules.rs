//! mula's schedules API as Rocky calls it (reference §2.2, §3.2): report schedules by cron or
//! deadline, listing and search, enabling, changing, deleting; with mula's codes and bodies.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

fn report_schedule(org: &str, recipe: &str, cron: Option<&str>, deadline: Option<&str>) -> Value {
    let mut body = json!({"scheduler_id": "report", "organisation": org,
        "data": {"organisation_id": org, "report_recipe_id": recipe, "type": "report"}});
    if let Some(c) = cron {
        body["schedule"] = json!(c);
    }
    if let Some(d) = deadline {
        body["deadline_at"] = json!(d);
    }
    body
}

async fn create(app: &TestApp, body: &Value) -> reqwest::Response {
    app.post("/schedules", Some(body)).await
}

async fn rocky_manages_report_schedules(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // Monthly on the last day at 10:00 UTC, no deadline: the next fire is the deadline.
    let resp = create(
        &app,
        &report_schedule("org1", "r1", Some("0 10 L * *"), None),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let s: Value = resp.json().await.unwrap();
    for key in [
        "id",
        "scheduler_id",
        "organisation",
        "hash",
        "data",
        "enabled",
        "schedule",
        "deadline_at",
        "created_at",
        "modified_at",
    ] {
        assert!(s.get(key).is_some(), "missing {key}");
    }
    assert_eq!(s["hash"], kat_scheduler::domain::hash::task_hash("r1-org1"));
    assert_eq!(s["enabled"], true);
    // The last day of a month at 10:00, after the test clock's now.
    let deadline: chrono::DateTime<chrono::Utc> =
        s["deadline_at"].as_str().unwrap().parse().unwrap();
    assert!(deadline > app.now());
    assert_eq!(deadline.format("%H:%M:%S").to_string(), "10:00:00");
    assert_eq!(
        (deadline + chrono::Duration::days(1))
            .format("%d")
            .to_string(),
        "01"
    );
    let id = s["id"].as_str().unwrap().to_owned();

    // A one-off report: a deadline and no cron.
    let once = create(
        &app,
        &report_schedule("org2", "r2", None, Some("2026-12-01")),
    )
    .await;
    assert_eq!(once.status(), StatusCode::CREATED);

    let page: Value = app
        .get("/schedules?scheduler_id=report&organisation=org1")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["count"], 1);
    assert_eq!(page["results"][0]["id"], json!(id));
    let all: Value = app.get("/schedules?limit=0").await.json().await.unwrap();
    assert_eq!(all["count"], 2);
    assert!(all["results"].as_array().unwrap().is_empty());
    // Rocky's search: its organisation and a recipe.
    let found: Value = app
        .post(
            "/schedules/search",
            Some(&json!({"filters": [
                {"column": "organisation", "operator": "==", "value": "org1"},
                {"column": "data", "field": "report_recipe_id", "operator": "==", "value": "r1"}]})),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(found["count"], 1);
    let due_soon: Value = app
        .post(
            "/schedules/search",
            Some(&json!({"filters": [{"column": "deadline_at", "operator": "<", "value": "2000-01-01T00:00:00Z"}]})),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(due_soon["count"], 0);
    let enabled: Value = app
        .post(
            "/schedules/search",
            Some(&json!({"filters": [{"column": "enabled", "operator": "==", "value": true}]})),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(enabled["count"], 2);

    // Disable, change the recurrence, run now, each as Rocky sends them.
    let path = format!("/schedules/{id}");
    let off: Value = app
        .patch(&path, &json!({"enabled": false}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(off["enabled"], false);
    let weekly: Value = app
        .patch(
            &path,
            &json!({"schedule": "0 10 * * 1", "deadline_at": "2026-11-23T10:00:00Z"}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(weekly["schedule"], "0 10 * * 1");
    assert!(
        weekly["deadline_at"]
            .as_str()
            .unwrap()
            .starts_with("2026-11-23T10:00:00")
    );
    let nothing = app.patch(&path, &json!({"unknown": 1})).await;
    assert_eq!(nothing.status(), StatusCode::BAD_REQUEST);
    assert!(detail(nothing).await.contains("no data to patch"));

    assert_eq!(app.delete(&path).await.status(), StatusCode::NO_CONTENT);
    assert_eq!(app.get(&path).await.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        app.delete(&path).await.status(),
        StatusCode::NO_CONTENT,
        "as mula: always 204"
    );
}

async fn bad_schedules_get_mulas_answers(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let neither = create(&app, &report_schedule("org1", "r1", None, None)).await;
    assert_eq!(neither.status(), StatusCode::BAD_REQUEST);
    assert!(
        detail(neither)
            .await
            .contains("Either deadline_at or schedule must be provided")
    );
    let bad_cron = create(
        &app,
        &report_schedule("org1", "r1", Some("61 * * * *"), None),
    )
    .await;
    assert_eq!(bad_cron.status(), StatusCode::BAD_REQUEST);
    assert!(
        detail(bad_cron)
            .await
            .starts_with("Validation error occurred: invalid cron expression")
    );
    assert_eq!(
        create(
            &app,
            &report_schedule("org1", "r1", Some("0 0 * * *"), None)
        )
        .await
        .status(),
        StatusCode::CREATED
    );
    let twice = create(
        &app,
        &report_schedule("org1", "r1", Some("0 1 * * *"), None),
    )
    .await;
    assert_eq!(twice.status(), StatusCode::CONFLICT);
    assert!(
        detail(twice)
            .await
            .contains("schedule with the same hash already exists")
    );
    let mut unknown = report_schedule("org1", "r9", Some("0 0 * * *"), None);
    unknown["scheduler_id"] = json!("bits");
    let unknown = create(&app, &unknown).await;
    assert_eq!(unknown.status(), StatusCode::BAD_REQUEST);
    assert!(detail(unknown).await.contains("Scheduler bits not found"));
    let mut extra = report_schedule("org1", "r8", Some("0 0 * * *"), None);
    extra["colour"] = json!("red");
    assert_eq!(
        create(&app, &extra).await.status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let mut misfit = report_schedule("org1", "r7", Some("0 0 * * *"), None);
    misfit["data"] = json!({"boefje": {"id": "dns"}});
    assert_eq!(
        create(&app, &misfit).await.status(),
        StatusCode::BAD_REQUEST
    );
    let bad_filter = app
        .post(
            "/schedules/search",
            Some(&json!({"filters": [{"column": "priority", "value": 1}]})),
        )
        .await;
    assert_eq!(bad_filter.status(), StatusCode::BAD_REQUEST);
    assert!(
        detail(bad_filter)
            .await
            .contains("unknown column 'priority'")
    );
    assert_eq!(
        app.post_raw("/schedules/search", "").await.status(),
        StatusCode::UNPROCESSABLE_ENTITY,
        "the filter body is required"
    );
    assert_eq!(
        app.get("/schedules/nope").await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.patch("/schedules/search", &json!({"enabled": true}))
            .await
            .status(),
        StatusCode::METHOD_NOT_ALLOWED
    );
    let mut bad_id = report_schedule("org1", "r6", Some("0 0 * * *"), None);
    bad_id["data"]["id"] = json!("AAA");
    assert_eq!(
        create(&app, &bad_id).await.status(),
        StatusCode::BAD_REQUEST
    );
}

crate::backend_tests!(
    rocky_manages_report_schedules,
    bad_schedules_get_mulas_answers,
);
