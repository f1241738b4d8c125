//! Fair share across organisations (docs/SCHEDULING.md): one organisation's flood does not hold
//! the others' automatic work back, user scans still come first, an organisation's own order
//! stands, pops are work-conserving, and the turns are rebuilt after a restart.

use futures_util::future::join_all;
use serde_json::{Value, json};

use crate::helpers::*;
use kat_scheduler::queue::fair::Fairness;

/// Pushes `n` boefje tasks of `org` at `priority`, 32 at a time.
async fn flood(app: &TestApp, org: &str, n: usize, priority: i64, boefje: &str) {
    let bodies: Vec<Value> = (0..n)
        .map(|i| {
            boefje_push(
                org,
                boefje,
                Some(&format!("Hostname|internet|h{i}.{org}.example")),
                priority,
            )
        })
        .collect();
    for chunk in bodies.chunks(32) {
        join_all(chunk.iter().map(|b| app.push_ok("boefje", b))).await;
    }
}

/// The organisations of `n` boefje pops (one task each) with `filter`.
async fn served(app: &TestApp, n: usize, filter: Option<&Value>) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let got = app.pop_ok("boefje", 1, filter).await;
        let Some(task) = got.first() else { break };
        out.push(task["organisation"].as_str().unwrap_or_default().to_owned());
    }
    out
}

fn quiet_share(orgs: &[String]) -> f64 {
    orgs.iter().filter(|o| o.starts_with("quiet")).count() as f64 / orgs.len().max(1) as f64
}

/// One organisation brings 900 automatic tasks, more urgent and older than anything else; ten
/// quiet ones then bring 10 each.
async fn flood_then_quiet(app: &TestApp) {
    flood(app, "big", 900, 50, "nmap").await;
    for q in 0..10 {
        flood(app, &format!("quiet{q}"), 10, 90, "nmap").await;
    }
}

async fn a_flood_of_one_organisation_does_not_hold_ten_quiet_ones_back(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    flood_then_quiet(&app).await;
    let first = served(&app, 110, None).await;
    assert_eq!(first.len(), 110);
    let share = quiet_share(&first);
    assert!(
        share >= 0.7,
        "the quiet organisations had {:.0} % of the first 110 pops",
        share * 100.0
    );
    // Work-conserving: once the quiet ones are served, the flood flows on, every task of it.
    let rest = served(&app, 2_000, None).await;
    assert_eq!(rest.len(), 1_000 - 110, "nothing is left behind");
    assert!(rest.iter().rev().take(700).all(|o| o == "big"));
}

async fn with_fairness_off_the_heap_order_alone_decides(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| {
        s.schedulers.boefje.fairness = Some(Fairness::Off);
    })
    .await
    else {
        return;
    };
    flood_then_quiet(&app).await;
    let first = served(&app, 110, None).await;
    assert_eq!(quiet_share(&first), 0.0, "priority order: the flood first");
}

async fn user_scans_come_first_and_an_organisation_keeps_its_own_order(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    flood(&app, "big", 50, 50, "nmap").await;
    let late = app
        .push_ok(
            "boefje",
            &boefje_push("quiet0", "nmap", Some("Hostname|internet|late.example"), 80),
        )
        .await;
    let soon = app
        .push_ok(
            "boefje",
            &boefje_push("quiet0", "nmap", Some("Hostname|internet|soon.example"), 60),
        )
        .await;
    let user = app
        .push_ok(
            "boefje",
            &boefje_push("quiet1", "nmap", Some("Hostname|internet|user.example"), 1),
        )
        .await;
    let popped: Vec<String> = app.pop_ids("boefje", 4).await;
    assert_eq!(popped[0], id_of(&user), "the user's scan first");
    let pos = |t: &Value| popped.iter().position(|x| *x == id_of(t));
    assert!(
        pos(&soon).is_some() && pos(&late).is_none_or(|l| pos(&soon) < Some(l)),
        "quiet0's more urgent task before its other: {popped:?}"
    );
}

async fn a_runners_filtered_pop_takes_turns_among_the_organisations_it_sees(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    flood(&app, "big", 300, 50, "nmap").await;
    flood(&app, "big", 100, 40, "dns").await;
    for q in 0..4 {
        flood(&app, &format!("quiet{q}"), 10, 90, "nmap").await;
    }
    // The boefje runtime with BOEFJES_IMAGES set.
    let nmap = json!({"filters": [{"column": "data", "field": "boefje__oci_image",
        "operator": "in", "value": ["ghcr.io/minvws/openkat/nmap:latest"]}]});
    let first = served(&app, 40, Some(&nmap)).await;
    assert!(
        quiet_share(&first) >= 0.7,
        "quiet share {:.2} of {first:?}",
        quiet_share(&first)
    );
    // A runner of the big organisation alone is served at once, whoever's turn it is.
    let big_only = json!({"filters": [{"column": "organisation", "operator": "in",
        "value": ["big"]}]});
    let got = served(&app, 5, Some(&big_only)).await;
    assert_eq!(got, vec!["big"; 5]);
}

async fn the_turns_are_rebuilt_after_a_restart(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    flood_then_quiet(&app).await;
    let app = app.restart().await;
    let first = served(&app, 110, None).await;
    assert!(
        quiet_share(&first) >= 0.7,
        "after a restart the quiet organisations had {:.0} %",
        quiet_share(&first) * 100.0
    );
}

crate::backend_tests!(
    a_flood_of_one_organisation_does_not_hold_ten_quiet_ones_back,
    with_fairness_off_the_heap_order_alone_decides,
    user_scans_come_first_and_an_organisation_keeps_its_own_order,
    a_runners_filtered_pop_takes_turns_among_the_organisations_it_sees,
    the_turns_are_rebuilt_after_a_restart,
);
