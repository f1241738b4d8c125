//! Crash safety: the release binary under concurrent pushes and pops, killed with SIGKILL at
//! random moments, then restarted. Every push answered 2xx must be stored, no task answered as
//! popped may be queued again (leases are long here, so none expires), and no task may be popped
//! twice. The seed of the random kill moments is printed; `KAT_CRASH_SEED` replays it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::child::ChildApp;
use crate::helpers::*;

const KILLS: usize = 5;
const PUSHERS: usize = 12;
const POPPERS: usize = 6;

/// Short ownership leases (PostgreSQL): a restart after SIGKILL takes the dead process's
/// schedulers over within about a second.
const LEASE: &[(&str, &str)] = &[("SCHEDULER_LEASE_MS", "1000")];

#[derive(Default)]
pub(crate) struct Acknowledged {
    pub pushes: Vec<String>,
    pub pops: Vec<String>,
    /// Pushes answered 503: whether they were stored is unknown to their caller, who retries.
    pub unanswered: Vec<Value>,
}

/// Pushes the bodies `body(0)`, `body(1)`, … one after another until one is not answered 201:
/// records each answered 201 in `seen.pushes`, and the one answered 503 (whose fate its caller
/// does not know) in `seen.unanswered`.
pub(crate) async fn push_until_refused(
    client: &reqwest::Client,
    address: &str,
    body: impl Fn(u64) -> Value,
    seen: &Mutex<Acknowledged>,
) {
    for n in 0.. {
        let body = body(n);
        let Ok(resp) = client
            .post(format!("{address}/schedulers/boefje/push"))
            .json(&body)
            .send()
            .await
        else {
            return;
        };
        if resp.status() == 503 {
            seen.lock().unwrap().unanswered.push(body);
            return;
        }
        if resp.status() != 201 {
            return;
        }
        let Ok(task) = resp.json::<Value>().await else {
            return;
        };
        seen.lock().unwrap().pushes.push(id_of(&task));
    }
}

/// Pushes and pops until the service stops answering; records only what was answered 2xx.
pub(crate) async fn drive(address: String, cycle: usize, seen: Arc<Mutex<Acknowledged>>) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut workers = Vec::new();
    for w in 0..PUSHERS {
        let (client, address, seen) = (client.clone(), address.clone(), seen.clone());
        workers.push(tokio::spawn(async move {
            let name = |n: u64| format!("c{cycle}-w{w}-n{n}");
            let push = |n: u64| boefje_push("crash", &name(n), None, 2 + (n % 50) as i64);
            push_until_refused(&client, &address, push, &seen).await;
        }));
    }
    for w in 0..POPPERS {
        let (client, address, seen) = (client.clone(), address.clone(), seen.clone());
        workers.push(tokio::spawn(async move {
            for n in 0.. {
                let limit = 1 + (w + n) % 3;
                let Ok(resp) = client
                    .post(format!("{address}/schedulers/boefje/pop?limit={limit}"))
                    .send()
                    .await
                else {
                    return;
                };
                if resp.status() != 200 {
                    return;
                }
                let Ok(body) = resp.json::<Value>().await else {
                    return;
                };
                let ids = result_ids(&body);
                seen.lock().unwrap().pops.extend(ids);
            }
        }));
    }
    for w in workers {
        let _ = w.await;
    }
}

async fn status_of(client: &reqwest::Client, address: &str, id: &str) -> Option<String> {
    let resp = client
        .get(format!("{address}/tasks/{id}"))
        .send()
        .await
        .unwrap();
    if resp.status() == 404 {
        return None;
    }
    assert_eq!(resp.status(), 200);
    resp.json::<Value>().await.unwrap()["status"]
        .as_str()
        .map(str::to_owned)
}

/// Pops `boefje` at `address` until nothing is left (a 503 while ownership settles is tried
/// again, for up to 30 s); fails if a task acknowledged as popped comes out again. Answers the
/// ids drained.
pub(crate) async fn drain(
    client: &reqwest::Client,
    address: &str,
    popped: &HashSet<String>,
    context: &str,
) -> HashSet<String> {
    let started = std::time::Instant::now();
    let mut drained = HashSet::new();
    loop {
        let resp = client
            .post(format!("{address}/schedulers/boefje/pop?limit=1000"))
            .send()
            .await
            .unwrap();
        if resp.status() == 503 && started.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(50)).await; // ownership settling
            continue;
        }
        assert_eq!(resp.status(), 200, "drain ({context})");
        let body: Value = resp.json().await.unwrap();
        let ids = result_ids(&body);
        if ids.is_empty() {
            return drained;
        }
        for id in ids {
            assert!(
                !popped.contains(&id),
                "task {id} was handed out again after a kill ({context})"
            );
            drained.insert(id);
        }
    }
}

/// The acknowledged pushes neither popped nor drained: each must be `dispatched` (popped by a
/// pop whose answer was lost with its instance; its lease brings it back). Answers how many.
pub(crate) async fn dispatched_unanswered(
    client: &reqwest::Client,
    address: &str,
    pushed: &[String],
    seen: (&HashSet<String>, &HashSet<String>),
    context: &str,
) -> usize {
    let (popped, drained) = seen;
    let mut n = 0;
    for id in pushed {
        if !popped.contains(id) && !drained.contains(id) {
            let status = status_of(client, address, id).await;
            assert_eq!(
                status.as_deref(),
                Some("dispatched"),
                "acknowledged push {id} is neither popped nor waiting ({context})"
            );
            n += 1;
        }
    }
    n
}

/// Each engine's commit waits for its own flush (PostgreSQL's default).
async fn acknowledged_work_survives_kill_9_at_random_moments_with_a_flush_per_commit(
    backend: Backend,
) {
    let mut env = LEASE.to_vec();
    env.push(("SCHEDULER_DB_FLUSH_BARRIER", "false"));
    kill_9_at_random_moments(backend, &env).await;
}

/// The engines commit without waiting for the disk (`synchronous = NORMAL` on SQLite,
/// `synchronous_commit = off` on PostgreSQL) and answer after the shared barrier (SQLite's
/// default); pops whose answers the kill cut off after their commit go back.
async fn acknowledged_work_survives_kill_9_at_random_moments_with_the_flush_barrier(
    backend: Backend,
) {
    let mut env = LEASE.to_vec();
    env.push(("SCHEDULER_DB_FLUSH_BARRIER", "true"));
    kill_9_at_random_moments(backend, &env).await;
}

/// Starts the binary on `uri` with `env`, off the test's runtime (it waits for the child).
async fn start(uri: String, env: &[(&str, &str)]) -> ChildApp {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|&(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        ChildApp::start(&uri, &env)
    })
    .await
    .unwrap()
}

async fn kill_9_at_random_moments(backend: Backend, env: &[(&str, &str)]) {
    let Some(db) = TestDb::create(backend).await else {
        return;
    };
    let seed = seed_from_env(
        "KAT_CRASH_SEED",
        &format!("crash test on {backend:?} with {env:?}"),
    );
    let mut rng = Rng(seed);
    let client = reqwest::Client::new();
    let mut pushed: Vec<String> = Vec::new();
    let mut popped: HashSet<String> = HashSet::new();

    for cycle in 0..KILLS {
        let child = start(db.uri.clone(), env).await;
        child.wait_owning_all().await;
        let address = child.address.clone();

        // What the previous kill left: every acknowledged push stored, every pop still dispatched.
        for id in &pushed {
            assert!(
                status_of(&client, &address, id).await.is_some(),
                "acknowledged push {id} lost (seed {seed})"
            );
        }
        for id in &popped {
            assert_eq!(
                status_of(&client, &address, id).await.as_deref(),
                Some("dispatched"),
                "popped task {id} changed (seed {seed})"
            );
        }

        let seen = Arc::new(Mutex::new(Acknowledged::default()));
        let load = tokio::spawn(drive(address, cycle, seen.clone()));
        let moment = Duration::from_millis(50 + rng.next() % 400);
        tokio::time::sleep(moment).await; // the random kill moment, not a wait for a state
        tokio::task::spawn_blocking(move || child.kill_9())
            .await
            .unwrap();
        load.await.unwrap();

        let seen = std::mem::take(&mut *seen.lock().unwrap());
        eprintln!(
            "kill {} after {moment:?}: {} pushes and {} pops acknowledged",
            cycle + 1,
            seen.pushes.len(),
            seen.pops.len()
        );
        for id in seen.pops {
            assert!(
                popped.insert(id.clone()),
                "task {id} was popped twice (seed {seed})"
            );
        }
        pushed.extend(seen.pushes);
    }
    assert!(
        !pushed.is_empty() && !popped.is_empty(),
        "the load did some work before the kills"
    );

    // Last restart: check, then drain. Nothing popped before comes out again, and every
    // acknowledged push was either popped before or is still waiting.
    let child = start(db.uri.clone(), env).await;
    child.wait_owning_all().await;
    let context = format!("seed {seed}");
    let drained = drain(&client, &child.address, &popped, &context).await;
    // A pop committed just before a kill whose answer never arrived leaves its tasks
    // `dispatched` but unacknowledged: their lease brings them back. At most one in-flight pop
    // (limit ≤ 3) per popper per kill can be in that state.
    let in_flight = dispatched_unanswered(
        &client,
        &child.address,
        &pushed,
        (&popped, &drained),
        &context,
    )
    .await;
    assert!(
        in_flight <= KILLS * POPPERS * 3,
        "{in_flight} tasks dispatched without an answer (seed {seed})"
    );
    // A graceful stop after all that exits cleanly.
    let clean = tokio::task::spawn_blocking(move || child.terminate())
        .await
        .unwrap();
    assert!(clean, "SIGTERM exits 0");
}

crate::backend_tests!(
    acknowledged_work_survives_kill_9_at_random_moments_with_a_flush_per_commit,
    acknowledged_work_survives_kill_9_at_random_moments_with_the_flush_barrier
);
