//! The REST API: actix-web handlers (thin: parse, call the queue, shape the answer), the error
//! mapping, and the OpenAPI document generated from the handlers' annotations.

pub mod auth;
pub mod contract;
pub mod dto;
pub mod error;
pub mod extract;
pub mod health;
pub mod internal;
pub mod metrics;
pub mod observed;
pub mod paging;
pub mod patch;
pub mod schedulers;
pub mod schedules;
pub mod tasks;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::{App, HttpResponse, web};
use utoipa::OpenApi;
use utoipa_actix_web::AppExt;
use utoipa_actix_web::service_config::ServiceConfig;
use utoipa_swagger_ui::SwaggerUi;

use crate::domain::limits::Limits;
use crate::queue::Broker;
use error::ApiError;

/// Where the OpenAPI document is served.
pub const OPENAPI_PATH: &str = "/openapi.json";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "kat-scheduler",
        description = "Priority-queue job broker for OpenKAT-style scanning workers; wire-compatible with OpenKAT's scheduler (mula) API."
    ),
    tags(
        (name = "schedulers", description = "The boefje, normalizer and report schedulers: push and pop"),
        (name = "tasks", description = "Tasks: listing, status changes, statistics"),
        (name = "schedules", description = "Schedules: recurring work, by cron expression or deadline"),
        (name = "health", description = "Health and metrics")
    )
)]
struct ApiDoc;

/// Registers every endpoint. actix tries them in this order, so the hot paths (pop, push,
/// patch) come first; where paths overlap, `/tasks/stats` must precede `/tasks/{task_id}`.
pub fn routes(cfg: &mut ServiceConfig) {
    cfg.service(schedulers::pop)
        .service(schedulers::push)
        .service(tasks::patch_task)
        .service(health::root)
        .service(health::livez)
        .service(health::health)
        .service(metrics::metrics)
        .service(schedulers::list_schedulers)
        .service(schedulers::get_scheduler)
        .service(tasks::task_stats)
        .service(tasks::list_tasks)
        .service(tasks::search_tasks)
        .service(tasks::get_task)
        .service(tasks::explain_task)
        .service(schedules::list_schedules)
        .service(schedules::create_schedule)
        .service(schedules::search_schedules)
        .service(schedules::get_schedule)
        .service(schedules::schedule_history)
        .service(schedules::patch_schedule)
        .service(schedules::delete_schedule);
}

/// The OpenAPI document of this build, stating `limits`: the handlers' annotations completed by
/// [`contract::apply`] with what they cannot say. It is JSON rather than utoipa's model, which
/// has no room for some of JSON Schema's keywords (`not`, `const`, `propertyNames`).
pub fn openapi_for(limits: &Limits) -> Result<serde_json::Value, serde_json::Error> {
    let (_, generated) = App::new()
        .into_utoipa_app()
        .openapi(ApiDoc::openapi())
        .configure(routes)
        .split_for_parts();
    let mut doc = serde_json::to_value(&generated)?;
    contract::apply(&mut doc, limits);
    Ok(doc)
}

/// The OpenAPI document with the default limits, as the pretty JSON committed in
/// `openapi/openapi.json`.
pub fn openapi_json() -> Result<String, serde_json::Error> {
    openapi_json_for(&Limits::default())
}

/// The OpenAPI document stating `limits`, as pretty JSON: what `kat-scheduler openapi` prints
/// and `/openapi.json` serves under the same configuration.
pub fn openapi_json_for(limits: &Limits) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(&openapi_for(limits)?).map(|mut s| {
        s.push('\n');
        s
    })
}

/// Serves the document this server keeps to.
async fn openapi_document(doc: web::Data<OpenApiDocument>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(doc.0.clone())
}

/// The served OpenAPI document, rendered once.
struct OpenApiDocument(String);

/// The paths the API serves, with the methods each takes: a request for one of them with another
/// method is a 405 naming the allowed ones, anything else a 404.
const PATHS: [(&[&str], &str); 17] = [
    (&[""], "GET"),
    (&["livez"], "GET"),
    (&["health"], "GET"),
    (&["metrics"], "GET"),
    (&["openapi.json"], "GET"),
    (&["schedulers"], "GET"),
    (&["schedulers", "*"], "GET"),
    (&["schedulers", "*", "push"], "POST"),
    (&["schedulers", "*", "pop"], "POST"),
    (&["tasks"], "GET, POST"),
    (&["tasks", "stats"], "GET"),
    (&["tasks", "*"], "GET, PATCH"),
    (&["tasks", "*", "explain"], "GET"),
    (&["schedules"], "GET, POST"),
    (&["schedules", "search"], "POST"),
    (&["schedules", "*"], "GET, PATCH, DELETE"),
    (&["schedules", "*", "history"], "GET"),
];

/// The answer to a path no handler serves with this method: 405 naming the methods the path
/// takes, else 404.
pub async fn not_found(req: actix_web::HttpRequest) -> Result<HttpResponse, ApiError> {
    let segments: Vec<&str> = req.path().trim_matches('/').split('/').collect();
    let allowed = PATHS.iter().find(|(pattern, _)| {
        pattern.len() == segments.len()
            && pattern
                .iter()
                .zip(&segments)
                .all(|(p, s)| *p == "*" || p == s)
    });
    match allowed {
        Some((_, methods)) => Ok(HttpResponse::MethodNotAllowed()
            .insert_header((actix_web::http::header::ALLOW, *methods))
            .json(error::ErrorBody {
                detail: "Method Not Allowed".to_owned(),
            })),
        None => Err(ApiError::Routing(StatusCode::NOT_FOUND, "Not Found")),
    }
}

/// The whole application for one HTTP worker.
pub fn app(
    broker: Broker,
    body: extract::BodyConfig,
    tokens: std::sync::Arc<crate::domain::auth::Tokens>,
    observed: std::sync::Arc<observed::Observed>,
    schedules: crate::schedules::Schedules,
    linker: crate::planner::PushLinker,
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let limits = *broker.limits();
    let document = OpenApiDocument(
        openapi_for(broker.limits())
            .map(|d| d.to_string())
            .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}")),
    );
    let (app, _) = App::new()
        .into_utoipa_app()
        .openapi(ApiDoc::openapi())
        .app_data(web::Data::new(broker))
        .app_data(web::PayloadConfig::new(body.max_bytes))
        .app_data(body)
        .app_data(tokens)
        .app_data(web::Data::new(observed))
        .app_data(web::Data::new(limits))
        .app_data(web::Data::new(schedules))
        .app_data(web::Data::new(linker))
        .app_data(web::QueryConfig::default().error_handler(extract::query_error))
        .configure(routes)
        .split_for_parts();
    app.service(web::redirect("/docs", "/docs/"))
        .app_data(web::Data::new(document))
        .route(OPENAPI_PATH, web::get().to(openapi_document))
        .route(
            &format!("{}/{{scheduler_id}}", crate::queue::forward::FORWARD_PATH),
            web::post().to(internal::forward),
        )
        .service(
            SwaggerUi::new("/docs/{_:.*}").config(utoipa_swagger_ui::Config::from(OPENAPI_PATH)),
        )
        .default_service(web::to(not_found))
        .wrap(actix_web::middleware::from_fn(auth::authenticate))
        .wrap(actix_web::middleware::from_fn(refuse_nul))
        .wrap(actix_web::middleware::from_fn(log_request))
}

/// Refuses a request whose path or query string holds a NUL character (`%00`): PostgreSQL
/// cannot store or compare one, so both databases are spared it alike.
async fn refuse_nul(
    req: ServiceRequest,
    next: actix_web::middleware::Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<actix_web::body::EitherBody<impl MessageBody>>, actix_web::Error> {
    let uri = req.uri().to_string();
    if uri.contains('\0') || uri.to_ascii_lowercase().contains("%00") {
        let err = ApiError::BadRequest(
            "the request's path or query contains a NUL character (%00), which is not allowed"
                .into(),
        );
        let resp = actix_web::ResponseError::error_response(&err);
        return Ok(req.into_response(resp).map_into_right_body());
    }
    Ok(next.call(req).await?.map_into_left_body())
}

/// Logs each request once: at debug normally, at warn for server errors. Never bodies. Counts
/// each answer by status class for `/metrics`.
async fn log_request(
    req: ServiceRequest,
    next: actix_web::middleware::Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = std::time::Instant::now();
    let method = req.method().clone();
    let path = req.path().to_owned();
    let metrics = req
        .app_data::<web::Data<Broker>>()
        .map(|b| b.metrics().clone());
    let res = next.call(req).await?;
    let status = res.status().as_u16();
    if let Some(m) = metrics {
        m.http_response(status);
    }
    let duration_us = started.elapsed().as_micros() as u64;
    if status >= 500 {
        tracing::warn!(http.method = %method, http.path = %path, http.status = status, duration_us, "request failed");
    } else {
        tracing::debug!(http.method = %method, http.path = %path, http.status = status, duration_us, "request");
    }
    Ok(res)
}
