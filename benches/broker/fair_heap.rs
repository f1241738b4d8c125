//! `--fairness`, in the heap alone: what the turns cost a runner's filtered pop, with no HTTP and
//! no database between, so the figure is the engine thread's own work (find the task, take it
//! out, put a new one in to hold the depth).
//!
//! A heap of `--tasks` boefje tasks (default 1e6) shaped as the `--workers` seed: 50
//! organisations, 30 boefjes, 10 images, random automatic priorities. Pops ask for one image
//! each, as the boefje runner does, in two streams:
//! - `random`: each pop asks for an image at random;
//! - `rotating`: pop k asks for image k mod 10. With 50 organisations served in turn, each
//!   organisation is then always asked for the same image, so its other images pile up at the
//!   front of its own order: the case in which a fair pop that walked an organisation's tasks
//!   to the first of the image would walk thousands.
//!
//! Each round builds one heap with organisations taking turns and one in priority order alone
//! (the order alternating between rounds) and runs both streams on each; the medians of the
//! rounds in µs per pop, and fair ÷ strict.

use std::time::Instant;

use chrono::DateTime;
use kat_scheduler::domain::SchedulerId;
use kat_scheduler::domain::filter::plan::{Plan, plan};
use kat_scheduler::domain::filter::{FilterNode, parse_request};
use kat_scheduler::domain::keys::DataKeys;
use kat_scheduler::queue::fair::{FairShare, Fairness, Weights};
use kat_scheduler::queue::heap::{HeapTask, SchedulerHeap};
use uuid::Uuid;

use super::harness::stats::{median, thousands};
use super::{Options, Result};

const ORGS: u64 = 50;
const BOEFJES: u64 = 30;
const IMAGES: u64 = 10;
/// Pops per stream per round.
const POPS: usize = 100_000;

/// A deterministic xorshift, so both modes see the same tasks and the same asks.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn task(seq: u64, priority: i64) -> HeapTask {
    let id = Uuid::new_v4();
    let at = DateTime::from_timestamp_micros(1_700_000_000_000_000 + seq as i64)
        .unwrap_or_default()
        .naive_utc();
    let k = seq;
    HeapTask {
        id,
        priority,
        created_at: at,
        modified_at: at,
        hash: Some(format!("{:032x}", id.as_u128())),
        schedule_id: None,
        organisation: format!("org{}", (k / BOEFJES) % ORGS),
        data_keys: DataKeys {
            plugin_id: Some(format!("b{}", k % BOEFJES)),
            oci_image: Some(image(k % BOEFJES % IMAGES)),
            input_ooi: Some(format!("Hostname|internet|host{seq}.example.com")),
            deduplication_key: None,
        },
    }
}

fn image(i: u64) -> String {
    format!("ghcr.io/minvws/openkat/img{i}:latest")
}

fn image_filters() -> Result<Vec<(FilterNode, Plan)>> {
    (0..IMAGES)
        .map(|i| {
            let f = parse_request(&serde_json::json!({"filters": [{
                "column": "data", "field": "boefje__oci_image", "operator": "in",
                "value": [image(i)]}]}))
            .map_err(|e| format!("{e:?}"))?;
            let p = plan(&f, SchedulerId::Boefje);
            Ok((f, p))
        })
        .collect()
}

/// µs per pop of each stream (`random`, `rotating`) on a fresh heap of `n`.
fn run_mode(n: usize, fair: bool, filters: &[(FilterNode, Plan)]) -> Result<[f64; 2]> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut b = SchedulerHeap::builder(SchedulerId::Boefje, n * 2, n);
    for s in 0..n as u64 {
        b.push(task(s, 2 + (rng.next() % 1000) as i64));
    }
    let mode = if fair {
        Fairness::Organisation
    } else {
        Fairness::Off
    };
    let mut heap = b
        .finish()
        .with_fairness(FairShare::new(mode, Weights::default()));
    let admit = |_: &Uuid| true;
    let mut seq = n as u64;
    let mut out = [0.0; 2];
    for (stream, slot) in out.iter_mut().enumerate() {
        let start = Instant::now();
        for k in 0..POPS {
            let i = if stream == 0 {
                (rng.next() % IMAGES) as usize
            } else {
                k % IMAGES as usize
            };
            let (f, p) = &filters[i];
            // The engine's choice (queue/engine/pop.rs) for a filter the heap can answer.
            let found = if fair && !heap.user_waits() {
                heap.fair_match(f, p, &admit)
                    .or_else(|| heap.first_admitted(f, p, &admit))
            } else {
                heap.first_admitted(f, p, &admit)
            };
            let id = found.ok_or("a pop found nothing in a full heap")?;
            heap.take(&id)
                .ok_or("the popped task was not in the heap")?;
            heap.insert(task(seq, 2 + (rng.next() % 1000) as i64));
            seq += 1;
        }
        *slot = start.elapsed().as_secs_f64() * 1e6 / POPS as f64;
    }
    Ok(out)
}

/// Fair against strict image pops in the heap alone.
pub fn run_fair_heap(o: &Options) -> Result<String> {
    let n = o.tasks;
    println!(
        "fairness in the heap alone: {} boefje tasks (50 organisations, 10 images), {} image pops per stream, {} rounds",
        thousands(n),
        thousands(POPS),
        o.rounds
    );
    let filters = image_filters()?;
    let (mut fair, mut strict) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    for round in 0..o.rounds {
        for on in [round % 2 == 0, round % 2 != 0] {
            let us = run_mode(n, on, &filters)?;
            let into = if on { &mut fair } else { &mut strict };
            for (v, x) in into.iter_mut().zip(us) {
                v.push(x);
            }
        }
    }
    let mut kv = Vec::new();
    for (i, name) in ["random", "rotating"].iter().enumerate() {
        let f = median(fair[i].clone());
        let s = median(strict[i].clone());
        println!(
            "image pops, {name:<8} asks: fair {f:6.2} µs/pop, strict {s:6.2} µs/pop: fair ÷ strict {:.2}",
            f / s
        );
        kv.push(format!("fair_heap_{name}_us={f:.2}"));
        kv.push(format!("strict_heap_{name}_us={s:.2}"));
        kv.push(format!("fair_heap_{name}_ratio={:.3}", f / s));
    }
    println!();
    Ok(kv.join(" "))
}
