//! Request parsing with errors that name the field: JSON bodies (with the path to the bad
//! value), UUIDs in paths, and query strings.

use actix_web::HttpRequest;
use actix_web::error::QueryPayloadError;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::error::ApiError;

/// Parses a JSON body into `T`; a failure is a 422 whose `loc` walks to the offending value.
pub fn json_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::validation(
            "missing",
            &["body"],
            "a JSON body is required",
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
    v.filter(|s| !s.trim().is_empty())
}
