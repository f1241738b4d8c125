//! `--workers`: the pops real workers send, at several depths. For each depth D, a database and
//! broker of its own with D queued boefje tasks (and D/10 normalizer and D/10 report tasks), and
//! D rows in the baseline queue. Each round measures, in an order reversed every other round,
//! with 64 clients on `POST /schedulers/boefje/pop?limit=1` and the body the boefje runner sends
//! (`Content-Type: application/json`):
//! - unfiltered: no body;
//! - one image of ten: `{"filters": [{"column": "data", "field": "boefje__oci_image", "operator":
//!   "in", "value": ["<image>"]}]}`, client c asking for image c % 10;
//! - two boefje ids of thirty: `{"filters": [{"column": "data", "field": "boefje__id",
//!   "operator": "in", "value": ["b4", "b5"]}]}`, client c asking for the pair c % 15;
//! - one organisation of fifty: `{"filters": [{"column": "organisation", "operator": "==",
//!   "value": "org7"}]}`, client c asking for org c % 50;
//! - the fleet: each client pops with its image filter, then `PATCH /tasks/{id}` `running`, then
//!   `completed`, while 1 client in 8 pushes a new boefje task for each completed one (as far as
//!   it keeps up);
//! - the SKIP LOCKED baseline's pop (8 connections).
//!
//! The depth is held (see `harness/worker_pops.rs`). Reported per body: pops/s, p50, p99, the
//! ratio to the unfiltered pop and to the baseline in the same run; at the end, pops/s at the
//! largest depth ÷ pops/s at the smallest, per body. Checks: no task popped twice within a burst,
//! every popped task matches its filter, every acknowledged push is stored, and at the end the
//! table holds D waiting boefje tasks, none dispatched or running, and one completed task per
//! fleet cycle.
//!
//! How long (this project's 2 shared CPUs, today's engine, where a filtered pop is an SQL
//! statement over the backlog and runs at a few hundred a second): `--workers --depths 10000
//! --seconds 1` about 40 s; each depth at the default 3 rounds of 5 s about 2–4 minutes plus its
//! seeding (1e6: about a minute to seed 1.2M tasks and 1M baseline rows). Putting popped tasks
//! back costs about as long again as popping them, so a faster engine makes the runs longer, not
//! shorter.

use std::time::Instant;

use super::harness::baseline::seed_baseline;
use super::harness::instance::{start_broker, stop_broker};
use super::harness::postgres::{
    BOEFJE_HEAVY, IMAGES, count_tasks, extra_columns, machine, seed_tasks, with_db,
};
use super::harness::stats::thousands;
use super::harness::worker_pops::{
    Body, BodyFigure, body_pairs, check_table, measure_bodies, print_bodies,
};
use super::{Options, Result};

/// `1e4` for 10,000; the number itself otherwise.
fn depth_label(n: usize) -> String {
    let mut k = 0;
    let mut m = n;
    while m >= 10 && m.is_multiple_of(10) {
        m /= 10;
        k += 1;
    }
    if m == 1 && k > 0 {
        format!("1e{k}")
    } else {
        n.to_string()
    }
}

struct DepthResult {
    depth: usize,
    figs: [BodyFigure; 5],
    wall_s: f64,
}

/// The worker pops at each depth, each on a database and broker of its own.
pub fn run_workers(o: &Options, base: &str) -> Result<String> {
    println!(
        "kat-scheduler benchmark, worker pops: depths {}, {} rounds of {} s, {} HTTP clients, {} baseline connections",
        o.depths
            .iter()
            .map(|d| thousands(*d))
            .collect::<Vec<_>>()
            .join(", "),
        o.rounds,
        o.seconds,
        o.clients,
        o.pg_clients
    );
    println!("{}", machine(&o.pg)?);
    let mut kv = Vec::new();
    let mut results = Vec::new();
    for &depth in &o.depths {
        let r = with_db(o, base, &format!("_w{}", depth_label(depth)), |db| {
            run_workers_depth(o, db, depth, &mut kv)
        })?;
        results.push(r);
    }
    if let (Some(first), Some(last)) = (results.first(), results.last())
        && results.len() > 1
    {
        println!();
        println!(
            "pops/s at {} queued ÷ pops/s at {} queued (target ≥ 0.9 for each pop body):",
            thousands(last.depth),
            thousands(first.depth)
        );
        for body in Body::ALL {
            let i = body.index();
            let ratio = last.figs[i].pops.ops_per_sec / first.figs[i].pops.ops_per_sec;
            println!(
                "  {:<42} {:>10.0} → {:>10.0}   {ratio:.2}",
                body.label(),
                first.figs[i].pops.ops_per_sec,
                last.figs[i].pops.ops_per_sec
            );
            kv.push(format!("workers_{}_depth_ratio={ratio:.3}", body.key()));
        }
        kv.push(format!(
            "workers_depth_ratio_of={}/{}",
            depth_label(last.depth),
            depth_label(first.depth)
        ));
    }
    let worst = results
        .iter()
        .flat_map(|r| {
            let un = r.figs[Body::Unfiltered.index()].pops.ops_per_sec;
            [Body::Image, Body::BoefjeIds, Body::Organisation]
                .map(|b| r.figs[b.index()].pops.ops_per_sec / un)
        })
        .fold(f64::INFINITY, f64::min);
    println!("lowest filtered ÷ unfiltered pops/s over the depths: {worst:.2} (target ≥ 0.9)");
    kv.push(format!("workers_min_filtered_vs_unfiltered={worst:.3}"));
    for r in &results {
        kv.push(format!(
            "workers_{}_wall_s={:.0}",
            depth_label(r.depth),
            r.wall_s
        ));
    }
    println!();
    Ok(kv.join(" "))
}

fn run_workers_depth(
    o: &Options,
    db: &str,
    depth: usize,
    kv: &mut Vec<String>,
) -> Result<DepthResult> {
    let began = Instant::now();
    let maxsize = depth * 2 + 1_000_000;
    // A first start creates the schema; its columns decide what the seed fills.
    stop_broker(start_broker(db, maxsize)?)?;
    let cols = extra_columns(db)?;
    let rows = depth.div_ceil(IMAGES) * BOEFJE_HEAVY.len();
    eprintln!(
        "workers at {}: seeding {rows} tasks and {depth} baseline rows (extra columns: {})…",
        thousands(depth),
        if cols.is_empty() {
            "none".to_owned()
        } else {
            cols.join(", ")
        }
    );
    seed_tasks(db, rows, &BOEFJE_HEAVY, &cols)?;
    seed_baseline(db, depth)?;
    let boefje = count_tasks(db, "boefje", "'queued'")? as usize;
    let seed_s = began.elapsed().as_secs_f64();
    let broker = start_broker(db, maxsize)?;
    let rebuild_s = broker.rebuild_ms / 1000.0;
    // A burst pops at most a quarter of the queue before it is put back, so the depth stays
    // between 3/4 and all of the seeded one.
    let budget = (boefje / 4).max(o.clients * 8);
    let measured = measure_bodies(
        o,
        broker.port,
        budget,
        Some((db, (depth / 4).max(o.pg_clients * 8))),
        &format!("workers at {}", thousands(depth)),
    );
    stop_broker(broker)?;
    let (figs, base, acked, completed) = measured?;
    let checks = check_table(db, &acked, boefje, 0, completed)?;
    let wall_s = began.elapsed().as_secs_f64();
    println!();
    println!(
        "workers at {} queued boefje tasks ({} in the table with normalizer and report tasks): \
         {} rounds of {} s, {} clients; bursts of at most {} pops, each put back after",
        thousands(boefje),
        thousands(rows),
        o.rounds,
        o.seconds,
        o.clients,
        thousands(budget)
    );
    print_bodies(&figs, Some(base));
    let bursts: Vec<String> = Body::ALL
        .iter()
        .map(|b| format!("{} {}", b.key(), figs[b.index()].bursts))
        .collect();
    println!(
        "seeding {seed_s:.0} s, heap rebuild {rebuild_s:.2} s, {:.0} s in all; bursts per body over all rounds: {}",
        wall_s,
        bursts.join(", ")
    );
    println!(
        "checks: no task popped twice in a burst, every popped task matched its filter; {checks}"
    );
    let label = format!("workers_{}", depth_label(depth));
    kv.push(format!("{label}_queued={boefje}"));
    kv.extend(body_pairs(&label, &figs, Some(base)));
    Ok(DepthResult {
        depth,
        figs,
        wall_s,
    })
}
