//! The binary as users and supervisors run it: the README's first command on a fresh machine
//! (no configuration at all, an empty directory: it serves on its embedded default, an SQLite
//! file under `./data/` it creates, and keeps what it acknowledged across a restart), and a stop
//! after its log pipe is gone.

use std::time::Duration;

use serde_json::Value;

use crate::child::ChildApp;
use crate::helpers::*;

/// POSTs `body` (or nothing) to `address` + `path`.
async fn post(address: &str, path: &str, body: Option<&Value>) -> reqwest::Response {
    let request = reqwest::Client::new().post(format!("{address}{path}"));
    let request = match body {
        Some(b) => request.json(b),
        None => request,
    };
    request.send().await.unwrap()
}

/// Starts the binary in `dir` on its defaults, off the test's runtime (it waits for the child).
async fn start_in(dir: std::path::PathBuf) -> ChildApp {
    tokio::task::spawn_blocking(move || ChildApp::start_in(&dir, &[]))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_with_no_configuration_serves_from_an_empty_directory_and_keeps_its_work() {
    let dir = tempfile::tempdir().unwrap();
    assert!(!dir.path().join("data").exists());

    let app = start_in(dir.path().to_owned()).await;
    let push = boefje_push("org", "nmap", Some("Hostname|internet|a.example"), 3);
    let resp = post(&app.address, "/schedulers/boefje/push", Some(&push)).await;
    assert_eq!(resp.status(), 201);
    let pushed: Value = resp.json().await.unwrap();
    let id = pushed["id"]
        .as_str()
        .expect("the push answered a task")
        .to_owned();
    assert!(
        dir.path().join("data/scheduler.db").is_file(),
        "the default database file is ./data/scheduler.db"
    );
    assert!(
        tokio::task::spawn_blocking(move || app.terminate())
            .await
            .unwrap(),
        "a clean stop exits 0"
    );

    // A second start on the same directory finds the task and pops it.
    let app = start_in(dir.path().to_owned()).await;
    let resp = post(&app.address, "/schedulers/boefje/pop", None).await;
    assert_eq!(resp.status(), 200);
    let popped: Value = resp.json().await.unwrap();
    assert_eq!(popped["results"][0]["id"], id.as_str(), "{popped}");
    assert!(
        tokio::task::spawn_blocking(move || app.terminate())
            .await
            .unwrap()
    );
}

/// A log collector that goes away must not take the service with it: log lines that meet the
/// broken pipe are dropped, requests are served, and SIGTERM still stops it cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_whose_log_pipe_is_gone_serves_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    let app = tokio::task::spawn_blocking(move || ChildApp::start_in_then_close_log(&path))
        .await
        .unwrap();
    // A 404 (an unknown scheduler), a push and a pop are served.
    let resp = post(&app.address, "/schedulers/nope/pop", None).await;
    assert_eq!(resp.status(), 404);
    let push = boefje_push("org", "nmap", Some("Hostname|internet|b.example"), 3);
    let resp = post(&app.address, "/schedulers/boefje/push", Some(&push)).await;
    assert_eq!(resp.status(), 201);
    let resp = post(&app.address, "/schedulers/boefje/pop", None).await;
    assert_eq!(resp.status(), 200);
    assert!(
        tokio::task::spawn_blocking(move || app.terminate_within(Duration::from_secs(30)))
            .await
            .unwrap(),
        "SIGTERM stops the service cleanly although its log pipe is closed"
    );
}
