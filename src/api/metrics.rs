//! The `/metrics` page: the figures recorded in [`crate::metrics::Metrics`] and those read from
//! their owners at scrape time (the heaps, the engines' counters, the listener, ColdStart, the
//! connection pool, the process, the service clients' failures). Every name is in
//! [`crate::metrics::CATALOGUE`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use actix_web::{HttpResponse, get, web};

use super::observed::Observed;
use crate::clients::http::{FAILURE_KINDS, SERVICES, failures};
use crate::domain::SchedulerId;
use crate::domain::{PerScheduler, TaskStatus};
use crate::metrics::{ByStatus, Exposition, ProcessFigures};
use crate::queue::Broker;

/// The page, in Prometheus' text format.
pub async fn page(broker: &Broker, observed: &Observed) -> String {
    let counts = broker.task_status_counts().await;
    let mut out = Exposition::default();
    heaps(&mut out, broker);
    status_counts(&mut out, counts.as_ref());
    engine(&mut out, broker);
    broker.metrics().write(&mut out);
    listener(&mut out, observed);
    coldstart(&mut out, observed);
    pool(&mut out, broker);
    ownership(&mut out, broker);
    dependencies(&mut out);
    if let Some(p) = ProcessFigures::read() {
        p.write(&mut out);
    }
    out.family("app_settings_info");
    out.sample(
        "app_settings_info",
        &[
            ("version", env!("CARGO_PKG_VERSION")),
            (
                "schedulers",
                &SchedulerId::ALL.map(|s| s.as_str()).join(","),
            ),
        ],
        1.0,
    );
    out.finish()
}

fn heaps(out: &mut Exposition, broker: &Broker) {
    const NAMES: [&str; 4] = [
        "scheduler_qsize",
        "scheduler_pending",
        "scheduler_maxsize",
        "scheduler_oldest_queued_age_seconds",
    ];
    let rows: Vec<(SchedulerId, [f64; 4])> = broker
        .schedulers()
        .into_iter()
        .map(|s| {
            let age = broker.oldest_queued_age(s.id).unwrap_or_default();
            let values = [
                s.qsize as f64,
                s.pending as f64,
                s.maxsize as f64,
                age.as_secs_f64(),
            ];
            (s.id, values)
        })
        .collect();
    for (i, name) in NAMES.into_iter().enumerate() {
        out.family(name);
        for (id, values) in &rows {
            out.sample(name, &[("scheduler_id", id.as_str())], values[i]);
        }
    }
}

/// mula's family: every status of every scheduler, 0 included, as mula writes them. Nothing
/// when the table could not be counted yet.
fn status_counts(out: &mut Exposition, counts: Option<&PerScheduler<ByStatus>>) {
    out.family("scheduler_task_status_counts");
    for (s, by_status) in counts.into_iter().flat_map(PerScheduler::iter) {
        for (status, n) in TaskStatus::ALL.iter().zip(by_status) {
            out.sample(
                "scheduler_task_status_counts",
                &[("scheduler_id", s.as_str()), ("status", status.as_str())],
                *n as f64,
            );
        }
    }
}

fn engine(out: &mut Exposition, broker: &Broker) {
    let e = broker.engine_counters();
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed) as f64;
    // The engine keeps its times in microseconds (integers in atomics); served in seconds.
    for (name, value) in [
        ("scheduler_engine_batches_total", load(&e.batches)),
        ("scheduler_engine_commands_total", load(&e.commands)),
        ("scheduler_engine_statements_total", load(&e.statements)),
        (
            "scheduler_engine_apply_seconds_total",
            load(&e.apply_micros) / 1e6,
        ),
        (
            "scheduler_engine_batch_seconds_total",
            load(&e.batch_micros) / 1e6,
        ),
        (
            "scheduler_engine_failed_batches_total",
            load(&e.failed_batches),
        ),
        ("scheduler_engine_shed_total", load(&e.shed)),
    ] {
        out.family(name);
        out.sample(name, &[], value);
    }
}

fn dependencies(out: &mut Exposition) {
    out.family("scheduler_dependency_failures_total");
    for service in SERVICES {
        for kind in FAILURE_KINDS {
            out.sample(
                "scheduler_dependency_failures_total",
                &[("service", service), ("kind", kind)],
                failures(service, kind) as f64,
            );
        }
    }
}

fn listener(out: &mut Exposition, observed: &Observed) {
    let figures = observed.listener.figures();
    out.family("scheduler_listener_messages_total");
    for f in &figures {
        for (outcome, n) in [
            ("received", f.received),
            ("acked", f.acked),
            ("dead_lettered", f.dead_lettered),
            ("retried", f.retried),
        ] {
            out.sample(
                "scheduler_listener_messages_total",
                &[("queue", &f.queue), ("outcome", outcome)],
                n as f64,
            );
        }
    }
    out.family("scheduler_listener_lag_messages");
    for f in &figures {
        out.sample(
            "scheduler_listener_lag_messages",
            &[("queue", &f.queue)],
            f.ready as f64,
        );
    }
    out.family("scheduler_listener_up");
    let up = observed.listener.state() == "consuming";
    out.sample("scheduler_listener_up", &[], f64::from(u8::from(up)));
}

fn coldstart(out: &mut Exposition, observed: &Observed) {
    let f = observed.coldstart.figures();
    out.family("scheduler_coldstart_objects");
    for (kind, n) in [
        ("loaded", f.objects_loaded),
        ("known", f.objects_known),
        ("planned", f.tasks_planned),
        ("gone", f.objects_gone),
    ] {
        out.sample("scheduler_coldstart_objects", &[("kind", kind)], n as f64);
    }
    out.family("scheduler_coldstart_organisations");
    for (state, n) in [
        ("total", f.organisations),
        ("done", f.organisations_done),
        ("failed", f.organisations_failed),
    ] {
        out.sample(
            "scheduler_coldstart_organisations",
            &[("state", state)],
            n as f64,
        );
    }
    out.family("scheduler_coldstart_rounds_total");
    out.sample("scheduler_coldstart_rounds_total", &[], f.rounds as f64);
}

fn ownership(out: &mut Exposition, broker: &Broker) {
    let own = broker.ownership();
    let owners: Vec<_> = SchedulerId::ALL
        .into_iter()
        .map(|s| (s, own.and_then(|o| o.owner(s))))
        .collect();
    out.family("scheduler_ownership_owned");
    for s in SchedulerId::ALL {
        let owned = own.is_none_or(|o| o.epoch(s) > 0);
        let v = if owned { 1.0 } else { 0.0 };
        out.sample(
            "scheduler_ownership_owned",
            &[("scheduler_id", s.as_str())],
            v,
        );
    }
    out.family("scheduler_ownership_owner_info");
    for (s, owner) in &owners {
        if let Some(o) = owner.as_ref().filter(|o| o.live) {
            out.sample(
                "scheduler_ownership_owner_info",
                &[
                    ("scheduler_id", s.as_str()),
                    ("owner", &o.instance),
                    ("address", &o.address),
                ],
                1.0,
            );
        }
    }
    out.family("scheduler_ownership_epoch");
    for (s, owner) in &owners {
        let epoch = owner.as_ref().map_or(0, |o| o.epoch);
        out.sample(
            "scheduler_ownership_epoch",
            &[("scheduler_id", s.as_str())],
            epoch as f64,
        );
    }
    out.family("scheduler_ownership_takeovers_total");
    for s in SchedulerId::ALL {
        let n = own.map_or(0, |o| o.takeovers(s));
        out.sample(
            "scheduler_ownership_takeovers_total",
            &[("scheduler_id", s.as_str())],
            n as f64,
        );
    }
}

fn pool(out: &mut Exposition, broker: &Broker) {
    let (in_use, idle, max) = broker.pool_state();
    out.family("scheduler_db_pool_connections");
    for (state, n) in [("in_use", in_use), ("idle", idle)] {
        out.sample(
            "scheduler_db_pool_connections",
            &[("state", state)],
            f64::from(n),
        );
    }
    out.family("scheduler_db_pool_max");
    out.sample("scheduler_db_pool_max", &[], f64::from(max));
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
        .body(page(&broker, &observed).await)
}
