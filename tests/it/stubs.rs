//! Stand-ins for the platform's other services, speaking their real wire format (reference
//! §1.10): Octopoes' object listing and Katalogus' organisations, plugins and configs. Each is a
//! real HTTP server on a free loopback port that records the requests it gets.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use serde_json::{Value, json};

/// A request a stub received.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The path, decoded.
    pub path: String,
    /// The query pairs, decoded, in order.
    pub query: Vec<(String, String)>,
}

impl Seen {
    /// The first value of a query parameter.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a repeated parameter (`types=A&types=B`).
    pub fn params(&self, key: &str) -> Vec<&str> {
        self.query
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// What a stub answers: a status, a JSON body, after a delay.
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub delay: Duration,
    /// Answered only once this barrier's other parties wait too (requests in flight together).
    pub together: Option<Arc<tokio::sync::Barrier>>,
}

impl Reply {
    pub fn json(body: Value) -> Reply {
        Reply {
            status: 200,
            body: body.to_string(),
            delay: Duration::ZERO,
            together: None,
        }
    }

    pub fn status(status: u16, body: &str) -> Reply {
        Reply {
            status,
            body: body.to_owned(),
            delay: Duration::ZERO,
            together: None,
        }
    }
}

type Handler = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

/// A running stub.
pub struct Stub {
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    handle: ServerHandle,
}

impl Stub {
    pub fn start(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Stub {
        let handler: Handler = Arc::new(handler);
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let (h, s) = (handler.clone(), seen.clone());
        let server = HttpServer::new(move || {
            let (h, s) = (h.clone(), s.clone());
            App::new().default_service(web::to(move |req: HttpRequest| {
                let (h, s) = (h.clone(), s.clone());
                async move {
                    let path = percent_decode(req.path());
                    let query = form_urlencoded::parse(req.query_string().as_bytes())
                        .map(|(k, v)| (k.into_owned(), v.into_owned()))
                        .collect();
                    let seen = Seen { path, query };
                    s.lock().unwrap().push(seen.clone());
                    let reply = h(&seen);
                    if let Some(barrier) = &reply.together {
                        barrier.wait().await;
                    }
                    if !reply.delay.is_zero() {
                        tokio::time::sleep(reply.delay).await;
                    }
                    HttpResponse::build(
                        actix_web::http::StatusCode::from_u16(reply.status).unwrap(),
                    )
                    .content_type("application/json")
                    .body(reply.body)
                }
            }))
        })
        .workers(2)
        .disable_signals()
        .bind("127.0.0.1:0")
        .unwrap();
        let port = server.addrs()[0].port();
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        Stub {
            url: format!("http://127.0.0.1:{port}"),
            seen,
            handle,
        }
    }

    /// The requests received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Forgets the requests received so far.
    pub fn clear(&self) {
        self.seen.lock().unwrap().clear();
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        let h = self.handle.clone();
        tokio::spawn(async move { h.stop(false).await });
    }
}

fn percent_decode(path: &str) -> String {
    form_urlencoded::parse(format!("p={}", path.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// One object as Octopoes lists it (`GET /{org}/objects` item).
pub fn octopoes_object(reference: &str, object_type: &str, level: i64) -> Value {
    json!({"object_type": object_type, "primary_key": reference, "user_id": null,
           "scan_profile": {"scan_profile_type": "declared", "reference": reference,
                            "level": level, "user_id": null},
           "name": reference.rsplit('|').next().unwrap_or(reference)})
}

/// Octopoes: per organisation a list of objects, paged by `offset` and `limit`, and one object
/// by its reference (`GET /{org}/object`: 404 naming the object when the organisation lacks it,
/// 404 `Node not found` for an organisation it has no node for, on both, as Octopoes answers); an
/// organisation can be made to fail (500) from an offset on, and the whole service to answer
/// 503 while it is down. A listing can be capped at fewer objects a page than asked (`page_cap`),
/// and its `count` made to claim more objects than it holds (`count_extra`); neither by default.
/// The next request for one object can be held until the test lets it go ([`OctopoesState::hold`]),
/// and requests for one object made to fail (500) while the listing answers
/// ([`OctopoesState::fail_lookups`]).
/// Octopoes' 400 for a record its model refuses (its `ValueError` handler on a pydantic error).
const REFUSED_RECORD: &str = r#"{"detail": "1 validation error for Hostname\nname\n  Field required [type=missing, input_value={'user_id': None}, input_type=dict]"}"#;

#[derive(Clone, Default)]
pub struct OctopoesState {
    pub objects: Arc<Mutex<HashMap<String, Vec<Value>>>>,
    pub fail_from: Arc<Mutex<HashMap<String, u64>>>,
    /// Per organisation, the places in its listing of objects (as each request filters it)
    /// Octopoes cannot read: any page that holds one fails with a 400, as Octopoes fails a listing over a record its model
    /// refuses (its `ValueError` handler answers a pydantic `ValidationError` so).
    pub broken: Arc<Mutex<HashMap<String, Vec<u64>>>>,
    pub down: Arc<std::sync::atomic::AtomicBool>,
    lookups_fail: Arc<std::sync::atomic::AtomicBool>,
    /// References whose lookup (`GET /{org}/object`) Octopoes answers with a 400, as its model
    /// refuses the stored record.
    pub unreadable: Arc<Mutex<HashSet<String>>>,
    pub page_cap: Arc<Mutex<Option<u64>>>,
    pub count_extra: Arc<Mutex<usize>>,
    held: Arc<Mutex<Option<Hold>>>,
    /// Object types Octopoes' model does not have: a listing that names one is answered 400
    /// "Type not found", as its `type_by_name` fails.
    pub unknown_types: Arc<Mutex<HashSet<String>>>,
}

/// A held request: it says it arrived, then waits for its release.
struct Hold {
    arrived: tokio::sync::mpsc::UnboundedSender<()>,
    release: std::sync::mpsc::Receiver<()>,
}

/// The test's side of a held request.
pub struct Held {
    arrived: tokio::sync::mpsc::UnboundedReceiver<()>,
    release: std::sync::mpsc::Sender<()>,
}

impl Held {
    /// Waits (on the stub's signal) until the held request has arrived.
    pub async fn arrived(&mut self) {
        tokio::time::timeout(std::time::Duration::from_secs(30), self.arrived.recv())
            .await
            .expect("the held request arrives")
            .expect("the stub is serving");
    }

    /// Lets the held request be answered.
    pub fn release(self) {
        let _ = self.release.send(());
    }
}

impl OctopoesState {
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }

    /// Holds the next request for one object (`GET /{org}/object`) unanswered until the answer
    /// is released: the app is then mid-decision, between what it read and what it writes.
    pub fn hold(&self) -> Held {
        let (arrived, arrived_rx) = tokio::sync::mpsc::unbounded_channel();
        let (release_tx, release) = std::sync::mpsc::channel();
        *self.held.lock().unwrap() = Some(Hold { arrived, release });
        Held {
            arrived: arrived_rx,
            release: release_tx,
        }
    }

    /// Requests for one object (`GET /{org}/object`) answer 500 while `fail` holds.
    pub fn fail_lookups(&self, fail: bool) {
        self.lookups_fail
            .store(fail, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn set(&self, org: &str, objects: Vec<Value>) {
        self.objects.lock().unwrap().insert(org.to_owned(), objects);
    }

    pub fn fail_from(&self, org: &str, offset: Option<u64>) {
        let mut f = self.fail_from.lock().unwrap();
        match offset {
            Some(o) => f.insert(org.to_owned(), o),
            None => f.remove(org),
        };
    }

    pub fn serve(&self) -> Stub {
        let state = self.clone();
        Stub::start(move |seen| {
            if state.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Reply::status(503, "<html>503 Service Unavailable</html>");
            }
            let parts: Vec<&str> = seen.path.trim_start_matches('/').split('/').collect();
            match parts.as_slice() {
                ["object-clients"] => {
                    let reference = seen.param("reference").unwrap_or_default();
                    let objects = state.objects.lock().unwrap();
                    let held: serde_json::Map<String, Value> = seen
                        .query
                        .iter()
                        .filter(|(k, _)| k == "clients")
                        .filter_map(|(_, org)| {
                            let o = objects
                                .get(org)?
                                .iter()
                                .find(|o| o["primary_key"] == reference)?;
                            Some((org.clone(), o.clone()))
                        })
                        .collect();
                    Reply::json(Value::Object(held))
                }
                [org, "object"] => {
                    let held = state.held.lock().unwrap().take();
                    if let Some(h) = held {
                        // The stub's worker thread waits (the app's own threads do not).
                        let _ = h.arrived.send(());
                        let _ = h.release.recv_timeout(std::time::Duration::from_secs(30));
                    }
                    if state.lookups_fail.load(std::sync::atomic::Ordering::SeqCst) {
                        return Reply::status(500, r#"{"detail": "Internal Server Error"}"#);
                    }
                    let reference = seen.param("reference").unwrap_or_default();
                    if state.unreadable.lock().unwrap().contains(reference) {
                        return Reply::status(400, REFUSED_RECORD);
                    }
                    let objects = state.objects.lock().unwrap();
                    let Some(all) = objects.get(*org) else {
                        return Reply::status(404, r#"{"detail": "Node not found"}"#);
                    };
                    match all.iter().find(|o| o["primary_key"] == reference) {
                        Some(o) => Reply::json(o.clone()),
                        None => Reply::status(404, &json!({ "detail": reference }).to_string()),
                    }
                }
                [org, "objects"] => {
                    let offset: u64 = seen.param("offset").unwrap_or("0").parse().unwrap();
                    let limit: u64 = seen.param("limit").unwrap_or("1000").parse().unwrap();
                    let limit = state
                        .page_cap
                        .lock()
                        .unwrap()
                        .map_or(limit, |c| limit.min(c));
                    if state
                        .fail_from
                        .lock()
                        .unwrap()
                        .get(*org)
                        .is_some_and(|from| offset >= *from)
                    {
                        return Reply::status(500, r#"{"detail": "Internal Server Error"}"#);
                    }
                    if seen
                        .params("types")
                        .iter()
                        .any(|t| state.unknown_types.lock().unwrap().contains(*t))
                    {
                        return Reply::status(400, r#"{"detail": "Type not found"}"#);
                    }
                    if state.broken.lock().unwrap().get(*org).is_some_and(|at| {
                        at.iter()
                            .any(|&i| i >= offset && i < offset.saturating_add(limit))
                    }) {
                        return Reply::status(400, REFUSED_RECORD);
                    }
                    let Some(mut all) = state.objects.lock().unwrap().get(*org).cloned() else {
                        return Reply::status(404, r#"{"detail": "Node not found"}"#);
                    };
                    // Octopoes' filters: repeated `types` and `scan_level`, none meaning all.
                    let (types, levels) = (seen.params("types"), seen.params("scan_level"));
                    all.retain(|o| {
                        (types.is_empty() || types.iter().any(|t| o["object_type"] == *t))
                            && (levels.is_empty()
                                || levels.iter().any(|l| {
                                    l.parse::<i64>().ok() == o["scan_profile"]["level"].as_i64()
                                }))
                    });
                    let items: Vec<Value> = all
                        .iter()
                        .skip(offset as usize)
                        .take(limit as usize)
                        .cloned()
                        .collect();
                    let count = all.len() + *state.count_extra.lock().unwrap();
                    Reply::json(json!({"count": count, "items": items}))
                }
                [_, "health"] => Reply::json(json!({"service": "octopoes", "healthy": true})),
                _ => Reply::status(404, r#"{"detail": "Not Found"}"#),
            }
        })
    }
}

/// One plugin as Katalogus lists it.
pub fn katalogus_boefje(id: &str, consumes: &[&str], scan_level: i64, deduplicate: bool) -> Value {
    json!({"id": id, "name": id, "version": null, "created": null, "description": null,
           "enabled": true, "static": true, "type": "boefje", "scan_level": scan_level,
           "consumes": consumes, "produces": [format!("boefje/{id}")], "boefje_schema": null,
           "cron": null, "interval": null, "run_on": null, "runnable_hash": null,
           "oci_image": format!("ghcr.io/minvws/openkat/{id}:latest"), "oci_arguments": [],
           "deduplicate": deduplicate})
}

/// A normalizer as Katalogus lists it.
pub fn katalogus_normalizer(id: &str, consumes: &[&str]) -> Value {
    json!({"id": id, "name": id, "version": null, "created": null, "description": null,
           "enabled": true, "static": true, "type": "normalizer", "consumes": consumes,
           "produces": ["Hostname"]})
}

/// An organisation and a boefje.
pub type OrgBoefje = (String, String);

/// Katalogus: organisations, their plugins (optionally slow to answer), and which
/// organisations run a boefje with the same settings.
#[derive(Clone, Default)]
pub struct KatalogusState {
    pub plugins: Arc<Mutex<HashMap<String, Vec<Value>>>>,
    pub slow: Arc<Mutex<HashMap<String, Duration>>>,
    /// Organisations whose plugins Katalogus serves but leaves out of its organisations listing
    /// (so the catalogue's refresh never fetches them ahead).
    pub unlisted: Arc<Mutex<HashSet<String>>>,
    /// Organisations whose plugin listings fail (a 500), as Katalogus failing for them.
    pub failing: Arc<Mutex<HashSet<String>>>,
    /// While set, plugin listings are answered only once the barrier's count of them wait
    /// together.
    pub together: Arc<Mutex<Option<Arc<tokio::sync::Barrier>>>>,
    /// (organisation, boefje) → the organisations with the same settings.
    pub duplicates: Arc<Mutex<HashMap<OrgBoefje, Vec<String>>>>,
}

impl KatalogusState {
    /// Every plugin the stub knows of, once each, at Katalogus' default state.
    fn defaults(&self) -> Vec<Value> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for plugins in self.plugins.lock().unwrap().values() {
            for p in plugins {
                if seen.insert(p["id"].clone().to_string()) {
                    let mut p = p.clone();
                    p["enabled"] = json!(p["type"] == "normalizer");
                    out.push(p);
                }
            }
        }
        out
    }

    pub fn serve(&self) -> Stub {
        let state = self.clone();
        Stub::start(move |seen| {
            let parts: Vec<&str> = seen.path.trim_start_matches('/').split('/').collect();
            match parts.as_slice() {
                ["v1", "organisations"] => {
                    let orgs: serde_json::Map<String, Value> = state
                        .plugins
                        .lock()
                        .unwrap()
                        .keys()
                        .filter(|o| !state.unlisted.lock().unwrap().contains(*o))
                        .map(|o| (o.clone(), json!({"id": o, "name": o, "deduplicate": true})))
                        .collect();
                    Reply::json(Value::Object(orgs))
                }
                ["v1", "organisations", org, "plugins"] => {
                    if state.failing.lock().unwrap().contains(*org) {
                        return Reply::status(500, r#"{"detail": "Internal Server Error"}"#);
                    }
                    let plugins = state.plugins.lock().unwrap().get(*org).cloned();
                    let delay = state
                        .slow
                        .lock()
                        .unwrap()
                        .get(*org)
                        .copied()
                        .unwrap_or_default();
                    match plugins {
                        Some(p) => Reply {
                            delay,
                            together: state.together.lock().unwrap().clone(),
                            ..Reply::json(Value::Array(p))
                        },
                        // Katalogus answers an organisation it does not know with its whole
                        // catalogue at the default states (boefjes off, normalizers on), as it
                        // keeps states only for organisations it has: never a 404.
                        None => Reply::json(Value::Array(state.defaults())),
                    }
                }
                ["v1", "configs"] => {
                    let org = seen.param("organisation_id").unwrap_or_default();
                    let boefje = seen.param("boefje_id").unwrap_or_default();
                    let dups = state
                        .duplicates
                        .lock()
                        .unwrap()
                        .get(&(org.to_owned(), boefje.to_owned()))
                        .cloned()
                        .unwrap_or_default();
                    let config = |o: &str| {
                        json!({"id": 1, "settings": {}, "enabled": true, "boefje_id": boefje,
                               "organisation_id": o, "duplicates": []})
                    };
                    let mut c = config(org);
                    c["duplicates"] = Value::Array(dups.iter().map(|o| config(o)).collect());
                    Reply::json(json!([c]))
                }
                ["health"] => Reply::json(json!({"service": "katalogus", "healthy": true})),
                _ => Reply::status(404, r#"{"detail": "Not Found"}"#),
            }
        })
    }
}
