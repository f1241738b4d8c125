//! `--cron`: what one cron tick costs at depth, and what time and events cost a deep backlog.
//!
//! - **Reschedule**: `--due` D boefje schedules (default 100,000) over 10 organisations, all
//!   due, each on its own object in the frontier, its plugin in the catalogue: the time of one
//!   tick of the boefje cron table, which turns every one into a task (checked: "fired D").
//!   Baseline: the writes that tick cannot avoid, as set statements on one connection (D task
//!   rows and their queue rows inserted from the schedules, D deadlines moved), rolled back.
//! - **Time and events over T waiting tasks**: `--rescore-tasks` T waiting boefje tasks (default
//!   1,000,000; the heap holds its default 100,000, the rest are pending), each with a
//!   `grace-period` explanation and its priority (the moment it became due, overdue by 0–5
//!   days). Baseline: what a re-score of all of them writes, as set statements (every priority,
//!   in `tasks` and `task_queue`, and every explanation updated), rolled back; that is what the
//!   periodic re-score did every 10 minutes before priorities stopped aging (293.7 s at 1e6).
//!   - **An hour passes**: the service starts under `grace-period` and its boefje cron table
//!     runs a tick an hour later: its time, checked to contain no re-score and to leave every
//!     priority as it was.
//!   - **One object changes**: the service starts under `change-delta` with a catalogue of
//!     [`PLUGINS`] boefjes on the object's type; one object gets a task of each (planned,
//!     completed, planned again at scan level 1), then one event raises its scan level to 2,
//!     handed to the planner as the listener does: its time (the event's whole handling:
//!     catalogue, history, push of the duplicates, the re-score), checked to re-score the
//!     object's tasks and no other; beside it, the same event again (nothing to re-score) and
//!     the bare writes of those tasks' re-score (rolled back).
//!
//! Each round seeds a fresh database with SQL; baseline and service alternate; medians.
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Duration, Utc};
use kat_scheduler::clock::ManualClock;
use kat_scheduler::config::Settings;
use kat_scheduler::cron::Tick;
use kat_scheduler::domain::event::{ObjectEvent, ObjectState, Operation};
use kat_scheduler::domain::{SchedulerId, TaskStatus};
use kat_scheduler::queue::TaskPatch;
use kat_scheduler::queue::fair::Fairness;
use kat_scheduler::scoring::Strategy;
use kat_scheduler::startup::Application;
use tokio_util::sync::CancellationToken;

use super::harness::postgres::{pg_exec, pg_number, with_db};
use super::harness::stats::median;
use super::{Options, Result};

const ORGS: usize = 10;
/// Boefjes on a Hostname: the tasks one object's change concerns.
const PLUGINS: usize = 10;
/// The object whose scan level changes.
const CHANGED: &str = "Hostname|internet|changed.example.com";

/// `dns-records` (the schedules' boefje) and `PLUGINS − 1` more on the same type.
fn catalogue_toml() -> String {
    (0..PLUGINS)
        .map(|i| {
            let id = if i == 0 {
                "dns-records".to_owned()
            } else {
                format!("hostname-{i}")
            };
            format!(
                "[[plugins]]\nid = \"{id}\"\ntype = \"boefje\"\nconsumes = [\"Hostname\"]\nscan_level = 1\nenabled = true\ninterval = 60\n"
            )
        })
        .collect()
}

fn migrate(db: &str) -> Result<()> {
    use diesel::Connection;
    let mut conn = kat_scheduler::storage::AnyConnection::establish(db)?;
    kat_scheduler::storage::run_migrations(&mut conn)?;
    Ok(())
}

fn sql_time(t: DateTime<Utc>) -> String {
    format!(
        "'{}'::timestamp",
        t.naive_utc().format("%Y-%m-%d %H:%M:%S%.6f")
    )
}

/// D objects in the frontier and a due boefje schedule on each.
fn seed_schedules(db: &str, d: usize, now: DateTime<Utc>) -> Result<()> {
    let at = sql_time(now);
    pg_exec(
        db,
        &format!(
            "INSERT INTO frontier (organisation, reference, object_type, scan_level, scan_profile_type, \
               first_seen, last_seen, gone_at)
             SELECT 'org' || (g % {ORGS}), 'Hostname|internet|h' || g || '.example.com', 'Hostname', 2,
               'declared', {at} - interval '2 days', {at} - interval '2 days', NULL
             FROM generate_series(1, {d}) g;
             INSERT INTO schedules (id, scheduler_id, organisation, hash, data, enabled, schedule,
               deadline_at, created_at, modified_at)
             SELECT gen_random_uuid()::text, 'boefje', 'org' || (g % {ORGS}), md5('s' || g),
               json_build_object('boefje', json_build_object('id', 'dns-records'),
                 'input_ooi', 'Hostname|internet|h' || g || '.example.com',
                 'organization', 'org' || (g % {ORGS}))::text,
               true, NULL, {at} - make_interval(secs => {d} - g + 60), {at} - interval '2 days',
               {at} - interval '2 days'
             FROM generate_series(1, {d}) g;"
        ),
    )?;
    vacuum(db, &["frontier", "schedules"])
}

/// VACUUM ANALYZE, one statement per table (VACUUM runs outside a transaction block only).
fn vacuum(db: &str, tables: &[&str]) -> Result<()> {
    for t in tables {
        pg_exec(db, &format!("VACUUM ANALYZE {t}"))?;
    }
    Ok(())
}

/// T waiting boefje tasks, all `queued` in the table (the rebuild moves what the heap cannot
/// hold to `pending`), each with a grace-period explanation whose priority it has: overdue by
/// 0–5 days, so priorities (due moments, Unix seconds) spread over five days.
fn seed_scored(db: &str, t: usize, now: DateTime<Utc>) -> Result<()> {
    let at = sql_time(now);
    let iso = now.format("%Y-%m-%dT%H:%M:%S%.6fZ");
    pg_exec(
        db,
        &format!(
            "CREATE TEMP TABLE seed AS
             SELECT g, gen_random_uuid()::text AS id, 'org' || (g % 50) AS org,
               'Hostname|internet|h' || g || '.example.com' AS ooi,
               (g % 432000) AS overdue
             FROM generate_series(1, {t}) g;
             INSERT INTO tasks (id, scheduler_id, schedule_id, organisation, type, hash, priority, data,
               status, attempts, created_at, modified_at, plugin_id, oci_image, input_ooi)
             SELECT id, 'boefje', NULL, org, 'boefje', md5(id),
               floor(extract(epoch FROM {at}))::bigint - overdue,
               json_build_object('boefje', json_build_object('id', 'dns-records', 'oci_image',
                 'ghcr.io/minvws/openkat/dns-records:latest'), 'input_ooi', ooi, 'organization', org,
                 'id', id)::text,
               'queued', 0, {at} - make_interval(secs => {t} - g), {at} - make_interval(secs => {t} - g),
               'dns-records', 'ghcr.io/minvws/openkat/dns-records:latest', ooi
             FROM seed;
             INSERT INTO task_scores (task_id, explanation)
             SELECT id, json_build_object('strategy', 'grace-period',
               'inputs', json_build_object('now', '{iso}',
                 'last_run', to_char(({at} - make_interval(secs => 86400 + overdue)), 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),
                 'last_failed', false, 'findings_changed', false, 'scan_level', NULL,
                 'grace_secs', 86400),
               'terms', json_build_object('seconds_overdue', overdue),
               'priority', floor(extract(epoch FROM {at}))::bigint - overdue)::text
             FROM seed;"
        ),
    )?;
    vacuum(db, &["tasks", "task_scores"])?;
    super::harness::postgres::fill_queue(db)
}

/// The changed object's waiting tasks, as an SQL list of literals.
fn changed_ids(db: &str) -> Result<String> {
    use diesel::{Connection, RunQueryDsl};
    #[derive(diesel::QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::Text)]
        id: String,
    }
    let mut conn = diesel::PgConnection::establish(db)?;
    let ids: Vec<Id> = diesel::sql_query(format!(
        "SELECT id FROM tasks WHERE input_ooi = '{CHANGED}' AND status IN ('pending', 'queued')"
    ))
    .load(&mut conn)?;
    if ids.len() != PLUGINS {
        return Err(format!(
            "the object has {} waiting tasks, expected {PLUGINS}",
            ids.len()
        )
        .into());
    }
    Ok(ids
        .iter()
        .map(|i| format!("'{}'", i.id))
        .collect::<Vec<_>>()
        .join(", "))
}

/// Seconds `sql` takes on one connection (opened before the clock starts).
fn timed(db: &str, sql: &str) -> Result<f64> {
    use diesel::Connection;
    use diesel::connection::SimpleConnection;
    // Connected first: a baseline of a few rows is not the connection's setup.
    let mut conn = diesel::PgConnection::establish(db)?;
    let started = Instant::now();
    conn.batch_execute(sql)?;
    Ok(started.elapsed().as_secs_f64())
}

fn settings(db: &str, catalogue: &std::path::Path) -> Settings {
    let mut s = Settings::default();
    s.api.host = "127.0.0.1".into();
    s.api.port = 0;
    s.api.workers = 1;
    s.database.uri = db.to_owned();
    s.catalogue.file = catalogue.to_string_lossy().into_owned();
    s.queue.watchdog_interval_secs = 0;
    s.cron.tick_secs = 0;
    s
}

/// Starts the service on `db`, runs one boefje tick at `at`, stops it; answers the seconds the
/// tick took and its report.
async fn one_tick(
    settings: Settings,
    start: DateTime<Utc>,
    at: DateTime<Utc>,
) -> Result<(f64, kat_scheduler::cron::TickReport)> {
    let clock = Arc::new(ManualClock::new(start));
    let app = Application::build(settings, clock.clone()).await?;
    let cron = app.cron();
    let token = CancellationToken::new();
    let join = tokio::spawn(app.run_until_stopped(token.clone()));
    clock.set(at);
    let started = Instant::now();
    let report = cron
        .run(Tick {
            component: SchedulerId::Boefje,
            seq: 0,
            at,
        })
        .await;
    let secs = started.elapsed().as_secs_f64();
    token.cancel();
    join.await??;
    Ok((secs, report))
}

fn summary(report: &kat_scheduler::cron::TickReport, entry: &str) -> String {
    report
        .entries
        .get(entry)
        .map(|r| r.summary.clone())
        .unwrap_or_default()
}

/// The changed object's event at `level`, as the listener hands it to the planner.
fn event(operation: Operation, level: i64) -> ObjectEvent {
    ObjectEvent {
        operation,
        organisation: "org-changed".into(),
        reference: CHANGED.into(),
        object: Some(ObjectState {
            object_type: "Hostname".into(),
            scan_level: Some(level),
            scan_profile_type: Some("declared".into()),
        }),
    }
}

/// What one object's change cost: the event that re-scores its tasks, the same event again
/// (nothing to re-score), in seconds.
struct ObjectChange {
    rescoring: f64,
    unchanged: f64,
}

/// Starts the service under `change-delta` on `db` (T tasks waiting), gives the changed object
/// a task of each plugin with a history (planned, completed, planned again at level 1), then
/// times the event that raises its level to 2, and the same event again.
async fn object_change(db: &str, settings: Settings, start: DateTime<Utc>) -> Result<ObjectChange> {
    let clock = Arc::new(ManualClock::new(start));
    let app = Application::build(settings, clock.clone()).await?;
    let planner = app.planner();
    let broker = app.broker().clone();
    let token = CancellationToken::new();
    let join = tokio::spawn(app.run_until_stopped(token.clone()));
    let plan = |operation, level| {
        let planner = planner.clone();
        async move {
            let e = event(operation, level);
            let started = Instant::now();
            let planned = planner.objects(&[&e]).await;
            let secs = started.elapsed().as_secs_f64();
            match planned.into_iter().next() {
                Some(Ok(n)) => Ok((n, secs)),
                other => Err(format!("the event was not planned: {other:?}")),
            }
        }
    };
    let (created, _) = plan(Operation::Create, 1).await?;
    if created != PLUGINS {
        return Err(format!("the create planned {created}, expected {PLUGINS}").into());
    }
    // Never ran: 2, before all the seeded work (the heap's order: fairness is off); one at a
    // time, as politeness lets one object's tasks run.
    for _ in 0..PLUGINS {
        let popped = broker.pop(SchedulerId::Boefje, 1, None).await?;
        let Some(t) = popped.first() else {
            return Err("the object's task was not popped".into());
        };
        if t.organisation != "org-changed" {
            return Err(format!("popped another organisation's task: {}", t.organisation).into());
        }
        let done = TaskPatch {
            status: Some(TaskStatus::Completed),
            priority: None,
        };
        broker.patch(t.id, done).await?;
    }
    clock.advance(Duration::hours(1));
    let (again, _) = plan(Operation::Update, 1).await?;
    if again != PLUGINS {
        return Err(format!("the update planned {again}, expected {PLUGINS}").into());
    }
    let before = pg_number(
        db,
        "SELECT COALESCE(SUM(priority), 0)::bigint AS n FROM tasks WHERE status IN ('pending', 'queued')",
    )?;
    clock.advance(Duration::minutes(5));
    let (_, rescoring) = plan(Operation::Update, 2).await?;
    let (_, unchanged) = plan(Operation::Update, 2).await?;
    let after = pg_number(
        db,
        "SELECT COALESCE(SUM(priority), 0)::bigint AS n FROM tasks WHERE status IN ('pending', 'queued')",
    )?;
    token.cancel();
    join.await??;
    // Level 1 → 2 under change-delta: 40 sooner each, and nothing else moved.
    let expected = before - 40 * PLUGINS as i64;
    if after != expected {
        return Err(format!(
            "the change moved the priorities by {}, expected {}",
            after - before,
            expected - before
        )
        .into());
    }
    Ok(ObjectChange {
        rescoring,
        unchanged,
    })
}

pub fn run_cron(o: &Options, base: &str) -> Result<String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let catalogue = dir.path().join("cron.toml");
    std::fs::write(&catalogue, catalogue_toml())?;
    let (d, t) = (o.due, o.rescore_tasks);
    println!(
        "cron: one tick over {d} due boefje schedules; an hour passing and one object changing over {t} waiting tasks; {} rounds",
        o.rounds
    );
    let (mut tick, mut tick_base) = (Vec::new(), Vec::new());
    let (mut hour, mut full_base) = (Vec::new(), Vec::new());
    let (mut change, mut unchanged, mut change_base) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..o.rounds {
        let now = Utc::now();
        with_db(o, base, &format!("_cron{r}"), |db| {
            migrate(db)?;
            seed_schedules(db, d, now)?;
            // The fired tasks go into the heap: a queue row each only where the broker under
            // test keeps queued tasks in `task_queue` (before migration 16).
            let at = sql_time(now);
            let queue_rows = match super::harness::postgres::queue_holds_queued(db)? {
                true => format!(
                    "INSERT INTO task_queue (task_id, scheduler_id, status, priority, created_at,
                       modified_at, hash, schedule_id, organisation)
                     SELECT id, 'boefje', 'queued', 2, {at}, {at}, hash, schedule_id, organisation
                       FROM fired;"
                ),
                false => String::new(),
            };
            let b = timed(
                db,
                &format!(
                    "BEGIN;
                     CREATE TEMP TABLE fired AS
                     SELECT gen_random_uuid()::text AS id, id AS schedule_id, organisation, hash, data
                       FROM schedules WHERE enabled AND deadline_at <= {at};
                     INSERT INTO tasks (id, scheduler_id, schedule_id, organisation, type, hash, priority,
                       data, status, attempts, created_at, modified_at)
                     SELECT id, 'boefje', schedule_id, organisation, 'boefje', hash, 2, data,
                       'queued', 0, {at}, {at} FROM fired;
                     {queue_rows}
                     UPDATE schedules SET deadline_at = {at} + interval '1 hour'
                       WHERE enabled AND deadline_at <= {at};
                     ROLLBACK;",
                ),
            )?;
            vacuum(db, &["tasks", "schedules"])?;
            let (secs, report) = rt.block_on(one_tick(settings(db, &catalogue), now, now))?;
            let fired = summary(&report, "reschedule");
            if !fired.starts_with(&format!("fired {d},")) {
                return Err(
                    format!("round {r}: the tick did {fired:?}, expected {d} fired").into(),
                );
            }
            println!(
                "  round {r}: reschedule {secs:.3} s ({:.0} schedules/s); baseline {b:.3} s",
                d as f64 / secs
            );
            tick.push(secs);
            tick_base.push(b);
            Ok(())
        })?;
        with_db(o, base, &format!("_rescore{r}"), |db| {
            migrate(db)?;
            seed_scored(db, t, now)?;
            let b = timed(
                db,
                "BEGIN;
                 UPDATE tasks SET priority = priority - 6
                   WHERE scheduler_id = 'boefje' AND status IN ('pending', 'queued');
                 UPDATE task_queue SET priority = priority - 6 WHERE scheduler_id = 'boefje';
                 UPDATE task_scores SET explanation = replace(explanation, '\"strategy\"', '\"strategy\" ');
                 ROLLBACK;",
            )?;
            vacuum(db, &["tasks", "task_scores"])?;
            // An hour passes under grace-period: the tick rewrites nothing.
            let sum = "SELECT COALESCE(SUM(priority), 0)::bigint AS n FROM tasks WHERE status IN ('pending', 'queued')";
            let before = pg_number(db, sum)?;
            let mut s = settings(db, &catalogue);
            s.schedulers.boefje.scoring = Some(Strategy::GracePeriod);
            let (secs, report) = rt.block_on(one_tick(s, now, now + Duration::hours(1)))?;
            if report.entries.contains_key("rescore") || pg_number(db, sum)? != before {
                return Err(format!("round {r}: the hour's tick re-scored: {report:?}").into());
            }
            println!(
                "  round {r}: an hour later, the boefje tick {:.1} ms (entries: {}); a full re-score's bare writes {b:.2} s",
                secs * 1e3,
                report
                    .entries
                    .keys()
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            hour.push(secs);
            full_base.push(b);
            // One object changes under change-delta.
            let mut s = settings(db, &catalogue);
            s.schedulers.boefje.scoring = Some(Strategy::ChangeDelta);
            s.schedulers.boefje.fairness = Some(Fairness::Off);
            let c = rt.block_on(object_change(db, s, now + Duration::hours(1)))?;
            // The ids are known to the re-score (the push's duplicates): so they are here.
            let ids = changed_ids(db)?;
            let ob = timed(
                db,
                &format!(
                    "BEGIN;
                     UPDATE tasks SET priority = priority - 40 WHERE id IN ({ids});
                     UPDATE task_queue SET priority = priority - 40 WHERE task_id IN ({ids});
                     UPDATE task_scores SET explanation = replace(explanation, '\"strategy\"', '\"strategy\" ')
                       WHERE task_id IN ({ids});
                     ROLLBACK;"
                ),
            )?;
            println!(
                "  round {r}: one object's change ({PLUGINS} waiting tasks re-scored) {:.1} ms; the same event again (nothing to re-score) {:.1} ms; bare writes {:.1} ms",
                c.rescoring * 1e3,
                c.unchanged * 1e3,
                ob * 1e3
            );
            change.push(c.rescoring);
            unchanged.push(c.unchanged);
            change_base.push(ob);
            Ok(())
        })?;
    }
    let (tm, tb) = (median(tick), median(tick_base));
    let (hm, fb) = (median(hour), median(full_base));
    let (cm, um, cb) = (median(change), median(unchanged), median(change_base));
    println!(
        "cron: one tick over {d} due schedules {tm:.3} s (target ≤ 1 s), baseline {tb:.3} s, ratio {:.2}×",
        tm / tb
    );
    println!(
        "cron: an hour passing over {t} waiting tasks: the tick {:.1} ms, no re-score; a full re-score's bare writes {fb:.2} s (ratio {:.4}×)",
        hm * 1e3,
        hm / fb
    );
    println!(
        "cron: one object's change at {t} waiting: {:.1} ms ({PLUGINS} tasks re-scored), the same event with nothing to re-score {:.1} ms, bare writes of the {PLUGINS} {:.1} ms",
        cm * 1e3,
        um * 1e3,
        cb * 1e3
    );
    Ok(format!(
        "cron_due={d} cron_tick_s={tm:.3} cron_tick_base_s={tb:.3} rescore_tasks={t} hour_tick_s={hm:.4} full_rescore_base_s={fb:.2} object_change_s={cm:.4} object_unchanged_s={um:.4} object_base_s={cb:.4}"
    ))
}
