//! Inputs a hostile or broken client sends: each gets a 4xx naming what is wrong, on both
//! databases alike, and none of them disturbs the requests of others.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::*;

fn image_in(n: usize) -> Value {
    let values: Vec<String> = (0..n).map(|i| format!("i{i}")).collect();
    json!({"filters": [{"column": "data", "field": "boefje__oci_image", "operator": "in", "value": values}]})
}

async fn huge_in_lists_and_many_conditions_are_refused_by_name(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    for n in [40_000, 70_000] {
        let resp = app.pop("boefje", Some(1), Some(&image_in(n))).await;
        assert_eq!(
            resp.status(),
            StatusCode::BAD_REQUEST,
            "pop with {n} values"
        );
        assert!(detail(resp).await.contains("max_in_values"));
        let resp = app.search_tasks("", Some(&image_in(n))).await;
        assert_eq!(
            resp.status(),
            StatusCode::BAD_REQUEST,
            "listing with {n} values"
        );
    }
    let many: Vec<Value> = (0..999)
        .map(|i| json!({"column": "organisation", "operator": "!=", "value": format!("o{i}")}))
        .collect();
    let resp = app
        .search_tasks("", Some(&json!({ "filters": many })))
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(detail(resp).await.contains("max_filter_conditions"));
    let mut deep = json!({"column": "organisation", "value": "x"});
    for _ in 0..40 {
        deep = json!({"not": [deep]});
    }
    let resp = app
        .search_tasks("", Some(&json!({ "filters": deep })))
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(detail(resp).await.contains("max_filter_depth"));
}

async fn nul_characters_are_refused_everywhere(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let mut body = boefje_push("org1", "dns-records", Some("Hostname|internet|a.nl"), 5);
    body["data"]["note"] = json!("a\u{0}b");
    let resp = app.push("boefje", &body).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(detail(resp).await.contains("NUL"));
    for path in [
        "/tasks?organisation=%00",
        "/tasks/stats?scheduler_id=%00",
        "/tasks?organisation=a%00b",
    ] {
        let resp = app.get(path).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{path}");
        assert!(detail(resp).await.contains("NUL"), "{path}");
    }
    let filter = json!({"filters": [{"column": "data", "field": "boefje__id", "value": "x\u{0}"}]});
    let resp = app.pop("boefje", Some(1), Some(&filter)).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    // Nothing was stored, and a runner's data filter still works.
    app.push_ok("boefje", &boefje_push("org1", "nmap", Some("h"), 5))
        .await;
    let runner = json!({"filters": [{"column": "data", "field": "boefje__oci_image", "operator": "in",
        "value": ["ghcr.io/minvws/openkat/nmap:latest"]}]});
    assert_eq!(app.pop_ok("boefje", 1, Some(&runner)).await.len(), 1);
    assert_eq!(app.matching_ids(&json!({"filters": []})).await.len(), 1);
}

async fn overlong_strings_are_refused_before_they_reach_an_index(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = 1).await else {
        return;
    };
    let long = "o".repeat(3_000);
    let resp = app
        .push("boefje", &boefje_push(&long, "dns-records", None, 5))
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(detail(resp).await.contains("organisation"));
    // A key field of the payload, which the pending backlog indexes. (An object's reference
    // may be longer: see `pending_backlog`.)
    app.push_ok("boefje", &boefje_push("org1", "a", Some("h"), 5))
        .await;
    let resp = app
        .push("boefje", &boefje_push("org1", &long, Some("h2"), 9))
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(detail(resp).await.contains("plugin_id"));
    let resp = app.get(&format!("/tasks?organisation={long}")).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

async fn listing_windows_are_bounded(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let resp = app.get(&format!("/tasks?offset={}", i64::MAX)).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(detail(resp).await.contains("max_offset"));
    app.push_ok("report", &report_push("org1", "r1", 5)).await;
    let page: Value = app
        .get("/tasks?offset=100000000&limit=1000")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["next"], Value::Null);
    assert!(
        page["previous"]
            .as_str()
            .is_some_and(|p| !p.contains("offset=-")),
        "{page}"
    );
}

async fn wrong_methods_on_known_paths_are_405(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    for (method, path, allow) in [
        ("TRACE", "/tasks", "GET, POST"),
        (
            "PUT",
            "/tasks/00000000-0000-0000-0000-000000000000",
            "GET, PATCH",
        ),
        ("GET", "/schedulers/boefje/pop", "POST"),
    ] {
        let resp = app
            .client
            .request(method.parse().unwrap(), format!("{}{path}", app.address))
            .send()
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        assert_eq!(resp.headers()["allow"], allow);
    }
    assert_eq!(app.get("/nowhere").await.status(), StatusCode::NOT_FOUND);
}

async fn a_body_sent_a_byte_at_a_time_is_cut_off(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.api.body_timeout_secs = 1).await else {
        return;
    };
    let addr = app.address.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stream
        .write_all(
            b"POST /schedulers/boefje/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        )
        .await
        .unwrap();
    // The server answers without the rest of the body, once its deadline has passed.
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut answer))
        .await
        .expect("the server answers a stalled body")
        .unwrap();
    let head = String::from_utf8_lossy(&answer[..n]);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    // Others are served all along.
    assert_eq!(app.get("/livez").await.status(), StatusCode::OK);
}

async fn hostile_requests_do_not_starve_valid_ones(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let app = std::sync::Arc::new(app);
    let mut hostile = Vec::new();
    for _ in 0..2 {
        let app = app.clone();
        hostile.push(tokio::spawn(async move {
            let mut refused = 0;
            for _ in 0..20 {
                let resp = app.pop("boefje", Some(1), Some(&image_in(70_000))).await;
                refused += usize::from(resp.status() == StatusCode::BAD_REQUEST);
            }
            refused
        }));
    }
    let mut ok = 0;
    for i in 0..150 {
        let resp = app
            .push(
                "boefje",
                &boefje_push("org1", "nmap", Some(&format!("h{i}")), 5),
            )
            .await;
        ok += usize::from(resp.status() == StatusCode::CREATED);
        let resp = app.pop("boefje", Some(1), None).await;
        ok += usize::from(resp.status() == StatusCode::OK);
    }
    for h in hostile {
        assert_eq!(h.await.unwrap(), 20);
    }
    assert_eq!(ok, 300, "every valid push and pop succeeded");
}

crate::backend_tests!(
    huge_in_lists_and_many_conditions_are_refused_by_name,
    nul_characters_are_refused_everywhere,
    overlong_strings_are_refused_before_they_reach_an_index,
    listing_windows_are_bounded,
    wrong_methods_on_known_paths_are_405,
    a_body_sent_a_byte_at_a_time_is_cut_off,
    hostile_requests_do_not_starve_valid_ones,
);
