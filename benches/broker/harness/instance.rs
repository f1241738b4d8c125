//! The broker under test: its release binary started on a database with its heap bound, the
//! port and heap rebuild time read from its JSON log, its resident memory, a clean stop.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::Result;

pub struct Broker {
    pub child: Child,
    pub port: u16,
    pub rebuild_ms: f64,
    /// What the heaps hold on the allocator's heap after the rebuild, summed over the schedulers
    /// (from the rebuild's log lines; NaN for a build that does not log it).
    pub heap_bytes: f64,
    pub ready_after: Duration,
}

pub fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or("no VmRSS")?;
    Ok(kb * 1024)
}

/// The broker binary the scenarios start: this build's, or the one `KAT_BENCH_BIN` names (an
/// earlier build measured by the same harness, for a before-and-after of a change).
fn broker_bin() -> String {
    std::env::var("KAT_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_kat-scheduler").into())
}

/// Starts the release binary on `db` and waits until it listens; reads its JSON log for the port
/// and the heap rebuild time.
pub fn start_broker(db: &str, maxsize: usize) -> Result<Broker> {
    start_broker_bin(&broker_bin(), db, maxsize)
}

/// [`start_broker`] with another build of the broker (`--vs`).
pub fn start_broker_bin(bin: &str, db: &str, maxsize: usize) -> Result<Broker> {
    start_broker_with(bin, db, maxsize, &[])
}

/// [`start_broker`] with settings of its own in the environment (`env`: name, value).
pub fn start_broker_env(db: &str, maxsize: usize, env: &[(&str, &str)]) -> Result<Broker> {
    start_broker_with(&broker_bin(), db, maxsize, env)
}

fn start_broker_with(bin: &str, db: &str, maxsize: usize, env: &[(&str, &str)]) -> Result<Broker> {
    let started = Instant::now();
    let mut child = Command::new(bin)
        .envs(env.iter().copied())
        .env("SCHEDULER_DB_URI", db)
        .env("SCHEDULER_API_HOST", "127.0.0.1")
        .env("SCHEDULER_API_PORT", "0")
        .env("SCHEDULER_LOGGING_FORMAT", "json")
        .env("SCHEDULER_LOG_LEVEL", "info")
        .env("SCHEDULER_PQ_MAXSIZE", maxsize.to_string())
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr)
            .lines()
            .map_while(std::result::Result::ok)
        {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let msg = v["message"].as_str().unwrap_or_default();
            if msg.starts_with("heaps rebuilt") {
                let _ = tx.send((
                    "rebuild",
                    v["duration_ms"].as_f64().unwrap_or(f64::NAN).to_string(),
                ));
                let _ = tx.send((
                    "heap_bytes",
                    v["heap_bytes"].as_f64().unwrap_or(f64::NAN).to_string(),
                ));
            } else if msg == "listening" {
                let _ = tx.send((
                    "listening",
                    v["address"].as_str().unwrap_or_default().to_owned(),
                ));
            } else if v["level"] == "ERROR" || v["level"] == "WARN" {
                eprintln!("broker: {line}");
            }
        }
    });
    let mut rebuild_ms = f64::NAN;
    let mut heap_bytes = 0.0;
    loop {
        let (kind, value) = rx
            .recv_timeout(Duration::from_secs(600))
            .map_err(|_| "the broker did not start (see its log above)")?;
        match kind {
            "rebuild" => rebuild_ms = value.parse().unwrap_or(f64::NAN),
            "heap_bytes" => heap_bytes += value.parse().unwrap_or(f64::NAN),
            _ => {
                let port = value.rsplit(':').next().ok_or("no port")?.parse()?;
                return Ok(Broker {
                    child,
                    port,
                    rebuild_ms,
                    heap_bytes,
                    ready_after: started.elapsed(),
                });
            }
        }
    }
}

pub fn stop_broker(mut b: Broker) -> Result<()> {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(b.child.id().to_string())
        .status();
    let status = b.child.wait()?;
    if !status.success() {
        return Err(format!("the broker exited with {status}").into());
    }
    Ok(())
}
