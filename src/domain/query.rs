//! A `/tasks` listing as the API parsed it: equality filters from the query string plus an
//! optional filter tree, and a page.

use chrono::NaiveDateTime;

use super::filter::FilterNode;
use super::{SchedulerId, TaskStatus};

/// A `/tasks` listing: equality filters from the query string plus an optional filter tree.
#[derive(Debug, Clone, Default)]
pub struct TaskQuery {
    /// `scheduler_id = …`
    pub scheduler_id: Option<SchedulerId>,
    /// `organisation = …`
    pub organisation: Option<String>,
    /// `type = …`
    pub task_type: Option<String>,
    /// `status = …`
    pub status: Option<TaskStatus>,
    /// `created_at >= …`
    pub min_created_at: Option<NaiveDateTime>,
    /// `created_at <= …`
    pub max_created_at: Option<NaiveDateTime>,
    /// The body's filters.
    pub filter: Option<FilterNode>,
    /// Rows to skip.
    pub offset: i64,
    /// Rows to return (0: only count).
    pub limit: i64,
}
