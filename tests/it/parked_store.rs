//! The table of parked events (`storage::parked`) on both backends: an object's events are
//! claimed in the order parked whatever the clock of the instance that parked them, an event
//! that fails again waits behind those not tried since (one organisation's failures do not
//! starve the others'), and an object's later events wait as long as its first.

use chrono::{Duration, NaiveDateTime};
use kat_scheduler::listener::parked::object_key;
use kat_scheduler::storage::parked::{self, NewParked};
use kat_scheduler::storage::{self, AnyConnection};

use crate::helpers::*;

fn t(secs: i64) -> NaiveDateTime {
    chrono::DateTime::from_timestamp(1_800_000_000, 0)
        .unwrap()
        .naive_utc()
        + Duration::seconds(secs)
}

fn row(org: &str, reference: &str, seq: i64, body: &str) -> NewParked {
    NewParked {
        id: uuid::Uuid::new_v4().to_string(),
        source: "mutations",
        seq,
        organisation: org.into(),
        object_key: Some(object_key(org, reference)),
        body: body.into(),
        reason: "Katalogus failed".into(),
    }
}

/// Runs `f` on a connection to `app`'s (migrated) database.
async fn with_conn<T: Send + 'static>(
    app: &TestApp,
    f: impl FnOnce(&mut AnyConnection) -> T + Send + 'static,
) -> T {
    let uri = app.db.uri.clone();
    tokio::task::spawn_blocking(move || {
        let target = storage::DbTarget::parse(&uri).unwrap();
        let pool = storage::connect(&target, 1, std::time::Duration::from_secs(5)).unwrap();
        let mut conn = storage::checkout(&pool).unwrap();
        f(&mut conn)
    })
    .await
    .unwrap()
}

/// Parks an object's create and then its delete, due at t(10), and claims at t(10) (until
/// t(600)): the create alone.
fn create_then_delete(c: &mut AnyConnection) -> Vec<parked::Claimed> {
    parked::park(
        c,
        &[row("o", "x", 1, "create"), row("o", "x", 2, "delete")],
        t(0),
        t(10),
    )
    .unwrap();
    parked::claim(c, "mutations", t(10), t(600), 100).unwrap()
}

fn bodies(claimed: &[parked::Claimed]) -> Vec<String> {
    claimed.iter().map(|c| c.body.clone()).collect()
}

/// Another instance, its clock behind, parks the object's delete behind its create: the delete
/// is placed after the create all the same, and is first tried no sooner.
async fn an_objects_event_is_placed_after_those_parked_whatever_its_clock(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let claimed = with_conn(&app, |c| {
        parked::park(c, &[row("o", "x", 1_000, "create")], t(0), t(10)).unwrap();
        // Its own place (5) is before the create's, and it would be due sooner.
        parked::park(c, &[row("o", "x", 5, "delete")], t(1), t(5)).unwrap();
        let early = parked::claim(c, "mutations", t(6), t(600), 100).unwrap();
        let first = parked::claim(c, "mutations", t(10), t(600), 100).unwrap();
        parked::applied(c, &[first[0].id.clone()]).unwrap();
        let second = parked::claim(c, "mutations", t(10), t(600), 100).unwrap();
        (early, first, second)
    })
    .await;
    assert!(
        claimed.0.is_empty(),
        "not due before the create: {:?}",
        claimed.0
    );
    assert_eq!(bodies(&claimed.1), ["create"]);
    assert_eq!(bodies(&claimed.2), ["delete"]);
    assert!(claimed.2[0].seq > claimed.1[0].seq);
}

/// 150 events of a failing organisation, then one of another: the first 100 claimed fail again
/// (due a second later); the next claim takes the events not tried yet, the other
/// organisation's among them, before those tried again.
async fn events_that_fail_again_wait_behind_those_not_tried_since(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let (first, second) = with_conn(&app, |c| {
        let mut rows: Vec<NewParked> = (0..150)
            .map(|i| row("failing", &format!("o{i}"), i, "failing"))
            .collect();
        rows.push(row("other", "p", 150, "other"));
        parked::park(c, &rows, t(0), t(10)).unwrap();
        let first = parked::claim(c, "mutations", t(10), t(600), 100).unwrap();
        for claimed in &first {
            parked::again(
                c,
                &claimed.id,
                t(600),
                claimed.object_key.as_deref(),
                "Katalogus failed again",
                t(11),
            )
            .unwrap();
        }
        let second = parked::claim(c, "mutations", t(12), t(600), 100).unwrap();
        (first, second)
    })
    .await;
    assert_eq!(first.len(), 100);
    assert!(bodies(&first).iter().all(|b| b == "failing"));
    let second = bodies(&second);
    assert_eq!(second.len(), 100);
    assert!(
        second.contains(&"other".to_owned()),
        "not starved: {second:?}"
    );
}

/// The first of an object's events fails again and waits ten minutes: its later events are not
/// due before it (so a claim meanwhile need not read past them), a claim meanwhile takes
/// neither, and a claim while the first is taken takes nothing twice.
async fn an_objects_later_events_wait_as_long_as_its_first(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    #[derive(diesel::QueryableByName)]
    struct Next {
        #[diesel(sql_type = diesel::sql_types::Timestamp)]
        next_try_at: NaiveDateTime,
    }
    let (taken_twice, delete_due, meanwhile, later) = with_conn(&app, |c| {
        let first = create_then_delete(c);
        let taken_twice = parked::claim(c, "mutations", t(11), t(600), 100).unwrap();
        parked::again(
            c,
            &first[0].id,
            t(600),
            first[0].object_key.as_deref(),
            "Katalogus failed again",
            t(610),
        )
        .unwrap();
        let delete_due = diesel::RunQueryDsl::get_result::<Next>(
            diesel::sql_query("SELECT next_try_at FROM listener_parked WHERE body = 'delete'"),
            c,
        )
        .unwrap()
        .next_try_at;
        let meanwhile = parked::claim(c, "mutations", t(300), t(900), 100).unwrap();
        let later = parked::claim(c, "mutations", t(610), t(1200), 100).unwrap();
        (taken_twice, delete_due, meanwhile, later)
    })
    .await;
    assert!(taken_twice.is_empty(), "{taken_twice:?}");
    assert_eq!(delete_due, t(610));
    assert!(meanwhile.is_empty(), "{meanwhile:?}");
    assert_eq!(bodies(&later), ["create"]);
    assert_eq!(later[0].attempts, 1);
}

/// An object's first event refused for what it says no longer holds its later events back.
async fn a_refused_event_no_longer_holds_its_objects_later_ones(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let (first, next) = with_conn(&app, |c| {
        let first = create_then_delete(c);
        parked::refuse(c, &first[0].id, t(600), "malformed").unwrap();
        let next = parked::claim(c, "mutations", t(10), t(600), 100).unwrap();
        (first, next)
    })
    .await;
    assert_eq!(bodies(&first), ["create"]);
    assert_eq!(bodies(&next), ["delete"]);
}

/// An object's first event is taken by an instance that stopped (its claim runs for minutes),
/// and 250 of its later events, due, come first in the order due: a claim reads past them to
/// the events behind, which do not wait for that claim to run out.
async fn a_claim_reads_past_events_waiting_behind_a_taken_one(backend: Backend) {
    let Some(app) = spawn_app(backend).await else {
        return;
    };
    let claimed = with_conn(&app, |c| {
        parked::park(c, &[row("o", "x", 0, "first")], t(0), t(1)).unwrap();
        // Taken by the instance that stopped, until t(300).
        assert_eq!(
            parked::claim(c, "mutations", t(1), t(300), 1)
                .unwrap()
                .len(),
            1
        );
        let later: Vec<NewParked> = (1..=250).map(|i| row("o", "x", i, "later")).collect();
        parked::park(c, &later, t(0), t(5)).unwrap();
        parked::park(c, &[row("p", "y", 251, "other")], t(0), t(6)).unwrap();
        parked::claim(c, "mutations", t(10), t(600), 100).unwrap()
    })
    .await;
    assert_eq!(bodies(&claimed), ["other"]);
}

/// Events another instance parked are applied by the scheduler's owner even when it runs no
/// listener (no `QUEUE_URI`): the entry `parked` is registered on every instance, so events a
/// listener acked are never left in the table for want of one.
async fn events_parked_elsewhere_are_applied_by_an_owner_without_a_listener(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let path = dns_records_catalogue(&dir);
    let Some(app) = spawn_app_with(backend, move |s| s.catalogue.file = path).await else {
        return;
    };
    let x = "Hostname|internet|x.nl";
    let create = serde_json::json!({"operation": "create", "primary_key": x, "client_id": "org1",
        "value": {"primary_key": x, "object_type": "Hostname",
                  "scan_profile": {"level": 1, "reference": x, "scan_profile_type": "declared"}}});
    let now = kat_scheduler::clock::Clock::now(app.clock.as_ref()).naive_utc();
    with_conn(&app, move |c| {
        parked::park(c, &[row("org1", x, 1, &create.to_string())], now, now).unwrap();
    })
    .await;
    let report = app.tick(kat_scheduler::domain::SchedulerId::Boefje).await;
    assert_eq!(
        report.entries["parked"].summary,
        "applied 1, failed again 0, refused 0"
    );
    let tasks = app.boefje_tasks("org1", "queued").await;
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert_eq!(tasks[0]["data"]["input_ooi"], x);
    let left = with_conn(&app, move |c| {
        parked::claim(
            c,
            "mutations",
            now + Duration::hours(1),
            now + Duration::hours(2),
            10,
        )
        .unwrap()
        .len()
    })
    .await;
    assert_eq!(left, 0, "applied, and gone from the table");
}

crate::backend_tests!(
    events_parked_elsewhere_are_applied_by_an_owner_without_a_listener,
    a_refused_event_no_longer_holds_its_objects_later_ones,
    a_claim_reads_past_events_waiting_behind_a_taken_one,
    an_objects_event_is_placed_after_those_parked_whatever_its_clock,
    events_that_fail_again_wait_behind_those_not_tried_since,
    an_objects_later_events_wait_as_long_as_its_first,
);
