//! The `/metrics` page: the registry of [`crate::metrics::Metrics`] (what is recorded as the
//! service runs, the process' and the build's figures) and a collector of what other parts keep,
//! read from them at scrape time (the heaps, the engines' counters, mula's status counts, the
//! listener, ColdStart, the connection pool, ownership, the service clients' failures). Every
//! name is in [`crate::metrics::CATALOGUE`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use actix_web::{HttpResponse, get, web};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;

use super::error::ApiError;
use super::observed::Observed;
use crate::clients::http::{FAILURE_KINDS, SERVICES, failures};
use crate::domain::SchedulerId;
use crate::domain::{PerScheduler, TaskStatus};
use crate::metrics::{ByStatus, counter, describe, gauge};
use crate::queue::{Broker, QueueError};

/// The page, in Prometheus' text format ([`crate::metrics::CONTENT_TYPE`]).
pub async fn page(broker: &Broker, observed: &Arc<Observed>) -> Result<String, std::fmt::Error> {
    // The one figure read from the database is taken (from its cache, or counted) before the
    // page is written: the client asks collectors for their figures synchronously.
    let status_counts = broker.task_status_counts().await;
    broker.metrics().encode(Owners {
        broker: broker.clone(),
        observed: Arc::clone(observed),
        status_counts,
    })
}

/// What other parts of the service keep, read as the page is written: the heaps, the engines'
/// counters, mula's status counts, the listener, ColdStart, the connection pool, ownership and
/// the service clients' failures.
struct Owners {
    /// The heaps' and engines' published figures, the pool, ownership.
    broker: Broker,
    /// The listener's and ColdStart's figures.
    observed: Arc<Observed>,
    /// Tasks per scheduler and status as last counted; `None` until a first count succeeds.
    status_counts: Option<PerScheduler<ByStatus>>,
}

/// The client wants collectors printable; the broker and the observed processes are not, and
/// what they hold is read, not owned, here.
impl std::fmt::Debug for Owners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owners").finish_non_exhaustive()
    }
}

impl Collector for Owners {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let e = &mut encoder;
        heaps(e, &self.broker)?;
        status_counts(e, self.status_counts.as_ref())?;
        engine(e, &self.broker)?;
        listener(e, &self.observed)?;
        coldstart(e, &self.observed)?;
        pool(e, &self.broker)?;
        ownership(e, &self.broker)?;
        dependencies(e)
    }
}

/// What `describe`, `gauge` and `counter` return: a failure of the page's writer.
type Written = Result<(), std::fmt::Error>;

fn heaps(out: &mut DescriptorEncoder, broker: &Broker) -> Written {
    let schedulers = broker.schedulers();
    let mut family = describe(out, "scheduler_qsize")?;
    for s in &schedulers {
        gauge(&mut family, &[("scheduler_id", s.id.as_str())], s.qsize)?;
    }
    let mut family = describe(out, "scheduler_pending")?;
    for s in &schedulers {
        gauge(&mut family, &[("scheduler_id", s.id.as_str())], s.pending)?;
    }
    let mut family = describe(out, "scheduler_maxsize")?;
    for s in &schedulers {
        gauge(&mut family, &[("scheduler_id", s.id.as_str())], s.maxsize)?;
    }
    let mut family = describe(out, "scheduler_oldest_queued_age_seconds")?;
    for s in &schedulers {
        let age = broker.oldest_queued_age(s.id).unwrap_or_default();
        gauge(
            &mut family,
            &[("scheduler_id", s.id.as_str())],
            age.as_secs_f64(),
        )?;
    }
    Ok(())
}

/// mula's family: every status of every scheduler, 0 included, as mula writes them. No sample
/// when the table could not be counted yet.
fn status_counts(out: &mut DescriptorEncoder, counts: Option<&PerScheduler<ByStatus>>) -> Written {
    let mut family = describe(out, "scheduler_task_status_counts")?;
    for (s, by_status) in counts.into_iter().flat_map(PerScheduler::iter) {
        for (status, n) in TaskStatus::ALL.iter().zip(by_status) {
            gauge(
                &mut family,
                &[("scheduler_id", s.as_str()), ("status", status.as_str())],
                *n,
            )?;
        }
    }
    Ok(())
}

fn engine(out: &mut DescriptorEncoder, broker: &Broker) -> Written {
    let e = broker.engine_counters();
    let load = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    for (name, value) in [
        ("scheduler_engine_batches_total", load(&e.batches)),
        ("scheduler_engine_commands_total", load(&e.commands)),
        ("scheduler_engine_statements_total", load(&e.statements)),
        (
            "scheduler_engine_failed_batches_total",
            load(&e.failed_batches),
        ),
        ("scheduler_engine_shed_total", load(&e.shed)),
        ("scheduler_engine_pops_set_aside_total", load(&e.set_aside)),
        (
            "scheduler_engine_pops_decided_again_total",
            load(&e.decided_again),
        ),
        ("scheduler_engine_backlog_pops_total", load(&e.backlog_pops)),
        (
            "scheduler_engine_backlog_searches_total",
            load(&e.backlog_searches),
        ),
        ("scheduler_engine_rebuilds_total", load(&e.rebuilds)),
    ] {
        counter(&mut describe(out, name)?, &[], value)?;
    }
    // The engine keeps its times in microseconds (integers in atomics); served in seconds.
    for (name, micros) in [
        (
            "scheduler_engine_apply_seconds_total",
            load(&e.apply_micros),
        ),
        (
            "scheduler_engine_batch_seconds_total",
            load(&e.batch_micros),
        ),
    ] {
        counter(&mut describe(out, name)?, &[], micros as f64 / 1e6)?;
    }
    Ok(())
}

fn dependencies(out: &mut DescriptorEncoder) -> Written {
    let mut family = describe(out, "scheduler_dependency_failures_total")?;
    for service in SERVICES {
        for kind in FAILURE_KINDS {
            counter(
                &mut family,
                &[("service", service), ("kind", kind)],
                failures(service, kind),
            )?;
        }
    }
    Ok(())
}

fn listener(out: &mut DescriptorEncoder, observed: &Observed) -> Written {
    let figures = observed.listener.figures();
    let mut family = describe(out, "scheduler_listener_messages_total")?;
    for f in &figures {
        for (outcome, n) in [
            ("received", f.received),
            ("acked", f.acked),
            ("dead_lettered", f.dead_lettered),
            ("retried", f.retried),
            ("parked", f.parked),
        ] {
            counter(&mut family, &[("queue", &f.queue), ("outcome", outcome)], n)?;
        }
    }
    let mut family = describe(out, "scheduler_listener_lag_messages")?;
    for f in &figures {
        gauge(&mut family, &[("queue", &f.queue)], f.ready)?;
    }
    let up = observed.listener.state() == "consuming";
    gauge(
        &mut describe(out, "scheduler_listener_up")?,
        &[],
        u64::from(up),
    )
}

fn coldstart(out: &mut DescriptorEncoder, observed: &Observed) -> Written {
    let f = observed.coldstart.figures();
    let mut family = describe(out, "scheduler_coldstart_objects")?;
    for (kind, n) in [
        ("loaded", f.objects_loaded),
        ("known", f.objects_known),
        ("planned", f.tasks_planned),
        ("gone", f.objects_gone),
    ] {
        gauge(&mut family, &[("kind", kind)], n)?;
    }
    let mut family = describe(out, "scheduler_coldstart_organisations")?;
    for (state, n) in [
        ("total", f.organisations),
        ("done", f.organisations_done),
        ("failed", f.organisations_failed),
    ] {
        gauge(&mut family, &[("state", state)], n)?;
    }
    counter(
        &mut describe(out, "scheduler_coldstart_rounds_total")?,
        &[],
        f.rounds,
    )
}

fn ownership(out: &mut DescriptorEncoder, broker: &Broker) -> Written {
    let own = broker.ownership();
    let owners: Vec<_> = SchedulerId::ALL
        .into_iter()
        .map(|s| (s, own.and_then(|o| o.owner(s))))
        .collect();
    let mut family = describe(out, "scheduler_ownership_owned")?;
    for s in SchedulerId::ALL {
        let owned = own.is_none_or(|o| o.epoch(s) > 0);
        gauge(
            &mut family,
            &[("scheduler_id", s.as_str())],
            u64::from(owned),
        )?;
    }
    let mut family = describe(out, "scheduler_ownership_owner_info")?;
    for (s, owner) in &owners {
        if let Some(o) = owner.as_ref().filter(|o| o.live) {
            gauge(
                &mut family,
                &[
                    ("scheduler_id", s.as_str()),
                    ("owner", &o.instance),
                    ("address", &o.address),
                ],
                1u64,
            )?;
        }
    }
    let mut family = describe(out, "scheduler_ownership_epoch")?;
    for (s, owner) in &owners {
        let epoch = owner.as_ref().map_or(0, |o| o.epoch);
        gauge(&mut family, &[("scheduler_id", s.as_str())], epoch)?;
    }
    let mut family = describe(out, "scheduler_ownership_takeovers_total")?;
    for s in SchedulerId::ALL {
        let n = own.map_or(0, |o| o.takeovers(s));
        counter(&mut family, &[("scheduler_id", s.as_str())], n)?;
    }
    Ok(())
}

fn pool(out: &mut DescriptorEncoder, broker: &Broker) -> Written {
    let (in_use, idle, max) = broker.pool_state();
    let mut family = describe(out, "scheduler_db_pool_connections")?;
    for (state, n) in [("in_use", in_use), ("idle", idle)] {
        gauge(&mut family, &[("state", state)], n)?;
    }
    gauge(&mut describe(out, "scheduler_db_pool_max")?, &[], max)
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
) -> Result<HttpResponse, ApiError> {
    // Writing into a String fails only if a collector does; none does, but the page says so
    // rather than serving half of itself.
    let page = page(&broker, &observed)
        .await
        .map_err(|e| QueueError::Internal(format!("cannot write the metrics page: {e}")))?;
    Ok(HttpResponse::Ok()
        .content_type(crate::metrics::CONTENT_TYPE)
        .body(page))
}
