//! The fire ledger: every due fire of a schedule is accounted for in
//! `GET /schedules/{id}/history`: fired with its task, skipped with the reason (and the task in
//! its way), or waiting for what cannot answer yet, with how late it was decided; paged like
//! `/schedules`, kept for the configured days, and counted in `/metrics`. The schedule's own
//! answers stay mula's.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, TimeZone, Utc};
use kat_scheduler::domain::SchedulerId;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::*;
use crate::stubs::*;

fn midnight() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2027, 5, 1, 0, 0, 0).unwrap()
}

/// A report schedule of `org1`, due at `deadline`, recurring by `cron` if given; answers it.
async fn report_schedule(
    app: &TestApp,
    recipe: &str,
    deadline: DateTime<Utc>,
    cron: Option<&str>,
) -> Value {
    let mut body = json!({"scheduler_id": "report", "organisation": "org1",
        "deadline_at": deadline.to_rfc3339(),
        "data": {"organisation_id": "org1", "report_recipe_id": recipe}});
    if let Some(c) = cron {
        body["schedule"] = json!(c);
    }
    let resp = app.post("/schedules", Some(&body)).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    resp.json().await.unwrap()
}

fn id(v: &Value) -> String {
    v["id"].as_str().unwrap().to_owned()
}

/// `GET /schedules/{schedule}/history{query}`, asserting 200.
async fn history(app: &TestApp, schedule: &str, query: &str) -> Value {
    let resp = app
        .get(&format!("/schedules/{schedule}/history{query}"))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    resp.json().await.unwrap()
}

/// `GET /schedules/{schedule}`.
async fn schedule(app: &TestApp, schedule: &str) -> Value {
    app.get(&format!("/schedules/{schedule}"))
        .await
        .json()
        .await
        .unwrap()
}

/// The newest fire of a schedule.
async fn newest(app: &TestApp, schedule: &str) -> Value {
    history(app, schedule, "?limit=1").await["results"][0].clone()
}

async fn summary(app: &TestApp, s: SchedulerId) -> String {
    app.tick(s).await.entries["reschedule"].summary.clone()
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

/// The samples of `/metrics` that start with `prefix`, as (sample, value).
async fn samples(app: &TestApp, prefix: &str) -> Vec<(String, f64)> {
    let page = app.get("/metrics").await.text().await.unwrap();
    page.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
        .collect()
}

async fn fires_counted(app: &TestApp, scheduler: &str, outcome: &str, reason: &str) -> f64 {
    let key = format!(
        "scheduler_schedule_fires_total{{scheduler_id=\"{scheduler}\",outcome=\"{outcome}\",reason=\"{reason}\"}}"
    );
    samples(app, "scheduler_schedule_fires_total")
        .await
        .into_iter()
        .find(|(k, _)| *k == key)
        .unwrap_or_else(|| panic!("{key} is not served"))
        .1
}

/// The keys of a schedule as mula answers it (plus `disabled_reason`, as before the ledger).
const SCHEDULE_KEYS: [&str; 11] = [
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
    "disabled_reason",
];

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

async fn a_fire_is_recorded_fired_skipped_behind_queued_work_and_waiting_behind_a_run(
    backend: Backend,
) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.clock.set(midnight());
    let s = report_schedule(&app, "weekly", midnight(), Some("0 * * * *")).await;
    let sid = id(&s);
    assert_eq!(
        history(&app, &sid, "").await,
        json!({"count": 0, "next": null, "previous": null, "results": []}),
        "nothing was due yet"
    );

    assert_eq!(
        summary(&app, SchedulerId::Report).await,
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    let page: Value = app
        .get("/tasks?scheduler_id=report")
        .await
        .json()
        .await
        .unwrap();
    let first = id(&page["results"][0]);
    let page = history(&app, &sid, "").await;
    assert_eq!(page["count"], 1);
    assert_eq!(
        page["results"][0],
        json!({"schedule_id": sid, "scheduler_id": "report", "organisation": "org1",
               "due_at": "2027-05-01T00:00:00Z", "decided_at": "2027-05-01T00:00:00Z",
               "outcome": "fired", "reason": null, "task_id": first, "detail": null,
               "late_seconds": 0, "late": false})
    );

    // The next hour's fire finds the first task still waiting: the same work is not queued
    // twice, and the ledger names the task in its way.
    app.advance(Duration::hours(1));
    assert_eq!(
        summary(&app, SchedulerId::Report).await,
        "fired 0, skipped 1, disabled 0, waiting 0"
    );
    let skipped = newest(&app, &sid).await;
    assert_eq!(
        (
            &skipped["outcome"],
            &skipped["reason"],
            &skipped["task_id"],
            &skipped["due_at"]
        ),
        (
            &json!("skipped"),
            &json!("duplicate_queued"),
            &json!(first),
            &json!("2027-05-01T01:00:00Z")
        )
    );

    // Handed out and still running an hour later: no concurrent invocation, so the fire waits
    // for it, naming it, and keeps its deadline.
    assert_eq!(app.pop_ok("report", 1, None).await.len(), 1);
    app.patch_task(&first, &json!({"status": "running"})).await;
    app.advance(Duration::hours(1));
    assert_eq!(
        summary(&app, SchedulerId::Report).await,
        "fired 0, skipped 0, disabled 0, waiting 1"
    );
    let waiting = newest(&app, &sid).await;
    assert_eq!(
        (
            &waiting["outcome"],
            &waiting["reason"],
            &waiting["task_id"],
            &waiting["due_at"]
        ),
        (
            &json!("waiting"),
            &json!("still_running"),
            &json!(first),
            &json!("2027-05-01T02:00:00Z")
        )
    );
    // Another hour still running: the fire that passed meanwhile is the same waiting one.
    app.advance(Duration::hours(1));
    app.tick(SchedulerId::Report).await;
    assert_eq!(history(&app, &sid, "").await["count"], 3);
    assert_eq!(
        time(&schedule(&app, &sid).await["deadline_at"]),
        midnight() + Duration::hours(2),
        "a waiting fire keeps its deadline"
    );

    // Done: the waiting fire runs on the next tick, late, with a task of its own, and keeps
    // why it waited.
    app.patch_task(&first, &json!({"status": "completed"}))
        .await;
    assert_eq!(
        summary(&app, SchedulerId::Report).await,
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    let fired = newest(&app, &sid).await;
    assert_eq!(
        (
            &fired["outcome"],
            &fired["reason"],
            &fired["due_at"],
            &fired["late"]
        ),
        (
            &json!("fired"),
            &json!("still_running"),
            &json!("2027-05-01T02:00:00Z"),
            &json!(true)
        )
    );
    assert_eq!(fired["late_seconds"], 3600);
    let second = fired["task_id"].as_str().unwrap().to_owned();
    assert_ne!(second, first);
    assert_eq!(app.task(&second).await["schedule_id"], json!(sid));

    let outcomes: Vec<(Value, Value)> = history(&app, &sid, "").await["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["outcome"].clone(), f["reason"].clone()))
        .collect();
    assert_eq!(
        outcomes,
        [
            (json!("fired"), json!("still_running")),
            (json!("skipped"), json!("duplicate_queued")),
            (json!("fired"), Value::Null),
        ],
        "every due fire, newest first"
    );
    assert_eq!(fires_counted(&app, "report", "fired", "on_time").await, 1.0);
    assert_eq!(fires_counted(&app, "report", "fired", "late").await, 1.0);
    assert_eq!(
        fires_counted(&app, "report", "skipped", "duplicate_queued").await,
        1.0
    );
    assert!(
        samples(&app, "scheduler_schedule_fires_total")
            .await
            .iter()
            .all(|(k, _)| !k.contains("still_running")),
        "a fire that waits is not counted as skipped"
    );
    assert_eq!(
        fires_counted(&app, "boefje", "skipped", "object_gone").await,
        0.0
    );

    // The schedule's own answers are mula's, as before: no key added.
    let expected: BTreeSet<String> = SCHEDULE_KEYS.iter().map(|k| (*k).to_owned()).collect();
    let one: Value = app
        .get(&format!("/schedules/{sid}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(keys(&one), expected);
    assert_eq!(
        time(&one["deadline_at"]),
        midnight() + Duration::hours(4),
        "the schedule moved on from the fire that waited to the next cron fire"
    );
    let listed: Value = app.get("/schedules").await.json().await.unwrap();
    assert_eq!(
        keys(&listed),
        ["count", "next", "previous", "results"]
            .iter()
            .map(|k| (*k).to_owned())
            .collect()
    );
    assert_eq!(keys(&listed["results"][0]), expected);
}

/// Plugins for every organisation; ColdStart pages only `listed`, which has no objects.
const CATALOGUE: &str = r#"
organisations = ["listed"]

[[plugins]]
id = "dns-records"
type = "boefje"
consumes = ["Hostname"]
scan_level = 2
enabled = true
interval = 60
"#;

const HOST: &str = "Hostname|internet|h0.example.nl";

async fn a_fire_whose_object_octopoes_lacks_is_skipped_and_one_octopoes_cannot_answer_for_waits(
    backend: Backend,
) {
    let dir = tempfile::tempdir().unwrap();
    let catalogue = dir.path().join("catalogue.toml");
    std::fs::write(&catalogue, CATALOGUE).unwrap();
    let octopoes = OctopoesState::default();
    octopoes.set("unlisted", vec![octopoes_object(HOST, "Hostname", 2)]);
    octopoes.set("listed", Vec::new());
    let stub = octopoes.serve();
    let url = stub.url.clone();
    let Some(app) = spawn_app_with(backend, move |s| {
        s.catalogue.file = catalogue.to_string_lossy().into_owned();
        s.clients.octopoes_api = url;
    })
    .await
    else {
        return;
    };
    app.clock.set(midnight());
    let boefje = |ooi: &str| {
        json!({"scheduler_id": "boefje", "organisation": "unlisted",
               "deadline_at": (midnight() - Duration::minutes(1)).to_rfc3339(),
               "data": {"boefje": {"id": "dns-records"}, "input_ooi": ooi,
                        "organization": "unlisted"}})
    };
    let create = |body: Value| {
        let app = &app;
        async move {
            let resp = app.post("/schedules", Some(&body)).await;
            assert_eq!(resp.status(), StatusCode::CREATED);
            id(&resp.json::<Value>().await.unwrap())
        }
    };

    // Octopoes' own "not found": skipped, and the schedule disabled with the same words.
    let gone = create(boefje("Hostname|internet|deleted.example.nl")).await;
    assert_eq!(
        summary(&app, SchedulerId::Boefje).await,
        "fired 0, skipped 0, disabled 1, waiting 0"
    );
    let fire = newest(&app, &gone).await;
    assert_eq!(
        (&fire["outcome"], &fire["reason"], &fire["task_id"]),
        (&json!("skipped"), &json!("object_gone"), &Value::Null)
    );
    let schedule: Value = app
        .get(&format!("/schedules/{gone}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(schedule["enabled"], false);
    assert_eq!(fire["detail"], schedule["disabled_reason"]);
    assert!(
        fire["detail"].as_str().unwrap().contains("is gone"),
        "{fire}"
    );
    assert_eq!(
        (fire["late_seconds"].as_i64(), fire["late"].as_bool()),
        (Some(60), Some(true)),
        "due a minute before the tick that decided it"
    );

    // Octopoes down: the fire waits, recorded once with what it waits for.
    octopoes.set_down(true);
    let waits = create(boefje(HOST)).await;
    assert_eq!(
        summary(&app, SchedulerId::Boefje).await,
        "fired 0, skipped 0, disabled 0, waiting 1"
    );
    app.advance(Duration::seconds(1));
    app.tick(SchedulerId::Boefje).await;
    let page = history(&app, &waits, "").await;
    assert_eq!(page["count"], 1, "one row per due fire, however many ticks");
    let fire = &page["results"][0];
    assert_eq!(
        (&fire["outcome"], &fire["reason"], &fire["task_id"]),
        (
            &json!("waiting"),
            &json!("octopoes_unavailable"),
            &Value::Null
        )
    );
    assert_eq!(
        time(&fire["decided_at"]),
        midnight(),
        "when it first waited"
    );

    // Back two hours later: the same fire is decided, late, and says why it was.
    octopoes.set_down(false);
    app.advance(Duration::hours(2));
    assert_eq!(
        summary(&app, SchedulerId::Boefje).await,
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    let task = &app.pop_ok("boefje", 1, None).await[0];
    let page = history(&app, &waits, "").await;
    assert_eq!(page["count"], 1);
    let fire = &page["results"][0];
    assert_eq!(
        (&fire["outcome"], &fire["reason"], &fire["task_id"]),
        (
            &json!("fired"),
            &json!("octopoes_unavailable"),
            &json!(id_of(task))
        )
    );
    assert_eq!(time(&fire["due_at"]), midnight() - Duration::minutes(1));
    assert_eq!(
        time(&fire["decided_at"]),
        midnight() + Duration::seconds(1) + Duration::hours(2)
    );
    assert_eq!(
        (fire["late_seconds"].as_i64(), fire["late"].as_bool()),
        (Some(60 + 1 + 7200), Some(true))
    );
    assert_eq!(fires_counted(&app, "boefje", "fired", "late").await, 1.0);
    assert_eq!(
        fires_counted(&app, "boefje", "skipped", "object_gone").await,
        1.0
    );
}

/// Rocky's "Rerun" of a one-off report sets its deadline to now. Asked while the report's
/// previous run is still out, it runs once that run has ended: moving on would have left the
/// one-off with no deadline at all, the rerun lost.
async fn a_reports_rerun_asked_while_its_last_run_is_out_runs_after_it(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.clock.set(midnight());
    let sid = id(&report_schedule(&app, "once", midnight(), None).await);
    assert_eq!(
        summary(&app, SchedulerId::Report).await,
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    let first = newest(&app, &sid).await["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let popped = app.pop_ok("report", 1, None).await;
    assert_eq!(id(&popped[0]), first);
    app.patch_task(&first, &json!({"status": "running"})).await;
    assert_eq!(
        schedule(&app, &sid).await["deadline_at"],
        Value::Null,
        "a one-off"
    );

    // The rerun, as Rocky sends it.
    app.advance(Duration::minutes(10));
    let now = midnight() + Duration::minutes(10);
    let resp = app
        .patch(
            &format!("/schedules/{sid}"),
            &json!({"deadline_at": now.to_rfc3339()}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    app.advance(Duration::seconds(1));
    assert_eq!(
        summary(&app, SchedulerId::Report).await,
        "fired 0, skipped 0, disabled 0, waiting 1"
    );
    let waiting = newest(&app, &sid).await;
    assert_eq!(
        (&waiting["outcome"], &waiting["reason"], &waiting["task_id"]),
        (&json!("waiting"), &json!("still_running"), &json!(first))
    );
    assert_eq!(time(&schedule(&app, &sid).await["deadline_at"]), now);

    app.patch_task(&first, &json!({"status": "completed"}))
        .await;
    app.advance(Duration::seconds(1));
    assert_eq!(
        summary(&app, SchedulerId::Report).await,
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    let rerun = newest(&app, &sid).await;
    assert_eq!(rerun["outcome"], "fired");
    let second = rerun["task_id"].as_str().unwrap().to_owned();
    assert_ne!(second, first);
    assert_eq!(app.task(&second).await["status"], "queued");
    assert_eq!(
        schedule(&app, &sid).await["deadline_at"],
        Value::Null,
        "a one-off again once its rerun ran"
    );
}

async fn a_fire_decided_after_the_service_was_down_shows_how_late_it_was(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.clock.set(midnight());
    let missed = report_schedule(&app, "missed", midnight(), None).await;
    let tick_after = midnight() + Duration::hours(2) + Duration::seconds(30);
    let just = report_schedule(&app, "just", tick_after - Duration::seconds(1), None).await;
    // No tick for two and a half hours (the service was stopped); then one.
    app.clock.set(tick_after);
    assert_eq!(
        summary(&app, SchedulerId::Report).await,
        "fired 2, skipped 0, disabled 0, waiting 0"
    );
    let late = newest(&app, &id(&missed)).await;
    assert_eq!(late["outcome"], "fired");
    assert_eq!(
        (late["late_seconds"].as_i64(), late["late"].as_bool()),
        (Some(7230), Some(true))
    );
    assert_eq!(time(&late["decided_at"]), tick_after);
    let on_time = newest(&app, &id(&just)).await;
    assert_eq!(
        (on_time["late_seconds"].as_i64(), on_time["late"].as_bool()),
        (Some(1), Some(false)),
        "decided by the next tick after it came due: not late"
    );
    assert_eq!(fires_counted(&app, "report", "fired", "late").await, 1.0);
    assert_eq!(fires_counted(&app, "report", "fired", "on_time").await, 1.0);
}

async fn a_fire_pushed_just_before_a_crash_is_recorded_fired_once(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.clock.set(midnight());
    let deadline = midnight() - Duration::minutes(1);
    let sid = id(&report_schedule(&app, "r1", deadline, Some("0 * * * *")).await);
    // The crash window: the fire's task was pushed, the schedule's update (and its fire's
    // record, written with it) never was.
    let fire = kat_scheduler::cron::reschedule::fire_id(&sid, Some(deadline.naive_utc()));
    let mut data = serde_json::Map::new();
    data.insert("organisation_id".into(), json!("org1"));
    data.insert("report_recipe_id".into(), json!("r1"));
    app.broker
        .push(
            SchedulerId::Report,
            kat_scheduler::queue::PushRequest {
                id: Some(fire),
                organisation: "org1".into(),
                priority: Some(5),
                data,
                planned: true,
                once: true,
                schedule_id: uuid::Uuid::parse_str(&sid).ok(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(history(&app, &sid, "").await["count"], 0);
    assert_eq!(
        summary(&app, SchedulerId::Report).await,
        "fired 0, skipped 1, disabled 0, waiting 0"
    );
    let page = history(&app, &sid, "").await;
    assert_eq!(page["count"], 1);
    let recorded = &page["results"][0];
    assert_eq!(
        (
            &recorded["outcome"],
            &recorded["task_id"],
            &recorded["reason"]
        ),
        (&json!("fired"), &json!(fire.to_string()), &Value::Null),
        "the fire did happen: its task is there"
    );
}

async fn a_schedules_history_is_paged_newest_first_like_the_schedules(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.clock.set(midnight());
    let sid = id(&report_schedule(&app, "hourly", midnight(), Some("0 * * * *")).await);
    for _ in 0..25 {
        app.tick(SchedulerId::Report).await;
        for t in app.pop_ok("report", 10, None).await {
            app.patch_task(&id_of(&t), &json!({"status": "completed"}))
                .await;
        }
        app.advance(Duration::hours(1));
    }
    let first = history(&app, &sid, "?limit=10").await;
    assert_eq!(first["count"], 25);
    let dues: Vec<DateTime<Utc>> = first["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| time(&f["due_at"]))
        .collect();
    let expected: Vec<DateTime<Utc>> = (0..10)
        .map(|i| midnight() + Duration::hours(24 - i))
        .collect();
    assert_eq!(dues, expected, "newest due first");
    assert!(
        first["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["outcome"] == "fired" && f["late"] == false)
    );
    assert_eq!(first["previous"], Value::Null);
    let next = first["next"].as_str().unwrap();
    assert!(
        next.ends_with(&format!("/schedules/{sid}/history?limit=10&offset=10")),
        "{next}"
    );
    let last = history(&app, &sid, "?limit=10&offset=20").await;
    assert_eq!(last["results"].as_array().unwrap().len(), 5);
    assert_eq!(time(&last["results"][4]["due_at"]), midnight());
    assert_eq!(last["next"], Value::Null);
    assert!(
        last["previous"]
            .as_str()
            .unwrap()
            .ends_with("?limit=10&offset=10")
    );
    let count_only = history(&app, &sid, "?limit=0").await;
    assert_eq!(
        (&count_only["count"], &count_only["results"]),
        (&json!(25), &json!([]))
    );
    let resp = app
        .get(&format!("/schedules/{sid}/history?limit=1001"))
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(detail(resp).await.contains("limit"));
}

async fn fires_older_than_the_history_retention_are_pruned(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.cron.schedule_history_days = 7).await else {
        return;
    };
    app.clock.set(midnight());
    let old = id(&report_schedule(&app, "old", midnight(), None).await);
    let recent = id(&report_schedule(&app, "recent", midnight() + Duration::days(5), None).await);
    app.tick(SchedulerId::Report).await;
    app.clock.set(midnight() + Duration::days(5));
    app.tick(SchedulerId::Report).await;
    assert_eq!(history(&app, &old, "").await["count"], 1);
    assert_eq!(history(&app, &recent, "").await["count"], 1);

    app.clock.set(midnight() + Duration::days(8));
    let report = app.tick(SchedulerId::Report).await;
    assert_eq!(report.entries["prune"].summary, "deleted 0 tasks, 1 fires");
    assert_eq!(
        history(&app, &old, "").await["count"],
        0,
        "decided eight days ago"
    );
    assert_eq!(
        history(&app, &recent, "").await["count"],
        1,
        "decided three days ago"
    );
}

/// A boefje schedule due a minute before midnight whose fire waits, Octopoes down; the app
/// with `history_days` of fire history, and the schedule's id. The stub and the catalogue's
/// directory live as long as it.
struct WaitingFire {
    app: TestApp,
    waits: String,
    _octopoes: Stub,
    _dir: tempfile::TempDir,
}

impl WaitingFire {
    async fn new(backend: Backend, history_days: u64) -> Option<WaitingFire> {
        let dir = tempfile::tempdir().unwrap();
        let catalogue = dir.path().join("catalogue.toml");
        std::fs::write(&catalogue, CATALOGUE).unwrap();
        let octopoes = OctopoesState::default();
        octopoes.set("unlisted", vec![octopoes_object(HOST, "Hostname", 2)]);
        octopoes.set_down(true);
        let stub = octopoes.serve();
        let url = stub.url.clone();
        let app = spawn_app_with(backend, move |s| {
            s.catalogue.file = catalogue.to_string_lossy().into_owned();
            s.clients.octopoes_api = url;
            s.cron.schedule_history_days = history_days;
        })
        .await?;
        app.clock.set(midnight());
        let body = json!({"scheduler_id": "boefje", "organisation": "unlisted",
            "deadline_at": (midnight() - Duration::minutes(1)).to_rfc3339(),
            "data": {"boefje": {"id": "dns-records"}, "input_ooi": HOST, "organization": "unlisted"}});
        let resp = app.post("/schedules", Some(&body)).await;
        assert_eq!(resp.status(), StatusCode::CREATED);
        let waits = id(&resp.json::<Value>().await.unwrap());
        assert_eq!(
            summary(&app, SchedulerId::Boefje).await,
            "fired 0, skipped 0, disabled 0, waiting 1"
        );
        Some(WaitingFire {
            app,
            waits,
            _octopoes: stub,
            _dir: dir,
        })
    }
}

/// A fire that still waits when the history's retention has passed (Octopoes down for longer)
/// is not pruned: its row says since when it waits, and a prune that deleted it had the next
/// tick write it again as if it had just begun to wait.
async fn a_fire_still_waiting_past_the_history_retention_is_kept(backend: Backend) {
    let Some(WaitingFire { app, waits, .. }) = WaitingFire::new(backend, 7).await else {
        return;
    };

    app.clock.set(midnight() + Duration::days(8));
    let report = app.tick(SchedulerId::Boefje).await;
    assert_eq!(
        report.entries["reschedule"].summary,
        "fired 0, skipped 0, disabled 0, waiting 1"
    );
    assert_eq!(report.entries["prune"].summary, "deleted 0 tasks, 0 fires");
    let page = history(&app, &waits, "").await;
    assert_eq!(page["count"], 1);
    let fire = &page["results"][0];
    assert_eq!(fire["outcome"], "waiting");
    assert_eq!(
        time(&fire["decided_at"]),
        midnight(),
        "waiting since eight days"
    );
}

/// A fire waiting on a due time its schedule no longer has is decided when the schedule
/// changes: a client moving the deadline (Rocky's "rerun") or disabling the schedule skips it
/// (`schedule_changed`), where it stayed `waiting` for ever, never decided nor pruned. A fire
/// waiting on the deadline the schedule keeps is left waiting.
async fn a_fire_waiting_on_a_deadline_moved_since_is_decided(backend: Backend) {
    let Some(WaitingFire { app, waits, .. }) = WaitingFire::new(
        backend,
        kat_scheduler::config::DEFAULT_SCHEDULE_HISTORY_DAYS,
    )
    .await
    else {
        return;
    };
    let due = midnight() - Duration::minutes(1);

    // The same deadline named again: the fire still waits on it.
    let path = format!("/schedules/{waits}");
    let resp = app
        .patch(&path, &json!({"deadline_at": due.to_rfc3339()}))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        history(&app, &waits, "").await["results"][0]["outcome"],
        "waiting"
    );

    // Moved: the old due time is decided, skipped, saying why.
    app.clock.advance(Duration::minutes(5));
    let later = midnight() + Duration::hours(2);
    let resp = app
        .patch(&path, &json!({"deadline_at": later.to_rfc3339()}))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let page = history(&app, &waits, "").await;
    assert_eq!(page["count"], 1, "{page}");
    let fire = &page["results"][0];
    assert_eq!(fire["outcome"], "skipped", "{fire}");
    assert_eq!(fire["reason"], "schedule_changed", "{fire}");
    assert_eq!(time(&fire["decided_at"]), midnight() + Duration::minutes(5));
    assert!(
        fire["detail"].as_str().unwrap().contains("deadline"),
        "{fire}"
    );
}

async fn an_unknown_schedules_history_is_a_404_and_reading_it_takes_a_schedule_reader(
    backend: Backend,
) {
    let Some(app) = spawn_app_with(backend, |s| {
        s.auth.spec = "runner@boefje=boefje-runner; webapp=rocky".into()
    })
    .await
    else {
        return;
    };
    app.clock.set(midnight());
    let call = |method: Method, path: String, token: Option<&'static str>| {
        let app = &app;
        async move {
            let mut req = app.client.request(method, format!("{}{path}", app.address));
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            req.send().await.unwrap()
        }
    };
    let body = json!({"scheduler_id": "report", "organisation": "org1",
        "deadline_at": midnight().to_rfc3339(),
        "data": {"organisation_id": "org1", "report_recipe_id": "r"}});
    let created = app
        .client
        .post(format!("{}/schedules", app.address))
        .bearer_auth("rocky")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let sid = id(&created.json::<Value>().await.unwrap());
    let path = format!("/schedules/{sid}/history");

    assert_eq!(
        call(Method::GET, path.clone(), None).await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(Method::GET, path.clone(), Some("boefje-runner"))
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(Method::GET, path.clone(), Some("rocky"))
            .await
            .status(),
        StatusCode::OK
    );
    for missing in [
        uuid::Uuid::new_v4().to_string(),
        "None".to_owned(),
        "search".to_owned(),
    ] {
        let resp = call(
            Method::GET,
            format!("/schedules/{missing}/history"),
            Some("rocky"),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{missing}");
        assert!(detail(resp).await.contains("not found"), "{missing}");
    }
    let resp = call(Method::POST, path.clone(), Some("rocky")).await;
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(resp.headers()["allow"], "GET");

    // A deleted schedule's history goes with it.
    app.tick(SchedulerId::Report).await;
    let page: Value = call(Method::GET, path.clone(), Some("rocky"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["count"], 1);
    assert_eq!(
        call(Method::DELETE, format!("/schedules/{sid}"), Some("rocky"))
            .await
            .status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        call(Method::GET, path, Some("rocky")).await.status(),
        StatusCode::NOT_FOUND
    );
}

crate::backend_tests!(
    a_fire_waiting_on_a_deadline_moved_since_is_decided,
    a_fire_is_recorded_fired_skipped_behind_queued_work_and_waiting_behind_a_run,
    a_fire_whose_object_octopoes_lacks_is_skipped_and_one_octopoes_cannot_answer_for_waits,
    a_reports_rerun_asked_while_its_last_run_is_out_runs_after_it,
    a_fire_decided_after_the_service_was_down_shows_how_late_it_was,
    a_fire_pushed_just_before_a_crash_is_recorded_fired_once,
    a_schedules_history_is_paged_newest_first_like_the_schedules,
    fires_older_than_the_history_retention_are_pruned,
    a_fire_still_waiting_past_the_history_retention_is_kept,
    an_unknown_schedules_history_is_a_404_and_reading_it_takes_a_schedule_reader,
);
