//! The README's first command on a fresh machine: the binary with no configuration at all, in
//! an empty directory, serves on its embedded default (an SQLite file under `./data/`, which it
//! creates) and keeps what it acknowledged across a restart.

use serde_json::Value;

use crate::child::ChildApp;
use crate::helpers::*;

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
    let client = reqwest::Client::new();

    let app = start_in(dir.path().to_owned()).await;
    let pushed: Value = client
        .post(format!("{}/schedulers/boefje/push", app.address))
        .json(&boefje_push(
            "org",
            "nmap",
            Some("Hostname|internet|a.example"),
            3,
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
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
    let resp = client
        .post(format!("{}/schedulers/boefje/pop", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let popped: Value = resp.json().await.unwrap();
    assert_eq!(popped["results"][0]["id"], id.as_str(), "{popped}");
    assert!(
        tokio::task::spawn_blocking(move || app.terminate())
            .await
            .unwrap()
    );
}
