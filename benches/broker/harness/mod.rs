//! What the scenarios share. Each scenario module starts its own databases and brokers with
//! these and measures with them; nothing here picks what runs (that is `benches/broker.rs`).
//!
//! # Layout
//! - `stats.rs`: a measurement's figure (ops/s, p50, p99), medians over rounds, numbers for
//!   reading;
//! - `postgres.rs`: a database per scenario, the machine line, the seeded tasks, counts;
//! - `baseline.rs`: the bare PostgreSQL SKIP LOCKED queue the broker is measured against;
//! - `job_commits.rs`: a remote worker's job as three bare SQL commits, a side of
//!   `--completions`;
//! - `instance.rs`: starting and stopping the broker's release binary, its resident memory;
//! - `pg_alone.rs`: PostgreSQL alone writing the broker's pushes (its own statement, no HTTP):
//!   the bound of `--pushes` and of the default run's pushes on the same server;
//! - `http.rs`: the HTTP/1.1 load client, the requests, the closed-loop and paced load;
//! - `worker_pops.rs`: the pops real workers send at a held depth, shared by `--workers` and
//!   `--pending`.

pub mod baseline;
pub mod http;
pub mod instance;
pub mod job_commits;
pub mod pg_alone;
pub mod postgres;
pub mod stats;
pub mod worker_pops;
