//! `--cron`: what one cron tick costs at depth.
//!
//! - **Reschedule**: `--due` D boefje schedules (default 100,000) over 10 organisations, all
//!   due, each on its own object in the frontier, its plugin in the catalogue: the time of one
//!   tick of the boefje cron table, which turns every one into a task (checked: "fired D").
//!   Baseline: the writes that tick cannot avoid, as set statements on one connection (D task
//!   rows and their queue rows inserted from the schedules, D deadlines moved), rolled back.
//! - **Re-score**: `--rescore-tasks` T waiting boefje tasks (default 1,000,000; the heap holds
//!   its default 100,000, the rest are pending), each with a `grace-period` explanation: the time
//!   of one `rescore` entry run an hour later, which gives every one its new priority (heap and
//!   table) and its new explanation (checked: how many changed). Baseline: the same writes as
//!   set statements (every priority, in `tasks` and `task_queue`, and every explanation
//!   updated), rolled back.
//!
//! Each round seeds a fresh database with SQL; baseline and service alternate; medians.

use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Duration, Utc};
use kat_scheduler::clock::ManualClock;
use kat_scheduler::config::Settings;
use kat_scheduler::cron::Tick;
use kat_scheduler::domain::SchedulerId;
use kat_scheduler::startup::Application;
use tokio_util::sync::CancellationToken;

use super::harness::postgres::{pg_exec, with_db};
use super::harness::stats::median;
use super::{Options, Result};

const ORGS: usize = 10;
const CATALOGUE: &str = "[[plugins]]\nid = \"dns-records\"\ntype = \"boefje\"\nconsumes = [\"Hostname\"]\nscan_level = 1\nenabled = true\ninterval = 60\n";

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
/// 0–5 days, so priorities spread over 290–1000.
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
               GREATEST(3, LEAST(1000, round(3 + 997 * (1 - overdue / 604800.0))))::bigint,
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
               'priority', GREATEST(3, LEAST(1000, round(3 + 997 * (1 - overdue / 604800.0))))::bigint)::text
             FROM seed;"
        ),
    )?;
    vacuum(db, &["tasks", "task_scores"])?;
    super::harness::postgres::fill_queue(db)
}

/// Seconds `sql` takes on one connection.
fn timed(db: &str, sql: &str) -> Result<f64> {
    let started = Instant::now();
    pg_exec(db, sql)?;
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
/// tick took and its report of `entry`.
async fn one_tick(
    settings: Settings,
    start: DateTime<Utc>,
    at: DateTime<Utc>,
    entry: &str,
) -> Result<(f64, String)> {
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
    let summary = report
        .entries
        .get(entry)
        .map(|r| r.summary.clone())
        .unwrap_or_default();
    Ok((secs, summary))
}

pub fn run_cron(o: &Options, base: &str) -> Result<String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let catalogue = dir.path().join("cron.toml");
    std::fs::write(&catalogue, CATALOGUE)?;
    let (d, t) = (o.due, o.rescore_tasks);
    println!(
        "cron: one tick over {d} due boefje schedules; one re-score of {t} waiting tasks (grace-period); {} rounds",
        o.rounds
    );
    let (mut tick, mut tick_base, mut rescore, mut rescore_base) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..o.rounds {
        let now = Utc::now();
        with_db(o, base, &format!("_cron{r}"), |db| {
            migrate(db)?;
            seed_schedules(db, d, now)?;
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
                     INSERT INTO task_queue (task_id, scheduler_id, status, priority, created_at,
                       modified_at, hash, schedule_id, organisation)
                     SELECT id, 'boefje', 'queued', 2, {at}, {at}, hash, schedule_id, organisation
                       FROM fired;
                     UPDATE schedules SET deadline_at = {at} + interval '1 hour'
                       WHERE enabled AND deadline_at <= {at};
                     ROLLBACK;",
                    at = sql_time(now)
                ),
            )?;
            vacuum(db, &["tasks", "schedules"])?;
            let (secs, summary) =
                rt.block_on(one_tick(settings(db, &catalogue), now, now, "reschedule"))?;
            if !summary.starts_with(&format!("fired {d},")) {
                return Err(
                    format!("round {r}: the tick did {summary:?}, expected {d} fired").into(),
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
            let mut s = settings(db, &catalogue);
            s.schedulers.boefje.scoring = Some(kat_scheduler::scoring::Strategy::GracePeriod);
            let (secs, summary) =
                rt.block_on(one_tick(s, now, now + Duration::hours(1), "rescore"))?;
            let changed: usize = summary
                .strip_prefix("re-scored ")
                .and_then(|s| s.split(' ').next())
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("round {r}: the re-score did {summary:?}"))?;
            if changed < t / 2 {
                return Err(format!("round {r}: the re-score did {summary:?}").into());
            }
            println!(
                "  round {r}: re-score {secs:.2} s ({summary}, {:.0} tasks/s); baseline {b:.2} s",
                changed as f64 / secs
            );
            rescore.push(secs);
            rescore_base.push(b);
            Ok(())
        })?;
    }
    let (tm, tb, rm, rb) = (
        median(tick),
        median(tick_base),
        median(rescore),
        median(rescore_base),
    );
    println!(
        "cron: one tick over {d} due schedules {tm:.3} s (target ≤ 1 s), baseline {tb:.3} s, ratio {:.2}×",
        tm / tb
    );
    println!(
        "cron: re-score of {t} waiting tasks {rm:.2} s ({:.0} tasks/s), baseline {rb:.2} s, ratio {:.2}×",
        t as f64 / rm,
        rm / rb
    );
    Ok(format!(
        "cron_due={d} cron_tick_s={tm:.3} cron_tick_base_s={tb:.3} rescore_tasks={t} rescore_s={rm:.2} rescore_base_s={rb:.2}"
    ))
}
