//! `/schedulers`: the three schedulers, push and pop.

use actix_web::{HttpRequest, HttpResponse, get, post, web};

use super::auth::authorize;
use super::dto::{FilterRequest, PopQuery, PopResponse, SchedulerOut, TaskPush};
use super::error::{ApiError, ErrorBody, ValidationBody};
use super::extract::{Body, SchedulerPath, json_body, optional_json_body, parse_filters};
use crate::domain::auth::Action;
use crate::domain::{SchedulerId, Task};
use crate::planner::PushLinker;
use crate::queue::{Broker, PopFilter};

/// Most tasks one pop returns.
pub const MAX_POP_LIMIT: i64 = 1000;

/// The schedulers and their queue sizes.
#[utoipa::path(
    tag = "schedulers",
    responses((status = 200, description = "All schedulers", body = [SchedulerOut]))
)]
#[get("/schedulers")]
pub async fn list_schedulers(broker: web::Data<Broker>) -> Result<HttpResponse, ApiError> {
    let mut out = Vec::new();
    for s in SchedulerId::ALL {
        out.push(SchedulerOut::from(broker.scheduler_view(s).await?));
    }
    Ok(HttpResponse::Ok().json(out))
}

/// One scheduler.
#[utoipa::path(
    tag = "schedulers",
    params(("scheduler_id" = String, Path, description = "`boefje`, `normalizer` or `report`")),
    responses(
        (status = 200, description = "The scheduler", body = SchedulerOut),
        (status = 404, description = "No such scheduler", body = ErrorBody)
    )
)]
#[get("/schedulers/{scheduler_id}")]
pub async fn get_scheduler(
    broker: web::Data<Broker>,
    req: HttpRequest,
    SchedulerPath(s): SchedulerPath,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, Action::Read, Some(s))?;
    Ok(HttpResponse::Ok().json(SchedulerOut::from(broker.scheduler_view(s).await?)))
}

/// Pushes a task. A duplicate (same hash, still waiting) with a strictly lower priority number
/// boosts the waiting task (200); otherwise it is a 409. A task id that a worker holds and has
/// not started is put back in the queue (200); a running one's is refused (409), and so is a
/// copy from before the task was handed out again. When the heap is full an automatic push is stored as `pending`, or
/// refused with 429 if the scheduler is configured so.
#[utoipa::path(
    tag = "schedulers",
    params(("scheduler_id" = String, Path, description = "`boefje`, `normalizer` or `report`")),
    request_body(content = TaskPush, content_type = "application/json"),
    responses(
        (status = 201, description = "Created: queued, or pending when the heap is full", body = Task),
        (status = 200, description = "An existing task was boosted or re-queued", body = Task),
        (status = 400, description = "Malformed item or mismatched scheduler", body = ErrorBody),
        (status = 404, description = "No such scheduler", body = ErrorBody),
        (status = 409, description = "Already queued (not boosted), or a finished task", body = ErrorBody),
        (status = 422, description = "The body does not parse", body = ValidationBody),
        (status = 429, description = "Queue full (scheduler set to reject), or the scheduler too busy to take it now (not applied; retry after `Retry-After`)", body = ErrorBody),
        (status = 503, description = "Database unavailable", body = ErrorBody)
    )
)]
#[post("/schedulers/{scheduler_id}/push")]
pub async fn push(
    broker: web::Data<Broker>,
    linker: web::Data<PushLinker>,
    req: HttpRequest,
    SchedulerPath(s): SchedulerPath,
    body: Body,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, Action::Push, Some(s))?;
    let request: TaskPush = json_body(&body.0)?;
    let outcome = linker
        .push(&broker, s, request.into())
        .await
        .map_err(ApiError::of_push)?;
    Ok(if outcome.created {
        HttpResponse::Created().json(outcome.task)
    } else {
        HttpResponse::Ok().json(outcome.task)
    })
}

/// Pops the most urgent tasks (lowest priority, then oldest) of one scheduler, optionally
/// only those matching a filter. They come back `dispatched`, and no other pop gets them.
#[utoipa::path(
    tag = "schedulers",
    params(
        ("scheduler_id" = String, Path, description = "`boefje`, `normalizer` or `report`"),
        PopQuery
    ),
    request_body(content = Option<FilterRequest>, content_type = "application/json", description = "Optional filters"),
    responses(
        (status = 200, description = "The popped tasks; empty when none match", body = PopResponse),
        (status = 400, description = "Bad limit or filter", body = ErrorBody),
        (status = 404, description = "No such scheduler", body = ErrorBody),
        (status = 422, description = "The body does not parse", body = ValidationBody),
        (status = 503, description = "Database unavailable", body = ErrorBody)
    )
)]
#[post("/schedulers/{scheduler_id}/pop")]
pub async fn pop(
    broker: web::Data<Broker>,
    req: HttpRequest,
    SchedulerPath(s): SchedulerPath,
    query: web::Query<PopQuery>,
    body: Body,
) -> Result<HttpResponse, ApiError> {
    authorize(&req, Action::Pop, Some(s))?;
    let limit = query.limit.unwrap_or(1);
    if !(1..=MAX_POP_LIMIT).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "limit must be between 1 and {MAX_POP_LIMIT}, got {limit}"
        )));
    }
    let filter = optional_json_body(&body.0)?
        .map(|source| {
            parse_filters(&source, broker.limits()).map(|node| PopFilter { node, source })
        })
        .transpose()?;
    let results = broker
        .pop(s, usize::try_from(limit).unwrap_or(1), filter)
        .await?;
    Ok(HttpResponse::Ok().json(PopResponse { results }))
}
