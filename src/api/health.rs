//! `/`, `/health` and `/metrics`.

use std::collections::HashMap;

use actix_web::{HttpResponse, get, web};
use serde_json::{Value, json};

use super::dto::{Health, HealthQuery, ServiceHealth};
use std::sync::Arc;

use crate::clients::bytes::Bytes;
use crate::clients::catalogue::Catalogue;
use crate::clients::katalogus::Katalogus;
use crate::clients::octopoes::Octopoes;
use crate::coldstart::ColdStartStatus;
use crate::listener::ListenerStatus;
use crate::queue::Broker;

/// What `/health` reports beside the database: the background processes' state and, when asked
/// (`externals=true`, as mula), whether the platform's services answer.
pub struct Observed {
    /// The AMQP listener (`off` when not configured).
    pub listener: Arc<ListenerStatus>,
    /// The plugin catalogue.
    pub catalogue: Catalogue,
    /// ColdStart (`off` when Octopoes is not configured).
    pub coldstart: Arc<ColdStartStatus>,
    /// Katalogus, when configured.
    pub katalogus: Option<Katalogus>,
    /// Octopoes, when configured.
    pub octopoes: Option<Octopoes>,
    /// Bytes, when configured.
    pub bytes: Option<Bytes>,
}

impl Observed {
    /// Nothing observed but a listener (tests and tools that build the API alone).
    pub fn listener_only(listener: Arc<ListenerStatus>, clock: crate::clock::SharedClock) -> Self {
        Self {
            listener,
            catalogue: Catalogue::empty(clock),
            coldstart: Arc::default(),
            katalogus: None,
            octopoes: None,
            bytes: None,
        }
    }

    /// Whether each configured platform service answers its health check (checked at once).
    async fn externals(&self) -> HashMap<String, bool> {
        let katalogus = async {
            match &self.katalogus {
                Some(k) => Some(k.health().await),
                None => None,
            }
        };
        let octopoes = async {
            let o = self.octopoes.as_ref()?;
            // Octopoes answers health per organisation: the first one stands for the service.
            let orgs = self.catalogue.organisations().await.ok()?;
            Some(match orgs.first() {
                Some(org) => o.health(org).await,
                None => false,
            })
        };
        let bytes = async {
            match &self.bytes {
                Some(b) => Some(b.health().await),
                None => None,
            }
        };
        let (k, o, b) = tokio::join!(katalogus, octopoes, bytes);
        [("katalogus", k), ("octopoes", o), ("bytes", b)]
            .into_iter()
            .filter_map(|(name, ok)| ok.map(|ok| (name.to_owned(), ok)))
            .collect()
    }
}

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
    observed: web::Data<Arc<Observed>>,
    query: web::Query<HealthQuery>,
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
        // Planning goes on with the last known plugins while Katalogus is away.
        healthy: true,
        version: None,
        additional: serde_json::to_value(&catalogue).unwrap_or(Value::Null),
        results: Vec::new(),
    });
    let coldstart = observed.coldstart.figures();
    results.push(ServiceHealth {
        service: "coldstart".into(),
        healthy: coldstart.organisations_failed == 0,
        version: None,
        additional: serde_json::to_value(&coldstart).unwrap_or(Value::Null),
        results: Vec::new(),
    });
    let externals = if query.externals.unwrap_or(false) {
        observed.externals().await
    } else {
        HashMap::new()
    };
    let body = Health {
        service: "scheduler".into(),
        healthy: db_ok,
        version: env!("CARGO_PKG_VERSION").into(),
        additional: Value::Null,
        results,
        externals,
    };
    if db_ok {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// Prometheus metrics: heaps, requests and their latency, transitions, leases, batches, the
/// listener, ColdStart, cron entries and the connection pool (docs/OPERATIONS.md lists them).
#[utoipa::path(
    tag = "health",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain"))
)]
#[get("/metrics")]
pub async fn metrics(
    broker: web::Data<Broker>,
    observed: web::Data<Arc<Observed>>,
) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(super::metrics::page(&broker, &observed).await)
}
