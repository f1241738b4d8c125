//! Pure types of the broker: tasks, their statuses and the transitions allowed between them,
//! scheduler ids, the task hash, task payload rules, the key fields tasks are found by and the
//! filter language (parsed, planned and evaluated in memory), cron expressions as Python's
//! croniter reads and evaluates them, the fire ledger's terms (what became of a schedule's due
//! fire), and what a waiting task's wait is made of.
//!
//! Nothing in here does IO or reads the clock; the other layers build on these types.

pub mod auth;
pub mod cron;
pub mod event;
pub mod filter;
pub mod fire;
pub mod hash;
pub mod keys;
pub mod limits;
pub mod payload;
pub mod plugin;
pub mod politeness;
pub mod query;
pub mod schedule;
pub mod task;
pub mod wait;

pub use task::{
    IllegalTransition, PerScheduler, Placement, SchedulerId, Task, TaskStatus, USER_PRIORITY_MAX,
};
