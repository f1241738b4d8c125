//! A database outage: while PostgreSQL is unreachable every request gets 503 with Retry-After
//! within a bounded time (no 500, no hang), and when it returns the service recovers without a
//! restart. Runs against a private PostgreSQL instance (initdb in a temporary directory, its own
//! port), so the shared server is untouched.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

/// Longest a request may take while the database is down: the configured connect timeout (2 s)
/// plus scheduling slack. A hang would exceed it by far.
const BOUND: Duration = Duration::from_secs(10);

struct PrivatePostgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    as_postgres: bool,
}

fn find_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    dirs.sort();
    dirs.pop()
}

impl PrivatePostgres {
    fn run(&self, program: &str, args: &[&str]) -> bool {
        let exe = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            // PostgreSQL refuses to run as root.
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        cmd.args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn start() -> Option<PrivatePostgres> {
        let Some(bin) = find_bin() else {
            let msg = "initdb not found under /usr/lib/postgresql";
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg}; it is required under CI=true");
            }
            eprintln!("\n*** SKIPPED: {msg} ***\n");
            return None;
        };
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let dir = tempfile::tempdir().unwrap();
        if as_postgres {
            assert!(
                Command::new("chown")
                    .args(["postgres:", &dir.path().display().to_string()])
                    .status()
                    .unwrap()
                    .success()
            );
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let pg = PrivatePostgres {
            bin,
            dir,
            port,
            as_postgres,
        };
        assert!(
            pg.run(
                "initdb",
                &[
                    "-D",
                    &pg.data(),
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "--no-sync",
                    "-E",
                    "UTF8"
                ]
            ),
            "initdb"
        );
        assert!(pg.up(), "the private PostgreSQL starts");
        Some(pg)
    }

    fn up(&self) -> bool {
        let opts = format!(
            // The WAL writer's longest pause: a commit that did not wait for its flush stays in
            // the server's buffers long enough for a crash to lose it.
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c wal_writer_delay=10s",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("log").display().to_string();
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-o", &opts, "-l", &log, "-w", "start"],
        )
    }

    /// An abrupt stop, as a crash or a network cut looks to the service.
    fn down(&self) -> bool {
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        )
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self.down();
    }
}

fn path_exists(p: &Path) -> bool {
    p.exists()
}

/// Sends `req` and checks it is answered 503 with Retry-After within [`BOUND`].
async fn assert_unavailable(what: &str, req: reqwest::RequestBuilder) {
    let started = Instant::now();
    let resp = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("{what}: no answer: {e}"));
    let took = started.elapsed();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE, "{what}");
    assert!(
        took < BOUND,
        "{what} took {took:?}: the service hangs while the database is down"
    );
    if what != "health" {
        assert!(
            resp.headers().contains_key("retry-after"),
            "{what} without Retry-After"
        );
        let body: Value = resp.json().await.unwrap();
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .starts_with("Service unavailable"),
            "{what}: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_database_is_down_requests_get_503_and_the_service_recovers_without_restart() {
    let Some(pg) = PrivatePostgres::start() else {
        return;
    };
    assert!(path_exists(&pg.dir.path().join("data/PG_VERSION")));
    let uri = format!("postgresql://postgres@127.0.0.1:{}/postgres", pg.port);
    let app = spawn_app_on(TestDb::external(&uri), Backend::Postgres, |s| {
        s.database.connect_timeout_secs = 2
    })
    .await;
    let c = &app.client;
    let before = app
        .push_ok("boefje", &boefje_push("org1", "before", None, 3))
        .await;
    let waiting = app
        .push_ok("boefje", &boefje_push("org1", "waiting", None, 5))
        .await;
    assert_eq!(app.pop_ok("boefje", 1, None).await[0]["id"], before["id"]);

    assert!(pg.down(), "the private PostgreSQL stops");
    let a = &app.address;
    assert_unavailable(
        "push",
        c.post(format!("{a}/schedulers/boefje/push"))
            .json(&boefje_push("org1", "during", None, 3)),
    )
    .await;
    assert_unavailable("pop", c.post(format!("{a}/schedulers/boefje/pop"))).await;
    assert_unavailable("get", c.get(format!("{a}/tasks/{}", id_of(&before)))).await;
    assert_unavailable(
        "patch",
        c.patch(format!("{a}/tasks/{}", id_of(&before)))
            .json(&json!({"status": "running"})),
    )
    .await;
    assert_unavailable("list", c.get(format!("{a}/tasks"))).await;
    assert_unavailable("health", c.get(format!("{a}/health"))).await;
    // The process itself stays up.
    assert_eq!(app.get("/livez").await.status(), StatusCode::OK);

    assert!(pg.up(), "the private PostgreSQL starts again");
    // After a failed connect the engine answers 503 for one second before it tries again; a
    // client honouring Retry-After gets through on its next attempt.
    let mut resp = app
        .push("boefje", &boefje_push("org1", "after", None, 3))
        .await;
    for _ in 0..3 {
        if resp.status() != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
        resp = app
            .push("boefje", &boefje_push("org1", "after", None, 3))
            .await;
    }
    assert_eq!(
        resp.status(),
        StatusCode::CREATED,
        "the service recovered without a restart"
    );
    let after: Value = resp.json().await.unwrap();
    // Nothing acknowledged before the outage was lost or changed; the heap is whole again.
    assert_eq!(app.task(&id_of(&before)).await["status"], "dispatched");
    let popped: Vec<String> = app.pop_ids("boefje", 5).await;
    assert_eq!(popped, vec![id_of(&after), id_of(&waiting)]);
    assert_eq!(app.get("/health").await.status(), StatusCode::OK);
    assert_eq!(
        app.patch_task(&id_of(&before), &json!({"status": "running"}))
            .await
            .status(),
        StatusCode::OK
    );
}

/// How many boefje tasks are pending, as the table says.
async fn pending_count(app: &TestApp) -> Value {
    app.get("/tasks?scheduler_id=boefje&status=pending&limit=0")
        .await
        .json::<Value>()
        .await
        .unwrap()["count"]
        .clone()
}

/// An owner cut off from the database while another instance took its scheduler must not
/// rebuild its heap over the new owner's rows once the database is back: a rebuild writes (its
/// refill settles pending rows `queued`), so it is fenced like a batch. Here the request after
/// the outage reaches the engine before its ownership round has seen the takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_while_its_scheduler_was_taken_does_not_rebuild_over_it() {
    let Some(pg) = PrivatePostgres::start() else {
        return;
    };
    let uri = format!("postgresql://postgres@127.0.0.1:{}/postgres", pg.port);
    let app = spawn_app_on(TestDb::external(&uri), Backend::Postgres, |s| {
        s.database.connect_timeout_secs = 2;
        s.cluster.lease_ms = 60_000;
        s.queue.maxsize = 2;
    })
    .await;
    for i in 0..5 {
        app.push_ok(
            "boefje",
            &boefje_push("org1", &format!("b{i}"), None, i + 1),
        )
        .await;
    }
    // One popped: the heap has room for one of the three pending tasks.
    assert_eq!(app.pop_ok("boefje", 1, None).await.len(), 1);
    let pending = pending_count(&app).await;

    assert!(pg.down(), "the private PostgreSQL stops");
    let resp = app
        .push("boefje", &boefje_push("org1", "during", None, 9))
        .await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(pg.up(), "the private PostgreSQL starts again");
    // Another instance took the scheduler while this one was cut off.
    let db = uri.clone();
    tokio::task::spawn_blocking(move || {
        use diesel::{Connection, connection::SimpleConnection};
        diesel::PgConnection::establish(&db)
            .unwrap()
            .batch_execute(
                "UPDATE scheduler_owners SET owner = 'elsewhere', address = 'http://127.0.0.1:9', \
                 epoch = epoch + 1, expires_at = now() + interval '1 hour'",
            )
            .unwrap();
    })
    .await
    .unwrap();
    // Past the engine's pause after a failed connect, a pop reaches it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let resp = app.pop("boefje", Some(1), None).await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        pending_count(&app).await,
        pending,
        "the former owner moved none of the new owner's pending tasks"
    );
}

/// The server itself crashes under load: an immediate stop (its processes quit at once, so WAL
/// still in its buffers is lost, as in a crash of the server), five times at random moments.
/// The engines commit without waiting for the disk and answer after a flush barrier
/// (`database.flush_barrier`): every push answered 201 must be stored afterwards, every task
/// answered as popped still dispatched, none popped twice. With answers sent before the
/// barrier, this fails (about half the crashes find a lost answer). Each push's schedule, which
/// commits before it without waiting for the disk, must survive with it. `KAT_CRASH_SEED`
/// replays the moments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_work_survives_a_database_crash_under_load_with_the_flush_barrier() {
    database_crashes_under_load(true, 5).await;
}

/// The same with each commit waiting for its own flush (the default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_work_survives_a_database_crash_under_load() {
    database_crashes_under_load(false, 3).await;
}

/// A database that answers and takes no writes (sessions read-only by default, as maintenance
/// or a failover onto a standby leaves them): `/health` says so and is not ready, and a push is
/// answered 503, not 500. Once it takes writes again both are back, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_takes_no_writes_is_not_ready_and_its_pushes_get_503() {
    let Some(app) = spawn_app(Backend::Postgres).await else {
        return;
    };
    let name = app.db.uri.rsplit('/').next().unwrap().to_owned();
    let uri = app.db.uri.clone();
    behind_its_back(
        Backend::Postgres,
        &uri,
        &format!("ALTER DATABASE {name} SET default_transaction_read_only = on"),
    );
    terminate_connections(&uri).await;
    let resp = app.get("/health").await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = resp.json().await.unwrap();
    let database = &body["results"][0];
    assert_eq!(database["healthy"], false, "{body}");
    assert!(
        database["additional"]["writes"]
            .as_str()
            .is_some_and(|w| w.contains("read-only")),
        "{body}"
    );
    let push = app
        .push("boefje", &boefje_push("org1", "during", None, 3))
        .await;
    assert_eq!(push.status(), StatusCode::SERVICE_UNAVAILABLE);
    behind_its_back(
        Backend::Postgres,
        &uri,
        &format!(
            "BEGIN READ WRITE; ALTER DATABASE {name} RESET default_transaction_read_only; COMMIT"
        ),
    );
    terminate_connections(&uri).await;
    let resp = app.get("/health").await;
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["results"][0]["additional"].get("writes").is_none(),
        "{body}"
    );
    retried_push(
        &app,
        &boefje_push("org1", "after", None, 3),
        "writes came back",
    )
    .await;
}

/// A push answered 503, retried as its caller does: stored now, or named as stored (a boost
/// or a duplicate) by a task the table holds; answers that task. An engine whose heap kept a
/// push whose commit a crash lost would name a task that is not there.
async fn retried_push(app: &TestApp, body: &Value, at: &str) -> String {
    // As a client does: again after a 503's Retry-After (the engines pause a second after a
    // failed connect), a bounded number of times.
    let mut resp = app.push("boefje", body).await;
    for _ in 0..20 {
        if resp.status() != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        resp = app.push("boefje", body).await;
    }
    let status = resp.status();
    let answer: Value = resp.json().await.unwrap();
    let id = match status {
        StatusCode::CREATED | StatusCode::OK => id_of(&answer),
        StatusCode::CONFLICT => {
            let detail = answer["detail"].as_str().unwrap_or_default();
            (0..detail.len().saturating_sub(35))
                .filter_map(|i| detail.get(i..i + 36))
                .find(|w| uuid::Uuid::parse_str(w).is_ok())
                .unwrap_or_else(|| panic!("a 409 names its task: {answer}"))
                .to_owned()
        }
        other => panic!("a retried push answered {other}: {answer}"),
    };
    assert_eq!(
        app.get_task(&id).await.status(),
        StatusCode::OK,
        "a push retried after {at} answered {status} naming task {id}, which the table lacks: {answer}"
    );
    id
}

/// With the flush barrier, a push whose commit reached the server but whose barrier failed (the
/// server crashed before the commit was on disk) is answered 503, and the crash may have lost
/// it. Nothing else fails on that engine if no request follows, so it must rebuild its heap from
/// the table on the barrier's failure: its caller's retry is then stored, not told 409 naming a
/// task the table lacks. One pusher at a time, so the crash often falls between a commit and its
/// barrier; `KAT_CRASH_SEED` replays the moments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_whose_flush_barrier_failed_is_stored_when_retried() {
    let Some(pg) = PrivatePostgres::start() else {
        return;
    };
    let seed = seed_from_env("KAT_CRASH_SEED", "flush barrier failure test");
    let mut rng = Rng(seed);
    let uri = format!("postgresql://postgres@127.0.0.1:{}/postgres", pg.port);
    let app = spawn_app_on(TestDb::external(&uri), Backend::Postgres, |s| {
        s.database.connect_timeout_secs = 2;
        s.database.flush_barrier = Some(true);
    })
    .await;
    let mut retried = 0;
    for crash in 0..8 {
        let address = app.address.clone();
        let pusher = tokio::spawn(async move {
            let seen = std::sync::Mutex::new(crate::crash::Acknowledged::default());
            let push = |n: u64| boefje_push("flush", &format!("f{crash}-{n}"), None, 5);
            crate::crash::push_until_refused(&reqwest::Client::new(), &address, push, &seen).await;
            seen.into_inner().unwrap().unanswered.pop()
        });
        let moment = Duration::from_millis(200 + rng.next() % 300);
        tokio::time::sleep(moment).await; // the random crash moment, not a wait for a state
        assert!(pg.down(), "the private PostgreSQL stops at once");
        let unanswered = pusher.await.unwrap();
        assert!(pg.up(), "the private PostgreSQL starts again");
        if let Some(body) = unanswered {
            retried_push(&app, &body, &format!("crash {} (seed {seed})", crash + 1)).await;
            retried += 1;
        }
    }
    assert!(
        retried > 0,
        "some crash left a push unanswered (seed {seed})"
    );
}

async fn database_crashes_under_load(barrier: bool, crashes: usize) {
    let Some(pg) = PrivatePostgres::start() else {
        return;
    };
    let seed = seed_from_env(
        "KAT_CRASH_SEED",
        &format!("database crash test (flush barrier {barrier})"),
    );
    let mut rng = Rng(seed);
    let uri = format!("postgresql://postgres@127.0.0.1:{}/postgres", pg.port);
    let app = spawn_app_on(TestDb::external(&uri), Backend::Postgres, |s| {
        s.database.connect_timeout_secs = 2;
        s.database.flush_barrier = Some(barrier);
    })
    .await;
    let mut pushed: Vec<String> = Vec::new();
    let mut popped: std::collections::HashSet<String> = std::collections::HashSet::new();
    for cycle in 0..crashes {
        let seen =
            std::sync::Arc::new(std::sync::Mutex::new(crate::crash::Acknowledged::default()));
        let load = tokio::spawn(crate::crash::drive(
            app.address.clone(),
            cycle,
            seen.clone(),
        ));
        let moment = Duration::from_millis(300 + rng.next() % 500);
        tokio::time::sleep(moment).await; // the random crash moment, not a wait for a state
        assert!(pg.down(), "the private PostgreSQL stops at once");
        load.await.unwrap();
        assert!(pg.up(), "the private PostgreSQL starts again");
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        eprintln!(
            "crash {} after {moment:?}: {} pushes and {} pops acknowledged, {} pushes unanswered",
            cycle + 1,
            seen.pushes.len(),
            seen.pops.len(),
            seen.unanswered.len()
        );
        for id in seen.pops {
            assert!(
                popped.insert(id.clone()),
                "task {id} popped twice (seed {seed})"
            );
        }
        pushed.extend(seen.pushes);

        // Back in service (the engines answer 503 for a second after a failed connect).
        let mut status = StatusCode::SERVICE_UNAVAILABLE;
        for _ in 0..10 {
            status = app.get("/tasks?limit=1").await.status();
            if status == StatusCode::OK {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert_eq!(status, StatusCode::OK, "the service recovered");
        for id in &pushed {
            let resp = app.get_task(id).await;
            assert_eq!(
                resp.status(),
                StatusCode::OK,
                "acknowledged push {id} lost in crash {} (seed {seed})",
                cycle + 1
            );
            // Its schedule (committed before it without waiting for the disk) survived too.
            let task: Value = resp.json().await.unwrap();
            let schedule = task["schedule_id"].as_str().expect("a linked schedule");
            assert_eq!(
                app.get(&format!("/schedules/{schedule}")).await.status(),
                StatusCode::OK,
                "schedule of acknowledged push {id} lost in crash {} (seed {seed})",
                cycle + 1
            );
        }
        for body in &seen.unanswered {
            pushed.push(
                retried_push(&app, body, &format!("crash {} (seed {seed})", cycle + 1)).await,
            );
        }
        for id in &popped {
            assert_eq!(
                app.task(id).await["status"],
                "dispatched",
                "acknowledged pop of {id} undone by crash {} (seed {seed})",
                cycle + 1
            );
        }
    }
    assert!(
        !pushed.is_empty() && !popped.is_empty(),
        "the load did some work before the crashes"
    );
}
