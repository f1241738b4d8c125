//! Statements on the `frontier` and `raw_files` tables.

use chrono::NaiveDateTime;
use diesel::QueryResult;
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Nullable, Text, Timestamp};

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
    /// Whether its work was planned when these values were written (`false`: recorded from a
    /// lookup, which plans nothing).
    #[diesel(sql_type = Bool)]
    pub planned: bool,
}

/// The column list that decodes into [`FrontierRow`].
const ROW_COLUMNS: &str = "organisation, reference, object_type, scan_level, scan_profile_type, \
     first_seen, last_seen, gone_at, planned";

fn sql(conn: &AnyConnection, text: &str) -> Sql {
    Sql::new(Backend::of(conn), text)
}

/// An object to upsert into the frontier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRow {
    /// Its organisation.
    pub organisation: String,
    /// Its reference.
    pub reference: String,
    /// Its type.
    pub object_type: String,
    /// Its scan level.
    pub scan_level: Option<i64>,
    /// Its scan profile type.
    pub scan_profile_type: Option<String>,
}

/// Objects per multi-row upsert (8 binds each).
pub const UPSERT_CHUNK: usize = 1000;

/// A row that differs from what the frontier holds (or is gone there): the only rows an upsert
/// changes beyond their confirmation.
const CHANGED: &str = "frontier.object_type IS DISTINCT FROM excluded.object_type \
     OR frontier.scan_level IS DISTINCT FROM excluded.scan_level \
     OR frontier.scan_profile_type IS DISTINCT FROM excluded.scan_profile_type \
     OR frontier.gone_at IS NOT NULL";

/// The most bytes of organisation and reference together that the frontier mirrors: its
/// primary key is their index entry, which PostgreSQL refuses over 2,704 bytes. A longer
/// reference (a URL with a long query) is not mirrored: its events are planned from what they
/// carry, and where the frontier has no row the service asks Octopoes, as for any object no
/// event announced. SQLite takes any length, and holds to the same rule so that both backends
/// answer alike.
pub const MIRRORED_KEY_BYTES: usize = 2_000;

/// Whether the frontier mirrors this object ([`MIRRORED_KEY_BYTES`]).
pub fn mirrored(organisation: &str, reference: &str) -> bool {
    organisation.len() + reference.len() <= MIRRORED_KEY_BYTES
}

/// Inserts or updates objects, a multi-row statement per [`UPSERT_CHUNK`]; each (organisation,
/// reference) at most once per call. A row already holding these values is left alone (the same
/// event twice changes nothing), except that `confirmed`, when given (a ColdStart pass), is
/// stamped on every row, and that `planned` (an event or a pass, which plan the objects' work)
/// marks a row a lookup recorded as planned. New or changed values written unplanned (a lookup)
/// leave the row unplanned. Objects the frontier does not mirror ([`mirrored`]) are left out.
/// Returns how many rows were written.
pub fn upsert_objects(
    conn: &mut AnyConnection,
    objects: &[ObjectRow],
    now: NaiveDateTime,
    confirmed: Option<NaiveDateTime>,
    planned: bool,
) -> QueryResult<usize> {
    let mut written = 0;
    let postgres = Backend::of(conn) == Backend::Postgres;
    let objects: Vec<&ObjectRow> = objects
        .iter()
        .filter(|o| mirrored(&o.organisation, &o.reference))
        .collect();
    for chunk in objects.chunks(UPSERT_CHUNK) {
        let mut q = sql(
            conn,
            "INSERT INTO frontier (organisation, reference, object_type, scan_level, \
             scan_profile_type, first_seen, last_seen, gone_at, confirmed_at, planned) ",
        );
        if postgres {
            // One JSON document instead of 8 binds a row: a short statement to parse and plan.
            let rows: Vec<serde_json::Value> = chunk
                .iter()
                .map(|o| {
                    serde_json::json!([
                        o.organisation,
                        o.reference,
                        o.object_type,
                        o.scan_level,
                        o.scan_profile_type
                    ])
                })
                .collect();
            q.push("SELECT r->>0, r->>1, r->>2, (r->>3)::bigint, r->>4, ")
                .bind(now)
                .push(", ")
                .bind(now)
                .push(", NULL::timestamp, ")
                .bind(Bind::OptTime(confirmed))
                .push("::timestamp, ")
                .bind(Bind::Bool(planned))
                .push(" FROM json_array_elements(")
                .bind(serde_json::Value::Array(rows).to_string())
                .push("::json) AS r");
        } else {
            q.push("VALUES ");
        }
        for (i, o) in chunk.iter().enumerate().filter(|_| !postgres) {
            q.push(if i == 0 { "(" } else { ", (" });
            q.bind(o.organisation.as_str())
                .push(", ")
                .bind(o.reference.as_str())
                .push(", ")
                .bind(o.object_type.as_str())
                .push(", ")
                .bind(Bind::OptBigInt(o.scan_level))
                .push(", ")
                .bind(Bind::OptText(o.scan_profile_type.clone()))
                .push(", ")
                .bind(now)
                .push(", ")
                .bind(now)
                .push(", NULL, ")
                .bind(Bind::OptTime(confirmed))
                .push(", ")
                .bind(Bind::Bool(planned))
                .push(")");
        }
        q.push(&format!(
            " ON CONFLICT (organisation, reference) DO UPDATE SET \
             object_type = excluded.object_type, scan_level = excluded.scan_level, \
             scan_profile_type = excluded.scan_profile_type, \
             last_seen = CASE WHEN {CHANGED} THEN excluded.last_seen ELSE frontier.last_seen END, \
             gone_at = NULL, \
             confirmed_at = COALESCE(excluded.confirmed_at, frontier.confirmed_at), \
             planned = CASE WHEN {CHANGED} THEN excluded.planned \
             ELSE (frontier.planned OR excluded.planned) END \
             WHERE {CHANGED} OR excluded.confirmed_at IS NOT NULL \
             OR (excluded.planned AND NOT frontier.planned)"
        ));
        written += q.execute(conn)?;
    }
    Ok(written)
}

/// Inserts or updates one object (see [`upsert_objects`]). Returns whether the row changed.
pub fn upsert_object(
    conn: &mut AnyConnection,
    organisation: &str,
    reference: &str,
    object_type: &str,
    scan_level: Option<i64>,
    scan_profile_type: Option<&str>,
    now: NaiveDateTime,
) -> QueryResult<bool> {
    let row = ObjectRow {
        organisation: organisation.to_owned(),
        reference: reference.to_owned(),
        object_type: object_type.to_owned(),
        scan_level,
        scan_profile_type: scan_profile_type.map(str::to_owned),
    };
    Ok(upsert_objects(conn, &[row], now, None, true)? > 0)
}

/// The rows the frontier holds for these objects of one organisation (gone ones too).
pub fn get_many(
    conn: &mut AnyConnection,
    organisation: &str,
    references: &[String],
) -> QueryResult<Vec<FrontierRow>> {
    let mut out = Vec::new();
    if Backend::of(conn) == Backend::Postgres {
        for chunk in references.chunks(UPSERT_CHUNK) {
            let mut q = sql(
                conn,
                &format!("SELECT {ROW_COLUMNS} FROM frontier WHERE organisation = "),
            );
            q.bind(organisation)
                .push(" AND reference IN (SELECT json_array_elements_text(")
                .bind(serde_json::to_string(chunk).unwrap_or_else(|_| "[]".into()))
                .push("::json))");
            out.extend(q.load::<FrontierRow>(conn)?);
        }
        return Ok(out);
    }
    for chunk in references.chunks(UPSERT_CHUNK) {
        let mut q = sql(
            conn,
            &format!("SELECT {ROW_COLUMNS} FROM frontier WHERE organisation = "),
        );
        q.bind(organisation).push(" AND reference IN (");
        for (i, r) in chunk.iter().enumerate() {
            if i > 0 {
                q.push(", ");
            }
            q.bind(r.as_str());
        }
        q.push(")");
        out.extend(q.load::<FrontierRow>(conn)?);
    }
    Ok(out)
}

/// The organisations among `organisations` whose frontier holds `reference` (not gone), with
/// their rows: who a de-duplicated boefje task may have siblings in.
pub fn holders(
    conn: &mut AnyConnection,
    reference: &str,
    organisations: &[String],
) -> QueryResult<Vec<FrontierRow>> {
    if organisations.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = sql(
        conn,
        &format!("SELECT {ROW_COLUMNS} FROM frontier WHERE reference = "),
    );
    q.bind(reference)
        .push(" AND gone_at IS NULL AND organisation IN (");
    for (i, o) in organisations.iter().enumerate() {
        if i > 0 {
            q.push(", ");
        }
        q.bind(o.as_str());
    }
    q.push(")");
    q.load::<FrontierRow>(conn)
}

/// Confirms the rows of these objects of `organisation` for the ColdStart pass begun at
/// `confirmed`, their values left as they are: objects Octopoes listed that could not be read,
/// which it still holds, so the pass must not find them gone. Rare, so a plain list of binds.
pub fn confirm_objects(
    conn: &mut AnyConnection,
    organisation: &str,
    references: &[String],
    confirmed: NaiveDateTime,
) -> QueryResult<usize> {
    let mut written = 0;
    for chunk in references.chunks(UPSERT_CHUNK) {
        let mut q = sql(conn, "UPDATE frontier SET confirmed_at = ");
        q.bind(confirmed)
            .push(" WHERE organisation = ")
            .bind(organisation)
            .push(" AND reference IN ")
            .bind_list(chunk.iter().map(String::as_str));
        written += q.execute(conn)?;
    }
    Ok(written)
}

/// The objects of `organisation` a ColdStart pass begun at `pass_started` did not see: rows it
/// did not confirm and that nothing touched since it began (an object created while the pass ran
/// is not in its snapshot). Only candidates: Octopoes lists by type alone and writes at past
/// valid times, so a listing can change under a pass and move an object onto a page already
/// read.
pub fn unseen_by_pass(
    conn: &mut AnyConnection,
    organisation: &str,
    pass_started: NaiveDateTime,
) -> QueryResult<Vec<String>> {
    #[derive(QueryableByName)]
    struct Reference {
        #[diesel(sql_type = Text)]
        reference: String,
    }
    let mut q = sql(conn, "SELECT reference FROM frontier WHERE organisation = ");
    q.bind(organisation)
        .push(" AND gone_at IS NULL AND (confirmed_at IS NULL OR confirmed_at < ")
        .bind(pass_started)
        .push(") AND last_seen < ")
        .bind(pass_started)
        .push(" ORDER BY reference");
    Ok(q.load::<Reference>(conn)?
        .into_iter()
        .map(|r| r.reference)
        .collect())
}

/// Where an organisation's ColdStart pass is.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct Progress {
    /// The organisation.
    #[diesel(sql_type = Text)]
    pub organisation: String,
    /// When the current (or last) pass began.
    #[diesel(sql_type = Timestamp)]
    pub pass_started_at: NaiveDateTime,
    /// The snapshot the pass reads (Octopoes' `valid_time`), kept so a resumed pass pages the
    /// same list.
    #[diesel(sql_type = Timestamp)]
    pub valid_time: NaiveDateTime,
    /// The offset of the next page to read.
    #[diesel(sql_type = BigInt)]
    pub next_offset: i64,
    /// Objects this pass confirmed so far: loaded, or listed but unreadable with a known
    /// reference. Fewer than `next_offset` means some listed object could not be confirmed.
    #[diesel(sql_type = BigInt)]
    pub loaded: i64,
    /// Objects in the snapshot, once a page said.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub total: Option<i64>,
    /// When the pass completed; `None` while it runs.
    #[diesel(sql_type = Nullable<Timestamp>)]
    pub completed_at: Option<NaiveDateTime>,
}

/// Every organisation's ColdStart progress.
pub fn progress_all(conn: &mut AnyConnection) -> QueryResult<Vec<Progress>> {
    sql(
        conn,
        "SELECT organisation, pass_started_at, valid_time, next_offset, loaded, total, \
         completed_at FROM coldstart_progress ORDER BY organisation",
    )
    .load(conn)
}

/// Saves an organisation's ColdStart progress.
pub fn progress_save(
    conn: &mut AnyConnection,
    p: &Progress,
    now: NaiveDateTime,
) -> QueryResult<()> {
    let mut q = sql(
        conn,
        "INSERT INTO coldstart_progress (organisation, pass_started_at, valid_time, next_offset, \
         loaded, total, completed_at, updated_at) VALUES (",
    );
    q.bind(p.organisation.as_str())
        .push(", ")
        .bind(p.pass_started_at)
        .push(", ")
        .bind(p.valid_time)
        .push(", ")
        .bind(p.next_offset)
        .push(", ")
        .bind(p.loaded)
        .push(", ")
        .bind(Bind::OptBigInt(p.total))
        .push(", ")
        .bind(Bind::OptTime(p.completed_at))
        .push(", ")
        .bind(now)
        .push(
            ") ON CONFLICT (organisation) DO UPDATE SET pass_started_at = excluded.pass_started_at, \
             valid_time = excluded.valid_time, next_offset = excluded.next_offset, \
             loaded = excluded.loaded, total = excluded.total, \
             completed_at = excluded.completed_at, updated_at = excluded.updated_at",
        );
    q.execute(conn)?;
    Ok(())
}

#[derive(QueryableByName)]
struct EnabledRow {
    #[diesel(sql_type = Text)]
    organisation: String,
    #[diesel(sql_type = Text)]
    boefjes: String,
}

/// The boefjes each organisation had enabled when ColdStart last recorded them, by
/// organisation. A row whose list cannot be read counts as none recorded.
pub fn enabled_boefjes_all(
    conn: &mut AnyConnection,
) -> QueryResult<std::collections::HashMap<String, std::collections::BTreeSet<String>>> {
    let rows: Vec<EnabledRow> = sql(
        conn,
        "SELECT organisation, boefjes FROM enabled_boefjes ORDER BY organisation",
    )
    .load(conn)?;
    Ok(rows
        .into_iter()
        .filter_map(|r| {
            serde_json::from_str(&r.boefjes)
                .ok()
                .map(|set| (r.organisation, set))
        })
        .collect())
}

/// Records the boefjes `organisation` has enabled now.
pub fn enabled_boefjes_save(
    conn: &mut AnyConnection,
    organisation: &str,
    boefjes: &std::collections::BTreeSet<String>,
    now: NaiveDateTime,
) -> QueryResult<()> {
    let list = serde_json::to_string(boefjes)
        .map_err(|e| diesel::result::Error::SerializationError(Box::new(e)))?;
    let mut q = sql(
        conn,
        "INSERT INTO enabled_boefjes (organisation, boefjes, modified_at) VALUES (",
    );
    q.bind(organisation)
        .push(", ")
        .bind(list.as_str())
        .push(", ")
        .bind(now)
        .push(
            ") ON CONFLICT (organisation) DO UPDATE SET boefjes = excluded.boefjes, \
             modified_at = excluded.modified_at",
        );
    q.execute(conn)?;
    Ok(())
}

/// Marks an object gone (once: a second delete changes nothing). Returns whether it changed.
///
/// An object the frontier never held gets a row marked gone too: the delete is Octopoes' word,
/// and without the row the object would be unknown rather than gone. Its type is read from the
/// reference (`Hostname|internet|example.com`), as the frontier has no other. An object the
/// frontier does not mirror ([`mirrored`]) is left alone.
pub fn mark_gone(
    conn: &mut AnyConnection,
    organisation: &str,
    reference: &str,
    now: NaiveDateTime,
) -> QueryResult<bool> {
    if !mirrored(organisation, reference) {
        return Ok(false);
    }
    let object_type = reference.split('|').next().unwrap_or_default();
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
        .push(", NULL, NULL, ")
        .bind(now)
        .push(", ")
        .bind(now)
        .push(", ")
        .bind(now)
        .push(
            ") ON CONFLICT (organisation, reference) DO UPDATE SET gone_at = excluded.gone_at \
             WHERE frontier.gone_at IS NULL",
        );
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
        &format!("SELECT {ROW_COLUMNS} FROM frontier WHERE organisation = "),
    );
    q.bind(organisation)
        .push(" AND reference = ")
        .bind(reference);
    Ok(q.load::<FrontierRow>(conn)?.into_iter().next())
}

/// Records raw files (id, organisation, mime types as JSON); one recorded before is left alone
/// (the same event twice). Returns how many were new.
pub fn record_raw_files(
    conn: &mut AnyConnection,
    files: &[(String, String, String)],
    now: NaiveDateTime,
) -> QueryResult<usize> {
    let mut new = 0;
    for chunk in files.chunks(UPSERT_CHUNK) {
        let mut q = sql(
            conn,
            "INSERT INTO raw_files (id, organisation, mime_types, received_at) VALUES ",
        );
        for (i, (id, org, mime)) in chunk.iter().enumerate() {
            q.push(if i == 0 { "(" } else { ", (" });
            q.bind(id.as_str())
                .push(", ")
                .bind(org.as_str())
                .push(", ")
                .bind(mime.as_str())
                .push(", ")
                .bind(now)
                .push(")");
        }
        q.push(" ON CONFLICT (id) DO NOTHING");
        new += q.execute(conn)?;
    }
    Ok(new)
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
