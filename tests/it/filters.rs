//! The filter language over every column and operator real clients use (reference §2.3). Each
//! case's expected set is computed by a predicate over the seeded fixture, not written down.

use chrono::Duration;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;

/// What the test knows of each seeded task.
#[derive(Debug, Clone)]
struct Fx {
    id: String,
    scheduler: &'static str,
    org: String,
    priority: i64,
    status: &'static str,
    hash: String,
    created_at: String,
    boefje: Option<&'static str>,
    normalizer: Option<&'static str>,
    recipe: Option<&'static str>,
    ooi: Option<&'static str>,
    depth: Option<i64>,
    deep: Option<bool>,
}

fn image(boefje: &str) -> String {
    format!("ghcr.io/minvws/openkat/{boefje}:latest")
}

async fn seed(app: &TestApp) -> Vec<Fx> {
    let mut fx = Vec::new();
    // (organisation, boefje, input_ooi, priority, data.depth, data.deep)
    type Row = (
        &'static str,
        &'static str,
        Option<&'static str>,
        i64,
        i64,
        bool,
    );
    let boefjes: [Row; 6] = [
        (
            "org1",
            "dns-records",
            Some("Hostname|internet|a.nl"),
            1,
            3,
            true,
        ),
        (
            "org1",
            "nmap",
            Some("IPAddressV4|internet|10.0.0.1"),
            20,
            7,
            false,
        ),
        (
            "org2",
            "dns-records",
            Some("Hostname|internet|B.nl"),
            5,
            1,
            false,
        ),
        ("org2", "nmap", None, 40, 12, true),
        (
            "org3",
            "ssl-certs",
            Some("Hostname|internet|c.nl"),
            8,
            5,
            false,
        ),
        ("ORG1", "dns-records", None, 3, 9, true),
    ];
    for (org, boefje, ooi, priority, depth, deep) in boefjes {
        app.advance(Duration::seconds(10));
        let mut body = boefje_push(org, boefje, ooi, priority);
        body["data"]["depth"] = json!(depth);
        body["data"]["deep"] = json!(deep);
        let t = app.push_ok("boefje", &body).await;
        fx.push(Fx {
            id: id_of(&t),
            scheduler: "boefje",
            org: org.into(),
            priority,
            status: "queued",
            hash: t["hash"].as_str().unwrap().into(),
            created_at: t["created_at"].as_str().unwrap().into(),
            boefje: Some(boefje),
            normalizer: None,
            recipe: None,
            ooi,
            depth: Some(depth),
            deep: Some(deep),
        });
    }
    for (org, normalizer, priority) in [
        ("org1", "kat_dns_normalize", 4),
        ("org2", "kat_nmap_normalize", 30),
    ] {
        app.advance(Duration::seconds(10));
        let t = app
            .push_ok("normalizer", &normalizer_push(org, normalizer, priority))
            .await;
        fx.push(Fx {
            id: id_of(&t),
            scheduler: "normalizer",
            org: org.into(),
            priority,
            status: "queued",
            hash: t["hash"].as_str().unwrap().into(),
            created_at: t["created_at"].as_str().unwrap().into(),
            boefje: None,
            normalizer: Some(normalizer),
            recipe: None,
            ooi: None,
            depth: None,
            deep: None,
        });
    }
    for (org, recipe, priority) in [("org1", "recipe-a", 2), ("org3", "recipe-b", 60)] {
        app.advance(Duration::seconds(10));
        let t = app
            .push_ok("report", &report_push(org, recipe, priority))
            .await;
        fx.push(Fx {
            id: id_of(&t),
            scheduler: "report",
            org: org.into(),
            priority,
            status: "queued",
            hash: t["hash"].as_str().unwrap().into(),
            created_at: t["created_at"].as_str().unwrap().into(),
            boefje: None,
            normalizer: None,
            recipe: Some(recipe),
            ooi: None,
            depth: None,
            deep: None,
        });
    }
    // Dispatch the best boefje and the best report task so statuses differ.
    for scheduler in ["boefje", "report"] {
        let popped = app.pop_ok(scheduler, 1, None).await;
        let id = id_of(&popped[0]);
        fx.iter_mut().find(|f| f.id == id).unwrap().status = "dispatched";
    }
    fx
}

type Pred = Box<dyn Fn(&Fx) -> bool>;

fn cond(column: &str, field: Option<&str>, operator: &str, value: Value) -> Value {
    let mut c = json!({"column": column, "operator": operator, "value": value});
    if let Some(f) = field {
        c["field"] = json!(f);
    }
    c
}

fn cases(fx: &[Fx]) -> Vec<(Value, Pred)> {
    let mid = fx[4].created_at.clone();
    let mid_for_pred = mid.clone();
    let a_hash = fx[2].hash.clone();
    let a_hash_pred = a_hash.clone();
    let img_dns = image("dns-records");
    let img_ssl = image("ssl-certs");
    let list = |items: Vec<Value>| json!({"filters": items});
    let mut out: Vec<(Value, Pred)> = vec![
        // text columns: every comparison operator and its alias
        (
            list(vec![cond("organisation", None, "==", json!("org1"))]),
            Box::new(|f| f.org == "org1"),
        ),
        (
            list(vec![cond("organisation", None, "eq", json!("org2"))]),
            Box::new(|f| f.org == "org2"),
        ),
        (
            list(vec![cond("organisation", None, "!=", json!("org1"))]),
            Box::new(|f| f.org != "org1"),
        ),
        (
            list(vec![cond("organisation", None, "ne", json!("org2"))]),
            Box::new(|f| f.org != "org2"),
        ),
        (
            list(vec![cond(
                "organisation",
                None,
                "in",
                json!(["org1", "org3"]),
            )]),
            Box::new(|f| f.org == "org1" || f.org == "org3"),
        ),
        (
            list(vec![cond("organisation", None, "not_in", json!(["org1"]))]),
            Box::new(|f| f.org != "org1"),
        ),
        (
            list(vec![cond("organisation", None, "like", json!("org%"))]),
            Box::new(|f| f.org.starts_with("org")),
        ),
        (
            list(vec![cond("organisation", None, "ilike", json!("org1"))]),
            Box::new(|f| f.org.eq_ignore_ascii_case("org1")),
        ),
        (
            list(vec![cond("scheduler_id", None, "eq", json!("report"))]),
            Box::new(|f| f.scheduler == "report"),
        ),
        (
            list(vec![cond("type", None, "==", json!("normalizer"))]),
            Box::new(|f| f.scheduler == "normalizer"),
        ),
        (
            list(vec![cond("status", None, "==", json!("dispatched"))]),
            Box::new(|f| f.status == "dispatched"),
        ),
        (
            list(vec![cond("status", None, "in", json!(["QUEUED"]))]),
            Box::new(|f| f.status == "queued"),
        ),
        (
            list(vec![cond("hash", None, "==", json!(a_hash))]),
            Box::new(move |f| f.hash == a_hash_pred),
        ),
        (
            list(vec![cond("hash", None, "is_not_null", Value::Null)]),
            Box::new(|_| true),
        ),
        (
            list(vec![cond("hash", None, "is_null", Value::Null)]),
            Box::new(|_| false),
        ),
        // integer column
        (
            list(vec![cond("priority", None, "<", json!(5))]),
            Box::new(|f| f.priority < 5),
        ),
        (
            list(vec![cond("priority", None, "lt", json!(8))]),
            Box::new(|f| f.priority < 8),
        ),
        (
            list(vec![cond("priority", None, "<=", json!(5))]),
            Box::new(|f| f.priority <= 5),
        ),
        (
            list(vec![cond("priority", None, "lte", json!(4))]),
            Box::new(|f| f.priority <= 4),
        ),
        (
            list(vec![cond("priority", None, ">", json!(20))]),
            Box::new(|f| f.priority > 20),
        ),
        (
            list(vec![cond("priority", None, "gt", json!(5))]),
            Box::new(|f| f.priority > 5),
        ),
        (
            list(vec![cond("priority", None, ">=", json!(20))]),
            Box::new(|f| f.priority >= 20),
        ),
        (
            list(vec![cond("priority", None, "gte", json!(30))]),
            Box::new(|f| f.priority >= 30),
        ),
        (
            list(vec![cond("priority", None, "in", json!([1, 2, 3]))]),
            Box::new(|f| f.priority <= 3),
        ),
        // time column
        (
            list(vec![cond("created_at", None, ">", json!(mid))]),
            Box::new({
                let m = mid_for_pred.clone();
                move |f| f.created_at > m
            }),
        ),
        (
            list(vec![cond(
                "created_at",
                None,
                "<=",
                json!(mid_for_pred.clone()),
            )]),
            Box::new({
                let m = mid_for_pred.clone();
                move |f| f.created_at <= m
            }),
        ),
        // data fields the real clients use
        (
            list(vec![cond("data", Some("boefje__id"), "==", json!("nmap"))]),
            Box::new(|f| f.boefje == Some("nmap")),
        ),
        (
            list(vec![cond(
                "data",
                Some("boefje__id"),
                "in",
                json!(["nmap", "ssl-certs"]),
            )]),
            Box::new(|f| matches!(f.boefje, Some("nmap" | "ssl-certs"))),
        ),
        (
            list(vec![cond(
                "data",
                Some("boefje__oci_image"),
                "in",
                json!([img_dns, img_ssl]),
            )]),
            Box::new(|f| matches!(f.boefje, Some("dns-records" | "ssl-certs"))),
        ),
        (
            list(vec![cond(
                "data",
                Some("normalizer__id"),
                "eq",
                json!("kat_nmap_normalize"),
            )]),
            Box::new(|f| f.normalizer == Some("kat_nmap_normalize")),
        ),
        (
            list(vec![cond(
                "data",
                Some("input_ooi"),
                "==",
                json!("Hostname|internet|a.nl"),
            )]),
            Box::new(|f| f.ooi == Some("Hostname|internet|a.nl")),
        ),
        (
            list(vec![cond(
                "data",
                Some("input_ooi"),
                "in",
                json!(["Hostname|internet|a.nl", "Hostname|internet|c.nl"]),
            )]),
            Box::new(|f| {
                matches!(
                    f.ooi,
                    Some("Hostname|internet|a.nl" | "Hostname|internet|c.nl")
                )
            }),
        ),
        (
            list(vec![cond(
                "data",
                Some("input_ooi"),
                "is_null",
                Value::Null,
            )]),
            Box::new(|f| f.ooi.is_none()),
        ),
        (
            list(vec![cond(
                "data",
                Some("input_ooi"),
                "is_not_null",
                Value::Null,
            )]),
            Box::new(|f| f.ooi.is_some()),
        ),
        (
            list(vec![cond(
                "data",
                Some("input_ooi"),
                "like",
                json!("Hostname|%"),
            )]),
            Box::new(|f| f.ooi.is_some_and(|o| o.starts_with("Hostname|"))),
        ),
        (
            list(vec![cond(
                "data",
                Some("input_ooi"),
                "like",
                json!("%b.nl"),
            )]),
            Box::new(|f| f.ooi.is_some_and(|o| o.ends_with("b.nl"))),
        ),
        (
            list(vec![cond(
                "data",
                Some("input_ooi"),
                "ilike",
                json!("%b.nl"),
            )]),
            Box::new(|f| f.ooi.is_some_and(|o| o.to_lowercase().ends_with("b.nl"))),
        ),
        (
            list(vec![cond(
                "data",
                Some("input_ooi"),
                "!=",
                json!("Hostname|internet|a.nl"),
            )]),
            Box::new(|f| f.ooi.is_some_and(|o| o != "Hostname|internet|a.nl")),
        ),
        (
            list(vec![cond(
                "data",
                Some("report_recipe_id"),
                "eq",
                json!("recipe-b"),
            )]),
            Box::new(|f| f.recipe == Some("recipe-b")),
        ),
        (
            list(vec![cond("data", Some("depth"), ">", json!(5))]),
            Box::new(|f| f.depth.is_some_and(|d| d > 5)),
        ),
        (
            list(vec![cond("data", Some("depth"), "<=", json!(3.5))]),
            Box::new(|f| f.depth.is_some_and(|d| d <= 3)),
        ),
        (
            list(vec![cond("data", Some("depth"), "not_in", json!([1, 3]))]),
            Box::new(|f| f.depth.is_some_and(|d| d != 1 && d != 3)),
        ),
        (
            list(vec![cond("data", Some("deep"), "==", json!(true))]),
            Box::new(|f| f.deep == Some(true)),
        ),
        // a list means "all of"
        (
            list(vec![
                cond("organisation", None, "==", json!("org1")),
                cond("scheduler_id", None, "==", json!("boefje")),
            ]),
            Box::new(|f| f.org == "org1" && f.scheduler == "boefje"),
        ),
    ];
    // combinators
    out.push((
        json!({"filters": {"or": [cond("organisation", None, "==", json!("org2")), cond("scheduler_id", None, "==", json!("report"))]}}),
        Box::new(|f| f.org == "org2" || f.scheduler == "report"),
    ));
    out.push((
        json!({"filters": {"and": [cond("priority", None, "<", json!(10)), cond("status", None, "==", json!("queued"))]}}),
        Box::new(|f| f.priority < 10 && f.status == "queued"),
    ));
    out.push((
        json!({"filters": {"not": [cond("organisation", None, "==", json!("org1"))]}}),
        Box::new(|f| f.org != "org1"),
    ));
    out.push((
        json!({"filters": {"not": [cond("organisation", None, "==", json!("org1")), cond("organisation", None, "==", json!("org2"))]}}),
        Box::new(|f| f.org != "org1" && f.org != "org2"),
    ));
    out.push((
        json!({"filters": {
            "and": [{"or": [cond("data", Some("boefje__id"), "==", json!("dns-records")), cond("scheduler_id", None, "==", json!("normalizer"))]}],
            "not": [cond("organisation", None, "in", json!(["org2"]))]
        }}),
        Box::new(|f| (f.boefje == Some("dns-records") || f.scheduler == "normalizer") && f.org != "org2"),
    ));
    out
}

async fn every_column_and_operator_selects_what_it_says(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let fx = seed(&app).await;
    for (filter, pred) in cases(&fx) {
        let mut want: Vec<String> = fx
            .iter()
            .filter(|f| pred(f))
            .map(|f| f.id.clone())
            .collect();
        want.sort();
        let got = app.matching_ids(&filter).await;
        assert_eq!(got, want, "filter {filter}");
    }
}

async fn a_filtered_pop_takes_the_best_matching_task(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let fx = seed(&app).await;
    let filter =
        json!({"filters": [cond("data", Some("boefje__oci_image"), "in", json!([image("nmap")]))]});
    let mut nmap: Vec<&Fx> = fx
        .iter()
        .filter(|f| f.boefje == Some("nmap") && f.status == "queued")
        .collect();
    nmap.sort_by_key(|f| (f.priority, f.created_at.clone()));
    let popped = app.pop_ok("boefje", 1, Some(&filter)).await;
    assert_eq!(popped.len(), 1);
    assert_eq!(id_of(&popped[0]), nmap[0].id);
    assert_eq!(popped[0]["status"], "dispatched");
    // It left the heap too: an unfiltered drain never returns it again.
    let rest: Vec<String> = app.pop_ids("boefje", 100).await;
    assert!(!rest.contains(&nmap[0].id));
    assert_eq!(
        rest.len(),
        fx.iter()
            .filter(|f| f.scheduler == "boefje" && f.status == "queued")
            .count()
            - 1
    );
}

/// A pattern ending in its escape character is PostgreSQL's error (which was a 500 on a listing,
/// and on a pop that reached the backlog): a 400 naming it on both databases, before anything is
/// read or popped. An escaped backslash is a backslash.
async fn a_pattern_ending_in_its_escape_character_is_a_400(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let task = app
        .push_ok("boefje", &boefje_push("org\\", "dns", None, 3))
        .await;
    for operator in ["like", "not_like", "ilike", "not_ilike"] {
        let filter = json!({"filters": [cond("organisation", None, operator, json!("org\\"))]});
        let listed = app.search_tasks("", Some(&filter)).await;
        assert_eq!(listed.status(), StatusCode::BAD_REQUEST, "{operator}");
        assert!(
            detail(listed).await.contains("escape character"),
            "{operator}"
        );
        let popped = app.pop("boefje", Some(1), Some(&filter)).await;
        assert_eq!(popped.status(), StatusCode::BAD_REQUEST, "{operator}");
    }
    let escaped = json!({"filters": [cond("organisation", None, "like", json!("org\\\\"))]});
    assert_eq!(app.matching_ids(&escaped).await, [id_of(&task)]);
    assert_eq!(
        app.pop_ids("boefje", 1).await,
        [id_of(&task)],
        "nothing popped by the 400s"
    );
}

/// A `data` field compares as the value's type says, alike in a listing (SQL, on either
/// database) and in a pop (the heap): a boolean matches only JSON booleans, a number only JSON
/// numbers, and text the field's text form (the number 3 is "3"). PostgreSQL read a boolean's
/// comparison from the text (the string "true" matched), SQLite a text one from the native
/// value (the number 3 never equalled "3").
async fn data_fields_compare_alike_in_listings_and_pops(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let with = |boefje: &str, flag: Value, depth: Value| {
        let mut body = boefje_push("org1", boefje, None, 3);
        body["data"]["flag"] = flag;
        body["data"]["depth"] = depth;
        body
    };
    let typed = id_of(
        &app.push_ok("boefje", &with("typed", json!(true), json!(3)))
            .await,
    );
    let texts = id_of(
        &app.push_ok("boefje", &with("texts", json!("true"), json!("3")))
            .await,
    );
    let mut both = vec![typed.clone(), texts.clone()];
    both.sort();
    let cases = [
        (json!(true), "flag", vec![typed.clone()]),
        (json!("true"), "flag", both.clone()),
        (json!(3), "depth", vec![typed.clone()]),
        (json!("3"), "depth", both.clone()),
    ];
    for (value, field, want) in &cases {
        let filter = json!({"filters": [cond("data", Some(field), "==", value.clone())]});
        assert_eq!(&app.matching_ids(&filter).await, want, "{field} == {value}");
    }
    // The heap agrees: a pop by the boolean takes the typed task only.
    let filter = json!({"filters": [cond("data", Some("flag"), "==", json!(true))]});
    assert_eq!(app.pop_ok("boefje", 1, Some(&filter)).await.len(), 1);
    assert!(app.pop_ok("boefje", 1, Some(&filter)).await.is_empty());
    assert_eq!(app.pop_ids("boefje", 1).await, [texts]);
}

/// A filter sent in a GET's body (mula reads it there) is refused, naming the way that works,
/// rather than ignored with every task answered.
async fn a_filter_in_a_get_body_is_a_400_not_ignored(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.push_ok("boefje", &boefje_push("org1", "dns", None, 3))
        .await;
    let filter = json!({"filters": [cond("organisation", None, "==", json!("org2"))]});
    let resp = app
        .client
        .get(format!("{}/tasks", app.address))
        .json(&filter)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(detail(resp).await.contains("POST /tasks"));
    assert!(app.matching_ids(&filter).await.is_empty());
    assert_eq!(app.get("/tasks").await.status(), StatusCode::OK);
}

/// The webapp finds schedules and tasks by an object's reference, which may be a long URL (its
/// boefje page searches the schedules of up to 150 objects at once). A filter value is only
/// compared, so one longer than a stored key field is answered, not refused.
async fn searches_by_a_long_reference_are_answered(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let long = format!("URL|internet|https://example.nl/?{}", "q=1&".repeat(300));
    assert!(long.chars().count() > 1_000);
    let schedules = app
        .post(
            "/schedules/search",
            Some(&json!({"filters": [{"column": "data", "field": "input_ooi",
                "operator": "in", "value": [long, "Hostname|internet|a.nl"]}]})),
        )
        .await;
    assert_eq!(schedules.status(), StatusCode::OK);
    assert_eq!(schedules.json::<Value>().await.unwrap()["count"], 0);
    let tasks = app
        .search_tasks(
            "scheduler_id=boefje&task_type=boefje&limit=150",
            Some(&json!({"filters": [{"column": "data", "field": "input_ooi",
                "operator": "==", "value": long}]})),
        )
        .await;
    assert_eq!(tasks.status(), StatusCode::OK);
    assert_eq!(tasks.json::<Value>().await.unwrap()["count"], 0);
}

crate::backend_tests!(
    searches_by_a_long_reference_are_answered,
    a_filter_in_a_get_body_is_a_400_not_ignored,
    data_fields_compare_alike_in_listings_and_pops,
    a_pattern_ending_in_its_escape_character_is_a_400,
    every_column_and_operator_selects_what_it_says,
    a_filtered_pop_takes_the_best_matching_task,
);
