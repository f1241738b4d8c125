//! Builds the service and owns its shutdown order: stop accepting and drain HTTP, then stop the
//! background processes in the order they were registered, then let the queue engines finish the
//! commands they hold, then close the database pool.

use std::net::TcpListener;
use std::time::Duration;

use actix_web::HttpServer;
use actix_web::dev::Server;
use anyhow::{Context, anyhow};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::clock::SharedClock;
use crate::config::Settings;
use crate::metrics::Metrics;
use std::sync::Arc;

use crate::api::observed::Observed;
use crate::clients::catalogue::{Catalogue, StaticCatalogue};
use crate::clients::http::Backoff;
use crate::coldstart::{ColdStart, ColdStartConfig, ColdStartStatus};
use crate::cron::Cron;
use crate::cron::coldstart::ColdStartResync;
use crate::cron::parked::ParkedEvents;
use crate::cron::prune::Prune;
use crate::cron::refill::Refill;
use crate::cron::reschedule::Reschedule;
use crate::cron::table::{CronTable, Periodic};
use crate::cron::watchdog::LeaseWatchdog;
use crate::domain::schedule::Cadence;
use crate::domain::{PerScheduler, SchedulerId};
use crate::frontier::Frontier;
use crate::frontier::lookup::ObjectLookup;
use crate::listener::{Listener, ListenerConfig, ListenerStatus, Source as ParkedSource};
use crate::ownership::{Ownership, OwnershipConfig, OwnershipHandle, SqliteLock};
use crate::planner::PushLinker;
use crate::planner::{BytesRuns, Planner};
use crate::processes::Processes;
use crate::queue::forward::Peers;
use crate::queue::{Broker, Cluster, EngineHandle};
use crate::schedules::Schedules;
use crate::scoring::Scorer;
use crate::storage::{self, DbPool, DbTarget};

/// A built service, bound to its port, not yet serving.
pub struct Application {
    port: u16,
    server: Server,
    broker: Broker,
    engine: EngineHandle,
    pool: DbPool,
    /// The cron tables.
    cron: Cron,
    /// Time between ticks (zero: no ticks).
    tick: Duration,
    /// The clock ticks read.
    clock: SharedClock,
    /// How long each background process gets to stop.
    stop_deadline: Duration,
    /// The AMQP listener, when `QUEUE_URI` is set.
    listener: Option<Arc<Listener>>,
    /// Its state (shown on `/health` also when it is off).
    listener_status: Arc<ListenerStatus>,
    /// The plugin catalogue (refreshed in the background when it comes from Katalogus).
    catalogue: Catalogue,
    /// ColdStart, when Octopoes is configured.
    coldstart: Option<ColdStart>,
    /// Its state (shown on `/health` also when it is off).
    coldstart_status: Arc<ColdStartStatus>,
    /// Scheduler ownership and its thread (PostgreSQL).
    ownership: Option<(Arc<Ownership>, OwnershipHandle)>,
    /// The lock that keeps a second instance off the SQLite file, held until the end.
    sqlite_lock: Option<SqliteLock>,
    /// The planner the listener and ColdStart hand their objects to.
    planner: Planner,
}

/// The lock of the configured SQLite file ([`SqliteLock::acquire`], off the runtime: it may
/// wait for a holder to let go); none for PostgreSQL, which instances share.
pub async fn sqlite_lock(settings: &Settings) -> anyhow::Result<Option<SqliteLock>> {
    match DbTarget::parse(&settings.database.uri) {
        Ok(DbTarget::Sqlite(path)) => Ok(Some(
            tokio::task::spawn_blocking(move || SqliteLock::acquire(&path))
                .await
                .context("taking the SQLite lock")??,
        )),
        _ => Ok(None),
    }
}

/// Opens the pool and brings the schema up to date (or checks it is, when `migrate` is off).
pub async fn open_database(settings: &Settings) -> anyhow::Result<(DbPool, DbTarget)> {
    let target = DbTarget::parse(&settings.database.uri)?
        .with_connect_timeout(settings.database.connect_timeout_secs);
    let db = settings.database.clone();
    let t = target.clone();
    let pool = tokio::task::spawn_blocking(move || -> anyhow::Result<DbPool> {
        let pool = storage::connect(
            &t,
            db.pool_size,
            Duration::from_secs(db.connect_timeout_secs),
        )?;
        let mut conn = storage::checkout(&pool)?;
        if db.migrate {
            let applied = storage::run_migrations(&mut conn)?;
            for m in &applied {
                info!(migration = %m, "migration applied");
            }
        } else {
            let pending = storage::pending_migrations(&mut conn)?;
            if !pending.is_empty() {
                return Err(anyhow!(
                    "the database schema is out of date ({} pending migrations); run `kat-scheduler migrate` or set SCHEDULER_DB_MIGRATE=true",
                    pending.len()
                ));
            }
        }
        // A database loaded by an import from mula, a restore or another instance's work may
        // never have been analysed: the API's listings would be planned from defaults.
        let began = std::time::Instant::now();
        match storage::statistics::refresh(&mut conn) {
            Ok(t) if t.is_empty() => {}
            Ok(tables) => info!(?tables, duration_ms = began.elapsed().as_millis() as u64, "tables the API lists from analysed (never analysed, or a tenth of their rows changed since)"),
            // Slower listings, not a reason to refuse to start.
            Err(e) => warn!(error = %e, "the statistics of the tables the API lists from could not be refreshed"),
        }
        Ok(pool)
    })
    .await??;
    Ok((pool, target))
}

/// The plugin catalogue the settings name: Katalogus when `KATALOGUS_API` is set, else the
/// static file, else none.
fn build_catalogue(settings: &Settings, clock: SharedClock) -> anyhow::Result<Catalogue> {
    let c = &settings.clients;
    if !c.katalogus_api.is_empty() {
        let client = crate::clients::katalogus::Katalogus::new(
            &c.katalogus_api,
            Duration::from_secs(c.request_timeout_secs),
        )
        .map_err(|e| anyhow!(e))?;
        info!(url = %c.katalogus_api, "plugin catalogue from Katalogus");
        return Ok(Catalogue::from_katalogus(
            client,
            Duration::from_secs(settings.catalogue.ttl_secs),
            clock,
        ));
    }
    if settings.catalogue.file.is_empty() {
        info!(
            "no plugin catalogue: neither KATALOGUS_API nor SCHEDULER_CATALOGUE_FILE is set; events plan no work"
        );
        return Ok(Catalogue::empty(clock));
    }
    let file = StaticCatalogue::load(std::path::Path::new(&settings.catalogue.file))
        .map_err(|e| anyhow!(e))?;
    info!(file = %settings.catalogue.file, plugins = file.len(), "plugin catalogue loaded");
    Ok(Catalogue::from_file(file, clock))
}

/// What the cron tables' entries work with.
struct CronParts<'a> {
    pool: &'a DbPool,
    broker: &'a Broker,
    catalogue: &'a Catalogue,
    scorer: &'a Arc<Scorer>,
    lookup: &'a ObjectLookup,
    schedules: &'a Schedules,
}

/// Each component's cron table, in the order its entries run: rescheduling (boefje, report),
/// the lease watchdog, refill, the ColdStart resync (boefje, when ColdStart is on), parked
/// events (boefje and normalizer), pruning.
fn build_cron(
    settings: &Settings,
    parts: CronParts<'_>,
    coldstart: Option<&Arc<ColdStartStatus>>,
    events: &Arc<Listener>,
    clock: SharedClock,
) -> Cron {
    let CronParts {
        pool,
        broker,
        catalogue,
        scorer,
        lookup,
        schedules,
    } = parts;
    let c = &settings.cron;
    if c.rescore_secs != crate::config::DEFAULT_RESCORE_SECS {
        // A setting an upgrade carries over from when it set the periodic re-score's period:
        // it still parses (a deployment is not broken by it), and says it does nothing now.
        warn!(
            cron.rescore_secs = c.rescore_secs,
            "cron.rescore_secs (SCHEDULER_RESCORE_INTERVAL) has no effect: priorities no longer \
             age, so there is no periodic re-score; a waiting task is re-scored when an event \
             changes its inputs. The setting can be removed."
        );
    }
    let tables = PerScheduler::from_fn(|s| {
        let mut table = CronTable::default();
        if s != SchedulerId::Normalizer {
            table.push(Reschedule {
                schedules: schedules.clone(),
                lookup: lookup.clone(),
                lookup_budget: crate::frontier::lookup::DEFAULT_BUDGET,
                broker: broker.clone(),
                catalogue: catalogue.clone(),
                grace: Duration::from_secs(c.grace_period_secs),
                jitter: Duration::from_secs(c.jitter_secs),
                scorer: scorer.clone(),
                // With the ticks off, tests and tools tick by hand: lateness then counts from
                // the default period.
                period: Duration::from_secs(match c.tick_secs {
                    0 => crate::config::DEFAULT_TICK_SECS,
                    n => n,
                }),
            });
        }
        let sweep = settings.queue.watchdog_interval_secs;
        if sweep > 0 {
            table.push(Periodic::new(
                LeaseWatchdog {
                    broker: broker.clone(),
                },
                Duration::from_secs(sweep),
                pool.clone(),
            ));
        }
        table.push(Refill {
            broker: broker.clone(),
        });
        if let Some(status) = coldstart
            && s == SchedulerId::Boefje
        {
            table.push(ColdStartResync::new(status.clone()));
        }
        // Parked object events plan boefje work, parked raw files normalizer work.
        let parked = match s {
            SchedulerId::Boefje => Some(ParkedSource::Mutations),
            SchedulerId::Normalizer => Some(ParkedSource::RawFiles),
            SchedulerId::Report => None,
        };
        if let Some(source) = parked {
            table.push(ParkedEvents::new(events.clone(), source));
        }
        if c.task_retention_days > 0 || c.schedule_history_days > 0 {
            let days = |d: u64| (d > 0).then(|| Duration::from_secs(d * 86_400));
            table.push(Periodic::new(
                Prune {
                    pool: pool.clone(),
                    retention: days(c.task_retention_days),
                    schedules: schedules.clone(),
                    history: days(c.schedule_history_days),
                },
                PRUNE_EVERY,
                pool.clone(),
            ));
        }
        table
    });
    Cron::new(tables, broker.metrics().clone(), clock)
}

/// Longest the background processes get, together, to stop: one waiting on a hung Katalogus,
/// Octopoes or RabbitMQ is aborted then (which cancels its call), so SIGTERM ends the service
/// within about 5 s whatever its dependencies do (Docker's default grace is 10 s).
const PROCESS_STOP_BUDGET: Duration = Duration::from_secs(3);

/// Seconds a forwarded command may take beyond the owner's own shedding deadline.
const FORWARD_MARGIN_SECS: u64 = 5;

/// How long a stopped service waits, at most, for connections its pools are still opening
/// before it exits: longer than an open takes on a loaded server, shorter than a supervisor's
/// patience (SIGTERM must end the service within about 5 s, [`PROCESS_STOP_BUDGET`]).
const OPENINGS_BOUND: Duration = Duration::from_secs(2);

/// Who this instance is to the others: its configured name and address, or defaults from the
/// host name and the bound port.
fn ownership_config(settings: &Settings, port: u16) -> OwnershipConfig {
    let c = &settings.cluster;
    let instance = if c.instance_id.is_empty() {
        crate::ownership::default_instance_name()
    } else {
        c.instance_id.clone()
    };
    let address = if c.advertise_url.is_empty() {
        let host = match settings.api.host.as_str() {
            // Listening on every interface says nothing of where others reach us.
            "0.0.0.0" | "::" | "[::]" => crate::ownership::host_name(),
            h => h.to_owned(),
        };
        format!("http://{host}:{port}")
    } else {
        c.advertise_url.trim_end_matches('/').to_owned()
    };
    OwnershipConfig {
        instance,
        address,
        lease: Duration::from_millis(c.lease_ms),
    }
}

/// How often finished tasks and schedules' fires past their retention are looked for.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

impl Application {
    /// Connects, migrates, rebuilds the heaps and binds the HTTP port.
    pub async fn build(settings: Settings, clock: SharedClock) -> anyhow::Result<Self> {
        let broker_clock = clock.clone();
        let clock_for_schedules = clock.clone();
        let clock_for_cron = clock.clone();
        let clock_for_listener = clock;
        // SQLite serves one instance: a second one on the same file stops here, before it
        // migrates or reads anything.
        let sqlite_lock = sqlite_lock(&settings).await?;
        let (pool, target) = open_database(&settings).await?;
        let backend = target.backend();
        info!(database = %target.display(), "database ready");

        let address = format!("{}:{}", settings.api.host, settings.api.port);
        let socket =
            TcpListener::bind(&address).with_context(|| format!("cannot listen on {address}"))?;
        let port = socket.local_addr()?.port();

        let (cluster, ownership) = match &target {
            DbTarget::Postgres(_) => {
                let own = Arc::new(Ownership::new(ownership_config(&settings, port)));
                // One round before the engines start, so each builds the heap it owns at once.
                let (o, t) = (own.clone(), target.clone());
                tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                    let mut conn = storage::open(&t)?;
                    o.round(&mut conn, &|_| {})
                        .context("cannot read the scheduler ownership rows")
                })
                .await??;
                info!(
                    instance = own.instance(),
                    address = own.address(),
                    owned = ?SchedulerId::ALL.into_iter().filter(|s| own.epoch(*s) > 0).collect::<Vec<_>>(),
                    "ownership: several instances may share this database"
                );
                // The rounds run from here, before the engines load their heaps: a rebuild holds
                // its scheduler's row (the fence) for as long as it takes, seconds for a million
                // queued tasks, and leases not renewed meanwhile would lapse and be taken. The
                // engines are woken once the broker exists; until then each reads its epoch
                // before its first batch.
                let waker = Arc::new(std::sync::OnceLock::<Broker>::new());
                let w = waker.clone();
                let handle = own.spawn(
                    target.clone(),
                    Arc::new(move |s| {
                        if let Some(b) = w.get() {
                            b.wake(s);
                        }
                    }),
                )?;
                let token = Some(settings.cluster.peer_token.clone()).filter(|t| !t.is_empty());
                if token.is_none() && settings.auth.tokens().is_ok_and(|t| t.enabled()) {
                    // Said, not refused: a single instance never forwards.
                    info!(
                        "tokens are required and cluster.peer_token (SCHEDULER_PEER_TOKEN) is not set: requests forwarded between instances sharing this database will be refused (503); set it when more than one instance runs"
                    );
                }
                let peers = Peers::new(
                    Duration::from_secs(settings.queue.shed_after_secs + FORWARD_MARGIN_SECS),
                    token,
                )?;
                (
                    Cluster {
                        ownership: Some(own.clone()),
                        peers: Some(peers),
                    },
                    Some((own, handle, waker)),
                )
            }
            DbTarget::Sqlite(_) => (Cluster::default(), None),
        };
        let queue_config = settings.queue_config();
        let p = pool.clone();
        let (broker, engine) = tokio::task::spawn_blocking(move || {
            Broker::start(
                p,
                backend,
                broker_clock,
                queue_config,
                Arc::new(Metrics::default()),
                cluster,
            )
        })
        .await?
        .context("cannot load the queue from the database")?;
        let ownership = ownership.map(|(own, handle, waker)| {
            // An engine whose ownership changed while the heaps loaded is woken now.
            if waker.set(broker.clone()).is_ok() {
                for s in SchedulerId::ALL {
                    broker.wake(s);
                }
            }
            (own, handle)
        });
        let body = crate::api::extract::BodyConfig {
            max_bytes: settings.api.max_body_bytes,
            timeout: Duration::from_secs(settings.api.body_timeout_secs),
        };
        let tokens = std::sync::Arc::new(settings.auth.tokens().map_err(|e| anyhow!(e))?);
        if tokens.enabled() {
            info!(tokens = ?tokens, "bearer tokens required");
        }
        let catalogue = build_catalogue(&settings, clock_for_listener.clone())?;
        let schedules = Schedules::new(pool.clone(), clock_for_schedules, settings.limits);
        let scorer = Arc::new(Scorer::new(settings.scoring()));
        let cadence = Cadence {
            grace: Duration::from_secs(settings.cron.grace_period_secs),
            jitter: Duration::from_secs(settings.cron.jitter_secs),
        };
        let linker = PushLinker {
            schedules: schedules.clone(),
            cadence,
            catalogue: catalogue.clone(),
            clock: clock_for_listener.clone(),
        };
        let clients = &settings.clients;
        let octopoes = clients.octopoes().map_err(|e| anyhow!(e))?;
        // Object lookups make one try each: a later tick, or the next event, is the retry.
        let lookup = ObjectLookup::new(
            Frontier::new(pool.clone()),
            octopoes.clone().map(|o| {
                o.with_backoff(Backoff {
                    attempts: 1,
                    ..Backoff::default()
                })
            }),
            clock_for_cron.clone(),
            broker.metrics().clone(),
        )
        .with_window(clients.lookup_window());
        let runs = match clients.bytes().map_err(|e| anyhow!(e))? {
            None => None,
            Some(b) => {
                // The history the tasks table holds begins at its oldest task, or now when it
                // holds none (work from now on runs through it).
                let earliest = storage::run(&pool, |c| {
                    Ok::<_, storage::StorageError>(storage::tasks::earliest(c)?)
                })
                .await
                .map_err(|e| anyhow!("reading the oldest task: {e}"))?;
                let start = clock_for_listener.now();
                let since = earliest.map_or(start, |t| t.and_utc().min(start));
                let retention = settings.cron.task_retention_days;
                let retention = (retention > 0)
                    .then(|| chrono::Duration::try_days(i64::try_from(retention).ok()?))
                    .flatten();
                // Bytes' runs are asked once each: the next event or pass is the retry.
                let b = b.with_backoff(Backoff {
                    attempts: 1,
                    ..Backoff::default()
                });
                Some(BytesRuns::new(
                    b,
                    since,
                    retention,
                    broker.metrics().clone(),
                ))
            }
        };
        let planner = Planner {
            broker: broker.clone(),
            objects: lookup.clone(),
            catalogue: catalogue.clone(),
            clock: clock_for_listener,
            schedules: Some((schedules.clone(), cadence)),
            scorer: scorer.clone(),
            runs,
        };
        let l = &settings.listener;
        let listener_status = Arc::new(ListenerStatus::new(&l.mutations_queue, &l.raw_files_queue));
        // Built whether or not it listens: its code applies the events parked in the database
        // (the cron entry `parked`), which another instance's listener may have parked.
        let events = Arc::new(Listener {
            config: ListenerConfig {
                uri: l.uri.clone(),
                mutations_queue: l.mutations_queue.clone(),
                raw_files_queue: l.raw_files_queue.clone(),
                prefetch: l.prefetch,
            },
            frontier: Frontier::new(pool.clone()),
            planner: planner.clone(),
            status: listener_status.clone(),
            holds: Default::default(),
            parking: crate::listener::parked::Parking::new(pool.clone(), l.park_after_secs),
        });
        let listener = if l.uri.is_empty() {
            info!("AMQP listener off: QUEUE_URI is not set");
            None
        } else {
            if settings.cron.tick_secs == 0 && l.park_after_secs > 0 {
                warn!(
                    "the listener parks events that keep failing, but the cron ticks are off (SCHEDULER_CRON_TICK=0): they are applied again by the cron table's entry `parked`, so none is"
                );
            }
            Some(events.clone())
        };
        let coldstart_status = Arc::new(ColdStartStatus::default());
        if octopoes.is_some() && settings.cron.tick_secs == 0 {
            warn!(
                "ColdStart is configured but the cron ticks are off (SCHEDULER_CRON_TICK=0): its rounds are asked for by the boefje cron table, so none runs"
            );
        }
        let coldstart = match &octopoes {
            Some(client) => Some(ColdStart {
                octopoes: client.clone(),
                frontier: Frontier::new(pool.clone()),
                planner: planner.clone(),
                clock: planner.clock.clone(),
                config: ColdStartConfig {
                    interval: Duration::from_secs(settings.coldstart.interval_secs),
                    page_size: settings.coldstart.page_size,
                    concurrency: settings.coldstart.concurrency,
                    attempts: settings.coldstart.attempts,
                    backoff: Duration::from_millis(settings.coldstart.backoff_ms),
                    ..ColdStartConfig::default()
                },
                status: coldstart_status.clone(),
                ownership: broker.ownership().cloned(),
            }),
            None => {
                info!("ColdStart off: OCTOPOES_API is not set");
                None
            }
        };
        let observed = Arc::new(Observed {
            listener: listener_status.clone(),
            catalogue: catalogue.clone(),
            coldstart: coldstart_status.clone(),
            katalogus: clients.katalogus().map_err(|e| anyhow!(e))?,
            octopoes,
            bytes: clients.bytes().map_err(|e| anyhow!(e))?,
            clock: clock_for_cron.clone(),
        });
        let cron = build_cron(
            &settings,
            CronParts {
                pool: &pool,
                broker: &broker,
                catalogue: &catalogue,
                scorer: &scorer,
                lookup: &lookup,
                schedules: &schedules,
            },
            coldstart.as_ref().map(|_| &coldstart_status),
            &events,
            clock_for_cron.clone(),
        );
        let app_broker = broker.clone();
        let keep_alive = match settings.api.keep_alive_secs {
            0 => actix_web::http::KeepAlive::Disabled,
            secs => actix_web::http::KeepAlive::Timeout(Duration::from_secs(secs)),
        };
        let mut server = HttpServer::new(move || {
            crate::api::app(
                app_broker.clone(),
                body,
                tokens.clone(),
                observed.clone(),
                schedules.clone(),
                linker.clone(),
            )
        })
        .disable_signals()
        .keep_alive(keep_alive)
        // A client that closes its side has hung up (none of the platform's clients half-close
        // a connection to wait for an answer): its request is dropped at once, so a pop whose
        // runner gave up (its HTTP timeout, a proxy's) gives its tasks back to the queue rather
        // than leaving them to their dispatch lease. Allowed, the request ran on to an answer
        // nobody read.
        .h1_allow_half_closed(false)
        // Only the head has a deadline here: a request read in full waits for its engine,
        // which sheds it with 503 if it waited too long, and is never answered 408.
        .client_request_timeout(Duration::from_secs(settings.api.request_head_timeout_secs))
        .shutdown_timeout(settings.api.shutdown_timeout_secs);
        if settings.api.workers > 0 {
            server = server.workers(settings.api.workers);
        }
        let server = server.listen(socket)?.run();
        info!(address = %format!("{}:{port}", settings.api.host), "listening");
        Ok(Self {
            port,
            server,
            broker,
            engine,
            pool,
            cron,
            tick: Duration::from_secs(settings.cron.tick_secs),
            clock: clock_for_cron,
            stop_deadline: Duration::from_secs(settings.api.shutdown_timeout_secs),
            listener,
            listener_status,
            catalogue,
            coldstart,
            coldstart_status,
            ownership,
            sqlite_lock,
            planner,
        })
    }

    /// ColdStart's state (tests wait on it and wake it).
    pub fn coldstart_status(&self) -> Arc<ColdStartStatus> {
        self.coldstart_status.clone()
    }

    /// The AMQP listener's state (tests wait on it).
    pub fn listener_status(&self) -> Arc<ListenerStatus> {
        self.listener_status.clone()
    }

    /// The bound port (useful with port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cron tables (tests run ticks on them directly).
    pub fn cron(&self) -> Cron {
        self.cron.clone()
    }

    /// The queue, for in-process callers and tests.
    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// The planner, for in-process callers (benchmarks hand it events as the listener does).
    pub fn planner(&self) -> Planner {
        self.planner.clone()
    }

    /// Serves until `shutdown` is cancelled, then stops in order.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Self {
            server,
            engine,
            pool,
            broker,
            cron,
            tick,
            clock,
            stop_deadline,
            listener,
            catalogue,
            coldstart,
            ownership,
            sqlite_lock,
            ..
        } = self;
        let owned = ownership.as_ref().map(|(o, _)| o.clone());
        let handle = server.handle();
        let serving = tokio::spawn(server);
        // Background processes, registered in their stop order.
        let mut processes = Processes::default();
        // The listener stops first: unacked messages go back to RabbitMQ before the engines
        // finish.
        if let Some(l) = listener {
            processes.spawn("AMQP listener", move |token| l.clone().run(token));
        }
        if let Some(c) = coldstart {
            let c = Arc::new(c);
            processes.spawn("ColdStart", move |token| c.clone().run(token));
        }
        if catalogue.is_remote() {
            processes.spawn("catalogue refresh", move |token| {
                catalogue.clone().run_refresh(token)
            });
        }
        if !tick.is_zero() {
            processes.spawn("cron ticks", move |token| {
                crate::cron::ticks::run(cron.clone(), clock.clone(), tick, owned.clone(), token)
            });
        }
        shutdown.cancelled().await;
        if let Some((own, _)) = &ownership {
            own.stop_claiming();
        }
        info!("shutting down: draining HTTP requests");
        handle.stop(true).await;
        let served = serving.await;
        processes.stop(stop_deadline.min(PROCESS_STOP_BUDGET)).await;
        info!("stopping the queue engines");
        drop(broker);
        tokio::task::spawn_blocking(move || engine.shutdown()).await?;
        if let Some((own, handle)) = ownership {
            // The engines have committed all they held: hand the schedulers over at once.
            let p = pool.clone();
            tokio::task::spawn_blocking(move || {
                handle.stop();
                match storage::checkout(&p) {
                    Ok(mut conn) => own.release_all(&mut conn),
                    Err(e) => {
                        tracing::warn!(error = %e, "leases not released; they lapse on their own")
                    }
                }
            })
            .await?;
        }
        drop(pool);
        drop(sqlite_lock);
        // A connection some pool is still opening (for a checkout that gave up) must not be in
        // its TLS handshake when the process exits (see `storage::openings_settled`).
        let settled =
            tokio::task::spawn_blocking(|| storage::openings_settled(OPENINGS_BOUND)).await?;
        if !settled {
            tracing::warn!(
                bound_secs = OPENINGS_BOUND.as_secs(),
                "a database connection was still being opened at exit"
            );
        }
        info!("stopped");
        served?.context("HTTP server failed")
    }
}
