//! Optional bearer tokens at the edge: [`authenticate`] finds the token's grant (401 without a
//! valid one) for every path but the open ones (`/`, `/livez`, `/health`, `/metrics`, the API
//! document and its UI), and [`authorize`] checks an action against it (403 out of scope).
//! With no token configured both let everything through.

use std::sync::Arc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, HttpRequest, ResponseError};

use super::error::ApiError;
use crate::domain::SchedulerId;
use crate::domain::auth::{Action, Grant, Tokens};

/// Paths anyone may read: probes, metrics and the API document.
fn open(path: &str) -> bool {
    matches!(path, "/" | "/livez" | "/health" | "/metrics")
        || path == super::OPENAPI_PATH
        || path == "/docs"
        || path.starts_with("/docs/")
}

/// Middleware: attaches the grant of the request's bearer token, or answers 401.
pub async fn authenticate(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let tokens = req.app_data::<Arc<Tokens>>().cloned();
    let Some(tokens) = tokens.filter(|t| t.enabled()) else {
        return Ok(next.call(req).await?.map_into_left_body());
    };
    if !open(req.path()) {
        let presented = req
            .headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        match presented.and_then(|secret| tokens.grant(secret)) {
            Some(grant) => {
                req.extensions_mut().insert(grant.clone());
            }
            None => {
                let resp = ApiError::Unauthorized.error_response();
                return Ok(req.into_response(resp).map_into_right_body());
            }
        }
    }
    Ok(next.call(req).await?.map_into_left_body())
}

/// Checks that the request's token allows `action` on `scheduler` (always, with no tokens).
pub fn authorize(
    req: &HttpRequest,
    action: Action,
    scheduler: Option<SchedulerId>,
) -> Result<(), ApiError> {
    match req.extensions().get::<Grant>() {
        None => Ok(()),
        Some(grant) if grant.allows(action, scheduler) => Ok(()),
        Some(grant) => Err(ApiError::Forbidden(format!(
            "the token '{}' does not allow this on {}",
            grant.name,
            scheduler.map_or("all schedulers".to_owned(), |s| format!("scheduler '{s}'"))
        ))),
    }
}

/// Whether the request carries a grant (tokens are configured).
pub fn guarded(req: &HttpRequest) -> bool {
    req.extensions().get::<Grant>().is_some()
}
