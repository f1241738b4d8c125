//! `/`, `/livez` and `/health` (readiness, with the components' state and, when asked, the
//! platform's services).

use std::collections::HashMap;
use std::sync::Arc;

use actix_web::{HttpResponse, get, web};
use serde_json::{Value, json};

use super::dto::{Health, HealthQuery, ServiceHealth};
use super::observed::{Observed, within_grace};
use crate::queue::Broker;

/// mula answers `null` at the root.
#[utoipa::path(tag = "health", responses((status = 200, description = "`null`")))]
#[get("/")]
pub async fn root() -> HttpResponse {
    HttpResponse::Ok().json(Value::Null)
}

/// Liveness: the process serves HTTP. Touches nothing else, so it is also the HTTP floor the
/// benchmark compares pops with.
#[utoipa::path(tag = "health", responses((status = 200, description = "The process is up")))]
#[get("/livez")]
pub async fn livez() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(r#"{"status":"ok"}"#)
}

/// Readiness: whether the service can serve its API now: the database answers and takes writes,
/// and every scheduler is owned here or by a live instance (503, naming what is not, otherwise; `/livez`
/// is liveness).
#[utoipa::path(
    tag = "health",
    params(HealthQuery),
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Not ready: the database does not answer or takes no writes, or a scheduler has no owner at the moment", body = Health)
    )
)]
#[get("/health")]
pub async fn health(
    broker: web::Data<Broker>,
    observed: web::Data<Arc<Observed>>,
    query: web::Query<HealthQuery>,
) -> HttpResponse {
    // A database that answers and takes no writes (a standby) serves no push, pop or patch.
    let (reachable, refusing) = broker.database_state().await;
    let db_ok = reachable && refusing.is_none();
    let mut database = json!({"backend": broker.backend().name()});
    if let Some(why) = refusing {
        database["writes"] = Value::String(format!("refused: {why}"));
    }
    let mut results = vec![ServiceHealth {
        service: "database".into(),
        healthy: db_ok,
        version: None,
        additional: database,
        results: Vec::new(),
    }];
    // Ready means every scheduler is served: owned here, or by a live instance its requests
    // are forwarded to. While one changes owner (a takeover, the first ownership round) its
    // requests would get 503, so neither is a readiness probe's traffic sent here.
    let (serving, schedulers) = match broker.ownership() {
        Some(own) => {
            let r = own.readiness();
            let all = r.iter().all(|(_, x)| x.is_ok());
            let detail: serde_json::Map<String, Value> = r
                .iter()
                .map(|(s, x)| {
                    let text = match x {
                        Ok(who) => who.clone(),
                        Err(why) => format!("not served: {why}"),
                    };
                    (s.as_str().to_owned(), Value::String(text))
                })
                .collect();
            (all, Value::Object(detail))
        }
        None => (
            true,
            json!({"boefje": "owned here", "normalizer": "owned here", "report": "owned here"}),
        ),
    };
    results.push(ServiceHealth {
        service: "schedulers".into(),
        healthy: serving,
        version: None,
        additional: schedulers,
        results: Vec::new(),
    });
    // The listener reconnects by itself; while it does the API still serves, so it does not
    // make the service unhealthy, but its state is shown.
    let status = &observed.listener;
    let state = status.state();
    results.push(ServiceHealth {
        service: "listener".into(),
        healthy: state == "consuming" || state == "off",
        version: None,
        additional: json!({"state": state, "queues": status.figures()}),
        results: Vec::new(),
    });
    let catalogue = observed.catalogue.status();
    results.push(ServiceHealth {
        service: "catalogue".into(),
        // Planning goes on with the last known plugins while Katalogus is away: a blip is no
        // fault, minutes are.
        healthy: within_grace(observed.catalogue.failing_for()),
        version: None,
        additional: serde_json::to_value(&catalogue).unwrap_or(Value::Null),
        results: Vec::new(),
    });
    let coldstart = observed.coldstart.figures();
    let octopoes_failing = observed
        .coldstart
        .failing_since()
        .map(|since| observed.clock.now() - since);
    results.push(ServiceHealth {
        service: "coldstart".into(),
        healthy: coldstart.organisations_failed == 0 && within_grace(octopoes_failing),
        version: None,
        additional: serde_json::to_value(&coldstart).unwrap_or(Value::Null),
        results: Vec::new(),
    });
    let externals = if query.externals.unwrap_or(false) {
        observed.externals().await
    } else {
        HashMap::new()
    };
    let ready = db_ok && serving;
    let body = Health {
        service: "scheduler".into(),
        healthy: ready,
        version: env!("CARGO_PKG_VERSION").into(),
        additional: Value::Null,
        results,
        externals,
    };
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}
