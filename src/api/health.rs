//! `/`, `/health` and `/metrics`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use actix_web::{HttpResponse, get, web};
use serde_json::{Value, json};

use super::dto::{Health, HealthQuery, ServiceHealth};
use std::sync::Arc;

use crate::domain::SchedulerId;
use crate::listener::ListenerStatus;
use crate::queue::{Broker, SchedulerSnapshot};

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

/// Whether the service and its database answer (503 when the database does not).
#[utoipa::path(
    tag = "health",
    params(HealthQuery),
    responses(
        (status = 200, description = "Healthy", body = Health),
        (status = 503, description = "The database does not answer", body = Health)
    )
)]
#[get("/health")]
pub async fn health(
    broker: web::Data<Broker>,
    listener: Option<web::Data<Arc<ListenerStatus>>>,
    _query: web::Query<HealthQuery>,
) -> HttpResponse {
    let db_ok = broker.database_ok().await;
    let mut results = vec![ServiceHealth {
        service: "database".into(),
        healthy: db_ok,
        version: None,
        additional: json!({"backend": broker.backend().name()}),
        results: Vec::new(),
    }];
    // The listener reconnects by itself; while it does the API still serves, so it does not
    // make the service unhealthy, but its state is shown.
    if let Some(status) = listener {
        let state = status.state();
        results.push(ServiceHealth {
            service: "listener".into(),
            healthy: state == "consuming" || state == "off",
            version: None,
            additional: json!({"state": state, "queues": status.figures()}),
            results: Vec::new(),
        });
    }
    let body = Health {
        service: "scheduler".into(),
        healthy: db_ok,
        version: env!("CARGO_PKG_VERSION").into(),
        additional: Value::Null,
        results,
        // No platform service clients are configured in this version.
        externals: HashMap::new(),
    };
    if db_ok {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// Prometheus metrics: per scheduler the heap size, its bound and the pending backlog.
#[utoipa::path(
    tag = "health",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain"))
)]
#[get("/metrics")]
pub async fn metrics(broker: web::Data<Broker>) -> HttpResponse {
    let snapshots = broker.schedulers();
    let mut out = String::new();
    type Gauge = (&'static str, &'static str, fn(&SchedulerSnapshot) -> u64);
    let gauges: [Gauge; 3] = [
        (
            "scheduler_qsize",
            "Tasks queued in the scheduler's heap.",
            |s| s.qsize,
        ),
        (
            "scheduler_pending",
            "Tasks waiting outside the full heap.",
            |s| s.pending,
        ),
        (
            "scheduler_maxsize",
            "The bound of the scheduler's heap.",
            |s| s.maxsize as u64,
        ),
    ];
    for (name, help, get) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for s in &snapshots {
            let _ = writeln!(out, "{name}{{scheduler_id=\"{}\"}} {}", s.id, get(s));
        }
    }
    let e = broker.engine_counters();
    let counters: [(&str, &str, u64); 7] = [
        (
            "scheduler_engine_batches_total",
            "Transactions the queue engine committed.",
            e.batches.load(Ordering::Relaxed),
        ),
        (
            "scheduler_engine_commands_total",
            "Pushes, pops and patches answered from committed batches.",
            e.commands.load(Ordering::Relaxed),
        ),
        (
            "scheduler_engine_failed_batches_total",
            "Batches rolled back.",
            e.failed_batches.load(Ordering::Relaxed),
        ),
        (
            "scheduler_engine_apply_microseconds_total",
            "Time spent reading and deciding batches, before their writes.",
            e.apply_micros.load(Ordering::Relaxed),
        ),
        (
            "scheduler_engine_batch_microseconds_total",
            "Time from a batch's first read to the end of its commit.",
            e.batch_micros.load(Ordering::Relaxed),
        ),
        (
            "scheduler_engine_statements_total",
            "Statements written by committed batches.",
            e.statements.load(Ordering::Relaxed),
        ),
        (
            "scheduler_engine_shed_total",
            "Commands answered without being applied: pops whose caller had gone, commands that waited too long.",
            e.shed.load(Ordering::Relaxed),
        ),
    ];
    for (name, help, value) in counters {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP app_settings_info Build information.\n# TYPE app_settings_info gauge\napp_settings_info{{version=\"{}\",schedulers=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        SchedulerId::ALL.map(|s| s.as_str()).join(",")
    );
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(out)
}
