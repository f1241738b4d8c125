//! The `scheduler_owners` rows: which instance owns each scheduler's heap, under which epoch,
//! until when. PostgreSQL only (SQLite runs one instance). Every expiry is computed on the
//! database's clock, so the instances' own clocks may disagree without harm.
//!
//! Fencing rests on row locks: a batch takes the row `FOR SHARE` and checks its epoch in its
//! own transaction, and a takeover's `INSERT … ON CONFLICT DO UPDATE` must wait for that lock, so
//! a batch either commits before the takeover (and the new owner's rebuild sees it) or finds
//! the new epoch and rolls back.

use diesel::QueryResult;
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Double, Nullable, Text};

use super::sql::{Bind, Sql};
use super::{AnyConnection, Backend};
use crate::domain::SchedulerId;

/// One scheduler's owner as stored.
#[derive(Debug, Clone, PartialEq, QueryableByName)]
pub struct OwnerRow {
    /// The scheduler.
    #[diesel(sql_type = Text)]
    pub scheduler_id: String,
    /// The owning instance; `None` after a clean release.
    #[diesel(sql_type = Nullable<Text>)]
    pub owner: Option<String>,
    /// Where the owner takes forwarded requests.
    #[diesel(sql_type = Nullable<Text>)]
    pub address: Option<String>,
    /// The fencing token: raised by every takeover.
    #[diesel(sql_type = BigInt)]
    pub epoch: i64,
    /// Whether the lease still runs (an owner, not yet expired).
    #[diesel(sql_type = Bool)]
    pub live: bool,
    /// When the owner took the lease, in seconds since the epoch on the database's clock
    /// (`None` before anyone did).
    #[diesel(sql_type = Nullable<Double>)]
    pub acquired_at: Option<f64>,
    /// The database's clock when the row was read, in seconds since the epoch.
    #[diesel(sql_type = Double)]
    pub read_at: f64,
}

#[derive(QueryableByName)]
struct Epoch {
    #[diesel(sql_type = BigInt)]
    epoch: i64,
}

/// The advisory lock `kat-scheduler import-mula` holds on its target for the whole import, in
/// its session: a lease is not taken while it is held (the import writes behind any heap built
/// then), and an import does not start while a lease is being taken. (The bytes of `katimprt`.)
pub const IMPORT_LOCK: i64 = 0x6b61_7469_6d70_7274;

/// Takes the import's lock ([`IMPORT_LOCK`]) for this session, until it ends; false while
/// another import holds it or an instance is taking a lease.
pub fn lock_for_import(conn: &mut AnyConnection) -> QueryResult<bool> {
    try_import_lock(conn, "pg_try_advisory_lock")
}

/// Tries [`IMPORT_LOCK`] with `function`, one of PostgreSQL's `pg_try_advisory_*` functions.
fn try_import_lock(conn: &mut AnyConnection, function: &str) -> QueryResult<bool> {
    #[derive(QueryableByName)]
    struct Taken {
        #[diesel(sql_type = Bool)]
        taken: bool,
    }
    let mut q = Sql::new(Backend::Postgres, &format!("SELECT {function}("));
    q.bind(IMPORT_LOCK).push(") AS taken");
    Ok(q.load::<Taken>(conn)?.pop().is_some_and(|t| t.taken))
}

fn millis(lease: std::time::Duration) -> Bind {
    Bind::Double(lease.as_secs_f64() * 1_000.0)
}

/// What became of a [`claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Taken, under this epoch.
    Taken(i64),
    /// Another instance holds it.
    Held,
    /// `import-mula` is writing to the database: nothing is taken until it ends.
    Importing,
}

/// Takes `scheduler`'s lease for `instance` if nobody holds it (never held, released, or
/// expired), or if `predecessor` does (this instance's own dead predecessor, whose lease need
/// not lapse first), unless an import holds [`IMPORT_LOCK`]. The claim holds that lock shared
/// until it commits, so an import that starts meanwhile finds it taken, and one that started
/// before keeps the lease from being taken.
pub fn claim(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    instance: &str,
    address: &str,
    lease: std::time::Duration,
    predecessor: Option<&str>,
) -> QueryResult<Claim> {
    use diesel::Connection;
    conn.transaction(|c| {
        if !try_import_lock(c, "pg_try_advisory_xact_lock_shared")? {
            return Ok(Claim::Importing);
        }
        Ok(
            match claim_row(c, scheduler, instance, address, lease, predecessor)? {
                Some(epoch) => Claim::Taken(epoch),
                None => Claim::Held,
            },
        )
    })
}

/// [`claim`]'s write: the new epoch, or `None` while another instance holds the lease.
fn claim_row(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    instance: &str,
    address: &str,
    lease: std::time::Duration,
    predecessor: Option<&str>,
) -> QueryResult<Option<i64>> {
    let mut q = Sql::new(
        Backend::Postgres,
        "INSERT INTO scheduler_owners (scheduler_id, owner, address, epoch, expires_at, acquired_at) VALUES (",
    );
    q.bind(scheduler.as_str())
        .push(", ")
        .bind(instance)
        .push(", ")
        .bind(address)
        .push(", 1, clock_timestamp() + ")
        .bind(millis(lease))
        .push(
            " * interval '1 millisecond', now()) ON CONFLICT (scheduler_id) DO UPDATE SET \
             owner = excluded.owner, address = excluded.address, \
             epoch = scheduler_owners.epoch + 1, expires_at = clock_timestamp() + ",
        )
        // Counted when the row is taken: the update may have waited for the former owner's
        // batch to let go of the row.
        .bind(millis(lease))
        .push(
            " * interval '1 millisecond', acquired_at = excluded.acquired_at \
             WHERE scheduler_owners.owner IS NULL OR scheduler_owners.expires_at < now()",
        );
    if let Some(p) = predecessor {
        q.push(" OR scheduler_owners.owner = ").bind(p);
    }
    q.push(" RETURNING epoch");
    Ok(q.load::<Epoch>(conn)?.into_iter().next().map(|e| e.epoch))
}

/// Extends `instance`'s lease on `scheduler` under `epoch`; false if it no longer holds it.
/// The lease counts from when the renewal holds the row, not from when it asked: a renewal
/// that waited for its engine's batch (which holds the row `FOR SHARE`, the fence) would
/// otherwise write an expiry already past, and lose the lease to another instance's next
/// round. So the row is locked first, and the expiry computed (`clock_timestamp()`) by a
/// second statement; a single `UPDATE` computes its new row before it waits for the lock.
pub fn renew(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    instance: &str,
    epoch: i64,
    lease: std::time::Duration,
) -> QueryResult<bool> {
    use diesel::Connection;
    conn.transaction(|c| {
        let mut lock = Sql::new(Backend::Postgres, "SELECT epoch FROM scheduler_owners");
        held_by(&mut lock, scheduler, instance, epoch);
        lock.push(" FOR NO KEY UPDATE");
        if lock.load::<Epoch>(c)?.is_empty() {
            return Ok(false);
        }
        let mut q = Sql::new(
            Backend::Postgres,
            "UPDATE scheduler_owners SET expires_at = clock_timestamp() + ",
        );
        q.bind(millis(lease)).push(" * interval '1 millisecond'");
        held_by(&mut q, scheduler, instance, epoch);
        Ok(q.execute(c)? == 1)
    })
}

/// Gives up `instance`'s lease on `scheduler` at once, so another instance takes it on its next
/// round instead of waiting for it to expire.
pub fn release(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    instance: &str,
    epoch: i64,
) -> QueryResult<bool> {
    let mut q = Sql::new(
        Backend::Postgres,
        "UPDATE scheduler_owners SET owner = NULL, expires_at = now()",
    );
    held_by(&mut q, scheduler, instance, epoch);
    Ok(q.execute(conn)? == 1)
}

/// The condition of a row `instance` holds under `epoch`.
fn held_by(q: &mut Sql, scheduler: SchedulerId, instance: &str, epoch: i64) {
    q.push(" WHERE scheduler_id = ")
        .bind(scheduler.as_str())
        .push(" AND owner = ")
        .bind(instance)
        .push(" AND epoch = ")
        .bind(epoch);
}

/// Every scheduler's owner row.
pub fn all(conn: &mut AnyConnection) -> QueryResult<Vec<OwnerRow>> {
    Sql::new(
        Backend::Postgres,
        "SELECT scheduler_id, owner, address, epoch, \
         (owner IS NOT NULL AND expires_at > now()) AS live, \
         EXTRACT(EPOCH FROM acquired_at)::float8 AS acquired_at, \
         EXTRACT(EPOCH FROM now())::float8 AS read_at FROM scheduler_owners",
    )
    .load(conn)
}

/// The fence of a batch: locks `scheduler`'s row until the transaction ends and answers whether
/// `instance` still holds it under `epoch`. Must run inside the batch's transaction. Had a
/// takeover changed the row while this waited for the lock, the condition is checked again on the
/// row as it is now (PostgreSQL's re-check of a locking read), so a new epoch is never missed.
pub fn holds(
    conn: &mut AnyConnection,
    scheduler: SchedulerId,
    instance: &str,
    epoch: i64,
) -> QueryResult<bool> {
    let mut q = Sql::new(Backend::Postgres, "");
    push_fence(&mut q, scheduler, instance, epoch);
    Ok(!q.load_prepared::<Epoch>(conn)?.is_empty())
}

/// Appends the fence's locking read ([`holds`]): a row (its `epoch`) while `instance` holds
/// `scheduler` under `epoch`, none once another instance took it. For a statement that checks the
/// fence itself, in a CTE.
pub fn push_fence(q: &mut Sql, scheduler: SchedulerId, instance: &str, epoch: i64) {
    q.push("SELECT epoch FROM scheduler_owners");
    held_by(q, scheduler, instance, epoch);
    q.push(" FOR SHARE");
}
