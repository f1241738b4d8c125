//! PostgreSQL for the scenarios: a database of their own per run, the machine line, the seeded
//! tasks and counts of the table.
//!
//! Seeded tasks look like the field's: boefje tasks spread evenly over 30 boefje ids (`b0`…`b29`)
//! on 10 OCI images (`ghcr.io/minvws/openkat/img{0..9}:latest`, boefje `bK` on image `K % 10`)
//! and 50 organisations (`org0`…`org49`), each with its own input OOI, random priorities 2–1001;
//! normalizer and report tasks beside them. When `tasks` has the columns `plugin_id`,
//! `oci_image` and `input_ooi` (checked in `information_schema` after the broker migrated), the
//! seed fills them (the boefje, normalizer or report recipe id; the image; the input OOI), else it
//! leaves them out, so the harness runs on schemas with and without them.

use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Text};
use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl};

use crate::{Options, Result};

pub fn pg_exec(url: &str, sql: &str) -> Result<()> {
    let mut conn = PgConnection::establish(url)?;
    conn.batch_execute(sql)?;
    Ok(())
}

#[derive(QueryableByName)]
struct Num {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

pub fn pg_number(url: &str, sql: &str) -> Result<i64> {
    let mut conn = PgConnection::establish(url)?;
    let rows: Vec<Num> = diesel::sql_query(sql).load(&mut conn)?;
    Ok(rows.first().map(|r| r.n).unwrap_or(0))
}

/// Whether the broker that migrated this database keeps a `task_queue` row for queued tasks too
/// (migrations 11 to 15; since migration 16 only pending tasks have one), so that a build from
/// before can be benchmarked by the same harness (`KAT_BENCH_BIN`).
pub fn queue_holds_queued(url: &str) -> Result<bool> {
    Ok(pg_number(
        url,
        "SELECT COUNT(*) AS n FROM __diesel_schema_migrations WHERE version = '20261128000016'",
    )? == 0)
}

/// The statuses whose tasks have a `task_queue` row in this database, as SQL text.
pub fn queue_statuses(url: &str) -> Result<&'static str> {
    Ok(match queue_holds_queued(url)? {
        true => "('pending', 'queued')",
        false => "('pending')",
    })
}

/// Gives every task seeded straight into `tasks` the `task_queue` row the broker's own writes
/// would have given it ([`queue_statuses`]).
pub fn fill_queue(url: &str) -> Result<()> {
    let statuses = queue_statuses(url)?;
    pg_exec(
        url,
        &format!(
            "INSERT INTO task_queue (task_id, scheduler_id, status, priority, created_at, modified_at,
               hash, schedule_id, organisation, plugin_id, oci_image, input_ooi, deduplication_key)
             SELECT id, scheduler_id, status, priority, created_at, modified_at, hash, schedule_id,
               organisation, plugin_id, oci_image, input_ooi, deduplication_key
             FROM tasks t WHERE status IN {statuses}
               AND NOT EXISTS (SELECT 1 FROM task_queue q WHERE q.task_id = t.id)"
        ),
    )?;
    pg_exec(url, "VACUUM ANALYZE task_queue")
}

/// The columns the engine may keep beside `data` (the plugin, the image and the input OOI of a
/// task) that the table has. Seeding fills those that exist, so the harness runs on schemas
/// with and without them. Call it after the broker has migrated the database.
pub fn extra_columns(url: &str) -> Result<Vec<&'static str>> {
    #[derive(QueryableByName)]
    struct Col {
        #[diesel(sql_type = Text)]
        column_name: String,
    }
    let mut conn = PgConnection::establish(url)?;
    let have: Vec<String> = diesel::sql_query(
        "SELECT column_name::text AS column_name FROM information_schema.columns \
         WHERE table_schema = current_schema() AND table_name = 'tasks'",
    )
    .load::<Col>(&mut conn)?
    .into_iter()
    .map(|c| c.column_name)
    .collect();
    Ok(["plugin_id", "oci_image", "input_ooi"]
        .into_iter()
        .filter(|c| have.iter().any(|h| h == c))
        .collect())
}

/// The column list and the value list that fill `cols` for a row of `t` (with `t.s` the
/// scheduler, and for boefje tasks `t.boefje`, `t.image` and `t.ooi`).
pub fn extra_sql(cols: &[&str]) -> (String, String) {
    let mut names = String::new();
    let mut values = String::new();
    for c in cols {
        names.push_str(", ");
        names.push_str(c);
        values.push_str(match *c {
            "plugin_id" => {
                ", CASE t.s WHEN 'boefje' THEN t.boefje WHEN 'normalizer' THEN 'kat_bench_normalize' \
                 ELSE 'recipe-' || t.g END"
            }
            "oci_image" => ", CASE t.s WHEN 'boefje' THEN t.image END",
            _ => ", CASE t.s WHEN 'boefje' THEN t.ooi END",
        });
    }
    (names, values)
}

/// Boefje images, boefje ids and organisations of the seeded tasks: boefje `b{k}` runs image
/// `img{k % 10}`.
pub const IMAGES: usize = 10;
pub const BOEFJES: usize = 30;
pub const ORGS: usize = 50;

pub fn image_name(i: usize) -> String {
    format!("ghcr.io/minvws/openkat/img{i}:latest")
}

/// The schedulers of consecutive seeded rows, repeated: the original run's even split, and the
/// worker runs' ten boefje tasks to one normalizer and one report task.
pub const EVEN_SPLIT: [&str; 3] = ["boefje", "normalizer", "report"];
pub const BOEFJE_HEAVY: [&str; 12] = [
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "boefje",
    "normalizer",
    "report",
];

/// Queues `n` tasks straight in the table (pushing a million over HTTP would take longer than
/// the benchmark), the schedulers cycling as `cycle` (boefje entries first), with payloads
/// shaped like real ones: boefje tasks spread evenly over 30 boefje ids on 10 images and 50
/// organisations, each with its own input OOI, random priorities. Fills the extra columns
/// `cols` that the table has (see [`extra_columns`]).
pub fn seed_tasks(url: &str, n: usize, cycle: &[&str], cols: &[&str]) -> Result<()> {
    seed_tasks_as(url, n, cycle, cols, "queued")
}

/// [`seed_tasks`] with the tasks in `status` (`completed` for finished history, which gets no
/// queue row).
pub fn seed_tasks_as(
    url: &str,
    n: usize,
    cycle: &[&str],
    cols: &[&str],
    status: &str,
) -> Result<()> {
    let l = cycle.len();
    let b = cycle.iter().filter(|s| **s == "boefje").count();
    let array = cycle
        .iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(",");
    let (extra_names, extra_values) = extra_sql(cols);
    pg_exec(
        url,
        &format!(
            "INSERT INTO tasks (id, scheduler_id, schedule_id, organisation, type, hash, priority, data, \
               status, attempts, created_at, modified_at{extra_names})
             SELECT t.id, t.s, NULL, t.org, t.s, md5(t.id), t.priority,
               CASE t.s
                 WHEN 'boefje' THEN json_build_object('boefje', json_build_object('id', t.boefje,
                     'oci_image', t.image), 'input_ooi', t.ooi, 'organization', t.org, 'id', t.id)::text
                 WHEN 'normalizer' THEN json_build_object('normalizer', json_build_object('id', 'kat_bench_normalize'),
                     'raw_data', json_build_object('id', t.id, 'boefje_meta', json_build_object('id', t.id,
                     'organization', t.org)), 'id', t.id)::text
                 ELSE json_build_object('report_recipe_id', 'recipe-' || t.g, 'organisation_id',
                     t.org, 'id', t.id)::text
               END,
               '{status}', 0, t.created, t.created{extra_values}
             FROM (SELECT u.*, 'b' || (u.k % {BOEFJES}) AS boefje,
                          'ghcr.io/minvws/openkat/img' || (u.k % {BOEFJES} % {IMAGES}) || ':latest' AS image,
                          'org' || ((u.k / {BOEFJES}) % {ORGS}) AS org,
                          'Hostname|internet|host' || u.g || '.example.com' AS ooi
                   FROM (SELECT g, gen_random_uuid()::text AS id, (ARRAY[{array}])[g % {l} + 1] AS s,
                                (g / {l}) * {b} + g % {l} AS k, 2 + floor(random() * 1000)::bigint AS priority,
                                (now() AT TIME ZONE 'utc') - make_interval(secs => ({n} - g) / 1000000.0) AS created
                         FROM generate_series(1, {n}) g) u) t"
        ),
    )?;
    pg_exec(url, "VACUUM ANALYZE tasks")?;
    fill_queue(url)
}

/// Counts of the table's tasks by scheduler and status.
pub fn count_tasks(url: &str, scheduler: &str, statuses: &str) -> Result<i64> {
    pg_number(
        url,
        &format!(
            "SELECT COUNT(*) AS n FROM tasks WHERE scheduler_id = '{scheduler}' AND status IN ({statuses})"
        ),
    )
}

/// How many of `ids` the table has.
pub fn count_stored(url: &str, ids: &[String]) -> Result<usize> {
    count_ids(url, ids, "TRUE")
}

/// Runs `f` on a database of its own (`kat_bench_<pid><suffix>`), dropped afterwards unless
/// `--keep`.
pub fn with_db<T>(
    o: &Options,
    base: &str,
    suffix: &str,
    f: impl FnOnce(&str) -> Result<T>,
) -> Result<T> {
    let name = format!("kat_bench_{}{suffix}", std::process::id());
    pg_exec(&o.pg, &format!("CREATE DATABASE {name}"))?;
    let result = f(&format!("{base}/{name}"));
    if !o.keep {
        let _ = pg_exec(
            &o.pg,
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        );
    }
    result
}

/// The machine and PostgreSQL's commit setting, as a line for the reader.
pub fn machine(db: &str) -> Result<String> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    let sync = {
        let mut conn = PgConnection::establish(db)?;
        #[derive(QueryableByName)]
        struct S {
            #[diesel(sql_type = Text)]
            synchronous_commit: String,
        }
        let s: Vec<S> = diesel::sql_query("SHOW synchronous_commit").load(&mut conn)?;
        s.first()
            .map(|s| s.synchronous_commit.clone())
            .unwrap_or_default()
    };
    Ok(format!(
        "machine: {} CPUs ({cpu}); PostgreSQL synchronous_commit={sync}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    ))
}

/// How many of `ids` the table has with `condition`.
pub fn count_ids(url: &str, ids: &[String], condition: &str) -> Result<usize> {
    let mut conn = PgConnection::establish(url)?;
    let mut found = 0;
    for chunk in ids.chunks(5_000) {
        let list = chunk
            .iter()
            .map(|id| format!("'{id}'"))
            .collect::<Vec<_>>()
            .join(",");
        let rows: Vec<Num> = diesel::sql_query(format!(
            "SELECT COUNT(*) AS n FROM tasks WHERE id IN ({list}) AND {condition}"
        ))
        .load(&mut conn)?;
        found += rows.first().map(|r| r.n).unwrap_or(0) as usize;
    }
    Ok(found)
}
