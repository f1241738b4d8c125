//! ColdStart against a stub Octopoes that speaks its real object listing, its rounds asked for
//! by the boefje cron table's `coldstart` entry: several pages and organisations into the
//! frontier and their work planned, an interrupted pass resumed after a restart, objects gone
//! from a later pass marked gone and their tasks cancelled, and nothing found gone that Octopoes
//! still holds (short pages, unreadable objects, a listing short of its count).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
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
        Self::with(backend, |_| {}).await
    }

    async fn with(
        backend: Backend,
        tweak: impl FnOnce(&mut kat_scheduler::config::Settings) + Send + 'static,
    ) -> Option<Setup> {
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
            tweak(s);
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
        let mut refs: Vec<String> = self
            .app
            .boefje_tasks(org, status)
            .await
            .iter()
            .map(|t| t["data"]["input_ooi"].as_str().unwrap().to_owned())
            .collect();
        refs.sort();
        refs
    }

    /// The app's frontier, read and written on a connection of the test's own.
    fn frontier(&self) -> kat_scheduler::frontier::Frontier {
        self.app.frontier()
    }

    /// Which of `org`'s first `n` hostnames the frontier holds as gone.
    async fn gone(&self, org: &str, n: usize) -> Vec<String> {
        let references: Vec<String> = hostnames(org, n)
            .iter()
            .map(|o| o["primary_key"].as_str().unwrap().to_owned())
            .collect();
        let mut gone: Vec<String> = self
            .frontier()
            .objects(org, &references)
            .await
            .unwrap()
            .into_iter()
            .filter(|r| r.gone_at.is_some())
            .map(|r| r.reference)
            .collect();
        gone.sort();
        gone
    }

    /// Asserts that none of `org`'s first `n` hostnames is gone, nor any of its tasks cancelled.
    async fn nothing_gone(&self, org: &str, n: usize) {
        assert_eq!(
            self.references(org, "cancelled").await,
            Vec::<String>::new()
        );
        assert_eq!(self.gone(org, n).await, Vec::<String>::new());
    }

    /// A first pass, then a second one that fails after its first page of org1 (offset 0,
    /// h0 and h1), left for the next round.
    async fn interrupt_the_second_pass_after_one_page(&self) {
        self.rounds(1).await;
        self.octopoes.fail_from("org1", Some(2));
        self.app.advance(chrono::Duration::hours(2));
        self.rounds(2).await;
        assert_eq!(self.coldstart_health().await["organisations_failed"], 1);
    }

    /// Octopoes lists `objects` for org1 and answers again; the next round resumes the pass.
    async fn resume_over(&self, objects: Vec<Value>) {
        self.octopoes.set("org1", objects);
        self.octopoes.fail_from("org1", None);
        self.stub.clear();
        self.app.advance(chrono::Duration::minutes(2));
        self.rounds(3).await;
    }

    /// The values of `param` in org1's requests to `path` since the stub was cleared, sorted
    /// when `sorted`.
    fn asked(&self, path: &str, param: &str, sorted: bool) -> Vec<String> {
        let mut out: Vec<String> = self
            .stub
            .seen()
            .iter()
            .filter(|r| r.path == path)
            .map(|r| r.param(param).unwrap().to_owned())
            .collect();
        if sorted {
            out.sort();
        }
        out
    }

    /// Ticks the boefje table a minute or more after the last, and waits until ColdStart has
    /// looked `n` times since start (a round or, with nothing due, only its new boefjes).
    async fn looks(&self, n: u64) {
        self.app.advance(chrono::Duration::minutes(2));
        let report = self.app.tick(SchedulerId::Boefje).await;
        assert!(report.entries["coldstart"].ran, "{report:?}");
        tokio::time::timeout(Duration::from_secs(30), self.app.coldstart.wait_looks(n))
            .await
            .expect("ColdStart looks");
    }

    /// The boefje of each of `org`'s queued tasks, with its object, sorted.
    async fn work(&self, org: &str) -> Vec<(String, String)> {
        let mut work: Vec<(String, String)> = self
            .app
            .boefje_tasks(org, "queued")
            .await
            .iter()
            .map(|t| {
                (
                    t["data"]["boefje"]["id"].as_str().unwrap().to_owned(),
                    t["data"]["input_ooi"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        work.sort();
        work
    }

    async fn coldstart_health(&self) -> Value {
        self.app.service_health("coldstart").await["additional"].clone()
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

/// Octopoes answers fewer objects a page than asked (a cap on `limit` below the page size) while
/// its `count` says more follow: the pass pages on to the count, so a later pass still sees every
/// object and finds none gone.
async fn a_short_page_is_not_the_last_while_the_count_says_more_follow(backend: Backend) {
    let Some(s) = Setup::new(backend).await else {
        return;
    };
    s.rounds(1).await;
    *s.octopoes.page_cap.lock().unwrap() = Some(1);
    s.stub.clear();
    s.app.advance(chrono::Duration::hours(2));
    s.rounds(2).await;
    s.nothing_gone("org1", 5).await;
    assert_eq!(s.references("org1", "queued").await.len(), 5);
    assert_eq!(s.references("org2", "queued").await.len(), 7);
    let offsets: Vec<String> = s
        .stub
        .seen()
        .iter()
        .filter(|r| r.path == "/org1/objects")
        .map(|r| r.param("offset").unwrap().to_owned())
        .collect();
    assert_eq!(offsets, vec!["0", "1", "2", "3", "4"]);
    let figures = s.coldstart_health().await;
    assert_eq!(figures["objects_gone"], 0);
    assert_eq!(figures["objects_loaded"], 12);
}

/// An object Octopoes lists but that cannot be read (a scan level that is not an integer) is
/// still held by Octopoes, which names it: its frontier row is kept and its waiting task is not
/// cancelled. The pass confirmed every other object it listed, so an object truly missing from
/// the listing is still found gone in that pass.
async fn an_object_listed_but_unreadable_keeps_its_row_and_its_waiting_task(backend: Backend) {
    let Some(s) = Setup::new(backend).await else {
        return;
    };
    s.rounds(1).await;
    let mut objects = hostnames("org1", 5);
    objects[2]["scan_profile"]["level"] = Value::from("two");
    objects.remove(0);
    s.octopoes.set("org1", objects);
    s.app.advance(chrono::Duration::hours(2));
    s.rounds(2).await;
    assert_eq!(
        s.references("org1", "cancelled").await,
        vec!["Hostname|internet|org1-h0.nl"],
        "h2 (unreadable) waits on; h0 (missing) is gone"
    );
    assert_eq!(
        s.gone("org1", 5).await,
        vec!["Hostname|internet|org1-h0.nl"]
    );
    assert!(
        s.references("org1", "queued")
            .await
            .contains(&"Hostname|internet|org1-h2.nl".to_owned())
    );
    assert_eq!(s.coldstart_health().await["objects_gone"], 1);
}

/// A pass that cannot vouch for the whole listing marks nothing gone, not even an object truly
/// missing from it: one that met an unreadable object without a reference, and one whose listing
/// ended (on an empty page) short of the count Octopoes gave. Each ends, and the next whole pass
/// finds the missing object gone.
async fn a_pass_that_cannot_confirm_the_whole_listing_marks_nothing_gone(backend: Backend) {
    let Some(s) = Setup::new(backend).await else {
        return;
    };
    s.rounds(1).await;
    let mut objects = hostnames("org1", 5);
    objects.remove(0);
    let readable = objects.clone();
    objects.push(serde_json::json!({"object_type": "Hostname", "name": "no-key.nl"}));
    s.octopoes.set("org1", objects);
    s.app.advance(chrono::Duration::hours(2));
    s.rounds(2).await;
    s.nothing_gone("org1", 5).await;

    // Readable again, but the count claims three objects more than the listing gives.
    s.octopoes.set("org1", readable);
    *s.octopoes.count_extra.lock().unwrap() = 3;
    s.app.advance(chrono::Duration::hours(2));
    s.rounds(3).await;
    s.nothing_gone("org1", 5).await;
    assert_eq!(s.references("org1", "queued").await.len(), 5);

    *s.octopoes.count_extra.lock().unwrap() = 0;
    s.app.advance(chrono::Duration::hours(2));
    s.rounds(4).await;
    assert_eq!(
        s.references("org1", "cancelled").await,
        vec!["Hostname|internet|org1-h0.nl"]
    );
}

/// A listing that shrinks while a pass pages through it moves the objects after the gap onto
/// pages the pass has read: here the pass is interrupted after its first page, h0 leaves
/// Octopoes (no event), and the resumed pass starts at offset 2, where h3 now is, passing h2
/// over. The count went down, so the pass vouches for nothing it did not see: h2 keeps its row
/// and its task, and so does h0 until a whole pass finds it gone.
async fn a_listing_that_shrank_while_the_pass_paged_marks_nothing_gone(backend: Backend) {
    let Some(s) = Setup::new(backend).await else {
        return;
    };
    s.interrupt_the_second_pass_after_one_page().await;
    let mut objects = hostnames("org1", 5);
    objects.remove(0);
    s.resume_over(objects).await;
    assert_eq!(
        s.asked("/org1/objects", "offset", false),
        vec!["2"],
        "resumed where it stopped"
    );
    s.nothing_gone("org1", 5).await;
    assert_eq!(s.references("org1", "queued").await.len(), 5);

    // The next whole pass sees the listing as it is: h0 is gone, h2 is not.
    s.app.advance(chrono::Duration::hours(2));
    s.rounds(4).await;
    assert_eq!(
        s.references("org1", "cancelled").await,
        vec!["Hostname|internet|org1-h0.nl"]
    );
}

/// Octopoes lists objects by type alone, and normalizers write and delete objects at past valid
/// times, so a listing can change under a pass's snapshot without shrinking: one object deleted
/// from a page already read and another added further on move the objects after the gap back a
/// place, and the one that moved onto a page already read is never seen. The pass asks Octopoes
/// about each object it did not see before marking it gone: the one that moved is still there,
/// and keeps its task.
async fn a_listing_that_moved_under_the_pass_marks_gone_only_what_octopoes_says_is_gone(
    backend: Backend,
) {
    let Some(s) = Setup::new(backend).await else {
        return;
    };
    s.interrupt_the_second_pass_after_one_page().await;
    // The first page (h0, h1) was read; now h0 is deleted and h5 added: still five objects,
    // and h2 has moved onto the first page.
    let mut objects = hostnames("org1", 6);
    objects.remove(0);
    s.resume_over(objects).await;
    assert_eq!(
        s.asked("/org1/objects", "offset", false),
        vec!["2", "4"],
        "resumed where it stopped"
    );
    assert_eq!(
        s.asked("/org1/object", "reference", true),
        vec!["Hostname|internet|org1-h2.nl"],
        "the object the pass did not see, asked of Octopoes"
    );
    s.nothing_gone("org1", 6).await;
    assert!(
        s.references("org1", "queued")
            .await
            .contains(&"Hostname|internet|org1-h2.nl".to_owned()),
        "the object that moved keeps its waiting task"
    );

    // The next whole pass does not see h0, and Octopoes says it is gone.
    s.stub.clear();
    s.app.advance(chrono::Duration::hours(2));
    s.rounds(4).await;
    assert_eq!(
        s.asked("/org1/object", "reference", true),
        vec!["Hostname|internet|org1-h0.nl"]
    );
    assert_eq!(
        s.gone("org1", 6).await,
        vec!["Hostname|internet|org1-h0.nl"]
    );
    assert_eq!(
        s.references("org1", "cancelled").await,
        vec!["Hostname|internet|org1-h0.nl"]
    );
    assert_eq!(s.coldstart_health().await["objects_gone"], 1);
}

/// Octopoes down when the pass asks about the objects it did not see: none is marked gone nor
/// any task cancelled, and the next pass asks again.
async fn objects_a_pass_did_not_see_stay_while_octopoes_cannot_answer_for_them(backend: Backend) {
    let Some(s) = Setup::new(backend).await else {
        return;
    };
    s.rounds(1).await;
    let mut objects = hostnames("org1", 5);
    objects.remove(0);
    s.octopoes.set("org1", objects);
    s.octopoes.fail_lookups(true);
    s.app.advance(chrono::Duration::hours(2));
    s.rounds(2).await;
    s.nothing_gone("org1", 5).await;
    assert_eq!(s.references("org1", "queued").await.len(), 5);

    s.octopoes.fail_lookups(false);
    s.app.advance(chrono::Duration::hours(2));
    s.rounds(3).await;
    assert_eq!(
        s.references("org1", "cancelled").await,
        vec!["Hostname|internet|org1-h0.nl"]
    );
}

/// What a ColdStart page plans for an object a lookup recorded: it as new while only lookups
/// wrote its row, as changed once a lookup wrote new values over a planned row, and nothing once
/// the object's own event (which the listener plans) wrote the same values.
async fn a_row_a_lookup_recorded_is_planned_until_an_event_or_a_pass_planned_it(backend: Backend) {
    use kat_scheduler::domain::event::{ObjectEvent, ObjectState, Operation};
    let Some(s) = Setup::new(backend).await else {
        return;
    };
    let frontier = s.frontier();
    let reference = "Hostname|internet|looked-up.nl";
    let state = |level| ObjectState {
        object_type: "Hostname".into(),
        scan_level: Some(level),
        scan_profile_type: Some("declared".into()),
    };
    let event = |level| ObjectEvent {
        operation: Operation::Update,
        organisation: "org9".into(),
        reference: reference.into(),
        object: Some(state(level)),
    };
    let planned = |level| {
        let frontier = frontier.clone();
        async move {
            // A snapshot after every write here: the page is the newest word.
            let snapshot = (Utc::now() + chrono::Duration::days(1)).naive_utc();
            frontier
                .changed(
                    "org9",
                    &mut vec![(reference.to_owned(), state(level))],
                    snapshot,
                )
                .await
                .unwrap()
                .0
                .iter()
                .map(|e| e.operation)
                .collect::<Vec<_>>()
        }
    };
    let at = |secs| (Utc::now() + chrono::Duration::seconds(secs)).naive_utc();
    frontier.record_answers(&[&event(1)], at(0)).await.unwrap();
    assert_eq!(
        planned(1).await,
        vec![Operation::Create],
        "new, never planned"
    );
    frontier.record_answers(&[&event(1)], at(1)).await.unwrap();
    assert_eq!(planned(1).await, vec![Operation::Create], "asked again");
    frontier.apply_objects(&[&event(1)], at(2)).await.unwrap();
    assert_eq!(planned(1).await, vec![], "its event planned it");
    frontier.record_answers(&[&event(1)], at(3)).await.unwrap();
    assert_eq!(planned(1).await, vec![], "the same values looked up");
    frontier.record_answers(&[&event(2)], at(4)).await.unwrap();
    assert_eq!(
        planned(2).await,
        vec![Operation::Update],
        "changed by a lookup"
    );
    frontier.apply_objects(&[&event(2)], at(5)).await.unwrap();
    assert_eq!(planned(2).await, vec![]);
}

/// A pass pages through Octopoes' listing as it was when the pass began (its snapshot); what
/// the listener wrote since is newer and stands. Here org2's pass is interrupted, and before it
/// resumes an hour later the user lowers one of its objects to level 0 and another is created and
/// deleted: the resumed pages, which still list both as they were, neither plan work on them nor
/// write the old state back.
async fn a_pass_does_not_write_its_snapshot_over_what_events_changed_since(backend: Backend) {
    use kat_scheduler::domain::event::{ObjectEvent, ObjectState, Operation};
    let Some(s) = Setup::new(backend).await else {
        return;
    };
    s.octopoes.fail_from("org2", Some(4));
    s.rounds(1).await;
    assert_eq!(
        s.references("org2", "queued").await.len(),
        4,
        "its first two pages"
    );

    let (lowered, deleted) = (
        "Hostname|internet|org2-h5.nl",
        "Hostname|internet|org2-h6.nl",
    );
    let event = |operation, reference: &str, level: Option<i64>| ObjectEvent {
        operation,
        organisation: "org2".into(),
        reference: reference.into(),
        object: level.map(|l| ObjectState {
            object_type: "Hostname".into(),
            scan_level: Some(l),
            scan_profile_type: Some("declared".into()),
        }),
    };
    let frontier = s.frontier();
    s.app.advance(chrono::Duration::minutes(30));
    frontier
        .apply_objects(
            &[
                &event(Operation::Update, lowered, Some(0)),
                &event(Operation::Create, deleted, Some(1)),
            ],
            s.app.now().naive_utc(),
        )
        .await
        .unwrap();
    s.app.advance(chrono::Duration::minutes(30));
    frontier
        .apply_objects(
            &[&event(Operation::Delete, deleted, None)],
            s.app.now().naive_utc(),
        )
        .await
        .unwrap();

    // The pass resumes over the snapshot, which lists both as they were at level 1.
    s.octopoes.fail_from("org2", None);
    s.rounds(2).await;
    assert_eq!(
        s.references("org2", "queued").await,
        (0..5)
            .map(|i| format!("Hostname|internet|org2-h{i}.nl"))
            .collect::<Vec<_>>(),
        "h4 planned from the resumed page; nothing on the lowered or the deleted object"
    );
    let rows = frontier
        .objects("org2", &[lowered.to_owned(), deleted.to_owned()])
        .await
        .unwrap();
    let row = |r: &str| rows.iter().find(|x| x.reference == r).unwrap();
    assert_eq!(row(lowered).scan_level, Some(0), "the lowered level stands");
    assert!(
        row(deleted).gone_at.is_some(),
        "the deleted object stays gone"
    );
}

/// An organisation Katalogus lists and Octopoes has no node for (404 `Node not found`: nothing
/// was ever stored for it) has an empty listing, as mula reads it: its pass completes, with
/// nothing marked gone, instead of failing every minute for ever.
async fn an_organisation_octopoes_has_no_node_for_is_paged_as_empty(backend: Backend) {
    let Some(s) = Setup::new(backend).await else {
        return;
    };
    s.octopoes.objects.lock().unwrap().remove("org2");
    s.rounds(1).await;
    let figures = s.coldstart_health().await;
    assert_eq!(
        (
            figures["organisations_done"].clone(),
            figures["organisations_failed"].clone()
        ),
        (serde_json::json!(2), serde_json::json!(0)),
        "{figures}"
    );
    assert_eq!(s.references("org1", "queued").await.len(), 5);
    assert!(s.references("org2", "queued").await.is_empty());
}

/// An object Octopoes cannot read fails the listing of every page that holds it, for good (a
/// record its model refuses: Octopoes answers the pydantic error 400). The pass reads the rest of that page around it and goes on; it
/// marks nothing gone, since it could not see that one. Without this the organisation's pass
/// failed at that page in every round, and nothing after it was ever planned.
async fn an_object_octopoes_cannot_list_fails_only_itself(backend: Backend) {
    let Some(s) = Setup::new(backend).await else {
        return;
    };
    // org2's seven objects in pages of two: h3 breaks the page at offset 2, h4 the one at 4.
    s.octopoes
        .broken
        .lock()
        .unwrap()
        .insert("org2".into(), vec![3, 4]);
    s.rounds(1).await;
    let listed: Vec<String> = hostnames("org2", 7)
        .iter()
        .map(|o| o["primary_key"].as_str().unwrap().to_owned())
        .collect();
    let mut expected: Vec<String> = listed
        .iter()
        .enumerate()
        .filter(|(i, _)| ![3, 4].contains(i))
        .map(|(_, r)| r.clone())
        .collect();
    expected.sort();
    assert_eq!(s.references("org2", "queued").await, expected);
    assert_eq!(s.references("org1", "queued").await.len(), 5);
    let figures = s.coldstart_health().await;
    assert_eq!(figures["organisations_done"], 2, "{figures}");
    assert_eq!(figures["organisations_failed"], 0, "{figures}");
    s.nothing_gone("org2", 7).await;
}

/// A boefje enabled in Katalogus after ColdStart first saw its organisation (Rocky's onboarding
/// sets clearance on the first object, then enables the boefjes): no event announces the objects
/// it may now scan, as Octopoes publishes a change of scan profile only. At its next look
/// ColdStart plans it, as mula's `process_new_boefjes` does, on every object Octopoes holds of
/// a type it consumes at a level it may scan; with Octopoes failing it waits for the next look,
/// an object Octopoes cannot list is read around, and once planned it is not planned again.
async fn a_boefje_enabled_since_the_last_round_is_planned_on_the_objects_octopoes_holds(
    backend: Backend,
) {
    let katalogus = KatalogusState::default();
    let dns = katalogus_boefje("dns-records", &["Hostname"], 1, false);
    let nmap = |enabled: bool| {
        let mut p = katalogus_boefje("nmap", &["IPAddressV4"], 2, false);
        p["enabled"] = serde_json::json!(enabled);
        p
    };
    // A boefje that runs only on updates: enabled later, it is planned on what it may scan all
    // the same, as mula plans every boefje it finds enabled.
    let ports = |enabled: bool| {
        let mut p = katalogus_boefje("port-check", &["IPAddressV4"], 2, false);
        p["enabled"] = serde_json::json!(enabled);
        p["run_on"] = serde_json::json!(["update"]);
        p
    };
    katalogus
        .plugins
        .lock()
        .unwrap()
        .insert("org1".into(), vec![dns.clone(), nmap(false), ports(false)]);
    let k = katalogus.serve();
    let url = k.url.clone();
    let Some(s) = Setup::with(backend, move |c| {
        c.catalogue.file = String::new();
        c.clients.katalogus_api = url;
        c.catalogue.ttl_secs = 60;
    })
    .await
    else {
        return;
    };
    let ip = |n: u8, level| {
        octopoes_object(
            &format!("IPAddressV4|internet|10.0.0.{n}"),
            "IPAddressV4",
            level,
        )
    };
    let mut objects = hostnames("org1", 2);
    objects.extend([ip(1, 2), ip(2, 3), ip(3, 1), ip(4, 4)]);
    s.octopoes.set("org1", objects);
    s.rounds(1).await;
    let dns_work = vec![
        (
            "dns-records".to_owned(),
            "Hostname|internet|org1-h0.nl".to_owned(),
        ),
        (
            "dns-records".to_owned(),
            "Hostname|internet|org1-h1.nl".to_owned(),
        ),
    ];
    assert_eq!(s.work("org1").await, dns_work);

    // nmap is enabled while Octopoes fails: nothing yet, and it stays new.
    katalogus
        .plugins
        .lock()
        .unwrap()
        .insert("org1".into(), vec![dns.clone(), nmap(true), ports(true)]);
    s.octopoes.fail_from("org1", Some(0));
    s.app.catalogue.refresh().await;
    s.looks(2).await;
    assert_eq!(s.work("org1").await, dns_work);

    // Octopoes answers, but cannot list 10.0.0.2 (the second of nmap's listing): it fails every
    // page that holds it, and the rest of the page is read around it, as a pass's page is. And
    // it answers one object a page where two are asked: its count says more follow.
    s.octopoes.fail_from("org1", None);
    *s.octopoes.page_cap.lock().unwrap() = Some(1);
    s.octopoes
        .broken
        .lock()
        .unwrap()
        .insert("org1".into(), vec![1]);
    s.looks(3).await;
    let mut expected = dns_work.clone();
    for boefje in ["nmap", "port-check"] {
        for n in [1, 4] {
            expected.push((
                boefje.to_owned(),
                format!("IPAddressV4|internet|10.0.0.{n}"),
            ));
        }
    }
    expected.sort();
    assert_eq!(
        s.work("org1").await,
        expected,
        "level 1 is below the boefjes' 2; 10.0.0.2 is not listed"
    );
    assert_eq!(
        s.coldstart_health().await["tasks_planned_for_new_boefjes"],
        4
    );

    s.looks(4).await;
    assert_eq!(
        s.coldstart_health().await["tasks_planned_for_new_boefjes"],
        4
    );

    // Two more are enabled: the first in Katalogus' order consumes a type Octopoes' model does
    // not have, and Octopoes refuses its listing; the second is planned all the same (it waited
    // behind the first for good), and the first stays new.
    s.octopoes.broken.lock().unwrap().clear();
    *s.octopoes.page_cap.lock().unwrap() = None;
    s.octopoes
        .unknown_types
        .lock()
        .unwrap()
        .insert("NoSuchType".into());
    let custom = katalogus_boefje("custom", &["NoSuchType"], 1, false);
    let mut whois = katalogus_boefje("whois", &["Hostname"], 1, false);
    whois["enabled"] = serde_json::json!(true);
    let mut custom_on = custom.clone();
    custom_on["enabled"] = serde_json::json!(true);
    katalogus.plugins.lock().unwrap().insert(
        "org1".into(),
        vec![dns.clone(), nmap(true), ports(true), custom_on, whois],
    );
    s.app.catalogue.refresh().await;
    s.looks(5).await;
    let whois_work: Vec<(String, String)> = s
        .work("org1")
        .await
        .into_iter()
        .filter(|(b, _)| b == "whois")
        .collect();
    assert_eq!(
        whois_work,
        vec![
            (
                "whois".to_owned(),
                "Hostname|internet|org1-h0.nl".to_owned()
            ),
            (
                "whois".to_owned(),
                "Hostname|internet|org1-h1.nl".to_owned()
            ),
        ]
    );
    // The next look lists the refused boefje's type again, and not the planned one's: whois
    // is recorded, custom is not.
    s.stub.clear();
    s.looks(6).await;
    let listings = |of: &str| {
        s.stub
            .seen()
            .iter()
            .filter(|r| r.params("types") == [of])
            .count()
    };
    assert!(listings("NoSuchType") > 0, "custom is tried again");
    assert_eq!(listings("Hostname"), 0, "whois is planned once");
}

/// A boefje run as Bytes keeps it: the boefje, when it started, when it ended.
type BoefjeRun = (String, DateTime<Utc>, Option<DateTime<Utc>>);

/// Bytes as the scheduler's client meets it: a token at `POST /token`, and each object's boefje
/// runs at `GET /bytes/boefje_meta`, newest start first, `limit` of them, of one boefje when
/// `boefje_id` is given. `runs` maps an object to its runs (boefje, started, ended); `failing`
/// answers every listing with a 500.
struct BytesState {
    runs: Arc<Mutex<HashMap<String, Vec<BoefjeRun>>>>,
    failing: Arc<AtomicBool>,
}

impl BytesState {
    /// dns-records ran on `reference`, ending at `at`.
    fn ran(&self, reference: &str, at: DateTime<Utc>) {
        self.runs.lock().unwrap().insert(
            reference.to_owned(),
            vec![("dns-records".to_owned(), at, Some(at))],
        );
    }

    fn serve(&self) -> Stub {
        let (runs, failing) = (self.runs.clone(), self.failing.clone());
        Stub::start(move |seen| match seen.path.as_str() {
            "/token" => {
                Reply::json(serde_json::json!({"access_token": "t1", "token_type": "bearer"}))
            }
            "/bytes/boefje_meta" if failing.load(Ordering::SeqCst) => {
                Reply::status(500, r#"{"detail":"Internal Server Error"}"#)
            }
            "/bytes/boefje_meta" => {
                let ooi = seen.param("input_ooi").unwrap_or_default();
                let limit: usize = seen.param("limit").unwrap().parse().unwrap();
                let mut of: Vec<_> = runs
                    .lock()
                    .unwrap()
                    .get(ooi)
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|(b, _, _)| seen.param("boefje_id").is_none_or(|id| id == b))
                    .collect();
                of.sort_by_key(|(_, started, _)| std::cmp::Reverse(*started));
                let metas: Vec<Value> = of
                    .into_iter()
                    .take(limit)
                    .map(|(boefje, started, ended)| {
                        serde_json::json!({
                            "id": uuid::Uuid::new_v4(), "boefje": {"id": boefje, "version": null},
                            "input_ooi": ooi, "arguments": {}, "organization": seen.param("organization"),
                            "runnable_hash": null, "environment": {},
                            "started_at": started.to_rfc3339(), "ended_at": ended.map(|e| e.to_rfc3339()),
                        })
                    })
                    .collect();
                Reply::json(Value::Array(metas))
            }
            _ => Reply::status(404, r#"{"detail":"Not Found"}"#),
        })
    }
}

async fn work_bytes_saw_run_within_its_grace_period_waits_for_its_schedule(backend: Backend) {
    let bytes = BytesState {
        runs: Arc::default(),
        failing: Arc::default(),
    };
    let stub = bytes.serve();
    let url = stub.url.clone();
    let Some(s) = Setup::with(backend, move |c| {
        c.clients.bytes_api = url;
        c.clients.bytes_username = "scheduler".into();
        c.clients.bytes_password = "secret".into();
    })
    .await
    else {
        return;
    };
    let now = s.app.now();
    let host = |n: usize| format!("Hostname|internet|org1-h{n}.nl");
    let hours = chrono::Duration::hours;
    {
        let mut runs = bytes.runs.lock().unwrap();
        let dns = |started, ended| ("dns-records".to_owned(), started, ended);
        // h0 ran an hour ago, within the grace period of a day; h1 two days ago.
        runs.insert(host(0), vec![dns(now - hours(2), Some(now - hours(1)))]);
        runs.insert(host(1), vec![dns(now - hours(49), Some(now - hours(48)))]);
        // h2 never ran. h3 is running, started ten minutes ago.
        runs.insert(
            host(3),
            vec![dns(now - chrono::Duration::minutes(10), None)],
        );
        // h4 ran three hours ago, and other boefjes ran on it later.
        let mut h4 = vec![dns(now - hours(4), Some(now - hours(3)))];
        for i in 0..3 {
            let t = now - chrono::Duration::minutes(i);
            h4.push((format!("other-{i}"), t, Some(t)));
        }
        runs.insert(host(4), h4);
    }
    s.rounds(1).await;
    let dns = |n: usize| ("dns-records".to_owned(), host(n));
    assert_eq!(s.work("org1").await, vec![dns(1), dns(2)]);
    assert_eq!(
        s.work("org2").await.len(),
        7,
        "Bytes has no run of org2's work"
    );
    assert_eq!(
        s.app
            .metric("scheduler_run_lookups_total{outcome=\"ran\"}")
            .await,
        4.0
    );
    assert_eq!(
        s.app
            .metric("scheduler_run_lookups_total{outcome=\"none\"}")
            .await,
        8.0
    );
    // The work held back has its schedule, due a grace period after its run.
    let page: Value = s
        .app
        .get("/schedules?scheduler_id=boefje&organisation=org1&limit=100")
        .await
        .json()
        .await
        .unwrap();
    let mut deadlines: Vec<(String, String)> = page["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["data"]["input_ooi"].as_str().unwrap().to_owned(),
                s["deadline_at"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    deadlines.sort();
    let due = |t: DateTime<Utc>| {
        (t + chrono::Duration::days(1))
            .format("%Y-%m-%dT%H:%M:%S")
            .to_string()
    };
    let at = |d: &str| d.get(..19).unwrap().to_owned();
    let deadlines: Vec<(String, String)> =
        deadlines.into_iter().map(|(o, d)| (o, at(&d))).collect();
    assert_eq!(
        deadlines,
        vec![
            (host(0), due(now - hours(1))),
            (host(1), due(now)),
            (host(2), due(now)),
            (host(3), due(now - chrono::Duration::minutes(10))),
            (host(4), due(now - hours(3))),
        ]
    );

    // Bytes fails: new objects are planned as the table says, not held.
    bytes.failing.store(true, Ordering::SeqCst);
    let mut objects = hostnames("org1", 7);
    s.octopoes.set("org1", objects.clone());
    bytes.ran(&host(5), now);
    s.app.advance(hours(2));
    s.rounds(2).await;
    assert_eq!(s.work("org1").await, vec![dns(1), dns(2), dns(5), dns(6)]);
    assert!(
        s.app
            .metric("scheduler_run_lookups_total{outcome=\"failed\"}")
            .await
            >= 1.0
    );

    // Bytes answers again, after its backoff: a new object's recent run holds its work back.
    bytes.failing.store(false, Ordering::SeqCst);
    objects.extend(hostnames("org1", 8).into_iter().skip(7));
    s.octopoes.set("org1", objects);
    let later = s.app.now();
    bytes.ran(&host(7), later);
    s.app.advance(hours(2));
    s.rounds(3).await;
    assert_eq!(s.work("org1").await, vec![dns(1), dns(2), dns(5), dns(6)]);

    // A day after the service started, its tasks table holds every run within the grace
    // period: Bytes is not asked any more, whatever it says.
    s.octopoes.set("org1", hostnames("org1", 9));
    let at = s.app.now();
    bytes.ran(&host(8), at);
    s.app.advance(hours(25));
    let asked = stub.seen().len();
    s.rounds(4).await;
    assert!(s.work("org1").await.contains(&dns(8)));
    assert_eq!(stub.seen().len(), asked, "Bytes is not asked");
    drop(stub);
}

crate::backend_tests!(
    work_bytes_saw_run_within_its_grace_period_waits_for_its_schedule,
    a_boefje_enabled_since_the_last_round_is_planned_on_the_objects_octopoes_holds,
    an_object_octopoes_cannot_list_fails_only_itself,
    an_organisation_octopoes_has_no_node_for_is_paged_as_empty,
    a_pass_does_not_write_its_snapshot_over_what_events_changed_since,
    a_row_a_lookup_recorded_is_planned_until_an_event_or_a_pass_planned_it,
    a_listing_that_shrank_while_the_pass_paged_marks_nothing_gone,
    a_listing_that_moved_under_the_pass_marks_gone_only_what_octopoes_says_is_gone,
    objects_a_pass_did_not_see_stay_while_octopoes_cannot_answer_for_them,
    coldstart_pages_every_organisation_into_the_frontier_and_plans_their_work,
    an_interrupted_pass_resumes_at_the_page_it_reached_and_others_go_on,
    objects_missing_from_a_later_pass_are_gone_and_their_waiting_tasks_cancelled,
    a_short_page_is_not_the_last_while_the_count_says_more_follow,
    an_object_listed_but_unreadable_keeps_its_row_and_its_waiting_task,
    a_pass_that_cannot_confirm_the_whole_listing_marks_nothing_gone,
);
