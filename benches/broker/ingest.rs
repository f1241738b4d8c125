//! `--ingest`: how fast events and snapshots become frontier rows and tasks.
//!
//! - **Listener**: `--messages` M object events (distinct objects over 50 organisations, two
//!   boefjes consuming each) wait in a fresh RabbitMQ queue; the service starts with its
//!   listener on that queue and the time until all M are committed and acked is measured
//!   (messages/s from the queue to committed tasks). Baseline: RabbitMQ's own publish → consume
//!   rate with no work: the same M messages consumed with the same prefetch, each batch of what
//!   has arrived acked at once (the listener's own ack pattern). Alternating rounds, medians.
//!   Then the same objects' updates, their work waiting: at the level they had, and lowered
//!   below one boefje's (its waiting task withdrawn per event), side by side.
//! - **ColdStart**: a stub Octopoes (pages prepared in advance, so the stub costs little) lists
//!   `--orgs` K organisations of `--objects`/K objects each; the service starts with ColdStart on
//!   and the time until its first round has loaded every organisation is measured (objects/s),
//!   once with no plugin consuming the objects (the frontier load alone) and once with one boefje
//!   consuming them (a task planned per object). Baseline: `psql \copy` of the same rows into a
//!   copy of the frontier table with the same indexes. Alternating rounds, medians.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{App, HttpResponse, HttpServer, web};
use futures_util::{FutureExt, StreamExt};
use kat_scheduler::clock::SystemClock;
use kat_scheduler::config::Settings;
use kat_scheduler::startup::Application;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio_util::sync::CancellationToken;

use super::harness::postgres::{pg_exec, pg_number, with_db};
use super::harness::stats::median;
use super::{Options, Result};

const PREFETCH: u16 = kat_scheduler::config::DEFAULT_PREFETCH;

fn amqp_url() -> String {
    std::env::var("KAT_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

fn settings(db: &str, catalogue: &std::path::Path) -> Settings {
    let mut s = Settings::default();
    s.api.host = "127.0.0.1".into();
    s.api.port = 0;
    s.api.workers = 1;
    s.database.uri = db.to_owned();
    s.catalogue.file = catalogue.to_string_lossy().into_owned();
    s.queue.watchdog_interval_secs = 0;
    s
}

fn mutation(round: usize, i: usize) -> Vec<u8> {
    event("create", round, i, 2)
}

/// The i-th object event of a round: its operation and the object's scan level.
fn event(operation: &str, round: usize, i: usize, level: i64) -> Vec<u8> {
    let org = format!("org{}", i % 50);
    let reference = format!("Hostname|internet|r{round}-h{i}.example.com");
    serde_json::json!({"operation": operation, "primary_key": reference, "client_id": org,
        "value": {"primary_key": reference, "object_type": "Hostname",
                  "scan_profile": {"level": level, "reference": reference, "scan_profile_type": "declared"}}})
    .to_string()
    .into_bytes()
}

async fn declare(channel: &Channel, queue: &str) -> Result<()> {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    Ok(())
}

/// Publishes `bodies` persistently to `queue`, confirmed.
async fn fill(channel: &Channel, queue: &str, bodies: &[Vec<u8>]) -> Result<()> {
    declare(channel, queue).await?;
    let mut confirms = Vec::with_capacity(bodies.len());
    for b in bodies {
        confirms.push(
            channel
                .basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    b,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await?,
        );
    }
    for c in confirms {
        c.await?;
    }
    Ok(())
}

/// RabbitMQ alone: consumes `n` messages with the listener's prefetch and ack pattern.
async fn consume_only(conn: &Connection, queue: &str, n: usize) -> Result<f64> {
    let channel = conn.create_channel().await?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let started = Instant::now();
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "bench-baseline".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut got = 0;
    while got < n {
        let Some(first) = consumer.next().await else {
            return Err("the baseline consumer ended".into());
        };
        let mut last = first?;
        got += 1;
        while got < n {
            match consumer.next().now_or_never() {
                Some(Some(d)) => {
                    last = d?;
                    got += 1;
                }
                _ => break,
            }
        }
        last.ack(BasicAckOptions { multiple: true }).await?;
    }
    let secs = started.elapsed().as_secs_f64();
    channel.close(200, "done".into()).await?;
    Ok(n as f64 / secs)
}

/// The service's listener: starts it on `queue` (already filled with `n` messages) and waits
/// until all are handled.
async fn listen(db: &str, catalogue: &std::path::Path, queue: &str, n: usize) -> Result<f64> {
    let mut s = settings(db, catalogue);
    s.listener.uri = amqp_url();
    s.listener.mutations_queue = queue.to_owned();
    s.listener.raw_files_queue = format!("{queue}-raw");
    s.listener.prefetch = PREFETCH;
    let app = Application::build(s, Arc::new(SystemClock)).await?;
    let status = app.listener_status();
    let broker = app.broker().clone();
    let c0 = counters(&broker);
    let token = CancellationToken::new();
    let started = Instant::now();
    let run = tokio::spawn(app.run_until_stopped(token.clone()));
    tokio::time::timeout(Duration::from_secs(600), status.wait_handled(n as u64))
        .await
        .map_err(|_| "the listener did not handle every message within 10 minutes")?;
    let secs = started.elapsed().as_secs_f64();
    let figures = status.figures();
    let (received, batches) = (figures[0].received, figures[0].batches.max(1));
    let c1 = counters(&broker);
    let engine_batches = (c1[0] - c0[0]).max(1);
    println!(
        "    listener: {received} received in {batches} batches ({:.1} per batch); engine: {} transactions of {:.1} commands, {:.0} µs deciding and {:.0} µs in all per transaction",
        received as f64 / batches as f64,
        engine_batches,
        (c1[1] - c0[1]) as f64 / engine_batches as f64,
        (c1[2] - c0[2]) as f64 / engine_batches as f64,
        (c1[3] - c0[3]) as f64 / engine_batches as f64,
    );
    token.cancel();
    run.await??;
    Ok(n as f64 / secs)
}

/// The engines' batches, commands, deciding and whole-batch microseconds so far.
fn counters(b: &kat_scheduler::queue::Broker) -> [u64; 4] {
    use std::sync::atomic::Ordering::Relaxed;
    let e = b.engine_counters();
    [
        e.batches.load(Relaxed),
        e.commands.load(Relaxed),
        e.apply_micros.load(Relaxed),
        e.batch_micros.load(Relaxed),
    ]
}

/// A stub Octopoes serving `pages` (path and query → body) prepared in advance.
fn serve_pages(
    pages: Arc<std::collections::HashMap<String, String>>,
) -> Result<(String, actix_web::dev::ServerHandle)> {
    let server = HttpServer::new(move || {
        let pages = pages.clone();
        App::new().default_service(web::to(move |req: actix_web::HttpRequest| {
            let pages = pages.clone();
            async move {
                let q: std::collections::HashMap<String, String> =
                    form_urlencoded::parse(req.query_string().as_bytes())
                        .into_owned()
                        .collect();
                let key = format!(
                    "{}?{}",
                    req.path(),
                    q.get("offset").map(String::as_str).unwrap_or("0")
                );
                match pages.get(&key) {
                    Some(body) => HttpResponse::Ok()
                        .content_type("application/json")
                        .body(body.clone()),
                    None => HttpResponse::Ok()
                        .content_type("application/json")
                        .body(r#"{"count": 0, "items": []}"#),
                }
            }
        }))
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")?;
    let port = server.addrs()[0].port();
    let server = server.run();
    let handle = server.handle();
    tokio::spawn(server);
    Ok((format!("http://127.0.0.1:{port}"), handle))
}

/// The objects of a ColdStart round: per organisation its references.
fn snapshot(round: usize, orgs: usize, per_org: usize) -> Vec<(String, Vec<String>)> {
    (0..orgs)
        .map(|o| {
            let org = format!("cs{round}-org{o}");
            let refs = (0..per_org)
                .map(|i| format!("Hostname|internet|{org}-h{i}.example.com"))
                .collect();
            (org, refs)
        })
        .collect()
}

fn pages(snap: &[(String, Vec<String>)], page: usize) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    for (org, refs) in snap {
        for (n, chunk) in refs.chunks(page).enumerate() {
            let items: Vec<serde_json::Value> = chunk
                .iter()
                .map(|r| {
                    serde_json::json!({"object_type": "Hostname", "primary_key": r, "user_id": null,
                        "scan_profile": {"scan_profile_type": "declared", "reference": r,
                                         "level": 2, "user_id": null},
                        "network": "Network|internet", "name": r.rsplit('|').next()})
                })
                .collect();
            out.insert(
                format!("/{org}/objects?{}", n * page),
                serde_json::json!({"count": refs.len(), "items": items}).to_string(),
            );
        }
    }
    out
}

/// The service's ColdStart over `snap`: objects loaded per second in its first round.
async fn coldstart(
    db: &str,
    dir: &std::path::Path,
    snap: &[(String, Vec<String>)],
    plan: bool,
) -> Result<f64> {
    let orgs: Vec<String> = snap.iter().map(|(o, _)| format!("\"{o}\"")).collect();
    let mut catalogue = format!("organisations = [{}]\n", orgs.join(", "));
    if plan {
        catalogue.push_str(
            "[[plugins]]\nid = \"dns-records\"\ntype = \"boefje\"\nconsumes = [\"Hostname\"]\nscan_level = 1\nenabled = true\n",
        );
    }
    let path = dir.join("coldstart.toml");
    std::fs::write(&path, catalogue)?;
    let (url, stub) = serve_pages(Arc::new(pages(snap, 1000)))?;
    let mut s = settings(db, &path);
    s.clients.octopoes_api = url;
    let app = Application::build(s, Arc::new(SystemClock)).await?;
    let status = app.coldstart_status();
    let token = CancellationToken::new();
    let started = Instant::now();
    let run = tokio::spawn(app.run_until_stopped(token.clone()));
    tokio::time::timeout(Duration::from_secs(600), status.wait_rounds(1))
        .await
        .map_err(|_| "ColdStart did not finish its round within 10 minutes")?;
    let secs = started.elapsed().as_secs_f64();
    let figures = status.figures();
    token.cancel();
    run.await??;
    stub.stop(false).await;
    let objects: usize = snap.iter().map(|(_, r)| r.len()).sum();
    if figures.objects_loaded != objects as u64 || figures.organisations_failed > 0 {
        return Err(format!(
            "ColdStart loaded {} of {objects} objects ({} organisations failed)",
            figures.objects_loaded, figures.organisations_failed
        )
        .into());
    }
    Ok(objects as f64 / secs)
}

/// `psql \copy` of the same rows into a copy of the frontier table: objects per second.
fn copy_in(db: &str, dir: &std::path::Path, snap: &[(String, Vec<String>)]) -> Result<f64> {
    pg_exec(db, "DROP TABLE IF EXISTS frontier_copy")?;
    pg_exec(
        db,
        "CREATE TABLE frontier_copy (LIKE frontier INCLUDING ALL)",
    )?;
    let csv = dir.join("frontier.csv");
    let mut text = String::new();
    for (org, refs) in snap {
        for r in refs {
            text.push_str(&format!(
                "{org},{r},Hostname,2,declared,2026-11-23 10:00:00,2026-11-23 10:00:00,,2026-11-23 10:00:00\n"
            ));
        }
    }
    std::fs::write(&csv, text)?;
    let started = Instant::now();
    let status = std::process::Command::new("psql")
        .arg(db)
        .arg("-qc")
        .arg(format!(
            "\\copy frontier_copy (organisation, reference, object_type, scan_level, \
             scan_profile_type, first_seen, last_seen, gone_at, confirmed_at) FROM '{}' CSV",
            csv.display()
        ))
        .status()?;
    let secs = started.elapsed().as_secs_f64();
    if !status.success() {
        return Err("psql \\copy failed".into());
    }
    let rows: usize = snap.iter().map(|(_, r)| r.len()).sum();
    Ok(rows as f64 / secs)
}

/// Runs the ingest measurements; returns the machine line's fields.
pub fn run_ingest(o: &Options, base: &str) -> Result<String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let catalogue = dir.path().join("listener.toml");
    std::fs::write(
        &catalogue,
        "[[plugins]]\nid = \"dns-records\"\ntype = \"boefje\"\nconsumes = [\"Hostname\"]\nscan_level = 1\nenabled = true\n\n\
         [[plugins]]\nid = \"nmap\"\ntype = \"boefje\"\nconsumes = [\"Hostname\"]\nscan_level = 2\nenabled = true\n",
    )?;
    let m = o.messages;
    println!(
        "ingest: listener {m} messages per round (2 tasks each, prefetch {PREFETCH}); ColdStart {} objects over {} organisations; {} rounds",
        o.objects, o.orgs, o.rounds
    );
    let (mut listener, mut rabbit) = (Vec::new(), Vec::new());
    let (mut unchanged, mut lowered) = (Vec::new(), Vec::new());
    with_db(o, base, "_ingest", |db| {
        rt.block_on(async {
            let conn = Connection::connect(&amqp_url(), ConnectionProperties::default()).await?;
            let channel = conn.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            for r in 0..o.rounds {
                let bodies: Vec<Vec<u8>> = (0..m).map(|i| mutation(r, i)).collect();
                let base_q = format!("bench-base-{}-{r}", std::process::id());
                fill(&channel, &base_q, &bodies).await?;
                let rate = consume_only(&conn, &base_q, m).await?;
                rabbit.push(rate);
                let muts = format!("bench-muts-{}-{r}", std::process::id());
                fill(&channel, &muts, &bodies).await?;
                let got = listen(db, &catalogue, &muts, m).await?;
                listener.push(got);
                let tasks = pg_number(
                    db,
                    "SELECT COUNT(*) AS n FROM tasks WHERE scheduler_id = 'boefje'",
                )?;
                if tasks != (2 * m * (r + 1)) as i64 {
                    return Err(format!(
                        "round {r}: {tasks} boefje tasks, expected {}",
                        2 * m * (r + 1)
                    )
                    .into());
                }
                println!(
                    "  round {r}: listener {got:.0} msg/s, RabbitMQ alone {rate:.0} msg/s ({:.2}×)",
                    got / rate
                );
                // Updates of the same objects, their work waiting: at the level they had (the
                // work is there: duplicates), then lowered below `nmap`'s (its waiting task is
                // withdrawn, one cancel per event).
                let same: Vec<Vec<u8>> = (0..m).map(|i| event("update", r, i, 2)).collect();
                let same_q = format!("bench-same-{}-{r}", std::process::id());
                fill(&channel, &same_q, &same).await?;
                let kept = listen(db, &catalogue, &same_q, m).await?;
                unchanged.push(kept);
                let lowered_events: Vec<Vec<u8>> =
                    (0..m).map(|i| event("update", r, i, 1)).collect();
                let low_q = format!("bench-low-{}-{r}", std::process::id());
                fill(&channel, &low_q, &lowered_events).await?;
                let low = listen(db, &catalogue, &low_q, m).await?;
                lowered.push(low);
                let cancelled = pg_number(
                    db,
                    "SELECT COUNT(*) AS n FROM tasks WHERE scheduler_id = 'boefje' AND status = 'cancelled'",
                )?;
                if cancelled != (m * (r + 1)) as i64 {
                    return Err(format!(
                        "round {r}: {cancelled} tasks withdrawn, expected {}",
                        m * (r + 1)
                    )
                    .into());
                }
                println!(
                    "  round {r}: updates {kept:.0} msg/s at the same level, {low:.0} msg/s lowered (a task withdrawn each; {:.2}×)",
                    low / kept
                );
                for q in [&base_q, &muts, &same_q, &low_q] {
                    for name in [
                        q.clone(),
                        format!("{q}-raw"),
                        format!("{q}-raw.dead"),
                        format!("{q}.dead"),
                    ] {
                        let _ = channel
                            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                            .await;
                    }
                }
            }
            conn.close(200, "done".into()).await?;
            Result::Ok(())
        })
    })?;
    let (l, b) = (median(listener), median(rabbit));
    println!(
        "listener: {l:.0} messages/s to committed tasks vs RabbitMQ publish → consume alone {b:.0}/s = {:.2}× (target ≥ 0.5×)",
        l / b
    );
    let (same, low) = (median(unchanged), median(lowered));
    println!(
        "listener updates: {low:.0} messages/s lowering the level (a waiting task withdrawn each) vs {same:.0}/s at the same level = {:.2}×",
        low / same
    );

    let per_org = o.objects / o.orgs.max(1);
    let (mut load, mut plan, mut copy) = (Vec::new(), Vec::new(), Vec::new());
    with_db(o, base, "_coldstart", |db| {
        // The schema first: the COPY baseline writes into a copy of the frontier table.
        let target = kat_scheduler::storage::DbTarget::parse(db)?;
        let pool = kat_scheduler::storage::connect(&target, 2, Duration::from_secs(5))?;
        kat_scheduler::storage::run_migrations(&mut *kat_scheduler::storage::checkout(&pool)?)?;
        drop(pool);
        for r in 0..o.rounds {
            let snap = snapshot(2 * r, o.orgs, per_org);
            let c = copy_in(db, dir.path(), &snap)?;
            copy.push(c);
            let a = rt.block_on(coldstart(db, dir.path(), &snap, false))?;
            load.push(a);
            let snap = snapshot(2 * r + 1, o.orgs, per_org);
            let p = rt.block_on(coldstart(db, dir.path(), &snap, true))?;
            plan.push(p);
            println!(
                "  round {r}: ColdStart {a:.0} objects/s (frontier only), {p:.0} objects/s (a task each); COPY {c:.0} rows/s"
            );
        }
        Ok(())
    })?;
    let (a, p, c) = (median(load), median(plan), median(copy));
    println!(
        "ColdStart: {a:.0} objects/s into the frontier = {:.2}× COPY ({c:.0} rows/s; target ≥ 0.5×); with a task planned per object {p:.0} objects/s = {:.2}×",
        a / c,
        p / c
    );
    Ok(format!(
        "listener_msgs={l:.0} rabbit_msgs={b:.0} listener_ratio={:.2} updates_same_msgs={same:.0} updates_lowered_msgs={low:.0} coldstart_objs={a:.0} coldstart_plan_objs={p:.0} copy_rows={c:.0} coldstart_ratio={:.2} coldstart_plan_ratio={:.2}",
        l / b,
        a / c,
        p / c
    ))
}
