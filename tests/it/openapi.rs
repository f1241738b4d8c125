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
    assert_eq!(operations, 23);
    for path in [
        "/schedulers/boefje/push",
        "/schedulers/normalizer/push",
        "/schedulers/report/push",
        "/schedulers/{scheduler_id}/pop",
        "/tasks",
        "/tasks/{task_id}",
        "/tasks/stats",
        "/health",
        "/schedules",
        "/schedules/{id}",
        "/schedules/{id}/history",
        "/schedules/search",
    ] {
        assert!(paths.contains_key(path), "{path} missing");
    }
}

#[test]
fn each_scheduler_push_states_its_own_payload_and_the_filter_bounds() {
    let spec: serde_json::Value =
        serde_json::from_str(&kat_scheduler::api::openapi_json().unwrap()).unwrap();
    let schemas = &spec["components"]["schemas"];
    assert_eq!(
        schemas["BoefjeTaskData"]["required"],
        serde_json::json!(["boefje", "organization"])
    );
    assert_eq!(
        spec["paths"]["/schedulers/report/push"]["post"]["requestBody"]["content"]["application/json"]
            ["schema"]["$ref"],
        "#/components/schemas/TaskPushReport"
    );
    let pop = &spec["paths"]["/schedulers/{scheduler_id}/pop"]["post"];
    let limit = pop["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap();
    assert_eq!(
        (
            limit["schema"]["minimum"].as_i64(),
            limit["schema"]["maximum"].as_i64()
        ),
        (Some(1), Some(1000))
    );
    for code in ["400", "401", "403", "408", "413", "422", "503"] {
        assert!(pop["responses"].get(code).is_some(), "pop documents {code}");
    }
}

#[test]
fn the_openapi_command_prints_the_document_and_a_reader_that_stops_early_is_no_error() {
    use std::io::Read;
    use std::process::{Command, Stdio};

    let whole = Command::new(crate::child::binary())
        .arg("openapi")
        .output()
        .expect("the binary runs");
    assert!(whole.status.success());
    assert_eq!(
        String::from_utf8(whole.stdout).unwrap(),
        kat_scheduler::api::openapi_json().unwrap()
    );

    // As `kat-scheduler openapi | head`: the pipe closes after a few bytes. The document is
    // larger than a pipe's buffer, so the binary is still writing when it closes.
    assert!(kat_scheduler::api::openapi_json().unwrap().len() > 1 << 17);
    let mut child = Command::new(crate::child::binary())
        .arg("openapi")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn the_openapi_command_states_the_configured_limits_as_the_served_document_does() {
    let out = std::process::Command::new(crate::child::binary())
        .arg("openapi")
        .env("SCHEDULER_LIMIT_IN_VALUES", "5")
        .env_remove("SCHEDULER_DB_URI")
        .output()
        .expect("the binary runs");
    assert!(out.status.success(), "{out:?}");
    let limits = kat_scheduler::domain::limits::Limits {
        max_in_values: 5,
        ..Default::default()
    };
    let expected = kat_scheduler::api::openapi_json_for(&limits).unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout) == expected,
        "the printed document is not the one served under SCHEDULER_LIMIT_IN_VALUES=5"
    );
    assert!(expected.contains("\"maxItems\": 5"));
}

#[test]
fn a_schedule_id_is_a_uuid_in_the_document_so_search_is_no_id() {
    let spec: serde_json::Value =
        serde_json::from_str(&kat_scheduler::api::openapi_json().unwrap()).unwrap();
    let item = &spec["paths"]["/schedules/{id}"];
    for method in ["get", "patch", "delete"] {
        let schema = &item[method]["parameters"][0]["schema"];
        assert_eq!(schema["format"], "uuid", "{method}");
        assert_eq!(
            schema["pattern"],
            "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
            "{method}: `search` must not match"
        );
        let responses = &item[method]["responses"];
        assert!(responses["404"].is_object(), "{method}: not a UUID");
        assert!(responses["405"].is_object(), "{method}: the search's path");
    }
    assert_eq!(
        spec["paths"]["/schedules/search"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["post"]
    );
}
