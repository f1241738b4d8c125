//! Statements on the `frontier` and `raw_files` tables.

use chrono::NaiveDateTime;
use diesel::QueryResult;
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Nullable, Text, Timestamp};

use super::sql::{Bind, Sql};
use super::{AnyConnection, Backend};

/// An object as the frontier holds it.
#[derive(Debug, Clone, PartialEq, QueryableByName)]
pub struct FrontierRow {
    /// Its organisation.
    #[diesel(sql_type = Text)]
    pub organisation: String,
    /// Its reference.
    #[diesel(sql_type = Text)]
    pub reference: String,
    /// Its type.
    #[diesel(sql_type = Text)]
    pub object_type: String,
    /// Its scan level.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub scan_level: Option<i64>,
    /// Its scan profile type.
    #[diesel(sql_type = Nullable<Text>)]
    pub scan_profile_type: Option<String>,
    /// When first seen.
    #[diesel(sql_type = Timestamp)]
    pub first_seen: NaiveDateTime,
    /// When last seen changed.
    #[diesel(sql_type = Timestamp)]
    pub last_seen: NaiveDateTime,
    /// When it was deleted, if it was.
    #[diesel(sql_type = Nullable<Timestamp>)]
    pub gone_at: Option<NaiveDateTime>,
}

fn sql(conn: &AnyConnection, text: &str) -> Sql {
    Sql::new(Backend::of(conn), text)
}

/// Inserts or updates an object; a row already holding these values is left alone (the same
/// event twice changes nothing). Returns whether the row changed.
pub fn upsert_object(
    conn: &mut AnyConnection,
    organisation: &str,
    reference: &str,
    object_type: &str,
    scan_level: Option<i64>,
    scan_profile_type: Option<&str>,
    now: NaiveDateTime,
) -> QueryResult<bool> {
    let mut q = sql(
        conn,
        "INSERT INTO frontier (organisation, reference, object_type, scan_level, \
         scan_profile_type, first_seen, last_seen, gone_at) VALUES (",
    );
    q.bind(organisation)
        .push(", ")
        .bind(reference)
        .push(", ")
        .bind(object_type)
        .push(", ")
        .bind(Bind::OptBigInt(scan_level))
        .push(", ")
        .bind(Bind::OptText(scan_profile_type.map(str::to_owned)))
        .push(", ")
        .bind(now)
        .push(", ")
        .bind(now)
        .push(
            ", NULL) ON CONFLICT (organisation, reference) DO UPDATE SET \
             object_type = excluded.object_type, scan_level = excluded.scan_level, \
             scan_profile_type = excluded.scan_profile_type, last_seen = excluded.last_seen, \
             gone_at = NULL \
             WHERE frontier.object_type IS DISTINCT FROM excluded.object_type \
             OR frontier.scan_level IS DISTINCT FROM excluded.scan_level \
             OR frontier.scan_profile_type IS DISTINCT FROM excluded.scan_profile_type \
             OR frontier.gone_at IS NOT NULL",
        );
    Ok(q.execute(conn)? > 0)
}

/// Marks an object gone (once: a second delete changes nothing). Returns whether it changed.
pub fn mark_gone(
    conn: &mut AnyConnection,
    organisation: &str,
    reference: &str,
    now: NaiveDateTime,
) -> QueryResult<bool> {
    let mut q = sql(conn, "UPDATE frontier SET gone_at = ");
    q.bind(now)
        .push(" WHERE organisation = ")
        .bind(organisation)
        .push(" AND reference = ")
        .bind(reference)
        .push(" AND gone_at IS NULL");
    Ok(q.execute(conn)? > 0)
}

/// One object of the frontier.
pub fn get(
    conn: &mut AnyConnection,
    organisation: &str,
    reference: &str,
) -> QueryResult<Option<FrontierRow>> {
    let mut q = sql(
        conn,
        "SELECT organisation, reference, object_type, scan_level, \
         scan_profile_type, first_seen, last_seen, gone_at FROM frontier WHERE organisation = ",
    );
    q.bind(organisation)
        .push(" AND reference = ")
        .bind(reference);
    Ok(q.load::<FrontierRow>(conn)?.into_iter().next())
}

/// Records a raw file; false if it was recorded before (the same event twice).
pub fn record_raw_file(
    conn: &mut AnyConnection,
    id: &str,
    organisation: &str,
    mime_types: &str,
    now: NaiveDateTime,
) -> QueryResult<bool> {
    let mut q = sql(
        conn,
        "INSERT INTO raw_files (id, organisation, mime_types, received_at) VALUES (",
    );
    q.bind(id)
        .push(", ")
        .bind(organisation)
        .push(", ")
        .bind(mime_types)
        .push(", ")
        .bind(now)
        .push(") ON CONFLICT (id) DO NOTHING");
    Ok(q.execute(conn)? > 0)
}
