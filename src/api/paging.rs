//! Listings (`/tasks`, `/schedules`), as mula pages them: the query parameters both take
//! (strings within the limits, `scheduler_id`, date-times), `limit` and `offset` checked against
//! their bounds, and the answer: a page with its `next` and `previous` links.

use std::future::Future;

use actix_web::{HttpRequest, HttpResponse};
use chrono::NaiveDateTime;
use serde::Serialize;
use serde_json::Value;

use super::error::ApiError;
use super::extract::non_empty;
use crate::domain::SchedulerId;
use crate::domain::filter::parse_datetime;
use crate::domain::limits::Limits;
use crate::queue::QueueError;

/// Default page size of a listing (mula's).
pub const DEFAULT_PAGE_LIMIT: i64 = 10;
/// Largest page of a listing.
pub const MAX_PAGE_LIMIT: i64 = 1000;

/// The page a listing asks for, `(offset, limit)`, within the bounds (400 naming the one that is
/// not).
pub(crate) fn page(
    offset: Option<i64>,
    limit: Option<i64>,
    limits: &Limits,
) -> Result<(i64, i64), ApiError> {
    let limit = limit.unwrap_or(DEFAULT_PAGE_LIMIT);
    if !(0..=MAX_PAGE_LIMIT).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be between 0 and {MAX_PAGE_LIMIT}, got {limit}"
        )));
    }
    let offset = offset.unwrap_or(0);
    if !(0..=limits.max_offset).contains(&offset) {
        return Err(ApiError::BadRequest(format!(
            "offset must be between 0 and {} (max_offset), got {offset}",
            limits.max_offset
        )));
    }
    Ok((offset, limit))
}

/// The URL of another page: this request's URL with `limit` and `offset` replaced.
fn page_url(req: &HttpRequest, offset: i64, limit: i64) -> String {
    let info = req.connection_info();
    let mut pairs: Vec<(String, String)> = form_urlencoded::parse(req.query_string().as_bytes())
        .into_owned()
        .filter(|(k, _)| k != "offset" && k != "limit")
        .collect();
    pairs.push(("limit".into(), limit.to_string()));
    pairs.push(("offset".into(), offset.to_string()));
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish();
    format!("{}://{}{}?{query}", info.scheme(), info.host(), req.path())
}

/// The `next` and `previous` links of a page, by mula's rule: a next page whenever
/// offset + limit <= count (so an exactly full last page still links an empty one), a previous
/// page whenever offset - limit >= 0.
fn links(
    req: &HttpRequest,
    offset: i64,
    limit: i64,
    count: i64,
) -> (Option<String>, Option<String>) {
    let next =
        (offset.saturating_add(limit) <= count).then(|| page_url(req, offset + limit, limit));
    let previous = (offset - limit >= 0).then(|| page_url(req, offset - limit, limit));
    (next, previous)
}

/// Checks every string parameter of a query against the limits, in the order the query declares
/// them (400 naming the first that is too long or holds a NUL), so a parameter added to a query
/// is checked without being listed anywhere.
pub(crate) fn check_texts(limits: &Limits, query: &impl Serialize) -> Result<(), ApiError> {
    let params = serde_json::to_value(query)
        .map_err(|e| ApiError::Queue(QueueError::Internal(e.to_string())))?;
    for (name, value) in params.as_object().into_iter().flatten() {
        if let Value::String(v) = value {
            limits.check_text(name, v)?;
        }
    }
    Ok(())
}

/// A listing's `scheduler_id` parameter: none when absent or empty, 400 when it names no
/// scheduler.
pub(crate) fn scheduler_param(value: Option<String>) -> Result<Option<SchedulerId>, ApiError> {
    non_empty(value)
        .map(|s| {
            s.parse::<SchedulerId>().map_err(|()| {
                ApiError::BadRequest(format!(
                    "scheduler_id '{s}' is unknown; use boefje, normalizer or report"
                ))
            })
        })
        .transpose()
}

/// A listing's date-time parameter `name` (ISO 8601, or a date): none when absent or empty, 400
/// naming it when it does not parse.
pub(crate) fn time_param(
    name: &str,
    value: Option<String>,
) -> Result<Option<NaiveDateTime>, ApiError> {
    non_empty(value)
        .map(|s| {
            parse_datetime(&s).ok_or_else(|| {
                ApiError::BadRequest(format!("{name} '{s}' is not an ISO 8601 date-time or date"))
            })
        })
        .transpose()
}

/// A listing's answer (`PaginatedTasks`, `PaginatedSchedules`, `PaginatedFires`): one page of its results, how
/// many match in all, and the links to the pages beside it.
pub(crate) trait Paginated: Serialize {
    /// What the listing lists.
    type Item;

    /// The answer for `results`, a page of `count`.
    fn new(
        count: i64,
        next: Option<String>,
        previous: Option<String>,
        results: Vec<Self::Item>,
    ) -> Self;
}

/// Answers a listing: the page at `offset` of `limit` rows that `read` gives, with how many match
/// in all, as `P` with its links.
pub(crate) async fn answer<P, E>(
    req: &HttpRequest,
    offset: i64,
    limit: i64,
    read: impl Future<Output = Result<(i64, Vec<P::Item>), E>>,
) -> Result<HttpResponse, ApiError>
where
    P: Paginated,
    ApiError: From<E>,
{
    let (count, results) = read.await?;
    let (next, previous) = links(req, offset, limit, count);
    Ok(HttpResponse::Ok().json(P::new(count, next, previous, results)))
}
