//! `/tasks`: listing with filters, one task, status changes, statistics.

use actix_web::{HttpRequest, HttpResponse, get, patch, post, web};
use serde_json::{Map, Value};

use super::auth::{authorize, guarded};
use super::dto::{
    FilterRequest, PaginatedTasks, StatsQuery, TaskListQuery, TaskPatchBody, TaskStats,
};
use super::error::{ApiError, ErrorBody, ValidationBody};
use super::extract::{Body, non_empty, optional_json_body, parse_filters, uuid_path};
use super::paging::{answer, check_texts, page, scheduler_param, time_param};
use super::patch::{self, PatchBody, wrong_type};
use crate::domain::auth::Action;
use crate::domain::limits::Limits;
use crate::domain::query::TaskQuery;
use crate::domain::{SchedulerId, Task, TaskStatus};
use crate::queue::{Broker, TaskPatch};

/// Task keys a PATCH cannot change.
const READ_ONLY_KEYS: [&str; 12] = [
    "id",
    "scheduler_id",
    "schedule_id",
    "organisation",
    "type",
    "hash",
    "data",
    "created_at",
    "modified_at",
    "attempts",
    "lease_expires_at",
    "failure_reason",
];

fn list_query(q: TaskListQuery, body: &[u8], limits: &Limits) -> Result<TaskQuery, ApiError> {
    check_texts(limits, &q)?;
    let (offset, limit) = page(q.offset, q.limit, limits)?;
    let scheduler_id = scheduler_param(q.scheduler_id)?;
    // Lowercase only, as mula's enum parameter (filter values in bodies are case-insensitive).
    let status = non_empty(q.status)
        .map(|s| {
            TaskStatus::ALL
                .into_iter()
                .find(|st| st.as_str() == s)
                .ok_or_else(|| {
                    let known: Vec<&str> = TaskStatus::ALL.iter().map(|s| s.as_str()).collect();
                    ApiError::BadRequest(format!(
                        "status '{s}' is unknown; use one of {}",
                        known.join(", ")
                    ))
                })
        })
        .transpose()?;
    let min_created_at = time_param("min_created_at", q.min_created_at)?;
    let max_created_at = time_param("max_created_at", q.max_created_at)?;
    // A window whose start is after its end is empty, not an error (mula answers 400 for
    // min > max): the API document cannot say that one parameter must not exceed another, and
    // every request it allows is answered.
    let filter = optional_json_body(body)?
        .map(|v| parse_filters(&v, limits))
        .transpose()?;
    Ok(TaskQuery {
        scheduler_id,
        organisation: non_empty(q.organisation),
        task_type: non_empty(q.task_type),
        status,
        min_created_at,
        max_created_at,
        filter,
        offset,
        limit,
    })
}

async fn list(
    broker: &Broker,
    req: &HttpRequest,
    q: TaskListQuery,
    body: &[u8],
) -> Result<HttpResponse, ApiError> {
    let lq = list_query(q, body, broker.limits())?;
    // A listing of one scheduler's tasks is a read of them; across schedulers, a listing.
    match lq.scheduler_id {
        Some(s) => authorize(req, Action::Read, Some(s))?,
        None => authorize(req, Action::List, None)?,
    }
    answer::<PaginatedTasks, _>(req, lq.offset, lq.limit, broker.list_tasks(lq)).await
}

/// Lists tasks, newest first, filtered by the query parameters.
#[utoipa::path(
    tag = "tasks",
    params(TaskListQuery),
    responses(
        (status = 200, description = "A page of tasks", body = PaginatedTasks),
        (status = 400, description = "Bad parameter", body = ErrorBody),
        (status = 422, description = "A parameter does not parse", body = ValidationBody)
    )
)]
#[get("/tasks")]
pub async fn list_tasks(
    broker: web::Data<Broker>,
    req: HttpRequest,
    query: web::Query<TaskListQuery>,
) -> Result<HttpResponse, ApiError> {
    // mula reads filters from a GET's body too; answering every task while a filter was sent
    // would be a wrong answer given as a right one.
    let headers = req.headers();
    let sized = headers
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0);
    if sized || headers.contains_key(actix_web::http::header::TRANSFER_ENCODING) {
        return Err(ApiError::BadRequest(
            "GET /tasks does not read a body: send filters with POST /tasks".into(),
        ));
    }
    list(&broker, &req, query.into_inner(), &[]).await
}

/// Lists tasks, newest first, filtered by the query parameters and the body's filters.
#[utoipa::path(
    tag = "tasks",
    params(TaskListQuery),
    request_body(content = Option<FilterRequest>, content_type = "application/json", description = "Optional filters"),
    responses(
        (status = 200, description = "A page of tasks", body = PaginatedTasks),
        (status = 400, description = "Bad parameter or filter", body = ErrorBody),
        (status = 422, description = "The body does not parse", body = ValidationBody)
    )
)]
#[post("/tasks")]
pub async fn search_tasks(
    broker: web::Data<Broker>,
    req: HttpRequest,
    query: web::Query<TaskListQuery>,
    body: Body,
) -> Result<HttpResponse, ApiError> {
    list(&broker, &req, query.into_inner(), &body.0).await
}

/// Task counts per hour and status over the last 24 hours (by `modified_at`).
#[utoipa::path(
    tag = "tasks",
    params(StatsQuery),
    responses((status = 200, description = "Counts per hour, newest hour first", body = TaskStats))
)]
#[get("/tasks/stats")]
pub async fn task_stats(
    broker: web::Data<Broker>,
    req: HttpRequest,
    query: web::Query<StatsQuery>,
) -> Result<HttpResponse, ApiError> {
    let q = query.into_inner();
    match non_empty(q.scheduler_id.clone()).and_then(|s| s.parse::<SchedulerId>().ok()) {
        Some(s) => authorize(&req, Action::Read, Some(s))?,
        None => authorize(&req, Action::List, None)?,
    }
    check_texts(broker.limits(), &q)?;
    let hours = broker
        .task_stats(non_empty(q.scheduler_id), non_empty(q.organisation_id))
        .await?;
    let mut out = Map::new();
    for (hour, counts) in hours {
        out.insert(
            hour,
            serde_json::to_value(counts)
                .map_err(|e| ApiError::Queue(crate::queue::QueueError::Internal(e.to_string())))?,
        );
    }
    Ok(HttpResponse::Ok().json(Value::Object(out)))
}

/// One task.
#[utoipa::path(
    tag = "tasks",
    params(("task_id" = uuid::Uuid, Path, description = "The task id")),
    responses(
        (status = 200, description = "The task", body = Task),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 422, description = "Not a UUID", body = ValidationBody)
    )
)]
#[get("/tasks/{task_id}")]
pub async fn get_task(
    broker: web::Data<Broker>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path("task_id", &path)?;
    let task = broker.get_task(id).await?;
    authorize(&req, Action::Read, Some(task.scheduler_id))?;
    Ok(HttpResponse::Ok().json(task))
}

/// Why a task has its priority: the strategy that ranked it, what it was given and the terms
/// that gave the priority; or `client` for a priority a client pushed or patched.
#[utoipa::path(
    tag = "tasks",
    params(("task_id" = uuid::Uuid, Path, description = "The task id")),
    responses(
        (status = 200, description = "The explanation", body = crate::scoring::Explanation),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 422, description = "Not a UUID", body = ValidationBody)
    )
)]
#[get("/tasks/{task_id}/explain")]
pub async fn explain_task(
    broker: web::Data<Broker>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = uuid_path("task_id", &path)?;
    let task = broker.get_task(id).await?;
    authorize(&req, Action::Read, Some(task.scheduler_id))?;
    Ok(HttpResponse::Ok().json(broker.explain(id).await?))
}

/// `status` and `priority`; unknown keys are ignored, as mula does, and read-only ones are named
/// when nothing else was sent.
impl PatchBody for TaskPatch {
    fn take(&mut self, key: &str, value: &Value) -> Result<bool, ApiError> {
        match key {
            "status" => {
                let status = value
                    .as_str()
                    .and_then(|s| s.parse::<TaskStatus>().ok())
                    .ok_or_else(|| {
                        let known: Vec<&str> = TaskStatus::ALL.iter().map(|s| s.as_str()).collect();
                        let known = known.join(", ");
                        wrong_type(
                            "enum",
                            key,
                            format!("{value} is not a status; use one of {known}"),
                        )
                    })?;
                self.status = Some(status);
            }
            "priority" => match value.as_number().and_then(super::dto::as_integer) {
                Some(0) => {
                    return Err(ApiError::BadRequest(
                        "priority: 0 is not a valid priority (use a non-zero integer)".into(),
                    ));
                }
                Some(p) => self.priority = Some(p),
                None => {
                    return Err(wrong_type(
                        "int_type",
                        key,
                        format!("{value} is not an integer"),
                    ));
                }
            },
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn finish(self, not_taken: Vec<String>) -> Result<Self, ApiError> {
        if self != TaskPatch::default() {
            return Ok(self);
        }
        let read_only: Vec<String> = not_taken
            .into_iter()
            .filter(|k| READ_ONLY_KEYS.contains(&k.as_str()))
            .collect();
        let mut msg = "no data to patch; only 'status' and 'priority' can be changed".to_owned();
        if !read_only.is_empty() {
            msg.push_str(&format!(" (read-only: {})", read_only.join(", ")));
        }
        Err(ApiError::BadRequest(msg))
    }
}

/// Changes a task's status (checked against the state machine) and/or priority.
#[utoipa::path(
    tag = "tasks",
    params(("task_id" = uuid::Uuid, Path, description = "The task id")),
    request_body(content = TaskPatchBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The changed task", body = Task),
        (status = 400, description = "Nothing to patch", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "A transition the state machine forbids", body = ErrorBody),
        (status = 422, description = "Not a UUID, or a bad status", body = ValidationBody),
        (status = 503, description = "Database unavailable", body = ErrorBody)
    )
)]
#[patch("/tasks/{task_id}")]
pub async fn patch_task(
    broker: web::Data<Broker>,
    req: HttpRequest,
    path: web::Path<String>,
    body: Body,
) -> Result<HttpResponse, ApiError> {
    if path.as_str() == "stats" {
        // `/tasks/stats` is another resource, which takes GET only.
        return super::not_found(req).await;
    }
    let id = uuid_path("task_id", &path)?;
    if guarded(&req) {
        let s = broker.task_scheduler(id).await?;
        authorize(&req, Action::Patch, Some(s))?;
    }
    let patch: TaskPatch = patch::read(&body.0)?;
    Ok(HttpResponse::Ok().json(broker.patch(id, patch).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patch_with_only_read_only_keys_says_which() {
        let err = patch::read::<TaskPatch>(br#"{"data": {}, "id": "x"}"#).unwrap_err();
        let ApiError::BadRequest(msg) = err else {
            panic!("expected a bad request")
        };
        assert!(msg.contains("read-only: data, id"), "{msg}");
    }

    #[test]
    fn a_patch_takes_status_and_ignores_unknown_keys() {
        let patch: TaskPatch = patch::read(br#"{"status": "running", "colour": 1}"#).unwrap();
        assert_eq!(patch.status, Some(TaskStatus::Running));
    }
}
