//! A listing as mula pages it: how many rows match, then one page of them, newest first. The
//! task list and the schedule list read through it, each with its own table, columns and
//! conditions, so both count and page alike; the conditions on the columns both tables have
//! (scheduler, organisation, creation time, a filter tree) are written here too.

use chrono::NaiveDateTime;
use diesel::QueryResult;
use diesel::deserialize::QueryableByName;

use super::filter_sql::push_filter;
use super::rows::CountRow;
use super::sql::Sql;
use super::{AnyConnection, Backend, MultiBackend};
use crate::domain::SchedulerId;
use crate::domain::filter::FilterNode;

/// Opens a listing's conditions: ` WHERE 1 = 1`, then the scheduler and the organisation asked
/// for. A table's own conditions follow, then [`push_created_and_filter`].
pub fn push_where(q: &mut Sql, scheduler_id: Option<SchedulerId>, organisation: Option<&str>) {
    q.push(" WHERE 1 = 1");
    if let Some(s) = scheduler_id {
        q.push(" AND scheduler_id = ").bind(s.as_str());
    }
    if let Some(o) = organisation {
        q.push(" AND organisation = ").bind(o);
    }
}

/// Closes a listing's conditions: the creation window (either end open) and the filter tree.
pub fn push_created_and_filter(
    q: &mut Sql,
    min_created_at: Option<NaiveDateTime>,
    max_created_at: Option<NaiveDateTime>,
    filter: Option<&FilterNode>,
) {
    if let Some(t) = min_created_at {
        q.push(" AND created_at >= ").bind(t);
    }
    if let Some(t) = max_created_at {
        q.push(" AND created_at <= ").bind(t);
    }
    if let Some(f) = filter {
        q.push(" AND ");
        push_filter(q, f);
    }
}

/// The rows of `table` that `conditions` selects (it appends the `WHERE` clause, to the count
/// and to the page alike): how many in all, and the page of `limit` from `offset`, newest first
/// (`created_at`, then `id`), as `columns` decode into `R`.
pub fn count_and_page<R>(
    conn: &mut AnyConnection,
    table: &str,
    columns: &str,
    conditions: impl Fn(&mut Sql),
    offset: i64,
    limit: i64,
) -> QueryResult<(i64, Vec<R>)>
where
    R: QueryableByName<MultiBackend> + 'static,
{
    let backend = Backend::of(conn);
    let mut count = Sql::new(backend, &format!("SELECT COUNT(*) AS count FROM {table}"));
    conditions(&mut count);
    let total = count
        .load::<CountRow>(conn)?
        .first()
        .map(|r| r.count)
        .unwrap_or(0);
    // Only the count was asked for, or the page starts past the last row: no second statement.
    if limit == 0 || offset >= total {
        return Ok((total, Vec::new()));
    }
    let mut page = Sql::new(backend, &format!("SELECT {columns} FROM {table}"));
    conditions(&mut page);
    page.push(" ORDER BY created_at DESC, id DESC LIMIT ")
        .bind(limit)
        .push(" OFFSET ")
        .bind(offset);
    Ok((total, page.load(conn)?))
}
