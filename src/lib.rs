//! kat-scheduler: a priority-queue job broker for OpenKAT-style scanning workers, wire-compatible
//! with OpenKAT's scheduler ("mula") REST API.
//!
//! # Layout
//!
//! Dependencies point one way: `domain` ← {`storage`, `clients`, `scoring`} ← {`queue` (with
//! `ownership`), `frontier`, `schedules`} ← `planner` ← {`api`, `listener`, `coldstart`, `cron`} ←
//! `startup`, which registers the background processes with [`processes`].
//!
//! | module | owns |
//! |---|---|
//! | [`domain`] | tasks, statuses and their state machine (the broker's own moves too), scheduler ids, the task hash, payload rules, the key fields tasks are found by, the filter language (parsed, planned, evaluated in memory), cron expressions as croniter reads and evaluates them, the dispatch limits per key and their sliding windows (`politeness.rs`), a schedule's due fire and its fate (fired, skipped, waiting, with the reason; lateness); pure |
//! | [`clock`] | the injected time source |
//! | [`storage`] | connections (PostgreSQL or SQLite), migrations, every SQL statement (one file per table, `schedule_fires` beside its owner `schedules`; `storage/tasks/` by caller: the engines' writes, their reads of waiting work, the API's reads, upkeep; a listing's count and page written once, `storage::listing`), and `storage::run`, the one way async code runs statements on the pool |
//! | [`queue`] | one engine per scheduler: a bounded heap indexed by hash and key field, the organisations' turns (`fair.rs`, docs/SCHEDULING.md), the rules of docs/DESIGN.md §5 (one file each, in `queue/engine/`, explaining a wait in `explain.rs`), group-committed batches; the broker's commands (`mod.rs`), its shared types (`types.rs`), routing to the owning instance (`routing.rs`), the engines' published figures (`gauges.rs`), reads for the API (`reads.rs`) |
//! | [`clients`] | the platform's other services: typed HTTP clients of Katalogus, Octopoes and Bytes (mula's calls and JSON, transport retries, one error type), and the plugin catalogue (Katalogus cached with a TTL and refreshed in the background, or a static file) |
//! | [`frontier`] | the only writer of the frontier: objects, raw files and ColdStart checkpoints, idempotent upserts in batches; what is known of an object (`frontier::lookup`): the frontier is a mirror, so an object it lacks is asked of Octopoes and only Octopoes' "not found" or a delete makes it gone |
//! | [`planner`] | frontier × catalogue → tasks: pure rules (`planner::rules`), de-duplication siblings across organisations, one push per batch of the planner's work; schedules for planned and client-pushed boefje and report work (mula's `post_push`) |
//! | [`listener`] | the AMQP listener: events in batches, frontier and tasks out, ack after commit, dead letters |
//! | [`scoring`] | CalculateScore: one strategy per file (time-based, grace-period, change-delta), pure; explanations |
//! | [`schedules`] | recurring work (mula's `/schedules`): create, read, list, search, change, delete, and the rows of the schedules planned and pushed work gets (`Schedules::link_row`, written by the queue's engine with their task); otherwise the writer of the `schedules` table while the service runs: `cron::reschedule` reads the due schedules and moves fired ones on or disables gone ones through it (`Schedules::due`, `Schedules::settle`); `import` writes it with the service stopped. Also the one writer of `schedule_fires`, the fire ledger: each due fire's fate (`domain::fire`) recorded by `Schedules::settle` in the same transaction, read by `/schedules/{id}/history`, pruned by `cron::prune` |
//! | [`coldstart`] | pages every organisation's objects from Octopoes into the frontier, resumable, marks unseen objects gone |
//! | [`cron`] | the ticks generator and each scheduler's cron table: rescheduling due schedules (each due fire's fate decided and recorded with its schedule's update), the lease watchdog, re-scoring waiting work, pruning finished tasks and old fires; periodic entries persist their next run |
//! | [`processes`] | the home of background processes: started by startup, stopped in order with a deadline |
//! | [`api`] | actix-web handlers (the scheduler parsed from the path once, `extract::SchedulerPath`), DTOs, the one error-to-HTTP mapping, listings (`paging.rs`: the parameters both lists take, page bounds, the answer with its links), PATCH bodies read field by field (`patch.rs`), what health and metrics observe (`observed.rs`), the OpenAPI document |
//! | [`config`] | typed settings: defaults → file → environment (mula's names), validated at start; one file per area (`config/api.rs`, `database`, `queue` with the per-scheduler overrides, `cluster`, `listener`, `catalogue`, `clients`, `coldstart`, `cron`, `auth`, `limits`, `logging`), each with its settings, its defaults as `DEFAULT_…` constants and its own validation; `config/env.rs` is the one list of environment variables (with mula's ignored ones); the processes read their defaults from here |
//! | [`telemetry`] | the tracing subscriber |
//! | [`metrics`] | what `/metrics` serves, on `prometheus-client`: the registry of counters and histograms recorded as the service runs (handles looked up once; the histograms atomic, its own), the process' figures read at scrape time (`process.rs`), the catalogue every metric is registered from (`catalogue.rs`) |
//! | [`ownership`] | which instance owns each scheduler's heap on a shared PostgreSQL: lease rows with a fencing epoch, renewed and taken over by a thread of their own; the SQLite lock file |
//! | [`import`] | `import-mula`: mula's schedules and tasks copied from its PostgreSQL database, in batches, idempotent, every refused row reported; pure conversion rules (`import::rules`); run with the service stopped, writing the tables directly |
//! | [`startup`] | builds the service and owns the shutdown order |
//!
//! The binary (`src/main.rs`) only parses the command line and calls into [`startup`] (or
//! [`import`] for `import-mula`).

pub mod api;
pub mod clients;
pub mod clock;
pub mod coldstart;
pub mod config;
pub mod cron;
pub mod domain;
pub mod frontier;
pub mod import;
pub mod listener;
pub mod metrics;
pub mod ownership;
pub mod planner;
pub mod processes;
pub mod queue;
pub mod schedules;
pub mod scoring;
pub mod startup;
pub mod storage;
pub mod telemetry;
