//! Several instances on one PostgreSQL database: each scheduler owned by one instance, the
//! others forwarding to it; fencing of a former owner; failover after SIGKILL with nothing lost
//! or popped twice; listeners competing on the shared queues, one effect per message; ColdStart
//! paging on the boefje scheduler's owner only; SQLite refusing a second instance.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::child::ChildApp;
use crate::helpers::*;

/// Short leases, so takeovers in these tests take about a second.
const LEASE_MS: &str = "1000";

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// The `/metrics` samples of `family` on `address`, as (labels, value).
async fn samples(client: &reqwest::Client, address: &str, family: &str) -> Vec<(String, f64)> {
    let page = client
        .get(format!("{address}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    page.lines()
        .filter(|l| l.starts_with(family) && !l.starts_with('#'))
        .filter_map(|l| {
            let (name_labels, value) = l.rsplit_once(' ')?;
            let labels = name_labels.strip_prefix(family)?;
            (labels.is_empty() || labels.starts_with('{'))
                .then(|| (labels.to_owned(), value.parse().unwrap_or(f64::NAN)))
        })
        .collect()
}

/// How many schedulers the instance at `address` owns.
async fn owned(client: &reqwest::Client, address: &str) -> usize {
    samples(client, address, "scheduler_ownership_owned")
        .await
        .iter()
        .filter(|(_, v)| *v == 1.0)
        .count()
}

/// Polls until `check` holds, up to `within`; answers how long it took.
async fn until<F, Fut>(within: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if check().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await; // polling interval, not a wait for a state
    }
}

fn start(uri: &str) -> ChildApp {
    ChildApp::start(uri, &[("SCHEDULER_LEASE_MS", LEASE_MS)])
}

/// Starts an instance on `uri` with `env` (and this module's short lease), off the runtime.
async fn start_with(uri: &str, env: &[(&'static str, String)]) -> ChildApp {
    let (uri, mut env) = (uri.to_owned(), env.to_vec());
    env.push(("SCHEDULER_LEASE_MS", LEASE_MS.into()));
    tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        ChildApp::start(&uri, &env)
    })
    .await
    .unwrap()
}

/// GETs `url` as JSON.
async fn get_json(client: &reqwest::Client, url: &str) -> Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

/// POSTs `body` to `url`; answers the JSON answer.
async fn post_json(client: &reqwest::Client, url: &str, body: &Value) -> Value {
    client
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn start_async(uri: &str) -> ChildApp {
    let uri = uri.to_owned();
    tokio::task::spawn_blocking(move || start(&uri))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_that_do_not_own_a_scheduler_forward_its_pushes_pops_and_patches() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let c = client();
    let a = start_async(&db.uri).await;
    a.wait_owning_all().await;
    let b = start_async(&db.uri).await;
    assert_eq!(owned(&c, &b.address).await, 0, "the schedulers stay with a");
    let owners = samples(&c, &b.address, "scheduler_ownership_owner_info").await;
    assert_eq!(owners.len(), 3, "{owners:?}");
    assert!(
        owners.iter().all(|(l, _)| l.contains(&a.address)),
        "b knows a as the owner of each: {owners:?}"
    );

    let work = boefje_push("org", "nmap", Some("Hostname|internet|a.example"), 3);
    let push_to = |at: &str| {
        c.post(format!("{at}/schedulers/boefje/push"))
            .json(&work)
            .send()
    };
    // A push to b is stored by a (201, the task as a answered it).
    let resp = push_to(&b.address).await.unwrap();
    assert_eq!(resp.status(), 201);
    let task: Value = resp.json().await.unwrap();
    assert_eq!(task["status"], "queued");
    // Both instances show the owner's heap on /schedulers.
    for at in [&a.address, &b.address] {
        let view = get_json(&c, &format!("{at}/schedulers/boefje")).await;
        assert_eq!(view["qsize"], 1, "{at}: {view}");
    }
    // The same work again, through b and straight to a: the same 409, header and detail.
    let mut answers = Vec::new();
    for at in [&b.address, &a.address] {
        let resp = push_to(at).await.unwrap();
        let status = resp.status().as_u16();
        let retry = resp.headers().get("retry-after").cloned();
        answers.push((status, retry, detail(resp).await));
    }
    assert_eq!(answers[0].0, 409);
    assert!(answers[0].2.contains("already queued"), "{answers:?}");
    assert_eq!(
        answers[0], answers[1],
        "forwarded and direct answers differ"
    );
    // A filtered pop through b gets it from a's heap, dispatched.
    let popped = post_json(
        &c,
        &format!("{}/schedulers/boefje/pop?limit=5", b.address),
        &json!({"filters": [{"column": "organisation", "operator": "eq", "value": "org"}]}),
    )
    .await;
    let results = popped["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{popped}");
    assert_eq!(results[0]["id"], task["id"]);
    assert_eq!(results[0]["status"], "dispatched");
    // Patches through b; a forbidden transition keeps its 409.
    let id = id_of(&task);
    for (status, code) in [("running", 200), ("completed", 200), ("running", 409)] {
        let resp = c
            .patch(format!("{}/tasks/{id}", b.address))
            .json(&json!({"status": status}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), code, "PATCH {status}");
    }
    // Reads are served by b from the database.
    let got: Value = c
        .get(format!("{}/tasks/{id}", b.address))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(got["status"], "completed");
    // Requests are counted where they are applied: a counts the forwarded pop, b does not, so
    // a sum over instances counts it once.
    let pops = |rows: Vec<(String, f64)>| -> f64 {
        rows.iter()
            .filter(|(l, _)| l.contains("boefje") && l.contains("\"pop\""))
            .map(|(_, v)| v)
            .sum()
    };
    let on_a = pops(samples(&c, &a.address, "scheduler_requests_total").await);
    let on_b = pops(samples(&c, &b.address, "scheduler_requests_total").await);
    assert_eq!(
        (on_a, on_b),
        (1.0, 0.0),
        "boefje pops counted on a and on b"
    );

    // A clean stop of a hands everything to b at once (well within a lease).
    let handover = Instant::now();
    assert!(
        tokio::task::spawn_blocking(move || a.terminate())
            .await
            .unwrap()
    );
    b.wait_owning_all().await;
    let took = handover.elapsed();
    eprintln!("clean handover: {took:?} from SIGTERM to b owning all three");
    assert!(
        took < Duration::from_secs(5),
        "b owns all after a's clean stop: {took:?}"
    );
    let takeovers = samples(&c, &b.address, "scheduler_ownership_takeovers_total").await;
    assert!(takeovers.iter().all(|(_, v)| *v == 1.0), "{takeovers:?}");
    let epochs = samples(&c, &b.address, "scheduler_ownership_epoch").await;
    assert!(epochs.iter().all(|(_, v)| *v == 2.0), "{epochs:?}");
    assert!(
        tokio::task::spawn_blocking(move || b.terminate())
            .await
            .unwrap()
    );
}

/// ColdStart's round count on `address`, from `/health`.
/// Each scheduler's owner row as stored: (scheduler, owner, epoch, lease running).
fn owner_rows(uri: &str) -> Vec<(String, String, i64, bool)> {
    use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl, sql_types};
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = sql_types::Text)]
        scheduler_id: String,
        #[diesel(sql_type = sql_types::Text)]
        owner: String,
        #[diesel(sql_type = sql_types::BigInt)]
        epoch: i64,
        #[diesel(sql_type = sql_types::Bool)]
        live: bool,
    }
    let mut c = PgConnection::establish(uri).unwrap();
    diesel::sql_query(
        "SELECT scheduler_id, COALESCE(owner, '') AS owner, epoch, expires_at > now() AS live \
         FROM scheduler_owners ORDER BY scheduler_id",
    )
    .load::<Row>(&mut c)
    .unwrap()
    .into_iter()
    .map(|r| (r.scheduler_id, r.owner, r.epoch, r.live))
    .collect()
}

/// Waits until `app` has read the three schedulers' owners.
async fn reads_the_owners(c: &reqwest::Client, app: &ChildApp) {
    until(Duration::from_secs(10), "the owners read", || async {
        samples(c, &app.address, "scheduler_ownership_owner_info")
            .await
            .len()
            == 3
    })
    .await;
}

/// Waits until every scheduler's lease runs.
async fn leases_running(uri: &str) {
    until(Duration::from_secs(10), "every lease running", || {
        let uri = uri.to_owned();
        async move {
            tokio::task::spawn_blocking(move || owner_rows(&uri).iter().all(|r| r.3))
                .await
                .unwrap()
        }
    })
    .await;
}

/// A batch that holds its scheduler's row for longer than a lease (the fence holds it `FOR
/// SHARE`; the rebuild of a million queued tasks takes about 3 s) delays that scheduler's
/// renewal alone. The owner keeps all three leases while another instance waits for any to
/// lapse: the others are renewed meanwhile, and the one held is renewed as soon as it is let
/// go, counted from then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_row_held_past_a_lease_costs_its_owner_no_lease() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let c = client();
    let a = start_async(&db.uri).await;
    a.wait_owning_all().await;
    let b = start_async(&db.uri).await;
    reads_the_owners(&c, &b).await;
    let before = owner_rows(&db.uri);
    assert!(before.iter().all(|r| r.2 == 1 && r.3), "{before:?}");

    // The boefje row held as a batch holds it, for three and a half leases.
    let uri = db.uri.clone();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let held = std::thread::spawn(move || {
        use diesel::{Connection, PgConnection, connection::SimpleConnection};
        let mut conn = PgConnection::establish(&uri).unwrap();
        conn.batch_execute(
            "BEGIN; SELECT epoch FROM scheduler_owners WHERE scheduler_id = 'boefje' FOR SHARE",
        )
        .unwrap();
        locked_tx.send(()).unwrap();
        // The stimulus: a batch this long, not a wait for a state.
        std::thread::sleep(Duration::from_millis(3_500));
        conn.batch_execute("COMMIT").unwrap();
    });
    locked_rx.recv().unwrap();
    // Throughout, the leases not held stay running: their renewals do not wait for boefje's.
    let mut samples_taken = 0;
    while !held.is_finished() {
        let uri = db.uri.clone();
        let rows = tokio::task::spawn_blocking(move || owner_rows(&uri))
            .await
            .unwrap();
        if held.is_finished() {
            break;
        }
        let lapsed: Vec<_> = rows.iter().filter(|r| r.0 != "boefje" && !r.3).collect();
        assert!(
            lapsed.is_empty(),
            "lapsed while boefje's row was held: {lapsed:?}"
        );
        samples_taken += 1;
        tokio::time::sleep(Duration::from_millis(100)).await; // sampling interval
    }
    held.join().unwrap();
    assert!(
        samples_taken > 10,
        "{samples_taken} samples during the hold"
    );

    // Once let go, a's renewal (queued before b could find the lease lapsed) applies first.
    leases_running(&db.uri).await;
    let after = owner_rows(&db.uri);
    assert_eq!(
        after.iter().map(|r| (&r.0, &r.1, r.2)).collect::<Vec<_>>(),
        before.iter().map(|r| (&r.0, &r.1, r.2)).collect::<Vec<_>>(),
        "the same owner under the same epochs: no lease changed hands"
    );
    assert_eq!(owned(&c, &a.address).await, 3);
    assert_eq!(owned(&c, &b.address).await, 0);
    let took = samples(&c, &b.address, "scheduler_ownership_takeovers_total").await;
    assert!(took.iter().all(|(_, v)| *v == 0.0), "b took: {took:?}");
}

/// A restarted owner's leases are renewed while its engines load their heaps: each load holds
/// its scheduler's row (the fence) for as long as it reads the tables (here held up by a lock on
/// `task_queue`, as a million queued tasks take seconds), and another instance waits for any lease
/// to lapse meanwhile. The owner keeps all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_renewed_while_a_restarted_owner_loads_its_heaps() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let c = client();
    let env = [
        ("SCHEDULER_INSTANCE_ID", "scheduler-a"),
        ("SCHEDULER_LEASE_MS", LEASE_MS),
    ];
    let first = ChildApp::start(&db.uri, &env);
    first.wait_owning_all().await;
    let b = start_async(&db.uri).await;
    reads_the_owners(&c, &b).await;
    first.kill_9();

    // The pending backlog's table held: the restarted owner's engines take their rows, then
    // wait to read it.
    let uri = db.uri.clone();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        use diesel::{Connection, PgConnection, connection::SimpleConnection};
        let mut conn = PgConnection::establish(&uri).unwrap();
        conn.batch_execute("BEGIN; LOCK TABLE task_queue IN ACCESS EXCLUSIVE MODE")
            .unwrap();
        locked_tx.send(()).unwrap();
        // The stimulus: a load this long, not a wait for a state.
        std::thread::sleep(Duration::from_millis(3_500));
        conn.batch_execute("COMMIT").unwrap();
    });
    locked_rx.recv().unwrap();
    let uri = db.uri.clone();
    let second = tokio::task::spawn_blocking(move || ChildApp::start(&uri, &env))
        .await
        .unwrap();
    holder.join().unwrap();
    leases_running(&db.uri).await;
    let rows = owner_rows(&db.uri);
    assert!(
        rows.iter().all(|r| r.1 == "scheduler-a" && r.2 == 2),
        "each lease taken once, by the restarted owner: {rows:?}"
    );
    assert_eq!(owned(&c, &second.address).await, 3);
    let took = samples(&c, &b.address, "scheduler_ownership_takeovers_total").await;
    assert!(took.iter().all(|(_, v)| *v == 0.0), "b took: {took:?}");
}

/// The idle-in-transaction timeout of a session opened at `uri` by the service.
fn idle_timeout_of(uri: &str) -> String {
    use diesel::{QueryableByName, RunQueryDsl, sql_types};
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = sql_types::Text)]
        v: String,
    }
    let target = kat_scheduler::storage::DbTarget::parse(uri).unwrap();
    let mut conn = kat_scheduler::storage::open(&target).unwrap();
    let kat_scheduler::storage::AnyConnection::Postgresql(pg) = &mut conn else {
        panic!("a PostgreSQL session");
    };
    diesel::sql_query("SELECT current_setting('idle_in_transaction_session_timeout') AS v")
        .load::<Setting>(pg)
        .unwrap()
        .remove(0)
        .v
}

/// A session of the service left idle inside a transaction is ended by the server after a
/// minute: such a session belongs to a process stopped mid-batch (a crashed or cut-off host,
/// whose socket the server would keep for hours), whose batch holds its scheduler's owner row
/// and so blocks every takeover. A timeout the URI sets is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_left_idle_in_a_transaction_are_ended_by_the_server() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    assert_eq!(idle_timeout_of(&db.uri), "1min");
    let sep = if db.uri.contains('?') { '&' } else { '?' };
    let own = format!(
        "{}{sep}options=-c%20idle_in_transaction_session_timeout%3D2500",
        db.uri
    );
    assert_eq!(idle_timeout_of(&own), "2500ms");
}

/// Two live instances given one name (a copied `SCHEDULER_INSTANCE_ID`) each look like the
/// other's dead predecessor. The one started second takes the leases once, as from a predecessor
/// (it cannot tell), and then they stay: a lease taken after an instance started is never its
/// predecessor's, so the first does not take them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_live_instances_of_one_name_do_not_take_each_others_leases_for_ever() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let env = [
        ("SCHEDULER_INSTANCE_ID", "twin"),
        ("SCHEDULER_LEASE_MS", LEASE_MS),
    ];
    let first = ChildApp::start(&db.uri, &env);
    first.wait_owning_all().await;
    let uri = db.uri.clone();
    let second = tokio::task::spawn_blocking(move || ChildApp::start(&uri, &env))
        .await
        .unwrap();
    // Three leases' time, sampled: about nine rounds of each instance.
    let mut highest = 0;
    for _ in 0..30 {
        let uri = db.uri.clone();
        let rows = tokio::task::spawn_blocking(move || owner_rows(&uri))
            .await
            .unwrap();
        highest = highest.max(rows.iter().map(|r| r.2).max().unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(100)).await; // sampling interval
    }
    assert!(
        highest <= 2,
        "epochs rose to {highest}: the leases kept changing hands"
    );
    let c = client();
    let owned_by = (
        owned(&c, &first.address).await,
        owned(&c, &second.address).await,
    );
    assert!(
        owned_by == (0, 3) || owned_by == (3, 0),
        "one instance owns all three: {owned_by:?}"
    );
}

/// An instance that is stopping takes no lease: here it drains a request still coming in while
/// the owner stops and releases its leases (a rolling restart of both). The leases stay free
/// for an instance that stays, never go to the one on its way out; it leaves holding nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_is_stopping_takes_no_lease_another_released() {
    use tokio::io::AsyncWriteExt;
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let c = client();
    let a = start_async(&db.uri).await;
    a.wait_owning_all().await;
    let b = start_with(&db.uri, &[("SCHEDULER_API_SHUTDOWN_TIMEOUT", "20".into())]).await;
    reads_the_owners(&c, &b).await;

    // b's drain waits for a request whose body is still on its way.
    let mut held = tokio::net::TcpStream::connect(b.address.trim_start_matches("http://"))
        .await
        .unwrap();
    held.write_all(
        b"POST /schedules HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n\
          Content-Length: 200\r\n\r\n{\"scheduler_id\": ",
    )
    .await
    .unwrap();
    let pid = b.pid().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    until(Duration::from_secs(10), "b draining", || async {
        !b.logged("shutting down: draining HTTP requests").is_empty()
    })
    .await;

    // a stops and releases all three; b's rounds run every third of a lease meanwhile.
    assert!(a.terminate(), "a stops cleanly");
    let released = owner_rows(&db.uri);
    assert!(released.iter().all(|r| r.1.is_empty()), "{released:?}");
    for _ in 0..20 {
        let uri = db.uri.clone();
        let rows = tokio::task::spawn_blocking(move || owner_rows(&uri))
            .await
            .unwrap();
        let taken: Vec<_> = rows.iter().filter(|r| !r.1.is_empty()).collect();
        assert!(
            taken.is_empty(),
            "taken by the stopping instance: {taken:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await; // sampling interval
    }
    assert!(
        b.logged("shutting down: draining HTTP requests").len() == 1
            && b.logged("stopped").is_empty(),
        "b was draining throughout"
    );
    drop(held);
    let b_stopped = tokio::task::spawn_blocking(move || b.stop_within(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(b_stopped, Ok(()));
    let after = owner_rows(&db.uri);
    assert!(after.iter().all(|r| r.1.is_empty()), "{after:?}");
}

async fn coldstart_rounds(client: &reqwest::Client, address: &str) -> u64 {
    get_json(client, &format!("{address}/health")).await["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["service"] == "coldstart")
        .and_then(|r| r["additional"]["rounds"].as_u64())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_owner_of_the_boefje_scheduler_pages_octopoes() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let catalogue = dir.path().join("catalogue.toml");
    std::fs::write(&catalogue, crate::coldstart::CATALOGUE).unwrap();
    let octopoes = crate::stubs::OctopoesState::default();
    octopoes.set("org1", crate::coldstart::hostnames("org1", 5));
    octopoes.set("org2", crate::coldstart::hostnames("org2", 7));
    let stub = octopoes.serve();
    let env: Vec<(&'static str, String)> = vec![
        ("OCTOPOES_API", stub.url.clone()),
        (
            "SCHEDULER_CATALOGUE_FILE",
            catalogue.to_string_lossy().into_owned(),
        ),
        ("SCHEDULER_COLDSTART_PAGE_SIZE", "2".into()),
        // Due again a second after a complete pass; the owner looks once a minute.
        ("SCHEDULER_COLDSTART_INTERVAL", "1".into()),
    ];
    let c = client();
    let a = start_with(&db.uri, &env).await;
    a.wait_owning_all().await;
    let b = start_with(&db.uri, &env).await;
    until(Duration::from_secs(20), "a's first round", || {
        let (c, addr) = (c.clone(), a.address.clone());
        async move { coldstart_rounds(&c, &addr).await >= 1 }
    })
    .await;
    let pages = |stub: &crate::stubs::Stub| {
        stub.seen()
            .iter()
            .filter(|r| r.path.ends_with("/objects"))
            .count()
    };
    // Pages of 2: 3 for org1's 5 objects, 4 for org2's 7.
    assert_eq!(pages(&stub), 7, "one pass per organisation, by a alone");
    assert_eq!(coldstart_rounds(&c, &b.address).await, 0);

    // The passes fall due a second after they completed, on the children's own clocks (which
    // a test cannot move); a's entry would look again only a minute after its first round.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // a stops; b takes the boefje scheduler, and with it the table whose entry starts rounds.
    assert!(
        tokio::task::spawn_blocking(move || a.terminate())
            .await
            .unwrap()
    );
    until(Duration::from_secs(20), "b's first round", || {
        let (c, addr) = (c.clone(), b.address.clone());
        async move { coldstart_rounds(&c, &addr).await >= 1 }
    })
    .await;
    assert_eq!(
        pages(&stub),
        14,
        "b paged each organisation once more, as due"
    );
    assert!(
        tokio::task::spawn_blocking(move || b.terminate())
            .await
            .unwrap()
    );
}

/// The listener's message counts on `address` for `queue`, by outcome.
async fn listener_counts(client: &reqwest::Client, address: &str, queue: &str) -> (f64, f64) {
    let all = samples(client, address, "scheduler_listener_messages_total").await;
    let count = |outcome: &str| {
        all.iter()
            .filter(|(l, _)| {
                l.contains(&format!("queue=\"{queue}\""))
                    && l.contains(&format!("outcome=\"{outcome}\""))
            })
            .map(|(_, v)| *v)
            .sum::<f64>()
    };
    (count("received"), count("acked"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_on_several_instances_compete_and_each_message_has_one_effect() {
    use lapin::BasicProperties;
    use lapin::options::{BasicPublishOptions, QueueDeleteOptions};

    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let Some(url) = rabbitmq().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let catalogue = dir.path().join("catalogue.toml");
    std::fs::write(
        &catalogue,
        "[[plugins]]\nid = \"kat_dns_normalize\"\ntype = \"normalizer\"\nconsumes = [\"boefje/dns-records\"]\nenabled = true\n",
    )
    .unwrap();
    let TestQueues {
        conn: _conn,
        channel,
        mutations,
        raw_files,
    } = TestQueues::declare(&url).await;
    let env: Vec<(&'static str, String)> = vec![
        ("QUEUE_URI", url.clone()),
        ("SCHEDULER_QUEUE_MUTATIONS", mutations.clone()),
        ("SCHEDULER_QUEUE_RAW_FILES", raw_files.clone()),
        // A small window, so the messages spread over both consumers.
        ("SCHEDULER_RABBITMQ_PREFETCH_COUNT", "5".into()),
        (
            "SCHEDULER_CATALOGUE_FILE",
            catalogue.to_string_lossy().into_owned(),
        ),
    ];
    let c = client();
    let a = start_with(&db.uri, &env).await;
    a.wait_owning_all().await;
    let b = start_with(&db.uri, &env).await;
    for app in [&a, &b] {
        until(Duration::from_secs(20), "the listener consumes", || {
            let (c, addr) = (c.clone(), app.address.clone());
            async move {
                samples(&c, &addr, "scheduler_listener_up")
                    .await
                    .iter()
                    .any(|(_, v)| *v == 1.0)
            }
        })
        .await;
    }

    // Raw files, each its own: one normalizer task each, pushed on a directly (it owns the
    // normalizer scheduler) or forwarded to it by b.
    const N: usize = 300;
    for i in 0..N {
        let body = json!({"event_id": "raw_file_received", "organization": "org1", "raw_data": {
            "id": uuid::Uuid::new_v4().to_string(),
            "boefje_meta": {"id": uuid::Uuid::new_v4().to_string(), "organization": "org1",
                            "boefje": {"id": "dns-records"}, "input_ooi": format!("Hostname|internet|h{i}.nl")},
            "mime_types": [{"value": "boefje/dns-records"}]}});
        channel
            .basic_publish(
                "".into(),
                raw_files.as_str().into(),
                BasicPublishOptions::default(),
                body.to_string().as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
    until(Duration::from_secs(60), "every message acked", || {
        let (c, a, b, q) = (
            c.clone(),
            a.address.clone(),
            b.address.clone(),
            raw_files.clone(),
        );
        async move {
            listener_counts(&c, &a, &q).await.1 + listener_counts(&c, &b, &q).await.1 >= N as f64
        }
    })
    .await;
    let (on_a, on_b) = (
        listener_counts(&c, &a.address, &raw_files).await,
        listener_counts(&c, &b.address, &raw_files).await,
    );
    eprintln!("raw files received/acked: a {on_a:?}, b {on_b:?}");
    assert!(
        on_a.1 > 0.0 && on_b.1 > 0.0,
        "both consumed: a {on_a:?}, b {on_b:?}"
    );
    assert_eq!(
        on_a.0 + on_b.0,
        N as f64,
        "each message delivered once, to one instance"
    );
    let tasks = format!("{}/tasks?scheduler_id=normalizer&limit=1", b.address);
    assert_eq!(
        get_json(&c, &tasks).await["count"],
        N,
        "one task per message"
    );

    for app in [a, b] {
        assert!(
            tokio::task::spawn_blocking(move || app.terminate())
                .await
                .unwrap()
        );
    }
    for q in [&mutations, &raw_files] {
        for name in [q.clone(), format!("{q}.dead")] {
            let _ = channel
                .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_owner_cannot_commit_after_its_lease_was_taken() {
    // The owner is "paused" (its renewals stopped mattering): another instance took the lease
    // in the database. Its next batch must find the new epoch and write nothing.
    let Some(app) = spawn_app_with(Backend::Postgres, |s| s.cluster.lease_ms = 60_000).await else {
        return;
    };
    let first = app
        .push_ok(
            "boefje",
            &boefje_push("org", "nmap", Some("Hostname|internet|x"), 3),
        )
        .await;
    take_over_in_the_database(&app).await;
    let resp = app
        .push(
            "boefje",
            &boefje_push("org", "nmap", Some("Hostname|internet|y"), 3),
        )
        .await;
    assert_eq!(resp.status(), 503, "{}", detail(resp).await);
    let resp = app.pop("boefje", Some(1), None).await;
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers().get("retry-after").unwrap(), "1");
    // Nothing of the refused push was written, and the first task is still queued.
    let listed: Value = app
        .get("/tasks?scheduler_id=boefje")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["count"], 1, "{listed}");
    assert_eq!(app.task(&id_of(&first)).await["status"], "queued");
    let boefje = samples(&app.client, &app.address, "scheduler_ownership_owned").await;
    assert!(
        boefje
            .iter()
            .any(|(l, v)| l.contains("boefje") && *v == 0.0),
        "the fenced instance no longer counts boefje as its own: {boefje:?}"
    );
}

/// Takes every scheduler from the app's instance in the database, as another instance would.
async fn take_over_in_the_database(app: &TestApp) {
    let db = app.db.uri.clone();
    tokio::task::spawn_blocking(move || {
        use diesel::{Connection, connection::SimpleConnection};
        let mut conn = diesel::PgConnection::establish(&db).unwrap();
        conn.batch_execute(
            "UPDATE scheduler_owners SET owner = 'elsewhere', address = 'http://127.0.0.1:9', \
             epoch = epoch + 1, expires_at = now() + interval '1 hour'",
        )
        .unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_owners_pop_and_patch_write_nothing_after_its_lease_was_taken() {
    // Pops and patches are written as one statement with the fence inside it (not the
    // transaction a push takes): the first batch after the takeover is a patch in one app and
    // a pop in the other, and neither may write.
    for first in ["patch", "pop"] {
        let Some(app) = spawn_app_with(Backend::Postgres, |s| s.cluster.lease_ms = 60_000).await
        else {
            return;
        };
        let popped = app
            .push_ok(
                "boefje",
                &boefje_push("org", "nmap", Some("Hostname|internet|x"), 3),
            )
            .await;
        let waiting = app
            .push_ok(
                "boefje",
                &boefje_push("org", "nmap", Some("Hostname|internet|y"), 5),
            )
            .await;
        let resp = app.pop("boefje", Some(1), None).await;
        assert_eq!(resp.status(), 200);
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(answer["results"][0]["id"], popped["id"], "{answer}");
        take_over_in_the_database(&app).await;
        let resp = match first {
            "patch" => {
                app.patch_task(&id_of(&popped), &json!({"status": "completed"}))
                    .await
            }
            _ => app.pop("boefje", Some(1), None).await,
        };
        assert_eq!(resp.status(), 503, "{first}: {}", detail(resp).await);
        assert_eq!(
            app.task(&id_of(&popped)).await["status"],
            "dispatched",
            "{first}"
        );
        assert_eq!(
            app.task(&id_of(&waiting)).await["status"],
            "queued",
            "{first}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_on_one_sqlite_file_refuses_to_start() {
    let Some(app) = spawn_app(Backend::Sqlite).await else {
        return;
    };
    let settings = test_settings(&app.db.uri);
    let clock = Arc::new(kat_scheduler::clock::ManualClock::new(start_time()));
    let err = match kat_scheduler::startup::Application::build(settings, clock).await {
        Ok(_) => panic!("a second instance started on the same SQLite file"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("another kat-scheduler instance"), "{err}");
    assert!(
        err.contains("PostgreSQL"),
        "the message says what to do: {err}"
    );
    // Nor does `migrate` run under it: its statements would hold the file's one write lock
    // under the service's engines.
    let uri = app.db.uri.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(crate::child::binary())
            .arg("migrate")
            .env("SCHEDULER_DB_URI", uri)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "migrate ran beside the service: {said}"
    );
    assert!(said.contains("another kat-scheduler instance"), "{said}");
    // The first one serves on.
    app.push_ok("boefje", &boefje_push("org", "nmap", None, 3))
        .await;
}

/// What the clients were answered 2xx.
#[derive(Default)]
struct Seen {
    pushes: Vec<String>,
    pops: Vec<String>,
    refused: usize,
}

/// Pushes and pops spread over `addresses` until `stop`; a 503 (ownership moving, instance
/// gone) is retried on the next instance, as a client behind a load balancer would.
async fn load(
    addresses: Arc<Mutex<Vec<String>>>,
    seen: Arc<Mutex<Seen>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let c = client();
    let mut workers = Vec::new();
    for w in 0..4usize {
        let (c, addresses, seen, stop) = (c.clone(), addresses.clone(), seen.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.is_cancelled() {
                n += 1;
                let address = {
                    let a = addresses.lock().unwrap();
                    a[(w + n) % a.len()].clone()
                };
                let resp = if w % 2 == 0 {
                    let body =
                        boefje_push("cluster", &format!("w{w}-n{n}"), None, 2 + (n % 40) as i64);
                    c.post(format!("{address}/schedulers/boefje/push"))
                        .json(&body)
                        .send()
                        .await
                } else {
                    c.post(format!(
                        "{address}/schedulers/boefje/pop?limit={}",
                        1 + n % 3
                    ))
                    .send()
                    .await
                };
                let Ok(resp) = resp else {
                    seen.lock().unwrap().refused += 1;
                    continue;
                };
                if !resp.status().is_success() {
                    seen.lock().unwrap().refused += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await; // a client's backoff
                    continue;
                }
                let Ok(body) = resp.json::<Value>().await else {
                    continue;
                };
                let mut s = seen.lock().unwrap();
                if w % 2 == 0 {
                    s.pushes.push(id_of(&body));
                } else {
                    s.pops.extend(result_ids(&body));
                }
            }
        }));
    }
    for w in workers {
        let _ = w.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_killed_mid_load_is_replaced_and_nothing_is_lost_or_popped_twice() {
    const KILLS: usize = 3;
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let c = client();
    let mut apps = Vec::new();
    for _ in 0..3 {
        apps.push(start_async(&db.uri).await);
    }
    let addresses = Arc::new(Mutex::new(
        apps.iter().map(|a| a.address.clone()).collect::<Vec<_>>(),
    ));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = tokio_util::sync::CancellationToken::new();
    let driver = tokio::spawn(load(addresses.clone(), seen.clone(), stop.clone()));

    let mut takeovers = Vec::new();
    for kill in 0..KILLS {
        // Let the load run on the current owner for a moment.
        let before = seen.lock().unwrap().pops.len();
        until(Duration::from_secs(20), "pops flow", || {
            let seen = seen.clone();
            async move { seen.lock().unwrap().pops.len() > before + 20 }
        })
        .await;
        let mut owner = None;
        for (i, app) in apps.iter().enumerate() {
            let o = samples(&c, &app.address, "scheduler_ownership_owned").await;
            if o.iter().any(|(l, v)| l.contains("boefje") && *v == 1.0) {
                owner = Some(i);
            }
        }
        let owner = owner.expect("some instance owns boefje");
        let victim = apps.remove(owner);
        let killed_at = Instant::now();
        tokio::task::spawn_blocking(move || victim.kill_9())
            .await
            .unwrap();
        // Takeover: a survivor owns boefje and serves a pop.
        let survivors: Vec<String> = apps.iter().map(|a| a.address.clone()).collect();
        until(
            Duration::from_secs(10),
            "a survivor takes boefje over",
            || {
                let (c, survivors) = (c.clone(), survivors.clone());
                async move {
                    for s in &survivors {
                        if let Ok(r) = c
                            .post(format!("{s}/schedulers/boefje/pop?limit=1"))
                            .send()
                            .await
                            && r.status() == 200
                        {
                            // This pop's tasks count as acknowledged too.
                            return true;
                        }
                    }
                    false
                }
            },
        )
        .await;
        let took = killed_at.elapsed();
        eprintln!("kill {kill}: boefje served again {took:?} after SIGKILL of its owner");
        takeovers.push(took);
        // Restart the killed one; it joins as a non-owner.
        let fresh = start_async(&db.uri).await;
        let mut a = addresses.lock().unwrap();
        *a = apps.iter().map(|x| x.address.clone()).collect();
        a.push(fresh.address.clone());
        drop(a);
        apps.push(fresh);
    }
    stop.cancel();
    driver.await.unwrap();

    // Drain through one instance; then check what the clients were answered.
    let (pushed, popped, refused) = {
        let s = seen.lock().unwrap();
        (s.pushes.clone(), s.pops.clone(), s.refused)
    };
    let unique: HashSet<String> = popped.iter().cloned().collect();
    assert_eq!(unique.len(), popped.len(), "a task was popped twice");
    let drain_at = apps[0].address.clone();
    let drained = crate::crash::drain(&c, &drain_at, &unique, "cluster").await;
    let unanswered =
        crate::crash::dispatched_unanswered(&c, &drain_at, &pushed, (&unique, &drained), "cluster")
            .await;
    eprintln!(
        "{} pushes and {} pops acknowledged, {refused} answered non-2xx or unreachable, {} drained, {unanswered} dispatched without an answer; takeovers {takeovers:?}",
        pushed.len(),
        popped.len(),
        drained.len()
    );
    assert!(!pushed.is_empty() && !popped.is_empty());
    assert!(
        takeovers.iter().all(|t| *t < Duration::from_secs(5)),
        "failover within 5 s: {takeovers:?}"
    );
    for app in apps {
        assert!(
            tokio::task::spawn_blocking(move || app.terminate())
                .await
                .unwrap()
        );
    }
}

/// OpenKAT's runners never retry a `PATCH`: one sent the moment the scheduler's owner is
/// killed (its lease not yet lapsed, the instance gone) waits for the new owner and is applied,
/// where it was answered 503 and the task's `running` or `completed` was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patch_sent_as_the_owner_is_killed_waits_for_the_new_owner() {
    let Some(db) = TestDb::create(Backend::Postgres).await else {
        return;
    };
    let c = client();
    let mut apps = vec![start_async(&db.uri).await, start_async(&db.uri).await];
    let owner = loop {
        let mut found = None;
        for (i, app) in apps.iter().enumerate() {
            let o = samples(&c, &app.address, "scheduler_ownership_owned").await;
            if o.iter().any(|(l, v)| l.contains("boefje") && *v == 1.0) {
                found = Some(i);
            }
        }
        if let Some(i) = found {
            break i;
        }
        tokio::time::sleep(Duration::from_millis(20)).await; // polling, not a wait for a state
    };
    let survivor = apps[1 - owner].address.clone();
    let body = boefje_push("org1", "dns-records", Some("Hostname|internet|k.nl"), 3);
    let pushed = post_json(&c, &format!("{survivor}/schedulers/boefje/push"), &body).await;
    let id = id_of(&pushed);
    let popped = post_json(
        &c,
        &format!("{survivor}/schedulers/boefje/pop?limit=1"),
        &Value::Null,
    )
    .await;
    assert_eq!(popped["results"][0]["id"], id.as_str(), "{popped}");

    let victim = apps.remove(owner);
    tokio::task::spawn_blocking(move || victim.kill_9())
        .await
        .unwrap();
    for status in ["running", "completed"] {
        let resp = c
            .patch(format!("{survivor}/tasks/{id}"))
            .json(&json!({"status": status}))
            .send()
            .await
            .unwrap();
        let code = resp.status();
        assert_eq!(code, 200, "{status}: {}", resp.text().await.unwrap());
    }
    let task: Value = get_json(&c, &format!("{survivor}/tasks/{id}")).await;
    assert_eq!(task["status"], "completed", "{task}");
    for app in apps {
        tokio::task::spawn_blocking(move || app.terminate())
            .await
            .unwrap();
    }
}
