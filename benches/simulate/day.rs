//! One run of the day against the service: a minute per step on the `ManualClock`, pushes, cron
//! ticks, lease sweeps, the runners' results and pops, and what is recorded each minute.
//!
//! Runners pop as OpenKAT's do: one task per pop (`limit=1`), unfiltered or with the image filter
//! of `BOEFJES_IMAGES`, then `PATCH running` at once and, some simulated minutes later,
//! `completed` (a few `failed`). An idle runner pops once a minute; a pool stops asking for the
//! minute at its first empty answer (the next runner with the same filter would get the same).
//!
//! **Held tasks** are counted from what the simulation pushes and pops, a mirror of the limits:
//! a queued shodan task is held when the minute's pops dispatched ten shodan tasks (all pops of
//! a minute fall on one instant of the clock, so that is the rate's window), a queued task of a
//! host when two of that host's tasks are dispatched or running. The mirror is checked every
//! simulated hour against `GET /tasks/{id}/explain`'s `wait.held` on a sample of queued tasks,
//! held and not; the agreement is printed.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use futures_util::future::join_all;
use kat_scheduler::clock::ManualClock;
use kat_scheduler::config::Settings;
use kat_scheduler::cron::reschedule::fire_id;
use kat_scheduler::domain::cron::CronExpr;
use kat_scheduler::queue::fair::Fairness;
use reqwest::Method;
use serde_json::{Value, json};

use super::Result;
use super::service::Service;
use super::workload::{Day, FILTERED_IMAGES, host_of, image, mix};

/// Requests in flight at once: enough to keep the service busy on two cores, few enough that a
/// minute's pops stay close to the order runners would send them in.
const IN_FLIGHT: usize = 16;

/// The rules both runs are held by.
pub const RATE_LIMITS: &str = "boefje.id=shodan:10/60";
pub const CONCURRENCY: &str = "host=*:2";
/// The rate rule's limit and the concurrency rule's, as the mirror counts them.
const SHODAN_PER_MINUTE: usize = 10;
const PER_HOST: usize = 2;

/// One in so many boefje tasks fails; one in so many busy boefje runners dies with the service.
const FAIL_ONE_IN: u64 = 33;
const LOST_ONE_IN: usize = 10;

/// A run's name and its fairness on boefje and normalizer.
#[derive(Clone, Copy)]
pub struct Mode {
    pub name: &'static str,
    pub fairness: Fairness,
}

pub const MODES: [Mode; 2] = [
    Mode {
        name: "strict",
        fairness: Fairness::Off,
    },
    Mode {
        name: "fair",
        fairness: Fairness::Organisation,
    },
];

/// Which queue a pop served.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    Boefje,
    Normalizer,
}

/// One popped task: when, whose, how long it waited (created → dispatched, simulated).
pub struct Pop {
    pub minute: usize,
    pub queue: Queue,
    pub org: usize,
    pub wait_secs: i64,
    pub user: bool,
}

/// What became of one due fire of a cron schedule.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    OnTime,
    /// Its task was created this many seconds after the due time (more than a tick).
    Late(i64),
    /// The due time passed and no task was made for it.
    Skipped,
}

pub struct Fire {
    pub due_minute: usize,
    pub org: usize,
    pub outcome: Outcome,
}

/// Everything one run recorded.
#[derive(Default)]
pub struct Record {
    /// Per minute: queued + pending on boefje and on normalizer (`None` while the service is down).
    pub depth: Vec<Option<[u64; 2]>>,
    /// Per minute: held tasks under the shodan rate rule and under the host concurrency rule.
    pub held: Vec<Option<[usize; 2]>>,
    pub pops: Vec<Pop>,
    pub fires: Vec<Fire>,
    /// The mirror's verdicts checked against explain: agreed, asked.
    pub explain_check: (usize, usize),
    /// Tasks lost with the runners that died in the crash, and those the watchdog queued again.
    pub lost: usize,
    pub requeued: usize,
    /// Pushes made while the service was down, pushed after the restart.
    pub deferred: usize,
    /// Pushes refused because the same work (hash) already waited.
    pub duplicates: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pool {
    Filtered,
    Unfiltered,
    Normalizer,
}

/// The limit keys of a boefje task.
#[derive(Clone)]
struct Key {
    host: Option<String>,
    shodan: bool,
}

impl Key {
    fn of(task: &Value) -> Key {
        Key {
            host: task["data"]["input_ooi"]
                .as_str()
                .and_then(host_of)
                .map(str::to_owned),
            shodan: task["data"]["boefje"]["id"] == "shodan",
        }
    }
}

/// A runner's task in hand.
struct Job {
    ids: Vec<String>,
    keys: Vec<Key>,
    org: String,
    boefje: String,
    until: usize,
    fail: bool,
}

struct Worker {
    pool: Pool,
    job: Option<Job>,
    done: u64,
}

/// The limits as the simulation sees them (see the module's header).
#[derive(Default)]
struct Mirror {
    queued: HashMap<String, Key>,
    queued_host: HashMap<String, usize>,
    queued_shodan: usize,
    inflight_host: HashMap<String, usize>,
    shodan_this_minute: usize,
    lost: HashMap<String, Key>,
}

impl Mirror {
    fn queue(&mut self, id: String, key: Key) {
        if let Some(h) = &key.host {
            *self.queued_host.entry(h.clone()).or_default() += 1;
        }
        self.queued_shodan += usize::from(key.shodan);
        self.queued.insert(id, key);
    }

    fn dispatch(&mut self, id: &str, key: &Key) {
        if let Some(k) = self.queued.remove(id) {
            if let Some(h) = &k.host
                && let Some(n) = self.queued_host.get_mut(h)
            {
                *n = n.saturating_sub(1);
            }
            self.queued_shodan -= usize::from(k.shodan);
        }
        if let Some(h) = &key.host {
            *self.inflight_host.entry(h.clone()).or_default() += 1;
        }
        self.shodan_this_minute += usize::from(key.shodan);
    }

    fn finish(&mut self, key: &Key) {
        if let Some(h) = &key.host
            && let Some(n) = self.inflight_host.get_mut(h)
        {
            *n = n.saturating_sub(1);
        }
    }

    fn rate_held(&self) -> bool {
        self.shodan_this_minute >= SHODAN_PER_MINUTE
    }

    fn host_held(&self, host: &str) -> bool {
        self.inflight_host.get(host).copied().unwrap_or(0) >= PER_HOST
    }

    fn held(&self, key: &Key) -> bool {
        (key.shodan && self.rate_held()) || key.host.as_deref().is_some_and(|h| self.host_held(h))
    }

    /// Held now: [under the shodan rate, under the host concurrency].
    fn counts(&self) -> [usize; 2] {
        let rate = if self.rate_held() {
            self.queued_shodan
        } else {
            0
        };
        let host = self
            .queued_host
            .iter()
            .filter(|(h, _)| self.host_held(h))
            .map(|(_, n)| n)
            .sum();
        [rate, host]
    }
}

/// Settings of a run: the tests' (loopback, port 0, ticks and sweeps by hand) plus the limits,
/// the fairness of `mode` and leases short enough that a lost task comes back within the day.
pub fn settings(db: &str, catalogue: &Path, mode: Mode) -> Settings {
    let mut s = Settings::default();
    s.api.host = "127.0.0.1".into();
    s.api.port = 0;
    s.api.workers = 2;
    s.database.uri = db.to_owned();
    s.database.pool_size = 8;
    s.queue.watchdog_interval_secs = 0;
    s.cron.tick_secs = 0;
    // OpenKAT's runners never renew: 30 simulated minutes (not mula's day) before a task whose
    // runner died is queued again, so the crash's lost tasks return the same afternoon.
    s.queue.run_timeout_secs = 1_800;
    s.queue.unrenewed_run_timeout_secs = 1_800;
    s.catalogue.file = catalogue.to_string_lossy().into_owned();
    for o in [&mut s.schedulers.boefje, &mut s.schedulers.normalizer] {
        o.fairness = Some(mode.fairness);
    }
    s.schedulers.boefje.rate_limits = Some(RATE_LIMITS.into());
    s.schedulers.boefje.concurrency = Some(CONCURRENCY.into());
    s
}

/// The catalogue the schedules fire from: every boefje of the day, without an interval, so the
/// schedules that pushes make (mula's `post_push`) come due only after a day.
pub fn catalogue() -> String {
    let mut out = String::new();
    for (id, _) in super::workload::BOEFJES {
        out.push_str(&format!(
            "[[plugins]]\nid = \"{id}\"\ntype = \"boefje\"\nconsumes = [\"IPPort\", \"Hostname\"]\nscan_level = 1\nenabled = true\noci_image = \"{}\"\n\n",
            image(id)
        ));
    }
    out
}

/// Runs `futures` at most [`IN_FLIGHT`] at a time, answers in order.
async fn waves<F, T>(futures: Vec<F>) -> Vec<T>
where
    F: std::future::Future<Output = T>,
{
    let mut out = Vec::with_capacity(futures.len());
    let mut it = futures.into_iter().peekable();
    while it.peek().is_some() {
        out.extend(join_all(it.by_ref().take(IN_FLIGHT)).await);
    }
    out
}

fn boefje_body(org: &str, boefje: &str, object: &str, priority: i64) -> Value {
    json!({
        "organisation": org,
        "priority": priority,
        "data": {
            "boefje": {"id": boefje, "name": boefje, "version": null, "oci_image": image(boefje)},
            "input_ooi": object,
            "organization": org,
        }
    })
}

/// A raw file of a finished boefje task: the normalizer task that reads it.
fn normalizer_body(org: &str, boefje: &str, boefje_task: &str, priority: i64) -> Value {
    json!({
        "organisation": org,
        "priority": priority,
        "data": {
            "normalizer": {"id": format!("kat_{boefje}_normalize"), "version": null},
            "raw_data": {
                "id": uuid::Uuid::new_v4().to_string(),
                "boefje_meta": {
                    "id": boefje_task,
                    "boefje": {"id": boefje, "version": null},
                    "organization": org,
                },
                "mime_types": [{"value": format!("boefje/{boefje}")}]
            }
        }
    })
}

fn pop_filter(pool: Pool) -> Option<Value> {
    (pool == Pool::Filtered).then(|| {
        json!({"filters": [{"column": "data", "field": "boefje__oci_image", "operator": "in",
               "value": FILTERED_IMAGES.iter().map(|b| image(b)).collect::<Vec<_>>()}]})
    })
}

/// The day's state across minutes (and across the restart).
struct Run<'a> {
    day: &'a Day,
    seed: u64,
    start: DateTime<Utc>,
    org_index: HashMap<String, usize>,
    workers: Vec<Worker>,
    mirror: Mirror,
    record: Record,
    /// Boefje results waiting for their raw file's push (the next minute's pushes).
    raw_files: Vec<Value>,
}

impl Run<'_> {
    fn minute_of(&self, t: DateTime<Utc>) -> usize {
        ((t - self.start).num_seconds().max(0) / 60) as usize
    }

    /// The minute's pushes: the day's, and the raw files of the last minute's results.
    async fn push(
        &mut self,
        svc: &Service,
        minute: usize,
        extra: Vec<super::workload::Push>,
    ) -> Result<()> {
        let now = svc.now().timestamp();
        let day = self.day;
        let boefjes: Vec<(Value, Key)> = extra
            .iter()
            .chain(day.pushes[minute].iter())
            .map(|p| {
                let org = &day.orgs[p.org].name;
                let priority = if p.user { 1 } else { now };
                let body = boefje_body(org, p.boefje, &p.object, priority);
                let key = Key {
                    host: host_of(&p.object).map(str::to_owned),
                    shodan: p.boefje == "shodan",
                };
                (body, key)
            })
            .collect();
        let answers = waves(
            boefjes
                .iter()
                .map(|(b, _)| svc.call(Method::POST, "/schedulers/boefje/push", Some(b)))
                .collect(),
        )
        .await;
        for ((_, key), answer) in boefjes.into_iter().zip(answers) {
            match answer? {
                (201, task) => {
                    if let Some(id) = task["id"].as_str() {
                        self.mirror.queue(id.to_owned(), key);
                    }
                }
                // The same work already waits: the planner would not have pushed it.
                (409, _) => self.record.duplicates += 1,
                (status, body) => {
                    return Err(format!("a boefje push answered {status}: {body}").into());
                }
            }
        }
        let raws = std::mem::take(&mut self.raw_files);
        for answer in waves(
            raws.iter()
                .map(|b| svc.call_ok(Method::POST, "/schedulers/normalizer/push", Some(b), 201))
                .collect(),
        )
        .await
        {
            answer?;
        }
        Ok(())
    }

    /// Results of the jobs due by `minute`; a completed boefje task's raw file is pushed next.
    async fn finish(&mut self, svc: &Service, minute: usize) -> Result<()> {
        let now = svc.now().timestamp();
        let mut patches = Vec::new();
        for w in &mut self.workers {
            if w.job.as_ref().is_some_and(|j| j.until <= minute)
                && let Some(job) = w.job.take()
            {
                let status = if job.fail { "failed" } else { "completed" };
                for id in &job.ids {
                    patches.push((format!("/tasks/{id}"), json!({"status": status})));
                    if w.pool != Pool::Normalizer && !job.fail {
                        self.raw_files
                            .push(normalizer_body(&job.org, &job.boefje, id, now));
                    }
                }
                for k in &job.keys {
                    self.mirror.finish(k);
                }
            }
        }
        for answer in waves(
            patches
                .iter()
                .map(|(path, body)| svc.call_ok(Method::PATCH, path, Some(body), 200))
                .collect(),
        )
        .await
        {
            answer?;
        }
        Ok(())
    }

    /// Idle runners pop, pool by pool, until every one has a task or a pop answers empty.
    async fn pop(&mut self, svc: &Service, minute: usize) -> Result<()> {
        let now = svc.now();
        self.mirror.shodan_this_minute = 0;
        for pool in [Pool::Filtered, Pool::Unfiltered, Pool::Normalizer] {
            let path = if pool == Pool::Normalizer {
                "/schedulers/normalizer/pop?limit=1"
            } else {
                "/schedulers/boefje/pop?limit=1"
            };
            let filter = pop_filter(pool);
            let mut idle: Vec<usize> = (0..self.workers.len())
                .filter(|&i| self.workers[i].pool == pool && self.workers[i].job.is_none())
                .collect();
            idle.reverse();
            'pool: while !idle.is_empty() {
                let n = idle.len().min(IN_FLIGHT);
                let answers = waves(
                    (0..n)
                        .map(|_| svc.call_ok(Method::POST, path, filter.as_ref(), 200))
                        .collect(),
                )
                .await;
                let mut empty = false;
                for answer in answers {
                    let tasks = answer?["results"].as_array().cloned().unwrap_or_default();
                    if tasks.is_empty() {
                        empty = true;
                        continue;
                    }
                    let Some(w) = idle.pop() else { break };
                    self.take(svc, w, pool, tasks, now, minute).await?;
                }
                if empty {
                    break 'pool;
                }
            }
        }
        Ok(())
    }

    /// Runner `w` takes a pop's answer: records each task's wait, starts it.
    async fn take(
        &mut self,
        svc: &Service,
        w: usize,
        pool: Pool,
        tasks: Vec<Value>,
        now: DateTime<Utc>,
        minute: usize,
    ) -> Result<()> {
        let mut ids = Vec::new();
        let mut keys = Vec::new();
        let (mut org, mut boefje) = (String::new(), String::new());
        for t in &tasks {
            let id = t["id"]
                .as_str()
                .ok_or("a popped task without id")?
                .to_owned();
            let created: DateTime<Utc> = t["created_at"]
                .as_str()
                .ok_or("a popped task without created_at")?
                .parse()?;
            org = t["organisation"].as_str().unwrap_or_default().to_owned();
            self.record.pops.push(Pop {
                minute,
                queue: if pool == Pool::Normalizer {
                    Queue::Normalizer
                } else {
                    Queue::Boefje
                },
                org: self.org_index.get(&org).copied().unwrap_or(usize::MAX),
                wait_secs: (now - created).num_seconds(),
                user: t["priority"] == 1,
            });
            if pool == Pool::Normalizer {
                keys.push(Key {
                    host: None,
                    shodan: false,
                });
            } else {
                boefje = t["data"]["boefje"]["id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let key = Key::of(t);
                self.mirror.dispatch(&id, &key);
                keys.push(key);
            }
            ids.push(id);
        }
        let start = json!({"status": "running"});
        let paths: Vec<String> = ids.iter().map(|id| format!("/tasks/{id}")).collect();
        for answer in join_all(
            paths
                .iter()
                .map(|path| svc.call_ok(Method::PATCH, path, Some(&start), 200)),
        )
        .await
        {
            answer?;
        }
        let worker = &mut self.workers[w];
        let draw = mix(self.seed, w as u64, worker.done);
        worker.done += 1;
        let (minutes, fail) = match pool {
            Pool::Normalizer => (1, false),
            _ => (
                1 + (draw % 5) as usize,
                (draw >> 8).is_multiple_of(FAIL_ONE_IN),
            ),
        };
        worker.job = Some(Job {
            ids,
            keys,
            org,
            boefje,
            until: minute + minutes,
            fail,
        });
        Ok(())
    }

    /// Tasks whose lease the watchdog expired go back to the mirror's queue.
    async fn sweep(&mut self, svc: &Service) -> Result<()> {
        let report = svc.broker.expire_leases().await?;
        for id in report.requeued.iter().chain(&report.failed) {
            let id = id.to_string();
            if let Some(key) = self.mirror.lost.remove(&id) {
                self.mirror.finish(&key);
                if report.requeued.iter().any(|r| r.to_string() == id) {
                    self.record.requeued += 1;
                    self.mirror.queue(id, key);
                }
            }
        }
        Ok(())
    }

    async fn depth(&self, svc: &Service) -> Result<[u64; 2]> {
        let mut out = [0; 2];
        for (i, s) in ["boefje", "normalizer"].iter().enumerate() {
            let v = svc
                .call_ok(Method::GET, &format!("/schedulers/{s}"), None, 200)
                .await?;
            out[i] = v["qsize"].as_u64().unwrap_or(0) + v["pending"].as_u64().unwrap_or(0);
        }
        Ok(out)
    }

    /// The mirror's verdict on a sample of queued tasks, held and not, against explain's.
    async fn check_held(&mut self, svc: &Service) -> Result<()> {
        let mut sample: Vec<(String, bool)> = Vec::new();
        let (mut held, mut free) = (0, 0);
        let mut ids: Vec<(&String, &Key)> = self.mirror.queued.iter().collect();
        ids.sort_by(|a, b| a.0.cmp(b.0));
        for (id, key) in ids {
            let h = self.mirror.held(key);
            if (h && held < 5) || (!h && free < 5) {
                sample.push((id.clone(), h));
                if h {
                    held += 1;
                } else {
                    free += 1;
                }
            }
            if held >= 5 && free >= 5 {
                break;
            }
        }
        for (id, mirror_says) in sample {
            let (status, why) = svc
                .call(Method::GET, &format!("/tasks/{id}/explain"), None)
                .await?;
            if status != 200 || why["wait"]["status"] != "queued" {
                continue;
            }
            let explain_says = why["wait"]["held"]
                .as_array()
                .is_some_and(|h| !h.is_empty());
            self.record.explain_check.1 += 1;
            self.record.explain_check.0 += usize::from(explain_says == mirror_says);
        }
        Ok(())
    }

    /// Creates the day's cron schedules; answers each one's id and first due time.
    async fn schedules(&self, svc: &Service) -> Result<Vec<(String, DateTime<Utc>)>> {
        let mut out = Vec::new();
        for s in &self.day.schedules {
            let org = &self.day.orgs[s.org].name;
            let body = json!({"scheduler_id": "boefje", "organisation": org, "schedule": s.cron,
                "data": {"boefje": {"id": s.boefje}, "organization": org}});
            let made = svc
                .call_ok(Method::POST, "/schedules", Some(&body), 201)
                .await?;
            let id = made["id"]
                .as_str()
                .ok_or("a schedule without id")?
                .to_owned();
            let due: DateTime<Utc> = made["deadline_at"]
                .as_str()
                .ok_or("a schedule without deadline_at")?
                .parse()?;
            out.push((id, due));
        }
        Ok(out)
    }

    /// Every due time of every schedule before `end`: fired on time, late, or skipped.
    async fn fires(
        &mut self,
        svc: &Service,
        made: &[(String, DateTime<Utc>)],
        end: DateTime<Utc>,
    ) -> Result<()> {
        let mut dues = Vec::new();
        for ((id, first), s) in made.iter().zip(&self.day.schedules) {
            let cron = CronExpr::parse(s.cron).map_err(|e| format!("{}: {e}", s.cron))?;
            let mut due = Some(*first);
            while let Some(d) = due.filter(|d| *d <= end) {
                dues.push((id.clone(), d, s.org));
                due = cron.next_after(d);
            }
        }
        let paths: Vec<String> = dues
            .iter()
            .map(|(id, d, _)| format!("/tasks/{}", fire_id(id, Some(d.naive_utc()))))
            .collect();
        let answers = waves(
            paths
                .iter()
                .map(|path| svc.call(Method::GET, path, None))
                .collect(),
        )
        .await;
        for ((_, due, org), answer) in dues.into_iter().zip(answers) {
            let (status, task) = answer?;
            let outcome = match status {
                404 => Outcome::Skipped,
                200 => {
                    let created: DateTime<Utc> = task["created_at"]
                        .as_str()
                        .ok_or("a fired task without created_at")?
                        .parse()?;
                    let late = (created - due).num_seconds();
                    if late > 60 {
                        Outcome::Late(late)
                    } else {
                        Outcome::OnTime
                    }
                }
                other => return Err(format!("GET a fired task answered {other}").into()),
            };
            self.record.fires.push(Fire {
                due_minute: self.minute_of(due),
                org,
                outcome,
            });
        }
        Ok(())
    }
}

/// Replays `day` against a service on `db` in `mode`, from `start`.
pub async fn run(
    day: &Day,
    seed: u64,
    workers: usize,
    db: &str,
    catalogue: &Path,
    mode: Mode,
    start: DateTime<Utc>,
) -> Result<Record> {
    let minutes = day.pushes.len();
    let settings = settings(db, catalogue, mode);
    let clock = Arc::new(ManualClock::new(start));
    let mut svc = Some(Service::start(&settings, clock.clone()).await?);
    let filtered = workers * 3 / 10;
    let mut pool = Vec::new();
    for i in 0..workers + workers / 4 {
        let p = if i < filtered {
            Pool::Filtered
        } else if i < workers {
            Pool::Unfiltered
        } else {
            Pool::Normalizer
        };
        pool.push(Worker {
            pool: p,
            job: None,
            done: 0,
        });
    }
    let mut run = Run {
        day,
        seed,
        start,
        org_index: day
            .orgs
            .iter()
            .enumerate()
            .map(|(i, o)| (o.name.clone(), i))
            .collect(),
        workers: pool,
        mirror: Mirror::default(),
        record: Record::default(),
        raw_files: Vec::new(),
    };
    let made = match &svc {
        Some(s) => run.schedules(s).await?,
        None => Vec::new(),
    };
    let (crash_at, down) = day.crash;
    let mut deferred = Vec::new();
    let progress = (minutes / 8).max(1);
    for minute in 0..minutes {
        clock.set(start + Duration::minutes(minute as i64));
        if minute % progress == 0 {
            eprintln!("  {}: minute {minute} of {minutes}", mode.name);
        }
        if minute == crash_at
            && let Some(s) = svc.take()
        {
            // Runners die with it now and then: their tasks stay `running` in the table until
            // the watchdog's sweep gives them back.
            for (i, w) in run.workers.iter_mut().enumerate() {
                if w.pool != Pool::Normalizer
                    && i % LOST_ONE_IN == 0
                    && let Some(job) = w.job.take()
                {
                    for (id, key) in job.ids.into_iter().zip(job.keys) {
                        run.record.lost += 1;
                        run.mirror.lost.insert(id, key);
                    }
                }
            }
            s.stop().await?;
        }
        if svc.is_none() {
            if minute < crash_at + down {
                // Down: the planner's work waits in RabbitMQ, the runners' results in the
                // runners; nothing is popped.
                deferred.extend(day.pushes[minute].iter().cloned());
                run.record.depth.push(None);
                run.record.held.push(None);
                continue;
            }
            svc = Some(Service::start(&settings, clock.clone()).await?);
            run.record.deferred = deferred.len();
        }
        let Some(s) = &svc else { continue };
        run.push(s, minute, std::mem::take(&mut deferred)).await?;
        s.tick().await;
        run.sweep(s).await?;
        run.finish(s, minute).await?;
        run.pop(s, minute).await?;
        run.record.depth.push(Some(run.depth(s).await?));
        run.record.held.push(Some(run.mirror.counts()));
        if minute % 60 == 30 {
            run.check_held(s).await?;
        }
    }
    if let Some(s) = svc {
        // The last tick ran at the last minute: due times up to it were handled.
        let end = start + Duration::minutes(minutes as i64 - 1);
        run.fires(&s, &made, end).await?;
        s.stop().await?;
    }
    Ok(run.record)
}
