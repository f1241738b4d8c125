//! Rate and concurrency limits per key (docs/SCHEDULING.md): a held task is skipped, never
//! dropped, and other work flows; a rate is a sliding window; a concurrency slot is freed when
//! its task leaves flight; both are counted again from the table after a restart, and held by
//! the scheduler's owner when several instances serve it.

use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};

use crate::child::ChildApp;
use crate::helpers::*;

/// Pushes `n` boefje tasks of boefje `boefje`, each on an object of its own.
async fn push_n(app: &TestApp, boefje: &str, n: usize) {
    for i in 0..n {
        let ooi = format!("Hostname|internet|{boefje}{i}.example");
        app.push_ok("boefje", &boefje_push("org1", boefje, Some(&ooi), 5))
            .await;
    }
}

/// Pops one task at a time until an empty answer; answers the boefje ids popped.
async fn drain(app: &TestApp) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let got = app.pop_ok("boefje", 1, None).await;
        let Some(task) = got.first() else { break };
        out.push(task["data"]["boefje"]["id"].as_str().unwrap().to_owned());
    }
    out
}

fn count(ids: &[String], of: &str) -> usize {
    ids.iter().filter(|x| *x == of).count()
}

async fn a_rate_limited_plugin_is_held_to_its_window_while_other_work_flows(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| {
        s.schedulers.boefje.rate_limits = Some("boefje.id=limited:5/2".into());
    })
    .await
    else {
        return;
    };
    push_n(&app, "limited", 50).await;
    push_n(&app, "free", 50).await;
    // 1.5 s of pops: every free task and exactly five limited ones.
    let mut first = Vec::new();
    for _ in 0..3 {
        first.extend(drain(&app).await);
        app.advance(Duration::milliseconds(500));
    }
    assert_eq!(count(&first, "free"), 50, "other work flows");
    assert_eq!(count(&first, "limited"), 5, "five in the window");
    // 2 s after the five: at most five more, and then nothing until the window moves on.
    app.advance(Duration::milliseconds(501));
    let next = drain(&app).await;
    assert_eq!(next, vec!["limited"; 5]);
    app.advance(Duration::milliseconds(1_900));
    assert!(
        drain(&app).await.is_empty(),
        "still within the second window"
    );
    // A restart (or a takeover) counts the window again from the table: still nothing.
    let app = app.restart().await;
    assert!(
        drain(&app).await.is_empty(),
        "the window survives a restart"
    );
    // Held, never dropped: every limited task is still there, queued.
    let page: Value = app
        .get("/tasks?scheduler_id=boefje&status=queued&limit=100")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["count"], 40);
}

async fn a_concurrency_slot_is_freed_when_its_task_finishes_and_survives_a_restart(
    backend: Backend,
) {
    let Some(app) = spawn_app_with(backend, |s| {
        s.schedulers.boefje.concurrency = Some("input_ooi=*:1".into());
    })
    .await
    else {
        return;
    };
    let host = "Hostname|internet|one.example";
    for boefje in ["dns", "whois", "nmap"] {
        app.push_ok("boefje", &boefje_push("org1", boefje, Some(host), 5))
            .await;
    }
    app.push_ok(
        "boefje",
        &boefje_push("org1", "dns", Some("Hostname|internet|two.example"), 9),
    )
    .await;
    let got = app.pop_ids("boefje", 10).await;
    assert_eq!(got.len(), 2, "one per object: {got:?}");
    let first = &got[0];
    let resp = app.patch_task(first, &json!({"status": "running"})).await;
    assert_eq!(resp.status(), 200);
    assert!(app.pop_ids("boefje", 10).await.is_empty(), "held");
    // A restart counts the running task again from the table.
    let app = app.restart().await;
    assert!(
        app.pop_ids("boefje", 10).await.is_empty(),
        "held after a restart"
    );
    let resp = app.patch_task(first, &json!({"status": "completed"})).await;
    assert_eq!(resp.status(), 200);
    let next = app.pop_ids("boefje", 10).await;
    assert_eq!(
        next.len(),
        1,
        "the slot is free: the next task on the object"
    );
    // A task that fails frees its slot too.
    let resp = app.patch_task(&next[0], &json!({"status": "failed"})).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(app.pop_ids("boefje", 10).await.len(), 1);
}

async fn a_user_scan_waits_for_a_limit_like_any_other(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| {
        s.schedulers.boefje.concurrency = Some("boefje.id=nmap:1".into());
    })
    .await
    else {
        return;
    };
    let a = app
        .push_ok(
            "boefje",
            &boefje_push("org1", "nmap", Some("Hostname|internet|a.example"), 5),
        )
        .await;
    assert_eq!(app.pop_ids("boefje", 1).await, vec![id_of(&a)]);
    app.push_ok(
        "boefje",
        &boefje_push("org1", "nmap", Some("Hostname|internet|b.example"), 1),
    )
    .await;
    let other = app
        .push_ok(
            "boefje",
            &boefje_push("org1", "dns", Some("Hostname|internet|b.example"), 50),
        )
        .await;
    // The limit protects a target, whoever asked: the user's nmap waits, other work goes.
    assert_eq!(app.pop_ids("boefje", 1).await, vec![id_of(&other)]);
    assert!(app.pop_ids("boefje", 1).await.is_empty());
}

#[test]
fn bad_rules_stop_the_service_with_the_variable_named() {
    for (var, value, says) in [
        (
            "SCHEDULER_REPORT_RATE_LIMITS",
            "colour=red:1/60",
            "unknown key `colour`",
        ),
        (
            "SCHEDULER_BOEFJE_CONCURRENCY",
            "input_ooi=*:1/60",
            "a concurrency has no /S",
        ),
        ("SCHEDULER_BOEFJE_FAIRNESS_WEIGHTS", "big=0", "from 1 to"),
    ] {
        let env = |name: &str| (name == var).then(|| value.to_owned());
        let err = kat_scheduler::config::Settings::load_with(None, &env).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(var) && text.contains(says), "{var}: {text}");
    }
}

/// A task whose dispatch lease ended freed its slot and waits again; its first holder's late
/// `running` (the holder did start it) puts it back in flight, where it holds the slot again:
/// the object's next task waits for it, as for any running task.
async fn a_task_started_late_by_its_first_holder_holds_its_slot_again(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| {
        s.schedulers.boefje.concurrency = Some("input_ooi=*:1".into());
        s.queue.dispatch_timeout_secs = 60;
    })
    .await
    else {
        return;
    };
    let host = "Hostname|internet|one.example";
    let first = app
        .push_ok("boefje", &boefje_push("org1", "dns", Some(host), 5))
        .await;
    let id = id_of(&first);
    assert_eq!(app.pop_ids("boefje", 1).await, vec![id.clone()]);
    app.advance(chrono::Duration::seconds(61));
    assert_eq!(app.sweep().await.requeued.len(), 1);
    let resp = app.patch_task(&id, &json!({"status": "running"})).await;
    assert_eq!(resp.status(), 200);
    app.push_ok("boefje", &boefje_push("org1", "whois", Some(host), 5))
        .await;
    assert!(
        app.pop_ids("boefje", 10).await.is_empty(),
        "the object's slot is the late starter's"
    );
    let resp = app.patch_task(&id, &json!({"status": "completed"})).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(app.pop_ids("boefje", 10).await.len(), 1, "the slot is free");
}

crate::backend_tests!(
    a_task_started_late_by_its_first_holder_holds_its_slot_again,
    a_rate_limited_plugin_is_held_to_its_window_while_other_work_flows,
    a_concurrency_slot_is_freed_when_its_task_finishes_and_survives_a_restart,
    a_user_scan_waits_for_a_limit_like_any_other,
    explain_says_why_a_task_waits,
);

/// Two instances on one PostgreSQL database, pops sent to both: the scheduler's owner holds the
/// rate for both, never more than N dispatched in any span (by the tasks' own dispatch times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_never_dispatch_more_than_the_rate_in_total() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let env = [
        ("SCHEDULER_LEASE_MS", "1000"),
        ("SCHEDULER_BOEFJE_RATE_LIMITS", "boefje.id=limited:4/3"),
    ];
    let uri = db.uri.clone();
    let a = tokio::task::spawn_blocking(move || ChildApp::start(&uri, &env))
        .await
        .unwrap();
    a.wait_owning_all().await;
    let uri = db.uri.clone();
    let b = tokio::task::spawn_blocking(move || ChildApp::start(&uri, &env))
        .await
        .unwrap();
    let c = reqwest::Client::builder()
        .timeout(StdDuration::from_secs(20))
        .build()
        .unwrap();
    for i in 0..30 {
        let ooi = format!("Hostname|internet|h{i}.example");
        let resp = c
            .post(format!("{}/schedulers/boefje/push", a.address))
            .json(&boefje_push("org1", "limited", Some(&ooi), 5))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
    }
    let mut dispatched: Vec<DateTime<Utc>> = Vec::new();
    let started = std::time::Instant::now();
    // Four seconds of pops, alternating between the instances.
    while started.elapsed() < StdDuration::from_secs(4) {
        for at in [&a.address, &b.address] {
            let body: Value = c
                .post(format!("{at}/schedulers/boefje/pop?limit=1"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            for t in body["results"].as_array().unwrap() {
                let at: DateTime<Utc> = t["modified_at"].as_str().unwrap().parse().unwrap();
                dispatched.push(at);
            }
        }
        tokio::time::sleep(StdDuration::from_millis(25)).await; // the pace of polling runners
    }
    dispatched.sort();
    assert!(
        dispatched.len() >= 4,
        "the first window's four: {dispatched:?}"
    );
    for (i, start) in dispatched.iter().enumerate() {
        let in_span = dispatched[i..]
            .iter()
            .take_while(|t| **t < *start + Duration::seconds(3))
            .count();
        assert!(in_span <= 4, "{in_span} dispatched within 3 s of {start}");
    }
}

/// `GET /tasks/{id}/explain` of a waiting task: its place, its organisation's turn, its place
/// among what a recent runner's filter sees, and the limit holding it.
async fn explain_says_why_a_task_waits(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| {
        s.schedulers.boefje.concurrency = Some("boefje.id=nmap:1".into());
        s.queue.maxsize = 4;
    })
    .await
    else {
        return;
    };
    let push = |org: &str, boefje: &str, host: &str, priority: i64| {
        boefje_push(
            org,
            boefje,
            Some(&format!("Hostname|internet|{host}")),
            priority,
        )
    };
    let running = app
        .push_ok("boefje", &push("a", "nmap", "r.example", 2))
        .await;
    assert_eq!(app.pop_ids("boefje", 1).await, vec![id_of(&running)]);
    let a1 = app
        .push_ok("boefje", &push("a", "dns", "a1.example", 10))
        .await;
    let a2 = app
        .push_ok("boefje", &push("a", "dns", "a2.example", 20))
        .await;
    let b1 = app
        .push_ok("boefje", &push("b", "nmap", "b1.example", 30))
        .await;
    let b2 = app
        .push_ok("boefje", &push("b", "dns", "b2.example", 40))
        .await;
    let beyond = app
        .push_ok("boefje", &push("b", "dns", "b3.example", 90))
        .await;
    let explain = |t: &Value| {
        let id = id_of(t);
        let app = &app;
        async move {
            let resp = app.get(&format!("/tasks/{id}/explain")).await;
            assert_eq!(resp.status(), 200);
            resp.json::<Value>().await.unwrap()
        }
    };
    // Beyond the heap.
    let e = explain(&beyond).await;
    assert_eq!(e["wait"]["status"], "pending", "{e}");
    assert!(
        e["wait"]["reasons"][0]
            .as_str()
            .unwrap()
            .contains("maxsize 4")
    );
    // A runner of the dns image has popped lately (and found what it could).
    let dns = json!({"filters": [{"column": "data", "field": "boefje__oci_image",
        "operator": "in", "value": ["ghcr.io/minvws/openkat/dns:latest"]}]});
    let none = json!({"filters": [{"column": "data", "field": "boefje__oci_image",
        "operator": "in", "value": ["ghcr.io/minvws/openkat/dns:latest"]},
        {"column": "organisation", "value": "nobody"}]});
    assert!(app.pop_ok("boefje", 1, Some(&none)).await.is_empty());
    // The nmap pop was a's: b's turn now, and b's dns task is what the dns runner gets.
    let got = app.pop_ok("boefje", 1, Some(&dns)).await;
    assert_eq!(got.iter().map(id_of).collect::<Vec<_>>(), vec![id_of(&b2)]);
    // b's nmap task: held by the running nmap task, and a goes first in the turns.
    let e = explain(&b1).await;
    let wait = &e["wait"];
    assert_eq!(wait["status"], "queued", "{e}");
    assert_eq!(wait["queued"], 4, "the pending task moved in as b2 left");
    assert_eq!(wait["rank"], 3);
    assert_eq!(wait["organisations_before"], 1);
    let held = wait["held"][0].as_str().unwrap();
    assert!(
        held.contains(&id_of(&running)) && held.contains("boefje.id=nmap:1"),
        "{held}"
    );
    assert_eq!(e["priority"], 30, "the score's terms are still there: {e}");
    // a's second task: a is next, a1 before it, and the dns runner sees it second.
    let e = explain(&a2).await;
    assert_eq!(e["wait"]["organisations_before"], 0, "{e}");
    assert_eq!(e["wait"]["rank_in_organisation"], 2);
    let filters = e["wait"]["filters"].as_array().unwrap();
    assert_eq!(filters.len(), 1, "only the filters it matches: {e}");
    assert_eq!(filters[0]["filter"], dns);
    assert_eq!(filters[0]["rank"], 2);
    assert!(e["wait"]["held"].as_array().unwrap().is_empty());
    assert_eq!(explain(&a1).await["wait"]["rank"], 1);
    // A task in flight has no wait.
    let e = explain(&running).await;
    assert!(e.get("wait").is_none(), "{e}");
}
