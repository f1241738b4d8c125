//! Integration tests: the real application on port 0, against SQLite and PostgreSQL.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic with its message is the failure report"
)]

mod helpers;
mod stubs;

mod api_contract;
mod auth;
mod catalogue_verdicts;
mod child;
mod clients;
mod cluster;
mod coldstart;
mod concurrency;
mod crash;
mod cron;
mod docs;
mod fairness;
mod fenced_batch;
mod filtered_pops;
mod filters;
mod fire_ledger;
mod history;
mod hostile_inputs;
mod import_mula;
mod isolation;
mod leases;
mod listener;
mod metrics;
mod migrations;
mod model;
mod openapi;
mod operable;
mod outage;
mod parked_store;
mod pending_backlog;
mod plans;
mod politeness;
mod process;
mod push_sets;
mod queue_rules;
mod recovery;
mod refill_ahead;
mod refill_move;
mod schedules;
mod statistics;
mod unknown_objects;
