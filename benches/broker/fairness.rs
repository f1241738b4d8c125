//! `--fairness`: one organisation's flood against ten quiet ones (docs/SCHEDULING.md).
//!
//! Share: `--flood F` automatic boefje tasks of organisation `big` (default 9,000), then ten quiet
//! organisations' `F / 90` each (default 100), all at random automatic priorities (2–1,001), the
//! flood older; a fresh database per mode, seeded in the table and loaded by the broker's heap
//! rebuild. One client pops the first 1.1 × the quiet tasks (default 1,100) unfiltered, one at a
//! time, and counts whose they are: with fairness `off` (priority order) and `organisation`
//! (turns), in the same run.
//!
//! Cost: pops per second with `--clients` connections (default 64) draining the first 80 % of
//! the same backlog, held once by `big` alone and once by the eleven, fairness on, in alternating
//! rounds (`--rounds`, each on fresh databases); the median of each and their ratio (target: the
//! eleven at no less than 0.8× the one).
//!
//! Checks: every pop answered a task (no empty answer while work waits), no task twice.

use std::collections::HashSet;
use std::time::Instant;

use super::harness::http::{Http, pop_request, send_all};
use super::harness::instance::{start_broker_env, stop_broker};
use super::harness::postgres::{extra_columns, extra_sql, fill_queue, machine, pg_exec, with_db};
use super::harness::stats::{median, thousands};
use super::{Options, Result};

/// Quiet organisations.
const QUIET: usize = 10;

/// Seeds `flood` tasks of `big` (older), then `quiet` tasks spread over the quiet organisations
/// (or, with `one_org`, all of them `big`'s).
fn seed(db: &str, flood: usize, quiet: usize, one_org: bool) -> Result<()> {
    let cols = extra_columns(db)?;
    let (names, values) = extra_sql(&cols);
    let n = flood + quiet;
    let org = if one_org {
        "'big'".to_owned()
    } else {
        format!("CASE WHEN g <= {flood} THEN 'big' ELSE 'quiet' || ((g - {flood}) % {QUIET}) END")
    };
    pg_exec(
        db,
        &format!(
            "INSERT INTO tasks (id, scheduler_id, schedule_id, organisation, type, hash, priority, data,
               status, attempts, created_at, modified_at{names})
             SELECT t.id, t.s, NULL, t.org, t.s, md5(t.id), t.priority,
               json_build_object('boefje', json_build_object('id', t.boefje, 'oci_image', t.image),
                 'input_ooi', t.ooi, 'organization', t.org, 'id', t.id)::text,
               'queued', 0, t.created, t.created{values}
             FROM (SELECT g, gen_random_uuid()::text AS id, 'boefje' AS s, {org} AS org,
                          'b' || (g % 30) AS boefje,
                          'ghcr.io/minvws/openkat/img' || (g % 10) || ':latest' AS image,
                          'Hostname|internet|host' || g || '.example.com' AS ooi,
                          2 + floor(random() * 1000)::bigint AS priority,
                          (now() AT TIME ZONE 'utc') - make_interval(secs => ({n} - g) / 1000.0) AS created
                   FROM generate_series(1, {n}) g) t"
        ),
    )?;
    pg_exec(db, "VACUUM ANALYZE tasks")?;
    fill_queue(db)
}

/// The organisation of a pop's answer, if it has a task.
fn popped_org(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let at = text.find("\"organisation\":\"")? + 16;
    let len = text.get(at..)?.find('"')?;
    text.get(at..at + len).map(str::to_owned)
}

/// A broker on a fresh database seeded as [`seed`] says, with `fairness`.
fn with_broker<T>(
    o: &Options,
    base: &str,
    suffix: &str,
    (flood, quiet, one_org): (usize, usize, bool),
    fairness: &str,
    f: impl FnOnce(u16) -> Result<T>,
) -> Result<T> {
    with_db(o, base, suffix, |db| {
        let env = [("SCHEDULER_BOEFJE_FAIRNESS", fairness)];
        // A first start creates the schema.
        stop_broker(start_broker_env(db, 1_000_000, &env)?)?;
        seed(db, flood, quiet, one_org)?;
        let broker = start_broker_env(db, 1_000_000, &env)?;
        let out = f(broker.port);
        stop_broker(broker)?;
        out
    })
}

/// The organisations of `n` unfiltered pops, one at a time.
fn first_pops(port: u16, n: usize) -> Result<Vec<String>> {
    super::harness::http::current_thread()?.block_on(async {
        let mut http = Http::connect(port).await?;
        let pop = pop_request("boefje");
        let mut body = Vec::new();
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let status = http.call(&pop, &mut body).await?;
            if status != 200 {
                return Err(format!("pop answered {status}").into());
            }
            out.push(popped_org(&body).ok_or("an empty answer while work waits")?);
        }
        Ok(out)
    })
}

/// Pops per second of `pops` unfiltered pops over `clients` connections.
fn drain(port: u16, clients: usize, pops: usize) -> Result<f64> {
    super::harness::http::current_thread()?.block_on(async {
        let requests = vec![pop_request("boefje"); pops];
        let start = Instant::now();
        let ids = send_all(port, clients, requests, 200).await?;
        let rate = pops as f64 / start.elapsed().as_secs_f64();
        let distinct: HashSet<&String> = ids.iter().collect();
        if ids.len() != pops || distinct.len() != pops {
            return Err(format!(
                "{} pops answered {} tasks, {} distinct",
                pops,
                ids.len(),
                distinct.len()
            )
            .into());
        }
        Ok(rate)
    })
}

/// The share and cost of fair pops.
pub fn run_fairness(o: &Options, base: &str) -> Result<String> {
    let flood = o.flood;
    let quiet = (flood / 90).max(1) * QUIET;
    let first = quiet + quiet / QUIET;
    println!(
        "kat-scheduler benchmark, fairness: {} tasks of one organisation, then {} of ten quiet ones; {} rounds, {} clients",
        thousands(flood),
        thousands(quiet),
        o.rounds,
        o.clients
    );
    println!("{}", machine(&o.pg)?);
    let mut kv = Vec::new();
    let mut shares = Vec::new();
    for mode in ["off", "organisation"] {
        let orgs = with_broker(
            o,
            base,
            &format!("_f{mode}"),
            (flood, quiet, false),
            mode,
            |port| first_pops(port, first),
        )?;
        let share = orgs.iter().filter(|x| x.starts_with("quiet")).count() as f64 / first as f64;
        println!(
            "fairness {mode:<12}: the quiet organisations had {:5.1} % of the first {} pops",
            share * 100.0,
            thousands(first)
        );
        kv.push(format!("fair_{mode}_quiet_share={share:.3}"));
        shares.push(share);
    }
    let pops = (flood + quiet) * 8 / 10;
    let (mut one, mut eleven) = (Vec::new(), Vec::new());
    for round in 0..o.rounds {
        let order: [bool; 2] = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for one_org in order {
            let rate = with_broker(
                o,
                base,
                if one_org { "_fone" } else { "_feleven" },
                (flood, quiet, one_org),
                "organisation",
                |port| drain(port, o.clients, pops),
            )?;
            if one_org {
                one.push(rate);
            } else {
                eleven.push(rate);
            }
        }
    }
    let (one, eleven) = (median(one), median(eleven));
    let ratio = eleven / one;
    println!(
        "pops/s over {} pops, fairness on: backlog of one organisation {one:.0}, of eleven {eleven:.0}: {ratio:.2}× (target ≥ 0.8)",
        thousands(pops)
    );
    println!("checks: no empty answer while work waited, no task popped twice");
    kv.push(format!("fair_pops_one_org={one:.0}"));
    kv.push(format!("fair_pops_eleven_orgs={eleven:.0}"));
    kv.push(format!("fair_pops_ratio={ratio:.3}"));
    println!();
    Ok(kv.join(" "))
}
