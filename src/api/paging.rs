//! Pages of a listing (`/tasks`, `/schedules`), as mula pages them: `limit` and `offset` checked
//! against their bounds, and the `next` and `previous` links of an answer.

use actix_web::HttpRequest;

use super::error::ApiError;
use crate::domain::limits::Limits;

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
pub(crate) fn links(
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
