//! PostgreSQL alone writing what the broker's pushes write: the library's own insert statement
//! (`storage::tasks::insert_linked`), at the broker's batch size, on three connections like the
//! three engines, with no HTTP, no JSON parsing, no hashing, no heap. What durable pushes could
//! reach on this server if the broker's own work cost nothing: the bound any build of the broker
//! meets on the same machine, measured beside it.
//!
//! And what a pop's batch writes ([`dispatches`]): the engine's own fenced statement on one
//! connection, as its engine runs it, for heap tasks and for pending tasks taken from the
//! backlog; the bound the server sets on the ratio of the two kinds of pop.

use std::time::{Duration, Instant};

use kat_scheduler::domain::TaskStatus;
use kat_scheduler::storage::rows::TaskRow;
use kat_scheduler::storage::schedules::ScheduleRow;
use kat_scheduler::storage::{self, DbTarget, tasks};

use crate::Result;

/// The scheduler id of the rows written here: none of the broker's, so it never loads them.
pub const SCHEDULER: &str = "bench-ceiling";

/// The three kinds of push `http::push_request` sends, by `k % 3`: a payload like it, the task
/// type, and whether the push gets mula's schedule of its hash (boefje and report work does).
fn kind(k: usize, name: &str, id: &str) -> (String, &'static str, bool) {
    match k % 3 {
        0 => (
            format!(
                r#"{{"boefje":{{"id":"{name}","oci_image":"ghcr.io/minvws/openkat/bench:latest"}},"input_ooi":"Hostname|internet|{name}.example.com","organization":"bench-push","id":"{id}"}}"#
            ),
            "boefje",
            true,
        ),
        1 => (
            format!(
                r#"{{"normalizer":{{"id":"{name}"}},"raw_data":{{"id":"{id}","boefje_meta":{{"id":"{id}","organization":"bench-push"}}}},"id":"{id}"}}"#
            ),
            "normalizer",
            false,
        ),
        _ => (
            format!(
                r#"{{"report_recipe_id":"{name}","organisation_id":"bench-push","id":"{id}"}}"#
            ),
            "report",
            true,
        ),
    }
}

/// New tasks a second, each statement `batch` of them (`linked`: with the schedules boefje and
/// report pushes get, in the same statement, as the engines write them), on `conns` connections
/// for `seconds`.
pub fn pushes(db: &str, conns: usize, batch: usize, seconds: f64, linked: bool) -> Result<f64> {
    let target = DbTarget::parse(db).map_err(|e| e.to_string())?;
    let pool = storage::connect(&target, conns as u32 + 1, Duration::from_secs(5))?;
    let start = Instant::now();
    // Each call's work is new work: a name seen in an earlier call would find its hash's
    // schedule there and write none.
    let run = uuid::Uuid::new_v4().simple().to_string();
    let handles: Vec<_> = (0..conns)
        .map(|c| {
            let pool = pool.clone();
            let run = run.clone();
            std::thread::spawn(move || -> Result<usize> {
                let mut conn = storage::checkout(&pool)?;
                let mut done = 0usize;
                while start.elapsed().as_secs_f64() < seconds {
                    let now = chrono::Utc::now().naive_utc();
                    let mut rows = Vec::with_capacity(batch);
                    let mut schedules = Vec::new();
                    for k in 0..batch {
                        let id = uuid::Uuid::new_v4().to_string();
                        let name = format!("ceiling-{run}-{c}-{done}-{k}");
                        let (data, task_type, has_schedule) = kind(done + k, &name, &id);
                        let hash = kat_scheduler::domain::hash::task_hash(&name);
                        if linked && has_schedule {
                            schedules.push((
                                id.clone(),
                                ScheduleRow {
                                    id: uuid::Uuid::new_v4().to_string(),
                                    scheduler_id: SCHEDULER.into(),
                                    organisation: "bench-push".into(),
                                    hash: Some(hash.clone()),
                                    data: data.replace(&format!(r#","id":"{id}""#), ""),
                                    enabled: true,
                                    schedule: None,
                                    deadline_at: Some(now + chrono::Duration::days(1)),
                                    created_at: now,
                                    modified_at: now,
                                    disabled_reason: None,
                                },
                            ));
                        }
                        rows.push(TaskRow {
                            plugin_id: Some(name.clone()),
                            oci_image: (task_type == "boefje")
                                .then(|| "ghcr.io/minvws/openkat/bench:latest".into()),
                            input_ooi: (task_type == "boefje")
                                .then(|| format!("Hostname|internet|{name}.example.com")),
                            data,
                            hash: Some(hash),
                            schedule_id: None,
                            id,
                            scheduler_id: SCHEDULER.into(),
                            organisation: "bench-push".into(),
                            task_type: task_type.into(),
                            priority: 2 + ((done + k) as i64 % 1000),
                            status: TaskStatus::Queued,
                            attempts: 0,
                            lease_expires_at: None,
                            failure_reason: None,
                            created_at: now,
                            modified_at: now,
                            deduplication_key: None,
                        });
                    }
                    let links: Vec<tasks::Link<'_>> =
                        schedules.iter().map(|(t, s)| (t.as_str(), s)).collect();
                    tasks::insert_linked(&mut conn, &rows, &[], &links)?;
                    done += batch;
                }
                Ok(done)
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h
            .join()
            .map_err(|_| "PostgreSQL-alone push thread panicked")??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// Ids of `db`'s boefje tasks in `status`, in a random order (an organisation's or an image's
/// tasks lie scattered through the table, as the pops that take them find them).
pub fn ids_in(db: &str, status: &str) -> Result<Vec<String>> {
    use diesel::{Connection, RunQueryDsl};
    #[derive(diesel::QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::Text)]
        id: String,
    }
    let mut conn = diesel::PgConnection::establish(db)?;
    Ok(diesel::sql_query(format!(
        "SELECT id FROM tasks WHERE scheduler_id = 'boefje' AND status = '{status}' ORDER BY random()"
    ))
    .load::<Id>(&mut conn)?
    .into_iter()
    .map(|r| r.id)
    .collect())
}

/// Makes this harness the owner of `db`'s boefje scheduler under a new epoch (its broker has
/// stopped), so the engine's fenced statement writes; answers the owner's name and epoch.
pub fn own_boefje(db: &str) -> Result<(String, i64)> {
    const OWNER: &str = "bench-pg-alone";
    super::postgres::pg_exec(
        db,
        &format!(
            "INSERT INTO scheduler_owners (scheduler_id, owner, epoch, expires_at) \
             VALUES ('boefje', '{OWNER}', 1, now() + interval '1 day') \
             ON CONFLICT (scheduler_id) DO UPDATE SET owner = '{OWNER}', \
               epoch = scheduler_owners.epoch + 1, expires_at = now() + interval '1 day'"
        ),
    )?;
    let epoch = super::postgres::pg_number(
        db,
        "SELECT epoch AS n FROM scheduler_owners WHERE scheduler_id = 'boefje'",
    )?;
    Ok((OWNER.into(), epoch))
}

/// How a batch of pops writes its tasks in [`dispatches`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatch {
    /// Heap tasks (`queued → dispatched`): the task's update alone.
    Heap,
    /// Pending tasks taken from the backlog: the task's update and its queue row's delete in the
    /// same statement, as the engine writes them.
    Pending,
    /// Tasks with a queue row written as heap tasks are (the update alone; the harness made them
    /// `queued` beforehand, their queue rows kept), and their queue rows deleted afterwards, a
    /// thousand a statement (`storage::tasks::forget_stale_queue_rows`, each only while its task
    /// is not pending), timed apart: what the pops' statement would cost with the delete taken
    /// off it, and what the delete would cost elsewhere.
    Swept,
}

/// Tasks a second that the engine's fenced batch statement dispatches on one connection, `batch`
/// tasks a statement, `count` tasks taken from `ids` (fewer if it runs out), written as `how`
/// says; and for [`Dispatch::Swept`] the µs a task that deleting their queue rows afterwards
/// took on the same connection (0 otherwise), timed apart.
pub fn dispatches(
    db: &str,
    owner: &(String, i64),
    ids: &mut Vec<String>,
    how: Dispatch,
    batch: usize,
    count: usize,
) -> Result<(f64, f64)> {
    use kat_scheduler::domain::SchedulerId;
    use kat_scheduler::storage::WriterConn;
    let target = DbTarget::parse(db).map_err(|e| e.to_string())?;
    let pool = storage::connect(&target, 2, Duration::from_secs(5))?;
    let mut conn = WriterConn::checkout_engine(&pool, false)?;
    let taken: Vec<String> = ids.drain(..count.min(ids.len())).collect();
    let start = Instant::now();
    for chunk in taken.chunks(batch) {
        let now = chrono::Utc::now().naive_utc();
        let (heap, backlog): (&[String], &[String]) = match how {
            Dispatch::Pending => (&[], chunk),
            Dispatch::Heap | Dispatch::Swept => (chunk, &[]),
        };
        let w = tasks::fenced::FencedWrite {
            scheduler: SchedulerId::Boefje,
            instance: &owner.0,
            epoch: owner.1,
            updates: &[],
            dispatched: heap,
            taken_pending: backlog,
            pending_rows: false,
            at: now,
            lease: Some(now + chrono::Duration::minutes(10)),
        };
        let written = tasks::fenced::write(&mut conn, &w)?;
        if written.len() != chunk.len() {
            return Err(format!(
                "the statement dispatched {} of {} tasks",
                written.len(),
                chunk.len()
            )
            .into());
        }
    }
    let rate = taken.len() as f64 / start.elapsed().as_secs_f64();
    if how != Dispatch::Swept {
        return Ok((rate, 0.0));
    }
    let start = Instant::now();
    for chunk in taken.chunks(1_000) {
        let ids: Vec<&str> = chunk.iter().map(String::as_str).collect();
        tasks::forget_stale_queue_rows(&mut conn, &ids)?;
    }
    let sweep_us = start.elapsed().as_secs_f64() * 1e6 / taken.len().max(1) as f64;
    Ok((rate, sweep_us))
}

/// What a backlog search for one organisation costs on the engine's connection, read both ways:
/// joined to `tasks` (`storage::tasks::pending_matching`, the filter in the statement), and from
/// the queue rows alone (`storage::tasks::pending_keyed`, as the engine searches for a runner's
/// filter since `queue::engine::backlog`). `rows` a search (a pop's and the read ahead's), every
/// organisation of the seeded table once a pass, the two ways alternating, `passes` times.
/// Answers the medians in microseconds (joined, queue rows alone).
pub fn searches(db: &str, rows: usize, passes: usize) -> Result<(f64, f64)> {
    use kat_scheduler::domain::SchedulerId;
    use kat_scheduler::domain::filter::{Column, FilterNode};
    use kat_scheduler::domain::keys::KeyField;
    use kat_scheduler::storage::WriterConn;
    let target = DbTarget::parse(db).map_err(|e| e.to_string())?;
    let pool = storage::connect(&target, 2, Duration::from_secs(5))?;
    let mut conn = WriterConn::checkout_engine(&pool, false)?;
    let (mut joined, mut alone) = (Vec::new(), Vec::new());
    for pass in 0..passes {
        for k in 0..super::postgres::ORGS {
            let org = [format!("org{k}")];
            let filter = FilterNode::equals(Column::Organisation, &[], &org[0]);
            let lookup = Some((KeyField::Organisation, &org[..]));
            for way in [pass % 2, 1 - pass % 2] {
                let began = Instant::now();
                let found = if way == 0 {
                    tasks::pending_matching(
                        &mut conn,
                        SchedulerId::Boefje,
                        lookup,
                        &filter,
                        rows,
                        &[],
                    )?
                    .len()
                } else {
                    tasks::pending_keyed(
                        &mut conn,
                        SchedulerId::Boefje,
                        KeyField::Organisation,
                        &org,
                        rows,
                    )?
                    .len()
                };
                let us = began.elapsed().as_secs_f64() * 1e6;
                if found == 0 {
                    continue;
                }
                match way {
                    0 => joined.push(us),
                    _ => alone.push(us),
                }
            }
        }
    }
    Ok((super::stats::median(joined), super::stats::median(alone)))
}

/// What a refill costs the server per task, two ways, on the engine's connection: as the engines
/// refilled until now, moving the picks (`storage::tasks::refill`: the best pending tasks read,
/// then written `queued` and their queue rows deleted, in a transaction of its own; what a batch
/// that meets a pending row still writes of the tasks a heap holds as read), and as they refill
/// now, reading alone (`storage::tasks::refill_picks`, on after the last row read, as the engine
/// reads while it holds what it read). `picks` a refill (a heap's tenth), the two ways
/// alternating, `passes` times; the moves take the best pending tasks left, the reads page on
/// through the rows after them. Answers the medians in microseconds per task (move, read).
pub fn refills(db: &str, picks: usize, passes: usize) -> Result<(f64, f64)> {
    use diesel::Connection;
    use kat_scheduler::domain::SchedulerId;
    use kat_scheduler::storage::WriterConn;
    let target = DbTarget::parse(db).map_err(|e| e.to_string())?;
    let pool = storage::connect(&target, 2, Duration::from_secs(5))?;
    let mut conn = WriterConn::checkout_engine(&pool, false)?;
    let (mut moves, mut reads) = (Vec::new(), Vec::new());
    let mut after: Option<kat_scheduler::storage::rows::PopKey> = None;
    for pass in 0..passes {
        for way in [pass % 2, 1 - pass % 2] {
            let now = chrono::Utc::now().naive_utc();
            let began = Instant::now();
            let n = match way {
                0 => conn
                    .transaction(|c| {
                        tasks::refill(c, SchedulerId::Boefje, picks, now, &mut |_| {})
                    })?
                    .len(),
                _ => {
                    let from = after
                        .as_ref()
                        .map_or(tasks::Keyset::First, tasks::Keyset::After);
                    let rows = tasks::refill_picks(&mut conn, SchedulerId::Boefje, from, picks)?;
                    after = rows.last().map(|r| kat_scheduler::storage::rows::PopKey {
                        priority: r.priority,
                        created_at: r.created_at,
                        id: r.id.clone(),
                    });
                    rows.len()
                }
            };
            let us = began.elapsed().as_secs_f64() * 1e6;
            if n == 0 {
                return Err("no pending task left to refill".into());
            }
            match way {
                0 => moves.push(us / n as f64),
                _ => reads.push(us / n as f64),
            }
        }
    }
    Ok((super::stats::median(moves), super::stats::median(reads)))
}

/// What a push batch's read of waiting work by hash costs on the engine's connection, on `db`'s
/// `tasks` as the brokers left it (never analysed, as the scenario's start made it), two ways:
/// as the engines read until now, one statement `hash IN (…) AND scheduler_id = … AND status IN
/// (…)` (kept here as the baseline), and as they read now (`storage::tasks::waiting_by_hash`: a
/// lookup of the hash index per hash). A push batch reads by hash when the engine does not know
/// the backlog's hashes: after rows changed behind its back, or beyond two million pending.
/// `batch` hashes a read, half of them of waiting tasks (re-pushes) and half new; the two ways
/// alternating, `passes` times. Answers the medians in microseconds per read (until now, now).
pub fn hash_reads(db: &str, batch: usize, passes: usize) -> Result<(f64, f64)> {
    use diesel::{Connection, RunQueryDsl};
    use kat_scheduler::domain::SchedulerId;
    use kat_scheduler::storage::rows::TaskRow;
    use kat_scheduler::storage::sql::Sql;
    use kat_scheduler::storage::{Backend, WriterConn};
    #[derive(diesel::QueryableByName)]
    struct Hash {
        #[diesel(sql_type = diesel::sql_types::Text)]
        hash: String,
    }
    let waiting: Vec<String> = {
        let mut c = diesel::PgConnection::establish(db)?;
        diesel::sql_query(format!(
            "SELECT hash FROM tasks WHERE scheduler_id = 'boefje' \
             AND status IN ('pending', 'queued') AND hash IS NOT NULL \
             ORDER BY random() LIMIT {}",
            passes * batch
        ))
        .load::<Hash>(&mut c)?
        .into_iter()
        .map(|h| h.hash)
        .collect()
    };
    if waiting.len() < passes * batch / 2 {
        return Err("too few waiting tasks with a hash to read by hash".into());
    }
    let target = DbTarget::parse(db).map_err(|e| e.to_string())?;
    let pool = storage::connect(&target, 2, Duration::from_secs(5))?;
    let mut conn = WriterConn::checkout_engine(&pool, false)?;
    let (mut before, mut now) = (Vec::new(), Vec::new());
    for pass in 0..passes {
        let hashes: Vec<String> = waiting[pass * batch / 2..(pass + 1) * batch / 2]
            .iter()
            .cloned()
            .chain((0..batch - batch / 2).map(|k| format!("bench-new-{pass}-{k}")))
            .collect();
        let mut found = [0usize; 2];
        for way in [pass % 2, 1 - pass % 2] {
            let began = Instant::now();
            found[way] = if way == 0 {
                let mut q = Sql::new(
                    Backend::Postgres,
                    &format!("SELECT {} FROM tasks WHERE hash IN ", tasks::COLUMNS),
                );
                q.bind_list(hashes.iter().map(String::as_str))
                    .push(" AND scheduler_id = ")
                    .bind(SchedulerId::Boefje.as_str())
                    .push(" AND status IN ('pending', 'queued')");
                q.load::<TaskRow>(&mut conn)?.len()
            } else {
                tasks::waiting_by_hash(&mut conn, SchedulerId::Boefje, &hashes)?.len()
            };
            let us = began.elapsed().as_secs_f64() * 1e6;
            match way {
                0 => before.push(us),
                _ => now.push(us),
            }
        }
        if found[0] != found[1] {
            return Err(format!(
                "the two reads by hash disagree: {} against {} tasks",
                found[0], found[1]
            )
            .into());
        }
    }
    Ok((super::stats::median(before), super::stats::median(now)))
}
