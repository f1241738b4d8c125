//! Filtered pops served from memory select what the SQL path selects, in pop order, exactly once,
//! including tasks waiting as pending outside a full heap.
//!
//! The reference is the SQL path itself: `POST /tasks` with the same filter (plus "queued or
//! pending") lists the matching waiting tasks; sorted by priority, creation time and id, that is
//! the order in which pops with the filter must hand them out.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::helpers::*;

const ORGS: [&str; 5] = ["org0", "org1", "org2", "org3", "ORG1"];
const BOEFJES: [&str; 6] = [
    "dns-records",
    "nmap",
    "ssl-certs",
    "nikto",
    "wpscan",
    "shodan",
];

fn image(boefje: &str) -> String {
    // Three images shared by the six boefjes.
    let i = BOEFJES.iter().position(|b| *b == boefje).unwrap_or(0) % 3;
    format!("ghcr.io/minvws/openkat/img{i}:latest")
}

/// Pushes `n` random boefje tasks; returns their ids.
async fn push_random(app: &TestApp, rng: &mut Rng, n: usize, serial: &mut usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        *serial += 1;
        let org = rng.pick(&ORGS);
        let boefje = rng.pick(&BOEFJES);
        let ooi = (rng.below(4) > 0).then(|| format!("Hostname|internet|h{}.example.com", *serial));
        let priority = 1 + rng.below(20) as i64;
        let mut body = boefje_push(org, boefje, ooi.as_deref(), priority);
        body["data"]["boefje"]["oci_image"] = json!(image(boefje));
        if rng.below(3) > 0 {
            body["data"]["depth"] = json!(rng.below(10));
        }
        if rng.below(2) > 0 {
            body["data"]["deep"] = json!(rng.below(2) == 1);
        }
        app.advance(chrono::Duration::milliseconds(10));
        // Without an object the same boefje and organisation is the same work: a duplicate
        // (409) or a boost (200) of a waiting task, which is fine here.
        let resp = app.push("boefje", &body).await;
        if resp.status() == reqwest::StatusCode::CREATED {
            ids.push(id_of(&resp.json::<Value>().await.unwrap()));
        }
    }
    ids
}

fn cond(column: &str, field: Option<&str>, operator: &str, value: Value) -> Value {
    let mut c = json!({"column": column, "operator": operator, "value": value});
    if let Some(f) = field {
        c["field"] = json!(f);
    }
    c
}

/// One random condition over a column or data field real filters use.
fn random_cond(rng: &mut Rng, ids: &[String], mid: &str) -> Value {
    let orgs: Vec<Value> = ORGS.iter().map(|o| json!(o)).collect();
    let boefjes: Vec<Value> = BOEFJES.iter().map(|b| json!(b)).collect();
    let some = |rng: &mut Rng, from: &[Value]| -> Value {
        let k = 1 + rng.below(3);
        Value::Array((0..k).map(|_| rng.pick(from)).collect())
    };
    match rng.below(15) {
        0 => cond(
            "organisation",
            None,
            rng.pick(&["==", "!=", "like", "ilike"]),
            rng.pick(&orgs),
        ),
        1 => cond(
            "organisation",
            None,
            rng.pick(&["in", "not_in"]),
            some(rng, &orgs),
        ),
        2 => cond(
            "data",
            Some("boefje__id"),
            rng.pick(&["==", "!=", "like"]),
            rng.pick(&boefjes),
        ),
        3 => cond(
            "data",
            Some("boefje__id"),
            rng.pick(&["in", "not_in"]),
            some(rng, &boefjes),
        ),
        4 => {
            let images: Vec<Value> = (0..3)
                .map(|i| json!(format!("ghcr.io/minvws/openkat/img{i}:latest")))
                .collect();
            cond("data", Some("boefje__oci_image"), "in", some(rng, &images))
        }
        5 => cond(
            "data",
            Some("input_ooi"),
            rng.pick(&["is_null", "is_not_null"]),
            Value::Null,
        ),
        6 => cond(
            "data",
            Some("input_ooi"),
            rng.pick(&["like", "not_like", "ilike"]),
            json!(rng.pick(&["%1%", "Hostname|%", "%.EXAMPLE.com"])),
        ),
        7 => cond(
            "data",
            Some("depth"),
            rng.pick(&[">", "<=", "==", "!="]),
            json!(rng.below(10)),
        ),
        8 => cond(
            "data",
            Some("depth"),
            rng.pick(&["in", "not_in"]),
            json!([rng.below(10), rng.below(10)]),
        ),
        9 => cond("data", Some("deep"), "==", json!(rng.below(2) == 1)),
        10 => cond(
            "priority",
            None,
            rng.pick(&["<", ">=", "!="]),
            json!(1 + rng.below(20)),
        ),
        11 => cond(
            "type",
            None,
            "==",
            json!(rng.pick(&["boefje", "normalizer"])),
        ),
        12 => cond("created_at", None, rng.pick(&[">", "<="]), json!(mid)),
        13 => cond(
            "id",
            None,
            "in",
            json!([rng.pick(ids), rng.pick(ids), rng.pick(ids)]),
        ),
        _ => cond("hash", None, "is_not_null", Value::Null),
    }
}

/// A random filter: a list (all of), or `or` / `not` over a few conditions, sometimes nested.
fn random_filter(rng: &mut Rng, ids: &[String], mid: &str) -> Value {
    let conds = |rng: &mut Rng, n: usize| -> Vec<Value> {
        (0..n).map(|_| random_cond(rng, ids, mid)).collect()
    };
    match rng.below(5) {
        0 | 1 => {
            let n = 1 + rng.below(3);
            Value::Array(conds(rng, n))
        }
        2 => json!({"or": conds(rng, 2)}),
        3 => json!({"not": conds(rng, 1)}),
        _ => {
            let first = conds(rng, 1);
            let inner = conds(rng, 2);
            json!({"and": [first[0], {"or": inner}]})
        }
    }
}

/// The waiting boefje tasks matching `filters`, in pop order, as the SQL path finds them.
async fn expected_order(app: &TestApp, filters: &Value) -> Vec<String> {
    let waiting = cond("status", None, "in", json!(["queued", "pending"]));
    let body = json!({"filters": {"and": [filters, waiting]}});
    let resp = app
        .search_tasks("scheduler_id=boefje&limit=1000", Some(&body))
        .await;
    assert!(resp.status().is_success(), "listing {body}");
    let page: Value = resp.json().await.unwrap();
    let mut rows: Vec<(i64, String, String)> = page["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["priority"].as_i64().unwrap(),
                t["created_at"].as_str().unwrap().to_owned(),
                id_of(t),
            )
        })
        .collect();
    rows.sort();
    rows.into_iter().map(|(_, _, id)| id).collect()
}

async fn filtered_pops_hand_out_what_the_sql_path_selects_in_pop_order(backend: Backend) {
    // A small heap: most of the backlog waits as pending, so pops must reach it. The order
    // compared is the heap's (priority, then age): organisations do not take turns here.
    let Some(app) = spawn_app_with(backend, |s| {
        s.queue.maxsize = 15;
        s.schedulers.boefje.fairness = Some(kat_scheduler::queue::fair::Fairness::Off);
    })
    .await
    else {
        return;
    };
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (backend as u64 + 1));
    let mut serial = 0;
    let mut ids = push_random(&app, &mut rng, 60, &mut serial).await;
    let mid = app.now().to_rfc3339();
    ids.extend(push_random(&app, &mut rng, 20, &mut serial).await);
    let mut nonempty = 0;
    for case in 0..40 {
        let filter = random_filter(&mut rng, &ids, &mid);
        let want = expected_order(&app, &filter).await;
        let body = json!({ "filters": filter });
        let mut got = Vec::new();
        loop {
            let limit = 1 + rng.below(4);
            let popped = app.pop_ok("boefje", limit, Some(&body)).await;
            assert!(popped.len() <= limit);
            if popped.is_empty() {
                break;
            }
            for t in &popped {
                assert_eq!(t["status"], "dispatched");
            }
            got.extend(popped.iter().map(id_of));
            assert!(
                got.len() <= want.len(),
                "case {case}: more than matches for {body}"
            );
        }
        assert_eq!(got, want, "case {case}: {body}");
        nonempty += usize::from(!want.is_empty());
        // Keep the backlog stocked.
        ids.extend(push_random(&app, &mut rng, 8, &mut serial).await);
    }
    assert!(
        nonempty >= 20,
        "the generated filters mostly matched something ({nonempty})"
    );
}

async fn a_worker_whose_image_only_pending_tasks_have_gets_every_one(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = 10).await else {
        return;
    };
    for i in 0..30 {
        app.push_ok(
            "boefje",
            &boefje_push("org1", "nmap", Some(&format!("h{i}")), 5),
        )
        .await;
    }
    // Less urgent than everything in the full heap: all of them wait as pending.
    let mut rare = Vec::new();
    for i in 0..5 {
        let t = app
            .push_ok(
                "boefje",
                &boefje_push("org1", "rare-scanner", Some(&format!("r{i}")), 9 - i),
            )
            .await;
        assert_eq!(t["status"], "pending");
        rare.push(id_of(&t));
    }
    let filter = json!({"filters": [{"column": "data", "field": "boefje__oci_image", "operator": "in",
        "value": ["ghcr.io/minvws/openkat/rare-scanner:latest"]}]});
    let mut got = Vec::new();
    loop {
        let popped = app.pop_ok("boefje", 1, Some(&filter)).await;
        if popped.is_empty() {
            break;
        }
        got.push(id_of(&popped[0]));
    }
    rare.reverse(); // pushed with priorities 9, 8, …, 5: popped best first
    assert_eq!(got, rare);
    let s: Value = app.get("/schedulers/boefje").await.json().await.unwrap();
    assert_eq!(
        (s["qsize"].as_u64(), s["pending"].as_u64()),
        (Some(10), Some(20))
    );
}

async fn concurrent_filtered_pops_hand_out_each_task_once_heap_and_pending_alike(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = 40).await else {
        return;
    };
    let mut all = HashSet::new();
    for i in 0..300 {
        let boefje = BOEFJES[i % 3];
        let mut body = boefje_push(
            ORGS[i % 5],
            boefje,
            Some(&format!("host{i}")),
            2 + (i % 7) as i64,
        );
        body["data"]["boefje"]["oci_image"] = json!(image(boefje));
        all.insert(id_of(&app.push_ok("boefje", &body).await));
    }
    let app = std::sync::Arc::new(app);
    let mut workers = Vec::new();
    for w in 0..8 {
        let app = app.clone();
        workers.push(tokio::spawn(async move {
            let filter = json!({"filters": [{"column": "data", "field": "boefje__oci_image",
                "operator": "in", "value": [image(BOEFJES[w % 3])]}]});
            let mut mine = Vec::new();
            loop {
                let popped = app.pop_ok("boefje", 2, Some(&filter)).await;
                if popped.is_empty() {
                    break;
                }
                mine.extend(popped.iter().map(id_of));
            }
            mine
        }));
    }
    let mut seen = HashSet::new();
    for w in workers {
        for id in w.await.unwrap() {
            assert!(seen.insert(id.clone()), "task {id} popped twice");
        }
    }
    assert_eq!(seen, all, "every task popped");
}

crate::backend_tests!(
    filtered_pops_hand_out_what_the_sql_path_selects_in_pop_order,
    a_worker_whose_image_only_pending_tasks_have_gets_every_one,
    concurrent_filtered_pops_hand_out_each_task_once_heap_and_pending_alike,
);
