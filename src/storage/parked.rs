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

/// Of `object_keys`, the last `seq` parked and the latest next try of each with events parked
/// and not refused.
fn last_parked(
    conn: &mut AnyConnection,
    object_keys: &[String],
) -> QueryResult<HashMap<String, (i64, NaiveDateTime)>> {
    #[derive(QueryableByName)]
    struct Last {
        #[diesel(sql_type = Text)]
        object_key: String,
        #[diesel(sql_type = BigInt)]
        seq: i64,
        #[diesel(sql_type = Timestamp)]
        next_try_at: NaiveDateTime,
    }
    if object_keys.is_empty() {
        return Ok(HashMap::new());
    }
    let mut q = sql(
        conn,
        "SELECT object_key, MAX(seq) AS seq, MAX(next_try_at) AS next_try_at \
         FROM listener_parked WHERE refused IS NULL AND object_key IN ",
    );
    q.bind_list(object_keys.iter().map(String::as_str))
        .push(" GROUP BY object_key");
    Ok(q.load::<Last>(conn)?
        .into_iter()
        .map(|l| (l.object_key, (l.seq, l.next_try_at)))
        .collect())
}

/// Of `object_keys`, those with an event parked and not refused: their later events must be
/// parked behind it.
pub fn parked_objects(
    conn: &mut AnyConnection,
    object_keys: &[String],
) -> QueryResult<HashSet<String>> {
    #[derive(QueryableByName)]
    struct Key {
        #[diesel(sql_type = Text)]
        object_key: String,
    }
    if object_keys.is_empty() {
        return Ok(HashSet::new());
    }
    let mut q = sql(
        conn,
        "SELECT DISTINCT object_key FROM listener_parked WHERE refused IS NULL \
         AND object_key IN ",
    );
    q.bind_list(object_keys.iter().map(String::as_str));
    Ok(q.load::<Key>(conn)?
        .into_iter()
        .map(|k| k.object_key)
        .collect())
}

/// Takes up to `limit` of `source`'s parked events due at `now`, those due longest first (an
/// event that failed again waits behind those not tried since: one organisation's failing
/// events do not hold the others'), each the first of its object still parked (an object's
/// later events wait for it), and marks them taken until `until`, so that no other instance
/// applies them meanwhile. Answers them in their order.
///
/// The events due are read first, and written only when there are some: the entry runs every
/// tick, and on SQLite a write statement takes the database's write lock even when it changes
/// nothing.
pub fn claim(
    conn: &mut AnyConnection,
    source: &str,
    now: NaiveDateTime,
    until: NaiveDateTime,
    limit: i64,
) -> QueryResult<Vec<Claimed>> {
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = Text)]
        id: String,
    }
    let mut q = sql(
        conn,
        "SELECT p.id FROM listener_parked p WHERE p.refused IS NULL AND p.source = ",
    );
    q.bind(source)
        .push(" AND p.next_try_at <= ")
        .bind(now)
        .push(" AND (p.claimed_until IS NULL OR p.claimed_until < ")
        .bind(now)
        .push(
            ") AND (p.object_key IS NULL OR NOT EXISTS (SELECT 1 FROM listener_parked e \
             WHERE e.object_key = p.object_key AND e.refused IS NULL \
             AND (e.seq < p.seq OR (e.seq = p.seq AND e.id < p.id)))) \
             ORDER BY p.next_try_at, p.seq LIMIT ",
        )
        .bind(limit);
    let due: Vec<String> = q.load::<Id>(conn)?.into_iter().map(|r| r.id).collect();
    if due.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = sql(conn, "UPDATE listener_parked SET claimed_until = ");
    q.bind(until).push(" WHERE id IN ");
    q.bind_list(due.iter().map(String::as_str))
        // Checked again on the row itself: another instance that took it between the read and
        // the write leaves it alone here.
        .push(" AND (claimed_until IS NULL OR claimed_until < ")
        .bind(now)
        .push(") RETURNING id, seq, body, attempts");
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
/// later events no sooner (they wait for it anyway, and the claim need not read past them).
pub fn again(
    conn: &mut AnyConnection,
    id: &str,
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
        .bind(id);
    let n = q.execute(conn)?;
    let mut q = sql(conn, "UPDATE listener_parked SET next_try_at = ");
    q.bind(next)
        .push(
            " WHERE refused IS NULL AND object_key IN (SELECT object_key FROM listener_parked \
             WHERE id = ",
        )
        .bind(id)
        .push(") AND next_try_at < ")
        .bind(next);
    q.execute(conn)?;
    Ok(n)
}

/// An event refused for what it says: kept, never tried again, and no longer holding its
/// object's later events.
pub fn refuse(conn: &mut AnyConnection, id: &str, reason: &str) -> QueryResult<usize> {
    let mut q = sql(
        conn,
        "UPDATE listener_parked SET claimed_until = NULL, refused = ",
    );
    q.bind(reason).push(" WHERE id = ").bind(id);
    q.execute(conn)
}
