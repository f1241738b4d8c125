//! The service as an operator meets it, with the real binary on PostgreSQL: a restart after a
//! SIGKILL is ready only when it serves, and serves at once (it takes its own predecessor's
//! leases instead of waiting for them to lapse); a database connection the server drops costs
//! no request and no heap rebuild, and no driver text reaches a client.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::child::ChildApp;
use crate::helpers::*;

async fn push(client: &reqwest::Client, app: &ChildApp, body: &Value) -> Value {
    let resp = client
        .post(format!("{}/schedulers/boefje/push", app.address))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    resp.json().await.unwrap()
}

async fn pop(client: &reqwest::Client, app: &ChildApp) -> (u16, String) {
    let resp = client
        .post(format!("{}/schedulers/boefje/pop?limit=1", app.address))
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// Polls `/health` until it answers 200; answers how long that took and the reasons the
/// answers before gave.
async fn until_ready(client: &reqwest::Client, app: &ChildApp) -> (Duration, Vec<String>) {
    let started = Instant::now();
    let mut reasons = Vec::new();
    loop {
        let resp = client
            .get(format!("{}/health", app.address))
            .send()
            .await
            .unwrap();
        if resp.status() == 200 {
            return (started.elapsed(), reasons);
        }
        assert_eq!(resp.status(), 503);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["healthy"], false);
        reasons.push(body["results"].to_string());
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never ready: {reasons:?}"
        );
        // Polling as a readiness probe does, not a wait for a state of our own.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_a_kill_is_ready_only_when_it_serves_and_takes_its_own_leases_at_once() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let client = reqwest::Client::new();
    for instance_id in [None, Some("scheduler-a")] {
        let env: Vec<(&str, &str)> = instance_id
            .map(|id| vec![("SCHEDULER_INSTANCE_ID", id)])
            .unwrap_or_default();
        let first = ChildApp::start(&db.uri, &env);
        first.wait_owning_all().await;
        let task = push(
            &client,
            &first,
            &boefje_push("org1", "dns", Some("Hostname|internet|a.nl"), 3),
        )
        .await;
        first.kill_9();

        let started = Instant::now();
        let second = ChildApp::start(&db.uri, &env);
        let listening = started.elapsed();
        let (ready, reasons) = until_ready(&client, &second).await;
        // The first ready answer means pops are served: this one must not meet a 503.
        let (status, body) = pop(&client, &second).await;
        let first_pop = started.elapsed();
        assert_eq!(status, 200, "{body}");
        let popped: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(popped["results"][0]["id"], task["id"], "{body}");
        let taken = second.logged(
            "the lease is held by this instance's own predecessor, which is gone; taking it at once",
        );
        assert_eq!(
            taken.len(),
            3,
            "each scheduler taken from the dead predecessor ({instance_id:?}), not after its lease lapsed"
        );
        for r in &reasons {
            assert!(r.contains("not served"), "{r}");
        }
        eprintln!(
            "restart ({}): listening after {listening:?}, ready {ready:?} later ({} answers 503 before), first pop served {first_pop:?} after the start",
            instance_id.unwrap_or("default instance name"),
            reasons.len()
        );
        assert!(second.terminate(), "a clean stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_database_connection_costs_no_request_and_no_heap_rebuild() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let app = ChildApp::start(&db.uri, &[]);
    app.wait_owning_all().await;
    let client = reqwest::Client::new();
    let mut pushed = Vec::new();
    for i in 0..6 {
        let ooi = format!("Hostname|internet|h{i}.nl");
        pushed.push(push(&client, &app, &boefje_push("org1", "dns", Some(&ooi), 3)).await);
    }
    assert_eq!(pop(&client, &app).await.0, 200);
    let rebuilt_at_start = app.logged("heaps rebuilt from the tasks table").len();
    assert_eq!(rebuilt_at_start, 3);

    let mut recovered = 0;
    for round in 0..2 {
        // Every connection of the service, closed by the server.
        let killed = terminate_connections(&db.uri).await;
        assert!(killed >= 2, "the service's connections were there to close");
        for _ in 0..2 {
            let (status, body) = pop(&client, &app).await;
            assert_eq!(status, 200, "round {round}: {body}");
            let popped: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(popped["results"].as_array().unwrap().len(), 1, "{body}");
        }
        // The pop's batch is one statement with its fence: the engine found on a fresh
        // connection that it had not been written, and wrote it there (unless the kept
        // connection sat idle long enough to be checked and replaced before the batch).
        recovered = app
            .logged(
                "the database connection broke during the batch's statement; \
                 finding out on a fresh one whether it was written",
            )
            .len();
        let replaced = app
            .logged("the kept database connection was closed while idle; a fresh one replaces it")
            .len();
        // (Another engine's connection may be found closed too, by its own upkeep.)
        assert!(
            recovered <= round + 1,
            "round {round}: one broken batch a round"
        );
        assert!(recovered + replaced > round, "round {round}");
        let resp = client
            .get(format!("{}/tasks?scheduler_id=boefje&limit=0", app.address))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "a read on the pool after the drop");
    }
    assert!(recovered > 0, "a broken one-statement batch was recovered");
    let resp = client
        .patch(format!("{}/tasks/{}", app.address, id_of(&pushed[0])))
        .json(&json!({"status": "completed"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        app.logged("heaps rebuilt from the tasks table").len(),
        rebuilt_at_start,
        "no heap rebuilt: nothing could have changed underneath"
    );
    let lines = app.log_lines();
    assert!(
        lines.iter().all(|l| !l.trim().is_empty()),
        "no blank log lines"
    );
    let errors: Vec<&String> = lines.iter().filter(|l| l.contains("\"ERROR\"")).collect();
    assert!(
        errors.is_empty(),
        "a dropped connection is no error: {errors:?}"
    );
    assert!(app.terminate());
}

/// A server that accepts connections and never answers: a hung service, a black-holed route.
fn hung_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().map_while(Result::ok) {
            held.push(stream);
        }
    });
    port
}

/// A port nothing listens on: a service that is down.
fn refusing_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The service with Katalogus, Octopoes, Bytes and RabbitMQ all on `port`, its cron ticking.
async fn with_every_dependency_on(port: u16) -> (TestDb, ChildApp) {
    let db = TestDb::create(Backend::Sqlite).await.unwrap();
    let http = format!("http://127.0.0.1:{port}");
    let amqp = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
    let app = ChildApp::start(
        &db.uri,
        &[
            ("KATALOGUS_API", http.as_str()),
            ("OCTOPOES_API", http.as_str()),
            ("BYTES_API", http.as_str()),
            ("BYTES_USERNAME", "bytes"),
            ("BYTES_PASSWORD", "secret"),
            ("QUEUE_URI", amqp.as_str()),
            ("SCHEDULER_CRON_TICK", "1"),
        ],
    );
    (db, app)
}

/// `/health?externals=true` answers within its bound and names every configured service.
async fn externals_answer_in_time(app: &ChildApp) {
    let client = reqwest::Client::new();
    let started = Instant::now();
    let resp = client
        .get(format!("{}/health?externals=true", app.address))
        .send()
        .await
        .unwrap();
    let took = started.elapsed();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["externals"],
        json!({"katalogus": false, "octopoes": false, "bytes": false}),
        "{body}"
    );
    eprintln!("health with externals answered in {took:?}");
    assert!(
        took < Duration::from_secs(4),
        "the externals are bounded at 2 s: {took:?}"
    );
}

/// Waits until the listener is trying RabbitMQ (its first call to a dependency is out; the
/// catalogue refresh and the cron ticks' calls to Katalogus started with the service).
async fn until_listener_tries(app: &ChildApp) {
    let client = reqwest::Client::new();
    let started = Instant::now();
    loop {
        let body: Value = client
            .get(format!("{}/health", app.address))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let listener = health_row(&body, "listener");
        let state = listener["additional"]["state"].as_str().unwrap_or_default();
        if state == "connecting" || state.starts_with("down") {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{listener}");
        // Polling the service's own report, not a wait for a state of ours.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// With every dependency on `port` (`what` it does): `/health?externals=true` answers in time,
/// and SIGTERM ends the service with 0 within 5 s.
async fn stops_in_time_with_every_dependency(port: u16, what: &str) {
    let (_db, app) = with_every_dependency_on(port).await;
    until_listener_tries(&app).await;
    externals_answer_in_time(&app).await;
    let started = Instant::now();
    assert!(
        app.terminate_within(Duration::from_secs(5)),
        "exit 0 within 5 s"
    );
    eprintln!(
        "stopped with every dependency {what} in {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_the_service_within_5_s_with_every_dependency_hung() {
    stops_in_time_with_every_dependency(hung_port(), "hung").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_the_service_within_5_s_with_every_dependency_down() {
    stops_in_time_with_every_dependency(refusing_port(), "down").await;
}
