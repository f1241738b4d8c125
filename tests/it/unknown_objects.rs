//! Unknown is not gone: the frontier is a mirror of Octopoes, never the verdict. A due boefje
//! schedule whose object the frontier lacks (an organisation Katalogus does not list, so
//! ColdStart never paged it, and no event announced the object) is asked of Octopoes: fired when
//! Octopoes holds the object, disabled only on Octopoes' own "not found", and left waiting (its
//! deadline kept) while Octopoes cannot answer, to fire once when it can. One whose object the
//! frontier holds is asked too: a fire scans only what Octopoes permits now.

use std::collections::HashMap;

use chrono::{DateTime, Duration, TimeZone, Utc};
use kat_scheduler::domain::SchedulerId;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;
use crate::stubs::*;

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

[[plugins]]
id = "low"
type = "boefje"
consumes = ["Hostname"]
scan_level = 1
enabled = true
interval = 60
"#;

/// The organisation Katalogus does not list.
const ORG: &str = "unlisted";

fn midnight() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2027, 3, 1, 0, 0, 0).unwrap()
}

fn host(i: usize) -> String {
    format!("Hostname|internet|h{i}.example.nl")
}

struct Setup {
    app: TestApp,
    octopoes: OctopoesState,
    stub: Stub,
    _dir: tempfile::TempDir,
}

impl Setup {
    /// The app with the catalogue above and Octopoes holding `objects` of [`ORG`] (level 2).
    /// Its lookups wait a minute for Octopoes' answers: the stub answers every call it does not
    /// hold, and a test's answers must not miss the window on a machine slowed by other work.
    async fn new(backend: Backend, objects: usize) -> Option<Setup> {
        Self::at(backend, objects, "", 60).await
    }

    /// The same with `path` after Octopoes' address in the app's configuration, and lookups
    /// that wait `window` seconds for Octopoes' answers.
    async fn at(backend: Backend, objects: usize, path: &str, window: u64) -> Option<Setup> {
        let dir = tempfile::tempdir().unwrap();
        let catalogue = dir.path().join("catalogue.toml");
        std::fs::write(&catalogue, CATALOGUE).unwrap();
        let octopoes = OctopoesState::default();
        octopoes.set(
            ORG,
            (0..objects)
                .map(|i| octopoes_object(&host(i), "Hostname", 2))
                .collect(),
        );
        octopoes.set("listed", Vec::new());
        let stub = octopoes.serve();
        let url = format!("{}{path}", stub.url);
        let app = spawn_app_with(backend, move |s| {
            s.catalogue.file = catalogue.to_string_lossy().into_owned();
            s.clients.octopoes_api = url;
            s.clients.lookup_window_secs = window;
        })
        .await?;
        app.clock.set(midnight());
        Some(Setup {
            app,
            octopoes,
            stub,
            _dir: dir,
        })
    }

    /// A `dns-records` schedule of `org` on `ooi`, due a minute ago; answers its id.
    async fn schedule(&self, org: &str, ooi: &str) -> String {
        self.schedule_of(org, ooi, "dns-records").await
    }

    /// A schedule of `boefje` for `org` on `ooi`, due a minute ago; answers its id.
    async fn schedule_of(&self, org: &str, ooi: &str, boefje: &str) -> String {
        let body = json!({"scheduler_id": "boefje", "organisation": org,
            "deadline_at": (midnight() - Duration::minutes(1)).to_rfc3339(),
            "data": {"boefje": {"id": boefje}, "input_ooi": ooi, "organization": org}});
        let resp = self.app.post("/schedules", Some(&body)).await;
        assert_eq!(resp.status(), StatusCode::CREATED);
        let s: Value = resp.json().await.unwrap();
        s["id"].as_str().unwrap().to_owned()
    }

    /// `GET /schedules/{id}/history`: the schedule's fires, newest first.
    async fn history(&self, id: &str) -> Value {
        self.app
            .get(&format!("/schedules/{id}/history"))
            .await
            .json()
            .await
            .unwrap()
    }

    async fn get_schedule(&self, id: &str) -> Value {
        self.app
            .get(&format!("/schedules/{id}"))
            .await
            .json()
            .await
            .unwrap()
    }

    async fn reschedule(&self) -> String {
        let report = self.app.tick(SchedulerId::Boefje).await;
        report.entries["reschedule"].summary.clone()
    }

    /// How many times Octopoes was asked for one object.
    fn object_calls(&self) -> usize {
        self.stub
            .seen()
            .iter()
            .filter(|s| s.path.ends_with("/object"))
            .count()
    }

    /// The boefje tasks of the queue, popped (each schedule's task is its own unit).
    async fn pop_all(&self) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let got = self.app.pop_ok("boefje", 1, None).await;
            if got.is_empty() {
                return out;
            }
            out.extend(got);
        }
    }
}

fn deadline(s: &Value) -> DateTime<Utc> {
    s["deadline_at"].as_str().unwrap().parse().unwrap()
}

async fn a_due_schedule_whose_object_only_octopoes_holds_fires_and_only_octopoes_says_gone(
    backend: Backend,
) {
    let Some(s) = Setup::new(backend, 300).await else {
        return;
    };
    let mut present = Vec::new();
    for i in 0..300 {
        present.push(s.schedule(ORG, &host(i)).await);
    }
    let gone = s
        .schedule(ORG, "Hostname|internet|deleted.example.nl")
        .await;
    // An organisation Octopoes has no node for: its 404 says nothing of the object.
    let no_node = s.schedule("elsewhere", &host(0)).await;

    assert_eq!(
        s.reschedule().await,
        "fired 300, skipped 0, disabled 1, waiting 1"
    );
    let tasks = s.pop_all().await;
    assert_eq!(tasks.len(), 300, "every object Octopoes holds is scanned");
    let fired: HashMap<String, usize> = tasks.iter().fold(HashMap::new(), |mut m, t| {
        *m.entry(t["schedule_id"].as_str().unwrap().to_owned())
            .or_default() += 1;
        m
    });
    assert!(present.iter().all(|id| fired.get(id) == Some(&1)));
    for id in &present {
        let sch = s.get_schedule(id).await;
        assert_eq!(sch["enabled"], true);
        assert_eq!(deadline(&sch), midnight() + Duration::minutes(60));
    }
    let g = s.get_schedule(&gone).await;
    assert_eq!(g["enabled"], false);
    assert!(
        g["disabled_reason"].as_str().unwrap().contains("is gone"),
        "{g}"
    );
    let n = s.get_schedule(&no_node).await;
    assert_eq!(
        (n["enabled"].clone(), n["disabled_reason"].clone()),
        (json!(true), Value::Null),
        "waits, neither fired nor disabled"
    );
    assert_eq!(deadline(&n), midnight() - Duration::minutes(1));

    let asked = s.object_calls();
    assert_eq!(asked, 302);
    for t in &tasks {
        let id = id_of(t);
        s.app.patch_task(&id, &json!({"status": "completed"})).await;
    }
    // Past the plugin's interval since those runs ended (mula's grace gate).
    s.app.clock.advance(Duration::minutes(61));
    let summary = s.reschedule().await;
    assert!(summary.starts_with("fired 300,"), "{summary}");
    // The frontier learnt Octopoes' answers, yet every fire asks again: a fire runs the scan,
    // and the row may lag a clearance lowered or an object deleted.
    assert_eq!(s.object_calls(), asked + 301);
    let metrics = s.app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("scheduler_object_lookups_total{outcome=\"found\"} 600"),
        "{metrics}"
    );
    assert!(metrics.contains("scheduler_object_lookups_total{outcome=\"not_found\"} 1"));
}

/// The frontier's row says the object may be scanned, but Octopoes has since lowered its
/// clearance, or deleted it, and no event told the service (a listener down, an event
/// dead-lettered): a fire asks Octopoes and scans nothing it may not.
async fn a_fire_scans_only_what_octopoes_permits_now_whatever_the_frontier_s_row_says(
    backend: Backend,
) {
    let Some(s) = Setup::new(backend, 3).await else {
        return;
    };
    let ids: Vec<String> = futures_util::future::join_all((0..3).map(|i| {
        let s = &s;
        async move { s.schedule(ORG, &host(i)).await }
    }))
    .await;
    assert_eq!(
        s.reschedule().await,
        "fired 3, skipped 0, disabled 0, waiting 0"
    );
    for t in s.pop_all().await {
        s.app
            .patch_task(&id_of(&t), &json!({"status": "completed"}))
            .await;
    }
    // The frontier now holds the three at level 2. Octopoes lowers h0 to 1, below
    // dns-records' 2, and deletes h1; nothing announces either.
    s.octopoes.set(
        ORG,
        vec![
            octopoes_object(&host(0), "Hostname", 1),
            octopoes_object(&host(2), "Hostname", 2),
        ],
    );
    s.app.clock.advance(Duration::minutes(61));
    assert_eq!(
        s.reschedule().await,
        "fired 1, skipped 0, disabled 2, waiting 0"
    );
    let tasks = s.pop_all().await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0]["data"]["input_ooi"], host(2));
    // Asked of Octopoes, h2 is as it was when it last ran: not a changed object to a strategy.
    let why: Value = s
        .app
        .get(&format!("/tasks/{}/explain", id_of(&tasks[0])))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(why["inputs"]["findings_changed"], false, "{why}");
    let reason = |i: usize| {
        let s = &s;
        let id = ids[i].clone();
        async move { s.get_schedule(&id).await["disabled_reason"].clone() }
    };
    assert!(reason(0).await.as_str().unwrap().contains("scan level"));
    assert!(reason(1).await.as_str().unwrap().contains("is gone"));
}

/// Octopoes answers 400 for one object its model cannot read: that schedule waits, and the
/// other objects are asked and fire as before (the 400 says nothing of Octopoes itself).
async fn an_object_octopoes_cannot_read_holds_up_only_its_own_schedule(backend: Backend) {
    let Some(s) = Setup::new(backend, 3).await else {
        return;
    };
    s.octopoes.unreadable.lock().unwrap().insert(host(0));
    let broken = s.schedule(ORG, &host(0)).await;
    s.schedule(ORG, &host(1)).await;
    assert_eq!(
        s.reschedule().await,
        "fired 1, skipped 0, disabled 0, waiting 1"
    );
    // A schedule come due a second later is asked, as Octopoes answers.
    s.schedule(ORG, &host(2)).await;
    s.app.clock.advance(Duration::seconds(1));
    assert_eq!(
        s.reschedule().await,
        "fired 1, skipped 0, disabled 0, waiting 1"
    );
    let sch = s.get_schedule(&broken).await;
    assert_eq!(
        (sch["enabled"].clone(), deadline(&sch)),
        (json!(true), midnight() - Duration::minutes(1)),
        "waits, its deadline kept"
    );
    // Octopoes can read it again, but it waits out five minutes before it is asked: an object
    // Octopoes refuses stays refused until Octopoes changes, and asking every tick would spend
    // the tick's budget of calls on it.
    s.octopoes.unreadable.lock().unwrap().clear();
    let calls = s.object_calls();
    s.app.clock.advance(Duration::seconds(1));
    assert_eq!(
        s.reschedule().await,
        "fired 0, skipped 0, disabled 0, waiting 1"
    );
    assert_eq!(s.object_calls(), calls, "not asked within its wait");
    s.app.clock.advance(Duration::minutes(5));
    assert_eq!(
        s.reschedule().await,
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
}

/// A schedule whose `input_ooi` is empty names no object, as mula reads it: it fires with
/// none, and Octopoes is not asked for an object named "".
async fn a_schedule_with_an_empty_object_fires_without_one(backend: Backend) {
    let Some(s) = Setup::new(backend, 1).await else {
        return;
    };
    let id = s.schedule(ORG, "").await;
    assert_eq!(
        s.reschedule().await,
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    assert_eq!(s.object_calls(), 0);
    let tasks = s.pop_all().await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0]["schedule_id"].as_str().unwrap(), id);
    assert_eq!(tasks[0]["data"]["input_ooi"], Value::Null);
}

/// Octopoes answers some of a tick's objects within the lookup's window and is slow on the
/// others: those wait for the next tick, and nobody is held back as if Octopoes were down.
async fn objects_octopoes_is_slow_on_wait_for_the_next_tick_without_a_backoff(backend: Backend) {
    let Some(s) = Setup::at(backend, 2, "", 5).await else {
        return;
    };
    let ids = [
        s.schedule(ORG, &host(0)).await,
        s.schedule(ORG, &host(1)).await,
    ];
    // One lookup hangs past the window (5 s); the other is answered. The next tick's call may meet
    // the stub closing the kept-alive connection the answer came on (its keep-alive is 5 s too):
    // it is sent again at once, not counted as Octopoes failing.
    let mut held = s.octopoes.hold();
    let release = async {
        held.arrived().await;
        held
    };
    let (summary, held) = tokio::join!(s.reschedule(), release);
    assert_eq!(summary, "fired 1, skipped 0, disabled 0, waiting 1");
    held.release();
    s.app.clock.advance(Duration::seconds(1));
    let summary = s.reschedule().await;
    let mut fires = Vec::new();
    for id in &ids {
        fires.push(s.history(id).await["results"].clone());
    }
    assert_eq!(
        summary, "fired 1, skipped 0, disabled 0, waiting 0",
        "asked again at once: no backoff; the fires: {fires:#?}"
    );
    let metrics = s.app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("scheduler_object_lookups_total{outcome=\"failed\"} 0"),
        "{metrics}"
    );
}

async fn octopoes_down_during_a_tick_leaves_the_schedule_waiting_and_it_fires_once_when_back(
    backend: Backend,
) {
    let Some(s) = Setup::new(backend, 1).await else {
        return;
    };
    let id = s.schedule(ORG, &host(0)).await;
    s.octopoes.set_down(true);
    assert_eq!(
        s.reschedule().await,
        "fired 0, skipped 0, disabled 0, waiting 1"
    );
    let asked = s.object_calls();
    assert_eq!(asked, 1);
    // The next tick is within the backoff: Octopoes is not asked again.
    s.app.clock.advance(Duration::seconds(1));
    assert_eq!(
        s.reschedule().await,
        "fired 0, skipped 0, disabled 0, waiting 1"
    );
    assert_eq!(s.object_calls(), asked);
    let sch = s.get_schedule(&id).await;
    assert_eq!(sch["enabled"], true);
    assert_eq!(deadline(&sch), midnight() - Duration::minutes(1));
    assert!(s.pop_all().await.is_empty(), "nothing fired while unknown");

    s.octopoes.set_down(false);
    s.app.clock.advance(Duration::seconds(10));
    assert_eq!(
        s.reschedule().await,
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    s.app.clock.advance(Duration::seconds(1));
    assert_eq!(
        s.reschedule().await,
        "fired 0, skipped 0, disabled 0, waiting 0",
        "once"
    );
    let tasks = s.pop_all().await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0]["schedule_id"].as_str().unwrap(), id);
    let metrics = s.app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("scheduler_object_lookups_total{outcome=\"failed\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("scheduler_object_lookups_total{outcome=\"deferred\"} 1"));
}

/// The frontier holds the object as gone (a delete event), but it came back in Octopoes with no
/// event announcing it: the row is a mirror too, so the schedule fires and the row revives; one
/// whose object Octopoes also lacks is disabled.
async fn a_frontier_row_marked_gone_is_asked_again_before_a_schedule_is_disabled(backend: Backend) {
    let Some(s) = Setup::new(backend, 1).await else {
        return;
    };
    let frontier = s.app.frontier();
    let deleted = "Hostname|internet|deleted.example.nl";
    let events: Vec<kat_scheduler::domain::event::ObjectEvent> = [host(0).as_str(), deleted]
        .iter()
        .map(|r| kat_scheduler::domain::event::ObjectEvent {
            operation: kat_scheduler::domain::event::Operation::Delete,
            organisation: ORG.into(),
            reference: (*r).into(),
            object: None,
        })
        .collect();
    let refs: Vec<&kat_scheduler::domain::event::ObjectEvent> = events.iter().collect();
    frontier
        .apply_objects(&refs, midnight().naive_utc())
        .await
        .unwrap();
    let back = s.schedule(ORG, &host(0)).await;
    let gone = s.schedule(ORG, deleted).await;

    assert_eq!(
        s.reschedule().await,
        "fired 1, skipped 0, disabled 1, waiting 0"
    );
    assert_eq!(
        s.object_calls(),
        2,
        "both rows marked gone were asked again"
    );
    assert_eq!(s.get_schedule(&back).await["enabled"], true);
    let tasks = s.pop_all().await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0]["schedule_id"].as_str().unwrap(), back);
    let g = s.get_schedule(&gone).await;
    assert_eq!(g["enabled"], false);
    assert!(g["disabled_reason"].as_str().unwrap().contains("is gone"));
    let revived = frontier.object(ORG, &host(0)).await.unwrap().unwrap();
    assert_eq!(revived.gone_at, None, "Octopoes' answer is recorded");
}

/// An Octopoes address with a wrong path (a prefix too many, a proxy before another app) gets
/// FastAPI's own 404 `{"detail": "Not Found"}` for every object: that names no object, so no
/// schedule is disabled as gone; each waits, and fires once the address is right.
async fn a_404_that_does_not_name_the_object_disables_nothing(backend: Backend) {
    let Some(s) = Setup::at(backend, 3, "/octopoes", 60).await else {
        return;
    };
    let ids = [
        s.schedule(ORG, &host(0)).await,
        s.schedule(ORG, &host(1)).await,
        s.schedule(ORG, "Hostname|internet|deleted.example.nl")
            .await,
    ];
    assert_eq!(
        s.reschedule().await,
        "fired 0, skipped 0, disabled 0, waiting 3"
    );
    assert_eq!(
        s.object_calls(),
        3,
        "each was asked, and the answer named none"
    );
    for id in &ids {
        let sch = s.get_schedule(id).await;
        assert_eq!(
            (sch["enabled"].clone(), sch["disabled_reason"].clone()),
            (json!(true), Value::Null),
            "{sch}"
        );
        assert_eq!(deadline(&sch), midnight() - Duration::minutes(1));
    }
    assert!(s.pop_all().await.is_empty());
    let metrics = s.app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics
            .lines()
            .filter(|l| l.starts_with("scheduler_object_lookups_total{outcome=\"not_found\"}"))
            .all(|l| l.ends_with(" 0")),
        "no lookup counted as not found: {metrics}"
    );
}

/// A scan level too low disables a schedule only on Octopoes' word of now: the frontier's row
/// may lag a raised clearance (its event still queued, or dead-lettered). The row is recorded at
/// level 1 by the first tick; Octopoes then holds one object at level 2, and `dns-records` asks
/// for 2. While Octopoes is down both schedules wait; once it answers, the raised object's fires
/// and the other's is disabled.
async fn a_scan_level_too_low_in_the_frontier_is_asked_of_octopoes_before_a_schedule_is_disabled(
    backend: Backend,
) {
    let Some(s) = Setup::new(backend, 0).await else {
        return;
    };
    let level = |l0, l1| {
        s.octopoes.set(
            ORG,
            vec![
                octopoes_object(&host(0), "Hostname", l0),
                octopoes_object(&host(1), "Hostname", l1),
            ],
        )
    };
    level(1, 1);
    s.schedule_of(ORG, &host(0), "low").await;
    s.schedule_of(ORG, &host(1), "low").await;
    assert_eq!(
        s.reschedule().await,
        "fired 2, skipped 0, disabled 0, waiting 0"
    );
    assert_eq!(s.pop_all().await.len(), 2);

    level(2, 1);
    let raised = s.schedule(ORG, &host(0)).await;
    let low = s.schedule(ORG, &host(1)).await;
    s.octopoes.set_down(true);
    assert_eq!(
        s.reschedule().await,
        "fired 0, skipped 0, disabled 0, waiting 2",
        "not disabled on the frontier's level 1"
    );
    for id in [&raised, &low] {
        let sch = s.get_schedule(id).await;
        assert_eq!(
            (sch["enabled"].clone(), sch["disabled_reason"].clone()),
            (json!(true), Value::Null),
            "{sch}"
        );
    }

    s.octopoes.set_down(false);
    s.app.clock.advance(Duration::seconds(10));
    assert_eq!(
        s.reschedule().await,
        "fired 1, skipped 0, disabled 1, waiting 0"
    );
    let tasks = s.pop_all().await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0]["schedule_id"].as_str().unwrap(), raised);
    let sch = s.get_schedule(&low).await;
    assert_eq!(sch["enabled"], false, "Octopoes' own level 1 disables it");
    assert!(sch["disabled_reason"].is_string(), "{sch}");
}

/// A user's edit made while a tick decides wins over the tick's decision: the tick read a
/// schedule whose object is gone and one that fires, and while it waits on Octopoes the user
/// points the first at another object and sets the second's next deadline. The first is not
/// disabled (its fire is decided again on the next tick, on the new object), and the second's
/// deadline stays the user's.
async fn a_users_edit_made_while_a_tick_decides_is_not_overwritten(backend: Backend) {
    let Some(s) = Setup::new(backend, 1).await else {
        return;
    };
    let moved = s
        .schedule(ORG, "Hostname|internet|deleted.example.nl")
        .await;
    let fires = s.schedule(ORG, &host(0)).await;
    let mut held = s.octopoes.hold();
    let edit = async {
        held.arrived().await;
        s.app.clock.advance(Duration::seconds(1));
        let data = json!({"data": {"boefje": {"id": "low"}, "input_ooi": host(0),
            "organization": ORG}});
        let r = s.app.patch(&format!("/schedules/{moved}"), &data).await;
        assert_eq!(r.status(), StatusCode::OK);
        let later = json!({"deadline_at": (midnight() + Duration::days(1)).to_rfc3339()});
        let r = s.app.patch(&format!("/schedules/{fires}"), &later).await;
        assert_eq!(r.status(), StatusCode::OK);
        held.release();
    };
    let (summary, ()) = tokio::join!(s.reschedule(), edit);
    assert_eq!(
        summary, "fired 1, skipped 0, disabled 0, waiting 1",
        "the gone object's disable met an edited schedule"
    );
    let m = s.get_schedule(&moved).await;
    assert_eq!(
        (m["enabled"].clone(), m["disabled_reason"].clone()),
        (json!(true), Value::Null),
        "{m}"
    );
    assert_eq!(m["data"]["input_ooi"], host(0).as_str());
    let history = s.history(&moved).await;
    assert_eq!(history["count"], 0, "no fire recorded for it: {history}");
    let f = s.get_schedule(&fires).await;
    assert_eq!(deadline(&f), midnight() + Duration::days(1), "the user's");
    let tasks = s.pop_all().await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0]["schedule_id"].as_str().unwrap(), fires);

    // The next tick decides the edited schedule on its new object.
    assert_eq!(
        s.reschedule().await,
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    let tasks = s.pop_all().await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0]["schedule_id"].as_str().unwrap(), moved);
    assert_eq!(tasks[0]["data"]["input_ooi"], host(0).as_str());
}

/// An object the frontier first recorded from a lookup (a due schedule's object no event had
/// announced) had nothing planned but its schedule's boefje: ColdStart's pass, asked for by the
/// same tick, plans its other work as for any object new to it, instead of passing over a row
/// that already matches Octopoes.
async fn coldstart_plans_an_object_first_recorded_by_a_lookup(backend: Backend) {
    let Some(s) = Setup::new(backend, 0).await else {
        return;
    };
    s.octopoes
        .set("listed", vec![octopoes_object(&host(0), "Hostname", 2)]);
    let id = s.schedule("listed", &host(0)).await;
    assert_eq!(
        s.reschedule().await,
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        s.app.coldstart.wait_rounds(1),
    )
    .await
    .expect("the ColdStart round the tick asked for ends");
    let mut work: Vec<(String, Option<String>)> = s
        .pop_all()
        .await
        .iter()
        .map(|t| {
            (
                t["data"]["boefje"]["id"].as_str().unwrap().to_owned(),
                t["schedule_id"].as_str().map(str::to_owned),
            )
        })
        .collect();
    work.sort();
    assert_eq!(work.len(), 2, "{work:?}");
    assert_eq!(
        work[0],
        ("dns-records".to_owned(), Some(id)),
        "the schedule's fire"
    );
    assert_eq!(work[1].0, "low", "planned by ColdStart");
}

/// Who else holds an object (a fire's de-duplication siblings) is asked of Octopoes for the
/// organisations the frontier has no row of, each call out of the caller's budget (a tick's):
/// with the budget spent, the frontier's rows alone answer and Octopoes is not asked.
async fn holders_the_frontier_lacks_are_asked_of_octopoes_within_the_budget(backend: Backend) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let reference = "Hostname|internet|shared.example.nl";
    let octopoes = OctopoesState::default();
    octopoes.set("org2", vec![octopoes_object(reference, "Hostname", 2)]);
    let stub = octopoes.serve();
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let clock: kat_scheduler::clock::SharedClock = app.clock.clone();
    let lookup = kat_scheduler::frontier::lookup::ObjectLookup::new(
        app.frontier(),
        Some(
            kat_scheduler::clients::octopoes::Octopoes::new(
                &stub.url,
                std::time::Duration::from_secs(5),
            )
            .unwrap(),
        ),
        clock,
        app.broker.metrics().clone(),
    );
    let orgs = vec!["org2".to_owned()];
    let asked = || {
        stub.seen()
            .iter()
            .filter(|s| s.path == "/object-clients")
            .count()
    };
    let spent = AtomicUsize::new(0);
    let rows = lookup
        .holders(reference, &orgs, Some(&spent))
        .await
        .unwrap();
    assert!(rows.is_empty(), "the frontier has none");
    assert_eq!(asked(), 0, "no call left in the budget");
    let one = AtomicUsize::new(1);
    let rows = lookup.holders(reference, &orgs, Some(&one)).await.unwrap();
    let holders: Vec<&str> = rows.iter().map(|r| r.organisation.as_str()).collect();
    assert_eq!(holders, ["org2"]);
    assert_eq!((asked(), one.load(Ordering::Relaxed)), (1, 0));
}

crate::backend_tests!(
    objects_octopoes_is_slow_on_wait_for_the_next_tick_without_a_backoff,
    a_schedule_with_an_empty_object_fires_without_one,
    an_object_octopoes_cannot_read_holds_up_only_its_own_schedule,
    a_fire_scans_only_what_octopoes_permits_now_whatever_the_frontier_s_row_says,
    holders_the_frontier_lacks_are_asked_of_octopoes_within_the_budget,
    coldstart_plans_an_object_first_recorded_by_a_lookup,
    a_users_edit_made_while_a_tick_decides_is_not_overwritten,
    a_scan_level_too_low_in_the_frontier_is_asked_of_octopoes_before_a_schedule_is_disabled,
    a_404_that_does_not_name_the_object_disables_nothing,
    a_frontier_row_marked_gone_is_asked_again_before_a_schedule_is_disabled,
    a_due_schedule_whose_object_only_octopoes_holds_fires_and_only_octopoes_says_gone,
    octopoes_down_during_a_tick_leaves_the_schedule_waiting_and_it_fires_once_when_back,
);
