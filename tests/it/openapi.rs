//! The committed OpenAPI document is the one the code generates.

use std::path::Path;

#[test]
fn the_committed_openapi_document_matches_the_code() {
    let generated = kat_scheduler::api::openapi_json().expect("renders");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi/openapi.json");
    if std::env::var("UPDATE_OPENAPI").is_ok() {
        std::fs::write(&path, &generated).expect("write openapi/openapi.json");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi/openapi.json differs from the code; regenerate it with \
         `cargo run -- openapi > openapi/openapi.json` (or UPDATE_OPENAPI=1 cargo test) and commit it"
    );
}

#[test]
fn every_operation_is_documented_with_an_operation_id_and_responses() {
    let spec: serde_json::Value =
        serde_json::from_str(&kat_scheduler::api::openapi_json().unwrap()).unwrap();
    let paths = spec["paths"].as_object().unwrap();
    let mut operations = 0;
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            operations += 1;
            assert!(op["operationId"].is_string(), "{method} {path}");
            assert!(
                op["responses"].as_object().is_some_and(|r| !r.is_empty()),
                "{method} {path}"
            );
        }
    }
    assert_eq!(operations, 13);
    for path in [
        "/schedulers/{scheduler_id}/push",
        "/schedulers/{scheduler_id}/pop",
        "/tasks",
        "/tasks/{task_id}",
        "/tasks/stats",
        "/health",
    ] {
        assert!(paths.contains_key(path), "{path} missing");
    }
}
