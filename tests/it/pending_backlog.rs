//! A filtered pop finds every task the pending backlog holds for it: a runner popping an image
//! that only pending tasks have gets each one, and never an empty answer while one waits (an
//! empty answer sends a runner to sleep for its poll interval). Also when the engine's count of
//! pending tasks is wrong: rows changed behind its back, either way, and after a restart.

use serde_json::{Value, json};

use crate::helpers::*;
use kat_scheduler::queue::fair::Fairness;

const MAXSIZE: usize = 8;
const RARE: &str = "ghcr.io/minvws/openkat/rare-scanner:latest";

fn rare_filter() -> Value {
    json!({"filters": [{"column": "data", "field": "boefje__oci_image", "operator": "in",
        "value": [RARE]}]})
}

fn id_list(ids: &[String]) -> String {
    ids.iter()
        .map(|id| format!("'{id}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Fills the heap (and more) with common work, then pushes `n` tasks of the rare image ranked
/// after all of it: every one of them waits as pending. Answers their ids.
async fn common_then_rare(app: &TestApp, common: usize, n: usize) -> Vec<String> {
    for i in 0..common {
        app.push_ok(
            "boefje",
            &boefje_push(&format!("org{}", i % 3), "nmap", Some(&format!("h{i}")), 5),
        )
        .await;
    }
    let mut rare = Vec::new();
    for i in 0..n {
        let t = app
            .push_ok(
                "boefje",
                &boefje_push(
                    &format!("org{}", i % 3),
                    "rare-scanner",
                    Some(&format!("r{i}")),
                    500 + i as i64,
                ),
            )
            .await;
        assert_eq!(t["status"], "pending", "ranked after a full heap");
        rare.push(id_of(&t));
    }
    rare
}

/// Pops the rare image one task at a time until the answer is empty; asserts that the answer is
/// never empty while one of `waiting` has not been handed out. Answers the ids in pop order.
async fn drain_rare(app: &TestApp, waiting: &[String]) -> Vec<String> {
    let mut got: Vec<String> = Vec::new();
    loop {
        let popped = app.pop_ok("boefje", 1, Some(&rare_filter())).await;
        let Some(t) = popped.first() else {
            let left: Vec<&String> = waiting.iter().filter(|id| !got.contains(id)).collect();
            assert!(
                left.is_empty(),
                "an empty answer while {} rare tasks wait: {left:?}",
                left.len()
            );
            return got;
        };
        assert_eq!(t["data"]["boefje"]["oci_image"], RARE);
        let id = id_of(t);
        assert!(!got.contains(&id), "task {id} popped twice");
        got.push(id);
        assert!(
            got.len() <= waiting.len(),
            "more rare tasks than were pushed"
        );
    }
}

async fn every_pending_only_task_is_popped_and_no_answer_is_empty_while_one_waits(
    backend: Backend,
) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = MAXSIZE).await else {
        return;
    };
    let rare = common_then_rare(&app, 3 * MAXSIZE, 5 * MAXSIZE).await;
    // Common pops between the rare ones make room, and the refill ahead moves pending tasks in:
    // the rare ones still come out, in pop order, from wherever they wait.
    let mut got = Vec::new();
    let mut common = 0;
    for round in 0.. {
        let popped = app.pop_ok("boefje", 1, Some(&rare_filter())).await;
        let Some(t) = popped.first() else { break };
        got.push(id_of(t));
        if round % 3 == 0 {
            common += app.pop_ok("boefje", 1, None).await.len();
        }
    }
    assert_eq!(got, rare, "every rare task, best first, none missing");
    // What is left is common work: the heap full, the rest pending, as counted.
    let left = 3 * MAXSIZE - common;
    let s: Value = app.get("/schedulers/boefje").await.json().await.unwrap();
    assert_eq!(
        (s["qsize"].as_u64(), s["pending"].as_u64()),
        (Some(MAXSIZE as u64), Some((left - MAXSIZE) as u64)),
        "{s}"
    );
}

async fn pending_rows_the_count_does_not_hold_are_found(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = MAXSIZE).await else {
        return;
    };
    let rare = common_then_rare(&app, 2 * MAXSIZE, 20).await;
    // Half of them cancelled through the API (the count follows) …
    for id in &rare[10..] {
        let r = app.patch_task(id, &json!({"status": "cancelled"})).await;
        assert!(r.status().is_success());
    }
    // … and put back by hand: pending again in the table, unknown to the count.
    let back = id_list(&rare[10..]);
    behind_its_back(
        backend,
        &app.db.uri,
        &format!(
            "UPDATE tasks SET status = 'pending' WHERE id IN ({back});
             INSERT INTO task_queue (task_id, scheduler_id, status, priority, created_at,
                 modified_at, hash, schedule_id, organisation, plugin_id, oci_image, input_ooi,
                 deduplication_key)
             SELECT id, scheduler_id, 'pending', priority, created_at, modified_at, hash,
                 schedule_id, organisation, plugin_id, oci_image, input_ooi, deduplication_key
             FROM tasks WHERE id IN ({back});"
        ),
    );
    let got = drain_rare(&app, &rare).await;
    assert_eq!(
        got, rare,
        "the ten counted and the ten put back by hand, in pop order"
    );
    // The count was read again: the common work that waits as pending flows into the heap.
    let common = app.pop_ids("boefje", 10 * MAXSIZE).await;
    assert_eq!(common.len(), 2 * MAXSIZE, "every common task popped");
    let s: Value = app.get("/schedulers/boefje").await.json().await.unwrap();
    assert_eq!(
        (s["qsize"].as_u64(), s["pending"].as_u64()),
        (Some(0), Some(0))
    );
}

async fn pending_rows_gone_behind_its_back_leave_no_pop_stuck(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = MAXSIZE).await else {
        return;
    };
    let rare = common_then_rare(&app, 2 * MAXSIZE, 20).await;
    // Ten pending tasks finished by hand: the count holds ten that are not there.
    let gone = id_list(&rare[..10]);
    behind_its_back(
        backend,
        &app.db.uri,
        &format!(
            "UPDATE tasks SET status = 'cancelled' WHERE id IN ({gone});
             DELETE FROM task_queue WHERE task_id IN ({gone});"
        ),
    );
    let got = drain_rare(&app, &rare[10..]).await;
    assert_eq!(got, rare[10..].to_vec());
    let common = app.pop_ids("boefje", 10 * MAXSIZE).await;
    assert_eq!(common.len(), 2 * MAXSIZE, "every common task popped");
}

async fn after_a_restart_the_pending_backlog_is_found(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = MAXSIZE).await else {
        return;
    };
    let rare = common_then_rare(&app, 3 * MAXSIZE, 3 * MAXSIZE).await;
    let first = app.pop_ok("boefje", 1, Some(&rare_filter())).await;
    assert_eq!(id_of(&first[0]), rare[0]);
    let app = app.restart().await;
    let got = drain_rare(&app, &rare[1..]).await;
    assert_eq!(got, rare[1..].to_vec());
    let common = app.pop_ids("boefje", 10 * MAXSIZE).await;
    assert_eq!(common.len(), 3 * MAXSIZE, "every common task popped");
}

fn organisation_filter(org: &str) -> Value {
    json!({"filters": [{"column": "organisation", "operator": "==", "value": org}]})
}

/// Pops one task with `filter`; answers its id.
async fn pop_one(app: &TestApp, filter: Option<&Value>) -> Option<String> {
    app.pop_ok("boefje", 1, filter).await.first().map(id_of)
}

/// An app with a heap of `MAXSIZE` in the heap's order alone, holding org0's common work, and as
/// much again pending (with organisations taking turns a new organisation's work would get its
/// turn in the heap, and unfiltered pops would alternate). `None`: the backend is absent.
async fn heap_full_of_common_work(backend: Backend) -> Option<TestApp> {
    let app = spawn_app_with(backend, |s| {
        s.queue.maxsize = MAXSIZE;
        s.schedulers.boefje.fairness = Some(Fairness::Off);
    })
    .await?;
    for i in 0..2 * MAXSIZE {
        app.push_ok(
            "boefje",
            &boefje_push("org0", "nmap", Some(&format!("h{i}")), 5),
        )
        .await;
    }
    Some(app)
}

/// A runner's filtered pops over the backlog are served from rows read ahead for its filter
/// (`queue::engine::read_ahead`); what happens between them must still reach it. A better task
/// pushed for its organisation comes out next; a task another filter took, or that a refill moved
/// into the heap and a pop took from there, is not handed out again; the rest come out once
/// each, best first, and then the answer is empty.
async fn pops_served_from_a_read_ahead_see_what_happened_since(backend: Backend) {
    let Some(app) = heap_full_of_common_work(backend).await else {
        return;
    };
    let common = 2 * MAXSIZE;
    // Twelve tasks of one organisation, ranked after all the common work: pending, all of them.
    let mut x = Vec::new();
    for i in 0..12 {
        let boefje = if i == 3 { "special" } else { "nmap" };
        let t = app
            .push_ok(
                "boefje",
                &boefje_push("orgx", boefje, Some(&format!("x{i}")), 500 + 2 * i),
            )
            .await;
        assert_eq!(t["status"], "pending");
        x.push(id_of(&t));
    }
    let orgx = organisation_filter("orgx");
    assert_eq!(pop_one(&app, Some(&orgx)).await.as_ref(), Some(&x[0]));
    assert_eq!(pop_one(&app, Some(&orgx)).await.as_ref(), Some(&x[1]));
    // A better one is pushed (it waits as pending too): the next pop gets it, not x2.
    let better = app
        .push_ok("boefje", &boefje_push("orgx", "nmap", Some("better"), 503))
        .await;
    assert_eq!(better["status"], "pending");
    assert_eq!(
        pop_one(&app, Some(&orgx)).await,
        Some(id_of(&better)),
        "a task pushed since the read"
    );
    assert_eq!(pop_one(&app, Some(&orgx)).await.as_ref(), Some(&x[2]));
    // Another runner's filter takes x3 from the backlog: this runner does not get it.
    let special = json!({"filters": [{"column": "data", "field": "boefje__id",
        "operator": "==", "value": "special"}]});
    assert_eq!(pop_one(&app, Some(&special)).await.as_ref(), Some(&x[3]));
    assert_eq!(
        pop_one(&app, Some(&orgx)).await.as_ref(),
        Some(&x[4]),
        "x3 went to the other filter"
    );
    // Unfiltered pops take the common work; as the heap drains, the refill moves the rest of
    // orgx's tasks into it, and pops take some of them from there.
    let mut unfiltered = Vec::new();
    for _ in 0..common + 3 {
        unfiltered.push(pop_one(&app, None).await.expect("common work waits"));
    }
    assert_eq!(
        unfiltered[common..],
        x[5..8],
        "orgx's next three, from the heap"
    );
    let mut rest = Vec::new();
    while let Some(id) = pop_one(&app, Some(&orgx)).await {
        assert!(
            !unfiltered.contains(&id) && !rest.contains(&id),
            "{id} handed out twice"
        );
        rest.push(id);
    }
    assert_eq!(
        rest,
        x[8..],
        "the rest of orgx's tasks, once each, best first"
    );
}

/// Pops from a read ahead (up to half a second old) meet rows changed behind the engine's back
/// since: a pending task cancelled by hand, with its queue row deleted or left behind, is not
/// handed out (nor is the batch failed on it); the next pops get the rest, once each, best first.
async fn a_pending_task_changed_by_hand_after_a_read_ahead_is_not_handed_out(backend: Backend) {
    let Some(app) = heap_full_of_common_work(backend).await else {
        return;
    };
    let mut x = Vec::new();
    for i in 0..8 {
        let t = app
            .push_ok(
                "boefje",
                &boefje_push("orgx", "nmap", Some(&format!("x{i}")), 500 + i),
            )
            .await;
        assert_eq!(t["status"], "pending");
        x.push(id_of(&t));
    }
    let orgx = organisation_filter("orgx");
    // The first pop reads ahead the rest of orgx's backlog.
    assert_eq!(pop_one(&app, Some(&orgx)).await.as_ref(), Some(&x[0]));
    // x1 cancelled with its queue row left behind (a careless edit), x2 with it deleted.
    behind_its_back(
        backend,
        &app.db.uri,
        &format!(
            "UPDATE tasks SET status = 'cancelled' WHERE id IN ('{}', '{}');
             DELETE FROM task_queue WHERE task_id = '{}';",
            x[1], x[2], x[2]
        ),
    );
    let (mut got, mut empty) = (Vec::new(), 0);
    while got.len() < 5 && empty < 3 {
        // A pop whose read-ahead rows were all changed answers short once, not with an error.
        match pop_one(&app, Some(&orgx)).await {
            Some(id) => got.push(id),
            None => empty += 1,
        }
    }
    assert_eq!(
        got,
        x[3..],
        "the rest of orgx's tasks, once each, best first"
    );
    assert!(empty <= 1, "{empty} empty answers while orgx's work waited");
    assert_eq!(pop_one(&app, Some(&orgx)).await, None);
    for id in &x[1..3] {
        assert_eq!(
            app.task(id).await["status"],
            "cancelled",
            "{id} as the edit left it"
        );
    }
    // The queue row the edit left behind is gone: the search that met it deleted it (the check
    // of the tables when the app stops finds nothing out of step).
}

/// A pending task cancelled by hand at the head of the backlog, its queue row left behind, is
/// among the next refill's picks. The heap holds it as read until a pop meets it: the pop's
/// write skips it, and a pop it leaves with nothing is decided again, not answered empty. The
/// backlog after the refill's picks still counts: a task pushed next that ranks after all of it waits as
/// pending (not in the heap's free place, ahead of better work), and the pops take every task
/// best first, with no empty answer while one waits.
async fn a_task_cancelled_by_hand_at_the_backlogs_head_leaves_the_order_intact(backend: Backend) {
    let Some(app) = heap_full_of_common_work(backend).await else {
        return;
    };
    let common = 2 * MAXSIZE;
    let mut backlog = Vec::new();
    for i in 0..2 * MAXSIZE as i64 {
        let t = app
            .push_ok(
                "boefje",
                &boefje_push("org1", "nmap", Some(&format!("b{i}")), 100 + i),
            )
            .await;
        assert_eq!(t["status"], "pending");
        backlog.push(id_of(&t));
    }
    behind_its_back(
        backend,
        &app.db.uri,
        &format!(
            "UPDATE tasks SET status = 'cancelled' WHERE id = '{}'",
            backlog[0]
        ),
    );
    // The common work (the heap's and the backlog's best), then the refill reaches org1's.
    let first = app.pop_ids("boefje", common).await;
    assert_eq!(first.len(), common);
    app.broker
        .refill(kat_scheduler::domain::SchedulerId::Boefje)
        .await
        .unwrap();
    // The same work as a task still pending after the refill's picks: not a second task.
    let again = app
        .push("boefje", &boefje_push("org1", "nmap", Some("b12"), 112))
        .await;
    assert_eq!(
        again.status(),
        reqwest::StatusCode::CONFLICT,
        "a duplicate of pending work"
    );
    let late = app
        .push_ok("boefje", &boefje_push("org2", "nmap", Some("late"), 1_000))
        .await;
    assert_eq!(late["status"], "pending", "ranked after every task waiting");
    let (mut got, mut empty) = (Vec::new(), 0);
    while empty == 0 {
        match pop_one(&app, None).await {
            Some(id) => got.push(id),
            None => empty += 1,
        }
    }
    assert_eq!(
        got,
        [&backlog[1..], &[id_of(&late)]].concat(),
        "every task once, best first, the late task last"
    );
    assert_eq!(app.task(&backlog[0]).await["status"], "cancelled");
    assert_eq!(
        app.metric("scheduler_engine_pops_decided_again_total")
            .await,
        1.0,
        "the pop that met it (its only task) was decided again, and counted"
    );
}

/// A filter with a key field and more: the backlog search reads the key field's queue rows and
/// decides the rest on them (`queue::engine::backlog`). When every row it read was turned down and
/// there may be more, the matches further down are still found: seventy tasks of `orgx` rank
/// before its three of priority ≥ 600, more than one search reads (a pop's limit and the
/// read ahead: 65).
async fn matches_below_the_rows_a_filter_turns_down_are_found(backend: Backend) {
    let Some(app) = heap_full_of_common_work(backend).await else {
        return;
    };
    for i in 0..70 {
        let t = app
            .push_ok(
                "boefje",
                &boefje_push("orgx", "nmap", Some(&format!("early{i}")), 500 + i),
            )
            .await;
        assert_eq!(t["status"], "pending");
    }
    let mut late = Vec::new();
    for i in 0..3 {
        let t = app
            .push_ok(
                "boefje",
                &boefje_push("orgx", "nmap", Some(&format!("late{i}")), 600 + i),
            )
            .await;
        assert_eq!(t["status"], "pending");
        late.push(id_of(&t));
    }
    let late_only = json!({"filters": [
        {"column": "organisation", "operator": "==", "value": "orgx"},
        {"column": "priority", "operator": ">=", "value": 600}
    ]});
    let mut got = Vec::new();
    while let Some(id) = pop_one(&app, Some(&late_only)).await {
        got.push(id);
        assert!(got.len() <= late.len(), "popped more than matched: {got:?}");
    }
    assert_eq!(
        got, late,
        "every match, best first, and then an empty answer"
    );
    // The organisation's other tasks are all still there, best first.
    let first = pop_one(&app, Some(&organisation_filter("orgx")))
        .await
        .unwrap();
    assert_eq!(app.task(&first).await["priority"], 500);
}

fn by_object(reference: &str) -> Value {
    json!({"filters": [{"column": "data", "field": "input_ooi", "operator": "==",
        "value": reference}]})
}

/// A task on an object whose reference is longer than an index entry holds (a URL with a long
/// query) waits in the backlog like any other, and a pop filtered by its object finds it there;
/// so does one on a short reference, through the index. Random characters, so that no
/// compression brings the reference under PostgreSQL's 2,704 bytes.
async fn work_on_an_object_with_a_reference_longer_than_an_index_entry_waits_and_is_found(
    backend: Backend,
) {
    let Some(app) = heap_full_of_common_work(backend).await else {
        return;
    };
    let long = |n: usize| {
        format!(
            "URL|internet|https://example.com/?q={}",
            (0..n)
                .map(|_| uuid::Uuid::new_v4().simple().to_string())
                .collect::<String>()
        )
    };
    let (a, b) = (long(100), long(250));
    let mut ids = Vec::new();
    for (boefje, reference, priority) in [
        ("nmap", &a, 500),
        ("dns-records", &a, 501),
        ("nmap", &b, 502),
        ("nmap", &"Hostname|internet|short.nl".to_owned(), 503),
    ] {
        let t = app
            .push_ok(
                "boefje",
                &boefje_push("org0", boefje, Some(reference), priority),
            )
            .await;
        assert_eq!(t["status"], "pending", "ranked after a full heap");
        assert_eq!(t["data"]["input_ooi"], reference.as_str());
        ids.push(id_of(&t));
    }
    assert_eq!(
        pop_one(&app, Some(&by_object(&b))).await,
        Some(ids[2].clone())
    );
    assert_eq!(pop_one(&app, Some(&by_object(&b))).await, None);
    assert_eq!(
        pop_one(&app, Some(&by_object("Hostname|internet|short.nl"))).await,
        Some(ids[3].clone())
    );
    // A boefje pop answers one unit of work: its two tasks come one after the other, best first.
    assert_eq!(
        pop_one(&app, Some(&by_object(&a))).await,
        Some(ids[0].clone())
    );
    assert_eq!(
        pop_one(&app, Some(&by_object(&a))).await,
        Some(ids[1].clone())
    );
    assert_eq!(pop_one(&app, Some(&by_object(&a))).await, None);
    // Over the longest reference the service stores, a clear refusal naming the field.
    let refused = app
        .post(
            "/schedulers/boefje/push",
            Some(&boefje_push("org0", "nmap", Some(&long(260)), 5)),
        )
        .await;
    assert_eq!(refused.status(), reqwest::StatusCode::BAD_REQUEST);
    let body = refused.text().await.unwrap();
    assert!(
        body.contains("input_ooi") && body.contains("8192"),
        "{body}"
    );
}

crate::backend_tests!(
    work_on_an_object_with_a_reference_longer_than_an_index_entry_waits_and_is_found,
    a_task_cancelled_by_hand_at_the_backlogs_head_leaves_the_order_intact,
    matches_below_the_rows_a_filter_turns_down_are_found,
    a_pending_task_changed_by_hand_after_a_read_ahead_is_not_handed_out,
    pops_served_from_a_read_ahead_see_what_happened_since,
    every_pending_only_task_is_popped_and_no_answer_is_empty_while_one_waits,
    pending_rows_the_count_does_not_hold_are_found,
    pending_rows_gone_behind_its_back_leave_no_pop_stuck,
    after_a_restart_the_pending_backlog_is_found,
);
