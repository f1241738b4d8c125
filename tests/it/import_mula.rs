//! `kat-scheduler import-mula`: switching from mula without losing a schedule. mula's database is
//! made by mula's own migrations (the schema in `tests/fixtures/mula_schema.sql`, dumped from a
//! database `alembic upgrade head` created; its header says how), filled with rows as mula
//! writes them (JSONB payloads, uppercase status labels, timestamptz), and imported by the real
//! binary into a fresh SQLite file or PostgreSQL database; the real service then serves it.

use std::process::{Command, Output};

use chrono::{DateTime, Utc};
use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::child::binary;
use crate::helpers::*;

const MULA_SCHEMA: &str = include_str!("../fixtures/mula_schema.sql");

// mula's rows, by what the tests expect of them.
const S_DAILY: &str = "a0000000-0000-4000-8000-000000000001";
const S_ONE_OFF: &str = "a0000000-0000-4000-8000-000000000002";
const S_WEEKLY: &str = "a0000000-0000-4000-8000-000000000003";
const S_BAD_CRON: &str = "a0000000-0000-4000-8000-000000000004";
/// Made by Rocky before OpenKAT 1.19, under mula's scheduler per organisation.
const S_LEGACY: &str = "a0000000-0000-4000-8000-000000000005";

const Q_BOEFJE_3: &str = "b0000000-0000-4000-8000-000000000001";
const Q_BOEFJE_2: &str = "b0000000-0000-4000-8000-000000000002";
const P_BOEFJE_4: &str = "b0000000-0000-4000-8000-000000000003";
const Q_NORMALIZER: &str = "b0000000-0000-4000-8000-000000000004";
const Q_REPORT: &str = "b0000000-0000-4000-8000-000000000005";
const DISPATCHED: &str = "b0000000-0000-4000-8000-000000000006";
const RUNNING: &str = "b0000000-0000-4000-8000-000000000007";
const COMPLETED: &str = "b0000000-0000-4000-8000-000000000008";
/// Finished and still queued under mula's scheduler per organisation, before OpenKAT 1.19.
const LEGACY_DONE: &str = "b0000000-0000-4000-8000-00000000000e";
const LEGACY_QUEUED: &str = "b0000000-0000-4000-8000-00000000000f";
/// Dispatched in mula a year before the import: its runner lost it.
const STALLED: &str = "b0000000-0000-4000-8000-00000000000d";
const FAILED: &str = "b0000000-0000-4000-8000-000000000009";
const CANCELLED: &str = "b0000000-0000-4000-8000-00000000000a";
const UNKNOWN_SCHEDULER: &str = "b0000000-0000-4000-8000-00000000000b";
const MALFORMED: &str = "b0000000-0000-4000-8000-00000000000c";

/// Tasks mula holds, and those of them kat-scheduler takes.
const TASKS_READ: u64 = 15;
const TASKS_IMPORTED: u64 = 13;

fn boefje(id: &str, boefje: &str, ooi: &str) -> Value {
    // As mula's BoefjeTask is stored: the task id in the payload, `organization`, legacy keys.
    json!({"id": id, "boefje": {"id": boefje, "name": boefje, "version": null,
        "oci_image": format!("ghcr.io/minvws/openkat/{boefje}:latest")},
        "input_ooi": ooi, "organization": "org1", "dispatches": [], "deduplication_key": null})
}

fn normalizer(id: &str) -> Value {
    json!({"id": id, "normalizer": {"id": "kat_dns_normalize", "version": null},
        "raw_data": {"id": "c0000000-0000-4000-8000-000000000001",
            "boefje_meta": {"id": "c0000000-0000-4000-8000-000000000002",
                "boefje": {"id": "dns-records", "version": null},
                "input_ooi": "Hostname|internet|example.com", "arguments": {},
                "organization": "org1", "started_at": "2025-10-01 10:00:00+00:00",
                "ended_at": "2025-10-01 10:00:05+00:00"},
            "mime_types": [{"value": "boefje/dns-records"}],
            "secure_hash": null, "hash_retrieval_link": null}})
}

fn report(recipe: &str) -> Value {
    // mula's ReportTask has no id.
    json!({"organisation_id": "org1", "report_recipe_id": recipe})
}

/// A database mula's migrations made, with mula's rows in it.
struct MulaDb {
    db: TestDb,
}

impl MulaDb {
    async fn create() -> Option<MulaDb> {
        let db = TestDb::create(Backend::Postgres).await?;
        let uri = db.uri.clone();
        tokio::task::spawn_blocking(move || {
            PgConnection::establish(&uri)
                .unwrap()
                .batch_execute(MULA_SCHEMA)
                .unwrap();
            // The dump empties the search path of its session; rows go in on a fresh one.
            let mut c = PgConnection::establish(&uri).unwrap();
            c.batch_execute(&seed_sql()).unwrap();
        })
        .await
        .unwrap();
        Some(MulaDb { db })
    }
}

fn schedule_sql(
    id: &str,
    scheduler: &str,
    data: &Value,
    cron: Option<&str>,
    deadline: Option<&str>,
) -> String {
    let opt = |v: Option<&str>| v.map_or("NULL".to_owned(), |v| format!("'{v}'"));
    format!(
        "INSERT INTO schedules (id, scheduler_id, organisation, hash, data, enabled, schedule, \
         deadline_at, created_at, modified_at) VALUES ('{id}', '{scheduler}', 'org1', \
         md5('{id}'), '{data}'::jsonb, true, {}, {}, '2025-09-01 08:00:00+00', \
         '2025-09-02 08:00:00+00');\n",
        opt(cron),
        opt(deadline)
    )
}

#[expect(clippy::too_many_arguments, reason = "one row of mula's tasks table")]
fn task_sql(
    id: &str,
    scheduler: &str,
    schedule: Option<&str>,
    priority: i64,
    data: &Value,
    status: &str,
    created: &str,
    modified: &str,
) -> String {
    let schedule = schedule.map_or("NULL".to_owned(), |s| format!("'{s}'"));
    let task_type = scheduler.split('-').next().unwrap();
    format!(
        "INSERT INTO tasks (id, scheduler_id, schedule_id, organisation, type, hash, priority, \
         data, status, created_at, modified_at) VALUES ('{id}', '{scheduler}', {schedule}, \
         'org1', '{task_type}', md5('{id}'), {priority}, '{data}'::jsonb, '{status}', \
         '{created}', '{modified}');\n"
    )
}

fn seed_sql() -> String {
    let mut s = String::new();
    s += &schedule_sql(
        S_DAILY,
        "boefje",
        &boefje(Q_BOEFJE_3, "dns-records", "Hostname|internet|a.example"),
        Some("0 0 * * *"),
        Some("2026-12-01 00:00:00+00"),
    );
    s += &schedule_sql(
        S_LEGACY,
        "report-org1",
        &report("recipe-monthly"),
        Some("0 6 1 * *"),
        Some("2026-12-01 06:00:00+00"),
    );
    s += &schedule_sql(
        S_ONE_OFF,
        "report",
        &report("recipe-once"),
        None,
        Some("2026-12-24 09:30:00+00"),
    );
    s += &schedule_sql(
        S_WEEKLY,
        "report",
        &report("recipe-weekly"),
        Some("0 6 * * 1"),
        Some("2026-11-30 06:00:00+00"),
    );
    s += &schedule_sql(
        S_BAD_CRON,
        "report",
        &report("recipe-weekdays"),
        Some("0 12 * * MON-FRI 30"),
        None,
    );
    let t0 = "2025-10-01 00:00:00+00";
    let t1 = "2025-10-01 01:00:00+00";
    let q = |id: &str, b: &str, ooi: &str, prio: i64, status: &str, sched: Option<&str>| {
        task_sql(
            id,
            "boefje",
            sched,
            prio,
            &boefje(id, b, ooi),
            status,
            t0,
            t1,
        )
    };
    s += &q(
        Q_BOEFJE_3,
        "dns-records",
        "Hostname|internet|a.example",
        3,
        "QUEUED",
        Some(S_DAILY),
    );
    s += &q(
        Q_BOEFJE_2,
        "nmap",
        "IPAddressV4|internet|10.0.0.2",
        2,
        "QUEUED",
        None,
    );
    s += &q(
        P_BOEFJE_4,
        "nmap",
        "IPAddressV4|internet|10.0.0.4",
        4,
        "PENDING",
        None,
    );
    s += &task_sql(
        Q_NORMALIZER,
        "normalizer",
        None,
        1,
        &normalizer(Q_NORMALIZER),
        "QUEUED",
        t0,
        t1,
    );
    s += &task_sql(
        Q_REPORT,
        "report",
        Some(S_ONE_OFF),
        5,
        &report("recipe-once"),
        "QUEUED",
        t0,
        t1,
    );
    // Work mula's runners hold: handed out an hour before the import.
    let recent = (Utc::now() - chrono::Duration::hours(1))
        .format("%Y-%m-%d %H:%M:%S+00")
        .to_string();
    s += &task_sql(
        DISPATCHED,
        "boefje",
        None,
        10,
        &boefje(DISPATCHED, "nmap", "IPAddressV4|internet|10.0.0.6"),
        "DISPATCHED",
        t0,
        &recent,
    );
    s += &task_sql(
        RUNNING,
        "normalizer",
        None,
        10,
        &normalizer(RUNNING),
        "RUNNING",
        t0,
        &recent,
    );
    s += &q(
        STALLED,
        "nmap",
        "IPAddressV4|internet|10.0.0.13",
        10,
        "DISPATCHED",
        None,
    );
    s += &task_sql(
        COMPLETED,
        "boefje",
        Some(S_DAILY),
        7,
        &boefje(COMPLETED, "dns-records", "Hostname|internet|a.example"),
        "COMPLETED",
        "2025-09-30 00:00:00+00",
        "2025-09-30 00:05:07.123456+00",
    );
    s += &task_sql(
        FAILED,
        "normalizer",
        None,
        7,
        &normalizer(FAILED),
        "FAILED",
        t0,
        t1,
    );
    s += &task_sql(
        CANCELLED,
        "report",
        Some(S_WEEKLY),
        7,
        &report("recipe-weekly"),
        "CANCELLED",
        t0,
        t1,
    );
    // Rows of mula's scheduler per organisation (before OpenKAT 1.19): its history, and work it
    // left waiting that mula has not served since.
    let legacy = |id: &str, ip: u8, status: &str, modified: &str| {
        let ooi = format!("IPAddressV4|internet|10.0.0.{ip}");
        let data = boefje(id, "nmap", &ooi);
        task_sql(
            id,
            "boefje-org1",
            None,
            3,
            &data,
            status,
            "2024-10-01 00:00:00+00",
            modified,
        )
    };
    s += &legacy(LEGACY_DONE, 14, "COMPLETED", "2024-10-01 00:10:00+00");
    s += &legacy(LEGACY_QUEUED, 15, "QUEUED", "2024-10-01 00:00:00+00");
    // Rows kat-scheduler refuses: a scheduler it has not, a payload without its boefje.
    s += &task_sql(
        UNKNOWN_SCHEDULER,
        "scanner",
        None,
        3,
        &boefje(UNKNOWN_SCHEDULER, "nmap", "IPAddressV4|internet|10.0.0.11"),
        "QUEUED",
        t0,
        t1,
    );
    s += &task_sql(
        MALFORMED,
        "boefje",
        None,
        3,
        &json!({"id": MALFORMED, "organization": "org1", "input_ooi": null}),
        "QUEUED",
        t0,
        t1,
    );
    s
}

/// Runs `kat-scheduler import-mula --from <mula> <extra…>` on the database `target`.
async fn import(mula: &MulaDb, target: &str, extra: &[&str]) -> Output {
    let mut cmd = Command::new(binary());
    cmd.arg("import-mula")
        .arg("--from")
        .arg(&mula.db.uri)
        .args(extra)
        .env("SCHEDULER_DB_URI", target)
        .env("SCHEDULER_LOGGING_FORMAT", "json")
        .env_remove("RUST_LOG");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    if std::env::var("TEST_LOG").is_ok() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    }
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Imports and asserts success; returns the summary.
async fn import_ok(mula: &MulaDb, target: &str, extra: &[&str]) -> String {
    let out = import(mula, target, extra).await;
    assert!(
        out.status.success(),
        "import-mula failed: {}\n{}",
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

fn time(v: &Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(v.as_str().expect("a time"))
        .unwrap()
        .to_utc()
}

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().to_utc()
}

/// Stops `app` and hands back its database.
async fn stop(mut app: TestApp) -> TestDb {
    app.stop().await;
    std::mem::replace(&mut app.db, TestDb::external(""))
}

async fn mula_s_schedules_and_tasks_arrive_and_queued_work_pops_in_priority_order(
    backend: Backend,
) {
    let Some(mula) = MulaDb::create().await else {
        return;
    };
    let Some(target) = TestDb::create(backend).await else {
        return;
    };

    // Act: batches of 4, so both tables take several.
    let out = import(&mula, &target.uri, &["--batch-size", "4"]).await;

    assert!(out.status.success(), "{}", stderr(&out));
    let summary = stdout(&out);
    assert!(
        summary
            .contains("schedules: read 5, imported 4, already present 0, hash taken 0, refused 1"),
        "{summary}"
    );
    assert!(
        summary.contains(&format!(
            "tasks: read {TASKS_READ}, imported {TASKS_IMPORTED}, already present 0, refused 2"
        )),
        "{summary}"
    );
    assert!(
        summary.contains(
            "tasks imported by status: cancelled 2, completed 2, dispatched 1, failed 2, pending 1, queued 4, running 1"
        ),
        "{summary}"
    );
    // Refusals by id, with the reason.
    assert!(
        summary.contains(&format!(
            "{S_BAD_CRON}: invalid cron expression '0 12 * * MON-FRI 30'"
        )),
        "{summary}"
    );
    assert!(
        summary.contains(&format!("{UNKNOWN_SCHEDULER}: scheduler_id 'scanner'")),
        "{summary}"
    );
    assert!(
        summary.contains(&format!("{MALFORMED}: data.boefje: required")),
        "{summary}"
    );
    assert!(
        summary.contains(
            "tasks failed as stalled (dispatched or running in mula for longer than their lease): 1"
        ),
        "{summary}"
    );
    assert!(
        summary.contains(
            "tasks of mula's schedulers per organisation (before OpenKAT 1.19), under their type's: 2 (those waiting or handed out cancelled)"
        ),
        "{summary}"
    );
    assert!(
        summary.contains(
            "schedules of mula's schedulers per organisation (before OpenKAT 1.19), under their type's: 1\n"
        ),
        "{summary}"
    );
    // Progress: a line per batch (schedules 5 → 2 batches, tasks 15 → 4).
    let log = stderr(&out);
    assert_eq!(log.matches("import-mula: batch done").count(), 6, "{log}");

    // Again: nothing new, and it says so.
    let again = import_ok(&mula, &target.uri, &[]).await;
    assert!(
        again.contains(&format!(
            "tasks: read {TASKS_READ}, imported 0, already present {TASKS_IMPORTED}, refused 2"
        )),
        "{again}"
    );
    assert!(
        again.contains("schedules: read 5, imported 0, already present 4"),
        "{again}"
    );
    assert!(again.contains("nothing new"), "{again}");

    // The service serves what mula held. Its dispatch lease is half an hour, so a task it hands
    // out ends its lease before the run leases the import gave (a day).
    let app = spawn_app_on(target, backend, |s| s.queue.dispatch_timeout_secs = 30 * 60).await;
    let listed: Value = app.get("/schedules?limit=50").await.json().await.unwrap();
    assert_eq!(listed["count"], 4, "{listed}");
    let by_id = |id: &str| {
        listed["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("schedule {id} listed: {listed}"))
    };
    // Rocky's monthly report from before OpenKAT 1.19 is the report scheduler's.
    let legacy = by_id(S_LEGACY);
    assert_eq!(legacy["scheduler_id"], "report");
    assert_eq!(legacy["schedule"], "0 6 1 * *");
    let daily = by_id(S_DAILY);
    assert_eq!(daily["schedule"], "0 0 * * *");
    assert_eq!(time(&daily["deadline_at"]), at("2026-12-01T00:00:00Z"));
    assert_eq!(daily["scheduler_id"], "boefje");
    assert_eq!(time(&daily["created_at"]), at("2025-09-01T08:00:00Z"));
    let one_off = by_id(S_ONE_OFF);
    assert_eq!(one_off["schedule"], Value::Null);
    assert_eq!(time(&one_off["deadline_at"]), at("2026-12-24T09:30:00Z"));
    assert_eq!(by_id(S_WEEKLY)["schedule"], "0 6 * * 1");

    // Waiting work pops by priority, with mula's ids (the pending one too).
    assert_eq!(
        app.pop_ids("boefje", 10).await,
        [Q_BOEFJE_2, Q_BOEFJE_3, P_BOEFJE_4]
    );
    assert_eq!(app.pop_ids("normalizer", 10).await, [Q_NORMALIZER]);
    let reports = app.pop_ok("report", 10, None).await;
    assert_eq!(result_ids(&json!({"results": reports})), [Q_REPORT]);
    assert_eq!(reports[0]["priority"], 5);
    assert_eq!(reports[0]["schedule_id"], S_ONE_OFF);
    assert_eq!(
        reports[0]["data"]["id"], Q_REPORT,
        "the payload carries the id"
    );

    // Finished work keeps its status and times.
    let done = app.task(COMPLETED).await;
    assert_eq!(done["status"], "completed");
    assert_eq!(time(&done["created_at"]), at("2025-09-30T00:00:00Z"));
    assert_eq!(
        time(&done["modified_at"]),
        at("2025-09-30T00:05:07.123456Z")
    );
    assert_eq!(done["schedule_id"], S_DAILY);
    assert_eq!(app.task(FAILED).await["status"], "failed");
    // A task mula's runner lost a year ago is failed, saying why; it runs no more.
    let stalled = app.task(STALLED).await;
    assert_eq!(stalled["status"], "failed");
    assert!(
        stalled["failure_reason"]
            .as_str()
            .is_some_and(|why| why.starts_with("stalled in mula: dispatched since 2025-10-01")),
        "{stalled}"
    );
    assert_eq!(app.task(CANCELLED).await["status"], "cancelled");

    // Work mula's runners held: as it was, and a runner's late report is taken.
    assert_eq!(app.task(RUNNING).await["status"], "running");
    assert_eq!(app.task(DISPATCHED).await["status"], "dispatched");
    let resp = app
        .patch_task(DISPATCHED, &json!({"status": "completed"}))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(app.task(DISPATCHED).await["status"], "completed");

    // The old scheduler's history is the boefje scheduler's; its work left waiting, cancelled.
    let done = app.task(LEGACY_DONE).await;
    assert_eq!(
        (done["scheduler_id"].clone(), done["status"].clone()),
        (json!("boefje"), json!("completed"))
    );
    let left = app.task(LEGACY_QUEUED).await;
    assert_eq!(left["status"], "cancelled");
    assert!(
        left["failure_reason"]
            .as_str()
            .is_some_and(|why| why.contains("mula's scheduler 'boefje-org1'")),
        "{left}"
    );

    // Refused rows are not there.
    assert_eq!(
        app.get_task(UNKNOWN_SCHEDULER).await.status(),
        StatusCode::NOT_FOUND
    );

    // A runner that never reports: its lease, taken at the import, ends, and the task goes back
    // to the queue under its id.
    app.advance(chrono::Duration::seconds(
        i64::try_from(kat_scheduler::config::DEFAULT_UNRENEWED_RUN_TIMEOUT_SECS).unwrap() + 3600,
    ));
    app.sweep().await;
    let requeued = app.task(RUNNING).await;
    assert_eq!(requeued["status"], "queued", "{requeued}");
    assert_eq!(requeued["attempts"], 1);
    // The normalizer task popped above, never reported on, is the same work (mula held it
    // queued and running at once). Its lease ended first; then this one came back to wait and
    // took its place with its priority: the work waits once.
    assert_eq!(requeued["priority"], 1);
    let withdrawn = app.task(Q_NORMALIZER).await;
    assert_eq!(withdrawn["status"], "cancelled");
    assert!(
        withdrawn["failure_reason"]
            .as_str()
            .is_some_and(|why| why.contains(RUNNING)),
        "{withdrawn}"
    );
    assert_eq!(app.pop_ids("normalizer", 10).await, [RUNNING]);
    drop(stop(app).await);
}

async fn an_import_into_a_database_with_work_leaves_that_work_as_it_was(backend: Backend) {
    let Some(mula) = MulaDb::create().await else {
        return;
    };
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // Arrange: work of the service's own, one task under an id mula holds too, and a schedule
    // for the same work as one of mula's (so the same hash).
    let own = app
        .push_ok(
            "boefje",
            &boefje_push("org2", "nmap", Some("IPAddressV4|internet|10.9.9.9"), 1),
        )
        .await;
    // The same work as mula's queued Q_BOEFJE_3, waiting here already.
    let same_work = app
        .push_ok(
            "boefje",
            &boefje_push(
                "org1",
                "dns-records",
                Some("Hostname|internet|a.example"),
                5,
            ),
        )
        .await;
    let mut clash = boefje_push("org2", "nmap", Some("IPAddressV4|internet|10.8.8.8"), 9);
    clash["id"] = json!(Q_BOEFJE_2);
    let clash = app.push_ok("boefje", &clash).await;
    let resp = app
        .post(
            "/schedules",
            Some(&json!({"scheduler_id": "report", "organisation": "org1",
                "data": report("recipe-weekly"), "schedule": "0 7 * * *"})),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let holder: Value = resp.json().await.unwrap();
    let before = [
        app.task(&id_of(&own)).await,
        app.task(Q_BOEFJE_2).await,
        app.task(&id_of(&same_work)).await,
    ];
    let holder_before = app
        .get(&format!("/schedules/{}", id_of(&holder)))
        .await
        .json::<Value>()
        .await
        .unwrap();
    let db = stop(app).await;

    // Act
    let summary = import_ok(&mula, &db.uri, &[]).await;

    // Assert: mula's clashing rows are skipped and said to be.
    assert!(
        summary.contains(&format!(
            "tasks: read {TASKS_READ}, imported {}, already present 1, refused 3",
            TASKS_IMPORTED - 2
        )),
        "{summary}"
    );
    // mula's copy is more urgent (3 against 5): as a push of it would, it moves the waiting
    // task forward.
    assert!(
        summary.contains(&format!(
            "{Q_BOEFJE_3}: the same work (hash {}) waits as task {} already, which takes its \
             priority 3",
            same_work["hash"].as_str().unwrap(),
            id_of(&same_work)
        )),
        "{summary}"
    );
    // The push of the same work as mula's daily schedule made its schedule here (as mula's
    // push does), so that one's hash is taken too.
    assert!(
        summary.contains("schedules: read 5, imported 2, already present 0, hash taken 2"),
        "{summary}"
    );
    assert!(
        summary.contains(&format!(
            "schedule {S_WEEKLY} skipped: its hash is held by schedule {}",
            id_of(&holder)
        )),
        "{summary}"
    );
    // Pop order by priority alone is checked below: organisations do not take turns here.
    let app = spawn_app_on(db, backend, |s| {
        s.schedulers.boefje.fairness = Some(kat_scheduler::queue::fair::Fairness::Off);
    })
    .await;
    assert_eq!(app.task(&id_of(&own)).await, before[0], "untouched");
    assert_eq!(app.task(Q_BOEFJE_2).await, before[1], "not overwritten");
    let mut boosted = app.task(&id_of(&same_work)).await;
    assert_eq!(boosted["priority"], 3, "mula's more urgent copy's priority");
    assert!(time(&boosted["modified_at"]) > time(&before[2]["modified_at"]));
    for k in ["priority", "modified_at"] {
        boosted[k] = before[2][k].clone();
    }
    assert_eq!(boosted, before[2], "otherwise untouched");
    assert_eq!(
        app.get(&format!("/schedules/{}", id_of(&holder)))
            .await
            .json::<Value>()
            .await
            .unwrap(),
        holder_before
    );
    // mula's tasks of skipped schedules are linked to the schedules holding their work.
    assert_eq!(app.task(CANCELLED).await["schedule_id"], id_of(&holder));
    assert_eq!(
        app.task(COMPLETED).await["schedule_id"],
        app.task(&id_of(&same_work)).await["schedule_id"]
    );
    // The service's own queued tasks still pop, among mula's by priority: its own (1), its own
    // of the work mula also held (mula's 3), mula's pending one (4), its own under the id mula
    // also held (9).
    assert_eq!(
        app.pop_ids("boefje", 10).await,
        [
            id_of(&own).as_str(),
            &id_of(&same_work),
            P_BOEFJE_4,
            &id_of(&clash)
        ]
    );
    drop(stop(app).await);
}

/// Two waiting copies of one piece of work in mula (its own rows, or two that hash alike once
/// the payload is hashed): the first read is kept, and a later, more urgent one (a user's scan
/// among automatic work) moves it forward to its priority, whether the first was written in an
/// earlier batch or waits in the same one.
async fn mula_s_more_urgent_copy_of_waiting_work_moves_the_kept_one_forward(backend: Backend) {
    let (automatic, user) = (
        "c1000000-0000-4000-8000-000000000001",
        "c1000000-0000-4000-8000-000000000002",
    );
    for batch in ["1", "1000"] {
        let Some(mula) = MulaDb::create().await else {
            return;
        };
        let uri = mula.db.uri.clone();
        tokio::task::spawn_blocking(move || {
            let ooi = "Hostname|internet|twice.example";
            let (t0, t1) = ("2025-10-02 00:00:00+00", "2025-10-02 01:00:00+00");
            let rows = task_sql(
                automatic,
                "boefje",
                None,
                400,
                &boefje(automatic, "dns-records", ooi),
                "PENDING",
                t0,
                t1,
            ) + &task_sql(
                user,
                "boefje",
                None,
                1,
                &boefje(user, "dns-records", ooi),
                "QUEUED",
                t0,
                t1,
            );
            PgConnection::establish(&uri)
                .unwrap()
                .batch_execute(&rows)
                .unwrap();
        })
        .await
        .unwrap();
        let Some(app) = spawn_app(backend).await else {
            return;
        };
        let db = stop(app).await;

        let summary = import_ok(&mula, &db.uri, &["--batch-size", batch]).await;

        assert!(
            summary.contains(&format!("{user}: the same work (hash ")),
            "{summary}"
        );
        assert!(
            summary.contains(&format!(
                "waits as task {automatic} already, which takes its priority 1"
            )),
            "{summary}"
        );
        let app = spawn_app_on(db, backend, |s| {
            s.schedulers.boefje.fairness = Some(kat_scheduler::queue::fair::Fairness::Off);
        })
        .await;
        assert_eq!(app.task(automatic).await["priority"], 1, "batch {batch}");
        assert_eq!(app.get_task(user).await.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            app.pop_ids("boefje", 1).await,
            [automatic],
            "the most urgent work first (batch {batch})"
        );
        drop(stop(app).await);
    }
}

async fn a_dry_run_reads_and_checks_everything_and_writes_nothing(backend: Backend) {
    let Some(mula) = MulaDb::create().await else {
        return;
    };
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let db = stop(app).await;

    let summary = import_ok(&mula, &db.uri, &["--dry-run"]).await;

    assert!(
        summary.contains("dry run: nothing was written"),
        "{summary}"
    );
    assert!(
        summary.contains(&format!(
            "tasks: read {TASKS_READ}, imported {TASKS_IMPORTED}, already present 0, refused 2"
        )),
        "{summary}"
    );
    assert!(summary.contains(UNKNOWN_SCHEDULER), "{summary}");
    let app = spawn_app_on(db, backend, |_| {}).await;
    let tasks: Value = app.get("/tasks?limit=0").await.json().await.unwrap();
    assert_eq!(tasks["count"], 0, "{tasks}");
    let schedules: Value = app.get("/schedules?limit=0").await.json().await.unwrap();
    assert_eq!(schedules["count"], 0, "{schedules}");
    drop(stop(app).await);
}

async fn the_import_refuses_to_write_behind_a_running_service(backend: Backend) {
    let Some(mula) = MulaDb::create().await else {
        return;
    };
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // On PostgreSQL the service owns its schedulers from its start (one ownership round runs
    // before the engines build their heaps).

    let out = import(&mula, &app.db.uri, &[]).await;

    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("stop kat-scheduler") || stderr(&out).contains("stop every instance"),
        "{}",
        stderr(&out)
    );
    let tasks: Value = app.get("/tasks?limit=0").await.json().await.unwrap();
    assert_eq!(tasks["count"], 0, "{tasks}");
    drop(stop(app).await);
}

/// While an import writes to PostgreSQL (its session holds the import lock), an instance that
/// starts takes no lease, so builds no heap from a table half imported: it answers 503, and takes
/// its schedulers once the import has ended. A second import meanwhile is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_started_during_an_import_serves_only_after_it() {
    let Some(mula) = MulaDb::create().await else {
        return;
    };
    let Some(target) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    // The import under way: a session holding its lock on the migrated target.
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let uri = target.uri.clone();
    let importing = std::thread::spawn(move || {
        use diesel::RunQueryDsl;
        let target = kat_scheduler::storage::DbTarget::parse(&uri).unwrap();
        let mut c = kat_scheduler::storage::open(&target).expect("connect");
        kat_scheduler::storage::run_migrations(&mut c).unwrap();
        diesel::sql_query(format!(
            "SELECT pg_advisory_lock({})",
            kat_scheduler::storage::owners::IMPORT_LOCK
        ))
        .execute(&mut c)
        .unwrap();
        locked_tx.send(()).unwrap();
        let _ = end_rx.recv();
    });
    locked_rx.recv().unwrap();

    let out = import(&mula, &target.uri, &[]).await;
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("another import-mula is writing"),
        "{}",
        stderr(&out)
    );

    let app = spawn_app_on(target, Backend::Postgres, |s| s.cluster.lease_ms = 600).await;
    let pushed = app
        .push("boefje", &boefje_push("org1", "dns", None, 1))
        .await;
    assert_eq!(pushed.status(), 503, "no lease taken during the import");

    end_tx.send(()).unwrap();
    importing.join().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let status = loop {
        let status = app
            .push("boefje", &boefje_push("org1", "dns", None, 1))
            .await
            .status();
        if status == 201 || std::time::Instant::now() > deadline {
            break status;
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(status, 201, "served once the import ended");
    drop(stop(app).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_into_a_file_that_does_not_exist_creates_nothing() {
    let Some(mula) = MulaDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scheduler.db");

    let summary = import_ok(
        &mula,
        &format!("sqlite://{}", file.display()),
        &["--dry-run"],
    )
    .await;

    assert!(
        summary.contains(&format!(
            "tasks: read {TASKS_READ}, imported {TASKS_IMPORTED}"
        )),
        "{summary}"
    );
    assert!(!file.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// OpenKAT's stock `.env` names mula's database in `SCHEDULER_DB_URI`. Started on it, the
/// service and `migrate` refuse at once, saying what to do, and change nothing in it; before,
/// the first migration failed on mula's `tasks` with "relation already exists".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_refuses_mula_s_own_database_saying_what_to_do() {
    let Some(mula) = MulaDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for args in [&[][..], &["migrate"][..]] {
        let out = Command::new(binary())
            .args(args)
            .current_dir(dir.path())
            .env("SCHEDULER_DB_URI", &mula.db.uri)
            .env("SCHEDULER_API_PORT", "0")
            .env("SCHEDULER_LOGGING_FORMAT", "text")
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.contains("the database is mula's (alembic revision 0010)")
                && err.contains("kat-scheduler import-mula --from"),
            "{args:?}: {err}"
        );
    }
    let uri = mula.db.uri.clone();
    let diesel_table = tokio::task::spawn_blocking(move || {
        use diesel::RunQueryDsl;
        #[derive(diesel::QueryableByName)]
        struct T {
            #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
            t: Option<String>,
        }
        diesel::sql_query("SELECT CAST(to_regclass('__diesel_schema_migrations') AS text) AS t")
            .load::<T>(&mut PgConnection::establish(&uri).unwrap())
            .unwrap()
            .pop()
            .unwrap()
            .t
    })
    .await
    .unwrap();
    assert_eq!(diesel_table, None, "nothing written to mula's database");
}

/// The import reads mula's tables in one snapshot: a row written after it began (mula left
/// running, say) is not half seen, between a count and the pages or between the schedules and
/// the tasks that name them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mula_s_tables_are_read_in_one_snapshot() {
    use kat_scheduler::storage::mula::{self, MulaTable};
    let Some(db) = MulaDb::create().await else {
        return;
    };
    let uri = db.db.uri.clone();
    tokio::task::spawn_blocking(move || {
        let mut session = mula::open(&uri).unwrap();
        mula::snapshot(&mut session).unwrap();
        let before = mula::count(&mut session, MulaTable::Tasks).unwrap();
        let mut writer = PgConnection::establish(&uri).unwrap();
        writer
            .batch_execute(&task_sql(
                "b0000000-0000-4000-8000-0000000000ff",
                "boefje",
                None,
                1,
                &boefje(
                    "b0000000-0000-4000-8000-0000000000ff",
                    "nmap",
                    "IPAddressV4|internet|10.0.0.99",
                ),
                "QUEUED",
                "2026-01-01 00:00:00+00",
                "2026-01-01 00:00:00+00",
            ))
            .unwrap();
        assert_eq!(
            mula::count(&mut session, MulaTable::Tasks).unwrap(),
            before,
            "the session's snapshot"
        );
        let mut fresh = mula::open(&uri).unwrap();
        assert_eq!(
            mula::count(&mut fresh, MulaTable::Tasks).unwrap(),
            before + 1,
            "the row is there"
        );
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_is_not_mula_s_is_refused_by_name() {
    let Some(not_mula) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let target = format!("sqlite://{}", dir.path().join("s.db").display());
    let mula = MulaDb { db: not_mula };

    let out = import(&mula, &target, &[]).await;

    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not mula's database"),
        "{}",
        stderr(&out)
    );
}

/// mula's newest revision, `0011`, adds indexes only: its database imports as at `0010`. Its
/// boefje schedules mula's rescheduling disabled (their plugin off, object gone or clearance too
/// low at the time: the webapp disables report schedules only) come back when their work is
/// planned again, as the service's own disables do; a report schedule disabled stays so.
async fn schedules_mula_disabled_come_back_with_their_work_at_mula_s_newest_revision(
    backend: Backend,
) {
    use kat_scheduler::domain::event::{ObjectEvent, ObjectState, Operation};
    let Some(mula) = MulaDb::create().await else {
        return;
    };
    let Some(target) = TestDb::create(backend).await else {
        return;
    };
    const S_OFF: &str = "a0000000-0000-4000-8000-0000000000f1";
    const S_REPORT_OFF: &str = "a0000000-0000-4000-8000-0000000000f2";
    let ooi = "Hostname|internet|b.example";
    let mut rows = schedule_sql(
        S_OFF,
        "boefje",
        &boefje(S_OFF, "dns-records", ooi),
        None,
        Some("2025-06-01 00:00:00+00"),
    );
    rows += &schedule_sql(
        S_REPORT_OFF,
        "report",
        &report("e0000000-0000-4000-8000-0000000000f2"),
        Some("0 6 * * 1"),
        Some("2025-06-02 06:00:00+00"),
    );
    rows += &format!(
        "UPDATE schedules SET enabled = false WHERE id IN ('{S_OFF}', '{S_REPORT_OFF}');
         UPDATE alembic_version SET version_num = '0011';
         CREATE INDEX ix_schedules_enabled ON schedules (enabled);
         CREATE INDEX ix_schedules_hash ON schedules (hash);
         CREATE INDEX ix_schedules_scheduler_id ON schedules (scheduler_id);
         CREATE UNIQUE INDEX ix_tasks_active_per_schedule ON tasks (schedule_id)
             WHERE status IN ('PENDING', 'QUEUED', 'DISPATCHED', 'RUNNING');
         CREATE INDEX ix_tasks_status ON tasks (status);
         CREATE INDEX ix_tasks_type ON tasks (type);"
    );
    let uri = mula.db.uri.clone();
    tokio::task::spawn_blocking(move || {
        PgConnection::establish(&uri)
            .unwrap()
            .batch_execute(&rows)
            .unwrap();
    })
    .await
    .unwrap();

    let summary = import_ok(&mula, &target.uri, &[]).await;
    assert!(
        summary.contains("schedules: read 7, imported 6"),
        "{summary}"
    );

    let dir = tempfile::tempdir().unwrap();
    let c = dns_records_catalogue(&dir);
    let app = spawn_app_on(target, backend, move |s| s.catalogue.file = c).await;
    let state = |id: &'static str| {
        let app = &app;
        async move {
            let s = app.schedule(id).await;
            (s["enabled"].as_bool().unwrap(), s["deadline_at"].clone())
        }
    };
    assert!(!state(S_OFF).await.0);
    assert!(!state(S_REPORT_OFF).await.0);

    // The host is created again at a level the boefje may scan: its work is planned.
    let event = ObjectEvent {
        operation: Operation::Create,
        organisation: "org1".into(),
        reference: ooi.into(),
        object: Some(ObjectState {
            object_type: "Hostname".into(),
            scan_level: Some(2),
            scan_profile_type: None,
        }),
    };
    app.frontier()
        .apply_objects(&[&event], app.now().naive_utc())
        .await
        .unwrap();
    assert_eq!(app.planner.objects(&[&event]).await, vec![Ok(1)]);
    let (enabled, deadline) = state(S_OFF).await;
    assert!(
        enabled,
        "mula's disable of the boefje schedule did not give way"
    );
    assert!(time(&deadline) >= app.now(), "{deadline}");
    assert!(!state(S_REPORT_OFF).await.0, "a user's disable stands");
    stop(app).await;
}

crate::backend_tests!(
    schedules_mula_disabled_come_back_with_their_work_at_mula_s_newest_revision,
    mula_s_schedules_and_tasks_arrive_and_queued_work_pops_in_priority_order,
    an_import_into_a_database_with_work_leaves_that_work_as_it_was,
    mula_s_more_urgent_copy_of_waiting_work_moves_the_kept_one_forward,
    a_dry_run_reads_and_checks_everything_and_writes_nothing,
    the_import_refuses_to_write_behind_a_running_service,
);
