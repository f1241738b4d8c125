//! Statements on the `schedules` table, and on `schedule_fires`, the ledger of its due fires
//! (one owner for both: a schedule's fires are written as it moves on, and go with it).

use chrono::NaiveDateTime;
use diesel::QueryResult;
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Nullable, Text, Timestamp};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::listing::{count_and_page, push_created_and_filter, push_where};
use super::rows::CountRow;
use super::sql::{Bind, Sql};
use super::{AnyConnection, Backend, StorageError};
use crate::domain::SchedulerId;
use crate::domain::filter::FilterNode;
use crate::domain::fire::{Fate, Fire, FireOutcome, Lateness};
use crate::domain::schedule::Schedule;

/// The column list that decodes into [`ScheduleRow`].
const COLUMNS: &str = "id, scheduler_id, organisation, hash, data, enabled, schedule, \
     deadline_at, created_at, modified_at, disabled_reason";

/// A `schedules` row. Serde for a push's link crossing to the scheduler's owner
/// ([`crate::queue::PushRequest::link`]).
#[derive(Debug, Clone, PartialEq, QueryableByName, serde::Serialize, serde::Deserialize)]
pub struct ScheduleRow {
    /// UUID, lowercase and hyphenated.
    #[diesel(sql_type = Text)]
    pub id: String,
    /// The scheduler.
    #[diesel(sql_type = Text)]
    pub scheduler_id: String,
    /// The organisation.
    #[diesel(sql_type = Text)]
    pub organisation: String,
    /// The hash of `data`.
    #[diesel(sql_type = Nullable<Text>)]
    pub hash: Option<String>,
    /// The task data, as JSON text.
    #[diesel(sql_type = Text)]
    pub data: String,
    /// Whether it runs.
    #[diesel(sql_type = Bool)]
    pub enabled: bool,
    /// The cron expression.
    #[diesel(sql_type = Nullable<Text>)]
    pub schedule: Option<String>,
    /// When it is next due.
    #[diesel(sql_type = Nullable<Timestamp>)]
    pub deadline_at: Option<NaiveDateTime>,
    /// Creation time (UTC).
    #[diesel(sql_type = Timestamp)]
    pub created_at: NaiveDateTime,
    /// Last change (UTC).
    #[diesel(sql_type = Timestamp)]
    pub modified_at: NaiveDateTime,
    /// Why the scheduler disabled it.
    #[diesel(sql_type = Nullable<Text>)]
    pub disabled_reason: Option<String>,
}

impl ScheduleRow {
    /// The row as the API shows it.
    pub fn into_schedule(self) -> Result<Schedule, StorageError> {
        let corrupt = |what: &str| StorageError::Corrupt(format!("schedule {}: {what}", self.id));
        Ok(Schedule {
            id: Uuid::parse_str(&self.id).map_err(|_| corrupt("id is not a UUID"))?,
            scheduler_id: self
                .scheduler_id
                .parse()
                .map_err(|()| corrupt("unknown scheduler"))?,
            hash: self.hash.clone().unwrap_or_default(),
            data: RawValue::from_string(self.data.clone())
                .map_err(|_| corrupt("data is not JSON"))?,
            organisation: self.organisation,
            enabled: self.enabled,
            schedule: self.schedule,
            deadline_at: self.deadline_at.map(|t| t.and_utc()),
            created_at: self.created_at.and_utc(),
            modified_at: self.modified_at.and_utc(),
            disabled_reason: self.disabled_reason,
        })
    }
}

/// A `/schedules` listing.
#[derive(Debug, Clone, Default)]
pub struct ScheduleQuery {
    /// `scheduler_id = …`
    pub scheduler_id: Option<SchedulerId>,
    /// `organisation = …`
    pub organisation: Option<String>,
    /// `hash = …`
    pub hash: Option<String>,
    /// `enabled = …`
    pub enabled: Option<bool>,
    /// `deadline_at >= …`
    pub min_deadline_at: Option<NaiveDateTime>,
    /// `deadline_at <= …`
    pub max_deadline_at: Option<NaiveDateTime>,
    /// `created_at >= …`
    pub min_created_at: Option<NaiveDateTime>,
    /// `created_at <= …`
    pub max_created_at: Option<NaiveDateTime>,
    /// A filter tree (`POST /schedules/search`).
    pub filter: Option<FilterNode>,
    /// Rows to skip.
    pub offset: i64,
    /// Rows to return (0: only count).
    pub limit: i64,
}

fn sql(conn: &AnyConnection, text: &str) -> Sql {
    Sql::new(Backend::of(conn), text)
}

/// Inserts a schedule; a hash already taken fails with a unique violation.
pub fn insert(conn: &mut AnyConnection, r: &ScheduleRow) -> QueryResult<()> {
    insert_many(conn, std::slice::from_ref(r))
}

/// One row's values, `(…)`, in the order of [`COLUMNS`].
fn values(q: &mut Sql, r: &ScheduleRow) {
    q.push("(")
        .bind(r.id.as_str())
        .push(", ")
        .bind(r.scheduler_id.as_str())
        .push(", ")
        .bind(r.organisation.as_str())
        .push(", ")
        .bind(Bind::OptText(r.hash.clone()))
        .push(", ")
        .bind(r.data.as_str())
        .push(", ")
        .bind(Bind::Bool(r.enabled))
        .push(", ")
        .bind(Bind::OptText(r.schedule.clone()))
        .push(", ")
        .bind(Bind::OptTime(r.deadline_at))
        .push(", ")
        .bind(r.created_at)
        .push(", ")
        .bind(r.modified_at)
        .push(", ")
        .bind(Bind::OptText(r.disabled_reason.clone()))
        .push(")");
}

/// Rows per multi-row schedule INSERT (11 binds each).
pub const INSERT_CHUNK: usize = 500;

/// Inserts schedules in multi-row statements of [`INSERT_CHUNK`]; the caller's transaction holds
/// them together. An id or hash already taken fails the statement with a unique violation, so
/// callers check first ([`taken`]).
pub fn insert_many(conn: &mut AnyConnection, rows: &[ScheduleRow]) -> QueryResult<()> {
    for chunk in rows.chunks(INSERT_CHUNK) {
        let mut q = sql(conn, &format!("INSERT INTO schedules ({COLUMNS}) VALUES "));
        for (i, r) in chunk.iter().enumerate() {
            q.push(if i == 0 { "" } else { ", " });
            values(&mut q, r);
        }
        q.execute(conn)?;
    }
    Ok(())
}

/// The `(id, hash)` of every schedule whose id is one of `ids` or whose hash is one of `hashes`.
pub fn taken(
    conn: &mut AnyConnection,
    ids: &[String],
    hashes: &[String],
) -> QueryResult<Vec<(String, Option<String>)>> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        id: String,
        #[diesel(sql_type = Nullable<Text>)]
        hash: Option<String>,
    }
    let mut out = Vec::new();
    for chunk in ids.chunks(super::CHUNK) {
        let mut q = sql(conn, "SELECT id, hash FROM schedules WHERE id IN ");
        q.bind_list(chunk.iter().map(String::as_str));
        out.extend(q.load::<Row>(conn)?.into_iter().map(|r| (r.id, r.hash)));
    }
    for chunk in hashes.chunks(super::CHUNK) {
        let mut q = sql(conn, "SELECT id, hash FROM schedules WHERE hash IN ");
        q.bind_list(chunk.iter().map(String::as_str));
        out.extend(q.load::<Row>(conn)?.into_iter().map(|r| (r.id, r.hash)));
    }
    Ok(out)
}

/// What a `PATCH` changes of a schedule: only the fields it names, each `None` left as the
/// table holds it.
#[derive(Debug, Default)]
pub struct ScheduleChange {
    /// New data with its hash.
    pub data: Option<(String, String)>,
    /// Enabled or not; enabling clears the reason it was disabled.
    pub enabled: Option<bool>,
    /// The cron expression (`Some(None)`: none).
    pub schedule: Option<Option<String>>,
    /// The deadline (`Some(None)`: none).
    pub deadline_at: Option<Option<NaiveDateTime>>,
    /// When it changed.
    pub modified_at: NaiveDateTime,
}

/// Writes the fields `change` names, and no other: a tick that moved the deadline or disabled
/// the schedule between the request's read and this write keeps what it wrote unless the
/// request names that field (writing the row back whole undid it: a report run twice, a
/// schedule disabled for good enabled again). Answers the rows changed (0: gone).
pub fn change(conn: &mut AnyConnection, id: &str, change: &ScheduleChange) -> QueryResult<usize> {
    use diesel::Connection;
    conn.transaction(|c| change_in(c, id, change))
}

fn change_in(conn: &mut AnyConnection, id: &str, change: &ScheduleChange) -> QueryResult<usize> {
    let mut q = sql(conn, "UPDATE schedules SET modified_at = ");
    q.bind(change.modified_at);
    if let Some((hash, data)) = &change.data {
        q.push(", hash = ")
            .bind(hash.as_str())
            .push(", data = ")
            .bind(data.as_str());
    }
    if let Some(enabled) = change.enabled {
        // Either way the state is now the client's: a schedule it disabled has no reason of the
        // service's, so nothing the service plans enables it again ([`revive`]).
        q.push(", enabled = ")
            .bind(Bind::Bool(enabled))
            .push(", disabled_reason = NULL");
    }
    if let Some(schedule) = &change.schedule {
        q.push(", schedule = ")
            .bind(Bind::OptText(schedule.clone()));
    }
    if let Some(deadline) = change.deadline_at {
        q.push(", deadline_at = ").bind(Bind::OptTime(deadline));
    }
    q.push(" WHERE id = ").bind(id);
    let written = q.execute(conn)?;
    // A fire waiting on a due time the schedule no longer has (its deadline moved, or it was
    // disabled) would never be decided, and the history would show it waiting for ever.
    let (moved, disabled) = (change.deadline_at, change.enabled == Some(false));
    if written > 0 && (moved.is_some() || disabled) {
        let mut d = sql(
            conn,
            "UPDATE schedule_fires SET outcome = 'skipped', reason = ",
        );
        d.bind(crate::domain::fire::FireReason::ScheduleChanged.as_str())
            .push(", detail = ")
            .bind(match disabled {
                true => "the schedule was disabled while this fire waited",
                false => "the schedule's deadline was changed while this fire waited",
            })
            .push(", decided_at = ")
            .bind(change.modified_at)
            .push(" WHERE schedule_id = ")
            .bind(id)
            .push(" AND outcome = 'waiting'");
        if let (Some(Some(deadline)), false) = (moved, disabled) {
            d.push(" AND due_at <> ").bind(deadline);
        }
        d.execute(conn)?;
    }
    Ok(written)
}

/// One schedule by id.
pub fn get(conn: &mut AnyConnection, id: &str) -> QueryResult<Option<ScheduleRow>> {
    let mut q = sql(
        conn,
        &format!("SELECT {COLUMNS} FROM schedules WHERE id = "),
    );
    q.bind(id);
    Ok(q.load::<ScheduleRow>(conn)?.into_iter().next())
}

/// The schedule of a task hash, if any (hashes are unique).
pub fn by_hash(conn: &mut AnyConnection, hash: &str) -> QueryResult<Option<ScheduleRow>> {
    let mut q = sql(
        conn,
        &format!("SELECT {COLUMNS} FROM schedules WHERE hash = "),
    );
    q.bind(hash);
    Ok(q.load::<ScheduleRow>(conn)?.into_iter().next())
}

/// Deletes a schedule and its fires; its tasks keep their rows, their `schedule_id` cleared
/// (mula's `ON DELETE SET NULL`, written out so SQLite needs no foreign-key enforcement).
/// Answers whether it existed.
pub fn delete(conn: &mut AnyConnection, id: &str) -> QueryResult<bool> {
    let mut fires = sql(conn, "DELETE FROM schedule_fires WHERE schedule_id = ");
    fires.bind(id);
    fires.execute(conn)?;
    for table in ["tasks", "task_queue"] {
        let mut clear = sql(
            conn,
            &format!("UPDATE {table} SET schedule_id = NULL WHERE schedule_id = "),
        );
        clear.bind(id);
        clear.execute(conn)?;
    }
    let mut q = sql(conn, "DELETE FROM schedules WHERE id = ");
    q.bind(id);
    Ok(q.execute(conn)? > 0)
}

fn push_conditions(q: &mut Sql, lq: &ScheduleQuery) {
    push_where(q, lq.scheduler_id, lq.organisation.as_deref());
    if let Some(h) = &lq.hash {
        q.push(" AND hash = ").bind(h.as_str());
    }
    if let Some(e) = lq.enabled {
        q.push(" AND enabled = ").bind(Bind::Bool(e));
    }
    if let Some(t) = lq.min_deadline_at {
        q.push(" AND deadline_at >= ").bind(t);
    }
    if let Some(t) = lq.max_deadline_at {
        q.push(" AND deadline_at <= ").bind(t);
    }
    push_created_and_filter(q, lq.min_created_at, lq.max_created_at, lq.filter.as_ref());
}

/// A page of schedules, newest first, and how many match in all.
pub fn list(conn: &mut AnyConnection, lq: &ScheduleQuery) -> QueryResult<(i64, Vec<ScheduleRow>)> {
    let conditions = |q: &mut Sql| push_conditions(q, lq);
    count_and_page(conn, "schedules", COLUMNS, conditions, lq.offset, lq.limit)
}

/// `scheduler`'s enabled schedules due at `now` (`deadline_at <= now`), oldest due first, at
/// most `limit`, after `after` (the last one of the previous page: `(deadline_at, id)`).
pub fn due(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    now: NaiveDateTime,
    after: Option<(NaiveDateTime, String)>,
    limit: usize,
) -> QueryResult<Vec<ScheduleRow>> {
    due_statement(Backend::of(conn), scheduler, now, after, limit).load(conn)
}

/// [`due`]'s statement (public so that its plan can be checked).
pub fn due_statement(
    backend: Backend,
    scheduler: SchedulerId,
    now: NaiveDateTime,
    after: Option<(NaiveDateTime, String)>,
    limit: usize,
) -> Sql {
    let mut q = Sql::new(
        backend,
        &format!("SELECT {COLUMNS} FROM schedules WHERE enabled AND deadline_at <= "),
    );
    q.bind(now)
        .push(" AND scheduler_id = ")
        .bind(scheduler.as_str());
    if let Some((deadline, id)) = after {
        // A row comparison: the page starts in `ix_schedules_due` where the last ended (the
        // same condition spelt with OR was a filter, and page k read the k pages before it).
        q.push(" AND (deadline_at, id) > (")
            .bind(deadline)
            .push(", ")
            .bind(id)
            .push(")");
    }
    q.push(" ORDER BY deadline_at, id LIMIT ")
        .bind(i64::try_from(limit).unwrap_or(i64::MAX));
    q
}

/// The text form both backends read a timestamp from inside a JSON document.
fn stamp(t: NaiveDateTime) -> String {
    // diesel's own SQLite spelling, so the text compares as the stored values do.
    t.format("%F %T%.f").to_string()
}

/// A due schedule's move to its next deadline, as the tick that fired it decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advance {
    /// The schedule's id.
    pub id: String,
    /// The deadline the tick read (the fire it handled).
    pub from: NaiveDateTime,
    /// The next deadline (`None`: none, a one-off that ran).
    pub to: Option<NaiveDateTime>,
}

/// Sets the next deadline of each schedule in one statement, of those whose deadline is still
/// the one the tick read: a deadline a user set while the tick ran is theirs to keep (the fire
/// it handled is in the ledger either way). Answers how many moved.
pub fn advance(
    conn: &mut AnyConnection,
    moves: &[Advance],
    now: NaiveDateTime,
) -> QueryResult<usize> {
    if moves.is_empty() {
        return Ok(0);
    }
    let doc: Vec<serde_json::Value> = moves
        .iter()
        .map(|m| serde_json::json!({"id": m.id, "f": stamp(m.from), "d": m.to.map(stamp)}))
        .collect();
    let doc = serde_json::Value::Array(doc).to_string();
    let mut q = sql(
        conn,
        "UPDATE schedules SET deadline_at = v.d, modified_at = ",
    );
    q.bind(now);
    match Backend::of(conn) {
        Backend::Postgres => {
            q.push(" FROM json_to_recordset(").bind(doc).push(
                "::json) AS v(id text, f timestamp, d timestamp) \
                 WHERE schedules.id = v.id AND schedules.deadline_at = v.f",
            );
        }
        Backend::Sqlite => {
            q.push(
                " FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.f') AS f, \
                 json_extract(value, '$.d') AS d FROM json_each(",
            )
            .bind(doc)
            .push(")) AS v WHERE schedules.id = v.id AND schedules.deadline_at = v.f");
        }
    }
    q.execute(conn)
}

/// A due schedule to disable, as the tick that read it decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disable {
    /// The schedule's id.
    pub id: String,
    /// Why, as `disabled_reason` says it.
    pub reason: String,
    /// The row's `modified_at` when the tick read it.
    pub read: NaiveDateTime,
}

/// Disables a schedule, saying why, if it is still enabled and unchanged since the tick read
/// it (`read`: its `modified_at` then): a user's edit made meanwhile (other data, a new
/// deadline) wins, and the next tick decides again on what the row says now. Answers whether
/// it was disabled.
pub fn disable(conn: &mut AnyConnection, d: &Disable, now: NaiveDateTime) -> QueryResult<bool> {
    let mut q = sql(conn, "UPDATE schedules SET enabled = ");
    q.bind(Bind::Bool(false))
        .push(", disabled_reason = ")
        .bind(d.reason.as_str())
        .push(", modified_at = ")
        .bind(now)
        .push(" WHERE id = ")
        .bind(d.id.as_str())
        .push(" AND enabled AND modified_at = ")
        .bind(d.read);
    Ok(q.execute(conn)? == 1)
}

/// Hashes [`revive`] names in one statement at most.
const REVIVE_CHUNK: usize = 500;

/// Enables again the schedules of `hashes` that the service disabled (`disabled_reason` set: a
/// fire found the plugin gone or disabled, the object gone or its scan level too low), due no
/// earlier than `now`; a schedule a client disabled (no reason) is left alone, and so is one
/// whose task was refused ([`crate::domain::fire::TASK_REFUSED`]: its data would be again).
/// Read first, so that the common case (none) writes nothing (on SQLite, an `UPDATE` takes the
/// database's one write lock whatever it matches). Answers how many.
pub fn revive(
    conn: &mut AnyConnection,
    hashes: &[String],
    now: NaiveDateTime,
) -> QueryResult<usize> {
    let refused = format!("{}%", crate::domain::fire::TASK_REFUSED);
    let mut revived = 0;
    for chunk in hashes.chunks(REVIVE_CHUNK) {
        #[derive(QueryableByName)]
        struct Id {
            #[diesel(sql_type = Text)]
            id: String,
        }
        let mut read = sql(conn, "SELECT id FROM schedules WHERE hash IN ");
        read.bind_list(chunk.iter().map(String::as_str))
            .push(" AND NOT enabled AND disabled_reason IS NOT NULL AND disabled_reason NOT LIKE ")
            .bind(refused.as_str());
        let ids: Vec<String> = read.load::<Id>(conn)?.into_iter().map(|r| r.id).collect();
        if ids.is_empty() {
            continue;
        }
        let mut q = sql(conn, "UPDATE schedules SET enabled = ");
        q.bind(Bind::Bool(true))
            .push(", disabled_reason = NULL, modified_at = ")
            .bind(now)
            .push(", deadline_at = CASE WHEN deadline_at IS NULL OR deadline_at < ")
            .bind(now)
            .push(" THEN ")
            .bind(now)
            .push(" ELSE deadline_at END WHERE id IN ")
            .bind_list(ids.iter().map(String::as_str))
            // Still disabled by the service: a client's edit since the read stands.
            .push(" AND NOT enabled AND disabled_reason IS NOT NULL");
        revived += q.execute(conn)?;
    }
    Ok(revived)
}

/// Schedule rows [`ensure`] writes with one statement at most.
const ENSURE_CHUNK: usize = 500;

/// The statements [`ensure`] takes for `n` rows.
pub fn ensure_statements(n: usize) -> usize {
    2 * n.div_ceil(ENSURE_CHUNK)
}

/// Creates, for each `(hash, row)` whose hash has no schedule yet, that row; answers the
/// schedule id of every hash given (new or existing).
pub fn ensure(
    conn: &mut AnyConnection,
    rows: &[ScheduleRow],
) -> QueryResult<std::collections::HashMap<String, String>> {
    let mut out = std::collections::HashMap::new();
    for chunk in rows.chunks(ENSURE_CHUNK) {
        let mut q = sql(conn, &format!("INSERT INTO schedules ({COLUMNS}) VALUES "));
        for (i, r) in chunk.iter().enumerate() {
            q.push(if i == 0 { "" } else { ", " });
            values(&mut q, r);
        }
        q.push(" ON CONFLICT (hash) DO NOTHING");
        q.execute(conn)?;
        #[derive(QueryableByName)]
        struct IdHash {
            #[diesel(sql_type = Text)]
            id: String,
            #[diesel(sql_type = Text)]
            hash: String,
        }
        let mut read = sql(conn, "SELECT id, hash FROM schedules WHERE hash IN (");
        for (i, r) in chunk.iter().enumerate() {
            if i > 0 {
                read.push(", ");
            }
            read.bind(Bind::OptText(r.hash.clone()));
        }
        read.push(")");
        for row in read.load::<IdHash>(conn)? {
            out.insert(row.hash, row.id);
        }
    }
    Ok(out)
}

/// The column list that decodes into [`FireRow`].
const FIRE_COLUMNS: &str = "schedule_id, due_at, scheduler_id, organisation, decided_at, outcome, \
     reason, detail, task_id, late_seconds, late";

/// A `schedule_fires` row: one due fire of a schedule and what became of it.
#[derive(Debug, Clone, PartialEq, QueryableByName)]
pub struct FireRow {
    /// The schedule's id.
    #[diesel(sql_type = Text)]
    pub schedule_id: String,
    /// The deadline that came due (UTC).
    #[diesel(sql_type = Timestamp)]
    pub due_at: NaiveDateTime,
    /// The schedule's scheduler.
    #[diesel(sql_type = Text)]
    pub scheduler_id: String,
    /// The schedule's organisation.
    #[diesel(sql_type = Text)]
    pub organisation: String,
    /// When it was decided (UTC); for `waiting`, when it first waited.
    #[diesel(sql_type = Timestamp)]
    pub decided_at: NaiveDateTime,
    /// `fired`, `skipped` or `waiting`.
    #[diesel(sql_type = Text)]
    pub outcome: String,
    /// A [`crate::domain::fire::FireReason`]'s word.
    #[diesel(sql_type = Nullable<Text>)]
    pub reason: Option<String>,
    /// The decision in words.
    #[diesel(sql_type = Nullable<Text>)]
    pub detail: Option<String>,
    /// The fire's task, or the one in its way.
    #[diesel(sql_type = Nullable<Text>)]
    pub task_id: Option<String>,
    /// Whole seconds from `due_at` to `decided_at`.
    #[diesel(sql_type = BigInt)]
    pub late_seconds: i64,
    /// Decided more than one cron tick after it was due.
    #[diesel(sql_type = Bool)]
    pub late: bool,
}

/// Which fire a ledger row is about: a schedule and the deadline that came due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The schedule's id.
    pub schedule_id: String,
    /// The schedule's scheduler.
    pub scheduler_id: String,
    /// The schedule's organisation.
    pub organisation: String,
    /// The deadline that came due (UTC).
    pub due_at: NaiveDateTime,
    /// The schedule row's `modified_at` when the tick read it: a disable writes only a row no
    /// one changed since.
    pub read: NaiveDateTime,
}

impl ScheduleRow {
    /// The fire this due schedule stands for (`now` if it has no deadline, which a due one
    /// always has).
    pub fn due(&self, now: NaiveDateTime) -> Due {
        Due {
            schedule_id: self.id.clone(),
            scheduler_id: self.scheduler_id.clone(),
            organisation: self.organisation.clone(),
            due_at: self.deadline_at.unwrap_or(now),
            read: self.modified_at,
        }
    }
}

impl FireRow {
    /// The row of the fire `due`, decided at `decided_at` as `fate`, ticks coming every
    /// `period`.
    pub fn decided(
        due: Due,
        decided_at: NaiveDateTime,
        period: std::time::Duration,
        fate: &Fate,
    ) -> FireRow {
        let lateness = Lateness::of(due.due_at.and_utc(), decided_at.and_utc(), period);
        FireRow {
            schedule_id: due.schedule_id,
            due_at: due.due_at,
            scheduler_id: due.scheduler_id,
            organisation: due.organisation,
            decided_at,
            outcome: fate.outcome().as_str().to_owned(),
            reason: fate.reason().map(|r| r.as_str().to_owned()),
            detail: fate.detail().map(str::to_owned),
            task_id: fate.task().map(|t| t.hyphenated().to_string()),
            late_seconds: lateness.seconds,
            late: lateness.late,
        }
    }

    /// The row as the API shows it.
    pub fn into_fire(self) -> Result<Fire, StorageError> {
        let corrupt = |what: &str| {
            StorageError::Corrupt(format!(
                "fire of schedule {} due {}: {what}",
                self.schedule_id, self.due_at
            ))
        };
        Ok(Fire {
            schedule_id: Uuid::parse_str(&self.schedule_id)
                .map_err(|_| corrupt("schedule id is not a UUID"))?,
            scheduler_id: self
                .scheduler_id
                .parse()
                .map_err(|()| corrupt("unknown scheduler"))?,
            organisation: self.organisation.clone(),
            due_at: self.due_at.and_utc(),
            decided_at: self.decided_at.and_utc(),
            outcome: self
                .outcome
                .parse()
                .map_err(|()| corrupt("unknown outcome"))?,
            reason: self
                .reason
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(|()| corrupt("unknown reason"))?,
            task_id: self
                .task_id
                .as_deref()
                .map(Uuid::parse_str)
                .transpose()
                .map_err(|_| corrupt("task id is not a UUID"))?,
            detail: self.detail,
            late_seconds: self.late_seconds,
            late: self.late,
        })
    }
}

/// Rows per multi-row fire INSERT (11 binds each).
const FIRE_CHUNK: usize = 500;

/// Records fires in the caller's transaction. A decided fire (fired, skipped) replaces what its
/// row said before (it waited, or, for a deadline set back to a fire's time, an earlier
/// decision); a fire decided as fired after it waited keeps why it waited. A waiting fire is
/// written once, when it first waits: ticks that find it still waiting write nothing.
pub fn record_fires(conn: &mut AnyConnection, rows: &[FireRow]) -> QueryResult<()> {
    let waiting = FireOutcome::Waiting.as_str();
    let (waits, decided): (Vec<&FireRow>, Vec<&FireRow>) =
        rows.iter().partition(|r| r.outcome == waiting);
    for (rows, conflict) in [
        (
            decided,
            format!(
                " ON CONFLICT (schedule_id, due_at) DO UPDATE SET decided_at = excluded.decided_at, \
                 outcome = excluded.outcome, \
                 reason = CASE WHEN schedule_fires.outcome = '{waiting}' AND excluded.reason IS NULL \
                 THEN schedule_fires.reason ELSE excluded.reason END, \
                 detail = CASE WHEN schedule_fires.outcome = '{waiting}' AND excluded.reason IS NULL \
                 THEN schedule_fires.detail ELSE excluded.detail END, \
                 task_id = excluded.task_id, late_seconds = excluded.late_seconds, late = excluded.late"
            ),
        ),
        // DO NOTHING, not an update that changes nothing: PostgreSQL locks (and so writes) every
        // row an ON CONFLICT DO UPDATE meets, and a fire may wait for many ticks.
        (
            waits,
            " ON CONFLICT (schedule_id, due_at) DO NOTHING".to_owned(),
        ),
    ] {
        for chunk in rows.chunks(FIRE_CHUNK) {
            let mut q = sql(
                conn,
                &format!("INSERT INTO schedule_fires ({FIRE_COLUMNS}) VALUES "),
            );
            for (i, r) in chunk.iter().enumerate() {
                q.push(if i == 0 { "(" } else { ", (" })
                    .bind(r.schedule_id.as_str())
                    .push(", ")
                    .bind(r.due_at)
                    .push(", ")
                    .bind(r.scheduler_id.as_str())
                    .push(", ")
                    .bind(r.organisation.as_str())
                    .push(", ")
                    .bind(r.decided_at)
                    .push(", ")
                    .bind(r.outcome.as_str())
                    .push(", ")
                    .bind(Bind::OptText(r.reason.clone()))
                    .push(", ")
                    .bind(Bind::OptText(r.detail.clone()))
                    .push(", ")
                    .bind(Bind::OptText(r.task_id.clone()))
                    .push(", ")
                    .bind(Bind::BigInt(r.late_seconds))
                    .push(", ")
                    .bind(Bind::Bool(r.late))
                    .push(")");
            }
            q.push(&conflict);
            q.execute(conn)?;
        }
    }
    Ok(())
}

/// A page of a schedule's fires, newest due first, and how many it has in all.
pub fn fires(
    conn: &mut AnyConnection,
    schedule_id: &str,
    offset: i64,
    limit: i64,
) -> QueryResult<(i64, Vec<FireRow>)> {
    let mut count = sql(
        conn,
        "SELECT COUNT(*) AS count FROM schedule_fires WHERE schedule_id = ",
    );
    count.bind(schedule_id);
    let total = count
        .load::<CountRow>(conn)?
        .first()
        .map(|r| r.count)
        .unwrap_or(0);
    if limit == 0 || offset >= total {
        return Ok((total, Vec::new()));
    }
    let mut page = sql(
        conn,
        &format!("SELECT {FIRE_COLUMNS} FROM schedule_fires WHERE schedule_id = "),
    );
    page.bind(schedule_id)
        .push(" ORDER BY due_at DESC LIMIT ")
        .bind(limit)
        .push(" OFFSET ")
        .bind(offset);
    Ok((total, page.load(conn)?))
}

/// Deletes up to `limit` of `scheduler`'s fires decided before `before`; answers how many. A fire
/// still waiting is kept, however long ago it began to wait: its row says since when, and the
/// next tick would write it again as if it had just begun.
pub fn prune_fires(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    before: NaiveDateTime,
    limit: usize,
) -> QueryResult<usize> {
    let mut q = sql(
        conn,
        "DELETE FROM schedule_fires WHERE (schedule_id, due_at) IN (SELECT schedule_id, due_at \
         FROM schedule_fires WHERE scheduler_id = ",
    );
    q.bind(scheduler.as_str())
        .push(" AND decided_at < ")
        .bind(before)
        .push(" AND outcome <> ")
        .bind(FireOutcome::Waiting.as_str())
        .push(" LIMIT ")
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .push(")");
    q.execute(conn)
}
