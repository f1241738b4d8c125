//! A picture of a day: a synthetic day replayed against the real service in process, on a
//! `ManualClock` advanced a minute per step, twice on the same seed and workload: **strict**
//! (`fairness = off` on boefje and normalizer, priority order alone) and **fair**
//! (`organisation`, turns), each on a PostgreSQL database of its own (dropped afterwards). Both
//! runs are held by the same limits (`boefje.id=shodan:10/60` rate, `host=*:2` concurrency).
//!
//! ```sh
//! cargo bench --bench simulate                  # a day of 1,440 minutes, 8,000 + 3 × 800 + 10 × 50 objects
//! cargo bench --bench simulate -- --quick       # a shorter, smaller day for a smoke run
//! cargo bench --bench simulate -- --seed 7 --out /tmp/day
//! ```
//!
//! Options: `--orgs SPEC` (objects per organisation, `SIZE` or `SIZExCOUNT`, comma-separated;
//! default `8000,800x3,50x10`), `--minutes M` (default 1440), `--workers W` (boefje runners,
//! default 80; a quarter as many normalizer runners beside them), `--seed S` (default 1),
//! `--out DIR` (the SVG figures, default `docs/scheduling`), `--pg URL` (a maintenance database;
//! the run creates and drops its own), `--keep` (keep the databases), `--quick` (`--minutes 480
//! --orgs 4000,200x3,20x10 --workers 60` unless given).
//!
//! The day (`simulate/workload.rs`): the largest organisation's ColdStart-like burst at a
//! quarter of the day, object mutations for all, user scans, cron schedules; the runners and
//! what each minute records (`simulate/day.rs`); the service in process and its crash and restart
//! (`simulate/service.rs`); the figures printed and drawn (`simulate/figures.rs`,
//! `simulate/plot.rs`).

#[path = "simulate/day.rs"]
mod day;
#[path = "simulate/figures.rs"]
mod figures;
#[path = "simulate/plot.rs"]
mod plot;
#[path = "simulate/service.rs"]
mod service;
#[path = "simulate/workload.rs"]
mod workload;

use std::path::PathBuf;

use chrono::{TimeZone, Utc};
use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection};

type Error = Box<dyn std::error::Error + Send + Sync>;
type Result<T> = std::result::Result<T, Error>;

struct Options {
    orgs: Option<String>,
    minutes: Option<usize>,
    workers: Option<usize>,
    seed: u64,
    out: PathBuf,
    pg: String,
    keep: bool,
    quick: bool,
}

fn options() -> Result<Options> {
    let mut o = Options {
        orgs: None,
        minutes: None,
        workers: None,
        seed: 1,
        out: PathBuf::from("docs/scheduling"),
        pg: std::env::var("KAT_TEST_PG_URL")
            .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/postgres".into()),
        keep: false,
        quick: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--orgs" => o.orgs = Some(value()?),
            "--minutes" => o.minutes = Some(value()?.replace('_', "").parse()?),
            "--workers" => o.workers = Some(value()?.parse()?),
            "--seed" => o.seed = value()?.parse()?,
            "--out" => o.out = PathBuf::from(value()?),
            "--pg" => o.pg = value()?,
            "--keep" => o.keep = true,
            "--quick" => o.quick = true,
            "--bench" => {} // cargo bench passes this
            other => {
                return Err(format!(
                    "unknown option {other}; see the header of benches/simulate.rs"
                )
                .into());
            }
        }
    }
    Ok(o)
}

/// A database of the run's own on the server of `admin`; answers its URL.
fn create_db(admin: &str, name: &str) -> Result<String> {
    let mut conn = PgConnection::establish(admin)
        .map_err(|e| format!("PostgreSQL at {admin} is needed (--pg URL): {e}"))?;
    conn.batch_execute(&format!("CREATE DATABASE {name}"))?;
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(admin);
    Ok(format!("{base}/{name}"))
}

fn drop_db(admin: &str, name: &str) -> Result<()> {
    let mut conn = PgConnection::establish(admin)?;
    // FORCE: the service's pool may still hold a connection for a moment after it stopped.
    conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))?;
    Ok(())
}

fn main() -> Result<()> {
    let o = options()?;
    let (orgs, minutes, workers) = match o.quick {
        true => ("4000,200x3,20x10", 480, 60),
        false => ("8000,800x3,50x10", 1_440, 80),
    };
    let orgs = workload::orgs(o.orgs.as_deref().unwrap_or(orgs))?;
    let minutes = o.minutes.unwrap_or(minutes).max(60);
    let workers = o.workers.unwrap_or(workers).max(1);
    let day = workload::draw(orgs, minutes, o.seed);
    let pushed: usize = day.pushes.iter().map(Vec::len).sum();
    println!(
        "kat-scheduler day simulation: {} organisations ({}), {minutes} minutes, {} boefje pushes ({} in the burst at minute {}), {} schedules, {workers} boefje runners ({} filtered) and {} normalizer runners, seed {}",
        day.orgs.len(),
        day.orgs
            .iter()
            .map(|o| o.objects.to_string())
            .collect::<Vec<_>>()
            .join(","),
        pushed,
        day.pushes[day.burst.0..day.burst.0 + day.burst.1]
            .iter()
            .flatten()
            .filter(|p| day.orgs[p.org].class == workload::Class::Large && !p.user)
            .count(),
        day.burst.0,
        day.schedules.len(),
        workers * 3 / 10,
        workers / 4,
        o.seed
    );
    let dir = tempfile::tempdir()?;
    let catalogue = dir.path().join("catalogue.toml");
    std::fs::write(&catalogue, day::catalogue())?;
    let start = Utc
        .with_ymd_and_hms(2027, 3, 1, 0, 0, 0)
        .single()
        .ok_or("a start time")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut records = Vec::new();
    for mode in day::MODES {
        let name = format!("kat_sim_{}_{}", mode.name, uuid::Uuid::new_v4().simple());
        let db = create_db(&o.pg, &name)?;
        let began = std::time::Instant::now();
        let record = runtime.block_on(day::run(
            &day, o.seed, workers, &db, &catalogue, mode, start,
        ));
        if o.keep {
            eprintln!("kept database {name}");
        } else {
            drop_db(&o.pg, &name)?;
        }
        let record = record?;
        eprintln!(
            "  {}: {:.0} s of wall time",
            mode.name,
            began.elapsed().as_secs_f64()
        );
        records.push((mode, record));
    }
    figures::print(&day, &records);
    std::fs::create_dir_all(&o.out)?;
    plot::draw_all(&day, &records, &o.out)?;
    println!("figures written to {}", o.out.display());
    Ok(())
}
