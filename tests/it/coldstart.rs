//! ColdStart against a stub Octopoes that speaks its real object listing, its rounds asked for
//! by the boefje cron table's `coldstart` entry: several pages and organisations into the
//! frontier and their work planned, an interrupted pass resumed after a restart, objects gone
//! from a later pass marked gone and their tasks cancelled.

use std::time::Duration;

use kat_scheduler::domain::SchedulerId;
use serde_json::Value;

use crate::helpers::*;
use crate::stubs::*;

/// Two organisations and a boefje for their hostnames (also the cluster tests').
pub const CATALOGUE: &str = r#"
organisations = ["org1", "org2"]

[[plugins]]
id = "dns-records"
type = "boefje"
consumes = ["Hostname"]
scan_level = 1
enabled = true
oci_image = "ghcr.io/minvws/openkat/dns-records:latest"
"#;

/// `n` hostnames of `org`, as Octopoes lists them.
pub fn hostnames(org: &str, n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| octopoes_object(&format!("Hostname|internet|{org}-h{i}.nl"), "Hostname", 1))
        .collect()
}

struct Setup {
    app: TestApp,
    octopoes: OctopoesState,
    stub: Stub,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn new(backend: Backend) -> Option<Setup> {
        let dir = tempfile::tempdir().unwrap();
        let catalogue = dir.path().join("catalogue.toml");
        std::fs::write(&catalogue, CATALOGUE).unwrap();
        let octopoes = OctopoesState::default();
        octopoes.set("org1", hostnames("org1", 5));
        octopoes.set("org2", hostnames("org2", 7));
        let stub = octopoes.serve();
        let url = stub.url.clone();
        let app = spawn_app_with(backend, move |s| {
            s.catalogue.file = catalogue.to_string_lossy().into_owned();
            s.clients.octopoes_api = url;
            s.coldstart.page_size = 2;
            s.coldstart.attempts = 2;
            s.coldstart.backoff_ms = 10;
            s.coldstart.interval_secs = 3600;
        })
        .await?;
        Some(Setup {
            app,
            octopoes,
            stub,
            _dir: dir,
        })
    }

    /// Ticks the boefje table, whose `coldstart` entry asks for a round, and waits until `n`
    /// rounds have ended since start.
    async fn rounds(&self, n: u64) {
        let report = self.app.tick(SchedulerId::Boefje).await;
        assert!(report.entries["coldstart"].ran, "{report:?}");
        tokio::time::timeout(Duration::from_secs(30), self.app.coldstart.wait_rounds(n))
            .await
            .expect("the ColdStart round ends");
    }

    async fn references(&self, org: &str, status: &str) -> Vec<String> {
        let page: Value = self
            .app
            .get(&format!(
                "/tasks?scheduler_id=boefje&organisation={org}&status={status}&limit=1000"
            ))
            .await
            .json()
            .await
            .unwrap();
        let mut refs: Vec<String> = page["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["data"]["input_ooi"].as_str().unwrap().to_owned())
            .collect();
        refs.sort();
        refs
    }

    async fn coldstart_health(&self) -> Value {
        let health: Value = self.app.get("/health").await.json().await.unwrap();
        health["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["service"] == "coldstart")
            .unwrap()["additional"]
            .clone()
    }
}

async fn coldstart_pages_every_organisation_into_the_frontier_and_plans_their_work(
    backend: Backend,
) {
    let Some(s) = Setup::new(backend).await else {
        return;
    };
    s.rounds(1).await;
    assert_eq!(s.references("org1", "queued").await.len(), 5);
    assert_eq!(s.references("org2", "queued").await.len(), 7);
    // The entry looks again a minute later, not at every tick.
    let asks = |r: kat_scheduler::cron::TickReport| r.entries["coldstart"].ran;
    assert!(!asks(s.app.tick(SchedulerId::Boefje).await));
    s.app.advance(chrono::Duration::seconds(59));
    assert!(!asks(s.app.tick(SchedulerId::Boefje).await));
    s.app.advance(chrono::Duration::seconds(1));
    assert!(asks(s.app.tick(SchedulerId::Boefje).await));
    for other in [SchedulerId::Normalizer, SchedulerId::Report] {
        let report = s.app.tick(other).await;
        assert!(!report.entries.contains_key("coldstart"), "{report:?}");
    }
    let figures = s.coldstart_health().await;
    assert_eq!(figures["organisations_done"], 2);
    assert_eq!(figures["objects_loaded"], 12);
    assert_eq!(figures["tasks_planned"], 12);
    assert_eq!(figures["state"], "idle");
    // Pages of 2 against one snapshot: 3 pages for org1, 4 for org2, each with the same
    // valid_time.
    let seen = s.stub.seen();
    let org2: Vec<&Seen> = seen.iter().filter(|r| r.path == "/org2/objects").collect();
    assert_eq!(
        org2.iter()
            .map(|r| r.param("offset").unwrap())
            .collect::<Vec<_>>(),
        vec!["0", "2", "4", "6"]
    );
    assert!(
        org2.windows(2)
            .all(|w| w[0].param("valid_time") == w[1].param("valid_time"))
    );
}

async fn an_interrupted_pass_resumes_at_the_page_it_reached_and_others_go_on(backend: Backend) {
    let Some(s) = Setup::new(backend).await else {
        return;
    };
    // org2 fails from its third page on, past its attempts: left for the next round.
    s.octopoes.fail_from("org2", Some(4));
    s.rounds(1).await;
    let figures = s.coldstart_health().await;
    assert_eq!(figures["organisations_done"], 1, "org1 is not held up");
    assert_eq!(figures["organisations_failed"], 1);
    assert!(figures["failures"][0].as_str().unwrap().starts_with("org2"));
    assert_eq!(s.references("org1", "queued").await.len(), 5);
    assert_eq!(
        s.references("org2", "queued").await.len(),
        4,
        "its first two pages"
    );

    // Octopoes recovers; the service restarts and resumes org2 where it stopped.
    s.octopoes.fail_from("org2", None);
    s.stub.clear();
    let Setup {
        app,
        octopoes,
        stub,
        _dir,
    } = s;
    let app = app.restart().await;
    let s = Setup {
        app,
        octopoes,
        stub,
        _dir,
    };
    s.rounds(1).await;
    let offsets: Vec<String> = s
        .stub
        .seen()
        .iter()
        .filter(|r| r.path == "/org2/objects")
        .map(|r| r.param("offset").unwrap().to_owned())
        .collect();
    assert_eq!(offsets, vec!["4", "6"], "resumed, not started over");
    assert!(
        !s.stub.seen().iter().any(|r| r.path == "/org1/objects"),
        "org1's complete pass is not due again"
    );
    assert_eq!(s.references("org2", "queued").await.len(), 7);
}

async fn objects_missing_from_a_later_pass_are_gone_and_their_waiting_tasks_cancelled(
    backend: Backend,
) {
    let Some(s) = Setup::new(backend).await else {
        return;
    };
    s.rounds(1).await;
    // org1's object h0 disappears from Octopoes; a day later the sanity check runs again.
    let mut objects = hostnames("org1", 5);
    objects.remove(0);
    s.octopoes.set("org1", objects);
    s.app.advance(chrono::Duration::hours(2));
    s.rounds(2).await;
    assert_eq!(
        s.references("org1", "cancelled").await,
        vec!["Hostname|internet|org1-h0.nl"]
    );
    assert_eq!(
        s.references("org1", "queued").await.len(),
        4,
        "the rest wait on, not planned twice"
    );
    assert_eq!(s.references("org2", "queued").await.len(), 7);
    let figures = s.coldstart_health().await;
    assert_eq!(figures["objects_gone"], 1);
    assert_eq!(figures["tasks_planned"], 0, "nothing new to plan");
}

crate::backend_tests!(
    coldstart_pages_every_organisation_into_the_frontier_and_plans_their_work,
    an_interrupted_pass_resumes_at_the_page_it_reached_and_others_go_on,
    objects_missing_from_a_later_pass_are_gone_and_their_waiting_tasks_cancelled,
);
