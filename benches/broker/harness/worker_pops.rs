//! The pops real workers send, measured at a held depth (for `--workers` and `--pending`): the
//! bodies and the roles of the clients, bursts, and the checks and repairs after each burst.
//!
//! The depth is held: a measurement runs in bursts that stop after a budget of pops (D/4), and
//! after each burst the popped tasks are queued again (`PATCH queued`, so they keep their rank),
//! tasks the fleet completed are replaced by new ones of the same image, and popped baseline rows
//! are inserted again. Only each burst's steady part counts (from the 64th answer to the moment
//! the budget ran out), so many short bursts at a small depth measure the same as one long run at
//! a large one.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::baseline::{baseline_run, refill_baseline};
use super::http::{
    Http, current_thread, engine_and_backlog_counters, engine_delta, patch_request,
    pop_request_with, popped_id, send_all, task_id,
};
use super::postgres::{BOEFJES, IMAGES, ORGS, count_stored, count_tasks, image_name, pg_number};
use super::stats::{CpuSpan, Figure, cpu_ticks, figure, median, median_figure, micros_since};
use crate::{Error, Options, Result};

/// The pops the boefje runner sends (`POST /schedulers/boefje/pop?limit=1`, a filter body only
/// when it has filters), and the fleet mix.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Body {
    Unfiltered,
    Image,
    BoefjeIds,
    Organisation,
    Fleet,
}

impl Body {
    pub const ALL: [Body; 5] = [
        Body::Unfiltered,
        Body::Image,
        Body::BoefjeIds,
        Body::Organisation,
        Body::Fleet,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn key(self) -> &'static str {
        match self {
            Body::Unfiltered => "unfiltered",
            Body::Image => "image",
            Body::BoefjeIds => "boefje_ids",
            Body::Organisation => "organisation",
            Body::Fleet => "fleet",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Body::Unfiltered => "unfiltered pop (no body)",
            Body::Image => "one image of ten",
            Body::BoefjeIds => "two boefje ids of thirty",
            Body::Organisation => "one organisation of fifty",
            Body::Fleet => "fleet: pop, running, completed",
        }
    }

    /// The roles of `clients` clients for this body: client `c` asks for image `c % 10`,
    /// boefje ids `b{2j}` and `b{2j+1}` with `j = c % 15`, or organisation `org{c % 50}`, so
    /// the pops spread over the values as a fleet's would. In the fleet, one client in eight
    /// pushes new boefje tasks, one for each task the others complete.
    fn roles(self, clients: usize) -> Vec<Role> {
        (0..clients)
            .map(|c| match self {
                Body::Unfiltered => Role::pop(None, Want::Any),
                Body::Image => Role::pop(
                    Some(image_filter(&image_name(c % IMAGES))),
                    Want::Image(image_name(c % IMAGES)),
                ),
                Body::BoefjeIds => {
                    let j = c % (BOEFJES / 2);
                    let (a, b) = (format!("b{}", 2 * j), format!("b{}", 2 * j + 1));
                    Role::pop(
                        Some(format!(
                            r#"{{"filters": [{{"column": "data", "field": "boefje__id", "operator": "in", "value": ["{a}", "{b}"]}}]}}"#
                        )),
                        Want::BoefjeIds(a, b),
                    )
                }
                Body::Organisation => Role::pop(
                    Some(format!(
                        r#"{{"filters": [{{"column": "organisation", "operator": "==", "value": "org{}"}}]}}"#,
                        c % ORGS
                    )),
                    Want::Organisation(format!("org{}", c % ORGS)),
                ),
                Body::Fleet if c % 8 == 7 => Role::Push { per_completion: true },
                Body::Fleet => Role::Fleet {
                    request: pop_request_with("boefje", Some(&image_filter(&image_name(c % IMAGES)))),
                    want: Want::Image(image_name(c % IMAGES)),
                    image: c % IMAGES,
                },
            })
            .collect()
    }
}

/// The runner's image filter (`BOEFJES_IMAGES`).
pub fn image_filter(image: &str) -> String {
    format!(
        r#"{{"filters": [{{"column": "data", "field": "boefje__oci_image", "operator": "in", "value": ["{image}"]}}]}}"#
    )
}

/// What a popped task must match.
#[derive(Clone, Debug)]
pub enum Want {
    Any,
    Image(String),
    BoefjeIds(String, String),
    Organisation(String),
}

impl Want {
    pub fn check(&self, task: &serde_json::Value) -> bool {
        let data = &task["data"];
        let s = |v: &serde_json::Value| v.as_str().map(str::to_owned);
        task["scheduler_id"] == "boefje"
            && match self {
                Want::Any => true,
                Want::Image(i) => s(&data["boefje"]["oci_image"]).as_deref() == Some(i),
                Want::BoefjeIds(a, b) => {
                    let id = s(&data["boefje"]["id"]);
                    id.as_deref() == Some(a) || id.as_deref() == Some(b)
                }
                Want::Organisation(o) => s(&task["organisation"]).as_deref() == Some(o),
            }
    }
}

#[derive(Clone)]
pub enum Role {
    /// Pops with one body, closed loop.
    Pop { request: Vec<u8>, want: Want },
    /// Pops, then `PATCH running`, then `PATCH completed`, as a boefje worker does.
    Fleet {
        request: Vec<u8>,
        want: Want,
        image: usize,
    },
    /// Pushes new boefje tasks: one for each task the fleet completes (`per_completion`), or
    /// closed loop.
    Push { per_completion: bool },
}

impl Role {
    fn pop(body: Option<String>, want: Want) -> Role {
        Role::Pop {
            request: pop_request_with("boefje", body.as_deref()),
            want,
        }
    }
}

/// Numbers the harness's pushes, so each has its own input OOI (and hash).
static PUSH_SEQ: AtomicUsize = AtomicUsize::new(0);

fn spread_priority(k: usize) -> usize {
    2 + (k.wrapping_mul(2_654_435_761) >> 7) % 1000
}

pub fn boefje_push(boefje: &str, image: &str, org: &str, priority: usize) -> Vec<u8> {
    let n = PUSH_SEQ.fetch_add(1, Ordering::Relaxed);
    let data = format!(
        r#"{{"boefje":{{"id":"{boefje}","oci_image":"{image}"}},"input_ooi":"Hostname|internet|push{n}.example.com","organization":"{org}"}}"#
    );
    let body = format!(r#"{{"organisation":"{org}","priority":{priority},"data":{data}}}"#);
    format!(
        "POST /schedulers/boefje/push HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A new boefje task spread like the seeded ones (boefje, image, organisation, priority).
fn spread_push() -> Vec<u8> {
    let k = PUSH_SEQ.load(Ordering::Relaxed);
    let b = k % BOEFJES;
    boefje_push(
        &format!("b{b}"),
        &image_name(b % IMAGES),
        &format!("org{}", (k / BOEFJES) % ORGS),
        spread_priority(k),
    )
}

/// A new boefje task of image `image`, to replace a completed one of that image.
fn replacement_push(image: usize, k: usize) -> Vec<u8> {
    boefje_push(
        &format!("b{}", image + IMAGES * (k % (BOEFJES / IMAGES))),
        &image_name(image),
        &format!("org{}", (k / 3) % ORGS),
        spread_priority(k),
    )
}

/// One task a burst popped.
struct WorkerPop {
    id: String,
    /// The answer, checked against `want` after the burst (not while timing).
    body: Vec<u8>,
    want: Want,
    /// Completed by the fleet (else put back after the burst).
    completed: bool,
    image: usize,
}

/// What one burst did; times in µs from its start.
#[derive(Default)]
pub struct Burst {
    pops: Vec<WorkerPop>,
    pop_samples: Vec<(u32, u32)>,
    pub pushes: Vec<String>,
    pub push_samples: Vec<(u32, u32)>,
    empty: usize,
    exhausted_us: Option<u32>,
    pub elapsed: Duration,
    /// The first `clients` completions: after them every client is in its steady loop.
    pub clients: usize,
}

/// The steady part of a run: from the `clients`-th completion to the moment the budget ran out
/// (or the end). Only operations issued and done inside it count, so neither the first wave of
/// requests nor the tail after the budget ran out (when fewer clients are busy) bends the figures;
/// short bursts at small depths measure the same thing as one long run at a large depth.
/// The run ended at `limit` (its time was up) unless the budget ran out first.
pub fn steady(
    samples: &[&[(u32, u32)]],
    clients: usize,
    exhausted: Option<u32>,
    limit: Duration,
    elapsed: Duration,
) -> (u32, u32) {
    let mut done: Vec<u32> = samples.iter().flat_map(|s| s.iter().map(|x| x.1)).collect();
    done.sort_unstable();
    let us = |d: Duration| u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
    let end = exhausted
        .unwrap_or(u32::MAX)
        .min(us(limit))
        .min(us(elapsed));
    let t0 = if done.len() > 4 * clients {
        done[clients - 1]
    } else {
        0
    };
    if t0 >= end { (0, end) } else { (t0, end) }
}

/// Runs `roles` (one connection each) until `budget` pops were started or `seconds` passed.
pub async fn burst(port: u16, roles: &[Role], budget: usize, seconds: f64) -> Result<Burst> {
    let tickets = Arc::new(AtomicI64::new(i64::try_from(budget).unwrap_or(i64::MAX)));
    let exhausted = Arc::new(AtomicU32::new(u32::MAX));
    let stop = Arc::new(AtomicBool::new(false));
    let credits = Arc::new(tokio::sync::Semaphore::new(0));
    let mut conns = Vec::with_capacity(roles.len());
    for _ in roles {
        conns.push(Http::connect(port).await?);
    }
    let deadline = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (role, mut http) in roles.iter().cloned().zip(conns) {
        let (tickets, exhausted, stop, credits) = (
            tickets.clone(),
            exhausted.clone(),
            stop.clone(),
            credits.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut b = Burst::default();
            let mut body = Vec::with_capacity(1024);
            let unexpected = |what: &str, s: u16, body: &[u8]| -> Error {
                format!(
                    "{what}: unexpected HTTP {s}: {}",
                    String::from_utf8_lossy(body)
                )
                .into()
            };
            loop {
                if start.elapsed() >= deadline || stop.load(Ordering::Relaxed) {
                    break;
                }
                match &role {
                    Role::Push { per_completion } => {
                        if *per_completion {
                            let left = deadline.saturating_sub(start.elapsed());
                            match tokio::time::timeout(left, credits.acquire()).await {
                                Ok(Ok(permit)) => permit.forget(),
                                _ => break,
                            }
                        }
                        let request = spread_push();
                        let issued = micros_since(start);
                        let s = http.call(&request, &mut body).await?;
                        if s != 201 {
                            return Err(unexpected("push", s, &body));
                        }
                        b.push_samples.push((issued, micros_since(start)));
                        b.pushes
                            .push(task_id(&body).ok_or("a push answer without an id")?);
                    }
                    Role::Pop { request, want } | Role::Fleet { request, want, .. } => {
                        if tickets.fetch_sub(1, Ordering::Relaxed) <= 0 {
                            exhausted.fetch_min(micros_since(start), Ordering::Relaxed);
                            stop.store(true, Ordering::Relaxed);
                            credits.close();
                            break;
                        }
                        let issued = micros_since(start);
                        let s = http.call(request, &mut body).await?;
                        if s != 200 {
                            return Err(unexpected("pop", s, &body));
                        }
                        let Some(id) = popped_id(&body) else {
                            b.empty += 1;
                            continue;
                        };
                        b.pop_samples.push((issued, micros_since(start)));
                        let fleet = matches!(role, Role::Fleet { .. });
                        if fleet {
                            let mut answer = Vec::new();
                            for status in ["running", "completed"] {
                                let s = http.call(&patch_request(&id, status), &mut answer).await?;
                                if s != 200 {
                                    return Err(unexpected("PATCH", s, &answer));
                                }
                            }
                            credits.add_permits(1);
                        }
                        b.pops.push(WorkerPop {
                            id,
                            body: body.clone(),
                            want: want.clone(),
                            completed: fleet,
                            image: if let Role::Fleet { image, .. } = role {
                                image
                            } else {
                                0
                            },
                        });
                    }
                }
            }
            Ok::<Burst, Error>(b)
        }));
    }
    let mut all = Burst {
        clients: roles.len(),
        ..Burst::default()
    };
    for t in tasks {
        let b = t.await??;
        all.pops.extend(b.pops);
        all.pop_samples.extend(b.pop_samples);
        all.pushes.extend(b.pushes);
        all.push_samples.extend(b.push_samples);
        all.empty += b.empty;
    }
    all.elapsed = start.elapsed();
    let e = exhausted.load(Ordering::Relaxed);
    all.exhausted_us = (e != u32::MAX).then_some(e);
    Ok(all)
}

/// Checks a burst (no task popped twice, each popped task matches its filter) and puts the queue
/// back as it was: popped tasks are queued again (`PATCH queued`, so they keep their rank), and
/// tasks the fleet completed are replaced by new tasks of the same image (or, if the fleet's
/// pushers got ahead, their surplus is cancelled). Returns the acknowledged pushes.
async fn check_and_restore(port: u16, clients: usize, b: &Burst) -> Result<Vec<String>> {
    let mut seen = HashSet::with_capacity(b.pops.len());
    for p in &b.pops {
        if !seen.insert(p.id.as_str()) {
            return Err(format!("task {} was popped twice", p.id).into());
        }
        let v: serde_json::Value = serde_json::from_slice(&p.body)?;
        let task = &v["results"][0];
        if task["id"].as_str() != Some(p.id.as_str()) || !p.want.check(task) {
            return Err(format!(
                "a pop for {:?} returned a task that does not match: {task}",
                p.want
            )
            .into());
        }
    }
    let requeue: Vec<Vec<u8>> = b
        .pops
        .iter()
        .filter(|p| !p.completed)
        .map(|p| patch_request(&p.id, "queued"))
        .collect();
    send_all(port, clients, requeue, 200).await?;
    let completed: Vec<usize> = b
        .pops
        .iter()
        .filter(|p| p.completed)
        .map(|p| p.image)
        .collect();
    let mut acked = b.pushes.clone();
    if completed.len() > b.pushes.len() {
        let replace: Vec<Vec<u8>> = completed[b.pushes.len()..]
            .iter()
            .enumerate()
            .map(|(k, &image)| replacement_push(image, k))
            .collect();
        acked.extend(send_all(port, clients, replace, 201).await?);
    } else if b.pushes.len() > completed.len() {
        let cancel: Vec<Vec<u8>> = b.pushes[completed.len()..]
            .iter()
            .map(|id| patch_request(id, "cancelled"))
            .collect();
        send_all(port, clients, cancel, 200).await?;
    }
    Ok(acked)
}

/// One measurement of a pop body at a held depth: bursts of at most `budget` pops until
/// `seconds` of load have run, the queue restored after each.
#[derive(Default, Clone, Copy)]
pub struct BodyFigure {
    pub pops: Figure,
    pushes: Figure,
    pub bursts: usize,
    popped: usize,
    completed: usize,
    empty: usize,
    /// The engines' work while the bursts ran (not the put-backs after them), per batch:
    /// commands, µs reading and deciding (before the write), µs from the first read to the
    /// commit (zeros where not measured).
    pub engine: [f64; 3],
    /// The server's write-ahead log while the bursts ran, per task popped: bytes, and full-page
    /// images per thousand; and while the queue was put back after them (the `PATCH queued` of
    /// each popped task, the fleet's replacements), bytes per task popped (zeros where not
    /// measured). Work a burst started may end after it (a refill under way): the split is at
    /// the burst's last answer.
    pub wal: [f64; 3],
    /// Of the tasks popped while the bursts ran, the share taken straight from the pending
    /// backlog (not the heap), the searches of the backlog's indexes per thousand tasks popped,
    /// and the task rows written `queued` per thousand tasks popped (zeros where not measured).
    pub backlog: [f64; 3],
    /// Where the log began and ended while the body ran, in the last round (to read it by
    /// record type with `pg_waldump`).
    pub wal_window: [f64; 2],
}

pub struct Tally {
    window_us: u64,
    pops: usize,
    pushes: usize,
    pop_lat: Vec<u32>,
    push_lat: Vec<u32>,
}

impl Tally {
    pub fn new() -> Self {
        Tally {
            window_us: 0,
            pops: 0,
            pushes: 0,
            pop_lat: Vec::new(),
            push_lat: Vec::new(),
        }
    }

    /// Adds the steady part of one run.
    pub fn add(&mut self, pops: &[(u32, u32)], pushes: &[(u32, u32)], window: (u32, u32)) {
        let (t0, end) = window;
        self.window_us += u64::from(end - t0);
        let counted = |s: &[(u32, u32)]| s.iter().filter(|(_, d)| *d > t0 && *d <= end).count();
        let lat = |s: &[(u32, u32)]| -> Vec<u32> {
            s.iter()
                .filter(|(i, d)| *i >= t0 && *d <= end)
                .map(|(i, d)| d.saturating_sub(*i))
                .collect()
        };
        self.pops += counted(pops);
        self.pushes += counted(pushes);
        self.pop_lat.extend(lat(pops));
        self.push_lat.extend(lat(pushes));
    }

    pub fn figures(self) -> (Figure, Figure) {
        let w = Duration::from_micros(self.window_us.max(1));
        (
            figure(self.pops, w, self.pop_lat),
            figure(self.pushes, w, self.push_lat),
        )
    }
}

/// What the engines and the server's log did over the bursts and over the put-backs: engine
/// counters (batches, commands, apply µs, batch µs) and WAL (bytes, full-page images) over the
/// bursts, and WAL bytes over the put-backs.
#[derive(Default)]
struct BurstWork {
    engine: [f64; 4],
    backlog: [f64; 3],
    wal: [f64; 2],
    restore_wal: f64,
}

/// One body's bursts on the broker at `port`; with `watch` (a database URL on its server), the
/// engines' counters and the server's log are read around each burst, apart from the put-backs.
async fn measure_body(
    port: u16,
    clients: usize,
    body: Body,
    budget: usize,
    seconds: f64,
    acked: &mut Vec<String>,
    watch: Option<&str>,
) -> Result<BodyFigure> {
    let roles = body.roles(clients);
    let mut tally = Tally::new();
    let mut out = BodyFigure::default();
    let mut ran = 0.0;
    let mut cpu = CpuSpan::default();
    let mut work = BurstWork::default();
    while ran < seconds * 0.98 {
        let before = match watch {
            Some(server) => Some((
                engine_and_backlog_counters(port).await?,
                wal_so_far(server)?,
            )),
            None => None,
        };
        let from = cpu_ticks();
        let b = burst(port, &roles, budget, seconds - ran).await?;
        cpu.add(from, cpu_ticks());
        let ended = match (watch, before) {
            (Some(server), Some(((e0, b0), w0))) => {
                let (e1, b1) = engine_and_backlog_counters(port).await?;
                let w1 = wal_so_far(server)?;
                for k in 0..4 {
                    work.engine[k] += e1[k] - e0[k];
                }
                for k in 0..3 {
                    work.backlog[k] += b1[k] - b0[k];
                }
                work.wal[0] += w1[0] - w0[0];
                work.wal[1] += w1[1] - w0[1];
                Some(w1[0])
            }
            _ => None,
        };
        let window = steady(
            &[&b.pop_samples, &b.push_samples],
            b.clients,
            b.exhausted_us,
            Duration::from_secs_f64(seconds - ran),
            b.elapsed,
        );
        ran += b.elapsed.as_secs_f64();
        tally.add(&b.pop_samples, &b.push_samples, window);
        out.bursts += 1;
        out.popped += b.pops.len();
        out.completed += b.pops.iter().filter(|p| p.completed).count();
        out.empty += b.empty;
        acked.extend(check_and_restore(port, clients, &b).await?);
        if let (Some(server), Some(w)) = (watch, ended) {
            work.restore_wal += wal_so_far(server)?[0] - w;
        }
    }
    if watch.is_some() {
        let popped = out.popped.max(1) as f64;
        out.engine = engine_delta([0.0; 4], work.engine);
        out.wal = [
            work.wal[0] / popped,
            work.wal[1] / popped * 1000.0,
            work.restore_wal / popped,
        ];
        out.backlog = [
            work.backlog[0] / popped,
            work.backlog[1] / popped * 1000.0,
            work.backlog[2] / popped * 1000.0,
        ];
    }
    if out.empty > 0 {
        eprintln!(
            "warning: {} {} pops found nothing to pop",
            out.empty,
            body.key()
        );
    }
    (out.pops, out.pushes) = tally.figures();
    out.pops.busy = cpu.share();
    Ok(out)
}

/// The baseline measured the same way: bursts of at most `budget` pops, the popped rows put back.
fn measure_baseline(db: &str, conns: usize, budget: usize, seconds: f64) -> Result<Figure> {
    let mut tally = Tally::new();
    let mut ran = 0.0;
    let mut cpu = CpuSpan::default();
    while ran < seconds * 0.98 {
        let from = cpu_ticks();
        let r = baseline_run(db, conns, seconds - ran, None, "pop", Some(budget))?;
        cpu.add(from, cpu_ticks());
        let limit = Duration::from_secs_f64(seconds - ran);
        ran += r.elapsed.as_secs_f64();
        let window = steady(&[&r.samples], conns, r.exhausted_us, limit, r.elapsed);
        tally.add(&r.samples, &[], window);
        refill_baseline(db, r.samples.len())?;
    }
    let mut f = tally.figures().0;
    f.busy = cpu.share();
    Ok(f)
}

/// Medians over rounds of the pop bodies.
fn body_medians(rounds: &[[BodyFigure; 5]]) -> [BodyFigure; 5] {
    let mut out = [BodyFigure::default(); 5];
    for (i, o) in out.iter_mut().enumerate() {
        let pick = |f: fn(&BodyFigure) -> Figure| {
            median_figure(&rounds.iter().map(|r| f(&r[i])).collect::<Vec<_>>())
        };
        o.pops = pick(|b| b.pops);
        o.pushes = pick(|b| b.pushes);
        o.bursts = rounds.iter().map(|r| r[i].bursts).sum();
        o.popped = rounds.iter().map(|r| r[i].popped).sum();
        o.engine = std::array::from_fn(|k| median(rounds.iter().map(|r| r[i].engine[k]).collect()));
        o.wal = std::array::from_fn(|k| median(rounds.iter().map(|r| r[i].wal[k]).collect()));
        o.backlog =
            std::array::from_fn(|k| median(rounds.iter().map(|r| r[i].backlog[k]).collect()));
        o.wal_window = rounds.last().map_or([0.0; 2], |r| r[i].wal_window);
    }
    out
}

/// Measures every pop body in `rounds` rounds (the order reversed every other round), with the
/// baseline among them when `baseline` names its database and budget. Returns the medians, the
/// baseline's median, the acknowledged pushes and how many tasks the fleet completed.
pub fn measure_bodies(
    o: &Options,
    port: u16,
    budget: usize,
    baseline: Option<(&str, usize)>,
    what: &str,
) -> Result<([BodyFigure; 5], Figure, Vec<String>, usize)> {
    let rt = current_thread()?;
    let mut rounds = Vec::new();
    let mut base_rounds = Vec::new();
    let mut acked = Vec::new();
    let mut completed = 0;
    for round in 0..o.rounds {
        eprintln!("{what}: round {}/{}…", round + 1, o.rounds);
        let mut order: Vec<Option<Body>> = Body::ALL.iter().copied().map(Some).collect();
        if baseline.is_some() {
            order.push(None);
        }
        if round % 2 == 1 {
            order.reverse();
        }
        let mut figs = [BodyFigure::default(); 5];
        for item in order {
            match (item, baseline) {
                (Some(body), _) => {
                    let f = rt.block_on(measure_body(
                        port, o.clients, body, budget, o.seconds, &mut acked, None,
                    ))?;
                    completed += f.completed;
                    figs[body.index()] = f;
                }
                (None, Some((db, b))) => {
                    base_rounds.push(measure_baseline(db, o.pg_clients, b, o.seconds)?);
                }
                (None, None) => {}
            }
        }
        rounds.push(figs);
    }
    Ok((
        body_medians(&rounds),
        median_figure(&base_rounds),
        acked,
        completed,
    ))
}

/// What [`measure_side_by_side`] measured on one broker: each body's medians, the ids of the
/// tasks its workers pushed (acknowledged), and the tasks they completed.
pub struct SideFigures {
    pub figs: [BodyFigure; 5],
    pub acked: Vec<String>,
    pub completed: usize,
}

/// The server's write-ahead log so far (`pg_stat_wal`): bytes and full-page images,
/// and where the log ends, as a byte position.
fn wal_so_far(server: &str) -> Result<[f64; 3]> {
    Ok([
        pg_number(server, "SELECT wal_bytes::bigint AS n FROM pg_stat_wal")? as f64,
        pg_number(server, "SELECT wal_fpi AS n FROM pg_stat_wal")? as f64,
        pg_number(
            server,
            "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint AS n",
        )? as f64,
    ])
}

/// A byte position of the log as PostgreSQL writes it (`pg_waldump -s`/`-e`).
fn lsn(at: f64) -> String {
    let at = at as u64;
    format!("{:X}/{:X}", at >> 32, at & 0xFFFF_FFFF)
}

/// The bodies on two brokers of one PostgreSQL server (`server`: a database URL on it) side by
/// side: in each round each body runs on one and then on the other (the first by turns), so that
/// the machine's drift over a run falls on both alike rather than on whichever ran later.
/// Medians of the rounds, per broker.
pub fn measure_side_by_side(
    o: &Options,
    ports: [u16; 2],
    server: &str,
    budget: usize,
    what: [&str; 2],
) -> Result<[SideFigures; 2]> {
    let rt = current_thread()?;
    let mut rounds: [Vec<[BodyFigure; 5]>; 2] = [Vec::new(), Vec::new()];
    let mut acked: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    let mut completed = [0; 2];
    for round in 0..o.rounds {
        eprintln!(
            "{} and {}: round {}/{}…",
            what[0],
            what[1],
            round + 1,
            o.rounds
        );
        let mut figs = [[BodyFigure::default(); 5]; 2];
        for (k, body) in Body::ALL.into_iter().enumerate() {
            let first = (round + k) % 2;
            for side in [first, 1 - first] {
                let wal_before = wal_so_far(server)?;
                let mut f = rt.block_on(measure_body(
                    ports[side],
                    o.clients,
                    body,
                    budget,
                    o.seconds,
                    &mut acked[side],
                    Some(server),
                ))?;
                f.wal_window = [wal_before[2], wal_so_far(server)?[2]];
                completed[side] += f.completed;
                figs[side][body.index()] = f;
            }
        }
        for side in 0..2 {
            rounds[side].push(figs[side]);
        }
    }
    let [a, b] = acked;
    Ok([
        SideFigures {
            figs: body_medians(&rounds[0]),
            acked: a,
            completed: completed[0],
        },
        SideFigures {
            figs: body_medians(&rounds[1]),
            acked: b,
            completed: completed[1],
        },
    ])
}

/// The engines' work per batch and the server's write-ahead log per task popped while each body's
/// bursts ran, and the put-backs' log after them, on two brokers side by side.
pub fn print_engine_per_batch(figs: [&[BodyFigure; 5]; 2], what: [&str; 2]) {
    println!(
        "while each body's bursts ran (medians of rounds): the engines per batch (commands, µs reading and deciding, \
         µs to the commit); the server's WAL per task popped (bytes, full-page images per 1,000); \
         then the WAL of the put-backs after the bursts, per task popped (bytes)"
    );
    println!(
        "{:<44} {:>24} {:>24} {:>18} {:>18} {:>10} {:>10}",
        "pop body", what[0], what[1], what[0], what[1], "put-back", "put-back"
    );
    for body in Body::ALL {
        let cell = |f: &BodyFigure| {
            let [c, a, b] = f.engine;
            format!("{c:.1} / {a:.0} / {b:.0}")
        };
        let wal = |f: &BodyFigure| format!("{:.0} B / {:.0}", f.wal[0], f.wal[1]);
        let (x, y) = (&figs[0][body.index()], &figs[1][body.index()]);
        println!(
            "{:<44} {:>24} {:>24} {:>18} {:>18} {:>8.0} B {:>8.0} B",
            body.label(),
            cell(x),
            cell(y),
            wal(x),
            wal(y),
            x.wal[2],
            y.wal[2]
        );
    }
    println!("the log while each body ran in the last round (pg_waldump -s … -e …):");
    for body in Body::ALL {
        let window =
            |f: &BodyFigure| format!("{} … {}", lsn(f.wal_window[0]), lsn(f.wal_window[1]));
        println!(
            "{:<44} {}: {}; {}: {}",
            body.label(),
            what[0],
            window(&figs[0][body.index()]),
            what[1],
            window(&figs[1][body.index()])
        );
    }
}

pub fn print_bodies(figs: &[BodyFigure; 5], baseline: Option<Figure>) {
    println!(
        "{:<44} {:>10} {:>9} {:>9} {:>12} {:>11} {:>9}",
        "pop body (median of rounds)",
        "pops/s",
        "p50 µs",
        "p99 µs",
        "÷ unfiltered",
        "÷ baseline",
        "CPU busy"
    );
    let busy = |f: &Figure| format!("{:.0} %", f.busy * 100.0);
    let un = figs[Body::Unfiltered.index()].pops.ops_per_sec;
    for body in Body::ALL {
        let f = figs[body.index()].pops;
        let vs_base = baseline.map_or(String::from("-"), |b| {
            format!("{:.2}", f.ops_per_sec / b.ops_per_sec)
        });
        println!(
            "{:<44} {:>10.0} {:>9.0} {:>9.0} {:>12.2} {:>11} {:>9}",
            body.label(),
            f.ops_per_sec,
            f.p50_us,
            f.p99_us,
            f.ops_per_sec / un,
            vs_base,
            busy(&f)
        );
    }
    if let Some(b) = baseline {
        println!(
            "{:<44} {:>10.0} {:>9.0} {:>9.0} {:>12.2} {:>11} {:>9}",
            "baseline SKIP LOCKED pop",
            b.ops_per_sec,
            b.p50_us,
            b.p99_us,
            b.ops_per_sec / un,
            "1.00",
            busy(&b)
        );
    }
    let p = figs[Body::Fleet.index()].pushes;
    println!(
        "{:<44} {:>10.0} {:>9.0} {:>9.0}   (pushes/s: one for each completed task, 1 client in 8)",
        "fleet pushes", p.ops_per_sec, p.p50_us, p.p99_us
    );
}

pub fn body_pairs(prefix: &str, figs: &[BodyFigure; 5], baseline: Option<Figure>) -> Vec<String> {
    let un = figs[Body::Unfiltered.index()].pops.ops_per_sec;
    let mut kv = Vec::new();
    for body in Body::ALL {
        let f = figs[body.index()].pops;
        let k = body.key();
        kv.push(format!("{prefix}_{k}_pops_per_s={:.0}", f.ops_per_sec));
        kv.push(format!("{prefix}_{k}_p50_us={:.0}", f.p50_us));
        kv.push(format!("{prefix}_{k}_p99_us={:.0}", f.p99_us));
        kv.push(format!("{prefix}_{k}_cpu_busy={:.2}", f.busy));
        if body != Body::Unfiltered {
            kv.push(format!(
                "{prefix}_{k}_vs_unfiltered={:.3}",
                f.ops_per_sec / un
            ));
        }
        if let Some(b) = baseline {
            kv.push(format!(
                "{prefix}_{k}_vs_baseline={:.3}",
                f.ops_per_sec / b.ops_per_sec
            ));
        }
    }
    if let Some(b) = baseline {
        kv.push(format!("{prefix}_baseline_pops_per_s={:.0}", b.ops_per_sec));
        kv.push(format!("{prefix}_baseline_p99_us={:.0}", b.p99_us));
        kv.push(format!("{prefix}_baseline_cpu_busy={:.2}", b.busy));
    }
    kv.push(format!(
        "{prefix}_fleet_pushes_per_s={:.0}",
        figs[Body::Fleet.index()].pushes.ops_per_sec
    ));
    kv
}

/// The table must hold what the harness did: every acknowledged push, the seeded depth waiting
/// again, nothing left dispatched or running, and one completed task per fleet cycle.
pub fn check_table(
    db: &str,
    acked: &[String],
    waiting: usize,
    held: usize,
    completed: usize,
) -> Result<String> {
    let stored = count_stored(db, acked)?;
    if stored != acked.len() {
        return Err(format!(
            "{} acknowledged pushes are not stored",
            acked.len() - stored
        )
        .into());
    }
    let w = count_tasks(db, "boefje", "'queued', 'pending'")? as usize;
    if w != waiting {
        return Err(format!("{w} boefje tasks are waiting, expected {waiting}").into());
    }
    let h = count_tasks(db, "boefje", "'dispatched', 'running'")? as usize;
    if h != held {
        return Err(format!("{h} boefje tasks are dispatched or running, expected {held}").into());
    }
    let c = count_tasks(db, "boefje", "'completed'")? as usize;
    if c != completed {
        return Err(format!("{c} boefje tasks are completed, expected {completed}").into());
    }
    Ok(format!(
        "{} acknowledged pushes, all stored; {w} boefje tasks waiting, {h} dispatched and {c} completed, as expected",
        acked.len()
    ))
}
