//! The planner's statistics of the tables the API lists from (`tasks`, `schedules`), kept
//! current by the service itself after bulk changes.
//!
//! The API's listings are planned with the planner's full choice, from the tables' statistics.
//! On a table never analysed those are defaults: two equality filters are estimated to match a
//! couple of rows, so the webapp's task list (`scheduler_id` and `type`, newest first, a page of
//! ten) was planned as a parallel scan and sort of all of `tasks` instead of a walk of
//! `ix_tasks_created_at` from its end: 126 ms against 0.08 ms at 200,000 tasks, growing with the
//! history (docs/BENCHMARKS.md, "The API's listings on tables never analysed"). Autovacuum
//! analyses a table once a tenth of it has changed, a minute or so after; where it is off (as on
//! CI's server), or between a bulk load (an import from mula, a restore, a ColdStart) and its next
//! round, nothing does. So the service applies autovacuum's own rule, at start and after every
//! [`crate::queue`] engine has created many tasks: a table with more than
//! [`STALE_BASE`] + [`STALE_SCALE`] × its rows changed since its last analyse is analysed now,
//! and so is one never analysed that holds any row. The count of changes is the server's
//! cumulative statistics, which a session reports up to seconds after its commits; the row count
//! of a table never analysed is unknown to the planner at once (`reltuples` = -1), so a database
//! loaded just before the service starts is analysed at its start.
//!
//! Status changes count as changes, so on a busy server that is about every 20,000 tasks created.
//! Each `ANALYZE` samples 3,000 rows ([`ANALYSE_SAMPLE_TARGET`], as the queue table's), which
//! tells the listings' plans apart as well as the server's 30,000 do (the row counts, the
//! frequent schedulers, types, statuses and organisations, the creation times' spread): 79 ms
//! against 624 ms on 200,000 tasks.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Double, Text};

use super::{ANALYSE_SAMPLE_TARGET, AnyConnection, Backend, StorageError};

/// The tables the API lists from, whose statistics the service keeps.
pub const LISTED: [&str; 2] = ["tasks", "schedules"];

/// Rows changed beyond which a table's statistics are stale: autovacuum's
/// `autovacuum_analyze_threshold` default.
pub const STALE_BASE: f64 = 50.0;

/// The share of a table's rows changed beyond which its statistics are stale: autovacuum's
/// `autovacuum_analyze_scale_factor` default.
pub const STALE_SCALE: f64 = 0.1;

/// An arbitrary key of the advisory lock that lets one session at a time check and analyse (the
/// engines of several instances may come to it together; a second would only repeat the first).
const LOCK_KEY: i64 = 0x6b61_7453_7461_7473;

#[derive(QueryableByName)]
struct TableStats {
    #[diesel(sql_type = Text)]
    name: String,
    /// Rows inserted, updated or deleted since the last analyse (all of them, if never).
    #[diesel(sql_type = BigInt)]
    changed: i64,
    /// The row count the last analyse or vacuum estimated (`-1`: never).
    #[diesel(sql_type = Double)]
    rows: f64,
}

#[derive(QueryableByName)]
struct Exists {
    #[diesel(sql_type = Bool)]
    exists: bool,
}

#[derive(QueryableByName)]
struct Locked {
    #[diesel(sql_type = Bool)]
    locked: bool,
}

/// Whether a table of `rows` (as last estimated; negative: never analysed) with `changed` rows
/// changed since needs analysing, by autovacuum's rule.
pub fn stale(changed: i64, rows: f64) -> bool {
    changed as f64 > STALE_BASE + STALE_SCALE * rows.max(0.0)
}

/// Analyses those of [`LISTED`] whose statistics are stale ([`stale`]), unless another session
/// is at it; answers the tables analysed. Nothing on SQLite, which plans by its indexes' shapes.
pub fn refresh(conn: &mut AnyConnection) -> Result<Vec<&'static str>, StorageError> {
    if Backend::of(conn) != Backend::Postgres {
        return Ok(Vec::new());
    }
    conn.transaction(|c| {
        let locked = diesel::sql_query("SELECT pg_try_advisory_xact_lock($1) AS locked")
            .bind::<BigInt, _>(LOCK_KEY)
            .get_result::<Locked>(c)?
            .locked;
        if !locked {
            return Ok(Vec::new());
        }
        let names = LISTED.map(|t| format!("'{t}'")).join(", ");
        let stats = diesel::sql_query(format!(
            "SELECT s.relname::text AS name, s.n_mod_since_analyze AS changed, \
             c.reltuples::float8 AS rows \
             FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid \
             WHERE s.schemaname = current_schema() AND s.relname IN ({names})"
        ))
        .load::<TableStats>(c)?;
        let mut analysed = Vec::new();
        for table in LISTED {
            let Some(s) = stats.iter().find(|s| s.name == table) else {
                continue;
            };
            let due = stale(s.changed, s.rows)
                || (s.rows < 0.0
                    && diesel::sql_query(format!(
                        "SELECT EXISTS (SELECT 1 FROM {table}) AS exists"
                    ))
                    .get_result::<Exists>(c)?
                    .exists);
            if due {
                c.batch_execute(&format!(
                    "SET LOCAL default_statistics_target = {ANALYSE_SAMPLE_TARGET}; ANALYZE {table}"
                ))?;
                analysed.push(table);
            }
        }
        Ok(analysed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_are_stale_by_autovacuums_rule() {
        // Never analysed: the first 50 changes are not worth it, the 51st is.
        assert!(!stale(50, -1.0));
        assert!(stale(51, -1.0));
        // A tenth of the rows and the base.
        assert!(!stale(10_050, 100_000.0));
        assert!(stale(10_051, 100_000.0));
        assert!(!stale(0, 0.0));
    }
}
