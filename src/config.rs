//! Typed settings, layered: built-in defaults → an optional TOML file (`--config PATH`) → the
//! environment, under the names mula uses (`SCHEDULER_DB_URI`, `SCHEDULER_API_PORT`, …) so the
//! service drops into an existing deployment.
//!
//! Only the variables in [`ENV_VARS`] are read: a deployment's other mula settings do not stop
//! start-up. Anything invalid stops start-up with one line naming the key and its variable.

use std::path::Path;
use std::time::Duration;

use config::{Config, File, FileFormat};
use serde::{Deserialize, Serialize};

use crate::domain::auth::{Grant, Role, Tokens, parse_spec};
use crate::domain::limits::Limits;
use crate::domain::{PerScheduler, SchedulerId};
use crate::queue::{QueueConfig, SchedulerLimits, WhenFull};
use crate::storage::DbTarget;

/// Default listen address (mula's).
pub const DEFAULT_HOST: &str = "0.0.0.0";
/// Default listen port (mula's).
pub const DEFAULT_PORT: u16 = 8000;
/// Default database: an SQLite file under `./data/`, so `cargo run` needs no server.
pub const DEFAULT_DB_URI: &str = "sqlite://data/scheduler.db";
/// Default connections in the pool (one is the engine's).
pub const DEFAULT_POOL_SIZE: u32 = 10;
/// Default seconds to wait for a database connection before answering 503.
pub const DEFAULT_CONNECT_TIMEOUT_SECS: u64 = 5;
/// Default largest request body.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// Default seconds to let in-flight requests finish at shutdown.
pub const DEFAULT_SHUTDOWN_TIMEOUT_SECS: u64 = 30;
/// Default seconds an idle keep-alive connection stays open: longer than the runners' 10 s poll
/// interval, so a polling worker keeps its connection.
pub const DEFAULT_KEEP_ALIVE_SECS: u64 = 75;
/// Default seconds a client has to send a request's head (408 beyond; a request read in full is
/// never answered 408).
pub const DEFAULT_REQUEST_HEAD_TIMEOUT_SECS: u64 = 10;
/// Default seconds a command may wait for its engine before it is answered 503 unapplied.
pub const DEFAULT_SHED_AFTER_SECS: u64 = 20;
/// Default seconds a client has to send a whole request body (408 beyond).
pub const DEFAULT_BODY_TIMEOUT_SECS: u64 = 30;
/// Default bound of each scheduler's heap.
pub const DEFAULT_MAXSIZE: usize = 100_000;
/// Default commands per engine transaction.
pub const DEFAULT_MAX_BATCH: usize = 512;
/// Default commands waiting for an engine before callers get 503.
pub const DEFAULT_CHANNEL_CAPACITY: usize = 16_384;
/// Default seconds a popped task may stay `dispatched` before it must be `running`. The boefje
/// runtime buffers popped tasks locally behind running jobs, so this is generous.
pub const DEFAULT_DISPATCH_TIMEOUT_SECS: u64 = 30 * 60;
/// Default seconds a `running` task may go without finishing (or a `PATCH running` heartbeat).
/// Real runtimes do not heartbeat, so it must outlast the longest scan.
pub const DEFAULT_RUN_TIMEOUT_SECS: u64 = 4 * 60 * 60;
/// Default run lease of a task whose holder never renewed it (24 hours, mula's grace period):
/// OpenKAT's runners send no heartbeat, and a boefje may run for hours.
pub const DEFAULT_UNRENEWED_RUN_TIMEOUT_SECS: u64 = 24 * 60 * 60;
/// Default leases a task may let expire before it is failed.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Default seconds between lease-expiry sweeps.
pub const DEFAULT_WATCHDOG_INTERVAL_SECS: u64 = 30;

/// `limits.max_string_chars` at most: PostgreSQL refuses an index entry over 2,704 bytes, a
/// character takes up to four, and key fields are indexed with a few more columns.
pub const MAX_STRING_CHARS_CEILING: usize = 600;
/// `cluster.lease_ms` at least.
pub const MIN_LEASE_MS: u64 = 300;
/// `limits.max_filter_depth` at most.
pub const MAX_FILTER_DEPTH_CEILING: usize = 64;
/// `limits.max_in_values` at most: a list is bound value by value, and PostgreSQL takes at most
/// 65,535 bound values in one statement.
pub const MAX_IN_VALUES_CEILING: usize = 30_000;

/// All settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The HTTP server.
    pub api: ApiSettings,
    /// The database.
    pub database: DatabaseSettings,
    /// Logs.
    pub logging: LoggingSettings,
    /// Defaults for every scheduler's queue.
    pub queue: QueueSettings,
    /// How large inputs may be.
    pub limits: Limits,
    /// Optional bearer tokens.
    #[serde(default)]
    pub auth: AuthSettings,
    /// The AMQP listener.
    pub listener: ListenerSettings,
    /// The plugin catalogue.
    pub catalogue: CatalogueSettings,
    /// ColdStart (runs when Octopoes is configured).
    #[serde(default)]
    pub coldstart: ColdStartSettings,
    /// The cron ticks and what their tables do.
    #[serde(default)]
    pub cron: CronSettings,
    /// Katalogus, Octopoes and Bytes.
    #[serde(default)]
    pub clients: ClientSettings,
    /// Per-scheduler overrides of `queue`.
    #[serde(default)]
    pub schedulers: SchedulerOverrides,
    /// Several instances on one PostgreSQL database.
    #[serde(default)]
    pub cluster: ClusterSettings,
}

/// Several instances on one PostgreSQL database (see [`crate::ownership`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct ClusterSettings {
    /// This instance's name in the lease rows; empty: host name, process id and a random part.
    pub instance_id: String,
    /// Where the other instances reach this one, `http://HOST:PORT`; empty: this host's name
    /// (or `api.host` when it names one) and the bound port.
    pub advertise_url: String,
    /// Milliseconds a scheduler's lease runs without renewal; the owner renews every third of
    /// it, and a killed owner's schedulers are taken over within about 4/3 of it.
    pub lease_ms: u64,
    /// Bearer token sent with forwarded requests when the instances require tokens; it must
    /// allow push, pop and patch on every scheduler.
    pub peer_token: String,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        Self {
            instance_id: String::new(),
            advertise_url: String::new(),
            lease_ms: crate::ownership::DEFAULT_LEASE_MS,
            peer_token: String::new(),
        }
    }
}

/// The HTTP server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    /// Address to listen on.
    pub host: String,
    /// Port to listen on (0 picks a free one).
    pub port: u16,
    /// HTTP worker threads; 0 means one per CPU.
    pub workers: usize,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// Seconds in-flight requests get to finish at shutdown.
    pub shutdown_timeout_secs: u64,
    /// Seconds an idle keep-alive connection stays open (0 closes after each response).
    pub keep_alive_secs: u64,
    /// Seconds a client has to send a request's head before it is answered 408.
    pub request_head_timeout_secs: u64,
    /// Seconds a client has to send a request's whole body before it is answered 408.
    pub body_timeout_secs: u64,
}

/// Default prefetch of the AMQP listener (mula's).
pub const DEFAULT_PREFETCH: u16 = 100;

/// The AMQP listener; off without a URI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSettings {
    /// `amqp://user:pass@host:5672/vhost` (mula's `QUEUE_URI`); empty: the listener is off.
    pub uri: String,
    /// Octopoes' object events.
    pub mutations_queue: String,
    /// Bytes' raw file events.
    pub raw_files_queue: String,
    /// Unacked messages RabbitMQ hands the listener at most.
    pub prefetch: u16,
}

/// The plugin catalogue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogueSettings {
    /// A TOML file of plugins standing in for Katalogus (see [`crate::clients::catalogue`]);
    /// empty: no plugins, so events plan nothing. Katalogus (`clients.katalogus_api`) wins
    /// when both are set.
    pub file: String,
    /// Seconds a Katalogus answer is used before it is fetched again (refreshed in the
    /// background every half of it).
    pub ttl_secs: u64,
}

impl Default for CatalogueSettings {
    fn default() -> Self {
        Self {
            file: String::new(),
            ttl_secs: crate::clients::catalogue::DEFAULT_TTL_SECS,
        }
    }
}

/// Default seconds each try of a call to Katalogus, Octopoes or Bytes may take (mula's 10).
pub const DEFAULT_CLIENT_TIMEOUT_SECS: u64 = 10;

/// Where the platform's other services are (see [`crate::clients`]); an empty URL means that
/// service is not configured.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct ClientSettings {
    /// Katalogus, `http://katalogus:8000` (mula's `KATALOGUS_API`).
    pub katalogus_api: String,
    /// Octopoes, `http://octopoes_api:80` (mula's `OCTOPOES_API`).
    pub octopoes_api: String,
    /// Bytes, `http://bytes:8000` (mula's `BYTES_API`); needs the user and password below.
    pub bytes_api: String,
    /// The Bytes user (mula's `BYTES_USERNAME`).
    pub bytes_username: String,
    /// The Bytes password (mula's `BYTES_PASSWORD`); never logged.
    pub bytes_password: String,
    /// Seconds each try of a call may take, from connecting to the last byte.
    pub request_timeout_secs: u64,
}

impl Default for ClientSettings {
    fn default() -> Self {
        Self {
            katalogus_api: String::new(),
            octopoes_api: String::new(),
            bytes_api: String::new(),
            bytes_username: String::new(),
            bytes_password: String::new(),
            request_timeout_secs: DEFAULT_CLIENT_TIMEOUT_SECS,
        }
    }
}

impl std::fmt::Debug for ClientSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password, and one a URL may carry, never reach a log.
        let url = |u: &str| match crate::clients::http::parse_base(u) {
            Ok(parsed) => crate::clients::http::redacted(&parsed),
            Err(_) if u.is_empty() => String::new(),
            Err(_) => "(invalid)".into(),
        };
        f.debug_struct("ClientSettings")
            .field("katalogus_api", &url(&self.katalogus_api))
            .field("octopoes_api", &url(&self.octopoes_api))
            .field("bytes_api", &url(&self.bytes_api))
            .field("bytes_username", &self.bytes_username)
            .field("bytes_password", &"***")
            .field("request_timeout_secs", &self.request_timeout_secs)
            .finish()
    }
}

impl ClientSettings {
    /// Each try's time limit.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    /// The Katalogus client, if `katalogus_api` is set.
    pub fn katalogus(&self) -> Result<Option<crate::clients::katalogus::Katalogus>, String> {
        if self.katalogus_api.is_empty() {
            return Ok(None);
        }
        crate::clients::katalogus::Katalogus::new(&self.katalogus_api, self.timeout()).map(Some)
    }

    /// The Octopoes client, if `octopoes_api` is set.
    pub fn octopoes(&self) -> Result<Option<crate::clients::octopoes::Octopoes>, String> {
        if self.octopoes_api.is_empty() {
            return Ok(None);
        }
        crate::clients::octopoes::Octopoes::new(&self.octopoes_api, self.timeout()).map(Some)
    }

    /// The Bytes client, if `bytes_api` is set.
    pub fn bytes(&self) -> Result<Option<crate::clients::bytes::Bytes>, String> {
        if self.bytes_api.is_empty() {
            return Ok(None);
        }
        crate::clients::bytes::Bytes::new(
            &self.bytes_api,
            &self.bytes_username,
            &self.bytes_password,
            self.timeout(),
        )
        .map(Some)
    }
}

/// The cron ticks (see [`crate::cron`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct CronSettings {
    /// Seconds between ticks; 0 turns the ticks (and so rescheduling, the lease watchdog,
    /// re-scores, refills, ColdStart's rounds and pruning) off.
    pub tick_secs: u64,
    /// Seconds before a boefje schedule without cron runs again when its plugin names no
    /// interval (mula's grace period).
    pub grace_period_secs: u64,
    /// Up to this many seconds more, spread over schedules.
    pub jitter_secs: u64,
    /// Days a finished task is kept before it is deleted; 0 keeps them.
    pub task_retention_days: u64,
    /// Seconds between re-scores of waiting work, for schedulers whose strategy depends on time
    /// (`grace-period`); 0 turns re-scoring off.
    pub rescore_secs: u64,
}

impl Default for CronSettings {
    fn default() -> Self {
        Self {
            tick_secs: crate::cron::ticks::DEFAULT_TICK_SECS,
            grace_period_secs: crate::cron::reschedule::DEFAULT_GRACE_SECS,
            jitter_secs: 0,
            task_retention_days: 0,
            rescore_secs: 600,
        }
    }
}

/// ColdStart: pages every organisation's objects from Octopoes into the frontier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct ColdStartSettings {
    /// Seconds between two complete passes over an organisation (the sanity check).
    pub interval_secs: u64,
    /// Objects per page asked of Octopoes.
    pub page_size: u64,
    /// Organisations paged at once.
    pub concurrency: usize,
    /// Tries of one page before its organisation waits for the next round.
    pub attempts: u32,
    /// Milliseconds before the second try of a page; doubles with each failure, to at most a
    /// minute.
    pub backoff_ms: u64,
}

impl Default for ColdStartSettings {
    fn default() -> Self {
        Self {
            interval_secs: crate::coldstart::DEFAULT_INTERVAL_SECS,
            page_size: crate::coldstart::DEFAULT_PAGE_SIZE,
            concurrency: crate::coldstart::DEFAULT_CONCURRENCY,
            attempts: crate::coldstart::DEFAULT_ATTEMPTS,
            backoff_ms: crate::coldstart::DEFAULT_BACKOFF_MS,
        }
    }
}

/// Optional bearer tokens (see [`crate::domain::auth`]); none configured means open, as mula.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// Tokens from the configuration file.
    #[serde(default)]
    pub tokens: Vec<TokenSettings>,
    /// Tokens in compact form, `role[@scheduler,…]=secret;…` (`SCHEDULER_API_TOKENS`).
    #[serde(default)]
    pub spec: String,
}

/// One token.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSettings {
    /// A name for logs.
    pub name: String,
    /// `runner`, `webapp` or `admin`.
    pub role: Role,
    /// The schedulers it covers; empty or absent for all.
    #[serde(default)]
    pub schedulers: Vec<SchedulerId>,
    /// The secret clients send as `Authorization: Bearer <secret>`.
    pub token: String,
}

impl std::fmt::Debug for TokenSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret never reaches a log.
        f.debug_struct("TokenSettings")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("schedulers", &self.schedulers)
            .field("token", &"***")
            .finish()
    }
}

impl AuthSettings {
    /// The configured tokens, from the file and the compact form together.
    pub fn tokens(&self) -> Result<Tokens, String> {
        let mut pairs: Vec<(String, Grant)> = self
            .tokens
            .iter()
            .map(|t| {
                (
                    t.token.clone(),
                    Grant {
                        name: t.name.clone(),
                        role: t.role,
                        schedulers: t.schedulers.clone(),
                    },
                )
            })
            .collect();
        pairs.extend(parse_spec(&self.spec)?);
        Tokens::new(pairs)
    }
}

/// The database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// `postgresql://…` or `sqlite://PATH`.
    pub uri: String,
    /// Connections in the pool (at least 2).
    pub pool_size: u32,
    /// Apply pending migrations at start; when false, start refuses an outdated schema.
    pub migrate: bool,
    /// Seconds to wait for a connection before answering 503.
    pub connect_timeout_secs: u64,
    /// Engines commit without waiting for the write-ahead log to reach disk and answer after a
    /// shared flush barrier, so one flush serves every batch committed meanwhile (on SQLite,
    /// the three schedulers' commits share one sync); every answer stays durable. When false,
    /// each commit waits for its own flush. Unset: on for SQLite, where it gave 1.2× the pops
    /// with a slow flush and 0.95–1.0× with a fast one, and off for PostgreSQL, where it
    /// cost 7–20 % of the pops on the project's 2-core machine (docs/BENCHMARKS.md); there it is
    /// for servers whose flush is slow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_barrier: Option<bool>,
}

/// Log output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingSettings {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter (`info`, `kat_scheduler=debug,info`); `RUST_LOG` overrides it.
    pub level: String,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Queue settings that apply to every scheduler unless overridden.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSettings {
    /// Queued tasks each heap holds in memory at most.
    pub maxsize: usize,
    /// What a full heap does with automatic pushes: `pending` or `reject` (429).
    pub when_full: WhenFull,
    /// Commands applied per transaction at most (group commit).
    pub max_batch: usize,
    /// Commands waiting for an engine at most before callers get 503.
    pub channel_capacity: usize,
    /// Seconds a popped task may stay `dispatched` (its lease) before it is re-queued.
    pub dispatch_timeout_secs: u64,
    /// Seconds a `running` task may go without finishing or a renewing `PATCH running`, once its
    /// holder has renewed the lease at least once.
    pub run_timeout_secs: u64,
    /// Seconds a `running` task whose holder never renewed its lease may go without finishing
    /// (the longer of this and `run_timeout_secs` applies).
    pub unrenewed_run_timeout_secs: u64,
    /// Leases a task may let expire; at that count it is failed instead of re-queued.
    pub max_attempts: u32,
    /// Seconds between lease-expiry sweeps (0 turns the watchdog off).
    pub watchdog_interval_secs: u64,
    /// Seconds a command may wait for its scheduler's engine; one that waited longer is answered
    /// 503 (with `Retry-After`) without being applied.
    pub shed_after_secs: u64,
}

/// Per-scheduler overrides.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct SchedulerOverrides {
    /// `boefje`
    pub boefje: SchedulerOverride,
    /// `normalizer`
    pub normalizer: SchedulerOverride,
    /// `report`
    pub report: SchedulerOverride,
}

/// One scheduler's overrides.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerOverride {
    /// This scheduler's heap bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maxsize: Option<usize>,
    /// This scheduler's full-heap policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub when_full: Option<WhenFull>,
    /// This scheduler's dispatch lease, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dispatch_timeout_secs: Option<u64>,
    /// This scheduler's run lease, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_timeout_secs: Option<u64>,
    /// This scheduler's attempts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// How this scheduler ranks planned work: `time-based` (default), `grace-period` or
    /// `change-delta`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scoring: Option<crate::scoring::Strategy>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            api: ApiSettings {
                host: DEFAULT_HOST.into(),
                port: DEFAULT_PORT,
                workers: 0,
                max_body_bytes: DEFAULT_MAX_BODY_BYTES,
                shutdown_timeout_secs: DEFAULT_SHUTDOWN_TIMEOUT_SECS,
                keep_alive_secs: DEFAULT_KEEP_ALIVE_SECS,
                request_head_timeout_secs: DEFAULT_REQUEST_HEAD_TIMEOUT_SECS,
                body_timeout_secs: DEFAULT_BODY_TIMEOUT_SECS,
            },
            database: DatabaseSettings {
                uri: DEFAULT_DB_URI.into(),
                pool_size: DEFAULT_POOL_SIZE,
                migrate: true,
                connect_timeout_secs: DEFAULT_CONNECT_TIMEOUT_SECS,
                flush_barrier: None,
            },
            logging: LoggingSettings {
                format: LogFormat::Text,
                level: "info".into(),
            },
            queue: QueueSettings {
                maxsize: DEFAULT_MAXSIZE,
                when_full: WhenFull::Pending,
                max_batch: DEFAULT_MAX_BATCH,
                channel_capacity: DEFAULT_CHANNEL_CAPACITY,
                dispatch_timeout_secs: DEFAULT_DISPATCH_TIMEOUT_SECS,
                run_timeout_secs: DEFAULT_RUN_TIMEOUT_SECS,
                unrenewed_run_timeout_secs: DEFAULT_UNRENEWED_RUN_TIMEOUT_SECS,
                max_attempts: DEFAULT_MAX_ATTEMPTS,
                watchdog_interval_secs: DEFAULT_WATCHDOG_INTERVAL_SECS,
                shed_after_secs: DEFAULT_SHED_AFTER_SECS,
            },
            limits: Limits::default(),
            auth: AuthSettings::default(),
            listener: ListenerSettings {
                uri: String::new(),
                mutations_queue: "scan_profile_mutations".into(),
                raw_files_queue: "raw_file_received".into(),
                prefetch: DEFAULT_PREFETCH,
            },
            catalogue: CatalogueSettings::default(),
            coldstart: ColdStartSettings::default(),
            cron: CronSettings::default(),
            clients: ClientSettings::default(),
            schedulers: SchedulerOverrides::default(),
            cluster: ClusterSettings::default(),
        }
    }
}

/// Environment variables read, with the setting each sets and what it means.
pub const ENV_VARS: &[(&str, &str, &str)] = &[
    (
        "SCHEDULER_API_HOST",
        "api.host",
        "address to listen on (default 0.0.0.0)",
    ),
    (
        "SCHEDULER_API_PORT",
        "api.port",
        "port to listen on (default 8000)",
    ),
    (
        "SCHEDULER_API_WORKERS",
        "api.workers",
        "HTTP worker threads, 0 = one per CPU",
    ),
    (
        "SCHEDULER_API_MAX_BODY_BYTES",
        "api.max_body_bytes",
        "largest request body (default 1 MiB)",
    ),
    (
        "SCHEDULER_API_KEEP_ALIVE",
        "api.keep_alive_secs",
        "seconds an idle keep-alive connection stays open (default 75)",
    ),
    (
        "SCHEDULER_API_REQUEST_HEAD_TIMEOUT",
        "api.request_head_timeout_secs",
        "seconds to send a request's head before 408 (default 10)",
    ),
    (
        "SCHEDULER_API_BODY_TIMEOUT",
        "api.body_timeout_secs",
        "seconds to send a whole request body before 408 (default 30)",
    ),
    (
        "SCHEDULER_API_SHUTDOWN_TIMEOUT",
        "api.shutdown_timeout_secs",
        "seconds in-flight requests get to finish at shutdown (default 30)",
    ),
    (
        "SCHEDULER_API_TOKENS",
        "auth.spec",
        "bearer tokens, role[@scheduler,...]=secret separated by ';' (default none: open)",
    ),
    (
        "QUEUE_URI",
        "listener.uri",
        "RabbitMQ, amqp://USER:PASS@HOST:5672/VHOST (default none: the listener is off)",
    ),
    (
        "SCHEDULER_RABBITMQ_DSN",
        "listener.uri",
        "mula's old name of QUEUE_URI",
    ),
    (
        "SCHEDULER_RABBITMQ_PREFETCH_COUNT",
        "listener.prefetch",
        "unacked messages per queue (default 100)",
    ),
    (
        "SCHEDULER_QUEUE_MUTATIONS",
        "listener.mutations_queue",
        "Octopoes' object events (default scan_profile_mutations)",
    ),
    (
        "SCHEDULER_QUEUE_RAW_FILES",
        "listener.raw_files_queue",
        "Bytes' raw file events (default raw_file_received)",
    ),
    (
        "SCHEDULER_INSTANCE_ID",
        "cluster.instance_id",
        "this instance's name in the ownership rows (default: host, pid and a random part)",
    ),
    (
        "SCHEDULER_ADVERTISE_URL",
        "cluster.advertise_url",
        "http://HOST:PORT where other instances forward to this one (default: host name and bound port)",
    ),
    (
        "SCHEDULER_LEASE_MS",
        "cluster.lease_ms",
        "milliseconds a scheduler's ownership lease runs without renewal (default 2000)",
    ),
    (
        "SCHEDULER_PEER_TOKEN",
        "cluster.peer_token",
        "bearer token instances forward each other's requests with, when tokens are required",
    ),
    (
        "SCHEDULER_CRON_TICK",
        "cron.tick_secs",
        "seconds between cron ticks, 0 = off (default 1)",
    ),
    (
        "SCHEDULER_PQ_GRACE_PERIOD",
        "cron.grace_period_secs",
        "seconds before a boefje schedule without cron runs again (default 86400)",
    ),
    (
        "SCHEDULER_RESCHEDULE_JITTER",
        "cron.jitter_secs",
        "up to this many seconds more per schedule (default 0)",
    ),
    (
        "SCHEDULER_RESCORE_INTERVAL",
        "cron.rescore_secs",
        "seconds between re-scores of waiting work under a time-dependent strategy, 0 = off (default 600)",
    ),
    (
        "SCHEDULER_TASK_RETENTION_DAYS",
        "cron.task_retention_days",
        "days finished tasks are kept, 0 = forever (default 0)",
    ),
    (
        "SCHEDULER_COLDSTART_INTERVAL",
        "coldstart.interval_secs",
        "seconds between two complete ColdStart passes over an organisation (default 86400)",
    ),
    (
        "SCHEDULER_COLDSTART_PAGE_SIZE",
        "coldstart.page_size",
        "objects per page asked of Octopoes (default 1000)",
    ),
    (
        "SCHEDULER_COLDSTART_CONCURRENCY",
        "coldstart.concurrency",
        "organisations paged at once (default 4)",
    ),
    (
        "SCHEDULER_COLDSTART_ATTEMPTS",
        "coldstart.attempts",
        "tries of one page before its organisation waits for the next round (default 5)",
    ),
    (
        "SCHEDULER_COLDSTART_BACKOFF_MS",
        "coldstart.backoff_ms",
        "milliseconds before a page's second try, doubling to at most a minute (default 1000)",
    ),
    (
        "SCHEDULER_CATALOGUE_TTL",
        "catalogue.ttl_secs",
        "seconds a Katalogus answer is cached (default 60)",
    ),
    (
        "SCHEDULER_CATALOGUE_FILE",
        "catalogue.file",
        "TOML file of plugins standing in for Katalogus (default none)",
    ),
    (
        "KATALOGUS_API",
        "clients.katalogus_api",
        "Katalogus, http://HOST:PORT (default none)",
    ),
    (
        "OCTOPOES_API",
        "clients.octopoes_api",
        "Octopoes, http://HOST:PORT (default none)",
    ),
    (
        "BYTES_API",
        "clients.bytes_api",
        "Bytes, http://HOST:PORT (default none); needs BYTES_USERNAME and BYTES_PASSWORD",
    ),
    ("BYTES_USERNAME", "clients.bytes_username", "the Bytes user"),
    (
        "BYTES_PASSWORD",
        "clients.bytes_password",
        "the Bytes password (never logged)",
    ),
    (
        "SCHEDULER_CLIENTS_REQUEST_TIMEOUT",
        "clients.request_timeout_secs",
        "seconds each try of a call to Katalogus, Octopoes or Bytes may take (default 10)",
    ),
    (
        "SCHEDULER_LIMIT_FILTER_CONDITIONS",
        "limits.max_filter_conditions",
        "conditions in one filter (default 100)",
    ),
    (
        "SCHEDULER_LIMIT_FILTER_DEPTH",
        "limits.max_filter_depth",
        "nesting of lists and and/or/not in one filter (default 32)",
    ),
    (
        "SCHEDULER_LIMIT_IN_VALUES",
        "limits.max_in_values",
        "values in one in/not_in list (default 1000)",
    ),
    (
        "SCHEDULER_LIMIT_STRING_CHARS",
        "limits.max_string_chars",
        "characters in one organisation, id, key field or filter value (default 512)",
    ),
    (
        "SCHEDULER_LIMIT_JSON_DEPTH",
        "limits.max_json_depth",
        "nesting of a task payload (default 32)",
    ),
    (
        "SCHEDULER_LIMIT_OFFSET",
        "limits.max_offset",
        "largest offset of a task listing (default 100000000)",
    ),
    (
        "SCHEDULER_DB_URI",
        "database.uri",
        "postgresql://USER@HOST/DB or sqlite://PATH (default sqlite://data/scheduler.db)",
    ),
    (
        "SCHEDULER_DB_DSN",
        "database.uri",
        "old name of SCHEDULER_DB_URI",
    ),
    (
        "SCHEDULER_DB_CONNECTION_POOL_SIZE",
        "database.pool_size",
        "database connections (default 10)",
    ),
    (
        "SCHEDULER_DB_MIGRATE",
        "database.migrate",
        "apply migrations at start (default true)",
    ),
    (
        "DATABASE_MIGRATION",
        "database.migrate",
        "mula's name of SCHEDULER_DB_MIGRATE",
    ),
    (
        "SCHEDULER_DB_CONNECT_TIMEOUT",
        "database.connect_timeout_secs",
        "seconds to wait for a connection before 503 (default 5)",
    ),
    (
        "SCHEDULER_DB_FLUSH_BARRIER",
        "database.flush_barrier",
        "group WAL flushes behind a shared barrier (default true on SQLite, false on PostgreSQL)",
    ),
    (
        "SCHEDULER_LOGGING_FORMAT",
        "logging.format",
        "text or json (default text)",
    ),
    (
        "SCHEDULER_LOG_LEVEL",
        "logging.level",
        "tracing filter (default info); RUST_LOG overrides",
    ),
    (
        "SCHEDULER_PQ_MAXSIZE",
        "queue.maxsize",
        "queued tasks per heap (default 100000)",
    ),
    (
        "SCHEDULER_PQ_WHEN_FULL",
        "queue.when_full",
        "pending or reject (default pending)",
    ),
    (
        "SCHEDULER_PQ_MAX_BATCH",
        "queue.max_batch",
        "commands per transaction (default 512)",
    ),
    (
        "SCHEDULER_PQ_CHANNEL_CAPACITY",
        "queue.channel_capacity",
        "commands waiting for an engine before callers get 503 (default 16384)",
    ),
    (
        "SCHEDULER_PQ_SHED_AFTER",
        "queue.shed_after_secs",
        "seconds a command may wait for its engine before 503 (default 20)",
    ),
    (
        "SCHEDULER_DISPATCH_TIMEOUT",
        "queue.dispatch_timeout_secs",
        "seconds a popped task may stay dispatched (default 1800)",
    ),
    (
        "SCHEDULER_RUN_TIMEOUT",
        "queue.run_timeout_secs",
        "seconds a running task may go without finishing or a heartbeat, once it sent one (default 14400)",
    ),
    (
        "SCHEDULER_UNRENEWED_RUN_TIMEOUT",
        "queue.unrenewed_run_timeout_secs",
        "seconds a running task that never sent a heartbeat may go without finishing (default 86400)",
    ),
    (
        "SCHEDULER_MAX_ATTEMPTS",
        "queue.max_attempts",
        "expired leases before a task is failed (default 3)",
    ),
    (
        "SCHEDULER_WATCHDOG_INTERVAL",
        "queue.watchdog_interval_secs",
        "seconds between lease sweeps, 0 = off (default 30)",
    ),
    (
        "SCHEDULER_BOEFJE_PQ_MAXSIZE",
        "schedulers.boefje.maxsize",
        "boefje heap bound",
    ),
    (
        "SCHEDULER_NORMALIZER_PQ_MAXSIZE",
        "schedulers.normalizer.maxsize",
        "normalizer heap bound",
    ),
    (
        "SCHEDULER_REPORT_PQ_MAXSIZE",
        "schedulers.report.maxsize",
        "report heap bound",
    ),
    (
        "SCHEDULER_BOEFJE_PQ_WHEN_FULL",
        "schedulers.boefje.when_full",
        "boefje full-heap policy",
    ),
    (
        "SCHEDULER_NORMALIZER_PQ_WHEN_FULL",
        "schedulers.normalizer.when_full",
        "normalizer full-heap policy",
    ),
    (
        "SCHEDULER_REPORT_PQ_WHEN_FULL",
        "schedulers.report.when_full",
        "report full-heap policy",
    ),
    (
        "SCHEDULER_BOEFJE_DISPATCH_TIMEOUT",
        "schedulers.boefje.dispatch_timeout_secs",
        "boefje dispatch lease",
    ),
    (
        "SCHEDULER_NORMALIZER_DISPATCH_TIMEOUT",
        "schedulers.normalizer.dispatch_timeout_secs",
        "normalizer dispatch lease",
    ),
    (
        "SCHEDULER_REPORT_DISPATCH_TIMEOUT",
        "schedulers.report.dispatch_timeout_secs",
        "report dispatch lease",
    ),
    (
        "SCHEDULER_BOEFJE_RUN_TIMEOUT",
        "schedulers.boefje.run_timeout_secs",
        "boefje run lease",
    ),
    (
        "SCHEDULER_NORMALIZER_RUN_TIMEOUT",
        "schedulers.normalizer.run_timeout_secs",
        "normalizer run lease",
    ),
    (
        "SCHEDULER_REPORT_RUN_TIMEOUT",
        "schedulers.report.run_timeout_secs",
        "report run lease",
    ),
    (
        "SCHEDULER_BOEFJE_MAX_ATTEMPTS",
        "schedulers.boefje.max_attempts",
        "boefje attempts",
    ),
    (
        "SCHEDULER_NORMALIZER_MAX_ATTEMPTS",
        "schedulers.normalizer.max_attempts",
        "normalizer attempts",
    ),
    (
        "SCHEDULER_REPORT_MAX_ATTEMPTS",
        "schedulers.report.max_attempts",
        "report attempts",
    ),
    (
        "SCHEDULER_BOEFJE_SCORING",
        "schedulers.boefje.scoring",
        "boefje ranking strategy",
    ),
    (
        "SCHEDULER_NORMALIZER_SCORING",
        "schedulers.normalizer.scoring",
        "normalizer ranking strategy",
    ),
    (
        "SCHEDULER_REPORT_SCORING",
        "schedulers.report.scoring",
        "report ranking strategy",
    ),
];

/// Settings no variable sets, and why.
pub const FILE_ONLY: &[(&str, &str)] = &[(
    "auth.tokens",
    "a list of tables; SCHEDULER_API_TOKENS (auth.spec) is its form for the environment",
)];

/// mula's `SCHEDULER_*` variables this service reads no value from, on purpose, with the reason.
/// A deployment moved from mula keeps setting them, so they are not reported as unknown.
pub const IGNORED_MULA_VARS: &[(&str, &str)] = &[
    (
        "SCHEDULER_API",
        "the scheduler's address as its clients (Rocky, the runners) read it, not a setting of the scheduler",
    ),
    (
        "SCHEDULER_DEBUG",
        "SCHEDULER_LOG_LEVEL (e.g. debug) sets what is logged",
    ),
    (
        "SCHEDULER_COLLECT_METRICS",
        "metrics are always collected and served on /metrics",
    ),
    (
        "SCHEDULER_PQ_INTERVAL",
        "no polling populate loop: events are planned as they arrive and schedules fire on the cron ticks (SCHEDULER_CRON_TICK)",
    ),
    (
        "SCHEDULER_PQ_MAX_RANDOM_OBJECTS",
        "no random rescans: ColdStart and the schedules bring objects round again",
    ),
    (
        "SCHEDULER_MONITOR_ORGANISATIONS_INTERVAL",
        "organisations come with the plugin catalogue, refreshed every half of SCHEDULER_CATALOGUE_TTL",
    ),
    (
        "SCHEDULER_OCTOPOES_REQUEST_TIMEOUT",
        "one timeout for every client: SCHEDULER_CLIENTS_REQUEST_TIMEOUT",
    ),
    (
        "SCHEDULER_KATALOGUS_REQUEST_TIMEOUT",
        "one timeout for every client: SCHEDULER_CLIENTS_REQUEST_TIMEOUT",
    ),
    (
        "SCHEDULER_BYTES_REQUEST_TIMEOUT",
        "one timeout for every client: SCHEDULER_CLIENTS_REQUEST_TIMEOUT",
    ),
    (
        "SCHEDULER_OCTOPOES_POOL_CONNECTIONS",
        "the HTTP clients keep their connections alive and open more as needed",
    ),
    (
        "SCHEDULER_KATALOGUS_POOL_CONNECTIONS",
        "the HTTP clients keep their connections alive and open more as needed",
    ),
    (
        "SCHEDULER_BYTES_POOL_CONNECTIONS",
        "the HTTP clients keep their connections alive and open more as needed",
    ),
];

/// A `SCHEDULER_*` variable that is set but neither read nor one of mula's that are ignored on
/// purpose: most likely a misspelling, reported with the nearest name that is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVariable {
    /// The variable as set.
    pub name: String,
    /// The read variable nearest to it, when one is near enough to be a likely intent.
    pub suggestion: Option<&'static str>,
}

impl std::fmt::Display for UnknownVariable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is not a setting of kat-scheduler; it is ignored",
            self.name
        )?;
        if let Some(s) = self.suggestion {
            write!(f, " (did you mean {s}?)")?;
        }
        Ok(())
    }
}

/// Of the variables `names`, those under `SCHEDULER_` this service does not know (see
/// [`UnknownVariable`]). Other variables are a deployment's business and are not looked at.
pub fn unknown_variables<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<UnknownVariable> {
    let mut unknown: Vec<UnknownVariable> = names
        .into_iter()
        .filter(|n| n.starts_with("SCHEDULER_"))
        .filter(|n| !ENV_VARS.iter().any(|(v, _, _)| v == n))
        .filter(|n| !IGNORED_MULA_VARS.iter().any(|(v, _)| v == n))
        .map(|n| UnknownVariable {
            name: n.to_owned(),
            suggestion: nearest_variable(n),
        })
        .collect();
    unknown.sort_by(|a, b| a.name.cmp(&b.name));
    unknown
}

/// The read variable with the smallest edit distance to `name`, if that distance is small: at
/// most a quarter of the name's length, and at least 2 allowed.
fn nearest_variable(name: &str) -> Option<&'static str> {
    let most = (name.len() / 4).max(2);
    ENV_VARS
        .iter()
        .map(|(v, _, _)| (edit_distance(name, v), *v))
        .filter(|(d, _)| *d <= most)
        .min_by_key(|(d, _)| *d)
        .map(|(_, v)| v)
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// A configuration that cannot be used; one line, naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

/// Where a key's value came from, for messages: its variable when that is set.
fn source_of(key: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
    ENV_VARS
        .iter()
        .find(|(var, k, _)| *k == key && env(var).is_some())
        .map(|(var, _, _)| format!(" (from {var})"))
        .unwrap_or_default()
}

impl Settings {
    /// Loads the settings from the process environment and an optional file.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with(file, &|name| std::env::var(name).ok())
    }

    /// Loads the settings with `env` as the environment (tests pass a map).
    pub fn load_with(
        file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let defaults = Config::try_from(&Settings::default())
            .map_err(|e| ConfigError(format!("built-in defaults: {e}")))?;
        let mut builder = Config::builder().add_source(defaults);
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError(format!(
                    "config file {} does not exist",
                    path.display()
                )));
            }
            builder = builder.add_source(File::from(path).format(FileFormat::Toml));
        }
        // Later entries of ENV_VARS are aliases; the first one set for a key wins.
        let mut seen: Vec<&str> = Vec::new();
        for (var, key, _) in ENV_VARS {
            if seen.contains(key) {
                continue;
            }
            if let Some(value) = env(var) {
                seen.push(key);
                builder = builder
                    .set_override(*key, value)
                    .map_err(|e| ConfigError(format!("{key} (from {var}): {e}")))?;
            }
        }
        let settings: Settings =
            builder
                .build()
                .and_then(Config::try_deserialize)
                .map_err(|e| {
                    let msg = e.to_string();
                    let key = ENV_VARS.iter().map(|(_, k, _)| *k).find(|k| {
                        msg.contains(&format!("`{k}`")) || msg.contains(&format!("\"{k}\""))
                    });
                    match key {
                        Some(k) => ConfigError(format!("{msg}{}", source_of(k, env))),
                        None => ConfigError(msg),
                    }
                })?;
        settings.validate(env)?;
        Ok(settings)
    }

    fn validate(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let bad = |key: &str, why: String| {
            Err(ConfigError(format!("{key}{}: {why}", source_of(key, env))))
        };
        if let Err(why) = DbTarget::parse(&self.database.uri) {
            return bad("database.uri", why);
        }
        if self.database.pool_size < 2 {
            return bad(
                "database.pool_size",
                format!(
                    "must be at least 2 (one connection is the queue engine's), got {}",
                    self.database.pool_size
                ),
            );
        }
        if self.api.max_body_bytes == 0 {
            return bad("api.max_body_bytes", "must be positive".into());
        }
        if self.queue.max_batch == 0 {
            return bad("queue.max_batch", "must be at least 1".into());
        }
        if self.queue.channel_capacity == 0 {
            return bad("queue.channel_capacity", "must be at least 1".into());
        }
        if self.cluster.lease_ms < MIN_LEASE_MS {
            return bad(
                "cluster.lease_ms",
                format!(
                    "must be at least {MIN_LEASE_MS} (renewals every third of it must outpace network hiccups), got {}",
                    self.cluster.lease_ms
                ),
            );
        }
        if !self.cluster.advertise_url.is_empty()
            && let Err(e) = crate::clients::http::parse_base(&self.cluster.advertise_url)
        {
            return bad("cluster.advertise_url", e);
        }
        if self.queue.shed_after_secs == 0 {
            return bad("queue.shed_after_secs", "must be at least 1".into());
        }
        if self.api.request_head_timeout_secs == 0 {
            return bad("api.request_head_timeout_secs", "must be at least 1".into());
        }
        let uri = &self.listener.uri;
        if !uri.is_empty() && !uri.starts_with("amqp://") {
            return bad(
                "listener.uri",
                "expected amqp://USER:PASS@HOST:PORT/VHOST (amqps is not built in)".into(),
            );
        }
        if self.listener.prefetch == 0 {
            return bad("listener.prefetch", "must be at least 1".into());
        }
        for (key, q) in [
            ("listener.mutations_queue", &self.listener.mutations_queue),
            ("listener.raw_files_queue", &self.listener.raw_files_queue),
        ] {
            if q.trim().is_empty() {
                return bad(key, "must not be empty".into());
            }
        }
        if !self.catalogue.file.is_empty()
            && let Err(e) =
                crate::clients::catalogue::StaticCatalogue::load(Path::new(&self.catalogue.file))
        {
            return bad("catalogue.file", e);
        }
        let c = &self.clients;
        for (key, url) in [
            ("clients.katalogus_api", &c.katalogus_api),
            ("clients.octopoes_api", &c.octopoes_api),
            ("clients.bytes_api", &c.bytes_api),
        ] {
            if !url.is_empty()
                && let Err(e) = crate::clients::http::parse_base(url)
            {
                return bad(key, e);
            }
        }
        if !c.bytes_api.is_empty() {
            for (key, var, value) in [
                (
                    "clients.bytes_username",
                    "BYTES_USERNAME",
                    &c.bytes_username,
                ),
                (
                    "clients.bytes_password",
                    "BYTES_PASSWORD",
                    &c.bytes_password,
                ),
            ] {
                if value.is_empty() {
                    return bad(
                        key,
                        format!("required when clients.bytes_api is set (env {var})"),
                    );
                }
            }
        }
        if c.request_timeout_secs == 0 {
            return bad("clients.request_timeout_secs", "must be at least 1".into());
        }
        let cs = &self.coldstart;
        if cs.interval_secs == 0 {
            return bad("coldstart.interval_secs", "must be at least 1".into());
        }
        if !(1..=10_000).contains(&cs.page_size) {
            return bad(
                "coldstart.page_size",
                format!("must be 1 to 10000, got {}", cs.page_size),
            );
        }
        if cs.concurrency == 0 {
            return bad("coldstart.concurrency", "must be at least 1".into());
        }
        if cs.attempts == 0 {
            return bad("coldstart.attempts", "must be at least 1".into());
        }
        if self.catalogue.ttl_secs == 0 {
            return bad("catalogue.ttl_secs", "must be at least 1".into());
        }
        if let Err(e) = self.auth.tokens() {
            return bad("auth", e);
        }
        if self.api.body_timeout_secs == 0 {
            return bad("api.body_timeout_secs", "must be at least 1".into());
        }
        let l = &self.limits;
        for (key, value) in [
            ("limits.max_filter_conditions", l.max_filter_conditions),
            ("limits.max_filter_depth", l.max_filter_depth),
            ("limits.max_in_values", l.max_in_values),
            ("limits.max_string_chars", l.max_string_chars),
            ("limits.max_json_depth", l.max_json_depth),
        ] {
            if value == 0 {
                return bad(key, "must be at least 1".into());
            }
        }
        if l.max_string_chars > MAX_STRING_CHARS_CEILING {
            return bad(
                "limits.max_string_chars",
                format!(
                    "at most {MAX_STRING_CHARS_CEILING}: longer values do not fit an index entry in PostgreSQL"
                ),
            );
        }
        if l.max_filter_depth > MAX_FILTER_DEPTH_CEILING {
            return bad(
                "limits.max_filter_depth",
                format!("at most {MAX_FILTER_DEPTH_CEILING}: the JSON parser stops at 128 levels"),
            );
        }
        if l.max_in_values > MAX_IN_VALUES_CEILING {
            return bad(
                "limits.max_in_values",
                format!(
                    "at most {MAX_IN_VALUES_CEILING}: a statement takes at most 65,535 bound values"
                ),
            );
        }
        if l.max_offset < 0 {
            return bad("limits.max_offset", "must not be negative".into());
        }
        for s in SchedulerId::ALL {
            let limits = self.limits(s);
            let o = self.overrides(s);
            let key = |field: &str, overridden: bool| {
                if overridden {
                    format!("schedulers.{s}.{field}")
                } else {
                    format!("queue.{field}")
                }
            };
            if limits.dispatch_timeout.is_zero() {
                return bad(
                    &key("dispatch_timeout_secs", o.dispatch_timeout_secs.is_some()),
                    "must be at least 1".into(),
                );
            }
            if limits.run_timeout.is_zero() {
                return bad(
                    &key("run_timeout_secs", o.run_timeout_secs.is_some()),
                    "must be at least 1".into(),
                );
            }
            if limits.max_attempts == 0 {
                return bad(
                    &key("max_attempts", o.max_attempts.is_some()),
                    "must be at least 1".into(),
                );
            }
            if self.limits(s).maxsize == 0 {
                let key = if self.overrides(s).maxsize.is_some() {
                    format!("schedulers.{s}.maxsize")
                } else {
                    "queue.maxsize".to_owned()
                };
                return bad(&key, "must be at least 1".into());
            }
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.logging.level) {
            return bad(
                "logging.level",
                format!("'{}' is not a log filter: {e}", self.logging.level),
            );
        }
        Ok(())
    }

    fn overrides(&self, s: SchedulerId) -> &SchedulerOverride {
        match s {
            SchedulerId::Boefje => &self.schedulers.boefje,
            SchedulerId::Normalizer => &self.schedulers.normalizer,
            SchedulerId::Report => &self.schedulers.report,
        }
    }

    /// Each scheduler's ranking strategy.
    pub fn scoring(&self) -> crate::domain::PerScheduler<crate::scoring::Strategy> {
        crate::domain::PerScheduler::from_fn(|s| {
            self.overrides(s)
                .scoring
                .unwrap_or(crate::scoring::Strategy::TimeBased)
        })
    }

    /// The effective limits of one scheduler.
    pub fn limits(&self, s: SchedulerId) -> SchedulerLimits {
        let o = self.overrides(s);
        SchedulerLimits {
            maxsize: o.maxsize.unwrap_or(self.queue.maxsize),
            when_full: o.when_full.unwrap_or(self.queue.when_full),
            dispatch_timeout: Duration::from_secs(
                o.dispatch_timeout_secs
                    .unwrap_or(self.queue.dispatch_timeout_secs),
            ),
            run_timeout: Duration::from_secs(
                o.run_timeout_secs.unwrap_or(self.queue.run_timeout_secs),
            ),
            unrenewed_run_timeout: Duration::from_secs(self.queue.unrenewed_run_timeout_secs),
            max_attempts: o.max_attempts.unwrap_or(self.queue.max_attempts),
        }
    }

    /// What the queue needs.
    pub fn queue_config(&self) -> QueueConfig {
        QueueConfig {
            limits: PerScheduler::from_fn(|s| self.limits(s)),
            max_batch: self.queue.max_batch,
            channel_capacity: self.queue.channel_capacity,
            shed_after: Duration::from_secs(self.queue.shed_after_secs),
            input: self.limits,
            flush_barrier: self.flush_barrier(),
        }
    }

    /// Whether the engines answer after a shared flush barrier: as configured, else on for
    /// SQLite and off for PostgreSQL (see [`DatabaseSettings::flush_barrier`]).
    pub fn flush_barrier(&self) -> bool {
        self.database.flush_barrier.unwrap_or_else(|| {
            matches!(DbTarget::parse(&self.database.uri), Ok(DbTarget::Sqlite(_)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn load(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Settings::load_with(None, &move |k| map.get(k).cloned())
    }

    #[test]
    fn defaults_serve_on_8000_with_an_sqlite_file() {
        let s = load(&[]).unwrap();
        assert_eq!(s, Settings::default());
        assert_eq!((s.api.host.as_str(), s.api.port), ("0.0.0.0", 8000));
        assert_eq!(s.database.uri, "sqlite://data/scheduler.db");
    }

    #[test]
    fn the_flush_barrier_is_on_for_sqlite_and_off_for_postgresql_unless_set() {
        let barrier = |vars: &[(&str, &str)]| load(vars).unwrap().queue_config().flush_barrier;
        assert!(barrier(&[]), "the default SQLite file");
        assert!(!barrier(&[(
            "SCHEDULER_DB_URI",
            "postgresql://postgres@db/s"
        )]));
        assert!(!barrier(&[("SCHEDULER_DB_FLUSH_BARRIER", "false")]));
        assert!(barrier(&[
            ("SCHEDULER_DB_URI", "postgresql://postgres@db/s"),
            ("SCHEDULER_DB_FLUSH_BARRIER", "true"),
        ]));
        assert!(load(&[("SCHEDULER_DB_FLUSH_BARRIER", "sometimes")]).is_err());
    }

    #[test]
    fn mula_environment_names_work_as_is() {
        let s = load(&[
            ("SCHEDULER_API_HOST", "127.0.0.1"),
            ("SCHEDULER_API_PORT", "8004"),
            ("SCHEDULER_DB_URI", "postgresql://postgres@db/scheduler"),
            ("SCHEDULER_LOGGING_FORMAT", "json"),
        ])
        .unwrap();
        assert_eq!(s.api.host, "127.0.0.1");
        assert_eq!(s.api.port, 8004);
        assert_eq!(s.database.uri, "postgresql://postgres@db/scheduler");
        assert_eq!(s.logging.format, LogFormat::Json);
    }

    #[test]
    fn the_old_dsn_name_is_an_alias_and_the_new_name_wins() {
        let s = load(&[("SCHEDULER_DB_DSN", "sqlite:///tmp/a.db")]).unwrap();
        assert_eq!(s.database.uri, "sqlite:///tmp/a.db");
        let s = load(&[
            ("SCHEDULER_DB_URI", "sqlite:///tmp/new.db"),
            ("SCHEDULER_DB_DSN", "sqlite:///tmp/old.db"),
        ])
        .unwrap();
        assert_eq!(s.database.uri, "sqlite:///tmp/new.db");
    }

    #[test]
    fn a_bad_value_names_the_key_and_the_variable() {
        let err = load(&[("SCHEDULER_API_PORT", "eighty")]).unwrap_err().0;
        assert!(err.contains("api.port"), "{err}");
        assert!(err.contains("SCHEDULER_API_PORT"), "{err}");
        let err = load(&[("SCHEDULER_DB_URI", "mysql://x")]).unwrap_err().0;
        assert!(
            err.starts_with("database.uri (from SCHEDULER_DB_URI)"),
            "{err}"
        );
        let err = load(&[("SCHEDULER_PQ_WHEN_FULL", "drop")]).unwrap_err().0;
        assert!(err.contains("queue.when_full"), "{err}");
    }

    #[test]
    fn per_scheduler_overrides_apply_to_that_scheduler_only() {
        let s = load(&[
            ("SCHEDULER_PQ_MAXSIZE", "50"),
            ("SCHEDULER_REPORT_PQ_MAXSIZE", "5"),
            ("SCHEDULER_REPORT_PQ_WHEN_FULL", "reject"),
        ])
        .unwrap();
        assert_eq!(s.limits(SchedulerId::Boefje).maxsize, 50);
        assert_eq!(s.limits(SchedulerId::Report).maxsize, 5);
        assert_eq!(s.limits(SchedulerId::Report).when_full, WhenFull::Reject);
        assert_eq!(s.limits(SchedulerId::Boefje).when_full, WhenFull::Pending);
    }

    #[test]
    fn a_zero_maxsize_is_refused() {
        let err = load(&[("SCHEDULER_PQ_MAXSIZE", "0")]).unwrap_err().0;
        assert!(
            err.starts_with("queue.maxsize (from SCHEDULER_PQ_MAXSIZE)"),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_in_a_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[api]\nprot = 1\n").unwrap();
        let err = Settings::load_with(Some(&path), &|_| None).unwrap_err().0;
        assert!(err.contains("prot"), "{err}");
    }

    #[test]
    fn every_variable_the_readme_documents_is_read() {
        let readme = include_str!("../README.md");
        let table = readme
            .lines()
            .filter(|l| l.starts_with("| `"))
            .take_while(|l| !l.starts_with("| `GET") && !l.starts_with("| `POST"));
        let mut named = 0;
        for line in table {
            let first = line.split(" | ").next().unwrap_or_default();
            for var in first.split('`').skip(1).step_by(2) {
                named += 1;
                assert!(
                    ENV_VARS.iter().any(|(v, _, _)| *v == var),
                    "the README documents {var}, which the configuration does not read"
                );
            }
        }
        assert!(
            named >= ENV_VARS.len(),
            "{named} variables found in the README's table"
        );
    }

    #[test]
    fn lease_variables_set_the_leases_and_per_scheduler_ones_override_them() {
        let s = load(&[
            ("SCHEDULER_DISPATCH_TIMEOUT", "20"),
            ("SCHEDULER_RUN_TIMEOUT", "60"),
            ("SCHEDULER_UNRENEWED_RUN_TIMEOUT", "7200"),
            ("SCHEDULER_MAX_ATTEMPTS", "5"),
            ("SCHEDULER_WATCHDOG_INTERVAL", "0"),
            ("SCHEDULER_REPORT_DISPATCH_TIMEOUT", "90"),
            ("SCHEDULER_NORMALIZER_MAX_ATTEMPTS", "1"),
        ])
        .unwrap();
        assert_eq!(
            (
                s.queue.dispatch_timeout_secs,
                s.queue.run_timeout_secs,
                s.queue.max_attempts,
                s.queue.watchdog_interval_secs
            ),
            (20, 60, 5, 0)
        );
        assert_eq!(s.queue.unrenewed_run_timeout_secs, 7200);
        assert_eq!(
            s.limits(SchedulerId::Boefje).unrenewed_run_timeout,
            Duration::from_secs(7200)
        );
        assert_eq!(s.schedulers.report.dispatch_timeout_secs, Some(90));
        assert_eq!(s.schedulers.normalizer.max_attempts, Some(1));
    }

    #[test]
    fn the_readme_documents_every_environment_variable() {
        let readme = include_str!("../README.md");
        for (var, key, _) in ENV_VARS {
            assert!(readme.contains(var), "README lacks {var}");
            assert!(
                readme.contains(key.split('.').next().unwrap_or(key)),
                "README lacks {key}"
            );
        }
    }

    #[test]
    fn mula_names_set_the_service_clients() {
        let s = load(&[
            ("KATALOGUS_API", "http://katalogus:8000"),
            ("OCTOPOES_API", "http://octopoes_api:80"),
            ("BYTES_API", "http://bytes:8000"),
            ("BYTES_USERNAME", "scheduler"),
            ("BYTES_PASSWORD", "s3cr3t-pw"),
            ("SCHEDULER_CLIENTS_REQUEST_TIMEOUT", "3"),
        ])
        .unwrap();
        let c = &s.clients;
        assert_eq!(c.katalogus_api, "http://katalogus:8000");
        assert_eq!(c.octopoes_api, "http://octopoes_api:80");
        assert_eq!(c.bytes_api, "http://bytes:8000");
        assert_eq!(c.bytes_username, "scheduler");
        assert_eq!(c.bytes_password, "s3cr3t-pw");
        assert_eq!(c.timeout(), Duration::from_secs(3));
        assert!(c.katalogus().unwrap().is_some());
        assert!(c.octopoes().unwrap().is_some());
        assert!(c.bytes().unwrap().is_some());
        assert!(!format!("{s:?}").contains("s3cr3t-pw"));
        let none = load(&[]).unwrap().clients;
        assert_eq!(none.request_timeout_secs, DEFAULT_CLIENT_TIMEOUT_SECS);
        assert!(none.katalogus().unwrap().is_none());
        assert!(none.bytes().unwrap().is_none());
    }

    #[test]
    fn bad_client_settings_are_refused_naming_the_key() {
        let err = load(&[("KATALOGUS_API", "https://katalogus:8000")])
            .unwrap_err()
            .0;
        assert_eq!(
            err,
            "clients.katalogus_api (from KATALOGUS_API): https is not built in: use http on \
             the internal network or a TLS-terminating proxy"
        );
        let err = load(&[("OCTOPOES_API", "octopoes")]).unwrap_err().0;
        assert!(
            err.starts_with("clients.octopoes_api (from OCTOPOES_API): not a URL"),
            "{err}"
        );
        let err = load(&[("BYTES_API", "http://bytes:8000"), ("BYTES_USERNAME", "u")])
            .unwrap_err()
            .0;
        assert_eq!(
            err,
            "clients.bytes_password: required when clients.bytes_api is set (env BYTES_PASSWORD)"
        );
        let err = load(&[("SCHEDULER_CLIENTS_REQUEST_TIMEOUT", "0")])
            .unwrap_err()
            .0;
        assert!(err.starts_with("clients.request_timeout_secs"), "{err}");
        let err = load(&[("BYTES_API", "http://u:hunter2@bytes:8000")])
            .unwrap_err()
            .0;
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn the_shipped_example_config_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config.example.toml");
        let s = Settings::load_with(Some(&path), &|_| None).unwrap();
        assert_eq!(s.api.port, 8000);
    }

    /// Every setting's dotted key, from the defaults with every optional setting filled in
    /// (a per-scheduler override, the flush barrier, a token); a scheduler's id is `<id>`.
    fn setting_keys() -> Vec<String> {
        fn walk(prefix: &str, v: &serde_json::Value, out: &mut Vec<String>) {
            match v.as_object() {
                Some(map) => {
                    for (k, child) in map {
                        let key = if prefix.is_empty() {
                            k.clone()
                        } else {
                            format!("{prefix}.{k}")
                        };
                        walk(&key, child, out);
                    }
                }
                None => out.push(prefix.to_owned()),
            }
        }
        let mut full = Settings::default();
        full.database.flush_barrier = Some(true);
        full.schedulers.boefje = SchedulerOverride {
            maxsize: Some(1),
            when_full: Some(WhenFull::Reject),
            dispatch_timeout_secs: Some(1),
            run_timeout_secs: Some(1),
            max_attempts: Some(1),
            scoring: Some(crate::scoring::Strategy::TimeBased),
        };
        full.auth.tokens.push(TokenSettings {
            name: "n".into(),
            role: Role::Admin,
            schedulers: vec![],
            token: "t".into(),
        });
        let mut keys = Vec::new();
        walk("", &serde_json::to_value(&full).unwrap(), &mut keys);
        keys.into_iter()
            .map(|k| k.replace("schedulers.boefje.", "schedulers.<id>."))
            .collect()
    }

    /// A variable's setting, with a scheduler's id as `<id>`.
    fn generic(key: &str) -> String {
        let mut key = key.to_owned();
        for s in SchedulerId::ALL {
            key = key.replace(&format!("schedulers.{s}."), "schedulers.<id>.");
        }
        key
    }

    #[test]
    fn every_setting_has_a_variable_or_a_stated_reason() {
        let keys = setting_keys();
        assert!(keys.len() > 60, "{keys:?}");
        for key in &keys {
            let by_variable = ENV_VARS.iter().any(|(_, k, _)| generic(k) == *key);
            let file_only = FILE_ONLY.iter().any(|(k, _)| k == key);
            assert!(
                by_variable != file_only,
                "{key}: no variable sets it and FILE_ONLY gives no reason (or both)"
            );
        }
        for (_, key, _) in ENV_VARS {
            assert!(keys.contains(&generic(key)), "{key} is not a setting");
        }
    }

    /// The keys the example file shows, set or commented out, by table (`[schedulers.report]`
    /// counts as `schedulers.<id>`).
    fn example_keys() -> Vec<String> {
        let text = include_str!("../docs/config.example.toml");
        let mut table = String::new();
        let mut keys = Vec::new();
        for line in text.lines() {
            let line = line.trim_start_matches(['#', ' ']);
            let line = line.split(" #").next().unwrap_or_default().trim();
            if let Some(header) = line.strip_prefix('[') {
                table = generic(&format!("{}.", header.trim_matches(['[', ']']).trim()))
                    .trim_end_matches('.')
                    .to_owned();
                keys.push(table.clone());
            } else if let Some((key, _)) = line.split_once('=')
                && !key.trim().is_empty()
                && key
                    .trim()
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_')
            {
                keys.push(format!("{table}.{}", key.trim()));
            }
        }
        keys
    }

    #[test]
    fn the_example_config_shows_every_setting_and_no_other() {
        let shown = example_keys();
        for key in setting_keys() {
            assert!(shown.contains(&key), "docs/config.example.toml lacks {key}");
        }
        let keys = setting_keys();
        for key in &shown {
            let known = keys
                .iter()
                .any(|k| k == key || k.starts_with(&format!("{key}.")))
                || key.starts_with("auth.tokens.");
            assert!(
                known,
                "docs/config.example.toml shows {key}, which is no setting"
            );
        }
    }

    #[test]
    fn the_example_config_with_every_key_uncommented_loads() {
        let text = include_str!("../docs/config.example.toml");
        let uncommented: String = text
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest)
                    if rest.starts_with('[')
                        || rest.split_once('=').is_some_and(|(k, _)| {
                            k.trim().chars().all(|c| c.is_ascii_lowercase() || c == '_')
                        }) =>
                {
                    rest
                }
                _ => l,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("all.toml");
        std::fs::write(&path, uncommented).unwrap();
        Settings::load_with(Some(&path), &|_| None).unwrap();
    }

    #[test]
    fn a_misspelt_variable_is_reported_with_the_nearest_name_and_mulas_ignored_ones_are_not() {
        let unknown = unknown_variables([
            "SCHEDULER_API_PROT",
            "SCHEDULER_API_PORT",
            "SCHEDULER_DEBUG",
            "SCHEDULER_PQ_INTERVAL",
            "PATH",
            "SCHEDULER_SOMETHING_ELSE_ENTIRELY",
        ]);
        assert_eq!(
            unknown,
            [
                UnknownVariable {
                    name: "SCHEDULER_API_PROT".into(),
                    suggestion: Some("SCHEDULER_API_PORT"),
                },
                UnknownVariable {
                    name: "SCHEDULER_SOMETHING_ELSE_ENTIRELY".into(),
                    suggestion: None,
                },
            ]
        );
        assert_eq!(
            unknown[0].to_string(),
            "SCHEDULER_API_PROT is not a setting of kat-scheduler; it is ignored (did you mean \
             SCHEDULER_API_PORT?)"
        );
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn mulas_ignored_variables_are_not_read_and_the_readme_names_each() {
        let readme = include_str!("../README.md");
        for (var, why) in IGNORED_MULA_VARS {
            assert!(!ENV_VARS.iter().any(|(v, _, _)| v == var), "{var} is read");
            assert!(!why.is_empty());
            assert!(readme.contains(&format!("`{var}`")), "README lacks {var}");
        }
        for (key, _) in FILE_ONLY {
            assert!(readme.contains(&format!("`{key}`")), "README lacks {key}");
        }
    }
}
