//! `/schedules`: mula's schedules API (list, create, read, change, delete, search), as Rocky
//! calls it for report schedules and its plugin pages; and each schedule's history, the fire
//! ledger's page of it (`/schedules/{id}/history`, not mula's).

use actix_web::{HttpRequest, HttpResponse, delete, get, patch, post, web};
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::auth::authorize;
use super::dto::{
    FilterRequest, PageQuery, PaginatedFires, PaginatedSchedules, ScheduleCreate,
    ScheduleListQuery, SchedulePatchBody,
};
use super::error::{ApiError, ErrorBody, ValidationBody};
use super::extract::{Body, json_body, non_empty};
use super::paging::{answer, check_texts, page, scheduler_param, time_param};
use super::patch::{self, PatchBody, wrong_type};
use crate::domain::SchedulerId;
use crate::domain::auth::Action;
use crate::domain::filter::{Table, parse_datetime};
use crate::domain::limits::Limits;
use crate::domain::schedule::Schedule;
use crate::schedules::{NewSchedule, SchedulePatch, Schedules};
use crate::storage::schedules::ScheduleQuery;

fn list_query(q: ScheduleListQuery, limits: &Limits) -> Result<ScheduleQuery, ApiError> {
    check_texts(limits, &q)?;
    let (offset, limit) = page(q.offset, q.limit, limits)?;
    let scheduler_id = scheduler_param(q.scheduler_id)?;
    let enabled = non_empty(q.enabled)
        .map(|e| match e.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(ApiError::validation(
                "bool_parsing",
                &["query", "enabled"],
                format!("'{e}' is not a boolean; use true or false"),
            )),
        })
        .transpose()?;
    // As for tasks: a window whose start is after its end is empty, not an error.
    Ok(ScheduleQuery {
        scheduler_id,
        organisation: non_empty(q.organisation),
        hash: non_empty(q.schedule_hash),
        enabled,
        min_deadline_at: time_param("min_deadline_at", q.min_deadline_at)?,
        max_deadline_at: time_param("max_deadline_at", q.max_deadline_at)?,
        min_created_at: time_param("min_created_at", q.min_created_at)?,
        max_created_at: time_param("max_created_at", q.max_created_at)?,
        filter: None,
        offset,
        limit,
    })
}

/// A `deadline_at` of a body (422 naming it when it does not parse).
fn deadline(d: &str) -> Result<DateTime<Utc>, ApiError> {
    parse_datetime(d).map(|t| t.and_utc()).ok_or_else(|| {
        wrong_type(
            "datetime_parsing",
            "deadline_at",
            format!("'{d}' is not an ISO 8601 date-time or date"),
        )
    })
}

/// Lists schedules, newest first, filtered by the query parameters.
#[utoipa::path(
    tag = "schedules",
    params(ScheduleListQuery),
    responses(
        (status = 200, description = "A page of schedules", body = PaginatedSchedules),
        (status = 400, description = "Bad parameter", body = ErrorBody)
    )
)]
#[get("/schedules")]
pub async fn list_schedules(
    schedules: web::Data<Schedules>,
    limits: web::Data<Limits>,
    req: HttpRequest,
    query: web::Query<ScheduleListQuery>,
) -> Result<HttpResponse, ApiError> {
    let lq = list_query(query.into_inner(), &limits)?;
    authorize(&req, Action::Schedules, lq.scheduler_id)?;
    answer::<PaginatedSchedules, _>(&req, lq.offset, lq.limit, schedules.list(lq)).await
}

/// Lists schedules matching the body's filters, newest first.
#[utoipa::path(
    tag = "schedules",
    params(PageQuery),
    request_body(content = FilterRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "A page of schedules", body = PaginatedSchedules),
        (status = 400, description = "Bad parameter or filter", body = ErrorBody),
        (status = 422, description = "No body, or one that does not parse", body = ValidationBody)
    )
)]
#[post("/schedules/search")]
pub async fn search_schedules(
    schedules: web::Data<Schedules>,
    limits: web::Data<Limits>,
    req: HttpRequest,
    query: web::Query<PageQuery>,
    body: Body,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, Action::Schedules, None)?;
    let q = query.into_inner();
    let (offset, limit) = page(q.offset, q.limit, &limits)?;
    let value: Value = json_body(&body.0)?;
    let filter = super::extract::parse_filters_on(&value, &limits, Table::Schedules)?;
    let lq = ScheduleQuery {
        filter: Some(filter),
        offset,
        limit,
        ..ScheduleQuery::default()
    };
    answer::<PaginatedSchedules, _>(&req, lq.offset, lq.limit, schedules.list(lq)).await
}

/// Creates a schedule: its hash is its data's (unique); without `deadline_at`, the next fire of
/// `schedule` is its first deadline.
#[utoipa::path(
    tag = "schedules",
    request_body(content = ScheduleCreate, content_type = "application/json"),
    responses(
        (status = 201, description = "The schedule", body = Schedule),
        (status = 400, description = "No schedule nor deadline, a bad cron expression, an unknown scheduler or data that does not fit it", body = ErrorBody),
        (status = 409, description = "A schedule with the same hash exists", body = ErrorBody),
        (status = 422, description = "The body does not parse", body = ValidationBody)
    )
)]
#[post("/schedules")]
pub async fn create_schedule(
    schedules: web::Data<Schedules>,
    req: HttpRequest,
    body: Body,
) -> Result<HttpResponse, ApiError> {
    let create: ScheduleCreate = json_body(&body.0)?;
    let scheduler = create.scheduler_id.parse::<SchedulerId>().ok();
    authorize(&req, Action::Schedules, scheduler)?;
    let deadline_at = create.deadline_at.as_deref().map(deadline).transpose()?;
    let schedule = schedules
        .create(NewSchedule {
            scheduler_id: create.scheduler_id,
            organisation: create.organisation,
            data: create.data,
            schedule: create.schedule,
            deadline_at,
        })
        .await?;
    Ok(HttpResponse::Created().json(schedule))
}

/// One schedule.
#[utoipa::path(
    tag = "schedules",
    params(("id" = uuid::Uuid, Path, description = "The schedule id")),
    responses(
        (status = 200, description = "The schedule", body = Schedule),
        (status = 404, description = "No such schedule (or not a UUID)", body = ErrorBody),
        (status = 405, description = "The id is `search`: that path is the search, which takes only POST", body = ErrorBody)
    )
)]
#[get("/schedules/{id}")]
pub async fn get_schedule(
    schedules: web::Data<Schedules>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = schedule_id(&path)?;
    let schedule = schedules.get(id).await?;
    authorize(&req, Action::Schedules, Some(schedule.scheduler_id))?;
    Ok(HttpResponse::Ok().json(schedule))
}

/// The schedule id of a path, a UUID as the document declares it. `search` is the search's own
/// path, which takes only POST: OpenAPI matches a concrete path before a templated one, so any
/// other method there is a 405. Other text names no schedule: 404, not mula's 422, since a
/// task's `schedule_id` of null, followed as a link (schemathesis' stateful phase does), is
/// `/schedules/None`, and no schedule is a fault of the request's shape.
fn schedule_id(raw: &str) -> Result<uuid::Uuid, ApiError> {
    if raw == "search" {
        return Err(ApiError::MethodNotAllowed("POST"));
    }
    uuid::Uuid::parse_str(raw).map_err(|_| not_a_uuid())
}

/// A path's schedule id that is not a UUID: it names no schedule (404).
fn not_a_uuid() -> ApiError {
    ApiError::Routing(
        actix_web::http::StatusCode::NOT_FOUND,
        "Resource not found: schedule not found; the id is not a UUID",
    )
}

/// A string or null (422 naming `key` otherwise).
fn text_or_null(key: &str, value: &Value) -> Result<Option<String>, ApiError> {
    match value {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s.clone())),
        other => Err(wrong_type(
            "string_type",
            key,
            format!("{other} is not a string or null"),
        )),
    }
}

/// `data`, `enabled`, `schedule`, `deadline_at`; other keys are ignored, as mula does (the hash
/// follows the data).
impl PatchBody for SchedulePatch {
    fn take(&mut self, key: &str, value: &Value) -> Result<bool, ApiError> {
        match (key, value) {
            ("data", Value::Object(map)) => self.data = Some(map.clone()),
            ("data", other) => {
                return Err(wrong_type(
                    "dict_type",
                    key,
                    format!("{other} is not an object"),
                ));
            }
            ("enabled", Value::Bool(b)) => self.enabled = Some(*b),
            ("enabled", other) => {
                return Err(wrong_type(
                    "bool_type",
                    key,
                    format!("{other} is not a boolean"),
                ));
            }
            ("schedule", _) => self.schedule = Some(text_or_null(key, value)?),
            ("deadline_at", _) => {
                let d = text_or_null(key, value)?;
                self.deadline_at = Some(d.as_deref().map(deadline).transpose()?);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Changes a schedule: `data` (its hash follows), `enabled`, `schedule` (the deadline is not
/// recomputed), `deadline_at` (set it to now to run the schedule at the next tick).
#[utoipa::path(
    tag = "schedules",
    params(("id" = uuid::Uuid, Path, description = "The schedule id")),
    request_body(content = SchedulePatchBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The changed schedule", body = Schedule),
        (status = 400, description = "Nothing to patch, or a bad cron expression", body = ErrorBody),
        (status = 404, description = "No such schedule (or not a UUID)", body = ErrorBody),
        (status = 405, description = "The id is `search`: that path is the search, which takes only POST", body = ErrorBody),
        (status = 409, description = "Its new data's hash belongs to another schedule", body = ErrorBody),
        (status = 422, description = "A field of the wrong type", body = ValidationBody)
    )
)]
#[patch("/schedules/{id}")]
pub async fn patch_schedule(
    schedules: web::Data<Schedules>,
    req: HttpRequest,
    path: web::Path<String>,
    body: Body,
) -> Result<HttpResponse, ApiError> {
    let id = schedule_id(&path)?;
    let patch: SchedulePatch = patch::read(&body.0)?;
    let current = schedules.get(id).await?;
    authorize(&req, Action::Schedules, Some(current.scheduler_id))?;
    Ok(HttpResponse::Ok().json(schedules.patch(id, patch).await?))
}

/// Deletes a schedule (204 also when there is none, as mula); its tasks stay, unlinked.
#[utoipa::path(
    tag = "schedules",
    params(("id" = uuid::Uuid, Path, description = "The schedule id")),
    responses(
        (status = 204, description = "Deleted (or there was none)"),
        (status = 404, description = "Not a UUID", body = ErrorBody),
        (status = 405, description = "The id is `search`: that path is the search, which takes only POST", body = ErrorBody)
    )
)]
#[delete("/schedules/{id}")]
pub async fn delete_schedule(
    schedules: web::Data<Schedules>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = schedule_id(&path)?;
    match schedules.get(id).await {
        Ok(s) => authorize(&req, Action::Schedules, Some(s.scheduler_id))?,
        Err(crate::schedules::ScheduleError::NotFound(_)) => {
            authorize(&req, Action::Schedules, None)?;
        }
        Err(e) => return Err(e.into()),
    }
    schedules.delete(id).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// A schedule's due fires, newest due first: each fired (with its task), skipped (with the
/// reason, and the task in its way) or waiting (with what it waits for), when it was decided and
/// how late. Kept `SCHEDULER_SCHEDULE_HISTORY_DAYS`.
#[utoipa::path(
    tag = "schedules",
    params(("id" = uuid::Uuid, Path, description = "The schedule id"), PageQuery),
    responses(
        (status = 200, description = "A page of the schedule's fires", body = PaginatedFires),
        (status = 404, description = "No such schedule (or not a UUID)", body = ErrorBody)
    )
)]
#[get("/schedules/{id}/history")]
pub async fn schedule_history(
    schedules: web::Data<Schedules>,
    limits: web::Data<Limits>,
    req: HttpRequest,
    path: web::Path<String>,
    query: web::Query<PageQuery>,
) -> Result<HttpResponse, ApiError> {
    // `search` is no id here either: the search has no history.
    let id = uuid::Uuid::parse_str(&path).map_err(|_| not_a_uuid())?;
    let q = query.into_inner();
    let (offset, limit) = page(q.offset, q.limit, &limits)?;
    let schedule = schedules.get(id).await?;
    authorize(&req, Action::Schedules, Some(schedule.scheduler_id))?;
    answer::<PaginatedFires, _>(&req, offset, limit, schedules.history(id, offset, limit)).await
}
