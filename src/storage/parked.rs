//! The `listener_parked` rows: events the listener set aside after failing for a passing reason
//! too long (see [`crate::listener::parked`]). Each row is one message as received, with the
//! object it is about (`object_key`, so that an object's events apply in the order parked) and
//! when it is next tried.

use std::collections::{HashMap, HashSet};

use chrono::NaiveDateTime;
use diesel::sql_types::{BigInt, Integer, Text, Timestamp};
use diesel::{Connection, QueryResult, QueryableByName};

use super::sql::Sql;
use super::{AnyConnection, Backend};

/// Pages of due events a claim reads at most (see [`claim`]).
const CLAIM_PAGES: usize = 10;

fn sql(conn: &AnyConnection, text: &str) -> Sql {
    Sql::new(Backend::of(conn), text)
}

/// A message to park.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewParked {
    /// Its row id (a UUID).
    pub id: String,
    /// The queue it came from (`mutations`, `raw_files`).
    pub source: &'static str,
    /// Its place among the events parked (an object's apply in this order).
    pub seq: i64,
    /// The organisation it is for.
    pub organisation: String,
    /// The object it is about (a digest of organisation and reference); `None` for raw files.
    pub object_key: Option<String>,
    /// The message as received.
    pub body: String,
    /// Why it was parked.
    pub reason: String,
}

/// A parked message taken to be applied again.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct Claimed {
    /// Its row id.
    #[diesel(sql_type = Text)]
    pub id: String,
    /// Its place among the events parked.
    #[diesel(sql_type = BigInt)]
    pub seq: i64,
    /// The object it is about; `None` for raw files.
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    pub object_key: Option<String>,
    /// The message as received.
    #[diesel(sql_type = Text)]
    pub body: String,
    /// How often it was tried from here before.
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
}

/// Writes `rows`, parked at `now` and first tried again at `next`, all or none. An object's
/// row is placed after the object's rows already parked, whatever `seq` the caller gave
/// (another instance's clock may be ahead of this one's), and is first tried no sooner than
/// they are next: it waits for them anyway.
pub fn park(
    conn: &mut AnyConnection,
    rows: &[NewParked],
    now: NaiveDateTime,
    next: NaiveDateTime,
) -> QueryResult<()> {
    if rows.is_empty() {
        return Ok(());
    }
    conn.transaction(|c| {
        // It reads before it writes: on SQLite the write lock is taken first, or a commit of
        // another connection in between would fail the insert at once ("database is locked").
        super::begin_write(c)?;
        let keys: Vec<String> = rows.iter().filter_map(|r| r.object_key.clone()).collect();
        let mut ahead = last_parked(c, &keys)?;
        let mut q = sql(
            c,
            "INSERT INTO listener_parked (id, source, seq, organisation, object_key, body, \
             reason, attempts, parked_at, next_try_at) VALUES ",
        );
        for (i, r) in rows.iter().enumerate() {
            let (mut seq, mut first_try) = (r.seq, next);
            if let Some(k) = &r.object_key {
                if let Some((last, at)) = ahead.get(k) {
                    seq = seq.max(last.saturating_add(1));
                    first_try = first_try.max(*at);
                }
                ahead.insert(k.clone(), (seq, first_try));
            }
            if i > 0 {
                q.push(", ");
            }
            q.push("(")
                .bind(r.id.as_str())
                .push(", ")
                .bind(r.source)
                .push(", ")
                .bind(seq)
                .push(", ")
                .bind(r.organisation.as_str())
                .push(", ")
                .bind(super::sql::Bind::OptText(r.object_key.clone()))
                .push(", ")
                .bind(r.body.as_str())
                .push(", ")
                .bind(r.reason.as_str())
                .push(", 0, ")
                .bind(now)
                .push(", ")
                .bind(first_try)
                .push(")");
        }
        q.execute(c).map(|_| ())
    })
}

/// A parked row of one of the objects asked for.
#[derive(Debug, QueryableByName)]
struct ObjectRow {
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Text)]
    object_key: String,
    #[diesel(sql_type = BigInt)]
    seq: i64,
    #[diesel(sql_type = Timestamp)]
    next_try_at: NaiveDateTime,
    /// 1 when not refused.
    #[diesel(sql_type = Integer)]
    waiting: i32,
}

/// Every parked row of `object_keys` (refused ones too: told apart by `waiting`, here and not in
/// the statement). The statement names only what `ix_listener_parked_object` holds, and the
/// keys as an array (`= ANY`) rather than a set to join: on a table never analysed, PostgreSQL
/// otherwise takes the partial index of rows not refused, or a join over the whole table
/// (`cargo bench --bench broker -- --parked`, at 100,000 parked events: 1.8 s a batch of 100
/// objects, against 0.2 ms). The statement is kept prepared: its text is the same whatever the
/// number of keys.
fn rows_of_objects(
    conn: &mut AnyConnection,
    object_keys: &[String],
) -> QueryResult<Vec<ObjectRow>> {
    if object_keys.is_empty() {
        return Ok(Vec::new());
    }
    objects_statement(Backend::of(conn), object_keys).load_prepared::<ObjectRow>(conn)
}

/// The statement of `rows_of_objects` (public for the plan tests).
pub fn objects_statement(backend: Backend, object_keys: &[String]) -> Sql {
    let mut q = Sql::new(
        backend,
        "SELECT id, object_key, seq, next_try_at, \
         CASE WHEN refused IS NULL THEN 1 ELSE 0 END AS waiting \
         FROM listener_parked WHERE object_key IS NOT NULL AND object_key ",
    );
    q.push(match backend {
        Backend::Postgres => "= ANY(ARRAY(SELECT json_array_elements_text(",
        Backend::Sqlite => "IN (SELECT value FROM json_each(",
    })
    .bind(serde_json::to_string(object_keys).unwrap_or_else(|_| "[]".into()))
    .push(match backend {
        Backend::Postgres => "::json)))",
        Backend::Sqlite => "))",
    });
    q
}

/// The events of `source` due at `now` and not taken, those due longest first, at most
/// `limit`, after `after` (the last event of the page before: its next try and place) when
/// given (the first statement of [`claim`]; public for the plan tests).
pub fn due_statement(
    backend: Backend,
    source: &str,
    now: NaiveDateTime,
    after: Option<(NaiveDateTime, i64)>,
    limit: i64,
) -> Sql {
    let mut q = Sql::new(
        backend,
        "SELECT id, object_key, next_try_at, seq FROM listener_parked WHERE refused IS NULL \
         AND source = ",
    );
    q.bind(source)
        .push(" AND next_try_at <= ")
        .bind(now)
        .push(" AND (claimed_until IS NULL OR claimed_until < ")
        .bind(now)
        .push(")");
    if let Some((at, seq)) = after {
        q.push(" AND next_try_at >= ")
            .bind(at)
            .push(" AND (next_try_at > ")
            .bind(at)
            .push(" OR seq > ")
            .bind(seq)
            .push(")");
    }
    q.push(" ORDER BY next_try_at, seq LIMIT ").bind(limit);
    q
}

/// Of `object_keys`, the last `seq` parked and the latest next try of each with events parked
/// and not refused.
fn last_parked(
    conn: &mut AnyConnection,
    object_keys: &[String],
) -> QueryResult<HashMap<String, (i64, NaiveDateTime)>> {
    let mut last: HashMap<String, (i64, NaiveDateTime)> = HashMap::new();
    for r in rows_of_objects(conn, object_keys)? {
        if r.waiting == 0 {
            continue;
        }
        let e = last.entry(r.object_key).or_insert((r.seq, r.next_try_at));
        *e = (e.0.max(r.seq), e.1.max(r.next_try_at));
    }
    Ok(last)
}

/// Of `object_keys`, those with an event parked and not refused: their later events must be
/// parked behind it. The listener asks this of every batch of object events.
pub fn parked_objects(
    conn: &mut AnyConnection,
    object_keys: &[String],
) -> QueryResult<HashSet<String>> {
    Ok(rows_of_objects(conn, object_keys)?
        .into_iter()
        .filter(|r| r.waiting == 1)
        .map(|r| r.object_key)
        .collect())
}

/// Takes up to `limit` of `source`'s parked events due at `now`, those due longest first (an
/// event that failed again waits behind those not tried since: one organisation's failing
/// events do not hold the others'), each the first of its object still parked (an object's
/// later events wait for it), and marks them taken until `until`, so that no other instance
/// applies them meanwhile. Answers them in their order.
///
/// Three statements, each on one index whatever the statistics: the events due, read from
/// `ix_listener_parked_due` in the order they came due (pages of twice the limit, as some wait
/// behind an earlier event of their object); the rows of their objects, by key, to keep only
/// each object's first; then the claim, by id. They read before they write, and write only when
/// some are due: the entry runs every tick, and on SQLite a write statement takes the
/// database's write lock even when it changes nothing.
pub fn claim(
    conn: &mut AnyConnection,
    source: &str,
    now: NaiveDateTime,
    until: NaiveDateTime,
    limit: i64,
) -> QueryResult<Vec<Claimed>> {
    #[derive(QueryableByName)]
    struct Due {
        #[diesel(sql_type = Text)]
        id: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
        object_key: Option<String>,
        #[diesel(sql_type = Timestamp)]
        next_try_at: NaiveDateTime,
        #[diesel(sql_type = BigInt)]
        seq: i64,
    }
    let want = usize::try_from(limit).unwrap_or(0);
    let page = limit.saturating_mul(2);
    let mut take: Vec<String> = Vec::new();
    let mut after = None;
    // Pages of due events until enough are found that are their object's first: a page can
    // hold only later events of objects whose first is not due, or taken (by an instance that
    // stopped, until its claim runs out); the events behind them must not wait for that.
    for _ in 0..CLAIM_PAGES {
        let due = due_statement(Backend::of(conn), source, now, after, page)
            .load_prepared::<Due>(conn)?;
        let full = i64::try_from(due.len()).unwrap_or(i64::MAX) >= page;
        after = due.last().map(|d| (d.next_try_at, d.seq));
        let keys: Vec<String> = due
            .iter()
            .filter_map(|d| d.object_key.clone())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        // Each object's first event still parked (refused ones hold nothing back).
        let mut first: HashMap<String, (i64, String)> = HashMap::new();
        for r in rows_of_objects(conn, &keys)? {
            if r.waiting == 0 {
                continue;
            }
            let candidate = (r.seq, r.id);
            match first.get_mut(&r.object_key) {
                Some(f) if *f <= candidate => {}
                Some(f) => *f = candidate,
                None => {
                    first.insert(r.object_key, candidate);
                }
            }
        }
        take.extend(
            due.into_iter()
                .filter(|d| match &d.object_key {
                    None => true,
                    Some(k) => first.get(k).is_some_and(|(_, id)| *id == d.id),
                })
                .map(|d| d.id),
        );
        if take.len() >= want || !full {
            break;
        }
    }
    take.truncate(want);
    if take.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = sql(conn, "UPDATE listener_parked SET claimed_until = ");
    q.bind(until).push(" WHERE id IN ");
    q.bind_list(take.iter().map(String::as_str))
        // Checked again on the row itself: another instance that took it between the read and
        // the write leaves it alone here.
        .push(" AND (claimed_until IS NULL OR claimed_until < ")
        .bind(now)
        .push(") RETURNING id, seq, object_key, body, attempts");
    let mut rows = q.load::<Claimed>(conn)?;
    rows.sort_by(|a, b| (a.seq, &a.id).cmp(&(b.seq, &b.id)));
    Ok(rows)
}

/// Deletes the events applied.
pub fn applied(conn: &mut AnyConnection, ids: &[String]) -> QueryResult<usize> {
    if ids.is_empty() {
        return Ok(0);
    }
    let mut q = sql(conn, "DELETE FROM listener_parked WHERE id IN ");
    q.bind_list(ids.iter().map(String::as_str));
    q.execute(conn)
}

/// An event that failed again for a passing reason: tried again at `next`, and its object's
/// later events (`object_key`) no sooner (they wait for it anyway, and the claim need not read
/// past them).
pub fn again(
    conn: &mut AnyConnection,
    id: &str,
    claimed_until: NaiveDateTime,
    object_key: Option<&str>,
    reason: &str,
    next: NaiveDateTime,
) -> QueryResult<usize> {
    let mut q = sql(
        conn,
        "UPDATE listener_parked SET attempts = attempts + 1, claimed_until = NULL, reason = ",
    );
    q.bind(reason)
        .push(", next_try_at = ")
        .bind(next)
        .push(" WHERE id = ")
        .bind(id)
        // Only while this claim holds: one that ran out may be another instance's now.
        .push(" AND claimed_until = ")
        .bind(claimed_until);
    let n = q.execute(conn)?;
    if let (Some(key), 1) = (object_key, n) {
        // Refused rows are moved too: nothing claims them, and naming them would offer the
        // planner the index of rows not refused.
        let mut q = sql(conn, "UPDATE listener_parked SET next_try_at = ");
        q.bind(next)
            .push(" WHERE object_key IS NOT NULL AND object_key = ")
            .bind(key)
            .push(" AND next_try_at < ")
            .bind(next);
        q.execute(conn)?;
    }
    Ok(n)
}

/// An event refused for what it says: kept, never tried again, and no longer holding its
/// object's later events (only while the claim `claimed_until` holds).
pub fn refuse(
    conn: &mut AnyConnection,
    id: &str,
    claimed_until: NaiveDateTime,
    reason: &str,
) -> QueryResult<usize> {
    let mut q = sql(
        conn,
        "UPDATE listener_parked SET claimed_until = NULL, refused = ",
    );
    q.bind(reason)
        .push(" WHERE id = ")
        .bind(id)
        .push(" AND claimed_until = ")
        .bind(claimed_until);
    q.execute(conn)
}
