//! `import-mula`: switching from mula without losing a schedule. Copies mula's `schedules` and
//! `tasks` (from its PostgreSQL database, alembic revision `0010` or `0011`) into kat-scheduler's database,
//! either backend, in batches: keyset pages by id from mula, one transaction of set statements
//! per batch here. Owns the run (target checks, paging, progress, the summary); the conversion
//! rules are pure ([`rules`]); every statement is in `storage` (`storage::mula` reads mula).
//!
//! Safe to repeat and safe into a database that holds work: a row whose id is here already is
//! left as it is, a schedule whose hash another schedule holds is skipped and reported, waiting
//! work whose hash already waits here is refused as a duplicate (as a push of it would be; a more
//! urgent copy moves the waiting task forward to its priority, as such a push does), and a
//! row kat-scheduler would refuse is reported with its id and reason and never stops the rest.
//!
//! The service must be stopped while it runs: a running service keeps each scheduler's heap in
//! memory, rebuilt from the table at start, and would not see rows written behind its back. On
//! SQLite the import takes the service's lock file (so neither runs while the other does); on
//! PostgreSQL it refuses while any instance holds a live ownership lease. The import writes
//! directly rather than through the `schedules` module or the engines, as they are not running.

pub mod rules;
pub mod summary;

use std::collections::{HashMap, HashSet};

use anyhow::{Context as _, anyhow, bail};
use diesel::Connection;
use diesel::connection::SimpleConnection;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::config::Settings;
use crate::domain::{PerScheduler, TaskStatus};
use crate::ownership::SqliteLock;
use crate::storage::mula::{self, MulaTable};
use crate::storage::{self, AnyConnection, Backend, DbTarget};
use rules::{Refusal, TaskRules};
pub use summary::{Summary, TableSummary};

/// Rows per batch by default: one page read from mula, one transaction written here.
pub const DEFAULT_BATCH: usize = 1_000;

/// What `import-mula` was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// mula's database, `postgresql://…`.
    pub from: String,
    /// Read and check everything, write nothing.
    pub dry_run: bool,
    /// Rows per batch.
    pub batch: usize,
}

/// Runs an import into the database `settings` name; answers what it did. `clock` gives the
/// import's time, from which imported dispatched and running tasks' leases run.
pub fn run(settings: &Settings, opts: &Options, clock: &dyn Clock) -> anyhow::Result<Summary> {
    let batch = opts.batch.max(1);
    let mut source = mula::open(&opts.from)?;
    match mula::revision(&mut source).context("cannot read mula's alembic revision")? {
        Some(r) => {
            if let Some(why) = mula::unreadable_revision(&r) {
                bail!(why)
            }
        }
        None => bail!(
            "{} is not mula's database: it has no alembic_version table",
            storage::redact(&opts.from)
        ),
    }
    mula::snapshot(&mut source)?;
    let target = DbTarget::parse(&settings.database.uri)?
        .with_connect_timeout(settings.database.connect_timeout_secs);
    let (_lock, mut conn) = if opts.dry_run {
        (None, open_for_reading(&target)?)
    } else {
        let (lock, conn) = open_for_writing(&target)?;
        (lock, Some(conn))
    };
    let totals = (
        mula::count(&mut source, MulaTable::Schedules)?,
        mula::count(&mut source, MulaTable::Tasks)?,
    );
    info!(
        source = %storage::redact(&opts.from),
        target = %target.display(),
        schedules = totals.0,
        tasks = totals.1,
        dry_run = opts.dry_run,
        "import-mula: starting"
    );
    let mut summary = Summary {
        dry_run: opts.dry_run,
        ..Summary::default()
    };
    let mut links = Links::default();
    copy_schedules(
        &mut source,
        conn.as_mut(),
        settings,
        batch,
        totals.0,
        opts.dry_run,
        &mut summary.schedules,
        &mut links,
    )?;
    let task_rules = TaskRules {
        limits: settings.limits,
        leases: PerScheduler::from_fn(|s| {
            // mula's runners send no heartbeat: a running task gets the lease of a holder that
            // never renewed, as one that starts running here does.
            let l = settings.limits(s);
            (
                l.dispatch_timeout,
                l.run_timeout.max(l.unrenewed_run_timeout),
            )
        }),
        now: crate::clock::truncate_micros(clock.now()).naive_utc(),
    };
    copy_tasks(
        &mut source,
        conn.as_mut(),
        &task_rules,
        batch,
        totals.1,
        opts.dry_run,
        &mut summary.tasks,
        &links,
    )?;
    info!(
        schedules.imported = summary.schedules.imported,
        tasks.imported = summary.tasks.imported,
        dry_run = opts.dry_run,
        "import-mula: done"
    );
    Ok(summary)
}

/// The target for a real import: locked (SQLite) or checked to be idle (PostgreSQL), and
/// migrated as `migrate` does.
fn open_for_writing(target: &DbTarget) -> anyhow::Result<(Option<SqliteLock>, AnyConnection)> {
    let lock = match target {
        DbTarget::Sqlite(path) => Some(SqliteLock::acquire(path).map_err(|e| {
            anyhow!("{e}; stop kat-scheduler before importing (the import writes behind its heaps)")
        })?),
        DbTarget::Postgres(_) => None,
    };
    let mut conn = storage::open(target)?;
    // Held by this session until the import ends (or its process does): no instance takes a
    // lease meanwhile, so none builds a heap from a table half imported.
    if Backend::of(&conn) == Backend::Postgres && !storage::owners::lock_for_import(&mut conn)? {
        bail!(
            "another import-mula is writing to {}, or a kat-scheduler instance is taking its \
             schedulers there; wait for it, and stop every instance before importing",
            target.display()
        );
    }
    // Before the migrations, so a running service's schema is not changed under it. A database
    // without the ownership table (new, or migrated by a version without it) has no lease to
    // check.
    if Backend::of(&conn) == Backend::Postgres
        && let Ok(owners) = storage::owners::all(&mut conn)
    {
        let live: Vec<String> = owners
            .into_iter()
            .filter(|o| o.live)
            .map(|o| {
                format!(
                    "{} (owned by {})",
                    o.scheduler_id,
                    o.owner.unwrap_or_default()
                )
            })
            .collect();
        if !live.is_empty() {
            bail!(
                "kat-scheduler is running on {}: {}; stop every instance before importing (the \
                 import writes behind their heaps)",
                target.display(),
                live.join(", ")
            );
        }
    }
    let applied = storage::run_migrations(&mut conn)?;
    for m in &applied {
        info!(migration = %m, "migration applied");
    }
    if Backend::of(&conn) == Backend::Postgres {
        // Its statements are lookups by key and batch writes, on a target the import has just
        // filled and nothing has analysed: the default estimates put a batch's lookup of waiting
        // work by hash (`storage::tasks::waiting_by_hash`, a lookup per hash) above
        // `jit_above_cost`, and compiling it would cost more than running it, every batch.
        conn.batch_execute("SET jit = off")?;
    }
    Ok((lock, conn))
}

/// The target for a dry run, read only: `None` when it has no kat-scheduler schema yet (a file
/// that does not exist, a database never migrated), which then counts as empty.
fn open_for_reading(target: &DbTarget) -> anyhow::Result<Option<AnyConnection>> {
    if let DbTarget::Sqlite(path) = target
        && !path.exists()
    {
        info!(target = %target.display(), "import-mula: the target does not exist yet; it counts as empty");
        return Ok(None);
    }
    let mut conn = storage::open(target)?;
    if storage::has_schema(&mut conn) {
        Ok(Some(conn))
    } else {
        info!(target = %target.display(), "import-mula: the target has no kat-scheduler schema yet; it counts as empty");
        Ok(None)
    }
}

/// Where imported tasks' schedules are: those of this run, and mula's schedules skipped for a
/// hash another schedule holds (their tasks go to the holder, the same work).
#[derive(Debug, Default)]
struct Links {
    /// Schedule ids in the target after this run (imported, or present already).
    known: HashSet<String>,
    /// mula's schedule id → the schedule here holding its hash.
    moved: HashMap<String, String>,
}

#[expect(
    clippy::too_many_arguments,
    reason = "one call site; the arguments are the run's state, named at the call"
)]
fn copy_schedules(
    source: &mut diesel::PgConnection,
    mut target: Option<&mut AnyConnection>,
    settings: &Settings,
    batch: usize,
    total: u64,
    dry_run: bool,
    sum: &mut TableSummary,
    links: &mut Links,
) -> anyhow::Result<()> {
    // Hashes this run wrote (or would write): a later batch's schedule with one is skipped, as
    // the unique index would refuse it (a dry run must find that without the index).
    let mut hashes: HashMap<String, String> = HashMap::new();
    let mut after: Option<String> = None;
    loop {
        let page = mula::schedules_page(source, after.as_deref(), batch)
            .context("cannot read mula's schedules")?;
        let Some(last) = page.last() else { break };
        after = Some(last.id.clone());
        sum.read += page.len() as u64;
        let mut rows = Vec::new();
        for m in page {
            match rules::schedule(m, &settings.limits) {
                Ok(c) => rows.push(c),
                Err(r) => refused(sum, "schedule", &r),
            }
        }
        let (ids, row_hashes): (Vec<String>, Vec<String>) = rows
            .iter()
            .map(|c| (c.row.id.clone(), c.row.hash.clone().unwrap_or_default()))
            .unzip();
        let taken = match target.as_deref_mut() {
            Some(c) => storage::schedules::taken(c, &ids, &row_hashes)?,
            None => Vec::new(),
        };
        let present: HashSet<&str> = taken.iter().map(|(id, _)| id.as_str()).collect();
        let holders: HashMap<&str, &str> = taken
            .iter()
            .filter_map(|(id, h)| h.as_deref().map(|h| (h, id.as_str())))
            .collect();
        let mut new = Vec::new();
        for c in rows {
            let hash = c.row.hash.clone().unwrap_or_default();
            if present.contains(c.row.id.as_str()) {
                sum.present += 1;
                links.known.insert(c.row.id);
                continue;
            }
            let holder = holders
                .get(hash.as_str())
                .map(|h| (*h).to_owned())
                .or_else(|| hashes.get(&hash).cloned());
            if let Some(holder) = holder {
                warn!(schedule.id = %c.row.id, holder = %holder, "import-mula: schedule skipped: its hash is held by another schedule");
                links.moved.insert(c.row.id.clone(), holder.clone());
                sum.hash_taken.push((c.row.id, holder));
                continue;
            }
            hashes.insert(hash, c.row.id.clone());
            links.known.insert(c.row.id.clone());
            if c.rehashed {
                sum.rehashed += 1;
            }
            if c.legacy {
                sum.legacy += 1;
            }
            new.push(c.row);
        }
        if !dry_run && let Some(c) = target.as_deref_mut() {
            c.transaction(|c| storage::schedules::insert_many(c, &new))
                .context("cannot write a batch of schedules")?;
        }
        sum.imported += new.len() as u64;
        progress("schedules", sum, total);
    }
    Ok(())
}

#[expect(
    clippy::too_many_arguments,
    reason = "one call site; the arguments are the run's state, named at the call"
)]
fn copy_tasks(
    source: &mut diesel::PgConnection,
    mut target: Option<&mut AnyConnection>,
    task_rules: &TaskRules,
    batch: usize,
    total: u64,
    dry_run: bool,
    sum: &mut TableSummary,
    links: &Links,
) -> anyhow::Result<()> {
    let mut after: Option<String> = None;
    // The waiting task of each piece of work met in this run and not yet in the table.
    let mut waiting_this_run: HashMap<(String, String), Holder> = HashMap::new();
    loop {
        let page = mula::tasks_page(source, after.as_deref(), batch)
            .context("cannot read mula's tasks")?;
        let Some(last) = page.last() else { break };
        after = Some(last.id.clone());
        sum.read += page.len() as u64;
        let mut rows = Vec::new();
        for m in page {
            match rules::task(m, task_rules) {
                Ok(c) => rows.push(c),
                Err(r) => refused(sum, "task", &r),
            }
        }
        let ids: Vec<String> = rows.iter().map(|c| c.row.id.clone()).collect();
        let present: HashSet<String> = match target.as_deref_mut() {
            Some(c) => storage::tasks::existing_ids(c, &ids)?.into_iter().collect(),
            None => HashSet::new(),
        };
        rows.retain(|c| {
            let here = present.contains(&c.row.id);
            if here {
                sum.present += 1;
            }
            !here
        });
        // One waiting task per piece of work: waiting work whose hash already waits stays out,
        // as a push of it would, and as such a push, a more urgent copy moves the waiting task
        // forward to its priority (a user's scan among mula's automatic ones is not demoted).
        let mut waiting_here = waiting_work(target.as_deref_mut(), &rows)?;
        let mut boosts: Vec<(String, TaskStatus, i64)> = Vec::new();
        let mut kept = Vec::with_capacity(rows.len());
        for c in rows {
            if !c.row.status.is_waiting() {
                kept.push(c);
                continue;
            }
            let key = (
                c.row.scheduler_id.clone(),
                c.row.hash.clone().unwrap_or_default(),
            );
            let holder = match waiting_here.get_mut(&key) {
                Some(h) => Some(h),
                None => waiting_this_run.get_mut(&key),
            };
            let Some(holder) = holder else {
                waiting_this_run.insert(
                    key,
                    Holder {
                        id: c.row.id.clone(),
                        status: c.row.status,
                        priority: c.row.priority,
                        in_batch: Some(kept.len()),
                    },
                );
                kept.push(c);
                continue;
            };
            let mut detail = format!(
                "the same work (hash {}) waits as task {} already",
                key.1, holder.id
            );
            if c.row.priority < holder.priority {
                holder.priority = c.row.priority;
                match holder.in_batch {
                    Some(i) => {
                        if let Some(h) = kept.get_mut(i) {
                            h.row.priority = c.row.priority;
                        }
                    }
                    None => {
                        boosts.retain(|(id, _, _)| *id != holder.id);
                        boosts.push((holder.id.clone(), holder.status, c.row.priority));
                    }
                }
                detail.push_str(&format!(", which takes its priority {}", c.row.priority));
            }
            refused(
                sum,
                "task",
                &Refusal {
                    id: c.row.id.clone(),
                    rule: "duplicate",
                    detail,
                },
            );
        }
        let rows = kept;
        // Schedules neither this run's nor moved: are they here from before?
        let unknown: Vec<String> = rows
            .iter()
            .filter_map(|c| c.row.schedule_id.clone())
            .filter(|s| !links.known.contains(s) && !links.moved.contains_key(s))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let here_before: HashSet<String> = match (target.as_deref_mut(), unknown.is_empty()) {
            (Some(c), false) => storage::schedules::taken(c, &unknown, &[])?
                .into_iter()
                .map(|(id, _)| id)
                .collect(),
            _ => HashSet::new(),
        };
        let mut new = Vec::with_capacity(rows.len());
        for mut c in rows {
            if let Some(s) = c.row.schedule_id.take() {
                c.row.schedule_id = if links.known.contains(&s) || here_before.contains(&s) {
                    Some(s)
                } else if let Some(holder) = links.moved.get(&s) {
                    Some(holder.clone())
                } else {
                    sum.unlinked += 1;
                    None
                };
            }
            if c.rehashed {
                sum.rehashed += 1;
            }
            if c.stalled {
                sum.stalled += 1;
            }
            if c.legacy {
                sum.legacy += 1;
            }
            *sum.by_status.entry(c.row.status.as_str()).or_default() += 1;
            new.push(c.row);
        }
        if !dry_run && let Some(c) = target.as_deref_mut() {
            c.transaction(|c| {
                storage::tasks::insert(c, &new)?;
                storage::tasks::reprioritise(c, &boosts, task_rules.now).map(|_| ())
            })
            .context("cannot write a batch of tasks")?;
            // The table answers for this batch's work from now on; a dry run writes nothing,
            // so it keeps remembering (each task as outside this batch).
            waiting_this_run.clear();
        } else {
            for h in waiting_this_run.values_mut() {
                h.in_batch = None;
            }
        }
        sum.imported += new.len() as u64;
        progress("tasks", sum, total);
    }
    Ok(())
}

/// A waiting task that holds a piece of work: one here, or one of this run's.
struct Holder {
    id: String,
    status: TaskStatus,
    priority: i64,
    /// Its place among the batch's rows while it is one not written yet.
    in_batch: Option<usize>,
}

/// The waiting tasks here with the work (scheduler, hash) of one of `rows`' waiting ones.
fn waiting_work(
    target: Option<&mut AnyConnection>,
    rows: &[rules::Converted<storage::rows::TaskRow>],
) -> anyhow::Result<HashMap<(String, String), Holder>> {
    let mut out = HashMap::new();
    let Some(conn) = target else {
        return Ok(out);
    };
    for s in crate::domain::SchedulerId::ALL {
        let hashes: Vec<String> = rows
            .iter()
            .filter(|c| c.row.status.is_waiting() && c.row.scheduler_id == s.as_str())
            .filter_map(|c| c.row.hash.clone())
            .collect();
        if hashes.is_empty() {
            continue;
        }
        for t in storage::tasks::waiting_by_hash(conn, s, &hashes)? {
            out.insert(
                (t.scheduler_id, t.hash.unwrap_or_default()),
                Holder {
                    id: t.id,
                    status: t.status,
                    priority: t.priority,
                    in_batch: None,
                },
            );
        }
    }
    Ok(out)
}

fn refused(sum: &mut TableSummary, what: &str, r: &Refusal) {
    warn!(row.kind = what, row.id = %r.id, rule = r.rule, reason = %r.detail, "import-mula: row refused");
    sum.refuse(r);
}

fn progress(table: &'static str, sum: &TableSummary, total: u64) {
    info!(
        table,
        read = sum.read,
        of = total,
        imported = sum.imported,
        present = sum.present,
        refused = sum.refused_total(),
        "import-mula: batch done"
    );
}
