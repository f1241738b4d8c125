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
    /// The clock the components' failure times are read on.
    pub clock: crate::clock::SharedClock,
}

/// Longest `/health?externals=true` waits for the platform's services, all asked at once: a hung
/// one counts as unhealthy rather than holding the answer (and a probe) up.
pub const EXTERNALS_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a component's dependency may fail before the component says it is unhealthy: the
/// catalogue keeps the last known plugins and ColdStart retries, so a blip is no fault, but
/// Katalogus or Octopoes away for minutes is one an operator should see.
pub const DEPENDENCY_GRACE_SECS: i64 = 300;

/// Whether a dependency failing since `since` (if at all) is still within the grace at `now`.
fn within_grace(failing_for: Option<chrono::Duration>) -> bool {
    failing_for.is_none_or(|d| d < chrono::Duration::seconds(DEPENDENCY_GRACE_SECS))
}

/// `check`, or false once [`EXTERNALS_BOUND`] has passed.
async fn bounded(check: impl std::future::Future<Output = bool>) -> bool {
    tokio::time::timeout(EXTERNALS_BOUND, check)
        .await
        .unwrap_or(false)
}

impl Observed {
    /// Nothing observed but a listener (tests and tools that build the API alone).
    pub fn listener_only(listener: Arc<ListenerStatus>, clock: crate::clock::SharedClock) -> Self {
        Self {
            listener,
            catalogue: Catalogue::empty(clock.clone()),
            coldstart: Arc::default(),
            katalogus: None,
            octopoes: None,
            bytes: None,
            clock,
        }
    }

    /// Whether each configured platform service answers its health check: all asked at once,
    /// each within [`EXTERNALS_BOUND`].
    async fn externals(&self) -> HashMap<String, bool> {
        let katalogus = async {
            match &self.katalogus {
                Some(k) => Some(bounded(k.health()).await),
                None => None,
            }
        };
        let octopoes = async {
            match &self.octopoes {
                Some(o) => Some(bounded(o.service_health()).await),
                None => None,
            }
        };
        let bytes = async {
            match &self.bytes {
                Some(b) => Some(bounded(b.health()).await),
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

/// Readiness: whether the service can serve its API now: the database answers and every
/// scheduler is owned here or by a live instance (503, naming what is not, otherwise; `/livez`
/// is liveness).
#[utoipa::path(
    tag = "health",
    params(HealthQuery),
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "Not ready: the database does not answer, or a scheduler has no owner at the moment", body = Health)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dependency_failing_past_the_grace_makes_its_component_unhealthy() {
        assert!(within_grace(None));
        assert!(within_grace(Some(chrono::Duration::seconds(
            DEPENDENCY_GRACE_SECS - 1
        ))));
        assert!(!within_grace(Some(chrono::Duration::seconds(
            DEPENDENCY_GRACE_SECS
        ))));
    }
}
