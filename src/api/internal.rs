//! The route instances forward each other's commands on ([`crate::queue::forward`]): a
//! scheduler's push, pop, patch or cancellation sent by an instance that does not own it. Not
//! part of the public API document; it takes the same bearer tokens as the rest.

use actix_web::{HttpRequest, HttpResponse, web};

use super::auth::authorize;
use super::error::ApiError;
use super::extract::{Body, SchedulerPath, json_body, parse_filters};
use crate::domain::auth::Action;
use crate::queue::forward::{Answer, Forward};
use crate::queue::{Broker, PopFilter, QueueError};

/// `POST /internal/forward/{scheduler_id}`: applies a forwarded command here if this instance
/// owns the scheduler (else 503 inside the answer), and answers the queue's `Result` as it is.
pub async fn forward(
    broker: web::Data<Broker>,
    req: HttpRequest,
    SchedulerPath(s): SchedulerPath,
    body: Body,
) -> Result<HttpResponse, ApiError> {
    let command: Forward = json_body(&body.0)?;
    let action = match &command {
        Forward::Push { .. } | Forward::Cancel { .. } | Forward::Rescore { .. } => Action::Push,
        Forward::Pop { .. } => Action::Pop,
        Forward::Patch { .. } => Action::Patch,
        Forward::Explain { .. } | Forward::Counts => Action::Read,
    };
    authorize(&req, action, Some(s))?;
    let local = broker.local_only();
    let answer = match command {
        Forward::Push { requests } => local.push_many(s, requests).await.map(Answer::Pushed),
        Forward::Pop { limit, filter } => {
            match filter
                .map(|source| {
                    parse_filters(&source, broker.limits()).map(|node| PopFilter { node, source })
                })
                .transpose()
            {
                Ok(filter) => local.pop(s, limit, filter).await.map(Answer::Popped),
                Err(e) => Err(QueueError::BadRequest(e.to_string())),
            }
        }
        Forward::Patch { id, patch } => local.patch(id, patch).await.map(Answer::Patched),
        Forward::Explain { id } => local.wait(s, id).await.map(Answer::Explained),
        Forward::Rescore { scores } => local.rescore(s, scores).await.map(Answer::Rescored),
        Forward::Counts => local.counts(s).await.map(Answer::Counted),
        Forward::Cancel {
            organisation,
            reference,
            plugins,
        } => local
            .cancel_on(s, &organisation, &reference, plugins)
            .await
            .map(Answer::Cancelled),
    };
    Ok(HttpResponse::Ok().json(answer))
}
