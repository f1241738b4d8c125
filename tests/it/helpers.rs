//! `spawn_app()` and a helper per endpoint. Each test gets the real application on port 0 with a
//! fresh database: a temporary SQLite file, or a new PostgreSQL database (dropped afterwards).
//!
//! PostgreSQL is found at `KAT_TEST_PG_URL` (default `postgresql://postgres@127.0.0.1:5432/postgres`).
//! When it does not answer, PostgreSQL tests print a loud SKIPPED line and pass, except under
//! `CI=true`, where a missing server fails them.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use diesel::connection::SimpleConnection;
use diesel::{Connection, PgConnection, SqliteConnection};
use kat_scheduler::clock::{Clock, ManualClock};
use kat_scheduler::config::Settings;
use kat_scheduler::startup::Application;
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The counter of heaps rebuilt from the table (the start's included), for tests that must see
/// none after it.
pub const REBUILDS: &str = "scheduler_engine_rebuilds_total";

/// Which database a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Generates `sqlite::name` and `postgres::name` tests from `async fn name(backend: Backend)`.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::helpers::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::helpers::Backend::Postgres).await
                }
            )*
        }
    };
}

fn pg_admin_url() -> String {
    std::env::var("KAT_TEST_PG_URL")
        .unwrap_or_else(|_| "postgresql://postgres@127.0.0.1:5432/postgres".into())
}

/// RabbitMQ for listener tests: `KAT_TEST_AMQP_URL` (default the local broker, guest/guest), if
/// it accepts connections; else a loud SKIPPED line (a failure under `CI=true`).
pub async fn rabbitmq() -> Option<String> {
    let url = std::env::var("KAT_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let connect = lapin::Connection::connect(&url, lapin::ConnectionProperties::default());
    match tokio::time::timeout(std::time::Duration::from_secs(5), connect).await {
        Ok(Ok(conn)) => {
            let _ = conn.close(200, "probe".into()).await;
            Some(url)
        }
        other => {
            let why = match other {
                Ok(Err(e)) => e.to_string(),
                _ => "timed out".into(),
            };
            if in_ci() {
                panic!("RabbitMQ is required under CI=true but not reachable at {url}: {why}");
            }
            eprintln!(
                "\n*** SKIPPED: RabbitMQ not reachable at {url} ({why}); set KAT_TEST_AMQP_URL or start it ***\n"
            );
            None
        }
    }
}

/// Listener queues of a test's own (object events and raw files, each with its `.dead` queue),
/// declared on a connection of the test's, with the channel to publish on.
pub struct TestQueues {
    pub conn: lapin::Connection,
    pub channel: lapin::Channel,
    pub mutations: String,
    pub raw_files: String,
}

impl TestQueues {
    pub async fn declare(url: &str) -> TestQueues {
        Self::declare_with(url, lapin::types::FieldTable::default()).await
    }

    /// The same, each queue declared with `arguments` (an operator's quorum queues, say).
    pub async fn declare_with(url: &str, arguments: lapin::types::FieldTable) -> TestQueues {
        let queues = Self::named(url).await;
        declare_with_dead(
            &queues.channel,
            &[&queues.mutations, &queues.raw_files],
            arguments,
        )
        .await;
        queues
    }

    /// Names of their own and a channel, nothing declared.
    pub async fn named(url: &str) -> TestQueues {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let (mutations, raw_files) = (format!("muts-{suffix}"), format!("raws-{suffix}"));
        let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .unwrap();
        let channel = conn.create_channel().await.unwrap();
        TestQueues {
            conn,
            channel,
            mutations,
            raw_files,
        }
    }
}

/// Declares each queue and its `.dead` queue, durable, on `channel`: done before anything is
/// published, so nothing is dropped on the floor.
/// Each is declared with `arguments` (none: a plain durable queue).
pub async fn declare_with_dead(
    channel: &lapin::Channel,
    queues: &[&str],
    arguments: lapin::types::FieldTable,
) {
    for q in queues {
        for name in [q.to_string(), format!("{q}.dead")] {
            channel
                .queue_declare(
                    name.as_str().into(),
                    lapin::options::QueueDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    arguments.clone(),
                )
                .await
                .unwrap();
        }
    }
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// A database made for one test.
pub struct TestDb {
    pub uri: String,
    pg_name: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// A fresh database, or `None` (after a loud message) when PostgreSQL is absent outside CI.
    pub async fn create(backend: Backend) -> Option<TestDb> {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let uri = format!("sqlite://{}", dir.path().join("scheduler.db").display());
                Some(TestDb {
                    uri,
                    pg_name: None,
                    _dir: Some(dir),
                })
            }
            Backend::Postgres => {
                let admin = pg_admin_url();
                let name = format!("kat_test_{}", uuid::Uuid::new_v4().simple());
                let create = {
                    let (admin, name) = (admin.clone(), name.clone());
                    tokio::task::spawn_blocking(move || -> Result<(), String> {
                        let mut conn =
                            PgConnection::establish(&admin).map_err(|e| e.to_string())?;
                        conn.batch_execute(&format!("CREATE DATABASE {name}"))
                            .map_err(|e| e.to_string())
                    })
                    .await
                    .expect("join")
                };
                if let Err(e) = create {
                    if in_ci() {
                        panic!("PostgreSQL at {admin} is required under CI=true: {e}");
                    }
                    eprintln!(
                        "\n*** SKIPPED: PostgreSQL not reachable at {admin} ({e}); set KAT_TEST_PG_URL or start it ***\n"
                    );
                    return None;
                }
                let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
                Some(TestDb {
                    uri: format!("{base}/{name}"),
                    pg_name: Some(name),
                    _dir: None,
                })
            }
        }
    }
}

impl TestDb {
    /// A database the test manages itself (nothing is dropped afterwards).
    pub fn external(uri: &str) -> TestDb {
        TestDb {
            uri: uri.to_owned(),
            pg_name: None,
            _dir: None,
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = self.pg_name.take() {
            let admin = pg_admin_url();
            // Blocking in drop is fine in a test; FORCE ends connections a pool still holds.
            let _ = std::thread::spawn(move || {
                if let Ok(mut conn) = PgConnection::establish(&admin) {
                    let _ =
                        conn.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
                }
            })
            .join();
        }
    }
}

/// Settings for a test app on `uri`: loopback, port 0, a small pool.
pub fn test_settings(uri: &str) -> Settings {
    let mut s = Settings::default();
    s.api.host = "127.0.0.1".into();
    s.api.port = 0;
    s.api.workers = 2;
    s.database.uri = uri.to_owned();
    s.database.pool_size = 6;
    // Tests run sweeps and ticks themselves, on the manual clock.
    s.queue.watchdog_interval_secs = 0;
    s.cron.tick_secs = 0;
    // Deadlines to the second: the spread over schedules (5 h by default) is the unit tests'
    // (`domain::schedule`).
    s.cron.jitter_secs = 0;
    s
}

/// A running application and a client for it.
pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    pub clock: Arc<ManualClock>,
    pub settings: Settings,
    pub backend: Backend,
    pub broker: kat_scheduler::queue::Broker,
    pub listener: Arc<kat_scheduler::listener::ListenerStatus>,
    pub coldstart: Arc<kat_scheduler::coldstart::ColdStartStatus>,
    pub cron: kat_scheduler::cron::Cron,
    /// The plugin catalogue (a test refreshes it as the background refresh would).
    pub catalogue: kat_scheduler::clients::catalogue::Catalogue,
    /// The planner, handed events as the listener hands them.
    pub planner: kat_scheduler::planner::Planner,
    token: CancellationToken,
    join: Option<JoinHandle<anyhow::Result<()>>>,
    pub db: TestDb,
}

fn init_logs() {
    if std::env::var("TEST_LOG").is_ok() {
        kat_scheduler::telemetry::init(&Settings::default().logging);
    }
}

/// A test start time: now, so the last-24-hours statistics include what tests create.
pub fn start_time() -> DateTime<Utc> {
    kat_scheduler::clock::truncate_micros(Utc::now())
}

/// The app on a fresh database with default settings.
pub async fn spawn_app(backend: Backend) -> Option<TestApp> {
    spawn_app_with(backend, |_| {}).await
}

/// The app on a fresh database, with `tweak` applied to its settings.
pub async fn spawn_app_with(
    backend: Backend,
    tweak: impl FnOnce(&mut Settings),
) -> Option<TestApp> {
    init_logs();
    let db = TestDb::create(backend).await?;
    Some(spawn_app_on(db, backend, tweak).await)
}

/// The app on a given database.
pub async fn spawn_app_on(
    db: TestDb,
    backend: Backend,
    tweak: impl FnOnce(&mut Settings),
) -> TestApp {
    let mut settings = test_settings(&db.uri);
    tweak(&mut settings);
    let clock = Arc::new(ManualClock::new(start_time()));
    TestApp::start(settings, clock, db, backend).await
}

impl TestApp {
    async fn start(
        settings: Settings,
        clock: Arc<ManualClock>,
        db: TestDb,
        backend: Backend,
    ) -> TestApp {
        let app = Application::build(settings.clone(), clock.clone())
            .await
            .expect("the application starts");
        let address = format!("http://127.0.0.1:{}", app.port());
        let broker = app.broker().clone();
        let listener = app.listener_status();
        let coldstart = app.coldstart_status();
        let cron = app.cron();
        let planner = app.planner();
        let catalogue = planner.catalogue.clone();
        let token = CancellationToken::new();
        let join = tokio::spawn(app.run_until_stopped(token.clone()));
        TestApp {
            address,
            // A request that hangs fails its test instead of stalling the run.
            client: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(30))
                .build()
                .expect("client"),
            clock,
            settings,
            backend,
            broker,
            listener,
            coldstart,
            cron,
            catalogue,
            planner,
            token,
            join: Some(join),
            db,
        }
    }

    /// Runs one lease-expiry sweep now, as the watchdog does on its tick.
    pub async fn sweep(&self) -> kat_scheduler::queue::ExpiryReport {
        self.broker.expire_leases().await.expect("sweep")
    }

    /// Stops the app gracefully and starts it again on the same database.
    pub async fn restart(mut self) -> TestApp {
        self.stop().await;
        let db = std::mem::replace(
            &mut self.db,
            TestDb {
                uri: String::new(),
                pg_name: None,
                _dir: None,
            },
        );
        TestApp::start(self.settings.clone(), self.clock.clone(), db, self.backend).await
    }

    /// Stops the app and waits until it has shut down.
    pub async fn stop(&mut self) {
        self.token.cancel();
        if let Some(join) = self.join.take() {
            join.await.expect("join").expect("clean shutdown");
        }
    }

    /// Runs `component`'s cron table for a tick at the clock's time, as the ticks generator does.
    pub async fn tick(
        &self,
        component: kat_scheduler::domain::SchedulerId,
    ) -> kat_scheduler::cron::TickReport {
        self.cron
            .run(kat_scheduler::cron::Tick {
                component,
                seq: 0,
                at: self.clock.now(),
            })
            .await
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// `org`'s boefje tasks in `status`, as `GET /tasks` lists them (at most 1,000).
    pub async fn boefje_tasks(&self, org: &str, status: &str) -> Vec<Value> {
        let page: Value = self
            .get(&format!(
                "/tasks?scheduler_id=boefje&organisation={org}&status={status}&limit=1000"
            ))
            .await
            .json()
            .await
            .unwrap();
        page["results"].as_array().unwrap().clone()
    }

    /// The app's frontier, read and written on a connection pool of the test's own.
    pub fn frontier(&self) -> kat_scheduler::frontier::Frontier {
        let target = kat_scheduler::storage::DbTarget::parse(&self.db.uri).unwrap();
        let pool =
            kat_scheduler::storage::connect(&target, 2, std::time::Duration::from_secs(5)).unwrap();
        kat_scheduler::frontier::Frontier::new(pool)
    }

    /// `service`'s row of `/health`.
    pub async fn service_health(&self, service: &str) -> Value {
        health_row(&self.get("/health").await.json().await.unwrap(), service)
    }

    pub async fn get(&self, path: &str) -> Response {
        self.client
            .get(format!("{}{path}", self.address))
            .send()
            .await
            .expect("request")
    }

    pub async fn post_raw(&self, path: &str, body: &str) -> Response {
        self.client
            .post(format!("{}{path}", self.address))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .expect("request")
    }

    pub async fn post(&self, path: &str, body: Option<&Value>) -> Response {
        let mut req = self.client.post(format!("{}{path}", self.address));
        if let Some(b) = body {
            req = req.json(b);
        }
        req.send().await.expect("request")
    }

    pub async fn push(&self, scheduler: &str, body: &Value) -> Response {
        self.post(&format!("/schedulers/{scheduler}/push"), Some(body))
            .await
    }

    /// Pushes and asserts 201; returns the task.
    pub async fn push_ok(&self, scheduler: &str, body: &Value) -> Value {
        let resp = self.push(scheduler, body).await;
        assert_eq!(resp.status(), StatusCode::CREATED, "push failed");
        resp.json().await.expect("task json")
    }

    pub async fn pop(
        &self,
        scheduler: &str,
        limit: Option<usize>,
        filter: Option<&Value>,
    ) -> Response {
        let query = limit.map(|l| format!("?limit={l}")).unwrap_or_default();
        self.post(&format!("/schedulers/{scheduler}/pop{query}"), filter)
            .await
    }

    /// Pops and asserts 200; returns the tasks.
    pub async fn pop_ok(
        &self,
        scheduler: &str,
        limit: usize,
        filter: Option<&Value>,
    ) -> Vec<Value> {
        let resp = self.pop(scheduler, Some(limit), filter).await;
        assert_eq!(resp.status(), StatusCode::OK, "pop failed");
        let body: Value = resp.json().await.expect("pop json");
        body["results"].as_array().expect("results").clone()
    }

    /// Pops (asserting 200) up to `limit` tasks, answer after answer until one is empty or
    /// `limit` are in: a boefje answer is one unit (a task, or a de-duplication group),
    /// whatever its `limit`. Answers the tasks in pop order.
    pub async fn pop_many(
        &self,
        scheduler: &str,
        limit: usize,
        filter: Option<&Value>,
    ) -> Vec<Value> {
        let mut out = Vec::new();
        while out.len() < limit {
            let got = self.pop_ok(scheduler, limit - out.len(), filter).await;
            if got.is_empty() {
                break;
            }
            out.extend(got);
        }
        out
    }

    /// [`Self::pop_many`] without a filter, as the popped tasks' ids.
    pub async fn pop_ids(&self, scheduler: &str, limit: usize) -> Vec<String> {
        self.pop_many(scheduler, limit, None)
            .await
            .iter()
            .map(id_of)
            .collect()
    }

    pub async fn get_task(&self, id: &str) -> Response {
        self.get(&format!("/tasks/{id}")).await
    }

    pub async fn task(&self, id: &str) -> Value {
        let resp = self.get_task(id).await;
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json().await.expect("task json")
    }

    /// Schedule `id` as the API answers it.
    pub async fn schedule(&self, id: &str) -> Value {
        let resp = self.get(&format!("/schedules/{id}")).await;
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json().await.expect("schedule json")
    }

    pub async fn patch_task(&self, id: &str, body: &Value) -> Response {
        self.client
            .patch(format!("{}/tasks/{id}", self.address))
            .json(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn patch(&self, path: &str, body: &Value) -> Response {
        self.client
            .patch(format!("{}{path}", self.address))
            .json(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn delete(&self, path: &str) -> Response {
        self.client
            .delete(format!("{}{path}", self.address))
            .send()
            .await
            .expect("request")
    }

    /// The value of an unlabelled metric on `/metrics`; panics when it is missing.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").await.text().await.unwrap();
        text.lines()
            .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .find_map(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
    }

    /// `POST /tasks?{query}` with an optional filter body.
    pub async fn search_tasks(&self, query: &str, body: Option<&Value>) -> Response {
        self.post(&format!("/tasks?{query}"), body).await
    }

    /// Ids of the tasks matching `filters`, as a sorted list.
    pub async fn matching_ids(&self, filters: &Value) -> Vec<String> {
        let resp = self.search_tasks("limit=1000", Some(filters)).await;
        let status = resp.status();
        let body: Value = resp.json().await.expect("json");
        assert_eq!(status, StatusCode::OK, "filter {filters} failed: {body}");
        let mut ids: Vec<String> = body["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|t| t["id"].as_str().expect("id").to_owned())
            .collect();
        ids.sort();
        ids
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.token.cancel();
        if std::thread::panicking() {
            return;
        }
        // Every test ends by checking that the queue table is in step with the tasks (one
        // statement, so one snapshot even while an engine still commits).
        let uri = self.db.uri.clone();
        let mismatched = std::thread::spawn(move || {
            let target = kat_scheduler::storage::DbTarget::parse(&uri).ok()?;
            let pool =
                kat_scheduler::storage::connect(&target, 2, std::time::Duration::from_secs(5))
                    .ok()?;
            let mut conn = kat_scheduler::storage::checkout(&pool).ok()?;
            Some(kat_scheduler::storage::tasks::queue_mismatches(&mut conn).expect("queue check"))
        })
        .join()
        .expect("queue check thread");
        if let Some(ids) = mismatched {
            assert!(
                ids.is_empty(),
                "task_queue out of step with tasks for {ids:?}"
            );
        }
    }
}

/// Every key of a task as mula's clients require it (reference §2.1).
pub const TASK_KEYS: [&str; 11] = [
    "id",
    "scheduler_id",
    "schedule_id",
    "organisation",
    "priority",
    "status",
    "type",
    "hash",
    "data",
    "created_at",
    "modified_at",
];

/// A boefje payload.
pub fn boefje_data(org: &str, boefje: &str, ooi: Option<&str>) -> Value {
    json!({
        "boefje": {"id": boefje, "name": boefje, "version": null, "oci_image": format!("ghcr.io/minvws/openkat/{boefje}:latest")},
        "input_ooi": ooi,
        "organization": org,
    })
}

/// A push body for a boefje task.
pub fn boefje_push(org: &str, boefje: &str, ooi: Option<&str>, priority: i64) -> Value {
    json!({"organisation": org, "priority": priority, "data": boefje_data(org, boefje, ooi)})
}

/// A push body for a normalizer task.
pub fn normalizer_push(org: &str, normalizer: &str, priority: i64) -> Value {
    json!({
        "organisation": org,
        "priority": priority,
        "data": {
            "normalizer": {"id": normalizer, "version": null},
            "raw_data": {
                "id": uuid::Uuid::new_v4().to_string(),
                "boefje_meta": {
                    "id": uuid::Uuid::new_v4().to_string(),
                    "boefje": {"id": "dns-records", "version": null},
                    "input_ooi": "Hostname|internet|example.com",
                    "arguments": {},
                    "organization": org,
                    "started_at": "2025-01-31T12:00:00+00:00",
                    "ended_at": "2025-01-31T12:00:05+00:00"
                },
                "mime_types": [{"value": "boefje/dns-records"}]
            }
        }
    })
}

/// A push body for a report task.
pub fn report_push(org: &str, recipe: &str, priority: i64) -> Value {
    json!({
        "organisation": org,
        "priority": priority,
        "data": {"organisation_id": org, "report_recipe_id": recipe, "type": "report"}
    })
}

/// The ids of a page's `results` (a pop's answer, a listing), in order.
pub fn result_ids(page: &Value) -> Vec<String> {
    page["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(id_of)
        .collect()
}

/// The `id` of a task JSON.
pub fn id_of(task: &Value) -> String {
    task["id"].as_str().expect("task id").to_owned()
}

/// The `detail` message of an error response.
pub async fn detail(resp: Response) -> String {
    let body: Value = resp.json().await.expect("error json");
    match &body["detail"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A seed for an [`Rng`]: from `var` when it holds a number (to replay a failure), else from the
/// clock; printed with `what`, so a failing run says how to replay it.
pub fn seed_from_env(var: &str, what: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("{what}: {var}={seed}");
    seed
}

/// A small deterministic generator (xorshift64*), so a failure reproduces from its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
}

/// Runs `sql` on the app's database, as an administrator or a restore would: behind its back.
pub fn behind_its_back(backend: Backend, uri: &str, sql: &str) {
    match backend {
        Backend::Postgres => PgConnection::establish(uri)
            .expect("connect")
            .batch_execute(sql)
            .expect("sql"),
        Backend::Sqlite => {
            let path = uri.strip_prefix("sqlite://").expect("sqlite uri");
            SqliteConnection::establish(path)
                .expect("connect")
                .batch_execute(sql)
                .expect("sql")
        }
    }
}

/// Closes every connection the service holds to the PostgreSQL database at `uri`, as the server
/// does when it restarts or an administrator ends the sessions; answers how many it closed.
pub async fn terminate_connections(uri: &str) -> usize {
    use diesel::RunQueryDsl;
    let uri = uri.to_owned();
    tokio::task::spawn_blocking(move || {
        let name = uri.rsplit('/').next().unwrap().to_owned();
        let mut admin = PgConnection::establish(&uri).unwrap();
        diesel::sql_query(format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        ))
        .execute(&mut admin)
        .unwrap()
    })
    .await
    .unwrap()
}

/// A fixed instant `secs` after a base one, for rows the storage tests write straight to the
/// tables (the batch times and leases they read back).
pub fn row_time(secs: i64) -> chrono::NaiveDateTime {
    chrono::DateTime::from_timestamp(1_800_000_000 + secs, 0)
        .unwrap()
        .naive_utc()
}

/// A boefje task row `id` of priority `n` (the lower, the sooner) in `status`, for the storage
/// tests: boefje `b{n}` on `Hostname|internet|h{n}` of `org1`, with hash `hash-{n}`.
pub fn boefje_row(
    id: String,
    n: i64,
    status: kat_scheduler::domain::TaskStatus,
) -> kat_scheduler::storage::rows::TaskRow {
    kat_scheduler::storage::rows::TaskRow {
        id,
        scheduler_id: "boefje".into(),
        schedule_id: None,
        organisation: "org1".into(),
        task_type: "boefje".into(),
        hash: Some(format!("hash-{n}")),
        priority: n,
        data: format!(r#"{{"boefje": {{"id": "b{n}"}}, "input_ooi": "Hostname|internet|h{n}"}}"#),
        status,
        attempts: 0,
        lease_expires_at: None,
        failure_reason: None,
        created_at: row_time(0),
        modified_at: row_time(0),
        plugin_id: Some(format!("b{n}")),
        oci_image: None,
        input_ooi: Some(format!("Hostname|internet|h{n}")),
        deduplication_key: None,
    }
}

/// The status task `id`'s row holds.
pub fn row_status(
    conn: &mut kat_scheduler::storage::AnyConnection,
    id: &str,
) -> kat_scheduler::domain::TaskStatus {
    kat_scheduler::storage::tasks::get(conn, id)
        .unwrap()
        .unwrap()
        .status
}

/// A pool on `uri` with its schema migrated and autovacuum off for `tables`: they stay never
/// analysed until the test says so (a server between a bulk load and its next analyse; any
/// server with `autovacuum = off`), whatever the server's setting. Answers the pool and one of
/// its connections.
pub fn never_analysed(
    uri: &str,
    pool_size: u32,
    tables: &[&str],
) -> (
    kat_scheduler::storage::DbPool,
    kat_scheduler::storage::DbConn,
) {
    use kat_scheduler::storage;
    let target = storage::DbTarget::parse(uri).unwrap();
    let pool = storage::connect(&target, pool_size, std::time::Duration::from_secs(5)).unwrap();
    let mut conn = storage::checkout(&pool).unwrap();
    storage::run_migrations(&mut conn).unwrap();
    for table in tables {
        conn.batch_execute(&format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = false)"
        ))
        .unwrap();
    }
    (pool, conn)
}

/// `statement`'s plan on PostgreSQL, one line per row, joined.
pub fn plan_of(
    conn: &mut kat_scheduler::storage::AnyConnection,
    statement: kat_scheduler::storage::sql::Sql,
) -> String {
    #[derive(diesel::QueryableByName)]
    struct Line {
        #[diesel(sql_type = diesel::sql_types::Text)]
        #[diesel(column_name = "QUERY PLAN")]
        line: String,
    }
    statement
        .explained()
        .load::<Line>(conn)
        .unwrap()
        .into_iter()
        .map(|l| l.line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A TCP proxy in front of PostgreSQL whose client-side sockets can be cut while their server
/// sessions go on, as a load balancer's timeout or a network cut leaves them: the server side
/// is kept open and unread, so a statement it runs still runs, and commits.
pub struct CutProxy {
    refusing: Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
    accept: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    /// A proxy to the server of the PostgreSQL `uri`; answers it and the same URI through it.
    pub async fn start(uri: &str) -> (CutProxy, String) {
        let after_scheme = uri.split_once("://").map_or(uri, |(_, rest)| rest);
        let (prefix, rest) = match after_scheme.split_once('@') {
            Some((user, rest)) => (format!("{user}@"), rest),
            None => (String::new(), after_scheme),
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let upstream = match authority.contains(':') {
            true => authority.to_owned(),
            false => format!("{authority}:5432"),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, generation) = tokio::sync::watch::channel(0u64);
        let parked: Arc<std::sync::Mutex<Vec<tokio::net::TcpStream>>> = Arc::default();
        let refusing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refuse = refusing.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if refuse.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let mut generation = generation.clone();
                let born = *generation.borrow_and_update();
                let parked = parked.clone();
                tokio::spawn(async move {
                    let cut = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => false,
                        _ = generation.wait_for(|g| *g > born) => true,
                    };
                    if cut {
                        drop(client);
                        parked.lock().unwrap().push(server);
                    }
                });
            }
        });
        let through = format!("postgresql://{prefix}127.0.0.1:{port}/{path}");
        (
            CutProxy {
                refusing,
                cut,
                accept,
            },
            through,
        )
    }

    /// Cuts every connection made so far on the client's side.
    pub fn cut(&self) {
        self.cut.send_modify(|g| *g += 1);
    }

    /// Closes new connections at once (`true`), as a server that is away, or takes them again.
    pub fn refuse(&self, refusing: bool) {
        self.refusing
            .store(refusing, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// `service`'s row of a `/health` answer.
pub fn health_row(health: &Value, service: &str) -> Value {
    health["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["service"] == service)
        .unwrap_or_else(|| panic!("no {service} in {health}"))
        .clone()
}

/// A plugin catalogue file in `dir` holding one boefje, `dns-records` (consumes `Hostname`,
/// scan level 1, enabled); answers its path for `catalogue.file`.
pub fn dns_records_catalogue(dir: &tempfile::TempDir) -> String {
    let catalogue = dir.path().join("catalogue.toml");
    std::fs::write(
        &catalogue,
        "[[plugins]]\nid = \"dns-records\"\ntype = \"boefje\"\nconsumes = [\"Hostname\"]\n\
         scan_level = 1\nenabled = true\n",
    )
    .unwrap();
    catalogue.to_string_lossy().into_owned()
}
