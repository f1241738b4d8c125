//! Request parsing with errors that name the field: bodies (read within a deadline), JSON (with
//! the path to the bad value), UUIDs in paths, and query strings.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use actix_web::error::QueryPayloadError;
use actix_web::web::{Bytes, BytesMut};
use actix_web::{FromRequest, HttpRequest, dev::Payload};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::error::ApiError;
use crate::domain::SchedulerId;
use crate::queue::QueueError;

/// The scheduler a path names (`{scheduler_id}`), parsed once at the edge: an unknown one is a
/// 404 naming it, before any handler runs.
#[derive(Debug, Clone, Copy)]
pub struct SchedulerPath(pub SchedulerId);

impl FromRequest for SchedulerPath {
    type Error = ApiError;
    type Future = std::future::Ready<Result<SchedulerPath, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let id = req.match_info().get("scheduler_id").unwrap_or_default();
        std::future::ready(
            id.parse()
                .map(SchedulerPath)
                .map_err(|()| ApiError::Queue(QueueError::UnknownScheduler(id.to_owned()))),
        )
    }
}

/// How a request body is read: at most `max_bytes`, within `timeout` of the handler asking.
#[derive(Debug, Clone, Copy)]
pub struct BodyConfig {
    /// Largest body (413 beyond).
    pub max_bytes: usize,
    /// Time to receive the whole body (408 beyond).
    pub timeout: Duration,
}

/// A request body read in full within [`BodyConfig`]'s deadline: a client that sends its body
/// a byte at a time cannot hold a connection and a worker's attention for longer.
pub struct Body(pub Bytes);

impl FromRequest for Body {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Body, ApiError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let config = req.app_data::<BodyConfig>().copied().unwrap_or(BodyConfig {
            max_bytes: 1024 * 1024,
            timeout: Duration::from_secs(30),
        });
        let mut payload = payload.take();
        Box::pin(async move {
            let read = async {
                let mut buf = BytesMut::new();
                while let Some(chunk) = payload.next().await {
                    let chunk = chunk.map_err(|e| {
                        ApiError::BadRequest(format!("the request body could not be read: {e}"))
                    })?;
                    if buf.len() + chunk.len() > config.max_bytes {
                        return Err(ApiError::TooLarge(config.max_bytes));
                    }
                    buf.extend_from_slice(&chunk);
                }
                Ok(buf.freeze())
            };
            match tokio::time::timeout(config.timeout, read).await {
                Ok(body) => body.map(Body),
                Err(_) => Err(ApiError::BodyTimeout(config.timeout)),
            }
        })
    }
}

/// Whether JSON text holds a NUL character: in JSON it can only be the escape `\u0000` (a raw
/// control character is invalid), not itself escaped by a preceding backslash.
fn has_nul_escape(body: &[u8]) -> bool {
    let mut backslashes = 0usize;
    for (i, b) in body.iter().enumerate() {
        if *b == b'\\' {
            backslashes += 1;
            continue;
        }
        if *b == b'u' && backslashes % 2 == 1 && body.get(i + 1..i + 5) == Some(b"0000") {
            return true;
        }
        backslashes = 0;
    }
    false
}

/// Parses a JSON body into `T`; a failure is a 422 whose `loc` walks to the offending value.
pub fn json_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::validation(
            "missing",
            &["body"],
            "a JSON body is required",
        ));
    }
    if has_nul_escape(body) {
        return Err(ApiError::BadRequest(
            "body: a string contains a NUL character (\\u0000), which is not allowed".into(),
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let kind = if inner.is_syntax() || inner.is_eof() {
            "json_invalid"
        } else {
            "value_error"
        };
        let mut loc = vec!["body"];
        if path != "." {
            loc.extend(path.split('.'));
        }
        ApiError::validation(kind, &loc, inner.to_string())
    })?;
    de.end()
        .map_err(|e| ApiError::validation("json_invalid", &["body"], e.to_string()))?;
    Ok(value)
}

/// Parses an optional JSON body: empty (or `null`) is `None`.
pub fn optional_json_body(body: &[u8]) -> Result<Option<serde_json::Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: serde_json::Value = json_body(body)?;
    Ok((!value.is_null()).then_some(value))
}

/// Parses a filter body on tasks within `limits`: its nesting is checked before the
/// (recursive) parse.
pub fn parse_filters(
    body: &serde_json::Value,
    limits: &crate::domain::limits::Limits,
) -> Result<crate::domain::filter::FilterNode, ApiError> {
    parse_filters_on(body, limits, crate::domain::filter::Table::Tasks)
}

/// Parses a filter body on `table` within `limits`.
pub fn parse_filters_on(
    body: &serde_json::Value,
    limits: &crate::domain::limits::Limits,
    table: crate::domain::filter::Table,
) -> Result<crate::domain::filter::FilterNode, ApiError> {
    if let Some(filters) = body.get("filters") {
        limits.check_filter_nesting(filters)?;
    }
    let node = crate::domain::filter::parse_request_on(body, table)?;
    limits.check_filter(&node)?;
    Ok(node)
}

/// Parses a UUID path segment named `name`.
pub fn uuid_path(name: &str, raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|e| {
        ApiError::validation(
            "uuid_parsing",
            &["path", name],
            format!("'{raw}' is not a valid UUID: {e}"),
        )
    })
}

/// The 422 for a query string that does not parse.
pub fn query_error(err: QueryPayloadError, _req: &HttpRequest) -> actix_web::Error {
    let msg = match &err {
        QueryPayloadError::Deserialize(e) => e.to_string(),
        other => other.to_string(),
    };
    ApiError::validation("value_error", &["query"], msg).into()
}

/// Treats `?x=` like an absent parameter, as web forms send empty fields.
pub fn non_empty(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_escape_is_found_and_an_escaped_backslash_is_not_one() {
        assert!(has_nul_escape(br#"{"a": "x\u0000"}"#));
        assert!(has_nul_escape(br#"{"a\u0000": 1}"#));
        assert!(
            !has_nul_escape(br#"{"a": "x\\u0000"}"#),
            "a backslash, then u0000"
        );
        assert!(has_nul_escape(br#"{"a": "x\\\u0000"}"#));
        assert!(has_nul_escape(br#"{"a": "\u00001"}"#));
        assert!(!has_nul_escape(br#"{"a": "\u0001"}"#));
    }
}
