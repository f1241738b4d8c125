//! Optional bearer tokens: without one 401, out of scope 403, and each role does its own work.

use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::helpers::*;

const TOKENS: &str =
    "runner@boefje=boefje-runner; runner@normalizer=normalizer-runner; webapp=rocky; admin=ops";

async fn call(
    app: &TestApp,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Response {
    let mut req = app.client.request(method, format!("{}{path}", app.address));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(b);
    }
    req.send().await.unwrap()
}

async fn without_a_valid_token_everything_but_probes_is_401(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.auth.spec = TOKENS.into()).await else {
        return;
    };
    for (method, path) in [
        (Method::POST, "/schedulers/boefje/pop"),
        (Method::POST, "/schedulers/boefje/push"),
        (Method::GET, "/tasks"),
        (Method::GET, "/schedulers"),
    ] {
        for token in [None, Some("wrong")] {
            let resp = call(&app, method.clone(), path, token, None).await;
            assert_eq!(
                resp.status(),
                StatusCode::UNAUTHORIZED,
                "{method} {path} {token:?}"
            );
            assert_eq!(resp.headers()["www-authenticate"], "Bearer");
        }
    }
    for path in ["/livez", "/health", "/metrics", "/openapi.json"] {
        assert_eq!(
            call(&app, Method::GET, path, None, None).await.status(),
            StatusCode::OK,
            "{path}"
        );
    }
}

async fn each_role_does_its_own_work_and_no_more(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.auth.spec = TOKENS.into()).await else {
        return;
    };
    let push = boefje_push("org1", "dns-records", Some("Hostname|internet|a.nl"), 1);
    // Runners do not push; the webapp does.
    let resp = call(
        &app,
        Method::POST,
        "/schedulers/boefje/push",
        Some("boefje-runner"),
        Some(&push),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = call(
        &app,
        Method::POST,
        "/schedulers/boefje/push",
        Some("rocky"),
        Some(&push),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    // A normalizer runner cannot pop boefje tasks; the webapp cannot pop at all.
    for token in ["normalizer-runner", "rocky"] {
        let resp = call(
            &app,
            Method::POST,
            "/schedulers/boefje/pop",
            Some(token),
            None,
        )
        .await;
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{token}");
        assert!(detail(resp).await.starts_with("Forbidden:"));
    }
    let resp = call(
        &app,
        Method::POST,
        "/schedulers/boefje/pop",
        Some("boefje-runner"),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let popped: Value = resp.json().await.unwrap();
    let id = id_of(&popped["results"][0]);
    // Only the boefje runner (or an admin) reads and patches it.
    let task_path = format!("/tasks/{id}");
    let running = json!({"status": "running"});
    let resp = call(
        &app,
        Method::PATCH,
        &task_path,
        Some("normalizer-runner"),
        Some(&running),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = call(
        &app,
        Method::GET,
        &task_path,
        Some("normalizer-runner"),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = call(
        &app,
        Method::PATCH,
        &task_path,
        Some("boefje-runner"),
        Some(&running),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = call(&app, Method::GET, &task_path, Some("boefje-runner"), None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    // Listings: a runner only its own scheduler's; the webapp all of them.
    let resp = call(&app, Method::GET, "/tasks", Some("boefje-runner"), None).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = call(
        &app,
        Method::GET,
        "/tasks?scheduler_id=boefje",
        Some("boefje-runner"),
        None,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = call(&app, Method::GET, "/tasks", Some("rocky"), None).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = call(
        &app,
        Method::PATCH,
        &task_path,
        Some("ops"),
        Some(&json!({"status": "completed"})),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
}

async fn without_tokens_the_service_is_open(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let resp = call(&app, Method::POST, "/schedulers/boefje/pop", None, None).await;
    assert_eq!(resp.status(), StatusCode::OK);
}

crate::backend_tests!(
    without_a_valid_token_everything_but_probes_is_401,
    each_role_does_its_own_work_and_no_more,
    without_tokens_the_service_is_open,
);
