//! A random mix of what the platform's clients send, against a model of the contract, on a heap
//! far smaller than the work: pushes of new and repeated work (boosts, duplicates), the runners'
//! filtered pops, `running` / `completed` / `failed` patches, put-backs (`PATCH queued`), a
//! runtime's give-back (the full task pushed again), cancellations, priority patches, illegal
//! moves, dispatch leases that end, restarts, and (on PostgreSQL) every connection of the service
//! closed by the server between two requests. Tasks move between the heap and the pending
//! backlog all the time (refills, evictions, boosts of pending work), which is where the engine
//! keeps copies of rows it has not written; the model knows nothing of that.
//!
//! After every step the answer must be the model's: a pop hands out the most urgent waiting task
//! its filter matches (priority, then creation, then id), each task once, and is empty only when
//! none waits; a push of work already waiting boosts that task or is a 409 naming it; a task that
//! comes back to wait (put back, given back, its lease ended) while its work was pushed again
//! withdraws that other task and takes the more urgent priority, so no work ever waits twice; a
//! move the state machine refuses is a 409 and changes nothing. Every few steps the counts must add up
//! (`qsize` + `pending` = the waiting tasks, the heap within `maxsize`), and at the end the
//! waiting tasks pop in the model's order and every task's status is the model's, and no heap
//! was rebuilt from the table since the last start (closed connections cost no request and no
//! rebuild).
//! `KAT_MODEL_SEED` replays a run.

use std::collections::HashMap;

use chrono::NaiveDateTime;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::*;
use kat_scheduler::queue::fair::Fairness;

const ORGS: [&str; 3] = ["org-a", "org-b", "org-c"];
/// A popped task's lease: half an hour, so that it ends well within the run lease of a holder
/// that sends no heartbeat (a day), and the leases that may end before it is failed.
const DISPATCH_LEASE_SECS: u64 = 30 * 60;
const MAX_ATTEMPTS: u32 = kat_scheduler::config::DEFAULT_MAX_ATTEMPTS;
/// A user scan's priority: it comes before automatic work, turns or not.
const USER_PRIORITY: i64 = 1;
const BOEFJES: [&str; 4] = ["nmap", "dns-records", "ssl-certificates", "wappalyzer"];

/// One run's shape.
#[derive(Clone, Copy)]
struct Mix {
    /// The boefje heap's `maxsize`.
    maxsize: usize,
    /// Objects the work is for (and one more: none, a boefje run on the organisation). Few
    /// objects make the same work come again often.
    objects: usize,
    /// Distinct work pushed before the mix begins.
    preload: usize,
    steps: usize,
    /// A restart after every this many steps.
    restart_every: usize,
    /// Of every hundred steps, how many push and how many pop (the rest patch, hurry and give
    /// back).
    pushes: usize,
    pops: usize,
    /// Organisations take turns (the boefje scheduler's default): pops are checked for what
    /// turns keep (a waiting match, user scans first, no empty answer while one waits), not for
    /// the order of priority alone.
    fair: bool,
}

fn object(mix: &Mix, i: usize) -> Option<String> {
    (i < mix.objects).then(|| format!("Hostname|internet|h{i}.example.com"))
}

/// Two images: the first two boefjes share one, the others the second.
fn image(boefje: usize) -> String {
    format!("ghcr.io/minvws/openkat/img{}:latest", boefje / 2)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Waiting,
    Dispatched,
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl Status {
    fn of(answer: &str) -> Status {
        match answer {
            "queued" | "pending" => Status::Waiting,
            "dispatched" => Status::Dispatched,
            "running" => Status::Running,
            "completed" => Status::Completed,
            "failed" => Status::Failed,
            "cancelled" => Status::Cancelled,
            other => panic!("a status the API does not answer: {other}"),
        }
    }
}

/// The work a task does: organisation, boefje and object, by index (its hash).
type Work = (usize, usize, usize);

struct Task {
    id: String,
    work: Work,
    priority: i64,
    created_at: NaiveDateTime,
    status: Status,
    /// The task as a pop answered it (what a runtime pushes back).
    popped: Option<Value>,
    /// Leases that ended while it was out.
    attempts: u32,
    /// Taken back by the watchdog, and no `running` or `completed` since: its old holder's word
    /// is still taken (a late `running` or result).
    taken_back: bool,
}

impl Task {
    fn rank(&self) -> (i64, NaiveDateTime, &str) {
        (self.priority, self.created_at, &self.id)
    }
}

/// A runner's filter: the organisation column, images or boefje ids, or an organisation and an
/// image together.
#[derive(Clone, Debug)]
enum Filter {
    None,
    Orgs(Vec<usize>),
    Images(Vec<usize>),
    Boefjes(Vec<usize>),
    OrgAndImage(usize, usize),
}

impl Filter {
    fn random(rng: &mut Rng) -> Filter {
        let some = |rng: &mut Rng, n: usize| -> Vec<usize> {
            let mut v: Vec<usize> = (0..1 + rng.below(2)).map(|_| rng.below(n)).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        match rng.below(6) {
            0 | 1 => Filter::None,
            2 => Filter::Orgs(some(rng, ORGS.len())),
            3 => Filter::Images(some(rng, 2)),
            4 => Filter::Boefjes(some(rng, BOEFJES.len())),
            _ => Filter::OrgAndImage(rng.below(ORGS.len()), rng.below(2)),
        }
    }

    fn matches(&self, w: Work) -> bool {
        let (org, boefje, _) = w;
        match self {
            Filter::None => true,
            Filter::Orgs(o) => o.contains(&org),
            Filter::Images(i) => i.contains(&(boefje / 2)),
            Filter::Boefjes(b) => b.contains(&boefje),
            Filter::OrgAndImage(o, i) => *o == org && *i == boefje / 2,
        }
    }

    /// The body a runner sends: the filter language's list of conditions.
    fn body(&self) -> Option<Value> {
        let org = |o: &[usize]| {
            if let [one] = o {
                json!({"column": "organisation", "operator": "==", "value": ORGS[*one]})
            } else {
                let v: Vec<&str> = o.iter().map(|&i| ORGS[i]).collect();
                json!({"column": "organisation", "operator": "in", "value": v})
            }
        };
        let images = |i: &[usize]| {
            let v: Vec<String> = i.iter().map(|&i| image(2 * i)).collect();
            json!({"column": "data", "field": "boefje__oci_image", "operator": "in", "value": v})
        };
        let conds = match self {
            Filter::None => return None,
            Filter::Orgs(o) => vec![org(o)],
            Filter::Images(i) => vec![images(i)],
            Filter::Boefjes(b) => {
                let v: Vec<&str> = b.iter().map(|&i| BOEFJES[i]).collect();
                vec![json!({"column": "data", "field": "boefje__id", "operator": "in", "value": v})]
            }
            Filter::OrgAndImage(o, i) => vec![org(&[*o]), images(&[*i])],
        };
        Some(json!({ "filters": conds }))
    }
}

#[derive(Default)]
struct Model {
    tasks: Vec<Task>,
    by_id: HashMap<String, usize>,
    /// Tasks withdrawn because their work came back to wait as another task.
    withdrawn: usize,
}

impl Model {
    fn get(&mut self, id: &str) -> &mut Task {
        let at = self.by_id[id];
        &mut self.tasks[at]
    }

    /// The most urgent waiting task `filter` matches.
    fn best(&self, filter: &Filter) -> Option<&Task> {
        self.tasks
            .iter()
            .filter(|t| t.status == Status::Waiting && filter.matches(t.work))
            .min_by(|a, b| a.rank().cmp(&b.rank()))
    }

    fn waiting(&self) -> Vec<&Task> {
        let mut w: Vec<&Task> = self
            .tasks
            .iter()
            .filter(|t| t.status == Status::Waiting)
            .collect();
        w.sort_by(|a, b| a.rank().cmp(&b.rank()));
        w
    }

    /// The waiting tasks of `work` (never more than one), with their priorities.
    fn waiting_for(&self, work: Work) -> Vec<(String, i64)> {
        self.tasks
            .iter()
            .filter(|t| t.status == Status::Waiting && t.work == work)
            .map(|t| (t.id.clone(), t.priority))
            .collect()
    }

    /// A random task in one of `statuses`, if any.
    fn pick(&self, rng: &mut Rng, statuses: &[Status]) -> Option<String> {
        let ids: Vec<&Task> = self
            .tasks
            .iter()
            .filter(|t| statuses.contains(&t.status))
            .collect();
        (!ids.is_empty()).then(|| ids[rng.below(ids.len())].id.clone())
    }

    /// Task `id` comes back to wait: any other task of its work that waits is withdrawn
    /// (`cancelled`), and it takes the most urgent of their priorities. Answers its priority.
    fn came_back(&mut self, id: &str) -> i64 {
        let work = self.get(id).work;
        let mut priority = self.get(id).priority;
        for t in &mut self.tasks {
            if t.id != id && t.work == work && t.status == Status::Waiting {
                priority = priority.min(t.priority);
                t.status = Status::Cancelled;
                self.withdrawn += 1;
            }
        }
        let t = self.get(id);
        t.status = Status::Waiting;
        t.priority = priority;
        priority
    }

    fn add(&mut self, task: &Value, work: Work) {
        let id = id_of(task);
        self.by_id.insert(id.clone(), self.tasks.len());
        self.tasks.push(Task {
            id,
            work,
            priority: task["priority"].as_i64().unwrap(),
            created_at: time_of(task),
            status: Status::of(task["status"].as_str().unwrap()),
            popped: None,
            attempts: 0,
            taken_back: false,
        });
    }
}

fn time_of(task: &Value) -> NaiveDateTime {
    let s = task["created_at"].as_str().expect("created_at");
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.naive_utc())
        .or_else(|_| NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f"))
        .unwrap_or_else(|e| panic!("created_at {s}: {e}"))
}

fn push_body(mix: &Mix, w: Work, priority: i64) -> Value {
    let (org, boefje, ooi) = w;
    let ooi = object(mix, ooi);
    let mut body = boefje_push(ORGS[org], BOEFJES[boefje], ooi.as_deref(), priority);
    body["data"]["boefje"]["oci_image"] = json!(image(boefje));
    body
}

/// One step's context, for the failure message.
struct Step<'a> {
    n: usize,
    seed: u64,
    backend: &'a Backend,
    mix: &'a Mix,
}

impl std::fmt::Display for Step<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {} ({:?}, maxsize {}; replay with KAT_MODEL_SEED={})",
            self.n, self.backend, self.mix.maxsize, self.seed
        )
    }
}

async fn push(app: &TestApp, model: &mut Model, rng: &mut Rng, at: &Step<'_>) {
    let w = (
        rng.below(ORGS.len()),
        rng.below(BOEFJES.len()),
        rng.below(at.mix.objects + 1),
    );
    push_work(app, model, w, 1 + rng.below(9) as i64, at).await;
}

async fn push_work(app: &TestApp, model: &mut Model, w: Work, priority: i64, at: &Step<'_>) {
    app.advance(chrono::Duration::milliseconds(1));
    let resp = app.push("boefje", &push_body(at.mix, w, priority)).await;
    let code = resp.status();
    let same = model.waiting_for(w);
    assert!(same.len() <= 1, "{at}: the same work waits twice: {same:?}");
    match code {
        StatusCode::CREATED => {
            assert!(
                same.is_empty(),
                "{at}: work already waiting as {same:?} was stored again"
            );
            model.add(&resp.json().await.unwrap(), w);
        }
        StatusCode::OK => {
            let task: Value = resp.json().await.unwrap();
            let id = id_of(&task);
            let was = same.iter().find(|(s, _)| *s == id).map(|(_, p)| *p);
            assert!(
                was.is_some_and(|p| priority < p),
                "{at}: a push at {priority} answered 200 with {id}, not a less urgent waiting task of the same work ({same:?})"
            );
            assert_eq!(task["priority"], priority, "{at}: the boost's answer");
            assert_eq!(
                Status::of(task["status"].as_str().unwrap()),
                Status::Waiting
            );
            model.get(&id).priority = priority;
        }
        StatusCode::CONFLICT => {
            let detail = detail(resp).await;
            assert!(
                same.iter()
                    .any(|(id, p)| *p <= priority && detail.contains(id.as_str())),
                "{at}: a push at {priority} refused ({detail}), while the same work waits as {same:?}"
            );
        }
        other => panic!("{at}: push answered {other}: {}", detail(resp).await),
    }
}

async fn pop(app: &TestApp, model: &mut Model, rng: &mut Rng, at: &Step<'_>) {
    let filter = Filter::random(rng);
    let resp = app.pop("boefje", Some(1), filter.body().as_ref()).await;
    if resp.status() != StatusCode::OK {
        let code = resp.status();
        panic!(
            "{at}: a pop with {filter:?} answered {code}: {}",
            detail(resp).await
        );
    }
    let body: Value = resp.json().await.unwrap();
    let got = body["results"].as_array().unwrap().clone();
    let want = model.best(&filter).map(|t| t.id.clone());
    let ids: Vec<String> = got.iter().map(id_of).collect();
    let waiting = || {
        model
            .waiting()
            .iter()
            .map(|t| (t.id.clone(), t.priority, t.work))
            .collect::<Vec<_>>()
    };
    if at.mix.fair {
        // Organisations take turns: any waiting match may come first, except that user scans
        // come before automatic work; never an empty answer while a match waits.
        assert_eq!(
            ids.len(),
            usize::from(want.is_some()),
            "{at}: a pop with {filter:?} (waiting: {:?})",
            waiting()
        );
        if let Some(id) = ids.first() {
            let t = &model.tasks[model.by_id[id]];
            assert!(
                t.status == Status::Waiting && filter.matches(t.work),
                "{at}: a pop with {filter:?} handed out {id} ({:?}, work {:?})",
                t.status,
                t.work
            );
            let best = model.best(&filter).map_or(0, |b| b.priority);
            assert!(
                best > USER_PRIORITY || t.priority <= USER_PRIORITY,
                "{at}: automatic work {id} ({}) before a user scan",
                t.priority
            );
        }
    } else {
        assert_eq!(
            ids,
            want.iter().cloned().collect::<Vec<_>>(),
            "{at}: a pop with {filter:?} (the model's waiting tasks, best first: {:?})",
            waiting()
        );
    }
    if let Some(task) = got.into_iter().next() {
        assert_eq!(task["status"], "dispatched", "{at}");
        let t = model.get(&id_of(&task));
        t.status = Status::Dispatched;
        t.popped = Some(task);
    }
}

/// A patch the state machine allows, or (now and then) one it refuses.
async fn patch(app: &TestApp, model: &mut Model, rng: &mut Rng, at: &Step<'_>) {
    use Status::*;
    let (id, to, legal) = match rng.below(10) {
        0..=5 => {
            let Some(id) = model.pick(rng, &[Dispatched, Running]) else {
                return;
            };
            let from = model.get(&id).status;
            let to = match (from, rng.below(6)) {
                (Dispatched, 0 | 1) => "running",
                (_, 0..=2) => "completed",
                (_, 3) => "failed",
                (_, 4) => "queued",
                _ => "cancelled",
            };
            (id, to, true)
        }
        6 | 7 => {
            let Some(id) = model.pick(rng, &[Waiting]) else {
                return;
            };
            (
                id,
                if rng.below(2) == 0 {
                    "cancelled"
                } else {
                    "failed"
                },
                true,
            )
        }
        _ => {
            let Some(id) = model.pick(rng, &[Completed, Failed, Cancelled]) else {
                return;
            };
            let to = if rng.below(2) == 0 {
                "running"
            } else {
                "queued"
            };
            // A task failed by the watchdog still takes its old holder's late `running`.
            let t = model.get(&id);
            let late = t.taken_back && t.status == Failed && to == "running";
            (id, to, late)
        }
    };
    let resp = app.patch_task(&id, &json!({ "status": to })).await;
    if !legal {
        assert_eq!(resp.status(), StatusCode::CONFLICT, "{at}: {id} to {to}");
        return;
    }
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "{at}: {id} from {:?} to {to}",
        model.get(&id).status
    );
    let task: Value = resp.json().await.unwrap();
    let status = Status::of(task["status"].as_str().unwrap());
    assert_eq!(status, Status::of(to), "{at}: {id} patched to {to}");
    if to == "queued" {
        let priority = model.came_back(&id);
        assert_eq!(task["priority"], priority, "{at}: {id} put back");
    }
    let t = model.get(&id);
    let was = t.status;
    t.status = status;
    // Its holder ran it, or failed it as the holder it was handed out to again: the expiry
    // that took it back is history, and no late word revives it.
    if matches!(status, Running | Completed)
        || status == Failed && matches!(was, Dispatched | Running)
    {
        t.taken_back = false;
    }
}

/// The dispatch lease passes: the watchdog takes back every task still `dispatched` (its runner
/// never reported), to wait again, or failed once it has used up its attempts. `running` tasks
/// keep their run lease (a day, for holders that send no heartbeat: longer than a run's lapses
/// add up to).
async fn lapse(app: &TestApp, model: &mut Model, at: &Step<'_>) {
    app.advance(chrono::Duration::seconds(DISPATCH_LEASE_SECS as i64 + 1));
    let report = app.sweep().await;
    let (mut requeued, mut failed) = (Vec::new(), Vec::new());
    for t in &mut model.tasks {
        if t.status != Status::Dispatched {
            continue;
        }
        t.attempts += 1;
        t.taken_back = true;
        if t.attempts >= MAX_ATTEMPTS {
            t.status = Status::Failed;
            failed.push(t.id.clone());
        } else {
            requeued.push(t.id.clone());
        }
    }
    // Each comes back to wait, one after another in an order the sweep chooses: of the tasks of
    // one work that came back in it, the last stays, so which one stays is read from the service
    // (it must be one of them, and the only one of the work still waiting), and it comes back
    // last here. The others of them were withdrawn with the priority they had then, which
    // depends on the order between them too, so that is read from the service as well.
    let mut order = requeued.clone();
    let mut read_back = Vec::new();
    let mut works: Vec<Work> = requeued.iter().map(|id| model.get(id).work).collect();
    works.sort_unstable();
    works.dedup();
    for w in works {
        let back: Vec<String> = requeued
            .iter()
            .filter(|id| model.get(id).work == w)
            .cloned()
            .collect();
        if back.len() < 2 {
            continue;
        }
        let mut waiting = Vec::new();
        for id in &back {
            if app.task(id).await["status"] != "cancelled" {
                waiting.push(id.clone());
            }
        }
        assert_eq!(
            waiting.len(),
            1,
            "{at}: tasks of one work taken back in one sweep: {back:?}, still waiting {waiting:?}"
        );
        order.retain(|id| *id != waiting[0]);
        order.push(waiting[0].clone());
        read_back.extend(back.into_iter().filter(|id| *id != waiting[0]));
    }
    for id in &order {
        let work = model.get(id).work;
        let before: Vec<String> = model
            .waiting_for(work)
            .into_iter()
            .map(|(w, _)| w)
            .filter(|w| w != id)
            .collect();
        let priority = model.came_back(id);
        let t = app.task(id).await;
        // One withdrawn by another task of its work that came back after it in the sweep is
        // read back below.
        if !before.is_empty() && t["status"] != "cancelled" {
            assert_eq!(
                t["priority"], priority,
                "{at}: {id}, taken back by the sweep while the same work waited as {before:?}, takes the more urgent priority: {t}"
            );
        }
        for w in before {
            let t = app.task(&w).await;
            assert_eq!(
                t["status"],
                "cancelled",
                "{at}: {w}, waiting for the same work as {id} taken back by the sweep, is withdrawn: {t} (the one taken back: {})",
                app.task(id).await
            );
        }
    }
    for id in &read_back {
        model.get(id).priority = app.task(id).await["priority"].as_i64().unwrap();
    }
    let sorted = |ids: &[uuid::Uuid]| {
        let mut v: Vec<String> = ids.iter().map(|u| u.to_string()).collect();
        v.sort();
        v
    };
    requeued.sort();
    failed.sort();
    assert_eq!(
        (sorted(&report.requeued), sorted(&report.failed)),
        (requeued, failed),
        "{at}: the watchdog's sweep (requeued, failed)"
    );
}

/// A more urgent priority for a waiting task, as an operator sets one.
async fn hurry(app: &TestApp, model: &mut Model, rng: &mut Rng, at: &Step<'_>) {
    let Some(id) = model.pick(rng, &[Status::Waiting]) else {
        return;
    };
    let p = model.get(&id).priority;
    if p <= 1 {
        return;
    }
    let to = 1 + rng.below((p - 1) as usize) as i64;
    let resp = app.patch_task(&id, &json!({ "priority": to })).await;
    assert_eq!(resp.status(), StatusCode::OK, "{at}: {id} to priority {to}");
    model.get(&id).priority = to;
}

/// A runtime stopping gives back a task it was handed: the task as it got it, pushed again. It
/// waits again; should the same work wait already as another task (pushed while this one was
/// out), that task is withdrawn and this one takes the more urgent priority.
async fn give_back(app: &TestApp, model: &mut Model, rng: &mut Rng, at: &Step<'_>) {
    let Some(id) = model.pick(rng, &[Status::Dispatched, Status::Running]) else {
        return;
    };
    let t = model.get(&id);
    let (body, work, status) = (t.popped.clone().expect("popped"), t.work, t.status);
    let same: Vec<String> = model
        .waiting_for(work)
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let resp = app.push("boefje", &body).await;
    let code = resp.status();
    if status == Status::Running {
        // Runtimes give back only tasks they have not started: a running one is another
        // runner's, and stays as it is.
        let text = resp.text().await.unwrap();
        assert_eq!(
            code,
            StatusCode::CONFLICT,
            "{at}: give-back of running {id}: {text}"
        );
        assert_eq!(
            Status::of(app.task(&id).await["status"].as_str().unwrap()),
            Status::Running,
            "{at}"
        );
        return;
    }
    match code {
        StatusCode::OK => {
            let task: Value = resp.json().await.unwrap();
            assert_eq!(id_of(&task), id, "{at}");
            assert_eq!(
                Status::of(task["status"].as_str().unwrap()),
                Status::Waiting
            );
            let priority = model.came_back(&id);
            if task["priority"] != priority {
                let mut seen = Vec::new();
                for s in &same {
                    let t = app.task(s).await;
                    seen.push((
                        s.clone(),
                        t["status"].clone(),
                        t["priority"].clone(),
                        t["hash"].clone(),
                    ));
                }
                panic!(
                    "{at}: {id} given back ({status:?}, hash {}) with priority {}, the model's {priority}; the same work waiting as, in the table, {seen:?}",
                    task["hash"], task["priority"]
                );
            }
        }
        _ => {
            let body = resp.text().await.unwrap();
            let mut seen = Vec::new();
            for s in &same {
                let t = app.task(s).await;
                seen.push((
                    t["status"].clone(),
                    t["hash"].clone(),
                    t["priority"].clone(),
                ));
            }
            let me = app.task(&id).await;
            panic!(
                "{at}: give-back of {id} ({status:?}, hash {}; the same work waiting as {same:?}, in the table {seen:?}) answered {code}: {body}",
                me["hash"]
            )
        }
    }
}

async fn counts_add_up(app: &TestApp, model: &Model, at: &Step<'_>) {
    let s: Value = app.get("/schedulers/boefje").await.json().await.unwrap();
    let (q, p) = (
        s["qsize"].as_u64().unwrap() as usize,
        s["pending"].as_u64().unwrap() as usize,
    );
    let waiting = model.waiting().len();
    let max = at.mix.maxsize;
    assert!(q <= max, "{at}: qsize {q} beyond maxsize {max}");
    // (Whether the heap is full right now depends on whether the refill after the last pop
    // has run yet; what pops hand out is checked against the model's order at every step.)
    assert_eq!(q + p, waiting, "{at}: qsize {q} + pending {p}");
}

/// Runs `mix` against the model on `backend`.
async fn run(backend: Backend, mix: Mix) {
    let tweak = |s: &mut kat_scheduler::config::Settings| {
        s.queue.maxsize = mix.maxsize;
        s.queue.dispatch_timeout_secs = DISPATCH_LEASE_SECS;
        if !mix.fair {
            s.schedulers.boefje.fairness = Some(Fairness::Off);
        }
    };
    let Some(mut app) = spawn_app_with(backend, tweak).await else {
        return;
    };
    let seed = seed_from_env("KAT_MODEL_SEED", "the clients' mix against the model");
    let mut rng = Rng(seed);
    let mut model = Model::default();
    let step = |n| Step {
        n,
        seed,
        backend: &backend,
        mix: &mix,
    };
    for i in 0..mix.preload {
        let w = (i % ORGS.len(), (i / ORGS.len()) % BOEFJES.len(), i / 12);
        push_work(&app, &mut model, w, 2 + rng.below(8) as i64, &step(0)).await;
    }
    let mut cuts = 0;
    let mut rebuilt = app.metric(REBUILDS).await;
    for n in 0..mix.steps {
        let at = step(n);
        let (pushes, pops) = (mix.pushes, mix.pushes + mix.pops);
        // On PostgreSQL, now and then the server closes every connection the service has just
        // before the step's request (a restart of the server, an administrator ending the
        // sessions): the engine's kept connection, the refill's, the pool's idle ones. The
        // answer must still be the model's: nothing had run on them, so the service must go on
        // on fresh ones without a client seeing it. (A connection that breaks under a `COMMIT`
        // leaves the outcome unknown, and a 503 is the honest answer; the model cannot judge
        // that, so its cuts fall between requests.)
        if backend == Backend::Postgres && rng.below(CUT_ONE_IN) == 0 {
            cuts += usize::from(terminate_connections(&app.db.uri).await > 0);
        }
        match rng.below(100) {
            _ if rng.below(100) == 0 => lapse(&app, &mut model, &at).await,
            k if k < pushes => push(&app, &mut model, &mut rng, &at).await,
            k if k < pops => pop(&app, &mut model, &mut rng, &at).await,
            k if k < pops + (100 - pops) * 2 / 3 => patch(&app, &mut model, &mut rng, &at).await,
            k if k < pops + (100 - pops) * 5 / 6 => hurry(&app, &mut model, &mut rng, &at).await,
            _ => give_back(&app, &mut model, &mut rng, &at).await,
        }
        if n % 20 == 19 {
            counts_add_up(&app, &model, &at).await;
        }
        if n % mix.restart_every == mix.restart_every - 1 {
            app = app.restart().await;
            counts_add_up(&app, &model, &at).await;
            rebuilt = app.metric(REBUILDS).await;
        }
    }
    let at = step(mix.steps);
    // Work comes again often on few objects: tasks came back to wait while their work waited.
    assert!(
        mix.objects > 10 || model.withdrawn > 0,
        "{at}: no task came back to wait while its work waited"
    );
    if backend == Backend::Postgres {
        assert!(
            cuts * CUT_ONE_IN * 3 >= mix.steps,
            "{at}: the service's connections were there to close ({cuts} cuts)"
        );
    }
    // Nothing the mix does leaves an engine unsure of the table, closed connections included:
    // no heap was rebuilt since the last start.
    assert_eq!(app.metric(REBUILDS).await, rebuilt, "{at}: heaps rebuilt");
    // Every task's status and priority are the model's ...
    for t in &model.tasks {
        let got = app.task(&t.id).await;
        assert_eq!(
            (
                Status::of(got["status"].as_str().unwrap()),
                got["priority"].as_i64()
            ),
            (t.status, Some(t.priority)),
            "{at}: task {}",
            t.id
        );
    }
    // ... and the waiting ones pop in its order, then nothing.
    let order: Vec<String> = model.waiting().iter().map(|t| t.id.clone()).collect();
    let mut popped = Vec::new();
    loop {
        let got = app.pop_ok("boefje", 1, None).await;
        let Some(t) = got.first() else { break };
        popped.push(id_of(t));
        assert!(popped.len() <= order.len(), "{at}: more popped than waited");
    }
    if mix.fair {
        let (mut a, mut b) = (popped, order);
        a.sort();
        b.sort();
        assert_eq!(a, b, "{at}: the waiting tasks drained, in turns");
    } else {
        assert_eq!(popped, order, "{at}: the waiting tasks drained");
    }
}

/// One step in so many has the server close the service's connections just before it (PostgreSQL).
const CUT_ONE_IN: usize = 50;

/// A heap of five and work that comes again often: boosts, duplicates and evictions at most
/// steps, a refill after every pop, the engine's copies of rows read but not written met by
/// every kind of request.
const SMALL: Mix = Mix {
    maxsize: 5,
    objects: 3,
    preload: 0,
    steps: 1_200,
    restart_every: 400,
    pushes: 38,
    pops: 32,
    fair: false,
};

async fn a_random_mix_of_the_clients_requests_answers_as_the_model_does(backend: Backend) {
    run(backend, SMALL).await;
}

/// A heap of a thousand over a backlog: refills of a hundred tasks and more (the room of a tenth
/// of the heap), which on PostgreSQL read on a connection of their own beside the engine while
/// pops of the heap go on.
async fn the_same_mix_over_a_backlog_with_refills_beside_the_engine(backend: Backend) {
    let mix = Mix {
        maxsize: 1_000,
        objects: 300,
        preload: 2_500,
        steps: 2_000,
        restart_every: 1_000,
        // Pops well ahead of pushes, so the heap's room reaches a tenth again and again.
        pushes: 10,
        pops: 65,
        fair: false,
    };
    run(backend, mix).await;
}

/// The heap of five with organisations taking turns, as the boefje scheduler runs by default.
async fn the_mix_with_organisations_taking_turns(backend: Backend) {
    run(
        backend,
        Mix {
            fair: true,
            ..SMALL
        },
    )
    .await;
}

crate::backend_tests!(
    a_random_mix_of_the_clients_requests_answers_as_the_model_does,
    the_same_mix_over_a_backlog_with_refills_beside_the_engine,
    the_mix_with_organisations_taking_turns
);
