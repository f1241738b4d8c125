//! A schedule is disabled for its plugin (gone from the catalogue, disabled, or refusing the
//! object: its scan level or types) only on Katalogus' answer of now. Between refreshes the rescheduler plans from the catalogue's copy,
//! and that copy is kept while Katalogus fails: it may predate the plugin's re-enabling. A
//! schedule that copy would disable is confirmed with Katalogus first, and waits while Katalogus
//! cannot answer (here: it no longer lists the organisation). And a fire of a boefje Katalogus
//! marks for de-duplication brings the same work of the organisations that share its runs.

use chrono::{DateTime, Duration, TimeZone, Utc};
use kat_scheduler::domain::SchedulerId;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;
use crate::stubs::*;

const ORG: &str = "org1";
/// An organisation whose plugins the catalogue has not fetched before the last step.
const ORG2: &str = "org2";
const OBJECT: &str = "Hostname|internet|a.example.nl";

fn midnight() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2027, 3, 1, 0, 0, 0).unwrap()
}

/// Katalogus' plugins of [`ORG`]: `dns-records` enabled or not, `other` enabled.
fn plugins(dns_records: bool) -> Vec<Value> {
    let mut dns = katalogus_boefje("dns-records", &["Hostname"], 1, false);
    dns["enabled"] = json!(dns_records);
    vec![dns, katalogus_boefje("other", &["Hostname"], 1, false)]
}

/// The app on Katalogus and Octopoes stubs: each of `orgs` with [`plugins`]`(false)` and
/// [`OBJECT`] at level 2; the catalogue's copies fresh for 60 s; the clock at midnight.
struct Setup {
    app: TestApp,
    katalogus: KatalogusState,
    k: Stub,
    octopoes: OctopoesState,
    _o: Stub,
}

impl Setup {
    async fn new(backend: Backend, orgs: &[&str]) -> Option<Setup> {
        Self::with(backend, orgs, |_| {}).await
    }

    /// [`Setup::new`], with `prepare` applied to Katalogus before it serves (and before the app's
    /// first catalogue refresh asks it).
    async fn with(
        backend: Backend,
        orgs: &[&str],
        prepare: impl FnOnce(&KatalogusState),
    ) -> Option<Setup> {
        let katalogus = KatalogusState::default();
        let octopoes = OctopoesState::default();
        for org in orgs {
            katalogus
                .plugins
                .lock()
                .unwrap()
                .insert((*org).into(), plugins(false));
            octopoes.set(org, vec![octopoes_object(OBJECT, "Hostname", 2)]);
        }
        prepare(&katalogus);
        let (k, o) = (katalogus.serve(), octopoes.serve());
        let (ku, ou) = (k.url.clone(), o.url.clone());
        let app = spawn_app_with(backend, move |s| {
            s.clients.katalogus_api = ku;
            s.clients.octopoes_api = ou;
            s.catalogue.ttl_secs = 60;
        })
        .await?;
        app.clock.set(midnight());
        Some(Setup {
            app,
            katalogus,
            k,
            octopoes,
            _o: o,
        })
    }
}

async fn schedule(app: &TestApp, org: &str, boefje: &str, due: DateTime<Utc>) -> String {
    let body = json!({"scheduler_id": "boefje", "organisation": org,
        "deadline_at": due.to_rfc3339(),
        "data": {"boefje": {"id": boefje}, "input_ooi": OBJECT, "organization": org}});
    let resp = app.post("/schedules", Some(&body)).await;
    assert_eq!(resp.status(), StatusCode::CREATED);
    let s: Value = resp.json().await.unwrap();
    s["id"].as_str().unwrap().to_owned()
}

async fn get_schedule(app: &TestApp, id: &str) -> Value {
    app.get(&format!("/schedules/{id}"))
        .await
        .json()
        .await
        .unwrap()
}

async fn reschedule(app: &TestApp) -> String {
    let report = app.tick(SchedulerId::Boefje).await;
    report.entries["reschedule"].summary.clone()
}

/// The schedule ids of the boefje tasks popped.
async fn popped_schedules(app: &TestApp) -> Vec<String> {
    app.pop_ok("boefje", 100, None)
        .await
        .iter()
        .map(|t| t["schedule_id"].as_str().unwrap().to_owned())
        .collect()
}

async fn a_plugin_disabled_in_a_stale_copy_disables_nothing_until_katalogus_confirms(
    backend: Backend,
) {
    stale_copy_disables_nothing_until_katalogus_confirms(
        backend,
        plugins(false),
        plugins(true),
        "plugin dns-records is disabled",
    )
    .await;
}

/// The plugin's scan level in a stale copy is as old as its enabled flag: a copy that says the
/// plugin needs more than the object has disables nothing until Katalogus confirms it.
async fn a_scan_level_in_a_stale_copy_disables_nothing_until_katalogus_confirms(backend: Backend) {
    let at_level = |level: i64| {
        let mut p = plugins(true);
        p[0]["scan_level"] = json!(level);
        p
    };
    stale_copy_disables_nothing_until_katalogus_confirms(
        backend,
        at_level(3),
        at_level(1),
        "needs scan level Some(3)",
    )
    .await;
}

/// The catalogue's copy is taken with `refusing` (plugins under which the `dns-records`
/// schedule would be disabled, for `reason`); Katalogus then answers `permitting`, but first
/// not at all for a while: the copy, stale, disables nothing, and Katalogus' answer decides.
async fn stale_copy_disables_nothing_until_katalogus_confirms(
    backend: Backend,
    refusing: Vec<Value>,
    permitting: Vec<Value>,
    reason: &str,
) {
    // Every stub bound (not `..`): a stub dropped stops answering.
    let Some(Setup {
        app,
        katalogus,
        k: _k,
        octopoes,
        _o,
    }) = Setup::new(backend, &[ORG]).await
    else {
        return;
    };
    katalogus
        .plugins
        .lock()
        .unwrap()
        .insert(ORG.into(), refusing.clone());

    // The catalogue's copy is taken by the tick that fires `other`.
    let other = schedule(&app, ORG, "other", midnight() - Duration::minutes(1)).await;
    let dns = schedule(&app, ORG, "dns-records", midnight() + Duration::minutes(2)).await;
    assert_eq!(
        reschedule(&app).await,
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    assert_eq!(popped_schedules(&app).await, [other]);

    // Katalogus now permits the schedule, but fails for the organisation: the copy, stale now,
    // still refuses.
    katalogus.failing.lock().unwrap().insert(ORG.into());
    app.clock.set(midnight() + Duration::minutes(3));
    assert_eq!(
        reschedule(&app).await,
        "fired 0, skipped 0, disabled 0, waiting 1"
    );
    let s = get_schedule(&app, &dns).await;
    assert_eq!(
        (s["enabled"].clone(), s["disabled_reason"].clone()),
        (json!(true), Value::Null),
        "not disabled from the stale copy: {s}"
    );

    // Katalogus answers again: the schedule fires on its answer, though the copy is as old.
    katalogus.failing.lock().unwrap().remove(ORG);
    katalogus
        .plugins
        .lock()
        .unwrap()
        .insert(ORG.into(), permitting);
    assert_eq!(
        reschedule(&app).await,
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    assert_eq!(popped_schedules(&app).await, [dns]);

    // Katalogus' own answer still disables: an organisation whose list is fetched fresh,
    // refusing.
    katalogus
        .plugins
        .lock()
        .unwrap()
        .insert(ORG2.into(), refusing);
    octopoes.set(ORG2, vec![octopoes_object(OBJECT, "Hostname", 2)]);
    let off = schedule(&app, ORG2, "dns-records", midnight()).await;
    assert_eq!(
        reschedule(&app).await,
        "fired 0, skipped 0, disabled 1, waiting 0"
    );
    let s = get_schedule(&app, &off).await;
    assert_eq!(s["enabled"], false);
    assert!(
        s["disabled_reason"].as_str().unwrap().contains(reason),
        "{s}"
    );
}

/// A Katalogus that does not answer holds a tick for one wait, not one per organisation: once
/// one organisation's confirmation ran out of time, the page's others wait without asking.
async fn a_hung_katalogus_is_asked_to_confirm_once_a_page(backend: Backend) {
    let Some(Setup {
        app,
        katalogus,
        k,
        octopoes: _,
        _o,
    }) = Setup::new(backend, &[ORG, ORG2]).await
    else {
        return;
    };
    let mut dns = Vec::new();
    for org in [ORG, ORG2] {
        schedule(&app, org, "other", midnight() - Duration::minutes(1)).await;
        dns.push(schedule(&app, org, "dns-records", midnight() + Duration::minutes(2)).await);
    }
    assert_eq!(
        reschedule(&app).await,
        "fired 2, skipped 0, disabled 0, waiting 0"
    );

    // Katalogus hangs (each answer comes after the catalogue's wait); the copies are stale.
    for org in [ORG, ORG2] {
        katalogus
            .slow
            .lock()
            .unwrap()
            .insert(org.into(), std::time::Duration::from_secs(5));
    }
    k.clear();
    app.clock.set(midnight() + Duration::minutes(3));
    assert_eq!(
        reschedule(&app).await,
        "fired 0, skipped 0, disabled 0, waiting 2"
    );
    let asked = k
        .seen()
        .iter()
        .filter(|s| s.path.ends_with("/plugins"))
        .count();
    assert_eq!(asked, 1, "the second organisation is not asked");
    for id in &dns {
        assert_eq!(get_schedule(&app, id).await["enabled"], true);
    }
}

/// The organisations of a page the catalogue holds no copy of are asked for together, so a slow
/// Katalogus costs the page one wait, not one per organisation. This Katalogus does not list
/// them (the refresh never fetches them ahead) and answers their plugin listings only once all
/// three are in flight: asked one after another, the first two would run out of the
/// catalogue's wait and their schedules would wait a tick.
async fn organisations_never_fetched_are_asked_for_together(backend: Backend) {
    let orgs = ["org-a", "org-b", "org-c"];
    // `_o` bound: the Octopoes stub stops when dropped.
    let Some(Setup { app, k, _o, .. }) = Setup::with(backend, &orgs, |katalogus| {
        for org in orgs {
            katalogus.unlisted.lock().unwrap().insert(org.into());
        }
        *katalogus.together.lock().unwrap() =
            Some(std::sync::Arc::new(tokio::sync::Barrier::new(orgs.len())));
    })
    .await
    else {
        return;
    };
    app.clock.set(midnight());
    let mut ids = Vec::new();
    for org in orgs {
        ids.push(schedule(&app, org, "other", midnight() - Duration::minutes(1)).await);
    }
    assert_eq!(
        reschedule(&app).await,
        "fired 3, skipped 0, disabled 0, waiting 0"
    );
    // One task per schedule (they share one host, so a pop would hand out one at a time).
    let listed: Value = app
        .get("/tasks?scheduler_id=boefje&limit=10")
        .await
        .json()
        .await
        .unwrap();
    let mut fired: Vec<String> = listed["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["schedule_id"].as_str().unwrap().to_owned())
        .collect();
    fired.sort();
    ids.sort();
    assert_eq!(fired, ids);
    let asked = k
        .seen()
        .iter()
        .filter(|s| s.path.ends_with("/plugins"))
        .count();
    assert_eq!(asked, 3, "each organisation asked once");
}

/// Three organisations share `dns-records`' runs (Katalogus' `/v1/configs` duplicates) and hold
/// the same object, each with its schedule. mula asks `is_boefje_in_other_orgs` on every push,
/// a schedule's fire included: the first fire brings the other two organisations' work along in
/// one group, and their own schedules then find that work run within the grace period. The
/// target is scanned once a cycle, not once per organisation.
async fn a_fire_of_a_shared_boefje_runs_once_for_every_organisation_that_shares_it(
    backend: Backend,
) {
    let orgs = ["org1", "org2", "org3"];
    let Some(s) = Setup::with(backend, &orgs, |k| {
        for org in orgs {
            k.plugins.lock().unwrap().insert(
                org.into(),
                vec![katalogus_boefje("dns-records", &["Hostname"], 1, true)],
            );
            let others = orgs.iter().filter(|o| **o != org).map(|o| (*o).to_owned());
            k.duplicates
                .lock()
                .unwrap()
                .insert((org.into(), "dns-records".into()), others.collect());
        }
    })
    .await
    else {
        return;
    };
    let app = &s.app;
    let first = schedule(
        app,
        "org1",
        "dns-records",
        midnight() - Duration::minutes(1),
    )
    .await;
    for org in ["org2", "org3"] {
        schedule(app, org, "dns-records", midnight() + Duration::minutes(2)).await;
    }
    assert_eq!(
        reschedule(app).await,
        "fired 1, skipped 0, disabled 0, waiting 0"
    );
    // The tick also woke ColdStart (Octopoes is configured): its first pass plans the same
    // work from the objects, and is let end before the runners take the work.
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        app.coldstart.wait_rounds(1),
    )
    .await
    .unwrap();
    let group = app.pop_ok("boefje", 10, None).await;
    let mut popped: Vec<&str> = group
        .iter()
        .map(|t| t["organisation"].as_str().unwrap())
        .collect();
    popped.sort_unstable();
    assert_eq!(popped, orgs, "one group");
    let leader = group
        .iter()
        .find(|t| t["schedule_id"] == first.as_str())
        .unwrap();
    assert!(
        group
            .iter()
            .all(|t| t["data"]["deduplication_key"] == leader["id"]),
        "{group:?}"
    );
    for t in &group {
        let id = id_of(t);
        app.patch_task(&id, &json!({"status": "running"})).await;
        app.patch_task(&id, &json!({"status": "completed"})).await;
    }
    app.clock.set(midnight() + Duration::minutes(3));
    assert_eq!(
        reschedule(app).await,
        "fired 0, skipped 2, disabled 0, waiting 0",
        "their work ran with the first"
    );
    let left = app.pop_ok("boefje", 10, None).await;
    assert!(left.is_empty(), "{left:?}");
}

crate::backend_tests!(
    a_fire_of_a_shared_boefje_runs_once_for_every_organisation_that_shares_it,
    organisations_never_fetched_are_asked_for_together,
    a_plugin_disabled_in_a_stale_copy_disables_nothing_until_katalogus_confirms,
    a_hung_katalogus_is_asked_to_confirm_once_a_page,
    a_scan_level_in_a_stale_copy_disables_nothing_until_katalogus_confirms,
);
