//! Cron ticks on an injected clock: a day of schedules with restarts in the middle fires each
//! schedule once per cron fire, no more, no less; due schedules are handled oldest first with no
//! cap; boefje schedules whose plugin or object is gone are disabled with the reason; periodic
//! entries keep their next run across restarts.

use std::collections::HashMap;

use chrono::{DateTime, Duration, TimeZone, Utc};
use futures_util::StreamExt;
use kat_scheduler::domain::SchedulerId;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

fn midnight() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2027, 1, 1, 0, 0, 0).unwrap()
}

async fn create_schedule(app: &TestApp, body: Value) -> Value {
    let resp = app.post("/schedules", Some(&body)).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    resp.json().await.unwrap()
}

fn report(org: &str, recipe: &str) -> Value {
    json!({"scheduler_id": "report", "organisation": org,
           "data": {"organisation_id": org, "report_recipe_id": recipe}})
}

/// Schedule `id`'s deadline as the API answers it.
async fn deadline_of(app: &TestApp, id: &str) -> DateTime<Utc> {
    app.schedule(id).await["deadline_at"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Pops every queued report task and runs it to completion, as the report runner does; answers
/// how many per schedule.
async fn run_reports(app: &TestApp, ran: &mut HashMap<String, usize>) {
    loop {
        let tasks = app.pop_ok("report", 100, None).await;
        if tasks.is_empty() {
            return;
        }
        for t in tasks {
            let id = id_of(&t);
            *ran.entry(t["schedule_id"].as_str().unwrap().to_owned())
                .or_default() += 1;
            app.patch_task(&id, &json!({"status": "running"})).await;
            app.patch_task(&id, &json!({"status": "completed"})).await;
        }
    }
}

async fn a_day_of_schedules_fires_each_once_per_cron_fire_across_restarts(backend: Backend) {
    let Some(mut app) = spawn_app(backend).await else {
        return;
    };
    app.clock.set(midnight());
    let mut expected = HashMap::new();
    for (recipe, cron, fires) in [
        ("hourly", "0 * * * *", 24),
        ("quarter", "*/15 * * * *", 96),
        ("twice", "30 6,18 * * *", 2),
        ("daily", "0 0 * * *", 1),
    ] {
        let mut body = report("org1", recipe);
        body["schedule"] = json!(cron);
        let s = create_schedule(&app, body).await;
        expected.insert(s["id"].as_str().unwrap().to_owned(), fires);
    }
    let mut ran = HashMap::new();
    // A day in steps of 5 minutes (the fires fall on them), with two restarts.
    for step in 1..=288 {
        app.clock.advance(Duration::minutes(5));
        if step == 100 || step == 201 {
            app = app.restart().await;
        }
        app.tick(SchedulerId::Report).await;
        run_reports(&app, &mut ran).await;
    }
    assert_eq!(ran, expected, "each schedule ran once per fire of its cron");
    let page: Value = app
        .get("/tasks?scheduler_id=report&limit=0")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["count"], 24 + 96 + 2 + 1, "no other task");
}

async fn due_schedules_are_handled_oldest_first_and_all_in_one_tick(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.clock.set(midnight());
    // 300 one-off reports, due over the last five hours, created in shuffled order.
    let mut due = HashMap::new();
    for i in 0..300 {
        let minutes = (i * 7) % 300;
        let mut body = report(&format!("org{i}"), "r");
        body["deadline_at"] = json!((midnight() - Duration::minutes(minutes + 1)).to_rfc3339());
        let s = create_schedule(&app, body).await;
        due.insert(s["id"].as_str().unwrap().to_owned(), minutes);
    }
    let report = app.tick(SchedulerId::Report).await;
    assert_eq!(
        report.entries["reschedule"].summary,
        "fired 300, skipped 0, disabled 0, waiting 0"
    );
    // Oldest due first: the tasks were created in deadline order.
    let page: Value = app
        .get("/tasks?scheduler_id=report&limit=1000")
        .await
        .json()
        .await
        .unwrap();
    let newest_first: Vec<u64> = page["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| due[t["schedule_id"].as_str().unwrap()] as u64)
        .collect();
    assert_eq!(newest_first.len(), 300);
    assert!(
        newest_first.windows(2).all(|w| w[0] < w[1]),
        "listed newest first, so the least overdue comes first"
    );
    // One-offs ran: no deadline left, nothing fires again.
    let again = app.tick(SchedulerId::Report).await;
    assert_eq!(
        again.entries["reschedule"].summary,
        "fired 0, skipped 0, disabled 0, waiting 0"
    );
}

async fn a_tick_over_several_pages_fires_each_due_schedule_once(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.clock.set(midnight());
    // Over two pages of due schedules (the pages run as a pipeline): 2,100 one-off reports.
    const N: usize = 2 * kat_scheduler::cron::reschedule::PAGE + 100;
    let bodies: Vec<Value> = (0..N)
        .map(|i| {
            let mut body = report(&format!("org{i}"), "r");
            body["deadline_at"] =
                json!((midnight() - Duration::seconds(i as i64 + 1)).to_rfc3339());
            body
        })
        .collect();
    let created: Vec<Value> = futures_util::stream::iter(bodies)
        .map(|b| {
            let app = &app;
            async move { create_schedule(app, b).await }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    assert_eq!(created.len(), N);
    let report = app.tick(SchedulerId::Report).await;
    assert_eq!(
        report.entries["reschedule"].summary,
        format!("fired {N}, skipped 0, disabled 0, waiting 0")
    );
    let mut schedules: Vec<String> = Vec::new();
    let mut offset = 0;
    loop {
        let page: Value = app
            .get(&format!(
                "/tasks?scheduler_id=report&limit=1000&offset={offset}"
            ))
            .await
            .json()
            .await
            .unwrap();
        let results = page["results"].as_array().unwrap();
        if results.is_empty() {
            break;
        }
        offset += results.len();
        schedules.extend(
            results
                .iter()
                .map(|t| t["schedule_id"].as_str().unwrap().to_owned()),
        );
    }
    schedules.sort();
    schedules.dedup();
    assert_eq!((offset, schedules.len()), (N, N), "one task per schedule");
    let again = app.tick(SchedulerId::Report).await;
    assert_eq!(
        again.entries["reschedule"].summary, "fired 0, skipped 0, disabled 0, waiting 0",
        "every deadline moved"
    );
}

const CATALOGUE: &str = r#"
[[plugins]]
id = "dns-records"
type = "boefje"
consumes = ["Hostname"]
scan_level = 1
enabled = true
interval = 60

[[plugins]]
id = "off"
type = "boefje"
consumes = ["Hostname"]
scan_level = 1
enabled = false
"#;

/// The app on [`CATALOGUE`] (with the directory holding its file), its clock at midnight.
async fn app_with_catalogue(backend: Backend) -> Option<(TestApp, tempfile::TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    let catalogue = dir.path().join("catalogue.toml");
    std::fs::write(&catalogue, CATALOGUE).unwrap();
    let c = catalogue.to_string_lossy().into_owned();
    let app = spawn_app_with(backend, move |s| s.catalogue.file = c).await?;
    app.clock.set(midnight());
    Some((app, dir))
}

/// A boefje schedule of org1 for `plugin` on `ooi`, due a minute before midnight.
fn boefje_schedule(plugin: &str, ooi: &str) -> Value {
    json!({"scheduler_id": "boefje", "organisation": "org1",
           "deadline_at": (midnight() - Duration::minutes(1)).to_rfc3339(),
           "data": {"boefje": {"id": plugin}, "input_ooi": ooi, "organization": "org1"}})
}

async fn boefje_schedules_fire_from_the_catalogue_or_are_disabled_with_the_reason(
    backend: Backend,
) {
    let Some((app, _dir)) = app_with_catalogue(backend).await else {
        return;
    };
    // The frontier holds one object at level 2, one at level 0 and one deleted; it lacks
    // missing.nl, and no Octopoes is configured to ask about it.
    let frontier = app.frontier();
    use kat_scheduler::domain::event::Operation;
    let events = [
        hostname_event(Operation::Create, "Hostname|internet|a.nl", Some(2)),
        hostname_event(Operation::Create, "Hostname|internet|low.nl", Some(0)),
        hostname_event(Operation::Delete, "Hostname|internet|deleted.nl", None),
    ];
    frontier
        .apply_objects(&events.iter().collect::<Vec<_>>(), midnight().naive_utc())
        .await
        .unwrap();
    let mut ids = HashMap::new();
    for (name, plugin, ooi) in [
        ("fires", "dns-records", "Hostname|internet|a.nl"),
        ("gone plugin", "nope", "Hostname|internet|a.nl"),
        ("disabled plugin", "off", "Hostname|internet|a.nl"),
        ("gone object", "dns-records", "Hostname|internet|deleted.nl"),
        (
            "unknown object",
            "dns-records",
            "Hostname|internet|missing.nl",
        ),
        ("too low", "dns-records", "Hostname|internet|low.nl"),
    ] {
        let s = create_schedule(&app, boefje_schedule(plugin, ooi)).await;
        ids.insert(name, s["id"].as_str().unwrap().to_owned());
    }
    let report = app.tick(SchedulerId::Boefje).await;
    assert_eq!(
        report.entries["reschedule"].summary,
        "fired 1, skipped 0, disabled 4, waiting 1"
    );
    let get = |name: &'static str| {
        let path = format!("/schedules/{}", ids[name]);
        let app = &app;
        async move { app.get(&path).await.json::<Value>().await.unwrap() }
    };
    let fired = get("fires").await;
    assert_eq!(fired["enabled"], true);
    // The plugin's interval of 60 minutes.
    assert_eq!(
        fired["deadline_at"]
            .as_str()
            .unwrap()
            .parse::<DateTime<Utc>>()
            .unwrap(),
        midnight() + Duration::minutes(60)
    );
    for (name, reason) in [
        ("gone plugin", "gone from the catalogue"),
        ("disabled plugin", "disabled"),
        ("gone object", "is gone"),
        ("too low", "scan level"),
    ] {
        let s = get(name).await;
        assert_eq!(s["enabled"], false, "{name}");
        assert!(
            s["disabled_reason"].as_str().unwrap().contains(reason),
            "{name}: {}",
            s["disabled_reason"]
        );
    }
    // Unknown is not gone: the frontier lacks it and nothing can say, so it waits, due still.
    let unknown = get("unknown object").await;
    assert_eq!(unknown["enabled"], true);
    assert_eq!(unknown["disabled_reason"], Value::Null);
    assert_eq!(
        unknown["deadline_at"]
            .as_str()
            .unwrap()
            .parse::<DateTime<Utc>>()
            .unwrap(),
        midnight() - Duration::minutes(1)
    );
    let task = &app.pop_ok("boefje", 10, None).await[0];
    assert_eq!(task["schedule_id"].as_str().unwrap(), ids["fires"]);
    assert_eq!(task["data"]["boefje"]["id"], "dns-records");
    // Dispatched still at the next deadline: no second run beside it; that fire waits for it.
    app.clock.advance(Duration::minutes(61));
    let report = app.tick(SchedulerId::Boefje).await;
    assert_eq!(
        report.entries["reschedule"].summary,
        "fired 0, skipped 0, disabled 0, waiting 2"
    );
}

/// Work a user ran by hand shortly before its schedule's deadline is not run again at the
/// deadline: the fire is skipped until the plugin's interval has passed since that run (mula's
/// grace gate on rescheduling, whatever the strategy), then runs. A schedule with a cron
/// expression keeps its times.
async fn work_run_by_hand_before_its_deadline_waits_out_its_interval(backend: Backend) {
    let Some((app, _dir)) = app_with_catalogue(backend).await else {
        return;
    };
    let frontier = app.frontier();
    let events: Vec<_> = ["a.nl", "b.nl"]
        .map(|host| {
            hostname_event(
                kat_scheduler::domain::event::Operation::Create,
                &format!("Hostname|internet|{host}"),
                Some(2),
            )
        })
        .into();
    frontier
        .apply_objects(&events.iter().collect::<Vec<_>>(), midnight().naive_utc())
        .await
        .unwrap();
    // Both due at 00:30; b's by a cron expression of every half hour.
    let schedule = |host: &str, cron: Option<&str>| {
        let mut body = json!({"scheduler_id": "boefje", "organisation": "org1",
               "deadline_at": (midnight() + Duration::minutes(30)).to_rfc3339(),
               "data": {"boefje": {"id": "dns-records"},
                        "input_ooi": format!("Hostname|internet|{host}"),
                        "organization": "org1"}});
        if let Some(cron) = cron {
            body["schedule"] = json!(cron);
        }
        body
    };
    let a = create_schedule(&app, schedule("a.nl", None)).await;
    let b = create_schedule(&app, schedule("b.nl", Some("*/30 * * * *"))).await;
    // At 00:00 the user runs both by hand; they finish at 00:05.
    for host in ["a.nl", "b.nl"] {
        app.push_ok(
            "boefje",
            &boefje_push(
                "org1",
                "dns-records",
                Some(&format!("Hostname|internet|{host}")),
                1,
            ),
        )
        .await;
    }
    let ran = app.pop_ids("boefje", 10).await;
    assert_eq!(ran.len(), 2);
    app.clock.advance(Duration::minutes(5));
    for id in &ran {
        for status in ["running", "completed"] {
            let r = app.patch_task(id, &json!({ "status": status })).await;
            assert_eq!(r.status(), 200);
        }
    }

    app.clock.set(midnight() + Duration::minutes(31));
    let report = app.tick(SchedulerId::Boefje).await;
    assert_eq!(
        report.entries["reschedule"].summary,
        "fired 1, skipped 1, disabled 0, waiting 0"
    );
    let popped = app.pop_ok("boefje", 10, None).await;
    assert_eq!(popped.len(), 1);
    assert_eq!(
        popped[0]["schedule_id"], b["id"],
        "the cron schedule runs at its time"
    );
    // a's schedule moved to the end of the interval since the run by hand: 00:05 + 60 min.
    let a_id = a["id"].as_str().unwrap();
    assert_eq!(
        deadline_of(&app, a_id).await,
        midnight() + Duration::minutes(65)
    );
    app.clock.set(midnight() + Duration::minutes(66));
    let report = app.tick(SchedulerId::Boefje).await;
    assert!(
        report.entries["reschedule"]
            .summary
            .starts_with("fired 1, skipped 0"),
        "{}",
        report.entries["reschedule"].summary
    );
    let popped = app.pop_ok("boefje", 10, None).await;
    assert!(
        popped.iter().any(|t| t["schedule_id"] == a["id"]),
        "a runs once its interval has passed: {popped:?}"
    );
}

async fn periodic_entries_keep_their_next_run_across_restarts(backend: Backend) {
    let Some(mut app) = spawn_app_with(backend, |s| s.queue.watchdog_interval_secs = 30).await
    else {
        return;
    };
    app.clock.set(midnight());
    let ran = |r: kat_scheduler::cron::TickReport| r.entries["lease watchdog"].ran;
    assert!(
        ran(app.tick(SchedulerId::Normalizer).await),
        "first tick: due"
    );
    app.clock.advance(Duration::seconds(10));
    assert!(!ran(app.tick(SchedulerId::Normalizer).await));
    app = app.restart().await;
    app.clock.advance(Duration::seconds(10));
    assert!(
        !ran(app.tick(SchedulerId::Normalizer).await),
        "not repeated after a restart"
    );
    app.clock.advance(Duration::seconds(11));
    assert!(
        ran(app.tick(SchedulerId::Normalizer).await),
        "due again after 30 s"
    );
}

/// A next run set by a clock that ran ahead (corrected since, or another instance's with a skew)
/// does not hold an entry off for the whole skew: one more than a period ahead runs now.
async fn an_entrys_next_run_set_by_a_clock_ahead_does_not_hold_it_off(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.watchdog_interval_secs = 30).await else {
        return;
    };
    let ran = |r: kat_scheduler::cron::TickReport| r.entries["lease watchdog"].ran;
    // A day ahead: the entry runs and sets its next run 30 s after that.
    app.clock.set(midnight() + Duration::days(1));
    assert!(ran(app.tick(SchedulerId::Normalizer).await));
    // The clock corrected: the next run stored is a day ahead, more than a period.
    app.clock.set(midnight());
    assert!(
        ran(app.tick(SchedulerId::Normalizer).await),
        "runs now, not in a day"
    );
    app.clock.advance(Duration::seconds(10));
    assert!(
        !ran(app.tick(SchedulerId::Normalizer).await),
        "and keeps its period from then"
    );
}

async fn a_fire_pushed_just_before_a_crash_is_not_run_again(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.clock.set(midnight());
    let mut body = report("org1", "r1");
    let deadline = midnight() - Duration::minutes(1);
    body["deadline_at"] = json!(deadline.to_rfc3339());
    body["schedule"] = json!("0 * * * *");
    let s = create_schedule(&app, body).await;
    let schedule = s["id"].as_str().unwrap().to_owned();
    // The crash window: the fire's task was pushed (and has even run since), but the schedule's
    // next deadline was never written.
    let fire = kat_scheduler::cron::reschedule::fire_id(&schedule, Some(deadline.naive_utc()));
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
                schedule_id: uuid::Uuid::parse_str(&schedule).ok(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut ran = HashMap::new();
    run_reports(&app, &mut ran).await;
    let report = app.tick(SchedulerId::Report).await;
    assert_eq!(
        report.entries["reschedule"].summary,
        "fired 0, skipped 1, disabled 0, waiting 0"
    );
    assert_eq!(
        deadline_of(&app, &schedule).await,
        midnight() + Duration::hours(1),
        "the schedule moved on"
    );
    let page: Value = app
        .get("/tasks?scheduler_id=report&limit=0")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["count"], 1, "that fire ran once");
}

/// Rocky sets a report recipe's deadline to the day's date (`YYYY-MM-DD`) on every edit, so an
/// edit on the day the recipe first ran names a due time whose fire has already run: that is a
/// new fire, run again, as mula runs any enabled schedule whose deadline has passed. Its own id
/// is not the earlier fire's, and it runs once.
async fn a_recipe_set_again_to_a_day_that_has_run_runs_again(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let today = midnight() + Duration::hours(10);
    app.clock.set(today);
    let mut body = report("org1", "r1");
    body["schedule"] = json!("0 0 * * *");
    body["deadline_at"] = json!("2027-01-01");
    let schedule = create_schedule(&app, body).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut ran = HashMap::new();
    let fired =
        |report: kat_scheduler::cron::TickReport| report.entries["reschedule"].summary.clone();
    assert_eq!(
        fired(app.tick(SchedulerId::Report).await),
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    run_reports(&app, &mut ran).await;
    // The user edits the recipe an hour later; Rocky sends the day's date again.
    app.advance(Duration::hours(1));
    let resp = app
        .patch(
            &format!("/schedules/{schedule}"),
            &json!({"schedule": "0 0 * * *", "deadline_at": "2027-01-01"}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        fired(app.tick(SchedulerId::Report).await),
        "fired 1, skipped 0, disabled 0, waiting 0",
        "the edited recipe runs"
    );
    run_reports(&app, &mut ran).await;
    assert_eq!(
        ran.get(&schedule),
        Some(&2),
        "two runs of the recipe: {ran:?}"
    );
    app.advance(Duration::minutes(1));
    assert_eq!(
        fired(app.tick(SchedulerId::Report).await),
        "fired 0, skipped 0, disabled 0, waiting 0",
        "and not a third time"
    );
    assert_eq!(
        deadline_of(&app, &schedule).await,
        midnight() + Duration::days(1),
        "the schedule moved on to tomorrow"
    );
}

/// A recipe edited while its run of the day is still running (Rocky sends the day's date
/// again) is run again once that run has ended: the edit waits for it (no concurrent
/// invocation), where the running task was taken for the edited fire's run and the schedule
/// moved on without running the edited recipe.
async fn a_recipe_edited_while_its_run_is_running_runs_again_after_it(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.clock.set(midnight() + Duration::hours(10));
    let mut body = report("org1", "r1");
    body["schedule"] = json!("0 0 * * *");
    body["deadline_at"] = json!("2027-01-01");
    let schedule = create_schedule(&app, body).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let fired =
        |report: kat_scheduler::cron::TickReport| report.entries["reschedule"].summary.clone();
    assert_eq!(
        fired(app.tick(SchedulerId::Report).await),
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    let first = app.pop_ids("report", 10).await;
    assert_eq!(first.len(), 1);
    let running = app
        .patch_task(&first[0], &json!({"status": "running"}))
        .await;
    assert_eq!(running.status(), StatusCode::OK);
    app.advance(Duration::minutes(10));
    let resp = app
        .patch(
            &format!("/schedules/{schedule}"),
            &json!({"schedule": "0 0 * * *", "deadline_at": "2027-01-01"}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        fired(app.tick(SchedulerId::Report).await),
        "fired 0, skipped 0, disabled 0, waiting 1",
        "the edit waits for the run under way"
    );
    let done = app
        .patch_task(&first[0], &json!({"status": "completed"}))
        .await;
    assert_eq!(done.status(), StatusCode::OK);
    app.advance(Duration::minutes(1));
    assert_eq!(
        fired(app.tick(SchedulerId::Report).await),
        "fired 1, skipped 0, disabled 0, waiting 0",
        "the edited recipe runs"
    );
    let mut ran = HashMap::new();
    run_reports(&app, &mut ran).await;
    assert_eq!(ran.get(&schedule), Some(&1), "{ran:?}");
    assert_eq!(
        deadline_of(&app, &schedule).await,
        midnight() + Duration::days(1),
        "the schedule moved on to tomorrow"
    );
}

async fn each_task_explains_its_priority(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let catalogue = dir.path().join("catalogue.toml");
    std::fs::write(&catalogue, CATALOGUE).unwrap();
    let c = catalogue.to_string_lossy().into_owned();
    let Some(app) = spawn_app_with(backend, move |s| {
        s.catalogue.file = c;
        s.schedulers.boefje.scoring = Some(kat_scheduler::scoring::Strategy::GracePeriod);
    })
    .await
    else {
        return;
    };
    app.clock.set(midnight());
    // A report fired by its schedule: time-based (the default).
    let mut body = report("org1", "r1");
    body["deadline_at"] = json!((midnight() - Duration::minutes(1)).to_rfc3339());
    create_schedule(&app, body).await;
    app.tick(SchedulerId::Report).await;
    let task = &app.pop_ok("report", 1, None).await[0];
    let why: Value = app
        .get(&format!("/tasks/{}/explain", id_of(task)))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(why["strategy"], "time-based");
    assert_eq!(why["priority"], task["priority"]);
    assert_eq!(why["terms"]["created_at_seconds"], midnight().timestamp());
    // A boefje schedule never run, ranked grace-period: right after user scans.
    let boefje = json!({"scheduler_id": "boefje", "organisation": "org1",
        "deadline_at": (midnight() - Duration::minutes(1)).to_rfc3339(),
        "data": {"boefje": {"id": "dns-records"}, "organization": "org1"}});
    create_schedule(&app, boefje).await;
    app.tick(SchedulerId::Boefje).await;
    let task = &app.pop_ok("boefje", 1, None).await[0];
    assert_eq!(task["priority"], 2);
    let why: Value = app
        .get(&format!("/tasks/{}/explain", id_of(task)))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(why["strategy"], "grace-period");
    assert_eq!(why["terms"]["never_ran"], true);
    // A user's push: the client set it.
    let pushed = app
        .push_ok(
            "boefje",
            &boefje_push("org1", "dns-records", Some("Hostname|internet|x.nl"), 1),
        )
        .await;
    let why: Value = app
        .get(&format!("/tasks/{}/explain", id_of(&pushed)))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(why["strategy"], "client");
    assert_eq!(why["priority"], 1);
    let missing = app
        .get(&format!("/tasks/{}/explain", uuid::Uuid::new_v4()))
        .await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
}

/// `grace-period` ranks waiting work by the moment it became due (the longer overdue, the
/// sooner): a priority that does not age, so no tick rewrites it, while `GET /tasks/{id}/explain`
/// tells how long overdue the work is at the time asked; a priority a client set stands.
async fn grace_period_work_waits_by_its_due_moment_and_is_explained_as_of_the_time_asked(
    backend: Backend,
) {
    let dir = tempfile::tempdir().unwrap();
    let catalogue = dir.path().join("catalogue.toml");
    std::fs::write(&catalogue, CATALOGUE).unwrap();
    let c = catalogue.to_string_lossy().into_owned();
    let Some(app) = spawn_app_with(backend, move |s| {
        s.catalogue.file = c;
        s.schedulers.boefje.scoring = Some(kat_scheduler::scoring::Strategy::GracePeriod);
        // A setting from before: accepted, and it does nothing.
        s.cron.rescore_secs = 60;
        // The heap's order alone (the organisations' turns would interleave them).
        s.schedulers.boefje.fairness = Some(kat_scheduler::queue::fair::Fairness::Off);
    })
    .await
    else {
        return;
    };
    app.clock.set(midnight());
    for org in ["org1", "org2", "org3"] {
        create_schedule(
            &app,
            json!({"scheduler_id": "boefje", "organisation": org,
                "deadline_at": (midnight() - Duration::minutes(1)).to_rfc3339(),
                "data": {"boefje": {"id": "dns-records"}, "organization": org}}),
        )
        .await;
    }
    // First runs: never ran, so 2. org2's finishes at midnight, org1's at 00:30, org3's at
    // 00:40.
    app.tick(SchedulerId::Boefje).await;
    let mut first = app.pop_many("boefje", 3, None).await;
    first.sort_by_key(|t| t["organisation"].as_str().unwrap().to_owned());
    for (t, at) in first.iter().zip([30, 0, 40]) {
        assert_eq!(t["priority"], 2);
        app.clock.set(midnight() + Duration::minutes(at));
        let done = app
            .patch_task(&id_of(t), &json!({"status": "completed"}))
            .await;
        assert_eq!(done.status(), StatusCode::OK);
    }
    // 02:00: due again (interval 60 min), org2's since 01:00, org1's since 01:30.
    app.clock.set(midnight() + Duration::hours(2));
    app.tick(SchedulerId::Boefje).await;
    let page: Value = app
        .get("/tasks?scheduler_id=boefje&status=queued")
        .await
        .json()
        .await
        .unwrap();
    let mut queued = page["results"].as_array().unwrap().clone();
    queued.sort_by_key(|t| t["organisation"].as_str().unwrap().to_owned());
    assert_eq!(queued.len(), 3);
    let due = |minutes: i64| (midnight() + Duration::minutes(minutes)).timestamp();
    let priorities: Vec<i64> = queued
        .iter()
        .map(|t| t["priority"].as_i64().unwrap())
        .collect();
    assert_eq!(
        priorities,
        vec![due(90), due(60), due(100)],
        "the due moments"
    );
    // A client makes org3's work the most urgent of the three.
    let patched = app
        .patch_task(&id_of(&queued[2]), &json!({"priority": 900}))
        .await;
    assert_eq!(patched.status(), StatusCode::OK);
    // A day later nothing was rewritten: no tick re-scores.
    app.clock.set(midnight() + Duration::hours(26));
    let report = app.tick(SchedulerId::Boefje).await;
    assert!(!report.entries.contains_key("rescore"), "{report:?}");
    for (t, p) in queued.iter().zip([due(90), due(60), 900]) {
        assert_eq!(app.task(&id_of(t)).await["priority"], p);
    }
    for t in &queued[..2] {
        assert_eq!(
            app.task(&id_of(t)).await["modified_at"],
            t["modified_at"],
            "not rewritten"
        );
    }
    // The explanation is of the time asked: org2's work is 25 hours overdue now.
    let expected = |overdue: i64| 3 + (997.0 * (1.0 - overdue as f64 / 604_800.0)).round() as i64;
    let why: Value = app
        .get(&format!("/tasks/{}/explain", id_of(&queued[1])))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(why["strategy"], "grace-period");
    assert_eq!(why["priority"], due(60));
    assert_eq!(why["terms"]["seconds_overdue"], 90_000);
    assert_eq!(why["terms"]["overdue_score"], expected(90_000));
    let why: Value = app
        .get(&format!("/tasks/{}/explain", id_of(&queued[2])))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(why["strategy"], "client");
    // The heap's order: the client's 900, then the longest overdue.
    assert_eq!(
        app.pop_ids("boefje", 3).await,
        vec![id_of(&queued[2]), id_of(&queued[1]), id_of(&queued[0])]
    );
}

/// Pushes `n` boefje tasks of `org1` straight to the broker, 500 per transaction.
async fn push_boefjes(app: &TestApp, n: usize, ooi: impl Fn(usize) -> String, priority: i64) {
    let requests: Vec<_> = (0..n)
        .map(|i| kat_scheduler::queue::PushRequest {
            organisation: "org1".into(),
            priority: Some(priority),
            data: boefje_data("org1", &format!("b{i}"), Some(&ooi(i)))
                .as_object()
                .unwrap()
                .clone(),
            ..Default::default()
        })
        .collect();
    for chunk in requests.chunks(500) {
        for r in app
            .broker
            .push_many(SchedulerId::Boefje, chunk.to_vec())
            .await
            .unwrap()
        {
            r.unwrap();
        }
    }
}

async fn the_refill_entry_tops_up_room_no_request_filled(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = 1500).await else {
        return;
    };
    let figures = |app: &TestApp| {
        let s = app.broker.snapshot(SchedulerId::Boefje);
        (s.qsize, s.pending)
    };
    // The heap holds 1,500 urgent tasks, 1,000 of them on one object and 100 on another; 2,500
    // others wait pending.
    push_boefjes(&app, 1000, |_| "Hostname|internet|gone.nl".into(), 2).await;
    push_boefjes(&app, 100, |_| "Hostname|internet|small.nl".into(), 2).await;
    push_boefjes(&app, 400, |i| format!("Hostname|internet|h{i}.nl"), 3).await;
    push_boefjes(&app, 2500, |i| format!("Hostname|internet|p{i}.nl"), 50).await;
    assert_eq!(figures(&app), (1500, 2500));
    let quiet = app.tick(SchedulerId::Boefje).await;
    assert!(!quiet.entries["refill"].ran, "a full heap needs nothing");
    // The small object is deleted: its 100 tasks are cancelled in one batch. Room for 100 is
    // below a tenth of the heap, so the engine does not refill ahead; nothing else comes.
    let cancelled = app
        .broker
        .cancel_object("org1", "Hostname|internet|small.nl")
        .await
        .unwrap();
    assert_eq!(cancelled.len(), 100);
    assert_eq!(figures(&app), (1400, 2500));
    let report = app.tick(SchedulerId::Boefje).await;
    assert_eq!(report.entries["refill"].summary, "moved 100");
    assert_eq!(figures(&app), (1500, 2400));
    // The large one is deleted: room for 1,000, which the engine refills ahead right after it
    // answered the cancellation. A refill asked for afterwards finds the heap full.
    let cancelled = app
        .broker
        .cancel_object("org1", "Hostname|internet|gone.nl")
        .await
        .unwrap();
    assert_eq!(cancelled.len(), 1000);
    assert_eq!(app.broker.refill(SchedulerId::Boefje).await.unwrap(), 0);
    assert_eq!(figures(&app), (1500, 1400));
    // The table holds what the heap took in from the backlog as pending until it is popped or
    // a batch that may meet a pending row writes it queued: what waits agrees in all.
    let count = |status: &'static str| {
        let app = &app;
        async move {
            let page: Value = app
                .get(&format!(
                    "/tasks?scheduler_id=boefje&status={status}&limit=1"
                ))
                .await
                .json()
                .await
                .unwrap();
            page["count"].as_u64().unwrap()
        }
    };
    let (queued, pending) = (count("queued").await, count("pending").await);
    assert_eq!(
        queued + pending,
        1500 + 1400,
        "the table agrees with the heap"
    );
    assert!(
        queued >= 500,
        "the tasks pushed into the heap are queued: {queued}"
    );
    assert!(!app.tick(SchedulerId::Boefje).await.entries["refill"].ran);
}

/// Pruning deletes tasks for good, so only what is finished and has not changed for the
/// retention goes: not a task created long ago that waits, is out, or finished only lately, and
/// each component prunes its own.
async fn only_finished_tasks_unchanged_for_the_retention_are_pruned(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.cron.task_retention_days = 1).await else {
        return;
    };
    app.clock.set(midnight());
    let mut ids = Vec::new();
    for (i, name) in ["done", "failed", "late", "out", "waits"]
        .iter()
        .enumerate()
    {
        let ooi = format!("Hostname|internet|{name}.nl");
        let t = app
            .push_ok(
                "boefje",
                &boefje_push("org1", "dns-records", Some(&ooi), i as i64 + 1),
            )
            .await;
        ids.push(id_of(&t));
    }
    let normalizer = id_of(
        &app.push_ok("normalizer", &normalizer_push("org1", "n", 1))
            .await,
    );
    let [done, failed, late, out, waits] = [0, 1, 2, 3, 4].map(|i| ids[i].clone());
    assert_eq!(
        app.pop_ids("boefje", 4).await,
        [done.clone(), failed.clone(), late.clone(), out.clone()]
    );
    assert_eq!(
        app.pop_ids("normalizer", 1).await,
        std::slice::from_ref(&normalizer)
    );
    for (id, status) in [
        (&done, "completed"),
        (&failed, "failed"),
        (&normalizer, "completed"),
        (&out, "running"),
    ] {
        let resp = app.patch_task(id, &json!({"status": status})).await;
        assert_eq!(resp.status(), StatusCode::OK);
    }
    // `late` finishes a day and 23 hours later.
    app.clock.set(midnight() + Duration::hours(47));
    app.patch_task(&late, &json!({"status": "completed"})).await;

    app.clock
        .set(midnight() + Duration::hours(48) + Duration::minutes(1));
    let report = app.tick(SchedulerId::Boefje).await;
    assert_eq!(report.entries["prune"].summary, "deleted 2 tasks, 0 fires");
    for id in [&done, &failed] {
        assert_eq!(app.get_task(id).await.status(), StatusCode::NOT_FOUND);
    }
    for id in [&late, &out, &waits, &normalizer] {
        assert_eq!(app.get_task(id).await.status(), StatusCode::OK, "{id} kept");
    }
    assert_eq!(app.task(&waits).await["status"], "queued");
    let report = app.tick(SchedulerId::Normalizer).await;
    assert_eq!(report.entries["prune"].summary, "deleted 1 tasks, 0 fires");
    assert_eq!(
        app.get_task(&normalizer).await.status(),
        StatusCode::NOT_FOUND
    );
}

/// An object event for `reference` of org1, a hostname at `level` (none: a delete).
fn hostname_event(
    operation: kat_scheduler::domain::event::Operation,
    reference: &str,
    level: Option<i64>,
) -> kat_scheduler::domain::event::ObjectEvent {
    kat_scheduler::domain::event::ObjectEvent {
        operation,
        organisation: "org1".into(),
        reference: reference.into(),
        object: level.map(|l| kat_scheduler::domain::event::ObjectState {
            object_type: "Hostname".into(),
            scan_level: Some(l),
            scan_profile_type: None,
        }),
    }
}

async fn a_schedule_a_fire_disabled_is_enabled_again_when_its_work_is_planned_again(
    backend: Backend,
) {
    use kat_scheduler::domain::event::Operation;
    let Some((app, _dir)) = app_with_catalogue(backend).await else {
        return;
    };
    // low.nl's clearance is lowered to 0, deleted.nl deleted; user.nl may be scanned, but a
    // user disabled its schedule; kept.nl's level is 0 too, and after the fire disabled its
    // schedule the user disabled it as well.
    let frontier = app.frontier();
    let low = "Hostname|internet|low.nl";
    let deleted = "Hostname|internet|deleted.nl";
    let user = "Hostname|internet|user.nl";
    let kept = "Hostname|internet|kept.nl";
    let refused = "Hostname|internet|refused.nl";
    let events = [
        hostname_event(Operation::Create, low, Some(0)),
        hostname_event(Operation::Create, kept, Some(0)),
        hostname_event(Operation::Create, refused, Some(2)),
        hostname_event(Operation::Delete, deleted, None),
        hostname_event(Operation::Create, user, Some(2)),
    ];
    frontier
        .apply_objects(&events.iter().collect::<Vec<_>>(), midnight().naive_utc())
        .await
        .unwrap();
    let mut ids = HashMap::new();
    for ooi in [low, deleted, user, kept, refused] {
        let s = create_schedule(&app, boefje_schedule("dns-records", ooi)).await;
        ids.insert(ooi, s["id"].as_str().unwrap().to_owned());
    }
    let resp = app
        .patch(
            &format!("/schedules/{}", ids[user]),
            &json!({"enabled": false}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    // refused.nl's earlier fire had its task refused (its data), as no fire of this catalogue
    // would: written behind the app's back.
    behind_its_back(
        backend,
        &app.db.uri,
        &format!(
            "UPDATE schedules SET enabled = FALSE, \
             disabled_reason = 'its task is refused: malformed data' WHERE id = '{}'",
            ids[refused]
        ),
    );
    let report = app.tick(SchedulerId::Boefje).await;
    assert_eq!(
        report.entries["reschedule"].summary,
        "fired 0, skipped 0, disabled 3, waiting 0"
    );
    let resp = app
        .patch(
            &format!("/schedules/{}", ids[kept]),
            &json!({"enabled": false}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    // deleted.nl's schedule has lost its deadline (behind the app's back).
    behind_its_back(
        backend,
        &app.db.uri,
        &format!(
            "UPDATE schedules SET deadline_at = NULL WHERE id = '{}'",
            ids[deleted]
        ),
    );
    let state = |ooi: &'static str| {
        let path = format!("/schedules/{}", ids[ooi]);
        let app = &app;
        async move {
            let s: Value = app.get(&path).await.json().await.unwrap();
            (
                s["enabled"].as_bool().unwrap(),
                s["disabled_reason"].clone(),
            )
        }
    };
    assert!(!state(low).await.0);
    assert!(!state(deleted).await.0);

    // The clearance is raised again, the host created again, and user.nl changes: each plans
    // its work, and the schedules the fire disabled come back, due now; the user's does not.
    app.advance(Duration::minutes(5));
    let events = [
        hostname_event(Operation::Update, low, Some(1)),
        hostname_event(Operation::Create, deleted, Some(1)),
        hostname_event(Operation::Update, user, Some(2)),
        hostname_event(Operation::Update, kept, Some(1)),
        hostname_event(Operation::Update, refused, Some(2)),
    ];
    let refs: Vec<_> = events.iter().collect();
    frontier
        .apply_objects(&refs, app.now().naive_utc())
        .await
        .unwrap();
    let planned = app.planner.objects(&refs).await;
    assert_eq!(planned, vec![Ok(1), Ok(1), Ok(1), Ok(1), Ok(1)]);
    assert_eq!(state(low).await, (true, Value::Null));
    assert_eq!(state(deleted).await, (true, Value::Null));
    assert_eq!(state(user).await, (false, Value::Null));
    assert_eq!(state(kept).await, (false, Value::Null));
    assert!(!state(refused).await.0, "its data would be refused again");
    assert_eq!(deadline_of(&app, &ids[low]).await, app.now());
    assert_eq!(
        deadline_of(&app, &ids[deleted]).await,
        app.now(),
        "a schedule without a deadline comes due now"
    );
    // Their next fire finds the work planned and moves on: nothing runs twice.
    let report = app.tick(SchedulerId::Boefje).await;
    assert_eq!(
        report.entries["reschedule"].summary,
        "fired 0, skipped 2, disabled 0, waiting 0"
    );
}

crate::backend_tests!(
    a_schedule_a_fire_disabled_is_enabled_again_when_its_work_is_planned_again,
    a_recipe_edited_while_its_run_is_running_runs_again_after_it,
    work_run_by_hand_before_its_deadline_waits_out_its_interval,
    grace_period_work_waits_by_its_due_moment_and_is_explained_as_of_the_time_asked,
    each_task_explains_its_priority,
    a_fire_pushed_just_before_a_crash_is_not_run_again,
    a_recipe_set_again_to_a_day_that_has_run_runs_again,
    a_day_of_schedules_fires_each_once_per_cron_fire_across_restarts,
    due_schedules_are_handled_oldest_first_and_all_in_one_tick,
    a_tick_over_several_pages_fires_each_due_schedule_once,
    boefje_schedules_fire_from_the_catalogue_or_are_disabled_with_the_reason,
    periodic_entries_keep_their_next_run_across_restarts,
    an_entrys_next_run_set_by_a_clock_ahead_does_not_hold_it_off,
    the_refill_entry_tops_up_room_no_request_filled,
    only_finished_tasks_unchanged_for_the_retention_are_pruned,
);
