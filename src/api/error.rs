//! The one place errors become HTTP responses, with mula's status codes and bodies:
//! `{"detail": "<prefix>: <message>"}` for the service's own errors and FastAPI's
//! `{"detail": [{type, loc, msg}]}` with 422 for requests that do not parse.

use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::filter::FilterError;
use crate::domain::limits::LimitError;
use crate::queue::QueueError;
use crate::schedules::ScheduleError;

/// Seconds mula tells a client to wait after a 409.
const CONFLICT_RETRY_AFTER_SECS: u64 = 60;

/// The body of every non-422 error.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong, prefixed with the error class as mula does.
    pub detail: String,
}

/// One problem with a request that does not parse (422).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ValidationIssue {
    /// A short machine-readable kind (`json_invalid`, `missing`, `uuid_parsing`, …).
    #[serde(rename = "type")]
    pub kind: String,
    /// Where: `["body", "data", "boefje"]`, `["path", "task_id"]`, `["query", "limit"]`.
    pub loc: Vec<String>,
    /// What is wrong.
    pub msg: String,
}

/// The 422 body.
#[derive(Debug, Serialize, ToSchema)]
pub struct ValidationBody {
    /// The problems found.
    pub detail: Vec<ValidationIssue>,
}

/// An error on its way to the client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// An error of the queue layer.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// An error of the schedules layer.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// A request that does not parse (422).
    #[error("{0:?}")]
    Validation(ValidationIssue),
    /// A filter that cannot be understood (400).
    #[error("{0}")]
    Filter(#[from] FilterError),
    /// Any other bad request (400).
    #[error("{0}")]
    BadRequest(String),
    /// An input beyond a configured limit, or holding a NUL character (400).
    #[error("{0}")]
    Limit(#[from] LimitError),
    /// A body larger than `api.max_body_bytes` (413).
    #[error("the request body is larger than the limit of {0} bytes (max_body_bytes)")]
    TooLarge(usize),
    /// No valid bearer token, while tokens are configured (401).
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// A token that does not allow this (403).
    #[error("{0}")]
    Forbidden(String),
    /// A body not received in full within `api.body_timeout_secs` (408).
    #[error("the request body was not received within {} s (body_timeout_secs)", .0.as_secs())]
    BodyTimeout(std::time::Duration),
    /// A path served with other methods only (405, with `Allow`).
    #[error("Method Not Allowed")]
    MethodNotAllowed(&'static str),
    /// Rejected before reaching a handler: unknown route (404) or wrong method (405).
    #[error("{1}")]
    Routing(StatusCode, &'static str),
    /// A push shed before it was applied (it waited for the engine longer than
    /// `queue.shed_after_secs`): 429, not the 503 other requests get. The webapp reports a 429
    /// to its user ("too many requests") and takes any 5xx for success, so a user's scan
    /// answered 503 would be lost without a word.
    #[error("the scheduler is busy; retry shortly")]
    PushShed,
}

impl ApiError {
    /// A push's error as its answer: see [`ApiError::PushShed`].
    pub fn of_push(e: QueueError) -> Self {
        match e {
            QueueError::Busy => Self::PushShed,
            e => Self::Queue(e),
        }
    }
}

impl ApiError {
    /// A 422 at `loc` (e.g. `["query", "limit"]`).
    pub fn validation(kind: &str, loc: &[&str], msg: impl Into<String>) -> Self {
        Self::Validation(ValidationIssue {
            kind: kind.to_owned(),
            loc: loc.iter().map(|s| (*s).to_owned()).collect(),
            msg: msg.into(),
        })
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            Self::Queue(QueueError::Duplicate { .. }) => Some(CONFLICT_RETRY_AFTER_SECS),
            Self::Queue(QueueError::QueueFull(_) | QueueError::Unavailable(_)) => {
                Some(crate::queue::DEFAULT_RETRY_AFTER_SECS)
            }
            Self::Queue(QueueError::Busy | QueueError::Moving(_)) | Self::PushShed => Some(1),
            Self::Schedule(ScheduleError::Duplicate(_)) => Some(CONFLICT_RETRY_AFTER_SECS),
            Self::Schedule(ScheduleError::Unavailable(_)) => {
                Some(crate::queue::DEFAULT_RETRY_AFTER_SECS)
            }
            _ => None,
        }
    }

    fn detail(&self) -> String {
        match self {
            Self::Queue(e) => match e {
                QueueError::UnknownScheduler(_) | QueueError::TaskNotFound(_) => {
                    format!("Resource not found: {e}")
                }
                QueueError::BadRequest(_) | QueueError::Malformed(_) => {
                    format!("Bad request error occurred: {e}")
                }
                QueueError::Duplicate { .. }
                | QueueError::InFlight { .. }
                | QueueError::IllegalTransition(_)
                | QueueError::Conflict(_) => format!("Conflict error occurred: {e}"),
                QueueError::QueueFull(_) => format!("Too many requests: {e}"),
                QueueError::Busy | QueueError::Unavailable(_) | QueueError::Moving(_) => {
                    format!("Service unavailable: {e}")
                }
                // The cause is logged; the client gets no internals.
                QueueError::Internal(_) => "Internal server error".to_owned(),
            },
            Self::Schedule(e) => match e {
                ScheduleError::NotFound(_) => format!("Resource not found: {e}"),
                ScheduleError::BadRequest(_) => format!("Bad request error occurred: {e}"),
                ScheduleError::Invalid(_) => format!("Validation error occurred: {e}"),
                ScheduleError::Duplicate(_) => format!("Conflict error occurred: {e}"),
                ScheduleError::Unavailable(_) => format!("Service unavailable: {e}"),
                ScheduleError::Internal(_) => "Internal server error".to_owned(),
            },
            Self::Filter(e) => format!("Bad request error occurred: invalid filter: {e}"),
            Self::BadRequest(m) => format!("Bad request error occurred: {m}"),
            Self::Limit(e) => format!("Bad request error occurred: {e}"),
            Self::TooLarge(_) | Self::BodyTimeout(_) => self.to_string(),
            Self::PushShed => format!("Too many requests: {self}"),
            Self::Unauthorized => format!("Not authenticated: {self}"),
            Self::Forbidden(m) => format!("Forbidden: {m}"),
            Self::Routing(_, m) => (*m).to_owned(),
            Self::MethodNotAllowed(_) => self.to_string(),
            Self::Validation(_) => String::new(),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::Queue(e) => match e {
                QueueError::UnknownScheduler(_) | QueueError::TaskNotFound(_) => {
                    StatusCode::NOT_FOUND
                }
                QueueError::BadRequest(_) | QueueError::Malformed(_) => StatusCode::BAD_REQUEST,
                QueueError::Duplicate { .. }
                | QueueError::InFlight { .. }
                | QueueError::IllegalTransition(_)
                | QueueError::Conflict(_) => StatusCode::CONFLICT,
                QueueError::QueueFull(_) => StatusCode::TOO_MANY_REQUESTS,
                QueueError::Busy | QueueError::Unavailable(_) | QueueError::Moving(_) => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                QueueError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            },
            Self::Schedule(e) => match e {
                ScheduleError::NotFound(_) => StatusCode::NOT_FOUND,
                ScheduleError::BadRequest(_) | ScheduleError::Invalid(_) => StatusCode::BAD_REQUEST,
                ScheduleError::Duplicate(_) => StatusCode::CONFLICT,
                ScheduleError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
                ScheduleError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            },
            Self::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Filter(_) | Self::BadRequest(_) | Self::Limit(_) => StatusCode::BAD_REQUEST,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::PushShed => StatusCode::TOO_MANY_REQUESTS,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Routing(status, _) => *status,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        if let Self::Queue(QueueError::Internal(cause))
        | Self::Schedule(ScheduleError::Internal(cause)) = self
        {
            tracing::error!(error = %cause, "internal error answered with 500");
        }
        let mut resp = HttpResponse::build(status);
        if let Some(secs) = self.retry_after()
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            resp.insert_header((header::RETRY_AFTER, v));
        }
        if let Self::MethodNotAllowed(allow) = self {
            resp.insert_header((header::ALLOW, *allow));
        }
        if matches!(self, Self::Unauthorized) {
            resp.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
        }
        match self {
            Self::Validation(issue) => resp.json(ValidationBody {
                detail: vec![issue.clone()],
            }),
            _ => resp.json(ErrorBody {
                detail: self.detail(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shed_push_is_a_429_the_webapp_reports_and_other_shed_requests_a_503() {
        let shed = ApiError::of_push(QueueError::Busy);
        assert_eq!(shed.status_code(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(shed.retry_after(), Some(1));
        assert_eq!(
            shed.detail(),
            "Too many requests: the scheduler is busy; retry shortly"
        );
        assert_eq!(
            ApiError::from(QueueError::Busy).status_code(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let down = ApiError::of_push(QueueError::Unavailable("the database".into()));
        assert_eq!(down.status_code(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
