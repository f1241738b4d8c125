//! `--parked`: what the listener's parked events cost as they pile up (a long outage of one
//! organisation's Katalogus), at each of `--parked-depths` parked events (default 0, 1e4 and
//! 1e5, on one database, never analysed, as a server without autovacuum leaves it):
//!
//! - **an idle tick**: the cron entry's claim when nothing is due (every parked event pushed
//!   back, as during the outage), which each scheduler's owner runs every tick;
//! - **the listener's read**: which of a batch's 100 objects have events parked (half of them
//!   do), once per batch of object events;
//! - **a claim of 100 due events** among them.
//!
//! Each is run `--rounds` × 100 times; medians in µs, and each depth's ratio to the empty table
//! in the same run. A cost that grows with the parked events would show as a ratio well
//! above 1.

use std::time::Instant;

use chrono::{Duration, NaiveDateTime};
use diesel::connection::SimpleConnection;
use kat_scheduler::listener::parked::object_key;
use kat_scheduler::storage::parked::{self, NewParked};
use kat_scheduler::storage::{self, AnyConnection};

use super::harness::postgres::{machine, with_db};
use super::harness::stats::{median, thousands};
use super::{Options, Result};

fn t(secs: i64) -> NaiveDateTime {
    chrono::DateTime::from_timestamp(1_800_000_000, 0)
        .unwrap_or_default()
        .naive_utc()
        + Duration::seconds(secs)
}

fn event(org: usize, object: usize, seq: i64) -> NewParked {
    let (org, reference) = (
        format!("org{org}"),
        format!("Hostname|internet|h{object}.nl"),
    );
    NewParked {
        id: uuid::Uuid::new_v4().to_string(),
        source: "mutations",
        seq,
        object_key: Some(object_key(&org, &reference)),
        body: format!(
            r#"{{"operation": "update", "primary_key": "{reference}", "client_id": "{org}", "value": {{"object_type": "Hostname", "scan_profile": {{"level": 2}}}}}}"#
        ),
        organisation: org,
        reason: "the plugin catalogue is unavailable: Katalogus answered 500".into(),
    }
}

/// Median µs of `reps` runs of `f`.
fn timed(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut us = Vec::with_capacity(reps);
    for _ in 0..reps {
        let started = Instant::now();
        f()?;
        us.push(started.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median(us))
}

/// The three figures at the table's depth now.
fn measure(c: &mut AnyConnection, reps: usize, depth: usize) -> Result<[f64; 3]> {
    let now = t(0);
    let until = now + Duration::minutes(5);
    let idle = timed(reps, || {
        let got = parked::claim(c, "mutations", now, until, 100)?;
        if !got.is_empty() {
            return Err("an idle claim took events".into());
        }
        Ok(())
    })?;
    // Half of the batch's objects have events parked (when any are), half do not.
    let keys: Vec<String> = (0..100)
        .map(|i| {
            let object = if i % 2 == 0 { i * 7 } else { 10_000_000 + i };
            object_key(
                &format!("org{}", object % 50),
                &format!("Hostname|internet|h{object}.nl"),
            )
        })
        .collect();
    let read = timed(reps, || {
        let found = parked::parked_objects(c, &keys)?;
        if depth > 1_000 && found.len() != 50 {
            return Err(format!(
                "{} of the batch's objects found parked, not 50",
                found.len()
            )
            .into());
        }
        Ok(())
    })?;
    // 100 events due, of objects of their own; claimed, then let go again (not timed).
    let due: Vec<NewParked> = (0..100)
        .map(|i| event(i % 50, 20_000_000 + i, 9_000_000_000 + i as i64))
        .collect();
    parked::park(c, &due, t(-60), t(-1))?;
    let mut claims = Vec::with_capacity(reps);
    for _ in 0..reps {
        let started = Instant::now();
        let got = parked::claim(c, "mutations", now, until, 100)?;
        claims.push(started.elapsed().as_secs_f64() * 1e6);
        if got.len() != 100 {
            return Err(format!("a claim of 100 due took {}", got.len()).into());
        }
        c.batch_execute("UPDATE listener_parked SET claimed_until = NULL WHERE seq >= 9000000000")?;
    }
    c.batch_execute("DELETE FROM listener_parked WHERE seq >= 9000000000")?;
    Ok([idle, read, median(claims)])
}

pub fn run_parked(o: &Options, base: &str) -> Result<String> {
    let reps = o.rounds * 100;
    println!(
        "parked: an idle tick's claim, the listener's read of a batch's 100 objects, a claim of 100 due; at {} parked events, {reps} runs each",
        o.parked_depths
            .iter()
            .map(|d| thousands(*d))
            .collect::<Vec<_>>()
            .join(", ")
    );
    with_db(o, base, "_parked", |db| {
        println!("{}", machine(db)?);
        let target = storage::DbTarget::parse(db)?;
        let pool = storage::connect(&target, 1, std::time::Duration::from_secs(5))?;
        let mut conn = storage::checkout(&pool)?;
        storage::run_migrations(&mut conn)?;
        let mut seeded = 0usize;
        let mut rows: Vec<(usize, [f64; 3])> = Vec::new();
        for &depth in &o.parked_depths {
            // Parked during the outage, every one pushed back an hour: none due now.
            while seeded < depth {
                let chunk: Vec<NewParked> = (seeded..depth.min(seeded + 1_000))
                    .map(|i| event(i % 50, i, i as i64))
                    .collect();
                parked::park(&mut conn, &chunk, t(-3_600), t(3_600))?;
                seeded += chunk.len();
            }
            rows.push((depth, measure(&mut conn, reps, depth)?));
        }
        let base_row = rows.first().map(|r| r.1).unwrap_or([1.0; 3]);
        println!(
            "  parked events | idle tick µs | listener read µs | claim of 100 due µs | ratios to {}",
            thousands(rows.first().map_or(0, |r| r.0))
        );
        let mut line = Vec::new();
        for (depth, [idle, read, claim]) in &rows {
            println!(
                "  {:>13} | {idle:>12.0} | {read:>16.0} | {claim:>19.0} | {:.2} / {:.2} / {:.2}",
                thousands(*depth),
                idle / base_row[0],
                read / base_row[1],
                claim / base_row[2]
            );
            line.push(format!(
                "parked{depth}_idle_us={idle:.0} parked{depth}_read_us={read:.0} parked{depth}_claim_us={claim:.0}"
            ));
        }
        Ok(line.join(" "))
    })
}
