//! Statements on mula's own PostgreSQL database (OpenKAT's scheduler), read by `import-mula`:
//! its alembic revision, and its `schedules` and `tasks` tables in keyset pages by id. Read only;
//! nothing here writes to mula's database.
//!
//! mula's columns (alembic revisions `0010` and `0011`): ids and `schedule_id` are `uuid`, `data` is `jsonb`,
//! `status` is the enum `taskstatus` with uppercase labels, timestamps are `timestamptz`. Each is
//! read as text or as a UTC timestamp, so the rows decode without knowing mula's types.

use chrono::NaiveDateTime;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text, Timestamp};

use super::StorageError;

/// The alembic revisions whose `schedules` and `tasks` columns these statements read, oldest
/// first: `0010`, and `0011`, which adds indexes only.
pub const REVISIONS: [&str; 2] = ["0010", "0011"];

/// Why mula's database at `revision` cannot be read, or `None` when it can: one older than the
/// revisions read is upgraded by mula first; one newer may have changed the columns read.
pub fn unreadable_revision(revision: &str) -> Option<String> {
    if REVISIONS.contains(&revision) {
        return None;
    }
    let known = REVISIONS.join(" and ");
    // mula's revisions are numbered: a number below the first is an older schema.
    let older = matches!(
        (revision.parse::<u32>(), REVISIONS[0].parse::<u32>()),
        (Ok(r), Ok(first)) if r < first
    );
    Some(if older {
        format!(
            "mula's database is at alembic revision {revision}, older than the revisions import-mula reads ({known}): upgrade mula's database first (mula's own migrations, `alembic upgrade head`)"
        )
    } else {
        format!(
            "mula's database is at alembic revision {revision}, which import-mula does not know (it reads {known}): its tables may differ from what it reads; use a release of kat-scheduler that reads it"
        )
    })
}

/// A `schedules` row of mula's.
#[derive(Debug, Clone, PartialEq, QueryableByName)]
pub struct MulaSchedule {
    /// The id (a UUID, as text).
    #[diesel(sql_type = Text)]
    pub id: String,
    /// `boefje`, `normalizer` or `report` in mula's current versions.
    #[diesel(sql_type = Text)]
    pub scheduler_id: String,
    /// The organisation.
    #[diesel(sql_type = Text)]
    pub organisation: String,
    /// The hash of `data` (unique in mula too).
    #[diesel(sql_type = Nullable<Text>)]
    pub hash: Option<String>,
    /// The task data, JSON text.
    #[diesel(sql_type = Text)]
    pub data: String,
    /// Whether it runs.
    #[diesel(sql_type = Bool)]
    pub enabled: bool,
    /// The cron expression.
    #[diesel(sql_type = Nullable<Text>)]
    pub schedule: Option<String>,
    /// When it is next due (UTC).
    #[diesel(sql_type = Nullable<Timestamp>)]
    pub deadline_at: Option<NaiveDateTime>,
    /// Creation time (UTC).
    #[diesel(sql_type = Timestamp)]
    pub created_at: NaiveDateTime,
    /// Last change (UTC).
    #[diesel(sql_type = Timestamp)]
    pub modified_at: NaiveDateTime,
}

/// A `tasks` row of mula's.
#[derive(Debug, Clone, PartialEq, QueryableByName)]
pub struct MulaTask {
    /// The id (a UUID, as text).
    #[diesel(sql_type = Text)]
    pub id: String,
    /// The scheduler.
    #[diesel(sql_type = Text)]
    pub scheduler_id: String,
    /// The schedule that produced it.
    #[diesel(sql_type = Nullable<Text>)]
    pub schedule_id: Option<String>,
    /// The organisation.
    #[diesel(sql_type = Text)]
    pub organisation: String,
    /// The `type` column (`boefje`, `normalizer`, `report`).
    #[diesel(sql_type = Text)]
    pub task_type: String,
    /// The de-duplication hash.
    #[diesel(sql_type = Nullable<Text>)]
    pub hash: Option<String>,
    /// Lower is more urgent; nullable in mula's schema.
    #[diesel(sql_type = Nullable<Integer>)]
    pub priority: Option<i32>,
    /// The payload, JSON text.
    #[diesel(sql_type = Text)]
    pub data: String,
    /// The enum label: `PENDING`, `QUEUED`, `DISPATCHED`, `RUNNING`, `COMPLETED`, `FAILED`,
    /// `CANCELLED`.
    #[diesel(sql_type = Text)]
    pub status: String,
    /// Creation time (UTC).
    #[diesel(sql_type = Timestamp)]
    pub created_at: NaiveDateTime,
    /// Last change (UTC).
    #[diesel(sql_type = Timestamp)]
    pub modified_at: NaiveDateTime,
}

/// Opens a read-only session on mula's database.
pub fn open(uri: &str) -> Result<PgConnection, StorageError> {
    let mut conn = PgConnection::establish(uri).map_err(|error| StorageError::OpenMula {
        uri: super::redact(uri),
        error,
    })?;
    // Read only: a mistake here can never change mula's rows; and UTC, so `AT TIME ZONE` below
    // and the session agree.
    conn.batch_execute(
        "SET default_transaction_read_only = on; SET TIME ZONE 'UTC'; \
         SET statement_timeout = 0",
    )
    .map_err(StorageError::MulaSession)?;
    Ok(conn)
}

/// Holds the session in one snapshot of mula's database from here on, until it closes: a
/// read-only `REPEATABLE READ` transaction, left open. The import reads page after page; were
/// mula (or anything) still writing, a row changed behind the cursor would be missed and a task
/// could name a schedule made after the schedules were read. In one snapshot, the counts, the
/// schedules and the tasks are one state of mula's tables. Nothing else opens a transaction on
/// this session.
pub fn snapshot(conn: &mut PgConnection) -> Result<(), StorageError> {
    conn.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .map_err(StorageError::MulaSession)
}

#[derive(QueryableByName)]
struct Revision {
    #[diesel(sql_type = Nullable<Text>)]
    version: Option<String>,
}

/// mula's alembic revision, or `None` when the database has no `alembic_version` table (not a
/// mula database).
pub fn revision(conn: &mut PgConnection) -> QueryResult<Option<String>> {
    let exists =
        diesel::sql_query("SELECT CAST(to_regclass('alembic_version') AS text) AS version")
            .load::<Revision>(conn)?
            .into_iter()
            .next()
            .and_then(|r| r.version);
    if exists.is_none() {
        return Ok(None);
    }
    Ok(
        diesel::sql_query("SELECT version_num AS version FROM alembic_version LIMIT 1")
            .load::<Revision>(conn)?
            .into_iter()
            .next()
            .and_then(|r| r.version),
    )
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Rows in mula's `table` (`schedules` or `tasks`), for the progress lines.
pub fn count(conn: &mut PgConnection, table: MulaTable) -> QueryResult<u64> {
    let n = diesel::sql_query(format!("SELECT COUNT(*) AS n FROM {}", table.name()))
        .load::<Count>(conn)?
        .first()
        .map_or(0, |c| c.n);
    Ok(u64::try_from(n).unwrap_or(0))
}

/// mula's two tables the import reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MulaTable {
    /// `schedules`
    Schedules,
    /// `tasks`
    Tasks,
}

impl MulaTable {
    /// The table's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Schedules => "schedules",
            Self::Tasks => "tasks",
        }
    }
}

/// The next `limit` schedules after id `after` (from the first with `None`), in id order: a
/// keyset page on the primary key, so each page costs the same however far the import is.
pub fn schedules_page(
    conn: &mut PgConnection,
    after: Option<&str>,
    limit: usize,
) -> QueryResult<Vec<MulaSchedule>> {
    let columns = "SELECT id::text AS id, scheduler_id, organisation, hash, data::text AS data, \
         enabled, schedule, deadline_at AT TIME ZONE 'UTC' AS deadline_at, \
         created_at AT TIME ZONE 'UTC' AS created_at, \
         modified_at AT TIME ZONE 'UTC' AS modified_at FROM schedules";
    page(conn, columns, after, limit)
}

/// The next `limit` tasks after id `after`, in id order (see [`schedules_page`]).
pub fn tasks_page(
    conn: &mut PgConnection,
    after: Option<&str>,
    limit: usize,
) -> QueryResult<Vec<MulaTask>> {
    let columns = "SELECT id::text AS id, scheduler_id, schedule_id::text AS schedule_id, \
         organisation, type AS task_type, hash, priority, data::text AS data, \
         status::text AS status, created_at AT TIME ZONE 'UTC' AS created_at, \
         modified_at AT TIME ZONE 'UTC' AS modified_at FROM tasks";
    page(conn, columns, after, limit)
}

fn page<R: QueryableByName<diesel::pg::Pg> + 'static>(
    conn: &mut PgConnection,
    select: &str,
    after: Option<&str>,
    limit: usize,
) -> QueryResult<Vec<R>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    match after {
        None => diesel::sql_query(format!("{select} ORDER BY id LIMIT $1"))
            .bind::<BigInt, _>(limit)
            .load(conn),
        Some(id) => diesel::sql_query(format!(
            "{select} WHERE id > CAST($1 AS uuid) ORDER BY id LIMIT $2"
        ))
        .bind::<Text, _>(id)
        .bind::<BigInt, _>(limit)
        .load(conn),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_read_pass_an_older_one_is_told_to_upgrade_and_a_newer_one_is_not() {
        assert_eq!(unreadable_revision("0010"), None);
        assert_eq!(unreadable_revision("0011"), None);
        let older = unreadable_revision("0009").unwrap();
        assert!(
            older.contains("older") && older.contains("upgrade"),
            "{older}"
        );
        for newer in ["0012", "abc123"] {
            let why = unreadable_revision(newer).unwrap();
            assert!(!why.contains("upgrade mula"), "{why}");
            assert!(
                why.contains("does not know") && why.contains("0010 and 0011"),
                "{why}"
            );
        }
    }
}
