//! Why a waiting task has not been handed out yet: the answer to "why is my scan waiting?", as
//! the queue's engine works it out and the API and a task's explanation show it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Why a waiting task has not been handed out yet: where it stands and what holds it back, as
/// its scheduler's owner sees it at the moment of asking.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Wait {
    /// `queued` (in the heap) or `pending` (beyond it).
    pub status: String,
    /// Its place among the queued tasks of its scheduler in priority order (1: the best); for a
    /// pending task, none.
    pub rank: Option<u64>,
    /// Queued tasks of its scheduler.
    pub queued: u64,
    /// Its place among its organisation's queued tasks (1: its organisation's next).
    pub rank_in_organisation: Option<u64>,
    /// Organisations served before its own in their turns (0: its organisation is next); none
    /// when organisations do not take turns, or for a user scan, which goes first.
    pub organisations_before: Option<u64>,
    /// Its place among the tasks the recent runners' filters see, for each recent filter it
    /// matches.
    pub filters: Vec<FilterRank>,
    /// What holds it back now: a rate or concurrency limit.
    pub held: Vec<String>,
    /// All of the above, as sentences.
    pub reasons: Vec<String>,
}

/// A task's place among the tasks a runner's filter sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FilterRank {
    /// The filter, as the runner sent it.
    #[schema(value_type = Object)]
    pub filter: serde_json::Value,
    /// Its place among the queued tasks the filter matches (1: the next such pop's).
    pub rank: u64,
}
