//! `--pushes`: durable pushes of new tasks at `--clients` HTTP clients (default 64) against
//! single-row `INSERT` commits at `--pg-clients` connections (default 8) on the same server, in
//! alternating rounds; the figure is the ratio of the medians.
//!
//! The pushes are the default run's (`full_load.rs`): new work each, spread over the three
//! schedulers, so boefje and report pushes also get mula's schedule of their hash; every
//! acknowledged push must be in the table afterwards. The heap has room for all of them (the
//! backlog's own cost is `--pending`'s). Beside the ratio: how many pushes the engines grouped
//! per transaction, and a third side, PostgreSQL alone writing the same pushes with the broker's
//! own statement at the batch size the engines just ran with, on three connections, no HTTP
//! (`harness/pg_alone.rs`): the bound of any build of the broker on this server. The sides take
//! turns going first: round r starts with side r % 3 of broker, INSERT commits, PostgreSQL alone.

use std::collections::HashSet;

use super::harness::baseline::{baseline, seed_baseline};
use super::harness::http::{Op, current_thread, engine_counters, engine_delta, http_load};
use super::harness::instance::{start_broker, stop_broker};
use super::harness::pg_alone;
use super::harness::postgres::{count_stored, machine, with_db};
use super::harness::stats::{Figure, median, median_figure};
use super::{Options, Result};

pub fn run_pushes(o: &Options, base: &str) -> Result<String> {
    with_db(o, base, "_pushes", |db| {
        println!(
            "pushes: {} HTTP clients pushing new tasks against {} connections of single-row INSERT commits, {} rounds of {} s",
            o.clients, o.pg_clients, o.rounds, o.seconds
        );
        println!("{}", machine(db)?);
        seed_baseline(db, 1_000)?;
        let broker = start_broker(db, 10_000_000)?;
        let rt = current_thread()?;
        let mut broker_figs = Vec::new();
        let mut insert_figs = Vec::new();
        let mut alone = Vec::new();
        let mut batch = Vec::new();
        let mut acked = Vec::new();
        for round in 0..o.rounds {
            eprintln!("round {}/{}…", round + 1, o.rounds);
            for turn in 0..3 {
                let side = (round + turn) % 3;
                if side == 2 {
                    // At the batch size the engines ran with so far (10 before any).
                    let size = match batch.is_empty() {
                        true => 10.0,
                        false => median(batch.clone()),
                    };
                    alone.push(pg_alone::pushes(
                        db,
                        3,
                        size.round().max(1.0) as usize,
                        o.seconds,
                        true,
                    )?);
                } else if side == 0 {
                    let before = rt.block_on(engine_counters(broker.port))?;
                    let (f, r) = rt.block_on(http_load(
                        broker.port,
                        o.clients,
                        o.seconds,
                        None,
                        Op::Push,
                        round,
                    ))?;
                    batch.push(engine_delta(before, rt.block_on(engine_counters(broker.port))?)[0]);
                    acked.extend(r.ids);
                    broker_figs.push(f);
                } else {
                    insert_figs.push(baseline(db, o.pg_clients, o.seconds, None, "insert")?);
                }
            }
        }
        stop_broker(broker)?;
        let unique: HashSet<&String> = acked.iter().collect();
        let stored = count_stored(db, &acked)?;
        if stored != unique.len() {
            return Err(format!(
                "{} acknowledged pushes, {stored} of them stored",
                unique.len()
            )
            .into());
        }
        let b: Figure = median_figure(&broker_figs);
        let l: Figure = median_figure(&insert_figs);
        let ratio = b.ops_per_sec / l.ops_per_sec;
        let per_tx = median(batch);
        let alone = median(alone);
        println!();
        println!(
            "{:<44} {:>12} {:>10} {:>10}",
            "measure (median of rounds)", "ops/s", "p50 µs", "p99 µs"
        );
        for (name, f) in [
            ("broker push (new task)", b),
            ("baseline single-row INSERT commit", l),
        ] {
            println!(
                "{name:<44} {:>12.0} {:>10.0} {:>10.0}",
                f.ops_per_sec, f.p50_us, f.p99_us
            );
        }
        println!(
            "{:<44} {alone:>12.0}",
            "PostgreSQL alone, the broker's push statement"
        );
        println!(
            "pushes ÷ INSERT commits: {ratio:.2} (target ≥ 1.5); {per_tx:.1} pushes per engine transaction; {} acknowledged pushes, all stored",
            unique.len()
        );
        println!(
            "PostgreSQL alone ÷ INSERT commits: {:.2}; pushes ÷ PostgreSQL alone: {:.2}",
            alone / l.ops_per_sec,
            b.ops_per_sec / alone
        );
        Ok(format!(
            "pushes_per_s={:.0} inserts_per_s={:.0} push_insert_ratio={ratio:.3} pushes_per_transaction={per_tx:.1} pg_alone_pushes_per_s={alone:.0} pg_alone_insert_ratio={:.3}",
            b.ops_per_sec,
            l.ops_per_sec,
            alone / l.ops_per_sec
        ))
    })
}
