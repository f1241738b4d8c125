//! The HTTP load: a minimal keep-alive HTTP/1.1 client, the requests the scenarios send (pop,
//! push, PATCH, the no-op `GET /livez`), closed-loop and paced load over many connections, and
//! the engine's counters from `/metrics`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::stats::{Figure, figure};
use crate::{Error, Result};

pub const SCHEDULERS: [&str; 3] = ["boefje", "normalizer", "report"];

/// A minimal HTTP/1.1 keep-alive client: the load generator shares two cores with the broker and
/// PostgreSQL, so it must cost as little as possible per request.
pub struct Http {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    line: Vec<u8>,
}

impl Http {
    pub async fn connect(port: u16) -> Result<Http> {
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.set_nodelay(true)?;
        let (r, w) = stream.into_split();
        Ok(Http {
            reader: BufReader::with_capacity(16 * 1024, r),
            writer: w,
            line: Vec::with_capacity(256),
        })
    }

    pub async fn call(&mut self, request: &[u8], body: &mut Vec<u8>) -> Result<u16> {
        self.writer.write_all(request).await?;
        self.line.clear();
        self.reader.read_until(b'\n', &mut self.line).await?;
        let status: u16 =
            std::str::from_utf8(self.line.get(9..12).ok_or("short status line")?)?.parse()?;
        let mut len = 0usize;
        loop {
            self.line.clear();
            self.reader.read_until(b'\n', &mut self.line).await?;
            if self.line == b"\r\n" || self.line.is_empty() {
                break;
            }
            if self.line.len() > 15 && self.line[..15].eq_ignore_ascii_case(b"content-length:") {
                len = std::str::from_utf8(&self.line[15..])?.trim().parse()?;
            }
        }
        body.resize(len, 0);
        self.reader.read_exact(body).await?;
        Ok(status)
    }
}

pub fn pop_request(scheduler: &str) -> Vec<u8> {
    format!("POST /schedulers/{scheduler}/pop?limit=1 HTTP/1.1\r\nHost: bench\r\nContent-Length: 0\r\n\r\n").into_bytes()
}

pub fn push_request(scheduler: &str, client: usize, seq: usize, round: usize) -> Vec<u8> {
    let name = format!("push-{round}-{client}-{seq}");
    let data = match scheduler {
        "boefje" => format!(
            r#"{{"boefje":{{"id":"{name}","oci_image":"ghcr.io/minvws/openkat/bench:latest"}},"input_ooi":"Hostname|internet|{name}.example.com","organization":"bench-push"}}"#
        ),
        "normalizer" => format!(
            r#"{{"normalizer":{{"id":"{name}"}},"raw_data":{{"id":"{id}","boefje_meta":{{"id":"{id}","organization":"bench-push"}}}}}}"#,
            id = uuid_like(round, client, seq)
        ),
        _ => format!(r#"{{"report_recipe_id":"{name}","organisation_id":"bench-push"}}"#),
    };
    let body = format!(
        r#"{{"organisation":"bench-push","priority":{},"data":{data}}}"#,
        2 + seq % 1000
    );
    format!(
        "POST /schedulers/{scheduler}/push HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn uuid_like(round: usize, client: usize, seq: usize) -> String {
    format!("{round:08x}-{client:04x}-4000-8000-{seq:012x}")
}

const NOOP_REQUEST: &[u8] = b"GET /livez HTTP/1.1\r\nHost: bench\r\n\r\n";

/// The values of these metrics from `/metrics`, each named as a line of it begins (a labelled
/// one with its labels in the order served; NaN for one not served).
pub async fn metric_values<const N: usize>(port: u16, names: [&str; N]) -> Result<[f64; N]> {
    let mut http = Http::connect(port).await?;
    let mut body = Vec::new();
    http.call(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n", &mut body)
        .await?;
    let text = String::from_utf8(body)?;
    Ok(names.map(|name| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|v| v.strip_prefix(' '))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .unwrap_or(f64::NAN)
    }))
}

/// The engine's counters from `/metrics`: (batches, commands, apply µs, batch µs).
pub async fn engine_counters(port: u16) -> Result<[f64; 4]> {
    Ok(engine_and_backlog_counters(port).await?.0)
}

/// The engine's counters ([`engine_counters`]) and, from the same reading, the tasks pops took
/// straight from the pending backlog, the searches of it, and the boefje task rows written
/// `queued` (pushes into the heap, and tasks the heap held as read written so before a batch that
/// meets them).
pub async fn engine_and_backlog_counters(port: u16) -> Result<([f64; 4], [f64; 3])> {
    let [
        batches,
        commands,
        apply_s,
        batch_s,
        backlog_pops,
        backlog_searches,
        written_queued,
    ] = metric_values(
        port,
        [
            "scheduler_engine_batches_total",
            "scheduler_engine_commands_total",
            "scheduler_engine_apply_seconds_total",
            "scheduler_engine_batch_seconds_total",
            "scheduler_engine_backlog_pops_total",
            "scheduler_engine_backlog_searches_total",
            r#"scheduler_task_transitions_total{scheduler_id="boefje",status="queued"}"#,
        ],
    )
    .await?;
    Ok((
        [
            batches,
            commands,
            // Served in seconds; the figures here are in microseconds.
            apply_s * 1e6,
            batch_s * 1e6,
        ],
        [backlog_pops, backlog_searches, written_queued],
    ))
}

/// Commands per batch, apply µs per batch and batch µs (BEGIN to COMMIT) between two readings.
pub fn engine_delta(before: [f64; 4], after: [f64; 4]) -> [f64; 3] {
    let batches = after[0] - before[0];
    [
        (after[1] - before[1]) / batches,
        (after[2] - before[2]) / batches,
        (after[3] - before[3]) / batches,
    ]
}

#[derive(Clone, Copy, PartialEq)]
pub enum Op {
    Pop,
    Push,
    Noop,
}

#[derive(Default)]
pub struct ClientResult {
    ops: usize,
    latencies: Vec<u32>,
    pub ids: Vec<String>,
    empty: usize,
}

/// The id of a popped task: the first `"id":"…"` of the first result.
pub fn popped_id(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let at = text.find("[{\"id\":\"")? + 8;
    text.get(at..at + 36).map(str::to_owned)
}

/// Runs `clients` connections for `seconds`, closed-loop (`rate` None) or paced.
pub async fn http_load(
    port: u16,
    clients: usize,
    seconds: f64,
    rate: Option<f64>,
    op: Op,
    round: usize,
) -> Result<(Figure, ClientResult)> {
    let start = Instant::now();
    let deadline = Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut http = Http::connect(port).await?;
        tasks.push(tokio::spawn(async move {
            let scheduler = SCHEDULERS[c % 3];
            let pop = pop_request(scheduler);
            let mut r = ClientResult::default();
            let mut body = Vec::with_capacity(1024);
            let interval = rate.map(|x| Duration::from_secs_f64(clients as f64 / x));
            let mut k = 0u32;
            loop {
                let scheduled = match interval {
                    Some(i) => {
                        let at = start + i.mul_f64(f64::from(k) + c as f64 / clients as f64);
                        k += 1;
                        tokio::time::sleep_until(at.into()).await;
                        at
                    }
                    None => Instant::now(),
                };
                if start.elapsed() >= deadline {
                    break;
                }
                let status = match op {
                    Op::Pop => http.call(&pop, &mut body).await?,
                    Op::Noop => http.call(NOOP_REQUEST, &mut body).await?,
                    Op::Push => {
                        http.call(
                            &push_request(scheduler, c, r.ops + r.empty, round),
                            &mut body,
                        )
                        .await?
                    }
                };
                let lat = u32::try_from(scheduled.elapsed().as_micros()).unwrap_or(u32::MAX);
                match (op, status) {
                    (Op::Pop, 200) => match popped_id(&body) {
                        Some(id) => {
                            r.ids.push(id);
                            r.ops += 1;
                            r.latencies.push(lat);
                        }
                        None => r.empty += 1,
                    },
                    (Op::Push, 201) => {
                        if let Some(id) = std::str::from_utf8(&body).ok().and_then(|t| t.get(7..43))
                        {
                            r.ids.push(id.to_owned());
                        }
                        r.ops += 1;
                        r.latencies.push(lat);
                    }
                    (Op::Noop, 200) => {
                        r.ops += 1;
                        r.latencies.push(lat);
                    }
                    (_, s) => {
                        return Err::<ClientResult, Error>(
                            format!("unexpected HTTP {s}: {}", String::from_utf8_lossy(&body))
                                .into(),
                        );
                    }
                }
            }
            Ok(r)
        }));
    }
    let mut all = ClientResult::default();
    for t in tasks {
        let r = t.await??;
        all.ops += r.ops;
        all.empty += r.empty;
        all.latencies.extend(r.latencies);
        all.ids.extend(r.ids);
    }
    let elapsed = start.elapsed();
    if all.empty > 0 {
        eprintln!(
            "warning: {} pops found their queue empty; use more --tasks",
            all.empty
        );
    }
    let lat = std::mem::take(&mut all.latencies);
    Ok((figure(all.ops, elapsed, lat), all))
}

pub fn pop_request_with(scheduler: &str, body: Option<&str>) -> Vec<u8> {
    match body {
        None => pop_request(scheduler),
        Some(b) => format!(
            "POST /schedulers/{scheduler}/pop?limit=1 HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )
        .into_bytes(),
    }
}

pub fn patch_request(id: &str, status: &str) -> Vec<u8> {
    let body = format!(r#"{{"status":"{status}"}}"#);
    format!(
        "PATCH /tasks/{id} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The id of a task answer (`{"id":"…`).
pub fn task_id(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let at = text.find("\"id\":\"")? + 6;
    text.get(at..at + 36).map(str::to_owned)
}

/// Sends `requests` over up to `clients` connections; every answer must have status `expect`.
/// Returns the task ids of the answers.
pub async fn send_all(
    port: u16,
    clients: usize,
    requests: Vec<Vec<u8>>,
    expect: u16,
) -> Result<Vec<String>> {
    if requests.is_empty() {
        return Ok(Vec::new());
    }
    let requests = Arc::new(requests);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients.clamp(1, requests.len()) {
        let mut http = Http::connect(port).await?;
        let (requests, next) = (requests.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            let mut body = Vec::new();
            while let Some(request) = requests.get(next.fetch_add(1, Ordering::Relaxed)) {
                let s = http.call(request, &mut body).await?;
                if s != expect {
                    return Err::<Vec<String>, Error>(
                        format!(
                            "unexpected HTTP {s} (wanted {expect}): {}",
                            String::from_utf8_lossy(&body)
                        )
                        .into(),
                    );
                }
                ids.extend(task_id(&body));
            }
            Ok(ids)
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await??);
    }
    Ok(ids)
}

pub fn current_thread() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
