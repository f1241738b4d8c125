//! The durable side: connections, migrations and every SQL statement. The only module that knows
//! SQL or which database is behind the pool.
//!
//! One code path serves PostgreSQL and SQLite through diesel's `MultiConnection`; where the two
//! dialects differ (placeholders, JSON access, hour buckets) [`sql::Sql`] and the query functions
//! pick the text for the connected backend.

pub mod cron_state;
pub mod filter_sql;
pub mod frontier;
pub mod listing;
pub mod mula;
pub mod owners;
pub mod parked;
pub mod rows;
pub mod schedules;
pub mod sql;
pub mod statistics;
pub mod tasks;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ManageConnection, Pool, PooledConnection, R2D2Connection};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

/// Either database, behind one type.
#[derive(diesel::MultiConnection)]
pub enum AnyConnection {
    /// PostgreSQL (production).
    Postgresql(diesel::PgConnection),
    /// An embedded SQLite file (the default).
    Sqlite(diesel::SqliteConnection),
}

/// Inside a transaction that reads before it writes, takes SQLite's write lock first (waiting
/// out the busy timeout for another writer), as `BEGIN IMMEDIATE` would; nothing on PostgreSQL.
/// A deferred SQLite transaction that has read cannot take the lock once another connection
/// has committed since its read: its first write fails at once with "database is locked", and
/// the busy timeout does not apply. A write that matches no row takes the lock all the same.
pub fn begin_write(conn: &mut AnyConnection) -> QueryResult<()> {
    if Backend::of(conn) == Backend::Sqlite {
        diesel::sql_query("DELETE FROM task_queue WHERE 0 = 1").execute(conn)?;
    }
    Ok(())
}

/// The schema migrations, compiled into the binary.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations");

/// A pool of connections to the configured database.
pub type DbPool = Pool<Manager>;

/// A connection checked out of the pool.
pub type DbConn = PooledConnection<Manager>;

/// Which SQL dialect to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL.
    Postgres,
    /// SQLite.
    Sqlite,
}

impl Backend {
    /// The backend of a live connection.
    pub fn of(conn: &AnyConnection) -> Self {
        match conn {
            AnyConnection::Postgresql(_) => Self::Postgres,
            AnyConnection::Sqlite(_) => Self::Sqlite,
        }
    }

    /// A short name for logs and health output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgresql",
            Self::Sqlite => "sqlite",
        }
    }
}

/// Errors of the storage layer: of statements, and of opening and migrating a database.
///
/// A message that wraps a cause (the driver's, the file system's) carries it in its own text, as
/// an operator reads it in one log line; the cause is kept as a field but not reported again as
/// `source()`, which would print it twice where the service's stop reason is written as a chain.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The database cannot be reached (or the pool is exhausted); worth a retry later.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A statement failed. (libpq ends its messages with a newline, which would leave a blank
    /// line in the log.)
    #[error("database error: {}", .0.to_string().trim_end())]
    Query(#[from] diesel::result::Error),
    /// A stored row does not decode (a bug or a hand-edited database).
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    /// The batch's scheduler is owned by another instance now (its epoch moved on); nothing was
    /// committed.
    #[error("scheduler {0} is owned by another instance now")]
    Fenced(crate::domain::SchedulerId),
    /// `sqlite://` without a file after it.
    #[error("sqlite:// needs a file path, e.g. sqlite://data/scheduler.db")]
    NoSqlitePath,
    /// A database URI of neither form; the URI with its password hidden.
    #[error(
        "'{0}' is not a supported database URI; use postgresql://USER@HOST/DB or sqlite://PATH"
    )]
    UnsupportedUri(String),
    /// A connection to the database could not be opened.
    #[error("cannot open database {target}: {error}")]
    Open {
        /// The database, its password hidden.
        target: String,
        /// What the driver said.
        error: ConnectError,
    },
    /// The pool could not be built (its first connections did not come in time).
    #[error("cannot open database {target}: {error}")]
    Pool {
        /// The database, its password hidden.
        target: String,
        /// What the pool said.
        error: diesel::r2d2::PoolError,
    },
    /// The directory an SQLite file goes in could not be created.
    #[error("cannot create directory {}: {error}", dir.display())]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// Why not.
        error: std::io::Error,
    },
    /// A migration failed to apply.
    #[error("migration failed: {0}")]
    Migration(MigrationError),
    /// The database is mula's (OpenKAT's stock `.env` names it in `SCHEDULER_DB_URI`).
    #[error(
        "the database is mula's (alembic revision {0}): kat-scheduler keeps its own tables in a database of its own. Create one (e.g. `createdb kat_scheduler`), point SCHEDULER_DB_URI at it, and bring mula's schedules and tasks over with `kat-scheduler import-mula --from <mula's database URI>` (docs/OPERATIONS.md, \"Switching from mula\")"
    )]
    MulasDatabase(String),
    /// The PostgreSQL storage parameters ([`POSTGRES_TABLE_OPTIONS`]) could not be read or set.
    #[error("cannot set storage parameters: {0}")]
    TableOptions(diesel::result::Error),
    /// Which migrations are applied could not be read.
    #[error("cannot read the migration state: {0}")]
    MigrationState(MigrationError),
    /// A migration failed to revert.
    #[error("revert failed: {0}")]
    Revert(MigrationError),
    /// mula's database could not be opened (`import-mula`).
    #[error("cannot open mula's database {uri}: {error}")]
    OpenMula {
        /// mula's database, its password hidden.
        uri: String,
        /// What the driver said.
        error: diesel::ConnectionError,
    },
    /// The read-only session on mula's database could not be set up.
    #[error("cannot set up the session on mula's database: {0}")]
    MulaSession(diesel::result::Error),
}

/// What diesel's migration harness fails with.
pub type MigrationError = Box<dyn std::error::Error + Send + Sync>;

impl StorageError {
    /// Whether the error says the database went away rather than that a statement was wrong.
    pub fn is_unavailable(&self) -> bool {
        use diesel::result::{DatabaseErrorKind, Error};
        match self {
            Self::Unavailable(_) | Self::Open { .. } | Self::Pool { .. } => true,
            Self::Query(Error::DatabaseError(
                DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand,
                _,
            )) => true,
            Self::Query(Error::DatabaseError(_, info)) => {
                let m = info.message();
                m.contains("server closed the connection")
                    || m.contains("terminating connection")
                    || m.contains("no connection to the server")
                    || m.contains("connection has been closed")
                    || m.contains("database is locked")
                    // The database takes no writes now (a full disk, a file or server made
                    // read-only, a failing disk, a failover to a standby): nothing the request
                    // said is wrong, and it is answered 503 with `Retry-After`, not 500.
                    || m.contains("database or disk is full")
                    || m.contains("attempt to write a readonly database")
                    || m.contains("disk I/O error")
                    || m.contains("No space left on device")
                    || m.contains("in a read-only transaction")
            }
            _ => false,
        }
    }
}

impl StorageError {
    /// Whether the error says this connection broke (the server closed it, a network fault, a
    /// terminated backend), as opposed to the database refusing a statement or being
    /// unreachable. The statement may be retried on a fresh connection when its outcome is
    /// known (see the queue engine).
    pub fn is_connection_lost(&self) -> bool {
        use diesel::result::{DatabaseErrorKind, Error};
        match self {
            Self::Query(Error::DatabaseError(
                DatabaseErrorKind::ClosedConnection | DatabaseErrorKind::UnableToSendCommand,
                _,
            )) => true,
            Self::Query(Error::DatabaseError(_, info)) => {
                let m = info.message();
                [
                    "server closed the connection",
                    "terminating connection",
                    "no connection to the server",
                    "connection has been closed",
                    "SSL SYSCALL",
                    "could not receive data from server",
                    "could not send data to server",
                    "connection to server",
                    "EOF detected",
                ]
                .iter()
                .any(|p| m.contains(p))
            }
            _ => false,
        }
    }

    /// What a client may be told of this error: never the driver's text, which names the
    /// server's internals and says nothing a client can act on (the log has it).
    pub fn client_text(&self) -> &'static str {
        if self.is_connection_lost() {
            "the database connection failed; retry shortly"
        } else {
            "the database is unavailable; retry shortly"
        }
    }

    /// Whether the database refused a statement because of what a request put in it (a value
    /// too long for an index, too many values, an expression too deep), rather than because it
    /// is down or the service is wrong. Inputs are checked against the limits before they get
    /// here, so this is the second line: such a request is answered 400, not 500 or 503.
    pub fn is_request_fault(&self) -> bool {
        let Self::Query(diesel::result::Error::DatabaseError(_, info)) = self else {
            return false;
        };
        let m = info.message().to_ascii_lowercase();
        [
            "index row size",
            "index row requires",
            "invalid byte sequence",
            "null character not permitted",
            "unsupported unicode escape sequence",
            "value too long",
            "out of range",
            "too many sql variables",
            "expression tree is too large",
            "too many terms in compound select",
            "string or blob too big",
            "number of parameters must be between",
            "stack depth limit exceeded",
        ]
        .iter()
        .any(|needle| m.contains(needle))
    }
}

/// Where the database is, parsed from `SCHEDULER_DB_URI`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbTarget {
    /// A `postgres://` or `postgresql://` URL.
    Postgres(String),
    /// A file, from `sqlite://PATH` (`sqlite:///abs/path.db` or `sqlite://relative/path.db`).
    Sqlite(PathBuf),
}

impl DbTarget {
    /// Parses a database URI; the error says which forms are accepted.
    pub fn parse(uri: &str) -> Result<Self, StorageError> {
        if uri.starts_with("postgres://") || uri.starts_with("postgresql://") {
            Ok(Self::Postgres(uri.to_owned()))
        } else if let Some(path) = uri.strip_prefix("sqlite://") {
            if path.is_empty() {
                Err(StorageError::NoSqlitePath)
            } else if path == ":memory:" || path.starts_with("file::memory:") {
                // Each pooled connection would open a database of its own, empty: the
                // migrations would land on one and the queue read another.
                Err(StorageError::UnsupportedUri(format!(
                    "{uri} (an in-memory SQLite database is one per connection; name a file)"
                )))
            } else {
                Ok(Self::Sqlite(PathBuf::from(path)))
            }
        } else {
            Err(StorageError::UnsupportedUri(redact(uri)))
        }
    }

    /// The backend this target speaks.
    pub fn backend(&self) -> Backend {
        match self {
            Self::Postgres(_) => Backend::Postgres,
            Self::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// The target with libpq's `connect_timeout` set to `secs` (at least libpq's floor of 2)
    /// where neither the URL nor `PGCONNECT_TIMEOUT` sets one. Without it, opening a connection
    /// to a host that drops packets waits for the kernel's SYN retries (about two minutes on
    /// Linux), and one to a server that accepts and never answers waits for ever: an engine's
    /// reconnect, an ownership round or a stop's join would hang that long.
    pub fn with_connect_timeout(self, secs: u64) -> Self {
        match self {
            Self::Postgres(url) if std::env::var_os("PGCONNECT_TIMEOUT").is_none() => {
                Self::Postgres(with_default_param(
                    &url,
                    "connect_timeout",
                    &secs.max(2).to_string(),
                ))
            }
            other => other,
        }
    }

    /// The URI with any password hidden, for logs.
    pub fn display(&self) -> String {
        match self {
            Self::Postgres(url) => redact(url),
            Self::Sqlite(path) => format!("sqlite://{}", path.display()),
        }
    }
}

/// `url` with the query parameter `key=value` added, unless the URL names `key` already.
fn with_default_param(url: &str, key: &str, value: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    if query
        .split('&')
        .any(|pair| pair.split('=').next() == Some(key))
    {
        return url.to_owned();
    }
    match query {
        "" => format!("{base}?{key}={value}"),
        _ => format!("{url}&{key}={value}"),
    }
}

/// Hides the password of a URL (`user:secret@` → `user:***@`).
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The server refused or could not be reached.
    #[error(transparent)]
    Connection(#[from] diesel::ConnectionError),
    /// A session setting failed.
    #[error(transparent)]
    Setup(#[from] diesel::result::Error),
}

/// An r2d2 manager that opens the backend named by the URI directly, so a failed connect reports
/// the real cause ("connection refused", "database does not exist") instead of the generic
/// error `MultiConnection::establish` gives.
#[derive(Debug, Clone)]
pub struct Manager {
    target: DbTarget,
}

/// How long a session of this service may sit idle inside a transaction before PostgreSQL ends
/// it, unless the server, the role or the URI (`?options=-c%20idle_in_transaction_session_timeout%3D…`)
/// sets its own. The service never waits on anything but the database inside a transaction, so
/// such a session belongs to a process that stopped mid-batch: a host that crashed or was cut
/// off, whose socket the server keeps for its TCP keepalive (about two hours by default). Until
/// it ends, its batch holds its scheduler's owner row (the fence), and no other instance, nor a
/// restart of the same one, can take that scheduler over.
pub const PG_IDLE_IN_TRANSACTION: &str = "60s";

/// Settings of every PostgreSQL session: UTC, and [`PG_IDLE_IN_TRANSACTION`] where none is set.
fn pg_session() -> String {
    format!(
        "SET TIME ZONE 'UTC'; \
         SELECT set_config('idle_in_transaction_session_timeout', '{PG_IDLE_IN_TRANSACTION}', false) \
         WHERE current_setting('idle_in_transaction_session_timeout') = '0';"
    )
}

/// SQLite settings for every connection: WAL so readers never block the writer, FULL sync so an
/// acknowledged commit survives power loss, a busy timeout instead of instant "locked" errors,
/// and a bound on the write-ahead log's file: a burst of writes while a long read held the
/// checkpoint back left the file at its peak size for the life of the process.
/// The busy timeout comes first: `journal_mode` reads the database, and a connection opened
/// while another one checkpoints failed at once with "database is locked" when it came later
/// (seen in the SQLite benchmark's baseline).
pub const SQLITE_PRAGMAS: &str = "PRAGMA busy_timeout = 5000; PRAGMA journal_mode = WAL; \
     PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; PRAGMA journal_size_limit = 67108864;";

impl ManageConnection for Manager {
    type Connection = AnyConnection;
    type Error = ConnectError;

    fn connect(&self) -> Result<AnyConnection, ConnectError> {
        let _opening = Opening::start();
        match &self.target {
            DbTarget::Postgres(url) => {
                let mut conn = diesel::PgConnection::establish(url)?;
                conn.batch_execute(&pg_session())?;
                Ok(AnyConnection::Postgresql(conn))
            }
            DbTarget::Sqlite(path) => {
                let mut conn = diesel::SqliteConnection::establish(&path.to_string_lossy())?;
                conn.batch_execute(SQLITE_PRAGMAS)?;
                Ok(AnyConnection::Sqlite(conn))
            }
        }
    }

    fn is_valid(&self, conn: &mut AnyConnection) -> Result<(), ConnectError> {
        conn.batch_execute("SELECT 1").map_err(ConnectError::Setup)
    }

    fn has_broken(&self, conn: &mut AnyConnection) -> bool {
        std::thread::panicking() || conn.is_broken()
    }
}

/// Connections this process is opening now, on any pool's threads (see [`openings_settled`]).
static OPENING: std::sync::Mutex<usize> = std::sync::Mutex::new(0);
static OPENED: std::sync::Condvar = std::sync::Condvar::new();

/// One connection being opened, counted in [`OPENING`] while it lives.
struct Opening;

impl Opening {
    fn start() -> Opening {
        *OPENING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) += 1;
        Opening
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        let mut n = OPENING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *n = n.saturating_sub(1);
        OPENED.notify_all();
    }
}

/// Waits until no connection is being opened, `bound` at most; answers whether none is. The
/// pools open connections on threads of their own, for a checkout that found none idle, and a
/// checkout that gave up leaves its connection opening. A process that exits meanwhile runs the
/// C library's exit handlers while such a connection is in its TLS handshake with PostgreSQL, and
/// OpenSSL's handler frees what the handshake uses: SIGSEGV, after a clean stop. So the service
/// waits for them before it exits.
pub fn openings_settled(bound: Duration) -> bool {
    let n = OPENING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (n, _) = OPENED
        .wait_timeout_while(n, bound, |n| *n > 0)
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    *n == 0
}

/// Opens a pool to `target`, checking one connection first so a wrong URI fails start-up with the
/// database's own message.
pub fn connect(
    target: &DbTarget,
    pool_size: u32,
    timeout: Duration,
) -> Result<DbPool, StorageError> {
    if let DbTarget::Sqlite(path) = target {
        create_parent_dir(path)?;
    }
    let manager = Manager {
        target: target.clone(),
    };
    manager.connect().map_err(|error| StorageError::Open {
        target: target.display(),
        error,
    })?;
    Pool::builder()
        .max_size(pool_size)
        // No idle connection kept in reserve: with one, every checkout of the last idle
        // connection had the pool open another on a thread of its own, and a process that exited
        // (its work done, the engines stopped) while such a connection was in its TLS handshake
        // crashed with SIGSEGV in OpenSSL's exit handler (2 of 25 quick starts and stops on
        // PostgreSQL with `ssl = on`). Now a connection is opened only for a checkout that finds
        // none idle, which waits for it; connections returned stay idle for the next one.
        .min_idle(Some(0))
        .connection_timeout(timeout)
        // diesel cannot tell that a PostgreSQL connection died with its server; a `SELECT 1` at
        // checkout throws such connections away. The engines keep their own connection, so the
        // hot path does not pay for it.
        .test_on_check_out(true)
        .error_handler(Box::new(PoolErrors))
        .build(manager)
        .map_err(|error| StorageError::Pool {
            target: target.display(),
            error,
        })
}

/// What the pool reports of its connections: one that failed its checkout check (the server
/// closed it) is replaced, which is no error an operator must act on; one that cannot be made
/// is (the database is away). r2d2's own report logs the driver's text at ERROR, with the
/// driver's trailing newline; this says what happened, in one line.
#[derive(Debug)]
struct PoolErrors;

impl diesel::r2d2::HandleError<ConnectError> for PoolErrors {
    fn handle_error(&self, error: ConnectError) {
        let text = error.to_string();
        let text = text.trim();
        match error {
            ConnectError::Setup(_) => tracing::info!(
                error = text,
                "a pooled database connection failed its check and is replaced"
            ),
            ConnectError::Connection(_) => {
                tracing::warn!(error = text, "cannot open a database connection")
            }
        }
    }
}

/// Creates the directory an SQLite file goes in (`./data/` by default), so a first start on a
/// fresh machine needs no set-up.
pub fn create_parent_dir(path: &Path) -> Result<(), StorageError> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.exists() => std::fs::create_dir_all(dir)
            .map_err(|error| StorageError::CreateDir {
                dir: dir.to_owned(),
                error,
            }),
        _ => Ok(()),
    }
}

/// Opens one connection outside any pool (for a thread that must never wait for the pool).
pub fn open(target: &DbTarget) -> Result<AnyConnection, StorageError> {
    Manager {
        target: target.clone(),
    }
    .connect()
    .map_err(|error| StorageError::Open {
        target: target.display(),
        error,
    })
}

/// Checks a connection out of the pool, mapping a timeout to [`StorageError::Unavailable`].
pub fn checkout(pool: &DbPool) -> Result<DbConn, StorageError> {
    pool.get()
        .map_err(|e| StorageError::Unavailable(e.to_string()))
}

/// Runs `f` on a pooled connection on the blocking pool: the one way async code reaches the
/// database outside the queue engines (which keep connections of their own). A checkout that
/// fails, or a task that stops, is [`StorageError::Unavailable`], in the caller's error type.
pub async fn run<T, E>(
    pool: &DbPool,
    f: impl FnOnce(&mut AnyConnection) -> Result<T, E> + Send + 'static,
) -> Result<T, E>
where
    T: Send + 'static,
    E: From<StorageError> + Send + 'static,
{
    let pool = pool.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn = checkout(&pool)?;
        f(&mut conn)
    })
    .await
    .map_err(|e| {
        E::from(StorageError::Unavailable(format!(
            "a database task stopped: {e}"
        )))
    })?
}

/// A pooled connection one writer keeps across its batches (a queue engine). With `unsynced`,
/// its commits do not wait for the disk (PostgreSQL's `synchronous_commit = off`, SQLite's
/// `synchronous = NORMAL`): its writer answers only once a
/// later synced commit in the same log covers them. The setting is taken back before the
/// connection returns to the pool, where others answer after their own commit.
pub struct WriterConn {
    conn: DbConn,
    unsynced: bool,
    /// The index-only planner settings ([`INDEX_PLANS`]) are on and must be taken back.
    index_plans: bool,
    /// The server session behind it (an engine's, on PostgreSQL), to end when the connection
    /// breaks ([`WriterConn::end_session`]).
    session: Option<Session>,
}

/// A PostgreSQL server session: its process id, and when it started (a process id alone may
/// be a later session's).
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct Session {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pid: i32,
    #[diesel(sql_type = diesel::sql_types::Text)]
    started: String,
}

/// How long [`WriterConn::end_session`] waits for a broken connection's session to end.
const SESSION_END_WAIT: Duration = Duration::from_secs(5);

/// The planner settings of a queue engine's connection on PostgreSQL, and how to take them back.
///
/// Every statement an engine sends is shaped to walk one index: a key range in pop order with a
/// `LIMIT` (the refill, the pending backlog a filtered pop searches, rebuild pages), lookups by
/// primary key or hash (reads, pushes' de-duplication, every transition and `PATCH`). The
/// planner's only job is to pick that index, and it weighs it against a bitmap scan plus a sort,
/// or a hash join over a full scan, by its row estimates. On a table never analysed (PostgreSQL
/// with `autovacuum = off`, as CI's, or any server between a bulk load, an import or a
/// ColdStart and its next analyse) those estimates are defaults and the planner picked a
/// bitmap scan and a sort of all 100,000 pending rows for a refill of 1,000 (58 ms instead of
/// 2 ms) and a hash join over all of `tasks` for a `PATCH`. Disabling those alternatives on the
/// engine's own connection leaves the index walk as the cheapest plan whatever the statistics
/// say; a statement with no index to walk (the rebuild's read of every queued row, in the
/// table's order) still gets its sequential scan, which stays enabled. The API's connections
/// (listings, counts, statistics) keep the planner's full choice; [`analyse`] keeps their
/// statistics current after the engine's bulk changes.
///
/// Nor does the engine's connection compile statements (`jit = off`): the same default
/// estimates put a push batch's lookups by hash (an index scan per hash, each estimated at a
/// two-hundredth of the table) above `jit_above_cost`, and a read of 0.1 ms then took 7–49 ms
/// of compilation on every run, measured on 200,000 tasks never analysed.
const INDEX_PLANS: (&str, &str) = (
    "SET enable_bitmapscan = off; SET enable_sort = off; SET enable_hashjoin = off; \
     SET enable_mergejoin = off; SET jit = off",
    "RESET enable_bitmapscan; RESET enable_sort; RESET enable_hashjoin; RESET enable_mergejoin; \
     RESET jit",
);

impl WriterConn {
    /// Checks a connection out of `pool` for a writer.
    fn checkout(pool: &DbPool, unsynced: bool) -> Result<WriterConn, StorageError> {
        let mut conn = checkout(pool)?;
        if unsynced {
            conn.batch_execute(commit_mode(Backend::of(&conn)).0)?;
        }
        Ok(WriterConn {
            conn,
            unsynced,
            index_plans: false,
            session: None,
        })
    }

    /// Ends the server session of `broken`, a connection of this pool's that broke, and waits
    /// until it has ended, on this connection.
    ///
    /// A connection can break on the client's side alone (a proxy's or a load balancer's
    /// timeout, a network cut) while its session on the server goes on: a statement waiting for
    /// a lock runs, and commits, once the lock is let go, and a transaction keeps its row locks
    /// until the server notices the client is gone (TCP keepalives: up to hours). Whether the
    /// broken statement was written, which an engine then reads from the table, is only settled
    /// once that session has ended; until then a write sent again would either wait behind it
    /// or meet its commit after having found it unwritten (a task dispatched that nobody holds).
    pub fn end_session(&mut self, broken: &Session) -> Result<(), StorageError> {
        #[derive(QueryableByName)]
        struct Alive {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            alive: i64,
        }
        let alive = |c: &mut AnyConnection, end: bool| -> Result<i64, StorageError> {
            let text = match end {
                true => {
                    "SELECT COUNT(pg_terminate_backend(pid)) AS alive FROM pg_stat_activity \
                     WHERE pid = $1 AND backend_start::text = $2"
                }
                false => {
                    "SELECT COUNT(*) AS alive FROM pg_stat_activity \
                     WHERE pid = $1 AND backend_start::text = $2"
                }
            };
            Ok(diesel::sql_query(text)
                .bind::<diesel::sql_types::Integer, _>(broken.pid)
                .bind::<diesel::sql_types::Text, _>(&broken.started)
                .get_result::<Alive>(c)?
                .alive)
        };
        if alive(&mut self.conn, true)? == 0 {
            return Ok(());
        }
        let until = Instant::now() + SESSION_END_WAIT;
        while alive(&mut self.conn, false)? > 0 {
            if Instant::now() > until {
                return Err(StorageError::Unavailable(format!(
                    "the session of a broken connection (process {}) has not ended after {} s",
                    broken.pid,
                    SESSION_END_WAIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        tracing::warn!(
            pid = broken.pid,
            "ended the server session of a broken connection, which was still running"
        );
        Ok(())
    }

    /// The server session behind this connection, when it was read at its check-out.
    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    /// Checks a connection out for a queue engine: a writer's, planned to walk the indexes its
    /// statements are shaped for (on PostgreSQL; see `INDEX_PLANS`).
    pub fn checkout_engine(pool: &DbPool, unsynced: bool) -> Result<WriterConn, StorageError> {
        let mut w = Self::checkout(pool, unsynced)?;
        if Backend::of(&w.conn) == Backend::Postgres {
            w.conn.batch_execute(INDEX_PLANS.0)?;
            w.index_plans = true;
            w.session = diesel::sql_query(
                "SELECT pid, backend_start::text AS started FROM pg_stat_activity \
                 WHERE pid = pg_backend_pid()",
            )
            .load::<Session>(&mut *w.conn)?
            .pop();
        }
        Ok(w)
    }
}

/// Refreshes the planner's statistics of the queue table after a bulk change (PostgreSQL's
/// `ANALYZE`). Only `task_queue`: its status and rank are what bulk changes move, while `tasks`
/// is indexed by columns that never change after the insert. The engines' own statements do
/// not depend on it (`INDEX_PLANS`); the API's counts and listings of waiting work, planned
/// with the full choice, do. SQLite plans by its indexes' shapes without statistics.
///
/// It samples [`ANALYSE_SAMPLE_TARGET`] × 300 rows (3,000) instead of the server's default of
/// 30,000: what those plans read of `task_queue` is a handful of frequent values (two statuses,
/// three schedulers, organisations and images by frequency), which a sample of 3,000 gives as
/// well, at a tenth of the cost (35–43 ms against 400 ms on a table of 128,000 rows that had seen
/// a million changes without a vacuum). An engine over a backlog analyses every 20,000 rows it
/// moves, every second or two at full speed. The setting holds for this transaction only;
/// autovacuum's own analyses, where it runs, keep the server's target.
///
/// Where the server runs no autovacuum (`autovacuum = off`, as on CI's), nothing else would ever
/// reclaim the queue rows that pops and refills delete, and every search of the backlog and every
/// refill would walk more of them in the indexes it reads, without end (395–484 pages for one
/// organisation's best 65 pending rows after a benchmark run, 61 once vacuumed). There it runs
/// `VACUUM (ANALYZE)` instead, at the same moments and with the same sample. Answers what it ran.
pub fn analyse(conn: &mut AnyConnection) -> Result<Upkept, StorageError> {
    if Backend::of(conn) != Backend::Postgres {
        return Ok(Upkept::Nothing);
    }
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        value: String,
    }
    let autovacuum = diesel::sql_query("SELECT current_setting('autovacuum') AS value")
        .load::<Setting>(conn)?
        .pop()
        .is_none_or(|s| s.value == "on");
    if autovacuum {
        conn.transaction::<_, diesel::result::Error, _>(|c| {
            c.batch_execute(&format!(
                "SET LOCAL default_statistics_target = {ANALYSE_SAMPLE_TARGET}"
            ))?;
            c.batch_execute("ANALYZE task_queue")
        })?;
        return Ok(Upkept::Analysed);
    }
    // VACUUM runs outside a transaction, each statement on its own; the sample's size is set
    // for the session and taken back before the connection returns to the pool, whatever the
    // VACUUM's outcome.
    conn.batch_execute(&format!(
        "SET default_statistics_target = {ANALYSE_SAMPLE_TARGET}"
    ))?;
    let vacuumed = conn.batch_execute("VACUUM (ANALYZE) task_queue");
    conn.batch_execute("RESET default_statistics_target")?;
    vacuumed?;
    Ok(Upkept::Vacuumed)
}

/// What [`analyse`] ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upkept {
    /// Nothing (SQLite).
    Nothing,
    /// `ANALYZE task_queue`.
    Analysed,
    /// `VACUUM (ANALYZE) task_queue` (the server runs no autovacuum).
    Vacuumed,
}

/// Ids per statement, in the statements that look tasks or schedules up by a list of ids or
/// hashes.
pub const CHUNK: usize = 1000;

/// The statistics target of the engines' `ANALYZE task_queue` ([`analyse`]).
pub const ANALYSE_SAMPLE_TARGET: u32 = 10;

/// The statements that make a connection commit without waiting for the disk, and back.
fn commit_mode(backend: Backend) -> (&'static str, &'static str) {
    match backend {
        Backend::Postgres => ("SET synchronous_commit = off", "RESET synchronous_commit"),
        // FULL is what every pooled connection starts with (`SQLITE_PRAGMAS`).
        Backend::Sqlite => ("PRAGMA synchronous = NORMAL", "PRAGMA synchronous = FULL"),
    }
}

impl std::ops::Deref for WriterConn {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for WriterConn {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        &mut self.conn
    }
}

impl Drop for WriterConn {
    fn drop(&mut self) {
        if self.index_plans
            && let Err(e) = self.conn.batch_execute(INDEX_PLANS.1)
        {
            tracing::debug!(error = %e, "could not give a returned connection the planner's full choice again");
        }
        if self.unsynced {
            let (_, back) = commit_mode(Backend::of(&self.conn));
            if let Err(e) = self.conn.batch_execute(back) {
                // A connection that cannot take this is broken; the pool's check-out test drops
                // it.
                tracing::debug!(error = %e, "could not make a returned connection wait for the disk again");
            }
        }
    }
}

/// Whether the database answers: a connection can be checked out (and validated) and used.
pub fn reachable(pool: &DbPool) -> bool {
    checkout(pool).is_ok_and(|mut c| ping(&mut c).is_ok())
}

/// Whether the database reached through `pool` answers (`Err`: it does not) and, if it takes
/// no writes now, why: on PostgreSQL a standby (in recovery: a failover that left the service
/// on the old primary's replica, or a replica named by mistake) or sessions read-only by default
/// (`default_transaction_read_only`, as for maintenance). Every push, pop and patch would be
/// answered 503 while reads answer, so `/health` says so. One round trip, which is also the
/// check that the database answers; no write. On SQLite the answer is only whether it answers:
/// a file that takes no writes (full disk, read-only) cannot be told without writing, and shows
/// in the writes' 503s.
pub fn write_state(pool: &DbPool) -> Result<Option<String>, StorageError> {
    #[derive(QueryableByName)]
    struct State {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        standby: bool,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        read_only: bool,
    }
    let mut conn = checkout(pool)?;
    if Backend::of(&conn) != Backend::Postgres {
        ping(&mut conn)?;
        return Ok(None);
    }
    let state = diesel::sql_query(
        "SELECT pg_is_in_recovery() AS standby, \
         current_setting('transaction_read_only') = 'on' AS read_only",
    )
    .get_result::<State>(&mut *conn)?;
    Ok(if state.standby {
        Some("the server is a standby (in recovery): it takes no writes".into())
    } else if state.read_only {
        Some("sessions are read-only (default_transaction_read_only): it takes no writes".into())
    } else {
        None
    })
}

/// One round trip on `conn`: whether it still works.
pub fn ping(conn: &mut AnyConnection) -> Result<(), StorageError> {
    conn.batch_execute("SELECT 1")?;
    Ok(())
}

/// Applies every pending migration; returns the names of those applied. On PostgreSQL under an
/// advisory lock ([`MIGRATION_LOCK`]): instances started together on an empty or outdated
/// database (`docker compose up --scale scheduler=3`, a rolling upgrade) apply them one after
/// another, the later ones finding nothing pending, instead of racing to create the same tables.
pub fn run_migrations(conn: &mut AnyConnection) -> Result<Vec<String>, StorageError> {
    refuse_mulas_database(conn)?;
    if Backend::of(conn) != Backend::Postgres {
        return conn
            .run_pending_migrations(MIGRATIONS)
            .map(|versions| versions.iter().map(ToString::to_string).collect())
            .map_err(StorageError::Migration);
    }
    conn.batch_execute(&format!("SELECT pg_advisory_lock({MIGRATION_LOCK})"))?;
    let applied = conn
        .run_pending_migrations(MIGRATIONS)
        .map(|versions| versions.iter().map(ToString::to_string).collect::<Vec<_>>())
        .map_err(StorageError::Migration)
        .and_then(|applied| {
            tune_postgres(conn).map_err(StorageError::TableOptions)?;
            Ok(applied)
        });
    // Released with the session too, should this fail.
    let unlocked = conn.batch_execute(&format!("SELECT pg_advisory_unlock({MIGRATION_LOCK})"));
    let applied = applied?;
    unlocked?;
    Ok(applied)
}

/// The advisory lock migrations run under on PostgreSQL (the bytes of `katmigra`).
pub const MIGRATION_LOCK: i64 = 0x6b61_746d_6967_7261;

/// Refuses a database that holds mula's schema (its `alembic_version` table): OpenKAT's stock
/// `.env` sets `SCHEDULER_DB_URI` to mula's database, and migrating it failed on mula's `tasks`
/// and `schedules` with a bare "relation already exists", the container restarting for ever.
pub fn refuse_mulas_database(conn: &mut AnyConnection) -> Result<(), StorageError> {
    if Backend::of(conn) != Backend::Postgres {
        return Ok(());
    }
    #[derive(diesel::QueryableByName)]
    struct Alembic {
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        version: Option<String>,
    }
    let exists: Vec<Alembic> = sql::Sql::new(
        Backend::Postgres,
        "SELECT CAST(to_regclass('alembic_version') AS text) AS version",
    )
    .load(conn)?;
    if exists.first().is_none_or(|a| a.version.is_none()) {
        return Ok(());
    }
    let revision: Vec<Alembic> = sql::Sql::new(
        Backend::Postgres,
        "SELECT version_num AS version FROM alembic_version LIMIT 1",
    )
    .load(conn)?;
    Err(StorageError::MulasDatabase(
        revision
            .into_iter()
            .next()
            .and_then(|r| r.version)
            .unwrap_or_else(|| "unknown".into()),
    ))
}

/// PostgreSQL storage parameters, which the portable migrations cannot say (SQLite has no such
/// statement). `tasks` leaves 30 % of each page free, so the new version of a row whose status,
/// priority or lease changes fits beside the old one (a HOT update: no index entries, one WAL
/// record); `task_queue`, whose every row is inserted and deleted again, is vacuumed after 2 % of
/// it is dead rather than 20 %, so refills do not walk dead entries at the head of its index.
/// Set only when missing (an `ALTER TABLE` takes a lock); rows written before keep their pages
/// until they are rewritten.
pub const POSTGRES_TABLE_OPTIONS: [(&str, &str); 2] = [
    ("tasks", "fillfactor=70"),
    ("task_queue", "autovacuum_vacuum_scale_factor=0.02"),
];

fn tune_postgres(conn: &mut AnyConnection) -> diesel::QueryResult<()> {
    #[derive(diesel::QueryableByName)]
    struct Options {
        #[diesel(sql_type = diesel::sql_types::Text)]
        options: String,
    }
    for (table, option) in POSTGRES_TABLE_OPTIONS {
        let mut q = sql::Sql::new(
            Backend::Postgres,
            "SELECT COALESCE(array_to_string(reloptions, ','), '') AS options FROM pg_class \
             WHERE oid = to_regclass(",
        );
        q.bind(table).push(")");
        let set = q
            .load::<Options>(conn)?
            .first()
            .is_some_and(|o| o.options.split(',').any(|x| x == option));
        if !set {
            diesel::RunQueryDsl::execute(
                diesel::sql_query(format!("ALTER TABLE {table} SET ({option})")),
                conn,
            )?;
        }
    }
    Ok(())
}

/// Whether the database holds kat-scheduler's tables (`schedules`, `tasks`, `task_queue`), found
/// with reads only: a dry run must not create diesel's migration table to find out.
pub fn has_schema(conn: &mut AnyConnection) -> bool {
    ["schedules", "tasks", "task_queue"].iter().all(|t| {
        conn.batch_execute(&format!("SELECT 1 FROM {t} WHERE 1 = 0"))
            .is_ok()
    })
}

/// The migrations not yet applied.
pub fn pending_migrations(conn: &mut AnyConnection) -> Result<Vec<String>, StorageError> {
    refuse_mulas_database(conn)?;
    conn.pending_migrations(MIGRATIONS)
        .map(|list| list.iter().map(|m| m.name().to_string()).collect())
        .map_err(StorageError::MigrationState)
}

/// Reverts the last `n` applied migrations (tests of an upgrade from an older schema).
pub fn revert_last_migrations(conn: &mut AnyConnection, n: usize) -> Result<(), StorageError> {
    for _ in 0..n {
        conn.revert_last_migration(MIGRATIONS)
            .map_err(StorageError::Revert)?;
    }
    Ok(())
}

/// Reverts every applied migration (used by the migration round-trip test and for dev resets).
pub fn revert_all_migrations(conn: &mut AnyConnection) -> Result<usize, StorageError> {
    conn.revert_all_migrations(MIGRATIONS)
        .map(|v| v.len())
        .map_err(StorageError::Revert)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection being opened holds the process's exit back until it is done: here a
    /// "server" that accepts and then says nothing keeps libpq waiting for its answer, until the
    /// test closes the socket.
    /// A server that accepts and then never answers does not hold an open for ever: the
    /// target's connect timeout ends it.
    #[test]
    fn an_open_to_a_server_that_never_answers_gives_up() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = DbTarget::parse(&format!("postgres://kat@127.0.0.1:{port}/kat"))
            .unwrap()
            .with_connect_timeout(2);
        let (done, outcome) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(open(&target).is_err());
        });
        let (_socket, _) = listener.accept().unwrap();
        // The socket stays open and silent; without a timeout the open never returns.
        assert_eq!(
            outcome.recv_timeout(Duration::from_secs(60)),
            Ok(true),
            "the open gives up by itself"
        );
    }

    #[test]
    fn a_connect_timeout_is_added_only_where_none_is_set() {
        let with = |uri: &str| match DbTarget::parse(uri).unwrap().with_connect_timeout(5) {
            DbTarget::Postgres(url) => url,
            DbTarget::Sqlite(_) => unreachable!(),
        };
        assert_eq!(with("postgres://h/db"), "postgres://h/db?connect_timeout=5");
        assert_eq!(
            with("postgres://h/db?sslmode=require"),
            "postgres://h/db?sslmode=require&connect_timeout=5"
        );
        assert_eq!(
            with("postgres://h/db?connect_timeout=30&sslmode=require"),
            "postgres://h/db?connect_timeout=30&sslmode=require"
        );
        assert_eq!(
            with("postgres://h/db?options=-c%20x%3D1"),
            "postgres://h/db?options=-c%20x%3D1&connect_timeout=5"
        );
        match DbTarget::parse("postgres://h/db")
            .unwrap()
            .with_connect_timeout(0)
        {
            DbTarget::Postgres(url) => assert_eq!(url, "postgres://h/db?connect_timeout=2"),
            DbTarget::Sqlite(_) => unreachable!(),
        }
    }

    #[test]
    fn an_exit_waits_for_a_connection_being_opened() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let manager = Manager {
            target: DbTarget::parse(&format!("postgres://kat@127.0.0.1:{port}/kat")).unwrap(),
        };
        let opening = std::thread::spawn(move || manager.connect().is_err());
        let (socket, _) = listener.accept().unwrap();
        assert!(
            !openings_settled(Duration::from_millis(200)),
            "the connection is still being opened"
        );
        drop(socket);
        assert!(
            opening.join().unwrap(),
            "the open fails once the server is gone"
        );
        assert!(openings_settled(Duration::from_secs(10)));
    }

    #[test]
    fn database_uris_in_mula_and_sqlite_forms_parse() {
        assert_eq!(
            DbTarget::parse("sqlite:///var/lib/x.db").unwrap(),
            DbTarget::Sqlite(PathBuf::from("/var/lib/x.db"))
        );
        assert_eq!(
            DbTarget::parse("sqlite://data/scheduler.db").unwrap(),
            DbTarget::Sqlite(PathBuf::from("data/scheduler.db"))
        );
        assert_eq!(
            DbTarget::parse("postgresql://u:p@db:5432/s")
                .unwrap()
                .backend(),
            Backend::Postgres
        );
        assert!(
            DbTarget::parse("mysql://x")
                .unwrap_err()
                .to_string()
                .contains("not a supported database URI")
        );
        let memory = DbTarget::parse("sqlite://:memory:")
            .unwrap_err()
            .to_string();
        assert!(
            memory.contains("in-memory SQLite database is one per connection"),
            "{memory}"
        );
    }

    #[test]
    fn passwords_never_reach_the_logs() {
        assert_eq!(
            redact("postgresql://kat:s3cret@db/sched"),
            "postgresql://kat:***@db/sched"
        );
        assert_eq!(
            redact("postgresql://kat@db/sched"),
            "postgresql://kat@db/sched"
        );
    }

    #[test]
    fn a_transaction_that_reads_first_holds_sqlite_s_write_lock_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let target = DbTarget::Sqlite(dir.path().join("s.db"));
        let mut a = open(&target).unwrap();
        run_migrations(&mut a).unwrap();
        let mut b = open(&target).unwrap();
        // b does not wait: whether a holds the lock shows at once.
        b.batch_execute("PRAGMA busy_timeout = 0").unwrap();
        let other_write = "INSERT OR REPLACE INTO cron_state (component, entry, next_run_at) \
                           VALUES ('boefje', 'test', '2026-01-01 00:00:00')";
        let read_then_write = |c: &mut AnyConnection, first: bool, b: &mut AnyConnection| {
            c.transaction::<_, diesel::result::Error, _>(|c| {
                if first {
                    begin_write(c)?;
                }
                diesel::sql_query("SELECT count(*) FROM tasks").execute(c)?;
                let b_wrote = b.batch_execute(other_write).is_ok();
                diesel::sql_query("DELETE FROM task_queue WHERE 1 = 0").execute(c)?;
                Ok(b_wrote)
            })
        };
        // Deferred: the other connection commits between the read and the write, which then
        // fails at once.
        let deferred = read_then_write(&mut a, false, &mut b);
        assert!(
            deferred
                .as_ref()
                .is_err_and(|e| e.to_string().contains("locked")),
            "{deferred:?}"
        );
        // With the lock taken first, the other writer waits (here: is refused) and this one
        // commits.
        assert_eq!(read_then_write(&mut a, true, &mut b), Ok(false));
    }

    fn database_error(kind: diesel::result::DatabaseErrorKind, message: &str) -> StorageError {
        StorageError::Query(diesel::result::Error::DatabaseError(
            kind,
            Box::new(message.to_owned()),
        ))
    }

    #[test]
    fn what_a_request_put_in_a_statement_is_told_apart_from_a_lost_database() {
        use diesel::result::DatabaseErrorKind::{ClosedConnection, Unknown};
        let too_long = database_error(
            Unknown,
            "index row size 3016 exceeds btree version 4 maximum 2704 for index \"ix\"",
        );
        assert!(too_long.is_request_fault() && !too_long.is_unavailable());
        let variables = database_error(Unknown, "too many SQL variables");
        assert!(variables.is_request_fault());
        let gone = database_error(
            ClosedConnection,
            "server closed the connection unexpectedly",
        );
        assert!(gone.is_unavailable() && !gone.is_request_fault());
        let bug = database_error(Unknown, "syntax error at or near \"FROM\"");
        assert!(!bug.is_request_fault() && !bug.is_unavailable());
        // A database that takes no writes now is unavailable (503), not a fault (500).
        for m in [
            "database or disk is full",
            "attempt to write a readonly database",
            "disk I/O error",
            "could not extend file \"base/16384/16385\": No space left on device",
            "cannot execute UPDATE in a read-only transaction",
        ] {
            let e = database_error(Unknown, m);
            assert!(e.is_unavailable() && !e.is_request_fault(), "{m}");
            assert!(
                matches!(
                    crate::queue::QueueError::from(e),
                    crate::queue::QueueError::Unavailable(_)
                ),
                "{m}"
            );
        }
    }
}
