//! mula's schedules API as Rocky calls it (reference §2.2, §3.2): report schedules by cron or
//! deadline, listing and search, enabling, changing, deleting; with mula's codes and bodies.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

fn report_schedule(org: &str, recipe: &str, cron: Option<&str>, deadline: Option<&str>) -> Value {
    let mut body = json!({"scheduler_id": "report", "organisation": org,
        "data": {"organisation_id": org, "report_recipe_id": recipe, "type": "report"}});
    if let Some(c) = cron {
        body["schedule"] = json!(c);
    }
    if let Some(d) = deadline {
        body["deadline_at"] = json!(d);
    }
    body
}

async fn create(app: &TestApp, body: &Value) -> reqwest::Response {
    app.post("/schedules", Some(body)).await
}

async fn rocky_manages_report_schedules(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // Monthly on the last day at 10:00 UTC, no deadline: the next fire is the deadline.
    let resp = create(
        &app,
        &report_schedule("org1", "r1", Some("0 10 L * *"), None),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let s: Value = resp.json().await.unwrap();
    for key in [
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
    ] {
        assert!(s.get(key).is_some(), "missing {key}");
    }
    assert_eq!(s["hash"], kat_scheduler::domain::hash::task_hash("r1-org1"));
    assert_eq!(s["enabled"], true);
    // The last day of a month at 10:00, after the test clock's now.
    let deadline: chrono::DateTime<chrono::Utc> =
        s["deadline_at"].as_str().unwrap().parse().unwrap();
    assert!(deadline > app.now());
    assert_eq!(deadline.format("%H:%M:%S").to_string(), "10:00:00");
    assert_eq!(
        (deadline + chrono::Duration::days(1))
            .format("%d")
            .to_string(),
        "01"
    );
    let id = s["id"].as_str().unwrap().to_owned();

    // A one-off report: a deadline and no cron.
    let once = create(
        &app,
        &report_schedule("org2", "r2", None, Some("2026-12-01")),
    )
    .await;
    assert_eq!(once.status(), StatusCode::CREATED);

    let page: Value = app
        .get("/schedules?scheduler_id=report&organisation=org1")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["count"], 1);
    assert_eq!(page["results"][0]["id"], json!(id));
    let all: Value = app.get("/schedules?limit=0").await.json().await.unwrap();
    assert_eq!(all["count"], 2);
    assert!(all["results"].as_array().unwrap().is_empty());
    // Rocky's search: its organisation and a recipe.
    let found: Value = app
        .post(
            "/schedules/search",
            Some(&json!({"filters": [
                {"column": "organisation", "operator": "==", "value": "org1"},
                {"column": "data", "field": "report_recipe_id", "operator": "==", "value": "r1"}]})),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(found["count"], 1);
    let due_soon: Value = app
        .post(
            "/schedules/search",
            Some(&json!({"filters": [{"column": "deadline_at", "operator": "<", "value": "2000-01-01T00:00:00Z"}]})),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(due_soon["count"], 0);
    let enabled: Value = app
        .post(
            "/schedules/search",
            Some(&json!({"filters": [{"column": "enabled", "operator": "==", "value": true}]})),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(enabled["count"], 2);

    // Disable, change the recurrence, run now, each as Rocky sends them.
    let path = format!("/schedules/{id}");
    let off: Value = app
        .patch(&path, &json!({"enabled": false}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(off["enabled"], false);
    // mula's `is` and `is_not` compare with their value; with null they test for null.
    for (operator, value, count) in [
        ("is", json!(true), 1),
        ("is", json!(false), 1),
        ("is_not", json!(true), 1),
        ("is_not", json!(false), 1),
        ("is", Value::Null, 0),
        ("is_not", Value::Null, 2),
    ] {
        let resp = app
            .post(
                "/schedules/search",
                Some(&json!({"filters": [{"column": "enabled", "operator": operator, "value": value}]})),
            )
            .await;
        assert_eq!(resp.status(), StatusCode::OK, "{operator} {value}");
        let page: Value = resp.json().await.unwrap();
        assert_eq!(page["count"], count, "enabled {operator} {value}: {page}");
        if operator == "is" && value == json!(false) {
            assert_eq!(page["results"][0]["id"], json!(id));
        }
    }
    let odd = app
        .post(
            "/schedules/search",
            Some(&json!({"filters": [{"column": "enabled", "operator": "is", "value": "yes"}]})),
        )
        .await;
    assert_eq!(odd.status(), StatusCode::BAD_REQUEST);
    assert!(detail(odd).await.contains("'is' takes true, false or null"));
    let weekly: Value = app
        .patch(
            &path,
            &json!({"schedule": "0 10 * * 1", "deadline_at": "2026-11-23T10:00:00Z"}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(weekly["schedule"], "0 10 * * 1");
    assert!(
        weekly["deadline_at"]
            .as_str()
            .unwrap()
            .starts_with("2026-11-23T10:00:00")
    );
    let nothing = app.patch(&path, &json!({"unknown": 1})).await;
    assert_eq!(nothing.status(), StatusCode::BAD_REQUEST);
    assert!(detail(nothing).await.contains("no data to patch"));

    assert_eq!(app.delete(&path).await.status(), StatusCode::NO_CONTENT);
    assert_eq!(app.get(&path).await.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        app.delete(&path).await.status(),
        StatusCode::NO_CONTENT,
        "as mula: always 204"
    );
}

async fn bad_schedules_get_mulas_answers(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let neither = create(&app, &report_schedule("org1", "r1", None, None)).await;
    assert_eq!(neither.status(), StatusCode::BAD_REQUEST);
    assert!(
        detail(neither)
            .await
            .contains("Either deadline_at or schedule must be provided")
    );
    let bad_cron = create(
        &app,
        &report_schedule("org1", "r1", Some("61 * * * *"), None),
    )
    .await;
    assert_eq!(bad_cron.status(), StatusCode::BAD_REQUEST);
    assert!(
        detail(bad_cron)
            .await
            .starts_with("Validation error occurred: invalid cron expression")
    );
    assert_eq!(
        create(
            &app,
            &report_schedule("org1", "r1", Some("0 0 * * *"), None)
        )
        .await
        .status(),
        StatusCode::CREATED
    );
    let twice = create(
        &app,
        &report_schedule("org1", "r1", Some("0 1 * * *"), None),
    )
    .await;
    assert_eq!(twice.status(), StatusCode::CONFLICT);
    assert!(
        detail(twice)
            .await
            .contains("schedule with the same hash already exists")
    );
    let mut unknown = report_schedule("org1", "r9", Some("0 0 * * *"), None);
    unknown["scheduler_id"] = json!("bits");
    let unknown = create(&app, &unknown).await;
    assert_eq!(unknown.status(), StatusCode::BAD_REQUEST);
    assert!(detail(unknown).await.contains("Scheduler bits not found"));
    let mut extra = report_schedule("org1", "r8", Some("0 0 * * *"), None);
    extra["colour"] = json!("red");
    assert_eq!(
        create(&app, &extra).await.status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let mut misfit = report_schedule("org1", "r7", Some("0 0 * * *"), None);
    misfit["data"] = json!({"boefje": {"id": "dns"}});
    assert_eq!(
        create(&app, &misfit).await.status(),
        StatusCode::BAD_REQUEST
    );
    let bad_filter = app
        .post(
            "/schedules/search",
            Some(&json!({"filters": [{"column": "priority", "value": 1}]})),
        )
        .await;
    assert_eq!(bad_filter.status(), StatusCode::BAD_REQUEST);
    assert!(
        detail(bad_filter)
            .await
            .contains("unknown column 'priority'")
    );
    assert_eq!(
        app.post_raw("/schedules/search", "").await.status(),
        StatusCode::UNPROCESSABLE_ENTITY,
        "the filter body is required"
    );
    // The id is a UUID in the document; other text names no schedule (404: a task's null
    // `schedule_id` followed as a link is `/schedules/None`). `search` is the search's own
    // path, which takes only POST: a 405 for any other method.
    for path in ["/schedules/nope", "/schedules/None"] {
        assert_eq!(
            app.get(path).await.status(),
            StatusCode::NOT_FOUND,
            "GET {path}"
        );
    }
    for resp in [
        app.get("/schedules/search").await,
        app.patch("/schedules/search", &json!({"enabled": true}))
            .await,
    ] {
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(resp.headers()["allow"], "POST");
    }
    assert_eq!(
        app.get("/schedules/00000000-0000-0000-0000-000000000000")
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    let mut bad_id = report_schedule("org1", "r6", Some("0 0 * * *"), None);
    bad_id["data"]["id"] = json!("AAA");
    assert_eq!(
        create(&app, &bad_id).await.status(),
        StatusCode::BAD_REQUEST
    );
}

/// Whether a schedule fires at a (whole-minute) time.
type FiresAt = dyn Fn(chrono::NaiveDateTime) -> bool;

/// The first whole minute after `now` that `fires` holds for: what the schedule's deadline must
/// be, found by walking the minutes (a check apart from the evaluator's search).
fn first_fire_after(
    now: chrono::DateTime<chrono::Utc>,
    fires: impl Fn(chrono::NaiveDateTime) -> bool,
) -> chrono::DateTime<chrono::Utc> {
    use chrono::Timelike;
    let mut t = now
        .naive_utc()
        .with_second(0)
        .unwrap()
        .with_nanosecond(0)
        .unwrap();
    loop {
        t += chrono::Duration::minutes(1);
        if fires(t) {
            return t.and_utc();
        }
    }
}

/// The cron forms users' schedules and scripts use with mula (croniter's: nicknames, names,
/// ranges, `L`, the day fields' OR) are taken, with the next fire as the deadline; what croniter
/// refuses, or what never fires, is a 400 naming what is wrong.
async fn schedules_take_croniters_cron_language(backend: Backend) {
    use chrono::{Datelike, Timelike, Weekday};
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let midnight = |t: chrono::NaiveDateTime| t.hour() == 0 && t.minute() == 0;
    let weekday = |t: chrono::NaiveDateTime| !matches!(t.weekday(), Weekday::Sat | Weekday::Sun);
    let cases: [(&str, Box<FiresAt>); 6] = [
        ("@daily", Box::new(midnight)),
        (
            "@HOURLY",
            Box::new(|t: chrono::NaiveDateTime| t.minute() == 0),
        ),
        (
            "0 9 * * MON-FRI",
            Box::new(move |t: chrono::NaiveDateTime| {
                t.hour() == 9 && t.minute() == 0 && weekday(t)
            }),
        ),
        // Day of month or day of week: the first seven days, and every Monday.
        (
            "0 0 1-7 * 1",
            Box::new(move |t: chrono::NaiveDateTime| {
                midnight(t) && (t.day() <= 7 || t.weekday() == Weekday::Mon)
            }),
        ),
        (
            "0 0 L * *",
            Box::new(move |t: chrono::NaiveDateTime| {
                midnight(t) && (t + chrono::Duration::days(1)).day() == 1
            }),
        ),
        (
            "*/20 8-17/3 * JAN-DEC ?",
            Box::new(|t: chrono::NaiveDateTime| {
                t.minute().is_multiple_of(20) && [8, 11, 14, 17].contains(&t.hour())
            }),
        ),
    ];
    for (i, (cron, fires)) in cases.iter().enumerate() {
        let resp = create(
            &app,
            &report_schedule("org1", &format!("c{i}"), Some(cron), None),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::CREATED, "{cron}");
        let s: Value = resp.json().await.unwrap();
        assert_eq!(s["schedule"], *cron);
        let deadline: chrono::DateTime<chrono::Utc> =
            s["deadline_at"].as_str().unwrap().parse().unwrap();
        assert_eq!(deadline, first_fire_after(app.now(), fires), "{cron}");
    }
    // A change of recurrence takes the same language.
    let s: Value = create(
        &app,
        &report_schedule("org1", "patched", Some("@weekly"), None),
    )
    .await
    .json()
    .await
    .unwrap();
    let path = format!("/schedules/{}", s["id"].as_str().unwrap());
    let monthly = app.patch(&path, &json!({"schedule": "0 6 1 */3 *"})).await;
    assert_eq!(monthly.status(), StatusCode::OK);

    for (cron, names) in [
        ("61 * * * *", "minute '61': 61 is out of range"),
        ("0 0 * * FOO", "day of week 'FOO'"),
        ("@fortnightly", "unknown nickname '@fortnightly'"),
        ("0 0 * * 1#2,3", "cannot be mixed"),
        ("0 0 * * * 30", "seconds and year fields are not taken"),
        // croniter reads it, but 31 February never comes; mula refuses it too.
        ("0 0 31 2 *", "never fires"),
    ] {
        let resp = create(&app, &report_schedule("org1", "bad", Some(cron), None)).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{cron}");
        let why = detail(resp).await;
        assert!(
            why.starts_with("Validation error occurred: invalid cron expression")
                && why.contains(names),
            "{cron}: {why}"
        );
        let resp = app.patch(&path, &json!({"schedule": cron})).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{cron}");
        assert!(detail(resp).await.contains(names), "{cron}");
    }
}

const PLUGINS: &str = r#"
[[plugins]]
id = "dns-records"
type = "boefje"
consumes = ["Hostname"]
scan_level = 1
enabled = true
interval = 60

[[plugins]]
id = "nightly"
type = "boefje"
consumes = ["Hostname"]
scan_level = 1
enabled = true
cron = "0 3 * * *"

[[plugins]]
id = "on-create"
type = "boefje"
consumes = ["Hostname"]
scan_level = 1
enabled = true
run_on = ["create"]
"#;

async fn schedule_of(app: &TestApp, task: &Value) -> Value {
    let id = task["schedule_id"]
        .as_str()
        .expect("the task has a schedule");
    let resp = app.get(&format!("/schedules/{id}")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    resp.json().await.unwrap()
}

async fn count(app: &TestApp, scheduler: &str) -> u64 {
    let page: Value = app
        .get(&format!("/schedules?scheduler_id={scheduler}&limit=0"))
        .await
        .json()
        .await
        .unwrap();
    page["count"].as_u64().unwrap()
}

/// mula's `post_push`: boefje and report work a client pushes gets the schedule of its hash,
/// made when missing, with the deadline its plugin gives; a refused push leaves none behind.
async fn pushed_work_gets_the_schedule_of_its_hash(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("catalogue.toml");
    std::fs::write(&file, PLUGINS).unwrap();
    let c = file.to_string_lossy().into_owned();
    let Some(app) = spawn_app_with(backend, move |s| {
        s.catalogue.file = c;
        s.cron.grace_period_secs = 7_200;
    })
    .await
    else {
        return;
    };
    let now = app.now();
    let at = |v: &Value| -> chrono::DateTime<chrono::Utc> {
        v["deadline_at"].as_str().unwrap().parse().unwrap()
    };

    // The plugin's interval (60 minutes) sets the next run.
    let task = app
        .push_ok(
            "boefje",
            &boefje_push("org1", "dns-records", Some("Hostname|internet|a.nl"), 1),
        )
        .await;
    let s = schedule_of(&app, &task).await;
    assert_eq!(s["hash"], task["hash"]);
    assert_eq!(s["scheduler_id"], "boefje");
    assert_eq!(s["organisation"], "org1");
    assert_eq!(s["enabled"], true);
    assert!(s["schedule"].is_null());
    assert!(
        s["data"].get("id").is_none(),
        "the schedule keeps the work, not the task's id"
    );
    assert_eq!(s["data"]["boefje"]["id"], "dns-records");
    assert_eq!(at(&s), now + chrono::Duration::minutes(60));
    // The same work again, once the first ran: the same schedule.
    assert_eq!(app.pop_ids("boefje", 1).await, vec![id_of(&task)]);
    let done = app
        .patch_task(&id_of(&task), &json!({"status": "completed"}))
        .await;
    assert_eq!(done.status(), StatusCode::OK);
    let again = app
        .push_ok(
            "boefje",
            &boefje_push("org1", "dns-records", Some("Hostname|internet|a.nl"), 1),
        )
        .await;
    assert_ne!(again["id"], task["id"]);
    assert_eq!(again["schedule_id"], task["schedule_id"]);
    assert_eq!(count(&app, "boefje").await, 1);

    // A plugin with a cron expression: its next fire; a plugin the catalogue does not know: the
    // grace period; a plugin that runs only on events: no schedule.
    let nightly = app
        .push_ok(
            "boefje",
            &boefje_push("org1", "nightly", Some("Hostname|internet|a.nl"), 1),
        )
        .await;
    let s = schedule_of(&app, &nightly).await;
    assert_eq!(s["schedule"], "0 3 * * *");
    assert_eq!(at(&s).format("%H:%M").to_string(), "03:00");
    assert!(at(&s) > now && at(&s) <= now + chrono::Duration::days(1));
    let unknown = app
        .push_ok(
            "boefje",
            &boefje_push("org1", "unlisted", Some("Hostname|internet|a.nl"), 1),
        )
        .await;
    assert_eq!(
        at(&schedule_of(&app, &unknown).await),
        now + chrono::Duration::hours(2)
    );
    let on_create = app
        .push_ok(
            "boefje",
            &boefje_push("org1", "on-create", Some("Hostname|internet|a.nl"), 1),
        )
        .await;
    assert!(on_create["schedule_id"].is_null());
    assert_eq!(count(&app, "boefje").await, 3);

    // A report run is its schedule's one-off: no deadline, so it does not fire again.
    let report = app.push_ok("report", &report_push("org1", "r1", 1)).await;
    let s = schedule_of(&app, &report).await;
    assert_eq!(s["hash"], report["hash"]);
    assert!(s["deadline_at"].is_null() && s["schedule"].is_null());
    // Normalizer work has no schedule.
    let normalizer = app
        .push_ok(
            "normalizer",
            &normalizer_push("org1", "kat_dns_normalize", 1),
        )
        .await;
    assert!(normalizer["schedule_id"].is_null());
    assert_eq!(count(&app, "normalizer").await, 0);

    // Refused pushes write nothing: malformed, and a duplicate of waiting work.
    let resp = app
        .push(
            "boefje",
            &json!({"organisation": "org1", "priority": 1, "data": {"boefje": {}}}),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let resp = app
        .push(
            "boefje",
            &boefje_push("org1", "dns-records", Some("Hostname|internet|a.nl"), 1),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert_eq!(count(&app, "boefje").await, 3);
    // The second push met the schedule its hash had: the heap knows the task by that schedule
    // too, so a pop filtered on it finds it.
    let by_schedule = json!({"filters": [
        {"column": "schedule_id", "operator": "==", "value": task["schedule_id"]}
    ]});
    let popped = app.pop_ok("boefje", 1, Some(&by_schedule)).await;
    assert_eq!(popped.len(), 1, "found by the schedule its hash had");
    assert_eq!(popped[0]["id"], again["id"]);
}

/// A push the full queue refuses (429) writes no schedule: the schedule is written in the
/// transaction that creates the task, and none is.
async fn a_refused_push_writes_no_schedule(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| {
        s.queue.maxsize = 1;
        s.queue.when_full = kat_scheduler::queue::WhenFull::Reject;
    })
    .await
    else {
        return;
    };
    app.push_ok("boefje", &boefje_push("org1", "a", Some("h1"), 5))
        .await;
    let resp = app
        .push("boefje", &boefje_push("org1", "b", Some("h2"), 5))
        .await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        count(&app, "boefje").await,
        1,
        "only the accepted push's schedule"
    );
}

crate::backend_tests!(
    rocky_manages_report_schedules,
    bad_schedules_get_mulas_answers,
    schedules_take_croniters_cron_language,
    pushed_work_gets_the_schedule_of_its_hash,
    a_refused_push_writes_no_schedule,
);

/// A `PATCH` writes the fields it names and no other: a tick that moved the deadline (or
/// disabled the schedule) between the request's read of the row and its write keeps what it
/// wrote. Written back whole, the old deadline came back, and the report ran twice. The tick's
/// write is stood in for by another session holding the row while the PATCH waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_does_not_write_back_what_a_tick_changed_meanwhile() {
    let Some(app) = spawn_app(Backend::Postgres).await else {
        return;
    };
    let resp = create(
        &app,
        &report_schedule("org1", "r1", None, Some("2026-12-01T10:00:00Z")),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let (write_tx, write_rx) = std::sync::mpsc::channel::<()>();
    let (uri, row) = (app.db.uri.clone(), id.clone());
    let tick = std::thread::spawn(move || {
        use diesel::{Connection, PgConnection, connection::SimpleConnection};
        let mut c = PgConnection::establish(&uri).expect("connect");
        c.batch_execute(&format!(
            "BEGIN; SELECT 1 FROM schedules WHERE id = '{row}' FOR UPDATE"
        ))
        .expect("lock");
        locked_tx.send(()).unwrap();
        let _ = write_rx.recv();
        c.batch_execute(&format!(
            "UPDATE schedules SET deadline_at = '2026-12-02 10:00:00' WHERE id = '{row}'; COMMIT"
        ))
        .expect("the tick's write");
    });
    locked_rx.recv().unwrap();
    let patch = {
        let (app_address, id) = (app.address.clone(), id.clone());
        tokio::spawn(async move {
            reqwest::Client::new()
                .patch(format!("{app_address}/schedules/{id}"))
                .json(&json!({"schedule": "0 10 * * *"}))
                .send()
                .await
                .unwrap()
        })
    };
    // The PATCH has read the row and waits to write it.
    let uri = app.db.uri.clone();
    tokio::task::spawn_blocking(move || {
        use diesel::{Connection, PgConnection, RunQueryDsl};
        let mut c = PgConnection::establish(&uri).expect("connect");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let waiting = diesel::sql_query(
                "SELECT 1::bigint AS count FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE 'UPDATE schedules%'",
            )
            .load::<kat_scheduler::storage::rows::CountRow>(&mut c)
            .unwrap();
            if !waiting.is_empty() || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::yield_now();
        }
    })
    .await
    .unwrap();
    write_tx.send(()).unwrap();
    tick.join().unwrap();
    let resp = patch.await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let answered: Value = resp.json().await.unwrap();
    assert_eq!(answered["schedule"], "0 10 * * *");
    let stored: Value = app
        .get(&format!("/schedules/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(stored["schedule"], "0 10 * * *");
    assert_eq!(
        stored["deadline_at"], "2026-12-02T10:00:00Z",
        "the tick's deadline stands: {stored}"
    );
    assert_eq!(answered["deadline_at"], stored["deadline_at"]);
}
