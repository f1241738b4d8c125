//! The queue semantics of docs/DESIGN.md §5: pop order, boost, re-push, bounded heaps with eviction
//! and refill, and 429 when a scheduler refuses work.

use chrono::Duration;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;
use kat_scheduler::queue::WhenFull;

async fn pops_come_lowest_priority_first_then_oldest(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // (boefje, priority), pushed one minute apart: ages differ, priorities are mixed.
    let plan = [
        ("a", 50),
        ("b", 10),
        ("c", 50),
        ("d", 1),
        ("e", 10),
        ("f", 100),
        ("g", 1),
    ];
    let mut pushed = Vec::new();
    for (name, priority) in plan {
        app.advance(Duration::minutes(1));
        let task = app
            .push_ok("boefje", &boefje_push("org1", name, None, priority))
            .await;
        pushed.push((
            priority,
            task["created_at"].as_str().unwrap().to_owned(),
            id_of(&task),
        ));
    }
    let mut expected = pushed.clone();
    expected.sort();
    let expected: Vec<String> = expected.into_iter().map(|(_, _, id)| id).collect();

    let mut popped = Vec::new();
    // Mixed limits: the order holds across pops of one and of several.
    for limit in [1, 3, 1, 5] {
        popped.extend(app.pop_many("boefje", limit, None).await.iter().map(id_of));
    }
    assert_eq!(popped, expected);
}

async fn equal_priorities_pop_in_push_order_even_within_a_microsecond(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    // The manual clock stands still: every push has the same wall-clock time.
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(id_of(
            &app.push_ok("report", &report_push("org1", &format!("r{i}"), 5))
                .await,
        ));
    }
    let popped: Vec<String> = app.pop_ids("report", 20).await;
    assert_eq!(popped, ids);
}

async fn a_scheduler_only_pops_its_own_tasks(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    app.push_ok("boefje", &boefje_push("org1", "a", None, 1))
        .await;
    let n = app
        .push_ok("normalizer", &normalizer_push("org1", "n", 9))
        .await;
    let popped = app.pop_ok("normalizer", 10, None).await;
    assert_eq!(popped.len(), 1);
    assert_eq!(popped[0]["id"], n["id"]);
}

async fn a_duplicate_with_a_better_priority_boosts_the_queued_task(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let ahead = app
        .push_ok("boefje", &boefje_push("org1", "ahead", None, 20))
        .await;
    let original = app
        .push_ok(
            "boefje",
            &boefje_push("org1", "dns", Some("Hostname|internet|a.nl"), 50),
        )
        .await;

    // The user asks for the same scan now, as Rocky does: a new id, priority 1.
    let mut user = boefje_push("org1", "dns", Some("Hostname|internet|a.nl"), 1);
    user["id"] = json!(uuid::Uuid::new_v4().to_string());
    let resp = app.push("boefje", &user).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let boosted: Value = resp.json().await.unwrap();
    assert_eq!(
        boosted["id"], original["id"],
        "the queued task is boosted in place"
    );
    assert_eq!(boosted["priority"], 1);

    // Not better: 409, and nothing changes.
    let resp = app
        .push(
            "boefje",
            &boefje_push("org1", "dns", Some("Hostname|internet|a.nl"), 1),
        )
        .await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);

    let popped: Vec<String> = app.pop_ids("boefje", 5).await;
    assert_eq!(popped, vec![id_of(&original), id_of(&ahead)]);
    let count: Value = app.get("/tasks?limit=0").await.json().await.unwrap();
    assert_eq!(count["count"], 2, "no second task was created");
}

async fn a_worker_re_push_of_a_full_task_queues_it_again(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let pushed = app
        .push_ok("boefje", &boefje_push("org1", "dns", None, 4))
        .await;
    let popped = app.pop_ok("boefje", 1, None).await.remove(0);
    assert_eq!(popped["status"], "dispatched");

    // The boefje runtime pushes the task JSON back unchanged at shutdown.
    let resp = app.push("boefje", &popped).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let requeued: Value = resp.json().await.unwrap();
    assert_eq!(requeued["id"], pushed["id"]);
    assert_eq!(requeued["status"], "queued");
    assert_eq!(requeued["created_at"], pushed["created_at"]);

    let again = app.pop_ok("boefje", 1, None).await;
    assert_eq!(
        again[0]["id"], pushed["id"],
        "the same task is handed out again"
    );

    // A finished task is not brought back by a re-push.
    assert_eq!(
        app.patch_task(&id_of(&pushed), &json!({"status": "completed"}))
            .await
            .status(),
        StatusCode::OK
    );
    let resp = app.push("boefje", &again[0]).await;
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    assert!(detail(resp).await.contains("is completed"));
}

async fn a_full_heap_keeps_the_best_tasks_and_the_rest_as_pending_and_pops_best_first(
    backend: Backend,
) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = 3).await else {
        return;
    };
    let mut ids = Vec::new();
    for (i, priority) in [30, 10, 20, 50, 5, 40].into_iter().enumerate() {
        let task = app
            .push_ok(
                "boefje",
                &boefje_push("org1", &format!("b{i}"), None, priority),
            )
            .await;
        // 5 ranks before the heap's worst (30), which makes way for it; 50 and 40 rank after
        // everything in the heap.
        let want = if i < 3 || priority == 5 {
            "queued"
        } else {
            "pending"
        };
        assert_eq!(task["status"], want, "push {i}");
        ids.push((priority, id_of(&task)));
    }
    let s: Value = app.get("/schedulers/boefje").await.json().await.unwrap();
    assert_eq!(
        (
            s["qsize"].as_u64(),
            s["pending"].as_u64(),
            s["maxsize"].as_u64()
        ),
        (Some(3), Some(3), Some(3))
    );

    // Draining one at a time: the heap holds 5, 10, 20; as it drains, pending tasks come back
    // best first (30, then 40, then 50), so every pop takes the best task waiting anywhere.
    let mut order = Vec::new();
    for _ in 0..6 {
        let t = app.pop_ok("boefje", 1, None).await;
        order.push(t[0]["priority"].as_i64().unwrap());
        let s: Value = app.get("/schedulers/boefje").await.json().await.unwrap();
        assert!(s["qsize"].as_u64().unwrap() <= 3, "the bound holds");
    }
    assert_eq!(order, vec![5, 10, 20, 30, 40, 50]);
    let s: Value = app.get("/schedulers/boefje").await.json().await.unwrap();
    assert_eq!(
        (s["qsize"].as_u64(), s["pending"].as_u64()),
        (Some(0), Some(0))
    );
    // nothing was dropped
    let all: Value = app
        .get("/tasks?status=dispatched&limit=0")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(all["count"], 6);
}

async fn a_user_scan_evicts_the_worst_automatic_task(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = 2).await else {
        return;
    };
    let keep = app
        .push_ok("boefje", &boefje_push("org1", "keep", None, 10))
        .await;
    let worst = app
        .push_ok("boefje", &boefje_push("org1", "worst", None, 90))
        .await;
    let user = app
        .push_ok("boefje", &boefje_push("org1", "user", None, 1))
        .await;
    assert_eq!(user["status"], "queued");
    assert_eq!(app.task(&id_of(&worst)).await["status"], "pending");
    let s: Value = app.get("/schedulers/boefje").await.json().await.unwrap();
    assert_eq!(
        (s["qsize"].as_u64(), s["pending"].as_u64()),
        (Some(2), Some(1))
    );

    let order: Vec<String> = app.pop_ids("boefje", 3).await;
    // The evicted task returns once there is room: popping two frees room, the refill brings it
    // back in the same batch and the third slot of this pop already sees it next time.
    assert_eq!(order[..2], [id_of(&user), id_of(&keep)]);
    let rest: Vec<String> = app.pop_ids("boefje", 3).await;
    let all: Vec<String> = order.into_iter().chain(rest).collect();
    assert_eq!(all, vec![id_of(&user), id_of(&keep), id_of(&worst)]);
}

async fn a_user_scan_into_a_heap_of_user_scans_waits_as_pending(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = 1).await else {
        return;
    };
    let first = app
        .push_ok("boefje", &boefje_push("org1", "u1", None, 1))
        .await;
    let second = app
        .push_ok("boefje", &boefje_push("org1", "u2", None, 1))
        .await;
    assert_eq!(first["status"], "queued");
    assert_eq!(second["status"], "pending");
    let popped: Vec<String> = [
        app.pop_ok("boefje", 1, None).await,
        app.pop_ok("boefje", 1, None).await,
    ]
    .concat()
    .iter()
    .map(id_of)
    .collect();
    assert_eq!(popped, vec![id_of(&first), id_of(&second)]);
}

async fn a_scheduler_set_to_reject_answers_429_but_takes_user_scans(backend: Backend) {
    let Some(app) = spawn_app_with(backend, |s| {
        s.queue.maxsize = 1;
        s.schedulers.normalizer.when_full = Some(WhenFull::Reject);
    })
    .await
    else {
        return;
    };
    app.push_ok("normalizer", &normalizer_push("org1", "n1", 5))
        .await;
    let resp = app
        .push("normalizer", &normalizer_push("org1", "n2", 5))
        .await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(resp.headers().contains_key("retry-after"));
    assert!(detail(resp).await.contains("queue normalizer is full"));
    let user = app
        .push_ok("normalizer", &normalizer_push("org1", "n3", 1))
        .await;
    assert_eq!(user["status"], "queued");
    // other schedulers keep the default policy
    app.push_ok("boefje", &boefje_push("org1", "a", None, 5))
        .await;
    let b = app
        .push_ok("boefje", &boefje_push("org1", "b", None, 5))
        .await;
    assert_eq!(b["status"], "pending");
}

async fn a_task_patched_back_to_queued_is_popped_again(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let task = app
        .push_ok("boefje", &boefje_push("org1", "dns", None, 3))
        .await;
    app.pop_ok("boefje", 1, None).await;
    let resp = app
        .patch_task(&id_of(&task), &json!({"status": "queued"}))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(app.pop_ok("boefje", 1, None).await[0]["id"], task["id"]);
}

/// How a task out with a runner comes back to wait.
#[derive(Clone, Copy, Debug)]
enum ComesBack {
    /// `PATCH queued` (the runtime re-queues de-duplicated siblings of a failed run).
    PutBack,
    /// The task as popped, pushed again (the runtime stopping).
    GivenBack,
    /// Its dispatch lease ends and the watchdog takes it back.
    LeaseEnds,
}

async fn come_back(app: &TestApp, popped: &Value, how: ComesBack) -> Value {
    let id = id_of(popped);
    match how {
        ComesBack::PutBack => {
            let resp = app.patch_task(&id, &json!({"status": "queued"})).await;
            assert_eq!(resp.status(), StatusCode::OK, "{how:?}");
            resp.json().await.unwrap()
        }
        ComesBack::GivenBack => {
            let resp = app.push("boefje", popped).await;
            assert_eq!(resp.status(), StatusCode::OK, "{how:?}");
            resp.json().await.unwrap()
        }
        ComesBack::LeaseEnds => {
            app.advance(chrono::Duration::seconds(
                kat_scheduler::config::DEFAULT_DISPATCH_TIMEOUT_SECS as i64 + 1,
            ));
            let report = app.sweep().await;
            assert_eq!(
                report.requeued,
                vec![uuid::Uuid::parse_str(&id).unwrap()],
                "{how:?}"
            );
            app.task(&id).await
        }
    }
}

/// Work out with a runner is pushed again (a user's scan, taken while the work runs, as mula
/// takes it); then the first task comes back to wait: put back, given back, or its lease ended.
/// Both waiting would run the work twice, by two runners at once. The first task stays, with the
/// user's more urgent priority, and the second, which never ran, is withdrawn with a reason that
/// names the first; in the heap and in the pending backlog alike.
async fn work_that_comes_back_to_wait_withdraws_the_same_work_pushed_meanwhile(backend: Backend) {
    use ComesBack::*;
    for in_backlog in [false, true] {
        for how in [PutBack, GivenBack, LeaseEnds] {
            let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = 2).await else {
                return;
            };
            let case = format!("{how:?}, in the backlog: {in_backlog}");
            let dns = json!({"filters": [
                {"column": "data", "field": "boefje__id", "operator": "==", "value": "dns"}
            ]});
            let work = boefje_push("org1", "dns", Some("Hostname|internet|a.example.com"), 5);
            let first = app.push_ok("boefje", &work).await;
            let popped = app.pop_ok("boefje", 1, Some(&dns)).await.remove(0);
            assert_eq!(popped["id"], first["id"], "{case}");
            if in_backlog {
                // A full heap of user scans: the user's scan below waits as pending.
                for org in ["org2", "org3"] {
                    app.push_ok("boefje", &boefje_push(org, "nmap", None, 1))
                        .await;
                }
            }
            let mut user = work.clone();
            user["priority"] = json!(1);
            let second = app.push_ok("boefje", &user).await;
            let waits = if in_backlog { "pending" } else { "queued" };
            assert_eq!(second["status"], waits, "{case}");

            let back = come_back(&app, &popped, how).await;
            assert_eq!(back["id"], first["id"], "{case}");
            // Older than the heap's user scans at the same priority, it ranks before them.
            assert_eq!(back["status"], "queued", "{case}");
            assert_eq!(
                back["priority"], 1,
                "{case}: the user's priority goes with it"
            );
            let withdrawn = app.task(&id_of(&second)).await;
            assert_eq!(withdrawn["status"], "cancelled", "{case}");
            let why = withdrawn["failure_reason"].as_str().unwrap_or_default();
            assert!(why.contains(&id_of(&first)), "{case}: {why}");

            // The work waits once: a push of it meets the first task, one pop hands it out.
            let again = app.push("boefje", &work).await;
            assert_eq!(again.status(), StatusCode::CONFLICT, "{case}");
            assert!(detail(again).await.contains(&id_of(&first)), "{case}");
            let s: Value = app.get("/schedulers/boefje").await.json().await.unwrap();
            let waiting = if in_backlog { 3 } else { 1 };
            assert_eq!(
                s["qsize"].as_u64().unwrap() + s["pending"].as_u64().unwrap(),
                waiting,
                "{case}: {s}"
            );
            let popped = app.pop_ok("boefje", 1, Some(&dns)).await;
            assert_eq!(popped[0]["id"], first["id"], "{case}");
            assert!(
                app.pop_ok("boefje", 1, Some(&dns)).await.is_empty(),
                "{case}: the withdrawn task is not handed out"
            );
        }
    }
}

/// Withdrawing is for good, so it goes by the table, not by the engine's memory: a task of the
/// same work that the heap still holds, cancelled by hand in the table, is not withdrawn again
/// (its reason stays) and lends no priority; the task coming back waits as it was, and it alone
/// is handed out.
async fn a_task_cancelled_behind_the_engines_back_is_not_withdrawn_again(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let dns = json!({"filters": [
        {"column": "data", "field": "boefje__id", "operator": "==", "value": "dns"}
    ]});
    let work = boefje_push("org1", "dns", Some("Hostname|internet|a.example.com"), 5);
    let first = app.push_ok("boefje", &work).await;
    app.pop_ok("boefje", 1, Some(&dns)).await;
    let mut user = work.clone();
    user["priority"] = json!(1);
    let second = id_of(&app.push_ok("boefje", &user).await);
    behind_its_back(
        backend,
        &app.db.uri,
        &format!(
            "UPDATE tasks SET status = 'cancelled', failure_reason = 'by hand' WHERE id = '{second}'"
        ),
    );
    let back = app
        .patch_task(&id_of(&first), &json!({"status": "queued"}))
        .await;
    assert_eq!(back.status(), StatusCode::OK);
    let back: Value = back.json().await.unwrap();
    assert_eq!(back["status"], "queued");
    assert_eq!(
        back["priority"], 5,
        "no priority taken from a task that does not wait"
    );
    let hand = app.task(&second).await;
    assert_eq!(
        (&hand["status"], &hand["failure_reason"]),
        (&json!("cancelled"), &json!("by hand"))
    );
    let popped = app.pop_ids("boefje", 5).await;
    assert_eq!(popped, vec![id_of(&first)]);
}

/// A boefje push in de-duplication group `key`.
fn sibling_push(org: &str, key: &str, priority: i64, ooi: &str) -> Value {
    let mut body = boefje_push(org, "dns", Some(ooi), priority);
    body["data"]["deduplication_key"] = json!(key);
    body
}

async fn a_boefje_pop_hands_out_a_de_duplication_group_together_and_each_task_once(
    backend: Backend,
) {
    // Two in the heap, the rest of the group waiting as pending.
    let Some(app) = spawn_app_with(backend, |s| s.queue.maxsize = 3).await else {
        return;
    };
    let key = uuid::Uuid::new_v4().to_string();
    let lone = app
        .push_ok(
            "boefje",
            &boefje_push("org0", "nmap", Some("IPAddressV4|internet|10.0.0.1"), 2),
        )
        .await;
    let mut group = Vec::new();
    for org in ["org1", "org2", "org3", "org4"] {
        let t = app
            .push_ok(
                "boefje",
                &sibling_push(org, &key, 5, "Hostname|internet|a.nl"),
            )
            .await;
        group.push(id_of(&t));
    }
    let bad = app
        .push(
            "boefje",
            &sibling_push("org5", "not-a-uuid", 5, "Hostname|internet|a.nl"),
        )
        .await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    assert!(detail(bad).await.contains("data.deduplication_key"));

    assert_eq!(app.pop_ids("boefje", 1).await, vec![id_of(&lone)]);
    // A runner of three of the organisations: its part of the group, up to its limit.
    let filter = json!({"filters": [
        {"column": "organisation", "operator": "in", "value": ["org1", "org2", "org3"]}]});
    let got = app.pop_ok("boefje", 10, Some(&filter)).await;
    let ids: Vec<String> = got.iter().map(id_of).collect();
    assert_eq!(ids, group[..3].to_vec(), "the group, best first");
    assert!(got.iter().all(|t| t["status"] == "dispatched"));
    // The fourth sibling is still there for whoever may run it, once.
    assert_eq!(app.pop_ids("boefje", 5).await, vec![group[3].clone()]);
    assert!(app.pop_ids("boefje", 5).await.is_empty());
}

/// The boefje runtime with `DEDUPLICATE=true` (`boefjes/worker/manager.py`): an answer's first
/// task runs and every other task of the answer is patched to the first's outcome, its raw
/// files copied. Answers, per answer, the task run and the tasks so marked.
fn deduplicating_runner(answer: &[Value]) -> (String, Vec<String>) {
    let (first, rest) = answer.split_first().expect("a non-empty answer");
    (id_of(first), rest.iter().map(id_of).collect())
}

/// As in mula, a boefje answer is one task, or one group's tasks up to the pop's `limit`, never
/// tasks of two groups or a group and an unrelated task: OpenKAT's boefje worker runs an
/// answer's first task and marks every other one as its duplicate. At `limit=1`, what the
/// runners send, each task comes alone: the worker saves a duplicate's output through the
/// boefje API, which refuses a task not `running`, so a sibling handed out with its leader
/// would wait, unrun, for its lease.
async fn a_boefje_answer_is_one_task_or_the_group_up_to_the_limit(backend: Backend) {
    for limit in [1, 10] {
        let Some(app) = spawn_app(backend).await else {
            return;
        };
        let key = uuid::Uuid::new_v4().to_string();
        let lone = app
            .push_ok(
                "boefje",
                &boefje_push("org0", "nmap", Some("IPAddressV4|internet|10.0.0.1"), 2),
            )
            .await;
        let mut group = Vec::new();
        for org in ["org1", "org2", "org3"] {
            let t = app
                .push_ok(
                    "boefje",
                    &sibling_push(org, &key, 3, "Hostname|internet|a.nl"),
                )
                .await;
            group.push(id_of(&t));
        }
        let b = app
            .push_ok(
                "boefje",
                &boefje_push("org0", "dns", Some("Hostname|internet|b.nl"), 4),
            )
            .await;
        let c = app
            .push_ok(
                "boefje",
                &boefje_push("org0", "dns", Some("Hostname|internet|c.nl"), 5),
            )
            .await;
        let mut answers = Vec::new();
        loop {
            let got = app.pop_ok("boefje", limit, None).await;
            if got.is_empty() {
                break;
            }
            answers.push(got);
        }
        let ids: Vec<Vec<String>> = answers
            .iter()
            .map(|a| a.iter().map(id_of).collect())
            .collect();
        let mut expected = vec![vec![id_of(&lone)]];
        match limit {
            1 => expected.extend(group.iter().map(|g| vec![g.clone()])),
            _ => expected.push(group.clone()),
        }
        expected.extend([vec![id_of(&b)], vec![id_of(&c)]]);
        assert_eq!(
            ids, expected,
            "limit {limit}: best first, the group up to the limit, nothing mixed in"
        );
        for answer in &answers {
            let (run, marked) = deduplicating_runner(answer);
            for m in marked {
                assert!(
                    group.contains(&m) && group.contains(&run),
                    "limit {limit}: {m} would be marked done by the run of {run}"
                );
            }
        }
    }
}

crate::backend_tests!(
    a_boefje_answer_is_one_task_or_the_group_up_to_the_limit,
    pops_come_lowest_priority_first_then_oldest,
    equal_priorities_pop_in_push_order_even_within_a_microsecond,
    a_scheduler_only_pops_its_own_tasks,
    a_duplicate_with_a_better_priority_boosts_the_queued_task,
    a_worker_re_push_of_a_full_task_queues_it_again,
    a_full_heap_keeps_the_best_tasks_and_the_rest_as_pending_and_pops_best_first,
    a_user_scan_evicts_the_worst_automatic_task,
    a_user_scan_into_a_heap_of_user_scans_waits_as_pending,
    a_scheduler_set_to_reject_answers_429_but_takes_user_scans,
    a_task_patched_back_to_queued_is_popped_again,
    work_that_comes_back_to_wait_withdraws_the_same_work_pushed_meanwhile,
    a_task_cancelled_behind_the_engines_back_is_not_withdrawn_again,
    a_boefje_pop_hands_out_a_de_duplication_group_together_and_each_task_once,
);
