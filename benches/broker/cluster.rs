//! `--cluster`: several instances of the service on one PostgreSQL database.
//!
//! - Pops/s and p99 with one instance against three, on the path runners take: T tasks seeded
//!   mostly boefje (the `--pending` mix), heaps at the service's default bound (100,000) with the
//!   rest of the backlog pending, and closed-loop clients popping as the runners do (`limit=1`):
//!   seven in eight are boefje runners with their image filter (one image of ten each), one in
//!   eight a normalizer runner (no filter). First all on one instance, then spread over three.
//!   The first instance started owns all three schedulers, so two requests in three reach a
//!   non-owner and are forwarded: the figure is the cost of forwarding.
//! - Takeover: the owner of `boefje` is killed with SIGKILL `--kills` times (default 10) under
//!   the default lease (`cluster.lease_ms`, 2 s); the time from the kill to the first pop a
//!   survivor answers 200 (served by the new owner's engine), and a fresh instance joins after
//!   each kill. Median and max.
//!
//! `cargo bench --bench broker -- --cluster --tasks 400000 --seconds 2`

use std::time::{Duration, Instant};

use kat_scheduler::config::DEFAULT_MAXSIZE;

use super::harness::http::{Http, current_thread, pop_request, pop_request_with, popped_id};
use super::harness::instance::{Broker, start_broker, stop_broker};
use super::harness::postgres::{
    BOEFJE_HEAVY, IMAGES, extra_columns, image_name, machine, pg_number, seed_tasks, with_db,
};
use super::harness::stats::{Figure, figure, median, median_figure, micros_since};
use super::harness::worker_pops::image_filter;
use super::{Options, Result};

/// One instance of the service, as the other scenarios start it, at the default heap bound.
fn spawn(db: &str) -> Result<Broker> {
    start_broker(db, DEFAULT_MAXSIZE)
}

/// Client `c`'s pop: a normalizer runner's for one client in eight, else a boefje runner's
/// with its image filter.
fn runner_pop(c: usize) -> Vec<u8> {
    if c % 8 == 7 {
        pop_request("normalizer")
    } else {
        pop_request_with("boefje", Some(&image_filter(&image_name(c % IMAGES))))
    }
}

/// The port of `boefje`'s live owner, from its lease row.
fn boefje_owner(db: &str) -> Result<u16> {
    let port = pg_number(
        db,
        "SELECT split_part(address, ':', 3)::bigint AS n FROM scheduler_owners \
         WHERE scheduler_id = 'boefje' AND owner IS NOT NULL AND expires_at > now()",
    )?;
    Ok(u16::try_from(port)?)
}

/// Closed-loop pops (limit=1) by `clients` connections spread over `ports`, for `seconds`.
async fn spread(ports: &[u16], clients: usize, seconds: f64) -> Result<Figure> {
    let start = Instant::now();
    let deadline = Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut http = Http::connect(ports[c % ports.len()]).await?;
        // Clients of one kind spread over every instance, not one kind per instance.
        let pop = runner_pop(c / ports.len());
        tasks.push(tokio::spawn(async move {
            let mut body = Vec::with_capacity(1024);
            let mut latencies = Vec::new();
            while start.elapsed() < deadline {
                let t = Instant::now();
                let status = http.call(&pop, &mut body).await?;
                if status != 200 {
                    return Err::<Vec<u32>, super::Error>(
                        format!("pop answered {status}: {}", String::from_utf8_lossy(&body)).into(),
                    );
                }
                if popped_id(&body).is_some() {
                    latencies.push(micros_since(t));
                }
            }
            Ok(latencies)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(figure(all.len(), start.elapsed(), all))
}

/// Waits until a pop on one of `survivors` is answered 200.
async fn until_served(survivors: &[u16]) -> Result<()> {
    let start = Instant::now();
    let pop = pop_request("boefje");
    let mut body = Vec::new();
    loop {
        for port in survivors {
            // A fresh connection per probe: an instance's answer, not a kept socket's.
            if let Ok(mut http) = Http::connect(*port).await
                && let Ok(200) = http.call(&pop, &mut body).await
            {
                return Ok(());
            }
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err("no survivor served boefje within a minute".into());
        }
        // Probing interval: the resolution of the figure.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn kill_9(mut i: Broker) -> Result<()> {
    i.child.kill()?;
    i.child.wait()?;
    Ok(())
}

/// Runs the scenario; answers its summary for the last line.
pub(super) fn run_cluster(o: &Options, base: &str) -> Result<String> {
    with_db(o, base, "_cluster", |db| {
        println!("{}", machine(db)?);
        stop_broker(spawn(db)?)?;
        let cols = extra_columns(db)?;
        eprintln!("cluster: seeding {} tasks…", o.tasks);
        let boefje =
            o.tasks / BOEFJE_HEAVY.len() * BOEFJE_HEAVY.iter().filter(|s| **s == "boefje").count();
        if boefje <= DEFAULT_MAXSIZE {
            return Err(format!(
                "--tasks {} seeds {boefje} boefje tasks: more than the heap bound ({DEFAULT_MAXSIZE}) are needed, so that the backlog is pending as in production",
                o.tasks
            )
            .into());
        }
        seed_tasks(db, o.tasks, &BOEFJE_HEAVY, &cols)?;
        let rt = current_thread()?;
        let first = spawn(db)?;
        let mut instances = vec![first, spawn(db)?, spawn(db)?];
        let ports: Vec<u16> = instances.iter().map(|i| i.port).collect();
        let (mut one, mut three) = (Vec::new(), Vec::new());
        for round in 0..o.rounds {
            let a = rt.block_on(spread(&ports[..1], o.clients, o.seconds))?;
            let b = rt.block_on(spread(&ports, o.clients, o.seconds))?;
            println!(
                "cluster round {round}: one instance {:.0} pops/s p99 {:.1} ms; three instances {:.0} pops/s p99 {:.1} ms",
                a.ops_per_sec,
                a.p99_us / 1e3,
                b.ops_per_sec,
                b.p99_us / 1e3
            );
            one.push(a);
            three.push(b);
        }
        let (one, three) = (median_figure(&one), median_figure(&three));
        println!(
            "cluster pops, median of {} rounds, {} clients: one instance {:.0}/s (p99 {:.1} ms), three instances {:.0}/s (p99 {:.1} ms): {:.2}× the throughput, p99 {:.2}×",
            o.rounds,
            o.clients,
            one.ops_per_sec,
            one.p99_us / 1e3,
            three.ops_per_sec,
            three.p99_us / 1e3,
            three.ops_per_sec / one.ops_per_sec,
            three.p99_us / one.p99_us
        );

        let mut takeovers = Vec::new();
        for kill in 0..o.kills {
            let owner = boefje_owner(db)?;
            let at = instances
                .iter()
                .position(|i| i.port == owner)
                .ok_or("the owner is none of the instances")?;
            let victim = instances.remove(at);
            let survivors: Vec<u16> = instances.iter().map(|i| i.port).collect();
            let killed = Instant::now();
            kill_9(victim)?;
            rt.block_on(until_served(&survivors))?;
            let took = killed.elapsed();
            println!("cluster kill {kill}: boefje served again after {took:.2?}");
            takeovers.push(took.as_secs_f64());
            instances.push(spawn(db)?);
        }
        let max = takeovers.iter().copied().fold(0.0, f64::max);
        let med = median(takeovers.clone());
        println!(
            "cluster takeover after SIGKILL of the owner, {} kills, default lease: median {med:.2} s, max {max:.2} s",
            o.kills
        );
        for i in instances {
            stop_broker(i)?;
        }
        Ok(format!(
            "cluster_one_pops={:.0} cluster_three_pops={:.0} cluster_p99_ratio={:.2} takeover_median_s={med:.2} takeover_max_s={max:.2}",
            one.ops_per_sec,
            three.ops_per_sec,
            three.p99_us / one.p99_us
        ))
    })
}
