//! kat-scheduler: a priority-queue job broker for OpenKAT-style scanning workers, wire-compatible
//! with OpenKAT's scheduler ("mula") REST API.
//!
//! # Layout
//!
//! Dependencies point one way: `domain` ← `storage` ← `queue` ← {`api`, `watchdog`} ← `startup`.
//!
//! | module | owns |
//! |---|---|
//! | [`domain`] | tasks, statuses and their state machine, scheduler ids, the task hash, payload rules, the filter language; pure |
//! | [`clock`] | the injected time source |
//! | [`storage`] | connections (PostgreSQL or SQLite), migrations, every SQL statement |
//! | [`queue`] | the bounded heaps, the engine that group-commits pushes, pops and patches, the rules of DESIGN.md §5 |
//! | [`watchdog`] | the lease watchdog loop: re-queues or fails tasks whose lease ended |
//! | [`api`] | actix-web handlers, DTOs, the one error-to-HTTP mapping, the OpenAPI document |
//! | [`config`] | typed settings: defaults → file → environment (mula's names), validated at start |
//! | [`telemetry`] | the tracing subscriber |
//! | [`startup`] | builds the service and owns the shutdown order |
//!
//! The binary (`src/main.rs`) only parses the command line and calls into [`startup`].

pub mod api;
pub mod clock;
pub mod config;
pub mod domain;
pub mod queue;
pub mod startup;
pub mod storage;
pub mod telemetry;
pub mod watchdog;
