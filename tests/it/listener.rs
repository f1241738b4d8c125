//! The AMQP listener against the real RabbitMQ: events in, the right tasks out, acked once
//! committed, poison dead-lettered without stalling the queue. Each test has queues of its own.

use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::*;
use crate::stubs::*;

const CATALOGUE: &str = r#"
[[plugins]]
id = "dns-records"
type = "boefje"
consumes = ["Hostname"]
scan_level = 1
enabled = true
oci_image = "ghcr.io/minvws/openkat/dns-records:latest"

[[plugins]]
id = "on-create-only"
type = "boefje"
consumes = ["Hostname"]
scan_level = 1
enabled = true
run_on = ["create"]

[[plugins]]
id = "intrusive"
type = "boefje"
consumes = ["Hostname"]
scan_level = 3
enabled = true

[[plugins]]
id = "disabled"
type = "boefje"
consumes = ["Hostname"]
scan_level = 0
enabled = false

[[plugins]]
id = "nmap"
type = "boefje"
consumes = ["IPAddressV4"]
scan_level = 1
enabled = true

[[plugins]]
id = "kat_dns_normalize"
type = "normalizer"
consumes = ["boefje/dns-records", "text/plain"]
enabled = true
"#;

/// An app listening on queues of its own, and a channel to publish on them.
struct Setup {
    app: TestApp,
    channel: Channel,
    _conn: Connection,
    mutations: String,
    raw_files: String,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn new(backend: Backend, prefetch: u16) -> Option<Setup> {
        Self::with(backend, prefetch, |_| {}).await
    }

    async fn with(
        backend: Backend,
        prefetch: u16,
        tweak: impl FnOnce(&mut kat_scheduler::config::Settings) + Send + 'static,
    ) -> Option<Setup> {
        Self::on_queues(backend, prefetch, Some(FieldTable::default()), tweak).await
    }

    /// The same, its queues declared beforehand with `arguments`, as an operator may have
    /// (`None`: not declared at all, as on a fresh RabbitMQ).
    async fn on_queues(
        backend: Backend,
        prefetch: u16,
        arguments: Option<FieldTable>,
        tweak: impl FnOnce(&mut kat_scheduler::config::Settings) + Send + 'static,
    ) -> Option<Setup> {
        let url = rabbitmq().await?;
        let dir = tempfile::tempdir().unwrap();
        let catalogue = dir.path().join("catalogue.toml");
        std::fs::write(&catalogue, CATALOGUE).unwrap();
        let TestQueues {
            conn,
            channel,
            mutations,
            raw_files,
        } = match arguments {
            Some(arguments) => TestQueues::declare_with(&url, arguments).await,
            None => TestQueues::named(&url).await,
        };
        let (m, r, c) = (mutations.clone(), raw_files.clone(), catalogue.clone());
        let app = spawn_app_with(backend, move |s| {
            s.listener.uri = url;
            s.listener.mutations_queue = m;
            s.listener.raw_files_queue = r;
            s.listener.prefetch = prefetch;
            s.catalogue.file = c.to_string_lossy().into_owned();
            tweak(s);
        })
        .await?;
        Some(Setup {
            app,
            channel,
            _conn: conn,
            mutations,
            raw_files,
            _dir: dir,
        })
    }

    async fn publish(&self, queue: &str, body: &[u8]) {
        self.channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    async fn mutation(&self, value: Value) {
        self.publish(&self.mutations.clone(), value.to_string().as_bytes())
            .await;
    }

    /// Waits (on the listener's own signal, not a clock) until `n` messages were handled.
    /// How many batches of each queue were handed back, from the listener's `/health` row.
    async fn retried(&self) -> Vec<u64> {
        let listener = self.app.service_health("listener").await;
        listener["additional"]["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["retried"].as_u64().unwrap())
            .collect()
    }

    async fn handled(&self, n: u64) {
        tokio::time::timeout(Duration::from_secs(30), self.app.listener.wait_handled(n))
            .await
            .expect("the listener handles the messages");
    }

    /// The first events of the app: `objects` of org1 created, and their first runs (two
    /// plugins each, never ran: priority 2) finished, so the next planning has a history.
    async fn finish_first_runs(&self, objects: &[&str]) {
        for r in objects {
            self.mutation(object("create", "org1", r, "Hostname", 1))
                .await;
        }
        self.handled(objects.len() as u64).await;
        let first = self.app.pop_many("boefje", 2 * objects.len(), None).await;
        assert_eq!(first.len(), 2 * objects.len());
        for t in first {
            assert_eq!(t["priority"], 2);
            let done = self
                .app
                .patch_task(&id_of(&t), &json!({"status": "completed"}))
                .await;
            assert_eq!(done.status(), reqwest::StatusCode::OK);
        }
    }

    async fn boefje_ids(&self, org: &str) -> Vec<String> {
        let mut ids: Vec<String> = self
            .app
            .boefje_tasks(org, "queued")
            .await
            .iter()
            .map(|t| t["data"]["boefje"]["id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    }

    /// The first message in `queue`'s dead-letter queue, with its `x-kat-reason`.
    async fn first_dead_letter(&self, queue: &str) -> (Vec<u8>, String) {
        let mut dead = self
            .channel
            .basic_consume(
                format!("{queue}.dead").as_str().into(),
                "test".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        let first = tokio::time::timeout(Duration::from_secs(10), dead.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let headers = first.properties.headers().clone().unwrap();
        let reason = match headers.inner().get("x-kat-reason") {
            Some(AMQPValue::LongString(r)) => r.to_string(),
            other => panic!("no reason: {other:?}"),
        };
        (first.data, reason)
    }

    async fn cleanup(self) {
        for q in [&self.mutations, &self.raw_files] {
            for name in [q.clone(), format!("{q}.dead")] {
                let _ = self
                    .channel
                    .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
        }
    }
}

/// Katalogus with `plugins` for each of `orgs`, failing for the organisation `broken`, and an
/// app whose listener (prefetch `prefetch`) parks events that fail for 60 s. The stub goes with
/// the setup: dropped, it stops answering.
async fn parking_setup(
    backend: Backend,
    prefetch: u16,
    orgs: &[&str],
    plugins: Vec<Value>,
) -> Option<(Setup, KatalogusState, Stub)> {
    parking_setup_with(backend, prefetch, orgs, plugins, |_| {}).await
}

/// The same, with `tweak` applied to the app's settings.
async fn parking_setup_with(
    backend: Backend,
    prefetch: u16,
    orgs: &[&str],
    plugins: Vec<Value>,
    tweak: impl FnOnce(&mut kat_scheduler::config::Settings) + Send + 'static,
) -> Option<(Setup, KatalogusState, Stub)> {
    let katalogus = KatalogusState::default();
    for org in orgs {
        katalogus
            .plugins
            .lock()
            .unwrap()
            .insert((*org).into(), plugins.clone());
    }
    katalogus.failing.lock().unwrap().insert("broken".into());
    let stub = katalogus.serve();
    let url = stub.url.clone();
    let s = Setup::with(backend, prefetch, move |s| {
        s.clients.katalogus_api = url;
        s.listener.park_after_secs = 60;
        tweak(s);
    })
    .await?;
    Some((s, katalogus, stub))
}

impl Setup {
    /// Waits (on the listener's own signal) until `n` messages in all were parked.
    async fn parked(&self, n: u64) {
        tokio::time::timeout(Duration::from_secs(30), self.app.listener.wait_parked(n))
            .await
            .expect("the messages are parked");
    }

    /// Waits until `n` messages in all were handed back.
    async fn handed_back(&self, n: u64) {
        tokio::time::timeout(Duration::from_secs(30), self.app.listener.wait_retried(n))
            .await
            .expect("the messages are handed back");
    }

    /// `org`'s boefje tasks as (object, status), sorted, and the page they were read from.
    async fn task_states(&self, org: &str) -> (Vec<(String, String)>, Value) {
        let tasks: Value = self
            .app
            .get(&format!(
                "/tasks?scheduler_id=boefje&organisation={org}&limit=10"
            ))
            .await
            .json()
            .await
            .unwrap();
        let mut seen: Vec<(String, String)> = tasks["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["data"]["input_ooi"].as_str().unwrap().to_owned(),
                    t["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        seen.sort();
        (seen, tasks)
    }

    /// What the cron entry `parked` of `component`'s table did on a tick now.
    async fn redrive(&self, component: kat_scheduler::domain::SchedulerId) -> String {
        self.app.tick(component).await.entries["parked"]
            .summary
            .clone()
    }
}

fn object(op: &str, org: &str, reference: &str, object_type: &str, level: i64) -> Value {
    json!({"operation": op, "primary_key": reference, "client_id": org,
        "value": {"primary_key": reference, "object_type": object_type,
                  "scan_profile": {"level": level, "reference": reference, "scan_profile_type": "declared"}}})
}

async fn an_object_event_becomes_the_tasks_its_plugins_allow(backend: Backend) {
    let Some(s) = Setup::new(backend, 100).await else {
        return;
    };
    s.mutation(object(
        "create",
        "org1",
        "Hostname|internet|a.nl",
        "Hostname",
        2,
    ))
    .await;
    s.handled(1).await;
    // Level 2: not `intrusive` (3), not the disabled one, not `nmap` (another type).
    assert_eq!(
        s.boefje_ids("org1").await,
        vec!["dns-records", "on-create-only"]
    );
    let page: Value = s
        .app
        .get("/tasks?scheduler_id=boefje")
        .await
        .json()
        .await
        .unwrap();
    let task = &page["results"][0];
    assert_eq!(task["data"]["input_ooi"], "Hostname|internet|a.nl");
    assert_eq!(task["data"]["organization"], "org1");
    // Work a plugin runs on a schedule gets one (mula's post_push); run_on work does not.
    for t in page["results"].as_array().unwrap() {
        let scheduled = t["schedule_id"].is_string();
        assert_eq!(scheduled, t["data"]["boefje"]["id"] == "dns-records", "{t}");
    }
    let schedules: Value = s
        .app
        .get("/schedules?scheduler_id=boefje")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(schedules["count"], 1);
    // The same event again, and an update: nothing new (the work waits; run_on is create only).
    s.mutation(object(
        "create",
        "org1",
        "Hostname|internet|a.nl",
        "Hostname",
        2,
    ))
    .await;
    s.mutation(object(
        "update",
        "org1",
        "Hostname|internet|a.nl",
        "Hostname",
        2,
    ))
    .await;
    s.handled(3).await;
    assert_eq!(
        s.boefje_ids("org1").await,
        vec!["dns-records", "on-create-only"]
    );
    let listener = s.app.service_health("listener").await;
    assert_eq!(listener["additional"]["state"], "consuming");
    assert_eq!(listener["additional"]["queues"][0]["acked"], 3);
    let metrics = s.app.get("/metrics").await.text().await.unwrap();
    let acked = format!(
        "scheduler_listener_messages_total{{queue=\"{}\",outcome=\"acked\"}} 3\n",
        s.mutations
    );
    assert!(metrics.contains(&acked), "{metrics}");
    assert!(metrics.contains("scheduler_listener_up 1\n"), "{metrics}");
    s.cleanup().await;
}

async fn poison_is_dead_lettered_and_never_stalls_the_queue(backend: Backend) {
    // A prefetch window of 5 and 20 poison messages: mula would stall on the first five.
    let Some(s) = Setup::new(backend, 5).await else {
        return;
    };
    for i in 0..20 {
        let body = if i % 2 == 0 {
            b"not json".to_vec()
        } else {
            json!({"operation": "update", "primary_key": "x", "client_id": "org1"})
                .to_string()
                .into_bytes()
        };
        s.publish(&s.mutations.clone(), &body).await;
    }
    s.mutation(object(
        "create",
        "org2",
        "Hostname|internet|b.nl",
        "Hostname",
        1,
    ))
    .await;
    s.handled(21).await;
    assert_eq!(
        s.boefje_ids("org2").await,
        vec!["dns-records", "on-create-only"]
    );
    // The dead letters carry the reason.
    let (first, reason) = s.first_dead_letter(&s.mutations).await;
    assert_eq!(first, b"not json");
    assert!(reason.starts_with("not JSON"), "{reason}");
    let metrics = s.app.get("/metrics").await.text().await.unwrap();
    let dead = format!(
        "scheduler_listener_messages_total{{queue=\"{}\",outcome=\"dead_lettered\"}} 20\n",
        s.mutations
    );
    assert!(metrics.contains(&dead), "{metrics}");
    s.cleanup().await;
}

/// An operator declared the queues and their dead-letter queues as quorum queues (replicated,
/// for a RabbitMQ cluster) before the scheduler first started: the listener consumes them as
/// they are. Declared again without that argument, RabbitMQ refuses the declaration (406
/// PRECONDITION_FAILED) and closes the channel, so the listener could never start.
async fn queues_an_operator_declared_with_arguments_are_consumed_as_they_are(backend: Backend) {
    let mut quorum = FieldTable::default();
    quorum.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let Some(s) = Setup::on_queues(backend, 5, Some(quorum), |_| {}).await else {
        return;
    };
    s.mutation(object(
        "create",
        "org1",
        "Hostname|internet|a.nl",
        "Hostname",
        2,
    ))
    .await;
    s.publish(&s.mutations.clone(), b"not json").await;
    s.handled(2).await;
    assert_eq!(
        s.boefje_ids("org1").await,
        vec!["dns-records", "on-create-only"]
    );
    let (body, _) = s.first_dead_letter(&s.mutations.clone()).await;
    assert_eq!(body, b"not json", "dead-lettered into the quorum queue");
    s.cleanup().await;
}

/// A fresh RabbitMQ, where nothing declared the queues: the listener declares them and their
/// dead-letter queues (durable) and consumes them.
async fn queues_nobody_declared_are_declared_and_consumed(backend: Backend) {
    let Some(s) = Setup::on_queues(backend, 5, None, |_| {}).await else {
        return;
    };
    tokio::time::timeout(Duration::from_secs(30), s.app.listener.wait_sessions(1))
        .await
        .expect("the listener starts consuming");
    let probe = s._conn.create_channel().await.unwrap();
    for q in [&s.mutations, &s.raw_files] {
        for name in [q.clone(), format!("{q}.dead")] {
            let passive = lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            probe
                .queue_declare(name.as_str().into(), passive, FieldTable::default())
                .await
                .unwrap_or_else(|e| panic!("{name} was declared: {e}"));
        }
    }
    s.mutation(object(
        "create",
        "org1",
        "Hostname|internet|a.nl",
        "Hostname",
        2,
    ))
    .await;
    s.publish(&s.mutations.clone(), b"not json").await;
    s.handled(2).await;
    assert_eq!(
        s.boefje_ids("org1").await,
        vec!["dns-records", "on-create-only"]
    );
    let (body, _) = s.first_dead_letter(&s.mutations.clone()).await;
    assert_eq!(body, b"not json");
    s.cleanup().await;
}

/// The dead-letter queue deleted while the listener runs (an operator clearing it): a poison
/// message published there went nowhere, confirmed all the same, and its original was acked
/// and lost. The queue is declared again and the message kept.
async fn a_poison_message_is_kept_when_its_dead_letter_queue_was_deleted(backend: Backend) {
    let Some(s) = Setup::new(backend, 5).await else {
        return;
    };
    s.mutation(object(
        "create",
        "org1",
        "Hostname|internet|a.nl",
        "Hostname",
        1,
    ))
    .await;
    s.handled(1).await;
    let dead = format!("{}.dead", s.mutations);
    s.channel
        .queue_delete(dead.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    s.publish(&s.mutations.clone(), b"not json").await;
    s.handled(2).await;
    let got = s
        .channel
        .basic_get(
            dead.as_str().into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
        .expect("the poison message is in the dead-letter queue, declared again");
    assert_eq!(got.delivery.data, b"not json");
    s.cleanup().await;
}

async fn a_delete_cancels_that_organisations_waiting_tasks_for_the_object_only(backend: Backend) {
    let delete = json!({"operation": "delete", "primary_key": "Hostname|internet|shared.nl",
        "client_id": "org1"});
    deleting_cancels_that_organisations_waiting_tasks(backend, delete).await;
}

/// Octopoes' delete may carry the deleted object as `value`: still a delete.
async fn a_delete_carrying_its_object_cancels_as_one_without(backend: Backend) {
    let delete = object(
        "delete",
        "org1",
        "Hostname|internet|shared.nl",
        "Hostname",
        1,
    );
    deleting_cancels_that_organisations_waiting_tasks(backend, delete).await;
}

/// How many of org1's boefje tasks have `status`.
async fn count_of(s: &Setup, status: &str) -> Value {
    s.app
        .get(&format!(
            "/tasks?scheduler_id=boefje&organisation=org1&status={status}&limit=100"
        ))
        .await
        .json::<Value>()
        .await
        .unwrap()["count"]
        .clone()
}

/// With several instances an object's events are not ordered between them: a delete may be
/// applied after the object's re-creation. So a delete is checked with Octopoes first: while it
/// holds the object, the delete cancels nothing and marks nothing gone; once it says not found,
/// or while it cannot answer (the delete is then its last word), the delete applies.
async fn a_delete_of_an_object_octopoes_still_holds_cancels_nothing(backend: Backend) {
    let reference = "Hostname|internet|again.nl";
    let octopoes = OctopoesState::default();
    octopoes.set("org1", vec![octopoes_object(reference, "Hostname", 1)]);
    let o = octopoes.serve();
    let ou = o.url.clone();
    let Some(s) = Setup::with(backend, 100, move |s| s.clients.octopoes_api = ou).await else {
        return;
    };
    s.mutation(object("create", "org1", reference, "Hostname", 1))
        .await;
    s.handled(1).await;
    assert_eq!(count_of(&s, "queued").await, 2);

    // The delete of an earlier life of the object, applied after its re-creation.
    s.mutation(json!({"operation": "delete", "primary_key": reference, "client_id": "org1"}))
        .await;
    s.handled(2).await;
    assert_eq!(count_of(&s, "cancelled").await, 0, "nothing cancelled");
    assert_eq!(count_of(&s, "queued").await, 2);
    assert!(
        o.seen()
            .iter()
            .any(|r| r.path == "/org1/object" && r.param("reference") == Some(reference)),
        "Octopoes asked: {:?}",
        o.seen()
    );

    // Deleted in Octopoes: the delete applies.
    let other = "Hostname|internet/other-again.nl";
    octopoes.set("org1", vec![octopoes_object(other, "Hostname", 1)]);
    s.mutation(json!({"operation": "delete", "primary_key": reference, "client_id": "org1"}))
        .await;
    s.handled(3).await;
    assert_eq!(count_of(&s, "cancelled").await, 2);

    // Octopoes cannot answer: the delete is its last word, and applies.
    s.mutation(object("create", "org1", other, "Hostname", 1))
        .await;
    s.handled(4).await;
    octopoes.fail_lookups(true);
    s.mutation(json!({"operation": "delete", "primary_key": other, "client_id": "org1"}))
        .await;
    s.handled(5).await;
    assert_eq!(count_of(&s, "cancelled").await, 4);
    s.cleanup().await;
}

/// A delete that Octopoes contradicts (the object was created again since) still weighs the work
/// the object's earlier life left waiting against the level Octopoes holds now: a re-created
/// object starts with a lower profile, and work its old level permitted must not run on it.
async fn a_delete_of_an_object_recreated_at_a_lower_level_cancels_what_it_no_longer_permits(
    backend: Backend,
) {
    let reference = "Hostname|internet|lower.nl";
    let octopoes = OctopoesState::default();
    octopoes.set("org1", vec![octopoes_object(reference, "Hostname", 3)]);
    let o = octopoes.serve();
    let ou = o.url.clone();
    let Some(s) = Setup::with(backend, 100, move |s| s.clients.octopoes_api = ou).await else {
        return;
    };
    s.mutation(object("create", "org1", reference, "Hostname", 3))
        .await;
    s.handled(1).await;
    assert_eq!(
        s.boefje_ids("org1").await,
        vec!["dns-records", "intrusive", "on-create-only"]
    );

    // Deleted and created again at level 1; the delete comes after the re-creation.
    octopoes.set("org1", vec![octopoes_object(reference, "Hostname", 1)]);
    s.mutation(json!({"operation": "delete", "primary_key": reference, "client_id": "org1"}))
        .await;
    s.handled(2).await;
    assert_eq!(
        s.boefje_ids("org1").await,
        vec!["dns-records", "on-create-only"],
        "the level-3 boefje's task is cancelled, the rest kept"
    );
    assert_eq!(count_of(&s, "cancelled").await, 1);

    // Octopoes' answer carries no scan profile: it says nothing of the level, and nothing more
    // is cancelled.
    octopoes.set(
        "org1",
        vec![json!({"object_type": "Hostname", "primary_key": reference,
                    "scan_profile": null, "name": "lower.nl"})],
    );
    s.mutation(json!({"operation": "delete", "primary_key": reference, "client_id": "org1"}))
        .await;
    s.handled(3).await;
    assert_eq!(
        s.boefje_ids("org1").await,
        vec!["dns-records", "on-create-only"],
        "a level not known cancels nothing"
    );
    assert_eq!(count_of(&s, "cancelled").await, 1);
    s.cleanup().await;
}

async fn deleting_cancels_that_organisations_waiting_tasks(backend: Backend, delete: Value) {
    let Some(s) = Setup::new(backend, 100).await else {
        return;
    };
    let reference = "Hostname|internet|shared.nl";
    s.mutation(object("create", "org1", reference, "Hostname", 1))
        .await;
    s.mutation(object("create", "org2", reference, "Hostname", 1))
        .await;
    s.mutation(object(
        "create",
        "org1",
        "Hostname|internet/other.nl",
        "Hostname",
        1,
    ))
    .await;
    s.handled(3).await;
    s.mutation(delete).await;
    s.handled(4).await;
    let cancelled: Value = s
        .app
        .get("/tasks?scheduler_id=boefje&status=cancelled&limit=100")
        .await
        .json()
        .await
        .unwrap();
    let cancelled = cancelled["results"].as_array().unwrap();
    assert_eq!(cancelled.len(), 2, "org1's two tasks for the object");
    assert!(
        cancelled
            .iter()
            .all(|t| t["organisation"] == "org1" && t["data"]["input_ooi"] == reference)
    );
    assert_eq!(s.boefje_ids("org2").await.len(), 2, "org2's are untouched");
    assert_eq!(
        s.boefje_ids("org1").await.len(),
        2,
        "org1's other object untouched"
    );
    s.cleanup().await;
}

async fn a_raw_file_becomes_normalizer_tasks_unless_it_is_an_error(backend: Backend) {
    let Some(s) = Setup::new(backend, 100).await else {
        return;
    };
    let raw = |mimes: Value| {
        json!({"event_id": "raw_file_received", "organization": "org1", "raw_data": {
            "id": Uuid::new_v4().to_string(),
            "boefje_meta": {"id": Uuid::new_v4().to_string(), "organization": "org1",
                            "boefje": {"id": "dns-records"}, "input_ooi": "Hostname|internet|a.nl",
                            // As Bytes sends it: the boefje's settings, an API key among them.
                            "environment": {"API_KEY": "s3cret"},
                            "started_at": "2024-01-01T00:00:00+00:00",
                            "ended_at": "2024-01-01T00:00:05+00:00"},
            "mime_types": mimes}})
    };
    let ok = raw(json!([{"value": "boefje/dns-records"}, {"value": "text/plain"}]));
    let error = raw(json!([{"value": "boefje/dns-records"}, {"value": "error/boefje"}]));
    for body in [&ok, &ok, &error] {
        s.publish(&s.raw_files.clone(), body.to_string().as_bytes())
            .await;
    }
    s.handled(3).await;
    let page: Value = s
        .app
        .get("/tasks?scheduler_id=normalizer&limit=100")
        .await
        .json()
        .await
        .unwrap();
    let tasks = page["results"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "one task for the file, none for the error");
    assert_eq!(tasks[0]["data"]["normalizer"]["id"], "kat_dns_normalize");
    assert_eq!(tasks[0]["data"]["raw_data"]["id"], ok["raw_data"]["id"]);
    // mula's ranking: the run's end, oldest first; and mula's model of the file, without the
    // boefje's settings.
    assert_eq!(tasks[0]["priority"], 1_704_067_205);
    assert_eq!(
        tasks[0]["data"]["raw_data"]["boefje_meta"]["ended_at"],
        "2024-01-01T00:00:05+00:00"
    );
    assert!(!tasks[0].to_string().contains("s3cret"), "{}", tasks[0]);
    s.cleanup().await;
}

/// Closes the listener's connection from RabbitMQ's side (as a broker restart does); false when
/// `rabbitmqctl` cannot be used here. The listener names its connection after its queue; RabbitMQ
/// lists that name among the client properties.
fn close_listener_connection(queue: &str) -> bool {
    let Ok(out) = std::process::Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
    else {
        return false;
    };
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut closed = false;
    for line in listing.lines().filter(|l| l.contains(queue)) {
        if let Some(pid) = line.split_whitespace().next() {
            closed |= std::process::Command::new("rabbitmqctl")
                .args(["-q", "close_connection", pid, "test: broker gone"])
                .status()
                .is_ok_and(|s| s.success());
        }
    }
    closed
}

async fn a_lost_connection_loses_no_message(backend: Backend) {
    let Some(s) = Setup::new(backend, 10).await else {
        return;
    };
    let n = 60u64;
    let publish = |from: u64| {
        let s = &s;
        async move {
            for i in from..from + n {
                s.mutation(object(
                    "create",
                    "org1",
                    &format!("Hostname|internet|h{i}.nl"),
                    "Hostname",
                    1,
                ))
                .await;
            }
        }
    };
    publish(0).await;
    s.handled(5).await;
    if !close_listener_connection(&s.mutations) {
        assert!(
            std::env::var("CI").is_err(),
            "rabbitmqctl is needed under CI"
        );
        eprintln!("\n*** SKIPPED: rabbitmqctl cannot close the listener's connection here ***\n");
        s.cleanup().await;
        return;
    }
    // Published while the listener may be reconnecting: RabbitMQ keeps them, and messages left
    // unacked when the connection went come back.
    publish(n).await;
    s.handled(2 * n).await;
    assert!(
        s.app.listener.sessions() >= 2,
        "the listener reconnected after its connection was closed"
    );
    assert_eq!(
        s.boefje_ids("org1").await.len(),
        2 * 2 * n as usize,
        "every object's two tasks"
    );
    s.cleanup().await;
}

async fn the_planner_waits_for_the_previous_run_of_the_same_work_to_finish(backend: Backend) {
    let Some(s) = Setup::new(backend, 100).await else {
        return;
    };
    let reference = "Hostname|internet|busy.nl";
    s.mutation(object("create", "org1", reference, "Hostname", 1))
        .await;
    s.handled(1).await;
    let filter = json!({"filters": [{"column": "data", "field": "boefje__id", "operator": "==", "value": "dns-records"}]});
    let running = s.app.pop_ok("boefje", 1, Some(&filter)).await;
    let id = id_of(&running[0]);
    s.app.patch_task(&id, &json!({"status": "running"})).await;
    // The object changes while its scan runs: no second run of the same work next to it.
    s.mutation(object("update", "org1", reference, "Hostname", 2))
        .await;
    s.handled(2).await;
    assert_eq!(s.boefje_ids("org1").await, vec!["on-create-only"]);
    // Once it finished, a change within the grace period does not run it again (mula's gate:
    // an object's scan profile is recalculated often, and each would run every boefje again).
    s.app.patch_task(&id, &json!({"status": "completed"})).await;
    s.app.advance(chrono::Duration::hours(23));
    s.mutation(object("update", "org1", reference, "Hostname", 2))
        .await;
    s.handled(3).await;
    assert_eq!(s.boefje_ids("org1").await, vec!["on-create-only"]);
    // The next change after it plans it again.
    s.app.advance(chrono::Duration::hours(2));
    s.mutation(object("update", "org1", reference, "Hostname", 2))
        .await;
    s.handled(4).await;
    assert_eq!(
        s.boefje_ids("org1").await,
        vec!["dns-records", "on-create-only"]
    );
    s.cleanup().await;
}

async fn katalogus_plans_the_work_and_a_slow_organisation_holds_up_only_its_own_events(
    backend: Backend,
) {
    let katalogus = KatalogusState::default();
    for org in ["fast", "slow"] {
        katalogus.plugins.lock().unwrap().insert(
            org.into(),
            vec![katalogus_boefje("dns-records", &["Hostname"], 1, false)],
        );
    }
    // Katalogus takes longer over `slow` than a message may wait for its first answer.
    katalogus
        .slow
        .lock()
        .unwrap()
        .insert("slow".into(), Duration::from_secs(3));
    let stub = katalogus.serve();
    let url = stub.url.clone();
    let Some(s) = Setup::with(backend, 100, move |s| s.clients.katalogus_api = url).await else {
        return;
    };
    s.mutation(object(
        "create",
        "slow",
        "Hostname|internet|s.nl",
        "Hostname",
        1,
    ))
    .await;
    s.mutation(object(
        "create",
        "fast",
        "Hostname|internet|f.nl",
        "Hostname",
        1,
    ))
    .await;
    s.handled(1).await;
    assert_eq!(s.boefje_ids("fast").await, vec!["dns-records"]);
    assert!(
        s.boefje_ids("slow").await.is_empty(),
        "still waiting for Katalogus"
    );
    // Its answer fills the cache when it comes; the message handed back then plans its work.
    s.handled(2).await;
    assert_eq!(s.boefje_ids("slow").await, vec!["dns-records"]);
    let catalogue = s.app.service_health("catalogue").await;
    assert_eq!(catalogue["additional"]["source"], "katalogus");
    s.cleanup().await;
}

/// An object's events apply in the order they came, also when one is handed back: a create
/// whose task the full queue refuses is not overtaken by the object's delete behind it. Once the
/// queue has room, the create plans its task and the delete cancels it; the object is not
/// brought back by the create's redelivery after its delete.
async fn an_objects_delete_waits_behind_its_create_handed_back(backend: Backend) {
    let Some(s) = Setup::with(backend, 100, |s| {
        s.queue.maxsize = 1;
        s.queue.when_full = kat_scheduler::queue::WhenFull::Reject;
    })
    .await
    else {
        return;
    };
    s.app
        .push_ok("boefje", &boefje_push("other", "dns-records", None, 3))
        .await;
    let reference = "IPAddressV4|internet|192.0.2.1";
    s.mutation(object("create", "org1", reference, "IPAddressV4", 1))
        .await;
    s.mutation(json!({"operation": "delete", "primary_key": reference, "client_id": "org1"}))
        .await;
    // The create was handed back twice: its second delivery came behind the delete's first.
    tokio::time::timeout(Duration::from_secs(30), s.app.listener.wait_retried(3))
        .await
        .expect("the create is handed back while the queue is full");
    assert_eq!(s.app.pop_ok("boefje", 1, None).await.len(), 1, "room again");
    s.handled(2).await;
    let tasks: Value = s
        .app
        .get("/tasks?scheduler_id=boefje&organisation=org1&limit=10")
        .await
        .json()
        .await
        .unwrap();
    let statuses: Vec<&str> = tasks["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        vec!["cancelled"],
        "the create's task, cancelled by the delete after it: {tasks}"
    );
    s.cleanup().await;
}

/// The frontier has not heard that `b` holds the object (no event of b's yet): Octopoes, asked
/// as mula asks it (`/object-clients`), says so, and b's sibling joins a's task.
async fn a_sibling_only_octopoes_knows_of_joins_the_group(backend: Backend) {
    let katalogus = KatalogusState::default();
    for (org, other) in [("a", "b"), ("b", "a")] {
        katalogus.plugins.lock().unwrap().insert(
            org.into(),
            vec![katalogus_boefje("dns-records", &["Hostname"], 1, true)],
        );
        katalogus
            .duplicates
            .lock()
            .unwrap()
            .insert((org.into(), "dns-records".into()), vec![other.into()]);
    }
    let k = katalogus.serve();
    let reference = "Hostname|internet|shared.nl";
    let octopoes = OctopoesState::default();
    for org in ["a", "b"] {
        octopoes.set(org, vec![octopoes_object(reference, "Hostname", 1)]);
    }
    let o = octopoes.serve();
    let (ku, ou) = (k.url.clone(), o.url.clone());
    let Some(s) = Setup::with(backend, 100, move |s| {
        s.clients.katalogus_api = ku;
        s.clients.octopoes_api = ou;
    })
    .await
    else {
        return;
    };
    s.mutation(object("create", "a", reference, "Hostname", 1))
        .await;
    s.handled(1).await;
    let group = s.app.pop_ok("boefje", 10, None).await;
    let mut orgs: Vec<&str> = group
        .iter()
        .map(|t| t["organisation"].as_str().unwrap())
        .collect();
    orgs.sort();
    assert_eq!(
        orgs,
        vec!["a", "b"],
        "b's sibling, known from Octopoes alone"
    );
    assert!(
        group
            .iter()
            .all(|t| t["data"]["deduplication_key"] == group[0]["id"])
    );
    assert!(
        o.seen().iter().any(|r| r.path == "/object-clients"
            && r.param("clients") == Some("b")
            && r.param("reference") == Some(reference)),
        "{:?}",
        o.seen()
    );
    s.cleanup().await;
}

async fn organisations_sharing_a_boefje_get_one_group_popped_together(backend: Backend) {
    let katalogus = KatalogusState::default();
    for org in ["a", "b", "c"] {
        katalogus.plugins.lock().unwrap().insert(
            org.into(),
            vec![katalogus_boefje("dns-records", &["Hostname"], 1, true)],
        );
        let others: Vec<String> = ["a", "b", "c"]
            .iter()
            .filter(|o| **o != org)
            .map(|o| (*o).to_owned())
            .collect();
        katalogus
            .duplicates
            .lock()
            .unwrap()
            .insert((org.into(), "dns-records".into()), others);
    }
    let stub = katalogus.serve();
    let url = stub.url.clone();
    let Some(s) = Setup::with(backend, 100, move |s| s.clients.katalogus_api = url).await else {
        return;
    };
    let reference = "Hostname|internet|shared.nl";
    // b and c hold the object and have scanned it (their runs finished).
    for (n, org) in ["b", "c"].into_iter().enumerate() {
        s.mutation(object("create", org, reference, "Hostname", 1))
            .await;
        s.handled(n as u64 + 1).await;
        for t in s.app.pop_many("boefje", 10, None).await {
            let id = id_of(&t);
            s.app.patch_task(&id, &json!({"status": "running"})).await;
            s.app.patch_task(&id, &json!({"status": "completed"})).await;
        }
    }
    // It shows up in a: one run for the three organisations.
    s.mutation(object("create", "a", reference, "Hostname", 1))
        .await;
    s.handled(3).await;
    let group = s.app.pop_ok("boefje", 10, None).await;
    let mut orgs: Vec<&str> = group
        .iter()
        .map(|t| t["organisation"].as_str().unwrap())
        .collect();
    orgs.sort();
    assert_eq!(
        orgs,
        vec!["a", "b", "c"],
        "the whole group, within the limit"
    );
    let key = &group[0]["data"]["deduplication_key"];
    assert_eq!(key, &group[0]["id"], "the leader's own id is the key");
    assert!(group.iter().all(|t| &t["data"]["deduplication_key"] == key));
    assert!(
        s.app.pop_ok("boefje", 10, None).await.is_empty(),
        "each once"
    );
    s.cleanup().await;
}

/// The queued boefje tasks by object: `(id, priority, modified_at)`.
async fn queued_by_object(
    app: &TestApp,
) -> std::collections::BTreeMap<String, (String, i64, Value)> {
    let page: Value = app
        .get("/tasks?scheduler_id=boefje&status=queued&limit=100")
        .await
        .json()
        .await
        .unwrap();
    let mut out = std::collections::BTreeMap::new();
    for t in page["results"].as_array().unwrap() {
        out.insert(
            t["data"]["input_ooi"].as_str().unwrap().to_owned(),
            (
                id_of(t),
                t["priority"].as_i64().unwrap(),
                t["modified_at"].clone(),
            ),
        );
    }
    out
}

/// Priorities do not age, so waiting work is re-scored only on the event that changed what its
/// strategy reads: under `change-delta`, an object's new scan level re-scores that object's
/// waiting tasks and no other; a priority a client set stands.
async fn an_object_change_rescores_only_that_objects_waiting_tasks(backend: Backend) {
    let Some(s) = Setup::with(backend, 100, |s| {
        s.schedulers.boefje.scoring = Some(kat_scheduler::scoring::Strategy::ChangeDelta);
    })
    .await
    else {
        return;
    };
    let (a, b) = ("Hostname|internet|a.nl", "Hostname|internet|b.nl");
    s.finish_first_runs(&[a, b]).await;
    // Past the grace period: work that ran less than a day ago is not planned again.
    s.app.advance(chrono::Duration::hours(25));
    for r in [a, b] {
        s.mutation(object("update", "org1", r, "Hostname", 1)).await;
    }
    s.handled(4).await;
    let before = queued_by_object(&s.app).await;
    // Findings changed since the last run (−500), level 1 (−40).
    assert_eq!(before[a].1, 460);
    assert_eq!(before[b].1, 460);
    // a's scan level goes up: a's task comes sooner; b's is not touched.
    s.app.advance(chrono::Duration::minutes(5));
    s.mutation(object("update", "org1", a, "Hostname", 2)).await;
    s.handled(5).await;
    let after = queued_by_object(&s.app).await;
    assert_eq!(after[a].0, before[a].0, "the same task, re-scored");
    assert_eq!(after[a].1, 420);
    assert_eq!(
        after[b], before[b],
        "another object's task is left as it was"
    );
    let why: Value = s
        .app
        .get(&format!("/tasks/{}/explain", after[a].0))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(why["strategy"], "change-delta");
    assert_eq!(why["priority"], 420);
    assert_eq!(why["inputs"]["scan_level"], 2);
    assert_eq!(why["terms"]["scan_level"], -80);
    assert_eq!(s.app.pop_ids("boefje", 1).await, vec![after[a].0.clone()]);
    // A client's priority stands when the object changes again.
    let patched = s
        .app
        .patch_task(&before[b].0, &json!({"priority": 700}))
        .await;
    assert_eq!(patched.status(), reqwest::StatusCode::OK);
    s.mutation(object("update", "org1", b, "Hostname", 2)).await;
    s.handled(6).await;
    assert_eq!(s.app.task(&before[b].0).await["priority"], 700);
    s.cleanup().await;
}

/// A re-scored task beyond the heap (pending) is read into the heap, and so popped, by its new
/// priority: the pending backlog is read in the order of its queue rows, which carry the
/// priority beside the task's own row.
async fn a_pending_task_rescored_is_popped_by_its_new_priority(backend: Backend) {
    let Some(s) = Setup::with(backend, 100, |s| {
        s.schedulers.boefje.scoring = Some(kat_scheduler::scoring::Strategy::ChangeDelta);
        s.schedulers.boefje.maxsize = Some(1);
    })
    .await
    else {
        return;
    };
    let (a, b, c) = (
        "Hostname|internet|a.nl",
        "Hostname|internet|b.nl",
        "Hostname|internet|c.nl",
    );
    s.finish_first_runs(&[a, b, c]).await;
    // One task each, the same priority: a's fills the heap of one, b's and c's wait beyond it
    // (past the grace period, so the work is planned again).
    s.app.advance(chrono::Duration::hours(25));
    s.mutation(object("update", "org1", a, "Hostname", 1)).await;
    s.handled(4).await;
    // b's first, so that by creation b's would come first.
    s.mutation(object("update", "org1", b, "Hostname", 1)).await;
    s.handled(5).await;
    s.app.advance(chrono::Duration::seconds(1));
    s.mutation(object("update", "org1", c, "Hostname", 1)).await;
    s.handled(6).await;
    let page: Value = s
        .app
        .get("/tasks?scheduler_id=boefje&status=pending&limit=10")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["count"], 2, "b's and c's tasks are pending: {page}");
    // c's scan level goes up: its pending task comes sooner than b's.
    s.app.advance(chrono::Duration::minutes(5));
    s.mutation(object("update", "org1", c, "Hostname", 2)).await;
    s.handled(7).await;
    let mut order = Vec::new();
    for _ in 0..3 {
        let popped = s.app.pop_ok("boefje", 1, None).await;
        assert_eq!(popped.len(), 1);
        order.push((
            popped[0]["data"]["input_ooi"].as_str().unwrap().to_owned(),
            popped[0]["priority"].as_i64().unwrap(),
        ));
    }
    let at = |r: &str| order.iter().position(|(o, _)| o == r).unwrap();
    assert!(at(c) < at(b), "c's re-scored task before b's: {order:?}");
    assert_eq!(order[at(c)].1, 420, "popped with its new priority");
    assert_eq!(order[at(b)].1, 460);
    s.cleanup().await;
}

/// Octopoes' reset of an object's scan profile, as it publishes it (`empty`, level 0).
fn profile_reset(org: &str, reference: &str) -> Value {
    json!({"operation": "update", "primary_key": reference, "client_id": org,
        "value": {"primary_key": reference, "object_type": "Hostname",
                  "scan_profile": {"scan_profile_type": "empty", "reference": reference,
                                   "level": 0, "user_id": null}}})
}

/// A scan level is the user's permission to scan, and OpenKAT's runners do not check it: an
/// update that lowers it cancels the waiting tasks of the boefjes it no longer permits, in that
/// organisation only, so none of them is handed out.
async fn a_lowered_scan_level_cancels_the_waiting_work_it_no_longer_permits(backend: Backend) {
    let Some(s) = Setup::new(backend, 100).await else {
        return;
    };
    let x = "Hostname|internet|cleared.nl";
    s.mutation(object("create", "org1", x, "Hostname", 3)).await;
    s.mutation(object("create", "org2", x, "Hostname", 3)).await;
    s.handled(2).await;
    let all = ["dns-records", "intrusive", "on-create-only"];
    assert_eq!(s.boefje_ids("org1").await, all);

    // Lowered to 1: `intrusive` (level 3) may no longer run on it.
    s.mutation(object("update", "org1", x, "Hostname", 1)).await;
    s.handled(3).await;
    assert_eq!(
        s.boefje_ids("org1").await,
        ["dns-records", "on-create-only"]
    );
    assert_eq!(count_of(&s, "cancelled").await, 1);
    assert_eq!(s.boefje_ids("org2").await, all, "org2's clearance stands");

    // The profile reset: nothing may run on it now.
    s.mutation(profile_reset("org1", x)).await;
    s.handled(4).await;
    assert!(s.boefje_ids("org1").await.is_empty());
    let popped = s.app.pop_many("boefje", 10, None).await;
    assert_eq!(popped.len(), 3);
    assert!(
        popped.iter().all(|t| t["organisation"] == "org2"),
        "only org2's work handed out: {popped:?}"
    );
    s.cleanup().await;
}

/// With several instances an object's events are not ordered between them: an update lowering
/// the level may be applied after the one that raised it again. Octopoes, asked first, has the
/// level of now; while it cannot answer, the event is its last word.
async fn a_lowered_scan_level_octopoes_contradicts_cancels_nothing(backend: Backend) {
    let x = "Hostname|internet|raised-again.nl";
    let octopoes = OctopoesState::default();
    octopoes.set("org1", vec![octopoes_object(x, "Hostname", 3)]);
    let o = octopoes.serve();
    let ou = o.url.clone();
    let Some(s) = Setup::with(backend, 100, move |s| s.clients.octopoes_api = ou).await else {
        return;
    };
    s.mutation(object("create", "org1", x, "Hostname", 3)).await;
    s.handled(1).await;
    let all = ["dns-records", "intrusive", "on-create-only"];
    assert_eq!(s.boefje_ids("org1").await, all);

    o.clear();
    s.mutation(object("update", "org1", x, "Hostname", 1)).await;
    s.handled(2).await;
    assert_eq!(
        s.boefje_ids("org1").await,
        all,
        "Octopoes holds it at level 3"
    );
    assert!(
        o.seen()
            .iter()
            .any(|r| r.path == "/org1/object" && r.param("reference") == Some(x)),
        "Octopoes asked: {:?}",
        o.seen()
    );

    octopoes.fail_lookups(true);
    s.mutation(profile_reset("org1", x)).await;
    s.handled(3).await;
    assert!(
        s.boefje_ids("org1").await.is_empty(),
        "Octopoes cannot answer: its event decides"
    );
    s.cleanup().await;
}

/// A boefje's scan level is Katalogus' of now: a copy of the catalogue gone stale (a new
/// version of the boefje needs less) cancels nothing; while Katalogus cannot answer for the
/// organisation, the copy decides (it errs towards not scanning).
async fn a_lowered_scan_level_is_weighed_against_katalogus_levels_of_now(backend: Backend) {
    let x = "Hostname|internet|versions.nl";
    let katalogus = KatalogusState::default();
    let plugins = |intrusive: i64| {
        vec![
            katalogus_boefje("dns-records", &["Hostname"], 1, false),
            katalogus_boefje("intrusive", &["Hostname"], intrusive, false),
        ]
    };
    for org in ["org1", "org2"] {
        katalogus
            .plugins
            .lock()
            .unwrap()
            .insert(org.into(), plugins(3));
    }
    let k = katalogus.serve();
    let ku = k.url.clone();
    let Some(s) = Setup::with(backend, 100, move |s| {
        s.clients.katalogus_api = ku;
        s.catalogue.ttl_secs = 60;
    })
    .await
    else {
        return;
    };
    s.mutation(object("create", "org1", x, "Hostname", 3)).await;
    s.mutation(object("create", "org2", x, "Hostname", 3)).await;
    s.handled(2).await;
    assert_eq!(s.boefje_ids("org1").await, ["dns-records", "intrusive"]);

    // Katalogus now has `intrusive` at level 1; the copies are stale.
    katalogus
        .plugins
        .lock()
        .unwrap()
        .insert("org1".into(), plugins(1));
    katalogus.failing.lock().unwrap().insert("org2".into());
    s.app.advance(chrono::Duration::seconds(61));
    s.mutation(object("update", "org1", x, "Hostname", 1)).await;
    s.handled(3).await;
    assert_eq!(
        s.boefje_ids("org1").await,
        ["dns-records", "intrusive"],
        "Katalogus' level of now permits it"
    );

    // Katalogus no longer answers for org2: its copy (level 3) decides.
    s.mutation(object("update", "org2", x, "Hostname", 1)).await;
    s.handled(4).await;
    assert_eq!(s.boefje_ids("org2").await, ["dns-records"]);
    s.cleanup().await;
}

/// An object whose reference is longer than an index entry may be (a URL with a long query, as
/// web crawls find): mula plans its work like any other. It must be planned here too, wait in
/// the backlog beyond a full heap, hold up no event after it, and be cancelled by its delete.
async fn an_object_with_a_reference_longer_than_an_index_entry_is_planned(backend: Backend) {
    let Some(s) = Setup::with(backend, 100, |s| {
        s.queue.maxsize = 2;
        s.schedulers.boefje.fairness = Some(kat_scheduler::queue::fair::Fairness::Off);
    })
    .await
    else {
        return;
    };
    // Random characters, so that no compression brings it under PostgreSQL's 2,704 bytes.
    let long = format!(
        "Hostname|internet|{}.nl",
        (0..100)
            .map(|_| Uuid::new_v4().simple().to_string())
            .collect::<String>()
    );
    s.mutation(object(
        "create",
        "org2",
        "Hostname|internet|b.nl",
        "Hostname",
        2,
    ))
    .await;
    s.mutation(object("create", "org1", &long, "Hostname", 2))
        .await;
    s.mutation(object(
        "create",
        "org3",
        "Hostname|internet|c.nl",
        "Hostname",
        2,
    ))
    .await;
    s.handled(3).await;
    let app = &s.app;
    let tasks_of = |org: &'static str| async move {
        let page: Value = app
            .get(&format!(
                "/tasks?scheduler_id=boefje&organisation={org}&limit=100"
            ))
            .await
            .json()
            .await
            .unwrap();
        let mut found: Vec<(String, String, String)> = page["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["data"]["boefje"]["id"].as_str().unwrap().to_owned(),
                    t["data"]["input_ooi"].as_str().unwrap().to_owned(),
                    t["status"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        found.sort();
        found
    };
    // org2's work fills the heap; the long object's waits behind it, as does org3's.
    let waiting = |reference: &str, status: &str| {
        ["dns-records", "on-create-only"]
            .map(|b| (b.to_owned(), reference.to_owned(), status.to_owned()))
            .to_vec()
    };
    assert_eq!(tasks_of("org1").await, waiting(&long, "pending"));
    assert_eq!(
        tasks_of("org3").await,
        waiting("Hostname|internet|c.nl", "pending")
    );
    // Its delete cancels what waits for it in the backlog, and nothing else.
    s.mutation(json!({"operation": "delete", "primary_key": long, "client_id": "org1"}))
        .await;
    s.handled(4).await;
    assert_eq!(tasks_of("org1").await, waiting(&long, "cancelled"));
    assert_eq!(
        tasks_of("org2").await,
        waiting("Hostname|internet|b.nl", "queued")
    );
    assert_eq!(
        tasks_of("org3").await,
        waiting("Hostname|internet|c.nl", "pending")
    );
    s.cleanup().await;
}

/// An organisation Katalogus does not list (Rocky creates an organisation in Octopoes and in
/// Katalogus one after the other; one deleted in Katalogus alone). Katalogus answers its plugins
/// with the whole catalogue at the default states, boefjes off and normalizers on, never a 404,
/// and its events are planned from that answer, as mula plans them: its objects get no scans,
/// its raw files the normalizers on by default, and nothing is handed back.
async fn events_of_an_organisation_katalogus_does_not_list_are_planned_as_it_answers(
    backend: Backend,
) {
    let katalogus = KatalogusState::default();
    katalogus.plugins.lock().unwrap().insert(
        "known".into(),
        vec![
            katalogus_boefje("dns-records", &["Hostname"], 1, false),
            katalogus_normalizer("kat_dns_normalize", &["boefje/dns-records"]),
        ],
    );
    let stub = katalogus.serve();
    let url = stub.url.clone();
    let Some(s) = Setup::with(backend, 100, move |s| s.clients.katalogus_api = url).await else {
        return;
    };
    for org in ["ghost", "known"] {
        let reference = format!("Hostname|internet|{org}.nl");
        s.mutation(object("create", org, &reference, "Hostname", 1))
            .await;
    }
    let raw = json!({"event_id": "raw_file_received", "organization": "ghost", "raw_data": {
        "id": Uuid::new_v4().to_string(),
        "boefje_meta": {"id": Uuid::new_v4().to_string(), "organization": "ghost",
                        "boefje": {"id": "dns-records"}, "input_ooi": "Hostname|internet|ghost.nl"},
        "mime_types": [{"value": "boefje/dns-records"}]}});
    s.publish(&s.raw_files.clone(), raw.to_string().as_bytes())
        .await;
    s.handled(3).await;
    assert_eq!(s.boefje_ids("known").await, vec!["dns-records"]);
    assert_eq!(
        s.boefje_ids("ghost").await,
        Vec::<String>::new(),
        "off by default"
    );
    let normalizers: Value = s
        .app
        .get("/tasks?scheduler_id=normalizer&organisation=ghost&limit=10")
        .await
        .json()
        .await
        .unwrap();
    let ids: Vec<&Value> = normalizers["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["data"]["normalizer"]["id"])
        .collect();
    assert_eq!(ids, vec!["kat_dns_normalize"], "on by default");
    assert_eq!(s.retried().await, [0, 0], "handed back");
    s.cleanup().await;
}

/// The two queues are consumed apart: a batch of one waiting on Katalogus does not hold the
/// other's. Katalogus here answers plugin listings only once two wait together, one for the raw
/// file's organisation and one for the object's: consumed one batch at a time, the first batch
/// waits out its 2 s for Katalogus and is handed back before the second is read.
async fn one_queue_waiting_on_katalogus_does_not_hold_the_other(backend: Backend) {
    let katalogus = KatalogusState::default();
    for org in ["files", "objects"] {
        katalogus.plugins.lock().unwrap().insert(
            org.into(),
            vec![katalogus_boefje("dns-records", &["Hostname"], 1, false)],
        );
        // Not fetched ahead by the catalogue's refresh: only the events ask.
        katalogus.unlisted.lock().unwrap().insert(org.into());
    }
    *katalogus.together.lock().unwrap() = Some(std::sync::Arc::new(tokio::sync::Barrier::new(2)));
    let stub = katalogus.serve();
    let url = stub.url.clone();
    let Some(s) = Setup::with(backend, 100, move |s| s.clients.katalogus_api = url).await else {
        return;
    };
    let raw = json!({"event_id": "raw_file_received", "organization": "files", "raw_data": {
        "id": Uuid::new_v4().to_string(),
        "boefje_meta": {"id": Uuid::new_v4().to_string(), "organization": "files",
                        "boefje": {"id": "dns-records"}, "input_ooi": "Hostname|internet|f.nl"},
        "mime_types": [{"value": "boefje/dns-records"}]}});
    s.publish(&s.raw_files.clone(), raw.to_string().as_bytes())
        .await;
    s.mutation(object(
        "create",
        "objects",
        "Hostname|internet|o.nl",
        "Hostname",
        1,
    ))
    .await;
    s.handled(2).await;
    assert_eq!(s.boefje_ids("objects").await, vec!["dns-records"]);
    assert_eq!(s.retried().await, [0, 0], "handed back");
    s.cleanup().await;
}

/// Katalogus fails for one organisation alone, for good: its events fill the prefetch window,
/// each handed back again and again, and another organisation's event waits behind them. Once
/// they have failed for `park_after_secs` they are parked in the database and acked, and the
/// other organisation's event is planned. A later event about a parked object is parked behind
/// it, unapplied. From the table, the cron entry `parked` tries them again: while Katalogus
/// still fails they stay (the delete behind its create is not tried before it), and once it
/// answers they are applied in each object's order: the create's task, then the delete
/// cancelling it.
/// Deletes parked while Katalogus failed, applied minutes later: by then Octopoes holds one of
/// the objects again (created anew since; the events announcing that could be parked behind, or
/// dead-lettered). The frontier says both are gone, but a cancel cannot be undone, so Octopoes is
/// asked, as for a live delete: only the object it no longer holds has its work cancelled.
async fn parked_deletes_applied_late_cancel_only_what_octopoes_no_longer_holds(backend: Backend) {
    let (x, y) = ("Hostname|internet|x.nl", "Hostname|internet|y.nl");
    let octopoes = OctopoesState::default();
    octopoes.set("broken", vec![octopoes_object(x, "Hostname", 1)]);
    let o = octopoes.serve();
    let ou = o.url.clone();
    let plugins = vec![katalogus_boefje("dns-records", &["Hostname"], 1, false)];
    let Some((s, katalogus, _stub)) =
        parking_setup_with(backend, 10, &["broken"], plugins, move |s| {
            s.clients.octopoes_api = ou;
        })
        .await
    else {
        return;
    };
    for r in [x, y] {
        s.mutation(object("create", "broken", r, "Hostname", 1))
            .await;
    }
    s.handed_back(2).await;
    s.app.advance(chrono::Duration::seconds(61));
    s.parked(2).await;
    for r in [x, y] {
        s.mutation(json!({"operation": "delete", "primary_key": r, "client_id": "broken"}))
            .await;
    }
    s.parked(4).await;
    katalogus.failing.lock().unwrap().clear();
    s.app.advance(chrono::Duration::seconds(11));
    let boefje = kat_scheduler::domain::SchedulerId::Boefje;
    assert_eq!(
        s.redrive(boefje).await,
        "applied 4, failed again 0, refused 0"
    );
    let (seen, tasks) = s.task_states("broken").await;
    assert_eq!(
        seen,
        vec![
            (x.to_owned(), "queued".to_owned()),
            (y.to_owned(), "cancelled".to_owned())
        ],
        "x is held by Octopoes: its work stays; y is gone: {tasks}"
    );
    assert!(
        o.seen()
            .iter()
            .any(|r| r.path == "/broken/object" && r.param("reference") == Some(x)),
        "Octopoes asked about x: {:?}",
        o.seen()
    );
    s.cleanup().await;
}

async fn events_failing_for_one_organisation_are_parked_and_stop_holding_the_others(
    backend: Backend,
) {
    let plugins = vec![katalogus_boefje("dns-records", &["Hostname"], 1, false)];
    let Some((s, katalogus, _stub)) = parking_setup(backend, 2, &["broken", "fine"], plugins).await
    else {
        return;
    };
    let (x, y) = ("Hostname|internet|x.nl", "Hostname|internet|y.nl");
    s.mutation(object("create", "broken", x, "Hostname", 1))
        .await;
    s.mutation(object("create", "broken", y, "Hostname", 1))
        .await;
    s.mutation(object(
        "create",
        "fine",
        "Hostname|internet|f.nl",
        "Hostname",
        1,
    ))
    .await;
    // Two rounds of the window handed back: the fine organisation's event is not delivered.
    s.handed_back(4).await;
    assert!(s.boefje_ids("fine").await.is_empty(), "held behind them");
    s.app.advance(chrono::Duration::seconds(61));
    s.parked(2).await;
    s.handled(3).await;
    assert_eq!(s.boefje_ids("fine").await, vec!["dns-records"]);
    // An event about an object with an event parked is parked behind it, unapplied.
    s.mutation(json!({"operation": "delete", "primary_key": x, "client_id": "broken"}))
        .await;
    s.parked(3).await;
    let parked = |r: &Value| r["parked"].as_u64().unwrap();
    let queues = s.app.service_health("listener").await["additional"]["queues"].clone();
    assert_eq!(parked(&queues[0]), 3);
    // Not due yet: parked events are first tried again after a wait.
    let boefje = kat_scheduler::domain::SchedulerId::Boefje;
    assert_eq!(
        s.redrive(boefje).await,
        "applied 0, failed again 0, refused 0"
    );
    s.app.advance(chrono::Duration::seconds(11));
    assert_eq!(
        s.redrive(boefje).await,
        "applied 0, failed again 2, refused 0",
        "Katalogus still fails: both creates again, the delete behind its create not tried"
    );
    // All failed again: none is due before its wait.
    s.app.advance(chrono::Duration::seconds(5));
    assert_eq!(
        s.redrive(boefje).await,
        "applied 0, failed again 0, refused 0"
    );
    assert!(s.boefje_ids("broken").await.is_empty());
    katalogus.failing.lock().unwrap().clear();
    s.app.advance(chrono::Duration::seconds(21));
    assert_eq!(
        s.redrive(boefje).await,
        "applied 3, failed again 0, refused 0"
    );
    let (seen, tasks) = s.task_states("broken").await;
    assert_eq!(
        seen,
        vec![
            (x.to_owned(), "cancelled".to_owned()),
            (y.to_owned(), "queued".to_owned())
        ],
        "the creates' tasks, x's cancelled by its delete after it: {tasks}"
    );
    assert_eq!(
        s.redrive(boefje).await,
        "applied 0, failed again 0, refused 0"
    );
    s.cleanup().await;
}

/// A database that refuses the park (a trigger here; a full disk, a lost connection) loses
/// nothing: the message is acked only once its row is written, so it is handed back as before
/// and parked once the database takes it.
/// The parked events cannot be read (here: the table renamed away; in life, a database that
/// refuses the read): whether an earlier event of an object waits parked is not known, so no
/// event is applied, which could overtake one parked (a delete before its create), nor parked on
/// its own failure. Each is handed back, unacked, and applied once the table reads again.
async fn events_are_held_back_while_the_parked_events_cannot_be_read(backend: Backend) {
    let plugins = vec![katalogus_boefje("dns-records", &["Hostname"], 1, false)];
    let Some((s, _katalogus, _stub)) = parking_setup(backend, 10, &["org1"], plugins).await else {
        return;
    };
    let uri = s.app.db.uri.clone();
    behind_its_back(
        backend,
        &uri,
        "ALTER TABLE listener_parked RENAME TO listener_parked_away",
    );
    let x = "Hostname|internet|x.nl";
    s.mutation(object("create", "org1", x, "Hostname", 1)).await;
    s.handed_back(2).await;
    let queues = s.app.service_health("listener").await["additional"]["queues"].clone();
    assert_eq!(
        (queues[0]["acked"].clone(), queues[0]["parked"].clone()),
        (json!(0), json!(0)),
        "neither applied nor parked: {queues}"
    );
    assert!(s.boefje_ids("org1").await.is_empty());
    behind_its_back(
        backend,
        &uri,
        "ALTER TABLE listener_parked_away RENAME TO listener_parked",
    );
    s.handled(1).await;
    assert_eq!(s.boefje_ids("org1").await, vec!["dns-records"]);
    s.cleanup().await;
}

async fn an_event_the_database_refuses_to_park_is_handed_back_not_lost(backend: Backend) {
    let plugins = vec![katalogus_boefje("dns-records", &["Hostname"], 1, false)];
    let Some((s, katalogus, _stub)) = parking_setup(backend, 10, &["broken"], plugins).await else {
        return;
    };
    let uri = s.app.db.uri.clone();
    behind_its_back(
        backend,
        &uri,
        match backend {
            Backend::Postgres => {
                "CREATE FUNCTION refuse_park() RETURNS trigger AS $$ BEGIN \
                 RAISE EXCEPTION 'no room for parked events'; END $$ LANGUAGE plpgsql; \
                 CREATE TRIGGER refuse_park BEFORE INSERT ON listener_parked \
                 FOR EACH ROW EXECUTE FUNCTION refuse_park();"
            }
            Backend::Sqlite => {
                "CREATE TRIGGER refuse_park BEFORE INSERT ON listener_parked \
                 BEGIN SELECT RAISE(ABORT, 'no room for parked events'); END;"
            }
        },
    );
    let x = "Hostname|internet|x.nl";
    s.mutation(object("create", "broken", x, "Hostname", 1))
        .await;
    s.handed_back(1).await;
    s.app.advance(chrono::Duration::seconds(61));
    // Due to be parked, refused by the database: handed back again, twice.
    s.handed_back(3).await;
    let queues = s.app.service_health("listener").await["additional"]["queues"].clone();
    assert_eq!(queues[0]["parked"], 0);
    assert_eq!(queues[0]["acked"], 0, "not acked: {queues}");
    let drop = match backend {
        Backend::Postgres => "DROP TRIGGER refuse_park ON listener_parked",
        Backend::Sqlite => "DROP TRIGGER refuse_park",
    };
    behind_its_back(backend, &uri, drop);
    s.parked(1).await;
    katalogus.failing.lock().unwrap().clear();
    s.app.advance(chrono::Duration::seconds(11));
    let boefje = kat_scheduler::domain::SchedulerId::Boefje;
    assert_eq!(
        s.redrive(boefje).await,
        "applied 1, failed again 0, refused 0"
    );
    assert_eq!(s.boefje_ids("broken").await, vec!["dns-records"]);
    s.cleanup().await;
}

/// Raw files Katalogus cannot plan for are parked like object events, and applied again from
/// the normalizer table's entry. A parked event refused for what it says when tried again (its
/// row altered here; a stored message is read once already, so this is rare) is kept aside and
/// not tried again, and the others are applied.
async fn parked_raw_files_are_applied_again_and_one_refused_is_kept_aside(backend: Backend) {
    let plugins = vec![
        katalogus_boefje("dns-records", &["Hostname"], 1, false),
        katalogus_normalizer("kat_dns_normalize", &["boefje/dns-records"]),
    ];
    let Some((s, katalogus, _stub)) = parking_setup(backend, 10, &["broken"], plugins).await else {
        return;
    };
    let ids: Vec<String> = (0..2).map(|_| Uuid::new_v4().to_string()).collect();
    for id in &ids {
        let raw = json!({"event_id": "raw_file_received", "organization": "broken", "raw_data": {
            "id": id,
            "boefje_meta": {"id": Uuid::new_v4().to_string(), "organization": "broken",
                            "boefje": {"id": "dns-records"}, "input_ooi": "Hostname|internet|b.nl"},
            "mime_types": [{"value": "boefje/dns-records"}]}});
        s.publish(&s.raw_files.clone(), raw.to_string().as_bytes())
            .await;
    }
    s.handed_back(2).await;
    s.app.advance(chrono::Duration::seconds(61));
    s.parked(2).await;
    behind_its_back(
        backend,
        &s.app.db.uri,
        &format!(
            "UPDATE listener_parked SET body = '{{\"event_id\": \"raw_file_received\"}}' \
             WHERE body LIKE '%{}%'",
            ids[0]
        ),
    );
    katalogus.failing.lock().unwrap().clear();
    s.app.advance(chrono::Duration::seconds(11));
    let normalizer = kat_scheduler::domain::SchedulerId::Normalizer;
    assert_eq!(
        s.redrive(normalizer).await,
        "applied 1, failed again 0, refused 1"
    );
    assert_eq!(
        s.redrive(normalizer).await,
        "applied 0, failed again 0, refused 0",
        "the refused one is not tried again"
    );
    let tasks: Value = s
        .app
        .get("/tasks?scheduler_id=normalizer&organisation=broken&limit=10")
        .await
        .json()
        .await
        .unwrap();
    let raws: Vec<&Value> = tasks["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["data"]["raw_data"]["id"])
        .collect();
    assert_eq!(raws, vec![&json!(ids[1])], "{tasks}");
    s.cleanup().await;
}

crate::backend_tests!(
    parked_raw_files_are_applied_again_and_one_refused_is_kept_aside,
    an_event_the_database_refuses_to_park_is_handed_back_not_lost,
    events_failing_for_one_organisation_are_parked_and_stop_holding_the_others,
    parked_deletes_applied_late_cancel_only_what_octopoes_no_longer_holds,
    events_are_held_back_while_the_parked_events_cannot_be_read,
    one_queue_waiting_on_katalogus_does_not_hold_the_other,
    events_of_an_organisation_katalogus_does_not_list_are_planned_as_it_answers,
    an_object_with_a_reference_longer_than_an_index_entry_is_planned,
    a_lowered_scan_level_cancels_the_waiting_work_it_no_longer_permits,
    a_lowered_scan_level_octopoes_contradicts_cancels_nothing,
    a_lowered_scan_level_is_weighed_against_katalogus_levels_of_now,
    an_objects_delete_waits_behind_its_create_handed_back,
    a_pending_task_rescored_is_popped_by_its_new_priority,
    an_object_change_rescores_only_that_objects_waiting_tasks,
    the_planner_waits_for_the_previous_run_of_the_same_work_to_finish,
    katalogus_plans_the_work_and_a_slow_organisation_holds_up_only_its_own_events,
    organisations_sharing_a_boefje_get_one_group_popped_together,
    a_sibling_only_octopoes_knows_of_joins_the_group,
    a_lost_connection_loses_no_message,
    an_object_event_becomes_the_tasks_its_plugins_allow,
    poison_is_dead_lettered_and_never_stalls_the_queue,
    a_poison_message_is_kept_when_its_dead_letter_queue_was_deleted,
    queues_an_operator_declared_with_arguments_are_consumed_as_they_are,
    queues_nobody_declared_are_declared_and_consumed,
    a_delete_cancels_that_organisations_waiting_tasks_for_the_object_only,
    a_delete_carrying_its_object_cancels_as_one_without,
    a_delete_of_an_object_octopoes_still_holds_cancels_nothing,
    a_delete_of_an_object_recreated_at_a_lower_level_cancels_what_it_no_longer_permits,
    a_raw_file_becomes_normalizer_tasks_unless_it_is_an_error,
);
