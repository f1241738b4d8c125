//! The `cron_state` rows: each periodic cron entry's next run and last run, per component, so a
//! restart neither skips nor repeats a run (see [`crate::cron::table`]).

use chrono::NaiveDateTime;
use diesel::QueryResult;
use diesel::QueryableByName;
use diesel::sql_types::Timestamp;

use super::sql::Sql;
use super::{AnyConnection, Backend};

fn sql(conn: &AnyConnection, text: &str) -> Sql {
    Sql::new(Backend::of(conn), text)
}

/// A periodic cron entry's next run, if it has run before.
pub fn next_run(
    conn: &mut AnyConnection,
    component: &str,
    entry: &str,
) -> QueryResult<Option<NaiveDateTime>> {
    #[derive(QueryableByName)]
    struct Next {
        #[diesel(sql_type = Timestamp)]
        next_run_at: NaiveDateTime,
    }
    let mut q = sql(
        conn,
        "SELECT next_run_at FROM cron_state WHERE component = ",
    );
    q.bind(component).push(" AND entry = ").bind(entry);
    Ok(q.load::<Next>(conn)?
        .into_iter()
        .next()
        .map(|n| n.next_run_at))
}

/// Records a periodic cron entry's run at `ran` and its next run.
pub fn set_next_run(
    conn: &mut AnyConnection,
    component: &str,
    entry: &str,
    ran: NaiveDateTime,
    next: NaiveDateTime,
) -> QueryResult<()> {
    let mut q = sql(
        conn,
        "INSERT INTO cron_state (component, entry, next_run_at, last_run_at) VALUES (",
    );
    q.bind(component)
        .push(", ")
        .bind(entry)
        .push(", ")
        .bind(next)
        .push(", ")
        .bind(ran)
        .push(
            ") ON CONFLICT (component, entry) DO UPDATE SET next_run_at = excluded.next_run_at, \
             last_run_at = excluded.last_run_at",
        );
    q.execute(conn)?;
    Ok(())
}
